//! Warm-pool configuration: what a pool is (`template=min:max[:idle]`), how it is stored in
//! SQLite, and what `GET /v1/pools` reports. The pools themselves live in
//! `manager/pool.rs`.

use std::str::FromStr;
use std::time::Duration;

use rusqlite::params;
use serde::{Deserialize, Serialize};

use crate::db::{Db, DbError};

/// Ready sandboxes per template, at most: each holds memory and an id range.
pub const MAX_POOL_SIZE: u32 = 256;
/// How long a pool stays at `max` after the last request for its template.
pub const DEFAULT_IDLE_SECS: u64 = 300;

/// One template's pool: kept at `min` ready sandboxes, grown towards `max` while requests
/// come in, trimmed back to `min` after `idle_secs` without one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    pub template: String,
    pub min: u32,
    pub max: u32,
    pub idle_secs: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid pool {spec:?}: {reason}")]
pub struct PoolConfigError {
    spec: String,
    reason: String,
}

impl PoolConfig {
    pub fn new(template: &str, min: u32, max: Option<u32>, idle_secs: Option<u64>) -> Result<PoolConfig, PoolConfigError> {
        let config = PoolConfig {
            template: template.to_string(),
            min,
            max: max.unwrap_or(min),
            idle_secs: idle_secs.unwrap_or(DEFAULT_IDLE_SECS),
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), PoolConfigError> {
        let fail = |reason: String| PoolConfigError { spec: self.template.clone(), reason };
        let spec = corral_spec::SandboxSpec { template: Some(self.template.clone()), ..Default::default() };
        spec.validate().map_err(|e| fail(e.to_string()))?;
        if self.max < self.min {
            return Err(fail(format!("max {} is below min {}", self.max, self.min)));
        }
        if self.max > MAX_POOL_SIZE {
            return Err(fail(format!("max {} is above {MAX_POOL_SIZE}", self.max)));
        }
        if self.idle_secs == 0 || self.idle_secs > corral_spec::MAX_TIMEOUT_SECS {
            return Err(fail(format!("idle time {}s is out of range", self.idle_secs)));
        }
        Ok(())
    }

    pub fn idle(&self) -> Duration {
        Duration::from_secs(self.idle_secs)
    }
}

/// `base=2:8:5m`: template, min, max (default: min), idle time (default: 5m).
impl FromStr for PoolConfig {
    type Err = PoolConfigError;

    fn from_str(s: &str) -> Result<Self, PoolConfigError> {
        let fail = |reason: &str| PoolConfigError { spec: s.to_string(), reason: reason.to_string() };
        let (template, sizes) = s.trim().split_once('=').ok_or_else(|| fail("expected TEMPLATE=MIN:MAX[:IDLE]"))?;
        let mut parts = sizes.split(':');
        let number = |part: Option<&str>| part.map(|p| p.trim().parse::<u32>().map_err(|_| fail("min and max must be whole numbers"))).transpose();
        let min = number(parts.next())?.ok_or_else(|| fail("missing min"))?;
        let max = number(parts.next())?;
        let idle = parts
            .next()
            .map(|p| corral_spec::parse_duration(p).map(|d| d.as_secs()).map_err(|e| fail(&e.to_string())))
            .transpose()?;
        if parts.next().is_some() {
            return Err(fail("expected TEMPLATE=MIN:MAX[:IDLE]"));
        }
        PoolConfig::new(template.trim(), min, max, idle).map_err(|e| PoolConfigError { spec: s.to_string(), reason: e.reason })
    }
}

/// One pool as `GET /v1/pools` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolStats {
    pub template: String,
    pub min: u32,
    pub max: u32,
    pub idle_secs: u64,
    /// Sandboxes ready to be handed out.
    pub ready: u32,
    /// Sandboxes being started for the pool.
    pub starting: u32,
    /// What the pool is filling towards now: `max` while requests come in, `min` once idle.
    pub target: u32,
    /// Creates served from the pool.
    pub hits: u64,
    /// Creates that could have used the pool but found it empty (served by a cold start).
    pub misses: u64,
    /// Creates for this template the pool cannot serve (volumes, snapshot, secrets, other disk size).
    pub skipped: u64,
    /// Sandboxes started for the pool since the daemon started, and how many failed.
    pub refills: u64,
    pub refill_failures: u64,
    /// Median time to start one pooled sandbox over the recent refills, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refill_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Stored pool configurations (`pools` table).
pub struct PoolStore {
    db: Db,
}

impl PoolStore {
    pub async fn open(db: Db) -> Result<PoolStore, DbError> {
        db.call(|c| {
            c.execute_batch(
                "CREATE TABLE IF NOT EXISTS pools (
                    template  TEXT PRIMARY KEY,
                    min       INTEGER NOT NULL,
                    max       INTEGER NOT NULL,
                    idle_secs INTEGER NOT NULL
                );",
            )?;
            Ok(())
        })
        .await?;
        Ok(PoolStore { db })
    }

    pub async fn load(&self) -> Result<Vec<PoolConfig>, DbError> {
        self.db
            .call(|c| {
                let mut stmt = c.prepare("SELECT template, min, max, idle_secs FROM pools ORDER BY template")?;
                let rows = stmt.query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?))
                })?;
                let mut out = Vec::new();
                for row in rows {
                    let (template, min, max, idle) = row?;
                    let config = PoolConfig {
                        template,
                        min: u32::try_from(min).map_err(|_| DbError::Corrupt(format!("pool min {min}")))?,
                        max: u32::try_from(max).map_err(|_| DbError::Corrupt(format!("pool max {max}")))?,
                        idle_secs: u64::try_from(idle).map_err(|_| DbError::Corrupt(format!("pool idle {idle}")))?,
                    };
                    config.validate().map_err(|e| DbError::Corrupt(e.to_string()))?;
                    out.push(config);
                }
                Ok(out)
            })
            .await
    }

    pub async fn save(&self, config: &PoolConfig) -> Result<(), DbError> {
        let config = config.clone();
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO pools (template, min, max, idle_secs) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT(template) DO UPDATE SET min = ?2, max = ?3, idle_secs = ?4",
                    params![config.template, config.min, config.max, config.idle_secs as i64],
                )?;
                Ok(())
            })
            .await
    }

    /// False if there was no such pool.
    pub async fn delete(&self, template: &str) -> Result<bool, DbError> {
        let template = template.to_string();
        self.db.call(move |c| Ok(c.execute("DELETE FROM pools WHERE template = ?1", params![template])? > 0)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_specs_parse_with_defaults_and_reject_nonsense() {
        assert_eq!("base=2".parse(), Ok(PoolConfig { template: "base".into(), min: 2, max: 2, idle_secs: 300 }));
        assert_eq!("base=1:4:30s".parse(), Ok(PoolConfig { template: "base".into(), min: 1, max: 4, idle_secs: 30 }));
        assert_eq!("py=0:3:2m".parse::<PoolConfig>().map(|c| c.idle_secs), Ok(120));
        for bad in ["base", "base=", "base=3:1", "base=1:2:3:4", "base=x", "../x=1", "base=1:999", "base=1:2:0"] {
            assert!(bad.parse::<PoolConfig>().is_err(), "{bad} parsed");
        }
    }
}
