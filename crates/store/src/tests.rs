use super::*;
use vmscope_model::Context;

fn key(sym: &str, stack: &str) -> AggKey {
    AggKey {
        event: 0,
        domain: "host".into(),
        context: Context::HostUser,
        process: "demo".into(),
        image: "/bin/demo".into(),
        symbol: sym.into(),
        stack: stack.into(),
    }
}

fn write_session(path: &Path, clean: bool) {
    let mut w = SessionWriter::create(path).unwrap();
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: None,
        frequency: Some(999),
    }])
    .unwrap();
    w.upsert_domain(&DomainRecord {
        domain: Domain::host(),
        status: "running".into(),
        ended_at: None,
        detail: String::new(),
    })
    .unwrap();
    let mut p = Profile::new();
    p.add(key("alpha", "main;alpha"), 5, 50);
    p.add(key("beta", "main;beta"), 3, 30);
    p.add_bin(0, 0, "host".into(), Context::HostUser, 8);
    p.add_lost(0, 2);
    w.flush(&p).unwrap();
    w.flush(&p).unwrap();
    w.finish(clean).unwrap();
}

#[test]
fn write_then_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    write_session(&path, true);
    let s = Session::open(&path).unwrap();
    assert_eq!(s.meta().unwrap()["clean_stop"], "1");
    assert_eq!(s.events().unwrap()[0].frequency, Some(999));
    let g = s.grouped(View::Merged, 0, &[Field::Symbol], &[]).unwrap();
    assert_eq!(g[0].values, vec!["alpha".to_string()]);
    assert_eq!(g[0].samples, 10);
    assert_eq!(g[1].samples, 6);
    assert_eq!(s.lost().unwrap()[&0], 4);
    assert_eq!(s.totals(View::Merged).unwrap()[&0], (16, 160));
    let rows = s.rows(View::Merged, Some(0)).unwrap();
    assert!(rows.iter().any(|r| &*r.key.stack == "main;alpha"));
    assert_eq!(s.bins(0).unwrap()[0].3, 16);
    let filtered = s
        .grouped(
            View::Merged,
            0,
            &[Field::Symbol],
            &[(Field::Symbol, "beta".into())],
        )
        .unwrap();
    assert_eq!(filtered.len(), 1);
}

#[test]
fn unclean_stop_is_visible() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    write_session(&path, false);
    assert_eq!(
        Session::open(&path).unwrap().meta().unwrap()["clean_stop"],
        "0"
    );
}

