//! What a history segment (`serve --history`, the `vmscope_history`
//! crate) adds to a session: `frames`, one row per interval with its
//! `top` document as the recorder encoded it (opaque bytes here) and its
//! timeline, each domain's CPU, steal and I/O as numbers (what a
//! timeline over a day reads without decoding a document). Other sessions
//! do not have it; [`Session::has_history`] says whether one does. Times
//! are wall-clock seconds since the epoch, at the interval's end.
//!
//! The timeline is a blob of LEB128 varints: the row count, then per
//! domain its name (an id in `block_strings`, crate::blocks), CPU, steal
//! and I/O CPU in microseconds and I/O operations in thousandths. Segments
//! written before it kept a `timeline` table of one row of REALs per
//! domain and interval, and an index on `frames(t_end)`: in a 1-VM
//! segment of `bench/history` those took 69 and 12 bytes a second, the
//! blob 14 (the frames of a segment, 1,800 at 1 s, are scanned in order),
//! and the times REALs of 8 bytes each, now whole milliseconds.

use crate::{Result, Session, SessionWriter, StoreError};
use rusqlite::params;

/// One domain in one interval of a history.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineRow {
    /// Wall-clock end of the interval, seconds since the epoch.
    pub t_end: f64,
    pub interval_s: f64,
    /// `host` or a VM's name.
    pub domain: String,
    /// CPU the domain used in the interval, seconds (of one host CPU).
    pub cpu_s: f64,
    /// Time its vCPUs waited runnable (steal), seconds summed over vCPUs.
    pub steal_s: f64,
    /// Host CPU for its I/O, seconds.
    pub io_s: f64,
    /// I/O operations in the interval.
    pub io_ops: f64,
}

const CREATE: &str = "
    CREATE TABLE IF NOT EXISTS frames(
        t_ms INTEGER NOT NULL, iv_ms INTEGER NOT NULL, doc BLOB NOT NULL, timeline BLOB);";

/// `frames`' times as seconds in SQL, (end, length): whole milliseconds
/// since the epoch in `t_ms` and `iv_ms` (6 and 2 bytes; all segments
/// written since), or the REALs `t_end` and `interval_s` of older ones.
fn frame_times(s: &Session) -> Result<(&'static str, &'static str)> {
    let n: i64 = s.sql().row(
        "SELECT COUNT(*) FROM pragma_table_info('frames') WHERE name = 't_ms'",
        [],
        |r| r.get(0),
    )?;
    Ok(if n == 1 {
        ("(t_ms / 1000.0)", "(iv_ms / 1000.0)")
    } else {
        ("t_end", "interval_s")
    })
}

/// Whether the session keeps its timeline in the `timeline` table (a
/// segment written before the timeline moved into `frames`).
fn timeline_table(s: &Session) -> Result<bool> {
    let n: i64 = s.sql().row(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'timeline'",
        [],
        |r| r.get(0),
    )?;
    Ok(n == 1)
}

fn micros(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1e6).round() as u64
    } else {
        0
    }
}

/// A timeline blob's rows (`t_end` and `interval_s` left 0), `None` if it
/// does not decode.
fn decode_timeline(blob: &[u8], names: &[std::sync::Arc<str>]) -> Option<Vec<TimelineRow>> {
    use vmscope_model::deferred::blocks::get_varint;
    let mut at = 0;
    let n = get_varint(blob, &mut at)?;
    let mut out = Vec::with_capacity(n.min(1 << 16) as usize);
    for _ in 0..n {
        let domain = names.get(usize::try_from(get_varint(blob, &mut at)?).ok()?)?;
        let mut v = [0f64; 4];
        for x in &mut v {
            *x = get_varint(blob, &mut at)? as f64;
        }
        out.push(TimelineRow {
            t_end: 0.0,
            interval_s: 0.0,
            domain: domain.to_string(),
            cpu_s: v[0] / 1e6,
            steal_s: v[1] / 1e6,
            io_s: v[2] / 1e6,
            io_ops: v[3] / 1e3,
        });
    }
    (at == blob.len()).then_some(out)
}

/// A frame as [`Session::history_frames`] gives it: whether it is the
/// segment's first, its end, its length and its document as stored.
pub type StoredFrame = (bool, f64, f64, Vec<u8>);

impl SessionWriter {
    /// Add the history tables (once, when a segment is created).
    pub fn create_history_tables(&self) -> Result<()> {
        self.sql().execute_batch(CREATE)?;
        self.sql().execute_batch(crate::blocks::CREATE)?;
        self.set_meta(crate::blocks::META.0, crate::blocks::META.1)
    }

