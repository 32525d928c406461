//! `bench/io-engine`: the I/O engine's throughput against GNU dd and
//! `fio --ioengine=psync` on the same host file, at 4 KiB and 1 MiB, direct
//! and buffered, in one run: interleaved rounds (each tool once per round,
//! shuffled), caches dropped before every run, the median of the per-round
//! ratios. Target: within 3 %.
//!
//! usage: io_engine FILE [ROUNDS=7] [SIZE=512M]

use std::process::Command;
use vmscope_bench::peers::{self, Tool};
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
    println!(
        "| mode | bs | engine MiB/s | dd MiB/s | fio MiB/s | engine/dd | engine/fio | within 3 % |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut misses = 0;
    for mode in [
        Mode::DirectRead,
        Mode::DirectWrite,
        Mode::BufferedRead,
        Mode::BufferedWrite,
    ] {
        for bs in [4096u64, 1 << 20] {
            let count = size / bs;
            let r = peers::rounds(rounds, bs ^ mode as u64, |t| {
                io::drop_caches().map_err(|e| format!("drop caches (root?): {e}"))?;
                match t {
                    Tool::Engine => io::run(&IoSpec {
                        path: path.to_path_buf(),
                        mode,
                        block_size: bs,
                        count,
                        offset: 0,
                        create: false,
                    })
                    .map(|r| r.bytes_per_s())
                    .map_err(|e| e.to_string()),
                    _ => {
                        let exe = if t == Tool::Dd { &dd } else { &fio };
                        let argv = peers::argv(t, exe, mode, file, bs, count);
                        let out = Command::new(&argv[0])
                            .args(&argv[1..])
                            .output()
                            .map_err(|e| format!("{exe}: {e}"))?;
                        peers::parse(
                            t,
                            mode,
                            &String::from_utf8_lossy(&out.stdout),
                            &String::from_utf8_lossy(&out.stderr),
                        )
                    }
                }
            })
            .unwrap_or_else(|e| panic!("{mode} bs {bs}: {e}"));
            let med = |v: &[f64]| vmscope_bench::stats::median(v) / 1048576.0;
            let (ed, ef) = (
                peers::median_ratio(&r[0], &r[1]),
                peers::median_ratio(&r[0], &r[2]),
            );
            let ok = (ed - 1.0).abs() <= 0.03 && (ef - 1.0).abs() <= 0.03;
            misses += usize::from(!ok);
            println!(
                "| {mode} | {} | {:.1} | {:.1} | {:.1} | {ed:.3} | {ef:.3} | {} |",
                iec(bs),
                med(&r[0]),
                med(&r[1]),
                med(&r[2]),
                if ok { "PASS" } else { "MISS" }
            );
        }
    }
    println!("# {misses} of 8 configurations outside 3 %");
}
