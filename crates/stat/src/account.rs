//! `account`: per VM and interval, Cherkasova's accounting on KVM/QEMU
//! (docs/architecture.md §5): vCPU run / runnable (steal) / blocked from `schedstat`,
//! direct I/O (the VM's own non-vCPU threads), I/O operations (tap packets;
//! virtio disk requests from QMP `query-blockstats`, else through libvirt
//! when libvirtd holds the monitor (`libvirt_io`), else `/proc/PID/io`
//! syscalls), the VM's charge for shared host I/O work (softirq time,
//! `ksoftirqd` threads, `--shared-io` processes) and the reconciliation with
//! the host's measured CPU. [`Accountant`] does the sampling; the numbers
//! come from [`crate::math`].
//!
//! Softirq time comes from the `irq:softirq_entry`/`softirq_exit`
//! tracepoints when they can be opened: exact per vector and per context
//! task. Only the I/O vectors (NET_TX, NET_RX, BLOCK, IRQ_POLL) are shared
//! I/O work; an I/O softirq that ran in a VM thread's context (a tap write
//! that received the packet on the spot) is taken out of that thread's
//! time and charged by the rule instead, so it is not counted twice.
//! Without the tracepoints, `/proc/stat`'s softirq column is used: every
//! vector, sampled at the tick.

use crate::math::{self, Reconciliation};
use crate::tracker::{Change, TrackedVm, VmTracker};
use crate::wait::{ThreadRole, ThreadWait, WaitShare};
use crate::wait_source::{WaitChoice, WaitSource};
use crate::StatError;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vmscope_linux::procfs::{self, ProcRoot, ProcStat, SchedStat};

/// What to sample and where.
#[derive(Debug, Clone)]
pub struct AccountOptions {
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
    /// Processes whose CPU is shared I/O work (a storage or switch daemon).
    pub shared_io_pids: Vec<u32>,
    /// Ask QMP `query-blockstats` for disk requests when a socket is known.
    pub use_qmp: bool,
    pub qmp_timeout: Duration,
    /// Measure softirq time with the softirq tracepoints (else `/proc/stat`).
    pub softirq_tracepoints: bool,
    /// Charge each vCPU and I/O thread's waiting to what ran instead
    /// ([`crate::wait_source`]: the eBPF programs, else the scheduler
    /// tracepoints' rings).
    pub wait: WaitChoice,
}

impl Default for AccountOptions {
    fn default() -> Self {
        AccountOptions {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            shared_io_pids: Vec::new(),
            use_qmp: true,
            qmp_timeout: Duration::from_millis(200),
            softirq_tracepoints: true,
            wait: WaitChoice::Auto,
        }
    }
}

/// One vCPU in one interval, seconds.
#[derive(Debug, Clone, Serialize)]
pub struct VcpuAccount {
    pub index: u32,
    pub tid: u32,
    pub run_s: f64,
    pub runnable_s: f64,
    pub blocked_s: f64,
    /// Its runnable time by what ran instead, largest first (empty without
    /// wait attribution). Sums to `runnable_s` up to waits whose start was
    /// not seen.
    pub waited_behind: Vec<WaitShare>,
    /// Waits that ended (switched in) or moved (migrated) in the interval
    /// with their start seen (0 without wait attribution): `runnable_s` /
    /// `waits` is the mean wait.
    pub waits: u64,
}

/// I/O operations of one device in one interval.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceOps {
    /// `tap:NAME`, `disk:ID` or `proc-io`.
    pub device: String,
    pub ops: u64,
    pub bytes: u64,
}

/// One VM in one interval.
#[derive(Debug, Clone, Serialize)]
pub struct VmAccount {
    pub domain: u32,
    pub name: String,
    pub pid: u32,
    pub vcpus: Vec<VcpuAccount>,
    pub vcpu_run_s: f64,
    pub vcpu_runnable_s: f64,
    pub vcpu_blocked_s: f64,
    /// What its vCPUs waited behind, summed over them, largest first.
    pub waited_behind: Vec<WaitShare>,
    /// Σ `waited_behind`: the vCPUs' runnable time attributed.
    pub wait_attributed_s: f64,
    /// Σ the vCPUs' `waits`.
    pub vcpu_waits: u64,
    pub direct_io_s: f64,
    /// Runnable time (`run_delay`) of the VM's own non-vCPU threads.
    pub io_runnable_s: f64,
    /// What those threads waited behind, largest first.
    pub io_waited_behind: Vec<WaitShare>,
    pub io_wait_attributed_s: f64,
    pub devices: Vec<DeviceOps>,
    /// N_i: packets on its taps + requests on its disks.
    pub io_ops: u64,
    pub net_packets: u64,
    pub disk_ops: u64,
    pub disk_bytes: u64,
    /// Where disk requests came from: `qmp`, `libvirt` (QEMU's counters
    /// through libvirtd, which holds the monitor), `proc-io` or `none`.
    pub disk_source: &'static str,
    pub shared_io_s: f64,
    /// vCPU run + direct I/O + shared I/O charge.
    pub total_s: f64,
    /// What happened to the VM in this interval (started, exited, ...).
    pub notes: Vec<String>,
}

impl VmAccount {
    /// A VM with nothing counted yet.
    pub fn empty(domain: u32, name: String, pid: u32) -> VmAccount {
        VmAccount {
            domain,
            name,
            pid,
            vcpus: Vec::new(),
            vcpu_run_s: 0.0,
            vcpu_runnable_s: 0.0,
            vcpu_blocked_s: 0.0,
            waited_behind: Vec::new(),
            wait_attributed_s: 0.0,
            vcpu_waits: 0,
            direct_io_s: 0.0,
            io_runnable_s: 0.0,
            io_waited_behind: Vec::new(),
            io_wait_attributed_s: 0.0,
            devices: Vec::new(),
            io_ops: 0,
            net_packets: 0,
            disk_ops: 0,
            disk_bytes: 0,
            disk_source: "none",
            shared_io_s: 0.0,
            total_s: 0.0,
            notes: Vec::new(),
        }
    }
}

