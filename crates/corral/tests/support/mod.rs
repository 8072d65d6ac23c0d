//! Helpers for tests that run real sandboxes through the `corral` binary.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// One data dir per test process, under /tmp so sandbox root (an unprivileged host uid) can
/// traverse it.
pub fn data_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("corral-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create test data dir");
        dir
    })
}

pub fn corral() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
    command.env("CORRAL_DATA_DIR", data_dir());
    command
}

/// The result of one `corral run`.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Self {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// Runs `sh -c script` in a fresh sandbox with extra `corral run` flags.
pub fn sh_with(flags: &[&str], script: &str) -> Run {
    let mut command = corral();
    command.arg("run").args(flags).args(["--", "/bin/sh", "-c", script]);
    command.output().expect("run corral").into()
}

pub fn sh(script: &str) -> Run {
    sh_with(&[], script)
}

pub fn sh_root(script: &str) -> Run {
    sh_with(&["--user", "root"], script)
}

/// Runs Python code in a fresh sandbox.
pub fn python_with(flags: &[&str], code: &str) -> Run {
    let mut command = corral();
    command.arg("run").args(flags).args(["--", "/usr/bin/python3", "-c", code]);
    command.output().expect("run corral").into()
}

/// Calls a raw syscall as sandbox root and returns (return value, errno).
pub fn raw_syscall_as_root(nr: i64, args: &[u64]) -> (i64, i32) {
    let args = args.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
    let code = format!(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n\
         r = libc.syscall(ctypes.c_long({nr}), *[ctypes.c_ulong(a) for a in [{args}]])\nprint(r, ctypes.get_errno())"
    );
    let run = python_with(&["--user", "root"], &code);
    let mut parts = run.stdout.split_whitespace();
    let ret = parts.next().and_then(|p| p.parse().ok());
    let errno = parts.next().and_then(|p| p.parse().ok());
    match (ret, errno) {
        (Some(r), Some(e)) => (r, e),
        _ => panic!("syscall probe failed: {run:?}"),
    }
}

pub const EPERM: i32 = 1;
pub const ENOSYS: i32 = 38;

/// A `corral serve` started for one test file, on a free loopback port with its own data dir.
pub struct Daemon {
    child: std::process::Child,
    /// Extra environment for the daemon process, kept for restarts.
    env: Vec<(String, String)>,
    pub url: String,
    pub key: String,
    pub data_dir: PathBuf,
    pub client: reqwest::blocking::Client,
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with_env(&[])
    }

    /// [`Daemon::start`] with extra environment variables (e.g. `CORRAL_HIBERNATE_AFTER`).
    pub fn start_with_env(env: &[(&str, &str)]) -> Daemon {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let data_dir = std::env::temp_dir().join(format!("corral-daemon-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&data_dir).expect("data dir");
        let key = format!("crl_test_{}", std::process::id());
        let url = format!("http://127.0.0.1:{port}");
        let child = Self::spawn(&url, &key, &data_dir, &env);
        let client = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(60)).build().expect("client");
        let daemon = Daemon { child, env, url, key, data_dir, client };
        daemon.wait_ready();
        daemon
    }

    fn spawn(url: &str, key: &str, data_dir: &std::path::Path, env: &[(String, String)]) -> std::process::Child {
        Command::new(env!("CARGO_BIN_EXE_corral"))
            // Tests clean up by stopping the daemon; a test may ask for the default (keep).
            .env("CORRAL_KILL_SANDBOXES_ON_EXIT", "true")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .args(["serve", "--listen", url.trim_start_matches("http://"), "--data-dir"])
            .arg(data_dir)
            .env("CORRAL_API_KEY", key)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start daemon")
    }

    fn wait_ready(&self) {
        for _ in 0..400 {
            if self.client.get(format!("{}/v1/health", self.url)).send().is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("daemon did not come up");
    }

    /// Kills the daemon with SIGKILL (no cleanup at all) and starts it again on the same
    /// port and data dir.
    pub fn crash_and_restart(&mut self) {
        self.crash();
        self.restart();
    }

    /// SIGTERM, and wait for the daemon to exit.
    pub fn stop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }

    /// SIGKILL, no cleanup.
    pub fn crash(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn restart(&mut self) {
        self.child = Self::spawn(&self.url, &self.key, &self.data_dir, &self.env);
        self.wait_ready();
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.url)).bearer_auth(&self.key)
    }

    pub fn get(&self, path: &str) -> reqwest::blocking::Response {
        self.request(reqwest::Method::GET, path).send().expect("GET")
    }

    pub fn post(&self, path: &str, body: serde_json::Value) -> reqwest::blocking::Response {
        self.request(reqwest::Method::POST, path).json(&body).send().expect("POST")
    }

    pub fn delete(&self, path: &str) -> reqwest::blocking::Response {
        self.request(reqwest::Method::DELETE, path).send().expect("DELETE")
    }

    /// Creates a sandbox and returns its id.
    pub fn create(&self, spec: serde_json::Value) -> String {
        let response = self.post("/v1/sandboxes", spec);
        assert_eq!(response.status(), 201, "create failed");
        let info: serde_json::Value = response.json().expect("json");
        info["id"].as_str().expect("id").to_string()
    }

    /// Runs a shell command and waits for its result.
    pub fn exec(&self, id: &str, cmd: &str) -> serde_json::Value {
        self.exec_with(id, serde_json::json!({ "cmd": cmd }))
    }

    pub fn exec_with(&self, id: &str, body: serde_json::Value) -> serde_json::Value {
        let response = self.post(&format!("/v1/sandboxes/{id}/exec?wait=true"), body);
        assert!(response.status().is_success(), "exec failed: {}", response.status());
        response.json().expect("json")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: the daemon destroys its sandboxes on the way out.
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
