//! `Watch`: filesystem events under a path, via inotify, until the client goes away.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use corral_proto::{ErrorKind, Event, FsEventKind, StreamReceiver, StreamSender};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use tokio::net::unix::pipe;

use crate::error::{AgentError, IoContext};

/// Directories one watch may cover; a hostile tree must not exhaust the agent's memory.
const MAX_WATCHED_DIRS: usize = 16 * 1024;
/// Events handled per wakeup before yielding to the rest of the agent.
const EVENTS_PER_WAKEUP: usize = 256;

fn interesting() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::MOVE_SELF
        | WatchFlags::EXCL_UNLINK
}

/// One event, copied out of inotify's buffer.
struct Raw {
    wd: i32,
    flags: ReadFlags,
    name: Option<PathBuf>,
}

struct Watcher {
    /// The inotify descriptor. tokio's pipe receiver is just an epoll registration for a
    /// readable nonblocking descriptor, which is all inotify needs, and unlike `AsyncFd`
    /// it needs no `unsafe`.
    fd: pipe::Receiver,
    dirs: HashMap<i32, PathBuf>,
    recursive: bool,
}

impl Watcher {
    fn add(&mut self, path: &Path, flags: WatchFlags) -> rustix::io::Result<()> {
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return Err(Errno::NOSPC);
        }
        let wd = inotify::add_watch(&self.fd, path, flags)?;
        self.dirs.insert(wd, path.to_path_buf());
        Ok(())
    }

    /// Watches every directory below `root`; returns what was found, for synthetic events.
    async fn add_tree(&mut self, root: PathBuf) -> Vec<(PathBuf, bool)> {
        let limit = MAX_WATCHED_DIRS.saturating_sub(self.dirs.len());
        let found = tokio::task::spawn_blocking(move || subtree(&root, limit)).await.unwrap_or_default();
        for (path, is_dir) in &found {
            if *is_dir {
                // The directory may be gone already; that is not worth failing the watch for.
                let _ = self.add(path, interesting() | WatchFlags::ONLYDIR | WatchFlags::DONT_FOLLOW);
            }
        }
        found
    }

    /// Reads what is queued, without losing events already in the read buffer.
    async fn read(&self, buf: &mut [MaybeUninit<u8>]) -> std::io::Result<Vec<Raw>> {
        loop {
            self.fd.readable().await?;
            // try_io clears the readiness when we report WouldBlock.
            match self.fd.try_io(|| read_queued(&self.fd, buf)) {
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
                result => return result,
            }
        }
    }
}

fn read_queued(fd: &pipe::Receiver, buf: &mut [MaybeUninit<u8>]) -> std::io::Result<Vec<Raw>> {
    let mut events = Vec::new();
    let mut reader = inotify::Reader::new(fd, buf);
    loop {
        match reader.next() {
            Ok(event) => events.push(Raw {
                wd: event.wd(),
                flags: event.events(),
                name: event.file_name().map(|n| PathBuf::from(OsStr::from_bytes(n.to_bytes()))),
            }),
            Err(Errno::AGAIN) if events.is_empty() => return Err(std::io::ErrorKind::WouldBlock.into()),
            Err(Errno::AGAIN) => return Ok(events),
            Err(Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
        if events.len() >= EVENTS_PER_WAKEUP && reader.is_buffer_empty() {
            return Ok(events);
        }
    }
}

/// Entries below `root` (not following symlinks), at most `limit` directories.
fn subtree(root: &Path, limit: usize) -> Vec<(PathBuf, bool)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    let mut dirs = 0;
    while let Some(dir) = pending.pop() {
        let Ok(listing) = std::fs::read_dir(&dir) else { continue };
        for child in listing.flatten() {
            let is_dir = child.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                dirs += 1;
                if dirs > limit {
                    return found;
                }
                pending.push(child.path());
            }
            found.push((child.path(), is_dir));
        }
    }
    found
}

