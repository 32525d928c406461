//! Frames measured on this host: a live profiling session (host rings at a
//! low rate, active VMs' agents) for the functions, and the accountant for
//! each domain's CPU, vCPU states and I/O. The functions come from a
//! rolling window of the last few intervals; an active VM's guest rows are
//! scaled to the guest time the host measured in that window, as a
//! recording's merged view does.

use crate::{DomainView, Frame, FrameSource, FunctionView, TopError};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmscope_engine::live::{LiveEvent, LiveOptions, LiveSession};
use vmscope_engine::plan::{plan_session, PlanRequest};
use vmscope_linux::{Recorder, RingOptions, Target};
use vmscope_model::{Context, EventSpec, FastMap, Profile, Role};
use vmscope_stat::account::{AccountInterval, AccountOptions, Accountant};

/// How `top` measures.
pub struct LiveTopOptions {
    pub interval: Duration,
    /// Host and guest sampling rate, Hz.
    pub frequency: u64,
    /// How many intervals the functions cover.
    pub window: usize,
    /// Functions kept per domain.
    pub functions: usize,
    /// Roles asked for by name (`--vm NAME=ROLE`).
    pub roles: Vec<(String, Role)>,
}

/// One interval's profile deltas.
struct Slice {
    host: Profile,
    agent: Profile,
    /// (VM, event 0) → host-measured guest period in the interval.
    host_guest: HashMap<Arc<str>, u64>,
    /// VM → agent busy period in the interval.
    agent_busy: HashMap<Arc<str>, u64>,
}

/// Frames from this host.
pub struct LiveTop {
    session: LiveSession,
    acc: Accountant,
    opts: LiveTopOptions,
    window: VecDeque<Slice>,
    hostname: String,
    /// Why each VM is not active, when it is not.
    reasons: HashMap<String, String>,
    roles: HashMap<String, Role>,
    prev_host_guest: HashMap<Arc<str>, u64>,
    prev_agent_busy: HashMap<Arc<str>, u64>,
    prev_lost: u64,
    prev_agent_lost: HashMap<Arc<str>, u64>,
    notes: Vec<String>,
    start: Instant,
}

fn err(e: impl std::fmt::Display) -> TopError {
    TopError::Source(e.to_string())
}

impl LiveTop {
    /// Plan the VMs, open the rings, arm the agents and take the
    /// accountant's first sample.
    pub fn start(opts: LiveTopOptions) -> Result<LiveTop, TopError> {
        let plan = plan_session(PlanRequest {
            roles: opts.roles.clone(),
            hello_timeout: Duration::from_secs(3),
            ..PlanRequest::default()
        })
        .map_err(err)?;
        let mut reasons: HashMap<String, String> = plan
            .vms
            .iter()
            .filter(|v| v.role != Role::Active)
            .map(|v| (v.name.clone(), v.describe()))
            .collect();
        let mut roles: HashMap<String, Role> =
            plan.vms.iter().map(|v| (v.name.clone(), v.role)).collect();
        let events = vec![EventSpec::parse("cpu-clock", opts.frequency).map_err(err)?];
        let rec = Recorder::open(&RingOptions {
            events: events.clone(),
            target: Target::AllCpus,
            callchain: false,
            ring_pages: 0,
        })
        .map_err(err)?;
        let mut session = LiveSession::start(
            rec,
            &Target::AllCpus,
            LiveOptions {
                events,
                callchain: false,
                symbolizer: Default::default(),
                plan,
                barrier_timeout: Duration::from_secs(10),
                poll_every: opts.interval.min(Duration::from_millis(500)),
                overhead_budget: None,
            },
        )
        .map_err(err)?;
        for ev in session.take_events() {
            if let LiveEvent::Armed { domain, plan, .. } = ev {
                note_armed(&mut roles, &mut reasons, &domain, plan.as_ref());
            }
        }
        let mut acc = Accountant::new(AccountOptions::default());
        acc.sample().map_err(err)?;
        Ok(LiveTop {
            session,
            acc,
            opts,
            window: VecDeque::new(),
            hostname: vmscope_linux::ProcRoot::system()
                .sysctl("kernel.hostname")
                .unwrap_or_default(),
            reasons,
            roles,
            prev_host_guest: HashMap::new(),
            prev_agent_busy: HashMap::new(),
            prev_lost: 0,
            prev_agent_lost: HashMap::new(),
            notes: Vec::new(),
            start: Instant::now(),
        })
    }

