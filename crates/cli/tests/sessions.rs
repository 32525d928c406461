//! Sessions built through the store without recording, shared by the
//! golden, browser and pprof tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use vmscope_model::{AggKey, Context, Domain, Profile, Role, SessionEvent};
use vmscope_store::{BenchSampleRow, DomainRecord, IntervalRow, ScaleRow, SessionWriter};

fn key(
    event: u32,
    domain: &str,
    context: Context,
    process: &str,
    image: &str,
    symbol: &str,
    stack: &str,
) -> AggKey {
    AggKey {
        event,
        domain: Arc::from(domain),
        context,
        process: Arc::from(process),
        image: Arc::from(image),
        symbol: Arc::from(symbol),
        stack: Arc::from(stack),
        srcline: Arc::from(""),
        second: 0,
        cpu: 0,
    }
}

/// A session with everything a report can show, built without recording.
/// `variant` 1 is the same machine in another configuration (for
/// `compare`): the guest's request parsing costs more, the host's make less.
pub fn coordinated_session(path: &Path, variant: u32) {
    use Context::*;
    type Row<'a> = (
        u32,
        &'a str,
        Context,
        &'a str,
        &'a str,
        &'a str,
        &'a str,
        u64,
        u64,
    );
    let mut w = SessionWriter::create(path).unwrap();
    for (k, v) in [
        ("vmscope_version", "golden"),
        ("source", "record"),
        ("command", "vmscope record -a -g -d 2 --vm web=active"),
        ("hostname", "golden-host"),
        ("kernel", "6.1.0-golden"),
        ("cpus", "2"),
        ("duration_s", "2.000"),
        ("started_at", "1700000000"),
        ("vms", "2"),
        ("accel", "tcg"),
        ("agent_db", "passive: its agent did not answer within 3 s (fix: check that vmscope-agent runs in the guest (systemctl status vmscope-agent))"),
    ] {
        w.set_meta(k, v).unwrap();
    }
    w.set_events(&[
        SessionEvent {
            name: "cpu-clock".into(),
            period: None,
            frequency: Some(1000),
        },
        SessionEvent {
            name: "page-faults".into(),
            period: Some(1),
            frequency: None,
        },
    ])
    .unwrap();
    let domains = [
        (Domain::host(), "running", None, ""),
        (
            Domain {
                name: "web".into(),
                role: Role::Active,
                pid: Some(4100),
            },
            "running",
            None,
            "2 vCPU thread(s), 1 I/O thread(s), accelerator tcg",
        ),
        (
            Domain {
                name: "db".into(),
                role: Role::Passive,
                pid: Some(5200),
            },
            "ended",
            Some(1.5),
            "1 vCPU thread(s), accelerator tcg; exited at 1.50 s",
        ),
    ];
    for (domain, status, ended_at, detail) in domains {
        w.upsert_domain(&DomainRecord {
            domain,
            status: status.into(),
            ended_at,
            detail: detail.into(),
        })
        .unwrap();
    }
    let ms = 1_000_000u64;
    let mut host = Profile::new();
    let host_rows: &[Row] = &[
        (
            0,
            "host",
            HostUser,
            "make",
            "/usr/bin/make",
            "main",
            "_start;main",
            40,
            40 * ms,
        ),
        (
            0,
            "host",
            HostUser,
            "make",
            "/usr/bin/make",
            "hash_find",
            "_start;main;hash_find",
            25,
            25 * ms,
        ),
        (
            0,
            "host",
            HostKernel,
            "make",
            "[kernel.kallsyms]",
            "clear_page_erms",
            "_start;main;asm_exc_page_fault;clear_page_erms",
            15,
            15 * ms,
        ),
        (
            0,
            "host",
            HostKernel,
            "kworker/0:1",
            "[kernel.kallsyms]",
            "process_one_work",
            "ret_from_fork;kthread;process_one_work",
            6,
            6 * ms,
        ),
        (
            0,
            "host",
            HostKernel,
            "kworker/0:1",
            "[e1000e]",
            "e1000_clean",
            "ret_from_fork;kthread;e1000_clean",
            4,
            4 * ms,
        ),
        (
            0,
            "host",
            Idle,
            "swapper",
            "[kernel.kallsyms]",
            "default_idle",
            "",
            300,
            300 * ms,
        ),
        (
            0,
            "web",
            GuestTranslated,
            "CPU 0/TCG",
            "[anon]",
            "[translated guest code]",
            "",
            900,
            900 * ms,
        ),
        (
            0,
            "web",
            GuestTranslated,
            "CPU 1/TCG",
            "[anon]",
            "[translated guest code]",
            "",
            500,
            500 * ms,
        ),
        (
            0,
            "web",
            VmmUser,
            "CPU 0/TCG",
            "/usr/bin/qemu-system-x86_64",
            "cpu_exec",
            "start_thread;cpu_exec",
            120,
            120 * ms,
        ),
        (
            0,
            "web",
            VmmUser,
            "qemu-system-x86",
            "/usr/bin/qemu-system-x86_64",
            "main_loop_wait",
            "main;main_loop_wait",
            30,
            30 * ms,
        ),
        (
            0,
            "web",
            VmmKernel,
            "CPU 0/TCG",
            "[kernel.kallsyms]",
            "do_syscall_64",
            "start_thread;ioctl;do_syscall_64",
            20,
            20 * ms,
        ),
        (
            0,
            "db",
            GuestTranslated,
            "CPU 0/TCG",
            "[anon]",
            "[translated guest code]",
            "",
            700,
            700 * ms,
        ),
        (
            0,
            "db",
            VmmUser,
            "CPU 0/TCG",
            "/usr/bin/qemu-system-x86_64",
            "tb_gen_code",
            "start_thread;tb_gen_code",
            60,
            60 * ms,
        ),
        (
            1,
            "host",
            HostUser,
            "make",
            "/usr/bin/make",
            "main",
            "_start;main",
            12,
            12,
        ),
        (
            1,
            "web",
            VmmUser,
            "qemu-system-x86",
            "/usr/bin/qemu-system-x86_64",
            "main_loop_wait",
            "main;main_loop_wait",
            3,
            3,
        ),
    ];
    for (i, &(e, d, c, p, img, s, st, n, period)) in host_rows.iter().enumerate() {
        let mut k = key(e, d, c, p, img, s, st);
        // Time and CPU: rows alternate between seconds 0 and 1 and CPUs 0 and 1.
        k.second = (i % 2) as u32;
        k.cpu = ((i / 2) % 2) as u32;
        if s == "main" || s == "hash_find" {
            k.srcline = Arc::from(if s == "main" {
                "/src/make/main.c:42"
            } else {
                "/src/make/hash.c:7"
            });
        }
        let (n, period) = match (variant, s) {
            (1, "main") => (n / 2, period / 2),
            _ => (n, period),
        };
        host.add(k, n, period);
    }
    for (sec, d, c, n) in [
        (0, "host", HostUser, 30),
        (1, "host", HostUser, 35),
        (0, "web", GuestTranslated, 700),
        (1, "web", GuestTranslated, 700),
        (0, "db", GuestTranslated, 700),
    ] {
        host.add_bin(sec, 0, Arc::from(d), c, n);
    }
    host.add_lost(0, 7);
    w.flush(&host).unwrap();
    let mut agent = Profile::new();
    let agent_rows: &[(&str, Context, &str, &str, &str, &str, u64)] = &[
        (
            "web",
            GuestUser,
            "httpd",
            "/usr/sbin/httpd",
            "parse_request",
            "main;serve;parse_request",
            300,
        ),
        (
            "web",
            GuestUser,
            "httpd",
            "/usr/sbin/httpd",
            "send_file",
            "main;serve;send_file",
            200,
        ),
        (
            "web",
            GuestKernel,
            "httpd",
            "[kernel.kallsyms]",
            "tcp_sendmsg",
            "main;serve;send_file;entry_SYSCALL_64;tcp_sendmsg",
            150,
        ),
        (
            "web",
            GuestKernel,
            "swapper",
            "[kernel.kallsyms]",
            "native_safe_halt",
            "",
            400,
        ),
        (
            "web",
            GuestKernel,
            "kworker/u4:2",
            "[virtio_net]",
            "virtnet_poll",
            "ret_from_fork;virtnet_poll",
            50,
        ),
    ];
    for (i, &(d, c, p, img, s, st, n)) in agent_rows.iter().enumerate() {
        let mut k = key(0, d, c, p, img, s, st);
        // The guest CPU (vCPU index) the agent reports; seconds 0 and 1.
        k.cpu = (i % 2) as u32;
        k.second = ((i / 2) % 2) as u32;
        let n = if variant == 1 && s == "parse_request" {
            n * 2
        } else {
            n
        };
        agent.add(k, n, n * ms);
    }
    w.flush_agent(&agent).unwrap();
    w.set_scale(&ScaleRow {
        domain: "web".into(),
        event: 0,
        host_period: 1400 * ms,
        agent_period: 700 * ms,
        agent_samples: 1100,
        agent_lost: 3,
        factor: 2.0,
    })
    .unwrap();
    w.set_build_ids(&[("/usr/bin/make".into(), "4f1e3c2b00aa".into())])
        .unwrap();
    // vm-stat and accounting intervals and benchmark rows, in the shapes
    // `stat -o`, `account -o` and `bench` store them, for the report's
    // interval tables and the HTML report's charts.
    let iv = |kind: &str,
              t: f64,
              cpu: Option<u32>,
              domain: Option<&str>,
              vcpu: Option<&str>,
              metric: &str,
              value: f64,
              unit: &str| IntervalRow {
        kind: kind.into(),
        t_start: t,
        t_end: t + 1.0,
        cpu,
        domain: domain.map(str::to_string),
        vcpu: vcpu.map(str::to_string),
        metric: metric.into(),
        value,
        unit: unit.into(),
    };
    for (t, web, db) in [(0.0, 0.615, 0.35), (1.0, 0.7, 0.0)] {
        w.add_intervals(&[
            iv("stat", t, Some(0), None, None, "busy", web + 0.05, "s"),
            iv("stat", t, Some(0), Some("web"), Some("0"), "time", web, "s"),
            iv(
                "stat",
                t,
                Some(0),
                Some("host"),
                Some("host"),
                "time",
                0.05,
                "s",
            ),
            iv("stat", t, Some(1), None, None, "busy", db, "s"),
            iv("stat", t, Some(1), Some("db"), Some("0"), "time", db, "s"),
            iv("account", t, None, Some("web"), None, "vcpu_run", web, "s"),
            iv(
                "account",
                t,
                None,
                Some("web"),
                None,
                "total",
                web + 0.02,
                "s",
            ),
            iv("account", t, None, Some("db"), None, "vcpu_run", db, "s"),
            iv("account", t, None, Some("db"), None, "total", db, "s"),
            iv(
                "account",
                t,
                None,
                None,
                None,
                "measured_host",
                web + db + 0.07,
                "s",
            ),
        ])
        .unwrap();
    }
    let bench = |point: &str, value: f64| BenchSampleRow {
        experiment: "web".into(),
        config_hash: "h1".into(),
        manifest: "{}".into(),
        point: point.into(),
        sample: 0,
        metric: "throughput".into(),
        value,
        unit: "req/s".into(),
        raw_output: None,
        flagged: None,
    };
    w.add_bench_samples(&[bench("rate=40", 39.5), bench("rate=80", 61.0)])
        .unwrap();
    w.finish(true).unwrap();
}

