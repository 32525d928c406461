//! The HTTP side of `vmscope serve`: HTTP/1.1 on hyper (tokio), with TLS
//! on rustls (`--tls-cert`, `--tls-key`) and client authentication (a
//! bearer token or users and passwords read from a file, client
//! certificates checked against `--tls-client-ca`). One request per
//! connection (`Connection: close`); each connection is a task of its own
//! and each answer is built on a blocking thread of its own, so a slow
//! answer (a rolling profile waiting for its seconds) never holds up
//! `/metrics`.
//!
//! Slow, silent and hostile clients cost only themselves (the guarantees of
//! the hand-written server this replaced, which tiny_http had broken: it
//! queued a scrape behind silent clients):
//! - a client has [`FIRST_BYTE_TIMEOUT`] to send its first byte (a scraper
//!   sends its request at once) and [`READ_TIMEOUT`] for the TLS handshake
//!   and the whole request head; one that reads nothing of an answer for
//!   [`WRITE_TIMEOUT`] is dropped;
//! - at [`MAX_CONNECTIONS`], a new connection closes the oldest one still
//!   waiting for its request head instead of being refused, so connections
//!   held open by any local user cannot keep a scrape out; one peer address
//!   other than loopback holds at most [`MAX_PER_PEER`];
//! - a TLS ClientHello on the plain port, or a plain request on the TLS
//!   port, is answered 400 as soon as its first byte is in; a request line
//!   without an HTTP version (HTTP/0.9) gets hyper's 400 at once;
//! - a request without the credentials asked for is answered 401 before
//!   anything is sampled;
//! - when a limit bites it says so on stderr, at most once a minute.

use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Longest request head read (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// A client that has not sent its first byte after this long is dropped.
pub(crate) const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(5);
/// A client that has not finished its TLS handshake and request head after
/// this long is dropped.
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

/// How `serve` protects what it serves.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// `--tls-cert`, `--tls-key` and, for client certificates,
    /// `--tls-client-ca`.
    pub tls: Option<TlsFiles>,
    /// What a request must carry.
    pub auth: Option<ClientAuth>,
}

/// PEM files of the server's certificate chain and key, and of the CAs
/// that sign client certificates (then required).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// Credentials every request must carry (read from files at the start).
#[derive(Clone)]
pub enum ClientAuth {
    /// `Authorization: Bearer TOKEN`.
    Bearer(String),
    /// `Authorization: Basic` with one of these users and passwords.
    Basic(Vec<(String, String)>),
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientAuth::Bearer(_) => f.write_str("Bearer(…)"),
            ClientAuth::Basic(u) => write!(f, "Basic({} users)", u.len()),
        }
    }
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

impl ClientAuth {
    /// Whether an `Authorization` header value passes.
    fn admits(&self, header: Option<&str>) -> bool {
        let Some(h) = header else { return false };
        match self {
            ClientAuth::Bearer(t) => h
                .strip_prefix("Bearer ")
                .is_some_and(|got| same(got.trim().as_bytes(), t.as_bytes())),
            ClientAuth::Basic(users) => {
                let Some(b64) = h.strip_prefix("Basic ") else {
                    return false;
                };
                let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
                    return false;
                };
                let text = String::from_utf8_lossy(&raw);
                let Some((u, p)) = text.split_once(':') else {
                    return false;
                };
                // Every user is compared, so the time says nothing.
                users.iter().fold(false, |ok, (user, pw)| {
                    ok | (same(u.as_bytes(), user.as_bytes()) & same(p.as_bytes(), pw.as_bytes()))
                })
            }
        }
    }

    fn challenge(&self) -> &'static str {
        match self {
            ClientAuth::Bearer(_) => "Bearer realm=\"vmscope\"",
            ClientAuth::Basic(_) => "Basic realm=\"vmscope\"",
        }
    }
}

/// Why the TLS set-up or a credential file cannot be used (one line
/// naming the option and file).
fn file_err(option: &str, path: &Path, why: impl std::fmt::Display) -> String {
    format!("{option} {}: {why}", path.display())
}

