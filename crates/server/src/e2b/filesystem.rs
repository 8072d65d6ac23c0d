//! envd's `filesystem.Filesystem` service over the agent's file requests, including both
//! ways the SDKs watch directories: a server stream (`WatchDir`) and polled watchers
//! (`CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher`), whose events are buffered here.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use corral_proto::{Event, FileKind, FsEventKind, Message, Mux, Request, StreamReceiver, StreamSender};
use futures::Stream;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, lenient_u32, ConnectError, Item};
use super::entry::entry_info;
use super::{AppState, Sandbox};
use crate::agent_client;

/// Events a polled watcher keeps between polls; older ones are dropped.
const MAX_BUFFERED_EVENTS: usize = 10_000;
const MAX_WATCHERS: usize = 1024;
const WATCH_KEEPALIVE: Duration = Duration::from_secs(50);

#[derive(Deserialize, Default)]
#[serde(default)]
struct PathRequest {
    path: String,
    #[serde(deserialize_with = "lenient_u32")]
    depth: Option<u32>,
    recursive: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct MoveRequest {
    source: String,
    destination: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WatcherRequest {
    #[serde(alias = "watcher_id", rename = "watcherId")]
    watcher_id: String,
}

pub async fn rpc(State(st): State<AppState>, Path(method): Path<String>, sandbox: Sandbox, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(rejected) = sandbox.require_token() {
        return rejected;
    }
    let result = match method.as_str() {
        "Stat" => stat(&sandbox, connect::decode(&headers, &body)).await,
        "ListDir" => list_dir(&sandbox, connect::decode(&headers, &body)).await,
        "MakeDir" => make_dir(&sandbox, connect::decode(&headers, &body)).await,
        "Remove" => remove(&sandbox, connect::decode(&headers, &body)).await,
        "Move" => rename(&sandbox, connect::decode(&headers, &body)).await,
        "WatchDir" => watch_dir(&sandbox, connect::decode(&headers, &body)).await,
        "CreateWatcher" => create_watcher(&st, &sandbox, connect::decode(&headers, &body)).await,
        "GetWatcherEvents" => watcher_events(&st, &sandbox, connect::decode(&headers, &body)),
        "RemoveWatcher" => remove_watcher(&st, &sandbox, connect::decode(&headers, &body)),
        other => Err(ConnectError::new("unimplemented", format!("filesystem.Filesystem/{other} is not implemented"))),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

fn path_of(path: &str) -> Result<String, ConnectError> {
    if path.contains('\0') {
        return Err(ConnectError::invalid("the path contains a NUL byte"));
    }
    Ok(if path.is_empty() { "~".to_owned() } else { path.to_owned() })
}

async fn ask(mux: &Mux, request: Request) -> Result<Event, ConnectError> {
    Ok(agent_client::request(mux, &request).await?)
}

fn unexpected(event: &Event) -> ConnectError {
    agent_client::unexpected(event).into()
}

async fn stat_entry(sandbox: &Sandbox, path: &str) -> Result<corral_proto::FileEntry, ConnectError> {
    let path = path_of(path)?;
    match ask(&sandbox.mux, Request::Stat { path: path.clone(), user: sandbox.user.clone() }).await {
        Ok(Event::Entry(entry)) => Ok(entry),
        Ok(other) => Err(unexpected(&other)),
        Err(err) if err.code == "not_found" => Err(ConnectError::not_found(format!("path '{path}' does not exist"))),
        Err(err) => Err(err),
    }
}

async fn stat(sandbox: &Sandbox, request: Result<PathRequest, ConnectError>) -> Result<Response, ConnectError> {
    let entry = stat_entry(sandbox, &request?.path).await?;
    Ok(connect::unary(&json!({ "entry": entry_info(&entry) })))
}

async fn list_dir(sandbox: &Sandbox, request: Result<PathRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    let entry = stat_entry(sandbox, &request.path).await?;
    if entry.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!("path '{}' is not a directory", entry.path)));
    }
    let depth = request.depth.unwrap_or(1).clamp(1, 32);
    match ask(&sandbox.mux, Request::ListDir { path: entry.path, depth, user: sandbox.user.clone() }).await? {
        Event::Entries { entries } => {
            let entries: Vec<Value> = entries.iter().filter(|e| e.kind != FileKind::Other).map(entry_info).collect();
            Ok(connect::unary(&json!({ "entries": entries })))
        }
        other => Err(unexpected(&other)),
    }
}

async fn make_dir(sandbox: &Sandbox, request: Result<PathRequest, ConnectError>) -> Result<Response, ConnectError> {
    let path = path_of(&request?.path)?;
    match ask(&sandbox.mux, Request::MakeDir { path: path.clone(), user: sandbox.user.clone() }).await {
        Ok(Event::Entry(entry)) => Ok(connect::unary(&json!({ "entry": entry_info(&entry) }))),
        // The agent answers Ok, not an entry, when the directory was already there.
        Ok(Event::Ok) => Err(ConnectError::new("already_exists", format!("directory '{path}' already exists"))),
        Ok(other) => Err(unexpected(&other)),
        Err(err) if err.code == "already_exists" => Err(ConnectError::invalid(format!("path '{path}' exists and is not a directory"))),
        Err(err) => Err(err),
    }
}

async fn remove(sandbox: &Sandbox, request: Result<PathRequest, ConnectError>) -> Result<Response, ConnectError> {
    let path = path_of(&request?.path)?;
    match ask(&sandbox.mux, Request::Remove { path, user: sandbox.user.clone() }).await? {
        Event::Ok => Ok(connect::unary(&json!({}))),
        other => Err(unexpected(&other)),
    }
}

async fn rename(sandbox: &Sandbox, request: Result<MoveRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    let (from, to) = (path_of(&request.source)?, path_of(&request.destination)?);
    match ask(&sandbox.mux, Request::Rename { from, to, user: sandbox.user.clone() }).await? {
        Event::Entry(entry) => Ok(connect::unary(&json!({ "entry": entry_info(&entry) }))),
        other => Err(unexpected(&other)),
    }
}

fn event_type(kind: FsEventKind) -> &'static str {
    match kind {
        FsEventKind::Create => "EVENT_TYPE_CREATE",
        FsEventKind::Write => "EVENT_TYPE_WRITE",
        FsEventKind::Remove => "EVENT_TYPE_REMOVE",
        FsEventKind::Rename => "EVENT_TYPE_RENAME",
        FsEventKind::Chmod => "EVENT_TYPE_CHMOD",
    }
}

