//! `vmscope serve`: Prometheus metrics of every VM on this host
//! (`vmscope_serve`).

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

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
    #[arg(long = "shared-io", value_name = "PID")]
    shared_io: Vec<u32>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    let server = vmscope_serve::Server::bind(&vmscope_serve::ServeOptions {
        listen: a.listen,
        per_cpu: a.per_cpu,
        shared_io: a.shared_io,
    })?;
    eprintln!("vmscope serve: http://{}/metrics", server.local_addr());
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    server.run(&STOP);
    Ok(ExitCode::SUCCESS)
}
