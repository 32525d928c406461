//! The peers the I/O engine is compared with, side by side: GNU `dd` and
//! `fio --ioengine=psync`, driven exactly like the engine (same file,
//! offset 0, block size, byte count; O_DIRECT for the direct modes, a final
//! fdatasync inside the timing for buffered writes), and their outputs
//! parsed to bytes per second. Used by the agreement tests (host and lab
//! VM) and by `bench/io-engine`, so all three compare the same way:
//! interleaved rounds, one run of each tool per round in a shuffled order,
//! and the median of the per-round ratios (runs of one round are close in
//! time, so drift in the host cancels).
//!
//! fio is given byte counts (`--size=BYTES`, `--bs=BYTES`: its `k`/`M`
//! suffixes mean powers of 1000 or 1024 depending on `kb_base`, the
//! confusion giacobbi2011 §1.2 warns about), JSON output, and
//! `--invalidate=0` (its cache invalidation time counts in its bandwidth);
//! `--end_fsync=1` puts the final sync inside its run time, as dd's
//! `conv=fdatasync` does.

use serde_json::Value;
use vmscope_workload::io::{IoRun, Mode};

/// One of the three tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Engine,
    Dd,
    Fio,
}

impl Tool {
    pub const ALL: [Tool; 3] = [Tool::Engine, Tool::Dd, Tool::Fio];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Engine => "engine",
            Tool::Dd => "dd",
            Tool::Fio => "fio",
        }
    }
}

/// The command line of `tool` for one run: `count` blocks of `bs` bytes
/// at offset 0 of `path`. `exe` is the program (the engine is
/// `vmscope-agent`, run as `vmscope-agent io run ...`).
pub fn argv(tool: Tool, exe: &str, mode: Mode, path: &str, bs: u64, count: u64) -> Vec<String> {
    let s = |x: &str| x.to_string();
    match tool {
        Tool::Engine => vec![
            s(exe),
            s("io"),
            s("run"),
            s(path),
            format!("mode={}", mode.name()),
            format!("bs={bs}"),
            format!("count={count}"),
        ],
        Tool::Dd => {
            let mut v = vec![s(exe)];
            if mode.writes() {
                v.extend([s("if=/dev/zero"), format!("of={path}")]);
            } else {
                v.extend([format!("if={path}"), s("of=/dev/null")]);
            }
            v.extend([format!("bs={bs}"), format!("count={count}")]);
            match mode {
                Mode::DirectRead => v.push(s("iflag=direct")),
                Mode::DirectWrite => v.extend([s("oflag=direct"), s("conv=notrunc")]),
                Mode::BufferedWrite => v.push(s("conv=notrunc,fdatasync")),
                Mode::BufferedWriteNosync => v.push(s("conv=notrunc")),
                Mode::BufferedRead => {}
            }
            v
        }
        Tool::Fio => {
            let mut v = vec![
                s(exe),
                s("--name=vmscope"),
                format!("--filename={path}"),
                format!("--rw={}", if mode.writes() { "write" } else { "read" }),
                format!("--bs={bs}"),
                format!("--size={}", bs * count),
                s("--ioengine=psync"),
                s("--numjobs=1"),
                format!("--direct={}", u8::from(mode.direct())),
                s("--invalidate=0"),
                s("--fallocate=none"),
                s("--output-format=json"),
            ];
            if mode.syncs() {
                v.push(s("--end_fsync=1"));
            }
            v
        }
    }
}

/// Bytes per second from a tool's output (stdout for the engine and fio,
/// stderr for dd), or why it cannot be read.
pub fn parse(tool: Tool, mode: Mode, stdout: &str, stderr: &str) -> Result<f64, String> {
    match tool {
        Tool::Engine => {
            let r: IoRun = serde_json::from_str(stdout.trim())
                .map_err(|e| format!("engine output is not its JSON line ({e}): {stdout:.200}"))?;
            Ok(r.bytes_per_s())
        }
        Tool::Dd => parse_dd(stderr),
        Tool::Fio => parse_fio(stdout, mode),
    }
}

/// GNU dd's last line: `N bytes (…) copied, T s, …`.
pub fn parse_dd(stderr: &str) -> Result<f64, String> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains(" bytes") && l.contains("copied"))
        .ok_or_else(|| format!("no `bytes ... copied` line in dd's output: {stderr:.200}"))?;
    let bytes: f64 = line
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| format!("no byte count in `{line}`"))?;
    let secs: f64 = line
        .split(',')
        .find_map(|part| {
            let p = part.trim();
            p.strip_suffix(" s").and_then(|n| n.trim().parse().ok())
        })
        .ok_or_else(|| format!("no seconds in `{line}`"))?;
    if secs <= 0.0 {
        return Err(format!("dd reports {secs} s: `{line}`"));
    }
    Ok(bytes / secs)
}

