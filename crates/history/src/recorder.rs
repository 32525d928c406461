//! Writing a history: the [`Recorder`] takes one [`Interval`] at a time
//! and keeps it in the open segment, in one transaction (a `kill -9`
//! loses at most the interval being written; every segment, the open one
//! included, stays readable: the store's files are SQLite in WAL mode).
//!
//! It owns the directory's lock (a second recorder is refused, naming the
//! first), starts a new segment every `segment` seconds and when the
//! wall clock steps back, removes the oldest segments past `max_size`
//! bytes or `max_age` (only files named as segments whose meta says
//! [`crate::SOURCE`], or that it wrote itself), and pauses when the file
//! system is full: intervals are dropped (counted) and each one after
//! tries again, so the history resumes by itself when space is back.

use crate::{segment_bytes, segment_name, segments, HistoryError, LOCK_NAME, SOURCE};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vmscope_model::{Profile, SessionEvent, UNKNOWN_SLICE};
use vmscope_store::{DomainRecord, ScaleSecond, SessionWriter, TimelineRow};

/// SQLite page size of a segment. A segment is small and kept for days:
/// with 4 KiB pages its schema's empty tables and indexes alone were about
/// 135 KB, which at 144 segments a day is 18.5 MiB, most of a 1-VM host's
/// 20 MiB a day (bench/history). 1 KiB pages take a quarter of that.
const SEGMENT_PAGE_SIZE: u32 = 1024;

/// Where and how much history is kept.
#[derive(Debug, Clone)]
pub struct HistoryOptions {
    pub dir: PathBuf,
    /// Length of one segment file.
    pub segment: Duration,
    /// The most bytes the closed segments take together (the open one
    /// comes on top: at most one segment's worth).
    pub max_size: u64,
    /// Segments whose last write is older than this are removed.
    pub max_age: Duration,
}

/// Defaults of `serve --history`: 30-minute segments, 1 GiB, 7 days.
/// A segment has a fixed part besides its intervals: its schema's pages
/// and the names its profile blocks use, stored once per segment, about
/// 50 KB on a 1-VM host (`bench/history`), which at 10-minute segments
/// was 7 MiB of the 20 a day that host may take; at 30 minutes it is 2.3.
impl HistoryOptions {
    pub fn new(dir: PathBuf) -> HistoryOptions {
        HistoryOptions {
            dir,
            segment: Duration::from_secs(1800),
            max_size: 1 << 30,
            max_age: Duration::from_secs(7 * 86400),
        }
    }
}

/// One interval of the host, as the recorder keeps it.
pub struct Interval<'a> {
    /// Wall-clock end of the interval, seconds since the epoch.
    pub t_end: f64,
    pub interval_s: f64,
    /// The interval's document (`top`'s frame as JSON), stored compressed.
    pub doc: &'a [u8],
    /// Each domain's CPU, steal and I/O (their `t_end` is set here).
    pub timeline: Vec<TimelineRow>,
    /// The rolling profile's rows since the last interval, keyed by
    /// seconds since [`ProfileInfo::origin`].
    pub host: Option<&'a Profile>,
    pub agent: Option<&'a Profile>,
    /// Active VMs' scale parts, by the same seconds.
    pub scales: Vec<ScaleSecond>,
}

/// What the profile rows of every interval are.
#[derive(Debug, Clone)]
pub struct ProfileInfo {
    /// Wall-clock time of the profile's second 0.
    pub origin: f64,
    pub events: Vec<SessionEvent>,
    pub callchain: bool,
}

/// What the recorder did, for `/metrics` and the benchmark.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecorderState {
    /// Why the history is paused, while it is.
    pub paused: Option<String>,
    pub intervals: u64,
    /// Intervals not kept while paused.
    pub dropped: u64,
    pub segments_started: u64,
    pub segments_removed: u64,
    /// Bytes of the segments in the directory (at the last check).
    pub bytes: u64,
}

/// The open segment.
struct Segment {
    writer: SessionWriter,
    path: PathBuf,
    /// Wall-clock time of its second 0.
    start: f64,
    /// Profile seconds before its second 0 (its rows are stored `- offset`).
    offset: u32,
    /// The domains stored in it.
    domains: usize,
    /// Its first document and its last, the dictionaries of the next
    /// (crate::frames), and how many it holds.
    first_doc: Option<Vec<u8>>,
    last_doc: Option<Vec<u8>>,
    docs: usize,
    /// Its host and agent rows summed so far, kept as its rollup when it
    /// is closed (vmscope_store's `set_row_rollups`).
    rollup: [Profile; 2],
}

