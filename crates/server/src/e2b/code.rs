//! The code interpreter's HTTP API (port 49999 upstream) over [`crate::interpreter`].

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::{AppState, Sandbox};
use crate::interpreter::{Cell, InterpreterError};

fn error_response(err: InterpreterError) -> Response {
    let status = match &err {
        InterpreterError::ContextNotFound(_) => StatusCode::NOT_FOUND,
        InterpreterError::Invalid(_) => StatusCode::BAD_REQUEST,
        // The sandbox went away under us: what the proxy says for a dead sandbox.
        InterpreterError::Sandbox(e) if e.status == StatusCode::NOT_FOUND || e.status == StatusCode::CONFLICT => StatusCode::BAD_GATEWAY,
        InterpreterError::Sandbox(e) => e.status,
    };
    let message = match status {
        StatusCode::BAD_GATEWAY => "The sandbox was not found".to_owned(),
        _ => err.to_string(),
    };
    (status, Json(json!({ "code": status.as_u16(), "message": message }))).into_response()
}

// The error is the HTTP answer itself, returned at once; boxing it would buy nothing.
#[allow(clippy::result_large_err)]
fn parse<T: for<'de> Deserialize<'de> + Default>(bytes: &[u8]) -> Result<T, Response> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        (StatusCode::BAD_REQUEST, Json(json!({ "code": 400, "message": format!("invalid JSON body: {e}") }))).into_response()
    })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ExecuteRequest {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /execute`: JSON lines, one per event, never blank.
pub async fn execute(State(st): State<AppState>, sandbox: Sandbox, body: Bytes) -> Response {
    if let Err(rejected) = sandbox.require_token() {
        return rejected;
    }
    let request: ExecuteRequest = match parse(&body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let cell = Cell {
        code: request.code,
        context_id: request.context_id,
        language: request.language,
        env: request.env_vars.unwrap_or_default(),
        // The SDK's own timeout ends the request; the interpreter interrupts the cell then.
        timeout: None,
    };
    match st.interpreters.execute(&sandbox.id, cell).await {
        Ok(events) => {
            let lines = events.map(|event| {
                let mut line = event.to_string().into_bytes();
                line.push(b'\n');
                Ok::<_, Infallible>(Bytes::from(line))
            });
            ([(CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response()
        }
        Err(err) => error_response(err),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ContextRequest {
    language: Option<String>,
    cwd: Option<String>,
}

pub async fn create_context(State(st): State<AppState>, sandbox: Sandbox, body: Bytes) -> Response {
    if let Err(rejected) = sandbox.require_token() {
        return rejected;
    }
    let request: ContextRequest = match parse(&body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    match st.interpreters.create_context(&sandbox.id, request.language.as_deref(), request.cwd, BTreeMap::new()).await {
        Ok(info) => Json(info).into_response(),
        Err(err) => error_response(err),
    }
}

pub async fn list_contexts(State(st): State<AppState>, sandbox: Sandbox) -> Response {
    if let Err(rejected) = sandbox.require_token() {
        return rejected;
    }
    match st.interpreters.list_contexts(&sandbox.id).await {
        Ok(contexts) => Json(contexts).into_response(),
        Err(err) => error_response(err),
    }
}

pub async fn restart_context(State(st): State<AppState>, sandbox: Sandbox, Path(context): Path<String>) -> Response {
    if let Err(rejected) = sandbox.require_token() {
        return rejected;
    }
    match st.interpreters.restart_context(&sandbox.id, &context).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => error_response(err),
    }
}

pub async fn remove_context(State(st): State<AppState>, sandbox: Sandbox, Path(context): Path<String>) -> Response {
    if let Err(rejected) = sandbox.require_token() {
        return rejected;
    }
    match st.interpreters.remove_context(&sandbox.id, &context).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => error_response(err),
    }
}
