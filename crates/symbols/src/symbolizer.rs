//! The symbolizer: turns a [`NormalizedFrame`] of a domain into a
//! [`Resolved`] (image, symbol) pair, following the rules of docs/architecture.md §4:
//! host kernel and modules from kallsyms, files from their ELF symbols (or a
//! debug file found by build-id or debuglink), guest kernels from each
//! domain's kallsyms, anonymous and guest user code as one bucket each.
//!
//! It is on the hot path of recording and importing, so every ELF file is
//! parsed once per (path, build-id), every (image, address) is resolved once
//! and answered from a map afterwards with `Arc<str>` clones only, and names
//! are shared among all addresses of one symbol. Problems never fail a
//! resolution: they become [`Symbolizer::warnings`] and hex addresses.

use crate::dwarf::DwarfFile;
use crate::elf::ElfSymbols;
use crate::kallsyms::Kallsyms;
use crate::linecache::FileLines;
use crate::LineInfo;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use vmscope_model::{
    DeferredFrame, FastMap, ImageRef, NormalizedFrame, ANON_IMAGE, GUEST_KERNEL_IMAGE,
    INLINED_SUFFIX, KERNEL_IMAGE, UNKNOWN_IMAGE,
};

/// Image and symbol name printed for guest user code seen from the host.
pub const GUEST_USER: &str = "[guest.user]";

/// Where the symbolizer looks for symbols.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolizerOptions {
    /// Host kallsyms file; `None` reads `/proc/kallsyms`.
    pub kallsyms: Option<PathBuf>,
    /// Prefix for every file path, debug directories included (like perf
    /// `--symfs`); an empty directory resolves no file.
    pub symfs: Option<PathBuf>,
    /// Directories searched for separate debug files (`.build-id/xx/….debug`
    /// and debuglink names).
    pub debug_dirs: Vec<PathBuf>,
    /// Directory of the on-disk line cache ([`crate::linecache`]); `None`
    /// loads DWARF in every run.
    pub line_cache: Option<PathBuf>,
    /// Directory where this boot's kernel symbols are kept
    /// ([`crate::kernelcache`]) when `kallsyms` is `None`; `None` reads
    /// `/proc/kallsyms` in every run.
    pub kernel_cache: Option<PathBuf>,
}

impl Default for SymbolizerOptions {
    fn default() -> SymbolizerOptions {
        SymbolizerOptions {
            kallsyms: None,
            symfs: None,
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            line_cache: None,
            kernel_cache: None,
        }
    }
}

/// A resolved frame: the image (as reports name it) and the function.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resolved {
    pub image: Arc<str>,
    pub symbol: Arc<str>,
    /// `path:line` where the image has DWARF line tables, else empty.
    pub srcline: Arc<str>,
    /// Functions inlined at the address, outermost first, each ending in
    /// [`INLINED_SUFFIX`] as stack frames carry them (DWARF only).
    pub inlined: Option<Arc<[Arc<str>]>>,
}

impl Resolved {
    /// A frame with a name only (no DWARF).
    pub fn named(image: Arc<str>, symbol: Arc<str>) -> Resolved {
        Resolved {
            image,
            symbol,
            srcline: empty(),
            inlined: None,
        }
    }
}

fn empty() -> Arc<str> {
    static EMPTY: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Arc::from("")).clone()
}

/// FxHash (as in rustc): a fast non-cryptographic hash for the caches, whose
/// keys come from our own normalization, not from an adversary choosing
/// collisions.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i.into());
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i.into());
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Pointers of mapped files' paths kept by a deferring symbolizer, at most
/// (its images by text keep every image's number).
const IMAGE_PTR_LIMIT: usize = 1 << 16;

/// Past this many entries a cache is emptied rather than grown further.
const CACHE_LIMIT: usize = 1 << 22;
/// Warnings kept; later ones are only counted.
const WARNING_LIMIT: usize = 64;

fn hex(addr: u64) -> Arc<str> {
    format!("0x{addr:x}").into()
}

/// One kernel's symbols with interned names and an address cache.
struct KernelTable {
    syms: Kallsyms,
    /// Interned symbol names by table index.
    names: FxMap<usize, Arc<str>>,
    /// `[module]` image names by module index.
    module_images: Vec<Arc<str>>,
    /// Code registered since the table was read (`PERF_RECORD_KSYMBOL`):
    /// start → (end, image, name). Looked up before the table.
    dynamic: std::collections::BTreeMap<u64, (u64, Arc<str>, Arc<str>)>,
    cache: FxMap<u64, Resolved>,
    /// The table is the kept one of this boot ([`crate::kernelcache`]): an
    /// address it cannot name is looked up in this kallsyms file, read
    /// then, once.
    live: Option<PathBuf>,
    /// The table was read from the file in this run, after the kept one.
    read_live: bool,
    /// Addresses the file did not name either ([`crate::kernelcache::Unnamed`]).
    unnamed: crate::kernelcache::Unnamed,
}

impl KernelTable {
    fn new(syms: Kallsyms) -> KernelTable {
        let module_images = syms.modules().map(|m| format!("[{m}]").into()).collect();
        KernelTable {
            syms,
            names: FxMap::default(),
            module_images,
            dynamic: Default::default(),
            cache: FxMap::default(),
            live: None,
            read_live: false,
            unnamed: Default::default(),
        }
    }

    /// Code at `addr..addr + len` is `name` from now on (`unregister`:
    /// is no longer). Ranges it overlaps are dropped.
    fn set_dynamic(&mut self, addr: u64, len: u64, image: Arc<str>, name: &str, unregister: bool) {
        let end = addr.saturating_add(len.max(1));
        let overlapping: Vec<u64> = self
            .dynamic
            .range(..end)
            .rev()
            .take_while(|(_, (e, _, _))| *e > addr)
            .map(|(s, _)| *s)
            .collect();
        for s in overlapping {
            self.dynamic.remove(&s);
        }
        if !unregister {
            self.dynamic.insert(addr, (end, image, name.into()));
        }
        self.cache.clear();
    }

    /// The code registered at `addr` since the table was read, if any
    /// (`module_image: false` names its image `image`).
    fn dynamic_at(&self, addr: u64, image: &Arc<str>, module_image: bool) -> Option<Resolved> {
        let (_, (end, img, name)) = self.dynamic.range(..=addr).next_back()?;
        (addr < *end).then(|| {
            let image = if module_image {
                img.clone()
            } else {
                image.clone()
            };
            Resolved::named(image, name.clone())
        })
    }

