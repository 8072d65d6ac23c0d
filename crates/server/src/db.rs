//! SQLite state: one row per sandbox and the API key hashes.
//!
//! One connection behind a mutex is plenty for a single daemon; every call runs on the
//! blocking pool so a slow disk never stalls the async runtime.

use std::path::Path;
use std::sync::{Arc, Mutex};

use corral_jail::AgentAddress;
use corral_spec::{ResolvedLimits, SandboxSpec};
use rusqlite::{params, Connection, OptionalExtension, Row};

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored row is corrupt: {0}")]
    Corrupt(String),
    #[error("database task failed: {0}")]
    Task(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Row written, backend still starting it. Never returned by the API.
    Creating,
    Running,
    /// Frozen: keeps its memory, uses no CPU, its timeout does not run.
    Paused,
    Killed,
    Exited,
    /// Started ahead of time for a warm pool, owned by nobody yet; hidden from lists unless
    /// asked for, destroyed at shutdown, never reported as ended.
    Pooled,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Paused => "paused",
            State::Killed => "killed",
            State::Exited => "exited",
            State::Pooled => "pooled",
        }
    }

    fn parse(s: &str) -> Result<State, DbError> {
        Ok(match s {
            "creating" => State::Creating,
            "running" => State::Running,
            "paused" => State::Paused,
            "killed" => State::Killed,
            "exited" => State::Exited,
            "pooled" => State::Pooled,
            other => return Err(DbError::Corrupt(format!("unknown state {other:?}"))),
        })
    }
}

#[derive(Debug, Clone)]
pub struct SandboxRow {
    pub id: String,
    pub spec: SandboxSpec,
    pub limits: ResolvedLimits,
    pub state: State,
    /// Milliseconds since the epoch, like every timestamp here.
    pub created_at: i64,
    pub expires_at: i64,
    pub timeout_secs: u64,
    pub host_pid: Option<u32>,
    pub agent_address: Option<AgentAddress>,
    pub host_id_base: u32,
    pub ended_at: Option<i64>,
    pub end_reason: Option<String>,
    /// When it was paused (state `paused` only).
    pub paused_at: Option<i64>,
    /// Milliseconds of its timeout left when it was paused.
    pub remaining_ms: Option<i64>,
    /// The snapshot a long-paused sandbox was written to before its processes were released.
    pub hibernated: Option<String>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes (
    id            TEXT PRIMARY KEY,
    spec          TEXT NOT NULL,
    limits        TEXT NOT NULL,
    state         TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    timeout_secs  INTEGER NOT NULL,
    host_pid      INTEGER,
    agent_address TEXT,
    host_id_base  INTEGER NOT NULL,
    ended_at      INTEGER,
    end_reason    TEXT
);
CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes(state);
CREATE TABLE IF NOT EXISTS api_keys (
    sha256     TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
";

const COLUMNS: &str = "id, spec, limits, state, created_at, expires_at, timeout_secs, host_pid, agent_address, \
                       host_id_base, ended_at, end_reason, paused_at, remaining_ms, hibernated";

/// Columns added after the first schema; added to older databases when they are opened.
const ADDED_COLUMNS: [(&str, &str); 3] = [("paused_at", "INTEGER"), ("remaining_ms", "INTEGER"), ("hibernated", "TEXT")];

fn add_missing_columns(conn: &Connection) -> Result<(), DbError> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('sandboxes')")?;
    let existing = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
    for (name, kind) in ADDED_COLUMNS {
        if !existing.iter().any(|e| e == name) {
            conn.execute_batch(&format!("ALTER TABLE sandboxes ADD COLUMN {name} {kind}"))?;
        }
    }
    Ok(())
}

#[derive(Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
}

