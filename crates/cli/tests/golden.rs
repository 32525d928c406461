//! Golden files for every text output of `report`: a change to any of them
//! shows in review as a diff under `tests/golden/`. Two sessions feed them:
//! - a coordinated session built here through the store (host, an active VM
//!   with agent rows and a scale, a passive VM, call stacks, two events,
//!   lost records, an ended VM), so every view and column is exercised;
//! - the perf 3.8 fixture from another machine imported with an empty
//!   kallsyms file (so the host's own kernel symbols never leak in).
//!
//! Run with `VMSCOPE_BLESS=1` to rewrite the files after an intended change,
//! then read the diff.

mod common;
mod sessions;

use common::{fixture_dir, vmscope};
use sessions::coordinated_session;
use std::path::{Path, PathBuf};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compare `actual` with the golden file `name` (or rewrite it when blessing).
fn check(name: &str, actual: &str) -> Option<String> {
    let path = golden_dir().join(name);
    if std::env::var_os("VMSCOPE_BLESS").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return None;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with VMSCOPE_BLESS=1)", path.display()));
    if expected == actual {
        return None;
    }
    let first = expected
        .lines()
        .zip(actual.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(expected.lines().count().min(actual.lines().count()));
    let (e, a) = (
        expected.lines().nth(first).unwrap_or("<end>"),
        actual.lines().nth(first).unwrap_or("<end>"),
    );
    // Long lines (SVG, HTML) are shown around their first difference.
    let at = e
        .chars()
        .zip(a.chars())
        .position(|(x, y)| x != y)
        .unwrap_or(e.chars().count().min(a.chars().count()));
    let part = |s: &str| -> String { s.chars().skip(at.saturating_sub(80)).take(200).collect() };
    Some(format!(
        "{name}: differs from the golden file at line {}, character {}:\n  expected: {:?}\n  actual:   {:?}",
        first + 1,
        at + 1,
        part(e),
        part(a)
    ))
}

