//! Warm pools: per template, sandboxes started ahead of time and handed out by create.
//!
//! A pooled sandbox is a normal sandbox (row in SQLite with state `pooled`, live handle,
//! connected agent) that nobody owns yet. Handing one out is the hot path and does the
//! minimum: pop it from an in-memory queue, then at once rewrite its row (one UPDATE), send
//! the request's env (`Configure`), rewrite its cgroup limits if they differ, and set its
//! egress policy. It is never restarted. A background task keeps each pool at its target:
//! `max` while requests come in, `min` once none came for `idle_secs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_proto::{Event, Request};
use corral_spec::{ResolvedLimits, SandboxSpec};

use super::{jail_config, jail_error, lock, new_row, remove_dir, slot_base, Live, Manager, SandboxInfo};
use crate::db::{DbError, SandboxRow, State};
use crate::error::ApiError;
use crate::pools::{PoolConfig, PoolStats, PoolStore};
use crate::time::now_ms;

/// How often pools are checked even when nothing wakes the task (idle trimming, deaths).
const TEND_INTERVAL: Duration = Duration::from_millis(250);
/// Sandboxes started at once per pool: more only competes with user requests for the CPUs.
const FILL_PARALLEL: u32 = 2;
/// Refill times kept for the median.
const REFILL_WINDOW: usize = 64;
/// Wait after a failed refill before trying again (a missing template must not spin).
const FAIL_BACKOFF: Duration = Duration::from_secs(2);

/// Every pool of the daemon.
pub(super) struct Pools {
    store: PoolStore,
    pools: Mutex<HashMap<String, Pool>>,
    /// Wakes the refill task (a sandbox was taken, a pool was configured).
    wake: Arc<tokio::sync::Notify>,
    /// Set at shutdown: nothing is started or handed out any more.
    closed: AtomicBool,
}

struct Pool {
    config: PoolConfig,
    ready: VecDeque<Pooled>,
    starting: u32,
    /// The last create that could have used this pool; `None` until the first one.
    last_demand: Option<Instant>,
    hits: u64,
    misses: u64,
    skipped: u64,
    refills: u64,
    refill_failures: u64,
    refill_ms: VecDeque<f64>,
    last_error: Option<String>,
    retry_after: Option<Instant>,
}

struct Pooled {
    live: Arc<Live>,
    limits: ResolvedLimits,
}

impl Pool {
    fn new(config: PoolConfig) -> Pool {
        Pool {
            config,
            ready: VecDeque::new(),
            starting: 0,
            last_demand: None,
            hits: 0,
            misses: 0,
            skipped: 0,
            refills: 0,
            refill_failures: 0,
            refill_ms: VecDeque::new(),
            last_error: None,
            retry_after: None,
        }
    }

    /// `max` while requests come in, `min` once none came for the idle time.
    fn target(&self, now: Instant) -> u32 {
        match self.last_demand {
            Some(at) if now.duration_since(at) < self.config.idle() => self.config.max,
            _ => self.config.min,
        }
    }

    fn stats(&self, now: Instant) -> PoolStats {
        let mut times: Vec<f64> = self.refill_ms.iter().copied().collect();
        times.sort_by(f64::total_cmp);
        PoolStats {
            template: self.config.template.clone(),
            min: self.config.min,
            max: self.config.max,
            idle_secs: self.config.idle_secs,
            ready: self.ready.len() as u32,
            starting: self.starting,
            target: self.target(now),
            hits: self.hits,
            misses: self.misses,
            skipped: self.skipped,
            refills: self.refills,
            refill_failures: self.refill_failures,
            refill_p50_ms: times.get(times.len() / 2).map(|ms| (ms * 100.0).round() / 100.0),
            last_error: self.last_error.clone(),
        }
    }
}

impl Pools {
    pub(super) async fn open(store: PoolStore, configured: Vec<PoolConfig>) -> Result<Pools, DbError> {
        // The daemon's own configuration wins over what the API stored earlier, and is stored
        // so later API changes start from it.
        for config in &configured {
            store.save(config).await?;
        }
        let pools = store.load().await?.into_iter().map(|c| (c.template.clone(), Pool::new(c))).collect();
        Ok(Pools { store, pools: Mutex::new(pools), wake: Arc::new(tokio::sync::Notify::new()), closed: AtomicBool::new(false) })
    }
}

/// Whether a create request can be served by a sandbox started from the bare template.
/// Volumes and snapshots change what the sandbox is started from; brokered secrets need
/// placeholders fixed when its proxy state is made.
fn poolable(spec: &SandboxSpec) -> bool {
    spec.volumes.is_empty() && spec.from_snapshot.is_none() && spec.network.secrets.is_empty()
}

