use super::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/readers")
}

#[test]
fn maps_lines() {
    let l =
        parse_maps_line("55d0c0a00000-55d0c0a21000 r-xp 00002000 08:01 1234      /usr/bin/my prog")
            .unwrap();
    assert_eq!(
        l,
        MapsLine {
            start: 0x55d0c0a00000,
            end: 0x55d0c0a21000,
            exec: true,
            offset: 0x2000,
            path: "/usr/bin/my prog"
        }
    );
    let anon = parse_maps_line("7f0000000000-7f0000001000 rwxp 00000000 00:00 0 ").unwrap();
    assert!(anon.exec);
    assert_eq!(anon.path, "");
    let data = parse_maps_line("7f0000000000-7f0000001000 rw-p 00000000 00:00 0").unwrap();
    assert!(!data.exec);
    assert!(parse_maps_line("garbage").is_none());
    assert!(parse_maps_line("").is_none());
}

#[test]
fn stat_ppid_survives_odd_comm() {
    assert_eq!(parse_stat_ppid("42 (a) b (c)) S 2 0 0"), Some(2));
    assert_eq!(parse_stat_ppid("42 (vhost-100) S 2 0 0 0"), Some(2));
    assert_eq!(parse_stat_ppid("garbage"), None);
    assert_eq!(parse_stat_ppid("1 (x)"), None);
}

#[test]
fn cmdline_split() {
    assert_eq!(split_cmdline(b"a\0b c\0\0"), vec!["a", "b c"]);
    assert_eq!(split_cmdline(b"a b"), vec!["a b"]);
    assert!(split_cmdline(b"").is_empty());
}

#[test]
fn net_unix_paths() {
    let s = "Num       RefCount Protocol Flags    Type St Inode Path\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 91234 /var/lib/libvirt/qemu/domain-1-x/monitor.sock\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 91235 @abstract\n\
             0000000000000000: 00000003 00000000 00000000 0001 03 91236\n";
    let m = parse_net_unix(s);
    assert_eq!(m.len(), 1);
    assert_eq!(
        m[&91234],
        PathBuf::from("/var/lib/libvirt/qemu/domain-1-x/monitor.sock")
    );
    assert_eq!(socket_inode(Path::new("socket:[91234]")), Some(91234));
    assert_eq!(socket_inode(Path::new("/dev/null")), None);
}

#[test]
fn task_lister_relists_when_the_thread_count_changes() {
    let dir = tempfile::tempdir().unwrap();
    let proc = ProcRoot::new(dir.path());
    let task = dir.path().join("5/task");
    for t in ["5", "6"] {
        std::fs::create_dir_all(task.join(t)).unwrap();
    }
    let mut l = TaskLister::default();
    assert_eq!(l.tids(&proc, 5), vec![5, 6]);
    std::fs::create_dir(task.join("9")).unwrap();
    assert_eq!(l.tids(&proc, 5), vec![5, 6, 9]);
    // Same count, different thread: kept until forgotten.
    std::fs::remove_dir(task.join("6")).unwrap();
    std::fs::create_dir(task.join("7")).unwrap();
    if proc.thread_count(5) == Some(3) {
        assert_eq!(l.tids(&proc, 5), vec![5, 6, 9]);
    }
    l.forget(|_| false);
    assert_eq!(l.tids(&proc, 5), vec![5, 7, 9]);
    assert!(l.tids(&proc, 77).is_empty());
    // The process gone and its pid reused with as many threads: the kept
    // handle is on the old directory, which counts none now.
    std::fs::remove_dir_all(dir.path().join("5")).unwrap();
    assert!(l.tids(&proc, 5).is_empty());
    for t in ["5", "11", "12"] {
        std::fs::create_dir_all(task.join(t)).unwrap();
    }
    assert_eq!(l.tids(&proc, 5), vec![5, 11, 12]);
    std::fs::remove_dir_all(dir.path().join("5")).unwrap();
    for t in ["5", "13", "14"] {
        std::fs::create_dir_all(task.join(t)).unwrap();
    }
    assert_eq!(l.tids(&proc, 5), vec![5, 13, 14]);
}

#[test]
fn proc_lister_relists_when_the_process_count_changes() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let proc = ProcRoot::new(dir.path());
    for p in ["1", "20", "self"] {
        std::fs::create_dir(dir.path().join(p)).unwrap();
    }
    let links = || std::fs::metadata(dir.path()).unwrap().nlink();
    let sorted = |l: &mut ProcLister| l.pids(&proc).to_vec();
    let mut l = ProcLister::new(std::time::Duration::from_secs(3600));
    assert_eq!(sorted(&mut l), vec![1, 20]);
    let before = links();
    std::fs::create_dir(dir.path().join("33")).unwrap();
    // The cache relies on the directory's link count following its
    // subdirectories, as procfs and tmpfs do (btrfs keeps 1).
    if links() != before {
        assert_eq!(sorted(&mut l), vec![1, 20, 33]);
        // Same count: the cached list until it is too old.
        std::fs::remove_dir(dir.path().join("20")).unwrap();
        std::fs::create_dir(dir.path().join("44")).unwrap();
        assert_eq!(sorted(&mut l), vec![1, 20, 33]);
    } else {
        std::fs::remove_dir(dir.path().join("20")).unwrap();
        std::fs::create_dir(dir.path().join("44")).unwrap();
    }
    let mut l = ProcLister::new(std::time::Duration::ZERO);
    assert_eq!(sorted(&mut l), vec![1, 33, 44]);
}

