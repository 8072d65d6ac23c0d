//! `corral exec`: runs a command and relays its output as it arrives.

use std::io::{BufRead, BufReader, Read, Write};

use anyhow::{Context, Result};
use clap::Args;
use super::types::OutputEvent;
use corral_spec::parse_duration;
use reqwest::Method;
use serde_json::json;

use super::http::{segment, Api, Conn};
use super::parse_pair;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral exec 3k9x2m7q8w1e5r4t6y0u -- ls -la /\n  \
                        corral exec -e DEBUG=1 -w /home/user --timeout 30s ID -- python3 main.py\n  \
                        echo hi | corral exec -i ID -- cat\n  \
                        corral exec -d ID -- python3 -m http.server")]
pub struct ExecArgs {
    /// Environment variable for the command (repeatable)
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// Working directory inside the sandbox
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    workdir: Option<String>,
    /// Run as this user: user (default), root, or a numeric uid
    #[arg(short = 'u', long, value_name = "USER")]
    user: Option<String>,
    /// Kill the command after this long, e.g. 30s or 5m
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_secs)]
    timeout: Option<f64>,
    /// Forward this terminal's stdin to the command (UTF-8 text)
    #[arg(short = 'i', long)]
    interactive: bool,
    /// Run in the background and print its pid
    #[arg(short = 'd', long)]
    detach: bool,
    /// Sandbox id
    #[arg(value_name = "ID")]
    id: String,
    /// The command and its arguments (put `--` before it)
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<String>,
    #[command(flatten)]
    conn: Conn,
}

fn parse_duration_secs(s: &str) -> Result<f64, String> {
    parse_duration(s).map(|d| d.as_secs_f64()).map_err(|e| e.to_string())
}

pub fn run(args: ExecArgs) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    let mut body = json!({
        "argv": args.command,
        "env": args.env.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        "background": args.detach,
    });
    if let Some(cwd) = &args.workdir {
        body["cwd"] = json!(cwd);
    }
    if let Some(user) = &args.user {
        body["user"] = json!(user);
    }
    if let Some(timeout) = args.timeout {
        body["timeout"] = json!(timeout);
    }
    let sandbox = segment(&args.id);
    let path = format!("/v1/sandboxes/{sandbox}/exec");
    if args.detach {
        if args.interactive {
            // Background stdin has to be given up front: read it all now.
            let mut input = String::new();
            std::io::stdin().read_to_string(&mut input).context("reading stdin (must be UTF-8)")?;
            body["stdin"] = json!(input);
        }
        let started: serde_json::Value = api.json(api.request(Method::POST, &path).query(&[("wait", "true")]).json(&body))?;
        println!("{}", started["pid"]);
        return Ok(0);
    }
    if args.interactive {
        body["stdin"] = json!(true);
    }
    let response = api.send(api.request(Method::POST, &path).json(&body))?;
    let mut lines = BufReader::new(response);
    let mut line = String::new();
    let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr());
    loop {
        line.clear();
        if lines.read_line(&mut line).context("reading the command's output")? == 0 {
            anyhow::bail!("the connection closed before the command exited");
        }
        let event: OutputEvent = serde_json::from_str(&line).with_context(|| format!("unexpected output line {line:?}"))?;
        match event {
            OutputEvent::Start { pid } => {
                if args.interactive {
                    forward_stdin(Api::new(&args.conn)?, format!("/v1/sandboxes/{sandbox}/processes/{pid}"));
                }
            }
            OutputEvent::Stdout(chunk) => {
                if let Err(err) = stdout.write_all(&chunk.bytes()).and_then(|_| stdout.flush()) {
                    // Like a local process on SIGPIPE: returning hangs up, which ends the command.
                    if err.kind() == std::io::ErrorKind::BrokenPipe {
                        return Ok(128 + 13);
                    }
                    return Err(err).context("writing stdout");
                }
            }
            OutputEvent::Stderr(chunk) => {
                let _ = stderr.write_all(&chunk.bytes());
            }
            OutputEvent::Exit { exit_code, signal, reason } => {
                if let Some(reason) = reason {
                    eprintln!("corral: command ended: {reason}");
                }
                return Ok(match (exit_code, signal) {
                    (Some(code), _) => code,
                    (None, Some(signal)) => 128 + signal,
                    (None, None) => 1,
                });
            }
            OutputEvent::Error { message, .. } => anyhow::bail!("{message}"),
        }
    }
}

/// Copies local stdin to the process from a thread, then closes its stdin at EOF.
fn forward_stdin(api: Api, process: String) {
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            carry.extend_from_slice(&buf[..n]);
            // Only whole UTF-8 characters go out; an incomplete one waits for the next read.
            let valid = match std::str::from_utf8(&carry) {
                Ok(_) => carry.len(),
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                Err(_) => carry.len(),
            };
            let data = String::from_utf8_lossy(&carry[..valid]).into_owned();
            carry.drain(..valid);
            if api.send(api.request(Method::POST, &format!("{process}/stdin")).json(&json!({ "data": data }))).is_err() {
                return;
            }
        }
        if !carry.is_empty() {
            let data = String::from_utf8_lossy(&carry).into_owned();
            let _ = api.send(api.request(Method::POST, &format!("{process}/stdin")).json(&json!({ "data": data })));
        }
        let _ = api.send(api.request(Method::POST, &format!("{process}/stdin/close")));
    });
}
