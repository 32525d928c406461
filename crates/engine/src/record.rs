//! Live recording: perf_event rings → converter → session file, flushed
//! every `flush_interval` (≤ 1 s) so a killed recorder loses at most that
//! (agent rows: one second more, see `AgentBook::flush`).
//!
//! This module owns the command to record (started paused, stopped at the
//! end), the session file's contents and the recording's stages
//! (`Run::session`): the metadata, the start (the one the live session
//! uses too, [`crate::start`]: converter, `/proc`, agents armed, cost
//! baseline, rings enabled), the read loop and its flushes, the agents'
//! bookkeeping (`AgentBook`) and the finish.

use crate::cost::CostBook;
use crate::guest::{GuestEvent, GuestPollers};
use crate::pipeline::ConvertThread;
use crate::plan::SessionPlan;
use crate::start::{ArmOutcome, Sampling, SessionStart, StartOptions};
use crate::{ConverterStats, EngineError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vmscope_linux::ProcRoot;
use vmscope_linux::{Recorder, RingOptions, Target};
use vmscope_model::{Domain, EventSpec, Profile, Role, SessionEvent};
use vmscope_store::output::SessionOutput;
use vmscope_store::{DomainRecord, ScaleRow, SessionWriter};
use vmscope_symbols::{Symbolizer, SymbolizerOptions};

/// How often each active VM's agent is polled.
const AGENT_POLL: Duration = Duration::from_millis(500);

/// What to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every CPU (`-a`).
    AllCpus,
    /// These processes and their children (`-p`).
    Pids(Vec<u32>),
    /// Only the command (`-- CMD`, without `-a`).
    Command,
}

/// Options of one recording.
pub struct RecordOptions {
    pub events: Vec<EventSpec>,
    pub scope: Scope,
    /// Run this command; recording ends when it exits.
    pub command: Option<Vec<String>>,
    pub callchain: bool,
    pub duration: Option<Duration>,
    /// The checked, locked session file ([`SessionOutput::prepare`]): written
    /// as `TARGET.partial` and renamed over the target when complete.
    pub output: SessionOutput,
    pub symbolizer: SymbolizerOptions,
    /// Leave host kernel and file frames for the session's first read to
    /// resolve (`--symbolize later`, crate::symbolize): the recording reads
    /// no kallsyms, ELF or DWARF. `false` resolves while recording.
    pub defer_symbols: bool,
    /// The VMs, their roles and agents ([`crate::plan::plan_session`]).
    pub plan: SessionPlan,
    /// `vmscope record ...` as typed, for the session metadata.
    pub command_line: String,
    /// Ring size in pages per CPU (0 = default).
    pub ring_pages: usize,
    pub flush_interval: Duration,
    /// Extra metadata (e.g. the version that wrote the session).
    pub meta: Vec<(String, String)>,
    /// How long the readiness barrier waits for each agent.
    pub barrier_timeout: Duration,
    /// Keep each profiler's cost (the host recorder's and every active
    /// agent's) within this fraction of the CPU it observes, by lowering
    /// its rate (`--overhead-budget`); `None`: the rates asked for.
    pub overhead_budget: Option<f64>,
    /// The process exits right after the recording (the CLI): the
    /// converter's tables (symbol tables, caches, the interned strings of
    /// every row) are not freed one allocation at a time, which cost a
    /// recording under exec churn a tenth of its CPU. Leave it `false`
    /// where the process goes on (tests, a library caller).
    pub exit_after: bool,
}

/// What a recording produced.
#[derive(Debug, Clone)]
pub struct RecordSummary {
    pub output: PathBuf,
    pub samples: u64,
    pub lost: u64,
    /// Of `lost`, the samples dropped because conversion was behind (the
    /// rest the kernel dropped from full rings).
    pub lost_behind: u64,
    pub duration: Duration,
    /// The command's exit code (128+signal when a signal ended it); `None`
    /// without a command or when vmscope stopped it (see `notes`).
    pub command_status: Option<i32>,
    /// Things the user should know (agents that did not answer, VMs lost,
    /// a command stopped at the end of `-d`).
    pub notes: Vec<String>,
}

/// Called about once a second with (elapsed, samples so far).
pub type Progress<'a> = &'a mut dyn FnMut(Duration, u64);

/// A command started stopped: forked, waiting on a pipe before `execv`,
/// so its events can be opened (with inherit) before it runs a single
/// instruction of the command. `std::process::Command` cannot do this: its
/// `spawn` waits for the exec to happen.
struct PausedChild {
    pid: libc::pid_t,
    release: Option<std::fs::File>,
    /// Read end of a close-on-exec pipe: EOF when `execv` succeeded, the
    /// errno when it failed.
    exec_error: Option<std::fs::File>,
    status: Option<i32>,
}

impl PausedChild {
    fn id(&self) -> u32 {
        self.pid as u32
    }

