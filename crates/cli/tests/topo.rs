//! `vmscope topo` through the built binary: the verdicts on the hand-built
//! NUMA trees of vmscope-linux (the full outputs are golden files, see
//! `golden.rs`), and live on this machine against the real `/sys` and
//! `/proc` with a synthetic QEMU (the `fake_qemu` example of vmscope-stat:
//! argv[0] `qemu-system-x86_64`, threads named `CPU n/KVM`), whose
//! placement is checked against the thread files and `numa_maps` read here.

mod common;

use common::{fake_qemu, vmscope};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../linux/tests/fixtures/numa")
}

fn topo_json(args: &[&str]) -> Value {
    let out = vmscope()
        .args(["topo", "--no-qmp", "--format", "json"])
        .args(args)
        .output()
        .expect("spawn vmscope");
    assert!(
        out.status.success(),
        "topo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("topo json")
}

fn tree_json(tree: &str) -> Value {
    let d = fixtures().join(tree);
    topo_json(&[
        "--proc-root",
        d.join("proc").to_str().unwrap(),
        "--sys-root",
        d.join("sys").to_str().unwrap(),
    ])
}

fn vm<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no VM {name} in {v}"))
}

#[test]
fn split_vms_are_flagged_local_ones_not() {
    let two = tree_json("two-node");
    assert_eq!(two["topology"]["nodes"].as_array().unwrap().len(), 2);
    let split = vm(&two, "vm-split");
    assert_eq!(split["verdict"], "remote");
    assert_eq!(split["vcpu_nodes"], serde_json::json!([1]));
    let pct = split["remote_percent"].as_f64().unwrap();
    assert!((pct - 75.0).abs() < 0.1, "{pct}");
    assert_eq!(split["skipped_numa_maps_lines"], 1);
    let local = vm(&two, "vm-local");
    assert_eq!(local["verdict"], "local");
    assert!(local["remote_percent"].as_f64().unwrap() < 1.0);

    let four = tree_json("four-node");
    assert_eq!(four["topology"]["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(vm(&four, "tiered")["verdict"], "remote");
    assert_eq!(vm(&four, "wide")["verdict"], "local");
    assert_eq!(vm(&four, "wide")["vcpu_nodes"], serde_json::json!([0, 1]));
    assert_eq!(vm(&four, "floating")["verdict"], "local");
    assert_eq!(
        vm(&four, "floating")["allowed_nodes"],
        serde_json::json!([0, 1, 2])
    );
    // A threshold above the share clears the flag; at zero any remote byte flags.
    let d = fixtures().join("four-node");
    let (p, s) = (d.join("proc"), d.join("sys"));
    let args = |t: &'static str| {
        vec![
            "--proc-root".to_string(),
            p.to_str().unwrap().to_string(),
            "--sys-root".to_string(),
            s.to_str().unwrap().to_string(),
            "--remote-threshold".to_string(),
            t.to_string(),
        ]
    };
    let a: Vec<String> = args("0");
    let zero = topo_json(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(vm(&zero, "floating")["verdict"], "remote");
    let a: Vec<String> = args("99.9");
    let high = topo_json(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(vm(&high, "tiered")["verdict"], "remote");
    assert_eq!(vm(&high, "floating")["verdict"], "local");

    let flat = tree_json("no-node");
    let why = flat["topology"]["synthesized"].as_str().expect("said");
    assert!(why.contains("does not exist"), "{why}");
    assert_eq!(vm(&flat, "flat")["verdict"], "local");
}

/// `Cpus_allowed_list` and field 39 of a thread, read here.
fn thread_cpus(pid: u64, tid: u64) -> (String, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let cpu = rest
        .split_whitespace()
        .nth(39 - 3)
        .unwrap()
        .parse()
        .unwrap();
    (allowed, cpu)
}

/// Bytes by node of a process's `numa_maps`, summed here.
fn numa_bytes(pid: u64) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap();
    let page = 4096; // this machine's; lines that differ say kernelpagesize_kB
    text.lines()
        .map(|l| {
            let kb = l
                .split_whitespace()
                .find_map(|t| t.strip_prefix("kernelpagesize_kB="))
                .map_or(page, |v| v.parse::<u64>().unwrap() * 1024);
            l.split_whitespace()
                .filter_map(|t| t.strip_prefix('N')?.split_once('='))
                .map(|(_, n)| n.parse::<u64>().unwrap() * kb)
                .sum::<u64>()
        })
        .sum()
}

fn expand(list: &str) -> Vec<u64> {
    list.split(',')
        .flat_map(|p| match p.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<u64>>(),
            None => vec![p.parse().unwrap()],
        })
        .collect()
}

#[test]
fn live_on_this_machine() {
    let bin = match fake_qemu() {
        Ok(b) => b,
        Err(why) => {
            vmscope_testkit::skip(&why);
            return;
        }
    };
    let (_reap, pid, _stdin) = common::start_fake_qemu(
        Command::new(&bin)
            .args(["--vcpus", "2", "--name", "topo-live", "--period-ms", "20"])
            .args(["--spin-us", "200"])
            .stdin(Stdio::piped()),
    );
    let pid = u64::from(pid);

    let v = topo_json(&[]);
    let nodes = v["topology"]["nodes"].as_array().unwrap();
    let sys_nodes = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.strip_prefix("node")
                        .is_some_and(|r| r.parse::<u32>().is_ok())
                })
                .count()
        })
        .unwrap_or(0);
    if sys_nodes == 0 {
        assert!(v["topology"]["synthesized"].is_string());
        assert_eq!(nodes.len(), 1);
    } else {
        assert_eq!(nodes.len(), sys_nodes, "{v}");
        assert!(v["topology"]["synthesized"].is_null());
    }
    let online = expand(
        std::fs::read_to_string("/sys/devices/system/cpu/online")
            .unwrap()
            .trim(),
    );
    let node_cpus: Vec<u64> = nodes
        .iter()
        .flat_map(|n| {
            n["cpus"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap())
        })
        .collect();
    for c in &online {
        assert!(node_cpus.contains(c), "CPU {c} in no node: {v}");
    }

    let me = v["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("fake QEMU {pid} not in {v}"));
    assert_eq!(me["name"], "topo-live");
    let vcpus = me["vcpus"].as_array().unwrap();
    assert_eq!(vcpus.len(), 2, "{me}");
    for c in vcpus {
        let tid = c["tid"].as_u64().unwrap();
        let (allowed, _) = thread_cpus(pid, tid);
        let got: Vec<u64> = c["allowed_cpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(got, expand(&allowed), "{c}");
        let last = c["last_cpu"].as_u64().unwrap();
        assert!(online.contains(&last), "{c}");
        assert!(c["last_node"].is_u64(), "{c}");
    }
    // Memory: what the test sums from numa_maps (read just after; an idle
    // process's resident set moves by a few pages at most).
    let got = me["memory_bytes"].as_u64().unwrap();
    let here = numa_bytes(pid);
    assert!(got > 0 && here > 0);
    let diff = (got as f64 - here as f64).abs() / here as f64;
    assert!(diff < 0.10, "topo {got} B, numa_maps read here {here} B");
    if nodes.len() == 1 {
        assert_eq!(me["verdict"], "local", "{me}");
        assert_eq!(me["remote_bytes"], 0, "{me}");
    }

    // The table names it with the same verdict, units in the headers.
    let out = vmscope().args(["topo", "--no-qmp"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "MEMORY (MiB)",
        "MEMORY BY NODE (MiB)",
        "REMOTE (% of memory)",
        "topo-live",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let verdict = me["verdict"].as_str().unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("topo-live: ") && l.contains(verdict)),
        "{text}"
    );
    eprintln!("{text}");
}
