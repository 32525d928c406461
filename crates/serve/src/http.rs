//! The HTTP/1.1 server of `vmscope serve`: one request per connection
//! (`Connection: close`), each connection read and answered on a thread of
//! its own, with read and write timeouts, a bound on the request head and on
//! the connections served at once.
//!
//! Hand-written instead of tiny_http (0.12), which served this crate
//! before: its connection pool can lose a wake-up when connections arrive
//! back to back, leaving a request queued behind connections whose clients
//! never send anything. CI saw it as a scrape unanswered for 5 s while three
//! silent clients and one that sent a byte every 300 ms held connections.
//! What `serve` needs (GET and HEAD, a path and a query, a body of known
//! length) is small enough to own.
//!
//! Slow, silent and hostile clients cost only themselves:
//! - a client has [`FIRST_BYTE_TIMEOUT`] to send its first byte (a scraper
//!   sends its request at once) and [`READ_TIMEOUT`] for the whole head;
//! - at [`MAX_CONNECTIONS`], a new connection closes the oldest one still
//!   waiting for its request head instead of being refused, so connections
//!   held open by any local user cannot keep a scrape out; one peer address
//!   other than loopback holds at most [`MAX_PER_PEER`];
//! - a TLS ClientHello or a request line without an HTTP version (HTTP/0.9)
//!   is answered 400 as soon as it is read, not after a timeout;
//! - when a limit bites it says so on stderr, at most once a minute.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest request head read (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// A client that has not sent its first byte after this long is dropped.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(5);
/// A client that has not sent its whole request head after this long is
/// dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A client that reads nothing for this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections open at once; past it the oldest still waiting for its head
/// is closed to make room (see the module docs).
const MAX_CONNECTIONS: usize = 256;
/// Connections one peer address (other than loopback) may hold at once;
/// past it the peer is told 503.
const MAX_PER_PEER: usize = 32;
/// How often the accept loop looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);
/// The least time between two log lines about a limit.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// A request: method and target (path with its query) as sent.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    pub target: String,
}

/// The connections open now: what the accept loop needs to make room.
#[derive(Default)]
struct Open {
    next: u64,
    /// id → (peer, a handle to close it, when it came, its head is read).
    conns: HashMap<u64, Conn>,
    per_peer: HashMap<IpAddr, usize>,
    last_log: Option<Instant>,
    /// Closed or refused since the last log line.
    unlogged: u64,
}

struct Conn {
    peer: IpAddr,
    stream: TcpStream,
    since: Instant,
    head_read: bool,
}

impl Open {
    /// Register a connection, making room first; `Err(answer)` when its peer
    /// holds too many already.
    fn admit(&mut self, stream: &TcpStream, peer: IpAddr) -> Result<u64, String> {
        let held = self.per_peer.get(&peer).copied().unwrap_or(0);
        if !peer.is_loopback() && held >= MAX_PER_PEER {
            self.log(format!(
                "{peer} holds {held} connections, the most one peer may: refused another"
            ));
            return Err(format!(
                "too many connections from {peer} (at most {MAX_PER_PEER})\n"
            ));
        }
        if self.conns.len() >= MAX_CONNECTIONS {
            // The oldest connection that has not sent its request head yet.
            let victim = self
                .conns
                .iter()
                .filter(|(_, c)| !c.head_read)
                .min_by_key(|(_, c)| c.since)
                .map(|(id, c)| (*id, c.peer));
            let Some((id, vpeer)) = victim else {
                self.log(format!(
                    "{MAX_CONNECTIONS} requests in progress: refused a new connection"
                ));
                return Err("too many requests in progress\n".into());
            };
            if let Some(c) = self.conns.get(&id) {
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
            }
            self.log(format!(
                "{MAX_CONNECTIONS} connections open: closed the oldest that had sent no request (from {vpeer}) to serve a new one"
            ));
        }
        let id = self.next;
        self.next += 1;
        let Ok(handle) = stream.try_clone() else {
            return Err("cannot serve this connection\n".into());
        };
        self.conns.insert(
            id,
            Conn {
                peer,
                stream: handle,
                since: Instant::now(),
                head_read: false,
            },
        );
        *self.per_peer.entry(peer).or_default() += 1;
        Ok(id)
    }

