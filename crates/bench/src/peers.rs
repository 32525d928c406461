//! The peers the I/O engine is compared with, side by side: GNU `dd` and
//! `fio --ioengine=psync`, driven exactly like the engine (same file,
//! offset 0, block size, byte count; O_DIRECT for the direct modes, a final
//! fdatasync inside the timing for buffered writes), and their outputs
//! parsed to bytes per second. Used by the agreement tests (host and lab
//! VM) and by `bench/io-engine`, so all three compare the same way:
//! interleaved rounds, one run of each tool per round in a shuffled order
//! (so drift in the host's load falls on all three alike), and the ratio
//! of the tools' median speeds. (The median of per-round ratios was tried
//! first: on this machine consecutive runs differ more than rounds drift,
//! and pairing them added noise instead of removing it.)
//!
//! fio is given byte counts (`--size=BYTES`, `--bs=BYTES`: its `k`/`M`
//! suffixes mean powers of 1000 or 1024 depending on `kb_base`, the
//! confusion giacobbi2011 §1.2 warns about), JSON output, and
//! `--invalidate=0` (its cache invalidation time counts in its bandwidth);
//! `--end_fsync=1` puts the final sync inside its run time, as dd's
//! `conv=fdatasync` does. Its per-I/O bookkeeping is kept to what dd and
//! the engine do: `--gtod_reduce=1` (no per-I/O latency clocks),
//! `--scramble_buffers=0` (no rewriting of the buffer before each write),
//! and `--clocksource=clock_gettime` (the clock dd and the engine time
//! with; its default TSC clock is calibrated at start, which a TCG guest
//! upsets). Its I/O is kept to what dd and the engine issue:
//! `--fadvise_hint=0` (by default fio tells the kernel
//! `POSIX_FADV_SEQUENTIAL` when it opens the file, which doubles the
//! file's readahead window for its buffered reads; dd and the engine
//! leave the default window) and `--zero_buffers=1` (by default fio writes
//! a random pattern; dd and the engine write zeros, which a host that
//! detects zero writes would store differently).
//!
//! GNU dd writing `if=/dev/zero` does two things per block: it reads a
//! block of zeros (the kernel clears the buffer), then writes it. The
//! engine and fio write a buffer zeroed once. On fast storage, and in a
//! TCG guest where clearing memory is emulated, the first half is not
//! small (a 1 MiB block: 0.7 ms to clear in the lab's guest, 0.7 ms to
//! write), so [`dd_write_speed`] times it with the same dd (`of=/dev/null`)
//! right after the write and compares the engine with the write alone.
//! That run also writes each block to /dev/null, one system call per
//! block more than the part it stands for, so dd's write speed comes out
//! a little high (about 0.3 µs per block here: 1 % of a 4 KiB direct
//! write). dd's reads (`of=/dev/null`) keep that write: at 4 KiB, where a
//! buffered read's own CPU is about half its time per block, it makes dd
//! 10-15 % slower than the engine (docs/experiments.md, "What the three do per
//! block").

use serde_json::Value;
use vmscope_workload::io::{IoRun, Mode};

/// One of the three tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoTool {
    Engine,
    Dd,
    Fio,
}

impl IoTool {
    pub const ALL: [IoTool; 3] = [IoTool::Engine, IoTool::Dd, IoTool::Fio];

    pub fn name(self) -> &'static str {
        match self {
            IoTool::Engine => "engine",
            IoTool::Dd => "dd",
            IoTool::Fio => "fio",
        }
    }
}

/// The command line of `tool` for one run: `count` blocks of `bs` bytes
/// at offset 0 of `path`. `exe` is the program (the engine is
/// `vmscope-agent`, run as `vmscope-agent io run ...`).
pub fn argv(tool: IoTool, exe: &str, mode: Mode, path: &str, bs: u64, count: u64) -> Vec<String> {
    let s = |x: &str| x.to_string();
    match tool {
        IoTool::Engine => vec![
            s(exe),
            s("io"),
            s("run"),
            s(path),
            format!("mode={}", mode.name()),
            format!("bs={bs}"),
            format!("count={count}"),
        ],
        IoTool::Dd => {
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
        IoTool::Fio => {
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
                s("--fadvise_hint=0"),
                s("--zero_buffers=1"),
                s("--gtod_reduce=1"),
                s("--scramble_buffers=0"),
                s("--clocksource=clock_gettime"),
                s("--output-format=json"),
            ];
            if mode.syncs() {
                v.push(s("--end_fsync=1"));
            }
            v
        }
    }
}

