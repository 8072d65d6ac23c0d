//! The snapshot store: metadata in SQLite (`snapshots` table), layers as zstd-compressed tar
//! blobs under `<data>/snapshots/layers/<sha256>.tar.zst`, named by the hash of the
//! compressed bytes, so a layer taken twice (an unchanged sandbox, a fork's parent) is stored
//! once and removed with its last snapshot.
//!
//! The daemon never unpacks a layer: the tar comes from a sandbox and is only ever applied
//! by an agent inside a sandbox. Here it is bytes, bounded in size, hashed and compressed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use corral_spec::SandboxSpec;
use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::db::{Db, DbError};
use crate::error::ApiError;

/// zstd level: 1 keeps a 100 MB snapshot well under a second on one core.
const ZSTD_LEVEL: i32 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS snapshots (
    id          TEXT PRIMARY KEY,
    sandbox_id  TEXT NOT NULL,
    name        TEXT,
    created_at  INTEGER NOT NULL,
    layer       TEXT NOT NULL,
    info        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_sandbox ON snapshots(sandbox_id);
CREATE INDEX IF NOT EXISTS snapshots_layer ON snapshots(layer);
";

/// A variable the interpreter could not save, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unsaved {
    pub name: String,
    pub reason: String,
}

/// One code-interpreter context as captured: its settings and what its variables became.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedContext {
    pub id: String,
    pub language: String,
    pub cwd: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where in the sandbox's filesystem (so inside the layer) the pickled namespace is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_file: Option<String>,
    /// `dill`, `cloudpickle` or `pickle`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pickler: Option<String>,
    #[serde(default)]
    pub saved: Vec<String>,
    #[serde(default)]
    pub unsaved: Vec<Unsaved>,
}

/// What the API shows for a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub id: String,
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub created_at: String,
    pub template: String,
    /// Settings a sandbox created from it starts with (env, limits, metadata, network policy,
    /// timeout and what the timeout does); volumes are host grants and are not carried over.
    pub spec: SandboxSpec,
    /// sha256 of the compressed layer.
    pub layer: String,
    /// Compressed size on disk.
    pub layer_bytes: u64,
    /// File contents captured (uncompressed).
    pub file_bytes: u64,
    pub entries: u64,
    /// Paths that were not captured, with the reason (at most 100; `skipped_count` is exact).
    #[serde(default)]
    pub skipped: Vec<String>,
    #[serde(default)]
    pub skipped_count: u64,
    #[serde(default)]
    pub interpreter: Vec<SavedContext>,
    /// Milliseconds the sandbox's processes were held frozen.
    pub frozen_ms: u64,
}

/// A layer written to the store.
pub struct StoredLayer {
    pub sha256: String,
    pub compressed: u64,
    pub raw: u64,
}

#[derive(Clone)]
pub struct Snapshots {
    db: Db,
    dir: PathBuf,
}

fn io_error(what: &str, e: std::io::Error) -> ApiError {
    ApiError::internal(format!("snapshot store: {what}: {e}"))
}

impl Snapshots {
    pub async fn open(db: Db, data_dir: &Path) -> Result<Snapshots, crate::ServerError> {
        let dir = data_dir.join("snapshots");
        for sub in [dir.clone(), dir.join("layers"), dir.join("tmp")] {
            std::fs::create_dir_all(&sub).map_err(|e| crate::ServerError::io(format!("creating {}", sub.display()), e))?;
            std::fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .map_err(|e| crate::ServerError::io(format!("chmod {}", sub.display()), e))?;
        }
        // Half-written layers of a previous run (a crash mid-snapshot) are garbage.
        if let Ok(entries) = std::fs::read_dir(dir.join("tmp")) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        db.call(|c| Ok(c.execute_batch(SCHEMA)?)).await?;
        Ok(Snapshots { db, dir })
    }

    fn layer_path(&self, sha256: &str) -> PathBuf {
        self.dir.join("layers").join(format!("{sha256}.tar.zst"))
    }

