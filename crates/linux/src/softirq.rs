//! The `irq:softirq_entry` and `irq:softirq_exit` tracepoints on every CPU:
//! exact softirq time per vector and per context task, for charging shared
//! host I/O work to VMs.
//!
//! Without `CONFIG_IRQ_TIME_ACCOUNTING` (Debian's and most distribution
//! kernels) `/proc/stat`'s softirq column is a sample at the tick: a
//! softirq of 30 µs is counted as a whole tick or not at all, and a tap's
//! packets handled between ticks cost nothing. The tracepoints give every
//! softirq's start and end. Both events of a CPU write into one ring
//! (`PERF_EVENT_IOC_SET_OUTPUT`), so entries and exits arrive in order.
//! Softirqs do not nest on a CPU (they run with softirqs disabled), so an
//! exit closes the CPU's open entry of the same vector. A LOST record (ring
//! overflow) drops the CPU's open entry: an exit after the gap must not
//! close an entry from before it. A thread drains the rings every 100 ms,
//! so a caller that reads rarely (a Prometheus scrape every 15 s) does not
//! overflow them.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use perf_event_open_sys::ioctls;

use crate::ring::Ring;
use crate::sched::{
    format_field, map_ring, open_tracepoint, read_file, ring_data_pages, tp_record, tracepoint_dir,
    tracepoint_id, Field, TpRecord,
};
use crate::sys::{online_cpus, page_size};
use crate::LinuxError;

const ENTRY: &str = "irq:softirq_entry";
const EXIT: &str = "irq:softirq_exit";

/// Softirq vectors (`enum { HI_SOFTIRQ, ... }` in include/linux/interrupt.h;
/// the order is kernel ABI, shown by the tracepoints' print format).
pub const VECTORS: [&str; 10] = [
    "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU",
];

/// Vectors that do I/O work: network transmit and receive, block
/// completion, and interrupt polling.
pub const IO_VECTORS: [u32; 4] = [2, 3, 4, 5];

/// Whether vector `v` is I/O work.
pub fn is_io_vector(v: u32) -> bool {
    IO_VECTORS.contains(&v)
}

/// Name of vector `v` (`VEC<n>` for one this list does not know).
pub fn vector_name(v: u32) -> String {
    VECTORS
        .get(v as usize)
        .map(std::string::ToString::to_string)
        .unwrap_or_else(|| format!("VEC{v}"))
}

/// Softirq time over some span, in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SoftirqTotals {
    /// Per vector.
    pub by_vector: HashMap<u32, u64>,
    /// Per (context tid, vector): the task the softirq interrupted, or
    /// ran in (`ksoftirqd/N`); tid 0 is the idle task.
    pub by_tid: HashMap<(u32, u32), u64>,
    /// Softirqs handled (exits matched to an entry).
    pub count: u64,
    /// Of them, per vector: the runs `/proc/softirqs` counts.
    pub runs_by_vector: HashMap<u32, u64>,
    /// Exits with no open entry (the entry was before the recorder
    /// started, or records were lost).
    pub unmatched: u64,
}

impl SoftirqTotals {
    /// Nanoseconds of the I/O vectors.
    pub fn io_ns(&self) -> u64 {
        self.by_vector
            .iter()
            .filter(|(v, _)| is_io_vector(**v))
            .map(|(_, n)| n)
            .sum()
    }

    /// Nanoseconds of I/O vectors that ran in the context of `tid`.
    pub fn io_ns_of(&self, tid: u32) -> u64 {
        IO_VECTORS
            .iter()
            .filter_map(|v| self.by_tid.get(&(tid, *v)))
            .sum()
    }

    /// Nanoseconds of every vector that ran in the context of `tid`.
    pub fn all_ns_of(&self, tid: u32) -> u64 {
        (0..VECTORS.len() as u32)
            .filter_map(|v| self.by_tid.get(&(tid, v)))
            .sum()
    }

    /// Nanoseconds of every vector.
    pub fn total_ns(&self) -> u64 {
        self.by_vector.values().sum()
    }
}

