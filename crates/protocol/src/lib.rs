//! The vmscope host <-> guest agent protocol.
//!
//! Frames (`frame`) carry JSON messages (`message`) between the host, which
//! always initiates, and the agent inside a VM, which only answers. The crate
//! does no OS I/O of its own: the host-side [`AgentClient`] runs over any
//! [`Transport`] (a Unix socket to QEMU's virtio-serial chardev in the lab, a
//! vsock stream elsewhere). The full specification is docs/protocol.md.
//!
//! Every byte a guest sends is hostile input: frames are bounded by
//! [`MAX_FRAME`], every field by the limits in [`message`], and the decoder
//! neither panics nor reserves memory from a declared length ([`fuzz_decode`]
//! exercises it on arbitrary input).

pub mod b64;
mod client;
mod error;
pub mod frame;
mod fuzz;
pub mod message;

pub use client::{
    random_u64, AgentClient, ExecOutput, ProfileConfig, ProfileDelta, ProfileReadyInfo, Transport,
    EXEC_GRACE, HELLO_RETRY,
};
pub use error::ProtocolError;

/// Name of the virtio-serial port the agent serves (QEMU's
/// `virtserialport,name=...`, libvirt's `<target type='virtio' name=...>`,
/// the guest's `/sys/class/virtio-ports/*/name`).
pub const AGENT_PORT: &str = "vmscope.agent";
pub use frame::{crc32, encode_frame, FrameDecoder, RawFrame, HEADER_LEN, MAGIC, MAX_FRAME};
pub use fuzz::fuzz_decode;
pub use message::{
    capability, encode_request, encode_request_on, encode_response, encode_response_on,
    row_context, AgentHello, Decoder, DeltaCost, Envelope, ErrorKind, Message, ProfileRow, Request,
    Response, DEFAULT_PROFILE_EVENT, DEFAULT_PROFILE_FREQUENCY, KALLSYMS_CHUNK, MAX_ARGV,
    MAX_ARGV_BYTES, MAX_CAPABILITIES, MAX_ERROR_MESSAGE, MAX_EVENT_NAME, MAX_EXEC_OUTPUT,
    MAX_EXEC_OUTPUT_LIMIT, MAX_EXEC_STDIN, MAX_EXEC_TIMEOUT_MS, MAX_IMAGE, MAX_KALLSYMS_CHUNK,
    MAX_KALLSYMS_TOTAL, MAX_MODULES, MAX_MODULE_NAME, MAX_PROCESS_NAME, MAX_PROFILE_EVENTS,
    MAX_PROFILE_FREQUENCY, MAX_PROFILE_ROWS, MAX_PUT_CHUNK, MAX_ROW_CPU, MAX_STACK, MAX_STREAMS,
    MAX_STRING, MAX_SYMBOL, MAX_TYPE_NAME, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, PUT_CHUNK,
};
