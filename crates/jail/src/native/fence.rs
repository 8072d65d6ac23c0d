//! Landlock as a second fence behind the mount namespace.
//!
//! Inside the sandbox everything under its own root stays usable, except creating device
//! nodes; and processes may not connect to abstract unix sockets or signal processes created
//! outside the sandbox's Landlock domain. If the mount setup ever leaked a host path into the
//! sandbox, this would not be what stops reads of it — the mount namespace is; Landlock here
//! guards device creation and cross-domain IPC even for root inside.

use landlock::{Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI};

/// Whether Landlock was enforced, for `corral inspect` and the security report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceStatus {
    Enforced,
    PartiallyEnforced,
    Unavailable,
}

/// Restricts the calling thread and its future children. Best effort: kernels without
/// Landlock still get the rest of the jail.
///
/// `upper` (the overlay's writable layer, outside the new root) becomes readable, and only
/// readable, for whoever holds its descriptor: the agent, when it snapshots the layer.
pub fn apply(upper: Option<&std::os::fd::OwnedFd>) -> Result<FenceStatus, String> {
    let abi = ABI::V6;
    let all = AccessFs::from_all(abi);
    let allowed = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let root = landlock::PathFd::new("/").map_err(|e| format!("landlock: open /: {e}"))?;
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rule(landlock::PathBeneath::new(root, allowed)))
        .map_err(|e| format!("landlock: {e}"))?;
    if let Some(upper) = upper {
        let read = AccessFs::ReadFile | AccessFs::ReadDir;
        ruleset = ruleset.add_rule(landlock::PathBeneath::new(upper, read)).map_err(|e| format!("landlock: {e}"))?;
    }
    let status = ruleset.restrict_self().map_err(|e| format!("landlock: {e}"))?;
    Ok(match status.ruleset {
        landlock::RulesetStatus::FullyEnforced => FenceStatus::Enforced,
        landlock::RulesetStatus::PartiallyEnforced => FenceStatus::PartiallyEnforced,
        landlock::RulesetStatus::NotEnforced => FenceStatus::Unavailable,
    })
}
