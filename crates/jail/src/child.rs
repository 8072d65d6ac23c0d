//! Safe wrappers for setting up child processes inside a sandbox (used by the agent).
//!
//! The agent forbids `unsafe`; the few things it needs that only `pre_exec` can do live here,
//! each as a small function whose closure makes async-signal-safe syscalls only.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the child the leader of a new session whose controlling terminal is its stdin.
///
/// The caller must give the child a pty slave as stdin (`Stdio::from(slave)`), and must not
/// also call `process_group`: `setsid` fails for a process-group leader. The new session id
/// equals the child's pid, so signalling the process group `pid` reaches the whole job.
pub fn set_controlling_tty(cmd: &mut Command) {
    let set_up = || -> std::io::Result<()> {
        rustix::process::setsid()?;
        // std has already dup2'd the slave onto fd 0 when pre_exec closures run.
        rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
        Ok(())
    };
    // SAFETY: the closure runs between fork and exec, where only async-signal-safe operations
    // are allowed. It makes two raw syscalls through rustix (setsid, ioctl(TIOCSCTTY)), which do
    // not allocate, lock, or touch any state shared with the parent; the io::Error it may
    // return is built from a raw errno without allocating.
    unsafe {
        cmd.pre_exec(set_up);
    }
}
