//! corral's CA (for the TLS it terminates to broker secrets), the per-host leaf certificates
//! it issues, and the client config for TLS to the real upstream.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use corral_spec::time::civil_from_days;
use crate::EgressError;

const CA_CERT_FILE: &str = "egress-ca.pem";
const CA_KEY_FILE: &str = "egress-ca.key";
const CA_NAME: &str = "corral egress CA";
const LEAF_CACHE: usize = 1024;

fn tls_err(what: &str, err: impl std::fmt::Display) -> EgressError {
    EgressError::Tls(format!("{what}: {err}"))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The CA's subject; the same every time so a reloaded key signs as the same issuer.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    dn.push(DnType::OrganizationName, "corral");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
}

impl Ca {
    /// Loads `egress-ca.{pem,key}` from `dir`, or creates them (key 0600) on first start.
    pub fn load_or_create(dir: &Path) -> Result<Ca, EgressError> {
        let (cert_path, key_path) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
        let io = |what: &str, e: std::io::Error| EgressError::Io(format!("{what}: {e}"));
        let (cert_pem, key) = match (std::fs::read_to_string(&cert_path), std::fs::read_to_string(&key_path)) {
            (Ok(cert), Ok(key)) => (cert, KeyPair::from_pem(&key).map_err(|e| tls_err("reading the CA key", e))?),
            _ => {
                let key = KeyPair::generate().map_err(|e| tls_err("generating the CA key", e))?;
                let cert = ca_params().self_signed(&key).map_err(|e| tls_err("signing the CA", e))?;
                std::fs::create_dir_all(dir).map_err(|e| io("creating the data dir", e))?;
                write_private(&key_path, key.serialize_pem().as_bytes()).map_err(|e| io("writing the CA key", e))?;
                std::fs::write(&cert_path, cert.pem()).map_err(|e| io("writing the CA certificate", e))?;
                (cert.pem(), key)
            }
        };
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| tls_err("reading the CA certificate", e))?;
        Ok(Ca { params: ca_params(), key, cert_pem, cert_der })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A fresh key and a certificate for `host`, valid from last year to next year.
    fn leaf(&self, host: &str) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), EgressError> {
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(|e| tls_err("leaf name", e))?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        let today = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64 / 86_400);
        let (year, _, _) = civil_from_days(today);
        params.not_before = rcgen::date_time_ymd(year as i32 - 1, 1, 1);
        params.not_after = rcgen::date_time_ymd(year as i32 + 1, 12, 31);
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(|e| tls_err("generating a leaf key", e))?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).map_err(|e| tls_err("signing a leaf", e))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone(), self.cert_der.clone()], key))
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(path)?;
    f.write_all(bytes)
}

/// TLS state shared by every sandbox.
pub struct Tls {
    ca: Ca,
    /// Server configs per brokered host, so keys are generated once per host.
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    pub upstream: Arc<ClientConfig>,
}

impl Tls {
    /// `roots`: PEM bundles trusted for upstream TLS (the system bundle plus, in tests, extra
    /// CAs). Unreadable files are skipped with a warning; none readable is an error.
    pub fn new(ca: Ca, roots: &[std::path::PathBuf]) -> Result<Tls, EgressError> {
        let mut store = RootCertStore::empty();
        for path in roots {
            match CertificateDer::pem_file_iter(path) {
                Ok(certs) => {
                    let certs: Vec<_> = certs.filter_map(Result::ok).collect();
                    store.add_parsable_certificates(certs);
                }
                Err(err) => tracing::warn!(path = %path.display(), %err, "skipping unreadable CA bundle"),
            }
        }
        let mut upstream = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("client config", e))?
            .with_root_certificates(store)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { ca, leaves: Mutex::new(HashMap::new()), upstream: Arc::new(upstream) })
    }

    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The server config presenting a corral-issued certificate for `host`.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, EgressError> {
        if let Some(config) = self.leaves.lock().unwrap_or_else(|p| p.into_inner()).get(host) {
            return Ok(config.clone());
        }
        let (chain, key) = self.ca.leaf(host)?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("server config", e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| tls_err("server certificate", e))?;
        // Only HTTP/1.1 is parsed for injection, so that is all we offer.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if leaves.len() >= LEAF_CACHE {
            leaves.clear();
        }
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }
}
