//! Issue 3 item 5: a recorder killed with SIGKILL leaves a session that
//! report reads, missing at most the last second, marked as not stopped
//! cleanly.

mod common;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn sigkilled_recorder_leaves_a_readable_session() {
    if skip_unless(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("killed.db");
    let mut child = vmscope()
        .args(["record", "-a", "-F", "999", "-o"])
        .arg(&db)
        .args(["--"])
        .arg(bin())
        .args(["demo", "-d", "30"])
        .spawn()
        .unwrap();
    // Wait until at least two flushes have happened.
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: plain kill(2) on our child.
    unsafe { libc_kill(child.id() as i32, 9) };
    let _ = child.wait();
    let killed_after = start.elapsed().as_secs_f64();

    let out = run_ok(vmscope().arg("report").arg(&db).args(["--by", "symbol", "-n", "5"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("did not stop cleanly"), "{text}");
    let v = report_json(&db, &["--by", "symbol"]);
    let samples = v["events"][0]["samples"].as_u64().unwrap();
    let duration: f64 = v["meta"]["duration_s"].as_str().unwrap().parse().unwrap();
    // At most one second (plus the flush interval) may be missing.
    assert!(duration >= killed_after - 1.5, "stored duration {duration} vs killed after {killed_after}");
    assert!(samples > 500, "only {samples} samples survived");
    // Kill the orphaned demo workload.
    let _ = std::process::Command::new("pkill").args(["-f", "demo -d 30"]).status();
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
