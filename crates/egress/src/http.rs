//! HTTP side of the proxy: request heads, `CONNECT`, and plain-HTTP forwarding (one request
//! per connection, `Connection: close`, so every request is checked and audited).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::io::{copy, RelayError};
use crate::policy::Refusal;
use crate::{tunnel, AuditEntry, Host, SandboxEgress};

/// Largest request head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
/// Headers that describe the hop to the proxy, not the request.
const HOP_BY_HOP: [&str; 7] = ["connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "te", "upgrade"];

#[derive(Debug)]
pub enum HeadError {
    TooLarge,
    Malformed,
    Io,
}

/// Reads up to and including the blank line; `Ok(None)` on a clean EOF before any byte.
pub async fn read_head<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, HeadError> {
    let mut head = Vec::with_capacity(1024);
    loop {
        let budget = (MAX_HEAD - head.len()) as u64;
        if budget == 0 {
            return Err(HeadError::TooLarge);
        }
        let before = head.len();
        let n = (&mut *r).take(budget).read_until(b'\n', &mut head).await.map_err(|_| HeadError::Io)?;
        if n == 0 {
            return if head.is_empty() { Ok(None) } else { Err(HeadError::Malformed) };
        }
        if !head.ends_with(b"\n") {
            return Err(HeadError::TooLarge);
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            // Tolerate stray blank lines before a request (RFC 9112 §2.2).
            if before == 0 {
                head.clear();
                continue;
            }
            return Ok(Some(head));
        }
    }
}

/// A parsed request head.
pub struct Head {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    pub fn parse(bytes: &[u8]) -> Result<Head, HeadError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(bytes) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(HeadError::Malformed),
        }
        Ok(Head {
            method: req.method.ok_or(HeadError::Malformed)?.to_string(),
            target: req.path.ok_or(HeadError::Malformed)?.to_string(),
            headers: req.headers.iter().map(|h| (h.name.to_string(), h.value.to_vec())).collect(),
        })
    }

    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).any(|(_, v)| {
            String::from_utf8_lossy(v).split(',').any(|t| t.trim().eq_ignore_ascii_case(token))
        })
    }

    /// How the body is framed, for relaying exactly one request at a time.
    pub fn body(&self) -> Result<Body, HeadError> {
        let lengths: Vec<&[u8]> = self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.as_slice()).collect();
        let chunked = self.has_token("transfer-encoding", "chunked");
        if chunked && !lengths.is_empty() {
            return Err(HeadError::Malformed);
        }
        if chunked {
            return Ok(Body::Chunked);
        }
        if self.header("transfer-encoding").is_some() {
            return Err(HeadError::Malformed);
        }
        match lengths.as_slice() {
            [] if self.has_token("connection", "upgrade") => Ok(Body::Raw),
            [] => Ok(Body::Length(0)),
            [len] => std::str::from_utf8(len).ok().and_then(|s| s.trim().parse().ok()).map(Body::Length).ok_or(HeadError::Malformed),
            _ => Err(HeadError::Malformed),
        }
    }
}

pub enum Body {
    Length(u64),
    Chunked,
    /// An upgrade: everything after the head is opaque.
    Raw,
}

/// Splits `host:port` / `[v6]:port` / `host` (then `default_port`).
pub fn authority(s: &str, default_port: Option<u16>) -> Option<(Host, u16)> {
    if s.contains('@') {
        return None;
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        match after.strip_prefix(':') {
            Some(p) => (h, p.parse().ok()?),
            None if after.is_empty() => (h, default_port?),
            None => return None,
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, p.parse().ok()?),
            Some(_) => return None,
            None => (s, default_port?),
        }
    };
    if port == 0 {
        return None;
    }
    Some((Host::parse(host)?, port))
}

pub fn status_for(reason: &str) -> (u16, &'static str) {
    match reason {
        "resolve_failed" | "connect_failed" | "upstream_tls_failed" => (502, "Bad Gateway"),
        "bad_request" => (400, "Bad Request"),
        _ => (403, "Forbidden"),
    }
}

