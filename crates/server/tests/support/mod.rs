//! A fake backend for HTTP-level tests: each "sandbox" is an in-process fake agent that
//! speaks the real protocol (corral_proto::Mux, Role::Agent) on `run_dir/agent.sock`.
//!
//! Fake commands: `echo ARGS..`, `cat` (echoes stdin), `fail` (stderr "boom", exit 3),
//! `binary` (non-UTF-8 stdout), `sleep` (until killed or its timeout). A `cmd` shell string
//! is echoed back. Files live in an in-memory map; paths under `/readonly` are refused and
//! under `/full` report no space.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use corral_jail::{AgentAddress, AgentBoot, Backend, JailConfig, JailError, ResourceUsage, Sandbox};
use corral_proto::{
    ErrorKind, Event, ExecSpec, FileEntry, FileKind, Message, Mux, ProcessInfo, Request, Role, Stream, CHANNEL_FILE,
    CHANNEL_STDERR, CHANNEL_STDIN, CHANNEL_STDOUT,
};
use tokio::sync::{mpsc, watch};

#[derive(Default)]
pub struct FakeStats {
    /// Sandboxes started and not yet destroyed.
    pub live: AtomicUsize,
    pub started: AtomicUsize,
    /// `host_id_base` of every start, in order.
    pub bases: Mutex<Vec<u32>>,
    /// Foreground processes killed because the host dropped their stream.
    pub killed_by_hangup: AtomicUsize,
    /// Boot env of the last start.
    pub last_env: Mutex<BTreeMap<String, String>>,
    sandboxes: Mutex<HashMap<String, Arc<Flags>>>,
}

impl FakeStats {
    /// Makes a sandbox's init "die" on its own.
    pub fn kill_init(&self, id: &str) {
        if let Some(flags) = self.sandboxes.lock().expect("lock").get(id) {
            flags.init_alive.store(false, Ordering::SeqCst);
            let _ = flags.cancel.send(true);
        }
    }
}

struct Flags {
    init_alive: AtomicBool,
    destroyed: AtomicBool,
    cancel: watch::Sender<bool>,
}

pub struct FakeBackend {
    runtime: tokio::runtime::Handle,
    pub stats: Arc<FakeStats>,
}

impl FakeBackend {
    pub fn new() -> Self {
        FakeBackend { runtime: tokio::runtime::Handle::current(), stats: Arc::new(FakeStats::default()) }
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    /// Fake sandboxes live in this process and die with it: nothing survives to recover.
    fn recover(&self, config: &JailConfig, _host_pid: Option<u32>) -> Result<Box<dyn Sandbox>, JailError> {
        Err(JailError::Gone(config.id.clone()))
    }

    fn cleanup(&self, _config: &JailConfig) -> Result<(), JailError> {
        Ok(())
    }

    fn start(&self, config: &JailConfig, boot: &AgentBoot) -> Result<Box<dyn Sandbox>, JailError> {
        if config.template == "missing" {
            return Err(JailError::UnknownTemplate(config.template.clone()));
        }
        let path = config.run_dir.join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).map_err(|e| JailError::os("bind", e))?;
        listener.set_nonblocking(true).map_err(|e| JailError::os("nonblocking", e))?;
        let (cancel, cancelled) = watch::channel(false);
        let flags = Arc::new(Flags { init_alive: AtomicBool::new(true), destroyed: AtomicBool::new(false), cancel });
        self.runtime.spawn(serve_agent(listener, cancelled, self.stats.clone()));
        self.stats.live.fetch_add(1, Ordering::SeqCst);
        self.stats.started.fetch_add(1, Ordering::SeqCst);
        self.stats.bases.lock().expect("lock").push(config.host_id_base);
        *self.stats.last_env.lock().expect("lock") = boot.env.clone();
        self.stats.sandboxes.lock().expect("lock").insert(config.id.clone(), flags.clone());
        Ok(Box::new(FakeSandbox { id: config.id.clone(), path, flags, stats: self.stats.clone() }))
    }
}

struct FakeSandbox {
    id: String,
    path: PathBuf,
    flags: Arc<Flags>,
    stats: Arc<FakeStats>,
}

impl Sandbox for FakeSandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn agent_address(&self) -> AgentAddress {
        AgentAddress::Unix { path: self.path.clone() }
    }
    fn host_pid(&self) -> Option<u32> {
        Some(4242)
    }
    fn usage(&self) -> Result<ResourceUsage, JailError> {
        Ok(ResourceUsage { memory_bytes: 1024, pids: 1, ..Default::default() })
    }
    fn is_running(&self) -> bool {
        self.flags.init_alive.load(Ordering::SeqCst) && !self.flags.destroyed.load(Ordering::SeqCst)
    }
    fn destroy(&self) -> Result<(), JailError> {
        if !self.flags.destroyed.swap(true, Ordering::SeqCst) {
            let _ = self.flags.cancel.send(true);
            let _ = std::fs::remove_file(&self.path);
            self.stats.live.fetch_sub(1, Ordering::SeqCst);
            self.stats.sandboxes.lock().expect("lock").remove(&self.id);
        }
        Ok(())
    }
}

