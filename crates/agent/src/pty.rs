//! Pseudo-terminals for `Exec { pty }`.

use std::io;
use std::os::fd::OwnedFd;

use corral_proto::PtySize;
use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

pub struct Pty {
    /// Our end: nonblocking, read for output and written for input.
    pub master: OwnedFd,
    /// The child's terminal; close it in the agent once the child has it.
    pub slave: OwnedFd,
}

pub fn winsize(size: PtySize) -> Winsize {
    Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 }
}

/// Opens a terminal of `size` whose slave belongs to `uid`/`gid`, as a login would leave it.
pub fn open(size: PtySize, uid: u32, gid: u32) -> io::Result<Pty> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    // TIOCGPTPEER needs no path lookup, so it works whatever is mounted at /dev/pts.
    let slave = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Ok(slave) => slave,
        Err(_) => {
            let name = rustix::pty::ptsname(&master, Vec::new())?;
            rustix::fs::open(name.as_c_str(), OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())?
        }
    };
    rustix::termios::tcsetwinsize(&master, winsize(size))?;
    // Best effort: only matters to programs like `mesg` or `write`.
    let _ = std::os::unix::fs::fchown(&slave, Some(uid), Some(gid));
    rustix::io::ioctl_fionbio(&master, true)?;
    Ok(Pty { master, slave })
}
