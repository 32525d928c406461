//! A live profiling session without a file: the host's rings, the
//! converter and the active VMs' agents, read a step at a time. `top` and
//! `serve --profile` keep a rolling window of what it yields. `record` does
//! not use it: it has its own loop ([`crate::record`]), with the converter
//! on a helper thread ([`crate::pipeline::ConvertThread`]) so that reading
//! the rings never waits on symbol loading, and writes the session file.
//! Both start the same way ([`crate::start`]: `/proc` synthesized, agents
//! armed behind the barrier, the cost baseline, rings enabled). This module
//! owns the live session's steps and the agents' bookkeeping (busy time
//! per VM and event, lost samples, lost agents; VMs started after the
//! session began are found every [`VM_SCAN`] and profiled passive), so
//! every consumer scales guest rows the same way, and what profiling costs
//! (`crate::cost`, the rates kept within [`LiveOptions::overhead_budget`]).

use crate::cost::{CostBook, ProfilerCost, ProfilerStep};
use crate::guest::{GuestDelta, GuestEvent, GuestPollers};
use crate::plan::{SessionPlan, VmPlan};
use crate::start::{Sampling, SessionStart, StartOptions};
use crate::{Converter, ConverterStats, EngineError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmscope_linux::{ProcRoot, Recorder, Target};
use vmscope_model::{AggKey, Domain, EventSpec, Profile, Record, Role};
use vmscope_symbols::{Symbolizer, SymbolizerOptions};

/// How a live session runs.
pub struct LiveOptions {
    pub events: Vec<EventSpec>,
    pub callchain: bool,
    pub symbolizer: SymbolizerOptions,
    /// VMs, roles, agents ([`crate::plan::plan_session`]).
    pub plan: SessionPlan,
    /// How long the readiness barrier waits for each agent.
    pub barrier_timeout: Duration,
    /// How often each active VM's agent is polled.
    pub poll_every: Duration,
    /// Keep the host recorder's and each agent's cost within this fraction
    /// of the CPU each observes by lowering or raising its rate
    /// (`--overhead-budget`); `None`: the rates asked for. Costs are
    /// measured either way.
    pub overhead_budget: Option<f64>,
}

/// How often the host recorder's cost is measured (and, under a budget, its
/// rate adjusted).
const COST_STEP: Duration = Duration::from_secs(1);

/// How often `/proc` is looked through for VMs started since the session
/// began (without asking their monitors: a scan of process names).
pub const VM_SCAN: Duration = Duration::from_secs(5);

/// Why a VM found after the start is passive, and what would change it.
pub const LATE_VM_REASON: &str =
    "it started after this session began; its agent is armed only at the start";
const LATE_VM_FIX: &str = "restart the session to profile it active";

/// The name a VM found by a later scan (`name`, process `pid`) takes in a
/// session that knows the VMs of `known`: `None` when the session knows
/// its process already (whatever a scan without the monitor calls it);
/// `NAME-pidPID` when a VM of the session whose process is `alive` holds
/// the name (a restarted VM's new process takes the name back).
fn late_vm_name(
    known: &HashMap<String, (Domain, String)>,
    name: &str,
    pid: u32,
    alive: impl Fn(u32) -> bool,
) -> Option<String> {
    if known.values().any(|(d, _)| d.pid == Some(pid)) {
        return None;
    }
    match known.get(name) {
        Some((d, _)) if d.pid.is_some_and(alive) => Some(format!("{name}-pid{pid}")),
        _ => Some(name.to_string()),
    }
}

/// Something a consumer may want to store or show.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveEvent {
    /// A VM's role after the barrier: active, or passive with the reason.
    Armed {
        domain: Domain,
        detail: String,
        plan: Option<VmPlan>,
    },
    /// A VM's agent stopped answering at `at` seconds.
    AgentLost {
        domain: Domain,
        detail: String,
        at: f64,
        why: String,
    },
    /// A VM's QEMU process exited at `at` seconds.
    VmEnded {
        domain: Domain,
        detail: String,
        at: f64,
    },
}

