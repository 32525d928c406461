//! The network engine of `vmscope bench net` (menon2005 §6.1-6.2), the
//! same code on the host and inside guests (`vmscope-agent net`):
//!
//! - the **sender** opens `streams` TCP connections and on each one
//!   `sendfile()`s a cached 64 KiB file in a loop (the paper's sender:
//!   zero-copy from the page cache) until the deadline, then closes;
//! - the **receiver** listens, accepts `streams` connections and `recv()`s
//!   each into a user buffer of `buf` bytes until the sender closes (the
//!   paper's receiver, whose buffer size Figs 1-2 sweep).
//!
//! Each side reports its bytes, its wall time and its own CPU time
//! (`getrusage(RUSAGE_SELF)`, every thread of the run). The receiver's wall
//! time runs from the first byte to the last one of any stream, so its
//! bytes / wall is the throughput the paper reports (the receivers'
//! aggregate).
//!
//! [`listening`] reads `/proc/net/tcp{,6}` text: a caller waits for a
//! receiver (or a peer tool's server) to listen without connecting to it.

use serde::{Deserialize, Serialize};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// How long a receiving stream waits for the next bytes before it gives
/// the sender up.
pub const RECV_IDLE: Duration = Duration::from_secs(30);

/// Size of the file the sender sends in a loop (menon2005: "a cached 64 KB
/// file").
pub const SEND_FILE_SIZE: u64 = 64 << 10;

/// Largest receive buffer a run accepts.
pub const MAX_RECV_BUF: u64 = 64 << 20;

/// Most streams (connections) of one run.
pub const MAX_STREAMS: u32 = 256;

/// Errors of the network engine; each names the address.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The port is taken by another listener.
    #[error("port {port} on {addr} is in use by another program (choose another with --port)")]
    PortInUse { addr: String, port: u16 },
    /// Binding, connecting, sending or receiving failed.
    #[error("{op} {addr}: {source}")]
    Io {
        op: &'static str,
        addr: String,
        source: io::Error,
    },
    /// No (or not every) sender connected in time.
    #[error("{addr}: {got} of {want} connections arrived within {secs:.0} s")]
    Accept {
        addr: String,
        got: u32,
        want: u32,
        secs: f64,
    },
    /// The run was asked for something it cannot do.
    #[error("{0}")]
    Invalid(String),
}

/// What one side of a run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetRun {
    /// `send` or `recv`.
    pub role: String,
    /// Bytes sent or received, every stream together.
    pub bytes: u64,
    /// Sender: from every stream connected to the last close; receiver:
    /// from the first byte to the last, seconds.
    pub wall_s: f64,
    /// CPU time of the whole run (every thread), seconds.
    pub user_s: f64,
    pub sys_s: f64,
    pub streams: u32,
    /// Receiver: the user buffer each `recv()` fills; sender: the file size.
    pub buf: u64,
    /// `sendfile()` or `recv()` calls.
    pub calls: u64,
}

impl NetRun {
    pub fn bytes_per_s(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.bytes as f64 / self.wall_s
        } else {
            0.0
        }
    }

    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.sys_s
    }
}

/// A sender run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSpec {
    pub to: SocketAddr,
    pub streams: u32,
    pub duration: Duration,
    /// Keep retrying refused connections this long (the receiver may not
    /// listen yet).
    pub connect_timeout: Duration,
}

/// A receiver run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvSpec {
    pub listen: SocketAddr,
    pub streams: u32,
    pub buf: u64,
    /// Give up when not every stream connected in this long.
    pub accept_timeout: Duration,
    /// Give up on a stream that sent nothing (no data, no FIN) this long
    /// ([`RECV_IDLE`] for a benchmark).
    pub idle: Duration,
}

/// User and system CPU time of this process, seconds.
pub fn process_cpu() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer has no other preconditions.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    if rc != 0 {
        return (0.0, 0.0);
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

fn io_err(op: &'static str, addr: impl std::fmt::Display) -> impl FnOnce(io::Error) -> NetError {
    let addr = addr.to_string();
    move |source| NetError::Io { op, addr, source }
}

/// Binds a listener on `addr`; a port in use is [`NetError::PortInUse`].
pub fn bind(addr: SocketAddr) -> Result<TcpListener, NetError> {
    TcpListener::bind(addr).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            NetError::PortInUse {
                addr: addr.ip().to_string(),
                port: addr.port(),
            }
        } else {
            io_err("bind", addr)(e)
        }
    })
}

