//! `serve --export KIND=URL`: every `--export-interval` the `/metrics`
//! series go to each remote-write exporter and the rolling recording's new
//! slices, as one window, to each profile exporter (`vmscope_export`).
//!
//! Windows follow each other without gap or overlap: each takes the slices
//! after the last one taken (by their sequence number), and the recording
//! keeps slices at least an interval. Each window is written as a session
//! file (in `--export-archive DIR` when given, kept there, the oldest
//! removed past `--export-spool-max`; else in a temporary directory) and
//! read back as `report --format pprof` reads it, so what is exported is
//! what `vmscope report` shows of those seconds. Building and queueing
//! never waits for a receiver: each exporter sends on a thread of its own.

use crate::profile::Rolling;
use crate::{Sampler, ServeError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vmscope_export::exporter::{spool_subdir, ExportConfig};
use vmscope_export::spool::Request;
use vmscope_export::{
    otlp, pyroscope, remote_write, ExportKind, ExportOptions, ExportSpec, Exporter, ExporterStats,
    HostIdentity, ProfileWindow, VmIdentity, WindowCost,
};

/// `--export-interval` when none is given.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// `--export-spool-max` when none is given: 256 MiB.
pub const DEFAULT_SPOOL_MAX: u64 = 256 << 20;

/// Where and how often `serve` exports.
#[derive(Debug, Clone)]
pub struct ExportPlan {
    pub specs: Vec<ExportSpec>,
    pub options: ExportOptions,
    pub interval: Duration,
    /// `--export-spool DIR`: requests that wait survive a restart.
    pub spool: Option<PathBuf>,
    pub spool_max: u64,
    /// `--export-archive DIR`: each window's session file is kept.
    pub archive: Option<PathBuf>,
}

/// The running exporters; shared with the request handlers for
/// `/metrics`.
pub(crate) struct Exports {
    exporters: Vec<Exporter>,
    plan: ExportPlan,
    host: HostIdentity,
    /// The last slice taken and the windows made so far.
    progress: Mutex<(u64, u64)>,
}

impl Exports {
    /// Start every exporter (its client, its spool).
    pub fn start(plan: &ExportPlan, rolling: Option<&Rolling>) -> Result<Exports, ServeError> {
        let err = |e: vmscope_export::ExportError| ServeError::Export(e.to_string());
        if let Some(a) = &plan.archive {
            std::fs::create_dir_all(a).map_err(|e| {
                ServeError::Export(format!("--export-archive {}: {e}", a.display()))
            })?;
        }
        let mut exporters = Vec::new();
        for spec in &plan.specs {
            exporters.push(
                Exporter::start(ExportConfig {
                    spec: spec.clone(),
                    options: plan.options.clone(),
                    spool_dir: plan.spool.as_ref().map(|d| d.join(spool_subdir(spec))),
                    spool_max: plan.spool_max,
                    max_backoff: plan.interval.min(Duration::from_secs(30)),
                })
                .map_err(err)?,
            );
        }
        if let Some(r) = rolling {
            r.keep_at_least(plan.interval);
        }
        Ok(Exports {
            exporters,
            plan: plan.clone(),
            host: HostIdentity::of_this_host(),
            progress: Mutex::new((0, 0)),
        })
    }

    pub fn stats(&self) -> Vec<ExporterStats> {
        self.exporters.iter().map(Exporter::stats).collect()
    }

    /// Every interval until `stop`, then once more for the last seconds,
    /// then the exporters stop (what waits stays in the spool).
    pub fn run(&self, stop: &AtomicBool, sampler: &Mutex<Sampler>, rolling: Option<&Rolling>) {
        let mut next = Instant::now() + self.plan.interval;
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() < next {
                std::thread::sleep(Duration::from_millis(100).min(next - Instant::now()));
                continue;
            }
            next += self.plan.interval;
            // Late (a suspended host): the next tick an interval from now.
            if next < Instant::now() {
                next = Instant::now() + self.plan.interval;
            }
            self.tick(sampler, rolling);
        }
        self.tick(sampler, rolling);
        for e in &self.exporters {
            e.shutdown();
        }
    }

    fn wants(&self, profiles: bool) -> bool {
        self.exporters
            .iter()
            .any(|e| e.spec().kind.sends_profiles() == profiles && !e.stopped())
    }

    /// One window to every exporter.
    pub fn tick(&self, sampler: &Mutex<Sampler>, rolling: Option<&Rolling>) {
        if self.wants(false) {
            match crate::metrics(sampler, rolling, Some(self)) {
                Ok(text) => self.metrics_window(&text),
                Err(e) => eprintln!("vmscope serve: export: sampling the host: {e}"),
            }
        }
        if let (true, Some(r)) = (self.wants(true), rolling) {
            if let Err(e) = self.profile_window(r) {
                eprintln!(
                    "vmscope serve: export: {}",
                    vmscope_model::text::visible(&e)
                );
            }
        }
    }

    fn metrics_window(&self, text: &str) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let body = remote_write::request(text, &self.host.name, now_ms)
            .and_then(|r| remote_write::encode(&r));
        let body = match body {
            Ok(b) => b,
            Err(e) => {
                eprintln!("vmscope serve: export remote-write: encoding /metrics: {e}");
                return;
            }
        };
        let req = Request {
            query: String::new(),
            content_type: remote_write::CONTENT_TYPE.into(),
            content_encoding: Some(remote_write::CONTENT_ENCODING.into()),
            headers: remote_write::HEADERS
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            body,
            what: format!("the metrics of {now_ms} ms"),
        };
        for e in &self.exporters {
            if e.spec().kind == ExportKind::RemoteWrite {
                e.send(vec![req.clone()]);
            }
        }
    }

    fn profile_window(&self, rolling: &Rolling) -> Result<(), String> {
        let (after, seq) = *self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seq = seq + 1;
        // Without an archive the session lives as long as `tmp`.
        let tmp = if self.plan.archive.is_none() {
            Some(tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?)
        } else {
            None
        };
        let path = if let Some(dir) = &self.plan.archive {
            dir.join(format!("window-{}.db", archive_stamp()))
        } else if let Some(t) = &tmp {
            t.path().join("window.db")
        } else {
            return Err("no directory for the window".into());
        };
        let Some(got) = rolling.export_window(after, &path)? else {
            return Ok(());
        };
        if got.missed > 0 {
            eprintln!(
                "vmscope serve: export: {} half-second slices went from the window before they were exported",
                got.missed
            );
        }
        *self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (got.last_seq, seq);
        if let Some(dir) = &self.plan.archive {
            trim_archive(dir, self.plan.spool_max);
        }
        let window = ProfileWindow {
            seq,
            start_unix_nanos: got.start_unix_nanos,
            duration_nanos: got.duration_nanos,
            profile: got.profile,
            host: self.host.clone(),
            vms: got
                .vms
                .iter()
                .map(|(name, pid)| VmIdentity {
                    name: name.clone(),
                    uuid: pid.and_then(uuid_of),
                })
                .collect(),
            costs: got
                .costs
                .iter()
                .map(|c| WindowCost {
                    domain: c.domain.clone(),
                    cost_s: c.summary.cost_s,
                    observed_s: c.summary.capacity_s,
                    rate_hz: c.summary.last_hz,
                })
                .collect(),
        };
        for e in &self.exporters {
            match e.spec().kind {
                ExportKind::Otlp => e.send(vec![Request {
                    query: String::new(),
                    content_type: otlp::CONTENT_TYPE.into(),
                    content_encoding: None,
                    headers: vec![(
                        otlp::VERSION_HEADER.into(),
                        otlp::DEVELOPMENT_VERSION.into(),
                    )],
                    body: otlp::encode(&window),
                    what: format!("window {seq}"),
                }]),
                ExportKind::Pyroscope => match pyroscope::requests(&window) {
                    Ok(reqs) => e.send(reqs),
                    Err(err) => eprintln!("vmscope serve: export pyroscope: window {seq}: {err}"),
                },
                ExportKind::RemoteWrite => {}
            }
        }
        Ok(())
    }
}

/// An archived window's name: the time it was cut, in ms since the epoch
/// (13 digits until the year 2286), so names sort in time across restarts.
fn archive_stamp() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{ms:013}")
}

/// A VM's `-uuid`, from its QEMU command line.
fn uuid_of(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    vmscope_discover::cmdline::QemuCmdline::parse(&argv).uuid
}

/// Remove the oldest archived windows while they hold more than `max`
/// bytes (the newest always stays).
fn trim_archive(dir: &Path, max: u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(String, PathBuf, u64)> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name.starts_with("window-") && name.ends_with(".db"))
                .then(|| (name, e.path(), e.metadata().map_or(0, |m| m.len())))
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.2).sum();
    for (_, path, size) in &files[..files.len().saturating_sub(1)] {
        if total <= max {
            break;
        }
        let _ = std::fs::remove_file(path);
        total -= size;
    }
}
