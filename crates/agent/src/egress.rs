//! The sandbox end of egress: a loopback listener whose connections are relayed, one mux
//! stream each, to the host's egress proxy; the proxy environment every process gets; and
//! the CA bundle that makes brokered TLS trusted inside.
//!
//! The agent never looks at the bytes: policy, names and TLS are all decided on the host.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::Duration;

use corral_proto::{pipe::splice, Mux, Request};
use tokio::net::TcpListener;

/// Loopback port of the proxy inside every sandbox (HTTP, CONNECT and SOCKS5 on one port).
pub const PROXY_PORT: u16 = 3128;
/// corral's CA alone (for tools that add to their defaults, like Node).
pub const CA_FILE: &str = "/etc/corral/ca.pem";
/// The system roots plus corral's CA (for tools that replace their defaults).
pub const CA_BUNDLE: &str = "/etc/corral/ca-bundle.pem";
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const MAX_CA_PEM: usize = 64 * 1024;

/// Proxy and trust-store variables for every process in a sandbox with egress.
pub fn proxy_env(port: u16) -> BTreeMap<String, String> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut env = BTreeMap::new();
    for (name, value) in [("HTTP_PROXY", &http), ("HTTPS_PROXY", &http), ("ALL_PROXY", &socks), ("NO_PROXY", &no_proxy)] {
        env.insert(name.to_string(), value.clone());
        env.insert(name.to_ascii_lowercase(), value.clone());
    }
    for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO"] {
        env.insert(name.to_string(), CA_BUNDLE.to_string());
    }
    env.insert("NODE_EXTRA_CA_CERTS".to_string(), CA_FILE.to_string());
    // Node >= 24 honours HTTP(S)_PROXY for fetch/http only with this set.
    env.insert("NODE_USE_ENV_PROXY".to_string(), "1".to_string());
    env
}

/// Writes corral's CA and a bundle of it with the system roots. Needs root inside.
pub fn install_ca(pem: &str) -> io::Result<()> {
    if pem.len() > MAX_CA_PEM || !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a PEM certificate"));
    }
    let dir = Path::new(CA_FILE).parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let mut bundle = std::fs::read_to_string(SYSTEM_BUNDLE).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(pem);
    write_public(Path::new(CA_FILE), pem)?;
    write_public(Path::new(CA_BUNDLE), &bundle)
}

fn write_public(path: &Path, text: &str) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Replace atomically so a reader never sees half a bundle.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

/// Accepts loopback connections forever, relaying each over the current host connection.
/// Without one (the daemon is not connected) the connection is closed at once.
pub async fn relay(listener: TcpListener, host: impl Fn() -> Option<Mux>) {
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(%err, "egress accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(mux) = host() else { continue };
        let _ = conn.set_nodelay(true);
        match mux.open(&Request::Egress { peer: peer.to_string() }) {
            Ok(stream) => {
                tokio::spawn(async move {
                    splice(stream, conn).await;
                });
            }
            Err(err) => tracing::debug!(%err, "cannot open an egress stream"),
        }
    }
}

/// Binds the loopback proxy port.
pub async fn listen(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).await
}
