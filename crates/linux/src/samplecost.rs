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
//!
//! A calibration spins one CPU for about 0.2 s, which is itself 1 % of a
//! 10 s recording on two CPUs and, on a host whose CPUs the guests keep
//! busy, comes out of the guests' time. [`calibrate_or_reuse`] therefore
//! keeps each result for [`REUSE_FOR`], in the process (the long-lived
//! guest agent, `serve`) and in a small file under `/run` (one `record`
//! after another), keyed by boot, events, rate and call chains; the
//! profiler counts a fresh calibration's CPU as its own cost.

use std::path::Path;
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
    /// CPU seconds the calibration itself took (the calling thread); 0
    /// when an earlier calibration was reused.
    pub cpu_s: f64,
    /// Seconds since the calibration that was reused, `None` when it was
    /// measured now.
    pub reused_after_s: Option<f64>,
}

impl SampleCost {
    /// Where the figure came from: measured now (and what that took), or
    /// reused from a recent calibration.
    pub fn source(&self) -> String {
        match self.reused_after_s {
            Some(age) => format!(
                "calibrated {age:.0} s earlier on {} samples at {} Hz, reused",
                self.samples, self.hz
            ),
            None => format!(
                "calibrated on {} samples at {} Hz, which took {:.0} ms of CPU",
                self.samples,
                self.hz,
                self.cpu_s * 1e3
            ),
        }
    }
}

/// How long a calibration is reused: what a sample costs moves with the
/// host's load and the emulator's state, so not longer than a few minutes.
pub const REUSE_FOR: Duration = Duration::from_secs(600);

/// Where calibrations are kept between processes: a tmpfs, emptied at
/// boot (the boot id in each key guards the rest).
pub const REUSE_FILE: &str = "/run/vmscope/sample-cost.json";

/// One kept calibration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Kept {
    key: String,
    /// When it was measured, seconds since the epoch.
    at_unix_s: f64,
    per_sample_s: f64,
    samples: u64,
    hz: u64,
}

/// Calibrations made by this process.
static KEPT: std::sync::Mutex<Vec<Kept>> = std::sync::Mutex::new(Vec::new());

fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What a calibration is kept under: this boot, the events at the
/// calibration rate, and whether samples carry call chains.
fn reuse_key(events: &[EventSpec], callchain: bool, hz: u64) -> String {
    let boot = crate::sys::boot_id();
    let names: Vec<String> = calibration_events(events, hz)
        .iter()
        .map(|e| e.kind.name())
        .collect();
    format!("{boot} {}@{hz}Hz g={callchain}", names.join(","))
}

/// The newest of `kept` under `key` measured less than `max_age` ago.
fn fresh(kept: &[Kept], key: &str, now_s: f64, max_age: Duration) -> Option<Kept> {
    kept.iter()
        .filter(|k| k.key == key)
        .filter(|k| now_s >= k.at_unix_s && now_s - k.at_unix_s < max_age.as_secs_f64())
        .max_by(|a, b| a.at_unix_s.total_cmp(&b.at_unix_s))
        .cloned()
}

