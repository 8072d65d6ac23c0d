//! Snapshots of the sandbox's writable layer, as a tar stream.
//!
//! Capture reads the overlay's upper dir through the descriptor the jail handed over (the
//! only way to reach it after `pivot_root`) while the host holds every other process frozen.
//! Overlay whiteouts (0/0 character devices) and opaque dirs (`user.overlay.opaque`) become
//! PAX records, so a layer restores on any backend: restore applies deletions and extracts
//! entries through the sandbox's own root, never below it.
//!
//! A layer to restore is hostile input: paths must be relative and plain (no `..`, no
//! absolute paths), nothing is written through a symlink or into another mount (volumes,
//! `/proc`, `/dev`, the read-only system binds), device nodes are refused, and the disk
//! quota bounds what is written.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use corral_proto::{ErrorKind, Event, Message, StreamReceiver, StreamSender, CHANNEL_FILE};
use tokio::sync::mpsc;

use crate::error::AgentError;

/// PAX keys of corral's deletion records.
const PAX_WHITEOUT: &str = "CORRAL.whiteout";
const PAX_OPAQUE: &str = "CORRAL.opaque";
const OPAQUE_XATTRS: [&str; 2] = ["user.overlay.opaque", "trusted.overlay.opaque"];
/// Bytes per DATA chunk handed to the mux.
const CHUNK: usize = 256 * 1024;
/// At most this many entries are restored; a layer of more is refused.
const MAX_ENTRIES: u64 = 4_000_000;
const MAX_PATH: usize = 4096;
/// Files the new sandbox writes for itself: taking the old sandbox's would give it the
/// old hostname.
const OWN_FILES: [&str; 2] = ["etc/hostname", "etc/hosts"];
/// How many skipped paths are reported (the count is always exact).
const MAX_REPORTED: usize = 100;

#[derive(Debug, Default)]
pub struct Summary {
    pub entries: u64,
    pub bytes: u64,
    pub skipped: Vec<String>,
    pub skipped_count: u64,
}

impl Summary {
    fn skip(&mut self, path: &Path, why: &str) {
        self.skipped_count += 1;
        if self.skipped.len() < MAX_REPORTED {
            self.skipped.push(format!("{}: {why}", path.display()));
        }
    }

    fn event(self) -> Event {
        Event::Layer { entries: self.entries, bytes: self.bytes, skipped: self.skipped, skipped_count: self.skipped_count }
    }
}

fn internal(message: impl Into<String>) -> AgentError {
    AgentError::new(ErrorKind::Internal, message)
}

/// Streams the writable layer as tar DATA, then a `Layer` summary.
pub async fn capture(layer: Option<&OwnedFd>, tx: &mut StreamSender) -> Result<(), AgentError> {
    let Some(layer) = layer else {
        return Err(AgentError::new(ErrorKind::Unsupported, "this sandbox has no writable layer to snapshot"));
    };
    // The magic link reaches the detached layer without any unsafe fd juggling.
    let root = PathBuf::from(format!("/proc/self/fd/{}", layer.as_raw_fd()));
    let (chunks_tx, mut chunks) = mpsc::channel::<Vec<u8>>(8);
    let task = tokio::task::spawn_blocking(move || {
        let writer = io::BufWriter::with_capacity(CHUNK, ChannelWriter(chunks_tx));
        write_layer(&root, writer)
    });
    while let Some(chunk) = chunks.recv().await {
        tx.send_data(CHANNEL_FILE, &chunk).await?;
    }
    let summary = task.await.map_err(|e| internal(format!("snapshot task failed: {e}")))?;
    let summary = summary.map_err(|e| AgentError::new(ErrorKind::from_io(&e), format!("reading the writable layer: {e}")))?;
    tx.send_event(&summary.event()).await?;
    Ok(())
}