impl Segment {
    /// Add an interval's rows (as stored: seconds of the segment) to the
    /// rollup: rows over all seconds, bins per ten seconds of the clock.
    fn roll_up(&mut self, p: &Profile, agent: bool) {
        let r = &mut self.rollup[usize::from(agent)];
        for (k, c) in &p.rows {
            let mut k = k.clone();
            k.second = UNKNOWN_SLICE;
            r.add(k, c.samples, c.period);
        }
        for ((sec, ev, dom, ctx), n) in &p.bins {
            let at = vmscope_store::rollup_second(self.start, *sec);
            r.add_bin(at, *ev, dom.clone(), *ctx, *n);
        }
    }
}

/// The recorder of one history directory.
pub struct Recorder {
    opts: HistoryOptions,
    /// Held (flock) while the recorder lives.
    _lock: std::fs::File,
    next_seq: u64,
    /// Segments this process wrote (removable without a look inside).
    mine: HashSet<PathBuf>,
    /// Files named as segments that are not ours (said once, never removed).
    foreign: HashSet<PathBuf>,
    open: Option<Segment>,
    last_t: Option<f64>,
    state: RecorderState,
    profile: Option<ProfileInfo>,
    meta: Vec<(String, String)>,
    domains: Vec<DomainRecord>,
    build_ids: Vec<(String, String)>,
    notes: Vec<String>,
    appends: u64,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> HistoryError + '_ {
    move |source| HistoryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Take the directory's lock, or say who holds it.
fn lock(dir: &Path) -> Result<std::fs::File, HistoryError> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_NAME);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io(&path))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let holder = std::fs::read_to_string(&path)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "a process that wrote no details".into());
        return Err(HistoryError::Locked {
            dir: dir.to_path_buf(),
            holder,
        });
    }
    f.set_len(0).map_err(io(&path))?;
    writeln!(
        f,
        "pid {}, recording since {}",
        std::process::id(),
        crate::time::show(crate::time::now(), false)
    )
    .map_err(io(&path))?;
    Ok(f)
}

/// `p` with its seconds moved back by `offset` (rows before it at 0).
fn shifted(p: &Profile, offset: u32) -> Profile {
    if offset == 0 {
        return p.clone();
    }
    p.with_seconds(|s| {
        if s == UNKNOWN_SLICE {
            s
        } else {
            s.saturating_sub(offset)
        }
    })
}

impl Recorder {
    /// Check the directory, take its lock and remove what retention says
    /// (no segment is open yet).
    pub fn open(opts: HistoryOptions) -> Result<Recorder, HistoryError> {
        crate::check_dir(&opts.dir)?;
        let lock = lock(&opts.dir)?;
        let next_seq = segments(&opts.dir)?.last().map_or(1, |(s, _)| s + 1);
        let mut r = Recorder {
            opts,
            _lock: lock,
            next_seq,
            mine: HashSet::new(),
            foreign: HashSet::new(),
            open: None,
            last_t: None,
            state: RecorderState::default(),
            profile: None,
            meta: Vec::new(),
            domains: Vec::new(),
            build_ids: Vec::new(),
            notes: Vec::new(),
            appends: 0,
        };
        r.retain();
        Ok(r)
    }

    /// The profile the intervals carry rows of (from the next segment on).
    pub fn set_profile(&mut self, p: ProfileInfo) {
        self.profile = Some(p);
    }

    /// Meta every segment carries (host name, CPUs, ...).
    pub fn set_meta(&mut self, meta: Vec<(String, String)>) {
        self.meta = meta;
    }

    /// The domains (with their roles) and build-ids, stored in the open
    /// segment at the next interval.
    pub fn set_domains(&mut self, domains: Vec<DomainRecord>, build_ids: Vec<(String, String)>) {
        if domains != self.domains {
            self.domains = domains;
            if let Some(s) = &mut self.open {
                s.domains = usize::MAX;
            }
        }
        self.build_ids = build_ids;
    }

    /// What the recorder did so far.
    pub fn state(&self) -> &RecorderState {
        &self.state
    }

    /// Lines for the operator since the last call (a pause, a resume, a
    /// clock step, a segment retention could not prove its own).
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// The open segment's file, if one is open.
    pub fn open_segment(&self) -> Option<&Path> {
        self.open.as_ref().map(|s| s.path.as_path())
    }

