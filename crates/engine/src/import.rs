//! perf.data import: the same converter as live recording, fed by the
//! perfdata reader. The session goes through [`SessionOutput`]: written as
//! `TARGET.partial` and renamed into place only when complete, so a failed
//! import leaves the target as it was and nothing that looks like a session.

use crate::convert::PendingRows;
use crate::sample_cache::StackKeys;
use crate::{Converter, EngineError};
use std::io::{IsTerminal, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vmscope_model::{Domain, Record, Role, SampleRecord, SessionEvent, ThreadMap};
use vmscope_perfdata::RawRecord;
use vmscope_store::output::SessionOutput;
use vmscope_store::{DomainRecord, SessionWriter};
use vmscope_symbols::{Kallsyms, Symbolizer, SymbolizerOptions};

pub struct ImportOptions {
    pub symbolizer: SymbolizerOptions,
    /// Leave host kernel and file frames for the session's first read
    /// (crate::symbolize), as `record` does by default.
    pub defer_symbols: bool,
    /// Guest kernel symbols for guest-mode samples of every VM.
    pub guest_kallsyms: Option<PathBuf>,
    pub threads: ThreadMap,
    pub command_line: String,
    /// Extra session metadata (e.g. the importing vmscope's version).
    pub meta: Vec<(String, String)>,
}

/// Where the perf.data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportInput {
    File(PathBuf),
    /// Standard input (`-`): a perf.data in pipe format (`perf record -o -`)
    /// or file format, spooled to an unnamed temporary file first (the
    /// reader checks the layout before parsing, which needs to seek).
    Stdin,
}

impl ImportInput {
    /// `-` is standard input, anything else a file.
    pub fn from_arg(p: &Path) -> ImportInput {
        if p.as_os_str() == "-" {
            ImportInput::Stdin
        } else {
            ImportInput::File(p.to_path_buf())
        }
    }

