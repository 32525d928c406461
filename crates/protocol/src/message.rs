//! Messages: the request and response types, their JSON envelope
//! (`{"v":1,"id":N,"type":"...",...}`), the limits every field is checked
//! against, and the typed decoder on top of the frame cutter.
//!
//! Forward compatibility: a message whose `type` is not known decodes to the
//! `Unknown` variant (the agent answers it with an `unsupported` error);
//! unknown fields are ignored; fields added later carry serde defaults.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::b64;
use crate::error::ProtocolError;
use crate::frame::{encode_frame, FrameDecoder, ENCODING_JSON};

/// Version of the message set this crate speaks. Raised when messages or
/// fields are added; older peers keep working (see docs/protocol.md).
pub const PROTOCOL_VERSION: u32 = 3;
/// Oldest peer version this crate can talk to.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// Longest short string (host/agent version, kernel, hostname, path, capability), in bytes.
pub const MAX_STRING: usize = 4096;
/// Longest `type` name kept from an unknown message, in bytes (longer names are cut).
pub const MAX_TYPE_NAME: usize = 64;
/// Longest error message, in bytes.
pub const MAX_ERROR_MESSAGE: usize = 64 * 1024;
/// Most arguments in an exec argv.
pub const MAX_ARGV: usize = 1024;
/// Most bytes in all exec arguments together.
pub const MAX_ARGV_BYTES: usize = 256 * 1024;
/// Most bytes of stdin an exec request may carry.
pub const MAX_EXEC_STDIN: usize = 4 << 20;
/// Most bytes of stdout, and separately of stderr, an exec result carries
/// by default.
pub const MAX_EXEC_OUTPUT: usize = 4 << 20;
/// Most bytes of stdout, and separately of stderr, an exec may ask for with
/// `max_output` (protocol 3): both streams base64-encoded must fit in one
/// frame ([`crate::MAX_FRAME`]).
pub const MAX_EXEC_OUTPUT_LIMIT: usize = 6 << 20;
/// Most streams an agent keeps state for at once (protocol 3).
pub const MAX_STREAMS: u32 = 1024;
/// Longest exec timeout, in milliseconds (one day).
pub const MAX_EXEC_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// Largest PutFile chunk, in bytes.
pub const MAX_PUT_CHUNK: usize = 1 << 20;
/// Chunk size the host client uses for PutFile.
pub const PUT_CHUNK: usize = 256 * 1024;
/// Most capability strings in a hello.
pub const MAX_CAPABILITIES: usize = 64;
/// Most events in a profiling session.
pub const MAX_PROFILE_EVENTS: usize = 16;
/// Longest event name (`cpu-clock`, `cycles:100000`, `r01c2`), in bytes.
pub const MAX_EVENT_NAME: usize = 64;
/// Highest sampling frequency a `profile_start` may ask for, in Hz.
pub const MAX_PROFILE_FREQUENCY: u64 = 100_000;
/// Default sampling frequency of `profile_start`, in Hz.
pub const DEFAULT_PROFILE_FREQUENCY: u64 = 1000;
/// Default event of `profile_start`.
pub const DEFAULT_PROFILE_EVENT: &str = "cpu-clock";
/// Most rows in one `profile_data` message; more wait for the next poll.
pub const MAX_PROFILE_ROWS: usize = 50_000;
/// Longest process (thread) name in a profile row, in bytes.
pub const MAX_PROCESS_NAME: usize = 256;
/// Longest image path in a profile row, in bytes.
pub const MAX_IMAGE: usize = MAX_STRING;
/// Longest symbol in a profile row, in bytes.
pub const MAX_SYMBOL: usize = MAX_STRING;
/// Highest guest CPU number a profile row may carry, plus one (QEMU's
/// largest vCPU count is 4096).
pub const MAX_ROW_CPU: u32 = 16_384;
/// Longest collapsed call stack in a profile row, in bytes.
pub const MAX_STACK: usize = 64 * 1024;
/// Largest slice of kallsyms text in one `kallsyms` message, in bytes.
pub const MAX_KALLSYMS_CHUNK: usize = 8 << 20;
/// Slice of kallsyms text the agent sends per message, in bytes.
pub const KALLSYMS_CHUNK: usize = 4 << 20;
/// Largest kallsyms text in total, in bytes.
pub const MAX_KALLSYMS_TOTAL: u64 = 64 << 20;
/// Most module names in a `kallsyms` message.
pub const MAX_MODULES: usize = 8192;
/// Longest module name, in bytes (the kernel's own limit is 56).
pub const MAX_MODULE_NAME: usize = 256;

