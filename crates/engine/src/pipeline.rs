//! The converter on its own thread, so reading the rings never waits on
//! conversion: the first sample of a newly seen binary loads that binary's
//! symbol table (ELF symbols, DWARF), which takes tens to hundreds of
//! milliseconds; on the ring-reading thread that stalled the reads and let
//! the rings fill on hosts that exec many short-lived programs.
//!
//! The ring reader only copies: each read of the rings goes over a channel
//! as the kernel wrote it ([`RawRead`]), and this thread decodes it
//! ([`RecordStream`]: time order across rings, rate changes) and converts
//! it. At the kernel's highest sampling rates, decoding on the reader (a chain vector per
//! sample, the sort across rings) kept the reader from draining the rings
//! in time, and the kernel dropped samples. The reader asks for the profile
//! accumulated so far without waiting: the answer comes back on a second
//! channel and is picked up on a later turn of the loop.
//!
//! What waits in the channel is bounded ([`MAX_IN_FLIGHT_BYTES`] of ring
//! records): a converter that cannot keep up must not grow the recorder's
//! memory without end, and must not block the ring reader either (the
//! kernel would drop samples, and the rings' other records with them).
//! Below the bound a converter that falls behind catches up later (at the
//! latest when the recording ends), so nothing is lost to a burst. A read
//! that finds the bound reached keeps its other records, held in order for
//! the next read, and drops its samples, which are counted as lost (a
//! `Lost` record ahead of the held records), as the kernel counts the
//! samples a full ring drops. [`ConvertThread::finish`] waits for every
//! read to be converted and returns the converter (warnings, build-ids,
//! the last delta). The converter thread is a thread of the recorder
//! process, so its CPU time is in the recorder's own cost (getrusage of the
//! process counts every thread).
//!
//! Every symbol table is still loaded once per binary (path, build-id) and
//! cached by the [`vmscope_symbols::Symbolizer`] the converter owns.

use crate::{Converter, ConverterStats, EngineError};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use vmscope_linux::{RawMark, RawRead, RecordStream};
use vmscope_model::{Profile, Record};

/// Bytes of ring records handed over and not yet converted, at most: at
/// `-a -g` and the kernel's default ceiling (100 kHz on two CPUs, about
/// 50 MB/s of records) some 10 s of a converter that does not keep up at
/// all; at `-F 4000`, minutes.
pub const MAX_IN_FLIGHT_BYTES: usize = 512 << 20;

/// Where the ring reader copies the rings: an in-memory file (memfd), so
/// a copy is one write(2) into page-cache pages, which need no zeroing
/// and no page fault, where a copy into fresh heap memory needed both
/// (most of the reader's time at the kernel's highest rates). The
/// converter punches out what it converted, so the file holds only what
/// is in flight.
struct Spill {
    file: File,
    /// Where the next bytes go.
    end: u64,
    /// Bytes up to here are sent to the converter.
    sent: u64,
    /// A write failed: bytes go to memory from here on.
    failed: bool,
}

impl Spill {
    fn create() -> Option<Spill> {
        // SAFETY: a NUL-terminated name and plain flags; the result is
        // checked before it is owned.
        let fd = unsafe { libc::memfd_create(c"vmscope-spill".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a new descriptor owned by nobody else.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Some(Spill {
            file,
            end: 0,
            sent: 0,
            failed: false,
        })
    }
}

/// Free the spill file's pages of bytes converted.
fn punch(file: &File, off: u64, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an open fd with plain arguments; failure (a
    // kernel without hole punching in memfds) only keeps the pages.
    unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        );
    }
}

/// The converter's nice value while the rings are read: on a host whose
/// CPUs are all busy, conversion yields to the workload and to the ring
/// reader (which must drain the rings in time, or the kernel drops
/// samples) and catches up from the records in flight when CPU is free or
/// the recording ends.
const CONVERT_NICE: i32 = 19;

/// Whether this process may lower a nice value again (root, or a nice
/// limit that allows 0): without that, a converter that yielded could not
/// catch up at the usual priority, and on a busy host the recording would
/// take long to end. Such a converter does not yield.
fn can_renice() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: geteuid has no preconditions; getrlimit writes the struct
    // given.
    unsafe {
        libc::geteuid() == 0
            || (libc::getrlimit(libc::RLIMIT_NICE, &raw mut lim) == 0 && lim.rlim_cur >= 20)
    }
}

