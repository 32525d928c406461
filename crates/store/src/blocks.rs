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
//!
//! Segments whose meta says `row_blocks` = [`CHAINED`] (all written since)
//! differ in two ways. After the row count comes the block's nominal
//! period (the most common period per sample of its rows) and each row's
//! period is stored as the zigzag difference from samples times it: at a
//! fixed sampling rate it is 0. And each block is deflated with the block
//! of the same kind (host or agent) before it as dictionary, every
//! [`KEY_EVERY`]th with none, so reading a block inflates at most that many.
//! Measured on a 70 s, 1-VM segment of `bench/history`: the agent's 19
//! blocks took 6,823 bytes deflated alone, 4,105 with the one before as
//! dictionary and 2,595 with the periods as differences too; the host's
//! 69, 1,787 and 495. Their stacks are in `block_stacks`, each its frames'
//! ids in `block_strings` as varints, instead of the session's `stacks` of
//! texts: the host's call stacks, new ones every second, took 180 bytes a
//! second of that segment as texts.

use crate::reader::Session;
use crate::writer::slice_column;
use crate::writer::SessionWriter;
use crate::{Result, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::Arc;
use vmscope_model::deferred::blocks::{get_varint, put_varint};
use vmscope_model::{AggKey, Context, Profile, ProfileRow, UNKNOWN_SLICE};

pub(crate) const CREATE: &str = "
    CREATE TABLE IF NOT EXISTS block_strings(id INTEGER PRIMARY KEY, text TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS block_stacks(id INTEGER PRIMARY KEY, frames BLOB NOT NULL);
    CREATE TABLE IF NOT EXISTS row_rollups(agent INTEGER PRIMARY KEY, data BLOB NOT NULL);
    CREATE TABLE IF NOT EXISTS row_blocks(
        first INTEGER NOT NULL, last INTEGER NOT NULL, agent INTEGER NOT NULL, data BLOB NOT NULL);";

/// The meta key and value of segments whose blocks are chained (see the
/// module's docs); older ones (an index `row_blocks_t`, no such meta)
/// deflated each block alone.
pub const META: (&str, &str) = ("row_blocks", CHAINED);
pub const CHAINED: &str = "chained/60";
/// Every this many blocks of a kind one is deflated with no dictionary.
pub const KEY_EVERY: u64 = 60;

/// What the writer keeps to chain the next block of each kind (0 host,
/// 1 agent): the last one's bytes before deflate, and how many it wrote;
/// and the stacks it stored in `block_stacks`, by text.
#[derive(Default)]
pub(crate) struct Chains {
    last: [Vec<u8>; 2],
    written: [u64; 2],
    stacks: vmscope_model::FastMap<Arc<str>, i64>,
}

/// Texts and stacks a block names that its segment has not stored yet.
#[derive(Default)]
pub(crate) struct NewIds {
    pub(crate) strings: Vec<(i64, String)>,
    /// (id, frames as varints of string ids), and the text.
    stacks: Vec<(i64, Vec<u8>, Arc<str>)>,
}

/// A block before deflate: its first and last second, its bytes, and the
/// strings and stacks it names that are new.
type Encoded = (u32, u32, Vec<u8>, NewIds);

/// `p`'s lost counts alone.
fn lost_only(p: &Profile) -> Profile {
    Profile {
        rows: Default::default(),
        bins: Default::default(),
        lost: p.lost.clone(),
        total_samples: 0,
    }
}

/// Seconds of the clock per bin of a rollup ([`SessionWriter::set_row_rollups`]).
pub const ROLLUP_SECONDS: u32 = 10;

/// The second a rollup keeps the bins of second `sec` of a segment whose
/// second 0 is `start` (wall clock) at: the first of its
/// [`ROLLUP_SECONDS`] on the clock, or 0 if those began before the
/// segment. A range in steps of a multiple of them, starting on one,
/// gets each bin into the same step as from the blocks.
pub fn rollup_second(start: f64, sec: u32) -> u32 {
    if sec == UNKNOWN_SLICE {
        return sec;
    }
    let ten = f64::from(ROLLUP_SECONDS);
    let wall = start + f64::from(sec);
    ((wall / ten).floor() * ten - start).max(0.0).round() as u32
}

/// The meta key that says a segment's rollups are complete, and holds
/// [`ROLLUP_SECONDS`].
pub const ROLLUP_META: &str = "row_rollup_s";

/// The most common period per sample of `rows` (0 if none has samples).
fn nominal_period(rows: &[(&AggKey, u64, u64)]) -> u64 {
    let mut count: vmscope_model::FastMap<u64, u32> = Default::default();
    for &(_, samples, period) in rows {
        if let Some(p) = period.checked_div(samples) {
            *count.entry(p).or_default() += 1;
        }
    }
    count
        .into_iter()
        .max_by_key(|&(p, n)| (n, std::cmp::Reverse(p)))
        .map_or(0, |(p, _)| p)
}

fn zigzag(v: i128) -> u64 {
    (if v < 0 { (-v) * 2 - 1 } else { v * 2 }) as u64
}

fn unzigzag(v: u64) -> i128 {
    let v = i128::from(v);
    if v % 2 == 1 {
        -(v + 1) / 2
    } else {
        v / 2
    }
}

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
        let Some((first, last, raw, new)) = self.encode_block(p, agent)? else {
            if !agent && !p.lost.is_empty() {
                self.flush(&lost_only(p))?;
            }
            return Ok(());
        };
        let kind = usize::from(agent);
        let key = self.chains.written[kind].is_multiple_of(KEY_EVERY);
        let dict = (!key).then_some(&self.chains.last[kind][..]);
        let data =
            crate::deflate::deflate(&raw, dict).map_err(|source| StoreError::NotWritable {
                path: self.path().to_path_buf(),
                source,
            })?;
        self.with_strings(new, |tx| {
            tx.prepare_cached(
                "INSERT INTO row_blocks(first, last, agent, data) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![first, last, agent, data])?;
            Ok(())
        })?;
        self.chains.last[kind] = raw;
        self.chains.written[kind] += 1;
        if !agent && !p.lost.is_empty() {
            self.flush(&lost_only(p))?;
        }
        Ok(())
    }

    /// Keep `host` and `agent` (a whole segment's rows summed, their
    /// second the unknown one, and the host's bins at [`rollup_second`]s)
    /// as the segment's rollups, in place of any kept before, then say so
    /// in the meta ([`ROLLUP_META`]): a reader of a range that holds the
    /// whole segment reads them instead of its blocks
    /// ([`Session::rollup_sums`]); a segment without that meta (its writer
    /// killed first) is read from its blocks. Their lost counts are not
    /// kept again.
    pub fn set_row_rollups(&mut self, host: &Profile, agent: &Profile) -> Result<()> {
        self.set_row_rollup(host, false)?;
        self.set_row_rollup(agent, true)?;
        self.set_meta(ROLLUP_META, &ROLLUP_SECONDS.to_string())
    }

    fn set_row_rollup(&mut self, p: &Profile, agent: bool) -> Result<()> {
        let Some((_, _, raw, new)) = self.encode_block(p, agent)? else {
            self.sql()
                .execute("DELETE FROM row_rollups WHERE agent = ?1", params![agent])?;
            return Ok(());
        };
        let data =
            crate::deflate::deflate(&raw, None).map_err(|source| StoreError::NotWritable {
                path: self.path().to_path_buf(),
                source,
            })?;
        self.with_strings(new, |tx| {
            tx.prepare_cached("INSERT OR REPLACE INTO row_rollups(agent, data) VALUES (?1, ?2)")?
                .execute(params![agent, data])?;
            Ok(())
        })
    }

    /// `p`'s rows and (the host's) bins in the block layout: its first and
    /// last second, the bytes before deflate, and the strings and stacks
    /// it names that are new; `None` when it holds neither.
    fn encode_block(&mut self, p: &Profile, agent: bool) -> Result<Option<Encoded>> {
        // The host's bins go in its block; an agent's are not kept.
        let bins: Vec<(&vmscope_model::BinKey, u64)> = if agent {
            Vec::new()
        } else {
            let mut b: Vec<_> = p.bins.iter().map(|(k, n)| (k, *n)).collect();
            b.sort_unstable_by(|a, b| a.0.cmp(b.0));
            b
        };
        if p.rows.is_empty() && bins.is_empty() {
            return Ok(None);
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
        let secs = || {
            rows.iter()
                .map(|r| r.0.second)
                .chain(bins.iter().map(|b| b.0 .0))
                .filter(|&s| known(s))
        };
        let first = secs().min().unwrap_or(0);
        let last = secs().max().unwrap_or(first);
        let nominal = nominal_period(&rows);
        let mut raw = Vec::with_capacity(rows.len() * 16);
        put_varint(&mut raw, rows.len() as u64);
        put_varint(&mut raw, nominal);
        let mut new = NewIds::default();
        for (k, samples, period) in &rows {
            // As the row tables store them (docs/architecture.md §4).
            let image = if agent {
                vmscope_model::guest_image(&k.image, k.context)
            } else {
                std::borrow::Cow::Borrowed(&*k.image)
            };
            let stack = self.block_stack(&k.stack, &mut new)?;
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
                let id = self.block_string(s, &mut new.strings)?;
                put_varint(&mut raw, id as u64);
            }
            put_varint(&mut raw, stack as u64);
            let id = self.block_string(&k.srcline, &mut new.strings)?;
            put_varint(&mut raw, id as u64);
            put_varint(&mut raw, *samples);
            put_varint(
                &mut raw,
                zigzag(i128::from(*period) - i128::from(*samples) * i128::from(nominal)),
            );
        }
        // Then the bins: their count, per bin its second as a row's,
        // event, domain and context (ids), samples.
        put_varint(&mut raw, bins.len() as u64);
        for ((sec, event, domain, context), n) in &bins {
            put_varint(
                &mut raw,
                if known(*sec) {
                    u64::from(sec - first) + 1
                } else {
                    0
                },
            );
            put_varint(&mut raw, u64::from(*event));
            for s in [&**domain, context.as_str()] {
                let id = self.block_string(s, &mut new.strings)?;
                put_varint(&mut raw, id as u64);
            }
            put_varint(&mut raw, *n);
        }
        Ok(Some((first, last, raw, new)))
    }

    /// `write` in one transaction with the strings and stacks `new` handed
    /// out ([`SessionWriter::block_string`], [`SessionWriter::block_stack`])
    /// stored first; if it fails, those ids are taken back.
    pub(crate) fn with_strings(
        &mut self,
        new: NewIds,
        write: impl Fn(&Connection) -> rusqlite::Result<()>,
    ) -> Result<()> {
        let r = self.write_tx(|tx| {
            let mut st =
                tx.prepare_cached("INSERT INTO block_strings(id, text) VALUES (?1, ?2)")?;
            for (id, text) in &new.strings {
                st.execute(params![id, text])?;
            }
            let mut st =
                tx.prepare_cached("INSERT INTO block_stacks(id, frames) VALUES (?1, ?2)")?;
            for (id, frames, _) in &new.stacks {
                st.execute(params![id, frames])?;
            }
            write(tx)
        });
        if r.is_err() {
            for (_, text) in &new.strings {
                self.block_strings.remove(text.as_str());
            }
            for (_, _, text) in &new.stacks {
                self.chains.stacks.remove(text);
            }
        }
        r
    }

    /// The id of `stack` in `block_stacks` (0 for none), a new one (added
    /// to `new`, its frames' strings too) when not stored yet.
    fn block_stack(&mut self, stack: &Arc<str>, new: &mut NewIds) -> Result<i64> {
        if stack.is_empty() {
            return Ok(0);
        }
        if let Some(&id) = self.chains.stacks.get(stack) {
            return Ok(id);
        }
        let mut frames = Vec::new();
        for f in stack.split(';') {
            let id = self.block_string(f, &mut new.strings)?;
            put_varint(&mut frames, id as u64);
        }
        let id = self.chains.stacks.len() as i64 + 1;
        self.chains.stacks.insert(stack.clone(), id);
        new.stacks.push((id, frames, stack.clone()));
        Ok(id)
    }

    /// The id of `s` in `block_strings`, a new one (added to `new`) when
    /// the segment has not stored it yet.
    pub(crate) fn block_string(&mut self, s: &str, new: &mut Vec<(i64, String)>) -> Result<i64> {
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

/// One decoded bin: second, event, domain and context (ids), samples.
type BlockBin = (u32, u32, u64, u64, u64);

/// The rows and bins of a block's bytes (inflated; `chained`: the
/// [`CHAINED`] layout, the only one with bins).
fn decode(raw: &[u8], first: u32, chained: bool) -> Option<(Vec<BlockRow>, Vec<BlockBin>)> {
    let mut out = Vec::new();
    let mut bins = Vec::new();
    decode_each(raw, first, chained, &mut |r| out.push(r), &mut |b| {
        bins.push(b);
    })?;
    Some((out, bins))
}

/// [`decode`] without keeping the rows: each row and bin given to
/// `row` and `bin` as it is read. `None` (after some calls) when the bytes
/// do not decode.
fn decode_each(
    raw: &[u8],
    first: u32,
    chained: bool,
    row: &mut dyn FnMut(BlockRow),
    bin: &mut dyn FnMut(BlockBin),
) -> Option<()> {
    let mut at = 0;
    let n = get_varint(raw, &mut at)?;
    let nominal = if chained {
        get_varint(raw, &mut at)?
    } else {
        0
    };
    for _ in 0..n {
        let mut v = [0u64; 12];
        for x in &mut v {
            *x = get_varint(raw, &mut at)?;
        }
        if chained {
            let p = i128::from(v[10]) * i128::from(nominal) + unzigzag(v[11]);
            v[11] = u64::try_from(p).ok()?;
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
        row(BlockRow {
            key,
            second,
            cpu,
            samples: v[10],
            period: v[11],
        });
    }
    if chained {
        let n = get_varint(raw, &mut at)?;
        for _ in 0..n {
            let mut v = [0u64; 5];
            for x in &mut v {
                *x = get_varint(raw, &mut at)?;
            }
            let second = match v[0] {
                0 => UNKNOWN_SLICE,
                s => first.checked_add(u32::try_from(s - 1).ok()?)?,
            };
            bin((second, u32::try_from(v[1]).ok()?, v[2], v[3], v[4]));
        }
    }
    (at == raw.len()).then_some(())
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

pub(crate) fn strings(conn: &Connection) -> rusqlite::Result<Vec<Arc<str>>> {
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

/// What the stack ids of the blocks stand for: in `block_stacks` when
/// they are chained, else the session's `stacks`.
fn block_stack_texts(
    conn: &Connection,
    names: &[Arc<str>],
    chained: bool,
) -> rusqlite::Result<Option<std::collections::HashMap<i64, Arc<str>>>> {
    let mut out = std::collections::HashMap::new();
    if !chained {
        let mut st = conn.prepare("SELECT id, frames FROM stacks")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                Arc::<str>::from(r.get::<_, String>(1)?),
            ))
        })?;
        for r in rows {
            let (id, text) = r?;
            out.insert(id, text);
        }
        return Ok(Some(out));
    }
    let mut st = conn.prepare("SELECT id, frames FROM block_stacks")?;
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))?;
    for r in rows {
        let (id, blob) = r?;
        let mut parts: Vec<&str> = Vec::new();
        let mut at = 0;
        while at < blob.len() {
            let Some(name) = get_varint(&blob, &mut at).and_then(|i| names.get(i as usize)) else {
                return Ok(None);
            };
            parts.push(name);
        }
        let text = parts.join(";");
        out.insert(id, text.into());
    }
    Ok(Some(out))
}

