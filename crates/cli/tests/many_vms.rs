//! Many active VMs at once, simulated: four processes that look like QEMU
//! to discovery (the `sim_vms` example of vmscope-agent) serve the real
//! agent protocol on real Unix sockets and stream guest samples at 1 kHz
//! per vCPU; `record -a` must record every one of them active, through its
//! broker, and store exactly the guest samples each sent (counts, not
//! timings). Its cost is measured by `bench/many-vms`.
//!
//! Records system-wide: run under `flock /tmp/vmscope-heavy.lock`.

mod common;

use common::Reap;

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use vmscope_testkit::require_root;

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");

/// The `sim_vms` example, built on demand in this test's profile.
fn sim_vms() -> PathBuf {
    common::example("sim_vms").expect("cargo build sim_vms")
}

#[test]
fn every_simulated_vm_is_recorded_active_and_no_guest_sample_is_lost() {
    if !require_root("recording every CPU") {
        return;
    }
    const N: usize = 4;
    let tmp = tempfile::tempdir().unwrap();
    let prefix = format!("manyt{}_", std::process::id());
    let mut sim = Reap(
        Command::new(sim_vms())
            .args([
                "--count",
                &N.to_string(),
                "--vcpus",
                "2",
                "--prefix",
                &prefix,
            ])
            .arg("--dir")
            .arg(tmp.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(sim.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready"), "sim_vms said {line:?}");

    // VMs of other jobs on this host are left alone.
    let vms: Value = serde_json::from_slice(
        &common::run_ok(Command::new(VMSCOPE).args(["vms", "--format", "json", "--no-qmp"])).stdout,
    )
    .unwrap();
    let names: Vec<String> = (0..N).map(|i| format!("{prefix}{i}")).collect();
    let mut rec = Command::new(VMSCOPE);
    let db = tmp.path().join("s.db");
    // Not --strict: a VM of another test appearing meanwhile must not fail
    // this one; every simulated VM's role is checked in the session.
    // 997 Hz: about 1 kHz, and a rate no other tool profiling these VMs
    // at the same time is likely to use, so this recording's samples are
    // told from theirs (the simulators count samples per session rate).
    rec.args(["record", "-a", "-F", "997", "-d", "3", "-o"])
        .arg(&db);
    for v in vms.as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let role = if names.iter().any(|n| n == name) {
            "active"
        } else {
            "unmonitored"
        };
        rec.args(["--vm", &format!("{name}={role}")]);
    }
    common::run_ok(&mut rec);

    // Each simulated VM says what it sent once its stdin closes.
    let mut stdin = sim.0.stdin.take().unwrap();
    stdin.write_all(b"stop\n").unwrap();
    drop(stdin);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let sent: Value = serde_json::from_str(&line).unwrap();
    let _ = sim.0.wait();

    let rep = common::report_json(&db, &[]);
    // Every guest sample stored, per VM: the agent view's rows (the scale's
    // count leaves the guest's idle task out).
    let stored = common::rows(&common::report_json(
        &db,
        &["--view", "agent", "--by", "domain"],
    ));
    for name in &names {
        let dom = rep["domains"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} not in the session: {}", rep["domains"]));
        assert_eq!(
            (dom["role"].as_str(), dom["status"].as_str()),
            (Some("active"), Some("running")),
            "{name}: {dom}"
        );
        let scale = rep["scales"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["domain"] == name.as_str())
            .unwrap_or_else(|| panic!("{name}: no scale row: {}", rep["scales"]));
        let sent_vm = sent["per_vm_hz"][name]["997"].as_u64().unwrap_or(0);
        // 3 s at ~1 kHz on 2 vCPUs: thousands of samples, every one stored.
        assert!(sent_vm >= 2000, "{name} sent only {sent_vm}");
        let got = stored.iter().find(|r| &r.0 == name).map(|r| r.1);
        assert_eq!(got, Some(sent_vm), "{name}: stored vs sent");
        assert_eq!(scale["agent_lost"].as_u64(), Some(0), "{name}");
    }
    // The simulators' guest functions reached the agent view.
    let agent = common::report_json(&db, &["--view", "agent", "--by", "symbol"]);
    let syms: Vec<String> = common::rows(&agent).into_iter().map(|r| r.0).collect();
    assert!(
        syms.iter().any(|s| s == "native_safe_halt"),
        "guest symbols missing: {syms:?}"
    );
}