/// A plain-text refusal naming the reason and the deciding rule.
pub fn refusal_response(refusal: &Refusal) -> Vec<u8> {
    let (code, text) = status_for(refusal.reason);
    let rule = refusal.rule.as_deref().map(|r| format!(" (rule: {r})")).unwrap_or_default();
    let body = format!("corral egress: {}: {}{rule}\n", refusal.reason, refusal.message);
    format!(
        "HTTP/1.1 {code} {text}\r\nContent-Type: text/plain; charset=utf-8\r\nX-Corral-Egress: {}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        refusal.reason,
        body.len()
    )
    .into_bytes()
}

/// Fills in and stores an audit record for a refusal.
pub fn deny(ctx: &SandboxEgress, mut entry: AuditEntry, refusal: &Refusal, started: Instant) {
    entry.decision = "deny".into();
    entry.reason = refusal.reason.into();
    entry.rule = refusal.rule.clone();
    entry.duration_ms = started.elapsed().as_millis() as u64;
    ctx.record(entry);
}

async fn refuse<W: AsyncWrite + Unpin>(ctx: &SandboxEgress, client: &mut W, entry: AuditEntry, refusal: Refusal, started: Instant) {
    let _ = client.write_all(&refusal_response(&refusal)).await;
    let _ = client.shutdown().await;
    deny(ctx, entry, &refusal, started);
}

pub async fn serve<S>(ctx: &Arc<SandboxEgress>, mut client: BufReader<S>, started: Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let unknown = Host::Name("-".into());
    let bad = |m: &str| Refusal::new("bad_request", None, m.to_string());
    let head = match read_head(&mut client).await {
        Ok(Some(head)) => head,
        Ok(None) | Err(HeadError::Io) => return,
        Err(_) => return refuse(ctx, &mut client, ctx.entry("http", &unknown, 0), bad("unreadable request head"), started).await,
    };
    let Ok(req) = Head::parse(&head) else {
        return refuse(ctx, &mut client, ctx.entry("http", &unknown, 0), bad("malformed request"), started).await;
    };
    if req.method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = authority(&req.target, None) else {
            return refuse(ctx, &mut client, ctx.entry("connect", &unknown, 0), bad("CONNECT needs host:port"), started).await;
        };
        let mut entry = ctx.entry("connect", &host, port);
        entry.method = Some(req.method.clone());
        match ctx.open(&host, port).await {
            Err(refusal) => refuse(ctx, &mut client, entry, refusal, started).await,
            Ok(opened) => {
                if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err() {
                    return;
                }
                tunnel::run(ctx, client, opened, host, port, entry, started).await;
            }
        }
        return;
    }
    forward(ctx, client, req, started).await;
}

