//! `vmscope bench overhead`: what profiling costs (theurer2006 Fig 2). One
//! workload point (the `cpu` or `memwrite` engine of `bench scale`, on the
//! host or in a lab VM) runs with each profiler of
//! [`crate::profiler::Kind`]: none, `vmscope record -a` with every VM
//! passive (host side only), with every VM active (host plus the guests'
//! agents sampling inside), and `perf record -a` at the same frequency.
//! The loss of each is `1 - throughput / throughput without a profiler`,
//! with an interval from both points' intervals.
//!
//! In a VM the workload is started detached, waiting for a go file; the
//! profiler is started, and once it samples the go file is made (through
//! the VM's broker, which serves the recorder and this bench at once), so
//! the run starts as soon as it is profiled. Where the go file cannot be
//! made (an agent reached without a broker serves one client at a time)
//! the workload starts `--delay` seconds after it was launched, and a
//! profiler that took longer than that to start sampling flags the sample
//! (part of the run was not profiled). The workload's JSON line is read
//! from a guest file once the profiler is stopped. Under TCG the guest's
//! sampling interrupts are emulated in software: the report says so next
//! to the figure.

use crate::driver::{self, DriveOptions, Experiment, PointOutcome, Sink};
use crate::guest::{Guest, VmFailure, AGENT};
use crate::hygiene::{LoadMark, LoadProbe, LoadSample};
use crate::lab_session::LabSession;
use crate::manifest::Manifest;
use crate::options::{LabChoice, Output, Recording, Sampling};
use crate::output::table;
use crate::profiler::{self, Kind, Stopped};
use crate::row::{unit, Point, Row};
use crate::schedule::Step;
use crate::stats::Summary;
use crate::BenchError;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmscope_workload::scale::{ScaleRun, ScaleSpec, Workload};

/// Everything `bench overhead` is asked to do.
#[derive(Debug, Clone)]
pub struct OverheadOptions {
    pub workload: Workload,
    /// Run the workload in this lab VM (else on the host).
    pub vm: Option<String>,
    pub threads: usize,
    pub seconds: f64,
    /// VM: the longest wait between starting the workload and its first
    /// instruction (it begins once the profiler samples, when told so).
    pub delay: f64,
    pub buffer: u64,
    pub kinds: Vec<Kind>,
    /// Sampling frequency of every profiler, Hz.
    pub freq: u64,
    /// Sessions and perf.data files of the profiled runs go here (reused
    /// run after run).
    pub work_dir: PathBuf,
    pub sampling: Sampling,
    /// No charts: `output.charts` is not used.
    pub output: Output,
    /// Where labs live (for `vm`), the cancel flag.
    pub lab: LabChoice,
    /// `--record DIR`: every kept sample's profiled run stays in DIR as
    /// `overhead-PROFILER-N.db` (perf: `.data`), annotated with its point
    /// and named in the results; `record.vmscope` is the binary the
    /// profiled runs start, at `freq` (`record.freq` is not used).
    pub record: Recording,
}

/// `bench overhead`'s repeats when none are given (at least, at most).
pub const DEFAULT_REPEAT: (usize, usize) = (3, 10);

impl Default for OverheadOptions {
    fn default() -> Self {
        OverheadOptions {
            workload: Workload::Cpu,
            vm: None,
            threads: 1,
            seconds: 5.0,
            delay: 10.0,
            buffer: vmscope_workload::scale::DEFAULT_BUFFER,
            kinds: Kind::ALL.to_vec(),
            freq: 1000,
            work_dir: std::env::temp_dir().join("vmscope-bench-overhead"),
            sampling: Sampling::default(),
            output: Output::default(),
            lab: LabChoice::default(),
            record: Recording::default(),
        }
    }
}

/// One sample.
#[derive(Debug, Clone)]
pub struct OverheadSample {
    pub run: ScaleRun,
    pub profiler: Option<Stopped>,
    /// Seconds the profiler took to start sampling.
    pub ready_s: f64,
    pub load: LoadSample,
    /// Why the sample is suspect besides a busy host.
    pub note: Option<String>,
    /// `--record`: the profiled run's session (or perf.data), kept.
    pub recording: Option<PathBuf>,
}

