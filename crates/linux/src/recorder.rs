//! The live sampling recorder: one perf_event fd per (CPU, thread, event),
//! one mmap ring per CPU that every other fd of that CPU is redirected into
//! (PERF_EVENT_IOC_SET_OUTPUT), and the read loop that drains the rings into
//! time-ordered [`Record`]s.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use perf_event_open_sys::bindings::{self as sys, perf_event_attr};
use perf_event_open_sys::ioctls;
use vmscope_model::{CpuMode, EventKind, EventSpec, Record, SampleRate};

use crate::decode::{Decoder, SAMPLE_TYPE};
use crate::ring::{as_bytes, as_bytes_mut, Ring};
use crate::sys::{
    clock_monotonic_ns, online_cpus, page_size, perf_event_max_sample_rate, perf_event_paranoid,
};
use crate::LinuxError;

/// What to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every CPU, every task (perf's `-a`).
    AllCpus,
    /// Every current thread of each pid, inherited by new threads and children.
    Pids(Vec<u32>),
}

/// Options of [`Recorder::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingOptions {
    /// Sampled events; `Record::Sample.event` indexes this list.
    pub events: Vec<EventSpec>,
    pub target: Target,
    /// Record kernel and user call chains (PERF_SAMPLE_CALLCHAIN).
    pub callchain: bool,
    /// Data pages per ring (a power of two); 0 = sized from the sampling
    /// rate ([`auto_ring_bytes`]).
    pub ring_pages: usize,
}

impl Default for RingOptions {
    fn default() -> RingOptions {
        RingOptions {
            events: vec![EventSpec {
                kind: EventKind::CpuClock,
                rate: SampleRate::Frequency(vmscope_model::event::DEFAULT_FREQUENCY),
            }],
            target: Target::AllCpus,
            callchain: false,
            ring_pages: 0,
        }
    }
}

/// Smallest ring chosen from the rate, bytes (256 pages of 4 KiB).
const MIN_AUTO_RING_BYTES: usize = 1 << 20;
/// Largest ring chosen from the rate, bytes per CPU.
const MAX_AUTO_RING_BYTES: usize = 32 << 20;
/// Seconds of samples a ring chosen from the rate holds: the reader is
/// woken at half, so it has this long over half to get the CPU before
/// samples are lost (a busy 2-CPU host delays it by tens of ms).
const RING_SECONDS: f64 = 0.25;

/// The ring size (bytes, a power of two) for `events` sampled at their
/// frequencies, per CPU: enough for [`RING_SECONDS`] of records at the
/// highest rate the events ask for (a sample with a call chain is taken
/// as 512 bytes, without as 64), between 1 MiB and 32 MiB. Events with a
/// fixed period count as 4 kHz. At the kernel's ceiling of 100 kHz with
/// call chains this is 16 MiB per CPU, 32× perf's default.
pub fn auto_ring_bytes(events: &[EventSpec], callchain: bool) -> usize {
    let hz: u64 = events
        .iter()
        .map(|e| match e.rate {
            SampleRate::Frequency(f) => f,
            SampleRate::Period(_) => vmscope_model::event::DEFAULT_FREQUENCY,
        })
        .sum();
    let per_sample = if callchain { 512.0 } else { 64.0 };
    let want = (hz as f64 * per_sample * RING_SECONDS) as usize;
    want.clamp(MIN_AUTO_RING_BYTES, MAX_AUTO_RING_BYTES)
        .next_power_of_two()
}

/// A set of opened sampling events and their rings.
pub struct Recorder {
    cpus: Vec<u32>,
    /// Every event fd; the ring owners are among them.
    fds: Vec<OwnedFd>,
    /// How `fds[i]` takes a new rate, if it samples at a frequency.
    freq_fd: Vec<RateControl>,
    /// Per event index: hrtimer events whose rate was changed, as
    /// (since, period ns) in time order. The kernel keeps stamping their
    /// samples with the period they were created with (`last_period` is not
    /// updated by PERF_EVENT_IOC_PERIOD), so samples taken after a change
    /// get the period in force when they were taken here.
    period_changes: Vec<Vec<(u64, u64)>>,
    /// How each event (by index) takes a new rate.
    event_ctl: Vec<RateControl>,
    /// One ring per CPU; `pollfds[i]` polls `rings[i]`'s owner fd.
    rings: Vec<Ring>,
    pollfds: Vec<libc::pollfd>,
    hung_up: usize,
    /// A file descriptor whose readability ends [`Recorder::read`]'s wait
    /// early ([`Recorder::set_waker`]); polled after the rings.
    waker: Option<libc::pollfd>,
    /// Decodes for [`Recorder::read`] (a [`Recorder::stream`] decodes
    /// [`Recorder::read_bytes`]'s copies elsewhere).
    stream: RecordStream,
    /// Copy area for records that wrap the ring end ([`Recorder::read`]).
    scratch: Vec<u64>,
    /// Rate changes since the last read (in the next read's mark).
    periods_changed: bool,
    enabled: bool,
}