/// dd reading `count` blocks of zeros to /dev/null: the part of a
/// `dd if=/dev/zero of=FILE` run that is not the write.
pub fn dd_zero_argv(exe: &str, bs: u64, count: u64) -> Vec<String> {
    vec![
        exe.to_string(),
        "if=/dev/zero".into(),
        "of=/dev/null".into(),
        format!("bs={bs}"),
        format!("count={count}"),
    ]
}

/// The speed of dd's writes alone: `bytes` took `bytes / total` seconds in
/// all, of which `bytes / zeros` were reading /dev/zero (both in bytes/s).
pub fn dd_write_speed(bytes: f64, total: f64, zeros: f64) -> Result<f64, String> {
    let t = bytes / total - bytes / zeros;
    if t > 0.0 {
        Ok(bytes / t)
    } else {
        Err(format!(
            "dd's /dev/zero reads ({zeros:.0} bytes/s) took as long as its whole write run \
             ({total:.0} bytes/s)"
        ))
    }
}

/// Bytes per second from a tool's output (stdout for the engine and fio,
/// stderr for dd), or why it cannot be read.
pub fn parse(tool: IoTool, mode: Mode, stdout: &str, stderr: &str) -> Result<f64, String> {
    match tool {
        IoTool::Engine => {
            let r: IoRun = serde_json::from_str(stdout.trim())
                .map_err(|e| format!("engine output is not its JSON line ({e}): {stdout:.200}"))?;
            Ok(r.bytes_per_s())
        }
        IoTool::Dd => parse_dd(stderr),
        IoTool::Fio => parse_fio(stdout, mode),
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

/// One run of dd or fio through `exec` (which runs an argv, locally or in
/// a guest, and returns its stdout and stderr), as bytes/s; a dd write
/// also runs [`dd_zero_argv`] and reports [`dd_write_speed`].
pub fn peer_speed<E>(
    tool: IoTool,
    exe: &str,
    mode: Mode,
    path: &str,
    bs: u64,
    count: u64,
    exec: &mut E,
) -> Result<f64, String>
where
    E: FnMut(&[String]) -> Result<(String, String), String>,
{
    let (o, e) = exec(&argv(tool, exe, mode, path, bs, count))?;
    let speed = parse(tool, mode, &o, &e)?;
    if tool != IoTool::Dd || !mode.writes() {
        return Ok(speed);
    }
    let (zo, ze) = exec(&dd_zero_argv(exe, bs, count))?;
    let zeros = parse(IoTool::Dd, Mode::BufferedRead, &zo, &ze)?;
    dd_write_speed((bs * count) as f64, speed, zeros)
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
/// tool's speeds, one per round, in [`IoTool::ALL`] order.
pub fn rounds<F>(n: usize, seed: u64, mut run: F) -> Result<[Vec<f64>; 3], String>
where
    F: FnMut(IoTool) -> Result<f64, String>,
{
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out: [Vec<f64>; 3] = Default::default();
    for _ in 0..n {
        let mut order = IoTool::ALL;
        rng.shuffle(&mut order);
        for t in order {
            let i = IoTool::ALL.iter().position(|x| *x == t).unwrap_or(0);
            out[i].push(run(t)?);
        }
    }
    Ok(out)
}

/// One configuration's agreement: each tool's median speed (bytes/s), the
/// ratios of the engine's median to dd's and fio's, and the attempt that
/// produced them. The `dd/fio` column of [`Agreement::row`] says how well
/// the peers agree with each other.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Agreement {
    pub mode: Mode,
    pub bs: u64,
    pub medians: [f64; 3],
    pub engine_dd: f64,
    pub engine_fio: f64,
    pub attempt: usize,
    /// Paired rounds (one round's engine run against the same round's dd
    /// or fio run) beyond the tolerance band, on the side most of them
    /// are, out of `rounds`.
    pub beyond: [usize; 2],
    pub rounds: usize,
    /// Both ratios within their tolerance, or not shown to be outside it.
    pub within: bool,
}

impl Agreement {
    /// A Markdown table row (MiB/s).
    pub fn row(&self) -> String {
        let m = |x: f64| x / 1_048_576.0;
        format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} | {}/{} {}/{} | {} |",
            self.mode,
            crate::units::iec(self.bs),
            m(self.medians[0]),
            m(self.medians[1]),
            m(self.medians[2]),
            self.engine_dd,
            self.engine_fio,
            self.medians[1] / self.medians[2],
            self.beyond[0],
            self.rounds,
            self.beyond[1],
            self.rounds,
            self.attempt
        )
    }
}

