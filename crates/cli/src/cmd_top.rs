//! `vmscope top`: the host and every VM live, with their top functions
//! (`vmscope_top`).

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
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
    after_help = "Keys: q (or Esc, Ctrl-C) quit, s sort (CPU, steal, I/O, name), f VM filter, c context filter, e/Enter expand the selected domain, a expand all, j/k or arrows move, p pause. In a replay also: Left/b and Right/n one interval back and forward, [ ] a minute, { } ten minutes, g/G the first and last interval, p or space play.\n\nTimes (--at, --from, --to): 03:05, yesterday 03:05, -15m or RFC 3339, local unless --utc.\n\nColumns: CPU% of one host CPU (a VM: its vCPUs, its own threads and its charge for shared I/O; the host: everything else), each vCPU state in % of the interval (averaged over the VM's vCPUs), I/O CPU% (the VM's own threads and its share of shared I/O work), I/O operations per second, samples lost.\n\nExamples:\n  vmscope top                       the live view (q quits)\n  vmscope top --batch -n 5 --format json | jq .domains[].cpu_pct\n  vmscope top --replay --at 03:10          what the host did at 03:10, from serve --history (docs/history.md)"
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
    /// Replay the history serve --history keeps in DIR (default
    /// /var/lib/vmscope/history) instead of measuring now: the same screen
    /// and keys, plus keys to step and jump; --batch prints the recorded
    /// documents.
    #[arg(long, value_name = "DIR", num_args = 0..=1,
          default_missing_value = DEFAULT_HISTORY)]
    replay: Option<PathBuf>,
    /// The moment to replay (with --replay): 03:05, yesterday 03:05, -15m
    /// or RFC 3339. Batch mode prints the interval holding it (-n: and
    /// the ones after).
    #[arg(long, value_name = "TIME", requires = "replay", conflicts_with_all = ["from", "to"])]
    at: Option<String>,
    /// Start of the range to replay (with --replay; default: the history's start).
    #[arg(long, value_name = "TIME", requires = "replay")]
    from: Option<String>,
    /// End of the range to replay (with --replay; default: its end).
    #[arg(long, value_name = "TIME", requires = "replay")]
    to: Option<String>,
    /// Read and show times in UTC instead of local time.
    #[arg(long)]
    utc: bool,
}

/// Where the packaged service keeps its history.
pub const DEFAULT_HISTORY: &str = "/var/lib/vmscope/history";

/// How far around --at the interactive replay loads frames.
const AROUND_AT: f64 = 1800.0;