/// Whether `addr` can be listened on now (bound and released at once).
pub fn check_port(addr: SocketAddr) -> Result<(), NetError> {
    bind(addr).map(drop)
}

/// The sendfile source: a 64 KiB file of a fixed pattern, read once so
/// it sits in the page cache, unlinked (the descriptor keeps it).
fn cached_file() -> io::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    let dir = std::env::temp_dir();
    let path = dir.join(format!("vmscope-net-{}.dat", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let _ = std::fs::remove_file(&path);
    let data: Vec<u8> = (0..SEND_FILE_SIZE).map(|i| (i % 251) as u8).collect();
    f.write_all(&data)?;
    f.flush()?;
    f.rewind()?;
    let mut back = Vec::with_capacity(data.len());
    f.read_to_end(&mut back)?;
    Ok(f)
}

/// Connects, retrying refused connections until `deadline`.
fn connect(to: SocketAddr, deadline: Instant) -> Result<TcpStream, NetError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&to, left.max(Duration::from_millis(100))) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut
                ) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(io_err("connect to", to)(e)),
        }
    }
}

/// The sender: `streams` connections, each `sendfile()`ing the cached
/// 64 KiB file in a loop for `duration` (timed from the moment every
/// stream is connected), then closing.
pub fn send(spec: &SendSpec) -> Result<NetRun, NetError> {
    if spec.streams == 0 || spec.streams > MAX_STREAMS {
        return Err(NetError::Invalid(format!(
            "streams wants 1 to {MAX_STREAMS}, not {}",
            spec.streams
        )));
    }
    let file = Arc::new(cached_file().map_err(io_err("create the file to send in", "/tmp"))?);
    let deadline = Instant::now() + spec.connect_timeout;
    let mut socks = Vec::new();
    for _ in 0..spec.streams {
        socks.push(connect(spec.to, deadline)?);
    }
    let (u0, s0) = process_cpu();
    let start = Instant::now();
    let end = start + spec.duration;
    let barrier = Arc::new(Barrier::new(socks.len()));
    let handles: Vec<_> = socks
        .into_iter()
        .map(|sock| {
            let file = Arc::clone(&file);
            let barrier = Arc::clone(&barrier);
            let to = spec.to;
            std::thread::spawn(move || -> Result<(u64, u64), NetError> {
                barrier.wait();
                let (mut bytes, mut calls) = (0u64, 0u64);
                let mut off: libc::off_t = 0;
                while Instant::now() < end {
                    if off as u64 >= SEND_FILE_SIZE {
                        off = 0;
                    }
                    let want = (SEND_FILE_SIZE - off as u64) as usize;
                    // SAFETY: both descriptors are open for the call; `off`
                    // is ours.
                    let n = unsafe {
                        libc::sendfile(sock.as_raw_fd(), file.as_raw_fd(), &raw mut off, want)
                    };
                    calls += 1;
                    if n < 0 {
                        let e = io::Error::last_os_error();
                        if e.kind() == io::ErrorKind::Interrupted {
                            continue;
                        }
                        return Err(io_err("sendfile to", to)(e));
                    }
                    bytes += n as u64;
                }
                let _ = sock.shutdown(std::net::Shutdown::Write);
                // Wait for the receiver to close, so the bytes were taken.
                let mut sink = [0u8; 64];
                let _ = sock.set_read_timeout(Some(Duration::from_secs(30)));
                let _ = std::io::Read::read(&mut &sock, &mut sink);
                Ok((bytes, calls))
            })
        })
        .collect();
    let (mut bytes, mut calls) = (0, 0);
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok((b, c))) => {
                bytes += b;
                calls += c;
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(NetError::Invalid("a sender thread panicked".into()));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let wall_s = start.elapsed().as_secs_f64();
    let (u1, s1) = process_cpu();
    Ok(NetRun {
        role: "send".into(),
        bytes,
        wall_s,
        user_s: u1 - u0,
        sys_s: s1 - s0,
        streams: spec.streams,
        buf: SEND_FILE_SIZE,
        calls,
    })
}

