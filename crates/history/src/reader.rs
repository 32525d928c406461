//! Reading a history: which segments cover which times ([`History`]), the
//! documents and timeline of a range, and a range extracted into one
//! session ([`History::extract`]) that `report` reads like any recording
//! (its rows summed over the range; its `history` interval rows each
//! domain's CPU, steal and I/O per step of [`step_for`] the range). A segment that
//! cannot be read (damaged by hand, cut by a full disk before its first
//! interval) is skipped with one line ([`History::skipped`]); the others
//! are read. A segment being written is read up to its last interval.

use crate::{segments, time, HistoryError};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use vmscope_model::{Profile, UNKNOWN_SLICE};
use vmscope_store::{
    DomainRecord, IntervalRow, ScaleRow, Session, SessionWriter, Slice, TimelineRow, View,
};

/// One readable segment.
struct Segment {
    seq: u64,
    path: PathBuf,
    session: Session,
    /// Wall-clock time of its second 0.
    start: f64,
    /// First interval start and last interval end, if it holds any.
    span: Option<(f64, f64)>,
    /// File size when the span was read (a growing segment is read again).
    size: u64,
    /// Its first document when the later ones take it as their dictionary
    /// (crate::frames, segments of `first`), read once.
    dict: std::cell::OnceCell<Option<Vec<u8>>>,
    /// Its meta's `frames_dictionary`, read once.
    frames_by: std::cell::OnceCell<Option<String>>,
}

/// The page cache of each open segment, KiB.
const SEGMENT_CACHE_KIB: u32 = 256;

/// The largest document a frame may inflate to.
const FRAME_LIMIT: usize = 64 << 20;

/// The segments of a history directory, open for reading.
pub struct History {
    dir: PathBuf,
    segments: Vec<Segment>,
    skipped: Vec<String>,
    /// Segments already said to be skipped (by path).
    said: std::collections::HashSet<PathBuf>,
}

/// One interval's document.
#[derive(Debug, Clone)]
pub struct FrameDoc {
    pub t_end: f64,
    pub interval_s: f64,
    pub doc: Vec<u8>,
}

/// What [`History::extract`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// Wall-clock time of the session's second 0.
    pub start: f64,
    pub seconds: f64,
    /// Intervals recorded in the range.
    pub intervals: u64,
    pub segments: usize,
    /// Seconds per point of its timeline and bins ([`step_for`]).
    pub step: u32,
}

