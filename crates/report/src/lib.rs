//! Reports of a stored session (docs/architecture.md §3, outputs).
//!
//! [`build`] turns a [`Session`] and [`ReportOptions`] into a [`Report`], a
//! plain table of grouped counts per event with a header; printers
//! ([`render`]) write it as an opreport-style table, JSON, CSV or collapsed
//! stacks. Building never formats and printers never query: new formats only
//! add a printer.

pub mod intervals;
mod render;
mod side;

pub use render::render;
pub use side::{build_side_by_side, render_side_by_side, Half, SideBySide};

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use vmscope_store::{Field, Session, StoreError, View};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("unknown field '{0}' in --by; fields: domain, context, process, image, symbol")]
    UnknownField(String),
    #[error("event '{wanted}' is not in this session; it has: {have}")]
    UnknownEvent { wanted: String, have: String },
    #[error("unknown format '{0}'; formats: table, json, csv, collapsed")]
    UnknownFormat(String),
    #[error("no domain '{wanted}' in this session; it has: {have}")]
    UnknownDomain { wanted: String, have: String },
    #[error("writing the report: {0}")]
    Io(#[from] std::io::Error),
    #[error("writing CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportFormat {
    Table,
    Json,
    Csv,
    /// `frame;frame;frame count` lines for flame graph tools.
    Collapsed,
}

impl std::str::FromStr for ReportFormat {
    type Err = ReportError;
    fn from_str(s: &str) -> Result<ReportFormat, ReportError> {
        match s {
            "table" | "text" => Ok(ReportFormat::Table),
            "json" => Ok(ReportFormat::Json),
            "csv" => Ok(ReportFormat::Csv),
            "collapsed" => Ok(ReportFormat::Collapsed),
            _ => Err(ReportError::UnknownFormat(s.into())),
        }
    }
}

/// What to report.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// Grouping fields; empty = default (`image,symbol`, with `domain` first
    /// when the session has VMs).
    pub by: Vec<Field>,
    /// Only this event (by name); all events side by side otherwise.
    pub event: Option<String>,
    pub limit: Option<usize>,
    /// Drop rows below this share (of the first shown event).
    pub min_percent: f64,
    /// Keep full image paths instead of basenames.
    pub full_paths: bool,
    /// Only rows whose field equals the value.
    pub filter: Vec<(Field, String)>,
    /// Merged (default), host-only or agent-only measurements.
    pub view: View,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            by: Vec::new(),
            event: None,
            limit: None,
            min_percent: 0.0,
            full_paths: false,
            filter: Vec::new(),
            view: View::Merged,
        }
    }
}

/// Parse `domain,context,image,symbol`.
pub fn parse_fields(s: &str) -> Result<Vec<Field>, ReportError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| Field::parse(p).ok_or_else(|| ReportError::UnknownField(p.trim().into())))
        .collect()
}

/// One event's column group.
#[derive(Debug, Clone, Serialize)]
pub struct EventColumn {
    pub index: u32,
    pub name: String,
    pub period: Option<u64>,
    pub frequency: Option<u64>,
    pub samples: u64,
    /// Sum of periods: event count (ns for clock events).
    pub event_count: u64,
    pub lost: u64,
}

/// A report row: grouping values and, per event column, samples and share.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub values: Vec<String>,
    pub samples: Vec<u64>,
    /// Share of the event count (sum of periods), in percent, as perf shows.
    pub percent: Vec<f64>,
}

/// A collapsed-stack line.
#[derive(Debug, Clone, Serialize)]
pub struct StackLine {
    pub frames: String,
    pub samples: u64,
}

