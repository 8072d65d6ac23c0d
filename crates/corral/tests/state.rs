//! Sandboxes that keep their state: pause/resume, snapshots, rollback, fork, pools, and all of
//! it across daemon crashes. Real sandboxes through the daemon's HTTP API.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::Daemon;

fn info(daemon: &Daemon, id: &str) -> Value {
    daemon.get(&format!("/v1/sandboxes/{id}")).json().expect("json")
}

fn metrics(daemon: &Daemon, id: &str) -> Value {
    daemon.get(&format!("/v1/sandboxes/{id}/metrics")).json().expect("json")
}

/// POSTs and returns (status, body, how long the call took).
fn timed_post(daemon: &Daemon, path: &str, body: Value) -> (u16, Value, Duration) {
    let start = Instant::now();
    let response = daemon.post(path, body);
    let elapsed = start.elapsed();
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null), elapsed)
}

/// CPU time (clock ticks) of every process in the sandbox, read on the host from /proc: the
/// sandbox's own accounting may be absent (v1 hosts with cpuacct mounted apart from cpu).
fn cpu_ticks(id: &str) -> u64 {
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    let mut procs = None;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                if entry.file_name().to_string_lossy() == id && path.join("cgroup.procs").exists() {
                    procs = Some(path.join("cgroup.procs"));
                }
                if path.components().count() < 9 {
                    stack.push(path);
                }
            }
        }
    }
    let pids = std::fs::read_to_string(procs.expect("sandbox cgroup")).expect("procs");
    pids.split_whitespace()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command name (which may contain spaces) in parentheses.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

fn tags(daemon: &Daemon, id: &str) -> Vec<String> {
    let processes: Value = daemon.get(&format!("/v1/sandboxes/{id}/processes")).json().expect("json");
    processes["processes"].as_array().expect("array").iter().filter_map(|p| p["tag"].as_str().map(String::from)).collect()
}

#[test]
fn pause_stops_cpu_keeps_memory_and_processes_and_resume_is_fast() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({ "memory": "256M" }));
    let spin = "x = bytearray(64 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nwhile True: pass";
    let started = daemon.exec_with(&id, json!({ "argv": ["python3", "-c", spin], "background": true, "tag": "spinner" }));
    assert!(started["pid"].as_u64().is_some(), "{started}");
    std::thread::sleep(Duration::from_millis(700));
    let before = metrics(&daemon, &id);
    assert!(before["memory_bytes"].as_u64().unwrap_or(0) > 64 << 20, "{before}");

    let (status, body, pause_took) = timed_post(&daemon, &format!("/v1/sandboxes/{id}/pause"), json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "paused");
    assert_eq!(info(&daemon, &id)["state"], "paused");
    // Pausing twice is a conflict; requests to the agent are refused, not left hanging.
    assert_eq!(daemon.post(&format!("/v1/sandboxes/{id}/pause"), json!({})).status(), 409);
    assert_eq!(daemon.post(&format!("/v1/sandboxes/{id}/exec?wait=true"), json!({ "cmd": "true" })).status(), 409);

    let cpu_start = cpu_ticks(&id);
    std::thread::sleep(Duration::from_millis(600));
    let paused = metrics(&daemon, &id);
    let burned = cpu_ticks(&id) - cpu_start;
    assert!(burned <= 1, "a paused sandbox used {burned} ticks of CPU in 600ms");
    assert!(paused["memory_bytes"].as_u64().unwrap_or(0) > 64 << 20, "memory released while paused: {paused}");

    let (status, body, resume_took) = timed_post(&daemon, &format!("/v1/sandboxes/{id}/resume"), json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "running");
    eprintln!("pause took {pause_took:?}, resume took {resume_took:?}");
    assert!(resume_took < Duration::from_millis(250), "resume took {resume_took:?}");
    assert!(pause_took < Duration::from_millis(250), "pause took {pause_took:?}");
    assert_eq!(tags(&daemon, &id), ["spinner"]);
    let cpu_start = cpu_ticks(&id);
    std::thread::sleep(Duration::from_millis(300));
    let burned = cpu_ticks(&id) - cpu_start;
    assert!(burned >= 10, "the spinner did not run again after resume ({burned} ticks)");
    assert_eq!(daemon.post(&format!("/v1/sandboxes/{id}/resume"), json!({})).status(), 409);
    assert_eq!(daemon.exec(&id, "echo back")["stdout"], "back\n");
}

