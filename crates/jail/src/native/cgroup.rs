//! Resource limits through cgroups, v1 (per-controller hierarchies) or v2 (unified), behind one
//! interface. Sandbox groups are always created below the daemon's own group in each
//! hierarchy, under a `corral` group, so corral never touches cgroups it does not own.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::{JailError, ResolvedLimits, ResourceUsage};

const CPU_PERIOD_US: u64 = 100_000;
/// v1 controllers corral uses; `freezer` pauses and kills reliably.
const V1_CONTROLLERS: [&str; 4] = ["memory", "cpu", "pids", "freezer"];
/// CPU accounting, when mounted apart from `cpu` (co-mounted `cpu,cpuacct` needs nothing more).
const V1_OPTIONAL: [&str; 1] = ["cpuacct"];

#[derive(Debug, Clone)]
pub enum CgroupLayout {
    /// One mount per controller; `parents` maps controller name to corral's parent dir in it.
    V1 { parents: Vec<(String, PathBuf)> },
    /// One unified tree; `parent` is corral's parent dir.
    V2 { parent: PathBuf },
}

/// The cgroup(s) of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    layout_v2: bool,
    /// controller name ("unified" for v2) → directory.
    dirs: Vec<(String, PathBuf)>,
}

fn os(op: &str, path: &Path, err: io::Error) -> JailError {
    JailError::os(format!("{op} {}", path.display()), err)
}

fn write(path: &Path, value: &str) -> Result<(), JailError> {
    fs::write(path, value).map_err(|e| os("write", path, e))
}

impl CgroupLayout {
    /// Finds the hierarchies and the process's own place in them, and prepares `corral` groups.
    pub fn detect() -> Result<Self, JailError> {
        let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| JailError::os("read /proc/self/cgroup", e))?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| JailError::os("read mountinfo", e))?;
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            let rel = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
            let parent = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/')).join("corral");
            prepare_v2(&parent)?;
            return Ok(CgroupLayout::V2 { parent });
        }
        let mut parents = Vec::new();
        for controller in V1_CONTROLLERS.iter().chain(V1_OPTIONAL.iter()).copied() {
            let Some(mount) = v1_mount(&mountinfo, controller) else {
                if V1_OPTIONAL.contains(&controller) {
                    continue;
                }
                return Err(JailError::Unsupported(format!("cgroup v1 controller {controller} is not mounted")));
            };
            let rel = own
                .lines()
                .find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
                    list.split(',').any(|c| c == controller).then(|| path.to_string())
                })
                .unwrap_or_else(|| "/".to_string());
            let parent = mount.join(rel.trim_start_matches('/')).join("corral");
            if parents.iter().any(|(_, p)| *p == parent) {
                continue; // co-mounted with a controller already handled
            }
            fs::create_dir_all(&parent).map_err(|e| os("create", &parent, e))?;
            parents.push((controller.to_string(), parent));
        }
        Ok(CgroupLayout::V1 { parents })
    }

    pub fn version(&self) -> u8 {
        match self {
            CgroupLayout::V1 { .. } => 1,
            CgroupLayout::V2 { .. } => 2,
        }
    }

    /// Creates the sandbox's group(s) and writes its limits. Leftovers of an earlier run with the
    /// same id are removed first.
    pub fn create(&self, id: &str, limits: &ResolvedLimits) -> Result<SandboxCgroup, JailError> {
        let cgroup = self.handle(id);
        cgroup.remove();
        for (_, dir) in &cgroup.dirs {
            fs::create_dir(dir).map_err(|e| os("create cgroup", dir, e))?;
        }
        let result = if cgroup.layout_v2 { cgroup.limit_v2(limits) } else { cgroup.limit_v1(limits) };
        if let Err(err) = result {
            cgroup.remove();
            return Err(err);
        }
        Ok(cgroup)
    }

    /// The handle for an existing sandbox's group(s), e.g. after a daemon restart.
    pub fn handle(&self, id: &str) -> SandboxCgroup {
        match self {
            CgroupLayout::V1 { parents } => SandboxCgroup {
                layout_v2: false,
                dirs: parents.iter().map(|(c, p)| (c.clone(), p.join(id))).collect(),
            },
            CgroupLayout::V2 { parent } => SandboxCgroup { layout_v2: true, dirs: vec![("unified".into(), parent.join(id))] },
        }
    }
}