/// One decoded ring record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoded {
    Event(SoftirqEvent),
    /// The kernel dropped this many records here.
    Lost(u64),
}

/// One decoded softirq event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SoftirqEvent {
    pub entry: bool,
    pub cpu: u32,
    pub tid: u32,
    pub time: u64,
    pub vec: u32,
}

/// Where `vec` is, and the entry tracepoint's id (the payload's
/// `common_type` says which of the two events a record is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SoftirqLayout {
    common_type: Field,
    vec: Field,
    entry_id: u64,
}

impl SoftirqLayout {
    pub(crate) fn from_format(format: &str, entry_id: u64) -> Result<SoftirqLayout, LinuxError> {
        let f = |name: &str| {
            format_field(format, name).ok_or_else(|| LinuxError::Tracepoint {
                name: ENTRY.into(),
                msg: format!("its format has no field '{name}'"),
            })
        };
        Ok(SoftirqLayout {
            common_type: f("common_type")?,
            vec: f("vec")?,
            entry_id,
        })
    }

    /// Decode one ring record; `None` for anything else.
    pub(crate) fn decode(&self, rec: &[u8]) -> Option<Decoded> {
        match tp_record(rec)? {
            TpRecord::Sample {
                tid,
                time,
                cpu,
                raw,
            } => Some(Decoded::Event(SoftirqEvent {
                entry: self.common_type.int(raw)? == self.entry_id,
                cpu,
                tid,
                time,
                vec: self.vec.int(raw)? as u32,
            })),
            TpRecord::Lost(n) => Some(Decoded::Lost(n)),
        }
    }
}

/// Pairs entries with exits per CPU and adds the time up.
#[derive(Debug, Default)]
pub(crate) struct Pairer {
    /// Per CPU: the open entry (time, vec, tid).
    open: HashMap<u32, (u64, u32, u32)>,
}

impl Pairer {
    pub(crate) fn push(&mut self, e: SoftirqEvent, totals: &mut SoftirqTotals) {
        if e.entry {
            if self.open.insert(e.cpu, (e.time, e.vec, e.tid)).is_some() {
                // The exit of the previous one never came.
                totals.unmatched += 1;
            }
            return;
        }
        match self.open.remove(&e.cpu) {
            Some((t0, vec, tid)) if vec == e.vec && e.time >= t0 => {
                let d = e.time - t0;
                *totals.by_vector.entry(vec).or_default() += d;
                *totals.by_tid.entry((tid, vec)).or_default() += d;
                *totals.runs_by_vector.entry(vec).or_default() += 1;
                totals.count += 1;
            }
            _ => totals.unmatched += 1,
        }
    }

    /// Records of `cpu` were lost: its open entry may have lost its exit.
    pub(crate) fn gap(&mut self, cpu: u32) {
        self.open.remove(&cpu);
    }
}

/// What the drain thread and [`SoftirqRecorder::take`] share.
struct Drained {
    rings: Vec<Ring>,
    layout: SoftirqLayout,
    scratch: Vec<u64>,
    pairer: Pairer,
    totals: SoftirqTotals,
    lost: u64,
}

impl Drained {
    fn drain(&mut self, cpus: &[u32]) {
        let Drained {
            rings,
            layout,
            scratch,
            pairer,
            totals,
            lost,
        } = self;
        for (ring, &cpu) in rings.iter_mut().zip(cpus) {
            ring.drain(scratch, |rec| match layout.decode(rec) {
                Some(Decoded::Event(e)) => pairer.push(e, totals),
                Some(Decoded::Lost(n)) => {
                    *lost += n;
                    pairer.gap(cpu);
                }
                None => {}
            });
        }
    }
}