/// A host-only session without call stacks and with only `event`.
pub fn flat_session(path: &Path, event: &str) {
    let mut w = SessionWriter::create(path).unwrap();
    w.set_meta("duration_s", "3.000").unwrap();
    w.set_meta("cpus", "2").unwrap();
    w.set_events(&[SessionEvent {
        name: event.into(),
        period: Some(1),
        frequency: None,
    }])
    .unwrap();
    w.upsert_domain(&DomainRecord {
        domain: Domain::host(),
        status: "running".into(),
        ended_at: None,
        detail: String::new(),
    })
    .unwrap();
    let mut p = Profile::new();
    for (i, s) in ["alpha", "beta"].iter().enumerate() {
        let mut k = key(0, "host", Context::HostUser, "app", "/usr/bin/app", s, "");
        k.second = i as u32;
        k.cpu = i as u32;
        p.add(k, 10, 10);
    }
    w.flush(&p).unwrap();
    w.finish(true).unwrap();
}

/// A 2.6-second session whose every rate is known, for the charts: the
/// host busy 0.5 CPU and VM `web` 1.0 CPU throughout (cpu-clock at
/// 100 Hz, so 50 and 100 samples a second, and 30 and 60 in the last
/// 0.6 s); the host profiler at 99 Hz costing 0.01 CPU in 1 s steps and a
/// last 50 ms one; `web`'s vCPUs run 0.8 CPU and are charged 0.9; vm-stat
/// sees `web` at 0.4 CPU on each of two host CPUs (0.8 in all). The
/// expected value of every line, by chart unit, is [`KNOWN_RATES`].
pub fn known_rates_session(path: &Path) {
    let mut w = SessionWriter::create(path).unwrap();
    for (k, v) in [("source", "record"), ("duration_s", "2.600"), ("cpus", "2")] {
        w.set_meta(k, v).unwrap();
    }
    w.set_events(&[SessionEvent {
        name: "cpu-clock".into(),
        period: None,
        frequency: Some(100),
    }])
    .unwrap();
    for domain in [
        Domain::host(),
        Domain {
            name: "web".into(),
            role: Role::Passive,
            pid: Some(4100),
        },
    ] {
        w.upsert_domain(&DomainRecord {
            domain,
            status: "running".into(),
            ended_at: None,
            detail: String::new(),
        })
        .unwrap();
    }
    let mut p = Profile::new();
    for (second, host, web) in [(0, 50, 100), (1, 50, 100), (2, 30, 60)] {
        let mut k = key(
            0,
            "host",
            Context::HostUser,
            "make",
            "/usr/bin/make",
            "main",
            "",
        );
        k.second = second;
        p.add(k, host, host * 10_000_000);
        p.add_bin(second, 0, Arc::from("host"), Context::HostUser, host);
        let mut k = key(0, "web", Context::GuestUser, "nginx", "nginx", "parse", "");
        k.second = second;
        p.add(k, web, web * 10_000_000);
        p.add_bin(second, 0, Arc::from("web"), Context::GuestUser, web);
    }
    w.flush(&p).unwrap();
    let row = |kind: &str,
               t: (f64, f64),
               cpu: Option<u32>,
               domain: &str,
               metric: &str,
               value: f64,
               unit: &str| IntervalRow {
        kind: kind.into(),
        t_start: t.0,
        t_end: t.1,
        cpu,
        domain: Some(domain.into()),
        vcpu: None,
        metric: metric.into(),
        value,
        unit: unit.into(),
    };
    let mut rows = Vec::new();
    for t in [(0.0, 1.0), (1.0, 2.0), (2.0, 2.55), (2.55, 2.6)] {
        let len = t.1 - t.0;
        rows.push(row("profiler", t, None, "host", "rate", 99.0, "Hz"));
        rows.push(row("profiler", t, None, "host", "cost", 0.01 * len, "s"));
        rows.push(row("account", t, None, "web", "vcpu_run", 0.8 * len, "s"));
        rows.push(row("account", t, None, "web", "total", 0.9 * len, "s"));
    }
    for i in 0..5 {
        let t = (f64::from(i) * 0.5, f64::from(i + 1) * 0.5);
        for cpu in 0..2 {
            rows.push(row("stat", t, Some(cpu), "web", "time", 0.4 * 0.5, "s"));
        }
    }
    w.add_intervals(&rows).unwrap();
    w.finish(true).unwrap();
}

