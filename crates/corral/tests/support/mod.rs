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
