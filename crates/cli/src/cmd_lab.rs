//! `vmscope lab` (placeholder until implemented).

use clap::Args;
use std::process::ExitCode;

#[derive(Args)]
pub struct LabArgs {}

pub fn run(_args: LabArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'vmscope lab' is not implemented yet")
}
