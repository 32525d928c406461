//! `vmscope report`: print a stored session.

use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_report::{build, parse_fields, render, ReportFormat, ReportOptions};
use vmscope_store::{Field, Session};

#[derive(Args, Debug)]
#[command(
    after_help = "Fields for --by: domain (host or a VM), context (guest-user, guest-kernel, guest, vmm-kernel,\nvmm-user, host-kernel, host-user, idle; kernel modules shown apart), process, image, symbol.\n\nExamples:\n  vmscope report                         image and symbol table of vmscope.db\n  vmscope report --by context            where the CPU went: kernel / modules / user / idle / VMs\n  vmscope report --by domain,context     per-VM split\n  vmscope report --format collapsed | flamegraph.pl > cpu.svg\n\n% is the share of the event count (sum of sample periods), as perf reports it."
)]
pub struct ReportArgs {
    /// Session file.
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
    /// table, json, csv, or collapsed (stacks for flame graphs).
    #[arg(short = 'f', long, default_value = "table")]
    pub format: String,
    /// Print full image paths instead of file names.
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
    /// groups by --by (default symbol; `--by image` gives module classes).
    #[arg(long, value_name = "DOMAIN")]
    pub side_by_side: Option<String>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let format: ReportFormat = args.format.parse()?;
    let by = match &args.by {
        Some(s) => parse_fields(s)?,
        None => Vec::new(),
    };
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
    let session = Session::open(&args.file)?;
    if let Some(note) = vmscope_store::output::partial_note(&args.file) {
        eprintln!("vmscope: note: {note}");
    }
    let view = match args.view.as_str() {
        "merged" => vmscope_store::View::Merged,
        "host" => vmscope_store::View::Host,
        "agent" => vmscope_store::View::Agent,
        v => anyhow::bail!("unknown view '{v}'; views: merged, host, agent"),
    };
    if let Some(domain) = &args.side_by_side {
        let v = vmscope_report::build_side_by_side(
            &session,
            domain,
            args.event.as_deref(),
            &by,
            args.limit.unwrap_or(10),
            view,
        )?;
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        match format {
            ReportFormat::Json => {
                serde_json::to_writer_pretty(&mut out, &v)?;
                writeln!(out)?;
            }
            _ => vmscope_report::render_side_by_side(&v, &mut out)?,
        }
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = ReportOptions {
        by,
        event: args.event.clone(),
        limit: args.limit,
        min_percent: args.min_percent,
        full_paths: args.full_paths,
        filter,
        view,
    };
    let report = build(&session, &opts, format == ReportFormat::Collapsed)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    render(&report, format, &mut out)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
