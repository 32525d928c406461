//! Files written by `testutil::PerfDataBuilder`: guest-mode samples (which no
//! public recording has), MMAP2 with build ids, lost records, the piped format.

use std::io::Cursor;
use vmscope_model::{CpuMode, Record};
use vmscope_perfdata::testutil::{MmapSpec, PerfDataBuilder, SampleSpec};
use vmscope_perfdata::{import, import_reader, PerfDataInfo};

const GUEST_KIP: u64 = 0xffff_ffff_8100_1234;

fn guest_file() -> PerfDataBuilder {
    PerfDataBuilder::new()
        .event_name("cpu-clock")
        .hostname("kvm-host")
        .build_id("/usr/bin/qemu-system-x86_64", &[0xab; 20], CpuMode::User)
        .time(10)
        .comm(500, 500, "qemu-system-x86")
        .comm(500, 502, "CPU 0/KVM")
        .mmap(MmapSpec::file(
            500,
            0x5555_0000_0000,
            0x10_0000,
            0x1000,
            "/usr/bin/qemu-system-x86_64",
        ))
        .sample(SampleSpec {
            pid: 500,
            tid: 502,
            cpu: 1,
            time: 100,
            ip: GUEST_KIP,
            mode: CpuMode::GuestKernel,
            ..SampleSpec::default()
        })
        .sample(SampleSpec {
            pid: 500,
            tid: 502,
            cpu: 1,
            time: 200,
            ip: 0x40_1000,
            mode: CpuMode::GuestUser,
            period: 2_000_000,
            ..SampleSpec::default()
        })
        .sample(SampleSpec {
            pid: 500,
            tid: 500,
            cpu: 0,
            time: 300,
            ip: 0x5555_0000_2000,
            mode: CpuMode::User,
            callchain: vec![
                (-512i64) as u64, // PERF_CONTEXT_USER
                0x5555_0000_2000,
                0x5555_0000_3000,
            ],
            ..SampleSpec::default()
        })
}

fn collect(bytes: Vec<u8>) -> (PerfDataInfo, Vec<Record>) {
    let mut recs = Vec::new();
    let info = import_reader(Cursor::new(bytes), "built.data", &mut |r| recs.push(r)).unwrap();
    (info, recs)
}

fn samples(recs: &[Record]) -> Vec<&vmscope_model::SampleRecord> {
    recs.iter()
        .filter_map(|r| match r {
            Record::Sample(s) => Some(s),
            _ => None,
        })
        .collect()
}

#[test]
fn guest_modes_come_out_as_guest_kernel_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guest.data");
    guest_file().write(&path).unwrap();
    let mut recs = Vec::new();
    let info = import(&path, &mut |r| recs.push(r)).unwrap();
    assert_eq!(info.samples, 3);
    assert_eq!(info.hostname.as_deref(), Some("kvm-host"));
    assert_eq!(info.events[0].name, "cpu-clock");
    assert_eq!(info.events[0].period, Some(1_000_000));
    assert_eq!((info.first_time, info.last_time), (Some(100), Some(300)));
    let s = samples(&recs);
    assert_eq!(s[0].mode, CpuMode::GuestKernel);
    assert_eq!(
        (s[0].pid, s[0].tid, s[0].cpu, s[0].ip),
        (500, 502, 1, GUEST_KIP)
    );
    assert_eq!(s[0].callchain, vec![(CpuMode::GuestKernel, GUEST_KIP)]);
    assert_eq!(s[1].mode, CpuMode::GuestUser);
    assert_eq!((s[1].pid, s[1].tid, s[1].period), (500, 502, 2_000_000));
    assert_eq!(s[2].mode, CpuMode::User);
    assert_eq!(
        s[2].callchain,
        vec![
            (CpuMode::User, 0x5555_0000_2000),
            (CpuMode::User, 0x5555_0000_3000)
        ]
    );
    // Non-sample records come first (earlier time), in file order.
    match &recs[..3] {
        [Record::Comm {
            comm: a, time: 10, ..
        }, Record::Comm {
            comm: b, tid: 502, ..
        }, Record::Mmap {
            pid: 500,
            pgoff: 0x1000,
            executable: true,
            build_id: Some(id),
            ..
        }] => {
            assert_eq!((&**a, &**b), ("qemu-system-x86", "CPU 0/KVM"));
            assert_eq!(&**id, &[0xab; 20]);
        }
        other => panic!("unexpected records {other:?}"),
    }
}

