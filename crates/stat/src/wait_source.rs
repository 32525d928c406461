//! Where the waited-behind split comes from: the eBPF programs, which sum
//! each followed thread's waits in the kernel with the kernel's own clock
//! (`vmscope_bpf::waits`: exact to `run_delay`, and cheap: nothing per
//! switch reaches user space), or, where they cannot load (unprivileged,
//! locked down, no BTF), the scheduler tracepoints' rings replayed by the
//! pure timeline of [`crate::wait`]. Both give the same
//! [`ThreadWait`]s per interval; the header says which ran and why the
//! other did not.

use crate::wait::{Culprit, ThreadWait, WaitTimeline};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use vmscope_linux::TaskComm;

/// Which source to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitChoice {
    /// No split: `steal` alone.
    Off,
    /// The eBPF programs, else the tracepoint rings.
    #[default]
    Auto,
    /// The eBPF programs only (an error when they cannot load).
    Bpf,
    /// The tracepoint rings only.
    Tracepoints,
}

impl WaitChoice {
    /// `--wait-source` values.
    pub fn parse(s: &str) -> Option<WaitChoice> {
        Some(match s {
            "auto" => WaitChoice::Auto,
            "bpf" => WaitChoice::Bpf,
            "tracepoints" => WaitChoice::Tracepoints,
            "off" => WaitChoice::Off,
            _ => return None,
        })
    }
}

/// The tracepoint rings and the timeline they feed.
pub struct RingWaits {
    recorder: vmscope_linux::SchedEventRecorder,
    timeline: Arc<Mutex<WaitTimeline>>,
    lost: u64,
    dropped: u64,
    anomalies: crate::wait::WaitAnomalies,
}

impl RingWaits {
    fn open() -> Result<RingWaits, String> {
        let timeline = Arc::new(Mutex::new(WaitTimeline::new()));
        let sink = {
            let t = timeline.clone();
            Box::new(move |e: &vmscope_linux::SchedEvent| {
                if let Ok(mut t) = t.lock() {
                    t.push(e);
                }
            })
        };
        // 256 KiB per CPU: the drain thread empties them every 50 ms.
        let recorder =
            vmscope_linux::SchedEventRecorder::open(64, sink).map_err(|e| e.to_string())?;
        Ok(RingWaits {
            recorder,
            timeline,
            lost: 0,
            dropped: 0,
            anomalies: Default::default(),
        })
    }
}

/// The running source.
pub enum WaitSource {
    /// The eBPF programs.
    Bpf(Box<vmscope_bpf::waits::BpfWaits>),
    /// The rings, with why the programs did not load (`auto`).
    Rings(Box<RingWaits>, Option<String>),
}

/// `TASK_COMM_LEN` names of the eBPF culprits, from their NUL-padded bytes.
fn comm(b: &[u8; 16]) -> TaskComm {
    TaskComm::from_bytes(b)
}

impl WaitSource {
    /// Open the source `choice` asks for; `Err` says why there is none.
    pub fn open(choice: WaitChoice) -> Result<WaitSource, String> {
        let rings = || RingWaits::open().map_err(|e| format!("scheduler tracepoints: {e}"));
        match choice {
            WaitChoice::Off => Err("not asked for".into()),
            WaitChoice::Bpf => vmscope_bpf::waits::BpfWaits::open()
                .map(|b| WaitSource::Bpf(Box::new(b)))
                .map_err(|e| format!("eBPF: {e}")),
            WaitChoice::Tracepoints => rings().map(|r| WaitSource::Rings(Box::new(r), None)),
            WaitChoice::Auto => match vmscope_bpf::waits::BpfWaits::open() {
                Ok(b) => Ok(WaitSource::Bpf(Box::new(b))),
                Err(e) => rings()
                    .map(|r| WaitSource::Rings(Box::new(r), Some(e.to_string())))
                    .map_err(|r| format!("eBPF: {e}; {r}")),
            },
        }
    }

    /// For headers: where the split comes from.
    pub fn describe(&self) -> String {
        match self {
            WaitSource::Bpf(_) => "eBPF on sched_switch and sched_migrate_task, with the kernel's runqueue clock and sched_info (adds up to schedstat's run_delay); a wait counts in the interval it ends in, as run_delay".into(),
            WaitSource::Rings(_, why) => {
                let base = "sched_switch, sched_wakeup(_new) and sched_migrate_task tracepoint rings; a wait counts in the interval it ends in, as schedstat's run_delay";
                match why {
                    Some(w) => format!("{base} (eBPF not used: {w})"),
                    None => base.into(),
                }
            }
        }
    }

    /// Follow exactly these threads from now on.
    pub fn follow(&mut self, tids: Vec<u32>) {
        match self {
            WaitSource::Bpf(b) => b.follow(tids),
            WaitSource::Rings(r, _) => {
                if let Ok(mut t) = r.timeline.lock() {
                    t.follow(tids);
                }
            }
        }
    }

    /// The waits ended since the previous call (the rings: before
    /// `cut`, CLOCK_MONOTONIC ns), by thread, and notes on what was missed.
    pub fn take(&mut self, cut: u64) -> (HashMap<u32, ThreadWait>, Vec<String>) {
        match self {
            WaitSource::Bpf(b) => match b.take() {
                Ok(d) => bpf_waits(&d),
                Err(e) => (
                    HashMap::new(),
                    vec![format!("waits not read this interval: {e}")],
                ),
            },
            WaitSource::Rings(r, _) => {
                r.recorder.flush(cut);
                let w = r.timeline.lock().map(|mut t| t.take()).unwrap_or_default();
                (w, ring_notes(r))
            }
        }
    }
}

