//! `serve --history DIR`: the flight recorder's thread. Every interval
//! (1 s by default) it samples the host as `top` does (the accountant
//! `/metrics` reads, whose totals it feeds: scrapes then sample nothing
//! themselves), takes the rolling profile's slices since the last interval
//! (with `--profile`), builds `top`'s frame from them with `top`'s own
//! builders (`vmscope_top::live::frame_of`, `top_functions_of` over the last
//! `--window` intervals) and hands the frame, each domain's timeline row,
//! the profile rows and the active VMs' scale parts to the
//! `vmscope_history::Recorder`, which owns the files. Its notes (a pause
//! on a full disk, a resume, a clock step) go to stderr; its state to
//! `/metrics` (`vmscope_history_*`).

use crate::profile::{Rolling, SliceCopy};
use crate::{Sampler, ServeError};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vmscope_history::recorder::ProfileInfo;
use vmscope_history::{HistoryOptions, Interval, Recorder, RecorderState};
use vmscope_model::{Profile, Role};
use vmscope_store::{DomainRecord, ScaleSecond, TimelineRow};
use vmscope_top::live::{frame_of, top_functions_of, FrameParts, SliceFunctions, SliceRef};

/// What `--history` keeps and how often.
#[derive(Debug, Clone)]
pub struct HistoryPlan {
    pub options: HistoryOptions,
    /// One interval (`--history-interval`, 1 s).
    pub interval: Duration,
    /// Intervals each frame's function lists cover (top's `--window`).
    pub window: usize,
    /// Functions kept per domain and interval.
    pub functions: usize,
}

/// The recorder and what it did.
pub struct Keeper {
    recorder: Mutex<Option<Recorder>>,
    /// The history as the page reads it (opened at the first request).
    reader: Mutex<Option<vmscope_history::History>>,
    plan: HistoryPlan,
    state: Mutex<RecorderState>,
}

/// (second, VM, event) of an active VM's scale parts.
type ScaleKey = (u32, Arc<str>, u32);

/// One slice as `top_functions_of` reads it: summed by function once, when
/// it arrives (event 0 per VM).
struct Kept {
    end_s: f64,
    functions: SliceFunctions,
}

impl Keeper {
    /// Check the directory and take its lock (before anything is served).
    pub fn open(plan: HistoryPlan) -> Result<Keeper, ServeError> {
        let recorder =
            Recorder::open(plan.options.clone()).map_err(|e| ServeError::History(e.to_string()))?;
        Ok(Keeper {
            recorder: Mutex::new(Some(recorder)),
            reader: Mutex::new(None),
            plan,
            state: Mutex::new(RecorderState::default()),
        })
    }

