//! `stat`: vm-stat (Theurer 2006 §3.2, docs/architecture.md §6): per physical CPU and
//! interval, the busy percentage and its split by VM vCPU (`dN-M`), by
//! host work done for a VM (`dN-io`) and by other host work (`d0-CPU`).
//!
//! Three sources: each task's run time per CPU summed in the kernel by an
//! eBPF program on `sched:sched_switch` ([`Source::Bpf`], drained once per
//! interval: its cost follows how many tasks ran, not how many threads
//! exist or how often they switch), exact times from the
//! `sched:sched_switch` tracepoint rings ([`Source::SchedSwitch`]) or, when
//! tracepoints are unavailable, each VM thread's `schedstat` placed on the
//! CPU it last ran on with per-CPU totals from `/proc/stat`
//! ([`Source::Schedstat`]).

use crate::fit::{self, TidTimes};
use crate::tracker::{Change, VmTracker};
use crate::StatError;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vmscope_linux::procfs::{self, ProcRoot};
use vmscope_linux::{clock_monotonic_ns, SchedSwitch, SchedSwitchRecorder};

/// Where the per-CPU times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Bpf,
    SchedSwitch,
    Schedstat,
}

impl Source {
    /// The line the output header names the source with.
    pub fn describe(self) -> &'static str {
        match self {
            Source::Bpf => {
                "eBPF program on sched_switch summing each task's run time per CPU in the kernel (CPUs bounded by /proc/stat)"
            }
            Source::SchedSwitch => {
                "sched_switch tracepoint rings per CPU (slices; VM threads fitted to schedstat, CPUs bounded by /proc/stat)"
            }
            Source::Schedstat => {
                "schedstat + /proc/stat fallback (each thread's time placed on the CPU it last ran on)"
            }
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Bpf => "bpf",
            Source::SchedSwitch => "sched_switch",
            Source::Schedstat => "schedstat",
        }
    }
}

#[derive(Debug, Clone)]
pub struct VmStatOptions {
    pub proc_root: PathBuf,
    /// `None` (`--source auto`): the eBPF program, falling back to the
    /// sched_switch rings when it cannot load (not root, no BPF), and to
    /// schedstat when tracepoints cannot open either. bpf comes first: its
    /// cost follows the tasks that ran, not the threads that exist
    /// (`bench/stat-overhead`), and it read closer to the threads' own
    /// schedstat than the rings in `tests/stat_bpf.rs`.
    pub source: Option<Source>,
}

impl Default for VmStatOptions {
    fn default() -> Self {
        VmStatOptions {
            proc_root: PathBuf::from("/proc"),
            source: None,
        }
    }
}

/// What a cell of a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CellKind {
    /// `d0-CPU`: host work not done for a VM.
    Host,
    /// `dN-M`: VM N's vCPU M.
    Vcpu(u32),
    /// `dN-io`: host work done for VM N (its non-vCPU threads).
    Io,
}

#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub domain: u32,
    pub kind: CellKind,
    /// Percent of the interval on this CPU.
    pub pct: f64,
}

