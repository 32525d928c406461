//! Printers: one function per format, all reading a built [`Report`].

use crate::{is_clock, CallGraph, Report, ReportError, ReportFormat};
use std::io::Write;
use vmscope_model::text::{visible, visible_cut, NAME_WIDTH};

/// Write `report` in `format`.
pub fn render(
    report: &Report,
    format: ReportFormat,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    match format {
        ReportFormat::Table => table(report, out)?,
        ReportFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, report)?;
            writeln!(out)?;
        }
        ReportFormat::Csv => csv_out(report, out)?,
        ReportFormat::Collapsed => {
            for s in &report.stacks {
                let frames: Vec<String> = s
                    .frames
                    .split(';')
                    .map(crate::stacks::collapsed_frame)
                    .collect();
                writeln!(out, "{} {}", frames.join(";"), s.event_count)?;
            }
        }
        ReportFormat::Flamegraph | ReportFormat::Pprof | ReportFormat::Html => {
            return Err(ReportError::NeedsOutput(match format {
                ReportFormat::Flamegraph => "flamegraph",
                ReportFormat::Pprof => "pprof",
                _ => "html",
            }))
        }
    }
    Ok(())
}

/// Column title of an event count: `CPU s` for clock events, else `count`.
pub(crate) fn count_title(event: &str) -> &'static str {
    if is_clock(event) {
        "CPU s"
    } else {
        "count"
    }
}

/// An event count as its column shows it: seconds with 3 decimals for
/// clock events (ns), else the count.
pub(crate) fn count_text(event: &str, count: u64) -> String {
    if is_clock(event) {
        format!("{:.3}", count as f64 / 1e9)
    } else {
        count.to_string()
    }
}

fn human_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn event_count_text(name: &str, count: u64) -> String {
    if name == "cpu-clock" || name == "task-clock" {
        format!("{:.3} s of CPU", count as f64 / 1e9)
    } else {
        format!("event count {}", human_count(count))
    }
}

/// `--time` and `--cpu` in words (`10 s to 20 s, CPUs 0,1`).
pub(crate) fn slice_text(r: &Report) -> Option<String> {
    let sl = r.slice.as_ref()?;
    let mut parts = Vec::new();
    if let Some((a, b)) = sl.seconds {
        if b == u32::MAX {
            parts.push(format!("from {a} s to the end"));
        } else {
            parts.push(format!("{a} s to {} s", u64::from(b) + 1));
        }
    }
    if let Some(c) = &sl.cpus {
        parts.push(format!(
            "CPUs {}",
            c.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ));
    }
    Some(parts.join(", "))
}

