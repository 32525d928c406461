//! `vmscope serve`: Prometheus metrics of every VM on this host
//! (`vmscope_serve`).

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;

#[derive(Args)]
#[command(
    after_help = "Endpoints:\n  /metrics   OpenMetrics counters (vmscope_vcpu_run_seconds_total{domain,vcpu} and the rest), sampled at each scrape\n\nExample:\n  vmscope serve --listen 127.0.0.1:9464 --per-cpu\n  curl -s http://127.0.0.1:9464/metrics | grep vmscope_vcpu_run"
)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default: VM names and profiles are tenant data).
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: String,
    /// Also export per-host-CPU series: busy time, and time per VM (vm-stat).
    #[arg(long)]
    per_cpu: bool,
    /// A process whose CPU is shared I/O work for all VMs (repeatable).
    #[arg(long = "shared-io", value_name = "PID", value_parser = crate::args::pid,
          allow_negative_numbers = true)]
    shared_io: Vec<u32>,
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    crate::args::check_pids("--shared-io", &a.shared_io)?;
    let server = vmscope_serve::Server::bind(&vmscope_serve::ServeOptions {
        listen: a.listen,
        per_cpu: a.per_cpu,
        shared_io: a.shared_io,
    })?;
    eprintln!("vmscope serve: http://{}/metrics", server.local_addr());
    // Ctrl-C, SIGTERM (systemctl stop) and SIGHUP end it with exit code 0
    // after the request in hand.
    crate::signals::install();
    server.run(crate::signals::stopped());
    if let Some(s) = crate::signals::received() {
        eprintln!("vmscope serve: stopped by {}", crate::signals::name(s));
    }
    Ok(ExitCode::SUCCESS)
}