/// A built report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub file: String,
    pub meta: BTreeMap<String, String>,
    pub domains: Vec<DomainSummary>,
    pub fields: Vec<String>,
    pub events: Vec<EventColumn>,
    pub rows: Vec<Row>,
    /// Rows left out by --limit / --min-percent.
    pub omitted_rows: usize,
    pub stacks: Vec<StackLine>,
    /// Which measurements the rows come from: merged, host or agent.
    pub view: String,
    /// Active VMs: what the agent measured and the scale applied.
    pub scales: Vec<ScaleSummary>,
    /// Intervals kept by `stat -o` / `account -o`, summarized.
    pub intervals: Vec<intervals::IntervalSummary>,
    /// Why there are no rows when a filter matched nothing, with the values
    /// that do exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Coordinated profiling of one active VM for one event.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleSummary {
    pub domain: String,
    pub event: String,
    pub agent_samples: u64,
    pub agent_lost: u64,
    /// Busy guest time the agent measured (event count).
    pub agent_event_count: u64,
    /// Guest time the host measured on the VM's vCPU threads.
    pub host_event_count: u64,
    pub factor: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DomainSummary {
    pub name: String,
    pub role: String,
    pub pid: Option<u32>,
    pub status: String,
    pub ended_at: Option<f64>,
    pub detail: String,
}

/// A domain filter must name a domain of the session: else an error that
/// lists the domains it has.
pub fn check_domain(session: &Session, view: View, domain: &str) -> Result<(), ReportError> {
    let have = session.values(view, Field::Domain)?;
    if have.iter().any(|d| d == domain) {
        return Ok(());
    }
    Err(ReportError::UnknownDomain {
        wanted: domain.to_string(),
        have: if have.is_empty() {
            "no domain at all".into()
        } else {
            have.join(", ")
        },
    })
}

