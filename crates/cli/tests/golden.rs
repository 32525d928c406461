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

use common::{fixture_dir, vmscope};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vmscope_model::{AggKey, Context, Domain, Profile, Role, SessionEvent};
use vmscope_store::{DomainRecord, ScaleRow, SessionWriter};

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
    Some(format!(
        "{name}: differs from the golden file at line {}:\n  expected: {:?}\n  actual:   {:?}",
        first + 1,
        expected.lines().nth(first).unwrap_or("<end>"),
        actual.lines().nth(first).unwrap_or("<end>")
    ))
}

fn key(
    event: u32,
    domain: &str,
    context: Context,
    process: &str,
    image: &str,
    symbol: &str,
    stack: &str,
) -> AggKey {
    AggKey {
        event,
        domain: Arc::from(domain),
        context,
        process: Arc::from(process),
        image: Arc::from(image),
        symbol: Arc::from(symbol),
        stack: Arc::from(stack),
        srcline: Arc::from(""),
        second: 0,
        cpu: 0,
    }
}

/// A session with everything a report can show, built without recording.
/// `variant` 1 is the same machine in another configuration (for
/// `compare`): the guest's request parsing costs more, the host's make less.
fn coordinated_session(path: &Path, variant: u32) {
    use Context::*;
    type Row<'a> = (
        u32,
        &'a str,
        Context,
        &'a str,
        &'a str,
        &'a str,
        &'a str,
        u64,
        u64,
    );
    let mut w = SessionWriter::create(path).unwrap();
    for (k, v) in [
        ("vmscope_version", "golden"),
        ("source", "record"),
        ("command", "vmscope record -a -g -d 2 --vm web=active"),
        ("hostname", "golden-host"),
        ("kernel", "6.1.0-golden"),
        ("cpus", "2"),
        ("duration_s", "2.000"),
        ("started_at", "1700000000"),
        ("vms", "2"),
        ("accel", "tcg"),
        ("agent_db", "passive: no hello on /run/db.sock: timed out"),
    ] {
        w.set_meta(k, v).unwrap();
    }
    w.set_events(&[
        SessionEvent {
            name: "cpu-clock".into(),
            period: None,
            frequency: Some(1000),
        },
        SessionEvent {
            name: "page-faults".into(),
            period: Some(1),
            frequency: None,
        },
    ])
    .unwrap();
    let domains = [
        (Domain::host(), "running", None, ""),
        (
            Domain {
                name: "web".into(),
                role: Role::Active,
                pid: Some(4100),
            },
            "running",
            None,
            "2 vCPU thread(s), 1 I/O thread(s), accelerator tcg",
        ),
        (
            Domain {
                name: "db".into(),
                role: Role::Passive,
                pid: Some(5200),
            },
            "ended",
            Some(1.5),
            "1 vCPU thread(s), accelerator tcg; exited at 1.50 s",
        ),
    ];
    for (domain, status, ended_at, detail) in domains {
        w.upsert_domain(&DomainRecord {
            domain,
            status: status.into(),
            ended_at,
            detail: detail.into(),
        })
        .unwrap();
    }
    let ms = 1_000_000u64;
    let mut host = Profile::new();
    let host_rows: &[Row] = &[
        (
            0,
            "host",
            HostUser,
            "make",
            "/usr/bin/make",
            "main",
            "_start;main",
            40,
            40 * ms,
        ),
        (
            0,
            "host",
            HostUser,
            "make",
            "/usr/bin/make",
            "hash_find",
            "_start;main;hash_find",
            25,
            25 * ms,
        ),
        (
            0,
            "host",
            HostKernel,
            "make",
            "[kernel.kallsyms]",
            "clear_page_erms",
            "_start;main;asm_exc_page_fault;clear_page_erms",
            15,
            15 * ms,
        ),
        (
            0,
            "host",
            HostKernel,
            "kworker/0:1",
            "[kernel.kallsyms]",
            "process_one_work",
            "ret_from_fork;kthread;process_one_work",
            6,
            6 * ms,
        ),
        (
            0,
            "host",
            HostKernel,
            "kworker/0:1",
            "[e1000e]",
            "e1000_clean",
            "ret_from_fork;kthread;e1000_clean",
            4,
            4 * ms,
        ),
        (
            0,
            "host",
            Idle,
            "swapper",
            "[kernel.kallsyms]",
            "default_idle",
            "",
            300,
            300 * ms,
        ),
        (
            0,
            "web",
            GuestTranslated,
            "CPU 0/TCG",
            "[anon]",
            "[translated guest code]",
            "",
            900,
            900 * ms,
        ),
        (
            0,
            "web",
            GuestTranslated,
            "CPU 1/TCG",
            "[anon]",
            "[translated guest code]",
            "",
            500,
            500 * ms,
        ),
        (
            0,
            "web",
            VmmUser,
            "CPU 0/TCG",
            "/usr/bin/qemu-system-x86_64",
            "cpu_exec",
            "start_thread;cpu_exec",
            120,
            120 * ms,
        ),
        (
            0,
            "web",
            VmmUser,
            "qemu-system-x86",
            "/usr/bin/qemu-system-x86_64",
            "main_loop_wait",
            "main;main_loop_wait",
            30,
            30 * ms,
        ),
        (
            0,
            "web",
            VmmKernel,
            "CPU 0/TCG",
            "[kernel.kallsyms]",
            "do_syscall_64",
            "start_thread;ioctl;do_syscall_64",
            20,
            20 * ms,
        ),
        (
            0,
            "db",
            GuestTranslated,
            "CPU 0/TCG",
            "[anon]",
            "[translated guest code]",
            "",
            700,
            700 * ms,
        ),
        (
            0,
            "db",
            VmmUser,
            "CPU 0/TCG",
            "/usr/bin/qemu-system-x86_64",
            "tb_gen_code",
            "start_thread;tb_gen_code",
            60,
            60 * ms,
        ),
        (
            1,
            "host",
            HostUser,
            "make",
            "/usr/bin/make",
            "main",
            "_start;main",
            12,
            12,
        ),
        (
            1,
            "web",
            VmmUser,
            "qemu-system-x86",
            "/usr/bin/qemu-system-x86_64",
            "main_loop_wait",
            "main;main_loop_wait",
            3,
            3,
        ),
    ];
    for (i, &(e, d, c, p, img, s, st, n, period)) in host_rows.iter().enumerate() {
        let mut k = key(e, d, c, p, img, s, st);
        // Time and CPU: rows alternate between seconds 0 and 1 and CPUs 0 and 1.
        k.second = (i % 2) as u32;
        k.cpu = ((i / 2) % 2) as u32;
        if s == "main" || s == "hash_find" {
            k.srcline = Arc::from(if s == "main" {
                "/src/make/main.c:42"
            } else {
                "/src/make/hash.c:7"
            });
        }
        let (n, period) = match (variant, s) {
            (1, "main") => (n / 2, period / 2),
            _ => (n, period),
        };
        host.add(k, n, period);
    }
    for (sec, d, c, n) in [
        (0, "host", HostUser, 30),
        (1, "host", HostUser, 35),
        (0, "web", GuestTranslated, 700),
        (1, "web", GuestTranslated, 700),
        (0, "db", GuestTranslated, 700),
    ] {
        host.add_bin(sec, 0, Arc::from(d), c, n);
    }
    host.add_lost(0, 7);
    w.flush(&host).unwrap();
    let mut agent = Profile::new();
    let agent_rows: &[(&str, Context, &str, &str, &str, &str, u64)] = &[
        (
            "web",
            GuestUser,
            "httpd",
            "/usr/sbin/httpd",
            "parse_request",
            "main;serve;parse_request",
            300,
        ),
        (
            "web",
            GuestUser,
            "httpd",
            "/usr/sbin/httpd",
            "send_file",
            "main;serve;send_file",
            200,
        ),
        (
            "web",
            GuestKernel,
            "httpd",
            "[kernel.kallsyms]",
            "tcp_sendmsg",
            "main;serve;send_file;entry_SYSCALL_64;tcp_sendmsg",
            150,
        ),
        (
            "web",
            GuestKernel,
            "swapper",
            "[kernel.kallsyms]",
            "native_safe_halt",
            "",
            400,
        ),
        (
            "web",
            GuestKernel,
            "kworker/u4:2",
            "[virtio_net]",
            "virtnet_poll",
            "ret_from_fork;virtnet_poll",
            50,
        ),
    ];
    for (i, &(d, c, p, img, s, st, n)) in agent_rows.iter().enumerate() {
        let mut k = key(0, d, c, p, img, s, st);
        // The guest CPU (vCPU index) the agent reports; seconds 0 and 1.
        k.cpu = (i % 2) as u32;
        k.second = ((i / 2) % 2) as u32;
        let n = if variant == 1 && s == "parse_request" {
            n * 2
        } else {
            n
        };
        agent.add(k, n, n * ms);
    }
    w.flush_agent(&agent).unwrap();
    w.set_scale(&ScaleRow {
        domain: "web".into(),
        event: 0,
        host_period: 1400 * ms,
        agent_period: 700 * ms,
        agent_samples: 1100,
        agent_lost: 3,
        factor: 2.0,
    })
    .unwrap();
    w.set_build_ids(&[("/usr/bin/make".into(), "4f1e3c2b00aa".into())])
        .unwrap();
    w.finish(true).unwrap();
    // vm-stat and benchmark rows, as other commands store them, for the
    // HTML report's charts.
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(
        "INSERT INTO intervals VALUES ('vmstat', 0, 1, NULL, 'web', NULL, 'busy', 61.5, '%');
         INSERT INTO intervals VALUES ('vmstat', 1, 2, NULL, 'web', NULL, 'busy', 70.0, '%');
         INSERT INTO intervals VALUES ('vmstat', 0, 1, NULL, 'db', NULL, 'busy', 35.0, '%');
         INSERT INTO intervals VALUES ('vmstat', 1, 2, NULL, 'db', NULL, 'busy', 0.0, '%');
         INSERT INTO bench_samples VALUES ('web', 'h1', '{}', 'rate=40', 0, 'throughput', 39.5, 'req/s', NULL, NULL);
         INSERT INTO bench_samples VALUES ('web', 'h1', '{}', 'rate=80', 0, 'throughput', 61.0, 'req/s', NULL, NULL);",
    )
    .unwrap();
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
