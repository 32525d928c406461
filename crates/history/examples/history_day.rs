//! A long history made from a short real one, for the benchmark of reports
//! over history (bench/history-replay): every interval of a seed history
//! (recorded by `serve --profile --history` beside real or simulated VMs)
//! is written again, in turn and over and over, through the real
//! [`Recorder`], with its times moved so that the new history ends now
//! and covers `--seconds` (a day by default). The documents, timelines,
//! profile rows, bins and scales are the seed's own; only their times
//! change. Segments, retention, compression and the chaining of documents
//! are the recorder's, so the result is what a day of `serve` writes for
//! that host, up to the repetition.
//!
//! usage: history_day SEED_DIR OUT_DIR [--seconds N] [--segment SECONDS]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vmscope_history::recorder::ProfileInfo;
use vmscope_history::{History, HistoryOptions, Interval, Recorder};
use vmscope_model::{Profile, UNKNOWN_SLICE};
use vmscope_store::{ScaleSecond, Session, TimelineRow};

/// One interval of the seed, with everything it carried.
struct SeedInterval {
    t_end: f64,
    interval_s: f64,
    doc: Vec<u8>,
    timeline: Vec<TimelineRow>,
    /// Rows keyed by absolute (wall-clock, whole) seconds in `second`.
    host: Profile,
    agent: Profile,
    scales: Vec<ScaleSecond>,
}

fn usage() -> ! {
    eprintln!("usage: history_day SEED_DIR OUT_DIR [--seconds N] [--segment SECONDS]");
    std::process::exit(2);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut seed, mut out, mut seconds, mut segment) = (None, None, 86_400u64, 1800u64);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage());
            }
            "--segment" => {
                segment = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage());
            }
            _ if seed.is_none() => seed = Some(PathBuf::from(a)),
            _ if out.is_none() => out = Some(PathBuf::from(a)),
            _ => usage(),
        }
    }
    let (Some(seed), Some(out)) = (seed, out) else {
        usage()
    };
    std::fs::create_dir_all(&out)?;
    let (intervals, meta, events, callchain, domains, build_ids) = read_seed(&seed)?;
    if intervals.is_empty() {
        return Err(format!("{}: the seed history holds no interval", seed.display()).into());
    }
    // The seed's usual interval (its first may be cut short).
    let mut lengths: Vec<f64> = intervals.iter().map(|i| i.interval_s).collect();
    lengths.sort_by(f64::total_cmp);
    let iv = lengths[lengths.len() / 2];
    let n = (seconds as f64 / iv).round() as usize;
    // The new history ends at the last whole interval before now.
    let end = (vmscope_history::time::now() / iv).floor() * iv + 0.004;
    let first_end = end - (n as f64 - 1.0) * iv;
    let origin = (first_end - iv).floor() - 1.0;
    let mut rec = Recorder::open(HistoryOptions {
        dir: out.clone(),
        segment: Duration::from_secs(segment),
        max_size: u64::MAX,
        max_age: Duration::from_secs(30 * 86_400),
    })?;
    rec.set_meta(meta);
    rec.set_profile(ProfileInfo {
        origin,
        events,
        callchain,
    });
    rec.set_domains(domains, build_ids);
    eprintln!(
        "history_day: {} seed intervals ({:.0} s) written {} times over to {} intervals of {:.2} s in {}",
        intervals.len(),
        intervals.len() as f64 * iv,
        n.div_ceil(intervals.len()),
        n,
        iv,
        out.display()
    );
    let began = Instant::now();
    let mut said = Instant::now();
    for i in 0..n {
        let s = &intervals[i % intervals.len()];
        let t_end = first_end + i as f64 * iv;
        // Whole seconds the seed's rows move by.
        let shift = (t_end - s.t_end).round();
        let sec = |abs: u32| -> u32 {
            if abs == UNKNOWN_SLICE {
                abs
            } else {
                (f64::from(abs) + shift - origin).max(0.0) as u32
            }
        };
        let host = s.host.with_seconds(sec);
        let agent = s.agent.with_seconds(sec);
        let scales = s
            .scales
            .iter()
            .map(|x| ScaleSecond {
                second: sec(x.second),
                ..x.clone()
            })
            .collect();
        rec.append(Interval {
            t_end,
            interval_s: s.interval_s,
            doc: &s.doc,
            timeline: s.timeline.clone(),
            host: Some(&host),
            agent: Some(&agent),
            scales,
        })?;
        for note in rec.take_notes() {
            eprintln!("history_day: {note}");
        }
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            let done = (i + 1) as f64 / n as f64;
            let spent = began.elapsed().as_secs_f64();
            eprintln!(
                "history_day: {:.0} % ({} of {n} intervals), about {:.0} s left",
                100.0 * done,
                i + 1,
                spent / done - spent
            );
        }
    }
    let state = rec.state().clone();
    rec.close();
    eprintln!(
        "history_day: {} intervals in {} segments, {:.1} MiB, in {:.0} s",
        state.intervals,
        state.segments_started,
        vmscope_history::segments(&out)?
            .iter()
            .map(|(_, p)| vmscope_history::segment_bytes(p))
            .sum::<u64>() as f64
            / f64::from(1 << 20),
        began.elapsed().as_secs_f64()
    );
    Ok(())
}

