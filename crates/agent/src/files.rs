//! Filesystem requests. Blocking syscalls run on tokio's blocking pool so one slow disk
//! operation never stalls the agent's single-threaded runtime.

use std::fs::{self, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use corral_proto::{ErrorKind, Event, FileEntry, FileKind, Message, StreamReceiver, StreamSender, CHANNEL_FILE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::error::{AgentError, IoContext};
use crate::users::UserEntry;

/// Bytes read from disk per step; the mux splits them into frames.
const READ_CHUNK: usize = 256 * 1024;
/// Entries go out in several `Entries` events, each kept under the mux's event size limit.
const ENTRIES_EVENT_BUDGET: usize = 48 * 1024;

/// Runs blocking filesystem work off the runtime thread.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, AgentError> + Send + 'static) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|err| Err(AgentError::new(ErrorKind::Internal, format!("filesystem task failed: {err}"))))
}

pub fn entry(path: &Path, meta: &Metadata) -> FileEntry {
    let file_type = meta.file_type();
    let kind = if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Dir
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let symlink_target = match kind {
        FileKind::Symlink => fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned()),
        _ => None,
    };
    FileEntry {
        path: path.to_string_lossy().into_owned(),
        name: path.file_name().map_or_else(|| path.to_string_lossy(), |n| n.to_string_lossy()).into_owned(),
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        modified: meta.mtime(),
        symlink_target,
    }
}

/// Describes the path itself (a symlink is reported as a symlink, with its target).
pub async fn stat(user: &UserEntry, path: &str) -> Result<FileEntry, AgentError> {
    let path = user.resolve_path(path);
    blocking(move || {
        let meta = fs::symlink_metadata(&path).context(path.display())?;
        Ok(entry(&path, &meta))
    })
    .await
}

/// Answers `Entry`, then the contents as DATA.
pub async fn read_file(user: &UserEntry, path: &str, tx: &mut StreamSender) -> Result<(), AgentError> {
    let path = user.resolve_path(path);
    let opened = path.clone();
    let (file, meta) = blocking(move || {
        let shown = opened.display().to_string();
        // Checked before opening: opening a FIFO would block until someone writes to it.
        let meta = fs::metadata(&opened).context(&shown)?;
        if meta.is_dir() {
            return Err(AgentError::new(ErrorKind::IsADirectory, format!("is a directory: {shown}")));
        }
        if meta.file_type().is_fifo() || meta.file_type().is_socket() {
            return Err(AgentError::invalid(format!("not a regular file: {shown}")));
        }
        let file = fs::File::open(&opened).context(&shown)?;
        let meta = file.metadata().context(&shown)?;
        Ok((file, meta))
    })
    .await?;
    tx.send_event(&Event::Entry(entry(&path, &meta))).await?;
    let mut file = tokio::fs::File::from_std(file);
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = file.read(&mut buf).await.context(path.display())?;
        if n == 0 {
            return Ok(());
        }
        tx.send_data(CHANNEL_FILE, &buf[..n]).await?;
    }
}

/// Streams the client's DATA into `path` (created with parents, owned by `user`).
pub async fn write_file(
    user: &UserEntry,
    path: &str,
    mode: Option<u32>,
    append: bool,
    rx: &mut StreamReceiver,
) -> Result<FileEntry, AgentError> {
    let path = user.resolve_path(path);
    let (uid, gid) = (user.uid, user.gid);
    let target = path.clone();
    let file = blocking(move || open_for_write(&target, mode, append, uid, gid).context(target.display())).await?;
    let mut file = tokio::fs::File::from_std(file);
    loop {
        match rx.recv().await {
            Some(Ok(Message::Data { bytes, .. })) => file.write_all(&bytes).await.context(path.display())?,
            Some(Ok(Message::Event(_))) => {}
            None => break,
            Some(Err(err)) => return Err(err.into()),
        }
    }
    // tokio's File writes in the background; errors such as ENOSPC surface here.
    file.flush().await.context(path.display())?;
    let meta = file.metadata().await.context(path.display())?;
    Ok(entry(&path, &meta))
}

fn open_for_write(path: &Path, mode: Option<u32>, append: bool, uid: u32, gid: u32) -> io::Result<fs::File> {
    if let Some(parent) = path.parent() {
        create_dirs_owned(parent, uid, gid)?;
    }
    let mut options = OpenOptions::new();
    options.write(true).custom_flags(libc::O_NOCTTY);
    if append {
        options.append(true);
    }
    let file = match options.clone().create_new(true).open(path) {
        Ok(file) => {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            file
        }
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => options.truncate(!append).open(path)?,
        Err(err) => return Err(err),
    };
    if let Some(mode) = mode {
        file.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
    }
    Ok(file)
}

