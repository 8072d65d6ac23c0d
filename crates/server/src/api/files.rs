//! File routes. Contents stream through in both directions: nothing holds a whole file.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral_proto::{Event, FileKind, Message, MuxError, Request, StreamReceiver, StreamSender};
use futures::StreamExt;
use serde::Deserialize;

use super::{ApiJson, ApiPath, ApiQuery, AppState};
use crate::agent_client::{self, first_answer, unexpected};
use crate::error::ApiError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
    #[serde(default)]
    user: Option<String>,
}

/// `GET /files?path=P`: the raw contents.
pub async fn read(State(m): State<AppState>, ApiPath(id): ApiPath<String>, ApiQuery(q): ApiQuery<PathQuery>) -> Result<Response, ApiError> {
    let mux = m.agent(&id).await?;
    let (mut tx, mut rx) = mux.open(&Request::ReadFile { path: q.path, user: q.user }).map_err(ApiError::from_mux)?.split();
    tx.end().map_err(ApiError::from_mux)?;
    let entry = match first_answer(&mut rx).await? {
        Event::Entry(entry) => entry,
        other => return Err(unexpected(&other)),
    };
    let body = Body::from_stream(crate::agent_client::file_data(rx));
    let mut response = ([(CONTENT_TYPE, "application/octet-stream")], body).into_response();
    if entry.kind == FileKind::File {
        response.headers_mut().insert(CONTENT_LENGTH, entry.size.into());
    }
    Ok(response)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteQuery {
    path: String,
    #[serde(default)]
    user: Option<String>,
    /// Octal, e.g. `0644`.
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    append: bool,
}

fn parse_mode(mode: &str) -> Result<u32, ApiError> {
    let digits = mode.strip_prefix("0o").unwrap_or(mode);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(ApiError::bad_request(format!("mode {mode:?} is not an octal permission like 0644"))),
    }
}

/// `PUT /files?path=P`: the request body, chunk by chunk, as the agent grants credit.
pub async fn write(
    State(m): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let mode = q.mode.as_deref().map(parse_mode).transpose()?;
    let mux = m.agent(&id).await?;
    let request = Request::WriteFile { path: q.path, user: q.user, mode, append: q.append };
    let data = body.into_data_stream().map(|chunk| chunk.map_err(|e| ApiError::bad_request(format!("reading the upload: {e}"))));
    let entry = agent_client::write_file(&mux, &request, data).await?;
    Ok(Json(entry).into_response())
}

async fn answer(m: &AppState, id: &str, request: Request) -> Result<Response, ApiError> {
    let mux = m.agent(id).await?;
    match agent_client::request(&mux, &request).await? {
        Event::Ok => Ok(StatusCode::NO_CONTENT.into_response()),
        Event::Entry(entry) => Ok(Json(entry).into_response()),
        Event::Entries { entries } => Ok(Json(serde_json::json!({ "entries": entries })).into_response()),
        other => Err(unexpected(&other)),
    }
}

pub async fn remove(State(m): State<AppState>, ApiPath(id): ApiPath<String>, ApiQuery(q): ApiQuery<PathQuery>) -> Result<Response, ApiError> {
    answer(&m, &id, Request::Remove { path: q.path, user: q.user }).await
}

pub async fn stat(State(m): State<AppState>, ApiPath(id): ApiPath<String>, ApiQuery(q): ApiQuery<PathQuery>) -> Result<Response, ApiError> {
    answer(&m, &id, Request::Stat { path: q.path, user: q.user }).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    path: String,
    #[serde(default = "one")]
    depth: u32,
    #[serde(default)]
    user: Option<String>,
}

fn one() -> u32 {
    1
}

pub async fn list(State(m): State<AppState>, ApiPath(id): ApiPath<String>, ApiQuery(q): ApiQuery<ListQuery>) -> Result<Response, ApiError> {
    if !(1..=32).contains(&q.depth) {
        return Err(ApiError::bad_request("depth must be between 1 and 32"));
    }
    answer(&m, &id, Request::ListDir { path: q.path, depth: q.depth, user: q.user }).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MkdirBody {
    path: String,
    #[serde(default)]
    user: Option<String>,
}

pub async fn mkdir(State(m): State<AppState>, ApiPath(id): ApiPath<String>, ApiJson(b): ApiJson<MkdirBody>) -> Result<Response, ApiError> {
    answer(&m, &id, Request::MakeDir { path: b.path, user: b.user }).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveBody {
    from: String,
    to: String,
    #[serde(default)]
    user: Option<String>,
}

pub async fn rename(State(m): State<AppState>, ApiPath(id): ApiPath<String>, ApiJson(b): ApiJson<MoveBody>) -> Result<Response, ApiError> {
    answer(&m, &id, Request::Rename { from: b.from, to: b.to, user: b.user }).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    user: Option<String>,
}

struct WatchState {
    rx: StreamReceiver,
    /// Kept open for as long as we watch; dropping both halves stops the agent's watcher.
    _tx: StreamSender,
    done: bool,
}

/// `GET /files/watch`: SSE `fs` events `{"kind","path"}` until the client disconnects.
pub async fn watch(State(m): State<AppState>, ApiPath(id): ApiPath<String>, ApiQuery(q): ApiQuery<WatchQuery>) -> Result<Response, ApiError> {
    let mux = m.agent(&id).await?;
    let request = Request::Watch { path: q.path, recursive: q.recursive, user: q.user };
    let (tx, rx) = mux.open(&request).map_err(ApiError::from_mux)?.split();
    let state = WatchState { rx, _tx: tx, done: false };
    let events = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let event = loop {
            match st.rx.recv().await {
                Some(Ok(Message::Event(Event::FsEvent { kind, path }))) => {
                    let data = serde_json::json!({ "kind": kind, "path": path });
                    break SseEvent::default().event("fs").data(data.to_string());
                }
                Some(Ok(Message::Event(Event::Error { kind, message }))) => {
                    st.done = true;
                    break error_event(ApiError::from_agent(kind, message));
                }
                Some(Ok(_)) => continue,
                Some(Err(MuxError::Closed)) | None => {
                    st.done = true;
                    break error_event(ApiError::from_mux(MuxError::Closed));
                }
                Some(Err(e)) => {
                    st.done = true;
                    break error_event(ApiError::from_mux(e));
                }
            }
        };
        Some((Ok::<_, Infallible>(event), st))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

fn error_event(err: ApiError) -> SseEvent {
    let data = serde_json::json!({ "code": err.code, "message": err.message });
    SseEvent::default().event("error").data(data.to_string())
}
