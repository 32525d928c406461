//! What one sampling interrupt costs the CPU it lands on, measured by the
//! profiler itself at the start of a session ([`calibrate`]).
//!
//! A kernel built without `CONFIG_IRQ_TIME_ACCOUNTING` (Debian's cloud
//! kernels, the lab's guest kernel, this project's CI host) keeps no
//! interrupt time: `/proc/stat`'s irq column stays 0, and the time a
//! sampling interrupt takes is charged to whatever task it interrupted. So
//! [`crate::selfcost::SelfCost`] cannot read it, and under TCG, where the
//! guest's sampling interrupts are emulated in software, that time is most
//! of what profiling costs a guest.
//!
//! The calibration measures it from the kernel's own accounting of the
//! calling thread: a fixed unit of work is timed on the thread's CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`) with sampling off, then with the session's
//! events sampling this process at a known rate; the thread's CPU time
//! beyond what the work took without sampling, over the samples taken on
//! the thread, is the cost of one sample (interrupt entry and exit, the
//! perf handler, the call chain, the ring write, and under emulation the
//! emulator's delivery). Where the kernel does account interrupt time, it
//! is not in the thread's CPU time, the estimate comes out near 0, and the
//! irq column carries the cost instead: the two never count it twice.
//!
//! Each unit is timed on its own, so a unit the hypervisor (or, under
//! emulation, the host) descheduled for milliseconds is left out rather
//! than charged to sampling ([`PREEMPTED`]); off and on windows alternate
//! ([`PAIRS`] of each) and the median of the per-pair estimates is kept. The unit of work runs a
//! shallow stack, so a deep call chain in real code costs somewhat more
//! per sample than measured here.

use std::time::{Duration, Instant};

use vmscope_model::{EventSpec, Record, SampleRate};

use crate::selfcost::thread_cpu_s;
use crate::{LinuxError, Recorder, RingOptions, Target};

/// Off/on window pairs measured.
pub const PAIRS: usize = 3;
/// Thread CPU time of each window.
pub const WINDOW: Duration = Duration::from_millis(30);
/// Sampling rates of the calibration, Hz: the session's rate within these
/// bounds (and under the kernel's `perf_event_max_sample_rate`), so each
/// window holds tens of samples. The cost of a sample may depend on the
/// rate (timer emulation, the kernel's throttling of fast samplers), so it
/// is measured near the rate used.
pub const MIN_CALIBRATION_HZ: u64 = 1000;
pub const MAX_CALIBRATION_HZ: u64 = 4000;
/// Wall time the calibration may take before it gives up (an overloaded
/// CPU that gives the thread little time).
pub const MAX_WALL: Duration = Duration::from_secs(3);

/// What [`calibrate`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleCost {
    /// CPU seconds one sample costs the CPU it lands on (median of the
    /// pairs, at least 0).
    pub per_sample_s: f64,
    /// Samples taken on the calling thread during the on windows.
    pub samples: u64,
    /// The rate the calibration sampled at, Hz.
    pub hz: u64,
    /// CPU seconds the calibration itself took (the calling thread).
    pub cpu_s: f64,
}

/// One unit of work: a few thousand dependent multiply-adds (a few µs
/// natively, tens under emulation).
#[inline(never)]
fn unit(seed: u64) -> u64 {
    let mut x = seed;
    for _ in 0..4000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
    }
    std::hint::black_box(x)
}

/// A unit that took longer than its usual time by more than this was
/// descheduled by what is below the thread's kernel (under emulation the
/// host preempts the vCPU thread for milliseconds, and the guest charges
/// that time to whatever it was running), not interrupted by a sample: it
/// is left out. A sampling interrupt costs tens of µs natively and a few
/// hundred under TCG.
const PREEMPTED: f64 = 2e-3;

