//! The flight recorder (`serve --history DIR`, docs/architecture.md §9.3):
//! every interval of the host, as `top` shows it, kept on disk, and any
//! moment of it read back (`top --replay`, `report DIR --time`, serve's
//! page).
//!
//! This crate owns the history directory: its segment files (each a
//! session in the store's format with the history tables, one per
//! `--history-segment`, named `vmscope-history-<seq>-<start>.db`), the
//! lock that keeps a second recorder out, retention by size and age
//! (only files it can prove are its own segments are removed), pausing
//! on a full file system ([`recorder`]), and reading: which segments
//! cover which times, the documents and timeline of a range, a range
//! extracted into one session that every report reads ([`reader`]). What
//! an interval's document is (`top`'s frame) is the caller's: here it is
//! bytes, kept compressed. Times are wall-clock seconds since the epoch;
//! [`time`] parses and shows them.

pub mod frames;
pub mod reader;
pub mod recorder;
pub mod time;

pub use reader::{step_for, Extracted, FrameDoc, History, MOST_STEPS};
pub use recorder::{HistoryOptions, Interval, Recorder, RecorderState};

use std::path::{Path, PathBuf};

/// What went wrong with a history.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The directory cannot be used (the message names it and why).
    #[error("{0}")]
    Dir(String),
    /// Another recorder holds the directory.
    #[error("{dir}: already recorded by another vmscope serve ({holder}); stop it or give another directory")]
    Locked { dir: PathBuf, holder: String },
    /// A segment could not be written or read.
    #[error(transparent)]
    Store(#[from] vmscope_store::StoreError),
    /// Nothing recorded covers the times asked for.
    #[error("{0}")]
    Range(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl HistoryError {
    /// The file system is full: the recorder pauses rather than stops.
    pub fn is_disk_full(&self) -> bool {
        match self {
            HistoryError::Store(e) => e.is_disk_full(),
            HistoryError::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            _ => false,
        }
    }
}

/// The prefix and suffix of a segment's file name.
const PREFIX: &str = "vmscope-history-";
const SUFFIX: &str = ".db";
/// The lock file's name.
pub const LOCK_NAME: &str = "vmscope-history.lock";
/// The `source` every segment's meta says: what retention checks before it
/// removes a file it did not write in this process.
pub const SOURCE: &str = "serve --history";

/// A segment's sequence number from its file name, `None` for any other
/// file (those are never touched).
pub fn segment_seq(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let (seq, stamp) = rest.split_once('-')?;
    (seq.len() == 8
        && seq.bytes().all(|b| b.is_ascii_digit())
        && stamp.len() == 16
        && stamp.ends_with('Z'))
    .then(|| seq.parse().ok())
    .flatten()
}

/// The file name of segment `seq` started at `t`.
fn segment_name(seq: u64, t: f64) -> String {
    let s = time::rfc3339(t, true);
    // 2026-11-28T03:05:07.250Z -> 20261128T030507Z
    let stamp: String = s[..19]
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    format!("{PREFIX}{seq:08}-{stamp}Z{SUFFIX}")
}

/// The segments in `dir` by sequence number (only names of ours).
pub fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, HistoryError> {
    let rd = std::fs::read_dir(dir).map_err(|source| HistoryError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out: Vec<(u64, PathBuf)> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let seq = segment_seq(&name)?;
            e.file_type().ok()?.is_file().then(|| (seq, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Whether `dir` is a history: a directory holding its lock file (a
/// `serve --history` has started there) or at least one segment. Any
/// other directory is not one, and readers say so instead of reading it
/// as an empty history.
pub fn is_history(dir: &Path) -> bool {
    dir.is_dir() && (dir.join(LOCK_NAME).exists() || segments(dir).is_ok_and(|s| !s.is_empty()))
}

/// Bytes of a segment with its `-wal` and `-shm` companions.
pub fn segment_bytes(path: &Path) -> u64 {
    ["", "-wal", "-shm", "-reserve"]
        .iter()
        .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok())
        .map(|m| m.len())
        .sum()
}

/// Check that `dir` can hold a history: a directory (created when absent),
/// writable. Its other files are left as they are.
pub fn check_dir(dir: &Path) -> Result<(), HistoryError> {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(HistoryError::Dir(format!(
                "--history {shown}: is a file, not a directory; give a directory (it is created when absent)"
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| {
                HistoryError::Dir(format!("--history {shown}: cannot create it: {e}"))
            })?;
        }
        Err(e) => return Err(HistoryError::Dir(format!("--history {shown}: {e}"))),
    }
    let probe = dir.join(".vmscope-history-probe");
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(HistoryError::Dir(format!(
            "--history {shown}: cannot write in it: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_round_trip_and_others_are_not_ours() {
        let n = segment_name(42, 1_764_300_000.25);
        assert_eq!(segment_seq(&n), Some(42), "{n}");
        for other in [
            "vmscope-history.lock",
            "notes.txt",
            "vmscope-history-00000042-20261128T030507Z.db-wal",
            "vmscope-history-42-20261128T030507Z.db",
            "vmscope-history-0000004x-20261128T030507Z.db",
        ] {
            assert_eq!(segment_seq(other), None, "{other}");
        }
    }

    #[test]
    fn times_parse_in_every_form() {
        let now = 1_764_300_000.0; // 2025-11-28T03:20:00Z
        assert_eq!(time::parse("-15m", now, true).unwrap(), now - 900.0);
        assert_eq!(time::parse("03:05", now, true).unwrap(), now - 900.0);
        assert_eq!(
            time::parse("yesterday 03:05", now, true).unwrap(),
            now - 900.0 - 86400.0
        );
        // A clock time still to come is last night's.
        assert_eq!(
            time::parse("04:00", now, true).unwrap(),
            now + 2400.0 - 86400.0
        );
        assert_eq!(
            time::parse("2025-11-28T03:05:00Z", now, false).unwrap(),
            now - 900.0
        );
        assert_eq!(
            time::parse("2025-11-28T04:05:00+01:00", now, false).unwrap(),
            now - 900.0
        );
        assert_eq!(
            time::parse_range("03:05-03:15", now, true).unwrap(),
            (now - 900.0, now - 300.0)
        );
        assert_eq!(
            time::parse_range("-15m--5m", now, true).unwrap(),
            (now - 900.0, now - 300.0)
        );
        assert_eq!(
            time::parse_range("2025-11-28T03:05:00Z-2025-11-28T03:15:00Z", now, true).unwrap(),
            (now - 900.0, now - 300.0)
        );
        for bad in ["banana", "25:00", "3", "-15x", "yesterday"] {
            assert!(time::parse(bad, now, true).is_err(), "{bad}");
        }
        assert!(time::parse_range("03:15-03:05:00Z", now, true).is_err());
        assert_eq!(time::show(now, true), "2025-11-28 03:20:00Z");
        assert_eq!(time::rfc3339(now + 0.25, true), "2025-11-28T03:20:00.250Z");
    }
}
