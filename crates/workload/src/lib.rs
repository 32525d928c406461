//! Known-answer CPU workloads, shared by `vmscope demo` on the host and
//! `vmscope-agent demo` inside guests: three functions that take 50 %, 30 %
//! and 20 % of the workload's CPU. Their names are unmangled so every
//! symbolizer (vmscope's, perf's, a guest agent's) names them alike.
//!
//! [`io`] is the dd-equivalent I/O engine of `vmscope bench io`, the same
//! code on the host and in guests (`vmscope-agent io`, `vmscope-agent dd`);
//! [`net`] the sender and receiver of `vmscope bench net` (`vmscope-agent
//! net`); [`scale`] the memwrite and cpu workloads of `vmscope bench scale`
//! (`vmscope-agent scale`).

pub mod io;
pub mod net;
pub mod scale;

use std::time::{Duration, Instant};

/// Work units per call; one unit is a short dependent arithmetic chain.
const UNIT: u64 = 20_000;

#[inline(always)]
fn spin(iters: u64, seed: u64) -> u64 {
    // The loop starts within a few dozen bytes of a 256-byte boundary (the
    // padding is executed as NOPs, once per call), so it never straddles a
    // 4 KiB page. Under TCG a loop that crosses a page cannot chain its
    // translated blocks and runs several times slower: a build whose
    // layout put beta's loop across a page boundary measured 33/53/13
    // instead of 50/30/20 in a guest.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an assembler alignment directive; no instruction but NOPs.
    unsafe {
        std::arch::asm!(".p2align 8", options(nomem, nostack, preserves_flags));
    }
    // A plain while loop (no iterator calls), so that even an unoptimized
    // build keeps every sample inside the calling function.
    let mut x = seed | 1;
    let mut i = 0u64;
    while i < iters {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        x ^= x >> 29;
        i += 1;
    }
    std::hint::black_box(x)
}

/// 50 % of the demo's CPU.
#[no_mangle]
#[inline(never)]
pub fn vmscope_demo_alpha(seed: u64, units: u64) -> u64 {
    spin(5 * units, seed)
}

/// 30 % of the demo's CPU.
#[no_mangle]
#[inline(never)]
pub fn vmscope_demo_beta(seed: u64, units: u64) -> u64 {
    spin(3 * units, seed)
}

/// 20 % of the demo's CPU.
#[no_mangle]
#[inline(never)]
pub fn vmscope_demo_gamma(seed: u64, units: u64) -> u64 {
    spin(2 * units, seed)
}

/// Names of the three functions and their expected shares (percent).
pub const EXPECTED: [(&str, f64); 3] = [
    ("vmscope_demo_alpha", 50.0),
    ("vmscope_demo_beta", 30.0),
    ("vmscope_demo_gamma", 20.0),
];

/// Length of one on/off cycle of [`run_duty`].
pub const DUTY_PERIOD: Duration = Duration::from_millis(100);

/// Run the mix on `threads` threads for `duration`; returns the rounds done
/// (one round = one call of each function), a throughput figure for
/// overhead measurements.
pub fn run(duration: Duration, threads: usize) -> u64 {
    run_duty(duration, threads, 100.0)
}

/// As [`run`], busy for `duty_pct` percent of every [`DUTY_PERIOD`] (by the
/// clock) and asleep for the rest: a load of about `duty_pct` % of a CPU
/// per thread where the thread gets a CPU whenever it asks. 100 (or more)
/// never sleeps; 0 or less never works.
pub fn run_duty(duration: Duration, threads: usize, duty_pct: f64) -> u64 {
    let start = Instant::now();
    let deadline = start + duration;
    let busy = DUTY_PERIOD.mul_f64((duty_pct / 100.0).clamp(0.0, 1.0));
    let handles: Vec<_> = (0..threads.max(1))
        .map(|_| std::thread::spawn(move || worker(start, deadline, busy, None)))
        .collect();
    handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
}