struct OverheadExperiment {
    opts: OverheadOptions,
    points: Vec<(Kind, Point)>,
    guest: Option<Guest>,
    probe: LoadProbe,
    runs: usize,
    /// Workloads started in the guest (each writes its own result file).
    guest_runs: usize,
}

fn failed(e: impl std::fmt::Display) -> VmFailure {
    VmFailure::Failed(e.to_string())
}

impl OverheadExperiment {
    fn argv(&self) -> Vec<String> {
        vec![
            AGENT.to_string(),
            "scale".into(),
            self.opts.workload.name().into(),
            format!("threads={}", self.opts.threads),
            format!("seconds={}", self.opts.seconds),
            format!("size={}", self.opts.buffer),
        ]
    }

    /// Starts profiler `kind` (none: nothing); its output goes to the
    /// work directory, or to `--record`'s for a kept sample.
    fn start(&mut self, kind: Kind, step: Step) -> Result<Started, VmFailure> {
        if kind == Kind::None {
            return Ok((None, 0.0, None));
        }
        self.runs += 1;
        let ext = if kind == Kind::Perf { "data" } else { "db" };
        let kept = match (&self.opts.record.dir, step) {
            (Some(dir), Step::Sample) => {
                Some(dir.join(format!("overhead-{}-{}.{ext}", kind.name(), self.runs)))
            }
            _ => None,
        };
        let output = kept.clone().unwrap_or_else(|| {
            self.opts
                .work_dir
                .join(format!("{}-{}.{ext}", kind.name(), self.runs % 2))
        });
        let t0 = Instant::now();
        let r = profiler::start(&profiler::Spec {
            kind,
            freq: self.opts.freq,
            vms: Vec::new(),
            output,
            vmscope: self.opts.record.vmscope.clone(),
            ready_timeout: Duration::from_secs(120),
            strict: false,
            force: self.opts.output.force,
        })
        .map_err(|e| failed(format!("{kind}: {e}")))?;
        Ok((Some(r), t0.elapsed().as_secs_f64(), kept))
    }

    /// A kept session says which point and value it profiled (what
    /// `vmscope compare` shows beside it).
    fn annotate(&self, i: usize, path: &std::path::Path, value: f64) {
        if path.extension().is_some_and(|e| e == "db") {
            if let Ok(sess) = vmscope_store::Session::open(path) {
                let p = &self.points[i].1;
                let _ = sess.annotate("bench_experiment", "overhead");
                let _ = sess.annotate("bench_point", &p.name);
                let _ = sess.annotate("bench_config_hash", &p.config_hash);
                let _ = sess.annotate("bench_value", &value.to_string());
            }
        }
    }
}

/// A started profiler, the seconds it took to start sampling, and where
/// its output is kept (`--record`).
type Started = (Option<profiler::Running>, f64, Option<PathBuf>);

impl Experiment for OverheadExperiment {
    type Sample = OverheadSample;

    fn points(&self) -> usize {
        self.points.len()
    }

    fn name(&self, i: usize) -> String {
        self.points[i].1.name.clone()
    }

    fn hash(&self, i: usize) -> String {
        self.points[i].1.config_hash.clone()
    }

    fn vms(&self, _i: usize) -> Vec<String> {
        self.guest.iter().map(|g| g.name().to_string()).collect()
    }

