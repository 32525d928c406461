//! `vmscope serve --export` against real receivers, started here: an
//! OpenTelemetry Collector built from its own Go modules (OTLP receiver,
//! profiles feature gate, file exporter; `scripts/setup.sh` builds it into
//! `target/otelcol-vmscope`), Prometheus with its remote-write receiver
//! and VictoriaMetrics; and a loopback receiver that decodes Pyroscope's
//! ingest format (no Pyroscope server can be built here).
//!
//! One lab VM, active, runs the demo workload while `serve --profile`
//! exports every 2 s. The collector is stopped for 30 s mid-run and
//! started again: every window arrives once, none twice, in order, without
//! gap; each window's per-domain totals equal `vmscope report` of the same
//! seconds (the window's session file, `--export-archive`); every label is
//! checked; the Pyroscope requests carry the same totals; the series
//! Prometheus and VictoriaMetrics received bracket what `/metrics` said
//! between two pushes. Needs root, QEMU and the receivers; runs under the
//! heavy-job lock like every lab test.

mod common;

use common::{free_port, http_get, vmscope, Reap, TestLab};
use prost::Message;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vmscope_testkit::receiver::Receiver;

const LAB: &str = "exp";
const VM: &str = "web";
/// Seconds between exports in this test.
const INTERVAL: u64 = 2;

/// The collector `scripts/setup.sh` builds.
fn otelcol() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VMSCOPE_OTELCOL") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()?
        .join("otelcol-vmscope");
    p.exists().then_some(p)
}

fn start_collector(bin: &Path, dir: &Path, port: u16, out: &Path) -> Reap {
    let cfg = dir.join(format!("otelcol-{port}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
             exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            out.display()
        ),
    )
    .unwrap();
    let child = Command::new(bin)
        .arg(format!("--config={}", cfg.display()))
        .arg("--feature-gates=service.profilesSupport")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(collector_log(out)).unwrap())
        .spawn()
        .unwrap();
    wait_port(port);
    Reap(child)
}

/// Where the collector writing `out` logs.
fn collector_log(out: &Path) -> PathBuf {
    out.with_extension("log")
}

