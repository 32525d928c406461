//! santos2006's side-by-side view of one domain: its kernel on the left,
//! the VMM working in its context on the right, samples and % of all
//! samples of the event, with "other" and TOTAL rows. With `--by class`
//! it is the slides' class table (netback, bridge, net/core … beside the
//! VMM's classes).

use crate::{GroupKey, Grouper, ReportError, ReportOptions};
use serde::Serialize;
use std::io::Write;
use vmscope_store::{Field, Session};

/// One line of a half: samples, event count, % of the event's total.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideRow {
    pub samples: u64,
    /// Sum of periods (ns for clock events): adds up across samplers.
    pub event_count: u64,
    pub percent: f64,
    pub label: String,
}

/// One half of the view.
#[derive(Debug, Clone, Serialize)]
pub struct Half {
    pub title: String,
    /// (samples, percent of all samples of the event, label).
    pub rows: Vec<SideRow>,
    pub other: SideRow,
    pub total: SideRow,
}

#[derive(Debug, Clone, Serialize)]
pub struct SideBySide {
    pub domain: String,
    pub event: String,
    /// What the rows are (`symbol`, `class`, `image` …).
    pub label: String,
    pub left: Half,
    pub right: Half,
}

/// What both halves share.
struct Query<'a> {
    session: &'a Session,
    opts: &'a ReportOptions,
    event: u32,
    grouper: Grouper,
    domain: &'a str,
    total_period: u64,
    limit: usize,
}

fn half(q: &Query<'_>, contexts: &[&str], title: String) -> Result<Half, ReportError> {
    let (total_period, limit) = (q.total_period, q.limit);
    let mut merged: Vec<(String, u64, u64)> = Vec::new();
    for c in contexts {
        let mut opts = q.opts.clone();
        opts.full_paths = false;
        opts.filter = vec![
            (Field::Domain, q.domain.to_string()),
            (Field::Context, c.to_string()),
        ];
        for (values, samples, period) in q.grouper.query(q.session, &opts, q.event)? {
            let label = values.join(" ");
            match merged.iter_mut().find(|m| m.0 == label) {
                Some(m) => {
                    m.1 += samples;
                    m.2 += period;
                }
                None => merged.push((label, samples, period)),
            }
        }
    }
    merged.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let pct = |p: u64| {
        if total_period == 0 {
            0.0
        } else {
            100.0 * p as f64 / total_period as f64
        }
    };
    let (mut ts, mut tp) = (0u64, 0u64);
    let (mut os, mut op) = (0u64, 0u64);
    let mut rows = Vec::new();
    for (i, (label, s, p)) in merged.into_iter().enumerate() {
        ts += s;
        tp += p;
        if i < limit {
            rows.push(SideRow {
                samples: s,
                event_count: p,
                percent: pct(p),
                label,
            });
        } else {
            os += s;
            op += p;
        }
    }
    Ok(Half {
        title,
        rows,
        other: SideRow {
            samples: os,
            event_count: op,
            percent: pct(op),
            label: "other".into(),
        },
        total: SideRow {
            samples: ts,
            event_count: tp,
            percent: pct(tp),
            label: "TOTAL".into(),
        },
    })
}

/// Build the view for `domain` (a VM: guest kernel | VMM in its context;
/// the host: host kernel | host user), grouped by `opts.by` (default
/// symbol), in `opts`' view and slice, `opts.limit` rows (default 10).
pub fn build_side_by_side(
    session: &Session,
    domain: &str,
    opts: &ReportOptions,
) -> Result<SideBySide, ReportError> {
    crate::check_domain(session, opts.view, domain)?;
    let events = session.events()?;
    let ev = crate::event_index(session, opts.event.as_deref())?;
    let total = session
        .totals_in(opts.view, &opts.slice)?
        .get(&ev)
        .map(|t| t.1)
        .unwrap_or(0);
    let by: Vec<GroupKey> = if opts.by.is_empty() {
        vec![GroupKey::Field(Field::Symbol)]
    } else {
        opts.by.clone()
    };
    let host = domain == vmscope_model::HOST_DOMAIN;
    let (lc, rc): (&[&str], &[&str]) = if host {
        (&["host-kernel"], &["host-user"])
    } else {
        (&["guest-kernel", "guest"], &["vmm-kernel", "vmm-user"])
    };
    let (lt, rt) = if host {
        ("Kernel (host)".to_string(), "User (host)".to_string())
    } else {
        (
            format!("Kernel ({domain})"),
            format!("VMM (in {domain} context)"),
        )
    };
    let q = Query {
        session,
        opts,
        event: ev,
        grouper: Grouper::new(&by),
        domain,
        total_period: total,
        limit: opts.limit.unwrap_or(10),
    };
    let label = by.iter().map(|k| k.name()).collect::<Vec<_>>().join(" ");
    Ok(SideBySide {
        domain: domain.into(),
        event: events
            .get(ev as usize)
            .map(|e| e.name.clone())
            .unwrap_or_default(),
        label,
        left: half(&q, lc, lt)?,
        right: half(&q, rc, rt)?,
    })
}

/// Two tables next to each other, as in the slides.
pub fn render_side_by_side(v: &SideBySide, out: &mut dyn Write) -> Result<(), ReportError> {
    let fmt_half = |h: &Half| -> Vec<String> {
        let mut lines = vec![
            h.title.clone(),
            format!(
                "{:>9}  {:>9}  {:>7}  {}",
                "samples",
                crate::render::count_title(&v.event),
                "%",
                v.label
            ),
        ];
        for r in h.rows.iter().chain([&h.other, &h.total]) {
            lines.push(format!(
                "{:>9}  {:>9}  {:>7.3}  {}",
                r.samples,
                crate::render::count_text(&v.event, r.event_count),
                r.percent,
                r.label
            ));
        }
        lines
    };
    let (l, r) = (fmt_half(&v.left), fmt_half(&v.right));
    let width = l.iter().map(|s| s.chars().count()).max().unwrap_or(0) + 4;
    writeln!(
        out,
        "# {} ({}): % of the event's total count (all domains)",
        v.domain, v.event
    )?;
    for i in 0..l.len().max(r.len()) {
        let a = l.get(i).map(String::as_str).unwrap_or("");
        let b = r.get(i).map(String::as_str).unwrap_or("");
        writeln!(out, "{a:<width$}{b}")?;
    }
    Ok(())
}
