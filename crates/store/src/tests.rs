use super::*;
use rusqlite::Connection;
use std::path::Path;
use vmscope_model::{AggKey, Context, Profile, SessionEvent, UNKNOWN_SLICE};

fn key(sym: &str, stack: &str) -> AggKey {
    AggKey {
        event: 0,
        domain: "host".into(),
        context: Context::HostUser,
        process: "demo".into(),
        image: "/bin/demo".into(),
        symbol: sym.into(),
        stack: stack.into(),
        srcline: "".into(),
        second: 0,
        cpu: 0,
    }
}

/// A new session at `path` with one event (cpu-clock at 999 Hz) and the
/// host domain.
fn host_session(path: &Path) -> SessionWriter {
    let w = SessionWriter::create(path).unwrap();
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
    w
}

fn write_session(path: &Path, clean: bool) {
    let mut w = host_session(path);
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
fn held_results_answer_from_one_state_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    write_session(&path, true);
    let s = Session::open(&path).unwrap();
    let other = Connection::open(&path).unwrap();
    let more = || {
        other
            .execute(
                "UPDATE samples SET samples = samples + 100, period = period + 1000 WHERE symbol = 'beta'",
                [],
            )
            .unwrap()
    };
    let alpha_first = |s: &Session| {
        s.grouped(View::Host, 0, &[Field::Symbol], &[]).unwrap()[0].values[0] == "alpha"
    };
    let held_n;
    {
        let _held = s.hold_results();
        assert_eq!(s.totals(View::Host).unwrap()[&0], (16, 160));
        assert!(alpha_first(&s));
        let n = more() as u64;
        assert!(n > 0);
        // Another writer changed the rows: the held answers stay.
        assert_eq!(s.totals(View::Host).unwrap()[&0], (16, 160));
        assert!(alpha_first(&s));
        // A query not asked before reads the file as it is now.
        let by_process = s.grouped(View::Host, 0, &[Field::Process], &[]).unwrap();
        assert_eq!(by_process[0].samples, 16 + 100 * n);
        held_n = n;
    }
    // Released: every query reads the file again.
    assert_eq!(
        s.totals(View::Host).unwrap()[&0],
        (16 + 100 * held_n, 160 + 1000 * held_n)
    );
    assert!(!alpha_first(&s));
}

#[test]
fn a_batch_commits_its_writes_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut w = host_session(&path);
    let mut p = Profile::new();
    p.add(key("alpha", "main;alpha"), 5, 50);
    let interval = |t: f64| crate::IntervalRow {
        kind: "profiler".into(),
        t_start: t,
        t_end: t + 0.5,
        cpu: None,
        domain: Some("host".into()),
        vcpu: None,
        metric: "cost_s".into(),
        value: 0.001,
        unit: "s".into(),
    };
    let seen = |key: &str| {
        Session::open(&path)
            .unwrap()
            .meta()
            .unwrap()
            .get(key)
            .cloned()
    };
    w.batch(|w| {
        w.flush(&p)?;
        w.add_intervals(&[interval(0.0)])?;
        w.set_meta("duration_s", "0.5")?;
        // A reader sees none of it before the batch commits.
        assert_eq!(seen("duration_s"), None);
        Ok::<(), StoreError>(())
    })
    .unwrap();
    assert_eq!(seen("duration_s").as_deref(), Some("0.5"));
    // A batch that fails leaves nothing of what it wrote.
    let failed = w.batch(|w| {
        w.flush(&p)?;
        w.add_intervals(&[interval(0.5)])?;
        w.set_meta("duration_s", "1.0")?;
        Err::<(), StoreError>(StoreError::OutputRefused {
            path: path.clone(),
            reason: "stops this batch".into(),
        })
    });
    assert!(failed.is_err());
    // Writes after it make their own transactions again.
    w.set_meta("after", "1").unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    assert_eq!(s.meta().unwrap()["duration_s"], "0.5");
    assert_eq!(s.meta().unwrap()["after"], "1");
    assert_eq!(s.totals(View::Merged).unwrap()[&0], (5, 50));
    assert_eq!(s.intervals(Some("profiler")).unwrap().len(), 1);
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
        srcline: "".into(),
        second: 0,
        cpu: 0,
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

