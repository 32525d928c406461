//! Result rows into a session file's `bench_samples` table, so a
//! benchmark's numbers travel with their manifest and can be queried with
//! `sqlite3` like every other session.

use crate::row::Row;
use crate::BenchError;
use std::path::Path;
use vmscope_store::{BenchSampleRow, SessionWriter};

/// Creates (or replaces) the session at `path` and stores `rows`, with
/// `meta` key/values (command, experiment) in its metadata.
pub fn store_rows(path: &Path, rows: &[Row], meta: &[(&str, String)]) -> Result<(), BenchError> {
    let w = SessionWriter::create(path)?;
    for (k, v) in meta {
        w.set_meta(k, v)?;
    }
    let out: Vec<BenchSampleRow> = rows
        .iter()
        .map(|r| BenchSampleRow {
            experiment: r.experiment.clone(),
            config_hash: r.config_hash.clone(),
            manifest: serde_json::to_string(&*r.manifest).unwrap_or_default(),
            point: r.point.clone(),
            sample: i64::from(r.sample),
            metric: r.metric.clone(),
            value: r.value,
            unit: r.unit.clone(),
            raw_output: r.raw_output.clone(),
            flagged: r.flagged.clone(),
        })
        .collect();
    w.add_bench_samples(&out)?;
    w.finish(true)?;
    Ok(())
}
