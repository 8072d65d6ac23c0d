//! Creates one sandbox: cgroups, namespaces, id maps, root filesystem, security, then the
//! payload (the agent, or a single command for `corral run`) as PID 1.
//!
//! Must run in a single-threaded process (the zygote, or `corral run` before it starts any
//! thread), because the sandbox init is forked from it.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::thread::UnshareFlags;

use super::cgroup::{CgroupLayout, SandboxCgroup};
use super::seccomp::Filters;
use super::sys::{self, Forked};
use super::{fence, rootfs};
use crate::{JailConfig, JailError, ID_RANGE};

const NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC) as u64;
/// Highest fd number a sandbox process may hold.
const NOFILE_LIMIT: u64 = 4096;

/// Where the sandbox init should end up in the process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    /// The caller waits for it (`corral run`); it dies with the caller.
    Caller,
    /// The caller's parent adopts it (the daemon, when the zygote launches). It outlives both.
    CallersParent,
}

pub struct LaunchPlan<'a> {
    pub config: &'a JailConfig,
    pub cgroups: &'a CgroupLayout,
    /// The template's read-only layer.
    pub lower: PathBuf,
    /// An empty directory used as mount point inside the new mount namespace.
    pub staging: PathBuf,
    pub parent: Parent,
    /// Descriptors the payload needs; everything else is closed in the sandbox.
    pub keep_fds: Vec<i32>,
    /// Redirect the init's stdio to /dev/null (daemon mode) instead of inheriting it.
    pub detach_stdio: bool,
}

pub struct Launched {
    pub pid: u32,
    pub cgroup: SandboxCgroup,
}

/// What the sandbox init hands its payload besides the descriptors in `keep_fds`.
pub struct ChildContext {
    /// The overlay's upper (writable) dir: an `O_PATH | O_DIRECTORY | O_CLOEXEC` descriptor
    /// opened before `pivot_root`, the only way to reach that dir afterwards. Readable (and
    /// nothing more, Landlock permitting) for snapshots of the writable layer.
    pub upper: Option<OwnedFd>,
}

/// Starts the sandbox and returns once it is set up and about to run `payload`.
/// `payload` runs as PID 1 inside the sandbox; its return value is the init's exit code.
pub fn launch(plan: &LaunchPlan<'_>, payload: &mut dyn FnMut() -> i32) -> Result<Launched, JailError> {
    // `corral run` has no use for the layer; dropping the context closes its descriptor.
    launch_with_context(plan, &mut |_context| payload())
}

/// [`launch`], with the [`ChildContext`] passed to the payload.
pub fn launch_with_context(plan: &LaunchPlan<'_>, payload: &mut dyn FnMut(ChildContext) -> i32) -> Result<Launched, JailError> {
    let filters = Filters::build()?;
    let cgroup = plan.cgroups.create(&plan.config.id, &plan.config.limits)?;
    let result = start(plan, &cgroup, &filters, payload);
    match result {
        Ok(pid) => Ok(Launched { pid, cgroup }),
        Err(err) => {
            cgroup.kill_all();
            cgroup.remove();
            Err(err)
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), JailError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| JailError::os("pipe", e))
}

fn start(
    plan: &LaunchPlan<'_>,
    cgroup: &SandboxCgroup,
    filters: &Filters,
    payload: &mut dyn FnMut(ChildContext) -> i32,
) -> Result<u32, JailError> {
    let (go_read, go_write) = pipe()?;
    let (ready_read, ready_write) = pipe()?;
    let mut flags = NAMESPACES;
    if plan.parent == Parent::CallersParent {
        flags |= libc::CLONE_PARENT as u64;
    }
    match sys::clone_fork(flags).map_err(|e| JailError::os("clone sandbox init", e))? {
        Forked::Child => {
            drop(go_write);
            drop(ready_read);
            let code = run_child(plan, filters, go_read, ready_write, payload);
            std::process::exit(code);
        }
        Forked::Parent { child } => {
            drop(go_read);
            drop(ready_write);
            let outcome = prepare_child(plan, cgroup, child, go_write, ready_read);
            if outcome.is_err() {
                sys::kill_pid(child);
                if plan.parent == Parent::Caller {
                    let _ = rustix::process::waitpid(rustix::process::Pid::from_raw(child as i32), rustix::process::WaitOptions::empty());
                }
            }
            outcome.map(|()| child)
        }
    }
}