    fn run(&mut self, i: usize, step: Step) -> Result<OverheadSample, VmFailure> {
        let kind = self.points[i].0;
        let own: Vec<u32> = self
            .guest
            .as_ref()
            .and_then(|g| g.vm().pid)
            .into_iter()
            .collect();
        let (run, prof, ready_s, mark, note, kept): (
            ScaleRun,
            _,
            f64,
            LoadMark,
            Option<String>,
            Option<PathBuf>,
        ) = if let Some(mut g) = self.guest.take() {
            let r = (|| {
                if let Some(d) = g.dead() {
                    return Err(VmFailure::Dead(d));
                }
                // Each sample's workload in a session of its own, its
                // group id in a file: a workload that an earlier, failed
                // sample left behind (still sleeping, or running) is killed
                // first, so it neither takes the guest's CPU from this one
                // nor writes into its result, which has a name of its own.
                self.guest_runs += 1;
                let out = format!("/tmp/vmscope-overhead-{}.json", self.guest_runs);
                let go = format!("/tmp/vmscope-overhead-{}.go", self.guest_runs);
                let pid = "/tmp/vmscope-overhead.pid";
                // Polled every 20 ms, for at most the delay.
                let polls = (self.opts.delay / 0.02).ceil() as u64;
                let script = format!(
                    "[ -s {pid} ] && kill -9 -- -$(cat {pid}) 2>/dev/null; \
                     rm -f {pid} /tmp/vmscope-overhead-*.json* /tmp/vmscope-overhead-*.go; \
                     setsid sh -c 'echo $$ > {pid}; i=0; \
                         while [ ! -e {go} ] && [ $i -lt {polls} ]; do usleep 20000; i=$((i+1)); done; \
                         {} > {out}.tmp 2> {out}.err; mv {out}.tmp {out}' \
                         </dev/null >/dev/null 2>&1 &",
                    self.argv().join(" ")
                );
                g.sh(&script, Duration::from_secs(60))?;
                let started = Instant::now();
                // A recorder reaching the agent without a broker needs the
                // channel to itself.
                g.disconnect();
                let mark = self.probe.mark(&own);
                let (p, ready, kept) = self.start(kind, step)?;
                // Sampling: the run may start.
                let go_at = match g.sh(&format!("touch {go}"), Duration::from_secs(10)) {
                    Ok(_) => Some(Instant::now()),
                    Err(VmFailure::Dead(d)) => return Err(VmFailure::Dead(d)),
                    Err(VmFailure::Failed(_)) => None,
                };
                let note = (go_at.is_none() && ready > self.opts.delay).then(|| {
                    format!(
                        "the profiler took {ready:.1} s to start, more than the {:.1} s delay",
                        self.opts.delay
                    )
                });
                let end = match go_at {
                    Some(t) => t + Duration::from_secs_f64(self.opts.seconds + 0.5),
                    None => {
                        started + Duration::from_secs_f64(self.opts.delay + self.opts.seconds + 0.5)
                    }
                };
                std::thread::sleep(end.saturating_duration_since(Instant::now()));
                let stopped = p
                    .map(profiler::Running::stop)
                    .transpose()
                    .map_err(|e| failed(format!("{kind}: {e}")))?;
                // The workload may lag under an emulated vCPU: poll.
                let deadline = Instant::now() + Duration::from_secs(120);
                let line = loop {
                    let o = g.sh(
                        &format!("cat {out} 2>/dev/null || true"),
                        Duration::from_secs(60),
                    )?;
                    if !o.stdout.trim().is_empty() {
                        break o.stdout;
                    }
                    if Instant::now() > deadline {
                        return Err(failed(format!(
                            "VM {}: the workload wrote no result in {out}",
                            g.name()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(300));
                };
                let run: ScaleRun = serde_json::from_str(line.trim()).map_err(|e| {
                    failed(format!(
                        "VM {}: the workload's line: {e}: {line:.200}",
                        g.name()
                    ))
                })?;
                Ok((run, stopped, ready, mark, note, kept))
            })();
            self.guest = Some(g);
            r?
        } else {
            let mark = self.probe.mark(&own);
            let (p, ready, kept) = self.start(kind, step)?;
            let run = vmscope_workload::scale::run(&ScaleSpec {
                workload: self.opts.workload,
                threads: self.opts.threads,
                duration: Duration::from_secs_f64(self.opts.seconds),
                buffer: self.opts.buffer,
            })
            .map_err(failed)?;
            let stopped = p
                .map(profiler::Running::stop)
                .transpose()
                .map_err(|e| failed(format!("{kind}: {e}")))?;
            (run, stopped, ready, mark, None, kept)
        };
        if let Some(path) = &kept {
            self.annotate(i, path, run.rate());
        }
        let mut load = self.probe.since(&mark);
        // The profiler is the experiment's own load, not other load.
        if let Some(p) = &prof {
            load.other_s = (load.other_s - p.cpu_s).max(0.0);
        }
        Ok(OverheadSample {
            run,
            profiler: prof,
            ready_s,
            load,
            note,
            recording: kept,
        })
    }

    fn value(&self, s: &OverheadSample) -> f64 {
        s.run.rate()
    }

    fn load(&self, s: &OverheadSample) -> LoadSample {
        s.load
    }

    fn rows(&self, i: usize, n: u32, s: &OverheadSample, flag: Option<String>) -> Vec<Row> {
        let p = &self.points[i].1;
        let u = format!("{}/s", self.opts.workload.work_unit());
        let flag = match (flag, &s.note) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or_else(|| b.clone()),
        };
        let mut rows = vec![
            p.row(n, "throughput", s.run.rate(), &u),
            p.row(n, "wall_time", s.run.wall_s, unit::SECONDS),
            p.row(n, "other_load", s.load.other_cpus(), unit::S_PER_S),
        ];
        if let Some(pr) = &s.profiler {
            rows.extend([
                p.row(n, "profiler_cpu", pr.cpu_s, unit::SECONDS),
                p.row(n, "profiler_samples", pr.samples as f64, unit::COUNT),
                p.row(n, "profiler_lost", pr.lost as f64, unit::COUNT),
                p.row(n, "guest_samples", pr.guest_samples as f64, unit::COUNT),
                p.row(n, "profiler_ready", s.ready_s, unit::SECONDS),
            ]);
            // What the profilers measured of themselves (vmscope only).
            if pr.host_observed_s > 0.0 {
                rows.push(p.row(n, "host_profiler_cost", pr.host_cost_s, unit::SECONDS));
                rows.push(p.row(
                    n,
                    "host_profiler_observed",
                    pr.host_observed_s,
                    unit::SECONDS,
                ));
            }
            if pr.guest_observed_s > 0.0 {
                rows.push(p.row(n, "guest_profiler_cost", pr.guest_cost_s, unit::SECONDS));
                rows.push(p.row(
                    n,
                    "guest_profiler_observed",
                    pr.guest_observed_s,
                    unit::SECONDS,
                ));
            }
        }
        rows.into_iter().map(|r| r.flagged(flag.clone())).collect()
    }
}

/// Mean of `f` over the samples of `r` whose profiler gave a value.
fn profiler_mean(
    r: &PointOutcome<OverheadSample>,
    f: impl Fn(&Stopped) -> Option<f64>,
) -> Option<f64> {
    let v: Vec<f64> = r
        .samples
        .iter()
        .filter_map(|x| x.profiler.as_ref().and_then(&f))
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// A profiler's throughput loss against no profiler.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Loss {
    /// `1 - mean / mean without a profiler`.
    pub loss: f64,
    /// Half-width of its 95 % interval (both intervals, relative, in
    /// quadrature).
    pub ci95: f64,
}

/// The loss of `s` against `none`.
pub fn loss(s: &Summary, none: &Summary) -> Option<Loss> {
    if none.mean <= 0.0 || s.mean <= 0.0 {
        return None;
    }
    let ratio = s.mean / none.mean;
    let rel = |x: &Summary| {
        if x.ci95.is_finite() {
            x.ci95 / x.mean
        } else {
            f64::INFINITY
        }
    };
    let r = (rel(s).powi(2) + rel(none).powi(2)).sqrt();
    Some(Loss {
        loss: 1.0 - ratio,
        ci95: ratio * r,
    })
}

/// What a run produced.
pub struct OverheadOutcome {
    pub accel: Option<String>,
    pub kinds: Vec<Kind>,
    pub results: Vec<PointOutcome<OverheadSample>>,
    pub notes: Vec<String>,
}

impl OverheadOutcome {
    pub fn failed_points(&self) -> usize {
        self.results.iter().filter(|r| r.failed.is_some()).count()
    }

    pub fn loss(&self, k: Kind) -> Option<Loss> {
        let idx = |k: Kind| self.kinds.iter().position(|x| *x == k);
        let none = self.results.get(idx(Kind::None)?)?.summary()?;
        let s = self.results.get(idx(k)?)?.summary()?;
        loss(&s, &none)
    }

    /// [`profiler_mean`] of profiler `k`'s point.
    fn mean_of(&self, k: Kind, f: impl Fn(&Stopped) -> Option<f64>) -> Option<f64> {
        let i = self.kinds.iter().position(|x| *x == k)?;
        profiler_mean(&self.results[i], f)
    }

    /// The active recorder's loss split into its host side (the loss with
    /// every VM passive: rings, attribution, store) and its guest side (the
    /// rest: the agents' CPU and the guests' sampling interrupts), beside
    /// what the profilers measured of themselves in the active runs.
    pub fn split(&self) -> Option<Split> {
        let active = self.loss(Kind::Active)?;
        let host = self.loss(Kind::HostOnly);
        Some(Split {
            active: active.loss,
            host_side: host.map(|h| h.loss),
            guest_side: host.map(|h| active.loss - h.loss),
            host_measured: self.mean_of(Kind::Active, Stopped::host_cost),
            guest_measured: self.mean_of(Kind::Active, Stopped::guest_cost),
        })
    }
}

/// Where the active recorder's cost goes (fractions).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Split {
    /// Throughput loss with every VM active.
    pub active: f64,
    /// Loss with every VM passive (`host-only`): the host side.
    pub host_side: Option<f64>,
    /// `active - host_side`: the guest side.
    pub guest_side: Option<f64>,
    /// The host recorder's own measurement of its cost (CPU and sampling
    /// interrupts over the host CPU it observed), active runs.
    pub host_measured: Option<f64>,
    /// The agents' own measurement (their CPU and the guests' sampling
    /// interrupts over their guests' CPU), active runs.
    pub guest_measured: Option<f64>,
}

impl Split {
    /// One line for the text report.
    pub fn describe(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1} %", v * 100.0));
        format!(
            "active loss {} = host side {} (the host-only loss: rings, attribution, store) + \
             guest side {} (the rest: agents and the guests' sampling interrupts); measured by \
             the profilers themselves in the active runs: host recorder {} of the host CPU it \
             observed, agents {} of their guests' CPU",
            pct(Some(self.active)),
            pct(self.host_side),
            pct(self.guest_side),
            pct(self.host_measured),
            pct(self.guest_measured),
        )
    }
}

