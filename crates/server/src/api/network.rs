//! Egress routes: a sandbox's network policy and audit trail, and the secret store.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use corral_spec::NetworkPolicy;

use super::{ApiJson, ApiPath, AppState};
use crate::error::ApiError;
use crate::secrets::NewSecret;

pub async fn get(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.network(&id).await?))
}

/// Replaces `allow` and `deny`; connections opened afterwards follow the new lists.
pub async fn patch(
    State(m): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(policy): ApiJson<NetworkPolicy>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.set_network(&id, policy).await?))
}

/// Creates or replaces a secret. The answer never contains the value.
pub async fn create_secret(State(m): State<AppState>, ApiJson(secret): ApiJson<NewSecret>) -> Result<impl IntoResponse, ApiError> {
    Ok((StatusCode::CREATED, Json(m.secret_store().put(secret).await?)))
}

pub async fn list_secrets(State(m): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(serde_json::json!({ "secrets": m.secret_store().list().await? })))
}

pub async fn delete_secret(State(m): State<AppState>, ApiPath(name): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    if m.secret_store().delete(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no secret named {name:?}")))
    }
}