struct ChannelWriter(mpsc::Sender<Vec<u8>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.blocking_send(buf.to_vec()).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the host went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn write_layer(root: &Path, writer: impl Write) -> io::Result<Summary> {
    let mut builder = tar::Builder::new(writer);
    builder.follow_symlinks(false);
    let mut summary = Summary::default();
    let mut links = HashMap::new();
    walk(&mut builder, root, Path::new(""), &mut links, &mut summary)?;
    builder.into_inner()?.flush()?;
    Ok(summary)
}

/// Depth first, parents before children, names sorted: the same layer gives the same bytes.
fn walk<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
    links: &mut HashMap<(u64, u64), PathBuf>,
    summary: &mut Summary,
) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?.map(|e| e.map(|e| e.file_name())).collect::<Result<_, _>>()?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let rel = rel.join(&name);
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Held processes cannot delete anything, but the agent's own file requests might.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let kind = meta.file_type();
        let mut header = tar::Header::new_gnu();
        header.set_mode(meta.mode() & 0o7777);
        header.set_uid(u64::from(meta.uid()));
        header.set_gid(u64::from(meta.gid()));
        header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
        header.set_size(0);
        summary.entries += 1;
        if kind.is_char_device() && meta.rdev() == 0 {
            builder.append_pax_extensions([(PAX_WHITEOUT, b"1".as_slice())])?;
            header.set_entry_type(tar::EntryType::Regular);
            builder.append_data(&mut header, &rel, io::empty())?;
        } else if kind.is_dir() {
            if is_opaque(&path) {
                builder.append_pax_extensions([(PAX_OPAQUE, b"1".as_slice())])?;
            }
            header.set_entry_type(tar::EntryType::Directory);
            builder.append_data(&mut header, &rel, io::empty())?;
            walk(builder, &path, &rel, links, summary)?;
        } else if kind.is_symlink() {
            header.set_entry_type(tar::EntryType::Symlink);
            builder.append_link(&mut header, &rel, fs::read_link(&path)?)?;
        } else if kind.is_file() {
            if meta.nlink() > 1 {
                if let Some(first) = links.get(&(meta.dev(), meta.ino())) {
                    header.set_entry_type(tar::EntryType::Link);
                    builder.append_link(&mut header, &rel, first)?;
                    continue;
                }
                links.insert((meta.dev(), meta.ino()), rel.clone());
            }
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(meta.len());
            let file = fs::File::open(&path)?;
            // A file that changed size meanwhile would corrupt the archive; take what the
            // header promised, padded with zeros if it shrank.
            let reader = file.take(meta.len()).chain(io::repeat(0).take(meta.len()));
            builder.append_data(&mut header, &rel, reader.take(meta.len()))?;
            summary.bytes += meta.len();
        } else {
            summary.entries -= 1;
            summary.skip(&rel, "sockets, FIFOs and device nodes are not captured");
        }
    }
    Ok(())
}

fn is_opaque(path: &Path) -> bool {
    let mut value = [0u8; 4];
    OPAQUE_XATTRS.iter().any(|name| matches!(rustix::fs::lgetxattr(path, *name, &mut value), Ok(n) if value[..n] == *b"y"))
}

/// Reads tar DATA from the host until END, applies it under `/`, answers `Layer`.
pub async fn restore(rx: &mut StreamReceiver, tx: &mut StreamSender) -> Result<(), AgentError> {
    let (data_tx, data_rx) = mpsc::channel::<bytes::Bytes>(8);
    let task = tokio::task::spawn_blocking(move || apply_layer(ChannelReader { rx: data_rx, current: bytes::Bytes::new() }, Path::new("/")));
    let mut stream_error = None;
    loop {
        match rx.recv().await {
            Some(Ok(Message::Data { bytes, .. })) => {
                // The applier stopped early (an error it will report): stop feeding it.
                if data_tx.send(bytes).await.is_err() {
                    break;
                }
            }
            Some(Ok(Message::Event(_))) => {}
            None => break,
            Some(Err(err)) => {
                stream_error = Some(err);
                break;
            }
        }
    }
    drop(data_tx);
    let result = task.await.map_err(|e| internal(format!("restore task failed: {e}")))?;
    if let Some(err) = stream_error {
        return Err(err.into());
    }
    let summary = result?;
    tx.send_event(&summary.event()).await?;
    Ok(())
}

