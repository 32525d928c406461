//! Reports of a stored session (docs/architecture.md §3, outputs).
//!
//! [`build`] turns a [`Session`] and [`ReportOptions`] into a [`Report`], a
//! plain table of grouped counts per event with a header; printers
//! ([`render`]) write it as an opreport-style table, JSON, CSV or collapsed
//! stacks. Building never formats and printers never query: new formats only
//! add a printer. The other modules own the other outputs: [`classes`]
//! (function classes), [`stacks`] (joined call stacks, callers and
//! callees), [`flame`] (flame graph SVG), [`pprof`] (profile.proto),
//! [`html`] (the self-contained page), [`compare`] (sessions against a
//! base), [`slice`] (`--time` and `--cpu`), [`intervals`] (what `stat -o`
//! and `account -o` kept).

pub mod classes;
pub mod compare;
pub mod flame;
pub mod html;
pub mod intervals;
pub mod overtime;
pub mod pprof;
mod render;
mod side;
pub mod slice;
pub mod stacks;
mod svgchart;

pub use classes::{ClassError, Classes};
pub use render::{render, render_call_graph};
pub use side::{build_side_by_side, render_side_by_side, Half, SideBySide, SideRow};
pub use stacks::{CallGraph, StackLine};

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use vmscope_model::coverage_meta::{HOST_STEAL_PCT, RUN_S_PREFIX, RUN_THREADS_PREFIX};
use vmscope_model::Context;
use vmscope_store::{Field, Session, Slice, StoreError, View};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("unknown field '{0}' in --by; fields: domain, context, process, image, symbol, srcline, cpu, class")]
    UnknownField(String),
    #[error("event '{wanted}' is not in this session; it has: {have}")]
    UnknownEvent { wanted: String, have: String },
    #[error("unknown format '{0}'; formats: table, json, csv, collapsed, flamegraph, pprof, html")]
    UnknownFormat(String),
    #[error("{0}")]
    Classes(#[from] ClassError),
    #[error("{what} needs call stacks, and this session has none: record with -g (`vmscope record -g …`, or `perf record -g` before `vmscope import`) to get each sample's stack")]
    NoStacks { what: String },
    #[error("{what} needs samples, and this session holds none: it is a session of intervals (stat -o, account -o); `vmscope report` prints them as a table, JSON or CSV")]
    NoSamples { what: String },
    #[error("no call stack in this session holds the function '{0}' (names as `vmscope report --by symbol` prints them)")]
    NoSuchSymbol(String),
    #[error("{0}")]
    Slice(String),
    #[error("{0}")]
    Compare(String),
    #[error("writing the flame graph: {0}")]
    Flame(String),
    #[error("the {0} format writes a file: give -o FILE")]
    NeedsOutput(&'static str),
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
    /// An interactive flame graph SVG (inferno).
    Flamegraph,
    /// pprof's profile.proto, gzipped.
    Pprof,
    /// One self-contained HTML page.
    Html,
}

impl ReportFormat {
    /// Formats written to a file (`-o`), not to a terminal.
    pub fn is_binary_file(self) -> bool {
        matches!(self, ReportFormat::Pprof)
    }
}

impl std::str::FromStr for ReportFormat {
    type Err = ReportError;
    fn from_str(s: &str) -> Result<ReportFormat, ReportError> {
        match s {
            "table" | "text" => Ok(ReportFormat::Table),
            "json" => Ok(ReportFormat::Json),
            "csv" => Ok(ReportFormat::Csv),
            "collapsed" => Ok(ReportFormat::Collapsed),
            "flamegraph" | "flame" | "svg" => Ok(ReportFormat::Flamegraph),
            "pprof" => Ok(ReportFormat::Pprof),
            "html" => Ok(ReportFormat::Html),
            _ => Err(ReportError::UnknownFormat(s.into())),
        }
    }
}

/// A grouping key of `--by`: a stored field, or the function class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKey {
    Field(Field),
    /// The function class ([`classes`]).
    Class,
}

impl GroupKey {
    pub fn name(self) -> &'static str {
        match self {
            GroupKey::Field(f) => f.name(),
            GroupKey::Class => "class",
        }
    }
}

