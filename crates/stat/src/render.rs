//! Text, JSON-lines and CSV output of `stat` and `account`. Text keeps the
//! vm-stat layout of Theurer's figure 1 exactly; every other header names
//! its units (seconds, percent, operations).

use crate::account::AccountInterval;
use crate::vmstat::{CpuRow, Source, StatInterval};
use crate::wait::WaitShare;
use serde_json::json;
use std::io::Write;
use vmscope_model::text::{csv_field, visible, visible_cut, NAME_WIDTH};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalFormat {
    Text,
    Json,
    Csv,
}

/// `0    [070.5]    d0-0[006.3] d2-1[064.2]`.
pub fn stat_row_text(r: &CpuRow) -> String {
    let cells: Vec<String> = r
        .cells
        .iter()
        .map(|c| format!("{}[{:05.1}]", c.label(r.cpu), c.pct))
        .collect();
    format!("{:<4} [{:05.1}]    {}", r.cpu, r.total_pct, cells.join(" "))
}

/// The first lines of `stat`: what is measured and from where.
pub fn stat_header(
    out: &mut dyn Write,
    f: IntervalFormat,
    source: &str,
    interval_s: f64,
) -> std::io::Result<()> {
    match f {
        IntervalFormat::Text | IntervalFormat::Csv => {
            writeln!(out, "# vmscope stat: busy % of each host CPU per {interval_s:.3} s interval, split by VM vCPU (dN-M), host work for VM N (dN-io), other host work (d0-CPU)")?;
            writeln!(out, "# source: {source}")?;
            if f == IntervalFormat::Csv {
                writeln!(out, "time_s,interval_s,cpu,total_pct,cells_pct")?;
            }
        }
        IntervalFormat::Json => {
            writeln!(
                out,
                "{}",
                json!({"type": "header", "source": source, "interval_s": interval_s, "units": {"total_pct": "percent of one CPU", "pct": "percent of one CPU"}})
            )?;
        }
    }
    Ok(())
}

pub fn stat_interval(
    out: &mut dyn Write,
    f: IntervalFormat,
    s: &StatInterval,
) -> std::io::Result<()> {
    match f {
        IntervalFormat::Text => {
            for n in &s.notes {
                writeln!(out, "# {}", visible(n))?;
            }
            if let Some(l) = &s.legend {
                writeln!(out, "# legend: {}", visible(l))?;
            }
            if s.lost > 0 {
                let what = match s.source {
                    Source::Bpf => "slices dropped (the eBPF program's map was full)",
                    _ => "switch records lost",
                };
                writeln!(out, "# {} {what}: times of this interval are short", s.lost)?;
            }
            writeln!(out, "CPU  Total Pct  Virtual CPUs")?;
            for r in &s.rows {
                writeln!(out, "{}", stat_row_text(r))?;
            }
            writeln!(out)?;
        }
        IntervalFormat::Csv => {
            for n in &s.notes {
                writeln!(out, "# {}", visible(n))?;
            }
            if let Some(l) = &s.legend {
                writeln!(out, "# legend: {}", visible(l))?;
            }
            for r in &s.rows {
                let cells: Vec<String> = r
                    .cells
                    .iter()
                    .map(|c| format!("{}={:.1}", c.label(r.cpu), c.pct))
                    .collect();
                writeln!(
                    out,
                    "{:.3},{:.3},{},{:.1},{}",
                    s.time_s,
                    s.interval_s,
                    r.cpu,
                    r.total_pct,
                    cells.join(";")
                )?;
            }
        }
        IntervalFormat::Json => {
            for n in &s.notes {
                writeln!(
                    out,
                    "{}",
                    json!({"type": "note", "time_s": s.time_s, "note": n})
                )?;
            }
            if let Some(l) = &s.legend {
                writeln!(
                    out,
                    "{}",
                    json!({"type": "legend", "time_s": s.time_s, "legend": l})
                )?;
            }
            for r in &s.rows {
                let cells: Vec<_> = r
                    .cells
                    .iter()
                    .map(|c| json!({"label": c.label(r.cpu), "domain": c.domain, "kind": c.kind, "pct": c.pct}))
                    .collect();
                writeln!(
                    out,
                    "{}",
                    json!({"type": "cpu", "time_s": s.time_s, "interval_s": s.interval_s,
                           "source": s.source, "cpu": r.cpu, "total_pct": r.total_pct, "cells": cells,
                           "lost": s.lost, "uncounted_slices": s.uncounted_slices,
                           "unchained_switches": s.unchained_switches})
                )?;
            }
        }
    }
    out.flush()
}

