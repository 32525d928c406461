//! Issue 3 item 8: vmscope agrees with perf on the built-in demo workload,
//! and an imported perf.data gives exactly perf report's per-symbol counts.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

const DEMO: [&str; 3] = [
    "vmscope_demo_alpha",
    "vmscope_demo_beta",
    "vmscope_demo_gamma",
];

/// Parse `perf report --stdio -n --no-children --sort dso,sym` lines:
/// `    49.93%          1234  vmscope  [.] vmscope_demo_alpha`.
fn perf_report_counts(data: &std::path::Path) -> BTreeMap<(String, String), (u64, f64)> {
    let out = run_ok(Command::new("perf").args([
        "report",
        "-i",
        data.to_str().unwrap(),
        "--stdio",
        "-n",
        "--no-children",
        "-g",
        "none",
        "--sort",
        "dso,sym",
    ]));
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = t.split_whitespace().collect();
        if parts.len() < 5 || !parts[0].ends_with('%') {
            continue;
        }
        let pct: f64 = parts[0].trim_end_matches('%').parse().unwrap();
        let n: u64 = parts[1].parse().unwrap();
        let dso = parts[2].to_string();
        // parts[3] is [.] or [k]; the symbol may contain spaces.
        let sym = parts[4..].join(" ");
        let e = m.entry((dso, sym)).or_insert((0, 0.0));
        e.0 += n;
        e.1 += pct;
    }
    m
}