/// An active VM whose agent measured nothing in the session's seconds
/// (its scale 0: a 2 s export window between two of the agent's batches)
/// keeps the host's guest rows in the merged view, whole or sliced: it
/// did run.
#[test]
fn an_agent_without_rows_leaves_the_host_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let mut w = SessionWriter::create(&path).unwrap();
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: None,
        frequency: Some(10),
    }])
    .unwrap();
    let mut host = Profile::new();
    host.add(
        AggKey {
            event: 0,
            domain: "web".into(),
            context: Context::GuestTranslated,
            process: "CPU 0/TCG".into(),
            image: "[anon]".into(),
            symbol: "[anon]".into(),
            stack: "".into(),
            srcline: "".into(),
            second: 0,
            cpu: 0,
        },
        20,
        2_000_000_000,
    );
    w.flush(&host).unwrap();
    w.set_scale(&ScaleRow {
        domain: "web".into(),
        event: 0,
        host_period: 2_000_000_000,
        agent_period: 0,
        agent_samples: 0,
        agent_lost: 0,
        factor: 0.0,
    })
    .unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    assert_eq!(s.totals(View::Merged).unwrap()[&0], (20, 2_000_000_000));
    let second0 = Slice {
        seconds: Some((0, 0)),
        cpus: None,
    };
    assert_eq!(
        s.totals_in(View::Merged, &second0).unwrap()[&0],
        (20, 2_000_000_000)
    );
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

