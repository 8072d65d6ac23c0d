//! The daemon as a user drives it over HTTP: real sandboxes, real agent, real API.

mod support;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use support::Daemon;

#[test]
fn create_exec_kill_lifecycle() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({ "metadata": { "owner": "test" }, "env": { "GREETING": "hi" } }));
    let result = daemon.exec(&id, "echo $GREETING from $(id -un); echo oops >&2; exit 3");
    assert_eq!(result["stdout"], "hi from user\n");
    assert_eq!(result["stderr"], "oops\n");
    assert_eq!(result["exit_code"], 3);

    let info: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}")).json().expect("json");
    assert_eq!(info["state"], "running");
    assert_eq!(info["metadata"]["owner"], "test");

    assert_eq!(daemon.delete(&format!("/v1/sandboxes/{id}")).status(), 204);
    let info: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}")).json().expect("json");
    assert_ne!(info["state"], "running");
    let response = daemon.post(&format!("/v1/sandboxes/{id}/exec?wait=true"), json!({ "cmd": "true" }));
    assert!(response.status() == 404 || response.status() == 409, "{}", response.status());
}

#[test]
fn exec_output_streams_before_the_command_exits() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({}));
    let response = daemon
        .request(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .json(&json!({ "cmd": "echo first; sleep 1; echo second" }))
        .send()
        .expect("exec");
    assert!(response.status().is_success());
    let start = Instant::now();
    let mut lines = BufReader::new(response).lines();
    let mut first_output_at = None;
    let mut events = Vec::new();
    for line in lines.by_ref() {
        let event: serde_json::Value = serde_json::from_str(&line.expect("line")).expect("event json");
        if event["type"] == "stdout" && first_output_at.is_none() {
            first_output_at = Some(start.elapsed());
        }
        events.push(event);
    }
    let first = first_output_at.expect("stdout event");
    assert!(first < Duration::from_millis(800), "first output arrived after {first:?}");
    assert_eq!(events.first().map(|e| e["type"].clone()), Some(json!("start")));
    assert_eq!(events.last().map(|e| e["type"].clone()), Some(json!("exit")));
}

#[test]
fn files_round_trip_large_binary_content() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({}));
    let data: Vec<u8> = (0..20 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let response = daemon
        .request(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/files?path=/home/user/big.bin"))
        .body(data.clone())
        .send()
        .expect("upload");
    assert!(response.status().is_success(), "{}", response.status());
    let result = daemon.exec(&id, "sha256sum /home/user/big.bin | cut -d' ' -f1; stat -c %U big.bin");
    let stdout = result["stdout"].as_str().expect("stdout").to_string();
    assert!(stdout.ends_with("user\n"), "{stdout}");
    let downloaded = daemon.get(&format!("/v1/sandboxes/{id}/files?path=/home/user/big.bin")).bytes().expect("download");
    assert_eq!(downloaded.len(), data.len());
    assert!(downloaded[..] == data[..]);

    let missing = daemon.get(&format!("/v1/sandboxes/{id}/files?path=/nope"));
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().expect("json error");
    assert!(body["code"].is_string() && body["message"].is_string());
}

#[test]
fn timeout_expiry_kills_and_releases_everything() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({ "timeout": 1 }));
    let run_dir = daemon.data_dir.join("sandboxes").join(&id);
    assert!(run_dir.exists());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}")).json().expect("json");
        if info["state"] != "running" {
            break;
        }
        assert!(Instant::now() < deadline, "sandbox outlived its timeout");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(!run_dir.exists(), "run dir leaked");
    assert!(cgroup_dirs_named(&id).is_empty(), "cgroups leaked: {:?}", cgroup_dirs_named(&id));
}

#[test]
fn bad_requests_get_clear_json_errors_and_change_nothing() {
    let daemon = Daemon::start();
    let unknown = daemon.get("/v1/sandboxes/doesnotexist");
    assert_eq!(unknown.status(), 404);
    let bad_json = daemon.request(reqwest::Method::POST, "/v1/sandboxes").header("content-type", "application/json").body("{not json").send().expect("post");
    assert_eq!(bad_json.status(), 400);
    let too_small = daemon.post("/v1/sandboxes", json!({ "memory": "1K" }));
    assert_eq!(too_small.status(), 422);
    let body: serde_json::Value = too_small.json().expect("json");
    assert!(body["message"].as_str().unwrap_or("").contains("memory"), "{body}");
    let unauthenticated = daemon.client.get(format!("{}/v1/sandboxes", daemon.url)).send().expect("get");
    assert_eq!(unauthenticated.status(), 401);
    let list: serde_json::Value = daemon.get("/v1/sandboxes?state=running").json().expect("json");
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0));
}

#[test]
fn list_filters_by_metadata_and_state() {
    let daemon = Daemon::start();
    let a = daemon.create(json!({ "metadata": { "team": "a" } }));
    let b = daemon.create(json!({ "metadata": { "team": "b" } }));
    let list: serde_json::Value = daemon.get("/v1/sandboxes?metadata.team=a").json().expect("json");
    let ids: Vec<&str> = list["sandboxes"].as_array().expect("array").iter().filter_map(|s| s["id"].as_str()).collect();
    assert_eq!(ids, [a.as_str()]);
    daemon.delete(&format!("/v1/sandboxes/{b}"));
    let running: serde_json::Value = daemon.get("/v1/sandboxes?state=running").json().expect("json");
    let ids: Vec<&str> = running["sandboxes"].as_array().expect("array").iter().filter_map(|s| s["id"].as_str()).collect();
    assert_eq!(ids, [a.as_str()]);
}