    /// The history's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.plan.options.dir
    }

    /// Run `f` on the history as recorded so far (one request at a time).
    pub fn read<T>(
        &self,
        f: impl FnOnce(&mut vmscope_history::History) -> Result<T, (u16, String)>,
    ) -> Result<T, (u16, String)> {
        let mut r = self
            .reader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.is_none() {
            *r =
                Some(vmscope_history::History::open(self.dir()).map_err(|e| (500, e.to_string()))?);
        }
        let h = r.as_mut().ok_or((500, String::new()))?;
        let out = f(h);
        for line in h.take_skipped() {
            eprintln!("vmscope serve: {}", vmscope_model::text::visible(&line));
        }
        out
    }

    /// What the recorder did so far.
    pub fn state(&self) -> RecorderState {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Record until `stop` is set; the open segment is closed cleanly then.
    pub(crate) fn run(
        &self,
        stop: &AtomicBool,
        rolling: Option<&Rolling>,
        sampler: &Mutex<Sampler>,
    ) {
        let Some(mut rec) = self
            .recorder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let proc = vmscope_linux::ProcRoot::system();
        let hostname = proc.sysctl("kernel.hostname").unwrap_or_default();
        let mut meta = vec![("hostname".to_string(), hostname.clone())];
        if let Ok(k) = proc.sysctl("kernel.osrelease") {
            meta.push(("kernel".into(), k));
        }
        if let Some(r) = rolling {
            rec.set_profile(ProfileInfo {
                origin: r.origin(),
                events: r.events(),
                callchain: r.callchain(),
            });
        }
        // The accountant `/metrics` reads, sampled here every interval
        // (its first interval here runs from serve's start, and is not
        // recorded).
        let sample = || {
            sampler
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .sample_for_history()
        };
        if let Err(e) = sample() {
            eprintln!("vmscope serve: history: sampling the host failed, nothing is recorded: {e}");
            return;
        }
        meta.push(("cpus".into(), acc_cpus().to_string()));
        rec.set_meta(meta);
        let started = Instant::now();
        let mut last_seq = 0;
        let mut kept: VecDeque<Kept> = VecDeque::new();
        let mut said_error = false;
        'outer: while !stop.load(Ordering::Relaxed) {
            // Intervals end on whole multiples of the interval on the wall
            // clock, as `top`'s do: both cover the same seconds.
            let due = Instant::now() + vmscope_history::time::until_next_tick(self.plan.interval);
            loop {
                if stop.load(Ordering::Relaxed) {
                    break 'outer;
                }
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(100)));
            }
            let t_end = vmscope_history::time::now();
            let (iv, changes) = match sample() {
                Ok((Some(iv), c)) => (iv, c),
                Ok((None, _)) => continue,
                Err(e) => {
                    eprintln!("vmscope serve: history: sampling the host: {e}");
                    continue;
                }
            };
            // The rolling profile's slices since the last interval.
            let slices: Vec<SliceCopy> = rolling
                .map(|r| r.slices_after(last_seq))
                .unwrap_or_default();
            if let Some(s) = slices.last() {
                last_seq = s.seq;
            }
            let mut host = Profile::new();
            let mut agent = Profile::new();
            let mut scales: HashMap<ScaleKey, (u64, u64, u64)> = HashMap::new();
            for s in slices {
                add_profile(&mut host, &s.host);
                add_profile(&mut agent, &s.agent);
                let second = s.start_s.max(0.0).floor() as u32;
                for ((d, e), v) in &s.host_guest {
                    scales.entry((second, d.clone(), *e)).or_default().0 += v;
                }
                for ((d, e), (p, k)) in &s.agent_busy {
                    let x = scales.entry((second, d.clone(), *e)).or_default();
                    x.1 += p;
                    x.2 += k;
                }
                let host_guest = event0(&s.host_guest, |v| *v);
                let agent_busy = event0(&s.agent_busy, |v| v.0);
                kept.push_back(Kept {
                    end_s: s.end_s,
                    functions: SliceFunctions::of(&SliceRef {
                        host: &s.host,
                        agent: &s.agent,
                        host_guest: &host_guest,
                        agent_busy: &agent_busy,
                    }),
                });
            }
            // The function lists cover the last `window` intervals.
            if let Some(last) = kept.back().map(|k| k.end_s) {
                let span = self.plan.interval.as_secs_f64() * self.plan.window.max(1) as f64;
                while kept.front().is_some_and(|k| last - k.end_s >= span) {
                    kept.pop_front();
                }
            }
            let (mut roles, mut reasons) = (HashMap::new(), HashMap::new());
            let mut domains = Vec::new();
            let mut build_ids = Vec::new();
            if let Some(r) = rolling {
                let (ds, meta, ids) = r.domains();
                for (d, detail) in ds {
                    roles.insert(d.name.clone(), d.role);
                    domains.push(DomainRecord {
                        domain: d,
                        status: "running".into(),
                        ended_at: None,
                        detail,
                    });
                }
                for (k, why) in meta {
                    if let Some(vm) = k.strip_prefix("agent_") {
                        reasons.insert(vm.to_string(), why);
                    }
                }
                build_ids = ids;
            } else {
                for v in &iv.vms {
                    roles.insert(v.name.clone(), Role::Unmonitored);
                }
            }
            let refs: Vec<&SliceFunctions> = kept.iter().map(|k| &k.functions).collect();
            let host_lost: u64 = host.lost.values().sum();
            let mut frame = frame_of(
                &iv,
                FrameParts {
                    functions: top_functions_of(&refs, &roles, self.plan.functions),
                    roles: &roles,
                    reasons: &reasons,
                    host_lost,
                    vm_lost: &HashMap::new(),
                    hostname: &hostname,
                    notes: changes.iter().map(ToString::to_string).collect(),
                },
            );
            frame.time_s = started.elapsed().as_secs_f64();
            frame.at = Some(vmscope_history::time::rfc3339(t_end, false));
            let doc = serde_json::to_vec(&frame).unwrap_or_default();
            let timeline = frame
                .domains
                .iter()
                .map(|d| TimelineRow {
                    t_end,
                    interval_s: frame.interval_s,
                    domain: d.name.clone(),
                    cpu_s: d.cpu_pct / 100.0 * frame.interval_s,
                    steal_s: d.steal_pct / 100.0 * frame.interval_s * f64::from(d.vcpus),
                    io_s: d.io_cpu_pct / 100.0 * frame.interval_s,
                    io_ops: d.io_ops_per_s * frame.interval_s,
                })
                .collect();
            rec.set_domains(domains, build_ids);
            let r = rec.append(Interval {
                t_end,
                interval_s: frame.interval_s,
                doc: &doc,
                timeline,
                host: rolling.is_some().then_some(&host),
                agent: rolling.is_some().then_some(&agent),
                scales: scales
                    .into_iter()
                    .map(|((second, d, event), (h, a, k))| ScaleSecond {
                        second,
                        domain: d.to_string(),
                        event,
                        host_period: h,
                        agent_period: a,
                        agent_samples: k,
                    })
                    .collect(),
            });
            for note in rec.take_notes() {
                eprintln!("vmscope serve: {}", vmscope_model::text::visible(&note));
            }
            match r {
                Ok(()) => said_error = false,
                Err(e) if !said_error => {
                    eprintln!("vmscope serve: history: {e}");
                    said_error = true;
                }
                Err(_) => {}
            }
            *self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = rec.state().clone();
        }
        rec.close();
    }
}