impl From<Field> for GroupKey {
    fn from(f: Field) -> GroupKey {
        GroupKey::Field(f)
    }
}

/// What to report.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// Grouping keys; empty = default (`image,symbol`, with `domain` first
    /// when the session has VMs).
    pub by: Vec<GroupKey>,
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
    /// Only these seconds and CPUs ([`slice`]).
    pub slice: Slice,
    /// Class rules for `--by class`.
    pub classes: Classes,
    /// Keep inlined functions as stack frames (DWARF); false drops them,
    /// as perf's `--no-inline`.
    pub inline: bool,
    /// Add each domain's [`UNSAMPLED`] row (a recording of every CPU whose
    /// samples cover under [`UNSAMPLED_ROW_BELOW`] of its run time).
    pub unsampled: bool,
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
            slice: Slice::default(),
            classes: Classes::builtin(),
            inline: true,
            unsampled: false,
        }
    }
}

/// Parse `domain,context,image,symbol,class`.
pub fn parse_fields(s: &str) -> Result<Vec<GroupKey>, ReportError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| match p.trim() {
            "class" | "classes" => Ok(GroupKey::Class),
            _ => Field::parse(p)
                .map(GroupKey::Field)
                .ok_or_else(|| ReportError::UnknownField(p.trim().into())),
        })
        .collect()
}

/// Unit of an event's count: `ns` for clock events (shown as CPU
/// seconds), `events` for the rest.
pub fn event_unit(name: &str) -> &'static str {
    if is_clock(name) {
        "ns"
    } else {
        "events"
    }
}

/// cpu-clock and task-clock count nanoseconds of CPU.
pub fn is_clock(name: &str) -> bool {
    name == "cpu-clock" || name == "task-clock"
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
    /// Unit of `event_count`: `ns` (clock events) or `events`.
    pub unit: String,
    pub lost: u64,
}

/// A report row: grouping values and, per event column, samples and share.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub values: Vec<String>,
    /// Samples as taken: in the merged view an active VM's guest rows hold
    /// its agent's samples, so only `event_count` adds up across samplers.
    pub samples: Vec<u64>,
    /// Sum of periods per event (ns for clock events): what adds up to
    /// the header's total.
    pub event_count: Vec<u64>,
    /// Share of the event count (sum of periods), in percent, as perf shows.
    pub percent: Vec<f64>,
    /// Each share's 95 % interval, in percent (Wilson's score interval
    /// over the column's samples: a share of few samples is a wide range).
    pub percent_ci95: Vec<[f64; 2]>,
}

/// The label of the row holding the time the scheduler says a domain ran
/// that no sample saw.
pub const UNSAMPLED: &str = "[unsampled]";

/// A domain whose samples cover less than this of its run time gets an
/// [`UNSAMPLED`] row.
pub const UNSAMPLED_ROW_BELOW: f64 = 0.95;

/// The text table shows each share's 95 % interval when a row's is wider
/// than this (percentage points either side): a profile of few samples.
pub const SHOW_CI_ABOVE: f64 = 2.0;

/// Wilson's 95 % score interval of a share `p` (0..1) measured over `n`
/// samples, in percent.
pub fn share_ci95(p: f64, n: u64) -> [f64; 2] {
    if n == 0 {
        return [0.0, 100.0];
    }
    let (z, n) = (1.959_964, n as f64);
    let p = p.clamp(0.0, 1.0);
    let d = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / d;
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / d;
    [
        100.0 * (centre - half).max(0.0),
        100.0 * (centre + half).min(1.0),
    ]
}

