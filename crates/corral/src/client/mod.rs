//! CLI verbs that talk to a running daemon over its HTTP API.

mod code;
mod cp;
mod exec;
mod http;
mod network;
mod pool;
mod state;
mod types;

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use types::SandboxInfo;
use corral_spec::{parse_duration, parse_env_pair, ByteSize, Limits, SandboxSpec, Volume};
use reqwest::Method;

pub use cp::CpArgs;
pub use exec::ExecArgs;
use http::{segment, Api, Conn};

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Create a sandbox and print its id
    Create(CreateArgs),
    /// List sandboxes
    Ps(PsArgs),
    /// Run a command in a sandbox
    Exec(ExecArgs),
    /// Run code in a sandbox's stateful interpreter (Python, or JavaScript with --language js)
    Code(code::CodeArgs),
    /// Copy a file into or out of a sandbox
    Cp(CpArgs),
    /// Kill sandboxes
    Kill(KillArgs),
    /// Show a sandbox as JSON
    Inspect(InspectArgs),
    /// Freeze sandboxes: no CPU, memory and processes kept, timeout stopped
    Pause(state::IdsArgs),
    /// Resume paused sandboxes
    Resume(state::IdsArgs),
    /// Snapshot a sandbox (files, settings, interpreter variables) and print the snapshot id
    Snapshot(state::SnapshotArgs),
    /// List, inspect and delete snapshots
    #[command(subcommand)]
    Snapshots(state::SnapshotsCommand),
    /// Put a sandbox back to a snapshot, in place
    Rollback(state::RollbackArgs),
    /// Make new sandboxes from a sandbox's current state
    Fork(state::ForkArgs),
    /// Show a sandbox's logs (egress audit with --network)
    Logs(network::LogsArgs),
    /// Manage brokered secrets
    #[command(subcommand)]
    Secret(network::SecretCommand),
    /// Manage warm pools of ready sandboxes
    #[command(subcommand)]
    Pool(pool::PoolCommand),
}

/// Runs a verb and returns the process exit code. Errors are printed here as
/// `error: <message>` and turn into exit code 1, so callers only need to exit with the code.
pub fn run(cmd: ClientCommand) -> anyhow::Result<i32> {
    let result = match cmd {
        ClientCommand::Create(args) => create(args),
        ClientCommand::Ps(args) => ps(args),
        ClientCommand::Exec(args) => exec::run(args),
        ClientCommand::Code(args) => code::run(args),
        ClientCommand::Cp(args) => cp::run(args),
        ClientCommand::Kill(args) => kill(args),
        ClientCommand::Inspect(args) => inspect(args),
        ClientCommand::Pause(args) => state::pause_or_resume(args, "pause"),
        ClientCommand::Resume(args) => state::pause_or_resume(args, "resume"),
        ClientCommand::Snapshot(args) => state::snapshot(args),
        ClientCommand::Snapshots(cmd) => state::snapshots(cmd),
        ClientCommand::Rollback(args) => state::rollback(args),
        ClientCommand::Fork(args) => state::fork(args),
        ClientCommand::Logs(args) => network::logs(args),
        ClientCommand::Secret(cmd) => network::secret(cmd),
        ClientCommand::Pool(cmd) => pool::run(cmd),
    };
    match result {
        Ok(code) => Ok(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            Ok(1)
        }
    }
}

fn parse_timeout_secs(s: &str) -> Result<u64, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d.as_secs() == 0 {
        return Err("the timeout must be at least 1s".into());
    }
    Ok(d.as_secs())
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    parse_env_pair(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral create\n  corral create --memory 1G --cpus 2 --timeout 1h -e API_URL=http://x --metadata owner=alice")]
pub struct CreateArgs {
    /// Template (root filesystem) to start from
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
    /// Memory limit, e.g. 512M or 2G
    #[arg(long, value_name = "SIZE")]
    memory: Option<ByteSize>,
    /// CPU quota in cores, e.g. 0.5 or 2
    #[arg(long, value_name = "N")]
    cpus: Option<f64>,
    /// Maximum number of processes
    #[arg(long, value_name = "N")]
    pids: Option<u32>,
    /// Size of the writable disk, e.g. 1G
    #[arg(long, value_name = "SIZE")]
    disk: Option<ByteSize>,
    /// Kill the sandbox after this long, e.g. 300s, 30m, 2h
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout_secs)]
    timeout: Option<u64>,
    /// What the timeout does: kill (default) or pause
    #[arg(long, value_name = "ACTION")]
    on_timeout: Option<corral_spec::TimeoutAction>,
    /// Start from a snapshot (files, settings, interpreter state) instead of the bare template
    #[arg(long = "from", value_name = "SNAPSHOT")]
    from_snapshot: Option<String>,
    /// Environment variable for every process in the sandbox (repeatable)
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// Label to filter on in `corral ps` (repeatable)
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_pair)]
    metadata: Vec<(String, String)>,
    /// Host directory to mount, HOSTDIR:PATH[:ro] (repeatable)
    #[arg(short = 'v', long = "volume", value_name = "HOSTDIR:PATH[:ro]")]
    volumes: Vec<Volume>,
    /// Print the full sandbox info as JSON instead of the id
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    network: network::CreateNetworkArgs,
    #[command(flatten)]
    conn: Conn,
}

