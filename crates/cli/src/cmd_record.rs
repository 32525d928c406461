//! `vmscope record`: sample the host (and, through attribution, its VMs)
//! into a session file.

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vmscope_engine::plan::{plan_session, PlanRequest};
use vmscope_engine::record::{check_command, record, RecordOptions, Scope};
use vmscope_model::text::visible;
use vmscope_model::{EventSpec, SampleRate, DEFAULT_FREQUENCY};
use vmscope_store::output::{OutputOptions, SessionOutput};
use vmscope_symbols::SymbolizerOptions;

#[derive(Args, Debug)]
#[command(
    after_help = "VMs with a running agent are profiled active (guest functions, processes and call \
stacks from inside), the others passive (the host's view of their vCPU threads); --vm sets a role. \
The report header's # cost lines say what profiling cost each side.\n\n\
Stop early with Ctrl-C (or SIGTERM, SIGHUP); the session keeps what was recorded.\n\
The session is written as FILE.partial and renamed to FILE when complete: an existing\n\
FILE stays intact until then, and a killed recorder leaves FILE.partial readable.\n\
-o replaces only a vmscope session (--force: any regular file), never a device,\n\
FIFO or directory; one recorder at a time writes a session file (FILE.lock).\n\n\
Examples:\n  \
vmscope record -a -g -d 10                every CPU and every VM, call stacks, 10 s\n  \
vmscope record -a -d 8 --vm vm0=active    the host and VM vm0's guest functions\n  \
vmscope record -g -F 999 -- ./app args    one command and its children"
)]
pub struct RecordArgs {
    /// Sample every CPU (system-wide).
    #[arg(short = 'a', long = "all-cpus")]
    pub all: bool,
    /// Sample these processes (and threads they create), comma-separated.
    #[arg(short = 'p', long = "pid", value_delimiter = ',', value_parser = crate::args::pid,
          allow_negative_numbers = true, conflicts_with = "all")]
    pub pids: Vec<u32>,
    /// Event to sample, NAME[:PERIOD]: cpu-clock (default), task-clock, cycles,
    /// instructions, cache-misses, LLC-load-misses, dTLB-load-misses,
    /// iTLB-load-misses, branch-misses, page-faults, context-switches, or raw rNNNN.
    /// Repeatable. Without :PERIOD the event is sampled at -F HZ.
    #[arg(short = 'e', long = "event")]
    pub events: Vec<String>,
    /// Sampling frequency in Hz per CPU, for events given without a period.
    #[arg(short = 'F', long = "freq", default_value_t = DEFAULT_FREQUENCY,
          value_parser = crate::args::hertz, allow_negative_numbers = true)]
    pub freq: u64,
    /// Record call stacks (frame pointers).
    #[arg(short = 'g', long = "call-graph")]
    pub callchain: bool,
    /// Stop after this many seconds (a command still running then is stopped).
    #[arg(short = 'd', long = "duration", value_parser = crate::args::seconds,
          allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Session file to write (replaced only when the recording is complete).
    #[arg(short = 'o', long = "output", default_value = "vmscope.db")]
    pub output: PathBuf,
    /// Replace the -o file even if it is not a vmscope session (never a
    /// device, FIFO or directory).
    #[arg(long)]
    pub force: bool,
    /// Keep profiling's cost within PCT % of the CPU each profiler observes
    /// (the host recorder: the host's CPUs; each active VM's agent: the
    /// guest's), lowering its sampling rate when it costs more (never below
    /// 10 Hz, never above -F). The cost and rates used are in the report
    /// header either way.
    #[arg(long, value_name = "PCT", value_parser = vmscope_model::budget::parse_budget_pct,
          allow_negative_numbers = true)]
    pub overhead_budget: Option<f64>,
    /// Look up binaries under this directory instead of / (like perf --symfs).
    #[arg(long)]
    pub symfs: Option<PathBuf>,
    /// Kernel symbols from this file instead of /proc/kallsyms.
    #[arg(long)]
    pub kallsyms: Option<PathBuf>,
    /// When kernel and binary addresses get their names: `later` leaves
    /// them to the session's first read (report or compare resolves them
    /// once, on this host, before it reboots), so recording reads no symbol
    /// table; `now` resolves while recording (a session to be read on
    /// another host, or binaries about to be deleted).
    #[arg(long, value_enum, value_name = "WHEN", default_value = "later")]
    pub symbolize: crate::args::SymbolizeWhen,
    /// Ring buffer size per CPU in pages (power of two); 0: chosen from the rate and -g,
    /// enough for 0.25 s of samples (1 MiB up to 32 MiB per CPU).
    #[arg(short = 'm', long = "mmap-pages", default_value_t = 0,
          value_parser = crate::args::pages, allow_negative_numbers = true)]
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
    #[arg(long, default_value_t = 15.0, value_parser = crate::args::seconds,
          allow_negative_numbers = true)]
    pub barrier_timeout: f64,
    /// Fail instead of continuing when an active VM's agent is not ready in time.
    #[arg(long)]
    pub strict: bool,
    /// Command to run and profile (recording ends when it exits).
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub fn run(args: RecordArgs) -> anyhow::Result<ExitCode> {
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
    let duration = args.duration.map(Duration::from_secs_f64);
    if !args.command.is_empty() {
        check_command(&args.command)?;
    }
    if let Some(k) = &args.kallsyms {
        crate::args::check_kallsyms(k)?;
    }
    if let Some(d) = &args.symfs {
        crate::args::check_symfs(d)?;
    }
    let roles = crate::args::vm_roles(&args.vm_roles)?;
    let mut guest_kallsyms = Vec::new();
    let mut inputs = Vec::new();
    for g in &args.guest_kallsyms {
        let (name, path) = g
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--guest-kallsyms {g}: expected NAME=PATH"))?;
        let k = vmscope_symbols::Kallsyms::from_path(std::path::Path::new(path))?;
        guest_kallsyms.push((name.to_string(), k));
        inputs.push(PathBuf::from(path));
    }
    inputs.extend(args.kallsyms.iter().cloned());
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    // From here on a signal stops the recording (or, before it starts,
    // the command) instead of killing the process with the lock held.
    crate::signals::install();
    // The output is checked and locked before anything starts.
    let output = SessionOutput::prepare(
        &args.output,
        &OutputOptions {
            force: args.force,
            inputs,
        },
        &command_line,
    )?;
    if output.replaces_partial() {
        eprintln!(
            "vmscope: replacing {}, a partial recording an earlier run left",
            output.partial().display()
        );
    }
    let partial = output.partial().to_path_buf();
    if duration.is_none() && args.command.is_empty() {
        eprintln!("vmscope: recording until Ctrl-C (give -d SECONDS to stop by itself)");
    }
    let plan = plan_session(PlanRequest {
        roles,
        guest_kallsyms,
        hello_timeout: Duration::from_secs(3),
        strict: args.strict,
        ..PlanRequest::default()
    })?;
    crate::signals::check("planning the session")?;
    for v in plan.fallbacks() {
        eprintln!(
            "vmscope: VM {}: profiled as {}",
            visible(&v.name),
            visible(&v.describe())
        );
    }
    let opts = RecordOptions {
        events: events.clone(),
        scope,
        command: (!args.command.is_empty()).then(|| args.command.clone()),
        callchain: args.callchain,
        duration,
        output,
        symbolizer: SymbolizerOptions {
            kallsyms: args.kallsyms.clone(),
            symfs: args.symfs.clone(),
            ..SymbolizerOptions::default()
        },
        defer_symbols: args.symbolize.defer(),
        plan,
        command_line,
        ring_pages: args.mmap_pages,
        flush_interval: Duration::from_millis(500),
        meta: vec![(crate::VERSION_META_KEY.into(), crate::VERSION.into())],
        barrier_timeout: Duration::from_secs_f64(args.barrier_timeout),
        overhead_budget: args.overhead_budget,
        exit_after: true,
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
    let summary = match record(opts, crate::signals::stopped(), &mut progress) {
        Ok(s) => s,
        Err(e) => {
            bar.finish_and_clear();
            let kept = if partial.is_file() {
                format!(
                    " ({} is unchanged; what was recorded is in {})",
                    args.output.display(),
                    partial.display()
                )
            } else {
                String::new()
            };
            return Err(anyhow::Error::new(e)
                .context(format!("recording into {}{kept}", args.output.display())));
        }
    };
    bar.finish_and_clear();
    for n in &summary.notes {
        eprintln!("vmscope: {}", visible(n));
    }
    if args.strict && !summary.notes.is_empty() {
        anyhow::bail!("--strict: not every VM took part as asked (see above)");
    }
    let lost = match summary.lost_behind {
        0 => format!("{} lost", summary.lost),
        d => format!(
            "{} lost: {} in the kernel's rings, {d} while conversion was behind",
            summary.lost,
            summary.lost.saturating_sub(d)
        ),
    };
    eprintln!(
        "[ vmscope record: {} samples ({lost}) in {:.2} s written to {}{} ]",
        summary.samples,
        summary.duration.as_secs_f64(),
        summary.output.display(),
        if args.symbolize.defer() {
            "; its first report resolves the symbols"
        } else {
            ""
        }
    );
    Ok(match summary.command_status {
        Some(c) if c != 0 => ExitCode::from(c.clamp(1, 255) as u8),
        _ => ExitCode::SUCCESS,
    })
}