/// `mkdir -p` that gives every directory it creates to `uid`/`gid`. Returns whether `dir`
/// itself was created.
fn create_dirs_owned(dir: &Path, uid: u32, gid: u32) -> io::Result<bool> {
    let mut missing = Vec::new();
    let mut current = Some(dir);
    while let Some(path) = current {
        match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => missing.push(path),
            Err(err) => return Err(err),
        }
        current = path.parent();
    }
    let created = !missing.is_empty();
    for path in missing.into_iter().rev() {
        match fs::create_dir(path) {
            Ok(()) => std::os::unix::fs::chown(path, Some(uid), Some(gid))?,
            // Someone else made it meanwhile; fine as long as it is a directory.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
            Err(err) => return Err(err),
        }
    }
    Ok(created)
}

/// `mkdir -p`. `None` if the directory already existed.
pub async fn make_dir(user: &UserEntry, path: &str) -> Result<Option<FileEntry>, AgentError> {
    let path = user.resolve_path(path);
    let (uid, gid) = (user.uid, user.gid);
    blocking(move || {
        let shown = path.display().to_string();
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => return Ok(None),
            Ok(_) => return Err(AgentError::new(ErrorKind::AlreadyExists, format!("already exists: {shown}"))),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(AgentError::io(shown, &err)),
        }
        create_dirs_owned(&path, uid, gid).context(&shown)?;
        let meta = fs::symlink_metadata(&path).context(&shown)?;
        Ok(Some(entry(&path, &meta)))
    })
    .await
}

/// Removes a file, a symlink (not its target) or a whole directory tree.
pub async fn remove(user: &UserEntry, path: &str) -> Result<(), AgentError> {
    let path = user.resolve_path(path);
    blocking(move || {
        let meta = fs::symlink_metadata(&path).context(path.display())?;
        if meta.is_dir() {
            fs::remove_dir_all(&path).context(path.display())
        } else {
            fs::remove_file(&path).context(path.display())
        }
    })
    .await
}

pub async fn rename(user: &UserEntry, from: &str, to: &str) -> Result<FileEntry, AgentError> {
    let (from, to) = (user.resolve_path(from), user.resolve_path(to));
    blocking(move || {
        fs::rename(&from, &to).context(format!("{} -> {}", from.display(), to.display()))?;
        let meta = fs::symlink_metadata(&to).context(to.display())?;
        Ok(entry(&to, &meta))
    })
    .await
}

/// Answers one or more `Entries` events: the directory's children, `depth` levels deep.
///
/// Walks on the blocking pool and streams batches, so a huge tree never sits in memory.
pub async fn list_dir(user: &UserEntry, path: &str, depth: u32, tx: &mut StreamSender) -> Result<(), AgentError> {
    let root = user.resolve_path(path);
    let (batches_tx, mut batches) = mpsc::channel::<Result<Vec<FileEntry>, AgentError>>(2);
    tokio::task::spawn_blocking(move || {
        let result = walk(&root, depth.max(1), &batches_tx);
        if let Err(err) = result {
            let _ = batches_tx.blocking_send(Err(err));
        }
    });
    let mut sent_any = false;
    while let Some(batch) = batches.recv().await {
        tx.send_event(&Event::Entries { entries: batch? }).await?;
        sent_any = true;
    }
    if !sent_any {
        tx.send_event(&Event::Entries { entries: Vec::new() }).await?;
    }
    Ok(())
}

fn walk(root: &Path, depth: u32, out: &mpsc::Sender<Result<Vec<FileEntry>, AgentError>>) -> Result<(), AgentError> {
    let meta = fs::metadata(root).context(root.display())?;
    if !meta.is_dir() {
        return Err(AgentError::new(ErrorKind::NotADirectory, format!("not a directory: {}", root.display())));
    }
    let mut batch = Vec::new();
    let mut batch_size = 0;
    let mut pending: Vec<(PathBuf, u32)> = vec![(root.to_path_buf(), depth)];
    while let Some((dir, remaining)) = pending.pop() {
        let listing = match fs::read_dir(&dir) {
            Ok(listing) => listing,
            // The root must be readable; an unreadable subdirectory is just not descended.
            Err(err) if dir == root => return Err(AgentError::io(dir.display(), &err)),
            Err(_) => continue,
        };
        for child in listing.flatten() {
            // DirEntry::metadata does not follow symlinks, so links are listed, never walked.
            let Ok(meta) = child.metadata() else { continue };
            let path = child.path();
            if meta.is_dir() && remaining > 1 {
                pending.push((path.clone(), remaining - 1));
            }
            let item = entry(&path, &meta);
            let size = serde_json::to_vec(&item).map_or(0, |v| v.len() + 1);
            if batch_size + size > ENTRIES_EVENT_BUDGET && !batch.is_empty() {
                if out.blocking_send(Ok(std::mem::take(&mut batch))).is_err() {
                    return Ok(()); // The client went away.
                }
                batch_size = 0;
            }
            batch_size += size;
            batch.push(item);
        }
    }
    if !batch.is_empty() {
        let _ = out.blocking_send(Ok(batch));
    }
    Ok(())
}
