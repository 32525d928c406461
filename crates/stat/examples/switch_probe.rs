//! Prints how often sched_switch records miss the switch-in of the task
//! they switch out (a diagnostic for the sched_switch source).

use std::collections::HashMap;
use std::time::Duration;
use vmscope_linux::SchedSwitchRecorder;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rec = SchedSwitchRecorder::open(0)?;
    rec.enable()?;
    let mut buf = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < end {
        rec.read(Duration::from_millis(200), &mut buf)?;
    }
    let mut cur: HashMap<u32, u32> = HashMap::new();
    let (mut ok, mut miss, mut from_idle, mut to_idle) = (0, 0, 0, 0);
    let mut miss_after_idle = 0;
    for e in &buf {
        if e.prev_pid == 0 {
            from_idle += 1;
        }
        if e.next_pid == 0 {
            to_idle += 1;
        }
        match cur.get(&e.cpu) {
            Some(&c) if c == e.prev_pid => ok += 1,
            Some(&c) => {
                miss += 1;
                if c == 0 {
                    miss_after_idle += 1;
                }
            }
            None => {}
        }
        cur.insert(e.cpu, e.next_pid);
    }
    println!(
        "events {} ok {ok} miss {miss} (after idle {miss_after_idle}) from_idle {from_idle} to_idle {to_idle} lost {}",
        buf.len(),
        rec.lost()
    );
    for e in buf.iter().take(30) {
        println!(
            "{} {} {}({}) -> {}({}) st {}",
            e.cpu, e.time, e.prev_comm, e.prev_pid, e.next_comm, e.next_pid, e.prev_state
        );
    }
    Ok(())
}
