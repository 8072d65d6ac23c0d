//! Requests that open a stream and the events that flow on it.
//!
//! Data channels carried in DATA frames: [`CHANNEL_STDIN`] (also used for file contents in
//! both directions), [`CHANNEL_STDOUT`], [`CHANNEL_STDERR`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const CHANNEL_STDIN: u8 = 0;
pub const CHANNEL_FILE: u8 = 0;
pub const CHANNEL_STDOUT: u8 = 1;
pub const CHANNEL_STDERR: u8 = 2;

/// The first message of every stream, sent by the side that opens it.
///
/// Stream conventions (client = the side that opened the stream):
/// - `Exec`: client sends stdin as DATA on channel 0 (only if `stdin` is true) and END to close
///   it; agent answers `Started`, then stdout/stderr DATA, then `Exited`, then END.
///   If `background` is true the process keeps running when the client goes away.
/// - `Attach`: agent streams output of a running process from now on, then `Exited`.
/// - `ReadFile`: agent answers `Entry` (the file's stat), then DATA chunks, then END.
/// - `WriteFile`: client sends DATA chunks then END; agent answers `Entry` after writing.
/// - `Watch`: agent sends `Ok` once the watch is in place, then `FsEvent`s until the client
///   drops the stream.
/// - `ListDir` and `ProcessList`: one or more `Entries` / `Processes` batches, then END (one
///   event is at most 64 KiB, so large listings are split).
/// - `Egress` (opened by the agent): a TCP connection a sandbox process made to the agent's
///   loopback proxy port. Raw bytes flow both ways as DATA on channel 0 and END half-closes;
///   the host answers nothing else (refusals are spoken in the proxied protocol itself).
/// - `TrustCa`: agent installs the PEM certificate as a trusted CA bundle, answers `Ok`.
/// - everything else: a single answer event (`Ok`, `Entry`, `Entries`, `Processes`,
///   `Pong`) or `Error`, then END.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    /// Defaults applied to every later exec (env), e.g. when a pooled sandbox is handed out.
    Configure { env: BTreeMap<String, String> },
    Exec(ExecSpec),
    Attach { pid: u32 },
    ProcessList,
    Signal { pid: u32, signal: i32 },
    /// One chunk of stdin for a running process (for clients that do not hold its exec stream).
    SendStdin { pid: u32, data: String },
    CloseStdin { pid: u32 },
    ResizePty { pid: u32, size: PtySize },
    ReadFile { path: String, user: Option<String> },
    WriteFile {
        path: String,
        user: Option<String>,
        mode: Option<u32>,
        append: bool,
    },
    Stat { path: String, user: Option<String> },
    ListDir { path: String, depth: u32, user: Option<String> },
    MakeDir { path: String, user: Option<String> },
    Remove { path: String, user: Option<String> },
    Rename { from: String, to: String, user: Option<String> },
    Watch { path: String, recursive: bool, user: Option<String> },
    /// Opened by the agent: relay one loopback connection to the host's egress proxy.
    /// `peer` is the sandbox-side address, for the audit log only.
    Egress { peer: String },
    /// Trust this CA (corral's, for brokered TLS) in the sandbox's certificate bundles.
    TrustCa { pem: String },
    /// The agent streams the sandbox's writable layer as a tar (DATA on channel 0), then a
    /// `Layer` summary, then END. The host holds every other process frozen meanwhile.
    SnapshotLayer,
    /// The client streams a layer made by `SnapshotLayer` (DATA on channel 0, then END); the
    /// agent applies it through the sandbox's root and answers `Layer`.
    RestoreLayer,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ExecSpec {
    /// Program and arguments. Ignored when `shell` is set.
    #[serde(default)]
    pub argv: Vec<String>,
    /// A command line run by `/bin/sh -c` (bash -l -c semantics are the client's business).
    #[serde(default)]
    pub shell: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// "user" (default, uid 1000), "root", or a numeric uid.
    #[serde(default)]
    pub user: Option<String>,
    /// Whether the client will stream stdin; otherwise stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
    /// Kill the process (SIGKILL to its process group) after this long.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Keep running and keep its entry in the process table after the stream ends.
    #[serde(default)]
    pub background: bool,
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Free-form label shown in the process list (E2B calls it a tag).
    #[serde(default)]
    pub tag: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Ok,
    Pong { version: String },
    Started { pid: u32 },
    /// `code` is set for a normal exit, `signal` when a signal ended it.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        /// Why corral ended it, e.g. "timeout".
        reason: Option<String>,
    },
    Entry(FileEntry),
    Entries { entries: Vec<FileEntry> },
    Processes { processes: Vec<ProcessInfo> },
    FsEvent { kind: FsEventKind, path: String },
    Error { kind: ErrorKind, message: String },
    /// A layer captured or restored: entries, file bytes, and what was left out and why (at
    /// most 100 reasons; `skipped_count` is exact).
    Layer { entries: u64, bytes: u64, skipped: Vec<String>, skipped_count: u64 },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FileEntry {
    /// Absolute path inside the sandbox.
    pub path: String,
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch.
    pub modified: i64,
    /// Target, when `kind` is `Symlink`.
    pub symlink_target: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub tag: Option<String>,
    pub pty: bool,
    pub env: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    PermissionDenied,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    InvalidArgument,
    NoSpace,
    Timeout,
    Unsupported,
    Internal,
}

impl ErrorKind {
    /// Maps an OS error to the closest kind, so callers can answer 404/400/409 precisely.
    pub fn from_io(err: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match err.raw_os_error() {
            Some(libc_enospc) if libc_enospc == 28 || libc_enospc == 122 => return Self::NoSpace,
            Some(20) => return Self::NotADirectory,
            Some(21) => return Self::IsADirectory,
            Some(40) => return Self::InvalidArgument,
            _ => {}
        }
        match err.kind() {
            K::NotFound => Self::NotFound,
            K::PermissionDenied => Self::PermissionDenied,
            K::AlreadyExists => Self::AlreadyExists,
            K::InvalidInput | K::InvalidData => Self::InvalidArgument,
            K::TimedOut => Self::Timeout,
            K::Unsupported => Self::Unsupported,
            _ => Self::Internal,
        }
    }
}

impl Event {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Event::Error { kind, message: message.into() }
    }
}

/// Version string the agent reports in `Pong`.
pub const PROTOCOL_VERSION: &str = "1";