/// fio's JSON: the first job's `read` or `write` `bw_bytes`.
pub fn parse_fio(stdout: &str, mode: Mode) -> Result<f64, String> {
    // fio may print notes before the JSON object.
    let start = stdout
        .find('{')
        .ok_or_else(|| format!("no JSON in fio's output: {stdout:.200}"))?;
    let v: Value = serde_json::from_str(&stdout[start..])
        .map_err(|e| format!("fio's JSON does not parse ({e})"))?;
    let dir = if mode.writes() { "write" } else { "read" };
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        return Err(format!("fio reports error {}", job["error"]));
    }
    job[dir]["bw_bytes"]
        .as_f64()
        .filter(|b| *b > 0.0)
        .ok_or_else(|| format!("no {dir}.bw_bytes in fio's JSON"))
}

/// The median of `a[i] / b[i]` over rounds where both are positive.
pub fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let r: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| **x > 0.0 && **y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    crate::stats::median(&r)
}

/// Runs interleaved rounds: each round runs every tool once, in an order
/// shuffled by `seed`, through `run` (which returns bytes/s). Returns each
/// tool's speeds, one per round, in [`Tool::ALL`] order.
pub fn rounds<F>(n: usize, seed: u64, mut run: F) -> Result<[Vec<f64>; 3], String>
where
    F: FnMut(Tool) -> Result<f64, String>,
{
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out: [Vec<f64>; 3] = Default::default();
    for _ in 0..n {
        let mut order = Tool::ALL;
        rng.shuffle(&mut order);
        for t in order {
            let i = Tool::ALL.iter().position(|x| *x == t).unwrap_or(0);
            out[i].push(run(t)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        let dd = argv(Tool::Dd, "dd", Mode::DirectRead, "/f", 65536, 16);
        assert_eq!(
            dd,
            [
                "dd",
                "if=/f",
                "of=/dev/null",
                "bs=65536",
                "count=16",
                "iflag=direct"
            ]
        );
        let dd = argv(Tool::Dd, "dd", Mode::BufferedWrite, "/f", 4096, 2);
        assert!(dd.contains(&"conv=notrunc,fdatasync".to_string()) && dd[1] == "if=/dev/zero");
        let fio = argv(Tool::Fio, "fio", Mode::DirectWrite, "/f", 1 << 20, 4);
        for a in [
            "--rw=write",
            "--bs=1048576",
            "--size=4194304",
            "--direct=1",
            "--ioengine=psync",
            "--output-format=json",
        ] {
            assert!(fio.contains(&a.to_string()), "{a} in {fio:?}");
        }
        let fio = argv(Tool::Fio, "fio", Mode::BufferedWrite, "/f", 4096, 4);
        assert!(
            fio.contains(&"--end_fsync=1".to_string()) && fio.contains(&"--direct=0".to_string())
        );
        let e = argv(
            Tool::Engine,
            "/usr/bin/vmscope-agent",
            Mode::DirectRead,
            "/dev/vda",
            4096,
            8,
        );
        assert_eq!(e[1..3], ["io", "run"]);
        assert!(e.contains(&"mode=direct-read".to_string()));
    }

    #[test]
    fn outputs() {
        let dd = "16+0 records in\n16+0 records out\n1048576 bytes (1.0 MB, 1.0 MiB) copied, 0.5 s, 2.1 MB/s\n";
        assert_eq!(parse_dd(dd).unwrap(), 2_097_152.0);
        assert!(parse_dd("dd: error").is_err());
        let fio = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs": [{"error": 0, "read": {"bw_bytes": 1000, "io_bytes": 5}, "write": {"bw_bytes": 0}}]}"#;
        assert_eq!(parse_fio(fio, Mode::DirectRead).unwrap(), 1000.0);
        assert!(parse_fio(fio, Mode::DirectWrite).is_err());
        let e = r#"{"path":"/f","mode":"direct-read","block_size":4096,"offset":0,"blocks":2,"partial":0,"bytes":8192,"wall_s":0.5,"sync_s":0.0,"user_s":0.0,"sys_s":0.0}"#;
        assert_eq!(
            parse(Tool::Engine, Mode::DirectRead, e, "").unwrap(),
            16384.0
        );
        assert!((median_ratio(&[2.0, 3.0, 10.0], &[1.0, 3.0, 1.0]) - 2.0).abs() < 1e-12);
    }

    #[test]
    fn rounds_run_every_tool_each_round() {
        let mut calls = Vec::new();
        let r = rounds(4, 3, |t| {
            calls.push(t);
            Ok(match t {
                Tool::Engine => 1.0,
                Tool::Dd => 2.0,
                Tool::Fio => 3.0,
            })
        })
        .unwrap();
        assert_eq!(r[0], vec![1.0; 4]);
        assert_eq!(r[2], vec![3.0; 4]);
        assert_eq!(calls.len(), 12);
        assert!(calls.chunks(3).any(|c| c[0] != Tool::Engine), "{calls:?}");
        assert!(rounds(1, 1, |_| Err("boom".into())).is_err());
    }
}
