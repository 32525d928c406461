//! The agent broker: one process per VM that owns the VM's agent channel
//! and relays for any number of host clients at once (a recording, a rolling
//! profile, `lab exec`, `lab cp`, `vmscope top`).
//!
//! QEMU's socket chardev takes one client at a time, and a virtio-serial
//! port is a single byte stream, so two tools cannot talk to one agent
//! directly. The broker connects to QEMU's socket once, says hello to the
//! agent, and listens on a socket of its own ([`broker_socket`]). Each host
//! client gets a *stream* number; the broker rewrites every request's id to
//! one unique on the channel and tags it with the client's stream, so the
//! agent (protocol 3, capability `streams`) keeps each client's profiling
//! session, file transfer and kallsyms snapshot apart, and the answers go
//! back to the client that asked with its own ids. Hellos go to the agent
//! too (a client learns whether the agent answers now) and come back with
//! the `broker` capability added.
//!
//! One client's failure costs only that client:
//! - garbage and oversize frames are skipped by the same bounded decoder the
//!   agent uses;
//! - a client that does not read its answers is disconnected once its
//!   queue holds [`MAX_QUEUED_BYTES`] or a write stalls for
//!   [`CLIENT_WRITE_TIMEOUT`];
//! - at most [`MAX_IN_FLIGHT`] requests per client wait for the agent;
//! - a client that hangs up or dies has its stream closed in the agent
//!   (`close_stream`: its profiling session stops, its transfer is removed).
//!
//! The broker exits when the VM's channel closes (the VM is gone; every
//! client then sees its connection end) or when no client has been
//! connected for [`BrokerOptions::idle_exit`]. Clients start it on demand
//! with [`connect`]: the first one spawns `vmscope __agent-broker` detached
//! (its own session, so it outlives the client), the others find its
//! socket. A lock file beside the socket keeps it to one broker per VM.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;
use vmscope_protocol::frame::{encode_frame, FrameDecoder, ENCODING_JSON};
use vmscope_protocol::{
    capability, encode_response_on, AgentClient, ErrorKind, ProtocolError, Request, Response,
    MAX_STREAMS,
};

/// The environment variable that names the agent socket to a starting broker.
pub const AGENT_ENV: &str = "VMSCOPE_BROKER_AGENT";

/// Requests one client may have waiting for the agent at once.
pub const MAX_IN_FLIGHT: usize = 256;
/// Answer bytes queued for one client before it is dropped as too slow.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// A write to a client that makes no progress for this long drops it.
pub const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A write to the agent channel that makes no progress for this long ends
/// the broker (the guest stopped reading its port).
const AGENT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the broker could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A file or socket operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The agent did not say hello.
    #[error("agent on {}: {source}", socket.display())]
    Agent {
        socket: PathBuf,
        #[source]
        source: ProtocolError,
    },
    /// No broker came up in time (and why, when it said).
    #[error("no agent broker for {} within {:.1} s{}", agent.display(), timeout.as_secs_f64(), log_tail(log).map(|l| format!(" (its log says: {l})")).unwrap_or_default())]
    NotStarted {
        agent: PathBuf,
        timeout: Duration,
        log: PathBuf,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BrokerError + 'a {
    move |source| BrokerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// How a broker runs.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// QEMU's end of the VM's agent channel.
    pub agent_socket: PathBuf,
    /// The broker's own socket (clients connect here).
    pub listen: PathBuf,
    /// Exit after this long with no client connected.
    pub idle_exit: Duration,
    /// How long the agent has to answer the broker's hello (the guest may
    /// still be booting).
    pub hello_timeout: Duration,
}

/// Directory of broker sockets: `$VMSCOPE_BROKER_DIR`, else
/// `/run/vmscope/brokers` for root, else under `$XDG_RUNTIME_DIR` or `/tmp`.
pub fn broker_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VMSCOPE_BROKER_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/vmscope/brokers");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("vmscope/brokers"),
        None => PathBuf::from(format!("/tmp/vmscope-{uid}/brokers")),
    }
}

/// The broker socket for a VM's agent socket (a hash of its path, so any
/// VM gets one, whoever made its command line).
pub fn broker_socket(agent_socket: &Path) -> PathBuf {
    // FNV-1a: stable across runs and builds, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in agent_socket.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    broker_dir().join(format!("{h:016x}.sock"))
}

