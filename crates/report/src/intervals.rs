//! Intervals kept by `stat -o` and `account -o`, summarized for a report:
//! per CPU and domain (vm-stat) and per VM (accounting), each value as a
//! rate over the time the intervals cover; for accounting also who waited
//! behind whom ([`WaitCell`]: each VM's steal by what ran instead).

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use vmscope_store::IntervalRow;

/// One kind of intervals of a session, summarized.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IntervalSummary {
    /// `stat` or `account`.
    pub kind: String,
    pub intervals: usize,
    /// Seconds the intervals cover.
    pub seconds: f64,
    /// Rate of each (cpu, domain, vcpu, metric) over `seconds`, in the
    /// stored unit per second.
    pub rates: Vec<IntervalRate>,
    /// Who waited behind whom (accounting with the waited-behind split),
    /// each waiter's culprits largest first.
    pub waits: Vec<WaitCell>,
}

/// One (waiting VM, culprit) of the waited-behind split over the covered
/// time.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WaitCell {
    /// The VM that waited.
    pub waiter: String,
    /// `vcpu` (its vCPUs' steal) or `io` (its other threads' waiting).
    pub threads: &'static str,
    /// What ran instead: `db vCPU 0`, `host backup (pid 812)`, `idle`,
    /// `other`.
    pub culprit: String,
    /// Seconds of waiting per second.
    pub per_second: f64,
    /// Share of the waiter's attributed waiting of that kind.
    pub share: f64,
}

/// Stored metric prefixes of the waited-behind rows (`account -o`).
const WAIT_METRICS: [(&str, &str); 2] = [("waited_behind ", "vcpu"), ("io_waited_behind ", "io")];

/// The waited-behind rates taken out of `rates`, as cells.
fn wait_cells(rates: &mut Vec<IntervalRate>) -> Vec<WaitCell> {
    let mut cells = Vec::new();
    rates.retain(|r| {
        for (prefix, threads) in WAIT_METRICS {
            if let (Some(culprit), Some(waiter)) = (r.metric.strip_prefix(prefix), &r.domain) {
                cells.push(WaitCell {
                    waiter: waiter.clone(),
                    threads,
                    culprit: culprit.to_string(),
                    per_second: r.per_second,
                    share: 0.0,
                });
                return false;
            }
        }
        true
    });
    let mut totals: BTreeMap<(String, &str), f64> = BTreeMap::new();
    for c in &cells {
        *totals.entry((c.waiter.clone(), c.threads)).or_default() += c.per_second;
    }
    for c in &mut cells {
        let t = totals[&(c.waiter.clone(), c.threads)];
        c.share = if t > 0.0 { c.per_second / t } else { 0.0 };
    }
    cells.sort_by(|a, b| {
        (&a.waiter, a.threads)
            .cmp(&(&b.waiter, b.threads))
            .then(b.per_second.total_cmp(&a.per_second))
            .then(a.culprit.cmp(&b.culprit))
    });
    cells
}

/// One value per second over the covered time.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IntervalRate {
    pub cpu: Option<u32>,
    pub domain: Option<String>,
    pub vcpu: Option<String>,
    pub metric: String,
    pub per_second: f64,
    pub unit: String,
}

type Key = (Option<u32>, Option<String>, Option<String>, String, String);

