//! `vmscope bench`: the five experiments (one `cmd_bench_*.rs` each turns
//! its own arguments into the library's options) and the arguments they
//! all share, here: how points are sampled, where results go, the lab, the
//! profiled runs. The same flag means the same thing in every experiment,
//! and becomes the same `vmscope_bench::options` struct.

use anyhow::Result;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vmscope_bench::hygiene::BusyRule;
use vmscope_bench::options::{LabChoice, Output, Recording, Sampling};
use vmscope_bench::output::Format;
use vmscope_lab::LabOptions;

#[derive(Args)]
#[command(
    after_help = "Each experiment runs its points in shuffled, interleaved rounds until the 95 % interval is \
within --ci of the mean, redoes samples taken while other load ran, prints a table with units in \
every header, and can keep every row in a session (-o) and profile each point (--record). Paper \
figures and current results: docs/experiments.md and bench/README.md in the source tree.\n\n\
Examples:\n  \
vmscope bench io --check-paper                      giacobbi2011's findings, checked here\n  \
vmscope bench web --lab host,guest-same-cpu --rate 50..300:50\n  \
vmscope bench overhead --lab one-vm                 what profiling costs a VM's workload"
)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Storage I/O, giacobbi2011's method: dd-style sweeps of block size (and
    /// data size) on the host and in lab VMs (file image, raw device, LVM),
    /// with 95 % intervals, the paper's tables and charts, and the host CPU
    /// each backend costs.
    #[command(after_help = crate::cmd_bench_io::HELP)]
    Io(crate::cmd_bench_io::IoArgs),
    /// TCP throughput, menon2005's network experiment: a sendfile() sender and a recv()
    /// receiver between the host and a lab VM (either way) or two VMs, over tap + bridge,
    /// with the receive buffer swept, iperf3 side by side, and the host CPU per Gbit.
    #[command(after_help = crate::cmd_bench_net::HELP)]
    Net(crate::cmd_bench_net::NetArgs),
    /// Web server, menon2005 Fig 7: busybox httpd on the host and in lab VMs serving one
    /// file, httperf offering open-loop load at rising rates until the reply rate stops
    /// following, with errors, latency and host CPU per reply.
    #[command(after_help = crate::cmd_bench_web::HELP)]
    Web(crate::cmd_bench_web::WebArgs),
    /// Scaling, theurer2006's experiment: memwrite or cpu as N host processes, one host
    /// process with N threads, N VMs of one vCPU and one VM of N vCPUs, N = 1..max, with the
    /// scaling factor against N = 1.
    #[command(after_help = crate::cmd_bench_scale::HELP)]
    Scale(crate::cmd_bench_scale::ScaleArgs),
    /// The cost of profiling, theurer2006 Fig 2: one workload on the host or in a lab VM with
    /// no profiler, `vmscope record -a` (VMs passive, then active) and `perf record -a` at the
    /// same frequency; throughput loss of each with its 95 % interval.
    #[command(after_help = crate::cmd_bench_overhead::HELP)]
    Overhead(crate::cmd_bench_overhead::OverheadArgs),
}

pub fn run(a: BenchArgs) -> Result<ExitCode> {
    match a.command {
        BenchCommand::Io(a) => crate::cmd_bench_io::run(a),
        BenchCommand::Net(a) => crate::cmd_bench_net::run(a),
        BenchCommand::Web(a) => crate::cmd_bench_web::run(a),
        BenchCommand::Scale(a) => crate::cmd_bench_scale::run(a),
        BenchCommand::Overhead(a) => crate::cmd_bench_overhead::run(a),
    }
}