/// `top --replay`.
fn replay(a: &TopArgs, dir: &Path) -> Result<ExitCode> {
    use vmscope_history::time;
    let utc = a.utc;
    let mut h = vmscope_history::History::open(dir)?;
    for line in h.take_skipped() {
        eprintln!("vmscope top: {}", vmscope_model::text::visible(&line));
    }
    let Some((first, last)) = h.span() else {
        return Err(h.outside("--replay", utc).into());
    };
    let now = time::now();
    let parse = |flag: &str, v: &str| {
        time::parse(v, now, utc).map_err(|e| anyhow::anyhow!("{flag} {v}: {e}"))
    };
    let (from, to, at) = match (&a.at, &a.from, &a.to) {
        (Some(v), _, _) => {
            let t = parse("--at", v)?;
            if t < first - 1.0 || t > last + 1.0 {
                return Err(h.outside(&format!("--at {v}"), utc).into());
            }
            if a.batch {
                (t, last, Some(t))
            } else {
                (t - AROUND_AT, t + AROUND_AT, Some(t))
            }
        }
        (None, f, t) => {
            let from = f
                .as_deref()
                .map(|v| parse("--from", v))
                .transpose()?
                .unwrap_or(first);
            let to = t
                .as_deref()
                .map(|v| parse("--to", v))
                .transpose()?
                .unwrap_or(last);
            if to <= from {
                anyhow::bail!(
                    "--to {}: not after --from ({})",
                    time::show(to, utc),
                    time::show(from, utc)
                );
            }
            if to < first || from > last {
                let what = format!(
                    "--from {} --to {}",
                    time::show(from, utc),
                    time::show(to, utc)
                );
                return Err(h.outside(&what, utc).into());
            }
            (from, to, None)
        }
    };
    let parse_frame = |d: &vmscope_history::FrameDoc| -> Result<vmscope_top::Frame> {
        let mut f: vmscope_top::Frame = serde_json::from_slice(&d.doc).with_context(|| {
            format!(
                "{}: a recorded interval at {} does not read as a frame",
                dir.display(),
                time::show(d.t_end, utc)
            )
        })?;
        f.time_s = d.t_end - from;
        f.at = Some(time::rfc3339(d.t_end, utc));
        Ok(f)
    };
    // The interval holding --at: the first that ends at or after it (an
    // end up to a tenth of an interval before it counts: a document's time
    // is its interval's end, taken a few milliseconds after the tick).
    let holds_at =
        |d: &vmscope_history::FrameDoc| at.is_none_or(|t| d.t_end >= t - 0.1 * d.interval_s);
    crate::signals::install();
    if !a.batch {
        // The documents as recorded (JSON), each parsed when it is shown.
        let docs = h.frames(from, to + 1e-3)?;
        if docs.is_empty() {
            return Err(h.outside("the range asked for", utc).into());
        }
        let start = match at {
            None => docs.len() - 1,
            Some(_) => docs.iter().position(holds_at).unwrap_or(docs.len() - 1),
        };
        let mut frame = |i: usize| {
            parse_frame(&docs[i]).map_err(|e| vmscope_top::TopError::Source(format!("{e:#}")))
        };
        vmscope_top::run_replay(docs.len(), &mut frame, start, crate::signals::stopped())?;
        return Ok(ExitCode::SUCCESS);
    }
    // Batch mode reads the range a chunk at a time, so a day costs the
    // memory of a chunk (one frame of 32 VMs inflates to about 0.1 MiB
    // parsed; a day of them would not fit the 200 MiB bound).
    let view = View {
        functions: a.functions,
        ..View::default()
    };
    let count = a.count.unwrap_or(if at.is_some() { 1 } else { u64::MAX });
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut printed = 0u64;
    // --at: from a little before it (an interval ending just before counts).
    let mut lo = at.map_or(from, |t| t - BEFORE_AT);
    // Chunks [lo, hi] up to the range's end; the loop stops once a chunk
    // has reached it (a test on `lo <= end` met lo == end and read an
    // empty chunk forever).
    let end = to + 1e-3;
    let mut after = f64::NEG_INFINITY;
    let mut piped = false;
    'chunks: while printed < count && lo < end {
        let hi = (lo + REPLAY_CHUNK).min(end);
        for d in h.frames(lo, hi)? {
            if d.t_end <= after || !holds_at(&d) {
                continue;
            }
            let frame = parse_frame(&d)?;
            if crate::signals::received().is_some() || printed >= count {
                break 'chunks;
            }
            let r = match a.format {
                TopFormat::Text => vmscope_top::write_text(&frame, &view, &mut out),
                TopFormat::Json => vmscope_top::write_json(&frame, &mut out),
            };
            match r.and_then(|()| out.flush()) {
                Ok(()) => printed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    piped = true;
                    break 'chunks;
                }
                Err(e) => return Err(e.into()),
            }
        }
        after = hi;
        lo = hi;
    }
    if printed == 0 && !piped && crate::signals::received().is_none() {
        return Err(h.outside("the range asked for", utc).into());
    }
    Ok(ExitCode::SUCCESS)
}

/// Seconds of history batch replay reads at a time.
const REPLAY_CHUNK: f64 = 300.0;

/// How far before --at batch replay starts reading: the interval holding
/// it may end a little before it (`holds_at`), and intervals are at most
/// this long.
const BEFORE_AT: f64 = 60.0;

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
    if let Some(dir) = &a.replay {
        return replay(&a, dir);
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