/// The mount point of a v1 controller, from mountinfo's super options.
fn v1_mount(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        if right.next()? != "cgroup" {
            return None;
        }
        let options = right.nth(1)?;
        let mount_point = left.split_whitespace().nth(4)?;
        options.split(',').any(|o| o == controller).then(|| PathBuf::from(mount_point))
    })
}

/// v2 forbids processes in a group whose children have controllers, so the daemon's own
/// process moves into a leaf `corral/daemon` before controllers are enabled for sandboxes.
fn prepare_v2(parent: &Path) -> Result<(), JailError> {
    fs::create_dir_all(parent).map_err(|e| os("create", parent, e))?;
    let own_dir = parent.parent().unwrap_or(Path::new("/sys/fs/cgroup"));
    let available = fs::read_to_string(own_dir.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<String> = ["memory", "cpu", "pids"]
        .iter()
        .filter(|c| available.split_whitespace().any(|a| a == **c))
        .map(|c| format!("+{c}"))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let enable = wanted.join(" ");
    if fs::write(own_dir.join("cgroup.subtree_control"), &enable).is_err() {
        let leaf = parent.join("daemon");
        fs::create_dir_all(&leaf).map_err(|e| os("create", &leaf, e))?;
        write(&leaf.join("cgroup.procs"), &std::process::id().to_string())?;
        write(&own_dir.join("cgroup.subtree_control"), &enable)?;
    }
    write(&parent.join("cgroup.subtree_control"), &enable)
}

impl SandboxCgroup {
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs.iter().find(|(c, _)| c == controller || c == "unified").map(|(_, d)| d.as_path())
    }

    fn limit_v1(&self, limits: &ResolvedLimits) -> Result<(), JailError> {
        if let Some(memory) = self.dir("memory") {
            write(&memory.join("memory.limit_in_bytes"), &limits.memory.0.to_string())?;
            // No swap: where swap accounting exists cap memory+swap at the same value.
            let memsw = memory.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &limits.memory.0.to_string())?;
            }
            let _ = fs::write(memory.join("memory.swappiness"), "0");
        }
        if let Some(cpu) = self.dir("cpu") {
            write(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write(&cpu.join("cpu.cfs_quota_us"), &cpu_quota_us(limits.cpus).to_string())?;
        }
        if let Some(pids) = self.dir("pids") {
            write(&pids.join("pids.max"), &limits.pids.to_string())?;
        }
        Ok(())
    }

    fn limit_v2(&self, limits: &ResolvedLimits) -> Result<(), JailError> {
        let Some(dir) = self.dir("unified") else { return Ok(()) };
        let set = |file: &str, value: String| -> Result<(), JailError> {
            let path = dir.join(file);
            if path.exists() {
                write(&path, &value)?;
            }
            Ok(())
        };
        set("memory.max", limits.memory.0.to_string())?;
        set("memory.swap.max", "0".into())?;
        set("cpu.max", format!("{} {CPU_PERIOD_US}", cpu_quota_us(limits.cpus)))?;
        set("pids.max", limits.pids.to_string())
    }

    /// Moves a process (the sandbox's init, before it starts anything) into every group.
    pub fn attach(&self, pid: u32) -> Result<(), JailError> {
        for (_, dir) in &self.dirs {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    pub fn usage(&self) -> ResourceUsage {
        let read = |controller: &str, file: &str| -> Option<String> {
            fs::read_to_string(self.dir(controller)?.join(file)).ok()
        };
        let number = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        let keyed = |s: Option<String>, key: &str| {
            s.and_then(|s| s.lines().find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())).unwrap_or(0)
        };
        if self.layout_v2 {
            ResourceUsage {
                memory_bytes: number(read("unified", "memory.current")),
                memory_limit_bytes: number(read("unified", "memory.max")),
                cpu_usage_usec: keyed(read("unified", "cpu.stat"), "usage_usec "),
                pids: number(read("unified", "pids.current")),
                oom_kills: keyed(read("unified", "memory.events"), "oom_kill "),
                pids_limit_hits: keyed(read("unified", "pids.events"), "max "),
            }
        } else {
            ResourceUsage {
                memory_bytes: number(read("memory", "memory.usage_in_bytes")),
                memory_limit_bytes: number(read("memory", "memory.limit_in_bytes")),
                cpu_usage_usec: number(read("cpuacct", "cpuacct.usage").or_else(|| read("cpu", "cpuacct.usage"))) / 1000,
                pids: number(read("pids", "pids.current")),
                oom_kills: keyed(read("memory", "memory.oom_control"), "oom_kill "),
                pids_limit_hits: keyed(read("pids", "pids.events"), "max "),
            }
        }
    }

    /// Pids still in the sandbox's groups.
    pub fn pids(&self) -> Vec<u32> {
        let dir = self.dir("pids").or_else(|| self.dir("freezer"));
        dir.and_then(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Freezes (true) or thaws (false) every process in the sandbox. Thawing also thaws the
    /// processes held aside by [`SandboxCgroup::hold_all_but`], so nothing stays stopped by
    /// accident (e.g. after a daemon crash in the middle of a snapshot).
    pub fn set_frozen(&self, frozen: bool) -> Result<(), JailError> {
        let dir = self.freezer_dir()?;
        if !frozen && dir.join(HOLD).is_dir() {
            let _ = write_freeze(self.layout_v2, &dir.join(HOLD), false);
        }
        write_freeze(self.layout_v2, dir, frozen)
    }

    fn freezer_dir(&self) -> Result<&Path, JailError> {
        let controller = if self.layout_v2 { "unified" } else { "freezer" };
        self.dir(controller).ok_or_else(|| JailError::Unsupported("cgroup freezer".into()))
    }

    /// Leaves only `init` running: every other process is moved, frozen, into a `hold` child
    /// group. The agent (the init) can then read a consistent filesystem while nothing else
    /// changes it, whether the sandbox was running or paused before.
    pub fn hold_all_but(&self, init: u32, timeout: std::time::Duration) -> Result<(), JailError> {
        let dir = self.freezer_dir()?.to_path_buf();
        // Everything stops first, so nothing can fork while the others are being moved.
        self.set_frozen_and_wait(true, timeout)?;
        let hold = dir.join(HOLD);
        let result = (|| {
            match fs::create_dir(&hold) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(os("create", &hold, e)),
                _ => {}
            }
            write_freeze(self.layout_v2, &hold, true)?;
            for pid in read_pids(&dir) {
                if pid != init {
                    // A process that exited meanwhile cannot be moved; that is fine.
                    let _ = fs::write(hold.join("cgroup.procs"), pid.to_string());
                }
            }
            Ok(())
        })();
        // The init runs again whatever happened; held processes stay frozen in their group.
        write_freeze(self.layout_v2, &dir, false)?;
        if result.is_err() {
            self.release_held(false);
        }
        result
    }

    /// Undoes [`SandboxCgroup::hold_all_but`]: held processes rejoin the sandbox's group, which
    /// ends frozen when `stay_frozen` (a paused sandbox) and running otherwise.
    pub fn release_held(&self, stay_frozen: bool) {
        let Ok(dir) = self.freezer_dir().map(Path::to_path_buf) else { return };
        if stay_frozen {
            if let Err(err) = self.set_frozen_and_wait(true, std::time::Duration::from_secs(5)) {
                tracing::warn!(%err, "could not freeze the sandbox again after a snapshot");
            }
        }
        let hold = dir.join(HOLD);
        for pid in read_pids(&hold) {
            let _ = fs::write(dir.join("cgroup.procs"), pid.to_string());
        }
        if !stay_frozen {
            let _ = write_freeze(self.layout_v2, &hold, false);
        }
        let _ = fs::remove_dir(&hold);
    }

    /// Freezes or thaws, and waits (at most `timeout`) until the kernel reports every task
    /// stopped: a write only starts freezing, and a snapshot taken before it completes would
    /// race with processes still writing.
    pub fn set_frozen_and_wait(&self, frozen: bool, timeout: std::time::Duration) -> Result<(), JailError> {
        self.set_frozen(frozen)?;
        if !frozen {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut pause = std::time::Duration::from_micros(20);
        loop {
            if self.is_frozen()? {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                let _ = self.set_frozen(false);
                return Err(JailError::Start("the sandbox did not freeze in time".into()));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(5));
        }
    }

    /// Whether every task of the sandbox is frozen (not merely being frozen).
    pub fn is_frozen(&self) -> Result<bool, JailError> {
        if self.layout_v2 {
            let dir = self.dir("unified").ok_or_else(|| JailError::Unsupported("cgroup freezer".into()))?;
            let path = dir.join("cgroup.events");
            let events = fs::read_to_string(&path).map_err(|e| os("read", &path, e))?;
            return Ok(events.lines().any(|l| l.trim() == "frozen 1"));
        }
        let dir = self.dir("freezer").ok_or_else(|| JailError::Unsupported("cgroup freezer".into()))?;
        let path = dir.join("freezer.state");
        let state = fs::read_to_string(&path).map_err(|e| os("read", &path, e))?;
        Ok(state.trim() == "FROZEN")
    }

    /// Rewrites memory, CPU and pids limits of a running sandbox.
    pub fn set_limits(&self, limits: &ResolvedLimits) -> Result<(), JailError> {
        if self.layout_v2 {
            self.limit_v2(limits)
        } else {
            self.limit_v1(limits)
        }
    }

    /// Kills every process in the groups; used when the init is already gone or unknown.
    pub fn kill_all(&self) {
        if self.layout_v2 {
            if let Some(dir) = self.dir("unified") {
                let _ = fs::write(dir.join("cgroup.kill"), "1");
            }
            return;
        }
        // Frozen processes cannot fork in between; SIGKILL is delivered once they thaw.
        let _ = self.set_frozen(true);
        for pid in self.pids() {
            super::sys::kill_pid(pid);
        }
        let _ = self.set_frozen(false);
    }

    /// Removes the groups; they must be empty (retries briefly while the kernel tears tasks down).
    pub fn remove(&self) {
        for (_, dir) in &self.dirs {
            if !dir.exists() {
                continue;
            }
            if dir.join(HOLD).is_dir() {
                let _ = write_freeze(self.layout_v2, &dir.join(HOLD), false);
                for attempt in 0..200u64 {
                    if fs::remove_dir(dir.join(HOLD)).is_ok() || attempt == 199 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            // The kernel frees a group a moment after its last task exits: retry, briefly at first.
            for attempt in 0..400u64 {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if attempt < 399 => std::thread::sleep(std::time::Duration::from_micros(100 * attempt.min(50))),
                    Err(e) => tracing::warn!(dir = %dir.display(), %e, "cgroup not removed"),
                }
            }
        }
    }
}

/// The child group processes are held frozen in while the agent snapshots the sandbox.
const HOLD: &str = "hold";

fn write_freeze(v2: bool, dir: &Path, frozen: bool) -> Result<(), JailError> {
    if v2 {
        write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
    } else {
        write(&dir.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" })
    }
}

fn read_pids(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn cpu_quota_us(cpus: f64) -> u64 {
    ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000)
}