    /// `module_image: false` names every symbol's image `image` (guests).
    fn resolve(&mut self, addr: u64, image: &Arc<str>, module_image: bool) -> Resolved {
        if let Some(r) = self.cache.get(&addr) {
            return r.clone();
        }
        if let Some(r) = self.dynamic_at(addr, image, module_image) {
            return r;
        }
        if self.syms.lookup_indexed(addr).is_none() && !self.unnamed.contains(addr) {
            // Code the kept table leaves out (BPF, trampolines), or a
            // reading that the kept one no longer matches: read the file.
            if let Some(Ok(k)) = self.live.take().map(|p| Kallsyms::from_path(&p)) {
                let module_images = k.modules().map(|m| format!("[{m}]").into()).collect();
                self.syms = k;
                self.module_images = module_images;
                self.names.clear();
                self.cache.clear();
                self.read_live = true;
            }
            if self.read_live && self.syms.lookup_indexed(addr).is_none() {
                self.unnamed.insert(addr);
            }
        }
        let r = match self.syms.lookup_indexed(addr) {
            Some((idx, module, sym)) => {
                let symbol = self
                    .names
                    .entry(idx)
                    .or_insert_with(|| Arc::from(sym.name))
                    .clone();
                let image = match module.and_then(|m| self.module_images.get(m)) {
                    Some(m) if module_image => m.clone(),
                    _ => image.clone(),
                };
                Resolved::named(image, symbol)
            }
            None => Resolved::named(image.clone(), hex(addr)),
        };
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(addr, r.clone());
        r
    }
}

type FileKey = (Arc<str>, Option<Arc<[u8]>>);

/// What a mapped file resolves with: its symbols, and its DWARF (or its
/// debug file's) where there is any.
#[derive(Clone)]
struct LoadedFile {
    symbols: Arc<ElfSymbols>,
    /// addr2line's loader is Send but not Sync: one lookup at a time.
    dwarf: Option<Arc<Mutex<FileDwarf>>>,
}

/// A file's DWARF: the line cache's answers, and the DWARF itself, opened
/// at the first address the cache cannot answer.
struct FileDwarf {
    path: PathBuf,
    file: Option<DwarfFile>,
    failed: bool,
    lines: Option<FileLines>,
}

impl FileDwarf {
    /// What DWARF says at `vaddr`, and the warning when opening it failed
    /// just now.
    fn lookup(&mut self, vaddr: u64) -> (LineInfo, Option<String>) {
        if let Some(i) = self.lines.as_ref().and_then(|l| l.get(vaddr)) {
            return (i.clone(), None);
        }
        let mut warning = None;
        if self.file.is_none() && !self.failed {
            match DwarfFile::open(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    self.failed = true;
                    warning = Some(format!("{e}: no inline frames or source lines from it"));
                }
            }
        }
        let Some(f) = &mut self.file else {
            return (LineInfo::default(), warning);
        };
        let info = f.lookup(vaddr);
        if let Some(l) = &mut self.lines {
            l.insert(vaddr, &info);
            // The whole function's answers, so that a later address in it
            // (a new recording of the same binary) needs no DWARF.
            if let Some(segs) = f.segments(vaddr) {
                l.insert_segments(&segs);
            }
        }
        (info, warning)
    }
}

/// The frames a deferring symbolizer numbered ([`Symbolizer::deferred`]).
/// A frame is looked up by integers only (its image's number, its address,
/// its module's number; a named frame by the pointers of its names), so
/// the path of a file is hashed once per mapping, not once per address.
#[derive(Default)]
struct DeferredTable {
    frames: Vec<DeferredFrame>,
    /// Frames before this index were handed out by
    /// [`Symbolizer::take_new_deferred`].
    taken: usize,
    /// (image number, address, module number) → frame number; image 0 is
    /// the host kernel, module 0 none.
    /// (FxHash, good for the interned keys of the other caches, probed
    /// long chains here: addresses that differ in a few middle bits.)
    later: FastMap<(u32, u64, u32), u32>,
    /// A direct-mapped front for `later` ([`LaterFront`]).
    front: LaterFront,
    /// (image name pointer, symbol pointer) → frame number; the names are
    /// held by `frames`, so a pointer is never reused while it is here.
    named: FastMap<(usize, usize), u32>,
    /// File images by the pointers of their path and build-id (each value
    /// holds both, so the pointers stay unique), then by their text.
    images_by_ptr: FastMap<(usize, usize), (u32, FileKey)>,
    images: FastMap<FileKey, u32>,
    modules: FastMap<Arc<str>, u32>,
}

impl DeferredTable {
    /// The number of the frame left for later at `key` (image number,
    /// address, module number), numbering `make()` if it is new.
    fn later_frame(&mut self, key: (u32, u64, u32), make: impl FnOnce() -> DeferredFrame) -> u32 {
        if let Some(n) = self.front.get(key) {
            return n;
        }
        let frames = &mut self.frames;
        let n = *self.later.entry(key).or_insert_with(|| {
            frames.push(make());
            frames.len() as u32 - 1
        });
        self.front.put(key, n);
        n
    }
}

/// Past `later`, a small direct-mapped table of recently numbered frames.
/// Under exec churn `later` holds every frame of every binary seen (tens of
/// thousands), and nearly every probe of it missed the CPU's caches: a
/// third of the deferring converter's time went there. The hot frames of a
/// recording are few, and this table (192 KiB) keeps most of them close.
/// Frame numbers never change, so an entry is never stale.
struct LaterFront {
    /// (address, image << 32 | module, frame number + 1; 0 when empty).
    slots: Box<[(u64, u64, u32)]>,
}

const FRONT_SLOTS: usize = 1 << 13;

impl Default for LaterFront {
    fn default() -> Self {
        LaterFront {
            slots: vec![(0, 0, 0); FRONT_SLOTS].into_boxed_slice(),
        }
    }
}

impl LaterFront {
    fn slot((image, addr, module): (u32, u64, u32)) -> (usize, u64) {
        let tag = u64::from(image) << 32 | u64::from(module);
        // One folded multiply mixes the address's middle bits (where
        // return addresses differ) into the index.
        let p = u128::from(addr ^ tag.rotate_left(17)) * 0x9e37_79b9_7f4a_7c15;
        let h = (p as u64) ^ ((p >> 64) as u64);
        ((h as usize) & (FRONT_SLOTS - 1), tag)
    }

    fn get(&self, key: (u32, u64, u32)) -> Option<u32> {
        let (i, tag) = Self::slot(key);
        let (a, t, n) = self.slots[i];
        (n != 0 && a == key.1 && t == tag).then(|| n - 1)
    }

    fn put(&mut self, key: (u32, u64, u32), n: u32) {
        let (i, tag) = Self::slot(key);
        self.slots[i] = (key.1, tag, n + 1);
    }
}

/// What a file on disk was: device, inode, size, modification and change
/// times (`None` when it could not be stat'ed: absent). The change time
/// catches a rewrite that restores size and modification time.
type Stamp = Option<(u64, u64, u64, [i64; 4])>;

/// The paths a loaded file's symbols depend on, each with its [`Stamp`].
type Stamps = Vec<(PathBuf, Stamp)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        [m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()],
    ))
}

/// Most files [`Symbolizer::take_files`] hands on.
const MAX_KEPT_FILES: usize = 64;

/// The files one symbolizer loaded, taken for a later one
/// ([`Symbolizer::take_files`], [`Symbolizer::reuse_files`]): a profiler
/// that runs session after session (the guest agent) loads a binary's
/// symbols once, not per session. Each file carries the paths its symbols
/// depend on (the binary, and every debug file candidate, present or not)
/// as they were just before they were read, and is reused only while they
/// are unchanged and the options are the same. Cloning shares the tables.
#[derive(Clone, Default)]
pub struct KeptFiles {
    opts: Option<SymbolizerOptions>,
    files: Vec<(FileKey, Stamps, LoadedFile)>,
}

