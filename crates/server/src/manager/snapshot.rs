//! Snapshots, create-from-snapshot, rollback and fork.
//!
//! Taking a snapshot: the interpreter contexts pickle their variables into the sandbox's own
//! filesystem, the backend holds every process but the agent frozen, the agent streams the
//! writable layer, the store compresses and hashes it, the processes are released. Process
//! memory is not captured (except by pause, which keeps the processes themselves).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::Bytes;
use corral_proto::{Event, Message, Mux, Request};
use corral_spec::SandboxSpec;
use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::{jail_error, lock, not_found, remove_dir, Live, Manager, SandboxInfo};
use crate::db::State;
use crate::error::ApiError;
use crate::snapshots::{SavedContext, SnapshotInfo};
use crate::time::{now_ms, rfc3339};

/// Forks per request, at most.
pub const MAX_FORKS: u32 = 64;
/// Tar headers and padding on top of the file bytes the disk can hold.
const LAYER_OVERHEAD: u64 = 256 * 1024 * 1024;

/// The code interpreter's part in snapshots (implemented by `crate::interpreter`, which
/// depends on the manager, hence the indirection).
pub trait InterpreterState: Send + Sync {
    /// Pickles every context's variables into the sandbox; reports what was saved.
    fn save<'a>(&'a self, sandbox_id: &'a str, mux: Mux) -> BoxFuture<'a, Vec<SavedContext>>;
    /// Registers a restored sandbox's contexts; each loads its state on first use.
    fn adopt(&self, sandbox_id: &str, contexts: &[SavedContext]);
    /// Drops what is known about a sandbox's contexts (their kernels are gone).
    fn forget(&self, sandbox_id: &str);
}

fn snapshot_id() -> String {
    format!("snap-{}", super::new_id().get(..16).unwrap_or_default())
}

impl Manager {
    /// Connects the code interpreter (called once, when the router is built).
    pub fn set_interpreter_state(&self, state: Weak<dyn InterpreterState>) {
        let _ = self.interpreter.set(state);
    }

    fn interpreter_state(&self) -> Option<Arc<dyn InterpreterState>> {
        self.interpreter.get().and_then(Weak::upgrade)
    }

    pub fn snapshot_store(&self) -> &crate::snapshots::Snapshots {
        &self.snapshots
    }

    /// Takes a snapshot of a running or paused sandbox; it is left as it was.
    pub async fn snapshot(&self, id: &str, name: Option<String>) -> Result<SnapshotInfo, ApiError> {
        if name.as_ref().is_some_and(|n| n.len() > 256) {
            return Err(ApiError::invalid("the snapshot name is longer than 256 bytes"));
        }
        let live = self.live_any(id).await?;
        let row = self.db.get_sandbox(id).await?.ok_or_else(|| not_found(id))?;
        let released = live.released.lock().await;
        if *released {
            return Err(ApiError::conflict(format!("sandbox {id} is not running")));
        }
        // Clients are told the sandbox is busy (paused) meanwhile, instead of racing the capture.
        let was_paused = live.paused.swap(true, Ordering::SeqCst);
        let result = self.capture(&live, &row, was_paused, name).await;
        live.paused.store(was_paused, Ordering::SeqCst);
        drop(released);
        let info = result?;
        self.snapshots.insert(&info, now_ms()).await?;
        tracing::info!(id, snapshot = %info.id, bytes = info.file_bytes, frozen_ms = info.frozen_ms, "snapshot taken");
        Ok(info)
    }

    async fn capture(&self, live: &Arc<Live>, row: &crate::db::SandboxRow, was_paused: bool, name: Option<String>) -> Result<SnapshotInfo, ApiError> {
        if was_paused {
            // Kernels must run to pickle their state; the sandbox is frozen again below.
            self.freeze(live, false).await?;
        }
        let mux = live.agent().await?;
        let interpreter = match self.interpreter_state() {
            Some(state) => state.save(&live.id, mux.clone()).await,
            None => Vec::new(),
        };
        let frozen_at = Instant::now();
        let l = live.clone();
        tokio::task::spawn_blocking(move || l.sandbox.hold_processes())
            .await
            .map_err(|e| ApiError::internal(format!("freeze task failed: {e}")))?
            .map_err(jail_error)?;
        let layer = self.stream_layer_out(&mux, row.limits.disk.0.saturating_add(LAYER_OVERHEAD)).await;
        let l = live.clone();
        let released = tokio::task::spawn_blocking(move || l.sandbox.release_processes(was_paused)).await;
        let frozen_ms = frozen_at.elapsed().as_millis() as u64;
        if !matches!(released, Ok(Ok(()))) {
            tracing::error!(id = %live.id, "could not release the processes held for a snapshot");
        }
        let (stored, summary) = layer?;
        let mut spec = row.spec.clone();
        spec.volumes.clear();
        spec.from_snapshot = None;
        let (entries, skipped, skipped_count) = match summary {
            Event::Layer { entries, skipped, skipped_count, .. } => (entries, skipped, skipped_count),
            _ => (0, Vec::new(), 0),
        };
        Ok(SnapshotInfo {
            id: snapshot_id(),
            sandbox_id: live.id.clone(),
            name,
            created_at: rfc3339(now_ms()),
            template: row.spec.template().to_string(),
            spec,
            layer: stored.sha256,
            layer_bytes: stored.compressed,
            file_bytes: stored.raw,
            entries,
            skipped,
            skipped_count,
            interpreter,
            frozen_ms,
        })
    }

