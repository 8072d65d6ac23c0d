//! Sandbox lifecycle routes.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use corral_spec::SandboxSpec;
use serde::Deserialize;

use super::{ApiJson, ApiPath, ApiQuery, AppState};
use crate::db::State as SandboxState;
use crate::error::ApiError;

/// Answers with `Server-Timing: create;dur=<ms>;desc="pool"|"cold"`: the time spent in the
/// manager, without HTTP parsing and serialization (what the warm-pool benchmark reads).
pub async fn create(State(m): State<AppState>, ApiJson(spec): ApiJson<SandboxSpec>) -> Result<impl IntoResponse, ApiError> {
    let started = std::time::Instant::now();
    let (info, pooled) = m.create_traced(spec).await?;
    let elapsed = started.elapsed();
    let source = if pooled { "pool" } else { "cold" };
    tracing::debug!(id = %info.id, source, elapsed_us = elapsed.as_micros() as u64, "sandbox created");
    let timing = format!("create;dur={:.3};desc=\"{source}\"", elapsed.as_secs_f64() * 1000.0);
    Ok((StatusCode::CREATED, [("server-timing", timing)], Json(info)))
}

/// `?state=running,killed&metadata.owner=alice`; all filters must match.
pub async fn list(State(m): State<AppState>, ApiQuery(params): ApiQuery<Vec<(String, String)>>) -> Result<impl IntoResponse, ApiError> {
    let mut states = Vec::new();
    let mut metadata = BTreeMap::new();
    for (key, value) in params {
        if key == "state" {
            for s in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                states.push(match s {
                    "running" => SandboxState::Running,
                    "paused" => SandboxState::Paused,
                    "killed" => SandboxState::Killed,
                    "exited" => SandboxState::Exited,
                    "pooled" => SandboxState::Pooled,
                    other => return Err(ApiError::bad_request(format!("unknown state {other:?}: use running, paused, killed, exited or pooled"))),
                });
            }
        } else if let Some(k) = key.strip_prefix("metadata.") {
            metadata.insert(k.to_string(), value);
        } else {
            return Err(ApiError::bad_request(format!("unknown query parameter {key:?}")));
        }
    }
    let sandboxes = m.list(states, &metadata).await?;
    Ok(Json(serde_json::json!({ "sandboxes": sandboxes })))
}

pub async fn get(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.get(&id).await?))
}

pub async fn kill(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    m.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Seconds as a number, or a duration string such as "5m".
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Seconds {
    Number(u64),
    Text(String),
}

impl Seconds {
    pub fn secs(&self) -> Result<u64, ApiError> {
        match self {
            Seconds::Number(n) => Ok(*n),
            Seconds::Text(t) => corral_spec::parse_duration(t)
                .map(|d| d.as_secs())
                .map_err(|e| ApiError::bad_request(e.to_string())),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutBody {
    timeout: Seconds,
}

pub async fn set_timeout(
    State(m): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<TimeoutBody>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.set_timeout(&id, body.timeout.secs()?).await?))
}

pub async fn metrics(State(m): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(m.usage(&id).await?))
}