/// How often the drain thread empties the rings at the latest.
const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// softirq_entry and softirq_exit on every online CPU, one ring per CPU,
/// drained by a thread of its own until dropped.
pub struct SoftirqRecorder {
    cpus: Vec<u32>,
    _fds: Vec<OwnedFd>,
    shared: Arc<Mutex<Drained>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SoftirqRecorder {
    /// Open both tracepoints on every online CPU, enable them and start
    /// draining. `ring_pages` as in [`crate::RingOptions`] (0 = 1 MiB per
    /// CPU).
    pub fn open(ring_pages: usize) -> Result<SoftirqRecorder, LinuxError> {
        let page = page_size();
        let data_pages = ring_data_pages(ring_pages, page)?;
        let entry_dir = tracepoint_dir(ENTRY)?;
        let exit_dir = tracepoint_dir(EXIT)?;
        let entry_id = tracepoint_id(&entry_dir)?;
        let exit_id = tracepoint_id(&exit_dir)?;
        let layout = SoftirqLayout::from_format(&read_file(entry_dir.join("format"))?, entry_id)?;
        let cpus = online_cpus(Path::new("/sys"))?;
        let mut fds = Vec::new();
        let mut rings = Vec::new();
        let mut pollfds = Vec::new();
        let wakeup = (data_pages * page / 2) as u32;
        for &cpu in &cpus {
            let entry = open_tracepoint(ENTRY, entry_id, cpu, wakeup, fds.len())?;
            let ring = map_ring(&entry, cpu, data_pages, page)?;
            let exit = open_tracepoint(EXIT, exit_id, cpu, wakeup, fds.len() + 1)?;
            // SAFETY: both are open perf fds on the same CPU; SET_OUTPUT
            // takes the target fd as its integer argument.
            if unsafe { ioctls::SET_OUTPUT(exit.as_raw_fd(), entry.as_raw_fd()) } < 0 {
                return Err(LinuxError::Sys {
                    what: "PERF_EVENT_IOC_SET_OUTPUT (softirq_exit into softirq_entry's ring)",
                    source: std::io::Error::last_os_error(),
                });
            }
            pollfds.push(libc::pollfd {
                fd: entry.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            rings.push(ring);
            fds.push(entry);
            fds.push(exit);
        }
        crate::sys::ioctl_all(&fds, "PERF_EVENT_IOC_ENABLE", ioctls::ENABLE)?;
        let shared = Arc::new(Mutex::new(Drained {
            rings,
            layout,
            scratch: Vec::new(),
            pairer: Pairer::default(),
            totals: SoftirqTotals::default(),
            lost: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop, cpus) = (shared.clone(), stop.clone(), cpus.clone());
            std::thread::Builder::new()
                .name("softirq-rings".into())
                .spawn(move || {
                    // The fds stay open while the recorder (which owns
                    // them) lives, and it joins this thread before closing.
                    while !stop.load(Ordering::Relaxed) {
                        let _ = crate::sys::poll_fds(&mut pollfds, DRAIN_EVERY, "poll");
                        if let Ok(mut d) = shared.lock() {
                            d.drain(&cpus);
                        }
                    }
                })
                .map_err(|source| LinuxError::Sys {
                    what: "spawning the softirq ring thread",
                    source,
                })?
        };
        Ok(SoftirqRecorder {
            cpus,
            _fds: fds,
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// Drain every ring and return the softirq time since the previous
    /// call (since the recorder opened, the first time). A softirq still
    /// running counts in the call after its exit. Never blocks for long.
    pub fn take(&mut self) -> SoftirqTotals {
        let Ok(mut d) = self.shared.lock() else {
            return SoftirqTotals::default();
        };
        d.drain(&self.cpus);
        std::mem::take(&mut d.totals)
    }

    /// Records the kernel dropped (ring overflow).
    pub fn lost(&self) -> u64 {
        self.shared.lock().map(|d| d.lost).unwrap_or(0)
    }
}

impl Drop for SoftirqRecorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perf_event_open_sys::bindings as sys;

    const FORMAT: &str = include_str!("../tests/fixtures/tracing/softirq_entry_format");

    fn sample(tid: u32, time: u64, cpu: u32, ty: u16, vec: u32) -> Vec<u8> {
        let mut raw = vec![0u8; 12];
        raw[0..2].copy_from_slice(&ty.to_ne_bytes());
        raw[4..8].copy_from_slice(&(tid as i32).to_ne_bytes());
        raw[8..12].copy_from_slice(&vec.to_ne_bytes());
        crate::sched::sample_record(tid, &raw, cpu, time)
    }

    #[test]
    fn layout_from_the_format_file() {
        let l = SoftirqLayout::from_format(FORMAT, 7).unwrap();
        assert_eq!(l.vec.offset, 8);
        assert_eq!(l.vec.size, 4);
        assert_eq!(l.common_type.offset, 0);
        let e = SoftirqLayout::from_format("format:\n", 7)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("softirq_entry") && e.contains("common_type"),
            "{e}"
        );
    }

    #[test]
    fn pairs_entries_and_exits_per_cpu() {
        let l = SoftirqLayout::from_format(FORMAT, 7).unwrap();
        let (entry, exit) = (7u16, 8u16);
        let mut p = Pairer::default();
        let mut t = SoftirqTotals::default();
        let recs = [
            sample(100, 1_000, 0, entry, 3), // NET_RX in tid 100 on CPU 0
            sample(0, 1_500, 1, entry, 1),   // TIMER in idle on CPU 1
            sample(100, 1_400, 0, exit, 3),  // 400 ns
            sample(0, 1_600, 1, exit, 1),    // 100 ns
            sample(9, 2_000, 1, exit, 4),    // an exit without entry
            sample(200, 3_000, 0, entry, 4), // BLOCK in tid 200
            sample(200, 3_050, 0, exit, 4),  // 50 ns
        ];
        for r in &recs {
            match l.decode(r) {
                Some(Decoded::Event(e)) => p.push(e, &mut t),
                other => panic!("not an event: {other:?}"),
            }
        }
        assert_eq!(t.count, 3);
        assert_eq!(t.unmatched, 1);
        assert_eq!(t.by_vector[&3], 400);
        assert_eq!(t.by_vector[&1], 100);
        assert_eq!(t.io_ns(), 450);
        assert_eq!(t.io_ns_of(100), 400);
        assert_eq!(t.io_ns_of(200), 50);
        assert_eq!(t.io_ns_of(0), 0);
        assert_eq!(vector_name(3), "NET_RX");
        assert_eq!(vector_name(12), "VEC12");
        // A short record does not decode.
        assert!(l.decode(&recs[0][..30]).is_none());
        assert_eq!(t.all_ns_of(0), 100);
        assert_eq!(t.total_ns(), 550);
    }

    #[test]
    fn a_gap_drops_the_open_entry() {
        let l = SoftirqLayout::from_format(FORMAT, 7).unwrap();
        let mut p = Pairer::default();
        let mut t = SoftirqTotals::default();
        let ev = |r: Vec<u8>| match l.decode(&r) {
            Some(Decoded::Event(e)) => e,
            other => panic!("{other:?}"),
        };
        p.push(ev(sample(100, 1_000, 0, 7, 3)), &mut t);
        // Records lost on CPU 0, then an exit of the same vector seconds later.
        p.gap(0);
        p.push(ev(sample(100, 5_000_000_000, 0, 8, 3)), &mut t);
        assert_eq!(t.count, 0);
        assert_eq!(t.unmatched, 1);
        assert_eq!(t.total_ns(), 0);
        // An entry while one is open: the first lost its exit.
        p.push(ev(sample(100, 6_000, 1, 7, 1)), &mut t);
        p.push(ev(sample(100, 7_000, 1, 7, 3)), &mut t);
        p.push(ev(sample(100, 7_100, 1, 8, 3)), &mut t);
        assert_eq!((t.count, t.unmatched, t.total_ns()), (1, 2, 100));
        // A LOST record decodes as such.
        let mut lost = Vec::new();
        lost.extend_from_slice(&sys::PERF_RECORD_LOST.to_ne_bytes());
        lost.extend_from_slice(&0u16.to_ne_bytes());
        lost.extend_from_slice(&48u16.to_ne_bytes());
        lost.extend_from_slice(&1u64.to_ne_bytes());
        lost.extend_from_slice(&12u64.to_ne_bytes());
        lost.resize(48, 0);
        assert_eq!(l.decode(&lost), Some(Decoded::Lost(12)));
    }
}
