//! The [`Session`] reader that reports use: opens a session file (checked
//! once, [`crate::validate`]; older schemas migrated, newer refused; a
//! file it may not write read as it is) and answers queries of its
//! metadata, domains and rows in a [`View`] and [`Slice`]. Read-only
//! connections for other readers ([`open_read_only`]) are made here too.

use crate::sql::{sql_err, Sql};
use crate::view::{Field, Slice, View};
use crate::{
    output, schema, validate, BenchSampleRow, DomainRecord, Result, ScaleRow, StoreError,
    SCHEMA_VERSION, SYMBOLS_DEFERRED,
};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vmscope_model::{AggKey, Context, Domain, ProfileRow, Role, SessionEvent, UNKNOWN_SLICE};

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

/// `file:/abs/path?immutable=1`, the path percent-encoded as SQLite's URI
/// syntax wants.
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
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    /// Its blocks of rows (crate::blocks) are in temporary row tables.
    pub(crate) expanded: bool,
    /// Answers kept while results are held ([`Session::hold_results`]):
    /// by the statement's text and arguments.
    pub(crate) held: RefCell<Option<HashMap<String, Held>>>,
}

/// An answer [`Session::hold_results`] keeps.
#[derive(Debug, Clone)]
pub(crate) enum Held {
    Totals(BTreeMap<u32, (u64, u64)>),
    Groups(Vec<GroupRow>),
}

/// While alive, the session answers a repeated totals or grouping query
/// from what it answered before ([`Session::hold_results`]).
pub struct HeldResults<'a>(&'a Session);

impl Drop for HeldResults<'_> {
    fn drop(&mut self) {
        *self.0.held.borrow_mut() = None;
    }
}

impl Session {
    /// Open a session to read: every row of it is in the row tables
    /// (blocks of rows, as history segments keep them, copied into
    /// temporary ones).
    pub fn open(path: &Path) -> Result<Session> {
        let mut s = Session::open_compact(path)?;
        if crate::blocks::has_blocks(&s.conn).map_err(sql_err(path))? {
            crate::blocks::expand(&s.conn, path)?;
            s.expanded = true;
        }
        Ok(s)
    }

