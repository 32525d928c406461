//! The host kernel's text symbols kept on disk for the boot they belong to,
//! so that a later first report of a recording of this boot reads no
//! `/proc/kallsyms`.
//!
//! Why: a profile of a first report on a 10 s demo recording (this 2-CPU
//! host, 121 000 kallsyms lines) put 21 to 35 % of its CPU in reading
//! `/proc/kallsyms`: the kernel formats every line anew on each read
//! (`kallsyms_expand_symbol`, `vsnprintf`), then the text is parsed and
//! sorted. `perf record` keeps a copy for `perf report` in its build-id
//! cache in the same way.
//!
//! What is kept, and when it is right: the table [`Kallsyms::parse`] makes
//! of this boot's `/proc/kallsyms`, keyed by the boot id and a hash of
//! `/proc/modules` (names, sizes and load addresses): the kernel proper
//! cannot move within a boot, and a module loaded, unloaded or reloaded
//! elsewhere changes the key. Code that comes and goes without a module
//! (BPF programs, ftrace and kprobe trampolines: kallsyms' `[bpf]` and
//! `[__builtin__…]` entries) is left out of the kept table; an address the
//! kept table cannot name is looked up in `/proc/kallsyms` itself
//! ([`KeptKernel::live`]), so answers are those of reading it every time.
//!
//! A restricted reading (`kernel.kptr_restrict`: every address zero) is
//! never kept. Kernel addresses defeat KASLR, so the files are written
//! `0600` in a `0700` directory: `/var/cache/vmscope/kernel` for root,
//! `~/.cache/vmscope/kernel` otherwise; the line cache's
//! `VMSCOPE_LINE_CACHE` moves (into its directory) or turns off both
//! ([`default_dir`]). Files are replaced by rename; those of other boots
//! are removed when a new one is written.

use crate::kallsyms::Kallsyms;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"VMSKALL1";

/// The kernel cache directory: beside the default line cache
/// ([`crate::linecache::default_dir`]: `/var/cache/vmscope/kernel` for
/// root), inside the one `VMSCOPE_LINE_CACHE` names, off when it is off.
pub fn default_dir() -> Option<PathBuf> {
    let lines = crate::linecache::default_dir()?;
    if std::env::var_os("VMSCOPE_LINE_CACHE").is_some() {
        return Some(lines.join("kernel"));
    }
    Some(lines.with_file_name("kernel"))
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), empty when unreadable.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The key of this boot's kernel text: the boot id and a hash of the loaded
/// modules (an absent `/proc/modules`, a kernel without modules, hashes as
/// empty).
fn key() -> Option<String> {
    let boot = boot_id();
    if boot.is_empty() || !boot.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return None;
    }
    let modules = std::fs::read("/proc/modules").unwrap_or_default();
    Some(format!("{boot}-{:016x}", crate::linecache::fnv1a(&modules)))
}

/// Module names whose code is not a module's (kallsyms brackets them too).
fn is_transient(module: &str) -> bool {
    module == "bpf" || module.starts_with("__builtin__")
}

/// The host kernel's symbols as [`KeptKernel::load`] found them.
pub struct KeptKernel {
    /// The table: kept or just read.
    pub table: Kallsyms,
    /// The table came from the cache: an address it cannot name is looked
    /// up in `/proc/kallsyms` (`Some(path)`) before it is called unknown.
    pub live: Option<PathBuf>,
    /// Addresses `/proc/kallsyms` itself did not name.
    pub unnamed: Unnamed,
}

/// Kernel addresses that `/proc/kallsyms` did not name (code outside every
/// symbol: JIT or trampoline code the kernel lists nowhere), so that the
/// next report does not read it again for them. Kept per boot, loaded
/// modules and set of loaded BPF programs ([`bpf_stamp`]: program ids are
/// never reused, so a program loaded since changes the key); a trampoline
/// made since at such an address is the case this cannot see.
#[derive(Default)]
pub struct Unnamed {
    path: Option<PathBuf>,
    set: std::collections::HashSet<u64>,
    added: bool,
}