/// What the agents measured, cumulative since the session started.
#[derive(Debug, Clone, Default)]
pub struct AgentTotals {
    /// (VM, event) → (busy period, samples) in the guest, idle task left out.
    pub busy: HashMap<(Arc<str>, u32), (u64, u64)>,
    /// Samples each VM's agent lost.
    pub lost: HashMap<Arc<str>, u64>,
}

impl AgentTotals {
    /// Count one agent delta of VM `domain` here and add its rows to
    /// `rows`: what `record` stores and what the live view shows come from
    /// this one place.
    /// Rows are booked in `second` (since the session's start): the second
    /// they arrive in, polled every 500 ms.
    pub(crate) fn absorb(
        &mut self,
        domain: &Arc<str>,
        delta: GuestDelta,
        second: u32,
        rows: &mut Profile,
    ) {
        *self.lost.entry(domain.clone()).or_default() += delta.lost;
        for r in delta.rows {
            // The guest's idle task is not host CPU: kept in the agent's
            // rows, left out of the scale.
            if r.process != "swapper" {
                let b = self.busy.entry((domain.clone(), r.event)).or_default();
                b.0 += r.period;
                b.1 += r.samples;
            }
            rows.add(
                AggKey {
                    event: r.event,
                    domain: domain.clone(),
                    context: r.context,
                    process: r.process.into(),
                    image: r.image.into(),
                    symbol: r.symbol.into(),
                    stack: r.stack.into(),
                    srcline: "".into(),
                    second,
                    cpu: r.cpu.unwrap_or(vmscope_model::UNKNOWN_SLICE),
                },
                r.samples,
                r.period,
            );
        }
    }
}

/// A running live session.
pub struct LiveSession {
    rec: Recorder,
    conv: Converter,
    pollers: Option<GuestPollers>,
    /// Agent rows since the last [`LiveSession::take_agent_delta`].
    agent_delta: Profile,
    totals: AgentTotals,
    vm_detail: HashMap<String, (Domain, String)>,
    ended: std::collections::HashSet<String>,
    lost_at: HashMap<String, f64>,
    events: Vec<LiveEvent>,
    buf: Vec<Record>,
    t0: Instant,
    last_ended_check: Instant,
    cost: CostBook,
    last_cost_step: Instant,
    last_vm_scan: Instant,
    dump: bool,
}

impl LiveSession {
    /// Start on `rec` (opened, not enabled) for `target` as `record` starts
    /// ([`crate::start`]): synthesize the existing processes, arm every
    /// active VM's agent (the barrier; a VM whose agent is not ready
    /// continues passive, with the reason), then enable the rings. The arm
    /// outcomes are the first events.
    pub fn start(
        mut rec: Recorder,
        target: &Target,
        opts: LiveOptions,
    ) -> Result<LiveSession, EngineError> {
        let SessionStart {
            conv,
            origin: _,
            vm_detail,
            armed,
            ready,
        } = SessionStart::begin(
            &mut rec,
            StartOptions {
                events: &opts.events,
                callchain: opts.callchain,
                symbolizer: Symbolizer::new(opts.symbolizer),
                plan: opts.plan,
                target,
                barrier_timeout: opts.barrier_timeout,
                overhead_budget: opts.overhead_budget,
                poll_every: opts.poll_every,
            },
        )?;
        let events = armed
            .into_iter()
            .map(|a| LiveEvent::Armed {
                domain: a.domain,
                detail: a.detail,
                plan: a.plan,
            })
            .collect();
        let Sampling {
            cost,
            pollers,
            enabled: t0,
        } = ready.enable(&mut rec)?;
        Ok(LiveSession {
            rec,
            conv,
            pollers,
            agent_delta: Profile::new(),
            totals: AgentTotals::default(),
            vm_detail,
            ended: std::collections::HashSet::new(),
            lost_at: HashMap::new(),
            events,
            buf: Vec::with_capacity(4096),
            t0,
            last_ended_check: t0,
            cost,
            last_cost_step: t0,
            last_vm_scan: t0,
            // VMSCOPE_DUMP_RECORDS=1 prints the record stream (debugging aid).
            dump: std::env::var_os("VMSCOPE_DUMP_RECORDS").is_some(),
        })
    }

