//! The API's JSON shapes as the CLI reads them. Kept here rather than imported from
//! corral-server so the client verbs do not depend on the daemon's internals.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub template: String,
    pub state: String,
    #[serde(default)]
    pub limits: serde_json::Value,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
    pub expires_at: String,
    #[serde(default)]
    pub timeout: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
}

/// Output as text, or base64 when it was not valid UTF-8.
#[derive(Debug, Clone, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub data: Option<String>,
    #[serde(default)]
    pub data_b64: Option<String>,
}

impl Chunk {
    pub fn bytes(&self) -> Vec<u8> {
        match (&self.data, &self.data_b64) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }
}

/// One NDJSON line of an exec stream.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputEvent {
    Start { pid: u32 },
    Stdout(Chunk),
    Stderr(Chunk),
    Exit { exit_code: Option<i32>, signal: Option<i32>, reason: Option<String> },
    Error { message: String },
}
