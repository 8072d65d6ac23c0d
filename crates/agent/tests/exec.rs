//! Exec, process control and the reaper, against a real agent over an in-memory connection.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use corral_proto::{ErrorKind, Event, ExecSpec, Message, PtySize, Request, CHANNEL_STDIN, CHANNEL_STDOUT};

#[tokio::test]
async fn ping_answers_pong() {
    let h = harness();
    assert_eq!(h.answer(Request::Ping).await, Event::Pong { version: corral_proto::PROTOCOL_VERSION.into() });
}

#[tokio::test]
async fn exec_separates_stdout_stderr_and_reports_exit_code() {
    let h = harness();
    let out = h.exec(shell("echo out; echo err >&2; exit 3")).await;
    assert_eq!(out.stdout(), "out\n");
    assert_eq!(out.stderr(), "err\n");
    assert_eq!(out.exit(), (Some(3), None, None));
    assert_eq!(out.events.len(), 2, "Started then Exited: {:?}", out.events);
    // Reaped before Exited was sent: no zombie left behind.
    assert!(!std::path::Path::new(&format!("/proc/{}", out.pid())).exists());
}

#[tokio::test]
async fn exec_argv_nonzero_exit() {
    let h = harness();
    let out = h.exec(argv(&["false"])).await;
    assert_eq!(out.exit(), (Some(1), None, None));
}

#[tokio::test]
async fn exec_reports_terminating_signal() {
    let h = harness();
    let out = h.exec(shell("kill -9 $$")).await;
    assert_eq!(out.exit(), (None, Some(9), None));
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let h = harness();
    let started = Instant::now();
    let spec = ExecSpec { timeout_ms: Some(300), ..shell("sleep 100 & echo $!; sleep 100") };
    let out = h.exec(spec).await;
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_eq!(out.exit(), (None, Some(9), Some("timeout".into())));
    let grandchild: u32 = out.stdout().trim().parse().expect("grandchild pid");
    assert!(eventually(Duration::from_secs(2), || !alive(grandchild)).await, "grandchild {grandchild} survived");
}

#[tokio::test]
async fn output_streams_before_exit() {
    let h = harness();
    let out = h.exec(shell("echo first; sleep 0.3; echo second")).await;
    assert_eq!(out.stdout(), "first\nsecond\n");
    let first = out.stdout_at[0];
    let exited = out.exited_at.expect("exited");
    assert!(exited.duration_since(first) >= Duration::from_millis(200), "first chunk was held back until exit");
}

#[tokio::test]
async fn stdin_is_piped_and_end_closes_it() {
    let h = harness();
    let mut stream = h.open(Request::Exec(ExecSpec { stdin: true, ..argv(&["cat"]) }));
    assert!(matches!(next_event(&mut stream).await, Event::Started { .. }));
    stream.sender.send_data(CHANNEL_STDIN, b"hello ").await.unwrap();
    stream.sender.send_data(CHANNEL_STDIN, b"world").await.unwrap();
    stream.sender.end().unwrap();
    let out = collect(stream).await;
    assert_eq!(out.stdout(), "hello world");
    assert_eq!(out.exit(), (Some(0), None, None));
}

#[tokio::test]
async fn stdin_is_dev_null_unless_requested() {
    let h = harness();
    let out = h.exec(shell("cat; echo done")).await;
    assert_eq!(out.stdout(), "done\n");
}

#[tokio::test]
async fn background_process_is_listed_attachable_and_signalable() {
    let h = harness();
    let spec = ExecSpec { background: true, tag: Some("ticker".into()), ..shell("while true; do echo tick; sleep 0.05; done") };
    let mut stream = h.open(Request::Exec(spec));
    let Event::Started { pid } = next_event(&mut stream).await else { panic!("not started") };
    drop(stream);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let Event::Processes { processes } = h.answer(Request::ProcessList).await else { panic!("no process list") };
    let listed = processes.iter().find(|p| p.pid == pid).expect("background process listed");
    assert_eq!(listed.tag.as_deref(), Some("ticker"));
    assert_eq!(listed.argv[0], "/bin/sh");

    let mut attached = h.open(Request::Attach { pid });
    let first = tokio::time::timeout(Duration::from_secs(5), attached.recv()).await.unwrap();
    match first {
        Some(Ok(Message::Data { channel: CHANNEL_STDOUT, bytes })) => assert!(bytes.starts_with(b"tick")),
        other => panic!("expected output, got {other:?}"),
    }

    assert_eq!(h.answer(Request::Signal { pid, signal: 15 }).await, Event::Ok);
    let rest = collect(attached).await;
    assert_eq!(rest.exit(), (None, Some(15), None));
    let Event::Processes { processes } = h.answer(Request::ProcessList).await else { panic!("no process list") };
    assert!(processes.iter().all(|p| p.pid != pid), "exited process still listed");
}

