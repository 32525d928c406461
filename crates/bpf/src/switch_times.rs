//! Per-task run time summed in the kernel: the `switch_times` program
//! (`src/bpf/sched.bpf.c`) on the `sched_switch` BTF raw tracepoint adds
//! each closed slice to a hash map keyed by (CPU, tid), and vm-stat drains
//! that map once per interval. The cost to vmscope then follows how many
//! distinct tasks ran, not how many switches happened (no record per
//! switch is copied out) nor how many threads exist (no `/proc` file per
//! thread is read).
//!
//! Maps:
//! - `cur` (array, one slot per possible CPU): when the running task's
//!   slice began (CLOCK_MONOTONIC ns, 0 = no switch seen yet), its tid, and
//!   how many switches did not chain (their `prev` was not the task last
//!   switched in: a switch the program did not see) and how many slices
//!   were dropped because `acc` was full;
//! - `acc` (hash, (cpu, tid) → ns): run time of slices closed since the
//!   last drain (a batch lookup-and-delete).
//!
//! A slice is keyed by the task `cur` says was switched in, not by the
//! switch's `prev`: after a switch the program missed the two differ, and
//! keying by `cur` keeps the reader's carried credit and the closed slice
//! on the same key (the gap goes to one task, never twice). The program
//! adds the closed slice to `acc` before it moves `cur` on, so a reader
//! that sees `cur` move knows the slice is in `acc`. The running slice at a
//! boundary is credited by the reader up to the boundary and carried
//! ([`Carry`]): its part already credited is taken off when it closes.
//! [`account`] is that bookkeeping, pure and tested on hand-built drains.
//!
//! Limits: a slice added while the reader deletes its element in the same
//! instant can be lost (the program holds a pointer to the element for a
//! few instructions); `acc` holds [`acc_entries`] (cpu, tid) pairs per
//! interval, and slices of pairs beyond that are dropped (and counted).
//! The program runs in the switching task's context: its cost is the
//! kernel's, not vmscope's (with `kernel.bpf_stats_enabled=1`,
//! `run_time_ns` in the program's fdinfo shows it).

use crate::object::{self, Loaded};
use crate::BpfError;
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use std::collections::HashMap;

/// Nanoseconds per (cpu, tid); tid 0 is idle.
pub type CpuTidTimes = HashMap<(u32, u32), u64>;

/// (cpu, tid) pairs the hash map holds between two drains: 256 per CPU,
/// at least 16384. The drain walks every bucket, so a larger map costs
/// every interval (65536 entries: a quarter of stat's CPU at 100 ms with
/// 514 threads); slices that find it full are counted as dropped.
pub fn acc_entries(cpu_slots: u32) -> u32 {
    (256 * cpu_slots).next_power_of_two().max(16384)
}

/// A running slice credited up to the last boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carry {
    /// When the slice began.
    pub since: u64,
    pub tid: u32,
    /// Its part before the last boundary (credited, or before the first
    /// interval): taken off when the closed slice arrives in `acc`.
    pub excluded: u64,
}

/// `cur` of one CPU: when its running task's slice began (0 = unknown) and
/// the task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Running {
    pub since: u64,
    pub tid: u32,
}

