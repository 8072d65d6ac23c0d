//! The few raw syscalls rustix does not wrap. Every `unsafe` of the native backend is here.

use std::io;
use std::os::fd::AsRawFd;

/// Outcome of [`clone_fork`].
pub enum Forked {
    Parent { child: u32 },
    Child,
}

/// `clone(2)` with fork semantics (no new stack, the child continues here) and namespace flags.
///
/// Only call this while the process is single-threaded: the child gets a copy of the address
/// space with only the calling thread, so locks held by other threads would stay locked.
pub fn clone_fork(flags: u64) -> io::Result<Forked> {
    // SAFETY: raw clone with a null stack pointer behaves like fork(2): the child resumes on a
    // copy-on-write copy of this stack. Callers guarantee the process is single-threaded (the
    // zygote and `corral run` call this before any thread exists), so no lock can be held by a
    // thread that does not exist in the child. The remaining arguments are null/unused because we
    // pass neither CLONE_PARENT_SETTID, CLONE_CHILD_SETTID nor CLONE_SETTLS.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong | libc::SIGCHLD as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent { child: pid as u32 }),
    }
}

/// Plain fork, for the zygote. Same single-thread requirement as [`clone_fork`].
pub fn fork() -> io::Result<Forked> {
    clone_fork(0)
}

/// `unshare(2)` for namespace flags only.
pub fn unshare_namespaces(flags: rustix::thread::UnshareFlags) -> io::Result<()> {
    let namespace_only = rustix::thread::UnshareFlags::NEWNS
        | rustix::thread::UnshareFlags::NEWCGROUP
        | rustix::thread::UnshareFlags::NEWUTS
        | rustix::thread::UnshareFlags::NEWIPC
        | rustix::thread::UnshareFlags::NEWNET;
    if !namespace_only.contains(flags) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: rustix marks unshare unsafe because CLONE_FILES/CLONE_FS/CLONE_SYSVSEM can break
    // invariants of other threads sharing those tables. Only namespace flags get here (checked
    // above); they change this thread's view of the system, not memory other threads use.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(io::Error::from)
}

/// SIGKILL by pid, ignoring errors (the process may be gone already).
pub fn kill_pid(pid: u32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Closes every descriptor except stdio and `keep`, so the sandbox init holds nothing of the
/// process it was cloned from (the zygote's control socket, the daemon's files).
pub fn close_other_fds(keep: &[i32]) {
    let mut keep: Vec<u32> = keep.iter().filter(|fd| **fd > 2).map(|fd| *fd as u32).collect();
    keep.sort_unstable();
    let mut first = 3u32;
    for fd in keep.into_iter().chain(std::iter::once(u32::MAX)) {
        if fd > first {
            // SAFETY: close_range only closes descriptors. It runs in a freshly cloned sandbox init
            // that never returns to the code owning those descriptors (it ends in process::exit),
            // so no Rust object will use or close them again.
            unsafe {
                libc::syscall(libc::SYS_close_range, first, fd - 1, 0u32);
            }
        }
        first = fd.saturating_add(1);
    }
}

/// Sets IFF_UP on `lo` of the current network namespace.
pub fn bring_loopback_up() -> io::Result<()> {
    use rustix::net::{socket, AddressFamily, SocketType};
    let sock = socket(AddressFamily::INET, SocketType::DGRAM, None)?;
    // SAFETY: ifreq is plain data, zero-initialised; the name is NUL-terminated within
    // IFNAMSIZ; both ioctls only read/write the struct we pass, which outlives the calls.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Restores default dispositions and an empty mask for every catchable signal. A daemon
/// started from a shell's background job inherits SIGINT/SIGQUIT as ignored, and ignored
/// dispositions survive exec: without this, Ctrl-C would not reach sandbox commands.
pub fn reset_signal_dispositions() {
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL (no handler function) cannot violate memory safety; a
        // zeroed sigaction is a valid value with an empty mask and no flags. Errors for
        // signal numbers the kernel reserves are ignored.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
    // SAFETY: sigprocmask with a valid, empty set only changes this thread's mask.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}