/// A session as vmscope wrote it at schema 2 (the tables of that version,
/// with a passive VM's `[guest.kernel]` rows and an agent's
/// `[kernel.kallsyms]` and module rows).
#[test]
fn version_2_sessions_are_migrated_and_say_they_cannot_be_sliced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    let c = Connection::open(&path).unwrap();
    c.execute_batch(
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE events(id INTEGER PRIMARY KEY, name TEXT NOT NULL, period INTEGER, frequency INTEGER);
         CREATE TABLE domains(name TEXT PRIMARY KEY, role TEXT NOT NULL, pid INTEGER,
            status TEXT NOT NULL DEFAULT 'running', ended_at REAL, detail TEXT NOT NULL DEFAULT '');
         CREATE TABLE stacks(id INTEGER PRIMARY KEY, frames TEXT NOT NULL UNIQUE);
         CREATE TABLE samples(event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            process TEXT NOT NULL, image TEXT NOT NULL, symbol TEXT NOT NULL, stack INTEGER NOT NULL DEFAULT 0,
            samples INTEGER NOT NULL, period INTEGER NOT NULL,
            PRIMARY KEY(event, domain, context, process, image, symbol, stack)) WITHOUT ROWID;
         CREATE TABLE bins(second INTEGER NOT NULL, event INTEGER NOT NULL, domain TEXT NOT NULL,
            context TEXT NOT NULL, samples INTEGER NOT NULL, PRIMARY KEY(second, event, domain, context)) WITHOUT ROWID;
         CREATE TABLE lost(event INTEGER PRIMARY KEY, count INTEGER NOT NULL);
         CREATE TABLE agent_samples(event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            process TEXT NOT NULL, image TEXT NOT NULL, symbol TEXT NOT NULL, stack INTEGER NOT NULL DEFAULT 0,
            samples INTEGER NOT NULL, period INTEGER NOT NULL,
            PRIMARY KEY(event, domain, context, process, image, symbol, stack)) WITHOUT ROWID;
         CREATE TABLE domain_scale(domain TEXT NOT NULL, event INTEGER NOT NULL,
            host_period INTEGER NOT NULL, agent_period INTEGER NOT NULL,
            agent_samples INTEGER NOT NULL, agent_lost INTEGER NOT NULL, factor REAL NOT NULL,
            PRIMARY KEY(domain, event));
         CREATE TABLE intervals(kind TEXT NOT NULL, t_start REAL NOT NULL, t_end REAL NOT NULL,
            cpu INTEGER, domain TEXT, vcpu TEXT, metric TEXT NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL);
         CREATE TABLE bench_samples(experiment TEXT NOT NULL, config_hash TEXT NOT NULL, manifest TEXT NOT NULL,
            point TEXT NOT NULL, sample INTEGER NOT NULL, metric TEXT NOT NULL,
            value REAL NOT NULL, unit TEXT NOT NULL, raw_output TEXT, flagged TEXT);
         INSERT INTO meta VALUES ('clean_stop', '1');
         INSERT INTO events VALUES (0, 'cpu-clock', NULL, 1000);
         INSERT INTO samples VALUES (0, 'host', 'host-kernel', 'p', '[kernel.kallsyms]', 'schedule', 0, 5, 5000);
         INSERT INTO samples VALUES (0, 'pas', 'guest-kernel', 'CPU 0/KVM', '[guest.kernel]', 'do_idle', 0, 3, 3000);
         INSERT INTO agent_samples VALUES (0, 'act', 'guest-kernel', 'httpd', '[kernel.kallsyms]', 'tcp_sendmsg', 0, 2, 2000);
         INSERT INTO agent_samples VALUES (0, 'act', 'guest-kernel', 'httpd', '[virtio_net]', 'start_xmit', 0, 1, 1000);
         INSERT INTO agent_samples VALUES (0, 'act', 'guest-user', 'httpd', '/usr/sbin/httpd', 'main', 0, 1, 1000);
         PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(c);
    let s = Session::open(&path).unwrap();
    let images = |view: View| -> Vec<String> {
        let mut v: Vec<String> = s
            .grouped(view, 0, &[Field::Image], &[])
            .unwrap()
            .into_iter()
            .map(|g| g.values[0].clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        images(View::Host),
        vec!["[guest.kernel.kallsyms]", "[kernel.kallsyms]"]
    );
    assert_eq!(
        images(View::Agent),
        vec![
            "/usr/sbin/httpd",
            "[guest.kernel.kallsyms]",
            "[guest.virtio_net]"
        ]
    );
    let sl = s.slicing().unwrap();
    assert_eq!((sl.created_schema, sl.time, sl.cpu), (2, false, false));
    let rows = s.rows(View::Host, Some(0)).unwrap();
    assert!(rows
        .iter()
        .all(|r| r.key.second == UNKNOWN_SLICE && r.key.cpu == UNKNOWN_SLICE));
}

#[test]
fn slices_select_seconds_and_cpus_and_rescale_agents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut w = SessionWriter::create(&path).unwrap();
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: None,
        frequency: Some(1000),
    }])
    .unwrap();
    let k = |domain: &str, ctx: Context, sym: &str, second: u32, cpu: u32| AggKey {
        event: 0,
        domain: domain.into(),
        context: ctx,
        process: "p".into(),
        image: "i".into(),
        symbol: sym.into(),
        stack: "".into(),
        srcline: "".into(),
        second,
        cpu,
    };
    let mut host = Profile::new();
    host.add(k("host", Context::HostUser, "a", 0, 0), 10, 1000);
    host.add(k("host", Context::HostUser, "a", 1, 1), 20, 2000);
    // vm1's guest time: 4000 in second 0 on CPU 1, 1000 in second 1 on CPU 0.
    host.add(k("vm1", Context::GuestTranslated, "[anon]", 0, 1), 40, 4000);
    host.add(k("vm1", Context::GuestTranslated, "[anon]", 1, 0), 10, 1000);
    w.flush(&host).unwrap();
    let mut agent = Profile::new();
    agent.add(k("vm1", Context::GuestUser, "g0", 0, 0), 4, 400);
    agent.add(k("vm1", Context::GuestUser, "g1", 1, 0), 1, 100);
    w.flush_agent(&agent).unwrap();
    w.set_scale(&ScaleRow {
        domain: "vm1".into(),
        event: 0,
        host_period: 5000,
        agent_period: 500,
        agent_samples: 5,
        agent_lost: 0,
        factor: 10.0,
    })
    .unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    let sl = s.slicing().unwrap();
    assert_eq!(
        (sl.time, sl.cpu, sl.seconds, sl.cpus.clone()),
        (true, true, Some((0, 1)), vec![0, 1])
    );
    let second1 = Slice {
        seconds: Some((1, 1)),
        cpus: None,
    };
    assert_eq!(s.totals_in(View::Host, &second1).unwrap()[&0], (30, 3000));
    // Merged, second 1: the agent's g1 scaled to the 1000 the host saw then.
    let g = s
        .grouped_in(View::Merged, &second1, 0, &[Field::Symbol], &[])
        .unwrap();
    let got: Vec<(String, u64)> = g.iter().map(|r| (r.values[0].clone(), r.period)).collect();
    assert_eq!(got, vec![("a".to_string(), 2000), ("g1".to_string(), 1000)]);
    // CPU 1 only: host a (second 1) and vm1's guest time of second 0 (4000),
    // spread over the agent's whole distribution.
    let cpu1 = Slice {
        seconds: None,
        cpus: Some(vec![1]),
    };
    assert_eq!(s.totals_in(View::Merged, &cpu1).unwrap()[&0].1, 6000);
    let g = s
        .grouped_in(View::Merged, &cpu1, 0, &[Field::Symbol], &[])
        .unwrap();
    let g0 = g.iter().find(|r| r.values[0] == "g0").unwrap();
    assert_eq!(g0.period, 3200);
    // Unsliced: the stored scale, as before.
    assert_eq!(s.totals(View::Merged).unwrap()[&0].1, 3000 + 5000);
    let by_cpu = s.grouped(View::Host, 0, &[Field::Cpu], &[]).unwrap();
    assert_eq!(by_cpu.len(), 2);
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

