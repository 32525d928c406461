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
use std::borrow::Cow;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// One `PT_LOAD` program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LoadSegment {
    offset: u64,
    filesz: u64,
    vaddr: u64,
    exec: bool,
}

/// Symbol names as found in the file (mangled), demangled on first use:
/// a binary has tens of thousands of symbols and a profile touches few of
/// them, and demangling every name at load dominated the cost of loading a
/// large Rust or C++ binary.
#[derive(Debug, Clone, Default)]
struct Names {
    /// Raw names back to back; name `i` is `raw[ends[i - 1]..ends[i]]`.
    raw: Vec<u8>,
    ends: Vec<usize>,
    demangled: Vec<OnceLock<Arc<str>>>,
}

impl Names {
    fn with_capacity(names: usize, bytes: usize) -> Names {
        Names {
            raw: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(names),
            demangled: Vec::with_capacity(names),
        }
    }

    fn push(&mut self, raw: &[u8]) -> u32 {
        self.raw.extend_from_slice(raw);
        self.ends.push(self.raw.len());
        self.demangled.push(OnceLock::new());
        (self.ends.len() - 1) as u32
    }

    fn get(&self, i: u32) -> Option<&Arc<str>> {
        let i = i as usize;
        let cell = self.demangled.get(i)?;
        Some(cell.get_or_init(|| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            Arc::from(demangle_raw(&self.raw[start..self.ends[i]]).as_ref())
        }))
    }
}

/// [`demangle`] of raw symbol bytes (invalid UTF-8 replaced).
fn demangle_raw(raw: &[u8]) -> Cow<'_, str> {
    match String::from_utf8_lossy(raw) {
        Cow::Borrowed(text) => demangle(text),
        Cow::Owned(text) => Cow::Owned(demangle(&text).into_owned()),
    }
}

/// True when `a` and `b` are C++ mangled names that differ only in the
/// digit of constructor or destructor variants (`C1`/`C2`, `D0`/`D1`/`D2`).
/// Such names demangle to the same text, and when they do not demangle they
/// stay equally long with the same leading underscores: either way neither
/// wins an alias tie-break, so they need not be demangled to compare.
fn ctor_variants(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.starts_with(b"_Z")
        && b.starts_with(b"_Z")
        && a.iter().zip(b).enumerate().all(|(i, (x, y))| {
            x == y
                || (i > 0
                    && matches!(a[i - 1], b'C' | b'D')
                    && x.is_ascii_digit()
                    && y.is_ascii_digit()
                    // End of the nested name, template arguments or an ABI
                    // tag: not a length prefix of the next identifier.
                    && matches!(a.get(i + 1), Some(b'E' | b'I' | b'B')))
        })
}

/// The symbols, segments and identity of one ELF file.
#[derive(Debug, Clone, Default)]
pub struct ElfSymbols {
    syms: Vec<RangeSym>,
    names: Names,
    segments: Vec<LoadSegment>,
    /// Lowest `PT_LOAD` address rounded down to its page: the load bias of
    /// offset 0 when segments carry no file data (a separate debug file).
    base: u64,
    build_id: Option<Vec<u8>>,
    debuglink: Option<String>,
    has_symtab: bool,
    /// The file carries DWARF line or debug info (`.debug_line`,
    /// `.debug_info`, compressed or not): inline frames and source lines
    /// can be read from it ([`crate::dwarf`]).
    has_dwarf: bool,
    /// Synthesized PLT entries (`name@plt`), with their own names: they come
    /// from the mapped binary even when symbols come from a debug file.
    plt: Vec<RangeSym>,
    plt_names: Vec<Arc<str>>,
    /// Start of `.plt`: a symbol starting before it does not reach into it.
    plt_start: Option<u64>,
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

