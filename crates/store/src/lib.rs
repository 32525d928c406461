//! The session store (docs/architecture.md §7): one SQLite file (WAL) per session.
//!
//! This crate owns the schema and its version, the [`SessionWriter`] that
//! recorders and importers use (deltas added up in one transaction per flush,
//! at least once a second), the [`Session`] reader that reports use (which
//! validates a session once when it opens it), and [`output`]: how every
//! command writes a file (checked paths, one writer per session, atomic
//! replacement; docs/architecture.md §7.1). It knows nothing of perf, /proc
//! or printing. The `sqlite3` CLI reads the files:
//! `sqlite3 vmscope.db 'select * from samples order by samples desc limit 5'`.

mod deferred;
mod intervals;
pub mod output;
mod schema;
mod validate;

pub use deferred::{snapshot, PendingSymbols, SYMBOLS_DEFERRED};
pub use intervals::IntervalRow;

pub use schema::SCHEMA_VERSION;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vmscope_model::{
    AggKey, Context, Domain, Profile, ProfileRow, Role, SessionEvent, UNKNOWN_SLICE,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: cannot write: {source}")]
    NotWritable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot read it: {source}")]
    NotReadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no such session file{}", hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
    Missing { path: PathBuf, hint: Option<String> },
    #[error("{path}: not a vmscope session file ({reason})")]
    NotASession { path: PathBuf, reason: String },
    #[error("{path}: session schema version {found} is newer than this vmscope understands ({supported}); upgrade vmscope")]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("{path}: session file is corrupt: {}", sqlite_text(error))]
    Corrupt {
        path: PathBuf,
        error: rusqlite::Error,
    },
    #[error("{path}: {}", sqlite_text(error))]
    Sql {
        path: PathBuf,
        error: rusqlite::Error,
    },
    /// An output path that must not be written (see [`output`]).
    #[error("{path} {reason}")]
    OutputRefused { path: PathBuf, reason: String },
    /// Another process is writing this session.
    #[error("{path} is being written by {}; wait for it to end, or write to another file", writer_text(*pid, command))]
    Locked {
        path: PathBuf,
        pid: Option<u32>,
        command: String,
    },
    /// The file system filled up while the session was written.
    #[error("{path}: no space left on the file system ({fs}); the session needed more than the {} it had reached", output::bytes(*written))]
    DiskFull {
        path: PathBuf,
        fs: String,
        written: u64,
    },
    /// A session whose frames were left for the first read and cannot be
    /// resolved now.
    #[error("{path}: its symbols were left for the first read, and {why}")]
    SymbolsPending { path: PathBuf, why: String },
    /// A session whose tables were damaged after it was written.
    #[error("{path}: damaged session: table '{table}' {what}")]
    Damaged {
        path: PathBuf,
        table: &'static str,
        what: String,
    },
}

impl StoreError {
    /// Whether this is a full file system.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::DiskFull { .. })
    }
}

/// SQLite's own message, once (rusqlite's Display of a failure and its
/// source repeat it, then add the generic text of the result code).
/// SQLite's generic texts for what users meet are translated into what to
/// check ("unable to open database file" says neither).
fn sqlite_text(e: &rusqlite::Error) -> String {
    use rusqlite::ErrorCode;
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => match code.code {
            ErrorCode::CannotOpen => "SQLite cannot open it or the files beside it (FILE-wal, \
                 FILE-shm): the file or its directory is not readable or writable by this user, \
                 or the file system is read-only"
                .into(),
            ErrorCode::ReadOnly => "it cannot be written here (a read-only file system, or a \
                 file or directory of another user)"
                .into(),
            ErrorCode::PermissionDenied => "permission denied".into(),
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                "another process holds it locked; try again when it is done".into()
            }
            ErrorCode::NotADatabase => "not an SQLite database".into(),
            _ => match msg {
                Some(m) if !m.is_empty() => m.clone(),
                _ => e.to_string(),
            },
        },
        other => other.to_string(),
    }
}