    /// Read the rings once (waiting up to `wait` for data) and take what
    /// the agents sent.
    pub fn step(&mut self, wait: Duration) -> Result<(), EngineError> {
        self.buf.clear();
        self.rec.read(wait, &mut self.buf)?;
        if self.dump {
            for r in &self.buf {
                eprintln!("{r:?}");
            }
        }
        self.conv.push_batch(self.buf.drain(..));
        if let Some(p) = &self.pollers {
            let evs: Vec<GuestEvent> = p.events.try_iter().collect();
            for ev in evs {
                self.take_guest(ev);
            }
        }
        if self.last_ended_check.elapsed() >= Duration::from_millis(500) {
            self.mark_ended_vms();
            self.last_ended_check = Instant::now();
        }
        if self.last_vm_scan.elapsed() >= VM_SCAN {
            self.adopt_new_vms(crate::plan::vm_map(&vmscope_discover::DiscoverOptions {
                query_qmp: false,
                ..Default::default()
            }));
            self.last_vm_scan = Instant::now();
        }
        if self.last_cost_step.elapsed() >= COST_STEP {
            self.cost.host_step(
                &mut self.rec,
                self.t0.elapsed().as_secs_f64(),
                self.conv.stats().samples,
            )?;
            self.last_cost_step = Instant::now();
        }
        Ok(())
    }

    /// What each profiler (host recorder, each active VM's agent) cost so
    /// far, with the rates used.
    pub fn profiler_costs(&self) -> Vec<ProfilerCost> {
        self.cost.snapshot()
    }

    /// Each profiler's steps (rate, cost, capacity) measured since the
    /// previous call.
    pub fn take_profiler_steps(&mut self) -> Vec<ProfilerStep> {
        self.cost.take_steps()
    }

    /// Stop sampling: disable the rings, read what is left, collect every
    /// agent's last rows.
    pub fn stop(&mut self) -> Result<(), EngineError> {
        self.rec.disable()?;
        self.buf.clear();
        self.rec.read(Duration::from_millis(0), &mut self.buf)?;
        self.conv.push_batch(self.buf.drain(..));
        if let Some(p) = self.pollers.take() {
            for ev in p.stop().try_iter() {
                self.take_guest(ev);
            }
        }
        Ok(())
    }

    /// The host's measurements since the previous call.
    pub fn take_host_delta(&mut self) -> Profile {
        self.conv.take_delta()
    }

    /// The agents' rows since the previous call.
    pub fn take_agent_delta(&mut self) -> Profile {
        self.agent_delta.take()
    }

    /// Events since the previous call (arm outcomes, lost agents, ended VMs).
    pub fn take_events(&mut self) -> Vec<LiveEvent> {
        std::mem::take(&mut self.events)
    }

    /// The converter's counters (samples, lost, guest time the host measured
    /// per VM and event), cumulative.
    pub fn stats(&self) -> &ConverterStats {
        self.conv.stats()
    }

    /// What the agents measured, cumulative.
    pub fn agent_totals(&self) -> &AgentTotals {
        &self.totals
    }

    /// Host CPUs sampled.
    pub fn cpus(&self) -> usize {
        self.rec.cpus().len()
    }

    /// Seconds since sampling started.
    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Build-ids (hex) of the files symbols came from so far, by path.
    pub fn build_ids(&mut self) -> Vec<(String, String)> {
        self.conv.symbolizer_mut().build_ids()
    }

    /// The VMs' domains as armed (role after the barrier) and their details.
    pub fn domains(&self) -> Vec<(Domain, String)> {
        let mut v: Vec<(Domain, String)> = self.vm_detail.values().cloned().collect();
        v.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        v
    }

    /// Symbolizer warnings so far, sorted and deduplicated.
    pub fn warnings(&mut self) -> Vec<String> {
        let mut w = self.conv.symbolizer_mut().warnings();
        w.sort();
        w.dedup();
        w
    }

