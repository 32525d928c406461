//! Result rows into a session file's `bench_samples` table, so a
//! benchmark's numbers travel with their manifest and can be queried with
//! `sqlite3` like every other session.

use crate::row::Row;
use crate::BenchError;
use std::path::Path;
use vmscope_store::output::{OutputOptions, SessionOutput};
use vmscope_store::BenchSampleRow;

/// Check and lock the session output `path` before a benchmark starts (as
/// `record -o` does: never a device, FIFO, directory or a file that is not
/// a session unless `force`; one writer at a time), so a refused output
/// fails before hours of measuring rather than after.
pub fn prepare_output(
    path: &Path,
    force: bool,
    command_line: &str,
) -> Result<SessionOutput, BenchError> {
    Ok(SessionOutput::prepare(
        path,
        &OutputOptions::new(force, &[]),
        command_line,
    )?)
}

/// [`prepare_output`] of `-o` when one was given.
pub fn prepare_optional(
    path: Option<&Path>,
    force: bool,
    command_line: &str,
) -> Result<Option<SessionOutput>, BenchError> {
    path.map(|p| prepare_output(p, force, command_line))
        .transpose()
}

/// Writes `rows` into the prepared session (as `FILE.partial`, renamed over
/// `FILE` when complete), with `meta` key/values (command, experiment) in
/// its metadata.
pub fn store_rows(
    mut output: SessionOutput,
    rows: &[Row],
    meta: &[(&str, String)],
) -> Result<(), BenchError> {
    let w = output.create_writer()?;
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
    output.commit(w, true)?;
    Ok(())
}