impl Manager {
    /// The hot path of create: a pooled sandbox made into the requested one, or `None` (no
    /// pool, empty pool, request the pool cannot serve, or the hand-out failed) for a cold start.
    pub(super) async fn take_pooled(&self, spec: &SandboxSpec, limits: ResolvedLimits) -> Option<SandboxInfo> {
        let (pooled, dead) = {
            let mut pools = lock(&self.pools.pools);
            let pool = pools.get_mut(spec.template())?;
            // The disk is a tmpfs sized at start, and pooled sandboxes have the default size.
            if !poolable(spec) || limits.disk != corral_spec::DEFAULT_DISK {
                pool.skipped += 1;
                return None;
            }
            pool.last_demand = Some(Instant::now());
            let mut dead = Vec::new();
            let mut found = None;
            while let Some(candidate) = pool.ready.pop_front() {
                if candidate.live.sandbox.is_running() {
                    found = Some(candidate);
                    break;
                }
                dead.push(candidate.live);
            }
            match found {
                Some(_) => pool.hits += 1,
                None if self.pools.closed.load(Ordering::SeqCst) => {}
                None => pool.misses += 1,
            }
            (found, dead)
        };
        self.pools.wake.notify_one();
        for live in dead {
            tracing::warn!(id = %live.id, "a pooled sandbox died while waiting");
            self.discard_pooled(live).await;
        }
        let pooled = pooled?;
        let id = pooled.live.id.clone();
        match self.hand_out(pooled, spec.clone(), limits).await {
            Ok(info) => Some(info),
            Err(err) => {
                tracing::warn!(%id, %err, "handing out a pooled sandbox failed; starting one cold");
                None
            }
        }
    }

    async fn hand_out(&self, pooled: Pooled, spec: SandboxSpec, limits: ResolvedLimits) -> Result<SandboxInfo, ApiError> {
        let live = pooled.live;
        let now = now_ms();
        let timeout_secs = spec.timeout_secs();
        let row = SandboxRow {
            id: live.id.clone(),
            spec,
            limits,
            state: State::Running,
            created_at: now,
            expires_at: now.saturating_add(timeout_secs as i64 * 1000),
            timeout_secs,
            host_pid: live.sandbox.host_pid(),
            agent_address: Some(live.address.clone()),
            host_id_base: slot_base(live.slot),
            ended_at: None,
            end_reason: None,
            paused_at: None,
            remaining_ms: None,
            hibernated: None,
        };
        if let Some(egress) = &live.egress {
            egress.set_policy(row.spec.network.policy());
        }
        // The three are independent; doing them at once keeps the hand-out at one round trip.
        let (recorded, configured, limited) =
            tokio::join!(self.claim_row(&row), configure_env(&live, &row), set_limits(&live, pooled.limits, limits));
        if let Err(err) = recorded.and(configured).and(limited) {
            self.discard_pooled(live).await;
            return Err(err);
        }
        lock(&self.live).insert(row.id.clone(), live);
        tracing::info!(id = %row.id, "sandbox handed out from the pool");
        Ok(SandboxInfo::from(&row))
    }

    /// Pooled → running with the request's settings, in one statement.
    async fn claim_row(&self, row: &SandboxRow) -> Result<(), ApiError> {
        let to_json = |v: serde_json::Result<String>| v.map_err(|e| ApiError::internal(format!("encoding the sandbox row: {e}")));
        let (id, spec, limits) = (row.id.clone(), to_json(serde_json::to_string(&row.spec))?, to_json(serde_json::to_string(&row.limits))?);
        let (created, expires, timeout) = (row.created_at, row.expires_at, row.timeout_secs as i64);
        let claimed = self
            .db
            .call(move |c| {
                let mut stmt = c.prepare_cached(
                    "UPDATE sandboxes SET state = 'running', spec = ?2, limits = ?3, created_at = ?4, expires_at = ?5, \
                     timeout_secs = ?6 WHERE id = ?1 AND state = 'pooled'",
                )?;
                Ok(stmt.execute(rusqlite::params![id, spec, limits, created, expires, timeout])? == 1)
            })
            .await?;
        if claimed {
            Ok(())
        } else {
            Err(ApiError::internal(format!("the row of pooled sandbox {} is gone", row.id)))
        }
    }

    /// Destroys a pooled sandbox nobody owns and forgets it entirely (it never was a user's).
    async fn discard_pooled(&self, live: Arc<Live>) {
        let mut released = live.released.lock().await;
        if *released {
            return;
        }
        let l = live.clone();
        match tokio::task::spawn_blocking(move || l.sandbox.destroy()).await {
            Ok(Ok(())) => {}
            // The slot stays taken, as in `release`: its id range may still be in use.
            other => {
                tracing::error!(id = %live.id, ?other, "destroying a pooled sandbox failed");
                return;
            }
        }
        *released = true;
        live.mux.lock().await.take();
        if let Err(err) = self.db.delete_sandbox(&live.id).await {
            tracing::warn!(id = %live.id, %err, "could not delete the row of a pooled sandbox");
        }
        remove_dir(live.run_dir.clone()).await;
        self.free_slot(live.slot);
    }

