//! The `corral` binary: CLI, daemon, and (re-used inside every sandbox) the agent.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod client;
mod run;
mod run_egress;
mod serve;

#[derive(Parser, Debug)]
#[command(name = "corral", version, about = "Disposable, isolated sandboxes for AI agents", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one command in a fresh sandbox and exit with its exit code (no daemon needed).
    Run(run::RunArgs),
    /// Run the daemon: the HTTP API that creates and manages sandboxes.
    Serve(serve::ServeArgs),
    #[command(flatten)]
    Client(client::ClientCommand),
    /// Internal: the egress proxy of one `corral run` sandbox.
    #[command(name = "__egress-proxy", hide = true)]
    EgressProxy,
}

/// `/var/lib/corral` for root, else `$XDG_DATA_HOME/corral` or `~/.local/share/corral`.
pub fn default_data_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/corral");
    }
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(dir).join("corral");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/share/corral")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Client(command) => client::run(command),
        Command::EgressProxy => run_egress::helper_main(),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(err) => {
            eprintln!("corral: {err:#}");
            ExitCode::from(125)
        }
    }
}
