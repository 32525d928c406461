//! `vmscope report`: print a stored session.

use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_report::{
    build, parse_fields, render, Classes, ReportError, ReportFormat, ReportOptions,
};
use vmscope_store::output::OutputOptions;
use vmscope_store::Field;

#[derive(Args, Debug)]
#[command(
    after_help = "Fields for --by: domain (host or a VM), context (guest-user, guest-kernel, guest, vmm-kernel,\n\
vmm-user, host-kernel, host-user, idle; kernel modules shown apart), process, image, symbol,\n\
srcline (source file:line where the binary has DWARF), cpu, class (function classes: net/core,\n\
bridge, netfilter, mm, block, sched, kvm, virtio, vhost, QEMU's devices and TCG, else the kernel\n\
subsystem, module or binary; add rules with --classes FILE).\n\n\
Columns: samples as taken, the event count in its unit (CPU s for cpu-clock) and % of it, as perf\n\
reports it. In the merged view an active VM's guest rows are its agent's samples scaled to the guest\n\
time the host measured: the event count adds up to the header's total, samples do not.\n\n\
Formats: table, json, csv; collapsed stacks, flamegraph (SVG) and pprof count the event (ns of CPU\n\
for cpu-clock), each stack from its domain down: host -> VM -> vCPU -> guest process -> functions;\n\
html is one self-contained page (tables, flame graphs, timeline). --callers and --callees need a\n\
recording with call stacks (record -g); --time and --cpu slice the session.\n\n\
Examples:\n  \
vmscope report --by domain,context                where the CPU went, per VM and context\n  \
vmscope report --format html -o report.html       one page with flame graphs and charts\n  \
vmscope report /var/lib/vmscope/history --time 03:05-03:15   ten minutes of serve --history"
)]
pub struct ReportArgs {
    /// Session file, or a history directory (serve --history DIR).
    #[arg(default_value = "vmscope.db")]
    pub file: PathBuf,
    /// Group by these fields, comma-separated, in this order.
    #[arg(long)]
    pub by: Option<String>,
    /// Only this event (default: every event of the session, side by side).
    #[arg(short = 'e', long)]
    pub event: Option<String>,
    /// Print at most N rows (N > 0; omit it for every row).
    #[arg(short = 'n', long, value_parser = crate::args::rows, allow_negative_numbers = true)]
    pub limit: Option<usize>,
    /// Drop rows below this percentage (0 to 100).
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::percent,
          allow_negative_numbers = true)]
    pub min_percent: f64,
    /// Reconcile the rows with the scheduler (the `# coverage` lines; a
    /// recording of every CPU): a VM thread sampled over 110 % of its run
    /// time is held to it, and a domain still covered under 95 % gets a row
    /// `[unsampled]` with the gap: the domain's rows then add up to its run
    /// time, as the scheduler counts it.
    #[arg(long)]
    pub unsampled: bool,
    /// table, json, csv, collapsed (stacks for flame graph tools), flamegraph
    /// (SVG), pprof (gzipped profile.proto) or html (one self-contained page);
    /// flamegraph, pprof and html need -o.
    #[arg(short = 'f', long, default_value = "table")]
    pub format: String,
    /// Write to this file instead of standard output (`-`: standard output,
    /// for the binary formats too). An existing file is replaced only when
    /// vmscope wrote it and it is unchanged since.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace -o FILE whatever regular file it is (never a device,
    /// directory or the session read).
    #[arg(long, requires = "output")]
    pub force: bool,
    /// Print full image and source paths instead of file names.
    #[arg(long)]
    pub full_paths: bool,
    /// Only this domain (host or a VM name).
    #[arg(long)]
    pub domain: Option<String>,
    /// Only this context (e.g. guest-kernel).
    #[arg(long)]
    pub context: Option<String>,
    /// Which measurements: merged (default: active VMs' agent profiles scaled
    /// to the guest time the host measured), host (the host's rings only) or
    /// agent (what agents measured inside guests, unscaled).
    #[arg(long, default_value = "merged")]
    pub view: String,
    /// santos2006's view of one domain: its kernel and the VMM working in its
    /// context, side by side (samples, % of all samples, other, TOTAL);
    /// groups by --by (default symbol; `--by class` gives the class table).
    #[arg(long, value_name = "DOMAIN")]
    pub side_by_side: Option<String>,
    /// Class rules (TOML) used before the built-in ones for `--by class`.
    #[arg(long, value_name = "FILE")]
    pub classes: Option<PathBuf>,
    /// Call paths that lead to this function (nearest caller first); needs a
    /// session recorded with -g.
    #[arg(long, value_name = "SYMBOL", conflicts_with = "callees")]
    pub callers: Option<String>,
    /// Call paths below this function (direct callee first); needs -g.
    #[arg(long, value_name = "SYMBOL")]
    pub callees: Option<String>,
    /// Frames shown per path of --callers / --callees.
    #[arg(long, default_value_t = 6)]
    pub depth: usize,
    /// Only these seconds since the session's start: START-END (10s-20s,
    /// 10-20, 30s-, -5s); whole seconds. For a history directory (serve
    /// --history): wall-clock times, 03:05-03:15, -15m--5m, yesterday
    /// 23:50-00:10 or RFC 3339 (default: all of it).
    #[arg(long, value_name = "START-END")]
    pub time: Option<String>,
    /// Read and show a history's times in UTC instead of local time.
    #[arg(long)]
    pub utc: bool,
    /// Only samples that ran on these host CPUs (0,1 or 0-3). Agents' rows
    /// are scaled to the guest time the host measured on them.
    #[arg(long, value_name = "CPUS")]
    pub cpu: Option<String>,
    /// Leave functions inlined into their callers (from DWARF) out of call
    /// stacks, as perf's --no-inline.
    #[arg(long)]
    pub no_inline: bool,
}