    fn release(&mut self) {
        if let Some(mut f) = self.release.take() {
            use std::io::Write;
            let _ = f.write_all(b"g");
        }
    }

    /// Exit code (128+signal for a signal) once it has exited.
    fn try_wait(&mut self) -> Option<i32> {
        if self.status.is_some() {
            return self.status;
        }
        let mut st = 0;
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(self.pid, &raw mut st, libc::WNOHANG) };
        if r == self.pid {
            self.status = Some(if libc::WIFEXITED(st) {
                libc::WEXITSTATUS(st)
            } else {
                128 + libc::WTERMSIG(st)
            });
        }
        self.status
    }

    /// Why `execv` failed, once the child has exited (None when it ran).
    fn exec_failure(&mut self) -> Option<std::io::Error> {
        use std::io::Read;
        let mut f = self.exec_error.take()?;
        let mut b = [0u8; 4];
        match f.read_exact(&mut b) {
            Ok(()) => Some(std::io::Error::from_raw_os_error(i32::from_ne_bytes(b))),
            Err(_) => None,
        }
    }

    /// Stop a command that is still running: SIGTERM, then SIGKILL after
    /// `grace`. Returns whether it was still running.
    fn stop(&mut self, grace: Duration) -> bool {
        self.release.take();
        if self.try_wait().is_some() {
            return false;
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < grace {
            if self.try_wait().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_and_wait();
        true
    }

    fn kill_and_wait(&mut self) -> Option<i32> {
        self.release.take();
        if self.try_wait().is_none() {
            // SAFETY: signalling and reaping our own child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                let mut st = 0;
                libc::waitpid(self.pid, &raw mut st, 0);
            }
            self.status = Some(128 + libc::SIGKILL);
        }
        self.status
    }
}

impl Drop for PausedChild {
    fn drop(&mut self) {
        self.kill_and_wait();
    }
}

fn executable(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a valid C string.
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
        && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

/// The file `execv` will run for `prog`, or why it cannot run, checked
/// before anything starts ("not found", "permission denied", "is a
/// directory").
fn resolve_program(prog: &str) -> Result<PathBuf, std::io::Error> {
    use std::io::{Error, ErrorKind};
    let why = |p: &Path| -> Error {
        match std::fs::metadata(p) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                Error::new(ErrorKind::NotFound, format!("{} not found", p.display()))
            }
            Err(e) => e,
            Ok(m) if m.is_dir() => Error::new(
                ErrorKind::PermissionDenied,
                format!("{} is a directory", p.display()),
            ),
            Ok(_) => Error::new(
                ErrorKind::PermissionDenied,
                format!("permission denied: {} is not executable", p.display()),
            ),
        }
    };
    if prog.is_empty() {
        return Err(Error::new(ErrorKind::NotFound, "empty command name"));
    }
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        return if executable(&p) { Ok(p) } else { Err(why(&p)) };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let candidates: Vec<PathBuf> = std::env::split_paths(&path).map(|d| d.join(prog)).collect();
    if let Some(p) = candidates.iter().find(|p| executable(p)) {
        return Ok(p.clone());
    }
    match candidates.iter().find(|p| p.exists()) {
        Some(p) => Err(why(p)),
        None => Err(Error::new(
            ErrorKind::NotFound,
            format!("{prog}: command not found in PATH"),
        )),
    }
}

/// Check that `argv` can be run (found, executable), before anything
/// starts: the error says "not found", "permission denied" or "is a
/// directory", naming the command.
pub fn check_command(argv: &[String]) -> Result<PathBuf, EngineError> {
    let first = argv.first().map(String::as_str).unwrap_or_default();
    resolve_program(first).map_err(|source| EngineError::Spawn {
        command: argv.join(" "),
        source,
    })
}

