//! `/debug/pprof/profile` on a real host recording: the answer decodes as a
//! gzipped profile.proto whose samples carry the `vm`, `context` and
//! `process` labels and hold this test's own busy function; a bad `seconds`
//! is HTTP 400 naming it; two profiles taken at once and `/metrics` scraped
//! meanwhile, with silent and slow clients holding connections, all answer.
//! Needs root (system-wide perf_event_open); run under the heavy-job lock.

use prost::Message;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmscope_report::pprof::Profile;
use vmscope_serve::profile::ProfileOptions;
use vmscope_serve::{ServeOptions, Server};

/// One request: status line and body bytes. `limit` bounds every read.
fn get(addr: &str, path: &str, limit: Duration) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("GET {path}: no complete answer within {limit:?}: {e}"));
    let at = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP header");
    let head = String::from_utf8_lossy(&out[..at]).into_owned();
    (
        head.lines().next().unwrap_or("").to_string(),
        out[at + 4..].to_vec(),
    )
}

fn decode(gz: &[u8]) -> Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .expect("gzip");
    Profile::decode(raw.as_slice()).expect("profile.proto")
}

/// The labels of every sample as (key, string value or number).
fn labels(p: &Profile) -> Vec<Vec<(String, String)>> {
    let s = |i: i64| p.string_table[i as usize].clone();
    p.sample
        .iter()
        .map(|x| {
            x.label
                .iter()
                .map(|l| {
                    (
                        s(l.key),
                        if l.str != 0 {
                            s(l.str)
                        } else {
                            l.num.to_string()
                        },
                    )
                })
                .collect()
        })
        .collect()
}

/// Every function name of every sample's stack.
fn functions(p: &Profile) -> Vec<String> {
    let name: std::collections::HashMap<u64, String> = p
        .function
        .iter()
        .map(|f| (f.id, p.string_table[f.name as usize].clone()))
        .collect();
    let loc: std::collections::HashMap<u64, Vec<u64>> = p
        .location
        .iter()
        .map(|l| (l.id, l.line.iter().map(|x| x.function_id).collect()))
        .collect();
    let mut out = Vec::new();
    for s in &p.sample {
        for id in &s.location_id {
            for f in loc.get(id).into_iter().flatten() {
                out.push(name.get(f).cloned().unwrap_or_default());
            }
        }
    }
    out
}

/// The value of the series `series` (name and labels as exposed).
fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[inline(never)]
fn serve_pprof_test_spin(stop: &AtomicBool) -> u64 {
    let mut x: u64 = 1;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
    x
}

/// A server with `profile` on a free local port, running on a thread:
/// its address, the flag that stops it, the thread.
fn start(profile: ProfileOptions) -> (String, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let server = Server::bind(&ServeOptions {
        listen: "127.0.0.1:0".into(),
        per_cpu: false,
        shared_io: vec![],
        profile: Some(profile),
        ..ServeOptions::default()
    })
    .unwrap();
    let addr = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&stop);
    let h = std::thread::spawn(move || server.run(&s2));
    (addr, stop, h)
}

