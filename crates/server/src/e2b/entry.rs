//! The agent's `FileEntry` as envd's `EntryInfo` (proto3 JSON).

use corral_proto::{FileEntry, FileKind};
use serde_json::{json, Value};

/// Names for the ids every sandbox has; others are shown as numbers, as `ls` would.
fn account(id: u32) -> String {
    match id {
        0 => "root".into(),
        corral_jail::SANDBOX_UID => corral_jail::SANDBOX_USER.into(),
        n => n.to_string(),
    }
}

pub fn file_type(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    }
}

/// Go's `fs.FileMode.String()`, e.g. `drwxr-xr-x`, which envd reports as `permissions`.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut out = String::with_capacity(10);
    out.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    out
}

pub fn entry_info(entry: &FileEntry) -> Value {
    let mut info = json!({
        "name": entry.name,
        "type": file_type(entry.kind),
        "path": entry.path,
        "size": entry.size.to_string(),
        "mode": entry.mode & 0o777,
        "permissions": permissions(entry.kind, entry.mode),
        "owner": account(entry.uid),
        "group": account(entry.gid),
        "modifiedTime": crate::time::rfc3339(entry.modified.saturating_mul(1000)),
    });
    if entry.kind == FileKind::Symlink {
        info["isSymlink"] = json!(true);
        info["symlinkTarget"] = json!(entry.symlink_target.clone().unwrap_or_default());
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_like_go() {
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileKind::File, 0o640), "-rw-r-----");
    }
}