fn wait_port(port: u16) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "nothing listens on {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Ends a child with SIGTERM and waits for it.
fn term(child: &mut std::process::Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// An OTLP JSON integer (a string or a number).
fn int(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// One profile of one window as the collector wrote it.
#[derive(Debug)]
struct Got {
    start: i64,
    duration: i64,
    id: String,
    resource: BTreeMap<String, String>,
    /// Each sample's attributes and value.
    samples: Vec<(BTreeMap<String, String>, i64)>,
    attrs: BTreeMap<String, String>,
}

/// `key`/`keyStrindex` and `stringValue`/`stringValueStrindex`/`intValue`/
/// `doubleValue`, resolved.
fn kv(a: &Value, strings: &[String]) -> (String, String) {
    let s = |i: &Value| strings.get(int(i) as usize).cloned().unwrap_or_default();
    let key = a["key"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| s(&a["keyStrindex"]));
    let v = &a["value"];
    let value = if let Some(x) = v["stringValue"].as_str() {
        x.to_string()
    } else if !v["stringValueStrindex"].is_null() {
        s(&v["stringValueStrindex"])
    } else if !v["intValue"].is_null() {
        int(&v["intValue"]).to_string()
    } else if let Some(d) = v["doubleValue"].as_f64() {
        d.to_string()
    } else {
        String::new()
    };
    (key, value)
}

/// Every profile in the collector's files, in the order received.
fn collected(files: &[PathBuf]) -> Vec<Got> {
    let mut out = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        // A collector still running writes in 4 KiB chunks: its last line
        // may not be whole yet.
        let whole = text.rfind('\n').map_or("", |i| &text[..i]);
        for line in whole.lines().filter(|l| !l.trim().is_empty()) {
            let d: Value = serde_json::from_str(line).unwrap();
            let dict = &d["dictionary"];
            let strings: Vec<String> = dict["stringTable"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| s.as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default();
            let table: Vec<(String, String)> = dict["attributeTable"]
                .as_array()
                .map(|a| a.iter().map(|x| kv(x, &strings)).collect())
                .unwrap_or_default();
            let pick = |ix: &Value| -> BTreeMap<String, String> {
                ix.as_array()
                    .into_iter()
                    .flatten()
                    .map(|i| table[int(i) as usize].clone())
                    .collect()
            };
            for rp in d["resourceProfiles"].as_array().into_iter().flatten() {
                let resource: BTreeMap<String, String> = rp["resource"]["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| kv(a, &strings))
                    .collect();
                for sp in rp["scopeProfiles"].as_array().into_iter().flatten() {
                    for p in sp["profiles"].as_array().into_iter().flatten() {
                        out.push(Got {
                            start: int(&p["timeUnixNano"]),
                            duration: int(&p["durationNano"]),
                            id: p["profileId"].as_str().unwrap_or("").to_string(),
                            resource: resource.clone(),
                            samples: p["samples"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|s| (pick(&s["attributeIndices"]), int(&s["values"][0])))
                                .collect(),
                            attrs: pick(&p["attributeIndices"]),
                        });
                    }
                }
            }
        }
    }
    out
}

/// `vmscope report FILE --by domain` event counts.
fn report_by_domain(db: &Path) -> BTreeMap<String, i64> {
    let out = vmscope()
        .arg("report")
        .arg(db)
        .args(["--by", "domain", "-e", "cpu-clock", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["values"][0].as_str().unwrap().to_string(),
                r["event_count"][0].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The profile.proto in a Pyroscope ingest body (multipart, field
/// `profile`, gzipped).
fn pyroscope_profile(body: &[u8], content_type: &str) -> vmscope_report::pprof::Profile {
    let boundary = content_type
        .split("boundary=")
        .nth(1)
        .expect("a multipart boundary");
    let text_start = format!("--{boundary}\r\n");
    assert!(body.starts_with(text_start.as_bytes()));
    let head_end = body.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&body[..head_end]);
    assert!(head.contains("name=\"profile\""), "{head}");
    let end_mark = format!("\r\n--{boundary}--");
    let end = body
        .windows(end_mark.len())
        .rposition(|w| w == end_mark.as_bytes())
        .unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[head_end + 4..end])
        .read_to_end(&mut raw)
        .unwrap();
    vmscope_report::pprof::Profile::decode(raw.as_slice()).unwrap()
}

/// `m[10m]` from a Prometheus-compatible API: each series' labels and
/// samples (time s, value).
/// A series' labels and its samples (time s, value).
type Series = (BTreeMap<String, String>, Vec<(f64, f64)>);

fn range(addr: &str, metric: &str) -> Vec<Series> {
    let q = format!("/api/v1/query?query={}", enc(&format!("{metric}[10m]")));
    let body = http_get(addr, &q).unwrap_or_default();
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect();
            let samples = r["values"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    (
                        p[0].as_f64().unwrap(),
                        p[1].as_str().unwrap().parse::<f64>().unwrap(),
                    )
                })
                .collect();
            (labels, samples)
        })
        .collect()
}

/// The value of every `vmscope_vcpu_run_seconds_total` series in `/metrics`,
/// by its `domain,vcpu`.
fn scraped_run(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter_map(|l| l.strip_prefix("vmscope_vcpu_run_seconds_total{"))
        .filter_map(|l| {
            let (labels, v) = l.rsplit_once("} ")?;
            Some((labels.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn series_key(labels: &BTreeMap<String, String>) -> String {
    format!(
        "domain=\"{}\",vcpu=\"{}\"",
        labels.get("domain").map_or("", String::as_str),
        labels.get("vcpu").map_or("", String::as_str)
    )
}

#[test]
fn exports_reach_real_receivers_and_survive_an_outage() {
    let Some(col) = otelcol() else {
        vmscope_testkit::skip(
            "target/otelcol-vmscope is not built (scripts/setup.sh builds it from tools/otelcol)",
        );
        return;
    };
    if !vmscope_testkit::require_tools(&[
        ("prometheus", "prometheus"),
        ("victoria-metrics", "victoria-metrics"),
    ]) {
        return;
    }
    let env = need_lab!("export-run");
    let tmp = tempfile::tempdir().unwrap();
    // VMSCOPE_KEEP=DIR keeps the run's files (the collectors' output, the
    // archive) there for a look after a failure.
    let kept = std::env::var_os("VMSCOPE_KEEP").map(PathBuf::from);
    let dir = kept.as_deref().unwrap_or(tmp.path());
    std::fs::create_dir_all(dir).unwrap();
    let lab = TestLab::new(env, LAB);
    lab.up_text(&format!(
        "name = \"{LAB}\"\naccel = \"auto\"\n\n[[vm]]\nname = \"{VM}\"\nvcpus = 1\nmemory_mib = 192\n"
    ));
    lab.ok(&[
        "exec",
        VM,
        "--",
        "sh",
        "-c",
        "/usr/bin/vmscope-agent demo -d 120 </dev/null >/dev/null 2>&1 &",
    ]);

    // The receivers.
    let col_port = free_port();
    let out1 = dir.join("otlp-1.jsonl");
    let out2 = dir.join("otlp-2.jsonl");
    let mut collector = start_collector(&col, dir, col_port, &out1);
    let prom_port = free_port();
    let saddr = format!("127.0.0.1:{}", free_port());
    let prom_cfg = dir.join("prometheus.yml");
    std::fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vmscope\n    static_configs:\n      - targets: ['{saddr}']\n"
        ),
    )
    .unwrap();
    let _prom = Reap(
        Command::new("prometheus")
            .arg(format!("--config.file={}", prom_cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prom").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--web.enable-remote-write-receiver")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let vm_port = free_port();
    let _vmetrics = Reap(
        Command::new("victoria-metrics")
            .arg(format!("-storageDataPath={}", dir.join("vm").display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{vm_port}"))
            .arg("-search.latencyOffset=0s")
            .arg("-search.disableCache")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(prom_port);
    wait_port(vm_port);
    let pyro = Receiver::start();
    let archive = dir.join("archive");

    let mut child = vmscope()
        .args([
            "serve",
            "--listen",
            &saddr,
            "--per-cpu",
            "--profile",
            "--vm",
        ])
        .arg(format!("{VM}=active"))
        .arg("--export")
        .arg(format!("otlp=http://127.0.0.1:{col_port}"))
        .arg("--export")
        .arg(format!("pyroscope=http://{}", pyro.addr()))
        .arg("--export")
        .arg(format!("remote-write=http://127.0.0.1:{prom_port}"))
        .arg("--export")
        .arg(format!("remote-write=http://127.0.0.1:{vm_port}"))
        .args([
            "--export-interval",
            &INTERVAL.to_string(),
            "--export-tenant",
            "fleet-1",
        ])
        .arg("--export-spool")
        .arg(dir.join("spool"))
        .arg("--export-archive")
        .arg(&archive)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Killed however the test ends (a serve left running records every
    // CPU and holds the scheduler's tracepoints for the tests after it).
    let mut child = Reap(child);
    let log = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("serve: {l}");
            lines.push(l);
        }
        lines
    });
    let windows = |files: &[PathBuf]| {
        let mut starts: Vec<i64> = collected(files).iter().map(|g| g.start).collect();
        starts.dedup();
        starts.len()
    };
    let t = Instant::now();
    while windows(std::slice::from_ref(&out1)) < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no OTLP window arrived"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The outage begins just after a window arrived, so no push is on its
    // way while the collector shuts down (one it takes then and loses is
    // the collector's loss, not serve's).
    let seen = windows(std::slice::from_ref(&out1));
    while windows(std::slice::from_ref(&out1)) == seen {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no third OTLP window arrived"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Between two pushes: what /metrics says now.
    let before_scrape = std::time::SystemTime::now();
    let scraped = scraped_run(&http_get(&saddr, "/metrics").unwrap());
    let after_scrape = std::time::SystemTime::now();

    // The outage: 30 s without the collector.
    let term_at = std::time::SystemTime::now();
    term(&mut collector.0);
    let down_after = term_at.elapsed().unwrap_or_default();
    std::thread::sleep(Duration::from_secs(30));
    let mid = http_get(&saddr, "/metrics").unwrap();
    let waiting = mid
        .lines()
        .find(|l| l.starts_with("vmscope_export_queued_requests{exporter=\"otlp\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        waiting >= 5.0,
        "only {waiting} windows waited during 30 s:\n{mid}"
    );
    let mut collector2 = start_collector(&col, dir, col_port, &out2);
    // The spooled windows arrive, then two more.
    let t = Instant::now();
    loop {
        let m = http_get(&saddr, "/metrics").unwrap_or_default();
        let queued = m
            .lines()
            .find(|l| l.starts_with("vmscope_export_queued_requests{exporter=\"otlp\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        if queued == Some(0.0) && windows(std::slice::from_ref(&out2)) >= waiting as usize + 2 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the spool did not drain:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let last_metrics = http_get(&saddr, "/metrics").unwrap();
    // 6. Every panel of the fleet dashboard has series in a Prometheus that
    // scraped this serve (and took its remote write).
    dashboard_panels_have_series(&format!("127.0.0.1:{prom_port}"));
    term(&mut child.0);
    let log = log.join().unwrap();
    assert!(
        log.iter()
            .any(|l| l.contains("connection refused") && l.contains("wait in the spool")),
        "no line about the outage: {log:?}"
    );
    // The collector writes what it holds and closes its file.
    term(&mut collector2.0);

    // 1. Every window once, in order, without gap.
    let got = collected(&[out1.clone(), out2.clone()]);
    let mut ids: Vec<&str> = got.iter().map(|g| g.id.as_str()).collect();
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "a profile arrived twice");
    let mut windows: Vec<(i64, i64)> = Vec::new();
    for g in &got {
        match windows.last() {
            Some(&(s, _)) if s == g.start => {}
            Some(&(s, _)) => {
                assert!(g.start > s, "windows out of order: {} after {s}", g.start);
                windows.push((g.start, g.duration));
            }
            None => windows.push((g.start, g.duration)),
        }
    }
    let mut archived: Vec<PathBuf> = std::fs::read_dir(&archive)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "db"))
        .collect();
    archived.sort();
    for w in windows.windows(2) {
        let gap = w[1].0 - (w[0].0 + w[0].1);
        if gap.abs() >= 5_000_000 {
            // What serve cut (its archive) against what arrived, and what
            // it counted: whether serve never sent the window or the
            // receiver took it and lost it.
            let cut: Vec<String> = archived
                .iter()
                .map(|p| {
                    let m = vmscope_store::Session::open(p)
                        .and_then(|s| s.meta())
                        .unwrap_or_default();
                    format!(
                        "{} started_at {} duration_s {}",
                        p.file_name().unwrap().to_string_lossy(),
                        m.get("started_at").map_or("?", String::as_str),
                        m.get("duration_s").map_or("?", String::as_str)
                    )
                })
                .collect();
            let counters: Vec<&str> = last_metrics
                .lines()
                .filter(|l| l.starts_with("vmscope_export_"))
                .collect();
            // Which collector took which window, and what each said.
            let by_file: Vec<String> = [&out1, &out2]
                .iter()
                .map(|f| {
                    let mut starts: Vec<i64> = collected(std::slice::from_ref(f))
                        .iter()
                        .map(|g| g.start)
                        .collect();
                    starts.dedup();
                    let said = std::fs::read_to_string(collector_log(f)).unwrap_or_default();
                    let tail: Vec<&str> = said.lines().rev().take(15).collect();
                    format!(
                        "{}: windows {starts:?}\n  log (last lines first):\n  {}",
                        f.display(),
                        tail.join("\n  ")
                    )
                })
                .collect();
            panic!(
                "{gap} ns between the windows at {} and {} ns\nreceived: {windows:?}\n\
                 collector 1 stopped at {} ns, {down_after:?} after SIGTERM\n{}\ncut:\n{}\n{}\nserve said:\n{}",
                w[0].0,
                w[1].0,
                term_at
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
                by_file.join("\n"),
                cut.join("\n"),
                counters.join("\n"),
                log.join("\n")
            );
        }
    }
    assert_eq!(
        windows.len(),
        archived.len(),
        "windows received vs windows cut (every window once)"
    );
    eprintln!(
        "{} windows, {} during the outage, {} profiles",
        windows.len(),
        waiting,
        got.len()
    );

    // 2. Per-domain totals equal `vmscope report` of the same seconds.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim();
    let machine_id = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let uuid = vmscope_lab::qemu_args::lab_uuid(LAB, VM);
    let mut worst: f64 = 0.0;
    let mut vm_windows = 0;
    let mut vm_costs = 0;
    for ((start, _), db) in windows.iter().zip(&archived) {
        let report = report_by_domain(db);
        for g in got.iter().filter(|g| g.start == *start) {
            let service = &g.resource["service.name"];
            let domain = service.strip_prefix("vm/").unwrap_or(service);
            let total: i64 = g.samples.iter().map(|s| s.1).sum();
            let want = report.get(domain).copied().unwrap_or(0);
            let diff = (total - want).abs() as f64 / want.max(1) as f64;
            worst = worst.max(diff);
            assert!(
                diff <= 0.01,
                "{domain} at {start}: OTLP {total} vs report {want}"
            );
            assert_eq!(g.resource["host.name"], host);
            if !machine_id.trim().is_empty() {
                assert_eq!(g.resource["host.id"], machine_id.trim());
            }
            if domain == VM {
                vm_windows += 1;
                assert_eq!(g.resource["vmscope.vm.uuid"], uuid);
                // The agent's cost arrives with its steps: not in every
                // window of 2 s.
                if g.attrs.contains_key("vmscope.profiler.cpu") {
                    assert!(g.attrs.contains_key("vmscope.profiler.sample_rate"));
                    assert!(g.attrs.contains_key("vmscope.profiler.observed_cpu"));
                    vm_costs += 1;
                }
                for (a, _) in &g.samples {
                    assert_eq!(a["vmscope.vm.name"], VM, "{a:?}");
                    assert_eq!(a["vmscope.vm.uuid"], uuid, "{a:?}");
                    assert!(
                        a.contains_key("vmscope.context")
                            && a.contains_key("process.executable.name"),
                        "{a:?}"
                    );
                    if a["vmscope.context"].starts_with("guest") {
                        assert!(a.contains_key("vmscope.vcpu"), "{a:?}");
                    }
                }
            }
        }
    }
    // In the merged view an active VM's time is its agent's rows scaled to
    // what the host measured; a window of 2 s without an agent delta holds
    // none of it (as `vmscope report` of those seconds shows).
    assert!(
        vm_windows * 2 >= windows.len(),
        "the VM is in {vm_windows} of {} windows",
        windows.len()
    );
    assert!(vm_costs > 0, "no window carries the agent's cost");
    eprintln!("{VM} in {vm_windows} windows, its profiler's cost in {vm_costs}");
    assert!(
        got.iter()
            .any(|g| g.samples.iter().any(|(a, _)| a.contains_key("thread.name"))),
        "no sample names its vCPU thread"
    );
    eprintln!(
        "per-domain totals vs vmscope report: worst difference {:.4} %",
        worst * 100.0
    );

    // 3. Pyroscope: the same windows, per service, with their labels.
    let ingests = pyro.taken();
    assert!(!ingests.is_empty());
    let mut pyro_vm = 0;
    let mut pyro_vcpu = 0;
    for r in &ingests {
        assert_eq!((r.method.as_str(), r.path()), ("POST", "/ingest"));
        assert_eq!(r.header("x-scope-orgid"), Some("fleet-1"));
        let q: BTreeMap<String, String> = r.query().into_iter().collect();
        assert_eq!(q["format"], "pprof");
        let name = &q["name"];
        if !name.starts_with(&format!("vm/{VM}{{")) {
            continue;
        }
        assert_eq!(name, &format!("vm/{VM}{{host={host},vm_uuid={uuid}}}"));
        let from: i64 = q["from"].parse().unwrap();
        let g = got
            .iter()
            .find(|g| {
                g.start / 1_000_000_000 == from && g.resource["service.name"] == format!("vm/{VM}")
            })
            .unwrap_or_else(|| panic!("no OTLP window of {VM} from {from}"));
        let p = pyroscope_profile(&r.body, r.header("content-type").unwrap());
        let vi = p
            .sample_type
            .iter()
            .position(|t| t.r#type == p.default_sample_type)
            .unwrap();
        let total: i64 = p.sample.iter().map(|s| s.value[vi]).sum();
        let otlp: i64 = g.samples.iter().map(|s| s.1).sum();
        assert_eq!(total, otlp, "Pyroscope and OTLP totals of one window");
        // Every sample says its context; a guest context also its vCPU. A
        // window of 2 s may hold none of the agent's rows (see above): then
        // only QEMU's own threads, with no vCPU label.
        for s in &p.sample {
            let labels: BTreeMap<&str, &str> = s
                .label
                .iter()
                .map(|l| {
                    (
                        p.string_table[l.key as usize].as_str(),
                        p.string_table[l.str as usize].as_str(),
                    )
                })
                .collect();
            let context = labels.get("context").copied();
            assert!(context.is_some(), "{labels:?}");
            if context.is_some_and(|c| c.starts_with("guest")) {
                assert!(labels.contains_key("vcpu"), "{labels:?}");
                pyro_vcpu += 1;
            }
        }
        pyro_vm += 1;
    }
    assert!(pyro_vm >= 2, "{pyro_vm} Pyroscope requests of {VM}");
    assert!(pyro_vcpu > 0, "no Pyroscope sample of {VM} names its vCPU");

    // 4. Remote write: both receivers bracket what /metrics said.
    let before = before_scrape
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let after = after_scrape
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for addr in [
        format!("127.0.0.1:{prom_port}"),
        format!("127.0.0.1:{vm_port}"),
    ] {
        // What was pushed (the Prometheus also scrapes this serve, under
        // the instance of its address).
        let series = range(
            &addr,
            &format!("vmscope_vcpu_run_seconds_total{{instance=\"{host}\"}}"),
        );
        assert!(!series.is_empty(), "{addr}: no series");
        let mut checked = 0;
        for (labels, samples) in &series {
            assert_eq!(labels["instance"], host, "{labels:?}");
            assert_eq!(labels["job"], "vmscope");
            let Some(&scraped) = scraped.get(&series_key(labels)) else {
                panic!("{addr}: {labels:?} is not in /metrics: {scraped:?}");
            };
            let below = samples.iter().rev().find(|s| s.0 <= before);
            let above = samples.iter().find(|s| s.0 >= after);
            if let (Some(b), Some(a)) = (below, above) {
                assert!(
                    b.1 <= scraped + 1e-6 && scraped <= a.1 + 1e-6,
                    "{addr} {labels:?}: pushed {} then {}, /metrics said {scraped}",
                    b.1,
                    a.1
                );
                checked += 1;
            }
        }
        for k in scraped.keys() {
            assert!(
                series.iter().any(|(l, _)| &series_key(l) == k),
                "{addr}: {k} is in /metrics but was never pushed"
            );
        }
        assert!(
            checked > 0,
            "{addr}: no series with a push on both sides of the scrape"
        );
        let sent = range(
            &addr,
            &format!("vmscope_export_sent_total{{instance=\"{host}\"}}"),
        );
        assert!(
            sent.iter().any(|(l, _)| l["exporter"] == "otlp"),
            "{addr}: no export counters"
        );
    }

    // 5. The counters say what happened.
    let counter = |name: &str| {
        last_metrics
            .lines()
            .find(|l| l.starts_with(&format!("vmscope_export_{name}_total{{exporter=\"otlp\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    assert!(
        counter("failed") >= 1.0 && counter("spooled") >= waiting,
        "{last_metrics}"
    );
    assert_eq!(counter("dropped"), 0.0);
}

/// Percent-encode a query parameter.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Each target of `packaging/grafana/vmscope-fleet.json`, with the
/// dashboard's variables set to "all", returns series from Prometheus.
fn dashboard_panels_have_series(prom: &str) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/grafana/vmscope-fleet.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$instance", ".+")
                .replace("$domain", ".+")
                .replace("$__rate_interval", "20s");
            let body =
                http_get(prom, &format!("/api/v1/query?query={}", enc(&expr))).unwrap_or_default();
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            assert_eq!(v["status"], "success", "{}: {expr}: {body}", panel["title"]);
            let n = v["data"]["result"].as_array().map_or(0, Vec::len);
            assert!(n > 0, "panel {}: no series for {expr}", panel["title"]);
            checked += 1;
        }
    }
    assert!(checked >= 15, "{checked} queries");
    eprintln!("dashboard: {checked} panel queries, each with series");
}
