//! The sampling loop every benchmark runs on:
//!
//! - points run in interleaved, shuffled rounds ([`crate::schedule::Plan`]):
//!   warm-ups discarded, at least `repeat` samples, then more until the 95 %
//!   interval is within `--ci` of the mean, or the cap;
//! - a sample taken while other load ran on the host (more than the busy
//!   rule allows) is redone up to `busy_retries` times, then kept flagged;
//! - a VM whose QEMU is gone fails every remaining point that uses it (the
//!   sweep goes on with the others); a point whose command fails is marked
//!   failed with the reason;
//! - rows go to the JSON lines or CSV writer as each sample arrives;
//! - `--record DIR`: after its samples, each point runs once more while
//!   `vmscope record -a` (every VM active where its agent answers) records
//!   a session `DIR/EXPERIMENT-N.db`, annotated with the point's name and
//!   configuration hash so `vmscope compare` can put points side by side.
//!   That run is not one of the point's samples.

use crate::guest::VmFailure;
use crate::hygiene::{BusyRule, LoadSample};
use crate::output::{CsvRows, Format, JsonLines};
use crate::profiler;
use crate::progress::Progress;
use crate::row::Row;
use crate::schedule::{Plan, Step};
use crate::stats::{StopRule, Summary, Verdict};
use crate::BenchError;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// One experiment's points, as the loop sees them.
pub trait Experiment {
    type Sample: Clone;
    /// Points in all.
    fn points(&self) -> usize;
    /// A readable name of point `i` (progress, notes, session names).
    fn name(&self, i: usize) -> String;
    /// The configuration hash of point `i`.
    fn hash(&self, i: usize) -> String;
    /// VMs point `i` uses.
    fn vms(&self, i: usize) -> Vec<String>;
    /// One run of point `i`.
    fn run(&mut self, i: usize, step: Step) -> Result<Self::Sample, VmFailure>;
    /// The value the stop rule watches.
    fn value(&self, s: &Self::Sample) -> f64;
    /// The host's other load during the run.
    fn load(&self, s: &Self::Sample) -> LoadSample;
    /// Why every kept sample of this kind is suspect whatever the load
    /// (`bench io --no-drop-caches`: the caches were not dropped).
    fn flag(&self, _s: &Self::Sample) -> Option<String> {
        None
    }
    /// The rows of kept sample `n` (1-based) of point `i`.
    fn rows(&self, i: usize, n: u32, s: &Self::Sample, flag: Option<String>) -> Vec<Row>;
}

/// Where rows go while the run goes on. Every variant holds the run's
/// output, so [`finish`] can print the text report on it afterwards.
pub enum Sink<'a, 'w> {
    /// A table is printed at the end; nothing while the run goes on.
    None(&'a mut (dyn Write + 'w)),
    Json(JsonLines<&'a mut (dyn Write + 'w)>),
    Csv(Box<CsvRows<&'a mut (dyn Write + 'w)>>),
}

impl<'a, 'w> Sink<'a, 'w> {
    pub fn row(&mut self, r: &Row) -> std::io::Result<()> {
        match self {
            Sink::Json(j) => j.write(r),
            Sink::Csv(c) => c.write(r),
            Sink::None(_) => Ok(()),
        }
    }

    /// Any other JSON record (summaries, checks, notes); only JSON lines
    /// carry them.
    pub fn record<T: serde::Serialize>(&mut self, v: &T) -> std::io::Result<()> {
        match self {
            Sink::Json(j) => j.write(v),
            _ => Ok(()),
        }
    }

    /// The sink of `format`: JSON lines, CSV with `config_keys` as
    /// columns, or none (a table is printed at the end).
    pub fn for_format(
        format: Format,
        out: &'a mut (dyn Write + 'w),
        config_keys: &[&str],
    ) -> std::io::Result<Self> {
        Ok(match format {
            Format::Json => Sink::Json(JsonLines::new(out)),
            Format::Csv => Sink::Csv(Box::new(CsvRows::new(out, config_keys)?)),
            Format::Table => Sink::None(out),
        })
    }

    /// The output back, rows flushed.
    pub fn into_out(self) -> std::io::Result<&'a mut (dyn Write + 'w)> {
        Ok(match self {
            Sink::None(o) => o,
            Sink::Json(j) => j.into_inner(),
            Sink::Csv(c) => c.into_inner()?,
        })
    }
}

/// What every run reports after its samples: a summary record per point,
/// other records (checks, `type: check`; splits), the charts written, the notes.
#[derive(Debug, Default)]
pub struct Ending {
    pub summaries: Vec<serde_json::Value>,
    pub records: Vec<serde_json::Value>,
    pub charts: Vec<PathBuf>,
    pub notes: Vec<String>,
}

