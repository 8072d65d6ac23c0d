//! The one error type handlers return; it always renders as `{"code", "message"}` JSON.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use corral_proto::{ErrorKind, MuxError};

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "missing or invalid API key")
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// An error the agent reported for a request.
    pub fn from_agent(kind: ErrorKind, message: String) -> Self {
        let (status, code) = match kind {
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
            ErrorKind::AlreadyExists => (StatusCode::CONFLICT, "conflict"),
            ErrorKind::NotADirectory | ErrorKind::IsADirectory => (StatusCode::CONFLICT, "conflict"),
            ErrorKind::InvalidArgument => (StatusCode::BAD_REQUEST, "bad_request"),
            ErrorKind::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage"),
            ErrorKind::Timeout => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            ErrorKind::Unsupported => (StatusCode::NOT_IMPLEMENTED, "unsupported"),
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        Self::new(status, code, message)
    }

    /// The connection to the agent failed; the sandbox may have just died.
    pub fn from_mux(err: MuxError) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "agent_error", format!("sandbox agent: {err}"))
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(err: crate::db::DbError) -> Self {
        tracing::error!(%err, "database error");
        ApiError::internal(format!("database: {err}"))
    }
}

#[derive(serde::Serialize)]
struct Body<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body { code: self.code, message: &self.message };
        (self.status, axum::Json(body)).into_response()
    }
}