#[test]
fn paused_sandboxes_do_not_count_down_their_timeout_and_can_be_killed() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({ "timeout": 3 }));
    daemon.post(&format!("/v1/sandboxes/{id}/pause"), json!({}));
    std::thread::sleep(Duration::from_millis(4000));
    let paused = info(&daemon, &id);
    assert_eq!(paused["state"], "paused", "{paused}");
    assert!(paused["remaining_timeout"].as_u64().is_some_and(|s| (1..=3).contains(&s)), "{paused}");
    let (status, body, _) = timed_post(&daemon, &format!("/v1/sandboxes/{id}/resume"), json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(daemon.exec(&id, "echo alive")["stdout"], "alive\n");
    // The rest of its time runs out after the resume.
    std::thread::sleep(Duration::from_millis(4000));
    assert_eq!(info(&daemon, &id)["state"], "killed");

    let other = daemon.create(json!({}));
    daemon.post(&format!("/v1/sandboxes/{other}/pause"), json!({}));
    assert_eq!(daemon.delete(&format!("/v1/sandboxes/{other}")).status(), 204);
    assert_eq!(info(&daemon, &other)["state"], "killed");
    assert!(!daemon.data_dir.join("sandboxes").join(&other).exists());
}

#[test]
fn a_timeout_can_pause_instead_of_kill() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({ "timeout": 1, "on_timeout": "pause" }));
    daemon.exec(&id, "echo kept > /home/user/kept.txt");
    std::thread::sleep(Duration::from_millis(2500));
    let paused = info(&daemon, &id);
    assert_eq!(paused["state"], "paused", "{paused}");
    assert_eq!(paused["on_timeout"], "pause");
    daemon.post(&format!("/v1/sandboxes/{id}/resume"), json!({}));
    assert_eq!(daemon.exec(&id, "cat /home/user/kept.txt")["stdout"], "kept\n");
}

