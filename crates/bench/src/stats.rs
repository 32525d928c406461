//! Statistics of repeated samples: mean, standard deviation, the 95 %
//! confidence interval of the mean with Student's t, coefficient of
//! variation, and the stop rule of docs/architecture.md §8 (at least N samples, then more
//! until the interval is within X % of the mean or a cap is reached).

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Summary of one point's samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n − 1); 0 for one sample.
    pub sd: f64,
    /// Half-width of the 95 % confidence interval of the mean
    /// (t(0.975, n − 1) × sd / √n); infinite for one sample.
    pub ci95: f64,
    /// sd / mean (0 when the mean is 0).
    pub cv: f64,
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Summary {
    /// The summary of `xs`, or `None` when it is empty or holds a
    /// non-finite value.
    pub fn of(xs: &[f64]) -> Option<Summary> {
        if xs.is_empty() || xs.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let n = xs.len();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let sd = if n > 1 {
            (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        let ci95 = if n > 1 {
            t975(n - 1) * sd / (n as f64).sqrt()
        } else {
            f64::INFINITY
        };
        Some(Summary {
            n,
            mean,
            sd,
            ci95,
            cv: if mean != 0.0 { sd / mean.abs() } else { 0.0 },
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            median: median(xs),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }

    /// The interval's half-width relative to the mean (infinite for a zero
    /// mean or one sample).
    pub fn ci_rel(&self) -> f64 {
        if self.mean != 0.0 {
            self.ci95 / self.mean.abs()
        } else {
            f64::INFINITY
        }
    }
}

/// `x`, or 0 when it is not finite (the interval of a single sample).
pub fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom (the
/// two-sided 95 % factor): 12.706 for 1, 2.776 for 4, 1.960 in the limit.
pub fn t975(df: usize) -> f64 {
    match StudentsT::new(0.0, 1.0, df.max(1) as f64) {
        Ok(t) => t.inverse_cdf(0.975),
        Err(_) => 1.959_963_984_540_054,
    }
}

/// The median (mean of the middle two for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// When a point has enough samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StopRule {
    /// Samples always taken (after the warm-up).
    pub min_samples: usize,
    /// The cap: never more than this many.
    pub max_samples: usize,
    /// Stop once the 95 % interval's half-width is within this fraction
    /// of the mean (0.05 = 5 %).
    pub rel_ci: f64,
}

impl StopRule {
    /// At least `repeat` samples, then more up to `max_repeat` until the
    /// interval is within `rel_ci` of the mean.
    pub fn new(repeat: usize, max_repeat: usize, rel_ci: f64) -> StopRule {
        StopRule {
            min_samples: repeat,
            max_samples: max_repeat,
            rel_ci,
        }
    }
}

impl Default for StopRule {
    fn default() -> Self {
        StopRule {
            min_samples: 5,
            max_samples: 20,
            rel_ci: 0.05,
        }
    }
}

/// Why a point stopped taking samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Needs more samples.
    More,
    /// The interval is within the target.
    Converged,
    /// The cap was reached with the interval still wider than the target.
    Capped,
}

impl StopRule {
    pub fn verdict(&self, xs: &[f64]) -> Verdict {
        let n = xs.len();
        if n < self.min_samples.max(1) {
            return Verdict::More;
        }
        let within = Summary::of(xs).is_some_and(|s| s.ci_rel() <= self.rel_ci)
            // One sample asked for and taken: nothing to converge.
            || self.max_samples <= 1;
        if within {
            Verdict::Converged
        } else if n >= self.max_samples {
            Verdict::Capped
        } else {
            Verdict::More
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn t_quantiles_match_the_table() {
        // Two-sided 95 % factors from any t table.
        for (df, t) in [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045)] {
            assert!(close(t975(df), t, 0.001), "df {df}: {}", t975(df));
        }
        assert!(close(t975(100_000), 1.960, 0.001));
    }

    #[test]
    fn summary_of_known_samples() {
        let s = Summary::of(&[98.0, 100.0, 102.0, 99.0, 101.0]).unwrap();
        assert_eq!(s.n, 5);
        assert!(close(s.mean, 100.0, 1e-12));
        assert!(close(s.sd, 1.5811, 1e-4));
        // 2.776 × 1.5811 / √5
        assert!(close(s.ci95, 1.963, 1e-3), "{}", s.ci95);
        assert!(close(s.cv, 0.015811, 1e-6));
        assert_eq!((s.min, s.median, s.max), (98.0, 100.0, 102.0));
        assert!(close(s.ci_rel(), 0.01963, 1e-5));
        let one = Summary::of(&[3.0]).unwrap();
        assert!(one.ci95.is_infinite() && one.sd == 0.0);
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn stop_rule() {
        let r = StopRule {
            min_samples: 3,
            max_samples: 6,
            rel_ci: 0.05,
        };
        assert_eq!(r.verdict(&[100.0, 100.0]), Verdict::More);
        assert_eq!(r.verdict(&[100.0, 101.0, 99.0]), Verdict::Converged);
        assert_eq!(r.verdict(&[50.0, 150.0, 100.0]), Verdict::More);
        assert_eq!(
            r.verdict(&[50.0, 150.0, 100.0, 60.0, 140.0, 100.0]),
            Verdict::Capped
        );
        let once = StopRule {
            min_samples: 1,
            max_samples: 1,
            rel_ci: 0.05,
        };
        assert_eq!(once.verdict(&[7.0]), Verdict::Converged);
    }
}
