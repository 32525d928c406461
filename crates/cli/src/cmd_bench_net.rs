//! `vmscope bench net`, `bench scale` and `bench overhead`: turn arguments
//! into `NetOptions`, `ScaleOptions`, `OverheadOptions` and call
//! `vmscope_bench::{net, scale, overhead}`.

use crate::cmd_bench::{FormatArg, LabDirArgs};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_bench::hygiene::BusyRule;
use vmscope_bench::net::NetOptions;
use vmscope_bench::units::parse_size_list;
use vmscope_lab::LabOptions;

/// How every point is sampled: the options `bench net`, `scale` and
/// `overhead` share, with the same defaults.
#[derive(Args)]
pub struct SamplingArgs {
    /// Samples per point at least, after the warm-up.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeat: usize,
    /// More samples until the 95 % interval is within --ci of the mean, up to this many.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub max_repeat: usize,
    /// Target half-width of the 95 % interval, as a fraction of the mean.
    #[arg(long, default_value_t = 0.05, value_name = "FRACTION")]
    pub ci: f64,
    /// Discarded runs per point before its samples.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub warmup: usize,
    /// A sample with more than this many CPUs of other load (from /proc/stat) is redone.
    #[arg(long, default_value_t = 0.25, value_name = "CPUS")]
    pub busy_threshold: f64,
    /// Redo a busy sample this many times, then keep it flagged.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub busy_retries: usize,
    /// Seed of the shuffled round order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The busy-host rule of `--busy-threshold`.
    pub fn busy(&self) -> BusyRule {
        busy_rule(self.busy_threshold)
    }
}

/// A sample with more than `max_other_cpus` CPUs of other load is busy.
pub fn busy_rule(max_other_cpus: f64) -> BusyRule {
    BusyRule {
        max_other_cpus,
        ..BusyRule::default()
    }
}

/// Profiled points: the options of every bench command that can record a
/// session during each point.
#[derive(Args)]
pub struct RecordArgs {
    /// After its samples, run each point once more under `vmscope record -a` (VMs active),
    /// storing DIR/EXPERIMENT-N.db (web: DIR/web-CONFIG-RATE-1.db) annotated with the point (its name is in the results).
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// Sampling frequency of --record, Hz.
    #[arg(long, default_value_t = 999, value_name = "HZ")]
    pub record_freq: u64,
}

pub const NET_HELP: &str = "\
Examples:
  vmscope bench net --lab guest-same-cpu              host->guest0 and guest0->host, receive buffers 1K..256K,
                                                      iperf3 beside the engine on each path
  vmscope bench net --lab guest-separate-cpu --recv-buf 4k,64k --seconds 5
  vmscope bench net --path host:guest0 --path vm1:vm2 --streams 4     VMs of running labs

