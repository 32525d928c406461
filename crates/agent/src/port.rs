//! The agent's channel: finding the virtio-serial port by name under
//! `/sys/class/virtio-ports`, opening it non-blocking, and the stdio variant.
//! (A vsock channel would add a listening `AF_VSOCK` socket here; the event
//! loop only needs a readable and a writable fd.)

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The device of the virtio-serial port called `name`: `/dev/<dir>` for the
/// first `<sys_root>/class/virtio-ports/<dir>/name` whose content is `name`.
pub fn find_port(sys_root: &Path, name: &str) -> Option<PathBuf> {
    let dir = sys_root.join("class/virtio-ports");
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    entries.into_iter().find_map(|e| {
        let text = std::fs::read(e.path().join("name")).ok()?;
        let got = String::from_utf8_lossy(&text);
        (got.trim_end_matches(['\n', '\0']) == name)
            .then(|| PathBuf::from("/dev").join(e.file_name()))
    })
}

/// Opens `path` read-write, non-blocking, close-on-exec; a terminal (pty,
/// hvc console) is switched to raw mode so bytes pass unchanged.
pub fn open_port(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: valid C string; flags are plain constants.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    make_raw_if_tty(fd.as_raw_fd())?;
    Ok(fd)
}

fn make_raw_if_tty(fd: RawFd) -> io::Result<()> {
    // SAFETY: isatty only inspects the fd.
    if unsafe { libc::isatty(fd) } != 1 {
        return Ok(());
    }
    // SAFETY: termios is plain old data, filled by tcgetattr.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and pointer.
    if unsafe { libc::tcgetattr(fd, &raw mut t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: valid pointer.
    unsafe { libc::cfmakeraw(&raw mut t) };
    // SAFETY: valid fd and pointer.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw const t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets O_NONBLOCK on an fd the agent did not open (stdin/stdout).
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a caller-provided fd; no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_port_by_name_in_a_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("vmscope-agent-sys-{}", std::process::id()));
        let ports = root.join("class/virtio-ports");
        for (dir, name) in [
            ("vport0p1", "org.qemu.guest_agent.0\n"),
            ("vport1p1", "vmscope.agent\n"),
        ] {
            std::fs::create_dir_all(ports.join(dir)).unwrap();
            std::fs::write(ports.join(dir).join("name"), name).unwrap();
        }
        std::fs::create_dir_all(ports.join("vport2p1")).unwrap();
        assert_eq!(
            find_port(&root, "vmscope.agent"),
            Some(PathBuf::from("/dev/vport1p1"))
        );
        assert_eq!(find_port(&root, "other"), None);
        assert_eq!(find_port(&root.join("absent"), "vmscope.agent"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
