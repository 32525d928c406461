//! Printers: one function per format, all reading a built [`Report`].

use crate::{Report, ReportError, ReportFormat};
use std::io::Write;

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
                writeln!(out, "{} {}", s.frames.replace(' ', "_"), s.samples)?;
            }
        }
    }
    Ok(())
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

/// Header lines (`# ...`), shared by table output.
pub fn header_lines(r: &Report) -> Vec<String> {
    let m = |k: &str| r.meta.get(k).cloned().unwrap_or_default();
    let mut v = Vec::new();
    let source = m("source");
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
        writeln!(out, "{l}")?;
    }
    writeln!(out, "#")?;
    crate::intervals::write_text(&r.intervals, out)?;
    // A session of intervals only (stat -o, account -o) has no samples to list.
    if r.rows.is_empty() && !r.intervals.is_empty() {
        return Ok(());
    }
    let multi = r.events.len() > 1;
    // Column texts.
    let mut header: Vec<String> = Vec::new();
    for e in &r.events {
        if multi {
            header.push(e.name.clone());
            header.push("%".into());
        } else {
            header.push("samples".into());
            header.push("%".into());
        }
    }
    header.extend(r.fields.iter().cloned());
    let mut cells: Vec<Vec<String>> = Vec::with_capacity(r.rows.len());
    for row in &r.rows {
        let mut c = Vec::with_capacity(header.len());
        for (s, p) in row.samples.iter().zip(&row.percent) {
            c.push(s.to_string());
            c.push(format!("{p:.2}%"));
        }
        c.extend(row.values.iter().cloned());
        cells.push(c);
    }
    let ncount = r.events.len() * 2;
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
            Some(n) => writeln!(out, "(no samples: {n})")?,
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
        header.push(format!("{} percent", e.name));
    }
    w.write_record(&header)?;
    for row in &r.rows {
        let mut rec = row.values.clone();
        for (s, p) in row.samples.iter().zip(&row.percent) {
            rec.push(s.to_string());
            rec.push(format!("{p:.4}"));
        }
        w.write_record(&rec)?;
    }
    w.flush()?;
    Ok(())
}