    /// Keep one interval. A full file system pauses the history (the
    /// interval is dropped; `Ok`); other errors are returned and the
    /// segment is closed, the next interval opening a new one.
    pub fn append(&mut self, iv: Interval<'_>) -> Result<(), HistoryError> {
        if let Some(last) = self.last_t {
            if iv.t_end < last - 1.0 {
                self.notes.push(format!(
                    "history: the wall clock stepped back {:.1} s (from {} to {}); a new segment starts, and replay shows the times recorded since where they repeat",
                    last - iv.t_end,
                    crate::time::show(last, false),
                    crate::time::show(iv.t_end, false)
                ));
                self.close_segment();
            }
        }
        self.last_t = Some(iv.t_end);
        let r = self.write(&iv);
        match r {
            Ok(()) => {
                self.state.intervals += 1;
                if let Some(why) = self.state.paused.take() {
                    self.notes.push(format!(
                        "history: resumed after {} intervals were dropped ({why})",
                        self.state.dropped
                    ));
                }
                self.appends += 1;
                if self.appends.is_multiple_of(10) {
                    self.retain();
                }
                Ok(())
            }
            Err(e) if e.is_disk_full() => {
                self.state.dropped += 1;
                if self.state.paused.is_none() {
                    let why = e.to_string();
                    self.notes.push(format!(
                        "history: paused: {why}; intervals are dropped until there is space again (/metrics and profiles are still served)"
                    ));
                    self.state.paused = Some(why);
                }
                // The segment keeps what it holds; the next try opens a new one.
                if let Some(s) = self.open.take() {
                    drop(s.writer);
                }
                Ok(())
            }
            Err(e) => {
                self.close_segment();
                Err(e)
            }
        }
    }

    fn write(&mut self, iv: &Interval<'_>) -> Result<(), HistoryError> {
        let begin = iv.t_end - iv.interval_s;
        if self
            .open
            .as_ref()
            .is_some_and(|s| iv.t_end - s.start > self.opts.segment.as_secs_f64())
        {
            self.close_segment();
        }
        if self.open.is_none() {
            self.start_segment(begin)?;
        }
        let Some(seg) = self.open.as_mut() else {
            return Ok(());
        };
        let compact = crate::frames::compact(iv.doc);
        let dict = crate::frames::dictionary_of(
            seg.docs,
            seg.first_doc.as_deref(),
            seg.last_doc.as_deref(),
        );
        let doc = crate::frames::deflate(&compact, dict).map_err(io(&self.opts.dir))?;
        let (offset, start) = (seg.offset, seg.start);
        let domains = (seg.domains != self.domains.len()).then(|| self.domains.clone());
        let build_ids = self.build_ids.clone();
        let timeline: Vec<TimelineRow> = iv
            .timeline
            .iter()
            .map(|r| TimelineRow {
                t_end: iv.t_end,
                interval_s: iv.interval_s,
                ..r.clone()
            })
            .collect();
        let scales: Vec<ScaleSecond> = iv
            .scales
            .iter()
            .map(|s| ScaleSecond {
                second: s.second.saturating_sub(offset),
                ..s.clone()
            })
            .collect();
        let host = iv.host.map(|h| shifted(h, offset));
        let agent = iv.agent.map(|a| shifted(a, offset));
        seg.writer.batch(|w| -> Result<(), HistoryError> {
            w.add_history_interval(iv.t_end, iv.interval_s, &doc, &timeline)?;
            // Rows as blocks (vmscope_store's `blocks`): a tenth of the
            // bytes of the row tables.
            for (p, agent) in [(&host, false), (&agent, true)] {
                if let Some(p) = p {
                    w.add_row_block(p, agent)?;
                }
            }
            if !scales.is_empty() {
                w.add_scale_seconds(&scales)?;
            }
            if let Some(ds) = &domains {
                for d in ds {
                    w.upsert_domain(d)?;
                }
                w.set_build_ids(&build_ids)?;
            }
            w.set_meta("duration_s", &format!("{:.3}", iv.t_end - start))?;
            w.set_meta("history_end", &format!("{:.3}", iv.t_end))?;
            Ok(())
        })?;
        if domains.is_some() {
            seg.domains = self.domains.len();
        }
        for (p, agent) in [(&host, false), (&agent, true)] {
            if let Some(p) = p {
                seg.roll_up(p, agent);
            }
        }
        // Stored: the dictionaries of the documents after it.
        if seg.first_doc.is_none() {
            seg.first_doc = Some(compact.clone());
        }
        seg.last_doc = Some(compact);
        seg.docs += 1;
        Ok(())
    }