impl History {
    /// Open every segment in `dir` (a directory that holds none is an
    /// empty history).
    pub fn open(dir: &Path) -> Result<History, HistoryError> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(HistoryError::Dir(format!(
                    "{}: not a history directory (it is a file; serve --history DIR writes one)",
                    dir.display()
                )))
            }
            Err(e) => {
                return Err(HistoryError::Dir(format!(
                    "{}: cannot read the history: {e}",
                    dir.display()
                )))
            }
        }
        let mut h = History {
            dir: dir.to_path_buf(),
            segments: Vec::new(),
            skipped: Vec::new(),
            said: Default::default(),
        };
        h.refresh()?;
        Ok(h)
    }

    /// Take in segments started since, drop removed ones, and read the
    /// span of those that grew.
    pub fn refresh(&mut self) -> Result<(), HistoryError> {
        let now = segments(&self.dir)?;
        let known: HashMap<u64, usize> = self
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| (s.seq, i))
            .collect();
        let mut old: Vec<Option<Segment>> = std::mem::take(&mut self.segments)
            .into_iter()
            .map(Some)
            .collect();
        for (seq, path) in now {
            let size = crate::segment_bytes(&path);
            if let Some(mut s) = known.get(&seq).and_then(|i| old[*i].take()) {
                if s.size != size {
                    s.span = s.session.history_span().unwrap_or(s.span);
                    s.size = size;
                }
                self.segments.push(s);
                continue;
            }
            let opened = Session::open_compact(&path).and_then(|session| {
                session.limit_cache(SEGMENT_CACHE_KIB)?;
                let start = session
                    .meta()?
                    .get("started_at")
                    .and_then(|v| v.parse::<f64>().ok());
                let span = session.history_span()?;
                Ok((session, start, span))
            });
            match opened {
                Ok((session, Some(start), span)) => self.segments.push(Segment {
                    seq,
                    path,
                    session,
                    start,
                    span,
                    size,
                    dict: std::cell::OnceCell::new(),
                    frames_by: std::cell::OnceCell::new(),
                }),
                Ok((_, None, _)) => self.skip(
                    &path,
                    "skipped: it has no start time (not a history segment)".into(),
                ),
                Err(e) => self.skip(&path, format!("skipped: {e}")),
            }
        }
        Ok(())
    }

    fn skip(&mut self, path: &Path, why: String) {
        if self.said.insert(path.to_path_buf()) {
            let line = if why.contains(&*path.display().to_string()) {
                format!("history: {why}")
            } else {
                format!("history: {}: {why}", path.display())
            };
            self.skipped.push(line);
        }
    }

    /// One line per segment that could not be read (since the last call).
    pub fn take_skipped(&mut self) -> Vec<String> {
        std::mem::take(&mut self.skipped)
    }

    /// The first and last time the history holds.
    pub fn span(&self) -> Option<(f64, f64)> {
        let spans = self.segments.iter().filter_map(|s| s.span);
        let a = spans.clone().map(|s| s.0).reduce(f64::min)?;
        let b = spans.map(|s| s.1).reduce(f64::max)?;
        Some((a, b))
    }

    /// The error for `what` (`--at 03:05`) outside the history: it names
    /// the range that exists.
    pub fn outside(&self, what: &str, utc: bool) -> HistoryError {
        HistoryError::Range(match self.span() {
            Some((a, b)) => format!(
                "{what}: outside the history in {}, which holds {} to {}",
                self.dir.display(),
                time::show(a, utc),
                time::show(b, utc)
            ),
            None => format!(
                "{what}: the history in {} holds no intervals yet (is serve --history {} running?)",
                self.dir.display(),
                self.dir.display()
            ),
        })
    }

    fn overlapping(&self, from: f64, to: f64) -> impl Iterator<Item = &Segment> {
        self.segments
            .iter()
            .filter(move |s| s.span.is_some_and(|(a, b)| b >= from && a <= to))
    }

    /// The documents of the intervals ending in `[from, to]`, in time
    /// order (where the wall clock stepped back, the later recording of a
    /// repeated time comes after the earlier one).
    pub fn frames(&self, from: f64, to: f64) -> Result<Vec<FrameDoc>, HistoryError> {
        let mut out = Vec::new();
        for s in self.overlapping(from, to) {
            let damaged = |e: std::io::Error| HistoryError::Io {
                path: s.path.clone(),
                source: e,
            };
            let by = if let Some(b) = s.frames_by.get() {
                b
            } else {
                let b = s.session.meta()?.get(crate::frames::META.0).cloned();
                s.frames_by.get_or_init(|| b)
            };
            if by.as_deref() == Some(crate::frames::META.1) {
                let all = s.session.history_frames_written()?;
                chained(&all, from, to, &mut out).map_err(damaged)?;
                continue;
            }
            let dict = if let Some(d) = s.dict.get() {
                d
            } else {
                let uses = by.as_deref() == Some(crate::frames::META_FIRST);
                match s.session.history_first_frame()? {
                    Some(blob) if uses => {
                        let d =
                            crate::frames::inflate(&blob, None, FRAME_LIMIT).map_err(damaged)?;
                        s.dict.get_or_init(|| Some(d))
                    }
                    // No document yet: nothing to read, nothing to keep.
                    None if uses => continue,
                    _ => s.dict.get_or_init(|| None),
                }
            };
            for (first, t_end, interval_s, blob) in s.session.history_frames(from, to)? {
                let with = if first { None } else { dict.as_deref() };
                let doc = crate::frames::inflate(&blob, with, FRAME_LIMIT).map_err(damaged)?;
                out.push(FrameDoc {
                    t_end,
                    interval_s,
                    doc,
                });
            }
        }
        out.sort_by(|a, b| a.t_end.total_cmp(&b.t_end));
        Ok(out)
    }

    /// Each domain's timeline in `[from, to]`, summed over buckets of
    /// `bucket_s` seconds (0: each interval as recorded), as
    /// [`Session::history_timeline`] buckets them.
    pub fn timeline(
        &self,
        from: f64,
        to: f64,
        bucket_s: f64,
    ) -> Result<Vec<TimelineRow>, HistoryError> {
        let mut per: BTreeMap<(u64, String), TimelineRow> = BTreeMap::new();
        for s in self.overlapping(from, to) {
            for r in s.session.history_timeline(from, to, bucket_s)? {
                let key = ((r.t_end * 1000.0).round() as u64, r.domain.clone());
                match per.get_mut(&key) {
                    Some(e) => {
                        e.interval_s += r.interval_s;
                        e.cpu_s += r.cpu_s;
                        e.steal_s += r.steal_s;
                        e.io_s += r.io_s;
                        e.io_ops += r.io_ops;
                    }
                    None => {
                        per.insert(key, r);
                    }
                }
            }
        }
        Ok(per.into_values().collect())
    }

    /// Write the range `[from, to]` as one session at `out`: the profile
    /// rows of its whole seconds summed over the range (host and agents,
    /// each active VM's scale for exactly those seconds; a report of a
    /// history range does not slice it again, so their second is the
    /// unknown one), the domains, build-ids, and the timeline and the
    /// host's per-second bins in steps of [`step_for`] the range's length
    /// (1 s up to 24 minutes), the timeline as `history` interval rows.
    /// Its second 0 is `from` rounded down to a step of the clock (whole
    /// seconds at 1 s); meta `bin_seconds` is the step. A segment the
    /// range holds all of is read from its rollup (its rows summed when
    /// it was closed) when there is one and the step is a multiple of its
    /// ten seconds, else from its blocks.
    ///
    /// Why steps: a day of 1 s intervals of 33 domains is 11.4 million
    /// interval rows and 5.7 million bins, which took most of the 281 s
    /// and 879 MiB a report of a generated day (32 VMs) took here when
    /// each was written as it was recorded; no chart or table shows more
    /// than about 1,440 points of a range.
    pub fn extract(&self, from: f64, to: f64, out: &Path) -> Result<Extracted, HistoryError> {
        let step = step_for(to - from);
        // Steps on the clock (the bins of a segment's rollup are per ten
        // seconds of it).
        let start = (from / f64::from(step)).floor() * f64::from(step);
        let mut w = SessionWriter::create(out)?;
        let chosen: Vec<&Segment> = self.overlapping(from, to).collect();
        let mut events_set = false;
        let mut domains: BTreeMap<String, DomainRecord> = BTreeMap::new();
        let mut build_ids: BTreeMap<String, String> = BTreeMap::new();
        let mut scales: BTreeMap<(String, u32), (u64, u64, u64)> = BTreeMap::new();
        let mut meta_done = false;
        let mut host = Profile::new();
        let mut agents = Profile::new();
        for s in &chosen {
            let meta = s.session.meta()?;
            if !meta_done {
                for k in ["hostname", "kernel", "cpus", "callchain"] {
                    if let Some(v) = meta.get(k) {
                        w.set_meta(k, v)?;
                    }
                }
                meta_done = true;
            }
            let events = s.session.events()?;
            if !events_set && !events.is_empty() {
                w.set_events(&events)?;
                events_set = true;
            }
            for d in s.session.domains()? {
                domains.insert(d.domain.name.clone(), d);
            }
            build_ids.extend(s.session.build_ids()?);
            // The segment's whole seconds inside the range.
            let first = (from - s.start).floor().max(0.0) as u32;
            let last_f = (to - s.start).ceil() - 1.0;
            if last_f < f64::from(first) {
                continue;
            }
            let last = last_f as u32;
            // A second of the segment as the start of its step of the range.
            let shift = s.start - start;
            let bin_at = |sec: u32| -> u32 {
                let moved = (f64::from(sec) + shift).round().max(0.0) as u32;
                moved / step * step
            };
            let row_at = |_: u32| UNKNOWN_SLICE;
            let slice = Slice {
                seconds: Some((first, last)),
                cpus: None,
            };
            // Older segments' rows may be in the tables too.
            let tables = |view| -> Result<Vec<vmscope_model::ProfileRow>, HistoryError> {
                Ok(s.session.rows_in(view, &slice, None)?)
            };
            // All of the segment: its rollup, when the steps are made of
            // its ten seconds.
            let whole = first == 0
                && s.span.is_some_and(|(_, b)| to >= b)
                && step.is_multiple_of(vmscope_store::ROLLUP_SECONDS);
            let sums = match whole {
                true => s.session.rollup_sums(&bin_at)?,
                false => None,
            };
            let sums = match sums {
                Some(sums) => Some(sums),
                None => s.session.block_sums(first, last, &row_at, &bin_at)?,
            };
            let (mut host_rows, mut agent_rows, bins) = if let Some(sums) = sums {
                (sums.host, sums.agent, sums.bins)
            } else {
                let mut bins = Vec::new();
                for ev in 0..events.len() as u32 {
                    for (sec, dom, ctx, n) in s.session.bins(ev)? {
                        if sec >= first && sec <= last {
                            bins.push((bin_at(sec), ev, dom.into(), ctx.into(), n));
                        }
                    }
                }
                (Vec::new(), Vec::new(), bins)
            };
            host_rows.extend(tables(View::Host)?);
            agent_rows.extend(tables(View::Agent)?);
            for (p, rows) in [(&mut host, host_rows), (&mut agents, agent_rows)] {
                for r in rows {
                    let mut k = r.key;
                    k.second = UNKNOWN_SLICE;
                    p.add(k, r.samples, r.period);
                }
            }
            for (sec, ev, dom, ctx, n) in bins {
                if let Some(c) = vmscope_model::Context::parse(&ctx) {
                    host.add_bin(sec, ev, dom, c, n);
                }
            }
            for sc in s.session.scale_seconds(first, last)? {
                let e = scales.entry((sc.domain, sc.event)).or_default();
                e.0 += sc.host_period;
                e.1 += sc.agent_period;
                e.2 += sc.agent_samples;
            }
        }
        w.flush(&host)?;
        w.flush_agent(&agents)?;
        drop((host, agents));
        // The timeline in steps, summed across segments; each interval as
        // recorded at 1 s.
        let bucket = if step == 1 { 0.0 } else { f64::from(step) };
        // (Steps of the clock, as `start` is.)
        let mut intervals = 0;
        for s in &chosen {
            intervals += s.session.history_intervals(from, to + 1e-6)?;
        }
        let rows: Vec<IntervalRow> = self
            .timeline(from, to + 1e-6, bucket)?
            .into_iter()
            .flat_map(|r| {
                let t1 = r.t_end - start;
                let t0 = t1 - r.interval_s;
                [
                    ("cpu", r.cpu_s, "s"),
                    ("steal", r.steal_s, "s"),
                    ("io_cpu", r.io_s, "s"),
                    ("io_ops", r.io_ops, "ops"),
                ]
                .map(|(metric, value, unit)| IntervalRow {
                    kind: "history".into(),
                    t_start: t0,
                    t_end: t1,
                    cpu: None,
                    domain: Some(r.domain.clone()),
                    vcpu: None,
                    metric: metric.into(),
                    value,
                    unit: unit.into(),
                })
            })
            .collect();
        w.add_intervals(&rows)?;
        if !domains.contains_key("host") {
            w.upsert_domain(&DomainRecord {
                domain: vmscope_model::Domain::host(),
                status: "running".into(),
                ended_at: None,
                detail: String::new(),
            })?;
        }
        for d in domains.values() {
            w.upsert_domain(d)?;
        }
        for ((domain, event), (host, busy, samples)) in &scales {
            w.set_scale(&ScaleRow {
                domain: domain.clone(),
                event: *event,
                host_period: *host,
                agent_period: *busy,
                agent_samples: *samples,
                agent_lost: 0,
                factor: if *busy > 0 {
                    *host as f64 / *busy as f64
                } else {
                    0.0
                },
            })?;
        }
        w.set_build_ids(&build_ids.into_iter().collect::<Vec<_>>())?;
        let seconds = to - start;
        for (k, v) in [
            ("source", crate::SOURCE.to_string()),
            ("started_at", format!("{start:.3}")),
            ("duration_s", format!("{seconds:.3}")),
            ("bin_seconds", step.to_string()),
            (
                "history_range",
                format!("{} to {}", time::show(from, false), time::show(to, false)),
            ),
        ] {
            w.set_meta(k, &v)?;
        }
        w.close(true)?;
        Ok(Extracted {
            start,
            seconds,
            intervals,
            segments: chosen.len(),
            step,
        })
    }
}