fn writer_text(pid: Option<u32>, command: &str) -> String {
    match (pid, command.is_empty()) {
        (Some(p), false) => format!("process {p} ({command})"),
        (Some(p), true) => format!("process {p}"),
        (None, _) => "another process".into(),
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// A domain as stored, with its end state.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainRecord {
    pub domain: Domain,
    /// `running`, `ended`, `lost` or `dropped`.
    pub status: String,
    /// Seconds since session start when the domain ended or was lost.
    pub ended_at: Option<f64>,
    /// Free text: why it ended, the accelerator it ran under, …
    pub detail: String,
}

/// Scale of an active VM's agent rows (docs/architecture.md §4, coordinated profiling).
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleRow {
    pub domain: String,
    pub event: u32,
    /// Guest time the host measured on the VM's vCPU threads (sum of periods).
    pub host_period: u64,
    /// Busy (non-idle) time the agent measured inside the guest.
    pub agent_period: u64,
    pub agent_samples: u64,
    pub agent_lost: u64,
    /// host_period / agent_period: what one unit of agent period is worth.
    pub factor: f64,
}

/// Which measurements a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// The global profile: host samples, with each active VM's guest rows
    /// replaced by its agent's rows scaled to the guest time the host
    /// measured (so the profile adds up to what the physical CPUs did).
    #[default]
    Merged,
    /// Only what the host's rings measured.
    Host,
    /// Only what agents measured inside their guests, unscaled.
    Agent,
}

/// A time and CPU slice of a session (`report --time`, `--cpu`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slice {
    /// First and last whole second since the start, inclusive.
    pub seconds: Option<(u32, u32)>,
    /// Host CPUs. Agents' rows carry guest CPUs (vCPUs), so they are not
    /// filtered by this: in the merged view they are scaled to the guest
    /// time the host measured on these CPUs.
    pub cpus: Option<Vec<u32>>,
}

impl Slice {
    pub fn is_all(&self) -> bool {
        self.seconds.is_none() && self.cpus.is_none()
    }

    /// SQL condition on a table aliased `alias` (numbers only: no user text).
    fn condition(&self, alias: &str, with_cpu: bool) -> String {
        let mut c = vec!["1".to_string()];
        if let Some((a, b)) = self.seconds {
            c.push(format!("{alias}.second BETWEEN {a} AND {b}"));
        }
        if let (true, Some(cpus)) = (with_cpu, &self.cpus) {
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            c.push(format!("{alias}.cpu IN ({})", list.join(",")));
        }
        c.join(" AND ")
    }
}

/// Columns every row source has, in this order.
const COLUMNS: &str =
    "event, domain, context, process, image, symbol, stack, srcline, second, cpu, samples, period";

const GUEST_CONTEXTS: &str = "('guest', 'guest-user', 'guest-kernel')";

impl View {
    /// The row source restricted to a slice. In the merged view the scale
    /// of each active VM is recomputed for the slice: the guest time the
    /// host measured in it over the agent's busy time in it.
    fn source_in(self, slice: &Slice) -> String {
        let host = slice.condition("s", true);
        let agent = slice.condition("a", false);
        match self {
            View::Host if slice.is_all() => "samples".into(),
            View::Agent if slice.is_all() => "agent_samples".into(),
            View::Host => format!("(SELECT {COLUMNS} FROM samples s WHERE {host})"),
            View::Agent => format!("(SELECT {COLUMNS} FROM agent_samples a WHERE {agent})"),
            View::Merged => {
                let factors = if slice.is_all() {
                    "SELECT domain, event, factor FROM domain_scale".to_string()
                } else {
                    format!(
                        "SELECT d.domain, d.event, \
                           (SELECT SUM(s.period) FROM samples s WHERE s.domain = d.domain AND s.event = d.event \
                              AND s.context IN {GUEST_CONTEXTS} AND {host}) * 1.0 / \
                           (SELECT SUM(a.period) FROM agent_samples a WHERE a.domain = d.domain AND a.event = d.event \
                              AND a.process != 'swapper' AND {agent}) AS factor \
                         FROM domain_scale d"
                    )
                };
                format!(
                    "(WITH f AS ({factors}) \
                      SELECT {COLUMNS} FROM samples s \
                      WHERE {host} AND NOT (s.context IN {GUEST_CONTEXTS} AND EXISTS \
                        (SELECT 1 FROM f WHERE f.domain = s.domain AND f.event = s.event AND f.factor IS NOT NULL)) \
                      UNION ALL \
                      SELECT a.event, a.domain, a.context, a.process, a.image, a.symbol, a.stack, a.srcline, \
                        a.second, a.cpu, a.samples, CAST(ROUND(a.period * f.factor) AS INTEGER) AS period \
                      FROM agent_samples a JOIN f ON f.domain = a.domain AND f.event = a.event \
                      WHERE a.process != 'swapper' AND f.factor IS NOT NULL AND {agent})"
                )
            }
        }
    }
}

/// Columns a report can group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Domain,
    Context,
    Process,
    Image,
    Symbol,
    /// Source file and line (DWARF).
    Srcline,
    /// The CPU (`-1` where the source did not record it).
    Cpu,
}

