//! The sandbox spec: what a client asks for when it creates a sandbox.
//!
//! One type serves the HTTP API (JSON), the CLI flags and, later, YAML manifests, so every
//! limit is parsed and validated in one place.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod network;
pub mod time;
pub use network::{canonical, normalize_domain, validate_secret_name, NetworkPolicy, NetworkSpec, Rule, RuleTarget};

pub const DEFAULT_TEMPLATE: &str = "base";
pub const DEFAULT_MEMORY: ByteSize = ByteSize(512 * 1024 * 1024);
pub const DEFAULT_DISK: ByteSize = ByteSize(1024 * 1024 * 1024);
pub const DEFAULT_PIDS: u32 = 256;
pub const DEFAULT_CPUS: f64 = 1.0;
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// Hard ceilings a request may not exceed, whatever the client asks.
pub const MAX_MEMORY: ByteSize = ByteSize(64 * 1024 * 1024 * 1024);
pub const MAX_DISK: ByteSize = ByteSize(256 * 1024 * 1024 * 1024);
pub const MAX_PIDS: u32 = 65_536;
pub const MAX_TIMEOUT_SECS: u64 = 30 * 24 * 3600;
const MAX_ENV_ENTRIES: usize = 4096;
const MAX_METADATA_ENTRIES: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("invalid size {0:?}: use a number with an optional K, M, G or T suffix, e.g. 512M")]
    Size(String),
    #[error("invalid duration {0:?}: use a number with an optional ms, s, m, h or d suffix, e.g. 30s")]
    Duration(String),
    #[error("{field} {value} is out of range ({allowed})")]
    OutOfRange { field: &'static str, value: String, allowed: String },
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// Resource limits. `None` means the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPU quota in cores, e.g. 0.5 or 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// Size of the writable layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
}

/// Limits with every default filled in and every bound checked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ResolvedLimits {
    pub cpus: f64,
    pub memory: ByteSize,
    pub disk: ByteSize,
    pub pids: u32,
}

impl Limits {
    pub fn resolve(&self) -> Result<ResolvedLimits, SpecError> {
        let cpus = self.cpus.unwrap_or(DEFAULT_CPUS);
        if !(cpus.is_finite() && (0.01..=1024.0).contains(&cpus)) {
            return Err(out_of_range("cpus", cpus, "0.01 to 1024"));
        }
        let memory = self.memory.unwrap_or(DEFAULT_MEMORY);
        if memory.0 < 8 * 1024 * 1024 || memory > MAX_MEMORY {
            return Err(out_of_range("memory", memory, "8M to 64G"));
        }
        let disk = self.disk.unwrap_or(DEFAULT_DISK);
        if disk.0 < 1024 * 1024 || disk > MAX_DISK {
            return Err(out_of_range("disk", disk, "1M to 256G"));
        }
        let pids = self.pids.unwrap_or(DEFAULT_PIDS);
        if !(8..=MAX_PIDS).contains(&pids) {
            return Err(out_of_range("pids", pids, "8 to 65536"));
        }
        Ok(ResolvedLimits { cpus, memory, disk, pids })
    }
}

fn out_of_range(field: &'static str, value: impl fmt::Display, allowed: &str) -> SpecError {
    SpecError::OutOfRange { field, value: value.to_string(), allowed: allowed.to_string() }
}

/// A host directory made visible inside the sandbox (`corral run -v HOST:PATH[:ro]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Volume {
    pub host: String,
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

impl FromStr for Volume {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let invalid = |reason: &str| SpecError::Invalid { field: "volume", reason: format!("{s:?}: {reason}") };
        let parts: Vec<&str> = s.split(':').collect();
        let (host, path, read_only) = match parts.as_slice() {
            [host, path] => (*host, *path, false),
            [host, path, "ro"] => (*host, *path, true),
            [host, path, "rw"] => (*host, *path, false),
            _ => return Err(invalid("expected HOSTDIR:PATH or HOSTDIR:PATH:ro")),
        };
        let volume = Volume { host: host.to_string(), path: path.to_string(), read_only };
        volume.validate()?;
        Ok(volume)
    }
}