/// Whether the session's blocks are chained ([`META`]).
fn chained(conn: &Connection) -> rusqlite::Result<bool> {
    let v: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [META.0], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.as_deref() == Some(CHAINED))
}

/// A block's first second and its bytes inflated.
type Inflated = (u32, Vec<u8>);

/// A bin of a block with its names: second, event, domain, context, samples.
pub type NamedBin = (u32, u32, Arc<str>, Arc<str>, u64);

/// The bound on one block's bytes (a damaged one must not inflate
/// without bound).
const BLOCK_LIMIT: usize = 256 << 20;

/// The blocks of a kind overlapping `[from, to]` (seconds), each with its
/// first second and its bytes inflated, and whether they are chained. A
/// chained block is inflated after the ones before it from its key block on.
fn blocks_in(
    conn: &Connection,
    path: &std::path::Path,
    agent: bool,
    from: u32,
    to: u32,
) -> Result<(Vec<Inflated>, bool)> {
    let mut out = Vec::new();
    let chained = each_block_in(conn, path, agent, from, to, &mut |first, raw| {
        out.push((first, raw.to_vec()));
        Ok(())
    })?;
    Ok((out, chained))
}

/// [`blocks_in`] one block at a time (a segment's inflated blocks at once
/// took 90 MiB of a day's report): `each` gets its first second and its
/// bytes; returns whether they are chained.
fn each_block_in(
    conn: &Connection,
    path: &std::path::Path,
    agent: bool,
    from: u32,
    to: u32,
    each: &mut dyn FnMut(u32, &[u8]) -> Result<()>,
) -> Result<bool> {
    let sqle = crate::sql::sql_err(path);
    let chained = chained(conn).map_err(&sqle)?;
    let mut st = conn
        .prepare_cached("SELECT first, last, data FROM row_blocks WHERE agent = ?1 ORDER BY rowid")
        .map_err(&sqle)?;
    let all: Vec<(i64, i64, Vec<u8>)> = st
        .query_map(params![agent], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .and_then(|rows| rows.collect())
        .map_err(&sqle)?;
    let overlaps =
        |&(first, last, _): &(i64, i64, Vec<u8>)| first <= i64::from(to) && last >= i64::from(from);
    let bad = |_| damaged(path, "it does not decode");
    if !chained {
        for b in all.iter().filter(|b| overlaps(b)) {
            let raw = crate::deflate::inflate(&b.2, None, BLOCK_LIMIT).map_err(bad)?;
            each(u32::try_from(b.0).unwrap_or(0), &raw)?;
        }
        return Ok(false);
    }
    let Some(start) = all.iter().position(overlaps) else {
        return Ok(true);
    };
    let key = start - start % KEY_EVERY as usize;
    let mut prev: Vec<u8> = Vec::new();
    for (i, b) in all.iter().enumerate().skip(key) {
        let dict = (i % KEY_EVERY as usize != 0).then_some(&prev[..]);
        let raw = crate::deflate::inflate(&b.2, dict, BLOCK_LIMIT).map_err(bad)?;
        if overlaps(b) {
            each(u32::try_from(b.0).unwrap_or(0), &raw)?;
        }
        prev = raw;
    }
    Ok(true)
}

/// Copy the blocks into temporary tables named as the row tables (which
/// then shadow the stored, empty ones for every query of this connection).
pub(crate) fn expand(conn: &Connection, path: &std::path::Path) -> Result<()> {
    let sqle = crate::sql::sql_err(path);
    let names = strings(conn).map_err(&sqle)?;
    // Chained blocks' stacks are in `block_stacks`: as texts in a temporary
    // `stacks` (the stored one's rows, then these after its last id).
    let offset = if chained(conn).map_err(&sqle)? {
        let texts = block_stack_texts(conn, &names, true)
            .map_err(&sqle)?
            .ok_or_else(|| damaged(path, "a stack names a string that is missing"))?;
        let create: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type='table' AND name='stacks'",
                [],
                |r| r.get(0),
            )
            .map_err(&sqle)?;
        conn.execute_batch(&create.replacen("CREATE TABLE", "CREATE TEMP TABLE", 1))
            .and_then(|()| conn.execute("INSERT INTO temp.stacks SELECT * FROM main.stacks", []))
            .map_err(&sqle)?;
        let offset: i64 = conn
            .query_row("SELECT COALESCE(MAX(id), 0) FROM main.stacks", [], |r| {
                r.get(0)
            })
            .map_err(&sqle)?;
        let mut st = conn
            .prepare("INSERT INTO temp.stacks(id, frames) VALUES (?1, ?2)")
            .map_err(&sqle)?;
        for (id, text) in &texts {
            st.execute(params![offset + id, &**text]).map_err(&sqle)?;
        }
        offset
    } else {
        0
    };
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
        let (blocks, chained) = blocks_in(conn, path, agent, 0, u32::MAX)?;
        for (first, raw) in blocks {
            let (rows, _) =
                decode(&raw, first, chained).ok_or_else(|| damaged(path, "it does not decode"))?;
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
                    match r.key[8] {
                        0 => 0,
                        id => id as i64 + offset,
                    },
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
    if chained(conn).map_err(&sqle)? {
        // The host blocks' bins, in a temporary `bins` as the rows.
        let create: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type='table' AND name='bins'",
                [],
                |r| r.get(0),
            )
            .map_err(&sqle)?;
        conn.execute_batch(&create.replacen("CREATE TABLE", "CREATE TEMP TABLE", 1))
            .and_then(|()| conn.execute("INSERT INTO temp.bins SELECT * FROM main.bins", []))
            .map_err(&sqle)?;
        let mut st = conn
            .prepare(
                "INSERT INTO temp.bins(second, event, domain, context, samples) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(second, event, domain, context) DO UPDATE SET samples = samples + excluded.samples",
            )
            .map_err(&sqle)?;
        for (sec, ev, dom, ctx, n) in block_bins(conn, path, None)? {
            st.execute(params![sec, ev, dom, ctx, n as i64])
                .map_err(&sqle)?;
        }
    }
    Ok(())
}

