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
use addr2line::gimli;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// DWARF of one file.
///
/// The sections are read once (inflated once when compressed) and shared by
/// addr2line's lookups and the unit index of [`DwarfFile::segments`]. Before,
/// addr2line's `Loader` and the index each read them: libc's debug file,
/// whose sections are compressed, was inflated twice, its location lists
/// (which neither needs) included, and its symbol table parsed a third time
/// (the symbol tables are this crate's own): a first report of a demo
/// recording whose line cache was empty took 0.35 s of CPU and 298 MB
/// before, 0.27 s and 202 MB after (five runs of each, alternating). A
/// file whose DWARF lives in
/// other files (split units, a supplementary file) is read by the `Loader`,
/// which finds them.
pub struct DwarfFile {
    // Field order is drop order: `source` and `index` borrow the bytes
    // `_owners` holds, so they are declared (and dropped) before it.
    source: Source,
    path: PathBuf,
    /// The file's units and their address ranges, for [`DwarfFile::segments`]
    /// (loaded at its first call; `None` inside when it cannot be used).
    index: Option<Option<DieIndex>>,
    /// The file's mapping and the inflated sections, which the `'static`
    /// slices of `source` and `index` point into (see [`Owned::slice`]).
    _owners: Owned,
}

enum Source {
    /// The sections read here, shared with the index.
    Shared {
        ctx: addr2line::Context<Slice<'static>>,
        dwarf: Arc<gimli::Dwarf<Slice<'static>>>,
        /// Answers for units whose DWARF is in a `.dwo`/`.dwp` file, loaded
        /// when a lookup first needs one.
        split: std::cell::OnceCell<Option<addr2line::Loader>>,
    },
    /// A file with a supplementary DWARF file.
    Loader(addr2line::Loader),
}

/// Bytes that outlive every slice handed out of them: a file mapping and
/// inflated sections. The heap buffers and the mapping do not move when
/// this value moves, and nothing here is mutated or freed before drop.
#[derive(Default)]
struct Owned {
    map: Option<memmap2::Mmap>,
    inflated: Vec<Vec<u8>>,
}

impl Owned {
    /// A `'static` view of `bytes`, which must lie in `self.map` or in a
    /// buffer of `self.inflated`.
    ///
    /// SAFETY (of the callers' use): the views live only in the fields of
    /// the [`DwarfFile`] that owns `self`, which are dropped before it; the
    /// mapping is read-only (a file truncated meanwhile can fault, as it can
    /// for addr2line's own mapping).
    fn slice(bytes: &[u8]) -> &'static [u8] {
        // SAFETY: see above; the pointer and length come from a live slice.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) }
    }
}

/// Answers that hold over a whole range of addresses: `(start, info)` in
/// address order, each up to the next start, the last up to `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segments {
    pub end: u64,
    pub parts: Vec<(u64, LineInfo)>,
}

/// A function with more boundaries than this gets no segments (its
/// addresses are answered one by one).
const MAX_BOUNDARIES: usize = 50_000;