/// Write `bytes` to `-o FILE` through the store's atomic artifact writer
/// (the target checked, a temporary file renamed over it on success, so an
/// error leaves no half-written file), else to standard output.
fn emit(args: &ReportArgs, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(p) = args.output.as_ref().filter(|p| !crate::args::is_stdout(p)) {
        vmscope_store::output::write_artifact(
            p,
            &OutputOptions::new(args.force, &[args.file.as_path()]),
            bytes,
        )?;
    } else {
        use anyhow::Context as _;
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)
            .and_then(|()| out.flush())
            .context("writing the report to standard output")?;
    }
    Ok(())
}

fn spinner(what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    pb.set_message(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// The range `--time` names in the history directory `args.file`, written
/// as one session in a temporary directory (kept alive by the caller).
fn extract_history(args: &ReportArgs) -> anyhow::Result<(tempfile::TempDir, PathBuf)> {
    use vmscope_history::time;
    let dir = &args.file;
    let mut h = vmscope_history::History::open(dir)?;
    for line in h.take_skipped() {
        eprintln!("vmscope: {}", vmscope_model::text::visible(&line));
    }
    let Some((first, last)) = h.span() else {
        return Err(h
            .outside(&format!("report {}", dir.display()), args.utc)
            .into());
    };
    let (from, to) = match &args.time {
        Some(t) => time::parse_range(t, time::now(), args.utc)
            .map_err(|e| anyhow::anyhow!("--time {t}: {e}"))?,
        None => (first, last),
    };
    if to < first || from > last {
        return Err(h
            .outside(
                &format!("--time {}", args.time.as_deref().unwrap_or_default()),
                args.utc,
            )
            .into());
    }
    let tmp = anyhow::Context::context(
        tempfile::tempdir(),
        "a temporary directory for the history's range",
    )?;
    let path = tmp.path().join("history.db");
    let x = h.extract(from.max(first), to.min(last), &path)?;
    let steps = if x.step > 1 {
        format!("; its timeline in steps of {} s", x.step)
    } else {
        String::new()
    };
    eprintln!(
        "vmscope: the history in {} from {} to {}: {} intervals in {} segments (seconds below count from {}{steps})",
        dir.display(),
        time::show(from.max(first), args.utc),
        time::show(to.min(last), args.utc),
        x.intervals,
        x.segments,
        time::show(x.start, args.utc)
    );
    Ok((tmp, path))
}

pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let format: ReportFormat = args.format.parse()?;
    // What the call-path and side-by-side views can be written as, checked
    // before any work: they are tables (a flame graph of a function's
    // callers would silently be a text table in an .svg file).
    let tabular = matches!(
        format,
        ReportFormat::Table | ReportFormat::Json | ReportFormat::Csv
    );
    if let (Some(sym), false) = (args.callers.as_ref().or(args.callees.as_ref()), tabular) {
        let which = if args.callers.is_some() {
            "--callers"
        } else {
            "--callees"
        };
        anyhow::bail!(
            "{which} {sym} prints its call paths as a table, JSON or CSV, not as {}; \
             drop --format {} (or use --format flamegraph without {which})",
            args.format,
            args.format
        );
    }
    if args.side_by_side.is_some() && !matches!(format, ReportFormat::Table | ReportFormat::Json) {
        anyhow::bail!(
            "--side-by-side prints a table or JSON, not {}; drop --format {}",
            args.format,
            args.format
        );
    }
    let by = match &args.by {
        Some(s) => parse_fields(s)?,
        None => Vec::new(),
    };
    if args.depth == 0 {
        anyhow::bail!("--depth must be at least 1");
    }
    // The output is checked before any work (and again when written).
    if let Some(p) = args.output.as_ref().filter(|p| !crate::args::is_stdout(p)) {
        vmscope_store::output::check_output(
            p,
            vmscope_store::output::OutputKind::Artifact,
            &OutputOptions::new(args.force, &[args.file.as_path()]),
        )?;
    }
    let mut filter = Vec::new();
    if let Some(d) = &args.domain {
        filter.push((Field::Domain, d.clone()));
    }
    if let Some(c) = &args.context {
        if vmscope_model::Context::parse(c).is_none() {
            anyhow::bail!(
                "unknown context '{c}'; contexts: {}",
                vmscope_model::Context::ALL
                    .map(vmscope_model::Context::as_str)
                    .join(", ")
            );
        }
        filter.push((Field::Context, c.clone()));
    }
    // A history directory (serve --history): --time is a wall-clock range
    // of it, extracted into one session in a temporary directory. Any
    // other directory is refused as not a session.
    let history = vmscope_history::is_history(&args.file);
    let _history_dir;
    let (session, _copy) = if history {
        let (dir, path) = extract_history(&args)?;
        _history_dir = dir;
        (
            vmscope_store::Session::open(&path)?.shown_as(&args.file),
            None,
        )
    } else {
        crate::args::open_session(&args.file)?
    };
    let time = if history { None } else { args.time.as_deref() };
    if let Some(note) = vmscope_store::output::partial_note(&args.file) {
        eprintln!("vmscope: note: {note}");
    }
    let view = match args.view.as_str() {
        "merged" => vmscope_store::View::Merged,
        "host" => vmscope_store::View::Host,
        "agent" => vmscope_store::View::Agent,
        v => anyhow::bail!("unknown view '{v}'; views: merged, host, agent"),
    };
    let classes = match &args.classes {
        Some(p) => Classes::from_file(p)?,
        None => Classes::builtin(),
    };
    let needs_file = matches!(
        format,
        ReportFormat::Flamegraph | ReportFormat::Pprof | ReportFormat::Html
    );
    if needs_file && args.output.is_none() {
        return Err(ReportError::NeedsOutput(match format {
            ReportFormat::Flamegraph => "flamegraph",
            ReportFormat::Pprof => "pprof",
            _ => "html",
        })
        .into());
    }
    // One check for every format (the pprof, flame graph and HTML writers
    // included): the domains the view has, named.
    if let Some(d) = &args.domain {
        vmscope_report::check_domain(&session, view, d)?;
    }
    let slice = vmscope_report::slice::resolve(&session, time, args.cpu.as_deref())?;
    if let Some(note) = time.and_then(vmscope_report::slice::time_note) {
        eprintln!("vmscope: note: {note}");
    }
    let opts = ReportOptions {
        by,
        event: args.event.clone(),
        limit: args.limit,
        min_percent: args.min_percent,
        full_paths: args.full_paths,
        filter,
        view,
        slice,
        classes,
        inline: !args.no_inline,
        unsampled: args.unsampled,
    };

    if let Some(domain) = &args.side_by_side {
        let v = vmscope_report::build_side_by_side(&session, domain, &opts)?;
        let mut out = Vec::new();
        match format {
            ReportFormat::Json => {
                serde_json::to_writer_pretty(&mut out, &v)?;
                writeln!(out)?;
            }
            _ => vmscope_report::render_side_by_side(&v, &mut out)?,
        }
        emit(&args, &out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(sym) = args.callers.as_ref().or(args.callees.as_ref()) {
        let ev = vmscope_report::event_index(&session, opts.event.as_deref())?;
        let rows = vmscope_report::filtered_rows(&session, &opts, ev)?;
        let total = session
            .totals_in(opts.view, &opts.slice)?
            .get(&ev)
            .map_or(0, |t| t.1);
        let event = session.events()?[ev as usize].name.clone();
        let mut g = vmscope_report::stacks::call_graph(
            &rows,
            sym,
            args.callers.is_some(),
            &event,
            total,
            args.depth,
        )?;
        if let Some(n) = opts.limit {
            g.omitted = g.paths.len().saturating_sub(n);
            g.paths.truncate(n);
        }
        let mut out = Vec::new();
        vmscope_report::render_call_graph(&g, format, &mut out)?;
        emit(&args, &out)?;
        return Ok(ExitCode::SUCCESS);
    }

    // Built in memory first: an error leaves no half-written file behind.
    let pb = needs_file.then(|| spinner(&format!("writing the {} report", args.format)));
    let mut buf: Vec<u8> = Vec::new();
    match format {
        ReportFormat::Pprof => {
            let p = vmscope_report::pprof::build(&session, &opts)?;
            vmscope_report::pprof::write(&p, &mut buf)?;
        }
        ReportFormat::Html => vmscope_report::html::write(&session, &opts, &mut buf)?,
        ReportFormat::Flamegraph => {
            let report = build(&session, &opts, true)?;
            vmscope_report::flame::write(&report, &mut buf)?;
        }
        _ => {
            let report = build(&session, &opts, format == ReportFormat::Collapsed)?;
            render(&report, format, &mut buf)?;
        }
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    emit(&args, &buf)?;
    if let (Some(p), true) = (&args.output, needs_file) {
        if !crate::args::is_stdout(p) {
            eprintln!("vmscope: wrote {} ({} bytes)", p.display(), buf.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}