/// The end of every run, one way for all five experiments: the trailer
/// records (JSON lines only), the text report where the format wants one
/// (`print`: the table on the output; with CSV on stdout, on stderr unless
/// quiet; none with JSON lines), and every row into the session file
/// prepared before the run (`-o`), annotated with `command` (`bench net`)
/// and the command line.
#[allow(clippy::too_many_arguments)]
pub fn finish(
    mut sink: Sink<'_, '_>,
    output: &crate::options::Output,
    session: Option<vmscope_store::output::SessionOutput>,
    command: &str,
    rows: &[Row],
    end: &Ending,
    print: impl Fn(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), BenchError> {
    if matches!(sink, Sink::Json(_)) {
        for s in &end.summaries {
            sink.record(s)?;
        }
        for c in &end.records {
            sink.record(c)?;
        }
        for c in &end.charts {
            sink.record(&serde_json::json!({"type": "chart", "path": c}))?;
        }
        for n in &end.notes {
            sink.record(&serde_json::json!({"type": "note", "message": n}))?;
        }
    }
    let out = sink.into_out()?;
    match output.format {
        Format::Json => {}
        Format::Csv => {
            if !output.quiet {
                let _ = print(&mut std::io::stderr());
            }
        }
        Format::Table => print(out)?,
    }
    if let Some(o) = session {
        crate::session::store_rows(
            o,
            rows,
            &[
                ("command", command.to_string()),
                ("command_line", output.command_line.clone()),
            ],
        )?;
    }
    Ok(())
}

/// The summary record of one point, the same fields for every experiment:
/// experiment, point, config, config hash, metric and unit, n, mean, ci95
/// (null for one sample), cv, min, median, max, the stop rule's verdict,
/// flagged samples, why the point failed, its manifest, its profiled run
/// (session, or why it failed); then `extra`, the experiment's own fields.
pub fn summary(
    point: &crate::row::Point,
    metric: &str,
    unit: &str,
    s: Option<crate::stats::Summary>,
    outcome: PointState<'_>,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut m = serde_json::json!({
        "type": "summary",
        "experiment": point.experiment,
        "point": point.name,
        "config": point.config,
        "config_hash": point.config_hash,
        "metric": metric,
        "unit": unit,
        "n": s.map(|s| s.n).unwrap_or(0),
        "mean": s.map(|s| s.mean),
        "ci95": s.and_then(|s| s.ci95.is_finite().then_some(s.ci95)),
        "cv": s.map(|s| s.cv),
        "min": s.map(|s| s.min),
        "median": s.map(|s| s.median),
        "max": s.map(|s| s.max),
        "verdict": outcome.verdict,
        "flagged_samples": outcome.flagged,
        "failed": outcome.failed,
        "manifest": point.manifest,
        "session": outcome.session,
        "record_error": outcome.record_error,
    });
    if let (serde_json::Value::Object(m), serde_json::Value::Object(x)) = (&mut m, extra) {
        m.extend(x);
    }
    m
}

/// What [`summary`] needs of a point's outcome.
pub struct PointState<'a> {
    pub verdict: Verdict,
    pub flagged: usize,
    pub failed: Option<&'a str>,
    pub session: Option<&'a std::path::Path>,
    pub record_error: Option<&'a str>,
}

impl<S> PointOutcome<S> {
    /// Its state, for [`summary`].
    pub fn state(&self) -> PointState<'_> {
        PointState {
            verdict: self.verdict,
            flagged: self.flagged(),
            failed: self.failed.as_deref(),
            session: self.session.as_deref(),
            record_error: self.record_error.as_deref(),
        }
    }
}

/// Profiled points (`--record DIR`).
#[derive(Debug, Clone)]
pub struct RecordPoints {
    pub dir: PathBuf,
    pub freq: u64,
    pub vmscope: PathBuf,
    pub experiment: String,
    /// Sessions are DIR/STEM-N.db (N: the point's number); `None`: the
    /// experiment's name. For experiments driven one point at a time.
    pub stem: Option<String>,
    /// Replace files in DIR that vmscope did not write (`--force`).
    pub force: bool,
}