/// Set the calling thread's nice value; false when refused.
fn set_own_nice(nice: i32) -> bool {
    // SAFETY: gettid has no preconditions; setpriority with PRIO_PROCESS
    // and a thread id changes that thread only (Linux semantics).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0
    }
}

/// How a [`ConvertThread`] runs.
#[derive(Debug, Clone, Copy)]
pub struct PipeOptions {
    /// Bytes of ring records in flight, at most.
    pub limit: usize,
    /// Copies go to a spill file (else, or without a memfd, to memory).
    pub spill: bool,
    /// The converter yields while the rings are read ([`CONVERT_NICE`]).
    pub yield_cpu: bool,
}

enum Msg {
    /// Records in memory, after a `Lost` record for this many samples
    /// dropped before them.
    Raw(RawRead, u64),
    /// One read of the rings, `len` bytes at `off` in the spill file.
    Spilled { off: u64, len: usize, mark: RawMark },
    /// Send what accumulated since the previous take, with the counters.
    Take,
}

/// What the converter accumulated since the previous take.
pub struct Taken {
    pub delta: Profile,
    /// Rows of numbers since the previous take when symbolization is
    /// deferred ([`Converter::take_raw`]): stored with `delta`.
    pub raw: vmscope_model::RawDelta,
    /// Counters, cumulative, as of this delta.
    pub stats: ConverterStats,
}

/// A [`Converter`] running on a helper thread; see the module docs.
pub struct ConvertThread {
    tx: Option<Sender<Msg>>,
    done: Receiver<Taken>,
    /// Taken answers asked for and not yet received.
    outstanding: usize,
    /// Counters as of the last answer received.
    stats: ConverterStats,
    handle: Option<JoinHandle<Converter>>,
    /// Bytes sent and not yet converted (the converter decrements).
    in_flight: Arc<AtomicUsize>,
    /// Records of reads that found the bound reached, other than samples,
    /// in order, waiting for room.
    held: RawRead,
    /// The ring copies of the read under way ([`ConvertThread::copy`]).
    spill: Option<Spill>,
    /// Copies that did not go to the spill file.
    mem: RawRead,
    /// Set by [`ConvertThread::finish`]: the converter catches up at the
    /// usual priority.
    finishing: Arc<AtomicBool>,
    /// Samples dropped since the last read sent.
    unsent_lost: u64,
    /// Samples dropped in all.
    dropped: u64,
    limit: usize,
}

impl ConvertThread {
    /// Move `conv` and `stream` (the decoder of the recorder's reads) to a
    /// new thread named `vmscope-convert`.
    pub fn spawn(conv: Converter, stream: RecordStream) -> Result<ConvertThread, EngineError> {
        ConvertThread::spawn_with(
            conv,
            stream,
            PipeOptions {
                limit: MAX_IN_FLIGHT_BYTES,
                spill: true,
                yield_cpu: true,
            },
        )
    }

