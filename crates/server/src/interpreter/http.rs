//! Native routes: `POST /v1/sandboxes/{id}/code` (NDJSON events, or one JSON answer with
//! `?wait=true`) and `/v1/sandboxes/{id}/contexts`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{middleware, Json, Router};
use corral_spec::MAX_TIMEOUT_SECS;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Cell, InterpreterError, Interpreters};
use crate::api::{ApiJson, ApiPath, ApiQuery};
use crate::auth::{self, ApiKeys};
use crate::error::ApiError;

impl From<InterpreterError> for ApiError {
    fn from(err: InterpreterError) -> Self {
        match err {
            InterpreterError::ContextNotFound(_) => ApiError::not_found(err.to_string()),
            InterpreterError::Invalid(message) => ApiError::bad_request(message),
            InterpreterError::Sandbox(err) => err,
        }
    }
}

pub fn router(interpreters: Arc<Interpreters>, keys: Arc<ApiKeys>) -> Router {
    Router::new()
        .route("/v1/sandboxes/{id}/code", post(run))
        .route("/v1/sandboxes/{id}/contexts", post(create_context).get(list_contexts))
        .route("/v1/sandboxes/{id}/contexts/{context}", delete(remove_context))
        .route("/v1/sandboxes/{id}/contexts/{context}/restart", post(restart_context))
        .route_layer(middleware::from_fn_with_state(keys, auth::require_key))
        .with_state(interpreters)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeRequest {
    code: String,
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Seconds after which the cell is interrupted (its context keeps its state).
    #[serde(default)]
    timeout: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeQuery {
    #[serde(default)]
    wait: bool,
}

async fn run(
    State(interpreters): State<Arc<Interpreters>>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<CodeQuery>,
    ApiJson(request): ApiJson<CodeRequest>,
) -> Result<Response, ApiError> {
    let timeout = match request.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECS as f64 => Some(Duration::from_secs_f64(t)),
        Some(t) => return Err(ApiError::bad_request(format!("timeout {t} must be between 0 and {MAX_TIMEOUT_SECS} seconds"))),
    };
    let cell = Cell { code: request.code, context_id: request.context, language: request.language, env: request.env, timeout };
    let events = interpreters.execute(&id, cell).await?;
    if query.wait {
        return Ok(Json(collect(events).await).into_response());
    }
    let lines = events.map(|event| {
        let mut line = event.to_string().into_bytes();
        line.push(b'\n');
        Ok::<_, Infallible>(Bytes::from(line))
    });
    Ok(([(CONTENT_TYPE, "application/x-ndjson"), (CACHE_CONTROL, "no-cache")], Body::from_stream(lines)).into_response())
}

/// The whole execution as one object, for clients that do not stream.
async fn collect(events: impl futures::Stream<Item = Value>) -> Value {
    let (mut stdout, mut stderr, mut results, mut error, mut count) = (String::new(), String::new(), Vec::new(), Value::Null, Value::Null);
    let mut events = Box::pin(events);
    while let Some(event) = events.next().await {
        let text = event.get("text").and_then(Value::as_str).unwrap_or_default();
        match event.get("type").and_then(Value::as_str) {
            Some("stdout") => stdout.push_str(text),
            Some("stderr") => stderr.push_str(text),
            Some("result") => results.push(event),
            Some("error") => error = event,
            Some("number_of_executions") => count = event.get("execution_count").cloned().unwrap_or(Value::Null),
            _ => {}
        }
    }
    let text = results.iter().find(|r| r.get("is_main_result") == Some(&Value::Bool(true))).and_then(|r| r.get("text")).cloned();
    json!({ "stdout": stdout, "stderr": stderr, "results": results, "text": text, "error": error, "execution_count": count })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ContextRequest {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

async fn create_context(
    State(interpreters): State<Arc<Interpreters>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<ContextRequest>,
) -> Result<Response, ApiError> {
    let info = interpreters.create_context(&id, request.language.as_deref(), request.cwd, request.env).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn list_contexts(State(interpreters): State<Arc<Interpreters>>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(json!({ "contexts": interpreters.list_contexts(&id).await? })).into_response())
}

async fn remove_context(
    State(interpreters): State<Arc<Interpreters>>,
    ApiPath((id, context)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    interpreters.remove_context(&id, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn restart_context(
    State(interpreters): State<Arc<Interpreters>>,
    ApiPath((id, context)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    interpreters.restart_context(&id, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}
