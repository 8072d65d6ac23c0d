//! Audit records: one per connection attempt (and one per request inside a brokered TLS
//! connection). Never holds header values or secret values, only names and sizes.

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Records kept in memory per sandbox; older ones are still in the JSON-lines file.
const RING: usize = 10_000;
/// Records queued for the file writer before new ones are dropped (and counted).
const FILE_QUEUE: usize = 8192;
const MAX_PATH: usize = 2048;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub sandbox: String,
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// `http`, `connect`, `socks5`, or `https` for a request inside a brokered connection.
    pub protocol: String,
    /// The destination as the client named it (a domain name or an address).
    pub name: String,
    pub port: u16,
    /// The address actually connected to, when it got that far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `allow` or `deny`.
    pub decision: String,
    /// Why: `allowed`, `denied_by_rule`, `not_allowed`, `non_public_address`, `sni_mismatch`,
    /// `exfiltration`, `resolve_failed`, `connect_failed`, `bad_request`, ...
    pub reason: String,
    /// The rule that decided, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Names (never values) of secrets injected into this request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Name of the secret whose placeholder was sent where it is not bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exfiltration_of: Option<String>,
}

impl AuditEntry {
    pub fn set_path(&mut self, path: &str) {
        let mut end = path.len().min(MAX_PATH);
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        self.path = Some(path[..end].to_string());
    }
}

/// Appends entries to a JSON-lines file from a writer thread, so a slow disk never stalls
/// a proxied connection.
pub struct JsonlSink {
    tx: SyncSender<String>,
    dropped: std::sync::atomic::AtomicU64,
}

impl JsonlSink {
    pub fn open(path: &Path) -> std::io::Result<JsonlSink> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        let (tx, rx) = sync_channel::<String>(FILE_QUEUE);
        std::thread::Builder::new().name("egress-audit".into()).spawn(move || {
            let mut out = std::io::BufWriter::new(file);
            while let Ok(line) = rx.recv() {
                let _ = out.write_all(line.as_bytes());
                while let Ok(more) = rx.try_recv() {
                    let _ = out.write_all(more.as_bytes());
                }
                if let Err(err) = out.flush() {
                    tracing::warn!(%err, "writing the egress audit log failed");
                }
            }
        })?;
        Ok(JsonlSink { tx, dropped: Default::default() })
    }

    pub fn write(&self, entry: &AuditEntry) {
        let Ok(mut line) = serde_json::to_string(entry) else { return };
        line.push('\n');
        if let Err(TrySendError::Full(_)) = self.tx.try_send(line) {
            let n = self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "egress audit queue full; entries dropped from the file");
            }
        }
    }
}

/// The in-memory tail of one sandbox's audit trail.
#[derive(Default)]
pub struct AuditRing {
    entries: Mutex<VecDeque<AuditEntry>>,
}

impl AuditRing {
    pub fn push(&self, entry: AuditEntry) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= RING {
            entries.pop_front();
        }
        entries.push_back(entry);
    }

    pub fn snapshot(&self) -> Vec<AuditEntry> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }
}

/// Now, as RFC 3339 (UTC).
pub fn rfc3339_now() -> String {
    corral_spec::time::rfc3339(corral_spec::time::now_ms())
}