    /// [`ConvertThread::spawn`] with other options.
    pub fn spawn_with(
        conv: Converter,
        stream: RecordStream,
        opts: PipeOptions,
    ) -> Result<ConvertThread, EngineError> {
        let PipeOptions {
            limit,
            spill,
            yield_cpu,
        } = opts;
        let (tx, rx) = channel::<Msg>();
        let (done_tx, done) = channel::<Taken>();
        let stats = conv.stats().clone();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let counter = in_flight.clone();
        let finishing = Arc::new(AtomicBool::new(false));
        let ending = finishing.clone();
        let spill = if spill { Spill::create() } else { None };
        let spilled =
            match &spill {
                Some(sp) => Some(sp.file.try_clone().map_err(|e| {
                    EngineError::Invalid(format!("cannot share the spill file: {e}"))
                })?),
                None => None,
            };
        // VMSCOPE_DUMP_RECORDS=1 prints the record stream (debugging aid).
        let dump = std::env::var_os("VMSCOPE_DUMP_RECORDS").is_some();
        let handle = std::thread::Builder::new()
            .name("vmscope-convert".into())
            .spawn(move || {
                let yielding = yield_cpu && can_renice() && set_own_nice(CONVERT_NICE);
                let (mut conv, mut stream) = (conv, stream);
                conv.keep_spent_chains();
                let mut recs = Vec::new();
                let mut chunk = RawRead::new();
                let convert = |conv: &mut Converter, recs: &mut Vec<Record>| {
                    if dump {
                        for r in recs.iter() {
                            eprintln!("{r:?}");
                        }
                    }
                    conv.push_batch(recs.drain(..));
                };
                for msg in rx {
                    if yielding && finishing.load(Ordering::Acquire) {
                        // The reads are over: catch up at the usual
                        // priority (fails without CAP_SYS_NICE; then
                        // conversion finishes at the lower one).
                        set_own_nice(0);
                    }
                    match msg {
                        Msg::Raw(raw, dropped) => {
                            if dropped > 0 {
                                recs.push(Record::Lost {
                                    cpu: None,
                                    count: dropped,
                                });
                            }
                            stream.decode(&raw, &mut recs);
                            convert(&mut conv, &mut recs);
                            // Chains are decoded and freed on this thread.
                            stream.recycle(conv.take_spent_chains());
                            counter.fetch_sub(raw.bytes(), Ordering::AcqRel);
                        }
                        Msg::Spilled { off, len, mark } => {
                            // Sent only with a spill file, so `spilled` is
                            // there. Only what this process wrote is read
                            // back; a failed read loses the read, counted
                            // nowhere.
                            if let Some(f) = &spilled {
                                if chunk
                                    .fill_from(mark, len, |b| f.read_exact_at(b, off))
                                    .is_ok()
                                {
                                    stream.decode(&chunk, &mut recs);
                                    convert(&mut conv, &mut recs);
                                    stream.recycle(conv.take_spent_chains());
                                }
                                punch(f, off, len);
                            }
                            counter.fetch_sub(len, Ordering::AcqRel);
                        }
                        Msg::Take => {
                            let t = Taken {
                                delta: conv.take_delta(),
                                raw: conv.take_raw(),
                                stats: conv.stats().clone(),
                            };
                            // The reader gone: nothing to answer.
                            let _ = done_tx.send(t);
                        }
                    }
                }
                // The reader is done: what was held back for ordering goes.
                stream.flush(&mut recs);
                convert(&mut conv, &mut recs);
                conv
            })
            .map_err(|e| EngineError::Invalid(format!("cannot start the converter thread: {e}")))?;
        Ok(ConvertThread {
            tx: Some(tx),
            done,
            outstanding: 0,
            stats,
            handle: Some(handle),
            in_flight,
            held: RawRead::new(),
            spill,
            mem: RawRead::new(),
            finishing: ending,
            unsent_lost: 0,
            dropped: 0,
            limit,
        })
    }

    /// Take a copy of ring bytes ([`vmscope_linux::Recorder::read_bytes`]):
    /// into the spill file, or memory when there is none or a write
    /// failed. [`ConvertThread::push_read`] hands them over.
    pub fn copy(&mut self, bytes: &[u8]) {
        if let Some(sp) = self.spill.as_mut().filter(|sp| !sp.failed) {
            match sp.file.write_all_at(bytes, sp.end) {
                Ok(()) => {
                    sp.end += bytes.len() as u64;
                    return;
                }
                // A full memory cgroup or tmpfs limit: memory from here.
                Err(_) => sp.failed = true,
            }
        }
        self.mem.extend_bytes(bytes);
    }

