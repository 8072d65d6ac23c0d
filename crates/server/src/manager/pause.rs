//! Pause and resume: a paused sandbox is frozen by the backend (every process stopped where
//! it stands, memory kept, no CPU), its agent is not contacted, and its timeout is stopped
//! (what is left is stored and given back on resume).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::http::StatusCode;
use corral_spec::TimeoutAction;

use super::{jail_error, lock, not_found, Live, Manager, SandboxInfo};
use crate::db::State;
use crate::error::ApiError;
use crate::time::now_ms;

pub fn paused_error(id: &str) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "paused", format!("sandbox {id} is paused; resume it first"))
}

impl Manager {
    /// Freezes a running sandbox. Pausing a paused sandbox is a conflict (409).
    pub async fn pause(&self, id: &str) -> Result<SandboxInfo, ApiError> {
        let live = self.live_any(id).await?;
        let released = live.released.lock().await;
        if *released {
            return Err(ApiError::conflict(format!("sandbox {id} is not running")));
        }
        if live.paused.swap(true, Ordering::SeqCst) {
            return Err(ApiError::conflict(format!("sandbox {id} is already paused")));
        }
        // The flag is set first, so no new request reaches an agent about to be frozen.
        if let Err(err) = self.freeze(&live, true).await {
            live.paused.store(false, Ordering::SeqCst);
            return Err(err);
        }
        match self.db.mark_paused(id, now_ms()).await {
            Ok(true) => {}
            other => {
                let _ = self.freeze(&live, false).await;
                live.paused.store(false, Ordering::SeqCst);
                other?;
                return Err(ApiError::conflict(format!("sandbox {id} is not running")));
            }
        }
        drop(released);
        tracing::info!(id, "sandbox paused");
        self.get(id).await
    }

    /// Thaws a paused sandbox (restoring it from its snapshot first if it was hibernated).
    /// Resuming a running sandbox is a conflict (409).
    pub async fn resume(self: &Arc<Self>, id: &str) -> Result<SandboxInfo, ApiError> {
        let live = lock(&self.live).get(id).cloned();
        let Some(live) = live else {
            return match self.db.get_sandbox(id).await? {
                Some(row) if row.state == State::Paused && row.hibernated.is_some() => self.wake(row).await,
                Some(row) if row.state != State::Creating => {
                    Err(ApiError::conflict(format!("sandbox {id} is not paused (state: {})", row.state.as_str())))
                }
                _ => Err(not_found(id)),
            };
        };
        let released = live.released.lock().await;
        if *released || !live.paused.load(Ordering::SeqCst) {
            return Err(ApiError::conflict(format!("sandbox {id} is not paused")));
        }
        self.freeze(&live, false).await?;
        if !self.db.mark_resumed(id, now_ms()).await? {
            tracing::warn!(id, "resumed a sandbox the database did not record as paused");
        }
        live.paused.store(false, Ordering::SeqCst);
        drop(released);
        tracing::info!(id, "sandbox resumed");
        self.get(id).await
    }

    /// The live handle, paused or not.
    pub(super) async fn live_any(&self, id: &str) -> Result<Arc<Live>, ApiError> {
        if let Some(live) = lock(&self.live).get(id).cloned() {
            return Ok(live);
        }
        self.live(id).await
    }

    pub(super) async fn freeze(&self, live: &Arc<Live>, frozen: bool) -> Result<(), ApiError> {
        let l = live.clone();
        tokio::task::spawn_blocking(move || if frozen { l.sandbox.freeze() } else { l.sandbox.thaw() })
            .await
            .map_err(|e| ApiError::internal(format!("freeze task failed: {e}")))?
            .map_err(jail_error)
    }

    /// Makes a re-attached sandbox frozen or not, as the database says it should be.
    pub(super) async fn converge_frozen(&self, live: &Arc<Live>, frozen: bool) -> Result<(), ApiError> {
        self.freeze(live, frozen).await
    }

    /// Pauses the expired sandboxes whose spec says so; returns the ids left to kill.
    pub(super) async fn pause_those_that_pause_on_timeout(&self, ids: Vec<String>) -> Vec<String> {
        let mut kill = Vec::new();
        for id in ids {
            let pauses = matches!(self.db.get_sandbox(&id).await, Ok(Some(row)) if row.spec.on_timeout == TimeoutAction::Pause);
            if !pauses {
                kill.push(id);
                continue;
            }
            match self.pause(&id).await {
                Ok(_) => tracing::info!(id, "timeout expired: sandbox paused"),
                // Already paused by a client in the meantime: nothing to do.
                Err(err) if err.status == StatusCode::CONFLICT => {}
                Err(err) => {
                    tracing::warn!(id, %err, "pausing an expired sandbox failed; killing it");
                    kill.push(id);
                }
            }
        }
        kill
    }
}

