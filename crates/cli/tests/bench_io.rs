//! `vmscope bench io` through the built binary, on the host (issue 14).
//!
//! - Bad input (item 9): a missing target, a mounted file system, a block
//!   size that is not a multiple of a 4096-byte-sector device, a size
//!   larger than the target, no space left, a list that is not a list:
//!   one `vmscope: error:` line, exit 2, and the target untouched. A file
//!   and a loop device holding a partition table are written only when
//!   `--force-destroy-data` names them.
//! - A small host sweep: JSON rows (base units, configuration, hash,
//!   manifest), summaries, CSV, the Table 1 layout with MiB/s and MB/s,
//!   charts (SVG and PNG) and the session's `bench_samples`.
//!
//! The engine's agreement with GNU dd and fio is `tests/agreement.rs` of
//! vmscope-bench (host) and the lab test `lab_bench_io` (in a VM).
//! Tests print `SKIP: <reason>` and pass when what they need is missing.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The tests drop caches, time I/O and boot a VM: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn bench(args: &[&str]) -> Command {
    let mut c = vmscope();
    c.args(["bench", "io", "--quiet"]).args(args);
    c
}

/// Exit 2, exactly one `vmscope: error:` line holding every `needle`, no panic.
fn fails_clearly(out: &Output, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "exit code; stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("vmscope: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    for n in needles {
        assert!(err.contains(n), "expected `{n}` in: {err}");
    }
    err
}

fn file_of(dir: &Path, name: &str, len: u64, head: &[u8]) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(len).unwrap();
    drop(f);
    if !head.is_empty() {
        use std::os::unix::fs::FileExt;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .write_all_at(head, 0)
            .unwrap();
    }
    p
}

/// A 512-byte MBR: a partition entry and the 0x55AA signature.
fn mbr() -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[446] = 0x80;
    b[450] = 0x83;
    b[510] = 0x55;
    b[511] = 0xaa;
    b
}

/// A loop device over `file` (with `--sector-size` when given), detached on drop.
struct Loop(String);

impl Loop {
    fn attach(file: &Path, sector: Option<u32>) -> Option<Loop> {
        let mut c = Command::new("losetup");
        c.args(["-f", "--show"]);
        if let Some(s) = sector {
            c.arg("--sector-size").arg(s.to_string());
        }
        let out = c.arg(file).output().ok()?;
        out.status
            .success()
            .then(|| Loop(String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// The block device mounted at `/`, if `/` is on one.
fn root_device() -> Option<String> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        let src = f.get(sep + 2)?;
        (f.get(4) == Some(&"/") && src.starts_with("/dev/")).then(|| src.to_string())
    })
}

#[test]
fn bad_input_fails_before_any_io() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run_dir = d.join("no-labs");
    std::fs::create_dir_all(&run_dir).unwrap();
    let run = |args: &[&str]| bench(args).output().unwrap();

