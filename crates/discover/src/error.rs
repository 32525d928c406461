//! The one error type of VM discovery. Every message names the path or the
//! QMP socket it is about.

use std::path::PathBuf;
use std::time::Duration;

/// Why discovery (or a QMP exchange) failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// The proc root itself cannot be listed: nothing can be discovered.
    #[error("cannot list processes: {0}")]
    ProcRoot(#[source] vmscope_linux::LinuxError),
    /// Connecting to a QMP socket failed.
    #[error("cannot connect to QMP socket {socket}: {source}")]
    QmpConnect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// QEMU did not answer in time (another client, such as libvirtd, may hold
    /// the monitor: QEMU serves one client per monitor socket).
    #[error("QMP socket {socket}: no answer to {what} within {timeout:?} (is another client, e.g. libvirtd, connected?)")]
    QmpTimeout {
        socket: PathBuf,
        what: String,
        timeout: Duration,
    },
    /// Reading or writing the QMP socket failed.
    #[error("QMP socket {socket}: {source}")]
    QmpIo {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// QEMU sent something that is not QMP (bad JSON, no greeting, closed).
    #[error("QMP socket {socket}: {message}")]
    QmpProtocol { socket: PathBuf, message: String },
    /// QEMU answered a command with an error object.
    #[error("QMP socket {socket}: {command} failed: {class}: {desc}")]
    QmpCommand {
        socket: PathBuf,
        command: String,
        class: String,
        desc: String,
    },
    /// libvirt (an optional source) cannot be asked: not installed, not
    /// running, refusing the connection, or not answering in time.
    #[error("libvirt ({uri}): {message}")]
    Libvirt { uri: String, message: String },
}
