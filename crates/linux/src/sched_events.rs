//! The scheduler's own account of who waited on which CPU: the
//! `sched:sched_switch`, `sched:sched_wakeup`, `sched:sched_wakeup_new` and
//! `sched:sched_migrate_task` tracepoints on every CPU, all four events of a
//! CPU in one ring (`PERF_EVENT_IOC_SET_OUTPUT`), drained by a thread of its
//! own and handed to a sink in time order ([`SchedEventRecorder`]). What
//! the events mean for waiting time is `vmscope_stat::wait`'s business;
//! this module only opens, decodes and orders them.
//!
//! Events of different CPUs are merged by time. A record being written on
//! one CPU while another CPU's ring is drained can come out one drain late,
//! the drain thread holds the last 20 ms back, and `flush(until)` hands on
//! only events before `until`. Payloads are decoded with the field offsets of each
//! tracepoint's `format` file.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use perf_event_open_sys::ioctls;

use crate::ring::Ring;
use crate::sched::{
    format_field, map_ring, open_tracepoint, read_file, ring_data_pages, tp_record, tracepoint_dir,
    tracepoint_id, Field, SwitchLayout, TpRecord,
};
use crate::sys::{online_cpus, page_size};
use crate::{LinuxError, SchedSwitch};

const SWITCH: &str = "sched:sched_switch";
const WAKEUP: &str = "sched:sched_wakeup";
const WAKEUP_NEW: &str = "sched:sched_wakeup_new";
const MIGRATE: &str = "sched:sched_migrate_task";

/// One scheduler event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedEvent {
    /// A context switch on `cpu`.
    Switch(SchedSwitch),
    /// Task `pid` was made runnable on `target_cpu`'s runqueue (a wake-up
    /// or a new task's first one).
    Wakeup {
        time: u64,
        pid: u32,
        target_cpu: u32,
    },
    /// Task `pid` moved from `orig_cpu` to `dest_cpu`.
    Migrate {
        time: u64,
        pid: u32,
        orig_cpu: u32,
        dest_cpu: u32,
    },
}

impl SchedEvent {
    /// CLOCK_MONOTONIC nanoseconds.
    pub fn time(&self) -> u64 {
        match self {
            SchedEvent::Switch(s) => s.time,
            SchedEvent::Wakeup { time, .. } | SchedEvent::Migrate { time, .. } => *time,
        }
    }
}

/// Whether a switched-out task's `prev_state` says it stayed runnable
/// (preempted or yielding: still on the runqueue). The kernel reports 0
/// (`R`) or only the preemption bit, `TASK_REPORT_MAX` (`R+`), which sits
/// above the report bits (`0x01..0x80` on this kernel family, `0x100` the
/// preemption flag); any report bit means the task left the runqueue.
pub fn still_runnable(prev_state: u64) -> bool {
    prev_state & 0xff == 0
}

/// Where the fields of the four events are, and which event a payload is
/// (its `common_type`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventLayout {
    common_type: Field,
    switch: SwitchLayout,
    switch_id: u64,
    wakeup_pid: Field,
    wakeup_target: Field,
    wakeup_ids: [u64; 2],
    migrate_pid: Field,
    migrate_orig: Field,
    migrate_dest: Field,
    migrate_id: u64,
}

fn field(format: &str, tp: &str, name: &str) -> Result<Field, LinuxError> {
    format_field(format, name).ok_or_else(|| LinuxError::Tracepoint {
        name: tp.into(),
        msg: format!("its format has no field '{name}'"),
    })
}

impl EventLayout {
    /// From the format files of sched_switch, sched_wakeup (whose layout
    /// sched_wakeup_new shares) and sched_migrate_task, and the four ids
    /// (switch, wakeup, wakeup_new, migrate).
    pub(crate) fn from_formats(
        switch: &str,
        wakeup: &str,
        migrate: &str,
        ids: [u64; 4],
    ) -> Result<EventLayout, LinuxError> {
        Ok(EventLayout {
            common_type: field(switch, SWITCH, "common_type")?,
            switch: SwitchLayout::from_format(switch)?,
            switch_id: ids[0],
            wakeup_pid: field(wakeup, WAKEUP, "pid")?,
            wakeup_target: field(wakeup, WAKEUP, "target_cpu")?,
            wakeup_ids: [ids[1], ids[2]],
            migrate_pid: field(migrate, MIGRATE, "pid")?,
            migrate_orig: field(migrate, MIGRATE, "orig_cpu")?,
            migrate_dest: field(migrate, MIGRATE, "dest_cpu")?,
            migrate_id: ids[3],
        })
    }

