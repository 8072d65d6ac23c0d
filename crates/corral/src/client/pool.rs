//! `corral pool`: warm pools of ready sandboxes per template.

use anyhow::Result;
use reqwest::Method;

use super::http::{segment, Api, Conn};
use super::parse_timeout_secs;

#[derive(clap::Subcommand, Debug)]
pub enum PoolCommand {
    /// List pools with their sizes, hits, misses and refill latency
    Ls {
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Create or change a template's pool (stored by the daemon)
    #[command(after_help = "Example:\n  corral pool set base --min 2 --max 8 --idle 5m\n\n\
MIN sandboxes are always ready; up to MAX while creates come in; back to MIN after IDLE without one.")]
    Set {
        #[arg(value_name = "TEMPLATE")]
        template: String,
        #[arg(long)]
        min: u32,
        /// Default: MIN
        #[arg(long)]
        max: Option<u32>,
        /// e.g. 30s, 5m (default 5m)
        #[arg(long, value_name = "DURATION", value_parser = parse_timeout_secs)]
        idle: Option<u64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a template's pool and destroy its ready sandboxes
    Rm {
        #[arg(value_name = "TEMPLATE")]
        template: String,
        #[command(flatten)]
        conn: Conn,
    },
}

pub fn run(cmd: PoolCommand) -> Result<i32> {
    match cmd {
        PoolCommand::Ls { json, conn } => {
            let api = Api::new(&conn)?;
            let list: serde_json::Value = api.json(api.request(Method::GET, "/v1/pools"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            println!("{:<20} {:>4} {:>4} {:>6} {:>6} {:>8} {:>8} {:>8} {:>10}", "TEMPLATE", "MIN", "MAX", "IDLE", "READY", "HITS", "MISSES", "SKIPPED", "REFILL_MS");
            for p in list["pools"].as_array().into_iter().flatten() {
                println!(
                    "{:<20} {:>4} {:>4} {:>6} {:>6} {:>8} {:>8} {:>8} {:>10}",
                    p["template"].as_str().unwrap_or(""),
                    p["min"].as_u64().unwrap_or(0),
                    p["max"].as_u64().unwrap_or(0),
                    format!("{}s", p["idle_secs"].as_u64().unwrap_or(0)),
                    p["ready"].as_u64().unwrap_or(0),
                    p["hits"].as_u64().unwrap_or(0),
                    p["misses"].as_u64().unwrap_or(0),
                    p["skipped"].as_u64().unwrap_or(0),
                    p["refill_p50_ms"].as_f64().map(|ms| format!("{ms:.1}")).unwrap_or_else(|| "-".into())
                );
            }
            Ok(0)
        }
        PoolCommand::Set { template, min, max, idle, conn } => {
            let api = Api::new(&conn)?;
            let body = serde_json::json!({ "min": min, "max": max, "idle_secs": idle });
            api.send(api.request(Method::PUT, &format!("/v1/pools/{}", segment(&template))).json(&body))?;
            println!("{template}");
            Ok(0)
        }
        PoolCommand::Rm { template, conn } => {
            let api = Api::new(&conn)?;
            api.send(api.request(Method::DELETE, &format!("/v1/pools/{}", segment(&template))))?;
            println!("{template}");
            Ok(0)
        }
    }
}