/// One drain of the eBPF maps as waits per thread, and its notes.
fn bpf_waits(d: &vmscope_bpf::waits::Drained) -> (HashMap<u32, ThreadWait>, Vec<String>) {
    let mut out: HashMap<u32, ThreadWait> = HashMap::new();
    for c in &d.charges {
        let culprit = match c.culprit {
            vmscope_bpf::waits::UNKNOWN_TID => Culprit::UNKNOWN,
            vmscope_bpf::waits::OTHER_TID => Culprit::OTHER,
            t => Culprit::task(t, comm(&c.comm)),
        };
        out.entry(c.waiter).or_default().add(culprit, c.ns);
    }
    for (&tid, &n) in &d.waits {
        out.entry(tid).or_default().waits += n;
    }
    let s = d.stats;
    let mut notes = Vec::new();
    let ms = |ns: u64| ns as f64 / 1e6;
    if s.full > 0 {
        notes.push(format!(
            "{:.3} ms of waiting in {} charges not attributed: the eBPF wait map was full ({} pairs of waiter and culprit between two intervals)",
            ms(s.full_ns),
            s.full,
            vmscope_bpf::waits::WAIT_ENTRIES
        ));
    }
    if s.cut > 0 {
        notes.push(format!(
            "{:.3} ms of {} waits charged to other: more switches on their CPU during the wait than the eBPF programs name (8)",
            ms(s.cut_ns),
            s.cut
        ));
    }
    if s.unplaced > 0 {
        notes.push(format!(
            "{:.3} ms of waiting in {} waits charged to unknown: run_delay grew where the eBPF programs could not split it",
            ms(s.unplaced_ns),
            s.unplaced
        ));
    }
    if s.no_rq > 0 {
        notes.push(format!(
            "{} scheduler events skipped by the eBPF programs: the task's runqueue was out of their reach (a kernel without CONFIG_FAIR_GROUP_SCHED?)",
            s.no_rq
        ));
    }
    if s.unseen > 0 {
        notes.push(format!(
            "{} moves of a thread not seen switching before: their waits so far are not split",
            s.unseen
        ));
    }
    if s.not_followed > 0 {
        notes.push(format!(
            "{} threads not followed: the eBPF follow map is full ({} threads)",
            s.not_followed,
            vmscope_bpf::waits::FOLLOW_ENTRIES
        ));
    }
    if s.counts_full > 0 {
        notes.push(format!(
            "{} waits not counted: the eBPF count map is full",
            s.counts_full
        ));
    }
    (out, notes)
}

fn ring_notes(w: &mut RingWaits) -> Vec<String> {
    let mut notes = Vec::new();
    let (lost, dropped) = (w.recorder.lost(), w.recorder.dropped());
    if lost > w.lost || dropped > w.dropped {
        notes.push(format!(
            "{} scheduler tracepoint records lost (ring overflow) and {} dropped (more than {} waiting to be ordered): waits across the gap are not attributed",
            lost - w.lost,
            dropped - w.dropped,
            vmscope_linux::sched_events::MAX_PENDING
        ));
        (w.lost, w.dropped) = (lost, dropped);
    }
    let a = w.timeline.lock().map(|t| t.anomalies()).unwrap_or_default();
    let lost_waits = a.lost_waits - w.anomalies.lost_waits;
    if lost_waits > 0 {
        notes.push(format!(
            "{lost_waits} waits not attributed: the thread was seen switched out before its switch-in (a record the tracepoints did not deliver)"
        ));
    }
    w.anomalies = a;
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..s.len()].copy_from_slice(s.as_bytes());
        b
    }

    #[test]
    fn an_ebpf_drain_becomes_waits_per_thread_with_notes() {
        use vmscope_bpf::waits::{Charge, Drained, WaitStats, UNKNOWN_TID};
        let d = Drained {
            charges: vec![
                Charge {
                    waiter: 7,
                    culprit: 9,
                    comm: name("CPU 0/KVM"),
                    ns: 3_000_000,
                },
                Charge {
                    waiter: 7,
                    culprit: 0,
                    comm: name("swapper/1"),
                    ns: 1_000,
                },
                Charge {
                    waiter: 7,
                    culprit: UNKNOWN_TID,
                    comm: [0; 16],
                    ns: 500,
                },
                Charge {
                    waiter: 8,
                    culprit: 44,
                    comm: name("backup"),
                    ns: 2_000_000,
                },
            ],
            waits: HashMap::from([(7, 12), (8, 3)]),
            stats: WaitStats {
                cut: 1,
                cut_ns: 500,
                ..WaitStats::default()
            },
        };
        let (w, notes) = bpf_waits(&d);
        let a = &w[&7];
        assert_eq!(a.waits, 12);
        assert_eq!(a.total_ns(), 3_001_500);
        assert_eq!(a.by_culprit[&Culprit::IDLE], 1_000, "tid 0 is idle");
        assert_eq!(a.by_culprit[&Culprit::UNKNOWN], 500);
        let k = Culprit::task(9, TaskComm::from_bytes(b"CPU 0/KVM"));
        assert_eq!(a.by_culprit[&k], 3_000_000);
        assert_eq!(w[&8].waits, 3);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("charged to other"), "{notes:?}");
    }

    #[test]
    fn choices_parse() {
        assert_eq!(WaitChoice::parse("auto"), Some(WaitChoice::Auto));
        assert_eq!(WaitChoice::parse("bpf"), Some(WaitChoice::Bpf));
        assert_eq!(
            WaitChoice::parse("tracepoints"),
            Some(WaitChoice::Tracepoints)
        );
        assert_eq!(WaitChoice::parse("off"), Some(WaitChoice::Off));
        assert_eq!(WaitChoice::parse("rings"), None);
    }
}
