//! Rooted reads of a `/proc` tree (the real one or a test fixture): process
//! and thread lists, `comm`, `cmdline`, `exe`, `stat`, open fds and their
//! `fdinfo`, and the Unix socket table. Nothing here knows about QEMU.
//!
//! Every reader returns `io::Result` and never panics on odd contents: a
//! process can exit between two reads, and its files then vanish.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A `/proc` tree rooted at `root` (normally `/proc`).
#[derive(Debug, Clone)]
pub struct ProcRoot {
    root: PathBuf,
}

/// True for errors meaning "the process or thread is gone": the entry
/// vanished (`ENOENT`) or the task exited while being read (`ESRCH`).
pub fn is_vanished(e: &io::Error) -> bool {
    const ESRCH: i32 = 3;
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(ESRCH)
}

impl ProcRoot {
    pub fn new(root: impl Into<PathBuf>) -> ProcRoot {
        ProcRoot { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<pid>/<rel>`.
    pub fn pid_path(&self, pid: u32, rel: &str) -> PathBuf {
        let p = self.root.join(pid.to_string());
        if rel.is_empty() {
            p
        } else {
            p.join(rel)
        }
    }

    /// Numeric entries of the root (thread-group leaders and kernel
    /// threads), sorted.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        numeric_entries(&self.root)
    }

    /// Thread ids of a process (`<root>/<pid>/task`), sorted.
    pub fn tids(&self, pid: u32) -> io::Result<Vec<u32>> {
        numeric_entries(&self.pid_path(pid, "task"))
    }

    /// `comm` of a process, without the trailing newline.
    pub fn comm(&self, pid: u32) -> io::Result<String> {
        read_comm(&self.pid_path(pid, "comm"))
    }

    /// `comm` of one thread of a process.
    pub fn thread_comm(&self, pid: u32, tid: u32) -> io::Result<String> {
        read_comm(&self.pid_path(pid, &format!("task/{tid}/comm")))
    }

    /// Arguments from `cmdline` (NUL-separated). Empty for kernel threads
    /// and zombies.
    pub fn cmdline(&self, pid: u32) -> io::Result<Vec<String>> {
        let raw = fs::read(self.pid_path(pid, "cmdline"))?;
        Ok(split_cmdline(&raw))
    }

    /// Target of the `exe` link, without the ` (deleted)` suffix the kernel
    /// adds once the binary was replaced on disk.
    pub fn exe(&self, pid: u32) -> io::Result<PathBuf> {
        let target = fs::read_link(self.pid_path(pid, "exe"))?;
        let s = target.to_string_lossy();
        Ok(match s.strip_suffix(" (deleted)") {
            Some(stripped) => PathBuf::from(stripped),
            None => target,
        })
    }

    /// Target of the `cwd` link.
    pub fn cwd(&self, pid: u32) -> io::Result<PathBuf> {
        fs::read_link(self.pid_path(pid, "cwd"))
    }

    /// Parent pid from `stat` (field 4, after the parenthesized comm, which
    /// may itself contain spaces and parentheses).
    pub fn ppid(&self, pid: u32) -> io::Result<u32> {
        let path = self.pid_path(pid, "stat");
        let s = fs::read_to_string(&path)?;
        parse_stat_ppid(&s).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no parent pid", path.display()),
            )
        })
    }

    /// Open file descriptors and their link targets (`socket:[123]`,
    /// `/dev/net/tun`, ...). Descriptors closed while listing are skipped.
    pub fn fds(&self, pid: u32) -> io::Result<Vec<(u32, PathBuf)>> {
        let dir = self.pid_path(pid, "fd");
        let mut out = Vec::new();
        for fd in numeric_entries(&dir)? {
            match fs::read_link(dir.join(fd.to_string())) {
                Ok(t) => out.push((fd, t)),
                Err(e) if is_vanished(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Link target of one descriptor.
    pub fn fd_target(&self, pid: u32, fd: u32) -> io::Result<PathBuf> {
        fs::read_link(self.pid_path(pid, &format!("fd/{fd}")))
    }

    /// The `iff:` line of a descriptor's `fdinfo`: the interface a tun/tap
    /// descriptor is attached to (printed by the tun driver since Linux 3.x).
    pub fn fd_iff(&self, pid: u32, fd: u32) -> io::Result<Option<String>> {
        let s = fs::read_to_string(self.pid_path(pid, &format!("fdinfo/{fd}")))?;
        Ok(s.lines().find_map(|l| {
            l.strip_prefix("iff:")
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        }))
    }

    /// Unix sockets bound to a path, by inode, from `<root>/<pid>/net/unix`
    /// (the process's own network namespace).
    pub fn unix_socket_paths(&self, pid: u32) -> io::Result<HashMap<u64, PathBuf>> {
        let s = fs::read_to_string(self.pid_path(pid, "net/unix"))?;
        Ok(parse_net_unix(&s))
    }
}

fn numeric_entries(dir: &Path) -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = match entry {
            Ok(e) => e,
            Err(e) if is_vanished(&e) => continue,
            Err(e) => return Err(e),
        };
        if let Some(n) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn read_comm(path: &Path) -> io::Result<String> {
    let raw = fs::read(path)?;
    let s = String::from_utf8_lossy(&raw);
    Ok(s.strip_suffix('\n').unwrap_or(&s).to_string())
}

/// Split a NUL-separated `cmdline`. A process that rewrote its argv may
/// leave no trailing NUL; empty trailing pieces are dropped.
pub fn split_cmdline(raw: &[u8]) -> Vec<String> {
    let mut args: Vec<String> = raw
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    while args.last().is_some_and(|a| a.is_empty()) {
        args.pop();
    }
    args
}

/// Parent pid from the text of `/proc/PID/stat`.
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// `/proc/net/unix`: `Num RefCount Protocol Flags Type St Inode Path`.
pub fn parse_net_unix(s: &str) -> HashMap<u64, PathBuf> {
    let mut out = HashMap::new();
    for line in s.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            continue;
        }
        let Ok(inode) = fields[6].parse::<u64>() else {
            continue;
        };
        let path = fields[7..].join(" ");
        // Abstract sockets start with '@' and have no file to connect to.
        if path.starts_with('/') {
            out.insert(inode, PathBuf::from(path));
        }
    }
    out
}

/// Inode of a `socket:[INODE]` link target.
pub fn socket_inode(target: &Path) -> Option<u64> {
    target
        .to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_ppid_survives_odd_comm() {
        assert_eq!(parse_stat_ppid("42 (a) b (c)) S 2 0 0"), Some(2));
        assert_eq!(parse_stat_ppid("42 (vhost-100) S 2 0 0 0"), Some(2));
        assert_eq!(parse_stat_ppid("garbage"), None);
        assert_eq!(parse_stat_ppid("1 (x)"), None);
    }

    #[test]
    fn cmdline_split() {
        assert_eq!(split_cmdline(b"a\0b c\0\0"), vec!["a", "b c"]);
        assert_eq!(split_cmdline(b"a b"), vec!["a b"]);
        assert!(split_cmdline(b"").is_empty());
    }

    #[test]
    fn net_unix_paths() {
        let s = "Num       RefCount Protocol Flags    Type St Inode Path\n\
                 0000000000000000: 00000002 00000000 00010000 0001 01 91234 /var/lib/libvirt/qemu/domain-1-x/monitor.sock\n\
                 0000000000000000: 00000002 00000000 00010000 0001 01 91235 @abstract\n\
                 0000000000000000: 00000003 00000000 00000000 0001 03 91236\n";
        let m = parse_net_unix(s);
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[&91234],
            PathBuf::from("/var/lib/libvirt/qemu/domain-1-x/monitor.sock")
        );
        assert_eq!(socket_inode(Path::new("socket:[91234]")), Some(91234));
        assert_eq!(socket_inode(Path::new("/dev/null")), None);
    }
}
