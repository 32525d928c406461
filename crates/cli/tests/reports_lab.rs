//! Issue 13, lab test: the reports of a real session with an active VM.
//! One TCG VM (`reports-act`) runs the known-answer workload
//! (vmscope_demo_alpha/beta/gamma at 50/30/20 %) under its agent while
//! `vmscope record -a -g` runs on the host. Then:
//! - joined stacks: the guest's functions sit on their VM, vCPU and guest
//!   process frames in the collapsed stacks and in the flame graph, and the
//!   VM's share adds up with the host's (event counts);
//! - pprof: `go tool pprof -tagfocus vm=reports-act` keeps the guest's
//!   functions, `vm=host` has none of them;
//! - the HTML page of the session loads in headless Chromium without
//!   console messages (VMSCOPE_SCREENSHOT=FILE keeps its screenshot: the
//!   one in docs/ comes from here);
//! - `--time` and `--cpu` slice it, and the slices add up;
//! - `vmscope serve --profile` answers `/debug/pprof/profile?seconds=5`
//!   with the guest's functions under the VM's label (`go tool pprof` reads
//!   the URL; the answer also decoded here), `/metrics` meanwhile.
//!
//! Skips with a printed reason without root, QEMU or the static agent.

mod common;

use common::{vmscope, TestLab};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const LAB: &str = "reports-lab";
const VM: &str = "reports-act";

fn report(db: &Path, args: &[&str]) -> std::process::Output {
    let out = vmscope().arg("report").arg(db).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "report {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(db: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.extend(["--format", "json"]);
    serde_json::from_slice(&report(db, &a).stdout).unwrap()
}

fn go() -> Option<PathBuf> {
    vmscope_testkit::which("go").or_else(|| {
        let p = PathBuf::from("/usr/local/go/bin/go");
        p.exists().then_some(p)
    })
}