impl Field {
    pub fn parse(s: &str) -> Option<Field> {
        match s.trim() {
            "domain" | "vm" => Some(Field::Domain),
            "context" | "ctx" => Some(Field::Context),
            "process" | "comm" => Some(Field::Process),
            "image" | "dso" => Some(Field::Image),
            "symbol" | "sym" => Some(Field::Symbol),
            "srcline" => Some(Field::Srcline),
            "cpu" => Some(Field::Cpu),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Field::Domain => "domain",
            Field::Context => "context",
            Field::Process => "process",
            Field::Image => "image",
            Field::Symbol => "symbol",
            Field::Srcline => "srcline",
            Field::Cpu => "cpu",
        }
    }
    /// SQL expression a report groups by. The context view splits kernel
    /// modules from the core kernel (menon2005 Table 1: kernel / driver).
    fn select_expr(self) -> &'static str {
        match self {
            Field::Context => {
                "(context || CASE WHEN context IN ('host-kernel','vmm-kernel','guest-kernel') \
                 AND image LIKE '[%]' AND image NOT IN ('[kernel.kallsyms]','[guest.kernel.kallsyms]') \
                 THEN ' (modules)' ELSE '' END)"
            }
            Field::Cpu => "CAST(cpu AS TEXT)",
            _ => self.name(),
        }
    }
    /// Column a filter compares with.
    fn column(self) -> &'static str {
        self.name()
    }
}

/// What a session can be sliced by (`report --time`, `--cpu`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slicing {
    /// Schema version the session was written with (2 for older files).
    pub created_schema: i64,
    /// Every host row has its second.
    pub time: bool,
    /// Every host row has its CPU.
    pub cpu: bool,
    /// First and last second with samples.
    pub seconds: Option<(u32, u32)>,
    /// CPUs with samples.
    pub cpus: Vec<u32>,
}

/// One grouped row: values in the order of the requested fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRow {
    pub values: Vec<String>,
    pub samples: u64,
    pub period: u64,
}

/// A second or CPU as stored: -1 for [`UNKNOWN_SLICE`].
fn slice_column(v: u32) -> i64 {
    if v == UNKNOWN_SLICE {
        -1
    } else {
        i64::from(v)
    }
}

fn sql_err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |error| {
        if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            return StoreError::DiskFull {
                path: path.to_path_buf(),
                fs: output::describe_fs(path),
                written: output::session_bytes(path),
            };
        }
        StoreError::Sql {
            path: path.to_path_buf(),
            error,
        }
    }
}

/// One row of `bench_samples`: a benchmark's measured number in a base
/// unit, with its configuration hash and manifest (JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchSampleRow {
    pub experiment: String,
    pub config_hash: String,
    pub manifest: String,
    pub point: String,
    pub sample: i64,
    pub metric: String,
    pub value: f64,
    pub unit: String,
    pub raw_output: Option<String>,
    pub flagged: Option<String>,
}

