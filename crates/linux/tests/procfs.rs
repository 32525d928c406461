//! `synthesize_from_proc` on the fixture tree and on the live /proc.

use std::path::{Path, PathBuf};
use vmscope_linux::{synthesize_from_proc, ProcRoot};
use vmscope_model::{ImageRef, ProcessTable, Record};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc")
}

#[test]
fn fixture_tree_gives_comms_and_exec_maps() {
    let recs = synthesize_from_proc(&ProcRoot::new(fixture()), None);
    let comms: Vec<(u32, u32, &str)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Comm {
                pid,
                tid,
                comm,
                exec,
                ..
            } => {
                assert!(!exec);
                Some((*pid, *tid, &**comm))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        comms,
        vec![
            (100, 100, "qemu-system-x86"),
            (100, 101, "CPU 0/TCG"),
            (200, 200, "kworker/0:1")
        ]
    );
    let maps: Vec<(u64, u64, u64, &str)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Mmap {
                pid,
                tid,
                start,
                len,
                pgoff,
                path,
                executable,
                build_id,
                ..
            } => {
                assert_eq!((*pid, *tid, *executable, build_id), (100, 100, true, &None));
                Some((*start, *len, *pgoff, &**path))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        maps,
        vec![
            (
                0x555555600000,
                0x400000,
                0xac000,
                "/usr/bin/qemu-system-x86_64"
            ),
            (0x7f1000000000, 0x40000000, 0, "//anon"),
            (
                0x7f2000000000,
                0x20000,
                0x1000,
                "/usr/lib/x86_64-linux-gnu/libc.so.6"
            ),
            (0x7ffd00100000, 0x2000, 0, "[vdso]"),
        ]
    );

    // The model resolves addresses with these records.
    let mut table = ProcessTable::new();
    for r in &recs {
        table.apply(r);
    }
    let f = table.normalize(100, 0x555555600010, vmscope_model::CpuMode::User);
    assert_eq!(f.addr, 0xac010);
    assert!(
        matches!(f.image, ImageRef::File { ref path, .. } if &**path == "/usr/bin/qemu-system-x86_64")
    );
    let anon = table.normalize(100, 0x7f1000000100, vmscope_model::CpuMode::User);
    assert_eq!(anon.image, ImageRef::Anon);
}

#[test]
fn pid_filter_and_missing_pids() {
    let recs = synthesize_from_proc(&ProcRoot::new(fixture()), Some(&[200, 999]));
    assert_eq!(recs.len(), 1);
    assert!(matches!(
        &recs[0],
        Record::Comm {
            pid: 200,
            tid: 200,
            ..
        }
    ));
    assert!(synthesize_from_proc(&ProcRoot::new("/nonexistent-root"), None).is_empty());
}

#[test]
fn live_proc_finds_own_executable() {
    let me = std::process::id();
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let recs = synthesize_from_proc(&ProcRoot::system(), Some(&[me]));
    let found = recs.iter().any(|r| {
        matches!(r, Record::Mmap { pid, path, executable: true, .. }
            if *pid == me && Path::new(&**path) == exe)
    });
    assert!(found, "no mapping of {} in {recs:?}", exe.display());
    assert!(recs
        .iter()
        .any(|r| matches!(r, Record::Comm { pid, tid, .. } if *pid == me && *tid == me)));
    // All processes: at least ourselves and pid 1.
    let all = synthesize_from_proc(&ProcRoot::system(), None);
    for pid in [1, me] {
        assert!(all
            .iter()
            .any(|r| matches!(r, Record::Comm { pid: p, .. } if *p == pid)));
    }
}
