//! Import of a perf.data recorded now by the real `perf record`, compared
//! with what `perf report` reads from the same file. Skips (with a message)
//! where perf is missing or may not record.

use std::path::Path;
use std::process::Command;
use vmscope_model::Record;

const PERF: &str = "/usr/bin/perf";
const LOOP: &str = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";

fn record(out: &Path) -> bool {
    if !Path::new(PERF).exists() {
        eprintln!("skipping: {PERF} not installed");
        return false;
    }
    let st = Command::new(PERF)
        .args(["record", "-q", "-F", "999", "-g", "-o"])
        .arg(out)
        .args(["--", "/bin/sh", "-c", LOOP])
        .output()
        .expect("run perf record");
    if !st.status.success() {
        eprintln!(
            "skipping: perf record failed: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        return false;
    }
    true
}

/// Samples perf itself reads from the file: the sum of the Samples column of
/// `perf report --stdio -n --sort comm`.
fn perf_sample_count(file: &Path) -> u64 {
    let out = Command::new(PERF)
        .args([
            "report",
            "--stdio",
            "--no-children",
            "-n",
            "--sort",
            "comm",
            "-g",
            "none",
            "-i",
        ])
        .arg(file)
        .output()
        .expect("run perf report");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            it.next()?.strip_suffix('%')?;
            it.next()?.parse::<u64>().ok()
        })
        .sum()
}

#[test]
fn imports_a_fresh_recording_like_perf_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("perf.data");
    if !record(&file) {
        return;
    }
    let shell = std::fs::canonicalize("/bin/sh").unwrap();
    let shell = shell.to_string_lossy().into_owned();
    let mut samples = Vec::new();
    let mut shell_maps = Vec::new();
    let mut exec_comm = false;
    let info = vmscope_perfdata::import(&file, &mut |r| match r {
        Record::Sample(s) => samples.push(s),
        Record::Mmap {
            path, executable, ..
        } if *path == *shell => shell_maps.push(executable),
        Record::Comm { comm, exec, .. } if &*comm == "sh" => exec_comm |= exec,
        _ => {}
    })
    .unwrap();
    let perf_count = perf_sample_count(&file);
    assert!(perf_count > 50, "perf report saw {perf_count} samples");
    assert_eq!(info.samples, perf_count);
    assert_eq!(samples.len() as u64, perf_count);
    assert!(
        samples.iter().all(|s| !s.callchain.is_empty()),
        "every -g sample has a call chain"
    );
    assert!(
        shell_maps.iter().any(|&x| x),
        "an executable mapping of {shell} appears"
    );
    assert!(exec_comm, "the exec of sh is a COMM with exec set");
    assert_eq!(info.events.len(), 1);
    assert!(info.perf_version.is_some() && info.hostname.is_some());
    let cmd = info.cmdline.unwrap_or_default();
    assert!(cmd.iter().any(|a| a == "record"), "{cmd:?}");
    let (first, last) = (info.first_time.unwrap(), info.last_time.unwrap());
    assert!(samples.windows(2).all(|w| w[0].time <= w[1].time));
    assert_eq!(
        (samples[0].time, samples.last().unwrap().time),
        (first, last)
    );
}

#[test]
fn imports_the_piped_format() {
    if !Path::new(PERF).exists() {
        eprintln!("skipping: {PERF} not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipe.data");
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "{PERF} record -q -F 999 -g -o - -- /bin/sh -c '{LOOP}' > {}",
            file.display()
        ))
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!("skipping: piped perf record failed");
        return;
    }
    let mut n = 0u64;
    let info = vmscope_perfdata::import(&file, &mut |r| {
        if matches!(r, Record::Sample(_)) {
            n += 1;
        }
    })
    .unwrap();
    assert_eq!(n, info.samples);
    assert_eq!(n, perf_sample_count(&file));
    assert!(n > 50);
}

/// Samples per event name, as `perf script -F event` prints them.
fn perf_samples_by_event(file: &Path) -> std::collections::BTreeMap<String, u64> {
    let out = Command::new(PERF)
        .args(["script", "-F", "event", "-i"])
        .arg(file)
        .output()
        .expect("run perf script");
    assert!(out.status.success());
    let mut m = std::collections::BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(name) = l.trim().strip_suffix(':') {
            *m.entry(name.to_string()).or_insert(0) += 1;
        }
    }
    m
}

#[test]
fn two_events_are_told_apart_by_sample_id() {
    if !Path::new(PERF).exists() {
        eprintln!("skipping: {PERF} not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two.data");
    let st = Command::new(PERF)
        .args(["record", "-q", "-e", "cpu-clock", "-e", "task-clock"])
        .args(["-F", "999", "-g", "-o"])
        .arg(&file)
        .args(["--", "/bin/sh", "-c", LOOP])
        .output()
        .unwrap();
    if !st.status.success() {
        eprintln!("skipping: perf record failed");
        return;
    }
    let mut by_index = [0u64; 2];
    let info = vmscope_perfdata::import(&file, &mut |r| {
        if let Record::Sample(s) = r {
            by_index[s.event as usize] += 1;
        }
    })
    .unwrap();
    let names: Vec<&str> = info.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["cpu-clock", "task-clock"]);
    let perf = perf_samples_by_event(&file);
    assert_eq!(perf.get("cpu-clock"), Some(&by_index[0]));
    assert_eq!(perf.get("task-clock"), Some(&by_index[1]));
    assert!(by_index[0] > 20 && by_index[1] > 20, "{by_index:?}");
}

/// Throughput on a system-wide recording (`-a -g -F 4000`, 10 s, busy
/// loops on every CPU). Prints figures; asserts only that the sample count
/// equals perf's. Run with `cargo test --release -p vmscope-perfdata --test
/// live -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput_on_a_system_wide_recording() {
    if !Path::new(PERF).exists() {
        eprintln!("skipping: {PERF} not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wide.data");
    let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let busy: Vec<_> = (0..cpus)
        .map(|_| {
            Command::new("timeout")
                .args(["12", "/bin/sh", "-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    let st = Command::new(PERF)
        .args(["record", "-q", "-a", "-g", "-F", "4000", "-o"])
        .arg(&file)
        .args(["--", "sleep", "10"])
        .status()
        .unwrap();
    for mut b in busy {
        let _ = b.wait();
    }
    if !st.success() {
        eprintln!("skipping: perf record -a failed");
        return;
    }
    let bytes = std::fs::metadata(&file).unwrap().len();
    let mut records = 0u64;
    let start = std::time::Instant::now();
    let info = vmscope_perfdata::import(&file, &mut |_| records += 1).unwrap();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{bytes} bytes, {records} records, {} samples, {} lost: {secs:.3} s, {:.0} records/s",
        info.samples,
        info.lost,
        records as f64 / secs
    );
    assert_eq!(info.samples, perf_sample_count(&file));
}
