//! Profile rows kept compact: the flight recorder's segments store each
//! interval's host and agent rows as one deflated block of numbers
//! (`row_blocks`), the texts they name once per segment (`block_strings`;
//! stacks in the session's `stacks` table), instead of one SQL row per key
//! that spells out its domain, context, process, image and symbol.
//!
//! Why not the `samples`/`agent_samples` tables: in `bench/history` (32
//! simulated VMs, 1 s intervals) the agents' rows were 86 % of a segment,
//! about 100 bytes each at 12.6 rows per VM per second, 105 MiB per VM per
//! day against a target of 20. A block row is 12 varints, most of them one
//! byte, and deflate finds the rest.
//!
//! Readers: [`Session::block_rows`] decodes the blocks of some seconds
//! (the history's range reads); [`Session::open`] of a file with blocks
//! copies them into temporary tables named as the row tables, which shadow
//! the empty ones, so every report reads a segment as any other session.
//!
//! Block layout (all LEB128 varints): the row count, then per row: second
//! less the block's first second, cpu + 1 (0 unknown), event, domain,
//! context, process, image, symbol (ids in `block_strings`), stack (id in
//! `stacks`, 0 none), srcline (id), samples, period.

use crate::reader::Session;
use crate::writer::slice_column;
use crate::writer::SessionWriter;
use crate::{Result, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::io::{Read, Write};
use std::sync::Arc;
use vmscope_model::deferred::blocks::{get_varint, put_varint};
use vmscope_model::{AggKey, Context, Profile, ProfileRow, UNKNOWN_SLICE};

pub(crate) const CREATE: &str = "
    CREATE TABLE IF NOT EXISTS block_strings(id INTEGER PRIMARY KEY, text TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS row_blocks(
        first INTEGER NOT NULL, last INTEGER NOT NULL, agent INTEGER NOT NULL, data BLOB NOT NULL);
    CREATE INDEX IF NOT EXISTS row_blocks_t ON row_blocks(first, last);";

/// A block that does not decode (a damaged segment).
fn damaged(path: &std::path::Path, what: &str) -> StoreError {
    StoreError::NotASession {
        path: path.to_path_buf(),
        reason: format!("a block of profile rows is damaged ({what})"),
    }
}

impl SessionWriter {
    /// Add `p`'s rows as one block (`agent`: an active VM's agent rows,
    /// else the host's), its bins and lost counts as [`SessionWriter::flush`]
    /// does. The blocks' table must exist ([`SessionWriter::create_history_tables`]).
    pub fn add_row_block(&mut self, p: &Profile, agent: bool) -> Result<()> {
        if p.rows.is_empty() {
            if !agent && (!p.bins.is_empty() || !p.lost.is_empty()) {
                self.flush(p)?;
            }
            return Ok(());
        }
        let mut rows: Vec<(&AggKey, u64, u64)> = p
            .rows
            .iter()
            .map(|(k, c)| (k, c.samples, c.period))
            .collect();
        rows.sort_unstable_by(|a, b| {
            (
                slice_column(a.0.second),
                &a.0.domain,
                &a.0.symbol,
                &a.0.stack,
            )
                .cmp(&(
                    slice_column(b.0.second),
                    &b.0.domain,
                    &b.0.symbol,
                    &b.0.stack,
                ))
        });
        let known = |s: u32| s != UNKNOWN_SLICE;
        // Sorted by second, unknown (-1) first: the known ones' ends.
        let mut secs = rows.iter().map(|r| r.0.second).filter(|&s| known(s));
        let first = secs.next().unwrap_or(0);
        let last = secs.next_back().unwrap_or(first);
        let mut raw = Vec::with_capacity(rows.len() * 16);
        put_varint(&mut raw, rows.len() as u64);
        let mut new_strings: Vec<(i64, String)> = Vec::new();
        for (k, samples, period) in &rows {
            // As the row tables store them (docs/architecture.md §4).
            let image = if agent {
                vmscope_model::guest_image(&k.image, k.context)
            } else {
                std::borrow::Cow::Borrowed(&*k.image)
            };
            let stack = self.stack_id(&k.stack)?;
            let second = if known(k.second) {
                u64::from(k.second - first) + 1
            } else {
                0
            };
            put_varint(&mut raw, second);
            put_varint(
                &mut raw,
                if known(k.cpu) {
                    u64::from(k.cpu) + 1
                } else {
                    0
                },
            );
            put_varint(&mut raw, u64::from(k.event));
            for s in [
                &*k.domain,
                k.context.as_str(),
                &*k.process,
                &*image,
                &*k.symbol,
            ] {
                let id = self.block_string(s, &mut new_strings)?;
                put_varint(&mut raw, id as u64);
            }
            put_varint(&mut raw, stack as u64);
            let id = self.block_string(&k.srcline, &mut new_strings)?;
            put_varint(&mut raw, id as u64);
            put_varint(&mut raw, *samples);
            put_varint(&mut raw, *period);
        }
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        let data = e
            .write_all(&raw)
            .and_then(|()| e.finish())
            .map_err(|source| StoreError::NotWritable {
                path: self.path().to_path_buf(),
                source,
            })?;
        let bins_only = Profile {
            rows: Default::default(),
            bins: p.bins.clone(),
            lost: p.lost.clone(),
            total_samples: 0,
        };
        let write = |tx: &Connection| -> rusqlite::Result<()> {
            let mut st =
                tx.prepare_cached("INSERT INTO block_strings(id, text) VALUES (?1, ?2)")?;
            for (id, text) in &new_strings {
                st.execute(params![id, text])?;
            }
            tx.prepare_cached(
                "INSERT INTO row_blocks(first, last, agent, data) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![first, last, agent, data])?;
            Ok(())
        };
        let r = self.write_tx(write);
        if r.is_err() {
            // Not stored: the ids handed out must not be taken as known.
            for (_, text) in &new_strings {
                self.block_strings.remove(text.as_str());
            }
        }
        r?;
        if !agent && (!bins_only.bins.is_empty() || !bins_only.lost.is_empty()) {
            self.flush(&bins_only)?;
        }
        Ok(())
    }

    /// The id of `s` in `block_strings`, a new one (added to `new`) when
    /// the segment has not stored it yet.
    fn block_string(&mut self, s: &str, new: &mut Vec<(i64, String)>) -> Result<i64> {
        if let Some(&id) = self.block_strings.get(s) {
            return Ok(id);
        }
        if self.block_strings.is_empty() {
            // A writer of an existing file (none today): its strings first.
            let stored: Vec<(i64, String)> =
                self.sql()
                    .rows("SELECT id, text FROM block_strings", [], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?;
            for (id, text) in stored {
                self.block_strings.insert(text.into(), id);
            }
            if let Some(&id) = self.block_strings.get(s) {
                return Ok(id);
            }
        }
        let id = self.block_strings.len() as i64 + 1;
        self.block_strings.insert(s.into(), id);
        new.push((id, s.to_string()));
        Ok(id)
    }
}

/// One decoded block's rows (stack as its id in `stacks`).
struct BlockRow {
    key: [u64; 10],
    second: u32,
    cpu: u32,
    samples: u64,
    period: u64,
}

fn decode(data: &[u8], first: u32) -> Option<Vec<BlockRow>> {
    let mut raw = Vec::new();
    flate2::read::DeflateDecoder::new(data)
        .take(256 << 20)
        .read_to_end(&mut raw)
        .ok()?;
    let mut at = 0;
    let n = get_varint(&raw, &mut at)?;
    let mut out = Vec::with_capacity(n.min(1 << 20) as usize);
    for _ in 0..n {
        let mut v = [0u64; 12];
        for x in &mut v {
            *x = get_varint(&raw, &mut at)?;
        }
        let second = match v[0] {
            0 => UNKNOWN_SLICE,
            s => first.checked_add(u32::try_from(s - 1).ok()?)?,
        };
        let cpu = match v[1] {
            0 => UNKNOWN_SLICE,
            c => u32::try_from(c - 1).ok()?,
        };
        let mut key = [0u64; 10];
        key.copy_from_slice(&v[..10]);
        out.push(BlockRow {
            key,
            second,
            cpu,
            samples: v[10],
            period: v[11],
        });
    }
    (at == raw.len()).then_some(out)
}

/// Whether the session holds blocks of rows.
pub(crate) fn has_blocks(conn: &Connection) -> rusqlite::Result<bool> {
    let t: Option<String> = conn
        .query_row(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='row_blocks'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if t.is_none() {
        return Ok(false);
    }
    conn.query_row("SELECT EXISTS(SELECT 1 FROM row_blocks)", [], |r| r.get(0))
}

fn strings(conn: &Connection) -> rusqlite::Result<Vec<Arc<str>>> {
    let mut out: Vec<Arc<str>> = vec!["".into()];
    let mut st = conn.prepare("SELECT id, text FROM block_strings ORDER BY id")?;
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
    for r in rows {
        let (id, text) = r?;
        let id = usize::try_from(id).unwrap_or(0);
        if out.len() <= id {
            out.resize(id + 1, "".into());
        }
        out[id] = text.into();
    }
    Ok(out)
}

/// The blocks overlapping `[from, to]` (seconds), each with its first second.
fn blocks_in(
    conn: &Connection,
    agent: bool,
    from: u32,
    to: u32,
) -> rusqlite::Result<Vec<(u32, Vec<u8>)>> {
    let mut st = conn.prepare_cached(
        "SELECT first, data FROM row_blocks WHERE agent = ?1 AND first <= ?3 AND last >= ?2 ORDER BY rowid",
    )?;
    let rows = st.query_map(params![agent, from, to], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    rows.map(|r| r.map(|(f, d)| (u32::try_from(f).unwrap_or(0), d)))
        .collect()
}

/// Copy the blocks into temporary tables named as the row tables (which
/// then shadow the stored, empty ones for every query of this connection).
pub(crate) fn expand(conn: &Connection, path: &std::path::Path) -> Result<()> {
    let sqle = crate::sql::sql_err(path);
    let names = strings(conn).map_err(&sqle)?;
    for (table, agent) in [("samples", false), ("agent_samples", true)] {
        let create: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type='table' AND name=?1",
                [table],
                |r| r.get(0),
            )
            .map_err(&sqle)?;
        let temp = create.replacen("CREATE TABLE", "CREATE TEMP TABLE", 1);
        conn.execute_batch(&temp).map_err(&sqle)?;
        conn.execute(
            &format!("INSERT INTO temp.{table} SELECT * FROM main.{table}"),
            [],
        )
        .map_err(&sqle)?;
        let mut st = conn
            .prepare(&format!(
                "INSERT INTO temp.{table}(event, domain, context, process, image, symbol, stack, srcline, second, cpu, samples, period)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT(event, domain, context, process, image, symbol, stack, srcline, second, cpu)
                 DO UPDATE SET samples = samples + excluded.samples, period = period + excluded.period"
            ))
            .map_err(&sqle)?;
        for (first, data) in blocks_in(conn, agent, 0, u32::MAX).map_err(&sqle)? {
            let rows = decode(&data, first).ok_or_else(|| damaged(path, "it does not decode"))?;
            for r in rows {
                let name = |i: usize| -> Result<&str> {
                    names
                        .get(r.key[i] as usize)
                        .map(|s| &**s)
                        .ok_or_else(|| damaged(path, "a string it names is missing"))
                };
                st.execute(params![
                    r.key[2] as i64,
                    name(3)?,
                    name(4)?,
                    name(5)?,
                    name(6)?,
                    name(7)?,
                    r.key[8] as i64,
                    name(9)?,
                    slice_column(r.second),
                    slice_column(r.cpu),
                    r.samples as i64,
                    r.period as i64
                ])
                .map_err(&sqle)?;
            }
        }
    }
    Ok(())
}

impl Session {
    /// The rows of the blocks of seconds `[from, to]` (host rows, or the
    /// agents' with `agent`), rows of other seconds left out; `None` when
    /// the session keeps its rows in tables ([`Session::rows_in`]).
    pub fn block_rows(&self, agent: bool, from: u32, to: u32) -> Result<Option<Vec<ProfileRow>>> {
        let sqle = crate::sql::sql_err(&self.path);
        if self.expanded || !has_blocks(&self.conn).map_err(&sqle)? {
            return Ok(None);
        }
        let names = strings(&self.conn).map_err(&sqle)?;
        let stored: Vec<(i64, Arc<str>)> =
            self.sql().rows("SELECT id, frames FROM stacks", [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    Arc::<str>::from(r.get::<_, String>(1)?),
                ))
            })?;
        let stacks: std::collections::HashMap<i64, Arc<str>> = stored.into_iter().collect();
        let mut out = Vec::new();
        for (first, data) in blocks_in(&self.conn, agent, from, to).map_err(&sqle)? {
            let rows =
                decode(&data, first).ok_or_else(|| damaged(&self.path, "it does not decode"))?;
            for r in rows {
                if r.second != UNKNOWN_SLICE && !(from..=to).contains(&r.second) {
                    continue;
                }
                let name = |i: usize| -> Result<Arc<str>> {
                    names
                        .get(r.key[i] as usize)
                        .cloned()
                        .ok_or_else(|| damaged(&self.path, "a string it names is missing"))
                };
                let ctx = name(4)?;
                out.push(ProfileRow {
                    key: AggKey {
                        event: r.key[2] as u32,
                        domain: name(3)?,
                        context: Context::parse(&ctx).unwrap_or(Context::HostUser),
                        process: name(5)?,
                        image: name(6)?,
                        symbol: name(7)?,
                        stack: match r.key[8] {
                            0 => "".into(),
                            id => stacks.get(&(id as i64)).cloned().ok_or_else(|| {
                                damaged(&self.path, "a stack it names is missing")
                            })?,
                        },
                        srcline: name(9)?,
                        second: r.second,
                        cpu: r.cpu,
                    },
                    samples: r.samples,
                    period: r.period,
                });
            }
        }
        Ok(Some(out))
    }
}
