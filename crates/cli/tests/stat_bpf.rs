//! `stat --source bpf` (run time summed in the kernel by an eBPF program on
//! sched_switch) against today's sources, live: a synthetic QEMU (the
//! `fake_qemu` example of vmscope-stat) whose 4 vCPU threads each run
//! about 10 % of a CPU; `stat --source bpf` and `stat --source
//! sched-switch` run side by side over the same 3 s; the bpf source's VM
//! vCPU time is held to the vCPU threads' own `schedstat` over that window
//! (within 5 points of one CPU), and all three are printed as numbers.
//!
//! Prints `SKIP: <reason>` without root or without BPF.

mod common;

use common::fake_qemu;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");

use vmscope_testkit::{is_root, skip};

/// Summed run time of every thread of `pid` (ns).
fn run_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// The VM's vCPU percent of one CPU, the median of the intervals after the
/// first, from `stat --format json` output.
fn vm_vcpu_pct(out: &str, name: &str) -> Option<f64> {
    let mut domain = None;
    let mut per_interval: Vec<(f64, f64)> = Vec::new();
    for l in out.lines() {
        let v: Value = serde_json::from_str(l).ok()?;
        match v["type"].as_str() {
            Some("legend") => {
                let legend = v["legend"].as_str()?;
                domain = legend.split(' ').find_map(|w| {
                    let (d, n) = w.split_once('=')?;
                    (n == name).then(|| d.trim_start_matches('d').parse::<u64>().ok())?
                });
            }
            Some("cpu") => {
                let t = v["time_s"].as_f64()?;
                let pct: f64 = v["cells"]
                    .as_array()?
                    .iter()
                    .filter(|c| c["domain"].as_u64() == domain && c["kind"].get("vcpu").is_some())
                    .filter_map(|c| c["pct"].as_f64())
                    .sum();
                match per_interval.last_mut() {
                    Some(last) if (last.0 - t).abs() < 1e-9 => last.1 += pct,
                    _ => per_interval.push((t, pct)),
                }
            }
            _ => {}
        }
    }
    let rest = per_interval.get(1..)?;
    eprintln!(
        "{name} per interval (time s, % of one CPU): {:?}",
        per_interval
            .iter()
            .map(|p| (format!("{:.2}", p.0), format!("{:.1}", p.1)))
            .collect::<Vec<_>>()
    );
    // The median interval: the /proc/stat fit (tick-sampled bounds on this
    // bursty load) cuts one interval of a run now and then for both
    // sources alike (34.8 % where its neighbours read 40.0 %), a bias of
    // the fit noted in docs/stat.md, not of the source.
    let mut v: Vec<f64> = rest.iter().map(|p| p.1).collect();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

#[test]
fn bpf_source_agrees_with_the_threads_schedstat() {
    if !is_root() {
        skip("needs root for the eBPF program and the tracepoint");
        return;
    }
    let probe = Command::new(VMSCOPE)
        .args(["stat", "--source", "bpf", "-i", "50ms", "-n", "1"])
        .output()
        .unwrap();
    if !probe.status.success() {
        skip(&format!(
            "eBPF source unavailable: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
        return;
    }
    let bin = match fake_qemu() {
        Ok(b) => b,
        Err(why) => {
            skip(&why);
            return;
        }
    };
    let name = "statbpf";
    let (fake, pid, _) = common::start_fake_qemu(
        Command::new(&bin)
            .args([
                "--vcpus",
                "4",
                "--name",
                name,
                "--period-ms",
                "18",
                "--spin-us",
                "2000",
            ])
            .stdin(Stdio::null()),
    );
    let spawn = |src: &str| {
        Command::new(VMSCOPE)
            .args([
                "stat", "--source", src, "-i", "500ms", "-n", "7", "--format", "json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let bpf = spawn("bpf");
    let sw = spawn("sched-switch");
    // The window of the intervals after the first (both start within a
    // few ms; the start-up is not in it).
    std::thread::sleep(Duration::from_millis(650));
    let r0 = run_ns(pid);
    let t0 = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(3000));
    let r1 = run_ns(pid);
    let dt = t0.elapsed().as_secs_f64();
    let bpf = bpf.wait_with_output().unwrap();
    let sw = sw.wait_with_output().unwrap();
    drop(fake);
    assert!(
        bpf.status.success(),
        "{}",
        String::from_utf8_lossy(&bpf.stderr)
    );
    assert!(
        sw.status.success(),
        "{}",
        String::from_utf8_lossy(&sw.stderr)
    );
    let sched = 100.0 * (r1 - r0) as f64 / 1e9 / dt;
    let b = vm_vcpu_pct(&String::from_utf8_lossy(&bpf.stdout), name).expect("bpf rows");
    let s = vm_vcpu_pct(&String::from_utf8_lossy(&sw.stdout), name).expect("sched_switch rows");
    eprintln!(
        "VM vCPU time, % of one CPU: bpf {b:.1}, sched_switch {s:.1}, the threads' schedstat {sched:.1} \
         (bpf - schedstat {:.1} points, bpf - sched_switch {:.1} points)",
        b - sched,
        b - s
    );
    assert!(
        sched > 10.0,
        "the synthetic vCPUs did not run: {sched:.1} %"
    );
    assert!(
        (b - sched).abs() < 5.0,
        "bpf {b:.1} % vs schedstat {sched:.1} %"
    );
    // The sched_switch source is printed beside it, not asserted on: the
    // threads' own schedstat is the reference, and sched_switch's own
    // agreement is `tests/stat.rs`'s (against pidstat). One run here read
    // sched_switch 8.6 points under schedstat while bpf was 1.9 under.
    let _ = s;
}
