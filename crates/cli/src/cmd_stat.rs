//! `vmscope stat`: vm-stat, each host CPU's busy % per interval split by
//! VM vCPU (see `vmscope_stat::stat`).

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use vmscope_stat::render::{self, IntervalFormat};
use vmscope_stat::session::IntervalSession;
use vmscope_stat::vmstat::{Source, VmStat, VmStatOptions};

#[derive(Clone, Copy, ValueEnum)]
pub enum OutFormat {
    Text,
    Json,
    Csv,
}

impl From<OutFormat> for IntervalFormat {
    fn from(f: OutFormat) -> IntervalFormat {
        match f {
            OutFormat::Text => IntervalFormat::Text,
            OutFormat::Json => IntervalFormat::Json,
            OutFormat::Csv => IntervalFormat::Csv,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum SourceArg {
    /// The eBPF program when it loads (root), else the sched_switch rings,
    /// else schedstat; the header says which and why.
    Auto,
    /// sched:sched_switch only (fails when tracepoints are unavailable).
    SchedSwitch,
    /// /proc/PID/task/TID/schedstat and /proc/stat.
    Schedstat,
    /// An eBPF program on sched:sched_switch that sums each task's run time
    /// per CPU in the kernel (needs root; fails when it cannot load).
    Bpf,
}

#[derive(Args)]
#[command(
    after_help = "Each line is one host CPU: its busy % and the split, dN-M for VM N's vCPU M, dN-io for the \
VM's own QEMU threads, d0-CPU for other host work; the legend names each dN.\n\n\
Examples:\n  \
vmscope stat                               every second until Ctrl-C\n  \
vmscope stat -i 100ms -n 50 --format csv   5 s in 100 ms steps, as CSV\n  \
vmscope stat -i 1s -n 60 -o stat.db        kept in a session: vmscope report stat.db"
)]
pub struct StatArgs {
    /// Interval (100ms, 1s, ...).
    #[arg(short, long, default_value = "1s", value_parser = vmscope_stat::parse_interval,
          allow_hyphen_values = true)]
    interval: std::time::Duration,
    /// Number of intervals (default: until interrupted by Ctrl-C, SIGTERM or
    /// SIGHUP, which end it after the current interval).
    #[arg(short = 'n', long, value_parser = crate::args::intervals,
          allow_negative_numbers = true)]
    count: Option<u64>,
    #[arg(long, value_enum, default_value = "text")]
    format: OutFormat,
    #[arg(long, value_enum, default_value = "auto")]
    source: SourceArg,
    /// Also keep the intervals in this session file (`vmscope report FILE`).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<std::path::PathBuf>,
    /// Let -o replace a regular file that is not a vmscope session (never a
    /// device, FIFO or directory).
    #[arg(long, requires = "output")]
    force: bool,
    /// Root of the proc tree.
    #[arg(long, default_value = "/proc", hide = true)]
    proc_root: std::path::PathBuf,
}

pub fn run(a: StatArgs) -> Result<ExitCode> {
    let source = match a.source {
        SourceArg::Auto => None,
        SourceArg::SchedSwitch => Some(Source::SchedSwitch),
        SourceArg::Schedstat => Some(Source::Schedstat),
        SourceArg::Bpf => Some(Source::Bpf),
    };
    let mut stat = VmStat::new(VmStatOptions {
        proc_root: a.proc_root,
        source,
    })
    .context("starting stat")?;
    let fmt: IntervalFormat = a.format.into();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut desc = stat.source().describe().to_string();
    if let Some(why) = &stat.fallback_reason {
        desc.push_str(&format!("; not available: {why}"));
    }
    let mut session = match &a.output {
        Some(p) => Some(
            IntervalSession::create(
                p,
                "stat",
                &std::env::args().collect::<Vec<_>>().join(" "),
                &[
                    ("stat_source".into(), desc.clone()),
                    ("vmscope_version".into(), crate::VERSION.into()),
                ],
                a.force,
            )
            .with_context(|| format!("creating {}", p.display()))?,
        ),
        None => None,
    };
    render::stat_header(&mut out, fmt, &desc, a.interval.as_secs_f64())?;
    out.flush()?;
    let stop = crate::signals::install();
    let mut n = 0;
    while a.count.is_none_or(|c| n < c) && stop.load(Ordering::SeqCst) == 0 {
        let iv = stat.next(a.interval).context("sampling")?;
        if let Some(s) = session.as_mut() {
            let names = stat
                .tracker()
                .current()
                .iter()
                .map(|d| (d.id, d.name.clone()))
                .collect();
            s.add_stat(&iv, &names).context("storing the interval")?;
        }
        render::stat_interval(&mut out, fmt, &iv)?;
        out.flush()?;
        n += 1;
    }
    if let Some(s) = session {
        s.finish().context("finishing the session")?;
    }
    crate::signals::say_stopped("vmscope stat", n);
    Ok(ExitCode::SUCCESS)
}