    fn start_segment(&mut self, begin: f64) -> Result<(), HistoryError> {
        // Seconds of the segment line up with the profile's seconds.
        let (start, offset) = match &self.profile {
            Some(p) if begin >= p.origin => {
                let k = (begin - p.origin).floor();
                (p.origin + k, k as u32)
            }
            _ => (begin, 0),
        };
        let seq = self.next_seq;
        let path = self.opts.dir.join(segment_name(seq, start));
        self.next_seq += 1;
        let created = (|| -> Result<SessionWriter, HistoryError> {
            let w = SessionWriter::create_paged(&path, Some(SEGMENT_PAGE_SIZE))?;
            w.create_history_tables()?;
            if let Some(p) = &self.profile {
                w.set_events(&p.events)?;
                w.set_meta("callchain", if p.callchain { "1" } else { "0" })?;
            }
            w.set_meta("source", SOURCE)?;
            w.set_meta(crate::frames::META.0, crate::frames::META.1)?;
            w.set_meta("started_at", &format!("{start:.3}"))?;
            w.set_meta("duration_s", "0")?;
            for (k, v) in &self.meta {
                w.set_meta(k, v)?;
            }
            w.upsert_domain(&DomainRecord {
                domain: vmscope_model::Domain::host(),
                status: "running".into(),
                ended_at: None,
                detail: String::new(),
            })?;
            Ok(w)
        })();
        self.mine.insert(path.clone());
        match created {
            Ok(writer) => {
                self.state.segments_started += 1;
                self.open = Some(Segment {
                    writer,
                    path,
                    start,
                    offset,
                    domains: usize::MAX,
                    first_doc: None,
                    last_doc: None,
                    docs: 0,
                    rollup: Default::default(),
                });
                self.retain();
                Ok(())
            }
            Err(e) => {
                // A segment that could not even be started holds nothing.
                remove_segment(&path);
                Err(e)
            }
        }
    }

    /// Close the open segment (clean stop, log folded in).
    fn close_segment(&mut self) {
        if let Some(mut s) = self.open.take() {
            // Its rows summed, for ranges that hold all of it; a segment
            // closed without them (killed, or this failing) is read from
            // its blocks.
            let [host, agent] = &s.rollup;
            if let Err(e) = s.writer.set_row_rollups(host, agent) {
                self.notes
                    .push(format!("history: the rollup of {}: {e}", s.path.display()));
            }
            if let Err(e) = s.writer.close(true) {
                self.notes
                    .push(format!("history: closing {}: {e}", s.path.display()));
            }
        }
    }

    /// Remove the oldest segments (never the open one) while the
    /// directory holds more than `max_size` or they are older than
    /// `max_age`.
    fn retain(&mut self) {
        let Ok(all) = segments(&self.opts.dir) else {
            return;
        };
        // The open segment is the one allowed beyond `max_size`.
        let open = self.open.as_ref().map(|s| s.path.clone());
        let sizes: Vec<u64> = all
            .iter()
            .map(|(_, p)| {
                if Some(p) == open.as_ref() {
                    0
                } else {
                    segment_bytes(p)
                }
            })
            .collect();
        let mut total: u64 = sizes.iter().sum();
        let now = std::time::SystemTime::now();
        for ((_, path), size) in all.iter().zip(&sizes) {
            if Some(path) == open.as_ref() {
                continue;
            }
            let old = std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age > self.opts.max_age);
            if total <= self.opts.max_size && !old {
                continue;
            }
            if self.foreign.contains(path) {
                continue;
            }
            if !self.mine.contains(path) && !is_our_segment(path) {
                self.notes.push(format!(
                    "history: not removing {}: named as a segment but not one (no meta source '{SOURCE}')",
                    path.display()
                ));
                self.foreign.insert(path.clone());
                continue;
            }
            remove_segment(path);
            total = total.saturating_sub(*size);
            self.state.segments_removed += 1;
        }
        self.state.bytes = total + open.as_deref().map_or(0, segment_bytes);
    }

    /// Close the open segment cleanly (at the end of `serve`).
    pub fn close(mut self) {
        self.close_segment();
    }
}

/// Whether a file named as a segment is one: a session whose meta says it
/// was written by [`SOURCE`].
fn is_our_segment(path: &Path) -> bool {
    vmscope_store::Session::open_compact(path)
        .and_then(|s| s.meta())
        .is_ok_and(|m| m.get("source").map(String::as_str) == Some(SOURCE))
}

fn remove_segment(path: &Path) {
    for s in ["", "-wal", "-shm", "-reserve"] {
        let _ = std::fs::remove_file(format!("{}{s}", path.display()));
    }
}
