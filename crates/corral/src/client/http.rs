//! A small blocking HTTP client for the daemon's API: auth, JSON errors as messages.

use anyhow::{anyhow, Context, Result};
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::Method;
use serde::de::DeserializeOwned;

/// Connection settings shared by every verb.
#[derive(clap::Args, Debug, Clone)]
pub struct Conn {
    /// URL of the corral daemon
    #[arg(long, env = "CORRAL_URL", default_value = "http://127.0.0.1:7070", value_name = "URL")]
    pub url: String,
    /// API key printed by `corral serve` on first start
    #[arg(long, env = "CORRAL_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<String>,
}

pub struct Api {
    client: Client,
    base: String,
    key: Option<String>,
}

impl Api {
    pub fn new(conn: &Conn) -> Result<Api> {
        // No overall timeout: exec output and file transfers may legitimately take long.
        let client = Client::builder().timeout(None).build().context("building the HTTP client")?;
        Ok(Api { client, base: conn.url.trim_end_matches('/').to_string(), key: conn.api_key.clone() })
    }

    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let builder = self.client.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// Sends and returns the response if it succeeded; otherwise the API's message as the error.
    pub fn send(&self, builder: RequestBuilder) -> Result<Response> {
        let response = builder.send().map_err(|e| anyhow!("cannot reach the corral daemon at {}: {}", self.base, root_cause(&e)))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or_else(|| format!("{status}: {}", text.trim()));
        Err(anyhow!(message))
    }

    pub fn json<T: DeserializeOwned>(&self, builder: RequestBuilder) -> Result<T> {
        self.send(builder)?.json().context("reading the daemon's answer")
    }

    /// One request per id (`path` builds the path from the encoded id): prints each id that
    /// succeeded, reports each failure, and answers the exit code (1 if any failed).
    pub fn each_id(&self, ids: &[String], method: Method, path: impl Fn(&str) -> String) -> i32 {
        let mut code = 0;
        for id in ids {
            match self.send(self.request(method.clone(), &path(&segment(id)))) {
                Ok(_) => println!("{id}"),
                Err(err) => {
                    eprintln!("error: {id}: {err:#}");
                    code = 1;
                }
            }
        }
        code
    }
}

fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// Percent-encodes a path segment (sandbox ids are alphanumeric, but input is input).
pub fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
