//! `vmscope bench web`: turns arguments into `WebOptions` and calls
//! `vmscope_bench::web` (menon2005 Fig 7).

use crate::cmd_bench::{ChartArgs, CommonArgs};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_bench::units::parse_size;
use vmscope_bench::web::{parse_rates, WebOptions};

pub const HELP: &str = "\
--lab is a comma-separated list of configurations [default: host,guest-same-cpu,guest-separate-cpu];
--lab-name prefixes each lab's name (NAME-SPECNAME).
A configuration is `host` (busybox httpd on 127.0.0.1) or a lab spec (built-in guest-same-cpu,
guest-separate-cpu, or a file) whose first VM has a tap NIC: the lab is brought up (or reused),
busybox httpd started in the VM, and torn down after. User networking cannot carry the test; the
error names the spec change (`[[vm.nic]] kind = \"tap\"`).
httperf runs on the host: `httperf --hog --server ADDR --port PORT --uri FILE --num-conns N
--num-calls 1 --rate R --timeout T`, N = R x --seconds, one connection per request (open loop).
Stop rule: per configuration the rates run in ascending order; the first rate whose mean reply rate
(2xx replies / httperf's test duration) is below --follow x the offered rate is marked
`saturated` and is the last one run. A rate httperf itself cannot offer (fd-unavail errors, or its
request rate below --follow x offered while connections took less than the interval between two
arrivals, so the server was not queueing them) is marked `generator-limited`, said in a note, and
ends the sweep too.
Host CPU per reply: what the run cost the host (this process and its children, the VM's QEMU,
kernel threads) less httperf's own CPU time as it reports it, over the 2xx replies. Rows store
rates in ops/s and times in s; the table prints ms. Checks (yes/no, with the peak reply rates):
a VM's peak is at most the host's; guest-same-cpu's at most guest-separate-cpu's. httperf is
pinned to the host CPUs that none of the VM's pinned threads use (menon2005's client was a machine
of its own); where none is left (guest-separate-cpu on 2 CPUs) a note says what it shares, and the
same-cpu/separate-cpu line reads n/a, not yes or no, with its numbers. Under TCG the
output says absolute numbers are low. Exit status: 0, 1 when points failed (a VM died), 2 on bad
input.

Examples:
  vmscope bench web                       host, guest-same-cpu, guest-separate-cpu at 100..1000 req/s
  vmscope bench web --lab host,guest-separate-cpu --file-size 70k --rate 20..200:20
  vmscope bench web --lab ./my-lab.toml --lab-name web --seconds 3";

#[derive(Args)]
pub struct WebArgs {
    /// Offered rates, requests/s: A..MAX:STEP and/or a comma list.
    #[arg(long, default_value = vmscope_bench::web::DEFAULT_RATES, value_name = "RATES")]
    rate: String,
    /// Size of the served file (k, M are powers of 1024; 1k as menon2005, 70k as cherkasova2005).
    #[arg(long, default_value = "1k", value_name = "BYTES")]
    file_size: String,
    /// Seconds of offered load per run (connections = rate x seconds).
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    seconds: f64,
    /// httperf's --timeout: seconds a connection or reply may take before it counts as an error.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    timeout: f64,
    /// TCP port the servers listen on (on 127.0.0.1 for host, in the guest for VMs).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The reply rate follows while it is at least this fraction of the offered rate.
    #[arg(long, default_value_t = vmscope_bench::web::DEFAULT_FOLLOW, value_name = "FRACTION")]
    follow: f64,
    /// The httperf program [default: httperf on PATH].
    #[arg(long, value_name = "FILE")]
    httperf: Option<PathBuf>,
    /// Do not run the accountant (no per-VM I/O charge).
    #[arg(long)]
    no_account: bool,
    /// Earlier name of --lab.
    #[arg(long, hide = true, value_name = "CONFIGS", conflicts_with = "lab")]
    config: Option<String>,
    /// Earlier name of --lab-name.
    #[arg(long, hide = true, value_name = "PREFIX", conflicts_with = "lab_name")]
    lab_prefix: Option<String>,
    #[command(flatten)]
    charts: ChartArgs,
    #[command(flatten)]
    common: CommonArgs,
}

pub fn run(a: WebArgs) -> Result<ExitCode> {
    let c = &a.common;
    let mut lab = c.lab.choice(c.output.quiet());
    // The configurations are --lab's list (`host` among them); the name
    // prefixes every lab's.
    let configs = lab
        .spec
        .take()
        .or(a.config)
        .unwrap_or_else(|| vmscope_bench::web::DEFAULT_CONFIGS.to_string());
    if lab.name.is_none() {
        lab.name = a.lab_prefix;
    }
    let opts = WebOptions {
        configs: configs
            .split(',')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect(),
        rates: parse_rates(&a.rate).map_err(anyhow::Error::msg)?,
        file_size: parse_size(&a.file_size).map_err(|e| anyhow::anyhow!("--file-size: {e}"))?,
        seconds: a.seconds,
        timeout: a.timeout,
        port: a.port,
        follow: a.follow,
        httperf: a.httperf,
        account: !a.no_account,
        sampling: c.sampling.sampling(),
        output: c.output.output(a.charts.dir("web")),
        lab,
        record: c.recording.recording()?,
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::web::run(&opts, out).map(|o| o.failed_points())
    })
}