impl Cell {
    /// `dN-M`, `dN-io`, `d0-CPU`.
    pub fn label(&self, cpu: u32) -> String {
        match self.kind {
            CellKind::Host => format!("d0-{cpu}"),
            CellKind::Vcpu(i) => format!("d{}-{i}", self.domain),
            CellKind::Io => format!("d{}-io", self.domain),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CpuRow {
    pub cpu: u32,
    pub total_pct: f64,
    pub cells: Vec<Cell>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatInterval {
    pub time_s: f64,
    pub interval_s: f64,
    pub source: Source,
    pub rows: Vec<CpuRow>,
    /// VMs that started or exited, reused PIDs, renamed threads.
    pub notes: Vec<String>,
    /// The legend, when it changed in this interval (always the first time).
    pub legend: Option<String>,
    /// Switch records the kernel dropped in this interval (sched_switch
    /// source), or slices the eBPF program dropped because its map was
    /// full (bpf source).
    pub lost: u64,
    /// Switch-outs after a lost switch-in from idle, whose slice is not
    /// counted (sched_switch source).
    pub uncounted_slices: u64,
    /// Switches whose outgoing task was not the one the eBPF program last
    /// saw switched in on that CPU: a switch it missed, whose gap went to
    /// the task it last saw (bpf source).
    pub unchained_switches: u64,
}

/// Seconds per (domain, cell) on one CPU.
type CellTimes = HashMap<(u32, CellKind), f64>;

#[derive(Default, Clone, Copy)]
struct Track {
    /// Task running on the CPU (0 = idle); `None` until a switch says.
    current: Option<u32>,
    since: u64,
}

struct SwitchSrc {
    rec: SchedSwitchRecorder,
    buf: Vec<SchedSwitch>,
    pending: Vec<SchedSwitch>,
    tracks: HashMap<u32, Track>,
    t0: u64,
    lost: u64,
    reader: procfs::TaskReader,
    /// schedstat run ns of each VM thread at the previous boundary.
    prev_run: HashMap<(u32, u32), u64>,
    prev_stat: Option<procfs::ProcStat>,
    /// Running (ours − `/proc/stat`) busy ns per CPU.
    drift: HashMap<u32, i64>,
    /// Switch-outs of the last interval whose switch-in from idle was not
    /// delivered.
    missed: u64,
}

struct SchedSrc {
    reader: procfs::TaskReader,
    prev_stat: procfs::ProcStat,
    prev: HashMap<(u32, u32), u64>,
    at: Instant,
}

/// The eBPF source: per-(cpu, tid) times drained from the kernel.
struct BpfSrc {
    times: vmscope_bpf::switch_times::BpfSwitchTimes,
    prev_stat: Option<procfs::ProcStat>,
    /// Running (ours − `/proc/stat`) busy ns per CPU.
    drift: HashMap<u32, i64>,
}

enum Src {
    Bpf(Box<BpfSrc>),
    Switch(Box<SwitchSrc>),
    Sched(Box<SchedSrc>),
}

/// The vm-stat sampler.
pub struct VmStat {
    proc: ProcRoot,
    domains: VmTracker,
    src: Src,
    start: Instant,
    first: bool,
    /// Why `auto` did not get the eBPF source (and the rings, when it fell
    /// back to schedstat), when it did not.
    pub fallback_reason: Option<String>,
}

impl VmStat {
    pub fn new(opts: VmStatOptions) -> Result<VmStat, StatError> {
        let proc = ProcRoot::new(&opts.proc_root);
        let mut domains = VmTracker::new(&proc);
        domains.refresh()?;
        let mut fallback_reason = None;
        let src = match opts.source {
            Some(Source::Schedstat) => Src::Sched(Box::new(sched_src(&proc, &domains)?)),
            Some(Source::Bpf) => Src::Bpf(Box::new(bpf_src(&proc)?)),
            Some(Source::SchedSwitch) => Src::Switch(Box::new(open_switch(&proc)?)),
            None => match bpf_src(&proc) {
                Ok(b) => Src::Bpf(Box::new(b)),
                Err(bpf_err) => match open_switch(&proc) {
                    Ok(s) => {
                        fallback_reason = Some(format!("bpf: {bpf_err}"));
                        Src::Switch(Box::new(s))
                    }
                    Err(e) => {
                        fallback_reason = Some(format!("bpf: {bpf_err}; sched_switch: {e}"));
                        Src::Sched(Box::new(sched_src(&proc, &domains)?))
                    }
                },
            },
        };
        let mut src = src;
        if let Src::Switch(s) = &mut src {
            for (pid, tid) in vm_threads(&domains) {
                if let Ok(st) = s.reader.schedstat(pid, tid) {
                    s.prev_run.insert((pid, tid), st.run_ns);
                }
            }
        }
        Ok(VmStat {
            proc,
            domains,
            src,
            start: Instant::now(),
            first: true,
            fallback_reason,
        })
    }

    pub fn source(&self) -> Source {
        match self.src {
            Src::Bpf(_) => Source::Bpf,
            Src::Switch(_) => Source::SchedSwitch,
            Src::Sched(_) => Source::Schedstat,
        }
    }

    pub fn tracker(&self) -> &VmTracker {
        &self.domains
    }

    /// The interval from the end of the previous one to now, without
    /// waiting (what a scrape asks for). Tracepoint rings hold what came
    /// in between; records they drop are counted in `lost` and the slices
    /// are still fitted to each thread's `schedstat`.
    pub fn sample(&mut self) -> Result<StatInterval, StatError> {
        let elapsed = match &self.src {
            Src::Bpf(s) => Duration::from_nanos(clock_monotonic_ns().saturating_sub(s.times.t0())),
            Src::Switch(s) => Duration::from_nanos(clock_monotonic_ns().saturating_sub(s.t0)),
            Src::Sched(_) => Duration::ZERO,
        };
        self.next(elapsed)
    }

    /// Wait for `interval` and return it.
    pub fn next(&mut self, interval: Duration) -> Result<StatInterval, StatError> {
        let before = self.domains.tid_map();
        let mut uncounted_slices = 0;
        let mut unchained_switches = 0;
        let (rows, dt, lost, changes) = match &mut self.src {
            Src::Bpf(s) => {
                let until = s.times.t0() + interval.as_nanos() as u64;
                let now = clock_monotonic_ns();
                if until > now {
                    std::thread::sleep(Duration::from_nanos(until - now));
                }
                let (mut times, t0, t1) = s.times.collect()?;
                let changes = self.domains.refresh()?;
                let mut map = before;
                map.extend(self.domains.tid_map());
                let stat = self.proc.cpu_times().ok();
                let dt_ns = t1 - t0;
                for cpu in stat.iter().flat_map(|st| st.cpus.iter().map(|c| c.0)) {
                    times.entry((cpu, 0)).or_default();
                }
                let dt = dt_ns as f64 / 1e9;
                let rows = fit_rows(
                    &mut times,
                    &map,
                    (&mut s.prev_stat, &mut s.drift),
                    stat,
                    dt_ns,
                    dt,
                );
                unchained_switches = s.times.take_unchained();
                (rows, dt, s.times.take_dropped(), changes)
            }
            Src::Switch(s) => {
                let (mut times, dt, lost) = s.collect(interval)?;
                uncounted_slices = s.missed;
                let changes = self.domains.refresh()?;
                let mut map = before;
                map.extend(self.domains.tid_map());
                let runs = s.thread_runs(&self.domains);
                let placed = fit::fit_threads(&mut times, &runs, SKEW_NS, |r| s.cpu_of(r));
                s.reader.end_sample();
                for (cpu, tid) in placed {
                    // The CPU's tracker learns the thread is running there.
                    if let Some(t) = s.tracks.get_mut(&cpu) {
                        if matches!(t.current, None | Some(0)) {
                            t.current = Some(tid);
                        }
                    }
                }
                let stat = self.proc.cpu_times().ok();
                let dt_ns = (dt * 1e9) as u64;
                let rows = fit_rows(
                    &mut times,
                    &map,
                    (&mut s.prev_stat, &mut s.drift),
                    stat,
                    dt_ns,
                    dt,
                );
                (rows, dt, lost, changes)
            }
            Src::Sched(s) => {
                std::thread::sleep(interval.saturating_sub(s.at.elapsed()));
                let changes = self.domains.refresh()?;
                let (rows, dt) = s.collect(&self.proc, &self.domains, &before)?;
                (rows, dt, 0, changes)
            }
        };
        let legend_changed =
            self.first || changes.iter().any(|c| !matches!(c, Change::Renamed { .. }));
        self.first = false;
        Ok(StatInterval {
            time_s: self.start.elapsed().as_secs_f64(),
            interval_s: dt,
            source: self.source(),
            rows,
            notes: changes
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
            legend: legend_changed.then(|| self.domains.legend()),
            lost,
            uncounted_slices,
            unchained_switches,
        })
    }
}

fn open_switch(proc: &ProcRoot) -> Result<SwitchSrc, StatError> {
    let mut rec = SchedSwitchRecorder::open(0)?;
    rec.enable()?;
    Ok(SwitchSrc {
        reader: procfs::TaskReader::new(proc),
        prev_run: HashMap::new(),
        prev_stat: proc.cpu_times().ok(),
        drift: HashMap::new(),
        rec,
        buf: Vec::new(),
        pending: Vec::new(),
        tracks: HashMap::new(),
        t0: clock_monotonic_ns(),
        lost: 0,
        missed: 0,
    })
}

fn sched_src(proc: &ProcRoot, domains: &VmTracker) -> Result<SchedSrc, StatError> {
    let mut prev = HashMap::new();
    let mut reader = procfs::TaskReader::new(proc);
    read_threads(&mut reader, domains, &mut prev, |_, _, _| {});
    Ok(SchedSrc {
        reader,
        prev_stat: proc.cpu_times()?,
        prev,
        at: Instant::now(),
    })
}

/// Read schedstat of every VM thread into `now`, calling `f(tid, cpu, run_ns)`.
fn read_threads(
    reader: &mut procfs::TaskReader,
    domains: &VmTracker,
    now: &mut HashMap<(u32, u32), u64>,
    mut f: impl FnMut(u32, u32, u64),
) {
    for (pid, tid) in vm_threads(domains) {
        let (Ok(s), Ok(st)) = (reader.schedstat(pid, tid), reader.task_stat(pid, tid)) else {
            continue;
        };
        now.insert((pid, tid), s.run_ns);
        f(tid, st.processor, s.run_ns);
    }
    reader.end_sample();
}

/// Percent cells of one CPU from busy time and per-tid times.
fn build_row(cpu: u32, busy_s: f64, dt: f64, per: &HashMap<(u32, CellKind), f64>) -> CpuRow {
    let vm: f64 = per.values().sum();
    let pct = |s: f64| (100.0 * s / dt).clamp(0.0, 100.0);
    let mut cells = vec![Cell {
        domain: 0,
        kind: CellKind::Host,
        pct: pct((busy_s - vm).max(0.0)),
    }];
    let mut v: Vec<_> = per.iter().filter(|(_, &s)| s > 0.0).collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    for (&(domain, kind), &s) in v {
        cells.push(Cell {
            domain,
            kind,
            pct: pct(s),
        });
    }
    CpuRow {
        cpu,
        total_pct: pct(busy_s.max(vm)),
        cells,
    }
}

fn kind_of(map: &HashMap<u32, (u32, Option<u32>)>, tid: u32) -> Option<(u32, CellKind)> {
    map.get(&tid).map(|&(d, v)| {
        (
            d,
            match v {
                Some(i) => CellKind::Vcpu(i),
                None => CellKind::Io,
            },
        )
    })
}

fn bpf_src(proc: &ProcRoot) -> Result<BpfSrc, StatError> {
    Ok(BpfSrc {
        times: vmscope_bpf::switch_times::BpfSwitchTimes::open()?,
        prev_stat: proc.cpu_times().ok(),
        drift: HashMap::new(),
    })
}

/// Rows from per-(cpu, tid) nanoseconds (tid 0 = idle).
/// One interval of slices (the bpf or the sched_switch source) fitted to
/// each CPU's `/proc/stat` bounds (`stat`, against the source's previous
/// reading and learned drift, both updated here), then made rows.
fn fit_rows(
    times: &mut TidTimes,
    map: &HashMap<u32, (u32, Option<u32>)>,
    (prev_stat, drift): (&mut Option<procfs::ProcStat>, &mut HashMap<u32, i64>),
    stat: Option<procfs::ProcStat>,
    dt_ns: u64,
    dt: f64,
) -> Vec<CpuRow> {
    // A CPU taken offline is not in /proc/stat: the source's open segment
    // there (the task it last ran) would grow as if busy. It has no row
    // while it is offline.
    if let Some(cur) = &stat {
        times.retain(|&(cpu, _), _| cur.cpu(cpu).is_some());
    }
    let b = bounds(times, prev_stat.as_ref(), stat.as_ref(), drift, dt_ns);
    let busy = fit::fit_cpus(times, |t| map.contains_key(&t), &b, dt_ns);
    let rows = switch_rows(times, map, dt);
    track_drift(drift, &busy, prev_stat.as_ref(), stat.as_ref(), dt_ns);
    *prev_stat = stat;
    rows
}

fn switch_rows(times: &TidTimes, map: &HashMap<u32, (u32, Option<u32>)>, dt: f64) -> Vec<CpuRow> {
    let mut per_cpu: HashMap<u32, (f64, CellTimes)> = HashMap::new();
    for (&(cpu, tid), &ns) in times {
        let e = per_cpu.entry(cpu).or_default();
        if tid == 0 {
            continue;
        }
        let s = ns as f64 / 1e9;
        e.0 += s;
        if let Some(k) = kind_of(map, tid) {
            *e.1.entry(k).or_default() += s;
        }
    }
    let mut cpus: Vec<u32> = per_cpu.keys().copied().collect();
    cpus.sort_unstable();
    cpus.into_iter()
        .map(|c| {
            let (busy, per) = &per_cpu[&c];
            build_row(c, *busy, dt, per)
        })
        .collect()
}

/// Nanoseconds each (cpu, tid) ran in `[t0, t1]` from the switches of the
/// interval (tid 0 = idle), carrying each CPU's running task across
/// intervals in `tracks`. Switches after `t1` go to `later`. Returns the
/// times and how many switch-outs came after a lost switch-in from idle:
/// the CPU was idle until some unknown moment, and that slice is left
/// uncounted rather than the idle period counted as busy.
fn switch_times(
    tracks: &mut HashMap<u32, Track>,
    events: Vec<SchedSwitch>,
    t0: u64,
    t1: u64,
    later: &mut Vec<SchedSwitch>,
) -> (TidTimes, u64) {
    let mut times: TidTimes = HashMap::new();
    let mut missed = 0;
    for e in events {
        if e.time > t1 {
            later.push(e);
            continue;
        }
        let tr = tracks.entry(e.cpu).or_insert(Track {
            current: None,
            since: t0,
        });
        let start = tr.since.max(t0);
        let missed_after_idle = tr.current == Some(0) && e.prev_pid != 0;
        if missed_after_idle {
            missed += 1;
        } else if e.time > start {
            *times.entry((e.cpu, e.prev_pid)).or_default() += e.time - start;
        }
        tr.current = Some(e.next_pid);
        tr.since = e.time;
    }
    for (&cpu, tr) in tracks.iter_mut() {
        let start = tr.since.max(t0);
        if let Some(cur) = tr.current {
            if t1 > start {
                *times.entry((cpu, cur)).or_default() += t1 - start;
            }
        }
        times.entry((cpu, 0)).or_default();
        tr.since = t1;
    }
    (times, missed)
}

impl SwitchSrc {
    /// Read the rings until `interval` after the previous boundary; return
    /// the nanoseconds each (cpu, tid) ran, the interval in seconds, lost
    /// records.
    fn collect(&mut self, interval: Duration) -> Result<(TidTimes, f64, u64), StatError> {
        let t0 = self.t0;
        let t1 = t0 + interval.as_nanos() as u64;
        loop {
            let now = clock_monotonic_ns();
            if now >= t1 {
                break;
            }
            let wait = Duration::from_nanos(t1 - now).min(Duration::from_millis(250));
            self.rec.read(wait, &mut self.buf)?;
        }
        self.rec.read(Duration::ZERO, &mut self.buf)?;
        let mut events = std::mem::take(&mut self.pending);
        events.append(&mut self.buf);
        for cpu in self.rec.cpus() {
            self.tracks.entry(*cpu).or_insert(Track {
                current: None,
                since: t0,
            });
        }
        let (times, missed) = switch_times(&mut self.tracks, events, t0, t1, &mut self.pending);
        self.missed = missed;
        self.t0 = t1;
        let lost = self.rec.lost() - self.lost;
        self.lost = self.rec.lost();
        Ok((times, interval.as_secs_f64(), lost))
    }
}

impl SwitchSrc {
    /// Each VM thread's exact run time in the interval (its `schedstat`
    /// delta).
    fn thread_runs(&mut self, domains: &VmTracker) -> Vec<fit::ThreadRun> {
        let mut now = HashMap::new();
        for (pid, tid) in vm_threads(domains) {
            if let Ok(s) = self.reader.schedstat(pid, tid) {
                now.insert((pid, tid), s.run_ns);
            }
        }
        let mut runs = Vec::new();
        for (&(pid, tid), &run) in &now {
            if let Some(run_ns) = self
                .prev_run
                .get(&(pid, tid))
                .and_then(|&p| run.checked_sub(p))
            {
                runs.push(fit::ThreadRun { pid, tid, run_ns });
            }
        }
        self.prev_run = now;
        runs
    }

    /// The CPU a thread is on now: the switch tracker's when it knows, else
    /// the thread's `stat`.
    fn cpu_of(&mut self, r: &fit::ThreadRun) -> Option<u32> {
        self.tracks
            .iter()
            .find(|(_, t)| t.current == Some(r.tid))
            .map(|(c, _)| *c)
            .or_else(|| {
                self.reader
                    .task_stat(r.pid, r.tid)
                    .ok()
                    .map(|st| st.processor)
            })
    }
}

/// (pid, tid) of every thread of every VM: the QEMU process's threads and
/// kernel vhost workers.
fn vm_threads(domains: &VmTracker) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for d in domains.current() {
        v.extend(domains.threads(d.pid).iter().map(|&t| (d.pid, t)));
        v.extend(
            d.io.iter()
                .filter(|t| t.pid != d.pid)
                .map(|t| (t.pid, t.tid)),
        );
    }
    v
}

/// Below this, a thread's run time unseen by the switches is skew between
/// the boundary and the `schedstat` read, not a missed slice.
const SKEW_NS: u64 = 2_000_000;

/// Slack of the `/proc/stat` bounds: one USER_HZ tick (10 ms) plus 1 % of
/// the interval. The kernel samples busy time at its tick, so a partly busy
/// CPU's count wanders by a few ticks per second; the bounds apply to the
/// running difference ([`track_drift`]), so that noise is not clipped one
/// way in every interval.
fn slack_ns(dt_ns: u64) -> u64 {
    10_000_000 + dt_ns / 100
}

/// Each CPU's bounds for [`fit::fit_cpus`]: its `/proc/stat` busy time in
/// the interval, less the drift of earlier intervals, ± slack, within the
/// interval; the whole interval as ceiling when a reading is missing.
fn bounds(
    times: &TidTimes,
    prev: Option<&procfs::ProcStat>,
    cur: Option<&procfs::ProcStat>,
    drift: &HashMap<u32, i64>,
    dt_ns: u64,
) -> HashMap<u32, fit::Bounds> {
    let mut out = HashMap::new();
    let mut cpus: Vec<u32> = times.keys().map(|k| k.0).collect();
    cpus.sort_unstable();
    cpus.dedup();
    for cpu in cpus {
        // Come online since the previous reading: its segment carries the
        // time it was offline, and nothing bounds it; this interval counts
        // nothing there.
        let came_online = matches!((prev, cur), (Some(p), Some(c)) if p.cpu(cpu).is_none() && c.cpu(cpu).is_some());
        if came_online {
            out.insert(
                cpu,
                fit::Bounds {
                    floor: 0,
                    ceiling: 0,
                },
            );
            continue;
        }
        let b = match kernel_busy_ns(prev, cur, cpu, dt_ns) {
            Some(k) => {
                let target = k as i64 - drift.get(&cpu).copied().unwrap_or(0);
                let slack = slack_ns(dt_ns) as i64;
                let clamp = |v: i64| v.clamp(0, dt_ns as i64) as u64;
                fit::Bounds {
                    floor: clamp(target - slack),
                    ceiling: clamp(target + slack),
                }
            }
            None => fit::Bounds {
                floor: 0,
                ceiling: dt_ns,
            },
        };
        out.insert(cpu, b);
    }
    out
}

/// The kernel's busy nanoseconds of `cpu` in an interval of `dt_ns`: its
/// `/proc/stat` busy share between two readings times the interval.
fn kernel_busy_ns(
    prev: Option<&procfs::ProcStat>,
    cur: Option<&procfs::ProcStat>,
    cpu: u32,
    dt_ns: u64,
) -> Option<u64> {
    let share = procfs::ProcStat::busy_share(prev?, cur?, Some(cpu))?;
    Some((share * dt_ns as f64) as u64)
}

/// Running (ours − kernel's) busy time per CPU, which the next interval's
/// bounds pull back towards zero.
fn track_drift(
    drift: &mut HashMap<u32, i64>,
    busy: &HashMap<u32, u64>,
    prev: Option<&procfs::ProcStat>,
    cur: Option<&procfs::ProcStat>,
    dt_ns: u64,
) {
    for (&cpu, &b) in busy {
        if let Some(k) = kernel_busy_ns(prev, cur, cpu, dt_ns) {
            *drift.entry(cpu).or_default() += b as i64 - k as i64;
        }
    }
}

impl SchedSrc {
    fn collect(
        &mut self,
        proc: &ProcRoot,
        domains: &VmTracker,
        before: &HashMap<u32, (u32, Option<u32>)>,
    ) -> Result<(Vec<CpuRow>, f64), StatError> {
        let stat = proc.cpu_times()?;
        let now_at = Instant::now();
        let dt = now_at.duration_since(self.at).as_secs_f64();
        let mut map = before.clone();
        map.extend(domains.tid_map());
        let mut now = HashMap::new();
        let mut per_cpu: HashMap<u32, CellTimes> = HashMap::new();
        let prev = &self.prev;
        let mut cpu_of = HashMap::new();
        read_threads(&mut self.reader, domains, &mut now, |tid, cpu, _| {
            cpu_of.insert(tid, cpu);
        });
        for (&(pid, tid), &run) in &now {
            let base = prev
                .get(&(pid, tid))
                .copied()
                .filter(|&p| p <= run)
                .unwrap_or(run);
            let d = (run - base) as f64 / 1e9;
            if d <= 0.0 {
                continue;
            }
            let Some(&cpu) = cpu_of.get(&tid) else {
                continue;
            };
            if let Some(k) = kind_of(&map, tid) {
                *per_cpu.entry(cpu).or_default().entry(k).or_default() += d;
            }
        }
        let mut rows = Vec::new();
        for (cpu, _) in &stat.cpus {
            // A CPU that came online since the last reading: no busy time yet.
            let busy = dt
                * procfs::ProcStat::busy_share(&self.prev_stat, &stat, Some(*cpu)).unwrap_or(0.0);
            let empty = HashMap::new();
            rows.push(build_row(
                *cpu,
                busy,
                dt,
                per_cpu.get(cpu).unwrap_or(&empty),
            ));
        }
        self.prev = now;
        self.prev_stat = stat;
        self.at = now_at;
        Ok((rows, dt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU taken offline (gone from /proc/stat) has no row, though the
    /// source still holds its last task's open segment; back online, its
    /// first interval counts nothing there (the segment spans the time it
    /// was offline).
    #[test]
    fn offline_cpus_have_no_row_and_count_nothing_coming_back() {
        // Ticks at 100 Hz: `busy` user and `idle` idle ticks on each CPU.
        let stat = |cpus: &[u32], busy: u64, idle: u64| {
            let mut text = format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n");
            for c in cpus {
                text.push_str(&format!("cpu{c} {busy} 0 0 {idle} 0 0 0 0 0 0\n"));
            }
            procfs::parse_proc_stat(&text, 100.0, std::path::Path::new("/proc/stat")).unwrap()
        };
        let map: HashMap<u32, (u32, Option<u32>)> = [(50, (1, Some(0)))].into();
        let interval = |cpus: &[u32]| {
            let mut t: TidTimes = HashMap::new();
            t.insert((0, 50), 400_000_000);
            t.insert((0, 0), 600_000_000);
            // CPU 1's last task, as the source reports it: busy all along.
            for &c in cpus {
                t.insert((c, 77), 1_000_000_000);
            }
            t
        };
        let mut drift = HashMap::new();
        let mut prev = Some(stat(&[0, 1], 0, 0));
        // CPU 1 offline: only CPU 0's row, with the vCPU's 40 %.
        let rows = fit_rows(
            &mut interval(&[1]),
            &map,
            (&mut prev, &mut drift),
            Some(stat(&[0], 40, 60)),
            1_000_000_000,
            1.0,
        );
        assert_eq!(rows.iter().map(|r| r.cpu).collect::<Vec<_>>(), vec![0]);
        assert!((rows[0].total_pct - 40.0).abs() < 1.0, "{rows:?}");
        // Back online: CPU 1's row counts nothing this interval.
        let rows = fit_rows(
            &mut interval(&[1]),
            &map,
            (&mut prev, &mut drift),
            Some(stat(&[0, 1], 80, 120)),
            1_000_000_000,
            1.0,
        );
        let one = rows.iter().find(|r| r.cpu == 1).expect("CPU 1's row");
        assert!(one.total_pct < 1.0, "{rows:?}");
    }

    fn sw(cpu: u32, time: u64, prev: u32, next: u32) -> SchedSwitch {
        SchedSwitch {
            cpu,
            time,
            prev_pid: prev,
            prev_comm: Default::default(),
            prev_state: 0,
            next_pid: next,
            next_comm: Default::default(),
        }
    }

    #[test]
    fn switch_slices_and_lost_idle_switch_ins() {
        let mut tracks = HashMap::new();
        let mut later = Vec::new();
        // CPU 0: unknown until 100, task 7 until 400, idle until 700, then
        // task 8 switches out at 900 without its switch-in (uncounted),
        // task 9 runs to the end (1000), one event after the interval.
        let ev = vec![
            sw(0, 100, 5, 7),
            sw(0, 400, 7, 0),
            sw(0, 900, 8, 9),
            sw(0, 1200, 9, 0),
        ];
        let (t, missed) = switch_times(&mut tracks, ev, 0, 1000, &mut later);
        assert_eq!(t.get(&(0, 5)), Some(&100));
        assert_eq!(t.get(&(0, 7)), Some(&300));
        assert_eq!(t.get(&(0, 0)), Some(&0));
        assert_eq!(t.get(&(0, 8)), None);
        assert_eq!(t.get(&(0, 9)), Some(&100));
        assert_eq!(missed, 1);
        assert_eq!(later.len(), 1);
        // Next interval: task 9 carried over until the pending switch.
        let ev = std::mem::take(&mut later);
        let (t, missed) = switch_times(&mut tracks, ev, 1000, 2000, &mut later);
        assert_eq!(t.get(&(0, 9)), Some(&200));
        assert_eq!(t.get(&(0, 0)), Some(&800));
        assert_eq!(missed, 0);
    }

    #[test]
    fn proc_stat_bounds_follow_the_running_difference() {
        let ms = 1_000_000u64;
        // Cumulative busy and wall seconds of CPU 0.
        let stat = |busy_s: f64, wall_s: f64| procfs::ProcStat {
            all: Default::default(),
            cpus: vec![(
                0,
                procfs::CpuTimes {
                    user: busy_s,
                    idle: wall_s - busy_s,
                    ..Default::default()
                },
            )],
        };
        let mut t: TidTimes = HashMap::new();
        t.insert((0, 50), 100 * ms);
        t.insert((1, 51), 100 * ms);
        let mut drift = HashMap::new();
        // CPU 0: the kernel's 250 ms ± (10 ms + 1 % of 1 s); CPU 1 (no
        // reading): anything within the interval.
        let (p, c) = (stat(0.0, 0.0), stat(0.25, 1.0));
        let b = bounds(&t, Some(&p), Some(&c), &drift, 1000 * ms);
        assert_eq!((b[&0].floor, b[&0].ceiling), (230 * ms, 270 * ms));
        assert_eq!((b[&1].floor, b[&1].ceiling), (0, 1000 * ms));
        // The kernel's share, not its seconds: columns that add up to less
        // (or more) than the wall time scale to the interval.
        let b = bounds(&t, Some(&p), Some(&stat(0.2, 0.8)), &drift, 1000 * ms);
        assert_eq!(b[&0].ceiling, 270 * ms);
        // Never beyond the interval.
        let b = bounds(&t, Some(&p), Some(&stat(1.0, 1.0)), &drift, 1000 * ms);
        assert_eq!(b[&0].ceiling, 1000 * ms);
        // 15 ms more than the kernel this time: the next bounds are 15 ms lower.
        let busy = HashMap::from([(0, 265 * ms), (1, 100 * ms)]);
        track_drift(&mut drift, &busy, Some(&p), Some(&c), 1000 * ms);
        assert_eq!(drift[&0], 15 * ms as i64);
        assert!(!drift.contains_key(&1));
        let b = bounds(&t, Some(&c), Some(&stat(0.5, 2.0)), &drift, 1000 * ms);
        assert_eq!((b[&0].floor, b[&0].ceiling), (215 * ms, 255 * ms));
    }

    #[test]
    fn rows_split_busy_time() {
        let mut times = HashMap::new();
        times.insert((0, 0), 300_000_000); // idle
        times.insert((0, 11), 640_000_000); // d2 vCPU 1
        times.insert((0, 99), 60_000_000); // host task
        times.insert((1, 12), 650_000_000); // d2 vCPU 2
        times.insert((1, 13), 20_000_000); // d2 io thread
        let mut map = HashMap::new();
        map.insert(11, (2, Some(1)));
        map.insert(12, (2, Some(2)));
        map.insert(13, (2, None));
        let rows = switch_rows(&times, &map, 1.0);
        assert_eq!(rows.len(), 2);
        assert!((rows[0].total_pct - 70.0).abs() < 1e-9);
        let text = crate::render::stat_row_text(&rows[0]);
        assert_eq!(text, "0    [070.0]    d0-0[006.0] d2-1[064.0]");
        let text = crate::render::stat_row_text(&rows[1]);
        assert_eq!(text, "1    [067.0]    d0-1[000.0] d2-2[065.0] d2-io[002.0]");
    }
}