fn kind_of(flags: ReadFlags) -> Option<FsEventKind> {
    if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
        Some(FsEventKind::Create)
    } else if flags.intersects(ReadFlags::DELETE | ReadFlags::DELETE_SELF) {
        Some(FsEventKind::Remove)
    } else if flags.intersects(ReadFlags::MOVED_FROM | ReadFlags::MOVE_SELF) {
        Some(FsEventKind::Rename)
    } else if flags.contains(ReadFlags::MODIFY) {
        Some(FsEventKind::Write)
    } else if flags.contains(ReadFlags::ATTRIB) {
        Some(FsEventKind::Chmod)
    } else {
        None
    }
}

fn fs_event(kind: FsEventKind, path: &Path) -> Event {
    Event::FsEvent { kind, path: path.to_string_lossy().into_owned() }
}

/// Answers `Ok` once the watch is in place (so the client knows later changes will be seen),
/// then `FsEvent`s until the client hangs up or the watched path disappears.
pub async fn watch(path: PathBuf, recursive: bool, tx: &mut StreamSender, rx: &mut StreamReceiver) -> Result<(), AgentError> {
    let meta = std::fs::metadata(&path).context(path.display())?;
    let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).map_err(|e| AgentError::io("inotify", &e.into()))?;
    let fd = pipe::Receiver::from_owned_fd_unchecked(fd).context("inotify")?;
    let mut watcher = Watcher { fd, dirs: HashMap::new(), recursive: recursive && meta.is_dir() };
    watcher.add(&path, interesting()).map_err(|e| AgentError::io(path.display(), &e.into()))?;
    if watcher.recursive {
        watcher.add_tree(path.clone()).await;
    }
    tx.send_event(&Event::Ok).await?;

    let mut buf = vec![MaybeUninit::<u8>::uninit(); 16 * 1024];
    let mut client_open = true;
    while !watcher.dirs.is_empty() {
        tokio::select! {
            events = watcher.read(&mut buf) => {
                let events = events.map_err(|e| AgentError::new(ErrorKind::Internal, format!("inotify: {e}")))?;
                for event in events {
                    deliver(&mut watcher, event, tx).await?;
                }
            }
            // END only closes the client's half; it may still be listening.
            message = rx.recv(), if client_open => match message {
                None => client_open = false,
                Some(Err(err)) => return Err(err.into()),
                Some(Ok(_)) => {}
            },
            () = tx.closed() => return Ok(()),
        }
    }
    Ok(())
}

async fn deliver(watcher: &mut Watcher, event: Raw, tx: &mut StreamSender) -> Result<(), AgentError> {
    if event.flags.contains(ReadFlags::IGNORED) {
        watcher.dirs.remove(&event.wd);
        return Ok(());
    }
    // wd -1 (queue overflow) and watches removed meanwhile have no path to report.
    let Some(dir) = watcher.dirs.get(&event.wd) else { return Ok(()) };
    let path = match &event.name {
        Some(name) => dir.join(name),
        None => dir.clone(),
    };
    let Some(kind) = kind_of(event.flags) else { return Ok(()) };
    // A watched subdirectory's events about itself duplicate what its parent's watch reports.
    if event.name.is_none() && watcher.dirs.values().any(|d| Some(d.as_path()) == path.parent()) {
        return Ok(());
    }
    tx.send_event(&fs_event(kind, &path)).await?;
    if watcher.recursive && kind == FsEventKind::Create && event.flags.contains(ReadFlags::ISDIR) {
        let flags = interesting() | WatchFlags::ONLYDIR | WatchFlags::DONT_FOLLOW;
        if watcher.add(&path, flags).is_ok() {
            // Whatever appeared inside before the watch existed would otherwise go unreported.
            for (child, _) in watcher.add_tree(path).await {
                tx.send_event(&fs_event(FsEventKind::Create, &child)).await?;
            }
        }
    }
    Ok(())
}
