//! The workloads of `vmscope bench scale` (theurer2006 §2, §4.1.3), the same
//! code on the host and inside guests (`vmscope-agent scale`):
//!
//! - **memwrite**: theurer's memwrite: each thread allocates a buffer
//!   (faulted in before the clock starts) and writes a value across all of
//!   it, pass after pass; the work done is bytes written;
//! - **cpu**: a dependent integer chain in registers (the demo's inner
//!   loop), no memory traffic; the work done is loop iterations.
//!
//! `threads` workers run at once for `seconds`; a run reports the work of
//! each and in all, the wall time and the process's CPU time.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Which workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    MemWrite,
    Cpu,
}

impl Workload {
    pub const ALL: [Workload; 2] = [Workload::MemWrite, Workload::Cpu];

    pub fn name(self) -> &'static str {
        match self {
            Workload::MemWrite => "memwrite",
            Workload::Cpu => "cpu",
        }
    }

    pub fn parse(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }

    /// The unit of [`ScaleRun::work`]: `bytes` or `iterations`.
    pub fn work_unit(self) -> &'static str {
        match self {
            Workload::MemWrite => "bytes",
            Workload::Cpu => "iterations",
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Default buffer per memwrite thread.
pub const DEFAULT_BUFFER: u64 = 32 << 20;
/// Largest buffer per thread.
pub const MAX_BUFFER: u64 = 16 << 30;
/// Most threads of one run.
pub const MAX_THREADS: usize = 1024;

/// One run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleSpec {
    pub workload: Workload,
    pub threads: usize,
    pub duration: Duration,
    /// memwrite: bytes per thread.
    pub buffer: u64,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleRun {
    pub workload: Workload,
    pub threads: usize,
    /// Work units per thread (bytes written, or iterations).
    pub per_thread: Vec<u64>,
    /// All threads' work.
    pub work: u64,
    /// From the start signal to the last thread's end, seconds.
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    pub buffer: u64,
}

impl ScaleRun {
    /// Work per second.
    pub fn rate(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.work as f64 / self.wall_s
        } else {
            0.0
        }
    }
}

/// Runs `spec`: `threads` workers for `duration`, started together.
pub fn run(spec: &ScaleSpec) -> Result<ScaleRun, String> {
    if spec.threads == 0 || spec.threads > MAX_THREADS {
        return Err(format!(
            "threads wants 1 to {MAX_THREADS}, not {}",
            spec.threads
        ));
    }
    if spec.workload == Workload::MemWrite && !(4096..=MAX_BUFFER).contains(&spec.buffer) {
        return Err(format!(
            "the memwrite buffer wants 4 KiB to 16 GiB per thread, not {} bytes",
            spec.buffer
        ));
    }
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(spec.threads + 1));
    let start = std::sync::Arc::new(std::sync::OnceLock::<Instant>::new());
    let handles: Vec<_> = (0..spec.threads)
        .map(|i| {
            let barrier = std::sync::Arc::clone(&barrier);
            let start = std::sync::Arc::clone(&start);
            let s = *spec;
            std::thread::spawn(move || -> Result<(u64, Instant), String> {
                let mut buf = match s.workload {
                    Workload::MemWrite => {
                        let mut v: Vec<u8> = Vec::new();
                        v.try_reserve_exact(s.buffer as usize).map_err(|e| {
                            format!("cannot allocate {} bytes for thread {i}: {e}", s.buffer)
                        })?;
                        v.resize(s.buffer as usize, 0);
                        // Fault every page in before the clock starts.
                        std::hint::black_box(&mut v);
                        v
                    }
                    Workload::Cpu => Vec::new(),
                };
                barrier.wait();
                let t0 = *start.get_or_init(Instant::now);
                let end = t0 + s.duration;
                let work = match s.workload {
                    Workload::MemWrite => memwrite(&mut buf, end),
                    Workload::Cpu => cpu(end, i as u64),
                };
                Ok((work, Instant::now()))
            })
        })
        .collect();
    let (u0, s0) = crate::net::process_cpu();
    barrier.wait();
    let mut per_thread = Vec::new();
    let mut last = None::<Instant>;
    let mut err = None;
    for h in handles {
        match h.join() {
            Ok(Ok((w, t))) => {
                per_thread.push(w);
                last = Some(last.map_or(t, |l| l.max(t)));
            }
            Ok(Err(e)) => {
                err.get_or_insert(e);
            }
            Err(_) => {
                err.get_or_insert("a worker thread panicked".into());
            }
        }
    }
    if let Some(e) = err {
        return Err(e);
    }
    let (u1, s1) = crate::net::process_cpu();
    let t0 = start.get().copied().unwrap_or_else(Instant::now);
    Ok(ScaleRun {
        workload: spec.workload,
        threads: spec.threads,
        work: per_thread.iter().sum(),
        per_thread,
        wall_s: last.map_or(0.0, |l| l.duration_since(t0).as_secs_f64()),
        user_s: u1 - u0,
        sys_s: s1 - s0,
        buffer: if spec.workload == Workload::MemWrite {
            spec.buffer
        } else {
            0
        },
    })
}

/// Slice written between two looks at the clock.
const CHUNK: usize = 1 << 20;

/// Writes a value over the whole buffer, pass after pass, until `end`;
/// returns the bytes written.
#[inline(never)]
fn memwrite(buf: &mut [u8], end: Instant) -> u64 {
    let mut written = 0u64;
    let mut value = 1u8;
    loop {
        for chunk in buf.chunks_mut(CHUNK) {
            chunk.fill(value);
            std::hint::black_box(&mut *chunk);
            written += chunk.len() as u64;
            if Instant::now() >= end {
                return written;
            }
        }
        value = value.wrapping_add(1);
    }
}

/// Iterations between two looks at the clock.
const CPU_BATCH: u64 = 100_000;

/// A dependent integer chain (no memory traffic) until `end`; returns the
/// iterations done.
#[inline(never)]
fn cpu(end: Instant, seed: u64) -> u64 {
    let mut x = seed | 1;
    let mut done = 0u64;
    while Instant::now() < end {
        let mut i = 0u64;
        while i < CPU_BATCH {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            x ^= x >> 29;
            i += 1;
        }
        std::hint::black_box(x);
        done += CPU_BATCH;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_workloads_count_their_work_per_thread() {
        for w in Workload::ALL {
            let r = run(&ScaleSpec {
                workload: w,
                threads: 2,
                duration: Duration::from_millis(150),
                buffer: 4 << 20,
            })
            .unwrap();
            assert_eq!(r.per_thread.len(), 2);
            assert!(r.per_thread.iter().all(|&x| x > 0), "{r:?}");
            assert_eq!(r.work, r.per_thread.iter().sum::<u64>());
            assert!(r.wall_s >= 0.15 && r.wall_s < 5.0, "{r:?}");
            assert!(r.rate() > 0.0);
            if w == Workload::MemWrite {
                assert_eq!(r.work % CHUNK as u64, 0, "whole chunks: {r:?}");
            }
        }
        assert_eq!(Workload::parse("memwrite"), Some(Workload::MemWrite));
        assert_eq!(Workload::parse("x"), None);
    }

    #[test]
    fn bad_specs_are_refused() {
        let s = ScaleSpec {
            workload: Workload::MemWrite,
            threads: 0,
            duration: Duration::from_millis(1),
            buffer: 1 << 20,
        };
        assert!(run(&s).unwrap_err().contains("threads"));
        let s = ScaleSpec {
            threads: 1,
            buffer: 10,
            ..s
        };
        assert!(run(&s).unwrap_err().contains("buffer"));
    }
}
