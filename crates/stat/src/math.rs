//! The pure arithmetic of accounting, free of I/O so it is tested without
//! root: counter deltas (with resets), a vCPU's run / runnable / blocked
//! split from two `schedstat` readings, percentages, Cherkasova's charging
//! rule for shared I/O work (`cost = T / ΣN`, `charge_i = N_i × cost`), and
//! the per-interval reconciliation (Σ VM totals + unattributed = measured).

use vmscope_linux::procfs::SchedStat;

/// `cur - prev` for a monotonic counter; `None` when it went backwards (the
/// counter was reset: a reused id, a recreated device).
pub fn delta(prev: u64, cur: u64) -> Option<u64> {
    cur.checked_sub(prev)
}

/// `part` as a percentage of `whole` (0 when `whole` is not positive).
pub fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// Per second rate of a count over `dt` seconds.
pub fn rate(count: f64, dt: f64) -> f64 {
    if dt > 0.0 {
        count / dt
    } else {
        0.0
    }
}

/// How one vCPU thread spent an interval, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VcpuSplit {
    /// On a host CPU.
    pub run: f64,
    /// Ready but waiting for a host CPU (run_delay: the guest's steal time).
    pub runnable: f64,
    /// Neither: halted or blocked (the rest of the interval).
    pub blocked: f64,
}

/// The split of `dt` seconds from two `schedstat` readings. `prev = None`
/// means the thread appeared during the interval: everything it has counted
/// happened inside the interval. A counter that went backwards (a reused
/// thread id) is read as a new thread. Run and runnable are capped at `dt`
/// together (sampling jitter), blocked is never negative.
pub fn vcpu_split(prev: Option<SchedStat>, cur: SchedStat, dt: f64) -> VcpuSplit {
    let base = prev
        .filter(|p| p.run_ns <= cur.run_ns && p.wait_ns <= cur.wait_ns)
        .unwrap_or_default();
    let mut run = (cur.run_ns - base.run_ns) as f64 / 1e9;
    let mut runnable = (cur.wait_ns - base.wait_ns) as f64 / 1e9;
    let sum = run + runnable;
    if dt > 0.0 && sum > dt {
        run *= dt / sum;
        runnable *= dt / sum;
    }
    VcpuSplit {
        run,
        runnable,
        blocked: (dt - run - runnable).max(0.0),
    }
}

/// Run seconds of a thread between two readings (see [`vcpu_split`] for
/// `prev = None` and resets).
pub fn run_seconds(prev: Option<SchedStat>, cur: SchedStat) -> f64 {
    let base = prev.filter(|p| p.run_ns <= cur.run_ns).unwrap_or_default();
    (cur.run_ns - base.run_ns) as f64 / 1e9
}

/// Cherkasova's rule: the shared time `t` costs `t / ΣN` per I/O
/// operation and VM *i* is charged `N_i × cost`. Returns the cost per
/// operation and each VM's charge, in the order of `ops`. With no
/// operations at all nothing is charged (the time stays unattributed).
pub fn charge(t: f64, ops: &[u64]) -> (f64, Vec<f64>) {
    let total: u64 = ops.iter().sum();
    if total == 0 || t <= 0.0 {
        return (0.0, vec![0.0; ops.len()]);
    }
    let cost = t / total as f64;
    (cost, ops.iter().map(|&n| n as f64 * cost).collect())
}

/// The last line of an interval: Σ VM totals + unattributed host CPU =
/// measured host CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reconciliation {
    /// Busy host CPU from `/proc/stat` (wall time less idle), seconds.
    pub measured: f64,
    /// Σ over VMs of (vCPU run + direct I/O + shared I/O charge), seconds.
    pub vms: f64,
    /// Host CPU not charged to any VM, measured on its own: the run time of
    /// every other task less the I/O softirq time inside it (which is in
    /// T), plus shared I/O time no VM was charged for, plus non-I/O
    /// softirqs on idle CPUs (busy time no task's run time holds).
    pub unattributed: f64,
    /// `measured − vms − unattributed`: interrupt work on idle CPUs, the
    /// last slice of tasks that exited, and the 10 ms resolution of
    /// `/proc/stat`.
    pub residual: f64,
}