/// Runs `bench overhead`; results go to `out` in `opts.output.format`.
pub fn run(opts: &OverheadOptions, out: &mut dyn Write) -> Result<OverheadOutcome, BenchError> {
    if !opts.kinds.contains(&Kind::None) {
        return Err(BenchError::bad(
            "--profilers must include none (the losses are against it)",
        ));
    }
    if opts.kinds.len() < 2 {
        return Err(BenchError::bad("--profilers needs a profiler besides none"));
    }
    if !(opts.seconds >= 0.1 && opts.seconds <= 3600.0) {
        return Err(BenchError::bad(format!(
            "--seconds {} must be 0.1 to 3600",
            opts.seconds
        )));
    }
    if opts.threads == 0 || opts.threads > vmscope_workload::scale::MAX_THREADS {
        return Err(BenchError::bad(format!(
            "--threads {} must be 1 to {}",
            opts.threads,
            vmscope_workload::scale::MAX_THREADS
        )));
    }
    opts.sampling.rule(DEFAULT_REPEAT.0, DEFAULT_REPEAT.1)?;
    let max_rate = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    if opts.freq == 0 || opts.freq > max_rate {
        return Err(BenchError::bad(format!(
            "--freq {} must be a positive frequency in Hz, at most kernel.perf_event_max_sample_rate = {max_rate}",
            opts.freq
        )));
    }
    if opts.kinds.contains(&Kind::Perf) && vmscope_testkit_free_which("perf").is_none() {
        return Err(BenchError::bad(
            "perf is not installed (Debian package linux-perf); leave `perf` out of --profilers",
        ));
    }
    // -o is checked and locked before anything runs.
    let spec = opts.lab.load()?;
    let opened = opts.output.open()?;
    let progress = &opened.progress;
    let session = opened.session;
    LabSession::run_within(
        spec.as_ref(),
        &opts.lab.options,
        opts.lab.keep,
        progress,
        |lab| run_in(opts, lab, session, progress, out),
    )
}

