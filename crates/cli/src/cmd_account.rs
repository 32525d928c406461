//! `vmscope account`: per VM and interval, vCPU run / steal / halt, direct
//! and shared I/O CPU, I/O operations and the reconciliation with the
//! host's CPU (see `vmscope_stat::account`).

use crate::cmd_stat::OutFormat;
use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Instant;
use vmscope_stat::account::{AccountOptions, Accountant};
use vmscope_stat::render::{self, IntervalFormat};
use vmscope_stat::session::IntervalSession;
use vmscope_stat::wait_source::WaitChoice;

#[derive(Args)]
#[command(
    after_help = "Columns, per VM and interval, in seconds: run, steal (vCPU runnable but not running), halt \
(vCPU idle), dirio (CPU of the VM's own QEMU threads), shrio (its charge for the host's shared I/O \
work T: cost = T / ΣN per I/O operation, charge = N_i × cost), total, and I/O operations. The \
`= host` line reconciles Σ VMs + unattributed host work with the host's CPU from /proc/stat.\n\n\
Under a VM row, `vCPUs waited behind:` splits its steal by what ran instead on the CPU its vCPUs \
waited for (another VM's vCPU or I/O thread, a thread of its own, a host task by name and pid, \
or idle: wake-up latency), top 3 and how many more; `I/O threads waited behind:` does the same \
for its other threads. JSON and CSV carry every culprit. From the scheduler's tracepoints \
(root); the header says when they are not available.\n\n\
Examples:\n  \
vmscope account -i 1s                      every second until Ctrl-C\n  \
vmscope account -i 1s -n 5 --format json | jq '.vms[]?.waited_behind'   who took each VM's CPU\n  \
vmscope account -i 1s -n 60 -o cost.db     kept in a session: vmscope report cost.db"
)]
pub struct AccountArgs {
    /// Interval (100ms, 1s, ...).
    #[arg(short, long, default_value = "100ms", value_parser = vmscope_stat::parse_interval,
          allow_hyphen_values = true)]
    interval: std::time::Duration,
    /// Number of intervals (default: until interrupted by Ctrl-C, SIGTERM or
    /// SIGHUP, which end it after the current interval).
    #[arg(short = 'n', long, value_parser = crate::args::intervals,
          allow_negative_numbers = true)]
    count: Option<u64>,
    #[arg(long, value_enum, default_value = "text")]
    format: OutFormat,
    /// A process whose CPU is shared I/O work for all VMs (repeatable).
    #[arg(long = "shared-io", value_name = "PID", value_parser = crate::args::pid,
          allow_negative_numbers = true)]
    shared_io: Vec<u32>,
    /// Do not ask QMP for disk requests (use /proc/PID/io).
    #[arg(long)]
    no_qmp: bool,
    /// Do not split steal by what ran instead (no scheduler tracepoints).
    #[arg(long, conflicts_with = "wait_source")]
    no_wait: bool,
    /// Where the split of steal comes from: auto (the eBPF programs, else the tracepoint
    /// rings), bpf (exact to run_delay; an error line in the header when they cannot load),
    /// tracepoints (the scheduler tracepoints' rings).
    #[arg(long, value_name = "SOURCE", default_value = "auto",
          value_parser = ["auto", "bpf", "tracepoints"])]
    wait_source: String,
    /// Also keep the intervals in this session file (`vmscope report FILE`).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<std::path::PathBuf>,
    /// Let -o replace a regular file that is not a vmscope session (never a
    /// device, FIFO or directory).
    #[arg(long, requires = "output")]
    force: bool,
}

pub fn run(a: AccountArgs) -> Result<ExitCode> {
    crate::args::check_pids("--shared-io", &a.shared_io)?;
    let mut acc = Accountant::new(AccountOptions {
        shared_io_pids: a.shared_io,
        use_qmp: !a.no_qmp,
        wait: if a.no_wait {
            WaitChoice::Off
        } else {
            WaitChoice::parse(&a.wait_source).unwrap_or_default()
        },
        ..AccountOptions::default()
    });
    let fmt: IntervalFormat = a.format.into();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // The baseline first, so the first interval starts at the header.
    acc.sample().context("first sample")?;
    let mut next = Instant::now();
    render::account_header(
        &mut out,
        fmt,
        a.interval.as_secs_f64(),
        &acc.softirq_source(),
        &acc.wait_source(),
    )?;
    let mut session = match &a.output {
        Some(p) => Some(
            IntervalSession::create(
                p,
                "account",
                &std::env::args().collect::<Vec<_>>().join(" "),
                &[
                    ("softirq_source".into(), acc.softirq_source()),
                    ("wait_source".into(), acc.wait_source()),
                    ("vmscope_version".into(), crate::VERSION.into()),
                ],
                a.force,
            )
            .with_context(|| format!("creating {}", p.display()))?,
        ),
        None => None,
    };
    let stop = crate::signals::install();
    let mut n = 0;
    while a.count.is_none_or(|c| n < c) && stop.load(Ordering::SeqCst) == 0 {
        next += a.interval;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        if let (Some(iv), _) = acc.sample().context("sampling")? {
            if let Some(s) = session.as_mut() {
                s.add_account(&iv).context("storing the interval")?;
            }
            render::account_interval(&mut out, fmt, &iv)?;
            out.flush()?;
            n += 1;
        }
    }
    if let Some(s) = session {
        s.finish().context("finishing the session")?;
    }
    crate::signals::say_stopped("vmscope account", n);
    Ok(ExitCode::SUCCESS)
}
