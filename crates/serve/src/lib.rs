//! vmscope's HTTP side (`vmscope serve`): `/metrics` in the Prometheus
//! exposition format (OpenMetrics) for every VM on the host, and with
//! `--profile` `/debug/pprof/profile?seconds=N`, a pprof of the host and its
//! active VMs from a rolling recording ([`profile`]).
//!
//! The HTTP side is `http`, on hyper and rustls: each client connection is
//! a task of its own and each answer is built on a thread of its own, so a
//! client that sends nothing, or one byte a second, holds only its own
//! connection and never delays a scrape, and a slow answer (a rolling
//! profile waiting for its seconds) never holds up `/metrics`. With
//! `--tls-cert` it speaks HTTPS, with client certificates or a token or
//! password checked on every request. With `--export` ([`export`]) it also
//! pushes metrics and profiles to receivers (`vmscope_export`). The host is sampled when scraped (counters are exact at
//! scrape time and nothing runs between scrapes), one scrape at a time.

pub mod export;
pub mod history;
mod http;
mod page;
pub mod profile;

pub use http::{client_auth, ClientAuth, Security, TlsFiles};

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
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
    /// An exporter could not start (its message names the option).
    #[error("{0}")]
    Export(String),
    /// A TLS or credential file cannot be used (the message names it).
    #[error("{0}")]
    Security(String),
    /// `--history DIR` cannot be recorded (the message names it and why).
    #[error("{0}")]
    History(String),
}

/// What `serve` exports and where.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `HOST:PORT` to listen on (loopback by default: guest profiles and
    /// VM names are tenant data).
    pub listen: String,
    /// Per host CPU series: busy time, and time per VM (vm-stat).
    pub per_cpu: bool,
    /// Culprits per VM with series of their own in
    /// `vmscope_vcpu_wait_seconds_total` (default
    /// [`vmscope_stat::metrics::DEFAULT_WAIT_TOP`]).
    pub wait_culprits: Option<usize>,
    /// Processes whose CPU is shared I/O work for all VMs.
    pub shared_io: Vec<u32>,
    /// Keep a rolling recording and answer `/debug/pprof/profile`.
    pub profile: Option<profile::ProfileOptions>,
    /// `--export`: where profiles and metrics are pushed.
    pub export: Option<export::ExportPlan>,
    /// TLS and client authentication of the endpoints.
    pub security: Security,
    /// `--history`: the flight recorder.
    pub history: Option<history::HistoryPlan>,
}

/// What a scrape samples.
pub(crate) struct Sampler {
    acc: Accountant,
    vmstat: Option<VmStat>,
    totals: Totals,
    /// With `--history` the keeper samples `acc` every interval and adds
    /// each interval to `totals`: a scrape then encodes them as they are
    /// (at most one interval old) instead of sampling a second time. One
    /// accountant for both: a second one loaded a second set of eBPF wait
    /// programs on every context switch of the host, a second softirq
    /// ring thread and a second exit listener.
    fed: bool,
}

impl Sampler {
    /// Sample the host for the history: the interval is added to the
    /// totals `/metrics` serves, and returned.
    pub(crate) fn sample_for_history(
        &mut self,
    ) -> Result<
        (
            Option<vmscope_stat::account::AccountInterval>,
            Vec<vmscope_stat::tracker::Change>,
        ),
        vmscope_stat::StatError,
    > {
        self.fed = true;
        let (iv, changes) = self.acc.sample()?;
        if let Some(iv) = &iv {
            self.totals.add(iv);
        }
        Ok((iv, changes))
    }
}

/// A bound server.
pub struct Server {
    http: http::Listener,
    sampler: Arc<Mutex<Sampler>>,
    rolling: Option<Arc<profile::Rolling>>,
    exports: Option<Arc<export::Exports>>,
    history: Option<Arc<history::Keeper>>,
}

impl Server {
    /// Bind and take the first sample (the counters start here).
    pub fn bind(opts: &ServeOptions) -> Result<Server, ServeError> {
        let http = http::Listener::bind(&opts.listen, &opts.security).map_err(|(listen, e)| {
            if listen {
                ServeError::Listen {
                    addr: opts.listen.clone(),
                    message: e,
                }
            } else {
                ServeError::Security(e)
            }
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
        // The history's directory is checked and locked before the
        // rolling recording starts (a second serve is refused at once).
        let history = match &opts.history {
            Some(p) => Some(Arc::new(history::Keeper::open(p.clone())?)),
            None => None,
        };
        let rolling = match &opts.profile {
            Some(p) => Some(profile::Rolling::start(p.clone())?),
            None => None,
        };
        let exports = match &opts.export {
            Some(plan) => Some(Arc::new(export::Exports::start(plan, rolling.as_deref())?)),
            None => None,
        };
        Ok(Server {
            http,
            sampler: Arc::new(Mutex::new(Sampler {
                acc,
                vmstat,
                totals: Totals::new(opts.per_cpu).with_wait_top(
                    opts.wait_culprits
                        .unwrap_or(vmscope_stat::metrics::DEFAULT_WAIT_TOP),
                ),
                fed: false,
            })),
            rolling,
            exports,
            history,
        })
    }

    /// What `--profile` cannot see and why (for stderr at the start).
    pub fn warnings(&self) -> Vec<String> {
        self.rolling
            .as_ref()
            .map(|r| r.warnings())
            .unwrap_or_default()
    }

    /// The address bound (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> String {
        self.http.local_addr()
    }

    /// `https` with `--tls-cert`, else `http`.
    pub fn scheme(&self) -> &'static str {
        self.http.scheme()
    }