/// Runs units until the thread has used `window` of CPU; each unit's time
/// on the thread's CPU clock. `None` past `deadline`.
fn spin(window: Duration, deadline: Instant) -> Option<Vec<f64>> {
    let goal = window.as_secs_f64();
    let start = thread_cpu_s();
    let mut times = Vec::with_capacity(1024);
    let mut x = 0u64;
    let mut t = start;
    loop {
        x = unit(x);
        let now = thread_cpu_s();
        times.push(now - t);
        t = now;
        if now - start >= goal {
            std::hint::black_box(x);
            return Some(times);
        }
        if times.len() % 64 == 0 && Instant::now() > deadline {
            return None;
        }
    }
}

/// A unit's usual time: the 20th percentile of a window without sampling.
fn usual(times: &[f64]) -> f64 {
    let mut v = times.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 5).copied().unwrap_or(0.0)
}

/// One pair's estimate of a sample's cost. A sample lands in one unit
/// (units are far shorter than the time between samples) and makes it
/// longer by what the sample cost, so with `samples` samples taken in the
/// on window, the `samples` units that ran longest beyond the usual time
/// (of the off window) are the sampled ones, and the median of their excess
/// is the cost of one sample. Preempted units are left out first. The
/// median keeps the other interrupts (the timer tick) that land among them
/// from deciding it.
fn per_sample(off: &[f64], on: &[f64], samples: u64) -> Option<f64> {
    if samples == 0 || off.is_empty() {
        return None;
    }
    let base = usual(off);
    let mut x: Vec<f64> = on
        .iter()
        .map(|t| t - base)
        .filter(|e| *e < PREEMPTED)
        .collect();
    x.sort_by(|a, b| b.total_cmp(a));
    let k = (samples as usize).min(x.len());
    if k == 0 {
        return None;
    }
    Some(x[k / 2].max(0.0))
}

/// The session's frequency events at the calibration rate (events with a
/// fixed period are left out: their rate is not the session's to set).
fn calibration_events(events: &[EventSpec], hz: u64) -> Vec<EventSpec> {
    events
        .iter()
        .filter(|e| matches!(e.rate, SampleRate::Frequency(_)))
        .map(|e| EventSpec {
            kind: e.kind,
            rate: SampleRate::Frequency(hz),
        })
        .collect()
}