/// One interval of the whole host.
#[derive(Debug, Clone, Serialize)]
pub struct AccountInterval {
    /// Seconds since the first sample.
    pub time_s: f64,
    pub interval_s: f64,
    pub vms: Vec<VmAccount>,
    /// T: shared host I/O time (softirq + ksoftirqd + `--shared-io`).
    pub shared_io_s: f64,
    /// The softirq part of T: the I/O vectors' time from the tracepoints,
    /// or every vector's from `/proc/stat` without them.
    pub softirq_io_s: f64,
    /// Softirq time per vector (tracepoints only), seconds.
    pub softirq_by_vector_s: std::collections::BTreeMap<String, f64>,
    pub shared_ops: u64,
    /// T / ΣN, seconds per operation.
    pub cost_per_op_s: f64,
    /// Busy host CPU: wall time less idle and iowait, less the steal that
    /// fell in busy time, all CPUs ([`ProcStat::busy_from_idle`]).
    pub measured_host_s: f64,
    /// Run time of every task that is neither a VM's nor shared I/O work.
    pub other_tasks_s: f64,
    /// Host CPU charged to no VM, measured on its own (see
    /// [`Reconciliation::unattributed`]).
    pub unattributed_s: f64,
    /// Tasks that exited during the interval (their last slice is lost).
    pub exited_tasks: u64,
    /// CPU time of tasks that exited during the interval after the last
    /// read of their `schedstat` (or started and exited inside it), from
    /// the kernel's taskstats exit records; included in the VM rows and in
    /// `other_tasks_s`.
    pub exited_tasks_s: f64,
    /// Online CPUs × interval.
    pub capacity_s: f64,
    /// Busy seconds per host CPU, as `measured_host_s`.
    pub cpu_busy_s: Vec<(u32, f64)>,
    pub notes: Vec<String>,
}

impl AccountInterval {
    pub fn reconciliation(&self) -> Reconciliation {
        let totals: Vec<f64> = self.vms.iter().map(|v| v.total_s).collect();
        Reconciliation::new(self.measured_host_s, &totals, self.unattributed_s)
    }
}

#[derive(Debug, Clone, Default)]
struct VmCounters {
    devices: HashMap<String, (u64, u64)>,
    disk_source: &'static str,
}

struct Snapshot {
    at: Instant,
    stat: ProcStat,
    /// (pid, tid) -> schedstat, for every thread read.
    threads: HashMap<(u32, u32), SchedStat>,
    /// (pid, tid) -> run ns of every other task on the host.
    others: HashMap<(u32, u32), u64>,
    /// Softirq time since the previous snapshot (tracepoints).
    softirq: Option<vmscope_linux::SoftirqTotals>,
    /// Waits committed since the previous snapshot, by thread.
    waits: Option<HashMap<u32, ThreadWait>>,
    io: HashMap<u32, VmCounters>,
    domains: Vec<TrackedVm>,
}

/// Samples the host; each [`Accountant::sample`] after the first returns
/// the interval since the previous one.
pub struct Accountant {
    opts: AccountOptions,
    proc: ProcRoot,
    domains: VmTracker,
    ksoftirqd: Vec<u32>,
    reader: procfs::TaskReader,
    prev: Option<Snapshot>,
    first: Option<Instant>,
    /// Notes about devices that vanished, reported once.
    gone_devices: HashMap<u32, Vec<String>>,
    /// Each VM's device counters as last read (by domain id), so a device
    /// missing from one sample (a QMP query that timed out, and the
    /// `/proc/PID/io` fallback in its place) resumes from its last value
    /// instead of counting nothing for the interval after.
    last_devices: HashMap<u32, HashMap<String, (u64, u64)>>,
    /// Thread lists of every process, for the other-tasks scan.
    lister: procfs::TaskLister,
    relisted: Instant,
    /// The softirq tracepoints, or why they are not used.
    softirq: Result<vmscope_linux::SoftirqRecorder, String>,
    /// `CONFIG_IRQ_TIME_ACCOUNTING`, or `None` if the config is unknown.
    irqtime: Option<bool>,
    /// Whether tasks' run time holds the softirqs that interrupted them.
    sirq_in_tasks: bool,
    softirq_lost: u64,
    /// Where the waited-behind split comes from, or why there is none.
    waits: Result<WaitSource, String>,
    /// Notes of the last drain of `waits`, for the interval's notes.
    wait_notes: Vec<String>,
    /// Host culprits' processes by thread id (see `vm_rows`).
    host_procs: HashMap<u32, Option<(u32, String)>>,
    /// taskstats exit records, or why there are none.
    exits: Result<vmscope_linux::ExitListener, String>,
    /// Exit records not yet matched to an interval, with their age in
    /// intervals.
    exit_pool: Vec<(vmscope_linux::TaskExit, u8)>,
    exit_overruns: u64,
    /// QEMU's block counters through libvirt, for VMs whose monitor
    /// libvirtd holds.
    libvirt: crate::libvirt_io::LibvirtIo,
}

/// Every process's thread list is walked again at least this often (a
/// thread that exits while another starts keeps the count the lister
/// checks).
const RELIST_EVERY: Duration = Duration::from_secs(2);

/// Host culprits' processes kept between intervals.
const HOST_PROCS_KEPT: usize = 4096;

impl Accountant {
    pub fn new(opts: AccountOptions) -> Accountant {
        let proc = ProcRoot::new(&opts.proc_root);
        let ksoftirqd = proc.pids_by_comm_prefix("ksoftirqd/");
        // Small rings: a softirq is two 48-byte records and the rings are
        // drained every interval.
        let softirq = if opts.softirq_tracepoints {
            vmscope_linux::SoftirqRecorder::open(64).map_err(|e| e.to_string())
        } else {
            Err("not asked for".to_string())
        };
        let irqtime = vmscope_linux::irq_time_accounting();
        let waits = WaitSource::open(opts.wait);
        Accountant {
            waits,
            wait_notes: Vec::new(),
            host_procs: HashMap::new(),
            softirq,
            irqtime,
            sirq_in_tasks: irqtime != Some(true),
            softirq_lost: 0,
            exits: vmscope_linux::online_cpus(&opts.sys_root)
                .map_err(|e| e.to_string())
                .and_then(|cpus| {
                    vmscope_linux::ExitListener::open(&cpus).map_err(|e| e.to_string())
                }),
            exit_pool: Vec::new(),
            exit_overruns: 0,
            libvirt: crate::libvirt_io::LibvirtIo::new(Duration::from_secs(2)),
            domains: VmTracker::new(&proc),
            reader: procfs::TaskReader::new(&proc),
            proc,
            opts,
            ksoftirqd,
            prev: None,
            first: None,
            gone_devices: HashMap::new(),
            last_devices: HashMap::new(),
            lister: procfs::TaskLister::default(),
            relisted: Instant::now(),
        }
    }

