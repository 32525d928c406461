//! `vmscope serve`: Prometheus metrics of every VM on this host, and with
//! `--profile` a rolling pprof endpoint (`vmscope_serve`).

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
#[command(after_help = "Endpoints:\n  \
/metrics                        OpenMetrics counters (vmscope_vcpu_run_seconds_total{domain,vcpu} and the rest), sampled at each scrape\n  \
/debug/pprof/profile?seconds=N  with --profile: gzipped pprof of the next N seconds (default 30, at most --profile-window)\n                                  \
of the host and its active VMs, labels vm, context, process, vcpu, cpu; HTTP 400 for a bad N\n  \
/                               with --history: a page with each domain's timeline and the report of a range (?from=&to=)\n\n\
Fleets (scrape and push configurations, TLS and tokens, labels, the Grafana dashboard): docs/fleet.md\n\
The history (retention, crash safety, replay, the page): docs/history.md\n\n\
Examples:\n  \
vmscope serve --profile --per-cpu       /metrics and a rolling recording at /debug/pprof/profile\n  \
vmscope serve --profile --export otlp=http://collector:4318 --export-spool /var/lib/vmscope/spool\n  \
vmscope serve --profile --history /var/lib/vmscope/history   a flight recorder for top --replay and report DIR --time")]
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
    /// Culprits of each VM's waiting that get series of their own in
    /// vmscope_vcpu_wait_seconds_total (the first N to rank among an
    /// interval's largest keep them); the rest are summed as culprit=other.
    #[arg(long, value_name = "N", default_value_t = vmscope_stat::metrics::DEFAULT_WAIT_TOP,
          value_parser = crate::args::culprits, allow_negative_numbers = true)]
    wait_culprits: usize,
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
    /// Push to a receiver every --export-interval (repeatable): otlp=URL
    /// (OTLP profiles over HTTP/protobuf, /v1development/profiles),
    /// pyroscope=URL (Pyroscope /ingest, gzipped pprof per VM) — both send
    /// the rolling recording and need --profile — or remote-write=URL (the
    /// /metrics series, Prometheus remote write v1, /api/v1/write). A URL
    /// without a path gets the kind's usual one.
    #[arg(long = "export", value_name = "KIND=URL")]
    exports: Vec<String>,
    /// Seconds between two exports (each profile export is the recording
    /// of exactly those seconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 60,
          value_parser = crate::args::whole_seconds, allow_negative_numbers = true)]
    export_interval: u64,
    /// Give up on a request to a receiver after this many seconds (counted
    /// in vmscope_export_failed_total; the window is kept and retried).
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = crate::args::whole_seconds, allow_negative_numbers = true)]
    export_timeout: u64,
    /// Keep what a receiver has not taken yet in DIR (one directory per
    /// exporter), so it survives the receiver's outage and a restart of
    /// serve; without it the queue is in memory.
    #[arg(long, value_name = "DIR")]
    export_spool: Option<PathBuf>,
    /// The most each exporter's queue (and --export-archive) holds, bytes
    /// with an optional K, M or G; past it the oldest are dropped (counted
    /// in vmscope_export_dropped_total).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = byte_size)]
    export_spool_max: u64,
    /// Also keep each exported profile window as a session file in DIR
    /// (window-<ms>.db, what vmscope report reads), the oldest removed past
    /// --export-spool-max.
    #[arg(long, value_name = "DIR")]
    export_archive: Option<PathBuf>,
    /// Check HTTPS receivers against the CA certificates in this PEM file
    /// (instead of the web's root CAs).
    #[arg(long, value_name = "FILE")]
    export_ca: Option<PathBuf>,
    /// Send "Authorization: Bearer" with the token in FILE (one line; never
    /// give a secret on the command line).
    #[arg(long, value_name = "FILE", conflicts_with = "export_basic_auth_file")]
    export_token_file: Option<PathBuf>,
    /// Send basic authentication with the USER:PASSWORD line in FILE.
    #[arg(long, value_name = "FILE")]
    export_basic_auth_file: Option<PathBuf>,
    /// Tenant sent as X-Scope-OrgID (multi-tenant Pyroscope, Mimir).
    #[arg(long, value_name = "ID")]
    export_tenant: Option<String>,
    /// Serve HTTPS with the certificate chain in this PEM file.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, a PEM file.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require a client certificate signed by a CA in this PEM file.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Require "Authorization: Bearer TOKEN" on every request, the token
    /// read from FILE (never give a secret on the command line).
    #[arg(long, value_name = "FILE", conflicts_with = "auth_basic_file")]
    auth_token_file: Option<PathBuf>,
    /// Require basic authentication with one of the USER:PASSWORD lines of
    /// FILE.
    #[arg(long, value_name = "FILE")]
    auth_basic_file: Option<PathBuf>,
    /// Keep a flight recorder in DIR: every interval what top shows (each
    /// domain's CPU, vCPU states, I/O, lost samples, top functions) and,
    /// with --profile, the rolling profile's rows with their stacks, in
    /// segment files read by top --replay, report DIR --time and the page
    /// at /. Only this recorder's segments are ever removed.
    #[arg(long, value_name = "DIR")]
    history: Option<PathBuf>,
    /// No flight recorder, even where --history is given (the packaged
    /// unit's is turned off by adding this).
    #[arg(long, overrides_with = "history")]
    no_history: bool,
    /// The most the history's segments take together (the oldest are
    /// removed first), bytes with an optional K, M or G.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = byte_size)]
    history_max_size: u64,
    /// Segments older than this are removed: 7d, 12h, 30m.
    #[arg(long, value_name = "AGE", default_value = "7d", value_parser = span)]
    history_max_age: std::time::Duration,
    /// One history interval (1s, 2s, 500ms).
    #[arg(long, value_name = "INTERVAL", default_value = "1s",
          value_parser = vmscope_stat::parse_interval)]
    history_interval: std::time::Duration,
    /// Length of one segment file of the history: 30m, 1h, 30s. Each
    /// segment also stores its schema and the names it uses once (about
    /// 50 KB), and retention removes whole segments.
    #[arg(long, value_name = "LENGTH", default_value = "30m", value_parser = span)]
    history_segment: std::time::Duration,
}

