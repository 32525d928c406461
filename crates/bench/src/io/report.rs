//! What `bench io` shows: giacobbi2011's Table 1 layout per target (BS,
//! Count, then Time and Speed per mode, MiB/s and MB/s both labelled), the
//! host CPU per GiB table, summaries as JSON lines, charts of speed vs
//! block size per mode with every target (log-2 axes, like the paper's
//! Figs. 3, 5, 6, 9, 10), and the paper check's lines.

use super::paper::Obs;
use super::{IoOutcome, PointResult, Sweep};
use crate::chart::{bytes_tick, LineChart, Series, SeriesPoint};
use crate::output::table;
use crate::units::{iec, mb_s, mib_s, short_iec, MIB};
use crate::BenchError;
use std::io::Write;
use std::path::{Path, PathBuf};
use vmscope_workload::io::Mode;

/// Mean speeds at the sweep's largest data size, for the paper check.
pub fn observations(
    targets: &[super::target::Target],
    results: &[PointResult],
    sweep: &Sweep,
) -> Vec<Obs> {
    let size = sweep.sizes.iter().max().copied().unwrap_or(0);
    results
        .iter()
        .filter(|r| r.key.size == size && r.failed.is_none())
        .filter_map(|r| {
            let s = r.speed()?;
            let t = &targets[r.key.target];
            Some(Obs {
                label: t.label.clone(),
                backend: t.backend,
                vm: t.vm().map(|v| v.name.clone()),
                mode: r.key.mode,
                bs: r.key.bs,
                mean: s.mean,
                ci95: s.ci95,
            })
        })
        .collect()
}

fn find(o: &IoOutcome, target: usize, mode: Mode, size: u64, bs: u64) -> Option<&PointResult> {
    o.results.iter().find(|r| {
        r.key.target == target && r.key.mode == mode && r.key.size == size && r.key.bs == bs
    })
}

/// The per-mode cells of one row: Time (s), Speed (MiB/s) ±95 %, Speed
/// (MB/s), CV (%) and n.
fn mode_cells(r: Option<&PointResult>) -> Vec<String> {
    let Some(r) = r else {
        return vec!["".into(); 4];
    };
    if r.samples.is_empty() {
        let why = r.failed.as_deref().unwrap_or("no sample");
        return vec![
            "failed".into(),
            format!("({why:.40})"),
            "".into(),
            "".into(),
        ];
    }
    let (Some(s), Some(w)) = (r.speed(), r.wall()) else {
        return vec!["?".into(); 4];
    };
    let star = if r.flagged() > 0 { "*" } else { "" };
    let fail = if r.failed.is_some() { " (failed)" } else { "" };
    vec![
        format!("{:.3}", w.mean),
        if s.n > 1 {
            format!("{:.1} ±{:.1}{star}", mib_s(s.mean), mib_s(s.ci95))
        } else {
            format!("{:.1}{star}", mib_s(s.mean))
        },
        format!("{:.1}", mb_s(s.mean)),
        format!("{:.1} ({}){fail}", 100.0 * s.cv, s.n),
    ]
}

