//! The [`SessionWriter`]: creates a session file and adds to it, as
//! recorders and importers do (deltas added up in one transaction per
//! flush, at least once a second; a recorder's bookkeeping of a flush in
//! one [`SessionWriter::batch`]; an import's bulk load), then marks its
//! stop and folds the write-ahead log in. What a deferring recording
//! stores is in [`crate::deferred`], interval rows in [`crate::intervals`].

use crate::sql::{sql_err, Sql};
use crate::{schema, BenchSampleRow, DomainRecord, Result, ScaleRow, StoreError, SCHEMA_VERSION};
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vmscope_model::{AggKey, Profile, SessionEvent, UNKNOWN_SLICE};

/// A second or CPU as stored: -1 for [`UNKNOWN_SLICE`].
pub(crate) fn slice_column(v: u32) -> i64 {
    if v == UNKNOWN_SLICE {
        -1
    } else {
        i64::from(v)
    }
}

/// Writes one session. Create it, add events and domains, then `flush`
/// deltas at least once a second; `finish` marks a clean stop.
pub struct SessionWriter {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    stack_ids: vmscope_model::FastMap<Arc<str>, i64>,
    /// `block_strings` of the session (crate::blocks), by text.
    pub(crate) block_strings: vmscope_model::FastMap<Arc<str>, i64>,
    /// The blocks written so far, to chain the next (crate::blocks).
    pub(crate) chains: crate::blocks::Chains,
    /// [`SessionWriter::bulk_load`] is on.
    bulk: bool,
    /// The bulk load's one transaction is open (see
    /// [`SessionWriter::bulk_load`]); [`SessionWriter::settle`] commits it.
    pub(crate) bulk_tx: std::cell::Cell<bool>,
    /// A [`SessionWriter::batch`] is open: writes join its transaction.
    pub(crate) in_batch: bool,
    /// Deferred frames were stored (`meta.symbols` is set).
    pub(crate) deferred: bool,
    /// Space set aside for the last words of a session that fills its file
    /// system (see [`SessionWriter::release_reserve`]).
    reserve: Option<Reserve>,
}

/// Bytes set aside next to a session being written. When the file system
/// fills, freeing them lets the writer still say why the session stopped
/// (one meta row: a WAL frame or two) and fold the log in: without them
/// that last write fails too, and the partial file reads as a crash.
const RESERVE_BYTES: usize = 256 * 1024;

/// A file of [`RESERVE_BYTES`] written (not sparse, so the blocks are
/// taken) beside a session: `<session>-reserve`, removed when dropped.
struct Reserve(PathBuf);

