//! Import a perf.data file and print what came out and how fast:
//! `cargo run --release -p vmscope-perfdata --example import_stats -- FILE`.

use std::time::Instant;
use vmscope_model::Record;

fn main() {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: import_stats PERF.DATA");
        std::process::exit(2);
    };
    let (mut records, mut samples, mut frames, mut mmaps, mut comms) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    let res = vmscope_perfdata::import(std::path::Path::new(&path), &mut |r| {
        records += 1;
        match r {
            Record::Sample(s) => {
                samples += 1;
                frames += s.callchain.len() as u64;
            }
            Record::Mmap { .. } => mmaps += 1,
            Record::Comm { .. } => comms += 1,
            _ => {}
        }
    });
    let secs = start.elapsed().as_secs_f64();
    match res {
        Ok(info) => {
            println!("events: {:?}", info.events);
            println!(
                "host {:?}, kernel {:?}, perf {:?}, arch {:?}, cpus {:?}",
                info.hostname, info.os_release, info.perf_version, info.arch, info.nr_cpus
            );
            println!("cmdline: {:?}", info.cmdline);
            println!("build ids: {}", info.build_ids.len());
            println!(
                "records {records}, samples {samples} (info {}), lost {}, mmaps {mmaps}, comms {comms}, frames {frames}",
                info.samples, info.lost
            );
            println!(
                "{secs:.3} s, {:.0} records/s, {:.0} samples/s",
                records as f64 / secs,
                samples as f64 / secs
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