/// The tables, notes, charts and paper check of a sweep, as text.
pub fn tables(out: &mut dyn Write, o: &IoOutcome) -> std::io::Result<()> {
    let sw = &o.sweep;
    if let Some(t) = o.targets.first() {
        let m = &t.manifest;
        writeln!(
            out,
            "# vmscope bench io (giacobbi2011): host kernel {}, {} × {}, QEMU {}",
            m.get("kernel").unwrap_or("?"),
            m.get("cpus").unwrap_or("?"),
            m.get("cpu_model").unwrap_or("?"),
            m.get("qemu").unwrap_or("not installed"),
        )?;
    }
    writeln!(
        out,
        "# Speed: MiB/s = 2^20 bytes/s, MB/s = 10^6 bytes/s; ± is the 95 % interval of the mean \
         (Student's t); CV = sd / mean; n = samples (≥ {}, ≤ {}, until ± is within {:.0} % of \
         the mean); * = a sample was flagged (busy host); Time = mean seconds per run",
        sw.rule.min_samples,
        sw.rule.max_samples,
        100.0 * sw.rule.rel_ci
    )?;
    let by_bs = sw.block_sizes.len() > 1 || sw.sizes.len() == 1;
    for (ti, t) in o.targets.iter().enumerate() {
        writeln!(out)?;
        writeln!(
            out,
            "{} ({}): {}{}",
            t.label,
            t.id,
            t.manifest.get("backing").unwrap_or("?"),
            match (
                t.manifest.get("cache"),
                t.manifest.get("aio"),
                t.manifest.get("accel")
            ) {
                (Some(c), Some(a), Some(acc)) => format!(", cache={c}, aio={a}, accel {acc}"),
                _ => String::new(),
            }
        )?;
        let sizes: Vec<u64> = if by_bs { sw.sizes.clone() } else { vec![0] };
        for size in sizes {
            let mut headers: Vec<String> = Vec::new();
            if by_bs {
                if sw.sizes.len() > 1 {
                    writeln!(out, "data size {} per run", iec(size))?;
                }
                headers.push("BS (B)".into());
            } else {
                headers.push("Size (B)".into());
            }
            headers.push("Count".into());
            for m in &sw.modes {
                headers.push(format!("{m}\nTime (s)"));
                headers.push(format!("{m}\nSpeed (MiB/s)"));
                headers.push(format!("{m}\nSpeed (MB/s)"));
                headers.push(format!("{m}\nCV (%) (n)"));
            }
            let mut tab = table(&headers);
            let rows: Vec<(u64, u64)> = if by_bs {
                sw.block_sizes
                    .iter()
                    .filter(|&&bs| bs <= size)
                    .map(|&bs| (size, bs))
                    .collect()
            } else {
                sw.sizes.iter().map(|&s| (s, sw.block_sizes[0])).collect()
            };
            for (size, bs) in rows {
                let mut row = vec![
                    if by_bs {
                        short_iec(bs)
                    } else {
                        short_iec(size)
                    },
                    (size / bs).to_string(),
                ];
                for &m in &sw.modes {
                    row.extend(mode_cells(find(o, ti, m, size, bs)));
                }
                tab.add_row(row);
            }
            writeln!(out, "{tab}")?;
        }
    }
    cpu_table(out, o)?;
    if !o.unavailable.is_empty() {
        writeln!(out)?;
        writeln!(out, "Unavailable targets:")?;
        for u in &o.unavailable {
            writeln!(out, "  {} ({}): {}", u.label, u.id, u.reason)?;
        }
    }
    let failed: Vec<&PointResult> = o.results.iter().filter(|r| r.failed.is_some()).collect();
    if !failed.is_empty() {
        writeln!(out)?;
        writeln!(out, "Failed points ({}):", failed.len())?;
        for r in failed.iter().take(20) {
            writeln!(
                out,
                "  {}: {}",
                r.point.name,
                r.failed.as_deref().unwrap_or("")
            )?;
        }
        if failed.len() > 20 {
            writeln!(out, "  ... and {} more", failed.len() - 20)?;
        }
    }
    let flagged: usize = o.results.iter().map(PointResult::flagged).sum();
    let capped = o
        .results
        .iter()
        .filter(|r| r.failed.is_none() && r.verdict == crate::stats::Verdict::Capped)
        .count();
    writeln!(out)?;
    writeln!(
        out,
        "Samples: {} in {} points; {} flagged (kept after redoing busy samples); {} points \
         hit the cap with the interval wider than {:.0} %",
        o.results.iter().map(|r| r.samples.len()).sum::<usize>(),
        o.results.len(),
        flagged,
        capped,
        100.0 * sw.rule.rel_ci
    )?;
    for n in &o.notes {
        writeln!(out, "Note: {n}")?;
    }
    if !o.charts.is_empty() {
        writeln!(out, "Charts:")?;
        for c in &o.charts {
            writeln!(out, "  {}", c.display())?;
        }
    }
    if !o.findings.is_empty() {
        writeln!(out)?;
        writeln!(out, "The paper's findings on this machine (giacobbi2011):")?;
        for f in &o.findings {
            writeln!(out, "{:<4} {}: {}", f.verdict(), f.claim, f.detail)?;
        }
    }
    Ok(())
}

/// Host CPU seconds per GiB moved, per point.
fn cpu_table(out: &mut dyn Write, o: &IoOutcome) -> std::io::Result<()> {
    if !o.results.iter().any(|r| r.cpu_per_gib().is_some()) {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "Host CPU per GiB moved (s/GiB; cherkasova2005's split from `account`): vCPU = the VM's \
         vCPU threads; I/O threads = its QEMU main loop, iothreads and workers; shared I/O = its \
         charge for softirq and ksoftirqd time (host targets: all of it); kernel threads = \
         flushers, loop and journal workers during the sample; engine = the host engine's own \
         thread"
    )?;
    let multi_size = o.sweep.sizes.len() > 1;
    let mut headers: Vec<String> = vec!["Target".into(), "Mode".into()];
    if multi_size {
        headers.push("Size (B)".into());
    }
    for h in [
        "BS (B)",
        "vCPU (s/GiB)",
        "I/O threads (s/GiB)",
        "shared I/O (s/GiB)",
        "kernel threads (s/GiB)",
        "engine (s/GiB)",
        "host total (s/GiB)",
    ] {
        headers.push(h.into());
    }
    let mut tab = table(&headers);
    for r in &o.results {
        let Some(c) = r.cpu_per_gib() else { continue };
        let mut row = vec![
            o.targets[r.key.target].label.clone(),
            r.key.mode.to_string(),
        ];
        if multi_size {
            row.push(short_iec(r.key.size));
        }
        row.push(short_iec(r.key.bs));
        for v in [
            c.vcpu,
            c.io_threads,
            c.shared_io,
            c.kernel_threads,
            c.engine,
            c.total,
        ] {
            row.push(format!("{v:.3}"));
        }
        tab.add_row(row);
    }
    writeln!(out, "{tab}")
}

