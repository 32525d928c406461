//! Discovery on fixture /proc trees (see tests/fixtures/generate.py): a
//! lab-style TCG VM, a libvirt KVM VM, a QEMU without debug-threads, an old
//! kernel with vhost kernel threads, and processes that must be ignored or
//! skipped.

use std::path::{Path, PathBuf};
use std::time::Duration;
use vmscope_discover::{
    discover, thread_map, Accel, DiscoverError, DiscoverOptions, ThreadKind, Vm,
};
use vmscope_model::ThreadRole;

fn tree(name: &str) -> Vec<Vm> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    discover(&DiscoverOptions {
        proc_root: root,
        query_qmp: false,
        qmp_timeout: Duration::from_millis(100),
    })
    .expect("discover")
}

fn vm<'a>(vms: &'a [Vm], name: &str) -> &'a Vm {
    vms.iter().find(|v| v.name == name).unwrap_or_else(|| {
        panic!(
            "no VM {name} in {:?}",
            vms.iter().map(|v| &v.name).collect::<Vec<_>>()
        )
    })
}

fn tid_idx(vm: &Vm) -> Vec<(u32, Option<u32>)> {
    vm.vcpus.iter().map(|t| (t.tid, t.index)).collect()
}

#[test]
fn finds_exactly_the_qemu_processes() {
    let vms = tree("new-kernel");
    let names: Vec<(&str, u32)> = vms.iter().map(|v| (v.name.as_str(), v.pid)).collect();
    // 7000 qemu-img, 7001 bash, 7002 impostor: not QEMU; 7100 vanished.
    assert_eq!(
        names,
        [
            ("lab-vm1", 4100),
            ("instance-0001", 5200),
            ("plain", 6300),
            ("broken", 7200)
        ]
    );
}

#[test]
fn lab_tcg_vm_with_debug_threads() {
    let vms = tree("new-kernel");
    let v = vm(&vms, "lab-vm1");
    assert_eq!(v.accel, Accel::Tcg);
    assert_eq!(tid_idx(v), [(4102, Some(0)), (4103, Some(1))]);
    assert_eq!(v.vcpus[1].name, "CPU 1/TCG");
    let io: Vec<(u32, ThreadKind)> = v.io_threads.iter().map(|t| (t.tid, t.kind)).collect();
    assert_eq!(
        io,
        [
            (4100, ThreadKind::MainLoop),
            (4101, ThreadKind::Other),
            (4104, ThreadKind::Worker),
            (4105, ThreadKind::Worker)
        ]
    );
    assert!(v.vhost.is_empty());
    assert_eq!(v.disks.len(), 1);
    let d = &v.disks[0];
    assert_eq!(
        d.file.as_deref(),
        Some(Path::new("/var/tmp/vmscope-lab/vm1.img"))
    );
    assert_eq!(
        (d.format.as_deref(), d.cache.as_deref(), d.aio.as_deref()),
        (Some("raw"), Some("none"), Some("threads"))
    );
    // ifname= and the tun fd name the same tap once.
    assert_eq!(v.taps, ["vmscope-tap0"]);
    assert_eq!(
        v.qmp.as_deref(),
        Some(Path::new("/var/tmp/vmscope-lab/vm1/qmp.sock"))
    );
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    assert_eq!(v.cmdline[0], "qemu-system-x86_64");
}

