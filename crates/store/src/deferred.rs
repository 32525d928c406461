//! Symbols left for the first read (docs/architecture.md §7.3).
//!
//! A recording that defers symbolization ([`vmscope_model::deferred`])
//! stores its host rows as numbers: `deferred_strings` (the texts: domain
//! and process names, paths, hex build-ids, module and symbol names), and
//! per flush one block each of frames (what each frame number stands for),
//! stacks (their frame numbers) and rows, varint-encoded; and it marks the
//! session (`meta.symbols = 'deferred'`). A few blobs per flush instead of
//! one SQLite row per key, frame and stack is what makes such a recording
//! cheap: under exec churn a 10 s recording has about as many keys as
//! samples.
//!
//! - [`SessionWriter::add_raw`] stores a [`RawDelta`] (in the flush's
//!   transaction when called inside [`SessionWriter::batch`]), so a killed
//!   recorder's partial file can still be resolved.
//! - [`PendingSymbols`] is the one writer that resolves them: it takes the
//!   session's one-writer lock (a recording into the session is an error
//!   naming it; a second reader resolving the same session waits for the
//!   first and then finds nothing to do) and an SQLite write transaction,
//!   hands out the strings, frames, stacks and rows, takes the named rows
//!   back into `samples` (summed with equal keys, stacks interned with the
//!   session's own), and in one commit empties the deferred tables and
//!   removes the mark. A failure leaves the session as it was.
//!
//! It knows nothing of symbol tables: the caller (the engine) resolves.

use crate::output::{lock_path, partial_path, WriterLock};
use crate::sql::{sql_err, Sql};
use crate::{Result, SessionWriter, StoreError};
use rusqlite::{params, Connection, OpenFlags};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use vmscope_model::deferred::blocks::{
    decode_frames, decode_rows, decode_stacks, encode_frames, encode_rows, encode_stacks,
};
use vmscope_model::{
    AggKey, DeferredFrame, ImageRef, NormalizedFrame, Profile, RawDelta, RawFrame, RawRowKey,
};

/// `meta.symbols` of a session whose frames are not all resolved yet.
pub const SYMBOLS_DEFERRED: &str = "deferred";

/// How long [`PendingSymbols::open`] waits for another process that is
/// resolving the same session.
const BUSY_WAIT: Duration = Duration::from_secs(300);

/// What a resolving reader writes in the session's lock file.
const RESOLVER: &str = "vmscope: resolving deferred symbols";

fn unhex(text: &str) -> Option<Arc<[u8]>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .map(Into::into)
}

impl SessionWriter {
    /// Store what a deferring converter added ([`RawDelta`]); inside
    /// [`SessionWriter::batch`] it joins the flush's transaction. The first
    /// call that stores anything marks the session's symbols as pending
    /// (`meta.symbols`).
    pub fn add_raw(&mut self, d: &RawDelta) -> Result<()> {
        if d.is_empty() {
            return Ok(());
        }
        let first = !self.deferred;
        let write = |tx: &Connection| -> rusqlite::Result<()> {
            if first {
                tx.execute(
                    "INSERT INTO meta(key, value) VALUES ('symbols', ?1)
                     ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    params![SYMBOLS_DEFERRED],
                )?;
            }
            let mut st =
                tx.prepare_cached("INSERT INTO deferred_strings(id, text) VALUES (?1, ?2)")?;
            for (id, text) in &d.strings {
                st.execute(params![i64::from(*id), &**text])?;
            }
            for (table, data) in [
                (
                    "deferred_frames",
                    (!d.frames.is_empty()).then(|| encode_frames(&d.frames)),
                ),
                (
                    "deferred_stacks",
                    (!d.stacks.is_empty()).then(|| encode_stacks(d.stacks())),
                ),
                (
                    "deferred_rows",
                    (!d.rows.is_empty()).then(|| encode_rows(&d.rows)),
                ),
            ] {
                if let Some(data) = data {
                    tx.prepare_cached(&format!("INSERT INTO {table}(data) VALUES (?1)"))?
                        .execute([data])?;
                }
            }
            Ok(())
        };
        if self.bulk_tx.get() || self.in_batch {
            // Inside the bulk load's or a batch's transaction.
            self.sql().check(write(&self.conn))?;
        } else {
            self.write_tx(write)?;
        }
        self.deferred = true;
        Ok(())
    }
}