    /// Decode one ring record: `Ok(Some(event))`, `Err(n)` for a LOST
    /// record of `n`, `Ok(None)` for anything else or a short payload.
    pub(crate) fn decode(&self, rec: &[u8]) -> Result<Option<SchedEvent>, u64> {
        let (time, cpu, raw) = match tp_record(rec) {
            Some(TpRecord::Sample { time, cpu, raw, .. }) => (time, cpu, raw),
            Some(TpRecord::Lost(n)) => return Err(n),
            None => return Ok(None),
        };
        let Some(ty) = self.common_type.int(raw) else {
            return Ok(None);
        };
        let int = |f: Field| f.int(raw).map(|v| v as u32);
        Ok(if ty == self.switch_id {
            self.switch.decode(raw, cpu, time).map(SchedEvent::Switch)
        } else if self.wakeup_ids.contains(&ty) {
            (|| {
                Some(SchedEvent::Wakeup {
                    time,
                    pid: int(self.wakeup_pid)?,
                    target_cpu: int(self.wakeup_target)?,
                })
            })()
        } else if ty == self.migrate_id {
            (|| {
                Some(SchedEvent::Migrate {
                    time,
                    pid: int(self.migrate_pid)?,
                    orig_cpu: int(self.migrate_orig)?,
                    dest_cpu: int(self.migrate_dest)?,
                })
            })()
        } else {
            None
        })
    }
}

/// At most this many events wait in memory to be put in order (a
/// fraction of a second's worth at 50 000 switches a second); beyond it
/// they are dropped and counted in [`SchedEventRecorder::dropped`].
pub const MAX_PENDING: usize = 1 << 18;

/// Events younger than this stay in memory when the drain thread hands
/// events on, so that one written late on another CPU still comes in order.
const HOLDBACK_NS: u64 = 20_000_000;

/// Where events go, in time order.
pub type EventSink = Box<dyn FnMut(&SchedEvent) + Send>;

/// What the drain thread and `flush` share.
struct Drained {
    rings: Vec<Ring>,
    layout: EventLayout,
    scratch: Vec<u64>,
    pending: Vec<SchedEvent>,
    ready: Vec<SchedEvent>,
    sink: EventSink,
    lost: u64,
    dropped: u64,
}

impl Drained {
    fn drain(&mut self) {
        let Drained {
            rings,
            layout,
            scratch,
            pending,
            lost,
            dropped,
            ..
        } = self;
        for ring in rings.iter_mut() {
            ring.drain(scratch, |rec| match layout.decode(rec) {
                Ok(Some(e)) if pending.len() < MAX_PENDING => pending.push(e),
                Ok(Some(_)) => *dropped += 1,
                Ok(None) => {}
                Err(n) => *lost += n,
            });
        }
    }

    /// Hand every event before `until` to the sink, in time order.
    fn deliver(&mut self, until: u64) {
        split_before(&mut self.pending, until, &mut self.ready);
        for e in self.ready.drain(..) {
            (self.sink)(&e);
        }
    }
}

/// How often the drain thread empties the rings at the latest.
const DRAIN_EVERY: Duration = Duration::from_millis(50);