const ACCOUNT_COLS: &str = "time_s,domain,vm,vcpu_run_s,vcpu_runnable_s,vcpu_blocked_s,direct_io_s,net_packets,disk_ops,disk_bytes,io_ops,shared_io_s,total_s,total_pct_of_one_cpu,notes,vcpu_wait_attributed_s,io_runnable_s,waited_behind";

/// The header of `account`; `softirq_source` says where softirq time comes
/// from ([`crate::account::Accountant::softirq_source`]), `wait_source`
/// where the waited-behind split does ([`crate::account::Accountant::wait_source`]).
pub fn account_header(
    out: &mut dyn Write,
    f: IntervalFormat,
    interval_s: f64,
    softirq_source: &str,
    wait_source: &str,
) -> std::io::Result<()> {
    match f {
        IntervalFormat::Text => {
            writeln!(out, "# vmscope account: per VM per {interval_s:.3} s interval; times in seconds, I/O in operations per interval")?;
            writeln!(out, "# shared I/O T = softirq + ksoftirqd + --shared-io processes, charged by cost = T / sum(N), charge = N_i * cost")?;
            writeln!(out, "# softirq: {softirq_source}")?;
            writeln!(
                out,
                "# waited behind (steal by what ran instead, top {WAIT_TOP}): {wait_source}"
            )?;
            writeln!(
                out,
                "{:>8} {:<14} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>11} {:>10} {:>9} {:>7}  notes",
                "time[s]",
                "VM",
                "run[s]",
                "steal[s]",
                "halt[s]",
                "dirio[s]",
                "net[pkt]",
                "disk[op]",
                "disk[B]",
                "shrio[s]",
                "total[s]",
                "tot[%]"
            )?;
        }
        IntervalFormat::Csv => writeln!(out, "{ACCOUNT_COLS}")?,
        IntervalFormat::Json => writeln!(
            out,
            "{}",
            json!({"type": "header", "interval_s": interval_s, "softirq_source": softirq_source, "wait_source": wait_source,
            "units": {"*_s": "seconds", "*_pct": "percent", "net_packets": "packets", "disk_ops": "requests", "disk_bytes": "bytes"}})
        )?,
    }
    Ok(())
}

/// Culprits a text row names; JSON and CSV carry all of them.
pub const WAIT_TOP: usize = 3;
/// Waits shorter than this (seconds per interval) get no text line.
const WAIT_SHOWN_S: f64 = 0.0005;

/// `vCPUs waited behind: d2 web vCPU 0 0.4812 s (97.1 %), ...; 0.4952 s of runnable 0.4960 s`.
fn waited_behind_text(what: &str, split: &[WaitShare], total: f64, runnable: f64) -> String {
    let mut parts: Vec<String> = split
        .iter()
        .take(WAIT_TOP)
        .map(|w| {
            format!(
                "{} {:.4} s ({:.1} %)",
                visible(&w.shown()),
                w.seconds,
                crate::math::pct(w.seconds, total)
            )
        })
        .collect();
    if split.len() > WAIT_TOP {
        let rest: f64 = split[WAIT_TOP..].iter().map(|w| w.seconds).sum();
        parts.push(format!("{} more {:.4} s", split.len() - WAIT_TOP, rest));
    }
    format!(
        "{what} waited behind: {}; attributed {total:.4} s of runnable {runnable:.4} s",
        parts.join(", ")
    )
}

/// Every culprit of a VM row: `vcpu|io:LABEL=SECONDS;...`.
fn waited_behind_csv(v: &crate::account::VmAccount) -> String {
    let one = |who: &str, split: &[WaitShare]| {
        split
            .iter()
            .map(|w| {
                format!(
                    "{who}:{}={:.6}",
                    visible(&w.label()).replace(['"', ';', '='], "'"),
                    w.seconds
                )
            })
            .collect::<Vec<_>>()
    };
    let mut all = one("vcpu", &v.waited_behind);
    all.extend(one("io", &v.io_waited_behind));
    all.join(";")
}

