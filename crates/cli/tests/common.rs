//! Helpers shared by the CLI integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn vmscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vmscope"))
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vmscope"))
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{:?} failed: {}\n{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[allow(unused_imports)]
pub use vmscope_testkit::{have, is_root, skip, skip_platform};

/// Skip (return true) with a reason unless root and `tools` exist.
pub fn skip_unless(tools: &[&str]) -> bool {
    if !vmscope_testkit::require_root("perf_event_open system-wide") {
        return true;
    }
    for t in tools {
        if !have(t) {
            skip(&format!(
                "'{t}' is not installed (scripts/setup.sh installs it)"
            ));
            return true;
        }
    }
    false
}

pub fn report_json(db: &Path, args: &[&str]) -> serde_json::Value {
    let out = run_ok(
        vmscope()
            .arg("report")
            .arg(db)
            .args(args)
            .args(["--format", "json"]),
    );
    serde_json::from_slice(&out.stdout).expect("report json")
}

/// Rows of a JSON report as (values joined by '|', samples of event 0, percent of event 0).
pub fn rows(v: &serde_json::Value) -> Vec<(String, u64, f64)> {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let vals: Vec<String> = r["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect();
            (
                vals.join("|"),
                r["samples"][0].as_u64().unwrap(),
                r["percent"][0].as_f64().unwrap(),
            )
        })
        .collect()
}

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// Where a recorder writes `db` until it is complete (`DB.partial`,
/// renamed to `db` when the recording ends).
pub fn partial(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_os_string();
    s.push(".partial");
    PathBuf::from(s)
}

/// (samples of event 0, stored duration in s) of a session file, or None
/// while it is not yet readable. A recording under way is read through
/// [`partial`].
pub fn stored(db: &Path) -> Option<(u64, f64)> {
    let out = vmscope()
        .arg("report")
        .arg(db)
        .args(["--format", "json"])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let samples = v["events"][0]["samples"].as_u64()?;
    let d: f64 = v["meta"]["duration_s"]
        .as_str()
        .unwrap_or("0")
        .parse()
        .ok()?;
    Some((samples, d))
}

/// Wait (up to 60 s: start-up time varies with load) until a recorder
/// writing `db` has flushed samples (to its partial file); returns the
/// stored duration then.
pub fn wait_for_samples(db: &Path) -> f64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some((n, d)) = stored(&partial(db)) {
            if n > 0 {
                return d;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the recorder never flushed a sample to {}",
            db.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