/// The summary record of one point (`--format json`): the fields every
/// experiment's summary has (`driver::summary`), then the wall time and
/// the host CPU per GiB.
pub fn summary_json(r: &PointResult) -> serde_json::Value {
    crate::driver::summary(
        &r.point,
        "throughput",
        "bytes/s",
        r.speed(),
        crate::driver::PointState {
            verdict: r.verdict,
            flagged: r.flagged(),
            failed: r.failed.as_deref(),
            session: r.session.as_deref(),
            record_error: r.record_error.as_deref(),
        },
        serde_json::json!({
            "wall_time_s": r.wall().map(|w| w.mean),
            "host_cpu_per_gib": r.cpu_per_gib(),
        }),
    )
}

/// For CSV runs (stdout holds only rows): failures, findings and charts,
/// on stderr.
pub fn short_summary(w: &mut dyn Write, o: &IoOutcome) -> std::io::Result<()> {
    let failed = o.failed_points();
    if failed > 0 {
        writeln!(w, "vmscope bench io: {failed} points failed")?;
    }
    for f in &o.findings {
        writeln!(w, "{:<4} {}: {}", f.verdict(), f.claim, f.detail)?;
    }
    for c in &o.charts {
        writeln!(w, "chart: {}", c.display())?;
    }
    Ok(())
}

/// Charts into `dir`: per mode, speed vs block size with every target
/// (`io-MODE.svg/png`), speed vs data size when sizes were swept
/// (`io-MODE-size`), and host CPU per GiB vs block size (`cpu-MODE`).
pub fn charts(dir: &Path, o: &IoOutcome) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::Output {
        what: "chart directory",
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let sw = &o.sweep;
    let size = sw.sizes.iter().max().copied().unwrap_or(0);
    let bs_max = sw.block_sizes.iter().max().copied().unwrap_or(0);
    let mut written = Vec::new();
    for &m in &sw.modes {
        let speed_series = |by_size: bool| -> Vec<Series> {
            o.targets
                .iter()
                .enumerate()
                .map(|(ti, t)| Series {
                    name: t.label.clone(),
                    points: o
                        .results
                        .iter()
                        .filter(|r| r.key.target == ti && r.key.mode == m)
                        .filter(|r| {
                            if by_size {
                                r.key.bs == bs_max
                                    || (r.key.bs == sw.block_sizes[0] && sw.block_sizes.len() == 1)
                            } else {
                                r.key.size == size
                            }
                        })
                        .filter_map(|r| {
                            let s = r.speed()?;
                            let ci = if s.ci95.is_finite() { s.ci95 } else { 0.0 };
                            Some(SeriesPoint {
                                x: if by_size { r.key.size } else { r.key.bs } as f64,
                                y: s.mean / MIB,
                                lo: (s.mean - ci) / MIB,
                                hi: (s.mean + ci) / MIB,
                            })
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect()
        };
        if sw.block_sizes.len() > 1 {
            let c = LineChart {
                title: format!("{m}: speed vs block size, {} per run", iec(size)),
                x_label: "block size (bytes, log 2)".into(),
                y_label: "speed (MiB/s, log 2)".into(),
                log2_x: true,
                log2_y: true,
                x_tick: bytes_tick,
                series: speed_series(false),
            };
            let (a, b) = c.write(&dir.join(format!("io-{m}")))?;
            written.extend([a, b]);
            let cpu: Vec<Series> = o
                .targets
                .iter()
                .enumerate()
                .map(|(ti, t)| Series {
                    name: t.label.clone(),
                    points: o
                        .results
                        .iter()
                        .filter(|r| r.key.target == ti && r.key.mode == m && r.key.size == size)
                        .filter_map(|r| {
                            let c = r.cpu_per_gib()?;
                            (c.total > 0.0).then_some(SeriesPoint {
                                x: r.key.bs as f64,
                                y: c.total,
                                lo: c.total,
                                hi: c.total,
                            })
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            if !cpu.is_empty() {
                let c = LineChart {
                    title: format!("{m}: host CPU per GiB moved vs block size"),
                    x_label: "block size (bytes, log 2)".into(),
                    y_label: "host CPU (s/GiB, log 2)".into(),
                    log2_x: true,
                    log2_y: true,
                    x_tick: bytes_tick,
                    series: cpu,
                };
                let (a, b) = c.write(&dir.join(format!("cpu-{m}")))?;
                written.extend([a, b]);
            }
        }
        if sw.sizes.len() > 1 {
            let c = LineChart {
                title: format!("{m}: speed vs data size, block size {}", iec(bs_max)),
                x_label: "data size (bytes, log 2)".into(),
                y_label: "speed (MiB/s, log 2)".into(),
                log2_x: true,
                log2_y: true,
                x_tick: bytes_tick,
                series: speed_series(true),
            };
            let (a, b) = c.write(&dir.join(format!("io-{m}-size")))?;
            written.extend([a, b]);
        }
    }
    Ok(written)
}