pub fn account_interval(
    out: &mut dyn Write,
    f: IntervalFormat,
    a: &AccountInterval,
) -> std::io::Result<()> {
    let rec = a.reconciliation();
    match f {
        IntervalFormat::Text => {
            for n in &a.notes {
                writeln!(out, "# {}", visible(n))?;
            }
            for v in &a.vms {
                writeln!(
                    out,
                    "{:>8.2} {:<14} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>8} {:>8} {:>11} {:>10.6} {:>9.4} {:>7.1}  {}",
                    a.time_s,
                    format!("d{} {}", v.domain, visible_cut(&v.name, NAME_WIDTH)),
                    v.vcpu_run_s,
                    v.vcpu_runnable_s,
                    v.vcpu_blocked_s,
                    v.direct_io_s,
                    v.net_packets,
                    v.disk_ops,
                    v.disk_bytes,
                    v.shared_io_s,
                    v.total_s,
                    crate::math::pct(v.total_s, a.interval_s),
                    visible(&v.notes.join("; "))
                )?;
                for (what, split, total, of) in [
                    (
                        "vCPUs",
                        &v.waited_behind,
                        v.wait_attributed_s,
                        v.vcpu_runnable_s,
                    ),
                    (
                        "I/O threads",
                        &v.io_waited_behind,
                        v.io_wait_attributed_s,
                        v.io_runnable_s,
                    ),
                ] {
                    if total >= WAIT_SHOWN_S {
                        writeln!(
                            out,
                            "{:>8} {:<14} {}",
                            "",
                            "",
                            waited_behind_text(what, split, total, of)
                        )?;
                    }
                }
            }
            writeln!(
                out,
                "{:>8.2} {:<14} VMs {:.4} s + unattributed {:.4} s = {:.4} s; measured host CPU {:.4} s (residual {:+.4} s, {:.2} %); shared I/O T {:.6} s (softirq {:.6} s) over {} ops = {:.2} us/op",
                a.time_s,
                "= host",
                rec.vms,
                rec.unattributed,
                rec.vms + rec.unattributed,
                rec.measured,
                rec.residual,
                100.0 * rec.error(),
                a.shared_io_s,
                a.softirq_io_s,
                a.shared_ops,
                a.cost_per_op_s * 1e6
            )?;
        }
        IntervalFormat::Csv => {
            for v in &a.vms {
                writeln!(
                    out,
                    "{:.3},{},{},{:.6},{:.6},{:.6},{:.6},{},{},{},{},{:.6},{:.6},{:.2},\"{}\",{:.6},{:.6},\"{}\"",
                    a.time_s,
                    v.domain,
                    csv_field(&v.name),
                    v.vcpu_run_s,
                    v.vcpu_runnable_s,
                    v.vcpu_blocked_s,
                    v.direct_io_s,
                    v.net_packets,
                    v.disk_ops,
                    v.disk_bytes,
                    v.io_ops,
                    v.shared_io_s,
                    v.total_s,
                    crate::math::pct(v.total_s, a.interval_s),
                    visible(&v.notes.join("; ")).replace('"', "'"),
                    v.wait_attributed_s,
                    v.io_runnable_s,
                    waited_behind_csv(v)
                )?;
            }
            writeln!(
                out,
                "{:.3},,host-unattributed,,,,,,,,{},{:.6},{:.6},{:.2},\"measured {:.6} s, residual {:.6} s\",,,",
                a.time_s,
                a.shared_ops,
                a.shared_io_s,
                rec.unattributed,
                crate::math::pct(rec.unattributed, a.interval_s),
                rec.measured,
                rec.residual
            )?;
        }
        IntervalFormat::Json => {
            let mut v = serde_json::to_value(a).unwrap_or_default();
            v["type"] = json!("interval");
            v["reconciliation"] = json!({"vms_s": rec.vms, "unattributed_s": rec.unattributed, "measured_s": rec.measured, "residual_s": rec.residual, "error": rec.error()});
            writeln!(out, "{v}")?;
        }
    }
    out.flush()
}
