//! `vmscope import`: turn a perf.data written by `perf record` into a session.

use anyhow::Context as _;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_engine::import::{import, ImportInput, ImportOptions};
use vmscope_store::output::{OutputOptions, SessionOutput};
use vmscope_symbols::SymbolizerOptions;

#[derive(Args, Debug)]
#[command(
    after_help = "Guest-mode samples (perf kvm, or perf record on a KVM host) become guest-kernel /\nguest-user contexts of a VM named after the vCPU thread's process (pidNNN) unless a\nrunning VM owns the thread. --guest-kallsyms resolves their kernel addresses.\n\nExamples:\n  perf record -a -g -o perf.data -- sleep 5 && vmscope import perf.data && vmscope report\n  perf record -a -o - -- sleep 5 | vmscope import -     (pipe format on standard input)"
)]
pub struct ImportArgs {
    /// perf.data file written by `perf record`, or - for standard input
    /// (`perf record -o -`'s pipe format, or a file piped in).
    pub input: PathBuf,
    /// Session file to write (replaced only when the import succeeds).
    #[arg(short = 'o', long = "output", default_value = "vmscope.db")]
    pub output: PathBuf,
    /// Replace the -o file even if it is not a vmscope session (never a
    /// device, FIFO, directory or the input).
    #[arg(long)]
    pub force: bool,
    /// Guest kernel symbols (a copy of the guest's /proc/kallsyms) for guest-kernel samples.
    #[arg(long)]
    pub guest_kallsyms: Option<PathBuf>,
    /// Look up binaries under this directory instead of / (like perf --symfs).
    #[arg(long)]
    pub symfs: Option<PathBuf>,
    /// Host kernel symbols from this file instead of /proc/kallsyms.
    #[arg(long)]
    pub kallsyms: Option<PathBuf>,
    /// When kernel and binary addresses get their names: `now` (while
    /// importing) or `later` (at the session's first read, on this host,
    /// before it reboots), as for record.
    #[arg(long, value_enum, value_name = "WHEN", default_value = "now")]
    pub symbolize: crate::args::SymbolizeWhen,
}

pub fn run(args: ImportArgs) -> anyhow::Result<ExitCode> {
    let input = ImportInput::from_arg(&args.input);
    if let Some(k) = &args.kallsyms {
        crate::args::check_kallsyms(k)?;
    }
    if let Some(d) = &args.symfs {
        crate::args::check_symfs(d)?;
    }
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let mut inputs: Vec<PathBuf> = args
        .guest_kallsyms
        .iter()
        .chain(&args.kallsyms)
        .cloned()
        .collect();
    if let ImportInput::File(p) = &input {
        inputs.push(p.clone());
    }
    let output = SessionOutput::prepare(
        &args.output,
        &OutputOptions {
            force: args.force,
            inputs,
        },
        &command_line,
    )?;
    let threads = vmscope_engine::plan::vm_map(&Default::default()).threads;
    let opts = ImportOptions {
        symbolizer: SymbolizerOptions {
            kallsyms: args.kallsyms.clone(),
            symfs: args.symfs.clone(),
            line_cache: vmscope_symbols::linecache::default_dir(),
            ..SymbolizerOptions::default()
        },
        defer_symbols: args.symbolize.defer(),
        guest_kallsyms: args.guest_kallsyms.clone(),
        threads,
        command_line,
        meta: vec![(crate::VERSION_META_KEY.into(), crate::VERSION.into())],
    };
    let s = import(&input, output, opts).with_context(|| format!("importing {}", input.name()))?;
    eprintln!(
        "[ vmscope import: {} samples ({} guest-mode, {} lost), {} event(s), written to {} ]",
        s.samples,
        s.guest_samples,
        s.lost,
        s.events.len(),
        s.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