    /// How errors and the session name it.
    pub fn name(&self) -> String {
        match self {
            ImportInput::File(p) => p.display().to_string(),
            ImportInput::Stdin => "standard input".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ImportSummary {
    pub output: PathBuf,
    pub samples: u64,
    pub guest_samples: u64,
    pub lost: u64,
    pub events: Vec<SessionEvent>,
}

/// Hand a delta to the store every this many records (bounds memory; a
/// small last delta leaves little store work after conversion ends), at
/// the first sample of a new second after that: rows are keyed by second,
/// so a delta then shares no row with the next one, and the store inserts
/// each row once instead of inserting it and then updating it (records out
/// of time order only make an update).
const FLUSH_EVERY: u64 = 100_000;
/// Records per batch from the reading thread to the converting one.
const BATCH: usize = 4096;
/// Batches in flight between them.
const BATCHES_IN_FLIGHT: usize = 8;

pub fn import(
    input: &ImportInput,
    mut output: SessionOutput,
    opts: ImportOptions,
) -> Result<ImportSummary, EngineError> {
    let mut writer = output.create_writer()?;
    // A partial file, renamed into place only when complete.
    writer.bulk_load()?;
    let mut s = import_into(input, &mut writer, opts)?;
    s.output = output.commit(writer, true)?;
    Ok(s)
}

fn read_input(
    input: &ImportInput,
    sink: &mut dyn FnMut(RawRecord<'_>),
) -> Result<vmscope_perfdata::PerfDataInfo, EngineError> {
    match input {
        ImportInput::File(p) => Ok(vmscope_perfdata::import_raw(p, sink)?),
        ImportInput::Stdin => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                return Err(EngineError::Invalid(
                    "import -: standard input is a terminal; pipe a perf.data into it \
                     (perf record -o - ... | vmscope import -)"
                        .into(),
                ));
            }
            let io = |source| EngineError::Io {
                path: PathBuf::from("standard input"),
                source,
            };
            // The magic first: a stream that can never be a perf.data
            // (`yes`, `/dev/zero`) is refused at once, not spooled until
            // the file system is full.
            let mut head = [0u8; 8];
            let mut got = 0;
            let mut lock = stdin.lock();
            while got < head.len() {
                match std::io::Read::read(&mut lock, &mut head[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io(e)),
                }
            }
            if got == 0 {
                return Err(EngineError::Invalid(
                    "standard input: not a perf.data file (empty file): pipe a perf.data into it \
                     (perf record -o - ... | vmscope import -)"
                        .into(),
                ));
            }
            if !vmscope_perfdata::could_be_perf_data(&head[..got]) {
                return Err(EngineError::Invalid(format!(
                    "standard input: not a perf.data file (bad magic: it starts with {:?}, not PERFILE2)",
                    String::from_utf8_lossy(&head[..got])
                )));
            }
            let mut spool = tempfile::tempfile().map_err(io)?;
            std::io::Write::write_all(&mut spool, &head[..got]).map_err(io)?;
            std::io::copy(&mut lock, &mut spool).map_err(io)?;
            spool.rewind().map_err(io)?;
            Ok(vmscope_perfdata::import_reader_raw(
                spool,
                "standard input",
                sink,
            )?)
        }
    }
}

/// A delta for the store thread: the converter's profile and rows, and
/// its rows of numbers when symbolization is deferred.
fn take_parts(
    conv: &mut Converter,
) -> (vmscope_model::Profile, PendingRows, vmscope_model::RawDelta) {
    let raw = conv.take_raw();
    let (delta, rows) = conv.take_delta_parts();
    (delta, rows, raw)
}

/// What the reading thread hands the converter: a sample with its key's
/// number and its chain's words (shared with the reader's key table: no
/// allocation per sample), or another record.
enum Item {
    Sample(SampleRecord, u64, Arc<[u64]>),
    Other(Record),
}

/// Read, convert and store on three threads: the perf.data reader hands
/// batches of records to the converter (this thread), which hands profile
/// deltas to the session writer; each waits for the next only when it has
/// nothing to do. Returns what the file says about its recording. A reading
/// error is reported before a store error, as it was the first to happen
/// when both stop the import.
fn convert_pipelined(
    input: &ImportInput,
    make_conv: impl FnOnce() -> Converter,
    writer: &mut SessionWriter,
) -> Result<(Converter, vmscope_perfdata::PerfDataInfo), EngineError> {
    use std::sync::mpsc::sync_channel;
    use vmscope_model::Profile;
    let (rec_tx, rec_rx) = sync_channel::<Vec<Item>>(BATCHES_IN_FLIGHT);
    // Converted batches go back to the reader, which drops their records
    // (allocated there: a free on another thread costs several times more)
    // and refills them.
    let (back_tx, back_rx) = sync_channel::<Vec<Item>>(BATCHES_IN_FLIGHT + 2);
    // Rows go to the store as the converter aggregated them (by string
    // identity): the upsert sums equal keys, so no stack text is hashed.
    let (delta_tx, delta_rx) = sync_channel::<(Profile, PendingRows, vmscope_model::RawDelta)>(1);
    let (conv, read, stored) = std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("import-read".into())
            .spawn_scoped(scope, move || {
                let mut batch = Vec::with_capacity(BATCH);
                // Once the converter is gone (it stopped on a store
                // error), the rest of the file is only parsed.
                let mut open = true;
                // Samples' stack keys are numbered here, where the chain
                // is still in this CPU's cache (crate::sample_cache).
                let mut keys = StackKeys::default();
                let info = read_input(input, &mut |rec| {
                    if !open {
                        return;
                    }
                    batch.push(match rec {
                        RawRecord::Sample(s, chain) => {
                            let (key, words) = keys.sample(&s, chain);
                            Item::Sample(s, key, words)
                        }
                        RawRecord::Other(r) => {
                            keys.observe_other(&r);
                            Item::Other(r)
                        }
                    });
                    if batch.len() >= BATCH {
                        let mut next = back_rx
                            .try_recv()
                            .unwrap_or_else(|_| Vec::with_capacity(BATCH));
                        next.clear();
                        let full = std::mem::replace(&mut batch, next);
                        open = rec_tx.send(full).is_ok();
                    }
                });
                if open && !batch.is_empty() {
                    let _ = rec_tx.send(batch);
                }
                info
            });
        let store = std::thread::Builder::new()
            .name("import-store".into())
            .spawn_scoped(scope, move || {
                for (delta, rows, raw) in delta_rx {
                    writer.add_raw(&raw)?;
                    writer.flush_with_rows(&delta, &rows.into_rows())?;
                }
                Ok::<(), vmscope_store::StoreError>(())
            });
        let (reader, store) = match (reader, store) {
            (Ok(r), Ok(s)) => (r, s),
            (Err(e), _) | (_, Err(e)) => {
                return (
                    None,
                    Err(EngineError::Invalid(format!(
                        "import: cannot start a thread: {e}"
                    ))),
                    Ok(()),
                )
            }
        };
        let mut conv = make_conv();
        let mut n = 0u64;
        // The second of the sample that made `n` reach FLUSH_EVERY.
        let mut due: Option<u64> = None;
        'read: for batch in rec_rx {
            for item in &batch {
                match item {
                    Item::Sample(s, key, chain) => {
                        if n >= FLUSH_EVERY {
                            let second = conv.second_of(s.time);
                            // Samples without times (all in second 0)
                            // flush every 4 × FLUSH_EVERY records.
                            let flush = n >= 4 * FLUSH_EVERY
                                || matches!((due, second), (Some(d), Some(sec)) if sec > d);
                            if flush {
                                if delta_tx.send(take_parts(&mut conv)).is_err() {
                                    break 'read;
                                }
                                n = 0;
                                due = None;
                            } else if due.is_none() {
                                due = second;
                            }
                        }
                        conv.push_raw_sample(s, *key, chain);
                    }
                    Item::Other(r) => conv.push_keyed(r, None),
                }
                n += 1;
            }
            // Full (the reader is behind): dropped here instead.
            let _ = back_tx.try_send(batch);
        }
        let _ = delta_tx.send(take_parts(&mut conv));
        drop(delta_tx);
        let stored = store
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        let read = reader
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (Some(conv), read, stored)
    });
    let info = read?;
    stored?;
    let conv = conv.ok_or_else(|| EngineError::Invalid("import: no converter".into()))?;
    Ok((conv, info))
}