impl RecordPoints {
    /// Where point `i`'s session goes.
    pub fn path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}-{}.db", self.stem(), i + 1))
    }

    fn stem(&self) -> &str {
        self.stem.as_deref().unwrap_or(&self.experiment)
    }

    /// Before any sample: the sessions and logs a profiled run writes may
    /// replace what DIR holds under their names (store::output's rules).
    pub fn check(&self) -> Result<(), BenchError> {
        profiler::check_dir(
            &self.dir,
            |n| profiler::numbered(n, self.stem(), &["db", "log"]),
            self.force,
        )
        .map_err(|message| BenchError::Output {
            what: "--record directory",
            path: self.dir.clone(),
            message,
        })
    }
}

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct DriveOptions {
    pub warmup: usize,
    pub rule: StopRule,
    pub seed: u64,
    pub busy: BusyRule,
    pub busy_retries: usize,
    pub record: Option<RecordPoints>,
    /// A stop signal ends the run before the next sample (the lab options'
    /// cancel, linked to the binary's signal handler).
    pub cancel: vmscope_lab::Cancel,
}

impl DriveOptions {
    /// The loop's options from a benchmark's sampling options, without
    /// profiled points; `cancel` is the lab options' (a stop signal ends
    /// the run before the next sample).
    pub fn sampling(
        warmup: usize,
        rule: StopRule,
        seed: u64,
        busy: BusyRule,
        busy_retries: usize,
        cancel: vmscope_lab::Cancel,
    ) -> DriveOptions {
        DriveOptions {
            warmup,
            rule,
            seed,
            busy,
            busy_retries,
            record: None,
            cancel,
        }
    }
}

/// What became of one point.
#[derive(Debug, Clone)]
pub struct PointOutcome<S> {
    pub samples: Vec<S>,
    pub values: Vec<f64>,
    /// Per sample: why it is suspect.
    pub flags: Vec<Option<String>>,
    pub failed: Option<String>,
    pub verdict: Verdict,
    /// The session recorded during the profiled run, and that run.
    pub session: Option<PathBuf>,
    pub profiled: Option<S>,
    /// Why the profiled run has no session.
    pub record_error: Option<String>,
}

impl<S> PointOutcome<S> {
    pub fn summary(&self) -> Option<Summary> {
        Summary::of(&self.values)
    }

    pub fn flagged(&self) -> usize {
        self.flags.iter().filter(|f| f.is_some()).count()
    }
}

/// The mean of `f` over a point's kept samples (`None` without samples).
pub fn mean_of<S>(r: &PointOutcome<S>, f: impl Fn(&S) -> f64) -> Option<f64> {
    (!r.samples.is_empty()).then(|| r.samples.iter().map(&f).sum::<f64>() / r.samples.len() as f64)
}

/// Each point's outcome and every row written.
pub type Driven<S> = (Vec<PointOutcome<S>>, Vec<Row>);

