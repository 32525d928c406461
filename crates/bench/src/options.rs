//! The options every experiment takes alike, one struct each, flattened into
//! every experiment's own options (as below flattens its `GeneralOpt`) and
//! checked by one code path before anything starts:
//!
//! - [`Sampling`]: repeats, the 95 % interval, warm-ups, the busy-host rule,
//!   the round order's seed;
//! - [`Output`]: the format, charts, the session file (`-o`, `--force`),
//!   quiet, the command line for the manifest;
//! - [`LabChoice`]: the lab a run brings up or reuses (`--lab`,
//!   `--lab-name`, `--keep-lab`) and where labs live;
//! - [`Recording`]: `--record DIR`, profiled runs of each point.
//!
//! A run opens its output with [`Output::open`] (the session file checked
//! and locked, the progress bar) and ends with [`crate::driver::finish`].

use crate::hygiene::BusyRule;
use crate::output::Format;
use crate::stats::StopRule;
use crate::BenchError;
use std::path::PathBuf;
use vmscope_lab::{LabOptions, LabSpec};

/// How every point is sampled.
#[derive(Debug, Clone)]
pub struct Sampling {
    /// Samples per point at least, after the warm-up; `None`: the
    /// experiment's default.
    pub repeat: Option<usize>,
    /// More samples until the interval is within `rel_ci`, up to this many;
    /// `None`: the experiment's default.
    pub max_repeat: Option<usize>,
    /// Target half-width of the 95 % interval, as a fraction of the mean.
    pub rel_ci: f64,
    /// Discarded runs per point before its samples.
    pub warmup: usize,
    /// When a sample counts as taken on a busy host.
    pub busy: BusyRule,
    /// Redo a busy sample this many times before keeping it flagged.
    pub busy_retries: usize,
    /// Seed of the shuffled round order.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            repeat: None,
            max_repeat: None,
            rel_ci: 0.05,
            warmup: 1,
            busy: BusyRule::default(),
            busy_retries: 2,
            seed: 1,
        }
    }
}

impl Sampling {
    /// The stop rule, with the experiment's defaults for what was not
    /// given; every bad number is an error naming its flag.
    pub fn rule(&self, default_repeat: usize, default_max: usize) -> Result<StopRule, BenchError> {
        let repeat = self.repeat.unwrap_or(default_repeat);
        let max = self.max_repeat.unwrap_or(default_max.max(repeat));
        if repeat == 0 {
            return Err(BenchError::bad("--repeat must be at least 1"));
        }
        if max < repeat {
            return Err(BenchError::bad(format!(
                "--max-repeat {max} is below --repeat {repeat}"
            )));
        }
        if !(self.rel_ci > 0.0 && self.rel_ci < 1.0) {
            return Err(BenchError::bad(format!(
                "--ci {} must be a fraction between 0 and 1 (0.05 = 5 %)",
                self.rel_ci
            )));
        }
        if !(self.busy.max_other_cpus >= 0.0 && self.busy.max_other_cpus.is_finite()) {
            return Err(BenchError::bad(format!(
                "--busy-threshold {} must be a number of CPUs, 0 or more",
                self.busy.max_other_cpus
            )));
        }
        Ok(StopRule {
            min_samples: repeat,
            max_samples: max,
            rel_ci: self.rel_ci,
        })
    }
}

/// Where a run's results go.
#[derive(Debug, Clone)]
pub struct Output {
    pub format: Format,
    /// Charts go here; `None`: no charts.
    pub charts: Option<PathBuf>,
    /// Every row also into this session file (`-o`).
    pub session: Option<PathBuf>,
    /// Let outputs replace files vmscope did not write (`--force`).
    pub force: bool,
    /// No progress bar or notes on stderr.
    pub quiet: bool,
    /// For the manifest and the session's metadata.
    pub command_line: String,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            format: Format::Table,
            charts: None,
            session: None,
            force: false,
            quiet: false,
            command_line: String::new(),
        }
    }
}

/// What a run writes to, opened before the work: the session file checked
/// and locked (`-o`), and the progress bar.
pub struct Opened {
    pub session: Option<vmscope_store::output::SessionOutput>,
    pub progress: crate::progress::Progress,
}

impl Output {
    /// Check and lock the session output, and start the progress bar.
    pub fn open(&self) -> Result<Opened, BenchError> {
        let session = crate::session::prepare_optional(
            self.session.as_deref(),
            self.force,
            &self.command_line,
        )?;
        Ok(Opened {
            session,
            progress: crate::progress::Progress::new(0, self.quiet),
        })
    }
}

