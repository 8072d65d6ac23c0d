//! Multiplexes many logical streams over one byte stream, with per-stream flow control.
//!
//! Frame: `len: u32 BE | stream: u32 BE | kind: u8 | payload[len]`. The peer on the other end
//! may be hostile (a compromised agent), so every frame is bounded, every stream's inbound
//! buffer is bounded by the credit we granted, and any violation closes the connection
//! instead of growing memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch, Notify};

use crate::messages::{Event, Request};

/// Largest payload of one frame. Data is chunked below this.
pub const MAX_FRAME: usize = 64 * 1024;
/// Bytes a sender may have in flight per stream before the receiver grants more.
pub const WINDOW: u32 = 512 * 1024;
/// Streams the peer may have open towards us at once.
pub const MAX_PEER_STREAMS: usize = 4096;

const KIND_OPEN: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_EVENT: u8 = 3;
const KIND_END: u8 = 4;
const KIND_RESET: u8 = 5;
const KIND_WINDOW: u8 = 6;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum MuxError {
    #[error("connection to the sandbox agent is closed")]
    Closed,
    #[error("stream was reset by the peer")]
    Reset,
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("stream already ended")]
    Ended,
}

/// Which side of the connection we are; decides stream id parity so both may open streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The daemon: opens odd stream ids.
    Host,
    /// The agent: opens even stream ids.
    Agent,
}

/// Something received on a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Event(Event),
    Data { channel: u8, bytes: Bytes },
}

struct Frame {
    stream: u32,
    kind: u8,
    payload: Bytes,
}

struct StreamSlot {
    inbound: mpsc::UnboundedSender<Result<(Message, usize), MuxError>>,
    credit: Arc<Credit>,
    /// Set when our receiver was dropped early: inbound data is discarded and credited back.
    discard: Arc<AtomicBool>,
}

/// Send credit for one stream: how many bytes we may still send.
struct Credit {
    available: Mutex<u64>,
    changed: Notify,
    reset: AtomicBool,
}

struct Shared {
    role: Role,
    next_id: AtomicU32,
    streams: Mutex<HashMap<u32, StreamSlot>>,
    writer: mpsc::UnboundedSender<Frame>,
    closed: watch::Sender<bool>,
}

impl Shared {
    fn send(&self, frame: Frame) -> Result<(), MuxError> {
        self.writer.send(frame).map_err(|_| MuxError::Closed)
    }

    fn register(&self, id: u32) -> (mpsc::UnboundedReceiver<Result<(Message, usize), MuxError>>, Arc<Credit>, Arc<AtomicBool>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let discard = Arc::new(AtomicBool::new(false));
        let credit = Arc::new(Credit {
            available: Mutex::new(u64::from(WINDOW)),
            changed: Notify::new(),
            reset: AtomicBool::new(false),
        });
        if let Ok(mut streams) = self.streams.lock() {
            streams.insert(id, StreamSlot { inbound: tx, credit: credit.clone(), discard: discard.clone() });
        }
        (rx, credit, discard)
    }

    fn forget(&self, id: u32) {
        if let Ok(mut streams) = self.streams.lock() {
            streams.remove(&id);
        }
    }

    fn fail_all(&self) {
        let _ = self.closed.send(true);
        if let Ok(mut streams) = self.streams.lock() {
            for (_, slot) in streams.drain() {
                let _ = slot.inbound.send(Err(MuxError::Closed));
                slot.credit.reset.store(true, Ordering::SeqCst);
                slot.credit.changed.notify_waiters();
            }
        }
    }
}

/// Handle to a multiplexed connection. Cheap to clone.
#[derive(Clone)]
pub struct Mux {
    shared: Arc<Shared>,
}

/// Streams the peer opens towards us, each with its opening request.
pub struct Incoming {
    rx: mpsc::Receiver<(Request, Stream)>,
}

impl Incoming {
    pub async fn accept(&mut self) -> Option<(Request, Stream)> {
        self.rx.recv().await
    }
}

