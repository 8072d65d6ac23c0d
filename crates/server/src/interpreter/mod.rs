//! A stateful code interpreter inside sandboxes, shipped with corral (no Jupyter).
//!
//! Each context is one kernel process in the sandbox (`python3 -u -c kernel.py`, or
//! `node -e kernel.js`), started through the agent on first use and kept as a background
//! process. Cells go in as JSON lines on its stdin (`SendStdin`), answers come back as JSON
//! lines on its stdout. A context runs one cell at a time; a cell whose client went away or
//! whose timeout passed gets SIGINT (state survives), and a kernel that ignores that is
//! killed (state is lost, the next cell starts a fresh one).
//!
//! The native API (`POST /v1/sandboxes/{id}/code`) and the E2B adapter share this.

mod http;
mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use corral_proto::{ExecSpec, Mux, Request};
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::agent_client::{self, OutputEvent, Stdin};
use crate::error::ApiError;
use crate::manager::Manager;

pub use http::router;

/// Tag of kernel processes, so process listings can leave them out.
pub const KERNEL_TAG_PREFIX: &str = "corral-interpreter";
const PYTHON_KERNEL: &str = include_str!("kernel.py");
const JAVASCRIPT_KERNEL: &str = include_str!("kernel.js");
/// How long an interrupted cell may take to stop before its kernel is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
const MAX_CONTEXTS: usize = 64;
/// A kernel line longer than this (a huge result) is dropped rather than buffered.
const MAX_LINE: usize = 64 * 1024 * 1024;
const DEFAULT_CWD: &str = "/home/user";
const PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// Silence after which a `keepalive` line is sent (clients ignore unknown line types).
const HEARTBEAT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error("context {0:?} not found")]
    ContextNotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Sandbox(#[from] ApiError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    JavaScript,
}

