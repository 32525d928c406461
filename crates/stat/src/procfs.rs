//! Rooted readers of the `/proc` and `/sys` files `stat`, `account` and
//! `serve` sample: `/proc/stat` CPU times, per-thread `schedstat` and `stat`
//! (last CPU), `/proc/PID/io`, tap counters under `/sys/class/net`. Every
//! reader takes the root it reads under, so tests run on fixture trees.
//! Nothing here panics on malformed data: it becomes [`StatError::Parse`].

use crate::StatError;
use std::path::{Path, PathBuf};

fn read(path: PathBuf) -> Result<String, StatError> {
    std::fs::read_to_string(&path).map_err(|source| StatError::Read { path, source })
}

fn parse_err(path: PathBuf, msg: impl Into<String>) -> StatError {
    StatError::Parse {
        path,
        msg: msg.into(),
    }
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
    pub fn cpu(&self, cpu: u32) -> Option<&CpuTimes> {
        self.cpus.iter().find(|(c, _)| *c == cpu).map(|(_, t)| t)
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
pub fn parse_proc_stat(text: &str, tck: f64, path: &Path) -> Result<ProcStat, StatError> {
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
            .collect::<Result<_, _>>()
            .map_err(|e| parse_err(path.into(), format!("{name}: {e}")))?;
        if v.len() < 4 {
            return Err(parse_err(
                path.into(),
                format!("{name}: {} fields", v.len()),
            ));
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
                .map_err(|_| parse_err(path.into(), format!("bad cpu name {name}")))?;
            out.cpus.push((cpu, t));
        }
    }
    if !seen_all {
        return Err(parse_err(path.into(), "no cpu line"));
    }
    Ok(out)
}

/// Read `<proc>/stat`.
pub fn proc_stat(proc: &Path) -> Result<ProcStat, StatError> {
    let path = proc.join("stat");
    let text = read(path.clone())?;
    parse_proc_stat(&text, clk_tck(), &path)
}

/// Every process id under `<proc>`.
pub fn pids(proc: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// `/proc/PID/task/TID/schedstat`: nanoseconds on CPU, nanoseconds waiting
/// on a run queue (run_delay: a vCPU's steal time), timeslices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStat {
    pub run_ns: u64,
    pub wait_ns: u64,
    pub slices: u64,
}

fn task_dir(proc: &Path, pid: u32, tid: u32) -> PathBuf {
    proc.join(pid.to_string())
        .join("task")
        .join(tid.to_string())
}

pub fn parse_schedstat(text: &str, path: &Path) -> Result<SchedStat, StatError> {
    let mut it = text.split_ascii_whitespace().map(|x| x.parse::<u64>());
    let mut next = |what: &str| -> Result<u64, StatError> {
        it.next()
            .and_then(Result::ok)
            .ok_or_else(|| parse_err(path.into(), format!("no {what}")))
    };
    Ok(SchedStat {
        run_ns: next("run time")?,
        wait_ns: next("run delay")?,
        slices: next("timeslices")?,
    })
}

pub fn schedstat(proc: &Path, pid: u32, tid: u32) -> Result<SchedStat, StatError> {
    let path = task_dir(proc, pid, tid).join("schedstat");
    let text = read(path.clone())?;
    parse_schedstat(&text, &path)
}

/// What `/proc/PID/task/TID/stat` says that we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStat {
    pub comm: String,
    /// Field 39: the CPU the thread last ran on.
    pub processor: u32,
    /// Field 22: start time in ticks since boot (tells a reused id apart).
    pub starttime: u64,
}

pub fn parse_task_stat(text: &str, path: &Path) -> Result<TaskStat, StatError> {
    // The comm may contain spaces and parentheses: it ends at the last ')'.
    let open = text
        .find('(')
        .ok_or_else(|| parse_err(path.into(), "no '('"))?;
    let close = text
        .rfind(')')
        .ok_or_else(|| parse_err(path.into(), "no ')'"))?;
    let comm = text
        .get(open + 1..close)
        .ok_or_else(|| parse_err(path.into(), "bad comm"))?
        .to_string();
    let rest: Vec<&str> = text
        .get(close + 1..)
        .unwrap_or_default()
        .split_ascii_whitespace()
        .collect();
    // rest[0] is field 3 (state): field n is rest[n - 3].
    let field = |n: usize| -> Result<u64, StatError> {
        rest.get(n - 3)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| parse_err(path.into(), format!("no field {n}")))
    };
    Ok(TaskStat {
        comm,
        processor: field(39)? as u32,
        starttime: field(22)?,
    })
}

pub fn task_stat(proc: &Path, pid: u32, tid: u32) -> Result<TaskStat, StatError> {
    let path = task_dir(proc, pid, tid).join("stat");
    let text = read(path.clone())?;
    parse_task_stat(&text, &path)
}