/// The most points a range's timeline and bins are written as.
pub const MOST_STEPS: f64 = 1440.0;

/// The step of a range of `seconds` (its timeline and bins in
/// [`History::extract`]): the shortest of 1, 2, 5, 10, 30 s, 1, 2, 5, 10,
/// 30 min and 1 h that makes at most [`MOST_STEPS`] of them (from 10 s on
/// each a multiple of a rollup's ten seconds).
pub fn step_for(seconds: f64) -> u32 {
    const STEPS: [u32; 11] = [1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600];
    STEPS
        .into_iter()
        .find(|s| seconds / f64::from(*s) <= MOST_STEPS)
        .unwrap_or(3600)
}

/// The documents of `all` (a segment's frames in the order written, each
/// deflated against the one before or the first: crate::frames) that end
/// in `[from, to]`, added to `out`: inflated from the key document before
/// the first of them on.
fn chained(
    all: &[(f64, f64, Vec<u8>)],
    from: f64,
    to: f64,
    out: &mut Vec<FrameDoc>,
) -> std::io::Result<()> {
    use crate::frames::{dictionary_of, inflate, KEY_EVERY};
    let wanted = |t: f64| t >= from && t <= to;
    let (Some(a), Some(b)) = (
        all.iter().position(|f| wanted(f.0)),
        all.iter().rposition(|f| wanted(f.0)),
    ) else {
        return Ok(());
    };
    let key = a - a % KEY_EVERY;
    let mut first = if key > 0 {
        Some(inflate(&all[0].2, None, FRAME_LIMIT)?)
    } else {
        None
    };
    let mut prev: Option<Vec<u8>> = None;
    for (i, (t_end, interval_s, blob)) in all.iter().enumerate().take(b + 1).skip(key) {
        let doc = inflate(
            blob,
            dictionary_of(i, first.as_deref(), prev.as_deref()),
            FRAME_LIMIT,
        )?;
        if i == 0 {
            first = Some(doc.clone());
        }
        if wanted(*t_end) {
            out.push(FrameDoc {
                t_end: *t_end,
                interval_s: *interval_s,
                doc: doc.clone(),
            });
        }
        prev = Some(doc);
    }
    Ok(())
}
