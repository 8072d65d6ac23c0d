//! corral's egress proxy. A sandbox has only loopback; its agent relays every connection made
//! to the loopback proxy port to the host, where [`SandboxEgress::serve`] speaks HTTP forward
//! proxying, `CONNECT` and SOCKS5 (sniffed from the first byte), enforces the sandbox's
//! [`NetworkPolicy`], resolves names itself, brokers secrets by terminating TLS for the hosts
//! they are bound to, and audits every attempt.
//!
//! Everything arriving here is written by a possibly hostile sandbox: every read is bounded,
//! every parse is fallible, and no error ends anything but the one connection.
#![forbid(unsafe_code)]

pub mod audit;
mod http;
mod io;
pub mod policy;
pub mod resolve;
pub mod secrets;
pub mod sni;
mod socks;
pub mod tls;
mod tunnel;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use corral_spec::{NetworkPolicy, Rule};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

pub use audit::{AuditEntry, AuditRing, JsonlSink};
pub use policy::Refusal;
pub use resolve::{parse_override, Override, Resolver};
pub use secrets::{BoundSecret, SecretSet, SecretValue};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections one sandbox may have open through the proxy at once.
const MAX_CONNECTIONS: usize = 512;
/// Where the system's trusted roots live on Debian-like hosts.
pub const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress configuration: {0}")]
    Config(String),
    #[error("egress TLS: {0}")]
    Tls(String),
    #[error("egress I/O: {0}")]
    Io(String),
}

/// Host-wide settings of the proxy.
#[derive(Debug, Clone, Default)]
pub struct EgressConfig {
    /// Holds `egress-ca.{pem,key}`.
    pub ca_dir: PathBuf,
    /// Name overrides (`NAME=IP[:PORT]`), already parsed.
    pub resolve: HashMap<String, Override>,
    /// PEM bundles trusted for upstream TLS besides the system bundle (tests, private CAs).
    pub extra_roots: Vec<PathBuf>,
    /// JSON-lines audit log; `None` keeps audit in memory only.
    pub audit_file: Option<PathBuf>,
}

/// The proxy's host-wide state: resolver, TLS, audit file.
pub struct Egress {
    resolver: Resolver,
    tls: tls::Tls,
    audit_file: Option<JsonlSink>,
}

impl Egress {
    pub fn new(config: EgressConfig) -> Result<Arc<Egress>, EgressError> {
        let ca = tls::Ca::load_or_create(&config.ca_dir)?;
        let mut roots = vec![PathBuf::from(SYSTEM_ROOTS)];
        roots.extend(config.extra_roots.iter().cloned());
        let tls = tls::Tls::new(ca, &roots)?;
        let audit_file = match &config.audit_file {
            Some(path) => Some(JsonlSink::open(path).map_err(|e| EgressError::Io(format!("opening {}: {e}", path.display())))?),
            None => None,
        };
        Ok(Arc::new(Egress { resolver: Resolver::new(config.resolve), tls, audit_file }))
    }

    /// The CA certificate sandboxes must trust for brokered hosts.
    pub fn ca_pem(&self) -> &str {
        self.tls.ca_pem()
    }

    /// The proxy state of one sandbox.
    pub fn sandbox(self: &Arc<Self>, id: &str, policy: NetworkPolicy, secrets: Vec<BoundSecret>) -> Arc<SandboxEgress> {
        Arc::new(SandboxEgress {
            id: id.to_string(),
            egress: self.clone(),
            policy: RwLock::new(policy),
            secrets: SecretSet::new(secrets),
            audit: AuditRing::default(),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        })
    }
}

/// One sandbox's view of the proxy.
pub struct SandboxEgress {
    id: String,
    egress: Arc<Egress>,
    policy: RwLock<NetworkPolicy>,
    secrets: SecretSet,
    audit: AuditRing,
    slots: Arc<Semaphore>,
}

/// A destination as the client named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    pub(crate) fn parse(s: &str) -> Option<Host> {
        let bare = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')).unwrap_or(s);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Some(Host::Ip(ip));
        }
        corral_spec::normalize_domain(s).map(Host::Name)
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// An open upstream connection and what allowed it.
pub(crate) struct Opened {
    pub stream: TcpStream,
    pub addr: SocketAddr,
    pub rule: String,
}