impl KeptFiles {
    /// How many files are kept.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when no file is kept.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Resolves frames to (image, symbol) with caches; see the module docs.
pub struct Symbolizer {
    opts: SymbolizerOptions,
    kernel: KernelTable,
    /// Kernel module ranges from kernel mmap records (start, end, `[name]`):
    /// the image of kernel addresses the kernel's symbols cannot name (a
    /// recording from another machine).
    modules: Vec<(u64, u64, Arc<str>)>,
    /// Set when symbolization is deferred ([`Symbolizer::defer_frame`]).
    deferred: Option<DeferredTable>,
    guests: HashMap<String, KernelTable>,
    files: FxMap<FileKey, Option<LoadedFile>>,
    /// Paths met without a build-id → the key of `files` their file was
    /// loaded under, by the build-id read from it ([`Symbolizer::file`]).
    by_path: FxMap<Arc<str>, FileKey>,
    /// The paths each loaded file was read from, as they were just before
    /// ([`KeptFiles`]); `None` unless [`Symbolizer::keeping_files`] asked
    /// for them (a symbolizer that hands nothing on stats nothing more).
    stamps: Option<FxMap<FileKey, Stamps>>,
    cache: FxMap<NormalizedFrame, Resolved>,
    warnings: Vec<String>,
    warned: HashSet<String>,
    suppressed: usize,
    kernel_image: Arc<str>,
    guest_kernel_image: Arc<str>,
    anon: Resolved,
    guest_user: Resolved,
    unknown: Resolved,
}

impl Symbolizer {
    /// Build a symbolizer and load the host kallsyms. Never fails: a
    /// missing, unreadable, empty or restricted kallsyms becomes a warning
    /// and kernel addresses stay hex.
    pub fn new(opts: SymbolizerOptions) -> Symbolizer {
        let path = opts
            .kallsyms
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc/kallsyms"));
        if let (None, Some(dir)) = (&opts.kallsyms, opts.kernel_cache.clone()) {
            return match crate::kernelcache::KeptKernel::load(&dir, &path) {
                Ok(kept) => Symbolizer::from_kept(opts, kept, &path),
                Err(e) => Symbolizer::with_kernel(opts, Err(e), &path),
            };
        }
        let kernel = Kallsyms::from_path(&path);
        Symbolizer::with_kernel(opts, kernel, &path)
    }

    /// With the kernel's symbols [`crate::kernelcache`] gave for `path`.
    fn from_kept(
        opts: SymbolizerOptions,
        kept: crate::kernelcache::KeptKernel,
        path: &std::path::Path,
    ) -> Symbolizer {
        let mut s = Symbolizer::with_kernel(opts, Ok(kept.table), path);
        s.kernel.live = kept.live;
        s.kernel.unnamed = kept.unnamed;
        s
    }

    /// Like [`Symbolizer::new`] with the kernel's symbols already read from
    /// `path` (a profiler that keeps them between sessions); a reading that
    /// failed, or a restricted or empty one, is warned about as there.
    pub fn with_kernel(
        opts: SymbolizerOptions,
        kernel: Result<Kallsyms, crate::SymbolError>,
        path: &std::path::Path,
    ) -> Symbolizer {
        let mut s = Symbolizer::bare(opts);
        match kernel {
            Ok(k) => {
                if k.is_restricted() {
                    s.warn(format!(
                        "{}: all addresses are zero (kernel.kptr_restrict): kernel symbols stay \
                         unresolved; run as root or set kernel.kptr_restrict=0",
                        path.display()
                    ));
                } else if k.is_empty() {
                    s.warn(format!(
                        "{}: no kernel text symbols: kernel symbols stay unresolved",
                        path.display()
                    ));
                }
                s.kernel = KernelTable::new(k);
            }
            Err(e) => s.warn(format!("{e}: kernel symbols stay unresolved")),
        }
        s
    }

    /// A symbolizer that defers: [`Symbolizer::defer_frame`] numbers
    /// frames instead of naming them, reading nothing (no kallsyms, ELF or
    /// DWARF); the numbered frames come from
    /// [`Symbolizer::take_new_deferred`] and are named later by
    /// [`Symbolizer::resolve_deferred`] of an ordinary symbolizer.
    pub fn deferred(opts: SymbolizerOptions) -> Symbolizer {
        let mut s = Symbolizer::bare(opts);
        s.deferred = Some(DeferredTable::default());
        s
    }

    /// A symbolizer with no kernel symbols (kernel addresses stay hex), for
    /// frames recorded under another kernel; the caller says why.
    pub fn without_kernel(opts: SymbolizerOptions) -> Symbolizer {
        Symbolizer::bare(opts)
    }

    /// True for a symbolizer made by [`Symbolizer::deferred`].
    pub fn is_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// A symbolizer with no kernel symbols and no warnings.
    fn bare(opts: SymbolizerOptions) -> Symbolizer {
        let anon_name: Arc<str> = ANON_IMAGE.into();
        let guest_user: Arc<str> = GUEST_USER.into();
        let unknown: Arc<str> = UNKNOWN_IMAGE.into();
        Symbolizer {
            kernel: KernelTable::new(Kallsyms::default()),
            modules: Vec::new(),
            deferred: None,
            guests: HashMap::new(),
            files: FxMap::default(),
            by_path: FxMap::default(),
            stamps: None,
            cache: FxMap::default(),
            warnings: Vec::new(),
            warned: HashSet::new(),
            suppressed: 0,
            kernel_image: KERNEL_IMAGE.into(),
            guest_kernel_image: GUEST_KERNEL_IMAGE.into(),
            anon: Resolved::named(anon_name.clone(), anon_name),
            guest_user: Resolved::named(guest_user.clone(), guest_user),
            unknown: Resolved::named(unknown.clone(), unknown),
            opts,
        }
    }

    /// Kernel code registered (or, with `unregister`, removed) while
    /// recording: a BPF program (`bpf`: image `[bpf]`, as kallsyms names
    /// them) or other code such as a trampoline (`[kernel.kallsyms]`).
    pub fn kernel_symbol(&mut self, addr: u64, len: u64, name: &str, bpf: bool, unregister: bool) {
        let image: Arc<str> = if bpf {
            "[bpf]".into()
        } else {
            self.kernel_image.clone()
        };
        self.kernel.set_dynamic(addr, len, image, name, unregister);
    }

    /// A kernel module's range from a kernel mmap record (`name` as
    /// reports show it, `[ath9k]`): the image of the addresses in it that
    /// the kernel's symbols cannot name.
    pub fn add_kernel_module(&mut self, start: u64, end: u64, name: Arc<str>) {
        self.modules.push((start, end, name));
        self.modules.sort_by_key(|m| m.0);
    }

    /// The module [`Symbolizer::add_kernel_module`] put at `addr`.
    fn module_at(&self, addr: u64) -> Option<&Arc<str>> {
        let i = self.modules.partition_point(|m| m.0 <= addr);
        (i > 0 && addr < self.modules[i - 1].1).then(|| &self.modules[i - 1].2)
    }

    /// Use `k` for [`ImageRef::GuestKernel`] frames of `domain`.
    pub fn add_guest_kallsyms(&mut self, domain: &str, k: Kallsyms) {
        if k.is_restricted() {
            self.warn(format!(
                "guest kallsyms of domain {domain}: all addresses are zero (kernel.kptr_restrict \
                 in the guest): its kernel symbols stay unresolved"
            ));
        }
        self.guests.insert(domain.to_string(), KernelTable::new(k));
    }

