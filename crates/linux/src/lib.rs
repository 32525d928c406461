//! Live collection on Linux for vmscope.
//!
//! This crate owns everything that talks to the running kernel:
//! - [`recorder`]: sampling with `perf_event_open`, one mmap ring per CPU,
//!   decoded into [`vmscope_model::Record`]s ([`Recorder`]);
//! - [`sched`]: the `sched:sched_switch` tracepoint per CPU
//!   ([`SchedSwitchRecorder`]) for exact per-CPU scheduling (vm-stat);
//! - [`sched_events`]: switches, wake-ups and migrations of every CPU in
//!   time order ([`SchedEventRecorder`]), for waiting time by culprit;
//! - [`procfs`]: the one rooted `/proc` reader of every crate ([`ProcRoot`]),
//!   its cached paths for per-interval sampling, and records synthesized
//!   from a `/proc` tree;
//! - [`numa`]: NUMA nodes from `/sys`, threads' allowed CPUs and
//!   processes' memory by node from `/proc` (`vmscope topo`);
//! - [`sys`]: rooted `/sys` readers (online CPUs, interface counters) and
//!   the record clock;
//! - [`files`]: the bounded reader of files others wrote (kernel files and
//!   copies of them, lab specs, class rules).
//!
//! Ring access (`ring`) and record decoding (`decode`) are private; both are
//! unit-tested on hand-built bytes, so the live path and the tests share code.

mod decode;
mod error;
pub mod files;
pub mod numa;
pub mod procfs;
pub mod recorder;
mod ring;
pub mod samplecost;
pub mod sched;
pub mod sched_events;
pub mod selfcost;
pub mod softirq;
pub mod sys;
pub mod taskstats;

pub use error::LinuxError;
pub use procfs::{synthesize_from_proc, ProcRoot};
pub use recorder::{working_events, RawMark, RawRead, RecordStream, Recorder, RingOptions, Target};

pub use sched::{SchedSwitch, SchedSwitchRecorder, TaskComm};
pub use sched_events::{SchedEvent, SchedEventRecorder};
pub use softirq::{SoftirqRecorder, SoftirqTotals};
pub use sys::{
    clock_monotonic_ns, irq_time_accounting, net_stats, online_cpus, parse_cpu_list, NetStats,
};
pub use taskstats::{ExitListener, TaskExit};
