//! `serve --profile`: a rolling recording of the host and its active VMs,
//! answered as pprof at `GET /debug/pprof/profile?seconds=N` (the Go
//! convention that `go tool pprof http://HOST:PORT/debug/pprof/profile` and
//! Parca's scraper read).
//!
//! One thread owns an `engine::live::LiveSession` (host rings, active VMs'
//! agents; VMs started later are taken in within `live::VM_SCAN`, passive)
//! and cuts what it yields into slices of half a second, kept for
//! the window (`--profile-window`). A request waits its N seconds, then
//! takes the slices that cover them: requests only read the window, so any
//! number of them run at once, and `/metrics` never waits for one.
//!
//! The answer is built exactly as `vmscope report --format pprof` builds
//! one: the slices go into a session file in a temporary directory (host
//! rows, agent rows, each active VM's scale for those seconds: host guest
//! time ÷ agent busy time) and `vmscope_report::pprof` reads it back in the
//! merged view, so the labels (`vm`, `context`, `process`, `vcpu`, `cpu`),
//! joined stacks and guest image names are the report's.
//!
//! What the recording costs is measured all the time (the host recorder's
//! own CPU and sampling interrupts, each agent's in its guest) and kept
//! within `--overhead-budget` (1 % by default) by lowering or raising the
//! rates; each profile carries the rates and costs of its seconds (the
//! `profiler` rows and `profiler_<domain>` lines of a session), and
//! [`Rolling::costs`] gives the totals since the start for `/metrics`.

use crate::ServeError;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vmscope_engine::cost::{ProfilerCost, ProfilerStep};
use vmscope_engine::live::{LiveEvent, LiveOptions, LiveSession};
use vmscope_engine::plan::{plan_session, PlanRequest};
use vmscope_linux::{Recorder, RingOptions, Target};
use vmscope_model::{Domain, EventSpec, Profile, Role, SessionEvent};
use vmscope_store::{DomainRecord, ScaleRow, SessionWriter};

/// How the rolling recording samples.
#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// Sampling rate of the host and of each active VM's agent, Hz.
    pub frequency: u64,
    /// Record call stacks (`-g`).
    pub callchain: bool,
    /// Seconds kept; the longest `seconds=N` a request may ask for.
    pub window: u32,
    /// Roles asked for by name (`--vm NAME=ROLE`).
    pub roles: Vec<(String, Role)>,
    /// Keep each profiler within this fraction of the CPU it observes;
    /// `None`: the rate asked for, whatever it costs.
    pub overhead_budget: Option<f64>,
}

/// `--overhead-budget` of `serve --profile` when none is given: 1 % of the
/// CPU each profiler observes, what continuous profilers promise.
pub const DEFAULT_BUDGET: f64 = 0.01;

impl Default for ProfileOptions {
    fn default() -> ProfileOptions {
        ProfileOptions {
            frequency: 99,
            callchain: true,
            window: 60,
            roles: Vec::new(),
            overhead_budget: Some(DEFAULT_BUDGET),
        }
    }
}

/// How long a slice of the window is.
const SLICE: Duration = Duration::from_millis(500);
/// `seconds` when a request gives none (Go's default).
const DEFAULT_SECONDS: u32 = 30;

/// Half a second of the recording.
struct Slice {
    /// Counts slices from 1: what the exporters took last.
    seq: u64,
    start: Instant,
    end: Instant,
    host: Profile,
    agent: Profile,
    /// (VM, event) → guest period the host measured in the slice.
    host_guest: HashMap<(Arc<str>, u32), u64>,
    /// (VM, event) → (busy period, samples) the agent measured in the slice.
    agent_busy: HashMap<(Arc<str>, u32), (u64, u64)>,
    /// What profiling cost in the slice (times from the recording's start).
    cost_steps: Vec<ProfilerStep>,
}

/// What requests read.
struct Window {
    slices: VecDeque<Slice>,
    /// Every VM (role after the barrier) with its details.
    domains: Vec<(Domain, String)>,
    /// `agent_<vm>` reasons of VMs that are not active.
    meta: Vec<(String, String)>,
    build_ids: Vec<(String, String)>,
    cpus: usize,
    /// Set when the recording failed: every later request gets it.
    failed: Option<String>,
    /// What each profiler cost since the start.
    costs: Vec<ProfilerCost>,
    /// Host kernel functions get names (`/proc/kallsyms` shows addresses).
    kernel_symbols: bool,
    /// The last slice's `seq`.
    last_seq: u64,
}

