//! Typed helpers over the agent connection: one-shot requests, exec/attach output streams,
//! and the JSON events the API turns them into.

use std::collections::VecDeque;

use axum::http::StatusCode;
use base64::Engine as _;
use bytes::Bytes;
use corral_proto::{Event, ExecSpec, FileEntry, Message, Mux, MuxError, Request, StreamReceiver, StreamSender, CHANNEL_FILE, CHANNEL_STDERR, CHANNEL_STDIN, CHANNEL_STDOUT};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Cap on what `?wait=true` buffers per output channel.
pub const WAIT_OUTPUT_CAP: usize = 16 * 1024 * 1024;

fn agent_error(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, "agent_error", message)
}

/// Sends a request that has no body and returns the agent's single answer.
pub async fn request(mux: &Mux, request: &Request) -> Result<Event, ApiError> {
    let (mut tx, mut rx) = mux.open(request).map_err(ApiError::from_mux)?.split();
    tx.end().map_err(ApiError::from_mux)?;
    let first = first_answer(&mut rx).await?;
    // Listings come in batches (one event is at most 64 KiB); merge them until END.
    match first {
        Event::Entries { mut entries } => {
            while let Some(event) = next_batch(&mut rx).await? {
                match event {
                    Event::Entries { entries: more } => entries.extend(more),
                    other => return Err(unexpected(&other)),
                }
            }
            Ok(Event::Entries { entries })
        }
        Event::Processes { mut processes } => {
            while let Some(event) = next_batch(&mut rx).await? {
                match event {
                    Event::Processes { processes: more } => processes.extend(more),
                    other => return Err(unexpected(&other)),
                }
            }
            Ok(Event::Processes { processes })
        }
        other => Ok(other),
    }
}

/// The next event of a multi-event answer, or `None` at END.
async fn next_batch(rx: &mut StreamReceiver) -> Result<Option<Event>, ApiError> {
    match rx.recv_event().await {
        Ok(Some(Event::Error { kind, message })) => Err(ApiError::from_agent(kind, message)),
        Ok(event) => Ok(event),
        Err(e) => Err(ApiError::from_mux(e)),
    }
}

/// Streams `data` into a file through the agent (`request` is a `WriteFile`) and answers the
/// written file's entry. The agent may refuse (e.g. permission denied) before reading
/// everything, so its answer is listened for while uploading; otherwise the upload would wait
/// for credit forever.
pub async fn write_file(
    mux: &Mux,
    request: &Request,
    data: impl Stream<Item = Result<Bytes, ApiError>> + Send + Unpin,
) -> Result<FileEntry, ApiError> {
    let (mut tx, mut rx) = mux.open(request).map_err(ApiError::from_mux)?.split();
    let send = send_all(&mut tx, data);
    tokio::pin!(send);
    let answer = tokio::select! {
        sent = &mut send => match sent {
            Ok(()) => first_answer(&mut rx).await?,
            Err(send_err) => {
                // An agent that refuses may reset the stream right after saying why; its
                // reason beats "stream was reset".
                let reason = tokio::time::timeout(std::time::Duration::from_secs(1), first_answer(&mut rx)).await;
                return Err(match reason {
                    Ok(Err(agent_err)) if agent_err.code != "agent_error" => agent_err,
                    _ => send_err,
                });
            }
        },
        // Anything but an error before the end of the upload is out of order.
        early = first_answer(&mut rx) => return Err(match early {
            Ok(event) => unexpected(&event),
            Err(err) => err,
        }),
    };
    match answer {
        Event::Entry(entry) => Ok(entry),
        other => Err(unexpected(&other)),
    }
}

async fn send_all(tx: &mut StreamSender, mut data: impl Stream<Item = Result<Bytes, ApiError>> + Unpin) -> Result<(), ApiError> {
    while let Some(chunk) = data.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                tx.reset();
                return Err(e);
            }
        };
        if !chunk.is_empty() {
            tx.send_data(CHANNEL_FILE, &chunk).await.map_err(ApiError::from_mux)?;
        }
    }
    tx.end().map_err(ApiError::from_mux)
}

