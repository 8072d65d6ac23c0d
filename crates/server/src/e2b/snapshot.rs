//! E2B snapshots and forks: `create_snapshot`, `delete_snapshot`, `fork`, and creating a
//! sandbox whose template id is a snapshot id. Each maps onto the native snapshot service.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral_spec::SandboxSpec;
use serde::Deserialize;
use serde_json::{json, Value};

use super::control::{body, running, sandbox_json};
use super::{AppState, RestError};

/// Native snapshot ids double as E2B template ids.
pub fn is_snapshot_id(template: &str) -> bool {
    template.starts_with("snap-")
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct SnapshotRequest {
    name: Option<String>,
}

/// `POST /sandboxes/{id}/snapshots` → 201 `{snapshotID, names}`. Corral snapshots are always
/// filesystem (plus interpreter variables); process memory is not captured.
pub async fn create(State(st): State<AppState>, Path(id): Path<String>, bytes: axum::body::Bytes) -> Result<Response, RestError> {
    let request: SnapshotRequest = body(&bytes)?;
    running(&st, &id).await?;
    let snapshot = st.manager.snapshot(&id, request.name.filter(|n| !n.is_empty())).await?;
    let names: Vec<String> = snapshot.name.iter().cloned().collect();
    Ok((StatusCode::CREATED, Json(json!({ "snapshotID": snapshot.id, "names": names }))).into_response())
}

/// `DELETE /templates/{id}`: the SDK's `delete_snapshot`.
pub async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, RestError> {
    if !is_snapshot_id(&id) || !st.manager.snapshot_store().delete(&id).await? {
        return Err(RestError::new(StatusCode::NOT_FOUND, format!("template \"{id}\" not found")));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct ForkRequest {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork` → 201 `[{"sandbox": …}]`, one entry per fork.
pub async fn fork(State(st): State<AppState>, Path(id): Path<String>, bytes: axum::body::Bytes) -> Result<Response, RestError> {
    let request: ForkRequest = body(&bytes)?;
    running(&st, &id).await?;
    let overrides = SandboxSpec { timeout: request.timeout.filter(|&t| t > 0), ..Default::default() };
    let (_, forks) = st.manager.fork(&id, request.count.unwrap_or(1), overrides).await?;
    let entries: Vec<Value> = forks.iter().map(|info| json!({ "sandbox": sandbox_json(&st, info) })).collect();
    Ok((StatusCode::CREATED, Json(entries)).into_response())
}
