//! Splices a mux stream and a byte stream together: raw DATA on channel 0 one way, reads
//! the other, END as half-close. Used by both ends of egress relays.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::messages::CHANNEL_STDIN;
use crate::mux::{Message, Stream};

/// Bytes moved by [`splice`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Spliced {
    /// From `io` into the stream.
    pub sent: u64,
    /// From the stream into `io`.
    pub received: u64,
}

/// Copies until both directions ended or either broke. A reset or lost connection ends
/// both directions at once (dropping the stream resets it, so the peer stops too).
pub async fn splice<T>(stream: Stream, io: T) -> Spliced
where
    T: AsyncRead + AsyncWrite + Send,
{
    let (mut tx, mut rx) = stream.split();
    let (mut reader, mut writer) = tokio::io::split(io);
    let upload = async {
        let mut buf = vec![0u8; 32 * 1024];
        let mut sent = 0u64;
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => {
                    let ok = tx.end().is_ok();
                    return (sent, ok);
                }
                Ok(n) => {
                    if tx.send_data(CHANNEL_STDIN, &buf[..n]).await.is_err() {
                        return (sent, false);
                    }
                    sent += n as u64;
                }
                Err(_) => return (sent, false),
            }
        }
    };
    let download = async {
        let mut received = 0u64;
        loop {
            match rx.recv().await {
                None => {
                    let _ = writer.shutdown().await;
                    return (received, true);
                }
                Some(Ok(Message::Data { bytes, .. })) => {
                    if writer.write_all(&bytes).await.is_err() {
                        return (received, false);
                    }
                    received += bytes.len() as u64;
                }
                // Events are not part of a raw relay; the peer is misbehaving.
                Some(Ok(Message::Event(_))) | Some(Err(_)) => return (received, false),
            }
        }
    };
    // Whichever direction breaks first ends the relay; a clean END waits for the other side.
    let (sent, received, broken) = {
        tokio::pin!(upload, download);
        let (mut up, mut down): (Option<u64>, Option<u64>) = (None, None);
        let mut broken = false;
        while !broken && (up.is_none() || down.is_none()) {
            tokio::select! {
                (n, ok) = &mut upload, if up.is_none() => { up = Some(n); broken = !ok; }
                (n, ok) = &mut download, if down.is_none() => { down = Some(n); broken = !ok; }
            }
        }
        (up.unwrap_or(0), down.unwrap_or(0), broken)
    };
    if broken {
        tx.reset();
    }
    Spliced { sent, received }
}