impl Reserve {
    /// `None` when there is not even that much room: the session then
    /// goes without one (and fails on its first write anyway).
    fn take(session: &Path) -> Option<Reserve> {
        let p = PathBuf::from(format!("{}{RESERVE_SUFFIX}", session.display()));
        if std::fs::write(&p, vec![0u8; RESERVE_BYTES]).is_ok() {
            return Some(Reserve(p));
        }
        let _ = std::fs::remove_file(&p);
        None
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The suffix of a session's [`Reserve`] file, one of its companions with
/// `-wal` and `-shm`.
pub(crate) const RESERVE_SUFFIX: &str = "-reserve";

impl SessionWriter {
    /// Create (or replace) the session file at `path`. Low level: commands
    /// write sessions through [`crate::output::SessionOutput`], which checks the
    /// path, locks it and replaces it atomically.
    pub fn create(path: &Path) -> Result<SessionWriter> {
        Self::create_paged(path, None)
    }

    /// [`SessionWriter::create`] with SQLite pages of `page_size` bytes (a
    /// power of two from 512 to 65 536) instead of the default 4 KiB. Every
    /// table and index of the schema takes at least one page, so a small
    /// file that lives long (a history segment) is mostly those pages: on a
    /// 1-VM history they were 135 KB of a segment, 144 segments a day.
    pub fn create_paged(path: &Path, page_size: Option<u32>) -> Result<SessionWriter> {
        // Probe writability first so the error names the path, not SQLite.
        let probe = path.with_extension("vmscope-probe");
        if let Err(source) = std::fs::write(&probe, b"") {
            return Err(StoreError::NotWritable {
                path: path.to_path_buf(),
                source,
            });
        }
        let _ = std::fs::remove_file(&probe);
        for suffix in ["", "-wal", "-shm", RESERVE_SUFFIX] {
            let p = PathBuf::from(format!("{}{}", path.display(), suffix));
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(StoreError::NotWritable {
                        path: p.clone(),
                        source,
                    })
                }
            }
        }
        let conn = Connection::open(path).map_err(sql_err(path))?;
        Sql::new(&conn, path).check(
            // The page size is fixed when the first table is made, and
            // before the file is in WAL mode.
            page_size
                .map_or(Ok(()), |n| conn.pragma_update(None, "page_size", n))
                .and_then(|()| conn.pragma_update(None, "journal_mode", "WAL"))
                .and_then(|()| conn.pragma_update(None, "synchronous", "NORMAL"))
                // Rows keyed by second and CPU make the tables several
                // times larger than SQLite's default 2 MB page cache: past
                // it every flush spills and re-reads pages. 64 MiB at
                // most, taken only as the file grows.
                .and_then(|()| conn.pragma_update(None, "cache_size", -65_536))
                .and_then(|()| schema::create(&conn)),
        )?;
        let w = SessionWriter {
            conn,
            path: path.to_path_buf(),
            stack_ids: Default::default(),
            block_strings: Default::default(),
            chains: Default::default(),
            bulk: false,
            bulk_tx: std::cell::Cell::new(false),
            in_batch: false,
            deferred: false,
            reserve: Reserve::take(path),
        };
        w.set_meta("clean_stop", "0")?;
        // Sessions created at schema 3 or later have time and CPU per row.
        w.set_meta("created_schema", &SCHEMA_VERSION.to_string())?;
        w.set_meta("vmscope_version", env!("CARGO_PKG_VERSION"))?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Statements on the session, their errors naming its file.
    pub(crate) fn sql(&self) -> Sql<'_> {
        Sql::new(&self.conn, &self.path)
    }

