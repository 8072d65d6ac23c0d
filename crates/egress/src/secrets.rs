//! Brokered secrets: the placeholder a sandbox sees, the hosts the real value may go to,
//! and the checks that keep a placeholder from going anywhere else.

use corral_spec::{Rule, RuleTarget};
use rand::Rng;

/// Every placeholder starts with this, so one scan finds candidates for any secret.
pub const PLACEHOLDER_PREFIX: &[u8] = b"corral_ph_";
const PLACEHOLDER_RANDOM: usize = 40;

/// A secret value. Its `Debug` never prints it.
#[derive(Clone)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: String) -> Self {
        SecretValue(value)
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A secret as handed to one sandbox.
#[derive(Debug, Clone)]
pub struct BoundSecret {
    pub name: String,
    /// What the sandbox sees in its env var; unguessable and unique to this sandbox.
    pub placeholder: String,
    pub value: SecretValue,
    /// Domain rules (exact or wildcard) for where the value may be sent.
    pub hosts: Vec<Rule>,
}

impl BoundSecret {
    pub fn new(name: String, value: SecretValue, hosts: Vec<Rule>) -> Self {
        let mut rng = rand::rng();
        const HEX: &[u8] = b"0123456789abcdef";
        let random: String = (0..PLACEHOLDER_RANDOM).map(|_| char::from(HEX[rng.random_range(0..16)])).collect();
        let placeholder = format!("{}{random}", String::from_utf8_lossy(PLACEHOLDER_PREFIX));
        BoundSecret { name, placeholder, value, hosts }
    }

    /// For a proxy in another process than the one that made the placeholder (`corral run`).
    pub fn with_placeholder(name: String, placeholder: String, value: SecretValue, hosts: Vec<Rule>) -> Self {
        BoundSecret { name, placeholder, value, hosts }
    }

    pub fn bound_to(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|r| r.matches_name(host, port))
    }
}

/// Secret host rules must name domains: TLS is terminated per name.
pub fn check_host_rule(rule: &Rule) -> Result<(), String> {
    match rule.target {
        RuleTarget::Domain(_) | RuleTarget::Wildcard(_) => Ok(()),
        RuleTarget::Cidr { .. } => Err(format!("{rule}: secrets can only be bound to host names")),
    }
}

/// The secrets of one sandbox.
#[derive(Debug, Default, Clone)]
pub struct SecretSet {
    secrets: Vec<BoundSecret>,
}

/// A placeholder found where its secret is not bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exfiltration {
    pub secret: String,
}

