//! Owns every sandbox: creation, the id-range slots, the agent connections, expiry and
//! release. The database is the record; `live` holds what only this process can hold
//! (backend handles and agent connections).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::StatusCode;
use corral_jail::{AgentAddress, AgentBoot, Backend, JailConfig, JailError, ResourceUsage, Sandbox, ID_RANGE};
use corral_proto::{Mux, Role};
use corral_spec::{ResolvedLimits, SandboxSpec, MAX_TIMEOUT_SECS};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::db::{Db, SandboxRow, State};
use crate::error::ApiError;
use crate::time::{now_ms, rfc3339};
use crate::ServerError;

mod network;
mod pause;
mod pool;
mod recover;
mod snapshot;
pub use network::EgressHub;
pub use snapshot::InterpreterState;

/// Host ids below this are left to the host's own users.
const FIRST_HOST_ID: u32 = 200_000;
/// As many `ID_RANGE`-sized slots as fit between `FIRST_HOST_ID` and `u32::MAX`.
const MAX_SLOTS: u32 = ((u32::MAX - FIRST_HOST_ID) / ID_RANGE) - 1;
const REAP_INTERVAL: Duration = Duration::from_millis(500);
/// How long ended sandboxes stay listed.
const RETENTION_MS: i64 = 24 * 3600 * 1000;
const PURGE_INTERVAL_MS: i64 = 10 * 60 * 1000;
const AGENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const ID_LEN: usize = 20;