    /// Starts one sandbox for `template`'s pool.
    async fn start_pooled(&self, template: &str) -> Result<Pooled, ApiError> {
        let spec = SandboxSpec { template: Some(template.to_string()), ..Default::default() };
        let limits = spec.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
        let slot = self.alloc_slot()?;
        let row = new_row(spec, limits, slot, State::Pooled);
        let live = self.record_and_start(&row, slot).await?;
        let (id, pid, address) = (row.id.clone(), live.sandbox.host_pid(), serde_json::to_string(&live.address));
        let recorded = match address {
            Ok(address) => self
                .db
                .call(move |c| {
                    c.execute("UPDATE sandboxes SET host_pid = ?2, agent_address = ?3 WHERE id = ?1", rusqlite::params![id, pid, address])?;
                    Ok(())
                })
                .await
                .map_err(ApiError::from),
            Err(e) => Err(ApiError::internal(e.to_string())),
        };
        let pooled = Pooled { live, limits };
        if let Err(err) = recorded {
            self.discard_pooled(pooled.live).await;
            return Err(err);
        }
        Ok(pooled)
    }

    /// Keeps every pool at its target until the manager goes away or shuts down.
    pub fn spawn_pools(self: Arc<Self>) {
        let weak = Arc::downgrade(&self);
        drop(self);
        tokio::spawn(async move {
            loop {
                let Some(manager) = weak.upgrade() else { break };
                if manager.pools.closed.load(Ordering::SeqCst) {
                    break;
                }
                manager.clone().tend_pools().await;
                let wake = manager.pools.wake.clone();
                // Holding only a weak reference while asleep lets the manager be dropped.
                drop(manager);
                let _ = tokio::time::timeout(TEND_INTERVAL, wake.notified()).await;
            }
        });
    }

    /// Starts what is missing, trims what is in excess, drops what died.
    async fn tend_pools(self: Arc<Self>) {
        let now = Instant::now();
        let mut fills = Vec::new();
        let mut surplus = Vec::new();
        {
            let mut pools = lock(&self.pools.pools);
            for (template, pool) in pools.iter_mut() {
                let (alive, dead): (VecDeque<_>, VecDeque<_>) = pool.ready.drain(..).partition(|p| p.live.sandbox.is_running());
                pool.ready = alive;
                surplus.extend(dead.into_iter().map(|p| p.live));
                let target = pool.target(now) as usize;
                while pool.ready.len() + pool.starting as usize > target {
                    let Some(extra) = pool.ready.pop_back() else { break };
                    surplus.push(extra.live);
                }
                // Checked under the lock that guards `starting`, so shutdown either sees this
                // fill counted or this pass sees the pools closed.
                if pool.retry_after.is_some_and(|t| t > now) || self.pools.closed.load(Ordering::SeqCst) {
                    continue;
                }
                while pool.ready.len() + (pool.starting as usize) < target && pool.starting < FILL_PARALLEL {
                    pool.starting += 1;
                    fills.push(template.clone());
                }
            }
        }
        for template in fills {
            let this = self.clone();
            tokio::spawn(async move { this.fill_one(template).await });
        }
        for live in surplus {
            self.discard_pooled(live).await;
        }
    }

    async fn fill_one(self: Arc<Self>, template: String) {
        let started = Instant::now();
        let result = self.start_pooled(&template).await;
        let unwanted = {
            let mut pools = lock(&self.pools.pools);
            let closed = self.pools.closed.load(Ordering::SeqCst);
            match (pools.get_mut(&template), result) {
                (Some(pool), Ok(pooled)) => {
                    pool.starting = pool.starting.saturating_sub(1);
                    pool.refills += 1;
                    pool.last_error = None;
                    if pool.refill_ms.len() == REFILL_WINDOW {
                        pool.refill_ms.pop_front();
                    }
                    pool.refill_ms.push_back(started.elapsed().as_secs_f64() * 1000.0);
                    if closed || pool.ready.len() >= pool.config.max as usize {
                        Some(pooled.live)
                    } else {
                        pool.ready.push_back(pooled);
                        None
                    }
                }
                (Some(pool), Err(err)) => {
                    pool.starting = pool.starting.saturating_sub(1);
                    pool.refill_failures += 1;
                    pool.last_error = Some(err.to_string());
                    pool.retry_after = Some(Instant::now() + FAIL_BACKOFF);
                    tracing::warn!(%template, %err, "starting a pooled sandbox failed");
                    None
                }
                // The pool was deleted meanwhile.
                (None, Ok(pooled)) => Some(pooled.live),
                (None, Err(_)) => None,
            }
        };
        match unwanted {
            Some(live) => self.discard_pooled(live).await,
            None => self.pools.wake.notify_one(),
        }
    }

