//! perf.data import: the same converter as live recording, fed by the
//! perfdata reader. The session is written to a temporary file and renamed
//! into place only when complete, so a failed import leaves nothing that
//! looks like a session.

use crate::{Converter, EngineError};
use std::path::{Path, PathBuf};
use vmscope_model::{Domain, Role, SessionEvent, ThreadMap};
use vmscope_store::{DomainRecord, SessionWriter};
use vmscope_symbols::{Kallsyms, Symbolizer, SymbolizerOptions};

pub struct ImportOptions {
    pub symbolizer: SymbolizerOptions,
    /// Guest kernel symbols for guest-mode samples of every VM.
    pub guest_kallsyms: Option<PathBuf>,
    pub threads: ThreadMap,
    pub command_line: String,
    /// Extra session metadata (e.g. the importing vmscope's version).
    pub meta: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct ImportSummary {
    pub output: PathBuf,
    pub samples: u64,
    pub guest_samples: u64,
    pub lost: u64,
    pub events: Vec<SessionEvent>,
}

/// Flush to the session every this many records (bounds memory).
const FLUSH_EVERY: u64 = 500_000;

pub fn import(
    perf_data: &Path,
    output: &Path,
    opts: ImportOptions,
) -> Result<ImportSummary, EngineError> {
    let partial = PathBuf::from(format!("{}.partial", output.display()));
    let r = import_into(perf_data, &partial, opts);
    match r {
        Ok(mut s) => {
            for suffix in ["-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{}", partial.display(), suffix));
            }
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{}", output.display(), suffix));
            }
            std::fs::rename(&partial, output).map_err(|source| EngineError::Io {
                path: output.to_path_buf(),
                source,
            })?;
            s.output = output.to_path_buf();
            Ok(s)
        }
        Err(e) => {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{}", partial.display(), suffix));
            }
            Err(e)
        }
    }
}

fn import_into(
    perf_data: &Path,
    out: &Path,
    opts: ImportOptions,
) -> Result<ImportSummary, EngineError> {
    let mut writer = SessionWriter::create(out)?;
    let symbolizer = Symbolizer::new(opts.symbolizer.clone());
    let mut conv = Converter::new(symbolizer, opts.threads.clone());
    if let Some(p) = &opts.guest_kallsyms {
        // Parse once here so a bad file is an error naming it.
        Kallsyms::from_path(p)?;
        let text = std::fs::read_to_string(p).map_err(|source| EngineError::Io {
            path: p.clone(),
            source,
        })?;
        conv.set_default_guest_kallsyms(text);
    }
    let mut n = 0u64;
    let mut flush_err = None;
    let info = vmscope_perfdata::import(perf_data, &mut |rec| {
        conv.push(rec);
        n += 1;
        if n.is_multiple_of(FLUSH_EVERY) && flush_err.is_none() {
            if let Err(e) = writer.flush(&conv.take_delta()) {
                flush_err = Some(e);
            }
        }
    })?;
    if let Some(e) = flush_err {
        return Err(e.into());
    }
    writer.flush(&conv.take_delta())?;
    writer.set_events(&info.events)?;
    let stats = conv.stats().clone();
    let duration = match (
        info.first_time.or(stats.first_time),
        info.last_time.or(stats.last_time),
    ) {
        (Some(a), Some(b)) if b >= a => (b - a) as f64 / 1e9,
        _ => 0.0,
    };
    let mut meta: Vec<(&str, String)> = vec![
        ("source", "import".into()),
        ("source_file", perf_data.display().to_string()),
        ("command", opts.command_line.clone()),
        ("duration_s", format!("{duration:.3}")),
    ];
    if let Some(h) = &info.hostname {
        meta.push(("hostname", h.clone()));
    }
    if let Some(k) = &info.os_release {
        meta.push(("kernel", k.clone()));
    }
    if let Some(v) = &info.perf_version {
        meta.push(("perf_version", v.clone()));
    }
    if let Some(c) = info.nr_cpus {
        meta.push(("cpus", c.to_string()));
    }
    if let Some(c) = &info.cmdline {
        meta.push(("recorded_command", c.join(" ")));
    }
    let mut warnings = conv.symbolizer_mut().warnings();
    warnings.sort();
    warnings.dedup();
    meta.push(("warnings", warnings.join("\n")));
    for (k, v) in meta {
        writer.set_meta(k, &v)?;
    }
    for (k, v) in &opts.meta {
        writer.set_meta(k, v)?;
    }
    let mut domains: Vec<_> = stats.domains.keys().cloned().collect();
    domains.sort();
    for d in domains {
        let host = &*d == vmscope_model::HOST_DOMAIN;
        writer.upsert_domain(&DomainRecord {
            domain: Domain {
                name: d.to_string(),
                role: if host { Role::Initiator } else { Role::Passive },
                pid: None,
            },
            status: "ok".into(),
            ended_at: None,
            detail: if host {
                String::new()
            } else {
                "guest-mode samples seen from the host".into()
            },
        })?;
    }
    if stats.domains.is_empty() {
        writer.upsert_domain(&DomainRecord {
            domain: Domain::host(),
            status: "ok".into(),
            ended_at: None,
            detail: String::new(),
        })?;
    }
    writer.set_build_ids(&conv.symbolizer_mut().build_ids())?;
    writer.finish(true)?;
    Ok(ImportSummary {
        output: out.to_path_buf(),
        samples: stats.samples,
        guest_samples: stats.guest_mode_samples,
        lost: stats.lost,
        events: info.events,
    })
}