/// When a read of the rings was made, for decoding it: records stamped
/// after `cutoff` wait for a later read (see [`Recorder::read`]), and the
/// events' rate changes, when they changed since the previous read.
#[derive(Debug, Clone, Default)]
pub struct RawMark {
    cutoff: u64,
    periods: Option<Vec<Vec<(u64, u64)>>>,
}

impl RawMark {
    /// The mark of bytes copied by hand: records stamped after `cutoff`
    /// wait, no rate change.
    pub fn until(cutoff: u64) -> RawMark {
        RawMark {
            cutoff,
            periods: None,
        }
    }
}

/// Ring records copied as the kernel wrote them (headers included, each
/// ring's records in their order), for a [`RecordStream`] to decode,
/// possibly on another thread: copying is all a ring reader then does, as
/// cheap as a recorder that writes the rings to a file.
#[derive(Debug, Default)]
pub struct RawRead {
    /// The records, each padded to whole words (records in a ring are).
    words: Vec<u64>,
    mark: RawMark,
}

impl RawRead {
    pub fn new() -> RawRead {
        RawRead::default()
    }

    /// Append one record (header included; `rec.len()` is the header's
    /// size).
    pub fn push_record(&mut self, rec: &[u8]) {
        let whole = rec.len() / 8 * 8;
        self.extend_bytes(&rec[..whole]);
        if whole < rec.len() {
            // Records in a ring are whole words; a hand-built one may not be.
            let mut last = [0u8; 8];
            last[..rec.len() - whole].copy_from_slice(&rec[whole..]);
            self.words.push(u64::from_ne_bytes(last));
        }
    }

    /// Append whole records as read from a ring (a multiple of 8 bytes; a
    /// trailing partial word is ignored).
    pub fn extend_bytes(&mut self, bytes: &[u8]) {
        self.words.extend(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))),
        );
    }

    /// Replace the records with `len` bytes that `fill` writes (a copy of
    /// ring bytes kept elsewhere), read at `mark`; the allocation is kept.
    pub fn fill_from(
        &mut self,
        mark: RawMark,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        // Grown with zeros only past what earlier reads left: `fill`
        // overwrites the rest.
        let n = len.div_ceil(8);
        if self.words.len() < n {
            self.words.resize(n, 0);
        }
        self.words.truncate(n);
        self.mark = mark;
        fill(&mut as_bytes_mut(&mut self.words)[..len])
    }

    /// The records, in order (a header that cannot frame a record ends
    /// them).
    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let bytes = as_bytes(&self.words);
        let mut pos = 0usize;
        std::iter::from_fn(move || {
            let size = usize::from(u16::from_ne_bytes(
                bytes.get(pos + 6..pos + 8)?.try_into().ok()?,
            ));
            if size < 8 {
                return None;
            }
            let rec = bytes.get(pos..pos + size)?;
            pos += size.div_ceil(8) * 8;
            Some(rec)
        })
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Samples among them.
    pub fn samples(&self) -> usize {
        self.iter()
            .filter(|r| record_type(r) == Some(sys::PERF_RECORD_SAMPLE))
            .count()
    }

    /// Hold records stamped after `t` for a later read (a read of the
    /// rings sets it; for records pushed by hand).
    pub fn set_cutoff(&mut self, t: u64) {
        self.mark.cutoff = t;
    }

    /// Take `mark` as this read's (cutoff, rate changes).
    pub fn set_mark(&mut self, mark: RawMark) {
        self.mark = mark;
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// No record and no rate change.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty() && self.mark.periods.is_none()
    }

    /// Empty, keeping the allocation.
    pub fn clear(&mut self) {
        self.words.clear();
        self.mark = RawMark::default();
    }

    /// Remove the samples and keep every other record, in order; returns
    /// how many samples went (for a reader that must shed load).
    pub fn drop_samples(&mut self) -> u64 {
        let mut kept = RawRead {
            mark: std::mem::take(&mut self.mark),
            ..RawRead::default()
        };
        let mut n = 0;
        for rec in self.iter() {
            if record_type(rec) == Some(sys::PERF_RECORD_SAMPLE) {
                n += 1;
            } else {
                kept.push_record(rec);
            }
        }
        *self = kept;
        n
    }

    /// Append `later`'s records (read after this one's): its cutoff, and
    /// its rate changes when it has any.
    pub fn append(&mut self, later: &RawRead) {
        self.words.extend_from_slice(&later.words);
        self.mark.cutoff = self.mark.cutoff.max(later.mark.cutoff);
        if later.mark.periods.is_some() {
            self.mark.periods.clone_from(&later.mark.periods);
        }
    }
}

fn record_type(rec: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(rec.get(..4)?.try_into().ok()?))
}

/// Decodes [`RawRead`]s into model records in time order across rings
/// (records stamped within the hold-back of a read wait for the next one)
/// and applies rate changes to the samples' periods.
#[derive(Debug)]
pub struct RecordStream {
    decoder: Decoder,
    /// Records decoded but not yet returned, with their sort key.
    staged: Vec<(u64, Record)>,
    lost: u64,
    period_changes: Vec<Vec<(u64, u64)>>,
}