/// The rustls server configuration of `files`.
fn tls_config(files: &TlsFiles) -> Result<rustls::ServerConfig, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_err("--tls-cert", &files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err("--tls-cert", &files.cert, e))?;
    if certs.is_empty() {
        return Err(file_err("--tls-cert", &files.cert, "no CERTIFICATE in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| file_err("--tls-key", &files.key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in
                CertificateDer::pem_file_iter(ca).map_err(|e| file_err("--tls-client-ca", ca, e))?
            {
                let c = c.map_err(|e| file_err("--tls-client-ca", ca, e))?;
                roots
                    .add(c)
                    .map_err(|e| file_err("--tls-client-ca", ca, e))?;
            }
            if roots.is_empty() {
                return Err(file_err("--tls-client-ca", ca, "no CERTIFICATE in it"));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| file_err("--tls-client-ca", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_single_cert(certs, key).map_err(|e| {
        file_err(
            "--tls-key",
            &files.key,
            format!("does not fit --tls-cert: {e}"),
        )
    })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

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

    fn into_hyper(self) -> hyper::Response<Full<Bytes>> {
        let mut b = hyper::Response::builder().status(self.status);
        for (k, v) in &self.headers {
            b = b.header(k.as_str(), v.as_str());
        }
        b.header("Content-Length", self.body.len())
            .body(Full::new(Bytes::from(self.body)))
            .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
    }

    /// The answer as raw bytes, for what is answered before hyper reads.
    fn raw(&self) -> Vec<u8> {
        let reason = match self.status {
            400 => "Bad Request",
            503 => "Service Unavailable",
            _ => "Error",
        };
        let mut out = format!("HTTP/1.1 {} {reason}\r\n", self.status);
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// The connections open now: what the accept loop needs to make room.
#[derive(Default)]
struct Open {
    next: u64,
    conns: HashMap<u64, Conn>,
    per_peer: HashMap<IpAddr, usize>,
    last_log: Option<Instant>,
    /// Closed or refused since the last log line.
    unlogged: u64,
}

struct Conn {
    peer: IpAddr,
    /// Told to close when room is made.
    close: Arc<Notify>,
    since: Instant,
    head_read: bool,
}

impl Open {
    /// Register a connection, making room first; `Err(answer)` when its peer
    /// holds too many already.
    fn admit(&mut self, peer: IpAddr) -> Result<(u64, Arc<Notify>), String> {
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
                c.close.notify_one();
            }
            self.close(id);
            self.log(format!(
                "{MAX_CONNECTIONS} connections open: closed the oldest that had sent no request (from {vpeer}) to serve a new one"
            ));
        }
        let id = self.next;
        self.next += 1;
        let close = Arc::new(Notify::new());
        self.conns.insert(
            id,
            Conn {
                peer,
                close: Arc::clone(&close),
                since: Instant::now(),
                head_read: false,
            },
        );
        *self.per_peer.entry(peer).or_default() += 1;
        Ok((id, close))
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
            n => format!(" ({n} times since the last such line)"),
        };
        eprintln!("vmscope serve: {line}{more}");
        self.last_log = Some(Instant::now());
        self.unlogged = 0;
    }
}

fn lock(open: &Mutex<Open>) -> std::sync::MutexGuard<'_, Open> {
    open.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A bound listening socket and how it is protected.
pub(crate) struct Listener {
    listener: std::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    auth: Option<ClientAuth>,
}

impl Listener {
    /// Bind `addr`; `Err` with one line naming what is wrong (the address,
    /// or a TLS file).
    pub fn bind(addr: &str, security: &Security) -> Result<Listener, (bool, String)> {
        let tls = match &security.tls {
            Some(files) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                tls_config(files).map_err(|e| (false, e))?,
            ))),
            None => None,
        };
        let listener = std::net::TcpListener::bind(addr).map_err(|e| (true, e.to_string()))?;
        // The accept loop polls so that `run` sees its stop flag.
        listener
            .set_nonblocking(true)
            .map_err(|e| (true, e.to_string()))?;
        Ok(Listener {
            listener,
            tls,
            auth: security.auth.clone(),
        })
    }

    pub fn local_addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Serve until `stop` is set: every connection a task that reads one
    /// request, answers it with `handle` (on a blocking thread) and closes.
    pub fn run<H>(&self, stop: &AtomicBool, handle: H)
    where
        H: Fn(&Request) -> Response + Send + Sync + 'static,
    {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("serve-http")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("vmscope serve: cannot start the HTTP runtime: {e}");
                return;
            }
        };
        let handle = Arc::new(handle);
        let open = Arc::new(Mutex::new(Open::default()));
        let shared = Arc::new(Shared {
            tls: self.tls.clone(),
            auth: self.auth.clone(),
        });
        let std_listener = match self.listener.try_clone() {
            Ok(l) => l,
            Err(e) => {
                eprintln!("vmscope serve: the listening socket: {e}");
                return;
            }
        };
        rt.block_on(async {
            let listener = match tokio::net::TcpListener::from_std(std_listener) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("vmscope serve: the listening socket: {e}");
                    return;
                }
            };
            while !stop.load(Ordering::Relaxed) {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = tokio::time::sleep(STOP_POLL) => continue,
                };
                let (stream, peer) = match accepted {
                    Ok((s, a)) => (s, a.ip()),
                    Err(e) => {
                        // Out of descriptors, a connection reset before
                        // accept: the listener itself is fine.
                        eprintln!("vmscope serve: accepting a connection: {e}");
                        tokio::time::sleep(STOP_POLL).await;
                        continue;
                    }
                };
                let admitted = lock(&open).admit(peer);
                let (id, close) = match admitted {
                    Ok(x) => x,
                    Err(why) => {
                        tokio::spawn(answer_raw(stream, Response::text(503, why)));
                        continue;
                    }
                };
                let (handle, open2, shared) =
                    (Arc::clone(&handle), Arc::clone(&open), Arc::clone(&shared));
                tokio::spawn(async move {
                    let o = Arc::clone(&open2);
                    tokio::select! {
                        () = serve_one(stream, &shared, handle, move || lock(&o).head_read(id)) => {}
                        () = close.notified() => {}
                    }
                    lock(&open2).close(id);
                });
            }
        });
        // Answers in progress get a moment; then the runtime goes.
        rt.shutdown_timeout(Duration::from_secs(1));
    }
}

