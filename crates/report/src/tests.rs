use super::*;
use crate::render::header_lines;
use std::path::Path;
use vmscope_model::{AggKey, Context, Domain, Profile, SessionEvent};
use vmscope_store::{DomainRecord, SessionWriter};

fn key(event: u32, domain: &str, ctx: Context, image: &str, sym: &str) -> AggKey {
    AggKey {
        event,
        domain: domain.into(),
        context: ctx,
        process: "p".into(),
        image: image.into(),
        symbol: sym.into(),
        stack: format!("main;{sym}").into(),
        srcline: "".into(),
        second: 0,
        cpu: 0,
    }
}

fn session(path: &Path) -> Session {
    let mut w = SessionWriter::create(path).unwrap();
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
    for (name, role) in [
        ("host", vmscope_model::Role::Initiator),
        ("vm1", vmscope_model::Role::Active),
    ] {
        w.upsert_domain(&DomainRecord {
            domain: Domain {
                name: name.into(),
                role,
                pid: None,
            },
            status: "running".into(),
            ended_at: None,
            detail: String::new(),
        })
        .unwrap();
    }
    let mut p = Profile::new();
    p.add(
        key(0, "host", Context::HostUser, "/usr/bin/demo", "alpha"),
        50,
        50_000_000,
    );
    p.add(
        key(
            0,
            "host",
            Context::HostKernel,
            "[kernel.kallsyms]",
            "schedule",
        ),
        20,
        20_000_000,
    );
    p.add(
        key(0, "host", Context::HostKernel, "[virtio_net]", "start_xmit"),
        10,
        10_000_000,
    );
    p.add(
        key(
            0,
            "vm1",
            Context::GuestKernel,
            "[guest.kernel.kallsyms]",
            "do_idle",
        ),
        20,
        20_000_000,
    );
    p.add(
        key(1, "host", Context::HostUser, "/usr/bin/demo", "alpha"),
        7,
        7,
    );
    w.flush(&p).unwrap();
    w.set_meta("source", "record").unwrap();
    w.finish(true).unwrap();
    Session::open(path).unwrap()
}

#[test]
fn table_has_header_and_rows_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(&dir.path().join("s.db"));
    let r = build(
        &s,
        &ReportOptions {
            event: Some("cpu-clock".into()),
            ..Default::default()
        },
        false,
    )
    .unwrap();
    assert_eq!(r.fields, vec!["domain", "image", "symbol"]);
    let mut out = Vec::new();
    render(&r, ReportFormat::Table, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("# event     cpu-clock (1000 Hz): 100 samples"),
        "{text}"
    );
    let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(body[0].starts_with("samples"), "{text}");
    assert!(
        body[1].contains("50.00%") && body[1].contains("demo") && body[1].ends_with("alpha"),
        "{text}"
    );
    // Basename by default.
    assert!(!body[1].contains("/usr/bin"), "{text}");
}

/// A partial file says which it is: a recording cut short (and why, when
/// the recorder could say), or a whole one its last step failed to put in
/// place.
#[test]
fn partial_files_say_how_the_recording_ended() {
    let dir = tempfile::tempdir().unwrap();
    let header = |name: &str, meta: &[(&str, &str)]| {
        let path = dir.path().join(name);
        let s = session(&path);
        for (k, v) in meta {
            s.annotate(k, v).unwrap();
        }
        let r = build(&s, &ReportOptions::default(), false).unwrap();
        header_lines(&r).join("\n")
    };
    let whole = header("whole.db.partial", &[]);
    assert!(whole.contains("stopped cleanly"), "{whole}");
    assert!(
        whole.contains("could not be put in place") && whole.contains("the whole recording"),
        "{whole}"
    );
    let done = header("done.db", &[]);
    assert!(!done.contains("WARNING"), "{done}");
    let cut = header(
        "cut.db.partial",
        &[
            ("clean_stop", "0"),
            ("stop_reason", "no space left on the file system"),
        ],
    );
    assert!(
        cut.contains("stopped early: no space left") && cut.contains("never completed"),
        "{cut}"
    );
    assert!(!cut.contains("could not be put in place"), "{cut}");
    let crashed = header("crashed.db.partial", &[("clean_stop", "0")]);
    assert!(
        crashed.contains("did not stop cleanly") && crashed.contains("never completed"),
        "{crashed}"
    );
}