    // Nothing to measure, lists that are not lists, unknown modes.
    fails_clearly(&run(&[]), &["--target"]);
    fails_clearly(&run(&["--target", "disk:/x"]), &["disk:/x", "host:PATH"]);
    fails_clearly(
        &run(&["--target", "host:/x", "--bs", "3k..1M"]),
        &["--bs", "powers of two"],
    );
    fails_clearly(
        &run(&["--target", "host:/x", "--size", "1Q"]),
        &["--size", "suffix"],
    );
    fails_clearly(
        &run(&["--target", "host:/x", "--mode", "direct-read,fast"]),
        &["--mode", "fast"],
    );
    fails_clearly(
        &run(&["--target", "host:/x", "--repeat", "0"]),
        &["--repeat"],
    );
    fails_clearly(
        &run(&[
            "--lab",
            "no-such-spec",
            "--run-dir",
            run_dir.to_str().unwrap(),
        ]),
        &["no-such-spec", "storage-quad"],
    );
    if !is_root() {
        eprintln!("SKIP: the target checks need root (caches are dropped before every sample)");
        return;
    }
    // A target that does not exist, in the host or in a VM.
    let missing = d.join("missing.img");
    let id = format!("host:{}", missing.display());
    fails_clearly(&run(&["--target", &id]), &[&id, "does not exist"]);
    assert!(!missing.exists(), "a missing target must not be created");
    fails_clearly(
        &run(&[
            "--target",
            "vm:nosuchvm:/dev/vdb",
            "--run-dir",
            run_dir.to_str().unwrap(),
        ]),
        &["vm:nosuchvm:/dev/vdb", "nosuchvm"],
    );
    // Mounted file systems: the root mount point, and its device.
    fails_clearly(&run(&["--target", "host:/"]), &["host:/", "mounted"]);
    if let Some(dev) = root_device() {
        let id = format!("host:{dev}");
        let out = run(&["--target", &id, "--force-destroy-data", &dev]);
        fails_clearly(&out, &[&id, "mounted"]);
    }
    // Larger than the target: nothing written.
    let small = file_of(d, "small.img", 1 << 20, b"keep");
    let id = format!("host:{}", small.display());
    fails_clearly(
        &run(&["--target", &id, "--size", "2M", "--bs", "64k"]),
        &[&id, "less than"],
    );
    assert_eq!(&std::fs::read(&small).unwrap()[..4], b"keep");
    // A partition table: refused unless --force-destroy-data names it.
    let part = file_of(d, "part.img", 2 << 20, &mbr());
    let id = format!("host:{}", part.display());
    let quick = [
        "--bs",
        "64k",
        "--size",
        "1M",
        "--repeat",
        "1",
        "--max-repeat",
        "1",
        "--warmup",
        "0",
        "--no-account",
        "--no-charts",
        "--mode",
        "direct-write",
        "--format",
        "json",
    ];
    let mut a = vec!["--target", id.as_str()];
    a.extend(quick);
    fails_clearly(
        &run(&a),
        &[&id, "MBR partition table", "--force-destroy-data"],
    );
    assert_eq!(std::fs::read(&part).unwrap()[..512], mbr()[..]);
    let ps = part.display().to_string();
    a.extend(["--force-destroy-data", ps.as_str()]);
    let out = run(&a);
    assert!(
        out.status.success(),
        "forced: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        &std::fs::read(&part).unwrap()[510..512],
        &[0, 0],
        "the forced run wrote zeros over the table"
    );
    if !have("losetup") {
        eprintln!("SKIP: losetup missing (util-linux): device cases");
        return;
    }
    // A device with 4096-byte sectors takes no 512-byte O_DIRECT blocks.
    let backing = file_of(d, "sectors.img", 8 << 20, b"");
    match Loop::attach(&backing, Some(4096)) {
        Some(l) => {
            let id = format!("host:{}", l.0);
            fails_clearly(
                &run(&[
                    "--target",
                    &id,
                    "--bs",
                    "512,4k",
                    "--size",
                    "1M",
                    "--mode",
                    "direct-read",
                ]),
                &["block size 512", "logical sector size 4096"],
            );
        }
        None => eprintln!("SKIP: no loop device with 4096-byte sectors here"),
    }
    // A device holding a partition table.
    let disk = file_of(d, "disk.img", 4 << 20, &mbr());
    if let Some(l) = Loop::attach(&disk, None) {
        let id = format!("host:{}", l.0);
        fails_clearly(
            &run(&["--target", &id, "--size", "1M", "--bs", "64k"]),
            &[&id, "MBR partition table", "--force-destroy-data"],
        );
        assert_eq!(std::fs::read(&disk).unwrap()[..512], mbr()[..]);
    }
    // No space left to fill a sparse file: a 2 MiB tmpfs.
    let mnt = d.join("small-fs");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let sparse = file_of(&mnt, "sparse.img", 16 << 20, b"");
        let id = format!("host:{}", sparse.display());
        let out = run(&["--target", &id, "--size", "16M", "--bs", "1M"]);
        let _ = Command::new("umount").arg(&mnt).status();
        fails_clearly(&out, &[&id, "no space left"]);
    } else {
        eprintln!("SKIP: cannot mount a tmpfs here: the no-space case");
    }
}

