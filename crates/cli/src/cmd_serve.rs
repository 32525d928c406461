//! `vmscope serve`: Prometheus metrics of every VM on this host, and with
//! `--profile` a rolling pprof endpoint (`vmscope_serve`).

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;

#[derive(Args)]
#[command(after_help = "Endpoints:\n  \
/metrics                        OpenMetrics counters (vmscope_vcpu_run_seconds_total{domain,vcpu} and the rest), sampled at each scrape\n  \
/debug/pprof/profile?seconds=N  with --profile: gzipped pprof of the next N seconds (default 30, at most --profile-window)\n                                  \
of the host and its active VMs, labels vm, context, process, vcpu, cpu; HTTP 400 for a bad N\n\n\
Examples:\n  \
vmscope serve --per-cpu       /metrics on 127.0.0.1:9464, per-CPU series too\n  \
vmscope serve --profile       and a rolling recording at /debug/pprof/profile\n  \
go tool pprof -top -tagfocus vm=vm0 'http://127.0.0.1:9464/debug/pprof/profile?seconds=10'")]
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
    /// Keep a rolling recording of the host and its active VMs (cpu-clock)
    /// and answer /debug/pprof/profile?seconds=N with a pprof of it.
    #[arg(long)]
    profile: bool,
    /// Sampling frequency of the rolling recording (host and agents), Hz.
    #[arg(long, default_value_t = 99, value_parser = crate::args::hertz,
          allow_negative_numbers = true, requires = "profile")]
    profile_frequency: u64,
    /// Seconds the rolling recording keeps: the largest seconds=N served.
    #[arg(long, default_value_t = 60, value_parser = crate::args::whole_seconds,
          allow_negative_numbers = true, requires = "profile")]
    profile_window: u64,
    /// Leave call stacks out of the rolling recording (less overhead; each
    /// sample is then its function alone).
    #[arg(long, requires = "profile")]
    profile_no_stacks: bool,
    /// Role of a VM in the rolling recording, NAME=active|passive|unmonitored
    /// (repeatable). Default: active where its agent answers.
    #[arg(long = "vm", value_name = "NAME=ROLE", requires = "profile")]
    vm_roles: Vec<String>,
    /// Keep the rolling recording's cost within PCT % of the CPU each
    /// profiler observes (the host recorder: the host's CPUs; each active
    /// VM's agent: the guest's), lowering its rate when it costs more (never
    /// below 10 Hz, never above --profile-frequency). Default 1 %. Costs and
    /// rates: vmscope_profiler_* in /metrics and each profile's session.
    #[arg(long, value_name = "PCT", value_parser = vmscope_model::budget::parse_budget_pct,
          allow_negative_numbers = true, requires = "profile")]
    overhead_budget: Option<f64>,
    /// Sample at --profile-frequency whatever it costs (costs are still
    /// measured and exported).
    #[arg(long, requires = "profile", conflicts_with = "overhead_budget")]
    no_overhead_budget: bool,
}

/// The longest `--profile-window`: the window is kept in memory.
const MAX_PROFILE_WINDOW: u32 = 3600;

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    crate::args::check_pids("--shared-io", &a.shared_io)?;
    let profile = if a.profile {
        Some(vmscope_serve::profile::ProfileOptions {
            frequency: a.profile_frequency,
            callchain: !a.profile_no_stacks,
            window: u32::try_from(a.profile_window)
                .ok()
                .filter(|w| *w <= MAX_PROFILE_WINDOW)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--profile-window {}: at most {MAX_PROFILE_WINDOW} s (an hour): the window is held in memory; \
                         for longer history scrape /debug/pprof/profile periodically",
                        a.profile_window
                    )
                })?,
            roles: crate::args::vm_roles(&a.vm_roles)?,
            overhead_budget: if a.no_overhead_budget {
                None
            } else {
                Some(
                    a.overhead_budget
                        .unwrap_or(vmscope_serve::profile::DEFAULT_BUDGET),
                )
            },
        })
    } else {
        None
    };
    let profiling = profile.is_some();
    let server = vmscope_serve::Server::bind(&vmscope_serve::ServeOptions {
        listen: a.listen,
        per_cpu: a.per_cpu,
        shared_io: a.shared_io,
        profile,
    })?;
    eprintln!("vmscope serve: http://{}/metrics", server.local_addr());
    for w in server.warnings() {
        eprintln!(
            "vmscope serve: warning: {}",
            vmscope_model::text::visible(&w)
        );
    }
    if profiling {
        eprintln!(
            "vmscope serve: http://{}/debug/pprof/profile?seconds=N",
            server.local_addr()
        );
    }
    // Ctrl-C, SIGTERM (systemctl stop) and SIGHUP end it with exit code 0
    // after the request in hand.
    crate::signals::install();
    server.run(crate::signals::stopped());
    if let Some(s) = crate::signals::received() {
        eprintln!("vmscope serve: stopped by {}", crate::signals::name(s));
    }
    Ok(ExitCode::SUCCESS)
}
