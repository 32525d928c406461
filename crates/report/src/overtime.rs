//! What the HTML report's "Over time" charts plot: values per second of
//! time, from the per-second sample counts (bins) and from interval rows.
//!
//! Two kinds of value meet here. An *amount* accumulates over its span
//! (samples, seconds of CPU) and is plotted divided by the span's length;
//! a *level* (a sampling rate in Hz) already is per second and is plotted
//! as it is. A span much shorter than its series' usual one (the partial
//! last second of a recording, a profiler's last step cut by the end) is
//! merged into the span before it rather than plotted on its own: on its
//! own it would divide a handful of samples by a few milliseconds (a spike)
//! or count a partial second as a whole one (a drop to zero).

use std::collections::BTreeMap;

/// One span of one series: `[t0, t1)` seconds and what it holds as an
/// amount (a level's value times the span's length).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub t0: f64,
    pub t1: f64,
    pub amount: f64,
}

impl Span {
    fn len(&self) -> f64 {
        self.t1 - self.t0
    }
}

/// Whether an interval row's unit is an amount over the interval (`s`)
/// rather than a level (`Hz`).
pub fn is_amount(unit: &str) -> bool {
    unit == "s"
}

/// The spans as (midpoint, value per second), spans in time order, each
/// shorter than half the series' median span merged into the one before
/// it when they touch.
pub fn per_second(mut spans: Vec<Span>) -> Vec<(f64, f64)> {
    spans.retain(|s| s.len() > 0.0 && s.amount.is_finite());
    spans.sort_by(|a, b| a.t0.total_cmp(&b.t0));
    let mut lens: Vec<f64> = spans.iter().map(Span::len).collect();
    lens.sort_by(f64::total_cmp);
    let median = lens.get(lens.len() / 2).copied().unwrap_or(0.0);
    let mut merged: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match merged.last_mut() {
            Some(prev) if s.len() < median / 2.0 && (s.t0 - prev.t1).abs() < 1e-6 => {
                prev.t1 = s.t1;
                prev.amount += s.amount;
            }
            _ => merged.push(s),
        }
    }
    // A short first span (a recording that started mid-step) merges
    // forward the same way.
    if merged.len() >= 2
        && merged[0].len() < median / 2.0
        && (merged[1].t0 - merged[0].t1).abs() < 1e-6
    {
        let first = merged.remove(0);
        merged[0].t0 = first.t0;
        merged[0].amount += first.amount;
    }
    merged
        .into_iter()
        .map(|s| ((s.t0 + s.t1) / 2.0, s.amount / s.len()))
        .collect()
}

/// Sample counts of each domain per `step` seconds (1, or a history
/// range's `bin_seconds`: each bin's second is its step's first) as
/// spans: one per step, the last ending at `duration` (the session's
/// length) when that falls inside it; steps without samples count 0.
pub fn bin_spans(
    bins: &BTreeMap<String, BTreeMap<u32, u64>>,
    duration: Option<f64>,
    step: u32,
) -> BTreeMap<String, Vec<Span>> {
    let step = step.max(1);
    let last = bins
        .values()
        .filter_map(|m| m.keys().max())
        .max()
        .copied()
        .unwrap_or(0);
    let last = last / step * step;
    let end = |s: u32| {
        let full = f64::from(s) + f64::from(step);
        match duration {
            Some(d) if s == last && d > f64::from(s) && d < full => d,
            _ => full,
        }
    };
    bins.iter()
        .map(|(d, m)| {
            let spans = (0..=last)
                .step_by(step as usize)
                .map(|s| Span {
                    t0: f64::from(s),
                    t1: end(s),
                    amount: m
                        .range(s..s.saturating_add(step))
                        .map(|(_, n)| *n)
                        .sum::<u64>() as f64,
                })
                .collect();
            (d.clone(), spans)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(t0: f64, t1: f64, amount: f64) -> Span {
        Span { t0, t1, amount }
    }

    #[test]
    fn bins_in_steps_are_one_span_per_step_at_the_same_rate() {
        // A history range in steps of 60 s: 100 samples a second for
        // 150 s, the bins at each step's first second, the last step 30 s.
        let mut bins = BTreeMap::new();
        bins.insert(
            "web".to_string(),
            BTreeMap::from([(0, 6000), (60, 6000), (120, 3000)]),
        );
        let spans = bin_spans(&bins, Some(150.0), 60);
        assert_eq!(spans["web"].len(), 3);
        assert_eq!(spans["web"][2].t1, 150.0);
        for (_, v) in per_second(spans["web"].clone()) {
            assert!((v - 100.0).abs() < 1e-9);
        }
    }

    #[test]
    fn a_partial_last_second_is_neither_a_drop_nor_a_spike() {
        // 50 samples a second for 2.6 s: the last 0.6 s hold 30.
        let mut bins = BTreeMap::new();
        bins.insert(
            "web".to_string(),
            BTreeMap::from([(0, 50), (1, 50), (2, 30)]),
        );
        let spans = bin_spans(&bins, Some(2.6), 1);
        let pts = per_second(spans["web"].clone());
        assert_eq!(pts.len(), 3);
        for (_, v) in &pts {
            assert!((v - 50.0).abs() < 1e-9, "{pts:?}");
        }
        assert!((pts[2].0 - 2.3).abs() < 1e-9);
        // 2.05 s: the last 0.05 s (2 samples) merge into the second before.
        bins.insert(
            "web".to_string(),
            BTreeMap::from([(0, 50), (1, 50), (2, 2)]),
        );
        let pts = per_second(bin_spans(&bins, Some(2.04), 1).remove("web").unwrap());
        assert_eq!(pts.len(), 2);
        assert!((pts[1].1 - 52.0 / 1.04).abs() < 1e-9, "{pts:?}");
    }

    #[test]
    fn a_short_last_step_of_a_rate_is_averaged_in() {
        // 999 Hz for three 1 s steps and a last 5 ms one, given as amounts
        // (level × length): the chart shows 999 throughout.
        let steps = vec![
            span(0.0, 1.0, 999.0),
            span(1.0, 2.0, 999.0),
            span(2.0, 3.0, 999.0),
            span(3.0, 3.005, 999.0 * 0.005),
        ];
        let pts = per_second(steps);
        assert_eq!(pts.len(), 3);
        assert!(pts.iter().all(|p| (p.1 - 999.0).abs() < 1e-6), "{pts:?}");
        // Disjoint spans are never merged.
        let pts = per_second(vec![span(0.0, 1.0, 1.0), span(5.0, 5.01, 1.0)]);
        assert_eq!(pts.len(), 2);
    }

    #[test]
    fn units() {
        assert!(is_amount("s"));
        assert!(!is_amount("Hz"));
    }
}
