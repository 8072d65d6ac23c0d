//! Routes for sandboxes that keep their state: pause and resume, snapshots, rollback, fork.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;

use super::{ApiJson, ApiPath, ApiQuery, AppState};
use crate::error::ApiError;

pub async fn pause(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.pause(&id).await?))
}

pub async fn resume(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.resume(&id).await?))
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBody {
    #[serde(default)]
    name: Option<String>,
}

/// `POST /v1/sandboxes/{id}/snapshots`: the sandbox is held frozen while its layer is read.
pub async fn take_snapshot(
    State(m): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SnapshotBody>,
) -> Result<impl IntoResponse, ApiError> {
    let info = m.snapshot(&id, body.name).await?;
    Ok((axum::http::StatusCode::CREATED, Json(info)))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    sandbox: Option<String>,
}

pub async fn list_snapshots(State(m): State<AppState>, ApiQuery(q): ApiQuery<ListQuery>) -> Result<impl IntoResponse, ApiError> {
    let snapshots = m.snapshot_store().list(q.sandbox).await?;
    Ok(Json(serde_json::json!({ "snapshots": snapshots })))
}

pub async fn sandbox_snapshots(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    m.get(&id).await?;
    let snapshots = m.snapshot_store().list(Some(id)).await?;
    Ok(Json(serde_json::json!({ "snapshots": snapshots })))
}

pub async fn get_snapshot(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    match m.snapshot_store().get(&id).await? {
        Some(info) => Ok(Json(info)),
        None => Err(ApiError::not_found(format!("no snapshot {id:?}"))),
    }
}

pub async fn delete_snapshot(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    if m.snapshot_store().delete(&id).await? {
        Ok(axum::http::StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no snapshot {id:?}")))
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    snapshot: String,
}

/// `POST /v1/sandboxes/{id}/restore`: rollback in place (same id; processes restart).
pub async fn restore(
    State(m): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<RestoreBody>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.rollback(&id, &body.snapshot).await?))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    metadata: std::collections::BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

/// `POST /v1/sandboxes/{id}/fork`: `count` new sandboxes from its current state.
pub async fn fork(
    State(m): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForkBody>,
) -> Result<impl IntoResponse, ApiError> {
    let overrides = corral_spec::SandboxSpec { timeout: body.timeout, metadata: body.metadata, ..Default::default() };
    overrides.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
    let (snapshot, sandboxes) = m.fork(&id, body.count, overrides).await?;
    Ok((axum::http::StatusCode::CREATED, Json(serde_json::json!({ "snapshot": snapshot.id, "sandboxes": sandboxes }))))
}
