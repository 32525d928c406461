//! `vmscope compare BASE OTHER…`: configurations side by side, as menon2005
//! §6 compares them (Figs 4-6, Tables 5 and 8):
//!
//! - each event's total count in every session, normalized to BASE;
//! - the miss rate per instruction of each miss event (misses ÷
//!   instructions) and its ratio to BASE's;
//! - the instruction cost ratio: instructions ratio ÷ throughput ratio,
//!   with throughputs from `--throughput` or from the sessions' benchmark
//!   samples (metric `throughput`);
//! - per-key deltas (domain, context, class or symbol): each session's
//!   share of the compared event, and the change against BASE in points,
//!   largest movers first.
//!
//! Events are matched by name; what only some sessions have is listed
//! with what it leaves out. With cpu-clock alone it compares CPU time and
//! says which ratios need which missing hardware events.

use crate::render::{count_text, count_title};
use crate::{event_index, is_clock, GroupKey, Grouper, ReportError, ReportOptions};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;
use vmscope_store::{Session, View};

/// Events that count misses (rate = misses per instruction).
pub const MISS_EVENTS: [&str; 6] = [
    "cache-misses",
    "LLC-load-misses",
    "dTLB-load-misses",
    "iTLB-load-misses",
    "branch-misses",
    "L1-dcache-load-misses",
];

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Keys of the per-key deltas (default: symbol).
    pub by: Vec<GroupKey>,
    /// Throughput of each session, BASE first (any unit, the same for all).
    pub throughput: Option<Vec<f64>>,
    /// Event of the deltas (default: the first event all sessions have).
    pub event: Option<String>,
    pub view: View,
    /// Delta rows shown.
    pub limit: usize,
    /// Report options (class rules, full paths) for the deltas.
    pub report: ReportOptions,
}

/// One event across the sessions.
#[derive(Debug, Clone, Serialize)]
pub struct EventRow {
    pub event: String,
    pub unit: String,
    /// Event count per session (BASE first).
    pub counts: Vec<u64>,
    pub samples: Vec<u64>,
    /// counts ÷ BASE's count.
    pub normalized: Vec<f64>,
}

/// Misses per instruction.
#[derive(Debug, Clone, Serialize)]
pub struct MissRate {
    pub event: String,
    /// Per session: misses ÷ instructions.
    pub rate: Vec<f64>,
    /// rate ÷ BASE's rate.
    pub ratio: Vec<f64>,
}

/// One key's shares.
#[derive(Debug, Clone, Serialize)]
pub struct DeltaRow {
    pub values: Vec<String>,
    /// Share of the event in each session, percent.
    pub percent: Vec<f64>,
    /// Event count in each session.
    pub counts: Vec<u64>,
    /// percent − BASE's percent, per other session.
    pub delta: Vec<f64>,
}

/// The comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Session files, BASE first.
    pub sessions: Vec<String>,
    pub durations_s: Vec<Option<f64>>,
    pub events: Vec<EventRow>,
    /// Events some sessions lack, with what that leaves out.
    pub not_compared: Vec<String>,
    pub miss_rates: Vec<MissRate>,
    pub throughput: Option<Vec<f64>>,
    /// Where the throughputs came from.
    pub throughput_source: Option<String>,
    /// Instruction cost ratio per session (BASE = 1).
    pub instruction_cost_ratio: Option<Vec<f64>>,
    /// Ratios that could not be computed and what they need.
    pub needs: Vec<String>,
    pub delta_event: String,
    pub by: Vec<String>,
    pub deltas: Vec<DeltaRow>,
    pub omitted_deltas: usize,
}

