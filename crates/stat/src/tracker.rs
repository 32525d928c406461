//! Stable domain numbers (`d1`, `d2`, ...; `d0` is the host) for the VMs
//! discovery finds, re-discovered every interval: a new VM gets the next
//! number, an exited one leaves, a reused PID (a different process start
//! time) is a new VM. Also what each VM's threads are for `stat` and
//! `account`: vCPUs by index, the VM's own non-vCPU threads (main loop, I/O
//! threads, workers, vhost workers, threads or kernel threads), and which
//! threads were renamed since the last interval.

use std::collections::HashMap;
use std::path::PathBuf;
use vmscope_discover::{DiscoverOptions, Vm};
use vmscope_linux::procfs::{self, ProcRoot};

/// A thread `stat`/`account` reads: its `/proc/PID/task/TID` location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    /// Process whose `task/` directory holds the thread (the tid itself for
    /// kernel vhost threads).
    pub pid: u32,
    pub tid: u32,
    pub name: String,
}

/// One VM under its domain number.
#[derive(Debug, Clone)]
pub struct TrackedVm {
    pub id: u32,
    pub name: String,
    pub pid: u32,
    /// Start time of the process (ticks since boot).
    pub start: u64,
    /// vCPU threads with their index.
    pub vcpus: Vec<(u32, Thread)>,
    /// The VM's own non-vCPU threads (direct I/O).
    pub io: Vec<Thread>,
    pub taps: Vec<String>,
    pub qmp: Option<PathBuf>,
    pub vm: Vm,
}

/// What changed between two discoveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Started {
        id: u32,
        name: String,
        pid: u32,
    },
    Exited {
        id: u32,
        name: String,
        pid: u32,
    },
    /// The same PID now belongs to a different process.
    PidReused {
        old: u32,
        new: u32,
        pid: u32,
    },
    Renamed {
        id: u32,
        tid: u32,
        from: String,
        to: String,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Started { id, name, pid } => write!(f, "d{id} {name} (pid {pid}) started"),
            Change::Exited { id, name, pid } => write!(f, "d{id} {name} (pid {pid}) exited"),
            Change::PidReused { old, new, pid } => {
                write!(f, "pid {pid} reused: d{old} exited, d{new} is a new VM")
            }
            Change::Renamed { id, tid, from, to } => {
                write!(f, "d{id} thread {tid} renamed '{from}' -> '{to}'")
            }
        }
    }
}

/// The domain registry, updated once per interval.
#[derive(Debug)]
pub struct VmTracker {
    proc: ProcRoot,
    next: u32,
    current: Vec<TrackedVm>,
    names: HashMap<u32, String>,
    /// Whether each pid seen is a QEMU process (checked once per pid).
    seen: HashMap<u32, bool>,
    /// Thread ids of each VM at the last full discovery.
    tids: HashMap<u32, Vec<u32>>,
    lister: procfs::TaskLister,
    /// Every pid under the proc root (re-listed when the process count
    /// changes, or every 2 s).
    procs: procfs::ProcLister,
    /// Each VM thread's name at the last full discovery, re-read through
    /// kept-open files to find renames without a full discovery.
    comms: HashMap<(u32, u32), String>,
    comm_reader: procfs::TaskReader,
    /// The keys of `comms` in the order they are re-read, and where the
    /// next read starts.
    comm_keys: Vec<(u32, u32)>,
    comm_cursor: usize,
    last_full: Option<std::time::Instant>,
    last_names: Option<std::time::Instant>,
    /// The fraction of a name due but not yet read at the last check, so
    /// that rounding down never slows the round.
    names_due: f64,
}

/// A full discovery (every process, every thread name) at least this often;
/// in between, new or vanished QEMU processes, new kernel vhost workers,
/// changed thread lists and renamed threads trigger one. (It was 10 s, for
/// kernel vhost workers, which are now seen when their process appears: with
/// 5000 vCPU threads the full discovery alone cost 0.25 % of a CPU at 10 s.)
const FULL_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// VM thread names are re-read (one `pread` each) this often, or more
/// slowly when there are more than `NAMES_PER_SEC` × 2 s of them.
const NAMES_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// The most VM thread names re-read per second.
const NAMES_PER_SEC: f64 = 500.0;