/// The calibrations in `file` (none if it is missing or unreadable: it is
/// only a cache).
fn read_kept(file: &Path) -> Vec<Kept> {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Add `k` to `file`, dropping entries past [`REUSE_FOR`]; written to a
/// temporary file and renamed, so a concurrent reader sees the old or the
/// new list. Best effort: a cache that cannot be written is not an error.
fn write_kept(file: &Path, k: &Kept) {
    let now = unix_now_s();
    let mut all: Vec<Kept> = read_kept(file)
        .into_iter()
        .filter(|o| o.key != k.key && now - o.at_unix_s < REUSE_FOR.as_secs_f64())
        .collect();
    all.push(k.clone());
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(".sample-cost.{}", std::process::id()));
    let Ok(text) = serde_json::to_vec(&all) else {
        return;
    };
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// [`calibrate`], unless a calibration of the same events on this boot
/// was made less than [`REUSE_FOR`] ago by this process or (with `file`,
/// normally [`REUSE_FILE`]) by another: that one is returned with
/// `reused_after_s` set and `cpu_s` 0. A fresh result is kept for the
/// next session.
pub fn calibrate_or_reuse(
    events: &[EventSpec],
    callchain: bool,
    file: Option<&Path>,
) -> Result<Option<SampleCost>, LinuxError> {
    let hz = calibration_hz(events);
    let key = reuse_key(events, callchain, hz);
    let now = unix_now_s();
    let mine = KEPT
        .lock()
        .map(|k| fresh(&k, &key, now, REUSE_FOR))
        .ok()
        .flatten();
    let kept = mine.or_else(|| file.and_then(|f| fresh(&read_kept(f), &key, now, REUSE_FOR)));
    if let Some(k) = kept {
        return Ok(Some(SampleCost {
            per_sample_s: k.per_sample_s,
            samples: k.samples,
            hz: k.hz,
            cpu_s: 0.0,
            reused_after_s: Some(now - k.at_unix_s),
        }));
    }
    let c = calibrate(events, callchain)?;
    if let Some(c) = &c {
        let k = Kept {
            key,
            at_unix_s: now,
            per_sample_s: c.per_sample_s,
            samples: c.samples,
            hz: c.hz,
        };
        if let Ok(mut all) = KEPT.lock() {
            all.retain(|o| o.key != k.key);
            all.push(k.clone());
        }
        if let Some(f) = file {
            write_kept(f, &k);
        }
    }
    Ok(c)
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

/// The rate a calibration of `events` samples at: the session's within
/// [`MIN_CALIBRATION_HZ`]..[`MAX_CALIBRATION_HZ`] and the kernel's limit.
fn calibration_hz(events: &[EventSpec]) -> u64 {
    let asked = events
        .iter()
        .find_map(|e| match e.rate {
            SampleRate::Frequency(f) => Some(f),
            SampleRate::Period(_) => None,
        })
        .unwrap_or(0);
    let hz = asked.clamp(MIN_CALIBRATION_HZ, MAX_CALIBRATION_HZ);
    crate::sys::perf_event_max_sample_rate().map_or(hz, |m| hz.min(m.max(1)))
}

/// Measures what one sample of `events` (with call chains when
/// `callchain`) costs, on the calling thread. `Ok(None)` when no event
/// samples at a frequency or the CPU was too busy to measure within
/// [`MAX_WALL`].
pub fn calibrate(events: &[EventSpec], callchain: bool) -> Result<Option<SampleCost>, LinuxError> {
    let hz = calibration_hz(events);
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
        reused_after_s: None,
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
    fn kept(key: &str, at: f64, per_sample_s: f64) -> Kept {
        Kept {
            key: key.into(),
            at_unix_s: at,
            per_sample_s,
            samples: 30,
            hz: 1000,
        }
    }

    #[test]
    fn a_kept_calibration_is_reused_for_its_key_and_while_fresh_only() {
        let all = [
            kept("boot1 cpu-clock@1000Hz g=true", 1000.0, 1e-5),
            kept("boot1 cpu-clock@1000Hz g=true", 1300.0, 2e-5),
            kept("boot1 cpu-clock@1000Hz g=false", 1400.0, 3e-5),
            kept("boot0 cpu-clock@1000Hz g=true", 1400.0, 4e-5),
        ];
        let key = "boot1 cpu-clock@1000Hz g=true";
        // The newest under the key.
        let f = fresh(&all, key, 1400.0, REUSE_FOR).unwrap();
        assert_eq!(f.per_sample_s, 2e-5);
        // Both too old.
        assert_eq!(fresh(&all, key, 1300.0 + 600.0, REUSE_FOR), None);
        // One from the future (a clock set back) is not trusted.
        assert_eq!(fresh(&all[1..2], key, 1200.0, REUSE_FOR), None);
        assert_eq!(
            fresh(&all, "boot2 cpu-clock@1000Hz g=true", 1400.0, REUSE_FOR),
            None
        );
    }

    #[test]
    fn kept_calibrations_survive_in_their_file_and_garbage_is_no_cache() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("run/sample-cost.json");
        assert!(read_kept(&file).is_empty());
        let now = unix_now_s();
        write_kept(&file, &kept("a", now - 1.0, 1e-5));
        write_kept(&file, &kept("b", now - 2.0, 2e-5));
        // A newer calibration under a key replaces the older one.
        write_kept(&file, &kept("a", now, 3e-5));
        let mut all = read_kept(&file);
        all.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].per_sample_s, 3e-5);
        assert_eq!(all[1].per_sample_s, 2e-5);
        std::fs::write(&file, b"{not json").unwrap();
        assert!(read_kept(&file).is_empty());
        write_kept(&file, &kept("c", now, 5e-5));
        assert_eq!(read_kept(&file).len(), 1);
    }

    #[test]
    fn a_second_session_reuses_the_first_ones_calibration() {
        let ev = [EventSpec {
            kind: EventKind::CpuClock,
            rate: SampleRate::Frequency(1000),
        }];
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sample-cost.json");
        let first = match calibrate_or_reuse(&ev, false, Some(&file)) {
            Ok(Some(c)) => c,
            Ok(None) => panic!("the CPU was too busy to calibrate within {MAX_WALL:?}"),
            Err(LinuxError::PermissionDenied { .. }) => {
                eprintln!("SKIP: perf events are not allowed here (perf_event_paranoid)");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        // Another test in this process may have calibrated these events
        // already; either way the second call measures nothing.
        let second = calibrate_or_reuse(&ev, false, Some(&file))
            .unwrap()
            .unwrap();
        assert_eq!(second.per_sample_s, first.per_sample_s);
        assert_eq!(second.cpu_s, 0.0);
        assert!(second.reused_after_s.is_some(), "{second:?}");
        assert!(second.source().contains("reused"), "{}", second.source());
        // Another process finds it in the file.
        KEPT.lock().unwrap().clear();
        let third = calibrate_or_reuse(&ev, false, Some(&file))
            .unwrap()
            .unwrap();
        assert_eq!(third.per_sample_s, first.per_sample_s);
        assert_eq!(third.cpu_s, 0.0);
    }

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
