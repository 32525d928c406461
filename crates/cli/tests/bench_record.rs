//! `--record DIR` on bench points (issue 15 item 5): after its samples each
//! point of `bench scale` runs once more while `vmscope record -a` records
//! it; the session is named in the point's summary and annotated with the
//! point, and `vmscope compare` puts the points side by side. `bench web`
//! records each (configuration, rate) point the same way, and `bench
//! overhead` keeps every sample's profiled run. On the host (host-threads,
//! N = 1, 2; the host web server; the host workload), so they need root
//! but no lab.

mod common;

use serde_json::Value;

#[test]
fn bench_scale_records_each_point_and_compare_reads_them() {
    if !vmscope_testkit::require_root("a system-wide recording") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("sessions");
    let out = common::run_ok(
        common::vmscope()
            .args([
                "bench",
                "scale",
                "--quiet",
                "--mode",
                "host-threads",
                "--max",
                "2",
                "--seconds",
                "0.5",
                "--repeat",
                "1",
                "--max-repeat",
                "1",
                "--warmup",
                "0",
                "--busy-retries",
                "0",
                "--no-charts",
                "--format",
                "json",
                "--record-freq",
                "199",
                "--record",
            ])
            .arg(&rec),
    );
    let lines = json_lines(&out.stdout);
    let summaries: Vec<&Value> = lines.iter().filter(|v| v["type"] == "summary").collect();
    assert_eq!(summaries.len(), 2, "{lines:?}");
    let mut sessions = Vec::new();
    for s in &summaries {
        assert!(s["record_error"].is_null(), "{s}");
        let path = s["session"]
            .as_str()
            .unwrap_or_else(|| panic!("no session named: {s}"));
        // The session says which point it profiled, and holds samples.
        check_session(path, &rec, "scale", &s["point"]);
        let v = common::report_json(std::path::Path::new(path), &[]);
        assert_eq!(v["meta"]["bench_config_hash"], s["config_hash"], "{path}");
        sessions.push(path.to_string());
    }
    // The two configurations side by side.
    let out = common::run_ok(common::vmscope().args([
        "compare",
        "--format",
        "json",
        &sessions[0],
        &sessions[1],
    ]));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = v.to_string();
    for s in &sessions {
        assert!(
            text.contains(s.as_str()),
            "compare does not name {s}: {text}"
        );
    }
}

/// The session named by a summary: under `dir`, annotated with the
/// summary's point and `experiment`, holding rows.
fn check_session(path: &str, dir: &std::path::Path, experiment: &str, point: &Value) {
    assert!(
        std::path::Path::new(path).starts_with(dir),
        "{path} not under --record"
    );
    let v = common::report_json(std::path::Path::new(path), &[]);
    assert_eq!(&v["meta"]["bench_point"], point, "{path}");
    assert_eq!(v["meta"]["bench_experiment"], experiment, "{path}");
    assert!(
        !common::rows(&v).is_empty(),
        "{path}: no rows in the profiled run"
    );
}

#[test]
fn bench_web_records_each_point() {
    if !vmscope_testkit::require_root("a system-wide recording")
        || !vmscope_testkit::require_tools(&[("httperf", "httperf"), ("busybox", "busybox-static")])
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("sessions");
    let out = common::run_ok(
        common::vmscope()
            .args([
                "bench",
                "web",
                "--quiet",
                "--lab",
                "host",
                "--rate",
                "10,20",
                "--seconds",
                "1",
                "--port",
                "8093",
                "--repeat",
                "1",
                "--max-repeat",
                "1",
                "--warmup",
                "0",
                "--busy-retries",
                "0",
                "--no-charts",
                "--format",
                "json",
                "--record-freq",
                "199",
                "--record",
            ])
            .arg(&rec),
    );
    let lines = json_lines(&out.stdout);
    let summaries: Vec<&Value> = lines.iter().filter(|v| v["type"] == "summary").collect();
    assert_eq!(summaries.len(), 2, "{lines:?}");
    let mut names = Vec::new();
    for s in &summaries {
        assert!(s["record_error"].is_null(), "{s}");
        let path = s["session"]
            .as_str()
            .unwrap_or_else(|| panic!("no session named: {s}"));
        check_session(path, &rec, "web", &s["point"]);
        names.push(
            std::path::Path::new(path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        );
    }
    names.sort();
    assert_eq!(names, ["web-host-10-1.db", "web-host-20-1.db"]);
}

#[test]
fn bench_overhead_keeps_each_profiled_run() {
    if !vmscope_testkit::require_root("a system-wide recording") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("kept");
    let out = common::run_ok(
        common::vmscope()
            .args([
                "bench",
                "overhead",
                "--quiet",
                "--profilers",
                "none,host-only",
                "-F",
                "199",
                "--seconds",
                "0.5",
                "--repeat",
                "2",
                "--max-repeat",
                "2",
                "--warmup",
                "1",
                "--busy-retries",
                "0",
                "--format",
                "json",
                "--work-dir",
            ])
            .arg(dir.path().join("work"))
            .arg("--record")
            .arg(&rec),
    );
    let lines = json_lines(&out.stdout);
    let summary = |p: &str| {
        lines
            .iter()
            .find(|v| v["type"] == "summary" && v["profiler"] == p)
            .unwrap_or_else(|| panic!("no {p} summary: {lines:?}"))
    };
    // No profiler, nothing recorded.
    assert_eq!(summary("none")["recordings"], serde_json::json!([]));
    // One session per kept sample; the warm-up's is not kept.
    let s = summary("host-only");
    let kept: Vec<&str> = s["recordings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(kept.len(), 2, "{s}");
    for path in &kept {
        check_session(path, &rec, "overhead", &s["point"]);
    }
    // The profiler's log sits beside each session.
    let in_dir = std::fs::read_dir(&rec)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "db")
        })
        .count();
    assert_eq!(in_dir, 2, "only the kept samples' sessions are in --record");
}

/// The JSON lines a bench printed.
fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
