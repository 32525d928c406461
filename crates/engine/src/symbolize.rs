//! Resolving what a recording left for the first read (docs/architecture.md
//! §7.3): `record` (by default) gives host kernel and file frames numbers
//! instead of names ([`vmscope_model::deferred`]), so recording reads no
//! kallsyms, ELF or DWARF; [`resolve_pending`] names them once, when a
//! session is first read, with the symbolizer options the recording used
//! (stored in its metadata by [`store_options`]).
//!
//! Kernel addresses are resolved with this kernel's symbols only when the
//! session was recorded on this boot (`meta.boot_id`; module and BPF
//! addresses move with every boot): otherwise they stay hex, said in a
//! warning. Files are looked up by path and build-id as when recording; a
//! file replaced since is found by its build-id in the debug directories or
//! stays hex, said in a warning (as `perf report` does).

use crate::EngineError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use vmscope_model::{AggKey, DeferredFrame, FastMap, ImageRef, NO_STACK};
use vmscope_store::{PendingSymbols, SessionWriter};
use vmscope_symbols::{Resolved, Symbolizer, SymbolizerOptions};

/// Store what [`resolve_pending`] needs to resolve a session's deferred
/// frames as the recording would have: this boot's id and the symbolizer
/// options.
pub fn store_options(w: &SessionWriter, opts: &SymbolizerOptions) -> Result<(), EngineError> {
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    w.set_meta("boot_id", &vmscope_linux::sys::boot_id())?;
    w.set_meta(
        "symbols_kallsyms",
        &path(&opts.kallsyms).unwrap_or_default(),
    )?;
    w.set_meta("symbols_symfs", &path(&opts.symfs).unwrap_or_default())?;
    let dirs: Vec<String> = opts
        .debug_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    w.set_meta("symbols_debug_dirs", &dirs.join("\n"))?;
    Ok(())
}

/// The symbolizer options [`store_options`] stored (defaults for keys a
/// session does not have), with the on-disk line cache of this host.
fn stored_options(p: &PendingSymbols) -> Result<SymbolizerOptions, EngineError> {
    let some_path = |v: Option<String>| v.filter(|s| !s.is_empty()).map(PathBuf::from);
    let mut opts = SymbolizerOptions {
        kallsyms: some_path(p.meta("symbols_kallsyms")?),
        symfs: some_path(p.meta("symbols_symfs")?),
        line_cache: vmscope_symbols::linecache::default_dir(),
        kernel_cache: vmscope_symbols::kernelcache::default_dir(),
        ..SymbolizerOptions::default()
    };
    if let Some(d) = p.meta("symbols_debug_dirs")? {
        opts.debug_dirs = d
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect();
    }
    Ok(opts)
}

/// What [`resolve_pending`] did.
#[derive(Debug, Clone, Default)]
pub struct Resolution {
    /// Distinct frames named.
    pub frames: usize,
    /// Distinct stacks.
    pub stacks: usize,
    /// Rows written into `samples` (one per distinct named key).
    pub rows: usize,
    /// Files whose symbols were read.
    pub files: usize,
    pub seconds: f64,
    /// What resolving met (also added to the session's warnings).
    pub warnings: Vec<String>,
}

/// The collapsed text of a stack (root first) from its frames (the sampled
/// end first), each frame followed by the functions inlined at it: the
/// text `Converter::resolve_stack` makes of the same frames.
fn stack_text(ids: &[u32], resolved: &FastMap<u32, Resolved>) -> Result<String, u32> {
    let mut parts: Vec<&str> = Vec::with_capacity(ids.len() * 2);
    for id in ids {
        let r = resolved.get(id).ok_or(*id)?;
        if let Some(inl) = &r.inlined {
            parts.extend(inl.iter().rev().map(|f| &**f));
        }
        parts.push(&r.symbol);
    }
    parts.reverse();
    Ok(parts.join(";"))
}

