//! `vmscope compare`: sessions of several configurations against a base.

use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_report::compare::{compare, render_csv, render_table, svg, CompareOptions};
use vmscope_report::{parse_fields, Classes, GroupKey, ReportOptions};
use vmscope_store::Session;

#[derive(Args, Debug)]
#[command(
    after_help = "What it prints (menon2005 §6):\n  - each event's total count in every session, normalized to BASE (Figs 4-6);\n  - misses per instruction for each miss event (cache-misses, LLC-load-misses, dTLB-load-misses,\n    iTLB-load-misses, branch-misses) when the sessions have instructions, and their ratio to BASE;\n  - the instruction cost ratio = instructions ratio / throughput ratio, with --throughput or the\n    sessions' benchmark samples (metric throughput);\n  - per --by key, each session's share of the event and its change against BASE in points,\n    largest movers first.\nEvents are matched by name; events only some sessions have are listed and left out. With\ncpu-clock alone it compares CPU time and says which ratios need which hardware events.\n\nExamples:\n  vmscope compare linux.db dom0.db --throughput 2462,1878 --svg fig4.svg\n  vmscope compare base.db tuned.db --by domain,class"
)]
pub struct CompareArgs {
    /// The base session, then one or more others.
    #[arg(required = true, num_args = 1.., value_name = "SESSION")]
    pub files: Vec<PathBuf>,
    /// Throughput of each session, BASE first, comma-separated (any unit, the same for all).
    #[arg(long, value_name = "B,O…")]
    pub throughput: Option<String>,
    /// Keys of the per-key deltas: domain, context, class, symbol, image,
    /// process (comma-separated).
    #[arg(long, default_value = "symbol")]
    pub by: String,
    /// Event of the deltas (default: the first event every session has).
    #[arg(short = 'e', long)]
    pub event: Option<String>,
    /// Delta rows shown.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub limit: usize,
    /// merged (default), host or agent measurements.
    #[arg(long, default_value = "merged")]
    pub view: String,
    /// table, json or csv.
    #[arg(short = 'f', long, default_value = "table")]
    pub format: String,
    /// Also write the normalized counts as an SVG bar chart (menon2005 Fig 4).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Replace the --svg FILE whatever regular file it is (never a device,
    /// directory or one of the sessions).
    #[arg(long, requires = "svg")]
    pub force: bool,
    /// Class rules (TOML) for `--by class`.
    #[arg(long, value_name = "FILE")]
    pub classes: Option<PathBuf>,
}

pub fn run(args: CompareArgs) -> anyhow::Result<ExitCode> {
    if args.files.len() < 2 {
        anyhow::bail!(
            "compare needs a base session and at least one other to set against it; \
             give two or more session files (vmscope compare BASE.db OTHER.db ...)"
        );
    }
    let by: Vec<GroupKey> = parse_fields(&args.by)?;
    let view = match args.view.as_str() {
        "merged" => vmscope_store::View::Merged,
        "host" => vmscope_store::View::Host,
        "agent" => vmscope_store::View::Agent,
        v => anyhow::bail!("unknown view '{v}'; views: merged, host, agent"),
    };
    if !matches!(args.format.as_str(), "table" | "text" | "json" | "csv") {
        anyhow::bail!(
            "unknown format '{}'; formats: table, json, csv",
            args.format
        );
    }
    let throughput = match &args.throughput {
        None => None,
        Some(t) => Some(
            t.split(',')
                .map(|v| {
                    v.trim().parse::<f64>().map_err(|_| {
                        anyhow::anyhow!("--throughput {t}: '{}' is not a number", v.trim())
                    })
                })
                .collect::<anyhow::Result<Vec<f64>>>()?,
        ),
    };
    let classes = match &args.classes {
        Some(p) => Classes::from_file(p)?,
        None => Classes::builtin(),
    };
    let inputs: Vec<&std::path::Path> = args.files.iter().map(PathBuf::as_path).collect();
    let svg_opts = vmscope_store::output::OutputOptions::new(args.force, &inputs);
    if let Some(p) = &args.svg {
        // Before any work: a chart that could not be written is said now.
        vmscope_store::output::check_output(
            p,
            vmscope_store::output::OutputKind::Artifact,
            &svg_opts,
        )?;
    }
    let (sessions, _copies): (Vec<Session>, Vec<_>) = args
        .files
        .iter()
        .map(|f| crate::args::open_session(f))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let opts = CompareOptions {
        by,
        throughput,
        event: args.event.clone(),
        view,
        limit: args.limit,
        report: ReportOptions {
            classes,
            ..ReportOptions::default()
        },
    };
    let c = compare(&sessions, &opts)?;
    if let Some(p) = &args.svg {
        // Checked and written atomically; never over one of the sessions.
        vmscope_store::output::write_artifact(p, &svg_opts, svg(&c).as_bytes())?;
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match args.format.as_str() {
        "json" => {
            serde_json::to_writer_pretty(&mut out, &c)?;
            writeln!(out)?;
        }
        "csv" => render_csv(&c, &mut out)?,
        _ => render_table(&c, &mut out)?,
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
