//! The recorder and reader on their own, with intervals made here (times
//! chosen by the test, profiles of many rows): retention by size keeps
//! the directory under its bound plus one segment and never touches
//! another program's files; the wall clock stepping back starts a new
//! segment and loses nothing; a damaged segment is skipped with one line.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use vmscope_history::recorder::ProfileInfo;
use vmscope_history::{History, HistoryOptions, Interval, Recorder};
use vmscope_model::{AggKey, Context, Profile, SessionEvent};
use vmscope_store::TimelineRow;

fn profile(second: u32, rows: usize, salt: usize) -> Profile {
    let mut p = Profile::new();
    for i in 0..rows {
        p.add(
            AggKey {
                event: 0,
                domain: Arc::from("vm0"),
                context: Context::GuestKernel,
                process: Arc::from("worker"),
                image: Arc::from("[kernel.kallsyms]"),
                symbol: Arc::from(format!("function_{salt}_{i}").as_str()),
                stack: Arc::from(format!("main;run;function_{salt}_{i}").as_str()),
                srcline: Arc::from(""),
                second,
                cpu: (i % 4) as u32,
            },
            1,
            1_000_000,
        );
    }
    p
}

/// A profile of cpu-clock at 99 Hz with call stacks, its second 0 at `origin`.
fn cpu_clock_at(origin: f64) -> ProfileInfo {
    ProfileInfo {
        origin,
        events: vec![SessionEvent {
            name: "cpu-clock".into(),
            period: None,
            frequency: Some(99),
        }],
        callchain: true,
    }
}

fn append(r: &mut Recorder, t: f64, p: Option<&Profile>) {
    let doc = format!("{{\"t\":{t}}}");
    r.append(Interval {
        t_end: t,
        interval_s: 1.0,
        doc: doc.as_bytes(),
        timeline: vec![TimelineRow {
            t_end: t,
            interval_s: 1.0,
            domain: "vm0".into(),
            cpu_s: 0.5,
            steal_s: 0.0,
            io_s: 0.0,
            io_ops: 0.0,
        }],
        host: p,
        agent: None,
        scales: Vec::new(),
    })
    .unwrap();
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("vmscope-history-0")
        })
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn retention_by_size_keeps_the_bound_and_leaves_other_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("h");
    std::fs::create_dir(&dir).unwrap();
    // Another program's files, one named like a segment.
    let theirs = dir.join("vmscope-history-00000000-20200101T000000Z.db");
    std::fs::write(&theirs, b"not a segment, and not ours").unwrap();
    std::fs::write(dir.join("notes.txt"), b"keep me").unwrap();
    // A bound that a few segments of these intervals pass.
    let max = 100 << 10;
    let mut opts = HistoryOptions::new(dir.clone());
    opts.max_size = max;
    opts.segment = Duration::from_secs(5);
    let mut r = Recorder::open(opts).unwrap();
    r.set_profile(cpu_clock_at(1_000_000.0));
    let mut largest = 0;
    for i in 0..60u32 {
        let p = profile(i, 600, i as usize);
        append(&mut r, 1_000_001.0 + f64::from(i), Some(&p));
        if let Some(open) = r.open_segment() {
            largest = largest.max(vmscope_history::segment_bytes(open));
        }
        let ours = dir_bytes(&dir) - std::fs::metadata(&theirs).unwrap().len();
        assert!(
            ours <= max + largest,
            "after interval {i}: {ours} bytes of segments, bound {max} + one segment {largest}"
        );
    }
    assert!(r.state().segments_removed > 0, "nothing was removed");
    let notes = r.take_notes();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("not removing") && n.contains("00000000")),
        "{notes:?}"
    );
    r.close();
    assert_eq!(
        std::fs::read(&theirs).unwrap(),
        b"not a segment, and not ours"
    );
    assert_eq!(std::fs::read(dir.join("notes.txt")).unwrap(), b"keep me");
    // What is left reads back, the newest intervals included.
    let mut h = History::open(&dir).unwrap();
    let skipped = h.take_skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    let (_, last) = h.span().unwrap();
    assert_eq!(last, 1_000_060.0);
}

