//! Who a request acts as, and where its relative paths point.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::AgentError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: PathBuf,
}

impl UserEntry {
    pub fn new(name: &str, uid: u32, gid: u32, home: impl Into<PathBuf>) -> Self {
        UserEntry { name: name.to_owned(), uid, gid, home: home.into(), shell: PathBuf::from("/bin/sh") }
    }

    /// The users every sandbox has: `root` and the unprivileged `user` (uid 1000).
    pub fn defaults() -> Vec<UserEntry> {
        vec![
            UserEntry::new("root", 0, 0, "/root"),
            UserEntry::new(corral_jail::SANDBOX_USER, corral_jail::SANDBOX_UID, corral_jail::SANDBOX_UID, corral_jail::SANDBOX_HOME),
        ]
    }

    /// Resolves `~`, `~/x` and relative paths against this user's home.
    pub fn resolve_path(&self, path: &str) -> PathBuf {
        if path == "~" {
            return self.home.clone();
        }
        if let Some(rest) = path.strip_prefix("~/") {
            return self.home.join(rest);
        }
        let path = Path::new(path);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.home.join(path)
        }
    }
}

/// Looks up `requested` (a name or a numeric uid), falling back to `default` when absent.
///
/// A numeric uid that is not in the table is still allowed (the sandbox is the client's to
/// use as any uid); it gets gid = uid and `/` as its home.
pub fn resolve_user(users: &[UserEntry], default: &str, requested: Option<&str>) -> Result<UserEntry, AgentError> {
    let wanted = match requested {
        Some(name) if !name.is_empty() => name,
        _ => default,
    };
    if let Some(user) = users.iter().find(|u| u.name == wanted) {
        return Ok(user.clone());
    }
    match wanted.parse::<u32>() {
        Ok(uid) => Ok(users
            .iter()
            .find(|u| u.uid == uid)
            .cloned()
            .unwrap_or_else(|| UserEntry::new(wanted, uid, uid, "/"))),
        Err(_) => Err(AgentError::not_found(format!("unknown user: {wanted}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_names_uids_and_paths() {
        let users = UserEntry::defaults();
        let user = resolve_user(&users, "user", None).unwrap();
        assert_eq!(user.uid, 1000);
        assert_eq!(resolve_user(&users, "user", Some("root")).unwrap().home, PathBuf::from("/root"));
        assert_eq!(resolve_user(&users, "user", Some("0")).unwrap().name, "root");
        assert_eq!(resolve_user(&users, "user", Some("1234")).unwrap().gid, 1234);
        assert!(resolve_user(&users, "user", Some("nobody-here")).is_err());

        assert_eq!(user.resolve_path("~"), PathBuf::from("/home/user"));
        assert_eq!(user.resolve_path("~/a/b"), PathBuf::from("/home/user/a/b"));
        assert_eq!(user.resolve_path("a"), PathBuf::from("/home/user/a"));
        assert_eq!(user.resolve_path("/etc"), PathBuf::from("/etc"));
    }
}