/// Runs every point of `e` to its stop rule. Points listed in `skip` (with
/// their reason) are failed before the first round. Returns each point's
/// outcome and every row written.
pub fn drive<E: Experiment>(
    e: &mut E,
    opts: &DriveOptions,
    skip: &[(usize, String)],
    sink: &mut Sink<'_, '_>,
    progress: &Progress,
) -> Result<Driven<E::Sample>, BenchError> {
    if let Some(rec) = &opts.record {
        rec.check()?;
    }
    let n = e.points();
    let mut plan = Plan::new(n, opts.warmup, opts.rule, opts.seed);
    for (i, why) in skip {
        plan.fail(*i, why.clone());
    }
    let mut samples: Vec<Vec<E::Sample>> = vec![Vec::new(); n];
    let mut flags: Vec<Vec<Option<String>>> = vec![Vec::new(); n];
    let mut rows_all = Vec::new();
    let mut dead: BTreeSet<String> = BTreeSet::new();
    progress.expect_more(plan.remaining_at_least() as u64);
    while let Some(round) = plan.next_round() {
        for (i, step) in round {
            opts.cancel.check("taking the benchmark's samples")?;
            if plan.failed(i).is_some() {
                continue;
            }
            progress.set_message(format!(
                "round {} {}{}",
                plan.round(),
                e.name(i),
                if step == Step::Warmup {
                    " (warm-up)"
                } else {
                    ""
                }
            ));
            let mut tries = 0;
            let outcome = loop {
                match e.run(i, step) {
                    Ok(s) if step == Step::Sample => {
                        let mut flag = e.load(&s).busy(&opts.busy);
                        if flag.is_some() && tries < opts.busy_retries {
                            tries += 1;
                            progress.note(&format!(
                                "{}: redone ({})",
                                e.name(i),
                                flag.take().unwrap_or_default()
                            ));
                            continue;
                        }
                        let flag = match (flag, e.flag(&s)) {
                            (Some(f), Some(g)) => Some(format!("{f}; {g}")),
                            (f, g) => f.or(g),
                        };
                        break Ok(Some((s, flag)));
                    }
                    Ok(_) => break Ok(None),
                    Err(err) => break Err(err),
                }
            };
            progress.inc();
            match outcome {
                Ok(None) => plan.warmed(i),
                Ok(Some((s, flag))) => {
                    let v = e.value(&s);
                    plan.record(i, v);
                    let k = plan.samples(i).len() as u32;
                    let rows = e.rows(i, k, &s, flag.clone());
                    for r in &rows {
                        sink.row(r)?;
                    }
                    rows_all.extend(rows);
                    samples[i].push(s);
                    flags[i].push(flag);
                }
                Err(VmFailure::Dead(why)) => {
                    progress.note(&format!("{why}: its remaining points are marked failed"));
                    let gone: Vec<String> = e
                        .vms(i)
                        .into_iter()
                        .filter(|v| why.contains(&format!("VM {v} ")))
                        .collect();
                    let gone = if gone.is_empty() { e.vms(i) } else { gone };
                    for j in 0..n {
                        if e.vms(j).iter().any(|v| gone.contains(v)) {
                            plan.fail(j, why.clone());
                        }
                    }
                    dead.extend(gone);
                }
                Err(VmFailure::Failed(why)) => {
                    progress.note(&format!("{}: failed: {why}", e.name(i)));
                    plan.fail(i, why);
                }
            }
            progress.expect_more(plan.remaining_at_least() as u64);
        }
    }
    let mut out: Vec<PointOutcome<E::Sample>> = (0..n)
        .map(|i| PointOutcome {
            values: plan.samples(i).to_vec(),
            samples: std::mem::take(&mut samples[i]),
            flags: std::mem::take(&mut flags[i]),
            failed: plan.failed(i).map(str::to_string),
            verdict: plan.verdict(i),
            session: None,
            profiled: None,
            record_error: None,
        })
        .collect();
    if let Some(rec) = &opts.record {
        profiled_runs(e, rec, &mut out, progress)?;
    }
    Ok((out, rows_all))
}