fn spawn_paused(argv: &[String]) -> Result<PausedChild, EngineError> {
    use std::ffi::CString;
    let spawn_err = |source| EngineError::Spawn {
        command: argv.join(" "),
        source,
    };
    let prog = resolve_program(&argv[0]).map_err(spawn_err)?;
    let c_prog = CString::new(prog.as_os_str().as_encoded_bytes())
        .map_err(|_| spawn_err(std::io::ErrorKind::InvalidInput.into()))?;
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| spawn_err(std::io::ErrorKind::InvalidInput.into()))?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    let (rd, wr) = (fds[0], fds[1]);
    let mut efds = [0i32; 2];
    // SAFETY: as above.
    if unsafe { libc::pipe2(efds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing our own fds.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        return Err(spawn_err(e));
    }
    let (erd, ewr) = (efds[0], efds[1]);
    // SAFETY: between fork and execv the child only calls async-signal-safe
    // functions (close, read, write, execv, _exit) on memory prepared before fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing our own fds.
        unsafe {
            for fd in [rd, wr, erd, ewr] {
                libc::close(fd);
            }
        }
        return Err(spawn_err(e));
    }
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            libc::close(wr);
            libc::close(erd);
            let mut b = [0u8; 1];
            if libc::read(rd, b.as_mut_ptr().cast(), 1) != 1 {
                libc::_exit(127);
            }
            libc::execv(c_prog.as_ptr(), c_argv.as_ptr());
            let errno = *libc::__errno_location();
            let bytes = errno.to_ne_bytes();
            libc::write(ewr, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127);
        }
    }
    // SAFETY: rd and ewr belong to the child now; wr and erd are ours.
    unsafe {
        libc::close(rd);
        libc::close(ewr);
    }
    let release = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(wr) };
    let exec_error = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(erd) };
    Ok(PausedChild {
        pid,
        release: Some(release),
        exec_error: Some(exec_error),
        status: None,
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn sysctl(name: &str) -> String {
    ProcRoot::system().sysctl(name).unwrap_or_default()
}

/// Why the recording loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Command,
    Duration,
    Stop,
    TargetsGone,
}

/// Record until the command exits, the duration ends, every target process
/// is gone, or `stop` is set (SIGINT, SIGTERM, SIGHUP in the CLI). The
/// session is written to the output's partial file and put in place of the
/// target only when complete; a failure after sampling started (a full
/// disk) keeps the partial file.
pub fn record(
    opts: RecordOptions,
    stop: &AtomicBool,
    progress: Progress<'_>,
) -> Result<RecordSummary, EngineError> {
    if opts.events.is_empty() {
        return Err(EngineError::Invalid("no event to record".into()));
    }
    if let Scope::Pids(pids) = &opts.scope {
        for &p in pids {
            if !ProcRoot::system().exists(p) {
                return Err(EngineError::NoSuchProcess(p));
            }
        }
    }
    let mut child: Option<PausedChild> = match &opts.command {
        Some(argv) if !argv.is_empty() => Some(spawn_paused(argv)?),
        _ => None,
    };
    let target = match (&opts.scope, &child) {
        (Scope::AllCpus, _) => Target::AllCpus,
        (Scope::Pids(p), _) => Target::Pids(p.clone()),
        (Scope::Command, Some(c)) => Target::Pids(vec![c.id()]),
        (Scope::Command, None) => {
            return Err(EngineError::Invalid(
                "nothing to record: give -a, -p PID or a command after --".into(),
            ))
        }
    };
    let ring = RingOptions {
        events: opts.events.clone(),
        target: target.clone(),
        callchain: opts.callchain,
        ring_pages: opts.ring_pages,
    };
    let rec = match Recorder::open(&ring) {
        Ok(r) => r,
        Err(e) => {
            if let Some(mut c) = child.take() {
                c.kill_and_wait();
            }
            return Err(e.into());
        }
    };
    let mut output = opts.output;
    let mut writer = output.create_writer()?;
    let mut run = Run {
        rec,
        child,
        target,
        stop,
        progress,
        sampling: false,
    };
    let body = run.session(
        &mut writer,
        opts.plan,
        RunOptions {
            events: &opts.events,
            command_line: &opts.command_line,
            callchain: opts.callchain,
            meta: &opts.meta,
            symbolizer: opts.symbolizer,
            defer_symbols: opts.defer_symbols,
            barrier_timeout: opts.barrier_timeout,
            overhead_budget: opts.overhead_budget,
            flush_interval: opts.flush_interval,
            duration: opts.duration,
            command: opts.command.as_deref(),
            exit_after: opts.exit_after,
        },
    );
    match body {
        Ok(mut summary) => {
            // Everything is recorded: if the last step fails (a full disk
            // while the WAL is folded in), the partial file keeps it.
            output.keep_partial(true);
            let path = output.commit(writer, true)?;
            summary.output = path;
            Ok(summary)
        }
        Err(e) => {
            // Samples stored before a failure (a full disk) are worth
            // keeping under the partial name; nothing else is.
            let spawn_failed = matches!(e, EngineError::Spawn { .. });
            output.keep_partial(run.sampling && !spawn_failed);
            if let EngineError::Store(s) = &e {
                if s.is_disk_full() {
                    // The space set aside at the start is what this takes.
                    writer.release_reserve();
                    let _ = writer.set_meta("stop_reason", &s.to_string());
                }
            }
            drop(writer);
            Err(e)
        }
    }
}

/// What [`Run::session`] needs from the options.
struct RunOptions<'a> {
    events: &'a [EventSpec],
    command_line: &'a str,
    callchain: bool,
    meta: &'a [(String, String)],
    symbolizer: SymbolizerOptions,
    defer_symbols: bool,
    barrier_timeout: Duration,
    overhead_budget: Option<f64>,
    flush_interval: Duration,
    duration: Option<Duration>,
    command: Option<&'a [String]>,
    exit_after: bool,
}

