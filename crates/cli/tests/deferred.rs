//! Symbols left for the first read (`--symbolize later`, record's default):
//! the session a first read resolves is the session a recording that
//! resolved while it recorded would have written, row for row; readers
//! that meet at the same session resolve it once; a recording still
//! writing it, or a session from another boot, is said plainly.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// Every stored row of a session's host samples, with its stack's text,
/// in key order; then its bins and lost counts.
fn dump(db: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut out = Vec::new();
    let mut st = c
        .prepare(
            "SELECT s.event, s.domain, s.context, s.process, s.image, s.symbol,
                    coalesce(k.frames, ''), s.srcline, s.second, s.cpu, s.samples, s.period
             FROM samples s LEFT JOIN stacks k ON k.id = s.stack
             ORDER BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
        )
        .unwrap();
    let rows = st
        .query_map([], |r| {
            Ok(format!(
                "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, String>(7)?,
                r.get::<_, i64>(8)?,
                r.get::<_, i64>(9)?,
                r.get::<_, i64>(10)?,
                r.get::<_, i64>(11)?
            ))
        })
        .unwrap();
    out.extend(rows.map(Result::unwrap));
    for q in [
        "SELECT second || '|' || event || '|' || domain || '|' || context || '|' || samples FROM bins ORDER BY 1",
        "SELECT event || '|' || count FROM lost ORDER BY 1",
    ] {
        let mut st = c.prepare(q).unwrap();
        let rows = st.query_map([], |r| r.get::<_, String>(0)).unwrap();
        out.extend(rows.map(Result::unwrap));
    }
    out
}

fn meta(db: &Path, key: &str) -> Option<String> {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .ok()
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// Rows, stacks, frames and strings the first read has not resolved yet.
fn pending_rows(db: &Path) -> i64 {
    count(
        db,
        "SELECT (SELECT count(*) FROM deferred_rows) + (SELECT count(*) FROM deferred_stacks)
              + (SELECT count(*) FROM deferred_frames) + (SELECT count(*) FROM deferred_strings)",
    )
}

/// Import `data` twice, resolving now and later; the later one's first
/// report resolves it; both sessions then hold the same rows.
fn import_both_ways(data: &Path, extra: &[&str]) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let now = dir.path().join("now.db");
    let later = dir.path().join("later.db");
    for (db, when) in [(&now, "now"), (&later, "later")] {
        run_ok(
            vmscope()
                .arg("import")
                .arg(data)
                .arg("-o")
                .arg(db)
                .args(["--symbolize", when])
                .args(extra),
        );
    }
    assert_eq!(meta(&later, "symbols").as_deref(), Some("deferred"));
    assert!(
        count(&later, "SELECT count(*) FROM deferred_rows") > 0,
        "nothing was deferred"
    );
    assert!(count(&later, "SELECT count(*) FROM deferred_frames") > 0);
    assert_eq!(count(&later, "SELECT count(*) FROM samples"), 0);
    assert_eq!(meta(&now, "symbols"), None);
    let first = run_ok(vmscope().arg("report").arg(&later));
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(err.contains("resolved the symbols"), "{err}");
    assert_eq!(meta(&later, "symbols"), None);
    assert_eq!(pending_rows(&later), 0);
    let (a, b) = (dump(&now), dump(&later));
    let differ: Vec<String> = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x != y)
        .take(5)
        .map(|(x, y)| format!("now:   {x}\nlater: {y}"))
        .collect();
    assert!(
        a.len() == b.len() && differ.is_empty(),
        "{} rows resolved now, {} later; first differences:\n{}",
        a.len(),
        b.len(),
        differ.join("\n")
    );
    // Reports alike too, and the second report has nothing left to do.
    for args in [
        &["--by", "image,symbol"][..],
        &["--format", "collapsed"][..],
    ] {
        let r = |db: &Path| {
            let out = run_ok(vmscope().arg("report").arg(db).args(args));
            (
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            )
        };
        let ((x, _), (y, err)) = (r(&now), r(&later));
        // The header names the file and the command (`--symbolize`); its
        // notes (the symbolizer's warnings) and the body must agree.
        let body = |t: &str| -> Vec<String> {
            let mut v: Vec<String> = t
                .lines()
                .filter(|l| !l.starts_with("# session") && !l.starts_with("# command"))
                .map(String::from)
                .collect();
            v.sort();
            v
        };
        let (bx, by) = (body(&x), body(&y));
        let first = bx.iter().zip(&by).find(|(a, b)| a != b);
        assert!(
            bx.len() == by.len() && first.is_none(),
            "{args:?}: {} lines now, {} later; first difference: {first:?}",
            bx.len(),
            by.len()
        );
        assert!(!err.contains("resolved the symbols"), "{err}");
    }
    (dir, a)
}

/// A perf.data from another machine and an older perf (modules, libraries
/// and a kernel that are not this host's: most frames stay hex, resolved
/// later as they were resolved at once).
#[test]
fn a_foreign_perf_data_resolves_later_as_it_does_at_once() {
    let empty = tempfile::tempdir().unwrap();
    let data = fixture_dir().join("perf/quipper.perf.data.callgraph-3.8");
    let (_dir, rows) = import_both_ways(&data, &["--symfs", empty.path().to_str().unwrap()]);
    assert!(rows.len() > 100, "{}", rows.len());
}

