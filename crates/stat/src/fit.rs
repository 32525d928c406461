//! Fitting one interval's `sched_switch` slices to the kernel's own
//! counters (pure arithmetic, no I/O).
//!
//! The tracepoint rings give exact slices, but a kernel can leave holes:
//! on the machine vmscope is developed on, the switch-outs of the init
//! process's threads are never delivered, so the slice after one belongs
//! to an unknown mix of tasks. Two counters the kernel keeps anyway bound
//! the result:
//! 1. each VM thread's `schedstat` run time is exact per thread: its slices
//!    scale to it, and a thread seen in no slice is placed on the CPU it
//!    runs on ([`fit_threads`]);
//! 2. each CPU's busy time in `/proc/stat` bounds its total from both
//!    sides ([`fit_cpus`]; `stat` derives the bounds, with slack since the
//!    kernel samples busy time at its tick). Above the ceiling, host slices
//!    are cut first, then VM time (exact in total, only its placement can
//!    be wrong) moves to CPUs with room, and is dropped only when no CPU
//!    has any; below the floor, the missing time is host work whose slice
//!    was lost ([`UNSEEN_HOST`]).

use std::collections::HashMap;

/// Nanoseconds per (cpu, tid) in one interval; tid 0 is idle.
pub type TidTimes = HashMap<(u32, u32), u64>;

/// Pseudo-tid of host time the kernel counted and no slice showed.
pub const UNSEEN_HOST: u32 = u32::MAX;

/// A CPU's allowed busy time in the interval, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub floor: u64,
    pub ceiling: u64,
}

/// One VM thread's exact run time in the interval.
#[derive(Debug, Clone, Copy)]
pub struct ThreadRun {
    pub pid: u32,
    pub tid: u32,
    /// `schedstat` run-time delta over the interval.
    pub run_ns: u64,
}

/// Scale each VM thread's slices to its `schedstat` run time; place the
/// time of a thread no slice showed (at least `min_ns`, below which it is
/// read skew) on the CPU `cpu_of` says it is on (asked only for those).
/// Returns the (cpu, tid) so placed.
pub fn fit_threads(
    times: &mut TidTimes,
    runs: &[ThreadRun],
    min_ns: u64,
    mut cpu_of: impl FnMut(&ThreadRun) -> Option<u32>,
) -> Vec<(u32, u32)> {
    let mut by_tid: HashMap<u32, Vec<(u32, u32)>> = HashMap::new();
    for &k in times.keys() {
        by_tid.entry(k.1).or_default().push(k);
    }
    let mut placed = Vec::new();
    for r in runs {
        let keys = by_tid.get(&r.tid).map(Vec::as_slice).unwrap_or(&[]);
        let seen: u64 = keys.iter().map(|k| times[k]).sum();
        if seen == 0 {
            if r.run_ns >= min_ns {
                if let Some(cpu) = cpu_of(r) {
                    *times.entry((cpu, r.tid)).or_default() += r.run_ns;
                    placed.push((cpu, r.tid));
                }
            }
            continue;
        }
        let k = r.run_ns as f64 / seen as f64;
        for key in keys {
            if let Some(ns) = times.get_mut(key) {
                *ns = (*ns as f64 * k).round() as u64;
            }
        }
    }
    placed
}