#[test]
fn reports_of_an_active_vm() {
    if !vmscope_testkit::require_root("a lab with an active VM")
        || !vmscope_testkit::require_tools(&[
            ("qemu-system-x86_64", "qemu-system-x86"),
            ("busybox", "busybox-static"),
        ])
    {
        return;
    }
    let env = need_lab!("reports-run");
    let tmp = tempfile::tempdir().unwrap();
    let lab = TestLab::new(env, LAB);
    let spec = tmp.path().join("reports.toml");
    std::fs::write(
        &spec,
        format!("name = \"{LAB}\"\naccel = \"auto\"\n\n[[vm]]\nname = \"{VM}\"\nvcpus = 1\nmemory_mib = 192\n"),
    )
    .unwrap();
    lab.ok(&["up", spec.to_str().unwrap()]);
    lab.ok(&[
        "exec",
        VM,
        "--",
        "sh",
        "-c",
        "/usr/bin/vmscope-agent demo -d 70 </dev/null >/dev/null 2>&1 &",
    ]);
    let db = tmp.path().join("lab.db");
    let rec = vmscope()
        .args(["record", "-a", "-g", "-F", "499", "-d", "6", "--vm"])
        .arg(format!("{VM}=active"))
        .arg("-o")
        .arg(&db)
        .output()
        .unwrap();
    assert!(
        rec.status.success(),
        "record: {}",
        String::from_utf8_lossy(&rec.stderr)
    );

    // 0. The live endpoint: `serve --profile` while the guest works.
    live_pprof_endpoint(&tmp.path().join("live.pb.gz"));

    // 1. Joined stacks: host → VM → vCPU → guest process → guest functions.
    let collapsed = String::from_utf8(report(&db, &["--format", "collapsed"]).stdout).unwrap();
    let joined: Vec<&str> = collapsed
        .lines()
        .filter(|l| l.starts_with(&format!("{VM};vCPU_0;")) && l.contains(";vmscope_demo_alpha"))
        .collect();
    assert!(
        !joined.is_empty(),
        "no stack through {VM};vCPU_0;…;vmscope_demo_alpha:\n{}",
        collapsed
            .lines()
            .filter(|l| l.starts_with(VM))
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("a joined stack: {}", joined[0]);
    // The guest process frame sits right above the vCPU.
    assert!(
        joined
            .iter()
            .any(|l| l.split(';').nth(2) == Some("vmscope-agent")),
        "{joined:?}"
    );
    // Host stacks and guest stacks in one picture, adding up: the collapsed
    // counts of each domain equal its event count in the table.
    let by_domain = json(&db, &["--by", "domain", "-e", "cpu-clock"]);
    for row in by_domain["rows"].as_array().unwrap() {
        let d = row["values"][0].as_str().unwrap();
        let want = row["event_count"][0].as_u64().unwrap();
        let got: u64 = collapsed
            .lines()
            .filter(|l| l.split(';').next() == Some(d))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(got, want, "domain {d}: collapsed vs table");
    }
    let total: u64 = by_domain["events"][0]["event_count"].as_u64().unwrap();
    let rows_sum: u64 = by_domain["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_count"][0].as_u64().unwrap())
        .sum();
    assert_eq!(rows_sum, total, "rows add up to the header's total");

    let svg = tmp.path().join("machine.svg");
    report(
        &db,
        &["--format", "flamegraph", "-o", svg.to_str().unwrap()],
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    for needle in [VM, "vCPU 0", "vmscope-agent", "vmscope_demo_alpha", "host"] {
        assert!(svg.contains(needle), "{needle} not in the flame graph");
    }

    // 2. pprof with the VM label.
    if let Some(go) = go() {
        let pb = tmp.path().join("lab.pb.gz");
        report(&db, &["--format", "pprof", "-o", pb.to_str().unwrap()]);
        let top = |vm: &str| -> String {
            let out = Command::new(&go)
                .args([
                    "tool",
                    "pprof",
                    "-top",
                    "-nodefraction=0",
                    "-symbolize=none",
                    "-noinlines",
                ])
                .arg(format!("-tagfocus=vm={vm}"))
                .arg(&pb)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let act = top(VM);
        assert!(act.contains("vmscope_demo_alpha"), "{act}");
        let host = top("host");
        assert!(!host.contains("vmscope_demo_alpha"), "{host}");
    } else {
        vmscope_testkit::skip("Go is not installed: pprof's vm label unchecked");
    }

    // 3. The page in a browser.
    let html = tmp.path().join("lab.html");
    report(&db, &["--format", "html", "-o", html.to_str().unwrap()]);
    if vmscope_testkit::have("chromium") {
        let png = tmp.path().join("lab.png");
        let out = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=5000",
                "--window-size=1280,2200",
            ])
            .arg(format!(
                "--user-data-dir={}",
                tmp.path().join("chromium").display()
            ))
            .arg(format!("--screenshot={}", png.display()))
            .arg(format!("file://{}", html.display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !err.contains(":CONSOLE"), "{err}");
        if let Some(keep) = std::env::var_os("VMSCOPE_SCREENSHOT") {
            std::fs::copy(&png, keep).unwrap();
        }
    } else {
        vmscope_testkit::skip("chromium is not installed: the page is not loaded");
    }

    // 4. Slices add up: the first half and the rest of the seconds.
    let all = json(
        &db,
        &["--by", "domain", "-e", "cpu-clock", "--view", "host"],
    );
    let total = all["events"][0]["event_count"].as_u64().unwrap();
    let a = json(
        &db,
        &[
            "--by",
            "domain",
            "-e",
            "cpu-clock",
            "--view",
            "host",
            "--time",
            "0-3",
        ],
    );
    let b = json(
        &db,
        &[
            "--by",
            "domain",
            "-e",
            "cpu-clock",
            "--view",
            "host",
            "--time",
            "3-",
        ],
    );
    let (ta, tb) = (
        a["events"][0]["event_count"].as_u64().unwrap(),
        b["events"][0]["event_count"].as_u64().unwrap(),
    );
    assert!(ta > 0 && tb > 0, "both halves hold samples: {ta} {tb}");
    assert_eq!(ta + tb, total, "time slices add up (host view)");
    let c0 = json(
        &db,
        &[
            "--by",
            "domain",
            "-e",
            "cpu-clock",
            "--view",
            "host",
            "--cpu",
            "0",
        ],
    );
    let c1 = json(
        &db,
        &[
            "--by",
            "domain",
            "-e",
            "cpu-clock",
            "--view",
            "host",
            "--cpu",
            "1",
        ],
    );
    let (t0, t1) = (
        c0["events"][0]["event_count"].as_u64().unwrap(),
        c1["events"][0]["event_count"].as_u64().unwrap(),
    );
    assert_eq!(t0 + t1, total, "CPU slices add up (host view)");
    // Merged: the VM's agent rows are rescaled inside the slice, so the
    // slice's total is the host's total of that slice.
    let m = json(&db, &["--by", "domain", "-e", "cpu-clock", "--time", "0-3"]);
    let tm = m["events"][0]["event_count"].as_u64().unwrap();
    let diff = (tm as f64 - ta as f64).abs() / ta as f64;
    assert!(diff < 0.01, "merged slice {tm} vs host slice {ta}");
}

/// Kills `vmscope serve` (SIGTERM, then SIGKILL) when dropped.
struct Serve(std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        for _ in 0..50 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A GET over HTTP/1.0: status line and body.
fn http_get(addr: &str, path: &str, limit: std::time::Duration) -> (String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("GET {path}: no answer within {limit:?}: {e}"));
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&out[..at])
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    (status, out[at + 4..].to_vec())
}