    /// The interval's slice of the profile.
    fn slice(&mut self) -> Slice {
        let host = self.session.take_host_delta();
        let agent = self.session.take_agent_delta();
        let diff = |now: HashMap<Arc<str>, u64>, prev: &mut HashMap<Arc<str>, u64>| {
            let d = now
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(prev.get(k).copied().unwrap_or(0)),
                    )
                })
                .collect();
            *prev = now;
            d
        };
        let host_now: HashMap<Arc<str>, u64> = self
            .session
            .stats()
            .guest_period
            .iter()
            .filter(|((_, e), _)| *e == 0)
            .map(|((d, _), v)| (d.clone(), *v))
            .collect();
        let agent_now: HashMap<Arc<str>, u64> = self
            .session
            .agent_totals()
            .busy
            .iter()
            .filter(|((_, e), _)| *e == 0)
            .map(|((d, _), v)| (d.clone(), v.0))
            .collect();
        Slice {
            host,
            agent,
            host_guest: diff(host_now, &mut self.prev_host_guest),
            agent_busy: diff(agent_now, &mut self.prev_agent_busy),
        }
    }

    /// Top functions of every domain over the window.
    fn functions(&self) -> HashMap<String, Vec<FunctionView>> {
        let slices: Vec<SliceRef<'_>> = self
            .window
            .iter()
            .map(|s| SliceRef {
                host: &s.host,
                agent: &s.agent,
                host_guest: &s.host_guest,
                agent_busy: &s.agent_busy,
            })
            .collect();
        top_functions(&slices, &self.roles, self.opts.functions)
    }
}

impl FrameSource for LiveTop {
    fn next_frame(&mut self) -> Result<Frame, TopError> {
        // Frames end on whole multiples of the interval on the wall clock
        // (as `serve --history` records them), so a replay of a moment
        // covers the seconds the live frame did.
        let due = Instant::now() + vmscope_history::time::until_next_tick(self.opts.interval);
        loop {
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.session
                .step(left.min(Duration::from_millis(100)))
                .map_err(err)?;
        }
        for ev in self.session.take_events() {
            match ev {
                LiveEvent::AgentLost {
                    domain, at, why, ..
                } => {
                    self.roles.insert(domain.name.clone(), Role::Passive);
                    self.reasons.insert(
                        domain.name.clone(),
                        format!("passive: its agent was lost at {at:.1} s ({why})"),
                    );
                }
                LiveEvent::VmEnded { domain, .. } => {
                    self.notes.push(format!("VM {} exited", domain.name));
                }
                // A VM started since: passive, and why.
                LiveEvent::Armed { domain, plan, .. } => {
                    note_armed(&mut self.roles, &mut self.reasons, &domain, plan.as_ref());
                    self.notes.push(format!("VM {} started", domain.name));
                }
            }
        }
        let slice = self.slice();
        self.window.push_back(slice);
        while self.window.len() > self.opts.window.max(1) {
            self.window.pop_front();
        }
        let (iv, changes) = self.acc.sample().map_err(err)?;
        let mut notes: Vec<String> = std::mem::take(&mut self.notes);
        notes.extend(changes.iter().map(ToString::to_string));
        let Some(iv) = iv else {
            return Err(TopError::Source(
                "the accountant has no interval yet".into(),
            ));
        };
        let functions = self.functions();
        let lost = self.session.stats().lost;
        let host_lost = lost.saturating_sub(self.prev_lost);
        self.prev_lost = lost;
        let agent_lost = self.session.agent_totals().lost.clone();
        let mut vm_lost = HashMap::new();
        for v in &iv.vms {
            let lost_now = agent_lost.get(v.name.as_str()).copied().unwrap_or(0);
            let lost_prev = self
                .prev_agent_lost
                .insert(Arc::from(v.name.as_str()), lost_now)
                .unwrap_or(0);
            vm_lost.insert(v.name.clone(), lost_now.saturating_sub(lost_prev));
        }
        let mut frame = frame_of(
            &iv,
            FrameParts {
                functions,
                roles: &self.roles,
                reasons: &self.reasons,
                host_lost,
                vm_lost: &vm_lost,
                hostname: &self.hostname,
                notes,
            },
        );
        frame.time_s = self.start.elapsed().as_secs_f64();
        frame.at = Some(vmscope_history::time::rfc3339(
            vmscope_history::time::now(),
            false,
        ));
        Ok(frame)
    }
}

/// One interval's profile, borrowed: what [`top_functions`] reads.
pub struct SliceRef<'a> {
    pub host: &'a Profile,
    pub agent: &'a Profile,
    /// VM → host-measured guest period (event 0) in the slice.
    pub host_guest: &'a HashMap<Arc<str>, u64>,
    /// VM → agent busy period (event 0) in the slice.
    pub agent_busy: &'a HashMap<Arc<str>, u64>,
}