impl Language {
    pub fn parse(name: Option<&str>) -> Result<Language, InterpreterError> {
        match name.map(|n| n.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("python") | Some("py") | Some("python3") => Ok(Language::Python),
            Some("javascript") | Some("js") | Some("typescript") | Some("ts") | Some("node") => Ok(Language::JavaScript),
            Some(other) => Err(InterpreterError::Invalid(format!("unsupported language {other:?}: use python or javascript"))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

struct Context {
    info: ContextInfo,
    language: Language,
    env: BTreeMap<String, String>,
    /// Held for the whole of a cell: one cell at a time per context.
    kernel: Arc<tokio::sync::Mutex<Option<Kernel>>>,
    /// The running kernel's pid (0: none), readable without waiting for a cell to end.
    pid: AtomicU32,
    /// A pickled namespace (from a snapshot) the next kernel loads before its first cell.
    restore: Mutex<Option<String>>,
}

struct Kernel {
    pid: u32,
    lines: mpsc::Receiver<Value>,
    executions: u64,
}

/// What a cell asks for.
pub struct Cell {
    pub code: String,
    pub context_id: Option<String>,
    pub language: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Interrupt the cell after this long.
    pub timeout: Option<Duration>,
}

pub struct Interpreters {
    manager: Arc<Manager>,
    sandboxes: Mutex<HashMap<String, BTreeMap<String, Arc<Context>>>>,
    next_cell: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn default_id(language: Language) -> String {
    format!("default-{}", language.name())
}

impl Interpreters {
    /// Must be called inside a tokio runtime: it starts the pruning task.
    pub fn new(manager: Arc<Manager>) -> Arc<Interpreters> {
        let interpreters = Arc::new(Interpreters { manager, sandboxes: Mutex::new(HashMap::new()), next_cell: AtomicU64::new(1) });
        let weak = Arc::downgrade(&interpreters);
        tokio::spawn(prune(weak));
        interpreters
    }

    /// Forgets the contexts of a sandbox that ended (its kernels died with it).
    pub fn forget(&self, sandbox_id: &str) {
        lock(&self.sandboxes).remove(sandbox_id);
    }

    /// The contexts of a running sandbox, with the default ones every sandbox has.
    fn with_contexts<T>(&self, sandbox_id: &str, f: impl FnOnce(&mut BTreeMap<String, Arc<Context>>) -> T) -> T {
        let mut sandboxes = lock(&self.sandboxes);
        let contexts = sandboxes.entry(sandbox_id.to_owned()).or_insert_with(|| {
            [Language::Python, Language::JavaScript]
                .into_iter()
                .map(|language| {
                    let id = default_id(language);
                    (id.clone(), Arc::new(Context::new(id, language, DEFAULT_CWD.into(), BTreeMap::new())))
                })
                .collect()
        });
        f(contexts)
    }

    async fn mux(&self, sandbox_id: &str) -> Result<Mux, InterpreterError> {
        self.manager.agent(sandbox_id).await.map_err(|err| {
            self.forget(sandbox_id);
            InterpreterError::Sandbox(err)
        })
    }

    pub async fn create_context(
        &self,
        sandbox_id: &str,
        language: Option<&str>,
        cwd: Option<String>,
        env: BTreeMap<String, String>,
    ) -> Result<ContextInfo, InterpreterError> {
        let language = Language::parse(language)?;
        corral_spec::validate_env(&env).map_err(|e| InterpreterError::Invalid(e.to_string()))?;
        let cwd = cwd.filter(|c| !c.is_empty()).unwrap_or_else(|| DEFAULT_CWD.into());
        if cwd.contains('\0') {
            return Err(InterpreterError::Invalid("cwd contains a NUL byte".into()));
        }
        self.mux(sandbox_id).await?;
        let id = crate::auth::generate_key().split_off(4).chars().take(24).collect::<String>();
        let context = Arc::new(Context::new(id, language, cwd, env));
        self.with_contexts(sandbox_id, |contexts| {
            if contexts.len() >= MAX_CONTEXTS {
                return Err(InterpreterError::Invalid(format!("at most {MAX_CONTEXTS} contexts per sandbox")));
            }
            contexts.insert(context.info.id.clone(), context.clone());
            Ok(context.info.clone())
        })
    }

    pub async fn list_contexts(&self, sandbox_id: &str) -> Result<Vec<ContextInfo>, InterpreterError> {
        self.mux(sandbox_id).await?;
        Ok(self.with_contexts(sandbox_id, |contexts| contexts.values().map(|c| c.info.clone()).collect()))
    }

    fn context(&self, sandbox_id: &str, id: &str) -> Result<Arc<Context>, InterpreterError> {
        self.with_contexts(sandbox_id, |contexts| contexts.get(id).cloned()).ok_or_else(|| InterpreterError::ContextNotFound(id.to_owned()))
    }

    /// Kills the context's kernel; its next cell starts with fresh state.
    pub async fn restart_context(&self, sandbox_id: &str, id: &str) -> Result<(), InterpreterError> {
        let mux = self.mux(sandbox_id).await?;
        let context = self.context(sandbox_id, id)?;
        context.stop(&mux).await;
        Ok(())
    }

    pub async fn remove_context(&self, sandbox_id: &str, id: &str) -> Result<(), InterpreterError> {
        let mux = self.mux(sandbox_id).await?;
        let context = self.with_contexts(sandbox_id, |contexts| contexts.remove(id)).ok_or_else(|| InterpreterError::ContextNotFound(id.to_owned()))?;
        context.stop(&mux).await;
        Ok(())
    }

    /// Runs a cell; its events (E2B's `/execute` lines) stream as they happen and end with
    /// `end_of_execution`. Dropping the stream interrupts the cell.
    pub async fn execute(&self, sandbox_id: &str, cell: Cell) -> Result<impl Stream<Item = Value> + Send + 'static, InterpreterError> {
        if cell.context_id.is_some() && cell.language.is_some() {
            return Err(InterpreterError::Invalid("give a context or a language, not both".into()));
        }
        corral_spec::validate_env(&cell.env).map_err(|e| InterpreterError::Invalid(e.to_string()))?;
        let mux = self.mux(sandbox_id).await?;
        let context = match &cell.context_id {
            Some(id) => self.context(sandbox_id, id)?,
            None => self.context(sandbox_id, &default_id(Language::parse(cell.language.as_deref())?))?,
        };
        let cell_id = self.next_cell.fetch_add(1, Ordering::Relaxed).to_string();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(run_cell(mux, context, cell, cell_id, tx));
        // A silent cell still writes a line now and then: only a failed write tells the
        // server that a client went away, and that is what interrupts an abandoned cell.
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            match tokio::time::timeout(HEARTBEAT, rx.recv()).await {
                Ok(event) => event.map(|event| (event, rx)),
                Err(_) => Some((json!({ "type": "keepalive" }), rx)),
            }
        }))
    }
}

/// Drops the contexts of sandboxes that are gone, so the registry does not grow forever.
async fn prune(interpreters: Weak<Interpreters>) {
    loop {
        tokio::time::sleep(PRUNE_INTERVAL).await;
        let Some(interpreters) = interpreters.upgrade() else { return };
        let ids: Vec<String> = lock(&interpreters.sandboxes).keys().cloned().collect();
        for id in ids {
            let running = interpreters.manager.get(&id).await.is_ok_and(|info| info.state == "running");
            if !running {
                interpreters.forget(&id);
            }
        }
    }
}

impl Context {
    fn new(id: String, language: Language, cwd: String, env: BTreeMap<String, String>) -> Context {
        Context {
            info: ContextInfo { id, language: language.name().into(), cwd },
            language,
            env,
            kernel: Arc::new(tokio::sync::Mutex::new(None)),
            pid: AtomicU32::new(0),
            restore: Mutex::new(None),
        }
    }

