//! API keys: generated once, stored as SHA-256 hashes, checked on every request but health.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::db::{Db, DbError};
use crate::error::ApiError;

const KEY_PREFIX: &str = "crl_";

/// The hashes of every key the daemon accepts.
pub struct ApiKeys {
    hashes: Vec<[u8; 32]>,
}

impl ApiKeys {
    /// Accepts `configured` if given; otherwise the keys in the database, generating (and
    /// returning, so it can be shown once) a new one when there is none.
    pub async fn load(db: &Db, configured: Option<&str>) -> Result<(ApiKeys, Option<String>), DbError> {
        if let Some(key) = configured {
            return Ok((ApiKeys { hashes: vec![sha256(key.as_bytes())] }, None));
        }
        let stored: Vec<[u8; 32]> = db.api_key_hashes().await?.iter().filter_map(|h| decode_hex(h)).collect();
        if !stored.is_empty() {
            return Ok((ApiKeys { hashes: stored }, None));
        }
        let key = generate_key();
        let hash = sha256(key.as_bytes());
        db.add_api_key_hash(encode_hex(&hash), crate::time::now_ms()).await?;
        Ok((ApiKeys { hashes: vec![hash] }, Some(key)))
    }

    /// Compares hashes in constant time, so response timing says nothing about the key.
    pub fn accepts(&self, presented: &str) -> bool {
        let candidate = sha256(presented.as_bytes());
        let mut accepted = false;
        for hash in &self.hashes {
            let diff = hash.iter().zip(candidate.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            accepted |= diff == 0;
        }
        accepted
    }
}

pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{KEY_PREFIX}{}", encode_hex(&bytes))
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The key from `Authorization: Bearer <key>` or `X-API-Key: <key>`.
fn presented_key(request: &Request) -> Option<&str> {
    let headers = request.headers();
    if let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let (scheme, key) = value.trim().split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then_some(key.trim());
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim)
}

pub async fn require_key(State(keys): State<std::sync::Arc<ApiKeys>>, request: Request, next: Next) -> Response {
    match presented_key(&request) {
        Some(key) if keys.accepts(key) => next.run(request).await,
        _ => ApiError::unauthorized().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_round_trip_through_their_hash() {
        let key = generate_key();
        assert!(key.starts_with("crl_") && key.len() == 4 + 64);
        let keys = ApiKeys { hashes: vec![decode_hex(&encode_hex(&sha256(key.as_bytes()))).expect("hex")] };
        assert!(keys.accepts(&key));
        assert!(!keys.accepts("crl_wrong"));
        assert!(!keys.accepts(""));
    }
}
