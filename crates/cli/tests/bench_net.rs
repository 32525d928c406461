//! `vmscope bench net`, `bench scale` and `bench overhead` through the built binary
//! on one lab (issue 15), booted once: two one-vCPU VMs with tap NICs
//! (`netbench-a`, `netbench-b`) and a two-vCPU VM with user networking
//! only (`netbench-u`).
//!
//! - `bench net`: host->VM, VM->host and VM->VM with the engine at two
//!   receive buffers and iperf3 beside it: every point's samples, bytes,
//!   host CPU per Gbit, the VMs' vCPU time and I/O charge from the
//!   accountant, the agreement lines with their ratio, the chart, the TCG
//!   note; a VM with user networking only is one clear error, exit 2.
//! - `bench scale`: the four modes at N = 1, 2 on the same lab (the tap
//!   VMs are the one-vCPU VMs, `netbench-u` the two-vCPU one).
//! - `bench overhead`: the workload in `netbench-a` with no profiler and
//!   `vmscope record -a` (VMs passive, then active: guest samples arrive),
//!   and on the host against `perf record -a`.
//!
//! Prints `SKIP: <reason>` and passes when root, QEMU, iperf3 or the
//! static agent are missing.

mod common;
use common::*;
use serde_json::Value;
use std::process::{Command, Output};

/// `vmscope ARGS --cache-dir --run-dir` of the lab (a benchmark command).
fn bench_in(lab: &TestLab, args: &[&str]) -> Command {
    let mut c = lab.vmscope(args);
    c.arg("--cache-dir")
        .arg(&lab.env.cache)
        .arg("--run-dir")
        .arg(&lab.env.run);
    c
}

/// The lab's network as the host and each tap VM see it, for a failure
/// message: a run once found no VM reachable over its bridge (every
/// connection "No route to host") and said nothing more.
fn network_state(lab: &TestLab) -> String {
    let run = |c: &mut Command| {
        c.output().map_or_else(
            |e| format!("({e})"),
            |o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            },
        )
    };
    // Packet counters on both sides say which way traffic stops: a tap
    // whose TX grows while the guest's RX does not is a guest (or
    // QEMU) that does not take packets.
    let mut s = format!(
        "host addresses:\n{}host bridge ports:\n{}host neighbours:\n{}host links with counters:\n{}",
        run(Command::new("ip").args(["-br", "addr"])),
        run(Command::new("bridge").arg("link")),
        run(Command::new("ip").arg("neigh")),
        run(Command::new("ip").args(["-s", "link"])),
    );
    for vm in ["netbench-a", "netbench-b"] {
        // The guest's busybox `ip` has no `-br`.
        for (what, cmd) in [
            ("addresses", &["ip", "addr"][..]),
            ("link counters", &["cat", "/proc/net/dev"][..]),
            ("interrupts", &["cat", "/proc/interrupts"][..]),
            ("kernel log", &["dmesg"][..]),
        ] {
            let mut args = vec!["exec", vm, "--"];
            args.extend_from_slice(cmd);
            s.push_str(&format!("{vm} {what}:\n{}", run(&mut lab.cmd(&args))));
        }
        s.push_str(&format!("{vm} virtio-net queues:\n{}", nic_queues(lab, vm)));
    }
    s
}

/// QEMU's side of a VM's virtio-net queues (QMP), and the guest's
/// avail index read from guest memory: an index QEMU stopped reading
/// while the guest's runs ahead is a notification lost between them.
fn nic_queues(lab: &TestLab, vm: &str) -> String {
    use vmscope_discover::qmp::Qmp;
    let sock = lab.env.run.join(&lab.name).join(vm).join("qmp.sock");
    let mut q = match Qmp::connect(&sock, std::time::Duration::from_secs(5)) {
        Ok(q) => q,
        Err(e) => return format!("({e})\n"),
    };
    let mut out = String::new();
    let devs = q.execute("x-query-virtio", None).unwrap_or_default();
    for d in devs.as_array().into_iter().flatten() {
        if d["name"] != "virtio-net" {
            continue;
        }
        let path = d["path"].clone();
        let st = q
            .execute(
                "x-query-virtio-status",
                Some(serde_json::json!({ "path": path })),
            )
            .unwrap_or_default();
        out.push_str(&format!(
            "  broken {} vm-running {} started {}\n",
            st["broken"], st["vm-running"], st["started"]
        ));
        for (queue, name) in [(0, "rx"), (1, "tx")] {
            let qs = q
                .execute(
                    "x-query-virtio-queue-status",
                    Some(serde_json::json!({ "path": path, "queue": queue })),
                )
                .unwrap_or_default();
            let avail = qs["vring-avail"].as_u64().unwrap_or(0);
            let guest_idx = q
                .execute(
                    "human-monitor-command",
                    Some(
                        serde_json::json!({ "command-line": format!("xp /1hx {:#x}", avail + 2) }),
                    ),
                )
                .unwrap_or_default();
            out.push_str(&format!(
                "  {name}: last-avail {} shadow-avail {} used {} inuse {}; guest avail index {}\n",
                qs["last-avail-idx"],
                qs["shadow-avail-idx"],
                qs["used-idx"],
                qs["inuse"],
                guest_idx.as_str().unwrap_or("?").trim()
            ));
        }
    }
    out
}

