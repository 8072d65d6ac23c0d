//! An agent served over an in-memory pipe, and a host-side client for it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_agent::{serve_connection, AgentConfig, AgentState, UserEntry};
use corral_proto::{Event, ExecSpec, Incoming, Message, Mux, Request, Role, Stream, CHANNEL_STDERR, CHANNEL_STDOUT};

pub struct Harness {
    pub mux: Mux,
    pub state: Arc<AgentState>,
    pub home: tempfile::TempDir,
    _incoming: Incoming,
}

/// Must be called inside a tokio runtime. "user" is uid 1000 with a temp home it owns.
pub fn harness() -> Harness {
    let home = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(home.path(), Some(1000), Some(1000)).expect("chown home");
    let config = AgentConfig {
        env: BTreeMap::new(),
        users: vec![UserEntry::new("root", 0, 0, "/root"), UserEntry::new("user", 1000, 1000, home.path())],
        default_user: "user".into(),
    };
    let state = AgentState::new(config);
    let (host_io, agent_io) = tokio::io::duplex(256 * 1024);
    tokio::spawn(serve_connection(state.clone(), agent_io));
    let (mux, incoming) = Mux::new(host_io, Role::Host);
    Harness { mux, state, home, _incoming: incoming }
}

impl Harness {
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    pub fn open(&self, request: Request) -> Stream {
        self.mux.open(&request).expect("open stream")
    }

    /// Every event until the agent ends the stream (data is not expected).
    pub async fn request(&self, request: Request) -> Vec<Event> {
        collect(self.open(request)).await.events
    }

    /// The single answer to a one-shot request.
    pub async fn answer(&self, request: Request) -> Event {
        let mut events = self.request(request).await;
        assert_eq!(events.len(), 1, "expected one answer, got {events:?}");
        events.remove(0)
    }

    pub async fn exec(&self, spec: ExecSpec) -> Outcome {
        collect(self.open(Request::Exec(spec))).await
    }
}

pub fn shell(command: &str) -> ExecSpec {
    ExecSpec { shell: Some(command.into()), ..Default::default() }
}

pub fn argv(args: &[&str]) -> ExecSpec {
    ExecSpec { argv: args.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub events: Vec<Event>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Arrival time of each stdout chunk, and of the `Exited` event.
    pub stdout_at: Vec<Instant>,
    pub exited_at: Option<Instant>,
}

impl Outcome {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    pub fn pid(&self) -> u32 {
        match self.events.first() {
            Some(Event::Started { pid }) => *pid,
            other => panic!("expected Started first, got {other:?} (all: {:?})", self.events),
        }
    }

    /// (code, signal, reason) of the final `Exited`.
    pub fn exit(&self) -> (Option<i32>, Option<i32>, Option<String>) {
        match self.events.last() {
            Some(Event::Exited { code, signal, reason }) => (*code, *signal, reason.clone()),
            other => panic!("expected Exited last, got {other:?} (all: {:?})", self.events),
        }
    }
}

/// Reads a stream to its end, with a generous deadline so a hang fails instead of stalling.
pub async fn collect(mut stream: Stream) -> Outcome {
    tokio::time::timeout(Duration::from_secs(30), collect_from(&mut stream)).await.expect("stream did not end in time")
}

pub async fn collect_from(stream: &mut Stream) -> Outcome {
    let mut out = Outcome::default();
    while let Some(message) = stream.recv().await {
        match message.expect("stream error") {
            Message::Event(event) => {
                if matches!(event, Event::Exited { .. }) {
                    out.exited_at = Some(Instant::now());
                }
                out.events.push(event);
            }
            Message::Data { channel: CHANNEL_STDOUT, bytes } => {
                out.stdout_at.push(Instant::now());
                out.stdout.extend_from_slice(&bytes);
            }
            Message::Data { channel: CHANNEL_STDERR, bytes } => out.stderr.extend_from_slice(&bytes),
            Message::Data { channel, .. } => panic!("data on unexpected channel {channel}"),
        }
    }
    out
}

/// The next event on a stream, skipping nothing.
pub async fn next_event(stream: &mut Stream) -> Event {
    let next = tokio::time::timeout(Duration::from_secs(10), stream.recv()).await.expect("no event in time");
    match next {
        Some(Ok(Message::Event(event))) => event,
        other => panic!("expected an event, got {other:?}"),
    }
}

/// Whether `pid` is a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Polls `check` for up to `within`.
pub async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

pub fn path_string(path: impl Into<PathBuf>) -> String {
    path.into().to_string_lossy().into_owned()
}