    pub fn tracker(&self) -> &VmTracker {
        &self.domains
    }

    /// Where the softirq part of shared I/O time comes from, for headers.
    pub fn softirq_source(&self) -> String {
        let irqtime = match self.irqtime {
            Some(true) => "IRQ_TIME_ACCOUNTING on: task run times leave softirqs out",
            Some(false) => {
                "no IRQ_TIME_ACCOUNTING: task run times hold the softirqs that interrupted them"
            }
            None => "kernel config unreadable: assuming task run times hold softirqs",
        };
        match (&self.softirq, self.irqtime) {
            (Ok(_), _) => format!("softirq tracepoints (exact; I/O vectors NET_TX, NET_RX, BLOCK, IRQ_POLL); {irqtime}"),
            (Err(why), Some(true)) => format!("/proc/stat softirq, every vector (tracepoints: {why}); {irqtime}"),
            (Err(why), _) => format!("/proc/stat softirq, every vector, sampled at the tick (tracepoints: {why}); {irqtime}"),
        }
    }

    /// Where the waited-behind split comes from, for headers.
    pub fn wait_source(&self) -> String {
        match &self.waits {
            Ok(w) => w.describe(),
            Err(why) => format!("none ({why})"),
        }
    }

    /// Take a sample. Returns `None` on the first call (the baseline),
    /// otherwise the interval since the previous sample.
    pub fn sample(&mut self) -> Result<(Option<AccountInterval>, Vec<Change>), StatError> {
        let changes = self.domains.refresh()?;
        if let Ok(w) = &mut self.waits {
            w.follow(self.domains.tid_map().into_keys().collect());
        }
        let snap = self.snapshot()?;
        let first = *self.first.get_or_insert(snap.at);
        let prev = self.prev.take();
        let out = prev
            .as_ref()
            .map(|prev| self.interval(prev, &snap, &changes, first));
        self.prev = Some(snap);
        Ok((out, changes))
    }

