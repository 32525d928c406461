//! Every tool on one VM at once, on a real lab VM (TCG) with the real agent
//! behind its broker: while a long `lab exec` runs the known-answer
//! workload (vmscope_demo_alpha/beta/gamma at 50/30/20 % of its CPU) and a
//! 50 MiB `lab cp` is in flight,
//! - two recordings of the VM at once both get the guest's profile, with
//!   the workload's functions in the right order;
//! - a third recording killed with SIGKILL mid-session leaves them running;
//! - the copy arrives whole and the exec ends normally.
//!
//! Then the fallbacks say why, where people look (stderr, report header,
//! JSON meta): a VM without the agent's channel, and one whose agent stops
//! answering.

mod common;
use common::TestLab;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");
const LAB: &str = "ci-conc";

fn record(db: &Path, secs: &str) -> Child {
    Command::new(VMSCOPE)
        .args(["record", "-a", "-F", "1000", "-d", secs, "-o"])
        .arg(db)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(c: Child, what: &str) -> String {
    let out = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what}: {err}");
    err
}

/// Samples of each demo function under `vm` in the merged view.
fn demo(db: &Path, vm: &str) -> [u64; 3] {
    let v = common::report_json(db, &["--by", "symbol", "--domain", vm]);
    let rows = common::rows(&v);
    let get = |n: &str| rows.iter().filter(|r| r.0 == n).map(|r| r.1).sum::<u64>();
    [
        get("vmscope_demo_alpha"),
        get("vmscope_demo_beta"),
        get("vmscope_demo_gamma"),
    ]
}