    /// A writer of the existing session on `conn`, whose writes join the
    /// transaction the caller opened on it and ends (crate::deferred): the
    /// stacks the session has are interned as they are.
    pub(crate) fn resume(conn: Connection, path: &Path) -> Result<SessionWriter> {
        let mut stack_ids: vmscope_model::FastMap<Arc<str>, i64> = Default::default();
        {
            let sql = Sql::new(&conn, path);
            let mut st = sql.check(conn.prepare("SELECT id, frames FROM stacks"))?;
            let rows =
                sql.check(st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))))?;
            for row in rows {
                let (id, text) = sql.check(row)?;
                stack_ids.entry(text.into()).or_insert(id);
            }
        }
        Ok(SessionWriter {
            conn,
            path: path.to_path_buf(),
            stack_ids,
            block_strings: Default::default(),
            chains: Default::default(),
            bulk: false,
            bulk_tx: std::cell::Cell::new(false),
            in_batch: true,
            deferred: false,
            reserve: None,
        })
    }

    /// Let the write-ahead log grow to `pages` pages before SQLite folds it
    /// into the main file (its default is 1000 pages, 4 MiB). A recorder
    /// flushing every second dirties pages all over the samples table's
    /// B-tree each time, and every checkpoint copies them again: at 4 MiB
    /// that was about a tenth of the recorder's CPU under exec churn
    /// (bench/vs-perf part c). The log stays bounded by `pages`, and
    /// [`SessionWriter::close`] folds in what is left.
    pub fn set_wal_autocheckpoint(&self, pages: u32) -> Result<()> {
        self.sql()
            .row(&format!("PRAGMA wal_autocheckpoint = {pages}"), [], |_| {
                Ok(())
            })
    }

    /// Free the space set aside when the session was created, for the
    /// writes that end a session whose file system is full: why it
    /// stopped ([`SessionWriter::set_meta`]) and the final fold
    /// ([`SessionWriter::close`], which releases it itself).
    pub fn release_reserve(&mut self) {
        self.reserve = None;
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.sql().execute(
            "INSERT INTO meta(key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }

    /// Store the session's events; their order gives the indexes samples use.
    pub fn set_events(&self, events: &[SessionEvent]) -> Result<()> {
        self.write_tx(|tx| {
            tx.execute("DELETE FROM events", [])?;
            for (i, e) in events.iter().enumerate() {
                tx.execute(
                    "INSERT INTO events(id, name, period, frequency) VALUES (?1, ?2, ?3, ?4)",
                    params![
                        i as i64,
                        e.name,
                        e.period.map(|v| v as i64),
                        e.frequency.map(|v| v as i64)
                    ],
                )?;
            }
            Ok(())
        })
    }

    /// Run `f`'s statements in one transaction: its own, or the open
    /// [`SessionWriter::batch`]'s. A bulk load's open transaction is
    /// committed first (see [`SessionWriter::bulk_load`]).
    pub(crate) fn write_tx(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<()>,
    ) -> Result<()> {
        self.settle()?;
        if self.in_batch {
            return self.sql().check(f(&self.conn));
        }
        self.begin()?;
        self.end(self.sql().check(f(&self.conn)))
    }

    /// Open a write transaction (ended by [`SessionWriter::end`]).
    fn begin(&self) -> Result<()> {
        self.sql().execute_batch("BEGIN IMMEDIATE")
    }

    /// Commit the transaction [`SessionWriter::begin`] opened when `r` is
    /// `Ok`, roll it back otherwise; `r` either way (or the commit's error).
    fn end<T, E: From<StoreError>>(
        &self,
        r: std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        match r {
            Ok(v) => {
                self.sql().execute_batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Run `f`'s writes as one transaction: one commit for a recorder's
    /// bookkeeping of a flush (its cost intervals, agent rows, ended VMs,
    /// duration) instead of one each, which was most of what SQLite cost a
    /// recording between its start and its end. Writes inside `f` that
    /// would make their own transaction join this one; a nested `batch`
    /// joins too. If `f` fails, everything it wrote is rolled back.
    pub fn batch<T, E: From<StoreError>>(
        &mut self,
        f: impl FnOnce(&mut SessionWriter) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        if self.in_batch {
            return f(self);
        }
        self.settle()?;
        self.begin()?;
        self.in_batch = true;
        let r = f(self);
        self.in_batch = false;
        self.end(r)
    }

    pub fn upsert_domain(&self, d: &DomainRecord) -> Result<()> {
        self.sql().execute(
            "INSERT INTO domains(name, role, pid, status, ended_at, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(name) DO UPDATE SET role = excluded.role, pid = excluded.pid,
               status = excluded.status, ended_at = excluded.ended_at, detail = excluded.detail",
            params![
                d.domain.name,
                d.domain.role.as_str(),
                d.domain.pid,
                d.status,
                d.ended_at,
                d.detail
            ],
        )?;
        Ok(())
    }

    pub(crate) fn stack_id(&mut self, stack: &Arc<str>) -> Result<i64> {
        if stack.is_empty() {
            return Ok(0);
        }
        if let Some(id) = self.stack_ids.get(stack) {
            return Ok(*id);
        }
        // The writer is the only one to add stacks to its session (it
        // creates the file), so the map knows every stack already stored.
        // A cached statement: a recording with call stacks interns many new
        // stacks per flush.
        self.sql().check(
            self.conn
                .prepare_cached("INSERT INTO stacks(frames) VALUES (?1)")
                .and_then(|mut st| st.execute(params![&**stack])),
        )?;
        let id = self.conn.last_insert_rowid();
        self.stack_ids.insert(stack.clone(), id);
        Ok(id)
    }

    /// For a file that nobody reads before it is complete and that is
    /// discarded if the writer fails (an import's partial file, see
    /// [`crate::output::SessionOutput`]): write pages once, in place, with the
    /// rollback journal in memory and no syncs, instead of through the WAL
    /// and its checkpoints (every page written twice). [`SessionWriter::close`]
    /// puts the WAL back; the caller syncs the file
    /// ([`crate::output::SessionOutput::commit`] does).
    ///
    /// Flushes then go into one transaction that stays open until a write
    /// that makes its own (events, build-ids, intervals, bench rows) or
    /// [`SessionWriter::close`]: every page is written to the file once, at
    /// the end, instead of at every flush's commit (a row's page was
    /// rewritten by most of an import's flushes), and pages the file did not
    /// have when it began are never journaled. A failed flush leaves the
    /// transaction half done: the writer is then only to be dropped (the
    /// partial file is discarded, as any failed import's).
    pub fn bulk_load(&mut self) -> Result<()> {
        self.sql().check(
            self.conn
                .query_row("PRAGMA journal_mode=MEMORY", [], |_| Ok(()))
                .and_then(|()| self.conn.pragma_update(None, "synchronous", "OFF"))
                .and_then(|()| self.conn.execute_batch("BEGIN IMMEDIATE")),
        )?;
        self.bulk = true;
        self.bulk_tx.set(true);
        Ok(())
    }

    /// Commit the bulk load's open transaction, if any.
    fn settle(&self) -> Result<()> {
        if self.bulk_tx.get() {
            self.sql().execute_batch("COMMIT")?;
            self.bulk_tx.set(false);
        }
        Ok(())
    }

    /// Back to the journal every session has (readers expect WAL) after
    /// [`SessionWriter::bulk_load`].
    fn end_bulk_load(&self) -> Result<()> {
        if !self.bulk {
            return Ok(());
        }
        self.settle()?;
        self.sql().check(
            self.conn
                .pragma_update(None, "synchronous", "NORMAL")
                .and_then(|()| {
                    self.conn
                        .query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
                }),
        )
    }

    /// Add a delta profile (host measurements) to the session, in one transaction.
    pub fn flush(&mut self, delta: &Profile) -> Result<()> {
        self.flush_into(delta, "samples", &[])
    }

    /// Add a delta of what active VMs' agents measured in their guests. A
    /// guest's `[kernel.kallsyms]` and `[module]` images are stored as
    /// `[guest.kernel.kallsyms]` and `[guest.module]`.
    pub fn flush_agent(&mut self, delta: &Profile) -> Result<()> {
        self.flush_into(delta, "agent_samples", &[])
    }

    /// [`SessionWriter::flush_agent`] and [`SessionWriter::set_scale`] for
    /// each of `scales`, in one transaction: a recorder with many active VMs
    /// flushes every second, and one commit per VM's scale was as many
    /// write-ahead-log commits a second (bench/many-vms).
    pub fn flush_agent_scaled(&mut self, delta: &Profile, scales: &[ScaleRow]) -> Result<()> {
        self.flush_into(delta, "agent_samples", scales)
    }

    /// Record (replace) the scale of an active VM's agent rows for an event.
    pub fn set_scale(&self, s: &ScaleRow) -> Result<()> {
        let stored = self
            .conn
            .prepare_cached(
                "INSERT INTO domain_scale(domain, event, host_period, agent_period, agent_samples, agent_lost, factor)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(domain, event) DO UPDATE SET host_period = excluded.host_period,
                   agent_period = excluded.agent_period, agent_samples = excluded.agent_samples,
                   agent_lost = excluded.agent_lost, factor = excluded.factor",
            )
            .and_then(|mut st| {
                st.execute(params![
                    s.domain,
                    s.event,
                    s.host_period as i64,
                    s.agent_period as i64,
                    s.agent_samples as i64,
                    s.agent_lost as i64,
                    s.factor
                ])
            });
        self.sql().check(stored)?;
        Ok(())
    }

    fn flush_into(
        &mut self,
        delta: &Profile,
        table: &'static str,
        scales: &[ScaleRow],
    ) -> Result<()> {
        self.flush_rows_into(delta, &[], table, scales)
    }

    /// [`SessionWriter::flush`] of `delta` plus `rows` that are not in its
    /// map yet, in one transaction: rows whose keys are equal are summed by
    /// the upsert, so a caller that aggregated by something finer than the
    /// key text (import: by string identity) need not hash every stack
    /// text into a [`Profile`] first.
    pub fn flush_with_rows(&mut self, delta: &Profile, rows: &[(AggKey, u64, u64)]) -> Result<()> {
        self.flush_rows_into(delta, rows, "samples", &[])
    }

    fn flush_rows_into(
        &mut self,
        delta: &Profile,
        extra: &[(AggKey, u64, u64)],
        table: &'static str,
        scales: &[ScaleRow],
    ) -> Result<()> {
        if delta.is_empty() && extra.is_empty() && scales.is_empty() {
            return Ok(());
        }
        if self.bulk_tx.get() || self.in_batch {
            // Inside the bulk load's or a batch's transaction.
            self.flush_inner(delta, extra, table)?;
            return scales.iter().try_for_each(|s| self.set_scale(s));
        }
        self.begin()?;
        let r = self
            .flush_inner(delta, extra, table)
            .and_then(|()| scales.iter().try_for_each(|s| self.set_scale(s)));
        self.end(r)
    }

    fn flush_inner(
        &mut self,
        delta: &Profile,
        extra: &[(AggKey, u64, u64)],
        table: &'static str,
    ) -> Result<()> {
        let mut rows = Vec::with_capacity(delta.rows.len() + extra.len());
        for (key, c) in &delta.rows {
            rows.push((key, (c.samples, c.period), self.stack_id(&key.stack)?));
        }
        for (key, samples, period) in extra {
            rows.push((key, (*samples, *period), self.stack_id(&key.stack)?));
        }
        // In the table's key order: each insert then lands on the page the
        // previous one left in the cache (and SQLite's balancing appends),
        // instead of a random page of a B-tree larger than the cache.
        rows.sort_unstable_by(|(a, _, sa), (b, _, sb)| {
            // Most neighbours share their strings' allocations.
            let text = |x: &Arc<str>, y: &Arc<str>| {
                if Arc::ptr_eq(x, y) {
                    std::cmp::Ordering::Equal
                } else {
                    x.cmp(y)
                }
            };
            slice_column(a.second)
                .cmp(&slice_column(b.second))
                .then_with(|| slice_column(a.cpu).cmp(&slice_column(b.cpu)))
                .then_with(|| a.event.cmp(&b.event))
                .then_with(|| text(&a.domain, &b.domain))
                .then_with(|| a.context.as_str().cmp(b.context.as_str()))
                .then_with(|| text(&a.process, &b.process))
                .then_with(|| text(&a.image, &b.image))
                .then_with(|| text(&a.symbol, &b.symbol))
                .then_with(|| sa.cmp(sb))
                .then_with(|| text(&a.srcline, &b.srcline))
        });
        self.sql()
            .check(insert_rows(&self.conn, table, &rows, delta))
    }

    /// Record the build-ids (hex) of files the session's symbols came from.
    pub fn set_build_ids(&self, ids: &[(String, String)]) -> Result<()> {
        self.write_tx(|tx| {
            for (path, id) in ids {
                tx.execute(
                    "INSERT INTO images(path, build_id) VALUES (?1, ?2)
                     ON CONFLICT(path) DO UPDATE SET build_id = excluded.build_id",
                    params![path, id],
                )?;
            }
            Ok(())
        })
    }

    /// Add benchmark rows (`bench_samples`), in one transaction.
    pub fn add_bench_samples(&self, rows: &[BenchSampleRow]) -> Result<()> {
        self.write_tx(|tx| {
            let mut st = tx.prepare_cached(
                "INSERT INTO bench_samples(experiment, config_hash, manifest, point, sample,
                   metric, value, unit, raw_output, flagged)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?;
            for r in rows {
                st.execute(params![
                    r.experiment,
                    r.config_hash,
                    r.manifest,
                    r.point,
                    r.sample,
                    r.metric,
                    r.value,
                    r.unit,
                    r.raw_output,
                    r.flagged
                ])?;
            }
            Ok(())
        })
    }

    /// Mark the session's stop (clean or not), fold the whole WAL into the
    /// main file and close it, so no `-wal`/`-shm` file stays behind and the
    /// file can be renamed on its own ([`crate::output::SessionOutput::commit`]).
    /// A reader holding the WAL open is waited for (up to 10 s).
    pub fn close(mut self, clean: bool) -> Result<()> {
        self.release_reserve();
        self.set_meta("clean_stop", if clean { "1" } else { "0" })?;
        let path = self.path.clone();
        self.end_bulk_load()?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // (busy, frames in the log, frames checkpointed)
            let (busy, log, done): (i64, i64, i64) =
                self.sql().row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            if busy == 0 && log == done {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(StoreError::NotWritable {
                    path,
                    source: std::io::Error::other(
                        "a reader kept the write-ahead log open for 10 s; the session is complete but its log could not be folded in",
                    ),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.conn.close().map_err(|(_, e)| sql_err(&path)(e))?;
        Ok(())
    }

    /// Mark the session complete and checkpoint the WAL into the main file.
    pub fn finish(mut self, clean: bool) -> Result<()> {
        self.release_reserve();
        self.set_meta("clean_stop", if clean { "1" } else { "0" })?;
        self.end_bulk_load()?;
        let _ = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        Ok(())
    }
}

/// Add `rows` (key, counts, stack id) to `table` (`samples` or
/// `agent_samples`) and `delta`'s bins and lost counts to theirs, with
/// statements kept prepared (a recorder flushes every second).
fn insert_rows(
    conn: &Connection,
    table: &str,
    rows: &[(&AggKey, (u64, u64), i64)],
    delta: &Profile,
) -> rusqlite::Result<()> {
    let mut st = conn.prepare_cached(&format!(
        "INSERT INTO {table}(event, domain, context, process, image, symbol, stack, srcline, second, cpu, samples, period)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT(event, domain, context, process, image, symbol, stack, srcline, second, cpu)
         DO UPDATE SET samples = samples + excluded.samples, period = period + excluded.period"
    ))?;
    for &(k, (samples, period), stack) in rows {
        // Agents name their guest's kernel and modules as any Linux
        // does; stored apart from the host's (docs/architecture.md §4).
        let image = if table == "agent_samples" {
            vmscope_model::guest_image(&k.image, k.context)
        } else {
            std::borrow::Cow::Borrowed(&*k.image)
        };
        st.execute(params![
            k.event,
            &*k.domain,
            k.context.as_str(),
            &*k.process,
            &*image,
            &*k.symbol,
            stack,
            &*k.srcline,
            slice_column(k.second),
            slice_column(k.cpu),
            samples as i64,
            period as i64
        ])?;
    }
    let mut st = conn.prepare_cached(
        "INSERT INTO bins(second, event, domain, context, samples) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(second, event, domain, context) DO UPDATE SET samples = samples + excluded.samples",
    )?;
    for ((sec, ev, dom, ctx), n) in &delta.bins {
        st.execute(params![sec, ev, &**dom, ctx.as_str(), *n as i64])?;
    }
    let mut st = conn.prepare_cached(
        "INSERT INTO lost(event, count) VALUES (?1, ?2)
         ON CONFLICT(event) DO UPDATE SET count = count + excluded.count",
    )?;
    for (ev, n) in &delta.lost {
        st.execute(params![i64::from(*ev), *n as i64])?;
    }
    Ok(())
}
