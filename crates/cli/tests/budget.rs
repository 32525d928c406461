//! `record --overhead-budget`: the host recorder measures what it costs and
//! lowers its rate to stay within the budget; the report header says what
//! profiling cost, the rates used and whether the budget was met.

mod common;

#[test]
fn a_budget_that_cannot_be_met_is_said_and_the_lowest_rate_used() {
    if !vmscope_testkit::require_root("a system-wide recording") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("b.db");
    // 1 ppm of the host's CPU: no recorder can stay within it.
    let out = common::run_ok(common::vmscope().args([
        "record",
        "-a",
        // The calibrated cost of a sample puts the start at the lowest
        // rate, 10 Hz; the budget is said to be missed there only once at
        // least 3 steps there were over.
        "-d",
        "6",
        "-F",
        "999",
        "--overhead-budget",
        "0.0001",
        "-o",
        db.to_str().unwrap(),
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("profiling cost in host")
            && stderr.contains("not met even at the lowest rate (10 Hz)"),
        "{stderr}"
    );
    let v = common::report_json(&db, &[]);
    let line = v["meta"]["profiler_host"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(line.contains(", 10 Hz; budget 0.0001 %"), "{line}");
    let text = common::run_ok(common::vmscope().args(["report", db.to_str().unwrap()]));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("# cost      host: ") && l.contains(", 10 Hz; budget")),
        "{text}"
    );
    // What one sample costs, and where that figure came from.
    assert!(
        text.lines()
            .any(|l| l.starts_with("# cost      host_interrupts: ")
                && l.contains("µs per sample (calibrated ")),
        "{text}"
    );
}

#[test]
fn without_a_budget_the_cost_is_still_reported_at_the_rate_asked_for() {
    if !vmscope_testkit::require_root("a system-wide recording") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("n.db");
    common::run_ok(common::vmscope().args([
        "record",
        "-a",
        "-d",
        "2",
        "-F",
        "99",
        "-o",
        db.to_str().unwrap(),
    ]));
    let v = common::report_json(&db, &[]);
    let line = v["meta"]["profiler_host"].as_str().unwrap_or_default();
    assert!(line.ends_with(", 99 Hz"), "{line}");
    assert!(line.contains("% of the CPU it observed"), "{line}");
    assert!(!line.contains("budget"), "{line}");
}
