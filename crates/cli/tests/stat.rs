//! `stat`, `account` and `serve` through the built binary.
//!
//! Without VMs: `stat | head` exits quietly; a synthetic QEMU (the
//! `fake_qemu` example of vmscope-stat: argv[0] `qemu-system-x86_64`,
//! threads named `CPU n/KVM`) starting, renaming a thread, losing its tap
//! and exiting while `stat` and `account` run.
//!
//! With a lab (root, QEMU, the static agent): one busy and one idle TCG VM;
//! `stat`'s per-VM vCPU time against `pidstat -t` and its per-CPU totals
//! against `/proc/stat` (within 5 points), `account`'s reconciliation of
//! VMs, unattributed time (measured on its own, with a host task burning a
//! CPU) and `/proc/stat` (within 1 % per 2 s interval and over the run), and
//! `serve` scraped by a real Prometheus whose PromQL `rate()` of the busy
//! VM's vCPU run time agrees with the vCPU threads' schedstat read by the
//! test (within 0.15 CPU-seconds/s). stat's per-VM vCPU time is also held
//! to that schedstat over its own window (within 5 points); its per-CPU
//! totals against `/proc/stat` are an internal invariant (stat's input).
//! `account`'s waited-behind split (`lab_wait_attribution`): two busy
//! one-vCPU VMs pinned to one CPU wait about half of each interval, mostly
//! behind each other; a host process pinned beside them and a VM's own I/O
//! thread are named as culprits; the split against the vCPU threads'
//! `run_delay` read by the test.
//!
//! Tests print `SKIP: <reason>` when what they need is missing (a failure
//! under CI, which installs everything: see vmscope-testkit).

mod common;

use common::{fake_qemu, free_port, http_get, Reap, TestLab};

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");

static SERIAL: Mutex<()> = Mutex::new(());

use vmscope_testkit::{is_root, skip, which};

fn start_fake(
    bin: &Path,
    name: &str,
    vcpus: u32,
    tap: Option<&str>,
) -> (Reap, u32, std::process::ChildStdin) {
    let mut c = Command::new(bin);
    c.args([
        "--vcpus",
        &vcpus.to_string(),
        "--name",
        name,
        // A third of each vCPU's time, in 1 ms spins 2 ms apart: whenever
        // the kill falls, each thread ran since account's last read, so
        // the exit row's last CPU time is never 0 by chance (CI once killed
        // it within a few ms of a read with 500 us spins every 20 ms).
        "--period-ms",
        "2",
        "--spin-us",
        "1000",
    ]);
    if let Some(t) = tap {
        c.args(["--tap", t]);
    }
    let (reap, pid, stdin) = common::start_fake_qemu(c.stdin(Stdio::piped()));
    (reap, pid, stdin.expect("piped"))
}

#[test]
fn stat_into_head_exits_quietly() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{VMSCOPE}' stat -i 50ms --source schedstat | head -n 3"
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(stderr.is_empty(), "stat wrote to stderr: {stderr}");
    // The exit status of stat itself.
    let mut child = Command::new(VMSCOPE)
        .args(["stat", "-i", "50ms", "--source", "schedstat"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let st = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(st.success(), "stat after its reader left: {st} {err}");
    assert!(err.is_empty(), "{err}");
}

/// A VM that starts, a thread renamed, a tap that disappears and a VM that
/// exits while `stat` and `account` run: no crash, the rows say so.
#[test]
fn vms_come_and_go_mid_interval() {
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let bin = match fake_qemu() {
        Ok(b) => b,
        Err(why) => {
            skip(&why);
            return;
        }
    };
    let tap = "vmstfault0";
    let have_tap = is_root()
        && which("ip").is_some()
        && Command::new("ip")
            .args(["tuntap", "add", "dev", tap, "mode", "tap"])
            .status()
            .is_ok_and(|s| s.success());
    if !have_tap {
        skip("no tap (needs root and iproute2); the tap case is not checked");
    }
    let spawn = |args: &[&str]| {
        Command::new(VMSCOPE)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Both run until SIGTERM (which ends them after the current interval),
    // sent once the fake has exited and a few intervals passed: the exit
    // always falls inside their runs, however slow the host.
    let stat = spawn(&["stat", "-i", "300ms", "--format", "json"]);
    let account = spawn(&["account", "-i", "300ms", "--format", "json", "--no-qmp"]);
    std::thread::sleep(Duration::from_millis(700));
    let (fake, pid, mut ctl) = start_fake(&bin, "faulty", 2, have_tap.then_some(tap));
    std::thread::sleep(Duration::from_millis(900));
    writeln!(ctl, "rename 1 renamed-vcpu").unwrap();
    ctl.flush().unwrap();
    // Renames are seen within a round of name reads (2 s with few VM
    // threads) and the next interval.
    std::thread::sleep(Duration::from_millis(3000));
    let renamed = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .any(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "renamed-vcpu")
        });
    std::thread::sleep(Duration::from_millis(700));
    if have_tap {
        let _ = Command::new("ip").args(["link", "del", tap]).status();
    }
    std::thread::sleep(Duration::from_millis(700));
    drop(fake);
    std::thread::sleep(Duration::from_millis(1500));
    for c in [&stat, &account] {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    let stat = stat.wait_with_output().unwrap();
    let account = account.wait_with_output().unwrap();
    if have_tap {
        let _ = Command::new("ip")
            .args(["link", "del", tap])
            .stderr(Stdio::null())
            .status();
    }
    let so = String::from_utf8_lossy(&stat.stdout);
    let ao = String::from_utf8_lossy(&account.stdout);
    assert!(
        stat.status.success(),
        "stat: {}",
        String::from_utf8_lossy(&stat.stderr)
    );
    assert!(
        account.status.success(),
        "account: {}",
        String::from_utf8_lossy(&account.stderr)
    );
    eprintln!("stat notes:");
    for l in so
        .lines()
        .filter(|l| l.contains("\"note\"") || l.contains("legend"))
    {
        eprintln!("  {l}");
    }
    assert!(
        so.contains("faulty (pid") && so.contains(") started"),
        "{so}"
    );
    assert!(so.contains(") exited"), "{so}");
    if renamed {
        assert!(so.contains("renamed 'CPU 1/KVM' -> 'renamed-vcpu'"), "{so}");
    }
    let notes: Vec<String> = ao
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| {
            v["vms"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|vm| vm["name"] == "faulty")
                .flat_map(|vm| vm["notes"].as_array().cloned().unwrap_or_default())
                .filter_map(|n| n.as_str().map(str::to_string))
        })
        .collect();
    eprintln!("account notes for the synthetic VM: {notes:?}");
    assert!(notes.iter().any(|n| n.contains("started")), "{ao}");
    assert!(notes.iter().any(|n| n.contains("exited")), "{ao}");
    // The row of the interval it exited in carries its last CPU time, from
    // the kernel's exit records (its vCPU threads spin 1 ms every 3 ms).
    let exit_row = ao
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| v["vms"].as_array().cloned().unwrap_or_default())
        .find(|vm| {
            vm["name"] == "faulty"
                && vm["notes"].as_array().is_some_and(|n| {
                    n.iter()
                        .any(|x| x.as_str().is_some_and(|x| x.contains("exited")))
                })
        })
        .unwrap();
    eprintln!("the exit row: {exit_row}");
    if exit_row.to_string().contains("exit records") {
        assert!(
            exit_row["vcpu_run_s"].as_f64().unwrap() > 0.0,
            "no last CPU time in the exit row: {exit_row}"
        );
    }
    if have_tap {
        assert!(
            notes.iter().any(
                |n| n.contains(tap) && (n.contains("disappeared") || n.contains("unavailable"))
            ),
            "{notes:?}"
        );
    }
}

