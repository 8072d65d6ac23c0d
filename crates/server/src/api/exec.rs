//! Exec and process routes.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral_proto::{Event, ExecSpec, PtySize, Request};
use corral_spec::MAX_TIMEOUT_SECS;
use serde::Deserialize;

use super::{stream_response, ApiJson, ApiPath, ApiQuery, AppState, StreamFormat};
use crate::agent_client::{self, Stdin};
use crate::error::ApiError;

#[derive(Deserialize)]
#[serde(untagged)]
pub enum StdinField {
    /// `true`: keep stdin open and feed it through `/processes/{pid}/stdin`.
    Open(bool),
    /// Sent to the process, then closed.
    Data(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default)]
    argv: Vec<String>,
    /// A shell command line, run with `/bin/sh -c`.
    #[serde(default)]
    cmd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    user: Option<String>,
    /// Seconds (fractions allowed) after which the process group is killed.
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    stdin: Option<StdinField>,
    #[serde(default)]
    pty: Option<PtySize>,
    #[serde(default)]
    tag: Option<String>,
}

impl ExecRequest {
    fn into_spec(self) -> Result<(ExecSpec, Stdin), ApiError> {
        let shell = match (self.argv.is_empty(), self.cmd) {
            (false, None) => None,
            (true, Some(cmd)) if !cmd.is_empty() => Some(cmd),
            (true, _) => return Err(ApiError::bad_request("give either argv (a non-empty list) or cmd (a shell command)")),
            (false, Some(_)) => return Err(ApiError::bad_request("give argv or cmd, not both")),
        };
        if self.argv.iter().any(|a| a.contains('\0')) || shell.as_deref().is_some_and(|s| s.contains('\0')) {
            return Err(ApiError::bad_request("the command contains a NUL byte"));
        }
        corral_spec::validate_env(&self.env).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let timeout_ms = match self.timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECS as f64 => Some(((t * 1000.0).ceil() as u64).max(1)),
            Some(t) => return Err(ApiError::bad_request(format!("timeout {t} must be between 0 and {MAX_TIMEOUT_SECS} seconds"))),
        };
        let stdin = match self.stdin {
            None | Some(StdinField::Open(false)) => Stdin::None,
            Some(StdinField::Open(true)) if self.background => {
                return Err(ApiError::bad_request("stdin: true needs a foreground exec; send stdin as a string instead"))
            }
            Some(StdinField::Open(true)) => Stdin::Open,
            Some(StdinField::Data(data)) => Stdin::Data(data),
        };
        let spec = ExecSpec {
            argv: self.argv,
            shell,
            env: self.env,
            cwd: self.cwd,
            user: self.user,
            stdin: false, // set by agent_client::exec from `stdin`
            timeout_ms,
            background: self.background,
            pty: self.pty,
            tag: self.tag,
        };
        Ok((spec, stdin))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecQuery {
    #[serde(default)]
    wait: bool,
}

pub async fn exec(
    State(m): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ExecQuery>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ExecRequest>,
) -> Result<Response, ApiError> {
    let background = request.background;
    let (spec, stdin) = request.into_spec()?;
    let mux = m.agent(&id).await?;
    let running = agent_client::exec(&mux, spec, stdin).await?;
    let pid = running.pid;
    if background {
        running.detach().await;
        return Ok(if query.wait {
            Json(serde_json::json!({ "pid": pid })).into_response()
        } else {
            let start = agent_client::OutputEvent::Start { pid };
            stream_response(StreamFormat::from_headers(&headers), futures::stream::iter([start]))
        });
    }
    if query.wait {
        return Ok(Json(running.wait().await?).into_response());
    }
    Ok(stream_response(StreamFormat::from_headers(&headers), running.into_events(true)))
}

pub async fn list(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    let mux = m.agent(&id).await?;
    match agent_client::request(&mux, &Request::ProcessList).await? {
        Event::Processes { processes } => Ok(Json(serde_json::json!({ "processes": processes })).into_response()),
        other => Err(agent_client::unexpected(&other)),
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum SignalValue {
    Number(i32),
    Name(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    signal: SignalValue,
}

const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("KILL", 9),
    ("USR1", 10),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("WINCH", 28),
];

/// Accepts 15, "15", "TERM", "SIGTERM" (any case).
pub fn parse_signal(value: &SignalValue) -> Result<i32, ApiError> {
    let n = match value {
        SignalValue::Number(n) => *n,
        SignalValue::Name(name) => {
            let upper = name.trim().to_ascii_uppercase();
            let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
            match bare.parse::<i32>() {
                Ok(n) => n,
                Err(_) => SIGNALS
                    .iter()
                    .find(|(n, _)| *n == bare)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| ApiError::bad_request(format!("unknown signal {name:?}")))?,
            }
        }
    };
    if !(1..=64).contains(&n) {
        return Err(ApiError::bad_request(format!("signal {n} is out of range (1 to 64)")));
    }
    Ok(n)
}

async fn expect_ok(m: &AppState, id: &str, request: Request) -> Result<StatusCode, ApiError> {
    let mux = m.agent(id).await?;
    match agent_client::request(&mux, &request).await? {
        Event::Ok => Ok(StatusCode::NO_CONTENT),
        other => Err(agent_client::unexpected(&other)),
    }
}

pub async fn signal(
    State(m): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(body): ApiJson<SignalBody>,
) -> Result<StatusCode, ApiError> {
    let signal = parse_signal(&body.signal)?;
    expect_ok(&m, &id, Request::Signal { pid, signal }).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinBody {
    data: String,
}

pub async fn send_stdin(
    State(m): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(body): ApiJson<StdinBody>,
) -> Result<StatusCode, ApiError> {
    expect_ok(&m, &id, Request::SendStdin { pid, data: body.data }).await
}

pub async fn close_stdin(State(m): State<AppState>, ApiPath((id, pid)): ApiPath<(String, u32)>) -> Result<StatusCode, ApiError> {
    expect_ok(&m, &id, Request::CloseStdin { pid }).await
}

/// Streams a running process's output from now on, like a foreground exec without `start`.
pub async fn output(
    State(m): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mux = m.agent(&id).await?;
    // Checked first so an unknown pid is a 404 rather than an error event in a 200 stream.
    match agent_client::request(&mux, &Request::ProcessList).await? {
        Event::Processes { processes } if processes.iter().any(|p| p.pid == pid) => {}
        Event::Processes { .. } => return Err(ApiError::not_found(format!("no process {pid} in sandbox {id}"))),
        other => return Err(agent_client::unexpected(&other)),
    }
    let running = agent_client::attach(&mux, pid)?;
    Ok(stream_response(StreamFormat::from_headers(&headers), running.into_events(false)))
}