    /// The host kernel symbols in use.
    pub fn kernel(&self) -> &Kallsyms {
        &self.kernel.syms
    }

    /// Resolve one frame of `domain` (the domain matters only for guest
    /// kernel frames).
    pub fn resolve(&mut self, domain: &str, frame: &NormalizedFrame) -> Resolved {
        match &frame.image {
            ImageRef::Kernel => {
                let module = self.module_at(frame.addr).cloned();
                self.resolve_kernel(frame.addr, module.as_ref())
            }
            _ => self.resolve_named(domain, frame),
        }
    }

    /// The number of `frame` of `domain` in a deferring symbolizer
    /// ([`Symbolizer::deferred`]): a host kernel address (other than code
    /// registered while recording, [`Symbolizer::kernel_symbol`]) or a file
    /// offset is left for later; any other frame is named now, which reads
    /// nothing. Panics on a symbolizer that does not defer.
    pub fn defer_frame(&mut self, domain: &str, frame: &NormalizedFrame) -> u32 {
        match &frame.image {
            ImageRef::Kernel => {
                if let Some(r) = self.kernel.dynamic_at(frame.addr, &self.kernel_image, true) {
                    return self.named_frame(r);
                }
                let module = self.module_at(frame.addr).cloned();
                let t = self.deferred.as_mut().expect("a deferring symbolizer");
                let m = match &module {
                    None => 0,
                    Some(m) => {
                        let n = t.modules.len() as u32 + 1;
                        *t.modules.entry(m.clone()).or_insert(n)
                    }
                };
                t.later_frame((0, frame.addr, m), || DeferredFrame::Later {
                    frame: frame.clone(),
                    module,
                })
            }
            ImageRef::File { path, build_id } => {
                let t = self.deferred.as_mut().expect("a deferring symbolizer");
                let ptrs = (
                    Arc::as_ptr(path).cast::<u8>() as usize,
                    build_id
                        .as_ref()
                        .map_or(0, |b| Arc::as_ptr(b).cast::<u8>() as usize),
                );
                let image = if let Some((n, _)) = t.images_by_ptr.get(&ptrs) {
                    *n
                } else {
                    let key: FileKey = (path.clone(), build_id.clone());
                    let next = t.images.len() as u32 + 1;
                    let n = *t.images.entry(key.clone()).or_insert(next);
                    // Every process's mappings bring their own pointers:
                    // under exec churn this would grow without end.
                    if t.images_by_ptr.len() >= IMAGE_PTR_LIMIT {
                        t.images_by_ptr.clear();
                    }
                    t.images_by_ptr.insert(ptrs, (n, key));
                    n
                };
                t.later_frame((image, frame.addr, 0), || DeferredFrame::Later {
                    frame: frame.clone(),
                    module: None,
                })
            }
            _ => {
                let r = self.resolve_named(domain, frame);
                self.named_frame(r)
            }
        }
    }

    /// The number of a frame named now.
    fn named_frame(&mut self, r: Resolved) -> u32 {
        let t = self.deferred.as_mut().expect("a deferring symbolizer");
        let ptrs = (
            Arc::as_ptr(&r.image).cast::<u8>() as usize,
            Arc::as_ptr(&r.symbol).cast::<u8>() as usize,
        );
        let (named, frames) = (&mut t.named, &mut t.frames);
        *named.entry(ptrs).or_insert_with(|| {
            frames.push(DeferredFrame::Named {
                image: r.image,
                symbol: r.symbol,
            });
            frames.len() as u32 - 1
        })
    }

    /// A host kernel address; `module`: the image when the kernel's symbols
    /// do not name it ([`Symbolizer::add_kernel_module`]).
    fn resolve_kernel(&mut self, addr: u64, module: Option<&Arc<str>>) -> Resolved {
        let mut r = self.kernel.resolve(addr, &self.kernel_image, true);
        if let Some(m) = module {
            if r.symbol.starts_with("0x") {
                r.image = m.clone();
            }
        }
        r
    }

    /// The frames numbered since the last call, with their numbers.
    pub fn take_new_deferred(&mut self) -> Vec<(u32, DeferredFrame)> {
        let Some(t) = self.deferred.as_mut() else {
            return Vec::new();
        };
        let from = t.taken;
        t.taken = t.frames.len();
        (from..t.frames.len())
            .map(|i| (i as u32, t.frames[i].clone()))
            .collect()
    }

    /// What a deferred frame stands for, as [`Symbolizer::resolve`] of a
    /// symbolizer that did not defer would have answered when the frame
    /// was recorded (the module it was in then included).
    pub fn resolve_deferred(&mut self, f: &DeferredFrame) -> Resolved {
        match f {
            DeferredFrame::Named { image, symbol } => {
                Resolved::named(image.clone(), symbol.clone())
            }
            DeferredFrame::Later { frame, module } => match &frame.image {
                ImageRef::Kernel => self.resolve_kernel(frame.addr, module.as_ref()),
                _ => self.resolve_named("", frame),
            },
        }
    }

    /// [`Symbolizer::resolve`] of every frame but host kernel ones.
    fn resolve_named(&mut self, domain: &str, frame: &NormalizedFrame) -> Resolved {
        match &frame.image {
            ImageRef::Anon => self.anon.clone(),
            ImageRef::GuestUser => self.guest_user.clone(),
            ImageRef::Unknown => self.unknown.clone(),
            ImageRef::Kernel => self.resolve_kernel(frame.addr, None),
            ImageRef::GuestKernel => {
                if let Some(t) = self.guests.get_mut(domain) {
                    return t.resolve(frame.addr, &self.guest_kernel_image, false);
                }
                self.warn(format!(
                    "no guest kallsyms for domain {domain}: its kernel addresses stay hex \
                     (give --guest-kallsyms {domain}=PATH or run the agent)"
                ));
                let mut t = KernelTable::new(Kallsyms::default());
                let r = t.resolve(frame.addr, &self.guest_kernel_image, false);
                self.guests.insert(domain.to_string(), t);
                r
            }
            ImageRef::File { path, build_id } => {
                if let Some(r) = self.cache.get(frame) {
                    return r.clone();
                }
                let file = self.file(path, build_id);
                let symbol = file
                    .as_ref()
                    .and_then(|f| f.symbols.lookup_file_offset_shared(frame.addr).cloned());
                let mut r =
                    Resolved::named(path.clone(), symbol.unwrap_or_else(|| hex(frame.addr)));
                if let Some(f) = &file {
                    if let (Some(d), Some(vaddr)) =
                        (&f.dwarf, f.symbols.file_offset_to_vaddr(frame.addr))
                    {
                        let (info, warning) =
                            d.lock().map(|mut d| d.lookup(vaddr)).unwrap_or_default();
                        if let Some(w) = warning {
                            self.warn(w);
                        }
                        if let Some(line) = info.srcline {
                            r.srcline = line;
                        }
                        if !info.inlined.is_empty() {
                            let names: Vec<Arc<str>> = info
                                .inlined
                                .iter()
                                .map(|n| Arc::from(format!("{n}{INLINED_SUFFIX}")))
                                .collect();
                            r.inlined = Some(names.into());
                        }
                    }
                }
                if self.cache.len() >= CACHE_LIMIT {
                    self.cache.clear();
                }
                self.cache.insert(frame.clone(), r.clone());
                r
            }
        }
    }