/// Summaries of every kind of intervals in `rows`.
pub fn summarize(rows: &[IntervalRow]) -> Vec<IntervalSummary> {
    let mut by_kind: BTreeMap<&str, Vec<&IntervalRow>> = BTreeMap::new();
    for r in rows {
        by_kind.entry(r.kind.as_str()).or_default().push(r);
    }
    by_kind
        .into_iter()
        .map(|(kind, rows)| {
            let mut spans: BTreeMap<(u64, u64), ()> = BTreeMap::new();
            let mut sums: BTreeMap<Key, f64> = BTreeMap::new();
            for r in &rows {
                spans.insert((r.t_start.to_bits(), r.t_end.to_bits()), ());
                *sums
                    .entry((
                        r.cpu,
                        r.domain.clone(),
                        r.vcpu.clone(),
                        r.metric.clone(),
                        r.unit.clone(),
                    ))
                    .or_default() += r.value;
            }
            let seconds: f64 = spans
                .keys()
                .map(|(a, b)| f64::from_bits(*b) - f64::from_bits(*a))
                .sum();
            let mut rates = sums
                .into_iter()
                .map(|((cpu, domain, vcpu, metric, unit), sum)| IntervalRate {
                    cpu,
                    domain,
                    vcpu,
                    metric,
                    per_second: if seconds > 0.0 { sum / seconds } else { 0.0 },
                    unit,
                })
                .collect();
            let waits = wait_cells(&mut rates);
            IntervalSummary {
                kind: kind.to_string(),
                intervals: spans.len(),
                seconds,
                rates,
                waits,
            }
        })
        .collect()
}

/// The summaries as text tables, under the report's header.
pub fn write_text(summaries: &[IntervalSummary], out: &mut dyn Write) -> std::io::Result<()> {
    for s in summaries {
        writeln!(
            out,
            "# {:<9} {} intervals, {:.2} s; rates over that time",
            s.kind, s.intervals, s.seconds
        )?;
        match s.kind.as_str() {
            "stat" => stat_table(s, out)?,
            "account" => {
                account_table(s, out)?;
                wait_table(s, out)?;
            }
            "history" => history_table(s, out)?,
            _ => {
                for r in &s.rates {
                    writeln!(
                        out,
                        "{:?} {:?} {}: {:.6} {}/s",
                        r.domain, r.vcpu, r.metric, r.per_second, r.unit
                    )?;
                }
            }
        }
        writeln!(out, "#")?;
    }
    Ok(())
}

/// A history's range (`report DIR --time`): per domain its CPU, steal
/// and I/O CPU in % of one host CPU, and I/O operations per second.
fn history_table(s: &IntervalSummary, out: &mut dyn Write) -> std::io::Result<()> {
    let mut domains: Vec<String> = s.rates.iter().filter_map(|r| r.domain.clone()).collect();
    domains.sort();
    domains.dedup();
    writeln!(
        out,
        "{:<16} {:>7} {:>7} {:>8} {:>9}",
        "DOMAIN", "CPU%", "STEAL%", "I/O CPU%", "I/O OPS/s"
    )?;
    for d in domains {
        let rate = |metric: &str| {
            s.rates
                .iter()
                .find(|r| r.domain.as_deref() == Some(&*d) && r.metric == metric)
                .map_or(0.0, |r| r.per_second)
        };
        writeln!(
            out,
            "{:<16} {:>7.1} {:>7.1} {:>8.1} {:>9.0}",
            vmscope_model::text::visible_cut(&d, vmscope_model::text::NAME_WIDTH),
            100.0 * rate("cpu"),
            100.0 * rate("steal"),
            100.0 * rate("io_cpu"),
            rate("io_ops")
        )?;
    }
    Ok(())
}

