//! E2B compatibility: the control-plane REST API, envd's Connect RPC and `/files`, and the
//! code interpreter's `/execute` and `/contexts`, served on the native API's port.
//!
//! Everything here is a thin adapter: sandboxes are the [`Manager`]'s, processes and files
//! go through the agent protocol, code runs in [`crate::interpreter`]. Requests for a
//! sandbox are told apart from control-plane requests by the `E2b-Sandbox-Id` header (the
//! SDK sets it whenever `E2B_SANDBOX_URL` is used); their paths never clash with `/v1`.

mod code;
mod connect;
mod control;
mod entry;
mod files;
mod filesystem;
mod process;
mod snapshot;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use base64::Engine as _;
use corral_proto::Mux;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::auth::ApiKeys;
use crate::error::ApiError;
use crate::interpreter::Interpreters;
use crate::manager::Manager;

/// The envd version advertised to SDKs. 0.5.7 turns on octet-stream (and gzip) uploads and
/// 0.5.2 `close_stdin`; 0.6.2 would promise file metadata (xattrs), which the agent lacks.
pub const ENVD_VERSION: &str = "0.6.1";
/// Ports the SDK names in `E2b-Sandbox-Port`.
const INTERPRETER_PORT: &str = "49999";

pub struct E2b {
    manager: Arc<Manager>,
    keys: Arc<ApiKeys>,
    interpreters: Arc<Interpreters>,
    watchers: filesystem::Watchers,
    /// Per-daemon secret the per-sandbox access tokens are derived from, so no token is
    /// stored; sandboxes do not outlive the daemon, and neither need their tokens.
    secret: [u8; 32],
}

type AppState = Arc<E2b>;

impl E2b {
    /// The `envdAccessToken` of a sandbox.
    fn token(&self, sandbox_id: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.secret);
        hasher.update(b"envd-access-token:");
        hasher.update(sandbox_id.as_bytes());
        hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The SDKs' signed-URL scheme for `/files`: `v1_` + base64(sha256(path:op:user:token[:exp])).
    fn signature(&self, sandbox_id: &str, path: &str, operation: &str, user: &str, expiration: Option<i64>) -> String {
        let mut material = format!("{path}:{operation}:{user}:{}", self.token(sandbox_id));
        if let Some(exp) = expiration {
            material.push_str(&format!(":{exp}"));
        }
        format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(material.as_bytes())))
    }

    /// Signed `/files` URLs carry no `E2b-Sandbox-Id` when opened by a browser or curl; the
    /// signature itself then says which sandbox it was made for.
    async fn sandbox_by_signature(&self, parts: &Parts) -> Option<String> {
        if parts.uri.path() != "/files" {
            return None;
        }
        let query = axum::extract::Query::<files::FilesQuery>::try_from_uri(&parts.uri).ok()?.0;
        let signature = query.signature.as_deref()?;
        let operation = if parts.method == axum::http::Method::GET { "read" } else { "write" };
        let running = self.manager.list(vec![crate::db::State::Running], &Default::default()).await.ok()?;
        running.into_iter().map(|info| info.id).find(|id| {
            let expected = self.signature(id, query.path.as_deref().unwrap_or(""), operation, query.username.as_deref().unwrap_or(""), query.signature_expiration);
            constant_time_eq(signature.as_bytes(), expected.as_bytes())
        })
    }
}

pub fn router(manager: Arc<Manager>, keys: Arc<ApiKeys>, interpreters: Arc<Interpreters>) -> Router {
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    let state = Arc::new(E2b { manager, keys, interpreters, watchers: filesystem::Watchers::default(), secret });
    let control = Router::new()
        .route("/sandboxes", post(control::create).get(control::list_v1))
        .route("/v2/sandboxes", post(control::create).get(control::list_v2))
        .route("/sandboxes/{id}", get(control::get_info).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/resume", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/snapshots", post(snapshot::create))
        .route("/sandboxes/{id}/fork", post(snapshot::fork))
        .route("/templates/{id}", axum::routing::delete(snapshot::delete))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), require_api_key));
    let sandbox = Router::new()
        .route("/health", get(health))
        // Uploads stream to the agent, so they need no size limit of their own.
        .route("/files", get(files::download).post(files::upload).layer(DefaultBodyLimit::disable()))
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem::rpc))
        .route("/execute", post(code::execute))
        .route("/contexts", post(code::create_context).get(code::list_contexts))
        .route("/contexts/{context}", delete(code::remove_context))
        .route("/contexts/{context}/restart", post(code::restart_context))
        .layer(DefaultBodyLimit::max(connect::MAX_MESSAGE));
    control.merge(sandbox).with_state(state)
}