#[test]
fn rows_flushed_apart_from_the_delta_sum_up_with_it_and_bulk_load_keeps_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut w = SessionWriter::create(&path).unwrap();
    w.bulk_load().unwrap();
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: None,
        frequency: Some(999),
    }])
    .unwrap();
    let mut p = Profile::new();
    p.add(key("alpha", "main;alpha"), 1, 10);
    // The same key twice (separate allocations) next to the delta's, and
    // another; in one flush and in the next.
    let rows = vec![
        (key("alpha", "main;alpha"), 2, 20),
        (key("alpha", "main;alpha"), 4, 40),
        (key("beta", "main;beta"), 8, 80),
    ];
    w.flush_with_rows(&p, &rows).unwrap();
    w.flush_with_rows(&Profile::new(), &rows[..1]).unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    let g = s.grouped(View::Merged, 0, &[Field::Symbol], &[]).unwrap();
    assert_eq!(g[0].values, vec!["alpha".to_string()]);
    assert_eq!((g[0].samples, g[1].samples), (9, 8));
    assert_eq!(s.totals(View::Merged).unwrap()[&0], (17, 170));
    let mode: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn bulk_load_flushes_in_one_transaction_until_a_write_that_makes_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut w = SessionWriter::create(&path).unwrap();
    w.bulk_load().unwrap();
    let rows = vec![
        (key("alpha", "main;alpha"), 2, 20),
        (key("beta", "main;beta"), 8, 80),
    ];
    // Inside the bulk transaction: nothing is committed yet.
    w.flush_with_rows(&Profile::new(), &rows).unwrap();
    w.flush_with_rows(&Profile::new(), &rows[..1]).unwrap();
    w.set_meta("k", "v").unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    let seen: i64 = other
        .query_row("SELECT count(*) FROM samples", [], |r| r.get(0))
        .unwrap_or(-1);
    assert!(seen <= 0, "uncommitted rows visible: {seen}");
    drop(other);
    // set_events commits it; later flushes make their own transactions.
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: None,
        frequency: Some(999),
    }])
    .unwrap();
    w.flush_with_rows(&Profile::new(), &rows[1..]).unwrap();
    w.set_build_ids(&[("/bin/p".into(), "ab".into())]).unwrap();
    w.close(true).unwrap();
    let s = Session::open(&path).unwrap();
    let g = s.grouped(View::Merged, 0, &[Field::Symbol], &[]).unwrap();
    assert_eq!(g[0].values, vec!["beta".to_string()]);
    assert_eq!((g[0].samples, g[1].samples), (16, 4));
    assert_eq!(s.meta().unwrap()["k"], "v");
    assert_eq!(s.build_ids().unwrap()["/bin/p"], "ab");
}

#[test]
fn rows_with_equal_counts_come_in_key_order_not_table_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut w = host_session(&path);
    // The table is keyed by second first and stack ids follow insertion:
    // laid out, these rows read beta (second 0), then main;z before main;a
    // (ids 1 and 2, second 1), then alpha (second 2).
    let at = |second, sym, stack| AggKey {
        second,
        ..key(sym, stack)
    };
    let mut first = Profile::new();
    first.add(at(1, "gamma", "main;z"), 3, 30);
    w.flush(&first).unwrap();
    let mut p = Profile::new();
    p.add(at(2, "alpha", "main;alpha"), 3, 30);
    p.add(at(0, "beta", "main;beta"), 3, 30);
    p.add(at(1, "gamma", "main;a"), 3, 30);
    p.add(key("delta", "main;delta"), 9, 90);
    w.flush(&p).unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    let order: Vec<String> = s
        .rows(View::Host, Some(0))
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.key.symbol, r.key.stack))
        .collect();
    assert_eq!(
        order,
        [
            "delta main;delta",
            "alpha main;alpha",
            "beta main;beta",
            "gamma main;a",
            "gamma main;z"
        ]
    );
}

