//! `vmscope bench io`: giacobbi2011's storage method on the host and in lab
//! VMs, with the statistics of docs/architecture.md §8 and the host CPU each backend
//! costs (cherkasova2005's disk experiment on KVM/QEMU).
//!
//! A sweep is every (target, mode, data size, block size) point. Before
//! the first byte: targets are resolved (a lab brought up or reused, its
//! disks listed, skipped ones shown as unavailable), inspected and checked
//! ([`target::check`]); then each target's region is filled once so reads
//! hit real blocks. The points then run in interleaved rounds
//! ([`crate::schedule::Plan`]): warm-up discarded, at least `repeat`
//! samples, more until the 95 % interval is within `rel_ci` of the mean
//! or the cap. Every sample drops the host's and the guest's caches,
//! watches the host for other load (a busy sample is redone, then kept
//! flagged) and runs the accountant around the run, so each point also
//! reports host CPU seconds per GiB split into vCPU, the VM's I/O threads,
//! charged shared I/O and kernel threads. A VM that dies fails its
//! remaining points; the sweep goes on.
//!
//! Output: samples as JSON lines or CSV while the run goes on (one row per
//! sample and metric, base units), or giacobbi's Table 1 layout per
//! target at the end; charts of speed vs block size per mode (SVG, PNG);
//! the paper's findings checked ([`paper`]); rows into a session file.

pub mod paper;
pub mod report;
pub mod runner;
pub mod target;

use crate::driver::{self, DriveOptions, Experiment, Sink};
use crate::guest::{Guest, VmFailure};
use crate::hygiene::LoadProbe;
use crate::lab_session::LabSession;
use crate::manifest::Manifest;
use crate::options::{LabChoice, Output, Recording, Sampling};
use crate::output::Format;
use crate::progress::Progress;
use crate::row::{unit, Point, Row};
use crate::schedule::Step;
use crate::stats::{StopRule, Summary, Verdict};
use crate::units::{iec, parse_size_list, GIB};
use crate::BenchError;
use runner::{CpuSplit, Runner, SampleOut};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
pub use target::TargetArg;
use target::{Backend, Demand, Place, Target, Unavailable};
use vmscope_stat::account::{AccountOptions, Accountant};
use vmscope_workload::io::Mode;

/// The method's defaults (giacobbi2011 Experiment 1).
pub const DEFAULT_BS: &str = "512..1M";
pub const DEFAULT_SIZE: &str = "1G";
pub const DEFAULT_MODES: [Mode; 3] = [Mode::BufferedWrite, Mode::DirectWrite, Mode::DirectRead];
pub const DEFAULT_REPEAT: usize = 5;
pub const DEFAULT_MAX_REPEAT: usize = 20;

/// The short run of `--check-paper` (when --bs, --size, --repeat are not given).
pub const CHECK_BS: &str = "4k,16k,64k,256k,1M";
pub const CHECK_SIZE: &str = "32M";
pub const CHECK_REPEAT: usize = 3;
pub const CHECK_MAX_REPEAT: usize = 6;

/// Everything `bench io` is asked to do. `None` fields take the method's
/// defaults (or `--check-paper`'s short run); so do `sampling.repeat` and
/// `sampling.max_repeat`.
#[derive(Debug, Clone)]
pub struct IoOptions {
    pub targets: Vec<TargetArg>,
    pub block_sizes: Option<Vec<u64>>,
    pub sizes: Option<Vec<u64>>,
    pub modes: Option<Vec<Mode>>,
    /// Byte offset of every run in its target.
    pub offset: u64,
    pub check_paper: bool,
    /// `--force-destroy-data` values (target ids or host paths).
    pub force_destroy: Vec<String>,
    /// Run the accountant around every sample.
    pub account: bool,
    pub drop_caches: bool,
    pub sampling: Sampling,
    pub output: Output,
    /// A lab to bring up (or reuse); the built-in `storage-quad` for a
    /// bare `--check-paper`.
    pub lab: LabChoice,
    pub record: Recording,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions {
            targets: Vec::new(),
            block_sizes: None,
            sizes: None,
            modes: None,
            offset: 0,
            check_paper: false,
            force_destroy: Vec::new(),
            account: true,
            drop_caches: true,
            sampling: Sampling::default(),
            output: Output::default(),
            lab: LabChoice::default(),
            record: Recording::default(),
        }
    }
}