fn sibling(p: &Path, ext: &str) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(ext);
    PathBuf::from(s)
}

/// Last line of a broker's log, if any, without its time stamp and name
/// (`[1795874457.720] vmscope agent broker: `): what a message quotes.
fn log_tail(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| {
        let l = match (l.starts_with('['), l.find("] ")) {
            (true, Some(i)) => &l[i + 2..],
            _ => l,
        };
        l.strip_prefix("vmscope agent broker: ")
            .unwrap_or(l)
            .to_string()
    })
}

/// A connection to the broker of the VM whose agent listens on
/// `agent_socket`, starting the broker when none runs. `launcher` is the
/// `vmscope` executable that runs `__agent-broker`; `None` connects to the
/// agent socket directly (one client at a time, as without a broker).
pub fn connect(
    agent_socket: &Path,
    launcher: Option<&Path>,
    timeout: Duration,
) -> Result<UnixStream, BrokerError> {
    let Some(exe) = launcher else {
        return UnixStream::connect(agent_socket)
            .map_err(io_err("cannot connect to", agent_socket));
    };
    let listen = broker_socket(agent_socket);
    if let Ok(s) = UnixStream::connect(&listen) {
        return Ok(s);
    }
    // QEMU's socket must exist before a broker is worth starting, and be
    // one this user may connect to (connect(2) needs write permission on
    // it): a broker started for a socket owned by another user would only
    // fail in its log.
    if let Err(e) = std::fs::metadata(agent_socket).and_then(|_| writable(agent_socket)) {
        return Err(io_err("cannot connect to", agent_socket)(e));
    }
    let dir = broker_dir();
    std::fs::create_dir_all(&dir).map_err(io_err("cannot create", &dir))?;
    let log = sibling(&listen, ".log");
    spawn_detached(exe, agent_socket, &listen, &log).map_err(io_err("cannot start", exe))?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = UnixStream::connect(&listen) {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            return Err(BrokerError::NotStarted {
                agent: agent_socket.to_path_buf(),
                timeout,
                log,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this process (its effective ids) may write `path`: what
/// connect(2) on a Unix socket asks. Root passes unless the file system
/// says otherwise.
fn writable(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
    let r = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The `vmscope` executable to start brokers with: `$VMSCOPE_BIN`, else
/// this process's executable when it is `vmscope`, else `vmscope` beside it
/// or on `$PATH`; `None` when there is none (callers then connect directly).
pub fn launcher() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VMSCOPE_BIN") {
        return Some(PathBuf::from(p));
    }
    let me = std::env::current_exe().ok()?;
    if me.file_name().is_some_and(|n| n == "vmscope") {
        return Some(me);
    }
    let beside = me.parent().map(|d| d.join("vmscope"));
    if let Some(b) = beside.filter(|b| b.is_file()) {
        return Some(b);
    }
    // A test binary in target/*/deps: the binary is one level up.
    let up = me
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("vmscope"));
    if let Some(b) = up.filter(|b| b.is_file()) {
        return Some(b);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("vmscope"))
            .find(|f| f.is_file())
    })
}

/// Starts `exe __agent-broker LISTEN` (the agent socket in
/// `$VMSCOPE_BROKER_AGENT`, so the broker's command line never matches
/// what tools look for in a VM's command line, such as a lab's run
/// directory) in its own session, reparented to init (double fork), its
/// output in `log`.
fn spawn_detached(exe: &Path, agent: &Path, listen: &Path, log: &Path) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let err = out.try_clone()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("__agent-broker")
        .arg(listen)
        .env(AGENT_ENV, agent)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: only async-signal-safe calls (close_range, setsid, fork, _exit)
    // between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Nothing the client inherited (a lock held by `flock`, a test
            // harness's pipes) lives on in the broker, which outlives it.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            }
        });
    }
    let mut child = cmd.spawn()?;
    let _ = child.wait();
    Ok(())
}

/// What one client connection owns in the broker.
struct Client {
    /// Its answers, framed, with the bytes they hold.
    queue: SyncSender<Vec<u8>>,
    queued: Arc<AtomicU64>,
    /// Requests waiting for the agent.
    in_flight: usize,
    /// Shut down when dropped or too slow.
    sock: UnixStream,
}

