//! Brokered secrets, stored in the daemon's SQLite database (0600) and nowhere else. Values
//! are write-only: nothing here returns them except [`SecretStore::load`], which feeds the
//! egress proxy.

use corral_egress::secrets::check_host_rule;
use corral_spec::{validate_secret_name, Rule};
use rusqlite::params;
use serde::{Deserialize, Serialize};

use crate::db::{Db, DbError};
use crate::error::ApiError;
use crate::time::{now_ms, rfc3339};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS secrets (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    hosts      TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sandbox_placeholders (
    sandbox     TEXT NOT NULL,
    secret      TEXT NOT NULL,
    placeholder TEXT NOT NULL,
    PRIMARY KEY (sandbox, secret)
);
";
const MAX_VALUE: usize = 16 * 1024;
const MAX_HOSTS: usize = 64;

/// `POST /v1/secrets`. `Debug` is not derived: the value must never reach a log.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSecret {
    pub name: String,
    pub value: String,
    pub hosts: Vec<Rule>,
}

/// A secret as the API shows it: never the value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecretInfo {
    pub name: String,
    pub hosts: Vec<Rule>,
    pub created_at: String,
}

impl NewSecret {
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_secret_name(&self.name).map_err(|e| ApiError::invalid(e.to_string()))?;
        // The value goes into request headers: control characters would let it forge some.
        if self.value.is_empty() || self.value.len() > MAX_VALUE || self.value.chars().any(char::is_control) {
            return Err(ApiError::invalid("a secret value must be 1 to 16384 characters without control characters"));
        }
        if self.hosts.is_empty() || self.hosts.len() > MAX_HOSTS {
            return Err(ApiError::invalid("a secret needs 1 to 64 hosts it may be sent to"));
        }
        for rule in &self.hosts {
            check_host_rule(rule).map_err(ApiError::invalid)?;
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct SecretStore {
    db: Db,
}

/// What the proxy needs to broker one secret.
pub struct Loaded {
    pub name: String,
    pub value: corral_egress::SecretValue,
    pub hosts: Vec<Rule>,
}

fn parse_hosts(text: &str) -> Result<Vec<Rule>, DbError> {
    serde_json::from_str(text).map_err(|e| DbError::Corrupt(format!("secret hosts: {e}")))
}

impl SecretStore {
    pub async fn open(db: Db) -> Result<SecretStore, DbError> {
        db.call(|c| Ok(c.execute_batch(SCHEMA)?)).await?;
        Ok(SecretStore { db })
    }

    /// Creates or replaces a secret.
    pub async fn put(&self, secret: NewSecret) -> Result<SecretInfo, ApiError> {
        secret.validate()?;
        let hosts = serde_json::to_string(&secret.hosts).map_err(|e| ApiError::internal(e.to_string()))?;
        let now = now_ms();
        let info = SecretInfo { name: secret.name.clone(), hosts: secret.hosts, created_at: rfc3339(now) };
        let (name, value) = (secret.name, secret.value);
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO secrets (name, value, hosts, created_at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT(name) DO UPDATE SET value = ?2, hosts = ?3, created_at = ?4",
                    params![name, value, hosts, now],
                )?;
                Ok(())
            })
            .await?;
        Ok(info)
    }

    pub async fn list(&self) -> Result<Vec<SecretInfo>, ApiError> {
        Ok(self
            .db
            .call(|c| {
                let mut stmt = c.prepare("SELECT name, hosts, created_at FROM secrets ORDER BY name")?;
                let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)))?;
                let mut out = Vec::new();
                for row in rows {
                    let (name, hosts, at) = row?;
                    out.push(SecretInfo { name, hosts: parse_hosts(&hosts)?, created_at: rfc3339(at) });
                }
                Ok(out)
            })
            .await?)
    }

    /// Returns false if there was no such secret.
    pub async fn delete(&self, name: &str) -> Result<bool, ApiError> {
        let name = name.to_string();
        Ok(self.db.call(move |c| Ok(c.execute("DELETE FROM secrets WHERE name = ?1", params![name])? > 0)).await?)
    }

    /// Remembers the placeholders a sandbox was given, so a restarted daemon can keep brokering
    /// its secrets. Placeholders are random tokens, not secrets: knowing one grants nothing
    /// outside the hosts the secret is bound to.
    pub async fn save_placeholders(&self, sandbox: &str, placeholders: Vec<(String, String)>) -> Result<(), ApiError> {
        let sandbox = sandbox.to_string();
        Ok(self
            .db
            .call(move |c| {
                for (secret, placeholder) in placeholders {
                    c.execute(
                        "INSERT OR REPLACE INTO sandbox_placeholders (sandbox, secret, placeholder) VALUES (?1, ?2, ?3)",
                        params![sandbox, secret, placeholder],
                    )?;
                }
                Ok(())
            })
            .await?)
    }

    /// Secret name → placeholder, as given to `sandbox`.
    pub async fn placeholders(&self, sandbox: &str) -> Result<Vec<(String, String)>, ApiError> {
        let sandbox = sandbox.to_string();
        Ok(self
            .db
            .call(move |c| {
                let mut stmt = c.prepare("SELECT secret, placeholder FROM sandbox_placeholders WHERE sandbox = ?1")?;
                let rows = stmt.query_map(params![sandbox], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
                let mut out = Vec::new();
                for row in rows {
                    out.push(row?);
                }
                Ok(out)
            })
            .await?)
    }

    pub async fn forget_placeholders(&self, sandbox: &str) -> Result<(), ApiError> {
        let sandbox = sandbox.to_string();
        Ok(self.db.call(move |c| Ok(c.execute("DELETE FROM sandbox_placeholders WHERE sandbox = ?1", params![sandbox]).map(|_| ())?)).await?)
    }

    /// The named secrets with their values; an unknown name is the client's error.
    pub async fn load(&self, names: &[String]) -> Result<Vec<Loaded>, ApiError> {
        let wanted = names.to_vec();
        let found = self
            .db
            .call(move |c| {
                let mut out = Vec::new();
                for name in wanted {
                    let row = c
                        .query_row("SELECT value, hosts FROM secrets WHERE name = ?1", params![name], |r| {
                            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                        })
                        .map(Some)
                        .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(None) } else { Err(e) })?;
                    out.push((name, row));
                }
                Ok(out)
            })
            .await?;
        let mut loaded = Vec::new();
        for (name, row) in found {
            let Some((value, hosts)) = row else {
                return Err(ApiError::invalid(format!("no secret named {name:?}; create it with POST /v1/secrets")));
            };
            loaded.push(Loaded { name, value: corral_egress::SecretValue::new(value), hosts: parse_hosts(&hosts)? });
        }
        Ok(loaded)
    }
}
