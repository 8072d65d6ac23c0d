//! The seccomp filter every sandbox process runs under.
//!
//! Default allow, with a deny list of kernel surface a sandbox has no use for and that has a
//! history of privilege-escalation bugs. Root inside the sandbox holds capabilities in its own
//! user namespace; this filter is what keeps it from using them to reconfigure its jail.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule};

use crate::JailError;

/// Syscalls that fail with EPERM, grouped by why they are denied.
pub const DENIED: &[(&str, &[i64])] = &[
    // Changing the filesystem view: would let root inside undo the jail's mounts.
    (
        "mounts",
        &[
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_chroot,
            libc::SYS_fsopen,
            libc::SYS_fsconfig,
            libc::SYS_fsmount,
            libc::SYS_fspick,
            libc::SYS_move_mount,
            libc::SYS_open_tree,
            libc::SYS_mount_setattr,
        ],
    ),
    // New or other namespaces: a fresh user namespace re-grants every capability.
    ("namespaces", &[libc::SYS_unshare, libc::SYS_setns]),
    // Reading or writing other processes' memory.
    (
        "process inspection",
        &[libc::SYS_ptrace, libc::SYS_process_vm_readv, libc::SYS_process_vm_writev, libc::SYS_pidfd_getfd, libc::SYS_kcmp],
    ),
    // Large in-kernel attack surface with a long CVE record.
    ("bpf and perf", &[libc::SYS_bpf, libc::SYS_perf_event_open]),
    ("io_uring", &[libc::SYS_io_uring_setup, libc::SYS_io_uring_enter, libc::SYS_io_uring_register]),
    ("userfaultfd", &[libc::SYS_userfaultfd]),
    // The kernel keyring is not namespaced.
    ("keyrings", &[libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key]),
    // Host kernel and machine control.
    (
        "kernel control",
        &[
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_reboot,
            libc::SYS_swapon,
            libc::SYS_swapoff,
            libc::SYS_syslog,
            libc::SYS_acct,
            libc::SYS_quotactl,
            libc::SYS_iopl,
            libc::SYS_ioperm,
            libc::SYS_settimeofday,
            libc::SYS_clock_settime,
            libc::SYS_clock_adjtime,
            libc::SYS_adjtimex,
            libc::SYS_lookup_dcookie,
            libc::SYS_uselib,
            libc::SYS__sysctl,
        ],
    ),
    // File handles bypass path-based checks (the "shocker" container escape).
    ("file handles", &[libc::SYS_open_by_handle_at, libc::SYS_name_to_handle_at]),
    ("fanotify", &[libc::SYS_fanotify_init]),
    ("numa page moves", &[libc::SYS_move_pages, libc::SYS_migrate_pages, libc::SYS_mbind]),
];

const NAMESPACE_FLAGS: [u64; 8] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWTIME as u64,
];

fn arch() -> Result<seccompiler::TargetArch, JailError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|_| JailError::Unsupported(format!("seccomp on {}", std::env::consts::ARCH)))
}

fn err(e: seccompiler::BackendError) -> JailError {
    JailError::Config(format!("seccomp filter: {e}"))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, JailError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(err)
}

/// The EPERM filter: the deny list, namespace-creating clone flags, terminal injection, and
/// packet sockets.
fn deny_filter() -> Result<BpfProgram, JailError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, syscalls) in DENIED {
        for nr in *syscalls {
            rules.insert(*nr, Vec::new());
        }
    }
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|flag| SeccompRule::new(vec![condition(0, SeccompCmpOp::MaskedEq(*flag), *flag)?]).map_err(err))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    // TIOCSTI/TIOCLINUX push keystrokes into a terminal another process reads.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            SeccompRule::new(vec![condition(1, SeccompCmpOp::MaskedEq(0xffff_ffff), libc::TIOCSTI)?]).map_err(err)?,
            SeccompRule::new(vec![condition(1, SeccompCmpOp::MaskedEq(0xffff_ffff), libc::TIOCLINUX)?]).map_err(err)?,
        ],
    );
    rules.insert(
        libc::SYS_socket,
        vec![SeccompRule::new(vec![condition(0, SeccompCmpOp::Eq, libc::AF_PACKET as u64)?]).map_err(err)?],
    );
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch()?)
        .map_err(err)?;
    filter.try_into().map_err(err)
}

/// clone3 passes its flags in memory seccomp cannot read; ENOSYS makes libc fall back to clone,
/// whose flags the deny filter checks.
fn clone3_filter() -> Result<BpfProgram, JailError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_clone3, Vec::new());
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch()?)
        .map_err(err)?;
    filter.try_into().map_err(err)
}

/// Compiled filters, built before the sandbox starts so a failure is reported, not half-applied.
pub struct Filters {
    deny: BpfProgram,
    clone3: BpfProgram,
}

impl Filters {
    pub fn build() -> Result<Self, JailError> {
        Ok(Filters { deny: deny_filter()?, clone3: clone3_filter()? })
    }

    /// Installs the filters on the calling thread; inherited by every later child.
    /// Requires no_new_privs (or CAP_SYS_ADMIN), which the jail sets first.
    pub fn apply(&self) -> Result<(), JailError> {
        seccompiler::apply_filter(&self.clone3).map_err(|e| JailError::Config(format!("seccomp: {e}")))?;
        seccompiler::apply_filter(&self.deny).map_err(|e| JailError::Config(format!("seccomp: {e}")))
    }
}
