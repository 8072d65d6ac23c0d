//! The E2B control plane (`E2B_API_URL`): create, connect, info, list, kill, timeout, metrics.
//! Every call maps onto one [`Manager`](crate::manager::Manager) method.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral_spec::SandboxSpec;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{AppState, RestError, ENVD_VERSION};
use crate::db::State as SandboxState;
use crate::manager::SandboxInfo;
use crate::time::now_ms;

const CLIENT_ID: &str = "corral";
const MIB: u64 = 1024 * 1024;
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// `NewSandbox` (v1) and `NewSandboxV2`; fields corral has no use for are ignored.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
}

pub(super) fn body<T: for<'de> Deserialize<'de> + Default>(bytes: &[u8]) -> Result<T, RestError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

pub(super) fn sandbox_json(st: &super::E2b, info: &SandboxInfo) -> Value {
    let token = st.token(&info.id);
    json!({
        "templateID": info.template,
        "sandboxID": info.id,
        "alias": info.template,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": token,
        "domain": null,
    })
}

fn detail_json(info: &SandboxInfo) -> Value {
    json!({
        "templateID": info.template,
        "sandboxID": info.id,
        "alias": info.template,
        "clientID": CLIENT_ID,
        "startedAt": info.created_at,
        "endAt": info.expires_at,
        "envdVersion": ENVD_VERSION,
        "cpuCount": info.limits.cpus.ceil() as u64,
        "memoryMB": info.limits.memory.0 / MIB,
        "diskSizeMB": info.limits.disk.0 / MIB,
        "state": if info.state == SandboxState::Paused.as_str() { "paused" } else { "running" },
        "metadata": info.metadata,
    })
}

/// `POST /v2/sandboxes` (and v1 `/sandboxes`): answers exactly 201, as the SDK requires.
pub async fn create(State(st): State<AppState>, bytes: axum::body::Bytes) -> Result<Response, RestError> {
    let request: NewSandbox = body(&bytes)?;
    let template = request.template_id.filter(|t| !t.is_empty()).unwrap_or_else(|| corral_spec::DEFAULT_TEMPLATE.into());
    let mut env = request.env_vars.unwrap_or_default();
    // What envd puts in every sandbox's environment; user values win.
    env.entry("E2B_SANDBOX".into()).or_insert_with(|| "true".into());
    env.entry("E2B_TEMPLATE_ID".into()).or_insert_with(|| template.clone());
    // A snapshot id in place of a template: E2B's `Sandbox.create(snapshot_id)`.
    let (template, from_snapshot) = if super::snapshot::is_snapshot_id(&template) {
        (None, Some(template))
    } else {
        (Some(template), None)
    };
    let spec = SandboxSpec {
        template,
        from_snapshot,
        env,
        metadata: request.metadata.unwrap_or_default(),
        timeout: request.timeout.filter(|&t| t > 0),
        ..Default::default()
    };
    let info = st.manager.create(spec).await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&st, &info))).into_response())
}

/// A sandbox the E2B API may show (running or paused): E2B forgets sandboxes once they end.
pub(super) async fn running(st: &super::E2b, id: &str) -> Result<SandboxInfo, RestError> {
    match st.manager.get(id).await {
        Ok(info) if info.state == SandboxState::Running.as_str() || info.state == SandboxState::Paused.as_str() => Ok(info),
        Ok(_) | Err(_) => Err(RestError::new(StatusCode::NOT_FOUND, format!("sandbox \"{id}\" not found"))),
    }
}

