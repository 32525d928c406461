//! The start of a sampling session, shared by `record` ([`crate::record`])
//! and the live paths ([`crate::live::LiveSession`], behind `top` and
//! `serve --profile`): everything between opened rings and the first
//! sample, in one order for both.
//!
//! 1. [`SessionStart::begin`] sets up the converter (its symbolizer, the
//!    plan's thread map, unmonitored VMs, guest kernel symbols), feeds it
//!    the processes that already exist (synthesized from `/proc`) and sets
//!    its time origin (the session's second 0); then it opens the
//!    [`CostBook`] (under a budget: the host's starting rate and the
//!    calibration of one sample's cost) and holds the readiness barrier:
//!    every active VM's agent is armed ([`arm_all`]), and a VM whose agent
//!    is not ready continues passive, with the reason and the fix
//!    ([`ArmOutcome`]).
//! 2. The caller keeps the outcomes its own way (`record`: domain rows,
//!    `agent_NAME` metadata and closing notes; the live session:
//!    [`crate::live::LiveEvent::Armed`]).
//! 3. [`Ready::enable`] takes the cost baseline, enables the rings and
//!    starts polling the active agents (see there for why in that order).

use crate::cost::CostBook;
use crate::guest::{arm_all, GuestPollers, GuestProfiler};
use crate::plan::{arm_reason, SessionPlan, VmPlan};
use crate::{Converter, EngineError};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use vmscope_linux::{ProcRoot, Recorder, Target};
use vmscope_model::{Domain, EventSpec, Role};
use vmscope_symbols::Symbolizer;

/// What a session's start needs.
pub(crate) struct StartOptions<'a> {
    pub events: &'a [EventSpec],
    pub callchain: bool,
    /// The converter's symbolizer (resolving, or deferring for `record
    /// --symbolize later`).
    pub symbolizer: Symbolizer,
    /// VMs, roles, agents ([`crate::plan::plan_session`]).
    pub plan: SessionPlan,
    /// What the rings sample: all CPUs, or these processes (whose
    /// existing state alone is synthesized).
    pub target: &'a Target,
    /// How long the readiness barrier waits for each agent.
    pub barrier_timeout: Duration,
    /// `--overhead-budget`, shared by the host recorder and the agents.
    pub overhead_budget: Option<f64>,
    /// How often each active VM's agent is polled (stretched up to
    /// [`crate::guest::BUDGET_LONGEST_POLL`] under a budget).
    pub poll_every: Duration,
}

/// One VM's role after the barrier.
pub(crate) struct ArmOutcome {
    /// Its domain, with the role it has now (active, or passive).
    pub domain: Domain,
    /// Its detail as planned (the QEMU process and threads).
    pub detail: String,
    /// `None` when its agent is armed; for a VM that continues passive,
    /// the reason and the fix.
    pub plan: Option<VmPlan>,
}

/// A session set up up to its first sample: converter fed, agents armed.
pub(crate) struct SessionStart {
    pub conv: Converter,
    /// When the converter's time origin was set: second 0 of the session.
    pub origin: Instant,
    /// Every VM's domain (role after the barrier) and detail, by name.
    pub vm_detail: HashMap<String, (Domain, String)>,
    /// The barrier's outcome per VM whose agent was armed or tried.
    pub armed: Vec<ArmOutcome>,
    /// What enables sampling.
    pub ready: Ready,
}

/// The step that starts sampling ([`Ready::enable`]).
pub(crate) struct Ready {
    cost: CostBook,
    active: Vec<Box<dyn GuestProfiler>>,
    poll_every: Duration,
    longest_poll: Duration,
}

/// A session that samples.
pub(crate) struct Sampling {
    /// What each profiler costs, measured from [`Ready::enable`].
    pub cost: CostBook,
    /// The active agents' polling threads (none without active VMs).
    pub pollers: Option<GuestPollers>,
    /// When the rings were enabled (the pollers' time origin).
    pub enabled: Instant,
}

