//! santos2006's side-by-side view of one domain: its kernel on the left,
//! the VMM working in its context on the right, samples and % of all
//! samples of the event, with "other" and TOTAL rows.

use crate::{display_value, ReportError};
use serde::Serialize;
use std::io::Write;
use vmscope_store::{Field, Session, View};

/// One half of the view.
#[derive(Debug, Clone, Serialize)]
pub struct Half {
    pub title: String,
    /// (samples, percent of all samples of the event, label).
    pub rows: Vec<(u64, f64, String)>,
    pub other: (u64, f64),
    pub total: (u64, f64),
}

#[derive(Debug, Clone, Serialize)]
pub struct SideBySide {
    pub domain: String,
    pub event: String,
    pub left: Half,
    pub right: Half,
}

/// What both halves share.
struct Query<'a> {
    session: &'a Session,
    view: View,
    event: u32,
    by: &'a [Field],
    domain: &'a str,
    total_period: u64,
    limit: usize,
}

fn half(q: &Query<'_>, contexts: &[&str], title: String) -> Result<Half, ReportError> {
    let (session, view, event, by, domain) = (q.session, q.view, q.event, q.by, q.domain);
    let (total_period, limit) = (q.total_period, q.limit);
    let mut merged: Vec<(String, u64, u64)> = Vec::new();
    for c in contexts {
        let filter = vec![
            (Field::Domain, domain.to_string()),
            (Field::Context, c.to_string()),
        ];
        for g in session.grouped(view, event, by, &filter)? {
            let label = g
                .values
                .iter()
                .zip(by)
                .map(|(v, f)| display_value(*f, v, false))
                .collect::<Vec<_>>()
                .join(" ");
            match merged.iter_mut().find(|m| m.0 == label) {
                Some(m) => {
                    m.1 += g.samples;
                    m.2 += g.period;
                }
                None => merged.push((label, g.samples, g.period)),
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
            rows.push((s, pct(p), label));
        } else {
            os += s;
            op += p;
        }
    }
    Ok(Half {
        title,
        rows,
        other: (os, pct(op)),
        total: (ts, pct(tp)),
    })
}

/// Build the view for `domain` (a VM: guest kernel | VMM in its context;
/// the host: host kernel | host user).
pub fn build_side_by_side(
    session: &Session,
    domain: &str,
    event: Option<&str>,
    by: &[Field],
    limit: usize,
    view: View,
) -> Result<SideBySide, ReportError> {
    crate::check_domain(session, view, domain)?;
    let events = session.events()?;
    let ev = match event {
        Some(want) => events
            .iter()
            .position(|e| e.name.eq_ignore_ascii_case(want))
            .ok_or_else(|| ReportError::UnknownEvent {
                wanted: want.into(),
                have: events
                    .iter()
                    .map(|e| e.name.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            })? as u32,
        None => 0,
    };
    let total = session.totals(view)?.get(&ev).map(|t| t.1).unwrap_or(0);
    let by: Vec<Field> = if by.is_empty() {
        vec![Field::Symbol]
    } else {
        by.to_vec()
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
        view,
        event: ev,
        by: &by,
        domain,
        total_period: total,
        limit,
    };
    Ok(SideBySide {
        domain: domain.into(),
        event: events
            .get(ev as usize)
            .map(|e| e.name.clone())
            .unwrap_or_default(),
        left: half(&q, lc, lt)?,
        right: half(&q, rc, rt)?,
    })
}

/// Two tables next to each other, as in the slides.
pub fn render_side_by_side(v: &SideBySide, out: &mut dyn Write) -> Result<(), ReportError> {
    let fmt_half = |h: &Half| -> Vec<String> {
        let mut lines = vec![
            h.title.clone(),
            format!("{:>9}  {:>7}  {}", "samples", "%", "symbol"),
        ];
        for (s, p, l) in &h.rows {
            lines.push(format!("{s:>9}  {p:>7.3}  {l}"));
        }
        lines.push(format!("{:>9}  {:>7.3}  other", h.other.0, h.other.1));
        lines.push(format!("{:>9}  {:>7.3}  TOTAL", h.total.0, h.total.1));
        lines
    };
    let (l, r) = (fmt_half(&v.left), fmt_half(&v.right));
    let width = l.iter().map(|s| s.chars().count()).max().unwrap_or(0) + 4;
    writeln!(
        out,
        "# {} ({}): % of all samples of the event",
        v.domain, v.event
    )?;
    for i in 0..l.len().max(r.len()) {
        let a = l.get(i).map(String::as_str).unwrap_or("");
        let b = r.get(i).map(String::as_str).unwrap_or("");
        writeln!(out, "{a:<width$}{b}")?;
    }
    Ok(())
}