#[test]
fn piped_format_gives_the_same_stream() {
    let (info_f, file) = collect(guest_file().to_bytes());
    let (info_p, pipe) = collect(guest_file().to_pipe_bytes());
    assert_eq!(file, pipe);
    assert_eq!(info_f, info_p);
}

#[test]
fn mmap_variants_fork_exit_lost_and_exec() {
    let b = PerfDataBuilder::new()
        .event(0, 0, 100_000) // cycles
        .build_id("[kernel.kallsyms]", &[7; 20], CpuMode::Kernel)
        .mmap(MmapSpec {
            pid: u32::MAX,
            tid: 0,
            start: 0xffff_ffff_8100_0000,
            len: 0x100_0000,
            pgoff: 0,
            path: "[kernel.kallsyms]_text".into(),
            executable: true,
            mode: CpuMode::Kernel,
            mmap2: false,
            build_id: None,
        })
        .mmap(MmapSpec {
            mmap2: true,
            build_id: Some(vec![1, 2, 3, 4]),
            ..MmapSpec::file(7, 0x1000, 0x1000, 0, "/lib/libx.so")
        })
        .mmap(MmapSpec {
            mmap2: true,
            executable: false,
            ..MmapSpec::file(7, 0x9000, 0x1000, 0, "/data/file")
        })
        .mmap(MmapSpec {
            executable: false,
            ..MmapSpec::file(7, 0xa000, 0x1000, 0, "/data/other")
        })
        .time(5)
        .fork(8, 7, 8, 7)
        .comm_exec(8, 8, "ls")
        .lost(17)
        .time(6)
        .exit(8, 8);
    let (info, recs) = collect(b.to_bytes());
    assert_eq!(info.events[0].name, "cycles");
    assert_eq!(info.lost, 17);
    let execs: Vec<(u32, bool, Option<Vec<u8>>)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Mmap {
                pid,
                executable,
                build_id,
                ..
            } => Some((*pid, *executable, build_id.as_ref().map(|b| b.to_vec()))),
            _ => None,
        })
        .collect();
    assert_eq!(
        execs,
        vec![
            (u32::MAX, true, Some(vec![7; 20])),
            (7, true, Some(vec![1, 2, 3, 4])),
            (7, false, None),
            (7, false, None),
        ]
    );
    assert!(recs.contains(&Record::Fork {
        pid: 8,
        ppid: 7,
        tid: 8,
        ptid: 7,
        time: 5
    }));
    assert!(recs
        .iter()
        .any(|r| matches!(r, Record::Comm { exec: true, comm, .. } if &**comm == "ls")));
    assert!(recs.contains(&Record::Lost {
        cpu: Some(0),
        count: 17
    }));
    assert!(recs.contains(&Record::Exit {
        pid: 8,
        tid: 8,
        time: 6
    }));
}

#[test]
fn lost_samples_records_replace_lost_records_in_the_count() {
    let (info, recs) = collect(PerfDataBuilder::new().lost(5).lost(6).to_bytes());
    assert_eq!(info.lost, 11);
    assert_eq!(recs.len(), 2);
    let (info, recs) = collect(
        PerfDataBuilder::new()
            .lost(5)
            .lost(6)
            .lost_samples(11)
            .to_bytes(),
    );
    assert_eq!(info.lost, 11);
    assert_eq!(
        recs,
        vec![Record::Lost {
            cpu: Some(0),
            count: 11
        }]
    );
}

#[test]
fn out_of_order_samples_are_sorted_by_time() {
    let b = PerfDataBuilder::new()
        .sample(SampleSpec {
            time: 30,
            ip: 3,
            ..SampleSpec::default()
        })
        .sample(SampleSpec {
            time: 10,
            ip: 1,
            ..SampleSpec::default()
        })
        .sample(SampleSpec {
            time: 20,
            ip: 2,
            ..SampleSpec::default()
        });
    let (_, recs) = collect(b.to_bytes());
    let ips: Vec<u64> = samples(&recs).iter().map(|s| s.ip).collect();
    assert_eq!(ips, vec![1, 2, 3]);
}

#[test]
fn unknown_events_are_named_by_type_and_config() {
    let (info, _) = collect(PerfDataBuilder::new().event(2, 0x123, 1).to_bytes());
    assert_eq!(info.events[0].name, "type:2 config:0x123");
    let (info, _) = collect(PerfDataBuilder::new().event(4, 0x1c2, 1).to_bytes());
    assert_eq!(info.events[0].name, "r1c2");
    let (info, _) = collect(
        PerfDataBuilder::new()
            .event(4, 0x1c2, 1)
            .event_name("mem_load.l3_miss")
            .frequency(99)
            .to_bytes(),
    );
    assert_eq!(info.events[0].name, "mem_load.l3_miss");
    assert_eq!(info.events[0].frequency, Some(99));
}

