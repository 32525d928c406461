//! `vmscope bench web`: turns arguments into `WebOptions` and calls
//! `vmscope_bench::web`.

use crate::cmd_bench::{FormatArg, LabDirArgs};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_bench::units::parse_size;
use vmscope_bench::web::{parse_rates, WebOptions};

pub const WEB_HELP: &str = "\
Examples:
  vmscope bench web                                   host, guest-same-cpu, guest-separate-cpu; 1 KiB file,
                                                      100..1000 req/s in steps of 100
  vmscope bench web --config host,guest-separate-cpu --file-size 70k --rate 20..200:20
  vmscope bench web --config ./my-lab.toml --lab-prefix web --seconds 3

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
input.";

#[derive(Args)]
pub struct WebArgs {
    /// Configurations, comma-separated: `host` and/or lab specs (built-in name or file).
    #[arg(long, default_value = vmscope_bench::web::DEFAULT_CONFIGS, value_name = "CONFIGS")]
    config: String,
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
    /// Samples per point at least, after the warm-up.
    #[arg(long, default_value_t = 3, value_name = "N")]
    repeat: usize,
    /// More samples until the 95 % interval is within --ci of the mean, up to this many.
    #[arg(long, default_value_t = 6, value_name = "N")]
    max_repeat: usize,
    /// Target half-width of the 95 % interval, as a fraction of the mean.
    #[arg(long, default_value_t = 0.05, value_name = "FRACTION")]
    ci: f64,
    /// Discarded runs per point before its samples.
    #[arg(long, default_value_t = 1, value_name = "N")]
    warmup: usize,
    /// Run each lab spec as PREFIX-SPECNAME (so labs of several runs do not collide).
    #[arg(long, value_name = "PREFIX")]
    lab_prefix: Option<String>,
    /// Leave the labs this run brought up running.
    #[arg(long)]
    keep_lab: bool,
    #[command(flatten)]
    lab_dirs: LabDirArgs,
    /// table: one line per configuration and rate with units; json: JSON lines (one per sample
    /// and metric, then summaries, checks, notes); csv: one line per sample and metric.
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    /// Directory for the chart (reply rate vs offered rate per configuration, SVG and PNG).
    #[arg(long, default_value = "vmscope-bench-web", value_name = "DIR")]
    out_dir: PathBuf,
    /// Write no charts.
    #[arg(long)]
    no_charts: bool,
    /// Also store every row in this session file (bench_samples table).
    #[arg(long, short = 'o', value_name = "FILE")]
    session: Option<PathBuf>,
    #[command(flatten)]
    record: crate::cmd_bench_net::RecordArgs,
    /// Do not run the accountant (no per-VM I/O charge).
    #[arg(long)]
    no_account: bool,
    /// A sample with more than this many CPUs of other load (from /proc/stat) is redone.
    #[arg(long, default_value_t = 0.25, value_name = "CPUS")]
    busy_threshold: f64,
    /// Redo a busy sample this many times, then keep it flagged.
    #[arg(long, default_value_t = 2, value_name = "N")]
    busy_retries: usize,
    /// Seed of the shuffled round order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// No progress bar or notes on stderr.
    #[arg(long, short)]
    quiet: bool,
}

pub fn web(a: WebArgs) -> Result<ExitCode> {
    let opts = WebOptions {
        configs: a
            .config
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
        repeat: a.repeat,
        max_repeat: a.max_repeat,
        rel_ci: a.ci,
        warmup: a.warmup,
        lab_prefix: a.lab_prefix,
        lab_options: crate::cmd_bench::lab_dirs_options(a.lab_dirs, a.quiet),
        keep_lab: a.keep_lab,
        format: a.format.into(),
        charts: (!a.no_charts).then_some(a.out_dir),
        session: a.session,
        record: a.record.record,
        record_freq: a.record.record_freq,
        vmscope: std::env::current_exe()?,
        account: !a.no_account,
        busy: crate::cmd_bench_net::busy_rule(a.busy_threshold),
        busy_retries: a.busy_retries,
        seed: a.seed,
        quiet: a.quiet,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    crate::cmd_bench::run_to_stdout(|out| {
        vmscope_bench::web::run(&opts, out).map(|o| o.failed_points())
    })
}
