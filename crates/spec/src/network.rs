//! Network policy of a sandbox: which destinations its egress proxy may reach, and which
//! brokered secrets it may use. Parsed and validated here so the API, the CLI and the proxy
//! agree on one syntax.
//!
//! Rule syntax: `example.com`, `*.example.com` (subdomains only, not the apex), `1.2.3.4`,
//! `10.0.0.0/8`, `2001:db8::1`, `2001:db8::/32`, each optionally followed by `:PORT`
//! (IPv6 with a port in brackets: `[2001:db8::1]:443`, `[2001:db8::/32]:443`).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::SpecError;

const MAX_RULES: usize = 1024;
const MAX_SECRETS: usize = 64;

/// What a destination rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleTarget {
    /// Exactly this name (lower case, no trailing dot).
    Domain(String),
    /// Any name strictly below this suffix (`*.example.com` stores `example.com`).
    Wildcard(String),
    /// An address range; a single address is a /32 or /128.
    Cidr { addr: IpAddr, prefix: u8 },
}

/// One allow or deny rule. Keeps the text it was parsed from for audit and refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub target: RuleTarget,
    /// `None` matches every port.
    pub port: Option<u16>,
    text: String,
}

impl Rule {
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the rule names this host (a name as the client asked for it) and port.
    pub fn matches_name(&self, name: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.target {
            RuleTarget::Domain(d) => d == name,
            RuleTarget::Wildcard(suffix) => {
                name.len() > suffix.len() + 1 && name.ends_with(suffix.as_str()) && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
            }
            RuleTarget::Cidr { .. } => false,
        }
    }

    /// Whether the rule covers this address and port.
    pub fn matches_addr(&self, ip: IpAddr, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match self.target {
            RuleTarget::Cidr { addr, prefix } => cidr_contains(addr, prefix, canonical(ip)),
            _ => false,
        }
    }

    pub fn is_cidr(&self) -> bool {
        matches!(self.target, RuleTarget::Cidr { .. })
    }
}

/// IPv4-mapped IPv6 addresses are treated as the IPv4 address they carry, so a rule for
/// 10.0.0.0/8 cannot be sidestepped with ::ffff:10.0.0.1.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn cidr_contains(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(prefix)) };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

impl FromStr for Rule {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let invalid = |reason: &str| SpecError::Invalid { field: "network rule", reason: format!("{s:?}: {reason}") };
        let text = s.trim();
        if text.is_empty() || text.len() > 300 {
            return Err(invalid("empty or too long"));
        }
        let (host, port) = split_port(text).map_err(|r| invalid(&r))?;
        let target = if let Some((addr, prefix)) = host.split_once('/') {
            let addr: IpAddr = addr.parse().map_err(|_| invalid("not an address range"))?;
            let prefix: u8 = prefix.parse().map_err(|_| invalid("bad prefix length"))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            if prefix > max {
                return Err(invalid("prefix length too long"));
            }
            let addr = canonical(addr);
            let prefix = if addr.is_ipv4() && max == 128 { prefix.saturating_sub(96) } else { prefix };
            RuleTarget::Cidr { addr, prefix }
        } else if let Ok(addr) = host.parse::<IpAddr>() {
            let addr = canonical(addr);
            RuleTarget::Cidr { addr, prefix: if addr.is_ipv4() { 32 } else { 128 } }
        } else if let Some(suffix) = host.strip_prefix("*.") {
            RuleTarget::Wildcard(normalize_domain(suffix).ok_or_else(|| invalid("not a domain name"))?)
        } else {
            RuleTarget::Domain(normalize_domain(host).ok_or_else(|| invalid("not a domain name, address or range"))?)
        };
        Ok(Rule { target, port, text: text.to_string() })
    }
}

/// Splits `host:port`, `[v6]:port`, `[v6/len]:port`; a bare IPv6 address has no port.
fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let parse_port = |p: &str| match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("bad port {p:?}")),
        Ok(port) => Ok(Some(port)),
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("missing ]")?;
        return match after {
            "" => Ok((host, None)),
            _ => Ok((host, parse_port(after.strip_prefix(':').ok_or("expected :PORT after ]")?)?)),
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (host, port) = text.split_once(':').ok_or("bad port")?;
            Ok((host, parse_port(port)?))
        }
        _ => Ok((text, None)),
    }
}