A path is SENDER:RECEIVER, each `host` or the name of a lab VM with a tap NIC (user networking
cannot carry the test). The engine's sender sendfile()s a cached 64 KiB file over --streams TCP
connections for --seconds; its receiver recv()s into a user buffer of each --recv-buf size
(menon2005 Figs 1-2). iperf3 -Z -l 64K -J runs on every path too (copied into guests), and the
engine at 64 KiB is compared with it (within 10 %: a yes/no line).
Throughput is printed in Mbit/s (10^6 bits/s); rows store bytes/s. Host CPU per Gbit is the CPU time
the run cost the host (this process and its children, the VMs' QEMUs, kernel threads; other
programs' load only flags a sample as busy) over 10^9 bits moved; with the accountant each VM's vCPU time
and I/O charge (QEMU's I/O threads plus its share of network softirqs) are read around each sample.
Under TCG (no KVM) every guest instruction is emulated: absolute numbers are low, and the output
says so. Exit status: 0, 1 when points failed (a VM died), 2 on bad input.";

#[derive(Args)]
pub struct NetArgs {
    /// SENDER:RECEIVER, each `host` or a lab VM name (repeatable) [default: with --lab, every
    /// tap VM to and from the host, and the first two tap VMs to each other].
    #[arg(long = "path", value_name = "SENDER:RECEIVER")]
    paths: Vec<String>,
    /// Receive buffers: a power-of-two range A..B and/or a list.
    #[arg(long, default_value = vmscope_bench::net::DEFAULT_RECV_BUF, value_name = "SIZES")]
    recv_buf: String,
    /// TCP connections per run.
    #[arg(long, default_value_t = 1, value_name = "N")]
    streams: u32,
    /// Seconds the sender sends per run.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    seconds: f64,
    /// TCP port the receivers listen on.
    #[arg(long, default_value_t = 5301)]
    port: u16,
    /// Do not run iperf3 beside the engine.
    #[arg(long)]
    no_peer: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Bring up this lab (spec file, or built-in guest-same-cpu, guest-separate-cpu), tear it
    /// down after. A lab that is already up is reused and left up.
    #[arg(long, value_name = "SPEC")]
    lab: Option<String>,
    /// Run the --lab spec under this lab name.
    #[arg(long, value_name = "NAME")]
    lab_name: Option<String>,
    /// Leave the lab that --lab brought up running.
    #[arg(long)]
    keep_lab: bool,
    #[command(flatten)]
    lab_dirs: LabDirArgs,
    /// table: one line per point with units; json: JSON lines (one per sample and metric,
    /// then summaries, checks, notes); csv: one line per sample and metric.
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    /// Directory for the chart (throughput vs receive buffer per path, SVG and PNG).
    #[arg(long, default_value = "vmscope-bench-net", value_name = "DIR")]
    out_dir: PathBuf,
    /// Write no charts.
    #[arg(long)]
    no_charts: bool,
    /// Also store every row in this session file (bench_samples table).
    #[arg(long, short = 'o', value_name = "FILE")]
    session: Option<PathBuf>,
    #[command(flatten)]
    record: RecordArgs,
    /// Do not run the accountant (no per-VM vCPU and I/O charge).
    #[arg(long)]
    no_account: bool,
    /// No progress bar or notes on stderr.
    #[arg(long, short)]
    quiet: bool,
}

pub fn net(a: NetArgs) -> Result<ExitCode> {
    let lab = crate::cmd_bench::lab_dirs_options(a.lab_dirs, a.quiet);
    let opts = NetOptions {
        paths: a.paths,
        recv_bufs: parse_size_list(&a.recv_buf, "--recv-buf").map_err(anyhow::Error::msg)?,
        streams: a.streams,
        seconds: a.seconds,
        port: a.port,
        peer: !a.no_peer,
        repeat: a.sampling.repeat,
        max_repeat: a.sampling.max_repeat,
        rel_ci: a.sampling.ci,
        warmup: a.sampling.warmup,
        lab: a.lab,
        lab_name: a.lab_name,
        lab_options: lab,
        keep_lab: a.keep_lab,
        format: a.format.into(),
        charts: (!a.no_charts).then_some(a.out_dir),
        session: a.session,
        record: a.record.record,
        record_freq: a.record.record_freq,
        vmscope: std::env::current_exe()?,
        account: !a.no_account,
        busy: a.sampling.busy(),
        busy_retries: a.sampling.busy_retries,
        seed: a.sampling.seed,
        quiet: a.quiet,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::net::run(&opts, out).map(|o| o.failed_points())
    })
}

pub const SCALE_HELP: &str = "\
Examples:
  vmscope bench scale                                 cpu, the four modes, N = 1..host CPUs, on a generated lab
  vmscope bench scale --workload memwrite --size 64M --max 2 --mode host-threads,vms
  vmscope bench scale --mode host-procs,host-threads  the host alone (no lab)

Modes (theurer2006 §4): host-procs (N processes of vmscope-agent scale), host-threads (this process,
N threads), vms (N lab VMs of one pinned vCPU each), vcpus (one lab VM of N vCPUs, N threads).
Without --lab, the VM modes bring up a generated lab (VMs s0..s{max-1} and big) named by --lab-name
(default scale). Throughput is the sum of every process's (VM's) work rate: GiB/s written for
memwrite, millions of iterations/s for cpu; rows store bytes/s or iterations/s. The scaling factor is
a mode's throughput over its own N = 1. Under TCG the VM modes' absolute numbers are far below the
host's; their scaling factors still compare. Exit status: 0, 1 when points failed, 2 on bad input.";