/// A session whose deferred frames are being resolved; see the module docs.
pub struct PendingSymbols {
    /// Joins the transaction `open` began; `finish` commits it.
    writer: SessionWriter,
    _lock: WriterLock,
}

/// The session file whose one-writer lock guards `path`: a recording's
/// partial file is guarded by its target's lock.
fn guarded_target(path: &Path) -> PathBuf {
    let s = path.to_string_lossy();
    match s.strip_suffix(".partial") {
        Some(t) if partial_path(Path::new(t)) == path => PathBuf::from(t),
        _ => path.to_path_buf(),
    }
}

fn cannot_write(path: &Path, what: String) -> StoreError {
    StoreError::SymbolsPending {
        path: path.to_path_buf(),
        why: format!(
            "{what}: run the report once where the session can be written, or record with \
             --symbolize now"
        ),
    }
}

/// Copy the session at `path` to `dst` (a new file) as one consistent
/// snapshot, even while a recording writes it: a reader that may not
/// resolve a session in place (a recording under way, a file it cannot
/// write) resolves the copy.
pub fn snapshot(path: &Path, dst: &Path) -> Result<()> {
    let conn = crate::open_read_only(path)?;
    conn.busy_timeout(BUSY_WAIT).map_err(sql_err(path))?;
    Sql::new(&conn, path).execute("VACUUM INTO ?1", [dst.to_string_lossy()])?;
    Ok(())
}