/// Contexts a profile row may carry: where in the guest the sample was.
pub mod row_context {
    /// User code in the guest.
    pub const GUEST_USER: &str = "guest-user";
    /// Kernel code in the guest (the idle loop included).
    pub const GUEST_KERNEL: &str = "guest-kernel";
    /// Every accepted value.
    pub const ALL: [&str; 2] = [GUEST_USER, GUEST_KERNEL];
}

/// Capability names an agent may list in its hello.
pub mod capability {
    /// Answers `ping`.
    pub const PING: &str = "ping";
    /// Runs `exec` (only with `--allow-exec`).
    pub const EXEC: &str = "exec";
    /// Accepts `put_file` (with `--allow-exec` or `--allow-write`).
    pub const PUT_FILE: &str = "put_file";
    /// Samples inside the guest: `profile_start`, `profile_poll`, `profile_stop` (protocol 2).
    pub const PROFILE: &str = "profile";
    /// Sends the guest's kernel symbols and modules: `get_kallsyms` (protocol 2).
    pub const KALLSYMS: &str = "kallsyms";
    /// Keeps per-stream state (profiling sessions, file transfers, kallsyms
    /// snapshots), so several host clients share one channel through a
    /// broker, and answers `close_stream` (protocol 3).
    pub const STREAMS: &str = "streams";
    /// The hello came from the host's broker, which relays for the agent
    /// (protocol 3).
    pub const BROKER: &str = "broker";
}

fn default_profile_events() -> Vec<String> {
    vec![DEFAULT_PROFILE_EVENT.to_string()]
}

fn default_profile_frequency() -> u64 {
    DEFAULT_PROFILE_FREQUENCY
}

/// One aggregated row of a guest profile: samples with the same event,
/// context, process, image, symbol and stack since the previous delta.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProfileRow {
    /// Index into the session's event list (as in `profile_ready`).
    pub event: u32,
    /// `guest-user` or `guest-kernel` (see [`row_context`]).
    pub context: String,
    /// Thread (else process) name in the guest.
    pub process: String,
    /// Image: a file path in the guest, `[kernel.kallsyms]`, a `[module]`, `[anon]`, `[unknown]`.
    pub image: String,
    /// Function name, or a hex address when unresolved.
    pub symbol: String,
    /// Collapsed call stack, root first, frames joined by `;`; empty without call chains.
    #[serde(default)]
    pub stack: String,
    /// Guest CPU the samples ran on (the vCPU index). Added after protocol
    /// 2 shipped: absent from older agents, and then the rows are not split
    /// by CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// Samples.
    pub samples: u64,
    /// Sum of the samples' periods (ns for clock events).
    pub period: u64,
}

impl ProfileRow {
    /// Checks the row against the protocol's limits.
    pub fn validate(&self) -> Result<(), String> {
        if self.event as usize >= MAX_PROFILE_EVENTS {
            return Err(format!(
                "row event {} outside 0..{MAX_PROFILE_EVENTS}",
                self.event
            ));
        }
        if !row_context::ALL.contains(&self.context.as_str()) {
            return Err(format!(
                "row context `{}` is not one of {}",
                cut_type_name(&self.context),
                row_context::ALL.join(", ")
            ));
        }
        check_str("row process", &self.process, MAX_PROCESS_NAME)?;
        check_str("row image", &self.image, MAX_IMAGE)?;
        check_str("row symbol", &self.symbol, MAX_SYMBOL)?;
        check_str("row stack", &self.stack, MAX_STACK)?;
        if let Some(c) = self.cpu.filter(|c| *c >= MAX_ROW_CPU) {
            return Err(format!("row cpu {c} outside 0..{MAX_ROW_CPU}"));
        }
        Ok(())
    }
}

