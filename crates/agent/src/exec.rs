//! Starting processes and pumping their output until they are reaped.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corral_proto::{ExecSpec, ProcessInfo, CHANNEL_STDERR, CHANNEL_STDOUT};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{AgentError, IoContext};
use crate::process_table::{Output, Process, Stdin};
use crate::reaper::{ExitStatus, Reaper};
use crate::users::UserEntry;
use crate::{pty, AgentState};

pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Largest read from a child's output; one mux frame's worth.
const CHUNK: usize = corral_proto::mux::MAX_FRAME - 1;
/// After the child exits, output still buffered in its pipes is drained until they stay quiet
/// this long (a background grandchild may hold them open forever)...
const DRAIN_IDLE: Duration = Duration::from_millis(100);
/// ...or at most this long in total.
const DRAIN_MAX: Duration = Duration::from_secs(2);

/// A started process and the subscription that sees all of its output.
pub struct Spawned {
    pub process: Arc<Process>,
    pub output: mpsc::Receiver<Output>,
}

/// Where the supervisor reads a child's output from.
struct Outputs {
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
}

pub fn spawn(state: &Arc<AgentState>, spec: ExecSpec) -> Result<Spawned, AgentError> {
    let user = state.user(spec.user.as_deref())?;
    let argv = match &spec.shell {
        Some(shell) => vec!["/bin/sh".to_owned(), "-c".to_owned(), shell.clone()],
        None => spec.argv.clone(),
    };
    let Some((program, args)) = argv.split_first() else {
        return Err(AgentError::invalid("exec needs argv or shell"));
    };
    let cwd = user.resolve_path(spec.cwd.as_deref().unwrap_or("~"));
    // Checked here because a failed chdir in the child is indistinguishable from a missing binary.
    check_dir(&cwd)?;

    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(&cwd)
        .env_clear()
        .envs(environment(&state.default_env(), &user, &spec))
        .uid(user.uid)
        .gid(user.gid);

    let pty = match spec.pty {
        Some(size) => Some(pty::open(size, user.uid, user.gid).context("open pty")?),
        None => None,
    };
    match &pty {
        Some(pty) => {
            let slave = |pty: &pty::Pty| pty.slave.try_clone().map(Stdio::from).context("open pty");
            cmd.stdin(slave(pty)?).stdout(slave(pty)?).stderr(slave(pty)?);
            corral_jail::child::set_controlling_tty(&mut cmd);
        }
        None => {
            cmd.stdin(if spec.stdin { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
        }
    }

    let (mut child, exit) = Reaper::global().spawn(&mut cmd).map_err(|err| AgentError::io(program, &err))?;
    // The Command holds our copies of the pty slave; the master only sees EOF once they close.
    drop(cmd);
    let pid = child.id();

    let info = ProcessInfo {
        pid,
        argv,
        cwd: Some(cwd.to_string_lossy().into_owned()),
        tag: spec.tag.clone(),
        pty: pty.is_some(),
        env: spec.env.clone(),
    };
    let wired = match pty {
        Some(pty) => wire_pty(pty.master),
        None => wire_pipes(&mut child),
    };
    let (stdin, outputs, master) = match wired {
        Ok(wired) => wired,
        Err(err) => {
            let _ = Reaper::global().signal_group(pid, rustix::process::Signal::KILL);
            return Err(AgentError::io("process io", &err));
        }
    };

    let process = Arc::new(Process::new(pid, info, spec.background, stdin, master));
    let output = process.subscribe();
    state.processes.insert(process.clone());
    let timeout = spec.timeout_ms.map(|ms| tokio::spawn(enforce_timeout(process.clone(), Duration::from_millis(ms))));
    tokio::spawn(supervise(state.clone(), process.clone(), outputs, exit, timeout));
    Ok(Spawned { process, output })
}

fn check_dir(dir: &Path) -> Result<(), AgentError> {
    let meta = std::fs::metadata(dir).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => AgentError::not_found(format!("no such directory: {}", dir.display())),
        _ => AgentError::io(dir.display(), &err),
    })?;
    if !meta.is_dir() {
        return Err(AgentError::new(corral_proto::ErrorKind::NotADirectory, format!("not a directory: {}", dir.display())));
    }
    Ok(())
}