fn import_into(
    input: &ImportInput,
    writer: &mut SessionWriter,
    opts: ImportOptions,
) -> Result<ImportSummary, EngineError> {
    let guest_kallsyms = match &opts.guest_kallsyms {
        Some(p) => {
            // Parse once here so a bad file is an error naming it.
            Kallsyms::from_path(p)?;
            let text = std::fs::read_to_string(p).map_err(|source| EngineError::Io {
                path: p.clone(),
                source,
            })?;
            Some(text)
        }
        None => None,
    };
    // The host's kallsyms load while the reader starts on the file.
    crate::symbolize::store_options(writer, &opts.symbolizer)?;
    let make_conv = || {
        let symbolizer = if opts.defer_symbols {
            Symbolizer::deferred(opts.symbolizer.clone())
        } else {
            Symbolizer::new(opts.symbolizer.clone())
        };
        let mut conv = Converter::new(symbolizer, opts.threads.clone());
        if let Some(text) = guest_kallsyms {
            conv.set_default_guest_kallsyms(text);
        }
        conv
    };
    let (mut conv, info) = convert_pipelined(input, make_conv, writer)?;
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
        ("source_file", input.name()),
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
    let _ = conv.symbolizer_mut().save_line_cache();
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
    Ok(ImportSummary {
        output: PathBuf::new(),
        samples: stats.samples,
        guest_samples: stats.guest_mode_samples,
        lost: stats.lost,
        events: info.events,
    })
}