/// Rows written as blocks (history segments) read back as rows written
/// to the tables do: through the tables of an expanded open, and by
/// seconds from the blocks, whichever block of a chain they are in (its
/// key block, the one after, the last) and with periods off the nominal
/// one; an agent's guest kernel named as the tables name it; a damaged
/// block is said, naming the file.
#[test]
fn rows_in_blocks_read_as_rows_in_tables() {
    let dir = tempfile::tempdir().unwrap();
    let mut intervals = Vec::new();
    for sec in 0..150u32 {
        let mut p = Profile::new();
        for (i, sym) in ["alpha", "beta", "gamma"].iter().enumerate() {
            let mut k = key(sym, &format!("main;{sym}"));
            k.second = sec;
            k.cpu = i as u32;
            p.add(
                k,
                u64::from(sec) + i as u64 + 1,
                1000 * (u64::from(sec) + 1),
            );
        }
        let mut k = key("no_time", "");
        k.second = UNKNOWN_SLICE;
        k.cpu = UNKNOWN_SLICE;
        p.add(k, 1, 7);
        p.add_bin(sec, 0, "host".into(), Context::HostUser, 9);
        let mut a = Profile::new();
        let mut g = key("schedule", "entry;schedule");
        g.domain = "vm1".into();
        g.context = Context::GuestKernel;
        g.image = "[kernel.kallsyms]".into();
        g.second = sec;
        a.add(g, 4, 400);
        intervals.push((p, a));
    }
    let tables = dir.path().join("tables.db");
    let blocks = dir.path().join("blocks.db");
    let mut wt = host_session(&tables);
    let mut wb = host_session(&blocks);
    wb.create_history_tables().unwrap();
    for (p, a) in &intervals {
        wt.flush(p).unwrap();
        wt.flush_agent(a).unwrap();
        wb.add_row_block(p, false).unwrap();
        wb.add_row_block(a, true).unwrap();
    }
    wt.finish(true).unwrap();
    wb.finish(true).unwrap();
    let sorted = |mut v: Vec<vmscope_model::ProfileRow>| {
        v.sort_by(|a, b| format!("{:?}", a.key).cmp(&format!("{:?}", b.key)));
        v
    };
    let t = Session::open(&tables).unwrap();
    let b = Session::open(&blocks).unwrap();
    for view in [View::Host, View::Agent, View::Merged] {
        assert_eq!(
            sorted(b.rows(view, None).unwrap()),
            sorted(t.rows(view, None).unwrap()),
            "{view:?}"
        );
    }
    assert_eq!(b.bins(0).unwrap(), t.bins(0).unwrap());
    let agent = b.rows(View::Agent, None).unwrap();
    assert!(agent
        .iter()
        .all(|r| &*r.key.image == "[guest.kernel.kallsyms]"));
    // By seconds, from the blocks themselves.
    let c = Session::open_compact(&blocks).unwrap();
    for (from, to) in [(1, 1), (0, 0), (59, 61), (60, 60), (119, 149), (149, 149)] {
        let some = c.block_rows(false, from, to).unwrap().unwrap();
        let want = t
            .rows_in(
                View::Host,
                &Slice {
                    seconds: Some((from, to)),
                    cpus: None,
                },
                None,
            )
            .unwrap();
        assert_eq!(
            sorted(
                some.into_iter()
                    .filter(|r| r.key.second != UNKNOWN_SLICE)
                    .collect()
            ),
            sorted(want),
            "seconds {from}-{to}"
        );
    }
    assert_eq!(c.bins(0).unwrap(), t.bins(0).unwrap());
    assert_eq!(c.bins(0).unwrap().len(), 150);
    assert_eq!(c.block_rows(true, 2, 2).unwrap().unwrap().len(), 1);
    assert_eq!(c.block_rows(true, 61, 62).unwrap().unwrap().len(), 2);
    assert!(t.block_rows(false, 0, 9).unwrap().is_none());
    // A block damaged by hand.
    drop((b, c));
    let conn = Connection::open(&blocks).unwrap();
    conn.execute("UPDATE row_blocks SET data = x'00ff' WHERE rowid = 2", [])
        .unwrap();
    drop(conn);
    let e = Session::open(&blocks)
        .err()
        .expect("a damaged block is refused")
        .to_string();
    assert!(e.contains("blocks.db") && e.contains("damaged"), "{e}");
}