/// Writes one session. Create it, add events and domains, then `flush`
/// deltas at least once a second; `finish` marks a clean stop.
pub struct SessionWriter {
    conn: Connection,
    path: PathBuf,
    stack_ids: vmscope_model::FastMap<Arc<str>, i64>,
    /// [`SessionWriter::bulk_load`] is on.
    bulk: bool,
    /// The bulk load's one transaction is open (see
    /// [`SessionWriter::bulk_load`]); [`SessionWriter::settle`] commits it.
    bulk_tx: std::cell::Cell<bool>,
    /// A [`SessionWriter::batch`] is open: writes join its transaction.
    in_batch: bool,
    /// Deferred frames were stored (`meta.symbols` is set).
    deferred: bool,
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
    /// write sessions through [`output::SessionOutput`], which checks the
    /// path, locks it and replaces it atomically.
    pub fn create(path: &Path) -> Result<SessionWriter> {
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
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql_err(path))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql_err(path))?;
        // Rows keyed by second and CPU make the tables several times larger
        // than SQLite's default 2 MB page cache: past it every flush spills
        // and re-reads pages. 64 MiB at most, taken only as the file grows.
        conn.pragma_update(None, "cache_size", -65_536)
            .map_err(sql_err(path))?;
        schema::create(&conn).map_err(sql_err(path))?;
        let w = SessionWriter {
            conn,
            path: path.to_path_buf(),
            stack_ids: Default::default(),
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

    /// A writer of the existing session on `conn`, whose writes join the
    /// transaction the caller opened on it and ends (crate::deferred): the
    /// stacks the session has are interned as they are.
    pub(crate) fn resume(conn: Connection, path: &Path) -> Result<SessionWriter> {
        let mut stack_ids: vmscope_model::FastMap<Arc<str>, i64> = Default::default();
        {
            let mut st = conn
                .prepare("SELECT id, frames FROM stacks")
                .map_err(sql_err(path))?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
                .map_err(sql_err(path))?;
            for row in rows {
                let (id, text) = row.map_err(sql_err(path))?;
                stack_ids.entry(text.into()).or_insert(id);
            }
        }
        Ok(SessionWriter {
            conn,
            path: path.to_path_buf(),
            stack_ids,
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
        self.conn
            .query_row(&format!("PRAGMA wal_autocheckpoint = {pages}"), [], |_| {
                Ok(())
            })
            .map_err(sql_err(&self.path))?;
        Ok(())
    }

    /// Free the space set aside when the session was created, for the
    /// writes that end a session whose file system is full: why it
    /// stopped ([`SessionWriter::set_meta`]) and the final fold
    /// ([`SessionWriter::close`], which releases it itself).
    pub fn release_reserve(&mut self) {
        self.reserve = None;
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(sql_err(&self.path))?;
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
    fn write_tx(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<()>) -> Result<()> {
        self.settle()?;
        if self.in_batch {
            return f(&self.conn).map_err(sql_err(&self.path));
        }
        self.begin()?;
        self.end(f(&self.conn).map_err(sql_err(&self.path)))
    }

    /// Open a write transaction (ended by [`SessionWriter::end`]).
    fn begin(&self) -> Result<()> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(sql_err(&self.path))
    }

    /// Commit the transaction [`SessionWriter::begin`] opened when `r` is
    /// `Ok`, roll it back otherwise; `r` either way (or the commit's error).
    fn end<T, E: From<StoreError>>(
        &self,
        r: std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        match r {
            Ok(v) => {
                self.conn
                    .execute_batch("COMMIT")
                    .map_err(sql_err(&self.path))?;
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
        self.conn
            .execute(
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
            )
            .map_err(sql_err(&self.path))?;
        Ok(())
    }

    fn stack_id(&mut self, stack: &Arc<str>) -> Result<i64> {
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
        self.conn
            .prepare_cached("INSERT INTO stacks(frames) VALUES (?1)")
            .and_then(|mut st| st.execute(params![&**stack]))
            .map_err(sql_err(&self.path))?;
        let id = self.conn.last_insert_rowid();
        self.stack_ids.insert(stack.clone(), id);
        Ok(id)
    }

    /// For a file that nobody reads before it is complete and that is
    /// discarded if the writer fails (an import's partial file, see
    /// [`output::SessionOutput`]): write pages once, in place, with the
    /// rollback journal in memory and no syncs, instead of through the WAL
    /// and its checkpoints (every page written twice). [`SessionWriter::close`]
    /// puts the WAL back; the caller syncs the file
    /// ([`output::SessionOutput::commit`] does).
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
        let path = self.path.clone();
        self.conn
            .query_row("PRAGMA journal_mode=MEMORY", [], |_| Ok(()))
            .and_then(|()| self.conn.pragma_update(None, "synchronous", "OFF"))
            .and_then(|()| self.conn.execute_batch("BEGIN IMMEDIATE"))
            .map_err(sql_err(&path))?;
        self.bulk = true;
        self.bulk_tx.set(true);
        Ok(())
    }

    /// Commit the bulk load's open transaction, if any.
    fn settle(&self) -> Result<()> {
        if self.bulk_tx.get() {
            self.conn
                .execute_batch("COMMIT")
                .map_err(sql_err(&self.path))?;
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
        self.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .and_then(|()| {
                self.conn
                    .query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
            })
            .map_err(sql_err(&self.path))
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
        self.conn
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
            })
            .map_err(sql_err(&self.path))?;
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
        let path = self.path.clone();
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
        {
            let mut st = self
                .conn
                .prepare_cached(&format!(
                    "INSERT INTO {table}(event, domain, context, process, image, symbol, stack, srcline, second, cpu, samples, period)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                     ON CONFLICT(event, domain, context, process, image, symbol, stack, srcline, second, cpu)
                     DO UPDATE SET samples = samples + excluded.samples, period = period + excluded.period"
                ))
                .map_err(sql_err(&path))?;
            for (k, (samples, period), stack) in rows {
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
                ])
                .map_err(sql_err(&path))?;
            }
        }
        {
            let mut st = self
                .conn
                .prepare_cached(
                    "INSERT INTO bins(second, event, domain, context, samples) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT(second, event, domain, context) DO UPDATE SET samples = samples + excluded.samples",
                )
                .map_err(sql_err(&path))?;
            for ((sec, ev, dom, ctx), n) in &delta.bins {
                st.execute(params![sec, ev, &**dom, ctx.as_str(), *n as i64])
                    .map_err(sql_err(&path))?;
            }
        }
        {
            let mut st = self
                .conn
                .prepare_cached(
                    "INSERT INTO lost(event, count) VALUES (?1, ?2)
                     ON CONFLICT(event) DO UPDATE SET count = count + excluded.count",
                )
                .map_err(sql_err(&path))?;
            for (ev, n) in &delta.lost {
                st.execute(params![i64::from(*ev), *n as i64])
                    .map_err(sql_err(&path))?;
            }
        }
        Ok(())
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
    /// file can be renamed on its own ([`output::SessionOutput::commit`]).
    /// A reader holding the WAL open is waited for (up to 10 s).
    pub fn close(mut self, clean: bool) -> Result<()> {
        self.release_reserve();
        self.set_meta("clean_stop", if clean { "1" } else { "0" })?;
        let path = self.path.clone();
        self.end_bulk_load()?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // (busy, frames in the log, frames checkpointed)
            let (busy, log, done): (i64, i64, i64) = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .map_err(sql_err(&path))?;
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

/// `file:/abs/path?immutable=1`, the path percent-encoded as SQLite's URI
/// syntax wants.
/// A read-only connection to a session: plainly, or, where SQLite cannot
/// make the WAL index beside it (a read-only file system, a directory of
/// another user) and no WAL holds anything, as an immutable file, which
/// needs none.
pub(crate) fn open_read_only(path: &Path) -> Result<Connection> {
    let plain = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|c| {
        // Opening is lazy: the first read is what needs the WAL index.
        c.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))?;
        Ok(c)
    });
    match plain {
        Ok(c) => Ok(c),
        Err(e) => {
            let wal_empty =
                std::fs::metadata(format!("{}-wal", path.display())).map_or(true, |m| m.len() == 0);
            if !wal_empty {
                return Err(StoreError::Sql {
                    path: path.to_path_buf(),
                    error: e,
                });
            }
            Connection::open_with_flags(
                immutable_uri(path),
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_URI
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(sql_err(path))
        }
    }
}

fn immutable_uri(path: &Path) -> String {
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut uri = String::from("file:");
    for b in abs.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-~".contains(b) {
            uri.push(char::from(*b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// A session opened for reading.
pub struct Session {
    conn: Connection,
    path: PathBuf,
}

impl Session {
    pub fn open(path: &Path) -> Result<Session> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
                hint: output::partial_note(path),
            });
        }
        // A FIFO would block the open below until a writer came; a device
        // or a directory is no session either.
        if let Ok(m) = std::fs::metadata(path) {
            if let Some(kind) = output::special_kind(&m) {
                return Err(StoreError::NotASession {
                    path: path.to_path_buf(),
                    reason: format!("it is {kind}, not a regular file"),
                });
            }
        }
        // Check the header ourselves: SQLite's "file is not a database" is vague.
        let mut head = [0u8; 16];
        match std::fs::File::open(path).and_then(|mut f| {
            use std::io::Read;
            f.read_exact(&mut head)
        }) {
            Ok(()) if &head == b"SQLite format 3\0" => {}
            Ok(()) => {
                return Err(StoreError::NotASession {
                    path: path.to_path_buf(),
                    reason: "not an SQLite database".into(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(StoreError::NotASession {
                    path: path.to_path_buf(),
                    reason: "file too short to be an SQLite database".into(),
                })
            }
            Err(source) => {
                return Err(StoreError::NotReadable {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
        // Read-write open so a session left with a WAL by a killed recorder is
        // recovered; fall back to read-only for files we may not write (or
        // on a full file system, where the WAL index cannot be created).
        let open = |flags: OpenFlags| -> std::result::Result<(Connection, i64), rusqlite::Error> {
            let conn = Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
            let version = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            Ok((conn, version))
        };
        let wal_empty =
            std::fs::metadata(format!("{}-wal", path.display())).map_or(true, |m| m.len() == 0);
        let (conn, version) = open(OpenFlags::SQLITE_OPEN_READ_WRITE)
            .or_else(|_| open(OpenFlags::SQLITE_OPEN_READ_ONLY))
            .or_else(|e| {
                // Everything is in the main file: read it as immutable, which
                // needs no WAL index at all.
                if !wal_empty {
                    return Err(e);
                }
                let conn = Connection::open_with_flags(
                    immutable_uri(path),
                    OpenFlags::SQLITE_OPEN_READ_ONLY
                        | OpenFlags::SQLITE_OPEN_URI
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                let version = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
                Ok((conn, version))
            })
            .map_err(|error| StoreError::Corrupt {
                path: path.to_path_buf(),
                error,
            })?;
        let has_meta: Option<String> = conn
            .query_row(
                "SELECT name FROM sqlite_master WHERE type='table' AND name='meta'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|error| StoreError::Corrupt {
                path: path.to_path_buf(),
                error,
            })?;
        if has_meta.is_none() || version == 0 {
            return Err(StoreError::NotASession {
                path: path.to_path_buf(),
                reason: "an SQLite database without vmscope's tables".into(),
            });
        }
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: path.to_path_buf(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version < SCHEMA_VERSION {
            schema::migrate(&conn, version).map_err(sql_err(path))?;
        }
        // Integrity of what we read: a damaged page shows up here, not later.
        let ok: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(|error| StoreError::Corrupt {
                path: path.to_path_buf(),
                error,
            })?;
        if ok != "ok" {
            return Err(StoreError::NotASession {
                path: path.to_path_buf(),
                reason: format!("integrity check failed: {ok}"),
            });
        }
        validate::session(&conn, path)?;
        Ok(Session {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every `bench_samples` row, in insertion order.
    /// Name the session `shown` wherever it names itself (a temporary copy
    /// read in place of the file the user gave).
    pub fn shown_as(mut self, shown: &Path) -> Session {
        self.path = shown.to_path_buf();
        self
    }

    /// Host samples stored so far, every event, from the per-second bins:
    /// they are written as samples are recorded, also while a recording
    /// leaves its rows for the first read ([`Session::symbols_pending`]).
    pub fn stored_samples(&self) -> Result<u64> {
        self.conn
            .query_row("SELECT coalesce(sum(samples), 0) FROM bins", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n.max(0) as u64)
            .map_err(sql_err(&self.path))
    }

    /// Whether the session's recording left frames for the first read to
    /// resolve ([`PendingSymbols`]): until they are, its image, symbol and
    /// stack texts carry tokens instead of names.
    pub fn symbols_pending(&self) -> Result<bool> {
        let v: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'symbols'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql_err(&self.path))?;
        Ok(v.as_deref() == Some(SYMBOLS_DEFERRED))
    }

    pub fn bench_samples(&self) -> Result<Vec<BenchSampleRow>> {
        let mut st = self
            .conn
            .prepare(
                "SELECT experiment, config_hash, manifest, point, sample, metric, value, unit,
                   raw_output, flagged FROM bench_samples ORDER BY rowid",
            )
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| {
                Ok(BenchSampleRow {
                    experiment: r.get(0)?,
                    config_hash: r.get(1)?,
                    manifest: r.get(2)?,
                    point: r.get(3)?,
                    sample: r.get(4)?,
                    metric: r.get(5)?,
                    value: r.get(6)?,
                    unit: r.get(7)?,
                    raw_output: r.get(8)?,
                    flagged: r.get(9)?,
                })
            })
            .map_err(sql_err(&self.path))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql_err(&self.path))?;
        Ok(rows)
    }

    /// Adds or replaces a metadata key of a finished session (a benchmark
    /// names the point it recorded this session for). Fails on a session
    /// opened read-only.
    pub fn annotate(&self, key: &str, value: &str) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(sql_err(&self.path))?;
        Ok(())
    }

    pub fn meta(&self) -> Result<BTreeMap<String, String>> {
        let mut st = self
            .conn
            .prepare("SELECT key, value FROM meta")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    pub fn events(&self) -> Result<Vec<SessionEvent>> {
        let mut st = self
            .conn
            .prepare("SELECT name, period, frequency FROM events ORDER BY id")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| {
                Ok(SessionEvent {
                    name: r.get(0)?,
                    period: r.get::<_, Option<i64>>(1)?.map(|v| v as u64),
                    frequency: r.get::<_, Option<i64>>(2)?.map(|v| v as u64),
                })
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    pub fn domains(&self) -> Result<Vec<DomainRecord>> {
        let mut st = self
            .conn
            .prepare("SELECT name, role, pid, status, ended_at, detail FROM domains ORDER BY name = 'host' DESC, name")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| {
                let role: String = r.get(1)?;
                Ok(DomainRecord {
                    domain: Domain {
                        name: r.get(0)?,
                        role: Role::parse(&role).unwrap_or(Role::Passive),
                        pid: r.get(2)?,
                    },
                    status: r.get(3)?,
                    ended_at: r.get(4)?,
                    detail: r.get(5)?,
                })
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// Lost records per event index.
    pub fn lost(&self) -> Result<BTreeMap<u32, u64>> {
        let mut st = self
            .conn
            .prepare("SELECT event, count FROM lost")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u64))
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// (samples, period) totals per event index.
    pub fn totals(&self, view: View) -> Result<BTreeMap<u32, (u64, u64)>> {
        self.totals_in(view, &Slice::default())
    }

    /// What this session can be sliced by.
    pub fn slicing(&self) -> Result<Slicing> {
        let created: i64 = self
            .meta()?
            .get("created_schema")
            .and_then(|v| v.parse().ok())
            .unwrap_or(2);
        let q = |sql: &str| -> Result<bool> {
            self.conn
                .query_row(sql, [], |r| r.get::<_, bool>(0))
                .map_err(sql_err(&self.path))
        };
        let time = created >= 3 && !q("SELECT EXISTS(SELECT 1 FROM samples WHERE second < 0)")?;
        let cpu = created >= 3 && !q("SELECT EXISTS(SELECT 1 FROM samples WHERE cpu < 0)")?;
        let (first, last): (Option<i64>, Option<i64>) = self
            .conn
            .query_row(
                "SELECT MIN(second), MAX(second) FROM samples WHERE second >= 0",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sql_err(&self.path))?;
        let mut st = self
            .conn
            .prepare("SELECT DISTINCT cpu FROM samples WHERE cpu >= 0 ORDER BY cpu")
            .map_err(sql_err(&self.path))?;
        let cpus = st
            .query_map([], |r| r.get::<_, i64>(0))
            .map_err(sql_err(&self.path))?
            .collect::<std::result::Result<Vec<i64>, _>>()
            .map_err(sql_err(&self.path))?
            .into_iter()
            .map(|c| c as u32)
            .collect();
        Ok(Slicing {
            created_schema: created,
            time,
            cpu,
            seconds: first.zip(last).map(|(a, b)| (a as u32, b as u32)),
            cpus,
        })
    }

    /// (samples, period) totals per event index within a slice.
    pub fn totals_in(&self, view: View, slice: &Slice) -> Result<BTreeMap<u32, (u64, u64)>> {
        let sql = format!(
            "SELECT event, SUM(samples), SUM(period) FROM {} GROUP BY event",
            view.source_in(slice)
        );
        let mut st = self.conn.prepare(&sql).map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u32,
                    (r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64),
                ))
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// Sample counts grouped by `fields` for one event, largest first.
    /// `filter` restricts to rows whose field equals the value.
    pub fn grouped(
        &self,
        view: View,
        event: u32,
        fields: &[Field],
        filter: &[(Field, String)],
    ) -> Result<Vec<GroupRow>> {
        self.grouped_in(view, &Slice::default(), event, fields, filter)
    }

    /// [`Session::grouped`] within a slice.
    pub fn grouped_in(
        &self,
        view: View,
        slice: &Slice,
        event: u32,
        fields: &[Field],
        filter: &[(Field, String)],
    ) -> Result<Vec<GroupRow>> {
        let cols: Vec<&str> = fields.iter().map(|f| f.select_expr()).collect();
        let select = if cols.is_empty() {
            String::from("''")
        } else {
            cols.join(", ")
        };
        let group = if cols.is_empty() {
            String::new()
        } else {
            format!("GROUP BY {}", cols.join(", "))
        };
        let mut where_sql = String::from("WHERE event = ?1");
        for (i, (f, _)) in filter.iter().enumerate() {
            where_sql.push_str(&format!(" AND {} = ?{}", f.column(), i + 2));
        }
        let sql = format!(
            "SELECT {select}, SUM(samples) AS s, SUM(period) FROM {} {where_sql} {group} ORDER BY s DESC, {select}",
            view.source_in(slice)
        );
        let mut st = self.conn.prepare(&sql).map_err(sql_err(&self.path))?;
        let mut args: Vec<rusqlite::types::Value> = vec![i64::from(event).into()];
        args.extend(filter.iter().map(|(_, v)| v.clone().into()));
        let n = fields.len().max(1);
        let rows = st
            .query_map(rusqlite::params_from_iter(args), |r| {
                let mut values = Vec::with_capacity(fields.len());
                for i in 0..fields.len() {
                    values.push(r.get::<_, String>(i)?);
                }
                Ok(GroupRow {
                    values,
                    samples: r.get::<_, i64>(n)? as u64,
                    period: r.get::<_, i64>(n + 1)? as u64,
                })
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// Every stored row of one event (or all events), stacks as text.
    pub fn rows(&self, view: View, event: Option<u32>) -> Result<Vec<ProfileRow>> {
        self.rows_in(view, &Slice::default(), event)
    }

    /// [`Session::rows`] within a slice, most samples first; rows with
    /// equal counts by their key's text, so the order never depends on how
    /// the table is laid out (stack ids follow insertion order, so stacks
    /// compare by their frames).
    pub fn rows_in(
        &self,
        view: View,
        slice: &Slice,
        event: Option<u32>,
    ) -> Result<Vec<ProfileRow>> {
        let sql = format!(
            "SELECT s.event, s.domain, s.context, s.process, s.image, s.symbol, COALESCE(k.frames, ''),
               s.srcline, s.second, s.cpu, s.samples, s.period
             FROM {} s LEFT JOIN stacks k ON k.id = s.stack
             WHERE ?1 IS NULL OR s.event = ?1
             ORDER BY s.samples DESC, s.event, s.domain, s.context, s.process, s.image, s.symbol,
               COALESCE(k.frames, ''), s.srcline, s.second, s.cpu",
            view.source_in(slice)
        );
        let mut st = self.conn.prepare(&sql).map_err(sql_err(&self.path))?;
        let rows = st
            .query_map(params![event.map(i64::from)], |r| {
                let ctx: String = r.get(2)?;
                Ok(ProfileRow {
                    key: AggKey {
                        event: r.get::<_, i64>(0)? as u32,
                        domain: r.get::<_, String>(1)?.into(),
                        context: Context::parse(&ctx).unwrap_or(Context::HostUser),
                        process: r.get::<_, String>(3)?.into(),
                        image: r.get::<_, String>(4)?.into(),
                        symbol: r.get::<_, String>(5)?.into(),
                        stack: r.get::<_, String>(6)?.into(),
                        srcline: r.get::<_, String>(7)?.into(),
                        second: u32::try_from(r.get::<_, i64>(8)?).unwrap_or(UNKNOWN_SLICE),
                        cpu: u32::try_from(r.get::<_, i64>(9)?).unwrap_or(UNKNOWN_SLICE),
                    },
                    samples: r.get::<_, i64>(10)? as u64,
                    period: r.get::<_, i64>(11)? as u64,
                })
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// The distinct values of `field` among the view's rows (for a domain,
    /// also every domain the session lists), sorted: what a filter that
    /// matched nothing can offer instead.
    pub fn values(&self, view: View, field: Field) -> Result<Vec<String>> {
        let mut sql = format!(
            "SELECT DISTINCT {} FROM {}",
            field.column(),
            view.source_in(&Slice::default())
        );
        if field == Field::Domain {
            sql.push_str(" UNION SELECT name FROM domains");
        }
        let mut st = self.conn.prepare(&sql).map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(sql_err(&self.path))?;
        let mut v: Vec<String> = rows
            .collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))?;
        v.sort();
        v.dedup();
        Ok(v)
    }

    /// Scale rows of active VMs.
    pub fn scales(&self) -> Result<Vec<ScaleRow>> {
        let mut st = self
            .conn
            .prepare("SELECT domain, event, host_period, agent_period, agent_samples, agent_lost, factor FROM domain_scale ORDER BY domain, event")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| {
                Ok(ScaleRow {
                    domain: r.get(0)?,
                    event: r.get::<_, i64>(1)? as u32,
                    host_period: r.get::<_, i64>(2)? as u64,
                    agent_period: r.get::<_, i64>(3)? as u64,
                    agent_samples: r.get::<_, i64>(4)? as u64,
                    agent_lost: r.get::<_, i64>(5)? as u64,
                    factor: r.get(6)?,
                })
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// Build-ids (hex) by image path.
    pub fn build_ids(&self) -> Result<HashMap<String, String>> {
        let mut st = self
            .conn
            .prepare("SELECT path, build_id FROM images")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// Kinds of interval rows the session holds.
    pub fn interval_kinds(&self) -> Result<Vec<String>> {
        let mut st = self
            .conn
            .prepare("SELECT DISTINCT kind FROM intervals ORDER BY kind")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map([], |r| r.get(0))
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }

    /// Per-second sample counts: (second, domain, context, samples).
    pub fn bins(&self, event: u32) -> Result<Vec<(u32, String, String, u64)>> {
        let mut st = self
            .conn
            .prepare("SELECT second, domain, context, samples FROM bins WHERE event = ?1 ORDER BY second, domain, context")
            .map_err(sql_err(&self.path))?;
        let rows = st
            .query_map(params![i64::from(event)], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u32,
                    r.get(1)?,
                    r.get(2)?,
                    r.get::<_, i64>(3)? as u64,
                ))
            })
            .map_err(sql_err(&self.path))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sql_err(&self.path))
    }
}

#[cfg(test)]
mod tests;