    /// Asks the agent for its layer and stores it; returns the stored layer and the summary.
    async fn stream_layer_out(&self, mux: &Mux, max_raw: u64) -> Result<(crate::snapshots::StoredLayer, Event), ApiError> {
        let (mut tx, mut rx) = mux.open(&Request::SnapshotLayer).map_err(ApiError::from_mux)?.split();
        tx.end().map_err(ApiError::from_mux)?;
        let (chunks_tx, chunks_rx) = mpsc::channel::<Bytes>(16);
        let store = self.snapshots.write_layer(chunks_rx, max_raw);
        let pump = async move {
            let mut summary = None;
            while let Some(message) = rx.recv().await {
                match message.map_err(ApiError::from_mux)? {
                    Message::Data { bytes, .. } => {
                        if chunks_tx.send(bytes).await.is_err() {
                            break;
                        }
                    }
                    Message::Event(Event::Error { kind, message }) => return Err(ApiError::from_agent(kind, message)),
                    Message::Event(event @ Event::Layer { .. }) => summary = Some(event),
                    Message::Event(_) => {}
                }
            }
            summary.ok_or_else(|| ApiError::new(axum::http::StatusCode::BAD_GATEWAY, "agent_error", "the agent ended the layer without a summary"))
        };
        let (stored, summary) = tokio::join!(store, pump);
        let summary = summary?;
        Ok((stored?, summary))
    }

    /// Streams a stored layer into a sandbox's agent, which applies it.
    pub(super) async fn restore_layer(&self, live: &Arc<Live>, snapshot: &SnapshotInfo) -> Result<(), ApiError> {
        let mux = live.agent().await?;
        let (mut tx, mut rx) = mux.open(&Request::RestoreLayer).map_err(ApiError::from_mux)?.split();
        let (chunks_tx, mut chunks) = mpsc::channel::<Bytes>(8);
        let reader = self.snapshots.read_layer(&snapshot.layer, chunks_tx);
        while let Some(chunk) = chunks.recv().await {
            if tx.send_data(corral_proto::CHANNEL_FILE, &chunk).await.is_err() {
                break;
            }
        }
        reader.await.map_err(|e| ApiError::internal(format!("layer task failed: {e}")))??;
        tx.end().map_err(ApiError::from_mux)?;
        match rx.recv_event().await.map_err(ApiError::from_mux)? {
            Some(Event::Layer { skipped_count, skipped, .. }) => {
                if skipped_count > 0 {
                    tracing::info!(id = %live.id, snapshot = %snapshot.id, skipped_count, first = ?skipped.first(), "restore skipped entries");
                }
            }
            Some(Event::Error { kind, message }) => return Err(ApiError::from_agent(kind, message)),
            other => return Err(ApiError::internal(format!("unexpected answer to a restore: {other:?}"))),
        }
        if let Some(state) = self.interpreter_state() {
            state.adopt(&live.id, &snapshot.interpreter);
        }
        Ok(())
    }

    /// The spec of a sandbox created from `snapshot`: the snapshot's settings, with what the
    /// request sets on top (env and metadata are merged, the request winning).
    pub(super) fn spec_from_snapshot(request: SandboxSpec, snapshot: &SnapshotInfo) -> Result<SandboxSpec, ApiError> {
        if request.template.as_deref().is_some_and(|t| !t.is_empty() && t != snapshot.template) {
            return Err(ApiError::invalid(format!("snapshot {} is of template {:?}", snapshot.id, snapshot.template)));
        }
        let mut spec = snapshot.spec.clone();
        spec.template = Some(snapshot.template.clone());
        let limits = request.limits;
        spec.limits.cpus = limits.cpus.or(spec.limits.cpus);
        spec.limits.memory = limits.memory.or(spec.limits.memory);
        spec.limits.disk = limits.disk.or(spec.limits.disk);
        spec.limits.pids = limits.pids.or(spec.limits.pids);
        spec.env.extend(request.env);
        spec.metadata.extend(request.metadata);
        spec.timeout = request.timeout.or(spec.timeout);
        spec.volumes = request.volumes;
        if !request.network.is_empty() {
            spec.network = request.network;
        }
        if !request.on_timeout.is_kill() {
            spec.on_timeout = request.on_timeout;
        }
        spec.from_snapshot = Some(snapshot.id.clone());
        Ok(spec)
    }