#[test]
fn demo_shares_agree_with_perf_and_import_is_exact() {
    if skip_unless(&["perf"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rec.db");
    let data = dir.path().join("perf.data");
    let demo = bin();

    // One run of the workload with both profilers on it at once: what
    // moves from run to run (on this shared machine a profiler's split of
    // the demo moved by several points at times, under either profiler)
    // then moves for both, and only their own sampling differs.
    let mut workload = Command::new(&demo)
        .args(["demo", "-d", "12"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = workload.id().to_string();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ours_run = vmscope()
        .args(["record", "-F", "999", "-g", "-d", "8", "-p", &pid, "-o"])
        .arg(&db)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let perf_run = Command::new("perf")
        // --buildid-mmap: immune to the build-id bit the kernel leaks
        // from other sessions (crates/perfdata/tests/live.rs).
        .args([
            "record",
            "--buildid-mmap",
            "-F",
            "999",
            "-g",
            "-q",
            "-p",
            &pid,
            "-o",
        ])
        .arg(&data)
        .args(["--", "sleep", "8"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (what, child) in [("vmscope record", ours_run), ("perf record", perf_run)] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = workload.kill();
    let _ = workload.wait();

    // 1. Shares of the three demo functions, both profilers on one run.
    let ours = rows(&report_json(&db, &["--by", "symbol"]));
    let theirs = perf_report_counts(&data);
    let perf_share = |f: &str| -> f64 {
        theirs
            .iter()
            .filter(|((_, s), _)| s == f)
            .map(|(_, v)| v.1)
            .sum()
    };
    let our_share = |f: &str| -> f64 { ours.iter().filter(|r| r.0 == f).map(|r| r.2).sum() };
    let mut lines = Vec::new();
    for f in DEMO {
        let (a, b) = (our_share(f), perf_share(f));
        lines.push(format!(
            "{f}: vmscope {a:.2}% perf {b:.2}% diff {:.2} points",
            (a - b).abs()
        ));
    }
    eprintln!("{}", lines.join("\n"));
    // The known answer: about 50/30/20 of the workload's CPU.
    assert!(
        our_share(DEMO[0]) > our_share(DEMO[1]) && our_share(DEMO[1]) > our_share(DEMO[2]),
        "{lines:?}"
    );
    // Each profiler's samples are a draw of their own: their shares may
    // differ by sampling alone. Allowed: 4 standard errors of the
    // difference of two binomial shares (about 3 points at the 8 000
    // samples each takes here), at least 2. A fixed 3 points at 3 000
    // samples each was 2.3 standard errors: it failed on sampling noise
    // alone in 1 of 8 runs here.
    let n_ours: u64 = ours.iter().map(|r| r.1).sum();
    let n_perf: u64 = theirs.values().map(|v| v.0).sum();
    for f in DEMO {
        let (a, b) = (our_share(f), perf_share(f));
        let p = (a + b) / 200.0;
        let se = 100.0 * (p * (1.0 - p) * (1.0 / n_ours as f64 + 1.0 / n_perf as f64)).sqrt();
        let tol = (4.0 * se).max(2.0);
        if a > 5.0 || b > 5.0 {
            assert!(
                (a - b).abs() <= tol,
                "{f} differs by more than {tol:.2} points ({n_ours} and {n_perf} samples): {lines:?}"
            );
        }
    }

    // 2. The same perf.data imported: per-symbol sample counts identical.
    let imported = dir.path().join("imp.db");
    run_ok(vmscope().arg("import").arg(&data).arg("-o").arg(&imported));
    let ours = rows(&report_json(&imported, &["--by", "image,symbol"]));
    let mut our_counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (k, n, _) in &ours {
        let (img, sym) = k.split_once('|').unwrap();
        *our_counts
            .entry((img.to_string(), sym.to_string()))
            .or_default() += n;
    }
    let mut compared = 0;
    let mut mismatches = Vec::new();
    for ((dso, sym), (n, _)) in &theirs {
        if sym.starts_with("0x") {
            continue; // unresolved addresses: perf prints one row per address
        }
        compared += 1;
        let mine = our_counts
            .get(&(dso.clone(), sym.clone()))
            .copied()
            .unwrap_or(0);
        if mine != *n {
            mismatches.push(format!("{dso} {sym}: perf {n} vmscope {mine}"));
        }
    }
    eprintln!(
        "compared {compared} symbols with perf report; {} mismatches",
        mismatches.len()
    );
    assert!(compared >= 3, "perf resolved too few symbols: {theirs:?}");
    assert!(
        mismatches.is_empty(),
        "per-symbol counts differ:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn call_stacks_reach_the_demo_functions() {
    if skip_unless(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("g.db");
    run_ok(
        vmscope()
            .args(["record", "-F", "999", "-g", "-o"])
            .arg(&db)
            .arg("--")
            .arg(bin())
            .args(["demo", "-d", "1"]),
    );
    // The frames the unwinder walked, as perf shows them with --no-inline.
    let out =
        run_ok(
            vmscope()
                .arg("report")
                .arg(&db)
                .args(["--format", "collapsed", "--no-inline"]),
        );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("vmscope_demo_alpha"))
        .unwrap_or_else(|| panic!("no stack through vmscope_demo_alpha:\n{text}"));
    // With inline frames (vmscope carries DWARF line tables), the functions
    // inlined into the demo function sit above it, marked `_[i]`; the real
    // frames are the same.
    let with_inline = run_ok(
        vmscope()
            .arg("report")
            .arg(&db)
            .args(["--format", "collapsed"]),
    );
    let inl = String::from_utf8_lossy(&with_inline.stdout);
    assert!(
        inl.lines()
            .any(|l| l.contains(";vmscope_demo_alpha;") && l.contains("_[i]")),
        "no inlined frame above vmscope_demo_alpha:\n{inl}"
    );
    let real = |l: &str| -> String {
        let (frames, n) = l.rsplit_once(' ').unwrap();
        let kept: Vec<&str> = frames.split(';').filter(|f| !f.ends_with("_[i]")).collect();
        format!("{} {n}", kept.join(";"))
    };
    let mut a: Vec<String> = inl.lines().map(real).collect();
    let mut b: Vec<String> = text.lines().map(str::to_string).collect();
    a.sort();
    b.sort();
    let total = |v: &[String]| -> u64 {
        v.iter()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(total(&a), total(&b), "inline frames changed the counts");
    // Root first, leaf last, with callers above the demo function. (A leaf
    // function without its own frame hides its direct caller from any
    // frame-pointer unwinder, perf's included, so either caller may show.)
    assert!(
        line.ends_with(&format!(
            "vmscope_demo_alpha {}",
            line.rsplit(' ').next().unwrap()
        )),
        "{line}"
    );
    let frames: Vec<&str> = line.rsplit_once(' ').unwrap().0.split(';').collect();
    let caller = frames[frames.len().saturating_sub(2)];
    assert!(
        caller.contains("worker") || caller.contains("__rust_begin_short_backtrace"),
        "the caller of vmscope_demo_alpha is {caller}: {line}"
    );
    assert!(
        line.contains("start_thread") || line.contains("clone"),
        "stack does not reach the thread start: {line}"
    );
}

#[test]
fn a_process_that_starts_and_exits_during_the_run_still_resolves() {
    if skip_unless(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("short.db");
    let mut rec = vmscope()
        .args(["record", "-a", "-F", "999", "-d", "4", "-o"])
        .arg(&db)
        .spawn()
        .unwrap();
    // Start the workload once the recorder samples, and let it end well
    // before the recording does.
    wait_for_samples(&db);
    run_ok(vmscope().args(["demo", "-d", "1"]));
    assert!(rec.wait().unwrap().success());
    let ours = rows(&report_json(&db, &["--by", "process,symbol"]));
    let alpha: u64 = ours
        .iter()
        .filter(|r| r.0.ends_with("|vmscope_demo_alpha"))
        .map(|r| r.1)
        .sum();
    assert!(
        alpha > 100,
        "the exited process's samples did not resolve: {:?}",
        &ours[..ours.len().min(10)]
    );
}
