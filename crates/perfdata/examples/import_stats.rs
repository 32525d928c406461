//! Import a perf.data file and print what came out and how fast:
//! `cargo run --release -p vmscope-perfdata --example import_stats -- FILE`.
//! With `--read-only` it only reads the file: every record iterated by
//! linux-perf-data, as `import` does before converting anything, and
//! counted (bench/vs-perf (b): the floor an import is measured against).

use std::time::Instant;
use vmscope_model::Record;

/// Iterate every record of `path` and print how many and how fast.
fn read_only(path: &std::path::Path) -> Result<(), linux_perf_data::Error> {
    use linux_perf_data::{PerfFileReader, PerfFileRecord};
    let start = Instant::now();
    let file = std::io::BufReader::with_capacity(256 * 1024, std::fs::File::open(path)?);
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(file)?;
    let (mut records, mut samples) = (0u64, 0u64);
    while let Some(r) = record_iter.next_record(&mut perf_file)? {
        records += 1;
        if let PerfFileRecord::EventRecord { record, .. } = r {
            samples += u64::from(
                record.record_type == linux_perf_data::linux_perf_event_reader::RecordType::SAMPLE,
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("read only: records {records}, samples {samples}, {secs:.3} s");
    Ok(())
}

fn main() {
    let mut args: Vec<_> = std::env::args_os().skip(1).collect();
    let only = args
        .iter()
        .position(|a| a == "--read-only")
        .map(|i| args.remove(i));
    let Some(path) = args.first().cloned() else {
        eprintln!("usage: import_stats [--read-only] PERF.DATA");
        std::process::exit(2);
    };
    if only.is_some() {
        if let Err(e) = read_only(std::path::Path::new(&path)) {
            eprintln!("{}: {e}", path.to_string_lossy());
            std::process::exit(1);
        }
        return;
    }
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