struct ChannelReader {
    rx: mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(bytes) => self.current = bytes,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

fn bad(message: String) -> AgentError {
    AgentError::invalid(format!("invalid snapshot layer: {message}"))
}

/// Applies a layer made by [`capture`] to the tree at `root`.
pub fn apply_layer(reader: impl Read, root: &Path) -> Result<Summary, AgentError> {
    let root_dev = fs::metadata(root).map_err(|e| AgentError::io(root.display(), &e))?.dev();
    let mut archive = tar::Archive::new(reader);
    let mut summary = Summary::default();
    // Directory times are set last: creating their children changes them.
    let mut dir_times = Vec::new();
    let entries = archive.entries().map_err(|e| bad(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        summary.entries += 1;
        if summary.entries > MAX_ENTRIES {
            return Err(bad(format!("more than {MAX_ENTRIES} entries")));
        }
        let rel = checked_path(&entry.path_bytes())?;
        let (mut whiteout, mut opaque) = (false, false);
        if let Some(extensions) = entry.pax_extensions().map_err(|e| bad(e.to_string()))? {
            for extension in extensions.flatten() {
                whiteout |= extension.key_bytes() == PAX_WHITEOUT.as_bytes();
                opaque |= extension.key_bytes() == PAX_OPAQUE.as_bytes();
            }
        }
        if OWN_FILES.iter().any(|own| rel == Path::new(own)) {
            summary.skip(&rel, "written by the new sandbox itself");
            continue;
        }
        let target = root.join(&rel);
        // The parent must be a real directory of the sandbox's own root filesystem: not a
        // symlink to elsewhere, not a volume, /proc, /dev or a read-only system bind.
        match parent_on_root(root, &rel, root_dev) {
            Ok(true) => {}
            Ok(false) => {
                summary.skip(&rel, "not on the sandbox's own filesystem (mount point, volume or symlinked parent)");
                continue;
            }
            Err(e) => return Err(AgentError::io(target.display(), &e)),
        }
        let header = entry.header();
        let (mode, uid, gid) = (header.mode().unwrap_or(0o644) & 0o7777, header.uid().unwrap_or(0), header.gid().unwrap_or(0));
        let mtime = header.mtime().unwrap_or(0);
        let kind = header.entry_type();
        let applied = (|| -> io::Result<()> {
            if whiteout {
                return remove_any(&target);
            }
            match kind {
                tar::EntryType::Directory => {
                    match fs::symlink_metadata(&target) {
                        Ok(meta) if meta.is_dir() => {
                            if opaque {
                                clear_dir(&target)?;
                            }
                        }
                        Ok(_) => {
                            fs::remove_file(&target)?;
                            fs::create_dir(&target)?;
                        }
                        Err(_) => fs::create_dir(&target)?,
                    }
                    set_owner_and_mode(&target, uid, gid, Some(mode))?;
                    dir_times.push((target.clone(), mtime));
                    Ok(())
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    remove_any(&target)?;
                    let mut file = fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&target)?;
                    summary.bytes += io::copy(&mut entry, &mut file)?;
                    drop(file);
                    set_owner_and_mode(&target, uid, gid, Some(mode))?;
                    set_mtime(&target, mtime)
                }
                tar::EntryType::Symlink => {
                    let link = entry.link_name_bytes().ok_or_else(|| io::Error::other("symlink without a target"))?;
                    remove_any(&target)?;
                    std::os::unix::fs::symlink(bytes_path(&link), &target)?;
                    set_owner_and_mode(&target, uid, gid, None)?;
                    set_mtime(&target, mtime)
                }
                tar::EntryType::Link => {
                    let link = entry.link_name_bytes().ok_or_else(|| io::Error::other("hard link without a target"))?;
                    let source = checked_path(&link).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                    if !parent_on_root(root, &source, root_dev)? {
                        return Err(io::Error::new(io::ErrorKind::InvalidInput, "hard link to outside the root filesystem"));
                    }
                    remove_any(&target)?;
                    fs::hard_link(root.join(source), &target)
                }
                _ => Err(io::Error::new(io::ErrorKind::Unsupported, "device nodes and FIFOs are not restored")),
            }
        })();
        match applied {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) => {
                return Err(AgentError::io(format!("restoring {}", rel.display()), &e));
            }
            Err(e) => summary.skip(&rel, &e.to_string()),
        }
    }
    for (dir, mtime) in dir_times.into_iter().rev() {
        let _ = set_mtime(&dir, mtime);
    }
    Ok(summary)
}

/// A relative path of plain components, not too long.
fn checked_path(bytes: &[u8]) -> Result<PathBuf, AgentError> {
    if bytes.len() > MAX_PATH || bytes.contains(&0) {
        return Err(bad("a path is too long or contains NUL".into()));
    }
    let path = bytes_path(bytes);
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            _ => return Err(bad(format!("path {:?} is absolute or climbs out", path.display().to_string()))),
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(bad("an entry has an empty path".into()));
    }
    Ok(clean)
}

fn bytes_path(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
}

/// True if every ancestor of `rel` below `root` is a real directory (no symlink) on `root`'s
/// filesystem. Missing ancestors are created (layers list parents first, but need not).
fn parent_on_root(root: &Path, rel: &Path, root_dev: u64) -> io::Result<bool> {
    let mut current = root.to_path_buf();
    let Some(parent) = rel.parent() else { return Ok(true) };
    for component in parent.components() {
        current.push(component);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.is_dir() && meta.dev() == root_dev => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new().mode(0o755).create(&current)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// An opaque dir hides what the template had in it.
fn clear_dir(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        remove_any(&entry?.path())?;
    }
    Ok(())
}

fn set_owner_and_mode(path: &Path, uid: u64, gid: u64, mode: Option<u32>) -> io::Result<()> {
    let (uid, gid) = (u32::try_from(uid).ok(), u32::try_from(gid).ok());
    // Owner first: chown clears set-id bits, which the mode then puts back.
    std::os::unix::fs::lchown(path, uid, gid)?;
    if let Some(mode) = mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn set_mtime(path: &Path, mtime: u64) -> io::Result<()> {
    use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD};
    let time = Timespec { tv_sec: i64::try_from(mtime).unwrap_or(0), tv_nsec: 0 };
    let times = Timestamps { last_access: time, last_modification: time };
    utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(io::Error::from)
}