#[test]
fn context_view_splits_kernel_and_modules() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(&dir.path().join("s.db"));
    let opts = ReportOptions {
        by: parse_fields("context").unwrap(),
        event: Some("cpu-clock".into()),
        ..Default::default()
    };
    let r = build(&s, &opts, false).unwrap();
    let labels: Vec<&str> = r.rows.iter().map(|r| r.values[0].as_str()).collect();
    assert_eq!(
        labels,
        vec![
            "host-user",
            "guest-kernel",
            "host-kernel",
            "host-kernel (modules)"
        ]
    );
    let sum: f64 = r.rows.iter().map(|r| r.percent[0]).sum();
    assert!((sum - 100.0).abs() < 1e-9);
}

#[test]
fn events_side_by_side_json_csv_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(&dir.path().join("s.db"));
    let opts = ReportOptions {
        by: parse_fields("symbol").unwrap(),
        limit: Some(2),
        ..Default::default()
    };
    let r = build(&s, &opts, true).unwrap();
    assert_eq!(r.events.len(), 2);
    assert_eq!(r.rows.len(), 2);
    assert_eq!(r.omitted_rows, 2);
    assert_eq!(r.rows[0].samples, vec![50, 7]);
    assert_eq!(r.rows[0].percent[1], 100.0);
    let mut out = Vec::new();
    render(&r, ReportFormat::Json, &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["rows"][0]["values"][0], "alpha");
    let mut out = Vec::new();
    render(&r, ReportFormat::Csv, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with(
            "symbol,cpu-clock samples,cpu-clock CPU s,cpu-clock percent,page-faults samples,page-faults count"
        ),
        "{text}"
    );
    let mut out = Vec::new();
    render(&r, ReportFormat::Collapsed, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    // Event counts (ns of CPU), not samples.
    assert!(text.contains("host;p;main;alpha 50000000\n"), "{text}");
}

#[test]
fn min_percent_filter_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(&dir.path().join("s.db"));
    let opts = ReportOptions {
        min_percent: 15.0,
        event: Some("cpu-clock".into()),
        ..Default::default()
    };
    let r = build(&s, &opts, false).unwrap();
    assert!(r.rows.iter().all(|r| r.percent[0] >= 15.0));
    assert_eq!(r.rows.len(), 3);
    let e = build(
        &s,
        &ReportOptions {
            event: Some("cycles".into()),
            ..Default::default()
        },
        false,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("'cycles' is not in this session") && e.contains("cpu-clock, page-faults"),
        "{e}"
    );
    assert!(parse_fields("domain,bogus").is_err());
    let filt = ReportOptions {
        filter: vec![(vmscope_store::Field::Domain, "vm1".into())],
        event: Some("cpu-clock".into()),
        ..Default::default()
    };
    let r = build(&s, &filt, false).unwrap();
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0].percent[0], 20.0);
}