/// At most this many unnamed addresses are kept.
const MAX_UNNAMED: usize = 65_536;

impl Unnamed {
    fn load(path: PathBuf) -> Unnamed {
        let set = std::fs::read_to_string(&path)
            .map(|t| {
                t.lines()
                    .filter_map(|l| u64::from_str_radix(l, 16).ok())
                    .take(MAX_UNNAMED)
                    .collect()
            })
            .unwrap_or_default();
        Unnamed {
            path: Some(path),
            set,
            added: false,
        }
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.set.contains(&addr)
    }

    /// `/proc/kallsyms` did not name `addr`.
    pub fn insert(&mut self, addr: u64) {
        if self.path.is_some() && self.set.len() < MAX_UNNAMED && self.set.insert(addr) {
            self.added = true;
        }
    }

    /// Write the set when it grew.
    pub fn save(&mut self) -> std::io::Result<()> {
        let (Some(path), true) = (&self.path, self.added) else {
            return Ok(());
        };
        let mut text = String::with_capacity(self.set.len() * 17);
        let mut all: Vec<&u64> = self.set.iter().collect();
        all.sort_unstable();
        for a in all {
            text.push_str(&format!("{a:x}\n"));
        }
        write_private(path, text.as_bytes())?;
        self.added = false;
        Ok(())
    }
}

/// A hash of the ids of the loaded BPF programs (`BPF_PROG_GET_NEXT_ID`),
/// `None` when they cannot be listed here (no privilege).
pub fn bpf_stamp() -> Option<u64> {
    /// `BPF_PROG_GET_NEXT_ID` of `enum bpf_cmd`.
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    #[repr(C)]
    #[derive(Default)]
    struct NextId {
        start_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut ids = Vec::new();
    let mut attr = NextId::default();
    loop {
        // SAFETY: `attr` is a valid, initialized `bpf_attr` prefix for this
        // command, and its size is passed; the kernel writes `next_id` only.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_NEXT_ID,
                std::ptr::from_mut(&mut attr),
                std::mem::size_of::<NextId>(),
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return (e.raw_os_error() == Some(libc::ENOENT)).then(|| {
                let bytes: Vec<u8> = ids.iter().flat_map(|i: &u32| i.to_le_bytes()).collect();
                crate::linecache::fnv1a(&bytes)
            });
        }
        ids.push(attr.next_id);
        attr.start_id = attr.next_id;
        if ids.len() > 1 << 20 {
            return None;
        }
    }
}