/// What every connection task needs.
struct Shared {
    tls: Option<tokio_rustls::TlsAcceptor>,
    auth: Option<ClientAuth>,
}

/// Write an answer made before hyper reads anything, then close. What the
/// client already sent is read first (up to [`MAX_HEAD`], while it comes
/// within 50 ms): closing with unread bytes would reset the connection
/// and could lose the answer.
async fn answer_raw(mut stream: TcpStream, resp: Response) {
    use tokio::io::AsyncReadExt;
    let mut sink = vec![0u8; 4096];
    let mut read = 0;
    while read < MAX_HEAD {
        match tokio::time::timeout(Duration::from_millis(50), stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => read += n,
            _ => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&resp.raw())).await;
    let _ = stream.shutdown().await;
}

/// One connection: its first byte within [`FIRST_BYTE_TIMEOUT`], TLS when
/// configured, then one request through hyper.
async fn serve_one<H>(
    stream: TcpStream,
    shared: &Shared,
    handle: Arc<H>,
    head_read: impl Fn() + Clone + Send + Sync + 'static,
) where
    H: Fn(&Request) -> Response + Send + Sync + 'static,
{
    let started = Instant::now();
    let mut first = [0u8; 1];
    match tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1..)) => {}
        // Closed, failed or silent: nobody to answer.
        _ => return,
    }
    let tls_hello = first[0] == 0x16;
    match (&shared.tls, tls_hello) {
        (None, true) => {
            let r = Response::text(400, "this port speaks plain HTTP, not TLS: use http://\n");
            return answer_raw(stream, r).await;
        }
        (Some(_), false) => {
            let r = Response::text(400, "this port speaks HTTPS: use https://\n");
            return answer_raw(stream, r).await;
        }
        _ => {}
    }
    let left = READ_TIMEOUT.saturating_sub(started.elapsed());
    match &shared.tls {
        Some(acceptor) => {
            let Ok(Ok(tls)) = tokio::time::timeout(left, acceptor.accept(stream)).await else {
                // A failed handshake (a client certificate missing or not
                // signed by --tls-client-ca): rustls sent its alert.
                return;
            };
            http(tls, shared.auth.clone(), handle, head_read, started).await;
        }
        None => http(stream, shared.auth.clone(), handle, head_read, started).await,
    }
}

/// One request through hyper on `io`.
async fn http<S, H>(
    io: S,
    auth: Option<ClientAuth>,
    handle: Arc<H>,
    head_read: impl Fn() + Clone + Send + Sync + 'static,
    started: Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(&Request) -> Response + Send + Sync + 'static,
{
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let (handle, auth, head_read) = (Arc::clone(&handle), auth.clone(), head_read.clone());
        async move {
            head_read();
            if let Some(a) = &auth {
                let h = req
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                if !a.admits(h) {
                    return Ok::<_, std::convert::Infallible>(
                        Response::text(401, "authentication required\n")
                            .with_header("WWW-Authenticate", a.challenge())
                            .into_hyper(),
                    );
                }
            }
            // HEAD is GET without the body (RFC 9110 §9.3.2); hyper sends
            // the head only.
            let method = match req.method().as_str() {
                "HEAD" => "GET".to_string(),
                m => m.to_string(),
            };
            let r = Request {
                method,
                target: req
                    .uri()
                    .path_and_query()
                    .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string()),
            };
            let resp = tokio::task::spawn_blocking(move || handle(&r))
                .await
                .unwrap_or_else(|_| Response::text(500, "the answer failed\n"));
            Ok(resp.into_hyper())
        }
    });
    let left = READ_TIMEOUT.saturating_sub(started.elapsed());
    let mut b = hyper::server::conn::http1::Builder::new();
    b.keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(left.max(Duration::from_millis(1)))
        .max_buf_size(MAX_HEAD);
    let _ = b
        .serve_connection(TokioIo::new(WriteTimed::new(io)), service)
        .await;
}