/// What a profiler cost over one delta: its own CPU plus the interrupt time
/// its samples added, against the CPU it observed (wall time × CPUs), and
/// the rate in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaCost {
    pub cost_ns: u64,
    pub capacity_ns: u64,
    pub rate_hz: u64,
}

/// A message with its envelope fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<T> {
    /// Protocol version of the sender.
    pub v: u32,
    /// Request id, echoed by the response.
    pub id: u64,
    /// The host client this message belongs to when a broker multiplexes
    /// several over one channel (protocol 3); 0 for a direct connection.
    pub stream: u32,
    /// The message.
    pub msg: T,
}

/// Host → agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// First request of a connection; the nonce comes back in the agent's hello.
    Hello {
        /// Random per connection: tells this connection's answer from stale ones.
        nonce: u64,
        /// Version string of the host tool.
        host_version: String,
    },
    /// Liveness and round-trip check.
    Ping {
        /// Echoed in the pong.
        seq: u64,
    },
    /// Run a program (no shell) and return its output; needs `--allow-exec`.
    Exec {
        /// Program and arguments; `argv[0]` is looked up in `PATH`.
        argv: Vec<String>,
        /// Bytes fed to the program's stdin (else stdin is empty).
        #[serde(
            default,
            with = "b64::opt_bytes",
            skip_serializing_if = "Option::is_none"
        )]
        stdin: Option<Vec<u8>>,
        /// The agent kills the program (and its process group) after this long.
        timeout_ms: u64,
        /// Most bytes kept of stdout, and of stderr (protocol 3; default
        /// [`MAX_EXEC_OUTPUT`], at most [`MAX_EXEC_OUTPUT_LIMIT`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_output: Option<u64>,
    },
    /// One chunk of a file copied into the guest; needs `--allow-write` or `--allow-exec`.
    PutFile {
        /// Absolute destination path in the guest.
        path: String,
        /// Permission bits (`0o7777` at most) applied when the last chunk lands.
        mode: u32,
        /// Byte offset of this chunk; 0 starts a new transfer, then strictly sequential.
        offset: u64,
        /// Chunk bytes (base64 on the wire).
        #[serde(with = "b64::bytes")]
        data: Vec<u8>,
        /// The final chunk: the file is moved into place and gets its mode.
        last: bool,
    },
    /// Arm sampling inside the guest (protocol 2); answered `profile_ready`.
    ProfileStart {
        /// Event names as the host's `-e` takes them (`cpu-clock`, `cycles:100000`).
        #[serde(default = "default_profile_events")]
        events: Vec<String>,
        /// Samples per second per CPU for events given without a period.
        #[serde(default = "default_profile_frequency")]
        frequency: u64,
        /// Record call stacks.
        #[serde(default)]
        callchain: bool,
        /// Keep the agent's own cost (its CPU and its sampling interrupts)
        /// within this share of the guest's CPU, in parts per million (1 %
        /// is 10000), by lowering the rate (protocol 3; older agents ignore
        /// it and never send `cost`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget_ppm: Option<u32>,
    },
    /// What the session sampled since the previous poll; answered `profile_data`.
    ProfilePoll {},
    /// End the session; answered by the final `profile_data`.
    ProfileStop {},
    /// A slice of the guest's `/proc/kallsyms` and its module list; answered `kallsyms`.
    GetKallsyms {
        /// Byte offset into the text: 0 takes a new snapshot, later slices
        /// continue it where the previous answer ended.
        #[serde(default)]
        offset: u64,
    },
    /// The host client of the envelope's stream is gone: drop its profiling
    /// session, file transfer and kallsyms snapshot (protocol 3); answered
    /// `stream_closed`.
    CloseStream {},
    /// A request type this build does not know (decoded only, or sent by tests).
    #[serde(skip)]
    Unknown {
        /// The `type` field as received (cut to [`MAX_TYPE_NAME`]).
        type_name: String,
    },
}