/// One received stream: bytes, `recv()` calls, and the instants of its
/// first and last byte.
type StreamTally = (u64, u64, Option<(Instant, Instant)>);

/// Waits up to `timeout` for the listener to become readable (a
/// connection is waiting).
fn poll_accept(l: &TcpListener, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&raw mut pfd, 1, ms) > 0 }
}

/// The receiver on an already bound listener: accepts `streams`
/// connections, then `recv()`s each into a `buf`-byte user buffer until
/// its sender closes.
pub fn recv_on(listener: TcpListener, spec: &RecvSpec) -> Result<NetRun, NetError> {
    if spec.streams == 0 || spec.streams > MAX_STREAMS {
        return Err(NetError::Invalid(format!(
            "streams wants 1 to {MAX_STREAMS}, not {}",
            spec.streams
        )));
    }
    if spec.buf == 0 || spec.buf > MAX_RECV_BUF {
        return Err(NetError::Invalid(format!(
            "the receive buffer wants 1 byte to 64 MiB, not {}",
            spec.buf
        )));
    }
    let addr = spec.listen;
    let deadline = Instant::now() + spec.accept_timeout;
    let (u0, s0) = process_cpu();
    let mut handles = Vec::new();
    for got in 0..spec.streams {
        let left = deadline.saturating_duration_since(Instant::now());
        if !poll_accept(&listener, left) {
            return Err(NetError::Accept {
                addr: addr.to_string(),
                got,
                want: spec.streams,
                secs: spec.accept_timeout.as_secs_f64(),
            });
        }
        let (sock, _) = listener.accept().map_err(io_err("accept on", addr))?;
        // A sender whose VM stopped mid-stream (or whose NIC stopped
        // taking packets) sends neither data nor FIN: without a limit the
        // receiver, and the benchmark point, would wait forever.
        sock.set_read_timeout(Some(spec.idle))
            .map_err(io_err("set a receive timeout on", addr))?;
        let buf = spec.buf as usize;
        let idle = spec.idle;
        handles.push(std::thread::spawn(
            move || -> Result<StreamTally, NetError> {
                let mut b = vec![0u8; buf];
                let (mut bytes, mut calls) = (0u64, 0u64);
                let mut span: Option<(Instant, Instant)> = None;
                loop {
                    // SAFETY: `b` is ours and `buf` bytes long.
                    let n = unsafe { libc::recv(sock.as_raw_fd(), b.as_mut_ptr().cast(), buf, 0) };
                    calls += 1;
                    if n < 0 {
                        let e = io::Error::last_os_error();
                        if e.kind() == io::ErrorKind::Interrupted {
                            continue;
                        }
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) {
                            return Err(io_err("recv on", addr)(io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!(
                                    "no data for {} s after {bytes} bytes: the sender stopped \
                                     (its VM, or the VM's network)",
                                    idle.as_secs()
                                ),
                            )));
                        }
                        return Err(io_err("recv on", addr)(e));
                    }
                    if n == 0 {
                        break;
                    }
                    let now = Instant::now();
                    span = Some(span.map_or((now, now), |(a, _)| (a, now)));
                    bytes += n as u64;
                }
                Ok((bytes, calls, span))
            },
        ));
    }
    drop(listener);
    let (mut bytes, mut calls) = (0, 0);
    let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok((b, c, span))) => {
                bytes += b;
                calls += c;
                if let Some((a, z)) = span {
                    first = Some(first.map_or(a, |f| f.min(a)));
                    last = Some(last.map_or(z, |l| l.max(z)));
                }
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(NetError::Invalid("a receiver thread panicked".into()));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let (u1, s1) = process_cpu();
    Ok(NetRun {
        role: "recv".into(),
        bytes,
        wall_s: match (first, last) {
            (Some(a), Some(z)) => z.duration_since(a).as_secs_f64(),
            _ => 0.0,
        },
        user_s: u1 - u0,
        sys_s: s1 - s0,
        streams: spec.streams,
        buf: spec.buf,
        calls,
    })
}

/// The receiver: binds `spec.listen`, then [`recv_on`].
pub fn recv(spec: &RecvSpec) -> Result<NetRun, NetError> {
    let l = bind(spec.listen)?;
    recv_on(l, spec)
}