/// Thread ids of a process.
pub fn tids(proc: &Path, pid: u32) -> Result<Vec<u32>, StatError> {
    let path = proc.join(pid.to_string()).join("task");
    let rd = std::fs::read_dir(&path).map_err(|source| StatError::Read { path, source })?;
    let mut v: Vec<u32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// The number of threads of `pid` without listing them: `/proc/PID/task`'s
/// link count is its thread count plus two.
pub fn thread_count(proc: &Path, pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(proc.join(pid.to_string()).join("task")).ok()?;
    m.nlink().checked_sub(2)
}

/// Thread lists of processes, re-listed only when a process's thread
/// count changed ([`thread_count`]: one `stat` instead of a directory walk
/// of hundreds of entries every interval). A thread that exits while
/// another starts in the same interval keeps the count: callers that care
/// re-list everything now and then with [`TaskLister::forget`].
#[derive(Debug, Default)]
pub struct TaskLister {
    cache: HashMap<u32, (u64, Vec<u32>)>,
}

impl TaskLister {
    pub fn tids(&mut self, proc: &Path, pid: u32) -> Vec<u32> {
        let n = thread_count(proc, pid);
        if let (Some(n), Some((c, v))) = (n, self.cache.get(&pid)) {
            if *c == n {
                return v.clone();
            }
        }
        let v = tids(proc, pid).unwrap_or_default();
        match n {
            Some(n) => {
                self.cache.insert(pid, (n, v.clone()));
            }
            None => {
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
    listed: Option<std::time::Instant>,
    pids: Vec<u32>,
    max_age: std::time::Duration,
}

impl ProcLister {
    pub fn new(max_age: std::time::Duration) -> ProcLister {
        ProcLister {
            nlink: None,
            listed: None,
            pids: Vec::new(),
            max_age,
        }
    }

    pub fn pids(&mut self, proc: &Path) -> &[u32] {
        use std::os::unix::fs::MetadataExt;
        let nlink = std::fs::metadata(proc).ok().map(|m| m.nlink());
        let fresh = nlink.is_some()
            && nlink == self.nlink
            && self.listed.is_some_and(|t| t.elapsed() < self.max_age);
        if !fresh {
            self.pids = pids(proc);
            self.nlink = nlink;
            self.listed = Some(std::time::Instant::now());
        }
        &self.pids
    }
}

/// `/proc/PID/io` counters (syscalls and bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcIo {
    pub syscr: u64,
    pub syscw: u64,
    pub rchar: u64,
    pub wchar: u64,
}

pub fn parse_proc_io(text: &str, path: &Path) -> Result<ProcIo, StatError> {
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
        return Err(parse_err(path.into(), "no counters"));
    }
    Ok(io)
}

pub fn proc_io(proc: &Path, pid: u32) -> Result<ProcIo, StatError> {
    let path = proc.join(pid.to_string()).join("io");
    let text = read(path.clone())?;
    parse_proc_io(&text, &path)
}

/// Packet and byte counters of a network interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// `<sys>/class/net/DEV/statistics/*`.
pub fn net_stats(sys: &Path, dev: &str) -> Result<NetStats, StatError> {
    let dir = sys.join("class/net").join(dev).join("statistics");
    let get = |name: &str| -> Result<u64, StatError> {
        let path = dir.join(name);
        let text = read(path.clone())?;
        text.trim()
            .parse()
            .map_err(|_| parse_err(path, format!("'{}' is not a counter", text.trim())))
    };
    Ok(NetStats {
        rx_packets: get("rx_packets")?,
        tx_packets: get("tx_packets")?,
        rx_bytes: get("rx_bytes")?,
        tx_bytes: get("tx_bytes")?,
    })
}

/// Processes whose `comm` starts with `prefix` (e.g. `ksoftirqd/`).
pub fn pids_by_comm_prefix(proc: &Path, prefix: &str) -> Vec<u32> {
    let mut v: Vec<u32> = pids(proc)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(proc.join(pid.to_string()).join("comm"))
                .map(|c| c.starts_with(prefix))
                .unwrap_or(false)
        })
        .collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_lister_relists_when_the_thread_count_changes() {
        let dir = tempfile::tempdir().unwrap();
        let task = dir.path().join("5/task");
        for t in ["5", "6"] {
            std::fs::create_dir_all(task.join(t)).unwrap();
        }
        let mut l = TaskLister::default();
        assert_eq!(l.tids(dir.path(), 5), vec![5, 6]);
        std::fs::create_dir(task.join("9")).unwrap();
        assert_eq!(l.tids(dir.path(), 5), vec![5, 6, 9]);
        // Same count, different thread: kept until forgotten.
        std::fs::remove_dir(task.join("6")).unwrap();
        std::fs::create_dir(task.join("7")).unwrap();
        if thread_count(dir.path(), 5) == Some(3) {
            assert_eq!(l.tids(dir.path(), 5), vec![5, 6, 9]);
        }
        l.forget(|_| false);
        assert_eq!(l.tids(dir.path(), 5), vec![5, 7, 9]);
        assert!(l.tids(dir.path(), 77).is_empty());
    }

    #[test]
    fn proc_lister_relists_when_the_process_count_changes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        for p in ["1", "20", "self"] {
            std::fs::create_dir(dir.path().join(p)).unwrap();
        }
        let links = || std::fs::metadata(dir.path()).unwrap().nlink();
        let sorted = |l: &mut ProcLister| {
            let mut v = l.pids(dir.path()).to_vec();
            v.sort_unstable();
            v
        };
        let mut l = ProcLister::new(std::time::Duration::from_secs(3600));
        assert_eq!(sorted(&mut l), vec![1, 20]);
        let before = links();
        std::fs::create_dir(dir.path().join("33")).unwrap();
        // The cache relies on the directory's link count following its
        // subdirectories, as procfs and tmpfs do (btrfs keeps 1).
        if links() != before {
            assert_eq!(sorted(&mut l), vec![1, 20, 33]);
            // Same count: the cached list until it is too old.
            std::fs::remove_dir(dir.path().join("20")).unwrap();
            std::fs::create_dir(dir.path().join("44")).unwrap();
            assert_eq!(sorted(&mut l), vec![1, 20, 33]);
        } else {
            std::fs::remove_dir(dir.path().join("20")).unwrap();
            std::fs::create_dir(dir.path().join("44")).unwrap();
        }
        let mut l = ProcLister::new(std::time::Duration::ZERO);
        assert_eq!(sorted(&mut l), vec![1, 33, 44]);
    }

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
    }

    #[test]
    fn proc_stat_fixture() {
        let s = parse_proc_stat(
            &std::fs::read_to_string(fixtures().join("proc/stat")).unwrap(),
            100.0,
            Path::new("stat"),
        )
        .unwrap();
        assert_eq!(s.cpus.len(), 2);
        let c1 = s.cpu(1).unwrap();
        assert!((c1.user - 20.0).abs() < 1e-9);
        assert!((c1.busy() - (20.0 + 0.5 + 3.0 + 0.1 + 0.4)).abs() < 1e-9);
        assert!(parse_proc_stat("intr 1 2\n", 100.0, Path::new("x")).is_err());
        assert!(parse_proc_stat("cpu 1 x 3 4\n", 100.0, Path::new("x")).is_err());
    }

    #[test]
    fn task_files_fixture() {
        let p = fixtures().join("proc");
        let s = schedstat(&p, 100, 101).unwrap();
        // Busy time: the tick-counted columns, idle not included.
        let at = |idle: f64, user: f64| ProcStat {
            all: CpuTimes {
                idle,
                user,
                ..Default::default()
            },
            cpus: vec![(
                0,
                CpuTimes {
                    idle,
                    user,
                    ..Default::default()
                },
            )],
        };
        let b = ProcStat::busy_share(&at(10.0, 5.0), &at(10.7, 5.1), None);
        assert!((b.unwrap() - 0.125).abs() < 1e-9, "{b:?}");
        assert_eq!(
            ProcStat::busy_share(&at(0.0, 0.0), &at(0.0, 0.0), Some(3)),
            None
        );
        // From the idle side: 1 s of wall, 0.7 s idle -> 0.3 s busy,
        // whatever the tick counted as user.
        let b = ProcStat::busy_from_idle(&at(10.0, 5.0), &at(10.7, 5.1), 1.0);
        assert_eq!(b.len(), 1);
        assert!((b[0].1 - 0.3).abs() < 1e-9, "{b:?}");
        // 0.2 s stolen in a CPU busy 60 % of the time: 0.12 s of it fell in
        // busy time and is not this host's work.
        let mut stolen = at(10.4, 5.6);
        stolen.cpus[0].1.steal = 0.2;
        let b = ProcStat::busy_from_idle(&at(10.0, 5.0), &stolen, 1.0);
        assert!((b[0].1 - (0.6 - 0.12)).abs() < 1e-9, "{b:?}");
        assert_eq!(s.run_ns, 5_000_000_000);
        assert_eq!(s.wait_ns, 250_000_000);
        let t = task_stat(&p, 100, 101).unwrap();
        assert_eq!(t.comm, "CPU 0/TCG");
        assert_eq!(t.processor, 1);
        assert_eq!(tids(&p, 100).unwrap(), vec![100, 101]);
        let io = proc_io(&p, 100).unwrap();
        assert_eq!((io.syscr, io.syscw), (40, 60));
        let n = net_stats(&fixtures().join("sys"), "tap0").unwrap();
        assert_eq!(n.rx_packets + n.tx_packets, 30);
        assert!(net_stats(&fixtures().join("sys"), "gone0")
            .unwrap_err()
            .is_vanished());
        assert!(schedstat(&p, 100, 999).unwrap_err().is_vanished());
        assert_eq!(pids_by_comm_prefix(&p, "ksoftirqd/"), vec![15]);
    }

    #[test]
    fn task_reader_rereads_and_drops() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("5/task/6");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("schedstat"), "10 20 3\n").unwrap();
        let mut r = TaskReader::new(tmp.path());
        assert_eq!(r.schedstat(5, 6).unwrap().run_ns, 10);
        std::fs::write(dir.join("schedstat"), "11 20 3\n").unwrap();
        assert_eq!(r.schedstat(5, 6).unwrap().wait_ns, 20);
        r.end_sample();
        r.end_sample();
        assert!(r.files.is_empty());
        assert!(r.schedstat(5, 7).unwrap_err().is_vanished());
    }

    #[test]
    fn malformed_task_files() {
        assert!(parse_schedstat("12 x", Path::new("x")).is_err());
        assert!(parse_task_stat("1 (a) S 1", Path::new("x")).is_err());
        let weird = "7 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38";
        let t = parse_task_stat(weird, Path::new("x")).unwrap();
        assert_eq!(t.comm, "a) b) c");
        assert_eq!(t.processor, 36);
        assert_eq!(t.starttime, 19);
        assert!(parse_proc_io("nothing\n", Path::new("x")).is_err());
    }
}