/// The sweep's parameters after defaults.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub block_sizes: Vec<u64>,
    pub sizes: Vec<u64>,
    pub modes: Vec<Mode>,
    pub rule: StopRule,
}

impl IoOptions {
    /// Fills in defaults and checks the numbers (before any I/O).
    pub fn sweep(&self) -> Result<Sweep, BenchError> {
        let short = self.check_paper;
        let list = |v: &Option<Vec<u64>>, def: &str, what: &str| -> Result<Vec<u64>, BenchError> {
            match v {
                Some(v) if !v.is_empty() => Ok(v.clone()),
                Some(_) => Err(BenchError::bad(format!("{what} is empty"))),
                None => parse_size_list(def, what).map_err(BenchError::bad),
            }
        };
        let block_sizes = list(
            &self.block_sizes,
            if short { CHECK_BS } else { DEFAULT_BS },
            "--bs",
        )?;
        let sizes = list(
            &self.sizes,
            if short { CHECK_SIZE } else { DEFAULT_SIZE },
            "--size",
        )?;
        if let Some(bs) = block_sizes
            .iter()
            .find(|&&b| b > vmscope_workload::io::MAX_BLOCK_SIZE)
        {
            return Err(BenchError::bad(format!(
                "--bs {bs} is above the engine's 64 MiB limit"
            )));
        }
        let min_size = sizes.iter().min().copied().unwrap_or(0);
        if sizes.iter().all(|&s| s < block_sizes[0]) {
            return Err(BenchError::bad(format!(
                "--size {} is smaller than the smallest --bs {}: no point to run",
                iec(min_size),
                iec(block_sizes[0])
            )));
        }
        let modes = match &self.modes {
            Some(m) if !m.is_empty() => {
                let mut m = m.clone();
                m.dedup();
                m
            }
            Some(_) => return Err(BenchError::bad("--mode is empty")),
            None => DEFAULT_MODES.to_vec(),
        };
        let rule = if short {
            self.sampling.rule(CHECK_REPEAT, CHECK_MAX_REPEAT)?
        } else {
            self.sampling.rule(DEFAULT_REPEAT, DEFAULT_MAX_REPEAT)?
        };
        Ok(Sweep {
            block_sizes,
            sizes,
            modes,
            rule,
        })
    }
}

/// One point: a target, a mode, a data size and a block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PointKey {
    pub target: usize,
    pub mode: Mode,
    pub size: u64,
    pub bs: u64,
}

/// A point's results.
#[derive(Debug, Clone)]
pub struct PointResult {
    pub key: PointKey,
    pub point: Point,
    pub samples: Vec<SampleOut>,
    /// Per sample: why it is suspect, if it is.
    pub flags: Vec<Option<String>>,
    pub failed: Option<String>,
    pub verdict: Verdict,
    /// `--record`: the session of the point's profiled run, or why none.
    pub session: Option<PathBuf>,
    pub record_error: Option<String>,
}

/// Host CPU seconds per GiB moved, mean over a point's samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuPerGib {
    pub vcpu: f64,
    pub io_threads: f64,
    pub shared_io: f64,
    pub kernel_threads: f64,
    pub engine: f64,
    pub total: f64,
}

impl PointResult {
    /// Speed, bytes/s.
    pub fn speed(&self) -> Option<Summary> {
        Summary::of(
            &self
                .samples
                .iter()
                .map(|s| s.run.bytes_per_s())
                .collect::<Vec<_>>(),
        )
    }

    /// Wall time, s.
    pub fn wall(&self) -> Option<Summary> {
        Summary::of(
            &self
                .samples
                .iter()
                .map(|s| s.run.wall_s)
                .collect::<Vec<_>>(),
        )
    }

    /// Blocks per run.
    pub fn count(&self) -> u64 {
        self.key.size / self.key.bs
    }