/// An agent watch that is in place, over the watched directory's absolute path.
struct AgentWatch {
    root: String,
    rx: StreamReceiver,
    /// Dropping our half ends the agent's watch, so it lives as long as the reader.
    _tx: StreamSender,
}

async fn open_watch(sandbox: &Sandbox, path: &str, recursive: bool) -> Result<AgentWatch, ConnectError> {
    let entry = stat_entry(sandbox, path).await?;
    if entry.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!("path '{}' is not a directory", entry.path)));
    }
    let request = Request::Watch { path: entry.path.clone(), recursive, user: sandbox.user.clone() };
    let (tx, mut rx) = sandbox.mux.open(&request).map_err(crate::error::ApiError::from_mux)?.split();
    match agent_client::first_answer(&mut rx).await? {
        Event::Ok => Ok(AgentWatch { root: entry.path, rx, _tx: tx }),
        other => Err(unexpected(&other)),
    }
}

impl AgentWatch {
    /// The next event as a `FilesystemEvent`, `None` when the watch ended.
    async fn next(&mut self) -> Option<Value> {
        loop {
            match self.rx.recv().await {
                Some(Ok(Message::Event(Event::FsEvent { kind, path }))) => {
                    let prefix = format!("{}/", self.root.trim_end_matches('/'));
                    let name = path.strip_prefix(&prefix).unwrap_or(&path);
                    return Some(json!({ "name": name, "type": event_type(kind) }));
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return None,
            }
        }
    }
}

async fn watch_dir(sandbox: &Sandbox, request: Result<PathRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    let watch = open_watch(sandbox, &request.path, request.recursive).await?;
    let start = futures::stream::iter([Item::Message(json!({ "start": {} }))]);
    Ok(connect::stream_response(futures::StreamExt::chain(start, watch_events(watch))))
}

fn watch_events(watch: AgentWatch) -> impl Stream<Item = Item> + Send + 'static {
    futures::stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        match tokio::time::timeout(WATCH_KEEPALIVE, watch.next()).await {
            Err(_) => Some((Item::Message(json!({ "keepalive": {} })), Some(watch))),
            Ok(Some(event)) => Some((Item::Message(json!({ "filesystem": event })), Some(watch))),
            Ok(None) => None,
        }
    })
}

/// Polled watchers: a task per watcher fills its buffer until it is removed.
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Polled>>,
}

struct Polled {
    sandbox_id: String,
    events: Arc<Mutex<VecDeque<Value>>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Polled {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Watchers {
    /// Drops the watchers of a sandbox that is gone.
    pub fn forget_sandbox(&self, sandbox_id: &str) {
        lock(&self.map).retain(|_, w| w.sandbox_id != sandbox_id);
    }
}

async fn create_watcher(st: &super::E2b, sandbox: &Sandbox, request: Result<PathRequest, ConnectError>) -> Result<Response, ConnectError> {
    let request = request?;
    if lock(&st.watchers.map).len() >= MAX_WATCHERS {
        return Err(ConnectError::new("resource_exhausted", "too many directory watchers"));
    }
    let mut watch = open_watch(sandbox, &request.path, request.recursive).await?;
    let events = Arc::new(Mutex::new(VecDeque::new()));
    let sink = events.clone();
    let task = tokio::spawn(async move {
        while let Some(event) = watch.next().await {
            let mut buffer = lock(&sink);
            if buffer.len() >= MAX_BUFFERED_EVENTS {
                buffer.pop_front();
            }
            buffer.push_back(event);
        }
    });
    let id = crate::auth::generate_key().split_off(4);
    let polled = Polled { sandbox_id: sandbox.id.clone(), events, task: task.abort_handle() };
    lock(&st.watchers.map).insert(id.clone(), polled);
    Ok(connect::unary(&json!({ "watcherId": id })))
}

fn watcher_events(st: &super::E2b, sandbox: &Sandbox, request: Result<WatcherRequest, ConnectError>) -> Result<Response, ConnectError> {
    let id = request?.watcher_id;
    let map = lock(&st.watchers.map);
    let Some(polled) = map.get(&id).filter(|w| w.sandbox_id == sandbox.id) else {
        return Err(ConnectError::not_found(format!("watcher {id:?} not found")));
    };
    let events: Vec<Value> = lock(&polled.events).drain(..).collect();
    Ok(connect::unary(&json!({ "events": events })))
}

fn remove_watcher(st: &super::E2b, sandbox: &Sandbox, request: Result<WatcherRequest, ConnectError>) -> Result<Response, ConnectError> {
    let id = request?.watcher_id;
    let mut map = lock(&st.watchers.map);
    match map.get(&id) {
        Some(w) if w.sandbox_id == sandbox.id => {
            map.remove(&id);
            Ok(connect::unary(&json!({})))
        }
        _ => Err(ConnectError::not_found(format!("watcher {id:?} not found"))),
    }
}