impl VmTracker {
    /// Every pid under the proc root as of the last [`VmTracker::refresh`]
    /// (or now, if the process count changed since).
    pub fn pids(&mut self) -> Vec<u32> {
        self.procs.pids(&self.proc).to_vec()
    }

    pub fn new(proc: &ProcRoot) -> VmTracker {
        VmTracker {
            proc: proc.clone(),
            next: 1,
            current: Vec::new(),
            names: HashMap::new(),
            seen: HashMap::new(),
            tids: HashMap::new(),
            lister: procfs::TaskLister::default(),
            procs: procfs::ProcLister::new(NAMES_EVERY),
            comms: HashMap::new(),
            comm_reader: procfs::TaskReader::new(proc),
            comm_keys: Vec::new(),
            comm_cursor: 0,
            last_full: None,
            last_names: None,
            names_due: 0.0,
        }
    }

    /// True when the QEMU processes or their thread lists changed since the
    /// last full discovery (reads only `/proc` and each VM's `task/`).
    fn changed(&mut self) -> bool {
        let pids = self.procs.pids(&self.proc).to_vec();
        if pids.is_empty() {
            return true;
        }
        let live: std::collections::HashSet<u32> = pids.iter().copied().collect();
        self.seen.retain(|p, _| live.contains(p));
        let root = &self.proc;
        let mut qemu = Vec::new();
        let mut new_vhost = false;
        let current = &self.current;
        for pid in pids {
            let is = match self.seen.entry(pid) {
                std::collections::hash_map::Entry::Occupied(e) => *e.get(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let argv0 = root
                        .cmdline(pid)
                        .ok()
                        .and_then(|a| a.into_iter().next())
                        .unwrap_or_default();
                    let exe = root.exe(pid).ok();
                    let is = vmscope_discover::qemu_binary(exe.as_deref(), &argv0).is_some();
                    // A kernel vhost worker (`vhost-QEMUPID`, a process of
                    // its own) that no tracked VM lists yet: discover again.
                    if !is && argv0.is_empty() {
                        let owner = root
                            .comm(pid)
                            .ok()
                            .and_then(|c| vmscope_discover::threads::vhost_owner(&c));
                        new_vhost |= owner.is_some_and(|_| {
                            !current.iter().any(|d| d.io.iter().any(|t| t.tid == pid))
                        });
                    }
                    *e.insert(is)
                }
            };
            if is {
                qemu.push(pid);
            }
        }
        if new_vhost {
            return true;
        }
        qemu.sort_unstable();
        let mut known: Vec<u32> = self.current.iter().map(|d| d.pid).collect();
        known.sort_unstable();
        if qemu != known {
            return true;
        }
        let lister = &mut self.lister;
        let tids = &self.tids;
        if self
            .current
            .iter()
            .any(|d| Some(&lister.tids(root, d.pid)) != tids.get(&d.pid))
        {
            return true;
        }
        self.check_names()
    }

    /// Re-read a share of the VM threads' names, so that every name is
    /// read once per [`NAMES_EVERY`], or per `threads / NAMES_PER_SEC`
    /// seconds when that is longer (5000 threads: every 10 s): the cost is
    /// at most [`NAMES_PER_SEC`] reads a second whatever the thread count.
    /// True when one changed.
    fn check_names(&mut self) -> bool {
        let n = self.comm_keys.len();
        if n == 0 {
            return false;
        }
        let period = NAMES_EVERY.max(std::time::Duration::from_secs_f64(n as f64 / NAMES_PER_SEC));
        let now = std::time::Instant::now();
        let since = self.last_names.map_or(period, |t| now.duration_since(t));
        let due =
            (self.names_due + n as f64 * since.as_secs_f64() / period.as_secs_f64()).min(n as f64);
        let k = due.floor() as usize;
        if k == 0 {
            return false;
        }
        self.names_due = due - k as f64;
        self.last_names = Some(now);
        let mut renamed = false;
        for _ in 0..k {
            let key = self.comm_keys[self.comm_cursor];
            self.comm_cursor += 1;
            if let (Ok(c), Some(was)) = (self.comm_reader.comm(key.0, key.1), self.comms.get(&key))
            {
                renamed |= c != *was;
            }
            if self.comm_cursor == n {
                // A whole round: close the files of threads not read in it.
                self.comm_cursor = 0;
                self.comm_reader.end_sample();
            }
        }
        renamed
    }