    fn head_read(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.head_read = true;
        }
    }

    fn close(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            if let Some(n) = self.per_peer.get_mut(&c.peer) {
                *n -= 1;
                if *n == 0 {
                    self.per_peer.remove(&c.peer);
                }
            }
        }
    }

    /// One line on stderr about a limit, at most once a [`LOG_EVERY`].
    fn log(&mut self, line: String) {
        self.unlogged += 1;
        if self.last_log.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            return;
        }
        let more = match self.unlogged {
            0 | 1 => String::new(),
            n => format!(" ({} times since the last such line)", n),
        };
        eprintln!("vmscope serve: {line}{more}");
        self.last_log = Some(Instant::now());
        self.unlogged = 0;
    }
}

/// An answer with a body of known length.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &str, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body,
        }
    }

    /// A `text/plain` answer.
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response::new(
            status,
            "text/plain; charset=utf-8",
            body.into().into_bytes(),
        )
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The answer; `head_only` for HEAD: the same head, no body.
    fn write_to(&self, w: &mut impl Write, head_only: bool) -> std::io::Result<()> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        w.write_all(head.as_bytes())?;
        if !head_only {
            w.write_all(&self.body)?;
        }
        w.flush()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// A bound listening socket.
pub(crate) struct Listener {
    listener: TcpListener,
}

impl Listener {
    pub fn bind(addr: &str) -> std::io::Result<Listener> {
        let listener = TcpListener::bind(addr)?;
        // Accepts poll so that `run` sees its stop flag.
        listener.set_nonblocking(true)?;
        Ok(Listener { listener })
    }

    pub fn local_addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    /// Serve until `stop` is set: every connection on a thread of its own
    /// that reads one request, answers it with `handle` and closes.
    pub fn run<H>(&self, stop: &AtomicBool, handle: H)
    where
        H: Fn(&Request) -> Response + Send + Sync + 'static,
    {
        let handle = Arc::new(handle);
        let open = Arc::new(Mutex::new(Open::default()));
        while !stop.load(Ordering::Relaxed) {
            let (stream, peer) = match self.listener.accept() {
                Ok((s, a)) => (s, a.ip()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(STOP_POLL);
                    continue;
                }
                Err(e) => {
                    // Out of descriptors, a connection reset before accept:
                    // the listener itself is fine.
                    eprintln!("vmscope serve: accepting a connection: {e}");
                    std::thread::sleep(STOP_POLL);
                    continue;
                }
            };
            let admitted = lock(&open).admit(&stream, peer);
            let id = match admitted {
                Ok(id) => id,
                Err(why) => {
                    let mut s = stream;
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = Response::text(503, why).write_to(&mut s, false);
                    continue;
                }
            };
            let handle = Arc::clone(&handle);
            let open2 = Arc::clone(&open);
            let spawned = std::thread::Builder::new()
                .name("serve-conn".into())
                .spawn(move || {
                    serve_one(stream, &*handle, &|| lock(&open2).head_read(id));
                    lock(&open2).close(id);
                });
            if let Err(e) = spawned {
                lock(&open).close(id);
                eprintln!("vmscope serve: cannot start a connection thread: {e}");
            }
        }
    }
}

fn lock(open: &Mutex<Open>) -> std::sync::MutexGuard<'_, Open> {
    open.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Read one request head from `stream`, answer it, close. `head_read` is
/// called once the request is in (the connection may no longer be closed
/// to make room).
fn serve_one(mut stream: TcpStream, handle: &dyn Fn(&Request) -> Response, head_read: &dyn Fn()) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let started = Instant::now();
    let mut timed = Timed {
        s: &mut stream,
        started,
        any: false,
    };
    let (resp, head_only) = match read_head(&mut timed) {
        Ok(Some(req)) => {
            head_read();
            // HEAD is GET without the body (RFC 9110 §9.3.2).
            let head_only = req.method == "HEAD";
            let req = if head_only {
                Request {
                    method: "GET".into(),
                    target: req.target,
                }
            } else {
                req
            };
            (handle(&req), head_only)
        }
        // The client went away or fell silent: nobody to answer.
        Ok(None) => return,
        Err(resp) => (resp, false),
    };
    // A client that went away is its own business.
    let _ = resp.write_to(&mut stream, head_only);
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// A client socket whose reads time out [`FIRST_BYTE_TIMEOUT`] after the
/// start until its first byte, and [`READ_TIMEOUT`] after it in all.
struct Timed<'a> {
    s: &'a mut TcpStream,
    started: Instant,
    any: bool,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let limit = if self.any {
            READ_TIMEOUT
        } else {
            FIRST_BYTE_TIMEOUT
        };
        let left = limit.saturating_sub(self.started.elapsed());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.s.set_read_timeout(Some(left))?;
        let n = self.s.read(buf)?;
        self.any |= n > 0;
        Ok(n)
    }
}

