//! The crate's one error type. Every variant renders as one line that names
//! the input at fault (event, CPU, pid, path) and, where there is one, the fix.

use std::path::PathBuf;

/// Everything that can go wrong while collecting on Linux.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// The PMU does not know the event (ENOENT / EOPNOTSUPP / ENODEV).
    #[error("event '{event}' is not supported here (no hardware PMU or event unknown to it); events that work here: {working}")]
    UnsupportedEvent { event: String, working: String },

    /// EACCES / EPERM from perf_event_open.
    #[error("opening event '{event}' for {target} was refused ({errno}): it needs root or CAP_PERFMON (CAP_SYS_ADMIN on kernels < 5.8), or kernel.perf_event_paranoid <= -1 for -a / <= 2 for own processes; current kernel.perf_event_paranoid = {paranoid}")]
    PermissionDenied {
        event: String,
        target: String,
        errno: &'static str,
        paranoid: String,
    },

    /// ESRCH, or no /proc/PID.
    #[error("no such process: {0}")]
    NoSuchProcess(u32),

    /// EMFILE / ENFILE: one descriptor per event, CPU and thread.
    #[error("too many open files after {opened} perf_event descriptors (one per event, CPU and thread): raise the limit, e.g. `ulimit -n 65536`")]
    TooManyFiles { opened: usize },

    /// EINVAL with a frequency above the kernel's limit.
    #[error("sampling frequency {freq} Hz of event '{event}' is above kernel.perf_event_max_sample_rate = {max}; lower the sampling frequency or raise that sysctl")]
    FrequencyTooHigh { event: String, freq: u64, max: u64 },

    /// Any other perf_event_open failure.
    #[error("perf_event_open of event '{event}' for {target} on CPU {cpu} failed: {source}")]
    Open {
        event: String,
        target: String,
        cpu: u32,
        source: std::io::Error,
    },

    /// mmap of a ring failed.
    #[error("mmap of the {bytes}-byte perf ring of CPU {cpu} failed: {source} (non-root users are limited by kernel.perf_event_mlock_kb and `ulimit -l`)")]
    Mmap {
        cpu: u32,
        bytes: usize,
        source: std::io::Error,
    },

    /// An ioctl or poll on perf descriptors failed.
    #[error("{what} failed: {source}")]
    Sys {
        what: &'static str,
        source: std::io::Error,
    },

    /// Reading a /proc, /sys or tracefs file failed.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A /proc, /sys or tracefs file had unexpected content.
    #[error("cannot parse {}: {msg}", path.display())]
    Parse { path: PathBuf, msg: String },

    /// Options that cannot work.
    #[error("invalid record options: {0}")]
    Options(String),

    /// A tracepoint is missing or its format lacks a field.
    #[error("tracepoint '{name}': {msg}")]
    Tracepoint { name: String, msg: String },
}

impl LinuxError {
    /// True when a file vanished because its process, thread or device is
    /// gone (`ENOENT`, or `ESRCH` from a task that exited while being read):
    /// a normal event for readers of `/proc` and `/sys`, not a failure.
    pub fn is_vanished(&self) -> bool {
        match self {
            LinuxError::Read { source, .. } => crate::procfs::io_vanished(source),
            LinuxError::NoSuchProcess(_) => true,
            _ => false,
        }
    }
}
