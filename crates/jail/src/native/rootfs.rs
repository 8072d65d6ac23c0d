//! Builds a sandbox's root filesystem inside its own mount namespace, then pivots into it.
//!
//! Layout: a size-limited tmpfs (the disk quota) holds the overlay's upper and work dirs; the
//! overlay's lower dir is the template; host `/usr` (and `/bin`, `/lib*`, `/sbin` where they
//! are not symlinks) are bound read-only on top; `/etc` is synthesized plus a small allow-list
//! of host files; fresh `/proc` with sensitive paths masked; a minimal `/dev`; no `/sys`.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{symlink, PermissionsExt};

use rustix::fs::OFlags;
use std::path::{Path, PathBuf};

use rustix::mount::{mount, mount_bind, mount_bind_recursive, mount_change, mount_remount, unmount, MountFlags, MountPropagationFlags, UnmountFlags};

use crate::{JailError, Volume, SANDBOX_HOME, SANDBOX_UID};

/// Host directories that appear read-only inside (or as the same symlink, on merged-usr hosts).
const HOST_SYSTEM_DIRS: [&str; 5] = ["usr", "bin", "lib", "lib64", "sbin"];
/// Host /etc entries copied (files) or bound read-only (directories) into the sandbox.
/// (`matplotlibrc`: Debian's matplotlib refuses to import without it; `fonts`: fontconfig.)
const ETC_ALLOW_LIST: [&str; 10] = [
    "ssl/certs",
    "ca-certificates.conf",
    "ld.so.cache",
    "alternatives",
    "localtime",
    "timezone",
    "bash.bashrc",
    "profile",
    "matplotlibrc",
    "fonts",
];
/// The allow-listed entries that are directories, bound read-only once the overlay is up.
const ETC_BOUND_DIRS: [&str; 3] = ["ssl/certs", "alternatives", "fonts"];
/// Under /proc: files hidden behind /dev/null, dirs made read-only, dirs hidden behind tmpfs.
const PROC_MASKED_FILES: [&str; 7] =
    ["kcore", "kallsyms", "sysrq-trigger", "timer_list", "sched_debug", "keys", "latency_stats"];
const PROC_READ_ONLY_DIRS: [&str; 4] = ["sys", "bus", "irq", "fs"];
const PROC_EMPTY_DIRS: [&str; 2] = ["acpi", "scsi"];
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

pub struct RootfsPlan<'a> {
    /// An empty host directory to mount the sandbox's tmpfs on (in the private namespace).
    pub staging: &'a Path,
    /// The template's read-only layer.
    pub lower: &'a Path,
    pub disk_bytes: u64,
    pub volumes: &'a [Volume],
    pub hostname: &'a str,
}

fn os(op: &str, path: &Path, err: impl Into<std::io::Error>) -> JailError {
    JailError::os(format!("{op} {}", path.display()), err)
}

/// Creates a directory with exactly `mode` (the umask is 0 while the root is built).
fn mkdir(path: &Path, mode: u32) -> Result<(), JailError> {
    use std::os::unix::fs::DirBuilderExt;
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| os("chmod", path, e))
        }
        Err(e) => Err(os("mkdir", path, e)),
    }
}

/// `mount(2)` for a filesystem with string options.
fn mount_fs(source: &str, target: impl AsRef<Path>, fstype: &str, flags: MountFlags, data: &str) -> std::io::Result<()> {
    let data = std::ffi::CString::new(data).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    mount(source, target.as_ref(), fstype, flags, Some(data.as_c_str())).map_err(std::io::Error::from)
}

const RO_BIND: MountFlags = MountFlags::RDONLY.union(MountFlags::NOSUID).union(MountFlags::NODEV);

/// Binds `source` on `target` and makes the bind read-only, nosuid and nodev.
fn bind_read_only(source: &Path, target: &Path, extra: MountFlags) -> Result<(), JailError> {
    mount_bind_recursive(source, target).map_err(|e| os("bind", target, e))?;
    mount_remount(target, MountFlags::BIND | RO_BIND | extra, "").map_err(|e| os("remount read-only", target, e))
}

/// Runs in the sandbox init, as root of its user namespace, before anything else exists inside.
/// Returns a descriptor of the overlay's upper dir (see `launch::ChildContext`).
pub fn build(plan: &RootfsPlan<'_>) -> Result<Option<OwnedFd>, JailError> {
    let umask = rustix::process::umask(rustix::fs::Mode::empty());
    let result = build_tree(plan);
    rustix::process::umask(umask);
    result
}

