//! `corral code`: runs code in a sandbox's stateful interpreter and relays output as it
//! arrives; the value of the last expression is printed last, errors go to stderr.

use std::io::{BufRead, BufReader, Read, Write};

use anyhow::{bail, Context, Result};
use clap::Args;
use corral_spec::parse_duration;
use reqwest::Method;
use serde_json::{json, Value};

use super::http::{segment, Api, Conn};
use super::parse_pair;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  corral code ID 'x = 1'\n  corral code ID 'x + 1'          # prints 2: state persists\n  \
                        corral code --language js ID '[1, 2].map((n) => n * 2)'\n  \
                        cat script.py | corral code ID -")]
pub struct CodeArgs {
    /// python (default) or javascript; selects that language's default context
    #[arg(short = 'l', long, value_name = "LANGUAGE", conflicts_with = "context")]
    language: Option<String>,
    /// Run in this context (see /v1/sandboxes/ID/contexts) instead of the default one
    #[arg(long, value_name = "CONTEXT")]
    context: Option<String>,
    /// Environment variable for this run only (repeatable)
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// Interrupt the code after this long (the context keeps its state), e.g. 30s
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_secs)]
    timeout: Option<f64>,
    /// Print every event as a JSON line instead of plain output
    #[arg(long)]
    json: bool,
    /// Sandbox id
    #[arg(value_name = "ID")]
    id: String,
    /// The code, or `-` to read it from stdin
    #[arg(value_name = "CODE", allow_hyphen_values = true)]
    code: String,
    #[command(flatten)]
    conn: Conn,
}

fn parse_duration_secs(s: &str) -> Result<f64, String> {
    parse_duration(s).map(|d| d.as_secs_f64()).map_err(|e| e.to_string())
}

pub fn run(args: CodeArgs) -> Result<i32> {
    let code = if args.code == "-" {
        let mut code = String::new();
        std::io::stdin().read_to_string(&mut code).context("reading code from stdin")?;
        code
    } else {
        args.code.clone()
    };
    let mut body = json!({
        "code": code,
        "env": args.env.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
    });
    if let Some(language) = &args.language {
        body["language"] = json!(language);
    }
    if let Some(context) = &args.context {
        body["context"] = json!(context);
    }
    if let Some(timeout) = args.timeout {
        body["timeout"] = json!(timeout);
    }
    let api = Api::new(&args.conn)?;
    let path = format!("/v1/sandboxes/{}/code", segment(&args.id));
    let response = api.send(api.request(Method::POST, &path).json(&body))?;
    relay(BufReader::new(response), args.json)
}

/// Prints events as they come; exit code 1 if the code raised.
fn relay(reader: impl BufRead, raw: bool) -> Result<i32> {
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut main_result = None;
    let mut failed = false;
    let mut ended = false;
    for line in reader.lines() {
        let line = line.context("reading the daemon's answer")?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Value = serde_json::from_str(&line).with_context(|| format!("unexpected line from the daemon: {line}"))?;
        if raw {
            writeln!(stdout, "{line}")?;
        }
        let text = event.get("text").and_then(Value::as_str).unwrap_or_default();
        match event.get("type").and_then(Value::as_str) {
            Some("stdout") if !raw => write!(stdout, "{text}")?,
            Some("stderr") if !raw => write!(stderr, "{text}")?,
            Some("result") if event.get("is_main_result") == Some(&Value::Bool(true)) => main_result = Some(text.to_owned()),
            Some("result") if !raw => writeln!(stdout, "{text}")?,
            Some("error") => {
                failed = true;
                if !raw {
                    let traceback = event.get("traceback").and_then(Value::as_str).unwrap_or_default();
                    write!(stderr, "{}", traceback.trim_end())?;
                    writeln!(stderr)?;
                }
            }
            Some("end_of_execution") => ended = true,
            _ => {}
        }
        stdout.flush()?;
    }
    if !ended {
        bail!("the daemon ended the answer early (was the sandbox killed?)");
    }
    if let (Some(text), false) = (main_result, raw) {
        writeln!(stdout, "{text}")?;
    }
    Ok(if failed { 1 } else { 0 })
}
