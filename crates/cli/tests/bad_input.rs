//! Issue 3 item 10: every bad input gives one clear line naming the input,
//! exit code 2, no panic, and no half-written file that looks complete.

mod common;
use common::*;
use std::path::Path;
use std::process::Output;

fn fails_clearly(out: &Output, must_contain: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "exit code; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("vmscope: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    for m in must_contain {
        assert!(err.contains(m), "expected '{m}' in: {err}");
    }
    err
}

#[test]
fn unknown_event() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let out = vmscope()
        .args(["record", "-e", "bogus-event", "-o"])
        .arg(&db)
        .args(["--", "true"])
        .output()
        .unwrap();
    fails_clearly(&out, &["unknown event 'bogus-event'", "cpu-clock"]);
    assert!(!db.exists());
}

#[test]
fn hardware_event_missing_lists_working_events() {
    if skip_unless(&["perf"]) {
        return;
    }
    // Only meaningful where the PMU lacks the event (as on this kind of machine).
    let probe = std::process::Command::new("perf")
        .args(["stat", "-e", "instructions", "true"])
        .output()
        .unwrap();
    if String::from_utf8_lossy(&probe.stderr).contains("<not supported>") || !probe.status.success()
    {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        let out = vmscope()
            .args(["record", "-e", "instructions", "-o"])
            .arg(&db)
            .args(["--", "true"])
            .output()
            .unwrap();
        fails_clearly(&out, &["instructions", "not supported", "cpu-clock"]);
        assert!(!db.exists(), "no session file may be left behind");
    } else {
        skip_platform("this machine has a hardware PMU; the missing-event path is not reachable");
    }
}

#[test]
fn no_such_pid() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let out = vmscope()
        .args(["record", "-p", "999999999", "-d", "1", "-o"])
        .arg(&db)
        .output()
        .unwrap();
    fails_clearly(&out, &["no such process: 999999999"]);
    assert!(!db.exists());
}

#[test]
fn no_permission_names_what_is_needed() {
    if !vmscope_testkit::require_root("dropping to an unprivileged user")
        || !vmscope_testkit::require_tools(&[("setpriv", "util-linux")])
    {
        return;
    }
    let paranoid =
        std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
    if paranoid.trim().parse::<i32>().unwrap_or(2) < 0 {
        skip_platform("perf_event_paranoid < 0 lets anyone profile system-wide");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let db = dir.path().join("x.db");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["record", "-a", "-d", "1", "-o"])
        .arg(&db)
        .output()
        .unwrap();
    fails_clearly(&out, &["perf_event_paranoid", "CAP_PERFMON"]);
    assert!(!db.exists());
}

#[test]
fn output_not_writable() {
    let out = vmscope()
        .args(["record", "-o", "/proc/no-such-dir/x.db", "--", "true"])
        .output()
        .unwrap();
    fails_clearly(&out, &["/proc/no-such-dir/x.db"]);
}

#[test]
fn truncated_and_foreign_perf_data() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture_dir().join("perf/quipper.perf.data.callgraph-3.8");
    let bytes = std::fs::read(&fixture).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated.data", bytes[..bytes.len() / 3].to_vec()),
        ("header-only.data", bytes[..64].to_vec()),
        (
            "text.data",
            b"this is a text file, not perf data\n".to_vec(),
        ),
        ("elf.data", std::fs::read(bin()).unwrap()[..4096].to_vec()),
        ("empty.data", Vec::new()),
    ];
    for (name, content) in cases {
        let input = dir.path().join(name);
        std::fs::write(&input, content).unwrap();
        let db = dir.path().join(format!("{name}.db"));
        let out = vmscope()
            .arg("import")
            .arg(&input)
            .arg("-o")
            .arg(&db)
            .output()
            .unwrap();
        fails_clearly(&out, &[name]);
        assert!(!db.exists(), "{name}: no session may be left");
        assert!(!Path::new(&format!("{}.partial", db.display())).exists());
    }
}

#[test]
fn corrupt_and_newer_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.db");
    std::fs::write(&text, "not a database").unwrap();
    let out = vmscope().arg("report").arg(&text).output().unwrap();
    fails_clearly(&out, &["text.db", "not a vmscope session"]);

    // A real session, then with a newer schema version.
    let good = dir.path().join("good.db");
    let data = fixture_dir().join("perf/quipper.perf.data.callgraph-3.8");
    run_ok(vmscope().arg("import").arg(&data).arg("-o").arg(&good));
    let newer = dir.path().join("newer.db");
    std::fs::copy(&good, &newer).unwrap();
    let st = std::process::Command::new("sqlite3")
        .arg(&newer)
        .arg("PRAGMA user_version = 99;")
        .status();
    if st.map(|s| s.success()).unwrap_or(false) {
        let out = vmscope().arg("report").arg(&newer).output().unwrap();
        fails_clearly(&out, &["newer.db", "newer than this vmscope"]);
    } else {
        skip("sqlite3 CLI missing (apt-get install sqlite3): the newer-schema case is not run");
    }

    // Damaged pages after the header.
    let corrupt = dir.path().join("corrupt.db");
    let mut b = std::fs::read(&good).unwrap();
    let n = b.len();
    for x in b.iter_mut().take(n).skip(4096) {
        *x ^= 0x5a;
    }
    std::fs::write(&corrupt, b).unwrap();
    let out = vmscope().arg("report").arg(&corrupt).output().unwrap();
    fails_clearly(&out, &["corrupt.db"]);

    let out = vmscope()
        .arg("report")
        .arg(dir.path().join("missing.db"))
        .output()
        .unwrap();
    fails_clearly(&out, &["missing.db", "no such session file"]);
}