/// Plain HTTP: `GET http://host/path`. Rewritten to origin form with `Connection: close`.
async fn forward<S>(ctx: &Arc<SandboxEgress>, mut client: BufReader<S>, req: Head, started: Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let unknown = Host::Name("-".into());
    let lower = req.target.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("http://").map(|_| &req.target[7..]) else {
        let message = if lower.starts_with("https://") {
            "https URLs go through CONNECT (set HTTPS_PROXY)"
        } else {
            "this is corral's egress proxy: send absolute http:// URLs or CONNECT"
        };
        return refuse(ctx, &mut client, ctx.entry("http", &unknown, 0), Refusal::new("bad_request", None, message), started).await;
    };
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(split);
    let path = if path.is_empty() || path.starts_with('#') { "/".to_string() } else if path.starts_with('?') { format!("/{path}") } else { path.to_string() };
    let Some((host, port)) = authority(auth, Some(80)) else {
        return refuse(ctx, &mut client, ctx.entry("http", &unknown, 0), Refusal::new("bad_request", None, "bad host in URL"), started).await;
    };
    let mut entry = ctx.entry("http", &host, port);
    entry.method = Some(req.method.clone());
    entry.host = Some(host.to_string());
    entry.set_path(&path);

    let mut out = format!("{} {} HTTP/1.1\r\n", req.method, path).into_bytes();
    let mut has_host = false;
    for (name, value) in &req.headers {
        let lname = name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lname.as_str()) {
            continue;
        }
        has_host |= lname == "host";
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !has_host {
        out.extend_from_slice(format!("Host: {auth}\r\n").as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");

    let name = host.to_string();
    let (out, injected) = match ctx.secrets().rewrite_head(&out, &name, port) {
        Ok(rewritten) => rewritten,
        Err(ex) => {
            entry.exfiltration_of = Some(ex.secret.clone());
            let refusal = Refusal::new("exfiltration", None, format!("the placeholder of secret {} may not be sent to {name}", ex.secret));
            return refuse(ctx, &mut client, entry, refusal, started).await;
        }
    };
    entry.secrets = injected;
    let opened = match ctx.open(&host, port).await {
        Ok(opened) => opened,
        Err(refusal) => return refuse(ctx, &mut client, entry, refusal, started).await,
    };
    entry.address = Some(opened.addr.to_string());
    entry.rule = Some(opened.rule.clone());
    let (mut ur, mut uw) = opened.stream.into_split();
    if uw.write_all(&out).await.is_err() {
        return deny(ctx, entry, &Refusal::new("connect_failed", None, "upstream closed"), started);
    }
    let (up, down) = (AtomicU64::new(out.len() as u64), AtomicU64::new(0));
    let (mut cr, mut cw) = tokio::io::split(client);
    let scanner = ctx.secrets().scanner(&name, port);
    let exfil = {
        let upload = copy(&mut cr, &mut uw, &up, scanner);
        let download = copy(&mut ur, &mut cw, &down, None);
        tokio::pin!(upload, download);
        let mut upload_done = false;
        loop {
            tokio::select! {
                r = &mut upload, if !upload_done => match r {
                    Err(RelayError::Exfiltration(ex)) => break Some(ex),
                    _ => upload_done = true,
                },
                // The upstream closes after its one response; that ends the exchange.
                _ = &mut download => break None,
            }
        }
    };
    entry.bytes_up = up.load(Ordering::Relaxed);
    entry.bytes_down = down.load(Ordering::Relaxed);
    match exfil {
        Some(ex) => {
            entry.exfiltration_of = Some(ex.secret.clone());
            deny(ctx, entry, &Refusal::new("exfiltration", None, format!("placeholder of {} in the body", ex.secret)), started);
        }
        None => {
            let _ = cw.shutdown().await;
            entry.decision = "allow".into();
            entry.reason = "allowed".into();
            entry.duration_ms = started.elapsed().as_millis() as u64;
            ctx.record(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_parse_strictly() {
        assert_eq!(authority("example.com:443", None), Some((Host::Name("example.com".into()), 443)));
        assert_eq!(authority("[::1]:80", None), Some((Host::Ip("::1".parse().unwrap()), 80)));
        assert_eq!(authority("Example.COM", Some(80)), Some((Host::Name("example.com".into()), 80)));
        assert_eq!(authority("example.com", None), None);
        assert_eq!(authority("user@example.com:80", None), None);
        assert_eq!(authority("example.com:0", None), None);
        assert_eq!(authority("::1:80", None), None);
    }

    #[test]
    fn bodies_are_framed_or_refused() {
        let head = |h: &str| Head::parse(format!("POST / HTTP/1.1\r\n{h}\r\n").as_bytes()).unwrap();
        assert!(matches!(head("Content-Length: 5\r\n").body(), Ok(Body::Length(5))));
        assert!(matches!(head("Transfer-Encoding: chunked\r\n").body(), Ok(Body::Chunked)));
        assert!(head("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n").body().is_err());
        assert!(head("Content-Length: 5\r\nContent-Length: 6\r\n").body().is_err());
        assert!(head("Transfer-Encoding: gzip\r\n").body().is_err());
    }

    #[tokio::test]
    async fn heads_are_bounded() {
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        let mut r = BufReader::new(huge.as_bytes());
        assert!(matches!(read_head(&mut r).await, Err(HeadError::TooLarge)));
        let mut r = BufReader::new(&b"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\nBODY"[..]);
        assert_eq!(read_head(&mut r).await.unwrap().unwrap(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    }
}