impl Volume {
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |reason: &str| SpecError::Invalid { field: "volume", reason: reason.to_string() };
        if !self.host.starts_with('/') || !self.path.starts_with('/') {
            return Err(invalid("both paths must be absolute"));
        }
        if self.path.split('/').any(|c| c == ".." || c == ".") || self.path == "/" {
            return Err(invalid("the sandbox path must be a normalized directory other than /"));
        }
        for reserved in ["/proc", "/dev", "/sys", "/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc"] {
            if self.path == reserved || self.path.starts_with(&format!("{reserved}/")) {
                return Err(invalid(&format!("{} is managed by corral", self.path)));
            }
        }
        Ok(())
    }
}

/// Everything a client can ask for when it creates a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Template name; `base` when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default, flatten)]
    pub limits: Limits,
    /// Environment for every process in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Client labels, filterable in list.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Seconds until the sandbox is killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Egress policy and brokered secrets; the default allows no destination at all.
    #[serde(default, skip_serializing_if = "NetworkSpec::is_empty")]
    pub network: NetworkSpec,
    /// What happens when the timeout expires: `kill` (default) or `pause`.
    #[serde(default, skip_serializing_if = "TimeoutAction::is_kill")]
    pub on_timeout: TimeoutAction,
    /// Start from this snapshot's files, settings and interpreter state instead of the bare
    /// template. Fields given here override the snapshot's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
}

/// What the daemon does with a sandbox whose timeout expired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutAction {
    #[default]
    Kill,
    /// Freeze it instead; it keeps its memory and can be resumed.
    Pause,
}

impl TimeoutAction {
    pub fn is_kill(&self) -> bool {
        *self == TimeoutAction::Kill
    }
}

impl FromStr for TimeoutAction {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "kill" => Ok(TimeoutAction::Kill),
            "pause" => Ok(TimeoutAction::Pause),
            other => Err(SpecError::Invalid { field: "on_timeout", reason: format!("{other:?}: use kill or pause") }),
        }
    }
}

impl SandboxSpec {
    pub fn template(&self) -> &str {
        self.template.as_deref().filter(|t| !t.is_empty()).unwrap_or(DEFAULT_TEMPLATE)
    }

    pub fn timeout_secs(&self) -> u64 {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS)
    }

    /// Checks everything that can be checked without the host.
    pub fn validate(&self) -> Result<ResolvedLimits, SpecError> {
        let limits = self.limits.resolve()?;
        let template = self.template();
        if !is_name(template) {
            return Err(SpecError::Invalid { field: "template", reason: format!("{template:?} is not a template name") });
        }
        if let Some(t) = self.timeout {
            if t == 0 || t > MAX_TIMEOUT_SECS {
                return Err(out_of_range("timeout", t, "1 to 2592000 seconds"));
            }
        }
        validate_env(&self.env)?;
        if self.metadata.len() > MAX_METADATA_ENTRIES {
            return Err(SpecError::Invalid { field: "metadata", reason: "at most 256 entries".into() });
        }
        for (k, v) in &self.metadata {
            if k.is_empty() || k.len() > 256 || v.len() > 4096 {
                return Err(SpecError::Invalid { field: "metadata", reason: format!("entry {k:?} is empty or too long") });
            }
        }
        for volume in &self.volumes {
            volume.validate()?;
        }
        if let Some(snapshot) = &self.from_snapshot {
            if !is_name(snapshot) {
                return Err(SpecError::Invalid { field: "from_snapshot", reason: format!("{snapshot:?} is not a snapshot id") });
            }
        }
        self.network.validate()?;
        Ok(limits)
    }
}

pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), SpecError> {
    if env.len() > MAX_ENV_ENTRIES {
        return Err(SpecError::Invalid { field: "env", reason: "at most 4096 variables".into() });
    }
    for (k, v) in env {
        let bad_name = k.is_empty() || k.contains('=') || k.contains('\0');
        if bad_name || v.contains('\0') {
            return Err(SpecError::Invalid { field: "env", reason: format!("variable {k:?} has an invalid name or value") });
        }
    }
    Ok(())
}

/// Parses `K=V` as given on a command line.
pub fn parse_env_pair(s: &str) -> Result<(String, String), SpecError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(SpecError::Invalid { field: "env", reason: format!("{s:?} is not KEY=VALUE") }),
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) && !s.starts_with('.')
}

/// A size in bytes; parses and prints `512M`, `1G`, `1048576`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let number: u64 = number.parse().map_err(|_| SpecError::Size(s.to_string()))?;
        let multiplier: u64 = match unit.trim().to_ascii_uppercase().as_str() {
            "" | "B" => 1,
            "K" | "KB" | "KIB" => 1 << 10,
            "M" | "MB" | "MIB" => 1 << 20,
            "G" | "GB" | "GIB" => 1 << 30,
            "T" | "TB" | "TIB" => 1 << 40,
            _ => return Err(SpecError::Size(s.to_string())),
        };
        number.checked_mul(multiplier).map(ByteSize).ok_or_else(|| SpecError::Size(s.to_string()))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
            if self.0 >= 1 << shift && self.0 % (1 << shift) == 0 {
                return write!(f, "{}{unit}", self.0 >> shift);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// Accepts a number of bytes or a string such as "512M".
impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(ByteSize(n)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Parses `30s`, `5m`, `1h`, `250ms`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, SpecError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number.parse().map_err(|_| SpecError::Duration(s.to_string()))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err(SpecError::Duration(s.to_string())),
    };
    ms.map(std::time::Duration::from_millis).ok_or_else(|| SpecError::Duration(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_reject_garbage() {
        assert_eq!("512M".parse::<ByteSize>(), Ok(ByteSize(512 << 20)));
        assert_eq!("1g".parse::<ByteSize>(), Ok(ByteSize(1 << 30)));
        assert_eq!("4096".parse::<ByteSize>(), Ok(ByteSize(4096)));
        assert!("12Q".parse::<ByteSize>().is_err());
        assert!("-1M".parse::<ByteSize>().is_err());
        assert!("99999999999999999999T".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(512 << 20).to_string(), "512M");
    }

    #[test]
    fn spec_json_accepts_strings_or_numbers_and_rejects_unknown_fields() {
        let spec: SandboxSpec = serde_json::from_str(r#"{"memory":"256M","disk":1048576,"pids":64}"#).expect("spec");
        assert_eq!(spec.limits.memory, Some(ByteSize(256 << 20)));
        assert!(serde_json::from_str::<SandboxSpec>(r#"{"memroy":"256M"}"#).is_err());
    }

    #[test]
    fn limits_outside_bounds_are_refused() {
        let too_small = Limits { memory: Some(ByteSize(1024)), ..Default::default() };
        assert!(matches!(too_small.resolve(), Err(SpecError::OutOfRange { field: "memory", .. })));
        let nan = Limits { cpus: Some(f64::NAN), ..Default::default() };
        assert!(nan.resolve().is_err());
        let spec = SandboxSpec { template: Some("../etc".into()), ..Default::default() };
        assert!(spec.validate().is_err());
    }

    #[test]
    fn volumes_parse_and_cannot_cover_system_paths() {
        let v: Volume = "/srv/data:/data:ro".parse().expect("volume");
        assert!(v.read_only);
        assert!("/srv:/proc".parse::<Volume>().is_err());
        assert!("/srv:/home/../etc".parse::<Volume>().is_err());
        assert!("relative:/data".parse::<Volume>().is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(std::time::Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(std::time::Duration::from_secs(120)));
        assert_eq!(parse_duration("15"), Ok(std::time::Duration::from_secs(15)));
        assert!(parse_duration("soon").is_err());
    }
}