/// How long a sandbox may stay paused before it is hibernated: written to a snapshot and its
/// processes released. `CORRAL_HIBERNATE_AFTER` (e.g. `30m`, `off`); one hour by default.
pub fn hibernate_after() -> Option<std::time::Duration> {
    match std::env::var("CORRAL_HIBERNATE_AFTER") {
        Ok(value) if value == "off" || value == "never" => None,
        Ok(value) => match corral_spec::parse_duration(&value) {
            Ok(after) => Some(after),
            Err(err) => {
                tracing::warn!(%err, "ignoring CORRAL_HIBERNATE_AFTER");
                Some(std::time::Duration::from_secs(3600))
            }
        },
        Err(_) => Some(std::time::Duration::from_secs(3600)),
    }
}

impl Manager {
    /// Hibernates the sandboxes paused for longer than `after`.
    pub(super) async fn hibernate_idle(&self, after: std::time::Duration) {
        let paused: Vec<Arc<Live>> = lock(&self.live).values().filter(|l| l.paused.load(Ordering::SeqCst)).cloned().collect();
        if paused.is_empty() {
            return;
        }
        let cutoff = now_ms().saturating_sub(after.as_millis() as i64);
        for live in paused {
            let due = matches!(self.db.get_sandbox(&live.id).await, Ok(Some(row)) if row.state == State::Paused && row.paused_at.is_some_and(|at| at <= cutoff));
            if due {
                if let Err(err) = self.hibernate(&live).await {
                    tracing::warn!(id = %live.id, %err, "hibernating a paused sandbox failed; it stays paused in memory");
                }
            }
        }
    }

    /// Writes a paused sandbox to a snapshot and releases its processes, memory, cgroups and id
    /// range; it stays `paused` and [`Manager::resume`] brings it back under the same id.
    async fn hibernate(&self, live: &Arc<Live>) -> Result<(), ApiError> {
        let snapshot = self.snapshot(&live.id, Some("hibernation".into())).await?;
        let mut released = live.released.lock().await;
        if *released || !live.paused.load(Ordering::SeqCst) {
            // Killed or resumed meanwhile: the snapshot is not needed.
            self.snapshots.delete(&snapshot.id).await?;
            return Ok(());
        }
        if !self.db.mark_hibernated(&live.id, Some(&snapshot.id)).await? {
            self.snapshots.delete(&snapshot.id).await?;
            return Ok(());
        }
        let l = live.clone();
        tokio::task::spawn_blocking(move || l.sandbox.destroy())
            .await
            .map_err(|e| ApiError::internal(format!("destroy task failed: {e}")))?
            .map_err(jail_error)?;
        *released = true;
        live.mux.lock().await.take();
        lock(&self.live).remove(&live.id);
        super::remove_dir(live.run_dir.clone()).await;
        self.free_slot(live.slot);
        tracing::info!(id = %live.id, snapshot = %snapshot.id, "paused sandbox hibernated");
        Ok(())
    }

    /// Brings a hibernated sandbox back under its own id from the snapshot it was written to.
    async fn wake(self: &Arc<Self>, row: crate::db::SandboxRow) -> Result<SandboxInfo, ApiError> {
        let this = self.clone();
        // Run to completion even if the client hangs up, like a create.
        tokio::spawn(async move { this.wake_inner(row).await })
            .await
            .map_err(|e| ApiError::internal(format!("wake task failed: {e}")))?
    }

    async fn wake_inner(&self, mut row: crate::db::SandboxRow) -> Result<SandboxInfo, ApiError> {
        let id = row.id.clone();
        let Some(snapshot_id) = row.hibernated.clone() else { return Err(ApiError::conflict(format!("sandbox {id} is not hibernated"))) };
        let snapshot = self.snapshots.get(&snapshot_id).await?.ok_or_else(|| ApiError::internal(format!("the snapshot of hibernated sandbox {id} is missing")))?;
        let slot = self.alloc_slot()?;
        row.host_id_base = super::slot_base(slot);
        let run_dir = self.sandboxes_dir.join(&id);
        let live = match self.start_restored(&row, slot, run_dir.clone(), &snapshot).await {
            Ok(live) => live,
            Err(err) => {
                super::remove_dir(run_dir).await;
                self.free_slot(slot);
                return Err(err);
            }
        };
        lock(&self.live).insert(id.clone(), live.clone());
        self.db.set_host_id_base(&id, row.host_id_base).await?;
        self.db.mark_resumed(&id, now_ms()).await?;
        self.db.mark_running(&id, live.sandbox.host_pid(), &live.address).await?;
        if let Err(err) = self.snapshots.delete(&snapshot_id).await {
            tracing::warn!(id, %err, "could not delete a hibernation snapshot");
        }
        tracing::info!(id, "hibernated sandbox resumed");
        self.get(&id).await
    }

    /// Ends a hibernated sandbox (nothing runs; only its record and snapshot remain).
    pub(super) async fn kill_hibernated(&self, row: &crate::db::SandboxRow) -> Result<(), ApiError> {
        self.db.mark_ended(&row.id, State::Killed, "killed", now_ms()).await?;
        if let Some(snapshot) = &row.hibernated {
            self.snapshots.delete(snapshot).await?;
        }
        Ok(())
    }
}
