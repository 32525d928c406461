//! `vmscope bench`: benchmarks with sound statistics. `bench io` is
//! giacobbi2011's storage method (see `vmscope_bench::io`); this module
//! only turns arguments into `IoOptions` and calls the library.

use anyhow::Result;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vmscope_bench::io::{IoOptions, TargetArg};
use vmscope_bench::output::Format;
use vmscope_bench::units::{parse_size, parse_size_list};
use vmscope_lab::LabOptions;
use vmscope_workload::io::Mode;

#[derive(Args)]
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
    #[command(after_help = IO_HELP)]
    Io(IoArgs),
    /// TCP throughput, menon2005's network experiment: a sendfile() sender and a recv()
    /// receiver between the host and a lab VM (either way) or two VMs, over tap + bridge,
    /// with the receive buffer swept, iperf3 side by side, and the host CPU per Gbit.
    #[command(after_help = crate::cmd_bench_net::NET_HELP)]
    Net(crate::cmd_bench_net::NetArgs),
    /// Web server, menon2005 Fig 7: busybox httpd on the host and in lab VMs serving one
    /// file, httperf offering open-loop load at rising rates until the reply rate stops
    /// following, with errors, latency and host CPU per reply.
    #[command(after_help = crate::cmd_bench_web::WEB_HELP)]
    Web(crate::cmd_bench_web::WebArgs),
    /// Scaling, theurer2006's experiment: memwrite or cpu as N host processes, one host
    /// process with N threads, N VMs of one vCPU and one VM of N vCPUs, N = 1..max, with the
    /// scaling factor against N = 1.
    #[command(after_help = crate::cmd_bench_net::SCALE_HELP)]
    Scale(crate::cmd_bench_net::ScaleArgs),
    /// The cost of profiling, theurer2006 Fig 2: one workload on the host or in a lab VM with
    /// no profiler, `vmscope record -a` (VMs passive, then active) and `perf record -a` at the
    /// same frequency; throughput loss of each with its 95 % interval.
    #[command(after_help = crate::cmd_bench_net::OVERHEAD_HELP)]
    Overhead(crate::cmd_bench_net::OverheadArgs),
}

const IO_HELP: &str = "\
Examples:
  vmscope bench io --lab storage-quad                 the paper's four machines (host, VM on a raw and a qcow2
                                                      file image, on a raw device; LVM where device-mapper works)
  vmscope bench io --target host:/var/tmp/disk.img --bs 4k..1M --size 256M --mode direct-read
  vmscope bench io --target vm:io0:/dev/vdb --size 1M..1G --bs 1M      data-size sweep (Experiment 2)
  vmscope bench io --check-paper                      a short run that checks the paper's findings here

Sizes: k, M, G are powers of 1024 (as dd); kB, MB, GB powers of 1000. Speeds are printed in MiB/s
(2^20 bytes/s) and MB/s (10^6 bytes/s); rows (JSON, CSV, sessions) store bytes/s.
Every sample drops the host's and the guest's page cache (root), is redone when other load shows in
/proc/stat (then kept, flagged), and runs the accountant for the host CPU per GiB.
Safety: a target must exist, hold no mounted file system, be large enough and take the block sizes
with O_DIRECT; a device or file with a partition table or file system signature is written only if
--force-destroy-data names it. Exit status: 0, 1 when points failed (a VM died), 2 on bad input.";

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum FormatArg {
    Table,
    Json,
    Csv,
}