    pub fn current(&self) -> &[TrackedVm] {
        &self.current
    }

    /// Thread ids of VM process `pid` as of the last [`VmTracker::refresh`],
    /// which re-lists them whenever they change (no second directory walk).
    pub fn threads(&self, pid: u32) -> &[u32] {
        self.tids.get(&pid).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Discover again when something changed (no QMP: cheap) and number
    /// the VMs.
    pub fn refresh(&mut self) -> Result<Vec<Change>, crate::StatError> {
        let due = self.last_full.is_none_or(|t| t.elapsed() >= FULL_EVERY);
        if !due && !self.changed() {
            return Ok(Vec::new());
        }
        self.last_full = Some(std::time::Instant::now());
        let vms = vmscope_discover::discover(&DiscoverOptions {
            proc_root: self.proc.root().to_path_buf(),
            query_qmp: false,
            ..DiscoverOptions::default()
        })?;
        let changes = self.update(vms);
        // A full discovery lists every thread again.
        self.lister.forget(|_| false);
        let (root, lister) = (&self.proc, &mut self.lister);
        self.tids = self
            .current
            .iter()
            .map(|d| (d.pid, lister.tids(root, d.pid)))
            .collect();
        self.comms.clear();
        for (&pid, tids) in &self.tids {
            for &tid in tids {
                if let Ok(c) = self.comm_reader.comm(pid, tid) {
                    self.comms.insert((pid, tid), c);
                }
            }
        }
        self.comm_reader.end_sample();
        self.comm_keys = self.comms.keys().copied().collect();
        self.comm_keys.sort_unstable();
        self.comm_cursor = 0;
        self.last_names = Some(std::time::Instant::now());
        self.names_due = 0.0;
        Ok(changes)
    }

    /// Number `vms` against the previous set and report what changed.
    pub fn update(&mut self, vms: Vec<Vm>) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut old: HashMap<u32, TrackedVm> = self.current.drain(..).map(|d| (d.pid, d)).collect();
        let mut next = Vec::new();
        for vm in vms {
            let start = self
                .proc
                .task_stat(vm.pid, vm.pid)
                .map(|s| s.starttime)
                .unwrap_or(0);
            let id = match old.remove(&vm.pid) {
                Some(prev) if prev.start == start => {
                    for (tid, from, to) in renames(&prev, &vm) {
                        changes.push(Change::Renamed {
                            id: prev.id,
                            tid,
                            from,
                            to,
                        });
                    }
                    prev.id
                }
                Some(prev) => {
                    let id = self.alloc();
                    changes.push(Change::PidReused {
                        old: prev.id,
                        new: id,
                        pid: vm.pid,
                    });
                    id
                }
                None => {
                    let id = self.alloc();
                    changes.push(Change::Started {
                        id,
                        name: vm.name.clone(),
                        pid: vm.pid,
                    });
                    id
                }
            };
            next.push(domain_of(id, start, vm));
        }
        let mut gone: Vec<TrackedVm> = old.into_values().collect();
        gone.sort_by_key(|d| d.id);
        for d in gone {
            self.names.remove(&d.id);
            changes.push(Change::Exited {
                id: d.id,
                name: d.name,
                pid: d.pid,
            });
        }
        next.sort_by_key(|d| d.id);
        for d in &next {
            self.names.insert(d.id, d.name.clone());
        }
        self.current = next;
        changes
    }