/// Parent side: map ids, attach cgroups, release the child, wait for its verdict.
fn prepare_child(
    plan: &LaunchPlan<'_>,
    cgroup: &SandboxCgroup,
    child: u32,
    go: OwnedFd,
    ready: OwnedFd,
) -> Result<(), JailError> {
    let base = plan.config.host_id_base;
    let map = format!("0 {base} {ID_RANGE}\n");
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{child}/{file}");
        fs::write(&path, &map).map_err(|e| JailError::os(format!("write {path}"), e))?;
    }
    cgroup.attach(child)?;
    let mut go = fs::File::from(go);
    go.write_all(b"g").map_err(|e| JailError::os("release sandbox init", e))?;
    let mut verdict = Vec::new();
    fs::File::from(ready).read_to_end(&mut verdict).map_err(|e| JailError::os("wait for sandbox init", e))?;
    match verdict.split_first() {
        Some((0, _)) => Ok(()),
        Some((_, message)) => Err(JailError::Start(String::from_utf8_lossy(message).into_owned())),
        None => Err(JailError::Start("sandbox init exited during setup".into())),
    }
}

/// Child side, as the future PID 1. Returns the exit code.
fn run_child(
    plan: &LaunchPlan<'_>,
    filters: &Filters,
    go: OwnedFd,
    ready: OwnedFd,
    payload: &mut dyn FnMut(ChildContext) -> i32,
) -> i32 {
    let mut ready = fs::File::from(ready);
    let mut byte = [0u8; 1];
    if fs::File::from(go).read_exact(&mut byte).is_err() {
        return 120;
    }
    match setup(plan, filters, ready.as_fd().as_raw_fd()) {
        Ok(context) => {
            if ready.write_all(&[0]).is_err() {
                return 120;
            }
            drop(ready);
            payload(context)
        }
        Err(err) => {
            let mut message = vec![1u8];
            message.extend_from_slice(err.to_string().as_bytes());
            let _ = ready.write_all(&message);
            120
        }
    }
}

fn setup(plan: &LaunchPlan<'_>, filters: &Filters, ready_fd: i32) -> Result<ChildContext, JailError> {
    if plan.parent == Parent::Caller {
        // `corral run`: the sandbox must not outlive the CLI that waits for it.
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| JailError::os("set death signal", e))?;
    }
    sys::reset_signal_dispositions();
    let mut keep = plan.keep_fds.clone();
    keep.push(ready_fd);
    sys::close_other_fds(&keep);
    if plan.detach_stdio {
        detach_stdio()?;
    }
    become_root()?;
    // The cgroup namespace is created only now, so its root is the sandbox's own group.
    sys::unshare_namespaces(UnshareFlags::NEWCGROUP).map_err(|e| JailError::os("unshare cgroup namespace", e))?;
    let upper = rootfs::build(&rootfs::RootfsPlan {
        staging: &plan.staging,
        lower: &plan.lower,
        disk_bytes: plan.config.limits.disk.0,
        volumes: &plan.config.volumes,
        hostname: &plan.config.hostname,
    })?;
    sys::bring_loopback_up().map_err(|e| JailError::os("bring up loopback", e))?;
    set_rlimits()?;
    rustix::thread::set_no_new_privs(true).map_err(|e| JailError::os("set no_new_privs", e))?;
    if let Err(reason) = fence::apply(upper.as_ref()) {
        tracing::debug!(%reason, "landlock not applied");
    }
    filters.apply()?;
    Ok(ChildContext { upper })
}

fn become_root() -> Result<(), JailError> {
    let root_gid = rustix::process::Gid::ROOT;
    let root_uid = rustix::process::Uid::ROOT;
    rustix::thread::set_thread_res_gid(root_gid, root_gid, root_gid).map_err(|e| JailError::os("setresgid", e))?;
    rustix::thread::set_thread_groups(&[]).map_err(|e| JailError::os("setgroups", e))?;
    rustix::thread::set_thread_res_uid(root_uid, root_uid, root_uid).map_err(|e| JailError::os("setresuid", e))
}

fn detach_stdio() -> Result<(), JailError> {
    let null = fs::OpenOptions::new().read(true).write(true).open("/dev/null").map_err(|e| JailError::os("open /dev/null", e))?;
    for target in 0..=2 {
        let result = match target {
            0 => rustix::stdio::dup2_stdin(&null),
            1 => rustix::stdio::dup2_stdout(&null),
            _ => rustix::stdio::dup2_stderr(&null),
        };
        result.map_err(|e| JailError::os("redirect stdio", e))?;
    }
    Ok(())
}

fn set_rlimits() -> Result<(), JailError> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    setrlimit(Resource::Core, Rlimit { current: Some(0), maximum: Some(0) }).map_err(|e| JailError::os("rlimit core", e))?;
    setrlimit(Resource::Nofile, Rlimit { current: Some(NOFILE_LIMIT), maximum: Some(NOFILE_LIMIT) })
        .map_err(|e| JailError::os("rlimit nofile", e))
}

/// Prepares the per-host directories every launch needs.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<(), JailError> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(path).map_err(|e| JailError::os(format!("create {}", path.display()), e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| JailError::os(format!("chmod {}", path.display()), e))
}
