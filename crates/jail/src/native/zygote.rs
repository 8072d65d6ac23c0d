//! A single-threaded helper process, forked from the daemon before it starts any thread, that
//! launches sandboxes on request. Forking sandbox inits from a multi-threaded daemon would be
//! unsound; exec'ing a fresh launcher per sandbox would cost a millisecond or more.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::cgroup::CgroupLayout;
use super::launch::{launch_with_context, ChildContext, LaunchPlan, Parent};
use super::sys::{self, Forked};
use crate::{AgentBoot, JailConfig, JailError};

/// The agent's entry point, run as PID 1 inside each sandbox with its listening socket.
pub type AgentEntry = fn(UnixListener, &AgentBoot, ChildContext) -> i32;

#[derive(Serialize, Deserialize)]
struct LaunchRequest {
    config: JailConfig,
    boot: AgentBoot,
    lower: PathBuf,
    staging: PathBuf,
}

#[derive(Serialize, Deserialize)]
enum LaunchReply {
    Started { pid: u32 },
    Failed { message: String },
}

/// The daemon's end of the zygote connection.
pub struct Zygote {
    stream: BufReader<UnixStream>,
    pid: u32,
}

impl Zygote {
    /// Forks the zygote. Call while the process is still single-threaded.
    pub fn spawn(cgroups: CgroupLayout, agent: AgentEntry) -> Result<Self, JailError> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| JailError::os("socketpair", e))?;
        match sys::fork().map_err(|e| JailError::os("fork zygote", e))? {
            Forked::Child => {
                drop(ours);
                let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
                serve(theirs, &cgroups, agent);
                std::process::exit(0);
            }
            Forked::Parent { child } => Ok(Zygote { stream: BufReader::new(ours), pid: child }),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Asks the zygote to start a sandbox; returns the init's host pid.
    pub fn launch(&mut self, config: &JailConfig, boot: &AgentBoot, lower: PathBuf, staging: PathBuf) -> Result<u32, JailError> {
        let request = LaunchRequest { config: config.clone(), boot: boot.clone(), lower, staging };
        let mut line = serde_json::to_vec(&request).map_err(|e| JailError::Config(e.to_string()))?;
        line.push(b'\n');
        let lost = |e: std::io::Error| JailError::os("zygote connection", e);
        self.stream.get_mut().write_all(&line).map_err(lost)?;
        let mut reply = String::new();
        if self.stream.read_line(&mut reply).map_err(lost)? == 0 {
            return Err(JailError::Start("the sandbox launcher exited".into()));
        }
        match serde_json::from_str(&reply).map_err(|e| JailError::Start(format!("launcher reply: {e}")))? {
            LaunchReply::Started { pid } => Ok(pid),
            LaunchReply::Failed { message } => Err(JailError::Start(message)),
        }
    }
}

fn serve(stream: UnixStream, cgroups: &CgroupLayout, agent: AgentEntry) {
    let Ok(write_half) = stream.try_clone() else { return };
    let mut writer = write_half;
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let Ok(line) = line else { return };
        let reply = match serde_json::from_str::<LaunchRequest>(&line) {
            Ok(request) => match launch_agent(&request, cgroups, agent) {
                Ok(pid) => LaunchReply::Started { pid },
                Err(err) => LaunchReply::Failed { message: err.to_string() },
            },
            Err(err) => LaunchReply::Failed { message: format!("bad launch request: {err}") },
        };
        let Ok(mut bytes) = serde_json::to_vec(&reply) else { return };
        bytes.push(b'\n');
        if writer.write_all(&bytes).is_err() {
            return;
        }
    }
}

fn launch_agent(request: &LaunchRequest, cgroups: &CgroupLayout, agent: AgentEntry) -> Result<u32, JailError> {
    let socket = request.config.run_dir.join("agent.sock");
    super::launch::ensure_dir(&request.config.run_dir, 0o700)?;
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|e| JailError::os(format!("bind {}", socket.display()), e))?;
    let plan = LaunchPlan {
        config: &request.config,
        cgroups,
        lower: request.lower.clone(),
        staging: request.staging.clone(),
        parent: Parent::CallersParent,
        keep_fds: vec![listener.as_raw_fd()],
        detach_stdio: true,
    };
    let boot = request.boot.clone();
    let mut listener = Some(listener);
    let mut payload = |context: ChildContext| match listener.take() {
        Some(listener) => agent(listener, &boot, context),
        None => 121,
    };
    let launched = launch_with_context(&plan, &mut payload)?;
    // Our copy of the listener closes here; the sandbox init keeps its own.
    drop(listener);
    Ok(launched.pid)
}
