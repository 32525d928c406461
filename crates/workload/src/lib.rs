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
pub fn vmscope_demo_alpha(seed: u64) -> u64 {
    spin(5 * UNIT, seed)
}

/// 30 % of the demo's CPU.
#[no_mangle]
#[inline(never)]
pub fn vmscope_demo_beta(seed: u64) -> u64 {
    spin(3 * UNIT, seed)
}

/// 20 % of the demo's CPU.
#[no_mangle]
#[inline(never)]
pub fn vmscope_demo_gamma(seed: u64) -> u64 {
    spin(2 * UNIT, seed)
}

/// Names of the three functions and their expected shares (percent).
pub const EXPECTED: [(&str, f64); 3] = [
    ("vmscope_demo_alpha", 50.0),
    ("vmscope_demo_beta", 30.0),
    ("vmscope_demo_gamma", 20.0),
];

/// Run the mix on `threads` threads for `duration`; returns the rounds done
/// (one round = one call of each function), a throughput figure for
/// overhead measurements.
pub fn run(duration: Duration, threads: usize) -> u64 {
    let deadline = Instant::now() + duration;
    let handles: Vec<_> = (0..threads.max(1))
        .map(|_| std::thread::spawn(move || worker(deadline)))
        .collect();
    handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
}

/// One thread of the mix; the frame `worker` is the demo functions' caller.
#[inline(never)]
fn worker(deadline: Instant) -> u64 {
    let mut rounds = 0u64;
    let mut acc = 0u64;
    while Instant::now() < deadline {
        acc = acc.wrapping_add(vmscope_demo_alpha(acc));
        acc = acc.wrapping_add(vmscope_demo_beta(acc));
        acc = acc.wrapping_add(vmscope_demo_gamma(acc));
        rounds += 1;
    }
    std::hint::black_box(acc);
    rounds
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_and_counts_rounds() {
        let n = super::run(std::time::Duration::from_millis(50), 2);
        assert!(n > 0);
    }
}