/// Routing shared by the broker's threads.
struct Router {
    /// Broker id → (stream, client's own id).
    routes: HashMap<u64, (u32, u64)>,
    clients: HashMap<u32, Client>,
    next_id: u64,
    /// When the last client left (the idle clock).
    last_seen: Instant,
}

struct Shared {
    router: Mutex<Router>,
    /// The write half of the agent channel.
    agent: Mutex<UnixStream>,
    /// The agent keeps per-stream state (protocol 3).
    streams: bool,
    /// Answers that routed nowhere (their client left) or did not parse.
    dropped: AtomicU64,
    /// The agent channel closed: the VM is gone.
    gone: std::sync::atomic::AtomicBool,
    /// Write end of the accept loop's wake-up pipe: a byte here makes the
    /// loop look at its exit conditions now (a client left, the VM is gone).
    wake: UnixStream,
}

impl Shared {
    /// Wakes the accept loop (see [`Shared::wake`]). Never blocks: a full
    /// pipe already holds a wake-up.
    fn wake_accept_loop(&self) {
        let _ = (&self.wake).write(&[1]);
    }
}

fn log(msg: std::fmt::Arguments<'_>) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    eprintln!("[{t:.3}] vmscope agent broker: {msg}");
}

macro_rules! blog {
    ($($a:tt)*) => { log(format_args!($($a)*)) };
}

/// Runs a broker until the VM's channel closes or it stays idle.
pub fn serve(opts: &BrokerOptions) -> Result<(), BrokerError> {
    let lock_path = sibling(&opts.listen, ".lock");
    if let Some(parent) = opts.listen.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
    }
    // The lock file is removed by the broker that holds it when it exits;
    // one that was removed between our open and our flock is not the lock
    // any more, so we take it again (the usual unlink-safe flock).
    let lock = loop {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err("cannot open", &lock_path))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } != 0
        {
            blog!("another broker serves {}", opts.agent_socket.display());
            return Ok(());
        }
        use std::os::unix::fs::MetadataExt;
        let held = lock
            .metadata()
            .map_err(io_err("cannot examine", &lock_path))?;
        match std::fs::metadata(&lock_path) {
            Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => break lock,
            _ => continue,
        }
    };
    let result = serve_locked(opts);
    // Nothing stays behind a broker that ended as it should (idle, or its
    // VM gone): its log only matters when it failed. The lock file goes
    // while it is still held (see the loop above).
    if result.is_ok() {
        let _ = std::fs::remove_file(sibling(&opts.listen, ".log"));
    }
    let _ = std::fs::remove_file(&lock_path);
    drop(lock);
    result
}

/// [`serve`] once this broker holds the lock.
fn serve_locked(opts: &BrokerOptions) -> Result<(), BrokerError> {
    // A socket file left by a broker that died is stale: we hold the lock.
    let _ = std::fs::remove_file(&opts.listen);
    let agent = UnixStream::connect(&opts.agent_socket)
        .map_err(io_err("cannot connect to", &opts.agent_socket))?;
    let (client, hello) =
        AgentClient::connect(agent, opts.hello_timeout).map_err(|source| BrokerError::Agent {
            socket: opts.agent_socket.clone(),
            source,
        })?;
    let agent = client.into_inner();
    agent
        .set_read_timeout(None)
        .map_err(io_err("cannot configure", &opts.agent_socket))?;
    agent
        .set_write_timeout(Some(AGENT_WRITE_TIMEOUT))
        .map_err(io_err("cannot configure", &opts.agent_socket))?;
    let streams = hello.capabilities.iter().any(|c| c == capability::STREAMS);
    blog!(
        "relaying for the agent on {} (protocol {}, {}), listening on {}",
        opts.agent_socket.display(),
        hello.protocol,
        if streams {
            "per-client streams"
        } else {
            "no streams: profiling sessions and transfers are shared"
        },
        opts.listen.display()
    );
    // SAFETY: umask has no preconditions; the old mask is restored below.
    let old = unsafe { libc::umask(0o077) };
    let listener = UnixListener::bind(&opts.listen);
    // SAFETY: restoring the process's umask.
    unsafe { libc::umask(old) };
    let listener = listener.map_err(io_err("cannot listen on", &opts.listen))?;
    let reader = agent
        .try_clone()
        .map_err(io_err("cannot configure", &opts.agent_socket))?;
    let (wake, woken) =
        UnixStream::pair().map_err(io_err("cannot make a wake-up pipe for", &opts.listen))?;
    for s in [&wake, &woken] {
        s.set_nonblocking(true)
            .map_err(io_err("cannot configure", &opts.listen))?;
    }
    let shared = Arc::new(Shared {
        router: Mutex::new(Router {
            routes: HashMap::new(),
            clients: HashMap::new(),
            next_id: 1,
            last_seen: Instant::now(),
        }),
        agent: Mutex::new(agent),
        streams,
        dropped: AtomicU64::new(0),
        gone: std::sync::atomic::AtomicBool::new(false),
        wake,
    });
    {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("agent-reader".into())
            .spawn(move || agent_reader(reader, &shared))
            .map_err(io_err("cannot start a thread for", &opts.agent_socket))?;
    }
    listener
        .set_nonblocking(true)
        .map_err(io_err("cannot configure", &opts.listen))?;
    let result = accept_loop(&listener, &woken, &shared, opts);
    let _ = std::fs::remove_file(&opts.listen);
    result
}