#[derive(Args)]
pub struct ScaleArgs {
    /// memwrite (writes a buffer per thread, pass after pass) or cpu (a register-only chain).
    #[arg(long, default_value = "cpu", value_name = "WORKLOAD")]
    workload: String,
    /// Modes, comma-separated: host-procs, host-threads, vms, vcpus [default: all four].
    #[arg(long, value_name = "MODES")]
    mode: Option<String>,
    /// Largest N [default: the host's CPUs].
    #[arg(long, value_name = "N")]
    max: Option<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    seconds: f64,
    /// memwrite: buffer per thread (k, M, G are powers of 1024).
    #[arg(long, default_value = "32M", value_name = "BYTES")]
    size: String,
    #[command(flatten)]
    record: RecordArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// A lab spec (file, or built-in scale-vms, scale-vcpus) instead of the generated one.
    #[arg(long, value_name = "SPEC")]
    lab: Option<String>,
    /// The lab's name (the generated lab's, or the --lab spec run under this name).
    #[arg(long, value_name = "NAME")]
    lab_name: Option<String>,
    /// Leave the lab this run brought up running.
    #[arg(long)]
    keep_lab: bool,
    #[command(flatten)]
    lab_dirs: LabDirArgs,
    /// The vmscope-agent binary host-procs runs [default: $VMSCOPE_AGENT, or the installed one].
    #[arg(long, value_name = "FILE")]
    agent: Option<PathBuf>,
    /// table, json (JSON lines) or csv.
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    /// Directory for the chart (scaling factor vs N per mode, SVG and PNG).
    #[arg(long, default_value = "vmscope-bench-scale", value_name = "DIR")]
    out_dir: PathBuf,
    /// Write no charts.
    #[arg(long)]
    no_charts: bool,
    /// Also store every row in this session file (bench_samples table).
    #[arg(long, short = 'o', value_name = "FILE")]
    session: Option<PathBuf>,
    /// No progress bar or notes on stderr.
    #[arg(long, short)]
    quiet: bool,
}

