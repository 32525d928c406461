//! One exporter: a thread that sends its queue in order, one request at a
//! time, retrying the oldest with backoff until its receiver takes it, so
//! every window arrives once and in order; `serve` only hands it requests
//! ([`Exporter::send`]) and never waits for it.
//!
//! Backoff after a failed try: 1 s, doubling up to [`ExportConfig::max_backoff`]
//! (the export interval, at most 30 s). A line on stderr when sending
//! starts failing (naming the URL and the problem), at most one a minute
//! while it goes on, and one when the receiver takes requests again.

use crate::client::{Client, Outcome};
use crate::spec::{ExportOptions, ExportSpec};
use crate::spool::{Effects, Request, Spool};
use crate::ExportError;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What an exporter did since it started (for `/metrics`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExporterStats {
    /// `otlp`, `pyroscope`, `remote-write`.
    pub kind: String,
    pub url: String,
    /// Requests the receiver took.
    pub sent: u64,
    /// Tries that failed (each retry counts).
    pub failed: u64,
    /// Requests that had to wait: written to the spool.
    pub spooled: u64,
    /// Requests given up: the oldest past `--export-spool-max`, refused
    /// for good, or unreadable in the spool.
    pub dropped: u64,
    /// Requests waiting now, and their bytes.
    pub queued: u64,
    pub queued_bytes: u64,
    /// Set when the exporter stopped for good, with why.
    pub stopped: Option<String>,
}

/// How an exporter runs.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    pub spec: ExportSpec,
    pub options: ExportOptions,
    /// Its spool directory (`--export-spool DIR/<kind>-<url hash>`), or
    /// `None` to queue in memory.
    pub spool_dir: Option<PathBuf>,
    /// `--export-spool-max`, bytes.
    pub spool_max: u64,
    /// The longest wait between two tries.
    pub max_backoff: Duration,
}

/// A running exporter.
pub struct Exporter {
    spec: ExportSpec,
    tx: Mutex<Option<mpsc::Sender<Vec<Request>>>>,
    stats: Arc<Mutex<ExporterStats>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The directory of one exporter under `--export-spool DIR`: stable for a
/// kind and URL across runs, apart for two exporters.
pub fn spool_subdir(spec: &ExportSpec) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in spec.url.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}-{:016x}", spec.kind.as_str(), h)
}

