//! A small QMP client (QEMU Machine Protocol) over a Unix socket.
//!
//! QMP is a stream of JSON objects: QEMU greets with `{"QMP": {...}}`, the
//! client sends `{"execute": "qmp_capabilities"}` to leave negotiation mode,
//! then each `{"execute": CMD, "arguments": {...}, "id": N}` gets one
//! `{"return": ...}` or `{"error": {"class", "desc"}}` carrying the same id,
//! with asynchronous `{"event": ...}` objects interleaved at any time. That
//! is a few lines over `std::os::unix::net::UnixStream` and `serde_json`, so
//! no QMP crate is needed. Objects are read with serde_json's stream
//! deserializer rather than line by line, so monitors started with
//! `-qmp-pretty` / `pretty=on` (objects spread over many lines) work too.
//!
//! QEMU serves one client per monitor socket: when another client (libvirtd)
//! holds it, `connect` succeeds but no greeting comes, which the timeout
//! turns into [`DiscoverError::QmpTimeout`].

use crate::DiscoverError;
use serde_json::{json, Value};
use std::io::{self, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

type Reader =
    serde_json::StreamDeserializer<'static, serde_json::de::IoRead<BufReader<UnixStream>>, Value>;

/// A connected QMP session in command mode.
pub struct Qmp {
    socket: PathBuf,
    /// The write half. It shares the socket with the reader, so setting the
    /// read timeout here applies to the reader too (`SO_RCVTIMEO` belongs to
    /// the socket, not to the descriptor).
    stream: UnixStream,
    reader: Reader,
    timeout: Duration,
    next_id: u64,
    greeting: Value,
}

impl std::fmt::Debug for Qmp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qmp").field("socket", &self.socket).finish()
    }
}

impl Qmp {
    /// Connect to the QMP socket at `path`, read the greeting and negotiate
    /// capabilities. `timeout` bounds the connect, the greeting and, later,
    /// each command.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Qmp, DiscoverError> {
        let socket = path.as_ref().to_path_buf();
        let stream = connect_with_timeout(&socket, timeout)?;
        let io_err = |source| DiscoverError::QmpIo {
            socket: socket.clone(),
            source,
        };
        stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
        let read_half = stream.try_clone().map_err(io_err)?;
        let reader = serde_json::Deserializer::from_reader(BufReader::new(read_half)).into_iter();
        let mut q = Qmp {
            socket,
            stream,
            reader,
            timeout,
            next_id: 1,
            greeting: Value::Null,
        };
        let deadline = Instant::now() + timeout;
        loop {
            let v = q.read_object("the greeting", deadline)?;
            if v.get("QMP").is_some() {
                q.greeting = v;
                break;
            }
            if v.get("event").is_none() {
                return Err(q.protocol(format!("expected a QMP greeting, got {v}")));
            }
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    /// The greeting QEMU sent (`{"QMP": {"version": ..., "capabilities": [...]}}`).
    pub fn greeting(&self) -> &Value {
        &self.greeting
    }

    /// The socket this session is connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Run one command and return its `return` value. Events that arrive
    /// meanwhile are skipped. After an I/O error or a timeout the session
    /// is unusable; connect again.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, DiscoverError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({ "execute": cmd, "id": id });
        if let Some(a) = args {
            req["arguments"] = a;
        }
        let mut line = req.to_string();
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| self.io_or_timeout(e, cmd))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let v = self.read_object(cmd, deadline)?;
            if v.get("event").is_some() {
                continue;
            }
            // Replies to earlier commands abandoned after an error are not ours.
            if v.get("id").is_some_and(|i| i != &json!(id)) {
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
                return Err(DiscoverError::QmpCommand {
                    socket: self.socket.clone(),
                    command: cmd.to_string(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            return Err(self.protocol(format!("unexpected reply to {cmd}: {v}")));
        }
    }

    fn read_object(&mut self, what: &str, deadline: Instant) -> Result<Value, DiscoverError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timed_out(what));
        }
        self.stream
            .set_read_timeout(Some(left))
            .map_err(|e| self.io_or_timeout(e, what))?;
        match self.reader.next() {
            None => Err(self.protocol(format!("connection closed while waiting for {what}"))),
            Some(Ok(v @ Value::Object(_))) => Ok(v),
            Some(Ok(v)) => Err(self.protocol(format!("expected a JSON object, got {v}"))),
            Some(Err(e)) => match e.io_error_kind() {
                Some(kind) => Err(self.io_or_timeout(io::Error::new(kind, e), what)),
                None => Err(self.protocol(format!("bad JSON while waiting for {what}: {e}"))),
            },
        }
    }

    fn io_or_timeout(&self, e: io::Error, what: &str) -> DiscoverError {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            self.timed_out(what)
        } else {
            DiscoverError::QmpIo {
                socket: self.socket.clone(),
                source: e,
            }
        }
    }

    fn timed_out(&self, what: &str) -> DiscoverError {
        DiscoverError::QmpTimeout {
            socket: self.socket.clone(),
            what: what.to_string(),
            timeout: self.timeout,
        }
    }

    fn protocol(&self, message: String) -> DiscoverError {
        DiscoverError::QmpProtocol {
            socket: self.socket.clone(),
            message,
        }
    }
}

