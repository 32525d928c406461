//! The cheap paths for readers that sample `/proc` every interval (vm-stat
//! and accounting at 100 ms over hundreds of vCPU threads): a process list
//! re-read only when `/proc`'s link count changes, thread lists re-read only
//! when a process's thread count changes, and per-thread files kept open
//! and re-read with `pread` instead of a path walk, open, read and close.

use super::{
    parse_proc_io, parse_schedstat, parse_task_stat, trim_comm, ProcIo, ProcRoot, SchedStat,
    TaskStat,
};
use crate::LinuxError;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Thread lists of processes, re-listed only when a process's thread
/// count changed (`/proc/PID/task`'s link count: one `fstat` of a handle
/// kept on the directory instead of a directory walk of hundreds of
/// entries every interval). A thread that exits while another starts in
/// the same interval keeps the count: callers that care re-list everything
/// now and then with [`TaskLister::forget`].
///
/// The handle is kept because a `stat` by path walks `/proc/PID/task`
/// every time: in `serve --history`'s profile with 32 VMs that walk was
/// nine tenths of the count's cost. The handle of a process that exited
/// counts no threads, so a reused pid is listed afresh (with a new handle).
#[derive(Debug, Default)]
pub struct TaskLister {
    cache: HashMap<u32, Listed>,
}

#[derive(Debug)]
struct Listed {
    count: u64,
    tids: Vec<u32>,
    dir: std::fs::File,
}

/// The thread count of an open `/proc/PID/task` (its link count less 2).
fn dir_threads(dir: &std::fs::File) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    dir.metadata().ok()?.nlink().checked_sub(2)
}

impl TaskLister {
    /// Thread ids of `pid` (empty when the process is gone).
    pub fn tids(&mut self, proc: &ProcRoot, pid: u32) -> Vec<u32> {
        if let Some(l) = self.cache.get(&pid) {
            if dir_threads(&l.dir) == Some(l.count) {
                return l.tids.clone();
            }
        }
        // Counted before listing: a thread started in between makes the
        // next count differ, and the list is taken again then.
        let dir = std::fs::File::open(proc.pid_path(pid, "task")).ok();
        let count = dir.as_ref().and_then(dir_threads);
        let v = proc.tids(pid).unwrap_or_default();
        match (dir, count) {
            (Some(dir), Some(count)) => {
                self.cache.insert(
                    pid,
                    Listed {
                        count,
                        tids: v.clone(),
                        dir,
                    },
                );
            }
            _ => {
                self.cache.remove(&pid);
            }
        }
        v
    }

    /// Drop what is cached (processes gone, or a periodic full re-list).
    pub fn forget(&mut self, keep: impl Fn(u32) -> bool) {
        self.cache.retain(|&p, _| keep(p));
    }
}

/// The pids under the proc root, listed again only when the root's link
/// count changes (procfs counts every process in `/proc`'s `st_nlink`, so
/// one `stat` replaces a walk of every entry each interval) or when the
/// list is older than `max_age`. A process that exits while another starts
/// between two calls keeps the count: the new one is seen at the next
/// re-list, at most `max_age` later.
#[derive(Debug)]
pub struct ProcLister {
    nlink: Option<u64>,
    listed: Option<Instant>,
    pids: Vec<u32>,
    max_age: Duration,
}

impl ProcLister {
    /// A lister that re-lists at least every `max_age`.
    pub fn new(max_age: Duration) -> ProcLister {
        ProcLister {
            nlink: None,
            listed: None,
            pids: Vec::new(),
            max_age,
        }
    }

    /// The current process list (sorted).
    pub fn pids(&mut self, proc: &ProcRoot) -> &[u32] {
        let nlink = proc.link_count();
        let fresh = nlink.is_some()
            && nlink == self.nlink
            && self.listed.is_some_and(|t| t.elapsed() < self.max_age);
        if !fresh {
            self.pids = proc.pids().unwrap_or_default();
            self.nlink = nlink;
            self.listed = Some(Instant::now());
        }
        &self.pids
    }
}

