//! Results users see that flow through vmscope-model, pinned to values the
//! kernel's ABI and the report's vocabulary fix (not to the model's own
//! output): context and role names, perf's cpumode bits and callchain
//! markers, hardware-cache event encodings, event specs as printed, and
//! profile totals. Written to kill the mutants `cargo mutants -p
//! vmscope-model` found surviving (bench/README.md).

use std::sync::Arc;
use vmscope_model::{
    split_callchain, AggKey, Context, CpuMode, EventKind, EventSpec, ImageRef, NormalizedFrame,
    ProcessTable, Profile, Record, Role, SampleRate,
};

#[test]
fn context_names_as_reports_print_and_filter_them() {
    let names = [
        (Context::GuestUser, "guest-user", true),
        (Context::GuestKernel, "guest-kernel", true),
        (Context::GuestTranslated, "guest", true),
        (Context::VmmKernel, "vmm-kernel", false),
        (Context::VmmUser, "vmm-user", false),
        (Context::HostKernel, "host-kernel", false),
        (Context::HostUser, "host-user", false),
        (Context::Idle, "idle", false),
    ];
    assert_eq!(names.len(), Context::ALL.len());
    for (c, name, guest) in names {
        assert_eq!(c.as_str(), name);
        assert_eq!(c.to_string(), name);
        assert_eq!(Context::parse(name), Some(c));
        assert_eq!(c.is_guest(), guest, "{name}");
    }
    assert_eq!(Context::parse("guest-usr"), None);
    assert_eq!(Context::parse(""), None);
}

#[test]
fn role_names_round_trip() {
    for (r, name) in [
        (Role::Initiator, "initiator"),
        (Role::Active, "active"),
        (Role::Passive, "passive"),
        (Role::Unmonitored, "unmonitored"),
    ] {
        assert_eq!(r.as_str(), name);
        assert_eq!(Role::parse(name), Some(r));
    }
    assert_eq!(Role::parse("Active"), None);
}

#[test]
fn cpumode_follows_perf_misc_bits() {
    // PERF_RECORD_MISC_{KERNEL=1, USER=2, HYPERVISOR=3, GUEST_KERNEL=4,
    // GUEST_USER=5}, in the low 3 bits; higher bits are other flags.
    let modes = [
        (0, CpuMode::Unknown, false),
        (1, CpuMode::Kernel, true),
        (2, CpuMode::User, false),
        (3, CpuMode::Hypervisor, true),
        (4, CpuMode::GuestKernel, true),
        (5, CpuMode::GuestUser, false),
    ];
    for (misc, mode, kernel) in modes {
        assert_eq!(CpuMode::from_misc(misc), mode);
        assert_eq!(CpuMode::from_misc(misc | 0x2000), mode, "flags ignored");
        assert_eq!(mode.to_misc(), misc);
        assert_eq!(mode.is_kernel(), kernel, "{mode:?}");
    }
    assert_eq!(CpuMode::from_misc(6), CpuMode::Unknown);
}

#[test]
fn callchain_markers_switch_the_mode_and_are_dropped() {
    // enum perf_callchain_context: HV -32, KERNEL -128, USER -512,
    // GUEST -2048, GUEST_KERNEL -2176, GUEST_USER -2560.
    let m = |v: i64| v as u64;
    let raw = [
        0x10,
        m(-32),
        0x20,
        m(-128),
        0x30,
        m(-512),
        0x40,
        m(-2048),
        0x50,
        m(-2560),
        0x60,
        m(-2176),
        0x70,
        m(-4000), // an unknown marker keeps the mode
        0x80,
    ];
    assert_eq!(
        split_callchain(&raw, CpuMode::User),
        vec![
            (CpuMode::User, 0x10),
            (CpuMode::Hypervisor, 0x20),
            (CpuMode::Kernel, 0x30),
            (CpuMode::User, 0x40),
            (CpuMode::GuestKernel, 0x50),
            (CpuMode::GuestUser, 0x60),
            (CpuMode::GuestKernel, 0x70),
            (CpuMode::GuestKernel, 0x80),
        ]
    );
}

#[test]
fn hardware_cache_events_have_the_kernel_encoding() {
    // PERF_TYPE_HW_CACHE = 3; config = cache | op << 8 | result << 16 with
    // LL = 2, DTLB = 3, ITLB = 4, OP_READ = 0, RESULT_MISS = 1.
    assert_eq!(EventKind::LlcLoadMisses.perf_type_config(), (3, 0x1_0002));
    assert_eq!(EventKind::DtlbLoadMisses.perf_type_config(), (3, 0x1_0003));
    assert_eq!(EventKind::ItlbLoadMisses.perf_type_config(), (3, 0x1_0004));
    assert_eq!(
        EventKind::from_perf_type_config(3, 0x1_0003),
        Some(EventKind::DtlbLoadMisses)
    );
}