const SPEC: &str = r#"name = "netbench-t"
accel = "auto"

[[vm]]
name = "netbench-a"
vcpus = 1
memory_mib = 192
pin_vcpus = [0]

[[vm.nic]]
kind = "tap"

[[vm]]
name = "netbench-b"
vcpus = 1
memory_mib = 192
pin_vcpus = [1]

[[vm.nic]]
kind = "tap"

[[vm]]
name = "netbench-u"
vcpus = 2
memory_mib = 192

[[vm.nic]]
kind = "user"
"#;

fn json_lines(out: &Output, what: &str) -> Vec<Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

#[test]
fn lab_bench_net_scale_overhead() {
    let env = need_lab!("nr", &[("iperf3", "iperf3"), ("ldd", "libc-bin")]);
    let lab = TestLab::new(env, "netbench-t");
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("netbench-t.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let spec_s = spec.to_str().unwrap();
    let up = lab
        .cmd(&["up", spec_s, "--hello-timeout", "180"])
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "lab up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let st = vmscope_lab::load_state_in(&lab.env.run, &lab.name).unwrap();
    let tcg = st.accel != "kvm";

    // (1) bench net: three paths, the engine at 4 KiB and 64 KiB, iperf3.
    let charts = dir.path().join("charts");
    let out = bench_in(
        &lab,
        &[
            "bench",
            "net",
            "--quiet",
            "--lab",
            spec_s,
            "--path",
            "host:netbench-a",
            "--path",
            "netbench-a:host",
            "--path",
            "netbench-a:netbench-b",
            "--recv-buf",
            "4k,64k",
            "--seconds",
            "2",
            "--repeat",
            "2",
            "--max-repeat",
            "2",
            "--warmup",
            "0",
            // Other engineers' builds share this host: keep flagged samples
            // rather than redo them.
            "--busy-retries",
            "0",
            "--format",
            "json",
            "--out-dir",
            charts.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    if !out.status.success() {
        eprintln!(
            "bench net failed; the lab's network:\n{}",
            network_state(&lab)
        );
    }
    let lines = json_lines(&out, "bench net");
    let of = |ty: &'static str| lines.iter().filter(move |v| v["type"] == ty);
    let summaries: Vec<&Value> = of("summary").collect();
    assert_eq!(summaries.len(), 3 * 3, "3 paths × (2 buffers + iperf3)");
    for s in &summaries {
        eprintln!(
            "{}: {:.1} Mbit/s ± {:.1}, host CPU {:.2} s/Gbit, VM I/O charge {:?} s",
            s["point"],
            s["mean"].as_f64().unwrap_or(0.0) * 8e-6,
            s["ci95"].as_f64().unwrap_or(0.0) * 8e-6,
            s["host_cpu_per_gbit"].as_f64().unwrap_or(0.0),
            s["vm_io_charge_s"]
        );
        assert!(s["failed"].is_null(), "{s}");
        assert_eq!(s["n"], 2, "{s}");
        assert!(s["mean"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["host_cpu_per_gbit"].as_f64().unwrap() > 0.0, "{s}");
    }
    let samples = |metric: &'static str| {
        of("sample")
            .filter(move |v| v["metric"] == metric)
            .collect::<Vec<_>>()
    };
    assert_eq!(samples("throughput").len(), 9 * 2);
    assert!(samples("throughput")
        .iter()
        .all(|v| v["unit"] == "bytes/s" && v["value"].as_f64().unwrap() > 0.0));
    // The engine's own accounts on both sides, and the accountant's per VM.
    assert_eq!(samples("receiver_cpu").len(), 3 * 2 * 2);
    assert_eq!(samples("vm_io_charge").len(), 9 * 2, "every path has a VM");
    let vcpu: Vec<f64> = samples("vm_vcpu")
        .iter()
        .map(|v| v["value"].as_f64().unwrap())
        .collect();
    assert!(
        vcpu.iter().filter(|x| **x > 0.0).count() * 2 > vcpu.len(),
        "the VMs' vCPUs ran in most samples: {vcpu:?}"
    );
    // Side by side with iperf3 on each path. Under TCG the guest's network
    // stack and both tools run emulated on a 2-CPU host other builds
    // share, and 2-second runs spread widely: on this machine the engine /
    // iperf3 ratio of the same path ranged 0.97-2.34 from run to run
    // (VM->host the widest). There the ratio is printed and a factor of 3
    // held (bits for bytes, a wrong byte count or clock still fail it);
    // the 10 % claim is the yes/no line, and held under KVM.
    let checks: Vec<&Value> = of("check").collect();
    assert_eq!(checks.len(), 3, "{checks:?}");
    for c in &checks {
        eprintln!("check: {} {}: {}", c["verdict"], c["claim"], c["detail"]);
        let r = c["ratio"].as_f64().unwrap();
        let (lo, hi) = if tcg { (1.0 / 3.0, 3.0) } else { (0.9, 1.1) };
        assert!(r > lo && r < hi, "engine / iperf3 = {r}: {c}");
    }
    let png = std::fs::read(charts.join("net-throughput.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    if tcg {
        assert!(
            of("note").any(|n| n["message"].as_str().unwrap().contains("TCG")),
            "the TCG note"
        );
    }

    // (2) A VM with user networking only cannot carry the test.
    let out = bench_in(
        &lab,
        &["bench", "net", "--quiet", "--path", "host:netbench-u"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("vmscope: error:"))
            .count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("netbench-u") && err.contains("kind = \"tap\""),
        "{err}"
    );

    // (3) bench scale, the four modes at N = 1, 2 on the running lab.
    let out = bench_in(
        &lab,
        &[
            "bench",
            "scale",
            "--quiet",
            "--lab",
            spec_s,
            "--workload",
            "cpu",
            "--max",
            "2",
            "--seconds",
            "1",
            "--repeat",
            "2",
            "--max-repeat",
            "2",
            "--warmup",
            "0",
            "--busy-retries",
            "0",
            "--format",
            "json",
            "--out-dir",
            charts.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let lines = json_lines(&out, "bench scale");
    let summaries: Vec<&Value> = lines.iter().filter(|v| v["type"] == "summary").collect();
    assert_eq!(summaries.len(), 4 * 2, "4 modes × N = 1, 2");
    for s in &summaries {
        eprintln!(
            "{}: {:.2} M iterations/s ± {:.2}, scaling {}",
            s["point"],
            s["mean"].as_f64().unwrap_or(0.0) * 1e-6,
            s["ci95"].as_f64().unwrap_or(0.0) * 1e-6,
            s["scaling"]
        );
        assert!(s["failed"].is_null(), "{s}");
        assert_eq!(s["n"], 2, "{s}");
        assert_eq!(s["unit"], "iterations/s");
        assert!(s["mean"].as_f64().unwrap() > 0.0, "{s}");
        let sc = s["scaling"].as_f64().unwrap();
        if s["config"]["n"] == "1" {
            assert_eq!(sc, 1.0);
        } else {
            assert!(sc > 0.0, "{s}");
        }
    }
    // The paper's shape, as a yes/no line with its numbers (either answer
    // is a finding on this machine; the line must be there and say both).
    let check = lines
        .iter()
        .find(|v| v["type"] == "check")
        .unwrap_or_else(|| panic!("no scaling check in {lines:?}"));
    eprintln!("{check}");
    assert!(
        check["claim"].as_str().unwrap().contains("2 VMs × 1 vCPU")
            && check["detail"].as_str().unwrap().contains("vms ")
            && check["detail"].as_str().unwrap().contains("vcpus "),
        "{check}"
    );
    let png = std::fs::read(charts.join("scale-cpu.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        st.vms.iter().all(vmscope_lab::vm_running),
        "a reused lab is left up"
    );

    // (4) bench overhead in a VM: no profiler, vmscope record -a with the
    // VMs passive and active; the workload begins once the recorder
    // samples (told through the broker), at most 12 s after it is
    // launched.
    let ovh = dir.path().join("ovh");
    let overhead = |args: &[&str]| {
        let mut c = vmscope();
        c.args(["bench", "overhead", "--quiet", "--run-dir"])
            .arg(&lab.env.run)
            .args([
                "--seconds",
                "2",
                "--repeat",
                "2",
                "--max-repeat",
                "2",
                "--warmup",
                "0",
                "--busy-retries",
                "0",
                "--format",
                "json",
                "--work-dir",
            ])
            .arg(&ovh)
            .args(args)
            .env("VMSCOPE_AGENT", &lab.env.agent)
            .stdin(std::process::Stdio::null());
        c.output().unwrap()
    };
    let out = overhead(&[
        "--vm",
        "netbench-a",
        "--delay",
        "12",
        "--profilers",
        "none,host-only,active",
    ]);
    let lines = json_lines(&out, "bench overhead --vm");
    let summaries: Vec<&Value> = lines.iter().filter(|v| v["type"] == "summary").collect();
    assert_eq!(summaries.len(), 3);
    for s in &summaries {
        eprintln!(
            "{}: {:.2} M iterations/s ± {:.2}, loss {:?} ± {:?}, profiler CPU {:?} s, host samples {:?}, guest samples {:?}, flagged {}",
            s["point"],
            s["mean"].as_f64().unwrap_or(0.0) * 1e-6,
            s["ci95"].as_f64().unwrap_or(0.0) * 1e-6,
            s["loss"],
            s["loss_ci95"],
            s["profiler_cpu_s"],
            s["profiler_samples"],
            s["guest_samples"],
            s["flagged_samples"]
        );
        assert!(s["failed"].is_null(), "{s}");
        assert_eq!(s["n"], 2, "{s}");
        assert!(s["mean"].as_f64().unwrap() > 0.0, "{s}");
        match s["profiler"].as_str().unwrap() {
            "none" => assert!(s["profiler_samples"].is_null(), "{s}"),
            "host-only" => {
                assert!(s["profiler_samples"].as_f64().unwrap() > 0.0, "{s}");
                assert_eq!(s["guest_samples"], 0.0, "every VM passive: {s}");
            }
            _ => {
                assert!(s["profiler_samples"].as_f64().unwrap() > 0.0, "{s}");
                assert!(
                    s["guest_samples"].as_f64().unwrap() > 0.0,
                    "the agents sampled inside the guests: {s}"
                );
            }
        }
        assert!(s["loss"].is_number(), "{s}");
    }
    if tcg {
        assert!(
            lines
                .iter()
                .any(|v| v["type"] == "note" && v["message"].as_str().unwrap().contains("TCG")),
            "the TCG note"
        );
    }
    // The active loss split into host and guest side, with what the
    // profilers measured of themselves (both sides, as fractions).
    let split = lines
        .iter()
        .find(|v| v["type"] == "split")
        .unwrap_or_else(|| panic!("no split line in {lines:?}"));
    eprintln!("split: {split}");
    let sp = &split["split"];
    let (active, host, guest) = (
        sp["active"].as_f64().unwrap(),
        sp["host_side"].as_f64().unwrap(),
        sp["guest_side"].as_f64().unwrap(),
    );
    assert!((host + guest - active).abs() < 1e-9, "{split}");
    for k in ["host_measured", "guest_measured"] {
        let v = sp[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing: {split}"));
        assert!(v > 0.0 && v < 1.0, "{k} {v}: {split}");
    }
    // On the host, against perf at the same frequency.
    if have("perf") {
        let out = overhead(&["--profilers", "none,perf"]);
        let lines = json_lines(&out, "bench overhead");
        let perf = lines
            .iter()
            .find(|v| v["type"] == "summary" && v["profiler"] == "perf")
            .unwrap();
        eprintln!("host perf: loss {} ± {}", perf["loss"], perf["loss_ci95"]);
        assert!(perf["failed"].is_null(), "{perf}");
        assert!(perf["profiler_samples"].as_f64().unwrap() > 0.0, "{perf}");
    }
}