pub fn scale(a: ScaleArgs) -> Result<ExitCode> {
    use vmscope_bench::scale::{Mode, ScaleOptions};
    use vmscope_workload::scale::Workload;
    let lab = crate::cmd_bench::lab_dirs_options(a.lab_dirs, a.quiet);
    let workload = Workload::parse(&a.workload).ok_or_else(|| {
        anyhow::anyhow!(
            "--workload: unknown workload `{}` (memwrite, cpu)",
            a.workload
        )
    })?;
    let modes = match &a.mode {
        None => Mode::ALL.to_vec(),
        Some(s) => s
            .split(',')
            .map(|m| {
                Mode::parse(m.trim()).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--mode: unknown mode `{m}` (host-procs, host-threads, vms, vcpus)"
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let agent = match a.agent {
        Some(p) => p,
        None => vmscope_lab::image::find_agent(None).unwrap_or_else(|_| "vmscope-agent".into()),
    };
    let opts = ScaleOptions {
        workload,
        modes,
        max: a.max.unwrap_or(ScaleOptions::default().max),
        seconds: a.seconds,
        buffer: vmscope_bench::units::parse_size(&a.size)
            .map_err(|e| anyhow::anyhow!("--size: {e}"))?,
        repeat: a.sampling.repeat,
        max_repeat: a.sampling.max_repeat,
        rel_ci: a.sampling.ci,
        warmup: a.sampling.warmup,
        lab: a.lab,
        lab_name: a.lab_name,
        lab_options: lab,
        keep_lab: a.keep_lab,
        agent,
        record: a.record.record,
        record_freq: a.record.record_freq,
        vmscope: std::env::current_exe()?,
        format: a.format.into(),
        charts: (!a.no_charts).then_some(a.out_dir),
        session: a.session,
        busy: a.sampling.busy(),
        busy_retries: a.sampling.busy_retries,
        seed: a.sampling.seed,
        quiet: a.quiet,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::scale::run(&opts, out).map(|o| o.failed_points())
    })
}

pub const OVERHEAD_HELP: &str = "\
Examples:
  vmscope bench overhead                              cpu on the host: none, host-only, active, perf at 1000 Hz
  vmscope bench overhead --vm guest0 --seconds 8      the workload in a lab VM (its agent runs it)
  vmscope bench overhead --profilers none,active --freq 4000

Profilers: none; host-only (vmscope record -a, every VM passive: the host's rings); active (vmscope
record -a, every VM active: host rings plus each guest's agent sampling inside); perf (perf record -a).
All at --freq. The loss is 1 - throughput / throughput with none, its interval from both points'
intervals. In a VM the workload starts detached after --delay seconds (the recorder holds the VM's
agent channel while it runs) and its result is read back after; a profiler slower to start than the
delay flags the sample. Under TCG the guest's sampling interrupts are emulated in software; the output
says so. Exit status: 0, 1 when points failed, 2 on bad input.";

#[derive(Args)]
pub struct OverheadArgs {
    /// memwrite or cpu (the engines of bench scale).
    #[arg(long, default_value = "cpu", value_name = "WORKLOAD")]
    workload: String,
    /// Run the workload in this lab VM instead of on the host.
    #[arg(long, value_name = "NAME")]
    vm: Option<String>,
    /// Threads of the workload.
    #[arg(long, default_value_t = 1, value_name = "N")]
    threads: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    seconds: f64,
    /// In a VM: seconds between starting the workload and its first instruction (the
    /// profiler starts meanwhile).
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    delay: f64,
    /// memwrite: buffer per thread.
    #[arg(long, default_value = "32M", value_name = "BYTES")]
    size: String,
    /// Profilers, comma-separated, none among them: none, host-only, active, perf.
    #[arg(
        long,
        default_value = "none,host-only,active,perf",
        value_name = "LIST"
    )]
    profilers: String,
    /// Sampling frequency of every profiler, Hz.
    #[arg(long, short = 'F', default_value_t = 1000, value_name = "HZ")]
    freq: u64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Lab run directories [env: VMSCOPE_RUN, default /run/vmscope/labs].
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Where the profiled runs' sessions and perf.data files go (reused run after run).
    #[arg(long, default_value = "vmscope-bench-overhead", value_name = "DIR")]
    out_dir: PathBuf,
    /// Keep every sample's profiled run in DIR as overhead-PROFILER-N.db (perf: .data),
    /// annotated with its point and named in the results (`vmscope compare` reads them).
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Replace files of those names in the --record and --out-dir directories that
    /// vmscope did not write (its own earlier runs are replaced without it).
    #[arg(long)]
    force: bool,
    /// table, json (JSON lines) or csv.
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    /// Also store every row in this session file (bench_samples table).
    #[arg(long, short = 'o', value_name = "FILE")]
    session: Option<PathBuf>,
    /// No progress bar or notes on stderr.
    #[arg(long, short)]
    quiet: bool,
}

pub fn overhead(a: OverheadArgs) -> Result<ExitCode> {
    use vmscope_bench::overhead::OverheadOptions;
    use vmscope_bench::profiler::Kind;
    use vmscope_workload::scale::Workload;
    let lab = crate::cmd_bench::lab_options(
        a.run_dir,
        None,
        LabOptions::default().hello_timeout.as_secs(),
        a.quiet,
    );
    let workload = Workload::parse(&a.workload).ok_or_else(|| {
        anyhow::anyhow!(
            "--workload: unknown workload `{}` (memwrite, cpu)",
            a.workload
        )
    })?;
    let kinds = a
        .profilers
        .split(',')
        .map(|k| {
            Kind::parse(k.trim()).ok_or_else(|| {
                anyhow::anyhow!(
                    "--profilers: unknown profiler `{k}` (none, host-only, active, perf)"
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for (i, k) in kinds.iter().enumerate() {
        if kinds[..i].contains(k) {
            anyhow::bail!(
                "--profilers: `{}` is given twice; name each profiler once (none is the baseline every other is set against)",
                k.name()
            );
        }
    }
    let opts = OverheadOptions {
        workload,
        vm: a.vm,
        threads: a.threads,
        seconds: a.seconds,
        delay: a.delay,
        buffer: vmscope_bench::units::parse_size(&a.size)
            .map_err(|e| anyhow::anyhow!("--size: {e}"))?,
        kinds,
        freq: a.freq,
        repeat: a.sampling.repeat,
        max_repeat: a.sampling.max_repeat,
        rel_ci: a.sampling.ci,
        warmup: a.sampling.warmup,
        lab_options: lab,
        vmscope: std::env::current_exe()?,
        work_dir: a.out_dir,
        record: a.record,
        force: a.force,
        format: a.format.into(),
        session: a.session,
        busy: a.sampling.busy(),
        busy_retries: a.sampling.busy_retries,
        seed: a.sampling.seed,
        quiet: a.quiet,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::overhead::run(&opts, out).map(|o| o.failed_points())
    })
}
