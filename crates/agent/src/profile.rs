//! Sampling inside the guest (protocol 2): one session at a time, run by a
//! worker thread so the event loop never waits on perf rings or symbols.
//!
//! The worker opens a [`Recorder`] on every CPU, feeds its records (after
//! the processes synthesized from `/proc`) through the engine's
//! [`Converter`] with an empty thread map, and keeps the rows aggregated
//! until the host polls. Seen from inside the guest everything is "host"
//! code; rows are renamed to the guest's contexts: user code is
//! `guest-user`, kernel code and the idle task are `guest-kernel`. Rows
//! are kept per guest CPU (`cpu`, the vCPU index), so the host can put a
//! guest's stacks on their vCPU.
//!
//! The host drives the session: `profile_poll` takes what accumulated,
//! `profile_stop` disables sampling and takes the rest (over several
//! messages when more than [`MAX_PROFILE_ROWS`] rows wait). Answers go back
//! through the event loop's queue, so sampling never blocks on the port.
//! When the host hangs up the session is dropped: the worker disables its
//! events and ends without answering.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use vmscope_engine::Converter;
use vmscope_linux::selfcost::SelfCost;
use vmscope_linux::{clock_monotonic_ns, LinuxError, Recorder, RingOptions, Target};
use vmscope_model::budget::RateController;
use vmscope_model::{Context, EventSpec, Profile, ThreadMap};
use vmscope_protocol::{
    row_context, DeltaCost, ErrorKind, ProfileRow, Response, MAX_ERROR_MESSAGE, MAX_IMAGE,
    MAX_PROCESS_NAME, MAX_PROFILE_ROWS, MAX_STACK, MAX_SYMBOL,
};
use vmscope_symbols::{KeptFiles, Symbolizer, SymbolizerOptions};

use crate::log;
use crate::server::cut;

/// How long one read of the rings may wait. Each wake-up costs the guest
/// a ring read and a conversion pass, which TCG emulates slowly, so it is
/// long: the rings wake the reader when half full, and every command (the
/// host's poll, once a second; stop; hang-up) through the session's
/// eventfd, so this only bounds how long a wait with neither can last.
const READ_WAIT: Duration = Duration::from_millis(2000);
/// Distinct rows kept between polls; samples of further rows count as lost.
const MAX_PENDING_ROWS: usize = 200_000;
/// Budget for the rows of one message, in bytes of JSON (under `MAX_FRAME`).
const ROW_BYTES_BUDGET: usize = 12 << 20;
/// JSON bytes of a row besides its strings (field names, numbers).
const ROW_OVERHEAD: usize = 160;

/// The guest binaries' symbols the last session had, for the next ones: a
/// binary's symbol table is read once, not per session (reading the demo's
/// cost an emulated guest 0.15 to 0.25 s of CPU at each session's first read,
/// more than a 10 s session's whole budget at 10 Hz). Sessions at once
/// each start from a shared copy; the last to end leaves its files.
static KEPT_FILES: std::sync::Mutex<Option<KeptFiles>> = std::sync::Mutex::new(None);

/// Leaves `conv`'s files for the next session (a session that loaded none
/// leaves what was there).
fn keep_files(conv: &mut Converter) {
    let files = conv.symbolizer_mut().take_files();
    if files.is_empty() {
        return;
    }
    if let Ok(mut k) = KEPT_FILES.lock() {
        *k = Some(files);
    }
}

/// Sends an answer to request `id` back to the event loop.
pub type Reply = Box<dyn Fn(u64, Response) + Send>;

enum Cmd {
    Poll(u64),
    Stop(u64),
}

/// A running session, owned by the event loop.
pub struct Session {
    cmd: Sender<Cmd>,
    hangup: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
    /// Wakes the worker's wait on its rings for each command.
    waker: Arc<OwnedFd>,
}

/// A non-blocking eventfd.
fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with flags only; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd's counter (a full counter is readable anyway).
fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to an open eventfd.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
}

/// What `profile_start` asked for.
pub struct Config {
    /// Event names as the host gives them.
    pub events: Vec<String>,
    /// Frequency for events without a period.
    pub frequency: u64,
    /// Record call chains.
    pub callchain: bool,
    /// Keep this session's cost within this fraction of the guest's CPU.
    pub budget: Option<f64>,
}

