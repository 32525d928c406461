//! `vmscope demo`: the built-in known-answer workload (three functions at
//! 50/30/20 % of its CPU), to check profiles against perf and the truth.

use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Run for this many seconds.
    #[arg(short = 'd', long = "seconds", default_value_t = 5.0,
          value_parser = crate::args::seconds, allow_negative_numbers = true)]
    pub seconds: f64,
    /// Worker threads, each running the same mix.
    #[arg(short = 't', long, default_value_t = 1,
          value_parser = crate::args::threads, allow_negative_numbers = true)]
    pub threads: usize,
    /// Print the rounds completed (a throughput figure) when done.
    #[arg(long)]
    pub print_rounds: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let rounds = vmscope_workload::run(Duration::from_secs_f64(args.seconds), args.threads);
    if args.print_rounds {
        println!("{rounds}");
    }
    Ok(ExitCode::SUCCESS)
}