    /// Kills the kernel (a running cell ends with an error) and waits until it is gone.
    async fn stop(&self, mux: &Mux) {
        let pid = self.pid.swap(0, Ordering::SeqCst);
        if pid != 0 {
            let _ = agent_client::request(mux, &Request::Signal { pid, signal: 9 }).await;
        }
        self.kernel.lock().await.take();
    }

    async fn start_kernel(&self, mux: &Mux) -> Result<Kernel, ApiError> {
        let argv = match self.language {
            Language::Python => vec!["python3".to_owned(), "-u".into(), "-c".into(), PYTHON_KERNEL.into()],
            Language::JavaScript => vec!["node".to_owned(), "-e".into(), JAVASCRIPT_KERNEL.into()],
        };
        let mut env = self.env.clone();
        env.entry("MPLBACKEND".into()).or_insert_with(|| "Agg".into());
        env.entry("PYTHONUNBUFFERED".into()).or_insert_with(|| "1".into());
        let spec = ExecSpec {
            argv,
            env,
            cwd: Some(self.info.cwd.clone()),
            background: true,
            tag: Some(format!("{KERNEL_TAG_PREFIX}:{}", self.info.id)),
            ..Default::default()
        };
        let running = agent_client::exec(mux, spec, Stdin::Open).await?;
        let pid = running.pid;
        let (tx, lines) = mpsc::channel(256);
        tokio::spawn(read_lines(running.into_events(false), tx));
        self.pid.store(pid, Ordering::SeqCst);
        Ok(Kernel { pid, lines, executions: 0 })
    }
}

/// Splits the kernel's stdout into JSON messages until it exits.
async fn read_lines(events: impl Stream<Item = OutputEvent> + Send + 'static, tx: mpsc::Sender<Value>) {
    let mut events = Box::pin(events);
    let mut buf: Vec<u8> = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            OutputEvent::Stdout(chunk) => {
                buf.extend_from_slice(&chunk.bytes());
                while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=end).collect();
                    match serde_json::from_slice::<Value>(&line) {
                        Ok(message) => {
                            if tx.send(message).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::debug!(%e, "ignoring a kernel line that is not JSON"),
                    }
                }
                if buf.len() > MAX_LINE {
                    buf.clear();
                }
            }
            OutputEvent::Stderr(chunk) => {
                let text = String::from_utf8_lossy(&chunk.bytes()).chars().take(2000).collect::<String>();
                tracing::debug!(kernel_stderr = %text);
            }
            OutputEvent::Exit { .. } | OutputEvent::Error { .. } => return,
            OutputEvent::Start { .. } => {}
        }
    }
}

fn error_event(name: &str, value: &str) -> Value {
    json!({ "type": "error", "name": name, "value": value, "traceback": format!("{name}: {value}") })
}