#[test]
fn side_by_side_of_a_vm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut w = SessionWriter::create(&path).unwrap();
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: Some(1),
        frequency: None,
    }])
    .unwrap();
    let mut p = Profile::new();
    p.add(
        key(
            0,
            "vm1",
            Context::GuestKernel,
            "[guest.kernel.kallsyms]",
            "netback_rx",
        ),
        30,
        30,
    );
    p.add(
        key(
            0,
            "vm1",
            Context::GuestKernel,
            "[guest.kernel.kallsyms]",
            "br_forward",
        ),
        20,
        20,
    );
    p.add(
        key(
            0,
            "vm1",
            Context::VmmKernel,
            "[kernel.kallsyms]",
            "kvm_mmu_page_fault",
        ),
        10,
        10,
    );
    p.add(
        key(
            0,
            "vm1",
            Context::VmmUser,
            "/usr/bin/qemu",
            "virtio_queue_notify",
        ),
        5,
        5,
    );
    p.add(
        key(0, "host", Context::Idle, "[kernel.kallsyms]", "idle"),
        35,
        35,
    );
    w.flush(&p).unwrap();
    w.finish(true).unwrap();
    let s = Session::open(&path).unwrap();
    let v = build_side_by_side(
        &s,
        "vm1",
        &ReportOptions {
            limit: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let row = |r: &SideRow| (r.samples, r.event_count, r.percent, r.label.clone());
    assert_eq!(
        row(&v.left.rows[0]),
        (30, 30, 30.0, "netback_rx".to_string())
    );
    assert_eq!(v.left.rows.len(), 1);
    assert_eq!(row(&v.left.other), (20, 20, 20.0, "other".to_string()));
    assert_eq!(row(&v.left.total), (50, 50, 50.0, "TOTAL".to_string()));
    assert_eq!(row(&v.right.total), (15, 15, 15.0, "TOTAL".to_string()));
    let mut out = Vec::new();
    render_side_by_side(&v, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let first = text.lines().nth(1).unwrap();
    assert!(
        first.starts_with("Kernel (vm1)") && first.contains("VMM (in vm1 context)"),
        "{text}"
    );
    assert!(text.contains("TOTAL"), "{text}");
}

/// menon2005 §6.1.1 by numbers: Xen-domain0 against Linux executes 0.6919
/// of the instructions at 0.6251 of the throughput (instruction cost ratio
/// 1.11), with about 13 times the data TLB misses (a 19 times higher miss
/// rate) and 17 times the instruction TLB misses (25 times the rate).
#[test]
fn compare_reproduces_menon_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str, instr: u64, dtlb: u64, itlb: u64| -> Session {
        let path = dir.path().join(name);
        let mut w = SessionWriter::create(&path).unwrap();
        let ev = |n: &str| SessionEvent {
            name: n.into(),
            period: Some(1),
            frequency: None,
        };
        w.set_events(&[
            ev("instructions"),
            ev("dTLB-load-misses"),
            ev("iTLB-load-misses"),
        ])
        .unwrap();
        let mut p = Profile::new();
        for (e, count) in [(0, instr), (1, dtlb), (2, itlb)] {
            p.add(
                key(
                    e,
                    "host",
                    Context::HostKernel,
                    "[kernel.kallsyms]",
                    "tcp_v4_rcv",
                ),
                count / 1000,
                count,
            );
        }
        w.flush(&p).unwrap();
        w.finish(true).unwrap();
        Session::open(&path).unwrap()
    };
    let linux = make("linux.db", 1_000_000_000, 1_000_000, 100_000);
    let xen = make("xen.db", 691_900_000, 13_000_000, 1_700_000);
    let opts = compare::CompareOptions {
        by: Vec::new(),
        throughput: Some(vec![1.0, 0.6251]),
        event: None,
        view: vmscope_store::View::Merged,
        limit: 10,
        report: ReportOptions::default(),
    };
    let c = compare::compare(&[linux, xen], &opts).unwrap();
    let icr = c.instruction_cost_ratio.as_ref().unwrap()[1];
    assert!((icr - 1.107).abs() < 0.001, "{icr}");
    let rate = |e: &str| c.miss_rates.iter().find(|m| m.event == e).unwrap().ratio[1];
    assert!((rate("dTLB-load-misses") - 18.79).abs() < 0.01);
    assert!((rate("iTLB-load-misses") - 24.57).abs() < 0.01);
    assert_eq!(c.events[0].normalized[1], 0.6919);
    assert!(c.needs.is_empty(), "{:?}", c.needs);
    let svg = compare::svg(&c);
    assert!(svg.contains("dTLB-load-misses") && svg.contains("xen.db"));
    // A session with other events: what can be compared is, the rest is named.
    let other = {
        let path = dir.path().join("clock.db");
        let w = SessionWriter::create(&path).unwrap();
        w.set_events(&[SessionEvent {
            name: "cpu-clock".into(),
            period: None,
            frequency: Some(1000),
        }])
        .unwrap();
        w.finish(true).unwrap();
        Session::open(&path).unwrap()
    };
    let linux = Session::open(&dir.path().join("linux.db")).unwrap();
    let e = compare::compare(&[linux, other], &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no event in common") && e.contains("cpu-clock") && e.contains("instructions"),
        "{e}"
    );
}

#[test]
fn wilson_intervals_of_shares() {
    // 56 % of 100 samples: 46.2 % to 65.3 %, not 56 %.
    let [lo, hi] = share_ci95(0.56, 100);
    assert!(
        (lo - 46.2).abs() < 0.1 && (hi - 65.3).abs() < 0.1,
        "{lo} {hi}"
    );
    // Nothing seen in 1 000 samples is still up to 0.38 %.
    let [lo, hi] = share_ci95(0.0, 1000);
    assert!(lo.abs() < 1e-9 && (hi - 0.38).abs() < 0.01, "{lo} {hi}");
    assert_eq!(share_ci95(0.5, 0), [0.0, 100.0]);
}

/// A domain whose samples cover half of what the scheduler says it ran
/// gets the rest as an [unsampled] row (its rows then add up to the
/// scheduler's time); one covered fully gets none; a profile of 100
/// samples shows each share's interval.
#[test]
fn unsampled_rows_and_intervals_of_few_samples() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(&dir.path().join("s.db"));
    s.annotate("run_s_host", "0.160").unwrap();
    s.annotate("run_s_vm1", "0.020").unwrap();
    let plain = build(&s, &ReportOptions::default(), false).unwrap();
    assert!(plain
        .rows
        .iter()
        .all(|row| !row.values.iter().any(|v| v == UNSAMPLED)));
    let r = build(
        &s,
        &ReportOptions {
            unsampled: true,
            ..Default::default()
        },
        false,
    )
    .unwrap();
    let host: Vec<&Coverage> = r.coverage.iter().filter(|c| c.domain == "host").collect();
    assert!((host[0].ratio - 0.5).abs() < 1e-9, "{:?}", r.coverage);
    let unsampled: Vec<&Row> = r
        .rows
        .iter()
        .filter(|row| row.values.iter().any(|v| v == UNSAMPLED))
        .collect();
    assert_eq!(unsampled.len(), 1, "{:?}", r.rows);
    assert_eq!(unsampled[0].values[0], "host");
    assert_eq!(unsampled[0].event_count[0], 80_000_000);
    let host_total: u64 = r
        .rows
        .iter()
        .filter(|row| row.values[0] == "host")
        .map(|row| row.event_count[0])
        .sum();
    assert_eq!(
        host_total, 160_000_000,
        "the host's rows add up to its run time"
    );
    assert!(r.shows_ci());
    let mut out = Vec::new();
    render(&r, ReportFormat::Table, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("±95%") && text.contains("40.4-59.6%"),
        "{text}"
    );
    assert!(text.contains("[unsampled]"), "{text}");
    // Filtered, there is no such row.
    let r = build(
        &s,
        &ReportOptions {
            filter: vec![(Field::Symbol, "alpha".into())],
            unsampled: true,
            ..Default::default()
        },
        false,
    )
    .unwrap();
    assert!(r
        .rows
        .iter()
        .all(|row| !row.values.iter().any(|v| v == UNSAMPLED)));
}

