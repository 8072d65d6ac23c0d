//! What happens inside an allowed CONNECT or SOCKS5 tunnel: the ClientHello's server name
//! must match the requested name; traffic to hosts with brokered secrets is terminated,
//! rewritten and re-encrypted; everything else passes through untouched (TLS) or scanned for
//! misplaced placeholders (anything that is not TLS).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::http::{deny, read_head, refusal_response, Body, Head};
use crate::io::{copy, copy_exact, Prefixed, RelayError};
use crate::policy::Refusal;
use crate::secrets::Scanner;
use crate::sni::{self, Hello};
use crate::{AuditEntry, Host, Opened, SandboxEgress};

const MAX_CHUNK_LINE: u64 = 4096;

/// The first client bytes: a complete ClientHello, or whatever arrived if it is not TLS.
async fn first_bytes<R: AsyncRead + Unpin>(client: &mut BufReader<R>) -> Result<(Vec<u8>, Hello), ()> {
    let mut buf = Vec::new();
    loop {
        let chunk = client.fill_buf().await.map_err(|_| ())?;
        if chunk.is_empty() {
            return Ok((buf, Hello::NotTls));
        }
        let n = chunk.len();
        buf.extend_from_slice(chunk);
        client.consume(n);
        match sni::parse(&buf) {
            Hello::Incomplete if buf.len() < sni::MAX_HELLO => continue,
            Hello::Incomplete => return Ok((buf, Hello::Malformed)),
            other => return Ok((buf, other)),
        }
    }
}

/// The name check: a tunnel to a name must carry that name in SNI; one to an address may
/// carry anything (the address was what the policy judged).
fn check_sni(host: &Host, sni: Option<&str>) -> Result<(), Refusal> {
    let Host::Name(name) = host else { return Ok(()) };
    match sni {
        Some(s) if s.eq_ignore_ascii_case(name) => Ok(()),
        Some(s) => Err(Refusal::new("sni_mismatch", None, format!("TLS server name {s} does not match the tunnel's {name}"))),
        None => Err(Refusal::new("sni_mismatch", None, format!("TLS without a server name in a tunnel to {name}"))),
    }
}

pub async fn run<S>(ctx: &Arc<SandboxEgress>, client: BufReader<S>, opened: Opened, host: Host, port: u16, mut entry: AuditEntry, started: Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    entry.address = Some(opened.addr.to_string());
    entry.rule = Some(opened.rule.clone());
    let name = host.to_string();
    // With secrets in the sandbox every TLS tunnel is terminated: a placeholder could
    // otherwise leave, unseen, inside TLS to any allowed host.
    if !ctx.secrets().is_empty() {
        return brokered_tunnel(ctx, client, opened, host, port, entry, started).await;
    }
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let (mut ur, mut uw) = opened.stream.into_split();
    let (mut cr, mut cw) = tokio::io::split(client);
    let upload = async {
        let mut cr = BufReader::new(&mut cr);
        let (hello, kind) = first_bytes(&mut cr).await.map_err(|_| None)?;
        let scanner = match kind {
            Hello::Tls(sni) => {
                entry.sni = sni.clone();
                check_sni(&host, sni.as_deref()).map_err(Some)?;
                None
            }
            Hello::Malformed => return Err(Some(Refusal::new("sni_mismatch", None, "malformed TLS ClientHello"))),
            _ => {
                let mut scanner = ctx.secrets().scanner(&name, port);
                scan(&mut scanner, &hello).map_err(Some)?;
                scanner
            }
        };
        uw.write_all(&hello).await.map_err(|_| None)?;
        up.fetch_add(hello.len() as u64, Ordering::Relaxed);
        copy(&mut cr, &mut uw, &up, scanner).await.map_err(relay_refusal)
    };
    let download = copy(&mut ur, &mut cw, &down, None);
    let result = join(upload, async { download.await.map_err(relay_refusal) }).await;
    entry.bytes_up = up.load(Ordering::Relaxed);
    entry.bytes_down = down.load(Ordering::Relaxed);
    finish(ctx, entry, result, started);
}

fn scan(scanner: &mut Option<Scanner>, bytes: &[u8]) -> Result<(), Refusal> {
    match scanner.as_mut().map(|s| s.check(bytes)) {
        Some(Err(ex)) => Err(exfiltration(&ex.secret)),
        _ => Ok(()),
    }
}

