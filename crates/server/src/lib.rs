//! The corral daemon: keeps sandboxes (through a [`corral_jail::Backend`]), their state in
//! SQLite, and serves the HTTP API under `/v1`.
//!
//! [`serve`] is all a binary needs; [`bind`] exists so callers (and tests) can listen on
//! port 0, learn the address, and control shutdown.
#![forbid(unsafe_code)]

mod agent_client;
mod api;
mod auth;
mod db;
mod e2b;
mod error;
mod interpreter;
mod manager;
mod openapi;
pub mod pools;
mod secrets;
mod snapshots;
mod time;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use corral_jail::Backend;

pub use agent_client::{Chunk, OutputEvent, WaitResult};
pub use error::ApiError;

/// How long a stopping daemon waits for requests in flight.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);
pub use manager::SandboxInfo;

/// Where the HTTP API listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// Port 0 picks a free port; see [`RunningServer::local_addr`].
    Tcp(SocketAddr),
    /// A unix socket; a stale socket file at the path is replaced.
    Unix(PathBuf),
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: ListenAddr,
    /// Holds `corral.db` and `sandboxes/<id>/`. Created if missing.
    pub data_dir: PathBuf,
    /// Accept exactly this key (e.g. from `CORRAL_API_KEY`). When `None`, a key is generated
    /// on first start, printed once to stderr, and only its hash is kept.
    pub api_key: Option<String>,
    /// Egress proxy settings shared by every sandbox.
    pub egress: EgressSettings,
    /// Warm pools from the daemon's configuration (`--pool`, `CORRAL_POOLS`); they override
    /// stored pools of the same template and are stored themselves.
    pub pools: Vec<pools::PoolConfig>,
    /// Kill every sandbox when the daemon stops. Off by default: sandboxes keep running
    /// while the daemon is down and are re-attached when it starts again.
    pub destroy_on_exit: bool,
}

/// Host-wide egress settings (`corral serve --egress-resolve`, `--egress-trust`).
#[derive(Debug, Clone, Default)]
pub struct EgressSettings {
    /// `NAME=IP[:PORT]`: names the proxy resolves to fixed addresses (which may be private).
    pub resolve: Vec<String>,
    /// PEM bundles trusted for upstream TLS in addition to the system roots.
    pub extra_roots: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("database: {0}")]
    Db(#[from] db::DbError),
    #[error("{0}")]
    Egress(#[from] corral_egress::EgressError),
}

impl ServerError {
    fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ServerError::Io { what: what.into(), source }
    }
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// A bound, not yet serving daemon.
pub struct RunningServer {
    listener: Listener,
    manager: Arc<manager::Manager>,
    router: axum::Router,
    generated_api_key: Option<String>,
    destroy_on_exit: bool,
}

/// Binds, opens the database, generates the API key and serves until SIGINT/SIGTERM; then
/// leaves sandboxes running for the next start (or destroys them with `destroy_on_exit`).
pub async fn serve(config: ServerConfig, backend: Arc<dyn Backend>) -> Result<(), ServerError> {
    bind(config, backend).await?.run_until(shutdown_signal()).await
}

/// Everything [`serve`] does before accepting connections.
pub async fn bind(config: ServerConfig, backend: Arc<dyn Backend>) -> Result<RunningServer, ServerError> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| ServerError::io(format!("creating {}", config.data_dir.display()), e))?;
    // Searchable but not listable: sandbox root (an unprivileged host uid) must traverse it to
    // mount its template layers; everything secret inside is 0600/0700 itself.
    restrict_permissions(&config.data_dir, 0o711)?;
    let db_path = config.data_dir.join("corral.db");
    let db = db::Db::open(&db_path)?;
    restrict_permissions(&db_path, 0o600)?;

    let (keys, generated_api_key) = auth::ApiKeys::load(&db, config.api_key.as_deref()).await?;
    if let Some(key) = &generated_api_key {
        // Printed once: only the hash is stored, so this is the only chance to see it.
        eprintln!("corral: generated a new API key (shown only once, store it now)");
        eprintln!("API key: {key}");
    }

    let egress = start_egress(&config)?;
    let manager = manager::Manager::new(backend, db, config.data_dir.join("sandboxes"), egress, config.pools.clone()).await?;
    manager.clone().spawn_reaper();
    manager.clone().spawn_pools();

    let listener = match &config.listen {
        ListenAddr::Tcp(addr) => Listener::Tcp(
            tokio::net::TcpListener::bind(addr).await.map_err(|e| ServerError::io(format!("binding {addr}"), e))?,
        ),
        ListenAddr::Unix(path) => {
            if std::fs::symlink_metadata(path).is_ok() {
                std::fs::remove_file(path).map_err(|e| ServerError::io(format!("removing stale {}", path.display()), e))?;
            }
            let listener = tokio::net::UnixListener::bind(path)
                .map_err(|e| ServerError::io(format!("binding {}", path.display()), e))?;
            restrict_permissions(path, 0o600)?;
            Listener::Unix(listener)
        }
    };
    let router = api::router(manager.clone(), Arc::new(keys));
    Ok(RunningServer { listener, manager, router, generated_api_key, destroy_on_exit: config.destroy_on_exit })
}

impl RunningServer {
    /// The TCP address actually bound (useful with port 0); `None` on a unix socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(_) => None,
        }
    }

    /// The key generated at this start, if one was (it is also printed to stderr).
    pub fn generated_api_key(&self) -> Option<&str> {
        self.generated_api_key.as_deref()
    }

    /// Serves until `shutdown` resolves, then destroys every running sandbox.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        let manager = self.manager.clone();
        let destroy = self.destroy_on_exit;
        let stopping = Arc::new(tokio::sync::Notify::new());
        let stopped = stopping.clone();
        let shutdown = async move {
            shutdown.await;
            if destroy {
                // Destroying sandboxes also ends their exec/watch streams.
                manager.shutdown().await;
            } else {
                manager.detach().await;
            }
            stopped.notify_one();
        };
        let serving = async move {
            match self.listener {
                Listener::Tcp(l) => {
                    // Streamed exec output is many small writes; Nagle would hold them back.
                    let l = axum::serve::ListenerExt::tap_io(l, |tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    axum::serve(l, self.router).with_graceful_shutdown(shutdown).await
                }
                Listener::Unix(l) => axum::serve(l, self.router).with_graceful_shutdown(shutdown).await,
            }
        };
        // Streams of sandboxes that keep running never end by themselves: give requests in
        // flight a moment, then stop anyway.
        let result = tokio::select! {
            result = serving => result,
            _ = async { stopping.notified().await; tokio::time::sleep(GRACE).await } => Ok(()),
        };
        result.map_err(|e| ServerError::io("serving HTTP", e))
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}

/// The proxy's CA lives in the data dir (key 0600); every attempt is appended to
/// `<data>/audit.jsonl`.
fn start_egress(config: &ServerConfig) -> Result<Arc<corral_egress::Egress>, ServerError> {
    let mut resolve = std::collections::HashMap::new();
    for entry in &config.egress.resolve {
        let (name, target) = corral_egress::parse_override(entry)?;
        resolve.insert(name, target);
    }
    Ok(corral_egress::Egress::new(corral_egress::EgressConfig {
        ca_dir: config.data_dir.clone(),
        resolve,
        extra_roots: config.egress.extra_roots.clone(),
        audit_file: Some(config.data_dir.join("audit.jsonl")),
    })?)
}

fn restrict_permissions(path: &std::path::Path, mode: u32) -> Result<(), ServerError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ServerError::io(format!("setting permissions on {}", path.display()), e))
}
