//! The agent: PID 1 inside every sandbox. Serves exec, process and file requests from the
//! daemon over one multiplexed connection (see `corral_proto`).
//!
//! It must never die: a panic or exit here takes the whole sandbox down. Everything a
//! sandbox process controls (paths, output volume, pids) is handled as untrusted input, and
//! everything it could grow is bounded.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use corral_proto::{Event, Mux, ProcessInfo, Request, Role, Stream, StreamReceiver, StreamSender, PROTOCOL_VERSION};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::AbortHandle;

pub mod egress;
mod error;
mod exec;
mod files;
mod process_table;
mod pty;
mod reaper;
mod session;
mod snapshot;
mod users;
mod watch;

pub use error::AgentError;
pub use exec::DEFAULT_PATH;
pub use reaper::{ExitStatus, Reaper};
pub use users::UserEntry;

use process_table::ProcessTable;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentConfig {
    /// Defaults for every exec, under the request's own env.
    pub env: BTreeMap<String, String>,
    pub users: Vec<UserEntry>,
    /// Who requests act as when they name nobody.
    pub default_user: String,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig { env: BTreeMap::new(), users: UserEntry::defaults(), default_user: corral_jail::SANDBOX_USER.to_owned() }
    }
}

/// What outlives connections: configuration and the process table.
pub struct AgentState {
    users: Vec<UserEntry>,
    default_user: String,
    env: Mutex<BTreeMap<String, String>>,
    /// Proxy variables, under `env` (set when egress is on; `Configure` does not drop them).
    egress_env: BTreeMap<String, String>,
    /// The latest host connection, which egress relays open their streams on.
    host: Mutex<Option<Mux>>,
    processes: ProcessTable,
    reaper: AbortHandle,
    /// The sandbox's writable layer (from the jail), for snapshots.
    layer: Option<std::os::fd::OwnedFd>,
}

impl AgentState {
    /// Must be called inside a tokio runtime: it starts the reaper there.
    pub fn new(config: AgentConfig) -> Arc<Self> {
        Arc::new(AgentState {
            users: config.users,
            default_user: config.default_user,
            env: Mutex::new(config.env),
            egress_env: BTreeMap::new(),
            host: Mutex::new(None),
            processes: ProcessTable::default(),
            reaper: reaper::spawn_driver().abort_handle(),
            layer: None,
        })
    }

    fn user(&self, requested: Option<&str>) -> Result<UserEntry, AgentError> {
        users::resolve_user(&self.users, &self.default_user, requested)
    }

    /// Like [`AgentState::new`], with the loopback egress proxy variables in every process.
    pub fn with_egress(config: AgentConfig, port: u16) -> Arc<Self> {
        let mut state = Self::new(config);
        if let Some(state) = Arc::get_mut(&mut state) {
            state.egress_env = egress::proxy_env(port);
        }
        state
    }

    fn default_env(&self) -> BTreeMap<String, String> {
        let mut env = self.egress_env.clone();
        env.extend(self.env.lock().unwrap_or_else(PoisonError::into_inner).clone());
        env
    }

    fn host(&self) -> Option<Mux> {
        self.host.lock().unwrap_or_else(PoisonError::into_inner).clone().filter(|m| !m.is_closed())
    }

    fn set_env(&self, env: BTreeMap<String, String>) {
        *self.env.lock().unwrap_or_else(PoisonError::into_inner) = env;
    }
}

impl Drop for AgentState {
    fn drop(&mut self) {
        self.reaper.abort();
    }
}

/// Blocking entry point for PID 1: serves connections on `listener` forever.
///
/// Returns only if the runtime cannot be set up (the caller should exit with that code).
pub fn run(listener: UnixListener, config: AgentConfig) -> i32 {
    run_inner(listener, config, None, None)
}

/// [`run`], plus the egress proxy listener on loopback `port` (relayed to the host).
pub fn run_with_egress(listener: UnixListener, config: AgentConfig, port: u16) -> i32 {
    run_inner(listener, config, Some(port), None)
}

/// What a daemon sandbox's agent runs with: optional egress, and the descriptor of the
/// sandbox's writable layer that snapshots read (see `corral_jail::native::ChildContext`).
pub fn run_sandbox(listener: UnixListener, config: AgentConfig, egress_port: Option<u16>, layer: Option<std::os::fd::OwnedFd>) -> i32 {
    run_inner(listener, config, egress_port, layer)
}