/// Longest wait of the accept loop while clients are connected. Their
/// leaving and the VM going wake it at once (the wake-up pipe); this only
/// bounds the cost of a wake-up that never came.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);

/// Waits until `listener` has a connection to accept, `woken` has a
/// wake-up byte (drained here), or `most` passes. poll(2) on both rather
/// than a timed loop: one broker runs per VM, and with clients connected a
/// broker's main thread sleeps until something happens instead of waking
/// 5 times a second (bench/many-vms: 32 brokers' wake-ups were 1 % of a
/// CPU).
fn wait_readable(listener: &UnixListener, woken: &UnixStream, most: Duration) {
    use std::os::fd::AsRawFd;
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: woken.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // Rounded up, so an idle deadline 0.4 ms away does not spin.
    let ms = most
        .as_micros()
        .div_ceil(1000)
        .min(libc::c_int::MAX as u128) as libc::c_int;
    // SAFETY: two valid pollfds for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if fds[1].revents != 0 {
        let mut sink = [0u8; 64];
        while matches!((&*woken).read(&mut sink), Ok(n) if n > 0) {}
    }
}

fn accept_loop(
    listener: &UnixListener,
    woken: &UnixStream,
    shared: &Arc<Shared>,
    opts: &BrokerOptions,
) -> Result<(), BrokerError> {
    loop {
        let wait = match listener.accept() {
            Ok((sock, _)) => {
                if let Err(e) = add_client(sock, shared) {
                    blog!("cannot take a client: {e}");
                }
                None
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(()),
            Err(e) => return Err(io_err("cannot accept on", &opts.listen)(e)),
        };
        let most = {
            let r = shared
                .router
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let idle = r.last_seen.elapsed();
            if r.clients.is_empty() && idle >= opts.idle_exit {
                blog!("no client for {:?}: exiting", opts.idle_exit);
                return Ok(());
            }
            if shared.gone.load(Ordering::Relaxed) {
                blog!("the agent channel closed (the VM stopped, or its agent was restarted): exiting");
                return Ok(());
            }
            // No client: until the idle deadline. Clients: until one
            // leaves (drop_client wakes the loop) or the VM goes.
            if r.clients.is_empty() {
                opts.idle_exit - idle
            } else {
                ACCEPT_WAIT
            }
        };
        // A wake-up written after the checks above is still in the pipe:
        // poll returns at once and the loop checks again.
        if wait.is_some() {
            wait_readable(listener, woken, most);
        }
    }
}

fn add_client(sock: UnixStream, shared: &Arc<Shared>) -> io::Result<()> {
    sock.set_nonblocking(false)?;
    sock.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT))?;
    let stream = {
        let mut r = shared
            .router
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(stream) = (1..MAX_STREAMS).find(|s| !r.clients.contains_key(s)) else {
            return Err(io::Error::other(format!(
                "{} clients already connected",
                MAX_STREAMS - 1
            )));
        };
        let (tx, rx) = sync_channel::<Vec<u8>>(4096);
        let queued = Arc::new(AtomicU64::new(0));
        r.clients.insert(
            stream,
            Client {
                queue: tx,
                queued: Arc::clone(&queued),
                in_flight: 0,
                sock: sock.try_clone()?,
            },
        );
        let w = sock.try_clone()?;
        std::thread::Builder::new()
            .name(format!("client-{stream}-w"))
            .spawn(move || client_writer(w, &rx, &queued))?;
        stream
    };
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(format!("client-{stream}-r"))
        .spawn(move || client_reader(sock, stream, &shared))?;
    Ok(())
}