/// (cpu index, thread id) of every vCPU, from `query-cpus-fast`
/// (`query-cpus` on QEMU before 2.12), sorted by index.
pub fn vcpu_threads(q: &mut Qmp) -> Result<Vec<(u32, u32)>, DiscoverError> {
    let (v, idx_key, tid_key) = match q.execute("query-cpus-fast", None) {
        Ok(v) => (v, "cpu-index", "thread-id"),
        Err(DiscoverError::QmpCommand { class, .. }) if class == "CommandNotFound" => {
            (q.execute("query-cpus", None)?, "CPU", "thread_id")
        }
        Err(e) => return Err(e),
    };
    let num = |c: &Value, k: &str| {
        c.get(k)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    let mut out: Vec<(u32, u32)> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| Some((num(c, idx_key)?, num(c, tid_key)?)))
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    Ok(out)
}

/// (id, thread id) of every I/O thread, from `query-iothreads`.
pub fn iothreads(q: &mut Qmp) -> Result<Vec<(String, u32)>, DiscoverError> {
    let v = q.execute("query-iothreads", None)?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| {
                    Some((
                        t.get("id")?.as_str()?.to_string(),
                        u32::try_from(t.get("thread-id")?.as_u64()?).ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default())
}

/// `connect(2)` on a Unix socket returns at once unless the listener's
/// backlog is full; that case blocks, so the connect runs on a helper
/// thread that is abandoned (and finishes on its own) after `timeout`.
fn connect_with_timeout(socket: &Path, timeout: Duration) -> Result<UnixStream, DiscoverError> {
    let (tx, rx) = mpsc::channel();
    let p = socket.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(UnixStream::connect(p));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(source)) => Err(DiscoverError::QmpConnect {
            socket: socket.to_path_buf(),
            source,
        }),
        Err(_) => Err(DiscoverError::QmpTimeout {
            socket: socket.to_path_buf(),
            what: "connect".into(),
            timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Write};
    use std::os::unix::net::UnixListener;

    /// A fake QEMU: greets, then answers each request from `script`
    /// (request command → reply lines to send, in order).
    fn fake_qemu(
        dir: &Path,
        greet: bool,
        script: Vec<(&'static str, Vec<String>)>,
    ) -> (PathBuf, std::thread::JoinHandle<()>) {
        let path = dir.join("qmp.sock");
        let l = UnixListener::bind(&path).expect("bind");
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            if !greet {
                std::thread::sleep(Duration::from_millis(600));
                return;
            }
            s.write_all(
                b"{\"QMP\": {\"version\": {\"qemu\": {\"major\": 7}}, \"capabilities\": []}}\r\n",
            )
            .expect("greet");
            let mut r = std::io::BufReader::new(s.try_clone().expect("clone"));
            for (cmd, replies) in script {
                let mut line = String::new();
                if r.read_line(&mut line).expect("read") == 0 {
                    return;
                }
                let req: Value = serde_json::from_str(&line).expect("json");
                assert_eq!(req["execute"], cmd);
                let id = req["id"].to_string();
                for rep in replies {
                    s.write_all(rep.replace("$ID", &id).as_bytes())
                        .expect("reply");
                }
            }
        });
        (path, h)
    }

    #[test]
    fn negotiates_skips_events_and_reports_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, h) = fake_qemu(
            dir.path(),
            true,
            vec![
                ("qmp_capabilities", vec!["{\"return\": {}, \"id\": $ID}\r\n".into()]),
                (
                    "query-cpus-fast",
                    vec![
                        "{\"event\": \"RESUME\", \"timestamp\": {}}\r\n".into(),
                        // Pretty-printed, over several lines.
                        "{\n  \"return\": [\n    {\"cpu-index\": 0, \"thread-id\": 42}\n  ],\n  \"id\": $ID\n}\n".into(),
                    ],
                ),
                (
                    "query-nothing",
                    vec!["{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The command query-nothing has not been found\"}, \"id\": $ID}\r\n".into()],
                ),
            ],
        );
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).expect("connect");
        assert_eq!(q.greeting()["QMP"]["version"]["qemu"]["major"], 7);
        let r = q.execute("query-cpus-fast", None).expect("cpus");
        assert_eq!(r[0]["thread-id"], 42);
        let e = q.execute("query-nothing", None).unwrap_err();
        assert!(
            matches!(&e, DiscoverError::QmpCommand { class, .. } if class == "CommandNotFound")
        );
        assert!(e.to_string().contains("qmp.sock"), "{e}");
        h.join().expect("fake qemu");
    }

    #[test]
    fn silent_monitor_times_out_naming_the_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, h) = fake_qemu(dir.path(), false, vec![]);
        let t = Instant::now();
        let e = Qmp::connect(&path, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, DiscoverError::QmpTimeout { .. }), "{e}");
        // Only to catch a wait that ignores the timeout, not a timing.
        assert!(t.elapsed() < Duration::from_secs(30));
        assert!(e.to_string().contains(&path.display().to_string()));
        h.join().expect("fake qemu");
    }

    #[test]
    fn missing_socket_is_a_connect_error() {
        let e = Qmp::connect("/nonexistent/qmp.sock", Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, DiscoverError::QmpConnect { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/qmp.sock"));
    }
}
