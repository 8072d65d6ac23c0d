//! envd's `/files`: downloads, and uploads as multipart (one part per file), or as a raw
//! (optionally gzipped) octet stream. Contents stream through; nothing holds a whole file.

use std::io::Write as _;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral_proto::{Event, FileEntry, FileKind, Request as AgentRequest};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;

use super::{AppState, Sandbox};
use crate::agent_client::{first_answer, unexpected};
use crate::error::ApiError;
use crate::time::now_ms;

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct FilesQuery {
    pub path: Option<String>,
    pub username: Option<String>,
    pub signature: Option<String>,
    pub signature_expiration: Option<i64>,
}

/// envd's error body for `/files`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "code": status.as_u16(), "message": message.into() }))).into_response()
}

fn from_api(err: ApiError, path: &str) -> Response {
    match err.status {
        StatusCode::NOT_FOUND => error(StatusCode::NOT_FOUND, format!("path '{path}' does not exist")),
        StatusCode::CONFLICT => error(StatusCode::BAD_REQUEST, err.message),
        StatusCode::UNPROCESSABLE_ENTITY => error(StatusCode::BAD_REQUEST, err.message),
        status => error(status, err.message),
    }
}

/// The token header, or a URL signed with it: `v1_` + base64(sha256(path:op:user:token[:exp])).
// The error is the HTTP answer itself, returned at once; boxing it would buy nothing.
#[allow(clippy::result_large_err)]
fn check_access(st: &super::E2b, sandbox: &Sandbox, q: &FilesQuery, path: &str, operation: &str) -> Result<(), Response> {
    if sandbox.authorized {
        return Ok(());
    }
    let Some(signature) = q.signature.as_deref() else {
        return Err(super::unauthorized("unauthorized access, please provide a valid access token or signature"));
    };
    let user = q.username.as_deref().unwrap_or("");
    let expected = st.signature(&sandbox.id, path, operation, user, q.signature_expiration);
    if !super::constant_time_eq(signature.as_bytes(), expected.as_bytes()) {
        return Err(super::unauthorized("invalid signature"));
    }
    if q.signature_expiration.is_some_and(|exp| exp < now_ms() / 1000) {
        return Err(super::unauthorized("signature is already expired"));
    }
    Ok(())
}

fn user_of(sandbox: &Sandbox, q: &FilesQuery) -> Option<String> {
    q.username.clone().filter(|u| !u.is_empty()).or_else(|| sandbox.user.clone())
}

pub async fn download(State(st): State<AppState>, sandbox: Sandbox, Query(q): Query<FilesQuery>) -> Response {
    let path = q.path.clone().unwrap_or_default();
    if let Err(rejected) = check_access(&st, &sandbox, &q, &path, "read") {
        return rejected;
    }
    if path.is_empty() || path.contains('\0') {
        return error(StatusCode::BAD_REQUEST, "a valid path is required");
    }
    let request = AgentRequest::ReadFile { path: path.clone(), user: user_of(&sandbox, &q) };
    let (mut tx, mut rx) = match sandbox.mux.open(&request) {
        Ok(stream) => stream.split(),
        Err(e) => return from_api(ApiError::from_mux(e), &path),
    };
    if let Err(e) = tx.end() {
        return from_api(ApiError::from_mux(e), &path);
    }
    let entry = match first_answer(&mut rx).await {
        Ok(Event::Entry(entry)) => entry,
        Ok(other) => return from_api(unexpected(&other), &path),
        Err(err) => return from_api(err, &path),
    };
    if entry.kind == FileKind::Dir {
        return error(StatusCode::BAD_REQUEST, format!("path '{path}' is a directory"));
    }
    let body = Body::from_stream(crate::agent_client::file_data(rx));
    let disposition = format!("inline; filename=\"{}\"", entry.name.replace(['"', '\\', '\r', '\n'], "_"));
    let mut response = ([(CONTENT_TYPE, "application/octet-stream")], body).into_response();
    if let Ok(value) = disposition.parse() {
        response.headers_mut().insert(CONTENT_DISPOSITION, value);
    }
    if entry.kind == FileKind::File {
        response.headers_mut().insert(CONTENT_LENGTH, entry.size.into());
    }
    response
}