/// The header matching [`Agreement::row`].
pub const AGREEMENT_HEADER: &str =
    "| mode | bs | engine MiB/s | dd MiB/s | fio MiB/s | engine/dd | engine/fio | dd/fio | rounds beyond (dd fio) | attempt |";

/// One-sided sign-test p-value: the chance of `k` or more of `n` fair coin
/// flips landing on one given side.
pub fn sign_p(k: usize, n: usize) -> f64 {
    let mut c = 1.0f64; // C(n, 0)
    let mut tail = 0.0;
    for i in 0..=n {
        if i >= k {
            tail += c;
        }
        c = c * (n - i) as f64 / (i + 1) as f64;
    }
    tail / 2f64.powi(n as i32)
}

/// Paired rounds beyond `[1/(1+tol), 1+tol]` on the side most are.
fn beyond_band(engine: &[f64], peer: &[f64], tol: f64) -> usize {
    let (mut lo, mut hi) = (0, 0);
    for (e, p) in engine.iter().zip(peer) {
        let r = e / p;
        if !r.is_finite() || r <= 0.0 {
            continue;
        }
        if r.ln() > tol.ln_1p() {
            hi += 1;
        } else if r.ln() < -tol.ln_1p() {
            lo += 1;
        }
    }
    lo.max(hi)
}

/// Significance below which paired rounds show the engine outside a
/// peer's band (one-sided sign test; with 7 rounds it takes all 7).
pub const SIGN_ALPHA: f64 = 0.01;