fn busy_of_proc_stat() -> Vec<(f64, f64)> {
    // (busy, total) ticks per CPU.
    std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let v: Vec<f64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            let g = |i: usize| v.get(i).copied().unwrap_or(0.0);
            let busy = g(0) + g(1) + g(2) + g(5) + g(6);
            (busy, busy + g(3) + g(4) + g(7))
        })
        .collect()
}

/// Sum of the schedstat run time (ns) of the given threads of `pid`.
fn vcpu_run_ns(pid: u32, tids: &[u32]) -> u64 {
    tids.iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/task/{t}/schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// pidstat's Average %CPU per TID.
fn pidstat_avg(text: &str) -> Vec<(u32, f64)> {
    let mut cols: Option<(usize, usize)> = None;
    let mut out = Vec::new();
    // The header starts with a time (one word), the averages with
    // `Average:`: the columns line up.
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let (Some(t), Some(c)) = (
            f.iter().position(|x| *x == "TID"),
            f.iter().position(|x| *x == "%CPU"),
        ) {
            cols = Some((t, c));
            continue;
        }
        if !l.starts_with("Average:") {
            continue;
        }
        if let Some((t, c)) = cols {
            if let (Some(tid), Some(cpu)) = (
                f.get(t).and_then(|x| x.parse().ok()),
                f.get(c).and_then(|x| x.parse().ok()),
            ) {
                out.push((tid, cpu));
            }
        }
    }
    out
}

