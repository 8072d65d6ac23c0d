//! Egress for `corral run`, which has no daemon. With network flags, the sandbox init listens
//! on the loopback proxy port and relays connections as mux streams over a socketpair it
//! inherits; the other end belongs to a helper process (this binary, `__egress-proxy`) that
//! runs the same egress proxy as the daemon. A helper process rather than a thread because
//! the sandbox is forked from the CLI, which must stay single-threaded until then.
//!
//! Without network flags none of this runs, so plain `corral run` stays as fast as before.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use corral_egress::{BoundSecret, Egress, EgressConfig, SecretValue};
use corral_proto::{Mux, Request, Role};
use corral_spec::{NetworkPolicy, Rule};
use serde::{Deserialize, Serialize};

const CONFIG_ENV: &str = "CORRAL_EGRESS_CONFIG";

#[derive(Args, Debug, Default, Clone)]
pub struct NetworkArgs {
    /// Allow connections to this host, *.domain, IP or CIDR, optionally :PORT (repeatable).
    #[arg(long = "allow-host", value_name = "RULE")]
    pub allow: Vec<Rule>,
    /// Deny this host, *.domain, IP or CIDR, optionally :PORT; deny wins (repeatable).
    #[arg(long = "deny-host", value_name = "RULE")]
    pub deny: Vec<Rule>,
    /// Broker a secret: $NAME inside holds a placeholder; the proxy sends the value of the host
    /// env var ENV_VAR only to the listed hosts, which are also allowed (repeatable).
    #[arg(long = "secret", value_name = "NAME=ENV_VAR@HOST[,HOST]")]
    pub secrets: Vec<String>,
    /// Resolve NAME to IP[:PORT] in the proxy (may be a private address) (repeatable).
    #[arg(long = "egress-resolve", value_name = "NAME=IP[:PORT]")]
    pub resolve: Vec<String>,
    /// Also trust this PEM CA bundle for TLS from the proxy to upstreams (repeatable).
    #[arg(long = "egress-trust", value_name = "PEMFILE")]
    pub trust: Vec<PathBuf>,
}

impl NetworkArgs {
    pub fn enabled(&self) -> bool {
        !(self.allow.is_empty() && self.deny.is_empty() && self.secrets.is_empty())
    }
}

/// A parsed `--secret NAME=ENV_VAR@host1,host2`.
#[derive(Debug, Clone, PartialEq)]
pub struct SecretFlag {
    pub name: String,
    pub env_var: String,
    pub hosts: Vec<Rule>,
}

pub fn parse_secret_flag(s: &str) -> Result<SecretFlag> {
    let usage = || anyhow::anyhow!("--secret {s:?}: expected NAME=ENV_VAR@HOST[,HOST...]");
    let (name, rest) = s.split_once('=').ok_or_else(usage)?;
    let (env_var, hosts) = rest.split_once('@').ok_or_else(usage)?;
    corral_spec::validate_secret_name(name)?;
    if env_var.is_empty() {
        return Err(usage());
    }
    let hosts = hosts.split(',').map(|h| h.parse::<Rule>()).collect::<Result<Vec<_>, _>>()?;
    for rule in &hosts {
        corral_egress::secrets::check_host_rule(rule).map_err(anyhow::Error::msg)?;
    }
    Ok(SecretFlag { name: name.to_string(), env_var: env_var.to_string(), hosts })
}

/// What the helper process is told (through its environment; no secret values in it).
#[derive(Serialize, Deserialize)]
struct HelperConfig {
    sandbox: String,
    data_dir: PathBuf,
    policy: NetworkPolicy,
    secrets: Vec<HelperSecret>,
    resolve: Vec<String>,
    trust: Vec<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct HelperSecret {
    name: String,
    env_var: String,
    placeholder: String,
    hosts: Vec<Rule>,
}

/// What the sandbox init needs: its end of the socketpair and the CA to trust.
pub struct InitEgress {
    pub socket: UnixStream,
    pub ca_pem: String,
}

/// The host side, set up before the sandbox is forked.
pub struct HostEgress {
    pub init: InitEgress,
    /// Variables the command gets: proxy settings and secret placeholders.
    pub env: BTreeMap<String, String>,
    helper: Child,
}

/// The helper process, once the init's half has been handed over.
pub struct Helper {
    child: Child,
}

impl HostEgress {
    pub fn split(self) -> (Helper, InitEgress) {
        (Helper { child: self.helper }, self.init)
    }

