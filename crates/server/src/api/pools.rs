//! Warm-pool routes: `GET /v1/pools`, `PUT/DELETE /v1/pools/{template}`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::{ApiJson, ApiPath, AppState};
use crate::error::ApiError;
use crate::pools::PoolConfig;

pub async fn list(State(m): State<AppState>) -> impl IntoResponse {
    Json(serde_json::json!({ "pools": m.pool_stats() }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolBody {
    min: u32,
    #[serde(default)]
    max: Option<u32>,
    #[serde(default)]
    idle_secs: Option<u64>,
}

/// Creates or changes the pool of `template`; stored, so it survives restarts.
pub async fn put(
    State(m): State<AppState>,
    ApiPath(template): ApiPath<String>,
    ApiJson(body): ApiJson<PoolBody>,
) -> Result<impl IntoResponse, ApiError> {
    let config = PoolConfig::new(&template, body.min, body.max, body.idle_secs).map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(Json(m.set_pool(config).await?))
}

/// Removes the pool; its ready sandboxes are destroyed.
pub async fn delete(State(m): State<AppState>, ApiPath(template): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    if m.delete_pool(&template).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no pool for template {template:?}")))
    }
}