fn exfiltration(secret: &str) -> Refusal {
    Refusal::new("exfiltration", Some(secret.to_string()), format!("the placeholder of secret {secret} may not be sent to this host"))
}

fn relay_refusal(err: RelayError) -> Option<Refusal> {
    match err {
        RelayError::Io => None,
        RelayError::Exfiltration(ex) => Some(exfiltration(&ex.secret)),
    }
}

/// Runs both directions; the first refusal (or I/O error) ends both.
async fn join<A, B>(a: A, b: B) -> Result<(), Option<Refusal>>
where
    A: std::future::Future<Output = Result<(), Option<Refusal>>>,
    B: std::future::Future<Output = Result<(), Option<Refusal>>>,
{
    tokio::try_join!(a, b).map(|_| ())
}

fn finish(ctx: &SandboxEgress, mut entry: AuditEntry, result: Result<(), Option<Refusal>>, started: Instant) {
    match result {
        Err(Some(refusal)) => {
            if refusal.reason == "exfiltration" {
                entry.exfiltration_of = refusal.rule.clone();
            }
            deny(ctx, entry, &refusal, started);
        }
        _ => {
            entry.decision = "allow".into();
            entry.reason = "allowed".into();
            entry.duration_ms = started.elapsed().as_millis() as u64;
            ctx.record(entry);
        }
    }
}

/// A tunnel to a host some secret is bound to: terminate TLS with a corral certificate,
/// open verified TLS to the real host, and rewrite each request head on the way.
async fn brokered_tunnel<S>(ctx: &Arc<SandboxEgress>, mut client: BufReader<S>, opened: Opened, host: Host, port: u16, mut entry: AuditEntry, started: Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let name = host.to_string();
    let Ok((hello, kind)) = first_bytes(&mut client).await else { return };
    match kind {
        Hello::Tls(sni) => {
            entry.sni = sni.clone();
            if let Err(refusal) = check_sni(&host, sni.as_deref()) {
                return deny(ctx, entry, &refusal, started);
            }
        }
        Hello::Malformed => return deny(ctx, entry, &Refusal::new("sni_mismatch", None, "malformed TLS ClientHello"), started),
        _ => {
            // Not TLS: nothing to terminate; relay it, refusing any foreign placeholder.
            let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
            let mut scanner = ctx.secrets().scanner(&name, port);
            if let Err(refusal) = scan(&mut scanner, &hello) {
                return deny(ctx, entry, &refusal, started);
            }
            let (mut ur, mut uw) = opened.stream.into_split();
            let (mut cr, mut cw) = tokio::io::split(client);
            let upload = async {
                uw.write_all(&hello).await.map_err(|_| None)?;
                copy(&mut cr, &mut uw, &up, scanner).await.map_err(relay_refusal)
            };
            let download = async { copy(&mut ur, &mut cw, &down, None).await.map_err(relay_refusal) };
            let result = join(upload, download).await;
            entry.bytes_up = up.load(Ordering::Relaxed);
            entry.bytes_down = down.load(Ordering::Relaxed);
            return finish(ctx, entry, result, started);
        }
    }
    let config = match ctx.tls().server_config(&name) {
        Ok(config) => config,
        Err(err) => return deny(ctx, entry, &Refusal::new("tls_error", None, err.to_string()), started),
    };
    let mut client_tls = match TlsAcceptor::from(config).accept(Prefixed::new(hello, client)).await {
        Ok(tls) => tls,
        Err(err) => return deny(ctx, entry, &Refusal::new("client_tls_failed", None, format!("sandbox TLS handshake: {err}")), started),
    };
    let Ok(server_name) = ServerName::try_from(name.clone()) else { return };
    let upstream = match TlsConnector::from(ctx.tls().upstream.clone()).connect(server_name, opened.stream).await {
        Ok(tls) => tls,
        Err(err) => {
            let refusal = Refusal::new("upstream_tls_failed", None, format!("TLS to {name}: {err}"));
            let _ = client_tls.write_all(&refusal_response(&refusal)).await;
            let _ = client_tls.shutdown().await;
            return deny(ctx, entry, &refusal, started);
        }
    };
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let (cr, mut cw) = tokio::io::split(client_tls);
    let mut cr = BufReader::new(cr);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let result = {
        let upload = requests(ctx, &mut cr, &mut uw, &host, port, &up);
        let download = async { copy(&mut ur, &mut cw, &down, None).await.map_err(relay_refusal) };
        join(upload, download).await
    };
    if let Err(Some(refusal)) = &result {
        // The sandbox sees why, over the TLS it thinks it has with the host.
        let _ = cw.write_all(&refusal_response(refusal)).await;
        let _ = cw.shutdown().await;
    }
    entry.bytes_up = up.load(Ordering::Relaxed);
    entry.bytes_down = down.load(Ordering::Relaxed);
    finish(ctx, entry, result, started);
}