/// A stream whose writes fail after [`WRITE_TIMEOUT`] without progress
/// (a client that reads nothing).
struct WriteTimed<S> {
    inner: S,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimed<S> {
    fn new(inner: S) -> Self {
        WriteTimed {
            inner,
            stalled: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> WriteTimed<S> {
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match r {
            Poll::Ready(v) => {
                self.stalled = None;
                Poll::Ready(v)
            }
            Poll::Pending => {
                let s = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
                if std::future::Future::poll(s.as_mut(), cx).is_ready() {
                    return Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `--auth-token-file` or `--auth-basic-file`: the credentials a request
/// must carry. The file should be readable by root only; a line on stderr
/// says so when others may read it.
pub fn client_auth(
    token: Option<&Path>,
    basic: Option<&Path>,
) -> Result<Option<ClientAuth>, String> {
    let read = |option: &str, p: &Path| -> Result<String, String> {
        let meta = std::fs::metadata(p).map_err(|e| file_err(option, p, e))?;
        if !meta.is_file() || meta.len() > 1 << 20 {
            return Err(file_err(option, p, "not a small regular file"));
        }
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            eprintln!(
                "vmscope serve: warning: {option} {}: others may read it (chmod 600)",
                p.display()
            );
        }
        std::fs::read_to_string(p).map_err(|e| file_err(option, p, e))
    };
    if let Some(p) = token {
        let text = read("--auth-token-file", p)?;
        let t = text.trim();
        if t.is_empty() || t.contains(char::is_whitespace) {
            return Err(file_err(
                "--auth-token-file",
                p,
                "give one token on one line",
            ));
        }
        return Ok(Some(ClientAuth::Bearer(t.to_string())));
    }
    if let Some(p) = basic {
        let text = read("--auth-basic-file", p)?;
        let mut users = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(':') {
                Some((u, pw)) if !u.is_empty() && !pw.is_empty() => {
                    users.push((u.to_string(), pw.to_string()));
                }
                _ => {
                    return Err(file_err(
                        "--auth-basic-file",
                        p,
                        format!("line {}: give USER:PASSWORD", n + 1),
                    ))
                }
            }
        }
        if users.is_empty() {
            return Err(file_err("--auth-basic-file", p, "no USER:PASSWORD line"));
        }
        return Ok(Some(ClientAuth::Basic(users)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_checked() {
        let b = ClientAuth::Bearer("t0k".into());
        assert!(b.admits(Some("Bearer t0k")));
        assert!(!b.admits(Some("Bearer t0")));
        assert!(!b.admits(Some("Bearer t0kk")));
        assert!(!b.admits(None));
        let u = ClientAuth::Basic(vec![
            ("prom".into(), "pw".into()),
            ("ops".into(), "x".into()),
        ]);
        let enc = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert!(u.admits(Some(&enc("prom:pw"))));
        assert!(u.admits(Some(&enc("ops:x"))));
        assert!(!u.admits(Some(&enc("prom:x"))));
        assert!(!u.admits(Some("Basic !!!")));
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
    }

    #[test]
    fn raw_answers_carry_length_and_close() {
        let text = String::from_utf8(Response::text(400, "no\n").raw()).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
        assert!(text.contains("Content-Length: 3\r\n") && text.contains("Connection: close\r\n"));
        assert!(text.ends_with("\r\n\r\nno\n"));
    }

    #[test]
    fn credential_files_are_read_and_bad_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("users");
        std::fs::write(&f, "# scrapers\nprom:pw\n").unwrap();
        assert!(
            matches!(client_auth(None, Some(&f)), Ok(Some(ClientAuth::Basic(u))) if u.len() == 1)
        );
        std::fs::write(&f, "prom\n").unwrap();
        let e = client_auth(None, Some(&f)).unwrap_err();
        assert!(
            e.contains("--auth-basic-file") && e.contains("line 1"),
            "{e}"
        );
        let e = client_auth(Some(&dir.path().join("nope")), None).unwrap_err();
        assert!(
            e.starts_with("--auth-token-file ") && e.contains("nope"),
            "{e}"
        );
    }
}
