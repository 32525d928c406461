//! The agent's event loop: one poll(2) over the channel and a wake-up pipe.
//!
//! The channel is non-blocking in both directions. Responses go to an output
//! queue flushed when the channel is writable, so a port with no host
//! listener (virtio-serial writes would block until the host connects) never
//! stalls the loop. While the host side is closed, virtio-serial reports
//! POLLHUP and reads return 0: the loop then drops the connection's state
//! (partial frame, queued answers, file transfer), sleeps 100 ms on the
//! wake-up pipe only, and looks again. Exec requests run on worker threads
//! that hand their result back through a channel and wake the loop; so do
//! the profiling worker (`profile`) and the kallsyms reader (`kallsyms`).
//! Requests are answered only on the channel they came from; nothing runs
//! that the protocol did not ask for.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use vmscope_protocol::{
    capability, encode_response_on, AgentHello, Decoder, Envelope, ErrorKind, ProtocolError,
    Request, Response, MAX_ERROR_MESSAGE, MAX_EXEC_OUTPUT, MAX_STRING, PROTOCOL_VERSION,
};

use crate::kallsyms::{self, Snapshot};
use crate::log;
use crate::profile::{self, Session};
use crate::putfile::PutFiles;
use crate::{exec, sysinfo};

/// What a worker thread hands back to the loop.
enum Outcome {
    /// An exec result (counted in `running`).
    Exec(Response),
    /// A profiling answer.
    Profile(Response),
    /// A kallsyms snapshot, or why there is none (counted in `running`).
    Kallsyms(Result<Arc<Snapshot>, Response>),
}

/// A worker's answer to request `id` of stream `stream` of connection `epoch`.
struct Done {
    epoch: u64,
    stream: u32,
    id: u64,
    outcome: Outcome,
}

/// What the agent keeps for one host client (a stream; protocol 3): a
/// broker multiplexes many over the channel, a direct connection is
/// stream 0. Dropped with its stream or the connection.
#[derive(Default)]
struct StreamState {
    puts: PutFiles,
    profile: Option<Session>,
    kallsyms: Option<Arc<Snapshot>>,
}

impl StreamState {
    fn close(&mut self) {
        self.puts.abort();
        if self.profile.take().is_some() {
            log!("dropping a profiling session");
        }
        self.kallsyms = None;
    }
}

/// Most exec requests running at once; more are answered `busy`.
pub const MAX_RUNNING_EXECS: usize = 8;
/// Most profiling sessions at once (one per stream); more are answered
/// `busy`. Each samples every guest CPU on its own perf events.
pub const MAX_PROFILE_SESSIONS: usize = 4;
/// Stop reading requests while this many answer bytes wait for the host.
const OUT_HIGH_WATER: usize = 32 << 20;
/// Pause between looks at a port whose host side is closed.
const ABSENT_PAUSE_MS: i32 = 100;
/// Malformed frames logged per connection before the rest are only counted.
const MAX_LOGGED_BAD_FRAMES: u64 = 10;

/// What the agent may do for the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Run commands.
    pub allow_exec: bool,
    /// Accept files.
    pub allow_write: bool,
    /// Exit when the first connection ends.
    pub once: bool,
}

/// The channel's file descriptors.
pub struct ChannelFds {
    /// Readable side.
    pub read: RawFd,
    /// Writable side (the same fd for a port).
    pub write: RawFd,
    /// A closed channel cannot come back (stdio): end of input ends the agent.
    pub ends_on_eof: bool,
    /// Keeps an opened port alive for the loop's lifetime.
    pub _owner: Option<OwnedFd>,
}

struct Server {
    ch: ChannelFds,
    policy: Policy,
    decoder: Decoder,
    out: Vec<u8>,
    out_pos: usize,
    epoch: u64,
    running: usize,
    tx: Sender<Done>,
    rx: Receiver<Done>,
    wake_r: OwnedFd,
    wake_w: Arc<OwnedFd>,
    streams: std::collections::HashMap<u32, StreamState>,
    connected: bool,
    served: bool,
    bad_frames: u64,
}