/// Resolve the frames the recording of the session at `path` left for the
/// first read, if it left any (else `Ok(None)`, writing nothing), and
/// write its rows with their names. `progress` hears what is being done.
/// The session's one-writer lock is held meanwhile: a recording still
/// writing it is an error naming it, and a second reader waits for the
/// first and then finds nothing to do.
pub fn resolve_pending(
    path: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<Resolution>, EngineError> {
    let Some(mut p) = PendingSymbols::open(path)? else {
        return Ok(None);
    };
    let t0 = Instant::now();
    let opts = stored_options(&p)?;
    let frames = p.frames()?;
    progress(&format!(
        "resolving the symbols of {} addresses (left for the first read by the recording)",
        frames.len()
    ));
    let mut warnings = Vec::new();
    let kernel_frames = frames.iter().any(|(_, f)| {
        matches!(f, DeferredFrame::Later { frame, .. } if matches!(frame.image, ImageRef::Kernel))
    });
    let recorded_boot = p.meta("boot_id")?.unwrap_or_default();
    let this_boot = vmscope_linux::sys::boot_id();
    let mut sym = if kernel_frames && opts.kallsyms.is_none() && recorded_boot != this_boot {
        warnings.push(format!(
            "recorded on another boot of the kernel (boot id {}, this one {}): kernel \
             addresses stay hex; resolve the session on the host that recorded it before \
             it reboots, or record with --symbolize now",
            if recorded_boot.is_empty() {
                "unknown"
            } else {
                &recorded_boot
            },
            this_boot
        ));
        Symbolizer::without_kernel(opts)
    } else if kernel_frames {
        Symbolizer::new(opts)
    } else {
        // No kernel frame: no kallsyms to read.
        Symbolizer::without_kernel(opts)
    };
    let mut resolved: FastMap<u32, Resolved> =
        FastMap::with_capacity_and_hasher(frames.len(), Default::default());
    for (id, f) in &frames {
        resolved.insert(*id, sym.resolve_deferred(f));
    }
    let strings: FastMap<u32, Arc<str>> = p.strings()?.into_iter().collect();
    let damaged = |table: &'static str, what: String| vmscope_store::StoreError::Damaged {
        path: path.to_path_buf(),
        table,
        what,
    };
    let stacks = p.stacks()?;
    let mut texts: FastMap<u32, Arc<str>> =
        FastMap::with_capacity_and_hasher(stacks.len() + 1, Default::default());
    texts.insert(NO_STACK, Arc::from(""));
    for (id, ids) in &stacks {
        let text = stack_text(ids, &resolved).map_err(|f| {
            damaged(
                "deferred_stacks",
                format!("has stack {id} with frame {f}, which deferred_frames does not have"),
            )
        })?;
        texts.insert(*id, text.into());
    }
    progress(&format!(
        "writing the named rows of {} flushes",
        p.row_blocks()?
    ));
    // Rows whose frames differ only in addresses of the same line name the
    // same key: summed here, so each distinct key is written once (a demo
    // recording's 3,400 rows named 680 keys; each further one had cost
    // SQLite an upsert). At most MERGED_ROWS keys are held between writes.
    const MERGED_ROWS: usize = 200_000;
    let mut written = 0usize;
    let mut named: FastMap<AggKey, (u64, u64)> = FastMap::default();
    let write = |p: &mut PendingSymbols, named: &mut FastMap<AggKey, (u64, u64)>| {
        let rows: Vec<(AggKey, u64, u64)> = named.drain().map(|(k, (n, w))| (k, n, w)).collect();
        p.add_rows(&rows).map(|()| rows.len())
    };
    p.for_each_row_block(|p, rows| {
        for (k, n, period) in rows {
            let leaf = resolved.get(&k.leaf).ok_or_else(|| {
                damaged(
                    "deferred_rows",
                    format!(
                        "has a row with frame {}, which deferred_frames does not have",
                        k.leaf
                    ),
                )
            })?;
            let string = |id: u32| {
                strings.get(&id).cloned().ok_or_else(|| {
                    damaged(
                        "deferred_rows",
                        format!("has a row with string {id}, which deferred_strings does not have"),
                    )
                })
            };
            let stack = texts.get(&k.stack).cloned().ok_or_else(|| {
                damaged(
                    "deferred_rows",
                    format!(
                        "has a row with stack {}, which deferred_stacks does not have",
                        k.stack
                    ),
                )
            })?;
            let sum = named
                .entry(AggKey {
                    event: k.event,
                    domain: string(k.domain)?,
                    context: k.context,
                    process: string(k.process)?,
                    image: leaf.image.clone(),
                    symbol: leaf.symbol.clone(),
                    stack,
                    srcline: leaf.srcline.clone(),
                    second: k.second,
                    cpu: k.cpu,
                })
                .or_default();
            sum.0 += n;
            sum.1 += period;
        }
        if named.len() >= MERGED_ROWS {
            written += write(p, &mut named)?;
        }
        Ok(())
    })?;
    written += write(&mut p, &mut named)?;
    let _ = sym.save_line_cache();
    // Sorted as a recording's own warnings are.
    let mut found = sym.warnings();
    found.sort();
    found.dedup();
    warnings.extend(found);
    let build_ids = sym.build_ids();
    let r = Resolution {
        frames: frames.len(),
        stacks: stacks.len(),
        rows: written,
        files: build_ids.len(),
        seconds: 0.0,
        warnings: warnings.clone(),
    };
    p.finish(&build_ids, &warnings)?;
    Ok(Some(Resolution {
        seconds: t0.elapsed().as_secs_f64(),
        ..r
    }))
}

