//! `corral serve`: the daemon. Forks the sandbox launcher first (while single-threaded), then
//! starts the async runtime and the HTTP API.

use std::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use corral_jail::native::NativeBackend;
use corral_jail::AgentBoot;
use corral_server::{ListenAddr, ServerConfig};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral serve\n  CORRAL_API_KEY=secret corral serve --listen 0.0.0.0:7070\n  \
    corral serve --socket /run/corral.sock\n  corral serve --pool base=2:8:5m")]
pub struct ServeArgs {
    /// TCP address for the HTTP API.
    #[arg(long, env = "CORRAL_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Serve on this unix socket instead of TCP.
    #[arg(long, conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Where the daemon keeps its database, templates and sandbox state.
    #[arg(long, env = "CORRAL_DATA_DIR", default_value_os_t = crate::default_data_dir())]
    pub data_dir: PathBuf,
    /// Accept this API key instead of generating one on first start.
    #[arg(long, env = "CORRAL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Kill every sandbox when the daemon stops. By default they keep running and the next
    /// start re-attaches them.
    #[arg(long, env = "CORRAL_KILL_SANDBOXES_ON_EXIT")]
    pub kill_sandboxes_on_exit: bool,
    /// Make the egress proxy resolve NAME to IP[:PORT] (repeatable); may be a private address.
    #[arg(long = "egress-resolve", value_name = "NAME=IP[:PORT]")]
    pub egress_resolve: Vec<String>,
    /// Also trust this PEM CA bundle for TLS from the egress proxy to upstreams (repeatable).
    #[arg(long = "egress-trust", value_name = "PEMFILE")]
    pub egress_trust: Vec<PathBuf>,
    /// Keep a warm pool of ready sandboxes for a template (repeatable; CORRAL_POOLS takes a
    /// comma-separated list): MIN always ready, up to MAX while requests come in, back to MIN
    /// after IDLE (default 5m) without one. Overrides a pool of that template set by the API.
    #[arg(long = "pool", env = "CORRAL_POOLS", value_delimiter = ',', value_name = "TEMPLATE=MIN:MAX[:IDLE]")]
    pub pools: Vec<corral_server::pools::PoolConfig>,
}

/// PID 1 of every daemon sandbox.
fn agent_entry(listener: UnixListener, boot: &AgentBoot, context: corral_jail::native::ChildContext) -> i32 {
    let config = corral_agent::AgentConfig { env: boot.env.clone(), ..Default::default() };
    corral_agent::run_sandbox(listener, config, Some(corral_agent::egress::PROXY_PORT), context.upper)
}

pub fn serve(args: ServeArgs) -> Result<i32> {
    if !rustix::process::geteuid().is_root() {
        bail!("corral serve needs root for now (it maps a private uid range for every sandbox)");
    }
    raise_fd_limit();
    let backend = NativeBackend::new(&args.data_dir, agent_entry).context("preparing the sandbox backend")?;
    tracing::info!(cgroup = backend.cgroup_version(), data_dir = %args.data_dir.display(), "native backend ready");
    let listen = match args.socket {
        Some(path) => ListenAddr::Unix(path),
        None => ListenAddr::Tcp(args.listen),
    };
    for entry in &args.egress_resolve {
        corral_egress::parse_override(entry)?;
    }
    let egress = corral_server::EgressSettings { resolve: args.egress_resolve, extra_roots: args.egress_trust };
    let config = ServerConfig {
        listen: listen.clone(),
        data_dir: args.data_dir,
        api_key: args.api_key,
        egress,
        pools: args.pools,
        destroy_on_exit: args.kill_sandboxes_on_exit,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async move {
        let server = corral_server::bind(config, Arc::new(backend)).await?;
        match (&listen, server.local_addr()) {
            (_, Some(addr)) => eprintln!("corral: listening on http://{addr}"),
            (ListenAddr::Unix(path), None) => eprintln!("corral: listening on unix:{}", path.display()),
            _ => {}
        }
        server.run_until(shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(0)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("corral: shutting down");
}

/// Each sandbox holds a connection and a pidfd in the daemon; the default 1024 is too few.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let current = getrlimit(Resource::Nofile);
    if let Some(max) = current.maximum {
        let _ = setrlimit(Resource::Nofile, Rlimit { current: Some(max), maximum: Some(max) });
    }
}