impl Mux {
    /// Starts the reader and writer tasks on the current tokio runtime.
    pub fn new<T>(io: T, role: Role) -> (Mux, Incoming)
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = tokio::io::split(io);
        let (frame_tx, frame_rx) = mpsc::unbounded_channel();
        let (closed, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            role,
            next_id: AtomicU32::new(match role {
                Role::Host => 1,
                Role::Agent => 2,
            }),
            streams: Mutex::new(HashMap::new()),
            writer: frame_tx,
            closed,
        });
        let (incoming_tx, incoming_rx) = mpsc::channel(64);
        tokio::spawn(write_loop(writer, frame_rx, shared.clone()));
        tokio::spawn(read_loop(reader, shared.clone(), incoming_tx));
        (Mux { shared }, Incoming { rx: incoming_rx })
    }

    /// Opens a stream with `request` as its first message.
    pub fn open(&self, request: &Request) -> Result<Stream, MuxError> {
        if *self.shared.closed.borrow() {
            return Err(MuxError::Closed);
        }
        let id = self.shared.next_id.fetch_add(2, Ordering::Relaxed);
        let payload = serde_json::to_vec(request).map_err(|e| MuxError::Protocol(e.to_string()))?;
        if payload.len() > MAX_FRAME {
            return Err(MuxError::Protocol("request too large".into()));
        }
        let (rx, credit, discard) = self.shared.register(id);
        self.shared.send(Frame { stream: id, kind: KIND_OPEN, payload: payload.into() })?;
        Ok(Stream::new(id, self.shared.clone(), rx, credit, discard))
    }

    /// Resolves when the underlying connection is gone.
    pub async fn closed(&self) {
        let mut rx = self.shared.closed.subscribe();
        let _ = rx.wait_for(|closed| *closed).await;
    }

    pub fn is_closed(&self) -> bool {
        *self.shared.closed.borrow()
    }
}

async fn write_loop<W: AsyncWrite>(writer: W, mut frames: mpsc::UnboundedReceiver<Frame>, shared: Arc<Shared>) {
    let writer = BufWriter::with_capacity(128 * 1024, writer);
    let mut writer = std::pin::pin!(writer);
    let mut closed = shared.closed.subscribe();
    loop {
        let frame = tokio::select! {
            frame = frames.recv() => frame,
            _ = closed.wait_for(|c| *c) => None,
        };
        let Some(mut frame) = frame else { break };
        loop {
            let mut header = [0u8; 9];
            header[0..4].copy_from_slice(&(frame.payload.len() as u32).to_be_bytes());
            header[4..8].copy_from_slice(&frame.stream.to_be_bytes());
            header[8] = frame.kind;
            if writer.write_all(&header).await.is_err() || writer.write_all(&frame.payload).await.is_err() {
                shared.fail_all();
                return;
            }
            match frames.try_recv() {
                Ok(next) => frame = next,
                Err(_) => break,
            }
        }
        if writer.flush().await.is_err() {
            shared.fail_all();
            return;
        }
    }
    let _ = writer.shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(mut reader: R, shared: Arc<Shared>, incoming: mpsc::Sender<(Request, Stream)>) {
    let result = read_frames(&mut reader, &shared, &incoming).await;
    if let Err(err) = result {
        tracing::debug!(%err, "mux connection ended");
    }
    shared.fail_all();
}

async fn read_frames<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Arc<Shared>,
    incoming: &mpsc::Sender<(Request, Stream)>,
) -> Result<(), MuxError> {
    let mut header = [0u8; 9];
    loop {
        if reader.read_exact(&mut header).await.is_err() {
            return Err(MuxError::Closed);
        }
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let stream = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        let kind = header[8];
        if len > MAX_FRAME {
            return Err(MuxError::Protocol(format!("frame of {len} bytes exceeds {MAX_FRAME}")));
        }
        let mut payload = BytesMut::zeroed(len);
        if reader.read_exact(&mut payload).await.is_err() {
            return Err(MuxError::Closed);
        }
        let payload = payload.freeze();
        match kind {
            KIND_OPEN => accept_open(shared, incoming, stream, &payload).await?,
            KIND_DATA | KIND_EVENT => deliver(shared, stream, kind, payload)?,
            KIND_END => {
                let slot = shared.streams.lock().ok().and_then(|s| s.get(&stream).map(|s| s.inbound.clone()));
                if let Some(inbound) = slot {
                    // Dropping our sender clone alone would not end the channel; mark it explicitly.
                    let _ = inbound.send(Err(MuxError::Ended));
                }
            }
            KIND_RESET => { 
                let slot = shared.streams.lock().ok().and_then(|mut s| s.remove(&stream));
                if let Some(slot) = slot {
                    let _ = slot.inbound.send(Err(MuxError::Reset));
                    slot.credit.reset.store(true, Ordering::SeqCst);
                    slot.credit.changed.notify_waiters();
                }
            }
            KIND_WINDOW => {
                if payload.len() != 4 {
                    return Err(MuxError::Protocol("bad window frame".into()));
                }
                let grant = u64::from(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]));
                let credit = shared.streams.lock().ok().and_then(|s| s.get(&stream).map(|s| s.credit.clone()));
                if let Some(credit) = credit {
                    if let Ok(mut available) = credit.available.lock() {
                        *available = available.saturating_add(grant).min(u64::from(WINDOW) * 4);
                    }
                    credit.changed.notify_waiters();
                }
            }
            other => return Err(MuxError::Protocol(format!("unknown frame kind {other}"))),
        }
    }
}