/// One recording in progress.
struct Run<'a, 'p> {
    rec: Recorder,
    child: Option<PausedChild>,
    target: Target,
    stop: &'a AtomicBool,
    progress: Progress<'p>,
    /// Sampling has started (the partial file holds, or will hold, data).
    sampling: bool,
}

/// A recording while it samples: what the read loop, the flushes and the
/// finish share.
struct Recording {
    /// The converter, on its own thread.
    conv: ConvertThread,
    cost: CostBook,
    /// The active agents' polling threads.
    pollers: Option<GuestPollers>,
    agents: AgentBook,
    /// What the closing lines tell the user.
    notes: Vec<String>,
    /// When the read loop began: the recording's duration, its cost steps
    /// and ended VMs count from here.
    t0: Instant,
    /// A recording of every CPU: the scheduler's clocks when sampling
    /// began, and the VMs they follow (name, pid), for the coverage.
    run_clock: Option<(crate::coverage::RunClock, Vec<(String, u32)>)>,
}

impl Run<'_, '_> {
    /// The recording's stages, in order: the session's metadata, the start
    /// (shared with the live session, [`crate::start`]), the read loop with
    /// its flushes, the end of sampling and of the command, the finish.
    fn session(
        &mut self,
        writer: &mut SessionWriter,
        plan: SessionPlan,
        opts: RunOptions<'_>,
    ) -> Result<RecordSummary, EngineError> {
        write_metadata(writer, &opts, &plan, self.rec.cpus().len())?;
        let mut r = self.start(writer, plan, &opts)?;
        let (ended, status) = self.read_loop(writer, &mut r, &opts)?;
        let duration = r.t0.elapsed();
        self.rec.disable()?;
        if let Some((begin, vms)) = r.run_clock.take() {
            let end = crate::coverage::RunClock::after_sampling(&ProcRoot::system(), &vms);
            for (domain, s) in begin.run_since(&end) {
                writer.set_meta(
                    &format!("{}{domain}", vmscope_model::coverage_meta::RUN_S_PREFIX),
                    &format!("{s:.6}"),
                )?;
            }
            for (domain, text) in begin.thread_runs_since(&end) {
                writer.set_meta(
                    &format!(
                        "{}{domain}",
                        vmscope_model::coverage_meta::RUN_THREADS_PREFIX
                    ),
                    &text,
                )?;
            }
            if let Some(p) = begin.steal_pct(&end) {
                writer.set_meta(
                    vmscope_model::coverage_meta::HOST_STEAL_PCT,
                    &format!("{p:.2}"),
                )?;
            }
        }
        let mark = self
            .rec
            .read_bytes(Duration::from_millis(0), |b| r.conv.copy(b))?;
        r.conv.push_read(mark);
        if let Some(note) = self.stop_command(ended, status, &opts) {
            r.notes.push(note);
        }
        r.finish(writer, &mut self.rec, duration, status, opts.exit_after)
    }

    /// Set up the converter, arm the agents and store their outcome
    /// ([`SessionStart`]); unless a signal came meanwhile, move the
    /// converter to its thread, enable sampling and let the command run.
    fn start(
        &mut self,
        writer: &mut SessionWriter,
        plan: SessionPlan,
        opts: &RunOptions<'_>,
    ) -> Result<Recording, EngineError> {
        let symbolizer = if opts.defer_symbols {
            Symbolizer::deferred(opts.symbolizer.clone())
        } else {
            Symbolizer::new(opts.symbolizer.clone())
        };
        let SessionStart {
            conv,
            origin,
            vm_detail,
            armed,
            ready,
        } = SessionStart::begin(
            &mut self.rec,
            StartOptions {
                events: opts.events,
                callchain: opts.callchain,
                symbolizer,
                plan,
                target: &self.target,
                barrier_timeout: opts.barrier_timeout,
                overhead_budget: opts.overhead_budget,
                poll_every: AGENT_POLL,
            },
        )?;
        let mut notes = Vec::new();
        for a in &armed {
            store_arm_outcome(writer, a, &mut notes)?;
        }
        // Stopped while the agents were being armed: no recording at all.
        if self.stop.load(Ordering::Relaxed) {
            return Err(EngineError::Invalid(
                "stopped by a signal before sampling started; nothing was recorded".into(),
            ));
        }
        // From here the converter runs on its own thread: reading the rings
        // never waits on symbol loading, or on conversion (crate::pipeline).
        let conv = ConvertThread::spawn(conv, self.rec.stream())?;
        let vms: Vec<(String, u32)> = vm_detail
            .values()
            .filter_map(|(d, _)| Some((d.name.clone(), d.pid?)))
            .collect();
        // Read before the rings are on: a reading after them would leave
        // out of the run time what was sampled while it read.
        let run_clock = matches!(self.target, Target::AllCpus).then(|| {
            (
                crate::coverage::RunClock::before_sampling(&ProcRoot::system(), &vms),
                vms,
            )
        });
        let Sampling { cost, pollers, .. } = ready.enable(&mut self.rec)?;
        self.sampling = true;
        if let Some(c) = self.child.as_mut() {
            c.release();
        }
        Ok(Recording {
            conv,
            cost,
            pollers,
            agents: AgentBook {
                // The converter's origin for agents' rows too: the second
                // they arrive in.
                t0: Some(origin),
                vms: vm_detail,
                ..AgentBook::default()
            },
            notes,
            t0: Instant::now(),
            run_clock,
        })
    }

