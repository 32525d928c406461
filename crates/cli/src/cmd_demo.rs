//! `vmscope demo`: a built-in CPU workload with three functions that take
//! 50 %, 30 % and 20 % of its CPU time, to check profiles against a known
//! answer (and against perf). The functions are unmangled so every
//! symbolizer names them alike.

use clap::Args;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Run for this many seconds.
    #[arg(short = 'd', long = "seconds", default_value_t = 5.0)]
    pub seconds: f64,
    /// Worker threads, each running the same mix.
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: usize,
}

/// Work units per call; one unit is a short dependent arithmetic chain.
const UNIT: u64 = 20_000;

#[inline(always)]
fn spin(iters: u64, seed: u64) -> u64 {
    // A plain while loop (no iterator calls), so that even an unoptimized
    // build keeps every sample inside the calling demo function.
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

#[inline(never)]
fn worker(deadline: Instant) -> u64 {
    let mut acc = 0u64;
    while Instant::now() < deadline {
        acc = acc.wrapping_add(vmscope_demo_alpha(acc));
        acc = acc.wrapping_add(vmscope_demo_beta(acc));
        acc = acc.wrapping_add(vmscope_demo_gamma(acc));
    }
    acc
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        anyhow::bail!("--seconds must be a positive number, not {}", args.seconds);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let handles: Vec<_> = (0..args.threads.max(1))
        .map(|_| std::thread::spawn(move || worker(deadline)))
        .collect();
    let mut acc = 0u64;
    for h in handles {
        acc ^= h.join().unwrap_or(0);
    }
    std::hint::black_box(acc);
    Ok(ExitCode::SUCCESS)
}