/// The rolling recording and its window.
pub struct Rolling {
    window: Mutex<Window>,
    /// Signalled after each slice.
    grew: Condvar,
    opts: ProfileOptions,
    events: Vec<EventSpec>,
    stop: AtomicBool,
    /// Slices are kept at least this many seconds (the export interval),
    /// even past the window.
    keep_at_least: AtomicU64,
    /// When the recording's second 0 was (its rows' `second` count from it).
    t0: Instant,
}

/// A copy of one slice, for the history ([`Rolling::slices_after`]).
pub struct SliceCopy {
    pub seq: u64,
    /// Start and end, seconds since the recording's second 0.
    pub start_s: f64,
    pub end_s: f64,
    pub host: Profile,
    pub agent: Profile,
    /// (VM, event) → guest period the host measured in the slice.
    pub host_guest: HashMap<(Arc<str>, u32), u64>,
    /// (VM, event) → (busy period, samples) the agent measured.
    pub agent_busy: HashMap<(Arc<str>, u32), (u64, u64)>,
}

/// The `agent_<vm>` reason of each VM an `Armed` event says is not active
/// (at the start, or found later), replacing any earlier one.
fn note_armed(meta: &mut Vec<(String, String)>, events: Vec<LiveEvent>) {
    for ev in events {
        if let LiveEvent::Armed {
            domain,
            plan: Some(p),
            ..
        } = ev
        {
            let key = format!("agent_{}", domain.name);
            meta.retain(|(k, _)| k != &key);
            meta.push((key, p.describe()));
        }
    }
}

fn err(e: impl std::fmt::Display) -> ServeError {
    ServeError::Profile(e.to_string())
}

