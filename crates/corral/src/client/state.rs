//! Verbs for sandboxes that keep their state: pause, resume, snapshots, rollback, fork.

use anyhow::Result;
use clap::Args;
use reqwest::Method;

use super::http::{segment, Api, Conn};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral pause 3k9x2m7q8w1e5r4t6y0u\n  corral resume 3k9x2m7q8w1e5r4t6y0u\n\n\
A paused sandbox keeps its memory and processes, uses no CPU, and its timeout stops running.")]
pub struct IdsArgs {
    /// Sandbox ids
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    conn: Conn,
}

/// `corral pause` / `corral resume`: one POST per id; prints the ids that succeeded.
pub fn pause_or_resume(args: IdsArgs, action: &str) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    Ok(api.each_id(&args.ids, Method::POST, |id| format!("/v1/sandboxes/{id}/{action}")))
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral snapshot 3k9x2m7q8w1e5r4t6y0u\n  corral snapshot --name before-migration 3k9x2m7q8w1e5r4t6y0u\n\n\
Captures the writable layer (every change, deletion, permission and owner), the settings and the code\n\
interpreter's variables. The memory of running commands is not captured (pause keeps that).")]
pub struct SnapshotArgs {
    /// Sandbox id
    #[arg(value_name = "ID")]
    id: String,
    /// A label for the snapshot
    #[arg(long)]
    name: Option<String>,
    /// Print the snapshot as JSON instead of its id
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Conn,
}

pub fn snapshot(args: SnapshotArgs) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    let path = format!("/v1/sandboxes/{}/snapshots", segment(&args.id));
    let info: serde_json::Value = api.json(api.request(Method::POST, &path).json(&serde_json::json!({ "name": args.name })))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        println!("{}", info["id"].as_str().unwrap_or_default());
        for context in info["interpreter"].as_array().into_iter().flatten() {
            for unsaved in context["unsaved"].as_array().into_iter().flatten() {
                eprintln!("note: {}: {} not saved: {}", context["id"].as_str().unwrap_or("?"), unsaved["name"].as_str().unwrap_or("?"), unsaved["reason"].as_str().unwrap_or(""));
            }
        }
    }
    Ok(0)
}

#[derive(clap::Subcommand, Debug)]
pub enum SnapshotsCommand {
    /// List snapshots (newest first)
    Ls {
        /// Only those of this sandbox
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a snapshot as JSON
    Inspect {
        #[arg(value_name = "SNAPSHOT")]
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete snapshots (a layer is removed with the last snapshot using it)
    Rm {
        #[arg(required = true, value_name = "SNAPSHOT")]
        ids: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

pub fn snapshots(cmd: SnapshotsCommand) -> Result<i32> {
    match cmd {
        SnapshotsCommand::Ls { sandbox, json, conn } => {
            let api = Api::new(&conn)?;
            let query: Vec<(&str, String)> = sandbox.map(|s| ("sandbox", s)).into_iter().collect();
            let list: serde_json::Value = api.json(api.request(Method::GET, "/v1/snapshots").query(&query))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            println!("{:<22} {:<22} {:<20} {:>12} {:>12}  NAME", "ID", "SANDBOX", "CREATED", "FILES", "STORED");
            for s in list["snapshots"].as_array().into_iter().flatten() {
                println!(
                    "{:<22} {:<22} {:<20} {:>12} {:>12}  {}",
                    s["id"].as_str().unwrap_or(""),
                    s["sandbox_id"].as_str().unwrap_or(""),
                    s["created_at"].as_str().and_then(|t| t.get(..19)).unwrap_or("").replace('T', " "),
                    s["file_bytes"].as_u64().unwrap_or(0),
                    s["layer_bytes"].as_u64().unwrap_or(0),
                    s["name"].as_str().unwrap_or("")
                );
            }
            Ok(0)
        }
        SnapshotsCommand::Inspect { id, conn } => {
            let api = Api::new(&conn)?;
            let info: serde_json::Value = api.json(api.request(Method::GET, &format!("/v1/snapshots/{}", segment(&id))))?;
            println!("{}", serde_json::to_string_pretty(&info)?);
            Ok(0)
        }
        SnapshotsCommand::Rm { ids, conn } => {
            let api = Api::new(&conn)?;
            Ok(api.each_id(&ids, Method::DELETE, |id| format!("/v1/snapshots/{id}")))
        }
    }
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  corral rollback 3k9x2m7q8w1e5r4t6y0u snap-1a2b3c4d5e6f7g8h\n\n\
The sandbox keeps its id and settings; its processes restart (a rollback is a reboot into the snapshot).")]
pub struct RollbackArgs {
    #[arg(value_name = "ID")]
    id: String,
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
    #[command(flatten)]
    conn: Conn,
}

pub fn rollback(args: RollbackArgs) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    let path = format!("/v1/sandboxes/{}/restore", segment(&args.id));
    api.send(api.request(Method::POST, &path).json(&serde_json::json!({ "snapshot": args.snapshot })))?;
    println!("{}", args.id);
    Ok(0)
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  corral fork 3k9x2m7q8w1e5r4t6y0u -n 4\n\nPrints the new sandboxes' ids, one a line.")]
pub struct ForkArgs {
    #[arg(value_name = "ID")]
    id: String,
    /// How many sandboxes to make
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    count: u32,
    #[command(flatten)]
    conn: Conn,
}

pub fn fork(args: ForkArgs) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    let path = format!("/v1/sandboxes/{}/fork", segment(&args.id));
    let answer: serde_json::Value = api.json(api.request(Method::POST, &path).json(&serde_json::json!({ "count": args.count })))?;
    for sandbox in answer["sandboxes"].as_array().into_iter().flatten() {
        println!("{}", sandbox["id"].as_str().unwrap_or_default());
    }
    Ok(0)
}