/// `7d`, `12h`, `30m`, `45s`: a positive span of time.
fn span(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let bad = || format!("must be a whole number with s, m, h or d (30s, 10m, 12h, 7d), not '{s}'");
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num.parse().map_err(|_| bad())?;
    let k = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(bad()),
    };
    match n.checked_mul(k) {
        Some(0) => Err(format!("must be longer than zero, not '{s}'")),
        Some(v) => Ok(std::time::Duration::from_secs(v)),
        None => Err(format!("'{s}' is too long")),
    }
}

/// `256M`, `1G`, `4096`: a size in bytes.
fn byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let k: u64 = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => {
            return Err(format!(
                "must be a size in bytes with an optional K, M or G, not '{s}'"
            ))
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("must be a size in bytes with an optional K, M or G, not '{s}'"))?;
    match n.checked_mul(k) {
        Some(0) => Err(format!("must be a positive size, not '{s}'")),
        Some(v) => Ok(v),
        None => Err(format!("'{s}' is too large")),
    }
}

/// The longest `--export-timeout`.
const MAX_EXPORT_TIMEOUT: u64 = 300;

/// The longest `--export-interval`.
const MAX_EXPORT_INTERVAL: u64 = 3600;

/// `--export*` as the serve library takes it; `None` without `--export`.
fn export_plan(a: &ServeArgs) -> Result<Option<vmscope_serve::export::ExportPlan>> {
    use vmscope_export::spec;
    if a.exports.is_empty() {
        for (set, name) in [
            (a.export_spool.is_some(), "--export-spool"),
            (a.export_archive.is_some(), "--export-archive"),
            (a.export_ca.is_some(), "--export-ca"),
            (a.export_token_file.is_some(), "--export-token-file"),
            (
                a.export_basic_auth_file.is_some(),
                "--export-basic-auth-file",
            ),
            (a.export_tenant.is_some(), "--export-tenant"),
        ] {
            if set {
                anyhow::bail!(
                    "{name}: give --export KIND=URL too (nothing is exported without it)"
                );
            }
        }
        return Ok(None);
    }
    let mut specs = Vec::new();
    for e in &a.exports {
        let s = spec::ExportSpec::parse(e)?;
        if s.kind.sends_profiles() && !a.profile {
            anyhow::bail!(
                "--export {e}: {} sends the rolling recording: add --profile",
                s.kind.as_str()
            );
        }
        if specs
            .iter()
            .any(|o: &spec::ExportSpec| o.url == s.url && o.kind == s.kind)
        {
            anyhow::bail!("--export {e}: given twice");
        }
        specs.push(s);
    }
    if a.export_interval > MAX_EXPORT_INTERVAL {
        anyhow::bail!(
            "--export-interval {}: at most {MAX_EXPORT_INTERVAL} s (the recording of an interval is held in memory)",
            a.export_interval
        );
    }
    if a.export_timeout > MAX_EXPORT_TIMEOUT {
        anyhow::bail!(
            "--export-timeout {}: at most {MAX_EXPORT_TIMEOUT} s (a receiver that slow holds the queue)",
            a.export_timeout
        );
    }
    let credential = match (&a.export_token_file, &a.export_basic_auth_file) {
        (Some(f), _) => Some(spec::bearer_from_file(f)?),
        (_, Some(f)) => Some(spec::basic_from_file(f)?),
        _ => None,
    };
    if let Some(t) = &a.export_tenant {
        if t.is_empty() || t.chars().any(|c| c.is_control() || c.is_whitespace()) {
            anyhow::bail!(
                "--export-tenant {t:?}: give a tenant id without spaces or control characters"
            );
        }
    }
    Ok(Some(vmscope_serve::export::ExportPlan {
        specs,
        options: spec::ExportOptions {
            ca: a.export_ca.clone(),
            credential,
            tenant: a.export_tenant.clone(),
            timeout: Some(std::time::Duration::from_secs(a.export_timeout)),
        },
        interval: std::time::Duration::from_secs(a.export_interval),
        spool: a.export_spool.clone(),
        spool_max: a.export_spool_max,
        archive: a.export_archive.clone(),
    }))
}