/// Measures every (mode, block size): `rounds` interleaved rounds of the
/// three tools through `run`; a configuration whose ratios fall outside a
/// factor `1 + tolerance(mode, peer)` either way (an infinite tolerance:
/// printed, not held) is measured again from scratch, up to
/// `attempts` times (a real difference stays, a burst of load from
/// elsewhere does not), and the last attempt is kept. With 7 rounds or
/// more, a configuration whose medians differ but whose paired rounds do
/// not show the engine outside a peer's band (sign test, [`SIGN_ALPHA`])
/// passes: it is printed with the count of rounds beyond.
pub fn agree<F>(
    modes: &[Mode],
    block_sizes: &[u64],
    rounds_per_attempt: usize,
    attempts: usize,
    tolerance: impl Fn(Mode, IoTool) -> f64,
    mut run: F,
) -> Result<Vec<Agreement>, String>
where
    F: FnMut(IoTool, Mode, u64) -> Result<f64, String>,
{
    let mut out = Vec::new();
    for &mode in modes {
        for &bs in block_sizes {
            for attempt in 1..=attempts.max(1) {
                let seed = bs ^ ((mode as u64) << 32) ^ attempt as u64;
                let r = rounds(rounds_per_attempt, seed, |t| run(t, mode, bs))?;
                let a = Agreement {
                    mode,
                    bs,
                    medians: [
                        crate::stats::median(&r[0]),
                        crate::stats::median(&r[1]),
                        crate::stats::median(&r[2]),
                    ],
                    engine_dd: crate::stats::median(&r[0]) / crate::stats::median(&r[1]),
                    engine_fio: crate::stats::median(&r[0]) / crate::stats::median(&r[2]),
                    attempt,
                    beyond: [0, 0],
                    rounds: r[0].len(),
                    within: false,
                };
                // Within a factor (1 + tolerance) of each held peer either
                // way; or, when the two peers are further apart than that
                // themselves, between them (with the tightest held margin):
                // the engine agrees with them as well as they agree
                // together. A peer that is not held to a tolerance (dd's
                // writes) still bounds the range: its reading is
                // independent of the engine's, only biased.
                let ok = |r: f64, tol: f64| r.is_finite() && r > 0.0 && r.ln().abs() <= tol.ln_1p();
                let (td, tf) = (tolerance(mode, IoTool::Dd), tolerance(mode, IoTool::Fio));
                let strict = ok(a.engine_dd, td) && ok(a.engine_fio, tf);
                let tol = td.min(tf);
                let between = tol.is_finite() && {
                    let (d, f) = (a.medians[1], a.medians[2]);
                    let (lo, hi) = (d.min(f), d.max(f));
                    lo > 0.0
                        && hi / lo > 1.0 + tol
                        && a.medians[0] >= lo / (1.0 + tol)
                        && a.medians[0] <= hi * (1.0 + tol)
                };
                // Or not shown to be outside: load from elsewhere can move
                // one tool's median (each pass is short, each tool's runs
                // are a few), but it does not put the engine past the
                // same side of a peer's band in every round, paired in
                // time, unless the difference is real. A peer not held
                // (infinite tolerance) never shows anything.
                let beyond = [
                    if td.is_finite() {
                        beyond_band(&r[0], &r[1], td)
                    } else {
                        0
                    },
                    if tf.is_finite() {
                        beyond_band(&r[0], &r[2], tf)
                    } else {
                        0
                    },
                ];
                // With too few rounds to show anything at SIGN_ALPHA (under
                // 7), the medians decide alone.
                let can_show = sign_p(a.rounds, a.rounds) <= SIGN_ALPHA;
                let shown = beyond.iter().any(|&k| sign_p(k, a.rounds) <= SIGN_ALPHA);
                let within = strict || between || (can_show && !shown);
                let a = Agreement { beyond, ..a };
                let done = within || attempt >= attempts.max(1);
                if done {
                    out.push(Agreement { within, ..a });
                    break;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        let dd = argv(IoTool::Dd, "dd", Mode::DirectRead, "/f", 65536, 16);
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
        let dd = argv(IoTool::Dd, "dd", Mode::BufferedWrite, "/f", 4096, 2);
        assert!(dd.contains(&"conv=notrunc,fdatasync".to_string()) && dd[1] == "if=/dev/zero");
        let fio = argv(IoTool::Fio, "fio", Mode::DirectWrite, "/f", 1 << 20, 4);
        for a in [
            "--rw=write",
            "--bs=1048576",
            "--size=4194304",
            "--direct=1",
            "--ioengine=psync",
            "--output-format=json",
            "--fadvise_hint=0",
            "--zero_buffers=1",
        ] {
            assert!(fio.contains(&a.to_string()), "{a} in {fio:?}");
        }
        let fio = argv(IoTool::Fio, "fio", Mode::BufferedWrite, "/f", 4096, 4);
        assert!(
            fio.contains(&"--end_fsync=1".to_string()) && fio.contains(&"--direct=0".to_string())
        );
        let e = argv(
            IoTool::Engine,
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
            parse(IoTool::Engine, Mode::DirectRead, e, "").unwrap(),
            16384.0
        );
        assert!((median_ratio(&[2.0, 3.0, 10.0], &[1.0, 3.0, 1.0]) - 2.0).abs() < 1e-12);
        // 1 GB in 2 s, of which 0.5 s reading zeros: the write took 1.5 s.
        let w = dd_write_speed(1e9, 5e8, 2e9).unwrap();
        assert!((w - 1e9 / 1.5).abs() < 1e-3);
        assert!(dd_write_speed(1e9, 5e8, 4e8).is_err());
        assert_eq!(
            dd_zero_argv("dd", 4096, 2)[1..3],
            ["if=/dev/zero", "of=/dev/null"]
        );
    }

    #[test]
    fn rounds_run_every_tool_each_round() {
        let mut calls = Vec::new();
        let r = rounds(4, 3, |t| {
            calls.push(t);
            Ok(match t {
                IoTool::Engine => 1.0,
                IoTool::Dd => 2.0,
                IoTool::Fio => 3.0,
            })
        })
        .unwrap();
        assert_eq!(r[0], vec![1.0; 4]);
        assert_eq!(r[2], vec![3.0; 4]);
        assert_eq!(calls.len(), 12);
        assert!(calls.chunks(3).any(|c| c[0] != IoTool::Engine), "{calls:?}");
        assert!(rounds(1, 1, |_| Err("boom".into())).is_err());
    }

    #[test]
    fn agreement_retries_then_keeps_the_last_attempt() {
        // The engine is 10 % faster than dd on the first attempt only.
        let mut calls = 0;
        let a = agree(
            &[Mode::DirectRead],
            &[4096],
            3,
            2,
            |_, _| 0.05,
            |t, _, _| {
                calls += 1;
                Ok(match (t, calls <= 9) {
                    (IoTool::Engine, true) => 110.0,
                    _ => 100.0,
                })
            },
        )
        .unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].attempt, a[0].within), (2, true));
        assert!((a[0].engine_dd - 1.0).abs() < 1e-12);
        // A lasting difference fails every attempt.
        let a = agree(
            &[Mode::DirectWrite],
            &[4096, 8192],
            3,
            3,
            |_, _| 0.05,
            |t, _, _| Ok(if t == IoTool::Engine { 130.0 } else { 100.0 }),
        )
        .unwrap();
        assert_eq!(a.len(), 2);
        assert!(a
            .iter()
            .all(|x| !x.within && x.attempt == 3 && (x.engine_dd - 1.3).abs() < 1e-9));
        assert!(a[0].row().starts_with("| direct-write | 4 KiB |"));
        // Peers 30 % apart: an engine between them agrees as well as they do.
        let a = agree(
            &[Mode::DirectRead],
            &[4096],
            3,
            1,
            |_, _| 0.05,
            |t, _, _| {
                Ok(match t {
                    IoTool::Engine => 115.0,
                    IoTool::Dd => 100.0,
                    IoTool::Fio => 130.0,
                })
            },
        )
        .unwrap();
        assert!(a[0].within, "{a:?}");
        let a = agree(
            &[Mode::DirectRead],
            &[4096],
            3,
            1,
            |_, _| 0.05,
            |t, _, _| {
                Ok(match t {
                    IoTool::Engine => 150.0,
                    IoTool::Dd => 100.0,
                    IoTool::Fio => 130.0,
                })
            },
        )
        .unwrap();
        assert!(!a[0].within, "{a:?}");
        // A peer not held to a tolerance (dd's writes) still bounds the
        // range; outside it the engine fails.
        let dd_free = |m: Mode, t: IoTool| {
            if t == IoTool::Dd && m.writes() {
                f64::INFINITY
            } else {
                0.05
            }
        };
        // Seven paired rounds: load that moves the medians apart but puts
        // the engine on both sides of fio's band is not a difference
        // shown; an engine past the same side in every round is.
        let noisy = [
            (80.0, 100.0),
            (100.0, 80.0),
            (85.0, 100.0),
            (90.0, 100.0),
            (100.0, 85.0),
            (88.0, 100.0),
            (100.0, 100.0),
        ];
        let mut i = 0;
        let a = agree(
            &[Mode::DirectRead],
            &[4096],
            7,
            1,
            |_, _| 0.05,
            |t, _, _| {
                let (e, f) = noisy[(i / 3) % 7];
                i += 1;
                Ok(if t == IoTool::Engine { e } else { f })
            },
        )
        .unwrap();
        assert!(a[0].engine_fio < 0.95 && a[0].within, "{a:?}");
        assert_eq!(a[0].beyond, [4, 4], "{a:?}");
        let a = agree(
            &[Mode::DirectRead],
            &[4096],
            7,
            1,
            |_, _| 0.05,
            |t, _, _| Ok(if t == IoTool::Engine { 88.0 } else { 100.0 }),
        )
        .unwrap();
        assert!(!a[0].within && a[0].beyond == [7, 7], "{a:?}");
        assert!((sign_p(7, 7) - 1.0 / 128.0).abs() < 1e-12 && (sign_p(0, 3) - 1.0).abs() < 1e-12);
        assert!((sign_p(6, 7) - 8.0 / 128.0).abs() < 1e-12);
        for (engine, ok) in [(115.0, true), (60.0, false), (150.0, false)] {
            let a = agree(&[Mode::DirectWrite], &[4096], 3, 1, dd_free, |t, _, _| {
                Ok(match t {
                    IoTool::Engine => engine,
                    IoTool::Dd => 80.0,
                    IoTool::Fio => 130.0,
                })
            })
            .unwrap();
            assert_eq!(a[0].within, ok, "engine {engine}: {a:?}");
        }
    }
}