/// Relays requests one by one: each head is checked, rewritten and audited, each body is
/// framed (length or chunked) and scanned.
async fn requests<R, W>(ctx: &SandboxEgress, cr: &mut BufReader<R>, uw: &mut W, host: &Host, port: u16, up: &AtomicU64) -> Result<(), Option<Refusal>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let name = host.to_string();
    let mut scanner = ctx.secrets().scanner(&name, port);
    loop {
        let started = Instant::now();
        let head = match read_head(cr).await {
            Ok(Some(head)) => head,
            Ok(None) => {
                let _ = uw.shutdown().await;
                return Ok(());
            }
            Err(_) => return Err(Some(Refusal::new("bad_request", None, "unreadable request head"))),
        };
        let req = Head::parse(&head).map_err(|_| Some(Refusal::new("bad_request", None, "malformed request")))?;
        let mut entry = ctx.entry("https", host, port);
        entry.method = Some(req.method.clone());
        entry.host = Some(name.clone());
        entry.set_path(&req.target);
        let body = req.body().map_err(|_| Some(Refusal::new("bad_request", None, "ambiguous request body framing")))?;
        let (head, injected) = match ctx.secrets().rewrite_head(&head, &name, port) {
            Ok(rewritten) => rewritten,
            Err(ex) => {
                entry.exfiltration_of = Some(ex.secret.clone());
                let refusal = exfiltration(&ex.secret);
                deny(ctx, entry, &refusal, started);
                return Err(Some(refusal));
            }
        };
        entry.secrets = injected;
        uw.write_all(&head).await.map_err(|_| None)?;
        let before = up.fetch_add(head.len() as u64, Ordering::Relaxed);
        match body {
            Body::Length(len) => copy_exact(cr, uw, len, up, &mut scanner).await.map_err(relay_refusal)?,
            Body::Chunked => copy_chunked(cr, uw, up, &mut scanner).await?,
            Body::Raw => {
                copy(cr, uw, up, scanner).await.map_err(relay_refusal)?;
                record_request(ctx, entry, up.load(Ordering::Relaxed) - before, started);
                return Ok(());
            }
        }
        record_request(ctx, entry, up.load(Ordering::Relaxed) - before, started);
    }
}

fn record_request(ctx: &SandboxEgress, mut entry: AuditEntry, bytes_up: u64, started: Instant) {
    entry.decision = "allow".into();
    entry.reason = "allowed".into();
    entry.bytes_up = bytes_up;
    entry.duration_ms = started.elapsed().as_millis() as u64;
    ctx.record(entry);
}

async fn copy_chunked<R, W>(cr: &mut BufReader<R>, uw: &mut W, up: &AtomicU64, scanner: &mut Option<Scanner>) -> Result<(), Option<Refusal>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let bad = || Some(Refusal::new("bad_request", None, "malformed chunked body"));
    loop {
        let mut line = Vec::new();
        (&mut *cr).take(MAX_CHUNK_LINE).read_until(b'\n', &mut line).await.map_err(|_| None)?;
        if !line.ends_with(b"\n") {
            return Err(bad());
        }
        let text = std::str::from_utf8(&line).map_err(|_| bad())?;
        let size = text.split(';').next().map(str::trim).and_then(|s| u64::from_str_radix(s, 16).ok()).ok_or_else(bad)?;
        uw.write_all(&line).await.map_err(|_| None)?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                let mut trailer = Vec::new();
                (&mut *cr).take(MAX_CHUNK_LINE).read_until(b'\n', &mut trailer).await.map_err(|_| None)?;
                if !trailer.ends_with(b"\n") {
                    return Err(bad());
                }
                scan(scanner, &trailer).map_err(Some)?;
                uw.write_all(&trailer).await.map_err(|_| None)?;
                if trailer == b"\r\n" || trailer == b"\n" {
                    return Ok(());
                }
            }
        }
        copy_exact(cr, uw, size.saturating_add(2), up, scanner).await.map_err(relay_refusal)?;
    }
}