#[test]
fn proc_stat_fixture() {
    let s = parse_proc_stat(
        &std::fs::read_to_string(fixtures().join("proc/stat")).unwrap(),
        100.0,
        Path::new("stat"),
    )
    .unwrap();
    assert_eq!(s.cpus.len(), 2);
    let c1 = s.cpu(1).unwrap();
    assert!((c1.user - 20.0).abs() < 1e-9);
    assert!((c1.busy() - (20.0 + 0.5 + 3.0 + 0.1 + 0.4)).abs() < 1e-9);
    assert!(parse_proc_stat("intr 1 2\n", 100.0, Path::new("x")).is_err());
    assert!(parse_proc_stat("cpu 1 x 3 4\n", 100.0, Path::new("x")).is_err());
    let live = ProcRoot::new(fixtures().join("proc")).cpu_times().unwrap();
    assert_eq!(live.cpus.len(), 2);
}

#[test]
fn busy_shares() {
    // Busy time: the tick-counted columns, idle not included.
    let at = |idle: f64, user: f64| ProcStat {
        all: CpuTimes {
            user,
            idle,
            ..Default::default()
        },
        cpus: vec![(
            0,
            CpuTimes {
                user,
                idle,
                ..Default::default()
            },
        )],
    };
    let b = ProcStat::busy_share(&at(10.0, 5.0), &at(10.7, 5.1), None);
    assert!((b.unwrap() - 0.125).abs() < 1e-9, "{b:?}");
    assert_eq!(
        ProcStat::busy_share(&at(0.0, 0.0), &at(0.0, 0.0), Some(3)),
        None
    );
    // From the idle side: 1 s of wall, 0.7 s idle -> 0.3 s busy,
    // whatever the tick counted as user.
    let b = ProcStat::busy_from_idle(&at(10.0, 5.0), &at(10.7, 5.1), 1.0);
    assert_eq!(b.len(), 1);
    assert!((b[0].1 - 0.3).abs() < 1e-9, "{b:?}");
    // 0.2 s stolen in a CPU busy 60 % of the time: 0.12 s of it fell in
    // busy time and is not this host's work.
    let mut stolen = at(10.4, 5.6);
    stolen.cpus[0].1.steal = 0.2;
    let b = ProcStat::busy_from_idle(&at(10.0, 5.0), &stolen, 1.0);
    assert!((b[0].1 - (0.6 - 0.12)).abs() < 1e-9, "{b:?}");
}

#[test]
fn task_files_fixture() {
    let p = ProcRoot::new(fixtures().join("proc"));
    let s = p.schedstat(100, 101).unwrap();
    assert_eq!(s.run_ns, 5_000_000_000);
    assert_eq!(s.wait_ns, 250_000_000);
    let t = p.task_stat(100, 101).unwrap();
    assert_eq!(t.comm, "CPU 0/TCG");
    assert_eq!(t.processor, 1);
    assert_eq!(p.tids(100).unwrap(), vec![100, 101]);
    assert_eq!(
        p.threads(100),
        vec![(100, "qemu-system-x86".into()), (101, "CPU 0/TCG".into())]
    );
    let io = p.io(100).unwrap();
    assert_eq!((io.syscr, io.syscw), (40, 60));
    assert!(p.schedstat(100, 999).unwrap_err().is_vanished());
    assert!(!p.task_stat(100, 999).unwrap_err().to_string().is_empty());
    assert_eq!(p.pids_by_comm_prefix("ksoftirqd/"), vec![15]);
    assert!(p.threads(4242).is_empty());
}

#[test]
fn task_reader_rereads_and_drops() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("5/task/6");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("schedstat"), "10 20 3\n").unwrap();
    std::fs::write(dir.join("comm"), "CPU 1/KVM\n").unwrap();
    let mut r = TaskReader::new(&ProcRoot::new(tmp.path()));
    assert_eq!(r.schedstat(5, 6).unwrap().run_ns, 10);
    std::fs::write(dir.join("schedstat"), "11 20 3\n").unwrap();
    assert_eq!(r.schedstat(5, 6).unwrap().run_ns, 11);
    assert_eq!(r.comm(5, 6).unwrap(), "CPU 1/KVM");
    r.end_sample();
    r.end_sample();
    assert_eq!(r.open_files(), 0);
    assert!(r.schedstat(5, 7).unwrap_err().is_vanished());
}

#[test]
fn malformed_task_files() {
    assert!(parse_schedstat("12 x", Path::new("x")).is_err());
    assert!(parse_task_stat("1 (a) S 1", Path::new("x")).is_err());
    let weird = "7 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38";
    let t = parse_task_stat(weird, Path::new("x")).unwrap();
    assert_eq!(t.comm, "a) b) c");
    assert_eq!(t.ppid, 1);
    assert_eq!(t.processor, 36);
    assert_eq!(t.starttime, 19);
    assert!(parse_proc_io("nothing\n", Path::new("x")).is_err());
    assert_eq!(split_stat("1 (x) S"), Some(("x", " S")));
    assert_eq!(split_stat("no parens"), None);
}

#[test]
fn live_proc_has_this_process() {
    let p = ProcRoot::system();
    let me = std::process::id();
    assert!(p.pids().unwrap().contains(&me));
    assert!(p.tids(me).unwrap().contains(&me));
    assert!(p.thread_count(me).unwrap() >= 1);
    assert!(p.link_count().is_some());
    assert_eq!(p.stat(me).unwrap().ppid, p.ppid(me).unwrap());
    assert!(p.schedstat(me, me).unwrap().run_ns > 0);
}
