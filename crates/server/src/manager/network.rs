//! The manager's egress side: per-sandbox proxy state, brokered secrets, runtime policy
//! changes, and serving the egress streams agents open.

use std::collections::BTreeMap;
use std::sync::Arc;

use corral_egress::{AuditEntry, BoundSecret, Egress, SandboxEgress};
use corral_proto::{ErrorKind, Event, Request, Stream};
use corral_spec::NetworkPolicy;
use serde::{Deserialize, Serialize};

use super::{Live, Manager};
use crate::db::SandboxRow;
use crate::error::ApiError;
use crate::secrets::SecretStore;

/// Host-wide egress state the manager holds.
pub struct EgressHub {
    pub egress: Arc<Egress>,
    pub secrets: SecretStore,
}

/// `GET /v1/sandboxes/{id}/network`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkInfo {
    pub policy: NetworkPolicy,
    /// Secret names and the hosts each may go to; never values or placeholders.
    pub secrets: Vec<SecretBinding>,
    pub audit: Vec<AuditEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecretBinding {
    pub name: String,
    pub hosts: Vec<String>,
}

impl EgressHub {
    /// Proxy state for a new sandbox, with a fresh placeholder for each of its secrets.
    pub async fn for_new_sandbox(&self, row: &SandboxRow) -> Result<Arc<SandboxEgress>, ApiError> {
        let loaded = self.secrets.load(&row.spec.network.secrets).await?;
        let bound: Vec<BoundSecret> = loaded.into_iter().map(|s| BoundSecret::new(s.name, s.value, s.hosts)).collect();
        let placeholders = bound.iter().map(|b| (b.name.clone(), b.placeholder.clone())).collect();
        self.secrets.save_placeholders(&row.id, placeholders).await?;
        Ok(self.egress.sandbox(&row.id, row.spec.network.policy(), bound))
    }

    /// Proxy state for a sandbox re-attached after a daemon restart: the placeholders it
    /// already holds are looked up again, so its brokered secrets keep working.
    pub async fn for_recovered_sandbox(&self, row: &SandboxRow) -> Arc<SandboxEgress> {
        let bound = match self.recovered_secrets(row).await {
            Ok(bound) => bound,
            Err(err) => {
                tracing::warn!(id = %row.id, %err, "secrets of a re-attached sandbox cannot be brokered any more");
                Vec::new()
            }
        };
        self.egress.sandbox(&row.id, row.spec.network.policy(), bound)
    }

    async fn recovered_secrets(&self, row: &SandboxRow) -> Result<Vec<BoundSecret>, ApiError> {
        if row.spec.network.secrets.is_empty() {
            return Ok(Vec::new());
        }
        let placeholders: BTreeMap<String, String> = self.secrets.placeholders(&row.id).await?.into_iter().collect();
        let loaded = self.secrets.load(&row.spec.network.secrets).await?;
        loaded
            .into_iter()
            .map(|s| match placeholders.get(&s.name) {
                Some(placeholder) => Ok(BoundSecret::with_placeholder(s.name, placeholder.clone(), s.value, s.hosts)),
                None => Err(ApiError::internal(format!("no placeholder recorded for secret {:?}", s.name))),
            })
            .collect()
    }
}

/// The environment a sandbox boots with: its spec's, plus a placeholder per secret.
pub fn boot_env(row: &SandboxRow, egress: &SandboxEgress) -> BTreeMap<String, String> {
    let mut env = row.spec.env.clone();
    env.extend(egress.secret_env());
    env
}

/// Serves one relayed connection: the mux stream becomes a byte stream for the proxy.
pub fn serve_stream(egress: Arc<SandboxEgress>, stream: Stream) {
    let (proxy_side, relay_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(corral_proto::pipe::splice(stream, relay_side));
    tokio::spawn(egress.serve(proxy_side));
}

/// Streams agents open: egress relays when the sandbox has a proxy, nothing else.
pub fn accept_from_agent(egress: Option<Arc<SandboxEgress>>, mut incoming: corral_proto::Incoming) {
    tokio::spawn(async move {
        while let Some((request, mut stream)) = incoming.accept().await {
            match (&request, &egress) {
                (Request::Egress { .. }, Some(egress)) => serve_stream(egress.clone(), stream),
                _ => stream.sender.reset(),
            }
        }
    });
}

impl Manager {
    /// Installs corral's CA in a fresh sandbox so brokered TLS is trusted. An agent that
    /// cannot (another backend's) leaves brokered TLS untrusted, not the sandbox broken.
    pub(super) async fn trust_ca(&self, live: &Live) -> Result<(), ApiError> {
        let mux = live.agent().await?;
        let pem = self.egress.egress.ca_pem().to_string();
        let (mut tx, mut rx) = mux.open(&Request::TrustCa { pem }).map_err(ApiError::from_mux)?.split();
        tx.end().map_err(ApiError::from_mux)?;
        match rx.recv_event().await {
            Ok(Some(Event::Ok)) => Ok(()),
            Ok(Some(Event::Error { kind: ErrorKind::Unsupported, message })) => {
                tracing::warn!(id = %live.id, %message, "agent cannot install the egress CA");
                Ok(())
            }
            Ok(Some(Event::Error { kind, message })) => Err(ApiError::from_agent(kind, message)),
            Ok(other) => Err(ApiError::internal(format!("unexpected answer to TrustCa: {other:?}"))),
            Err(e) => Err(ApiError::from_mux(e)),
        }
    }

    fn sandbox_egress(live: &Live) -> Result<Arc<SandboxEgress>, ApiError> {
        live.egress.clone().ok_or_else(|| ApiError::conflict("this sandbox has no egress proxy"))
    }

    pub async fn network(&self, id: &str) -> Result<NetworkInfo, ApiError> {
        let egress = Self::sandbox_egress(&*self.live(id).await?)?;
        Ok(NetworkInfo {
            policy: egress.policy(),
            secrets: egress.secret_bindings().into_iter().map(|(name, hosts)| SecretBinding { name, hosts }).collect(),
            audit: egress.audit(),
        })
    }

    /// Replaces the allow and deny lists; connections opened from now on follow them.
    pub async fn set_network(&self, id: &str, policy: NetworkPolicy) -> Result<NetworkInfo, ApiError> {
        policy.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
        let egress = Self::sandbox_egress(&*self.live(id).await?)?;
        let (id_owned, allow, deny) = (id.to_string(), policy.allow.clone(), policy.deny.clone());
        // Recorded in the spec so the policy survives a daemon restart.
        self.db
            .call(move |c| {
                let spec: String = c.query_row("SELECT spec FROM sandboxes WHERE id = ?1", [&id_owned], |r| r.get(0))?;
                let mut spec: corral_spec::SandboxSpec =
                    serde_json::from_str(&spec).map_err(|e| crate::db::DbError::Corrupt(e.to_string()))?;
                spec.network.allow = allow;
                spec.network.deny = deny;
                let text = serde_json::to_string(&spec).map_err(|e| crate::db::DbError::Corrupt(e.to_string()))?;
                c.execute("UPDATE sandboxes SET spec = ?2 WHERE id = ?1", rusqlite::params![id_owned, text])?;
                Ok(())
            })
            .await?;
        egress.set_policy(policy);
        self.network(id).await
    }

    pub fn secret_store(&self) -> &SecretStore {
        &self.egress.secrets
    }
}
