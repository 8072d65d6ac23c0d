//! Isolation backends: the only crate that makes privileged syscalls or contains `unsafe`.
//!
//! Everything above this crate talks to a sandbox through [`Backend`] and [`Sandbox`] and
//! reaches the agent inside through an [`AgentAddress`]; nothing above may assume the
//! sandbox is a Linux process on the same kernel (gVisor and microVMs come later).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use corral_spec::{ResolvedLimits, Volume};

pub mod child;
pub mod native;

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("{op}: {source}")]
    Os { op: String, source: std::io::Error },
    #[error("unknown template {0:?}")]
    UnknownTemplate(String),
    #[error("the host does not support {0}")]
    Unsupported(String),
    #[error("sandbox failed to start: {0}")]
    Start(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("sandbox {0} is no longer running")]
    Gone(String),
}

impl JailError {
    pub fn os(op: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        JailError::Os { op: op.into(), source: source.into() }
    }
}

/// The user a sandbox's commands run as by default.
pub const SANDBOX_USER: &str = "user";
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_HOME: &str = "/home/user";
/// Every sandbox gets this many ids, mapped from a host range of its own.
pub const ID_RANGE: u32 = 65_536;

/// What a backend needs to build one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JailConfig {
    /// Unique id; names cgroups and runtime files.
    pub id: String,
    pub template: String,
    pub hostname: String,
    pub limits: ResolvedLimits,
    pub volumes: Vec<Volume>,
    /// Directory for this sandbox's runtime files on the host (agent socket).
    pub run_dir: PathBuf,
    /// First host uid/gid of this sandbox's id range (`ID_RANGE` ids).
    pub host_id_base: u32,
}

/// How to reach the agent inside a sandbox. Transports are replaceable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AgentAddress {
    Unix { path: PathBuf },
}

/// Resource usage read from the sandbox's cgroups (or the VM, for other backends).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceUsage {
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
    pub cpu_usage_usec: u64,
    pub pids: u64,
    /// Times the memory limit was hit by an allocation the kernel then refused or OOM-killed.
    pub oom_kills: u64,
    /// Times fork failed at the pids limit.
    pub pids_limit_hits: u64,
}

/// Why a sandbox ended, as far as the backend can tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    Killed,
    Exited { code: i32 },
    Signaled { signal: i32 },
}

/// One running sandbox. Dropping the handle does not stop it; `destroy` does.
pub trait Sandbox: Send + Sync {
    fn id(&self) -> &str;
    /// Where the agent listens; connect as many times as needed.
    fn agent_address(&self) -> AgentAddress;
    /// Host pid of the sandbox's init, for backends that have one.
    fn host_pid(&self) -> Option<u32>;
    fn usage(&self) -> Result<ResourceUsage, JailError>;
    /// Whether the sandbox's init is still running.
    fn is_running(&self) -> bool;
    /// Kills every process and releases every resource (cgroups, runtime files). Idempotent.
    fn destroy(&self) -> Result<(), JailError>;
    /// Stops every process of the sandbox where it stands (no CPU, memory kept), returning once
    /// all are stopped. The agent is frozen too: nothing inside answers until [`Sandbox::thaw`].
    fn freeze(&self) -> Result<(), JailError> {
        Err(JailError::Unsupported("pausing sandboxes".into()))
    }
    /// Lets a frozen sandbox run again. Thawing a running sandbox is a no-op.
    fn thaw(&self) -> Result<(), JailError> {
        Err(JailError::Unsupported("pausing sandboxes".into()))
    }
    /// Stops every process but the agent, so the agent can capture a consistent filesystem.
    /// Works on running and paused sandboxes alike.
    fn hold_processes(&self) -> Result<(), JailError> {
        Err(JailError::Unsupported("snapshots".into()))
    }
    /// Undoes [`Sandbox::hold_processes`]; the sandbox ends paused (everything frozen, agent
    /// included) when `paused`, running otherwise.
    fn release_processes(&self, paused: bool) -> Result<(), JailError> {
        let _ = paused;
        Err(JailError::Unsupported("snapshots".into()))
    }
    /// Changes the resource limits of a running sandbox (used when a pooled sandbox is handed
    /// out). The disk size is fixed at start and is not changed.
    fn set_limits(&self, limits: &ResolvedLimits) -> Result<(), JailError> {
        let _ = limits;
        Err(JailError::Unsupported("changing limits of a running sandbox".into()))
    }
}

/// An isolation technology. `native` uses Linux namespaces; gVisor and microVMs come later.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Builds and starts a sandbox; returns once its agent accepts connections.
    fn start(&self, config: &JailConfig, agent: &AgentBoot) -> Result<Box<dyn Sandbox>, JailError>;
    /// Re-attaches to a sandbox started by an earlier daemon process (after a restart or a
    /// crash). Fails with [`JailError::Gone`] if it is no longer running.
    fn recover(&self, config: &JailConfig, host_pid: Option<u32>) -> Result<Box<dyn Sandbox>, JailError>;
    /// Releases whatever a sandbox that is no longer running may have left behind.
    fn cleanup(&self, config: &JailConfig) -> Result<(), JailError>;
}

/// What the agent inside needs to know at boot.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AgentBoot {
    pub env: BTreeMap<String, String>,
}
