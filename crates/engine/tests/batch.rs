//! `Converter::push_batch` (samples grouped before conversion) must give
//! exactly the profile that pushing every record alone gives, also when an
//! exec in the middle of a batch replaces a process's address space.

use std::sync::Arc;
use vmscope_engine::Converter;
use vmscope_model::{CpuMode, Record, SampleRecord, ThreadMap};
use vmscope_symbols::{Symbolizer, SymbolizerOptions};

fn symbolizer(dir: &std::path::Path) -> Symbolizer {
    Symbolizer::new(SymbolizerOptions {
        kallsyms: Some(dir.join("none")),
        symfs: Some(dir.to_path_buf()),
        ..SymbolizerOptions::default()
    })
}

fn records() -> Vec<Record> {
    let mmap = |path: &str, start: u64| Record::Mmap {
        pid: 10,
        tid: 10,
        start,
        len: 0x1000,
        pgoff: 0,
        path: path.into(),
        build_id: None,
        executable: true,
        time: 0,
    };
    let sample = |ip: u64, t: u64, chain: Vec<(CpuMode, u64)>| {
        Record::Sample(SampleRecord {
            event: 0,
            ip,
            pid: 10,
            tid: 11,
            cpu: 0,
            time: t,
            mode: CpuMode::User,
            period: 1000 + t % 7,
            callchain: chain,
        })
    };
    let mut v = vec![
        Record::Comm {
            pid: 10,
            tid: 11,
            comm: Arc::from("worker"),
            exec: false,
            time: 0,
        },
        mmap("/bin/a", 0x40_0000),
    ];
    for t in 0..500u64 {
        let chain = if t % 3 == 0 {
            vec![(CpuMode::User, 0x40_0010), (CpuMode::User, 0x40_0800)]
        } else {
            vec![]
        };
        v.push(sample(0x40_0010 + (t % 5) * 4, t * 7_000_000, chain));
    }
    // Exec mid-stream: the same addresses now belong to another binary.
    v.push(Record::Comm {
        pid: 10,
        tid: 10,
        comm: Arc::from("b"),
        exec: true,
        time: 3_500_000_000,
    });
    v.push(mmap("/bin/b", 0x40_0000));
    for t in 500..900u64 {
        v.push(sample(0x40_0010 + (t % 5) * 4, t * 7_000_000, vec![]));
    }
    v.push(Record::Lost {
        cpu: Some(0),
        count: 3,
    });
    v
}

#[test]
fn batch_and_single_pushes_give_the_same_profile() {
    let dir = tempfile::tempdir().unwrap();
    let mut one = Converter::new(symbolizer(dir.path()), ThreadMap::new());
    one.set_origin(0);
    for r in records() {
        one.push(r);
    }
    let mut batched = Converter::new(symbolizer(dir.path()), ThreadMap::new());
    batched.set_origin(0);
    let recs = records();
    // Two ring reads, split in the middle of the first run of samples.
    let (a, b) = recs.split_at(200);
    batched.push_batch(a.to_vec());
    batched.push_batch(b.to_vec());
    let (p1, p2) = (one.take_delta(), batched.take_delta());
    assert_eq!(p1.rows, p2.rows);
    assert_eq!(p1.bins, p2.bins);
    assert_eq!(p1.lost, p2.lost);
    assert_eq!(one.stats().samples, 900);
    assert_eq!(batched.stats().samples, 900);
    // Both binaries show up: the exec split the stream correctly.
    let images: std::collections::BTreeSet<String> =
        p1.rows.keys().map(|k| k.image.to_string()).collect();
    assert!(
        images.contains("/bin/a") && images.contains("/bin/b"),
        "{images:?}"
    );
}

/// Kernel samples in a BPF program registered mid-stream (a KSYMBOL record)
/// are named after it from that record on, in order within one batch, and
/// stop being named after it once it is unregistered.
#[test]
fn samples_in_code_registered_mid_stream_get_its_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kallsyms"),
        "ffffffff81000000 T _text\nffffffff81000100 T schedule\n",
    )
    .unwrap();
    let s = Symbolizer::new(SymbolizerOptions {
        kallsyms: Some(dir.path().join("kallsyms")),
        symfs: Some(dir.path().to_path_buf()),
        ..SymbolizerOptions::default()
    });
    let mut conv = Converter::new(s, ThreadMap::new());
    conv.set_origin(0);
    let sample = |t: u64| {
        Record::Sample(SampleRecord {
            event: 0,
            ip: 0xffff_ffff_c000_1010,
            pid: 10,
            tid: 10,
            cpu: 0,
            time: t,
            mode: CpuMode::Kernel,
            period: 1,
            callchain: vec![],
        })
    };
    let ksym = |unregister: bool| Record::Ksymbol {
        addr: 0xffff_ffff_c000_1000,
        len: 0x100,
        name: Arc::from("bpf_prog_aa_tick"),
        bpf: true,
        unregister,
        time: 0,
    };
    // One ring read: 2 samples before, 3 while loaded, 4 after.
    let mut batch = vec![sample(1), sample(2), ksym(false)];
    batch.extend((3..6).map(sample));
    batch.push(ksym(true));
    batch.extend((6..10).map(sample));
    conv.push_batch(batch);
    let p = conv.take_delta();
    let by_symbol = |name: &str| -> u64 {
        p.rows
            .iter()
            .filter(|(k, _)| &*k.symbol == name)
            .map(|(_, c)| c.samples)
            .sum()
    };
    assert_eq!(by_symbol("bpf_prog_aa_tick"), 3, "{:?}", p.rows.keys());
    let image: Vec<String> = p
        .rows
        .keys()
        .filter(|k| &*k.symbol == "bpf_prog_aa_tick")
        .map(|k| k.image.to_string())
        .collect();
    assert_eq!(image, ["[bpf]"]);
    // Outside the program's lifetime the table has nothing there.
    assert_eq!(by_symbol("0xffffffffc0001010"), 6, "{:?}", p.rows.keys());
}