    fn alloc(&mut self) -> u32 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// `d1=name (pid P) ...`, the legend line.
    pub fn legend(&self) -> String {
        let mut s = String::from("d0=host");
        for d in &self.current {
            s.push_str(&format!(
                " d{}={} (pid {})",
                d.id,
                vmscope_model::text::visible_cut(&d.name, vmscope_model::text::NAME_WIDTH),
                d.pid
            ));
        }
        s
    }

    /// `tid -> (domain, Some(vcpu index) | None for the VM's other threads)`.
    pub fn tid_map(&self) -> HashMap<u32, (u32, Option<u32>)> {
        let mut m = HashMap::new();
        for d in &self.current {
            for t in &d.io {
                m.insert(t.tid, (d.id, None));
            }
            // Every thread of the QEMU process is the VM's, even unnamed ones.
            for &tid in self.threads(d.pid) {
                m.entry(tid).or_insert((d.id, None));
            }
            for (i, t) in &d.vcpus {
                m.insert(t.tid, (d.id, Some(*i)));
            }
        }
        m
    }
}

fn renames(prev: &TrackedVm, vm: &Vm) -> Vec<(u32, String, String)> {
    let old: HashMap<u32, &str> = prev
        .vcpus
        .iter()
        .map(|(_, t)| t)
        .chain(prev.io.iter())
        .map(|t| (t.tid, t.name.as_str()))
        .collect();
    vm.vcpus
        .iter()
        .chain(vm.io_threads.iter())
        .filter_map(|t| {
            let was = old.get(&t.tid)?;
            (*was != t.name).then(|| (t.tid, was.to_string(), t.name.clone()))
        })
        .collect()
}