/// A segment in the layout written before blocks were chained and the
/// timeline moved into `frames` (a `timeline` table of REALs, an index on
/// `frames(t_end)`, each block deflated alone with periods as they are,
/// stacks as texts) still reads: its timeline, its blocks by seconds and
/// through an expanded open.
#[test]
fn segments_of_the_earlier_layout_still_read() {
    use vmscope_model::deferred::blocks::put_varint;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    host_session(&path).finish(true).unwrap();
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE frames(t_end REAL NOT NULL, interval_s REAL NOT NULL, doc BLOB NOT NULL);
         CREATE INDEX frames_t ON frames(t_end);
         CREATE TABLE timeline(
             t_end REAL NOT NULL, interval_s REAL NOT NULL, domain TEXT NOT NULL,
             cpu_s REAL NOT NULL, steal_s REAL NOT NULL, io_s REAL NOT NULL, io_ops REAL NOT NULL,
             PRIMARY KEY(t_end, domain)) WITHOUT ROWID;
         CREATE TABLE block_strings(id INTEGER PRIMARY KEY, text TEXT NOT NULL);
         CREATE TABLE row_blocks(
             first INTEGER NOT NULL, last INTEGER NOT NULL, agent INTEGER NOT NULL, data BLOB NOT NULL);
         CREATE INDEX row_blocks_t ON row_blocks(first, last);
         INSERT INTO frames VALUES (100.5, 1.0, x'00'), (101.5, 1.0, x'00');
         INSERT INTO timeline VALUES (100.5, 1.0, 'host', 0.25, 0.0, 0.125, 3.0),
                                     (101.5, 1.0, 'host', 0.5, 0.0, 0.0, 1.0);
         INSERT INTO stacks(id, frames) VALUES (1, 'main;work');
         INSERT INTO block_strings VALUES (1, 'host'), (2, 'host-user'), (3, 'demo'),
                                          (4, '/bin/demo'), (5, 'work'), (6, '');",
    )
    .unwrap();
    // One row: second 7 (first 7), cpu 1, event 0, the names, stack 1,
    // srcline '', 3 samples, period 301 (no nominal period in this layout).
    let mut raw = Vec::new();
    for v in [1u64, 1, 2, 0, 1, 2, 3, 4, 5, 1, 6, 3, 301] {
        put_varint(&mut raw, v);
    }
    let data = crate::deflate::deflate(&raw, None).unwrap();
    conn.execute(
        "INSERT INTO row_blocks VALUES (7, 7, 0, ?1)",
        rusqlite::params![data],
    )
    .unwrap();
    drop(conn);
    let c = Session::open_compact(&path).unwrap();
    assert!(c.has_history().unwrap());
    let tl = c.history_timeline(99.0, 102.0, 10.0).unwrap();
    assert_eq!(tl.len(), 1);
    assert_eq!(
        (tl[0].cpu_s, tl[0].io_ops, tl[0].interval_s),
        (0.75, 4.0, 2.0)
    );
    // A bucket of 0: each interval as recorded, at its own end.
    let each = c.history_timeline(99.0, 102.0, 0.0).unwrap();
    let ends: Vec<(f64, f64)> = each.iter().map(|r| (r.t_end, r.cpu_s)).collect();
    assert_eq!(ends, [(100.5, 0.25), (101.5, 0.5)]);
    let rows = c.block_rows(false, 7, 7).unwrap().unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(
        (
            &*r.key.symbol,
            &*r.key.stack,
            r.key.second,
            r.key.cpu,
            r.samples,
            r.period
        ),
        ("work", "main;work", 7, 1, 3, 301)
    );
    assert!(c.block_rows(false, 8, 9).unwrap().unwrap().is_empty());
    let s = Session::open(&path).unwrap();
    let all = s.rows(View::Host, None).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((&*all[0].key.stack, all[0].period), ("main;work", 301));
}
