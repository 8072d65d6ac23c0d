//! The blocking entry point, over a real unix socket, across reconnects.

use std::time::Duration;

use corral_agent::{run, AgentConfig};
use corral_proto::{Event, Mux, Request, Role};

#[tokio::test]
async fn run_serves_successive_connections_and_keeps_processes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let config = AgentConfig { default_user: "root".into(), ..AgentConfig::default() };
    // `run` never returns; the thread ends with the test process.
    std::thread::spawn(move || run(listener, config));

    let connect = || async {
        let io = tokio::net::UnixStream::connect(&socket).await.expect("connect");
        Mux::new(io, Role::Host)
    };
    let (mux, _incoming) = connect().await;
    let mut ping = mux.open(&Request::Ping).unwrap();
    assert_eq!(ping.receiver.recv_event().await.unwrap(), Some(Event::Pong { version: corral_proto::PROTOCOL_VERSION.into() }));

    let spec = corral_proto::ExecSpec { shell: Some("sleep 100".into()), background: true, cwd: Some("/".into()), ..Default::default() };
    let mut exec = mux.open(&Request::Exec(spec)).unwrap();
    let Some(Event::Started { pid }) = exec.receiver.recv_event().await.unwrap() else { panic!("not started") };
    drop(exec);
    drop(mux);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // A new connection (the daemon restarted) sees the same process table.
    let (mux, _incoming) = connect().await;
    let mut list = mux.open(&Request::ProcessList).unwrap();
    let Some(Event::Processes { processes }) = list.receiver.recv_event().await.unwrap() else { panic!("no list") };
    assert!(processes.iter().any(|p| p.pid == pid), "{processes:?}");
    let mut kill = mux.open(&Request::Signal { pid, signal: 9 }).unwrap();
    assert_eq!(kill.receiver.recv_event().await.unwrap(), Some(Event::Ok));
}
