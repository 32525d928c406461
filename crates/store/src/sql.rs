//! How this crate runs SQL on a session file: rusqlite's errors become
//! [`StoreError`]s naming the file (a full file system as
//! [`StoreError::DiskFull`]), through [`Sql`] for one statement at a time
//! or [`sql_err`] where a caller holds a statement itself.

use crate::{output, Result, StoreError};
use rusqlite::{Connection, OptionalExtension, Params, Row};
use std::path::Path;

/// rusqlite's error as this crate's, naming the session at `path`.
pub(crate) fn sql_err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
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

/// A connection and the session file it is open on. Each method runs one
/// statement (prepared anew, not cached) and returns its error as a
/// [`StoreError`] naming the file.
#[derive(Clone, Copy)]
pub(crate) struct Sql<'a> {
    conn: &'a Connection,
    path: &'a Path,
}

impl<'a> Sql<'a> {
    pub(crate) fn new(conn: &'a Connection, path: &'a Path) -> Sql<'a> {
        Sql { conn, path }
    }

    /// Run a statement that returns no rows; how many rows it changed.
    pub(crate) fn execute(self, sql: &str, params: impl Params) -> Result<usize> {
        self.check(self.conn.execute(sql, params))
    }

    /// Run statements without parameters, separated by `;`.
    pub(crate) fn execute_batch(self, sql: &str) -> Result<()> {
        self.check(self.conn.execute_batch(sql))
    }

    /// The first row, read by `f` (no row is an error).
    pub(crate) fn row<T>(
        self,
        sql: &str,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<T> {
        self.check(self.conn.query_row(sql, params, f))
    }

    /// The first row read by `f`, `None` when there is none.
    pub(crate) fn optional_row<T>(
        self,
        sql: &str,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<T>> {
        self.check(self.conn.query_row(sql, params, f).optional())
    }

    /// Every row, each read by `f`, collected (into a `Vec`, a map, …).
    pub(crate) fn rows<T, C: FromIterator<T>>(
        self,
        sql: &str,
        params: impl Params,
        f: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<C> {
        self.check(
            self.conn
                .prepare(sql)
                .and_then(|mut st| st.query_map(params, f)?.collect()),
        )
    }

    /// `r`, the result of a statement the caller runs itself (a cached
    /// one, or one it steps through), with its error naming the file.
    pub(crate) fn check<T>(self, r: rusqlite::Result<T>) -> Result<T> {
        r.map_err(sql_err(self.path))
    }
}