impl RecordStream {
    /// A stream for records of events with kernel ids `ids` (id, index in
    /// the session's event list), with call chains or not.
    pub fn new(callchain: bool, ids: &[(u64, u32)]) -> RecordStream {
        let mut decoder = Decoder::new(callchain);
        for &(id, ev) in ids {
            decoder.add_id(id, ev);
        }
        RecordStream {
            decoder,
            staged: Vec::new(),
            lost: 0,
            period_changes: Vec::new(),
        }
    }

    /// Decode `raw` and append to `out` what is due (everything stamped up
    /// to its cutoff, in time order).
    pub fn decode(&mut self, raw: &RawRead, out: &mut Vec<Record>) {
        for rec in raw.iter() {
            self.decode_record(rec);
        }
        self.release(&raw.mark, out);
    }

    /// Decode one record (header included) and hold it for
    /// [`RecordStream::release`].
    fn decode_record(&mut self, rec: &[u8]) {
        self.decoder.decode(rec, &mut self.staged, &mut self.lost);
    }

    /// Append to `out`, in time order, the records decoded so far and
    /// stamped up to the cutoff of `mark`, with the periods of its rate
    /// changes.
    fn release(&mut self, mark: &RawMark, out: &mut Vec<Record>) {
        if let Some(p) = &mark.periods {
            self.period_changes.clone_from(p);
        }
        let staged = &mut self.staged;
        // Stable sort: held records and each ring are already in time order,
        // so this merges runs.
        staged.sort_by_key(|&(t, _)| t);
        let n = staged.partition_point(|&(t, _)| t <= mark.cutoff);
        out.reserve(n);
        let first = out.len();
        out.extend(staged.drain(..n).map(|(_, r)| r));
        if self.period_changes.iter().any(|c| !c.is_empty()) {
            for r in &mut out[first..] {
                if let Record::Sample(s) = r {
                    if let Some(changes) = self.period_changes.get(s.event as usize) {
                        let i = changes.partition_point(|&(since, _)| since <= s.time);
                        if i > 0 {
                            s.period = changes[i - 1].1;
                        }
                    }
                }
            }
        }
    }

    /// Append to `out` every record held back for ordering (the reads are
    /// over).
    pub fn flush(&mut self, out: &mut Vec<Record>) {
        self.release(&RawMark::until(u64::MAX), out);
    }

    /// Give back the chain vectors of samples already converted, emptied
    /// or not, for the next samples to reuse (see `Decoder::recycle`).
    pub fn recycle(&mut self, chains: impl IntoIterator<Item = Vec<(CpuMode, u64)>>) {
        self.decoder.recycle(chains);
    }

    /// Records the kernel dropped so far (sum of PERF_RECORD_LOST counts).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Records decoded and held for a later read.
    pub fn staged(&self) -> usize {
        self.staged.len()
    }
}

/// Records stamped less than this before a read are held for the next one:
/// a record can become visible in its ring slightly after its timestamp, and
/// holding them back keeps the stream in time order across reads.
const HOLD_BACK_NS: u64 = 2_000_000;