/// The four scheduler tracepoints on every online CPU, one ring per CPU,
/// drained by a thread of its own until dropped, which hands the events to
/// a sink in time order.
pub struct SchedEventRecorder {
    cpus: Vec<u32>,
    _fds: Vec<OwnedFd>,
    shared: Arc<Mutex<Drained>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SchedEventRecorder {
    /// Open the tracepoints on every online CPU, enable them and start
    /// draining into `sink`. `ring_pages` as in [`crate::RingOptions`]
    /// (0 = 1 MiB per CPU).
    pub fn open(ring_pages: usize, sink: EventSink) -> Result<SchedEventRecorder, LinuxError> {
        let page = page_size();
        let data_pages = ring_data_pages(ring_pages, page)?;
        let names = [SWITCH, WAKEUP, WAKEUP_NEW, MIGRATE];
        let mut dirs = Vec::new();
        let mut ids = [0u64; 4];
        for (i, n) in names.iter().enumerate() {
            let d = tracepoint_dir(n)?;
            ids[i] = tracepoint_id(&d)?;
            dirs.push(d);
        }
        let layout = EventLayout::from_formats(
            &read_file(dirs[0].join("format"))?,
            &read_file(dirs[1].join("format"))?,
            &read_file(dirs[3].join("format"))?,
            ids,
        )?;
        let cpus = online_cpus(Path::new("/sys"))?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut rings = Vec::new();
        let mut pollfds = Vec::new();
        let wakeup = (data_pages * page / 4) as u32;
        for &cpu in &cpus {
            let first = open_tracepoint(names[0], ids[0], cpu, wakeup, fds.len())?;
            rings.push(map_ring(&first, cpu, data_pages, page)?);
            pollfds.push(libc::pollfd {
                fd: first.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            for i in 1..4 {
                let fd = open_tracepoint(names[i], ids[i], cpu, wakeup, fds.len() + i)?;
                // SAFETY: both are open perf fds on the same CPU; SET_OUTPUT
                // takes the target fd as its integer argument.
                if unsafe { ioctls::SET_OUTPUT(fd.as_raw_fd(), first.as_raw_fd()) } < 0 {
                    return Err(LinuxError::Sys {
                        what: "PERF_EVENT_IOC_SET_OUTPUT (a sched event into sched_switch's ring)",
                        source: std::io::Error::last_os_error(),
                    });
                }
                fds.push(fd);
            }
            fds.push(first);
        }
        crate::sys::ioctl_all(&fds, "PERF_EVENT_IOC_ENABLE", ioctls::ENABLE)?;
        let shared = Arc::new(Mutex::new(Drained {
            rings,
            layout,
            scratch: Vec::new(),
            pending: Vec::new(),
            ready: Vec::new(),
            sink,
            lost: 0,
            dropped: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("sched-rings".into())
                .spawn(move || {
                    // The fds stay open while the recorder (which owns
                    // them) lives, and it joins this thread before closing.
                    while !stop.load(Ordering::Relaxed) {
                        let _ = crate::sys::poll_fds(&mut pollfds, DRAIN_EVERY, "poll");
                        if let Ok(mut d) = shared.lock() {
                            d.drain();
                            d.deliver(crate::clock_monotonic_ns().saturating_sub(HOLDBACK_NS));
                        }
                    }
                })
                .map_err(|source| LinuxError::Sys {
                    what: "spawning the sched ring thread",
                    source,
                })?
        };
        Ok(SchedEventRecorder {
            cpus,
            _fds: fds,
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// Drain every ring and hand the sink every event before `until`
    /// (CLOCK_MONOTONIC ns) not handed on yet; later ones wait.
    pub fn flush(&self, until: u64) {
        if let Ok(mut d) = self.shared.lock() {
            d.drain();
            d.deliver(until);
        }
    }

    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Records the kernel dropped (ring overflow).
    pub fn lost(&self) -> u64 {
        self.shared.lock().map(|d| d.lost).unwrap_or(0)
    }

    /// Events dropped because [`MAX_PENDING`] were waiting to be ordered.
    pub fn dropped(&self) -> u64 {
        self.shared.lock().map(|d| d.dropped).unwrap_or(0)
    }
}

/// Sort `pending` by time (stable: each CPU's order is kept) and move the
/// events before `until` to `out`.
fn split_before(pending: &mut Vec<SchedEvent>, until: u64, out: &mut Vec<SchedEvent>) {
    pending.sort_by_key(SchedEvent::time);
    let n = pending.partition_point(|e| e.time() < until);
    out.extend(pending.drain(..n));
}

impl Drop for SchedEventRecorder {
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

    const SWITCH_FMT: &str = include_str!("../tests/fixtures/tracing/sched_switch_format");
    const WAKEUP_FMT: &str = include_str!("../tests/fixtures/tracing/sched_wakeup_format");
    const MIGRATE_FMT: &str = include_str!("../tests/fixtures/tracing/sched_migrate_task_format");

    fn layout() -> EventLayout {
        EventLayout::from_formats(SWITCH_FMT, WAKEUP_FMT, MIGRATE_FMT, [372, 374, 373, 371])
            .unwrap()
    }

    fn rec(ty: u16, fields: &[(usize, u32)], len: usize, cpu: u32, time: u64) -> Vec<u8> {
        let mut raw = vec![0u8; len];
        raw[0..2].copy_from_slice(&ty.to_ne_bytes());
        for &(off, v) in fields {
            raw[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        }
        crate::sched::sample_record(1, &raw, cpu, time)
    }

    #[test]
    fn decodes_each_event_by_its_type() {
        let l = layout();
        // sched_wakeup: pid at 24, target_cpu at 32.
        let w = rec(374, &[(24, 4242), (32, 1)], 36, 0, 10);
        assert_eq!(
            l.decode(&w),
            Ok(Some(SchedEvent::Wakeup {
                time: 10,
                pid: 4242,
                target_cpu: 1
            }))
        );
        // sched_wakeup_new has the same layout.
        let wn = rec(373, &[(24, 7), (32, 0)], 36, 1, 11);
        assert!(matches!(
            l.decode(&wn),
            Ok(Some(SchedEvent::Wakeup { pid: 7, .. }))
        ));
        // sched_migrate_task: pid 12, orig 20, dest 24 (comm is __data_loc).
        let m = rec(371, &[(12, 99), (20, 0), (24, 1)], 28, 0, 12);
        assert_eq!(
            l.decode(&m),
            Ok(Some(SchedEvent::Migrate {
                time: 12,
                pid: 99,
                orig_cpu: 0,
                dest_cpu: 1
            }))
        );
        // sched_switch: prev_pid 24, prev_state 32 (8 bytes), next_pid 56.
        let s = rec(372, &[(24, 5), (56, 6)], 64, 1, 13);
        match l.decode(&s) {
            Ok(Some(SchedEvent::Switch(sw))) => {
                assert_eq!((sw.cpu, sw.prev_pid, sw.next_pid, sw.time), (1, 5, 6, 13));
            }
            other => panic!("{other:?}"),
        }
        // An unknown type and a short payload decode to nothing.
        assert_eq!(l.decode(&rec(999, &[], 36, 0, 1)), Ok(None));
        assert_eq!(l.decode(&rec(374, &[], 28, 0, 1)), Ok(None));
        // A format without the field: one line naming the tracepoint and field.
        let e = EventLayout::from_formats(SWITCH_FMT, "format:\n", MIGRATE_FMT, [1, 2, 3, 4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sched:sched_wakeup") && e.contains("'pid'"),
            "{e}"
        );
    }

    #[test]
    fn runnable_states() {
        assert!(still_runnable(0));
        assert!(still_runnable(0x100)); // R+ (preempted)
        assert!(!still_runnable(1)); // S
        assert!(!still_runnable(2)); // D
        assert!(!still_runnable(0x80)); // I
        assert!(!still_runnable(0x101));
    }

    #[test]
    fn take_hands_out_events_before_the_cut_in_order() {
        let w = |time| SchedEvent::Wakeup {
            time,
            pid: 1,
            target_cpu: 0,
        };
        let mut pending = vec![w(30), w(10), w(50), w(20)];
        let mut out = Vec::new();
        split_before(&mut pending, 30, &mut out);
        assert_eq!(out, vec![w(10), w(20)]);
        assert_eq!(pending, vec![w(30), w(50)]);
        split_before(&mut pending, 1000, &mut out);
        assert_eq!(out.len(), 4);
        assert!(pending.is_empty());
    }
}
