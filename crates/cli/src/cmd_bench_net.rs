//! `vmscope bench net`: turns arguments into `NetOptions` and calls
//! `vmscope_bench::net` (menon2005's network experiment).

use crate::cmd_bench::{ChartArgs, CommonArgs};
use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use vmscope_bench::net::NetOptions;
use vmscope_bench::units::parse_size_list;

pub const HELP: &str = "\
--lab brings up a lab (built-in guest-same-cpu, guest-separate-cpu, or a spec file). A path is
SENDER:RECEIVER, each `host` or the name of a lab VM with a tap NIC (user networking cannot carry
the test). The engine's sender sendfile()s a cached 64 KiB file over --streams TCP connections for
--seconds; its receiver recv()s into a user buffer of each --recv-buf size (menon2005 Figs 1-2).
iperf3 -Z -l 64K -J runs on every path too (copied into guests), and the engine at 64 KiB is
compared with it (within 10 %: a yes/no line). Throughput is printed in Mbit/s (10^6 bits/s); rows
store bytes/s. Host CPU per Gbit is the CPU time the run cost the host (this process and its
children, the VMs' QEMUs, kernel threads; other programs' load only flags a sample as busy) over
10^9 bits moved; with the accountant each VM's vCPU time and I/O charge (QEMU's I/O threads plus its
share of network softirqs) are read around each sample. Under TCG (no KVM) every guest instruction
is emulated: absolute numbers are low, and the output says so. Exit status: 0, 1 when points failed
(a VM died), 2 on bad input.

Examples:
  vmscope bench net --lab guest-same-cpu  host to VM and back, receive buffers 1K..256K, iperf3 beside
  vmscope bench net --lab guest-separate-cpu --recv-buf 4k,64k --seconds 5
  vmscope bench net --path host:guest0 --streams 4      a VM of a lab that is already up";

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
    /// Do not run the accountant (no per-VM vCPU and I/O charge).
    #[arg(long)]
    no_account: bool,
    #[command(flatten)]
    charts: ChartArgs,
    #[command(flatten)]
    common: CommonArgs,
}

pub fn run(a: NetArgs) -> Result<ExitCode> {
    let c = &a.common;
    let opts = NetOptions {
        paths: a.paths,
        recv_bufs: parse_size_list(&a.recv_buf, "--recv-buf").map_err(anyhow::Error::msg)?,
        streams: a.streams,
        seconds: a.seconds,
        port: a.port,
        peer: !a.no_peer,
        account: !a.no_account,
        sampling: c.sampling.sampling(),
        output: c.output.output(a.charts.dir("net")),
        lab: c.lab.choice(c.output.quiet()),
        record: c.recording.recording()?,
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::net::run(&opts, out).map(|o| o.failed_points())
    })
}