    fn take_guest(&mut self, ev: GuestEvent) {
        match ev {
            GuestEvent::Delta { domain, delta } => {
                if let Some(step) = delta.cost {
                    self.cost
                        .guest_step(&domain, step, self.t0.elapsed().as_secs_f64());
                }
                let second = u32::try_from(self.t0.elapsed().as_secs()).unwrap_or(u32::MAX - 1);
                self.totals
                    .absorb(&domain, delta, second, &mut self.agent_delta);
            }
            GuestEvent::Lost { domain, at, why } => {
                self.lost_at.insert(domain.to_string(), at);
                // A VM already seen to have exited keeps that (earlier, firmer) mark.
                if self.ended.contains(&*domain) {
                    return;
                }
                if let Some((d, det)) = self.vm_detail.get(&*domain) {
                    self.events.push(LiveEvent::AgentLost {
                        domain: d.clone(),
                        detail: det.clone(),
                        at,
                        why: why.to_string(),
                    });
                }
            }
            // Rows that came late are booked when they come.
            GuestEvent::Late { .. } | GuestEvent::Stopped { .. } => {}
        }
    }

    /// Take in the VMs of `map` that this session does not know yet (a QEMU
    /// process it has not seen; one whose name a running VM of the session
    /// holds is named `NAME-pidPID`): from now on their
    /// threads are theirs, profiled passive from the host, and an
    /// [`LiveEvent::Armed`] event says so with the reason. Until this scan
    /// their samples were the host's, as for any process.
    pub fn adopt_new_vms(&mut self, map: crate::plan::VmMap) {
        for (vm, (mut dom, detail)) in map.vms.iter().zip(map.domains) {
            let Some(name) = late_vm_name(&self.vm_detail, &vm.name, vm.pid, |p| {
                ProcRoot::system().exists(p)
            }) else {
                continue;
            };
            self.conv.add_vm(
                &name,
                vm.pid,
                vm.accel == vmscope_discover::Accel::Tcg,
                vm.tids(),
            );
            dom.name = name.clone();
            dom.role = Role::Passive;
            self.ended.remove(&name);
            self.vm_detail
                .insert(name.clone(), (dom.clone(), detail.clone()));
            self.events.push(LiveEvent::Armed {
                domain: dom,
                detail,
                plan: Some(VmPlan {
                    name,
                    role: Role::Passive,
                    reason: Some(LATE_VM_REASON.into()),
                    fix: Some(LATE_VM_FIX.into()),
                }),
            });
        }
    }

    /// VMs whose QEMU exited (their data so far stays).
    fn mark_ended_vms(&mut self) {
        let at = self.t0.elapsed().as_secs_f64();
        for (name, (d, det)) in &self.vm_detail {
            let Some(pid) = d.pid else { continue };
            if !ProcRoot::system().exists(pid) && self.ended.insert(name.clone()) {
                self.events.push(LiveEvent::VmEnded {
                    domain: d.clone(),
                    detail: det.clone(),
                    at,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_vm_is_named_apart_from_the_running_vms_of_the_session() {
        let vm = |name: &str, pid: u32| {
            (
                name.to_string(),
                (
                    Domain {
                        name: name.into(),
                        role: Role::Active,
                        pid: Some(pid),
                    },
                    String::new(),
                ),
            )
        };
        let known: HashMap<_, _> = [vm("web", 100), vm("db", 200)].into_iter().collect();
        let alive = |p: u32| p == 100;
        // Known by its process, under any name.
        assert_eq!(late_vm_name(&known, "web", 100, alive), None);
        assert_eq!(late_vm_name(&known, "pid100", 100, alive), None);
        // New.
        assert_eq!(
            late_vm_name(&known, "cache", 300, alive),
            Some("cache".into())
        );
        // A running VM's name stays its own.
        assert_eq!(
            late_vm_name(&known, "web", 301, alive),
            Some("web-pid301".into())
        );
        // A VM whose process ended gives its name to the new process.
        assert_eq!(late_vm_name(&known, "db", 302, alive), Some("db".into()));
    }
}
