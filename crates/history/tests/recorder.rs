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
    r.set_profile(ProfileInfo {
        origin: 1_000_000.0,
        events: vec![SessionEvent {
            name: "cpu-clock".into(),
            period: None,
            frequency: Some(99),
        }],
        callchain: true,
    });
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
