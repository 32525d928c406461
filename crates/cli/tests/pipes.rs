//! Commands that print until stopped (`top --batch`, `stat`, `account`)
//! end quietly when their reader goes away: `vmscope top -b | head -n 3`
//! exits 0 as soon as `head` has its lines, with nothing on stderr (no
//! panic, no "Broken pipe" error), like the coreutils they sit beside.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run `vmscope ARGS | head -n LINES` in bash; returns (vmscope's exit
/// status, head's output, vmscope's stderr, seconds taken).
fn into_head(args: &str, lines: u32) -> (i32, String, String, f64) {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let script = format!(
        "'{}' {args} 2>'{}' | head -n {lines}; exit ${{PIPESTATUS[0]}}",
        common::bin().display(),
        err.display()
    );
    let t0 = Instant::now();
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    // Generous: only to keep a hanging command from hanging the suite.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`vmscope {args} | head` still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    (
        status.code().unwrap_or(-1),
        out,
        stderr,
        t0.elapsed().as_secs_f64(),
    )
}

#[test]
fn streaming_commands_stop_quietly_on_a_closed_pipe() {
    if !vmscope_testkit::require_root("perf_event_open and sched_switch for top and stat") {
        return;
    }
    for (args, lines) in [
        ("top --batch --format json -i 200ms", 2),
        ("top --batch -i 200ms", 3),
        ("stat -i 200ms --format json", 2),
        ("account -i 200ms --format json", 2),
    ] {
        let (code, out, stderr, secs) = into_head(args, lines);
        eprintln!("vmscope {args} | head -n {lines}: exit {code} after {secs:.1} s");
        assert_eq!(
            out.lines().count(),
            lines as usize,
            "vmscope {args}: head got {out:?}; stderr {stderr}"
        );
        if args.contains("json") {
            for l in out.lines() {
                serde_json::from_str::<serde_json::Value>(l)
                    .unwrap_or_else(|e| panic!("vmscope {args}: not JSON ({e}): {l}"));
            }
        }
        assert_eq!(code, 0, "vmscope {args}: exit {code}, stderr: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("error"),
            "vmscope {args}: stderr {stderr}"
        );
    }
}