impl KeptKernel {
    /// This boot's kernel symbols from `dir`, else read from `kallsyms` (the
    /// host's `/proc/kallsyms`) and kept there for the next reader.
    pub fn load(dir: &Path, kallsyms: &Path) -> Result<KeptKernel, crate::SymbolError> {
        let key = key();
        let unnamed = |k: &str| match bpf_stamp() {
            Some(b) => Unnamed::load(dir.join(format!("kallsyms-{k}.unnamed-{b:016x}"))),
            None => Unnamed::default(),
        };
        if let Some(k) = &key {
            let path = dir.join(format!("kallsyms-{k}"));
            if let Some(table) = std::fs::read(&path).ok().and_then(|b| decode(&b)) {
                return Ok(KeptKernel {
                    table,
                    live: Some(kallsyms.to_path_buf()),
                    unnamed: unnamed(k),
                });
            }
        }
        let table = Kallsyms::from_path(kallsyms)?;
        let mut kept_unnamed = Unnamed::default();
        if let Some(k) = key {
            if !table.is_restricted() && !table.is_empty() && save(dir, &k, &table).is_ok() {
                kept_unnamed = unnamed(&k);
            }
        }
        Ok(KeptKernel {
            table,
            live: None,
            unnamed: kept_unnamed,
        })
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

/// The kept form of `table` without its transient entries: magic, a hash
/// of the rest, then modules, the names, and the symbols
/// ([`Kallsyms::raw_parts`]).
fn encode(table: &Kallsyms) -> Vec<u8> {
    let (syms, names, modules) = table.raw_parts();
    let mut body = Vec::with_capacity(names.text.len() + syms.len() * 32);
    put_u32(&mut body, modules.len() as u32);
    for m in modules {
        put_str(&mut body, m);
    }
    put_str(&mut body, &names.text);
    put_u32(&mut body, names.len() as u32);
    for e in &names.ends {
        put_u32(&mut body, *e);
    }
    let kept: Vec<_> = syms
        .iter()
        .filter(|s| {
            modules
                .get(s.group as usize)
                .is_none_or(|m| !is_transient(m))
        })
        .collect();
    put_u32(&mut body, kept.len() as u32);
    for s in &kept {
        body.extend_from_slice(&s.start.to_le_bytes());
        body.extend_from_slice(&s.end.to_le_bytes());
        body.push(s.binding as u8);
        put_u32(&mut body, s.group);
        put_u32(&mut body, s.name);
    }
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&checksum(&body).to_le_bytes());
    out.extend(body);
    out
}

/// A hash of `b` eight bytes at a time (FNV-1a's constants over words):
/// damage shows, and 4 MB take about 1 ms rather than 4.
fn checksum(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ b.len() as u64;
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        h ^= u64::from_le_bytes(w.try_into().unwrap_or_default());
        h = h.wrapping_mul(0x0100_0000_01b3).rotate_left(29);
    }
    for &x in words.remainder() {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A table [`encode`] made; `None` for anything else (damaged, another
/// version).
fn decode(b: &[u8]) -> Option<Kallsyms> {
    let body = b.strip_prefix(MAGIC)?;
    let (sum, body) = body.split_at_checked(8)?;
    if u64::from_le_bytes(sum.try_into().ok()?) != checksum(body) {
        return None;
    }
    let mut c = Cursor { b: body, at: 0 };
    let n_mod = c.u32()? as usize;
    let mut modules = Vec::with_capacity(n_mod.min(4096));
    for _ in 0..n_mod {
        modules.push(c.str()?.into());
    }
    let text = c.str()?.to_string();
    let n_names = c.u32()? as usize;
    let ends = c
        .take(n_names.checked_mul(4)?)?
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let names = crate::kallsyms::NameBlob { text, ends };
    let n = c.u32()? as usize;
    let mut syms = Vec::with_capacity(n.min(body.len() / 25));
    for _ in 0..n {
        syms.push((c.u64()?, c.u64()?, c.u8()?, c.u32()?, c.u32()?));
    }
    if c.at != body.len() {
        return None;
    }
    Kallsyms::from_raw_parts(&syms, names, modules)
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn str(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).ok()
    }
}

/// Write `bytes` to `path` for its owner only (`0600`, the directory
/// `0700`), by rename: readers never see half a file.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // Unique per writer, threads of one process included.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}.{seq}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let r = f.write_all(bytes).and_then(|()| f.sync_data());
    drop(f);
    if let Err(e) = r.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Write `table` as this boot's, then remove the files of other keys.
fn save(dir: &Path, key: &str, table: &Kallsyms) -> std::io::Result<()> {
    let name = format!("kallsyms-{key}");
    write_private(&dir.join(&name), &encode(table))?;
    for e in std::fs::read_dir(dir)?.flatten() {
        let n = e.file_name();
        let n = n.to_string_lossy();
        // Other boots' tables and what goes with them; this key's own
        // files (its unnamed addresses, a writer's temporary) stay.
        if n.starts_with("kallsyms-") && !n.starts_with(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
ffffffff81000000 T _stext
ffffffff81000100 t helper
ffffffff81000200 T schedule
ffffffff81000400 W weak_fn
ffffffffc0000000 t kvm_fn\t[kvm]
ffffffffc0000100 T kvm_exit [kvm]
ffffffffc0100000 t bpf_prog_6deef7357e7b4530_sd_fw_egress\t[bpf]
ffffffffc0200000 t ftrace_trampoline\t[__builtin__ftrace]
";

    #[test]
    fn a_kept_table_names_what_the_text_names_except_transient_code() {
        let k = Kallsyms::parse(TEXT).unwrap();
        let kept = decode(&encode(&k)).expect("decodes");
        for addr in [
            0xffffffff81000050u64,
            0xffffffff81000150,
            0xffffffff81000250,
            0xffffffff81000410,
            0xffffffff81001fff,
            0xffffffff81002000,
            0xffffffffc0000010,
            0xffffffffc0000180,
            0x1000,
        ] {
            assert_eq!(kept.lookup(addr), k.lookup(addr), "{addr:#x}");
        }
        // BPF programs and trampolines come and go within a boot: the kept
        // table does not name them (the reader asks /proc/kallsyms).
        assert!(k.lookup(0xffffffffc0100010).is_some());
        assert!(kept.lookup(0xffffffffc0100010).is_none());
        assert!(kept.lookup(0xffffffffc0200010).is_none());
    }

    /// This host's own kallsyms: every address a symbol of the kernel or a
    /// module covers is named the same by the kept table.
    #[test]
    fn the_kept_table_of_this_host_names_every_symbol_as_kallsyms_does() {
        let Ok(k) = Kallsyms::from_path(Path::new("/proc/kallsyms")) else {
            eprintln!("SKIP: no /proc/kallsyms");
            return;
        };
        if k.is_restricted() || k.is_empty() {
            eprintln!("SKIP: kallsyms restricted here (run as root)");
            return;
        }
        let kept = decode(&encode(&k)).expect("decodes");
        let mut checked = 0;
        for s in k.iter() {
            if s.module.is_some_and(is_transient) {
                continue;
            }
            for addr in [s.start, s.start + 1] {
                let (a, b) = (k.lookup(addr), kept.lookup(addr));
                assert_eq!(a, b, "{addr:#x}");
                checked += 1;
            }
        }
        assert!(checked > 1000, "{checked}");
    }

    #[test]
    fn damaged_files_are_not_read() {
        let k = Kallsyms::parse(TEXT).unwrap();
        let good = encode(&k);
        assert!(decode(&good).is_some());
        for cut in [0, 7, 8, 16, good.len() / 2, good.len() - 1] {
            assert!(decode(&good[..cut]).is_none(), "cut at {cut}");
        }
        let mut flipped = good.clone();
        let n = flipped.len();
        flipped[n - 3] ^= 0x20;
        assert!(decode(&flipped).is_none());
    }

    #[test]
    fn the_first_load_keeps_the_table_and_the_second_reads_it() {
        if key().is_none() {
            eprintln!("SKIP: no boot id here");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ks = dir.path().join("kallsyms");
        std::fs::write(&ks, TEXT).unwrap();
        let cache = dir.path().join("kernel");
        let first = KeptKernel::load(&cache, &ks).unwrap();
        assert!(first.live.is_none());
        let files: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().collect();
        assert_eq!(files.len(), 1);
        use std::os::unix::fs::PermissionsExt;
        let mode = files[0].metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "kernel addresses are for the owner only");
        // The text may change now: the kept table answers.
        std::fs::write(&ks, "ffffffff81000000 T other\n").unwrap();
        let second = KeptKernel::load(&cache, &ks).unwrap();
        assert_eq!(second.live.as_deref(), Some(ks.as_path()));
        assert_eq!(
            second.table.lookup(0xffffffff81000250).unwrap().name,
            "schedule"
        );
        // A restricted reading is never kept.
        let cache2 = dir.path().join("kernel2");
        std::fs::write(&ks, "0000000000000000 T a\n0000000000000000 t b\n").unwrap();
        let r = KeptKernel::load(&cache2, &ks).unwrap();
        assert!(r.table.is_restricted());
        assert!(!cache2.exists() || std::fs::read_dir(&cache2).unwrap().next().is_none());
    }
}
