//! Policy decisions. Names are judged by name rules before anything is resolved, so a
//! sandbox cannot leak data through DNS lookups of names nobody allowed; addresses are then
//! judged by deny rules, CIDR rules and their class (public or not).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use corral_spec::{canonical, NetworkPolicy};

/// Why a connection was refused, in a form both HTTP and SOCKS answers and the audit use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Stable machine-readable reason, e.g. `denied_by_rule`.
    pub reason: &'static str,
    pub rule: Option<String>,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: &'static str, rule: Option<String>, message: impl Into<String>) -> Self {
        Refusal { reason, rule, message: message.into() }
    }
}

/// The first check, on the destination as the client named it. Returns the allowing rule.
pub fn check_name(policy: &NetworkPolicy, name: &str, port: u16) -> Result<String, Refusal> {
    if let Some(rule) = policy.deny.iter().find(|r| r.matches_name(name, port)) {
        return Err(Refusal::new("denied_by_rule", Some(rule.to_string()), format!("{name}:{port} is denied")));
    }
    match policy.allow.iter().find(|r| r.matches_name(name, port)) {
        Some(rule) => Ok(rule.to_string()),
        None => Err(Refusal::new("not_allowed", None, format!("{name}:{port} is not in the sandbox's allow list"))),
    }
}

/// The check on an address about to be connected to. `name_rule` is the rule that allowed the
/// name (if the client gave one); `overridden` is true when the operator pinned the name.
pub fn check_addr(policy: &NetworkPolicy, ip: IpAddr, port: u16, name_rule: Option<&str>, overridden: bool) -> Result<String, Refusal> {
    let ip = canonical(ip);
    if let Some(rule) = policy.deny.iter().find(|r| r.matches_addr(ip, port)) {
        return Err(Refusal::new("denied_by_rule", Some(rule.to_string()), format!("{ip}:{port} is denied")));
    }
    let cidr_rule = policy.allow.iter().find(|r| r.matches_addr(ip, port)).map(|r| r.to_string());
    let rule = match (name_rule, cidr_rule.as_ref()) {
        (Some(rule), _) => rule.to_string(),
        (None, Some(rule)) => rule.clone(),
        (None, None) => return Err(Refusal::new("not_allowed", None, format!("{ip}:{port} is not in the sandbox's allow list"))),
    };
    if !is_public(ip) && cidr_rule.is_none() && !overridden {
        return Err(Refusal::new(
            "non_public_address",
            name_rule.map(str::to_string),
            format!("{ip} is not a public address; only an explicit address or CIDR rule allows it"),
        ));
    }
    Ok(rule)
}

/// Whether an address is globally routable: not loopback, private, link-local (which holds
/// cloud metadata at 169.254.169.254), shared, documentation, multicast or reserved.
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let blocked = a == 0
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b))
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && (c == 0 || c == 2))
        || (a == 192 && b == 88 && c == 99)
        || (a == 192 && b == 168)
        || (a == 198 && (b == 18 || b == 19))
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || a >= 224;
    !blocked
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return false;
    }
    // NAT64 and 6to4 embed IPv4 addresses: judge the embedded one.
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((seg[6] >> 8) as u8, seg[6] as u8, (seg[7] >> 8) as u8, seg[7] as u8);
        return is_public_v4(v4);
    }
    if seg[0] == 0x2002 {
        let v4 = Ipv4Addr::new((seg[1] >> 8) as u8, seg[1] as u8, (seg[2] >> 8) as u8, seg[2] as u8);
        return is_public_v4(v4);
    }
    let unique_local = seg[0] & 0xfe00 == 0xfc00;
    let link_local = seg[0] & 0xffc0 == 0xfe80;
    let site_local = seg[0] & 0xffc0 == 0xfec0;
    let documentation = seg[0] == 0x2001 && seg[1] == 0x0db8;
    let ipv4_compatible = seg[0..6] == [0, 0, 0, 0, 0, 0];
    let discard = seg[0] == 0x0100 && seg[1..4] == [0, 0, 0];
    !(unique_local || link_local || site_local || documentation || ipv4_compatible || discard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            allow: allow.iter().map(|r| r.parse().expect("rule")).collect(),
            deny: deny.iter().map(|r| r.parse().expect("rule")).collect(),
        }
    }

    #[test]
    fn deny_wins_and_default_is_deny() {
        let p = policy(&["*.example.com", "api.example.com"], &["evil.example.com"]);
        assert!(check_name(&p, "api.example.com", 443).is_ok());
        assert_eq!(check_name(&p, "evil.example.com", 443).unwrap_err().reason, "denied_by_rule");
        assert_eq!(check_name(&p, "other.org", 443).unwrap_err().reason, "not_allowed");
        assert_eq!(check_name(&NetworkPolicy::default(), "example.com", 80).unwrap_err().reason, "not_allowed");
    }

    #[test]
    fn ports_restrict_rules() {
        let p = policy(&["example.com:443"], &[]);
        assert!(check_name(&p, "example.com", 443).is_ok());
        assert_eq!(check_name(&p, "example.com", 8443).unwrap_err().reason, "not_allowed");
    }

    #[test]
    fn private_and_metadata_addresses_need_an_explicit_cidr() {
        let p = policy(&["example.com"], &[]);
        for ip in ["127.0.0.1", "10.1.2.3", "169.254.169.254", "192.168.1.1", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "64:ff9b::a00:1", "0.0.0.0", "100.64.0.1"] {
            let err = check_addr(&p, ip.parse().unwrap(), 80, Some("example.com"), false).unwrap_err();
            assert_eq!(err.reason, "non_public_address", "{ip}");
        }
        assert!(check_addr(&p, "93.184.215.14".parse().unwrap(), 80, Some("example.com"), false).is_ok());
        assert!(check_addr(&p, "127.0.0.1".parse().unwrap(), 80, Some("example.com"), true).is_ok(), "operator override");
        assert_eq!(check_addr(&p, "169.254.169.254".parse().unwrap(), 80, None, false).unwrap_err().reason, "not_allowed");
        let p = policy(&["10.0.0.0/8"], &[]);
        assert!(check_addr(&p, "10.9.9.9".parse().unwrap(), 80, None, false).is_ok());
        assert_eq!(check_addr(&p, "11.0.0.1".parse().unwrap(), 80, None, false).unwrap_err().reason, "not_allowed");
    }

    #[test]
    fn address_deny_rules_beat_name_allow_rules() {
        let p = policy(&["example.com"], &["93.184.0.0/16"]);
        let err = check_addr(&p, "93.184.215.14".parse().unwrap(), 443, Some("example.com"), false).unwrap_err();
        assert_eq!(err.reason, "denied_by_rule");
    }
}
