//! Discovery of real, paused QEMUs (TCG, no guest needed) on the real
//! /proc, with and without QMP. Skips, saying why, when qemu-system-x86_64
//! is not installed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vmscope_discover::qmp::Qmp;
use vmscope_discover::{discover, Accel, DiscoverOptions};

const QEMU: &str = "qemu-system-x86_64";

/// Kills the QEMU this test started (by its pid) however the test ends.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn find_in_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.is_file())
}

#[test]
fn live_tcg_qemu_with_qmp() {
    if find_in_path(QEMU).is_none() {
        vmscope_testkit::skip(&format!(
            "{QEMU} is not installed (apt-get install qemu-system-x86)"
        ));
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("qmp.sock");
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(16 << 20))
        .expect("disk image");
    let child = Command::new(QEMU)
        .args([
            "-name",
            "livetest,debug-threads=on",
            "-accel",
            "tcg",
            "-smp",
            "2",
            "-m",
            "64",
        ])
        .args([
            "-nographic",
            "-S",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            "none",
        ])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", sock.display()))
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,cache=none",
            disk.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu");
    let mut guard = Guard(child);
    let pid = guard.0.id();

    // Wait for the monitor socket and for both vCPU threads to exist.
    let start = Instant::now();
    let task = PathBuf::from(format!("/proc/{pid}/task"));
    loop {
        if let Ok(Some(status)) = guard.0.try_wait() {
            panic!("qemu exited early: {status}");
        }
        let threads = std::fs::read_dir(&task)
            .map(std::iter::Iterator::count)
            .unwrap_or(0);
        if sock.exists() && threads >= 3 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "qemu did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let vms = discover(&DiscoverOptions {
        proc_root: "/proc".into(),
        query_qmp: true,
        qmp_timeout: Duration::from_secs(5),
    })
    .expect("discover");
    let vm = vms
        .iter()
        .find(|v| v.pid == pid)
        .expect("our qemu is discovered");
    assert!(vm.name.starts_with("livetest"), "{}", vm.name);
    assert!(vm.qmp_used, "{:?}", vm.warnings);
    assert_eq!(vm.qmp.as_deref(), Some(sock.as_path()));
    assert_eq!(vm.accel, Accel::Tcg);

    // QMP's own answer, asked separately.
    let mut q = Qmp::connect(&sock, Duration::from_secs(5)).expect("qmp");
    let cpus = q.execute("query-cpus-fast", None).expect("query-cpus-fast");
    let mut from_qmp: Vec<(u32, u32)> = cpus
        .as_array()
        .expect("cpu list")
        .iter()
        .map(|c| {
            let n = |k: &str| c[k].as_u64().and_then(|v| u32::try_from(v).ok()).expect(k);
            (n("thread-id"), n("cpu-index"))
        })
        .collect();
    from_qmp.sort_by_key(|&(_, idx)| idx);
    let found: Vec<(u32, u32)> = vm
        .vcpus
        .iter()
        .map(|t| (t.tid, t.index.expect("vcpu index")))
        .collect();
    assert_eq!(found.len(), 2);
    assert_eq!(found, from_qmp);
    for (tid, idx) in &found {
        let comm = std::fs::read_to_string(task.join(tid.to_string()).join("comm")).expect("comm");
        assert_eq!(comm.trim_end(), format!("CPU {idx}/TCG"));
    }
    assert!(vm.io_threads.iter().any(|t| t.tid == pid));

    let d = vm
        .disks
        .iter()
        .find(|d| d.file.as_deref() == Some(disk.as_path()))
        .unwrap_or_else(|| panic!("disk {} not in {:#?}", disk.display(), vm.disks));
    assert_eq!(d.format.as_deref(), Some("raw"));
    assert_eq!(d.cache.as_deref(), Some("none"));
    drop(q);

    guard.0.kill().expect("kill qemu");
    guard.0.wait().expect("wait qemu");
}

/// Without debug-threads every thread is `qemu-system-x86`: /proc alone
/// cannot tell the vCPUs, QMP can.
#[test]
fn live_unnamed_threads_need_qmp() {
    if find_in_path(QEMU).is_none() {
        vmscope_testkit::skip(&format!(
            "{QEMU} is not installed (apt-get install qemu-system-x86)"
        ));
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("qmp.sock");
    let child = Command::new(QEMU)
        .args([
            "-name",
            "liveplain",
            "-accel",
            "tcg",
            "-smp",
            "2",
            "-m",
            "64",
            "-S",
        ])
        .args(["-object", "iothread,id=iot0"])
        .args([
            "-nographic",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            "none",
        ])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", sock.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu");
    let mut guard = Guard(child);
    let pid = guard.0.id();
    let start = Instant::now();
    while !sock.exists() {
        if let Ok(Some(status)) = guard.0.try_wait() {
            panic!("qemu exited early: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "qemu did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let find = |query_qmp: bool| {
        discover(&DiscoverOptions {
            proc_root: "/proc".into(),
            query_qmp,
            qmp_timeout: Duration::from_secs(5),
        })
        .expect("discover")
        .into_iter()
        .find(|v| v.pid == pid)
        .expect("our qemu is discovered")
    };
    let without = find(false);
    assert!(without.vcpus.is_empty());
    assert!(without.warnings.iter().any(|w| w.contains("debug-threads")));
    let with = find(true);
    assert!(with.qmp_used, "{:?}", with.warnings);
    assert_eq!(with.vcpus.len(), 2);
    assert!(with.warnings.is_empty(), "{:?}", with.warnings);
    assert!(with
        .io_threads
        .iter()
        .any(|t| t.kind == vmscope_discover::ThreadKind::IoThread && t.name == "IO iot0"));
    guard.0.kill().expect("kill qemu");
    guard.0.wait().expect("wait qemu");
}