/// The request line of the head read from `r` (headers are read and
/// ignored); `Ok(None)` when the client closed or timed out first, `Err`
/// with the answer for a malformed or oversized head. A head that cannot
/// become a request (a TLS handshake, a request line without an HTTP
/// version) is answered as soon as its first line is in.
fn read_head(r: &mut impl Read) -> Result<Option<Request>, Response> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    // Where the search for the head's end resumes: a client that sends a
    // byte at a time costs one short search per byte, not a rescan.
    let mut from = 0;
    let mut line_checked = false;
    loop {
        if head.first() == Some(&0x16) {
            // A TLS record of type handshake: a client speaking HTTPS.
            return Err(Response::text(
                400,
                "this port speaks plain HTTP, not TLS: use http://\n",
            ));
        }
        if !line_checked {
            if let Some(eol) = head.iter().position(|&b| b == b'\n') {
                line_checked = true;
                request_line(&head[..eol])?;
            }
        }
        let tail = &head[from..];
        if let Some(end) = find(tail, b"\r\n\r\n").or_else(|| find(tail, b"\n\n")) {
            head.truncate(from + end);
            break;
        }
        if head.len() > MAX_HEAD {
            return Err(Response::text(431, "request head over 16 KiB\n"));
        }
        // The end marker may straddle what was read and what comes next.
        from = head.len().saturating_sub(3);
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return Ok(None),
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    request_line(&head[..line_end]).map(Some)
}

/// `METHOD TARGET HTTP/x.y`, or the 400 answer.
fn request_line(line: &[u8]) -> Result<Request, Response> {
    let text = String::from_utf8_lossy(line);
    let mut parts = text.split_ascii_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(target), Some(version)) if version.starts_with("HTTP/1.") => {
            Ok(Request {
                method: method.to_string(),
                target: target.to_string(),
            })
        }
        (Some(_), Some(_), None) => Err(Response::text(
            400,
            "request line without an HTTP version (HTTP/0.9 is not served)\n",
        )),
        _ => Err(Response::text(400, "malformed request line\n")),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_and_bad_ones_are_answered() {
        let mut ok = &b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"[..];
        let r = read_head(&mut ok).unwrap().unwrap();
        assert_eq!(
            (r.method.as_str(), r.target.as_str()),
            ("GET", "/metrics?x=1")
        );
        let mut bad = &b"nonsense\r\n\r\n"[..];
        assert_eq!(read_head(&mut bad).unwrap_err().status, 400);
        let mut cut = &b"GET / HTTP/1.1\r\nHost"[..];
        assert!(read_head(&mut cut).unwrap().is_none());
        // A byte per read: the end marker arrives split over four reads.
        struct Drip<'a>(&'a [u8]);
        impl Read for Drip<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let Some((first, rest)) = self.0.split_first() else {
                    return Ok(0);
                };
                buf[0] = *first;
                self.0 = rest;
                Ok(1)
            }
        }
        let mut drip = Drip(b"GET /d HTTP/1.1\r\nHost: x\r\n\r\nrest");
        let r = read_head(&mut drip).unwrap().unwrap();
        assert_eq!(r.target, "/d");
        let big = [b"GET / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 20_000]].concat();
        assert_eq!(read_head(&mut big.as_slice()).unwrap_err().status, 431);
        // Answered when the first line is in, not when the head would end.
        let mut nine = &b"GET /metrics\r\n"[..];
        let e = read_head(&mut nine).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(String::from_utf8_lossy(&e.body).contains("HTTP/0.9"));
        let mut tls = &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..];
        let e = read_head(&mut tls).unwrap_err();
        assert!(String::from_utf8_lossy(&e.body).contains("not TLS"));
    }

    #[test]
    fn head_answers_carry_no_body() {
        let mut out = Vec::new();
        Response::text(200, "body\n")
            .write_to(&mut out, true)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("Content-Length: 5\r\n") && text.ends_with("\r\n\r\n"),
            "{text}"
        );
    }

    #[test]
    fn answers_carry_length_and_close() {
        let mut out = Vec::new();
        Response::new(404, "text/plain", b"no\n".to_vec())
            .with_header("X-A", "b")
            .write_to(&mut out, false)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");
        assert!(text.contains("Content-Length: 3\r\n") && text.contains("Connection: close\r\n"));
        assert!(text.contains("X-A: b\r\n") && text.ends_with("\r\n\r\nno\n"));
    }
}
