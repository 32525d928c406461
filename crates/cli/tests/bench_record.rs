//! `--record DIR` on bench points (issue 15 item 5): after its samples each
//! point of `bench scale` runs once more while `vmscope record -a` records
//! it; the session is named in the point's summary and annotated with the
//! point, and `vmscope compare` puts the points side by side. On the host
//! (host-threads, N = 1, 2), so it needs root but no lab.

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
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let summaries: Vec<&Value> = lines.iter().filter(|v| v["type"] == "summary").collect();
    assert_eq!(summaries.len(), 2, "{lines:?}");
    let mut sessions = Vec::new();
    for s in &summaries {
        assert!(s["record_error"].is_null(), "{s}");
        let path = s["session"]
            .as_str()
            .unwrap_or_else(|| panic!("no session named: {s}"));
        assert!(
            std::path::Path::new(path).starts_with(&rec),
            "{path} not under --record"
        );
        // The session says which point it profiled, and holds samples.
        let v = common::report_json(std::path::Path::new(path), &[]);
        assert_eq!(v["meta"]["bench_point"], s["point"], "{path}");
        assert_eq!(v["meta"]["bench_experiment"], "scale", "{path}");
        assert_eq!(v["meta"]["bench_config_hash"], s["config_hash"], "{path}");
        assert!(
            !common::rows(&v).is_empty(),
            "{path}: no rows in the profiled run"
        );
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
