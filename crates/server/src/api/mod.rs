//! HTTP routes under `/v1`, the extractors that turn every bad input into a JSON 400, and
//! the NDJSON/SSE streaming shared by exec, attach and watch.

mod exec;
mod files;
mod network;
mod pools;
mod sandboxes;
mod state;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request};
use axum::http::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::auth::{self, ApiKeys};
use crate::error::ApiError;
use crate::manager::Manager;

/// JSON request bodies (exec stdin can be large-ish); file uploads are streamed and unlimited.
const JSON_BODY_LIMIT: usize = 32 * 1024 * 1024;

pub type AppState = Arc<Manager>;

pub fn router(manager: Arc<Manager>, keys: Arc<ApiKeys>) -> Router {
    // Shared by the native `/code` route and the E2B code interpreter.
    let interpreters = crate::interpreter::Interpreters::new(manager.clone());
    let state: std::sync::Weak<dyn crate::manager::InterpreterState> = Arc::downgrade(&interpreters) as _;
    manager.set_interpreter_state(state);
    let protected = Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route("/v1/sandboxes/{id}", get(sandboxes::get).delete(sandboxes::kill))
        .route("/v1/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/v1/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route("/v1/sandboxes/{id}/pause", post(state::pause))
        .route("/v1/sandboxes/{id}/resume", post(state::resume))
        .route("/v1/sandboxes/{id}/snapshots", post(state::take_snapshot).get(state::sandbox_snapshots))
        .route("/v1/sandboxes/{id}/restore", post(state::restore))
        .route("/v1/sandboxes/{id}/fork", post(state::fork))
        .route("/v1/snapshots", get(state::list_snapshots))
        .route("/v1/snapshots/{id}", get(state::get_snapshot).delete(state::delete_snapshot))
        .route("/v1/sandboxes/{id}/exec", post(exec::exec))
        .route("/v1/sandboxes/{id}/processes", get(exec::list))
        .route("/v1/sandboxes/{id}/processes/{pid}/signal", post(exec::signal))
        .route("/v1/sandboxes/{id}/processes/{pid}/stdin", post(exec::send_stdin))
        .route("/v1/sandboxes/{id}/processes/{pid}/stdin/close", post(exec::close_stdin))
        .route("/v1/sandboxes/{id}/processes/{pid}/output", get(exec::output))
        .route("/v1/sandboxes/{id}/files", get(files::read).put(files::write).delete(files::remove))
        .route("/v1/sandboxes/{id}/files/list", get(files::list))
        .route("/v1/sandboxes/{id}/files/stat", get(files::stat))
        .route("/v1/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/v1/sandboxes/{id}/files/move", post(files::rename))
        .route("/v1/sandboxes/{id}/files/watch", get(files::watch))
        .route("/v1/sandboxes/{id}/network", get(network::get).patch(network::patch))
        .route("/v1/pools", get(pools::list))
        .route("/v1/pools/{template}", axum::routing::put(pools::put).delete(pools::delete))
        .route("/v1/secrets", post(network::create_secret).get(network::list_secrets))
        .route("/v1/secrets/{name}", axum::routing::delete(network::delete_secret))
        .route_layer(middleware::from_fn_with_state(keys.clone(), auth::require_key));
    Router::new()
        .route("/v1/health", get(health))
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(JSON_BODY_LIMIT))
        .with_state(manager.clone())
        .merge(crate::interpreter::router(interpreters.clone(), keys.clone()))
        .merge(crate::e2b::router(manager, keys, interpreters))
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok", "version": env!("CARGO_PKG_VERSION") }))
}

async fn openapi() -> Json<serde_json::Value> {
    Json(crate::openapi::document())
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
}

/// A JSON body parsed regardless of Content-Type; an empty body reads as `{}`.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::new(e.status(), "bad_request", e.body_text()))?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
        serde_json::from_slice(bytes)
            .map(ApiJson)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// Query parameters with a JSON 400 on error.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e| ApiError::bad_request(e.body_text()))
    }
}

/// Path parameters with a JSON 400 on error (e.g. a pid that is not a number).
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e| ApiError::bad_request(e.body_text()))
    }
}

/// Events streamed to clients carry a name: the SSE event name and the NDJSON `type`.
pub trait Named: Serialize {
    fn name(&self) -> &'static str;
}

impl Named for crate::agent_client::OutputEvent {
    fn name(&self) -> &'static str {
        crate::agent_client::OutputEvent::name(self)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    Ndjson,
    Sse,
}

impl StreamFormat {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
        if accept.contains("text/event-stream") {
            StreamFormat::Sse
        } else {
            StreamFormat::Ndjson
        }
    }
}

/// Sends each event as soon as it exists; nothing is buffered until the end.
pub fn stream_response<E, S>(format: StreamFormat, events: S) -> Response
where
    E: Named + Send + 'static,
    S: Stream<Item = E> + Send + 'static,
{
    match format {
        StreamFormat::Sse => {
            let events = events.map(|event| {
                let data = serde_json::to_string(&event).unwrap_or_else(|_| "{}".into());
                Ok::<_, Infallible>(SseEvent::default().event(event.name()).data(data))
            });
            Sse::new(events).keep_alive(KeepAlive::default()).into_response()
        }
        StreamFormat::Ndjson => {
            let lines = events.map(|event| {
                let mut line = serde_json::to_vec(&event).unwrap_or_else(|_| b"{}".to_vec());
                line.push(b'\n');
                Ok::<_, Infallible>(Bytes::from(line))
            });
            (
                [(CONTENT_TYPE, "application/x-ndjson"), (CACHE_CONTROL, "no-cache")],
                Body::from_stream(lines),
            )
                .into_response()
        }
    }
}