    /// Read the rings, hand the reads to the converter and store its
    /// answers and the agents' rows, flushing every `flush_interval`,
    /// until the recording ends: why, and the command's exit status.
    fn read_loop(
        &mut self,
        writer: &mut SessionWriter,
        r: &mut Recording,
        opts: &RunOptions<'_>,
    ) -> Result<(Ended, Option<i32>), EngineError> {
        let watching = self.child.is_some() || matches!(self.target, Target::Pids(_));
        let mut last_flush = Instant::now();
        // A delta was asked for and not yet written.
        let mut asked = false;
        loop {
            let wait = read_wait(
                r.t0.elapsed(),
                last_flush.elapsed(),
                opts.flush_interval,
                opts.duration,
                asked,
                watching,
            );
            let mark = self.rec.read_bytes(wait, |b| r.conv.copy(b))?;
            r.conv.push_read(mark);
            for t in r.conv.try_taken() {
                write_delta(writer, &t.raw, &t.delta)?;
                asked = false;
            }
            r.agent_events(writer)?;
            if last_flush.elapsed() >= opts.flush_interval {
                r.flush(writer, &mut self.rec)?;
                asked = true;
                (self.progress)(r.t0.elapsed(), r.conv.stats().samples);
                last_flush = Instant::now();
            }
            if let Some(end) = self.ended(r.t0, opts)? {
                return Ok(end);
            }
        }
    }

    /// Whether the recording ends now, why, and the command's exit status;
    /// a command that could not be run is an error.
    fn ended(
        &mut self,
        t0: Instant,
        opts: &RunOptions<'_>,
    ) -> Result<Option<(Ended, Option<i32>)>, EngineError> {
        if self.stop.load(Ordering::Relaxed) {
            return Ok(Some((Ended::Stop, None)));
        }
        if opts.duration.is_some_and(|d| t0.elapsed() >= d) {
            return Ok(Some((Ended::Duration, None)));
        }
        if let Some(c) = self.child.as_mut() {
            if let Some(st) = c.try_wait() {
                if let Some(e) = c.exec_failure() {
                    return Err(EngineError::Spawn {
                        command: opts.command.unwrap_or_default().join(" "),
                        source: e,
                    });
                }
                return Ok(Some((Ended::Command, Some(st))));
            }
        }
        if let Target::Pids(p) = &self.target {
            if self.child.is_none() && p.iter().all(|pid| !ProcRoot::system().exists(*pid)) {
                return Ok(Some((Ended::TargetsGone, None)));
            }
        }
        Ok(None)
    }

    /// Stop the command if it still runs (SIGTERM, SIGKILL 2 s later): the
    /// note that says why and how.
    fn stop_command(
        &mut self,
        ended: Ended,
        status: Option<i32>,
        opts: &RunOptions<'_>,
    ) -> Option<String> {
        let mut c = self.child.take()?;
        if status.is_some() || !c.stop(Duration::from_secs(2)) {
            return None;
        }
        let why = match (ended, opts.duration) {
            (Ended::Duration, Some(d)) => {
                format!("-d {} s ended the recording", d.as_secs_f64())
            }
            _ => "the recording was stopped".to_string(),
        };
        Some(format!(
            "{why} while the command ({}) was still running; vmscope stopped it ({})",
            opts.command.unwrap_or_default().join(" "),
            match c.status.map(|s| s - 128) {
                Some(libc::SIGTERM) => "SIGTERM".to_string(),
                Some(libc::SIGKILL) => "SIGKILL, 2 s after SIGTERM".to_string(),
                Some(s) if s > 0 => format!("it ended on signal {s}"),
                _ => format!("it exited with {}", c.status.unwrap_or(0)),
            }
        ))
    }
}