fn create(args: CreateArgs) -> Result<i32> {
    let spec = SandboxSpec {
        template: args.template,
        limits: Limits { cpus: args.cpus, memory: args.memory, disk: args.disk, pids: args.pids },
        env: args.env.into_iter().collect(),
        metadata: args.metadata.into_iter().collect(),
        timeout: args.timeout,
        volumes: args.volumes,
        network: Default::default(),
        on_timeout: args.on_timeout.unwrap_or_default(),
        from_snapshot: args.from_snapshot,
    };
    // Same checks as the daemon, without the round trip.
    if let Err(e) = spec.validate() {
        bail!("{e}");
    }
    let mut spec = spec;
    spec.network = args.network.into_spec(&args.conn)?;
    let api = Api::new(&args.conn)?;
    let info: SandboxInfo = api.json(api.request(Method::POST, "/v1/sandboxes").json(&spec))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        println!("{}", info.id);
    }
    Ok(0)
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral ps\n  corral ps --all\n  corral ps --state killed,exited --metadata owner=alice --json")]
pub struct PsArgs {
    /// Include killed and exited sandboxes
    #[arg(short, long)]
    all: bool,
    /// Only these states (comma-separated): running, paused, killed, exited
    #[arg(long, value_name = "STATES")]
    state: Option<String>,
    /// Only sandboxes with this metadata (repeatable; all must match)
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_pair)]
    metadata: Vec<(String, String)>,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Conn,
}

#[derive(serde::Deserialize)]
struct SandboxList {
    sandboxes: Vec<SandboxInfo>,
}

fn ps(args: PsArgs) -> Result<i32> {
    let mut query: Vec<(String, String)> = Vec::new();
    match (&args.state, args.all) {
        (Some(state), _) => query.push(("state".into(), state.clone())),
        (None, false) => query.push(("state".into(), "running,paused".into())),
        (None, true) => {}
    }
    query.extend(args.metadata.into_iter().map(|(k, v)| (format!("metadata.{k}"), v)));
    let api = Api::new(&args.conn)?;
    let list: SandboxList = api.json(api.request(Method::GET, "/v1/sandboxes").query(&query))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "sandboxes": list.sandboxes }))?);
        return Ok(0);
    }
    let mut rows = vec![["ID", "TEMPLATE", "STATE", "CREATED", "EXPIRES", "METADATA"].map(String::from).to_vec()];
    for s in &list.sandboxes {
        let state = match &s.end_reason {
            Some(reason) if s.state != "running" && reason != &s.state => format!("{} ({reason})", s.state),
            _ => s.state.clone(),
        };
        let expires = if s.state == "running" { short_time(&s.expires_at) } else { "-".into() };
        rows.push(vec![s.id.clone(), s.template.clone(), state, short_time(&s.created_at), expires, metadata_text(&s.metadata)]);
    }
    print_table(&rows);
    Ok(0)
}

/// `2024-05-01T12:34:56.789Z` → `2024-05-01 12:34:56`.
fn short_time(rfc3339: &str) -> String {
    rfc3339.get(..19).map(|t| t.replace('T', " ")).unwrap_or_else(|| rfc3339.to_string())
}

fn metadata_text(metadata: &BTreeMap<String, String>) -> String {
    metadata.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

fn print_table(rows: &[Vec<String>]) {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for row in rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        println!("{}", line.join("   ").trim_end());
    }
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral kill 3k9x2m7q8w1e5r4t6y0u\n  corral kill $(corral ps --json | jq -r '.sandboxes[].id')")]
pub struct KillArgs {
    /// Sandbox ids
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    conn: Conn,
}

fn kill(args: KillArgs) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    Ok(api.each_id(&args.ids, Method::DELETE, |id| format!("/v1/sandboxes/{id}")))
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  corral inspect 3k9x2m7q8w1e5r4t6y0u")]
pub struct InspectArgs {
    /// Sandbox id
    #[arg(value_name = "ID")]
    id: String,
    #[command(flatten)]
    conn: Conn,
}

fn inspect(args: InspectArgs) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    let info: serde_json::Value = api.json(api.request(Method::GET, &format!("/v1/sandboxes/{}", segment(&args.id))))?;
    println!("{}", serde_json::to_string_pretty(&info)?);
    Ok(0)
}