async fn accept_open(
    shared: &Arc<Shared>,
    incoming: &mpsc::Sender<(Request, Stream)>,
    stream: u32,
    payload: &[u8],
) -> Result<(), MuxError> {
    let ours = match shared.role {
        Role::Host => stream % 2 == 1,
        Role::Agent => stream % 2 == 0,
    };
    let known = shared.streams.lock().map(|s| s.contains_key(&stream)).unwrap_or(true);
    if ours || known || stream == 0 {
        return Err(MuxError::Protocol(format!("peer opened invalid stream id {stream}")));
    }
    if shared.streams.lock().map(|s| s.len()).unwrap_or(0) >= MAX_PEER_STREAMS {
        let _ = shared.send(Frame { stream, kind: KIND_RESET, payload: Bytes::new() });
        return Ok(());
    }
    let request: Request = match serde_json::from_slice(payload) {
        Ok(request) => request,
        Err(err) => {
            // An unknown request is the peer's problem, not a reason to drop the connection.
            let (rx, credit, discard) = shared.register(stream);
            let mut s = Stream::new(stream, shared.clone(), rx, credit, discard);
            let _ = s.send_event(&Event::error(crate::ErrorKind::Unsupported, format!("bad request: {err}"))).await;
            return Ok(());
        }
    };
    let (rx, credit, discard) = shared.register(stream);
    let s = Stream::new(stream, shared.clone(), rx, credit, discard);
    if incoming.send((request, s)).await.is_err() {
        return Err(MuxError::Closed);
    }
    Ok(())
}

fn deliver(shared: &Arc<Shared>, stream: u32, kind: u8, payload: Bytes) -> Result<(), MuxError> {
    let slot = shared.streams.lock().ok().and_then(|s| s.get(&stream).map(|s| (s.inbound.clone(), s.discard.clone())));
    // Frames for streams we already dropped are normal after a local reset.
    let Some((inbound, discard)) = slot else { return Ok(()) };
    if discard.load(Ordering::SeqCst) {
        let credit = payload.len().saturating_sub(usize::from(kind == KIND_DATA)) as u32;
        return shared.send(Frame { stream, kind: KIND_WINDOW, payload: Bytes::copy_from_slice(&credit.to_be_bytes()) });
    }
    let size = payload.len();
    let message = if kind == KIND_EVENT {
        match serde_json::from_slice::<Event>(&payload) {
            Ok(event) => Message::Event(event),
            Err(err) => {
                // A malformed event breaks that stream only, not the whole sandbox connection.
                let _ = inbound.send(Err(MuxError::Protocol(format!("bad event: {err}"))));
                return Ok(());
            }
        }
    } else {
        let mut payload = payload;
        if payload.is_empty() {
            let _ = inbound.send(Err(MuxError::Protocol("data frame without channel".into())));
            return Ok(());
        }
        let channel = payload.get_u8();
        Message::Data { channel, bytes: payload }
    };
    // Credit is counted in content bytes: data without its channel byte, events whole.
    let credit = if kind == KIND_EVENT { size } else { size - 1 };
    let _ = inbound.send(Ok((message, credit)));
    Ok(())
}

