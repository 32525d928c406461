//! The pipeline of docs/architecture.md §3: collect → normalize → attribute → symbolize →
//! aggregate → store.
//!
//! [`Converter`] is the single place where a [`Record`] stream becomes a
//! [`Profile`]; live recording ([`record`]) and perf.data import ([`import`])
//! both feed it, so tests on recorded files exercise the live code path.

#[cfg(feature = "host")]
pub mod agent;
mod convert;
#[cfg(feature = "host")]
pub mod cost;
#[cfg(feature = "host")]
pub mod coverage;
#[cfg(feature = "host")]
pub mod guest;
#[cfg(feature = "host")]
pub mod import;
#[cfg(feature = "host")]
pub mod live;
pub mod pipeline;
#[cfg(feature = "host")]
pub mod plan;
mod raw;
#[cfg(feature = "host")]
pub mod record;
mod sample_cache;
#[cfg(feature = "host")]
mod start;
#[cfg(feature = "host")]
pub mod symbolize;

pub use convert::{Converter, ConverterStats};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Linux(#[from] vmscope_linux::LinuxError),
    #[cfg(feature = "host")]
    #[error(transparent)]
    Store(#[from] vmscope_store::StoreError),
    #[cfg(feature = "host")]
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
    /// `--vm NAME=ROLE` names a VM that is not on this host.
    #[error("--vm {name}={role}: no VM named '{name}' on this host (found: {})", if found.is_empty() { "none".to_string() } else { found.join(", ") })]
    NoSuchVm {
        name: String,
        role: &'static str,
        found: Vec<String>,
    },
    /// A VM that had to be active (`--vm NAME=active`, `--strict`) cannot be.
    #[error("VM {vm} cannot be profiled as active: {why}")]
    NotActive { vm: String, why: String },
}