/// As [`run_duty`], and every `every` calls `report` with the rounds done
/// so far by all threads (counted in one shared counter, a relaxed atomic
/// add per round of about 0.4 ms): `vmscope-agent demo -p` prints them
/// with the guest's clock so a benchmark can read the workload's progress
/// over windows of one run (bench/coordinated-overhead, `MODE=windows`).
pub fn run_duty_progress(
    duration: Duration,
    threads: usize,
    duty_pct: f64,
    every: Duration,
    mut report: impl FnMut(u64),
) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let start = Instant::now();
    let deadline = start + duration;
    let busy = DUTY_PERIOD.mul_f64((duty_pct / 100.0).clamp(0.0, 1.0));
    let count = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let c = Arc::clone(&count);
            std::thread::spawn(move || worker(start, deadline, busy, Some(&c)))
        })
        .collect();
    // The calling thread reports (it sleeps between reports).
    let mut next = start + every;
    while !handles.iter().all(std::thread::JoinHandle::is_finished) {
        let now = Instant::now();
        if now >= next {
            report(count.load(Ordering::Relaxed));
            next += every;
        } else {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
        }
    }
    let total = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    report(count.load(Ordering::Relaxed));
    total
}

/// One thread of the mix; the frame `worker` is the demo functions' caller.
/// Works while the clock is in the first `busy` of its period (measured
/// from `start`), sleeps to the next period otherwise. With `count`, each
/// round is also added to it (a relaxed atomic add per round of about
/// 0.4 ms), so one frame name serves both the plain and the counted mix.
#[inline(never)]
fn worker(
    start: Instant,
    deadline: Instant,
    busy: Duration,
    count: Option<&std::sync::atomic::AtomicU64>,
) -> u64 {
    let mut rounds = 0u64;
    let mut acc = 0u64;
    // Round lengths: the same sequence on every run.
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let always = busy >= DUTY_PERIOD;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        if !always {
            let period = DUTY_PERIOD.as_nanos();
            let into = now.duration_since(start).as_nanos() % period;
            if into >= busy.as_nanos() {
                let rest = Duration::from_nanos((period - into) as u64);
                std::thread::sleep(rest.min(deadline - now));
                continue;
            }
        }
        // Each round's length varies at random (0.5 to 1.5 times the mean,
        // the same for the three functions, so their 5:3:2 holds in every
        // round): a round of fixed length (about 0.4 ms) can lock in phase
        // with a profiler's sampling clock (1 ms at 999 Hz), and then the
        // samples of a whole run fall on the same parts of the round. Two
        // profilers sampling one run at once measured 45.8 and 53.9 % for
        // alpha that way.
        let units = UNIT * rng.u64(4..=12) / 8;
        acc = acc.wrapping_add(vmscope_demo_alpha(acc, units));
        acc = acc.wrapping_add(vmscope_demo_beta(acc, units));
        acc = acc.wrapping_add(vmscope_demo_gamma(acc, units));
        rounds += 1;
        if let Some(c) = count {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::hint::black_box(acc);
    rounds
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    /// One test at a time: the duty-cycle test reads the process's CPU time.
    static ONE: Mutex<()> = Mutex::new(());

    #[test]
    fn runs_and_counts_rounds() {
        let _one = ONE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = super::run(std::time::Duration::from_millis(50), 2);
        assert!(n > 0);
    }

    #[test]
    fn progress_reports_grow_and_end_at_the_total() {
        let _one = ONE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut seen = Vec::new();
        let n = super::run_duty_progress(
            Duration::from_millis(300),
            2,
            100.0,
            Duration::from_millis(50),
            |r| seen.push(r),
        );
        assert!(n > 0);
        assert!(seen.len() >= 3, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        assert_eq!(*seen.last().unwrap(), n);
    }

    /// A duty cycle sleeps between bursts: over 1 s at 30 % the thread's
    /// own CPU time (getrusage, not the clock) stays below 45 % of the run
    /// (a busy machine lends it less than it asks for, never more), and
    /// 0 % does no round at all. The lab test `coordinated.rs` checks the
    /// load in a guest against pidstat.
    #[test]
    fn a_duty_cycle_sleeps_between_bursts() {
        let _one = ONE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert_eq!(super::run_duty(Duration::from_millis(300), 1, 0.0), 0);
        let cpu = || {
            // SAFETY: getrusage fills the struct it is given.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut u) };
            let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
            t(u.ru_utime) + t(u.ru_stime)
        };
        let (c0, t0) = (cpu(), std::time::Instant::now());
        let n = super::run_duty(Duration::from_secs(1), 1, 30.0);
        let share = (cpu() - c0) / t0.elapsed().as_secs_f64();
        assert!(n > 0);
        assert!(share < 0.45, "30 % duty used {share:.2} of a CPU");
    }
}