/// The session's metadata before anything starts: events, where and how
/// it was recorded, the domains as planned, the symbolizer's options, and
/// the write-ahead log's checkpoint size.
fn write_metadata(
    writer: &mut SessionWriter,
    opts: &RunOptions<'_>,
    plan: &SessionPlan,
    cpus: usize,
) -> Result<(), EngineError> {
    let events: Vec<SessionEvent> = opts.events.iter().map(SessionEvent::from).collect();
    writer.set_events(&events)?;
    let started = unix_now();
    let hostname = sysctl("kernel.hostname");
    let kernel = sysctl("kernel.osrelease");
    for (k, v) in [
        ("source", "record".to_string()),
        ("command", opts.command_line.to_string()),
        ("hostname", hostname),
        ("kernel", kernel),
        ("cpus", cpus.to_string()),
        ("started_at", format!("{started:.3}")),
        ("callchain", u8::from(opts.callchain).to_string()),
    ] {
        writer.set_meta(k, &v)?;
    }
    for (k, v) in opts.meta.iter().chain(&plan.meta) {
        writer.set_meta(k, v)?;
    }
    writer.upsert_domain(&DomainRecord {
        domain: Domain::host(),
        status: "running".into(),
        ended_at: None,
        detail: String::new(),
    })?;
    for (d, detail) in &plan.domains {
        writer.upsert_domain(&DomainRecord {
            domain: Domain {
                role: if d.role == Role::Initiator {
                    Role::Passive
                } else {
                    d.role
                },
                ..d.clone()
            },
            status: "running".into(),
            ended_at: None,
            detail: detail.clone(),
        })?;
    }
    crate::symbolize::store_options(writer, &opts.symbolizer)?;
    // Checkpoints at most every 64 MiB of log rather than SQLite's 4 MiB
    // (SessionWriter::set_wal_autocheckpoint).
    writer.set_wal_autocheckpoint(16_384)?;
    Ok(())
}

/// Store a VM's role after the barrier: its domain row, and for a VM that
/// continues passive its `agent_NAME` metadata and a closing note.
fn store_arm_outcome(
    writer: &mut SessionWriter,
    a: &ArmOutcome,
    notes: &mut Vec<String>,
) -> Result<(), EngineError> {
    let detail = match &a.plan {
        None => a.detail.clone(),
        Some(plan) => {
            let name = &a.domain.name;
            writer.set_meta(&format!("agent_{name}"), &plan.describe())?;
            let note = format!("VM {name}: profiled as {}", plan.describe());
            notes.push(note.clone());
            format!("{}; {note}", a.detail)
        }
    };
    writer.upsert_domain(&DomainRecord {
        domain: a.domain.clone(),
        status: "running".into(),
        ended_at: None,
        detail,
    })?;
    Ok(())
}

impl Recording {
    /// Take what the agents sent since the last look (rows, cost steps,
    /// lost agents).
    fn agent_events(&mut self, writer: &mut SessionWriter) -> Result<(), EngineError> {
        let Some(p) = &self.pollers else {
            return Ok(());
        };
        for ev in p.events.try_iter() {
            self.agents
                .take(ev, writer, &mut self.cost, self.t0, &mut self.notes)?;
        }
        Ok(())
    }

    /// The flush every `flush_interval`: the host recorder's cost step
    /// (which may change its rate), the converter asked for its delta, and
    /// the bookkeeping in one commit.
    fn flush(&mut self, writer: &mut SessionWriter, rec: &mut Recorder) -> Result<(), EngineError> {
        let t0 = self.t0;
        self.cost
            .host_step(rec, t0.elapsed().as_secs_f64(), self.conv.stats().samples)?;
        // The delta is written when the converter answers (a later turn of
        // the loop, soon: see read_wait): asking never waits.
        self.conv.ask();
        let (cost, agents, stats) = (&mut self.cost, &mut self.agents, self.conv.stats());
        writer.batch(|w| {
            cost.flush(w)?;
            agents.flush(w, stats, false)?;
            agents.mark_ended_vms(w, t0)?;
            w.set_meta("duration_s", &format!("{:.3}", t0.elapsed().as_secs_f64()))?;
            Ok::<(), EngineError>(())
        })
    }

    /// After sampling stopped: every read converted and stored, the
    /// agents' last rows, the profilers' costs, warnings, build-ids and
    /// the times.
    fn finish(
        self,
        writer: &mut SessionWriter,
        rec: &mut Recorder,
        duration: Duration,
        status: Option<i32>,
        exit_after: bool,
    ) -> Result<RecordSummary, EngineError> {
        let Recording {
            conv,
            mut cost,
            pollers,
            mut agents,
            mut notes,
            t0,
            run_clock: _,
        } = self;
        let lost_behind = conv.dropped();
        // Every batch converted: the answers not yet written, then the rest.
        let (rest, mut conv) = conv.finish()?;
        for t in rest {
            write_delta(writer, &t.raw, &t.delta)?;
        }
        let (raw, delta) = (conv.take_raw(), conv.take_delta());
        write_delta(writer, &raw, &delta)?;
        cost.host_step(rec, duration.as_secs_f64(), conv.stats().samples)?;
        if let Some(p) = pollers {
            for ev in p.stop().try_iter() {
                agents.take(ev, writer, &mut cost, t0, &mut notes)?;
            }
        }
        notes.extend(agents.late_notes());
        agents.flush(writer, conv.stats(), true)?;
        notes.extend(cost.finish(writer)?);
        let mut all_warnings = conv.symbolizer_mut().warnings();
        all_warnings.sort();
        all_warnings.dedup();
        writer.set_meta("warnings", &all_warnings.join("\n"))?;
        writer.set_build_ids(&conv.symbolizer_mut().build_ids())?;
        writer.set_meta("duration_s", &format!("{:.3}", duration.as_secs_f64()))?;
        writer.set_meta("ended_at", &format!("{:.3}", unix_now()))?;
        let stats = conv.stats().clone();
        if exit_after {
            // See RecordOptions::exit_after: the OS takes it back at exit.
            std::mem::forget(conv);
        }
        Ok(RecordSummary {
            output: PathBuf::new(),
            samples: stats.samples,
            lost: stats.lost,
            lost_behind,
            duration,
            command_status: status,
            notes,
        })
    }
}