/// A unit larger than this gets no pieces ([`DieIndex::unit_ranges`]).
const MAX_UNIT_BYTES: usize = 256 * 1024;

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
    /// Load the DWARF of `path`: its sections are read (and inflated) here,
    /// its units parsed at the first lookups that need them.
    pub fn open(path: &Path) -> Result<DwarfFile, SymbolError> {
        let err = |reason: String| SymbolError::Elf {
            origin: path.display().to_string(),
            reason: format!("DWARF: {reason}"),
        };
        let loader = || addr2line::Loader::new(path).map_err(|e| err(e.to_string()));
        let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        // SAFETY: mapped read-only and only read; see `Owned::slice`.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(e.to_string()))?;
        let mut owners = Owned::default();
        let mut dwarf = {
            use object::{Object, ObjectSection};
            let obj = object::File::parse(&*map).map_err(|e| err(e.to_string()))?;
            if obj.section_by_name(".gnu_debugaltlink").is_some() {
                return Ok(DwarfFile {
                    source: Source::Loader(loader()?),
                    path: path.to_path_buf(),
                    index: Some(None),
                    _owners: owners,
                });
            }
            let endian = if obj.is_little_endian() {
                gimli::RunTimeEndian::Little
            } else {
                gimli::RunTimeEndian::Big
            };
            let inflated = &mut owners.inflated;
            let dwarf = gimli::Dwarf::load(|id| -> Result<Slice<'static>, String> {
                use gimli::SectionId as S;
                // Locations and macros say nothing about lines, functions
                // or their ranges (libc's location lists are a fifth of its
                // compressed DWARF).
                if matches!(
                    id,
                    S::DebugLoc | S::DebugLocLists | S::DebugMacinfo | S::DebugMacro
                ) {
                    return Ok(gimli::EndianSlice::new(&[], endian));
                }
                let Some(sec) = obj.section_by_name(id.name()) else {
                    return Ok(gimli::EndianSlice::new(&[], endian));
                };
                let bytes = match sec.uncompressed_data().map_err(|e| e.to_string())? {
                    std::borrow::Cow::Borrowed(b) => Owned::slice(b),
                    std::borrow::Cow::Owned(v) => {
                        inflated.push(v);
                        Owned::slice(inflated.last().map(Vec::as_slice).unwrap_or(&[]))
                    }
                };
                Ok(gimli::EndianSlice::new(bytes, endian))
            })
            .map_err(err)?;
            dwarf
        };
        owners.map = Some(map);
        dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
        let dwarf = Arc::new(dwarf);
        let ctx =
            addr2line::Context::from_arc_dwarf(dwarf.clone()).map_err(|e| err(e.to_string()))?;
        Ok(DwarfFile {
            source: Source::Shared {
                ctx,
                dwarf,
                split: std::cell::OnceCell::new(),
            },
            path: path.to_path_buf(),
            index: None,
            _owners: owners,
        })
    }

    /// What DWARF says over the whole function around `vaddr`, exactly:
    /// the answer of [`DwarfFile::lookup`] changes only where a line-table
    /// row or the range of a function or inlined subroutine begins or ends,
    /// so the function's range is cut at every such boundary and each piece
    /// is answered at its start. `None` when that cannot be known for sure:
    /// no function covers `vaddr`, the units' address table is incomplete,
    /// several units cover the function, split or supplementary DWARF.
    ///
    /// A later address in the same function is then answered without the
    /// DWARF ([`crate::linecache`]): a new recording of the same binaries
    /// meets new addresses mostly in functions it met before.
    pub fn segments(&mut self, vaddr: u64) -> Option<Segments> {
        let Source::Shared { ctx, dwarf, .. } = &self.source else {
            return None;
        };
        if self.index.is_none() {
            self.index = Some(DieIndex::load(dwarf.clone()));
        }
        let index = self.index.as_mut()?.as_mut()?;
        let (lo, hi, mut bounds) = index.bounds(vaddr).ok()??;
        if let Ok(rows) = ctx.find_location_range(lo, hi) {
            for (a, len, _) in rows {
                bounds.push(a);
                bounds.push(a.saturating_add(len));
            }
        } else {
            return None;
        }
        bounds.push(lo);
        bounds.retain(|&b| lo <= b && b < hi);
        bounds.sort_unstable();
        bounds.dedup();
        if bounds.len() > MAX_BOUNDARIES {
            return None;
        }
        let mut parts: Vec<(u64, LineInfo)> = Vec::with_capacity(bounds.len());
        for b in bounds {
            let info = self.lookup(b);
            if parts.last().is_some_and(|(_, last)| *last == info) {
                continue;
            }
            parts.push((b, info));
        }
        Some(Segments { end: hi, parts })
    }

    /// Inline frames and source line of a link-time virtual address.
    /// Damaged or missing DWARF for an address gives an empty answer.
    pub fn lookup(&self, vaddr: u64) -> LineInfo {
        match &self.source {
            Source::Loader(l) => frames_info(l.find_frames(vaddr)),
            Source::Shared { ctx, split, .. } => match ctx.find_frames(vaddr) {
                addr2line::LookupResult::Output(r) => frames_info(r),
                // The unit's DWARF is in another file: the `Loader` finds
                // and reads it.
                addr2line::LookupResult::Load { .. } => split
                    .get_or_init(|| addr2line::Loader::new(&self.path).ok())
                    .as_ref()
                    .map(|l| frames_info(l.find_frames(vaddr)))
                    .unwrap_or_default(),
            },
        }
    }
}

