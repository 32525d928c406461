//! Host side: the [`Transport`] abstraction over a byte stream (QEMU's chardev
//! Unix socket in the lab) and [`AgentClient`], which says hello, matches
//! answers to requests by id and turns agent errors into [`ProtocolError`].
//!
//! The host always initiates. Frames from the guest are hostile input: bad
//! frames and answers to other requests (stale ones of an earlier connection)
//! are skipped, counted and never trusted for more than their bounded size.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use crate::error::ProtocolError;
use crate::message::{
    encode_request, AgentHello, Decoder, ProfileRow, Request, Response, DEFAULT_PROFILE_EVENT,
    DEFAULT_PROFILE_FREQUENCY, MAX_KALLSYMS_TOTAL, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
    PUT_CHUNK,
};

/// How often [`AgentClient::connect`] repeats its hello while the guest boots.
pub const HELLO_RETRY: Duration = Duration::from_millis(500);
/// Extra time the client waits for an exec result beyond the exec timeout.
pub const EXEC_GRACE: Duration = Duration::from_secs(5);
const READ_CHUNK: usize = 64 * 1024;

/// A bidirectional byte stream with a settable read timeout.
pub trait Transport: Read + Write {
    /// Bounds each `read` (`None`: block). Must accept any positive duration.
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Bounds each `write` (`None`: block). Default: not bounded.
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        let _ = t;
        Ok(())
    }
}

impl Transport for std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_write_timeout(self, t)
    }
}

impl Transport for std::net::TcpStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::net::TcpStream::set_write_timeout(self, t)
    }
}

/// Result of [`AgentClient::exec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit status; `128 + signal` when killed by a signal.
    pub exit_code: i32,
    /// Captured stdout.
    pub stdout: Vec<u8>,
    /// Captured stderr.
    pub stderr: Vec<u8>,
    /// Output beyond the agent's limit was discarded.
    pub truncated: bool,
    /// The agent killed the program at the timeout.
    pub timed_out: bool,
}

/// What [`AgentClient::profile_start`] asks the agent to sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileConfig {
    /// Event names as the host's `-e` takes them (`cpu-clock`, `cycles:100000`).
    pub events: Vec<String>,
    /// Samples per second per CPU for events given without a period.
    pub frequency: u64,
    /// Record call stacks.
    pub callchain: bool,
    /// The agent's overhead budget in parts per million of the guest's CPU
    /// (10000 = 1 %; `None`: a fixed rate).
    pub budget_ppm: Option<u32>,
}

impl Default for ProfileConfig {
    /// `cpu-clock` at 1000 Hz, no call chains.
    fn default() -> ProfileConfig {
        ProfileConfig {
            events: vec![DEFAULT_PROFILE_EVENT.to_string()],
            frequency: DEFAULT_PROFILE_FREQUENCY,
            callchain: false,
            budget_ppm: None,
        }
    }
}

/// The agent's `profile_ready`: sampling is armed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileReadyInfo {
    /// CPUs sampled in the guest.
    pub cpus: u32,
    /// The session's events; [`ProfileRow::event`] indexes this list.
    pub events: Vec<String>,
    /// Guest `CLOCK_MONOTONIC` when sampling was enabled, in ns.
    pub t_ns: u64,
}

/// Samples of one or more `profile_data` messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileDelta {
    /// Sequence number of the (last) message.
    pub seq: u64,
    /// Aggregated rows.
    pub rows: Vec<ProfileRow>,
    /// Samples taken in the guest over the delta.
    pub samples: u64,
    /// Samples lost in the guest over the delta.
    pub lost: u64,
    /// Guest `CLOCK_MONOTONIC` when the (last) delta was cut, in ns.
    pub t_ns: u64,
    /// Rows remain in the agent: poll again.
    pub more: bool,
    /// The session is over and everything has been received.
    pub last: bool,
    /// What profiling cost the guest over the delta (agents of protocol 3).
    pub cost: Option<crate::message::DeltaCost>,
}

impl ProfileDelta {
    /// Adds a later message of the same session: rows, counts and cost.
    pub fn absorb(&mut self, other: ProfileDelta) {
        self.seq = other.seq;
        self.rows.extend(other.rows);
        self.samples += other.samples;
        self.lost += other.lost;
        self.t_ns = other.t_ns;
        self.more = other.more;
        self.last = other.last;
        self.cost = match (self.cost, other.cost) {
            (Some(a), Some(b)) => Some(crate::message::DeltaCost {
                cost_ns: a.cost_ns + b.cost_ns,
                capacity_ns: a.capacity_ns + b.capacity_ns,
                rate_hz: b.rate_hz,
            }),
            (a, b) => b.or(a),
        };
    }
}

/// A random 64-bit value from the standard library's per-process hash keys,
/// the clock and a counter (no OS randomness call of its own).
pub fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