/// What the agent says about itself in answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHello {
    /// The agent's [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The agent's build version.
    pub agent_version: String,
    /// Guest kernel release (`uname -r`).
    pub kernel: String,
    /// Guest hostname.
    pub hostname: String,
    /// Online CPUs in the guest.
    pub cpus: u32,
    /// MemTotal of the guest, in bytes.
    pub mem_bytes: u64,
    /// Request types this agent will perform (see [`capability`]).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// The nonce of the hello being answered.
    #[serde(default)]
    pub nonce: u64,
}

/// Agent → host; each response carries the id of the request it answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello(AgentHello),
    /// Answer to [`Request::Ping`].
    Pong {
        /// The ping's sequence number.
        seq: u64,
    },
    /// Answer to [`Request::Exec`].
    ExecResult {
        /// Exit status; `128 + signal` when the program was killed by a signal.
        exit_code: i32,
        /// Captured stdout (at most [`MAX_EXEC_OUTPUT`] bytes).
        #[serde(with = "b64::bytes")]
        stdout: Vec<u8>,
        /// Captured stderr (at most [`MAX_EXEC_OUTPUT`] bytes).
        #[serde(with = "b64::bytes")]
        stderr: Vec<u8>,
        /// Output beyond the limit was discarded.
        truncated: bool,
        /// The program ran past its timeout and was killed.
        #[serde(default)]
        timed_out: bool,
    },
    /// Answer to each [`Request::PutFile`] chunk.
    PutFileDone {
        /// Bytes of the file written so far (offset + chunk length).
        bytes: u64,
    },
    /// Answer to [`Request::ProfileStart`]: sampling is armed.
    ProfileReady {
        /// CPUs sampled.
        cpus: u32,
        /// The session's events; [`ProfileRow::event`] indexes this list.
        events: Vec<String>,
        /// Guest `CLOCK_MONOTONIC` when sampling was enabled, in ns.
        t_ns: u64,
    },
    /// Answer to [`Request::ProfilePoll`] and [`Request::ProfileStop`].
    ProfileData {
        /// 1 for the first delta of a session, then +1 per message.
        seq: u64,
        /// Aggregated rows (at most [`MAX_PROFILE_ROWS`]).
        rows: Vec<ProfileRow>,
        /// Samples taken since the previous `profile_data`.
        samples: u64,
        /// Samples lost since the previous `profile_data` (ring overflow in
        /// the guest, rows the agent could not keep).
        lost: u64,
        /// Guest `CLOCK_MONOTONIC` when the delta was cut, in ns.
        t_ns: u64,
        /// Rows remain that did not fit: poll again.
        #[serde(default)]
        more: bool,
        /// The session is over and everything has been sent.
        #[serde(default)]
        last: bool,
        /// What profiling cost the guest over the delta (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost: Option<DeltaCost>,
    },
    /// Answer to [`Request::GetKallsyms`].
    Kallsyms {
        /// Byte offset of `text` in the snapshot.
        offset: u64,
        /// Length of the whole snapshot, in bytes.
        total: u64,
        /// A slice of `/proc/kallsyms`, ending at a line end.
        text: String,
        /// Names from `/proc/modules` (sent with offset 0, empty afterwards).
        #[serde(default)]
        modules: Vec<String>,
    },
    /// Answer to [`Request::CloseStream`]: the stream's state is gone.
    StreamClosed {},
    /// The request failed or is not allowed or not known.
    Error {
        /// Category.
        kind: ErrorKind,
        /// Explanation for a human.
        message: String,
    },
    /// A response type this build does not know (decoded only).
    #[serde(skip)]
    Unknown {
        /// The `type` field as received (cut to [`MAX_TYPE_NAME`]).
        type_name: String,
    },
}

