//! KVM guest-mode samples cannot be produced on a TCG-only machine, so the
//! passive-VM path (docs/architecture.md §4) is tested here on perf.data files built by
//! hand: samples with cpumode guest-kernel / guest-user on a vCPU thread go
//! to the VM owning that thread (or `pid<N>` when no VM map knows it), guest
//! kernel IPs resolve with the VM's kallsyms, host-kernel IPs in the vCPU
//! thread are the VM's vmm-kernel time, QEMU's own code is vmm-user.

use vmscope_engine::import::{import, ImportInput, ImportOptions};
use vmscope_model::{CpuMode, ThreadMap, ThreadRole};
use vmscope_perfdata::testutil::{MmapSpec, PerfDataBuilder, SampleSpec};
use vmscope_store::output::{OutputOptions, SessionOutput};
use vmscope_store::{Field, Session, View};
use vmscope_symbols::SymbolizerOptions;

const QEMU_PID: u32 = 4242;
const VCPU_TID: u32 = 4250;
const GUEST_KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81100000 T do_idle
ffffffff81100100 T default_idle
ffffffff81200000 T tcp_recvmsg
ffffffff81200400 T skb_copy_bits
ffffffff81300000 T _etext
";

fn build(dir: &std::path::Path) -> std::path::PathBuf {
    let mut b = PerfDataBuilder::new()
        .event(1, 0, 1_000_000)
        .comm(QEMU_PID, QEMU_PID, "qemu-system-x86")
        .comm(QEMU_PID, VCPU_TID, "CPU 0/KVM")
        .mmap(MmapSpec::file(
            QEMU_PID,
            0x5555_0000_0000,
            0x10_0000,
            0,
            "/usr/bin/qemu-system-x86_64",
        ));
    let mut t = 1_000;
    let mut sample = |b: PerfDataBuilder, ip: u64, mode: CpuMode, n: usize| {
        let mut b = b;
        for _ in 0..n {
            t += 1_000;
            b = b.sample(SampleSpec {
                pid: QEMU_PID,
                tid: VCPU_TID,
                time: t,
                ip,
                mode,
                ..SampleSpec::default()
            });
        }
        b
    };
    b = sample(b, 0xffff_ffff_8120_0410, CpuMode::GuestKernel, 30); // skb_copy_bits
    b = sample(b, 0xffff_ffff_8120_0010, CpuMode::GuestKernel, 20); // tcp_recvmsg
    b = sample(b, 0x0000_0000_0040_1000, CpuMode::GuestUser, 25); // guest user: one bucket
    b = sample(b, 0xffff_ffff_8100_0000, CpuMode::Kernel, 15); // host kernel in the vCPU thread
    b = sample(b, 0x5555_0000_1000, CpuMode::User, 10); // QEMU userspace
    let path = dir.join("guest.data");
    b.write(&path).unwrap();
    path
}

fn by(session: &Session, fields: &[Field]) -> Vec<(Vec<String>, u64)> {
    session
        .grouped(View::Merged, 0, fields, &[])
        .unwrap()
        .into_iter()
        .map(|g| (g.values, g.samples))
        .collect()
}

#[test]
fn guest_modes_attribute_to_the_vm_owning_the_vcpu_thread() {
    let dir = tempfile::tempdir().unwrap();
    let data = build(dir.path());
    let kallsyms = dir.path().join("guest.kallsyms");
    std::fs::write(&kallsyms, GUEST_KALLSYMS).unwrap();
    let mut threads = ThreadMap::new();
    threads.add_vm("kvm1", QEMU_PID, false);
    threads.add_thread("kvm1", VCPU_TID, ThreadRole::Vcpu(0));
    let out = dir.path().join("s.db");
    let empty = tempfile::tempdir().unwrap();
    let s = import(
        &ImportInput::File(data.clone()),
        SessionOutput::prepare(&out, &OutputOptions::default(), "test").unwrap(),
        ImportOptions {
            symbolizer: SymbolizerOptions {
                kallsyms: Some(empty.path().join("none")),
                symfs: Some(empty.path().to_path_buf()),
                ..SymbolizerOptions::default()
            },
            defer_symbols: false,
            guest_kallsyms: Some(kallsyms),
            threads,
            command_line: "test".into(),
            meta: Vec::new(),
        },
    )
    .unwrap();
    assert_eq!(s.samples, 100);
    assert_eq!(s.guest_samples, 75);
    let session = Session::open(&out).unwrap();
    let ctx = by(&session, &[Field::Domain, Field::Context]);
    let get = |d: &str, c: &str| {
        ctx.iter()
            .find(|(v, _)| v[0] == d && v[1] == c)
            .map(|x| x.1)
            .unwrap_or(0)
    };
    assert_eq!(get("kvm1", "guest-kernel"), 50, "{ctx:?}");
    assert_eq!(get("kvm1", "guest-user"), 25, "{ctx:?}");
    assert_eq!(get("kvm1", "vmm-kernel"), 15, "{ctx:?}");
    assert_eq!(get("kvm1", "vmm-user"), 10, "{ctx:?}");
    let syms = by(&session, &[Field::Domain, Field::Symbol]);
    let sym = |s: &str| {
        syms.iter()
            .find(|(v, _)| v[1] == s)
            .map(|x| x.1)
            .unwrap_or(0)
    };
    assert_eq!(sym("skb_copy_bits"), 30, "{syms:?}");
    assert_eq!(sym("tcp_recvmsg"), 20, "{syms:?}");
    assert_eq!(sym("[guest.user]"), 25, "{syms:?}");
}

#[test]
fn guest_modes_without_a_vm_map_get_a_pid_domain() {
    let dir = tempfile::tempdir().unwrap();
    let data = build(dir.path());
    let out = dir.path().join("s.db");
    let empty = tempfile::tempdir().unwrap();
    import(
        &ImportInput::File(data.clone()),
        SessionOutput::prepare(&out, &OutputOptions::default(), "test").unwrap(),
        ImportOptions {
            symbolizer: SymbolizerOptions {
                kallsyms: Some(empty.path().join("none")),
                symfs: Some(empty.path().to_path_buf()),
                ..SymbolizerOptions::default()
            },
            defer_symbols: false,
            guest_kallsyms: None,
            threads: ThreadMap::new(),
            command_line: "test".into(),
            meta: vec![(
                "vmscope_version".into(),
                "9.9.9 (commit 0123abcd, clean)".into(),
            )],
        },
    )
    .unwrap();
    let session = Session::open(&out).unwrap();
    let ctx = by(&session, &[Field::Domain, Field::Context]);
    let guest: u64 = ctx
        .iter()
        .filter(|(v, _)| v[0] == format!("pid{QEMU_PID}"))
        .map(|x| x.1)
        .sum();
    assert_eq!(guest, 75, "{ctx:?}");
    // Without a VM map, the host kernel in that thread is plain host time.
    assert!(
        ctx.iter()
            .any(|(v, n)| v[0] == "host" && v[1] == "host-kernel" && *n == 15),
        "{ctx:?}"
    );
    // Unresolved guest kernel addresses stay hex, with a warning in the session.
    let meta = session.meta().unwrap();
    assert!(meta["warnings"].contains("no guest kallsyms"), "{meta:?}");
    // The caller's metadata (the CLI passes its version) is stored as given.
    assert_eq!(
        meta["vmscope_version"], "9.9.9 (commit 0123abcd, clean)",
        "{meta:?}"
    );
}