/// `--record`: after its samples, each point that did not fail runs once
/// more under `vmscope record -a` (VMs active), its session annotated with
/// the point; that run is not one of its samples.
fn profiled_runs<E: Experiment>(
    e: &mut E,
    rec: &RecordPoints,
    out: &mut [PointOutcome<E::Sample>],
    progress: &Progress,
) -> Result<(), BenchError> {
    std::fs::create_dir_all(&rec.dir).map_err(|err| BenchError::Output {
        what: "--record directory",
        path: rec.dir.clone(),
        message: err.to_string(),
    })?;
    for (i, o) in out.iter_mut().enumerate() {
        if o.failed.is_some() {
            continue;
        }
        progress.set_message(format!("{}: profiled run", e.name(i)));
        let path = rec.path(i);
        let spec = profiler::Spec {
            kind: profiler::Kind::Active,
            freq: rec.freq,
            vms: Vec::new(),
            output: path.clone(),
            vmscope: rec.vmscope.clone(),
            ready_timeout: Duration::from_secs(60),
            strict: false,
            force: rec.force,
        };
        let r = profiler::start(&spec)
            .map_err(VmFailure::Failed)
            .and_then(|p| {
                let s = e.run(i, Step::Sample);
                let stopped = p.stop().map_err(VmFailure::Failed);
                Ok((s?, stopped?))
            });
        match r {
            Ok((s, _)) => {
                if let Ok(sess) = vmscope_store::Session::open(&path) {
                    let _ = sess.annotate("bench_experiment", &rec.experiment);
                    let _ = sess.annotate("bench_point", &e.name(i));
                    let _ = sess.annotate("bench_config_hash", &e.hash(i));
                    let _ = sess.annotate("bench_value", &e.value(&s).to_string());
                }
                progress.note(&format!(
                    "{}: profiled run stored in {}",
                    e.name(i),
                    path.display()
                ));
                o.session = Some(path);
                o.profiled = Some(s);
            }
            Err(err) => {
                progress.note(&format!("{}: profiled run failed: {err}", e.name(i)));
                o.record_error = Some(err.to_string());
            }
        }
        progress.inc();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;
    use crate::row::{unit, Point};
    use std::sync::Arc;

    /// Three points: 0 steady, 1 on a busy host at first, 2 in a VM that
    /// dies at its second sample.
    struct Fake {
        points: Vec<Point>,
        runs: Vec<usize>,
    }

    impl Experiment for Fake {
        type Sample = (f64, f64);
        fn points(&self) -> usize {
            3
        }
        fn name(&self, i: usize) -> String {
            format!("p{i}")
        }
        fn hash(&self, i: usize) -> String {
            self.points[i].config_hash.clone()
        }
        fn vms(&self, i: usize) -> Vec<String> {
            if i == 2 {
                vec!["g".into()]
            } else {
                Vec::new()
            }
        }
        fn run(&mut self, i: usize, _step: Step) -> Result<(f64, f64), VmFailure> {
            self.runs[i] += 1;
            let k = self.runs[i];
            match i {
                0 => Ok((100.0, 0.0)),
                1 => Ok((50.0 + k as f64 * 0.01, if k <= 3 { 2.0 } else { 0.0 })),
                _ if k >= 3 => Err(VmFailure::Dead("VM g stopped (QEMU pid 1 is gone)".into())),
                _ => Ok((10.0, 0.0)),
            }
        }
        fn value(&self, s: &(f64, f64)) -> f64 {
            s.0
        }
        fn load(&self, s: &(f64, f64)) -> LoadSample {
            LoadSample {
                wall_s: 1.0,
                other_s: s.1,
                ..Default::default()
            }
        }
        fn rows(&self, i: usize, n: u32, s: &(f64, f64), flag: Option<String>) -> Vec<Row> {
            vec![self.points[i]
                .row(n, "throughput", s.0, unit::OPS_PER_S)
                .flagged(flag)]
        }
    }

    #[test]
    fn busy_samples_are_redone_and_a_dead_vm_fails_its_points() {
        let m = Arc::new(Manifest::default());
        let mut f = Fake {
            points: (0..3)
                .map(|i| Point::new("t", format!("p{i}"), Default::default(), m.clone(), &[]))
                .collect(),
            runs: vec![0; 3],
        };
        let opts = DriveOptions {
            warmup: 1,
            rule: StopRule {
                min_samples: 3,
                max_samples: 5,
                rel_ci: 0.05,
            },
            seed: 3,
            busy: BusyRule::default(),
            busy_retries: 1,
            record: None,
            cancel: vmscope_lab::Cancel::new(),
        };
        let mut buf: Vec<u8> = Vec::new();
        let mut sink = Sink::Json(JsonLines::new(&mut buf as &mut dyn Write));
        let (out, rows) = drive(&mut f, &opts, &[], &mut sink, &Progress::new(0, true)).unwrap();
        drop(sink);
        assert_eq!(out[0].values, vec![100.0; 3]);
        assert_eq!(out[0].verdict, Verdict::Converged);
        // Point 1: warm-up (run 1), then run 2 busy → redone as run 3, still
        // busy → kept flagged; later runs are quiet.
        assert_eq!(out[1].values.len(), 3);
        assert_eq!(out[1].flagged(), 1, "{:?}", out[1].flags);
        assert!(out[1].flags[0].as_deref().unwrap().contains("busy host"));
        assert!(out[2].failed.as_deref().unwrap().contains("stopped"));
        assert_eq!(out[2].values.len(), 1, "one sample before the VM died");
        let lines = String::from_utf8(buf).unwrap();
        assert_eq!(lines.lines().count(), rows.len());
        assert_eq!(rows.len(), 3 + 3 + 1);
    }

    #[test]
    fn a_stop_signal_ends_the_run_before_the_next_sample() {
        let m = Arc::new(Manifest::default());
        let mut f = Fake {
            points: (0..2)
                .map(|i| Point::new("t", format!("p{i}"), Default::default(), m.clone(), &[]))
                .collect(),
            runs: vec![0; 2],
        };
        let cancel = vmscope_lab::Cancel::new();
        cancel.request(libc::SIGTERM);
        let opts = DriveOptions {
            warmup: 0,
            rule: StopRule {
                min_samples: 3,
                max_samples: 3,
                rel_ci: 0.05,
            },
            seed: 1,
            busy: BusyRule::default(),
            busy_retries: 0,
            record: None,
            cancel,
        };
        let mut null = std::io::sink();
        let mut sink = Sink::None(&mut null);
        let Err(err) = drive(&mut f, &opts, &[], &mut sink, &Progress::new(0, true)) else {
            panic!("a cancelled run goes on");
        };
        assert!(
            matches!(&err, BenchError::Lab(vmscope_lab::LabError::Interrupted { signal, .. }) if *signal == libc::SIGTERM),
            "{err}"
        );
        assert_eq!(f.runs, vec![0, 0], "no sample taken after the signal");
    }
}