impl Rolling {
    /// Plan the VMs, open the rings, arm the agents and start the thread
    /// that keeps the window.
    pub fn start(opts: ProfileOptions) -> Result<Arc<Rolling>, ServeError> {
        let plan = plan_session(PlanRequest {
            roles: opts.roles.clone(),
            hello_timeout: Duration::from_secs(3),
            ..PlanRequest::default()
        })
        .map_err(err)?;
        let mut meta: Vec<(String, String)> = plan
            .vms
            .iter()
            .filter(|v| v.role != Role::Active)
            .map(|v| (format!("agent_{}", v.name), v.describe()))
            .collect();
        let events = vec![EventSpec::parse("cpu-clock", opts.frequency).map_err(err)?];
        let rec = Recorder::open(&RingOptions {
            events: events.clone(),
            target: Target::AllCpus,
            callchain: opts.callchain,
            ring_pages: 0,
        })
        .map_err(err)?;
        let mut session = LiveSession::start(
            rec,
            &Target::AllCpus,
            LiveOptions {
                events: events.clone(),
                callchain: opts.callchain,
                symbolizer: Default::default(),
                plan,
                barrier_timeout: Duration::from_secs(10),
                poll_every: SLICE,
                overhead_budget: opts.overhead_budget,
            },
        )
        .map_err(err)?;
        note_armed(&mut meta, session.take_events());
        let t0 = Instant::now()
            .checked_sub(session.elapsed())
            .unwrap_or_else(Instant::now);
        // What would otherwise go unsaid: kernel addresses hidden from this
        // process (a service without CAP_SYSLOG), VMs only the host samples
        // (a broker that cannot be started under a read-only /run).
        let kernel_symbols = !session
            .warnings()
            .iter()
            .any(|w| w.contains("kallsyms") && w.contains("all addresses are zero"));
        let rolling = Arc::new(Rolling {
            window: Mutex::new(Window {
                slices: VecDeque::new(),
                domains: session.domains(),
                meta,
                build_ids: Vec::new(),
                cpus: session.cpus(),
                failed: None,
                costs: session.profiler_costs(),
                kernel_symbols,
                last_seq: 0,
            }),
            grew: Condvar::new(),
            opts,
            events,
            stop: AtomicBool::new(false),
            keep_at_least: AtomicU64::new(0),
            t0,
        });
        let r = Arc::clone(&rolling);
        std::thread::Builder::new()
            .name("serve-profile".into())
            .spawn(move || r.keep(session))
            .map_err(err)?;
        Ok(rolling)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The recording thread: a slice every [`SLICE`], the window trimmed.
    fn keep(&self, mut session: LiveSession) {
        let mut prev_host: HashMap<(Arc<str>, u32), u64> = HashMap::new();
        let mut prev_agent: HashMap<(Arc<str>, u32), (u64, u64)> = HashMap::new();
        let mut start = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let keep_for = Duration::from_secs(
                u64::from(self.opts.window).max(self.keep_at_least.load(Ordering::Relaxed)),
            ) + 2 * SLICE;
            // Sleep on the rings until the slice ends (a half-full ring
            // wakes it sooner): each wake-up takes a CPU from the VMs.
            let wait = SLICE.saturating_sub(start.elapsed());
            if let Err(e) = session.step(wait.max(Duration::from_millis(1))) {
                self.lock().failed = Some(format!("the rolling recording stopped: {e}"));
                self.grew.notify_all();
                return;
            }
            if start.elapsed() < SLICE {
                continue;
            }
            let end = Instant::now();
            let host_now = session.stats().guest_period.clone();
            let agent_now = session.agent_totals().busy.clone();
            let host_guest = host_now
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(prev_host.get(k).copied().unwrap_or(0)),
                    )
                })
                .collect();
            let agent_busy = agent_now
                .iter()
                .map(|(k, (p, n))| {
                    let (pp, pn) = prev_agent.get(k).copied().unwrap_or((0, 0));
                    (k.clone(), (p.saturating_sub(pp), n.saturating_sub(pn)))
                })
                .collect();
            let slice = Slice {
                seq: 0,
                start,
                end,
                host: session.take_host_delta(),
                agent: session.take_agent_delta(),
                host_guest,
                agent_busy,
                cost_steps: session.take_profiler_steps(),
            };
            prev_host = host_now;
            prev_agent = agent_now;
            start = end;
            let build_ids = session.build_ids();
            let domains = session.domains();
            let costs = session.profiler_costs();
            // VMs started since: passive, and why.
            let events = session.take_events();
            {
                let mut w = self.lock();
                note_armed(&mut w.meta, events);
                w.last_seq += 1;
                let mut slice = slice;
                slice.seq = w.last_seq;
                w.slices.push_back(slice);
                while w
                    .slices
                    .front()
                    .is_some_and(|s| end.duration_since(s.end) > keep_for)
                {
                    w.slices.pop_front();
                }
                w.build_ids = build_ids;
                w.domains = domains;
                w.costs = costs;
            }
            self.grew.notify_all();
        }
        let _ = session.stop();
    }

    /// What each profiler (the host recorder, each active VM's agent) cost
    /// since the recording started, with the rates it used.
    pub fn costs(&self) -> Vec<ProfilerCost> {
        self.lock().costs.clone()
    }

    /// What the recording can see: whether host kernel functions get names,
    /// and each VM with whether its agent profiles it.
    pub fn state(&self) -> vmscope_stat::metrics::ProfileState {
        let w = self.lock();
        vmscope_stat::metrics::ProfileState {
            kernel_symbols: w.kernel_symbols,
            vms_active: w
                .domains
                .iter()
                .map(|(d, _)| (d.name.clone(), d.role == Role::Active))
                .collect(),
        }
    }

    /// Lines for the operator about what the recording cannot see, and
    /// why: hidden kernel addresses, and each VM that is not active with
    /// its reason and fix.
    pub fn warnings(&self) -> Vec<String> {
        let w = self.lock();
        let mut out = Vec::new();
        if !w.kernel_symbols {
            out.push(
                "/proc/kallsyms shows this process no addresses (kernel.kptr_restrict without \
                 CAP_SYSLOG): host kernel functions will be raw addresses in profiles"
                    .to_string(),
            );
        }
        for (k, why) in &w.meta {
            if let Some(vm) = k.strip_prefix("agent_") {
                out.push(format!("VM {vm}: profiled as {why}"));
            }
        }
        out
    }

    /// The overhead budget the recording keeps, as a fraction.
    pub fn budget(&self) -> Option<f64> {
        self.opts.overhead_budget
    }

    /// Stop the recording thread (after its current step).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Parse the `seconds` of a query string: a whole number from 1 to the
    /// window, [`DEFAULT_SECONDS`] (or the window, if shorter) when absent.
    pub fn seconds(&self, query: &str) -> Result<u32, String> {
        let mut got = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if k == "seconds" {
                got = Some(v);
            }
        }
        let max = self.opts.window;
        match got {
            None => Ok(DEFAULT_SECONDS.min(max)),
            Some(v) => match v.parse::<u32>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(format!(
                    "seconds={v}: give a whole number of seconds from 1 to {max} (the rolling window, --profile-window)"
                )),
            },
        }
    }

    /// Wait `seconds`, then the gzipped pprof of those seconds.
    pub fn profile(&self, seconds: u32) -> Result<Vec<u8>, String> {
        let from = Instant::now();
        let until = from + Duration::from_secs(u64::from(seconds));
        std::thread::sleep(Duration::from_secs(u64::from(seconds)));
        // Until a slice ends at or after `until` (at most one more slice).
        let mut w = self.lock();
        let give_up = Instant::now() + 4 * SLICE + Duration::from_secs(2);
        loop {
            if let Some(f) = &w.failed {
                return Err(f.clone());
            }
            if w.slices.back().is_some_and(|s| s.end >= until) {
                break;
            }
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            w = self
                .grew
                .wait_timeout(w, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        // The slices that cover the request's seconds, the last one that
        // began before the request included.
        let chosen: Vec<&Slice> = w
            .slices
            .iter()
            .filter(|s| s.end > from && s.start < until)
            .collect();
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let path = dir.path().join("window.db");
        self.write_session(&path, &w, &chosen)
            .map_err(|e| format!("storing the window: {e}"))?;
        drop(w);
        let session =
            vmscope_store::Session::open(&path).map_err(|e| format!("reading the window: {e}"))?;
        let p = vmscope_report::pprof::build(&session, &vmscope_report::ReportOptions::default())
            .map_err(|e| format!("building the profile: {e}"))?;
        let mut out = Vec::new();
        vmscope_report::pprof::write(&p, &mut out)
            .map_err(|e| format!("writing the profile: {e}"))?;
        Ok(out)
    }

    /// Wall-clock time of the recording's second 0, seconds since the epoch.
    pub fn origin(&self) -> f64 {
        unix_time_of(self.t0)
    }

    /// The recording's events (indexes of its rows' `event`).
    pub fn events(&self) -> Vec<SessionEvent> {
        self.events.iter().map(SessionEvent::from).collect()
    }

    /// Whether the rows carry call stacks.
    pub fn callchain(&self) -> bool {
        self.opts.callchain
    }

    /// Copies of the slices after `after` (by `seq`), oldest first.
    pub fn slices_after(&self, after: u64) -> Vec<SliceCopy> {
        let w = self.lock();
        w.slices
            .iter()
            .filter(|s| s.seq > after)
            .map(|s| SliceCopy {
                seq: s.seq,
                start_s: s.start.saturating_duration_since(self.t0).as_secs_f64(),
                end_s: s.end.saturating_duration_since(self.t0).as_secs_f64(),
                host: s.host.clone(),
                agent: s.agent.clone(),
                host_guest: s.host_guest.clone(),
                agent_busy: s.agent_busy.clone(),
            })
            .collect()
    }

    /// Every VM with its role and details, the `agent_<vm>` reasons of
    /// those not active, and the build-ids so far.
    #[allow(clippy::type_complexity)]
    pub fn domains(
        &self,
    ) -> (
        Vec<(Domain, String)>,
        Vec<(String, String)>,
        Vec<(String, String)>,
    ) {
        let w = self.lock();
        (w.domains.clone(), w.meta.clone(), w.build_ids.clone())
    }

    /// Keep slices at least `d` (the export interval), even past the
    /// window, so that no slice goes before it is exported.
    pub fn keep_at_least(&self, d: Duration) {
        self.keep_at_least.store(d.as_secs() + 1, Ordering::Relaxed);
    }

    /// The slices after `after` (by their `seq`) as one export window:
    /// written as a session at `path` (what `vmscope report` reads) and
    /// built into the pprof `report --format pprof` would give. `None`
    /// when no slice ended since.
    pub fn export_window(
        &self,
        after: u64,
        path: &std::path::Path,
    ) -> Result<Option<ExportedSlices>, String> {
        let w = self.lock();
        if let Some(f) = &w.failed {
            return Err(f.clone());
        }
        let chosen: Vec<&Slice> = w.slices.iter().filter(|s| s.seq > after).collect();
        let (Some(first), Some(last)) = (chosen.first(), chosen.last()) else {
            return Ok(None);
        };
        let missed = first.seq.saturating_sub(after + 1);
        let start_unix = unix_time_of(first.start);
        let duration = last.end.duration_since(first.start);
        let last_seq = last.seq;
        let costs = chosen_costs(&chosen, &w.costs);
        let vms = w
            .domains
            .iter()
            .map(|(d, _)| (d.name.clone(), d.pid))
            .collect();
        self.write_session(path, &w, &chosen)
            .map_err(|e| format!("storing the window: {e}"))?;
        drop(w);
        let session =
            vmscope_store::Session::open(path).map_err(|e| format!("reading the window: {e}"))?;
        let profile =
            vmscope_report::pprof::build(&session, &vmscope_report::ReportOptions::default())
                .map_err(|e| format!("building the profile: {e}"))?;
        Ok(Some(ExportedSlices {
            last_seq,
            missed,
            start_unix_nanos: (start_unix * 1e9) as u64,
            duration_nanos: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
            profile,
            costs,
            vms,
        }))
    }

    /// The chosen slices as a session: what `record` would have stored.
    fn write_session(
        &self,
        path: &std::path::Path,
        w: &Window,
        chosen: &[&Slice],
    ) -> Result<(), vmscope_store::StoreError> {
        let mut writer = SessionWriter::create(path)?;
        let events: Vec<SessionEvent> = self.events.iter().map(SessionEvent::from).collect();
        writer.set_events(&events)?;
        let started = chosen.first().map_or(0.0, |s| unix_time_of(s.start));
        let seconds: f64 = chosen
            .iter()
            .map(|s| s.end.duration_since(s.start).as_secs_f64())
            .sum();
        for (k, v) in [
            ("source", "serve --profile".to_string()),
            ("cpus", w.cpus.to_string()),
            ("started_at", format!("{started:.3}")),
            ("duration_s", format!("{seconds:.3}")),
            ("callchain", u8::from(self.opts.callchain).to_string()),
        ] {
            writer.set_meta(k, &v)?;
        }
        for (k, v) in &w.meta {
            writer.set_meta(k, v)?;
        }
        writer.upsert_domain(&DomainRecord {
            domain: Domain::host(),
            status: "running".into(),
            ended_at: None,
            detail: String::new(),
        })?;
        for (d, detail) in &w.domains {
            writer.upsert_domain(&DomainRecord {
                domain: d.clone(),
                status: "running".into(),
                ended_at: None,
                detail: detail.clone(),
            })?;
        }
        let mut host_guest: HashMap<(Arc<str>, u32), u64> = HashMap::new();
        let mut agent_busy: HashMap<(Arc<str>, u32), (u64, u64)> = HashMap::new();
        for s in chosen {
            writer.flush(&s.host)?;
            writer.flush_agent(&s.agent)?;
            let rows: Vec<_> = s.cost_steps.iter().flat_map(ProfilerStep::rows).collect();
            writer.add_intervals(&rows)?;
            for (k, v) in &s.host_guest {
                *host_guest.entry(k.clone()).or_default() += v;
            }
            for (k, (p, n)) in &s.agent_busy {
                let e = agent_busy.entry(k.clone()).or_default();
                e.0 += p;
                e.1 += n;
            }
        }
        // Each active VM scaled to the guest time the host measured in
        // these seconds, as a recording's merged view does.
        for ((domain, event), (busy, samples)) in &agent_busy {
            let host = host_guest
                .get(&(domain.clone(), *event))
                .copied()
                .unwrap_or(0);
            writer.set_scale(&ScaleRow {
                domain: domain.to_string(),
                event: *event,
                host_period: host,
                agent_period: *busy,
                agent_samples: *samples,
                agent_lost: 0,
                factor: if *busy > 0 {
                    host as f64 / *busy as f64
                } else {
                    0.0
                },
            })?;
        }
        // What profiling cost in these seconds, per domain.
        for c in chosen_costs(chosen, &w.costs) {
            writer.set_meta(&c.meta_key(), &c.describe())?;
        }
        writer.set_build_ids(&w.build_ids)?;
        writer.finish(true)
    }
}

/// Slices taken for an export window ([`Rolling::export_window`]).
pub struct ExportedSlices {
    /// The last slice's `seq`: where the next window starts.
    pub last_seq: u64,
    /// Slices that had gone from the window before they were taken.
    pub missed: u64,
    pub start_unix_nanos: u64,
    pub duration_nanos: u64,
    /// The merged view, as `report --format pprof` builds it.
    pub profile: vmscope_report::pprof::Profile,
    /// What each profiler cost in these seconds.
    pub costs: Vec<ProfilerCost>,
    /// Every VM with its QEMU pid.
    pub vms: Vec<(String, Option<u32>)>,
}

/// Each profiler's cost over `chosen`, with the rate asked for and the
/// budget of the whole recording (`all`).
fn chosen_costs(chosen: &[&Slice], all: &[ProfilerCost]) -> Vec<ProfilerCost> {
    let mut out: Vec<ProfilerCost> = all
        .iter()
        .map(|c| ProfilerCost::new(&c.domain, c.summary.requested_hz, c.summary.budget, c.cpus))
        .collect();
    for step in chosen.iter().flat_map(|s| &s.cost_steps) {
        if let Some(c) = out.iter_mut().find(|c| c.domain == step.domain) {
            c.add_step(&step.step);
        }
    }
    out.retain(|c| c.summary.capacity_s > 0.0);
    out
}

/// Seconds since the epoch of an `Instant` in the past.
fn unix_time_of(t: Instant) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(t.elapsed()).as_secs_f64()
}