    /// Hand over what [`ConvertThread::copy`] took since the last call, read
    /// at `mark` (never blocks). When the bytes in flight would pass the
    /// bound, the read's samples are dropped and counted as lost, and its
    /// other records wait for the next read (module docs). A converter
    /// with nothing to do takes the read whatever its size.
    pub fn push_read(&mut self, mark: RawMark) {
        let spilled = self
            .spill
            .as_ref()
            .map_or(0, |sp| (sp.end - sp.sent) as usize);
        let len = spilled + self.mem.bytes();
        let in_flight = self.in_flight.load(Ordering::Acquire);
        if in_flight > 0 && in_flight + self.held.bytes() + len > self.limit {
            // Over the bound: the read back in memory, to keep its other
            // records; the file's space is written again.
            let mut all = RawRead::new();
            if let Some(sp) = self.spill.as_mut() {
                let off = sp.sent;
                if all
                    .fill_from(RawMark::default(), spilled, |b| {
                        sp.file.read_exact_at(b, off)
                    })
                    .is_err()
                {
                    all.clear();
                }
                sp.end = sp.sent;
            }
            all.set_mark(mark);
            all.append(&std::mem::take(&mut self.mem));
            self.hold(all);
            return;
        }
        if !self.held.is_empty() || self.unsent_lost > 0 {
            let held = std::mem::take(&mut self.held);
            self.send(held);
        }
        let mut sent = false;
        if let Some(sp) = self.spill.as_mut() {
            if spilled > 0 {
                let off = sp.sent;
                sp.sent = sp.end;
                if let Some(tx) = &self.tx {
                    self.in_flight.fetch_add(spilled, Ordering::AcqRel);
                    let _ = tx.send(Msg::Spilled {
                        off,
                        len: spilled,
                        mark: mark.clone(),
                    });
                }
                sent = true;
            }
        }
        // A read with nothing to copy may still carry rate changes.
        if self.mem.bytes() > 0 || !sent {
            let mut mem = std::mem::take(&mut self.mem);
            mem.set_mark(mark);
            self.send(mem);
        }
    }

    /// Samples dropped because the converter was behind (also counted in
    /// its lost samples once it converted the `Lost` record).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn hold(&mut self, mut raw: RawRead) {
        let n = raw.drop_samples();
        self.unsent_lost += n;
        self.dropped += n;
        self.held.append(&raw);
    }

    /// The held records followed by `raw`'s.
    fn with_held(&mut self, raw: RawRead) -> RawRead {
        if self.held.is_empty() {
            return raw;
        }
        let mut all = std::mem::take(&mut self.held);
        all.append(&raw);
        all
    }

    fn send(&mut self, raw: RawRead) {
        let lost = std::mem::take(&mut self.unsent_lost);
        if raw.is_empty() && lost == 0 {
            return;
        }
        if let Some(tx) = &self.tx {
            self.in_flight.fetch_add(raw.bytes(), Ordering::AcqRel);
            // A send fails only when the thread ended (it panicked);
            // `finish` reports that.
            let _ = tx.send(Msg::Raw(raw, lost));
        }
    }

    /// Ask for the profile accumulated so far (never blocks); answers come
    /// from [`ConvertThread::try_taken`]. At most one question is
    /// outstanding: asking again before the answer came is a no-op.
    pub fn ask(&mut self) {
        if self.outstanding > 0 {
            return;
        }
        if let Some(tx) = &self.tx {
            if tx.send(Msg::Take).is_ok() {
                self.outstanding += 1;
            }
        }
    }

    /// The answers that have arrived (never blocks).
    pub fn try_taken(&mut self) -> Vec<Taken> {
        let v: Vec<Taken> = self.done.try_iter().collect();
        self.outstanding = self.outstanding.saturating_sub(v.len());
        if let Some(t) = v.last() {
            self.stats = t.stats.clone();
        }
        v
    }

    /// Counters as of the last answer received.
    pub fn stats(&self) -> &ConverterStats {
        &self.stats
    }

    /// Wait until every read handed over is converted; returns the answers
    /// not yet collected (in order) and the converter, whose remaining
    /// delta the caller takes.
    pub fn finish(mut self) -> Result<(Vec<Taken>, Converter), EngineError> {
        // What waited for room goes now (the reader is done: waiting is fine).
        let rest = self.with_held(RawRead::new());
        self.finishing.store(true, Ordering::Release);
        self.send(rest);
        drop(self.tx.take());
        let conv = self
            .handle
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| EngineError::Invalid("the converter thread panicked".into()))?;
        let taken: Vec<Taken> = self.done.try_iter().collect();
        Ok((taken, conv))
    }
}