#[test]
fn paused_sandboxes_stay_paused_across_a_daemon_crash() {
    let mut daemon = Daemon::start();
    let id = daemon.create(json!({}));
    daemon.exec_with(&id, json!({ "cmd": "sleep 300", "background": true, "tag": "sleeper" }));
    daemon.post(&format!("/v1/sandboxes/{id}/pause"), json!({}));
    daemon.crash_and_restart();
    assert_eq!(info(&daemon, &id)["state"], "paused");
    let (status, body, _) = timed_post(&daemon, &format!("/v1/sandboxes/{id}/resume"), json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(tags(&daemon, &id), ["sleeper"]);
}

/// A template whose lower layer has files to delete and a dir to make opaque, so the layer
/// has real overlay whiteouts in it.
fn template_with_files(daemon: &Daemon) -> &'static str {
    let lower = daemon.data_dir.join("templates/statetest/lower");
    for (path, text) in [("opt/tpl/keep.txt", "original\n"), ("opt/tpl/gone.txt", "doomed\n"), ("srv/tree/old.txt", "old\n")] {
        let path = lower.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    use std::os::unix::fs::PermissionsExt;
    let mut dir = lower.clone();
    while dir != daemon.data_dir {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        dir.pop();
    }
    // Overlayfs copies a file up only if its owner is mapped in the sandbox: give the tree to
    // root of the first sandbox of a fresh daemon (id slot 0, host ids from 200000).
    for path in ["opt", "opt/tpl", "opt/tpl/keep.txt", "opt/tpl/gone.txt", "srv", "srv/tree", "srv/tree/old.txt"] {
        std::os::unix::fs::chown(lower.join(path), Some(200_000), Some(200_000)).expect("chown");
    }
    "statetest"
}

fn root(daemon: &Daemon, id: &str, script: &str) -> Value {
    daemon.exec_with(id, json!({ "cmd": script, "user": "root" }))
}

fn snapshot(daemon: &Daemon, id: &str) -> Value {
    let response = daemon.post(&format!("/v1/sandboxes/{id}/snapshots"), json!({ "name": "test" }));
    assert_eq!(response.status(), 201);
    response.json().expect("json")
}

#[test]
fn create_from_a_snapshot_restores_files_deletions_permissions_and_owners() {
    let daemon = Daemon::start();
    let template = template_with_files(&daemon);
    // The first sandbox of this daemon: it owns the template's files (see template_with_files).
    let id = daemon.create(json!({ "template": template, "env": { "FROM": "source" }, "metadata": { "k": "v" }, "disk": "256M" }));
    let setup = root(
        &daemon,
        &id,
        "set -e; rm /opt/tpl/gone.txt; echo changed > /opt/tpl/keep.txt; rm -rf /srv/tree; mkdir /srv/tree; echo new > /srv/tree/new.txt; \
         mkdir -p /opt/app; echo hello > /opt/app/a.txt; chown 1000:1000 /opt/app/a.txt; chmod 0640 /opt/app/a.txt; \
         ln -s ../app/a.txt /opt/app/link; ln /opt/app/a.txt /opt/app/hard; echo secret > /root/r.txt; chmod 600 /root/r.txt; \
         mkdir -m 0711 /opt/private; chown 1234:4321 /opt/private; head -c 5000000 /dev/urandom > /home/user/blob; chown user /home/user/blob; \
         sha256sum /home/user/blob | cut -c1-64",
    );
    assert_eq!(setup["exit_code"], 0, "{setup}");
    let blob_sum = setup["stdout"].as_str().expect("stdout").to_string();
    let snap = snapshot(&daemon, &id);
    assert!(snap["layer"].as_str().is_some_and(|l| l.len() == 64), "{snap}");
    assert!(snap["file_bytes"].as_u64().unwrap_or(0) >= 5_000_000, "{snap}");
    eprintln!("snapshot: {} entries, {} bytes compressed, frozen {} ms", snap["entries"], snap["layer_bytes"], snap["frozen_ms"]);
    // The source keeps running as it was.
    assert_eq!(daemon.exec(&id, "cat /opt/tpl/keep.txt")["stdout"], "changed\n");

    let source_hostname = root(&daemon, &id, "hostname")["stdout"].as_str().expect("stdout").trim().to_string();
    // The copy must get id slot 0 too, to own the template's files (see template_with_files).
    assert_eq!(daemon.delete(&format!("/v1/sandboxes/{id}")).status(), 204);
    let snap_id = snap["id"].as_str().expect("id");
    let copy = daemon.create(json!({ "from_snapshot": snap_id, "metadata": { "copy": "yes" } }));
    let check = root(
        &daemon,
        &copy,
        "test ! -e /opt/tpl/gone.txt && echo gone; cat /opt/tpl/keep.txt; ls /srv/tree; stat -c '%a %u %g' /opt/app/a.txt; \
         readlink /opt/app/link; stat -c %h /opt/app/a.txt; stat -c '%a %U' /root/r.txt; stat -c '%a %u %g' /opt/private; \
         sha256sum /home/user/blob | cut -c1-64; echo $FROM; hostname",
    );
    let lines: Vec<&str> = check["stdout"].as_str().expect("stdout").lines().collect();
    assert_eq!(
        lines[..10],
        ["gone", "changed", "new.txt", "640 1000 1000", "../app/a.txt", "2", "600 root", "711 1234 4321", blob_sum.trim(), "source"],
        "{check}"
    );
    assert_ne!(lines[10], source_hostname, "the copy kept the source's hostname");
    let copied = info(&daemon, &copy);
    assert_eq!(copied["template"], template);
    assert_eq!(copied["metadata"], json!({ "k": "v", "copy": "yes" }));

    let listed: Value = daemon.get(&format!("/v1/snapshots?sandbox={id}")).json().expect("json");
    assert_eq!(listed["snapshots"].as_array().map(Vec::len), Some(1));
    assert_eq!(daemon.get(&format!("/v1/snapshots/{snap_id}")).status(), 200);
    assert_eq!(daemon.delete(&format!("/v1/snapshots/{snap_id}")).status(), 204);
    assert_eq!(daemon.get(&format!("/v1/snapshots/{snap_id}")).status(), 404);
    let layers = std::fs::read_dir(daemon.data_dir.join("snapshots/layers")).expect("layers").count();
    assert_eq!(layers, 0, "the layer of the deleted snapshot is still stored");
}

#[test]
fn rollback_puts_a_sandbox_back_in_place() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({}));
    daemon.exec(&id, "echo v1 > /home/user/file");
    let snap = snapshot(&daemon, &id);
    daemon.exec(&id, "echo v2 > /home/user/file; touch /home/user/later; rm -f /etc/profile");
    let (status, body, took) = timed_post(&daemon, &format!("/v1/sandboxes/{id}/restore"), json!({ "snapshot": snap["id"] }));
    assert_eq!(status, 200, "{body}");
    eprintln!("rollback took {took:?}");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["state"], "running");
    let after = daemon.exec(&id, "cat /home/user/file; test -e /home/user/later && echo later; test -e /etc/profile && echo profile");
    assert_eq!(after["stdout"], "v1\nprofile\n", "{after}");
}