/// The longest `--profile-window`: the window is kept in memory.
const MAX_PROFILE_WINDOW: u32 = 3600;

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    crate::args::check_pids("--shared-io", &a.shared_io)?;
    let export = export_plan(&a)?;
    let security = vmscope_serve::Security {
        tls: match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some(vmscope_serve::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: a.tls_client_ca.clone(),
            }),
            _ => None,
        },
        auth: vmscope_serve::client_auth(
            a.auth_token_file.as_deref(),
            a.auth_basic_file.as_deref(),
        )
        .map_err(anyhow::Error::msg)?,
    };
    let open_to_all = security.auth.is_none() && a.tls_client_ca.is_none();
    let loopback = a
        .listen
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|s| s.ip().is_loopback())
        || a.listen.starts_with("localhost:");
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
    let history = match (&a.history, a.no_history) {
        (Some(dir), false) => Some(vmscope_serve::history::HistoryPlan {
            options: vmscope_history::HistoryOptions {
                dir: dir.clone(),
                segment: a.history_segment,
                max_size: a.history_max_size,
                max_age: a.history_max_age,
            },
            interval: a.history_interval,
            window: 5,
            functions: 5,
        }),
        _ => None,
    };
    let history_dir = history.as_ref().map(|h| h.options.dir.clone());
    let server = vmscope_serve::Server::bind(&vmscope_serve::ServeOptions {
        listen: a.listen.clone(),
        per_cpu: a.per_cpu,
        wait_culprits: Some(a.wait_culprits),
        shared_io: a.shared_io,
        profile,
        export: export.clone(),
        security,
        history,
    })?;
    let scheme = server.scheme();
    eprintln!("vmscope serve: {scheme}://{}/metrics", server.local_addr());
    if open_to_all && !loopback {
        eprintln!(
            "vmscope serve: warning: {} is reachable off this host without authentication: VM names \
             and guest functions are tenant data (--auth-token-file, --auth-basic-file, --tls-client-ca)",
            a.listen
        );
    }
    if let Some(plan) = &export {
        for s in &plan.specs {
            eprintln!(
                "vmscope serve: exporting to {} ({}) every {} s",
                s.url,
                s.kind.as_str(),
                plan.interval.as_secs()
            );
        }
    }
    for w in server.warnings() {
        eprintln!(
            "vmscope serve: warning: {}",
            vmscope_model::text::visible(&w)
        );
    }
    if let Some(d) = &history_dir {
        eprintln!(
            "vmscope serve: history in {} (the page: {scheme}://{}/)",
            d.display(),
            server.local_addr()
        );
    }
    if profiling {
        eprintln!(
            "vmscope serve: {scheme}://{}/debug/pprof/profile?seconds=N",
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