/// The bins of the host's chained blocks (of one event, or all):
/// (second, event, domain, context, samples), not summed.
pub(crate) fn block_bins(
    conn: &Connection,
    path: &std::path::Path,
    event: Option<u32>,
) -> Result<Vec<NamedBin>> {
    let sqle = crate::sql::sql_err(path);
    if !has_blocks(conn).map_err(&sqle)? {
        return Ok(Vec::new());
    }
    let names = strings(conn).map_err(&sqle)?;
    let (blocks, chained) = blocks_in(conn, path, false, 0, u32::MAX)?;
    let mut out = Vec::new();
    if !chained {
        return Ok(out);
    }
    for (first, raw) in blocks {
        let (_, bins) =
            decode(&raw, first, chained).ok_or_else(|| damaged(path, "it does not decode"))?;
        for (sec, ev, dom, ctx, n) in bins {
            if event.is_some_and(|e| e != ev) {
                continue;
            }
            let name = |i: u64| {
                names
                    .get(i as usize)
                    .cloned()
                    .ok_or_else(|| damaged(path, "a string it names is missing"))
            };
            out.push((sec, ev, name(dom)?, name(ctx)?, n));
        }
    }
    Ok(out)
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
        let stacks = block_stack_texts(&self.conn, &names, chained(&self.conn).map_err(&sqle)?)
            .map_err(&sqle)?
            .ok_or_else(|| damaged(&self.path, "a stack names a string that is missing"))?;
        let mut out = Vec::new();
        let (blocks, chained) = blocks_in(&self.conn, &self.path, agent, from, to)?;
        for (first, raw) in blocks {
            let (rows, _) = decode(&raw, first, chained)
                .ok_or_else(|| damaged(&self.path, "it does not decode"))?;
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

/// A range of a compact session's blocks summed over its seconds
/// ([`Session::block_sums`]).
#[derive(Debug, Default)]
pub struct BlockSums {
    /// The host's rows, one per key (their second as the caller mapped it).
    pub host: Vec<ProfileRow>,
    /// The agents' rows, the same way.
    pub agent: Vec<ProfileRow>,
    /// The host's bins, one per (mapped second, event, domain, context):
    /// those of the blocks and of the `bins` table.
    pub bins: Vec<NamedBin>,
}

/// A block row's key with its second mapped: the ids of event, domain,
/// context, process, image, symbol, stack and srcline, then second and
/// cpu (ids as u32: 40 bytes to hash and compare instead of 72).
type SumKey = [u32; 10];

impl Session {
    /// The rows and bins of seconds `[from, to]`, summed: each row's
    /// second given to `row_second` and each bin's to `bin_second` (rows
    /// and bins of the unknown second keep it), rows and bins that then
    /// share a key added. `None` when the session keeps its rows in
    /// tables ([`Session::rows_in`]).
    ///
    /// Why not [`Session::block_rows`] and then [`Profile::add`]: a day of
    /// history (32 simulated VMs, made by the `history_day` example of
    /// vmscope-history) is a few thousand distinct keys out of tens of
    /// millions of rows; keyed by the blocks' numbers
    /// a row costs one hash of integers instead of eight texts looked up,
    /// cloned and hashed, and each block is inflated once for its rows and
    /// bins and dropped before the next.
    pub fn block_sums(
        &self,
        from: u32,
        to: u32,
        row_second: &dyn Fn(u32) -> u32,
        bin_second: &dyn Fn(u32) -> u32,
    ) -> Result<Option<BlockSums>> {
        let sqle = crate::sql::sql_err(&self.path);
        if self.expanded || !has_blocks(&self.conn).map_err(&sqle)? {
            return Ok(None);
        }
        self.sums(from, to, row_second, bin_second, false).map(Some)
    }

    /// The segment's rollups ([`SessionWriter::set_row_rollups`]) as
    /// [`Session::block_sums`] of all its seconds gives it, the rows
    /// already summed over them and the bins per [`ROLLUP_SECONDS`] (each
    /// bin's second given to `bin_second`); `None` when the segment has
    /// none (it was not closed: a killed recorder's last one, or one
    /// written before rollups).
    pub fn rollup_sums(&self, bin_second: &dyn Fn(u32) -> u32) -> Result<Option<BlockSums>> {
        if self.expanded {
            return Ok(None);
        }
        let done = self.meta()?.remove(ROLLUP_META);
        if done.as_deref() != Some(&*ROLLUP_SECONDS.to_string()) {
            return Ok(None);
        }
        self.sums(0, UNKNOWN_SLICE - 1, &|s| s, bin_second, true)
            .map(Some)
    }

    fn sums(
        &self,
        from: u32,
        to: u32,
        row_second: &dyn Fn(u32) -> u32,
        bin_second: &dyn Fn(u32) -> u32,
        rollup: bool,
    ) -> Result<BlockSums> {
        let sqle = crate::sql::sql_err(&self.path);
        let keep = |s: u32| s == UNKNOWN_SLICE || (from..=to).contains(&s);
        let map = |f: &dyn Fn(u32) -> u32, s: u32| if s == UNKNOWN_SLICE { s } else { f(s) };
        let names = strings(&self.conn).map_err(&sqle)?;
        let name = |i: u32| -> Result<Arc<str>> {
            names
                .get(i as usize)
                .cloned()
                .ok_or_else(|| damaged(&self.path, "a string it names is missing"))
        };
        let id = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let mut out = BlockSums::default();
        let mut stacks = None;
        let mut bins: vmscope_model::FastMap<[u32; 4], u64> = Default::default();
        let chained = chained(&self.conn).map_err(&sqle)?;
        for agent in [false, true] {
            let mut sums: vmscope_model::FastMap<SumKey, (u64, u64)> = Default::default();
            let mut each = |first: u32, raw: &[u8]| -> Result<()> {
                let mut on_row = |r: BlockRow| {
                    if !keep(r.second) {
                        return;
                    }
                    let mut k = [0u32; 10];
                    for (x, v) in k.iter_mut().zip(&r.key[2..10]) {
                        *x = id(*v);
                    }
                    k[8] = map(row_second, r.second);
                    k[9] = r.cpu;
                    let e = sums.entry(k).or_default();
                    e.0 += r.samples;
                    e.1 += r.period;
                };
                let mut on_bin = |(sec, ev, dom, ctx, n): BlockBin| {
                    if !agent && keep(sec) {
                        *bins
                            .entry([map(bin_second, sec), ev, id(dom), id(ctx)])
                            .or_default() += n;
                    }
                };
                decode_each(raw, first, chained || rollup, &mut on_row, &mut on_bin)
                    .ok_or_else(|| damaged(&self.path, "it does not decode"))
            };
            if rollup {
                let data: Vec<Vec<u8>> = self.sql().rows(
                    "SELECT data FROM row_rollups WHERE agent = ?1",
                    params![agent],
                    |r| r.get(0),
                )?;
                for d in data {
                    let raw = crate::deflate::inflate(&d, None, BLOCK_LIMIT)
                        .map_err(|_| damaged(&self.path, "its rollup does not inflate"))?;
                    each(0, &raw)?;
                }
            } else {
                each_block_in(&self.conn, &self.path, agent, from, to, &mut each)?;
            }
            if sums.is_empty() {
                continue;
            }
            if stacks.is_none() {
                stacks = Some(
                    block_stack_texts(&self.conn, &names, chained)
                        .map_err(&sqle)?
                        .ok_or_else(|| {
                            damaged(&self.path, "a stack names a string that is missing")
                        })?,
                );
            }
            let stacks = stacks.as_ref().expect("read above");
            let rows = if agent { &mut out.agent } else { &mut out.host };
            rows.reserve(sums.len());
            for (k, (samples, period)) in sums {
                let ctx = name(k[2])?;
                rows.push(ProfileRow {
                    key: AggKey {
                        event: k[0],
                        domain: name(k[1])?,
                        context: Context::parse(&ctx).unwrap_or(Context::HostUser),
                        process: name(k[3])?,
                        image: name(k[4])?,
                        symbol: name(k[5])?,
                        stack: match k[6] {
                            0 => "".into(),
                            id => stacks.get(&i64::from(id)).cloned().ok_or_else(|| {
                                damaged(&self.path, "a stack it names is missing")
                            })?,
                        },
                        srcline: name(k[7])?,
                        second: k[8],
                        cpu: k[9],
                    },
                    samples,
                    period,
                });
            }
        }
        // Bins kept in the table (a segment written before its bins went
        // into the blocks).
        let stored: Vec<(i64, i64, String, String, i64)> = self.sql().rows(
            "SELECT second, event, domain, context, samples FROM main.bins WHERE second BETWEEN ?1 AND ?2",
            params![i64::from(from), i64::from(to)],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )?;
        let mut named: std::collections::HashMap<(u32, u32, Arc<str>, Arc<str>), u64> =
            Default::default();
        for ([sec, ev, dom, ctx], n) in bins {
            *named.entry((sec, ev, name(dom)?, name(ctx)?)).or_default() += n;
        }
        for (sec, ev, dom, ctx, n) in stored {
            let sec = map(bin_second, sec as u32);
            *named
                .entry((sec, ev as u32, dom.into(), ctx.into()))
                .or_default() += n as u64;
        }
        out.bins = named
            .into_iter()
            .map(|((sec, ev, dom, ctx), n)| (sec, ev, dom, ctx, n))
            .collect();
        out.bins
            .sort_unstable_by(|a, b| (a.0, a.1, &a.2, &a.3).cmp(&(b.0, b.1, &b.2, &b.3)));
        Ok(out)
    }
}