/// The work and `--record` directories made, and what the runs will
/// write there checked against what the directories hold (store::output's
/// rules): before any sample.
fn check_dirs(opts: &OverheadOptions) -> Result<(), BenchError> {
    std::fs::create_dir_all(&opts.work_dir).map_err(|e| BenchError::Output {
        what: "work directory",
        path: opts.work_dir.clone(),
        message: e.to_string(),
    })?;
    if let Some(dir) = &opts.record.dir {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::Output {
            what: "--record directory",
            path: dir.clone(),
            message: e.to_string(),
        })?;
    }
    // Before any sample: what the runs write may replace what the
    // directories hold under those names (store::output's rules).
    let names = |prefix: &'static str| {
        move |n: &str| {
            Kind::ALL.iter().any(|k| {
                profiler::numbered(n, &format!("{prefix}{}", k.name()), &["db", "data", "log"])
            })
        }
    };
    for (what, dir, prefix) in [
        ("--record directory", opts.record.dir.as_ref(), "overhead-"),
        ("work directory (--work-dir)", Some(&opts.work_dir), ""),
    ] {
        if let Some(dir) = dir {
            profiler::check_dir(dir, names(prefix), opts.output.force).map_err(|message| {
                BenchError::Output {
                    what,
                    path: dir.clone(),
                    message,
                }
            })?;
        }
    }
    Ok(())
}