/// [`known_rates_session`]'s charts: (title start, y-axis label, line,
/// value of every point).
pub const KNOWN_RATES: &[(&str, &str, &str, f64)] = &[
    (
        "Each domain over time",
        "CPUs busy (samples per second / frequency)",
        "host",
        0.5,
    ),
    (
        "Each domain over time",
        "CPUs busy (samples per second / frequency)",
        "web",
        1.0,
    ),
    ("Profilers", "Hz", "host rate", 99.0),
    ("Profilers", "CPUs (seconds per second)", "host cost", 0.01),
    (
        "Accounting",
        "CPUs (seconds per second)",
        "web vcpu_run",
        0.8,
    ),
    ("Accounting", "CPUs (seconds per second)", "web total", 0.9),
    ("vm-stat", "CPUs (seconds per second)", "web", 0.8),
];

/// An `account -o` session of two 1 s intervals with the waited-behind
/// split: web's vCPUs waited 0.4 s a second behind db's vCPU 0 and 0.1 s
/// behind a host backup task; db's 0.3 s behind web's vCPU 0; and web's
/// I/O thread 0.05 s behind idle (not in the vCPU matrix).
pub fn wait_session(path: &Path) {
    let mut w = SessionWriter::create(path).unwrap();
    for (k, v) in [
        ("source", "account"),
        ("duration_s", "2.000"),
        ("cpus", "2"),
    ] {
        w.set_meta(k, v).unwrap();
    }
    for t in [0.0, 1.0] {
        let row = |domain: &str, metric: &str, value: f64| IntervalRow {
            kind: "account".into(),
            t_start: t,
            t_end: t + 1.0,
            cpu: None,
            domain: Some(domain.into()),
            vcpu: None,
            metric: metric.into(),
            value,
            unit: "s".into(),
        };
        w.add_intervals(&[
            row("web", "vcpu_runnable", 0.5),
            row("web", "waited_behind db vCPU 0", 0.4),
            row("web", "waited_behind host backup (pid 812)", 0.1),
            row("web", "io_waited_behind idle", 0.05),
            row("db", "vcpu_runnable", 0.3),
            row("db", "waited_behind web vCPU 0", 0.3),
        ])
        .unwrap();
    }
    w.finish(true).unwrap();
}