#[derive(Args)]
struct IoArgs {
    /// Where to run: host:PATH (an existing file or block device) or vm:NAME:DEVICE (a disk
    /// in a lab VM, e.g. vm:io0:/dev/vdb). Repeatable.
    #[arg(long = "target", short = 't', value_name = "TARGET")]
    targets: Vec<String>,
    /// Block sizes: a power-of-two range A..B and/or a list [default: 512..1M; --check-paper:
    /// 4k,16k,64k,256k,1M].
    #[arg(long, value_name = "SIZES")]
    bs: Option<String>,
    /// Data size per run, or a power-of-two sweep such as 1M..16G (Experiment 2)
    /// [default: 1G; --check-paper: 32M].
    #[arg(long, value_name = "SIZES")]
    size: Option<String>,
    /// Modes, comma-separated: buffered-write (with final fdatasync, the paper's),
    /// buffered-write-nosync, direct-write, direct-read, buffered-read
    /// [default: buffered-write,direct-write,direct-read].
    #[arg(long, value_name = "MODES")]
    mode: Option<String>,
    /// Samples per point at least, after the warm-up [default: 5; --check-paper: 3].
    #[arg(long, value_name = "N")]
    repeat: Option<usize>,
    /// More samples until the 95 % interval is within --ci of the mean, up to this many
    /// [default: 20; --check-paper: 6].
    #[arg(long, value_name = "N")]
    max_repeat: Option<usize>,
    /// Target half-width of the 95 % interval, as a fraction of the mean.
    #[arg(long, default_value_t = 0.05, value_name = "FRACTION")]
    ci: f64,
    /// Discarded runs per point before its samples.
    #[arg(long, default_value_t = 1, value_name = "N")]
    warmup: usize,
    /// Byte offset of every run in its target (suffixes as --size).
    #[arg(long, default_value = "0", value_name = "BYTES")]
    offset: String,
    /// Bring up this lab (spec file, or the built-in `storage-quad`), measure every disk of
    /// its VMs (and a host file beside their images), tear it down after. A lab that is
    /// already up is reused and left up.
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
    /// table: giacobbi's Table 1 per target; json: JSON lines (one per sample and metric,
    /// then summaries); csv: one line per sample and metric.
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    /// Directory for the charts (speed vs block size per mode, SVG and PNG).
    #[arg(long, default_value = "vmscope-bench-io", value_name = "DIR")]
    out_dir: PathBuf,
    /// Write no charts.
    #[arg(long)]
    no_charts: bool,
    /// Also store every row in this session file (bench_samples table).
    #[arg(long, short = 'o', value_name = "FILE")]
    session: Option<PathBuf>,
    /// Let -o replace a regular file that is not a vmscope session (never a
    /// device, FIFO or directory).
    #[arg(long, requires = "session")]
    force: bool,
    /// Check giacobbi2011's findings on this machine (one yes/no line each); alone, a
    /// short run on the built-in storage-quad lab.
    #[arg(long)]
    check_paper: bool,
    /// Allow writing to this target although it holds a partition table or a file system
    /// signature (its data is lost). Give the target (host:PATH, vm:NAME:DEVICE) or the path.
    #[arg(long, value_name = "DEVICE")]
    force_destroy_data: Vec<String>,
    /// Do not run the accountant (no host CPU per GiB).
    #[arg(long)]
    no_account: bool,
    /// A sample with more than this many CPUs of other load (from /proc/stat) is redone.
    #[arg(long, default_value_t = 0.25, value_name = "CPUS")]
    busy_threshold: f64,
    /// Redo a busy sample this many times, then keep it flagged.
    #[arg(long, default_value_t = 2, value_name = "N")]
    busy_retries: usize,
    /// Do not drop the caches before each sample (every sample is flagged).
    #[arg(long)]
    no_drop_caches: bool,
    /// Seed of the shuffled round order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// No progress bar or notes on stderr.
    #[arg(long, short)]
    quiet: bool,
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

// Lists, sizes and targets are parsed here rather than by clap's value
// parsers, so a bad one is the usual single `vmscope: error:` line.

fn mode_list(s: &str) -> Result<Vec<Mode>, String> {
    s.split(',')
        .map(|m| {
            Mode::parse(m.trim()).ok_or_else(|| {
                format!(
                    "--mode: unknown mode `{m}` (one of {})",
                    Mode::ALL.map(Mode::name).join(", ")
                )
            })
        })
        .collect()
}

pub fn run(a: BenchArgs) -> Result<ExitCode> {
    match a.command {
        BenchCommand::Io(a) => io(a),
        BenchCommand::Net(a) => crate::cmd_bench_net::net(a),
        BenchCommand::Web(a) => crate::cmd_bench_web::web(a),
        BenchCommand::Scale(a) => crate::cmd_bench_net::scale(a),
        BenchCommand::Overhead(a) => crate::cmd_bench_net::overhead(a),
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

/// Where labs live and how long their agents may take: the options of
/// every benchmark that brings up or finds lab VMs.
#[derive(Args)]
pub struct LabDirArgs {
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

/// [`lab_options`] from [`LabDirArgs`].
pub(crate) fn lab_dirs_options(d: LabDirArgs, quiet: bool) -> LabOptions {
    lab_options(d.run_dir, d.cache_dir, d.hello_timeout, quiet)
}

/// The lab options every benchmark takes (`--run-dir`, `--cache-dir`,
/// `--hello-timeout`, `--quiet`). Ctrl-C, SIGTERM or SIGHUP stop the
/// benchmark between samples (or the lab's start-up); a lab the run brought
/// up is torn down on the way out, and the exit code is 128 + the signal.
pub(crate) fn lab_options(
    run_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    hello_timeout: u64,
    quiet: bool,
) -> LabOptions {
    let mut lab = LabOptions::default();
    if let Some(d) = run_dir {
        lab.run_root = d;
    }
    if let Some(d) = cache_dir {
        lab.cache_dir = d;
    }
    lab.hello_timeout = Duration::from_secs(hello_timeout);
    lab.cancel = vmscope_lab::Cancel::from_flag(crate::signals::install());
    lab.verbose = !quiet;
    lab
}

fn io(a: IoArgs) -> Result<ExitCode> {
    let lab = lab_dirs_options(a.lab_dirs, a.quiet);
    let opts = IoOptions {
        targets: a
            .targets
            .iter()
            .map(|t| TargetArg::parse(t))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?,
        block_sizes: a
            .bs
            .map(|s| parse_size_list(&s, "--bs"))
            .transpose()
            .map_err(anyhow::Error::msg)?,
        sizes: a
            .size
            .map(|s| parse_size_list(&s, "--size"))
            .transpose()
            .map_err(anyhow::Error::msg)?,
        modes: a
            .mode
            .map(|s| mode_list(&s))
            .transpose()
            .map_err(anyhow::Error::msg)?,
        repeat: a.repeat,
        max_repeat: a.max_repeat,
        rel_ci: a.ci,
        warmup: a.warmup,
        offset: parse_size(&a.offset).map_err(|e| anyhow::anyhow!("--offset: {e}"))?,
        lab: a.lab,
        lab_name: a.lab_name,
        lab_options: lab,
        keep_lab: a.keep_lab,
        format: a.format.into(),
        charts: (!a.no_charts).then_some(a.out_dir),
        session: a.session,
        force: a.force,
        check_paper: a.check_paper,
        force_destroy: a.force_destroy_data,
        account: !a.no_account,
        busy: crate::cmd_bench_net::busy_rule(a.busy_threshold),
        busy_retries: a.busy_retries,
        drop_caches: !a.no_drop_caches,
        seed: a.seed,
        quiet: a.quiet,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    run_to_stdout(|out| vmscope_bench::io::run(&opts, out).map(|o| o.failed_points()))
}