/// A function of a domain: (context, process, symbol).
type FunctionKey = (Context, Arc<str>, Arc<str>);

/// Per function: host samples, host period, agent samples, agent period.
type SliceTotals = FastMap<FunctionKey, [u64; 4]>;

/// One slice's rows summed by domain and function (event 0), what
/// [`top_functions_of`] adds up: built once when a slice arrives, so that
/// a window of several slices is not walked row by row (stacks and all)
/// at every interval again. Keyed by the rows' own names (a reference
/// count each, not a copy).
#[derive(Debug, Clone, Default)]
pub struct SliceFunctions {
    by_domain: FastMap<Arc<str>, SliceTotals>,
    /// VM → host-measured guest period (event 0) in the slice.
    pub host_guest: HashMap<Arc<str>, u64>,
    /// VM → agent busy period (event 0) in the slice.
    pub agent_busy: HashMap<Arc<str>, u64>,
}

impl SliceFunctions {
    pub fn of(s: &SliceRef<'_>) -> SliceFunctions {
        let mut by_domain: FastMap<Arc<str>, SliceTotals> = FastMap::default();
        for (k, c) in &s.host.rows {
            if k.event != 0 {
                continue;
            }
            let e = by_domain
                .entry(k.domain.clone())
                .or_default()
                .entry((k.context, k.process.clone(), k.symbol.clone()))
                .or_default();
            e[0] += c.samples;
            e[1] += c.period;
        }
        for (k, c) in &s.agent.rows {
            if k.event != 0 || &*k.process == "swapper" {
                continue;
            }
            let e = by_domain
                .entry(k.domain.clone())
                .or_default()
                .entry((k.context, k.process.clone(), k.symbol.clone()))
                .or_default();
            e[2] += c.samples;
            e[3] += c.period;
        }
        SliceFunctions {
            by_domain,
            host_guest: s.host_guest.clone(),
            agent_busy: s.agent_busy.clone(),
        }
    }
}

/// Top `n` functions of every domain over `slices` (event 0): the host's
/// rows, and each active VM's guest rows from its agent scaled to the
/// guest time the host measured, as a recording's merged view does.
pub fn top_functions(
    slices: &[SliceRef<'_>],
    roles: &HashMap<String, Role>,
    n: usize,
) -> HashMap<String, Vec<FunctionView>> {
    let pre: Vec<SliceFunctions> = slices.iter().map(SliceFunctions::of).collect();
    top_functions_of(&pre.iter().collect::<Vec<_>>(), roles, n)
}

/// [`top_functions`] of slices summed already.
pub fn top_functions_of(
    slices: &[&SliceFunctions],
    roles: &HashMap<String, Role>,
    n: usize,
) -> HashMap<String, Vec<FunctionView>> {
    let mut host_guest: HashMap<&Arc<str>, u64> = HashMap::new();
    let mut agent_busy: HashMap<&Arc<str>, u64> = HashMap::new();
    for s in slices {
        for (k, v) in &s.host_guest {
            *host_guest.entry(k).or_default() += v;
        }
        for (k, v) in &s.agent_busy {
            *agent_busy.entry(k).or_default() += v;
        }
    }
    let active = |d: &str| roles.get(d) == Some(&Role::Active);
    // (domain) → (context, process, symbol) → (samples, period)
    let mut per: FastMap<&Arc<str>, FastMap<&FunctionKey, (u64, f64)>> = FastMap::default();
    for s in slices {
        for (d, m) in &s.by_domain {
            let busy = agent_busy.get(d).copied().unwrap_or(0);
            let factor = if busy > 0 {
                host_guest.get(d).copied().unwrap_or(0) as f64 / busy as f64
            } else {
                0.0
            };
            let is_active = active(d);
            let out = per.entry(d).or_default();
            for (k, c) in m {
                // An active VM's guest time comes from its agent.
                let host = !(is_active
                    && matches!(
                        k.0,
                        Context::GuestTranslated | Context::GuestUser | Context::GuestKernel
                    ));
                let (mut samples, mut period) = (c[2], c[3] as f64 * factor);
                if host {
                    samples += c[0];
                    period += c[1] as f64;
                }
                if samples == 0 && period == 0.0 {
                    continue;
                }
                let e = out.entry(k).or_default();
                e.0 += samples;
                e.1 += period;
            }
        }
    }
    per.into_iter()
        .map(|(d, m)| {
            let total: f64 = m.values().map(|v| v.1).sum();
            let mut v: Vec<(&FunctionKey, (u64, f64))> =
                m.into_iter().filter(|(_, (_, p))| *p > 0.0).collect();
            v.sort_by(|a, b| {
                b.1 .1
                    .partial_cmp(&a.1 .1)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then_with(|| a.0 .2.cmp(&b.0 .2))
            });
            v.truncate(n);
            let v = v
                .into_iter()
                .map(|((ctx, process, symbol), (samples, p))| FunctionView {
                    context: ctx.as_str().to_string(),
                    process: process.to_string(),
                    symbol: symbol.to_string(),
                    samples,
                    pct: if total > 0.0 { 100.0 * p / total } else { 0.0 },
                })
                .collect();
            (d.to_string(), v)
        })
        .collect()
}

/// What a frame holds beside the accountant's interval.
pub struct FrameParts<'a> {
    /// Top functions per domain ([`top_functions`]).
    pub functions: HashMap<String, Vec<FunctionView>>,
    pub roles: &'a HashMap<String, Role>,
    /// Why each VM is not active, when it is not.
    pub reasons: &'a HashMap<String, String>,
    /// Samples the host lost in the interval.
    pub host_lost: u64,
    /// Samples each VM's agent lost in the interval.
    pub vm_lost: &'a HashMap<String, u64>,
    pub hostname: &'a str,
    pub notes: Vec<String>,
}

