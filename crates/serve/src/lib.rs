//! vmscope's HTTP side (`vmscope serve`): `/metrics` in the Prometheus
//! exposition format (OpenMetrics) for every VM on the host, and with
//! `--profile` `/debug/pprof/profile?seconds=N`, a pprof of the host and its
//! active VMs from a rolling recording ([`profile`]).
//!
//! The server is tiny_http, a well-kept small HTTP/1.1 server: each client
//! connection is read on a thread of its own, so a client that sends
//! nothing, or one byte a second, holds only its own thread and never delays
//! a scrape. Every request is answered on a thread of its own too, so a slow
//! answer (a rolling profile waiting for its seconds) never holds up
//! `/metrics`. The host is sampled when scraped (counters are exact at
//! scrape time and nothing runs between scrapes), one scrape at a time.

pub mod profile;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vmscope_stat::account::{AccountOptions, Accountant};
use vmscope_stat::metrics::{ProfilerTotals, Totals};
use vmscope_stat::vmstat::{VmStat, VmStatOptions};

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address cannot be used.
    #[error("listening on {addr}: {message}")]
    Listen { addr: String, message: String },
    /// The first sample of the host failed.
    #[error("sampling the host: {0}")]
    Sample(#[from] vmscope_stat::StatError),
    /// The rolling recording of `--profile` could not start.
    #[error("--profile: {0}")]
    Profile(String),
}

/// What `serve` exports and where.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `HOST:PORT` to listen on (loopback by default: guest profiles and
    /// VM names are tenant data).
    pub listen: String,
    /// Per host CPU series: busy time, and time per VM (vm-stat).
    pub per_cpu: bool,
    /// Processes whose CPU is shared I/O work for all VMs.
    pub shared_io: Vec<u32>,
    /// Keep a rolling recording and answer `/debug/pprof/profile`.
    pub profile: Option<profile::ProfileOptions>,
}

/// What a scrape samples.
struct Sampler {
    acc: Accountant,
    vmstat: Option<VmStat>,
    totals: Totals,
}

/// A bound server.
pub struct Server {
    http: tiny_http::Server,
    sampler: Arc<Mutex<Sampler>>,
    rolling: Option<Arc<profile::Rolling>>,
}

impl Server {
    /// Bind and take the first sample (the counters start here).
    pub fn bind(opts: &ServeOptions) -> Result<Server, ServeError> {
        let http = tiny_http::Server::http(&opts.listen).map_err(|e| ServeError::Listen {
            addr: opts.listen.clone(),
            message: e.to_string(),
        })?;
        let mut acc = Accountant::new(AccountOptions {
            shared_io_pids: opts.shared_io.clone(),
            ..AccountOptions::default()
        });
        acc.sample()?;
        let vmstat = if opts.per_cpu {
            Some(VmStat::new(VmStatOptions::default())?)
        } else {
            None
        };
        let rolling = match &opts.profile {
            Some(p) => Some(profile::Rolling::start(p.clone())?),
            None => None,
        };
        Ok(Server {
            http,
            sampler: Arc::new(Mutex::new(Sampler {
                acc,
                vmstat,
                totals: Totals::new(opts.per_cpu),
            })),
            rolling,
        })
    }

    /// The address bound (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> String {
        match self.http.server_addr() {
            tiny_http::ListenAddr::IP(a) => a.to_string(),
            tiny_http::ListenAddr::Unix(a) => format!("{a:?}"),
        }
    }

    /// Answer requests until `stop` is set.
    pub fn run(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let req = match self.http.recv_timeout(Duration::from_millis(200)) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("vmscope serve: accepting a request: {e}");
                    continue;
                }
            };
            let sampler = Arc::clone(&self.sampler);
            let rolling = self.rolling.clone();
            let spawned = std::thread::Builder::new()
                .name("serve-request".into())
                .spawn(move || handle(req, &sampler, rolling.as_deref()));
            if let Err(e) = spawned {
                eprintln!("vmscope serve: cannot start a request thread: {e}");
            }
        }
        if let Some(r) = &self.rolling {
            r.stop();
        }
    }
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    // Both are ASCII constants of this file.
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
        .unwrap_or_else(|()| unreachable!("ASCII header"))
}

fn text(status: u16, body: String) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    tiny_http::Response::from_string(body)
        .with_status_code(status)
        .with_header(header("Content-Type", "text/plain; charset=utf-8"))
}

fn handle(req: tiny_http::Request, sampler: &Mutex<Sampler>, rolling: Option<&profile::Rolling>) {
    let (path, query) = match req.url().split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (req.url().to_string(), String::new()),
    };
    let resp = if *req.method() != tiny_http::Method::Get {
        text(405, "only GET is served\n".into())
    } else {
        match path.as_str() {
            "/metrics" => match metrics(sampler, rolling) {
                Ok(body) => tiny_http::Response::from_string(body).with_header(header(
                    "Content-Type",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )),
                Err(e) => text(500, format!("sampling the host failed: {e}\n")),
            },
            "/debug/pprof/profile" => match rolling {
                None => text(
                    404,
                    format!("{path}: not served: start vmscope serve with --profile\n"),
                ),
                Some(r) => match r.seconds(&query) {
                    Err(e) => text(400, format!("{e}\n")),
                    Ok(n) => match r.profile(n) {
                        // A known length rather than tiny_http's chunks
                        // past 32 KiB: simpler for every scraper.
                        Ok(body) => tiny_http::Response::from_data(body)
                            .with_chunked_threshold(usize::MAX)
                            .with_header(header("Content-Type", "application/octet-stream"))
                            .with_header(header(
                                "Content-Disposition",
                                "attachment; filename=\"profile.pb.gz\"",
                            )),
                        Err(e) => text(500, format!("{e}\n")),
                    },
                },
            },
            "/" => text(
                200,
                if rolling.is_some() {
                    "vmscope serve: /metrics, /debug/pprof/profile?seconds=N\n".into()
                } else {
                    "vmscope serve: /metrics\n".into()
                },
            ),
            _ => text(404, format!("{path}: not found (try /metrics)\n")),
        }
    };
    // A client that went away is its own business.
    let _ = req.respond(resp);
}

/// Sample the host (one scrape at a time) and encode the totals.
fn metrics(
    sampler: &Mutex<Sampler>,
    rolling: Option<&profile::Rolling>,
) -> Result<String, vmscope_stat::StatError> {
    let mut s = sampler
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Sampler {
        acc,
        vmstat,
        totals,
    } = &mut *s;
    if let (Some(iv), _) = acc.sample()? {
        totals.add(&iv);
    }
    if let Some(v) = vmstat.as_mut() {
        let iv = v.sample()?;
        let names = v
            .tracker()
            .current()
            .iter()
            .map(|d| (d.id, d.name.clone()))
            .collect();
        totals.add_vmstat(&iv, &names);
    }
    if let Some(r) = rolling {
        let profilers: Vec<ProfilerTotals> = r
            .costs()
            .into_iter()
            .map(|c| ProfilerTotals {
                domain: c.domain,
                cost_s: c.summary.cost_s,
                observed_s: c.summary.capacity_s,
                rate_hz: c.summary.last_hz,
            })
            .collect();
        totals.set_profilers(&profilers, r.budget());
    }
    Ok(totals.encode())
}

#[cfg(test)]
mod tests;