    /// Answer requests (and export, with `--export`) until `stop` is set.
    pub fn run(&self, stop: &AtomicBool) {
        let sampler = Arc::clone(&self.sampler);
        let rolling = self.rolling.clone();
        let exports = self.exports.clone();
        let history = self.history.clone();
        std::thread::scope(|scope| {
            if let Some(h) = &self.history {
                let (rolling, sampler) = (self.rolling.as_deref(), &self.sampler);
                std::thread::Builder::new()
                    .name("serve-history".into())
                    .spawn_scoped(scope, move || h.run(stop, rolling, sampler))
                    .map_err(|e| eprintln!("vmscope serve: cannot start the history thread: {e}"))
                    .ok();
            }
            if let Some(e) = &self.exports {
                let (sampler, rolling) = (&self.sampler, self.rolling.as_deref());
                std::thread::Builder::new()
                    .name("serve-export".into())
                    .spawn_scoped(scope, move || e.run(stop, sampler, rolling))
                    .map_err(|e| eprintln!("vmscope serve: cannot start the export thread: {e}"))
                    .ok();
            }
            self.http.run(stop, move |req: &http::Request| {
                handle(
                    req,
                    &sampler,
                    rolling.as_deref(),
                    exports.as_deref(),
                    history.as_deref(),
                )
            });
        });
        if let Some(r) = &self.rolling {
            r.stop();
        }
    }
}

fn handle(
    req: &http::Request,
    sampler: &Mutex<Sampler>,
    rolling: Option<&profile::Rolling>,
    exports: Option<&export::Exports>,
    history: Option<&history::Keeper>,
) -> http::Response {
    let (path, query) = match req.target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (req.target.clone(), String::new()),
    };
    if req.method != "GET" {
        return http::Response::text(405, "only GET is served\n");
    }
    match path.as_str() {
        "/metrics" => match metrics(sampler, rolling, exports) {
            Ok(body) => http::Response::new(
                200,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                match history {
                    Some(h) => history::insert_metrics(&body, h.dir(), &h.state()),
                    None => body,
                }
                .into_bytes(),
            ),
            Err(e) => http::Response::text(500, format!("sampling the host failed: {e}\n")),
        },
        "/debug/pprof/profile" => match rolling {
            None => http::Response::text(
                404,
                format!("{path}: not served: start vmscope serve with --profile\n"),
            ),
            Some(r) => match r.seconds(&query) {
                Err(e) => http::Response::text(400, format!("{e}\n")),
                Ok(n) => match r.profile(n) {
                    Ok(body) => http::Response::new(200, "application/octet-stream", body)
                        .with_header(
                            "Content-Disposition",
                            "attachment; filename=\"profile.pb.gz\"",
                        ),
                    Err(e) => http::Response::text(500, format!("{e}\n")),
                },
            },
        },
        "/" if history.is_some() => match history.map(|h| h.read(|r| page::page(r, &query))) {
            Some(Ok(body)) => {
                http::Response::new(200, "text/html; charset=utf-8", body.into_bytes())
            }
            Some(Err((code, e))) => http::Response::text(code, format!("{e}\n")),
            None => http::Response::text(500, "no history\n"),
        },
        "/report" if history.is_some() => {
            match history.map(|h| h.read(|r| page::report(r, &query))) {
                Some(Ok(body)) => http::Response::new(200, "text/html; charset=utf-8", body),
                Some(Err((code, e))) => http::Response::text(code, format!("{e}\n")),
                None => http::Response::text(500, "no history\n"),
            }
        }
        "/" => http::Response::text(
            200,
            if rolling.is_some() {
                "vmscope serve: /metrics, /debug/pprof/profile?seconds=N\n"
            } else {
                "vmscope serve: /metrics\n"
            },
        ),
        _ => http::Response::text(404, format!("{path}: not found (try /metrics)\n")),
    }
}

/// Sample the host (one scrape at a time) and encode the totals, with the
/// exporters' counters.
pub(crate) fn metrics(
    sampler: &Mutex<Sampler>,
    rolling: Option<&profile::Rolling>,
    exports: Option<&export::Exports>,
) -> Result<String, vmscope_stat::StatError> {
    let mut s = sampler
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Sampler {
        acc,
        vmstat,
        totals,
        fed,
    } = &mut *s;
    if !*fed {
        if let (Some(iv), _) = acc.sample()? {
            totals.add(&iv);
        }
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
        totals.set_profile_state(r.state());
    }
    let text = totals.encode();
    Ok(match exports {
        Some(e) => vmscope_export::metrics::insert(&text, &e.stats()),
        None => text,
    })
}

#[cfg(test)]
mod tests;