    pub(super) async fn resolve_snapshot_spec(&self, spec: SandboxSpec) -> Result<SandboxSpec, ApiError> {
        let Some(snapshot_id) = spec.from_snapshot.clone() else { return Ok(spec) };
        let snapshot = self.snapshots.get(&snapshot_id).await?.ok_or_else(|| ApiError::not_found(format!("no snapshot {snapshot_id:?}")))?;
        Self::spec_from_snapshot(spec, &snapshot)
    }

    /// Puts a running or paused sandbox back to `snapshot_id`, keeping its id, settings and
    /// id range. Its processes are restarted: a rollback is a reboot into the snapshot.
    pub async fn rollback(self: &Arc<Self>, id: &str, snapshot_id: &str) -> Result<SandboxInfo, ApiError> {
        let snapshot = self.snapshots.get(snapshot_id).await?.ok_or_else(|| ApiError::not_found(format!("no snapshot {snapshot_id:?}")))?;
        let old = self.live_any(id).await?;
        let row = self.db.get_sandbox(id).await?.ok_or_else(|| not_found(id))?;
        if row.spec.template() != snapshot.template {
            return Err(ApiError::invalid(format!("snapshot {snapshot_id} is of template {:?}, the sandbox of {:?}", snapshot.template, row.spec.template())));
        }
        let this = self.clone();
        tokio::spawn(async move { this.rollback_inner(old, row, snapshot).await })
            .await
            .map_err(|e| ApiError::internal(format!("rollback task failed: {e}")))?
    }

    async fn rollback_inner(&self, old: Arc<Live>, row: crate::db::SandboxRow, snapshot: SnapshotInfo) -> Result<SandboxInfo, ApiError> {
        let id = row.id.clone();
        let mut released = old.released.lock().await;
        if *released {
            return Err(ApiError::conflict(format!("sandbox {id} is not running")));
        }
        old.paused.store(true, Ordering::SeqCst);
        let l = old.clone();
        tokio::task::spawn_blocking(move || l.sandbox.destroy())
            .await
            .map_err(|e| ApiError::internal(format!("destroy task failed: {e}")))?
            .map_err(jail_error)?;
        *released = true;
        old.mux.lock().await.take();
        if let Some(state) = self.interpreter_state() {
            state.forget(&id);
        }
        let live = match self.start_restored(&row, old.slot, old.run_dir.clone(), &snapshot).await {
            Ok(live) => live,
            Err(err) => {
                lock(&self.live).remove(&id);
                let _ = self.db.mark_ended(&id, State::Exited, "rollback_failed", now_ms()).await;
                remove_dir(old.run_dir.clone()).await;
                self.free_slot(old.slot);
                return Err(err);
            }
        };
        lock(&self.live).insert(id.clone(), live.clone());
        if row.state == State::Paused {
            self.db.mark_resumed(&id, now_ms()).await?;
        }
        self.db.mark_running(&id, live.sandbox.host_pid(), &live.address).await?;
        tracing::info!(id, snapshot = %snapshot.id, "sandbox rolled back");
        self.get(&id).await
    }

    /// Snapshots `id`, then creates `count` sandboxes from that snapshot, concurrently.
    pub async fn fork(self: &Arc<Self>, id: &str, count: u32, overrides: SandboxSpec) -> Result<(SnapshotInfo, Vec<SandboxInfo>), ApiError> {
        if count == 0 || count > MAX_FORKS {
            return Err(ApiError::invalid(format!("count {count} is out of range (1 to {MAX_FORKS})")));
        }
        let snapshot = self.snapshot(id, Some(format!("fork of {id}"))).await?;
        let creates = (0..count).map(|_| {
            let mut spec = overrides.clone();
            spec.from_snapshot = Some(snapshot.id.clone());
            self.create(spec)
        });
        let results = futures::future::join_all(creates).await;
        let mut created = Vec::new();
        let mut first_error = None;
        for result in results {
            match result {
                Ok(info) => created.push(info),
                Err(err) => first_error = first_error.or(Some(err)),
            }
        }
        // All or nothing: half a fork is harder to use than an error.
        if let Some(err) = first_error {
            for info in &created {
                let _ = self.kill(&info.id).await;
            }
            return Err(err);
        }
        Ok((snapshot, created))
    }
}