/// Forwards one client's requests to the agent until it hangs up.
fn client_reader(mut sock: UnixStream, stream: u32, shared: &Shared) {
    let mut dec = FrameDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    'conn: loop {
        let n = match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        dec.push(&buf[..n]);
        loop {
            match dec.next_frame() {
                Ok(Some(frame)) => {
                    if !forward_request(stream, &frame.body, frame.encoding, shared) {
                        break 'conn;
                    }
                }
                Ok(None) => break,
                // A bad frame of this client: skipped, like the agent does.
                Err(_) => continue,
            }
        }
    }
    drop_client(stream, shared);
}

/// One client frame: hellos answered here, the rest relayed with a unique
/// id and the client's stream. False when the agent channel is gone.
fn forward_request(stream: u32, body: &[u8], encoding: u8, shared: &Shared) -> bool {
    if encoding != ENCODING_JSON {
        return true;
    }
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(body) else {
        return true;
    };
    let Some(id) = obj.get("id").and_then(Value::as_u64) else {
        return true;
    };
    // Streams belong to the broker: a client cannot close another's.
    if obj.get("type").and_then(Value::as_str) == Some("close_stream") {
        answer(stream, id, &Response::StreamClosed {}, shared);
        return true;
    }
    let broker_id = {
        let mut r = shared
            .router
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(c) = r.clients.get_mut(&stream) else {
            return true;
        };
        if c.in_flight >= MAX_IN_FLIGHT {
            drop(r);
            answer(
                stream,
                id,
                &Response::Error {
                    kind: ErrorKind::Busy,
                    message: format!(
                        "{MAX_IN_FLIGHT} requests of this client already wait for the agent"
                    ),
                },
                shared,
            );
            return true;
        }
        c.in_flight += 1;
        let bid = r.next_id;
        r.next_id += 1;
        r.routes.insert(bid, (stream, id));
        bid
    };
    obj.insert("id".into(), Value::from(broker_id));
    if shared.streams {
        obj.insert("stream".into(), Value::from(stream));
    } else {
        obj.remove("stream");
    }
    let Ok(body) = serde_json::to_vec(&Value::Object(obj)) else {
        return true;
    };
    let Ok(frame) = encode_frame(ENCODING_JSON, &body) else {
        return true;
    };
    let mut agent = shared
        .agent
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Err(e) = agent.write_all(&frame) {
        blog!("writing to the agent channel failed: {e}");
        shared.gone.store(true, Ordering::Relaxed);
        shared.wake_accept_loop();
        let _ = agent.shutdown(std::net::Shutdown::Both);
        return false;
    }
    true
}

/// An answer made by the broker itself.
fn answer(stream: u32, id: u64, resp: &Response, shared: &Shared) {
    if let Ok(frame) = encode_response_on(0, id, resp) {
        deliver(stream, frame, shared);
    }
}

