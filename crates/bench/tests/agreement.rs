//! Issue 14 item 6, on the host: the engine `bench io` runs in-process
//! (`vmscope_workload::io`) agrees with GNU dd and with
//! `fio --ioengine=psync` on the same file and block size, within 5 % at
//! 64 KiB and 1 MiB, O_DIRECT read and write. Rounds interleave the three
//! tools in a shuffled order; the verdict is the median of the per-round
//! ratios (the runs of a round are seconds apart, so load from elsewhere
//! shifts all three alike). The file lives under /var/tmp, on disk.
//! The lab test `lab_bench_io` (vmscope-cli) does the same in a VM.

use std::process::Command;
use vmscope_bench::peers::{self, Tool};
use vmscope_workload::io::{self, IoSpec, Mode};

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool} >/dev/null 2>&1"))
        .status()
        .is_ok_and(|s| s.success())
}

const SIZE: u64 = 256 << 20;
const ROUNDS: usize = 7;

fn speed(tool: Tool, mode: Mode, path: &str, bs: u64) -> Result<f64, String> {
    let count = SIZE / bs;
    match tool {
        Tool::Engine => io::run(&IoSpec {
            path: path.into(),
            mode,
            block_size: bs,
            count,
            offset: 0,
            create: false,
        })
        .map(|r| r.bytes_per_s())
        .map_err(|e| e.to_string()),
        _ => {
            let exe = if tool == Tool::Dd { "dd" } else { "fio" };
            let argv = peers::argv(tool, exe, mode, path, bs, count);
            let out = Command::new(&argv[0])
                .args(&argv[1..])
                .output()
                .map_err(|e| format!("{exe}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "{argv:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            peers::parse(
                tool,
                mode,
                &String::from_utf8_lossy(&out.stdout),
                &String::from_utf8_lossy(&out.stderr),
            )
        }
    }
}

#[test]
fn engine_agrees_with_dd_and_fio_on_the_host() {
    for t in ["dd", "fio"] {
        if !have(t) {
            eprintln!(
                "SKIP: {t} is not installed (scripts/setup.sh installs fio; dd is coreutils)"
            );
            return;
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("vmscope-agreement")
        .tempdir_in("/var/tmp")
        .unwrap();
    let file = dir.path().join("target.img");
    std::fs::File::create(&file).unwrap().set_len(SIZE).unwrap();
    io::fill(&file, 0, SIZE).unwrap();
    let path = file.to_str().unwrap();
    let mut failures = Vec::new();
    eprintln!("| mode | bs | engine MiB/s | dd MiB/s | fio MiB/s | engine/dd | engine/fio |");
    for mode in [Mode::DirectRead, Mode::DirectWrite] {
        for bs in [64u64 << 10, 1 << 20] {
            let r = peers::rounds(ROUNDS, bs ^ mode as u64, |t| speed(t, mode, path, bs)).unwrap();
            let med = |v: &[f64]| vmscope_bench::stats::median(v) / 1048576.0;
            let (ed, ef) = (
                peers::median_ratio(&r[0], &r[1]),
                peers::median_ratio(&r[0], &r[2]),
            );
            eprintln!(
                "| {mode} | {bs} | {:.1} | {:.1} | {:.1} | {ed:.3} | {ef:.3} |",
                med(&r[0]),
                med(&r[1]),
                med(&r[2])
            );
            for (peer, ratio) in [("dd", ed), ("fio", ef)] {
                if (ratio - 1.0).abs() > 0.05 {
                    failures.push(format!("{mode} bs {bs}: engine/{peer} = {ratio:.3}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "beyond 5 %: {failures:?}");
}