/// Build a report from a session.
pub fn build(
    session: &Session,
    opts: &ReportOptions,
    want_stacks: bool,
) -> Result<Report, ReportError> {
    for (f, v) in &opts.filter {
        if *f == Field::Domain {
            check_domain(session, opts.view, v)?;
        }
    }
    let meta = session.meta()?;
    let events = session.events()?;
    let lost = session.lost()?;
    let totals = session.totals(opts.view)?;
    let domains: Vec<DomainSummary> = session
        .domains()?
        .into_iter()
        .map(|d| DomainSummary {
            name: d.domain.name,
            role: d.domain.role.as_str().into(),
            pid: d.domain.pid,
            status: d.status,
            ended_at: d.ended_at,
            detail: d.detail,
        })
        .collect();

    let selected: Vec<u32> = match &opts.event {
        Some(want) => {
            let i = events
                .iter()
                .position(|e| e.name.eq_ignore_ascii_case(want))
                .ok_or_else(|| ReportError::UnknownEvent {
                    wanted: want.clone(),
                    have: events
                        .iter()
                        .map(|e| e.name.clone())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            vec![i as u32]
        }
        None => (0..events.len() as u32).collect(),
    };
    let columns: Vec<EventColumn> = selected
        .iter()
        .map(|&i| {
            let e = &events[i as usize];
            let (samples, event_count) = totals.get(&i).copied().unwrap_or((0, 0));
            EventColumn {
                index: i,
                name: e.name.clone(),
                period: e.period,
                frequency: e.frequency,
                samples,
                event_count,
                lost: lost.get(&i).copied().unwrap_or(0),
            }
        })
        .collect();

    let fields: Vec<Field> = if opts.by.is_empty() {
        let mut f = vec![Field::Image, Field::Symbol];
        if domains.iter().any(|d| d.name != vmscope_model::HOST_DOMAIN) {
            f.insert(0, Field::Domain);
        }
        f
    } else {
        opts.by.clone()
    };

    // Merge the per-event groupings into rows keyed by their values.
    let mut index: HashMap<Vec<String>, usize> = HashMap::new();
    let mut rows: Vec<Row> = Vec::new();
    for (ci, col) in columns.iter().enumerate() {
        for g in session.grouped(opts.view, col.index, &fields, &opts.filter)? {
            let values: Vec<String> = g
                .values
                .iter()
                .zip(&fields)
                .map(|(v, f)| display_value(*f, v, opts.full_paths))
                .collect();
            let ri = *index.entry(values.clone()).or_insert_with(|| {
                rows.push(Row {
                    values,
                    samples: vec![0; columns.len()],
                    percent: vec![0.0; columns.len()],
                });
                rows.len() - 1
            });
            rows[ri].samples[ci] += g.samples;
            if col.event_count > 0 {
                rows[ri].percent[ci] += 100.0 * g.period as f64 / col.event_count as f64;
            }
        }
    }
    rows.sort_by(|a, b| {
        b.percent
            .first()
            .partial_cmp(&a.percent.first())
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| b.samples.cmp(&a.samples))
            .then_with(|| a.values.cmp(&b.values))
    });
    let note = if rows.is_empty() && !opts.filter.is_empty() {
        let mut parts = Vec::new();
        for (f, v) in &opts.filter {
            let have = session.values(opts.view, *f)?;
            if !have.iter().any(|h| h == v) {
                parts.push(format!(
                    "no row has {} '{v}'; {}s with samples: {}",
                    f.name(),
                    f.name(),
                    if have.is_empty() {
                        "none".into()
                    } else {
                        have.join(", ")
                    }
                ));
            }
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    } else {
        None
    };
    let before = rows.len();
    rows.retain(|r| r.percent.first().copied().unwrap_or(0.0) >= opts.min_percent);
    if let Some(n) = opts.limit {
        rows.truncate(n);
    }
    let omitted_rows = before - rows.len();

    let mut stacks = Vec::new();
    if want_stacks {
        let ev = columns.first().map(|c| c.index).unwrap_or(0);
        let mut agg: BTreeMap<String, u64> = BTreeMap::new();
        for r in session.rows(opts.view, Some(ev))? {
            if !opts
                .filter
                .iter()
                .all(|(f, v)| field_of(&r.key, *f) == v.as_str())
            {
                continue;
            }
            let frames = if r.key.stack.is_empty() {
                r.key.symbol.to_string()
            } else {
                r.key.stack.to_string()
            };
            let line = format!("{};{};{}", r.key.domain, r.key.process, frames);
            *agg.entry(line).or_default() += r.samples;
        }
        stacks = agg
            .into_iter()
            .map(|(frames, samples)| StackLine { frames, samples })
            .collect();
    }

    let scales = session
        .scales()?
        .into_iter()
        .map(|s| ScaleSummary {
            event: events
                .get(s.event as usize)
                .map(|e| e.name.clone())
                .unwrap_or_else(|| format!("#{}", s.event)),
            domain: s.domain,
            agent_samples: s.agent_samples,
            agent_lost: s.agent_lost,
            agent_event_count: s.agent_period,
            host_event_count: s.host_period,
            factor: s.factor,
        })
        .collect();
    Ok(Report {
        view: match opts.view {
            View::Merged => "merged",
            View::Host => "host",
            View::Agent => "agent",
        }
        .into(),
        scales,
        // The profilers' own cost steps are shown in the header
        // (`profiler_*` metadata), not as interval tables.
        intervals: intervals::summarize(
            &session
                .intervals(None)?
                .into_iter()
                .filter(|r| r.kind != "profiler")
                .collect::<Vec<_>>(),
        ),
        file: session.path().display().to_string(),
        meta,
        domains,
        fields: fields.iter().map(|f| f.name().to_string()).collect(),
        events: columns,
        rows,
        omitted_rows,
        stacks,
        note,
    })
}

fn field_of(k: &vmscope_model::AggKey, f: Field) -> &str {
    match f {
        Field::Domain => &k.domain,
        Field::Context => k.context.as_str(),
        Field::Process => &k.process,
        Field::Image => &k.image,
        Field::Symbol => &k.symbol,
    }
}

pub(crate) fn display_value(f: Field, v: &str, full_paths: bool) -> String {
    match f {
        Field::Image if !full_paths && v.starts_with('/') => {
            v.rsplit('/').next().unwrap_or(v).to_string()
        }
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests;