/// One interval's bookkeeping: `drained` are the closed slices read from
/// `acc` ((cpu, tid), ns), `before` and `after` each CPU's `cur` read just
/// before and after the drain, `late(cpu, tid)` drains that one key again
/// (called for a carried slice that closed while the drain ran, so it is
/// in `acc` now), `t0`/`t1` the boundaries. Returns ns per (cpu, tid) in
/// `[t0, t1]`, tid 0 being idle.
pub fn account(
    carry: &mut HashMap<u32, Carry>,
    drained: &[((u32, u32), u64)],
    before: &[(u32, Running)],
    after: &[(u32, Running)],
    t0: u64,
    t1: u64,
    mut late: impl FnMut(u32, u32) -> Option<u64>,
) -> CpuTidTimes {
    let mut times = CpuTidTimes::new();
    for &(k, ns) in drained {
        *times.entry(k).or_default() += ns;
    }
    let before: HashMap<u32, Running> = before.iter().copied().collect();
    for &(cpu, now) in after {
        if let Some(c) = carry.remove(&cpu) {
            if now.since == c.since {
                // Still running: credit up to the boundary.
                let end = t1.max(c.since);
                *times.entry((cpu, c.tid)).or_default() +=
                    (end - c.since).saturating_sub(c.excluded);
                carry.insert(
                    cpu,
                    Carry {
                        excluded: end - c.since,
                        ..c
                    },
                );
                continue;
            }
            if before.get(&cpu).is_some_and(|b| b.since == c.since) {
                if let Some(ns) = late(cpu, c.tid) {
                    *times.entry((cpu, c.tid)).or_default() += ns;
                }
            }
            if let Some(ns) = times.get_mut(&(cpu, c.tid)) {
                *ns = ns.saturating_sub(c.excluded);
            }
        }
        if now.since != 0 && now.since <= t1 {
            *times.entry((cpu, now.tid)).or_default() += t1 - now.since.max(t0);
            carry.insert(
                cpu,
                Carry {
                    since: now.since,
                    tid: now.tid,
                    excluded: t1 - now.since,
                },
            );
        }
    }
    times
}

/// The loaded and attached program with its maps.
pub struct BpfSwitchTimes {
    loaded: Loaded,
    cur: MapHandle,
    acc: MapHandle,
    cpus: Vec<u32>,
    entries: u32,
    dropped: u64,
    dropped_now: u64,
    holes: u64,
    holes_now: u64,
    carry: HashMap<u32, Carry>,
    t0: u64,
}

fn map_err(what: &'static str) -> impl FnOnce(libbpf_rs::Error) -> BpfError {
    move |source| BpfError::Map { what, source }
}

impl BpfSwitchTimes {
    /// Load the program and attach it to `sched_switch`. Fails with a
    /// one-line reason when BPF, BTF or the tracepoint is unavailable
    /// (unprivileged, locked down, a kernel too old).
    pub fn open() -> Result<BpfSwitchTimes, BpfError> {
        let slots = object::cpu_slots();
        let entries = acc_entries(slots);
        let loaded = object::load(
            "vm-stat's sched_switch program",
            &["switch_times"],
            &[("cur", slots), ("acc", entries)],
        )?;
        let cpus = vmscope_linux::online_cpus(std::path::Path::new("/sys")).map_err(|e| {
            BpfError::Load {
                what: "the online CPUs".into(),
                msg: e.to_string(),
            }
        })?;
        let mut me = BpfSwitchTimes {
            cur: loaded.map("cur")?,
            acc: loaded.map("acc")?,
            loaded,
            cpus,
            entries,
            dropped: 0,
            dropped_now: 0,
            holes: 0,
            holes_now: 0,
            carry: HashMap::new(),
            t0: vmscope_linux::clock_monotonic_ns(),
        };
        // Batch reads are checked here so a kernel without them falls back
        // at start, not at the first interval.
        object::check_batch_reads(&me.acc, "vm-stat's run-time map")?;
        me.running()?;
        me.holes = me.holes_now;
        me.dropped = me.dropped_now;
        me.t0 = vmscope_linux::clock_monotonic_ns();
        Ok(me)
    }

    /// The program's id (`bpftool prog show id N`).
    pub fn program_ids(&self) -> Vec<u32> {
        self.loaded.program_ids()
    }

    /// The end of the last interval (CLOCK_MONOTONIC ns).
    pub fn t0(&self) -> u64 {
        self.t0
    }

    /// `cur` of every online CPU.
    fn running(&mut self) -> Result<Vec<(u32, Running)>, BpfError> {
        let mut out = Vec::with_capacity(self.cpus.len());
        let (mut holes, mut dropped) = (0, 0);
        let mut val = [0u8; 32];
        for &cpu in &self.cpus {
            if !self
                .cur
                .lookup_into(&cpu.to_ne_bytes(), &mut val, MapFlags::ANY)
                .map_err(map_err("reading the per-CPU slice map"))?
            {
                continue;
            }
            let word = |i: usize| u64::from_ne_bytes(val[8 * i..8 * i + 8].try_into().unwrap());
            holes += word(2);
            dropped += word(3);
            out.push((
                cpu,
                Running {
                    since: word(0),
                    tid: word(1) as u32,
                },
            ));
        }
        self.holes_now = holes;
        self.dropped_now = dropped;
        Ok(out)
    }