    /// Compresses, hashes and stores what arrives on `chunks` (the raw tar from an agent);
    /// refuses more than `max_raw` bytes. Runs the CPU work on the blocking pool.
    pub async fn write_layer(&self, chunks: mpsc::Receiver<Bytes>, max_raw: u64) -> Result<StoredLayer, ApiError> {
        let tmp = self.dir.join("tmp").join(format!("{}.tar.zst", crate::auth::generate_key()));
        let tmp_path = tmp.clone();
        let written = tokio::task::spawn_blocking(move || compress(chunks, &tmp_path, max_raw))
            .await
            .map_err(|e| ApiError::internal(format!("snapshot task failed: {e}")))?;
        let (sha256, compressed, raw) = match written {
            Ok(done) => done,
            Err(err) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(err);
            }
        };
        let target = self.layer_path(&sha256);
        // Same bytes, same name: a layer already stored is kept and the new copy dropped.
        let stored = if target.exists() { std::fs::remove_file(&tmp) } else { std::fs::rename(&tmp, &target) };
        stored.map_err(|e| io_error("storing the layer", e))?;
        Ok(StoredLayer { sha256, compressed, raw })
    }

    /// Streams the decompressed layer into `out` in chunks, until done or `out` closes.
    pub fn read_layer(&self, sha256: &str, out: mpsc::Sender<Bytes>) -> tokio::task::JoinHandle<Result<(), ApiError>> {
        let path = self.layer_path(sha256);
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path).map_err(|e| io_error(&format!("opening {}", path.display()), e))?;
            let mut decoder = zstd::stream::read::Decoder::new(file).map_err(|e| io_error("zstd", e))?;
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                let n = std::io::Read::read(&mut decoder, &mut buf).map_err(|e| io_error("decompressing the layer", e))?;
                if n == 0 || out.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                    return Ok(());
                }
            }
        })
    }

    pub async fn insert(&self, info: &SnapshotInfo, created_at_ms: i64) -> Result<(), DbError> {
        let text = serde_json::to_string(info).map_err(|e| DbError::Corrupt(e.to_string()))?;
        let (id, sandbox, name, layer) = (info.id.clone(), info.sandbox_id.clone(), info.name.clone(), info.layer.clone());
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO snapshots (id, sandbox_id, name, created_at, layer, info) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![id, sandbox, name, created_at_ms, layer, text],
                )?;
                Ok(())
            })
            .await
    }

    pub async fn get(&self, id: &str) -> Result<Option<SnapshotInfo>, DbError> {
        let id = id.to_string();
        self.db
            .call(move |c| {
                let text: Option<String> = c.query_row("SELECT info FROM snapshots WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
                text.map(|t| serde_json::from_str(&t).map_err(|e| DbError::Corrupt(format!("snapshot: {e}")))).transpose()
            })
            .await
    }

    /// Newest first; only those of `sandbox` when given.
    pub async fn list(&self, sandbox: Option<String>) -> Result<Vec<SnapshotInfo>, DbError> {
        self.db
            .call(move |c| {
                let mut stmt = c.prepare(
                    "SELECT info FROM snapshots WHERE ?1 IS NULL OR sandbox_id = ?1 ORDER BY created_at DESC, id",
                )?;
                let rows = stmt.query_map(params![sandbox], |r| r.get::<_, String>(0))?;
                let mut out = Vec::new();
                for text in rows {
                    out.push(serde_json::from_str(&text?).map_err(|e| DbError::Corrupt(format!("snapshot: {e}")))?);
                }
                Ok(out)
            })
            .await
    }

    /// Deletes the record, and the layer if no other snapshot uses it. False if unknown.
    pub async fn delete(&self, id: &str) -> Result<bool, ApiError> {
        let id = id.to_string();
        let orphan = self
            .db
            .call(move |c| {
                let tx = c.transaction()?;
                let layer: Option<String> = tx.query_row("SELECT layer FROM snapshots WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
                let Some(layer) = layer else { return Ok(None) };
                tx.execute("DELETE FROM snapshots WHERE id = ?1", params![id])?;
                let users: i64 = tx.query_row("SELECT COUNT(*) FROM snapshots WHERE layer = ?1", params![layer], |r| r.get(0))?;
                tx.commit()?;
                Ok(Some((layer, users == 0)))
            })
            .await?;
        match orphan {
            None => Ok(false),
            Some((layer, true)) => {
                match tokio::fs::remove_file(self.layer_path(&layer)).await {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => tracing::warn!(%layer, %e, "could not remove a layer"),
                    _ => {}
                }
                Ok(true)
            }
            Some((_, false)) => Ok(true),
        }
    }
}

/// Returns (sha256 of the compressed file, compressed size, raw size).
fn compress(mut chunks: mpsc::Receiver<Bytes>, path: &Path, max_raw: u64) -> Result<(String, u64, u64), ApiError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| io_error(&format!("creating {}", path.display()), e))?;
    let hashing = HashingWriter { inner: std::io::BufWriter::with_capacity(1 << 20, file), hasher: Sha256::new(), written: 0 };
    let mut encoder = zstd::stream::write::Encoder::new(hashing, ZSTD_LEVEL).map_err(|e| io_error("zstd", e))?;
    let mut raw = 0u64;
    while let Some(chunk) = chunks.blocking_recv() {
        raw += chunk.len() as u64;
        if raw > max_raw {
            return Err(ApiError::new(
                axum::http::StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                format!("the layer is larger than the sandbox's disk allows ({max_raw} bytes)"),
            ));
        }
        encoder.write_all(&chunk).map_err(|e| io_error("compressing", e))?;
    }
    let mut hashing = encoder.finish().map_err(|e| io_error("compressing", e))?;
    hashing.inner.flush().map_err(|e| io_error("writing the layer", e))?;
    let file = hashing.inner.into_inner().map_err(|e| io_error("writing the layer", e.into_error()))?;
    // Durable before the database says the snapshot exists.
    file.sync_all().map_err(|e| io_error("syncing the layer", e))?;
    let sha = hashing.hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((sha, hashing.written, raw))
}

struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
