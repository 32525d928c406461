//! A recording that leaves symbols for the first read stores, once read,
//! exactly the rows of a recording that resolved as it went: the same
//! record stream (this process's real mappings, real kernel and user
//! addresses with call chains, an exec that reuses addresses, kernel code
//! registered mid-stream, anonymous code, lost records) through both
//! converters, in several deltas, then compared row for row.

use std::path::Path;
use std::sync::Arc;
use vmscope_engine::symbolize::{resolve_pending, store_options};
use vmscope_engine::Converter;
use vmscope_model::{CpuMode, Record, SampleRecord, SessionEvent, ThreadMap};
use vmscope_store::{Session, SessionWriter, View};
use vmscope_symbols::{Kallsyms, Symbolizer, SymbolizerOptions};

#[inline(never)]
fn marker_one() -> u64 {
    std::hint::black_box(1)
}

#[inline(never)]
fn marker_two() -> u64 {
    std::hint::black_box(2)
}

/// Real kernel text addresses of this boot (the first few thousand).
fn kernel_addrs() -> Vec<u64> {
    match Kallsyms::from_path(Path::new("/proc/kallsyms")) {
        Ok(k) if !k.is_restricted() && !k.is_empty() => {
            k.iter().map(|s| s.start + 1).take(3000).collect()
        }
        _ => vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0100],
    }
}

fn records() -> Vec<Record> {
    let me = std::process::id();
    let mut v =
        vmscope_linux::synthesize_from_proc(&vmscope_linux::ProcRoot::system(), Some(&[me]));
    let f1 = marker_one as *const () as usize as u64;
    let f2 = marker_two as *const () as usize as u64;
    let k = kernel_addrs();
    let sample = |i: u64, pid: u32, mode: CpuMode, ip: u64, chain: Vec<(CpuMode, u64)>| {
        Record::Sample(SampleRecord {
            event: 0,
            ip,
            pid,
            tid: pid,
            cpu: (i % 2) as u32,
            time: 1_000_000 + i * 3_000_000,
            mode,
            period: 250_000 + i % 11,
            callchain: chain,
        })
    };
    for i in 0..3000u64 {
        let kk = k[(i as usize * 7) % k.len()];
        let kc = k[(i as usize * 13 + 5) % k.len()];
        let r = match i % 6 {
            // User leaf with a user chain (return addresses after calls).
            0 => sample(
                i,
                me,
                CpuMode::User,
                f1 + i % 3,
                vec![(CpuMode::User, f1 + i % 3), (CpuMode::User, f2 + 5)],
            ),
            // Kernel leaf, kernel then user frames.
            1 => sample(
                i,
                me,
                CpuMode::Kernel,
                kk,
                vec![
                    (CpuMode::Kernel, kk),
                    (CpuMode::Kernel, kc),
                    (CpuMode::User, f2 + 9),
                    (CpuMode::User, f1 + 9),
                ],
            ),
            // No chain.
            2 => sample(i, me, CpuMode::User, f2 + i % 5, Vec::new()),
            // Anonymous / unmapped code.
            3 => sample(
                i,
                me,
                CpuMode::User,
                0x10 + i % 4,
                vec![(CpuMode::User, 0x10 + i % 4), (CpuMode::User, f1 + 1)],
            ),
            // Another process, not known to the process table.
            4 => sample(i, 4242, CpuMode::User, 0x7f00_0000_0000 + i, Vec::new()),
            // Kernel only.
            _ => sample(i, 0, CpuMode::Kernel, kc, vec![(CpuMode::Kernel, kc)]),
        };
        v.push(r);
        if i == 1200 {
            // Kernel code registered now: the same addresses name it from here.
            v.push(Record::Ksymbol {
                addr: k[0],
                len: 0x100,
                name: "bpf_prog_test".into(),
                bpf: true,
                unregister: false,
                time: 1_000_000 + i * 3_000_000,
            });
        }
        if i == 2000 {
            // An exec in pid 4242: its addresses belong to a new program.
            v.push(Record::Comm {
                pid: 4242,
                tid: 4242,
                comm: Arc::from("other"),
                exec: true,
                time: 1_000_000 + i * 3_000_000,
            });
        }
    }
    v.push(Record::Lost {
        cpu: Some(1),
        count: 5,
    });
    v
}

/// The converted session of `records`, in four deltas.
fn session(path: &Path, deferred: bool, records: &[Record]) {
    let opts = SymbolizerOptions::default();
    let sym = if deferred {
        Symbolizer::deferred(opts.clone())
    } else {
        Symbolizer::new(opts.clone())
    };
    let mut conv = Converter::new(sym, ThreadMap::default());
    conv.set_origin(0);
    let mut w = SessionWriter::create(path).unwrap();
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: Some(250_000),
        frequency: None,
    }])
    .unwrap();
    store_options(&w, &opts).unwrap();
    for part in records.chunks(records.len() / 4 + 1) {
        conv.push_batch(part.to_vec());
        let raw = conv.take_raw();
        let delta = conv.take_delta();
        assert_eq!(raw.is_empty(), !deferred || part.is_empty());
        w.add_raw(&raw).unwrap();
        w.flush(&delta).unwrap();
    }
    w.set_build_ids(&conv.symbolizer_mut().build_ids()).unwrap();
    w.close(true).unwrap();
}

fn rows(path: &Path) -> Vec<String> {
    let s = Session::open(path).unwrap();
    assert!(!s.symbols_pending().unwrap());
    let mut v: Vec<String> = s
        .rows(View::Host, None)
        .unwrap()
        .into_iter()
        .map(|r| format!("{:?} {} {}", r.key, r.samples, r.period))
        .collect();
    v.sort();
    v.push(format!("{:?}", s.lost().unwrap()));
    v.push(format!("{:?}", s.bins(0).unwrap()));
    v
}

#[test]
fn resolved_later_the_rows_are_the_rows_resolved_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records();
    let (now, later) = (dir.path().join("now.db"), dir.path().join("later.db"));
    session(&now, false, &recs);
    session(&later, true, &recs);
    assert!(Session::open(&later).unwrap().symbols_pending().unwrap());
    let r = resolve_pending(&later, &mut |_| {})
        .unwrap()
        .expect("pending");
    assert!(r.frames > 10 && r.rows > 10, "{r:?}");
    // Once only.
    assert!(resolve_pending(&later, &mut |_| {}).unwrap().is_none());
    let (a, b) = (rows(&now), rows(&later));
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y);
    }
    assert_eq!(a.len(), b.len());
    let all = a.join("\n");
    assert!(all.contains("marker_one"), "no user function named");
    assert!(all.contains("bpf_prog_test"), "no registered kernel code");
    assert!(all.contains("[kernel.kallsyms]"), "no kernel frame");
}
