//! SOCKS5 (RFC 1928), CONNECT only, no authentication, names resolved here on the host
//! (`socks5h`). Refusals map to the protocol's reply codes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::http::deny;
use crate::policy::Refusal;
use crate::{tunnel, Host, SandboxEgress};

const REPLY_OK: u8 = 0;
const REPLY_NOT_ALLOWED: u8 = 2;
const REPLY_HOST_UNREACHABLE: u8 = 4;
const REPLY_REFUSED: u8 = 5;
const REPLY_COMMAND_UNSUPPORTED: u8 = 7;
const REPLY_ADDRESS_UNSUPPORTED: u8 = 8;

fn reply_code(reason: &str) -> u8 {
    match reason {
        "resolve_failed" => REPLY_HOST_UNREACHABLE,
        "connect_failed" => REPLY_REFUSED,
        _ => REPLY_NOT_ALLOWED,
    }
}

async fn reply<W: AsyncWrite + Unpin>(w: &mut W, code: u8) -> std::io::Result<()> {
    w.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Reads the greeting; true if "no authentication" is among the offered methods.
async fn read_greeting<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<bool> {
    let mut two = [0u8; 2];
    r.read_exact(&mut two).await?;
    let mut methods = vec![0u8; usize::from(two[1])];
    r.read_exact(&mut methods).await?;
    Ok(two[0] == 5 && methods.contains(&0))
}

pub async fn serve<S>(ctx: &Arc<SandboxEgress>, mut client: BufReader<S>, started: Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match read_greeting(&mut client).await {
        Ok(true) => {}
        Ok(false) => {
            // No acceptable method: say so and hang up.
            let _ = client.write_all(&[5, 0xff]).await;
            return;
        }
        Err(_) => return,
    }
    if client.write_all(&[5, 0]).await.is_err() {
        return;
    }
    let mut head = [0u8; 4];
    if client.read_exact(&mut head).await.is_err() || head[0] != 5 {
        return;
    }
    let host = match head[3] {
        1 => {
            let mut a = [0u8; 4];
            if client.read_exact(&mut a).await.is_err() {
                return;
            }
            Some(Host::Ip(IpAddr::V4(Ipv4Addr::from(a))))
        }
        4 => {
            let mut a = [0u8; 16];
            if client.read_exact(&mut a).await.is_err() {
                return;
            }
            Some(Host::Ip(IpAddr::V6(Ipv6Addr::from(a))))
        }
        3 => {
            let mut len = [0u8; 1];
            if client.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut name = vec![0u8; usize::from(len[0])];
            if client.read_exact(&mut name).await.is_err() {
                return;
            }
            std::str::from_utf8(&name).ok().and_then(Host::parse)
        }
        _ => None,
    };
    let mut port = [0u8; 2];
    if client.read_exact(&mut port).await.is_err() {
        return;
    }
    let port = u16::from_be_bytes(port);
    let unknown = Host::Name("-".into());
    if head[1] != 1 {
        let _ = reply(&mut client, REPLY_COMMAND_UNSUPPORTED).await;
        let refusal = Refusal::new("bad_request", None, "only SOCKS5 CONNECT is supported");
        return deny(ctx, ctx.entry("socks5", host.as_ref().unwrap_or(&unknown), port), &refusal, started);
    }
    let Some(host) = host.filter(|_| port != 0) else {
        let _ = reply(&mut client, REPLY_ADDRESS_UNSUPPORTED).await;
        return deny(ctx, ctx.entry("socks5", &unknown, port), &Refusal::new("bad_request", None, "bad address"), started);
    };
    let entry = ctx.entry("socks5", &host, port);
    match ctx.open(&host, port).await {
        Err(refusal) => {
            let _ = reply(&mut client, reply_code(refusal.reason)).await;
            deny(ctx, entry, &refusal, started);
        }
        Ok(opened) => {
            if reply(&mut client, REPLY_OK).await.is_err() {
                return;
            }
            tunnel::run(ctx, client, opened, host, port, entry, started).await;
        }
    }
}