fn domain_of(id: u32, start: u64, vm: Vm) -> TrackedVm {
    let vcpus = vm
        .vcpus
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                t.index.unwrap_or(i as u32),
                Thread {
                    pid: vm.pid,
                    tid: t.tid,
                    name: t.name.clone(),
                },
            )
        })
        .collect();
    let mut io: Vec<Thread> = vm
        .io_threads
        .iter()
        .map(|t| Thread {
            pid: vm.pid,
            tid: t.tid,
            name: t.name.clone(),
        })
        .collect();
    for w in &vm.vhost {
        // Kernel vhost threads are processes of their own; new-style vhost
        // workers are threads of QEMU and may already be listed.
        if io.iter().any(|t| t.tid == w.tid) {
            continue;
        }
        io.push(Thread {
            pid: if w.kernel_thread { w.tid } else { vm.pid },
            tid: w.tid,
            name: w.name.clone(),
        });
    }
    TrackedVm {
        id,
        name: vm.name.clone(),
        pid: vm.pid,
        start,
        vcpus,
        io,
        taps: vm.taps.clone(),
        qmp: vm.qmp.clone(),
        vm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_discover::{Accel, ThreadKind, VmThread};

    fn vm(name: &str, pid: u32, vcpu_names: &[(u32, &str)]) -> Vm {
        Vm {
            name: name.into(),
            pid,
            uuid: None,
            exe: None,
            accel: Accel::Kvm,
            vcpus: vcpu_names
                .iter()
                .enumerate()
                .map(|(i, (tid, n))| VmThread {
                    tid: *tid,
                    index: Some(i as u32),
                    name: n.to_string(),
                    kind: ThreadKind::Vcpu,
                })
                .collect(),
            io_threads: vec![],
            vhost: vec![],
            disks: vec![],
            taps: vec![],
            qmp: None,
            qmp_used: false,
            agent: Default::default(),
            libvirt: None,
            cmdline: vec![],
            warnings: vec![],
        }
    }

    fn set_start(root: &std::path::Path, pid: u32, start: u64) {
        let dir = root.join(format!("{pid}/task/{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let fields: Vec<String> = (1..=35)
            .map(|i| {
                if i == 19 {
                    start.to_string()
                } else {
                    i.to_string()
                }
            })
            .collect();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (qemu) S {} 0 0 0", fields.join(" ")),
        )
        .unwrap();
    }

    #[test]
    fn numbers_are_stable_and_changes_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        set_start(root, 100, 5000);
        set_start(root, 200, 6000);
        let mut d = VmTracker::new(&ProcRoot::new(root));
        let c = d.update(vec![vm("a", 100, &[(101, "CPU 0/KVM")]), vm("b", 200, &[])]);
        assert_eq!(c.len(), 2);
        assert_eq!(d.legend(), "d0=host d1=a (pid 100) d2=b (pid 200)");
        assert_eq!(d.tid_map().get(&101), Some(&(1, Some(0))));
        // Same processes: no change; a renamed thread is reported.
        let c = d.update(vec![vm("a", 100, &[(101, "x")]), vm("b", 200, &[])]);
        assert_eq!(
            c,
            vec![Change::Renamed {
                id: 1,
                tid: 101,
                from: "CPU 0/KVM".into(),
                to: "x".into()
            }]
        );
        // b exits, a's pid is reused by a new process, c starts.
        set_start(root, 100, 9000);
        set_start(root, 300, 9100);
        let c = d.update(vec![vm("a2", 100, &[]), vm("c", 300, &[])]);
        let text: Vec<String> = c.iter().map(std::string::ToString::to_string).collect();
        assert_eq!(
            text,
            vec![
                "pid 100 reused: d1 exited, d3 is a new VM",
                "d4 c (pid 300) started",
                "d2 b (pid 200) exited",
            ]
        );
        assert_eq!(d.legend(), "d0=host d3=a2 (pid 100) d4=c (pid 300)");
    }

    #[test]
    fn names_are_re_read_in_a_bounded_rolling_round() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for tid in 101..=110u32 {
            let dir = root.join(format!("100/task/{tid}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("comm"), format!("CPU {tid}/KVM\n")).unwrap();
        }
        let mut d = VmTracker::new(&ProcRoot::new(root));
        for tid in 101..=110u32 {
            d.comms.insert((100, tid), format!("CPU {tid}/KVM"));
        }
        d.comm_keys = d.comms.keys().copied().collect();
        d.comm_keys.sort_unstable();
        let ago = |ms| Some(std::time::Instant::now() - std::time::Duration::from_millis(ms));
        // 10 names, every one once per 2 s: half a second reads 2 of them.
        d.last_names = ago(500);
        assert!(!d.check_names());
        assert_eq!(d.comm_cursor, 2);
        assert_eq!(d.comm_reader.open_files(), 2);
        // Too soon for a whole name: nothing read, the time is kept.
        d.names_due = 0.0;
        d.last_names = ago(100);
        assert!(!d.check_names());
        assert_eq!(d.comm_cursor, 2);
        // What rounding left over counts at the next check: 0.6 due and
        // 0.1 s (0.5 of a name) make one read.
        d.names_due = 0.6;
        d.last_names = ago(100);
        assert!(!d.check_names());
        assert_eq!(d.comm_cursor, 3);
        assert!(d.names_due < 0.2, "{}", d.names_due);
        // A rename among the next two is found.
        std::fs::write(root.join("100/task/105/comm"), "renamed\n").unwrap();
        d.names_due = 0.0;
        d.last_names = ago(500);
        assert!(d.check_names());
        assert_eq!(d.comm_cursor, 5);
        // A long pause reads the round once, not more, and wraps.
        d.last_names = ago(60_000);
        d.check_names();
        assert_eq!(d.comm_cursor, 5);
        assert_eq!(d.comm_reader.open_files(), 10);
        // With 5000 names the round takes 10 s: 1 s reads 500.
        let n = 5000.0_f64;
        let period = NAMES_EVERY.max(std::time::Duration::from_secs_f64(n / NAMES_PER_SEC));
        assert_eq!(period.as_secs(), 10);
    }
}