    /// Problems met so far, each once, in order.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = self.warnings.clone();
        if self.suppressed > 0 {
            w.push(format!("... and {} more symbol warnings", self.suppressed));
        }
        w
    }

    /// (path, hex build-id) of every file loaded so far that has one: the
    /// recorded build-id where the stream gave it, else the file's own.
    pub fn build_ids(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .files
            .iter()
            .filter_map(|((path, recorded), f)| {
                let id = recorded
                    .as_deref()
                    .or_else(|| f.as_ref().and_then(|f| f.symbols.build_id()))?;
                Some((path.to_string(), hex_bytes(id)))
            })
            .collect();
        v.sort();
        v.dedup_by(|a, b| a.0 == b.0);
        v
    }

    /// Number of DWARF files opened so far (the line cache answers the
    /// addresses it knows without opening one).
    pub fn dwarf_files_opened(&self) -> usize {
        self.files
            .values()
            .flatten()
            .filter_map(|f| f.dwarf.as_ref())
            .filter(|d| d.lock().is_ok_and(|d| d.file.is_some()))
            .count()
    }

    /// Write the answers DWARF gave this run to the line cache (also done
    /// when the symbolizer is dropped). A failure is also a warning.
    pub fn save_line_cache(&mut self) -> std::io::Result<()> {
        let mut first = Ok(());
        for d in self
            .files
            .values()
            .flatten()
            .filter_map(|f| f.dwarf.as_ref())
        {
            if let Ok(mut d) = d.lock() {
                if let Some(l) = &mut d.lines {
                    if let Err(e) = l.save() {
                        if first.is_ok() {
                            first = Err(e);
                        }
                    }
                }
            }
        }
        if let Err(e) = &first {
            self.warn(format!(
                "line cache: {e}: the next run loads the same DWARF again"
            ));
        }
        let _ = self.kernel.unnamed.save();
        first
    }

    /// Number of cached resolutions (files and kernels).
    pub fn cached(&self) -> usize {
        self.cache.len()
            + self.kernel.cache.len()
            + self.guests.values().map(|g| g.cache.len()).sum::<usize>()
    }

    fn warn(&mut self, msg: String) {
        if self.warned.contains(&msg) {
            return;
        }
        if self.warnings.len() >= WARNING_LIMIT {
            self.suppressed += 1;
        } else {
            self.warnings.push(msg.clone());
        }
        self.warned.insert(msg);
    }

    /// The symbols (and DWARF) of a mapped file, loaded once per (path, build-id).
    fn file(&mut self, path: &Arc<str>, build_id: &Option<Arc<[u8]>>) -> Option<LoadedFile> {
        let key: FileKey = (path.clone(), build_id.clone());
        if let Some(f) = self.files.get(&key) {
            return f.clone();
        }
        // A mapping recorded without its build-id (read from
        // /proc/PID/maps when recording began) and one recorded with it
        // name the same file: loaded once for both, by the build-id read
        // from the file. Two loads of this binary and of libc had each
        // parsed the symbol tables, line cache and DWARF twice: a first
        // report of the demo took 0.30-0.45 s of CPU, 0.20-0.23 s after.
        if build_id.is_none() && path.starts_with('/') {
            if let Some(k) = self.by_path.get(path) {
                if let Some(f) = self.files.get(k) {
                    return f.clone();
                }
            }
            let on_disk = path.strip_suffix(" (deleted)").unwrap_or(path);
            let id = ElfSymbols::read_build_id(&self.under_symfs(Path::new(on_disk)))
                .map(Arc::<[u8]>::from)
                // Gone from the disk: the table loaded from it before, for
                // a mapping with its build-id, still names it.
                .or_else(|| {
                    self.files
                        .iter()
                        .find(|((p, id), f)| p == path && id.is_some() && f.is_some())
                        .and_then(|((_, id), _)| id.clone())
                });
            if let Some(id) = id {
                let k: FileKey = (path.clone(), Some(id));
                self.by_path.insert(path.clone(), k.clone());
                return self.file(path, &k.1);
            }
        }
        let mut dwarf_path = None;
        let mut stamps = self.stamps.is_some().then(Stamps::new);
        let loaded = self
            .load_file(path, build_id.as_deref(), &mut dwarf_path, stamps.as_mut())
            .map(|symbols| {
                let id = build_id.as_deref().or_else(|| symbols.build_id());
                let dwarf = dwarf_path.map(|p| {
                    let lines = match (&self.opts.line_cache, id) {
                        (Some(dir), Some(id)) => Some(FileLines::load(dir, id, &p)),
                        _ => None,
                    };
                    Arc::new(Mutex::new(FileDwarf {
                        path: p,
                        file: None,
                        failed: false,
                        lines,
                    }))
                });
                LoadedFile {
                    symbols: Arc::new(symbols),
                    dwarf,
                }
            });
        if let (Some(all), Some(st), true) = (&mut self.stamps, stamps, loaded.is_some()) {
            all.insert(key.clone(), st);
        }
        self.files.insert(key, loaded.clone());
        loaded
    }

    /// From now on, stamp each file loaded, so that [`Symbolizer::take_files`]
    /// can hand it on (files loaded before are not handed on).
    pub fn keeping_files(mut self) -> Symbolizer {
        self.stamps.get_or_insert_with(FxMap::default);
        self
    }

    /// Takes the files this symbolizer loaded since
    /// [`Symbolizer::keeping_files`] (up to [`MAX_KEPT_FILES`])
    /// for a later symbolizer's [`Symbolizer::reuse_files`]; files that
    /// could not be loaded are not kept. Opened DWARF stays open with its
    /// file (closing it cost the guest agent more than the symbol tables
    /// it keeps: its own binary's line tables, opened again at every
    /// session's first samples), so what is kept holds those debug
    /// sections too. This symbolizer loads the files again if it meets
    /// them again.
    pub fn take_files(&mut self) -> KeptFiles {
        let mut files = Vec::new();
        if let Some(all) = &mut self.stamps {
            self.cache.clear();
            self.by_path.clear();
            for (key, loaded) in self.files.drain() {
                let (Some(loaded), Some(stamps)) = (loaded, all.remove(&key)) else {
                    continue;
                };
                if files.len() < MAX_KEPT_FILES {
                    files.push((key, stamps, loaded));
                }
            }
        }
        KeptFiles {
            opts: Some(self.opts.clone()),
            files,
        }
    }

    /// Adopts the files of `kept` whose paths on disk are as they were when
    /// they were read (device, inode, size, times; a debug file candidate
    /// still absent or still the same), if `kept` was loaded under the same
    /// options; the others are dropped and load again when met. Files are
    /// checked here only: one that changes later in this symbolizer's life
    /// is not seen (as with a file it loaded itself). Returns how many were
    /// adopted and how many dropped. Warnings given when a file was loaded
    /// are not repeated.
    pub fn reuse_files(&mut self, kept: KeptFiles) -> (usize, usize) {
        let Some(all) = self
            .stamps
            .as_mut()
            .filter(|_| kept.opts.as_ref() == Some(&self.opts))
        else {
            return (0, kept.files.len());
        };
        let (mut adopted, mut dropped) = (0, 0);
        for (key, stamps, loaded) in kept.files {
            let same = stamps.iter().all(|(p, s)| stamp(p) == *s);
            if same && !self.files.contains_key(&key) {
                all.insert(key.clone(), stamps);
                self.files.insert(key, Some(loaded));
                adopted += 1;
            } else {
                dropped += 1;
            }
        }
        (adopted, dropped)
    }