impl Report {
    /// Whether the shares' intervals are worth showing beside them: some
    /// shown row's is wider than [`SHOW_CI_ABOVE`] either side.
    pub fn shows_ci(&self) -> bool {
        self.rows.iter().any(|r| {
            r.percent_ci95
                .first()
                .is_some_and(|[lo, hi]| (hi - lo) / 2.0 > SHOW_CI_ABOVE)
        })
    }
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
    /// `--time` / `--cpu`, as applied.
    pub slice: Option<slice::SliceSummary>,
    /// Where user class rules came from (with `--by class`).
    pub class_rules: Option<String>,
    /// Intervals kept by `stat -o` / `account -o`, summarized.
    pub intervals: Vec<intervals::IntervalSummary>,
    /// Per domain, the CPU time its samples stand for against what the
    /// scheduler says its threads ran over the same seconds (a recording
    /// of every CPU with a clock event; none for a slice).
    pub coverage: Vec<Coverage>,
    /// Why there are no rows when a filter matched nothing, with the values
    /// that do exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How much of a domain's run time its samples cover.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Coverage {
    pub domain: String,
    /// The CPU time the domain's host samples stand for (their event
    /// count, idle left out), seconds.
    pub sampled_s: f64,
    /// What the scheduler says the domain's threads ran meanwhile, seconds.
    pub scheduler_s: f64,
    /// `sampled_s / scheduler_s`.
    pub ratio: f64,
    /// The CPU time its samples stand for once every over-sampled thread is
    /// held to its run time (`report --unsampled`'s rows), seconds.
    pub held_s: f64,
    /// Under [`LOW_COVERAGE`]: the likely cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low: Option<String>,
    /// Per thread name of a VM (when the recording stored them): its
    /// samples against its run time, largest run first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadCoverage>,
    /// Threads sampled over [`OVER_SAMPLED`] of their run time: what it
    /// means (`report --unsampled` scales them down to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high: Option<String>,
}

/// How much of one thread's run time its samples cover.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThreadCoverage {
    /// The thread's name (its comm; threads of one name summed).
    pub thread: String,
    pub sampled_s: f64,
    pub scheduler_s: f64,
}

impl ThreadCoverage {
    /// Sampled over [`OVER_SAMPLED`] of its run time, by more than two
    /// periods' worth at 1 kHz (a thread that ran 0 s and got one sample is
    /// noise, not a finding).
    pub fn over_sampled(&self) -> bool {
        self.sampled_s > OVER_SAMPLED * self.scheduler_s
            && self.sampled_s - self.scheduler_s > 0.002
    }
}

/// A thread sampled over this share of its run time is over-sampled.
pub const OVER_SAMPLED: f64 = 1.1;

/// Coverage under this is flagged.
pub const LOW_COVERAGE: f64 = 0.9;

