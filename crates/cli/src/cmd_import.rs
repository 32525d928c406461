//! `vmscope import`: turn a perf.data written by `perf record` into a session.

use anyhow::Context as _;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vmscope_engine::import::{import, ImportOptions};
use vmscope_symbols::SymbolizerOptions;

#[derive(Args, Debug)]
#[command(
    after_help = "Guest-mode samples (perf kvm, or perf record on a KVM host) become guest-kernel /\nguest-user contexts of a VM named after the vCPU thread's process (pidNNN) unless a\nrunning VM owns the thread. --guest-kallsyms resolves their kernel addresses.\n\nExample:\n  perf record -a -g -o perf.data -- sleep 5 && vmscope import perf.data && vmscope report"
)]
pub struct ImportArgs {
    /// perf.data file written by `perf record`.
    pub input: PathBuf,
    /// Session file to write (replaced only when the import succeeds).
    #[arg(short = 'o', long = "output", default_value = "vmscope.db")]
    pub output: PathBuf,
    /// Guest kernel symbols (a copy of the guest's /proc/kallsyms) for guest-kernel samples.
    #[arg(long)]
    pub guest_kallsyms: Option<PathBuf>,
    /// Look up binaries under this directory instead of / (like perf --symfs).
    #[arg(long)]
    pub symfs: Option<PathBuf>,
    /// Host kernel symbols from this file instead of /proc/kallsyms.
    #[arg(long)]
    pub kallsyms: Option<PathBuf>,
}

pub fn run(args: ImportArgs) -> anyhow::Result<ExitCode> {
    let threads = vmscope_engine::plan::vm_map(&Default::default()).threads;
    let opts = ImportOptions {
        symbolizer: SymbolizerOptions {
            kallsyms: args.kallsyms.clone(),
            symfs: args.symfs.clone(),
            ..SymbolizerOptions::default()
        },
        guest_kallsyms: args.guest_kallsyms.clone(),
        threads,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        meta: vec![(crate::VERSION_META_KEY.into(), crate::VERSION.into())],
    };
    let s = import(&args.input, &args.output, opts)
        .with_context(|| format!("importing {}", args.input.display()))?;
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