type Seed = (
    Vec<SeedInterval>,
    Vec<(String, String)>,
    Vec<vmscope_model::SessionEvent>,
    bool,
    Vec<vmscope_store::DomainRecord>,
    Vec<(String, String)>,
);

/// The seed's intervals in time order, each with the profile rows of the
/// seconds it ended (a second belongs to the first interval ending after
/// it), and what every segment carries.
fn read_seed(dir: &std::path::Path) -> Result<Seed, Box<dyn std::error::Error>> {
    let h = History::open(dir)?;
    let Some((a, b)) = h.span() else {
        return Err(format!("{}: no interval recorded", dir.display()).into());
    };
    let docs = h.frames(a - 1.0, b + 1.0)?;
    let timeline = h.timeline(a - 1.0, b + 1.0, 0.0)?;
    let mut out: Vec<SeedInterval> = docs
        .into_iter()
        .map(|d| SeedInterval {
            timeline: Vec::new(),
            t_end: d.t_end,
            interval_s: d.interval_s,
            doc: d.doc,
            host: Profile::new(),
            agent: Profile::new(),
            scales: Vec::new(),
        })
        .collect();
    if out.is_empty() {
        return Err(format!("{}: no interval document recorded", dir.display()).into());
    }
    // Each domain's timeline row goes with the document whose end is
    // nearest to its own (the timeline's times are bucketed to 1 ms).
    for r in timeline {
        let i = out.partition_point(|d| d.t_end < r.t_end);
        let i = if i == out.len() || (i > 0 && r.t_end - out[i - 1].t_end < out[i].t_end - r.t_end)
        {
            i - 1
        } else {
            i
        };
        out[i].timeline.push(r);
    }
    let ends: Vec<f64> = out.iter().map(|i| i.t_end).collect();
    // The interval a wall-clock second ended in.
    let owner = |abs: f64| ends.partition_point(|e| *e < abs + 1.0).min(ends.len() - 1);
    let (mut meta, mut events, mut callchain) = (Vec::new(), Vec::new(), false);
    let (mut domains, mut build_ids) = (BTreeMap::new(), BTreeMap::new());
    for (_, path) in vmscope_history::segments(dir)? {
        let s = Session::open_compact(&path)?;
        let m = s.meta()?;
        let start: f64 = m
            .get("started_at")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{}: no started_at", path.display()))?;
        if meta.is_empty() {
            for k in ["hostname", "kernel", "cpus"] {
                if let Some(v) = m.get(k) {
                    meta.push((k.to_string(), v.clone()));
                }
            }
            callchain = m.get("callchain").map(String::as_str) == Some("1");
            events = s.events()?;
        }
        for d in s.domains()? {
            domains.insert(d.domain.name.clone(), d);
        }
        build_ids.extend(s.build_ids()?);
        for agent in [false, true] {
            for r in s
                .block_rows(agent, 0, UNKNOWN_SLICE - 1)?
                .unwrap_or_default()
            {
                if r.key.second == UNKNOWN_SLICE {
                    continue;
                }
                let abs = (start + f64::from(r.key.second)).round();
                let i = owner(abs);
                let mut k = r.key;
                k.second = abs as u32;
                let p = if agent {
                    &mut out[i].agent
                } else {
                    &mut out[i].host
                };
                p.add(k, r.samples, r.period);
            }
        }
        for ev in 0..events.len() as u32 {
            for (sec, dom, ctx, n) in s.bins(ev)? {
                if let Some(c) = vmscope_model::Context::parse(&ctx) {
                    let abs = (start + f64::from(sec)).round();
                    out[owner(abs)]
                        .host
                        .add_bin(abs as u32, ev, dom.into(), c, n);
                }
            }
        }
        for x in s.scale_seconds(0, UNKNOWN_SLICE - 1)? {
            let abs = (start + f64::from(x.second)).round();
            out[owner(abs)].scales.push(ScaleSecond {
                second: abs as u32,
                ..x
            });
        }
    }
    Ok((
        out,
        meta,
        events,
        callchain,
        domains.into_values().collect(),
        build_ids.into_iter().collect(),
    ))
}