    /// Drain `acc` into `out` ((cpu, tid), ns).
    fn drain(&mut self, out: &mut Vec<((u32, u32), u64)>) -> Result<(), BpfError> {
        let batch = self
            .acc
            .lookup_and_delete_batch(self.entries, MapFlags::ANY, MapFlags::ANY)
            .map_err(map_err("draining the run-time map"))?;
        for (k, v) in batch {
            if k.len() < 8 || v.len() < 8 {
                continue;
            }
            let cpu = u32::from_ne_bytes(k[0..4].try_into().unwrap());
            let tid = u32::from_ne_bytes(k[4..8].try_into().unwrap());
            out.push(((cpu, tid), u64::from_ne_bytes(v[0..8].try_into().unwrap())));
        }
        Ok(())
    }

    fn take_one(&self, cpu: u32, tid: u32) -> Option<u64> {
        let mut key = [0u8; 8];
        key[..4].copy_from_slice(&cpu.to_ne_bytes());
        key[4..].copy_from_slice(&tid.to_ne_bytes());
        let v = self.acc.lookup_and_delete(&key).ok()??;
        Some(u64::from_ne_bytes(v.get(0..8)?.try_into().ok()?))
    }

    /// Switches since the previous call whose `prev` was not the task the
    /// program last saw switched in on that CPU (a switch it missed; the
    /// gap went to that task).
    pub fn take_unchained(&mut self) -> u64 {
        let n = self.holes_now.saturating_sub(self.holes);
        self.holes = self.holes_now;
        n
    }

    /// Slices dropped since the previous call because the map was full
    /// (their time is missing).
    pub fn take_dropped(&mut self) -> u64 {
        let n = self.dropped_now.saturating_sub(self.dropped);
        self.dropped = self.dropped_now;
        n
    }

