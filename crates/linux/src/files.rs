//! The bounded reader of files that others wrote: kernel files under `/proc`
//! and `/sys` (or copies of them given as `--proc-root`/`--sys-root`), lab
//! specs and class rules. A hostile or mistaken path (`/dev/zero`, a FIFO,
//! a 90 MB spec) must cost a bounded amount and fail with one line naming
//! the file and the limit, never read until memory or patience runs out.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// What small kernel files (a `/sys` attribute, `/proc/PID/stat`) may hold.
pub const SMALL_FILE: u64 = 1 << 20;
/// What larger kernel files (`/proc/PID/maps` of a big process, `numa_maps`,
/// `/proc/net/unix` on a busy host) may hold.
pub const LARGE_FILE: u64 = 64 << 20;

/// What kind of file `path` is when it is not a regular one ("a FIFO (named
/// pipe)", "a character device", ...); `None` for a regular file.
pub fn special_kind(t: std::fs::FileType) -> Option<&'static str> {
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// The bytes of the regular file `path` (symbolic links followed), at most
/// `max` of them. Anything else fails at once: a FIFO is refused before it
/// is opened (opening one blocks until a writer comes), a device or a
/// directory too, with [`io::ErrorKind::InvalidInput`] and a message naming
/// the kind of file; a longer file fails with [`io::ErrorKind::InvalidData`]
/// naming the limit, after reading only `max + 1` bytes.
pub fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let m = std::fs::metadata(path)?;
    if let Some(kind) = special_kind(m.file_type()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {kind}, not a regular file"),
        ));
    }
    let f = File::open(path)?;
    // Kernel files say 0 or 4096 bytes whatever they hold: read, don't trust the size.
    let mut buf = Vec::with_capacity(m.len().min(max) as usize);
    f.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "is larger than {}, the most vmscope reads from such a file",
                human(max)
            ),
        ));
    }
    Ok(buf)
}

/// What a file the user names as an input (a lab spec, class rules) may
/// hold: such files are a few KiB.
pub const INPUT_FILE: u64 = 1 << 20;

/// A text file the user names as an input: a regular file, or a pipe
/// (`/dev/stdin`, a FIFO someone writes to), of at most `max` bytes; a
/// device, directory or socket is refused before it is opened.
pub fn read_input(path: &Path, max: u64) -> io::Result<String> {
    let m = std::fs::metadata(path)?;
    let t = m.file_type();
    if let Some(kind) = special_kind(t).filter(|_| !t.is_fifo()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {kind}, not a regular file or a pipe"),
        ));
    }
    let mut buf = Vec::new();
    File::open(path)?.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "is larger than {}, the most vmscope reads from it",
                human(max)
            ),
        ));
    }
    String::from_utf8(buf)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

/// [`read_bounded`] as UTF-8 text (invalid UTF-8 is an
/// [`io::ErrorKind::InvalidData`] error, as `read_to_string` has it).
pub fn read_bounded_string(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, max)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

/// An exclusive lock on a file that names its holder: an `flock` on `PATH`
/// holding the holder's pid and command line, taken without waiting, and
/// removed (while still held) when dropped. A second taker learns who holds
/// it from the kernel's lock table (`/proc/locks`), never by waiting: the
/// one-writer lock of a session, and the lock of a lab while `up` or
/// `down` works on it.
#[derive(Debug)]
pub struct PidLock {
    _file: File,
    path: std::path::PathBuf,
}

/// Who holds a [`PidLock`]: the pid (when `/proc/locks` says) and the
/// command line it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    pub pid: Option<u32>,
    pub command: String,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.pid, self.command.is_empty()) {
            (Some(p), false) => write!(f, "process {p} ({})", self.command),
            (Some(p), true) => write!(f, "process {p}"),
            (None, _) => write!(f, "another process"),
        }
    }
}

impl PidLock {
    /// Take the lock on `path`, or `Err(Ok(holder))` when another process
    /// holds it, `Err(Err(io))` when the file cannot be opened.
    pub fn acquire(
        path: &Path,
        command_line: &str,
    ) -> Result<PidLock, Result<LockHolder, io::Error>> {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        for _ in 0..10 {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(path)
                .map_err(Err)?;
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(Err(e));
                }
                return Err(Ok(holder(path).unwrap_or(LockHolder {
                    pid: None,
                    command: String::new(),
                })));
            }
            // The holder before us may have removed the file between our
            // open and our flock: then we hold a lock on a dead inode.
            let ours = file.metadata().ok();
            let now = std::fs::metadata(path).ok();
            match (ours, now) {
                (Some(a), Some(b)) if a.dev() == b.dev() && a.ino() == b.ino() => {}
                _ => continue,
            }
            let mut file = file;
            let _ = file.set_len(0);
            let _ = write!(file, "{}\n{}\n", std::process::id(), command_line);
            return Ok(PidLock {
                _file: file,
                path: path.to_path_buf(),
            });
        }
        Err(Ok(LockHolder {
            pid: None,
            command: String::new(),
        }))
    }
}

