//! `vmscope record`: sample the host (and, through attribution, its VMs)
//! into a session file.

use anyhow::Context as _;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use vmscope_engine::plan::{plan_session, PlanRequest};
use vmscope_engine::record::{record, RecordOptions, Scope};
use vmscope_model::{EventSpec, Role, SampleRate, DEFAULT_FREQUENCY};
use vmscope_symbols::SymbolizerOptions;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  vmscope record -a -d 10            every CPU for 10 s\n  vmscope record -a -g -- sleep 5    every CPU with call stacks while a command runs\n  vmscope record -e cpu-clock:250000 -- ./app   a command, one sample per 250 µs of CPU\n  vmscope record -p 1234,5678 -F 999 -d 30\n\nStop early with Ctrl-C; the session keeps what was recorded."
)]
pub struct RecordArgs {
    /// Sample every CPU (system-wide).
    #[arg(short = 'a', long = "all-cpus")]
    pub all: bool,
    /// Sample these processes (and threads they create), comma-separated.
    #[arg(short = 'p', long = "pid", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Event to sample, NAME[:PERIOD]: cpu-clock (default), task-clock, cycles,
    /// instructions, cache-misses, LLC-load-misses, dTLB-load-misses,
    /// iTLB-load-misses, branch-misses, page-faults, context-switches, or raw rNNNN.
    /// Repeatable. Without :PERIOD the event is sampled at -F HZ.
    #[arg(short = 'e', long = "event")]
    pub events: Vec<String>,
    /// Sampling frequency in Hz per CPU, for events given without a period.
    #[arg(short = 'F', long = "freq", default_value_t = DEFAULT_FREQUENCY)]
    pub freq: u64,
    /// Record call stacks (frame pointers).
    #[arg(short = 'g', long = "call-graph")]
    pub callchain: bool,
    /// Stop after this many seconds.
    #[arg(short = 'd', long = "duration")]
    pub duration: Option<f64>,
    /// Session file to write.
    #[arg(short = 'o', long = "output", default_value = "vmscope.db")]
    pub output: PathBuf,
    /// Look up binaries under this directory instead of / (like perf --symfs).
    #[arg(long)]
    pub symfs: Option<PathBuf>,
    /// Kernel symbols from this file instead of /proc/kallsyms.
    #[arg(long)]
    pub kallsyms: Option<PathBuf>,
    /// Ring buffer size per CPU in pages (power of two).
    #[arg(short = 'm', long = "mmap-pages", default_value_t = 0)]
    pub mmap_pages: usize,
    /// Role of a VM in the session, NAME=active|passive|unmonitored (repeatable).
    /// Default: active where its agent answers, passive elsewhere.
    #[arg(long = "vm", value_name = "NAME=ROLE")]
    pub vm_roles: Vec<String>,
    /// Guest kernel symbols for a passive VM's guest-kernel samples (KVM
    /// hosts), NAME=PATH to a copy of the guest's /proc/kallsyms (repeatable).
    #[arg(long = "guest-kallsyms", value_name = "NAME=PATH")]
    pub guest_kallsyms: Vec<String>,
    /// Seconds each active VM's agent has to become ready before the VM
    /// continues as passive.
    #[arg(long, default_value_t = 15.0)]
    pub barrier_timeout: f64,
    /// Fail instead of continuing when an active VM's agent is not ready in time.
    #[arg(long)]
    pub strict: bool,
    /// Command to run and profile (recording ends when it exits).
    #[arg(last = true)]
    pub command: Vec<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(args: RecordArgs) -> anyhow::Result<ExitCode> {
    if args.freq == 0 {
        anyhow::bail!("-F must be a positive frequency in Hz");
    }
    let names = if args.events.is_empty() {
        vec!["cpu-clock".to_string()]
    } else {
        args.events.clone()
    };
    let mut events = Vec::new();
    for n in &names {
        events.push(EventSpec::parse(n, args.freq)?);
    }
    let scope = if args.all {
        Scope::AllCpus
    } else if !args.pids.is_empty() {
        Scope::Pids(args.pids.clone())
    } else if !args.command.is_empty() {
        Scope::Command
    } else {
        anyhow::bail!("nothing to record: give -a (all CPUs), -p PID, or a command after --");
    };
    let duration = match args.duration {
        Some(d) if d > 0.0 && d.is_finite() => Some(Duration::from_secs_f64(d)),
        Some(d) => anyhow::bail!("-d must be a positive number of seconds, not {d}"),
        None => None,
    };
    if duration.is_none() && args.command.is_empty() {
        eprintln!("vmscope: recording until Ctrl-C (give -d SECONDS to stop by itself)");
    }
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let roles = vm_roles(&args.vm_roles)?;
    let mut guest_kallsyms = Vec::new();
    for g in &args.guest_kallsyms {
        let (name, path) = g
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--guest-kallsyms {g}: expected NAME=PATH"))?;
        let k = vmscope_symbols::Kallsyms::from_path(std::path::Path::new(path))?;
        guest_kallsyms.push((name.to_string(), k));
    }
    if !(args.barrier_timeout > 0.0 && args.barrier_timeout.is_finite()) {
        anyhow::bail!("--barrier-timeout must be a positive number of seconds");
    }
    let plan = plan_session(PlanRequest {
        roles,
        guest_kallsyms,
        hello_timeout: Duration::from_secs(3),
        strict: args.strict,
        ..PlanRequest::default()
    })?;
    for v in plan.fallbacks() {
        eprintln!("vmscope: VM {}: profiled as {}", v.name, v.describe());
    }
    let opts = RecordOptions {
        events: events.clone(),
        scope,
        command: (!args.command.is_empty()).then(|| args.command.clone()),
        callchain: args.callchain,
        duration,
        output: args.output.clone(),
        symbolizer: SymbolizerOptions {
            kallsyms: args.kallsyms.clone(),
            symfs: args.symfs.clone(),
            ..SymbolizerOptions::default()
        },
        plan,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        ring_pages: args.mmap_pages,
        flush_interval: Duration::from_millis(500),
        meta: vec![(crate::VERSION_META_KEY.into(), crate::VERSION.into())],
        barrier_timeout: Duration::from_secs_f64(args.barrier_timeout),
    };
    let rates: Vec<String> = events
        .iter()
        .map(|e| match e.rate {
            SampleRate::Frequency(f) => format!("{} at {f} Hz", e.kind.name()),
            SampleRate::Period(p) => format!("{} every {p}", e.kind.name()),
        })
        .collect();
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let mut progress = |t: Duration, n: u64| {
        bar.set_message(format!(
            "recording {}: {:.0} s, {n} samples",
            rates.join(", "),
            t.as_secs_f64()
        ));
        bar.tick();
    };
    let summary = record(opts, &STOP, &mut progress)
        .with_context(|| format!("recording into {}", args.output.display()))?;
    bar.finish_and_clear();
    for n in &summary.notes {
        eprintln!("vmscope: {n}");
    }
    if args.strict && !summary.notes.is_empty() {
        anyhow::bail!("--strict: not every VM took part as asked (see above)");
    }
    eprintln!(
        "[ vmscope record: {} samples ({} lost) in {:.2} s written to {} ]",
        summary.samples,
        summary.lost,
        summary.duration.as_secs_f64(),
        summary.output.display()
    );
    Ok(match summary.command_status {
        Some(c) if c != 0 => ExitCode::from(c.clamp(1, 255) as u8),
        _ => ExitCode::SUCCESS,
    })
}

/// `--vm NAME=ROLE` arguments (record, top).
pub fn vm_roles(args: &[String]) -> anyhow::Result<Vec<(String, Role)>> {
    let mut roles = Vec::new();
    for r in args {
        let (name, role) = r
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--vm {r}: expected NAME=active|passive|unmonitored"))?;
        let role = match Role::parse(role) {
            Some(x @ (Role::Active | Role::Passive | Role::Unmonitored)) => x,
            _ => anyhow::bail!("--vm {r}: role must be active, passive or unmonitored"),
        };
        roles.push((name.to_string(), role));
    }
    Ok(roles)
}