/// Run `vmscope report` and return stdout with the machine's paths replaced.
fn report(db: &Path, args: &[&str], replace: &[(&str, &str)]) -> String {
    let out = vmscope()
        .arg("report")
        .arg(db)
        .args(args)
        .output()
        .expect("spawn vmscope");
    assert!(
        out.status.success(),
        "report {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut s = String::from_utf8(out.stdout).expect("utf-8 output");
    for (from, to) in replace {
        s = s.replace(from, to);
    }
    s
}

#[test]
fn report_outputs_match_the_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("coordinated.db");
    coordinated_session(&db, 0);
    let db_b = dir.path().join("coordinated-b.db");
    coordinated_session(&db_b, 1);
    let classes = dir.path().join("classes.toml");
    std::fs::write(
        &classes,
        "# the httpd's own code\n[[rule]]\nclass = \"httpd\"\nimage = \"httpd$\"\ncontext = [\"guest-user\"]\n",
    )
    .unwrap();
    let classes_arg = classes.display().to_string();
    let tmp = dir.path().display().to_string();
    let sub = [(tmp.as_str(), "TMP")];
    let cases: &[(&str, &[&str])] = &[
        ("coordinated-table.txt", &[]),
        ("coordinated-context.txt", &["--by", "context"]),
        (
            "coordinated-domain-context.txt",
            &["--by", "domain,context"],
        ),
        (
            "coordinated-process.txt",
            &["--by", "domain,process", "-e", "cpu-clock"],
        ),
        (
            "coordinated-host-view.txt",
            &["--view", "host", "--by", "domain,context,symbol"],
        ),
        (
            "coordinated-agent-view.txt",
            &["--view", "agent", "--by", "domain,symbol"],
        ),
        (
            "coordinated-domain-web.txt",
            &["--domain", "web", "--limit", "4"],
        ),
        (
            "coordinated-context-filter.txt",
            &["--context", "guest-kernel", "--by", "image,symbol"],
        ),
        (
            "coordinated-min-percent.txt",
            &["--min-percent", "5", "--full-paths"],
        ),
        (
            "coordinated-side-by-side.txt",
            &["--side-by-side", "web", "--by", "image"],
        ),
        ("coordinated.json", &["--format", "json"]),
        (
            "coordinated.csv",
            &["--format", "csv", "--by", "domain,context,symbol"],
        ),
        ("coordinated-collapsed.txt", &["--format", "collapsed"]),
        (
            "coordinated-collapsed-page-faults.txt",
            &["--format", "collapsed", "-e", "page-faults"],
        ),
        ("coordinated-class.txt", &["--by", "domain,class"]),
        (
            "coordinated-classes-file.txt",
            &[
                "--by",
                "domain,class",
                "--classes",
                &classes_arg,
                "-e",
                "cpu-clock",
            ],
        ),
        (
            "coordinated-side-by-side-class.txt",
            &["--side-by-side", "web", "--by", "class"],
        ),
        (
            "coordinated-srcline.txt",
            &[
                "--by",
                "symbol,srcline",
                "--domain",
                "host",
                "-e",
                "cpu-clock",
            ],
        ),
        (
            "coordinated-cpu.txt",
            &["--by", "domain,cpu", "--view", "host", "-e", "cpu-clock"],
        ),
        (
            "coordinated-time.txt",
            &[
                "--time",
                "1s-2s",
                "--by",
                "domain,symbol",
                "-e",
                "cpu-clock",
            ],
        ),
        (
            "coordinated-cpu-slice.txt",
            &["--cpu", "1", "--by", "domain,symbol", "-e", "cpu-clock"],
        ),
        ("coordinated-callers.txt", &["--callers", "send_file"]),
        ("coordinated-callees.txt", &["--callees", "serve"]),
        (
            "coordinated-callers.json",
            &["--callers", "main_loop_wait", "--format", "json"],
        ),
        (
            "coordinated-callees.csv",
            &["--callees", "main", "--format", "csv"],
        ),
        (
            "coordinated-collapsed-web.txt",
            &[
                "--format",
                "collapsed",
                "--domain",
                "web",
                "--view",
                "agent",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (name, args) in cases {
        let text = report(&db, args, &sub);
        failures.extend(check(name, &text));
    }
    // Formats written to files.
    for (name, args) in [
        (
            "coordinated-flamegraph.svg",
            &["--format", "flamegraph"][..],
        ),
        (
            "coordinated-flamegraph-web.svg",
            &["--format", "flamegraph", "--domain", "web"][..],
        ),
        ("coordinated.html", &["--format", "html"][..]),
    ] {
        let out = dir.path().join(name);
        let mut a: Vec<&str> = args.to_vec();
        let o = out.display().to_string();
        a.extend(["-o", &o]);
        report(&db, &a, &sub);
        let text = std::fs::read_to_string(&out).unwrap().replace(&tmp, "TMP");
        failures.extend(check(name, &text));
    }
    // pprof: the decoded profile, in a stable text form.
    let pb = dir.path().join("coordinated.pb.gz");
    report(
        &db,
        &["--format", "pprof", "-o", pb.to_str().unwrap()],
        &sub,
    );
    failures.extend(check(
        "coordinated-pprof.txt",
        &pprof_text(&pb).replace(&tmp, "TMP"),
    ));
    // compare: the base against the other configuration.
    for (name, fmt) in [
        ("compare.txt", "table"),
        ("compare.json", "json"),
        ("compare.csv", "csv"),
    ] {
        let svg = dir.path().join("compare.svg");
        let out = vmscope()
            .arg("compare")
            .arg(&db)
            .arg(&db_b)
            .args(["--format", fmt, "--by", "domain,symbol", "--svg"])
            .arg(&svg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "compare: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap().replace(&tmp, "TMP");
        failures.extend(check(name, &text));
        let svg = std::fs::read_to_string(&svg).unwrap().replace(&tmp, "TMP");
        failures.extend(check("compare.svg", &svg));
    }
    let out = vmscope()
        .arg("compare")
        .arg(&db)
        .arg(&db_b)
        .args(["--by", "domain,class", "--throughput", "100,90"])
        .output()
        .unwrap();
    failures.extend(check(
        "compare-class.txt",
        &String::from_utf8(out.stdout).unwrap().replace(&tmp, "TMP"),
    ));

    // The imported perf 3.8 fixture.
    let fixture = fixture_dir().join("perf/quipper.perf.data.callgraph-3.8");
    let kallsyms = dir.path().join("empty.kallsyms");
    std::fs::write(&kallsyms, "").unwrap();
    let q = dir.path().join("quipper.db");
    let out = vmscope()
        .current_dir(dir.path())
        .arg("import")
        .arg(&fixture)
        .args(["-o", "quipper.db", "--kallsyms", "empty.kallsyms"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = common::bin().display().to_string();
    let fix = fixture.display().to_string();
    let sub = [
        (bin.as_str(), "vmscope"),
        (fix.as_str(), "FIXTURE"),
        (tmp.as_str(), "TMP"),
    ];
    let cases: &[(&str, &[&str])] = &[
        ("quipper-table.txt", &["--limit", "25"]),
        ("quipper-class.txt", &["--by", "class", "--limit", "15"]),
        (
            "quipper-callers.txt",
            &[
                "--callers",
                "0xffffffff9661da49",
                "--depth",
                "3",
                "--limit",
                "8",
            ],
        ),
        ("quipper-context.txt", &["--by", "context"]),
        ("quipper-process.txt", &["--by", "process", "--limit", "15"]),
        ("quipper-image.txt", &["--by", "image"]),
        (
            "quipper-side-by-side.txt",
            &["--side-by-side", "host", "--limit", "8"],
        ),
        (
            "quipper.csv",
            &["--format", "csv", "--by", "process,image", "--limit", "30"],
        ),
        ("quipper-collapsed.txt", &["--format", "collapsed"]),
    ];
    for (name, args) in cases {
        let text = report(&q, args, &sub);
        failures.extend(check(name, &text));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A pprof file as text: sample types, then every sample with its labels
/// and its frames (leaf first: function, source line, mapping, build-id).
fn pprof_text(path: &Path) -> String {
    use prost::Message;
    use std::fmt::Write;
    use std::io::Read;
    let mut gz = flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap());
    let mut raw = Vec::new();
    gz.read_to_end(&mut raw).unwrap();
    let p = vmscope_report::pprof::Profile::decode(raw.as_slice()).unwrap();
    let st = |i: i64| p.string_table[i as usize].clone();
    let mut out = String::new();
    for t in &p.sample_type {
        let _ = writeln!(out, "sample_type {}/{}", st(t.r#type), st(t.unit));
    }
    let _ = writeln!(
        out,
        "default {} period {} duration_ns {} time_ns {}",
        st(p.default_sample_type),
        p.period,
        p.duration_nanos,
        p.time_nanos
    );
    let mut samples: Vec<String> = p
        .sample
        .iter()
        .map(|s| {
            let labels: Vec<String> = s
                .label
                .iter()
                .map(|l| {
                    if l.str != 0 {
                        format!("{}={}", st(l.key), st(l.str))
                    } else {
                        format!("{}={}", st(l.key), l.num)
                    }
                })
                .collect();
            let frames: Vec<String> = s
                .location_id
                .iter()
                .map(|id| {
                    let loc = &p.location[*id as usize - 1];
                    let lines: Vec<String> = loc
                        .line
                        .iter()
                        .map(|l| {
                            let f = &p.function[l.function_id as usize - 1];
                            if l.line > 0 {
                                format!("{}@{}:{}", st(f.name), st(f.filename), l.line)
                            } else {
                                st(f.name)
                            }
                        })
                        .collect();
                    let map = if loc.mapping_id > 0 {
                        let m = &p.mapping[loc.mapping_id as usize - 1];
                        format!(" [{} {}]", st(m.filename), st(m.build_id))
                    } else {
                        String::new()
                    };
                    format!("{}{map}", lines.join("+"))
                })
                .collect();
            format!(
                "{:?} {} | {}",
                s.value,
                labels.join(","),
                frames.join(" < ")
            )
        })
        .collect();
    samples.sort();
    for s in samples {
        let _ = writeln!(out, "{s}");
    }
    out
}

/// `vmscope topo` on the hand-built NUMA trees of vmscope-linux
/// (`crates/linux/tests/fixtures/numa`): two nodes with a VM whose memory
/// is remote (flagged) and one local, four nodes with a memory-only node,
/// and a kernel without `/sys/devices/system/node` (one node synthesized).
/// Run from the fixture directory with relative roots, so the paths the
/// text names are the same on every machine.
#[test]
fn topo_golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../linux/tests/fixtures/numa");
    let mut failures = Vec::new();
    for tree in ["two-node", "four-node", "no-node"] {
        for (format, ext) in [("table", "txt"), ("json", "json")] {
            let out = vmscope()
                .current_dir(&dir)
                .args(["topo", "--no-qmp", "--format", format])
                .args(["--proc-root", &format!("{tree}/proc")])
                .args(["--sys-root", &format!("{tree}/sys")])
                .output()
                .expect("spawn vmscope");
            assert!(
                out.status.success(),
                "topo {tree} {format}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8(out.stdout).expect("utf-8 output");
            failures.extend(check(&format!("topo-{tree}.{ext}"), &text));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