/// perf_event_open(2) with CLOEXEC. `libc` has no wrapper for it (glibc
/// does not either); perf-event-open-sys2 provides the raw syscall.
pub(crate) fn sys_open(attr: &mut perf_event_attr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid, fully initialized perf_event_attr whose size
    // field matches the struct; no group fd.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            attr,
            pid,
            cpu,
            -1,
            libc::c_ulong::from(sys::PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A zeroed attr of the current struct size. The bindgen struct is
/// non-exhaustive; `Default` zeroes every field, padding and unions included.
pub(crate) fn new_attr(type_: u32, config: u64) -> perf_event_attr {
    let mut attr = perf_event_attr::default();
    attr.type_ = type_;
    attr.size = std::mem::size_of::<perf_event_attr>() as u32;
    attr.config = config;
    attr
}

fn errno_name(e: i32) -> &'static str {
    match e {
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        _ => "error",
    }
}

/// Turn a perf_event_open failure into the error a user can act on.
fn open_error(err: io::Error, ev: &EventSpec, target: &str, cpu: u32, opened: usize) -> LinuxError {
    let name = ev.kind.name();
    let code = err.raw_os_error().unwrap_or(0);
    match code {
        libc::ENOENT | libc::EOPNOTSUPP => unsupported(&name),
        libc::ENODEV if ev.kind.is_hardware() => unsupported(&name),
        libc::EACCES | libc::EPERM => LinuxError::PermissionDenied {
            event: name,
            target: target.to_string(),
            errno: errno_name(code),
            paranoid: perf_event_paranoid(),
        },
        libc::EMFILE | libc::ENFILE => LinuxError::TooManyFiles { opened },
        libc::EINVAL => match (ev.rate, perf_event_max_sample_rate()) {
            (SampleRate::Frequency(f), Some(max)) if f > max => LinuxError::FrequencyTooHigh {
                event: name,
                freq: f,
                max,
            },
            _ => LinuxError::Open {
                event: name,
                target: target.to_string(),
                cpu,
                source: err,
            },
        },
        _ => LinuxError::Open {
            event: name,
            target: target.to_string(),
            cpu,
            source: err,
        },
    }
}

pub(crate) fn unsupported(name: &str) -> LinuxError {
    LinuxError::UnsupportedEvent {
        event: name.to_string(),
        working: working_events().join(", "),
    }
}

/// Names of the events of [`EventKind::NAMED`] that perf_event_open accepts
/// here (probed once per process as counting events on the caller).
pub fn working_events() -> Vec<String> {
    static WORKING: OnceLock<Vec<String>> = OnceLock::new();
    WORKING
        .get_or_init(|| {
            EventKind::NAMED
                .into_iter()
                .filter(|k| {
                    let (t, c) = k.perf_type_config();
                    let mut attr = new_attr(t, c);
                    attr.set_disabled(1);
                    attr.set_exclude_kernel(1);
                    attr.set_exclude_hv(1);
                    sys_open(&mut attr, 0, -1).is_ok()
                })
                .map(vmscope_model::EventKind::name)
                .collect()
        })
        .clone()
}

struct AttrParams {
    side_band: bool,
    callchain: bool,
    inherit: bool,
    build_id: bool,
    ksymbol: bool,
    wakeup_bytes: u32,
}

fn sample_attr(ev: &EventSpec, p: &AttrParams) -> perf_event_attr {
    let (t, c) = ev.kind.perf_type_config();
    let mut attr = new_attr(t, c);
    attr.sample_type = SAMPLE_TYPE;
    if p.callchain {
        attr.sample_type |= u64::from(sys::PERF_SAMPLE_CALLCHAIN);
    }
    match ev.rate {
        SampleRate::Frequency(f) => {
            attr.set_freq(1);
            attr.__bindgen_anon_1.sample_freq = f;
        }
        SampleRate::Period(n) => attr.__bindgen_anon_1.sample_period = n,
    }
    attr.set_disabled(1);
    attr.set_inherit(u64::from(p.inherit));
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    attr.set_exclude_guest(0);
    // Wake the reader when a ring is half full, not per record.
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = p.wakeup_bytes;
    if p.side_band {
        // mmap2 without mmap_data: executable mappings only. `mmap` must be
        // set too: the kernel counts mmap listeners by attr.mmap/mmap_data
        // only (account_event), and with none it emits no MMAP2 at all.
        attr.set_mmap(1);
        attr.set_mmap2(1);
        attr.set_comm(1);
        attr.set_comm_exec(1);
        attr.set_task(1);
        attr.set_build_id(u64::from(p.build_id));
        // BPF programs and trampolines loaded while recording: names
        // that the kallsyms read at the start does not have.
        attr.set_ksymbol(u64::from(p.ksymbol));
    }
    attr
}

/// Threads of `pid` from `/proc/PID/task`.
fn threads_of(pid: u32) -> Result<Vec<u32>, LinuxError> {
    crate::ProcRoot::system()
        .tids(pid)
        .map_err(|_| LinuxError::NoSuchProcess(pid))
}

/// How an event's rate is changed while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RateControl {
    /// A fixed period the user gave: never changed.
    Fixed,
    /// A frequency the kernel keeps adjusting the period for: the ioctl
    /// takes the new frequency.
    Frequency,
    /// cpu-clock and task-clock: hrtimer events whose frequency the kernel
    /// turns into a fixed period in ns when the event is created
    /// (perf_swevent_init_hrtimer clears attr.freq), so the ioctl takes a
    /// period in ns.
    HrtimerPeriod,
}

impl RateControl {
    fn of(ev: &EventSpec) -> RateControl {
        match (ev.rate, ev.kind) {
            (SampleRate::Period(_), _) => RateControl::Fixed,
            (SampleRate::Frequency(_), EventKind::CpuClock | EventKind::TaskClock) => {
                RateControl::HrtimerPeriod
            }
            (SampleRate::Frequency(_), _) => RateControl::Frequency,
        }
    }
}