/// The run in `lab` (`--lab`'s, when given): the workload in `--vm`, or in
/// the lab's first VM, or on the host.
fn run_in(
    opts: &OverheadOptions,
    lab: Option<&vmscope_lab::LabState>,
    session_out: Option<vmscope_store::output::SessionOutput>,
    progress: &crate::progress::Progress,
    out: &mut dyn Write,
) -> Result<OverheadOutcome, BenchError> {
    let mut notes = Vec::new();
    let vm = opts
        .vm
        .clone()
        .or_else(|| lab.and_then(|l| l.vms.first()).map(|v| v.name.clone()));
    let (guest, accel) = match &vm {
        Some(name) => {
            let (st, vm) = vmscope_lab::find_vm(&opts.lab.options, None, name)
                .map_err(|e| BenchError::bad(format!("--vm {name}: {e}")))?;
            if !vmscope_lab::vm_running(&vm) {
                return Err(BenchError::bad(format!(
                    "--vm {name}: the VM of lab {} is not running",
                    st.name
                )));
            }
            if st.accel != "kvm" {
                notes.push(format!(
                    "accel {}: the guest's sampling interrupts (active) are emulated in software \
                     under TCG, so the active loss is larger than under KVM",
                    st.accel
                ));
            }
            (Some(Guest::new(&vm)), Some(st.accel))
        }
        None => (None, None),
    };
    check_dirs(opts)?;
    let mut facts: Vec<(&str, String)> = Vec::new();
    if let Some(a) = &accel {
        facts.push(("accel", a.clone()));
    }
    let manifest = Arc::new(Manifest::host(&opts.output.command_line).with(&facts));
    let place = vm.clone().map_or("host".to_string(), |v| format!("vm:{v}"));
    let points: Vec<(Kind, Point)> = opts
        .kinds
        .iter()
        .map(|&k| {
            let config: BTreeMap<String, String> = [
                ("workload", opts.workload.name().to_string()),
                ("where", place.clone()),
                ("threads", opts.threads.to_string()),
                ("seconds", opts.seconds.to_string()),
                ("profiler", k.name().to_string()),
                ("freq", opts.freq.to_string()),
            ]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b))
            .collect();
            (
                k,
                Point::new(
                    "overhead",
                    format!("{} {place} {}", opts.workload, k.name()),
                    config,
                    manifest.clone(),
                    &["accel"],
                ),
            )
        })
        .collect();
    let mut e = OverheadExperiment {
        opts: opts.clone(),
        points,
        guest,
        probe: LoadProbe::default(),
        runs: 0,
        guest_runs: 0,
    };
    let drive_opts = DriveOptions::sampling(
        opts.sampling.warmup,
        opts.sampling.rule(DEFAULT_REPEAT.0, DEFAULT_REPEAT.1)?,
        opts.sampling.seed,
        opts.sampling.busy,
        opts.sampling.busy_retries,
        opts.lab.options.cancel.clone(),
    );
    let mut sink = Sink::for_format(
        opts.output.format,
        &mut *out,
        &[
            "workload", "where", "threads", "seconds", "profiler", "freq",
        ],
    )?;
    let (results, rows) = driver::drive(&mut e, &drive_opts, &[], &mut sink, progress)?;
    progress.finish();
    let outcome = OverheadOutcome {
        accel,
        kinds: opts.kinds.clone(),
        results,
        notes,
    };
    let u = format!("{}/s", opts.workload.work_unit());
    let mut records: Vec<serde_json::Value> = Vec::new();
    if let Some(sp) = outcome.split() {
        records.push(serde_json::json!({"type": "split", "experiment": "overhead", "split": sp}));
    }
    let end = driver::Ending {
        summaries: e
            .points
            .iter()
            .zip(&outcome.results)
            .map(|((k, p), r)| {
                let prof = |f: &dyn Fn(&Stopped) -> f64| profiler_mean(r, |x| Some(f(x)));
                driver::summary(
                    p,
                    "throughput",
                    &u,
                    r.summary(),
                    r.state(),
                    serde_json::json!({
                        "profiler": k.name(),
                        "describe": k.describe(opts.freq),
                        "loss": outcome.loss(*k).map(|l| l.loss),
                        "loss_ci95": outcome.loss(*k).and_then(|l| l.ci95.is_finite().then_some(l.ci95)),
                        "profiler_cpu_s": prof(&|x| x.cpu_s),
                        "profiler_samples": prof(&|x| x.samples as f64),
                        "profiler_lost": prof(&|x| x.lost as f64),
                        "guest_samples": prof(&|x| x.guest_samples as f64),
                        "recordings": r.samples.iter().filter_map(|x| x.recording.clone()).collect::<Vec<_>>(),
                    }),
                )
            })
            .collect(),
        records,
        charts: Vec::new(),
        notes: outcome.notes.clone(),
    };
    driver::finish(
        sink,
        &opts.output,
        session_out,
        "bench overhead",
        &rows,
        &end,
        |w| print_text(w, &e.points, &outcome, opts),
    )?;
    Ok(outcome)
}