/// The coverage of each domain with a stored run time (`run_s_<domain>`
/// meta, written by `record -a`), from the host view of the first event
/// when it is a clock.
fn coverage(
    session: &Session,
    meta: &BTreeMap<String, String>,
    events: &[vmscope_model::SessionEvent],
) -> Result<Vec<Coverage>, ReportError> {
    if !events.first().is_some_and(|e| is_clock(&e.name)) {
        return Ok(Vec::new());
    }
    let runs: Vec<(String, f64)> = meta
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(RUN_S_PREFIX)?.to_string(), v.parse().ok()?)))
        .collect();
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let mut sampled: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_thread: HashMap<(String, String), u64> = HashMap::new();
    for g in session.grouped(
        View::Host,
        0,
        &[Field::Domain, Field::Process, Field::Context],
        &[],
    )? {
        if g.values.get(2).is_some_and(|c| c == Context::Idle.as_str()) {
            continue;
        }
        if let [d, p, ..] = g.values.as_slice() {
            *sampled.entry(d.clone()).or_default() += g.period;
            *by_thread.entry((d.clone(), p.clone())).or_default() += g.period;
        }
    }
    let lost = session.lost()?.get(&0).copied().unwrap_or(0);
    let steal = meta.get(HOST_STEAL_PCT).and_then(|s| s.parse::<f64>().ok());
    Ok(runs
        .into_iter()
        .filter(|(_, run)| *run > 0.0)
        .map(|(domain, scheduler_s)| {
            let sampled_s = sampled.get(&domain).copied().unwrap_or(0) as f64 / 1e9;
            let ratio = sampled_s / scheduler_s;
            let threads: Vec<ThreadCoverage> = meta
                .get(&format!("{RUN_THREADS_PREFIX}{domain}"))
                .map(|text| {
                    text.lines()
                        .filter_map(|l| {
                            let (secs, name) = l.split_once(' ')?;
                            let sampled = by_thread
                                .get(&(domain.clone(), name.to_string()))
                                .copied()
                                .unwrap_or(0);
                            Some(ThreadCoverage {
                                thread: name.to_string(),
                                sampled_s: sampled as f64 / 1e9,
                                scheduler_s: secs.parse().ok()?,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let over: Vec<String> = threads
                .iter()
                .filter(|t| t.over_sampled())
                .map(|t| {
                    format!(
                        "{} sampled {:.3} s of {:.3} s it ran",
                        vmscope_model::text::visible(&t.thread),
                        t.sampled_s,
                        t.scheduler_s
                    )
                })
                .collect();
            let high = (!over.is_empty()).then(|| {
                format!(
                    "{}: the kernel's sampling timer did not fire while a CPU was idle and fired on the thread that woke it (perf record is charged the same; report --unsampled holds such threads to their run time)",
                    over.join(", ")
                )
            });
            let held_s = sampled_s
                - threads
                    .iter()
                    .filter(|t| t.over_sampled())
                    .map(|t| t.sampled_s - t.scheduler_s)
                    .sum::<f64>();
            // Flagged by the held time: a VM whose vCPU is under-sampled while
            // its main loop is over-sampled reads about 100 % raw.
            let low = (held_s / scheduler_s < LOW_COVERAGE).then(|| {
                if lost > 0 {
                    format!("{lost} samples were lost (ring overflow: a larger -m, a lower rate)")
                } else if steal.is_some_and(|s| s > 5.0) {
                    "this host is itself a VM whose CPUs were stolen: its timers fire late and miss the threads' short runs".into()
                } else {
                    "its threads ran in bursts shorter than the sampling period: the timer missed them (a higher rate; report --unsampled shows the gap as a row)".into()
                }
            });
            Coverage {
                domain,
                sampled_s,
                scheduler_s,
                ratio,
                held_s,
                low,
                threads,
                high,
            }
        })
        .collect())
}

/// A factor per (domain, thread name).
type ThreadFactors = HashMap<(String, String), f64>;

/// Under `report --unsampled`: each over-sampled thread's factor, its run
/// time over its sampled time, by (domain, thread name).
fn over_sampled_factors(coverage: &[Coverage]) -> ThreadFactors {
    coverage
        .iter()
        .flat_map(|c| {
            c.threads.iter().filter(|t| t.over_sampled()).map(|t| {
                (
                    (c.domain.clone(), t.thread.clone()),
                    t.scheduler_s / t.sampled_s,
                )
            })
        })
        .collect()
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
    let totals = session.totals_in(opts.view, &opts.slice)?;
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
                unit: event_unit(&e.name).into(),
                lost: lost.get(&i).copied().unwrap_or(0),
            }
        })
        .collect();

    let fields: Vec<GroupKey> = if opts.by.is_empty() {
        let mut f = vec![Field::Image.into(), Field::Symbol.into()];
        if domains.iter().any(|d| d.name != vmscope_model::HOST_DOMAIN) {
            f.insert(0, Field::Domain.into());
        }
        f
    } else {
        opts.by.clone()
    };
    let coverage = if opts.slice == Slice::default() {
        coverage(session, &meta, &events)?
    } else {
        Vec::new()
    };
    // `--unsampled` reconciles the rows with the scheduler (first column, a
    // clock): threads sampled over their run time are held to it, and
    // what the timer missed becomes a row. Not under a filter or in the
    // agents' view, whose rows are not the host's samples.
    let reconcile = opts.unsampled
        && opts.filter.is_empty()
        && opts.view != View::Agent
        && selected.first() == Some(&0);
    let mut grouper = Grouper::new(&fields);
    if reconcile {
        grouper.hold(over_sampled_factors(&coverage));
    }

    // Merge the per-event groupings into rows keyed by their values.
    let mut index: HashMap<Vec<String>, usize> = HashMap::new();
    let mut rows: Vec<Row> = Vec::new();
    for (ci, col) in columns.iter().enumerate() {
        for (values, samples, period) in grouper.query(session, opts, col.index)? {
            let ri = *index.entry(values.clone()).or_insert_with(|| {
                rows.push(Row {
                    values,
                    samples: vec![0; columns.len()],
                    event_count: vec![0; columns.len()],
                    percent: vec![0.0; columns.len()],
                    percent_ci95: vec![[0.0, 0.0]; columns.len()],
                });
                rows.len() - 1
            });
            rows[ri].samples[ci] += samples;
            rows[ri].event_count[ci] += period;
            if col.event_count > 0 {
                rows[ri].percent[ci] += 100.0 * period as f64 / col.event_count as f64;
            }
        }
    }
    for row in &mut rows {
        for (ci, col) in columns.iter().enumerate() {
            row.percent_ci95[ci] = share_ci95(row.percent[ci] / 100.0, col.samples);
        }
    }
    // The time the timer missed, as its own row of each domain it missed:
    // the domain's rows then add up to what the scheduler says it ran.
    if reconcile {
        let total = columns.first().map_or(0, |c| c.event_count);
        for c in coverage
            .iter()
            .filter(|c| c.held_s < UNSAMPLED_ROW_BELOW * c.scheduler_s)
        {
            let gap = ((c.scheduler_s - c.held_s) * 1e9) as u64;
            let mut row = Row {
                values: fields
                    .iter()
                    .map(|f| {
                        if *f == GroupKey::from(Field::Domain) {
                            c.domain.clone()
                        } else {
                            UNSAMPLED.to_string()
                        }
                    })
                    .collect(),
                samples: vec![0; columns.len()],
                event_count: vec![0; columns.len()],
                percent: vec![0.0; columns.len()],
                percent_ci95: vec![[0.0, 0.0]; columns.len()],
            };
            row.event_count[0] = gap;
            if total > 0 {
                row.percent[0] = 100.0 * gap as f64 / total as f64;
                row.percent_ci95[0] = [row.percent[0], row.percent[0]];
            }
            rows.push(row);
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
        stacks = stacks::collapse(&filtered_rows(session, opts, ev)?);
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
        coverage,
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
        slice: slice::summary(&opts.slice),
        class_rules: fields
            .contains(&GroupKey::Class)
            .then(|| {
                opts.classes
                    .source
                    .as_ref()
                    .map(|p| p.display().to_string())
            })
            .flatten(),
        note,
    })
}

/// The session's rows of one event in the options' view, slice and
/// filters (stacks as text).
pub fn filtered_rows(
    session: &Session,
    opts: &ReportOptions,
    event: u32,
) -> Result<Vec<vmscope_model::ProfileRow>, ReportError> {
    let mut rows = session.rows_in(opts.view, &opts.slice, Some(event))?;
    rows.retain(|r| {
        opts.filter
            .iter()
            .all(|(f, v)| field_of(&r.key, *f) == v.as_str())
    });
    if !opts.inline {
        for r in &mut rows {
            if r.key.stack.contains(vmscope_model::INLINED_SUFFIX) {
                let kept: Vec<&str> = r
                    .key
                    .stack
                    .split(';')
                    .filter(|f| !f.ends_with(vmscope_model::INLINED_SUFFIX))
                    .collect();
                r.key.stack = kept.join(";").into();
            }
        }
    }
    Ok(rows)
}

/// Index of an event by name (case-insensitive), or the error listing them.
pub fn event_index(session: &Session, name: Option<&str>) -> Result<u32, ReportError> {
    let events = session.events()?;
    match name {
        None => Ok(0),
        Some(want) => events
            .iter()
            .position(|e| e.name.eq_ignore_ascii_case(want))
            .map(|i| i as u32)
            .ok_or_else(|| ReportError::UnknownEvent {
                wanted: want.into(),
                have: events
                    .iter()
                    .map(|e| e.name.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
    }
}

/// Runs the grouped query for `--by` keys: stored fields go to SQL as they
/// are; a class is computed from context, image, symbol and source line,
/// queried in their place and added up here.
pub(crate) struct Grouper {
    keys: Vec<GroupKey>,
    /// Fields asked from the store.
    query: Vec<Field>,
    /// For each key: its column in `query`, or None for the class.
    pos: Vec<Option<usize>>,
    /// Columns of context, image, symbol and srcline (class only).
    class_cols: Option<[usize; 4]>,
    /// Columns of domain and thread name, and the factors of the groups
    /// held to their run time ([`Grouper::hold`]).
    held: Option<(usize, usize, ThreadFactors)>,
}

impl Grouper {
    pub(crate) fn new(keys: &[GroupKey]) -> Grouper {
        let mut query: Vec<Field> = Vec::new();
        let col = |f: Field, q: &mut Vec<Field>| {
            if let Some(i) = q.iter().position(|x| *x == f) {
                i
            } else {
                q.push(f);
                q.len() - 1
            }
        };
        let pos: Vec<Option<usize>> = keys
            .iter()
            .map(|k| match k {
                GroupKey::Field(f) => Some(col(*f, &mut query)),
                GroupKey::Class => None,
            })
            .collect();
        let class_cols = keys.contains(&GroupKey::Class).then(|| {
            [
                col(Field::Context, &mut query),
                col(Field::Image, &mut query),
                col(Field::Symbol, &mut query),
                col(Field::Srcline, &mut query),
            ]
        });
        Grouper {
            keys: keys.to_vec(),
            query,
            pos,
            class_cols,
            held: None,
        }
    }

    /// Scale the event count of every group of (domain, thread name) in
    /// `factors` by its factor (the threads `report --unsampled` holds to
    /// their run time); none given, nothing changes.
    pub(crate) fn hold(&mut self, factors: ThreadFactors) {
        if factors.is_empty() {
            return;
        }
        let mut col = |f: Field| {
            self.query.iter().position(|x| *x == f).unwrap_or_else(|| {
                self.query.push(f);
                self.query.len() - 1
            })
        };
        let (d, p) = (col(Field::Domain), col(Field::Process));
        self.held = Some((d, p, factors));
    }

    /// (display values, samples, period) per group, largest first.
    pub(crate) fn query(
        &self,
        session: &Session,
        opts: &ReportOptions,
        event: u32,
    ) -> Result<Vec<(Vec<String>, u64, u64)>, ReportError> {
        let groups =
            session.grouped_in(opts.view, &opts.slice, event, &self.query, &opts.filter)?;
        let mut out: Vec<(Vec<String>, u64, u64)> = Vec::with_capacity(groups.len());
        let mut index: HashMap<Vec<String>, usize> = HashMap::new();
        for g in groups {
            let values: Vec<String> = self
                .keys
                .iter()
                .zip(&self.pos)
                .map(|(k, p)| {
                    if let (GroupKey::Field(f), Some(i)) = (k, p) {
                        display_value(*f, &g.values[*i], opts.full_paths)
                    } else {
                        let [c, i, s, l] = self.class_cols.unwrap_or_default();
                        opts.classes
                            .classify(&g.values[c], &g.values[i], &g.values[s], &g.values[l])
                            .into_owned()
                    }
                })
                .collect();
            let mut period = g.period;
            if let Some((d, p, factors)) = &self.held {
                if let Some(f) = factors.get(&(g.values[*d].clone(), g.values[*p].clone())) {
                    period = (period as f64 * f).round() as u64;
                }
            }
            if self.class_cols.is_none() && self.held.is_none() {
                out.push((values, g.samples, period));
                continue;
            }
            if let Some(&i) = index.get(&values) {
                out[i].1 += g.samples;
                out[i].2 += period;
            } else {
                index.insert(values.clone(), out.len());
                out.push((values, g.samples, period));
            }
        }
        Ok(out)
    }
}

fn field_of(k: &vmscope_model::AggKey, f: Field) -> &str {
    match f {
        Field::Domain => &k.domain,
        Field::Context => k.context.as_str(),
        Field::Process => &k.process,
        Field::Image => &k.image,
        Field::Symbol => &k.symbol,
        Field::Srcline => &k.srcline,
        // Filters on the CPU are slices (`--cpu`), not text.
        Field::Cpu => "",
    }
}

pub(crate) fn display_value(f: Field, v: &str, full_paths: bool) -> String {
    match f {
        Field::Image if !full_paths && v.starts_with('/') => {
            v.rsplit('/').next().unwrap_or(v).to_string()
        }
        Field::Srcline if v.is_empty() => "[unknown]".into(),
        Field::Srcline if !full_paths => v.rsplit('/').next().unwrap_or(v).to_string(),
        Field::Cpu if v.starts_with('-') => "?".into(),
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests;