impl Reconciliation {
    pub fn new(measured: f64, vm_totals: &[f64], unattributed: f64) -> Reconciliation {
        // `+ 0.0` turns the -0.0 of an empty sum into 0.0.
        let vms: f64 = vm_totals.iter().sum::<f64>() + 0.0;
        Reconciliation {
            measured,
            vms,
            unattributed,
            residual: measured - vms - unattributed,
        }
    }

    /// |residual| relative to `measured` (the residual itself when nothing
    /// was measured).
    pub fn error(&self) -> f64 {
        if self.measured > 0.0 {
            self.residual.abs() / self.measured
        } else {
            self.residual.abs()
        }
    }

    /// More was charged to VMs than the host measured, by more than
    /// `tolerance` seconds.
    pub fn over_attributed(&self, tolerance: f64) -> bool {
        self.vms > self.measured + tolerance
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ss(run_ms: u64, wait_ms: u64) -> SchedStat {
        SchedStat {
            run_ns: run_ms * 1_000_000,
            wait_ns: wait_ms * 1_000_000,
            slices: 0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn split_of_an_interval() {
        let s = vcpu_split(Some(ss(1000, 100)), ss(1600, 300), 1.0);
        assert!(close(s.run, 0.6) && close(s.runnable, 0.2) && close(s.blocked, 0.2));
        // A new thread: all it counted is inside the interval.
        let s = vcpu_split(None, ss(50, 10), 0.1);
        assert!(close(s.run, 0.05) && close(s.runnable, 0.01) && close(s.blocked, 0.04));
        // Jitter beyond dt is scaled down, blocked stays >= 0.
        let s = vcpu_split(Some(ss(0, 0)), ss(900, 300), 1.0);
        assert!(close(s.run + s.runnable, 1.0) && close(s.blocked, 0.0));
        assert!(close(s.run, 0.75));
        // Reset (reused tid): treated as new.
        let s = vcpu_split(Some(ss(5000, 0)), ss(100, 0), 1.0);
        assert!(close(s.run, 0.1));
        assert!(close(run_seconds(Some(ss(10, 0)), ss(30, 5)), 0.02));
    }

    #[test]
    fn charging_rule() {
        let (cost, c) = charge(0.3, &[100, 200, 0]);
        assert!(close(cost, 0.001));
        assert!(close(c[0], 0.1) && close(c[1], 0.2) && close(c[2], 0.0));
        assert!(close(c.iter().sum::<f64>(), 0.3));
        let (cost, c) = charge(0.3, &[0, 0]);
        assert_eq!((cost, c), (0.0, vec![0.0, 0.0]));
        assert_eq!(charge(0.0, &[]).1, Vec::<f64>::new());
    }

    #[test]
    fn reconciliation() {
        let r = Reconciliation::new(2.0, &[0.5, 0.7], 0.78);
        assert!(close(r.residual, 0.02));
        assert!(close(r.error(), 0.01));
        assert!(!r.over_attributed(0.01));
        let r = Reconciliation::new(1.0, &[0.9, 0.2], 0.0);
        assert!(close(r.residual, -0.1));
        assert!(r.over_attributed(0.05));
        assert!(!r.over_attributed(0.2));
        assert!(close(Reconciliation::new(0.0, &[], 0.0).error(), 0.0));
    }

    #[test]
    fn small_helpers() {
        assert_eq!(delta(5, 7), Some(2));
        assert_eq!(delta(7, 5), None);
        assert!(close(pct(0.25, 0.5), 50.0));
        assert_eq!(pct(1.0, 0.0), 0.0);
        assert!(close(rate(30.0, 0.5), 60.0));
        assert_eq!(rate(1.0, 0.0), 0.0);
    }
}
