//! Live sched_switch test (tier 2: run as root). Bounded by rounds, not time.

use std::time::Duration;
use vmscope_linux::{SchedSwitch, SchedSwitchRecorder};

#[test]
fn sleeping_thread_switches_out_and_in() {
    if !vmscope_testkit::require_root("the live tracepoint test") {
        return;
    }
    let mut rec = SchedSwitchRecorder::open(16).unwrap();
    rec.enable().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let sleeper = std::thread::Builder::new()
        .name("sched-sleeper".into())
        .spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(2));
            }
        })
        .unwrap();
    let tid = rx.recv().unwrap();
    sleeper.join().unwrap();
    let mut out: Vec<SchedSwitch> = Vec::new();
    let mut outs = 0;
    let mut ins = 0;
    let mut slept = 0;
    for _ in 0..40 {
        rec.read(Duration::from_millis(50), &mut out).unwrap();
        for s in &out {
            assert!(rec.cpus().contains(&s.cpu));
            // Before the thread names itself it carries its parent's name.
            if s.prev_pid == tid && s.prev_comm.as_str() == "sched-sleeper" {
                outs += 1;
                // TASK_INTERRUPTIBLE (S): switched out to sleep.
                if s.prev_state & 1 != 0 {
                    slept += 1;
                }
            }
            if s.next_pid == tid {
                assert!(
                    ["sched-sleeper", "sleeping_thread"].contains(&s.next_comm.as_str()),
                    "{s:?}"
                );
                ins += 1;
            }
        }
        assert!(out.windows(2).all(|w| w[0].time <= w[1].time));
        out.clear();
        if slept >= 10 {
            break;
        }
    }
    rec.disable().unwrap();
    // Switches out of the idle task are not always delivered on this
    // kernel (perf shows the same), so switch-ins are not counted on.
    assert!(
        slept >= 10,
        "switches of the sleeper: {outs} out ({slept} to sleep), {ins} in"
    );
}
