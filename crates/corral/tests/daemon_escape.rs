//! Escape attempts that go through the daemon: the file API, and a hostile sandbox trying to
//! take the daemon or its neighbours down.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::Daemon;

mod file_api {
    use super::*;

    #[test]
    fn dot_dot_traversal_in_an_upload_path_stays_inside_the_sandbox() {
        let daemon = Daemon::start();
        let id = daemon.create(json!({}));
        let host_target = format!("/tmp/corral-traversal-{}", std::process::id());
        let path = format!("/home/user/../../../../../../..{host_target}");
        let response = daemon
            .request(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", path.as_str())])
            .body("escaped?")
            .send()
            .expect("upload");
        assert!(response.status().is_success(), "{}", response.status());
        assert!(!std::path::Path::new(&host_target).exists(), "the upload reached the host");
        let inside = daemon.exec(&id, &format!("cat {host_target}"));
        assert_eq!(inside["stdout"], "escaped?");
    }

    #[test]
    fn absolute_symlink_to_a_host_secret_resolves_inside_the_sandbox() {
        let daemon = Daemon::start();
        let id = daemon.create(json!({}));
        daemon.exec(&id, "ln -s /etc/shadow /home/user/shadow");
        let response = daemon.get(&format!("/v1/sandboxes/{id}/files?path=/home/user/shadow"));
        assert_eq!(response.status(), 404, "the symlink reached a shadow file");
    }

    #[test]
    fn relative_symlink_climbing_out_resolves_inside_the_sandbox() {
        let daemon = Daemon::start();
        let id = daemon.create(json!({}));
        let db = daemon.data_dir.join("corral.db");
        daemon.exec(&id, &format!("ln -s ../../../../../../..{} /home/user/db", db.display()));
        let response = daemon.get(&format!("/v1/sandboxes/{id}/files?path=/home/user/db"));
        assert_eq!(response.status(), 404, "the symlink reached the daemon database");
    }

    #[test]
    fn symlink_as_upload_target_cannot_write_host_files() {
        let daemon = Daemon::start();
        let id = daemon.create(json!({}));
        let marker = std::env::temp_dir().join(format!("corral-symlink-target-{}", std::process::id()));
        std::fs::write(&marker, "original").expect("marker");
        daemon.exec(&id, &format!("ln -s {} /home/user/link", marker.display()));
        let _ = daemon
            .request(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/files?path=/home/user/link"))
            .body("overwritten")
            .send()
            .expect("upload");
        let content = std::fs::read_to_string(&marker).expect("read marker");
        let _ = std::fs::remove_file(&marker);
        assert_eq!(content, "original");
    }

    #[test]
    fn hard_links_cannot_reach_read_only_host_files() {
        let daemon = Daemon::start();
        let id = daemon.create(json!({ }));
        let result = daemon.exec_with(&id, json!({ "cmd": "ln /usr/bin/env /home/user/env-link", "user": "root" }));
        assert_ne!(result["exit_code"], 0, "{result}");
        assert!(result["stderr"].as_str().unwrap_or("").contains("Invalid cross-device link"), "{result}");
    }

    #[test]
    fn one_sandboxs_files_are_not_reachable_through_another_sandbox_id() {
        let daemon = Daemon::start();
        let a = daemon.create(json!({}));
        let b = daemon.create(json!({}));
        daemon.exec(&a, "echo secret-a > /home/user/only-in-a");
        let response = daemon.get(&format!("/v1/sandboxes/{b}/files?path=/home/user/only-in-a"));
        assert_eq!(response.status(), 404);
    }
}

mod neighbours {
    use super::*;

    /// Time for an exec round trip in a calm sandbox.
    fn probe(daemon: &Daemon, id: &str) -> Duration {
        let start = Instant::now();
        let result = daemon.exec(id, "echo ok");
        assert_eq!(result["stdout"], "ok\n");
        start.elapsed()
    }

    #[test]
    fn daemon_and_a_second_sandbox_keep_answering_during_fork_and_memory_bombs() {
        let daemon = Daemon::start();
        let hostile = daemon.create(json!({ "pids": 64, "memory": "128M", "cpus": 1 }));
        let calm = daemon.create(json!({}));
        let bomb = r#"
(while true; do python3 -c 'x = []
while True: x.append(bytearray(16 << 20))' ; done) &
f() { f | f & }; f
"#;
        let body = json!({ "cmd": bomb, "background": true });
        let started = daemon.post(&format!("/v1/sandboxes/{hostile}/exec?wait=true"), body);
        assert!(started.status().is_success(), "{}", started.status());
        std::thread::sleep(Duration::from_secs(1));
        let mut slowest = Duration::ZERO;
        for _ in 0..10 {
            slowest = slowest.max(probe(&daemon, &calm));
            assert_eq!(daemon.client.get(format!("{}/v1/health", daemon.url)).send().expect("health").status(), 200);
        }
        assert!(slowest < Duration::from_secs(2), "calm sandbox took {slowest:?}");
        let metrics: serde_json::Value = daemon.get(&format!("/v1/sandboxes/{hostile}/metrics")).json().expect("metrics");
        assert!(metrics["pids"].as_u64().unwrap_or(0) <= 64, "{metrics}");
        // The hostile sandbox is still manageable: it can be killed.
        assert_eq!(daemon.delete(&format!("/v1/sandboxes/{hostile}")).status(), 204);
        probe(&daemon, &calm);
    }
}
