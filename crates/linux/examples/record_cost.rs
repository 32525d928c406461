//! Records system-wide with call chains (like `perf record -a -g -F HZ`) for
//! a number of seconds and prints what was collected and the CPU time the
//! recorder spent, for comparison with perf.
//!
//! `cargo run --release -p vmscope-linux --example record_cost -- [SECONDS] [HZ]`

use std::time::{Duration, Instant};
use vmscope_linux::{Recorder, RingOptions, Target};
use vmscope_model::{EventKind, EventSpec, Record, SampleRate};

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let hz: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(4000);
    let opts = RingOptions {
        events: vec![EventSpec {
            kind: EventKind::CpuClock,
            rate: SampleRate::Frequency(hz),
        }],
        target: Target::AllCpus,
        callchain: true,
        ring_pages: 0,
    };
    let mut rec = Recorder::open(&opts)?;
    let cpu0 = cpu_time();
    let start = Instant::now();
    rec.enable()?;
    let mut out = Vec::new();
    let (mut samples, mut frames, mut other) = (0u64, 0u64, 0u64);
    while start.elapsed() < Duration::from_secs(secs) {
        rec.read(Duration::from_millis(100), &mut out)?;
        for r in out.drain(..) {
            match r {
                Record::Sample(s) => {
                    samples += 1;
                    frames += s.callchain.len() as u64;
                }
                _ => other += 1,
            }
        }
    }
    rec.disable()?;
    rec.read(Duration::ZERO, &mut out)?;
    samples += out
        .iter()
        .filter(|r| matches!(r, Record::Sample(_)))
        .count() as u64;
    let wall = start.elapsed();
    let cpu = cpu_time() - cpu0;
    println!(
        "{secs} s at {hz} Hz on {} CPUs: {samples} samples ({frames} frames), {other} side-band, {} lost; recorder CPU {:.3} s = {:.2} % of one CPU",
        rec.cpus().len(),
        rec.lost(),
        cpu.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
    Ok(())
}