    pub fn start(args: &NetworkArgs, sandbox: &str, data_dir: &std::path::Path) -> Result<HostEgress> {
        for entry in &args.resolve {
            corral_egress::parse_override(entry)?;
        }
        let mut policy = NetworkPolicy { allow: args.allow.clone(), deny: args.deny.clone() };
        let mut env = corral_agent::egress::proxy_env(corral_agent::egress::PROXY_PORT);
        let mut secrets = Vec::new();
        for flag in &args.secrets {
            let flag = parse_secret_flag(flag)?;
            if std::env::var_os(&flag.env_var).is_none() {
                bail!("--secret {}: the host environment has no {}", flag.name, flag.env_var);
            }
            // A secret's hosts are reachable without repeating them in --allow-host.
            policy.allow.extend(flag.hosts.iter().cloned());
            let bound = BoundSecret::new(flag.name.clone(), SecretValue::new(String::new()), flag.hosts.clone());
            env.insert(flag.name.clone(), bound.placeholder.clone());
            secrets.push(HelperSecret { name: flag.name, env_var: flag.env_var, placeholder: bound.placeholder, hosts: flag.hosts });
        }
        policy.validate()?;
        let ca = corral_egress::tls::Ca::load_or_create(data_dir)?;
        let config = HelperConfig {
            sandbox: sandbox.to_string(),
            data_dir: data_dir.to_path_buf(),
            policy,
            secrets,
            resolve: args.resolve.clone(),
            trust: args.trust.clone(),
        };
        let (host_end, sandbox_end) = UnixStream::pair().context("socketpair for egress")?;
        let exe = std::env::current_exe().context("finding the corral binary")?;
        let helper = Command::new(exe)
            .arg("__egress-proxy")
            .env(CONFIG_ENV, serde_json::to_string(&config)?)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(host_end)))
            .stdout(Stdio::null())
            .spawn()
            .context("starting the egress proxy")?;
        Ok(HostEgress { init: InitEgress { socket: sandbox_end, ca_pem: ca.cert_pem().to_string() }, env, helper })
    }

}

impl Helper {
    /// After the sandbox ended: the helper sees its socket close and exits; give it a moment
    /// to flush the audit log, then make sure.
    pub fn stop(mut self) {
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In the sandbox init, before the command starts: trust the CA, listen on the proxy port,
/// relay from a thread of its own. Returns an error message for the user if that fails.
pub fn start_in_sandbox(init: InitEgress) -> Result<(), String> {
    // The init keeps the CLI's environment (which may hold secret values) in its /proc; a
    // non-dumpable process cannot be read by sandbox root.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable).map_err(|e| format!("prctl: {e}"))?;
    corral_agent::egress::install_ca(&init.ca_pem).map_err(|e| format!("installing the CA: {e}"))?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", corral_agent::egress::PROXY_PORT)).map_err(|e| format!("proxy port: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    init.socket.set_nonblocking(true).map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("egress".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async move {
                let (Ok(listener), Ok(socket)) = (tokio::net::TcpListener::from_std(listener), tokio::net::UnixStream::from_std(init.socket)) else {
                    return;
                };
                let (mux, _incoming) = Mux::new(socket, Role::Agent);
                corral_agent::egress::relay(listener, move || Some(mux.clone())).await;
            });
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// `corral __egress-proxy`: serves the relayed connections of one `corral run` sandbox.
pub fn helper_main() -> Result<i32> {
    let config: HelperConfig = serde_json::from_str(&std::env::var(CONFIG_ENV).context("no egress config")?)?;
    let mut resolve = HashMap::new();
    for entry in &config.resolve {
        let (name, target) = corral_egress::parse_override(entry)?;
        resolve.insert(name, target);
    }
    let mut secrets = Vec::new();
    for s in config.secrets {
        let value = std::env::var(&s.env_var).with_context(|| format!("secret {}: no {} in the environment", s.name, s.env_var))?;
        secrets.push(BoundSecret::with_placeholder(s.name, s.placeholder, SecretValue::new(value), s.hosts));
    }
    let socket = UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    socket.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let egress = Egress::new(EgressConfig {
            ca_dir: config.data_dir.clone(),
            resolve,
            extra_roots: config.trust,
            audit_file: Some(config.data_dir.join("audit.jsonl")),
        })?;
        let sandbox = egress.sandbox(&config.sandbox, config.policy, secrets);
        let (_mux, mut incoming) = Mux::new(tokio::net::UnixStream::from_std(socket)?, Role::Host);
        while let Some((request, mut stream)) = incoming.accept().await {
            match request {
                Request::Egress { .. } => serve(sandbox.clone(), stream),
                _ => stream.sender.reset(),
            }
        }
        // Let the audit writer drain.
        tokio::time::sleep(Duration::from_millis(20)).await;
        anyhow::Ok(0)
    })
}

fn serve(sandbox: Arc<corral_egress::SandboxEgress>, stream: corral_proto::Stream) {
    let (proxy_side, relay_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(corral_proto::pipe::splice(stream, relay_side));
    tokio::spawn(sandbox.serve(proxy_side));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_flags_parse() {
        let f = parse_secret_flag("API_KEY=MY_KEY@api.example.com,*.example.org").unwrap();
        assert_eq!(f.name, "API_KEY");
        assert_eq!(f.env_var, "MY_KEY");
        assert_eq!(f.hosts.len(), 2);
        assert!(parse_secret_flag("API_KEY=MY_KEY").is_err());
        assert!(parse_secret_flag("1X=Y@h.com").is_err());
        assert!(parse_secret_flag("X=Y@10.0.0.0/8").is_err());
    }
}