#[test]
fn host_sweep_rows_tables_charts_and_session() {
    let _one = serial();
    if !is_root() {
        eprintln!("SKIP: bench io drops caches before every sample: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = file_of(d, "host.img", 8 << 20, b"");
    let target = format!("host:{}", img.display());
    let charts = d.join("charts");
    let db = d.join("io.db");
    let common = [
        "--bs",
        "64k,1M",
        "--size",
        "4M",
        "--repeat",
        "2",
        "--max-repeat",
        "3",
        "--mode",
        "buffered-write,direct-read",
    ];
    // JSON lines, charts and the session.
    let out = run_ok(
        bench(&["--target", &target, "--format", "json", "-o"])
            .arg(&db)
            .arg("--out-dir")
            .arg(&charts)
            .args(common),
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every stdout line is JSON"))
        .collect();
    let samples: Vec<&Value> = lines.iter().filter(|v| v["type"] == "sample").collect();
    let tput: Vec<&Value> = samples
        .iter()
        .copied()
        .filter(|v| v["metric"] == "throughput")
        .collect();
    // 2 modes × 2 block sizes, 2 or 3 samples each.
    assert!(
        (8..=12).contains(&tput.len()),
        "{} throughput rows",
        tput.len()
    );
    for v in &tput {
        assert_eq!(v["unit"], "bytes/s");
        assert!(v["value"].as_f64().unwrap() > 0.0);
        assert_eq!(v["config"]["target"], target.as_str());
        assert_eq!(v["config"]["size"], "4194304");
        assert_eq!(v["config_hash"].as_str().unwrap().len(), 16);
        for k in ["kernel", "cpu_model", "backing", "command_line", "vmscope"] {
            assert!(v["manifest"][k].is_string(), "manifest lacks {k}: {v}");
        }
        let raw: Value = serde_json::from_str(v["raw_output"].as_str().unwrap()).unwrap();
        assert_eq!(raw["bytes"], 4194304);
    }
    for m in ["wall_time", "bytes", "engine_cpu", "other_load"] {
        assert_eq!(
            samples.iter().filter(|v| v["metric"] == m).count(),
            tput.len(),
            "{m}"
        );
    }
    let per_gib: Vec<f64> = samples
        .iter()
        .filter(|v| v["metric"] == "host_cpu_per_gib")
        .map(|v| v["value"].as_f64().unwrap())
        .collect();
    assert_eq!(
        per_gib.len(),
        tput.len(),
        "the accountant ran around every sample"
    );
    assert!(per_gib.iter().all(|x| *x > 0.0), "{per_gib:?}");
    let summaries: Vec<&Value> = lines.iter().filter(|v| v["type"] == "summary").collect();
    assert_eq!(summaries.len(), 4);
    for s in &summaries {
        let n = s["n"].as_u64().unwrap();
        assert!((2..=3).contains(&n), "{s}");
        assert!(s["mean"].as_f64().unwrap() > 0.0 && s["cv"].is_number());
        assert!(s["ci95"].as_f64().unwrap() >= 0.0);
        assert!(s["host_cpu_per_gib"]["total"].as_f64().unwrap() > 0.0);
    }
    // Same configuration, same hash; different block size, different hash.
    let hash_of = |bs: &str, mode: &str| {
        tput.iter()
            .filter(|v| v["config"]["bs"] == bs && v["config"]["mode"] == mode)
            .map(|v| v["config_hash"].as_str().unwrap().to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(hash_of("65536", "direct-read").len(), 1);
    assert_ne!(
        hash_of("65536", "direct-read"),
        hash_of("1048576", "direct-read")
    );
    // Charts: one per mode, SVG and PNG.
    for m in ["buffered-write", "direct-read"] {
        let svg = std::fs::read_to_string(charts.join(format!("io-{m}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("host"), "{m}");
        let png = std::fs::read(charts.join(format!("io-{m}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
    // The session holds the same rows.
    let q = Command::new("sqlite3")
        .arg(&db)
        .arg("select count(*), count(distinct config_hash), min(unit) from bench_samples where metric = 'throughput'")
        .output();
    match q {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            assert_eq!(text.trim(), format!("{}|4|bytes/s", tput.len()), "{text}");
        }
        _ => eprintln!("SKIP: sqlite3 missing: session contents not checked"),
    }

    // The table: giacobbi's layout with both units labelled.
    let out = run_ok(bench(&["--target", &target, "--no-charts", "--no-account"]).args(common));
    let text = String::from_utf8_lossy(&out.stdout);
    for h in [
        "BS (B)",
        "Count",
        "Time (s)",
        "Speed (MiB/s)",
        "Speed (MB/s)",
        "CV (%) (n)",
    ] {
        assert!(text.contains(h), "no `{h}` in:\n{text}");
    }
    assert!(text.contains("64ki") && text.contains("1Mi"), "{text}");
    assert!(
        text.contains("MiB/s = 2^20 bytes/s, MB/s = 10^6 bytes/s"),
        "{text}"
    );

    // CSV: a header with units and config columns, one line per sample and metric.
    let out = run_ok(bench(&["--target", &target, "--no-charts", "--format", "csv"]).args(common));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.lines();
    let header = it.next().unwrap();
    assert!(
        header.starts_with("experiment,point,sample,metric,value,unit,config_hash,flagged,target,"),
        "{header}"
    );
    let rows: Vec<&str> = it.filter(|l| l.contains(",throughput,")).collect();
    assert!(rows.len() >= 8 && rows.iter().all(|l| l.contains(",bytes/s,")));
}

// ---------------------------------------------------------------- lab ----

/// `vmscope bench io` with the lab's directories.
fn bench_in(lab: &TestLab, args: &[&str]) -> Command {
    let mut c = lab.vmscope(&["bench", "io", "--quiet"]);
    c.args([
        "--cache-dir",
        lab.env.cache.to_str().unwrap(),
        "--run-dir",
        lab.env.run.to_str().unwrap(),
    ])
    .args(args);
    c
}

/// `files = [...]` entries putting GNU dd (as /usr/bin/gdd: busybox owns
/// `dd`) and fio with every library they load into the guest.
fn peer_files() -> Vec<String> {
    let mut libs = std::collections::BTreeSet::new();
    for bin in ["/usr/bin/fio", "/usr/bin/dd"] {
        let out = Command::new("ldd").arg(bin).output().unwrap();
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            let lib = match w.iter().position(|x| *x == "=>") {
                Some(i) => w.get(i + 1).copied(),
                None => w.first().copied(),
            };
            if let Some(p) = lib.filter(|p| p.starts_with('/')) {
                libs.insert(p.to_string());
            }
        }
    }
    let mut files = vec![
        "/usr/bin/fio:/usr/bin/fio".to_string(),
        "/usr/bin/dd:/usr/bin/gdd".to_string(),
    ];
    files.extend(libs.into_iter().map(|l| format!("{l}:{l}")));
    files
}

/// Issue 14 in a lab VM, one boot for everything: the engine against GNU
/// dd and fio inside the guest (item 6); a `bench io` sweep that reuses the
/// running lab, lists the LVM disk as unavailable, runs the accountant and
/// checks the paper's findings (items 2-5, 7); and a VM killed mid-sweep,
/// whose remaining points fail while the host's go on (item 9).
#[test]
fn lab_bench_io() {
    let _one = serial();
    let env = need_lab!(
        "lr",
        &[("fio", "fio"), ("dd", "coreutils"), ("ldd", "libc-bin")]
    );
    let lab = TestLab::new(env, "benchio-lab");
    let dir = tempfile::tempdir().unwrap();
    let files = peer_files()
        .iter()
        .map(|f| format!("\"{f}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let spec = dir.path().join("benchio-lab.toml");
    std::fs::write(
        &spec,
        format!(
            r#"name = "benchio-lab"
accel = "auto"

[[vm]]
name = "benchio-vm"
vcpus = 1
memory_mib = 512
iothreads = 1
files = [{files}]

[[vm.disk]]
backend = "file"
format = "raw"
size_mib = 448
cache = "none"
aio = "native"
iothread = 0

[[vm.disk]]
backend = "block"
size_mib = 64
cache = "none"
aio = "native"
iothread = 0

[[vm.disk]]
backend = "file"
format = "qcow2"
size_mib = 64
cache = "none"
aio = "native"
iothread = 0

[[vm.disk]]
backend = "lvm"
vg = "vmscope"
size_mib = 64
cache = "none"
aio = "native"
optional = true
"#
        ),
    )
    .unwrap();
    let st = lab.up(&spec);
    let vm = st.vm("benchio-vm").unwrap().clone();
    eprintln!("lab up: accel {} ({})", st.accel, st.accel_reason);

    // (1) Agreement inside the guest, on /dev/vda.
    let (mut client, _) =
        vmscope_lab::connect_agent(&vm, std::time::Duration::from_secs(20)).expect("agent");
    let mut exec = |argv: &[String]| -> Result<(String, String), String> {
        let o = client
            .exec(argv, std::time::Duration::from_secs(600))
            .map_err(|e| format!("exec {argv:?} in the guest: {e}"))?;
        if o.exit_code != 0 || o.timed_out {
            return Err(format!("{argv:?}: {}", String::from_utf8_lossy(&o.stderr)));
        }
        Ok((
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        ))
    };
    let tcg = st.accel != "kvm";
    // About a second per run at either block size under KVM (shorter runs
    // drown in the host's scheduling noise). Under TCG only a factor of 2
    // is held (below): 2 rounds of half a second each tell that (a wrong
    // byte count, unit or clock is off by far more).
    const SIZE: u64 = 384 << 20;
    let size_of = |bs: u64| {
        let full = if bs >= 1 << 20 { SIZE } else { 128 << 20 };
        if tcg {
            full / 2
        } else {
            full
        }
    };
    let rounds = if tcg { 2 } else { 5 };
    let fill = format!("size={SIZE}");
    exec(&["/usr/bin/vmscope-agent", "io", "fill", "/dev/vda", &fill].map(String::from)).unwrap();
    use vmscope_bench::peers::{self, IoTool};
    use vmscope_workload::io::Mode;
    // Under KVM the guest's CPU work costs what it costs on the host, and
    // the host's tolerance applies: 5 %, dd's writes printed but not held
    // to it (vmscope-bench's tests/agreement.rs says why). Under TCG every
    // instruction of the tools is emulated against the same virtual disk:
    // dd clearing its buffer for every block, fio's bookkeeping and the
    // engine's loop cost 10-50 times what they do natively, and the one
    // vCPU thread competes with everything else on the host. Measured on the
    // 2-CPU development VM, the three tools' medians spread 6-18 % at load
    // average 2 and up to 34 % at 5, from run to run in either direction;
    // there the figures are printed and only a factor of 2 is held (a wrong
    // byte count, unit or clock still fails it).
    let tolerance = |mode: Mode, peer: IoTool| match (peer == IoTool::Dd && mode.writes(), tcg) {
        (true, _) => f64::INFINITY,
        (false, false) => 0.05,
        (false, true) => 1.0,
    };
    let got = peers::agree(
        &[Mode::DirectRead, Mode::DirectWrite],
        &[64 << 10, 1 << 20],
        rounds,
        2,
        tolerance,
        |t, mode, bs| {
            let exe = match t {
                IoTool::Engine => "/usr/bin/vmscope-agent",
                IoTool::Dd => "/usr/bin/gdd",
                IoTool::Fio => "/usr/bin/fio",
            };
            if t == IoTool::Engine {
                let (o, e) = exec(&peers::argv(t, exe, mode, "/dev/vda", bs, size_of(bs) / bs))?;
                return peers::parse(t, mode, &o, &e);
            }
            peers::peer_speed(t, exe, mode, "/dev/vda", bs, size_of(bs) / bs, &mut exec)
        },
    )
    .unwrap();
    eprintln!("in the VM ({}):\n{}", st.accel, peers::AGREEMENT_HEADER);
    for a in &got {
        eprintln!("{}", a.row());
    }
    let bad: Vec<String> = got
        .iter()
        .filter(|a| !a.within)
        .map(|a| {
            format!(
                "{} {}: engine/dd {:.3}, engine/fio {:.3}",
                a.mode, a.bs, a.engine_dd, a.engine_fio
            )
        })
        .collect();
    drop(client);
    assert!(bad.is_empty(), "in the VM, beyond the tolerances: {bad:?}");

    // (2) A sweep over every disk of the running lab (reused, left up).
    let charts = dir.path().join("charts");
    let out = bench_in(
        &lab,
        &[
            "--lab",
            spec.to_str().unwrap(),
            "--bs",
            "4k,64k,1M",
            // 4 MiB: 1024 requests at 4 KiB, a quarter of a second under
            // TCG; the paper's findings are ratios of 5x and more.
            "--size",
            "4M",
            "--repeat",
            "2",
            "--max-repeat",
            "2",
            "--check-paper",
            "--format",
            "json",
            "--out-dir",
            charts.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench io --lab: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let of = |ty: &'static str| lines.iter().filter(move |v| v["type"] == ty);
    let labels: std::collections::BTreeSet<String> = of("sample")
        .map(|v| v["config"]["label"].as_str().unwrap().to_string())
        .collect();
    eprintln!("targets measured: {labels:?}");
    for l in [
        "host",
        "benchio-vm file-raw",
        "benchio-vm block",
        "benchio-vm file-qcow2",
    ] {
        assert!(labels.contains(l), "{l} missing from {labels:?}");
    }
    let unavailable: Vec<&Value> = of("unavailable").collect();
    assert_eq!(unavailable.len(), 1, "the LVM disk: {unavailable:?}");
    assert!(unavailable[0]["reason"].as_str().unwrap().len() > 10);
    // Every VM sample carries the host CPU split; at 4 KiB (1024 requests
    // per run) the VM's vCPUs did work beyond the cost of an empty run,
    // which is taken off every sample (at 1 MiB, 4 requests, it may not).
    let vm_cpu: Vec<f64> = of("sample")
        .filter(|v| {
            v["metric"] == "host_vcpu"
                && v["config"]["target"].as_str().unwrap().starts_with("vm:")
                && v["config"]["bs"] == "4096"
        })
        .map(|v| v["value"].as_f64().unwrap())
        .collect();
    assert!(!vm_cpu.is_empty());
    assert!(
        vm_cpu.iter().filter(|x| **x > 0.0).count() * 2 > vm_cpu.len(),
        "vCPU time in most 4 KiB VM samples: {vm_cpu:?}"
    );
    for v in of("sample").filter(|v| v["metric"] == "throughput") {
        let m = &v["manifest"];
        if v["config"]["target"].as_str().unwrap().starts_with("vm:") {
            for k in ["cache", "aio", "backing", "accel", "guest_kernel", "qemu"] {
                assert!(m[k].is_string(), "manifest lacks {k}: {m}");
            }
            assert_eq!(m["cache"], "none");
        }
    }
    let summaries: Vec<&Value> = of("summary").collect();
    assert_eq!(
        summaries.len(),
        4 * 3 * 3,
        "4 targets × 3 modes × 3 block sizes"
    );
    assert!(summaries
        .iter()
        .all(|s| s["failed"].is_null() && s["n"].as_u64().unwrap() >= 2));
    let checks: Vec<&Value> = of("check").collect();
    assert_eq!(checks.len(), 4);
    for c in &checks {
        eprintln!(
            "paper check: {} {}: {}",
            c["verdict"], c["claim"], c["detail"]
        );
        assert!(
            ["yes", "no"].contains(&c["verdict"].as_str().unwrap()),
            "{c}"
        );
    }
    for m in ["buffered-write", "direct-write", "direct-read"] {
        let png = std::fs::read(charts.join(format!("io-{m}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
    assert!(vmscope_lab::vm_running(&vm), "a reused lab is left up");

    // (3) The VM dies mid-sweep: its points fail, the host's go on.
    let host_img = dir.path().join("host.img");
    std::fs::File::create(&host_img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let mut child = bench_in(
        &lab,
        &[
            "--target",
            &format!("host:{}", host_img.display()),
            "--target",
            "vm:benchio-vm:/dev/vdb",
            "--bs",
            "64k",
            "--size",
            "4M",
            "--repeat",
            "5",
            "--max-repeat",
            "5",
            "--mode",
            "direct-read",
            "--no-charts",
            "--format",
            "json",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let reader = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut killed = false;
    let mut after = Vec::new();
    use std::io::BufRead;
    for line in reader.lines() {
        let line = line.unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        if !killed && v["type"] == "sample" && v["config"]["target"] == "vm:benchio-vm:/dev/vdb" {
            // SAFETY: kill has no memory preconditions; the pid is this
            // test's own QEMU.
            unsafe { libc::kill(vm.pid.unwrap() as i32, libc::SIGKILL) };
            killed = true;
        }
        after.push(v);
    }
    let status = child.wait().unwrap();
    assert!(killed, "no VM sample arrived");
    assert_eq!(status.code(), Some(1), "points failed: exit 1");
    let summary = |target: &str| {
        after
            .iter()
            .find(|v| v["type"] == "summary" && v["config"]["target"] == target)
            .cloned()
            .unwrap()
    };
    let v = summary("vm:benchio-vm:/dev/vdb");
    assert!(
        v["failed"].as_str().unwrap_or("").contains("stopped"),
        "{v}"
    );
    let h = summary(&format!("host:{}", host_img.display()));
    assert!(h["failed"].is_null(), "{h}");
    assert_eq!(h["n"], 5, "the host's points went on: {h}");
}

/// SIGTERM in the middle of a sweep stops it between samples: exit code
/// 128 + 15, one line saying it was interrupted, no session written (the
/// same stop tears down a lab the run brought up: the lab is dropped on
/// the way out).
#[test]
fn sigterm_stops_a_sweep_between_samples() {
    let _one = serial();
    if !is_root() {
        vmscope_testkit::skip("bench io drops caches before every sample: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = file_of(dir.path(), "host.img", 8 << 20, b"");
    let target = format!("host:{}", img.display());
    let db = dir.path().join("io.db");
    // Many small samples: a sweep that would run for minutes.
    let child = bench(&[
        "--target",
        &target,
        "--bs",
        "512..1M",
        "--size",
        "8M",
        "--repeat",
        "20",
        "-o",
        db.to_str().unwrap(),
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 15), "stderr: {err}");
    assert!(err.contains("interrupted by SIGTERM"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!db.exists(), "a session was written by an interrupted run");
}