    fn snapshot(&mut self) -> Result<Snapshot, StatError> {
        let root = &self.proc;
        let stat = root.cpu_times()?;
        let at = Instant::now();
        let softirq = self
            .softirq
            .as_mut()
            .ok()
            .map(vmscope_linux::SoftirqRecorder::take);
        // Waits that end before this instant belong to this interval; they
        // are taken right before the threads' schedstat is read, so that
        // the split and `run_delay` cut the interval at nearly one moment.
        let wait_cut = vmscope_linux::clock_monotonic_ns();
        let waits = self.waits.as_mut().ok().map(|w| {
            let (waits, notes) = w.take(wait_cut);
            self.wait_notes.extend(notes);
            waits
        });
        let mut threads = HashMap::new();
        let mut io = HashMap::new();
        let reader = &mut self.reader;
        let mut read = |threads: &mut HashMap<(u32, u32), SchedStat>, pid: u32, tid: u32| {
            if let Ok(s) = reader.schedstat(pid, tid) {
                threads.insert((pid, tid), s);
            }
        };
        for d in self.domains.current() {
            for (_, t) in &d.vcpus {
                read(&mut threads, t.pid, t.tid);
            }
            for t in &d.io {
                read(&mut threads, t.pid, t.tid);
            }
            // Unnamed threads of the QEMU process are the VM's too.
            for &tid in self.domains.threads(d.pid) {
                if !threads.contains_key(&(d.pid, tid)) {
                    read(&mut threads, d.pid, tid);
                }
            }
        }
        for &pid in self.ksoftirqd.iter().chain(self.opts.shared_io_pids.iter()) {
            for tid in root.tids(pid).unwrap_or_default() {
                read(&mut threads, pid, tid);
            }
        }
        // Every other task, for an unattributed time measured on its own
        // rather than left as the remainder.
        let mut others = HashMap::new();
        let vm_pids: Vec<u32> = self.domains.current().iter().map(|d| d.pid).collect();
        let pids = self.domains.pids();
        if self.relisted.elapsed() >= RELIST_EVERY {
            self.lister.forget(|_| false);
            self.relisted = Instant::now();
        } else {
            let live: std::collections::HashSet<u32> = pids.iter().copied().collect();
            self.lister.forget(|p| live.contains(&p));
        }
        for pid in pids {
            if vm_pids.contains(&pid) {
                continue;
            }
            for tid in self.lister.tids(root, pid) {
                if threads.contains_key(&(pid, tid)) {
                    continue;
                }
                if let Ok(s) = self.reader.schedstat(pid, tid) {
                    others.insert((pid, tid), s.run_ns);
                }
            }
        }
        self.reader.end_sample();
        // Exits so far (after the reads: a task read above that exits now
        // is matched at the next interval).
        if let Ok(l) = &mut self.exits {
            let mut got = Vec::new();
            if l.drain(&mut got).is_ok() {
                self.exit_pool.extend(got.into_iter().map(|e| (e, 0)));
            }
        }
        for d in self.domains.current() {
            let mut c = VmCounters::default();
            for tap in &d.taps {
                if let Ok(n) = vmscope_linux::net_stats(&self.opts.sys_root, tap) {
                    c.devices.insert(
                        format!("tap:{tap}"),
                        (n.rx_packets + n.tx_packets, n.rx_bytes + n.tx_bytes),
                    );
                } else {
                    let notes = self.gone_devices.entry(d.id).or_default();
                    let note = format!("tap {tap} unavailable");
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
            }
            let disks = if self.opts.use_qmp {
                d.qmp
                    .as_ref()
                    .and_then(|q| blockstats(q, self.opts.qmp_timeout))
            } else {
                None
            };
            let (disks, source) = match disks {
                Some(l) => (Some(l), "qmp"),
                None if self.opts.use_qmp => match self.libvirt.blockstats(&d.vm) {
                    Ok(l) => (l, "libvirt"),
                    Err(why) => {
                        self.gone_devices
                            .entry(d.id)
                            .or_default()
                            .push(format!("disk requests not from QEMU's counters: {why}"));
                        (None, "none")
                    }
                },
                None => (None, "none"),
            };
            match disks {
                Some(list) => {
                    c.disk_source = source;
                    for (dev, ops, bytes) in list {
                        c.devices.insert(format!("disk:{dev}"), (ops, bytes));
                    }
                }
                None => match self.reader.process_io(d.pid) {
                    Ok(p) => {
                        c.disk_source = "proc-io";
                        c.devices
                            .insert("proc-io".into(), (p.syscr + p.syscw, p.rchar + p.wchar));
                    }
                    Err(_) => c.disk_source = "none",
                },
            }
            io.insert(d.id, c);
        }
        Ok(Snapshot {
            at,
            stat,
            threads,
            others,
            softirq,
            waits,
            io,
            domains: self.domains.current().to_vec(),
        })
    }

    /// The interval between two samples, stage by stage.
    fn interval(
        &mut self,
        prev: &Snapshot,
        cur: &Snapshot,
        changes: &[Change],
        first: Instant,
    ) -> AccountInterval {
        let dt = cur.at.duration_since(prev.at).as_secs_f64();
        let exits = self.match_exits(prev, cur);
        let roles = self.roles(cur);
        let mut rows = self.vm_rows(prev, cur, &exits, dt, &roles);
        let exited_notes = vm_changes(changes, prev, &exits, &mut rows, self.exits.is_ok());
        let shared = self.shared_io(prev, cur);
        let ops: Vec<u64> = rows.vms.iter().map(|v| v.io_ops).collect();
        let (cost, charges) = math::charge(shared.total_s, &ops);
        for (v, c) in rows.vms.iter_mut().zip(charges) {
            v.shared_io_s = c;
            v.total_s = v.vcpu_run_s + v.direct_io_s + c;
        }
        // Busy time from the idle side (exact idle on NO_HZ; interrupt
        // work on idle CPUs counts): see ProcStat::busy_from_idle.
        let cpu_busy_s = ProcStat::busy_from_idle(&prev.stat, &cur.stat, dt);
        let measured: f64 = cpu_busy_s.iter().map(|(_, b)| b).sum();
        let others = other_tasks(prev, cur, &exits);
        let other_tasks_s = others.run_ns as f64 / 1e9;
        let charged: f64 = rows.vms.iter().map(|v| v.shared_io_s).sum();
        // The I/O softirq time inside other tasks' run time (already in T):
        // with the tracepoints, what is left after the VM threads, the
        // shared threads and the idle task; from /proc/stat, all of it (the
        // tick charged it to whichever task it interrupted). None of it with
        // IRQ_TIME_ACCOUNTING, where tasks' run time leaves softirqs out.
        let sirq_in_others = match (cur.softirq.as_ref(), self.sirq_in_tasks) {
            (_, false) => 0.0,
            (Some(s), true) => (shared.softirq_io_s
                - rows.vm_thread_sirq_s
                - shared.threads_sirq_io_s
                - s.io_ns_of(0) as f64 / 1e9)
                .max(0.0),
            (None, true) => shared.softirq_io_s,
        };
        let unattributed =
            other_tasks_s - sirq_in_others + (shared.total_s - charged) + shared.outside_tasks_s;
        let mut notes = exited_notes.notes;
        notes.extend(self.lost_record_notes());
        AccountInterval {
            time_s: cur.at.duration_since(first).as_secs_f64(),
            interval_s: dt,
            shared_ops: ops.iter().sum(),
            vms: rows.vms,
            shared_io_s: shared.total_s,
            softirq_io_s: shared.softirq_io_s,
            softirq_by_vector_s: shared.by_vector_s,
            cost_per_op_s: cost,
            measured_host_s: measured,
            other_tasks_s,
            unattributed_s: unattributed,
            exited_tasks: others.exited_tasks,
            exited_tasks_s: rows.exited_s + exited_notes.exited_s + others.exited_ns as f64 / 1e9,
            capacity_s: dt * cur.stat.cpus.len() as f64,
            cpu_busy_s,
            notes,
        }
    }

    /// Exit records matched to the interval: a task seen in the previous
    /// sample and gone now gets its last slice (run at exit − run then);
    /// one never seen started and exited inside the interval. A record of
    /// a task still in this sample (it exited after being read) waits one
    /// interval, then is dropped (its id was reused).
    fn match_exits(&mut self, prev: &Snapshot, cur: &Snapshot) -> ExitMatch {
        let mut m = ExitMatch::default();
        if self.exit_pool.is_empty() {
            return m;
        }
        let tids_of = |s: &Snapshot| -> std::collections::HashSet<u32> {
            s.threads
                .keys()
                .chain(s.others.keys())
                .map(|k| k.1)
                .collect()
        };
        let (cur_tids, prev_tids) = (tids_of(cur), tids_of(prev));
        let mut keep = Vec::new();
        for (e, age) in self.exit_pool.drain(..) {
            if cur_tids.contains(&e.tid) {
                if age == 0 {
                    keep.push((e, 1));
                }
            } else if prev_tids.contains(&e.tid) {
                m.run_at_exit.insert(e.tid, e.run_ns);
            } else {
                m.unseen_ns += e.run_ns;
            }
        }
        self.exit_pool = keep;
        m
    }

    /// Every VM thread's role, for naming culprits: the sample's vCPU and
    /// I/O threads, and every other thread of the QEMU processes.
    fn roles(&self, cur: &Snapshot) -> HashMap<u32, ThreadRole> {
        let mut roles = HashMap::new();
        for d in &cur.domains {
            let role = |vcpu| ThreadRole {
                domain: d.id,
                vm: d.name.clone(),
                vcpu,
            };
            for &tid in self.domains.threads(d.pid) {
                roles.insert(tid, role(None));
            }
            for t in &d.io {
                roles.insert(t.tid, role(None));
            }
            for (i, t) in &d.vcpus {
                roles.insert(t.tid, role(Some(*i)));
            }
        }
        roles
    }

    /// One row per VM in the current sample: vCPU run / runnable / blocked,
    /// direct I/O of its other threads, the last slice of its threads that
    /// exited, and its I/O operations.
    fn vm_rows(
        &mut self,
        prev: &Snapshot,
        cur: &Snapshot,
        exits: &ExitMatch,
        dt: f64,
        roles: &HashMap<u32, ThreadRole>,
    ) -> VmRows {
        let prev_ids: HashMap<u32, &TrackedVm> = prev.domains.iter().map(|d| (d.id, d)).collect();
        // A thread missing from the previous sample appeared during the
        // interval (a new worker, a VM that just started): all the time it
        // has counted is inside the interval.
        let run_of = |key: (u32, u32)| -> Option<(Option<SchedStat>, SchedStat)> {
            let c = *cur.threads.get(&key)?;
            Some((prev.threads.get(&key).copied(), c))
        };
        // I/O softirq seconds that ran in the context of VM thread `tid`
        // and are inside its run time (without IRQ_TIME_ACCOUNTING the
        // kernel counts a softirq in whatever task it interrupted).
        let sirq_in_tasks = self.sirq_in_tasks;
        let io_softirq_s = |tid: u32| {
            if !sirq_in_tasks {
                return 0.0;
            }
            cur.softirq
                .as_ref()
                .map_or(0.0, |s| s.io_ns_of(tid) as f64 / 1e9)
        };
        // Host culprits by process: thread id -> (process id, its name),
        // looked up once per thread (the cache is emptied when it grows).
        if self.host_procs.len() > HOST_PROCS_KEPT {
            self.host_procs.clear();
        }
        let mut host_procs = std::mem::take(&mut self.host_procs);
        let proc = self.proc.clone();
        let mut process = |tid: u32| {
            host_procs
                .entry(tid)
                .or_insert_with(|| {
                    let pid = proc.tgid(tid).ok()?;
                    Some((pid, proc.comm(pid).ok()?))
                })
                .clone()
        };
        let mut out = VmRows::default();
        for d in &cur.domains {
            let is_new = !prev_ids.contains_key(&d.id);
            let mut v = VmAccount::empty(d.id, d.name.clone(), d.pid);
            let mut vcpu_tids = Vec::new();
            let mut io_tids = Vec::new();
            for (index, t) in &d.vcpus {
                vcpu_tids.push(t.tid);
                let Some((p, c)) = run_of((t.pid, t.tid)) else {
                    v.notes.push(format!("vCPU {index} thread {} gone", t.tid));
                    continue;
                };
                // A vCPU that started mid-interval was not there before it.
                let span = if is_new {
                    dt.min(c.run_ns as f64 / 1e9 + c.wait_ns as f64 / 1e9)
                } else {
                    dt
                };
                let s = math::vcpu_split(p, c, span);
                // I/O softirqs that interrupted the vCPU thread are shared
                // I/O work, charged by the rule below.
                let sirq = io_softirq_s(t.tid).min(s.run);
                out.vm_thread_sirq_s += sirq;
                let s = math::VcpuSplit {
                    run: s.run - sirq,
                    ..s
                };
                let (waited_behind, waits) = match &cur.waits {
                    Some(w) => (
                        crate::wait::shares(w.get(&t.tid), d.id, roles, &mut process),
                        w.get(&t.tid).map_or(0, |x| x.waits),
                    ),
                    None => (Vec::new(), 0),
                };
                v.vcpus.push(VcpuAccount {
                    index: *index,
                    tid: t.tid,
                    run_s: s.run,
                    runnable_s: s.runnable,
                    blocked_s: s.blocked,
                    waited_behind,
                    waits,
                });
                v.vcpu_waits += waits;
                v.vcpu_run_s += s.run;
                v.vcpu_runnable_s += s.runnable;
                v.vcpu_blocked_s += s.blocked;
            }
            for (&(pid, tid), _) in cur.threads.iter().filter(|((pid, tid), _)| {
                (*pid == d.pid || d.io.iter().any(|t| t.pid == *pid && t.tid == *tid))
                    && !vcpu_tids.contains(tid)
            }) {
                if let Some((p, c)) = run_of((pid, tid)) {
                    let run = math::run_seconds(p, c);
                    v.io_runnable_s +=
                        c.wait_ns.saturating_sub(p.map_or(0, |p| p.wait_ns)) as f64 / 1e9;
                    io_tids.push(tid);
                    let sirq = io_softirq_s(tid).min(run);
                    out.vm_thread_sirq_s += sirq;
                    v.direct_io_s += run - sirq;
                }
            }
            if let Some(w) = &cur.waits {
                v.waited_behind = crate::wait::shares(
                    vcpu_tids.iter().filter_map(|t| w.get(t)),
                    d.id,
                    roles,
                    &mut process,
                );
                v.io_waited_behind = crate::wait::shares(
                    io_tids.iter().filter_map(|t| w.get(t)),
                    d.id,
                    roles,
                    &mut process,
                );
                let sum = |l: &[WaitShare]| l.iter().fold(0.0, |a, x| a + x.seconds);
                v.wait_attributed_s = sum(&v.waited_behind);
                v.io_wait_attributed_s = sum(&v.io_waited_behind);
            }
            // Threads that exited during the interval: their last slice.
            if !is_new {
                for (&key, p) in prev
                    .threads
                    .iter()
                    .filter(|(k, _)| k.0 == d.pid && !cur.threads.contains_key(k))
                {
                    let x = exits.last_slice(key, p.run_ns);
                    out.exited_s += x;
                    if vcpu_tids.contains(&key.1) {
                        v.vcpu_run_s += x;
                    } else {
                        v.direct_io_s += x;
                    }
                }
            }
            self.device_ops(d, prev, cur, is_new, &mut v);
            out.vms.push(v);
        }
        self.last_devices
            .retain(|id, _| cur.domains.iter().any(|d| d.id == *id));
        self.host_procs = host_procs;
        out
    }

    /// A VM's I/O operations in the interval: packets on its taps, requests
    /// on its disks, each device from its last known counters.
    fn device_ops(
        &mut self,
        d: &TrackedVm,
        prev: &Snapshot,
        cur: &Snapshot,
        is_new: bool,
        v: &mut VmAccount,
    ) {
        let c_io = cur.io.get(&d.id).cloned().unwrap_or_default();
        let p_io = prev.io.get(&d.id);
        v.disk_source = c_io.disk_source;
        let mut devs: Vec<_> = c_io.devices.iter().collect();
        devs.sort_by(|a, b| a.0.cmp(b.0));
        for (dev, &(ops, bytes)) in devs {
            let last = p_io
                .and_then(|p| p.devices.get(dev))
                .or_else(|| self.last_devices.get(&d.id).and_then(|m| m.get(dev)));
            let (pops, pbytes) = match last {
                Some(&x) => x,
                None if is_new => (0, 0),
                None => (ops, bytes),
            };
            let (o, b) =
                if let (Some(o), Some(b)) = (math::delta(pops, ops), math::delta(pbytes, bytes)) {
                    (o, b)
                } else {
                    v.notes.push(format!("{dev} counters reset"));
                    (0, 0)
                };
            if dev.starts_with("tap:") {
                v.net_packets += o;
            } else {
                v.disk_ops += o;
                v.disk_bytes += b;
            }
            v.devices.push(DeviceOps {
                device: dev.clone(),
                ops: o,
                bytes: b,
            });
        }
        if let Some(p) = p_io {
            for dev in p.devices.keys() {
                if !c_io.devices.contains_key(dev) {
                    v.notes.push(format!("{dev} disappeared"));
                }
            }
        }
        if let Some(notes) = self.gone_devices.remove(&d.id) {
            v.notes.extend(notes);
        }
        v.io_ops = v.net_packets + v.disk_ops;
        self.last_devices
            .entry(d.id)
            .or_default()
            .extend(c_io.devices.iter().map(|(k, x)| (k.clone(), *x)));
    }

    /// T, the shared I/O work: softirq time, ksoftirqd threads and the
    /// `--shared-io` processes, less the softirqs inside their run time
    /// (I/O ones are in the softirq part of T already; other vectors are
    /// not I/O work and go to unattributed). ksoftirqd's run time always
    /// holds the softirqs it runs; other tasks' only without
    /// IRQ_TIME_ACCOUNTING.
    fn shared_io(&self, prev: &Snapshot, cur: &Snapshot) -> SharedIo {
        let sirq = cur.softirq.as_ref();
        let ns_s = |ns: u64| ns as f64 / 1e9;
        let mut out = SharedIo::default();
        let mut threads_t = 0.0;
        let mut threads_sirq_other = 0.0;
        for &pid in self.ksoftirqd.iter().chain(self.opts.shared_io_pids.iter()) {
            let holds = self.sirq_in_tasks || self.ksoftirqd.contains(&pid);
            for (&(p, tid), c) in cur.threads.iter().filter(|((p, _), _)| *p == pid) {
                let run = math::run_seconds(prev.threads.get(&(p, tid)).copied(), *c);
                let (io, all) = match sirq {
                    Some(s) if holds => (ns_s(s.io_ns_of(tid)), ns_s(s.all_ns_of(tid))),
                    _ => (0.0, 0.0),
                };
                let io = io.min(run);
                let other = (all - io).clamp(0.0, run - io);
                threads_t += run - io - other;
                out.threads_sirq_io_s += io;
                threads_sirq_other += other;
            }
        }
        // softirq_io: the softirq part of T. outside_tasks: non-I/O softirq
        // time that no task's run time holds (on idle CPUs; everywhere but
        // ksoftirqd with IRQ_TIME_ACCOUNTING), plus the non-I/O softirqs
        // taken out of the shared threads above.
        (out.softirq_io_s, out.outside_tasks_s) = match sirq {
            Some(s) => {
                for (&v, &ns) in &s.by_vector {
                    out.by_vector_s
                        .insert(vmscope_linux::softirq::vector_name(v), ns_s(ns));
                }
                let other_total = s.total_ns() - s.io_ns();
                let idle_other = s.all_ns_of(0) - s.io_ns_of(0);
                let not_held = if self.sirq_in_tasks {
                    ns_s(idle_other)
                } else {
                    // All but what ksoftirqd (and so threads_sirq_other) holds.
                    (ns_s(other_total) - threads_sirq_other).max(0.0)
                };
                (ns_s(s.io_ns()), not_held + threads_sirq_other)
            }
            None => ((cur.stat.all.softirq - prev.stat.all.softirq).max(0.0), 0.0),
        };
        out.total_s = out.softirq_io_s + threads_t;
        out
    }

    /// Notes on records the kernel could not deliver since the last interval.
    fn lost_record_notes(&mut self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Ok(r) = &self.softirq {
            if r.lost() > self.softirq_lost {
                notes.push(format!(
                    "{} softirq tracepoint records lost (ring overflow): softirq time is short",
                    r.lost() - self.softirq_lost
                ));
                self.softirq_lost = r.lost();
            }
        }
        notes.append(&mut self.wait_notes);
        if let Ok(l) = &self.exits {
            if l.overruns() > self.exit_overruns {
                notes.push(format!(
                    "{} overruns of the exit-record socket: some exited tasks' last CPU time is missing",
                    l.overruns() - self.exit_overruns
                ));
                self.exit_overruns = l.overruns();
            }
        }
        notes
    }
}

/// Exit records matched to one interval.
#[derive(Debug, Default)]
struct ExitMatch {
    /// Run time at exit of threads seen in the previous sample, by tid.
    run_at_exit: HashMap<u32, u64>,
    /// Run time of tasks that started and exited inside the interval.
    unseen_ns: u64,
}

impl ExitMatch {
    /// The last slice, seconds, of thread `key` that ran `prev_run` ns by
    /// the previous sample and exited since.
    fn last_slice(&self, key: (u32, u32), prev_run: u64) -> f64 {
        self.run_at_exit
            .get(&key.1)
            .map_or(0.0, |&r| r.saturating_sub(prev_run) as f64 / 1e9)
    }
}

/// The VM rows of an interval and what they took from other stages.
#[derive(Debug, Default)]
struct VmRows {
    vms: Vec<VmAccount>,
    /// I/O softirq time inside VM threads' run time, moved to T.
    vm_thread_sirq_s: f64,
    /// Last slices of VM threads that exited.
    exited_s: f64,
}

/// T and its parts.
#[derive(Debug, Default)]
struct SharedIo {
    total_s: f64,
    /// The softirq part of T.
    softirq_io_s: f64,
    /// I/O softirqs inside the shared threads' run time.
    threads_sirq_io_s: f64,
    /// Non-I/O softirq time no task's run time holds.
    outside_tasks_s: f64,
    by_vector_s: std::collections::BTreeMap<String, f64>,
}

/// What VM starts, exits, renames and reused pids add to an interval.
struct ChangeNotes {
    notes: Vec<String>,
    /// Last CPU time of VMs that exited.
    exited_s: f64,
}

/// VMs that started, exited (a row with their last CPU time), were renamed
/// or had their pid reused during the interval.
fn vm_changes(
    changes: &[Change],
    prev: &Snapshot,
    exits: &ExitMatch,
    rows: &mut VmRows,
    have_exit_records: bool,
) -> ChangeNotes {
    let mut out = ChangeNotes {
        notes: Vec::new(),
        exited_s: 0.0,
    };
    let vms = &mut rows.vms;
    for c in changes {
        match c {
            Change::Started { id, .. } => {
                if let Some(v) = vms.iter_mut().find(|v| v.domain == *id) {
                    v.notes.push("started during the interval".into());
                }
            }
            Change::Exited { id, name, pid } => {
                // Its last CPU time, from the exit records.
                let mut row = VmAccount::empty(*id, name.clone(), *pid);
                let vcpus: Vec<u32> = prev
                    .domains
                    .iter()
                    .find(|d| d.id == *id)
                    .map(|d| d.vcpus.iter().map(|(_, t)| t.tid).collect())
                    .unwrap_or_default();
                for (&key, p) in prev.threads.iter().filter(|(k, _)| k.0 == *pid) {
                    let x = exits.last_slice(key, p.run_ns);
                    out.exited_s += x;
                    if vcpus.contains(&key.1) {
                        row.vcpu_run_s += x;
                    } else {
                        row.direct_io_s += x;
                    }
                }
                row.notes.push(if have_exit_records {
                    "exited during the interval (its last CPU time from the kernel's exit records)"
                        .into()
                } else {
                    "exited during the interval (its last CPU time is not counted)".into()
                });
                vms.push(row);
            }
            Change::PidReused { new, pid, old } => {
                out.notes.push(c.to_string());
                if let Some(v) = vms.iter_mut().find(|v| v.domain == *new) {
                    v.notes.push(format!("pid {pid} reused (was d{old})"));
                }
            }
            Change::Renamed { id, .. } => {
                if let Some(v) = vms.iter_mut().find(|v| v.domain == *id) {
                    v.notes.push(c.to_string());
                }
            }
        }
    }
    out
}

/// Run time of every other task: a task new since the last sample ran
/// only inside the interval; one that exited took its last slice with it
/// (from its exit record).
struct OtherTasks {
    run_ns: u64,
    /// The part of `run_ns` from exit records.
    exited_ns: u64,
    /// Other tasks that exited during the interval.
    exited_tasks: u64,
}

fn other_tasks(prev: &Snapshot, cur: &Snapshot, exits: &ExitMatch) -> OtherTasks {
    let mut run_ns = exits.unseen_ns;
    for (k, &run) in &cur.others {
        run_ns += run.saturating_sub(prev.others.get(k).copied().unwrap_or(0));
    }
    let mut exited_ns = exits.unseen_ns;
    let mut exited_tasks = 0;
    for (k, &run) in prev
        .others
        .iter()
        .filter(|(k, _)| !cur.others.contains_key(k))
    {
        let x = exits
            .run_at_exit
            .get(&k.1)
            .map_or(0, |&r| r.saturating_sub(run));
        run_ns += x;
        exited_ns += x;
        exited_tasks += 1;
    }
    OtherTasks {
        run_ns,
        exited_ns,
        exited_tasks,
    }
}

/// `query-blockstats`: (device, requests, bytes) per disk, `None` when QMP
/// is not reachable.
fn blockstats(sock: &std::path::Path, timeout: Duration) -> Option<Vec<(String, u64, u64)>> {
    let mut q = vmscope_discover::qmp::Qmp::connect(sock, timeout).ok()?;
    let v = q.execute("query-blockstats", None).ok()?;
    let list = v.as_array()?;
    let mut out = Vec::new();
    for (i, d) in list.iter().enumerate() {
        let name = ["device", "qdev", "node-name"]
            .iter()
            .find_map(|k| d.get(*k).and_then(|x| x.as_str()).filter(|s| !s.is_empty()))
            .map(str::to_string)
            .unwrap_or_else(|| format!("#{i}"));
        let s = d.get("stats")?;
        let n = |k: &str| s.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        out.push((
            name,
            n("rd_operations") + n("wr_operations") + n("flush_operations"),
            n("rd_bytes") + n("wr_bytes"),
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    //! One interval computed from two hand-built samples, checked against a
    //! golden JSON file: every stage of [`Accountant::interval`] (vCPU
    //! splits, direct I/O, device counters, exit records, VM changes, shared
    //! I/O and its charge, other tasks, reconciliation) shows up in it, so
    //! a refactor that changes a number shows as a diff.
    use super::*;
    use crate::tracker::Thread;
    use vmscope_discover::{Accel, Vm};
    use vmscope_linux::procfs::CpuTimes;
    use vmscope_linux::TaskExit;

    fn vm_of(name: &str, pid: u32) -> Vm {
        Vm {
            name: name.into(),
            pid,
            uuid: None,
            exe: None,
            accel: Accel::Tcg,
            vcpus: vec![],
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

    fn thread(pid: u32, tid: u32, name: &str) -> Thread {
        Thread {
            pid,
            tid,
            name: name.into(),
        }
    }

    fn tracked(id: u32, name: &str, pid: u32, vcpus: &[u32], io: &[u32]) -> TrackedVm {
        TrackedVm {
            id,
            name: name.into(),
            pid,
            start: 1,
            vcpus: vcpus
                .iter()
                .enumerate()
                .map(|(i, &t)| (i as u32, thread(pid, t, &format!("CPU {i}/TCG"))))
                .collect(),
            io: io.iter().map(|&t| thread(pid, t, "worker")).collect(),
            taps: vec![],
            qmp: None,
            vm: vm_of(name, pid),
        }
    }

    fn stat(idle: &[f64], softirq: f64) -> ProcStat {
        let n = idle.len() as f64;
        let cpus: Vec<(u32, CpuTimes)> = idle
            .iter()
            .enumerate()
            .map(|(i, &idle)| {
                (
                    i as u32,
                    CpuTimes {
                        idle,
                        user: 100.0 - idle,
                        softirq: softirq / n,
                        ..Default::default()
                    },
                )
            })
            .collect();
        let mut all = CpuTimes::default();
        for (_, c) in &cpus {
            all.idle += c.idle;
            all.user += c.user;
            all.softirq += c.softirq;
        }
        ProcStat { all, cpus }
    }

    fn ss(run_ms: u64, wait_ms: u64) -> SchedStat {
        SchedStat {
            run_ns: run_ms * 1_000_000,
            wait_ns: wait_ms * 1_000_000,
            slices: 1,
        }
    }

    fn counters(devs: &[(&str, u64, u64)], source: &'static str) -> VmCounters {
        VmCounters {
            devices: devs
                .iter()
                .map(|(d, o, b)| (d.to_string(), (*o, *b)))
                .collect(),
            disk_source: source,
        }
    }

    #[test]
    fn one_interval_matches_the_golden_file() {
        let root = tempfile::tempdir().unwrap();
        let mut acc = Accountant::new(AccountOptions {
            proc_root: root.path().to_path_buf(),
            sys_root: root.path().to_path_buf(),
            shared_io_pids: vec![900],
            use_qmp: false,
            softirq_tracepoints: false,
            wait: WaitChoice::Off,
            ..AccountOptions::default()
        });
        acc.ksoftirqd = vec![15];
        acc.sirq_in_tasks = true;
        acc.exits = Err("not in this test".into());
        acc.exit_pool = vec![
            // A thread of "other" task 50 seen before, gone now: its last slice.
            (exit(51, 120), 0),
            // Never seen: started and exited inside the interval.
            (exit(77, 30), 0),
            // Still in the current sample: waits one interval.
            (exit(60, 500), 0),
            // vCPU 1 of "gone" (pid 300), which exited.
            (exit(302, 900), 0),
        ];
        let t0 = Instant::now();
        let web = tracked(1, "web", 100, &[101, 102], &[103]);
        let gone = tracked(2, "gone", 300, &[301, 302], &[]);
        let newvm = tracked(3, "new", 400, &[401], &[]);
        let prev = Snapshot {
            at: t0,
            stat: stat(&[10.0, 20.0], 1.0),
            threads: HashMap::from([
                ((100, 100), ss(50, 0)),
                ((100, 101), ss(1000, 100)),
                ((100, 102), ss(2000, 0)),
                ((100, 103), ss(300, 0)),
                ((100, 104), ss(40, 0)),
                ((300, 301), ss(500, 0)),
                ((300, 302), ss(600, 0)),
                ((15, 15), ss(10, 0)),
                ((900, 900), ss(70, 0)),
            ]),
            others: HashMap::from([((50, 50), 1000), ((50, 51), 40), ((60, 60), 100)]),
            softirq: None,
            waits: None,
            io: HashMap::from([
                (
                    1,
                    counters(&[("tap:t0", 1000, 90000), ("disk:vda", 50, 204800)], "qmp"),
                ),
                (2, counters(&[("proc-io", 10, 100)], "proc-io")),
            ]),
            domains: vec![web.clone(), gone.clone()],
        };
        let mut by_tid = HashMap::new();
        by_tid.insert((101, 3), 4_000_000); // NET_RX in web's vCPU 0
        by_tid.insert((0, 4), 9_000_000); // BLOCK on an idle CPU
        by_tid.insert((15, 4), 2_000_000); // BLOCK in ksoftirqd
        by_tid.insert((15, 1), 1_000_000); // TIMER in ksoftirqd
        by_tid.insert((50, 7), 500_000); // SCHED in another task
        let mut by_vector = HashMap::new();
        for (&(_, v), &ns) in &by_tid {
            *by_vector.entry(v).or_insert(0) += ns;
        }
        let cur = Snapshot {
            at: t0 + Duration::from_millis(1000),
            stat: stat(&[10.3, 20.6], 1.02),
            threads: HashMap::from([
                ((100, 100), ss(80, 0)),
                ((100, 101), ss(1700, 150)),
                ((100, 102), ss(2100, 0)),
                ((100, 103), ss(360, 0)),
                ((400, 401), ss(250, 10)),
                ((15, 15), ss(14, 0)),
                ((900, 900), ss(95, 0)),
            ]),
            others: HashMap::from([((50, 50), 1200), ((60, 60), 450), ((61, 61), 20)]),
            softirq: Some(vmscope_linux::SoftirqTotals {
                by_vector,
                by_tid,
                count: 40,
                runs_by_vector: HashMap::new(),
                unmatched: 0,
            }),
            // web's vCPU 0 was runnable 50 ms: 49 ms of it seen, behind the
            // new VM's vCPU, web's own worker, a host task and idle.
            waits: Some(HashMap::from([(101, {
                let mut w = ThreadWait::default();
                let comm = vmscope_linux::TaskComm::from_bytes;
                for (tid, name, ms) in [
                    (401, "CPU 0/TCG", 30),
                    (103, "worker", 12),
                    (50, "backup", 5),
                    (0, "", 2),
                ] {
                    w.by_culprit.insert(
                        crate::wait::Culprit::task(tid, comm(name.as_bytes())),
                        ms * 1_000_000,
                    );
                }
                w.waits = 9;
                w
            })])),
            io: HashMap::from([
                (
                    1,
                    counters(&[("tap:t0", 1400, 150000), ("disk:vda", 80, 327680)], "qmp"),
                ),
                (3, counters(&[("disk:vda", 7, 28672)], "qmp")),
            ]),
            domains: vec![web, newvm],
        };
        let changes = vec![
            Change::Exited {
                id: 2,
                name: "gone".into(),
                pid: 300,
            },
            Change::Started {
                id: 3,
                name: "new".into(),
                pid: 400,
            },
            Change::Renamed {
                id: 1,
                tid: 103,
                from: "worker".into(),
                to: "IO iothread0".into(),
            },
        ];
        let iv = acc.interval(&prev, &cur, &changes, t0);
        let r = iv.reconciliation();
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "interval": iv,
            "reconciliation": {
                "unattributed": r.unattributed,
                "residual": r.residual,
            },
            "exit_pool_left": acc.exit_pool.iter().map(|(e, age)| (e.tid, *age)).collect::<Vec<_>>(),
        }))
        .unwrap()
            + "\n";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/account-interval.json");
        if std::env::var_os("VMSCOPE_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, expected, "differs from {}", path.display());
        // The same interval as text and CSV (the waited-behind lines).
        for (f, ext) in [
            (crate::render::IntervalFormat::Text, "txt"),
            (crate::render::IntervalFormat::Csv, "csv"),
        ] {
            let mut out = Vec::new();
            crate::render::account_header(&mut out, f, 1.0, "test", "test").unwrap();
            crate::render::account_interval(&mut out, f, &iv).unwrap();
            let text = String::from_utf8(out).unwrap();
            let path = path.with_extension(ext);
            if std::env::var_os("VMSCOPE_BLESS").is_some() {
                std::fs::write(&path, &text).unwrap();
            }
            let expected = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(text, expected, "differs from {}", path.display());
        }
    }

    fn exit(tid: u32, run_ms: u64) -> TaskExit {
        TaskExit {
            tid,
            comm: String::new(),
            run_ns: run_ms * 1_000_000,
            cputime_ns: 0,
        }
    }
}