/// The DATA of a file being read, as a byte stream for an HTTP body. An error mid-file ends the
/// stream with an error, so the client sees a truncated transfer rather than a short file.
pub fn file_data(rx: StreamReceiver) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        loop {
            return match rx.recv().await {
                Some(Ok(Message::Data { bytes, .. })) => Some((Ok(bytes), Some(rx))),
                Some(Ok(Message::Event(Event::Error { message, .. }))) => Some((Err(std::io::Error::other(message)), None)),
                Some(Ok(Message::Event(_))) => continue,
                Some(Err(e)) => Some((Err(std::io::Error::other(e)), None)),
                None => None,
            };
        }
    })
}

/// The next event on a stream, with the agent's `Error` turned into an `ApiError`.
pub async fn first_answer(rx: &mut StreamReceiver) -> Result<Event, ApiError> {
    match rx.recv_event().await {
        Ok(Some(Event::Error { kind, message })) => Err(ApiError::from_agent(kind, message)),
        Ok(Some(event)) => Ok(event),
        Ok(None) => Err(agent_error("the agent ended the stream without answering")),
        Err(e) => Err(ApiError::from_mux(e)),
    }
}

pub fn unexpected(event: &Event) -> ApiError {
    agent_error(format!("unexpected answer from the agent: {event:?}"))
}

/// One piece of output: text when it is valid UTF-8, base64 otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
}

impl Chunk {
    fn text(s: String) -> Self {
        Chunk { data: Some(s), data_b64: None }
    }
    fn binary(b: &[u8]) -> Self {
        Chunk { data: None, data_b64: Some(base64::engine::general_purpose::STANDARD.encode(b)) }
    }
    /// The raw bytes, whichever way they were encoded.
    pub fn bytes(&self) -> Vec<u8> {
        match (&self.data, &self.data_b64) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }
}

/// What exec and attach stream to HTTP clients, as NDJSON lines or SSE events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputEvent {
    Start { pid: u32 },
    Stdout(Chunk),
    Stderr(Chunk),
    Exit { exit_code: Option<i32>, signal: Option<i32>, reason: Option<String> },
    Error { code: String, message: String },
}

impl OutputEvent {
    pub fn name(&self) -> &'static str {
        match self {
            OutputEvent::Start { .. } => "start",
            OutputEvent::Stdout(_) => "stdout",
            OutputEvent::Stderr(_) => "stderr",
            OutputEvent::Exit { .. } => "exit",
            OutputEvent::Error { .. } => "error",
        }
    }

    fn error(err: ApiError) -> Self {
        OutputEvent::Error { code: err.code.to_string(), message: err.message }
    }
}

/// Output events without text decoding, for callers that buffer.
enum RawEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit { code: Option<i32>, signal: Option<i32>, reason: Option<String> },
    /// The stream broke before the process exited.
    Failed(ApiError),
}

async fn next_raw(rx: &mut StreamReceiver) -> RawEvent {
    loop {
        return match rx.recv().await {
            Some(Ok(Message::Data { channel: CHANNEL_STDOUT, bytes })) => RawEvent::Stdout(bytes),
            Some(Ok(Message::Data { channel: CHANNEL_STDERR, bytes })) => RawEvent::Stderr(bytes),
            Some(Ok(Message::Event(Event::Exited { code, signal, reason }))) => RawEvent::Exit { code, signal, reason },
            Some(Ok(Message::Event(Event::Error { kind, message }))) => RawEvent::Failed(ApiError::from_agent(kind, message)),
            // Nothing else belongs on an output stream; skip rather than fail a running process.
            Some(Ok(other)) => {
                tracing::debug!(?other, "ignoring unexpected message on an output stream");
                continue;
            }
            Some(Err(MuxError::Closed)) => RawEvent::Failed(agent_error("the sandbox agent went away (was the sandbox killed?)")),
            Some(Err(e)) => RawEvent::Failed(ApiError::from_mux(e)),
            None => RawEvent::Failed(agent_error("the agent ended the stream before the process exited")),
        };
    }
}