    /// [`Session::open`] leaving blocks of rows where they are: for a
    /// reader of their seconds ([`Session::block_rows`]) or of none.
    pub fn open_compact(path: &Path) -> Result<Session> {
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
            expanded: false,
            held: RefCell::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keep at most `kib` KiB of the file's pages cached (SQLite's default
    /// is 2 MiB a connection): for a reader holding many files open, each
    /// read once in order (a history's segments: 49 for a day, whose
    /// caches were half of the 200 MiB a day's report may take).
    pub fn limit_cache(&self, kib: u32) -> Result<()> {
        self.conn
            .pragma_update(None, "cache_size", -i64::from(kib))
            .map_err(sql_err(&self.path))
    }

    /// Statements on the session, their errors naming its file.
    pub(crate) fn sql(&self) -> Sql<'_> {
        Sql::new(&self.conn, &self.path)
    }

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
        let n: i64 = self
            .sql()
            .row("SELECT coalesce(sum(samples), 0) FROM bins", [], |r| {
                r.get(0)
            })?;
        Ok(n.max(0) as u64)
    }

    /// Whether the session's recording left frames for the first read to
    /// resolve ([`crate::PendingSymbols`]): until they are, its image,
    /// symbol and stack texts carry tokens instead of names.
    pub fn symbols_pending(&self) -> Result<bool> {
        let v: Option<String> =
            self.sql()
                .optional_row("SELECT value FROM meta WHERE key = 'symbols'", [], |r| {
                    r.get(0)
                })?;
        Ok(v.as_deref() == Some(SYMBOLS_DEFERRED))
    }

    /// Every `bench_samples` row, in insertion order.
    pub fn bench_samples(&self) -> Result<Vec<BenchSampleRow>> {
        self.sql().rows(
            "SELECT experiment, config_hash, manifest, point, sample, metric, value, unit,
               raw_output, flagged FROM bench_samples ORDER BY rowid",
            [],
            |r| {
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
            },
        )
    }

    /// Adds or replaces a metadata key of a finished session (a benchmark
    /// names the point it recorded this session for). Fails on a session
    /// opened read-only.
    pub fn annotate(&self, key: &str, value: &str) -> Result<()> {
        self.sql().execute(
            "INSERT INTO meta(key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }

    pub fn meta(&self) -> Result<BTreeMap<String, String>> {
        self.sql().rows("SELECT key, value FROM meta", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    }

    pub fn events(&self) -> Result<Vec<SessionEvent>> {
        self.sql().rows(
            "SELECT name, period, frequency FROM events ORDER BY id",
            [],
            |r| {
                Ok(SessionEvent {
                    name: r.get(0)?,
                    period: r.get::<_, Option<i64>>(1)?.map(|v| v as u64),
                    frequency: r.get::<_, Option<i64>>(2)?.map(|v| v as u64),
                })
            },
        )
    }

    pub fn domains(&self) -> Result<Vec<DomainRecord>> {
        self.sql().rows(
            "SELECT name, role, pid, status, ended_at, detail FROM domains ORDER BY name = 'host' DESC, name",
            [],
            |r| {
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
            },
        )
    }

    /// Lost records per event index.
    pub fn lost(&self) -> Result<BTreeMap<u32, u64>> {
        self.sql().rows("SELECT event, count FROM lost", [], |r| {
            Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u64))
        })
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
        let q = |sql: &str| -> Result<bool> { self.sql().row(sql, [], |r| r.get::<_, bool>(0)) };
        let time = created >= 3 && !q("SELECT EXISTS(SELECT 1 FROM samples WHERE second < 0)")?;
        let cpu = created >= 3 && !q("SELECT EXISTS(SELECT 1 FROM samples WHERE cpu < 0)")?;
        let (first, last): (Option<i64>, Option<i64>) = self.sql().row(
            "SELECT MIN(second), MAX(second) FROM samples WHERE second >= 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let cpus = self.sql().rows(
            "SELECT DISTINCT cpu FROM samples WHERE cpu >= 0 ORDER BY cpu",
            [],
            |r| Ok(r.get::<_, i64>(0)? as u32),
        )?;
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
        if let Some(Held::Totals(t)) = self.held_answer(&sql) {
            return Ok(t);
        }
        let totals: BTreeMap<u32, (u64, u64)> = self.sql().rows(&sql, [], |r| {
            Ok((
                r.get::<_, i64>(0)? as u32,
                (r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64),
            ))
        })?;
        self.hold_answer(sql, || Held::Totals(totals.clone()));
        Ok(totals)
    }

    /// Answer repeated totals and grouping queries from the first answer
    /// until the returned guard is dropped: a page built of several
    /// reports of one session (`report --format html`: five groupings,
    /// each with the totals) then scans its rows once per distinct
    /// query, not once per report, and shows one state of a session that
    /// is still being written.
    pub fn hold_results(&self) -> HeldResults<'_> {
        self.held.borrow_mut().get_or_insert_with(HashMap::new);
        HeldResults(self)
    }

    fn held_answer(&self, key: &str) -> Option<Held> {
        self.held.borrow().as_ref()?.get(key).cloned()
    }

    fn hold_answer(&self, key: String, answer: impl FnOnce() -> Held) {
        if let Some(m) = self.held.borrow_mut().as_mut() {
            m.insert(key, answer());
        }
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
        let mut args: Vec<rusqlite::types::Value> = vec![i64::from(event).into()];
        args.extend(filter.iter().map(|(_, v)| v.clone().into()));
        let key = format!("{sql}\n{args:?}");
        if let Some(Held::Groups(g)) = self.held_answer(&key) {
            return Ok(g);
        }
        let n = fields.len().max(1);
        let groups: Vec<GroupRow> =
            self.sql()
                .rows(&sql, rusqlite::params_from_iter(args), |r| {
                    let mut values = Vec::with_capacity(fields.len());
                    for i in 0..fields.len() {
                        values.push(r.get::<_, String>(i)?);
                    }
                    Ok(GroupRow {
                        values,
                        samples: r.get::<_, i64>(n)? as u64,
                        period: r.get::<_, i64>(n + 1)? as u64,
                    })
                })?;
        self.hold_answer(key, || Held::Groups(groups.clone()));
        Ok(groups)
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
        // Sorted here rather than by an ORDER BY: SQLite's sorter copied
        // and compared every row's stack text (a 75 k-row session of deep
        // stacks spent a third of its flame graph's time in this query),
        // where most rows differ in their samples already. The names a
        // row repeats (domain, process, image, symbol, srcline) are
        // shared: one allocation per distinct value, not per row.
        let sql = format!(
            "SELECT s.event, s.domain, s.context, s.process, s.image, s.symbol, COALESCE(k.frames, ''),
               s.srcline, s.second, s.cpu, s.samples, s.period
             FROM {} s LEFT JOIN stacks k ON k.id = s.stack
             WHERE ?1 IS NULL OR s.event = ?1",
            view.source_in(slice)
        );
        let mut names: HashMap<String, Arc<str>> = HashMap::new();
        let mut name = |r: &rusqlite::Row<'_>, i: usize| -> rusqlite::Result<Arc<str>> {
            let v = r.get_ref(i)?;
            let text = v.as_str().map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(i, v.data_type(), e.into())
            })?;
            if let Some(a) = names.get(text) {
                return Ok(a.clone());
            }
            let a: Arc<str> = Arc::from(text);
            names.insert(text.to_string(), a.clone());
            Ok(a)
        };
        let mut rows: Vec<ProfileRow> =
            self.sql().rows(&sql, params![event.map(i64::from)], |r| {
                let ctx = r.get_ref(2)?;
                let ctx = ctx.as_str().map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(2, ctx.data_type(), e.into())
                })?;
                Ok(ProfileRow {
                    key: AggKey {
                        event: r.get::<_, i64>(0)? as u32,
                        domain: name(r, 1)?,
                        context: Context::parse(ctx).unwrap_or(Context::HostUser),
                        process: name(r, 3)?,
                        image: name(r, 4)?,
                        symbol: name(r, 5)?,
                        stack: r.get::<_, String>(6)?.into(),
                        srcline: name(r, 7)?,
                        second: u32::try_from(r.get::<_, i64>(8)?).unwrap_or(UNKNOWN_SLICE),
                        cpu: u32::try_from(r.get::<_, i64>(9)?).unwrap_or(UNKNOWN_SLICE),
                    },
                    samples: r.get::<_, i64>(10)? as u64,
                    period: r.get::<_, i64>(11)? as u64,
                })
            })?;
        // The order the query had: samples descending, then every column
        // of the key as stored (texts byte by byte, as SQLite's BINARY;
        // an unknown second or CPU as -1).
        let stored = |v: u32| if v == UNKNOWN_SLICE { -1 } else { i64::from(v) };
        rows.sort_unstable_by(|a, b| {
            let (x, y) = (&a.key, &b.key);
            b.samples
                .cmp(&a.samples)
                .then(x.event.cmp(&y.event))
                .then_with(|| x.domain.cmp(&y.domain))
                .then_with(|| x.context.as_str().cmp(y.context.as_str()))
                .then_with(|| x.process.cmp(&y.process))
                .then_with(|| x.image.cmp(&y.image))
                .then_with(|| x.symbol.cmp(&y.symbol))
                .then_with(|| x.stack.cmp(&y.stack))
                .then_with(|| x.srcline.cmp(&y.srcline))
                .then(stored(x.second).cmp(&stored(y.second)))
                .then(stored(x.cpu).cmp(&stored(y.cpu)))
        });
        Ok(rows)
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
        let mut v: Vec<String> = self.sql().rows(&sql, [], |r| r.get(0))?;
        v.sort();
        v.dedup();
        Ok(v)
    }

    /// Scale rows of active VMs.
    pub fn scales(&self) -> Result<Vec<ScaleRow>> {
        self.sql().rows(
            "SELECT domain, event, host_period, agent_period, agent_samples, agent_lost, factor FROM domain_scale ORDER BY domain, event",
            [],
            |r| {
                Ok(ScaleRow {
                    domain: r.get(0)?,
                    event: r.get::<_, i64>(1)? as u32,
                    host_period: r.get::<_, i64>(2)? as u64,
                    agent_period: r.get::<_, i64>(3)? as u64,
                    agent_samples: r.get::<_, i64>(4)? as u64,
                    agent_lost: r.get::<_, i64>(5)? as u64,
                    factor: r.get(6)?,
                })
            },
        )
    }

    /// Build-ids (hex) by image path.
    pub fn build_ids(&self) -> Result<HashMap<String, String>> {
        self.sql()
            .rows("SELECT path, build_id FROM images", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
    }

    /// Kinds of interval rows the session holds.
    pub fn interval_kinds(&self) -> Result<Vec<String>> {
        self.sql().rows(
            "SELECT DISTINCT kind FROM intervals ORDER BY kind",
            [],
            |r| r.get(0),
        )
    }

    /// Per-second sample counts: (second, domain, context, samples).
    pub fn bins(&self, event: u32) -> Result<Vec<(u32, String, String, u64)>> {
        let stored = self.sql().rows(
            "SELECT second, domain, context, samples FROM bins WHERE event = ?1 ORDER BY second, domain, context",
            params![i64::from(event)],
            |r| {
                Ok((
                    r.get::<_, i64>(0)? as u32,
                    r.get(1)?,
                    r.get(2)?,
                    r.get::<_, i64>(3)? as u64,
                ))
            },
        )?;
        if self.expanded {
            return Ok(stored);
        }
        // A history segment opened compact: its blocks' bins too.
        let blocks = crate::blocks::block_bins(&self.conn, &self.path, Some(event))?;
        if blocks.is_empty() {
            return Ok(stored);
        }
        let mut sum: std::collections::BTreeMap<(u32, String, String), u64> =
            std::collections::BTreeMap::new();
        for (sec, dom, ctx, n) in stored {
            *sum.entry((sec, dom, ctx)).or_default() += n;
        }
        for (sec, _, dom, ctx, n) in blocks {
            *sum.entry((sec, dom.to_string(), ctx.to_string()))
                .or_default() += n;
        }
        Ok(sum.into_iter().map(|((s, d, c), n)| (s, d, c, n)).collect())
    }
}