/// Which per-thread file a [`TaskReader`] keeps open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum TaskFile {
    Schedstat,
    Stat,
    Comm,
    /// The process's `/proc/PID/io` (tid 0 in the key).
    Io,
}

impl TaskFile {
    fn name(self) -> &'static str {
        match self {
            TaskFile::Schedstat => "schedstat",
            TaskFile::Stat => "stat",
            TaskFile::Comm => "comm",
            TaskFile::Io => "io",
        }
    }
}

/// Per-thread `schedstat`, `stat` and `comm` files (and processes' `io`) kept open between
/// samples and re-read with `pread` at offset 0: one system call per file
/// per sample instead of a path walk, open, read and close (the cost that
/// dominates with hundreds of vCPU threads). A file whose thread exited
/// fails with ESRCH and is dropped; a reused id therefore opens a fresh
/// file. Files not read during a sample are closed at
/// [`TaskReader::end_sample`].
#[derive(Debug)]
pub struct TaskReader {
    proc: ProcRoot,
    files: HashMap<(u32, u32, TaskFile), (std::fs::File, bool)>,
    buf: Vec<u8>,
}

impl TaskReader {
    /// A reader of threads under `proc`; raises the open-file limit (two or
    /// three files per thread stay open).
    pub fn new(proc: &ProcRoot) -> TaskReader {
        raise_nofile();
        TaskReader {
            proc: proc.clone(),
            files: HashMap::new(),
            buf: vec![0; 4096],
        }
    }

    fn read(&mut self, pid: u32, tid: u32, kind: TaskFile) -> Result<&[u8], LinuxError> {
        use std::collections::hash_map::Entry;
        use std::os::unix::fs::FileExt;
        let key = (pid, tid, kind);
        let proc = &self.proc;
        let path = || match kind {
            TaskFile::Io => proc.pid_path(pid, kind.name()),
            _ => proc.task_path(pid, tid, kind.name()),
        };
        let (f, used) = match self.files.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let f = std::fs::File::open(path()).map_err(|source| LinuxError::Read {
                    path: path(),
                    source,
                })?;
                e.insert((f, true))
            }
        };
        *used = true;
        match f.read_at(&mut self.buf, 0) {
            Ok(n) => Ok(&self.buf[..n]),
            Err(source) => {
                let path = path();
                self.files.remove(&key);
                Err(LinuxError::Read { path, source })
            }
        }
    }

    /// The thread's `schedstat`.
    pub fn schedstat(&mut self, pid: u32, tid: u32) -> Result<SchedStat, LinuxError> {
        let text = String::from_utf8_lossy(self.read(pid, tid, TaskFile::Schedstat)?).into_owned();
        parse_schedstat(&text, Path::new("schedstat"))
    }

    /// The thread's `stat`.
    pub fn task_stat(&mut self, pid: u32, tid: u32) -> Result<TaskStat, LinuxError> {
        let text = String::from_utf8_lossy(self.read(pid, tid, TaskFile::Stat)?).into_owned();
        parse_task_stat(&text, Path::new("stat"))
    }

    /// The thread's name (`comm`), without the newline.
    pub fn comm(&mut self, pid: u32, tid: u32) -> Result<String, LinuxError> {
        Ok(trim_comm(self.read(pid, tid, TaskFile::Comm)?))
    }

    /// The process's `/proc/PID/io`.
    pub fn process_io(&mut self, pid: u32) -> Result<ProcIo, LinuxError> {
        let text = String::from_utf8_lossy(self.read(pid, 0, TaskFile::Io)?).into_owned();
        parse_proc_io(&text, Path::new("io"))
    }

    /// Close the files not read since the previous call.
    pub fn end_sample(&mut self) {
        self.files.retain(|_, (_, used)| std::mem::take(used));
    }

    /// How many files are open (for tests).
    pub fn open_files(&self) -> usize {
        self.files.len()
    }
}

/// Raise the soft open-file limit to the hard one (two files per thread).
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid rlimit to fill and then to pass back.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const r);
        }
    }
}