/// How an exec's stdin is fed.
pub enum Stdin {
    /// `/dev/null`.
    None,
    /// Sent, then closed.
    Data(String),
    /// Left open while the exec stream lasts; fed through `SendStdin`.
    Open,
}

/// A started process whose output has not been read yet.
pub struct Running {
    pub pid: u32,
    rx: StreamReceiver,
    /// Held so stdin stays open (`Stdin::Open`); dropping it closes stdin.
    _stdin: Option<StreamSender>,
    /// Writes `Stdin::Data`; aborted with the stream so it cannot block forever.
    writer: AbortOnDrop,
}

#[derive(Default)]
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Starts a process and waits for the agent to confirm it (so spawn failures are HTTP errors).
pub async fn exec(mux: &Mux, mut spec: ExecSpec, stdin: Stdin) -> Result<Running, ApiError> {
    spec.stdin = !matches!(stdin, Stdin::None);
    let (mut tx, mut rx) = mux.open(&Request::Exec(spec)).map_err(ApiError::from_mux)?.split();
    let (keep, writer) = match stdin {
        Stdin::None => {
            tx.end().map_err(ApiError::from_mux)?;
            (None, AbortOnDrop::default())
        }
        Stdin::Open => (Some(tx), AbortOnDrop::default()),
        Stdin::Data(data) => {
            // Written concurrently: a process that never reads stdin must not block its output.
            let task = tokio::spawn(async move {
                if tx.send_data(CHANNEL_STDIN, data.as_bytes()).await.is_ok() {
                    let _ = tx.end();
                }
            });
            (None, AbortOnDrop(Some(task)))
        }
    };
    match first_answer(&mut rx).await? {
        Event::Started { pid } => Ok(Running { pid, rx, _stdin: keep, writer }),
        other => Err(unexpected(&other)),
    }
}

/// Attaches to a running process's output; there is no `Started` answer to wait for.
pub fn attach(mux: &Mux, pid: u32) -> Result<Running, ApiError> {
    let (tx, rx) = mux.open(&Request::Attach { pid }).map_err(ApiError::from_mux)?.split();
    // Our half stays open while attached, so the agent cannot mistake END for a detach.
    Ok(Running { pid, rx, _stdin: Some(tx), writer: AbortOnDrop::default() })
}

/// Carries an incomplete UTF-8 sequence at the end of one chunk over to the next.
#[derive(Default)]
struct Utf8Carry {
    carry: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, bytes: &[u8]) -> Option<Chunk> {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(bytes);
        match String::from_utf8(buf) {
            Ok(text) if text.is_empty() => None,
            Ok(text) => Some(Chunk::text(text)),
            Err(err) if err.utf8_error().error_len().is_none() => {
                let valid = err.utf8_error().valid_up_to();
                let mut buf = err.into_bytes();
                self.carry = buf.split_off(valid);
                String::from_utf8(buf).ok().filter(|t| !t.is_empty()).map(Chunk::text)
            }
            Err(err) => Some(Chunk::binary(err.as_bytes())),
        }
    }

    fn flush(&mut self) -> Option<Chunk> {
        (!self.carry.is_empty()).then(|| Chunk::binary(&std::mem::take(&mut self.carry)))
    }
}

struct EventState {
    running: Running,
    pending: VecDeque<OutputEvent>,
    stdout: Utf8Carry,
    stderr: Utf8Carry,
    finished: bool,
}

impl Running {
    /// Lets a background process go: waits until its stdin was written, then drops the
    /// stream (the agent keeps background processes running).
    pub async fn detach(mut self) {
        if let Some(task) = self.writer.0.take() {
            let _ = task.await;
        }
    }