type StdinFeed = mpsc::UnboundedSender<Option<String>>;

struct AgentState {
    stats: Arc<FakeStats>,
    files: Mutex<BTreeMap<String, Vec<u8>>>,
    next_pid: AtomicU32,
    /// Stdin feeds of running processes: `Some(data)` or `None` to close.
    stdin: Mutex<HashMap<u32, (Vec<String>, StdinFeed)>>,
}

async fn serve_agent(listener: std::os::unix::net::UnixListener, mut cancelled: watch::Receiver<bool>, stats: Arc<FakeStats>) {
    let Ok(listener) = tokio::net::UnixListener::from_std(listener) else { return };
    let state = Arc::new(AgentState {
        stats,
        files: Mutex::default(),
        next_pid: AtomicU32::new(100),
        stdin: Mutex::default(),
    });
    let per_connection = cancelled.clone();
    loop {
        tokio::select! {
            _ = cancelled.wait_for(|c| *c) => return,
            accepted = listener.accept() => {
                let Ok((socket, _)) = accepted else { return };
                tokio::spawn(serve_connection(socket, state.clone(), per_connection.clone()));
            }
        }
    }
}

/// The mux cannot be closed from outside, so it runs over a pipe that we cut on cancel:
/// both the host and the fake agent then see the connection end, as when a sandbox dies.
async fn serve_connection(mut socket: tokio::net::UnixStream, state: Arc<AgentState>, mut cancelled: watch::Receiver<bool>) {
    let (mut near, far) = tokio::io::duplex(256 * 1024);
    let (_mux, mut incoming) = Mux::new(far, Role::Agent);
    let accept = async {
        while let Some((request, stream)) = incoming.accept().await {
            tokio::spawn(handle(request, stream, state.clone()));
        }
    };
    tokio::select! {
        _ = cancelled.wait_for(|c| *c) => {}
        _ = tokio::io::copy_bidirectional(&mut socket, &mut near) => {}
        _ = accept => {}
    }
}

fn entry(path: &str, kind: FileKind, size: u64) -> FileEntry {
    FileEntry {
        path: path.to_string(),
        name: path.rsplit('/').next().unwrap_or("").to_string(),
        kind,
        size,
        mode: 0o644,
        uid: 1000,
        gid: 1000,
        modified: 0,
        symlink_target: None,
    }
}

async fn answer(mut stream: Stream, event: Event) {
    let _ = stream.send_event(&event).await;
    let _ = stream.sender.end();
}

async fn handle(request: Request, mut stream: Stream, state: Arc<AgentState>) {
    match request {
        Request::Ping => answer(stream, Event::Pong { version: "fake".into() }).await,
        Request::Exec(spec) => exec(spec, stream, state).await,
        Request::ProcessList => {
            let processes = state
                .stdin
                .lock()
                .expect("lock")
                .iter()
                .map(|(pid, (argv, _))| ProcessInfo { pid: *pid, argv: argv.clone(), cwd: None, tag: None, pty: false, env: BTreeMap::new() })
                .collect();
            answer(stream, Event::Processes { processes }).await
        }
        Request::Signal { .. } => answer(stream, Event::Ok).await,
        Request::SendStdin { pid, data } => {
            let sent = state.stdin.lock().expect("lock").get(&pid).map(|(_, tx)| tx.send(Some(data)).is_ok());
            answer(stream, if sent == Some(true) { Event::Ok } else { Event::error(ErrorKind::NotFound, "no such process") }).await
        }
        Request::CloseStdin { pid } => {
            let sent = state.stdin.lock().expect("lock").get(&pid).map(|(_, tx)| tx.send(None).is_ok());
            answer(stream, if sent == Some(true) { Event::Ok } else { Event::error(ErrorKind::NotFound, "no such process") }).await
        }
        Request::ReadFile { path, .. } => {
            let data = state.files.lock().expect("lock").get(&path).cloned();
            let Some(data) = data else {
                return answer(stream, Event::error(ErrorKind::NotFound, format!("{path}: no such file"))).await;
            };
            let _ = stream.send_event(&Event::Entry(entry(&path, FileKind::File, data.len() as u64))).await;
            for chunk in data.chunks(100_000) {
                if stream.sender.send_data(CHANNEL_FILE, chunk).await.is_err() {
                    return;
                }
            }
            let _ = stream.sender.end();
        }
        Request::WriteFile { path, append, .. } => {
            if path.starts_with("/readonly") {
                return answer(stream, Event::error(ErrorKind::PermissionDenied, format!("{path}: permission denied"))).await;
            }
            let mut data = Vec::new();
            while let Some(message) = stream.recv().await {
                match message {
                    Ok(Message::Data { bytes, .. }) => data.extend_from_slice(&bytes),
                    Ok(Message::Event(_)) => {}
                    Err(_) => return,
                }
            }
            if path.starts_with("/full") {
                return answer(stream, Event::error(ErrorKind::NoSpace, "no space left on device")).await;
            }
            let size = {
                let mut files = state.files.lock().expect("lock");
                let file = files.entry(path.clone()).or_default();
                if !append {
                    file.clear();
                }
                file.extend_from_slice(&data);
                file.len() as u64
            };
            answer(stream, Event::Entry(entry(&path, FileKind::File, size))).await
        }
        Request::Stat { path, .. } => {
            let size = state.files.lock().expect("lock").get(&path).map(|d| d.len() as u64);
            match size {
                Some(size) => answer(stream, Event::Entry(entry(&path, FileKind::File, size))).await,
                None => answer(stream, Event::error(ErrorKind::NotFound, format!("{path}: not found"))).await,
            }
        }
        Request::ListDir { path, .. } => {
            let prefix = format!("{}/", path.trim_end_matches('/'));
            let entries = state
                .files
                .lock()
                .expect("lock")
                .iter()
                .filter(|(p, _)| p.starts_with(&prefix))
                .map(|(p, d)| entry(p, FileKind::File, d.len() as u64))
                .collect();
            answer(stream, Event::Entries { entries }).await
        }
        Request::MakeDir { path, .. } => answer(stream, Event::Entry(entry(&path, FileKind::Dir, 0))).await,
        Request::Remove { path, .. } => {
            let removed = state.files.lock().expect("lock").remove(&path).is_some();
            answer(stream, if removed { Event::Ok } else { Event::error(ErrorKind::NotFound, "not found") }).await
        }
        Request::Rename { from, to, .. } => {
            let moved = {
                let mut files = state.files.lock().expect("lock");
                files.remove(&from).map(|data| files.insert(to, data)).is_some()
            };
            answer(stream, if moved { Event::Ok } else { Event::error(ErrorKind::NotFound, "not found") }).await
        }
        other => answer(stream, Event::error(ErrorKind::Unsupported, format!("fake agent: {other:?}"))).await,
    }
}