/// `perf` on PATH.
fn vmscope_testkit_free_which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|f| f.is_file())
    })
}

fn print_text(
    out: &mut dyn Write,
    points: &[(Kind, Point)],
    o: &OverheadOutcome,
    opts: &OverheadOptions,
) -> std::io::Result<()> {
    let (div, u) = match opts.workload {
        Workload::MemWrite => (f64::from(1u32 << 30), "GiB/s"),
        Workload::Cpu => (1e6, "M iterations/s"),
    };
    let mut t = table(&[
        "Profiler".to_string(),
        format!("Throughput ({u})"),
        format!("±95 % ({u})"),
        "n".to_string(),
        "Loss (%)".to_string(),
        "±95 % (%)".to_string(),
        "Profiler CPU (s)".to_string(),
        "Samples".to_string(),
        "Lost".to_string(),
        "Note".to_string(),
    ]);
    for ((k, _), r) in points.iter().zip(&o.results) {
        let s = r.summary();
        let f = crate::output::fixed;
        let l = o.loss(*k);
        let mean_prof = |g: &dyn Fn(&Stopped) -> f64| profiler_mean(r, |x| Some(g(x)));
        let mut note = r.failed.clone().unwrap_or_default();
        if r.flagged() > 0 {
            note = format!("{note} {} flagged", r.flagged()).trim().to_string();
        }
        t.add_row(vec![
            k.describe(opts.freq),
            f(s.map(|s| s.mean / div), 3),
            f(
                s.map(|s| {
                    if s.ci95.is_finite() {
                        s.ci95 / div
                    } else {
                        0.0
                    }
                }),
                3,
            ),
            s.map_or(0, |s| s.n).to_string(),
            f(l.filter(|_| *k != Kind::None).map(|l| l.loss * 100.0), 1),
            f(
                l.filter(|_| *k != Kind::None)
                    .and_then(|l| l.ci95.is_finite().then_some(l.ci95 * 100.0)),
                1,
            ),
            f(mean_prof(&|x| x.cpu_s), 3),
            f(mean_prof(&|x| (x.samples + x.guest_samples) as f64), 0),
            f(mean_prof(&|x| (x.lost + x.guest_lost) as f64), 0),
            note,
        ]);
    }
    writeln!(out, "{t}")?;
    if let Some(sp) = o.split() {
        writeln!(out, "split: {}", sp.describe())?;
    }
    if let Some(dir) = &opts.record.dir {
        let n: usize = o
            .results
            .iter()
            .map(|r| r.samples.iter().filter(|x| x.recording.is_some()).count())
            .sum();
        writeln!(
            out,
            "recorded: {n} profiled runs kept in {} (overhead-PROFILER-N.db, perf: .data)",
            dir.display()
        )?;
    }
    for n in &o.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_adds_up_and_says_each_side() {
        let sp = Split {
            active: 0.09,
            host_side: Some(0.015),
            guest_side: Some(0.075),
            host_measured: Some(0.012),
            guest_measured: None,
        };
        let d = sp.describe();
        for part in [
            "active loss 9.0 %",
            "host side 1.5 %",
            "guest side 7.5 %",
            "host recorder 1.2 %",
            "agents - of",
        ] {
            assert!(d.contains(part), "{part}: {d}");
        }
    }

    #[test]
    fn loss_and_its_interval() {
        let none = Summary::of(&[100.0, 100.0, 100.0]).unwrap();
        let s = Summary::of(&[90.0, 90.0, 90.0]).unwrap();
        let l = loss(&s, &none).unwrap();
        assert!((l.loss - 0.1).abs() < 1e-12 && l.ci95 == 0.0, "{l:?}");
        let noisy = Summary::of(&[80.0, 100.0]).unwrap();
        let l = loss(&noisy, &none).unwrap();
        assert!((l.loss - 0.1).abs() < 1e-12 && l.ci95 > 0.5, "{l:?}");
        assert!(loss(&s, &Summary::of(&[0.0]).unwrap()).is_none());
    }

    #[test]
    fn bad_options_are_refused() {
        let bad = |o: OverheadOptions| match run(&o, &mut Vec::new()) {
            Err(BenchError::BadInput(m)) => m,
            other => panic!("{:?}", other.err()),
        };
        let o = OverheadOptions {
            output: crate::options::Output {
                quiet: true,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(bad(OverheadOptions {
            kinds: vec![Kind::Perf],
            ..o.clone()
        })
        .contains("none"));
        assert!(bad(OverheadOptions {
            kinds: vec![Kind::None],
            ..o.clone()
        })
        .contains("besides none"));
        assert!(bad(OverheadOptions {
            threads: 0,
            ..o.clone()
        })
        .contains("--threads"));
        assert!(bad(OverheadOptions {
            vm: Some("netbench-no-such-vm".into()),
            ..o.clone()
        })
        .contains("netbench-no-such-vm"));
    }
}
