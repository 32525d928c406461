//! Symbols of one ELF file, read with the `object` crate the way perf reads
//! them (`dso__load_sym`): `.symtab` and `.dynsym` merged; function
//! (`STT_FUNC`, `STT_GNU_IFUNC`), object and label (`STT_NOTYPE` in a text
//! or data section) symbols of allocated sections; a symbol covers
//! `[st_value, st_value + st_size)`, a zero-size one extends to the next
//! symbol; aliases are reduced to one name. Also the file's `PT_LOAD`
//! segments (to turn a file offset into a virtual address), its GNU
//! build-id and its `.gnu_debuglink` name.

use crate::demangle::demangle;
use crate::table::{self, Binding, RangeSym, NO_GROUP};
use crate::SymbolError;
use object::elf;
use object::read::elf::{ElfFile, FileHeader, ProgramHeader, SectionHeader, Sym};
use object::{Endianness, FileKind, Object};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One `PT_LOAD` program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LoadSegment {
    offset: u64,
    filesz: u64,
    vaddr: u64,
    exec: bool,
}

/// The symbols, segments and identity of one ELF file.
#[derive(Debug, Clone, Default)]
pub struct ElfSymbols {
    syms: Vec<RangeSym>,
    names: Vec<Arc<str>>,
    segments: Vec<LoadSegment>,
    /// Lowest `PT_LOAD` address rounded down to its page: the load bias of
    /// offset 0 when segments carry no file data (a separate debug file).
    base: u64,
    build_id: Option<Vec<u8>>,
    debuglink: Option<String>,
    has_symtab: bool,
}

const MEMORY: &str = "<memory>";

fn elf_error(reason: impl Into<String>) -> SymbolError {
    SymbolError::Elf {
        origin: MEMORY.to_string(),
        reason: reason.into(),
    }
}

/// ARM mapping symbols (`$a`, `$d`, `$t`, `$x`, optionally `.suffix`).
fn is_arm_mapping_symbol(name: &[u8]) -> bool {
    name.len() >= 2
        && name[0] == b'$'
        && b"adtx".contains(&name[1])
        && (name.len() == 2 || name[2] == b'.')
}

impl ElfSymbols {
    /// Read an ELF file (memory-mapped); errors name the path.
    pub fn open(path: &Path) -> Result<ElfSymbols, SymbolError> {
        let io = |source| SymbolError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        if meta.len() == 0 {
            return Err(elf_error("empty file").with_origin(path));
        }
        // SAFETY: a read-only private mapping; the bytes are only parsed
        // (never trusted as valid) and copied out before the map is dropped.
        // A file truncated by another process while mapped could fault; that
        // is the usual trade-off of profilers reading binaries.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        ElfSymbols::parse(&map).map_err(|e| e.with_origin(path))
    }

    /// Parse ELF bytes (32 or 64 bit, either byte order).
    pub fn parse(data: &[u8]) -> Result<ElfSymbols, SymbolError> {
        match FileKind::parse(data) {
            Ok(FileKind::Elf32) => parse_elf::<elf::FileHeader32<Endianness>>(data),
            Ok(FileKind::Elf64) => parse_elf::<elf::FileHeader64<Endianness>>(data),
            Ok(kind) => Err(elf_error(format!("not an ELF file ({kind:?})"))),
            Err(e) => Err(elf_error(e.to_string())),
        }
    }

    /// The function covering a file offset (`ip - map.start + map.pgoff`),
    /// through the `PT_LOAD` segment that holds that offset.
    pub fn lookup_file_offset(&self, offset: u64) -> Option<&str> {
        self.lookup_file_offset_shared(offset).map(|n| &**n)
    }

    /// The function covering a link-time virtual address.
    pub fn lookup_vaddr(&self, vaddr: u64) -> Option<&str> {
        self.lookup_vaddr_shared(vaddr).map(|n| &**n)
    }

    pub(crate) fn lookup_file_offset_shared(&self, offset: u64) -> Option<&Arc<str>> {
        self.lookup_vaddr_shared(self.file_offset_to_vaddr(offset)?)
    }

    pub(crate) fn lookup_vaddr_shared(&self, vaddr: u64) -> Option<&Arc<str>> {
        let s = table::find(&self.syms, vaddr)?;
        self.names.get(s.name as usize)
    }

    /// `offset - p_offset + p_vaddr` of the `PT_LOAD` segment whose file
    /// bytes contain `offset` (an executable one first). A file without
    /// segment file data (a separate debug file) maps through its load
    /// base; a file without segments (relocatable) maps one to one.
    pub fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        let covering = |s: &&LoadSegment| offset >= s.offset && offset - s.offset < s.filesz;
        let seg = self
            .segments
            .iter()
            .filter(|s| s.exec)
            .find(covering)
            .or_else(|| self.segments.iter().find(covering));
        if let Some(s) = seg {
            return (offset - s.offset).checked_add(s.vaddr);
        }
        if self.segments.iter().all(|s| s.filesz == 0) {
            return offset.checked_add(self.base);
        }
        None
    }

    /// The GNU build-id note, if any.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The `.gnu_debuglink` file name, if any.
    pub fn debuglink(&self) -> Option<&str> {
        self.debuglink.as_deref()
    }

    /// True when the file has a non-empty `.symtab` (not stripped).
    pub fn has_symtab(&self) -> bool {
        self.has_symtab
    }

    /// Number of symbols kept (aliases count once).
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    /// Every kept symbol as (start vaddr, end vaddr, name), in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, &str)> {
        self.syms.iter().map(|s| {
            let name = self.names.get(s.name as usize).map_or("", |n| &**n);
            (s.start, s.end, name)
        })
    }

    /// Keep these symbols but map file offsets with `runtime`'s segments:
    /// a separate debug file's program headers carry no file offsets, so
    /// offsets are those of the binary that was mapped.
    pub(crate) fn with_segments_of(mut self, runtime: &ElfSymbols) -> ElfSymbols {
        self.segments = runtime.segments.clone();
        self.base = runtime.base;
        self
    }
}

