//! The one reader of `/proc` for every vmscope crate, rooted (the real
//! `/proc` or a fixture tree in tests, as below's procfs reader is): process
//! and thread lists, `comm`, `cmdline`, `exe`, `cwd`, `stat`, `schedstat`,
//! `io`, open descriptors with their `fdinfo`, the Unix socket table and
//! `/proc/stat`. Discovery, vm-stat, accounting, the recorder and the lab all
//! read through [`ProcRoot`]; nothing else opens files under `/proc`.
//!
//! - [`cache`]: the cheap paths for readers that sample every interval
//!   (listings re-read only when a link count changes, per-thread files kept
//!   open and re-read with `pread`);
//! - [`synth`]: `Comm` and `Mmap` records of processes that existed before a
//!   recording started.
//!
//! Every reader returns [`LinuxError::Read`] or [`LinuxError::Parse`] naming
//! the file, never panics on odd contents, and treats a process that exits
//! between two reads as normal: [`LinuxError::is_vanished`] tells that case.

pub mod cache;
pub mod synth;

pub use cache::{ProcLister, TaskLister, TaskReader};
pub use synth::synthesize_from_proc;

use crate::LinuxError;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, LinuxError>;

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> LinuxError + '_ {
    move |source| LinuxError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn parse_err(path: &Path, msg: impl Into<String>) -> LinuxError {
    LinuxError::Parse {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn read_string(path: &Path) -> Result<String> {
    crate::files::read_bounded_string(path, crate::files::LARGE_FILE).map_err(read_err(path))
}

/// A `/proc` tree rooted at `root` (normally `/proc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcRoot {
    root: PathBuf,
}

impl Default for ProcRoot {
    fn default() -> Self {
        ProcRoot::system()
    }
}

impl ProcRoot {
    /// A tree rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> ProcRoot {
        ProcRoot { root: root.into() }
    }

    /// The running system's `/proc`.
    pub fn system() -> ProcRoot {
        ProcRoot::new("/proc")
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<pid>/<rel>` (`<root>/<pid>` when `rel` is empty).
    pub fn pid_path(&self, pid: u32, rel: &str) -> PathBuf {
        let p = self.root.join(pid.to_string());
        if rel.is_empty() {
            p
        } else {
            p.join(rel)
        }
    }

    /// `<root>/<pid>/task/<tid>/<name>`.
    pub fn task_path(&self, pid: u32, tid: u32, name: &str) -> PathBuf {
        self.root
            .join(pid.to_string())
            .join("task")
            .join(tid.to_string())
            .join(name)
    }

    /// Whether `<root>/<pid>` exists (the process has not been reaped).
    pub fn exists(&self, pid: u32) -> bool {
        self.pid_path(pid, "").exists()
    }

    /// Whether `pid` is running: it exists and is neither a zombie nor
    /// dead (state `Z` or `X` in its `stat`).
    pub fn is_alive(&self, pid: u32) -> bool {
        read_string(&self.pid_path(pid, "stat")).is_ok_and(|s| {
            split_stat(&s).is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
        })
    }

    /// A sysctl as text, without the trailing newline: `kernel.osrelease`
    /// reads `<root>/sys/kernel/osrelease`.
    pub fn sysctl(&self, name: &str) -> Result<String> {
        let path = self.root.join("sys").join(name.replace('.', "/"));
        Ok(read_string(&path)?.trim_end().to_string())
    }

    /// Numeric entries of the root (thread-group leaders and kernel
    /// threads), sorted.
    pub fn pids(&self) -> Result<Vec<u32>> {
        numeric_entries(&self.root)
    }

    /// Thread ids of a process (`<root>/<pid>/task`), sorted.
    pub fn tids(&self, pid: u32) -> Result<Vec<u32>> {
        numeric_entries(&self.pid_path(pid, "task"))
    }

    /// The number of entries of the root without listing it: procfs counts
    /// every process in the root's link count. Tells a caller whether a
    /// cached listing is still current ([`ProcLister`]).
    pub fn link_count(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.root).ok().map(|m| m.nlink())
    }

    /// The number of threads of `pid` without listing them:
    /// `/proc/PID/task`'s link count is its thread count plus two.
    pub fn thread_count(&self, pid: u32) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(self.pid_path(pid, "task")).ok()?;
        m.nlink().checked_sub(2)
    }

    /// (tid, comm) of every thread of `pid`, sorted by tid; threads that
    /// exit while being listed are left out, a process that is gone gives
    /// an empty list.
    pub fn threads(&self, pid: u32) -> Vec<(u32, String)> {
        self.tids(pid)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|tid| Some((tid, self.thread_comm(pid, tid).ok()?)))
            .collect()
    }

    /// `comm` of a process, without the trailing newline.
    pub fn comm(&self, pid: u32) -> Result<String> {
        read_comm(&self.pid_path(pid, "comm"))
    }

    /// The process (thread group) thread `tid` belongs to, from
    /// `/proc/TID/status` (every thread id is reachable there).
    pub fn tgid(&self, tid: u32) -> Result<u32> {
        let path = self.pid_path(tid, "status");
        let text = read_string(&path)?;
        text.lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| LinuxError::Parse {
                path,
                msg: "no Tgid line".into(),
            })
    }

    /// `comm` of one thread of a process.
    pub fn thread_comm(&self, pid: u32, tid: u32) -> Result<String> {
        read_comm(&self.task_path(pid, tid, "comm"))
    }

    /// Processes whose `comm` starts with `prefix` (e.g. `ksoftirqd/`), sorted.
    pub fn pids_by_comm_prefix(&self, prefix: &str) -> Vec<u32> {
        self.pids()
            .unwrap_or_default()
            .into_iter()
            .filter(|&pid| self.comm(pid).is_ok_and(|c| c.starts_with(prefix)))
            .collect()
    }

    /// Arguments from `cmdline` (NUL-separated). Empty for kernel threads
    /// and zombies.
    pub fn cmdline(&self, pid: u32) -> Result<Vec<String>> {
        let path = self.pid_path(pid, "cmdline");
        let raw =
            crate::files::read_bounded(&path, crate::files::SMALL_FILE).map_err(read_err(&path))?;
        Ok(split_cmdline(&raw))
    }

    /// Target of the `exe` link, without the ` (deleted)` suffix the kernel
    /// adds once the binary was replaced on disk.
    pub fn exe(&self, pid: u32) -> Result<PathBuf> {
        let path = self.pid_path(pid, "exe");
        let target = fs::read_link(&path).map_err(read_err(&path))?;
        let s = target.to_string_lossy();
        Ok(match s.strip_suffix(" (deleted)") {
            Some(stripped) => PathBuf::from(stripped),
            None => target,
        })
    }

    /// Target of the `cwd` link.
    pub fn cwd(&self, pid: u32) -> Result<PathBuf> {
        let path = self.pid_path(pid, "cwd");
        fs::read_link(&path).map_err(read_err(&path))
    }

    /// `maps` of a process, as text.
    pub fn maps(&self, pid: u32) -> Result<String> {
        read_string(&self.pid_path(pid, "maps"))
    }

    /// What `/proc/PID/stat` of the process says that we use.
    pub fn stat(&self, pid: u32) -> Result<TaskStat> {
        let path = self.pid_path(pid, "stat");
        parse_task_stat(&read_string(&path)?, &path)
    }

    /// The CPU time and flags of a process from `/proc/PID/stat`.
    pub fn process_cpu(&self, pid: u32) -> Result<ProcessCpu> {
        let path = self.pid_path(pid, "stat");
        parse_process_cpu(&read_string(&path)?, &path)
    }

    /// Parent pid from `/proc/PID/stat` (field 4).
    pub fn ppid(&self, pid: u32) -> Result<u32> {
        let path = self.pid_path(pid, "stat");
        parse_stat_ppid(&read_string(&path)?).ok_or_else(|| parse_err(&path, "no parent pid"))
    }

    /// `/proc/PID/task/TID/stat`.
    pub fn task_stat(&self, pid: u32, tid: u32) -> Result<TaskStat> {
        let path = self.task_path(pid, tid, "stat");
        parse_task_stat(&read_string(&path)?, &path)
    }

    /// `/proc/PID/task/TID/schedstat`.
    pub fn schedstat(&self, pid: u32, tid: u32) -> Result<SchedStat> {
        let path = self.task_path(pid, tid, "schedstat");
        parse_schedstat(&read_string(&path)?, &path)
    }

    /// `/proc/PID/io`.
    pub fn io(&self, pid: u32) -> Result<ProcIo> {
        let path = self.pid_path(pid, "io");
        parse_proc_io(&read_string(&path)?, &path)
    }

    /// `<root>/stat`: every CPU's times.
    pub fn cpu_times(&self) -> Result<ProcStat> {
        let path = self.root.join("stat");
        parse_proc_stat(&read_string(&path)?, clk_tck(), &path)
    }

    /// Open file descriptors and their link targets (`socket:[123]`,
    /// `/dev/net/tun`, ...). Descriptors closed while listing are skipped.
    pub fn fds(&self, pid: u32) -> Result<Vec<(u32, PathBuf)>> {
        let dir = self.pid_path(pid, "fd");
        let mut out = Vec::new();
        for fd in numeric_entries(&dir)? {
            let path = dir.join(fd.to_string());
            match fs::read_link(&path) {
                Ok(t) => out.push((fd, t)),
                Err(e) if io_vanished(&e) => continue,
                Err(e) => return Err(read_err(&path)(e)),
            }
        }
        Ok(out)
    }

    /// Link target of one descriptor.
    pub fn fd_target(&self, pid: u32, fd: u32) -> Result<PathBuf> {
        let path = self.pid_path(pid, &format!("fd/{fd}"));
        fs::read_link(&path).map_err(read_err(&path))
    }

    /// The `iff:` line of a descriptor's `fdinfo`: the interface a tun/tap
    /// descriptor is attached to (printed by the tun driver since Linux 3.x).
    pub fn fd_iff(&self, pid: u32, fd: u32) -> Result<Option<String>> {
        let s = read_string(&self.pid_path(pid, &format!("fdinfo/{fd}")))?;
        Ok(s.lines().find_map(|l| {
            l.strip_prefix("iff:")
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        }))
    }

    /// Unix sockets bound to a path, by inode, from `<root>/<pid>/net/unix`
    /// (the process's own network namespace).
    pub fn unix_socket_paths(&self, pid: u32) -> Result<HashMap<u64, PathBuf>> {
        let s = read_string(&self.pid_path(pid, "net/unix"))?;
        Ok(parse_net_unix(&s))
    }
}

/// True for errors meaning "the process or thread is gone": the entry
/// vanished (`ENOENT`) or the task exited while being read (`ESRCH`).
pub(crate) fn io_vanished(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

fn numeric_entries(dir: &Path) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_err(dir))? {
        let entry = match entry {
            Ok(e) => e,
            Err(e) if io_vanished(&e) => continue,
            Err(e) => return Err(read_err(dir)(e)),
        };
        if let Some(n) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn read_comm(path: &Path) -> Result<String> {
    let raw = crate::files::read_bounded(path, crate::files::SMALL_FILE).map_err(read_err(path))?;
    Ok(trim_comm(&raw))
}

/// A `comm` file's bytes as text, without the trailing newline.
pub(crate) fn trim_comm(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    s.strip_suffix('\n').unwrap_or(&s).to_string()
}

/// Kernel clock ticks per second of `/proc/stat` (`USER_HZ`).
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Split a NUL-separated `cmdline`. A process that rewrote its argv may
/// leave no trailing NUL; empty trailing pieces are dropped.
pub fn split_cmdline(raw: &[u8]) -> Vec<String> {
    let mut args: Vec<String> = raw
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    while args.last().is_some_and(std::string::String::is_empty) {
        args.pop();
    }
    args
}

/// The comm and the fields after it of a `stat` line. The comm may itself
/// contain spaces and parentheses: it ends at the *last* `)`. This is the
/// one place that rule is written.
pub fn split_stat(text: &str) -> Option<(&str, &str)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    Some((text.get(open + 1..close)?, text.get(close + 1..)?))
}

/// What `/proc/PID/task/TID/stat` says that we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStat {
    pub comm: String,
    /// Field 4: the parent's pid.
    pub ppid: u32,
    /// Field 39: the CPU the thread last ran on.
    pub processor: u32,
    /// Field 22: start time in ticks since boot (tells a reused id apart).
    pub starttime: u64,
}

/// Parse the text of a `stat` file (`path` names it in errors).
pub fn parse_task_stat(text: &str, path: &Path) -> Result<TaskStat> {
    let (comm, rest) = split_stat(text).ok_or_else(|| parse_err(path, "no '(comm)'"))?;
    let rest: Vec<&str> = rest.split_ascii_whitespace().collect();
    // rest[0] is field 3 (state): field n is rest[n - 3].
    let field = |n: usize| -> Result<u64> {
        rest.get(n - 3)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| parse_err(path, format!("no field {n}")))
    };
    Ok(TaskStat {
        comm: comm.to_string(),
        ppid: field(4)? as u32,
        processor: field(39)? as u32,
        starttime: field(22)?,
    })
}

/// The CPU time and flags of a process, from `/proc/PID/stat`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessCpu {
    pub comm: String,
    /// Field 9: `PF_*` flags.
    pub flags: u64,
    /// Fields 14-17, in clock ticks ([`clk_tck`]): user and system time of
    /// the process (its dead threads included), and of its reaped children.
    pub utime: u64,
    pub stime: u64,
    pub cutime: u64,
    pub cstime: u64,
}

impl ProcessCpu {
    /// `PF_KTHREAD`: a kernel thread.
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & 0x0020_0000 != 0
    }
}

/// Parse the text of a `stat` file for [`ProcessCpu`] (fields up to 17
/// must be present).
pub fn parse_process_cpu(text: &str, path: &Path) -> Result<ProcessCpu> {
    let (comm, rest) = split_stat(text).ok_or_else(|| parse_err(path, "no '(comm)'"))?;
    let rest: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        rest.get(n - 3)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| parse_err(path, format!("no field {n}")))
    };
    Ok(ProcessCpu {
        comm: comm.to_string(),
        flags: field(9)?,
        utime: field(14)?,
        stime: field(15)?,
        cutime: field(16)?,
        cstime: field(17)?,
    })
}

/// Parent pid from the text of `/proc/PID/stat` (only the first fields
/// need to be present).
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let (_, rest) = split_stat(stat)?;
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// `/proc/PID/task/TID/schedstat`: nanoseconds on CPU, nanoseconds waiting
/// on a run queue (run_delay: a vCPU's steal time), timeslices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStat {
    pub run_ns: u64,
    pub wait_ns: u64,
    pub slices: u64,
}

/// Parse the text of a `schedstat` file.
pub fn parse_schedstat(text: &str, path: &Path) -> Result<SchedStat> {
    let mut it = text.split_ascii_whitespace().map(str::parse::<u64>);
    let mut next = |what: &str| -> Result<u64> {
        it.next()
            .and_then(std::result::Result::ok)
            .ok_or_else(|| parse_err(path, format!("no {what}")))
    };
    Ok(SchedStat {
        run_ns: next("run time")?,
        wait_ns: next("run delay")?,
        slices: next("timeslices")?,
    })
}

/// `/proc/PID/io` counters (syscalls and bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcIo {
    pub syscr: u64,
    pub syscw: u64,
    pub rchar: u64,
    pub wchar: u64,
}

/// Parse the text of an `io` file.
pub fn parse_proc_io(text: &str, path: &Path) -> Result<ProcIo> {
    let mut io = ProcIo::default();
    let mut found = 0;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        match k.trim() {
            "syscr" => io.syscr = v,
            "syscw" => io.syscw = v,
            "rchar" => io.rchar = v,
            "wchar" => io.wchar = v,
            _ => continue,
        }
        found += 1;
    }
    if found == 0 {
        return Err(parse_err(path, "no counters"));
    }
    Ok(io)
}

/// One CPU line of `/proc/stat`, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    pub user: f64,
    pub nice: f64,
    pub system: f64,
    pub idle: f64,
    pub iowait: f64,
    pub irq: f64,
    pub softirq: f64,
    pub steal: f64,
}

impl CpuTimes {
    /// Time this CPU did work for this host: user (guest time included),
    /// nice, system, hard and soft interrupts. Idle, iowait and steal (time
    /// an outer hypervisor took away) are not busy.
    pub fn busy(&self) -> f64 {
        self.user + self.nice + self.system + self.irq + self.softirq
    }
    /// Every state, the wall time the CPU was online.
    pub fn total(&self) -> f64 {
        self.busy() + self.idle + self.iowait + self.steal
    }
}

/// `/proc/stat`: the all-CPU line and each `cpuN` line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcStat {
    pub all: CpuTimes,
    /// By CPU number.
    pub cpus: Vec<(u32, CpuTimes)>,
}

impl ProcStat {
    /// One CPU's times.
    pub fn cpu(&self, cpu: u32) -> Option<&CpuTimes> {
        self.cpus.iter().find(|(c, _)| *c == cpu).map(|(_, t)| t)
    }

    /// Busy seconds of each CPU over `dt` seconds of wall time, from the
    /// idle side: `dt − idle − iowait`, less the part of `steal` that fell
    /// while the CPU was busy (taken as the busy share of the interval).
    /// On a NO_HZ kernel idle time is exact (the idle loop's own clock, not
    /// the tick), and interrupt work on an otherwise idle CPU, which no
    /// tick samples, counts as busy.
    pub fn busy_from_idle(prev: &ProcStat, cur: &ProcStat, dt: f64) -> Vec<(u32, f64)> {
        cur.cpus
            .iter()
            .filter_map(|(cpu, c)| {
                let p = prev.cpu(*cpu)?;
                let idle = (c.idle - p.idle) + (c.iowait - p.iowait);
                let busy = (dt - idle).clamp(0.0, dt);
                let steal = (c.steal - p.steal).max(0.0);
                let frac = if dt > 0.0 { busy / dt } else { 0.0 };
                Some((*cpu, (busy - steal * frac).max(0.0)))
            })
            .collect()
    }

    /// The share of time `cpu` (`None`: all CPUs together) was busy
    /// between two readings: the user, nice, system, irq and softirq
    /// columns over the sum of all columns, as top and mpstat compute it.
    /// Times the caller's interval, that is the kernel's busy time:
    /// dividing the columns by wall time instead is wrong on a host that is
    /// itself a VM, where ticks are lost or counted twice with steal (here,
    /// a vCPU thread busy 99 % of wall time by its schedstat showed as 89 %
    /// busy ticks per second of wall time, and 99 % of the columns).
    ///
    /// `stat` bounds its per-CPU figures with this, the figure users
    /// compare with (top, mpstat). `account` measures the host with
    /// [`ProcStat::busy_from_idle`] instead: on a partly idle host the
    /// ticks miss interrupt work on idle CPUs and are biased by bursty
    /// tasks (against the tasks' own run time, -7 % to +3 % of capacity per
    /// 1 s interval on the lab's disk test, where the idle side stayed
    /// within 1.3 %).
    pub fn busy_share(prev: &ProcStat, cur: &ProcStat, cpu: Option<u32>) -> Option<f64> {
        let (p, c) = match cpu {
            Some(i) => (prev.cpu(i)?, cur.cpu(i)?),
            None => (&prev.all, &cur.all),
        };
        let total = c.total() - p.total();
        if total <= 0.0 {
            return Some(0.0);
        }
        Some(((c.busy() - p.busy()) / total).clamp(0.0, 1.0))
    }
}

/// Parse `/proc/stat` text (`tck` ticks per second).
pub fn parse_proc_stat(text: &str, tck: f64, path: &Path) -> Result<ProcStat> {
    let mut out = ProcStat::default();
    let mut seen_all = false;
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let Some(name) = it.next() else { continue };
        let Some(rest) = name.strip_prefix("cpu") else {
            continue;
        };
        let v: Vec<f64> = it
            .map(|x| x.parse::<u64>().map(|n| n as f64 / tck))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| parse_err(path, format!("{name}: {e}")))?;
        if v.len() < 4 {
            return Err(parse_err(path, format!("{name}: {} fields", v.len())));
        }
        let g = |i: usize| v.get(i).copied().unwrap_or(0.0);
        let t = CpuTimes {
            user: g(0),
            nice: g(1),
            system: g(2),
            idle: g(3),
            iowait: g(4),
            irq: g(5),
            softirq: g(6),
            steal: g(7),
        };
        if rest.is_empty() {
            out.all = t;
            seen_all = true;
        } else {
            let cpu = rest
                .parse()
                .map_err(|_| parse_err(path, format!("bad cpu name {name}")))?;
            out.cpus.push((cpu, t));
        }
    }
    if !seen_all {
        return Err(parse_err(path, "no cpu line"));
    }
    Ok(out)
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

/// One line of `/proc/PID/maps`.
#[derive(Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    pub exec: bool,
    pub offset: u64,
    pub path: &'a str,
}

/// Parse `start-end perms offset dev inode [path]`; the path may contain
/// spaces and is everything after the inode column.
pub fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut rest = line;
    let mut field = || {
        let t = rest.trim_start_matches(' ');
        let end = t.find(' ').unwrap_or(t.len());
        let (f, r) = t.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field();
    let offset = field();
    let _dev = field();
    let _inode = field();
    let path = rest.trim_start_matches(' ');
    let (s, e) = range.split_once('-')?;
    Some(MapsLine {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        path,
    })
}

#[cfg(test)]
mod tests;
