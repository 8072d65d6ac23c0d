//! End-to-end tests of the daemon over real HTTP, with a fake backend (see `support`).

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use corral_server::{bind, ListenAddr, ServerConfig};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{FakeBackend, FakeStats};

const KEY: &str = "crl_test_key";

struct TestServer {
    url: String,
    client: reqwest::Client,
    key: String,
    stats: Arc<FakeStats>,
    data_dir: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    async fn start(data_dir: &Path, api_key: Option<&str>) -> TestServer {
        let backend = FakeBackend::new();
        let stats = backend.stats.clone();
        let config = ServerConfig {
            listen: ListenAddr::Tcp("127.0.0.1:0".parse().expect("addr")),
            data_dir: data_dir.to_path_buf(),
            api_key: api_key.map(String::from),
            egress: Default::default(),
            pools: Vec::new(),
            destroy_on_exit: true,
        };
        let server = bind(config, Arc::new(backend)).await.expect("bind");
        let addr = server.local_addr().expect("tcp address");
        let key = server.generated_api_key().map(String::from).or(api_key.map(String::from)).unwrap_or_default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server.run_until(async { let _ = stopped.await; }).await.expect("serve");
        });
        TestServer {
            url: format!("http://{addr}"),
            client: reqwest::Client::new(),
            key,
            stats,
            data_dir: data_dir.to_path_buf(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
        }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.url)).bearer_auth(&self.key)
    }

    async fn json(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self.req(method, path);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        let value = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")) };
        (status, value)
    }

    async fn create(&self, body: Value) -> String {
        let (status, info) = self.json(reqwest::Method::POST, "/v1/sandboxes", Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{info}");
        info["id"].as_str().expect("id").to_string()
    }

    /// Runs an exec and returns its NDJSON events.
    async fn exec_events(&self, id: &str, body: Value) -> Vec<Value> {
        let resp = self.req(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec")).json(&body).send().await.expect("exec");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
        let text = resp.text().await.expect("body");
        text.lines().map(|l| serde_json::from_str(l).expect("ndjson line")).collect()
    }
}

use reqwest::Method;

async fn wait_for<F: Fn() -> Fut, Fut: std::future::Future<Output = bool>>(what: &str, f: F) {
    for _ in 0..100 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn auth_is_required_everywhere_but_health_and_keys_persist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), None).await;
    assert!(server.key.starts_with("crl_") && server.key.len() == 68, "generated key {}", server.key);

    let health = server.client.get(format!("{}/v1/health", server.url)).send().await.expect("health");
    assert_eq!(health.status(), StatusCode::OK);

    for auth in [None, Some("Bearer wrong"), Some("Basic abc")] {
        let mut req = server.client.get(format!("{}/v1/sandboxes", server.url));
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        let resp = req.send().await.expect("request");
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["code"], "unauthorized");
    }
    let via_header = server.client.get(format!("{}/v1/sandboxes", server.url)).header("x-api-key", &server.key).send().await.expect("x-api-key");
    assert_eq!(via_header.status(), StatusCode::OK);
    let (status, doc) = server.json(Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/sandboxes/{id}/exec"]["post"].is_object());

    // Only the hash is stored: a restart prints no new key and still accepts the old one.
    let key = server.key.clone();
    server.stop().await;
    let mut again = TestServer::start(dir.path(), None).await;
    assert!(again.key.is_empty(), "no new key on restart");
    again.key = key;
    let (status, _) = again.json(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, StatusCode::OK);
    again.stop().await;
}