#[test]
fn lab_busy_and_idle_vm() {
    let env = need_lab!("lr", &[("pidstat", "sysstat")]);
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("ci-stat.toml");
    std::fs::write(
        &spec,
        r#"name = "ci-stat"
accel = "auto"

[[vm]]
name = "busy"
vcpus = 1
memory_mib = 160
[[vm.nic]]
kind = "tap"
[[vm.disk]]
backend = "file"
format = "raw"
size_mib = 16

[[vm]]
name = "idle"
vcpus = 1
memory_mib = 160
[[vm.nic]]
kind = "tap"
"#,
    )
    .unwrap();
    let lab = TestLab::new(env, "ci-stat");
    let state = lab.up(&spec);
    let busy = state.vm("busy").unwrap();
    let busy_pid = busy.pid.unwrap();
    let busy_vcpus = busy.vcpu_tids.clone();
    // The CPU burner in the busy guest, until the lab goes down.
    let _burner = Reap(
        lab.cmd(&["exec", "busy", "--", "sh", "-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(2));

    // 1. stat vs pidstat and /proc/stat over the same 6 s.
    let n = 6;
    let pidstat = Command::new("pidstat")
        .args(["-t", "-p", &busy_pid.to_string(), "1", &n.to_string()])
        .env("LC_ALL", "C")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // /proc/stat is read as stat's output streams: at its header (sampling
    // armed) and at its last per-CPU record, so both cover the same window
    // rather than one that also holds stat's start-up and exit.
    let mut child = Command::new(VMSCOPE)
        .args(["stat", "-i", "1s", "-n", &n.to_string(), "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ncpu = busy_of_proc_stat().len();
    let mut lines = Vec::new();
    let (mut before, mut after) = (Vec::new(), Vec::new());
    // The vCPU threads' own schedstat run time over the same window: the
    // exact reference both stat and pidstat approximate.
    let (mut run_before, mut run_after, mut window) = (0u64, 0u64, None);
    let mut t_before: Option<Instant> = None;
    // /proc/stat at each interval's last record, for the per-interval view.
    let mut marks: Vec<Vec<(f64, f64)>> = Vec::new();
    {
        use std::io::BufRead;
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut cpu_records = 0;
        for line in out.lines() {
            let line = line.unwrap();
            if before.is_empty() {
                before = busy_of_proc_stat();
                run_before = vcpu_run_ns(busy_pid, &busy_vcpus);
                t_before = Some(Instant::now());
            }
            if line.contains("\"type\":\"cpu\"") {
                cpu_records += 1;
                if cpu_records % ncpu == 0 {
                    marks.push(busy_of_proc_stat());
                }
                if cpu_records == n * ncpu {
                    after = busy_of_proc_stat();
                    run_after = vcpu_run_ns(busy_pid, &busy_vcpus);
                    window = t_before.map(|t: Instant| t.elapsed().as_secs_f64());
                }
            }
            lines.push(line);
        }
    }
    if after.is_empty() {
        after = busy_of_proc_stat();
    }
    let stat = child.wait_with_output().unwrap();
    let stat_stdout = lines.join("\n");
    let pid_out = pidstat.wait_with_output().unwrap();
    assert!(
        stat.status.success(),
        "{}",
        String::from_utf8_lossy(&stat.stderr)
    );
    let text = std::borrow::Cow::<str>::Owned(stat_stdout);
    let recs: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let source = recs[0]["source"].as_str().unwrap_or("").to_string();
    let legend = recs
        .iter()
        .find_map(|r| r["legend"].as_str())
        .unwrap_or("")
        .to_string();
    let busy_dom = legend
        .split_whitespace()
        .find_map(|w| w.strip_suffix("=busy").and_then(|d| d.strip_prefix('d')))
        .and_then(|d| d.parse::<u64>().ok())
        .expect("busy VM in the legend");
    let cpu_recs: Vec<&Value> = recs.iter().filter(|r| r["type"] == "cpu").collect();
    let intervals = cpu_recs.len() as f64 / before.len().max(1) as f64;
    let mut stat_vm = 0.0;
    let mut stat_cpu = vec![0.0; before.len()];
    for r in &cpu_recs {
        let cpu = r["cpu"].as_u64().unwrap() as usize;
        if let Some(c) = stat_cpu.get_mut(cpu) {
            *c += r["total_pct"].as_f64().unwrap() / intervals;
        }
        for c in r["cells"].as_array().unwrap() {
            if c["domain"].as_u64() == Some(busy_dom) && c["kind"].get("vcpu").is_some() {
                stat_vm += c["pct"].as_f64().unwrap() / intervals;
            }
        }
    }
    let pid_avg = pidstat_avg(&String::from_utf8_lossy(&pid_out.stdout));
    let pid_vm: f64 = pid_avg
        .iter()
        .filter(|(t, _)| busy_vcpus.contains(t))
        .map(|(_, c)| c)
        .sum();
    eprintln!("source: {source}");
    let w = window.expect("stat printed all its intervals");
    let sched_vm = 100.0 * run_after.saturating_sub(run_before) as f64 / 1e9 / w;
    eprintln!("busy VM vCPU time by its schedstat over stat's window: {sched_vm:.1} %");
    eprintln!(
        "busy VM vCPU time: stat {stat_vm:.1} % vs pidstat {pid_vm:.1} % (diff {:.1} points)",
        stat_vm - pid_vm
    );
    assert!(
        stat_vm > 30.0,
        "the busy VM should be busy: {stat_vm:.1} %\n{text}"
    );
    // Per interval: stat's total of each CPU and the kernel's, from the
    // /proc/stat read as the interval's last record arrived.
    let mut prev_mark = before.clone();
    for (k, m) in marks.iter().enumerate() {
        let mut line = format!("interval {}:", k + 1);
        for (i, ((b0, t0), (b1, t1))) in prev_mark.iter().zip(m).enumerate() {
            let st = cpu_recs
                .iter()
                .filter(|r| r["cpu"].as_u64() == Some(i as u64))
                .nth(k)
                .and_then(|r| r["total_pct"].as_f64())
                .unwrap_or(f64::NAN);
            line += &format!(
                "  CPU {i} stat {st:.1} kernel {:.1}",
                100.0 * (b1 - b0) / (t1 - t0).max(1.0)
            );
        }
        eprintln!("{line}");
        prev_mark = m.clone();
    }
    let mut worst = 0.0f64;
    for (i, ((b0, t0), (b1, t1))) in before.iter().zip(&after).enumerate() {
        let p = 100.0 * (b1 - b0) / (t1 - t0).max(1.0);
        eprintln!(
            "CPU {i}: stat {:.1} % vs /proc/stat {p:.1} % (diff {:.1} points)",
            stat_cpu[i],
            stat_cpu[i] - p
        );
        worst = worst.max((stat_cpu[i] - p).abs());
    }
    assert!(
        (stat_vm - pid_vm).abs() <= 5.0,
        "stat vs pidstat beyond 5 points"
    );
    // The exact reference: the vCPU threads' own run time, read by this
    // test over stat's window. stat scales its slices to the same counter
    // per interval, so this checks its windows and averaging; pidstat
    // (utime + stime ticks, above) is the reference stat never reads.
    assert!(
        (stat_vm - sched_vm).abs() <= 5.0,
        "stat {stat_vm:.1} % vs the vCPU threads' schedstat {sched_vm:.1} % beyond 5 points"
    );
    // /proc/stat is stat's own input (its CPU totals are held to it) and
    // no other per-CPU busy time exists here (no /proc/schedstat): this
    // checks that the fit kept them, an internal invariant.
    assert!(worst <= 5.0, "stat vs /proc/stat beyond 5 points\n{text}");

    // 2. account: reconciliation per interval, with a host task outside
    // the VMs burning CPU: its time must show up as unattributed, measured
    // on its own, or the residual grows by a whole CPU.
    let _host_burner = Reap(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    );
    let acc = Command::new(VMSCOPE)
        .args(["account", "-i", "2s", "-n", "3", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        acc.status.success(),
        "{}",
        String::from_utf8_lossy(&acc.stderr)
    );
    let mut over = Vec::new();
    let (mut sum_res, mut sum_meas, mut sum_cap) = (0.0, 0.0, 0.0);
    for v in String::from_utf8_lossy(&acc.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "interval")
    {
        let r = &v["reconciliation"];
        let (vms, un, meas, res) = (
            r["vms_s"].as_f64().unwrap(),
            r["unattributed_s"].as_f64().unwrap(),
            r["measured_s"].as_f64().unwrap(),
            r["residual_s"].as_f64().unwrap(),
        );
        let cap = v["capacity_s"].as_f64().unwrap();
        eprintln!(
            "account: VMs {vms:.3} s + unattributed {un:.3} s (other tasks {:.3} s) vs measured {meas:.3} s: residual {res:+.3} s ({:.2} % of capacity)",
            v["other_tasks_s"].as_f64().unwrap(),
            100.0 * res / cap
        );
        // Unattributed is measured on its own (other tasks' run time), so
        // the sum can miss. Both CPUs are busy here, so /proc/stat's busy
        // share is exact and 1 % holds per 2 s interval; on a partly idle
        // host its 10 ms unit per CPU is the limit (docs/stat.md).
        assert!(
            res.abs() <= 0.01 * meas,
            "reconciliation of one interval beyond 1 %: {v}"
        );
        assert!(
            v["other_tasks_s"].as_f64().unwrap() > 0.3 * v["interval_s"].as_f64().unwrap(),
            "the host burner is not among the other tasks: {v}"
        );
        sum_res += res;
        sum_meas += meas;
        sum_cap += cap;
        over.push((vms - meas) / cap);
        let b = v["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "busy")
            .unwrap();
        let i = v["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "idle")
            .unwrap();
        assert!(b["vcpu_run_s"].as_f64().unwrap() > i["vcpu_run_s"].as_f64().unwrap());
        assert_eq!(b["disk_source"], "qmp", "{b}");
    }
    eprintln!(
        "account over the run: residual {sum_res:+.3} s of measured {sum_meas:.3} s ({:.2} %; {:.2} % of capacity {sum_cap:.1} s)",
        100.0 * sum_res / sum_meas,
        100.0 * sum_res / sum_cap
    );
    // Both CPUs are busy here, so /proc/stat's tick sampling is nearly
    // exact; on a partly idle host it wanders by a few percent per interval
    // (docs/stat.md).
    assert!(
        sum_res.abs() <= 0.01 * sum_meas,
        "reconciliation over the run beyond 1 % of the measured host CPU"
    );
    eprintln!(
        "account: VMs charged beyond measured, worst: {:.2} % of capacity",
        100.0 * over.iter().cloned().fold(f64::MIN, f64::max)
    );
    assert!(
        over.len() == 3 && over.iter().all(|o| *o <= 0.05),
        "{over:?}"
    );

    // 3. serve scraped by Prometheus.
    let Some(prom) = which("prometheus") else {
        skip(
            "prometheus not installed (apt-get install prometheus); the serve part is not checked",
        );
        return;
    };
    let sport = free_port();
    let saddr = format!("127.0.0.1:{sport}");
    let _serve = Reap(
        Command::new(VMSCOPE)
            .args(["serve", "--listen", &saddr, "--per-cpu"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pport = free_port();
    let paddr = format!("127.0.0.1:{pport}");
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vmscope\n    static_configs:\n      - targets: ['{saddr}']\n"),
    )
    .unwrap();
    let _prom = Reap(
        Command::new(prom)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={paddr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let direct = (0..50)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            http_get(&saddr, "/metrics")
        })
        .expect("serve answers");
    assert!(
        direct.contains("vmscope_vcpu_run_seconds_total{domain=\"busy\",vcpu=\"0\"}"),
        "{direct}"
    );
    assert!(
        direct.contains("vmscope_cpu_busy_seconds_total"),
        "{direct}"
    );
    let q = "/api/v1/query?query=rate(vmscope_vcpu_run_seconds_total%5B5s%5D)";
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut last = String::new();
    // The busy VM's vCPU run time by schedstat, read here once a second:
    // the reference for the rate Prometheus computes.
    let mut readings: Vec<(Instant, u64)> = Vec::new();
    let (rate, sched_rate) = loop {
        std::thread::sleep(Duration::from_secs(1));
        readings.push((Instant::now(), vcpu_run_ns(busy_pid, &busy_vcpus)));
        if let Some(body) = http_get(&paddr, q) {
            last = body.clone();
            if let Ok(v) = serde_json::from_str::<Value>(&body) {
                let found = v["data"]["result"].as_array().and_then(|rs| {
                    rs.iter()
                        .find(|r| r["metric"]["domain"] == "busy")
                        .and_then(|r| r["value"][1].as_str().and_then(|x| x.parse::<f64>().ok()))
                });
                // After 10 s of scrapes the 5 s window of rate() is full
                // (its first scrapes start from serve's first interval);
                // the last six readings span the same 5 s.
                if let (Some(r), true) = (found.filter(|r| *r > 0.0), readings.len() >= 10) {
                    let (t1, r1) = readings[readings.len() - 1];
                    let (t0, r0) = readings[readings.len() - 6];
                    break (r, (r1 - r0) as f64 / 1e9 / (t1 - t0).as_secs_f64());
                }
            }
        }
        assert!(Instant::now() < deadline, "no rate from Prometheus: {last}");
    };
    eprintln!(
        "Prometheus: rate(vmscope_vcpu_run_seconds_total[5s]) of busy = {rate:.3} CPU-seconds/s, \
         its vCPU threads' schedstat over the last 5 s: {sched_rate:.3}"
    );
    // The VM burns its vCPU steadily; rate() extrapolates its 5 s window
    // and lags by up to a scrape, hence 0.15 CPU-seconds/s.
    assert!(
        (rate - sched_rate).abs() <= 0.15,
        "Prometheus rate {rate:.3} vs schedstat {sched_rate:.3} CPU-seconds/s"
    );
}

/// Read requests QEMU counted on every disk of a VM (`query-blockstats`
/// over its QMP socket, read by the test itself).
fn qmp_reads(sock: &Path) -> u64 {
    let mut q = vmscope_discover::qmp::Qmp::connect(sock, Duration::from_secs(20)).expect("QMP");
    let v = q
        .execute("query-blockstats", None)
        .expect("query-blockstats");
    v.as_array()
        .expect("a list of disks")
        .iter()
        .filter_map(|d| d["stats"]["rd_operations"].as_u64())
        .sum()
}

/// `vmscope account`'s JSON intervals.
fn account_intervals(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "interval")
        .collect()
}

/// The VM named `name` in one account interval.
fn vm_of<'a>(interval: &'a Value, name: &str) -> Option<&'a Value> {
    interval["vms"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

/// Bytes on a VM's taps in one interval.
fn tap_bytes(vm: &Value) -> f64 {
    vm["devices"]
        .as_array()
        .map(|ds| {
            ds.iter()
                .filter(|d| d["device"].as_str().is_some_and(|n| n.starts_with("tap:")))
                .map(|d| d["bytes"].as_f64().unwrap_or(0.0))
                .sum()
        })
        .unwrap_or(0.0)
}

/// Every interval's shared charge follows the rule charge_i = N_i × T / ΣN,
/// with T/ΣN computed here from the interval's shared time and the VMs'
/// operations (not taken from account's `cost_per_op_s`, which must equal
/// it), and the charges add up to T whenever some VM did I/O.
fn assert_charge_rule(intervals: &[Value]) {
    for iv in intervals {
        let vms = iv["vms"].as_array().unwrap();
        let ops: f64 = vms.iter().map(|v| f(v, "io_ops")).sum();
        let shared = f(iv, "shared_io_s");
        let cost = if ops > 0.0 { shared / ops } else { 0.0 };
        assert!(
            (f(iv, "cost_per_op_s") - cost).abs() <= 1e-9 + 1e-6 * cost,
            "cost per operation is not T/ΣN = {shared} s / {ops}: {iv}"
        );
        let charged: f64 = vms.iter().map(|v| f(v, "shared_io_s")).sum();
        if ops > 0.0 {
            assert!(
                (charged - shared).abs() <= 1e-6 + 1e-6 * shared,
                "charges {charged} s do not add up to the shared time {shared} s: {iv}"
            );
        }
        for v in vms {
            let want = f(v, "io_ops") * cost;
            assert!(
                (f(v, "shared_io_s") - want).abs() <= 1e-6 + 1e-6 * want,
                "charge of {} is not N × T/ΣN: {v}",
                v["name"]
            );
        }
        assert!(
            charged <= f(iv, "shared_io_s") + 1e-6,
            "more shared time charged than measured: {iv}"
        );
        assert!(
            f(iv, "shared_io_s") <= f(iv, "capacity_s"),
            "more shared I/O time than the host has: {iv}"
        );
    }
}

/// Residual over a run of `account` intervals as a share of the capacity,
/// printed with `what`.
fn run_residual(intervals: &[Value], what: &str) -> f64 {
    let (mut res, mut meas, mut cap) = (0.0, 0.0, 0.0);
    for iv in intervals {
        res += iv["reconciliation"]["residual_s"].as_f64().unwrap();
        meas += f(iv, "measured_host_s");
        cap += f(iv, "capacity_s");
    }
    eprintln!(
        "{what}: reconciliation residual {res:+.3} s of measured {meas:.3} s ({:.2} % of capacity {cap:.1} s)",
        100.0 * res / cap
    );
    res / cap
}

/// cherkasova2005 on the lab: (a) two VMs serving 1 KiB and 70 KiB files
/// under the same fixed request rate, (b) 512-byte vs 4 KiB O_DIRECT reads
/// of a raw disk in one VM. `account` must show the I/O operations and the
/// charges the paper's Tables 1 and 2 show: more operations per byte for the
/// small transfers, and more operations and CPU charged per second for the
/// small blocks. The set-up fixes the answer for (b): the throttle holds the
/// bytes per second, so 512-byte reads make 8x the requests (asserted within
/// 15 %); QEMU's own request count (query-blockstats, read by the test)
/// equals dd's, and the charge per request computed with it agrees with
/// account's within 15 %. The charge rule is checked with T/ΣN computed
/// from each interval's fields.
#[test]
fn lab_cherkasova_io_charging() {
    let env = need_lab!("lr", &[("pidstat", "sysstat")]);
    let Some(httperf) = which("httperf") else {
        skip("httperf not installed (scripts/setup.sh installs it)");
        return;
    };
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tmp = tempfile::tempdir().unwrap();
    // The README's lab, under a name of its own.
    let spec = tmp.path().join("ci-io.toml");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../labs/io-charging.toml"),
    )
    .unwrap();
    assert!(text.contains("name = \"io-charging\"\n"));
    // Throttled to 128 KiB/s rather than the lab file's 512 KiB/s: on a
    // loaded 2-CPU host a TCG guest's 512-byte O_DIRECT reads top out near
    // 900 per second (0.45 MiB/s) at a load average of 7, near 300 at 11,
    // so at 512 KiB/s the small blocks were bound by the CPU, not by the
    // disk, and the 8x the set-up stands for did not hold (6.7x measured).
    // 128 KiB/s needs 256 reads per second.
    assert!(text.contains("max_bytes_per_s = 524288\n"));
    std::fs::write(
        &spec,
        text.replace("name = \"io-charging\"\n", "name = \"ci-io\"\n")
            .replace("max_bytes_per_s = 524288\n", "max_bytes_per_s = 131072\n"),
    )
    .unwrap();
    let lab = TestLab::new(env, "ci-io");
    let state = lab.up(&spec);
    let ip = |vm: &str| {
        state.vm(vm).unwrap().nics[0]
            .guest_ip
            .clone()
            .expect("tap NIC with an address")
    };
    let sites = [
        ("web1k", 1024usize, ip("web1k")),
        ("web70k", 70 * 1024, ip("web70k")),
    ];

    // (a) Web servers: busybox httpd serving /www/f of 1 KiB or 70 KiB.
    for (vm, size, addr) in &sites {
        let cmd =
            format!("mkdir -p /www && head -c {size} /dev/zero > /www/f && httpd -p 80 -h /www");
        let out = lab
            .cmd(&["exec", vm, "--", "sh", "-c", &cmd])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "httpd in {vm}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let body = (0..50)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(200));
                http_get(&format!("{addr}:80"), "/f")
            })
            .unwrap_or_else(|| panic!("httpd in {vm} does not answer on {addr}:80"));
        assert_eq!(body.len(), *size, "{vm} served the wrong file");
    }
    // 25 connections a second for 10 s: busybox httpd forks per
    // connection, and with two TCG guests and two httperf loops on this
    // 2-CPU host, 40 a second left web1k's fork rate behind in CI (58 of
    // 400 timed out, connects took 1.2 s on average: the listen queue
    // overflowed). The paper's point, more operations per byte for small
    // files at the same request rate, holds at any rate.
    let (rate, conns) = (25, 250);
    let mut account = Command::new(VMSCOPE)
        // 12 intervals: the 10 s of load end inside the run, so httperf's
        // --hog loops exit mid-interval and their last slices (a CPU's
        // worth) must come from the kernel's exit records.
        .args(["account", "-i", "1s", "-n", "12", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acc_out = BufReader::new(account.stdout.take().unwrap());
    let mut header = String::new();
    acc_out.read_line(&mut header).unwrap();
    assert!(header.contains("\"header\""), "{header}");
    let loads: Vec<(String, Child)> = sites
        .iter()
        .map(|(vm, _, addr)| {
            let c = Command::new(&httperf)
                .args(["--hog", "--server", addr, "--port", "80", "--uri", "/f"])
                .args([
                    "--rate",
                    &rate.to_string(),
                    "--num-conns",
                    &conns.to_string(),
                ])
                .args(["--timeout", "5"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (vm.to_string(), c)
        })
        .collect();
    for (vm, c) in loads {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let replies = text
            .lines()
            .find_map(|l| l.strip_prefix("Total: connections "))
            .and_then(|l| l.split_once(" replies "))
            .and_then(|(_, r)| r.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(0);
        eprintln!("httperf against {vm}: {replies} replies of {conns}");
        assert!(
            replies >= conns * 9 / 10,
            "{vm} answered {replies} of {conns} requests:\n{text}"
        );
    }
    let mut rest = Vec::new();
    acc_out.read_to_end(&mut rest).unwrap();
    let status = account.wait().unwrap();
    assert!(status.success(), "account failed");
    assert!(
        header.contains("softirq tracepoints"),
        "account did not time softirqs with the tracepoints: {header}"
    );
    let intervals = account_intervals(&rest);
    assert_eq!(intervals.len(), 12);
    let exited: f64 = intervals.iter().map(|iv| f(iv, "exited_tasks_s")).sum();
    eprintln!("web: {exited:.3} s of CPU of exited tasks from exit records");
    assert!(
        exited > 0.0,
        "no CPU time from exit records though httperf exited"
    );
    assert_charge_rule(&intervals);
    // Partly idle CPUs: the measured side comes from /proc/stat's idle
    // time, exact on NO_HZ but printed in 10 ms units per CPU.
    assert!(
        run_residual(&intervals, "web").abs() <= 0.015,
        "web: reconciliation over the run beyond 1.5 % of capacity"
    );
    // The load runs for conns/rate = 10 s from the first interval's start;
    // the first may hold the connections' start-up.
    let steady = &intervals[1..9];
    eprintln!("| VM | net packets/s | tap bytes/s | packets per KiB | direct I/O s/s | shared charge ms/s |");
    let mut per_kib = Vec::new();
    let mut charge_per_mib = Vec::new();
    for (vm, _, _) in &sites {
        let (mut pk, mut by, mut dio, mut sh, mut t) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for iv in steady {
            let v = vm_of(iv, vm).unwrap_or_else(|| panic!("{vm} missing from {iv}"));
            pk += f(v, "net_packets");
            by += tap_bytes(v);
            dio += f(v, "direct_io_s");
            sh += f(v, "shared_io_s");
            t += f(iv, "interval_s");
        }
        let ratio = pk / (by / 1024.0);
        eprintln!(
            "| {vm} | {:.0} | {:.0} | {ratio:.2} | {:.3} | {:.3} |",
            pk / t,
            by / t,
            dio / t,
            1e3 * sh / t
        );
        assert!(
            pk / t > f64::from(rate),
            "{vm}: fewer packets than requests"
        );
        // The taps' packets make NET_TX/NET_RX softirqs, timed exactly by
        // the tracepoints, so each VM pays a share.
        assert!(sh > 0.0, "{vm} was charged no shared I/O time");
        per_kib.push(ratio);
        charge_per_mib.push(sh / (by / f64::from(1 << 20)));
    }
    eprintln!(
        "web1k has {:.1}x the operations per byte of web70k",
        per_kib[0] / per_kib[1]
    );
    eprintln!(
        "shared I/O charge per MiB on the taps: web1k {:.3} ms, web70k {:.3} ms ({:.1}x)",
        1e3 * charge_per_mib[0],
        1e3 * charge_per_mib[1],
        charge_per_mib[0] / charge_per_mib[1]
    );
    assert!(
        charge_per_mib[0] > charge_per_mib[1],
        "the 1 KiB VM is not charged more per byte: {charge_per_mib:?}"
    );
    assert!(
        per_kib[0] > 3.0 * per_kib[1],
        "the 1 KiB VM's operations per byte are not well above the 70 KiB VM's: {per_kib:?}"
    );

    // (b) Raw-disk reads in web1k, 512 B then 4 KiB, O_DIRECT, 512 KiB each
    // under one `account` run; the intervals wholly inside each read are
    // compared. The disk is throttled to 128 KiB/s, so both runs are
    // bandwidth-bound like the paper's disk (13 MB/s there) and move the
    // same bytes per second: the 512-byte run needs 8x the requests.
    let mut account = Command::new(VMSCOPE)
        .args(["account", "-i", "1s", "-n", "14", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acc_out = BufReader::new(account.stdout.take().unwrap());
    let mut header = String::new();
    acc_out.read_line(&mut header).unwrap();
    let t0 = Instant::now();
    let agent_bin = vmscope_lab::image::GUEST_AGENT_PATH;
    let disk = state.vm("web1k").unwrap().disks[0]
        .guest_device
        .clone()
        .expect("web1k's disk is in the guest");
    let if_arg = format!("if={disk}");
    let qmp = state.vm("web1k").unwrap().qmp.clone();
    let mut windows = Vec::new();
    for (bs, count) in [(512u32, 1024u32), (4096, 128)] {
        std::thread::sleep(Duration::from_millis(300));
        let reads_before = qmp_reads(&qmp);
        let start = t0.elapsed().as_secs_f64();
        let out = lab
            .cmd(&[
                "exec",
                "web1k",
                "--",
                agent_bin,
                "dd",
                &if_arg,
                &format!("bs={bs}"),
                &format!("count={count}"),
                "iflag=direct",
            ])
            .output()
            .unwrap();
        let end = t0.elapsed().as_secs_f64();
        let reads = qmp_reads(&qmp) - reads_before;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(&format!("{count}+0 records in")),
            "dd bs={bs} in web1k: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "dd bs={bs} in web1k ({start:.1}-{end:.1} s, QEMU counted {reads} reads): {}",
            text.trim().replace('\n', "; ")
        );
        // One O_DIRECT read, one request on the virtual disk: QEMU's own
        // count (read here, not by account) is dd's.
        assert!(
            reads >= u64::from(count) && reads <= u64::from(count) + u64::from(count) / 100 + 2,
            "dd bs={bs}: {count} reads, QEMU counted {reads} requests"
        );
        // dd's own clock: the requests' rate the throttle allowed.
        let dd_secs: f64 = text
            .split_once("bytes read, ")
            .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
            .expect("dd's seconds");
        windows.push((bs, start, end, reads as f64 / dd_secs));
    }
    let mut rest = Vec::new();
    acc_out.read_to_end(&mut rest).unwrap();
    assert!(account.wait().unwrap().success(), "account failed");
    let intervals = account_intervals(&rest);
    assert_charge_rule(&intervals);
    // Partly idle CPUs, as above, and the throttled disk's interrupts:
    // their work on idle CPUs is busy time no task's run time holds, so the
    // residual here is positive (+1.11 % of capacity on a quiet run of this
    // machine, +2.28 % in a loaded CI run), never negative beyond the web
    // phase's bound.
    let disk = run_residual(&intervals, "disk");
    assert!(
        (-0.015..=0.03).contains(&disk),
        "disk: reconciliation over the run {:+.2} % of capacity, outside -1.5..+3 %",
        100.0 * disk
    );
    eprintln!("| block | intervals | disk ops/s | MiB/s | vCPU run s/s | direct I/O s/s | shared charge ms/s | I/O charge s/s |");
    let mut rows = Vec::new();
    for (bs, start, end, qmp_rate) in windows {
        let inside: Vec<&Value> = intervals
            .iter()
            .filter(|iv| {
                let e = f(iv, "time_s");
                e - f(iv, "interval_s") >= start && e <= end
            })
            .collect();
        assert!(
            inside.len() >= 2,
            "dd bs={bs} covered {} whole intervals",
            inside.len()
        );
        let (mut ops, mut by, mut run_s, mut dio, mut sh, mut t) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        let mut block_sirq = 0.0;
        // An interval whose QMP query timed out (a loaded host) has
        // /proc/PID/io syscalls instead of disk requests: left out.
        let inside: Vec<&Value> = inside
            .into_iter()
            .filter(|iv| vm_of(iv, "web1k").unwrap()["disk_source"] == "qmp")
            .collect();
        assert!(
            !inside.is_empty(),
            "no interval of dd bs={bs} had QMP blockstats"
        );
        for iv in &inside {
            let v = vm_of(iv, "web1k").unwrap();
            block_sirq += iv["softirq_by_vector_s"]["BLOCK"].as_f64().unwrap_or(0.0);
            ops += f(v, "disk_ops");
            by += f(v, "disk_bytes");
            run_s += f(v, "vcpu_run_s");
            dio += f(v, "direct_io_s");
            sh += f(v, "shared_io_s");
            t += f(iv, "interval_s");
        }
        eprintln!(
            "| {bs} B | {} | {:.0} | {:.2} | {:.3} | {:.3} | {:.2} | {:.3} |",
            inside.len(),
            ops / t,
            by / t / f64::from(1 << 20),
            run_s / t,
            dio / t,
            1e3 * sh / t,
            (dio + sh) / t
        );
        // Each request completes in a BLOCK softirq on the host (loop
        // device, aio=native), timed by the tracepoints and charged.
        let per_op_us = 1e6 * sh / ops.max(1.0);
        eprintln!(
            "dd bs={bs}: BLOCK softirq {:.2} ms/s, shared charge {per_op_us:.2} us per request",
            1e3 * block_sirq / t
        );
        assert!(block_sirq > 0.0, "dd bs={bs}: no BLOCK softirq time");
        // The same charged time over the requests QEMU counted (its rate
        // during dd times the intervals' length), not account's count.
        let per_op_qmp_us = 1e6 * sh / (qmp_rate * t);
        eprintln!(
            "dd bs={bs}: {:.0} requests/s by account, {qmp_rate:.0} by QEMU and dd's clock; \
             charge per request {per_op_us:.2} us by account's count, {per_op_qmp_us:.2} us by QEMU's",
            ops / t
        );
        assert!(
            (per_op_us - per_op_qmp_us).abs() <= 0.15 * per_op_qmp_us,
            "dd bs={bs}: {per_op_us:.2} us per request by account's count vs \
             {per_op_qmp_us:.2} us by QEMU's"
        );
        // The bytes per request are the block size: one read, one request.
        let per_op = by / ops.max(1.0);
        assert!(
            (per_op - f64::from(bs)).abs() <= 0.05 * f64::from(bs),
            "dd bs={bs}: {per_op:.0} bytes per disk request"
        );
        assert!(
            (by / t - 131_072.0).abs() <= 0.3 * 131_072.0,
            "dd bs={bs}: {:.0} B/s where the disk is throttled to 131072",
            by / t
        );
        rows.push((ops / t, (dio + sh) / t));
    }
    eprintln!(
        "512 B vs 4 KiB: {:.2}x the disk operations per second, {:.2}x the I/O CPU charged per second",
        rows[0].0 / rows[1].0,
        rows[0].1 / rows[1].1
    );
    // The throttle fixes the bytes per second, so 512-byte reads are 8x
    // the requests of 4 KiB reads, within the throttle's steadiness over a
    // few seconds (each run's bytes per second is checked above).
    let ratio = rows[0].0 / rows[1].0;
    assert!(
        (ratio - 8.0).abs() <= 0.15 * 8.0,
        "512-byte reads are {ratio:.2}x the operations per second of 4 KiB reads, not 8x: {rows:?}"
    );
    assert!(
        rows[0].1 > rows[1].1,
        "512-byte reads are not charged more host I/O CPU per second: {rows:?}"
    );
}

/// A thread's `run_delay` (ns) and its count of switch-ins (`pcount`,
/// the times it ran on a CPU) from its `schedstat`, read by the test.
fn run_delay_ns(pid: u32, tid: u32) -> (u64, u64) {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).unwrap_or_default();
    let mut w = text.split_whitespace().skip(1);
    let mut next = || w.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let delay = next();
    (delay, next())
}

/// `account -i 1s -n N --format json` as it streams; `at_start` runs when
/// the header comes (the baseline is taken), `at_end` after the last
/// interval. The intervals and the header.
fn account_run(
    lab: &TestLab,
    n: u32,
    mut at_start: impl FnMut(),
    mut at_end: impl FnMut(),
) -> (Vec<Value>, Value) {
    let mut child = lab
        .vmscope(&[
            "account",
            "-i",
            "1s",
            "-n",
            &n.to_string(),
            "--wait-source",
            "bpf",
            "--format",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (mut intervals, mut header) = (Vec::new(), Value::Null);
    for line in out.lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap_or(Value::Null);
        if v["type"] == "header" {
            at_start();
            header = v;
        } else if v["type"] == "interval" {
            intervals.push(v);
            if intervals.len() == n as usize {
                at_end();
            }
        }
    }
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "account failed: {err}");
    (intervals, header)
}

/// One VM's vCPU waits in one interval: (runnable s, attributed s, the
/// waited-behind list).
fn waits_of(iv: &Value, vm: &str) -> (f64, f64, Vec<Value>) {
    let v = vm_of(iv, vm).unwrap_or_else(|| panic!("{vm} missing from {iv}"));
    (
        f(v, "vcpu_runnable_s"),
        f(v, "wait_attributed_s"),
        v["waited_behind"].as_array().cloned().unwrap_or_default(),
    )
}

/// Two one-vCPU VMs pinned to one host CPU, both busy, then a host process
/// pinned beside them: what each vCPU waited behind, against the vCPU
/// threads' `run_delay` read by the test itself.
#[test]
fn lab_wait_attribution() {
    let env = need_lab!(
        "lw",
        &[
            ("taskset", "util-linux"),
            ("setsid", "util-linux"),
            ("renice", "bsdutils"),
            ("dash", "dash")
        ]
    );
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cpus = vmscope_linux::online_cpus(Path::new("/sys")).unwrap();
    let cpu = *cpus.last().unwrap();
    // QEMU's main loops on another CPU: the test is about the vCPUs (and,
    // later, wa's I/O thread) sharing one.
    let other = cpus.iter().find(|&&c| c != cpu).copied().unwrap_or(cpu);
    let vm = |name: &str| {
        format!("[[vm]]\nname = \"{name}\"\nvcpus = 1\nmemory_mib = 160\npin_vcpus = [{cpu}]\npin_emulator = [{other}]\n")
    };
    // wa's disk is served by its I/O thread, pinned beside the vCPUs.
    let disk = format!(
        "iothreads = 1\npin_io = [{cpu}]\n[[vm.disk]]\nbackend = \"file\"\nformat = \"raw\"\nsize_mib = 32\ncache = \"none\"\naio = \"native\"\niothread = 0\n"
    );
    let lab = TestLab::new(env, "ci-wait");
    let state = lab.up_text(&format!(
        "name = \"ci-wait\"\naccel = \"tcg\"\n\n{}{disk}\n{}",
        vm("wa"),
        vm("wb")
    ));
    let vcpu = |name: &str| {
        let v = state.vm(name).unwrap();
        (v.pid.unwrap(), v.vcpu_tids[0])
    };
    let (a, b) = (vcpu("wa"), vcpu("wb"));
    // The machine is shared: unpinned work of others lands on the CPU too
    // (a compiler took 20 % of it in one run). The test's threads run at
    // the highest nice level so that others get about 1 % of it; the
    // host process of step 2 too, so it competes with the vCPUs as an
    // equal. A nice level orders threads within their autogroup only
    // (kernel.sched_autogroup_enabled, on here): QEMU and the hog are
    // sessions of their own, and so is CI's nice-19 side build, which as
    // an autogroup of nice 0 took a third of the CPU from two VMs reniced
    // to -20. The autogroups are raised too.
    let top_priority = |tid: u32| {
        let st = Command::new("renice")
            .args(["-n", "-20", "-p", &tid.to_string()])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "renice {tid}");
        // A process just spawned may not have its session yet (setsid
        // still running, or exec'ing taskset and dash), and the kernel
        // refused the write once then with EINVAL (CI): the write is tried
        // again for up to a second, and a group that stays refused is said
        // and left as it is, since the raise only shields the test from
        // other work on the machine.
        let group = format!("/proc/{tid}/autogroup");
        if Path::new(&group).exists() {
            let mut last = None;
            for _ in 0..20 {
                match std::fs::write(&group, "-20") {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(e) => last = Some(e),
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Some(e) = last {
                println!("{group}: left as it was ({e})");
            }
        }
    };
    let mut ours = vec![a.1, b.1];
    ours.extend(
        state
            .vm("wa")
            .unwrap()
            .iothread_tids
            .iter()
            .map(|(_, t)| *t),
    );
    for tid in ours {
        top_priority(tid);
    }
    let _loops: Vec<Reap> = ["wa", "wb"]
        .iter()
        .map(|v| {
            Reap(
                lab.cmd(&["exec", v, "--", "sh", "-c", "while :; do :; done"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let delays = || [run_delay_ns(a.0, a.1), run_delay_ns(b.0, b.1)];
    // Each VM's total against two references: account's own run_delay
    // reads (taken beside its drains), to 2 %; and the test's, which
    // cannot be read at account's drain times: `spawned` just before
    // account starts, `before` when its header arrives (its first drain
    // fell in between, 40-70 ms earlier beside a build), `after` when its
    // last interval arrives (its last drain about as much earlier). The
    // waits that ended between account's start and its header bound what
    // either skew moves: 2 % beyond that is a fault.
    let check_totals = |phase: &str,
                        intervals: &[Value],
                        spawned: [(u64, u64); 2],
                        before: [(u64, u64); 2],
                        after: [(u64, u64); 2]| {
        for (i, name) in ["wa", "wb"].iter().enumerate() {
            let reference = (after[i].0 - before[i].0) as f64 / 1e9;
            let lead = (before[i].0 - spawned[i].0) as f64 / 1e9;
            let switch_ins = after[i].1 - before[i].1;
            let attributed: f64 = intervals.iter().map(|iv| waits_of(iv, name).1).sum();
            let runnable: f64 = intervals.iter().map(|iv| waits_of(iv, name).0).sum();
            let own = (attributed - runnable) / runnable;
            let outside = if attributed > reference + lead {
                attributed - reference - lead
            } else if attributed < reference - lead {
                attributed - reference + lead
            } else {
                0.0
            };
            eprintln!(
                "{phase}: {name} waited {runnable:.4} s by account's run_delay reads, {attributed:.4} s attributed ({:+.2} %); {reference:.4} s ± {lead:.4} s by the test's ({:+.2} % outside, {switch_ins} switch-ins)",
                100.0 * own,
                100.0 * outside / reference,
            );
            // The eBPF source sums the kernel's own waits.
            assert!(
                own.abs() <= 0.02,
                "{phase}: {name}'s attributed wait {attributed:.4} s vs account's run_delay {runnable:.4} s"
            );
            assert!(
                outside.abs() <= 0.02 * reference,
                "{phase}: {name}'s attributed wait {attributed:.4} s vs run_delay {reference:.4} s ± {lead:.4} s"
            );
            // Per interval too, except where account says the kernel did
            // not deliver a waiting thread's switch-in (this host's
            // tracepoint streams have holes; see docs/stat.md): those
            // waits are missing from the split, and said to be.
            // A wait that ends between account's schedstat reads and its
            // drain of the programs counts in one interval by run_delay and
            // the next by the split (a CI run: +29 ms in one interval of a
            // vCPU whose waits were up to 270 ms long): such an interval
            // must agree with a neighbour's sum instead.
            let (mut holes, mut shifted) = (0, 0);
            let near = |a: f64, r: f64| (a - r).abs() <= 0.02 * r + 0.001;
            for (k, iv) in intervals.iter().enumerate() {
                let (runnable, attributed, _) = waits_of(iv, name);
                let said = iv["notes"].as_array().is_some_and(|n| {
                    n.iter().any(|n| {
                        n.as_str()
                            .is_some_and(|n| n.contains("waits not attributed"))
                    })
                });
                if said && attributed < runnable {
                    holes += 1;
                    continue;
                }
                if near(attributed, runnable) {
                    continue;
                }
                let pair = |j: usize| {
                    intervals.get(j).is_some_and(|other| {
                        let (r2, a2, _) = waits_of(other, name);
                        near(attributed + a2, runnable + r2)
                    })
                };
                assert!(
                    pair(k + 1) || (k > 0 && pair(k - 1)),
                    "{phase}: {name} attributed {attributed:.4} s vs account's runnable {runnable:.4} s in {iv}, and not made up by a neighbouring interval"
                );
                shifted += 1;
            }
            eprintln!(
                "{phase}: {name} within 2 % of account's runnable in {} of {} intervals ({holes} with undelivered switch-ins, said in a note; {shifted} made up by a neighbour)",
                intervals.len() - holes - shifted,
                intervals.len()
            );
        }
    };

    // 1. The two VMs alone on the CPU: each waits half the time, behind
    // the other's vCPU.
    let (mut before, mut after) = ([(0, 0); 2], [(0, 0); 2]);
    let mut spawned = delays();
    let (intervals, header) = account_run(&lab, 4, || before = delays(), || after = delays());
    assert!(
        header["wait_source"]
            .as_str()
            .unwrap_or_default()
            .starts_with("eBPF"),
        "not the eBPF source: {header}"
    );
    // Over the phase, per VM: (seconds behind the other's vCPU, attributed).
    let mut behind = [(0.0, 0.0); 2];
    for iv in &intervals {
        for (i, (name, other)) in [("wa", "wb"), ("wb", "wa")].into_iter().enumerate() {
            let (runnable, attributed, split) = waits_of(iv, name);
            let share = runnable / f(iv, "interval_s");
            let top = split.first().unwrap_or_else(|| {
                panic!("{name} waited behind nothing ({runnable:.4} s runnable) in {iv}")
            });
            eprintln!(
                "two VMs: {name} waited {:.1} % of the interval, {:.1} % of it behind {} {} ({})",
                100.0 * share,
                100.0 * f(top, "seconds") / attributed,
                top["culprit_vm"],
                top["culprit"],
                top["kind"]
            );
            assert!(
                (0.4..=0.6).contains(&share),
                "{name} waited {:.1} % of the interval",
                100.0 * share
            );
            assert!(
                top["kind"] == "vm" && top["culprit_vm"] == other && top["culprit"] == "vCPU 0",
                "{name} did not wait mostly behind {other}'s vCPU: {split:?}"
            );
            behind[i].0 += f(top, "seconds");
            behind[i].1 += attributed;
        }
    }
    // Others' work on this shared machine still gets a little of the CPU
    // (88 % in one interval of one run, with a build running beside it):
    // the share is held over the phase.
    for (i, name) in ["wa", "wb"].into_iter().enumerate() {
        let (other_s, total) = behind[i];
        eprintln!(
            "two VMs: {name} waited {:.1} % of its wait behind the other VM's vCPU over the phase",
            100.0 * other_s / total
        );
        assert!(
            other_s >= 0.9 * total,
            "{name} waited only {:.1} % behind the other VM's vCPU over the phase",
            100.0 * other_s / total
        );
    }
    check_totals("two VMs", &intervals, spawned, before, after);

    // 2. A host process pinned beside them is named by comm and pid.
    let hog_path = lab.env.run.join("wait-hog");
    let _ = std::fs::remove_file(&hog_path);
    std::os::unix::fs::symlink(which("dash").unwrap(), &hog_path).unwrap();
    // A session (and so an autogroup) of its own, as a host daemon has:
    // raising it leaves the test runner's group as it was.
    let hog = Reap(
        Command::new("setsid")
            .arg("taskset")
            .args(["-c", &cpu.to_string()])
            .arg(&hog_path)
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    );
    // Raised once it runs as itself: in its own session, exec'd to dash.
    let comm = format!("/proc/{}/comm", hog.0.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(&comm).map_or(true, |c| c.trim() != "wait-hog")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    top_priority(hog.0.id());
    let hog_name = format!("wait-hog (pid {})", hog.0.id());
    std::thread::sleep(Duration::from_millis(500));
    let (intervals, _) = {
        spawned = delays();
        account_run(&lab, 3, || before = delays(), || after = delays())
    };
    drop(hog);
    for iv in &intervals {
        for name in ["wa", "wb"] {
            let (_, attributed, split) = waits_of(iv, name);
            let hog_s: f64 = split
                .iter()
                .filter(|w| w["kind"] == "host" && w["culprit"] == hog_name.as_str())
                .map(|w| f(w, "seconds"))
                .sum();
            eprintln!(
                "with a host hog: {name} waited {attributed:.4} s, {:.1} % behind {hog_name}",
                100.0 * hog_s / attributed
            );
            assert!(
                hog_s >= 0.25 * attributed,
                "{name} waited only {hog_s:.4} s of {attributed:.4} s behind {hog_name}: {split:?}"
            );
        }
    }
    check_totals("with a host hog", &intervals, spawned, before, after);

    // 3. Disk reads in wa: its I/O thread, on the same CPU, is a culprit
    // of wa's vCPU (a thread of its own VM).
    let dev = state.vm("wa").unwrap().disks[0]
        .guest_device
        .clone()
        .expect("wa's disk is in the guest");
    let reads = format!(
        "while :; do {} dd if={dev} bs=4k count=2048 iflag=direct >/dev/null; done",
        vmscope_lab::image::GUEST_AGENT_PATH
    );
    let _dd = Reap(
        lab.cmd(&["exec", "wa", "--", "sh", "-c", &reads])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let (intervals, _) = {
        spawned = delays();
        account_run(&lab, 2, || before = delays(), || after = delays())
    };
    for iv in &intervals {
        let (_, attributed, split) = waits_of(iv, "wa");
        let io_s: f64 = split
            .iter()
            .filter(|w| {
                w["kind"] == "same-vm"
                    && w["culprit"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("I/O IO iothread"))
            })
            .map(|w| f(w, "seconds"))
            .sum();
        let disk_ops = vm_of(iv, "wa").map_or(0.0, |v| f(v, "disk_ops"));
        eprintln!(
            "disk reads in wa ({disk_ops} requests): its vCPU waited {attributed:.4} s, {io_s:.4} s ({:.1} %) behind its own I/O thread",
            100.0 * io_s / attributed
        );
        assert!(disk_ops > 0.0, "no disk requests in wa: {iv}");
        assert!(
            io_s >= 0.001,
            "wa's vCPU did not wait behind its I/O thread: {split:?}"
        );
    }
    check_totals("disk reads in wa", &intervals, spawned, before, after);
}

/// `account`'s header says where the waited-behind split comes from: the
/// eBPF programs as root, the tracepoint rings when asked for, and, for a
/// user without the privileges (nobody with CAP_PERFMON only), why eBPF is
/// not used; `--wait-source bpf` there says why in one header line and the
/// intervals still come (steal stands alone).
#[test]
fn account_says_where_the_split_comes_from() {
    if !vmscope_testkit::require_root("loading eBPF programs")
        || !vmscope_testkit::require_tools(&[("setpriv", "util-linux")])
    {
        return;
    }
    // Its accounts load the eBPF programs and read every CPU's switches:
    // not beside the lab tests' measurements.
    let _s = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let header = |user: bool, args: &[&str]| -> (String, usize) {
        let mut c = if user {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=+perfmon",
                "--ambient-caps=+perfmon",
                VMSCOPE,
            ]);
            c
        } else {
            Command::new(VMSCOPE)
        };
        let out = c
            .args(["account", "-i", "100ms", "-n", "2", "--format", "json"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let intervals = lines.iter().filter(|v| v["type"] == "interval").count();
        (
            lines[0]["wait_source"].as_str().unwrap_or("").to_string(),
            intervals,
        )
    };
    let (src, n) = header(false, &[]);
    assert!(src.starts_with("eBPF"), "{src}");
    assert_eq!(n, 2);
    let (src, _) = header(false, &["--wait-source", "tracepoints"]);
    assert!(src.starts_with("sched_switch"), "{src}");
    // Without the eBPF privileges: the rings where this host lets the user
    // open the tracepoints, else none; either way the header says why
    // eBPF is not used.
    let (src, n) = header(true, &[]);
    assert!(
        (src.starts_with("none (eBPF: ") || src.contains("(eBPF not used: "))
            && src.contains("not permitted"),
        "{src}"
    );
    assert_eq!(n, 2, "the intervals come without the split");
    let (src, _) = header(true, &["--wait-source", "bpf"]);
    assert!(
        src.starts_with("none (eBPF: ") && src.contains("CAP_BPF"),
        "{src}"
    );
    let (src, _) = header(false, &["--no-wait"]);
    assert_eq!(src, "none (not asked for)");
}
