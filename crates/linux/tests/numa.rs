//! The NUMA readers on the hand-built trees of `tests/fixtures/numa`
//! (`generate.py` there writes them and says what each holds): two and
//! four nodes (one memory-only), a kernel without
//! `/sys/devices/system/node`, garbage in a node's `cpulist`, and a
//! malformed `numa_maps` line.

use std::path::{Path, PathBuf};
use vmscope_linux::numa;
use vmscope_linux::procfs::ProcRoot;
use vmscope_linux::LinuxError;

fn tree(name: &str) -> (PathBuf, ProcRoot) {
    let d = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/numa")
        .join(name);
    (d.join("sys"), ProcRoot::new(d.join("proc")))
}

const GIB: u64 = 1 << 30;

#[test]
fn two_nodes() {
    let (sys, proc) = tree("two-node");
    let t = numa::topology(&sys, &proc).unwrap();
    assert_eq!(t.synthesized, None);
    let ids: Vec<u32> = t.nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![0, 1]);
    assert_eq!(t.nodes[1].cpus, vec![4, 5, 6, 7]);
    assert_eq!(t.nodes[0].mem_total_bytes, 8 * GIB);
    assert_eq!(t.nodes[0].mem_free_bytes, 2 * GIB);
    assert_eq!(t.node_of_cpu(6), Some(1));
    assert_eq!(
        numa::allowed_cpus(&proc, 2000, 2002).unwrap(),
        vec![4, 5, 6, 7]
    );
    assert_eq!(proc.task_stat(2000, 2002).unwrap().processor, 6);
    // vm-split: 3 GiB on node 0, 1 GiB + 260 pages on node 1, one line skipped.
    let m = numa::numa_maps(&proc, 2000, 4096).unwrap();
    assert_eq!(m.skipped_lines, 1);
    assert_eq!(m.by_node[&0], 3 * GIB);
    assert_eq!(m.by_node[&1], GIB + 260 * 4096);
    // vm-local: huge pages counted at their own size.
    let m = numa::numa_maps(&proc, 3000, 4096).unwrap();
    assert_eq!(m.by_node[&0], 2 * GIB + 8 * 4096);
    assert_eq!(m.skipped_lines, 0);
}

#[test]
fn four_nodes_with_a_memory_only_node() {
    let (sys, proc) = tree("four-node");
    let t = numa::topology(&sys, &proc).unwrap();
    assert_eq!(t.nodes.len(), 4);
    assert!(t.nodes[3].cpus.is_empty());
    assert_eq!(t.nodes[3].mem_total_bytes, 32 * GIB);
    assert_eq!(t.nodes_of(&(0..12).collect::<Vec<_>>()), vec![0, 1, 2]);
    // No kernelpagesize_kB: the default page size is the unit.
    let m = numa::numa_maps(&proc, 6000, 8192).unwrap();
    assert_eq!(m.by_node[&1], 190 * 8192);
}

#[test]
fn no_node_directory_gives_one_synthesized_node() {
    let (sys, proc) = tree("no-node");
    let t = numa::topology(&sys, &proc).unwrap();
    assert_eq!(t.nodes.len(), 1);
    assert_eq!(t.nodes[0].cpus, vec![0, 1]);
    assert_eq!(t.nodes[0].mem_total_bytes, 4 * GIB);
    assert_eq!(t.nodes[0].mem_free_bytes, GIB);
    let why = t.synthesized.expect("said");
    assert!(why.contains("devices/system/node does not exist"), "{why}");
    assert!(why.contains("meminfo"), "{why}");
    // Without cpu/online either, the CPUs come from /proc/stat.
    let dir = tempfile::tempdir().unwrap();
    let t = numa::topology(dir.path(), &proc).unwrap();
    assert_eq!(t.nodes[0].cpus, vec![0, 1]);
}

#[test]
fn garbage_is_an_error_naming_the_file() {
    let (sys, proc) = tree("bad-cpulist");
    let e = numa::topology(&sys, &proc).unwrap_err();
    assert!(matches!(e, LinuxError::Parse { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("node1/cpulist") && msg.contains("'banana'"),
        "{msg}"
    );
    // A missing root is said as such.
    let e = numa::topology(Path::new("/nonexistent-sys-root"), &proc).unwrap_err();
    assert!(e.to_string().contains("/nonexistent-sys-root"), "{e}");
    // Garbage affinity in a thread's status names that file.
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("9/task/9");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(t.join("status"), "Name:\tx\nCpus_allowed_list:\t0-\n").unwrap();
    let p = ProcRoot::new(dir.path());
    let msg = numa::allowed_cpus(&p, 9, 9).unwrap_err().to_string();
    assert!(
        msg.contains("9/task/9/status") && msg.contains("Cpus_allowed_list"),
        "{msg}"
    );
    std::fs::write(t.join("status"), "Name:\tx\n").unwrap();
    assert!(numa::allowed_cpus(&p, 9, 9).is_err());
    // A vanished process is told apart from a broken one.
    assert!(numa::numa_maps(&p, 12345, 4096).unwrap_err().is_vanished());
}

#[test]
fn this_machine() {
    let proc = ProcRoot::system();
    let t = numa::topology(Path::new("/sys"), &proc).unwrap();
    assert!(!t.nodes.is_empty());
    let online = vmscope_linux::online_cpus(Path::new("/sys")).unwrap();
    for c in &online {
        assert!(t.node_of_cpu(*c).is_some(), "CPU {c} in no node: {t:?}");
    }
    let me = std::process::id();
    let m = numa::numa_maps(&proc, me, numa::page_size()).unwrap();
    assert_eq!(m.skipped_lines, 0, "{m:?}");
    assert!(m.total() > 0);
    let allowed = numa::allowed_cpus(&proc, me, me).unwrap();
    assert!(!allowed.is_empty() && allowed.iter().all(|c| online.contains(c)));
}
