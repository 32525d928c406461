//! `bench/io-engine`: the I/O engine's throughput against GNU dd and
//! `fio --ioengine=psync` on the same host file, at 4 KiB and 1 MiB, direct
//! and buffered, in one run: interleaved rounds (each tool once per round,
//! shuffled), caches dropped before every run, the ratios of the tools'
//! median speeds (dd's writes timed without its reads of /dev/zero, see
//! `vmscope_bench::peers`). Target: within 3 %.
//!
//! usage: io_engine FILE [ROUNDS=7] [SIZE=512M]

use std::process::Command;
use vmscope_bench::peers::{self, IoTool};
use vmscope_bench::units::{iec, parse_size};
use vmscope_workload::io::{self, IoSpec, Mode};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(file) = args.first() else {
        eprintln!("usage: io_engine FILE [ROUNDS=7] [SIZE=512M]");
        std::process::exit(2);
    };
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    let size = args
        .get(2)
        .map(|s| parse_size(s).unwrap_or_else(|e| panic!("SIZE: {e}")))
        .unwrap_or(512 << 20);
    let path = std::path::Path::new(file);
    if !path.exists() {
        std::fs::File::create(path)
            .and_then(|f| f.set_len(size))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    io::fill(path, 0, size).unwrap_or_else(|e| panic!("{e}"));
    let dd = std::env::var("DD").unwrap_or_else(|_| "dd".into());
    let fio = std::env::var("FIO").unwrap_or_else(|_| "fio".into());
    println!(
        "# engine (in-process, as `bench io` runs it on the host) vs {dd} vs {fio} on {file}, \
         {} per run, {rounds} interleaved rounds, caches dropped before every run",
        iec(size)
    );
    let modes = [
        Mode::DirectRead,
        Mode::DirectWrite,
        Mode::BufferedRead,
        Mode::BufferedWrite,
    ];
    let got = peers::agree(
        &modes,
        &[4096, 1 << 20],
        rounds,
        1,
        |_, _| 0.03,
        |t, mode, bs| {
            io::drop_caches().map_err(|e| format!("drop caches (root?): {e}"))?;
            let count = size / bs;
            if t == IoTool::Engine {
                io::run(&IoSpec {
                    path: path.to_path_buf(),
                    mode,
                    block_size: bs,
                    count,
                    offset: 0,
                    create: false,
                })
                .map(|r| r.bytes_per_s())
                .map_err(|e| e.to_string())
            } else {
                let exe = if t == IoTool::Dd { &dd } else { &fio };
                peers::peer_speed(t, exe, mode, file, bs, count, &mut local)
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!("{} within 3 % |", peers::AGREEMENT_HEADER);
    println!("|---|---|---|---|---|---|---|---|---|");
    for a in &got {
        println!("{} {} |", a.row(), if a.within { "PASS" } else { "MISS" });
    }
    println!(
        "# {} of {} configurations outside 3 %",
        got.iter().filter(|a| !a.within).count(),
        got.len()
    );
}

/// Runs an argv here; its stdout and stderr.
fn local(argv: &[String]) -> Result<(String, String), String> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    if !out.status.success() {
        return Err(format!(
            "{argv:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