/// Store a converted delta with its rows of numbers (when symbolization is
/// deferred) in one transaction: a killed recorder leaves a session whose
/// every row has its strings, frames and stacks.
fn write_delta(
    writer: &mut SessionWriter,
    raw: &vmscope_model::RawDelta,
    delta: &Profile,
) -> Result<(), EngineError> {
    if raw.is_empty() {
        return Ok(writer.flush(delta)?);
    }
    writer.batch(|w| {
        w.add_raw(raw)?;
        w.flush(delta)?;
        Ok(())
    })
}

/// How long the recording loop's next read may wait on the rings, `now`
/// into the recording and `since_flush` after the last flush.
///
/// A ring wakes the loop when it is half full (at 1 kHz without call
/// chains that is seconds), so outside those wakes the loop runs when this
/// says. It waits until the next flush is due, or the duration ends,
/// so a quiet recording wakes about twice a flush (the flush, then the
/// converter's answer) instead of ten times a second: every wake-up of
/// the recorder's two threads takes a CPU from the workload being
/// measured. It waits 20 ms at most while an answer is awaited (the delta
/// reaches the file as soon as it is converted) and 100 ms at most while a
/// command or given processes may end (their end ends the recording).
/// A stop signal ends a wait early when the main thread takes it, and
/// within one wait when another thread does.
pub(crate) fn read_wait(
    now: Duration,
    since_flush: Duration,
    flush_interval: Duration,
    duration: Option<Duration>,
    asked: bool,
    watching: bool,
) -> Duration {
    let mut wait = flush_interval.saturating_sub(since_flush);
    if let Some(d) = duration {
        wait = wait.min(d.saturating_sub(now));
    }
    if asked {
        wait = wait.min(Duration::from_millis(20));
    }
    if watching {
        wait = wait.min(Duration::from_millis(100));
    }
    wait
}

/// The agents' bookkeeping: what they sent, waiting for the next flush,
/// their totals, and what became of each VM (agent lost, QEMU ended).
#[derive(Default)]
struct AgentBook {
    /// Every VM's domain (role after the barrier) and detail, by name.
    vms: HashMap<String, (Domain, String)>,
    delta: Profile,
    /// What the agents measured (busy period, samples, lost samples).
    totals: crate::live::AgentTotals,
    /// VMs whose QEMU process was seen to exit.
    ended: std::collections::HashSet<String>,
    /// When each VM's agent was lost (seconds since start).
    lost_at: HashMap<String, f64>,
    /// The longest a poll of each VM's agent waited for its late answer.
    late: HashMap<String, Duration>,
    /// Time origin of the session's seconds (the converter's).
    t0: Option<Instant>,
}

impl AgentBook {
    /// One note per VM whose agent answered a poll late (and was not lost).
    fn late_notes(&self) -> Vec<String> {
        let mut v: Vec<_> = self
            .late
            .iter()
            .filter(|(d, _)| !self.lost_at.contains_key(*d))
            .map(|(d, w)| {
                format!(
                    "VM {d}: its agent answered a poll only after {:.1} s (a busy guest); its rows came late, none lost",
                    w.as_secs_f64()
                )
            })
            .collect();
        v.sort();
        v
    }

    /// The session's second now (rows are booked in it).
    fn second(&self) -> u32 {
        self.t0.map_or(0, |t| {
            u32::try_from(t.elapsed().as_secs()).unwrap_or(u32::MAX - 1)
        })
    }