/// Per host CPU: busy % and each domain's %.
fn stat_table(s: &IntervalSummary, out: &mut dyn Write) -> std::io::Result<()> {
    let mut domains: Vec<String> = s
        .rates
        .iter()
        .filter(|r| r.metric == "time")
        .filter_map(|r| r.domain.clone())
        .collect();
    domains.sort();
    domains.dedup();
    let mut cpus: Vec<u32> = s.rates.iter().filter_map(|r| r.cpu).collect();
    cpus.sort_unstable();
    cpus.dedup();
    write!(out, "{:>4}  {:>7}", "CPU", "busy %")?;
    for d in &domains {
        write!(out, "  {:>12}", format!("{d} %"))?;
    }
    writeln!(out)?;
    for cpu in cpus {
        let pct = |metric: &str, domain: Option<&str>| -> f64 {
            100.0
                * s.rates
                    .iter()
                    .filter(|r| {
                        r.cpu == Some(cpu) && r.metric == metric && r.domain.as_deref() == domain
                    })
                    .map(|r| r.per_second)
                    // An empty sum is -0.0; shown as 0.0.
                    .sum::<f64>()
                + 0.0
        };
        write!(out, "{cpu:>4}  {:>7.1}", pct("busy", None))?;
        for d in &domains {
            write!(out, "  {:>12.1}", pct("time", Some(d)))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// Culprits shown per waiter in the text table (the rest summed).
const WAIT_TOP: usize = 5;

/// Who waited behind whom: per VM and kind of thread its top culprits, in
/// seconds of waiting per second and as a share of that VM's waiting.
fn wait_table(s: &IntervalSummary, out: &mut dyn Write) -> std::io::Result<()> {
    if s.waits.is_empty() {
        return Ok(());
    }
    use vmscope_model::text::{visible_cut, NAME_WIDTH};
    writeln!(
        out,
        "# who waited behind whom: each VM's waiting by what ran instead (vCPUs: its steal)"
    )?;
    writeln!(
        out,
        "{:<12}  {:<5}  {:<32}  {:>10}  {:>6}",
        "waiter", "of", "culprit", "wait s/s", "share"
    )?;
    let mut i = 0;
    while i < s.waits.len() {
        let (w, t) = (&s.waits[i].waiter, s.waits[i].threads);
        let group: Vec<&WaitCell> = s.waits[i..]
            .iter()
            .take_while(|c| &c.waiter == w && c.threads == t)
            .collect();
        i += group.len();
        for c in group.iter().take(WAIT_TOP) {
            writeln!(
                out,
                "{:<12}  {:<5}  {:<32}  {:>10.6}  {:>5.1}%",
                visible_cut(w, NAME_WIDTH),
                t,
                visible_cut(&c.culprit, 32),
                c.per_second,
                100.0 * c.share
            )?;
        }
        if group.len() > WAIT_TOP {
            let rest = &group[WAIT_TOP..];
            writeln!(
                out,
                "{:<12}  {:<5}  {:<32}  {:>10.6}  {:>5.1}%",
                visible_cut(w, NAME_WIDTH),
                t,
                format!("{} more", rest.len()),
                rest.iter().map(|c| c.per_second).sum::<f64>(),
                100.0 * rest.iter().map(|c| c.share).sum::<f64>()
            )?;
        }
    }
    Ok(())
}

/// Per VM: the accounting columns as seconds (or operations) per second.
fn account_table(s: &IntervalSummary, out: &mut dyn Write) -> std::io::Result<()> {
    const COLS: [(&str, &str); 7] = [
        ("vcpu_run", "run s/s"),
        ("vcpu_runnable", "steal s/s"),
        ("vcpu_blocked", "halted s/s"),
        ("direct_io", "direct I/O s/s"),
        ("shared_io", "shared I/O s/s"),
        ("io_ops", "I/O ops/s"),
        ("total", "charged s/s"),
    ];
    let mut vms: Vec<String> = s
        .rates
        .iter()
        .filter(|r| r.vcpu.is_none())
        .filter_map(|r| r.domain.clone())
        .collect();
    vms.sort();
    vms.dedup();
    write!(out, "{:<12}", "domain")?;
    for (_, h) in COLS {
        write!(out, "  {h:>14}")?;
    }
    writeln!(out)?;
    let get = |domain: Option<&str>, metric: &str| -> f64 {
        s.rates
            .iter()
            .find(|r| r.vcpu.is_none() && r.domain.as_deref() == domain && r.metric == metric)
            .map_or(0.0, |r| r.per_second)
    };
    for vm in &vms {
        write!(out, "{vm:<12}")?;
        for (m, _) in COLS {
            write!(out, "  {:>14.6}", get(Some(vm), m))?;
        }
        writeln!(out)?;
    }
    writeln!(
        out,
        "# host      measured {:.6} s/s, unattributed {:.6} s/s, residual {:+.6} s/s, shared I/O T {:.6} s/s",
        get(None, "measured_host"),
        get(None, "unattributed"),
        get(None, "residual"),
        get(None, "shared_io_t"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        t: f64,
        cpu: Option<u32>,
        domain: Option<&str>,
        vcpu: Option<&str>,
        metric: &str,
        value: f64,
    ) -> IntervalRow {
        IntervalRow {
            kind: if cpu.is_some() { "stat" } else { "account" }.into(),
            t_start: t,
            t_end: t + 0.5,
            cpu,
            domain: domain.map(str::to_string),
            vcpu: vcpu.map(str::to_string),
            metric: metric.into(),
            value,
            unit: "s".into(),
        }
    }

    #[test]
    fn rates_over_the_covered_time() {
        let rows = vec![
            row(0.0, Some(0), None, None, "busy", 0.4),
            row(0.5, Some(0), None, None, "busy", 0.2),
            row(0.0, Some(0), Some("web"), Some("0"), "time", 0.3),
            row(0.5, Some(0), Some("web"), Some("0"), "time", 0.1),
            row(0.0, None, Some("web"), None, "vcpu_run", 0.25),
            row(0.5, None, Some("web"), None, "vcpu_run", 0.25),
            row(0.0, None, None, None, "measured_host", 0.9),
        ];
        let s = summarize(&rows);
        assert_eq!(s.len(), 2);
        let stat = s.iter().find(|x| x.kind == "stat").unwrap();
        assert_eq!((stat.intervals, stat.seconds), (2, 1.0));
        let busy = stat.rates.iter().find(|r| r.metric == "busy").unwrap();
        assert!((busy.per_second - 0.6).abs() < 1e-9);
        let mut text = Vec::new();
        write_text(&s, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("# stat      2 intervals, 1.00 s"), "{text}");
        assert!(text.contains("   0     60.0          40.0"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("web ") && l.contains(" 0.500000 ")),
            "{text}"
        );
    }

    #[test]
    fn waits_become_cells_with_shares_and_a_table() {
        let mut rows = vec![
            row(0.0, None, Some("web"), None, "vcpu_runnable", 0.4),
            row(0.0, None, Some("web"), None, "waited_behind db vCPU 0", 0.3),
            row(0.5, None, Some("web"), None, "waited_behind db vCPU 0", 0.1),
            row(
                0.0,
                None,
                Some("web"),
                None,
                "waited_behind host backup (pid 9)",
                0.1,
            ),
            row(0.0, None, Some("web"), None, "io_waited_behind idle", 0.05),
        ];
        for i in 0..7 {
            rows.push(row(
                0.5,
                None,
                Some("db"),
                None,
                &format!("waited_behind host t{i} (pid {i})"),
                0.01 * f64::from(i + 1),
            ));
        }
        let s = summarize(&rows);
        let a = &s[0];
        assert!(
            !a.rates.iter().any(|r| r.metric.contains("waited_behind")),
            "{:?}",
            a.rates
        );
        let web: Vec<&WaitCell> = a
            .waits
            .iter()
            .filter(|c| c.waiter == "web" && c.threads == "vcpu")
            .collect();
        assert_eq!(web[0].culprit, "db vCPU 0");
        assert!((web[0].per_second - 0.4).abs() < 1e-9, "{web:?}");
        assert!((web[0].share - 0.8).abs() < 1e-9, "{web:?}");
        assert!((web[1].share - 0.2).abs() < 1e-9, "{web:?}");
        let io = a.waits.iter().find(|c| c.threads == "io").unwrap();
        assert!((io.share - 1.0).abs() < 1e-9);
        let mut text = Vec::new();
        write_text(&s, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("# who waited behind whom"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("web ")
                && l.contains("db vCPU 0")
                && l.contains("0.400000")
                && l.ends_with(" 80.0%")),
            "{text}"
        );
        // db's 7 culprits: the top 5 and the rest in one line.
        assert!(
            text.lines()
                .any(|l| l.starts_with("db ") && l.contains("2 more")),
            "{text}"
        );
        assert_eq!(
            text.lines().filter(|l| l.starts_with("db ")).count(),
            6,
            "{text}"
        );
    }
}
