//! The native backend: Linux namespaces, overlayfs, cgroups, seccomp and Landlock.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

pub mod cgroup;
mod fence;
pub mod launch;
mod rootfs;
pub mod seccomp;
mod sys;
pub mod zygote;

pub use cgroup::{CgroupLayout, SandboxCgroup};
pub use fence::FenceStatus;
pub use launch::{ChildContext, LaunchPlan, Parent};
pub use zygote::{AgentEntry, Zygote};

use crate::{AgentAddress, AgentBoot, Backend, JailConfig, JailError, ResourceUsage, Sandbox};

/// Host directories the native backend keeps under the data dir.
#[derive(Debug, Clone)]
pub struct HostPaths {
    /// Empty directory each sandbox mounts its disk tmpfs on, privately.
    pub staging: PathBuf,
    /// Read-only template layers, `<templates>/<name>/lower`.
    pub templates: PathBuf,
}

impl HostPaths {
    /// Creates the directories. Every component of `data_dir` must be searchable by other
    /// users, because sandbox root is an unprivileged host uid when it mounts its layers.
    pub fn prepare(data_dir: &Path) -> Result<Self, JailError> {
        let paths = HostPaths { staging: data_dir.join("mnt"), templates: data_dir.join("templates") };
        launch::ensure_dir(data_dir, 0o711)?;
        launch::ensure_dir(&paths.staging, 0o755)?;
        launch::ensure_dir(&paths.templates, 0o755)?;
        launch::ensure_dir(&paths.templates.join("base").join("lower"), 0o755)?;
        launch::ensure_dir(&paths.templates.join("code-interpreter-v1").join("lower"), 0o755)?;
        check_searchable(data_dir)?;
        Ok(paths)
    }

    pub fn lower(&self, template: &str) -> Result<PathBuf, JailError> {
        let lower = self.templates.join(template).join("lower");
        if template.contains('/') || template.starts_with('.') || !lower.is_dir() {
            return Err(JailError::UnknownTemplate(template.to_string()));
        }
        Ok(lower)
    }
}

fn check_searchable(dir: &Path) -> Result<(), JailError> {
    use std::os::unix::fs::PermissionsExt;
    let mut current = Some(dir);
    while let Some(path) = current {
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o001 == 0 {
                return Err(JailError::Config(format!(
                    "{} is not searchable by other users (mode {:o}); sandboxes cannot mount their layers below it. \
                     Choose a data dir outside it or chmod o+x it.",
                    path.display(),
                    meta.permissions().mode() & 0o7777
                )));
            }
        }
        current = path.parent();
    }
    Ok(())
}

/// Namespaces-based backend. Owns the zygote that forks sandbox inits.
pub struct NativeBackend {
    zygote: Mutex<Zygote>,
    cgroups: CgroupLayout,
    paths: HostPaths,
}

impl NativeBackend {
    /// Detects cgroups, prepares the data dir and forks the zygote.
    /// Call while the process is still single-threaded (before starting tokio).
    pub fn new(data_dir: &Path, agent: AgentEntry) -> Result<Self, JailError> {
        let paths = HostPaths::prepare(data_dir)?;
        let cgroups = CgroupLayout::detect()?;
        let zygote = Zygote::spawn(cgroups.clone(), agent)?;
        Ok(NativeBackend { zygote: Mutex::new(zygote), cgroups, paths })
    }

    pub fn cgroup_version(&self) -> u8 {
        self.cgroups.version()
    }
}

impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        "native"
    }

    fn start(&self, config: &JailConfig, agent: &AgentBoot) -> Result<Box<dyn Sandbox>, JailError> {
        let lower = self.paths.lower(&config.template)?;
        let pid = {
            let mut zygote = self.zygote.lock().map_err(|_| JailError::Start("launcher lock poisoned".into()))?;
            zygote.launch(config, agent, lower, self.paths.staging.clone())?
        };
        let cgroup = self.cgroups.handle(&config.id);
        let sandbox = NativeSandbox::attach(config.id.clone(), pid, cgroup, config.run_dir.clone());
        match sandbox {
            Ok(sandbox) => Ok(Box::new(sandbox)),
            Err(err) => {
                let cgroup = self.cgroups.handle(&config.id);
                cgroup.kill_all();
                cgroup.remove();
                Err(err)
            }
        }
    }

    fn recover(&self, config: &JailConfig, host_pid: Option<u32>) -> Result<Box<dyn Sandbox>, JailError> {
        let gone = || JailError::Gone(config.id.clone());
        let pid = host_pid.ok_or_else(gone)?;
        // A recycled pid would not sit in this sandbox's cgroup; checking before and after
        // pidfd_open closes the window in which it could be recycled.
        if !self.owns(&config.id, pid) {
            return Err(gone());
        }
        let sandbox = NativeSandbox::attach(config.id.clone(), pid, self.cgroups.handle(&config.id), config.run_dir.clone())
            .map_err(|_| gone())?;
        if !self.owns(&config.id, pid) || !sandbox.is_running() {
            return Err(gone());
        }
        Ok(Box::new(sandbox))
    }

    fn cleanup(&self, config: &JailConfig) -> Result<(), JailError> {
        let cgroup = self.cgroups.handle(&config.id);
        if !cgroup.pids().is_empty() {
            cgroup.kill_all();
        }
        cgroup.remove();
        match std::fs::remove_dir_all(&config.run_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(JailError::os(format!("remove {}", config.run_dir.display()), e))
            }
            _ => Ok(()),
        }
    }
}

impl NativeBackend {
    /// True if `pid` is the init of sandbox `id`: it sits in that sandbox's cgroup.
    fn owns(&self, id: &str, pid: u32) -> bool {
        let Ok(groups) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else { return false };
        let wanted = format!("/corral/{id}");
        groups.lines().any(|line| line.ends_with(&wanted))
    }
}

/// A running native sandbox, tracked through a pidfd so a recycled pid is never signalled.
pub struct NativeSandbox {
    id: String,
    pid: u32,
    pidfd: OwnedFd,
    cgroup: SandboxCgroup,
    run_dir: PathBuf,
}

impl NativeSandbox {
    pub fn attach(id: String, pid: u32, cgroup: SandboxCgroup, run_dir: PathBuf) -> Result<Self, JailError> {
        let raw = Pid::from_raw(pid as i32).ok_or_else(|| JailError::Start(format!("invalid pid {pid}")))?;
        let pidfd = pidfd_open(raw, PidfdFlags::empty()).map_err(|e| JailError::os("pidfd_open", e))?;
        Ok(NativeSandbox { id, pid, pidfd, cgroup, run_dir })
    }

    /// Blocks until the init has exited, at most `timeout`. True if it exited.
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        wait_readable(&self.pidfd, timeout)
    }

    pub fn cgroup(&self) -> &SandboxCgroup {
        &self.cgroup
    }
}

fn wait_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let ts = Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: i64::from(timeout.subsec_nanos()) };
    matches!(poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
}

/// Collects the exit status if the init is our child; harmless otherwise.
fn reap(pidfd: &OwnedFd) {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let _ = waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED | WaitIdOptions::NOHANG);
}

impl Sandbox for NativeSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn agent_address(&self) -> AgentAddress {
        AgentAddress::Unix { path: self.run_dir.join("agent.sock") }
    }

    fn host_pid(&self) -> Option<u32> {
        Some(self.pid)
    }

    fn usage(&self) -> Result<ResourceUsage, JailError> {
        Ok(self.cgroup.usage())
    }

    fn is_running(&self) -> bool {
        !wait_readable(&self.pidfd, Duration::ZERO)
    }

    fn destroy(&self) -> Result<(), JailError> {
        // Killing PID 1 of the pid namespace kills every process in it.
        let _ = pidfd_send_signal(&self.pidfd, Signal::KILL);
        // A paused sandbox: on cgroup v1 the kill is only delivered once the tasks thaw.
        let _ = self.cgroup.set_frozen(false);
        if !self.wait_exit(Duration::from_secs(5)) {
            tracing::warn!(id = %self.id, "sandbox init did not exit after SIGKILL");
        }
        reap(&self.pidfd);
        // Processes that escaped the pid namespace cannot exist, but the cgroup is the ground truth.
        if !self.cgroup.pids().is_empty() {
            self.cgroup.kill_all();
        }
        self.cgroup.remove();
        match std::fs::remove_dir_all(&self.run_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(JailError::os(format!("remove {}", self.run_dir.display()), e)),
        }
    }

    fn freeze(&self) -> Result<(), JailError> {
        if !self.is_running() {
            return Err(JailError::Gone(self.id.clone()));
        }
        self.cgroup.set_frozen_and_wait(true, FREEZE_TIMEOUT)
    }

    fn thaw(&self) -> Result<(), JailError> {
        self.cgroup.set_frozen(false)
    }

    fn hold_processes(&self) -> Result<(), JailError> {
        if !self.is_running() {
            return Err(JailError::Gone(self.id.clone()));
        }
        self.cgroup.hold_all_but(self.pid, FREEZE_TIMEOUT)
    }

    fn release_processes(&self, paused: bool) -> Result<(), JailError> {
        self.cgroup.release_held(paused);
        Ok(())
    }

    fn set_limits(&self, limits: &crate::ResolvedLimits) -> Result<(), JailError> {
        self.cgroup.set_limits(limits)
    }
}