impl Drop for ConvertThread {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_symbols::{Symbolizer, SymbolizerOptions};

    const ID: u64 = 7;

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// A kernel sample as the rings hold it (this crate's sample layout,
    /// no call chain): header, id, ip, pid/tid, time, cpu, period.
    fn sample(time: u64, ip: u64) -> Vec<u8> {
        let size = 8 + 6 * 8;
        words(&[9 | 1 << 32 | (size as u64) << 48, ID, ip, 0, time, 0, 1])
    }

    /// PERF_RECORD_COMM naming `pid` "c<pid>", with the sample_id_all
    /// trailer (pid/tid, time, cpu, id).
    fn comm(pid: u32, time: u64) -> Vec<u8> {
        let mut name = [0u8; 8];
        let s = format!("c{pid}");
        name[..s.len()].copy_from_slice(s.as_bytes());
        let size = 8 + 8 + 8 + 32;
        let pt = u64::from(pid) | u64::from(pid) << 32;
        words(&[
            3 | (size as u64) << 48,
            pt,
            u64::from_ne_bytes(name),
            pt,
            time,
            0,
            ID,
        ])
    }

    fn read_of(recs: &[Vec<u8>]) -> RawRead {
        let mut r = RawRead::new();
        for rec in recs {
            r.push_record(rec);
        }
        r.set_cutoff(u64::MAX);
        r
    }

    /// Hand `recs` over as one read of the rings, read at `cutoff`.
    fn push(t: &mut ConvertThread, recs: &[Vec<u8>], cutoff: u64) {
        for rec in recs {
            t.copy(rec);
        }
        t.push_read(RawMark::until(cutoff));
    }

    /// Options of a converter that does not yield: these tests share the
    /// machine with others, and a converter at nice 19 would wait on them.
    fn opts(limit: usize, spill: bool) -> PipeOptions {
        PipeOptions {
            limit,
            spill,
            yield_cpu: false,
        }
    }

    fn stream() -> RecordStream {
        RecordStream::new(false, &[(ID, 0)])
    }

    fn converter() -> Converter {
        let opts = SymbolizerOptions {
            kallsyms: Some("/nonexistent/kallsyms".into()),
            ..SymbolizerOptions::default()
        };
        Converter::new(Symbolizer::new(opts), Default::default())
    }

    const KERNEL_IP: u64 = 0xffff_ffff_8100_0000;

    /// The same reads give the same profile and counters on the thread as
    /// decoded and converted on the caller's thread, whether taken in
    /// pieces or at the end.
    #[test]
    fn converts_like_the_inline_converter() {
        let reads: Vec<Vec<Vec<u8>>> = (0..50u64)
            .map(|b| {
                (0..40u64)
                    .map(|i| sample(b * 100_000_000 + i * 1_000, KERNEL_IP))
                    .collect()
            })
            .collect();
        let mut inline = converter();
        let mut s = stream();
        for r in &reads {
            let mut out = Vec::new();
            s.decode(&read_of(r), &mut out);
            inline.push_batch(out);
        }
        let want = inline.take_delta();

        for spill in [true, false] {
            let mut t =
                ConvertThread::spawn_with(converter(), stream(), opts(MAX_IN_FLIGHT_BYTES, spill))
                    .unwrap();
            let mut got = Profile::new();
            for (i, r) in reads.iter().enumerate() {
                push(&mut t, r, u64::MAX);
                if i % 7 == 0 {
                    t.ask();
                }
                for taken in t.try_taken() {
                    got.merge(taken.delta);
                }
            }
            let (rest, mut conv) = t.finish().unwrap();
            for taken in rest {
                got.merge(taken.delta);
            }
            got.merge(conv.take_delta());
            assert_eq!(conv.stats().samples, 2000, "spill {spill}");
            assert_eq!(got.total_samples, 2000);
            assert_eq!(got.rows, want.rows);
            assert_eq!(got.bins, want.bins);
        }
    }