impl PendingSymbols {
    /// Open the session at `path` to resolve its deferred frames: `None`
    /// when it has none (left, or resolved by another reader meanwhile).
    /// Fails naming the process when a recording is writing it, and when
    /// the file cannot be written (its names cannot be stored).
    pub fn open(path: &Path) -> Result<Option<PendingSymbols>> {
        // A quick look first: most sessions have nothing pending, and a
        // reader of those must not need to write anything (not even a lock).
        if !Self::pending_at(path)? {
            return Ok(None);
        }
        let target = guarded_target(path);
        let lock = Self::lock(&target, path).map_err(|e| match e {
            StoreError::Locked { pid, command, .. } => StoreError::SymbolsPending {
                path: path.to_path_buf(),
                why: format!(
                    "it is being written by {}: its symbols are resolved by the first read \
                     after that ends",
                    crate::writer_text(pid, &command)
                ),
            },
            StoreError::NotWritable { source, .. } => cannot_write(
                path,
                format!(
                    "the lock file {} cannot be made ({source})",
                    lock_path(&target).display()
                ),
            ),
            other => other,
        })?;
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| {
            cannot_write(
                path,
                format!(
                    "it cannot be opened for writing ({})",
                    crate::sqlite_text(&e)
                ),
            )
        })?;
        conn.busy_timeout(BUSY_WAIT).map_err(sql_err(path))?;
        conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| {
            cannot_write(
                path,
                format!("it cannot be written ({})", crate::sqlite_text(&e)),
            )
        })?;
        let writer = SessionWriter::resume(conn, path)?;
        let p = PendingSymbols {
            writer,
            _lock: lock,
        };
        // Resolved by another reader while we waited: nothing to do.
        if p.meta("symbols")?.as_deref() != Some(SYMBOLS_DEFERRED) {
            return Ok(None);
        }
        Ok(Some(p))
    }

    /// The session's one-writer lock, waiting (up to [`BUSY_WAIT`]) while
    /// another reader holds it to resolve the same session; a recording
    /// that holds it is an error at once.
    fn lock(target: &Path, path: &Path) -> Result<WriterLock> {
        let deadline = std::time::Instant::now() + BUSY_WAIT;
        loop {
            match WriterLock::acquire(target, path, RESOLVER) {
                Err(StoreError::Locked { command, .. })
                    // An empty command: the holder has not written it yet.
                    if (command == RESOLVER || command.is_empty())
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// Whether the session at `path` has frames left to resolve, read
    /// without writing anything.
    pub fn pending_at(path: &Path) -> Result<bool> {
        let conn = crate::open_read_only(path)?;
        let sql = Sql::new(&conn, path);
        let has_meta: Option<String> = sql.optional_row(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='meta'",
            [],
            |r| r.get(0),
        )?;
        if has_meta.is_none() {
            return Ok(false);
        }
        let v: Option<String> =
            sql.optional_row("SELECT value FROM meta WHERE key = 'symbols'", [], |r| {
                r.get(0)
            })?;
        Ok(v.as_deref() == Some(SYMBOLS_DEFERRED))
    }

    pub fn path(&self) -> &Path {
        &self.writer.path
    }

    fn conn(&self) -> &Connection {
        &self.writer.conn
    }

    fn sql(&self) -> Sql<'_> {
        self.writer.sql()
    }

    fn damaged(&self, table: &'static str, what: String) -> StoreError {
        StoreError::Damaged {
            path: self.path().to_path_buf(),
            table,
            what,
        }
    }

    /// A metadata value of the session.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.sql()
            .optional_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
    }

    /// The domain and process names by number.
    pub fn strings(&self) -> Result<Vec<(u32, Arc<str>)>> {
        let sql = self.sql();
        let mut st = sql.check(
            self.conn()
                .prepare("SELECT id, text FROM deferred_strings ORDER BY id"),
        )?;
        let rows =
            sql.check(st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, text) = sql.check(row)?;
            let id = u32::try_from(id)
                .map_err(|_| self.damaged("deferred_strings", format!("has string id {id}")))?;
            out.push((id, text.into()));
        }
        Ok(out)
    }

    /// The blocks of `table` (`deferred_frames`, `_stacks`, `_rows`), in
    /// the order stored, each decoded by `decode`.
    fn blocks<T>(
        &self,
        table: &'static str,
        what: &str,
        decode: impl Fn(&[u8]) -> Option<Vec<T>>,
    ) -> Result<Vec<T>> {
        let sql = self.sql();
        let mut st = sql.check(
            self.conn()
                .prepare(&format!("SELECT block, data FROM {table} ORDER BY block")),
        )?;
        let rows =
            sql.check(st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))))?;
        let mut out = Vec::new();
        for row in rows {
            let (block, data) = sql.check(row)?;
            out.extend(decode(&data).ok_or_else(|| {
                self.damaged(
                    table,
                    format!("has block {block} whose {what} cannot be read"),
                )
            })?);
        }
        Ok(out)
    }

    /// Every deferred frame with its number, its texts looked up. A frame
    /// the model cannot read (a damaged file) is an error naming the table.
    pub fn frames(&self) -> Result<Vec<(u32, DeferredFrame)>> {
        let strings: HashMap<u32, Arc<str>> = self.strings()?.into_iter().collect();
        let raw = self.blocks("deferred_frames", "frames", decode_frames)?;
        let text = |id: u32, frame: u32| {
            strings.get(&id).cloned().ok_or_else(|| {
                self.damaged(
                    "deferred_frames",
                    format!(
                        "has frame {frame} with string {id}, which deferred_strings does not have"
                    ),
                )
            })
        };
        let mut out = Vec::with_capacity(raw.len());
        for (id, f) in raw {
            let f = match f {
                RawFrame::Kernel { addr, module } => DeferredFrame::Later {
                    frame: NormalizedFrame {
                        image: ImageRef::Kernel,
                        addr,
                    },
                    module: module.map(|m| text(m, id)).transpose()?,
                },
                RawFrame::File {
                    path,
                    build_id,
                    offset,
                } => {
                    let build_id = match build_id {
                        None => None,
                        Some(b) => {
                            let hex = text(b, id)?;
                            Some(unhex(&hex).ok_or_else(|| {
                                self.damaged(
                                    "deferred_frames",
                                    format!("has frame {id} with build-id '{hex}', not hex"),
                                )
                            })?)
                        }
                    };
                    DeferredFrame::Later {
                        frame: NormalizedFrame {
                            image: ImageRef::File {
                                path: text(path, id)?,
                                build_id,
                            },
                            addr: offset,
                        },
                        module: None,
                    }
                }
                RawFrame::Named { image, symbol } => DeferredFrame::Named {
                    image: text(image, id)?,
                    symbol: text(symbol, id)?,
                },
            };
            out.push((id, f));
        }
        Ok(out)
    }

    /// Every stack: its number and its frame numbers, the sampled end first.
    pub fn stacks(&self) -> Result<Vec<(u32, Vec<u32>)>> {
        self.blocks("deferred_stacks", "stacks", decode_stacks)
    }

    /// The number of blocks of rows (one per flush of the recording).
    pub fn row_blocks(&self) -> Result<usize> {
        let n: i64 = self
            .sql()
            .row("SELECT count(*) FROM deferred_rows", [], |r| r.get(0))?;
        Ok(n as usize)
    }

    /// Call `f` with the rows of each block in turn, in the order stored
    /// (one block in memory at a time).
    pub fn for_each_row_block(
        &mut self,
        mut f: impl FnMut(&mut Self, Vec<(RawRowKey, u64, u64)>) -> Result<()>,
    ) -> Result<()> {
        let ids: Vec<i64> =
            self.sql()
                .rows("SELECT block FROM deferred_rows ORDER BY block", [], |r| {
                    r.get(0)
                })?;
        for id in ids {
            let blob: Vec<u8> = self.sql().row(
                "SELECT data FROM deferred_rows WHERE block = ?1",
                [id],
                |r| r.get(0),
            )?;
            let rows = decode_rows(&blob).ok_or_else(|| {
                self.damaged(
                    "deferred_rows",
                    format!("has block {id} whose rows cannot be read"),
                )
            })?;
            f(self, rows)?;
        }
        Ok(())
    }

    /// Add named rows to the session's `samples` (summed with equal keys,
    /// their stacks interned with the session's own).
    pub fn add_rows(&mut self, rows: &[(AggKey, u64, u64)]) -> Result<()> {
        self.writer.flush_with_rows(&Profile::new(), rows)
    }

    /// Record the build-ids (path, hex) of the files the names came from
    /// and what resolving met (added to the session's warnings), empty the
    /// deferred tables and remove the mark, in the one commit of everything
    /// since [`PendingSymbols::open`].
    pub fn finish(self, build_ids: &[(String, String)], warnings: &[String]) -> Result<()> {
        let r = self.write_end(build_ids, warnings);
        let c = &self.writer.conn;
        match r {
            Ok(()) => self.sql().execute_batch("COMMIT"),
            Err(e) => {
                let _ = c.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    fn write_end(&self, build_ids: &[(String, String)], warnings: &[String]) -> Result<()> {
        let sql = self.sql();
        sql.check(
            self.conn()
                .prepare(
                    "INSERT INTO images(path, build_id) VALUES (?1, ?2)
                     ON CONFLICT(path) DO UPDATE SET build_id = excluded.build_id",
                )
                .and_then(|mut st| {
                    for (path, id) in build_ids {
                        st.execute(params![path, id])?;
                    }
                    Ok(())
                }),
        )?;
        if !warnings.is_empty() {
            let old = self.meta("warnings")?.unwrap_or_default();
            let mut all: Vec<&str> = old.lines().filter(|l| !l.is_empty()).collect();
            for w in warnings {
                if !all.contains(&w.as_str()) {
                    all.push(w);
                }
            }
            sql.execute(
                "INSERT INTO meta(key, value) VALUES ('warnings', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [all.join("\n")],
            )?;
        }
        sql.execute_batch(
            "DELETE FROM deferred_rows; DELETE FROM deferred_stacks;
             DELETE FROM deferred_frames; DELETE FROM deferred_strings;
             DELETE FROM meta WHERE key = 'symbols';",
        )
    }
}
