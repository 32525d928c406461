//! The one error type of this crate. Every message is one line that starts
//! with the file's name and says what is wrong with it.

use std::io;

/// Why a perf.data file could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum PerfDataError {
    /// Opening, reading or seeking failed.
    #[error("{file}: I/O error: {source}")]
    Io {
        file: String,
        #[source]
        source: io::Error,
    },
    /// The file has no bytes at all.
    #[error("{file}: not a perf.data file (empty file)")]
    Empty { file: String },
    /// The first eight bytes are not a perf.data magic (text, ELF, …).
    #[error("{file}: not a perf.data file (bad magic)")]
    BadMagic { file: String },
    /// A perf.data format this crate does not read (version 1, …).
    #[error("{file}: unsupported perf.data format: {what}")]
    Unsupported { file: String, what: String },
    /// The file ends before a structure its header promises.
    #[error("{file}: truncated at byte {at} ({what})")]
    Truncated { file: String, at: u64, what: String },
    /// The structure of the file contradicts itself.
    #[error("{file}: corrupt perf.data: {what}")]
    Corrupt { file: String, what: String },
    /// `perf record` was killed (or crashed) before it wrote the file
    /// header's final sizes: the data size field is still 0.
    #[error("{file}: the perf record that wrote it did not finish properly (its header's data size is 0, so perf was killed or crashed before closing the file); record again and stop perf with Ctrl-C or SIGTERM, not SIGKILL")]
    Unfinished { file: String },
}

impl PerfDataError {
    /// The file name the error is about.
    pub fn file(&self) -> &str {
        match self {
            PerfDataError::Io { file, .. }
            | PerfDataError::Empty { file }
            | PerfDataError::BadMagic { file }
            | PerfDataError::Unsupported { file, .. }
            | PerfDataError::Truncated { file, .. }
            | PerfDataError::Corrupt { file, .. }
            | PerfDataError::Unfinished { file } => file,
        }
    }
}

/// Builds errors that all name the same file.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub file: String,
}

impl Ctx {
    pub fn io(&self, source: io::Error) -> PerfDataError {
        PerfDataError::Io {
            file: self.file.clone(),
            source,
        }
    }
    pub fn truncated(&self, at: u64, what: impl Into<String>) -> PerfDataError {
        PerfDataError::Truncated {
            file: self.file.clone(),
            at,
            what: what.into(),
        }
    }
    pub fn corrupt(&self, what: impl Into<String>) -> PerfDataError {
        PerfDataError::Corrupt {
            file: self.file.clone(),
            what: what.into(),
        }
    }
    pub fn unsupported(&self, what: impl Into<String>) -> PerfDataError {
        PerfDataError::Unsupported {
            file: self.file.clone(),
            what: what.into(),
        }
    }
}