impl SecretSet {
    pub fn new(secrets: Vec<BoundSecret>) -> Self {
        SecretSet { secrets }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &BoundSecret> {
        self.secrets.iter()
    }

    /// Whether any secret is bound to this destination (then its TLS is terminated).
    pub fn any_bound_to(&self, host: &str, port: u16) -> bool {
        self.secrets.iter().any(|s| s.bound_to(host, port))
    }

    /// The first placeholder in `bytes` whose secret is not bound to `host`.
    pub fn foreign_placeholder(&self, bytes: &[u8], host: &str, port: u16) -> Option<Exfiltration> {
        let mut at = 0;
        while let Some(pos) = find(&bytes[at..], PLACEHOLDER_PREFIX) {
            let start = at + pos;
            for s in &self.secrets {
                if bytes[start..].starts_with(s.placeholder.as_bytes()) && !s.bound_to(host, port) {
                    return Some(Exfiltration { secret: s.name.clone() });
                }
            }
            at = start + 1;
        }
        None
    }

    /// Replaces placeholders bound to `host` in a request head. Returns the new head and the
    /// names injected; a foreign placeholder anywhere in it is an exfiltration attempt.
    pub fn rewrite_head(&self, head: &[u8], host: &str, port: u16) -> Result<(Vec<u8>, Vec<String>), Exfiltration> {
        if let Some(ex) = self.foreign_placeholder(head, host, port) {
            return Err(ex);
        }
        let mut out = head.to_vec();
        let mut injected = Vec::new();
        for s in self.secrets.iter().filter(|s| s.bound_to(host, port)) {
            if find(&out, s.placeholder.as_bytes()).is_some() {
                out = replace_all(&out, s.placeholder.as_bytes(), s.value.expose().as_bytes());
                injected.push(s.name.clone());
            }
        }
        Ok((out, injected))
    }

    /// A streaming scanner for bodies and raw tunnels to `host`, or `None` when there is
    /// nothing to look for.
    pub fn scanner(&self, host: &str, port: u16) -> Option<Scanner> {
        let foreign: Vec<(Vec<u8>, String)> =
            self.secrets.iter().filter(|s| !s.bound_to(host, port)).map(|s| (s.placeholder.as_bytes().to_vec(), s.name.clone())).collect();
        (!foreign.is_empty()).then(|| Scanner { foreign, carry: Vec::new() })
    }
}

/// Finds placeholders split across chunk boundaries by keeping the tail of the last chunk.
pub struct Scanner {
    foreign: Vec<(Vec<u8>, String)>,
    carry: Vec<u8>,
}

impl Scanner {
    /// Call before forwarding `chunk`; an error means the chunk must not be sent.
    pub fn check(&mut self, chunk: &[u8]) -> Result<(), Exfiltration> {
        let longest = self.foreign.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let mut hay = std::mem::take(&mut self.carry);
        hay.extend_from_slice(chunk);
        let mut at = 0;
        while let Some(pos) = find(&hay[at..], PLACEHOLDER_PREFIX) {
            let start = at + pos;
            for (placeholder, name) in &self.foreign {
                if hay[start..].starts_with(placeholder) {
                    return Err(Exfiltration { secret: name.clone() });
                }
            }
            at = start + 1;
        }
        let keep = longest.saturating_sub(1).min(hay.len());
        self.carry = hay[hay.len() - keep..].to_vec();
        Ok(())
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        match hay[i..=hay.len() - needle.len()].iter().position(|b| *b == first) {
            Some(p) => {
                i += p;
                if &hay[i..i + needle.len()] == needle {
                    return Some(i);
                }
                i += 1;
            }
            None => return None,
        }
    }
    None
}

fn replace_all(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut rest = hay;
    while let Some(pos) = find(rest, needle) {
        out.extend_from_slice(&rest[..pos]);
        out.extend_from_slice(with);
        rest = &rest[pos + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> (SecretSet, String, String) {
        let a = BoundSecret::new("API_KEY".into(), SecretValue::new("real-a".into()), vec!["api.example.com".parse().unwrap()]);
        let b = BoundSecret::new("OTHER".into(), SecretValue::new("real-b".into()), vec!["*.other.com".parse().unwrap()]);
        let (pa, pb) = (a.placeholder.clone(), b.placeholder.clone());
        (SecretSet::new(vec![a, b]), pa, pb)
    }

    #[test]
    fn placeholders_are_unique_and_debug_hides_values() {
        let (s, pa, pb) = set();
        assert_ne!(pa, pb);
        assert!(!format!("{s:?}").contains("real-a"));
    }

    #[test]
    fn heads_get_bound_values_and_foreign_placeholders_are_refused() {
        let (s, pa, pb) = set();
        let head = format!("GET / HTTP/1.1\r\nAuthorization: Bearer {pa}\r\n\r\n");
        let (out, names) = s.rewrite_head(head.as_bytes(), "api.example.com", 443).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "GET / HTTP/1.1\r\nAuthorization: Bearer real-a\r\n\r\n");
        assert_eq!(names, vec!["API_KEY".to_string()]);
        let err = s.rewrite_head(head.as_bytes(), "evil.com", 443).unwrap_err();
        assert_eq!(err.secret, "API_KEY");
        let head = format!("GET /?k={pb} HTTP/1.1\r\n\r\n");
        assert!(s.rewrite_head(head.as_bytes(), "api.example.com", 443).is_err());
    }

    #[test]
    fn scanner_catches_placeholders_split_across_chunks() {
        let (s, pa, _) = set();
        let mut scan = s.scanner("evil.com", 443).unwrap();
        let body = format!("xxxx{pa}yyyy");
        let (one, two) = body.as_bytes().split_at(17);
        assert!(scan.check(one).is_ok());
        assert_eq!(scan.check(two).unwrap_err().secret, "API_KEY");
        let mut scan = s.scanner("evil.com", 443).unwrap();
        assert!(scan.check(b"harmless corral_ph_ mention").is_ok());
    }
}
