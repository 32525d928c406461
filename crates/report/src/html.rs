//! `report --format html -o report.html`: one self-contained page (no
//! network, no files beside it) with the session's header, where the CPU
//! went per domain and context, the top functions and classes, a flame
//! graph of the whole machine and one per domain (each in its own frame,
//! so their scripts and ids never meet), the per-second timeline of every
//! domain, and vm-stat, accounting and benchmark charts when the session
//! holds them.

use crate::overtime;
use crate::render::{count_text, count_title, header_lines};
use crate::{build, GroupKey, Report, ReportError, ReportOptions};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use vmscope_store::{Field, Session};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// A report's rows as an HTML table (first event).
fn table(r: &Report, id: &str) -> String {
    let mut h = String::new();
    let ev = r.events.first().map_or("", |e| e.name.as_str());
    let ci = r.shows_ci();
    let _ = write!(
        h,
        "<table id=\"{id}\"><thead><tr><th>samples</th><th>{}</th><th>%</th>{}",
        esc(count_title(ev)),
        if ci { "<th>95 % interval</th>" } else { "" }
    );
    for f in &r.fields {
        let _ = write!(h, "<th>{}</th>", esc(f));
    }
    h.push_str("</tr></thead><tbody>\n");
    for row in &r.rows {
        let _ = write!(
            h,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\"><span class=\"bar\" style=\"width:{:.1}px\"></span>{:.2}%</td>",
            row.samples.first().copied().unwrap_or(0),
            count_text(ev, row.event_count.first().copied().unwrap_or(0)),
            row.percent.first().copied().unwrap_or(0.0).clamp(0.0, 100.0),
            row.percent.first().copied().unwrap_or(0.0)
        );
        if ci {
            let [lo, hi] = row.percent_ci95.first().copied().unwrap_or([0.0, 0.0]);
            let _ = write!(h, "<td class=\"n\">{lo:.1}–{hi:.1}%</td>");
        }
        for v in &row.values {
            let _ = write!(h, "<td>{}</td>", esc(v));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</tbody></table>\n");
    if r.omitted_rows > 0 {
        let _ = write!(
            h,
            "<p class=\"note\">{} more rows not shown.</p>",
            r.omitted_rows
        );
    }
    h
}

fn flame_frame(title: &str, svg: &[u8]) -> String {
    use base64::Engine;
    // Each graph is an SVG document of its own (a data: URL in a frame):
    // its script and ids never meet the page's or another graph's, and it
    // stays interactive (zoom, search).
    format!(
        "<iframe class=\"flame\" title=\"{}\" src=\"data:image/svg+xml;base64,{}\"></iframe>\n",
        esc(title),
        base64::engine::general_purpose::STANDARD.encode(svg)
    )
}

/// Per-second CPU of each domain (from the bins), as lines.
fn timeline(
    session: &Session,
    event: u32,
    is_clock: bool,
    frequency: Option<u64>,
) -> Result<Option<String>, ReportError> {
    let bins = session.bins(event)?;
    if bins.is_empty() {
        return Ok(None);
    }
    let mut per: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
    for (sec, dom, _ctx, n) in bins {
        *per.entry(dom).or_default().entry(sec).or_default() += n;
    }
    let meta = session.meta()?;
    let duration = meta.get("duration_s").and_then(|d| d.parse::<f64>().ok());
    // A history range's bins are per step (vmscope_history's extract).
    let step = meta
        .get("bin_seconds")
        .and_then(|d| d.parse::<u32>().ok())
        .unwrap_or(1);
    // cpu-clock at F Hz: samples per second / F = CPUs busy.
    let (scale, label) = match (is_clock, frequency) {
        (true, Some(f)) if f > 0 => (1.0 / f as f64, "CPUs busy (samples per second / frequency)"),
        _ => (1.0, "samples per second"),
    };
    let series: Vec<(String, Vec<(f64, f64)>)> = overtime::bin_spans(&per, duration, step)
        .into_iter()
        .map(|(d, spans)| {
            let pts = overtime::per_second(spans)
                .into_iter()
                .map(|(x, y)| (x, y * scale))
                .collect();
            (d, pts)
        })
        .collect();
    Ok(Some(crate::svgchart::lines(
        "Each domain over time (host samples)",
        "seconds since the start",
        label,
        &series,
    )))
}

/// Which rows of an interval kind a chart shows, under what series name,
/// and the chart's title.
type Keep = fn(&vmscope_store::IntervalRow) -> Option<String>;

fn interval_series(kind: &str) -> (&'static str, Keep) {
    match kind {
        "stat" => (
            "vm-stat: each domain's CPU over time (summed over host CPUs)",
            |r| (r.metric == "time").then(|| r.domain.clone()).flatten(),
        ),
        "account" => ("Accounting: each VM's vCPU run and charged time", |r| {
            (r.vcpu.is_none() && matches!(r.metric.as_str(), "vcpu_run" | "total"))
                .then(|| r.domain.as_ref().map(|d| format!("{d} {}", r.metric)))
                .flatten()
        }),
        "history" => ("History: each domain's CPU, steal and I/O", |r| {
            r.domain.as_ref().map(|d| format!("{d} {}", r.metric))
        }),
        "profiler" => ("Profilers: each one's", |r| {
            Some(format!(
                "{} {}",
                r.domain.as_deref().unwrap_or("host"),
                r.metric
            ))
        }),
        _ => ("Interval values", |r| {
            r.cpu.is_none().then(|| {
                format!(
                    "{} {}{}",
                    r.domain.as_deref().unwrap_or("host"),
                    r.metric,
                    r.vcpu
                        .as_deref()
                        .map(|v| format!(" vCPU {v}"))
                        .unwrap_or_default()
                )
            })
        }),
    }
}

/// Interval metrics as lines over time, one chart per unit: for `stat`
/// (vm-stat, one row per host CPU and cell) each domain's time summed over
/// host CPUs, for `account` each VM's charged and run time, for `profiler`
/// each profiler's rate (Hz) apart from its cost and capacity (CPUs);
/// other kinds one line per domain and metric. Seconds are plotted per
/// second of their interval (CPUs), rates as they are.
fn interval_charts(session: &Session, kind: &str) -> Result<Vec<String>, ReportError> {
    let rows = session.intervals(Some(kind))?;
    let (title, keep) = interval_series(kind);
    // unit -> series -> interval start bits -> span
    let mut per: BTreeMap<String, BTreeMap<String, BTreeMap<u64, overtime::Span>>> =
        BTreeMap::new();
    for r in &rows {
        let Some(name) = keep(r) else { continue };
        let len = r.t_end - r.t_start;
        if len <= 0.0 || !r.value.is_finite() {
            continue;
        }
        let amount = if overtime::is_amount(&r.unit) {
            r.value
        } else {
            r.value * len
        };
        let e = per
            .entry(r.unit.clone())
            .or_default()
            .entry(name)
            .or_default()
            .entry(r.t_start.to_bits())
            .or_insert(overtime::Span {
                t0: r.t_start,
                t1: r.t_end,
                amount: 0.0,
            });
        e.amount += amount;
    }
    Ok(per
        .into_iter()
        .map(|(unit, series)| {
            let series: Vec<(String, Vec<(f64, f64)>)> = series
                .into_iter()
                .take(8)
                .map(|(n, spans)| (n, overtime::per_second(spans.into_values().collect())))
                .collect();
            let title = match (kind, overtime::is_amount(&unit)) {
                ("profiler", true) => {
                    format!("{title} CPU cost and the CPU it observed (capacity)")
                }
                ("profiler", false) => format!("{title} sampling rate"),
                _ => title.to_string(),
            };
            let label = if overtime::is_amount(&unit) {
                "CPUs (seconds per second)".to_string()
            } else {
                unit
            };
            crate::svgchart::lines(&title, "seconds since the start", &label, &series)
        })
        .collect())
}

/// Culprits given a column of the matrix (the rest in `other`).
const MATRIX_COLS: usize = 7;

/// Who waited behind whom in an accounting session: one row per VM, one
/// column per culprit (the most waited-behind overall, the rest `other`),
/// seconds of its vCPUs' steal per second in each cell.
fn wait_matrix(session: &Session) -> Result<Option<String>, ReportError> {
    let rows = session.intervals(Some("account"))?;
    let summaries = crate::intervals::summarize(&rows);
    let Some(s) = summaries.iter().find(|s| s.kind == "account") else {
        return Ok(None);
    };
    let cells: Vec<&crate::intervals::WaitCell> =
        s.waits.iter().filter(|c| c.threads == "vcpu").collect();
    if cells.is_empty() {
        return Ok(None);
    }
    let mut by_culprit: BTreeMap<&str, f64> = BTreeMap::new();
    for c in &cells {
        *by_culprit.entry(&c.culprit).or_default() += c.per_second;
    }
    let mut order: Vec<(&str, f64)> = by_culprit.into_iter().collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let mut cols: Vec<String> = order
        .iter()
        .take(MATRIX_COLS)
        .map(|(c, _)| (*c).to_string())
        .collect();
    let folded = order.len() > MATRIX_COLS;
    if folded {
        cols.push(format!("{} more", order.len() - MATRIX_COLS));
    }
    let mut waiters: Vec<String> = cells.iter().map(|c| c.waiter.clone()).collect();
    waiters.dedup();
    let values: Vec<Vec<f64>> = waiters
        .iter()
        .map(|w| {
            let mut row = vec![0.0; cols.len()];
            for c in cells.iter().filter(|c| &c.waiter == w) {
                let at = cols
                    .iter()
                    .take(MATRIX_COLS)
                    .position(|x| *x == c.culprit)
                    .unwrap_or(cols.len() - 1);
                row[at] += c.per_second;
            }
            row
        })
        .collect();
    Ok(Some(crate::svgchart::matrix(
        "Who waited behind whom: each VM's vCPU steal by what ran instead",
        "CPUs (seconds of waiting per second)",
        &waiters,
        &cols,
        &values,
    )))
}

fn bench_charts(session: &Session) -> Result<Vec<String>, ReportError> {
    let rows = session.bench_samples()?;
    let mut per: BTreeMap<(String, String, String), BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for b in rows {
        per.entry((b.experiment, b.metric, b.unit))
            .or_default()
            .entry(b.point)
            .or_default()
            .push(b.value);
    }
    Ok(per
        .into_iter()
        .map(|((exp, metric, unit), points)| {
            let cats: Vec<String> = points.keys().cloned().collect();
            let means: Vec<f64> = points
                .values()
                .map(|v| v.iter().sum::<f64>() / v.len().max(1) as f64)
                .collect();
            crate::svgchart::bars(
                &format!("{exp}: {metric} (mean of samples)"),
                &unit,
                &cats,
                std::slice::from_ref(&metric),
                &[means],
            )
        })
        .collect())
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1200px}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}\
pre.header{background:#f6f6f6;padding:.6em;font-size:.85em;white-space:pre-wrap}\
table{border-collapse:collapse;font-size:.88em}td,th{padding:.15em .6em;text-align:left;border-bottom:1px solid #eee}\
td.n{text-align:right;font-variant-numeric:tabular-nums}th,td:not(:last-child){white-space:nowrap}\
.bar{display:inline-block;height:.7em;background:#e69f00;margin-right:.4em;vertical-align:middle;max-width:100px}\
iframe.flame{width:100%;height:520px;border:1px solid #ccc}.note{color:#666;font-size:.9em}\
nav a{margin-right:1em}";

/// Write the page for a session in `opts`' view, slice and filters.
pub fn write(
    session: &Session,
    opts: &ReportOptions,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    // Five reports of one session: each repeated query answered once.
    let _held = session.hold_results();
    let with = |by: &[GroupKey], limit: Option<usize>| -> Result<Report, ReportError> {
        let mut o = opts.clone();
        o.by = by.to_vec();
        o.limit = limit;
        o.min_percent = 0.0;
        if o.event.is_none() {
            o.event = session.events()?.first().map(|e| e.name.clone());
        }
        build(session, &o, false)
    };
    let f = |x: Field| GroupKey::Field(x);
    let domains = with(&[f(Field::Domain)], None)?;
    let contexts = with(&[f(Field::Domain), f(Field::Context)], None)?;
    let top = with(
        &[f(Field::Domain), f(Field::Image), f(Field::Symbol)],
        Some(25),
    )?;
    let classes = with(&[f(Field::Domain), GroupKey::Class], Some(20))?;
    let mut full = opts.clone();
    full.limit = None;
    full.by = vec![f(Field::Domain)];
    let stacks = build(session, &full, true)?;
    let event = stacks
        .events
        .first()
        .map(|e| e.name.clone())
        .unwrap_or_default();
    let title = format!("vmscope report: {}", stacks.file);

    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<!-- {} -->\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"generator\" content=\"vmscope\"><title>{}</title><style>{STYLE}</style></head><body>",
        vmscope_store::output::MARKER,
        esc(&title)
    );
    let _ = writeln!(h, "<h1>{}</h1>", esc(&title));
    // A session of intervals only (stat -o, account -o): its header and its
    // charts; nothing about samples, which it has none of.
    let samples = !stacks.rows.is_empty() || !domains.rows.is_empty();
    if samples {
        h.push_str("<nav><a href=\"#domains\">Domains</a><a href=\"#functions\">Top functions</a><a href=\"#classes\">Classes</a><a href=\"#flame\">Flame graphs</a><a href=\"#time\">Over time</a></nav>");
    }
    let _ = writeln!(
        h,
        "<pre class=\"header\">{}</pre>",
        esc(&header_lines(&stacks).join("\n"))
    );
    if !samples {
        h.push_str("<p class=\"note\">This session holds intervals (what <code>vmscope stat -o</code> and <code>vmscope account -o</code> write), no samples: its charts are below. <code>vmscope record</code> samples functions and call stacks.</p>\n");
        write_time_charts(session, &event, &mut h)?;
        finish_page(&stacks, &mut h);
        out.write_all(h.as_bytes())?;
        return Ok(());
    }
    let _ = write!(
        h,
        "<h2 id=\"domains\">Domains ({})</h2>\n{}<h2>Domains and contexts</h2>\n{}",
        esc(&event),
        table(&domains, "t-domains"),
        table(&contexts, "t-contexts")
    );
    let _ = write!(
        h,
        "<h2 id=\"functions\">Top functions</h2>\n{}<h2 id=\"classes\">Function classes</h2>\n{}",
        table(&top, "t-functions"),
        table(&classes, "t-classes")
    );

    h.push_str("<h2 id=\"flame\">Flame graphs</h2>\n");
    if !crate::flame::has_stacks(&stacks) {
        h.push_str("<p class=\"note\">This session has no call stacks (recorded without -g): the graphs show domain, process and function only. <code>vmscope record -g</code> records each sample's stack.</p>");
    }
    let mut svg = Vec::new();
    if crate::flame::svg(&stacks.stacks, &event, "The whole machine", None, &mut svg).is_ok() {
        h.push_str(&flame_frame("The whole machine", &svg));
    }
    for d in &domains.rows {
        let dom = &d.values[0];
        let lines: Vec<_> = stacks
            .stacks
            .iter()
            .filter(|s| s.frames.split(';').next() == Some(dom.as_str()))
            .cloned()
            .collect();
        let mut svg = Vec::new();
        let t = format!("Domain {dom}");
        if crate::flame::svg(&lines, &event, &t, None, &mut svg).is_ok() {
            let _ = write!(h, "<h3>{}</h3>\n{}", esc(&t), flame_frame(&t, &svg));
        }
    }

    write_time_charts(session, &event, &mut h)?;
    finish_page(&stacks, &mut h);
    out.write_all(h.as_bytes())?;
    Ok(())
}

/// The "Over time" section: the per-second timeline of `event` (when the
/// session has samples), the interval charts and the benchmark charts.
fn write_time_charts(session: &Session, event: &str, h: &mut String) -> Result<(), ReportError> {
    h.push_str("<h2 id=\"time\">Over time</h2>\n");
    let events = session.events()?;
    let ev_index = crate::event_index(session, Some(event)).unwrap_or(0);
    let freq = events.get(ev_index as usize).and_then(|e| e.frequency);
    if !events.is_empty() {
        match timeline(session, ev_index, crate::is_clock(event), freq)? {
            Some(svg) => {
                h.push_str(&svg);
                h.push('\n');
            }
            None => h.push_str("<p class=\"note\">No per-second counts in this session.</p>"),
        }
    }
    for kind in session.interval_kinds()? {
        let charts = interval_charts(session, &kind)?;
        if !charts.is_empty() {
            let _ = writeln!(h, "<h3>{}</h3>", esc(&kind));
        }
        for svg in charts {
            let _ = writeln!(h, "{svg}");
        }
        if kind == "account" {
            if let Some(svg) = wait_matrix(session)? {
                let _ = writeln!(h, "{svg}");
            }
        }
    }
    let bench = bench_charts(session)?;
    if !bench.is_empty() {
        h.push_str("<h2>Benchmarks</h2>\n");
        for b in bench {
            h.push_str(&b);
            h.push('\n');
        }
    }
    Ok(())
}

/// The page's last line: which vmscope wrote it, from which session.
fn finish_page(stacks: &Report, h: &mut String) {
    let _ = writeln!(
        h,
        "<p class=\"note\">Written by {} from {}.</p></body></html>",
        esc(stacks
            .meta
            .get("vmscope_version")
            .map_or("vmscope", String::as_str)),
        esc(&stacks.file)
    );
}
