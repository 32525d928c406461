//! The overhead budget: what profiling costs the CPU it observes, and the
//! rule that keeps a profiler's sampling rate within a share of that CPU
//! the user sets (`--overhead-budget PCT`).
//!
//! A profiler (the host recorder, or a VM's agent) measures its own cost
//! over each step: its process's CPU time plus the interrupt time its
//! samples add (the guest's or host's own irq accounting above the level
//! measured before sampling started), against the capacity it observes
//! (wall time × the CPUs it samples). [`RateController::observe`] turns
//! that into the next rate. Cost per sample is taken as proportional to the
//! rate (ring reading, symbolization and interrupts are all per sample), so
//! the new rate aims at a margin below the budget in one step; it rises
//! again only when the cost has fallen well under the budget, and never
//! above the rate the user asked for. The budget holds for the session as
//! a whole: a step that overspent (the start-up, a calibration, a burst)
//! is paid back by lower rates in the next ones before the rate may rise.
//!
//! Totals do not depend on the rate: every sample carries its period, and
//! the merged view takes *how much* from the host and only *where* from the
//! agent, so a lower rate costs resolution, not correctness.

use serde::{Deserialize, Serialize};

/// The lowest rate the controller goes to (Hz): below it a 10 s profile
/// holds too few samples per CPU to rank functions.
pub const MIN_RATE_HZ: u64 = 10;

/// The part of the budget the controller aims at, so noise in one step's
/// measurement does not push the next step over.
const AIM: f64 = 0.8;
/// Below this share of the budget the rate may rise again.
const RAISE_BELOW: f64 = 0.5;
/// Under a budget a profiler starts at this fraction of the rate asked for
/// and doubles per step while well within the budget ("slow start"):
/// measured on this project's lab, a session's first second costs several
/// times its steady state (symbol tables loaded, the guest's kallsyms read),
/// so starting at the full rate spent the budget of a short recording at
/// once.
const START_DIVISOR: u64 = 8;
/// One step lowers the rate at most this many times: a single expensive
/// step is often work that does not depend on the rate (a new binary's
/// symbols loaded, the store flushed), and jumping to the rate it predicts
/// made the rate swing between the lowest and the highest.
const MAX_DROP: u64 = 4;
/// Steps at the lowest rate before a budget is said to be missed there:
/// one expensive step (a start-up, a new binary's symbols) is not enough.
const MIN_STEPS_OVER: u32 = 3;

/// The rate a profiler under a budget starts at when `requested_hz` is
/// asked for: an eighth of it, not below [`MIN_RATE_HZ`] (nor above the
/// request).
pub fn start_hz(requested_hz: u64) -> u64 {
    if requested_hz <= MIN_RATE_HZ {
        requested_hz
    } else {
        (requested_hz / START_DIVISOR).max(MIN_RATE_HZ)
    }
}

/// How `--overhead-budget` is shared: (host recorder, each active VM's
/// agent). A VM's slowdown is what the host side takes from its vCPU
/// threads plus what its agent (and its sampling interrupts) takes inside
/// it, so with active VMs each side gets half the budget and the VM's
/// slowdown stays within the whole; with none the host keeps all of it.
pub fn shares(budget: f64, active_vms: usize) -> (f64, f64) {
    if active_vms == 0 {
        (budget, budget)
    } else {
        (budget / 2.0, budget / 2.0)
    }
}

/// A budget as a fraction of the observed CPU: `--overhead-budget 1` is
/// 0.01. Valid budgets are above 0 % and below 100 %.
pub fn parse_budget_pct(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%');
    let v: f64 = t
        .parse()
        .map_err(|_| format!("must be a percentage such as 1 or 0.5, not '{s}'"))?;
    if !v.is_finite() || v <= 0.0 || v >= 100.0 {
        return Err(format!(
            "must be above 0 % and below 100 % of the CPU profiled, not {s}"
        ));
    }
    Ok(v / 100.0)
}

/// One step's measurement: what profiling cost and what it observed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CostStep {
    /// Profiler CPU plus its interrupt time, seconds.
    pub cost_s: f64,
    /// Wall time × CPUs observed, seconds.
    pub capacity_s: f64,
    /// The rate in force during the step, Hz.
    pub rate_hz: u64,
}

impl CostStep {
    /// Cost as a fraction of the capacity (0 when nothing was observed).
    pub fn fraction(&self) -> f64 {
        if self.capacity_s > 0.0 {
            (self.cost_s / self.capacity_s).max(0.0)
        } else {
            0.0
        }
    }
}