fn build_tree(plan: &RootfsPlan<'_>) -> Result<Option<OwnedFd>, JailError> {
    mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
        .map_err(|e| os("make private", Path::new("/"), e))?;
    let staging = plan.staging;
    let data = format!("size={},mode=0755", plan.disk_bytes);
    mount_fs("tmpfs", staging, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, data.as_str())
        .map_err(|e| os("mount disk tmpfs", staging, e))?;
    let (upper, work, root) = (staging.join("upper"), staging.join("work"), staging.join("root"));
    for dir in [&upper, &work, &root] {
        mkdir(dir, 0o755)?;
    }
    // Writing the skeleton straight into the upper dir is much cheaper than through overlayfs.
    populate(&upper, plan.hostname)?;
    // After pivot_root the tmpfs is detached from every tree; this descriptor keeps it
    // reachable for snapshots. CLOEXEC: no sandbox process may inherit it.
    let upper_fd = rustix::fs::open(&upper, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| os("open", &upper, e))?;
    mount_overlay(plan.lower, &upper, &work, &root)?;
    bind_host_dirs(&root)?;
    mount_proc(&root)?;
    mount_dev(&root)?;
    for volume in plan.volumes {
        mount_volume(&root, volume)?;
    }
    pivot(&root)?;
    rustix::system::sethostname(plan.hostname.as_bytes()).map_err(|e| JailError::os("sethostname", e))?;
    Ok(Some(upper_fd))
}

fn mount_overlay(lower: &Path, upper: &Path, work: &Path, root: &Path) -> Result<(), JailError> {
    for path in [lower, upper, work] {
        if path.to_string_lossy().contains([',', ':', '\\']) {
            return Err(JailError::Config(format!("path {} may not contain , : or \\", path.display())));
        }
    }
    let base = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
    let flags = MountFlags::NOSUID | MountFlags::NODEV;
    // Inside a user namespace overlayfs stores its metadata in user.* xattrs.
    let with_userxattr = format!("{base},userxattr");
    mount_fs("overlay", root, "overlay", flags, with_userxattr.as_str())
        .or_else(|_| mount_fs("overlay", root, "overlay", flags, base.as_str()))
        .map_err(|e| os("mount overlay", root, e))
}

fn populate(root: &Path, hostname: &str) -> Result<(), JailError> {
    for (dir, mode) in [
        ("proc", 0o555),
        ("dev", 0o755),
        ("etc", 0o755),
        ("tmp", 0o1777),
        ("home", 0o755),
        ("root", 0o700),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("run", 0o755),
        ("opt", 0o755),
        ("mnt", 0o755),
        ("srv", 0o755),
    ] {
        mkdir(&root.join(dir), mode)?;
    }
    let home = root.join(SANDBOX_HOME.trim_start_matches('/'));
    mkdir(&home, 0o750)?;
    rustix::fs::chown(&home, Some(uid(SANDBOX_UID)), Some(gid(SANDBOX_UID))).map_err(|e| os("chown", &home, e))?;
    for name in HOST_SYSTEM_DIRS {
        let host = Path::new("/").join(name);
        let inside = root.join(name);
        match fs::read_link(&host) {
            Ok(target) => symlink(&target, &inside).map_err(|e| os("symlink", &inside, e))?,
            Err(_) if host.is_dir() => mkdir(&inside, 0o755)?,
            Err(_) => {}
        }
    }
    write_etc(root, hostname)
}

/// Binds the host's system directories (those that are not symlinks) read-only.
fn bind_host_dirs(root: &Path) -> Result<(), JailError> {
    for name in HOST_SYSTEM_DIRS {
        let host = Path::new("/").join(name);
        if fs::symlink_metadata(&host).map(|m| m.is_dir()).unwrap_or(false) {
            bind_read_only(&host, &root.join(name), MountFlags::empty())?;
        }
    }
    for entry in ETC_BOUND_DIRS {
        let host = Path::new("/etc").join(entry);
        let inside = root.join("etc").join(entry);
        if inside.is_dir() && host.is_dir() {
            bind_read_only(&host, &inside, MountFlags::NOEXEC)?;
        }
    }
    Ok(())
}

fn uid(id: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(id)
}

fn gid(id: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(id)
}

fn write_file(path: &Path, contents: &str) -> Result<(), JailError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(path).map_err(|e| os("create", path, e))?;
    file.write_all(contents.as_bytes()).map_err(|e| os("write", path, e))
}

