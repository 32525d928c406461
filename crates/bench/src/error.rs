//! The crate's one error type.

use std::path::PathBuf;

/// Errors of the benchmarks. [`BenchError::BadInput`] is raised before any
/// I/O; the binary prints every error as one line and exits with code 2.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An option or target the benchmark cannot use, found before any I/O.
    #[error("{0}")]
    BadInput(String),
    /// A lab could not be brought up, found or torn down (or a stop signal
    /// interrupted the run). Not transparent: the lab error stays in the
    /// source chain, where the binary finds an interruption's signal.
    #[error("{0}")]
    Lab(#[from] vmscope_lab::LabError),
    /// A VM did not answer or its command failed.
    #[error("VM {vm}: {message}")]
    Vm { vm: String, message: String },
    /// The I/O engine failed on the host.
    #[error(transparent)]
    Engine(#[from] vmscope_workload::io::IoError),
    /// Writing output (results, charts) failed.
    #[error("{what} {}: {message}", path.display())]
    Output {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    /// Writing to stdout failed (a closed pipe among others).
    #[error(transparent)]
    Write(#[from] std::io::Error),
    /// The session store refused the rows.
    #[error(transparent)]
    Store(#[from] vmscope_store::StoreError),
    /// The host could not be sampled.
    #[error(transparent)]
    Stat(#[from] vmscope_stat::StatError),
}

impl BenchError {
    pub fn bad(msg: impl Into<String>) -> BenchError {
        BenchError::BadInput(msg.into())
    }
}