    /// `path` under the symfs prefix, if one is set.
    fn under_symfs(&self, path: &Path) -> PathBuf {
        match &self.opts.symfs {
            Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_path_buf(),
        }
    }

    /// `dwarf` is set to the file (the binary or its debug file) whose
    /// DWARF gives inline frames and source lines, where one has it.
    /// `stamps`, when given, gets every path on disk the result depends on
    /// (the binary and each debug file candidate, present or not), each
    /// stamped before it is read ([`KeptFiles`]).
    fn load_file(
        &mut self,
        path: &str,
        want_id: Option<&[u8]>,
        dwarf: &mut Option<PathBuf>,
        mut stamps: Option<&mut Stamps>,
    ) -> Option<ElfSymbols> {
        // The vDSO: this kernel's image, unless the recording's build-id
        // says it came from another kernel, or a symfs confines lookups.
        if path == "[vdso]" && self.opts.symfs.is_none() {
            let e = crate::vdso::own_vdso().and_then(|img| ElfSymbols::parse(&img).ok())?;
            return match (want_id, e.build_id()) {
                (Some(want), Some(have)) if want != have => None,
                _ => Some(e),
            };
        }
        // Other pseudo files ([vsyscall], [uprobes]) have no file to read.
        if path.starts_with('[') {
            return None;
        }
        let on_disk = path.strip_suffix(" (deleted)").unwrap_or(path);
        if !on_disk.starts_with('/') {
            self.warn(format!(
                "{path}: not an absolute path: its symbols stay unresolved"
            ));
            return None;
        }
        let real = self.under_symfs(Path::new(on_disk));
        if let Some(st) = stamps.as_mut() {
            st.push((real.clone(), stamp(&real)));
        }
        let runtime = match ElfSymbols::open(&real) {
            Ok(e) => Some(e),
            Err(e) => {
                self.warn(e.to_string());
                None
            }
        };
        let mismatch = match (&runtime, want_id) {
            (Some(r), Some(want)) => r.build_id().is_some_and(|have| have != want),
            _ => false,
        };
        if mismatch {
            self.warn(format!(
                "{}: build-id {} differs from the recorded {}: looking for a debug file",
                real.display(),
                hex_bytes(
                    runtime
                        .as_ref()
                        .and_then(|r| r.build_id())
                        .unwrap_or_default()
                ),
                hex_bytes(want_id.unwrap_or_default()),
            ));
        }
        let runtime = runtime.filter(|_| !mismatch);
        if runtime.as_ref().is_some_and(ElfSymbols::has_dwarf) {
            *dwarf = Some(real.clone());
        }
        if runtime.as_ref().is_some_and(ElfSymbols::has_symtab) && dwarf.is_some() {
            return runtime;
        }
        let id = want_id.or_else(|| runtime.as_ref().and_then(ElfSymbols::build_id));
        let link = runtime.as_ref().and_then(ElfSymbols::debuglink);
        let candidates = self.debug_file_candidates(Path::new(on_disk), id, link);
        if let Some(st) = stamps {
            st.extend(candidates.iter().map(|c| (c.clone(), stamp(c))));
        }
        let debug = self.find_debug_file(Path::new(on_disk), id, candidates);
        if runtime.as_ref().is_some_and(ElfSymbols::has_symtab) {
            // Symbols from the binary itself (as perf takes them); its
            // debug file, if any, only for DWARF.
            if let Some((p, d)) = debug {
                if d.has_dwarf() {
                    *dwarf = Some(p);
                }
            }
            return runtime;
        }
        if let Some((debug_path, debug)) = debug {
            if debug.has_dwarf() {
                *dwarf = Some(debug_path);
            }
            Some(match &runtime {
                Some(r) => debug.with_segments_of(r),
                None => debug,
            })
        } else {
            if runtime.as_ref().is_some_and(ElfSymbols::is_empty) {
                self.warn(format!(
                    "{}: no symbols and no debug file found: its addresses stay hex",
                    real.display()
                ));
            }
            runtime
        }
    }

    /// Candidate debug files, in order: `<debug>/.build-id/ab/cdef….debug`
    /// for each debug dir, then the debuglink name in the file's directory,
    /// its `.debug` subdirectory, and `<debug><dir>/` for each debug dir.
    pub fn debug_file_candidates(
        &self,
        path: &Path,
        build_id: Option<&[u8]>,
        debuglink: Option<&str>,
    ) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Some(id) = build_id.filter(|id| id.len() >= 2) {
            for d in &self.opts.debug_dirs {
                out.push(
                    self.under_symfs(
                        &d.join(".build-id")
                            .join(hex_bytes(&id[..1]))
                            .join(format!("{}.debug", hex_bytes(&id[1..]))),
                    ),
                );
            }
        }
        if let Some(link) = debuglink.filter(|l| !l.is_empty() && !l.contains('/')) {
            let dir = path.parent().unwrap_or(Path::new("/"));
            out.push(self.under_symfs(&dir.join(link)));
            out.push(self.under_symfs(&dir.join(".debug").join(link)));
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            for d in &self.opts.debug_dirs {
                out.push(self.under_symfs(&d.join(rel).join(link)));
            }
        }
        out
    }

    /// The first of `candidates` ([`Symbolizer::debug_file_candidates`])
    /// that is a debug file of `path` with symbols.
    fn find_debug_file(
        &mut self,
        path: &Path,
        build_id: Option<&[u8]>,
        candidates: Vec<PathBuf>,
    ) -> Option<(PathBuf, ElfSymbols)> {
        let own = self.under_symfs(path);
        for cand in candidates {
            // `<dir>/<link>` can name the stripped file itself.
            if cand == own || !cand.is_file() {
                continue;
            }
            match ElfSymbols::open(&cand) {
                Ok(d) if d.has_symtab() => {
                    let id_ok = match (build_id, d.build_id()) {
                        (Some(want), Some(have)) => want == have,
                        _ => true,
                    };
                    if id_ok {
                        return Some((cand, d));
                    }
                    self.warn(format!(
                        "{}: build-id does not match {}: ignored",
                        cand.display(),
                        path.display()
                    ));
                }
                Ok(_) => {}
                Err(e) => self.warn(e.to_string()),
            }
        }
        None
    }
}