/// A thread sampled over its run time (the kernel's timer charging it
/// with an idle CPU's missed period) is named in the coverage, and
/// `--unsampled` holds it to its run time in every grouping, the rest of
/// the domain's run time becoming its [unsampled] row.
#[test]
fn over_sampled_threads_are_held_to_their_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(&dir.path().join("s.db"));
    s.annotate("run_s_vm1", "0.010").unwrap();
    s.annotate(
        &(RUN_THREADS_PREFIX.to_string() + "vm1"),
        "0.004000 p\n0.006000 q\n",
    )
    .unwrap();
    let plain = build(&s, &ReportOptions::default(), false).unwrap();
    let c = plain.coverage.iter().find(|c| c.domain == "vm1").unwrap();
    assert!((c.ratio - 2.0).abs() < 1e-9, "{c:?}");
    assert!((c.held_s - 0.004).abs() < 1e-9, "{c:?}");
    assert_eq!(c.threads.len(), 2, "{c:?}");
    assert!(c.threads[0].over_sampled() && !c.threads[1].over_sampled());
    assert!(
        c.high
            .as_ref()
            .is_some_and(|h| h.starts_with("p sampled 0.020 s of 0.004 s")),
        "{c:?}"
    );
    let mut out = Vec::new();
    render(&plain, ReportFormat::Table, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("# coverage  vm1: OVER-SAMPLED: p sampled"),
        "{text}"
    );
    // 200 % raw, but held to the threads' run times 40 %: flagged LOW.
    assert!(c.low.is_some(), "{c:?}");
    assert!(
        text.contains("# coverage  vm1: 200.0 % (0.020 s sampled of 0.010 s its threads ran, 40.0 % held to the threads' run times); LOW, likely: "),
        "{text}"
    );
    let vm1_rows = |r: &Report| -> Vec<(String, u64)> {
        r.rows
            .iter()
            .filter(|row| row.values[0] == "vm1")
            .map(|row| (row.values.last().unwrap().clone(), row.event_count[0]))
            .collect()
    };
    // Unheld, the rows are the samples.
    assert_eq!(vm1_rows(&plain), vec![("do_idle".to_string(), 20_000_000)]);
    let held = build(
        &s,
        &ReportOptions {
            unsampled: true,
            by: vec![Field::Domain.into(), Field::Symbol.into()],
            ..Default::default()
        },
        false,
    )
    .unwrap();
    let mut rows = vm1_rows(&held);
    rows.sort();
    assert_eq!(
        rows,
        vec![
            ("[unsampled]".to_string(), 6_000_000),
            ("do_idle".to_string(), 4_000_000)
        ],
        "{:?}",
        held.rows
    );
    // The samples column stays as taken.
    let idle = held.rows.iter().find(|r| r.values[1] == "do_idle").unwrap();
    assert_eq!(idle.samples[0], 20);
}