/// Queue a framed answer for a client; a client over its budget is dropped.
fn deliver(stream: u32, frame: Vec<u8>, shared: &Shared) {
    let r = shared
        .router
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(c) = r.clients.get(&stream) else {
        return;
    };
    let len = frame.len() as u64;
    let over = c.queued.load(Ordering::Relaxed) + len > MAX_QUEUED_BYTES as u64;
    let sent = !over
        && match c.queue.try_send(frame) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        };
    if sent {
        c.queued.fetch_add(len, Ordering::Relaxed);
    } else {
        blog!("client {stream} does not read its answers: dropping it");
        if let Some(c) = r.clients.get(&stream) {
            let _ = c.sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Writes a client's queued answers; ends when the client is dropped.
fn client_writer(mut sock: UnixStream, rx: &Receiver<Vec<u8>>, queued: &AtomicU64) {
    while let Ok(frame) = rx.recv() {
        let len = frame.len() as u64;
        if sock.write_all(&frame).is_err() {
            // Stalled past the write timeout, or gone.
            let _ = sock.shutdown(std::net::Shutdown::Both);
            break;
        }
        queued.fetch_sub(len, Ordering::Relaxed);
    }
}

/// A client is gone: forget its routes, close its stream in the agent.
fn drop_client(stream: u32, shared: &Shared) {
    let close_id = {
        let mut r = shared
            .router
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = r.clients.remove(&stream) {
            let _ = c.sock.shutdown(std::net::Shutdown::Both);
        }
        r.routes.retain(|_, (s, _)| *s != stream);
        r.last_seen = Instant::now();
        let id = r.next_id;
        r.next_id += 1;
        id
    };
    // The accept loop starts the idle clock now, not at its next poll.
    shared.wake_accept_loop();
    if shared.streams {
        if let Ok(frame) =
            vmscope_protocol::encode_request_on(stream, close_id, &Request::CloseStream {})
        {
            let mut agent = shared
                .agent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = agent.write_all(&frame);
        }
    }
}

/// Routes the agent's answers to the clients that asked.
fn agent_reader(mut agent: UnixStream, shared: &Shared) {
    let mut dec = FrameDecoder::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match agent.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        dec.push(&buf[..n]);
        loop {
            match dec.next_frame() {
                Ok(Some(frame)) => route_answer(&frame.body, shared),
                Ok(None) => break,
                Err(_) => continue,
            }
        }
    }
    shared.gone.store(true, Ordering::Relaxed);
    shared.wake_accept_loop();
    // Every client learns the channel is gone: its connection ends.
    let r = shared
        .router
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for c in r.clients.values() {
        let _ = c.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// An answer's top-level fields, each value kept as the agent's text.
/// The broker only rewrites `id` and drops `stream`, so the rows of a
/// `profile_data` answer (nearly all of its bytes) are checked as JSON and
/// copied, never built into a `Value` tree and written out again: that
/// round trip was most of a broker's CPU with many active VMs
/// (bench/many-vms). Keys come out sorted (a `BTreeMap`), as `Value` wrote
/// them; a repeated key keeps its last value, as in `Value`.
type RawObject<'a> = std::collections::BTreeMap<String, &'a RawValue>;

fn route_answer(body: &[u8], shared: &Shared) {
    let Ok(mut obj) = serde_json::from_slice::<RawObject<'_>>(body) else {
        shared.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    // As `Value::as_u64`: a non-negative integer, not `1.0` nor a string.
    let Some(bid) = obj
        .get("id")
        .and_then(|v| serde_json::from_str::<u64>(v.get()).ok())
    else {
        shared.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let route = {
        let mut r = shared
            .router
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let route = r.routes.get(&bid).copied();
        // Profile polls may be answered once; every request is answered
        // exactly once by the agent.
        if let Some((stream, _)) = route {
            r.routes.remove(&bid);
            if let Some(c) = r.clients.get_mut(&stream) {
                c.in_flight = c.in_flight.saturating_sub(1);
            }
        }
        route
    };
    let Some((stream, id)) = route else {
        shared.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let is_hello = obj
        .get("type")
        .and_then(|t| serde_json::from_str::<String>(t.get()).ok())
        .is_some_and(|t| t == "hello");
    let body = if is_hello {
        hello_answer(body, id)
    } else {
        let Ok(id) = serde_json::value::to_raw_value(&id) else {
            return;
        };
        obj.insert("id".into(), &id);
        obj.remove("stream");
        serde_json::to_vec(&obj).ok()
    };
    if let Some(frame) = body.and_then(|b| encode_frame(ENCODING_JSON, &b).ok()) {
        deliver(stream, frame, shared);
    }
}

/// A hello goes to the agent (so a client learns whether the agent answers
/// now) and comes back with the client's `id`, no `stream`, and saying a
/// broker relays it. Rare and small: edited as a `Value`.
fn hello_answer(body: &[u8], id: u64) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    obj.insert("id".into(), Value::from(id));
    obj.remove("stream");
    if let Some(Value::Array(caps)) = obj.get_mut("capabilities") {
        if !caps.iter().any(|c| c == capability::BROKER) {
            caps.push(Value::from(capability::BROKER));
        }
    }
    serde_json::to_vec(&Value::Object(obj)).ok()
}

#[cfg(test)]
mod tests;