    /// Take one event of an agent's poller: a delta's rows (and the cost
    /// step it reports, `t0` being the recording's start), or a lost agent.
    fn take(
        &mut self,
        ev: GuestEvent,
        writer: &mut SessionWriter,
        cost: &mut CostBook,
        t0: Instant,
        notes: &mut Vec<String>,
    ) -> Result<(), EngineError> {
        match ev {
            GuestEvent::Delta { domain, delta } => {
                if let Some(step) = delta.cost {
                    cost.guest_step(&domain, step, t0.elapsed().as_secs_f64());
                }
                // Rows sampled since the previous poll (500 ms): booked in
                // the second they arrive in.
                let second = self.second();
                self.totals.absorb(&domain, delta, second, &mut self.delta);
            }
            GuestEvent::Lost { domain, at, why } => {
                notes.push(format!("VM {domain}: agent lost at {at:.1} s: {why}"));
                self.lost_at.insert(domain.to_string(), at);
                // A VM already seen to have exited keeps that (earlier, firmer) mark.
                if self.ended.contains(&*domain) {
                    return Ok(());
                }
                if let Some((d, det)) = self.vms.get(&*domain) {
                    writer.upsert_domain(&DomainRecord {
                        domain: d.clone(),
                        status: "lost".into(),
                        ended_at: Some(at),
                        detail: format!("{det}; agent lost: {why}"),
                    })?;
                }
            }
            GuestEvent::Late { domain, waited } => {
                let w = self.late.entry(domain.to_string()).or_default();
                *w = (*w).max(waited);
            }
            GuestEvent::Stopped { .. } => {}
        }
        Ok(())
    }

    /// The rows of complete seconds and every VM's scale, in one
    /// transaction (one commit a flush, however many VMs); `all` at the end
    /// of the session writes the current second's rows too.
    ///
    /// Rows of the second under way stay here until it is over: a second's
    /// rows come in two polls (500 ms apart), so writing them at once wrote
    /// most (key, second) rows twice, the second time as an update of the
    /// first (bench/many-vms: the agent rows' SQLite upserts were the
    /// largest cost of many active VMs in the recorder). The session's rows
    /// are the same; a killed recorder loses one second more of agent rows.
    fn flush(
        &mut self,
        writer: &mut SessionWriter,
        stats: &ConverterStats,
        all: bool,
    ) -> Result<(), EngineError> {
        let mut scales = Vec::with_capacity(self.totals.busy.len());
        for ((domain, event), (busy, samples)) in &self.totals.busy {
            let host = stats
                .guest_period
                .get(&(domain.clone(), *event))
                .copied()
                .unwrap_or(0);
            scales.push(ScaleRow {
                domain: domain.to_string(),
                event: *event,
                host_period: host,
                agent_period: *busy,
                agent_samples: *samples,
                agent_lost: self.totals.lost.get(domain).copied().unwrap_or(0),
                factor: if *busy > 0 {
                    host as f64 / *busy as f64
                } else {
                    0.0
                },
            });
        }
        let mut done = self.delta.take();
        if !all {
            let now = self.second();
            let delta = &mut self.delta;
            done.rows.retain(|k, c| {
                if k.second < now {
                    return true;
                }
                delta.add(k.clone(), c.samples, c.period);
                false
            });
            done.total_samples -= delta.total_samples;
        }
        writer.flush_agent_scaled(&done, &scales)?;
        Ok(())
    }

    /// Mark VMs whose QEMU exited as ended (their data so far stays), at
    /// their time since `t0`.
    fn mark_ended_vms(
        &mut self,
        writer: &mut SessionWriter,
        t0: Instant,
    ) -> Result<(), EngineError> {
        for (name, (d, det)) in &self.vms {
            let Some(pid) = d.pid else { continue };
            if !ProcRoot::system().exists(pid) && self.ended.insert(name.clone()) {
                writer.upsert_domain(&DomainRecord {
                    domain: d.clone(),
                    status: "ended".into(),
                    ended_at: Some(t0.elapsed().as_secs_f64()),
                    detail: format!("{det}; QEMU process {pid} exited during the session"),
                })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::read_wait;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_quiet_recording_waits_until_the_next_flush() {
        let flush = 500 * MS;
        // Recording system-wide, nothing asked: until the flush is due.
        assert_eq!(
            read_wait(10 * MS, Duration::ZERO, flush, None, false, false),
            flush
        );
        assert_eq!(
            read_wait(900 * MS, 400 * MS, flush, None, false, false),
            100 * MS
        );
        // Due (or overdue): no wait.
        assert_eq!(
            read_wait(900 * MS, 600 * MS, flush, None, false, false),
            Duration::ZERO
        );
        // The duration's end comes first.
        let d = Some(1000 * MS);
        assert_eq!(
            read_wait(800 * MS, 100 * MS, flush, d, false, false),
            200 * MS
        );
        assert_eq!(
            read_wait(1200 * MS, 100 * MS, flush, d, false, false),
            Duration::ZERO
        );
    }

    #[test]
    fn an_awaited_answer_or_a_watched_command_shortens_the_wait() {
        let flush = 500 * MS;
        assert_eq!(
            read_wait(10 * MS, Duration::ZERO, flush, None, true, false),
            20 * MS
        );
        assert_eq!(
            read_wait(10 * MS, Duration::ZERO, flush, None, false, true),
            100 * MS
        );
        assert_eq!(
            read_wait(10 * MS, Duration::ZERO, flush, None, true, true),
            20 * MS
        );
        assert_eq!(
            read_wait(10 * MS, 490 * MS, flush, None, false, true),
            10 * MS
        );
    }
}