fn run_inner(listener: UnixListener, config: AgentConfig, egress_port: Option<u16>, layer: Option<std::os::fd::OwnedFd>) -> i32 {
    // Root inside the sandbox must not ptrace the agent or read its memory.
    if let Err(err) = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable) {
        tracing::warn!(%err, "could not make the agent non-dumpable");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("corral-agent: cannot start runtime: {err}");
            return 1;
        }
    };
    runtime.block_on(async move {
        let listener = match listener.set_nonblocking(true).and_then(|()| tokio::net::UnixListener::from_std(listener)) {
            Ok(listener) => listener,
            Err(err) => {
                eprintln!("corral-agent: cannot listen: {err}");
                return 1;
            }
        };
        let mut state = match egress_port {
            Some(port) => AgentState::with_egress(config, port),
            None => AgentState::new(config),
        };
        // The state is not shared yet, so the layer can still be put in.
        if let Some(inner) = Arc::get_mut(&mut state) {
            inner.layer = layer;
        }
        if let Some(port) = egress_port {
            match egress::listen(port).await {
                Ok(proxy) => {
                    let s = state.clone();
                    tokio::spawn(async move { egress::relay(proxy, move || s.host()).await });
                }
                // No egress is a degraded sandbox, not a dead one.
                Err(err) => eprintln!("corral-agent: cannot listen on the egress port: {err}"),
            }
        }
        loop {
            match listener.accept().await {
                Ok((conn, _)) => {
                    tokio::spawn(serve_connection(state.clone(), conn));
                }
                Err(err) => {
                    // E.g. EMFILE: back off rather than spin; the daemon will retry.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// Serves one already-connected byte stream until it closes.
pub async fn serve_connection<T>(state: Arc<AgentState>, io: T)
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    // The mux handle itself is not needed: streams notice a lost connection on their own.
    let (mux, mut incoming) = Mux::new(io, Role::Agent);
    // Egress relays use the newest connection: the daemon reconnects after a drop.
    *state.host.lock().unwrap_or_else(PoisonError::into_inner) = Some(mux);
    while let Some((request, stream)) = incoming.accept().await {
        tokio::spawn(handle(state.clone(), request, stream));
    }
}

async fn handle(state: Arc<AgentState>, request: Request, stream: Stream) {
    let (mut tx, mut rx) = stream.split();
    if let Err(AgentError::Request { kind, message }) = dispatch(&state, request, &mut tx, &mut rx).await {
        let _ = tx.send_event(&Event::error(kind, message)).await;
    }
    // Dropping `tx` ends the stream.
}

async fn dispatch(
    state: &Arc<AgentState>,
    request: Request,
    tx: &mut StreamSender,
    rx: &mut StreamReceiver,
) -> Result<(), AgentError> {
    let answer = match request {
        Request::Ping => Event::Pong { version: PROTOCOL_VERSION.to_owned() },
        Request::Configure { env } => {
            state.set_env(env);
            Event::Ok
        }
        Request::Exec(spec) => return session::exec(state, spec, tx, rx).await,
        Request::Attach { pid } => return session::attach(state, pid, tx, rx).await,
        Request::ProcessList => return send_processes(state.processes.list(), tx).await,
        Request::Signal { pid, signal } => {
            state.processes.get(pid)?.signal(signal)?;
            Event::Ok
        }
        Request::SendStdin { pid, data } => {
            state.processes.get(pid)?.write_stdin(data.as_bytes()).await?;
            Event::Ok
        }
        Request::CloseStdin { pid } => {
            state.processes.get(pid)?.close_stdin().await?;
            Event::Ok
        }
        Request::ResizePty { pid, size } => {
            state.processes.get(pid)?.resize(size)?;
            Event::Ok
        }
        Request::ReadFile { path, user } => return files::read_file(&state.user(user.as_deref())?, &path, tx).await,
        Request::WriteFile { path, user, mode, append } => {
            Event::Entry(files::write_file(&state.user(user.as_deref())?, &path, mode, append, rx).await?)
        }
        Request::Stat { path, user } => Event::Entry(files::stat(&state.user(user.as_deref())?, &path).await?),
        Request::ListDir { path, depth, user } => {
            return files::list_dir(&state.user(user.as_deref())?, &path, depth, tx).await;
        }
        Request::MakeDir { path, user } => match files::make_dir(&state.user(user.as_deref())?, &path).await? {
            Some(entry) => Event::Entry(entry),
            None => Event::Ok,
        },
        Request::Remove { path, user } => {
            files::remove(&state.user(user.as_deref())?, &path).await?;
            Event::Ok
        }
        Request::Rename { from, to, user } => Event::Entry(files::rename(&state.user(user.as_deref())?, &from, &to).await?),
        Request::TrustCa { pem } => {
            egress::install_ca(&pem).map_err(|e| AgentError::Request { kind: corral_proto::ErrorKind::from_io(&e), message: format!("installing the CA: {e}") })?;
            Event::Ok
        }
        Request::SnapshotLayer => return snapshot::capture(state.layer.as_ref(), tx).await,
        Request::RestoreLayer => return snapshot::restore(rx, tx).await,
        Request::Egress { .. } => {
            return Err(AgentError::Request { kind: corral_proto::ErrorKind::Unsupported, message: "egress streams go to the host".into() });
        }
        Request::Watch { path, recursive, user } => {
            let path = state.user(user.as_deref())?.resolve_path(&path);
            return watch::watch(path, recursive, tx, rx).await;
        }
    };
    tx.send_event(&answer).await?;
    Ok(())
}

/// Answers one or more `Processes` events, each under the mux's event size limit.
async fn send_processes(processes: Vec<ProcessInfo>, tx: &mut StreamSender) -> Result<(), AgentError> {
    const BUDGET: usize = 48 * 1024;
    let mut batch = Vec::new();
    let mut size = 0;
    for info in processes {
        let info_size = serde_json::to_vec(&info).map_or(0, |v| v.len() + 1);
        if size + info_size > BUDGET && !batch.is_empty() {
            tx.send_event(&Event::Processes { processes: std::mem::take(&mut batch) }).await?;
            size = 0;
        }
        size += info_size;
        batch.push(info);
    }
    tx.send_event(&Event::Processes { processes: batch }).await?;
    Ok(())
}
