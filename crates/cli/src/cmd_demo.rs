//! `vmscope demo`: the built-in known-answer workload (three functions at
//! 50/30/20 % of its CPU), to check profiles against perf and the truth.

use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(
    after_help = "Three functions, alpha, beta and gamma, at 50, 30 and 20 % of each thread's CPU: a \
known answer to check a profile against. In guests the agent runs the same workload \
(vmscope-agent demo -d SECONDS -t THREADS -u DUTY_PCT).\n\n\
Examples:\n  \
vmscope demo -t 2 -d 10                   two threads for 10 s\n  \
vmscope record -g -- vmscope demo -d 5    the profile should read 50/30/20"
)]
pub struct DemoArgs {
    /// Run for this many seconds.
    #[arg(short = 'd', long = "seconds", default_value_t = 5.0,
          value_parser = crate::args::seconds, allow_negative_numbers = true)]
    pub seconds: f64,
    /// Worker threads, each running the same mix.
    #[arg(short = 't', long, default_value_t = 1,
          value_parser = crate::args::threads, allow_negative_numbers = true)]
    pub threads: usize,
    /// Percent of every 100 ms each thread works; it sleeps the rest (a
    /// partial load; 100 never sleeps).
    #[arg(short = 'u', long, default_value_t = 100.0, value_parser = duty)]
    pub duty: f64,
    /// Print the rounds completed (a throughput figure) when done.
    #[arg(long)]
    pub print_rounds: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let rounds = vmscope_workload::run_duty(
        Duration::from_secs_f64(args.seconds),
        args.threads,
        args.duty,
    );
    if args.print_rounds {
        println!("{rounds}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--duty`: a percentage above 0 (0 would be no workload at all).
fn duty(s: &str) -> Result<f64, String> {
    match crate::args::percent(s)? {
        0.0 => Err("must be above 0 (0 % would run nothing)".into()),
        v => Ok(v),
    }
}