impl SandboxEgress {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Applies to connections opened from now on.
    pub fn set_policy(&self, policy: NetworkPolicy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    pub fn policy(&self) -> NetworkPolicy {
        self.policy.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `NAME=placeholder` for every brokered secret, for the sandbox's environment.
    pub fn secret_env(&self) -> BTreeMap<String, String> {
        self.secrets.iter().map(|s| (s.name.clone(), s.placeholder.clone())).collect()
    }

    /// Secret names and the hosts they are bound to (never values or placeholders).
    pub fn secret_bindings(&self) -> Vec<(String, Vec<String>)> {
        self.secrets.iter().map(|s| (s.name.clone(), s.hosts.iter().map(Rule::to_string).collect())).collect()
    }

    pub fn audit(&self) -> Vec<AuditEntry> {
        self.audit.snapshot()
    }

    pub(crate) fn record(&self, entry: AuditEntry) {
        if entry.decision == "deny" {
            tracing::info!(sandbox = %self.id, name = %entry.name, port = entry.port, reason = %entry.reason, "egress refused");
        }
        if let Some(file) = &self.egress.audit_file {
            file.write(&entry);
        }
        self.audit.push(entry);
    }

    pub(crate) fn entry(&self, protocol: &str, host: &Host, port: u16) -> AuditEntry {
        AuditEntry {
            sandbox: self.id.clone(),
            time: audit::rfc3339_now(),
            protocol: protocol.to_string(),
            name: host.to_string(),
            port,
            ..Default::default()
        }
    }

    /// Serves one connection a sandbox process made to its loopback proxy port.
    pub async fn serve<S>(self: Arc<Self>, io: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            tracing::warn!(sandbox = %self.id, "too many egress connections; dropping one");
            return;
        };
        let started = Instant::now();
        let mut client = tokio::io::BufReader::with_capacity(16 * 1024, io);
        let first = match tokio::io::AsyncBufReadExt::fill_buf(&mut client).await {
            Ok([first, ..]) => *first,
            _ => return,
        };
        if first == 5 {
            socks::serve(&self, client, started).await;
        } else {
            http::serve(&self, client, started).await;
        }
    }

    /// Applies the policy, resolves (names only after a name rule allowed them), checks every
    /// candidate address and connects to one that passed: the address checked is the one used.
    pub(crate) async fn open(&self, host: &Host, port: u16) -> Result<Opened, Refusal> {
        let policy = self.policy();
        let (candidates, name_rule, overridden) = match host {
            Host::Name(name) => {
                let rule = policy::check_name(&policy, name, port)?;
                let resolved = self.egress.resolver.resolve(name, port).await.map_err(|m| Refusal::new("resolve_failed", None, m))?;
                (resolved.addrs, Some(rule), resolved.overridden)
            }
            Host::Ip(ip) => (vec![SocketAddr::new(*ip, port)], None, false),
        };
        let mut checked = Vec::new();
        let mut first_refusal = None;
        for addr in candidates {
            // Policy ports are the requested port; an override may redirect elsewhere.
            match policy::check_addr(&policy, addr.ip(), port, name_rule.as_deref(), overridden) {
                Ok(rule) => checked.push((addr, rule)),
                Err(refusal) => {
                    first_refusal.get_or_insert(refusal);
                }
            }
        }
        if checked.is_empty() {
            return Err(first_refusal.unwrap_or_else(|| Refusal::new("resolve_failed", None, format!("{host} has no addresses"))));
        }
        let mut last_error = String::new();
        for (addr, rule) in checked {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(Opened { stream, addr, rule });
                }
                Ok(Err(err)) => last_error = format!("connecting to {addr}: {err}"),
                Err(_) => last_error = format!("connecting to {addr} timed out"),
            }
        }
        Err(Refusal::new("connect_failed", None, last_error))
    }

    pub(crate) fn secrets(&self) -> &SecretSet {
        &self.secrets
    }

    pub(crate) fn tls(&self) -> &tls::Tls {
        &self.egress.tls
    }
}
