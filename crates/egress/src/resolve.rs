//! Host-side name resolution with an operator override map (`NAME=IP[:PORT]`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use corral_spec::normalize_domain;

use crate::EgressError;

const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where an overridden name points. A port here replaces the requested one (tests point
/// `api.test:443` at a local server on an ephemeral port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Override {
    pub ip: IpAddr,
    pub port: Option<u16>,
}

/// Parses `NAME=IP`, `NAME=IP:PORT` or `NAME=[V6]:PORT`.
pub fn parse_override(s: &str) -> Result<(String, Override), EgressError> {
    let bad = || EgressError::Config(format!("{s:?} is not NAME=IP[:PORT]"));
    let (name, target) = s.split_once('=').ok_or_else(bad)?;
    let name = normalize_domain(name).ok_or_else(bad)?;
    if let Ok(ip) = target.parse::<IpAddr>() {
        return Ok((name, Override { ip, port: None }));
    }
    let addr: SocketAddr = target.parse().map_err(|_| bad())?;
    Ok((name, Override { ip: addr.ip(), port: Some(addr.port()) }))
}

#[derive(Debug, Default, Clone)]
pub struct Resolver {
    overrides: HashMap<String, Override>,
}

/// Candidate addresses for one destination.
pub struct Resolved {
    pub addrs: Vec<SocketAddr>,
    /// The operator chose these addresses; they may be private.
    pub overridden: bool,
}

impl Resolver {
    pub fn new(overrides: HashMap<String, Override>) -> Self {
        Resolver { overrides }
    }

    pub async fn resolve(&self, name: &str, port: u16) -> Result<Resolved, String> {
        if let Some(o) = self.overrides.get(name) {
            return Ok(Resolved { addrs: vec![SocketAddr::new(o.ip, o.port.unwrap_or(port))], overridden: true });
        }
        match tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((name, port))).await {
            Ok(Ok(addrs)) => {
                let mut addrs: Vec<SocketAddr> = addrs.collect();
                addrs.dedup();
                if addrs.is_empty() {
                    return Err(format!("{name} has no addresses"));
                }
                Ok(Resolved { addrs, overridden: false })
            }
            Ok(Err(err)) => Err(format!("cannot resolve {name}: {err}")),
            Err(_) => Err(format!("resolving {name} timed out")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse() {
        let (name, o) = parse_override("API.test=127.0.0.1:8443").unwrap();
        assert_eq!(name, "api.test");
        assert_eq!(o, Override { ip: "127.0.0.1".parse().unwrap(), port: Some(8443) });
        assert_eq!(parse_override("x.test=::1").unwrap().1.port, None);
        assert!(parse_override("x.test").is_err());
        assert!(parse_override("=1.2.3.4").is_err());
    }
}
