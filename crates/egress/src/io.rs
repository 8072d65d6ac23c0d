//! Byte plumbing: a reader with bytes pushed back in front, and counted copies that can
//! scan for misplaced secret placeholders before anything is forwarded.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::secrets::{Exfiltration, Scanner};

/// `inner`, but reads return `prefix` first (bytes we had to look at before deciding).
pub struct Prefixed<T> {
    prefix: Vec<u8>,
    offset: usize,
    inner: T,
}

impl<T> Prefixed<T> {
    pub fn new(prefix: Vec<u8>, inner: T) -> Self {
        Prefixed { prefix, offset: 0, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.offset < self.prefix.len() {
            let n = (self.prefix.len() - self.offset).min(buf.remaining());
            let start = self.offset;
            buf.put_slice(&self.prefix[start..start + n]);
            self.offset += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Why a relay stopped early.
#[derive(Debug)]
pub enum RelayError {
    Io,
    Exfiltration(Exfiltration),
}

/// Copies until EOF (then half-closes `to`), counting into `counter` and refusing to forward
/// any chunk in which `scanner` finds a foreign placeholder.
pub async fn copy<R, W>(from: &mut R, to: &mut W, counter: &AtomicU64, mut scanner: Option<Scanner>) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = from.read(&mut buf).await.map_err(|_| RelayError::Io)?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        if let Some(scanner) = scanner.as_mut() {
            scanner.check(&buf[..n]).map_err(RelayError::Exfiltration)?;
        }
        to.write_all(&buf[..n]).await.map_err(|_| RelayError::Io)?;
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Copies exactly `len` bytes (a request body), scanning like [`copy`].
pub async fn copy_exact<R, W>(from: &mut R, to: &mut W, mut len: u64, counter: &AtomicU64, scanner: &mut Option<Scanner>) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; 32 * 1024];
    while len > 0 {
        let want = buf.len().min(usize::try_from(len).unwrap_or(usize::MAX));
        let n = from.read(&mut buf[..want]).await.map_err(|_| RelayError::Io)?;
        if n == 0 {
            return Err(RelayError::Io);
        }
        if let Some(scanner) = scanner.as_mut() {
            scanner.check(&buf[..n]).map_err(RelayError::Exfiltration)?;
        }
        to.write_all(&buf[..n]).await.map_err(|_| RelayError::Io)?;
        counter.fetch_add(n as u64, Ordering::Relaxed);
        len -= n as u64;
    }
    Ok(())
}
