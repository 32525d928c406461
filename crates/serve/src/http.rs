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
//! What `serve` needs (GET, a path and a query, a body of known length) is
//! small enough to own.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest request head read (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// A client that sends nothing for this long is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A client that reads nothing for this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; past it a new one is told 503 and closed.
const MAX_CONNECTIONS: usize = 256;
/// How often the accept loop looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// A request: method and target (path with its query) as sent.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    pub target: String,
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

    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        w.write_all(head.as_bytes())?;
        w.write_all(&self.body)?;
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
        let open = Arc::new(AtomicUsize::new(0));
        while !stop.load(Ordering::Relaxed) {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
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
            if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                open.fetch_sub(1, Ordering::AcqRel);
                let mut s = stream;
                let _ = s.set_nonblocking(false);
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = Response::text(503, "too many connections\n").write_to(&mut s);
                continue;
            }
            let handle = Arc::clone(&handle);
            let open2 = Arc::clone(&open);
            let spawned = std::thread::Builder::new()
                .name("serve-conn".into())
                .spawn(move || {
                    serve_one(stream, &*handle);
                    open2.fetch_sub(1, Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                open.fetch_sub(1, Ordering::AcqRel);
                eprintln!("vmscope serve: cannot start a connection thread: {e}");
            }
        }
    }
}

/// Read one request head from `stream`, answer it, close.
fn serve_one(mut stream: TcpStream, handle: &dyn Fn(&Request) -> Response) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let resp = match read_head(&mut stream) {
        Ok(Some(req)) => handle(&req),
        // The client went away or fell silent: nobody to answer.
        Ok(None) => return,
        Err(resp) => resp,
    };
    // A client that went away is its own business.
    let _ = resp.write_to(&mut stream);
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// The request line of the head read from `r` (headers are read and
/// ignored); `Ok(None)` when the client closed or timed out first, `Err`
/// with the answer for a malformed or oversized head.
fn read_head(r: &mut impl Read) -> Result<Option<Request>, Response> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    // Where the search for the head's end resumes: a client that sends a
    // byte at a time costs one short search per byte, not a rescan.
    let mut from = 0;
    loop {
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
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split_ascii_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(target), Some(version)) if version.starts_with("HTTP/") => {
            Ok(Some(Request {
                method: method.to_string(),
                target: target.to_string(),
            }))
        }
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
    }

    #[test]
    fn answers_carry_length_and_close() {
        let mut out = Vec::new();
        Response::new(404, "text/plain", b"no\n".to_vec())
            .with_header("X-A", "b")
            .write_to(&mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");
        assert!(text.contains("Content-Length: 3\r\n") && text.contains("Connection: close\r\n"));
        assert!(text.contains("X-A: b\r\n") && text.ends_with("\r\n\r\nno\n"));
    }
}