#[tokio::test]
async fn create_list_filter_kill_and_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), Some(KEY)).await;

    let (status, info) = server
        .json(Method::POST, "/v1/sandboxes", Some(json!({"memory": "256M", "metadata": {"owner": "alice"}, "env": {"SECRET": "x"}, "timeout": 60})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{info}");
    let a = info["id"].as_str().expect("id").to_string();
    assert_eq!(a.len(), 20);
    assert_eq!(info["state"], "running");
    assert_eq!(info["template"], "base");
    assert_eq!(info["limits"]["memory"], 256 << 20);
    assert_eq!(info["timeout"], 60);
    assert!(info.get("env").is_none(), "env is never echoed");
    assert!(info["expires_at"].as_str().expect("expires").ends_with('Z'));
    assert_eq!(server.stats.last_env.lock().expect("lock").get("SECRET").map(String::as_str), Some("x"));
    assert!(dir.path().join("sandboxes").join(&a).is_dir());

    let b = server.create(json!({"metadata": {"owner": "bob"}})).await;

    let (_, list) = server.json(Method::GET, "/v1/sandboxes?metadata.owner=alice", None).await;
    let ids: Vec<&str> = list["sandboxes"].as_array().expect("list").iter().filter_map(|s| s["id"].as_str()).collect();
    assert_eq!(ids, vec![a.as_str()]);

    let (status, _) = server.json(Method::DELETE, &format!("/v1/sandboxes/{b}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = server.json(Method::DELETE, &format!("/v1/sandboxes/{b}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "kill is idempotent");
    let (_, killed) = server.json(Method::GET, &format!("/v1/sandboxes/{b}"), None).await;
    assert_eq!(killed["state"], "killed");
    assert_eq!(killed["end_reason"], "killed");
    assert!(!dir.path().join("sandboxes").join(&b).exists(), "run dir removed");

    let (_, running) = server.json(Method::GET, "/v1/sandboxes?state=running", None).await;
    assert_eq!(running["sandboxes"].as_array().expect("list").len(), 1);
    let (_, both) = server.json(Method::GET, "/v1/sandboxes?state=running,killed", None).await;
    assert_eq!(both["sandboxes"].as_array().expect("list").len(), 2);
    let (_, none) = server.json(Method::GET, "/v1/sandboxes?state=killed&metadata.owner=alice", None).await;
    assert_eq!(none["sandboxes"].as_array().expect("list").len(), 0);

    // Errors: always JSON with a code.
    let cases: Vec<(Method, String, Option<Value>, StatusCode, &str)> = vec![
        (Method::GET, "/v1/sandboxes/nope".into(), None, StatusCode::NOT_FOUND, "not_found"),
        (Method::DELETE, "/v1/sandboxes/nope".into(), None, StatusCode::NOT_FOUND, "not_found"),
        (Method::GET, "/v1/sandboxes?state=sleeping".into(), None, StatusCode::BAD_REQUEST, "bad_request"),
        (Method::POST, "/v1/sandboxes".into(), Some(json!({"memroy": "1G"})), StatusCode::BAD_REQUEST, "bad_request"),
        (Method::POST, "/v1/sandboxes".into(), Some(json!({"memory": "12Q"})), StatusCode::BAD_REQUEST, "bad_request"),
        (Method::POST, "/v1/sandboxes".into(), Some(json!({"memory": "1K"})), StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
        (Method::POST, "/v1/sandboxes".into(), Some(json!({"template": "missing"})), StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
        (Method::POST, format!("/v1/sandboxes/{b}/exec"), Some(json!({"argv": ["echo"]})), StatusCode::CONFLICT, "conflict"),
        (Method::POST, format!("/v1/sandboxes/{a}/exec"), Some(json!({"argv": []})), StatusCode::BAD_REQUEST, "bad_request"),
        (Method::POST, format!("/v1/sandboxes/{a}/exec"), Some(json!({"argv": ["missing"]})), StatusCode::NOT_FOUND, "not_found"),
        (Method::POST, format!("/v1/sandboxes/{a}/timeout"), Some(json!({"timeout": 0})), StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
        (Method::POST, format!("/v1/sandboxes/{a}/processes/x/signal"), Some(json!({"signal": 9})), StatusCode::BAD_REQUEST, "bad_request"),
        (Method::POST, format!("/v1/sandboxes/{a}/processes/1/signal"), Some(json!({"signal": "SIGBOGUS"})), StatusCode::BAD_REQUEST, "bad_request"),
        (Method::GET, "/v1/nothing".into(), None, StatusCode::NOT_FOUND, "not_found"),
    ];
    for (method, path, body, status, code) in cases {
        let (got, err) = server.json(method.clone(), &path, body).await;
        assert_eq!((got, err["code"].as_str()), (status, Some(code)), "{method} {path}: {err}");
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let raw = server.req(Method::POST, "/v1/sandboxes").body("{not json").send().await.expect("send");
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    assert_eq!(server.stats.live.load(Ordering::SeqCst), 1, "failed creates leak nothing");

    let (status, usage) = server.json(Method::GET, &format!("/v1/sandboxes/{a}/metrics"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(usage["memory_bytes"], 1024);

    // Timeout can be moved either way.
    let (status, moved) = server.json(Method::POST, &format!("/v1/sandboxes/{a}/timeout"), Some(json!({"timeout": "2h"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(moved["timeout"], 7200);
    assert!(moved["expires_at"].as_str() > info["expires_at"].as_str());
    server.stop().await;
    assert_eq!(server_stats_after_stop(&dir), 0);
}

fn server_stats_after_stop(dir: &tempfile::TempDir) -> usize {
    std::fs::read_dir(dir.path().join("sandboxes")).expect("sandboxes dir").count()
}

#[tokio::test]
async fn exec_streams_ndjson_sse_and_waits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let id = server.create(json!({})).await;

    let events = server.exec_events(&id, json!({"argv": ["echo", "hello", "world"]})).await;
    assert_eq!(events[0]["type"], "start");
    assert!(events[0]["pid"].is_u64());
    assert_eq!(events[1], json!({"type": "stdout", "data": "hello world\n"}));
    assert_eq!(events[2], json!({"type": "exit", "exit_code": 0, "signal": null, "reason": null}));

    let events = server.exec_events(&id, json!({"argv": ["fail"]})).await;
    assert_eq!(events[1], json!({"type": "stderr", "data": "boom\n"}));
    assert_eq!(events[2]["exit_code"], 3);

    let events = server.exec_events(&id, json!({"argv": ["binary"]})).await;
    assert_eq!(events[1], json!({"type": "stdout", "data_b64": "//5h"}));

    let events = server.exec_events(&id, json!({"argv": ["cat"], "stdin": "fed through stdin"})).await;
    assert_eq!(events[1]["data"], "fed through stdin");

    let events = server.exec_events(&id, json!({"cmd": "ls -la | wc -l"})).await;
    assert_eq!(events[1]["data"], "ls -la | wc -l\n");

    let events = server.exec_events(&id, json!({"argv": ["sleep"], "timeout": 0.2})).await;
    assert_eq!(events.last().expect("exit")["reason"], "timeout");
    assert_eq!(events.last().expect("exit")["signal"], 9);

    let (status, waited) = server.json(Method::POST, &format!("/v1/sandboxes/{id}/exec?wait=true"), Some(json!({"argv": ["fail"]}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(waited["stderr"], "boom\n");
    assert_eq!(waited["exit_code"], 3);
    assert_eq!(waited["truncated"], false);

    let sse = server
        .req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .header("accept", "text/event-stream")
        .json(&json!({"argv": ["echo", "sse"]}))
        .send()
        .await
        .expect("sse");
    assert!(sse.headers()["content-type"].to_str().expect("ct").starts_with("text/event-stream"));
    let text = sse.text().await.expect("sse body");
    assert!(text.contains("event: start"), "{text}");
    assert!(text.contains("event: stdout\ndata: {\"type\":\"stdout\",\"data\":\"sse\\n\"}"), "{text}");
    assert!(text.contains("event: exit"), "{text}");

    let (status, bg) = server.json(Method::POST, &format!("/v1/sandboxes/{id}/exec?wait=true"), Some(json!({"argv": ["sleep"], "background": true}))).await;
    assert_eq!(status, StatusCode::OK);
    let pid = bg["pid"].as_u64().expect("pid");
    let (_, procs) = server.json(Method::GET, &format!("/v1/sandboxes/{id}/processes"), None).await;
    assert!(procs["processes"].as_array().expect("procs").iter().any(|p| p["pid"] == pid), "background process survives: {procs}");
    let (status, _) = server.json(Method::POST, &format!("/v1/sandboxes/{id}/processes/{pid}/signal"), Some(json!({"signal": "SIGTERM"}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    server.stop().await;
}

#[tokio::test]
async fn exec_stdin_can_be_fed_later_and_hangup_kills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let id = server.create(json!({})).await;

    // stdin: true keeps stdin open; the client feeds it through /processes/{pid}/stdin.
    let resp = server.req(Method::POST, &format!("/v1/sandboxes/{id}/exec")).json(&json!({"argv": ["cat"], "stdin": true})).send().await.expect("exec");
    let mut body = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut lines = Vec::<Value>::new();
    let mut next_line = async || -> Value {
        loop {
            if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                return serde_json::from_slice(&line).expect("line");
            }
            buf.extend_from_slice(&body.next().await.expect("more output").expect("chunk"));
        }
    };
    let start = next_line().await;
    let pid = start["pid"].as_u64().expect("pid");
    let (status, _) = server.json(Method::POST, &format!("/v1/sandboxes/{id}/processes/{pid}/stdin"), Some(json!({"data": "typed"}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    lines.push(next_line().await);
    assert_eq!(lines[0]["data"], "typed", "output streams before exit");
    let (status, _) = server.json(Method::POST, &format!("/v1/sandboxes/{id}/processes/{pid}/stdin/close"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(next_line().await["type"], "exit");

    // Hanging up on a foreground exec kills it.
    let resp = server.req(Method::POST, &format!("/v1/sandboxes/{id}/exec")).json(&json!({"argv": ["sleep"]})).send().await.expect("exec");
    let mut stream = resp.bytes_stream();
    assert!(stream.next().await.is_some(), "start event");
    drop(stream);
    let stats = server.stats.clone();
    wait_for("the agent to see the hangup", || {
        let stats = stats.clone();
        async move { stats.killed_by_hangup.load(Ordering::SeqCst) == 1 }
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn files_stream_both_ways_and_map_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let id = server.create(json!({})).await;
    let files = format!("/v1/sandboxes/{id}/files");

    // 3 MiB in 64 KiB chunks: more than the mux window, so flow control is exercised.
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = data.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let resp = server
        .req(Method::PUT, &format!("{files}?path=/home/user/big.bin&mode=0600"))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect("put");
    assert_eq!(resp.status(), StatusCode::OK);
    let entry: Value = resp.json().await.expect("entry");
    assert_eq!(entry["size"], data.len());

    let resp = server.req(Method::GET, &format!("{files}?path=/home/user/big.bin")).send().await.expect("get");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.content_length(), Some(data.len() as u64));
    assert_eq!(resp.bytes().await.expect("bytes").as_ref(), data.as_slice());

    let (status, stat) = server.json(Method::GET, &format!("{files}/stat?path=/home/user/big.bin"), None).await;
    assert_eq!((status, stat["kind"].as_str()), (StatusCode::OK, Some("file")));
    let (_, list) = server.json(Method::GET, &format!("{files}/list?path=/home/user"), None).await;
    assert_eq!(list["entries"].as_array().expect("entries").len(), 1);
    let (status, _) = server.json(Method::POST, &format!("{files}/move"), Some(json!({"from": "/home/user/big.bin", "to": "/tmp/b"}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, dir_entry) = server.json(Method::POST, &format!("{files}/mkdir"), Some(json!({"path": "/tmp/d"}))).await;
    assert_eq!((status, dir_entry["kind"].as_str()), (StatusCode::OK, Some("dir")));
    let (status, _) = server.json(Method::DELETE, &format!("{files}?path=/tmp/b"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let (status, err) = server.json(Method::GET, &format!("{files}?path=/tmp/b"), None).await;
    assert_eq!((status, err["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (status, err) = server.json(Method::GET, &files, None).await;
    assert_eq!((status, err["code"].as_str()), (StatusCode::BAD_REQUEST, Some("bad_request")));
    let (status, err) = server.json(Method::PUT, &format!("{files}?path=/x&mode=999"), None).await;
    assert_eq!((status, err["code"].as_str()), (StatusCode::BAD_REQUEST, Some("bad_request")));

    // Refused before the upload is read: must answer, not wait for credit forever.
    let resp = server.req(Method::PUT, &format!("{files}?path=/readonly/f")).body(data.clone()).send().await.expect("put ro");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = server.req(Method::PUT, &format!("{files}?path=/full/f")).body(vec![1u8; 10]).send().await.expect("put full");
    assert_eq!(resp.status(), StatusCode::INSUFFICIENT_STORAGE);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["code"], "insufficient_storage");
    server.stop().await;
}

#[tokio::test]
async fn sandboxes_expire_and_dead_inits_are_released() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let short = server.create(json!({"timeout": 1})).await;
    let dies = server.create(json!({})).await;
    server.stats.kill_init(&dies);

    let url = "/v1/sandboxes?state=running";
    wait_for("expiry and exit", || async {
        let (_, list) = server.json(Method::GET, url, None).await;
        list["sandboxes"].as_array().is_some_and(|l| l.is_empty())
    })
    .await;
    let (_, expired) = server.json(Method::GET, &format!("/v1/sandboxes/{short}"), None).await;
    assert_eq!((expired["state"].as_str(), expired["end_reason"].as_str()), (Some("killed"), Some("timeout")));
    let (_, exited) = server.json(Method::GET, &format!("/v1/sandboxes/{dies}"), None).await;
    assert_eq!((exited["state"].as_str(), exited["end_reason"].as_str()), (Some("exited"), Some("exited")));
    assert_eq!(server.stats.live.load(Ordering::SeqCst), 0);
    assert_eq!(std::fs::read_dir(server.data_dir.join("sandboxes")).expect("dir").count(), 0);
    server.stop().await;
}

#[tokio::test]
async fn id_slots_are_reused_and_nothing_leaks_over_many_cycles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let a = server.create(json!({})).await;
    let _b = server.create(json!({})).await;
    server.json(Method::DELETE, &format!("/v1/sandboxes/{a}"), None).await;
    let _c = server.create(json!({})).await;
    assert_eq!(*server.stats.bases.lock().expect("lock"), vec![200_000, 265_536, 200_000]);

    for _ in 0..200 {
        let id = server.create(json!({})).await;
        let (status, _) = server.json(Method::POST, &format!("/v1/sandboxes/{id}/exec?wait=true"), Some(json!({"argv": ["echo"]}))).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = server.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    let bases = server.stats.bases.lock().expect("lock").clone();
    assert!(bases[3..].iter().all(|b| *b == 331_072), "the lowest free slot is always reused");
    assert_eq!(server.stats.live.load(Ordering::SeqCst), 2);
    assert_eq!(std::fs::read_dir(dir.path().join("sandboxes")).expect("dir").count(), 2);
    server.stop().await;
}

#[tokio::test]
async fn state_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let killed = server.create(json!({"metadata": {"k": "v"}})).await;
    server.json(Method::DELETE, &format!("/v1/sandboxes/{killed}"), None).await;
    server.stop().await;

    // Shutdown destroyed nothing else (there was nothing running); the record remains.
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let (_, info) = server.json(Method::GET, &format!("/v1/sandboxes/{killed}"), None).await;
    assert_eq!(info["state"], "killed");
    assert_eq!(info["metadata"]["k"], "v");
    let running = server.create(json!({})).await;
    server.stop().await;
    let server = TestServer::start(dir.path(), Some(KEY)).await;
    let (_, info) = server.json(Method::GET, &format!("/v1/sandboxes/{running}"), None).await;
    assert_eq!((info["state"].as_str(), info["end_reason"].as_str()), (Some("killed"), Some("shutdown")));
    server.stop().await;
}