#[test]
fn bad_report_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.db");
    run_ok(
        vmscope()
            .arg("import")
            .arg(fixture_dir().join("perf/quipper.perf.data.callgraph-3.8"))
            .arg("-o")
            .arg(&good),
    );
    let out = vmscope()
        .arg("report")
        .arg(&good)
        .args(["--by", "domain,colour"])
        .output()
        .unwrap();
    fails_clearly(&out, &["unknown field 'colour'"]);
    let out = vmscope()
        .arg("report")
        .arg(&good)
        .args(["--event", "instructions"])
        .output()
        .unwrap();
    fails_clearly(&out, &["'instructions' is not in this session", "cycles"]);
    let out = vmscope()
        .arg("report")
        .arg(&good)
        .args(["--format", "xml"])
        .output()
        .unwrap();
    fails_clearly(&out, &["unknown format 'xml'"]);
}

mod sessions;

fn report(db: &Path, args: &[&str]) -> Output {
    vmscope().arg("report").arg(db).args(args).output().unwrap()
}

#[test]
fn flame_graph_and_callers_without_call_stacks_say_what_record_g_gives() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flat.db");
    sessions::flat_session(&db, "cpu-clock");
    let svg = dir.path().join("f.svg");
    let out = report(
        &db,
        &["--format", "flamegraph", "-o", svg.to_str().unwrap()],
    );
    fails_clearly(
        &out,
        &["needs call stacks", "record -g", "each sample's stack"],
    );
    assert!(!svg.exists(), "no file may be left behind");
    let out = report(&db, &["--callers", "alpha"]);
    fails_clearly(&out, &["--callers needs call stacks", "-g"]);
    // File formats need -o.
    for f in ["flamegraph", "pprof", "html"] {
        let out = report(&db, &["--format", f]);
        fails_clearly(&out, &[f, "give -o FILE"]);
    }
    let g = dir.path().join("g.db");
    sessions::coordinated_session(&g, 0);
    let out = report(&g, &["--callers", "no_such_function"]);
    fails_clearly(&out, &["'no_such_function'", "--by symbol"]);
}

#[test]
fn compare_of_sessions_with_different_events() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.db");
    let b = dir.path().join("b.db");
    sessions::flat_session(&a, "cpu-clock");
    sessions::flat_session(&b, "instructions");
    let out = vmscope().arg("compare").arg(&a).arg(&b).output().unwrap();
    fails_clearly(
        &out,
        &[
            "no event in common",
            "has cpu-clock",
            "has instructions",
            "same -e events",
        ],
    );
    // Some events in common: those are compared, the rest named.
    let c = dir.path().join("c.db");
    sessions::coordinated_session(&c, 0);
    let out = vmscope().arg("compare").arg(&c).arg(&a).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("# not compared: page-faults: recorded in") && text.contains("cpu-clock"),
        "{text}"
    );
    let out = vmscope()
        .arg("compare")
        .arg(&c)
        .arg(&a)
        .args(["--throughput", "1,2,3"])
        .output()
        .unwrap();
    fails_clearly(&out, &["--throughput has 3 values for 2 sessions"]);
    let out = vmscope().arg("compare").arg(&c).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "one session is not a comparison"
    );
}

#[test]
fn class_rules_with_errors_name_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    sessions::flat_session(&db, "cpu-clock");
    let rules = dir.path().join("classes.toml");
    for (text, want) in [
        (
            "[[rule]]\nclass = \"x\"\nsymbol = \"^(unclosed\"\n",
            &[
                "classes.toml:3:10:",
                "'symbol' is not a valid regular expression",
            ][..],
        ),
        (
            "[[rule]]\nclass = \"x\"\nsymbl = \"a\"\n",
            &["classes.toml:3:1:", "symbl"][..],
        ),
        (
            "[[rule]]\nclass = \"x\"\nsymbol = \"a\"\ncontext = [\"kernal\"]\n",
            &["classes.toml:4:12:", "unknown context 'kernal'"][..],
        ),
        (
            "[[rule]]\nclass = \"x\nsymbol = \"a\"\n",
            &["classes.toml:2:"][..],
        ),
    ] {
        std::fs::write(&rules, text).unwrap();
        let out = report(
            &db,
            &["--by", "class", "--classes", rules.to_str().unwrap()],
        );
        fails_clearly(&out, want);
    }
    let out = report(&db, &["--by", "class", "--classes", "/nonexistent/c.toml"]);
    fails_clearly(&out, &["/nonexistent/c.toml", "cannot read"]);
}

#[test]
fn time_and_cpu_slices_outside_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    sessions::flat_session(&db, "cpu-clock");
    let out = report(&db, &["--time", "100s-200s"]);
    fails_clearly(
        &out,
        &["--time 100s-200s", "after the session ends", "0 s to 3.0 s"],
    );
    let out = report(&db, &["--time", "20s-10s"]);
    fails_clearly(&out, &["not after the start"]);
    let out = report(&db, &["--time", "soon"]);
    fails_clearly(&out, &["--time soon", "START-END"]);
    let out = report(&db, &["--cpu", "7"]);
    fails_clearly(&out, &["--cpu 7", "CPU 7 is not in this session", "0-1"]);
    let out = report(&db, &["--cpu", "x"]);
    fails_clearly(&out, &["--cpu x", "not a CPU number"]);
    // A session from before time and CPU were kept says so.
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute("DELETE FROM meta WHERE key = 'created_schema'", [])
        .unwrap();
    drop(c);
    let out = report(&db, &["--time", "0-1"]);
    fails_clearly(
        &out,
        &[
            "--time cannot slice this session",
            "schema 2",
            "record or import it again",
        ],
    );
    let out = report(&db, &["--cpu", "0"]);
    fails_clearly(&out, &["--cpu cannot slice this session"]);
}
