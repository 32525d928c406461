//! Profiling and kernel symbols end to end on this machine: the built
//! `vmscope-agent` served over `--stdio`, driven by the real host client,
//! sampling the whole machine while `vmscope-agent demo` runs the 50/30/20
//! workload in another process. Sampling every CPU needs root (or
//! kernel.perf_event_paranoid <= -1); without it those tests say so and pass.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmscope_protocol::*;

const T: Duration = Duration::from_secs(30);

fn agent_bin() -> PathBuf {
    std::env::var_os("VMSCOPE_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vmscope-agent")))
}

struct Agent {
    child: Child,
    client: Option<AgentClient<UnixStream>>,
}

impl Agent {
    fn client(&mut self) -> &mut AgentClient<UnixStream> {
        self.client.as_mut().expect("connected")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn() -> Agent {
    let (host, guest) = UnixStream::pair().unwrap();
    let out = guest.try_clone().unwrap();
    let child = Command::new(agent_bin())
        .arg("--stdio")
        .stdin(Stdio::from(OwnedFd::from(guest)))
        .stdout(Stdio::from(OwnedFd::from(out)))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (client, hello) = AgentClient::connect(host, T).unwrap();
    assert!(hello.protocol >= 2);
    assert!(hello.capabilities.iter().any(|c| c == capability::PROFILE));
    assert!(hello.capabilities.iter().any(|c| c == capability::KALLSYMS));
    Agent {
        child,
        client: Some(client),
    }
}

fn can_sample_everything() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    if paranoid.is_some_and(|p| p <= -1) {
        return true;
    }
    vmscope_testkit::skip("sampling every CPU needs root or kernel.perf_event_paranoid <= -1");
    false
}

#[test]
fn demo_workload_shares_come_out_50_30_20() {
    if !can_sample_everything() {
        return;
    }
    let mut a = spawn();
    let c = a.client();
    let cfg = ProfileConfig {
        events: vec!["cpu-clock".into()],
        frequency: 1000,
        callchain: false,
        budget_ppm: None,
    };
    let ready = c.profile_start(&cfg, T).unwrap();
    assert_eq!(ready.events, ["cpu-clock"]);
    assert!(ready.cpus >= 1);
    assert!(ready.t_ns > 0);
    // The workload starts once sampling is armed (its mappings then come
    // from the ring's mmap records); poll every 500 ms as the host does
    // until it ends, then stop.
    let mut demo = Command::new(agent_bin())
        .args(["demo", "-d", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let demo_pid = demo.id();
    let mut all = Vec::new();
    let (mut samples, mut lost, mut seq) = (0, 0, 0);
    while demo.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(500));
        let d = c.profile_poll(T).unwrap();
        assert_eq!(d.seq, seq + 1, "sequence numbers follow each other");
        assert!(!d.last);
        seq = d.seq;
        samples += d.samples;
        lost += d.lost;
        all.extend(d.rows);
    }
    let end = c.profile_stop(T).unwrap();
    assert!(end.last);
    samples += end.samples;
    lost += end.lost;
    all.extend(end.rows);
    // No session any more.
    match c.profile_poll(T) {
        Err(ProtocolError::Remote { kind, .. }) => assert_eq!(kind, ErrorKind::NotRunning),
        other => panic!("{other:?}"),
    }
    let out = demo.wait_with_output().unwrap();
    assert!(out.status.success());

    let row_samples: u64 = all.iter().map(|r| r.samples).sum();
    assert!(row_samples <= samples, "{row_samples} > {samples}");
    assert!(samples >= 1000, "only {samples} samples in 3 s of 1 kHz");
    let mut by_symbol: HashMap<&str, u64> = HashMap::new();
    for r in &all {
        r.validate().unwrap();
        assert!(r.context == "guest-user" || r.context == "guest-kernel");
        if r.symbol.starts_with("vmscope_demo_") {
            assert_eq!(r.context, "guest-user", "{r:?}");
            assert!(
                r.image.ends_with("vmscope-agent"),
                "the demo functions come from the agent binary: {r:?}"
            );
            *by_symbol.entry(&r.symbol).or_default() += r.samples;
        }
    }
    let total: u64 = by_symbol.values().sum();
    eprintln!(
        "{samples} samples, {lost} lost, {} rows; demo pid {demo_pid}: {by_symbol:?}; {}",
        all.len(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    assert!(total >= 500, "{total} demo samples");
    for (name, want) in vmscope_workload::EXPECTED {
        let got = 100.0 * *by_symbol.get(name).unwrap_or(&0) as f64 / total as f64;
        assert!(
            (got - want).abs() <= 5.0,
            "{name}: {got:.1} % of the demo's samples, expected {want} %"
        );
    }
    // Kernel code of the guest is named from its own kallsyms.
    assert!(all.iter().any(|r| r.context == "guest-kernel"
        && r.image == "[kernel.kallsyms]"
        && !r.symbol.starts_with("0x")));
}

#[test]
fn kallsyms_of_the_guest_parse() {
    let mut a = spawn();
    let (text, modules) = a.client().kallsyms(T).unwrap();
    let k = vmscope_symbols::Kallsyms::parse(&text).unwrap();
    assert!(k.len() > 1000);
    if can_sample_everything() {
        // Root sees addresses, so names resolve.
        assert!(!k.is_restricted());
        assert!(k.iter().any(|s| s.name == "schedule"));
    }
    assert!(text.contains(" schedule\n"));
    let want: Vec<String> = std::fs::read_to_string("/proc/modules")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    // Modules can come and go between the two readings; usually they do not.
    assert_eq!(modules.len(), want.len());
    // A second transfer on the same connection takes a new snapshot.
    let (again, _) = a.client().kallsyms(T).unwrap();
    assert_eq!(again.len() / 1000, text.len() / 1000);
    // A slice beyond the snapshot is refused, the connection carries on.
    match a.client().request(
        &Request::GetKallsyms {
            offset: text.len() as u64 + 10,
        },
        T,
    ) {
        Err(ProtocolError::Remote { kind, .. }) => assert_eq!(kind, ErrorKind::BadRequest),
        other => panic!("{other:?}"),
    }
    a.client().ping(T).unwrap();
}

#[test]
fn unsupported_events_are_named_with_the_working_ones() {
    if !can_sample_everything() {
        return;
    }
    let mut a = spawn();
    let c = a.client();
    let cfg = ProfileConfig {
        events: vec!["instructions".into()],
        ..ProfileConfig::default()
    };
    match c.profile_start(&cfg, T) {
        Err(ProtocolError::Remote { kind, message }) => {
            assert_eq!(kind, ErrorKind::UnsupportedEvent, "{message}");
            assert!(message.contains("instructions"), "{message}");
            assert!(message.contains("cpu-clock"), "{message}");
        }
        Ok(_) => {
            eprintln!("this machine has a PMU: instructions can be sampled");
            c.profile_stop(T).unwrap();
        }
        Err(e) => panic!("{e}"),
    }
    // An unknown name is a bad request; the connection carries on.
    let cfg = ProfileConfig {
        events: vec!["no-such-event".into()],
        ..ProfileConfig::default()
    };
    match c.profile_start(&cfg, T) {
        Err(ProtocolError::Remote { kind, message }) => {
            assert_eq!(kind, ErrorKind::BadRequest, "{message}");
            assert!(message.contains("no-such-event"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // One session at a time; a stopped session can be followed by another.
    c.profile_start(&ProfileConfig::default(), T).unwrap();
    match c.profile_start(&ProfileConfig::default(), T) {
        Err(ProtocolError::Remote { kind, .. }) => assert_eq!(kind, ErrorKind::Busy),
        other => panic!("{other:?}"),
    }
    assert!(c.profile_stop(T).unwrap().last);
    c.profile_start(&ProfileConfig::default(), T).unwrap();
    c.ping(T).unwrap();
    // Hanging up ends the session and (on stdio) the agent.
    a.client = None;
    let t0 = Instant::now();
    loop {
        if let Some(st) = a.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(
            t0.elapsed() < T,
            "the agent did not end after the host hung up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn polls_without_a_session_are_refused() {
    let mut a = spawn();
    for r in [Request::ProfilePoll {}, Request::ProfileStop {}] {
        match a.client().request(&r, T) {
            Err(ProtocolError::Remote { kind, .. }) => assert_eq!(kind, ErrorKind::NotRunning),
            other => panic!("{other:?}"),
        }
    }
    match a.client().request(&Request::GetKallsyms { offset: 100 }, T) {
        Err(ProtocolError::Remote { kind, .. }) => assert_eq!(kind, ErrorKind::BadRequest),
        other => panic!("{other:?}"),
    }
}

/// Rounds per second printed by `vmscope-agent demo`.
fn demo_rate(seconds: &str) -> f64 {
    let out = Command::new(agent_bin())
        .args(["demo", "-d", seconds])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace()
        .skip_while(|w| *w != "rounds_per_s")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no rate in {text:?}"))
}

/// Throughput of the demo with and without the agent sampling every CPU at
/// 1 kHz (polled every 500 ms), alternating to spread out machine noise.
/// `cargo test -p vmscope-agent --test profile_e2e -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check: takes about 25 s"]
fn sampling_overhead_on_the_demo() {
    if !can_sample_everything() {
        return;
    }
    let (mut plain, mut sampled) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        plain.push(demo_rate("5"));
        let mut a = spawn();
        a.client()
            .profile_start(&ProfileConfig::default(), T)
            .unwrap();
        let poller = std::thread::spawn(move || {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(6) {
                std::thread::sleep(Duration::from_millis(500));
                a.client().profile_poll(T).unwrap();
            }
            let end = a.client().profile_stop(T).unwrap();
            // The agent's own CPU time: utime + stime in clock ticks.
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", a.child.id())).unwrap();
            let f: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            (end, ticks / hz / t0.elapsed().as_secs_f64())
        });
        std::thread::sleep(Duration::from_millis(300));
        sampled.push(demo_rate("5"));
        let (end, cpu) = poller.join().unwrap();
        assert!(end.last);
        eprintln!("agent CPU while sampling: {:.1} % of one CPU", 100.0 * cpu);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (p, s) = (mean(&plain), mean(&sampled));
    eprintln!(
        "demo rounds/s without sampling {plain:?} (mean {p:.1}), with 1 kHz sampling {sampled:?} \
         (mean {s:.1}): slowdown {:.1} %",
        100.0 * (p - s) / p
    );
}

/// Under a budget the agent cannot meet (1 ppm of the CPU), every delta
/// says what profiling cost, and the rate starts no higher than the slow
/// start (an eighth of the rate asked for; lower when the calibrated cost
/// of a sample says so) and is at the controller's lowest (10 Hz) within a
/// few polls; the samples per second fall with it. Without a budget the
/// rate stays at the one asked for.
#[test]
fn an_overhead_budget_lowers_the_agents_rate_and_every_delta_says_its_cost() {
    if !can_sample_everything() {
        return;
    }
    let mut a = spawn();
    let c = a.client();
    let mut demo = Command::new(agent_bin())
        .args(["demo", "-d", "6"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let cfg = ProfileConfig {
        events: vec!["cpu-clock".into()],
        frequency: 1000,
        callchain: false,
        budget_ppm: Some(1),
    };
    c.profile_start(&cfg, T).unwrap();
    let mut steps = Vec::new();
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(500));
        let d = c.profile_poll(T).unwrap();
        let cost = d.cost.expect("a delta without its cost");
        assert!(cost.capacity_ns > 0, "{cost:?}");
        steps.push((cost.rate_hz, d.samples, cost.capacity_ns));
    }
    let end = c.profile_stop(T).unwrap();
    let _ = demo.kill();
    let _ = demo.wait();
    assert!(end.cost.is_some());
    eprintln!("(rate Hz, samples, capacity ns) per poll: {steps:?}");
    assert!(
        steps[0].0 <= vmscope_model::budget::start_hz(1000),
        "the first step runs above the slow-start rate: {steps:?}"
    );
    let last = steps.last().unwrap();
    assert_eq!(last.0, vmscope_model::budget::MIN_RATE_HZ, "{steps:?}");
    // Samples per CPU-second over the last three polls: at 10 Hz at most
    // 10 (a little more for the polls' timing), where the next rate up
    // (31 Hz) gives at least 15 with one busy CPU of two.
    let tail = &steps[steps.len() - 3..];
    let per_cap = tail.iter().map(|s| s.1).sum::<u64>() as f64
        / (tail.iter().map(|s| s.2).sum::<u64>() as f64 / 1e9);
    assert!(
        per_cap <= 13.0,
        "samples did not fall with the rate ({per_cap:.1} per CPU-second): {steps:?}"
    );

    // No budget: the rate asked for throughout, cost still measured.
    let cfg = ProfileConfig {
        budget_ppm: None,
        ..cfg
    };
    c.profile_start(&cfg, T).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let d = c.profile_poll(T).unwrap();
    let end = c.profile_stop(T).unwrap();
    for cost in [d.cost.unwrap(), end.cost.unwrap()] {
        assert_eq!(cost.rate_hz, 1000);
    }
}