/// A perf.data recorded here, with call stacks through the kernel, libc
/// and vmscope's own demo functions (inline frames and source lines from
/// DWARF): every name, stack, inline frame and source line alike.
#[test]
fn a_perf_data_of_this_host_resolves_later_as_it_does_at_once() {
    if skip_unless(&["perf"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("perf.data");
    run_ok(
        Command::new("perf")
            .args([
                "record",
                "--buildid-mmap",
                "-F",
                "2000",
                "-g",
                "-q",
                "-a",
                "-o",
            ])
            .arg(&data)
            .arg("--")
            .arg(bin())
            .args(["demo", "-d", "2"])
            .stdout(Stdio::null()),
    );
    let (_dir, rows) = import_both_ways(&data, &[]);
    let has = |needle: &str| rows.iter().any(|r| r.contains(needle));
    assert!(has("vmscope_demo_alpha"), "no demo function");
    assert!(has("[kernel.kallsyms]"), "no kernel frame");
    assert!(has(".rs:"), "no source line");
}

/// A live recording (record's default) reads as names, and the readers
/// that start on it at once resolve it once between them.
#[test]
fn readers_meeting_at_a_new_recording_resolve_it_once() {
    if skip_unless(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rec.db");
    run_ok(
        vmscope()
            .args(["record", "-F", "999", "-g", "-o"])
            .arg(&db)
            .args(["--", bin().to_str().unwrap(), "demo", "-d", "2"]),
    );
    assert_eq!(meta(&db, "symbols").as_deref(), Some("deferred"));
    assert!(meta(&db, "boot_id").is_some_and(|b| !b.is_empty()));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            vmscope()
                .arg("report")
                .arg(&db)
                .args(["--by", "symbol", "--format", "json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = readers
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let mut resolved = 0;
    for o in &outs {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        resolved += usize::from(err.contains("resolved the symbols"));
    }
    assert_eq!(resolved, 1, "resolved by {resolved} readers");
    assert!(outs.windows(2).all(|w| w[0].stdout == w[1].stdout));
    assert_eq!(pending_rows(&db), 0);
    let v: serde_json::Value = serde_json::from_slice(&outs[0].stdout).unwrap();
    let shares = rows(&v);
    let share = |f: &str| shares.iter().find(|r| r.0 == f).map_or(0.0, |r| r.2);
    let (a, b, c) = (
        share("vmscope_demo_alpha"),
        share("vmscope_demo_beta"),
        share("vmscope_demo_gamma"),
    );
    assert!(a > b && b > c && c > 5.0, "{a} {b} {c}");
}

/// While a recording writes the session, a reader resolves a copy of it
/// (the recording stays as it is and readable as it grows); once the
/// recording ends, the first report resolves the session itself.
#[test]
fn a_session_being_recorded_is_read_through_a_resolved_copy() {
    if skip_unless(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rec.db");
    let mut rec = vmscope()
        .args(["record", "-a", "-g", "-d", "6", "-o"])
        .arg(&db)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let partial = partial(&db);
    let t0 = std::time::Instant::now();
    while meta(&partial, "symbols").is_none() {
        assert!(t0.elapsed().as_secs() < 5, "no deferred rows stored yet");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Its own temporary directory: the copy must be gone after.
    let tmp = tempfile::tempdir().unwrap();
    let out = run_ok(
        vmscope()
            .env("TMPDIR", tmp.path())
            .arg("report")
            .arg(&partial),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        err.contains("in a temporary copy, since it is being written by process")
            && err.contains("first read after that ends"),
        "{err}"
    );
    assert!(text.contains("[kernel.kallsyms]"), "{text}");
    assert!(
        text.contains(&format!("# session   {}", partial.display())),
        "{text}"
    );
    // The recording's own file is untouched.
    assert!(rec.wait().unwrap().success());
    assert_eq!(meta(&db, "symbols").as_deref(), Some("deferred"));
    let out = run_ok(vmscope().arg("report").arg(&db));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("stored in {}", db.display())),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("[kernel.kallsyms]"));
    assert_eq!(pending_rows(&db), 0);
    // No copy left behind.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Kernel addresses of a session recorded under another boot are not
/// looked up in this kernel's symbols (they moved): they stay hex, and the
/// report and the session say why.
#[test]
fn a_session_from_another_boot_keeps_its_kernel_addresses_hex() {
    if skip_unless(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rec.db");
    run_ok(
        vmscope()
            .args(["record", "-a", "-g", "-d", "1", "-o"])
            .arg(&db),
    );
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE meta SET value = 'another-boot' WHERE key = 'boot_id'",
            [],
        )
        .unwrap();
    let v = report_json(&db, &["--by", "image,symbol"]);
    let kernel: Vec<(String, u64, f64)> = rows(&v)
        .into_iter()
        .filter(|r| r.0.starts_with("[kernel.kallsyms]|"))
        .collect();
    assert!(!kernel.is_empty(), "no kernel samples");
    assert!(
        kernel.iter().all(|r| r.0.contains("|0x")),
        "kernel addresses named: {:?}",
        &kernel[..kernel.len().min(5)]
    );
    let w = meta(&db, "warnings").unwrap_or_default();
    assert!(w.contains("another boot"), "{w}");
}