/// TCP ports in the LISTEN state in the text of `/proc/net/tcp` or
/// `/proc/net/tcp6`.
pub fn listening(proc_net_tcp: &str) -> Vec<u16> {
    let mut out: Vec<u16> = proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local_address rem_address st ...; LISTEN is 0A.
            if f.get(3) != Some(&"0A") {
                return None;
            }
            let port = f.get(1)?.rsplit_once(':')?.1;
            u16::from_str_radix(port, 16).ok()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `port` is listened on, from this host's `/proc/net/tcp{,6}`.
pub fn is_listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|p| {
        std::fs::read_to_string(p)
            .map(|t| listening(&t).contains(&port))
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    #[test]
    fn a_sender_that_goes_silent_is_given_up_after_the_idle_limit() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let rspec = RecvSpec {
            listen: addr,
            streams: 1,
            buf: 4096,
            accept_timeout: Duration::from_secs(20),
            idle: Duration::from_secs(2),
        };
        let r = std::thread::spawn(move || recv_on(listener, &rspec));
        // Ten bytes, then neither data nor FIN: a VM that stopped.
        let mut c = TcpStream::connect(addr).unwrap();
        std::io::Write::write_all(&mut c, b"0123456789").unwrap();
        let t = Instant::now();
        let e = r.join().unwrap().unwrap_err().to_string();
        drop(c);
        assert!(e.contains("no data for 2 s after 10 bytes"), "{e}");
        assert!(
            t.elapsed() >= Duration::from_millis(1900),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn sender_and_receiver_move_the_bytes_over_loopback() {
        let addr = free_addr();
        let rspec = RecvSpec {
            listen: addr,
            streams: 2,
            buf: 4096,
            accept_timeout: Duration::from_secs(20),
            idle: RECV_IDLE,
        };
        let listener = bind(addr).unwrap();
        let r = std::thread::spawn(move || recv_on(listener, &rspec));
        let s = send(&SendSpec {
            to: addr,
            streams: 2,
            duration: Duration::from_millis(300),
            connect_timeout: Duration::from_secs(5),
        })
        .unwrap();
        let r = r.join().unwrap().unwrap();
        assert_eq!((s.role.as_str(), r.role.as_str()), ("send", "recv"));
        assert_eq!(s.bytes, r.bytes, "every byte sent arrives");
        assert!(s.bytes > SEND_FILE_SIZE, "{s:?}");
        assert!(s.wall_s >= 0.3 && r.wall_s > 0.0 && r.wall_s <= s.wall_s + 1.0);
        assert!(r.calls >= r.bytes / 4096, "{r:?}");
        assert_eq!((r.streams, r.buf, s.buf), (2, 4096, SEND_FILE_SIZE));
        assert!(r.bytes_per_s() > 0.0 && r.cpu_s() >= 0.0);
    }

    #[test]
    fn a_port_in_use_and_a_silent_sender_are_said() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let e = check_port(addr).unwrap_err();
        assert!(matches!(e, NetError::PortInUse { port, .. } if port == addr.port()));
        assert!(e.to_string().contains("in use"), "{e}");
        drop(l);
        let e = recv(&RecvSpec {
            listen: addr,
            streams: 1,
            buf: 1024,
            accept_timeout: Duration::from_millis(200),
            idle: RECV_IDLE,
        })
        .unwrap_err();
        assert!(e.to_string().contains("0 of 1 connections"), "{e}");
        for bad in [0, MAX_STREAMS + 1] {
            let e = send(&SendSpec {
                to: addr,
                streams: bad,
                duration: Duration::from_millis(1),
                connect_timeout: Duration::from_millis(1),
            })
            .unwrap_err();
            assert!(e.to_string().contains("streams"), "{e}");
        }
        // Nobody listens: refused until the deadline, then the error.
        let e = send(&SendSpec {
            to: addr,
            streams: 1,
            duration: Duration::from_millis(1),
            connect_timeout: Duration::from_millis(200),
        })
        .unwrap_err();
        assert!(e.to_string().contains("connect to"), "{e}");
    }

    #[test]
    fn listening_ports_from_proc_net_tcp() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:0050 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1\n\
   2: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(listening(text), vec![80, 5201]);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(is_listening(l.local_addr().unwrap().port()));
    }
}
