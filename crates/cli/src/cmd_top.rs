//! `vmscope top`: the host and every VM live, with their top functions
//! (`vmscope_top`).

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;
use vmscope_top::live::{LiveTop, LiveTopOptions};
use vmscope_top::{FrameSource, View};

#[derive(Clone, Copy, ValueEnum)]
pub enum TopFormat {
    Text,
    Json,
}

#[derive(Args)]
#[command(
    after_help = "Keys: q (or Esc, Ctrl-C) quit, s sort (CPU, steal, I/O, name), f VM filter, c context filter, e/Enter expand the selected domain, a expand all, j/k or arrows move, p pause.\n\nColumns: CPU% of one host CPU (a VM: its vCPUs, its own threads and its charge for shared I/O; the host: everything else), each vCPU state in % of the interval (averaged over the VM's vCPUs), I/O CPU% (the VM's own threads and its share of shared I/O work), I/O operations per second, samples lost.\n\nExamples:\n  vmscope top                       the live view (q quits)\n  vmscope top -b -n 3               three text frames, one a second\n  vmscope top --batch -n 5 --format json | jq .domains[].cpu_pct"
)]
pub struct TopArgs {
    /// Refresh interval (1s, 500ms, ...).
    #[arg(short, long, default_value = "1s", value_parser = vmscope_stat::parse_interval)]
    interval: Duration,
    /// One document per interval on standard output instead of the live view (like top -b).
    #[arg(short = 'b', long)]
    batch: bool,
    /// Intervals to print in batch mode (default: until interrupted).
    #[arg(short = 'n', long, value_parser = crate::args::intervals,
          allow_negative_numbers = true)]
    count: Option<u64>,
    /// Batch output: text or one JSON document per line.
    #[arg(long, value_enum, default_value = "text")]
    format: TopFormat,
    /// Sampling frequency of the host and of active VMs' agents, Hz.
    #[arg(short = 'F', long, default_value_t = 99, value_parser = crate::args::hertz,
          allow_negative_numbers = true)]
    freq: u64,
    /// Intervals the function lists cover.
    #[arg(long, default_value_t = 5, value_parser = crate::args::window,
          allow_negative_numbers = true)]
    window: usize,
    /// Functions listed per domain.
    #[arg(long, default_value_t = 5, value_parser = crate::args::rows,
          allow_negative_numbers = true)]
    functions: usize,
    /// Role of a VM, NAME=active|passive|unmonitored (repeatable). Default:
    /// active where its agent answers.
    #[arg(long = "vm", value_name = "NAME=ROLE")]
    vm_roles: Vec<String>,
}

pub fn run(a: TopArgs) -> Result<ExitCode> {
    if a.freq == 0 {
        anyhow::bail!("-F must be a positive frequency in Hz");
    }
    if a.count == Some(0) {
        anyhow::bail!("-n 0 would print nothing: give at least 1 interval (or leave -n out)");
    }
    if !a.batch && (a.count.is_some() || matches!(a.format, TopFormat::Json)) {
        anyhow::bail!(
            "-n and --format are options of batch mode: add --batch (-b), or leave them out for the live view"
        );
    }
    if !a.batch && !std::io::stdout().is_terminal() {
        anyhow::bail!("the live view needs a terminal; use --batch for a pipe or a file");
    }
    // SIGTERM and SIGHUP end the live view as q does (the terminal is
    // given back), and batch mode after the frame in hand.
    crate::signals::install();
    let mut source = LiveTop::start(LiveTopOptions {
        interval: a.interval,
        frequency: a.freq,
        window: a.window,
        functions: a.functions,
        roles: crate::args::vm_roles(&a.vm_roles)?,
    })
    .context("starting top")?;
    if !a.batch {
        vmscope_top::run_interactive(Box::new(source), crate::signals::stopped())?;
        if let Some(s) = crate::signals::received() {
            eprintln!("vmscope top: stopped by {}", crate::signals::name(s));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let view = View {
        functions: a.functions,
        ..View::default()
    };
    let stdout = std::io::stdout();
    let mut n = 0;
    while a.count.is_none_or(|c| n < c) && crate::signals::received().is_none() {
        let frame = source.next_frame()?;
        let mut out = stdout.lock();
        match a.format {
            TopFormat::Text => vmscope_top::write_text(&frame, &view, &mut out)?,
            TopFormat::Json => vmscope_top::write_json(&frame, &mut out)?,
        }
        out.flush()?;
        n += 1;
    }
    Ok(ExitCode::SUCCESS)
}