    pub fn flagged(&self) -> usize {
        self.flags.iter().filter(|f| f.is_some()).count()
    }

    /// Mean host CPU per GiB over the samples that have it.
    pub fn cpu_per_gib(&self) -> Option<CpuPerGib> {
        let per: Vec<(CpuSplit, f64)> = self
            .samples
            .iter()
            .filter_map(|s| s.host_cpu.map(|h| (h, s.run.bytes as f64 / GIB)))
            .filter(|(_, g)| *g > 0.0)
            .collect();
        if per.is_empty() {
            return None;
        }
        let n = per.len() as f64;
        let mean =
            |f: &dyn Fn(&CpuSplit) -> f64| per.iter().map(|(h, g)| f(h) / g).sum::<f64>() / n;
        Some(CpuPerGib {
            vcpu: mean(&|h| h.vcpu_s),
            io_threads: mean(&|h| h.io_threads_s),
            shared_io: mean(&|h| h.shared_io_s),
            kernel_threads: mean(&|h| h.kernel_threads_s),
            engine: mean(&|h| h.engine_s),
            total: mean(&|h| h.total_s()),
        })
    }
}

/// What a sweep produced.
pub struct IoOutcome {
    pub targets: Vec<Target>,
    pub unavailable: Vec<Unavailable>,
    pub sweep: Sweep,
    pub results: Vec<PointResult>,
    pub findings: Vec<paper::Finding>,
    pub charts: Vec<PathBuf>,
    pub notes: Vec<String>,
}

impl IoOutcome {
    pub fn failed_points(&self) -> usize {
        self.results.iter().filter(|r| r.failed.is_some()).count()
    }
}

/// Runs the sweep; results go to `out` in `opts.output.format`.
pub fn run(opts: &IoOptions, out: &mut dyn Write) -> Result<IoOutcome, BenchError> {
    // Every option is checked before anything starts.
    let sweep = opts.sweep()?;
    opts.record.check()?;
    // The lab, if any: `--lab`, or the built-in one for a bare --check-paper.
    let lab = LabChoice {
        spec: opts.lab.spec.clone().or_else(|| {
            (opts.check_paper && opts.targets.is_empty()).then(|| "storage-quad".to_string())
        }),
        ..opts.lab.clone()
    };
    let lab_spec = lab.load()?;
    if opts.drop_caches && !is_root() {
        return Err(BenchError::bad(
            "dropping caches before every sample needs root (run as root, or pass \
             --no-drop-caches and every sample is flagged)",
        ));
    }
    if opts.targets.is_empty() && lab_spec.is_none() {
        return Err(BenchError::bad(
            "name a --target (host:PATH or vm:NAME:DEVICE) or a --lab",
        ));
    }
    let opened = opts.output.open()?;
    let progress = &opened.progress;
    let session = opened.session;
    LabSession::run_within(
        lab_spec.as_ref(),
        &lab.options,
        lab.keep,
        progress,
        |state| {
            let (args, unavailable, auto_host) = lab_targets(opts, &sweep, state)?;
            let r = sweep_targets(
                opts,
                &sweep,
                &args,
                unavailable,
                auto_host.as_deref(),
                state,
                session,
                progress,
                out,
            );
            if let Some(p) = &auto_host {
                let _ = std::fs::remove_file(p);
            }
            r
        },
    )
}

/// The targets of a run, the lab's disks that cannot be measured, and the
/// host file made beside the lab's images (removed after the run).
type LabTargets = (Vec<TargetArg>, Vec<Unavailable>, Option<PathBuf>);