/// Category of an error response. Unknown categories decode as `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request type is not known to this agent.
    Unsupported,
    /// The request is known but disabled (e.g. exec without `--allow-exec`).
    Denied,
    /// Fields missing, malformed or out of limits.
    BadRequest,
    /// The request or its answer would exceed a limit.
    TooLarge,
    /// An operating-system error in the guest (spawn, open, write).
    Io,
    /// Too many requests of this kind are in flight, or a session already runs.
    Busy,
    /// A sampling event cannot be opened in the guest (no PMU); the message
    /// names the event and the events that work.
    UnsupportedEvent,
    /// A profiling request while no session runs.
    NotRunning,
    /// Anything else, including categories added by newer versions.
    #[serde(other)]
    Other,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Denied => "denied",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Io => "io",
            ErrorKind::Busy => "busy",
            ErrorKind::UnsupportedEvent => "unsupported_event",
            ErrorKind::NotRunning => "not_running",
            ErrorKind::Other => "other",
        })
    }
}

/// Shared by [`Request`] and [`Response`] for the generic envelope code.
pub trait Message: Sized + Serialize + for<'de> Deserialize<'de> {
    /// `type` names this build decodes.
    const KNOWN_TYPES: &'static [&'static str];
    /// The value for a type name not in [`Message::KNOWN_TYPES`].
    fn unknown(type_name: String) -> Self;
    /// `Some(name)` when this is the unknown variant.
    fn unknown_name(&self) -> Option<&str>;
    /// Checks every field against the protocol's limits.
    fn validate(&self) -> Result<(), String>;
}

fn check_str(field: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!("{field} is {} bytes, limit {max}", s.len()));
    }
    Ok(())
}

fn check_no_nul(field: &str, s: &str) -> Result<(), String> {
    if s.contains('\0') {
        return Err(format!("{field} contains a NUL byte"));
    }
    Ok(())
}

fn check_events(events: &[String]) -> Result<(), String> {
    if events.is_empty() {
        return Err("no event".into());
    }
    if events.len() > MAX_PROFILE_EVENTS {
        return Err(format!(
            "{} events, limit {MAX_PROFILE_EVENTS}",
            events.len()
        ));
    }
    for e in events {
        check_str("event", e, MAX_EVENT_NAME)?;
        if e.is_empty() {
            return Err("empty event name".into());
        }
    }
    Ok(())
}