    /// The output as events, starting with `start` when `announce` is set. Dropping the
    /// stream drops the agent stream, which kills a foreground process.
    pub fn into_events(self, announce: bool) -> impl Stream<Item = OutputEvent> + Send + 'static {
        let mut pending = VecDeque::new();
        if announce {
            pending.push_back(OutputEvent::Start { pid: self.pid });
        }
        let state = EventState { running: self, pending, stdout: Utf8Carry::default(), stderr: Utf8Carry::default(), finished: false };
        futures::stream::unfold(state, |mut st| async move {
            loop {
                if let Some(event) = st.pending.pop_front() {
                    return Some((event, st));
                }
                if st.finished {
                    return None;
                }
                match next_raw(&mut st.running.rx).await {
                    RawEvent::Stdout(b) => st.pending.extend(st.stdout.push(&b).map(OutputEvent::Stdout)),
                    RawEvent::Stderr(b) => st.pending.extend(st.stderr.push(&b).map(OutputEvent::Stderr)),
                    RawEvent::Exit { code, signal, reason } => {
                        st.pending.extend(st.stdout.flush().map(OutputEvent::Stdout));
                        st.pending.extend(st.stderr.flush().map(OutputEvent::Stderr));
                        st.pending.push_back(OutputEvent::Exit { exit_code: code, signal, reason });
                        st.finished = true;
                    }
                    RawEvent::Failed(err) => {
                        st.pending.push_back(OutputEvent::error(err));
                        st.finished = true;
                    }
                }
            }
        })
    }

    /// Reads everything until the process exits, keeping at most `WAIT_OUTPUT_CAP` bytes per channel.
    pub async fn wait(mut self) -> Result<WaitResult, ApiError> {
        let (mut stdout, mut stderr, mut truncated) = (Vec::new(), Vec::new(), false);
        loop {
            match next_raw(&mut self.rx).await {
                RawEvent::Stdout(b) => truncated |= append_capped(&mut stdout, &b),
                RawEvent::Stderr(b) => truncated |= append_capped(&mut stderr, &b),
                RawEvent::Exit { code, signal, reason } => {
                    let (stdout, stdout_b64) = text_or_b64(stdout);
                    let (stderr, stderr_b64) = text_or_b64(stderr);
                    return Ok(WaitResult {
                        pid: self.pid,
                        stdout,
                        stderr,
                        stdout_b64,
                        stderr_b64,
                        exit_code: code,
                        signal,
                        reason,
                        truncated,
                    });
                }
                RawEvent::Failed(err) => return Err(err),
            }
        }
    }
}

fn append_capped(buf: &mut Vec<u8>, bytes: &[u8]) -> bool {
    let room = WAIT_OUTPUT_CAP.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    bytes.len() > room
}

/// Lossy text always (easy for clients), plus exact base64 when the bytes were not UTF-8.
fn text_or_b64(bytes: Vec<u8>) -> (String, Option<String>) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, None),
        Err(err) => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(err.as_bytes());
            (String::from_utf8_lossy(err.as_bytes()).into_owned(), Some(b64))
        }
    }
}

/// The `?wait=true` answer of exec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitResult {
    pub pid: u32,
    pub stdout: String,
    pub stderr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_b64: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
    /// Output beyond 16 MiB per channel was dropped.
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_chunks_is_reassembled() {
        let mut carry = Utf8Carry::default();
        let euro = "€".as_bytes();
        assert_eq!(carry.push(&[b'a', euro[0]]), Some(Chunk::text("a".into())));
        assert_eq!(carry.push(&euro[1..]), Some(Chunk::text("€".into())));
        assert_eq!(carry.push(&[0xff, b'x']).and_then(|c| c.data_b64), Some("/3g=".into()));
        assert_eq!(carry.flush(), None);
    }
}
