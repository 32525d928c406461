//! The one error type of this crate.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StatError {
    /// A file under the proc or sys root could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its content was not what the kernel writes.
    #[error("cannot parse {path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error(transparent)]
    Discover(#[from] vmscope_discover::DiscoverError),
    #[error(transparent)]
    Linux(#[from] vmscope_linux::LinuxError),
    /// Writing output (a closed pipe arrives here as BrokenPipe).
    #[error("write: {0}")]
    Write(#[from] std::io::Error),
    #[error("{0}")]
    Options(String),
}

impl StatError {
    /// True when the file vanished (process or thread exited, device gone).
    pub fn is_vanished(&self) -> bool {
        matches!(self, StatError::Read { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)))
    }
}
