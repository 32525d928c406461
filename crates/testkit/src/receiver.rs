//! A loopback HTTP receiver for exporter tests: it records every request
//! (method, target, headers, body) and answers as the test says: a status
//! and body, or nothing at all (a receiver that accepts and never answers).
//! One request per connection, each on a thread of its own.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    /// Path and query as sent.
    pub target: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    /// The first header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// Query parameters, percent-decoded.
    pub fn query(&self) -> Vec<(String, String)> {
        let q = self.target.split_once('?').map_or("", |(_, q)| q);
        q.split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect()
    }
}

/// `%XX` and `+` undone.
pub fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Answer {
    status: u16,
    body: Vec<u8>,
    silent: bool,
}

/// A running receiver on 127.0.0.1.
pub struct Receiver {
    addr: String,
    got: Arc<Mutex<Vec<Received>>>,
    answer: Arc<Mutex<Answer>>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    /// Listen on a free loopback port; answers 200 with an empty body
    /// until told otherwise.
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("address").to_string();
        let got = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(Mutex::new(Answer {
            status: 200,
            body: Vec::new(),
            silent: false,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, a, s) = (Arc::clone(&got), Arc::clone(&answer), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (g, a, s) = (Arc::clone(&g), Arc::clone(&a), Arc::clone(&s));
                        std::thread::spawn(move || serve(conn, &g, &a, &s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Receiver {
            addr,
            got,
            answer,
            stop,
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Answer from now on with `status` and `body`.
    pub fn answer(&self, status: u16, body: &[u8]) {
        let mut a = self
            .answer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        a.status = status;
        a.body = body.to_vec();
        a.silent = false;
    }

    /// Accept and read requests but never answer (until `answer`).
    pub fn silent(&self) {
        self.answer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .silent = true;
    }

    /// Every request answered with a 2xx so far, in arrival order.
    pub fn taken(&self) -> Vec<Received> {
        self.got
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(
    mut conn: TcpStream,
    got: &Mutex<Vec<Received>>,
    answer: &Mutex<Answer>,
    stop: &AtomicBool,
) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let (method, target) = (
        first.next().unwrap_or("").to_string(),
        first.next().unwrap_or("").to_string(),
    );
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let (status, reply, silent) = {
        let a = answer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (a.status, a.body.clone(), a.silent)
    };
    if silent {
        // Hold the connection without a word until the test ends.
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        return;
    }
    if (200..300).contains(&status) {
        got.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Received {
                method,
                target,
                headers,
                body,
            });
    }
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.len()
    );
    let _ = conn.write_all(&reply);
}