impl Session {
    /// Starts the worker; it answers request `id` with `profile_ready` once
    /// sampling is armed, or with an error (and then ends).
    pub fn start(id: u64, cfg: Config, reply: Reply) -> std::io::Result<Session> {
        let (tx, rx) = mpsc::channel();
        let hangup = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let waker = Arc::new(eventfd()?);
        let w = Worker {
            rx,
            hangup: Arc::clone(&hangup),
            finished: Arc::clone(&finished),
            reply,
            waker: Arc::clone(&waker),
        };
        std::thread::Builder::new()
            .name("profile".into())
            .spawn(move || w.run(id, cfg))?;
        Ok(Session {
            cmd: tx,
            hangup,
            finished,
            waker,
        })
    }

    /// The worker has sent its last answer (or failed to arm).
    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Asks for the delta since the last poll; false when the worker is gone.
    pub fn poll(&self, id: u64) -> bool {
        let sent = self.cmd.send(Cmd::Poll(id)).is_ok();
        wake(&self.waker);
        sent
    }

    /// Asks the worker to stop sampling and send the rest.
    pub fn stop(&self, id: u64) -> bool {
        let sent = self.cmd.send(Cmd::Stop(id)).is_ok();
        wake(&self.waker);
        sent
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.hangup.store(true, Ordering::Release);
        wake(&self.waker);
    }
}

/// Key of a wire row (everything but the counts).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RowKey {
    event: u32,
    context: &'static str,
    process: String,
    image: String,
    symbol: String,
    stack: String,
    /// Guest CPU the samples ran on (the vCPU index).
    cpu: u32,
}

/// Rows and counters accumulated since the last answer.
#[derive(Default)]
struct Pending {
    rows: HashMap<RowKey, (u64, u64)>,
    samples: u64,
    lost: u64,
    seq: u64,
}

/// The guest context of a row the converter attributed as seen on a host.
fn guest_context(c: Context) -> &'static str {
    match c {
        Context::HostUser | Context::VmmUser | Context::GuestUser | Context::GuestTranslated => {
            row_context::GUEST_USER
        }
        Context::HostKernel | Context::VmmKernel | Context::GuestKernel | Context::Idle => {
            row_context::GUEST_KERNEL
        }
    }
}

/// `s` with control characters replaced (so JSON never needs more than two
/// bytes per byte) and cut to `max` bytes.
fn clean(s: &str, max: usize) -> String {
    let t: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    cut(t, max)
}

/// A collapsed stack cut to `max` bytes by dropping frames at the root end.
fn clean_stack(s: &str, max: usize) -> String {
    let t = clean(s, usize::MAX);
    if t.len() <= max {
        return t;
    }
    let mut start = t.len() - max;
    while !t.is_char_boundary(start) {
        start += 1;
    }
    match t[start..].find(';') {
        Some(i) => t[start + i + 1..].to_string(),
        None => t[start..].to_string(),
    }
}

impl Pending {
    fn absorb(&mut self, delta: Profile) {
        for (k, c) in delta.rows {
            let key = RowKey {
                event: k.event,
                context: guest_context(k.context),
                process: clean(&k.process, MAX_PROCESS_NAME),
                image: clean(&k.image, MAX_IMAGE),
                symbol: clean(&k.symbol, MAX_SYMBOL),
                stack: clean_stack(&k.stack, MAX_STACK),
                cpu: k.cpu,
            };
            let full = self.rows.len() >= MAX_PENDING_ROWS;
            match self.rows.get_mut(&key) {
                Some(v) => {
                    v.0 += c.samples;
                    v.1 += c.period;
                }
                None if full => self.lost += c.samples,
                None => {
                    self.rows.insert(key, (c.samples, c.period));
                }
            }
        }
    }

    /// The next `profile_data`: the busiest rows that fit, the rest kept.
    fn cut(&mut self, done: bool, cost: Option<DeltaCost>) -> Response {
        let mut all: Vec<(RowKey, (u64, u64))> = self.rows.drain().collect();
        all.sort_by_key(|r| std::cmp::Reverse(r.1 .0));
        let mut rows = Vec::new();
        let mut bytes = 0usize;
        let mut rest = all.into_iter();
        for (k, (samples, period)) in rest.by_ref() {
            let size = ROW_OVERHEAD
                + 2 * (k.process.len() + k.image.len() + k.symbol.len() + k.stack.len());
            if rows.len() >= MAX_PROFILE_ROWS || bytes + size > ROW_BYTES_BUDGET {
                self.rows.insert(k, (samples, period));
                break;
            }
            bytes += size;
            rows.push(ProfileRow {
                event: k.event,
                context: k.context.to_string(),
                process: k.process,
                image: k.image,
                symbol: k.symbol,
                stack: k.stack,
                cpu: (k.cpu != vmscope_model::UNKNOWN_SLICE).then_some(k.cpu),
                samples,
                period,
            });
        }
        self.rows.extend(rest);
        self.seq += 1;
        let more = !self.rows.is_empty();
        Response::ProfileData {
            seq: self.seq,
            rows,
            samples: std::mem::take(&mut self.samples),
            lost: std::mem::take(&mut self.lost),
            t_ns: clock_monotonic_ns(),
            more,
            last: done && !more,
            cost,
        }
    }
}