#[test]
fn the_clock_stepping_back_starts_a_segment_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = Recorder::open(HistoryOptions::new(tmp.path().to_path_buf())).unwrap();
    for t in [1000.0, 1001.0, 1002.0, 1003.0] {
        append(&mut r, t, None);
    }
    // NTP steps the clock back 10 s.
    for t in [993.0, 994.0, 995.0] {
        append(&mut r, t, None);
    }
    let notes = r.take_notes();
    assert!(
        notes.iter().any(|n| n.contains("stepped back 10.0 s")),
        "{notes:?}"
    );
    r.close();
    assert_eq!(vmscope_history::segments(tmp.path()).unwrap().len(), 2);
    let h = History::open(tmp.path()).unwrap();
    let frames = h.frames(0.0, 2000.0).unwrap();
    let times: Vec<f64> = frames.iter().map(|f| f.t_end).collect();
    assert_eq!(times, [993.0, 994.0, 995.0, 1000.0, 1001.0, 1002.0, 1003.0]);
    assert_eq!(frames[0].doc, b"{\"t\":993}");
}

#[test]
fn a_damaged_segment_is_skipped_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = HistoryOptions::new(tmp.path().to_path_buf());
    opts.segment = Duration::from_secs(2);
    let mut r = Recorder::open(opts).unwrap();
    for i in 0..9 {
        append(&mut r, 2000.0 + f64::from(i), None);
    }
    r.close();
    let segs = vmscope_history::segments(tmp.path()).unwrap();
    assert!(segs.len() >= 3, "{segs:?}");
    // Damage the second segment by hand.
    let victim = &segs[1].1;
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[..16].copy_from_slice(b"garbage garbage!");
    std::fs::write(victim, bytes).unwrap();
    let mut h = History::open(tmp.path()).unwrap();
    let skipped = h.take_skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains(&victim.display().to_string()),
        "{skipped:?}"
    );
    let n = h.frames(0.0, 3000.0).unwrap().len();
    assert!((5..9).contains(&n), "{n} intervals read");
}

/// A `top`-like document of interval `i`.
fn doc_of(i: u32) -> String {
    format!(
        "{{\"t\":{},\"domains\":[{{\"name\":\"vm0\",\"cpu_pct\":{:.6},\"functions\":[\"f{}\",\"g\"]}}]}}",
        3000 + i,
        f64::from(i % 17) * 1.234_567,
        i % 5
    )
}

#[test]
fn chained_documents_read_back_from_any_range() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = Recorder::open(HistoryOptions::new(tmp.path().to_path_buf())).unwrap();
    let n = 150u32;
    for i in 0..n {
        let d = doc_of(i);
        r.append(Interval {
            t_end: 3000.0 + f64::from(i),
            interval_s: 1.0,
            doc: d.as_bytes(),
            timeline: Vec::new(),
            host: None,
            agent: None,
            scales: Vec::new(),
        })
        .unwrap();
    }
    r.close();
    assert_eq!(vmscope_history::segments(tmp.path()).unwrap().len(), 1);
    let h = History::open(tmp.path()).unwrap();
    // Ranges inside a group, across key documents, at the ends, and all.
    for (a, b) in [
        (0, 0),
        (5, 9),
        (58, 62),
        (60, 60),
        (119, 121),
        (140, 149),
        (0, 149),
    ] {
        let got = h
            .frames(3000.0 + f64::from(a), 3000.0 + f64::from(b))
            .unwrap();
        let want: Vec<Vec<u8>> = (a..=b)
            .map(|i| vmscope_history::frames::compact(doc_of(i).as_bytes()))
            .collect();
        let docs: Vec<Vec<u8>> = got.into_iter().map(|f| f.doc).collect();
        assert_eq!(docs, want, "range {a}..={b}");
    }
    // Rounded to 2 decimals, the rest as written.
    let one = h.frames(3003.0, 3003.0).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&one[0].doc),
        r#"{"t":3003,"domains":[{"name":"vm0","cpu_pct":3.7,"functions":["f3","g"]}]}"#
    );
}

/// A host profile of one second: `rows` functions and the bin that counts them.
fn binned(second: u32, rows: usize) -> Profile {
    let mut p = profile(second, rows, 0);
    p.add_bin(
        second,
        0,
        Arc::from("vm0"),
        Context::GuestKernel,
        rows as u64,
    );
    p
}

