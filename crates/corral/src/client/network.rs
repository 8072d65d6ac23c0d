//! Egress from the CLI: `corral create` network flags, `corral logs --network`, and the
//! secret store (`corral secret set|ls|rm`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use corral_spec::{NetworkSpec, Rule};
use reqwest::Method;
use serde_json::json;

use super::http::{segment, Api, Conn};

/// Network flags of `corral create` (the same as `corral run`'s, minus the proxy settings,
/// which belong to the daemon).
#[derive(Args, Debug, Default)]
pub struct CreateNetworkArgs {
    /// Allow connections to this host, *.domain, IP or CIDR, optionally :PORT (repeatable)
    #[arg(long = "allow-host", value_name = "RULE")]
    allow: Vec<Rule>,
    /// Deny this host, *.domain, IP or CIDR, optionally :PORT; deny wins (repeatable)
    #[arg(long = "deny-host", value_name = "RULE")]
    deny: Vec<Rule>,
    /// Broker a secret: stores the value of host env var ENV_VAR in the daemon as NAME, bound
    /// to the hosts (also allowed); $NAME inside holds a placeholder (repeatable)
    #[arg(long = "secret", value_name = "NAME=ENV_VAR@HOST[,HOST]")]
    secrets: Vec<String>,
}

impl CreateNetworkArgs {
    /// Uploads the secrets (values from this environment) and returns the spec's network.
    pub fn into_spec(self, conn: &Conn) -> Result<NetworkSpec> {
        let mut spec = NetworkSpec { allow: self.allow, deny: self.deny, secrets: Vec::new() };
        if self.secrets.is_empty() {
            return Ok(spec);
        }
        let api = Api::new(conn)?;
        for flag in &self.secrets {
            let flag = crate::run_egress::parse_secret_flag(flag)?;
            let value = std::env::var(&flag.env_var).with_context(|| format!("--secret {}: no {} in the environment", flag.name, flag.env_var))?;
            api.send(api.request(Method::POST, "/v1/secrets").json(&json!({ "name": flag.name, "value": value, "hosts": flag.hosts })))?;
            spec.allow.extend(flag.hosts);
            spec.secrets.push(flag.name);
        }
        Ok(spec)
    }
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral logs --network 3k9x2m7q8w1e5r4t6y0u\n  corral logs --network ID --json")]
pub struct LogsArgs {
    /// Sandbox id
    #[arg(value_name = "ID")]
    id: String,
    /// Show the egress audit trail (every connection attempt and its decision)
    #[arg(long)]
    network: bool,
    /// Print JSON lines instead of a table
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Conn,
}

pub fn logs(args: LogsArgs) -> Result<i32> {
    if !args.network {
        bail!("only --network logs exist so far");
    }
    let api = Api::new(&args.conn)?;
    let info: serde_json::Value = api.json(api.request(Method::GET, &format!("/v1/sandboxes/{}/network", segment(&args.id))))?;
    let entries = info["audit"].as_array().cloned().unwrap_or_default();
    for e in &entries {
        if args.json {
            println!("{e}");
            continue;
        }
        let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
        let what = match (e["method"].as_str(), e["path"].as_str()) {
            (Some(m), Some(p)) => format!(" {m} {p}"),
            _ => String::new(),
        };
        let rule = e["rule"].as_str().map(|r| format!(" rule={r}")).unwrap_or_default();
        println!(
            "{} {:<5} {:<7} {}:{}{what} {}{rule} up={} down={}",
            s("time"),
            s("decision"),
            s("protocol"),
            s("name"),
            e["port"],
            s("reason"),
            e["bytes_up"],
            e["bytes_down"]
        );
    }
    Ok(0)
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Store a secret (value read from the host environment variable ENV_VAR)
    Set {
        /// NAME=ENV_VAR@HOST[,HOST]
        #[arg(value_name = "NAME=ENV_VAR@HOST[,HOST]")]
        spec: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List secret names and their hosts (values are never shown)
    Ls {
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a secret
    Rm {
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

pub fn secret(cmd: SecretCommand) -> Result<i32> {
    match cmd {
        SecretCommand::Set { spec, conn } => {
            let flag = crate::run_egress::parse_secret_flag(&spec)?;
            let value = std::env::var(&flag.env_var).with_context(|| format!("no {} in the environment", flag.env_var))?;
            let api = Api::new(&conn)?;
            api.send(api.request(Method::POST, "/v1/secrets").json(&json!({ "name": flag.name, "value": value, "hosts": flag.hosts })))?;
            println!("{}", flag.name);
        }
        SecretCommand::Ls { conn } => {
            let api = Api::new(&conn)?;
            let list: serde_json::Value = api.json(api.request(Method::GET, "/v1/secrets"))?;
            for s in list["secrets"].as_array().cloned().unwrap_or_default() {
                let hosts: Vec<String> = s["hosts"].as_array().into_iter().flatten().filter_map(|h| h.as_str().map(String::from)).collect();
                println!("{}\t{}", s["name"].as_str().unwrap_or(""), hosts.join(","));
            }
        }
        SecretCommand::Rm { name, conn } => {
            let api = Api::new(&conn)?;
            api.send(api.request(Method::DELETE, &format!("/v1/secrets/{}", segment(&name))))?;
            println!("{name}");
        }
    }
    Ok(0)
}
