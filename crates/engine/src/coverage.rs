//! What the scheduler says each domain ran while a recording sampled, the
//! denominator of a profile's coverage (docs/architecture.md §4): a
//! recording of every CPU stores, per domain, the seconds its threads ran
//! between enabling and disabling the rings (`run_s_<domain>` meta), and
//! `report` sets the CPU time the domain's samples stand for against them
//! (`# coverage`). VMs are their QEMU process's CPU time (`/proc/PID/stat`
//! user and system time: every thread, the ones that ended meanwhile
//! included); the host is every other process's CPU time meanwhile, its
//! reaped children's included (the same clock: `utime`/`stime` are the
//! scheduler's run time in ticks).
//!
//! Not `/proc/stat`'s busy time: on a host with tick-based CPU accounting
//! (`CONFIG_TICK_CPU_ACCOUNTING`, this machine's) it charges a whole tick
//! to whatever runs at the tick, and for a thread running 200 us bursts
//! every 2 ms it said 0.483 s where the thread's own `sum_exec_runtime`
//! said 0.313 s (and the samples 0.268 s).

use std::collections::HashMap;
use vmscope_linux::procfs::{clk_tck, ProcRoot, ProcStat};

/// One reading of the clocks.
pub struct RunClock {
    stat: Option<ProcStat>,
    /// Each VM's name and its process's CPU ticks (none when unreadable).
    vms: Vec<(String, Option<u64>)>,
    /// Each VM's threads: tid → (comm, schedstat run time in ns).
    threads: Vec<HashMap<u32, (String, u64)>>,
    /// Every process's ticks: its own, and its reaped children's.
    all: HashMap<u32, (u64, u64)>,
}

impl RunClock {
    /// The reading taken just before the rings are enabled: every process
    /// first, the VMs last, so that a VM's window opens as close to the
    /// first sample as it can (`vms`: name, pid).
    pub fn before_sampling(proc: &ProcRoot, vms: &[(String, u32)]) -> RunClock {
        let (stat, all) = (proc.cpu_times().ok(), read_all(proc));
        RunClock {
            stat,
            threads: read_threads(proc, vms),
            vms: read_vms(proc, vms),
            all,
        }
    }

    /// The reading taken just after the rings are disabled: the VMs first,
    /// then every process. Reading the whole of `/proc` takes long on a
    /// loaded host; a VM read after it ran on meanwhile, unsampled (CI once
    /// had a busy VM's window 0.42 s longer than the 5 s it was sampled,
    /// its coverage 92.7 %, when the first reading also came after the
    /// rings were on).
    pub fn after_sampling(proc: &ProcRoot, vms: &[(String, u32)]) -> RunClock {
        let (vms, threads) = (read_vms(proc, vms), read_threads(proc, vms));
        RunClock {
            stat: proc.cpu_times().ok(),
            vms,
            threads,
            all: read_all(proc),
        }
    }

    /// Seconds each domain ran from `self` to `end`: every VM readable at
    /// both ends, then `host` (none when `/proc/stat` was unreadable).
    pub fn run_since(&self, end: &RunClock) -> Vec<(String, f64)> {
        let tck = clk_tck();
        let mut out = Vec::new();
        let mut vms_s = 0.0;
        for (name, t0) in &self.vms {
            let t1 = end.vms.iter().find(|(n, _)| n == name).and_then(|v| v.1);
            if let (Some(a), Some(b)) = (t0, t1) {
                let s = b.saturating_sub(*a) as f64 / tck;
                vms_s += s;
                out.push((name.clone(), s));
            }
        }
        if !end.all.is_empty() {
            // A process that began meanwhile counts whole. One that ended
            // is in its reaper's children's time, its whole life: what it
            // had run before the first reading is taken out again.
            let grown: u64 = end
                .all
                .iter()
                .map(|(pid, &(own, kids))| {
                    let (own0, kids0) = self.all.get(pid).copied().unwrap_or((0, 0));
                    own.saturating_sub(own0) + kids.saturating_sub(kids0)
                })
                .sum();
            let before: u64 = self
                .all
                .iter()
                .filter(|(pid, _)| !end.all.contains_key(pid))
                .map(|(_, &(own, kids))| own + kids)
                .sum();
            let ticks = grown.saturating_sub(before);
            out.push((
                vmscope_model::HOST_DOMAIN.to_string(),
                (ticks as f64 / tck - vms_s).max(0.0),
            ));
        }
        out
    }

    /// Seconds each VM's threads ran from `self` to `end`, summed by thread
    /// name (the name at the end; a thread that began meanwhile counts
    /// whole, one that ended is left out), largest first: the value of the
    /// [`vmscope_model::coverage_meta::RUN_THREADS_PREFIX`] key, a `seconds name` line each.
    pub fn thread_runs_since(&self, end: &RunClock) -> Vec<(String, String)> {
        self.vms
            .iter()
            .zip(&self.threads)
            .filter_map(|((name, _), t0)| {
                let i = end.vms.iter().position(|(n, _)| n == name)?;
                let t1 = end.threads.get(i)?;
                let mut by_name: HashMap<&str, u64> = HashMap::new();
                for (tid, (comm, run)) in t1 {
                    let before = t0.get(tid).map_or(0, |t| t.1);
                    *by_name.entry(comm.as_str()).or_default() += run.saturating_sub(before);
                }
                let mut v: Vec<(&str, u64)> = by_name.into_iter().collect();
                v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
                let text: String = v
                    .iter()
                    .map(|(comm, ns)| {
                        format!("{:.6} {}\n", *ns as f64 / 1e9, comm.replace('\n', " "))
                    })
                    .collect();
                (!text.is_empty()).then(|| (name.clone(), text))
            })
            .collect()
    }

    /// The host's own steal from `self` to `end`, percent of all its CPUs'
    /// time (`/proc/stat`); none when unreadable.
    pub fn steal_pct(&self, end: &RunClock) -> Option<f64> {
        let (a, b) = (self.stat.as_ref()?, end.stat.as_ref()?);
        let total = b.all.total() - a.all.total();
        (total > 0.0).then(|| 100.0 * (b.all.steal - a.all.steal).max(0.0) / total)
    }
}

/// Every process's ticks: its own, and its reaped children's.
fn read_all(proc: &ProcRoot) -> HashMap<u32, (u64, u64)> {
    proc.pids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|pid| {
            let c = proc.process_cpu(pid).ok()?;
            Some((pid, (c.utime + c.stime, c.cutime + c.cstime)))
        })
        .collect()
}

/// Each VM's threads: tid → (comm, run time in ns by schedstat); empty
/// for a VM gone or unreadable.
fn read_threads(proc: &ProcRoot, vms: &[(String, u32)]) -> Vec<HashMap<u32, (String, u64)>> {
    vms.iter()
        .map(|(_, pid)| {
            proc.threads(*pid)
                .into_iter()
                .filter_map(|(tid, comm)| {
                    Some((tid, (comm, proc.schedstat(*pid, tid).ok()?.run_ns)))
                })
                .collect()
        })
        .collect()
}

/// Each VM's name and its process's ticks (none when unreadable).
fn read_vms(proc: &ProcRoot, vms: &[(String, u32)]) -> Vec<(String, Option<u64>)> {
    vms.iter()
        .map(|(name, pid)| {
            (
                name.clone(),
                proc.process_cpu(*pid).ok().map(|c| c.utime + c.stime),
            )
        })
        .collect()
}