/// The error body every E2B control-plane client parses: `{"code": <int>, "message"}`.
#[derive(Debug)]
pub struct RestError {
    status: StatusCode,
    message: String,
}

impl RestError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        RestError { status, message: message.into() }
    }
}

impl From<ApiError> for RestError {
    fn from(err: ApiError) -> Self {
        let status = match err.status {
            // The SDKs know 400, not 422, for a request they built wrong.
            StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
            // Retried by the SDK: only for what is really temporary.
            StatusCode::BAD_GATEWAY => StatusCode::INTERNAL_SERVER_ERROR,
            other => other,
        };
        RestError { status, message: err.message }
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

/// Control-plane authentication with the daemon's own API keys, sent as `X-API-KEY`.
async fn require_api_key(State(st): State<AppState>, request: Request, next: Next) -> Response {
    let presented = request.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
    match presented {
        Some(key) if st.keys.accepts(key) => next.run(request).await,
        _ => RestError::new(StatusCode::UNAUTHORIZED, "invalid or missing API key (X-API-KEY)").into_response(),
    }
}

/// `GET /health`: envd answers 204, the code interpreter 200. A dead sandbox is a 502 with
/// "was not found", which is how `is_running()` learns it is gone.
async fn health(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let Some(id) = header(&headers, "e2b-sandbox-id") else {
        return StatusCode::NO_CONTENT.into_response();
    };
    match st.manager.agent(id).await {
        Ok(_) if header(&headers, "e2b-sandbox-port") == Some(INTERPRETER_PORT) => Json("OK").into_response(),
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(_) => sandbox_not_found(id),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// What the upstream proxy answers for an unknown or dead sandbox; the SDKs look for
/// "was not found" and raise their "sandbox is not running" exception.
fn sandbox_not_found(id: &str) -> Response {
    let body = serde_json::json!({ "sandboxId": id, "message": "The sandbox was not found", "code": 502 });
    (StatusCode::BAD_GATEWAY, Json(body)).into_response()
}

fn unauthorized(message: &str) -> Response {
    (StatusCode::UNAUTHORIZED, Json(serde_json::json!({ "code": 401, "message": message }))).into_response()
}

/// A request routed to a running sandbox by `E2b-Sandbox-Id`.
pub struct Sandbox {
    pub id: String,
    pub mux: Mux,
    /// Whether the request carried the sandbox's access token (`/files` may instead be signed).
    pub authorized: bool,
    /// The user from `Authorization: Basic base64(user:)`, as envd reads it.
    pub user: Option<String>,
}

impl FromRequestParts<AppState> for Sandbox {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, Response> {
        let id = match header(&parts.headers, "e2b-sandbox-id") {
            Some(id) => id.to_owned(),
            None => match st.sandbox_by_signature(parts).await {
                Some(id) => id,
                None => {
                    let body = serde_json::json!({ "code": 400, "message": "missing E2b-Sandbox-Id header" });
                    return Err((StatusCode::BAD_REQUEST, Json(body)).into_response());
                }
            },
        };
        let mux = match st.manager.agent(&id).await {
            Ok(mux) => mux,
            Err(err) if err.status == StatusCode::NOT_FOUND || err.status == StatusCode::CONFLICT => {
                return Err(sandbox_not_found(&id));
            }
            Err(err) => return Err((err.status, Json(serde_json::json!({ "code": err.status.as_u16(), "message": err.message }))).into_response()),
        };
        let expected = st.token(&id);
        let presented = header(&parts.headers, "x-access-token").or_else(|| header(&parts.headers, "e2b-traffic-access-token"));
        let authorized = presented.is_some_and(|p| constant_time_eq(p.as_bytes(), expected.as_bytes()));
        Ok(Sandbox { id, mux, authorized, user: basic_user(&parts.headers) })
    }
}

impl Sandbox {
    /// Rejects requests without the access token (everything but signed `/files`).
    // The error is the HTTP answer itself, returned at once; boxing it would buy nothing.
    #[allow(clippy::result_large_err)]
    fn require_token(&self) -> Result<(), Response> {
        if self.authorized {
            Ok(())
        } else {
            Err(unauthorized("unauthorized access, please provide a valid access token"))
        }
    }
}

fn basic_user(headers: &HeaderMap) -> Option<String> {
    let value = header(headers, "authorization")?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.split(':').next().unwrap_or_default();
    (!user.is_empty()).then(|| user.to_owned())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