    /// The nice values of this process's threads named `name` (tests run
    /// side by side, each with its own converter).
    fn nices_of(name: &str) -> Vec<i64> {
        let mut v = Vec::new();
        for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            if comm.trim_end() != name {
                continue;
            }
            // After the parenthesized comm: state is field 3, nice 19.
            if let Some(n) = stat
                .rfind(')')
                .and_then(|i| stat[i + 2..].split(' ').nth(16))
                .and_then(|n| n.parse().ok())
            {
                v.push(n);
            }
        }
        v
    }

    /// While the rings are read the converter yields (nice 19) when the
    /// process could take that back; else it keeps the usual priority.
    #[test]
    fn the_converter_yields_while_the_rings_are_read() {
        let mut t = ConvertThread::spawn(converter(), stream()).unwrap();
        push(&mut t, &[sample(1_000, KERNEL_IP)], u64::MAX);
        let want = if can_renice() { 19 } else { 0 };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let nices = nices_of("vmscope-convert");
            if nices.contains(&want) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no converter at nice {want}: {nices:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let (_, conv) = t.finish().unwrap();
        assert_eq!(conv.stats().samples, 1);
    }

    /// Records held back for ordering (past a read's cutoff) are converted
    /// when the reads end.
    #[test]
    fn records_past_the_last_cutoff_are_converted_at_the_end() {
        let mut t =
            ConvertThread::spawn_with(converter(), stream(), opts(MAX_IN_FLIGHT_BYTES, true))
                .unwrap();
        push(
            &mut t,
            &[sample(1_000, KERNEL_IP), sample(9_000, KERNEL_IP)],
            5_000,
        );
        let (_, conv) = t.finish().unwrap();
        assert_eq!(conv.stats().samples, 2);
    }

    /// Past the bound, samples are counted as lost instead of queued, the
    /// other records still reach the converter, and samples + lost add up
    /// to every sample handed over.
    #[test]
    fn a_full_channel_drops_samples_as_lost_and_keeps_other_records() {
        for spill in [true, false] {
            a_full_channel_drops(spill);
        }
    }

    fn a_full_channel_drops(spill: bool) {
        let one = sample(0, KERNEL_IP).len();
        let mut t =
            ConvertThread::spawn_with(converter(), stream(), opts(100 * one, spill)).unwrap();
        // Past the bound, but nothing in flight: taken whole.
        let first: Vec<Vec<u8>> = (0..150u64).map(|i| sample(i * 1_000, KERNEL_IP)).collect();
        push(&mut t, &first, u64::MAX);
        assert_eq!(t.dropped(), 0);
        // A long read keeps the converter busy (distinct addresses: each
        // one converted on its own): the next one is past the bound with
        // records in flight, so its samples are dropped.
        let long: Vec<Vec<u8>> = (0..200_000u64)
            .map(|i| sample(1_000_000 + i, KERNEL_IP + i * 16))
            .collect();
        push(&mut t, &long, u64::MAX);
        let mut handed = 150 + 200_000u64;
        for b in 1..200u64 {
            let n = if b == 1 { 150 } else { 60 };
            let mut recs: Vec<Vec<u8>> = (0..n)
                .map(|i| sample(b * 100_000_000 + i * 1_000, KERNEL_IP))
                .collect();
            recs.insert(30, comm(1000 + b as u32, b * 100_000_000 + 29_500));
            handed += n;
            push(&mut t, &recs, u64::MAX);
        }
        let dropped = t.dropped();
        let (_, mut conv) = t.finish().unwrap();
        let st = conv.stats().clone();
        assert!(dropped >= 150, "spill {spill}: {dropped}");
        assert_eq!(st.lost, dropped);
        assert_eq!(st.samples + st.lost, handed, "spill {spill}: {st:?}");
        // Every comm reached the converter, dropped reads' too.
        let named = (1..200u32)
            .filter(|b| *conv.comm(1000 + b, 1000 + b) == *format!("c{}", 1000 + b))
            .count();
        assert_eq!(named, 199, "spill {spill}");
        let p = conv.take_delta();
        assert_eq!(p.lost.values().sum::<u64>(), dropped);
    }
}