/// What `perf record` (no `--buildid-mmap`) writes while another session on
/// the host asks for build ids (a vmscope recording): the kernel leaks its
/// MISC_MMAP_BUILD_ID bit onto MMAP2 records laid out as device/inode
/// (seen on this host: maj 254, a "build-id size" byte of 254). perf's own
/// tools assert on such files; the import reads them as the mappings they
/// are, in the file and the piped format.
#[test]
fn a_leaked_build_id_bit_over_an_inode_layout_is_read_as_a_plain_mmap2() {
    let b = || {
        PerfDataBuilder::new()
            .time(5)
            .mmap2_leaked_build_id_bit(
                MmapSpec::file(7, 0x5590_4fac_4000, 0x13000, 0x4000, "/usr/bin/dash"),
                254,
                0x3c520,
            )
            .mmap2_leaked_build_id_bit(
                MmapSpec::file(7, 0x7f00_0000_0000, 0x1000, 0, "/lib/libtiny.so"),
                8, // a major below 21 (sd): its byte would pass as a size
                0x1234,
            )
            .sample(SampleSpec {
                pid: 7,
                tid: 7,
                time: 10,
                ip: 0x5590_4fac_5000,
                mode: CpuMode::User,
                ..SampleSpec::default()
            })
    };
    for bytes in [b().to_bytes(), b().to_pipe_bytes()] {
        let (info, recs) = collect(bytes);
        assert_eq!(info.samples, 1);
        let maps: Vec<(&str, u64, u64, u64, bool)> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Mmap {
                    path,
                    start,
                    len,
                    pgoff,
                    build_id,
                    ..
                } => Some((&**path, *start, *len, *pgoff, build_id.is_some())),
                _ => None,
            })
            .collect();
        assert_eq!(
            maps,
            vec![
                ("/usr/bin/dash", 0x5590_4fac_4000, 0x13000, 0x4000, false),
                ("/lib/libtiny.so", 0x7f00_0000_0000, 0x1000, 0, false),
            ]
        );
    }
    // A session that asked for build ids gets real ones with the bit: an
    // out-of-range size there is corruption, not the leak.
    let mut bad = PerfDataBuilder::new()
        .mmap(MmapSpec {
            mmap2: true,
            build_id: Some(vec![9; 20]),
            ..MmapSpec::file(7, 0x1000, 0x1000, 0, "/lib/libx.so")
        })
        .to_bytes();
    let at = bad
        .windows(20)
        .position(|w| w == [9u8; 20])
        .expect("the build id is in the file");
    bad[at - 4] = 254;
    let err = import_reader(Cursor::new(bad), "bad.data", &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("malformed MMAP2"), "{err}");
}

#[test]
fn ksymbol_records_register_and_remove_kernel_code() {
    let bytes = PerfDataBuilder::new()
        .time(50)
        .ksymbol(
            0xffff_ffff_c000_1000,
            0x80,
            "bpf_prog_6deef7357e7b4530_tick",
            true,
            false,
        )
        .time(60)
        .ksymbol(
            0xffff_ffff_c000_1000,
            0x80,
            "bpf_prog_6deef7357e7b4530_tick",
            true,
            true,
        )
        .ksymbol(
            0xffff_ffff_c000_2000,
            0x40,
            "bpf_trampoline_6442",
            false,
            false,
        );
    for (how, b) in [("file", bytes.to_bytes()), ("pipe", bytes.to_pipe_bytes())] {
        let (_, recs) = collect(b);
        let k = |addr, len, name: &str, bpf, unregister, time| Record::Ksymbol {
            addr,
            len,
            name: name.into(),
            bpf,
            unregister,
            time,
        };
        assert_eq!(
            recs,
            vec![
                k(
                    0xffff_ffff_c000_1000,
                    0x80,
                    "bpf_prog_6deef7357e7b4530_tick",
                    true,
                    false,
                    50
                ),
                k(
                    0xffff_ffff_c000_1000,
                    0x80,
                    "bpf_prog_6deef7357e7b4530_tick",
                    true,
                    true,
                    60
                ),
                k(
                    0xffff_ffff_c000_2000,
                    0x40,
                    "bpf_trampoline_6442",
                    false,
                    false,
                    60
                ),
            ],
            "{how}"
        );
    }
}
