//! The JSON flavour of the Connect protocol, as the E2B SDKs speak it to envd.
//!
//! Unary calls are plain JSON in and out (`application/json`). Streaming calls wrap each
//! message in an envelope: one flag byte (0x02 = end of stream), a big-endian u32 length and
//! the JSON payload; the response stream ends with an end-of-stream envelope carrying `{}`
//! or `{"error": {...}}` (`application/connect+json`, with no parameters: clients are strict).

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::ApiError;

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END: u8 = 0x02;
/// Largest single request message accepted (stdin chunks, paths).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";

/// A Connect error: one of the protocol's code names and a message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ConnectError { code, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }

    fn status(&self) -> StatusCode {
        match self.code {
            "canceled" => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "permission_denied" => StatusCode::FORBIDDEN,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code, "message": self.message })
    }
}

impl From<ApiError> for ConnectError {
    fn from(err: ApiError) -> Self {
        let code = match err.status.as_u16() {
            400 => "invalid_argument",
            401 => "unauthenticated",
            403 => "permission_denied",
            404 => "not_found",
            409 => "already_exists",
            501 => "unimplemented",
            // The agent connection broke: the sandbox is most likely gone.
            502 | 503 => "unavailable",
            504 => "deadline_exceeded",
            507 | 429 => "resource_exhausted",
            _ => "internal",
        };
        ConnectError::new(code, err.message)
    }
}

/// A unary error answer.
impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (self.status(), [(CONTENT_TYPE, "application/json")], self.json().to_string()).into_response()
    }
}

/// A unary success answer.
pub fn unary<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => ([(CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => ConnectError::new("internal", format!("encoding the answer: {e}")).into_response(),
    }
}

/// Parses a request message, unary (plain JSON) or enveloped (a streaming call's single
/// request message), depending on the content type.
pub fn decode<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, ConnectError> {
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let payload = if content_type.starts_with("application/connect+") {
        let mut frames = FrameReader::default();
        frames.push(body);
        match frames.next_frame()? {
            Some(Frame { end: false, payload }) => payload,
            _ => return Err(ConnectError::invalid("the request has no message envelope")),
        }
    } else {
        body.to_vec()
    };
    if content_type.contains("proto") && !content_type.contains("json") {
        return Err(ConnectError::new("unimplemented", "only the JSON codec is supported"));
    }
    let payload: &[u8] = if payload.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &payload };
    serde_json::from_slice(payload).map_err(|e| ConnectError::invalid(format!("invalid request message: {e}")))
}

pub struct Frame {
    pub end: bool,
    pub payload: Vec<u8>,
}

/// Splits a byte stream into envelopes as bytes arrive.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    pub fn next_frame(&mut self) -> Result<Option<Frame>, ConnectError> {
        let Some(header) = self.buf.get(..5) else { return Ok(None) };
        let flags = header[0];
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::new("unimplemented", "compressed messages are not supported"));
        }
        if len > MAX_MESSAGE {
            return Err(ConnectError::new("resource_exhausted", format!("message of {len} bytes is too large")));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let payload = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some(Frame { end: flags & FLAG_END != 0, payload }))
    }
}

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// One message of a response stream.
pub fn message_frame(message: &serde_json::Value) -> Bytes {
    envelope(0, message.to_string().as_bytes())
}

/// The end-of-stream envelope.
pub fn end_frame(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(err) => serde_json::json!({ "error": err.json() }),
    };
    envelope(FLAG_END, body.to_string().as_bytes())
}

/// What a streaming handler yields: messages, then at most one error, which ends the stream.
pub enum Item {
    Message(serde_json::Value),
    Error(ConnectError),
}

/// A streaming response: every item flushed as its own envelope, then the end envelope.
pub fn stream_response<S>(items: S) -> Response
where
    S: Stream<Item = Item> + Send + 'static,
{
    let frames = futures::stream::unfold((Box::pin(items), false), |(mut items, done)| async move {
        if done {
            return None;
        }
        match items.next().await {
            Some(Item::Message(m)) => Some((message_frame(&m), (items, false))),
            Some(Item::Error(e)) => Some((end_frame(Some(&e)), (items, true))),
            None => Some((end_frame(None), (items, true))),
        }
    });
    let body = Body::from_stream(frames.map(Ok::<_, Infallible>));
    ([(CONTENT_TYPE, STREAM_CONTENT_TYPE)], body).into_response()
}

/// proto3 JSON `bytes`: standard base64, padded or not (URL-safe tolerated too).
pub fn decode_bytes(text: &str) -> Result<Vec<u8>, ConnectError> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
        .ok_or_else(|| ConnectError::invalid("invalid base64 in a bytes field"))
}

pub fn encode_bytes(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// proto3 JSON integers may come as numbers or strings.
pub fn lenient_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(u32),
        Text(String),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Number(n)) => Ok(Some(n)),
        Some(Raw::Text(t)) => t.trim().parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// Milliseconds from `connect-timeout-ms`, if the client set a deadline.
pub fn timeout_ms(headers: &HeaderMap) -> Option<u64> {
    headers.get("connect-timeout-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok()).filter(|&ms| ms > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_partial_frames_wait() {
        let frame = message_frame(&serde_json::json!({"a": 1}));
        let mut reader = FrameReader::default();
        reader.push(&frame[..3]);
        assert!(reader.next_frame().expect("ok").is_none());
        reader.push(&frame[3..]);
        let got = reader.next_frame().expect("ok").expect("frame");
        assert!(!got.end);
        assert_eq!(got.payload, br#"{"a":1}"#);
        let end = end_frame(None);
        assert_eq!(end[0], FLAG_END);
    }

    #[test]
    fn oversized_and_compressed_frames_are_refused() {
        let mut reader = FrameReader::default();
        reader.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(reader.next_frame().is_err());
        let mut reader = FrameReader::default();
        reader.push(&[1, 0, 0, 0, 0]);
        assert!(reader.next_frame().is_err());
    }

    #[test]
    fn unary_and_enveloped_requests_decode() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, "application/json".parse().expect("hv"));
        let v: serde_json::Value = decode(&headers, b"").expect("empty is {}");
        assert_eq!(v, serde_json::json!({}));
        headers.insert(CONTENT_TYPE, STREAM_CONTENT_TYPE.parse().expect("hv"));
        let v: serde_json::Value = decode(&headers, &message_frame(&serde_json::json!({"x": true}))).expect("enveloped");
        assert_eq!(v, serde_json::json!({"x": true}));
        assert!(decode::<serde_json::Value>(&headers, b"\x00\x00").is_err());
    }
}