#[test]
fn clock_events_and_specs_as_printed() {
    for k in EventKind::NAMED {
        let clock = matches!(k, EventKind::CpuClock | EventKind::TaskClock);
        assert_eq!(k.is_clock(), clock, "{}", k.name());
    }
    let spec = |kind, rate| EventSpec { kind, rate }.display();
    assert_eq!(
        spec(EventKind::CpuClock, SampleRate::Frequency(999)),
        "cpu-clock@999Hz"
    );
    assert_eq!(
        spec(EventKind::Raw(0x1c2), SampleRate::Period(100_000)),
        "r1c2:100000"
    );
    // `r` alone or with non-hex digits is not a raw event.
    assert_eq!(EventKind::parse_name("r"), None);
    assert_eq!(EventKind::parse_name("rxyz"), None);
    assert_eq!(EventKind::parse_name("r1f"), Some(EventKind::Raw(0x1f)));
}

fn key(sym: &str) -> AggKey {
    AggKey {
        event: 0,
        domain: "host".into(),
        context: Context::HostUser,
        process: "p".into(),
        image: "/bin/p".into(),
        symbol: sym.into(),
        stack: "".into(),
        srcline: "".into(),
        second: 0,
        cpu: 0,
    }
}

#[test]
fn profile_totals_bins_and_losses_add_up() {
    let dom: Arc<str> = "vm1".into();
    let mut a = Profile::new();
    assert!(a.is_empty());
    a.add_bin(3, 0, dom.clone(), Context::GuestUser, 2);
    assert!(!a.is_empty(), "a profile with only bins is not empty");
    a.add_bin(3, 0, dom.clone(), Context::GuestUser, 5);
    let mut l = Profile::new();
    l.add_lost(1, 4);
    assert!(!l.is_empty(), "a profile with only losses is not empty");
    l.add_lost(1, 3);
    a.add(key("f"), 2, 30);
    a.add(key("f"), 1, 12);
    assert_eq!(a.total_samples, 3);
    let mut total = Profile::new();
    total.merge(a.clone());
    total.merge(a);
    total.merge(l);
    let bin = (3, 0, dom, Context::GuestUser);
    assert_eq!(total.bins[&bin], 14);
    assert_eq!(total.lost[&1], 7);
    assert_eq!(total.total_samples, 6);
    let rows = total.into_rows();
    assert_eq!((rows[0].samples, rows[0].period), (6, 84));
}

fn mmap(pid: u32, start: u64, len: u64, pgoff: u64, path: &str, executable: bool) -> Record {
    Record::Mmap {
        pid,
        tid: pid,
        start,
        len,
        pgoff,
        path: path.into(),
        build_id: None,
        executable,
        time: 0,
    }
}

fn file(path: &str, addr: u64) -> NormalizedFrame {
    NormalizedFrame {
        image: ImageRef::File {
            path: path.into(),
            build_id: None,
        },
        addr,
    }
}

/// Addresses become file offsets the way perf reports them: the mapping
/// covering the address, the newest mapping winning where they overlap.
#[test]
fn user_addresses_become_offsets_in_the_right_file() {
    let mut t = ProcessTable::new();
    assert!(t.is_empty());
    t.apply(&mmap(7, 0x1000, 0x3000, 0x100, "/bin/a", true));
    // Ignored: data mappings, the kernel's (pid -1), empty ones.
    t.apply(&mmap(7, 0x9000, 0x1000, 0, "/bin/data", false));
    t.apply(&mmap(u32::MAX, 0xa000, 0x1000, 0, "/bin/k", true));
    t.apply(&mmap(7, 0xb000, 0, 0, "/bin/empty", true));
    assert_eq!((t.len(), t.is_empty()), (1, false));
    assert_eq!(t.normalize(7, 0x1000, CpuMode::User), file("/bin/a", 0x100));
    assert_eq!(
        t.normalize(7, 0x3fff, CpuMode::User),
        file("/bin/a", 0x30ff)
    );
    assert_eq!(
        t.normalize(7, 0x4000, CpuMode::User).image,
        ImageRef::Unknown,
        "one past the end"
    );
    assert_eq!(
        t.normalize(7, 0x9000, CpuMode::User).image,
        ImageRef::Unknown
    );
    assert_eq!(
        t.normalize(7, 0xb000, CpuMode::User).image,
        ImageRef::Unknown
    );
    // A new mapping over the middle trims the old one on both sides.
    t.apply(&mmap(7, 0x2000, 0x1000, 0x500, "/bin/b", true));
    assert_eq!(
        t.normalize(7, 0x1fff, CpuMode::User),
        file("/bin/a", 0x10ff)
    );
    assert_eq!(t.normalize(7, 0x2000, CpuMode::User), file("/bin/b", 0x500));
    assert_eq!(
        t.normalize(7, 0x2fff, CpuMode::User),
        file("/bin/b", 0x14ff)
    );
    assert_eq!(
        t.normalize(7, 0x3000, CpuMode::User),
        file("/bin/a", 0x2100)
    );
    // A mapping that does not overlap leaves the gap before it unmapped.
    t.apply(&mmap(7, 0x6000, 0x1000, 0, "/bin/c", true));
    assert_eq!(
        t.normalize(7, 0x5000, CpuMode::User).image,
        ImageRef::Unknown
    );
    assert_eq!(
        t.normalize(7, 0x3000, CpuMode::User),
        file("/bin/a", 0x2100)
    );
    t.apply(&mmap(8, 0x1000, 0x1000, 0, "/bin/d", true));
    assert_eq!(t.len(), 2);
    // Modes other than user never look at maps.
    let k = 0xffff_ffff_8100_0000;
    for (mode, image) in [
        (CpuMode::Kernel, ImageRef::Kernel),
        (CpuMode::Hypervisor, ImageRef::Kernel),
        (CpuMode::GuestKernel, ImageRef::GuestKernel),
        (CpuMode::GuestUser, ImageRef::GuestUser),
    ] {
        assert_eq!(t.normalize(7, 0x1000, mode).image, image, "{mode:?}");
    }
    assert_eq!(t.normalize(7, k, CpuMode::Unknown).image, ImageRef::Kernel);
    assert_eq!(
        t.normalize(7, 0x1000, CpuMode::Unknown),
        file("/bin/a", 0x100)
    );
    assert_eq!(t.normalize(7, k, CpuMode::User).image, ImageRef::Unknown);
}