impl Drop for PidLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock; the descriptor closes after.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Who holds the [`PidLock`] on `path` now, if anyone: from the kernel's
/// lock table, without taking the lock.
pub fn holder(path: &Path) -> Option<LockHolder> {
    let m = std::fs::metadata(path).ok()?;
    // The kernel lists its locks a page per read, by position: an entry
    // before ours that goes away between two pages makes the listing skip
    // ours (with the tests' SQLite locks coming and going beside it, a held
    // lock was missed so about once in ten CI runs). Not found, it is read
    // again, up to ten times in all, yielding between reads so that the
    // churn in front of ours moves on (three reads in a row still missed
    // it once in 3 000 listings in CI, under the test's churn: a skip is
    // likelier right after one).
    for i in 0..10 {
        if i > 0 {
            std::thread::yield_now();
        }
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        if let Some(h) = holder_in(&locks, path, &m) {
            return Some(h);
        }
    }
    None
}

fn holder_in(locks: &str, path: &Path, m: &std::fs::Metadata) -> Option<LockHolder> {
    use std::os::unix::fs::MetadataExt;
    let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
    for line in locks.lines() {
        // "1: FLOCK  ADVISORY  WRITE 1234 00:1f:5678 0 EOF"
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        let id: Vec<&str> = f[5].split(':').collect();
        if id.len() != 3 {
            continue;
        }
        let same = u32::from_str_radix(id[0], 16).ok() == Some(major)
            && u32::from_str_radix(id[1], 16).ok() == Some(minor)
            && id[2].parse::<u64>().ok() == Some(m.ino());
        if same {
            let pid = f[4].parse().ok()?;
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let command = text.lines().nth(1).unwrap_or("").to_string();
            return Some(LockHolder {
                pid: Some(pid),
                command,
            });
        }
    }
    None
}

fn human(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held lock is found while other locks come and go in front of it
    /// in the kernel's list (150 held before it, two threads taking and
    /// dropping 50 more): read once, the listing missed it about 1 % of
    /// the time.
    #[test]
    fn a_held_lock_is_found_while_others_come_and_go() {
        use std::os::fd::AsRawFd;
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let flock = |f: &File, op| {
            // SAFETY: flock on a file descriptor this test owns.
            unsafe { libc::flock(f.as_raw_fd(), op) }
        };
        let steady: Vec<File> = (0..150)
            .map(|i| {
                let f = File::create(dir.path().join(format!("k{i}"))).unwrap();
                assert_eq!(flock(&f, libc::LOCK_EX), 0);
                f
            })
            .collect();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let churn: Vec<_> = (0..2)
            .map(|t| {
                let files: Vec<File> = (0..50)
                    .map(|i| File::create(dir.path().join(format!("c{t}-{i}"))).unwrap())
                    .collect();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        for f in &files {
                            // SAFETY: as above.
                            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
                        }
                        for f in &files {
                            // SAFETY: as above.
                            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
                        }
                    }
                })
            })
            .collect();
        let ours = dir.path().join("ours.lock");
        let _held = PidLock::acquire(&ours, "the test").unwrap();
        let missed = (0..3000).filter(|_| holder(&ours).is_none()).count();
        stop.store(true, Ordering::Relaxed);
        for t in churn {
            t.join().unwrap();
        }
        drop(steady);
        assert_eq!(missed, 0, "the held lock was missed {missed} times in 3000");
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_without_reading() {
        let e = read_bounded(Path::new("/dev/zero"), SMALL_FILE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("character device"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = read_bounded(dir.path(), SMALL_FILE).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // Would block forever if it were opened.
        let e = read_bounded(&fifo, SMALL_FILE).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn inputs_may_be_pipes_but_not_devices() {
        let e = read_input(Path::new("/dev/zero"), INPUT_FILE).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let mut child = std::process::Command::new("sh")
            .args(["-c", "printf 'name = \"x\"\n'"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(child.stdout.as_ref().unwrap());
        let text = read_input(Path::new(&format!("/proc/self/fd/{fd}")), INPUT_FILE).unwrap();
        assert_eq!(text, "name = \"x\"\n");
        child.wait().unwrap();
    }

    #[test]
    fn a_pid_lock_names_its_holder_and_goes_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        let held = PidLock::acquire(&p, "vmscope lab up x.toml").unwrap();
        let who = PidLock::acquire(&p, "second").unwrap_err().unwrap();
        assert_eq!(who.pid, Some(std::process::id()));
        assert_eq!(
            who.to_string(),
            format!("process {} (vmscope lab up x.toml)", std::process::id())
        );
        assert_eq!(holder(&p), Some(who));
        drop(held);
        assert!(!p.exists());
        assert!(holder(&p).is_none());
        let _again = PidLock::acquire(&p, "third").unwrap();
    }

    #[test]
    fn files_over_the_limit_fail_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big");
        std::fs::write(&p, vec![b'x'; 4097]).unwrap();
        let e = read_bounded(&p, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("4 KiB"), "{e}");
        assert_eq!(read_bounded(&p, 4097).unwrap().len(), 4097);
        // Kernel files report a size they do not have.
        assert!(
            !read_bounded_string(Path::new("/proc/self/stat"), SMALL_FILE)
                .unwrap()
                .is_empty()
        );
    }
}