    /// Destroys every pooled sandbox, waiting for those being started; used on shutdown.
    pub(super) async fn shutdown_pools(&self) {
        self.pools.closed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && lock(&self.pools.pools).values().any(|p| p.starting > 0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all: Vec<Arc<Live>> = lock(&self.pools.pools).values_mut().flat_map(|p| p.ready.drain(..)).map(|p| p.live).collect();
        futures::future::join_all(all.into_iter().map(|live| self.discard_pooled(live))).await;
    }

    /// Destroys what pooled sandboxes a previous daemon run left behind (after a crash):
    /// nobody owned them, so starting afresh is simpler than re-adopting them.
    pub(super) async fn clean_pooled_leftovers(&self) -> Result<(), ApiError> {
        for row in self.db.in_state(State::Pooled).await? {
            let config = jail_config(&row, self.sandboxes_dir.join(&row.id));
            let backend = self.backend.clone();
            let host_pid = row.host_pid;
            let cleaned = tokio::task::spawn_blocking(move || match backend.recover(&config, host_pid) {
                Ok(sandbox) => sandbox.destroy(),
                Err(_) => backend.cleanup(&config),
            })
            .await
            .map_err(|e| ApiError::internal(format!("cleanup task failed: {e}")))?;
            if let Err(err) = cleaned.map_err(jail_error) {
                tracing::warn!(id = %row.id, %err, "could not clean up a pooled sandbox of the previous run");
            }
            remove_dir(self.sandboxes_dir.join(&row.id)).await;
            self.db.delete_sandbox(&row.id).await?;
        }
        Ok(())
    }

    pub fn pool_stats(&self) -> Vec<PoolStats> {
        let now = Instant::now();
        let mut stats: Vec<PoolStats> = lock(&self.pools.pools).values().map(|p| p.stats(now)).collect();
        stats.sort_by(|a, b| a.template.cmp(&b.template));
        stats
    }

    /// Creates or changes a pool (kept: its ready sandboxes and counters) and stores it.
    pub async fn set_pool(&self, config: PoolConfig) -> Result<PoolStats, ApiError> {
        config.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
        self.pools.store.save(&config).await?;
        let stats = {
            let mut pools = lock(&self.pools.pools);
            let pool = pools.entry(config.template.clone()).or_insert_with(|| Pool::new(config.clone()));
            pool.config = config;
            pool.retry_after = None;
            pool.stats(Instant::now())
        };
        self.pools.wake.notify_one();
        Ok(stats)
    }

    /// Removes a pool and destroys its ready sandboxes. False if there was none.
    pub async fn delete_pool(&self, template: &str) -> Result<bool, ApiError> {
        let stored = self.pools.store.delete(template).await?;
        let removed = lock(&self.pools.pools).remove(template);
        if let Some(pool) = &removed {
            futures::future::join_all(pool.ready.iter().map(|p| self.discard_pooled(p.live.clone()))).await;
        }
        Ok(stored || removed.is_some())
    }
}

/// Sends the request's env; a pooled sandbox booted with none, so an empty env needs nothing.
async fn configure_env(live: &Live, row: &SandboxRow) -> Result<(), ApiError> {
    if row.spec.env.is_empty() {
        return Ok(());
    }
    let mux = live.agent().await?;
    let (mut tx, mut rx) = mux.open(&Request::Configure { env: row.spec.env.clone() }).map_err(ApiError::from_mux)?.split();
    tx.end().map_err(ApiError::from_mux)?;
    match rx.recv_event().await {
        Ok(Some(Event::Ok)) => Ok(()),
        Ok(Some(Event::Error { kind, message })) => Err(ApiError::from_agent(kind, message)),
        Ok(other) => Err(ApiError::internal(format!("unexpected answer to Configure: {other:?}"))),
        Err(e) => Err(ApiError::from_mux(e)),
    }
}

async fn set_limits(live: &Arc<Live>, current: ResolvedLimits, wanted: ResolvedLimits) -> Result<(), ApiError> {
    if current == wanted {
        return Ok(());
    }
    let l = live.clone();
    tokio::task::spawn_blocking(move || l.sandbox.set_limits(&wanted))
        .await
        .map_err(|e| ApiError::internal(format!("limits task failed: {e}")))?
        .map_err(jail_error)
}