impl Recorder {
    /// Open every event on every online CPU (and thread, for
    /// [`Target::Pids`]), disabled; [`Recorder::enable`] starts sampling.
    pub fn open(opts: &RingOptions) -> Result<Recorder, LinuxError> {
        if opts.events.is_empty() {
            return Err(LinuxError::Options("no event to record".into()));
        }
        if opts.ring_pages != 0 && !opts.ring_pages.is_power_of_two() {
            return Err(LinuxError::Options(format!(
                "ring_pages must be a power of two, not {}",
                opts.ring_pages
            )));
        }
        if opts.events.len() > u32::MAX as usize {
            return Err(LinuxError::Options("too many events".into()));
        }
        let cpus = online_cpus(Path::new("/sys"))?;
        let page = page_size();
        let data_pages = match opts.ring_pages {
            0 => (auto_ring_bytes(&opts.events, opts.callchain) / page).max(1),
            n => n,
        };
        let ring_bytes = data_pages * page;

        // (pid of the process, tid to open) pairs; -1 for all tasks.
        let targets: Vec<(u32, i32)> = match &opts.target {
            Target::AllCpus => vec![(u32::MAX, -1)],
            Target::Pids(pids) => {
                if pids.is_empty() {
                    return Err(LinuxError::Options("no pid to record".into()));
                }
                let mut v = Vec::new();
                for &pid in pids {
                    for tid in threads_of(pid)? {
                        v.push((pid, tid as i32));
                    }
                }
                v.sort_unstable_by_key(|&(_, t)| t);
                v.dedup_by_key(|&mut (_, t)| t);
                v
            }
        };

        let mut rec = Recorder {
            cpus: cpus.clone(),
            fds: Vec::new(),
            freq_fd: Vec::new(),
            period_changes: vec![Vec::new(); opts.events.len()],
            event_ctl: opts.events.iter().map(RateControl::of).collect(),
            rings: Vec::new(),
            pollfds: Vec::new(),
            hung_up: 0,
            waker: None,
            stream: RecordStream::new(opts.callchain, &[]),
            scratch: Vec::new(),
            periods_changed: false,
            enabled: false,
        };
        let mut params = AttrParams {
            side_band: false,
            callchain: opts.callchain,
            inherit: matches!(opts.target, Target::Pids(_)),
            build_id: true,
            ksymbol: true,
            wakeup_bytes: (ring_bytes / 2).min(u32::MAX as usize) as u32,
        };
        for &cpu in &cpus {
            let mut owner: Option<RawFd> = None;
            for &(pid, tid) in &targets {
                let target = if tid < 0 {
                    "all CPUs".to_string()
                } else if pid == tid as u32 {
                    format!("pid {pid}")
                } else {
                    format!("pid {pid} (thread {tid})")
                };
                for (idx, ev) in opts.events.iter().enumerate() {
                    params.side_band = idx == 0;
                    let mut attr = sample_attr(ev, &params);
                    let mut res = sys_open(&mut attr, tid, cpu as i32);
                    // Kernels before 5.12 reject the build_id bit, before
                    // 5.1 the ksymbol bit: drop them in that order.
                    let einval = |r: &io::Result<_>| matches!(r, Err(e) if e.raw_os_error() == Some(libc::EINVAL));
                    if params.side_band && params.build_id && einval(&res) {
                        params.build_id = false;
                        res = sys_open(&mut sample_attr(ev, &params), tid, cpu as i32);
                    }
                    if params.side_band && params.ksymbol && einval(&res) {
                        params.ksymbol = false;
                        res = sys_open(&mut sample_attr(ev, &params), tid, cpu as i32);
                    }
                    let fd = match res {
                        Ok(fd) => fd,
                        Err(e) if e.raw_os_error() == Some(libc::ESRCH) && tid >= 0 => {
                            if pid == tid as u32 {
                                return Err(LinuxError::NoSuchProcess(pid));
                            }
                            // A thread that exited since /proc was listed.
                            break;
                        }
                        Err(e) => {
                            return Err(open_error(e, ev, &target, cpu, rec.fds.len()));
                        }
                    };
                    let raw = fd.as_raw_fd();
                    let mut id = 0u64;
                    // SAFETY: raw is an open perf fd; id is a valid u64 out-pointer.
                    if unsafe { ioctls::ID(raw, &raw mut id) } < 0 {
                        return Err(LinuxError::Sys {
                            what: "PERF_EVENT_IOC_ID",
                            source: io::Error::last_os_error(),
                        });
                    }
                    rec.stream.decoder.add_id(id, idx as u32);
                    match owner {
                        None => {
                            let ring = Ring::map(raw, data_pages, page).map_err(|source| {
                                LinuxError::Mmap {
                                    cpu,
                                    bytes: ring_bytes + page,
                                    source,
                                }
                            })?;
                            rec.rings.push(ring);
                            rec.pollfds.push(libc::pollfd {
                                fd: raw,
                                events: libc::POLLIN,
                                revents: 0,
                            });
                            owner = Some(raw);
                        }
                        Some(o) => {
                            // SAFETY: both are open perf fds of the same CPU.
                            if unsafe { ioctls::SET_OUTPUT(raw, o) } < 0 {
                                return Err(LinuxError::Sys {
                                    what: "PERF_EVENT_IOC_SET_OUTPUT",
                                    source: io::Error::last_os_error(),
                                });
                            }
                        }
                    }
                    rec.fds.push(fd);
                    rec.freq_fd.push(RateControl::of(ev));
                }
            }
        }
        if rec.fds.is_empty() {
            if let Target::Pids(p) = &opts.target {
                return Err(LinuxError::NoSuchProcess(p[0]));
            }
        }
        Ok(rec)
    }