enum Flow {
    Continue,
    Gone,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: valid pointer to two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Wakes the event loop from a worker thread.
fn wake_loop(wake: &OwnedFd) {
    // SAFETY: one byte from a valid buffer to a pipe the caller keeps alive.
    unsafe { libc::write(wake.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
}

fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<()> {
    // SAFETY: valid slice of pollfd.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Serves the channel until it ends for good (stdio EOF, `--once`).
pub fn serve(ch: ChannelFds, policy: Policy) -> io::Result<()> {
    let (wake_r, wake_w) = pipe()?;
    let (tx, rx) = mpsc::channel();
    let mut s = Server {
        ch,
        policy,
        decoder: Decoder::new(),
        out: Vec::new(),
        out_pos: 0,
        epoch: 0,
        running: 0,
        tx,
        rx,
        wake_r,
        wake_w: Arc::new(wake_w),
        streams: std::collections::HashMap::new(),
        connected: false,
        served: false,
        bad_frames: 0,
    };
    s.run()
}

impl Server {
    fn run(&mut self) -> io::Result<()> {
        loop {
            self.collect_results();
            if let Flow::Gone = self.flush()? {
                if self.gone() {
                    return Ok(());
                }
                continue;
            }
            let same = self.ch.read == self.ch.write;
            let mut fds = vec![
                libc::pollfd {
                    fd: self.wake_r.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.ch.read,
                    events: 0,
                    revents: 0,
                },
            ];
            if self.pending_out() < OUT_HIGH_WATER {
                fds[1].events |= libc::POLLIN;
            }
            if self.pending_out() > 0 {
                if same {
                    fds[1].events |= libc::POLLOUT;
                } else {
                    fds.push(libc::pollfd {
                        fd: self.ch.write,
                        events: libc::POLLOUT,
                        revents: 0,
                    });
                }
            }
            poll(&mut fds, -1)?;
            let rev = fds[1].revents;
            if rev & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                let flow = if rev & libc::POLLIN != 0 || rev & libc::POLLHUP == 0 {
                    self.read_all()?
                } else {
                    Flow::Gone
                };
                let flow = match flow {
                    Flow::Continue if rev & libc::POLLHUP != 0 => Flow::Gone,
                    f => f,
                };
                match flow {
                    Flow::Continue => self.note_connected(),
                    Flow::Gone => {
                        if self.gone() {
                            return Ok(());
                        }
                        // The host side is closed: look again in a while
                        // without spinning, still collecting exec results.
                        let mut w = [libc::pollfd {
                            fd: self.wake_r.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        }];
                        poll(&mut w, ABSENT_PAUSE_MS)?;
                    }
                }
            } else if rev & libc::POLLOUT != 0 {
                self.note_connected();
            }
        }
    }

    fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    fn note_connected(&mut self) {
        if !self.connected {
            self.connected = true;
            log!("host side of the channel is open");
        }
    }

    /// The host went away. Returns true when the agent should exit.
    fn gone(&mut self) -> bool {
        if self.connected {
            log!(
                "host side of the channel closed ({} garbage bytes and {} bad frames skipped)",
                self.decoder.skipped_bytes(),
                self.bad_frames
            );
        }
        let was_served = self.served;
        self.connected = false;
        self.served = false;
        self.bad_frames = 0;
        self.decoder = Decoder::new();
        self.out.clear();
        self.out_pos = 0;
        if !self.streams.is_empty() {
            log!(
                "host gone: dropping the state of {} stream(s)",
                self.streams.len()
            );
        }
        for st in self.streams.values_mut() {
            st.close();
        }
        self.streams.clear();
        self.epoch += 1;
        self.ch.ends_on_eof || (self.policy.once && was_served)
    }

    fn read_all(&mut self) -> io::Result<Flow> {
        let mut buf = [0u8; 64 * 1024];
        loop {
            // SAFETY: valid buffer of the given length.
            let n = unsafe { libc::read(self.ch.read, buf.as_mut_ptr().cast(), buf.len()) };
            if n == 0 {
                return Ok(Flow::Gone);
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(Flow::Continue),
                    Some(libc::EINTR) => continue,
                    Some(libc::EIO | libc::ECONNRESET | libc::ENOTCONN) => return Ok(Flow::Gone),
                    _ => return Err(e),
                }
            }
            self.served = true;
            self.note_connected();
            self.decoder.push(&buf[..n as usize]);
            self.process_frames();
            if self.pending_out() >= OUT_HIGH_WATER {
                return Ok(Flow::Continue);
            }
        }
    }

    fn flush(&mut self) -> io::Result<Flow> {
        while self.out_pos < self.out.len() {
            let rest = &self.out[self.out_pos..];
            // SAFETY: valid buffer of the given length.
            let n = unsafe { libc::write(self.ch.write, rest.as_ptr().cast(), rest.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(Flow::Continue),
                    Some(libc::EINTR) => continue,
                    Some(libc::EPIPE | libc::EIO | libc::ECONNRESET) => return Ok(Flow::Gone),
                    _ => return Err(e),
                }
            }
            self.out_pos += n as usize;
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(Flow::Continue)
    }

    fn collect_results(&mut self) {
        let mut sink = [0u8; 256];
        // SAFETY: valid buffer; the pipe is non-blocking.
        while unsafe {
            libc::read(
                self.wake_r.as_raw_fd(),
                sink.as_mut_ptr().cast(),
                sink.len(),
            )
        } > 0
        {}
        while let Ok(done) = self.rx.try_recv() {
            let resp = match done.outcome {
                Outcome::Exec(r) => {
                    self.running = self.running.saturating_sub(1);
                    r
                }
                Outcome::Profile(r) => r,
                Outcome::Kallsyms(r) => {
                    self.running = self.running.saturating_sub(1);
                    match r {
                        Ok(snap) if done.epoch == self.epoch => {
                            let first = kallsyms::slice(&snap, 0);
                            self.streams.entry(done.stream).or_default().kallsyms = Some(snap);
                            first
                        }
                        Ok(_) => continue,
                        Err(e) => e,
                    }
                }
            };
            if done.epoch == self.epoch {
                self.enqueue(done.stream, done.id, resp);
            }
        }
    }

    fn enqueue(&mut self, stream: u32, id: u64, resp: Response) {
        let frame = encode_response_on(stream, id, &resp).or_else(|e| {
            encode_response_on(
                stream,
                id,
                &Response::Error {
                    kind: ErrorKind::TooLarge,
                    message: cut(
                        format!("answer could not be encoded: {e}"),
                        MAX_ERROR_MESSAGE,
                    ),
                },
            )
        });
        match frame {
            Ok(f) => self.out.extend_from_slice(&f),
            Err(e) => log!("dropping answer to request {id}: {e}"),
        }
    }

    fn process_frames(&mut self) {
        loop {
            match self.decoder.next_request() {
                Ok(Some(env)) => self.dispatch(env),
                Ok(None) => return,
                Err(ProtocolError::BadMessage {
                    id,
                    type_name,
                    reason,
                }) => {
                    self.bad_frame(format_args!("invalid {type_name} request {id}: {reason}"));
                    // The stream of a bad message is unknown: stream 0, and
                    // the broker routes by id.
                    self.enqueue(
                        0,
                        id,
                        Response::Error {
                            kind: ErrorKind::BadRequest,
                            message: cut(
                                format!("invalid {type_name}: {reason}"),
                                MAX_ERROR_MESSAGE,
                            ),
                        },
                    );
                }
                Err(e) => self.bad_frame(format_args!("{e}")),
            }
        }
    }

    fn bad_frame(&mut self, what: std::fmt::Arguments<'_>) {
        self.bad_frames += 1;
        if self.bad_frames <= MAX_LOGGED_BAD_FRAMES {
            log!("{what}");
        }
    }

    fn capabilities(&self) -> Vec<String> {
        let mut caps = vec![capability::PING.to_string()];
        if self.policy.allow_exec {
            caps.push(capability::EXEC.to_string());
        }
        if self.policy.allow_exec || self.policy.allow_write {
            caps.push(capability::PUT_FILE.to_string());
        }
        caps.push(capability::PROFILE.to_string());
        caps.push(capability::KALLSYMS.to_string());
        caps.push(capability::STREAMS.to_string());
        caps
    }

    fn dispatch(&mut self, env: Envelope<Request>) {
        let id = env.id;
        let stream = env.stream;
        let resp = match env.msg {
            Request::Hello {
                nonce,
                host_version,
            } => {
                log!("hello from host version {host_version} (protocol {})", env.v);
                let (kernel, hostname) = sysinfo::uname();
                Response::Hello(AgentHello {
                    protocol: PROTOCOL_VERSION,
                    agent_version: env!("CARGO_PKG_VERSION").to_string(),
                    kernel: cut(kernel, MAX_STRING),
                    hostname: cut(hostname, MAX_STRING),
                    cpus: sysinfo::online_cpus(),
                    mem_bytes: sysinfo::mem_total(std::path::Path::new("/proc")),
                    capabilities: self.capabilities(),
                    nonce,
                })
            }
            Request::Ping { seq } => Response::Pong { seq },
            Request::Exec {
                argv,
                stdin,
                timeout_ms,
                max_output,
            } => {
                if !self.policy.allow_exec {
                    Response::Error {
                        kind: ErrorKind::Denied,
                        message: "exec is disabled in this agent: start it with --allow-exec".into(),
                    }
                } else if self.running >= MAX_RUNNING_EXECS {
                    Response::Error {
                        kind: ErrorKind::Busy,
                        message: format!("{MAX_RUNNING_EXECS} commands are already running"),
                    }
                } else {
                    let max = max_output.map_or(MAX_EXEC_OUTPUT, |m| m as usize);
                    self.spawn_exec(stream, id, argv, stdin, timeout_ms, max);
                    return;
                }
            }
            Request::PutFile {
                path,
                mode,
                offset,
                data,
                last,
            } => {
                if self.policy.allow_exec || self.policy.allow_write {
                    self.streams
                        .entry(stream)
                        .or_default()
                        .puts
                        .chunk(&path, mode, offset, &data, last)
                } else {
                    Response::Error {
                        kind: ErrorKind::Denied,
                        message: "writing files is disabled in this agent: start it with --allow-write or --allow-exec".into(),
                    }
                }
            }
            Request::ProfileStart {
                events,
                frequency,
                callchain,
                budget_ppm,
            } => {
                let running = |st: &StreamState| st.profile.as_ref().is_some_and(|p| !p.finished());
                let sessions = self.streams.values().filter(|st| running(st)).count();
                if self.streams.get(&stream).is_some_and(running) {
                    Response::Error {
                        kind: ErrorKind::Busy,
                        message: "a profiling session is already running for this client: send profile_stop first"
                            .into(),
                    }
                } else if sessions >= MAX_PROFILE_SESSIONS {
                    Response::Error {
                        kind: ErrorKind::Busy,
                        message: format!(
                            "{sessions} profiling sessions of other host clients are running (at most {MAX_PROFILE_SESSIONS} at once)"
                        ),
                    }
                } else {
                    let cfg = profile::Config {
                        events,
                        frequency,
                        callchain,
                        budget: budget_ppm.map(|b| f64::from(b) / 1e6),
                    };
                    match Session::start(id, cfg, self.reply_fn(stream)) {
                        Ok(s) => {
                            self.streams.entry(stream).or_default().profile = Some(s);
                            return;
                        }
                        Err(e) => Response::Error {
                            kind: ErrorKind::Io,
                            message: format!("cannot start the profiling thread: {e}"),
                        },
                    }
                }
            }
            Request::ProfilePoll {} | Request::ProfileStop {} => {
                let stop = matches!(env.msg, Request::ProfileStop {});
                let sent = match self.streams.get(&stream).and_then(|st| st.profile.as_ref()) {
                    Some(p) if !p.finished() => {
                        if stop {
                            p.stop(id)
                        } else {
                            p.poll(id)
                        }
                    }
                    _ => false,
                };
                if sent {
                    return;
                }
                Response::Error {
                    kind: ErrorKind::NotRunning,
                    message: "no profiling session is running: send profile_start first".into(),
                }
            }
            Request::GetKallsyms { offset: 0 } => {
                if self.running >= MAX_RUNNING_EXECS {
                    Response::Error {
                        kind: ErrorKind::Busy,
                        message: format!("{MAX_RUNNING_EXECS} requests are already running"),
                    }
                } else {
                    self.spawn_kallsyms(stream, id);
                    return;
                }
            }
            Request::GetKallsyms { offset } => match self
                .streams
                .get(&stream)
                .and_then(|st| st.kallsyms.as_ref())
            {
                Some(snap) => kallsyms::slice(snap, offset),
                None => Response::Error {
                    kind: ErrorKind::BadRequest,
                    message: "no kallsyms snapshot on this connection: start at offset 0".into(),
                },
            },
            Request::CloseStream {} => {
                if let Some(mut st) = self.streams.remove(&stream) {
                    st.close();
                }
                Response::StreamClosed {}
            }
            Request::Unknown { type_name } => Response::Error {
                kind: ErrorKind::Unsupported,
                message: format!(
                    "request type `{type_name}` is not supported by this agent (protocol {PROTOCOL_VERSION}, version {})",
                    env!("CARGO_PKG_VERSION")
                ),
            },
        };
        self.enqueue(stream, id, resp);
    }

    /// Sends a worker's answers to this connection's queue and wakes the loop.
    fn reply_fn(&self, stream: u32) -> profile::Reply {
        let tx = self.tx.clone();
        let wake = Arc::clone(&self.wake_w);
        let epoch = self.epoch;
        Box::new(move |id, resp| {
            let _ = tx.send(Done {
                epoch,
                stream,
                id,
                outcome: Outcome::Profile(resp),
            });
            wake_loop(&wake);
        })
    }

    fn spawn_kallsyms(&mut self, stream: u32, id: u64) {
        self.spawn_worker("kallsyms", stream, id, || {
            Outcome::Kallsyms(kallsyms::read(std::path::Path::new("/proc")).map(Arc::new))
        });
    }

    fn spawn_exec(
        &mut self,
        stream: u32,
        id: u64,
        argv: Vec<String>,
        stdin: Option<Vec<u8>>,
        timeout_ms: u64,
        max_output: usize,
    ) {
        log!("exec {argv:?} (timeout {timeout_ms} ms)");
        self.spawn_worker("exec", stream, id, move || {
            Outcome::Exec(exec::run(
                &argv,
                stdin,
                Duration::from_millis(timeout_ms),
                max_output,
            ))
        });
    }

    /// Run `work` on a named worker thread; its outcome comes back through
    /// the done channel (tagged with this connection's epoch) and wakes the
    /// loop. A thread that cannot start is answered with an io error.
    fn spawn_worker(
        &mut self,
        name: &str,
        stream: u32,
        id: u64,
        work: impl FnOnce() -> Outcome + Send + 'static,
    ) {
        self.running += 1;
        let tx = self.tx.clone();
        let wake = Arc::clone(&self.wake_w);
        let epoch = self.epoch;
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let outcome = work();
                let _ = tx.send(Done {
                    epoch,
                    stream,
                    id,
                    outcome,
                });
                wake_loop(&wake);
            });
        if let Err(e) = spawned {
            self.running -= 1;
            self.enqueue(
                stream,
                id,
                Response::Error {
                    kind: ErrorKind::Io,
                    message: format!("cannot start a worker thread: {e}"),
                },
            );
        }
    }
}