/// Runs a benchmark writing to stdout; its exit code: 0, or 1 when
/// points failed (a VM died). Errors (bad input: 2) are the caller's.
pub(crate) fn run_to_stdout(
    run: impl FnOnce(&mut dyn std::io::Write) -> Result<usize, vmscope_bench::BenchError>,
) -> Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let failed = run(&mut out)?;
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// How every point is sampled (every experiment).
#[derive(Args)]
pub struct SamplingArgs {
    /// Samples per point at least, after the warm-up [default: io 5 (--check-paper 3),
    /// others 3].
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,
    /// More samples until the 95 % interval is within --ci of the mean, up to this many
    /// [default: io 20 (--check-paper 6), web 6, others 10].
    #[arg(long, value_name = "N")]
    pub max_repeat: Option<usize>,
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
    pub fn sampling(&self) -> Sampling {
        Sampling {
            repeat: self.repeat,
            max_repeat: self.max_repeat,
            rel_ci: self.ci,
            warmup: self.warmup,
            busy: BusyRule {
                max_other_cpus: self.busy_threshold,
                ..BusyRule::default()
            },
            busy_retries: self.busy_retries,
            seed: self.seed,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum FormatArg {
    Table,
    Json,
    Csv,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Table => Format::Table,
            FormatArg::Json => Format::Json,
            FormatArg::Csv => Format::Csv,
        }
    }
}

/// Where results go (every experiment).
#[derive(Args)]
pub struct OutputArgs {
    /// table: one table with units in every header; json: JSON lines (one per sample and
    /// metric, then a summary per point with n, mean, ci95, cv, min, median, max, then checks
    /// and notes); csv: one line per sample and metric.
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    /// Also store every row in this session file (bench_samples table).
    #[arg(long, short = 'o', value_name = "FILE")]
    session: Option<PathBuf>,
    /// Let -o, --record and the charts replace files vmscope did not write (never a
    /// device, FIFO or directory).
    #[arg(long)]
    force: bool,
    /// No progress bar or notes on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// Charts (every experiment that draws one).
#[derive(Args)]
pub struct ChartArgs {
    /// Directory for the charts (SVG and PNG) [default: vmscope-bench-EXPERIMENT].
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Write no charts.
    #[arg(long)]
    no_charts: bool,
}

impl OutputArgs {
    /// The library's output options; `charts` as [`ChartArgs::dir`] gives.
    pub fn output(&self, charts: Option<PathBuf>) -> Output {
        Output {
            format: self.format.into(),
            charts,
            session: self.session.clone(),
            force: self.force,
            quiet: self.quiet,
            command_line: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }

    pub fn quiet(&self) -> bool {
        self.quiet
    }
}

impl ChartArgs {
    /// The chart directory of `experiment`, or none with --no-charts.
    pub fn dir(&self, experiment: &str) -> Option<PathBuf> {
        (!self.no_charts).then(|| {
            self.out_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("vmscope-bench-{experiment}")))
        })
    }
}

/// The lab a run brings up or reuses, and where labs live (every
/// experiment; `--lab` is documented per experiment in its help).
#[derive(Args)]
pub struct LabArgs {
    /// A lab spec file or a built-in lab (`vmscope lab up --help` lists them) to bring up
    /// for the run and tear down after; a lab that is already up is reused and left up.
    #[arg(long, value_name = "SPEC")]
    pub lab: Option<String>,
    /// Run the --lab spec under this lab name (bench web: a prefix, NAME-SPECNAME).
    #[arg(long, value_name = "NAME")]
    pub lab_name: Option<String>,
    /// Leave the lab this run brought up running.
    #[arg(long)]
    pub keep_lab: bool,
    /// Lab run directories [env: VMSCOPE_RUN, default /run/vmscope/labs].
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Lab image and KVM-probe cache [env: VMSCOPE_CACHE, default /var/cache/vmscope].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Seconds each lab VM may take to answer the agent hello.
    #[arg(long, default_value_t = 90, value_name = "SECS")]
    pub hello_timeout: u64,
}

impl LabArgs {
    /// The library's lab choice. Ctrl-C, SIGTERM or SIGHUP stop the
    /// benchmark between samples (or the lab's start-up); a lab the run
    /// brought up is torn down on the way out, and the exit code is 128 +
    /// the signal.
    pub fn choice(&self, quiet: bool) -> LabChoice {
        let mut options = LabOptions::default();
        if let Some(d) = &self.run_dir {
            options.run_root = d.clone();
        }
        if let Some(d) = &self.cache_dir {
            options.cache_dir = d.clone();
        }
        options.hello_timeout = Duration::from_secs(self.hello_timeout);
        options.cancel = vmscope_lab::Cancel::from_flag(crate::signals::install());
        options.verbose = !quiet;
        LabChoice {
            spec: self.lab.clone(),
            name: self.lab_name.clone(),
            options,
            keep: self.keep_lab,
        }
    }
}

/// Profiled points (every experiment).
#[derive(Args)]
pub struct RecordingArgs {
    /// After its samples, run each point once more under `vmscope record -a` (VMs active),
    /// storing DIR/EXPERIMENT-N.db (web: DIR/web-CONFIG-RATE-1.db; overhead: every profiled
    /// sample as DIR/overhead-PROFILER-N.db) annotated with the point.
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// Sampling frequency of --record, Hz (overhead: --freq).
    #[arg(long, default_value_t = 999, value_name = "HZ")]
    pub record_freq: u64,
}

impl RecordingArgs {
    pub fn recording(&self) -> Result<Recording> {
        Ok(Recording {
            dir: self.record.clone(),
            freq: self.record_freq,
            vmscope: std::env::current_exe()?,
        })
    }
}

/// The arguments every experiment takes alike, flattened into each.
#[derive(Args)]
pub struct CommonArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub lab: LabArgs,
    #[command(flatten)]
    pub recording: RecordingArgs,
}

/// Each part of a comma-separated list through `parse`, a bad one named
/// with its flag.
pub(crate) fn list<T>(
    flag: &str,
    s: &str,
    parse: impl Fn(&str) -> Option<T>,
    valid: &str,
) -> Result<Vec<T>> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| parse(x).ok_or_else(|| anyhow::anyhow!("{flag}: unknown value `{x}` ({valid})")))
        .collect()
}