#[test]
fn pprof_endpoint_on_a_host_recording() {
    if !vmscope_testkit::require_root("a system-wide recording") {
        return;
    }
    let (addr, stop, h) = start(ProfileOptions {
        frequency: 199,
        callchain: true,
        window: 10,
        roles: vec![],
        overhead_budget: Some(0.01),
    });
    let spin_stop = Arc::new(AtomicBool::new(false));
    let ss = Arc::clone(&spin_stop);
    let spinner = std::thread::Builder::new()
        .name("pprof-spin".into())
        .spawn(move || serve_pprof_test_spin(&ss))
        .unwrap();

    // Bad seconds: 400, naming the value and the range, at once.
    for q in [
        "seconds=abc",
        "seconds=0",
        "seconds=-3",
        "seconds=11",
        "seconds=",
    ] {
        let t = Instant::now();
        let (status, body) = get(
            &addr,
            &format!("/debug/pprof/profile?{q}"),
            Duration::from_secs(2),
        );
        let body = String::from_utf8_lossy(&body);
        assert!(status.contains("400"), "{q}: {status}");
        assert!(
            body.contains(q) && body.contains("from 1 to 10"),
            "{q}: {body}"
        );
        assert!(t.elapsed() < Duration::from_secs(2), "{q} waited");
    }

    // Silent and slow clients hold connections meanwhile.
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let slow_addr = addr.clone();
    let dripping = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&slow_addr).unwrap();
        for b in b"GET /debug/pprof/profile?seconds=1 HTTP/1.1\r\nHost: x\r\n\r\n" {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    // Two profiles at once, /metrics scraped while they wait.
    let takers: Vec<_> = [2u32, 3]
        .into_iter()
        .map(|n| {
            let a = addr.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                let r = get(
                    &a,
                    &format!("/debug/pprof/profile?seconds={n}"),
                    Duration::from_secs(u64::from(n) + 10),
                );
                (n, t.elapsed(), r)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..3 {
        let t = Instant::now();
        let (status, body) = get(&addr, "/metrics", Duration::from_secs(2));
        assert!(status.contains("200"), "{status}");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("# EOF"));
        assert!(t.elapsed() < Duration::from_secs(2));
        // What the rolling profiler costs, exported with its budget.
        assert!(
            body.contains("vmscope_profiler_budget_ratio 0.01"),
            "no budget in /metrics:\n{body}"
        );
        assert!(
            metric(
                &body,
                "vmscope_profiler_observed_cpu_seconds_total{domain=\"host\"}"
            )
            .is_some(),
            "no host profiler cost in /metrics:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    for t in takers {
        let (n, took, (status, body)) = t.join().unwrap();
        assert!(status.contains("200"), "seconds={n}: {status}");
        // It waited its seconds, and not much more.
        assert!(
            took >= Duration::from_secs(u64::from(n))
                && took < Duration::from_secs(u64::from(n) + 4),
            "seconds={n} took {took:?}"
        );
        let p = decode(&body);
        let types: Vec<&str> = p
            .sample_type
            .iter()
            .map(|v| p.string_table[v.r#type as usize].as_str())
            .collect();
        assert_eq!(types, ["cpu-clock_samples", "cpu"], "seconds={n}");
        assert!(!p.sample.is_empty(), "seconds={n}: no samples");
        // The profile covers about its seconds (half-second slices).
        let covered = p.duration_nanos as f64 / 1e9;
        assert!(
            (covered - f64::from(n)).abs() <= 1.0,
            "seconds={n} covers {covered} s"
        );
        let ls = labels(&p);
        for l in &ls {
            let keys: Vec<&str> = l.iter().map(|(k, _)| k.as_str()).collect();
            for k in ["vm", "context", "process"] {
                assert!(
                    keys.contains(&k),
                    "seconds={n}: a sample without {k}: {l:?}"
                );
            }
        }
        assert!(
            ls.iter().any(|l| l.contains(&("vm".into(), "host".into()))
                && l.contains(&("process".into(), "pprof-spin".into()))),
            "seconds={n}: no host sample of the spinning thread"
        );
        let f = functions(&p);
        assert!(
            f.iter().any(|x| x.contains("serve_pprof_test_spin")),
            "seconds={n}: the busy function is not in any stack"
        );
        // The profile says what the recording cost in its seconds.
        let comments: Vec<&str> = p
            .comment
            .iter()
            .map(|c| p.string_table[*c as usize].as_str())
            .collect();
        assert!(
            comments
                .iter()
                .any(|c| c.starts_with("profiling cost in host: ") && c.contains("budget 1 %")),
            "seconds={n}: no cost comment: {comments:?}"
        );
        // Where the seconds come from, and no temporary file's name.
        assert!(
            comments
                .iter()
                .any(|c| c.starts_with("vmscope serve --profile")
                    && c.contains("s of its rolling recording")),
            "seconds={n}: {comments:?}"
        );
        assert!(
            !comments.iter().any(|c| c.contains("window.db")),
            "{comments:?}"
        );
    }
    drop(idle);
    spin_stop.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    let _ = dripping.join();
}

/// A budget the host recorder cannot keep at any rate: the rate it exports
/// falls to the controller's lowest (10 Hz) within seconds, and its cost
/// stays exported; without a budget the rate stays at the one asked for.
#[test]
fn an_overhead_budget_lowers_the_rolling_rate() {
    if !vmscope_testkit::require_root("a system-wide recording") {
        return;
    }
    for (budget, lowered) in [(Some(0.000_01), true), (None, false)] {
        let (addr, stop, h) = start(ProfileOptions {
            frequency: 997,
            callchain: true,
            window: 10,
            roles: vec![],
            overhead_budget: budget,
        });
        let series = "vmscope_profiler_sample_rate_hertz{domain=\"host\"}";
        let mut rate = None;
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(500));
            let (_, body) = get(&addr, "/metrics", Duration::from_secs(5));
            let body = String::from_utf8_lossy(&body);
            let cost = metric(&body, "vmscope_profiler_cpu_seconds_total{domain=\"host\"}");
            rate = metric(&body, series);
            // Lowered: down to the controller's lowest rate, 10 Hz.
            let want = if lowered { 10.0 } else { 997.0 };
            if cost.is_some_and(|c| c > 0.0) && rate == Some(want) {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
        let rate = rate.unwrap_or_else(|| panic!("budget {budget:?}: no {series}"));
        if lowered {
            assert_eq!(
                rate, 10.0,
                "budget {budget:?}: the rate did not fall to the lowest, 10 Hz"
            );
        } else {
            assert_eq!(rate, 997.0, "no budget: the rate moved to {rate} Hz");
        }
    }
}

/// Kills and reaps a process when the test ends, however it ends.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A VM that starts after the rolling recording began is taken in within
/// the scan interval: its samples carry its `vm` label (a host process's
/// before), it is counted passive, and `/metrics` keeps answering. The
/// "VM" is a shell busy loop whose `argv[0]` is QEMU's and whose command
/// line names it, which is what discovery reads from `/proc`.
#[test]
fn a_vm_started_later_gets_its_own_label() {
    use std::os::unix::process::CommandExt;
    if !vmscope_testkit::require_root("a system-wide recording") {
        return;
    }
    let (addr, stop, h) = start(ProfileOptions {
        frequency: 199,
        callchain: false,
        window: 10,
        roles: vec![],
        overhead_budget: None,
    });
    std::thread::sleep(Duration::from_secs(1));
    let name = format!("late{}", std::process::id());
    let vm = Reap(
        std::process::Command::new("/bin/sh")
            .arg0("qemu-system-x86_64")
            .args(["-c", "while :; do :; done", "-name"])
            .arg(format!("guest={name}"))
            .spawn()
            .unwrap(),
    );
    let pid = vm.0.id().to_string();
    // Within a scan interval (5 s) and a profile's 2 s after it.
    let until = Instant::now() + Duration::from_secs(30);
    // VM label → samples of the shell's process, while waiting.
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let found = loop {
        let (status, body) = get(
            &addr,
            "/debug/pprof/profile?seconds=2",
            Duration::from_secs(20),
        );
        assert!(status.contains("200"), "{status}");
        let p = decode(&body);
        let of_vm: Vec<Vec<(String, String)>> = labels(&p)
            .into_iter()
            .filter(|l| l.iter().any(|(k, v)| k == "vm" && v == &name))
            .collect();
        if !of_vm.is_empty() {
            break of_vm;
        }
        // Until then the loop is a host process.
        for (_, vm) in labels(&p)
            .into_iter()
            .filter(|l| l.iter().any(|(k, v)| k == "process" && v.contains("sh")))
            .filter_map(|l| l.into_iter().find(|(k, _)| k == "vm"))
        {
            *seen.entry(vm).or_default() += 1;
        }
        assert!(
            Instant::now() < until,
            "VM {name} (pid {pid}) never got its own label; the shell's samples were in {seen:?}"
        );
    };
    // Its user code is the VMM's, as for any VM's QEMU outside guest code.
    assert!(
        found
            .iter()
            .any(|l| l.iter().any(|(k, v)| k == "context" && v == "vmm-user")),
        "{found:?}"
    );
    let (status, body) = get(&addr, "/metrics", Duration::from_secs(5));
    assert!(status.contains("200"), "{status}");
    assert!(!body.is_empty());
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    drop(vm);
}