fn write_etc(root: &Path, hostname: &str) -> Result<(), JailError> {
    let etc = root.join("etc");
    write_file(
        &etc.join("passwd"),
        &format!(
            "root:x:0:0:root:/root:/bin/bash\nuser:x:{SANDBOX_UID}:{SANDBOX_UID}:user:{SANDBOX_HOME}:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
    )?;
    write_file(
        &etc.join("group"),
        &format!("root:x:0:\ntty:x:5:\nuser:x:{SANDBOX_UID}:\nnogroup:x:65534:\n"),
    )?;
    write_file(&etc.join("hostname"), &format!("{hostname}\n"))?;
    write_file(
        &etc.join("hosts"),
        &format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"),
    )?;
    write_file(&etc.join("nsswitch.conf"), "passwd: files\ngroup: files\nshadow: files\nhosts: files\n")?;
    for entry in ETC_ALLOW_LIST {
        let host = Path::new("/etc").join(entry);
        let inside = etc.join(entry);
        let Ok(meta) = fs::symlink_metadata(&host) else { continue };
        if let Some(parent) = inside.parent() {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new().recursive(true).mode(0o755).create(parent).map_err(|e| os("mkdir", parent, e))?;
        }
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&host).map_err(|e| os("readlink", &host, e))?;
            symlink(&target, &inside).map_err(|e| os("symlink", &inside, e))?;
        } else if meta.is_dir() {
            mkdir(&inside, 0o755)?;
        } else if meta.is_file() {
            fs::copy(&host, &inside).map_err(|e| os("copy", &host, e))?;
        }
    }
    Ok(())
}

fn mount_proc(root: &Path) -> Result<(), JailError> {
    let proc = root.join("proc");
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    mount_fs("proc", &proc, "proc", flags, "").map_err(|e| os("mount proc", &proc, e))?;
    for name in PROC_MASKED_FILES {
        let path = proc.join(name);
        if path.exists() {
            mount_bind("/dev/null", &path).map_err(|e| os("mask", &path, e))?;
        }
    }
    for name in PROC_READ_ONLY_DIRS {
        let path = proc.join(name);
        if path.exists() {
            bind_read_only(&path, &path, MountFlags::NOEXEC)?;
        }
    }
    for name in PROC_EMPTY_DIRS {
        let path = proc.join(name);
        if path.exists() {
            mount_fs("tmpfs", &path, "tmpfs", flags | MountFlags::RDONLY, "size=0").map_err(|e| os("mask", &path, e))?;
        }
    }
    Ok(())
}

fn mount_dev(root: &Path) -> Result<(), JailError> {
    let dev = root.join("dev");
    mount_fs("tmpfs", &dev, "tmpfs", MountFlags::NOSUID | MountFlags::NOEXEC, "size=64k,mode=0755")
        .map_err(|e| os("mount /dev", &dev, e))?;
    // Device nodes cannot be created in a user namespace; bind the host's harmless ones.
    for name in DEVICES {
        let node = dev.join(name);
        fs::File::create(&node).map_err(|e| os("create", &node, e))?;
        mount_bind(Path::new("/dev").join(name), &node).map_err(|e| os("bind device", &node, e))?;
    }
    let pts = dev.join("pts");
    let shm = dev.join("shm");
    mkdir(&pts, 0o755)?;
    mkdir(&shm, 0o1777)?;
    mount_fs("devpts", &pts, "devpts", MountFlags::NOSUID | MountFlags::NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5")
        .map_err(|e| os("mount devpts", &pts, e))?;
    mount_fs("tmpfs", &shm, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, "size=64m,mode=1777")
        .map_err(|e| os("mount /dev/shm", &shm, e))?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(link)).map_err(|e| os("symlink", &dev.join(link), e))?;
    }
    Ok(())
}

fn mount_volume(root: &Path, volume: &Volume) -> Result<(), JailError> {
    let host = Path::new(&volume.host);
    if !host.is_dir() {
        return Err(JailError::Config(format!("volume source {} is not a directory", volume.host)));
    }
    let target: PathBuf = root.join(volume.path.trim_start_matches('/'));
    {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new().recursive(true).mode(0o755).create(&target).map_err(|e| os("mkdir", &target, e))?;
    }
    if volume.read_only {
        bind_read_only(host, &target, MountFlags::empty())
    } else {
        mount_bind_recursive(host, &target).map_err(|e| os("bind volume", &target, e))
    }
}

/// Makes `root` the new `/` and drops every reference to the host's tree.
fn pivot(root: &Path) -> Result<(), JailError> {
    rustix::process::chdir(root).map_err(|e| os("chdir", root, e))?;
    rustix::process::pivot_root(".", ".").map_err(|e| os("pivot_root", root, e))?;
    // The old root is now stacked on top of the new one; detach it.
    unmount(".", UnmountFlags::DETACH).map_err(|e| os("detach old root", root, e))?;
    rustix::process::chdir("/").map_err(|e| os("chdir", Path::new("/"), e))
}