/// How a session is read ([`open_for_reading`]).
pub struct Reading {
    pub session: vmscope_store::Session,
    /// What resolving its deferred symbols did, when it had any.
    pub resolved: Option<Resolution>,
    /// Why they were resolved in a temporary copy rather than in the file
    /// (a recording is writing it, or it cannot be written here): the file
    /// stays as it is, and the copy goes when this is dropped.
    pub copy: Option<(String, tempfile::TempPath)>,
}

/// Open the session at `path` for reading, first resolving what its
/// recording left for the first read ([`resolve_pending`]). When that
/// cannot be done in the file (a recording is still writing it, or the
/// file cannot be written here), it is done in a consistent copy of the
/// file in the temporary directory, which is read instead: a recording
/// under way stays readable as it grows, with names.
pub fn open_for_reading(
    path: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Reading, EngineError> {
    let session = vmscope_store::Session::open(path)?;
    if !session.symbols_pending()? {
        return Ok(Reading {
            session,
            resolved: None,
            copy: None,
        });
    }
    drop(session);
    use vmscope_store::StoreError;
    match resolve_pending(path, progress) {
        Ok(resolved) => Ok(Reading {
            session: vmscope_store::Session::open(path)?,
            resolved,
            copy: None,
        }),
        // What keeps the names out of the file, not out of a copy: a
        // recording writing it, a file or directory not writable here, a
        // full file system (the failed write left the file as it was).
        Err(EngineError::Store(
            e @ (StoreError::SymbolsPending { .. }
            | StoreError::DiskFull { .. }
            | StoreError::NotWritable { .. }
            | StoreError::Sql { .. }),
        )) => {
            let why = match e {
                StoreError::SymbolsPending { why, .. } => why,
                other => format!("resolving it in place failed: {other}"),
            };
            let io = |source| EngineError::Io {
                path: std::env::temp_dir(),
                source,
            };
            let tmp = tempfile::Builder::new()
                .prefix("vmscope-read-")
                .suffix(".db")
                .tempfile()
                .map_err(io)?
                .into_temp_path();
            // VACUUM INTO makes the file itself.
            std::fs::remove_file(&tmp).map_err(io)?;
            progress("copying the session to resolve its symbols in the copy");
            vmscope_store::snapshot(path, &tmp)?;
            let resolved = resolve_pending(&tmp, progress)?;
            Ok(Reading {
                session: vmscope_store::Session::open(&tmp)?.shown_as(path),
                resolved,
                copy: Some((why, tmp)),
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_reads_root_first_with_what_is_inlined_after_its_frame() {
        let mut m = FastMap::default();
        m.insert(
            3,
            Resolved {
                image: "/bin/x".into(),
                symbol: "outer".into(),
                srcline: "x.c:1".into(),
                inlined: Some(Arc::from(vec![
                    Arc::<str>::from("a (inlined)"),
                    Arc::<str>::from("b (inlined)"),
                ])),
            },
        );
        m.insert(4, Resolved::named("[kernel.kallsyms]".into(), "k".into()));
        m.insert(5, Resolved::named("/bin/x".into(), "main".into()));
        // Sampled end first: k, then outer (with a and b inlined), then main.
        assert_eq!(
            stack_text(&[4, 3, 5], &m).unwrap(),
            "main;outer;a (inlined);b (inlined);k"
        );
        assert_eq!(stack_text(&[5], &m).unwrap(), "main");
        assert_eq!(stack_text(&[9], &m), Err(9));
    }
}