#[test]
fn many_create_kill_cycles_leak_nothing() {
    let daemon = Daemon::start();
    let cycles: usize = std::env::var("CORRAL_LEAK_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo").lines().count();
    let fds_before = open_fds(daemon.pid());
    for _ in 0..cycles {
        let id = daemon.create(json!({}));
        assert_eq!(daemon.delete(&format!("/v1/sandboxes/{id}")).status(), 204);
    }
    std::thread::sleep(Duration::from_millis(500));
    let leftovers: Vec<_> = std::fs::read_dir(daemon.data_dir.join("sandboxes")).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(leftovers.is_empty(), "run dirs leaked: {leftovers:?}");
    assert_eq!(std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo").lines().count(), mounts_before);
    let fds_after = open_fds(daemon.pid());
    assert!(fds_after <= fds_before + 8, "daemon fds grew from {fds_before} to {fds_after}");
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", daemon.pid(), daemon.pid())).unwrap_or_default();
    // Only the launcher (zygote) remains a child of the daemon.
    assert!(children.split_whitespace().count() <= 1, "daemon children left: {children}");
}

#[test]
fn sandboxes_survive_a_daemon_crash_and_are_re_attached() {
    let mut daemon = Daemon::start();
    let id = daemon.create(json!({ "metadata": { "keep": "me" } }));
    daemon.exec(&id, "echo precious > /home/user/state.txt");
    let started = daemon.exec_with(&id, json!({ "cmd": "sleep 300", "background": true, "tag": "sleeper" }));
    assert!(started["pid"].as_u64().is_some(), "{started}");
    daemon.crash_and_restart();
    let info: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}")).json().expect("json");
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(daemon.exec(&id, "cat /home/user/state.txt")["stdout"], "precious\n");
    let processes: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}/processes")).json().expect("json");
    let tags: Vec<&str> = processes["processes"].as_array().expect("array").iter().filter_map(|p| p["tag"].as_str()).collect();
    assert_eq!(tags, ["sleeper"], "{processes}");
    // A sandbox that dies while the daemon is down is reported, and its resources released.
    let doomed = daemon.create(json!({}));
    daemon.crash();
    let pids_dir = cgroup_dirs_named(&doomed).into_iter().find(|d| d.to_string_lossy().contains("/pids/")).expect("pids cgroup");
    let init = std::fs::read_to_string(pids_dir.join("cgroup.procs")).expect("procs");
    for pid in init.split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    std::thread::sleep(Duration::from_millis(300));
    daemon.restart();
    let info: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{doomed}")).json().expect("json");
    assert_eq!(info["state"], "exited", "{info}");
    assert!(cgroup_dirs_named(&doomed).is_empty());
    assert!(!daemon.data_dir.join("sandboxes").join(&doomed).exists());
}

#[test]
fn metrics_report_cpu_memory_and_pids_of_the_sandbox() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({ "memory": "256M" }));
    daemon.exec(&id, "python3 -c 'import time\nx = bytearray(32 << 20)\nend = time.time() + 0.5\nwhile time.time() < end: pass'");
    let metrics: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}/metrics")).json().expect("json");
    assert!(metrics["cpu_usage_usec"].as_u64().unwrap_or(0) >= 300_000, "{metrics}");
    assert_eq!(metrics["memory_limit_bytes"].as_u64(), Some(256 << 20), "{metrics}");
    assert!(metrics["memory_bytes"].as_u64().unwrap_or(0) > 0, "{metrics}");
    assert!(metrics["pids"].as_u64().unwrap_or(0) >= 1, "{metrics}");
}

#[test]
fn sandboxes_keep_running_through_a_graceful_daemon_restart() {
    let mut daemon = Daemon::start_with_env(&[("CORRAL_KILL_SANDBOXES_ON_EXIT", "false")]);
    let id = daemon.create(json!({}));
    daemon.exec(&id, "echo kept > /home/user/kept.txt");
    daemon.exec_with(&id, json!({ "cmd": "sleep 300", "background": true, "tag": "survivor" }));
    daemon.stop();
    assert!(!cgroup_dirs_named(&id).is_empty(), "the sandbox died with the daemon");
    daemon.restart();
    let info: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}")).json().expect("json");
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(daemon.exec(&id, "cat /home/user/kept.txt")["stdout"], "kept\n");
    let processes: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{id}/processes")).json().expect("json");
    assert!(processes.to_string().contains("survivor"), "{processes}");
    assert_eq!(daemon.delete(&format!("/v1/sandboxes/{id}")).status(), 204);
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Sandbox cgroup dirs with this id in any v1 hierarchy or the unified tree.
pub fn cgroup_dirs_named(id: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                if entry.file_name().to_string_lossy() == id {
                    found.push(path.clone());
                }
                if path.components().count() < 9 {
                    stack.push(path);
                }
            }
        }
    }
    found
}