/// Sandbox defaults, then the user's identity, then what the request asked for.
fn environment(defaults: &BTreeMap<String, String>, user: &UserEntry, spec: &ExecSpec) -> BTreeMap<String, String> {
    let mut env = defaults.clone();
    env.insert("HOME".into(), user.home.to_string_lossy().into_owned());
    env.insert("USER".into(), user.name.clone());
    if spec.pty.is_some() {
        env.entry("TERM".into()).or_insert_with(|| "xterm-256color".into());
    }
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    env
}

type Wired = (Option<Stdin>, Outputs, Option<OwnedFd>);

fn wire_pty(master: OwnedFd) -> io::Result<Wired> {
    // Separate descriptors for reading and writing the one terminal, so input never waits
    // behind an output read; the third is kept for resizing.
    let reader = pipe::Receiver::from_owned_fd_unchecked(master.try_clone()?)?;
    let writer = pipe::Sender::from_owned_fd_unchecked(master.try_clone()?)?;
    Ok((Some(Stdin { writer, pty: true }), Outputs { stdout: Some(reader), stderr: None }, Some(master)))
}

fn wire_pipes(child: &mut std::process::Child) -> io::Result<Wired> {
    let stdin = child.stdin.take().map(|s| pipe::Sender::from_owned_fd(OwnedFd::from(s))).transpose()?;
    let stdout = child.stdout.take().map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s))).transpose()?;
    let stderr = child.stderr.take().map(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s))).transpose()?;
    Ok((stdin.map(|writer| Stdin { writer, pty: false }), Outputs { stdout, stderr }, None))
}

async fn enforce_timeout(process: Arc<Process>, after: Duration) {
    tokio::time::sleep(after).await;
    // Marked first so the exit this kill causes is reported as a timeout; unmarked if the
    // process had already been reaped and the kill was refused.
    process.mark_timed_out();
    if process.signal(libc::SIGKILL).is_err() {
        process.clear_timed_out();
    }
}

/// Reads one chunk, or waits forever once the stream is closed (so `select!` skips it).
async fn read_chunk(source: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> Option<usize> {
    let Some(reader) = source.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match reader.read(buf).await {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            // EIO is how a pty master reports that every slave is closed.
            Err(_) => return None,
        }
    }
}

/// Pumps output to subscribers until the process is reaped and its output drained, then
/// removes it from the table and reports `Exited`.
async fn supervise(
    state: Arc<AgentState>,
    process: Arc<Process>,
    mut outputs: Outputs,
    mut exit: oneshot::Receiver<ExitStatus>,
    timeout: Option<JoinHandle<()>>,
) {
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    let mut status: Option<ExitStatus> = None;
    let mut drain_until: Option<Instant> = None;
    loop {
        if drain_until.is_some() && outputs.stdout.is_none() && outputs.stderr.is_none() {
            break;
        }
        let idle = async {
            match drain_until {
                Some(limit) => tokio::time::sleep_until(limit.min(Instant::now() + DRAIN_IDLE)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            read = read_chunk(&mut outputs.stdout, &mut out_buf) => match read {
                Some(n) => process.publish(CHANNEL_STDOUT, Bytes::copy_from_slice(&out_buf[..n])).await,
                None => outputs.stdout = None,
            },
            read = read_chunk(&mut outputs.stderr, &mut err_buf) => match read {
                Some(n) => process.publish(CHANNEL_STDERR, Bytes::copy_from_slice(&err_buf[..n])).await,
                None => outputs.stderr = None,
            },
            reaped = &mut exit, if drain_until.is_none() => {
                if let Some(timeout) = &timeout {
                    timeout.abort();
                }
                status = reaped.ok();
                drain_until = Some(Instant::now() + DRAIN_MAX);
            },
            _ = idle => break,
        }
    }
    // Closing our read ends makes any grandchild still writing get EPIPE instead of blocking.
    drop(outputs);
    state.processes.remove(process.pid);
    process.finish(status).await;
}