/// One logical stream. Split it to send and receive from different tasks.
pub struct Stream {
    pub sender: StreamSender,
    pub receiver: StreamReceiver,
}

impl Stream {
    fn new(
        id: u32,
        shared: Arc<Shared>,
        rx: mpsc::UnboundedReceiver<Result<(Message, usize), MuxError>>,
        credit: Arc<Credit>,
        discard: Arc<AtomicBool>,
    ) -> Self {
        let ended = Arc::new(AtomicBool::new(false));
        let received_end = Arc::new(AtomicBool::new(false));
        Stream {
            sender: StreamSender {
                id,
                shared: shared.clone(),
                credit,
                ended: ended.clone(),
                peer_ended: received_end.clone(),
                receiver_gone: discard.clone(),
            },
            receiver: StreamReceiver { id, shared, rx, consumed: 0, done: false, ended, peer_ended: received_end, gone: discard },
        }
    }

    pub fn split(self) -> (StreamSender, StreamReceiver) {
        (self.sender, self.receiver)
    }

    pub async fn send_event(&mut self, event: &Event) -> Result<(), MuxError> {
        self.sender.send_event(event).await
    }

    pub async fn recv(&mut self) -> Option<Result<Message, MuxError>> {
        self.receiver.recv().await
    }
}

pub struct StreamSender {
    id: u32,
    shared: Arc<Shared>,
    credit: Arc<Credit>,
    ended: Arc<AtomicBool>,
    peer_ended: Arc<AtomicBool>,
    receiver_gone: Arc<AtomicBool>,
}

impl StreamSender {
    pub fn id(&self) -> u32 {
        self.id
    }

    async fn take_credit(&self, wanted: usize) -> Result<usize, MuxError> {
        loop {
            let notified = self.credit.changed.notified();
            if self.credit.reset.load(Ordering::SeqCst) {
                return Err(MuxError::Reset);
            }
            if *self.shared.closed.borrow() {
                return Err(MuxError::Closed);
            }
            if let Ok(mut available) = self.credit.available.lock() {
                if *available > 0 {
                    let take = (wanted as u64).min(*available);
                    *available -= take;
                    return Ok(take as usize);
                }
            }
            notified.await;
        }
    }

    /// Sends bytes on a channel, waiting for the receiver's credit. Chunks as needed.
    pub async fn send_data(&mut self, channel: u8, mut bytes: &[u8]) -> Result<(), MuxError> {
        if self.ended.load(Ordering::SeqCst) {
            return Err(MuxError::Ended);
        }
        while !bytes.is_empty() {
            let want = bytes.len().min(MAX_FRAME - 1);
            let take = self.take_credit(want).await?;
            let mut payload = BytesMut::with_capacity(take + 1);
            payload.put_u8(channel);
            payload.put_slice(&bytes[..take]);
            self.shared.send(Frame { stream: self.id, kind: KIND_DATA, payload: payload.freeze() })?;
            bytes = &bytes[take..];
        }
        Ok(())
    }

    pub async fn send_event(&mut self, event: &Event) -> Result<(), MuxError> {
        if self.ended.load(Ordering::SeqCst) {
            return Err(MuxError::Ended);
        }
        let payload = serde_json::to_vec(event).map_err(|e| MuxError::Protocol(e.to_string()))?;
        if payload.len() > MAX_FRAME {
            return Err(MuxError::Protocol("event too large".into()));
        }
        // Events count against credit too, so a flood of events is throttled like data.
        let mut remaining = payload.len();
        while remaining > 0 {
            remaining -= self.take_credit(remaining).await?;
        }
        self.shared.send(Frame { stream: self.id, kind: KIND_EVENT, payload: payload.into() })
    }