pub async fn upload(State(st): State<AppState>, sandbox: Sandbox, Query(q): Query<FilesQuery>, request: Request) -> Response {
    let query_path = q.path.clone().filter(|p| !p.is_empty());
    if let Err(rejected) = check_access(&st, &sandbox, &q, query_path.as_deref().unwrap_or(""), "write") {
        return rejected;
    }
    let user = user_of(&sandbox, &q);
    let content_type = request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    let result = if content_type.starts_with("multipart/form-data") {
        upload_multipart(&sandbox, query_path, user, request).await
    } else {
        upload_raw(&sandbox, query_path, user, request).await
    };
    match result {
        Ok(entries) => Json(entries).into_response(),
        Err(response) => response,
    }
}

fn written(entry: &FileEntry) -> serde_json::Value {
    json!({ "name": entry.name, "type": "file", "path": entry.path })
}

async fn upload_multipart(
    sandbox: &Sandbox,
    query_path: Option<String>,
    user: Option<String>,
    request: Request,
) -> Result<Vec<serde_json::Value>, Response> {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, m);
    let mut multipart = axum::extract::Multipart::from_request(request, &())
        .await
        .map_err(|e| bad(format!("invalid multipart upload: {e}")))?;
    let mut entries = Vec::new();
    while let Some(field) = multipart.next_field().await.map_err(|e| bad(format!("invalid multipart upload: {e}")))? {
        // The query path names a single file; several files carry theirs as part filenames.
        let path = match (&query_path, field.file_name()) {
            (Some(path), _) if entries.is_empty() => path.clone(),
            (_, Some(name)) if !name.is_empty() => name.to_owned(),
            _ => return Err(bad("every uploaded part needs a path (its filename)".into())),
        };
        let data = field.map(|chunk| chunk.map_err(|e| ApiError::bad_request(format!("reading the upload: {e}"))));
        let entry = write_file(sandbox, &path, user.clone(), data).await.map_err(|e| from_api(e, &path))?;
        entries.push(written(&entry));
    }
    if entries.is_empty() {
        return Err(bad("the upload contains no file".into()));
    }
    Ok(entries)
}

async fn upload_raw(
    sandbox: &Sandbox,
    query_path: Option<String>,
    user: Option<String>,
    request: Request,
) -> Result<Vec<serde_json::Value>, Response> {
    let Some(path) = query_path else {
        return Err(error(StatusCode::BAD_REQUEST, "the path query parameter is required for octet-stream uploads"));
    };
    let encoding = request.headers().get(CONTENT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("identity").trim().to_ascii_lowercase();
    let chunks = request.into_body().into_data_stream().map(|c| c.map_err(|e| ApiError::bad_request(format!("reading the upload: {e}"))));
    let entry = match encoding.as_str() {
        "" | "identity" => write_file(sandbox, &path, user, chunks).await,
        "gzip" | "x-gzip" => write_file(sandbox, &path, user, gunzip(chunks)).await,
        other => return Err(error(StatusCode::BAD_REQUEST, format!("unsupported Content-Encoding {other:?}"))),
    };
    entry.map(|e| vec![written(&e)]).map_err(|e| from_api(e, &path))
}

/// Decompresses as chunks arrive.
fn gunzip(chunks: impl Stream<Item = Result<Bytes, ApiError>> + Send + Unpin) -> impl Stream<Item = Result<Bytes, ApiError>> + Send + Unpin {
    let decoder = flate2::write::GzDecoder::new(Vec::new());
    Box::pin(futures::stream::unfold(Some((chunks, decoder)), |state| async move {
        let (mut chunks, mut decoder) = state?;
        let bad = |e: std::io::Error| ApiError::bad_request(format!("invalid gzip data: {e}"));
        match chunks.next().await {
            Some(Ok(chunk)) => match decoder.write_all(&chunk) {
                Ok(()) => {
                    let out = Bytes::from(std::mem::take(decoder.get_mut()));
                    Some((Ok(out), Some((chunks, decoder))))
                }
                Err(e) => Some((Err(bad(e)), None)),
            },
            Some(Err(e)) => Some((Err(e), None)),
            None => match decoder.finish() {
                Ok(rest) => Some((Ok(Bytes::from(rest)), None)),
                Err(e) => Some((Err(bad(e)), None)),
            },
        }
    }))
}

/// Streams `data` into a file through the agent, listening for an early refusal meanwhile.
async fn write_file(
    sandbox: &Sandbox,
    path: &str,
    user: Option<String>,
    data: impl Stream<Item = Result<Bytes, ApiError>> + Send + Unpin,
) -> Result<FileEntry, ApiError> {
    if path.contains('\0') {
        return Err(ApiError::bad_request("the path contains a NUL byte"));
    }
    let request = AgentRequest::WriteFile { path: path.to_owned(), user, mode: None, append: false };
    crate::agent_client::write_file(&sandbox.mux, &request, data).await
}