    /// One interval of a history: its document and its timeline rows.
    pub fn add_history_interval(
        &mut self,
        t_end: f64,
        interval_s: f64,
        doc: &[u8],
        timeline: &[TimelineRow],
    ) -> Result<()> {
        use vmscope_model::deferred::blocks::put_varint;
        let mut new = crate::blocks::NewIds::default();
        let mut blob = Vec::with_capacity(8 + timeline.len() * 8);
        put_varint(&mut blob, timeline.len() as u64);
        for r in timeline {
            let id = self.block_string(&r.domain, &mut new.strings)?;
            put_varint(&mut blob, id as u64);
            for v in [r.cpu_s, r.steal_s, r.io_s] {
                put_varint(&mut blob, micros(v));
            }
            put_varint(&mut blob, micros(r.io_ops / 1e3));
        }
        self.with_strings(new, |tx| {
            tx.prepare_cached(
                "INSERT INTO frames(t_ms, iv_ms, doc, timeline) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                (t_end * 1e3).round() as i64,
                (interval_s * 1e3).round() as i64,
                doc,
                blob
            ])?;
            Ok(())
        })
    }
}

impl Session {
    /// Whether this session is a history segment (has its `frames`).
    pub fn has_history(&self) -> Result<bool> {
        let n: i64 = self.sql().row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'frames'",
            [],
            |r| r.get(0),
        )?;
        Ok(n == 1)
    }

    /// The first and last interval end stored, `None` when there is none.
    pub fn history_span(&self) -> Result<Option<(f64, f64)>> {
        if !self.has_history()? {
            return Ok(None);
        }
        let (t, iv) = frame_times(self)?;
        self.sql().row(
            &format!("SELECT MIN({t} - {iv}), MAX({t}) FROM frames"),
            [],
            |r| {
                Ok(
                    match (r.get::<_, Option<f64>>(0)?, r.get::<_, Option<f64>>(1)?) {
                        (Some(a), Some(b)) => Some((a, b)),
                        _ => None,
                    },
                )
            },
        )
    }

    /// How many intervals end in `[from, to]`.
    pub fn history_intervals(&self, from: f64, to: f64) -> Result<u64> {
        if !self.has_history()? {
            return Ok(0);
        }
        let (t, _) = frame_times(self)?;
        self.sql().row(
            &format!("SELECT COUNT(*) FROM frames WHERE {t} >= ?1 AND {t} <= ?2"),
            params![from, to],
            |r| r.get::<_, i64>(0).map(|n| n as u64),
        )
    }

    /// Documents of the intervals ending in `[from, to]`, in time order:
    /// (whether it is the segment's first, end, length, document).
    pub fn history_frames(&self, from: f64, to: f64) -> Result<Vec<StoredFrame>> {
        if !self.has_history()? {
            return Ok(Vec::new());
        }
        let (t, iv) = frame_times(self)?;
        self.sql().rows(
            &format!(
                "SELECT rowid = (SELECT MIN(rowid) FROM frames), {t}, {iv}, doc FROM frames
                 WHERE {t} >= ?1 AND {t} <= ?2 ORDER BY {t}, rowid"
            ),
            params![from, to],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
    }

    /// Every frame (end, length, document as stored) in the order written.
    pub fn history_frames_written(&self) -> Result<Vec<(f64, f64, Vec<u8>)>> {
        if !self.has_history()? {
            return Ok(Vec::new());
        }
        let (t, iv) = frame_times(self)?;
        self.sql().rows(
            &format!("SELECT {t}, {iv}, doc FROM frames ORDER BY rowid"),
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    }

    /// The segment's first document as stored.
    pub fn history_first_frame(&self) -> Result<Option<Vec<u8>>> {
        if !self.has_history()? {
            return Ok(None);
        }
        self.sql()
            .rows("SELECT doc FROM frames ORDER BY rowid LIMIT 1", [], |r| {
                r.get(0)
            })
            .map(|v: Vec<Vec<u8>>| v.into_iter().next())
    }

    /// Timeline rows of the intervals ending in `[from, to]`, summed per
    /// domain over buckets of `bucket_s` seconds of the clock (from the
    /// epoch: 10 s buckets start at :00, :10, ...), each
    /// interval in the bucket that holds its middle (each row's `t_end` is
    /// then the bucket's end, `interval_s` the time its rows cover; an
    /// interval's end is taken a few milliseconds after the tick, so its
    /// end could fall either side of a bucket's). A `bucket_s` of 0 gives
    /// each interval as recorded.
    pub fn history_timeline(&self, from: f64, to: f64, bucket_s: f64) -> Result<Vec<TimelineRow>> {
        if !self.has_history()? {
            return Ok(Vec::new());
        }
        // Each interval alone: a bucket key that is its end.
        let each = bucket_s <= 0.0;
        if timeline_table(self)? {
            return self.sql().rows(
                "SELECT CASE WHEN ?3 > 0 THEN (CAST((t_end - interval_s / 2) / ?3 AS INTEGER) + 1) * ?3
                   ELSE t_end END AS b, SUM(interval_s), domain,
                   SUM(cpu_s), SUM(steal_s), SUM(io_s), SUM(io_ops)
                 FROM timeline WHERE t_end >= ?1 AND t_end <= ?2 GROUP BY b, domain ORDER BY b, domain",
                params![from, to, bucket_s],
                |r| {
                    Ok(TimelineRow {
                        t_end: r.get(0)?,
                        interval_s: r.get(1)?,
                        domain: r.get(2)?,
                        cpu_s: r.get(3)?,
                        steal_s: r.get(4)?,
                        io_s: r.get(5)?,
                        io_ops: r.get(6)?,
                    })
                },
            );
        }
        let names = crate::blocks::strings(&self.conn).map_err(crate::sql::sql_err(&self.path))?;
        let (t, iv) = frame_times(self)?;
        let stored: Vec<(f64, f64, Option<Vec<u8>>)> = self.sql().rows(
            &format!("SELECT {t}, {iv}, timeline FROM frames WHERE {t} >= ?1 AND {t} <= ?2"),
            params![from, to],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        // As the SQL above groups them: by bucket (its index), then domain.
        let mut per: std::collections::BTreeMap<(i64, String), TimelineRow> = Default::default();
        for (t_end, interval_s, blob) in stored {
            let Some(blob) = blob else { continue };
            let rows = decode_timeline(&blob, &names).ok_or_else(|| StoreError::NotASession {
                path: self.path.clone(),
                reason: "an interval's timeline is damaged (it does not decode)".into(),
            })?;
            let (k, end) = if each {
                // Whole milliseconds, as the frames keep them.
                ((t_end * 1000.0).round() as i64, t_end)
            } else {
                let k = ((t_end - interval_s / 2.0) / bucket_s).floor() as i64;
                (k, (k + 1) as f64 * bucket_s)
            };
            for r in rows {
                let e = per
                    .entry((k, r.domain.clone()))
                    .or_insert_with(|| TimelineRow {
                        t_end: end,
                        interval_s: 0.0,
                        cpu_s: 0.0,
                        steal_s: 0.0,
                        io_s: 0.0,
                        io_ops: 0.0,
                        ..r.clone()
                    });
                e.interval_s += interval_s;
                e.cpu_s += r.cpu_s;
                e.steal_s += r.steal_s;
                e.io_s += r.io_s;
                e.io_ops += r.io_ops;
            }
        }
        Ok(per.into_values().collect())
    }
}

/// What an active VM's scale is made of in one second of a history: the
/// guest time the host measured on its vCPU threads and its agent's busy
/// time and samples (summed over a range, they give that range's
/// `domain_scale` row).
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleSecond {
    /// Whole second since the segment's start.
    pub second: u32,
    pub domain: String,
    pub event: u32,
    pub host_period: u64,
    pub agent_period: u64,
    pub agent_samples: u64,
}

const CREATE_SCALE: &str = "
    CREATE TABLE IF NOT EXISTS scale_seconds(
        second INTEGER NOT NULL, domain TEXT NOT NULL, event INTEGER NOT NULL,
        host_period INTEGER NOT NULL, agent_period INTEGER NOT NULL, agent_samples INTEGER NOT NULL,
        PRIMARY KEY(second, domain, event)) WITHOUT ROWID;";

impl SessionWriter {
    /// Add to the scale parts of the seconds in `rows`.
    pub fn add_scale_seconds(&mut self, rows: &[ScaleSecond]) -> Result<()> {
        self.write_tx(|tx| {
            tx.execute_batch(CREATE_SCALE)?;
            let mut st = tx.prepare_cached(
                "INSERT INTO scale_seconds(second, domain, event, host_period, agent_period, agent_samples)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(second, domain, event) DO UPDATE SET
                   host_period = host_period + excluded.host_period,
                   agent_period = agent_period + excluded.agent_period,
                   agent_samples = agent_samples + excluded.agent_samples",
            )?;
            for r in rows {
                st.execute(params![
                    r.second,
                    r.domain,
                    r.event,
                    r.host_period as i64,
                    r.agent_period as i64,
                    r.agent_samples as i64
                ])?;
            }
            Ok(())
        })
    }
}

impl Session {
    /// The scale parts of seconds `first..=last`, summed per (domain, event).
    pub fn scale_seconds(&self, first: u32, last: u32) -> Result<Vec<ScaleSecond>> {
        let n: i64 = self.sql().row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'scale_seconds'",
            [],
            |r| r.get(0),
        )?;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.sql().rows(
            "SELECT domain, event, SUM(host_period), SUM(agent_period), SUM(agent_samples)
             FROM scale_seconds WHERE second >= ?1 AND second <= ?2 GROUP BY domain, event ORDER BY domain, event",
            params![first, last],
            |r| {
                Ok(ScaleSecond {
                    second: first,
                    domain: r.get(0)?,
                    event: r.get::<_, i64>(1)? as u32,
                    host_period: r.get::<_, i64>(2)? as u64,
                    agent_period: r.get::<_, i64>(3)? as u64,
                    agent_samples: r.get::<_, i64>(4)? as u64,
                })
            },
        )
    }
}