/// Lower-cases a DNS name and checks its shape; `None` if it is not one.
pub fn normalize_domain(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (!name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)).then_some(name)
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Destination rules: deny wins over allow, and anything not allowed is denied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub allow: Vec<Rule>,
    #[serde(default)]
    pub deny: Vec<Rule>,
}

impl NetworkPolicy {
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.allow.len() + self.deny.len() > MAX_RULES {
            return Err(SpecError::Invalid { field: "network", reason: format!("at most {MAX_RULES} rules") });
        }
        Ok(())
    }
}

/// The `network` field of a sandbox spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<Rule>,
    /// Names of secrets (stored with `POST /v1/secrets`) this sandbox may use. Each appears
    /// inside as an environment variable of the same name holding a placeholder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

impl NetworkSpec {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty() && self.secrets.is_empty()
    }

    pub fn policy(&self) -> NetworkPolicy {
        NetworkPolicy { allow: self.allow.clone(), deny: self.deny.clone() }
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        self.policy().validate()?;
        if self.secrets.len() > MAX_SECRETS {
            return Err(SpecError::Invalid { field: "network.secrets", reason: format!("at most {MAX_SECRETS}") });
        }
        for name in &self.secrets {
            validate_secret_name(name)?;
        }
        Ok(())
    }
}

/// Secret names double as environment variable names, so they must be valid ones.
pub fn validate_secret_name(name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(SpecError::Invalid { field: "secret name", reason: format!("{name:?}: use letters, digits and _ (an env var name)") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn rules_parse_in_every_form() {
        assert_eq!(rule("API.Example.com.").target, RuleTarget::Domain("api.example.com".into()));
        assert_eq!(rule("*.pypi.org:443").port, Some(443));
        assert_eq!(rule("10.0.0.0/8").target, RuleTarget::Cidr { addr: "10.0.0.0".parse().unwrap(), prefix: 8 });
        assert_eq!(rule("[2001:db8::/32]:443").port, Some(443));
        assert_eq!(rule("2001:db8::1").port, None);
        assert_eq!(rule("1.2.3.4:80").target, RuleTarget::Cidr { addr: "1.2.3.4".parse().unwrap(), prefix: 32 });
        for bad in ["", "a..b", "*.", "-x.com", "x.com:0", "x.com:99999", "10.0.0.0/33", "[::1", "a b.com", "*.*.com"] {
            assert!(bad.parse::<Rule>().is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn wildcards_match_subdomains_only_and_ports_are_checked() {
        let r = rule("*.example.com");
        assert!(r.matches_name("a.example.com", 443));
        assert!(r.matches_name("a.b.example.com", 80));
        assert!(!r.matches_name("example.com", 443));
        assert!(!r.matches_name("badexample.com", 443));
        let r = rule("example.com:443");
        assert!(r.matches_name("example.com", 443));
        assert!(!r.matches_name("example.com", 80));
    }

    #[test]
    fn cidrs_see_through_ipv4_mapped_addresses() {
        let r = rule("10.0.0.0/8");
        assert!(r.matches_addr("10.1.2.3".parse().unwrap(), 80));
        assert!(r.matches_addr("::ffff:10.1.2.3".parse().unwrap(), 80));
        assert!(!r.matches_addr("11.0.0.1".parse().unwrap(), 80));
        assert!(rule("::ffff:127.0.0.0/104").matches_addr("127.0.0.1".parse().unwrap(), 1));
    }

    #[test]
    fn network_spec_rejects_unknown_fields_and_bad_secret_names() {
        assert!(serde_json::from_str::<NetworkSpec>(r#"{"allow":["x.com"],"alow":[]}"#).is_err());
        assert!(serde_json::from_str::<NetworkSpec>(r#"{"allow":["not a host"]}"#).is_err());
        let spec: NetworkSpec = serde_json::from_str(r#"{"allow":["x.com"],"secrets":["1BAD"]}"#).unwrap();
        assert!(spec.validate().is_err());
    }
}