fn parse_elf<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Result<ElfSymbols, SymbolError> {
    let file = ElfFile::<Elf>::parse(data).map_err(|e| elf_error(e.to_string()))?;
    let endian = file.endian();
    let machine = file.elf_header().e_machine(endian);
    let sections = file.elf_section_table();

    let mut segments = Vec::new();
    let mut base = u64::MAX;
    for ph in file.elf_program_headers() {
        if ph.p_type(endian) != elf::PT_LOAD {
            continue;
        }
        let vaddr: u64 = ph.p_vaddr(endian).into();
        let align: u64 = ph.p_align(endian).into();
        let page = if align.is_power_of_two() && align >= 4096 {
            align
        } else {
            4096
        };
        base = base.min(vaddr & !(page - 1));
        segments.push(LoadSegment {
            offset: ph.p_offset(endian).into(),
            filesz: ph.p_filesz(endian).into(),
            vaddr,
            exec: ph.p_flags(endian) & elf::PF_X != 0,
        });
    }
    if base == u64::MAX {
        base = 0;
    }

    let symtab = file.elf_symbol_table();
    let dynsym = file.elf_dynamic_symbol_table();
    let mut interned: HashMap<&[u8], u32> = HashMap::new();
    let mut names: Vec<Arc<str>> = Vec::new();
    let mut syms = Vec::new();
    for table in [symtab, dynsym] {
        for (index, sym) in table.enumerate() {
            if sym.st_name(endian) == 0 {
                continue;
            }
            let ty = sym.st_type();
            let shndx = sym.st_shndx(endian);
            let vis = sym.st_visibility();
            let is_label = ty == elf::STT_NOTYPE
                && shndx != elf::SHN_UNDEF
                && shndx != elf::SHN_ABS
                && vis != elf::STV_HIDDEN
                && vis != elf::STV_INTERNAL;
            let is_func = matches!(ty, elf::STT_FUNC | elf::STT_GNU_IFUNC);
            let keep = is_label || ((is_func || ty == elf::STT_OBJECT) && shndx != elf::SHN_UNDEF);
            if !keep || shndx == elf::SHN_ABS {
                continue;
            }
            let Ok(raw_name) = table.symbol_name(endian, sym) else {
                continue;
            };
            if raw_name.is_empty()
                || (matches!(machine, elf::EM_ARM | elf::EM_AARCH64)
                    && is_arm_mapping_symbol(raw_name))
            {
                continue;
            }
            let Ok(Some(sec_index)) = table.symbol_section(endian, sym, index) else {
                continue;
            };
            let Ok(sec) = sections.section(sec_index) else {
                continue;
            };
            let flags: u64 = sec.sh_flags(endian).into();
            if flags & u64::from(elf::SHF_ALLOC) == 0 {
                continue;
            }
            if is_label {
                let Ok(sec_name) = sections.section_name(endian, sec) else {
                    continue;
                };
                let has = |pat: &[u8]| sec_name.windows(pat.len()).any(|w| w == pat);
                if !has(b"text") && !has(b"data") {
                    continue;
                }
            }
            let mut start: u64 = sym.st_value(endian).into();
            if machine == elf::EM_ARM && ty == elf::STT_FUNC && start & 1 == 1 {
                start -= 1;
            }
            let size: u64 = sym.st_size(endian).into();
            let name = match interned.get(raw_name) {
                Some(&i) => i,
                None => {
                    let text = String::from_utf8_lossy(raw_name);
                    names.push(Arc::from(demangle(&text).as_ref()));
                    let i = (names.len() - 1) as u32;
                    interned.insert(raw_name, i);
                    i
                }
            };
            let binding = match sym.st_bind() {
                elf::STB_GLOBAL => Binding::Global,
                elf::STB_WEAK => Binding::Weak,
                _ => Binding::Local,
            };
            syms.push(RangeSym {
                start,
                end: start.saturating_add(size),
                binding,
                name,
                group: NO_GROUP,
            });
        }
    }
    let syms = table::finish(syms, false, |i| names.get(i as usize).map_or("", |n| n));

    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let debuglink = file
        .gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, _crc)| String::from_utf8_lossy(name).into_owned());
    Ok(ElfSymbols {
        syms,
        names,
        segments,
        base,
        build_id,
        debuglink,
        has_symtab: !symtab.is_empty(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for data in [&b""[..], b"\x7fELF", b"hello world", &[0u8; 64]] {
            let e = ElfSymbols::parse(data).unwrap_err().to_string();
            assert!(e.contains("<memory>"), "{e}");
        }
    }

    #[test]
    fn open_names_the_path() {
        let e = ElfSymbols::open(Path::new("/nonexistent/libx.so"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/libx.so"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("not-elf");
        std::fs::write(&p, b"#!/bin/sh\necho hi\n").unwrap();
        let e = ElfSymbols::open(&p).unwrap_err().to_string();
        assert!(e.contains(&p.display().to_string()), "{e}");
        let e = ElfSymbols::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn arm_mapping_symbols() {
        assert!(is_arm_mapping_symbol(b"$x"));
        assert!(is_arm_mapping_symbol(b"$d.1"));
        assert!(!is_arm_mapping_symbol(b"$xyz"));
        assert!(!is_arm_mapping_symbol(b"main"));
    }
}
