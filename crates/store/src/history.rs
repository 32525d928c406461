//! The two tables a history segment (`serve --history`, the
//! `vmscope_history` crate) adds to a session: `frames`, each interval's
//! `top` document as the recorder encoded it (opaque bytes here), and
//! `timeline`, each domain's CPU, steal and I/O per interval as numbers
//! (what a timeline over a day reads without decoding a document).
//! Other sessions do not have them; [`Session::has_history`] says whether
//! one does. Times are wall-clock seconds since the epoch, at the
//! interval's end.

use crate::{Result, Session, SessionWriter};
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
        t_end REAL NOT NULL, interval_s REAL NOT NULL, doc BLOB NOT NULL);
    CREATE INDEX IF NOT EXISTS frames_t ON frames(t_end);
    CREATE TABLE IF NOT EXISTS timeline(
        t_end REAL NOT NULL, interval_s REAL NOT NULL, domain TEXT NOT NULL,
        cpu_s REAL NOT NULL, steal_s REAL NOT NULL, io_s REAL NOT NULL, io_ops REAL NOT NULL,
        PRIMARY KEY(t_end, domain)) WITHOUT ROWID;";

/// A frame as [`Session::history_frames`] gives it: whether it is the
/// segment's first, its end, its length and its document as stored.
pub type StoredFrame = (bool, f64, f64, Vec<u8>);

impl SessionWriter {
    /// Add the history tables (once, when a segment is created).
    pub fn create_history_tables(&self) -> Result<()> {
        self.sql().execute_batch(CREATE)?;
        self.sql().execute_batch(crate::blocks::CREATE)
    }

    /// One interval of a history: its document and its timeline rows.
    pub fn add_history_interval(
        &mut self,
        t_end: f64,
        interval_s: f64,
        doc: &[u8],
        timeline: &[TimelineRow],
    ) -> Result<()> {
        self.write_tx(|tx| {
            tx.prepare_cached("INSERT INTO frames(t_end, interval_s, doc) VALUES (?1, ?2, ?3)")?
                .execute(params![t_end, interval_s, doc])?;
            let mut st = tx.prepare_cached(
                "INSERT OR REPLACE INTO timeline(t_end, interval_s, domain, cpu_s, steal_s, io_s, io_ops)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for r in timeline {
                st.execute(params![
                    r.t_end,
                    r.interval_s,
                    r.domain,
                    r.cpu_s,
                    r.steal_s,
                    r.io_s,
                    r.io_ops
                ])?;
            }
            Ok(())
        })
    }
}

impl Session {
    /// Whether this session is a history segment (has the history tables).
    pub fn has_history(&self) -> Result<bool> {
        let n: i64 = self.sql().row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('frames', 'timeline')",
            [],
            |r| r.get(0),
        )?;
        Ok(n == 2)
    }

    /// The first and last interval end stored, `None` when there is none.
    pub fn history_span(&self) -> Result<Option<(f64, f64)>> {
        if !self.has_history()? {
            return Ok(None);
        }
        self.sql().row(
            "SELECT MIN(t_end - interval_s), MAX(t_end) FROM frames",
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

    /// Documents of the intervals ending in `[from, to]`, in time order:
    /// (whether it is the segment's first, end, length, document).
    pub fn history_frames(&self, from: f64, to: f64) -> Result<Vec<StoredFrame>> {
        if !self.has_history()? {
            return Ok(Vec::new());
        }
        self.sql().rows(
            "SELECT rowid = (SELECT MIN(rowid) FROM frames), t_end, interval_s, doc FROM frames
             WHERE t_end >= ?1 AND t_end <= ?2 ORDER BY t_end, rowid",
            params![from, to],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
    }

    /// Every frame (end, length, document as stored) in the order written.
    pub fn history_frames_written(&self) -> Result<Vec<(f64, f64, Vec<u8>)>> {
        if !self.has_history()? {
            return Ok(Vec::new());
        }
        self.sql().rows(
            "SELECT t_end, interval_s, doc FROM frames ORDER BY rowid",
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
    /// domain over buckets of `bucket_s` seconds (each row's `t_end` is
    /// then the bucket's end, `interval_s` the time its rows cover).
    pub fn history_timeline(&self, from: f64, to: f64, bucket_s: f64) -> Result<Vec<TimelineRow>> {
        if !self.has_history()? {
            return Ok(Vec::new());
        }
        let bucket = bucket_s.max(1e-3);
        self.sql().rows(
            "SELECT (CAST((t_end - ?1) / ?3 AS INTEGER) + 1) * ?3 + ?1 AS b, SUM(interval_s), domain,
               SUM(cpu_s), SUM(steal_s), SUM(io_s), SUM(io_ops)
             FROM timeline WHERE t_end >= ?1 AND t_end <= ?2 GROUP BY b, domain ORDER BY b, domain",
            params![from, to, bucket],
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
        )
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
