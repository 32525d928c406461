//! Issue 32 item 1: a VM's name is untrusted input. A synthetic QEMU is
//! named with a quote, a backslash, a newline, terminal escape sequences (a
//! title change, a colour), a byte that is not UTF-8, and 5,000 more
//! characters; every output is read with it: text shows the control
//! characters as escapes and never lets one reach the terminal, tables cut
//! the name, JSON and the Prometheus label carry it whole (a real
//! Prometheus scrapes `serve` and finds the series under the exact name).

mod common;
use common::*;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The name as bytes: what QEMU is given. `tag` tells the tests' VMs
/// apart (they run at once; two VMs of one name are shown as NAME@PID).
fn hostile_bytes(tag: &str) -> Vec<u8> {
    let mut b = b"a\"b\\c\n\x1b]2;PWNED\x07\x1b[31mRED\xffz".to_vec();
    b.extend(std::iter::repeat_n(b'x', 5000));
    b.extend_from_slice(tag.as_bytes());
    b
}

/// The name as vmscope reads it (bytes that are not UTF-8 become U+FFFD).
fn hostile(tag: &str) -> String {
    String::from_utf8_lossy(&hostile_bytes(tag)).into_owned()
}

/// Its first characters as text outputs show them.
const VISIBLE_START: &str = "a\"b\\c\\n\\e]2;PWNED\\x07\\e[31mRED\u{fffd}z";

/// A synthetic QEMU named with [`hostile`], whose one vCPU thread spins 2
/// ms of every 10 (so it has run time and samples).
fn hostile_vm(tag: &str) -> Option<(Reap, u32)> {
    let exe = match fake_qemu() {
        Ok(e) => e,
        Err(e) => {
            skip(&e);
            return None;
        }
    };
    let hex: String = hostile_bytes(tag)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (reap, pid, _) = start_fake_qemu(Command::new(exe).args([
        "--vcpus",
        "1",
        "--name-hex",
        &hex,
        "--period-ms",
        "10",
        "--spin-us",
        "2000",
    ]));
    Some((reap, pid))
}

/// Nothing of the name acts on a terminal: no ESC or BEL byte, and the
/// newline inside it did not make a line of its own.
fn safe_text(what: &str, text: &str) {
    assert!(!text.contains('\x1b'), "{what}: an ESC reached the output");
    assert!(!text.contains('\x07'), "{what}: a BEL reached the output");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("\x1b]2;") || l.starts_with("]2;PWNED")),
        "{what}: the name's newline split a line"
    );
}

fn out_text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn vms_table_warnings_and_json() {
    if !vmscope_testkit::require_root("reading every process's threads") {
        return;
    }
    let Some((_vm, pid)) = hostile_vm("vms_table_warnings_and_json") else {
        return;
    };
    let o = run_ok(vmscope().args(["vms", "--no-qmp", "--no-libvirt"]));
    let (out, err) = out_text(&o);
    safe_text("vms table", &out);
    safe_text("vms warnings", &err);
    assert!(out.contains(VISIBLE_START), "{out}");
    // Cut to the table's width, with the rest in the JSON.
    let line = out.lines().find(|l| l.contains(VISIBLE_START)).unwrap();
    assert!(line.chars().count() < 400, "a 5,000-character row: {line}");
    let o = run_ok(vmscope().args(["vms", "--no-qmp", "--no-libvirt", "--format", "json"]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let vm = v
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["pid"] == pid)
        .expect("the synthetic VM in vms --format json");
    assert_eq!(
        vm["name"].as_str().unwrap(),
        hostile("vms_table_warnings_and_json")
    );
}

#[test]
fn stat_and_account_text_and_csv() {
    if !vmscope_testkit::require_root("schedstat of every thread, tracepoints") {
        return;
    }
    let Some((_vm, _pid)) = hostile_vm("stat_and_account_text_and_csv") else {
        return;
    };
    let o = run_ok(vmscope().args(["stat", "-i", "200ms", "-n", "2"]));
    let (out, err) = out_text(&o);
    safe_text("stat", &out);
    safe_text("stat stderr", &err);
    assert!(
        out.lines()
            .any(|l| l.starts_with("# legend:") && l.contains(VISIBLE_START)),
        "{out}"
    );
    let o = run_ok(vmscope().args(["account", "-i", "200ms", "-n", "2"]));
    let (out, err) = out_text(&o);
    safe_text("account", &out);
    safe_text("account stderr", &err);
    assert!(out.contains(VISIBLE_START), "{out}");
    let o = run_ok(vmscope().args(["account", "-i", "200ms", "-n", "2", "--format", "csv"]));
    let (out, _) = out_text(&o);
    safe_text("account csv", &out);
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(out.as_bytes());
    let names: Vec<String> = rd
        .records()
        .map(|r| r.expect("a CSV record")[2].to_string())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with(VISIBLE_START)),
        "{names:?}"
    );
}