/// Keep each CPU's busy time within `bounds[cpu]` (CPUs missing from
/// `bounds` are left alone). Over the ceiling: host slices (`!is_vm`)
/// shrink first, in proportion; VM time still over moves, in proportion to
/// the room left, to CPUs under their ceiling. Under the floor: the rest is
/// [`UNSEEN_HOST`] time. Idle (tid 0) is then what `dt_ns` leaves. Returns
/// each bounded CPU's busy time after the fit.
pub fn fit_cpus(
    times: &mut TidTimes,
    is_vm: impl Fn(u32) -> bool,
    bounds: &HashMap<u32, Bounds>,
    dt_ns: u64,
) -> HashMap<u32, u64> {
    // Busy time and non-idle slices of each bounded CPU, indexed once.
    let mut busy: HashMap<u32, u64> = bounds.keys().map(|&c| (c, 0)).collect();
    let mut slices: HashMap<u32, Vec<(u32, u32)>> = HashMap::new();
    for (&k, &ns) in times.iter() {
        if let (Some(b), true) = (busy.get_mut(&k.0), k.1 != 0) {
            *b += ns;
            slices.entry(k.0).or_default().push(k);
        }
    }
    let mut cpus: Vec<u32> = bounds.keys().copied().collect();
    cpus.sort_unstable();
    // VM time taken off over-full CPUs, per tid.
    let mut moving: Vec<(u32, u64)> = Vec::new();
    for &cpu in &cpus {
        let mut over = busy[&cpu].saturating_sub(bounds[&cpu].ceiling);
        for vm_pass in [false, true] {
            if over == 0 {
                break;
            }
            let keys: Vec<(u32, u32)> = slices
                .get(&cpu)
                .into_iter()
                .flatten()
                .filter(|k| is_vm(k.1) == vm_pass)
                .copied()
                .collect();
            let pool: u64 = keys.iter().map(|k| times[k]).sum();
            if pool == 0 {
                continue;
            }
            let take = over.min(pool);
            let mut taken = 0;
            for (i, key) in keys.iter().enumerate() {
                let ns = times[key];
                // The last slice takes the rounding remainder.
                let cut = if i + 1 == keys.len() {
                    (take - taken).min(ns)
                } else {
                    ((u128::from(ns) * u128::from(take)) / u128::from(pool)) as u64
                };
                *times.get_mut(key).unwrap() -= cut;
                taken += cut;
                if vm_pass && cut > 0 {
                    moving.push((key.1, cut));
                }
            }
            over -= taken;
            *busy.get_mut(&cpu).unwrap() -= taken;
        }
    }
    // Moved VM time goes to CPUs with room, each in proportion to its room;
    // when there is less room than time, every CPU fills up.
    let room: Vec<(u32, u64)> = cpus
        .iter()
        .map(|&c| (c, bounds[&c].ceiling.saturating_sub(busy[&c])))
        .filter(|&(_, r)| r > 0)
        .collect();
    let total_room: u64 = room.iter().map(|r| r.1).sum();
    let total_moving: u64 = moving.iter().map(|m| m.1).sum();
    let k = (total_room as f64 / total_moving.max(1) as f64).min(1.0);
    let mut left_room = room.clone();
    for (tid, ns) in moving {
        let mut left = (ns as f64 * k) as u64;
        let amount = left;
        // In proportion first, then rounding leftovers wherever room is left.
        for pass in 0..2 {
            for ((cpu, r), &(_, r0)) in left_room.iter_mut().zip(&room) {
                let want = if pass == 0 {
                    ((u128::from(amount) * u128::from(r0)) / u128::from(total_room)) as u64
                } else {
                    left
                };
                let give = want.min(*r).min(left);
                if give > 0 {
                    *times.entry((*cpu, tid)).or_default() += give;
                    *busy.get_mut(cpu).unwrap() += give;
                    *r -= give;
                    left -= give;
                }
            }
        }
    }
    for &cpu in &cpus {
        let b = busy.get_mut(&cpu).unwrap();
        let floor = bounds[&cpu].floor.min(bounds[&cpu].ceiling);
        if *b < floor {
            *times.entry((cpu, UNSEEN_HOST)).or_default() += floor - *b;
            *b = floor;
        }
        times.insert((cpu, 0), dt_ns.saturating_sub(*b));
    }
    busy
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn up_to(ceiling: u64) -> Bounds {
        Bounds { floor: 0, ceiling }
    }

    #[test]
    fn threads_follow_schedstat() {
        let mut t: TidTimes = HashMap::new();
        t.insert((0, 11), 300 * MS);
        t.insert((1, 11), 300 * MS);
        t.insert((0, 50), 100 * MS);
        let run = |tid, run_ns| ThreadRun {
            pid: 1,
            tid,
            run_ns,
        };
        let mut asked = Vec::new();
        let placed = fit_threads(
            &mut t,
            // The slices missed a third of vCPU 11's time; vCPU 12 was never
            // seen switching (placed where it runs); vCPU 13's 1 ms is below
            // the skew threshold.
            &[run(11, 900 * MS), run(12, 40 * MS), run(13, MS)],
            2 * MS,
            |r| {
                asked.push(r.tid);
                Some(0)
            },
        );
        assert_eq!(asked, vec![12], "the CPU is asked only when needed");
        assert_eq!(t[&(0, 11)], 450 * MS);
        assert_eq!(t[&(1, 11)], 450 * MS);
        assert_eq!(t[&(0, 12)], 40 * MS);
        assert!(!t.contains_key(&(0, 13)));
        assert_eq!(t[&(0, 50)], 100 * MS, "host slices untouched");
        assert_eq!(placed, vec![(0, 12)]);
    }

    #[test]
    fn host_time_is_cut_before_vm_time_moves() {
        let mut t: TidTimes = HashMap::new();
        // CPU 0: a vCPU placed after a migration and a host task; the kernel
        // says CPU 0 was busy only 300 ms, CPU 1 busy 900 ms of which the
        // slices show 500.
        t.insert((0, 11), 500 * MS);
        t.insert((0, 50), 200 * MS);
        t.insert((1, 11), 400 * MS);
        t.insert((1, 51), 100 * MS);
        let ceiling = HashMap::from([(0, up_to(300 * MS)), (1, up_to(900 * MS))]);
        fit_cpus(&mut t, |tid| tid == 11, &ceiling, 1000 * MS);
        assert_eq!(t[&(0, 50)], 0, "host time goes first");
        assert_eq!(t[&(0, 11)], 300 * MS);
        // The 200 ms of vCPU time moved to CPU 1, which had 400 ms of room.
        assert_eq!(t[&(1, 11)], 600 * MS);
        assert_eq!(t[&(1, 51)], 100 * MS);
        let vcpu: u64 = t.iter().filter(|(k, _)| k.1 == 11).map(|(_, v)| v).sum();
        assert_eq!(vcpu, 900 * MS, "VM time is kept when it fits somewhere");
        assert_eq!(t[&(0, 0)], 700 * MS);
        assert_eq!(t[&(1, 0)], 300 * MS);
    }

    #[test]
    fn vm_time_with_nowhere_to_go_is_dropped_and_totals_never_exceed_ceilings() {
        let mut t: TidTimes = HashMap::new();
        t.insert((0, 11), 1000 * MS);
        t.insert((1, 12), 1000 * MS);
        let ceiling = HashMap::from([(0, up_to(600 * MS)), (1, up_to(800 * MS))]);
        fit_cpus(&mut t, |tid| tid > 10, &ceiling, 1000 * MS);
        assert_eq!(t[&(0, 11)], 600 * MS);
        let busy1: u64 = t
            .iter()
            .filter(|(k, _)| k.0 == 1 && k.1 != 0)
            .map(|(_, v)| v)
            .sum();
        assert_eq!(busy1, 800 * MS);
        // A CPU within its ceiling is left as it is.
        let mut u: TidTimes = HashMap::new();
        u.insert((0, 11), 200 * MS);
        u.insert((0, 50), 100 * MS);
        let before = u.clone();
        fit_cpus(
            &mut u,
            |tid| tid == 11,
            &HashMap::from([(0, up_to(400 * MS))]),
            1000 * MS,
        );
        assert_eq!(u[&(0, 11)], before[&(0, 11)]);
        assert_eq!(u[&(0, 50)], before[&(0, 50)]);
        assert_eq!(u[&(0, 0)], 700 * MS);
    }

    #[test]
    fn a_floor_adds_unseen_host_time() {
        let mut t: TidTimes = HashMap::new();
        t.insert((0, 11), 200 * MS);
        let b = Bounds {
            floor: 500 * MS,
            ceiling: 600 * MS,
        };
        fit_cpus(&mut t, |tid| tid == 11, &HashMap::from([(0, b)]), 1000 * MS);
        assert_eq!(t[&(0, 11)], 200 * MS);
        assert_eq!(t[&(0, UNSEEN_HOST)], 300 * MS);
        assert_eq!(t[&(0, 0)], 500 * MS);
    }
}