/// A connected, greeted agent.
#[derive(Debug)]
pub struct AgentClient<T: Transport> {
    stream: T,
    decoder: Decoder,
    next_id: u64,
    hello: AgentHello,
    ignored_frames: u64,
    /// The request whose answer did not come before its deadline: a slow
    /// agent's answer still arrives, and [`AgentClient::wait_late`] takes it
    /// rather than letting the next request's wait skip it.
    late: Option<u64>,
}

impl<T: Transport> AgentClient<T> {
    /// Greets the agent on `stream`, repeating the hello every
    /// [`HELLO_RETRY`] until an answer carrying this connection's nonce
    /// arrives or `timeout` passes (the guest may still be booting).
    pub fn connect(stream: T, timeout: Duration) -> Result<(Self, AgentHello), ProtocolError> {
        let deadline = Instant::now() + timeout;
        let nonce = random_u64();
        // Ids start at a random point so answers to an earlier connection's
        // requests cannot be mistaken for answers to ours.
        let mut client = AgentClient {
            stream,
            decoder: Decoder::new(),
            next_id: (random_u64() >> 12) | 1,
            hello: placeholder_hello(),
            ignored_frames: 0,
            late: None,
        };
        let req = Request::Hello {
            nonce,
            host_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let mut sent = Vec::new();
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(ProtocolError::Timeout {
                    what: "agent hello".into(),
                });
            }
            // A torn frame left over from an earlier connection must not
            // swallow the answer: start every attempt from a clean buffer.
            client.decoder.discard_partial();
            let id = client.send(&req, deadline)?;
            sent.push(id);
            let attempt_end = (now + HELLO_RETRY).min(deadline);
            let got = client.wait_for(attempt_end, |env_id, resp| {
                sent.contains(&env_id) && matches!(resp, Response::Hello(h) if h.nonce == nonce)
            });
            match got {
                Ok(Response::Hello(h)) => {
                    if h.protocol < MIN_PROTOCOL_VERSION {
                        return Err(ProtocolError::VersionMismatch {
                            agent: h.protocol,
                            min: MIN_PROTOCOL_VERSION,
                            host: PROTOCOL_VERSION,
                        });
                    }
                    client.hello = h.clone();
                    return Ok((client, h));
                }
                Ok(other) => return Err(unexpected("hello", &other)),
                Err(ProtocolError::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The agent's hello.
    pub fn hello(&self) -> &AgentHello {
        &self.hello
    }

    /// Whether the agent listed `cap` (see [`crate::capability`]).
    pub fn has_capability(&self, cap: &str) -> bool {
        self.hello.capabilities.iter().any(|c| c == cap)
    }

    /// Frames skipped so far: undecodable, or answering no pending request.
    pub fn ignored_frames(&self) -> u64 {
        self.ignored_frames
    }

    /// Garbage bytes skipped so far by the decoder.
    pub fn skipped_bytes(&self) -> u64 {
        self.decoder.skipped_bytes()
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &T {
        &self.stream
    }

    /// Gives back the underlying stream.
    pub fn into_inner(self) -> T {
        self.stream
    }

    /// Round trip of one ping.
    pub fn ping(&mut self, timeout: Duration) -> Result<Duration, ProtocolError> {
        let start = Instant::now();
        let seq = self.next_id;
        match self.request(&Request::Ping { seq }, timeout)? {
            Response::Pong { seq: got } if got == seq => Ok(start.elapsed()),
            other => Err(unexpected("pong", &other)),
        }
    }

    /// Runs `argv` in the guest (no shell); the agent kills it after `timeout`.
    pub fn exec(
        &mut self,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, ProtocolError> {
        self.exec_with_stdin(argv, None, timeout)
    }

    /// Like [`AgentClient::exec`], feeding `stdin` to the program.
    pub fn exec_with_stdin(
        &mut self,
        argv: &[String],
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<ExecOutput, ProtocolError> {
        self.exec_with_limit(argv, stdin, timeout, None)
    }

    /// Like [`AgentClient::exec_with_stdin`], keeping up to `max_output`
    /// bytes of each output stream (protocol 3; older agents keep
    /// [`crate::MAX_EXEC_OUTPUT`]).
    pub fn exec_with_limit(
        &mut self,
        argv: &[String],
        stdin: Option<&[u8]>,
        timeout: Duration,
        max_output: Option<u64>,
    ) -> Result<ExecOutput, ProtocolError> {
        let timeout_ms = timeout.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        let req = Request::Exec {
            argv: argv.to_vec(),
            stdin: stdin.map(<[u8]>::to_vec),
            timeout_ms,
            max_output,
        };
        match self.request(&req, timeout + EXEC_GRACE)? {
            Response::ExecResult {
                exit_code,
                stdout,
                stderr,
                truncated,
                timed_out,
            } => Ok(ExecOutput {
                exit_code,
                stdout,
                stderr,
                truncated,
                timed_out,
            }),
            other => Err(unexpected("exec_result", &other)),
        }
    }

    /// Copies `data` to `guest_path` with permission bits `mode`, in chunks of
    /// [`PUT_CHUNK`]; the file appears only once complete. `timeout` bounds the
    /// whole transfer. Returns the bytes written.
    pub fn put_file(
        &mut self,
        data: &[u8],
        guest_path: &str,
        mode: u32,
        timeout: Duration,
    ) -> Result<u64, ProtocolError> {
        let deadline = Instant::now() + timeout;
        let mut offset = 0usize;
        loop {
            let end = (offset + PUT_CHUNK).min(data.len());
            let last = end == data.len();
            let req = Request::PutFile {
                path: guest_path.to_string(),
                mode,
                offset: offset as u64,
                data: data[offset..end].to_vec(),
                last,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match self.request(&req, left)? {
                Response::PutFileDone { bytes } if bytes == end as u64 => {}
                Response::PutFileDone { bytes } => {
                    return Err(ProtocolError::malformed(format!(
                        "agent acknowledged {bytes} bytes, expected {end}"
                    )))
                }
                other => return Err(unexpected("put_file_done", &other)),
            }
            offset = end;
            if last {
                return Ok(offset as u64);
            }
        }
    }

    /// Arms sampling in the guest. Fails with [`ProtocolError::Remote`]:
    /// `unsupported` (an agent older than protocol 2), `unsupported_event`
    /// (the message names the event and the events that work), `busy` (a
    /// session already runs), `denied` or `io`.
    pub fn profile_start(
        &mut self,
        config: &ProfileConfig,
        timeout: Duration,
    ) -> Result<ProfileReadyInfo, ProtocolError> {
        let req = Request::ProfileStart {
            events: config.events.clone(),
            frequency: config.frequency,
            callchain: config.callchain,
            budget_ppm: config.budget_ppm,
        };
        match self.request(&req, timeout)? {
            Response::ProfileReady { cpus, events, t_ns } => {
                Ok(ProfileReadyInfo { cpus, events, t_ns })
            }
            other => Err(unexpected("profile_ready", &other)),
        }
    }

    /// What the guest sampled since the previous poll (one message: when
    /// `more` is set, rows are still waiting and another poll fetches them).
    pub fn profile_poll(&mut self, timeout: Duration) -> Result<ProfileDelta, ProtocolError> {
        self.profile_data(&Request::ProfilePoll {}, timeout)
    }

    /// Stops sampling and returns everything not yet polled, polling again
    /// while the agent has more rows. `timeout` bounds the whole exchange.
    pub fn profile_stop(&mut self, timeout: Duration) -> Result<ProfileDelta, ProtocolError> {
        let deadline = Instant::now() + timeout;
        let mut all = self.profile_data(&Request::ProfileStop {}, timeout)?;
        while !all.last {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = self.profile_data(&Request::ProfilePoll {}, left)?;
            if !next.last && !next.more && next.rows.is_empty() {
                return Err(ProtocolError::malformed(
                    "agent neither finished the stopped session nor sent more rows",
                ));
            }
            all.absorb(next);
        }
        Ok(all)
    }

    /// Waits up to `timeout` more for the poll that timed out last
    /// ([`AgentClient::wait_late`]): a busy guest's rows, late, not lost.
    pub fn profile_poll_late(&mut self, timeout: Duration) -> Result<ProfileDelta, ProtocolError> {
        let resp = self.wait_late(timeout)?;
        profile_delta(resp)
    }

    fn profile_data(
        &mut self,
        req: &Request,
        timeout: Duration,
    ) -> Result<ProfileDelta, ProtocolError> {
        profile_delta(self.request(req, timeout)?)
    }

    /// The guest's `/proc/kallsyms` text and `/proc/modules` names, fetched
    /// in slices; `timeout` bounds the whole transfer. Works whether or not
    /// the agent samples.
    pub fn kallsyms(&mut self, timeout: Duration) -> Result<(String, Vec<String>), ProtocolError> {
        let deadline = Instant::now() + timeout;
        let mut text = String::new();
        let mut modules = Vec::new();
        let mut total = None;
        loop {
            let offset = text.len() as u64;
            let left = deadline.saturating_duration_since(Instant::now());
            match self.request(&Request::GetKallsyms { offset }, left)? {
                Response::Kallsyms {
                    offset: got,
                    total: t,
                    text: slice,
                    modules: m,
                } => {
                    if got != offset || *total.get_or_insert(t) != t || t > MAX_KALLSYMS_TOTAL {
                        return Err(ProtocolError::malformed(format!(
                            "kallsyms slice at {got} of {t} bytes, expected offset {offset} of {}",
                            total.unwrap_or(t)
                        )));
                    }
                    if offset == 0 {
                        modules = m;
                    }
                    if slice.is_empty() && offset < t {
                        return Err(ProtocolError::malformed(format!(
                            "empty kallsyms slice at {offset} of {t} bytes"
                        )));
                    }
                    text.push_str(&slice);
                    if text.len() as u64 >= t {
                        return Ok((text, modules));
                    }
                }
                other => return Err(unexpected("kallsyms", &other)),
            }
        }
    }

    /// Sends any request and waits up to `timeout` for its answer. An error
    /// response becomes [`ProtocolError::Remote`]. This is the entry point
    /// for message types added later.
    pub fn request(&mut self, req: &Request, timeout: Duration) -> Result<Response, ProtocolError> {
        let deadline = Instant::now() + timeout;
        self.late = None;
        let id = self.send(req, deadline)?;
        self.answer_to(id, deadline)
    }

    /// Waits up to `timeout` more for the answer to the request that timed
    /// out last (the agent may only be slow: a guest whose CPUs are busy).
    /// Another timeout keeps it waiting; any other outcome ends the wait.
    pub fn wait_late(&mut self, timeout: Duration) -> Result<Response, ProtocolError> {
        let Some(id) = self.late else {
            return Err(ProtocolError::malformed(
                "no request waits for a late answer",
            ));
        };
        self.answer_to(id, Instant::now() + timeout)
    }

    fn answer_to(&mut self, id: u64, deadline: Instant) -> Result<Response, ProtocolError> {
        let got = self.wait_for(deadline, |got, _| got == id);
        self.late = match &got {
            Err(ProtocolError::Timeout { .. }) => Some(id),
            _ => None,
        };
        match got? {
            Response::Error { kind, message } => Err(ProtocolError::Remote { kind, message }),
            other => Ok(other),
        }
    }

    fn send(&mut self, req: &Request, deadline: Instant) -> Result<u64, ProtocolError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let frame = encode_request(id, req)?;
        let left = deadline.saturating_duration_since(Instant::now());
        self.stream
            .set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
        match self
            .stream
            .write_all(&frame)
            .and_then(|_| self.stream.flush())
        {
            Ok(()) => Ok(id),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(ProtocolError::Timeout {
                    what: "the agent channel to accept a request".into(),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    fn wait_for(
        &mut self,
        deadline: Instant,
        mut wanted: impl FnMut(u64, &Response) -> bool,
    ) -> Result<Response, ProtocolError> {
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            loop {
                match self.decoder.next_response() {
                    Ok(Some(env)) => {
                        if wanted(env.id, &env.msg) {
                            return Ok(env.msg);
                        }
                        self.ignored_frames += 1;
                    }
                    Ok(None) => break,
                    Err(ProtocolError::BadMessage {
                        id,
                        type_name,
                        reason,
                    }) if wanted(
                        id,
                        &Response::Unknown {
                            type_name: String::new(),
                        },
                    ) =>
                    {
                        return Err(ProtocolError::BadMessage {
                            id,
                            type_name,
                            reason,
                        })
                    }
                    Err(_) => self.ignored_frames += 1,
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ProtocolError::Timeout {
                    what: "agent response".into(),
                });
            }
            self.stream
                .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(ProtocolError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "agent channel closed",
                    )))
                }
                Ok(n) => self.decoder.push(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn placeholder_hello() -> AgentHello {
    AgentHello {
        protocol: 0,
        agent_version: String::new(),
        kernel: String::new(),
        hostname: String::new(),
        cpus: 0,
        mem_bytes: 0,
        capabilities: Vec::new(),
        nonce: 0,
    }
}

fn unexpected(wanted: &str, got: &Response) -> ProtocolError {
    let name = match got {
        Response::Hello(_) => "hello",
        Response::Pong { .. } => "pong",
        Response::ExecResult { .. } => "exec_result",
        Response::PutFileDone { .. } => "put_file_done",
        Response::Error { .. } => "error",
        Response::ProfileReady { .. } => "profile_ready",
        Response::ProfileData { .. } => "profile_data",
        Response::Kallsyms { .. } => "kallsyms",
        Response::StreamClosed {} => "stream_closed",
        Response::Unknown { type_name } => type_name.as_str(),
    };
    ProtocolError::malformed(format!("expected {wanted}, agent answered {name}"))
}

/// A `profile_data` answer as a delta; anything else is unexpected.
fn profile_delta(resp: Response) -> Result<ProfileDelta, ProtocolError> {
    match resp {
        Response::ProfileData {
            seq,
            rows,
            samples,
            lost,
            t_ns,
            more,
            last,
            cost,
        } => Ok(ProfileDelta {
            seq,
            rows,
            samples,
            lost,
            t_ns,
            more,
            last,
            cost,
        }),
        other => Err(unexpected("profile_data", &other)),
    }
}