/// What this session costs the guest, and the rate rule under a budget.
struct Meter {
    cost: SelfCost,
    ctl: Option<RateController>,
    /// The rate in force (0: events with fixed periods only).
    rate_hz: u64,
}

impl Meter {
    /// The cost since the last step (`samples`: taken so far), and the
    /// next rate under the budget (applied to `rec` here).
    fn step(&mut self, rec: &mut Recorder, samples: u64) -> DeltaCost {
        let (cost_s, capacity_s) = self.cost.step(samples);
        let step = DeltaCost {
            cost_ns: (cost_s * 1e9) as u64,
            capacity_ns: (capacity_s * 1e9) as u64,
            rate_hz: self.rate_hz,
        };
        if let Some(ctl) = self.ctl.as_mut() {
            if let Some(hz) = ctl.observe(cost_s, capacity_s) {
                match rec.set_frequency(hz) {
                    Ok(_) => {
                        log!(
                            "overhead budget: {:.2} % of the guest's CPU at {} Hz, now {hz} Hz",
                            100.0 * cost_s / capacity_s.max(1e-9),
                            self.rate_hz
                        );
                        self.rate_hz = hz;
                    }
                    Err(e) => log!("overhead budget: cannot change the rate: {e}"),
                }
            }
        }
        step
    }
}

struct Worker {
    rx: Receiver<Cmd>,
    hangup: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
    reply: Reply,
    /// The session's eventfd (kept open here as long as the rings are read).
    waker: Arc<OwnedFd>,
}

fn error(kind: ErrorKind, message: String) -> Response {
    Response::Error {
        kind,
        message: cut(message, MAX_ERROR_MESSAGE),
    }
}

fn linux_error(e: LinuxError) -> Response {
    let kind = match e {
        LinuxError::UnsupportedEvent { .. } => ErrorKind::UnsupportedEvent,
        LinuxError::PermissionDenied { .. } => ErrorKind::Denied,
        LinuxError::FrequencyTooHigh { .. } | LinuxError::Options(_) => ErrorKind::BadRequest,
        _ => ErrorKind::Io,
    };
    error(kind, format!("in the guest: {e}"))
}

/// Samples and counters the converter has seen so far.
struct Seen {
    samples: u64,
    lost: u64,
}

impl Worker {
    fn run(self, id: u64, cfg: Config) {
        match self.arm(&cfg) {
            Ok((rec, conv, meter, ready)) => {
                (self.reply)(id, ready);
                self.sample(rec, conv, meter);
            }
            Err(resp) => {
                self.finished.store(true, Ordering::Release);
                (self.reply)(id, resp);
            }
        }
    }