/// The whole session's cost for one profiler, for the report header.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CostSummary {
    pub cost_s: f64,
    pub capacity_s: f64,
    /// The rate asked for, Hz (0: events with fixed periods only).
    pub requested_hz: u64,
    /// Lowest and highest rate used, and the rate at the end, Hz.
    pub min_hz: u64,
    pub max_hz: u64,
    pub last_hz: u64,
    /// The budget, as a fraction; `None` without `--overhead-budget`.
    pub budget: Option<f64>,
    /// The rate was lowered to stay within the budget.
    pub lowered: bool,
    /// Even the lowest rate cost more than the budget: most steps taken at
    /// it (and at least [`MIN_STEPS_OVER`]) did.
    pub over_at_minimum: bool,
    /// Steps taken at the lowest rate, and how many of them cost more than
    /// the budget.
    #[serde(default)]
    pub at_min_steps: u32,
    #[serde(default)]
    pub at_min_over: u32,
}

impl CostSummary {
    /// Cost as a fraction of the capacity: the estimated slowdown of what
    /// was profiled.
    pub fn fraction(&self) -> f64 {
        if self.capacity_s > 0.0 {
            (self.cost_s / self.capacity_s).max(0.0)
        } else {
            0.0
        }
    }

    /// Add one step.
    pub fn add(&mut self, step: &CostStep) {
        self.cost_s += step.cost_s.max(0.0);
        self.capacity_s += step.capacity_s.max(0.0);
        if step.rate_hz > 0 {
            self.min_hz = if self.min_hz == 0 {
                step.rate_hz
            } else {
                self.min_hz.min(step.rate_hz)
            };
            self.max_hz = self.max_hz.max(step.rate_hz);
            self.last_hz = step.rate_hz;
        }
    }

    /// Count a step against `budget` if it was taken at the lowest rate,
    /// and say whether the budget is missed there: when most steps at that
    /// rate cost more than it, and at least [`MIN_STEPS_OVER`] did (the
    /// typical step, so that a start-up or a new binary's symbols loaded
    /// in one step does not decide).
    pub fn note_step_at_minimum(&mut self, step: &CostStep, budget: f64) {
        if step.rate_hz == 0 || step.rate_hz > MIN_RATE_HZ {
            return;
        }
        self.at_min_steps += 1;
        if step.fraction() > budget {
            self.at_min_over += 1;
        }
        self.over_at_minimum =
            self.at_min_over >= MIN_STEPS_OVER && 2 * self.at_min_over > self.at_min_steps;
    }

    /// One line: "0.42 % of 2 CPUs' time (0.25 s CPU over 30.0 s), 99 Hz".
    pub fn describe(&self, cpus: Option<u32>) -> String {
        let wall = match cpus {
            Some(n) if n > 0 => format!(" over {:.1} s × {n} CPU", self.capacity_s / f64::from(n)),
            _ => String::new(),
        };
        let mut s = format!(
            "{:.2} % of the CPU it observed, the estimated slowdown there ({:.3} s{wall})",
            100.0 * self.fraction(),
            self.cost_s
        );
        if self.max_hz > 0 {
            if self.min_hz == self.max_hz {
                s.push_str(&format!(", {} Hz", self.last_hz));
            } else {
                s.push_str(&format!(
                    ", {}-{} Hz (last {} Hz, asked {} Hz)",
                    self.min_hz, self.max_hz, self.last_hz, self.requested_hz
                ));
            }
        }
        if let Some(b) = self.budget {
            s.push_str(&format!("; budget {} %", percent(b)));
            let over = self.fraction() > b;
            if self.over_at_minimum {
                s.push_str(&format!(
                    ": not met even at the lowest rate ({MIN_RATE_HZ} Hz)"
                ));
            } else if over && self.at_min_steps > 0 && self.last_hz <= MIN_RATE_HZ {
                // Nothing left to pay the excess back with: say where it
                // came from rather than that the rate kept the budget.
                s.push_str(&format!(
                    ": over it by the session's start (its steps at the lowest rate, \
                     {MIN_RATE_HZ} Hz, kept within it: {} of {} over)",
                    self.at_min_over, self.at_min_steps
                ));
            } else if over && self.lowered {
                s.push_str(": over it; the rate was lowered to pay the excess back");
            } else if self.lowered {
                s.push_str(": the rate was lowered to stay within it");
            }
        }
        s
    }
}