fn name_of(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// Mean of the sessions' benchmark `throughput` samples, if any.
fn bench_throughput(s: &Session) -> Result<Option<f64>, ReportError> {
    let v: Vec<f64> = s
        .bench_samples()?
        .into_iter()
        .filter(|b| b.metric == "throughput")
        .map(|b| b.value)
        .collect();
    Ok((!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64))
}

/// Compare `sessions` (BASE first).
pub fn compare(sessions: &[Session], opts: &CompareOptions) -> Result<Comparison, ReportError> {
    if sessions.len() < 2 {
        return Err(ReportError::Compare(
            "compare needs a base session and at least one other".into(),
        ));
    }
    let n = sessions.len();
    let names: Vec<String> = sessions.iter().map(|s| name_of(s.path())).collect();
    // Events by name in each session: (index, samples, count).
    let mut per: Vec<HashMap<String, (u32, u64, u64)>> = Vec::with_capacity(n);
    let mut order: Vec<String> = Vec::new();
    for (s, name) in sessions.iter().zip(&names) {
        if s.events()?.is_empty() {
            return Err(ReportError::Compare(format!(
                "{name} holds no samples (a session of intervals, written by stat -o or account -o): \
                 compare sets recorded sessions (record, import) against each other; read it with vmscope report {name}"
            )));
        }
        let totals = s.totals(opts.view)?;
        let mut m = HashMap::new();
        for (i, e) in s.events()?.into_iter().enumerate() {
            let (samples, count) = totals.get(&(i as u32)).copied().unwrap_or((0, 0));
            if !order.contains(&e.name) {
                order.push(e.name.clone());
            }
            m.insert(e.name, (i as u32, samples, count));
        }
        per.push(m);
    }
    let common: Vec<String> = order
        .iter()
        .filter(|e| per.iter().all(|m| m.contains_key(*e)))
        .cloned()
        .collect();
    let mut not_compared = Vec::new();
    for e in order.iter().filter(|e| !common.contains(e)) {
        let have: Vec<&str> = names
            .iter()
            .zip(&per)
            .filter(|(_, m)| m.contains_key(e))
            .map(|(n, _)| n.as_str())
            .collect();
        let lack: Vec<&str> = names
            .iter()
            .zip(&per)
            .filter(|(_, m)| !m.contains_key(e))
            .map(|(n, _)| n.as_str())
            .collect();
        not_compared.push(format!(
            "{e}: recorded in {} but not in {}: not compared{}",
            have.join(", "),
            lack.join(", "),
            if e == "instructions" {
                " (so no miss rates per instruction and no instruction cost ratio)"
            } else if MISS_EVENTS.contains(&e.as_str()) {
                " (so no miss rate for it)"
            } else {
                ""
            }
        ));
    }
    if common.is_empty() {
        let lists: Vec<String> = names
            .iter()
            .zip(&per)
            .map(|(n, m)| {
                let mut ev: Vec<&str> = m.keys().map(String::as_str).collect();
                ev.sort_unstable();
                format!("{n} has {}", ev.join(", "))
            })
            .collect();
        return Err(ReportError::Compare(format!(
            "the sessions have no event in common, so nothing can be compared: {}; record them with the same -e events",
            lists.join("; ")
        )));
    }
    let events: Vec<EventRow> = common
        .iter()
        .map(|e| {
            let counts: Vec<u64> = per.iter().map(|m| m[e].2).collect();
            let samples: Vec<u64> = per.iter().map(|m| m[e].1).collect();
            let base = counts[0] as f64;
            EventRow {
                event: e.clone(),
                unit: crate::event_unit(e).into(),
                normalized: counts
                    .iter()
                    .map(|&c| {
                        if base > 0.0 {
                            c as f64 / base
                        } else {
                            f64::NAN
                        }
                    })
                    .collect(),
                counts,
                samples,
            }
        })
        .collect();
    let count_of = |e: &str| events.iter().find(|r| r.event == e);
    let mut needs = Vec::new();
    let instr = count_of("instructions");
    let mut miss_rates = Vec::new();
    for m in MISS_EVENTS {
        let (Some(ins), Some(miss)) = (instr, count_of(m)) else {
            continue;
        };
        let rate: Vec<f64> = miss
            .counts
            .iter()
            .zip(&ins.counts)
            .map(|(&a, &b)| if b > 0 { a as f64 / b as f64 } else { f64::NAN })
            .collect();
        let ratio = rate.iter().map(|r| r / rate[0]).collect();
        miss_rates.push(MissRate {
            event: m.into(),
            rate,
            ratio,
        });
    }
    if instr.is_none() {
        needs.push("miss rates per instruction need `instructions` and a miss event (cache-misses, LLC-load-misses, dTLB-load-misses, iTLB-load-misses) in every session: record with -e instructions -e dTLB-load-misses …".into());
        needs.push(if opts.throughput.is_some() {
            "the instruction cost ratio needs `instructions` in every session (the throughputs are given)".into()
        } else {
            "the instruction cost ratio needs `instructions` in every session and throughputs (--throughput B,O… or a benchmark's samples)".into()
        });
    } else if miss_rates.is_empty() {
        needs.push("miss rates per instruction need a miss event (cache-misses, LLC-load-misses, dTLB-load-misses, iTLB-load-misses) in every session".into());
    }
    // Throughputs: given, else from benchmark samples.
    let (throughput, throughput_source) = if let Some(t) = &opts.throughput {
        if t.len() != n {
            return Err(ReportError::Compare(format!(
                "--throughput has {} values for {n} sessions: give one per session, BASE first",
                t.len()
            )));
        }
        if let Some(bad) = t.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(ReportError::Compare(format!(
                "--throughput: {bad} is not a positive number"
            )));
        }
        (Some(t.clone()), Some("--throughput".to_string()))
    } else {
        // Else from the sessions' benchmark samples, when all have them.
        let found: Vec<Option<f64>> = sessions
            .iter()
            .map(bench_throughput)
            .collect::<Result<_, _>>()?;
        if found.iter().all(Option::is_some) {
            (
                Some(found.into_iter().flatten().collect()),
                Some("benchmark samples (metric throughput)".to_string()),
            )
        } else {
            (None, None)
        }
    };
    let instruction_cost_ratio = match (instr, &throughput) {
        (Some(ins), Some(t)) => Some(
            ins.normalized
                .iter()
                .zip(t)
                .map(|(r, tp)| r / (tp / t[0]))
                .collect(),
        ),
        (Some(_), None) => {
            needs.push("the instruction cost ratio needs throughputs: --throughput B,O… (one per session, BASE first)".into());
            None
        }
        _ => None,
    };
    let durations_s: Vec<Option<f64>> = sessions
        .iter()
        .map(|s| {
            Ok(s.meta()?
                .get("duration_s")
                .and_then(|d| d.parse::<f64>().ok()))
        })
        .collect::<Result<_, ReportError>>()?;

    // Deltas.
    let delta_event = match &opts.event {
        Some(e) => {
            if !common.iter().any(|c| c.eq_ignore_ascii_case(e)) {
                return Err(ReportError::Compare(format!(
                    "-e {e}: not an event every session has; they share: {}",
                    common.join(", ")
                )));
            }
            common
                .iter()
                .find(|c| c.eq_ignore_ascii_case(e))
                .cloned()
                .unwrap_or_default()
        }
        None => common[0].clone(),
    };
    let by: Vec<GroupKey> = if opts.by.is_empty() {
        vec![GroupKey::Field(vmscope_store::Field::Symbol)]
    } else {
        opts.by.clone()
    };
    let grouper = Grouper::new(&by);
    let mut rows: HashMap<Vec<String>, DeltaRow> = HashMap::new();
    let mut ropts = opts.report.clone();
    ropts.view = opts.view;
    for (si, s) in sessions.iter().enumerate() {
        let ev = event_index(s, Some(&delta_event))?;
        let total = per[si][&delta_event].2;
        for (values, _samples, period) in grouper.query(s, &ropts, ev)? {
            let r = rows.entry(values.clone()).or_insert_with(|| DeltaRow {
                values,
                percent: vec![0.0; n],
                counts: vec![0; n],
                delta: vec![0.0; n - 1],
            });
            r.counts[si] += period;
            if total > 0 {
                r.percent[si] += 100.0 * period as f64 / total as f64;
            }
        }
    }
    let mut deltas: Vec<DeltaRow> = rows
        .into_values()
        .map(|mut r| {
            r.delta = r.percent[1..].iter().map(|p| p - r.percent[0]).collect();
            r
        })
        .collect();
    let key = |r: &DeltaRow| r.delta.iter().fold(0.0f64, |m, d| m.max(d.abs()));
    deltas.sort_by(|a, b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.values.cmp(&b.values))
    });
    let omitted_deltas = deltas.len().saturating_sub(opts.limit);
    deltas.truncate(opts.limit);
    Ok(Comparison {
        sessions: names,
        durations_s,
        events,
        not_compared,
        miss_rates,
        throughput,
        throughput_source,
        instruction_cost_ratio,
        needs,
        delta_event,
        by: by.iter().map(|k| k.name().to_string()).collect(),
        deltas,
        omitted_deltas,
    })
}

fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "n/a".into()
    }
}

/// Short labels for the columns: `BASE`, `#1`, `#2`…
fn labels(c: &Comparison) -> Vec<String> {
    (0..c.sessions.len())
        .map(|i| {
            if i == 0 {
                "BASE".into()
            } else {
                format!("#{i}")
            }
        })
        .collect()
}

fn table(rows: &[Vec<String>], right: usize, out: &mut dyn Write) -> std::io::Result<()> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut w = vec![0; cols];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i == r.len() - 1 && i >= right {
                line.push_str(c);
            } else if i < right {
                line.push_str(&format!("{c:<w$}", w = w[i]));
            } else {
                line.push_str(&format!("{c:>w$}", w = w[i]));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// Print the comparison as text.
pub fn render_table(c: &Comparison, out: &mut dyn Write) -> Result<(), ReportError> {
    let l = labels(c);
    for (i, s) in c.sessions.iter().enumerate() {
        let d = c.durations_s[i].map_or(String::new(), |d| format!(" ({d:.2} s)"));
        writeln!(out, "# {:<5} {s}{d}", l[i])?;
    }
    writeln!(out, "#")?;
    writeln!(
        out,
        "# event counts, normalized to BASE (menon2005 Figs 4-6)"
    )?;
    let mut rows = vec![{
        let mut h = vec!["event".to_string(), "unit".into()];
        h.extend(l.iter().map(|x| format!("{x} count")));
        h.extend(l[1..].iter().map(|x| format!("{x}/BASE")));
        h
    }];
    for e in &c.events {
        let mut r = vec![e.event.clone(), count_title(&e.event).into()];
        r.extend(e.counts.iter().map(|&v| count_text(&e.event, v)));
        r.extend(e.normalized[1..].iter().map(|&v| ratio(v)));
        rows.push(r);
    }
    table(&rows, 2, out)?;
    for n in &c.not_compared {
        writeln!(out, "# not compared: {n}")?;
    }
    if !c.miss_rates.is_empty() {
        writeln!(out, "#\n# miss rate per instruction")?;
        let mut rows = vec![{
            let mut h = vec!["event".to_string()];
            h.extend(l.iter().cloned());
            h.extend(l[1..].iter().map(|x| format!("{x}/BASE")));
            h
        }];
        for m in &c.miss_rates {
            let mut r = vec![m.event.clone()];
            r.extend(m.rate.iter().map(|v| format!("{v:.6}")));
            r.extend(m.ratio[1..].iter().map(|&v| ratio(v)));
            rows.push(r);
        }
        table(&rows, 1, out)?;
    }
    if let Some(t) = &c.throughput {
        writeln!(
            out,
            "#\n# throughput ({}): {}",
            c.throughput_source.as_deref().unwrap_or(""),
            t.iter()
                .zip(&l)
                .map(|(v, x)| format!("{x} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    if let Some(icr) = &c.instruction_cost_ratio {
        writeln!(
            out,
            "# instruction cost ratio (instructions ratio / throughput ratio): {}",
            icr[1..]
                .iter()
                .zip(&l[1..])
                .map(|(v, x)| format!("{x} {}", ratio(*v)))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    for n in &c.needs {
        writeln!(out, "# needs: {n}")?;
    }
    writeln!(
        out,
        "#\n# {} by {}: share of each session's {}, change against BASE in points, largest first",
        c.delta_event,
        c.by.join(","),
        c.delta_event
    )?;
    let mut rows = vec![{
        let mut h: Vec<String> = l.iter().map(|x| format!("{x} %")).collect();
        h.extend(l[1..].iter().map(|x| format!("{x} Δ")));
        h.push(c.by.join(" "));
        h
    }];
    for d in &c.deltas {
        let mut r: Vec<String> = d.percent.iter().map(|p| format!("{p:.2}")).collect();
        r.extend(d.delta.iter().map(|p| format!("{p:+.2}")));
        r.push(d.values.join("  "));
        rows.push(r);
    }
    table(&rows, 0, out)?;
    if c.omitted_deltas > 0 {
        writeln!(out, "# {} more rows below --limit", c.omitted_deltas)?;
    }
    Ok(())
}

/// Print the comparison as CSV: one table of events, one of deltas.
pub fn render_csv(c: &Comparison, out: &mut dyn Write) -> Result<(), ReportError> {
    let l = labels(c);
    let mut w = csv::WriterBuilder::new().flexible(true).from_writer(out);
    let mut h = vec!["table".to_string(), "key".into(), "unit".into()];
    for x in &l {
        h.push(format!("{x} value"));
        h.push(format!("{x} normalized"));
    }
    w.write_record(&h)?;
    for e in &c.events {
        let mut r = vec!["event".to_string(), e.event.clone(), e.unit.clone()];
        for (v, nrm) in e.counts.iter().zip(&e.normalized) {
            r.push(v.to_string());
            r.push(format!("{nrm:.6}"));
        }
        w.write_record(&r)?;
    }
    for m in &c.miss_rates {
        let mut r = vec![
            "miss_rate".to_string(),
            m.event.clone(),
            "per instruction".into(),
        ];
        for (v, x) in m.rate.iter().zip(&m.ratio) {
            r.push(format!("{v:.9}"));
            r.push(format!("{x:.6}"));
        }
        w.write_record(&r)?;
    }
    if let Some(icr) = &c.instruction_cost_ratio {
        let mut r = vec![
            "instruction_cost".to_string(),
            "ratio".into(),
            String::new(),
        ];
        for v in icr {
            r.push(String::new());
            r.push(format!("{v:.6}"));
        }
        w.write_record(&r)?;
    }
    for d in &c.deltas {
        let mut r = vec!["delta".to_string(), d.values.join(" "), "percent".into()];
        for (i, p) in d.percent.iter().enumerate() {
            r.push(format!("{p:.4}"));
            r.push(if i == 0 {
                String::new()
            } else {
                format!("{:+.4}", d.delta[i - 1])
            });
        }
        w.write_record(&r)?;
    }
    w.flush()?;
    Ok(())
}

/// The normalized counts as a bar chart (menon2005 Fig 4's shape).
pub fn svg(c: &Comparison) -> String {
    let cats: Vec<String> = c.events.iter().map(|e| e.event.clone()).collect();
    let series: Vec<String> = c
        .sessions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let base = std::path::Path::new(s)
                .file_name()
                .map_or(s.clone(), |f| f.to_string_lossy().into_owned());
            if i == 0 {
                format!("{base} (BASE)")
            } else {
                base
            }
        })
        .collect();
    let values: Vec<Vec<f64>> = (0..c.sessions.len())
        .map(|s| c.events.iter().map(|e| e.normalized[s]).collect())
        .collect();
    crate::svgchart::bars(
        "Relative event counts (BASE = 1)",
        "count / BASE's count",
        &cats,
        &series,
        &values,
    )
}

/// Clock-only comparisons in words, for the summary.
pub fn is_time_only(c: &Comparison) -> bool {
    c.events.iter().all(|e| is_clock(&e.event))
}