    fn arm(&self, cfg: &Config) -> Result<(Recorder, Converter, Meter, Response), Response> {
        let mut specs = Vec::with_capacity(cfg.events.len());
        for name in &cfg.events {
            let spec = EventSpec::parse(name, cfg.frequency)
                .map_err(|e| error(ErrorKind::BadRequest, e.to_string()))?;
            specs.push(spec);
        }
        let names: Vec<String> = specs.iter().map(|s| s.kind.name()).collect();
        let mut rec = Recorder::open(&RingOptions {
            events: specs.clone(),
            target: Target::AllCpus,
            callchain: cfg.callchain,
            ring_pages: 0,
        })
        .map_err(linux_error)?;
        // Under a budget, what one sample costs the vCPU it lands on: this
        // guest's kernel keeps no interrupt time, and under emulation the
        // sampling interrupts are most of profiling's cost. Measured before
        // sampling starts; its CPU is counted in the first step.
        // The agent lives across sessions, so a recent calibration is
        // reused and only the first session of a while spins for one.
        let calibration = match cfg.budget {
            Some(_) => match vmscope_linux::samplecost::calibrate_or_reuse(
                &specs,
                cfg.callchain,
                Some(std::path::Path::new(vmscope_linux::samplecost::REUSE_FILE)),
            ) {
                Ok(Some(c)) => {
                    log!(
                        "sampling interrupts: {:.1} µs per sample ({})",
                        c.per_sample_s * 1e6,
                        c.source()
                    );
                    Some(c)
                }
                Ok(None) => {
                    log!("sampling interrupts: not calibrated (no frequency event, or no CPU)");
                    None
                }
                Err(e) => {
                    log!("sampling interrupts: not calibrated: {e}");
                    None
                }
            },
            None => None,
        };
        // From here the session's own work counts (this thread's CPU); the
        // interrupt level until sampling starts is the guest's own.
        let mut cost =
            SelfCost::start_thread(vmscope_linux::ProcRoot::system(), rec.cpus().len() as u32);
        if let Some(c) = &calibration {
            cost.use_calibration(c);
        }
        // The guest's own kernel is the "host" kernel here: /proc/kallsyms.
        let proc = std::path::Path::new("/proc");
        let (kernel, kept) = crate::kallsyms::session_kernel(proc);
        if kept {
            log!("guest kernel symbols kept from an earlier session (modules and BPF programs unchanged)");
        }
        let mut conv = Converter::new(
            Symbolizer::with_kernel(SymbolizerOptions::default(), kernel, &proc.join("kallsyms"))
                .keeping_files(),
            ThreadMap::new(),
        );
        let kept_files = KEPT_FILES.lock().ok().and_then(|k| k.clone());
        if let Some(files) = kept_files.filter(|f| !f.is_empty()) {
            let (kept, changed) = conv.symbolizer_mut().reuse_files(files);
            log!(
                "symbols of {kept} guest binaries kept from an earlier session{}",
                if changed > 0 {
                    format!(" ({changed} changed since: read again when sampled)")
                } else {
                    String::new()
                }
            );
        }
        for r in vmscope_linux::synthesize_from_proc(&vmscope_linux::ProcRoot::system(), None) {
            conv.push(r);
        }
        let t_ns = clock_monotonic_ns();
        conv.set_origin(t_ns);
        let rate_hz = if rec.has_frequency_events() {
            cfg.frequency
        } else {
            0
        };
        // Under a budget the controller starts below the rate asked for
        // (slow start) and climbs while the cost allows.
        let ctl = cfg.budget.filter(|_| rate_hz > 0).map(|b| {
            let mut c = RateController::new(b, rate_hz);
            if let Some(k) = &calibration {
                c.fit_start(k.per_sample_s);
            }
            c
        });
        let rate_hz = match &ctl {
            Some(c) if c.rate() != rate_hz => {
                rec.set_frequency(c.rate()).map_err(linux_error)?;
                c.rate()
            }
            _ => rate_hz,
        };
        rec.set_waker(self.waker.as_raw_fd());
        let mut meter = Meter { cost, ctl, rate_hz };
        meter.cost.sampling_starts();
        rec.enable().map_err(linux_error)?;
        log!(
            "profiling {} on {} CPUs{}",
            names.join(","),
            rec.cpus().len(),
            if cfg.callchain {
                " with call chains"
            } else {
                ""
            }
        );
        let ready = Response::ProfileReady {
            cpus: rec.cpus().len() as u32,
            events: names,
            t_ns,
        };
        Ok((rec, conv, meter, ready))
    }

    fn drain(
        &self,
        rec: &mut Recorder,
        conv: &mut Converter,
        wait: Duration,
        pending: &mut Pending,
        seen: &mut Seen,
    ) -> bool {
        let mut buf = Vec::with_capacity(4096);
        if let Err(e) = rec.read(wait, &mut buf) {
            log!("reading the perf rings failed: {e}");
            return false;
        }
        conv.push_batch(buf);
        pending.absorb(conv.take_delta());
        let st = conv.stats();
        pending.samples += st.samples - seen.samples;
        pending.lost += st.lost - seen.lost;
        seen.samples = st.samples;
        seen.lost = st.lost;
        true
    }