/// Host CPUs (for the segments' meta).
fn acc_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

fn add_profile(into: &mut Profile, p: &Profile) {
    for (k, c) in &p.rows {
        into.add(k.clone(), c.samples, c.period);
    }
    for (k, n) in &p.bins {
        *into.bins.entry(k.clone()).or_default() += n;
    }
    for (e, n) in &p.lost {
        *into.lost.entry(*e).or_default() += n;
    }
}

/// A per-(VM, event) map's event 0, per VM.
fn event0<V>(m: &HashMap<(Arc<str>, u32), V>, f: impl Fn(&V) -> u64) -> HashMap<Arc<str>, u64> {
    m.iter()
        .filter(|((_, e), _)| *e == 0)
        .map(|((d, _), v)| (d.clone(), f(v)))
        .collect()
}

/// `/metrics` lines of the history, inserted before `# EOF`.
pub fn insert_metrics(text: &str, dir: &std::path::Path, s: &RecorderState) -> String {
    let shown = dir.display().to_string();
    let label = vmscope_model::text::label_value(&shown);
    let lines = format!(
        "# HELP vmscope_history_paused 1 while the history is paused (its file system is full).\n\
         # TYPE vmscope_history_paused gauge\n\
         vmscope_history_paused{{dir=\"{label}\"}} {}\n\
         # HELP vmscope_history_intervals Intervals kept in the history since serve started.\n\
         # TYPE vmscope_history_intervals counter\n\
         vmscope_history_intervals_total{{dir=\"{label}\"}} {}\n\
         # HELP vmscope_history_dropped Intervals dropped while the history was paused.\n\
         # TYPE vmscope_history_dropped counter\n\
         vmscope_history_dropped_total{{dir=\"{label}\"}} {}\n\
         # HELP vmscope_history_segments_removed Segments retention removed.\n\
         # TYPE vmscope_history_segments_removed counter\n\
         vmscope_history_segments_removed_total{{dir=\"{label}\"}} {}\n\
         # HELP vmscope_history_bytes Bytes of the history's segments.\n\
         # TYPE vmscope_history_bytes gauge\n\
         vmscope_history_bytes{{dir=\"{label}\"}} {}\n",
        u8::from(s.paused.is_some()),
        s.intervals,
        s.dropped,
        s.segments_removed,
        s.bytes
    );
    match text.rfind("# EOF") {
        Some(i) => format!("{}{lines}{}", &text[..i], &text[i..]),
        None => format!("{text}{lines}"),
    }
}