/// A kernel message as an E2B `/execute` line: without our cell id, with a timestamp on output.
fn to_event(mut message: Value) -> Value {
    if let Some(map) = message.as_object_mut() {
        map.remove("id");
        if matches!(map.get("type").and_then(Value::as_str), Some("stdout") | Some("stderr")) {
            // The SDKs type it as an integer: Unix epoch in nanoseconds.
            map.insert("timestamp".into(), json!(crate::time::now_ms().saturating_mul(1_000_000)));
        }
    }
    message
}

async fn run_cell(mux: Mux, context: Arc<Context>, cell: Cell, cell_id: String, tx: mpsc::Sender<Value>) {
    let mut guard = context.kernel.clone().lock_owned().await;
    if guard.is_none() {
        match context.start_kernel(&mux).await {
            Ok(mut kernel) => {
                let pending = lock(&context.restore).take();
                if let Some(path) = pending {
                    state::load(&mux, &mut kernel, &path, &tx).await;
                }
                *guard = Some(kernel)
            }
            Err(err) => {
                let _ = tx.send(error_event("KernelStartError", &format!("could not start the {} kernel: {}", context.info.language, err.message))).await;
                let _ = tx.send(json!({ "type": "end_of_execution" })).await;
                return;
            }
        }
    }
    let Some(kernel) = guard.as_mut() else { return };
    kernel.executions += 1;
    let _ = tx.send(json!({ "type": "number_of_executions", "execution_count": kernel.executions })).await;
    let line = format!("{}\n", json!({ "id": cell_id, "code": cell.code, "env": cell.env }));
    let outcome = match agent_client::request(&mux, &Request::SendStdin { pid: kernel.pid, data: line }).await {
        Ok(_) => follow(&mux, kernel, &cell_id, cell.timeout, &tx).await,
        Err(err) => Outcome::Died(format!("could not reach the kernel: {}", err.message)),
    };
    if let Outcome::Died(why) = outcome {
        context.pid.store(0, Ordering::SeqCst);
        if let Some(kernel) = guard.take() {
            let _ = agent_client::request(&mux, &Request::Signal { pid: kernel.pid, signal: 9 }).await;
        }
        let _ = tx.send(error_event("KernelDied", &format!("{why}; the context's state is lost"))).await;
    }
    let _ = tx.send(json!({ "type": "end_of_execution" })).await;
}

enum Outcome {
    Finished,
    Died(String),
}

/// Forwards the cell's messages until its `end`, interrupting it if the client goes away
/// or its time is up, and giving up on the kernel if an interrupt does not stop it.
async fn follow(mux: &Mux, kernel: &mut Kernel, cell_id: &str, timeout: Option<Duration>, tx: &mpsc::Sender<Value>) -> Outcome {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut interrupted_at: Option<Instant> = None;
    loop {
        let wake = match interrupted_at {
            Some(at) => Some(at + INTERRUPT_GRACE),
            None => deadline,
        };
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            line = kernel.lines.recv() => match line {
                None => return Outcome::Died("the kernel exited".into()),
                Some(message) if message.get("id").and_then(Value::as_str) == Some(cell_id) => {
                    if message.get("type").and_then(Value::as_str) == Some("end") {
                        return Outcome::Finished;
                    }
                    // A client that left still gets nothing; keep draining to the end.
                    let _ = tx.send(to_event(message)).await;
                }
                // Late output of an earlier cell, or of a thread between cells.
                Some(_) => {}
            },
            () = tx.closed(), if interrupted_at.is_none() => {
                interrupt(mux, kernel.pid).await;
                interrupted_at = Some(Instant::now());
            }
            () = sleep => {
                if interrupted_at.is_some() {
                    return Outcome::Died("the kernel did not stop after an interrupt".into());
                }
                interrupt(mux, kernel.pid).await;
                interrupted_at = Some(Instant::now());
            }
        }
    }
}

async fn interrupt(mux: &Mux, pid: u32) {
    if let Err(err) = agent_client::request(mux, &Request::Signal { pid, signal: 2 }).await {
        tracing::debug!(pid, %err, "interrupting a kernel failed");
    }
}
