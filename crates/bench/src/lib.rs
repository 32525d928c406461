//! Benchmarks with sound statistics (docs/architecture.md §8), and the experiments built
//! on them.
//!
//! Shared by every benchmark (storage here; network, web and scaling reuse
//! them):
//! - [`stats`]: mean, Student's-t 95 % interval, CV, the stop rule
//!   ("until the interval is within X % of the mean, or a cap");
//! - [`schedule`]: the interleaved, adaptive sampling plan (warm-ups
//!   discarded, every configuration once per round in a shuffled order);
//! - [`hygiene`]: dropping caches, and busy-host detection from `/proc/stat`;
//! - [`manifest`] and [`row`]: what every result row carries (metric,
//!   value, base unit, configuration and its hash, manifest);
//! - [`output`]: tables with units in every header, JSON lines, CSV;
//!   [`units`]: sizes and rates (MiB/s and MB/s both, labelled);
//! - [`chart`]: line charts on log-2 axes, SVG and PNG (plotters);
//! - [`progress`]: the progress bar (indicatif);
//! - [`session`]: result rows into a session file's `bench_samples`;
//! - [`peers`]: GNU dd and fio driven like the engine, for side-by-side
//!   agreement (tests and `bench/io-engine`).
//!
//! Experiments: [`io`], giacobbi2011's storage method on the host and in
//! lab VMs, with the host CPU each backend costs (cherkasova2005).

pub mod chart;
pub mod cpu;
pub mod driver;
pub mod error;
pub mod guest;
pub mod httperf;
pub mod hygiene;
pub mod io;
pub mod lab_specs;
pub mod manifest;
pub mod net;
pub mod netlab;
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