#[test]
fn libvirt_kvm_vm() {
    let vms = tree("new-kernel");
    let v = vm(&vms, "instance-0001");
    assert_eq!(v.accel, Accel::Kvm);
    assert_eq!(
        v.uuid.as_deref(),
        Some("6a3f1c2e-8d4b-4f6a-9c1e-2b7d5e8f9a01")
    );
    assert_eq!(
        v.exe.as_deref(),
        Some(Path::new("/usr/bin/qemu-system-x86_64"))
    );
    assert_eq!(tid_idx(v), [(5204, Some(0)), (5205, Some(1))]);
    let iot: Vec<&str> = v
        .io_threads
        .iter()
        .filter(|t| t.kind == ThreadKind::IoThread)
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(iot, ["IO iothread1"]);
    // vhost workers are threads of QEMU on this kernel.
    let vh: Vec<(u32, bool)> = v.vhost.iter().map(|w| (w.tid, w.kernel_thread)).collect();
    assert_eq!(vh, [(5206, false), (5207, false), (5208, false)]);
    assert!(v.io_threads.iter().all(|t| !t.name.starts_with("vhost-")));

    // Top node with its backing chain, and the read-only config ISO.
    assert_eq!(v.disks.len(), 2, "{:#?}", v.disks);
    let root = &v.disks[0];
    assert_eq!(root.id.as_deref(), Some("libvirt-1-format"));
    assert_eq!(
        root.file.as_deref(),
        Some(Path::new("/var/lib/libvirt/images/instance-0001.qcow2"))
    );
    assert_eq!(
        root.backing,
        [PathBuf::from("/var/lib/libvirt/images/base-debian12.qcow2")]
    );
    assert_eq!(
        (
            root.format.as_deref(),
            root.protocol.as_deref(),
            root.cache.as_deref(),
            root.aio.as_deref(),
            root.readonly
        ),
        (
            Some("qcow2"),
            Some("file"),
            Some("none"),
            Some("native"),
            false
        )
    );
    let iso = &v.disks[1];
    assert_eq!(
        iso.file.as_deref(),
        Some(Path::new(
            "/var/lib/libvirt/images/instance-0001-config.iso"
        ))
    );
    assert_eq!(iso.format.as_deref(), Some("raw"));
    assert!(iso.readonly);

    // fd=33 (JSON netdev), fds=36:37 (key=value, multiqueue), and a tun fd
    // not on the command line (hot-plugged).
    assert_eq!(v.taps, ["vnet0", "vnet1", "vnet7"]);
    // Monitor passed as fd 31: its path comes from /proc/PID/net/unix.
    assert_eq!(
        v.qmp.as_deref(),
        Some(Path::new(
            "/var/lib/libvirt/qemu/domain-1-instance-0001/monitor.sock"
        ))
    );
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn qemu_without_debug_threads_says_vcpus_are_unknown() {
    let vms = tree("new-kernel");
    let v = vm(&vms, "plain");
    assert!(v.vcpus.is_empty());
    assert!(
        v.warnings.iter().any(|w| w.contains("debug-threads")),
        "{:?}",
        v.warnings
    );
    assert_eq!(v.io_threads.len(), 5);
    assert_eq!(v.io_threads[0].kind, ThreadKind::MainLoop);
    assert!(v.io_threads[1..]
        .iter()
        .all(|t| t.kind == ThreadKind::Unknown));
    // Only the main loop has a known role; the rest may be vCPUs.
    assert_eq!(v.tids().collect::<Vec<_>>(), [(6300, ThreadRole::Io)]);
    // -enable-kvm; the exe link's " (deleted)" suffix is dropped.
    assert_eq!(v.accel, Accel::Kvm);
    assert_eq!(
        v.exe.as_deref(),
        Some(Path::new("/usr/bin/qemu-system-x86_64"))
    );
    // -drive file=json:{...} with ",," escapes, -blockdev key=value with dotted keys.
    let files: Vec<_> = v.disks.iter().map(|d| d.file.clone()).collect();
    assert_eq!(
        files,
        [
            Some(PathBuf::from("/srv/vm/plain.qcow2")),
            Some(PathBuf::from("/srv/vm/data,1.qcow2"))
        ]
    );
    assert!(v.disks[1].readonly);
    assert_eq!(v.taps, ["tap-plain0"]);
    // Relative -qmp path, resolved against the process's cwd.
    assert_eq!(v.qmp.as_deref(), Some(Path::new("/srv/vm/qmp.sock")));
}

#[test]
fn unreadable_task_dir_keeps_the_vm_with_a_warning() {
    let vms = tree("new-kernel");
    let v = vm(&vms, "broken");
    assert!(v.vcpus.is_empty() && v.io_threads.is_empty());
    assert!(
        v.warnings.iter().any(|w| w.contains("7200/task")),
        "{:?}",
        v.warnings
    );
    assert_eq!(v.accel, Accel::Kvm);
}

#[test]
fn old_kernel_vhost_kernel_threads() {
    let vms = tree("old-kernel");
    assert_eq!(vms.len(), 1);
    let v = &vms[0];
    assert_eq!(v.name, "oldhost-vm");
    assert_eq!(v.accel, Accel::Kvm);
    assert_eq!(tid_idx(v), [(3102, Some(0)), (3103, Some(1))]);
    let vh: Vec<(u32, &str, bool)> = v
        .vhost
        .iter()
        .map(|w| (w.tid, w.name.as_str(), w.kernel_thread))
        .collect();
    assert_eq!(vh, [(3105, "vhost-3100", true), (3106, "vhost-3100", true)]);
    assert_eq!(v.taps, ["tap0"]);
    assert_eq!(v.qmp, None);
    assert_eq!(v.disks[0].file.as_deref(), Some(Path::new("/vm/old.img")));
}

#[test]
fn thread_map_roles() {
    let mut vms = tree("new-kernel");
    vms.extend(tree("old-kernel"));
    let m = thread_map(&vms);
    let role = |pid, tid| m.owner(pid, tid).map(|(d, r)| (d.to_string(), r));
    assert_eq!(
        role(5200, 5205),
        Some(("instance-0001".into(), Some(ThreadRole::Vcpu(1))))
    );
    assert_eq!(
        role(5200, 5202),
        Some(("instance-0001".into(), Some(ThreadRole::Io)))
    );
    assert_eq!(
        role(5200, 5207),
        Some(("instance-0001".into(), Some(ThreadRole::Vhost)))
    );
    // Kernel vhost threads are their own process; the map finds them by tid.
    assert_eq!(
        role(3105, 3105),
        Some(("oldhost-vm".into(), Some(ThreadRole::Vhost)))
    );
    // An unnamed thread of a QEMU without debug-threads: the VM, role unknown.
    assert_eq!(role(6300, 6302), Some(("plain".into(), None)));
    assert!(m.is_tcg("lab-vm1"));
    assert!(!m.is_tcg("instance-0001"));
    assert_eq!(role(7000, 7000), None);
}

#[test]
fn json_output_is_stable() {
    let vms = tree("old-kernel");
    let j = serde_json::to_value(&vms).expect("json");
    assert_eq!(j[0]["accel"], "kvm");
    assert_eq!(j[0]["vcpus"][1]["index"], 1);
    assert_eq!(j[0]["vcpus"][1]["kind"], "vcpu");
    assert_eq!(j[0]["vhost"][0]["kernel_thread"], true);
    let back: Vec<Vm> = serde_json::from_value(j).expect("round trip");
    assert_eq!(back, vms);
}

#[test]
fn missing_proc_root_is_an_error_naming_it() {
    let e = discover(&DiscoverOptions {
        proc_root: "/nonexistent/proc".into(),
        ..DiscoverOptions::default()
    })
    .unwrap_err();
    assert!(matches!(e, DiscoverError::ProcRoot { .. }));
    assert!(e.to_string().contains("/nonexistent/proc"), "{e}");
}

#[test]
fn unreachable_qmp_keeps_the_proc_view() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/new-kernel");
    let vms = discover(&DiscoverOptions {
        proc_root: root,
        query_qmp: true,
        qmp_timeout: Duration::from_millis(200),
    })
    .expect("discover");
    let v = vm(&vms, "lab-vm1");
    assert!(!v.qmp_used);
    assert_eq!(v.vcpus.len(), 2);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.starts_with("QMP not used") && w.contains("qmp.sock")),
        "{:?}",
        v.warnings
    );
}