impl Db {
    pub fn open(path: &Path) -> Result<Db, DbError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        add_missing_columns(&conn)?;
        Ok(Db { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Runs `f` with the connection on the blocking pool.
    pub async fn call<T, F>(&self, f: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock cannot leave SQLite half-written (transactions
            // roll back), so a poisoned lock is still safe to use.
            let mut guard = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| DbError::Task(e.to_string()))?
    }

    pub async fn insert_sandbox(&self, row: SandboxRow) -> Result<(), DbError> {
        self.call(move |c| {
            c.execute(
                &format!("INSERT INTO sandboxes ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"),
                params![
                    row.id,
                    to_json(&row.spec)?,
                    to_json(&row.limits)?,
                    row.state.as_str(),
                    row.created_at,
                    row.expires_at,
                    row.timeout_secs as i64,
                    row.host_pid,
                    row.agent_address.as_ref().map(to_json).transpose()?,
                    row.host_id_base,
                    row.ended_at,
                    row.end_reason,
                    row.paused_at,
                    row.remaining_ms,
                    row.hibernated,
                ],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn mark_running(&self, id: &str, host_pid: Option<u32>, address: &AgentAddress) -> Result<(), DbError> {
        let (id, address) = (id.to_string(), to_json(address)?);
        self.call(move |c| {
            c.execute(
                "UPDATE sandboxes SET state = 'running', host_pid = ?2, agent_address = ?3 WHERE id = ?1",
                params![id, host_pid, address],
            )?;
            Ok(())
        })
        .await
    }

    /// Records the end of a sandbox; returns false if it had already ended.
    pub async fn mark_ended(&self, id: &str, state: State, reason: &str, at: i64) -> Result<bool, DbError> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.call(move |c| {
            let n = c.execute(
                "UPDATE sandboxes SET state = ?2, end_reason = ?3, ended_at = ?4 \
                 WHERE id = ?1 AND state IN ('creating', 'running', 'paused')",
                params![id, state.as_str(), reason, at],
            )?;
            Ok(n > 0)
        })
        .await
    }

    /// Sets the deadline of a running sandbox, or the time a paused one will have once resumed.
    pub async fn set_expiry(&self, id: &str, expires_at: i64, timeout_secs: u64) -> Result<bool, DbError> {
        let id = id.to_string();
        self.call(move |c| {
            let n = c.execute(
                "UPDATE sandboxes SET expires_at = ?2, timeout_secs = ?3, \
                 remaining_ms = CASE WHEN state = 'paused' THEN ?3 * 1000 ELSE remaining_ms END \
                 WHERE id = ?1 AND state IN ('running', 'paused')",
                params![id, expires_at, timeout_secs as i64],
            )?;
            Ok(n > 0)
        })
        .await
    }

    /// Running → paused, keeping what is left of its timeout. False if it was not running.
    pub async fn mark_paused(&self, id: &str, at: i64) -> Result<bool, DbError> {
        let id = id.to_string();
        self.call(move |c| {
            let n = c.execute(
                "UPDATE sandboxes SET state = 'paused', paused_at = ?2, remaining_ms = MAX(expires_at - ?2, 0) \
                 WHERE id = ?1 AND state = 'running'",
                params![id, at],
            )?;
            Ok(n > 0)
        })
        .await
    }

    /// Paused → running; the deadline is what was left (a sandbox paused by its own timeout
    /// gets its whole timeout again). False if it was not paused.
    pub async fn mark_resumed(&self, id: &str, at: i64) -> Result<bool, DbError> {
        let id = id.to_string();
        self.call(move |c| {
            let n = c.execute(
                "UPDATE sandboxes SET state = 'running', \
                 expires_at = ?2 + CASE WHEN COALESCE(remaining_ms, 0) > 0 THEN remaining_ms ELSE timeout_secs * 1000 END, \
                 paused_at = NULL, remaining_ms = NULL, hibernated = NULL \
                 WHERE id = ?1 AND state = 'paused'",
                params![id, at],
            )?;
            Ok(n > 0)
        })
        .await
    }

    /// A woken hibernated sandbox got a new id range.
    pub async fn set_host_id_base(&self, id: &str, base: u32) -> Result<(), DbError> {
        let id = id.to_string();
        self.call(move |c| {
            c.execute("UPDATE sandboxes SET host_id_base = ?2 WHERE id = ?1", params![id, base])?;
            Ok(())
        })
        .await
    }

    /// Records that a paused sandbox now lives only in `snapshot` (its processes are gone).
    pub async fn mark_hibernated(&self, id: &str, snapshot: Option<&str>) -> Result<bool, DbError> {
        let (id, snapshot) = (id.to_string(), snapshot.map(str::to_string));
        self.call(move |c| {
            let n = c.execute(
                "UPDATE sandboxes SET hibernated = ?2, host_pid = CASE WHEN ?2 IS NULL THEN host_pid ELSE NULL END \
                 WHERE id = ?1 AND state = 'paused'",
                params![id, snapshot],
            )?;
            Ok(n > 0)
        })
        .await
    }

    pub async fn delete_sandbox(&self, id: &str) -> Result<(), DbError> {
        let id = id.to_string();
        self.call(move |c| {
            c.execute("DELETE FROM sandboxes WHERE id = ?1", params![id])?;
            Ok(())
        })
        .await
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRow>, DbError> {
        let id = id.to_string();
        self.call(move |c| {
            c.query_row(&format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1"), params![id], |r| Ok(read_row(r)))
                .optional()?
                .transpose()
        })
        .await
    }

    /// Sandboxes in any of `states` (all but pooled ones when empty), newest first.
    pub async fn list_sandboxes(&self, states: Vec<State>) -> Result<Vec<SandboxRow>, DbError> {
        self.call(move |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM sandboxes WHERE state != 'creating' ORDER BY created_at DESC, id"
            ))?;
            let rows = stmt.query_map([], |r| Ok(read_row(r)))?;
            let mut out = Vec::new();
            for row in rows {
                let row = row??;
                let wanted = if states.is_empty() { row.state != State::Pooled } else { states.contains(&row.state) };
                if wanted {
                    out.push(row);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Ids of running sandboxes whose deadline is at or before `now`.
    pub async fn expired(&self, now: i64) -> Result<Vec<String>, DbError> {
        self.call(move |c| {
            let mut stmt = c.prepare("SELECT id FROM sandboxes WHERE state = 'running' AND expires_at <= ?1")?;
            let ids = stmt.query_map(params![now], |r| r.get::<_, String>(0))?;
            Ok(ids.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Rows left `creating`/`running` by a previous daemon process.
    pub async fn unfinished(&self) -> Result<Vec<SandboxRow>, DbError> {
        self.call(move |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM sandboxes WHERE state IN ('creating', 'running', 'paused')"
            ))?;
            let rows = stmt.query_map([], |r| Ok(read_row(r)))?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row??);
            }
            Ok(out)
        })
        .await
    }

    /// Every row in `state`.
    pub async fn in_state(&self, state: State) -> Result<Vec<SandboxRow>, DbError> {
        self.call(move |c| {
            let mut stmt = c.prepare(&format!("SELECT {COLUMNS} FROM sandboxes WHERE state = ?1"))?;
            let rows = stmt.query_map(params![state.as_str()], |r| Ok(read_row(r)))?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row??);
            }
            Ok(out)
        })
        .await
    }

    /// Forgets sandboxes that ended before `cutoff`; returns how many.
    pub async fn purge_ended(&self, cutoff: i64) -> Result<usize, DbError> {
        self.call(move |c| {
            Ok(c.execute(
                "DELETE FROM sandboxes WHERE state IN ('killed', 'exited') AND ended_at < ?1",
                params![cutoff],
            )?)
        })
        .await
    }

    pub async fn api_key_hashes(&self) -> Result<Vec<String>, DbError> {
        self.call(|c| {
            let mut stmt = c.prepare("SELECT sha256 FROM api_keys")?;
            let hashes = stmt.query_map([], |r| r.get::<_, String>(0))?;
            Ok(hashes.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn add_api_key_hash(&self, sha256: String, at: i64) -> Result<(), DbError> {
        self.call(move |c| {
            c.execute("INSERT OR IGNORE INTO api_keys (sha256, created_at) VALUES (?1, ?2)", params![sha256, at])?;
            Ok(())
        })
        .await
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, DbError> {
    serde_json::to_string(value).map_err(|e| DbError::Corrupt(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, DbError> {
    serde_json::from_str(text).map_err(|e| DbError::Corrupt(format!("{what}: {e}")))
}

/// Decodes one row; the outer `rusqlite::Result` is for column access, the inner for content.
fn read_row(r: &Row<'_>) -> Result<SandboxRow, DbError> {
    let spec: String = r.get(1)?;
    let limits: String = r.get(2)?;
    let state: String = r.get(3)?;
    let address: Option<String> = r.get(8)?;
    let timeout_secs: i64 = r.get(6)?;
    Ok(SandboxRow {
        id: r.get(0)?,
        spec: from_json(&spec, "spec")?,
        limits: from_json(&limits, "limits")?,
        state: State::parse(&state)?,
        created_at: r.get(4)?,
        expires_at: r.get(5)?,
        timeout_secs: u64::try_from(timeout_secs).unwrap_or(0),
        host_pid: r.get(7)?,
        agent_address: address.as_deref().map(|a| from_json(a, "agent_address")).transpose()?,
        host_id_base: r.get(9)?,
        ended_at: r.get(10)?,
        end_reason: r.get(11)?,
        paused_at: r.get(12)?,
        remaining_ms: r.get(13)?,
        hibernated: r.get(14)?,
    })
}
