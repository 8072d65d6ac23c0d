//! Warm pools through the daemon's HTTP API: filling, hits with the request's own settings,
//! refills, fallback to cold creates, idle trimming, and what survives a restart.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::Daemon;

fn pool(daemon: &Daemon, template: &str) -> Value {
    let pools: Value = daemon.get("/v1/pools").json().expect("json");
    pools["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .find(|p| p["template"] == template)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Polls the pool until `check` holds; panics with the last state after `secs`.
fn wait_pool(daemon: &Daemon, template: &str, secs: u64, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let state = pool(daemon, template);
        if check(&state) {
            return state;
        }
        assert!(Instant::now() < deadline, "pool never reached the expected state: {state}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ready(state: &Value) -> u64 {
    state["ready"].as_u64().unwrap_or(0)
}

fn pooled_ids(daemon: &Daemon) -> Vec<String> {
    let list: Value = daemon.get("/v1/sandboxes?state=pooled").json().expect("json");
    list["sandboxes"].as_array().expect("array").iter().filter_map(|s| s["id"].as_str().map(String::from)).collect()
}

/// Creates and returns (id, the `desc` of its Server-Timing header: "pool" or "cold").
fn create_timed(daemon: &Daemon, spec: Value) -> (String, String) {
    let response = daemon.post("/v1/sandboxes", spec);
    assert_eq!(response.status(), 201);
    let timing = response.headers().get("server-timing").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let source = timing.split("desc=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or_default().to_string();
    let info: Value = response.json().expect("json");
    (info["id"].as_str().expect("id").to_string(), source)
}

/// SIGTERM and wait until the daemon stops answering (it destroys its sandboxes first).
fn stop_gracefully(daemon: &Daemon) {
    let status = std::process::Command::new("kill").arg(daemon.pid().to_string()).status().expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.client.get(format!("{}/v1/health", daemon.url)).send().is_ok() {
        assert!(Instant::now() < deadline, "daemon did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The listener closes before the process is gone; let it finish.
    std::thread::sleep(Duration::from_millis(500));
}

#[test]
fn pool_fills_to_min_and_a_hit_gets_the_requested_env_metadata_limits_and_timeout() {
    let daemon = Daemon::start_with_env(&[("CORRAL_POOLS", "base=2:3:60s")]);
    let state = wait_pool(&daemon, "base", 60, |p| ready(p) == 2);
    assert_eq!((state["min"].as_u64(), state["max"].as_u64(), state["hits"].as_u64()), (Some(2), Some(3), Some(0)), "{state}");
    // Pooled sandboxes are nobody's: not in the default list, visible when asked for.
    let listed: Value = daemon.get("/v1/sandboxes").json().expect("json");
    assert_eq!(listed["sandboxes"].as_array().map(Vec::len), Some(0), "{listed}");
    let waiting = pooled_ids(&daemon);
    assert_eq!(waiting.len(), 2);

    let (id, source) = create_timed(
        &daemon,
        json!({ "env": { "GREETING": "from-the-pool" }, "metadata": { "owner": "pools-test" }, "memory": "256M", "pids": 64, "timeout": 120 }),
    );
    assert_eq!(source, "pool");
    assert!(waiting.contains(&id), "the sandbox was not one of the pooled ones");
    let info: Value = daemon.get(&format!("/v1/sandboxes/{id}")).json().expect("json");
    assert_eq!(info["state"], "running");
    assert_eq!(info["metadata"]["owner"], "pools-test");
    assert_eq!(info["timeout"], 120);
    assert_eq!(info["limits"]["pids"], 64);
    let out = daemon.exec(&id, "echo $GREETING");
    assert_eq!(out["stdout"], "from-the-pool\n", "{out}");
    let metrics: Value = daemon.get(&format!("/v1/sandboxes/{id}/metrics")).json().expect("json");
    assert_eq!(metrics["memory_limit_bytes"].as_u64(), Some(256 << 20), "{metrics}");
    let listed: Value = daemon.get("/v1/sandboxes").json().expect("json");
    assert_eq!(listed["sandboxes"].as_array().map(Vec::len), Some(1), "{listed}");

    // Demand grows the pool to max; the refill is measured.
    let state = wait_pool(&daemon, "base", 60, |p| ready(p) == 3);
    assert_eq!(state["hits"], 1, "{state}");
    assert_eq!(state["misses"], 0, "{state}");
    assert!(state["refills"].as_u64().unwrap_or(0) >= 3, "{state}");
    assert!(state["refill_p50_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{state}");
    assert_eq!(daemon.delete(&format!("/v1/sandboxes/{id}")).status(), 204);
}

#[test]
fn empty_pool_falls_back_to_a_cold_create_and_unmatched_requests_skip_it() {
    let daemon = Daemon::start();
    let put = daemon.request(reqwest::Method::PUT, "/v1/pools/base").json(&json!({ "min": 0, "max": 0 })).send().expect("PUT");
    assert_eq!(put.status(), 200);
    let (id, source) = create_timed(&daemon, json!({ "env": { "X": "cold" } }));
    assert_eq!(source, "cold");
    assert_eq!(daemon.exec(&id, "echo $X")["stdout"], "cold\n");
    let state = pool(&daemon, "base");
    assert_eq!((state["hits"].as_u64(), state["misses"].as_u64()), (Some(0), Some(1)), "{state}");

    // A pooled sandbox's disk cannot change size: a request for another size starts cold.
    let put = daemon.request(reqwest::Method::PUT, "/v1/pools/base").json(&json!({ "min": 1, "max": 1 })).send().expect("PUT");
    assert_eq!(put.status(), 200);
    wait_pool(&daemon, "base", 60, |p| ready(p) == 1);
    let (_, source) = create_timed(&daemon, json!({ "disk": "64M" }));
    assert_eq!(source, "cold");
    let state = pool(&daemon, "base");
    assert_eq!((state["ready"].as_u64(), state["skipped"].as_u64(), state["misses"].as_u64()), (Some(1), Some(1), Some(1)), "{state}");
    // Bad configurations are refused.
    let bad = daemon.request(reqwest::Method::PUT, "/v1/pools/base").json(&json!({ "min": 3, "max": 1 })).send().expect("PUT");
    assert_eq!(bad.status(), 422);
    assert_eq!(daemon.delete("/v1/pools/base").status(), 204);
    assert_eq!(daemon.delete("/v1/pools/base").status(), 404);
    assert!(pooled_ids(&daemon).is_empty(), "deleting a pool destroys its sandboxes");
}

#[test]
fn pool_grows_under_demand_and_is_trimmed_back_to_min_when_idle() {
    let daemon = Daemon::start();
    let put = daemon.request(reqwest::Method::PUT, "/v1/pools/base").json(&json!({ "min": 1, "max": 3, "idle_secs": 2 })).send().expect("PUT");
    assert_eq!(put.status(), 200);
    wait_pool(&daemon, "base", 60, |p| ready(p) == 1);
    let (_, source) = create_timed(&daemon, json!({}));
    assert_eq!(source, "pool");
    wait_pool(&daemon, "base", 60, |p| ready(p) == 3);
    let state = wait_pool(&daemon, "base", 30, |p| ready(p) == 1 && p["starting"] == 0);
    assert_eq!(state["target"], 1, "{state}");
    // Trimmed sandboxes leave the queue first and are destroyed right after.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pooled_ids(&daemon).len() != 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(pooled_ids(&daemon).len(), 1);
}

#[test]
fn pool_config_survives_restarts_and_pooled_sandboxes_do_not() {
    let mut daemon = Daemon::start();
    let put = daemon.request(reqwest::Method::PUT, "/v1/pools/base").json(&json!({ "min": 1, "max": 2, "idle_secs": 30 })).send().expect("PUT");
    assert_eq!(put.status(), 200);
    wait_pool(&daemon, "base", 60, |p| ready(p) == 1);
    let before = pooled_ids(&daemon);

    stop_gracefully(&daemon);
    daemon.restart();
    let state = wait_pool(&daemon, "base", 60, |p| ready(p) == 1);
    assert_eq!((state["min"].as_u64(), state["max"].as_u64(), state["idle_secs"].as_u64()), (Some(1), Some(2), Some(30)), "{state}");
    let after = pooled_ids(&daemon);
    assert_eq!(after.len(), 1);
    assert!(before.iter().all(|id| !after.contains(id)), "pooled sandboxes are destroyed at shutdown");
    for id in &before {
        assert_eq!(daemon.get(&format!("/v1/sandboxes/{id}")).status(), 404);
    }

    // After a crash, the previous run's pooled sandboxes are cleaned up, not listed anywhere.
    daemon.crash_and_restart();
    wait_pool(&daemon, "base", 60, |p| ready(p) == 1);
    let fresh = pooled_ids(&daemon);
    assert_eq!(fresh.len(), 1);
    assert!(!fresh.contains(&after[0]));
    assert_eq!(daemon.get(&format!("/v1/sandboxes/{}", after[0])).status(), 404);
    assert!(!daemon.data_dir.join("sandboxes").join(&after[0]).exists(), "run dir left behind");
    let everything: Value = daemon.get("/v1/sandboxes?state=running,paused,killed,exited").json().expect("json");
    assert_eq!(everything["sandboxes"].as_array().map(Vec::len), Some(0), "{everything}");
}
