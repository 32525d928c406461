//! The pipeline of DESIGN §3: collect → normalize → attribute → symbolize →
//! aggregate → store.
//!
//! [`Converter`] is the single place where a [`Record`] stream becomes a
//! [`Profile`]; live recording ([`record`]) and perf.data import ([`import`])
//! both feed it, so tests on recorded files exercise the live code path.

mod convert;
#[cfg(feature = "store")]
pub mod guest;
#[cfg(feature = "store")]
pub mod import;
#[cfg(feature = "store")]
pub mod record;

pub use convert::{Converter, ConverterStats};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Linux(#[from] vmscope_linux::LinuxError),
    #[cfg(feature = "store")]
    #[error(transparent)]
    Store(#[from] vmscope_store::StoreError),
    #[cfg(feature = "store")]
    #[error(transparent)]
    PerfData(#[from] vmscope_perfdata::PerfDataError),
    #[error(transparent)]
    Symbols(#[from] vmscope_symbols::SymbolError),
    #[error("cannot start '{command}': {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("no such process: {0}")]
    NoSuchProcess(u32),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}