fn live_pprof_endpoint(keep: &Path) {
    use prost::Message;
    use std::io::{BufRead, Read};
    use std::time::{Duration, Instant};
    let mut child = vmscope()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--profile",
            "--profile-window",
            "20",
            // The rate asked for (99 Hz) throughout: under the default 1 %
            // budget the recording starts at 12 Hz, and a 5 s profile
            // taken just after start holds too few samples for the
            // labels and shares checked here (the budget has its own
            // tests: serve's pprof_endpoint, concurrent.rs).
            "--no-overhead-budget",
            "--vm",
        ])
        .arg(format!("{VM}=active"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let serve = Serve(child);
    // "vmscope serve: http://ADDR/debug/pprof/profile?seconds=N" once the
    // agents are armed and the rings run.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("serve: {line}");
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("serve --profile did not start");
        if let Some(rest) = line.strip_prefix("vmscope serve: http://") {
            if let Some(a) = rest.strip_suffix("/debug/pprof/profile?seconds=N") {
                break a.to_string();
            }
        }
    };
    let (status, body) = http_get(
        &addr,
        "/debug/pprof/profile?seconds=x",
        Duration::from_secs(2),
    );
    assert!(status.contains("400"), "{status}");
    assert!(String::from_utf8_lossy(&body).contains("seconds=x"));
    // The raw answer, taken while /metrics is scraped.
    let a2 = addr.clone();
    let taker = std::thread::spawn(move || {
        http_get(
            &a2,
            "/debug/pprof/profile?seconds=5",
            Duration::from_secs(20),
        )
    });
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    let (status, _) = http_get(&addr, "/metrics", Duration::from_secs(2));
    assert!(
        status.contains("200") && t.elapsed() < Duration::from_secs(2),
        "{status}"
    );
    let (status, gz) = taker.join().unwrap();
    assert!(status.contains("200"), "{status}");
    std::fs::write(keep, &gz).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let p = vmscope_report::pprof::Profile::decode(raw.as_slice()).unwrap();
    let st = |i: i64| p.string_table[i as usize].as_str();
    let fname: std::collections::HashMap<u64, &str> =
        p.function.iter().map(|f| (f.id, st(f.name))).collect();
    let leaf = |s: &vmscope_report::pprof::Sample| -> Vec<&str> {
        let l = s.location_id.first().copied().unwrap_or(0);
        p.location
            .iter()
            .filter(|x| x.id == l)
            .flat_map(|x| {
                x.line
                    .iter()
                    .map(|ln| fname.get(&ln.function_id).copied().unwrap_or(""))
            })
            .collect()
    };
    let label = |s: &vmscope_report::pprof::Sample, key: &str| -> Option<String> {
        s.label.iter().find(|l| st(l.key) == key).map(|l| {
            if l.str != 0 {
                st(l.str).to_string()
            } else {
                l.num.to_string()
            }
        })
    };
    let guest: Vec<&vmscope_report::pprof::Sample> = p
        .sample
        .iter()
        .filter(|s| leaf(s).contains(&"vmscope_demo_alpha"))
        .collect();
    assert!(
        !guest.is_empty(),
        "no sample of vmscope_demo_alpha in {} samples",
        p.sample.len()
    );
    for s in &guest {
        assert_eq!(label(s, "vm").as_deref(), Some(VM));
        assert_eq!(label(s, "context").as_deref(), Some("guest-user"));
        assert_eq!(label(s, "process").as_deref(), Some("vmscope-agent"));
        assert_eq!(label(s, "vcpu").as_deref(), Some("0"));
    }
    assert!(p
        .sample
        .iter()
        .any(|s| label(s, "vm").as_deref() == Some("host")));
    // go tool pprof reads the URL itself, and -tagfocus keeps the VM.
    if let Some(go) = go() {
        let out = Command::new(&go)
            .args([
                "tool",
                "pprof",
                "-top",
                "-nodefraction=0",
                "-symbolize=none",
                "-noinlines",
            ])
            .arg(format!("-tagfocus=vm={VM}"))
            .arg(format!("http://{addr}/debug/pprof/profile?seconds=5"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("vmscope_demo_alpha"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "go tool pprof -top -tagfocus vm={VM} of the endpoint:\n{}",
            text.lines().take(12).collect::<Vec<_>>().join("\n")
        );
    } else {
        vmscope_testkit::skip("Go is not installed: go tool pprof on the endpoint unchecked");
    }
    drop(serve);
}
