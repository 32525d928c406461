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

/// One domain's cost so far, and where its last step ended.
#[derive(Debug, Default)]
struct DomainCost {
    summary: CostSummary,
    last_t: f64,
}

/// The cost of every profiler in one recording.
pub(crate) struct CostBook {
    meter: SelfCost,
    ctl: Option<RateController>,
    host: DomainCost,
    host_rate: u64,
    vms: BTreeMap<String, DomainCost>,
    rows: Vec<IntervalRow>,
    budget: Option<f64>,
    requested_hz: u64,
    cpus: u32,
}

impl CostBook {
    /// Start measuring the host recorder `rec` (call before the agents are
    /// armed: until [`CostBook::sampling_starts`], interrupt time is the
    /// host's own level). `budget` is a fraction of the host's CPU.
    pub(crate) fn new(rec: &Recorder, requested_hz: u64, budget: Option<f64>) -> CostBook {
        let cpus = rec.cpus().len() as u32;
        let host_rate = if rec.has_frequency_events() {
            requested_hz
        } else {
            0
        };
        CostBook {
            meter: SelfCost::start(ProcRoot::system(), cpus),
            ctl: budget
                .filter(|_| host_rate > 0)
                .map(|b| RateController::new(b, host_rate)),
            host: DomainCost {
                summary: CostSummary {
                    requested_hz: host_rate,
                    budget,
                    ..CostSummary::default()
                },
                last_t: 0.0,
            },
            host_rate,
            vms: BTreeMap::new(),
            rows: Vec::new(),
            budget,
            requested_hz,
            cpus,
        }
    }

    /// Sampling starts now.
    pub(crate) fn sampling_starts(&mut self) {
        self.meter.sampling_starts();
    }

    /// One step of the host recorder, `t` seconds into the recording; under
    /// a budget its rate may change.
    pub(crate) fn host_step(&mut self, rec: &mut Recorder, t: f64) -> Result<(), EngineError> {
        let (cost_s, capacity_s) = self.meter.step();
        let step = CostStep {
            cost_s,
            capacity_s,
            rate_hz: self.host_rate,
        };
        self.push_rows("host", &step, self.host.last_t, t);
        self.host.summary.add(&step);
        self.host.last_t = t;
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
        let last_t = {
            let d = self
                .vms
                .entry(domain.to_string())
                .or_insert_with(|| DomainCost {
                    summary: CostSummary {
                        requested_hz: requested,
                        budget,
                        ..CostSummary::default()
                    },
                    last_t: 0.0,
                });
            let last = d.last_t;
            d.summary.add(&step);
            if step.rate_hz > 0 && step.rate_hz < requested {
                d.summary.lowered = true;
            }
            if let Some(b) = budget {
                if step.rate_hz > 0
                    && step.rate_hz <= vmscope_model::budget::MIN_RATE_HZ
                    && step.fraction() > b
                {
                    d.summary.over_at_minimum = true;
                }
            }
            d.last_t = t;
            last
        };
        self.push_rows(domain, &step, last_t, t);
    }

    fn push_rows(&mut self, domain: &str, step: &CostStep, t_start: f64, t_end: f64) {
        for (metric, value, unit) in [
            ("rate", step.rate_hz as f64, "Hz"),
            ("cost", step.cost_s, "s"),
            ("capacity", step.capacity_s, "s"),
        ] {
            self.rows.push(IntervalRow {
                kind: "profiler".into(),
                t_start,
                t_end,
                cpu: None,
                domain: Some(domain.to_string()),
                vcpu: None,
                metric: metric.into(),
                value,
                unit: unit.into(),
            });
        }
    }

    /// Store the steps measured since the last call.
    pub(crate) fn flush(&mut self, writer: &mut SessionWriter) -> Result<(), EngineError> {
        if !self.rows.is_empty() {
            writer.add_intervals(&self.rows)?;
            self.rows.clear();
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
        let host = std::iter::once(("host".to_string(), &self.host, Some(self.cpus)));
        let vms = self.vms.iter().map(|(n, d)| (n.clone(), d, None));
        for (name, d, cpus) in host.chain(vms) {
            let line = d.summary.describe(cpus);
            writer.set_meta(&format!("profiler_{name}"), &line)?;
            if d.summary.over_at_minimum || d.summary.lowered {
                notes.push(format!("profiling cost in {name}: {line}"));
            }
        }
        Ok(notes)
    }
}
