use super::*;
use crate::messages::{ErrorKind, ExecSpec};

fn pair() -> ((Mux, Incoming), (Mux, Incoming)) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    (Mux::new(a, Role::Host), Mux::new(b, Role::Agent))
}

#[tokio::test]
async fn request_reaches_peer_and_answer_comes_back() {
    let ((host, _), (_agent, mut incoming)) = pair();
    let server = tokio::spawn(async move {
        let (req, mut stream) = incoming.accept().await.expect("stream");
        assert_eq!(req, Request::Ping);
        stream.send_event(&Event::Pong { version: "x".into() }).await.expect("send");
    });
    let mut stream = host.open(&Request::Ping).expect("open");
    let event = stream.receiver.recv_event().await.expect("event");
    assert_eq!(event, Some(Event::Pong { version: "x".into() }));
    assert_eq!(stream.receiver.recv_event().await.expect("end"), None);
    server.await.expect("server");
}

#[tokio::test]
async fn large_transfer_respects_flow_control_and_arrives_intact() {
    let ((host, _), (_agent, mut incoming)) = pair();
    let total = 8 * 1024 * 1024 + 17;
    let server = tokio::spawn(async move {
        let (_req, stream) = incoming.accept().await.expect("stream");
        let (_tx, mut rx) = stream.split();
        let mut received = Vec::new();
        while let Some(msg) = rx.recv().await {
            match msg.expect("msg") {
                Message::Data { channel, bytes } => {
                    assert_eq!(channel, 0);
                    received.extend_from_slice(&bytes);
                }
                Message::Event(e) => panic!("unexpected {e:?}"),
            }
            // A slow reader must not make the sender overrun its window.
            tokio::task::yield_now().await;
        }
        received
    });
    let stream = host.open(&Request::Exec(ExecSpec::default())).expect("open");
    let (mut tx, _rx) = stream.split();
    let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    tx.send_data(0, &data).await.expect("send");
    tx.end().expect("end");
    let received = server.await.expect("server");
    assert_eq!(received.len(), data.len());
    assert!(received == data);
}

#[tokio::test]
async fn many_streams_interleave_without_blocking_each_other() {
    let ((host, _), (_agent, mut incoming)) = pair();
    tokio::spawn(async move {
        while let Some((req, mut stream)) = incoming.accept().await {
            tokio::spawn(async move {
                if let Request::Signal { pid, .. } = req {
                    stream.sender.send_data(1, pid.to_string().as_bytes()).await.expect("data");
                }
            });
        }
    });
    let mut handles = Vec::new();
    for pid in 0..200u32 {
        let host = host.clone();
        handles.push(tokio::spawn(async move {
            let mut stream = host.open(&Request::Signal { pid, signal: 0 }).expect("open");
            match stream.recv().await {
                Some(Ok(Message::Data { bytes, .. })) => assert_eq!(bytes, pid.to_string().as_bytes()),
                other => panic!("unexpected {other:?}"),
            }
        }));
    }
    for h in handles {
        h.await.expect("join");
    }
}

#[tokio::test]
async fn dropping_both_halves_resets_the_peers_sender() {
    let ((host, _), (_agent, mut incoming)) = pair();
    let server = tokio::spawn(async move {
        let (_req, stream) = incoming.accept().await.expect("stream");
        let (mut tx, _rx) = stream.split();
        let chunk = vec![7u8; 64 * 1024];
        // Keeps sending until the peer's reset makes it fail instead of blocking forever.
        loop {
            if let Err(err) = tx.send_data(1, &chunk).await {
                return err;
            }
        }
    });
    let stream = host.open(&Request::Ping).expect("open");
    let (tx, rx) = stream.split();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    drop(rx);
    drop(tx);
    let err = tokio::time::timeout(std::time::Duration::from_secs(5), server).await.expect("no hang").expect("join");
    assert_eq!(err, MuxError::Reset);
}

#[tokio::test]
async fn oversized_frame_from_peer_closes_connection_without_allocating() {
    let (a, mut b) = tokio::io::duplex(1024);
    let (host, _incoming) = Mux::new(a, Role::Host);
    let mut header = Vec::new();
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    header.extend_from_slice(&2u32.to_be_bytes());
    header.push(KIND_DATA);
    use tokio::io::AsyncWriteExt;
    b.write_all(&header).await.expect("write");
    tokio::time::timeout(std::time::Duration::from_secs(5), host.closed()).await.expect("closed");
    assert!(matches!(host.open(&Request::Ping), Err(MuxError::Closed)));
}

#[tokio::test]
async fn garbage_request_gets_an_error_event_not_a_dead_connection() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (agent, _incoming) = Mux::new(b, Role::Agent);
    let (mut reader, mut writer) = tokio::io::split(a);
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let payload = b"{\"op\":\"format_disk\"}";
    let mut frame = Vec::new();
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&1u32.to_be_bytes());
    frame.push(KIND_OPEN);
    frame.extend_from_slice(payload);
    writer.write_all(&frame).await.expect("write");
    let mut header = [0u8; 9];
    reader.read_exact(&mut header).await.expect("read");
    assert_eq!(header[8], KIND_EVENT);
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await.expect("body");
    let event: Event = serde_json::from_slice(&body).expect("event");
    assert!(matches!(event, Event::Error { kind: ErrorKind::Unsupported, .. }));
    assert!(!agent.is_closed());
}

#[tokio::test]
async fn answering_after_dropping_the_receiver_still_works() {
    let ((host, _), (_agent, mut incoming)) = pair();
    tokio::spawn(async move {
        let (_req, stream) = incoming.accept().await.expect("stream");
        let (mut tx, rx) = stream.split();
        drop(rx);
        tx.send_event(&Event::Ok).await.expect("send");
    });
    let mut stream = host.open(&Request::Ping).expect("open");
    // The peer discards this but must keep crediting us, or we would block here forever.
    let big = vec![1u8; 4 * 1024 * 1024];
    // It may also be reset once the peer has answered and ended; either way, no hang.
    let sent = tokio::time::timeout(std::time::Duration::from_secs(5), stream.sender.send_data(0, &big)).await.expect("no hang");
    assert!(matches!(sent, Ok(()) | Err(MuxError::Reset)), "{sent:?}");
    assert_eq!(stream.receiver.recv_event().await.expect("event"), Some(Event::Ok));
}

#[tokio::test]
async fn a_silent_stream_notices_when_the_peer_hangs_up() {
    let ((host, _), (_agent, mut incoming)) = pair();
    let stream = host.open(&Request::Ping).expect("open");
    let (_req, agent_stream) = incoming.accept().await.expect("stream");
    let (agent_tx, mut agent_rx) = agent_stream.split();
    // The client half-closes at once (no stdin), then goes away entirely.
    let (mut tx, rx) = stream.split();
    tx.end().expect("end");
    assert_eq!(agent_rx.recv_event().await.expect("end"), None);
    drop(rx);
    drop(tx);
    tokio::time::timeout(std::time::Duration::from_secs(5), agent_tx.closed()).await.expect("hangup seen");
}