#[test]
fn forks_start_from_the_same_state_and_diverge() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({ "metadata": { "origin": "yes" } }));
    daemon.exec(&id, "echo shared > /home/user/common");
    let (status, body, took) = timed_post(&daemon, &format!("/v1/sandboxes/{id}/fork"), json!({ "count": 3 }));
    assert_eq!(status, 201, "{body}");
    eprintln!("fork into 3 took {took:?}");
    let forks: Vec<String> = body["sandboxes"].as_array().expect("array").iter().map(|s| s["id"].as_str().expect("id").to_string()).collect();
    assert_eq!(forks.len(), 3);
    for (i, fork) in forks.iter().enumerate() {
        assert_eq!(daemon.exec(fork, &format!("cat /home/user/common; echo {i} > /home/user/mine"))["stdout"], "shared\n");
    }
    for (i, fork) in forks.iter().enumerate() {
        assert_eq!(daemon.exec(fork, "cat /home/user/mine")["stdout"], format!("{i}\n"));
    }
    assert_eq!(daemon.exec(&id, "test -e /home/user/mine || echo untouched")["stdout"], "untouched\n");
}

fn code(daemon: &Daemon, id: &str, source: &str) -> Value {
    let response = daemon.post(&format!("/v1/sandboxes/{id}/code?wait=true"), json!({ "code": source }));
    assert!(response.status().is_success(), "{}", response.status());
    response.json().expect("json")
}

#[test]
fn interpreter_variables_survive_snapshots_and_unsaveable_ones_are_listed() {
    let daemon = Daemon::start();
    let id = daemon.create(json!({}));
    code(&daemon, &id, "import json\nanswer = 41\nrows = [{'a': i} for i in range(1000)]\nhandle = open('/etc/hostname')");
    let snap = snapshot(&daemon, &id);
    let context = &snap["interpreter"].as_array().expect("contexts").iter().find(|c| c["id"] == "default-python").cloned().expect("python context");
    let saved: Vec<&str> = context["saved"].as_array().expect("saved").iter().filter_map(Value::as_str).collect();
    assert!(saved.contains(&"answer") && saved.contains(&"rows") && saved.contains(&"json"), "{context}");
    assert_eq!(context["unsaved"][0]["name"], "handle", "{context}");
    assert!(context["unsaved"][0]["reason"].as_str().is_some_and(|r| !r.is_empty()));

    let copy = daemon.create(json!({ "from_snapshot": snap["id"] }));
    let result = code(&daemon, &copy, "answer + 1, len(rows), json.dumps(rows[2])");
    assert_eq!(result["text"], "(42, 1000, '{\"a\": 2}')", "{result}");
    // The source's own kernel kept its state too.
    assert_eq!(code(&daemon, &id, "answer")["text"], "41");
}

