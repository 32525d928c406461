//! Inline frames and source lines from DWARF, for binaries that carry it
//! (or whose debug file found by build-id or debuglink does).
//!
//! Library: `addr2line` (gimli-rs), through its `Loader` (memory-mapped
//! file, split DWARF in `.dwo`/`.dwp` files, compressed sections). Why not
//! blazesym, which also reads ELF, DWARF, inlines, build-ids and
//! debuglinks: vmscope already has its own symbol tables (kallsyms, ELF
//! symbols with perf's alias, PLT and symbol-end rules, guest kernels), and
//! the tests hold them to perf name for name. What was missing is only the
//! DWARF side: inlined subroutines and line tables. addr2line adds exactly
//! that on top of the `object` crate the symbols already use, and is the
//! library Rust's own backtraces use; blazesym would either replace the
//! symbolizer (with names that may differ from perf's) or resolve every
//! address a second time beside it.
//!
//! Function names never come from here: the symbol of a frame stays the
//! ELF symbol (identical to what perf names). This module only adds the
//! functions inlined at the address and its `file:line`.

use crate::demangle::demangle;
use crate::SymbolError;
use std::path::Path;
use std::sync::Arc;

/// DWARF of one file.
pub struct DwarfFile {
    loader: addr2line::Loader,
}

/// What DWARF says about one address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineInfo {
    /// Functions inlined at the address, outermost first (the function
    /// that contains them, named by the ELF symbol, is not included).
    pub inlined: Vec<Arc<str>>,
    /// `path:line` of the address (the innermost inlined function's line).
    pub srcline: Option<Arc<str>>,
}

impl DwarfFile {
    /// Load the DWARF of `path` (sections are read lazily on first lookup).
    pub fn open(path: &Path) -> Result<DwarfFile, SymbolError> {
        let loader = addr2line::Loader::new(path).map_err(|e| SymbolError::Elf {
            origin: path.display().to_string(),
            reason: format!("DWARF: {e}"),
        })?;
        Ok(DwarfFile { loader })
    }

    /// Inline frames and source line of a link-time virtual address.
    /// Damaged or missing DWARF for an address gives an empty answer.
    pub fn lookup(&self, vaddr: u64) -> LineInfo {
        let mut names: Vec<Arc<str>> = Vec::new();
        let mut srcline = None;
        if let Ok(mut frames) = self.loader.find_frames(vaddr) {
            let mut first = true;
            while let Ok(Some(f)) = frames.next() {
                if first {
                    srcline = f.location.as_ref().and_then(|l| {
                        let file = l.file?;
                        let line = l.line?;
                        Some(Arc::from(format!("{file}:{line}")))
                    });
                    first = false;
                }
                let name = f
                    .function
                    .as_ref()
                    .and_then(|n| n.raw_name().ok())
                    .map(|n| Arc::from(demangle(&n).as_ref()))
                    .unwrap_or_else(|| Arc::from("[unknown]"));
                names.push(name);
            }
        }
        // Innermost first from addr2line; the last frame is the function
        // itself (named by the symbol table), the others were inlined.
        names.pop();
        names.reverse();
        LineInfo {
            inlined: names,
            srcline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary carries line tables (the workspace's release and
    /// test profiles keep `line-tables-only` or full debug info): the
    /// symbol of a function here resolves to this very file.
    #[inline(never)]
    fn marker() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn own_binary_has_lines() {
        assert_eq!(marker(), 42);
        let exe = std::env::current_exe().unwrap();
        let elf = crate::ElfSymbols::open(&exe).unwrap();
        if !elf.has_dwarf() {
            eprintln!("SKIP: this test binary has no DWARF (built without debug info)");
            return;
        }
        let d = DwarfFile::open(&exe).unwrap();
        let (start, _, _) = elf
            .iter()
            .find(|(_, _, n)| n.ends_with("dwarf::tests::marker"))
            .expect("marker in the symbol table");
        let info = d.lookup(start);
        let line = info.srcline.expect("a source line for marker");
        assert!(line.contains("dwarf.rs:"), "{line}");
    }
}