/// Which per-thread file a [`TaskReader`] keeps open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum TaskFile {
    Schedstat,
    Stat,
    Comm,
}

/// Per-thread `schedstat` and `stat` files kept open between samples and
/// re-read with `pread` at offset 0: one system call per file per sample
/// instead of a path walk, open, read and close (the cost that dominates
/// with hundreds of vCPU threads). A file whose thread exited fails with
/// ESRCH and is dropped; a reused id therefore opens a fresh file. Files
/// not read during a sample are closed at [`TaskReader::end_sample`].
#[derive(Debug)]
pub struct TaskReader {
    root: PathBuf,
    files: HashMap<(u32, u32, TaskFile), (std::fs::File, bool)>,
    buf: Vec<u8>,
}

use std::collections::HashMap;

impl TaskReader {
    pub fn new(root: &Path) -> TaskReader {
        raise_nofile();
        TaskReader {
            root: root.to_path_buf(),
            files: HashMap::new(),
            buf: vec![0; 4096],
        }
    }

    fn read(&mut self, pid: u32, tid: u32, kind: TaskFile) -> Result<String, StatError> {
        use std::os::unix::fs::FileExt;
        let name = match kind {
            TaskFile::Schedstat => "schedstat",
            TaskFile::Stat => "stat",
            TaskFile::Comm => "comm",
        };
        let path = || task_dir(&self.root, pid, tid).join(name);
        let key = (pid, tid, kind);
        let (f, used) = match self.files.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let f = std::fs::File::open(path()).map_err(|source| StatError::Read {
                    path: path(),
                    source,
                })?;
                e.insert((f, true))
            }
        };
        *used = true;
        match f.read_at(&mut self.buf, 0) {
            Ok(n) => Ok(String::from_utf8_lossy(&self.buf[..n]).into_owned()),
            Err(source) => {
                self.files.remove(&key);
                Err(StatError::Read {
                    path: path(),
                    source,
                })
            }
        }
    }

    pub fn schedstat(&mut self, pid: u32, tid: u32) -> Result<SchedStat, StatError> {
        let text = self.read(pid, tid, TaskFile::Schedstat)?;
        parse_schedstat(&text, Path::new("schedstat"))
    }

    pub fn task_stat(&mut self, pid: u32, tid: u32) -> Result<TaskStat, StatError> {
        let text = self.read(pid, tid, TaskFile::Stat)?;
        parse_task_stat(&text, Path::new("stat"))
    }

    /// The thread's name (`comm`), without the newline.
    pub fn comm(&mut self, pid: u32, tid: u32) -> Result<String, StatError> {
        let mut text = self.read(pid, tid, TaskFile::Comm)?;
        if text.ends_with('\n') {
            text.pop();
        }
        Ok(text)
    }

    /// Close the files not read since the previous call.
    pub fn end_sample(&mut self) {
        self.files.retain(|_, (_, used)| std::mem::take(used));
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
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
