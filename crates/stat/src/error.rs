//! The one error type of this crate.

#[derive(Debug, thiserror::Error)]
pub enum StatError {
    #[error(transparent)]
    Discover(#[from] vmscope_discover::DiscoverError),
    #[error(transparent)]
    Linux(#[from] vmscope_linux::LinuxError),
    #[error(transparent)]
    Bpf(#[from] vmscope_bpf::BpfError),
    #[error(transparent)]
    Store(#[from] vmscope_store::StoreError),
    /// Writing output (a closed pipe arrives here as BrokenPipe).
    #[error("write: {0}")]
    Write(#[from] std::io::Error),
    #[error("{0}")]
    Options(String),
}

impl StatError {
    /// True when the file vanished (process or thread exited, device gone).
    pub fn is_vanished(&self) -> bool {
        matches!(self, StatError::Linux(e) if e.is_vanished())
    }
}