impl SessionStart {
    /// Set up the session on `rec` (opened, not enabled): converter,
    /// existing processes, time origin, cost book and the readiness
    /// barrier. Sampling starts with [`Ready::enable`].
    pub(crate) fn begin(
        rec: &mut Recorder,
        opts: StartOptions<'_>,
    ) -> Result<SessionStart, EngineError> {
        let StartOptions {
            events,
            callchain,
            symbolizer,
            plan,
            target,
            barrier_timeout,
            overhead_budget,
            poll_every,
        } = opts;
        let mut conv = Converter::new(symbolizer, plan.threads);
        for vm in &plan.unmonitored {
            conv.set_unmonitored(vm);
        }
        for (vm, k) in plan.guest_kallsyms {
            conv.symbolizer_mut().add_guest_kallsyms(&vm, k);
        }
        // Existing processes: maps and names from /proc.
        let pids_filter: Option<&[u32]> = match target {
            Target::AllCpus => None,
            Target::Pids(p) => Some(p),
        };
        for r in vmscope_linux::synthesize_from_proc(&ProcRoot::system(), pids_filter) {
            conv.push(r);
        }
        let origin = Instant::now();
        conv.set_origin(vmscope_linux::clock_monotonic_ns());

        // What profiling costs, from here (the interrupt level until
        // sampling starts is the host's own).
        let cost = CostBook::new(rec, events, callchain, overhead_budget, plan.guests.len())?;
        let mut guests = plan.guests;
        for g in &mut guests {
            g.set_overhead_budget(cost.guest_budget());
        }
        let mut vm_detail: HashMap<String, (Domain, String)> = plan
            .domains
            .iter()
            .map(|(d, det)| (d.name.clone(), (d.clone(), det.clone())))
            .collect();
        // The readiness barrier: every active agent armed before the host
        // starts.
        let mut armed = Vec::new();
        let mut active: Vec<Box<dyn GuestProfiler>> = Vec::new();
        for a in arm_all(guests, events, callchain, barrier_timeout) {
            let (mut dom, det) = vm_detail.get(&*a.domain).cloned().unwrap_or_else(|| {
                (
                    Domain {
                        name: a.domain.to_string(),
                        role: Role::Active,
                        pid: None,
                    },
                    String::new(),
                )
            });
            let plan = match a.result {
                Ok(g) => {
                    dom.role = Role::Active;
                    active.push(g);
                    None
                }
                Err((_, why)) => {
                    let (reason, fix) = arm_reason(&why, barrier_timeout);
                    dom.role = Role::Passive;
                    Some(VmPlan {
                        name: a.domain.to_string(),
                        role: Role::Passive,
                        reason: Some(reason),
                        fix,
                    })
                }
            };
            vm_detail.insert(dom.name.clone(), (dom.clone(), det.clone()));
            armed.push(ArmOutcome {
                domain: dom,
                detail: det,
                plan,
            });
        }
        let longest_poll = match overhead_budget {
            Some(_) => crate::guest::BUDGET_LONGEST_POLL,
            None => poll_every,
        };
        Ok(SessionStart {
            conv,
            origin,
            vm_detail,
            armed,
            ready: Ready {
                cost,
                active,
                poll_every,
                longest_poll,
            },
        })
    }
}

impl Ready {
    /// Start sampling: the cost baseline, then the rings, then the agents'
    /// polling (its time origin the moment the rings were enabled).
    ///
    /// The baseline (`CostBook::sampling_starts`) is taken right before
    /// the rings are enabled, never after:
    /// - it closes the window over which the host's own interrupt level is
    ///   measured (from `CostBook::new`, through the barrier), which every
    ///   later step subtracts as not profiling's. Taken after enabling,
    ///   that window would hold the first samples' interrupts, and the
    ///   recorder would be credited with part of its own cost for the
    ///   whole session.
    /// - it opens the first cost step: the set-up before it (`/proc`
    ///   synthesized, agents armed) is not charged to sampling (a
    ///   calibration is, on its own, through the cost book), and the step
    ///   covers the whole first sampling interval, the enabling itself and
    ///   the first samples included. Taken after enabling, that CPU time
    ///   fell outside every step, and the samples taken meanwhile were
    ///   counted against a capacity that lacked their time.
    pub(crate) fn enable(self, rec: &mut Recorder) -> Result<Sampling, EngineError> {
        let Ready {
            mut cost,
            active,
            poll_every,
            longest_poll,
        } = self;
        cost.sampling_starts();
        rec.enable()?;
        let enabled = Instant::now();
        let pollers = (!active.is_empty())
            .then(|| GuestPollers::spawn_stretching(active, poll_every, longest_poll, enabled));
        Ok(Sampling {
            cost,
            pollers,
            enabled,
        })
    }
}