#[test]
fn bad_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.db");
    std::fs::write(&text, "hello, this is not a database at all").unwrap();
    let e = Session::open(&text).err().unwrap().to_string();
    assert!(
        e.contains("t.db") && e.contains("not a vmscope session"),
        "{e}"
    );
    let e = Session::open(&dir.path().join("none.db"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no such session file"), "{e}");
    // An SQLite file of someone else.
    let other = dir.path().join("o.db");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t(x)")
        .unwrap();
    let e = Session::open(&other).err().unwrap().to_string();
    assert!(e.contains("without vmscope's tables"), "{e}");
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    write_session(&path, true);
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let e = Session::open(&path).err().unwrap().to_string();
    assert!(e.contains("newer than this vmscope"), "{e}");
}

#[test]
fn corrupt_pages_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    write_session(&path, true);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    // Keep the header, smash everything after the first page.
    for b in bytes.iter_mut().take(n).skip(4096) {
        *b = 0xa5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let e = Session::open(&path).err().unwrap().to_string();
    assert!(e.contains("s.db"), "{e}");
}

#[test]
fn unwritable_output_is_named() {
    let e = SessionWriter::create(Path::new("/proc/vmscope-nope/x.db"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("/proc/vmscope-nope/x.db") && e.contains("cannot write"),
        "{e}"
    );
}

#[test]
fn merged_view_replaces_guest_rows_by_scaled_agent_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let mut w = SessionWriter::create(&path).unwrap();
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: None,
        frequency: Some(999),
    }])
    .unwrap();
    let k = |domain: &str, ctx: Context, process: &str, sym: &str| AggKey {
        event: 0,
        domain: domain.into(),
        context: ctx,
        process: process.into(),
        image: "i".into(),
        symbol: sym.into(),
        stack: "".into(),
    };
    let mut host = Profile::new();
    host.add(k("host", Context::HostUser, "p", "h"), 10, 1000);
    host.add(
        k("vm1", Context::GuestTranslated, "CPU 0/TCG", "[anon]"),
        40,
        4000,
    );
    host.add(k("vm1", Context::VmmUser, "CPU 0/TCG", "qemu"), 10, 1000);
    w.flush(&host).unwrap();
    let mut agent = Profile::new();
    agent.add(k("vm1", Context::GuestUser, "demo", "alpha"), 30, 300);
    agent.add(k("vm1", Context::GuestKernel, "demo", "syscall"), 10, 100);
    agent.add(k("vm1", Context::GuestKernel, "swapper", "idle"), 50, 500);
    w.flush_agent(&agent).unwrap();
    w.set_scale(&ScaleRow {
        domain: "vm1".into(),
        event: 0,
        host_period: 4000,
        agent_period: 400,
        agent_samples: 40,
        agent_lost: 0,
        factor: 10.0,
    })
    .unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    // Merged: host 1000 + vmm 1000 + alpha 3000 + syscall 1000 = what the CPUs did.
    assert_eq!(s.totals(View::Merged).unwrap()[&0].1, 6000);
    assert_eq!(s.totals(View::Host).unwrap()[&0].1, 6000);
    assert_eq!(s.totals(View::Agent).unwrap()[&0].1, 900);
    let g = s.grouped(View::Merged, 0, &[Field::Symbol], &[]).unwrap();
    let alpha = g.iter().find(|r| r.values[0] == "alpha").unwrap();
    assert_eq!((alpha.samples, alpha.period), (30, 3000));
    assert!(g
        .iter()
        .all(|r| r.values[0] != "[anon]" && r.values[0] != "idle"));
    assert_eq!(s.scales().unwrap()[0].factor, 10.0);
}

#[test]
fn version_1_sessions_are_migrated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    write_session(&path, true);
    let c = Connection::open(&path).unwrap();
    c.execute_batch("DROP TABLE agent_samples; DROP TABLE domain_scale; PRAGMA user_version = 1;")
        .unwrap();
    drop(c);
    let s = Session::open(&path).unwrap();
    assert_eq!(s.totals(View::Merged).unwrap()[&0], (16, 160));
}

#[test]
fn bench_samples_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let w = SessionWriter::create(&path).unwrap();
    let row = |sample, flagged: Option<&str>| BenchSampleRow {
        experiment: "io".into(),
        config_hash: "0123456789abcdef".into(),
        manifest: r#"{"kernel":"6.1"}"#.into(),
        point: "host:/x direct-read bs=4096".into(),
        sample,
        metric: "throughput".into(),
        value: 1.5e8,
        unit: "bytes/s".into(),
        raw_output: None,
        flagged: flagged.map(str::to_string),
    };
    w.add_bench_samples(&[row(1, None), row(2, Some("busy host"))])
        .unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    let got = s.bench_samples().unwrap();
    assert_eq!(got, vec![row(1, None), row(2, Some("busy host"))]);
}

#[test]
fn a_finished_session_takes_more_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    write_session(&path, true);
    let s = Session::open(&path).unwrap();
    s.annotate("bench_point", "net host:g0 buf=65536").unwrap();
    s.annotate("bench_point", "net host:g0 buf=4096").unwrap();
    drop(s);
    let m = Session::open(&path).unwrap().meta().unwrap();
    assert_eq!(m["bench_point"], "net host:g0 buf=4096");
    assert_eq!(m["clean_stop"], "1");
}
