//! The sampling plan: configurations interleaved, not run in blocks.
//!
//! Every round runs each unfinished point once, in an order shuffled with
//! a seeded generator (so no configuration always runs first or right
//! after another, and a run can be repeated). A point's first `warmup`
//! runs are discarded; then it takes samples until its [`StopRule`] says
//! converged or capped. Drift in the host (other load, thermal, caches)
//! spreads over every configuration instead of biasing whichever ran in
//! the bad minute.

use crate::stats::{StopRule, Verdict};

/// What a scheduled run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Discarded.
    Warmup,
    /// Kept.
    Sample,
}

/// The state of one point.
#[derive(Debug, Clone, Default)]
struct PointState {
    warmups_left: usize,
    samples: Vec<f64>,
    failed: Option<String>,
}

/// The interleaved, adaptive plan over `n` points.
#[derive(Debug, Clone)]
pub struct Plan {
    rule: StopRule,
    points: Vec<PointState>,
    rng: fastrand::Rng,
    round: usize,
}

impl Plan {
    pub fn new(n: usize, warmup: usize, rule: StopRule, seed: u64) -> Plan {
        Plan {
            rule,
            points: vec![
                PointState {
                    warmups_left: warmup,
                    ..Default::default()
                };
                n
            ],
            rng: fastrand::Rng::with_seed(seed),
            round: 0,
        }
    }

    /// Rounds handed out so far.
    pub fn round(&self) -> usize {
        self.round
    }

    fn active(&self, i: usize) -> bool {
        let p = &self.points[i];
        p.failed.is_none() && (p.warmups_left > 0 || self.rule.verdict(&p.samples) == Verdict::More)
    }

    /// The next round: every unfinished point once, shuffled; `None` when
    /// every point is done (converged, capped or failed).
    pub fn next_round(&mut self) -> Option<Vec<(usize, Step)>> {
        let mut v: Vec<(usize, Step)> = (0..self.points.len())
            .filter(|&i| self.active(i))
            .map(|i| {
                let step = if self.points[i].warmups_left > 0 {
                    Step::Warmup
                } else {
                    Step::Sample
                };
                (i, step)
            })
            .collect();
        if v.is_empty() {
            return None;
        }
        self.rng.shuffle(&mut v);
        self.round += 1;
        Some(v)
    }

    /// A warm-up of point `i` ran (its result is discarded).
    pub fn warmed(&mut self, i: usize) {
        let p = &mut self.points[i];
        p.warmups_left = p.warmups_left.saturating_sub(1);
    }

    /// A sample of point `i`.
    pub fn record(&mut self, i: usize, value: f64) {
        self.points[i].samples.push(value);
    }

    /// Point `i` failed: it takes no more runs.
    pub fn fail(&mut self, i: usize, reason: impl Into<String>) {
        let p = &mut self.points[i];
        if p.failed.is_none() {
            p.failed = Some(reason.into());
        }
    }

    pub fn failed(&self, i: usize) -> Option<&str> {
        self.points[i].failed.as_deref()
    }

    pub fn samples(&self, i: usize) -> &[f64] {
        &self.points[i].samples
    }

    /// Why point `i` stopped (or `More` while it runs).
    pub fn verdict(&self, i: usize) -> Verdict {
        self.rule.verdict(&self.points[i].samples)
    }

    /// Runs still to come if every point stopped at its minimum: for a
    /// progress bar's length (it grows when points need more).
    pub fn remaining_at_least(&self) -> usize {
        self.points
            .iter()
            .enumerate()
            .filter(|(i, _)| self.active(*i))
            .map(|(_, p)| {
                p.warmups_left + self.rule.min_samples.saturating_sub(p.samples.len()).max(1)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_interleave_warm_up_then_sample_until_converged_or_capped() {
        let rule = StopRule {
            min_samples: 2,
            max_samples: 4,
            rel_ci: 0.05,
        };
        let mut plan = Plan::new(3, 1, rule, 7);
        let r1 = plan.next_round().unwrap();
        assert_eq!(r1.len(), 3);
        assert!(r1.iter().all(|(_, s)| *s == Step::Warmup));
        let mut seen: Vec<usize> = r1.iter().map(|(i, _)| *i).collect();
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2]);
        for (i, _) in r1 {
            plan.warmed(i);
        }
        // Point 0 converges at once, point 1 is noisy, point 2 fails.
        let mut orders = Vec::new();
        while let Some(round) = plan.next_round() {
            assert!(round.iter().all(|(_, s)| *s == Step::Sample));
            orders.push(round.iter().map(|(i, _)| *i).collect::<Vec<_>>());
            for (i, _) in round {
                match i {
                    0 => plan.record(0, 100.0),
                    1 => plan.record(
                        1,
                        if plan.samples(1).len().is_multiple_of(2) {
                            50.0
                        } else {
                            150.0
                        },
                    ),
                    _ => plan.fail(2, "VM died"),
                }
            }
        }
        assert_eq!(plan.samples(0).len(), 2);
        assert_eq!(plan.verdict(0), Verdict::Converged);
        assert_eq!(plan.samples(1).len(), 4);
        assert_eq!(plan.verdict(1), Verdict::Capped);
        assert_eq!(plan.failed(2), Some("VM died"));
        assert!(plan.samples(2).is_empty());
        assert_eq!(plan.round(), 1 + orders.len());
        assert_eq!(plan.remaining_at_least(), 0);
    }

    #[test]
    fn the_order_is_shuffled_and_repeatable() {
        let rule = StopRule {
            min_samples: 50,
            max_samples: 50,
            rel_ci: 0.0,
        };
        let run = |seed| {
            let mut plan = Plan::new(4, 0, rule, seed);
            let mut firsts = Vec::new();
            while let Some(r) = plan.next_round() {
                firsts.push(r[0].0);
                for (i, _) in r {
                    plan.record(i, 1.0 + i as f64);
                }
            }
            firsts
        };
        let a = run(1);
        assert_eq!(a, run(1));
        // Each point goes first in some round: not run in blocks.
        for p in 0..4 {
            assert!(a.contains(&p), "{a:?}");
        }
    }
}
