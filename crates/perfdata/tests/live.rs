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