/// The inlined functions and line of an address from addr2line's frames.
fn frames_info<R: gimli::Reader, E>(frames: Result<addr2line::FrameIter<'_, R>, E>) -> LineInfo {
    let mut names: Vec<Arc<str>> = Vec::new();
    let mut srcline = None;
    if let Ok(mut frames) = frames {
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

/// The DWARF of one file as gimli reads it, for the ranges of its units'
/// functions and inlined subroutines (addr2line answers lookups, but does
/// not say over which addresses an answer holds).
struct DieIndex {
    dwarf: Arc<gimli::Dwarf<Slice<'static>>>,
    /// `.debug_aranges`: (begin, end, unit offset in `.debug_info`).
    aranges: Vec<(u64, u64, usize)>,
    /// [`DieIndex::unit_ranges`] of the units met so far.
    #[allow(clippy::type_complexity)]
    units: std::collections::HashMap<usize, Option<Vec<(u64, u64, bool)>>>,
}

type Slice<'a> = gimli::EndianSlice<'a, gimli::RunTimeEndian>;

impl DieIndex {
    fn load(dwarf: Arc<gimli::Dwarf<Slice<'static>>>) -> Option<DieIndex> {
        let mut index = DieIndex {
            dwarf,
            aranges: Vec::new(),
            units: Default::default(),
        };
        index.aranges = index.read_aranges().ok()??;
        Some(index)
    }

    fn dwarf(&self) -> &gimli::Dwarf<Slice<'static>> {
        &self.dwarf
    }

    /// Every unit's address ranges: from `.debug_aranges`, and for a unit
    /// that table leaves out, from the unit itself (as addr2line finds
    /// units); `None` when a unit is split or of a kind not read here.
    fn read_aranges(&self) -> gimli::Result<Option<Vec<(u64, u64, usize)>>> {
        let dwarf = self.dwarf();
        let mut out = Vec::new();
        let mut listed = std::collections::HashSet::new();
        let mut hs = dwarf.debug_aranges.headers();
        while let Some(h) = hs.next()? {
            let off = h.debug_info_offset().0;
            listed.insert(off);
            let mut es = h.entries();
            while let Some(e) = es.next()? {
                let r = e.range();
                if r.begin < r.end {
                    out.push((r.begin, r.end, off));
                }
            }
        }
        let mut it = dwarf.units();
        while let Some(h) = it.next()? {
            if !matches!(
                h.type_(),
                gimli::UnitType::Compilation | gimli::UnitType::Partial
            ) {
                return Ok(None);
            }
            let Some(off) = h.offset().as_debug_info_offset() else {
                return Ok(None);
            };
            if listed.contains(&off.0) {
                continue;
            }
            let unit = dwarf.unit(h)?;
            let mut rs = dwarf.unit_ranges(&unit)?;
            while let Some(r) = rs.next()? {
                if r.begin < r.end {
                    out.push((r.begin, r.end, off.0));
                }
            }
        }
        Ok(Some(out))
    }

    /// The range `[lo, hi)` of the function around `vaddr` and the
    /// boundaries of every function and inlined subroutine range inside it;
    /// `None` when no single unit holds it.
    #[allow(clippy::type_complexity)]
    /// The ranges of every function (`true`) and inlined subroutine
    /// (`false`) of the unit at `unit_off`; `None` for a split unit.
    #[allow(clippy::type_complexity)]
    fn unit_ranges(&self, unit_off: usize) -> gimli::Result<Option<Vec<(u64, u64, bool)>>> {
        let dwarf = self.dwarf();
        let header = dwarf
            .debug_info
            .header_from_offset(gimli::DebugInfoOffset(unit_off))?;
        // Walking a large unit's every entry (the standard library's, with
        // full debug info) costs more than the lookups it saves: a first
        // report under exec churn with a cold cache took 0.94-1.27 s of CPU
        // with every unit walked, 0.70-0.75 s with no pieces kept, and
        // 0.92-0.99 s with this bound. Such a unit's addresses are kept
        // one by one.
        if header.unit_length() > MAX_UNIT_BYTES {
            return Ok(None);
        }
        let unit = dwarf.unit(header)?;
        if unit.dwo_id.is_some() {
            return Ok(None);
        }
        let mut all = Vec::new();
        let mut cur = unit.entries();
        while let Some((_, e)) = cur.next_dfs()? {
            let tag = e.tag();
            if tag != gimli::DW_TAG_subprogram && tag != gimli::DW_TAG_inlined_subroutine {
                continue;
            }
            let mut rs = dwarf.die_ranges(&unit, e)?;
            while let Some(r) = rs.next()? {
                if r.begin < r.end {
                    all.push((r.begin, r.end, tag == gimli::DW_TAG_subprogram));
                }
            }
        }
        Ok(Some(all))
    }

    fn bounds(&mut self, vaddr: u64) -> gimli::Result<Option<(u64, u64, Vec<u64>)>> {
        let at: Vec<usize> = self
            .aranges
            .iter()
            .filter(|(b, e, _)| *b <= vaddr && vaddr < *e)
            .map(|(_, _, u)| *u)
            .collect();
        let Some(&unit_off) = at.first() else {
            // No unit covers it (code built without debug info, the
            // dependencies' here): nothing is known from the end of the
            // unit range below it to the start of the one above.
            let lo = self
                .aranges
                .iter()
                .filter(|(_, e, _)| *e <= vaddr)
                .map(|(_, e, _)| *e)
                .max()
                .unwrap_or(0);
            let hi = self
                .aranges
                .iter()
                .filter(|(b, _, _)| *b > vaddr)
                .map(|(b, _, _)| *b)
                .min()
                .unwrap_or(u64::MAX);
            return Ok(Some((lo, hi, Vec::new())));
        };
        if at.iter().any(|&u| u != unit_off) {
            return Ok(None);
        }
        if !self.units.contains_key(&unit_off) {
            let ranges = self.unit_ranges(unit_off)?;
            self.units.insert(unit_off, ranges);
        }
        let Some(all) = self.units.get(&unit_off).and_then(|r| r.as_ref()) else {
            return Ok(None);
        };
        let mut around: Option<(u64, u64)> = None;
        for &(b, e, subprogram) in all {
            if subprogram
                && b <= vaddr
                && vaddr < e
                && around.is_none_or(|(lo, hi)| e - b < hi - lo)
            {
                around = Some((b, e));
            }
        }
        let Some((lo, hi)) = around else {
            return Ok(None);
        };
        // Another unit's code inside the function: not this unit's alone.
        if self
            .aranges
            .iter()
            .any(|(b, e, u)| *u != unit_off && *b < hi && lo < *e)
        {
            return Ok(None);
        }
        let mut bounds = Vec::new();
        for &(b, e, _) in all {
            if b < hi && lo < e {
                bounds.push(b.max(lo));
                bounds.push(e.min(hi));
            }
        }
        Ok(Some((lo, hi, bounds)))
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

    /// The answer a set of segments gives at `a`.
    fn answer_at(segs: &Segments, a: u64) -> Option<&LineInfo> {
        let i = segs.parts.partition_point(|(s, _)| *s <= a);
        (i > 0 && a < segs.end).then(|| &segs.parts[i - 1].1)
    }

    /// Every address (every byte, not only instruction starts) of the
    /// functions segmented gets the answer a lookup of it gives.
    fn segments_are_exact(path: &Path, starts: &[u64]) -> (usize, usize, usize) {
        let mut d = DwarfFile::open(path).unwrap();
        let (mut functions, mut addresses, mut inlined) = (0, 0, 0);
        for &start in starts {
            let Some(segs) = d.segments(start) else {
                continue;
            };
            let lo = segs.parts[0].0;
            assert!(lo <= start && start < segs.end);
            functions += 1;
            inlined += segs
                .parts
                .iter()
                .filter(|(_, i)| !i.inlined.is_empty())
                .count();
            for a in lo..segs.end.min(lo + 20_000) {
                let want = d.lookup(a);
                assert_eq!(answer_at(&segs, a), Some(&want), "{path:?} at {a:#x}");
                addresses += 1;
            }
        }
        (functions, addresses, inlined)
    }

    #[test]
    fn segments_answer_every_address_of_a_function_as_lookups_do() {
        let exe = std::env::current_exe().unwrap();
        let elf = crate::ElfSymbols::open(&exe).unwrap();
        if !elf.has_dwarf() {
            eprintln!("SKIP: this test binary has no DWARF (built without debug info)");
            return;
        }
        // This crate's functions (line tables, inlined std and crate code).
        let mut starts: Vec<u64> = elf
            .iter()
            .filter(|(_, _, n)| n.contains("vmscope_symbols::"))
            .map(|(s, _, _)| s)
            .step_by(7)
            .take(60)
            .collect();
        // Start-up code built without DWARF: the gap between units.
        let crt: Vec<u64> = elf
            .iter()
            .filter(|(_, _, n)| ["_start", "_init", "_fini"].contains(n))
            .map(|(s, _, _)| s)
            .collect();
        let mut d = DwarfFile::open(&exe).unwrap();
        let gaps = crt
            .iter()
            .filter_map(|&a| d.segments(a))
            .filter(|g| g.parts.len() == 1 && g.parts[0].1 == LineInfo::default())
            .count();
        assert!(gaps > 0, "no gap between units found at {crt:x?}");
        starts.extend(crt);
        let (functions, addresses, inlined) = segments_are_exact(&exe, &starts);
        assert!(
            functions >= 20,
            "{functions} of {} functions segmented",
            starts.len()
        );
        assert!(
            inlined > 0,
            "no piece with inlined functions: the test shows little"
        );
        eprintln!("own binary: {functions} functions, {addresses} addresses, {inlined} with inlined functions");
        // libc's debug file, when installed (full DWARF, compressed).
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let Some(debug) = crate::ElfSymbols::open(libc).ok().and_then(|e| {
            let id: String = e.build_id()?.iter().map(|b| format!("{b:02x}")).collect();
            let p = PathBuf::from(format!(
                "/usr/lib/debug/.build-id/{}/{}.debug",
                &id[..2],
                &id[2..]
            ));
            p.exists().then_some((p, e))
        }) else {
            eprintln!("SKIP: no libc debug file");
            return;
        };
        let (path, e) = debug;
        let starts: Vec<u64> = e
            .iter()
            .filter(|(_, _, n)| {
                ["malloc", "free", "memcpy", "printf", "qsort", "strtod"]
                    .iter()
                    .any(|w| n.contains(w))
            })
            .map(|(s, _, _)| s)
            .take(40)
            .collect();
        let (functions, addresses, inlined) = segments_are_exact(&path, &starts);
        assert!(
            functions >= 5,
            "{functions} of {} libc functions segmented",
            starts.len()
        );
        eprintln!(
            "libc: {functions} functions, {addresses} addresses, {inlined} with inlined functions"
        );
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