#[test]
fn top_batch_text_and_json() {
    if !vmscope_testkit::require_root("perf_event_open system-wide") {
        return;
    }
    let Some((_vm, _pid)) = hostile_vm("top_batch_text_and_json") else {
        return;
    };
    let o = run_ok(vmscope().args(["top", "-b", "-n", "1", "-i", "500ms"]));
    let (out, err) = out_text(&o);
    safe_text("top text", &out);
    safe_text("top stderr", &err);
    assert!(out.contains(VISIBLE_START), "{out}");
    let o = run_ok(vmscope().args(["top", "-b", "-n", "1", "-i", "500ms", "--format", "json"]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["domains"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"].as_str() == Some(hostile("top_batch_text_and_json").as_str())),
        "{v}"
    );
}

#[test]
fn record_and_every_report_format() {
    if !vmscope_testkit::require_root("perf_event_open system-wide") {
        return;
    }
    let Some((_vm, _pid)) = hostile_vm("record_and_every_report_format") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("n.db");
    let o = run_ok(
        vmscope()
            .args(["record", "-a", "-g", "-F", "999", "-d", "2", "-o"])
            .arg(&db),
    );
    safe_text("record stderr", &out_text(&o).1);
    let report = |args: &[&str]| run_ok(vmscope().arg("report").arg(&db).args(args));
    let (out, err) = out_text(&report(&["--by", "domain"]));
    safe_text("report table", &out);
    safe_text("report stderr", &err);
    assert!(out.contains(VISIBLE_START), "{out}");
    let (out, _) = out_text(&report(&["--by", "domain", "--format", "csv"]));
    safe_text("report csv", &out);
    let (out, _) = out_text(&report(&["--format", "collapsed"]));
    safe_text("report collapsed", &out);
    // One stack per line, each ending in its count.
    assert!(
        out.lines().all(|l| l
            .rsplit(' ')
            .next()
            .is_some_and(|n| n.parse::<u64>().is_ok())),
        "a collapsed line split by the name"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&report(&["--by", "domain", "--format", "json"]).stdout).unwrap();
    assert!(
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["values"][0].as_str()
                == Some(hostile("record_and_every_report_format").as_str())),
        "the JSON report lacks the exact name"
    );
    let svg = dir.path().join("f.svg");
    report(&["--format", "flamegraph", "-o", svg.to_str().unwrap()]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(!text.contains('\x1b') && !text.contains('\x07'));
    // Parses as XML: nothing of the name broke the document.
    assert!(text.contains("</svg>"));
}

#[test]
fn serve_metrics_scraped_by_prometheus() {
    if !vmscope_testkit::require_root("schedstat of every thread") {
        return;
    }
    let Some(prom) = vmscope_testkit::which("prometheus") else {
        skip("prometheus not installed (apt-get install prometheus)");
        return;
    };
    let Some((_vm, _pid)) = hostile_vm("serve_metrics_scraped_by_prometheus") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let saddr = format!("127.0.0.1:{}", free_port());
    let _serve = Reap(
        vmscope()
            .args(["serve", "--listen", &saddr])
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
    // The label value as the exposition formats escape it.
    let escaped = "a\\\"b\\\\c\\n\x1b]2;PWNED\x07\x1b[31mRED\u{fffd}z";
    assert!(
        direct.contains(&format!("{{domain=\"{escaped}")),
        "no escaped label in /metrics"
    );
    let paddr = format!("127.0.0.1:{}", free_port());
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
    let deadline = Instant::now() + Duration::from_secs(60);
    let q = "/api/v1/query?query=vmscope_vcpu_run_seconds_total";
    let mut last = String::new();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(body) = http_get(&paddr, "/api/v1/query?query=up") {
            // A scrape that failed to parse sets up to 0: every series lost.
            if body.contains("\"value\":[") && body.contains(",\"0\"]") {
                panic!("Prometheus could not parse the scrape: {body}");
            }
        }
        if let Some(body) = http_get(&paddr, q) {
            last = body.clone();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let names: Vec<&str> = v["data"]["result"]
                .as_array()
                .map(|rs| {
                    rs.iter()
                        .filter_map(|r| r["metric"]["domain"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            if names.contains(&hostile("serve_metrics_scraped_by_prometheus").as_str()) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never had the VM's series under its exact name: {}",
            &last[..last.len().min(2000)]
        );
    }
}
