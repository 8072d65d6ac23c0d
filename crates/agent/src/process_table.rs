//! Running processes started via `Exec`, and fan-out of their output to attached streams.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use corral_proto::{Event, ProcessInfo, PtySize};
use rustix::process::Signal;
use rustix::termios::Winsize;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use crate::error::AgentError;
use crate::reaper::{ExitStatus, Reaper};

/// Chunks queued per attached stream before the process's output waits for it.
const SUBSCRIBER_QUEUE: usize = 8;
/// What "closing stdin" means for a terminal: end-of-file at the line discipline (Ctrl-D).
const PTY_EOF: &[u8] = &[0x04];

/// What an attached stream receives: output in order, then exactly one `Exited`.
#[derive(Debug, Clone)]
pub enum Output {
    Data { channel: u8, bytes: Bytes },
    Exited(Exit),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub status: Option<ExitStatus>,
    pub reason: Option<String>,
}

impl Exit {
    pub fn event(&self) -> Event {
        let (code, signal) = match self.status {
            Some(ExitStatus::Code(code)) => (Some(code), None),
            Some(ExitStatus::Signal(signal)) => (None, Some(signal)),
            None => (None, None),
        };
        Event::Exited { code, signal, reason: self.reason.clone() }
    }
}

/// The agent's end of a process's stdin.
pub struct Stdin {
    pub writer: pipe::Sender,
    pub pty: bool,
}

pub struct Process {
    pub pid: u32,
    pub info: ProcessInfo,
    pub background: bool,
    stdin: tokio::sync::Mutex<Option<Stdin>>,
    /// Kept for resizing; the same terminal the output pump reads from.
    pty_master: Option<OwnedFd>,
    timed_out: AtomicBool,
    subscribers: Mutex<Subscribers>,
}

#[derive(Default)]
struct Subscribers {
    senders: Vec<mpsc::Sender<Output>>,
    /// Set once the process is gone, so late subscribers get `Exited` instead of silence.
    exit: Option<Exit>,
}

impl Process {
    pub fn new(pid: u32, info: ProcessInfo, background: bool, stdin: Option<Stdin>, pty_master: Option<OwnedFd>) -> Self {
        Process {
            pid,
            info,
            background,
            stdin: tokio::sync::Mutex::new(stdin),
            pty_master,
            timed_out: AtomicBool::new(false),
            subscribers: Mutex::new(Subscribers::default()),
        }
    }

    fn subscribers(&self) -> MutexGuard<'_, Subscribers> {
        self.subscribers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Receives output from now on, then `Exited`.
    pub fn subscribe(&self) -> mpsc::Receiver<Output> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        let mut subscribers = self.subscribers();
        match &subscribers.exit {
            Some(exit) => {
                let _ = tx.try_send(Output::Exited(exit.clone()));
            }
            None => subscribers.senders.push(tx),
        }
        rx
    }

    /// Hands a chunk to every subscriber, waiting for slow ones (that is the backpressure
    /// that keeps a fast producer from outrunning its reader). Without subscribers the chunk
    /// is dropped, so an unattended process never blocks on a full pipe.
    pub async fn publish(&self, channel: u8, bytes: Bytes) {
        let senders = self.subscribers().senders.clone();
        let mut gone = Vec::new();
        for sender in senders {
            if sender.send(Output::Data { channel, bytes: bytes.clone() }).await.is_err() {
                gone.push(sender);
            }
        }
        if !gone.is_empty() {
            self.subscribers().senders.retain(|s| !gone.iter().any(|g| g.same_channel(s)));
        }
    }

    /// Sends `Exited` to every subscriber and closes their channels.
    pub async fn finish(&self, status: Option<ExitStatus>) {
        let reason = self.timed_out.load(Ordering::SeqCst).then(|| "timeout".to_owned());
        let exit = Exit { status, reason };
        let senders = {
            let mut subscribers = self.subscribers();
            subscribers.exit = Some(exit.clone());
            std::mem::take(&mut subscribers.senders)
        };
        for sender in senders {
            let _ = sender.send(Output::Exited(exit.clone())).await;
        }
    }

    pub fn mark_timed_out(&self) {
        self.timed_out.store(true, Ordering::SeqCst);
    }

    pub fn clear_timed_out(&self) {
        self.timed_out.store(false, Ordering::SeqCst);
    }

    /// Sends `signal` to the process's whole group (its job), as a terminal would.
    pub fn signal(&self, signal: i32) -> Result<(), AgentError> {
        let signal = Signal::from_named_raw(signal).ok_or_else(|| AgentError::invalid(format!("unsupported signal {signal}")))?;
        Reaper::global().signal_group(self.pid, signal).map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => AgentError::not_found(format!("no such process: {}", self.pid)),
            _ => AgentError::io(format!("signal process {}", self.pid), &err),
        })
    }

    /// SIGKILLs the process group; a no-op if it is already gone.
    pub fn kill(&self) {
        let _ = Reaper::global().signal_group(self.pid, Signal::KILL);
    }

    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), AgentError> {
        let mut stdin = self.stdin.lock().await;
        let Some(stdin) = stdin.as_mut() else {
            return Err(AgentError::invalid(format!("stdin of process {} is not open", self.pid)));
        };
        stdin.writer.write_all(data).await.map_err(|err| AgentError::io(format!("stdin of process {}", self.pid), &err))
    }

    pub async fn close_stdin(&self) -> Result<(), AgentError> {
        let mut stdin = self.stdin.lock().await;
        match stdin.as_mut() {
            // The master stays open for output, so EOF has to be typed rather than closed.
            Some(Stdin { writer, pty: true }) => {
                writer.write_all(PTY_EOF).await.map_err(|err| AgentError::io(format!("stdin of process {}", self.pid), &err))
            }
            Some(Stdin { pty: false, .. }) => {
                stdin.take();
                Ok(())
            }
            None => Ok(()),
        }
    }

    pub fn resize(&self, size: PtySize) -> Result<(), AgentError> {
        let Some(master) = &self.pty_master else {
            return Err(AgentError::invalid(format!("process {} has no pty", self.pid)));
        };
        let winsize = Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
        rustix::termios::tcsetwinsize(master, winsize).map_err(|err| AgentError::io(format!("pty of process {}", self.pid), &err.into()))
    }
}

/// Processes that are still running. Outlives connections: a reconnecting daemon finds them.
#[derive(Default)]
pub struct ProcessTable {
    procs: Mutex<HashMap<u32, Arc<Process>>>,
}

impl ProcessTable {
    fn procs(&self) -> MutexGuard<'_, HashMap<u32, Arc<Process>>> {
        self.procs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn insert(&self, process: Arc<Process>) {
        self.procs().insert(process.pid, process);
    }

    pub fn remove(&self, pid: u32) {
        self.procs().remove(&pid);
    }

    pub fn get(&self, pid: u32) -> Result<Arc<Process>, AgentError> {
        self.procs().get(&pid).cloned().ok_or_else(|| AgentError::not_found(format!("no such process: {pid}")))
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        let mut list: Vec<ProcessInfo> = self.procs().values().map(|p| p.info.clone()).collect();
        list.sort_by_key(|p| p.pid);
        list
    }
}