#[test]
fn snapshots_survive_a_daemon_crash() {
    let mut daemon = Daemon::start();
    let id = daemon.create(json!({}));
    daemon.exec(&id, "echo durable > /home/user/file");
    code(&daemon, &id, "kept = 'yes'");
    let snap = snapshot(&daemon, &id);
    daemon.crash_and_restart();
    let again: Value = daemon.get(&format!("/v1/snapshots/{}", snap["id"].as_str().expect("id"))).json().expect("json");
    assert_eq!(again["layer"], snap["layer"]);
    let copy = daemon.create(json!({ "from_snapshot": snap["id"] }));
    assert_eq!(daemon.exec(&copy, "cat /home/user/file")["stdout"], "durable\n");
    assert_eq!(code(&daemon, &copy, "kept")["text"], "'yes'");
}

#[test]
fn cli_pause_resume_snapshot_create_from_fork_and_rollback() {
    let daemon = Daemon::start();
    let cli = |args: &[&str]| -> String {
        let output = support::corral().args(args).env("CORRAL_URL", &daemon.url).env("CORRAL_API_KEY", &daemon.key).output().expect("corral");
        assert!(output.status.success(), "corral {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    let id = cli(&["create", "--on-timeout", "pause"]);
    daemon.exec(&id, "echo cli > /home/user/f");
    cli(&["pause", &id]);
    assert!(cli(&["ps"]).contains("paused"));
    cli(&["resume", &id]);
    let snap = cli(&["snapshot", &id]);
    assert!(cli(&["snapshots", "ls", "--sandbox", &id]).contains(&snap));
    let copy = cli(&["create", "--from", &snap]);
    assert_eq!(daemon.exec(&copy, "cat /home/user/f")["stdout"], "cli\n");
    let forks = cli(&["fork", &id, "-n", "2"]);
    assert_eq!(forks.lines().count(), 2);
    daemon.exec(&id, "rm /home/user/f");
    cli(&["rollback", &id, &snap]);
    assert_eq!(daemon.exec(&id, "cat /home/user/f")["stdout"], "cli\n");
    cli(&["snapshots", "rm", &snap]);
}

#[test]
fn long_paused_sandboxes_are_hibernated_and_resume_transparently() {
    let mut daemon = Daemon::start_with_env(&[("CORRAL_HIBERNATE_AFTER", "1s")]);
    let id = daemon.create(json!({ "metadata": { "h": "1" } }));
    daemon.exec(&id, "echo before > /home/user/f");
    code(&daemon, &id, "value = 'kept'");
    daemon.post(&format!("/v1/sandboxes/{id}/pause"), json!({}));
    // Released: no cgroup (hence no memory) left for it, and it is still listed as paused.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cpu_cgroup_gone(&id) {
        assert!(Instant::now() < deadline, "the paused sandbox was not hibernated");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(info(&daemon, &id)["state"], "paused");
    daemon.crash_and_restart();
    assert_eq!(info(&daemon, &id)["state"], "paused");
    let (status, body, took) = timed_post(&daemon, &format!("/v1/sandboxes/{id}/resume"), json!({}));
    assert_eq!(status, 200, "{body}");
    eprintln!("waking a hibernated sandbox took {took:?}");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(daemon.exec(&id, "cat /home/user/f")["stdout"], "before\n");
    assert_eq!(code(&daemon, &id, "value")["text"], "'kept'");
    assert_eq!(info(&daemon, &id)["metadata"]["h"], "1");
}

fn cpu_cgroup_gone(id: &str) -> bool {
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                if entry.file_name().to_string_lossy() == id {
                    return false;
                }
                if entry.path().components().count() < 9 {
                    stack.push(entry.path());
                }
            }
        }
    }
    true
}
