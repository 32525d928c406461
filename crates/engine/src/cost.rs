//! What profiling cost during a recording, per profiler: the host
//! recorder's own (measured here with `vmscope_linux::selfcost`, its rate
//! kept within `--overhead-budget` by `vmscope_model::budget`) and each
//! active VM's agent's (measured in the guest, sent with its deltas).
//!
//! Stored in the session as interval rows of kind `profiler` (per domain
//! and step: `rate` in Hz, `cost` and `capacity` in s) and one metadata line
//! per domain, `profiler_<domain>`, that the report header shows.

use std::collections::BTreeMap;
use vmscope_linux::selfcost::SelfCost;
use vmscope_linux::{ProcRoot, Recorder};
use vmscope_model::budget::{CostStep, CostSummary, RateController};
use vmscope_store::{IntervalRow, SessionWriter};

use crate::EngineError;

/// The sampling rate asked for: the first event given as a frequency, Hz
/// (0: every event has a fixed period, so no rate to adjust).
pub(crate) fn requested_hz(events: &[vmscope_model::EventSpec]) -> u64 {
    events
        .iter()
        .find_map(|e| match e.rate {
            vmscope_model::SampleRate::Frequency(f) => Some(f),
            vmscope_model::SampleRate::Period(_) => None,
        })
        .unwrap_or(0)
}

/// The cost of every profiler in one recording.
pub(crate) struct CostBook {
    meter: SelfCost,
    ctl: Option<RateController>,
    host: ProfilerCost,
    host_rate: u64,
    host_last_t: f64,
    /// VM name → its agent's cost so far and where its last step ended.
    vms: BTreeMap<String, (ProfilerCost, f64)>,
    steps: Vec<ProfilerStep>,
    /// Each active VM's agent's share of the budget.
    budget: Option<f64>,
    requested_hz: u64,
    /// What one host sample costs beyond the irq column, when calibrated.
    per_sample: Option<vmscope_linux::samplecost::SampleCost>,
}

impl CostBook {
    /// Start measuring the host recorder `rec`, opened with `events` (call
    /// before the agents are armed: until [`CostBook::sampling_starts`],
    /// interrupt time is the host's own level). `budget` is a fraction of
    /// the host's CPU, shared with `active_vms` agents
    /// ([`vmscope_model::budget::shares`]). Under a budget the recorder is set to the
    /// controller's starting rate here (before it is enabled), and what
    /// one sample costs is calibrated first (`samplecost`: kernels without
    /// interrupt time accounting hide it).
    pub(crate) fn new(
        rec: &mut Recorder,
        events: &[vmscope_model::EventSpec],
        callchain: bool,
        budget: Option<f64>,
        active_vms: usize,
    ) -> Result<CostBook, EngineError> {
        let requested_hz = requested_hz(events);
        let (host_budget, guest_budget) = match budget {
            Some(b) => {
                let (h, g) = vmscope_model::budget::shares(b, active_vms);
                (Some(h), Some(g))
            }
            None => (None, None),
        };
        let cpus = rec.cpus().len() as u32;
        let asked = if rec.has_frequency_events() {
            requested_hz
        } else {
            0
        };
        let mut ctl = host_budget
            .filter(|_| asked > 0)
            .map(|b| RateController::new(b, asked));
        // A calibration that fails leaves the cost to the irq column, as
        // without a budget; the closing note says which it was.
        let per_sample = match ctl {
            Some(_) => vmscope_linux::samplecost::calibrate_or_reuse(
                events,
                callchain,
                Some(std::path::Path::new(vmscope_linux::samplecost::REUSE_FILE)),
            )
            .ok()
            .flatten(),
            None => None,
        };
        if let (Some(c), Some(k)) = (&mut ctl, &per_sample) {
            c.fit_start(k.per_sample_s);
        }
        let host_rate = ctl.as_ref().map_or(asked, RateController::rate);
        if host_rate != asked {
            rec.set_frequency(host_rate)?;
        }
        let mut meter = SelfCost::start(ProcRoot::system(), cpus);
        if let Some(c) = &per_sample {
            meter.use_calibration(c);
        }
        Ok(CostBook {
            meter,
            ctl,
            host: ProfilerCost::new("host", asked, host_budget, Some(cpus)),
            host_rate,
            host_last_t: 0.0,
            vms: BTreeMap::new(),
            steps: Vec::new(),
            budget: guest_budget,
            requested_hz,
            per_sample,
        })
    }

    /// The budget each active VM's agent is given (its share of
    /// `--overhead-budget`).
    pub(crate) fn guest_budget(&self) -> Option<f64> {
        self.budget
    }

    /// Sampling starts now.
    pub(crate) fn sampling_starts(&mut self) {
        self.meter.sampling_starts();
    }

    /// One step of the host recorder, `t` seconds into the recording, with
    /// `samples` taken so far; under a budget its rate may change.
    pub(crate) fn host_step(
        &mut self,
        rec: &mut Recorder,
        t: f64,
        samples: u64,
    ) -> Result<(), EngineError> {
        let (cost_s, capacity_s) = self.meter.step(samples);
        let step = CostStep {
            cost_s,
            capacity_s,
            rate_hz: self.host_rate,
        };
        self.steps.push(ProfilerStep {
            domain: "host".into(),
            t_start: self.host_last_t,
            t_end: t,
            step,
        });
        self.host.summary.add(&step);
        self.host_last_t = t;
        if let Some(ctl) = self.ctl.as_mut() {
            if let Some(hz) = ctl.observe(cost_s, capacity_s) {
                rec.set_frequency(hz)?;
                self.host_rate = hz;
            }
            let s = ctl.summary();
            self.host.summary.lowered = s.lowered;
            self.host.summary.over_at_minimum = s.over_at_minimum;
        }
        Ok(())
    }