impl Message for Request {
    const KNOWN_TYPES: &'static [&'static str] = &[
        "hello",
        "ping",
        "exec",
        "put_file",
        "profile_start",
        "profile_poll",
        "profile_stop",
        "get_kallsyms",
        "close_stream",
    ];

    fn unknown(type_name: String) -> Self {
        Request::Unknown { type_name }
    }

    fn unknown_name(&self) -> Option<&str> {
        match self {
            Request::Unknown { type_name } => Some(type_name),
            _ => None,
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Request::Hello { host_version, .. } => {
                check_str("host_version", host_version, MAX_STRING)
            }
            Request::Ping { .. }
            | Request::Unknown { .. }
            | Request::ProfilePoll {}
            | Request::ProfileStop {}
            | Request::CloseStream {} => Ok(()),
            Request::ProfileStart {
                events,
                frequency,
                budget_ppm,
                ..
            } => {
                check_events(events)?;
                if *frequency == 0 || *frequency > MAX_PROFILE_FREQUENCY {
                    return Err(format!(
                        "frequency {frequency} outside 1..={MAX_PROFILE_FREQUENCY}"
                    ));
                }
                if let Some(b) = budget_ppm {
                    if *b == 0 || *b >= 1_000_000 {
                        return Err(format!("budget_ppm {b} outside 1..1000000"));
                    }
                }
                Ok(())
            }
            Request::GetKallsyms { offset } => {
                if *offset > MAX_KALLSYMS_TOTAL {
                    return Err(format!("offset {offset} beyond {MAX_KALLSYMS_TOTAL}"));
                }
                Ok(())
            }
            Request::Exec {
                argv,
                stdin,
                timeout_ms,
                max_output,
            } => {
                if let Some(m) = max_output {
                    if *m == 0 || *m > MAX_EXEC_OUTPUT_LIMIT as u64 {
                        return Err(format!(
                            "max_output {m} outside 1..={MAX_EXEC_OUTPUT_LIMIT}"
                        ));
                    }
                }
                if argv.is_empty() {
                    return Err("argv is empty".into());
                }
                if argv.len() > MAX_ARGV {
                    return Err(format!("argv has {} entries, limit {MAX_ARGV}", argv.len()));
                }
                let total: usize = argv.iter().map(std::string::String::len).sum();
                if total > MAX_ARGV_BYTES {
                    return Err(format!("argv is {total} bytes, limit {MAX_ARGV_BYTES}"));
                }
                for a in argv {
                    check_no_nul("argv", a)?;
                }
                if argv[0].is_empty() {
                    return Err("argv[0] is empty".into());
                }
                if let Some(input) = stdin {
                    if input.len() > MAX_EXEC_STDIN {
                        return Err(format!(
                            "stdin is {} bytes, limit {MAX_EXEC_STDIN}",
                            input.len()
                        ));
                    }
                }
                if *timeout_ms == 0 || *timeout_ms > MAX_EXEC_TIMEOUT_MS {
                    return Err(format!(
                        "timeout_ms {timeout_ms} outside 1..={MAX_EXEC_TIMEOUT_MS}"
                    ));
                }
                Ok(())
            }
            Request::PutFile {
                path,
                mode,
                offset,
                data,
                ..
            } => {
                check_str("path", path, MAX_STRING)?;
                check_no_nul("path", path)?;
                if !path.starts_with('/') {
                    return Err("path must be absolute".into());
                }
                if path.ends_with('/') {
                    return Err("path names a directory".into());
                }
                if *mode > 0o7777 {
                    return Err(format!("mode {mode:o} has bits beyond 0o7777"));
                }
                if data.len() > MAX_PUT_CHUNK {
                    return Err(format!(
                        "chunk is {} bytes, limit {MAX_PUT_CHUNK}",
                        data.len()
                    ));
                }
                if offset.checked_add(data.len() as u64).is_none() {
                    return Err("offset + length overflows".into());
                }
                Ok(())
            }
        }
    }
}