    /// Run time of every (cpu, tid) from the end of the last interval to
    /// now (tid 0 = idle), and that interval's ends (CLOCK_MONOTONIC ns).
    pub fn collect(&mut self) -> Result<(CpuTidTimes, u64, u64), BpfError> {
        let before = self.running()?;
        let mut drained = Vec::new();
        self.drain(&mut drained)?;
        let after = self.running()?;
        let t1 = vmscope_linux::clock_monotonic_ns();
        let t0 = self.t0;
        let mut carry = std::mem::take(&mut self.carry);
        let times = account(&mut carry, &drained, &before, &after, t0, t1, |c, t| {
            self.take_one(c, t)
        });
        self.carry = carry;
        self.t0 = t1;
        Ok((times, t0, t1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(since: u64, tid: u32) -> Running {
        Running { since, tid }
    }

    #[test]
    fn slices_running_across_boundaries_are_split() {
        let mut carry = HashMap::new();
        // Interval [1000, 2000]: CPU 0 ran task 7 from 1200 (closed at
        // 1500, 300 ns in acc) and task 9 since 1500; CPU 1 has seen no
        // switch yet.
        let drained = [((0, 7), 300), ((0, 0), 200)];
        let after = [(0, run(1500, 9)), (1, run(0, 0))];
        let t = account(&mut carry, &drained, &after, &after, 1000, 2000, |_, _| {
            None
        });
        assert_eq!(t[&(0, 7)], 300);
        assert_eq!(t[&(0, 9)], 500);
        assert_eq!(t.get(&(1, 0)), None);
        assert_eq!(carry[&0].excluded, 500);
        // [2000, 3000]: task 9 still runs on CPU 0; CPU 1's first switch
        // at 2600 to task 4, its first slice unknown.
        let after = [(0, run(1500, 9)), (1, run(2600, 4))];
        let t = account(&mut carry, &[], &after, &after, 2000, 3000, |_, _| None);
        assert_eq!(t[&(0, 9)], 1000);
        assert_eq!(t[&(1, 4)], 400);
        // [3000, 4000]: task 9 closed at 3300 (its whole 1800 ns slice in
        // acc, 1500 of it credited already), idle since.
        let drained = [((0, 9), 1800)];
        let after = [(0, run(3300, 0)), (1, run(2600, 4))];
        let t = account(&mut carry, &drained, &after, &after, 3000, 4000, |_, _| {
            None
        });
        assert_eq!(t[&(0, 9)], 300);
        assert_eq!(t[&(0, 0)], 700);
        assert_eq!(t[&(1, 4)], 1000);
        let cpu0: u64 = t.iter().filter(|(k, _)| k.0 == 0).map(|(_, v)| v).sum();
        assert_eq!(cpu0, 1000, "a CPU's slices fill the interval");
    }

    #[test]
    fn a_slice_closing_during_the_drain_is_fetched_again() {
        let mut carry = HashMap::from([(
            0,
            Carry {
                since: 500,
                tid: 9,
                excluded: 500,
            },
        )]);
        // Task 9 closed at 1800, after the drain had passed its key.
        let before = [(0, run(500, 9))];
        let after = [(0, run(1800, 3))];
        let mut asked = Vec::new();
        let t = account(&mut carry, &[], &before, &after, 1000, 2000, |c, tid| {
            asked.push((c, tid));
            Some(1300)
        });
        assert_eq!(asked, vec![(0, 9)]);
        assert_eq!(t[&(0, 9)], 800);
        assert_eq!(t[&(0, 3)], 200);
    }

    /// Live: the program loads and runs, each CPU's slices fill the
    /// intervals, and a thread's summed slices agree with its own
    /// `schedstat` (root).
    #[test]
    fn live_slices_fill_each_cpu_and_match_schedstat() {
        if !vmscope_testkit::require_root("loading eBPF programs") {
            return;
        }
        let mut b = BpfSwitchTimes::open().unwrap_or_else(|e| panic!("{e}"));
        assert!(!b.running().unwrap().is_empty(), "no CPU slot reads");
        // A thread that runs about half the time, in bursts.
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let worker = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_millis(3) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        });
        let tid = rx.recv().unwrap();
        let run_ns = || -> u64 {
            let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
            s.split_whitespace().next().unwrap().parse().unwrap()
        };
        // The host's steal over all CPUs (USER_HZ ticks of /proc/stat's
        // `cpu` line): the program's clock (CLOCK_MONOTONIC) runs on while
        // a vCPU of this host is stolen, the thread's run time does not.
        let steal_ns = || -> u64 {
            let s = std::fs::read_to_string("/proc/stat").unwrap();
            let ticks: u64 = s
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(8))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            ticks * 10_000_000
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let _ = b.collect().unwrap();
        let s0 = steal_ns();
        let r0 = run_ns();
        let mut total = HashMap::new();
        let mut mine = 0u64;
        let mut dt = 0;
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let (t, t0, t1) = b.collect().unwrap();
            dt += t1 - t0;
            for ((cpu, task), ns) in t {
                *total.entry(cpu).or_insert(0u64) += ns;
                if task == tid {
                    mine += ns;
                }
            }
        }
        let r1 = run_ns();
        let stolen = steal_ns() - s0;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        worker.join().unwrap();
        let sched = r1 - r0;
        eprintln!(
            "thread {tid}: {:.1} ms by the program, {:.1} ms by schedstat; {} unchained switches; host steal {:.1} ms",
            mine as f64 / 1e6,
            sched as f64 / 1e6,
            b.take_unchained(),
            stolen as f64 / 1e6
        );
        // The two reads of schedstat are not at the interval ends: a few
        // ms of skew at most; and the program counts the host's stolen time
        // while the thread held its CPU (a loaded CI run: 265.6 ms against
        // 198.0 ms), at most all of the host's steal meanwhile.
        let slack = 5_000_000 + sched / 50;
        assert!(
            mine <= sched + slack + stolen && sched <= mine + slack,
            "program {mine} ns vs schedstat {sched} ns, host steal {stolen} ns"
        );
        for (cpu, ns) in total {
            let share = ns as f64 / dt as f64;
            eprintln!("CPU {cpu}: slices cover {share:.4} of {dt} ns");
            assert!(
                (0.95..=1.05).contains(&share),
                "CPU {cpu}: slices cover {share:.3} of the time"
            );
        }
    }
}