/// The lab a run brings up, or reuses when it is up.
#[derive(Debug, Clone, Default)]
pub struct LabChoice {
    /// A spec file or a built-in lab's name (`--lab`).
    pub spec: Option<String>,
    /// Run the spec under this name (`--lab-name`).
    pub name: Option<String>,
    /// Where labs live, how long agents may take, the cancel flag.
    pub options: LabOptions,
    /// Leave a lab this run brought up running (`--keep-lab`).
    pub keep: bool,
}

impl LabChoice {
    /// The spec `--lab` names (renamed by `--lab-name`), if any.
    pub fn load(&self) -> Result<Option<LabSpec>, BenchError> {
        self.spec
            .as_deref()
            .map(|arg| load_lab(arg, self.name.as_deref()))
            .transpose()
    }
}

/// The lab `arg` names (a spec file or a built-in name), renamed to `name`.
pub fn load_lab(arg: &str, name: Option<&str>) -> Result<LabSpec, BenchError> {
    vmscope_lab::builtin::load(arg, name).map_err(|e| match e {
        vmscope_lab::LabError::NoSuchSpec { .. } => BenchError::bad(format!("--lab {e}")),
        vmscope_lab::LabError::BadName { name } => BenchError::bad(format!(
            "--lab-name {name}: lab names are letters, digits, '-' and '_', start with a letter \
             or digit, at most 32 characters"
        )),
        e => BenchError::Lab(e),
    })
}

/// Profiled runs of each point (`--record DIR`).
#[derive(Debug, Clone)]
pub struct Recording {
    pub dir: Option<PathBuf>,
    /// Sampling frequency of the profiled runs, Hz.
    pub freq: u64,
    /// The `vmscope` binary that records.
    pub vmscope: PathBuf,
}

impl Default for Recording {
    fn default() -> Self {
        Recording {
            dir: None,
            freq: 999,
            vmscope: PathBuf::from("vmscope"),
        }
    }
}

impl Recording {
    /// The driver's profiled points of `experiment` (sessions
    /// `DIR/STEM-N.db`, `stem` defaulting to the experiment's name).
    pub fn points(
        &self,
        experiment: &str,
        stem: Option<String>,
        force: bool,
    ) -> Option<crate::driver::RecordPoints> {
        self.dir.as_ref().map(|d| crate::driver::RecordPoints {
            dir: d.clone(),
            freq: self.freq,
            vmscope: self.vmscope.clone(),
            experiment: experiment.into(),
            stem,
            force,
        })
    }

    /// A frequency the kernel can take, checked before anything runs.
    pub fn check(&self) -> Result<(), BenchError> {
        if self.dir.is_some() && self.freq == 0 {
            return Err(BenchError::bad(
                "--record-freq must be a positive frequency in Hz",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_experiment() {
        let s = Sampling::default();
        let r = s.rule(3, 10).unwrap();
        assert_eq!((r.min_samples, r.max_samples), (3, 10));
        let given = Sampling {
            repeat: Some(12),
            ..Sampling::default()
        };
        // A --repeat above the default cap raises the cap.
        assert_eq!(given.rule(3, 10).unwrap().max_samples, 12);
        let bad = |s: Sampling| s.rule(3, 10).unwrap_err().to_string();
        assert!(bad(Sampling {
            repeat: Some(0),
            ..Sampling::default()
        })
        .contains("--repeat"));
        assert!(bad(Sampling {
            repeat: Some(5),
            max_repeat: Some(3),
            ..Sampling::default()
        })
        .contains("--max-repeat 3"));
        assert!(bad(Sampling {
            rel_ci: 1.5,
            ..Sampling::default()
        })
        .contains("--ci"));
    }

    #[test]
    fn labs_by_file_or_built_in_name() {
        let c = LabChoice {
            spec: Some("guest-same-cpu".into()),
            name: Some("netbench-x".into()),
            ..LabChoice::default()
        };
        assert_eq!(c.load().unwrap().unwrap().name, "netbench-x");
        let e = load_lab("nope", None).unwrap_err().to_string();
        assert!(e.starts_with("--lab nope: no such spec file"), "{e}");
        let e = load_lab("one-vm", Some("bad name"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--lab-name"), "{e}");
        assert!(LabChoice::default().load().unwrap().is_none());
    }
}
