//! `vmscope bench io`: turns arguments into `IoOptions` and calls
//! `vmscope_bench::io` (giacobbi2011's storage method).

use crate::cmd_bench::{list, ChartArgs, CommonArgs};
use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use vmscope_bench::io::{IoOptions, TargetArg};
use vmscope_bench::units::{parse_size, parse_size_list};
use vmscope_workload::io::Mode;

pub const HELP: &str = "\
--lab brings up a lab (the built-in storage-quad, or a spec file) and measures every disk of its VMs
and a host file beside their images. Sizes: k, M, G are powers of 1024 (as dd); kB, MB, GB powers of
1000. Speeds are printed in MiB/s (2^20 bytes/s) and MB/s (10^6 bytes/s); rows (JSON, CSV, sessions)
store bytes/s. Every sample drops the host's and the guest's page cache (root), is redone when other
load shows in /proc/stat (then kept, flagged), and runs the accountant for the host CPU per GiB.
Safety: a target must exist, hold no mounted file system, be large enough and take the block sizes
with O_DIRECT; a device or file with a partition table or file system signature is written only if
--force-destroy-data names it. Exit status: 0, 1 when points failed (a VM died), 2 on bad input.

Examples:
  vmscope bench io --lab storage-quad     the paper's machines: host, raw and qcow2 file images, raw device
  vmscope bench io --target host:/var/tmp/disk.img --bs 4k..1M --size 256M --mode direct-read
  vmscope bench io --check-paper          a short run that checks the paper's findings here";

#[derive(Args)]
pub struct IoArgs {
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
    /// Byte offset of every run in its target (suffixes as --size).
    #[arg(long, default_value = "0", value_name = "BYTES")]
    offset: String,
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
    /// Do not drop the caches before each sample (every sample is flagged).
    #[arg(long)]
    no_drop_caches: bool,
    #[command(flatten)]
    charts: ChartArgs,
    #[command(flatten)]
    common: CommonArgs,
}

pub fn run(a: IoArgs) -> Result<ExitCode> {
    let c = &a.common;
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
            .map(|s| {
                list(
                    "--mode",
                    &s,
                    Mode::parse,
                    &Mode::ALL.map(Mode::name).join(", "),
                )
            })
            .transpose()?,
        offset: parse_size(&a.offset).map_err(|e| anyhow::anyhow!("--offset: {e}"))?,
        check_paper: a.check_paper,
        force_destroy: a.force_destroy_data,
        account: !a.no_account,
        drop_caches: !a.no_drop_caches,
        sampling: c.sampling.sampling(),
        output: c.output.output(a.charts.dir("io")),
        lab: c.lab.choice(c.output.quiet()),
        record: c.recording.recording()?,
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::io::run(&opts, out).map(|o| o.failed_points())
    })
}