#[test]
fn a_long_range_is_extracted_in_steps_and_loses_no_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = HistoryOptions::new(tmp.path().to_path_buf());
    opts.segment = Duration::from_secs(600);
    let mut r = Recorder::open(opts).unwrap();
    let origin = 50_000.0;
    r.set_profile(cpu_clock_at(origin));
    // 3,000 intervals of 1 s in 5 segments, 3 rows of one sample each.
    let n = 3000u32;
    for i in 0..n {
        let p = binned(i, 3);
        append(&mut r, origin + f64::from(i + 1), Some(&p));
    }
    r.close();
    assert!(vmscope_history::segments(tmp.path()).unwrap().len() >= 5);
    let h = History::open(tmp.path()).unwrap();
    let (first, last) = h.span().unwrap();
    let read = |from: f64, to: f64| {
        let out = tmp.path().join(format!("range-{from}-{to}.db"));
        let x = h.extract(from, to, &out).unwrap();
        (x, vmscope_store::Session::open(&out).unwrap())
    };
    let (x, s) = read(first, last);
    assert_eq!((x.intervals, x.step), (3000, 5));
    assert_eq!(s.meta().unwrap()["bin_seconds"], "5");
    // Every sample, summed to one row per key (the functions and CPUs).
    let rows = s
        .rows_in(vmscope_store::View::Host, &Default::default(), None)
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.samples).sum::<u64>(), 3 * 3000);
    assert_eq!(rows.len(), 3, "{rows:?}");
    // The bins in 600 steps of 5 s, each holding its 5 seconds.
    let bins = s.bins(0).unwrap();
    assert_eq!(bins.len(), 600);
    assert!(bins.iter().all(|b| b.0 % 5 == 0 && b.3 == 15), "{bins:?}");
    // The timeline: 600 steps of vm0, its CPU 0.5 s a second throughout.
    let iv = s.intervals(Some("history")).unwrap();
    let cpu: Vec<_> = iv.iter().filter(|r| r.metric == "cpu").collect();
    assert_eq!(cpu.len(), 600);
    let total: f64 = cpu.iter().map(|r| r.value).sum();
    assert!((total - 1500.0).abs() < 1e-6, "{total}");
    // A short range keeps each interval, and its seconds' samples only.
    let (x, s) = read(origin + 100.0, origin + 200.0);
    assert_eq!((x.intervals, x.step), (101, 1));
    let rows = s
        .rows_in(vmscope_store::View::Host, &Default::default(), None)
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.samples).sum::<u64>(), 3 * 100);
    assert_eq!(s.intervals(Some("history")).unwrap().len(), 4 * 101);
}

#[test]
fn a_closed_segment_rollup_sums_what_its_blocks_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = HistoryOptions::new(tmp.path().to_path_buf());
    opts.segment = Duration::from_secs(100);
    let mut r = Recorder::open(opts).unwrap();
    let origin = 70_003.0;
    r.set_profile(cpu_clock_at(origin));
    for i in 0..250u32 {
        let mut p = binned(i, 2 + (i % 3) as usize);
        p.add(
            AggKey {
                event: 0,
                domain: Arc::from("host"),
                context: Context::HostKernel,
                process: Arc::from("kworker"),
                image: Arc::from("[kernel.kallsyms]"),
                symbol: Arc::from("flush"),
                stack: Arc::from(""),
                srcline: Arc::from(""),
                second: i,
                cpu: 1,
            },
            u64::from(i % 4),
            u64::from(i % 4) * 1_000,
        );
        append(&mut r, origin + f64::from(i + 1), Some(&p));
    }
    r.close();
    let segs = vmscope_history::segments(tmp.path()).unwrap();
    assert!(segs.len() >= 3, "{segs:?}");
    for (_, path) in segs {
        let s = vmscope_store::Session::open_compact(&path).unwrap();
        let start: f64 = s.meta().unwrap()["started_at"].parse().unwrap();
        // Each second as the first of its ten on the clock (at least 0).
        let ten =
            |sec: u32| (((start + f64::from(sec)) / 10.0).floor() * 10.0 - start).max(0.0) as u32;
        let sorted = |mut v: Vec<vmscope_model::ProfileRow>| {
            v.sort_by(|a, b| a.key.cmp(&b.key));
            v.into_iter()
                .map(|r| (r.key, r.samples, r.period))
                .collect::<Vec<_>>()
        };
        let rolled = s
            .rollup_sums(&|x| x)
            .unwrap()
            .expect("a closed segment has a rollup");
        let blocks = s
            .block_sums(0, u32::MAX - 1, &|_| vmscope_model::UNKNOWN_SLICE, &ten)
            .unwrap()
            .unwrap();
        assert!(!blocks.host.is_empty());
        assert_eq!(
            sorted(rolled.host),
            sorted(blocks.host),
            "{}",
            path.display()
        );
        assert_eq!(sorted(rolled.agent), sorted(blocks.agent));
        assert_eq!(rolled.bins, blocks.bins, "{}", path.display());
    }
}