impl Exporter {
    /// Open its spool (requests a previous run left are sent first) and
    /// start its thread.
    pub fn start(cfg: ExportConfig) -> Result<Exporter, ExportError> {
        let client = Client::new(&cfg.spec, &cfg.options)?;
        let spool = Spool::open(cfg.spool_dir.as_deref(), cfg.spool_max).map_err(|e| {
            ExportError::Spool {
                path: cfg
                    .spool_dir
                    .as_ref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
                why: e.to_string(),
            }
        })?;
        let stats = Arc::new(Mutex::new(ExporterStats {
            kind: cfg.spec.kind.as_str().into(),
            url: cfg.spec.url.clone(),
            queued: spool.len() as u64,
            queued_bytes: spool.bytes(),
            ..ExporterStats::default()
        }));
        if !spool.is_empty() {
            eprintln!(
                "vmscope serve: export {} {}: {} requests left by an earlier run are sent first",
                cfg.spec.kind.as_str(),
                cfg.spec.url,
                spool.len()
            );
        }
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let mut worker = Worker {
            name: format!("export {} {}", cfg.spec.kind.as_str(), cfg.spec.url),
            client,
            spool,
            rx,
            stats: Arc::clone(&stats),
            stop: Arc::clone(&stop),
            max_backoff: cfg.max_backoff.max(Duration::from_secs(1)),
            log: LogLimit::default(),
            disk_log: LogLimit::default(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("export-{}", cfg.spec.kind.as_str()))
            .spawn(move || worker.run())
            .map_err(|e| ExportError::Spool {
                path: String::new(),
                why: format!("cannot start the exporter's thread: {e}"),
            })?;
        Ok(Exporter {
            spec: cfg.spec,
            tx: Mutex::new(Some(tx)),
            stats,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn spec(&self) -> &ExportSpec {
        &self.spec
    }

    /// Queue a window's requests (never blocks on the receiver).
    pub fn send(&self, reqs: Vec<Request>) {
        if reqs.is_empty() || self.stopped() {
            return;
        }
        if let Some(tx) = lock(&self.tx).as_ref() {
            let _ = tx.send(reqs);
        }
    }

    pub fn stats(&self) -> ExporterStats {
        lock(&self.stats).clone()
    }

    /// Whether it stopped for good.
    pub fn stopped(&self) -> bool {
        lock(&self.stats).stopped.is_some()
    }

    /// Stop after the request in hand (at most one request's timeout);
    /// what waits stays in the spool directory for the next run.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Relaxed);
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// At most one repeated line a minute.
#[derive(Default)]
struct LogLimit {
    last: Option<Instant>,
    quiet: u64,
}

impl LogLimit {
    fn line(&mut self, name: &str, text: &str, force: bool) {
        if !force
            && self
                .last
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            self.quiet += 1;
            return;
        }
        let more = match self.quiet {
            0 => String::new(),
            n => format!(" ({n} more such lines held back)"),
        };
        eprintln!(
            "vmscope serve: {name}: {}{more}",
            vmscope_model::text::visible(text)
        );
        self.last = Some(Instant::now());
        self.quiet = 0;
    }
}

/// How long a stopping exporter still sends what it was handed last.
const DRAIN: Duration = Duration::from_secs(5);

/// The retry state of a worker.
struct State {
    backoff: Duration,
    next_try: Instant,
    /// The last try failed.
    failing: bool,
}

#[derive(PartialEq, Eq)]
enum Step {
    Went,
    Stopped,
}

struct Worker {
    name: String,
    client: Client,
    spool: Spool,
    rx: mpsc::Receiver<Vec<Request>>,
    stats: Arc<Mutex<ExporterStats>>,
    stop: Arc<AtomicBool>,
    max_backoff: Duration,
    /// Lines about sending.
    log: LogLimit,
    /// Lines about the spool directory (a full disk), apart from those
    /// about sending so that neither hides the other.
    disk_log: LogLimit,
}

impl Worker {
    fn note(&mut self, fx: &Effects) {
        {
            let mut s = lock(&self.stats);
            s.spooled += fx.spooled;
            s.dropped += fx.dropped;
        }
        if fx.dropped > 0 {
            let d = fx.dropped;
            self.log.line(
                &self.name,
                &format!("the spool is over --export-spool-max: dropped the {d} oldest requests"),
                false,
            );
        }
        if let Some(p) = &fx.problem {
            let p = p.clone();
            self.disk_log.line(&self.name, &p, false);
        }
    }

    fn take(&mut self, reqs: Vec<Request>) {
        for r in reqs {
            // Behind others: it waits, so it is spooled now.
            let wait = !self.spool.is_empty();
            let fx = self.spool.push(r, wait);
            self.note(&fx);
        }
    }

    fn run(&mut self) {
        let mut st = State {
            backoff: Duration::from_secs(1),
            next_try: Instant::now(),
            failing: false,
        };
        loop {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let wait = if self.spool.is_empty() {
                Duration::from_millis(200)
            } else {
                st.next_try.saturating_duration_since(Instant::now())
            };
            match self.rx.recv_timeout(wait.min(Duration::from_millis(200))) {
                Ok(reqs) => self.take(reqs),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            while let Ok(reqs) = self.rx.try_recv() {
                self.take(reqs);
            }
            self.publish();
            if self.spool.is_empty() || Instant::now() < st.next_try {
                continue;
            }
            if self.attempt(&mut st) == Step::Stopped {
                return;
            }
            self.publish();
        }
        // Stopping: what was handed over last (the final window) is sent
        // while the receiver takes requests, for at most DRAIN.
        while let Ok(reqs) = self.rx.try_recv() {
            self.take(reqs);
        }
        let until = Instant::now() + DRAIN;
        while !st.failing && !self.spool.is_empty() && Instant::now() < until {
            if self.attempt(&mut st) == Step::Stopped {
                return;
            }
        }
        // What waits in memory goes to the spool directory for the next run.
        if self.spool.on_disk() {
            let fx = self.spool.spool_all();
            self.note(&fx);
        }
        self.publish();
        if !self.spool.is_empty() && !self.spool.on_disk() {
            eprintln!(
                "vmscope serve: {}: {} requests not delivered are lost (no --export-spool)",
                self.name,
                self.spool.len()
            );
        }
    }

    /// Try the oldest request once.
    fn attempt(&mut self, st: &mut State) -> Step {
        let req = match self.spool.front() {
            Some(Ok(r)) => r,
            Some(Err(why)) => {
                lock(&self.stats).dropped += 1;
                self.log.line(&self.name, &why, true);
                return Step::Went;
            }
            None => return Step::Went,
        };
        match self.client.send(&req) {
            Outcome::Sent(note) => {
                self.spool.pop_front();
                lock(&self.stats).sent += 1;
                if let Some(n) = note {
                    self.log
                        .line(&self.name, &format!("{}: {n}", req.what), false);
                }
                if st.failing {
                    let left = self.spool.len();
                    self.log.line(
                        &self.name,
                        &format!("the receiver takes requests again ({left} still waiting)"),
                        true,
                    );
                    st.failing = false;
                }
                st.backoff = Duration::from_secs(1);
            }
            Outcome::Retry(why) => {
                lock(&self.stats).failed += 1;
                let fx = self.spool.spool_all();
                self.note(&fx);
                let where_ = if self.spool.on_disk() {
                    "the spool"
                } else {
                    "memory (no --export-spool)"
                };
                self.log.line(
                    &self.name,
                    &format!(
                        "{why}; {} requests wait in {where_}, next try in {}s",
                        self.spool.len(),
                        st.backoff.as_secs()
                    ),
                    !st.failing,
                );
                st.failing = true;
                st.next_try = Instant::now() + st.backoff;
                st.backoff = (st.backoff * 2).min(self.max_backoff);
            }
            Outcome::Drop(why) => {
                self.spool.pop_front();
                {
                    let mut s = lock(&self.stats);
                    s.failed += 1;
                    s.dropped += 1;
                }
                self.log
                    .line(&self.name, &format!("{}: {why}: dropped", req.what), true);
            }
            Outcome::Stop(why) => {
                lock(&self.stats).failed += 1;
                self.log.line(&self.name, &why, true);
                lock(&self.stats).stopped = Some(why);
                // Later windows are not queued; the spool keeps what
                // waits for a receiver that takes it.
                self.publish();
                return Step::Stopped;
            }
        }
        Step::Went
    }

    fn publish(&self) {
        let mut s = lock(&self.stats);
        s.queued = self.spool.len() as u64;
        s.queued_bytes = self.spool.bytes();
    }
}
