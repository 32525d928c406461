//! The eBPF programs on this kernel, as root: every program passes the
//! verifier and attaches; vm-stat's run times fill each CPU and match a
//! thread's schedstat; the wait programs' split adds up to `run_delay`
//! (exactly: the kernel's own clock and counters); a program loaded while
//! recording is named in the recording; and the programs leave the
//! tracepoints' records to every other reader. Without root each test logs
//! a skip (a failure under CI); as root the programs must load.

use std::time::Duration;
use vmscope_bpf::switch_times::BpfSwitchTimes;
use vmscope_linux::{Recorder, RingOptions, Target};
use vmscope_model::{EventKind, EventSpec, Record, SampleRate};

fn is_root() -> bool {
    vmscope_testkit::require_root("loading eBPF programs")
}

fn cpu_clock(hz: u64) -> EventSpec {
    EventSpec {
        kind: EventKind::CpuClock,
        rate: SampleRate::Frequency(hz),
    }
}

/// A BPF program loaded while recording arrives as a KSYMBOL record with
/// its kernel name and range (so samples in it get a name the kallsyms
/// read at the start lacks), and its removal as one that unregisters the
/// same range. The program is vm-stat's own sched_switch program.
#[test]
fn bpf_programs_loaded_while_recording_are_named() {
    if !is_root() {
        return;
    }
    let opts = RingOptions {
        events: vec![cpu_clock(99)],
        target: Target::AllCpus,
        callchain: false,
        ring_pages: 0,
    };
    let mut rec = Recorder::open(&opts).unwrap();
    rec.enable().unwrap();
    let prog = BpfSwitchTimes::open().expect("vm-stat's program loads as root");
    std::thread::sleep(Duration::from_millis(100));
    drop(prog);
    let ksyms = |out: &[Record]| -> Vec<(u64, u64, String, bool, bool)> {
        out.iter()
            .filter_map(|r| match r {
                Record::Ksymbol {
                    addr,
                    len,
                    name,
                    bpf,
                    unregister,
                    ..
                } => Some((*addr, *len, name.to_string(), *bpf, *unregister)),
                _ => None,
            })
            .collect()
    };
    // The unregistering record comes when the kernel frees the program
    // (after an RCU grace period): read until it is there, 100 reads at most.
    let mut out = Vec::new();
    let mut got = Vec::new();
    for _ in 0..100 {
        rec.read(Duration::from_millis(50), &mut out).unwrap();
        got = ksyms(&out);
        let added = got
            .iter()
            .find(|k| k.2.starts_with("bpf_prog_") && k.2.ends_with("_switch_times") && !k.4);
        if added.is_some_and(|a| got.iter().any(|k| k.0 == a.0 && k.4)) {
            break;
        }
    }
    rec.disable().unwrap();
    let added = got
        .iter()
        .find(|k| k.2.starts_with("bpf_prog_") && k.2.ends_with("_switch_times") && !k.4)
        .unwrap_or_else(|| panic!("no KSYMBOL record of the program: {got:?}"));
    assert!(added.3, "not typed BPF: {added:?}");
    assert!(added.0 >= 0xffff_0000_0000_0000 && added.1 > 0, "{added:?}");
    assert!(
        got.iter().any(|k| k.0 == added.0 && k.4),
        "no KSYMBOL record unregistering {added:?}: {got:?}"
    );
}

/// vm-stat's sched_switch program leaves the tracepoint to every other
/// reader: a BPF program attached to a tracepoint's perf event decides,
/// by its return value, whether the kernel hands the record on to the
/// tracepoint's perf events at all (returning 0 had `serve --per-cpu` hide
/// every switch from `account`'s wait attribution, and from `perf`).
#[test]
fn the_switch_program_leaves_switches_to_other_readers() {
    if !is_root() {
        return;
    }
    let prog = BpfSwitchTimes::open().expect("vm-stat's program loads as root");
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let counter = seen.clone();
    let rec = vmscope_linux::SchedEventRecorder::open(
        16,
        Box::new(move |e| {
            if let vmscope_linux::SchedEvent::Switch(s) = e {
                if s.prev_pid == me || s.next_pid == me {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }),
    )
    .unwrap();
    // Sleeping switches this thread out and back in.
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(2));
    }
    rec.flush(vmscope_linux::clock_monotonic_ns());
    drop(rec);
    drop(prog);
    let n = seen.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n >= 50, "{n} switches of this thread reached the rings");
}

/// Every program of the object passes the kernel's verifier and attaches
/// (the object embedded in the binary, as the package ships it).
#[test]
fn every_program_passes_the_verifier_and_attaches() {
    if !is_root() {
        return;
    }
    let slots = vmscope_bpf::object::cpu_slots();
    let loaded = vmscope_bpf::object::load(
        "the test's load of every program",
        vmscope_bpf::object::PROGRAMS,
        &[("cur", slots), ("logs", slots)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.attached(), vmscope_bpf::object::PROGRAMS.len());
    assert_eq!(
        loaded.program_ids().len(),
        vmscope_bpf::object::PROGRAMS.len()
    );
}