    /// The GNU build-id of the ELF file at `path`, read from its headers
    /// and notes alone (the symbol tables are not parsed); `None` when the
    /// file cannot be read, is not ELF or has none.
    pub fn read_build_id(path: &Path) -> Option<Vec<u8>> {
        use object::Object;
        let file = std::fs::File::open(path).ok()?;
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        // SAFETY: as in `open`: a read-only mapping, only parsed.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let obj = object::File::parse(&*map).ok()?;
        obj.build_id().ok().flatten().map(<[u8]>::to_vec)
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
        if let Some(p) = table::find(&self.plt, vaddr) {
            return self.plt_names.get(p.name as usize);
        }
        let s = table::find(&self.syms, vaddr)?;
        if self.plt_start.is_some_and(|p| s.start < p && vaddr >= p) {
            return None;
        }
        self.names.get(s.name)
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

    /// True when the file has DWARF debug or line information.
    pub fn has_dwarf(&self) -> bool {
        self.has_dwarf
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
            let name = self.names.get(s.name).map_or("", |n| &**n);
            (s.start, s.end, name)
        })
    }

    /// Keep these symbols but map file offsets with `runtime`'s segments:
    /// a separate debug file's program headers carry no file offsets, so
    /// offsets are those of the binary that was mapped.
    pub(crate) fn with_segments_of(mut self, runtime: &ElfSymbols) -> ElfSymbols {
        self.segments = runtime.segments.clone();
        self.base = runtime.base;
        // A debug file's PLT sections carry no data: use the binary's.
        self.plt = runtime.plt.clone();
        self.plt_names = runtime.plt_names.clone();
        self.plt_start = runtime.plt_start;
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
    // Raw names by symbol; aliases are resolved (which may demangle the
    // few names that tie) before the survivors' names are copied out.
    let capacity = symtab.len() + dynsym.len();
    let mut raw_names: Vec<&[u8]> = Vec::with_capacity(capacity);
    let mut syms = Vec::with_capacity(capacity);
    let mut ifuncs: Vec<u64> = Vec::new();
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
            raw_names.push(raw_name);
            let name = (raw_names.len() - 1) as u32;
            if ty == elf::STT_GNU_IFUNC {
                ifuncs.push(start);
            }
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
    let mut syms = table::finish_by(syms, false, |a, b| {
        let raw = |i: u32| raw_names.get(i as usize).copied().unwrap_or_default();
        let (a, b) = (raw(a), raw(b));
        // The same name in .symtab and .dynsym is the usual alias; C++
        // constructor and destructor variants are the next most common.
        (a != b && !ctor_variants(a, b)).then(|| (demangle_raw(a), demangle_raw(b)))
    });
    let raw = |i: u32| raw_names.get(i as usize).copied().unwrap_or_default();
    let mut names = Names::with_capacity(syms.len(), syms.iter().map(|s| raw(s.name).len()).sum());
    for s in &mut syms {
        s.name = names.push(raw(s.name));
    }
    let plt = synthesize_plt(&file, data, &syms, &names, &ifuncs);

    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let has_dwarf = sections.iter().any(|sh| {
        sh.sh_type(endian) != elf::SHT_NOBITS
            && sh.sh_size(endian).into() > 0
            && sections.section_name(endian, sh).is_ok_and(|n| {
                matches!(
                    n,
                    b".debug_info" | b".debug_line" | b".zdebug_info" | b".zdebug_line"
                )
            })
    });
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
        has_dwarf,
        plt_start: plt.start,
        plt: plt.syms,
        plt_names: plt.names,
    })
}

/// Synthesized PLT symbols.
#[derive(Default)]
struct Plt {
    syms: Vec<RangeSym>,
    names: Vec<Arc<str>>,
    start: Option<u64>,
}

impl Plt {
    fn add(&mut self, start: u64, size: u64, name: String) {
        self.names.push(name.into());
        self.syms.push(RangeSym {
            start,
            end: start.saturating_add(size),
            binding: Binding::Global,
            name: (self.names.len() - 1) as u32,
            group: NO_GROUP,
        });
    }
}

/// perf's `get_plt_sizes`: (header size, entry size) of a PLT section.
fn plt_sizes(machine: u16, entsize: u64, addralign: u64) -> Option<(u64, u64)> {
    let (header, entry) = match machine {
        elf::EM_ARM => (20, 12),
        elf::EM_AARCH64 | elf::EM_LOONGARCH | elf::EM_RISCV => (32, 16),
        elf::EM_SPARC => (48, 12),
        elf::EM_SPARCV9 => (128, 32),
        elf::EM_386 | elf::EM_X86_64 => {
            let e = if entsize == 8 || entsize == 16 {
                entsize
            } else if addralign == 8 {
                8
            } else {
                16
            };
            (e, e)
        }
        _ => (entsize, entsize),
    };
    (entry > 0).then_some((header, entry))
}