async fn exec(spec: ExecSpec, mut stream: Stream, state: Arc<AgentState>) {
    let pid = state.next_pid.fetch_add(1, Ordering::SeqCst);
    let argv = match &spec.shell {
        Some(cmd) => vec!["echo".to_string(), cmd.clone()],
        None => spec.argv.clone(),
    };
    let program = argv.first().cloned().unwrap_or_default();
    if program == "missing" {
        return answer(stream, Event::error(ErrorKind::NotFound, "missing: command not found")).await;
    }
    let (stdin_tx, mut stdin_rx) = mpsc::unbounded_channel();
    state.stdin.lock().expect("lock").insert(pid, (argv.clone(), stdin_tx));
    let _ = stream.send_event(&Event::Started { pid }).await;
    let (mut tx, mut rx) = stream.split();
    let exited = |code: Option<i32>, signal: Option<i32>, reason: Option<&str>| Event::Exited { code, signal, reason: reason.map(String::from) };
    let result = match program.as_str() {
        "echo" => {
            let line = format!("{}\n", argv[1..].join(" "));
            let _ = tx.send_data(CHANNEL_STDOUT, line.as_bytes()).await;
            exited(Some(0), None, None)
        }
        "fail" => {
            let _ = tx.send_data(CHANNEL_STDERR, b"boom\n").await;
            exited(Some(3), None, None)
        }
        "binary" => {
            let _ = tx.send_data(CHANNEL_STDOUT, &[0xff, 0xfe, b'a']).await;
            exited(Some(0), None, None)
        }
        "cat" if spec.stdin => {
            // Stdin arrives on the exec stream or through SendStdin; either source may end it.
            loop {
                tokio::select! {
                    message = rx.recv() => match message {
                        Some(Ok(Message::Data { channel: CHANNEL_STDIN, bytes })) => { let _ = tx.send_data(CHANNEL_STDOUT, &bytes).await; }
                        Some(Ok(_)) => {}
                        None | Some(Err(_)) => break,
                    },
                    fed = stdin_rx.recv() => match fed {
                        Some(Some(data)) => { let _ = tx.send_data(CHANNEL_STDOUT, data.as_bytes()).await; }
                        _ => break,
                    },
                }
            }
            exited(Some(0), None, None)
        }
        "sleep" => {
            let limit = spec.timeout_ms.map(std::time::Duration::from_millis).unwrap_or(std::time::Duration::from_secs(3600));
            // Prints a dot now and then; a failing write means the host reset the stream
            // (it hung up), which kills a foreground process. Background ones keep running.
            let hangup = async {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    if tx.send_data(CHANNEL_STDOUT, b".").await.is_err() && !spec.background {
                        return;
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(limit) => exited(None, Some(9), Some("timeout")),
                _ = hangup => {
                    state.stats.killed_by_hangup.fetch_add(1, Ordering::SeqCst);
                    state.stdin.lock().expect("lock").remove(&pid);
                    return;
                }
            }
        }
        _ => exited(Some(0), None, None),
    };
    state.stdin.lock().expect("lock").remove(&pid);
    let _ = tx.send_event(&result).await;
    let _ = tx.end();
}
