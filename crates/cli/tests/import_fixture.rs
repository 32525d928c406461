//! Issue 3 item 7: a perf.data recorded on another machine by an older perf
//! imports with the per-process and per-binary shares of the reference
//! table in testdata/perf/README.md, within 0.1 point.

mod common;
use common::*;

#[test]
fn quipper_shares_match_reference() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let empty = tempfile::tempdir().unwrap();
    run_ok(
        vmscope()
            .arg("import")
            .arg(fixture_dir().join("perf/quipper.perf.data.callgraph-3.8"))
            .arg("-o")
            .arg(&db)
            .arg("--symfs")
            .arg(empty.path()),
    );
    let by_comm = rows(&report_json(&db, &["--by", "process"]));
    let pct = |rows: &[(String, u64, f64)], k: &str| {
        rows.iter().find(|r| r.0 == k).map(|r| r.2).unwrap_or(0.0)
    };
    for (comm, want) in [
        ("chrome", 55.44),
        ("Compositor", 19.92),
        ("swapper", 19.25),
        ("shill", 1.33),
    ] {
        let got = pct(&by_comm, comm);
        assert!(
            (got - want).abs() <= 0.1,
            "{comm}: {got:.2} vs reference {want}"
        );
    }
    let by_dso = rows(&report_json(&db, &["--by", "process,image"]));
    for (key, want) in [
        ("chrome|chrome", 49.06),
        ("swapper|[kernel.kallsyms]", 18.80),
        ("Compositor|chrome", 12.18),
        ("Compositor|[kernel.kallsyms]", 5.56),
        ("chrome|[kernel.kallsyms]", 3.95),
        ("shill|libglib-2.0.so.0.3400.3", 1.21),
        ("kworker/0:1|[kernel.kallsyms]", 0.97),
        ("chrome|libpthread-2.15.so", 0.91),
        ("Compositor|libstdc++.so.6.0.17", 0.63),
        ("Compositor|libpthread-2.15.so", 0.50),
    ] {
        let got = pct(&by_dso, key);
        assert!(
            (got - want).abs() <= 0.1,
            "{key}: {got:.2} vs reference {want}"
        );
    }
    let v = report_json(&db, &[]);
    assert_eq!(v["events"][0]["samples"].as_u64(), Some(1768));
    assert_eq!(v["events"][0]["name"].as_str(), Some("cycles"));
}