    fn sample(self, mut rec: Recorder, mut conv: Converter, mut meter: Meter) {
        let mut pending = Pending::default();
        let mut seen = Seen {
            samples: 0,
            lost: 0,
        };
        let mut stopped = false;
        let mut cost_sent = false;
        loop {
            if self.hangup.load(Ordering::Acquire) {
                log!("host gone: profiling stopped");
                let _ = rec.disable();
                break;
            }
            let cmd = if stopped {
                match self.rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                if !self.drain(&mut rec, &mut conv, READ_WAIT, &mut pending, &mut seen) {
                    // The rings are unusable: report what there is as final.
                    let _ = rec.disable();
                    stopped = true;
                }
                match self.rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            let Some(cmd) = cmd else { continue };
            let id = match cmd {
                Cmd::Poll(id) => id,
                Cmd::Stop(id) => {
                    if !stopped {
                        let _ = rec.disable();
                        self.drain(&mut rec, &mut conv, Duration::ZERO, &mut pending, &mut seen);
                        stopped = true;
                        log!(
                            "profiling stopped: {} samples, {} lost",
                            conv.stats().samples,
                            conv.stats().lost
                        );
                    }
                    id
                }
            };
            // Once stopped, the cost of sending what is left is not
            // sampling's: measured up to the stop only.
            let cost = if stopped && cost_sent {
                None
            } else {
                cost_sent = stopped;
                Some(meter.step(&mut rec, conv.stats().samples))
            };
            let resp = pending.cut(stopped, cost);
            let last = matches!(resp, Response::ProfileData { last: true, .. });
            if last {
                keep_files(&mut conv);
                self.finished.store(true, Ordering::Release);
            }
            (self.reply)(id, resp);
            if last {
                break;
            }
        }
        keep_files(&mut conv);
        self.finished.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc as A;
    use vmscope_model::AggKey;

    fn key(ctx: Context, sym: &str, stack: &str) -> AggKey {
        AggKey {
            event: 0,
            domain: A::from("host"),
            context: ctx,
            process: A::from("p"),
            image: A::from("/bin/x"),
            symbol: A::from(sym),
            stack: A::from(stack),
            srcline: A::from(""),
            second: 0,
            cpu: 0,
        }
    }

    #[test]
    fn contexts_become_guest_contexts_and_idle_merges_with_kernel() {
        let mut p = Pending::default();
        let mut d = Profile::new();
        d.add(key(Context::HostUser, "u", ""), 3, 30);
        d.add(key(Context::HostKernel, "k", ""), 2, 20);
        d.add(key(Context::Idle, "k", ""), 1, 10);
        p.absorb(d);
        let Response::ProfileData {
            rows, last, more, ..
        } = p.cut(true, None)
        else {
            panic!()
        };
        assert!(last && !more);
        assert_eq!(rows.len(), 2);
        let get = |c: &str| rows.iter().find(|r| r.context == c).unwrap();
        assert_eq!(get("guest-user").samples, 3);
        let k = get("guest-kernel");
        assert_eq!((k.samples, k.period, k.symbol.as_str()), (3, 30, "k"));
        assert!(rows.iter().all(|r| r.cpu == Some(0)));
        for r in &rows {
            r.validate().unwrap();
        }
    }

    #[test]
    fn rows_are_split_by_guest_cpu() {
        let mut p = Pending::default();
        let mut d = Profile::new();
        let mut on = |cpu: u32, n: u64| {
            let mut k = key(Context::HostUser, "u", "");
            k.cpu = cpu;
            d.add(k, n, n * 10);
        };
        on(0, 2);
        on(1, 5);
        on(vmscope_model::UNKNOWN_SLICE, 1);
        p.absorb(d);
        let Response::ProfileData { mut rows, .. } = p.cut(true, None) else {
            panic!()
        };
        rows.sort_by_key(|r| r.cpu);
        let got: Vec<(Option<u32>, u64)> = rows.iter().map(|r| (r.cpu, r.samples)).collect();
        assert_eq!(got, vec![(None, 1), (Some(0), 2), (Some(1), 5)]);
    }

    #[test]
    fn long_fields_are_cut_to_the_limits() {
        let mut p = Pending::default();
        let mut d = Profile::new();
        let stack = vec!["frame"; 20_000].join(";") + ";leaf";
        d.add(key(Context::HostUser, &"s\u{1}".repeat(5000), &stack), 1, 1);
        p.absorb(d);
        let Response::ProfileData { rows, .. } = p.cut(false, None) else {
            panic!()
        };
        rows[0].validate().unwrap();
        assert!(rows[0].stack.ends_with(";leaf"));
        assert!(rows[0].stack.starts_with("frame;"));
        assert!(!rows[0].symbol.contains('\u{1}'));
    }

    #[test]
    fn rows_beyond_one_message_wait_for_the_next() {
        let mut p = Pending::default();
        let mut d = Profile::new();
        for i in 0..MAX_PROFILE_ROWS + 10 {
            d.add(key(Context::HostUser, &format!("f{i}"), ""), 1, 1);
        }
        p.absorb(d);
        let Response::ProfileData {
            rows, more, last, ..
        } = p.cut(true, None)
        else {
            panic!()
        };
        assert_eq!((rows.len(), more, last), (MAX_PROFILE_ROWS, true, false));
        let Response::ProfileData {
            rows,
            more,
            last,
            seq,
            ..
        } = p.cut(true, None)
        else {
            panic!()
        };
        assert_eq!((rows.len(), more, last, seq), (10, false, true, 2));
    }
}