/// A sandbox as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub template: String,
    /// `running`, `paused`, `killed`, `exited`, or `pooled` (a warm-pool sandbox nobody owns yet).
    pub state: String,
    pub limits: ResolvedLimits,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub expires_at: String,
    /// Seconds the sandbox was given when created or when its timeout was last set.
    pub timeout: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why it ended: `killed`, `timeout`, `exited`, `shutdown`, `daemon_restarted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// When it was paused; while paused its timeout does not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<String>,
    /// Seconds of its timeout left, while paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_timeout: Option<u64>,
    #[serde(default, skip_serializing_if = "crate::manager::is_kill")]
    pub on_timeout: corral_spec::TimeoutAction,
}

fn is_kill(action: &corral_spec::TimeoutAction) -> bool {
    action.is_kill()
}

impl From<&SandboxRow> for SandboxInfo {
    fn from(row: &SandboxRow) -> Self {
        SandboxInfo {
            id: row.id.clone(),
            template: row.spec.template().to_string(),
            state: row.state.as_str().to_string(),
            limits: row.limits,
            metadata: row.spec.metadata.clone(),
            created_at: rfc3339(row.created_at),
            expires_at: rfc3339(row.expires_at),
            timeout: row.timeout_secs,
            ended_at: row.ended_at.map(rfc3339),
            end_reason: row.end_reason.clone(),
            paused_at: row.paused_at.filter(|_| row.state == State::Paused).map(rfc3339),
            remaining_timeout: row.remaining_ms.filter(|_| row.state == State::Paused).map(|ms| (ms.max(0) as u64).div_ceil(1000)),
            on_timeout: row.spec.on_timeout,
        }
    }
}

/// What only this process holds for a running sandbox.
struct Live {
    id: String,
    sandbox: Box<dyn Sandbox>,
    address: AgentAddress,
    /// The agent connection, opened lazily again if it drops.
    mux: tokio::sync::Mutex<Option<Mux>>,
    slot: u32,
    run_dir: PathBuf,
    /// True once released; the lock makes concurrent kills wait for the first one.
    released: tokio::sync::Mutex<bool>,
    /// This sandbox's egress proxy state, which the agent's relayed connections are served by.
    egress: Option<Arc<corral_egress::SandboxEgress>>,
    /// Frozen: requests to its agent are refused instead of hanging until it is resumed.
    paused: std::sync::atomic::AtomicBool,
}

impl Live {
    fn new(id: String, sandbox: Box<dyn Sandbox>, slot: u32, run_dir: PathBuf, egress: Arc<corral_egress::SandboxEgress>, paused: bool) -> Arc<Live> {
        Arc::new(Live {
            id,
            address: sandbox.agent_address(),
            sandbox,
            mux: tokio::sync::Mutex::new(None),
            slot,
            run_dir,
            released: tokio::sync::Mutex::new(false),
            egress: Some(egress),
            paused: std::sync::atomic::AtomicBool::new(paused),
        })
    }

    async fn agent(&self) -> Result<Mux, ApiError> {
        let mut current = self.mux.lock().await;
        if let Some(mux) = current.as_ref().filter(|m| !m.is_closed()) {
            return Ok(mux.clone());
        }
        let path = match &self.address {
            AgentAddress::Unix { path } => path,
        };
        let agent_error = |msg: String| ApiError::new(StatusCode::BAD_GATEWAY, "agent_error", msg);
        let stream = tokio::time::timeout(AGENT_CONNECT_TIMEOUT, tokio::net::UnixStream::connect(path))
            .await
            .map_err(|_| agent_error("timed out connecting to the sandbox agent".into()))?
            .map_err(|e| agent_error(format!("connecting to the sandbox agent: {e}")))?;
        let (mux, incoming) = Mux::new(stream, Role::Host);
        // The agent opens streams only to relay egress connections; anything else is refused.
        network::accept_from_agent(self.egress.clone(), incoming);
        *current = Some(mux.clone());
        Ok(mux)
    }
}

pub struct Manager {
    backend: Arc<dyn Backend>,
    db: Db,
    sandboxes_dir: PathBuf,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Slots taken by sandboxes being created or running.
    slots: Mutex<BTreeSet<u32>>,
    last_purge: Mutex<i64>,
    egress: EgressHub,
    snapshots: crate::snapshots::Snapshots,
    /// The code interpreter, for the variables in snapshots (set once the router exists).
    interpreter: std::sync::OnceLock<std::sync::Weak<dyn InterpreterState>>,
    /// Warm pools: sandboxes started ahead of time, handed out by create.
    pools: pool::Pools,
}

/// Locks a std mutex whose data stays consistent even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Manager {
    pub async fn new(
        backend: Arc<dyn Backend>,
        db: Db,
        sandboxes_dir: PathBuf,
        egress: Arc<corral_egress::Egress>,
        pools: Vec<crate::pools::PoolConfig>,
    ) -> Result<Arc<Manager>, ServerError> {
        std::fs::create_dir_all(&sandboxes_dir)
            .map_err(|e| ServerError::io(format!("creating {}", sandboxes_dir.display()), e))?;
        // Agent sockets live here; only the daemon may reach them.
        std::fs::set_permissions(&sandboxes_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| ServerError::io(format!("chmod {}", sandboxes_dir.display()), e))?;
        let secrets = crate::secrets::SecretStore::open(db.clone()).await?;
        let data_dir = sandboxes_dir.parent().map(std::path::Path::to_path_buf).unwrap_or_else(|| sandboxes_dir.clone());
        let snapshots = crate::snapshots::Snapshots::open(db.clone(), &data_dir).await?;
        let pools = pool::Pools::open(crate::pools::PoolStore::open(db.clone()).await?, pools).await?;
        let manager = Arc::new(Manager {
            egress: EgressHub { egress, secrets },
            backend,
            db,
            sandboxes_dir,
            live: Mutex::new(HashMap::new()),
            slots: Mutex::new(BTreeSet::new()),
            last_purge: Mutex::new(0),
            snapshots,
            interpreter: std::sync::OnceLock::new(),
            pools,
        });
        if let Err(err) = manager.clean_pooled_leftovers().await {
            tracing::warn!(%err, "cleaning up the pooled sandboxes of the previous run failed");
        }
        manager.recover_previous_run().await?;
        Ok(manager)
    }

    pub async fn create(self: &Arc<Self>, spec: SandboxSpec) -> Result<SandboxInfo, ApiError> {
        self.create_traced(spec).await.map(|(info, _)| info)
    }

    /// [`Manager::create`], also saying whether a warm pool served it.
    pub async fn create_traced(self: &Arc<Self>, spec: SandboxSpec) -> Result<(SandboxInfo, bool), ApiError> {
        spec.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
        // A snapshot's settings, under what the request sets itself.
        let spec = self.resolve_snapshot_spec(spec).await?;
        let limits = spec.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
        let this = self.clone();
        // Run to completion even if the client hangs up: a started sandbox must end up
        // either recorded as running or destroyed.
        tokio::spawn(async move {
            if let Some(info) = this.take_pooled(&spec, limits).await {
                return Ok((info, true));
            }
            this.create_inner(spec, limits).await.map(|info| (info, false))
        })
            .await
            .map_err(|e| ApiError::internal(format!("create task failed: {e}")))?
    }

    async fn create_inner(&self, spec: SandboxSpec, limits: ResolvedLimits) -> Result<SandboxInfo, ApiError> {
        let slot = self.alloc_slot()?;
        let mut row = new_row(spec, limits, slot, State::Creating);
        let live = self.record_and_start(&row, slot).await?;
        row.state = State::Running;
        row.host_pid = live.sandbox.host_pid();
        row.agent_address = Some(live.address.clone());
        lock(&self.live).insert(row.id.clone(), live.clone());
        if let Err(e) = self.db.mark_running(&row.id, row.host_pid, &live.address).await {
            let _ = self.release(live, State::Exited, "failed").await;
            return Err(e.into());
        }
        tracing::info!(id = %row.id, host_id_base = row.host_id_base, "sandbox started");
        Ok(SandboxInfo::from(&row))
    }

    /// Records `row` (so a crash mid-start leaves a trace for the next run), then starts it.
    /// On failure nothing is left behind: no row, no run dir, no id slot.
    async fn record_and_start(&self, row: &SandboxRow, slot: u32) -> Result<Arc<Live>, ApiError> {
        if let Err(e) = self.db.insert_sandbox(row.clone()).await {
            self.free_slot(slot);
            return Err(e.into());
        }
        let run_dir = self.sandboxes_dir.join(&row.id);
        match self.start_from(row, slot, run_dir.clone()).await {
            Ok(live) => Ok(live),
            Err(err) => {
                remove_dir(run_dir).await;
                if let Err(e) = self.db.delete_sandbox(&row.id).await {
                    tracing::error!(id = %row.id, %e, "could not delete the row of a failed sandbox");
                }
                self.free_slot(slot);
                Err(err)
            }
        }
    }

    /// [`Manager::start`], then the snapshot the spec names (if any) applied inside.
    async fn start_from(&self, row: &SandboxRow, slot: u32, run_dir: PathBuf) -> Result<Arc<Live>, ApiError> {
        let Some(snapshot_id) = &row.spec.from_snapshot else { return self.start(row, slot, run_dir).await };
        let snapshot = self.snapshots.get(snapshot_id).await?.ok_or_else(|| ApiError::not_found(format!("no snapshot {snapshot_id:?}")))?;
        self.start_restored(row, slot, run_dir, &snapshot).await
    }

    /// [`Manager::start`], then `snapshot`'s layer applied inside; the new sandbox is destroyed
    /// again if that fails. Used by create-from, rollback and waking a hibernated sandbox.
    async fn start_restored(
        &self,
        row: &SandboxRow,
        slot: u32,
        run_dir: PathBuf,
        snapshot: &crate::snapshots::SnapshotInfo,
    ) -> Result<Arc<Live>, ApiError> {
        let live = self.start(row, slot, run_dir).await?;
        if let Err(err) = self.restore_layer(&live, snapshot).await {
            let l = live.clone();
            let _ = tokio::task::spawn_blocking(move || l.sandbox.destroy()).await;
            return Err(err);
        }
        Ok(live)
    }

    async fn start(&self, row: &SandboxRow, slot: u32, run_dir: PathBuf) -> Result<Arc<Live>, ApiError> {
        tokio::fs::create_dir_all(&run_dir)
            .await
            .map_err(|e| ApiError::internal(format!("creating {}: {e}", run_dir.display())))?;
        let config = jail_config(row, run_dir.clone());
        let egress = self.egress.for_new_sandbox(row).await?;
        let boot = AgentBoot { env: network::boot_env(row, &egress) };
        let backend = self.backend.clone();
        let sandbox = tokio::task::spawn_blocking(move || backend.start(&config, &boot))
            .await
            .map_err(|e| ApiError::internal(format!("start task failed: {e}")))?
            .map_err(jail_error)?;
        let live = Live::new(row.id.clone(), sandbox, slot, run_dir, egress, false);
        if let Err(err) = self.trust_ca(&live).await {
            let l = live.clone();
            let _ = tokio::task::spawn_blocking(move || l.sandbox.destroy()).await;
            return Err(err);
        }
        Ok(live)
    }

    pub async fn get(&self, id: &str) -> Result<SandboxInfo, ApiError> {
        match self.db.get_sandbox(id).await? {
            Some(row) if row.state != State::Creating => Ok(SandboxInfo::from(&row)),
            _ => Err(not_found(id)),
        }
    }

    /// Sandboxes in any of `states` (all when empty) whose metadata has every pair in `metadata`.
    pub async fn list(&self, states: Vec<State>, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>, ApiError> {
        let rows = self.db.list_sandboxes(states).await?;
        Ok(rows
            .iter()
            .filter(|row| metadata.iter().all(|(k, v)| row.spec.metadata.get(k) == Some(v)))
            .map(SandboxInfo::from)
            .collect())
    }

    /// Kills a sandbox. Killing one that already ended is not an error.
    pub async fn kill(self: &Arc<Self>, id: &str) -> Result<(), ApiError> {
        let live = lock(&self.live).get(id).cloned();
        match live {
            Some(live) => {
                let this = self.clone();
                tokio::spawn(async move { this.release(live, State::Killed, "killed").await })
                    .await
                    .map_err(|e| ApiError::internal(format!("kill task failed: {e}")))?
            }
            None => match self.db.get_sandbox(id).await? {
                Some(row) if row.state == State::Paused && row.hibernated.is_some() => self.kill_hibernated(&row).await,
                _ => self.get(id).await.map(|_| ()),
            },
        }
    }

    pub async fn set_timeout(&self, id: &str, secs: u64) -> Result<SandboxInfo, ApiError> {
        if secs == 0 || secs > MAX_TIMEOUT_SECS {
            return Err(ApiError::invalid(format!("timeout {secs} is out of range (1 to {MAX_TIMEOUT_SECS} seconds)")));
        }
        self.live(id).await?;
        let expires_at = now_ms().saturating_add(secs as i64 * 1000);
        if !self.db.set_expiry(id, expires_at, secs).await? {
            return Err(ApiError::conflict(format!("sandbox {id} is not running")));
        }
        self.get(id).await
    }

    /// The agent connection of a running sandbox.
    pub async fn agent(&self, id: &str) -> Result<Mux, ApiError> {
        let live = self.live(id).await?;
        if live.paused.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(pause::paused_error(id));
        }
        live.agent().await
    }

    pub async fn usage(&self, id: &str) -> Result<ResourceUsage, ApiError> {
        let live = self.live(id).await?;
        tokio::task::spawn_blocking(move || live.sandbox.usage())
            .await
            .map_err(|e| ApiError::internal(format!("usage task failed: {e}")))?
            .map_err(jail_error)
    }

    async fn live(&self, id: &str) -> Result<Arc<Live>, ApiError> {
        if let Some(live) = lock(&self.live).get(id).cloned() {
            return Ok(live);
        }
        match self.db.get_sandbox(id).await? {
            Some(row) if row.state == State::Paused => Err(pause::paused_error(id)),
            Some(row) if row.state != State::Creating => {
                Err(ApiError::conflict(format!("sandbox {id} is not running (state: {})", row.state.as_str())))
            }
            _ => Err(not_found(id)),
        }
    }

    /// Destroys the sandbox and frees everything it held: backend resources, the agent
    /// connection, its run directory and its id slot. Safe to call concurrently.
    async fn release(&self, live: Arc<Live>, state: State, reason: &str) -> Result<(), ApiError> {
        let mut released = live.released.lock().await;
        if *released {
            return Ok(());
        }
        let l = live.clone();
        tokio::task::spawn_blocking(move || l.sandbox.destroy())
            .await
            .map_err(|e| ApiError::internal(format!("destroy task failed: {e}")))?
            .map_err(|e| {
                // The slot stays taken: reusing ids of a sandbox that may still run would
                // let two sandboxes share users. The reaper retries.
                tracing::error!(id = %live.id, %e, "destroying sandbox failed");
                ApiError::internal(format!("destroying sandbox: {e}"))
            })?;
        *released = true;
        live.mux.lock().await.take();
        let recorded = self.db.mark_ended(&live.id, state, reason, now_ms()).await;
        if let Err(err) = self.egress.secrets.forget_placeholders(&live.id).await {
            tracing::warn!(id = %live.id, %err, "could not forget the sandbox's placeholders");
        }
        lock(&self.live).remove(&live.id);
        remove_dir(live.run_dir.clone()).await;
        self.free_slot(live.slot);
        tracing::info!(id = %live.id, reason, "sandbox released");
        recorded?;
        Ok(())
    }

    pub fn spawn_reaper(self: Arc<Self>) {
        let weak = Arc::downgrade(&self);
        drop(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REAP_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                // Holding only a weak reference lets the manager (and this task) go away
                // when the server is dropped.
                let Some(manager) = weak.upgrade() else { break };
                manager.reap_once().await;
            }
        });
    }

    /// Kills expired sandboxes, releases those whose init died, forgets old ended ones.
    async fn reap_once(&self) {
        let now = now_ms();
        match self.db.expired(now).await {
            Ok(ids) => {
                let ids = self.pause_those_that_pause_on_timeout(ids).await;
                let expired: Vec<_> = ids.iter().filter_map(|id| lock(&self.live).get(id).cloned()).collect();
                let kills = expired.into_iter().map(|live| self.release(live, State::Killed, "timeout"));
                for result in futures::future::join_all(kills).await {
                    if let Err(e) = result {
                        tracing::warn!(%e, "killing an expired sandbox failed");
                    }
                }
            }
            Err(e) => tracing::error!(%e, "reading expired sandboxes failed"),
        }

        let lives: Vec<Arc<Live>> = lock(&self.live).values().cloned().collect();
        if !lives.is_empty() {
            let dead = tokio::task::spawn_blocking(move || {
                lives.into_iter().filter(|l| !l.sandbox.is_running()).collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            let releases = dead.into_iter().map(|live| self.release(live, State::Exited, "exited"));
            for result in futures::future::join_all(releases).await {
                if let Err(e) = result {
                    tracing::warn!(%e, "releasing an exited sandbox failed");
                }
            }
        }

        if let Some(after) = pause::hibernate_after() {
            self.hibernate_idle(after).await;
        }

        let purge_due = {
            let mut last = lock(&self.last_purge);
            let due = now - *last >= PURGE_INTERVAL_MS;
            if due {
                *last = now;
            }
            due
        };
        if purge_due {
            if let Err(e) = self.db.purge_ended(now - RETENTION_MS).await {
                tracing::warn!(%e, "purging old sandboxes failed");
            }
        }
    }

    /// Destroys every running sandbox; used on daemon shutdown.
    /// Stops managing without killing: pooled sandboxes are destroyed (nobody owns them),
    /// user sandboxes keep running and are re-attached by the next daemon start.
    pub async fn detach(&self) {
        self.shutdown_pools().await;
        let lives: Vec<Arc<Live>> = lock(&self.live).values().cloned().collect();
        for live in lives {
            live.mux.lock().await.take();
        }
        tracing::info!("sandboxes left running for the next start");
    }

    pub async fn shutdown(&self) {
        self.shutdown_pools().await;
        let lives: Vec<Arc<Live>> = lock(&self.live).values().cloned().collect();
        let releases = lives.into_iter().map(|live| self.release(live, State::Killed, "shutdown"));
        for result in futures::future::join_all(releases).await {
            if let Err(e) = result {
                tracing::error!(%e, "destroying a sandbox at shutdown failed");
            }
        }
    }

    fn alloc_slot(&self) -> Result<u32, ApiError> {
        let mut slots = lock(&self.slots);
        // Lowest free slot: the first gap in the sorted set.
        let slot = slots.iter().enumerate().find(|(i, s)| *i as u32 != **s).map_or(slots.len() as u32, |(i, _)| i as u32);
        if slot >= MAX_SLOTS {
            return Err(ApiError::unavailable("no free sandbox id range: too many sandboxes are running"));
        }
        slots.insert(slot);
        Ok(slot)
    }

    fn free_slot(&self, slot: u32) {
        lock(&self.slots).remove(&slot);
    }
}

/// A fresh row for a sandbox about to start in `slot`; pooled sandboxes have no timeout yet.
fn new_row(spec: SandboxSpec, limits: ResolvedLimits, slot: u32, state: State) -> SandboxRow {
    let now = now_ms();
    let timeout_secs = if state == State::Pooled { 0 } else { spec.timeout_secs() };
    SandboxRow {
        id: new_id(),
        spec,
        limits,
        state,
        created_at: now,
        expires_at: now.saturating_add(timeout_secs as i64 * 1000),
        timeout_secs,
        host_pid: None,
        agent_address: None,
        host_id_base: slot_base(slot),
        ended_at: None,
        end_reason: None,
        paused_at: None,
        remaining_ms: None,
        hibernated: None,
    }
}

fn jail_config(row: &SandboxRow, run_dir: PathBuf) -> JailConfig {
    JailConfig {
        id: row.id.clone(),
        template: row.spec.template().to_string(),
        hostname: hostname(&row.id),
        limits: row.limits,
        volumes: row.spec.volumes.clone(),
        run_dir,
        host_id_base: row.host_id_base,
    }
}

pub fn slot_base(slot: u32) -> u32 {
    FIRST_HOST_ID + slot * ID_RANGE
}

fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..ID_LEN).map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])).collect()
}

fn hostname(id: &str) -> String {
    format!("corral-{}", id.get(..8).unwrap_or(id))
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no sandbox {id:?}"))
}

fn jail_error(err: JailError) -> ApiError {
    match err {
        JailError::UnknownTemplate(_) | JailError::Config(_) => ApiError::invalid(err.to_string()),
        JailError::Unsupported(_) => ApiError::new(StatusCode::NOT_IMPLEMENTED, "unsupported", err.to_string()),
        JailError::Os { .. } | JailError::Start(_) => ApiError::internal(err.to_string()),
        JailError::Gone(_) => ApiError::new(StatusCode::CONFLICT, "not_running", err.to_string()),
    }
}

async fn remove_dir(dir: PathBuf) {
    match tokio::fs::remove_dir_all(&dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), %e, "could not remove run directory"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_inside_u32_and_ids_are_lowercase_alnum() {
        assert_eq!(slot_base(0), 200_000);
        assert!(u64::from(slot_base(MAX_SLOTS - 1)) + u64::from(ID_RANGE) < u64::from(u32::MAX));
        let id = new_id();
        assert_eq!(id.len(), ID_LEN);
        assert!(id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
    }
}
