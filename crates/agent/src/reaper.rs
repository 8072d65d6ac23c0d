//! Reaps every child of the agent, ours or orphans reparented to PID 1.
//!
//! `waitpid(-1)` is process-wide, so there is exactly one reaper per process (a global): two
//! reapers would steal each other's exit statuses. It also means the agent cannot use
//! `tokio::process` or `Child::wait`. Spawning and reaping share one lock, for two reasons:
//! a child registers its pid before `waitpid` can report it, and std's `Command::spawn`,
//! which waits for a child whose exec failed, never finds that child already reaped.

use std::collections::HashMap;
use std::io;
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl From<WaitStatus> for ExitStatus {
    fn from(status: WaitStatus) -> Self {
        match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => ExitStatus::Code(code),
            (None, Some(signal)) => ExitStatus::Signal(signal),
            // waitpid without WUNTRACED/WCONTINUED only reports terminations.
            (None, None) => ExitStatus::Code(-1),
        }
    }
}

pub struct Reaper {
    /// Children someone waits for, by pid. Removed when reaped.
    waiting: Mutex<HashMap<u32, oneshot::Sender<ExitStatus>>>,
}

impl Reaper {
    pub fn global() -> &'static Reaper {
        static GLOBAL: OnceLock<Reaper> = OnceLock::new();
        GLOBAL.get_or_init(|| Reaper { waiting: Mutex::new(HashMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u32, oneshot::Sender<ExitStatus>>> {
        // The map stays consistent even if a holder panicked; keep reaping.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns `cmd`; the receiver resolves once the child has been reaped.
    ///
    /// Drop the returned `Child` without waiting on it; the reaper owns its exit status.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<(Child, oneshot::Receiver<ExitStatus>)> {
        let mut waiting = self.lock();
        let child = cmd.spawn()?;
        let (tx, rx) = oneshot::channel();
        waiting.insert(child.id(), tx);
        Ok((child, rx))
    }

    /// Collects every exited child without blocking, dispatching statuses to their waiters.
    pub fn reap(&self) {
        let mut waiting = self.lock();
        loop {
            // `wait` is wait4(-1); rustix's `waitpid(None)` would be wait4(0), which only sees
            // children in our own process group, and every exec gets a group of its own.
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => { 
                    let pid = pid.as_raw_nonzero().get() as u32;
                    if let Some(tx) = waiting.remove(&pid) {
                        let _ = tx.send(status.into());
                    }
                }
                Err(Errno::INTR) => continue,
                // Ok(None): children remain but none has exited; ECHILD: no children at all.
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// Signals the process group led by `pid` while `pid` is an unreaped child spawned here.
    ///
    /// Once reaped, the id may be reused by an unrelated process, so signalling is refused;
    /// holding the lock keeps reaping from slipping in between the check and the kill.
    pub fn signal_group(&self, pid: u32, signal: Signal) -> io::Result<()> {
        let waiting = self.lock();
        let target = i32::try_from(pid).ok().and_then(Pid::from_raw).filter(|_| waiting.contains_key(&pid));
        let Some(target) = target else {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        };
        rustix::process::kill_process_group(target, signal)?;
        Ok(())
    }
}

/// Runs the reaper on this runtime whenever SIGCHLD arrives. Signals coalesce, but every
/// wake-up reaps all exited children, so none is missed. Only if SIGCHLD cannot be watched
/// does it poll — an idle sandbox should cost no CPU.
pub fn spawn_driver() -> JoinHandle<()> {
    tokio::spawn(async {
        let mut sigchld = signal(SignalKind::child()).ok();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            match sigchld.as_mut() {
                Some(stream) => {
                    if stream.recv().await.is_none() {
                        sigchld = None;
                    }
                }
                None => {
                    tick.tick().await;
                }
            }
            Reaper::global().reap();
        }
    })
}
