//! `vmscope bench scale`: turns arguments into `ScaleOptions` and calls
//! `vmscope_bench::scale` (theurer2006's scaling experiment).

use crate::cmd_bench::{list, ChartArgs, CommonArgs};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_bench::scale::{Mode, ScaleOptions};
use vmscope_workload::scale::Workload;

pub const HELP: &str = "\
Modes (theurer2006 §4): host-procs (N processes of vmscope-agent scale), host-threads (this process,
N threads), vms (N lab VMs of one pinned vCPU each), vcpus (one lab VM of N vCPUs, N threads).
Without --lab (a spec file, or built-in scale-vms, scale-vcpus), the VM modes bring up a generated
lab (VMs s0..s{max-1} and big) named by --lab-name (default scale). Throughput is the sum of every
process's (VM's) work rate: GiB/s written for memwrite, millions of iterations/s for cpu; rows store
bytes/s or iterations/s. The scaling factor is a mode's throughput over its own N = 1. Under TCG the
VM modes' absolute numbers are far below the host's; their scaling factors still compare. Exit
status: 0, 1 when points failed, 2 on bad input.

Examples:
  vmscope bench scale                     cpu, the four modes, N = 1..host CPUs, on a generated lab
  vmscope bench scale --mode host-procs,host-threads    the host alone (no lab)
  vmscope bench scale --workload memwrite --size 64M --max 2 --mode host-threads,vms";

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
    /// The vmscope-agent binary host-procs runs [default: $VMSCOPE_AGENT, or the installed one].
    #[arg(long, value_name = "FILE")]
    agent: Option<PathBuf>,
    #[command(flatten)]
    charts: ChartArgs,
    #[command(flatten)]
    common: CommonArgs,
}

pub fn run(a: ScaleArgs) -> Result<ExitCode> {
    let c = &a.common;
    let workload = Workload::parse(&a.workload).ok_or_else(|| {
        anyhow::anyhow!(
            "--workload: unknown workload `{}` (memwrite, cpu)",
            a.workload
        )
    })?;
    let modes = match &a.mode {
        None => Mode::ALL.to_vec(),
        Some(s) => list(
            "--mode",
            s,
            Mode::parse,
            "host-procs, host-threads, vms, vcpus",
        )?,
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
        agent,
        sampling: c.sampling.sampling(),
        output: c.output.output(a.charts.dir("scale")),
        lab: c.lab.choice(c.output.quiet()),
        record: c.recording.recording()?,
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::scale::run(&opts, out).map(|o| o.failed_points())
    })
}