/// Header lines (`# ...`), shared by table output.
pub fn header_lines(r: &Report) -> Vec<String> {
    let m = |k: &str| r.meta.get(k).cloned().unwrap_or_default();
    let mut v = Vec::new();
    let source = m("source");
    let recorded = source.is_empty() || source == "record";
    let clean = m("clean_stop") == "1";
    v.push(format!(
        "# session   {} ({}{})",
        r.file,
        if source.is_empty() {
            "record".into()
        } else {
            source
        },
        if clean { ", stopped cleanly" } else { "" }
    ));
    if !clean {
        let stop = m("stop_reason");
        v.push(if stop.is_empty() {
            "# WARNING   the recorder did not stop cleanly (killed or crashed): samples of its last second (after the last flush) are missing".into()
        } else {
            format!("# WARNING   the recording stopped early: {stop}")
        });
        if r.file.ends_with(".partial") {
            v.push(
                "# WARNING   this is the partial file of a recording that never completed".into(),
            );
        }
    } else if r.file.ends_with(".partial") && recorded {
        // Stopped cleanly yet never renamed: its last step (folding the
        // log in, or the rename) failed, and the recorder said why.
        v.push(
            "# WARNING   this is the partial file of a recording that stopped cleanly but could not be put in place of its output; it holds the whole recording".into(),
        );
    }
    if !m("command").is_empty() {
        v.push(format!("# command   {}", m("command")));
    }
    if !m("source_file").is_empty() {
        v.push(format!("# from      {}", m("source_file")));
    }
    let mut host = Vec::new();
    for (k, label) in [
        ("hostname", ""),
        ("kernel", "Linux "),
        ("perf_version", "perf "),
    ] {
        if !m(k).is_empty() {
            host.push(format!("{label}{}", m(k)));
        }
    }
    if !m("cpus").is_empty() {
        host.push(format!("{} CPUs", m("cpus")));
    }
    if !host.is_empty() {
        v.push(format!("# host      {}", host.join(", ")));
    }
    if !m("duration_s").is_empty() {
        let d: f64 = m("duration_s").parse().unwrap_or(0.0);
        v.push(format!("# duration  {d:.2} s"));
    }
    if !m("accel").is_empty() {
        v.push(format!("# vm mode   {}", m("accel")));
    }
    for e in &r.events {
        let rate = match (e.period, e.frequency) {
            (Some(p), _) => format!("period {p}"),
            (_, Some(f)) => format!("{f} Hz"),
            _ => "period ?".into(),
        };
        v.push(format!(
            "# event     {} ({rate}): {} samples, {}, {} lost",
            e.name,
            human_count(e.samples),
            event_count_text(&e.name, e.event_count),
            human_count(e.lost)
        ));
    }
    if r.domains.len() > 1 || r.domains.iter().any(|d| d.name != "host") {
        for d in &r.domains {
            let mut s = format!("# domain    {} ({})", d.name, d.role);
            if let Some(p) = d.pid {
                s.push_str(&format!(" pid {p}"));
            }
            if d.status != "running" && d.status != "ok" {
                s.push_str(&format!(", {}", d.status));
                if let Some(t) = d.ended_at {
                    s.push_str(&format!(" at {t:.1} s"));
                }
            }
            if !d.detail.is_empty() {
                s.push_str(&format!(": {}", d.detail));
            }
            v.push(s);
        }
    }
    for sc in &r.scales {
        v.push(format!(
            "# agent     {} ({}): {} samples in the guest ({} lost), guest busy {}; host measured {} on its vCPUs; scale x{:.3}",
            sc.domain,
            sc.event,
            human_count(sc.agent_samples),
            human_count(sc.agent_lost),
            event_count_text(&sc.event, sc.agent_event_count),
            event_count_text(&sc.event, sc.host_event_count),
            sc.factor
        ));
    }
    // Why a VM is not active (the session plan's reason and fix).
    for (k, why) in &r.meta {
        if let Some(vm) = k.strip_prefix("agent_") {
            v.push(format!("# agent     {vm}: {why}"));
        }
    }
    // What profiling cost each domain (its own CPU and interrupts over the
    // CPU it observed, the rate used, the budget).
    for (k, line) in &r.meta {
        if let Some(domain) = k.strip_prefix("profiler_") {
            v.push(format!("# cost      {domain}: {line}"));
        }
    }
    // What share of each domain's run time its samples stand for.
    for c in &r.coverage {
        let held = if (c.held_s - c.sampled_s).abs() > 1e-9 {
            format!(
                ", {:.1} % held to the threads' run times",
                100.0 * c.held_s / c.scheduler_s
            )
        } else {
            String::new()
        };
        v.push(format!(
            "# coverage  {}: {:.1} % ({:.3} s sampled of {:.3} s its threads ran{held}){}",
            vmscope_model::text::visible(&c.domain),
            100.0 * c.ratio,
            c.sampled_s,
            c.scheduler_s,
            c.low
                .as_ref()
                .map(|w| format!("; LOW, likely: {w}"))
                .unwrap_or_default()
        ));
        if let Some(h) = &c.high {
            v.push(format!(
                "# coverage  {}: OVER-SAMPLED: {h}",
                vmscope_model::text::visible(&c.domain)
            ));
        }
    }
    if r.rows
        .iter()
        .any(|row| row.values.iter().any(|v| v == crate::UNSAMPLED))
    {
        v.push(format!(
            "# note      {}: CPU time the scheduler says a domain ran that no sample saw (its rows then add up to the scheduler's; % of the sampled total)",
            crate::UNSAMPLED
        ));
    }
    if r.shows_ci() {
        v.push("# note      few samples: ±95% is each share's 95 % interval (Wilson, over the column's samples)".into());
    }
    if let Some(t) = slice_text(r) {
        v.push(format!(
            "# slice     {t} (whole seconds; agents' rows scaled to the guest time the host measured in the slice)"
        ));
    }
    if let Some(c) = &r.class_rules {
        v.push(format!("# classes   {c}, then the built-in rules"));
    }
    if r.view == "merged" && !r.scales.is_empty() {
        v.push("# note      samples of active VMs' guest rows are their agents' own; the event count (CPU s) adds up across samplers".into());
    }
    if r.view != "merged" {
        v.push(format!(
            "# view      {} measurements only (unscaled)",
            r.view
        ));
    }
    for w in m("warnings").split('\n').filter(|w| !w.is_empty()) {
        v.push(format!("# note      {w}"));
    }
    v
}

