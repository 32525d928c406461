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

pub mod labs;
pub mod paper;
pub mod report;
pub mod runner;
pub mod target;

use crate::hygiene::{BusyRule, LoadProbe};
use crate::manifest::Manifest;
use crate::output::{CsvRows, Format, JsonLines};
use crate::progress::Progress;
use crate::row::{unit, Point, Row};
use crate::schedule::{Plan, Step};
use crate::stats::{StopRule, Summary, Verdict};
use crate::units::{iec, parse_size_list, GIB};
use crate::BenchError;
use runner::{HostCpu, Runner, SampleOut, VmConn, VmFailure};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
pub use target::TargetArg;
use target::{Backend, Demand, Place, Target, Unavailable};
use vmscope_lab::LabOptions;
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
/// defaults (or `--check-paper`'s short run).
#[derive(Debug, Clone)]
pub struct IoOptions {
    pub targets: Vec<TargetArg>,
    pub block_sizes: Option<Vec<u64>>,
    pub sizes: Option<Vec<u64>>,
    pub modes: Option<Vec<Mode>>,
    /// Samples per point at least (after the warm-up).
    pub repeat: Option<usize>,
    /// The cap on samples per point.
    pub max_repeat: Option<usize>,
    /// Target half-width of the 95 % interval, relative to the mean.
    pub rel_ci: f64,
    /// Discarded runs per point before its samples.
    pub warmup: usize,
    /// Byte offset of every run in its target.
    pub offset: u64,
    /// A lab spec file or built-in name to bring up (or reuse).
    pub lab: Option<String>,
    /// Run the lab under this name instead of the spec's.
    pub lab_name: Option<String>,
    pub lab_options: LabOptions,
    /// Leave a lab this run brought up running.
    pub keep_lab: bool,
    pub format: Format,
    /// Charts go here; `None`: no charts.
    pub charts: Option<PathBuf>,
    /// Store the rows in this session file.
    pub session: Option<PathBuf>,
    /// Let `session` replace a regular file that is not a vmscope session.
    pub force: bool,
    pub check_paper: bool,
    /// `--force-destroy-data` values (target ids or host paths).
    pub force_destroy: Vec<String>,
    /// Run the accountant around every sample.
    pub account: bool,
    pub busy: BusyRule,
    /// Redo a busy sample this many times before keeping it flagged.
    pub busy_retries: usize,
    pub drop_caches: bool,
    pub seed: u64,
    /// No progress bar or notes on stderr.
    pub quiet: bool,
    /// For the manifest.
    pub command_line: String,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions {
            targets: Vec::new(),
            block_sizes: None,
            sizes: None,
            modes: None,
            repeat: None,
            max_repeat: None,
            rel_ci: 0.05,
            warmup: 1,
            offset: 0,
            lab: None,
            lab_name: None,
            lab_options: LabOptions::default(),
            keep_lab: false,
            format: Format::Table,
            charts: None,
            session: None,
            force: false,
            check_paper: false,
            force_destroy: Vec::new(),
            account: true,
            busy: BusyRule::default(),
            busy_retries: 2,
            drop_caches: true,
            seed: 1,
            quiet: false,
            command_line: String::new(),
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
        let repeat = self
            .repeat
            .unwrap_or(if short { CHECK_REPEAT } else { DEFAULT_REPEAT });
        let max = self.max_repeat.unwrap_or(if short {
            CHECK_MAX_REPEAT
        } else {
            DEFAULT_MAX_REPEAT
        });
        if repeat == 0 {
            return Err(BenchError::bad("--repeat must be at least 1"));
        }
        if max < repeat {
            return Err(BenchError::bad(format!(
                "--max-repeat {max} is below --repeat {repeat}"
            )));
        }
        if !(self.rel_ci > 0.0 && self.rel_ci < 1.0) {
            return Err(BenchError::bad(format!(
                "--ci {} must be a fraction between 0 and 1 (0.05 = 5 %)",
                self.rel_ci
            )));
        }
        Ok(Sweep {
            block_sizes,
            sizes,
            modes,
            rule: StopRule {
                min_samples: repeat,
                max_samples: max,
                rel_ci: self.rel_ci,
            },
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
        let per: Vec<(HostCpu, f64)> = self
            .samples
            .iter()
            .filter_map(|s| s.host_cpu.map(|h| (h, s.run.bytes as f64 / GIB)))
            .filter(|(_, g)| *g > 0.0)
            .collect();
        if per.is_empty() {
            return None;
        }
        let n = per.len() as f64;
        let mean = |f: &dyn Fn(&HostCpu) -> f64| per.iter().map(|(h, g)| f(h) / g).sum::<f64>() / n;
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

/// Runs the sweep; results go to `out` in `opts.format`.
pub fn run(opts: &IoOptions, out: &mut dyn Write) -> Result<IoOutcome, BenchError> {
    let sweep = opts.sweep()?;
    // The lab, if any: `--lab`, or the built-in one for a bare --check-paper.
    let lab_arg = opts.lab.clone().or_else(|| {
        (opts.check_paper && opts.targets.is_empty()).then(|| "storage-quad".to_string())
    });
    let lab_spec = lab_arg
        .as_deref()
        .map(|a| labs::load_spec(a, opts.lab_name.as_deref()))
        .transpose()?;
    if opts.drop_caches && !is_root() {
        return Err(BenchError::bad(
            "dropping caches before every sample needs root (run as root, or pass \
             --no-drop-caches and every sample is flagged)",
        ));
    }
    if opts.targets.is_empty() && opts.lab.is_none() && !opts.check_paper {
        return Err(BenchError::bad(
            "name a --target (host:PATH or vm:NAME:DEVICE) or a --lab",
        ));
    }
    // The session output is checked and locked before anything runs.
    let session_out =
        crate::session::prepare_optional(opts.session.as_deref(), opts.force, &opts.command_line)?;
    let progress = Progress::new(0, opts.quiet);
    let host_manifest = Manifest::host(&opts.command_line);

    let mut session = None;
    if let Some(spec) = &lab_spec {
        progress.set_message(format!("lab {}: starting (or reusing) its VMs", spec.name));
        let s = labs::LabSession::open(spec, &opts.lab_options, opts.keep_lab)?;
        progress.note(&format!(
            "lab {}: {} ({}; accel {})",
            s.state.name,
            if s.owned {
                "brought up"
            } else {
                "already up, reused"
            },
            s.state
                .vms
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            s.state.accel
        ));
        session = Some(s);
    }

    // Targets: named ones, then the lab's disks (and a host file on the
    // lab's file system when no host target is named).
    let end = opts.offset + sweep.sizes.iter().max().copied().unwrap_or(0);
    let mut args: Vec<TargetArg> = opts.targets.clone();
    let mut unavailable = Vec::new();
    let mut auto_host = None;
    if let Some(s) = &session {
        for vm in &s.state.vms {
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
        if !args.iter().any(|a| matches!(a, TargetArg::Host(_))) {
            let p = s.state.run_dir.join("host-native.img");
            let f = std::fs::File::create(&p).map_err(|e| BenchError::Output {
                what: "host target",
                path: p.clone(),
                message: e.to_string(),
            })?;
            f.set_len(end).map_err(|e| BenchError::Output {
                what: "host target",
                path: p.clone(),
                message: e.to_string(),
            })?;
            auto_host = Some(p.clone());
            args.insert(0, TargetArg::Host(p));
        }
    }
    let result = sweep_targets(
        opts,
        &sweep,
        &args,
        unavailable,
        auto_host.as_deref(),
        session.as_ref().map(|s| &s.state),
        &host_manifest,
        &progress,
        session_out,
        out,
    );
    if let Some(p) = &auto_host {
        let _ = std::fs::remove_file(p);
    }
    progress.finish();
    if let Some(s) = session {
        s.close()?;
    }
    result
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Resolves, checks and prepares the targets, then runs the points.
#[allow(clippy::too_many_arguments)]
fn sweep_targets(
    opts: &IoOptions,
    sweep: &Sweep,
    args: &[TargetArg],
    unavailable: Vec<Unavailable>,
    auto_host: Option<&std::path::Path>,
    lab: Option<&vmscope_lab::LabState>,
    host_manifest: &Manifest,
    progress: &Progress,
    session_out: Option<vmscope_store::output::SessionOutput>,
    out: &mut dyn Write,
) -> Result<IoOutcome, BenchError> {
    let end = opts.offset + sweep.sizes.iter().max().copied().unwrap_or(0);
    let writes = sweep.modes.iter().any(|m| m.writes());
    let mut runner = Runner {
        conns: Vec::new(),
        accountant: None,
        probe: LoadProbe::default(),
        drop_caches: opts.drop_caches,
        overhead: Vec::new(),
    };
    let mut targets: Vec<Target> = Vec::new();
    let mut vm_index: Vec<Option<usize>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for a in args {
        if !seen.insert(a.id()) {
            continue;
        }
        progress.set_message(format!("inspecting {}", a.id()));
        let t = match a {
            TargetArg::Host(p) => {
                let info = vmscope_workload::io::inspect(p);
                let path = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
                let facts = target::host_facts(&info);
                Target {
                    id: a.id(),
                    label: "host".to_string(),
                    backend: Backend::Host,
                    place: Place::Host,
                    path,
                    manifest: Arc::new(host_manifest.with(&facts)),
                    info,
                    created: auto_host.is_some_and(|h| h == p.as_path()),
                }
            }
            TargetArg::Vm { vm, device } => {
                let (st, v) = match lab {
                    Some(l) if l.vms.iter().any(|x| &x.name == vm) => {
                        (l.clone(), l.vm(vm).expect("checked").clone())
                    }
                    _ => vmscope_lab::find_vm(&opts.lab_options, None, vm)
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
                // One agent connection per VM, shared by its targets.
                let conn_i = if let Some(i) = runner
                    .conns
                    .iter()
                    .position(|c| c.as_ref().is_some_and(|c| c.vm_name() == vm))
                {
                    i
                } else {
                    runner.conns.push(Some(VmConn::new(&v)));
                    runner.conns.len() - 1
                };
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
                    .inspect(&t, Some(conn_i))
                    .map_err(|e| BenchError::bad(format!("target {}: {e}", a.id())))?;
                vm_index.push(Some(conn_i));
                targets.push(t);
                continue;
            }
        };
        vm_index.push(None);
        targets.push(t);
    }
    // Labels must tell targets apart.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for t in &targets {
        *counts.entry(t.label.clone()).or_default() += 1;
    }
    for t in targets.iter_mut() {
        if counts[&t.label] > 1 {
            t.label = format!("{} {}", t.label, t.path.display());
        }
    }
    // Every check before any I/O.
    for t in &targets {
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
    if opts.account {
        let mut acc = Accountant::new(AccountOptions::default());
        let _ = acc.sample();
        runner.accountant = Some(acc);
    }

    // The points, and their rows' identity.
    let mut results: Vec<PointResult> = Vec::new();
    let mut notes = Vec::new();
    for (ti, t) in targets.iter().enumerate() {
        for &mode in &sweep.modes {
            for &size in &sweep.sizes {
                for &bs in &sweep.block_sizes {
                    if size < bs {
                        continue;
                    }
                    let key = PointKey {
                        target: ti,
                        mode,
                        size,
                        bs,
                    };
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
                    let name = format!("{} {} bs={} size={}", t.id, mode, bs, size);
                    let point = Point::new(
                        "io",
                        name,
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
                    );
                    results.push(PointResult {
                        key,
                        point,
                        samples: Vec::new(),
                        flags: Vec::new(),
                        failed: None,
                        verdict: Verdict::More,
                    });
                }
            }
        }
    }
    if sweep
        .sizes
        .iter()
        .any(|s| sweep.block_sizes.iter().any(|b| s % b != 0 && s > b))
    {
        notes.push("a --size that is not a multiple of a --bs moves size / bs whole blocks".into());
    }

    let mut sink = match opts.format {
        Format::Json => Sink::Json(JsonLines::new(&mut *out)),
        Format::Csv => Sink::Csv(Box::new(CsvRows::new(
            &mut *out,
            &[
                "target", "label", "backend", "mode", "bs", "size", "count", "offset",
            ],
        )?)),
        Format::Table => Sink::None,
    };
    if let Sink::Json(j) = &mut sink {
        for u in &unavailable {
            j.write(&serde_json::json!({"type": "unavailable", "target": u.id, "label": u.label, "reason": u.reason}))?;
        }
    }
    for u in &unavailable {
        progress.note(&format!(
            "unavailable: {} ({}): {}",
            u.id, u.label, u.reason
        ));
    }

    // Fill each target's region once so reads hit real blocks.
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

    // The host CPU of a guest command that moves nothing, per VM, taken
    // off every sample of that VM.
    if runner.accountant.is_some() {
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
    }

    // The interleaved rounds.
    let mut plan = Plan::new(results.len(), opts.warmup, sweep.rule, opts.seed);
    for (i, r) in results.iter().enumerate() {
        if let Some(vm) = targets[r.key.target].vm() {
            if let Some(why) = dead_vms.get(&vm.name) {
                plan.fail(i, why.clone());
            }
        }
    }
    progress.expect_more(plan.remaining_at_least() as u64);
    let mut all_rows: Vec<Row> = Vec::new();
    while let Some(round) = plan.next_round() {
        for (i, step) in round {
            // A stop signal ends the run here; the lab this run started is
            // torn down when `session` is dropped on the way out.
            opts.lab_options
                .cancel
                .check("taking the benchmark's samples")?;
            if plan.failed(i).is_some() {
                continue;
            }
            let key = results[i].key;
            let t = &targets[key.target];
            progress.set_message(format!(
                "round {} {} {} bs {}{}",
                plan.round(),
                t.label,
                key.mode,
                iec(key.bs),
                if step == Step::Warmup {
                    " (warm-up)"
                } else {
                    ""
                }
            ));
            let spec = runner::spec_for(&t.path, key.mode, key.bs, key.size, opts.offset);
            let mut tries = 0;
            let outcome = loop {
                let r = runner.sample(t, vm_index[key.target], &spec);
                match r {
                    Ok(s) if step == Step::Sample => {
                        let mut flag = s.load.busy(&opts.busy);
                        if flag.is_some() && tries < opts.busy_retries {
                            tries += 1;
                            progress.note(&format!(
                                "{}: redone ({})",
                                results[i].point.name,
                                flag.take().unwrap_or_default()
                            ));
                            continue;
                        }
                        if !opts.drop_caches {
                            flag = Some(match flag {
                                Some(f) => format!("{f}; caches not dropped"),
                                None => "caches not dropped".into(),
                            });
                        }
                        break Ok(Some((s, flag)));
                    }
                    Ok(_) => break Ok(None),
                    Err(e) => break Err(e),
                }
            };
            progress.inc();
            match outcome {
                Ok(None) => plan.warmed(i),
                Ok(Some((s, flag))) => {
                    plan.record(i, s.run.bytes_per_s());
                    let n = plan.samples(i).len() as u32;
                    let rows = sample_rows(&results[i].point, n, &s, flag.clone());
                    for r in &rows {
                        match &mut sink {
                            Sink::Json(j) => j.write(r)?,
                            Sink::Csv(c) => c.write(r)?,
                            Sink::None => {}
                        }
                    }
                    all_rows.extend(rows);
                    results[i].samples.push(s);
                    results[i].flags.push(flag);
                }
                Err(VmFailure::Dead(why)) => {
                    // Every remaining point of this VM fails; the sweep goes on.
                    let vm = t.vm().map(|v| v.name.clone()).unwrap_or_default();
                    progress.note(&format!("{why}: its remaining points are marked failed"));
                    for (j, r) in results.iter().enumerate() {
                        if targets[r.key.target].vm().map(|v| &v.name) == Some(&vm) {
                            plan.fail(j, why.clone());
                        }
                    }
                }
                Err(VmFailure::Failed(why)) => {
                    progress.note(&format!("{}: failed: {why}", results[i].point.name));
                    plan.fail(i, why);
                }
            }
            progress.expect_more(plan.remaining_at_least() as u64);
        }
    }
    for (i, r) in results.iter_mut().enumerate() {
        r.failed = plan.failed(i).map(str::to_string);
        r.verdict = plan.verdict(i);
    }

    let findings = if opts.check_paper {
        paper::check(&report::observations(&targets, &results, sweep))
    } else {
        Vec::new()
    };
    let mut outcome = IoOutcome {
        targets,
        unavailable,
        sweep: sweep.clone(),
        results,
        findings,
        charts: Vec::new(),
        notes,
    };
    if let Some(dir) = &opts.charts {
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
    if let Sink::Json(j) = &mut sink {
        report::json_summaries(j, &outcome)?;
    }
    drop(sink);
    match opts.format {
        Format::Json => {}
        Format::Csv => report::stderr_summary(&outcome, opts.quiet),
        Format::Table => report::tables(out, &outcome)?,
    }
    if let Some(output) = session_out {
        crate::session::store_rows(
            output,
            &all_rows,
            &[
                ("command", "bench io".to_string()),
                ("command_line", opts.command_line.clone()),
            ],
        )?;
    }
    Ok(outcome)
}

enum Sink<'a, 'w> {
    None,
    Json(JsonLines<&'a mut (dyn Write + 'w)>),
    Csv(Box<CsvRows<&'a mut (dyn Write + 'w)>>),
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
        assert!(bad(IoOptions {
            repeat: Some(0),
            ..Default::default()
        })
        .contains("--repeat"));
        assert!(bad(IoOptions {
            repeat: Some(5),
            max_repeat: Some(3),
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
            rel_ci: 0.0,
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
