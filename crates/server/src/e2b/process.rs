//! envd's `process.Process` service over the agent's exec, attach, signal and stdin requests.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use corral_proto::{Event, ExecSpec, Mux, ProcessInfo, PtySize, Request};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, lenient_u32, ConnectError, Item};
use super::{AppState, Sandbox};
use crate::agent_client::{self, OutputEvent, Stdin};
use crate::interpreter::KERNEL_TAG_PREFIX;

/// envd's default when the client does not ask for keepalives.
const DEFAULT_KEEPALIVE_SECS: u64 = 90;

#[derive(Deserialize, Default)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct Size {
    #[serde(deserialize_with = "lenient_u32")]
    cols: Option<u32>,
    #[serde(deserialize_with = "lenient_u32")]
    rows: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Pty {
    size: Option<Size>,
}

impl Pty {
    fn size(&self) -> PtySize {
        let size = self.size.unwrap_or_default();
        let clamp = |v: Option<u32>, default: u16| v.map_or(default, |v| v.clamp(1, u32::from(u16::MAX)) as u16);
        PtySize { cols: clamp(size.cols, 80), rows: clamp(size.rows, 24) }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    tag: Option<String>,
    /// Absent means true: older clients always had stdin.
    stdin: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Selector {
    #[serde(deserialize_with = "lenient_u32")]
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SelectorRequest {
    process: Selector,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SignalRequest {
    process: Selector,
    signal: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct InputRequest {
    process: Selector,
    input: Input,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UpdateRequest {
    process: Selector,
    pty: Option<Pty>,
}

pub async fn rpc(
    State(_st): State<AppState>,
    Path(method): Path<String>,
    sandbox: Sandbox,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(rejected) = sandbox.require_token() {
        return rejected;
    }
    if method == "StreamInput" {
        return stream_input(&sandbox, body).await.unwrap_or_else(IntoResponse::into_response);
    }
    let bytes = match axum::body::to_bytes(body, connect::MAX_MESSAGE).await {
        Ok(bytes) => bytes,
        Err(e) => return ConnectError::invalid(format!("reading the request: {e}")).into_response(),
    };
    let result = match method.as_str() {
        "Start" => start(&sandbox, &headers, connect::decode(&headers, &bytes)).await,
        "Connect" => attach(&sandbox, &headers, connect::decode(&headers, &bytes)).await,
        "List" => list(&sandbox).await,
        "SendSignal" => signal(&sandbox, connect::decode(&headers, &bytes)).await,
        "SendInput" => send_input(&sandbox, connect::decode(&headers, &bytes)).await,
        "CloseStdin" => close_stdin(&sandbox, connect::decode(&headers, &bytes)).await,
        "Update" => update(&sandbox, connect::decode(&headers, &bytes)).await,
        other => Err(ConnectError::new("unimplemented", format!("process.Process/{other} is not implemented"))),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn start(sandbox: &Sandbox, headers: &HeaderMap, request: Result<StartRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    let config = request.process;
    if config.cmd.is_empty() {
        return Err(ConnectError::invalid("process.cmd is empty"));
    }
    if std::iter::once(&config.cmd).chain(&config.args).any(|a| a.contains('\0')) {
        return Err(ConnectError::invalid("the command contains a NUL byte"));
    }
    corral_spec::validate_env(&config.envs).map_err(|e| ConnectError::invalid(e.to_string()))?;
    let pty = request.pty.as_ref().map(Pty::size);
    let stdin = if pty.is_none() && request.stdin.unwrap_or(true) { Stdin::Open } else { Stdin::None };
    let mut argv = vec![config.cmd];
    argv.extend(config.args);
    let spec = ExecSpec {
        argv,
        env: config.envs,
        cwd: config.cwd.filter(|c| !c.is_empty()),
        user: sandbox.user.clone(),
        // envd ends the process at the call's deadline, but not when the client goes away.
        timeout_ms: connect::timeout_ms(headers),
        background: true,
        pty,
        tag: request.tag,
        ..Default::default()
    };
    let running = agent_client::exec(&sandbox.mux, spec, stdin).await?;
    let events = running.into_events(true);
    Ok(connect::stream_response(process_events(events, pty.is_some(), keepalive(headers))))
}

async fn attach(sandbox: &Sandbox, headers: &HeaderMap, request: Result<SelectorRequest, ConnectError>) -> Result<Response, ConnectError> {
    let pid = resolve(&sandbox.mux, &request?.process).await?;
    let processes = processes(&sandbox.mux).await?;
    let pty = processes.iter().find(|p| p.pid == pid).map(|p| p.pty).unwrap_or(false);
    let running = agent_client::attach(&sandbox.mux, pid)?;
    let events = futures::stream::iter([OutputEvent::Start { pid }]).chain(running.into_events(false));
    Ok(connect::stream_response(process_events(events, pty, keepalive(headers))))
}

fn keepalive(headers: &HeaderMap) -> Duration {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_KEEPALIVE_SECS);
    Duration::from_secs(secs.clamp(1, 3600))
}

/// Agent output as `ProcessEvent`s, with a keepalive after every `interval` of silence.
fn process_events(
    events: impl Stream<Item = OutputEvent> + Send + 'static,
    pty: bool,
    interval: Duration,
) -> impl Stream<Item = Item> + Send + 'static {
    futures::stream::unfold(Some(Box::pin(events)), move |events| async move {
        let mut events = events?;
        match tokio::time::timeout(interval, events.next()).await {
            Err(_) => Some((Item::Message(json!({ "event": { "keepalive": {} } })), Some(events))),
            Ok(None) => None,
            Ok(Some(event)) => {
                let item = process_event(event, pty);
                let more = matches!(item, Item::Message(_)).then_some(events);
                Some((item, more))
            }
        }
    })
}

fn process_event(event: OutputEvent, pty: bool) -> Item {
    let data = |key: &str, bytes: Vec<u8>| Item::Message(json!({ "event": { "data": { key: connect::encode_bytes(&bytes) } } }));
    match event {
        OutputEvent::Start { pid } => Item::Message(json!({ "event": { "start": { "pid": pid } } })),
        OutputEvent::Stdout(chunk) => data(if pty { "pty" } else { "stdout" }, chunk.bytes()),
        OutputEvent::Stderr(chunk) => data("stderr", chunk.bytes()),
        OutputEvent::Exit { exit_code, signal, reason } => Item::Message(json!({ "event": { "end": end_event(exit_code, signal, reason) } })),
        OutputEvent::Error { message, .. } => Item::Error(ConnectError::new("unavailable", message)),
    }
}

/// Go's `ProcessState.String()` is what envd reports as `status`.
fn end_event(code: Option<i32>, signal: Option<i32>, reason: Option<String>) -> Value {
    let (exit_code, exited, status) = match (code, signal) {
        (Some(code), _) => (code, true, format!("exit status {code}")),
        (None, Some(signal)) => (-1, false, format!("signal: {}", signal_name(signal))),
        (None, None) => (-1, false, "unknown".to_owned()),
    };
    let mut end = json!({ "exitCode": exit_code, "exited": exited, "status": status });
    if exit_code != 0 {
        let error = match reason.as_deref() {
            Some("timeout") => format!("{status} (timed out)"),
            _ => status,
        };
        end["error"] = json!(error);
    }
    end
}

fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        9 => "killed".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

async fn processes(mux: &Mux) -> Result<Vec<ProcessInfo>, ConnectError> {
    match agent_client::request(mux, &Request::ProcessList).await? {
        Event::Processes { processes } => Ok(processes),
        other => Err(agent_client::unexpected(&other).into()),
    }
}

/// A pid, from the selector's pid or by looking its tag up.
async fn resolve(mux: &Mux, selector: &Selector) -> Result<u32, ConnectError> {
    if let Some(pid) = selector.pid.filter(|&p| p != 0) {
        return Ok(pid);
    }
    let Some(tag) = selector.tag.as_deref() else {
        return Err(ConnectError::invalid("the process selector names neither a pid nor a tag"));
    };
    processes(mux)
        .await?
        .into_iter()
        .find(|p| p.tag.as_deref() == Some(tag))
        .map(|p| p.pid)
        .ok_or_else(|| ConnectError::not_found(format!("process with tag {tag:?} not found")))
}

async fn list(sandbox: &Sandbox) -> Result<Response, ConnectError> {
    let processes: Vec<Value> = processes(&sandbox.mux)
        .await?
        .into_iter()
        // The code interpreter's kernels are corral's, not the user's commands.
        .filter(|p| !p.tag.as_deref().is_some_and(|t| t.starts_with(KERNEL_TAG_PREFIX)))
        .map(|p| {
            let (cmd, args) = p.argv.split_first().map(|(c, a)| (c.clone(), a.to_vec())).unwrap_or_default();
            let mut info = json!({ "pid": p.pid, "config": { "cmd": cmd, "args": args, "envs": p.env } });
            if let Some(cwd) = p.cwd {
                info["config"]["cwd"] = json!(cwd);
            }
            if let Some(tag) = p.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    Ok(connect::unary(&json!({ "processes": processes })))
}

async fn expect_ok(mux: &Mux, request: Request) -> Result<Response, ConnectError> {
    match agent_client::request(mux, &request).await? {
        Event::Ok => Ok(connect::unary(&json!({}))),
        other => Err(agent_client::unexpected(&other).into()),
    }
}

async fn signal(sandbox: &Sandbox, request: Result<SignalRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    let signal = match &request.signal {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => 9,
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => 15,
        Some(Value::Number(n)) if n.as_i64() == Some(9) || n.as_i64() == Some(15) => n.as_i64().unwrap_or(9) as i32,
        other => return Err(ConnectError::invalid(format!("unsupported signal {other:?}"))),
    };
    let pid = resolve(&sandbox.mux, &request.process).await?;
    expect_ok(&sandbox.mux, Request::Signal { pid, signal }).await
}

fn input_text(encoded: &str) -> Result<String, ConnectError> {
    // The agent's stdin request carries text; bytes that are not UTF-8 cannot pass intact.
    Ok(String::from_utf8_lossy(&connect::decode_bytes(encoded)?).into_owned())
}

async fn send_input(sandbox: &Sandbox, request: Result<InputRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    let pid = resolve(&sandbox.mux, &request.process).await?;
    let Some(encoded) = request.input.stdin.as_deref().or(request.input.pty.as_deref()) else {
        return Err(ConnectError::invalid("input has neither stdin nor pty data"));
    };
    expect_ok(&sandbox.mux, Request::SendStdin { pid, data: input_text(encoded)? }).await
}

async fn close_stdin(sandbox: &Sandbox, request: Result<SelectorRequest, ConnectError>) -> Result<Response, ConnectError> {
    let pid = resolve(&sandbox.mux, &request?.process).await?;
    expect_ok(&sandbox.mux, Request::CloseStdin { pid }).await
}

async fn update(sandbox: &Sandbox, request: Result<UpdateRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    let pid = resolve(&sandbox.mux, &request.process).await?;
    match request.pty {
        Some(pty) => expect_ok(&sandbox.mux, Request::ResizePty { pid, size: pty.size() }).await,
        None => Ok(connect::unary(&json!({}))),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamInputMessage {
    start: Option<SelectorRequest>,
    data: Option<InputRequest>,
}

/// Client streaming: a `start` naming the process, then `data` chunks. The answer is a
/// stream with exactly one (empty) message.
async fn stream_input(sandbox: &Sandbox, body: Body) -> Result<Response, ConnectError> {
    let mut frames = connect::FrameReader::default();
    let mut chunks = body.into_data_stream();
    let mut pid = None;
    'read: while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ConnectError::invalid(format!("reading the request: {e}")))?;
        frames.push(&chunk);
        while let Some(frame) = frames.next_frame()? {
            if frame.end {
                break 'read;
            }
            let message: StreamInputMessage =
                serde_json::from_slice(&frame.payload).map_err(|e| ConnectError::invalid(format!("invalid message: {e}")))?;
            if let Some(start) = message.start {
                pid = Some(resolve(&sandbox.mux, &start.process).await?);
            }
            if let Some(data) = message.data {
                let Some(pid) = pid else {
                    return Err(ConnectError::invalid("data before start"));
                };
                if let Some(encoded) = data.input.stdin.as_deref().or(data.input.pty.as_deref()) {
                    expect_ok(&sandbox.mux, Request::SendStdin { pid, data: input_text(encoded)? }).await?;
                }
            }
        }
    }
    Ok(connect::stream_response(futures::stream::iter([Item::Message(json!({}))])))
}