    /// Resolves once the peer reset this stream or the connection is gone: the moment to stop
    /// work nobody will read, even if the stream is otherwise silent.
    pub async fn closed(&self) {
        loop {
            let notified = self.credit.changed.notified();
            if self.credit.reset.load(Ordering::SeqCst) || *self.shared.closed.borrow() {
                return;
            }
            notified.await;
        }
    }

    /// Half-closes: tells the peer we will send nothing more.
    pub fn end(&mut self) -> Result<(), MuxError> {
        if self.ended.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let result = self.shared.send(Frame { stream: self.id, kind: KIND_END, payload: Bytes::new() });
        if self.peer_ended.load(Ordering::SeqCst) {
            self.shared.forget(self.id);
        } else if self.receiver_gone.load(Ordering::SeqCst) {
            // Neither half is wanted any more: stop the peer from sending.
            let _ = self.shared.send(Frame { stream: self.id, kind: KIND_RESET, payload: Bytes::new() });
            self.shared.forget(self.id);
        }
        result
    }

    /// Aborts the stream in both directions.
    pub fn reset(&mut self) {
        self.ended.store(true, Ordering::SeqCst);
        let _ = self.shared.send(Frame { stream: self.id, kind: KIND_RESET, payload: Bytes::new() });
        self.shared.forget(self.id);
    }
}

impl Drop for StreamSender {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

pub struct StreamReceiver {
    id: u32,
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Result<(Message, usize), MuxError>>,
    consumed: u32,
    done: bool,
    ended: Arc<AtomicBool>,
    peer_ended: Arc<AtomicBool>,
    gone: Arc<AtomicBool>,
}

impl StreamReceiver {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The next message; `None` once the peer ended the stream, `Some(Err)` if it broke.
    pub async fn recv(&mut self) -> Option<Result<Message, MuxError>> {
        if self.done {
            return None;
        }
        match self.rx.recv().await {
            None | Some(Err(MuxError::Ended)) => {
                self.done = true;
                self.peer_ended.store(true, Ordering::SeqCst);
                if self.ended.load(Ordering::SeqCst) {
                    self.shared.forget(self.id);
                }
                None
            }
            Some(Err(err)) => {
                self.done = true;
                Some(Err(err))
            }
            Some(Ok((message, size))) => {
                self.grant(size);
                Some(Ok(message))
            }
        }
    }

    /// Receives the next event, skipping nothing: data where an event is expected is an error.
    pub async fn recv_event(&mut self) -> Result<Option<Event>, MuxError> {
        match self.recv().await {
            None => Ok(None),
            Some(Err(e)) => Err(e),
            Some(Ok(Message::Event(e))) => Ok(Some(e)),
            Some(Ok(Message::Data { .. })) => Err(MuxError::Protocol("expected an event, got data".into())),
        }
    }

    fn grant(&mut self, size: usize) {
        self.consumed = self.consumed.saturating_add(size as u32);
        if self.consumed >= WINDOW / 4 {
            let grant = self.consumed;
            self.consumed = 0;
            let _ = self.shared.send(Frame { stream: self.id, kind: KIND_WINDOW, payload: Bytes::copy_from_slice(&grant.to_be_bytes()) });
        }
    }
}

impl Drop for StreamReceiver {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.ended.load(Ordering::SeqCst) {
            // Nobody will read or write any more: stop the peer from sending.
            let _ = self.shared.send(Frame { stream: self.id, kind: KIND_RESET, payload: Bytes::new() });
            self.shared.forget(self.id);
        } else {
            // Our sender is still answering; keep the peer unblocked but drop what it sends.
            self.gone.store(true, Ordering::SeqCst);
            // Return credit for what was queued but never read.
            let mut queued = 0usize;
            while let Ok(Ok((_, size))) = self.rx.try_recv() {
                queued += size;
            }
            if queued > 0 {
                let _ = self.shared.send(Frame { stream: self.id, kind: KIND_WINDOW, payload: Bytes::copy_from_slice(&(queued as u32).to_be_bytes()) });
            }
        }
    }
}

#[cfg(test)]
mod tests;
