//! `vmscope bench overhead`: turns arguments into `OverheadOptions` and
//! calls `vmscope_bench::overhead` (theurer2006 Fig 2: what profiling
//! costs).

use crate::cmd_bench::{list, CommonArgs};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_bench::overhead::OverheadOptions;
use vmscope_bench::profiler::Kind;
use vmscope_workload::scale::Workload;

pub const HELP: &str = "\
Profilers: none; host-only (vmscope record -a, every VM passive: the host's rings); active (vmscope
record -a, every VM active: host rings plus each guest's agent sampling inside); perf (perf record -a).
All at --freq. The loss is 1 - throughput / throughput with none, its interval from both points'
intervals. In a VM the workload starts detached and begins once the profiler samples (the bench
tells it through the VM's broker); where it cannot be told, it begins --delay seconds after it was
started and a profiler slower to start than that flags the sample. Its result is read back after the
profiler stops. Under TCG the guest's sampling interrupts are emulated in software; the output
says so. Exit status: 0, 1 when points failed, 2 on bad input.

Examples:
  vmscope bench overhead                  cpu on the host: none, host-only, active, perf at 1000 Hz
  vmscope bench overhead --lab one-vm     in the first VM of a lab it brings up and tears down
  vmscope bench overhead --profilers none,active --freq 4000";

#[derive(Args)]
pub struct OverheadArgs {
    /// memwrite or cpu (the engines of bench scale).
    #[arg(long, default_value = "cpu", value_name = "WORKLOAD")]
    workload: String,
    /// Run the workload in this lab VM instead of on the host [default with --lab: its first
    /// VM].
    #[arg(long, value_name = "NAME")]
    vm: Option<String>,
    /// Threads of the workload.
    #[arg(long, default_value_t = 1, value_name = "N")]
    threads: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    seconds: f64,
    /// In a VM: the longest wait between starting the workload and its first instruction
    /// (it begins as soon as the profiler samples, when the bench can tell it so).
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
    /// Where the profiled runs' sessions and perf.data files go (reused run after run).
    #[arg(
        long,
        alias = "out-dir",
        default_value = "vmscope-bench-overhead",
        value_name = "DIR"
    )]
    work_dir: PathBuf,
    #[command(flatten)]
    common: CommonArgs,
}

pub fn run(a: OverheadArgs) -> Result<ExitCode> {
    let c = &a.common;
    let workload = Workload::parse(&a.workload).ok_or_else(|| {
        anyhow::anyhow!(
            "--workload: unknown workload `{}` (memwrite, cpu)",
            a.workload
        )
    })?;
    let kinds = list(
        "--profilers",
        &a.profilers,
        Kind::parse,
        "none, host-only, active, perf",
    )?;
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
        work_dir: a.work_dir,
        sampling: c.sampling.sampling(),
        output: c.output.output(None),
        lab: c.lab.choice(c.output.quiet()),
        record: c.recording.recording()?,
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::overhead::run(&opts, out).map(|o| o.failed_points())
    })
}