fn hex_bytes(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn line_cache_marker() -> u64 {
        std::hint::black_box(7)
    }

    use vmscope_testkit::own_file_offset;

    #[test]
    fn the_line_cache_answers_a_later_symbolizer_without_opening_dwarf() {
        assert_eq!(line_cache_marker(), 7);
        let exe = std::env::current_exe().unwrap();
        let elf = ElfSymbols::open(&exe).unwrap();
        if !elf.has_dwarf() || elf.build_id().is_none() {
            eprintln!("SKIP: this test binary has no DWARF or no build-id");
            return;
        }
        let offset =
            own_file_offset(line_cache_marker as *const () as usize as u64).expect("mapped");
        let frame = NormalizedFrame {
            image: ImageRef::File {
                path: exe.to_str().unwrap().into(),
                build_id: None,
            },
            addr: offset,
        };
        let kdir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let opts = |line_cache: Option<PathBuf>| SymbolizerOptions {
            line_cache,
            ..opts_with_kallsyms("", kdir.path())
        };
        let mut a = Symbolizer::new(opts(Some(cache.path().into())));
        let ra = a.resolve("host", &frame);
        assert!(ra.symbol.ends_with("line_cache_marker"), "{ra:?}");
        assert!(ra.srcline.contains("symbolizer.rs:"), "{ra:?}");
        assert_eq!(a.dwarf_files_opened(), 1);
        a.save_line_cache().unwrap();
        drop(a);
        // A later run: the same answer, and no DWARF loaded for it.
        let mut b = Symbolizer::new(opts(Some(cache.path().into())));
        assert_eq!(b.resolve("host", &frame), ra);
        assert_eq!(b.dwarf_files_opened(), 0);
        // An address the cache does not know opens the DWARF after all.
        let other = NormalizedFrame {
            addr: own_file_offset(opts_with_kallsyms as *const () as usize as u64).unwrap(),
            ..frame.clone()
        };
        let ro = b.resolve("host", &other);
        assert!(ro.srcline.contains("symbolizer.rs:"), "{ro:?}");
        assert_eq!(b.dwarf_files_opened(), 1);
        // Without the cache every run loads the DWARF, with the same answer.
        let mut c = Symbolizer::new(opts(None));
        assert_eq!(c.resolve("host", &frame), ra);
        assert_eq!(c.dwarf_files_opened(), 1);
    }

    /// A file met through a mapping without its build-id (as read from
    /// /proc/PID/maps) and through one with it is loaded once.
    #[test]
    fn a_file_met_with_and_without_its_build_id_is_loaded_once() {
        let exe = std::env::current_exe().unwrap();
        let elf = ElfSymbols::open(&exe).unwrap();
        let (true, Some(id)) = (elf.has_dwarf(), elf.build_id()) else {
            eprintln!("SKIP: this test binary has no DWARF or no build-id");
            return;
        };
        let path: Arc<str> = exe.to_str().unwrap().into();
        let at = |build_id: Option<Arc<[u8]>>, f: u64| NormalizedFrame {
            image: ImageRef::File {
                path: path.clone(),
                build_id,
            },
            addr: own_file_offset(f).expect("mapped"),
        };
        let kdir = tempfile::tempdir().unwrap();
        let mut s = Symbolizer::new(opts_with_kallsyms("", kdir.path()));
        let a = s.resolve(
            "host",
            &at(None, line_cache_marker as *const () as usize as u64),
        );
        let b = s.resolve(
            "host",
            &at(
                Some(Arc::from(id)),
                opts_with_kallsyms as *const () as usize as u64,
            ),
        );
        assert!(a.symbol.ends_with("line_cache_marker"), "{a:?}");
        assert!(b.symbol.ends_with("opts_with_kallsyms"), "{b:?}");
        assert_eq!(s.dwarf_files_opened(), 1);
        assert_eq!(s.build_ids(), vec![(path.to_string(), hex_bytes(id))]);
    }

    fn opts_with_kallsyms(text: &str, dir: &Path) -> SymbolizerOptions {
        let p = dir.join("kallsyms");
        std::fs::write(&p, text).unwrap();
        SymbolizerOptions {
            kallsyms: Some(p),
            symfs: None,
            debug_dirs: vec![],
            line_cache: None,
            kernel_cache: None,
        }
    }

    fn frame(image: ImageRef, addr: u64) -> NormalizedFrame {
        NormalizedFrame { image, addr }
    }

    /// A kept kernel table answers what the text would; code it leaves out
    /// (a BPF program) is found by reading the text again, once.
    #[test]
    fn a_kept_kernel_table_falls_back_to_the_text_for_what_it_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let text = "ffffffff81000000 T _text\nffffffff81000100 T schedule\n\
                    ffffffffc0100000 t bpf_prog_1234_egress\t[bpf]\n";
        let opts = opts_with_kallsyms(text, dir.path());
        let ks = opts.kallsyms.clone().unwrap();
        let cache = dir.path().join("kernel");
        let first = crate::kernelcache::KeptKernel::load(&cache, &ks).unwrap();
        if first.live.is_some() || !cache.exists() {
            eprintln!("SKIP: no boot id here, nothing kept");
            return;
        }
        let kept = crate::kernelcache::KeptKernel::load(&cache, &ks).unwrap();
        assert!(kept.live.is_some(), "the second load reads the kept table");
        let mut s = Symbolizer::from_kept(opts, kept, &ks);
        let r = s.resolve("host", &frame(ImageRef::Kernel, 0xffffffff81000123));
        assert_eq!((&*r.image, &*r.symbol), ("[kernel.kallsyms]", "schedule"));
        assert!(s.kernel.live.is_some(), "the kept table answered alone");
        let r = s.resolve("host", &frame(ImageRef::Kernel, 0xffffffffc0100010));
        assert_eq!((&*r.image, &*r.symbol), ("[bpf]", "bpf_prog_1234_egress"));
        assert!(s.kernel.live.is_none(), "read once");
        let r = s.resolve("host", &frame(ImageRef::Kernel, 0xffffffff81000123));
        assert_eq!(&*r.symbol, "schedule");
        // Code the file names nowhere is remembered as such (where the
        // loaded BPF programs can be listed: the key needs them), so the
        // next reader does not read the file again for it.
        let nowhere = 0xffffffffd0000000u64;
        let r = s.resolve("host", &frame(ImageRef::Kernel, nowhere));
        assert_eq!(&*r.symbol, "0xffffffffd0000000");
        if crate::kernelcache::bpf_stamp().is_none() {
            eprintln!("SKIP: BPF programs cannot be listed here");
            return;
        }
        assert!(s.kernel.unnamed.contains(nowhere));
        s.save_line_cache().unwrap();
        let kept = crate::kernelcache::KeptKernel::load(&cache, &ks).unwrap();
        assert!(kept.unnamed.contains(nowhere));
        let opts = opts_with_kallsyms(text, dir.path());
        let mut s = Symbolizer::from_kept(opts, kept, &ks);
        let r = s.resolve("host", &frame(ImageRef::Kernel, nowhere));
        assert_eq!(&*r.symbol, "0xffffffffd0000000");
        assert!(s.kernel.live.is_some(), "not read again for it");
    }

    #[test]
    fn buckets_and_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Symbolizer::new(opts_with_kallsyms(
            "ffffffff81000000 T _text\nffffffff81000100 T schedule\n\
             ffffffffc0000000 t kvm_exit\t[kvm_intel]\n",
            dir.path(),
        ));
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
        let r = s.resolve("host", &frame(ImageRef::Kernel, 0xffffffff81000123));
        assert_eq!((&*r.image, &*r.symbol), ("[kernel.kallsyms]", "schedule"));
        let r = s.resolve("host", &frame(ImageRef::Kernel, 0xffffffffc0000010));
        assert_eq!((&*r.image, &*r.symbol), ("[kvm_intel]", "kvm_exit"));
        let r = s.resolve("host", &frame(ImageRef::Kernel, 0x10));
        assert_eq!((&*r.image, &*r.symbol), ("[kernel.kallsyms]", "0x10"));
        for (img, name) in [
            (ImageRef::Anon, "[anon]"),
            (ImageRef::GuestUser, "[guest.user]"),
            (ImageRef::Unknown, "[unknown]"),
        ] {
            let r = s.resolve("vm1", &frame(img, 0x1234));
            assert_eq!((&*r.image, &*r.symbol), (name, name));
        }
        // Repeated hits share the name allocation.
        let a = s.resolve("host", &frame(ImageRef::Kernel, 0xffffffff81000123));
        let b = s.resolve("host", &frame(ImageRef::Kernel, 0xffffffff81000124));
        assert!(Arc::ptr_eq(&a.symbol, &b.symbol));
    }

    #[test]
    fn code_registered_while_recording_is_named_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Symbolizer::new(opts_with_kallsyms(
            "ffffffff81000000 T _text\nffffffff81000100 T schedule\n\
             ffffffffc0000000 t kvm_exit\t[kvm_intel]\n",
            dir.path(),
        ));
        let at = |s: &mut Symbolizer, addr| {
            let r = s.resolve("host", &frame(ImageRef::Kernel, addr));
            (r.image.to_string(), r.symbol.to_string())
        };
        let pair = |i: &str, n: &str| (i.to_string(), n.to_string());
        // Before: the table has nothing there (a page past the module's last
        // symbol).
        assert_eq!(
            at(&mut s, 0xffffffffc0001010),
            pair("[kernel.kallsyms]", "0xffffffffc0001010")
        );
        s.kernel_symbol(0xffffffffc0001000, 0x100, "bpf_prog_aa_tick", true, false);
        s.kernel_symbol(
            0xffffffffc0002000,
            0x40,
            "bpf_trampoline_6442",
            false,
            false,
        );
        assert_eq!(
            at(&mut s, 0xffffffffc0001010),
            pair("[bpf]", "bpf_prog_aa_tick")
        );
        assert_eq!(
            at(&mut s, 0xffffffffc00010ff),
            pair("[bpf]", "bpf_prog_aa_tick")
        );
        assert_eq!(
            at(&mut s, 0xffffffffc0002000),
            pair("[kernel.kallsyms]", "bpf_trampoline_6442")
        );
        // Past its end: the table again (nothing there), and the kernel's.
        assert_eq!(
            at(&mut s, 0xffffffffc0001100),
            pair("[kernel.kallsyms]", "0xffffffffc0001100")
        );
        assert_eq!(
            at(&mut s, 0xffffffff81000123),
            pair("[kernel.kallsyms]", "schedule")
        );
        // Removed, then another loaded over part of its range.
        s.kernel_symbol(0xffffffffc0001000, 0x100, "bpf_prog_aa_tick", true, true);
        assert_eq!(
            at(&mut s, 0xffffffffc0001010),
            pair("[kernel.kallsyms]", "0xffffffffc0001010")
        );
        s.kernel_symbol(0xffffffffc0000f80, 0x100, "bpf_prog_bb_next", true, false);
        assert_eq!(
            at(&mut s, 0xffffffffc0001010),
            pair("[bpf]", "bpf_prog_bb_next")
        );
        // A new registration replaces what it overlaps.
        s.kernel_symbol(0xffffffffc0000f00, 0x1200, "bpf_prog_cc_big", true, false);
        assert_eq!(
            at(&mut s, 0xffffffffc0001010),
            pair("[bpf]", "bpf_prog_cc_big")
        );
        assert_eq!(
            at(&mut s, 0xffffffffc0002000),
            pair("[bpf]", "bpf_prog_cc_big")
        );
    }

    #[test]
    fn guest_kernel_per_domain() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Symbolizer::new(opts_with_kallsyms("", dir.path()));
        s.add_guest_kallsyms(
            "vm1",
            Kallsyms::parse("ffffffff81000000 T guest_fn\nffffffffc0000000 t m_fn [virtio_net]\n")
                .unwrap(),
        );
        let r = s.resolve("vm1", &frame(ImageRef::GuestKernel, 0xffffffff81000010));
        assert_eq!(
            (&*r.image, &*r.symbol),
            ("[guest.kernel.kallsyms]", "guest_fn")
        );
        let r = s.resolve("vm1", &frame(ImageRef::GuestKernel, 0xffffffffc0000010));
        assert_eq!((&*r.image, &*r.symbol), ("[guest.kernel.kallsyms]", "m_fn"));
        let r = s.resolve("vm2", &frame(ImageRef::GuestKernel, 0xffffffff81000010));
        assert_eq!(
            (&*r.image, &*r.symbol),
            ("[guest.kernel.kallsyms]", "0xffffffff81000010")
        );
        let w = s.warnings();
        assert!(w.iter().any(|w| w.contains("vm2")), "{w:?}");
        assert!(
            w.iter().any(|w| w.contains("no kernel text symbols")),
            "{w:?}"
        );
    }

    #[test]
    fn missing_and_restricted_kallsyms_are_warnings() {
        let s = Symbolizer::new(SymbolizerOptions {
            kallsyms: Some("/nonexistent/kallsyms".into()),
            ..SymbolizerOptions::default()
        });
        assert!(s.warnings()[0].contains("/nonexistent/kallsyms"));
        let dir = tempfile::tempdir().unwrap();
        let s = Symbolizer::new(opts_with_kallsyms(
            "0000000000000000 T _text\n0000000000000000 T schedule\n",
            dir.path(),
        ));
        assert!(
            s.warnings()[0].contains("kptr_restrict"),
            "{:?}",
            s.warnings()
        );
    }

    #[test]
    fn unreadable_file_gives_hex_offset_and_one_warning() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Symbolizer::new(opts_with_kallsyms("", dir.path()));
        let img = ImageRef::File {
            path: "/nonexistent/bin/x".into(),
            build_id: None,
        };
        for addr in [0x1234, 0x1235] {
            let r = s.resolve("host", &frame(img.clone(), addr));
            assert_eq!(&*r.image, "/nonexistent/bin/x");
            assert_eq!(&*r.symbol, format!("0x{addr:x}"));
        }
        let w = s.warnings();
        assert_eq!(
            w.iter()
                .filter(|w| w.contains("/nonexistent/bin/x"))
                .count(),
            1
        );
        let r = s.resolve(
            "host",
            &frame(
                ImageRef::File {
                    path: "[vdso]".into(),
                    build_id: None,
                },
                0x10,
            ),
        );
        assert_eq!((&*r.image, &*r.symbol), ("[vdso]", "0x10"));
    }

    #[test]
    fn symbolizer_can_move_to_another_thread() {
        fn send<T: Send + Sync>() {}
        send::<Symbolizer>();
    }

    #[test]
    fn fx_hasher_spreads() {
        let mut seen = HashSet::new();
        for i in 0..1000u64 {
            let mut h = FxHasher::default();
            h.write_u64(i);
            seen.insert(h.finish());
        }
        assert_eq!(seen.len(), 1000);
    }
}