/// `vmscope top` in a 150x40 tmux terminal: the screen shows the VM, its
/// vCPU share and the workload's functions; keys sort and quit.
fn top_in_tmux() {
    if !vmscope_testkit::require_tools(&[("tmux", "tmux")]) {
        return;
    }
    let session = format!("vmscope-top-{}", std::process::id());
    let tmux = |args: &[&str]| Command::new("tmux").args(args).output().expect("tmux runs");
    let st = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "150",
        "-y",
        "40",
        &format!("{VMSCOPE} top -i 1s"),
    ]);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let screen = || {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned()
    };
    let wait_for = |what: &dyn Fn(&str) -> bool, why: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = screen();
            if what(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{why}; the screen:\n{s}");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let s = wait_for(
        &|s| s.contains("vmscope_demo_alpha") && s.contains("conc0"),
        "top never showed conc0 and the workload's functions",
    );
    let line = s
        .lines()
        .find(|l| l.contains("conc0") && l.contains("active"))
        .unwrap_or_else(|| panic!("no conc0 line:\n{s}"));
    let run: f64 = line.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(run > 40.0, "conc0's vCPU run share {run} in: {line}");
    tmux(&["send-keys", "-t", &session, "s"]);
    wait_for(&|s| s.contains("sort steal"), "the s key did not sort");
    tmux(&["send-keys", "-t", &session, "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux(&["has-session", "-t", &session]).status.success() {
        assert!(Instant::now() < deadline, "q did not quit top");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn md5(data: &[u8]) -> String {
    let mut c = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn every_tool_on_one_vm_at_once() {
    if !vmscope_testkit::require_root("a lab VM")
        || !vmscope_testkit::require_tools(&[
            ("qemu-system-x86_64", "qemu-system-x86"),
            ("busybox", "busybox-static"),
            ("md5sum", "coreutils"),
        ])
    {
        return;
    }
    let env = need_lab!("lab-run-conc");
    let tmp = tempfile::tempdir().unwrap();
    let lab = TestLab::new(env, LAB);
    let spec = tmp.path().join("conc.toml");
    std::fs::write(
        &spec,
        format!(
            "name = \"{LAB}\"\naccel = \"tcg\"\n\
             [[vm]]\nname = \"conc0\"\nvcpus = 1\nmemory_mib = 256\n[[vm.nic]]\nkind = \"user\"\n\
             [[vm]]\nname = \"noagent\"\nvcpus = 1\nmemory_mib = 128\nagent = false\n",
        ),
    )
    .unwrap();
    lab.ok(&["up", spec.to_str().unwrap()]);

    // A long exec in flight: the workload itself, for as long as the
    // recordings and `top` below take (about 35 s, with room for a slow
    // host); the test waits for its normal end.
    let exec = lab
        .cmd(&[
            "exec",
            "conc0",
            "--timeout",
            "120",
            "--",
            "/usr/bin/vmscope-agent",
            "demo",
            "-d",
            "50",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A 50 MiB copy in flight.
    let big = tmp.path().join("big");
    let data: Vec<u8> = (0..50u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&big, &data).unwrap();
    let dest = "conc0:/root/big".to_string();
    let cp = lab
        .cmd(&["cp", big.to_str().unwrap(), &dest])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));

    // Two recordings at once, and a third killed mid-session.
    let (db1, db2, db3) = (
        tmp.path().join("r1.db"),
        tmp.path().join("r2.db"),
        tmp.path().join("r3.db"),
    );
    let r1 = record(&db1, "10");
    std::thread::sleep(Duration::from_millis(500));
    let r2 = record(&db2, "8");
    let mut r3 = record(&db3, "30");
    std::thread::sleep(Duration::from_secs(4));
    r3.kill().unwrap();
    let _ = r3.wait();
    let e1 = finish(r1, "recording 1");
    let e2 = finish(r2, "recording 2");
    for (db, err) in [(&db1, &e1), (&db2, &e2)] {
        let [a, b, g] = demo(db, "conc0");
        eprintln!("{}: alpha {a} beta {b} gamma {g}", db.display());
        assert!(
            a > b && b > g && g > 0,
            "{}: demo functions out of order or missing: {a} {b} {g}\n{err}",
            db.display()
        );
        let meta = &common::report_json(db, &[])["meta"];
        assert!(
            meta.get("agent_conc0").is_none(),
            "conc0 fell back: {}",
            meta["agent_conc0"]
        );
    }

    // vmscope top, while the workload still runs: batch JSON, then the live
    // view in a real terminal (tmux).
    let out = Command::new(VMSCOPE)
        .args(["top", "--batch", "-n", "3", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frames: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(frames.len(), 3);
    let last = &frames[2];
    let vm = last["domains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "conc0")
        .unwrap_or_else(|| panic!("conc0 missing from {last}"));
    assert_eq!(vm["role"], "active", "{vm}");
    assert!(vm["run_pct"].as_f64().unwrap() > 40.0, "{vm}");
    // The guest's user code is the demo: alpha leads it. The guest
    // kernel's share is the agents' own work for the three tools at once
    // (one frame of a loaded CI run had a spin unlock of the guest kernel
    // above alpha), so it is not ranked against the demo.
    let syms: Vec<&str> = vm["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["context"] == "guest-user")
        .map(|f| f["symbol"].as_str().unwrap())
        .collect();
    assert_eq!(
        syms.first(),
        Some(&"vmscope_demo_alpha"),
        "{syms:?} in {}",
        vm["functions"]
    );
    top_in_tmux();

    // The merged profile at a low guest rate: 100 Hz for 10 s, under a
    // budget the agent meets (50 %). The shares stay near the truth (within
    // 2 points, or 3 standard errors of a binomial share when the sample
    // count makes 2 points less than that), and the header says what
    // profiling cost the VM and at which rate.
    let db5 = tmp.path().join("r5.db");
    let r5 = Command::new(VMSCOPE)
        .args([
            "record",
            "-a",
            "-F",
            "100",
            "-d",
            "10",
            "--overhead-budget",
            "50",
            "-o",
        ])
        .arg(&db5)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let e5 = finish(r5, "recording at 100 Hz");
    let counts = demo(&db5, "conc0");
    let n: u64 = counts.iter().sum();
    assert!(n > 0, "no demo samples at 100 Hz\n{e5}");
    for (i, truth) in [50.0, 30.0, 20.0].into_iter().enumerate() {
        let share = 100.0 * counts[i] as f64 / n as f64;
        let p = truth / 100.0;
        let tol = (3.0 * 100.0 * (p * (1.0 - p) / n as f64).sqrt()).max(2.0);
        eprintln!("100 Hz: share {share:.1} % (truth {truth} %, {n} samples, tolerance {tol:.1})");
        assert!(
            (share - truth).abs() <= tol,
            "100 Hz: share {share:.1} vs {truth} (n {n}, tolerance {tol:.1}): {counts:?}"
        );
    }
    let meta = &common::report_json(&db5, &[])["meta"];
    let cost = meta["profiler_conc0"].as_str().unwrap_or_default();
    // --overhead-budget 50 with one active VM: half for the host side,
    // half for the agent (model::budget::shares).
    assert!(
        cost.contains("100 Hz") && cost.contains("budget 25 %"),
        "{meta}"
    );
    let host = meta["profiler_host"].as_str().unwrap_or_default();
    assert!(
        host.contains("100 Hz") && host.contains("budget 25 %"),
        "{meta}"
    );

    let cp = cp.wait_with_output().unwrap();
    assert!(
        cp.status.success(),
        "lab cp: {}",
        String::from_utf8_lossy(&cp.stderr)
    );
    let sum = lab.ok(&["exec", "conc0", "--", "md5sum", "/root/big"]);
    assert_eq!(sum.split_whitespace().next(), Some(md5(&data).as_str()));
    let exec = exec.wait_with_output().unwrap();
    assert!(
        exec.status.success(),
        "lab exec: {}",
        String::from_utf8_lossy(&exec.stderr)
    );
    assert!(String::from_utf8_lossy(&exec.stdout).contains("rounds"));

    // Fallbacks say why: no channel (noagent), and an agent that stops
    // answering for a while (stopped, then continued by the guest itself).
    lab.ok(&[
        "exec",
        "conc0",
        "--",
        "sh",
        "-c",
        "p=$(pidof vmscope-agent); (sleep 1; kill -STOP $p; sleep 8; kill -CONT $p) </dev/null >/dev/null 2>&1 &",
    ]);
    std::thread::sleep(Duration::from_secs(2));
    let db4 = tmp.path().join("r4.db");
    let err = finish(record(&db4, "2"), "recording with a frozen agent");
    let v = common::report_json(&db4, &[]);
    let table = String::from_utf8_lossy(
        &Command::new(VMSCOPE)
            .arg("report")
            .arg(&db4)
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    for (vm, words) in [
        (
            "noagent",
            "no 'vmscope.agent' channel on its QEMU command line",
        ),
        ("conc0", "its agent did not answer within 3 s"),
    ] {
        let why = v["meta"][format!("agent_{vm}")].as_str().unwrap_or("");
        assert!(
            why.starts_with("passive: ") && why.contains(words),
            "{vm}: {why}"
        );
        assert!(why.contains("(fix: "), "{vm}: no fix in {why}");
        assert!(
            err.contains(&format!("VM {vm}: profiled as passive: ")) && err.contains(words),
            "stderr does not say why {vm} is passive: {err}"
        );
        assert!(
            table.contains(&format!("# agent     {vm}: passive: ")),
            "the report header does not say why {vm} is passive:\n{table}"
        );
    }
    // The agent answers again once the guest continues it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = lab.cmd(&["exec", "conc0", "--", "true"]).output().unwrap();
        if out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "the agent never came back");
        std::thread::sleep(Duration::from_secs(1));
    }

    // The exec output cap is stated with its size and how to raise it.
    let out = lab
        .cmd(&[
            "exec",
            "conc0",
            "--max-output",
            "1k",
            "--",
            "sh",
            "-c",
            "head -c 5000 /dev/zero",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(out.stdout.len(), 1024);
    assert!(
        err.contains("output cut at 1024 bytes (--max-output 1024") && err.contains("6M"),
        "{err}"
    );
    let out = lab
        .cmd(&["exec", "conc0", "--max-output", "7M", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be from 1 byte to"));
}