/// Displacement to the GOT slot of an x86-64 PLT entry (`endbr64`, `bnd`
/// prefix, then `jmp *disp32(%rip)`), measured from the entry start.
fn x86_64_plt_disp(p: &[u8]) -> Option<u64> {
    let mut n = 0;
    if p.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        n += 4;
    }
    if p.get(n) == Some(&0xf2) {
        n += 1;
    }
    if p.get(n..n + 2)? != [0xff, 0x25] {
        return None;
    }
    let d = p.get(n + 2..n + 6)?;
    let disp = i32::from_le_bytes([d[0], d[1], d[2], d[3]]);
    Some(((n + 6) as u64).wrapping_add(i64::from(disp) as u64))
}

/// Relocations of a REL or RELA section as (r_offset, r_sym, r_type, addend).
fn relocations<Elf: FileHeader<Endian = Endianness>>(
    sec: &Elf::SectionHeader,
    endian: Endianness,
    data: &[u8],
) -> Vec<(u64, u32, u32, i64)> {
    use object::read::elf::{Rel, Rela};
    match sec.sh_type(endian) {
        elf::SHT_RELA => sec
            .data_as_array::<Elf::Rela, _>(endian, data)
            .unwrap_or_default()
            .iter()
            .map(|r| {
                (
                    r.r_offset(endian).into(),
                    r.r_sym(endian, false),
                    r.r_type(endian, false),
                    r.r_addend(endian).into(),
                )
            })
            .collect(),
        elf::SHT_REL => sec
            .data_as_array::<Elf::Rel, _>(endian, data)
            .unwrap_or_default()
            .iter()
            .map(|r| {
                (
                    r.r_offset(endian).into(),
                    r.r_sym(endian),
                    r.r_type(endian),
                    0,
                )
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// perf's `dso__synthesize_plt_symbols` (with `.plt.sec` and `.plt.got`),
/// in virtual addresses: a `.plt` header symbol and one `name@plt` per
/// PLT relocation, in GOT order on x86.
fn synthesize_plt<Elf: FileHeader<Endian = Endianness>>(
    file: &ElfFile<'_, Elf>,
    data: &[u8],
    syms: &[RangeSym],
    names: &Names,
    ifuncs: &[u64],
) -> Plt {
    let mut out = Plt::default();
    let endian = file.endian();
    let machine = file.elf_header().e_machine(endian);
    let x86 = matches!(machine, elf::EM_386 | elf::EM_X86_64);
    let sections = file.elf_section_table();
    let Some((_, plt)) = sections.section_by_name(endian, b".plt") else {
        return out;
    };
    let plt_addr: u64 = plt.sh_addr(endian).into();
    let plt_size: u64 = plt.sh_size(endian).into();
    let Some((header, mut entry)) = plt_sizes(
        machine,
        plt.sh_entsize(endian).into(),
        plt.sh_addralign(endian).into(),
    ) else {
        return out;
    };
    out.start = Some(plt_addr);
    out.add(plt_addr, header, ".plt".to_string());
    let sym_name = |table: &object::read::elf::SymbolTable<'_, Elf>, index: u32| -> String {
        table
            .symbol(object::SymbolIndex(index as usize))
            .ok()
            .and_then(|s| table.symbol_name(endian, s).ok())
            .map(|n| demangle(&String::from_utf8_lossy(n)).into_owned())
            .unwrap_or_default()
    };
    let table_for = |link: u32| {
        let link = object::SectionIndex(link as usize);
        if link == file.elf_dynamic_symbol_table().section() {
            Some(file.elf_dynamic_symbol_table())
        } else if link == file.elf_symbol_table().section() {
            Some(file.elf_symbol_table())
        } else {
            None
        }
    };

    // .plt.got (x86): entries named through .rela.dyn.
    if x86 {
        if let Some((_, got)) = sections.section_by_name(endian, b".plt.got") {
            let ent: u64 = got.sh_entsize(endian).into();
            let bytes_len = got.data(endian, data).map_or(0, |b| b.len() as u64);
            // Only entries whose bytes are in the file (a hostile header
            // cannot make us invent millions of them).
            let sh_size: u64 = got.sh_size(endian).into();
            let size = sh_size.min(bytes_len);
            let addr: u64 = got.sh_addr(endian).into();
            let off: u64 = got.sh_offset(endian).into();
            let bytes = got.data(endian, data).unwrap_or_default();
            let mut dyn_relocs = Vec::new();
            let mut dyn_table = None;
            if machine == elf::EM_X86_64 {
                if let Some((_, rd)) = sections.section_by_name(endian, b".rela.dyn") {
                    dyn_table = table_for(rd.sh_link(endian));
                    dyn_relocs = relocations::<Elf>(rd, endian, data);
                    dyn_relocs.retain(|r| r.1 != 0);
                    dyn_relocs.sort_by_key(|r| r.0);
                }
            }
            if ent > 0 {
                let mut i = 0u64;
                while i < size {
                    let name = bytes
                        .get(i as usize..)
                        .and_then(x86_64_plt_disp)
                        .map(|d| addr.wrapping_add(i).wrapping_add(d))
                        .and_then(|target| {
                            let k = dyn_relocs.binary_search_by_key(&target, |r| r.0).ok()?;
                            let n = sym_name(dyn_table?, dyn_relocs[k].1);
                            (!n.is_empty()).then(|| format!("{n}@plt"))
                        })
                        .unwrap_or_else(|| format!("offset_{:#x}@plt", off.wrapping_add(i)));
                    out.add(addr.wrapping_add(i), ent, name);
                    i += ent;
                }
            }
        }
    }

    let mut lazy = true;
    let mut slot = plt_addr;
    let mut slot_section = plt;
    if x86 {
        if let Some((_, sec)) = sections.section_by_name(endian, b".plt.sec") {
            let Some((_, e)) = plt_sizes(
                machine,
                sec.sh_entsize(endian).into(),
                sec.sh_addralign(endian).into(),
            ) else {
                return out;
            };
            entry = e;
            if let Some(h) = out.syms.first_mut() {
                h.end = plt_addr.saturating_add(plt_size);
            }
            slot = sec.sh_addr(endian).into();
            slot_section = sec;
            lazy = false;
        }
    }
    let rel = sections
        .section_by_name(endian, b".rela.plt")
        .or_else(|| sections.section_by_name(endian, b".rel.plt"));
    let Some((_, rel)) = rel else {
        return out;
    };
    let Some(table) = table_for(rel.sh_link(endian)) else {
        return out;
    };
    let mut relocs = relocations::<Elf>(rel, endian, data);
    if lazy {
        if (relocs.len() as u64).saturating_mul(entry) == plt_size {
            // No header: drop the header symbol.
            out.syms.retain(|s| s.start != plt_addr || s.name != 0);
        } else {
            slot = slot.saturating_add(header);
        }
    }
    if x86 {
        relocs.sort_by_key(|r| r.0);
    }
    let slot_offset: u64 = slot_section.sh_offset(endian).into();
    let slot_delta = slot_offset.wrapping_sub(slot_section.sh_addr(endian).into());
    for (_, sym_index, r_type, addend) in relocs.into_iter().take(1 << 20) {
        let n = sym_name(table, sym_index);
        let name = if !n.is_empty() {
            format!("{n}@plt")
        } else if machine == elf::EM_X86_64 && r_type == elf::R_X86_64_IRELATIVE {
            let target = addend as u64;
            let ifunc = ifuncs
                .contains(&target)
                .then(|| table::find(syms, target))
                .flatten()
                .filter(|s| s.start == target)
                .and_then(|s| names.get(s.name));
            match ifunc {
                Some(f) => format!("{f}@plt"),
                None => format!("offset_{:#x}@plt", slot.wrapping_add(slot_delta)),
            }
        } else {
            format!("offset_{:#x}@plt", slot.wrapping_add(slot_delta))
        };
        out.add(slot, entry, name);
        slot = slot.saturating_add(entry);
    }
    let names_ref = out.names.clone();
    out.syms = table::finish(std::mem::take(&mut out.syms), false, |i| {
        names_ref.get(i as usize).map_or("", |n| n)
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctor_variants_demangle_alike() {
        let (c1, c2) = (&b"_ZN3FooC1Ev"[..], &b"_ZN3FooC2Ev"[..]);
        assert!(ctor_variants(c1, c2));
        assert_eq!(demangle_raw(c1), demangle_raw(c2));
        let (d0, d2) = (&b"_ZN3FooD0Ev"[..], &b"_ZN3FooD2Ev"[..]);
        assert!(ctor_variants(d0, d2));
        assert_eq!(demangle_raw(d0), demangle_raw(d2));
        assert!(!ctor_variants(b"_ZN3FooC1Ev", b"_ZN3BarC1Ev"));
        assert!(!ctor_variants(b"_Z3f1v", b"_Z3f2v"));
        assert!(!ctor_variants(b"abC1", b"abC2"));
        assert!(!ctor_variants(b"_ZN1C1xEv", b"_ZN1C2xEv"));
    }

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