#[tokio::test]
async fn unknown_pids_are_not_found() {
    let h = harness();
    for request in [Request::Attach { pid: 999_999 }, Request::Signal { pid: 1, signal: 9 }, Request::CloseStdin { pid: 999_999 }] {
        match h.answer(request).await {
            Event::Error { kind: ErrorKind::NotFound, .. } => {}
            other => panic!("expected NotFound, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn send_stdin_and_close_stdin_by_pid() {
    let h = harness();
    let stream = h.open(Request::Exec(ExecSpec { stdin: true, ..argv(&["cat"]) }));
    let reader = tokio::spawn(collect(stream));
    let pid = wait_for_process(&h).await;
    assert_eq!(h.answer(Request::SendStdin { pid, data: "via pid\n".into() }).await, Event::Ok);
    assert_eq!(h.answer(Request::CloseStdin { pid }).await, Event::Ok);
    let out = reader.await.unwrap();
    assert_eq!(out.stdout(), "via pid\n");
    assert_eq!(out.exit(), (Some(0), None, None));
}

async fn wait_for_process(h: &Harness) -> u32 {
    for _ in 0..100 {
        if let Event::Processes { processes } = h.answer(Request::ProcessList).await {
            if let Some(p) = processes.first() {
                return p.pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("process never appeared");
}

#[tokio::test]
async fn pty_gives_a_terminal_of_the_requested_size() {
    let h = harness();
    let out = h.exec(ExecSpec { pty: Some(PtySize { cols: 100, rows: 40 }), ..shell("tty; stty size") }).await;
    let text = out.stdout();
    assert!(text.contains("/dev/pts/"), "tty said: {text:?}");
    assert!(text.contains("40 100"), "stty said: {text:?}");
    assert!(out.stderr.is_empty(), "pty output must all come on stdout");
    assert_eq!(out.exit(), (Some(0), None, None));
}

#[tokio::test]
async fn pty_input_and_resize() {
    let h = harness();
    let spec = ExecSpec { pty: Some(PtySize { cols: 80, rows: 24 }), ..shell("read line; echo got=$line; stty size") };
    let mut stream = h.open(Request::Exec(spec));
    let Event::Started { pid } = next_event(&mut stream).await else { panic!("not started") };
    assert_eq!(h.answer(Request::ResizePty { pid, size: PtySize { cols: 50, rows: 20 } }).await, Event::Ok);
    stream.sender.send_data(CHANNEL_STDIN, b"hi\n").await.unwrap();
    let out = collect_from(&mut stream).await;
    let text = out.stdout();
    assert!(text.contains("got=hi"), "{text:?}");
    assert!(text.contains("20 50"), "{text:?}");
}

#[tokio::test]
async fn exec_as_users() {
    let h = harness();
    assert_eq!(h.exec(shell("id -u; id -g")).await.stdout(), "1000\n1000\n");
    assert_eq!(h.exec(ExecSpec { user: Some("root".into()), ..shell("id -u") }).await.stdout(), "0\n");
    assert_eq!(h.exec(ExecSpec { user: Some("1234".into()), ..shell("id -u") }).await.stdout(), "1234\n");
}

#[tokio::test]
async fn env_and_cwd() {
    let h = harness();
    std::fs::create_dir(h.home().join("sub")).unwrap();
    let configured = BTreeMap::from([("FROM_CONFIG".to_string(), "c".to_string()), ("OVERRIDDEN".to_string(), "no".to_string())]);
    assert_eq!(h.answer(Request::Configure { env: configured }).await, Event::Ok);
    let env = BTreeMap::from([("FOO".to_string(), "bar".to_string()), ("OVERRIDDEN".to_string(), "yes".to_string())]);
    let spec = ExecSpec { env, cwd: Some("sub".into()), ..shell("echo $FOO $FROM_CONFIG $OVERRIDDEN; pwd; echo $HOME $USER; echo $PATH") };
    let out = h.exec(spec).await;
    let home = h.home().display().to_string();
    assert_eq!(
        out.stdout(),
        format!("bar c yes\n{home}/sub\n{home} user\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
    );
    // The default cwd is the user's home.
    assert_eq!(h.exec(shell("pwd")).await.stdout(), format!("{home}\n"));
}

#[tokio::test]
async fn spawn_failures_are_single_errors() {
    let h = harness();
    let cases = [
        (argv(&["definitely-not-a-binary"]), "definitely-not-a-binary"),
        (ExecSpec { cwd: Some("/no/such/dir".into()), ..argv(&["true"]) }, "/no/such/dir"),
        (ExecSpec { user: Some("nobody-like-this".into()), ..argv(&["true"]) }, "nobody-like-this"),
    ];
    for (spec, mentioned) in cases {
        let events = h.exec(spec).await.events;
        match events.as_slice() {
            [Event::Error { kind: ErrorKind::NotFound, message }] => assert!(message.contains(mentioned), "{message}"),
            other => panic!("expected one NotFound error, got {other:?}"),
        }
    }
    match h.exec(argv(&[])).await.events.as_slice() {
        [Event::Error { kind: ErrorKind::InvalidArgument, .. }] => {}
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test]
async fn resetting_a_foreground_exec_kills_it() {
    let h = harness();
    let mut stream = h.open(Request::Exec(shell("sleep 100")));
    let Event::Started { pid } = next_event(&mut stream).await else { panic!("not started") };
    stream.sender.reset();
    drop(stream);
    assert!(eventually(Duration::from_secs(3), || !alive(pid)).await, "foreground process outlived its client");
}

#[tokio::test]
async fn dropping_a_silent_foreground_exec_kills_it() {
    let h = harness();
    let mut stream = h.open(Request::Exec(shell("sleep 100")));
    let Event::Started { pid } = next_event(&mut stream).await else { panic!("not started") };
    // A client without stdin half-closes at once, then later hangs up; the process says nothing.
    stream.sender.end().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(alive(pid), "END alone must not kill");
    drop(stream);
    assert!(eventually(Duration::from_secs(3), || !alive(pid)).await, "foreground process outlived its client");
}

#[tokio::test]
async fn background_exec_survives_its_client() {
    let h = harness();
    let mut stream = h.open(Request::Exec(ExecSpec { background: true, ..shell("sleep 100") }));
    let Event::Started { pid } = next_event(&mut stream).await else { panic!("not started") };
    stream.sender.reset();
    drop(stream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(alive(pid));
    assert_eq!(h.answer(Request::Signal { pid, signal: 9 }).await, Event::Ok);
    assert!(eventually(Duration::from_secs(3), || !alive(pid)).await);
}

#[tokio::test]
async fn large_output_is_delivered_completely() {
    let h = harness();
    let out = h.exec(shell("head -c 3000000 /dev/zero")).await;
    assert_eq!(out.stdout.len(), 3_000_000);
    assert_eq!(out.exit(), (Some(0), None, None));
}

#[tokio::test]
async fn reaper_collects_children_it_did_not_start() {
    let _h = harness();
    let child = std::process::Command::new("true").spawn().expect("spawn");
    let pid = child.id();
    // Not waited for: only the reaper can clear the zombie.
    drop(child);
    let reaped = eventually(Duration::from_secs(3), || !std::path::Path::new(&format!("/proc/{pid}")).exists()).await;
    assert!(reaped, "orphan {pid} was not reaped");
}

#[tokio::test]
async fn exec_data_is_not_sent_after_exited() {
    let h = harness();
    let out = h.exec(shell("printf abc")).await;
    assert_eq!(out.stdout, Bytes::from_static(b"abc"));
    assert!(matches!(out.events.last(), Some(Event::Exited { .. })));
}