/// The targets to measure: the named ones, then the lab's disks (skipped
/// ones as unavailable) and, when no host target is named, a host file
/// beside the lab's images (made here; removed after the run).
fn lab_targets(
    opts: &IoOptions,
    sweep: &Sweep,
    lab: Option<&vmscope_lab::LabState>,
) -> Result<LabTargets, BenchError> {
    let end = opts.offset + sweep.sizes.iter().max().copied().unwrap_or(0);
    let mut args: Vec<TargetArg> = opts.targets.clone();
    let mut unavailable = Vec::new();
    let Some(s) = lab else {
        return Ok((args, unavailable, None));
    };
    for vm in &s.vms {
        for d in &vm.disks {
            let backend = Backend::of_disk(&d.backend, &d.format);
            match (&d.guest_device, &d.skipped) {
                (Some(dev), None) => {
                    let a = TargetArg::Vm {
                        vm: vm.name.clone(),
                        device: dev.clone(),
                    };
                    if !args.contains(&a) {
                        args.push(a);
                    }
                }
                (_, why) => unavailable.push(Unavailable {
                    id: format!("vm:{}:({} disk)", vm.name, d.backend),
                    label: format!("{} {}", vm.name, backend.name()),
                    reason: why.clone().unwrap_or_else(|| "not attached".into()),
                }),
            }
        }
    }
    let mut auto_host = None;
    if !args.iter().any(|a| matches!(a, TargetArg::Host(_))) {
        let p = s.run_dir.join("host-native.img");
        let err = |e: std::io::Error| BenchError::Output {
            what: "host target",
            path: p.clone(),
            message: e.to_string(),
        };
        let f = std::fs::File::create(&p).map_err(err)?;
        f.set_len(end).map_err(err)?;
        auto_host = Some(p.clone());
        args.insert(0, TargetArg::Host(p));
    }
    Ok((args, unavailable, auto_host))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Resolves, checks and prepares the targets, then runs the points on the
/// driver's loop and writes the results.
#[allow(clippy::too_many_arguments)]
fn sweep_targets(
    opts: &IoOptions,
    sweep: &Sweep,
    args: &[TargetArg],
    unavailable: Vec<Unavailable>,
    auto_host: Option<&std::path::Path>,
    lab: Option<&vmscope_lab::LabState>,
    session_out: Option<vmscope_store::output::SessionOutput>,
    progress: &Progress,
    out: &mut dyn Write,
) -> Result<IoOutcome, BenchError> {
    let host_manifest = Manifest::host(&opts.output.command_line);
    let mut runner = Runner {
        guests: Vec::new(),
        accountant: None,
        probe: LoadProbe::default(),
        drop_caches: opts.drop_caches,
        overhead: Vec::new(),
    };
    let (targets, vm_index) = resolve_targets(
        opts,
        args,
        auto_host,
        lab,
        &host_manifest,
        &mut runner,
        progress,
    )?;
    check_targets(opts, sweep, &targets)?;
    if opts.account {
        let mut acc = Accountant::new(AccountOptions::default());
        let _ = acc.sample();
        runner.accountant = Some(acc);
    }
    let (keys, points, mut notes) = make_points(opts, sweep, &targets);
    let mut sink = Sink::for_format(
        opts.output.format,
        &mut *out,
        &[
            "target", "label", "backend", "mode", "bs", "size", "count", "offset",
        ],
    )?;
    for u in &unavailable {
        sink.record(&serde_json::json!({"type": "unavailable", "target": u.id, "label": u.label, "reason": u.reason}))?;
        progress.note(&format!(
            "unavailable: {} ({}): {}",
            u.id, u.label, u.reason
        ));
    }
    let dead_vms = prepare(
        opts,
        sweep,
        &targets,
        &vm_index,
        &mut runner,
        &mut notes,
        progress,
    )?;
    let skip: Vec<(usize, String)> = keys
        .iter()
        .enumerate()
        .filter_map(|(i, k)| {
            let vm = targets[k.target].vm()?;
            dead_vms.get(&vm.name).map(|why| (i, why.clone()))
        })
        .collect();
    let mut e = IoExperiment {
        targets,
        vm_index,
        keys,
        points,
        runner,
        offset: opts.offset,
    };
    let drive_opts = DriveOptions {
        record: opts.record.points("io", None, opts.output.force),
        ..DriveOptions::sampling(
            opts.sampling.warmup,
            sweep.rule,
            opts.sampling.seed,
            opts.sampling.busy,
            opts.sampling.busy_retries,
            opts.lab.options.cancel.clone(),
        )
    };
    let (outcomes, rows) = driver::drive(&mut e, &drive_opts, &skip, &mut sink, progress)?;
    let results: Vec<PointResult> = outcomes
        .into_iter()
        .enumerate()
        .map(|(i, o)| PointResult {
            key: e.keys[i],
            point: e.points[i].clone(),
            flags: o.flags,
            failed: o.failed,
            verdict: o.verdict,
            samples: o.samples,
            session: o.session,
            record_error: o.record_error,
        })
        .collect();
    let findings = if opts.check_paper {
        paper::check(&report::observations(&e.targets, &results, sweep))
    } else {
        Vec::new()
    };
    let mut outcome = IoOutcome {
        targets: e.targets,
        unavailable,
        sweep: sweep.clone(),
        results,
        findings,
        charts: Vec::new(),
        notes,
    };
    if let Some(dir) = &opts.output.charts {
        if outcome.sweep.block_sizes.len() > 1 || outcome.sweep.sizes.len() > 1 {
            outcome.charts = report::charts(dir, &outcome)?;
        } else {
            outcome.notes.push(format!(
                "no chart written to {}: one block size and one data size make no line \
                 (give several --bs or --size values)",
                dir.display()
            ));
        }
    }
    let end = driver::Ending {
        summaries: outcome.results.iter().map(report::summary_json).collect(),
        records: outcome.findings.iter().map(paper::Finding::json).collect(),
        charts: outcome.charts.clone(),
        notes: outcome.notes.clone(),
    };
    let summary_only = opts.output.format == Format::Csv;
    driver::finish(
        sink,
        &opts.output,
        session_out,
        "bench io",
        &rows,
        &end,
        |w| {
            if summary_only {
                report::short_summary(w, &outcome)
            } else {
                report::tables(w, &outcome)
            }
        },
    )?;
    Ok(outcome)
}

/// Each argument as a [`Target`]: inspected on the host or through its
/// VM's agent (one connection per VM, shared by its targets), labelled so
/// that labels tell targets apart. Also each target's VM connection.
fn resolve_targets(
    opts: &IoOptions,
    args: &[TargetArg],
    auto_host: Option<&std::path::Path>,
    lab: Option<&vmscope_lab::LabState>,
    host_manifest: &Manifest,
    runner: &mut Runner,
    progress: &Progress,
) -> Result<(Vec<Target>, Vec<Option<usize>>), BenchError> {
    let mut targets: Vec<Target> = Vec::new();
    let mut vm_index: Vec<Option<usize>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for a in args {
        if !seen.insert(a.id()) {
            continue;
        }
        progress.set_message(format!("inspecting {}", a.id()));
        match a {
            TargetArg::Host(p) => {
                let info = vmscope_workload::io::inspect(p);
                let path = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
                let facts = target::host_facts(&info);
                targets.push(Target {
                    id: a.id(),
                    label: "host".to_string(),
                    backend: Backend::Host,
                    place: Place::Host,
                    path,
                    manifest: Arc::new(host_manifest.with(&facts)),
                    info,
                    created: auto_host.is_some_and(|h| h == p.as_path()),
                });
                vm_index.push(None);
            }
            TargetArg::Vm { vm, device } => {
                let (t, conn) = vm_target(opts, a, vm, device, lab, host_manifest, runner)?;
                targets.push(t);
                vm_index.push(Some(conn));
            }
        }
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for t in &targets {
        *counts.entry(t.label.clone()).or_default() += 1;
    }
    for t in targets.iter_mut() {
        if counts[&t.label] > 1 {
            t.label = format!("{} {}", t.label, t.path.display());
        }
    }
    Ok((targets, vm_index))
}

/// A disk of a lab VM as a target, and its VM's connection in `runner`.
fn vm_target(
    opts: &IoOptions,
    a: &TargetArg,
    vm: &str,
    device: &str,
    lab: Option<&vmscope_lab::LabState>,
    host_manifest: &Manifest,
    runner: &mut Runner,
) -> Result<(Target, usize), BenchError> {
    let (st, v) = match lab {
        Some(l) if l.vms.iter().any(|x| x.name == vm) => {
            (l.clone(), l.vm(vm).expect("checked").clone())
        }
        _ => vmscope_lab::find_vm(&opts.lab.options, None, vm)
            .map_err(|e| BenchError::bad(format!("target {}: {e}", a.id())))?,
    };
    if !vmscope_lab::vm_running(&v) {
        return Err(BenchError::bad(format!(
            "target {}: VM {vm} of lab {} is not running",
            a.id(),
            st.name
        )));
    }
    let facts = target::vm_facts(&st, &v, device);
    let backend = target::lab_disk(&v, device)
        .map(|d| Backend::of_disk(&d.backend, &d.format))
        .unwrap_or(Backend::Unknown);
    let known = runner
        .guests
        .iter()
        .position(|c| c.as_ref().is_some_and(|c| c.name() == vm));
    let conn = known.unwrap_or_else(|| {
        runner.guests.push(Some(Guest::new(&v)));
        runner.guests.len() - 1
    });
    let mut t = Target {
        id: a.id(),
        label: format!("{vm} {}", backend.name()),
        backend,
        place: Place::Vm {
            vm: Box::new(v.clone()),
            lab: st.name.clone(),
            accel: st.accel.clone(),
        },
        path: PathBuf::from(device),
        info: Default::default(),
        manifest: Arc::new(host_manifest.with(&facts)),
        created: false,
    };
    t.info = runner
        .inspect(&t, Some(conn))
        .map_err(|e| BenchError::bad(format!("target {}: {e}", a.id())))?;
    Ok((t, conn))
}

/// Every safety check of every target, before any I/O.
fn check_targets(opts: &IoOptions, sweep: &Sweep, targets: &[Target]) -> Result<(), BenchError> {
    let end = opts.offset + sweep.sizes.iter().max().copied().unwrap_or(0);
    let writes = sweep.modes.iter().any(|m| m.writes());
    for t in targets {
        let forced = target::is_forced(
            &opts.force_destroy,
            &t.id,
            matches!(t.place, Place::Host).then_some(t.path.as_path()),
        );
        let reads_need_fill = t.info.signature.is_none();
        target::check(
            &t.id,
            &t.info,
            &Demand {
                modes: &sweep.modes,
                block_sizes: &sweep.block_sizes,
                end,
                offset: opts.offset,
                writes: writes || reads_need_fill,
                forced,
            },
        )
        .map_err(BenchError::BadInput)?;
    }
    if targets.is_empty() {
        return Err(BenchError::bad(
            "no target can be measured (every lab disk is unavailable)",
        ));
    }
    Ok(())
}

/// Every (target, mode, size, block size) point and its row identity;
/// notes on the sweep's shape.
fn make_points(
    opts: &IoOptions,
    sweep: &Sweep,
    targets: &[Target],
) -> (Vec<PointKey>, Vec<Point>, Vec<String>) {
    let mut keys = Vec::new();
    let mut points = Vec::new();
    for (ti, t) in targets.iter().enumerate() {
        for &mode in &sweep.modes {
            for &size in &sweep.sizes {
                for &bs in sweep.block_sizes.iter().filter(|&&bs| bs <= size) {
                    let config: BTreeMap<String, String> = [
                        ("target", t.id.clone()),
                        ("label", t.label.clone()),
                        ("backend", t.backend.name().to_string()),
                        ("mode", mode.name().to_string()),
                        ("bs", bs.to_string()),
                        ("size", size.to_string()),
                        ("count", (size / bs).to_string()),
                        ("offset", opts.offset.to_string()),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                    keys.push(PointKey {
                        target: ti,
                        mode,
                        size,
                        bs,
                    });
                    points.push(Point::new(
                        "io",
                        format!("{} {} bs={} size={}", t.id, mode, bs, size),
                        config,
                        t.manifest.clone(),
                        &[
                            "backend",
                            "backing",
                            "cache",
                            "aio",
                            "accel",
                            "kernel",
                            "guest_kernel",
                        ],
                    ));
                }
            }
        }
    }
    let mut notes = Vec::new();
    if sweep
        .sizes
        .iter()
        .any(|s| sweep.block_sizes.iter().any(|b| s % b != 0 && s > b))
    {
        notes.push("a --size that is not a multiple of a --bs moves size / bs whole blocks".into());
    }
    (keys, points, notes)
}

/// Before the samples: each target's region filled once so reads hit real
/// blocks, and each VM's cost of a run that moves nothing measured (taken
/// off its samples). The VMs found dead meanwhile, with why.
fn prepare(
    opts: &IoOptions,
    sweep: &Sweep,
    targets: &[Target],
    vm_index: &[Option<usize>],
    runner: &mut Runner,
    notes: &mut Vec<String>,
    progress: &Progress,
) -> Result<BTreeMap<String, String>, BenchError> {
    let end = opts.offset + sweep.sizes.iter().max().copied().unwrap_or(0);
    let writes = sweep.modes.iter().any(|m| m.writes());
    let mut dead_vms: BTreeMap<String, String> = BTreeMap::new();
    for (ti, t) in targets.iter().enumerate() {
        if t.info.signature.is_some() && !writes {
            continue;
        }
        progress.set_message(format!(
            "preparing {} ({} of zeros)",
            t.id,
            iec(end - opts.offset)
        ));
        if let Err(e) = runner.fill(t, vm_index[ti], opts.offset, end - opts.offset) {
            if let Some(vm) = t.vm() {
                if !vmscope_lab::vm_running(vm) {
                    dead_vms.insert(vm.name.clone(), e.clone());
                    continue;
                }
            }
            return Err(BenchError::Output {
                what: "preparing target",
                path: t.path.clone(),
                message: e,
            });
        }
    }
    if runner.accountant.is_none() {
        return Ok(dead_vms);
    }
    let mut done = std::collections::HashSet::new();
    for (ti, t) in targets.iter().enumerate() {
        let (Some(ci), Some(vm)) = (vm_index[ti], t.vm()) else {
            continue;
        };
        if dead_vms.contains_key(&vm.name) || !done.insert(ci) {
            continue;
        }
        progress.set_message(format!(
            "VM {}: measuring the cost of an empty run",
            vm.name
        ));
        match runner.calibrate(t, ci, 3) {
            Ok(h) => notes.push(format!(
                "VM {}: a run that moves nothing (starting the engine in the guest) costs \
                 the host {:.3} s of vCPU, {:.3} s of I/O threads, {:.3} s of shared I/O \
                 (median of 3); taken off every sample of the VM",
                vm.name, h.vcpu_s, h.io_threads_s, h.shared_io_s
            )),
            Err(VmFailure::Dead(why)) => {
                dead_vms.insert(vm.name.clone(), why);
            }
            Err(VmFailure::Failed(why)) => {
                notes.push(format!("VM {}: no overhead measured: {why}", vm.name));
            }
        }
    }
    Ok(dead_vms)
}

/// The sweep's points as the driver's loop sees them.
struct IoExperiment {
    targets: Vec<Target>,
    vm_index: Vec<Option<usize>>,
    keys: Vec<PointKey>,
    points: Vec<Point>,
    runner: Runner,
    offset: u64,
}

impl Experiment for IoExperiment {
    type Sample = SampleOut;

    fn points(&self) -> usize {
        self.keys.len()
    }

    fn name(&self, i: usize) -> String {
        self.points[i].name.clone()
    }

    fn hash(&self, i: usize) -> String {
        self.points[i].config_hash.clone()
    }

    fn vms(&self, i: usize) -> Vec<String> {
        self.targets[self.keys[i].target]
            .vm()
            .map(|v| vec![v.name.clone()])
            .unwrap_or_default()
    }

    fn run(&mut self, i: usize, _step: Step) -> Result<SampleOut, VmFailure> {
        let key = self.keys[i];
        let t = &self.targets[key.target];
        let spec = runner::spec_for(&t.path, key.mode, key.bs, key.size, self.offset);
        self.runner.sample(t, self.vm_index[key.target], &spec)
    }

    fn value(&self, s: &SampleOut) -> f64 {
        s.run.bytes_per_s()
    }

    fn load(&self, s: &SampleOut) -> crate::hygiene::LoadSample {
        s.load
    }

    fn flag(&self, _s: &SampleOut) -> Option<String> {
        (!self.runner.drop_caches).then(|| "caches not dropped".to_string())
    }

    fn rows(&self, i: usize, n: u32, s: &SampleOut, flag: Option<String>) -> Vec<Row> {
        sample_rows(&self.points[i], n, s, flag)
    }
}

/// The rows of one sample: speed, time, bytes, the engine's CPU, the
/// host CPU split and its total per GiB, other load.
pub fn sample_rows(p: &Point, n: u32, s: &SampleOut, flag: Option<String>) -> Vec<Row> {
    let mut rows = vec![
        p.row(n, "throughput", s.run.bytes_per_s(), unit::BYTES_PER_S)
            .raw(Some(s.raw.clone())),
        p.row(n, "wall_time", s.run.wall_s, unit::SECONDS),
        p.row(n, "bytes", s.run.bytes as f64, unit::BYTES),
        p.row(n, "engine_cpu", s.run.cpu_s(), unit::SECONDS),
        p.row(n, "other_load", s.load.other_cpus(), unit::S_PER_S),
    ];
    if let Some(h) = s.host_cpu {
        let gib = s.run.bytes as f64 / GIB;
        rows.extend([
            p.row(n, "host_vcpu", h.vcpu_s, unit::SECONDS),
            p.row(n, "host_io_threads", h.io_threads_s, unit::SECONDS),
            p.row(n, "host_shared_io", h.shared_io_s, unit::SECONDS),
            p.row(n, "host_kernel_threads", h.kernel_threads_s, unit::SECONDS),
            p.row(n, "host_engine", h.engine_s, unit::SECONDS),
            p.row(
                n,
                "host_cpu_per_gib",
                if gib > 0.0 { h.total_s() / gib } else { 0.0 },
                unit::S_PER_GIB,
            ),
        ]);
        if let Some(ops) = h.disk_ops {
            rows.push(p.row(n, "disk_requests", ops as f64, unit::COUNT));
        }
    }
    rows.into_iter().map(|r| r.flagged(flag.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers_and_check_paper_is_short() {
        let s = IoOptions::default().sweep().unwrap();
        assert_eq!(s.block_sizes.len(), 12);
        assert_eq!((s.block_sizes[0], s.block_sizes[11]), (512, 1 << 20));
        assert_eq!(s.sizes, vec![1 << 30]);
        assert_eq!(s.modes, DEFAULT_MODES.to_vec());
        assert_eq!((s.rule.min_samples, s.rule.max_samples), (5, 20));
        let c = IoOptions {
            check_paper: true,
            ..Default::default()
        }
        .sweep()
        .unwrap();
        assert_eq!(c.block_sizes.len(), 5);
        assert_eq!(c.sizes, vec![32 << 20]);
        assert_eq!(c.rule.min_samples, 3);
    }

    #[test]
    fn bad_numbers_are_refused() {
        let bad = |o: IoOptions| o.sweep().unwrap_err().to_string();
        let sampling = |repeat, max_repeat| Sampling {
            repeat,
            max_repeat,
            ..Sampling::default()
        };
        assert!(bad(IoOptions {
            sampling: sampling(Some(0), None),
            ..Default::default()
        })
        .contains("--repeat"));
        assert!(bad(IoOptions {
            sampling: sampling(Some(5), Some(3)),
            ..Default::default()
        })
        .contains("--max-repeat"));
        assert!(bad(IoOptions {
            sizes: Some(vec![1024]),
            block_sizes: Some(vec![4096]),
            ..Default::default()
        })
        .contains("smaller than"));
        assert!(bad(IoOptions {
            sampling: Sampling {
                rel_ci: 0.0,
                ..Sampling::default()
            },
            ..Default::default()
        })
        .contains("--ci"));
        assert!(bad(IoOptions {
            block_sizes: Some(vec![128 << 20]),
            ..Default::default()
        })
        .contains("64 MiB"));
    }
}
