//! Live recording: perf_event rings → converter → session file, flushed
//! every `flush_interval` (≤ 1 s) so a killed recorder loses at most that
//! (agent rows: one second more, see `AgentBook::flush`).

use crate::guest::{arm_all, GuestEvent, GuestPollers, GuestProfiler};
use crate::pipeline::ConvertThread;
use crate::plan::SessionPlan;
use crate::{Converter, ConverterStats, EngineError};
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
        RunOptions {
            events: &opts.events,
            command_line: &opts.command_line,
            callchain: opts.callchain,
            meta: &opts.meta,
            plan: opts.plan,
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
    plan: SessionPlan,
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

impl Run<'_, '_> {
    #[allow(clippy::too_many_lines)]
    fn session(
        &mut self,
        writer: &mut SessionWriter,
        opts: RunOptions<'_>,
    ) -> Result<RecordSummary, EngineError> {
        let rec = &mut self.rec;
        let target = &self.target;
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
            ("cpus", rec.cpus().len().to_string()),
            ("started_at", format!("{started:.3}")),
            ("callchain", u8::from(opts.callchain).to_string()),
        ] {
            writer.set_meta(k, &v)?;
        }
        for (k, v) in opts.meta.iter().chain(&opts.plan.meta) {
            writer.set_meta(k, v)?;
        }
        writer.upsert_domain(&DomainRecord {
            domain: Domain::host(),
            status: "running".into(),
            ended_at: None,
            detail: String::new(),
        })?;
        for (d, detail) in &opts.plan.domains {
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
        let symbolizer = if opts.defer_symbols {
            Symbolizer::deferred(opts.symbolizer.clone())
        } else {
            Symbolizer::new(opts.symbolizer.clone())
        };
        let mut conv = Converter::new(symbolizer, opts.plan.threads.clone());
        for vm in &opts.plan.unmonitored {
            conv.set_unmonitored(vm);
        }
        for (vm, k) in opts.plan.guest_kallsyms {
            conv.symbolizer_mut().add_guest_kallsyms(&vm, k);
        }
        // Existing processes: maps and names from /proc.
        let pids_filter: Option<Vec<u32>> = match target {
            Target::AllCpus => None,
            Target::Pids(p) => Some(p.clone()),
        };
        for r in vmscope_linux::synthesize_from_proc(&ProcRoot::system(), pids_filter.as_deref()) {
            conv.push(r);
        }
        conv.set_origin(vmscope_linux::clock_monotonic_ns());
        // From here the converter runs on its own thread: reading the rings
        // never waits on symbol loading, or on conversion (crate::pipeline).
        let mut conv = ConvertThread::spawn(conv, rec.stream())?;
        // Checkpoints at most every 64 MiB of log rather than SQLite's 4 MiB
        // (SessionWriter::set_wal_autocheckpoint).
        writer.set_wal_autocheckpoint(16_384)?;
        // The same origin for agents' rows: the second they arrive in.
        let t_origin = Instant::now();

        // What profiling costs, from here (the interrupt level until
        // sampling starts is the host's own).
        let mut cost = crate::cost::CostBook::new(
            rec,
            opts.events,
            opts.callchain,
            opts.overhead_budget,
            opts.plan.guests.len(),
        )?;
        let mut guests = opts.plan.guests;
        for g in &mut guests {
            g.set_overhead_budget(cost.guest_budget());
        }
        // The readiness barrier: every active agent armed before the host starts.
        let mut notes = Vec::new();
        let mut active: Vec<Box<dyn GuestProfiler>> = Vec::new();
        let mut vm_detail: HashMap<String, (Domain, String)> = opts
            .plan
            .domains
            .iter()
            .map(|(d, det)| (d.name.clone(), (d.clone(), det.clone())))
            .collect();
        for a in arm_all(guests, opts.events, opts.callchain, opts.barrier_timeout) {
            let (mut dom, det) = vm_detail.get(&*a.domain).cloned().unwrap_or_else(|| {
                (
                    Domain {
                        name: a.domain.to_string(),
                        role: Role::Active,
                        pid: None,
                    },
                    String::new(),
                )
            });
            match a.result {
                Ok(g) => {
                    dom.role = Role::Active;
                    writer.upsert_domain(&DomainRecord {
                        domain: dom.clone(),
                        status: "running".into(),
                        ended_at: None,
                        detail: det.clone(),
                    })?;
                    vm_detail.insert(dom.name.clone(), (dom, det));
                    active.push(g);
                }
                Err((_, why)) => {
                    let (reason, fix) = crate::plan::arm_reason(&why, opts.barrier_timeout);
                    let plan = crate::plan::VmPlan {
                        name: a.domain.to_string(),
                        role: Role::Passive,
                        reason: Some(reason),
                        fix,
                    };
                    writer.set_meta(&format!("agent_{}", a.domain), &plan.describe())?;
                    let note = format!("VM {}: profiled as {}", a.domain, plan.describe());
                    notes.push(note.clone());
                    dom.role = Role::Passive;
                    writer.upsert_domain(&DomainRecord {
                        domain: dom.clone(),
                        status: "running".into(),
                        ended_at: None,
                        detail: format!("{det}; {note}"),
                    })?;
                    vm_detail.insert(dom.name.clone(), (dom, det));
                }
            }
        }

        // Stopped while the agents were being armed: no recording at all.
        if self.stop.load(Ordering::Relaxed) {
            return Err(EngineError::Invalid(
                "stopped by a signal before sampling started; nothing was recorded".into(),
            ));
        }
        cost.sampling_starts();
        rec.enable()?;
        self.sampling = true;
        let t_enable = Instant::now();
        let mut pollers = (!active.is_empty()).then(|| {
            let longest = match opts.overhead_budget {
                Some(_) => crate::guest::BUDGET_LONGEST_POLL,
                None => AGENT_POLL,
            };
            GuestPollers::spawn_stretching(active, AGENT_POLL, longest, t_enable)
        });
        let mut agents = AgentBook {
            t0: Some(t_origin),
            ..AgentBook::default()
        };
        if let Some(c) = self.child.as_mut() {
            c.release();
        }
        let t0 = Instant::now();
        let mut last_flush = Instant::now();
        let mut status = None;
        // A delta was asked for and not yet written.
        let mut asked = false;
        let ended = loop {
            let wait = read_wait(
                t0.elapsed(),
                last_flush.elapsed(),
                opts.flush_interval,
                opts.duration,
                asked,
                self.child.is_some() || matches!(target, Target::Pids(_)),
            );
            let mark = rec.read_bytes(wait, |b| conv.copy(b))?;
            conv.push_read(mark);
            for t in conv.try_taken() {
                write_delta(writer, &t.raw, &t.delta)?;
                asked = false;
            }
            if let Some(p) = &pollers {
                for ev in p.events.try_iter() {
                    guest_cost(&mut cost, &ev, t0);
                    agents.take(ev, writer, &vm_detail, &mut notes)?;
                }
            }
            if last_flush.elapsed() >= opts.flush_interval {
                cost.host_step(rec, t0.elapsed().as_secs_f64(), conv.stats().samples)?;
                // The delta is written when the converter answers (a
                // later turn of the loop, soon: see read_wait): asking
                // never waits.
                conv.ask();
                asked = true;
                // The flush's bookkeeping in one commit.
                writer.batch(|w| {
                    cost.flush(w)?;
                    agents.flush(w, conv.stats(), false)?;
                    mark_ended_vms(w, &vm_detail, &mut agents, t0)?;
                    w.set_meta("duration_s", &format!("{:.3}", t0.elapsed().as_secs_f64()))?;
                    Ok::<(), EngineError>(())
                })?;
                (self.progress)(t0.elapsed(), conv.stats().samples);
                last_flush = Instant::now();
            }
            if self.stop.load(Ordering::Relaxed) {
                break Ended::Stop;
            }
            if opts.duration.is_some_and(|d| t0.elapsed() >= d) {
                break Ended::Duration;
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait() {
                    if let Some(e) = c.exec_failure() {
                        return Err(EngineError::Spawn {
                            command: opts.command.unwrap_or_default().join(" "),
                            source: e,
                        });
                    }
                    status = Some(st);
                    break Ended::Command;
                }
            }
            if let Target::Pids(p) = target {
                if self.child.is_none() && p.iter().all(|pid| !ProcRoot::system().exists(*pid)) {
                    break Ended::TargetsGone;
                }
            }
        };
        let duration = t0.elapsed();
        rec.disable()?;
        let mark = rec.read_bytes(Duration::from_millis(0), |b| conv.copy(b))?;
        conv.push_read(mark);
        if let Some(mut c) = self.child.take() {
            if status.is_none() && c.stop(Duration::from_secs(2)) {
                let why = match (ended, opts.duration) {
                    (Ended::Duration, Some(d)) => {
                        format!("-d {} s ended the recording", d.as_secs_f64())
                    }
                    _ => "the recording was stopped".to_string(),
                };
                notes.push(format!(
                    "{why} while the command ({}) was still running; vmscope stopped it ({})",
                    opts.command.unwrap_or_default().join(" "),
                    match c.status.map(|s| s - 128) {
                        Some(libc::SIGTERM) => "SIGTERM".to_string(),
                        Some(libc::SIGKILL) => "SIGKILL, 2 s after SIGTERM".to_string(),
                        Some(s) if s > 0 => format!("it ended on signal {s}"),
                        _ => format!("it exited with {}", c.status.unwrap_or(0)),
                    }
                ));
            }
        }
        let lost_behind = conv.dropped();
        // Every batch converted: the answers not yet written, then the rest.
        let (rest, mut conv) = conv.finish()?;
        for t in rest {
            write_delta(writer, &t.raw, &t.delta)?;
        }
        let (raw, delta) = (conv.take_raw(), conv.take_delta());
        write_delta(writer, &raw, &delta)?;
        cost.host_step(rec, duration.as_secs_f64(), conv.stats().samples)?;
        if let Some(p) = pollers.take() {
            for ev in p.stop().try_iter() {
                guest_cost(&mut cost, &ev, t0);
                agents.take(ev, writer, &vm_detail, &mut notes)?;
            }
        }
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
        if opts.exit_after {
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

/// Note what an agent's delta says its profiling cost.
fn guest_cost(cost: &mut crate::cost::CostBook, ev: &GuestEvent, t0: Instant) {
    if let GuestEvent::Delta { domain, delta } = ev {
        if let Some(step) = delta.cost {
            cost.guest_step(domain, step, t0.elapsed().as_secs_f64());
        }
    }
}

/// What the agents sent, waiting for the next flush, and their totals.
#[derive(Default)]
struct AgentBook {
    delta: Profile,
    /// What the agents measured (busy period, samples, lost samples).
    totals: crate::live::AgentTotals,
    /// VMs whose QEMU process was seen to exit.
    ended: std::collections::HashSet<String>,
    /// When each VM's agent was lost (seconds since start).
    lost_at: HashMap<String, f64>,
    /// Time origin of the session's seconds (the converter's).
    t0: Option<Instant>,
}

impl AgentBook {
    /// The session's second now (rows are booked in it).
    fn second(&self) -> u32 {
        self.t0.map_or(0, |t| {
            u32::try_from(t.elapsed().as_secs()).unwrap_or(u32::MAX - 1)
        })
    }

    fn take(
        &mut self,
        ev: GuestEvent,
        writer: &mut SessionWriter,
        vms: &HashMap<String, (Domain, String)>,
        notes: &mut Vec<String>,
    ) -> Result<(), EngineError> {
        match ev {
            GuestEvent::Delta { domain, delta } => {
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
                if let Some((d, det)) = vms.get(&*domain) {
                    writer.upsert_domain(&DomainRecord {
                        domain: d.clone(),
                        status: "lost".into(),
                        ended_at: Some(at),
                        detail: format!("{det}; agent lost: {why}"),
                    })?;
                }
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
}

/// Mark VMs whose QEMU exited as ended (their data so far stays).
fn mark_ended_vms(
    writer: &mut SessionWriter,
    vms: &HashMap<String, (Domain, String)>,
    agents: &mut AgentBook,
    t0: Instant,
) -> Result<(), EngineError> {
    for (name, (d, det)) in vms {
        let Some(pid) = d.pid else { continue };
        if !ProcRoot::system().exists(pid) && agents.ended.insert(name.clone()) {
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