impl Message for Response {
    const KNOWN_TYPES: &'static [&'static str] = &[
        "hello",
        "pong",
        "exec_result",
        "put_file_done",
        "error",
        "profile_ready",
        "profile_data",
        "kallsyms",
        "stream_closed",
    ];

    fn unknown(type_name: String) -> Self {
        Response::Unknown { type_name }
    }

    fn unknown_name(&self) -> Option<&str> {
        match self {
            Response::Unknown { type_name } => Some(type_name),
            _ => None,
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Response::Hello(h) => {
                check_str("agent_version", &h.agent_version, MAX_STRING)?;
                check_str("kernel", &h.kernel, MAX_STRING)?;
                check_str("hostname", &h.hostname, MAX_STRING)?;
                if h.capabilities.len() > MAX_CAPABILITIES {
                    return Err(format!(
                        "{} capabilities, limit {MAX_CAPABILITIES}",
                        h.capabilities.len()
                    ));
                }
                for c in &h.capabilities {
                    check_str("capability", c, MAX_TYPE_NAME)?;
                }
                Ok(())
            }
            Response::Pong { .. }
            | Response::PutFileDone { .. }
            | Response::StreamClosed {}
            | Response::Unknown { .. } => Ok(()),
            Response::ExecResult { stdout, stderr, .. } => {
                for (name, b) in [("stdout", stdout), ("stderr", stderr)] {
                    if b.len() > MAX_EXEC_OUTPUT_LIMIT {
                        return Err(format!(
                            "{name} is {} bytes, limit {MAX_EXEC_OUTPUT_LIMIT}",
                            b.len()
                        ));
                    }
                }
                Ok(())
            }
            Response::Error { message, .. } => check_str("message", message, MAX_ERROR_MESSAGE),
            Response::ProfileReady { events, .. } => check_events(events),
            Response::ProfileData { rows, .. } => {
                if rows.len() > MAX_PROFILE_ROWS {
                    return Err(format!("{} rows, limit {MAX_PROFILE_ROWS}", rows.len()));
                }
                for (i, r) in rows.iter().enumerate() {
                    r.validate().map_err(|e| format!("row {i}: {e}"))?;
                }
                Ok(())
            }
            Response::Kallsyms {
                offset,
                total,
                text,
                modules,
            } => {
                if text.len() > MAX_KALLSYMS_CHUNK {
                    return Err(format!(
                        "kallsyms slice is {} bytes, limit {MAX_KALLSYMS_CHUNK}",
                        text.len()
                    ));
                }
                if *total > MAX_KALLSYMS_TOTAL {
                    return Err(format!(
                        "kallsyms total {total} bytes, limit {MAX_KALLSYMS_TOTAL}"
                    ));
                }
                match offset.checked_add(text.len() as u64) {
                    Some(end) if end <= *total => {}
                    _ => {
                        return Err(format!(
                            "kallsyms slice {offset}+{} runs past total {total}",
                            text.len()
                        ))
                    }
                }
                if modules.len() > MAX_MODULES {
                    return Err(format!("{} modules, limit {MAX_MODULES}", modules.len()));
                }
                for m in modules {
                    check_str("module", m, MAX_MODULE_NAME)?;
                }
                Ok(())
            }
        }
    }
}

fn cut_type_name(s: &str) -> String {
    let mut end = s.len().min(MAX_TYPE_NAME);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn encode_message<T: Message>(stream: u32, id: u64, msg: &T) -> Result<Vec<u8>, ProtocolError> {
    if let Err(reason) = msg.validate() {
        return Err(ProtocolError::malformed(format!(
            "refusing to encode an invalid message: {reason}"
        )));
    }
    let mut obj = Map::new();
    obj.insert("v".into(), Value::from(PROTOCOL_VERSION));
    obj.insert("id".into(), Value::from(id));
    if stream != 0 {
        obj.insert("stream".into(), Value::from(stream));
    }
    if let Some(name) = msg.unknown_name() {
        obj.insert("type".into(), Value::from(name));
    } else {
        let body = serde_json::to_value(msg)
            .map_err(|e| ProtocolError::malformed(format!("cannot encode: {e}")))?;
        if let Value::Object(fields) = body {
            for (k, v) in fields {
                obj.insert(k, v);
            }
        }
    }
    let body = serde_json::to_vec(&Value::Object(obj))
        .map_err(|e| ProtocolError::malformed(format!("cannot encode: {e}")))?;
    encode_frame(ENCODING_JSON, &body)
}

/// One complete frame carrying `req` with envelope id `id`.
pub fn encode_request(id: u64, req: &Request) -> Result<Vec<u8>, ProtocolError> {
    encode_message(0, id, req)
}

/// One complete frame carrying `resp`, answering request `id`.
pub fn encode_response(id: u64, resp: &Response) -> Result<Vec<u8>, ProtocolError> {
    encode_message(0, id, resp)
}

/// [`encode_request`] on behalf of host client `stream` (protocol 3).
pub fn encode_request_on(stream: u32, id: u64, req: &Request) -> Result<Vec<u8>, ProtocolError> {
    encode_message(stream, id, req)
}

/// [`encode_response`] for host client `stream` (protocol 3).
pub fn encode_response_on(stream: u32, id: u64, resp: &Response) -> Result<Vec<u8>, ProtocolError> {
    encode_message(stream, id, resp)
}

/// The envelope fields of a body, borrowed as raw JSON: the message itself
/// is deserialized once, straight from the body (building a `Value` tree
/// first and the message from it cost the host about 1 % of a CPU with 32
/// VMs streaming samples, bench/many-vms). Unknown fields are skipped.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    id: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    v: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default, rename = "type")]
    type_name: Option<&'a serde_json::value::RawValue>,
}