fn table(r: &Report, out: &mut dyn Write) -> Result<(), ReportError> {
    for l in header_lines(r) {
        // Names from guests and VMs' owners print visibly, one line each.
        writeln!(out, "{}", visible(&l))?;
    }
    writeln!(out, "#")?;
    crate::intervals::write_text(&r.intervals, out)?;
    // A session of intervals only (stat -o, account -o) has no samples to list.
    if r.rows.is_empty() && !r.intervals.is_empty() {
        return Ok(());
    }
    let multi = r.events.len() > 1;
    let ci = r.shows_ci();
    // Column texts.
    let mut header: Vec<String> = Vec::new();
    for e in &r.events {
        header.push(if multi {
            e.name.clone()
        } else {
            "samples".into()
        });
        header.push(count_title(&e.name).into());
        header.push("%".into());
        if ci {
            header.push("±95%".into());
        }
    }
    header.extend(r.fields.iter().cloned());
    let mut cells: Vec<Vec<String>> = Vec::with_capacity(r.rows.len());
    for row in &r.rows {
        let mut c = Vec::with_capacity(header.len());
        for (i, e) in r.events.iter().enumerate() {
            c.push(row.samples[i].to_string());
            c.push(count_text(&e.name, row.event_count[i]));
            c.push(format!("{:.2}%", row.percent[i]));
            if ci {
                let [lo, hi] = row.percent_ci95[i];
                c.push(format!("{lo:.1}-{hi:.1}%"));
            }
        }
        c.extend(row.values.iter().zip(&r.fields).map(|(v, f)| {
            if f == "domain" || f == "process" {
                visible_cut(v, NAME_WIDTH).into_owned()
            } else {
                visible(v).into_owned()
            }
        }));
        cells.push(c);
    }
    let ncount = r.events.len() * if ci { 4 } else { 3 };
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for c in &cells {
        for (i, v) in c.iter().enumerate() {
            widths[i] = widths[i].max(v.chars().count());
        }
    }
    let line = |vals: &[String]| {
        let mut s = String::new();
        for (i, v) in vals.iter().enumerate() {
            let last = i + 1 == vals.len();
            if i > 0 {
                s.push_str("  ");
            }
            if i < ncount {
                s.push_str(&format!("{:>w$}", v, w = widths[i]));
            } else if last {
                s.push_str(v);
            } else {
                s.push_str(&format!("{:<w$}", v, w = widths[i]));
            }
        }
        s
    };
    writeln!(out, "{}", line(&header))?;
    for c in &cells {
        writeln!(out, "{}", line(c))?;
    }
    if r.rows.is_empty() {
        match &r.note {
            Some(n) => writeln!(out, "(no samples: {})", visible(n))?,
            None => writeln!(out, "(no samples)")?,
        }
    }
    if r.omitted_rows > 0 {
        writeln!(
            out,
            "# {} more rows below --limit/--min-percent",
            r.omitted_rows
        )?;
    }
    Ok(())
}

fn csv_out(r: &Report, out: &mut dyn Write) -> Result<(), ReportError> {
    let mut w = csv::Writer::from_writer(out);
    let mut header: Vec<String> = r.fields.clone();
    for e in &r.events {
        header.push(format!("{} samples", e.name));
        header.push(if is_clock(&e.name) {
            format!("{} CPU s", e.name)
        } else {
            format!("{} count", e.name)
        });
        header.push(format!("{} percent", e.name));
    }
    w.write_record(&header)?;
    for row in &r.rows {
        let mut rec: Vec<String> = row.values.iter().map(|v| visible(v).into_owned()).collect();
        for (i, e) in r.events.iter().enumerate() {
            rec.push(row.samples[i].to_string());
            rec.push(if is_clock(&e.name) {
                format!("{:.9}", row.event_count[i] as f64 / 1e9)
            } else {
                row.event_count[i].to_string()
            });
            rec.push(format!("{:.4}", row.percent[i]));
        }
        w.write_record(&rec)?;
    }
    w.flush()?;
    Ok(())
}

/// Callers or callees of one function as a table, JSON or CSV.
pub fn render_call_graph(
    g: &CallGraph,
    format: ReportFormat,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    let arrow = if g.direction == "callers" {
        " <- "
    } else {
        " -> "
    };
    match format {
        ReportFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, g)?;
            writeln!(out)?;
        }
        ReportFormat::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record([
                "path".to_string(),
                "samples".into(),
                if is_clock(&g.event) {
                    "CPU s".into()
                } else {
                    "count".into()
                },
                "percent".into(),
            ])?;
            for p in &g.paths {
                w.write_record([
                    visible(&p.path.join(arrow.trim())).into_owned(),
                    p.samples.to_string(),
                    count_text(&g.event, p.event_count),
                    format!("{:.4}", p.percent),
                ])?;
            }
            w.flush()?;
        }
        _ => {
            writeln!(
                out,
                "# {} of {} ({}): {} samples, {} {}, {:.2}% of the event's total (each sample once)",
                g.direction,
                visible(&g.symbol),
                g.event,
                g.samples,
                count_text(&g.event, g.event_count),
                count_title(&g.event),
                g.percent_of_total
            )?;
            let title = if g.direction == "callers" {
                "callers (nearest first)"
            } else {
                "callees (direct callee first)"
            };
            let rows: Vec<[String; 4]> = g
                .paths
                .iter()
                .map(|p| {
                    [
                        p.samples.to_string(),
                        count_text(&g.event, p.event_count),
                        format!("{:.2}%", p.percent),
                        visible(&format!("{}{arrow}{}", g.symbol, p.path.join(arrow))).into_owned(),
                    ]
                })
                .collect();
            let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0).max(7);
            let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0).max(5);
            let w2 = rows.iter().map(|r| r[2].len()).max().unwrap_or(0).max(1);
            writeln!(
                out,
                "{:>w0$}  {:>w1$}  {:>w2$}  {title}",
                "samples",
                count_title(&g.event),
                "%"
            )?;
            for r in &rows {
                writeln!(out, "{:>w0$}  {:>w1$}  {:>w2$}  {}", r[0], r[1], r[2], r[3])?;
            }
            if g.omitted > 0 {
                writeln!(out, "# {} more paths below --limit", g.omitted)?;
            }
        }
    }
    Ok(())
}
