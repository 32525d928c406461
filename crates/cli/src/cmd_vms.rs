//! `vmscope vms` (placeholder until implemented).

use clap::Args;
use std::process::ExitCode;

#[derive(Args)]
pub struct VmsArgs {}

pub fn run(_args: VmsArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'vmscope vms' is not implemented yet")
}