/// How long processes may take to reach the freezer (e.g. out of an uninterruptible wait).
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a `corral run` sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// Exit code of the command, or 128+signal.
    pub code: i32,
    /// Why corral or the kernel ended it, when it was not a normal exit.
    pub reason: Option<String>,
}

/// Runs a single sandbox whose init is `payload` and waits for it (`corral run`).
/// Call while the process is single-threaded.
pub fn run_once(
    config: &JailConfig,
    data_dir: &Path,
    timeout: Option<Duration>,
    payload: &mut dyn FnMut() -> i32,
) -> Result<RunOutcome, JailError> {
    run_once_keeping(config, data_dir, timeout, Vec::new(), payload)
}

/// [`run_once`], keeping `keep_fds` open in the sandbox init (e.g. a socket to the caller).
pub fn run_once_keeping(
    config: &JailConfig,
    data_dir: &Path,
    timeout: Option<Duration>,
    keep_fds: Vec<i32>,
    payload: &mut dyn FnMut() -> i32,
) -> Result<RunOutcome, JailError> {
    let paths = HostPaths::prepare(data_dir)?;
    let cgroups = CgroupLayout::detect()?;
    let plan = LaunchPlan {
        config,
        cgroups: &cgroups,
        lower: paths.lower(&config.template)?,
        staging: paths.staging.clone(),
        parent: Parent::Caller,
        keep_fds,
        detach_stdio: false,
    };
    let launched = launch::launch(&plan, payload)?;
    let sandbox = NativeSandbox::attach(config.id.clone(), launched.pid, launched.cgroup.clone(), config.run_dir.clone())?;
    let timed_out = match timeout {
        Some(limit) => !sandbox.wait_exit(limit),
        None => {
            while !sandbox.wait_exit(Duration::from_secs(3600)) {}
            false
        }
    };
    if timed_out {
        let _ = pidfd_send_signal(&sandbox.pidfd, Signal::KILL);
    }
    let status = rustix::process::waitpid(Pid::from_raw(launched.pid as i32), rustix::process::WaitOptions::empty())
        .map_err(|e| JailError::os("wait for sandbox", e))?;
    let usage = launched.cgroup.usage();
    if !launched.cgroup.pids().is_empty() {
        launched.cgroup.kill_all();
    }
    launched.cgroup.remove();
    let (mut code, signal) = match status {
        Some((_, status)) if status.exited() => (status.exit_status().unwrap_or(1), None),
        Some((_, status)) => {
            let sig = status.terminating_signal().unwrap_or(9);
            (128 + sig, Some(sig))
        }
        None => (1, None),
    };
    let reason = if timed_out {
        code = 128 + 9;
        Some("timed out".to_string())
    } else if usage.oom_kills > 0 && (code == 137 || signal == Some(9)) {
        Some(format!("killed: out of memory (limit {})", corral_spec::ByteSize(usage.memory_limit_bytes)))
    } else if usage.pids_limit_hits > 0 && code != 0 {
        Some(format!("process limit reached ({} pids)", config.limits.pids))
    } else {
        None
    };
    Ok(RunOutcome { code, reason })
}