    fn ioctl_all(
        &self,
        what: &'static str,
        f: unsafe fn(i32, u32) -> i32,
    ) -> Result<(), LinuxError> {
        crate::sys::ioctl_all(&self.fds, what, f)
    }

    /// Start sampling (inherited child events follow).
    pub fn enable(&mut self) -> Result<(), LinuxError> {
        self.ioctl_all("PERF_EVENT_IOC_ENABLE", ioctls::ENABLE)?;
        self.enabled = true;
        Ok(())
    }

    /// Change the rate of every event that samples at a frequency to `hz`
    /// (PERF_EVENT_IOC_PERIOD: the frequency itself, or for cpu-clock and
    /// task-clock the period of `hz` in ns); events with a fixed period are
    /// left alone. Returns how many event fds changed.
    pub fn set_frequency(&mut self, hz: u64) -> Result<usize, LinuxError> {
        let mut n = 0;
        let hz = hz.max(1);
        let since = clock_monotonic_ns();
        for (fd, ctl) in self.fds.iter().zip(&self.freq_fd) {
            let mut v = match ctl {
                RateControl::Fixed => continue,
                RateControl::Frequency => hz,
                RateControl::HrtimerPeriod => 1_000_000_000 / hz,
            };
            // The kernel reads the new value through a pointer
            // (copy_from_user of a u64); the binding declares the argument
            // as a plain u64, so the pointer is passed as one.
            // SAFETY: fd is an open perf fd; v outlives the call.
            if unsafe { ioctls::PERIOD(fd.as_raw_fd(), (&raw mut v) as u64) } < 0 {
                return Err(LinuxError::Sys {
                    what: "PERF_EVENT_IOC_PERIOD",
                    source: io::Error::last_os_error(),
                });
            }
            n += 1;
        }
        for (changes, ctl) in self.period_changes.iter_mut().zip(&self.event_ctl) {
            if *ctl == RateControl::HrtimerPeriod {
                changes.push((since, 1_000_000_000 / hz));
                self.periods_changed = true;
            }
        }
        Ok(n)
    }

    /// Whether any event samples at a frequency ([`Recorder::set_frequency`]
    /// can change it).
    pub fn has_frequency_events(&self) -> bool {
        self.freq_fd.iter().any(|f| *f != RateControl::Fixed)
    }

    /// Stop sampling; what is already in the rings can still be read.
    pub fn disable(&mut self) -> Result<(), LinuxError> {
        self.ioctl_all("PERF_EVENT_IOC_DISABLE", ioctls::DISABLE)?;
        self.enabled = false;
        Ok(())
    }

    /// Wait up to `timeout` for a ring to fill past its watermark (half),
    /// then drain every ring and append the records to `out` sorted by time.
    ///
    /// While enabled, records stamped within the last 2 ms are held for the
    /// next call, so that successive calls also follow each other in time;
    /// after [`Recorder::disable`] a call returns everything.
    pub fn read(&mut self, timeout: Duration, out: &mut Vec<Record>) -> Result<(), LinuxError> {
        let mark = self.wait(timeout)?;
        let Recorder {
            rings,
            stream,
            scratch,
            ..
        } = self;
        // Decoded in place (records that wrap the ring's end are copied).
        for ring in rings.iter_mut() {
            ring.drain(scratch, |rec| stream.decode_record(rec));
        }
        stream.release(&mark, out);
        Ok(())
    }

    /// Wait for the rings as [`Recorder::read`] does, then hand every
    /// ring's readable bytes to `f` as they are (whole records, each ring's
    /// in order; a ring that wraps gives two slices), for a
    /// [`Recorder::stream`] to decode with the returned mark. `f` may
    /// write them to a file: nothing is decoded here.
    pub fn read_bytes(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(&[u8]),
    ) -> Result<RawMark, LinuxError> {
        let mark = self.wait(timeout)?;
        for ring in self.rings.iter_mut() {
            ring.drain_bytes(&mut f);
        }
        Ok(mark)
    }

