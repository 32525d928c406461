//! The one error type of the protocol crate: decoding, limits, transport I/O,
//! timeouts and errors reported by the agent itself.

use crate::message::ErrorKind;

/// Everything that can go wrong while encoding, decoding or talking to an agent.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Nothing usable arrived before the deadline.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was awaited (e.g. "agent hello").
        what: String,
    },
    /// The underlying stream failed or was closed.
    #[error("i/o error on the agent channel: {0}")]
    Io(#[from] std::io::Error),
    /// A frame arrived intact (checksums good) but its body is not a protocol
    /// message: not JSON, not an object, no `id`/`v`/`type`, unknown encoding.
    #[error("malformed frame: {reason}")]
    Malformed {
        /// Human-readable cause.
        reason: String,
    },
    /// A well-formed envelope of a known type whose fields are missing, of the
    /// wrong type, or outside the protocol's limits. `id` lets a server answer it.
    #[error("invalid {type_name} message (id {id}): {reason}")]
    BadMessage {
        /// The envelope id of the offending message.
        id: u64,
        /// The message type as sent.
        type_name: String,
        /// Which field or limit failed.
        reason: String,
    },
    /// A declared frame length, or a message being encoded, exceeds the limit.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Declared or attempted length in bytes.
        len: u64,
        /// The limit in bytes.
        max: u64,
    },
    /// The agent answered with an error response.
    #[error("agent refused ({kind}): {message}")]
    Remote {
        /// Machine-readable category.
        kind: ErrorKind,
        /// The agent's explanation.
        message: String,
    },
    /// The agent speaks a protocol version this host cannot use.
    #[error("agent speaks protocol version {agent}, this host supports {min}..={host}")]
    VersionMismatch {
        /// The version in the agent's hello.
        agent: u32,
        /// Oldest version this host accepts.
        min: u32,
        /// This host's version.
        host: u32,
    },
}

impl ProtocolError {
    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        ProtocolError::Malformed {
            reason: reason.into(),
        }
    }
}
