//! Symbol resolution for vmscope: turns normalized frames
//! ([`vmscope_model::NormalizedFrame`]) into (image, function) names the way
//! `perf report` names them.
//!
//! Modules:
//! - [`kallsyms`]: parsing `/proc/kallsyms` text (host or guest kernel) and
//!   nearest-symbol lookup with perf's symbol-end and duplicate rules.
//! - [`elf`]: function symbols of one ELF file (`.symtab` and `.dynsym`),
//!   its `PT_LOAD` segments (file offset to virtual address), build-id and
//!   `.gnu_debuglink`.
//! - [`demangle`]: Rust and C++ name demangling as perf shows names.
//! - [`dwarf`]: inline frames and source lines from DWARF (addr2line; the
//!   module says why that library).
//! - [`linecache`]: DWARF's answers kept on disk by build-id, so a
//!   re-import does not load the same DWARF again.
//! - [`kernelcache`]: this boot's kernel text symbols kept on disk, so a
//!   first report reads no `/proc/kallsyms`.
//! - [`symbolizer`]: the caching front end: finds files (symfs, build-id and
//!   debuglink debug files), memoizes resolutions, collects warnings.
//! - [`error`]: the crate's one error type, [`SymbolError`].
//! - `table` (private): the sorted address-range table and perf's
//!   symbol-end and alias rules shared by kallsyms and ELF.

pub mod demangle;
pub mod dwarf;
pub mod elf;
pub mod error;
pub mod kallsyms;
pub mod kernelcache;
pub mod linecache;
pub mod symbolizer;
mod table;
mod vdso;

pub use demangle::demangle;
pub use dwarf::{DwarfFile, LineInfo};
pub use elf::ElfSymbols;
pub use error::SymbolError;
pub use kallsyms::{Kallsyms, KernelSymbol};
pub use symbolizer::{KeptFiles, Resolved, Symbolizer, SymbolizerOptions};