/// A fraction as a percentage with as many decimals as it needs (up to
/// six): 0.01 → "1", 0.0025 → "0.25", 1e-6 → "0.0001".
fn percent(f: f64) -> String {
    let t = format!("{:.6}", 100.0 * f);
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Keeps one profiler's rate within its budget.
#[derive(Debug, Clone)]
pub struct RateController {
    budget: f64,
    max_hz: u64,
    hz: u64,
    summary: CostSummary,
}

impl RateController {
    /// A controller for a profiler asked to sample at `requested_hz` (the
    /// highest rate it will use) with `budget` (a fraction, 0 < b < 1). It
    /// starts at [`start_hz`]: the profiler must be set to
    /// [`RateController::rate`] before sampling starts.
    pub fn new(budget: f64, requested_hz: u64) -> RateController {
        RateController {
            budget,
            max_hz: requested_hz.max(MIN_RATE_HZ),
            hz: start_hz(requested_hz),
            summary: CostSummary {
                requested_hz,
                budget: Some(budget),
                ..CostSummary::default()
            },
        }
    }

    /// Start no higher than what a sample's calibrated cost
    /// (`per_sample_s` CPU seconds on the CPU it lands on) allows within
    /// the aim: on an emulated guest, where a sample costs ~100 µs, an
    /// eighth of 1000 Hz alone is several times a 0.5 % share. Call before
    /// the first step.
    pub fn fit_start(&mut self, per_sample_s: f64) {
        if per_sample_s > 0.0 && self.summary.capacity_s == 0.0 {
            let fits = (self.budget * AIM / per_sample_s).floor() as u64;
            self.hz = self.hz.min(fits.max(MIN_RATE_HZ.min(self.hz)));
        }
    }

    /// The rate now in force.
    pub fn rate(&self) -> u64 {
        self.hz
    }

    /// What the session has cost so far.
    pub fn summary(&self) -> &CostSummary {
        &self.summary
    }

    /// Account one step measured at the current rate; returns the new rate
    /// when it should change.
    pub fn observe(&mut self, cost_s: f64, capacity_s: f64) -> Option<u64> {
        let step = CostStep {
            cost_s,
            capacity_s,
            rate_hz: self.hz,
        };
        self.summary.add(&step);
        if capacity_s <= 0.0 || self.hz == 0 {
            return None;
        }
        let frac = step.fraction();
        // The budget holds for the session, not only for each step: what
        // a step overspent (a start-up, the calibration, a burst) the next
        // ones pay back. The next step may spend what brings the session
        // back to the aim, and never more than the aim itself.
        let aim = self.budget * AIM;
        let allowed = ((aim * (self.summary.capacity_s + capacity_s) - self.summary.cost_s)
            / capacity_s)
            .clamp(0.0, aim);
        let ideal = if frac > 0.0 {
            self.hz as f64 * allowed / frac
        } else {
            f64::INFINITY
        };
        let session = self.summary.fraction();
        self.summary.note_step_at_minimum(&step, self.budget);
        let next = if frac > self.budget || session > self.budget {
            self.summary.lowered = true;
            let floor = (self.hz / MAX_DROP).max(MIN_RATE_HZ);
            (ideal.floor() as u64).clamp(floor.min(self.hz), self.hz)
        } else if frac < self.budget * RAISE_BELOW && session <= aim && self.hz < self.max_hz {
            // Up at most twice as fast per step: the cost measured at a low
            // rate predicts the cost at a high one only roughly.
            let up = ideal.min(self.hz as f64 * 2.0);
            (up.floor() as u64).clamp(self.hz, self.max_hz)
        } else {
            self.hz
        };
        if next == self.hz {
            return None;
        }
        self.hz = next;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profiler whose cost is `per_sample` CPU seconds per sample on
    /// `cpus` CPUs, observed for 1 s steps.
    fn simulate(
        budget: f64,
        start: u64,
        per_sample: f64,
        cpus: f64,
        steps: usize,
    ) -> RateController {
        let mut c = RateController::new(budget, start);
        for _ in 0..steps {
            let cost = c.rate() as f64 * cpus * per_sample;
            let _ = c.observe(cost, cpus);
        }
        c
    }

    #[test]
    fn an_expensive_profiler_is_brought_within_its_budget_and_stays() {
        // 99 Hz at 50 µs per sample on 2 CPUs: 0.5 % of the CPU, budget 0.2 %.
        let c = simulate(0.002, 99, 50e-6, 2.0, 10);
        let frac = c.rate() as f64 * 50e-6;
        assert!(frac <= 0.002, "{} Hz costs {frac}", c.rate());
        assert!(frac >= 0.002 * 0.5, "not lowered too far: {} Hz", c.rate());
        assert!(!c.summary().over_at_minimum);
        // Slow start: it climbed from 12 Hz and stopped below the request,
        // never over the budget on the way.
        assert_eq!(c.summary().min_hz, 12);
        assert!(c.summary().max_hz < 99, "{:?}", c.summary());
        let total = c.summary().fraction();
        assert!(total <= 0.002 && total > 0.0005, "{total}");
        // Started at the full rate (a spell the slow start did not catch),
        // it is brought down within the budget.
        let mut c = RateController::new(0.002, 99);
        for _ in 0..4 {
            let _ = c.observe(0.00001, 2.0);
        }
        assert_eq!(c.rate(), 99);
        for _ in 0..5 {
            let cost = c.rate() as f64 * 2.0 * 50e-6;
            let _ = c.observe(cost, 2.0);
        }
        assert!(c.summary().lowered);
        assert!(c.rate() as f64 * 50e-6 <= 0.002, "{} Hz", c.rate());
    }

    #[test]
    fn a_cheap_profiler_climbs_to_the_rate_asked_for_and_stays() {
        let c = simulate(0.01, 99, 10e-6, 2.0, 6);
        assert_eq!(c.rate(), 99);
        assert!(!c.summary().lowered);
        // Slow start: an eighth of the request, doubled per step.
        assert_eq!((c.summary().min_hz, c.summary().max_hz), (12, 99));
        assert_eq!(start_hz(99), 12);
        assert_eq!(start_hz(1000), 125);
        assert_eq!(start_hz(40), MIN_RATE_HZ);
        assert_eq!(start_hz(5), 5);
    }

    #[test]
    fn one_expensive_step_lowers_the_rate_at_most_four_times() {
        let mut c = RateController::new(0.01, 1000);
        for _ in 0..4 {
            let _ = c.observe(0.0001, 1.0);
        }
        assert_eq!(c.rate(), 1000);
        // A spike of 10 % (work that does not depend on the rate).
        assert_eq!(c.observe(0.1, 1.0), Some(250));
        // Quiet again: while the session as a whole is over its budget the
        // rate does not rise (the spike is paid back), and each step lowers
        // it at most four times.
        let mut last = c.rate();
        let mut steps = 0;
        while c.summary().fraction() > 0.01 {
            let r = c.observe(0.0001, 1.0).unwrap_or(last);
            assert!(r <= last && r >= last / 4, "{last} -> {r}");
            last = r;
            steps += 1;
        }
        assert!(steps >= 5, "paid back in {steps} steps");
        // Then it climbs back, doubling.
        for _ in 0..20 {
            if let Some(r) = c.observe(0.0001, 1.0) {
                assert!(r <= 2 * last, "rose from {last} to {r} in one step");
                last = r;
            }
        }
        assert_eq!(c.rate(), 1000);
        assert!(c.summary().fraction() <= 0.01, "{:?}", c.summary());
    }

    #[test]
    fn the_start_fits_the_calibrated_cost_of_a_sample() {
        // 100 µs a sample, 0.5 % budget: 40 Hz per CPU is the aim.
        let mut c = RateController::new(0.005, 1000);
        c.fit_start(100e-6);
        assert_eq!(c.rate(), 40);
        // Cheap samples keep the slow start; costly ones stop at the floor.
        let mut c = RateController::new(0.005, 1000);
        c.fit_start(1e-6);
        assert_eq!(c.rate(), 125);
        let mut c = RateController::new(0.005, 1000);
        c.fit_start(1e-2);
        assert_eq!(c.rate(), MIN_RATE_HZ);
        // Only before the first step.
        let mut c = RateController::new(0.005, 1000);
        let _ = c.observe(0.0001, 1.0);
        let r = c.rate();
        c.fit_start(1e-2);
        assert_eq!(c.rate(), r);
    }

    #[test]
    fn a_session_that_overspent_pays_it_back_and_ends_within_its_budget() {
        // 10 µs per sample on 2 CPUs with 1 s steps at a 1 % budget, and a
        // start-up of 0.15 s in the first step (the calibration): held to
        // the budget step by step only, the session ends at 1.2 % after
        // 10 s.
        let mut c = RateController::new(0.01, 1000);
        for i in 0..10 {
            let startup = if i == 0 { 0.15 } else { 0.0 };
            let cost = c.rate() as f64 * 2.0 * 10e-6 + startup;
            let _ = c.observe(cost, 2.0);
        }
        let f = c.summary().fraction();
        assert!(
            f <= 0.01,
            "session at {:.2} %: {:?}",
            100.0 * f,
            c.summary()
        );
    }

    #[test]
    fn the_rate_rises_again_when_the_cost_falls_but_never_above_the_request() {
        let mut c = RateController::new(0.01, 1000);
        assert_eq!(c.rate(), 125, "slow start");
        // A busy spell: 5 % at 125 Hz.
        assert_eq!(c.observe(0.05, 1.0), Some(31));
        // Then the cost falls to almost nothing: once the spell is paid
        // back the rate climbs.
        let mut last = c.rate();
        for _ in 0..20 {
            if let Some(r) = c.observe(0.0001, 1.0) {
                assert!(r <= 2 * last, "rose from {last} to {r} in one step");
                last = r;
            }
        }
        assert_eq!(c.rate(), 1000);
    }

    #[test]
    fn a_budget_that_cannot_be_met_is_said_and_the_lowest_rate_used() {
        // A fixed cost of 10 % whatever the rate.
        let mut c = RateController::new(0.01, 99);
        for _ in 0..6 {
            let _ = c.observe(0.1, 1.0);
        }
        assert_eq!(c.rate(), MIN_RATE_HZ);
        assert!(c.summary().over_at_minimum);
        assert!(c
            .summary()
            .describe(Some(1))
            .contains("not met even at the lowest rate"));
    }

    #[test]
    fn one_expensive_step_at_the_lowest_rate_is_not_a_missed_budget() {
        let mut c = RateController::new(0.01, 10);
        assert_eq!(c.rate(), MIN_RATE_HZ);
        // A start-up step at 30 %, then steps well within the budget.
        let _ = c.observe(0.3, 1.0);
        for _ in 0..5 {
            let _ = c.observe(0.001, 1.0);
        }
        assert!(!c.summary().over_at_minimum, "{:?}", c.summary());
        let line = c.summary().describe(None);
        assert!(!line.contains("not met"), "{line}");
        // Over the budget in all (the start-up step), and nothing left to
        // pay it back with: said as such, not as a budget kept.
        assert!(c.summary().fraction() > 0.01);
        assert!(
            line.contains("over it by the session's start")
                && line.contains("1 of 6 over")
                && !line.contains("to stay within it"),
            "{line}"
        );
        // Two steps at the minimum cannot say it either, however costly.
        let mut s = CostSummary::default();
        let step = CostStep {
            cost_s: 0.5,
            capacity_s: 1.0,
            rate_hz: MIN_RATE_HZ,
        };
        s.note_step_at_minimum(&step, 0.01);
        s.note_step_at_minimum(&step, 0.01);
        assert!(!s.over_at_minimum);
        s.note_step_at_minimum(&step, 0.01);
        assert!(s.over_at_minimum);
        // Steps above the minimum do not count.
        let mut s = CostSummary::default();
        for _ in 0..5 {
            s.note_step_at_minimum(
                &CostStep {
                    rate_hz: 20,
                    ..step
                },
                0.01,
            );
        }
        assert!(!s.over_at_minimum && s.at_min_steps == 0);
        // Mostly within the budget at the minimum: not said.
        let mut s = CostSummary::default();
        for i in 0..10 {
            let cost_s = if i % 3 == 0 { 0.5 } else { 0.001 };
            s.note_step_at_minimum(&CostStep { cost_s, ..step }, 0.01);
        }
        assert!(!s.over_at_minimum, "{s:?}");
    }

    #[test]
    fn with_active_vms_the_host_and_each_agent_get_half() {
        assert_eq!(shares(0.01, 0), (0.01, 0.01));
        assert_eq!(shares(0.01, 1), (0.005, 0.005));
        assert_eq!(shares(0.02, 32), (0.01, 0.01));
    }

    #[test]
    fn budgets_outside_0_to_100_are_refused() {
        assert_eq!(parse_budget_pct("1").unwrap(), 0.01);
        assert_eq!(parse_budget_pct("0.5%").unwrap(), 0.005);
        for bad in ["0", "-1", "100", "150", "nan", "inf", "x", ""] {
            assert!(parse_budget_pct(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn summary_lines_name_cost_rate_and_budget() {
        let mut s = CostSummary {
            requested_hz: 99,
            ..CostSummary::default()
        };
        s.add(&CostStep {
            cost_s: 0.02,
            capacity_s: 2.0,
            rate_hz: 99,
        });
        assert_eq!(
            s.describe(Some(2)),
            "1.00 % of the CPU it observed, the estimated slowdown there (0.020 s over 1.0 s × 2 CPU), 99 Hz"
        );
    }
}
