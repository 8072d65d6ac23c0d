//! `corral run`: one command in a fresh sandbox, no daemon. The sandbox init forks the command
//! with the caller's stdio, reaps everything, and exits with the command's status.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use corral_jail::native::{run_once_keeping, RunOutcome};
use corral_jail::{JailConfig, Volume, ID_RANGE, SANDBOX_HOME, SANDBOX_UID};
use corral_spec::{parse_duration, parse_env_pair, ByteSize, Limits, SandboxSpec};

/// Host id ranges for `corral run` sit above the daemon's so the two never share one.
const RUN_ID_BASE: u32 = 2_200_000_000;
const RUN_ID_SLOTS: u32 = 30_000;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral run -- python3 -c \"print('hello from a sandbox')\"\n  \
    corral run --memory 256M --timeout 10s -v /srv/data:/data:ro -- ls /data")]
pub struct RunArgs {
    /// Template the root filesystem is built from.
    #[arg(long, default_value = corral_spec::DEFAULT_TEMPLATE)]
    pub template: String,
    /// Memory limit (no swap), e.g. 512M or 2G.
    #[arg(long)]
    pub memory: Option<ByteSize>,
    /// CPU quota in cores, e.g. 0.5 or 2.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads.
    #[arg(long)]
    pub pids: Option<u32>,
    /// Size of the writable layer (the sandbox's disk quota).
    #[arg(long)]
    pub disk: Option<ByteSize>,
    /// Kill the sandbox after this long, e.g. 30s, 5m.
    #[arg(long)]
    pub timeout: Option<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox (default: the user's home).
    #[arg(short = 'w', long = "workdir")]
    pub workdir: Option<String>,
    /// Run as `user` (uid 1000, the default) or `root` (root of the sandbox only).
    #[arg(long, default_value = "user")]
    pub user: String,
    /// Mount a host directory: HOSTDIR:PATH or HOSTDIR:PATH:ro (repeatable).
    #[arg(short = 'v', long = "volume", value_name = "HOSTDIR:PATH[:ro]")]
    pub volumes: Vec<Volume>,
    /// Where corral keeps templates and state.
    #[arg(long, env = "CORRAL_DATA_DIR", default_value_os_t = crate::default_data_dir())]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub network: crate::run_egress::NetworkArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What the sandbox init runs.
struct Payload {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    uid: u32,
    /// Set when network flags were given; taken by the init.
    egress: std::sync::Mutex<Option<crate::run_egress::InitEgress>>,
}

pub fn run(args: RunArgs) -> Result<i32> {
    if !rustix::process::geteuid().is_root() {
        bail!("corral run needs root for now (it maps a private uid range for every sandbox)");
    }
    let mut env = BTreeMap::new();
    for pair in &args.env {
        let (k, v) = parse_env_pair(pair)?;
        env.insert(k, v);
    }
    let timeout = args.timeout.as_deref().map(parse_duration).transpose()?;
    let spec = SandboxSpec {
        template: Some(args.template.clone()),
        limits: Limits { cpus: args.cpus, memory: args.memory, disk: args.disk, pids: args.pids },
        env,
        volumes: args.volumes.clone(),
        ..Default::default()
    };
    let limits = spec.validate()?;
    let (uid, home) = match args.user.as_str() {
        "user" => (SANDBOX_UID, SANDBOX_HOME),
        "root" => (0, "/root"),
        other => bail!("unknown user {other:?}: use `user` or `root`"),
    };
    let id = format!("run-{:016x}", rand::random::<u64>());
    let (slot_lock, host_id_base) = reserve_id_range(&args.data_dir)?;
    let config = JailConfig {
        id: id.clone(),
        template: spec.template().to_string(),
        hostname: "sandbox".to_string(),
        limits,
        volumes: spec.volumes.clone(),
        run_dir: args.data_dir.join("run").join(&id),
        host_id_base,
    };
    let mut env = command_env(&spec.env, home, &args.user);
    let mut keep_fds = Vec::new();
    let egress = if args.network.enabled() {
        let host = crate::run_egress::HostEgress::start(&args.network, &id, &args.data_dir)?;
        keep_fds.push(std::os::fd::AsRawFd::as_raw_fd(&host.init.socket));
        // Proxy settings go under the caller's -e variables; placeholders over everything.
        let mut with_proxy = host.env.clone();
        with_proxy.extend(env);
        env = with_proxy;
        Some(host)
    } else {
        None
    };
    let (host_egress, init_egress) = match egress {
        Some(host) => {
            let (host, init) = host.split();
            (Some(host), Some(init))
        }
        None => (None, None),
    };
    let payload = Payload {
        argv: args.command.clone(),
        env,
        cwd: args.workdir.clone().unwrap_or_else(|| home.to_string()),
        uid,
        egress: std::sync::Mutex::new(init_egress),
    };
    let mut init = || init_main(&payload);
    let outcome = run_once_keeping(&config, &args.data_dir, timeout, keep_fds, &mut init);
    // The init's copy of the socket lives in the sandbox; ours must close for the helper to see EOF.
    drop(payload);
    if let Some(host) = host_egress {
        host.stop();
    }
    let outcome: RunOutcome = outcome.context("sandbox failed")?;
    drop(slot_lock);
    if let Some(reason) = outcome.reason {
        eprintln!("corral: {reason}");
    }
    Ok(outcome.code)
}

fn command_env(extra: &BTreeMap<String, String>, home: &str, user: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
    env.insert("HOME".to_string(), home.to_string());
    env.insert("USER".to_string(), user.to_string());
    env.insert("LANG".to_string(), "C.UTF-8".to_string());
    if let Ok(term) = std::env::var("TERM") {
        env.insert("TERM".to_string(), term);
    }
    env.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Picks a free host id range and holds it (by an flock) until the sandbox is gone.
fn reserve_id_range(data_dir: &Path) -> Result<(File, u32)> {
    let dir = data_dir.join("ids");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    for _ in 0..64 {
        let slot = rand::random::<u32>() % RUN_ID_SLOTS;
        let file = File::create(dir.join(format!("run-{slot}.lock")))?;
        if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Ok((file, RUN_ID_BASE + slot * ID_RANGE));
        }
    }
    bail!("no free id range for the sandbox; too many sandboxes running")
}

/// PID 1 of a `corral run` sandbox: start the command, reap every child, return its status.
fn init_main(payload: &Payload) -> i32 {
    let Some((program, rest)) = payload.argv.split_first() else { return 127 };
    let egress = payload.egress.lock().ok().and_then(|mut e| e.take());
    if let Some(egress) = egress {
        if let Err(err) = crate::run_egress::start_in_sandbox(egress) {
            eprintln!("corral: cannot set up egress in the sandbox: {err}");
            return 125;
        }
    }
    let mut command = Command::new(program);
    command.args(rest).env_clear().envs(&payload.env).current_dir(&payload.cwd);
    if payload.uid != 0 {
        command.uid(payload.uid).gid(payload.uid);
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("corral: cannot run {program:?}: {err}");
            return if err.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
        }
    };
    let main_pid = child.id() as i32;
    // We reap ourselves (orphans are re-parented to us too), so the Child handle is not used.
    drop(child);
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid.as_raw_nonzero().get() == main_pid => {
                return match status.exit_status() {
                    Some(code) => code,
                    None => 128 + status.terminating_signal().unwrap_or(9),
                };
            }
            Ok(_) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return 1,
        }
    }
}