    /// Wait up to `timeout` for the rings (or the waker), note rings whose
    /// task is gone, and give the mark of the read that follows.
    fn wait(&mut self, timeout: Duration) -> Result<RawMark, LinuxError> {
        if let Some(w) = self.waker {
            // The waker is polled last; it is never a ring.
            self.pollfds.push(w);
            let r = crate::sys::poll_fds(&mut self.pollfds, timeout, "poll on perf rings");
            let w = self.pollfds.pop().expect("pushed above");
            if w.revents & libc::POLLIN != 0 {
                let mut buf = [0u8; 8];
                // SAFETY: reads at most 8 bytes into a local buffer; the fd
                // is non-blocking (set_waker's contract), so this never waits.
                let _ = unsafe { libc::read(w.fd, buf.as_mut_ptr().cast(), buf.len()) };
            }
            r?;
        } else {
            crate::sys::poll_fds(&mut self.pollfds, timeout, "poll on perf rings")?;
        }
        for p in &mut self.pollfds {
            if p.fd >= 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                // The traced task is gone: stop polling (POLLHUP would make
                // every later poll return at once), keep draining.
                p.fd = -1;
                self.hung_up += 1;
            }
            p.revents = 0;
        }
        let mark = RawMark {
            cutoff: if self.enabled {
                clock_monotonic_ns().saturating_sub(HOLD_BACK_NS)
            } else {
                u64::MAX
            },
            periods: std::mem::take(&mut self.periods_changed).then(|| self.period_changes.clone()),
        };
        Ok(mark)
    }

    /// A decoder for this recorder's [`Recorder::read_bytes`] copies (its
    /// events' ids, call chains or not, the rate changes so far).
    pub fn stream(&self) -> RecordStream {
        RecordStream {
            decoder: self.stream.decoder.config(),
            staged: Vec::new(),
            lost: 0,
            period_changes: self.period_changes.clone(),
        }
    }

    /// Let `fd` end [`Recorder::read`]'s wait when it becomes readable (an
    /// eventfd another thread writes to when it wants an answer sooner
    /// than the rings fill). Each read that sees it readable reads it once
    /// (8 bytes: an eventfd's counter); `fd` must be non-blocking and stay
    /// open as long as this recorder reads.
    pub fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        self.waker = Some(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }

    /// Online CPUs that have a ring, in ring order.
    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Records the kernel dropped so far, of those [`Recorder::read`]
    /// decoded (a [`Recorder::stream`] counts its own).
    pub fn lost(&self) -> u64 {
        self.stream.lost()
    }

    /// True when every ring's owner task has exited ([`Target::Pids`]); the
    /// rings may still hold records, which [`Recorder::read`] returns.
    pub fn all_exited(&self) -> bool {
        !self.pollfds.is_empty() && self.hung_up == self.pollfds.len()
    }

    /// True while some ring or the hold-back buffer has records not yet read.
    pub fn has_pending(&self) -> bool {
        self.stream.staged() > 0 || self.rings.iter().any(Ring::has_data)
    }

    /// Number of perf_event descriptors held.
    pub fn fd_count(&self) -> usize {
        self.fds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words_bytes(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn raw_sample(id: u64, time: u64) -> Vec<u8> {
        let body = [id, 0xffff_ffff_8100_0000, 1 | (1u64 << 32), time, 0, 1];
        words_bytes(&crate::decode::tests::record(
            sys::PERF_RECORD_SAMPLE,
            sys::PERF_RECORD_MISC_KERNEL as u16,
            &words_bytes(&body),
        ))
    }

    fn raw_exit(pid: u32, time: u64) -> Vec<u8> {
        let body = [u64::from(pid) | u64::from(pid) << 32, 0, time];
        words_bytes(&crate::decode::tests::record(
            sys::PERF_RECORD_EXIT,
            0,
            &words_bytes(&body),
        ))
    }

    fn times(out: &[Record]) -> Vec<u64> {
        out.iter()
            .map(|r| match r {
                Record::Sample(s) => s.time,
                Record::Exit { time, .. } => *time,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// A raw read decodes like the rings it copied: time order across
    /// rings, records past the cutoff held until a later read or the
    /// flush, records of unknown events skipped.
    #[test]
    fn a_stream_orders_raw_reads_across_rings_and_holds_back_past_the_cutoff() {
        let mut s = RecordStream::new(false, &[(7, 0), (8, 1)]);
        let mut raw = RawRead::new();
        // Ring 0, then ring 1, each in its own order.
        for rec in [raw_sample(7, 10), raw_sample(8, 40), raw_exit(5, 50)] {
            raw.push_record(&rec);
        }
        for rec in [raw_sample(7, 20), raw_sample(99, 25), raw_sample(7, 45)] {
            raw.push_record(&rec);
        }
        assert_eq!((raw.len(), raw.samples()), (6, 5));
        raw.set_cutoff(42);
        let mut out = Vec::new();
        s.decode(&raw, &mut out);
        assert_eq!(times(&out), [10, 20, 40]);
        assert_eq!(s.staged(), 2);
        out.clear();
        s.flush(&mut out);
        assert_eq!(times(&out), [45, 50]);
    }

    /// Shedding a read's samples keeps its other records in order;
    /// appending keeps both reads' records, the later cutoff.
    #[test]
    fn dropping_samples_keeps_other_records_and_append_keeps_order() {
        let mut a = RawRead::new();
        for rec in [
            raw_sample(7, 1),
            raw_exit(5, 2),
            raw_sample(7, 3),
            raw_exit(6, 4),
        ] {
            a.push_record(&rec);
        }
        a.set_cutoff(4);
        assert_eq!(a.drop_samples(), 2);
        assert_eq!((a.len(), a.samples()), (2, 0));
        let mut b = RawRead::new();
        b.push_record(&raw_sample(7, 5));
        b.set_cutoff(9);
        a.append(&b);
        assert_eq!((a.len(), a.samples()), (3, 1));
        let mut out = Vec::new();
        RecordStream::new(false, &[(7, 0)]).decode(&a, &mut out);
        assert_eq!(times(&out), [2, 4, 5]);
    }

    #[test]
    fn error_lines_name_the_input() {
        let ev = EventSpec::parse("instructions", 1000).unwrap();
        let e = open_error(
            io::Error::from_raw_os_error(libc::ENOENT),
            &ev,
            "all CPUs",
            0,
            0,
        );
        let s = e.to_string();
        assert!(
            s.starts_with("event 'instructions' is not supported here"),
            "{s}"
        );
        assert!(s.contains("events that work here: "), "{s}");
        let e = open_error(
            io::Error::from_raw_os_error(libc::EACCES),
            &ev,
            "all CPUs",
            0,
            0,
        );
        let s = e.to_string();
        assert!(
            s.contains("CAP_PERFMON") && s.contains("perf_event_paranoid = "),
            "{s}"
        );
        let e = open_error(
            io::Error::from_raw_os_error(libc::EMFILE),
            &ev,
            "pid 1",
            0,
            900,
        );
        assert!(e.to_string().contains("ulimit -n"));
        let e = open_error(
            io::Error::from_raw_os_error(libc::EBUSY),
            &ev,
            "pid 1",
            3,
            0,
        );
        let s = e.to_string();
        assert!(
            s.contains("'instructions'") && s.contains("pid 1") && s.contains("CPU 3"),
            "{s}"
        );
        assert!(!s.contains('\n'));
    }

    #[test]
    fn too_high_frequency_is_explained() {
        let Some(max) = perf_event_max_sample_rate() else {
            return;
        };
        let ev = EventSpec {
            kind: EventKind::CpuClock,
            rate: SampleRate::Frequency(max + 1),
        };
        let e = open_error(
            io::Error::from_raw_os_error(libc::EINVAL),
            &ev,
            "all CPUs",
            0,
            0,
        );
        assert!(matches!(e, LinuxError::FrequencyTooHigh { .. }), "{e}");
    }

    #[test]
    fn attrs_carry_the_contract() {
        let ev = EventSpec::parse("cpu-clock:250000", 1).unwrap();
        let p = AttrParams {
            side_band: true,
            callchain: true,
            inherit: true,
            build_id: true,
            ksymbol: true,
            wakeup_bytes: 4096,
        };
        let a = sample_attr(&ev, &p);
        assert_eq!(
            a.sample_type,
            SAMPLE_TYPE | u64::from(sys::PERF_SAMPLE_CALLCHAIN)
        );
        // SAFETY: reading the union member that was written.
        assert_eq!(unsafe { a.__bindgen_anon_1.sample_period }, 250_000);
        assert_eq!(a.freq(), 0);
        assert_eq!(
            (a.mmap2(), a.comm(), a.comm_exec(), a.task(), a.inherit()),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(
            (a.sample_id_all(), a.use_clockid(), a.clockid),
            (1, 1, libc::CLOCK_MONOTONIC)
        );
        assert_eq!((a.disabled(), a.exclude_guest(), a.mmap_data()), (1, 0, 0));
        assert_eq!((a.build_id(), a.ksymbol()), (1, 1));
        let f = EventSpec::parse("cpu-clock", 999).unwrap();
        let b = sample_attr(
            &f,
            &AttrParams {
                side_band: false,
                callchain: false,
                ..p
            },
        );
        assert_eq!((b.freq(), b.mmap2(), b.comm(), b.task()), (1, 0, 0, 0));
        assert_eq!(b.ksymbol(), 0);
        // SAFETY: as above.
        assert_eq!(unsafe { b.__bindgen_anon_1.sample_freq }, 999);
        assert_eq!(b.sample_type, SAMPLE_TYPE);
    }

    #[test]
    fn rings_grow_with_the_rate_between_1_and_32_mib() {
        let ev = |hz| {
            vec![EventSpec {
                kind: EventKind::CpuClock,
                rate: SampleRate::Frequency(hz),
            }]
        };
        assert_eq!(auto_ring_bytes(&ev(99), true), 1 << 20);
        assert_eq!(auto_ring_bytes(&ev(4000), false), 1 << 20);
        // 100 kHz with call chains: 12.8 MB -> 16 MiB.
        assert_eq!(auto_ring_bytes(&ev(100_000), true), 16 << 20);
        assert_eq!(auto_ring_bytes(&ev(100_000), false), 2 << 20);
        assert_eq!(auto_ring_bytes(&ev(10_000_000), true), 32 << 20);
    }

    #[test]
    fn bad_options_are_refused() {
        let mut o = RingOptions {
            ring_pages: 3,
            ..RingOptions::default()
        };
        let e = Recorder::open(&o).err().unwrap().to_string();
        assert!(e.contains("power of two"), "{e}");
        o.ring_pages = 0;
        o.events.clear();
        assert!(matches!(Recorder::open(&o), Err(LinuxError::Options(_))));
        let o = RingOptions {
            target: Target::Pids(vec![]),
            ..RingOptions::default()
        };
        assert!(matches!(Recorder::open(&o), Err(LinuxError::Options(_))));
    }
}