/// A raw envelope field as `T`, if it is one.
fn raw_as<'a, T: Deserialize<'a>>(raw: Option<&'a serde_json::value::RawValue>) -> Option<T> {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
}

fn decode_body<T: Message>(encoding: u8, body: &[u8]) -> Result<Envelope<T>, ProtocolError> {
    if encoding != ENCODING_JSON {
        return Err(ProtocolError::malformed(format!(
            "body encoding {encoding} is not supported"
        )));
    }
    let head: Head<'_> = serde_json::from_slice(body).map_err(|e| {
        // Valid JSON of another shape, or not JSON at all.
        match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            Ok(_) => ProtocolError::malformed(format!("body is not a JSON object: {e}")),
            Err(_) => ProtocolError::malformed(format!("body is not JSON: {e}")),
        }
    })?;
    let id: u64 =
        raw_as(head.id).ok_or_else(|| ProtocolError::malformed("missing or invalid `id`"))?;
    let v = raw_as::<u64>(head.v)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| ProtocolError::malformed("missing or invalid `v`"))?;
    let stream = match head.stream {
        None => 0,
        Some(s) => raw_as::<u64>(Some(s))
            .and_then(|s| u32::try_from(s).ok())
            .filter(|s| *s < MAX_STREAMS)
            .ok_or_else(|| {
                ProtocolError::malformed(format!("invalid `stream` (0..{MAX_STREAMS})"))
            })?,
    };
    let type_name: std::borrow::Cow<'_, str> = raw_as(head.type_name)
        .ok_or_else(|| ProtocolError::malformed("missing or invalid `type`"))?;
    if !T::KNOWN_TYPES.contains(&type_name.as_ref()) {
        return Ok(Envelope {
            v,
            id,
            stream,
            msg: T::unknown(cut_type_name(&type_name)),
        });
    }
    let type_name = type_name.into_owned();
    let msg: T = serde_json::from_slice(body).map_err(|e| ProtocolError::BadMessage {
        id,
        type_name: type_name.clone(),
        reason: e.to_string(),
    })?;
    msg.validate().map_err(|reason| ProtocolError::BadMessage {
        id,
        type_name,
        reason,
    })?;
    Ok(Envelope { v, id, stream, msg })
}

/// Incremental message decoder: [`Decoder::push`] received bytes, then call
/// [`Decoder::next_request`] (agent side) or [`Decoder::next_response`]
/// (host side) until it returns `Ok(None)`. An `Err` describes one bad frame
/// that has already been dropped; keep calling to get the following ones.
#[derive(Debug, Default)]
pub struct Decoder {
    frames: FrameDecoder,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.frames.push(data);
    }

    /// Next request, if a complete frame is buffered.
    pub fn next_request(&mut self) -> Result<Option<Envelope<Request>>, ProtocolError> {
        self.next()
    }

    /// Next response, if a complete frame is buffered.
    pub fn next_response(&mut self) -> Result<Option<Envelope<Response>>, ProtocolError> {
        self.next()
    }

    fn next<T: Message>(&mut self) -> Result<Option<Envelope<T>>, ProtocolError> {
        match self.frames.next_frame()? {
            Some(frame) => decode_body(frame.encoding, &frame.body).map(Some),
            None => Ok(None),
        }
    }

    /// Bytes held that do not yet form a complete frame.
    pub fn buffered(&self) -> usize {
        self.frames.buffered()
    }

    /// Bytes discarded as garbage so far.
    pub fn skipped_bytes(&self) -> u64 {
        self.frames.skipped_bytes()
    }

    /// Drops a partially received frame (call when the peer reconnects).
    pub fn discard_partial(&mut self) {
        self.frames.discard_buffered();
    }
}