/// The frame of one accountant interval: the host (what no VM is charged
/// for) and each VM's CPU, vCPU states and I/O, with their functions.
/// `time_s` and `at` are the caller's.
pub fn frame_of(iv: &AccountInterval, mut p: FrameParts<'_>) -> Frame {
    let dt = iv.interval_s.max(1e-9);
    let mut domains = vec![DomainView {
        name: "host".into(),
        role: "host".into(),
        // What the host's CPUs did that no VM is charged for (from the
        // idle side, so short-lived tasks count too).
        cpu_pct: 100.0
            * (iv.measured_host_s - iv.vms.iter().map(|v| v.total_s).sum::<f64>()).max(0.0)
            / dt,
        vcpus: 0,
        run_pct: 0.0,
        steal_pct: 0.0,
        halted_pct: 0.0,
        io_cpu_pct: 0.0,
        io_ops_per_s: 0.0,
        lost: p.host_lost,
        reason: None,
        waited_behind: Vec::new(),
        functions: p.functions.remove("host").unwrap_or_default(),
    }];
    for v in &iv.vms {
        let n = v.vcpus.len().max(1) as f64;
        domains.push(DomainView {
            name: v.name.clone(),
            role: p
                .roles
                .get(&v.name)
                .map_or("passive", |r| r.as_str())
                .to_string(),
            cpu_pct: 100.0 * v.total_s / dt,
            vcpus: v.vcpus.len() as u32,
            run_pct: 100.0 * v.vcpu_run_s / dt / n,
            steal_pct: 100.0 * v.vcpu_runnable_s / dt / n,
            halted_pct: 100.0 * v.vcpu_blocked_s / dt / n,
            io_cpu_pct: 100.0 * (v.direct_io_s + v.shared_io_s) / dt,
            io_ops_per_s: v.io_ops as f64 / dt,
            lost: p.vm_lost.get(&v.name).copied().unwrap_or(0),
            reason: p.reasons.get(&v.name).cloned(),
            waited_behind: v
                .waited_behind
                .iter()
                .map(|w| crate::WaitView {
                    culprit: w.label(),
                    steal_pct: 100.0 * w.seconds / dt / n,
                })
                .collect(),
            functions: p.functions.remove(&v.name).unwrap_or_default(),
        });
    }
    Frame {
        time_s: 0.0,
        at: None,
        interval_s: iv.interval_s,
        hostname: p.hostname.to_string(),
        cpus: iv.cpu_busy_s.len() as u32,
        host_busy_pct: if iv.capacity_s > 0.0 {
            100.0 * iv.measured_host_s / iv.capacity_s
        } else {
            0.0
        },
        domains,
        notes: p.notes,
    }
}

/// A VM's role after an `Armed` event (at the start, or a VM found later)
/// and, when it is not active, why.
fn note_armed(
    roles: &mut HashMap<String, Role>,
    reasons: &mut HashMap<String, String>,
    domain: &vmscope_model::Domain,
    plan: Option<&vmscope_engine::plan::VmPlan>,
) {
    roles.insert(domain.name.clone(), domain.role);
    if let Some(p) = plan {
        reasons.insert(domain.name.clone(), p.describe());
    }
}
