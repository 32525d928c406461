//! The session store (docs/architecture.md §7): one SQLite file (WAL) per session.
//!
//! This crate owns the schema and its version (`schema`), the
//! [`SessionWriter`] that recorders and importers use (`writer`: deltas
//! added up in one transaction per flush, at least once a second), the
//! [`Session`] reader that reports use (`reader`, which validates a session
//! once when it opens it, `validate`; what its queries read, [`View`],
//! [`Slice`] and [`Field`], is `view`), symbols left for the first read
//! (`deferred`), interval rows (`intervals`), the tables of a history
//! segment (`history`: each interval's `top` document and timeline), and [`output`]: how every
//! command writes a file (checked paths, one writer per session, atomic
//! replacement; docs/architecture.md §7.1). `sql` runs statements with
//! errors that name the file. This file keeps the error type and the rows
//! both sides share. It knows nothing of perf, /proc or printing. The
//! `sqlite3` CLI reads the files:
//! `sqlite3 vmscope.db 'select * from samples order by samples desc limit 5'`.

mod blocks;
mod deferred;
pub mod deflate;
mod history;
mod intervals;
pub mod output;
mod reader;
mod schema;
mod sql;
mod validate;
mod view;
mod writer;

pub use blocks::{rollup_second, BlockSums, ROLLUP_META, ROLLUP_SECONDS};
pub use deferred::{snapshot, PendingSymbols, SYMBOLS_DEFERRED};
pub use history::{ScaleSecond, StoredFrame, TimelineRow};
pub use intervals::IntervalRow;
pub use reader::{GroupRow, HeldResults, Session, Slicing};
pub use schema::SCHEMA_VERSION;
pub use view::{Field, Slice, View};
pub use writer::SessionWriter;

pub(crate) use reader::open_read_only;
pub(crate) use writer::RESERVE_SUFFIX;

use std::path::PathBuf;
use vmscope_model::Domain;

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

#[cfg(test)]
mod tests;
