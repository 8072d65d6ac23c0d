//! File requests and watches, against a real agent over an in-memory connection.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::*;
use corral_proto::{ErrorKind, Event, FileKind, FsEventKind, Message, Request, CHANNEL_FILE};

/// Deterministic pseudo-random bytes (xorshift), so a failure is reproducible.
fn noise(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

async fn write(h: &Harness, path: &str, data: &[u8], append: bool) -> Event {
    let mut stream = h.open(Request::WriteFile { path: path.into(), user: None, mode: None, append });
    for chunk in data.chunks(1 << 20) {
        // An agent that gave up (with an Error event) resets the stream; read its answer.
        if stream.sender.send_data(CHANNEL_FILE, chunk).await.is_err() {
            break;
        }
    }
    let _ = stream.sender.end();
    let events = collect_from(&mut stream).await.events;
    assert_eq!(events.len(), 1, "{events:?}");
    events.into_iter().next().unwrap()
}

async fn read(h: &Harness, path: &str) -> (Event, Vec<u8>) {
    let mut stream = h.open(Request::ReadFile { path: path.into(), user: None });
    let mut first = None;
    let mut data = Vec::new();
    while let Some(message) = stream.recv().await {
        match message.unwrap() {
            Message::Event(event) => {
                assert!(first.is_none(), "a second event: {event:?}");
                first = Some(event);
            }
            Message::Data { channel, bytes } => {
                assert_eq!(channel, CHANNEL_FILE);
                assert!(bytes.len() <= 64 * 1024);
                data.extend_from_slice(&bytes);
            }
        }
    }
    (first.expect("an answer"), data)
}

fn expect_error(event: Event, kind: ErrorKind) -> String {
    match event {
        Event::Error { kind: got, message } if got == kind => message,
        other => panic!("expected {kind:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn write_then_read_20_mib_streamed() {
    let h = harness();
    let data = noise(20 << 20);
    let Event::Entry(entry) = write(&h, "deep/er/blob.bin", &data, false).await else { panic!("no entry") };
    assert_eq!(entry.size, data.len() as u64);
    assert_eq!(entry.path, path_string(h.home().join("deep/er/blob.bin")));
    assert_eq!((entry.uid, entry.gid), (1000, 1000));
    // Created parent directories belong to the user too.
    assert_eq!(std::fs::metadata(h.home().join("deep")).unwrap().uid(), 1000);

    let (answer, read_back) = read(&h, "~/deep/er/blob.bin").await;
    let Event::Entry(entry) = answer else { panic!("no entry: {answer:?}") };
    assert_eq!(entry.kind, FileKind::File);
    assert_eq!(read_back.len(), data.len());
    assert!(read_back == data, "contents differ");
}

#[tokio::test]
async fn write_truncates_appends_and_sets_mode() {
    let h = harness();
    write(&h, "f.txt", b"hello world", false).await;
    write(&h, "f.txt", b"bye", false).await;
    assert_eq!(std::fs::read(h.home().join("f.txt")).unwrap(), b"bye");
    write(&h, "f.txt", b"!", true).await;
    assert_eq!(std::fs::read(h.home().join("f.txt")).unwrap(), b"bye!");

    let mut stream = h.open(Request::WriteFile { path: "/dev/null/x".into(), user: None, mode: None, append: false });
    stream.sender.end().unwrap();
    let events = collect_from(&mut stream).await.events;
    assert!(matches!(events.as_slice(), [Event::Error { kind: ErrorKind::NotADirectory, .. }]), "{events:?}");

    let target = h.home().join("exec.sh");
    let mut stream = h.open(Request::WriteFile { path: path_string(&target), user: Some("root".into()), mode: Some(0o750), append: false });
    stream.sender.send_data(CHANNEL_FILE, b"#!/bin/sh\n").await.unwrap();
    stream.sender.end().unwrap();
    let events = collect_from(&mut stream).await.events;
    let [Event::Entry(entry)] = events.as_slice() else { panic!("{events:?}") };
    assert_eq!((entry.mode, entry.uid), (0o750, 0));
}

#[tokio::test]
async fn no_space_reaches_the_client() {
    let h = harness();
    // /dev/full fails every write with ENOSPC.
    let events = match write(&h, "/dev/full", &noise(1 << 20), false).await {
        Event::Error { kind, .. } => kind,
        other => panic!("{other:?}"),
    };
    assert_eq!(events, ErrorKind::NoSpace);
}

#[tokio::test]
async fn read_errors() {
    let h = harness();
    let (answer, _) = read(&h, "missing").await;
    let message = expect_error(answer, ErrorKind::NotFound);
    assert!(message.contains("missing"), "{message}");
    std::fs::create_dir(h.home().join("dir")).unwrap();
    let (answer, _) = read(&h, "dir").await;
    expect_error(answer, ErrorKind::IsADirectory);
}

#[tokio::test]
async fn stat_describes_files_dirs_and_symlinks() {
    let h = harness();
    std::fs::write(h.home().join("a"), b"12345").unwrap();
    std::os::unix::fs::symlink("a", h.home().join("link")).unwrap();
    let Event::Entry(entry) = h.answer(Request::Stat { path: "a".into(), user: None }).await else { panic!() };
    assert_eq!((entry.kind, entry.size, entry.name.as_str()), (FileKind::File, 5, "a"));
    let Event::Entry(entry) = h.answer(Request::Stat { path: "link".into(), user: None }).await else { panic!() };
    assert_eq!((entry.kind, entry.symlink_target.as_deref()), (FileKind::Symlink, Some("a")));
    let Event::Entry(entry) = h.answer(Request::Stat { path: "~".into(), user: None }).await else { panic!() };
    assert_eq!(entry.kind, FileKind::Dir);
    expect_error(h.answer(Request::Stat { path: "nope".into(), user: None }).await, ErrorKind::NotFound);
}

#[tokio::test]
async fn list_dir_respects_depth_and_does_not_follow_symlinks() {
    let h = harness();
    let home = h.home();
    std::fs::create_dir_all(home.join("a/b/c")).unwrap();
    std::fs::write(home.join("a/b/c/deep.txt"), b"x").unwrap();
    std::fs::write(home.join("top.txt"), b"x").unwrap();
    std::os::unix::fs::symlink(home.join("a"), home.join("loop")).unwrap();

    let list = |depth| {
        let h = &h;
        async move {
            let mut names: Vec<String> = Vec::new();
            for event in h.request(Request::ListDir { path: "~".into(), depth, user: None }).await {
                let Event::Entries { entries } = event else { panic!("{event:?}") };
                names.extend(entries.into_iter().map(|e| e.path.strip_prefix(&path_string(h.home())).unwrap().to_owned()));
            }
            names.sort();
            names
        }
    };
    assert_eq!(list(1).await, ["/a", "/loop", "/top.txt"]);
    assert_eq!(list(2).await, ["/a", "/a/b", "/loop", "/top.txt"]);
    assert_eq!(list(4).await, ["/a", "/a/b", "/a/b/c", "/a/b/c/deep.txt", "/loop", "/top.txt"]);

    let events = h.request(Request::ListDir { path: "top.txt".into(), depth: 1, user: None }).await;
    assert!(matches!(events.as_slice(), [Event::Error { kind: ErrorKind::NotADirectory, .. }]), "{events:?}");
}

#[tokio::test]
async fn list_dir_splits_large_listings_into_several_events() {
    let h = harness();
    for i in 0..2000 {
        std::fs::write(h.home().join(format!("file-with-a-longish-name-{i:05}")), b"").unwrap();
    }
    let events = h.request(Request::ListDir { path: "~".into(), depth: 1, user: None }).await;
    assert!(events.len() > 1, "2000 entries cannot fit in one frame");
    let total: usize = events.iter().map(|e| match e {
        Event::Entries { entries } => entries.len(),
        other => panic!("{other:?}"),
    }).sum();
    assert_eq!(total, 2000);
}

#[tokio::test]
async fn make_dir_is_mkdir_p() {
    let h = harness();
    let Event::Entry(entry) = h.answer(Request::MakeDir { path: "x/y/z".into(), user: None }).await else { panic!() };
    assert_eq!((entry.kind, entry.uid), (FileKind::Dir, 1000));
    assert!(h.home().join("x/y/z").is_dir());
    assert_eq!(std::fs::metadata(h.home().join("x")).unwrap().uid(), 1000);
    assert_eq!(h.answer(Request::MakeDir { path: "x/y/z".into(), user: None }).await, Event::Ok);
    std::fs::write(h.home().join("file"), b"").unwrap();
    expect_error(h.answer(Request::MakeDir { path: "file".into(), user: None }).await, ErrorKind::AlreadyExists);
}

#[tokio::test]
async fn remove_files_and_trees() {
    let h = harness();
    std::fs::create_dir_all(h.home().join("t/u")).unwrap();
    std::fs::write(h.home().join("t/u/f"), b"").unwrap();
    std::fs::write(h.home().join("g"), b"").unwrap();
    assert_eq!(h.answer(Request::Remove { path: "t".into(), user: None }).await, Event::Ok);
    assert_eq!(h.answer(Request::Remove { path: "g".into(), user: None }).await, Event::Ok);
    assert!(!h.home().join("t").exists() && !h.home().join("g").exists());
    expect_error(h.answer(Request::Remove { path: "t".into(), user: None }).await, ErrorKind::NotFound);
}

#[tokio::test]
async fn rename_moves() {
    let h = harness();
    std::fs::write(h.home().join("old"), b"data").unwrap();
    let Event::Entry(entry) = h.answer(Request::Rename { from: "old".into(), to: "new".into(), user: None }).await else { panic!() };
    assert_eq!(entry.path, path_string(h.home().join("new")));
    assert_eq!(std::fs::read(h.home().join("new")).unwrap(), b"data");
    assert!(!h.home().join("old").exists());
    expect_error(h.answer(Request::Rename { from: "old".into(), to: "x".into(), user: None }).await, ErrorKind::NotFound);
}

#[tokio::test]
async fn watch_reports_creates_including_new_subdirectories() {
    let h = harness();
    let mut stream = h.open(Request::Watch { path: "~".into(), recursive: true, user: None });
    assert_eq!(next_event(&mut stream).await, Event::Ok, "watch is acknowledged once in place");

    std::fs::write(h.home().join("created.txt"), b"").unwrap();
    let expected = path_string(h.home().join("created.txt"));
    assert_eq!(next_event(&mut stream).await, Event::FsEvent { kind: FsEventKind::Create, path: expected });

    std::fs::create_dir(h.home().join("sub")).unwrap();
    assert_eq!(next_event(&mut stream).await, Event::FsEvent { kind: FsEventKind::Create, path: path_string(h.home().join("sub")) });
    // Give the agent a moment to watch the new directory, then change something inside it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(h.home().join("sub/inner"), b"").unwrap();
    let inner = path_string(h.home().join("sub/inner"));
    let mut seen = Vec::new();
    loop {
        let event = next_event(&mut stream).await;
        if event == (Event::FsEvent { kind: FsEventKind::Create, path: inner.clone() }) {
            break;
        }
        seen.push(event);
        assert!(seen.len() < 10, "no create for {inner}: {seen:?}");
    }

    std::fs::remove_file(h.home().join("created.txt")).unwrap();
    let removed = path_string(h.home().join("created.txt"));
    loop {
        if next_event(&mut stream).await == (Event::FsEvent { kind: FsEventKind::Remove, path: removed.clone() }) {
            break;
        }
    }
    stream.sender.reset();
}

#[tokio::test]
async fn watch_of_missing_path_is_not_found() {
    let h = harness();
    let events = h.request(Request::Watch { path: "nope".into(), recursive: false, user: None }).await;
    assert!(matches!(events.as_slice(), [Event::Error { kind: ErrorKind::NotFound, .. }]), "{events:?}");
}