#[test]
fn anonymous_mappings_are_anon_whatever_their_name() {
    for path in [
        "",
        "//anon",
        "[anon:jit]",
        "/memfd:tcg (deleted)",
        "[heap]",
        "[stack]",
        "/dev/zero (deleted)",
        "anon_inode:[perf_event]",
    ] {
        let mut t = ProcessTable::new();
        t.apply(&mmap(3, 0x1000, 0x1000, 0, path, true));
        assert_eq!(
            t.normalize(3, 0x1800, CpuMode::User).image,
            ImageRef::Anon,
            "{path:?}"
        );
    }
    let mut t = ProcessTable::new();
    t.apply(&mmap(3, 0x1000, 0x1000, 0, "/usr/lib/anon.so", true));
    assert_eq!(
        t.normalize(3, 0x1800, CpuMode::User),
        file("/usr/lib/anon.so", 0x800)
    );
}

/// Process and thread names as reports show them (QEMU's `CPU 0/TCG`).
#[test]
fn process_and_thread_names() {
    let comm = |pid, tid, name: &str, exec| Record::Comm {
        pid,
        tid,
        comm: name.into(),
        exec,
        time: 0,
    };
    let mut t = ProcessTable::new();
    assert_eq!(&*t.comm(0, 0), "swapper");
    assert_eq!(&*t.comm(0, 5), ":0");
    assert_eq!(&*t.comm(42, 43), ":42");
    t.apply(&comm(42, 42, "qemu-system-x86", false));
    t.apply(&comm(42, 43, "CPU 0/TCG", false));
    assert_eq!(&*t.comm(42, 43), "qemu-system-x86");
    assert_eq!(t.thread_comm(43).as_deref(), Some("CPU 0/TCG"));
    assert_eq!(t.thread_comm(42).as_deref(), Some("qemu-system-x86"));
    assert_eq!(t.thread_comm(44), None);
    // A thread's name alone names its process until the leader's is known.
    t.set_comm(50, 51, "worker");
    assert_eq!(&*t.comm(50, 51), "worker");
    assert_eq!(&*t.comm(50, 52), ":50");
    t.set_comm(50, 50, "leader");
    assert_eq!(&*t.comm(50, 51), "leader");
    assert_eq!(t.thread_comm(51).as_deref(), Some("worker"));
    // exec drops the old address space; a fork copies the parent's.
    t.apply(&mmap(42, 0x1000, 0x1000, 0, "/bin/q", true));
    t.apply(&Record::Fork {
        pid: 60,
        ppid: 42,
        tid: 60,
        ptid: 43,
        time: 0,
    });
    assert_eq!(t.normalize(60, 0x1000, CpuMode::User), file("/bin/q", 0));
    assert_eq!(&*t.comm(60, 60), "qemu-system-x86");
    assert_eq!(t.thread_comm(60).as_deref(), Some("CPU 0/TCG"));
    // A new thread of 42 shares its maps and takes its creator's name.
    t.apply(&Record::Fork {
        pid: 42,
        ppid: 42,
        tid: 61,
        ptid: 43,
        time: 0,
    });
    assert_eq!(t.thread_comm(61).as_deref(), Some("CPU 0/TCG"));
    t.apply(&comm(42, 42, "sh", true));
    assert_eq!(
        t.normalize(42, 0x1000, CpuMode::User).image,
        ImageRef::Unknown
    );
    assert_eq!(t.normalize(60, 0x1000, CpuMode::User), file("/bin/q", 0));
    assert_eq!(&*t.comm(42, 42), "sh");
}