    /// A step of VM `domain`'s agent, received `t` seconds into the recording.
    pub(crate) fn guest_step(&mut self, domain: &str, step: CostStep, t: f64) {
        let (budget, requested) = (self.budget, self.requested_hz);
        let (cost, last_t) = self
            .vms
            .entry(domain.to_string())
            .or_insert_with(|| (ProfilerCost::new(domain, requested, budget, None), 0.0));
        cost.add_step(&step);
        self.steps.push(ProfilerStep {
            domain: domain.to_string(),
            t_start: *last_t,
            t_end: t,
            step,
        });
        *last_t = t;
    }

    /// The steps measured since the last call.
    pub(crate) fn take_steps(&mut self) -> Vec<ProfilerStep> {
        std::mem::take(&mut self.steps)
    }

    /// Every profiler's cost so far: the host's first, then each VM's.
    pub(crate) fn snapshot(&self) -> Vec<ProfilerCost> {
        std::iter::once(self.host.clone())
            .chain(self.vms.values().map(|(c, _)| c.clone()))
            .collect()
    }

    /// Store the steps measured since the last call.
    pub(crate) fn flush(&mut self, writer: &mut SessionWriter) -> Result<(), EngineError> {
        let rows: Vec<IntervalRow> = self
            .take_steps()
            .iter()
            .flat_map(ProfilerStep::rows)
            .collect();
        if !rows.is_empty() {
            writer.add_intervals(&rows)?;
        }
        Ok(())
    }

    /// Store the rest and one summary line per domain
    /// (`profiler_<domain>`); returns notes for the user (a budget that
    /// forced a rate down or could not be met).
    pub(crate) fn finish(
        &mut self,
        writer: &mut SessionWriter,
    ) -> Result<Vec<String>, EngineError> {
        self.flush(writer)?;
        let mut notes = Vec::new();
        if let Some(c) = &self.per_sample {
            let line = format!(
                "{:.1} µs per sample ({}; counted with the recorder's CPU, since this \
                 kernel's irq time does not show them)",
                c.per_sample_s * 1e6,
                c.source()
            );
            writer.set_meta("profiler_host_interrupts", &line)?;
        }
        for p in self.snapshot() {
            writer.set_meta(&p.meta_key(), &p.describe())?;
            if let Some(n) = p.note() {
                notes.push(n);
            }
        }
        Ok(notes)
    }
}

/// One measured step of one profiler.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilerStep {
    /// `host`, or the VM's name.
    pub domain: String,
    /// Seconds since the recording started.
    pub t_start: f64,
    pub t_end: f64,
    pub step: CostStep,
}

impl ProfilerStep {
    /// The step as the session's `profiler` interval rows: `rate` (Hz),
    /// `cost` and `capacity` (s).
    pub fn rows(&self) -> [IntervalRow; 3] {
        let row = |metric: &str, value: f64, unit: &str| IntervalRow {
            kind: "profiler".into(),
            t_start: self.t_start,
            t_end: self.t_end,
            cpu: None,
            domain: Some(self.domain.clone()),
            vcpu: None,
            metric: metric.into(),
            value,
            unit: unit.into(),
        };
        [
            row("rate", self.step.rate_hz as f64, "Hz"),
            row("cost", self.step.cost_s, "s"),
            row("capacity", self.step.capacity_s, "s"),
        ]
    }
}

/// What one profiler (the host recorder, or one VM's agent) cost so far.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilerCost {
    /// `host`, or the VM's name.
    pub domain: String,
    pub summary: CostSummary,
    /// CPUs observed (the host's); `None` for an agent.
    pub cpus: Option<u32>,
}

impl ProfilerCost {
    /// Nothing measured yet.
    pub fn new(domain: &str, requested_hz: u64, budget: Option<f64>, cpus: Option<u32>) -> Self {
        ProfilerCost {
            domain: domain.to_string(),
            summary: CostSummary {
                requested_hz,
                budget,
                ..CostSummary::default()
            },
            cpus,
        }
    }

    /// Count a measured step; whether the rate was lowered, or the budget
    /// missed at the lowest rate, is read from the step (an agent's
    /// controller runs in its guest, so this is all the host knows of it).
    pub fn add_step(&mut self, step: &CostStep) {
        let s = &mut self.summary;
        s.add(step);
        if step.rate_hz > 0 && step.rate_hz < s.requested_hz {
            s.lowered = true;
        }
        if let Some(b) = s.budget {
            s.note_step_at_minimum(step, b);
        }
    }

    /// The session metadata key that holds [`ProfilerCost::describe`].
    pub fn meta_key(&self) -> String {
        format!("profiler_{}", self.domain)
    }

    /// One line, as the report header shows it.
    pub fn describe(&self) -> String {
        self.summary.describe(self.cpus)
    }

    /// A note for the user when a budget forced the rate down or could not
    /// be met.
    pub fn note(&self) -> Option<String> {
        (self.summary.over_at_minimum || self.summary.lowered)
            .then(|| format!("profiling cost in {}: {}", self.domain, self.describe()))
    }
}
