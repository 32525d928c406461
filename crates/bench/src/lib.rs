//! The five experiments of the papers, rerun with sound statistics
//! (docs/architecture.md §8), and the kit they share.
//!
//! Every experiment implements [`driver::Experiment`] (its points, one run
//! of a point, the rows of a sample) and runs on [`driver::drive`]:
//! interleaved shuffled rounds with warm-ups, the stop rule on the 95 %
//! interval, busy samples redone then flagged, a dead VM failing only its
//! own points, rows streamed, `--record` profiled runs; it ends with
//! [`driver::finish`] (the trailer, the text report, the session file).
//! Its options flatten the shared ones of [`options`] (sampling, output,
//! lab, recording), checked by one code path before anything starts.
//!
//! The kit:
//! - [`stats`]: mean, Student's-t 95 % interval, CV, the stop rule;
//!   [`schedule`]: the interleaved, adaptive sampling plan;
//! - [`hygiene`]: dropping caches, busy-host detection from `/proc/stat`;
//! - [`manifest`] and [`row`]: what every result row carries (metric,
//!   value, base unit, configuration and its hash, manifest);
//! - [`output`]: tables with units in every header, JSON lines, CSV;
//!   [`units`]: sizes and rates; [`chart`]: line charts (SVG, PNG);
//!   [`progress`]: the progress bar; [`session`]: rows into a session file;
//! - [`lab_session`]: the lab a run brings up or reuses; [`guest`]: commands
//!   in lab VMs through their agents; [`cpu`]: the host's CPU around a
//!   sample, per VM (the accountant); [`netlab`]: taps, bridges and yes/no
//!   checks; [`profiler`]: profilers run around a sample;
//! - [`peers`]: GNU dd and fio driven like the I/O engine, for side-by-side
//!   agreement (tests and `bench/io-engine`); [`httperf`]: httperf's
//!   command line and report.
//!
//! Experiments: [`io`] (giacobbi2011's storage method, with the host CPU
//! each backend costs: cherkasova2005), [`net`] (menon2005's network
//! experiment), [`web`] (menon2005 Fig 7), [`scale`] (theurer2006's
//! scaling) and [`overhead`] (theurer2006 Fig 2: what profiling costs).
// No function over 150 lines of code (crates/bench/clippy.toml).
#![warn(clippy::too_many_lines)]

pub mod chart;
pub mod cpu;
pub mod driver;
pub mod error;
pub mod guest;
pub mod httperf;
pub mod hygiene;
pub mod io;
pub mod lab_session;
pub mod manifest;
pub mod net;
pub mod netlab;
pub mod options;
pub mod output;
pub mod overhead;
pub mod peers;
pub mod profiler;
pub mod progress;
pub mod row;
pub mod scale;
pub mod schedule;
pub mod session;
pub mod stats;
pub mod units;
pub mod web;

pub use error::BenchError;