pub async fn get_info(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, RestError> {
    Ok(Json(detail_json(&running(&st, &id).await?)))
}

pub async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, RestError> {
    running(&st, &id).await?;
    st.manager.kill(&id).await?;
    st.interpreters.forget(&id);
    st.watchers.forget_sandbox(&id);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct TimeoutBody {
    timeout: Option<u64>,
}

pub async fn set_timeout(State(st): State<AppState>, Path(id): Path<String>, bytes: axum::body::Bytes) -> Result<StatusCode, RestError> {
    let request: TimeoutBody = body(&bytes)?;
    running(&st, &id).await?;
    let Some(timeout) = request.timeout else {
        return Err(RestError::new(StatusCode::BAD_REQUEST, "timeout is required"));
    };
    st.manager.set_timeout(&id, timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `connect` (and the older `resume`): resumes a paused sandbox, extends its timeout (never
/// shortens it) and repeats the access token.
pub async fn connect(State(st): State<AppState>, Path(id): Path<String>, bytes: axum::body::Bytes) -> Result<Response, RestError> {
    let request: TimeoutBody = body(&bytes)?;
    let mut info = running(&st, &id).await?;
    if info.state == SandboxState::Paused.as_str() {
        info = match st.manager.resume(&id).await {
            Ok(info) => info,
            // Resumed by a concurrent call: fine, it runs.
            Err(err) if err.status == StatusCode::CONFLICT => running(&st, &id).await?,
            Err(err) => return Err(err.into()),
        };
    }
    let info = match request.timeout.filter(|&t| t > 0) {
        Some(timeout) => {
            let wanted_end = now_ms().saturating_add(timeout as i64 * 1000);
            let current_end = parse_rfc3339(&info.expires_at).unwrap_or(0);
            if wanted_end > current_end {
                st.manager.set_timeout(&id, timeout).await?
            } else {
                info
            }
        }
        None => info,
    };
    Ok((StatusCode::OK, Json(sandbox_json(&st, &info))).into_response())
}

/// Freezes the sandbox in place (memory kept); 409 when it is already paused, as E2B answers.
pub async fn pause(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, RestError> {
    running(&st, &id).await?;
    st.manager.pause(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct MetricsQuery {
    #[allow(dead_code)]
    start: Option<i64>,
    #[allow(dead_code)]
    end: Option<i64>,
}

/// One sample, now: corral keeps no history. CPU is the average since the sandbox started.
pub async fn metrics(State(st): State<AppState>, Path(id): Path<String>, Query(_q): Query<MetricsQuery>) -> Result<Json<Value>, RestError> {
    let info = running(&st, &id).await?;
    let usage = st.manager.usage(&id).await?;
    let now = now_ms();
    let started = parse_rfc3339(&info.created_at).unwrap_or(now);
    let elapsed_us = ((now - started).max(1) as f64) * 1000.0;
    let cpu_pct = (usage.cpu_usage_usec as f64 / (elapsed_us * info.limits.cpus.max(0.01)) * 100.0).clamp(0.0, 100.0);
    let mem_total = if usage.memory_limit_bytes > 0 { usage.memory_limit_bytes } else { info.limits.memory.0 };
    Ok(Json(json!([{
        "timestamp": crate::time::rfc3339(now),
        "timestampUnix": now / 1000,
        "cpuCount": info.limits.cpus.ceil() as u64,
        "cpuUsedPct": cpu_pct,
        "memUsed": usage.memory_bytes,
        "memTotal": mem_total,
        "memCache": 0,
        "diskUsed": 0,
        "diskTotal": info.limits.disk.0,
    }])))
}

/// Filters shared by both list versions.
struct ListFilter {
    metadata: BTreeMap<String, String>,
    /// Running and/or paused; both when the client names no state.
    states: Vec<SandboxState>,
    limit: usize,
    offset: usize,
    descending: bool,
}

fn parse_filter(params: &[(String, String)]) -> Result<ListFilter, RestError> {
    let bad = |m: String| RestError::new(StatusCode::BAD_REQUEST, m);
    let mut filter = ListFilter { metadata: BTreeMap::new(), states: Vec::new(), limit: DEFAULT_PAGE, offset: 0, descending: true };
    let mut states = Vec::new();
    for (key, value) in params {
        match key.as_str() {
            // `k=v&k2=v2` with each key and value percent-encoded inside.
            "metadata" | "query" => {
                for pair in value.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    filter.metadata.insert(percent_decode(k), percent_decode(v));
                }
            }
            "state" => states.extend(value.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())),
            "limit" => {
                let limit: usize = value.parse().map_err(|_| bad(format!("invalid limit {value:?}")))?;
                filter.limit = limit.clamp(1, MAX_PAGE);
            }
            "nextToken" => filter.offset = value.parse().map_err(|_| bad(format!("invalid nextToken {value:?}")))?,
            "order" => filter.descending = !value.eq_ignore_ascii_case("asc"),
            _ => {}
        }
    }
    let wants = |name: &str| states.is_empty() || states.iter().any(|s| s == name);
    if wants("running") {
        filter.states.push(SandboxState::Running);
    }
    if wants("paused") {
        filter.states.push(SandboxState::Paused);
    }
    Ok(filter)
}

async fn listed(st: &super::E2b, filter: &ListFilter) -> Result<Vec<SandboxInfo>, RestError> {
    if filter.states.is_empty() {
        return Ok(Vec::new());
    }
    let mut all = st.manager.list(filter.states.clone(), &filter.metadata).await?;
    all.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
    if filter.descending {
        all.reverse();
    }
    Ok(all)
}

/// `GET /v2/sandboxes`: one page; `X-Next-Token` names the next.
pub async fn list_v2(State(st): State<AppState>, Query(params): Query<Vec<(String, String)>>) -> Result<Response, RestError> {
    let filter = parse_filter(&params)?;
    let all = listed(&st, &filter).await?;
    let page: Vec<Value> = all.iter().skip(filter.offset).take(filter.limit).map(detail_json).collect();
    let next = filter.offset.saturating_add(filter.limit);
    let mut response = Json(Value::Array(page)).into_response();
    if next < all.len() {
        if let Ok(value) = HeaderValue::from_str(&next.to_string()) {
            response.headers_mut().insert("x-next-token", value);
        }
    }
    Ok(response)
}

/// `GET /sandboxes` (older SDKs): everything at once.
pub async fn list_v1(State(st): State<AppState>, headers: HeaderMap, Query(params): Query<Vec<(String, String)>>) -> Result<Response, RestError> {
    let _ = headers;
    let mut filter = parse_filter(&params)?;
    filter.limit = usize::MAX;
    let all = listed(&st, &filter).await?;
    Ok(Json(Value::Array(all.iter().map(detail_json).collect())).into_response())
}

/// Reads back what `crate::time::rfc3339` wrote (`2024-05-01T12:34:56.789Z`) as epoch ms.
fn parse_rfc3339(s: &str) -> Option<i64> {
    let num = |range: std::ops::Range<usize>| s.get(range).and_then(|t| t.parse::<i64>().ok());
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let millis = num(20..23).unwrap_or(0);
    // Howard Hinnant's days-from-civil.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec) * 1000) + millis)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_is_decoded_twice_over() {
        let params = vec![("metadata".to_string(), "user%20id=a%26b&k=v".to_string()), ("state".into(), "paused".into())];
        let filter = parse_filter(&params).expect("filter");
        assert_eq!(filter.metadata.get("user id").map(String::as_str), Some("a&b"));
        assert_eq!(filter.metadata.get("k").map(String::as_str), Some("v"));
        assert_eq!(filter.states, vec![SandboxState::Paused]);
        let only_other = parse_filter(&[("state".into(), "snapshotting".into())]).expect("filter");
        assert!(only_other.states.is_empty());
        assert!(parse_filter(&[("limit".into(), "x".into())]).is_err());
        assert_eq!(percent_decode("%zz%41"), "%zzA");
        for ms in [0, 951_782_400_123, 1_700_000_000_000] {
            assert_eq!(parse_rfc3339(&crate::time::rfc3339(ms)), Some(ms));
        }
    }
}