/// Measures what one sample of `events` (with call chains when
/// `callchain`) costs, on the calling thread. `Ok(None)` when no event
/// samples at a frequency or the CPU was too busy to measure within
/// [`MAX_WALL`].
pub fn calibrate(events: &[EventSpec], callchain: bool) -> Result<Option<SampleCost>, LinuxError> {
    let asked = events
        .iter()
        .find_map(|e| match e.rate {
            SampleRate::Frequency(f) => Some(f),
            SampleRate::Period(_) => None,
        })
        .unwrap_or(0);
    let hz = asked.clamp(MIN_CALIBRATION_HZ, MAX_CALIBRATION_HZ);
    let hz = crate::sys::perf_event_max_sample_rate().map_or(hz, |m| hz.min(m.max(1)));
    let events = calibration_events(events, hz);
    if events.is_empty() {
        return Ok(None);
    }
    let cpu0 = thread_cpu_s();
    // SAFETY: getpid and gettid cannot fail.
    let (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
    let mut rec = Recorder::open(&RingOptions {
        events,
        target: Target::Pids(vec![pid]),
        callchain,
        ring_pages: 0,
    })?;
    let deadline = Instant::now() + MAX_WALL;
    let mut estimates = Vec::with_capacity(PAIRS);
    let mut samples_total = 0u64;
    let mut buf = Vec::new();
    // A first, unmeasured window warms caches and the CPU's clock.
    if spin(WINDOW / 2, deadline).is_none() {
        return Ok(None);
    }
    for _ in 0..PAIRS {
        let Some(off) = spin(WINDOW, deadline) else {
            return Ok(None);
        };
        rec.enable()?;
        let on = spin(WINDOW, deadline);
        rec.disable()?;
        let Some(on) = on else {
            return Ok(None);
        };
        buf.clear();
        rec.read(Duration::ZERO, &mut buf)?;
        let samples = buf
            .iter()
            .filter(|r| matches!(r, Record::Sample(s) if s.tid == tid))
            .count() as u64;
        samples_total += samples;
        estimates.extend(per_sample(&off, &on, samples));
    }
    if estimates.is_empty() {
        return Ok(None);
    }
    estimates.sort_by(f64::total_cmp);
    let per_sample_s = estimates[estimates.len() / 2].max(0.0);
    Ok(Some(SampleCost {
        per_sample_s,
        samples: samples_total,
        hz,
        cpu_s: thread_cpu_s() - cpu0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_model::EventKind;

    #[test]
    fn only_frequency_events_are_calibrated_at_the_calibration_rate() {
        let ev = [
            EventSpec {
                kind: EventKind::CpuClock,
                rate: SampleRate::Frequency(99),
            },
            EventSpec {
                kind: EventKind::TaskClock,
                rate: SampleRate::Period(100_000),
            },
        ];
        let c = calibration_events(&ev, 4000);
        assert_eq!(
            c,
            [EventSpec {
                kind: EventKind::CpuClock,
                rate: SampleRate::Frequency(4000),
            }]
        );
        assert!(calibration_events(&ev[1..], 4000).is_empty());
    }

    #[test]
    fn the_thread_clock_counts_this_threads_work_only() {
        let t = thread_cpu_s();
        let w = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        let slept = thread_cpu_s() - t;
        assert!(slept < 0.02, "sleeping used {slept} s of CPU");
        let times = spin(Duration::from_millis(30), w + Duration::from_secs(10)).unwrap();
        let used: f64 = times.iter().sum();
        assert!(
            !times.is_empty() && used >= 0.03,
            "{} units in {used} s",
            times.len()
        );
    }

    #[test]
    fn interrupted_units_count_and_preempted_ones_do_not() {
        // Units of 10 µs with 1 µs of jitter; with sampling, 5 of 100 units
        // took 100 µs more (5 samples), one 30 µs more (a timer tick), and
        // one was preempted for 5 ms.
        let off: Vec<f64> = (0..100).map(|i| 10e-6 + f64::from(i % 2) * 1e-6).collect();
        let mut on = off.clone();
        for u in on.iter_mut().take(5) {
            *u += 100e-6;
        }
        on[50] += 5e-3;
        on[60] += 30e-6;
        let c = per_sample(&off, &on, 5).unwrap();
        assert!((c - 100e-6).abs() < 2e-6, "{c}");
        // A preemption in the off window alone changes nothing either.
        let mut off2 = off.clone();
        off2[7] += 5e-3;
        let c = per_sample(&off2, &on, 5).unwrap();
        assert!((c - 100e-6).abs() < 2e-6, "{c}");
        assert_eq!(per_sample(&off, &on, 0), None);
    }

    /// A live calibration where perf events can be opened: samples were
    /// taken on this thread, and one costs something but far less than a
    /// window (a sample cannot cost more than the time between samples).
    #[test]
    fn calibrating_a_cpu_clock_on_this_machine() {
        let ev = [EventSpec {
            kind: EventKind::CpuClock,
            rate: SampleRate::Frequency(1000),
        }];
        match calibrate(&ev, true) {
            Ok(Some(c)) => {
                eprintln!("calibrated: {c:?}");
                assert!(c.samples >= 10, "{c:?}");
                assert!(c.per_sample_s < 1.0 / c.hz as f64, "{c:?}");
                assert!(c.cpu_s >= 3.0 * WINDOW.as_secs_f64(), "{c:?}");
            }
            Ok(None) => panic!("the CPU was too busy to calibrate within {MAX_WALL:?}"),
            Err(LinuxError::PermissionDenied { .. }) => {
                eprintln!("SKIP: perf events are not allowed here (perf_event_paranoid)");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
