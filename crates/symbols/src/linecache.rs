//! What DWARF said about a file's addresses (inline frames, source line),
//! kept on disk by the file's build-id, so a later import of the same
//! addresses does not load and walk their DWARF again.
//!
//! Loading DWARF is most of what symbolizing costs: a profile of
//! `record -a -g` over the demo workload put 56 % of the recorder's CPU in
//! `Symbolizer::resolve`, 34 % in opening the DWARF (libc's debug file
//! inflates its compressed sections) and 11 % in walking unit headers and
//! line programs on the first lookups. The answers depend only on the
//! DWARF file's contents, so they are kept per (build-id, DWARF file path)
//! — content-addressed, never stale — and an address answered before costs
//! a hash lookup. A file without a build-id is not cached.
//!
//! One text file per key under the cache directory, a sequence of blocks:
//! each its strings once each, then a line per address or range (`vaddr`
//! or `start-end` in hex, the source line's and the inlined names' string
//! numbers), then a line with a checksum of the block ([`format_block`]).
//! Answers with a tab, newline or U+001F in them are not kept. Saving
//! appends one block with the answers found since loading, in one write:
//! another recorder may append its own meanwhile, and a reader keeps only
//! blocks whose checksum holds, so a torn or interleaved append is skipped,
//! never misread. Rewriting the whole file merged with what it holds had
//! cost a first report of the demo a seventh of its CPU for a few new
//! answers. Past [`COMPACT_BLOCKS`] blocks a save rewrites the file as one
//! block, merged with what is on disk, replaced by rename; an append that
//! races a rewrite loses only answers a later run computes again. A file
//! stops growing at [`MAX_ENTRIES`]; past [`MAX_FILES`] files (a binary
//! rebuilt many times leaves one per build) the least recently used go,
//! loading a file marks it used.
//!
//! `import` and a session's first report use it. Importing the same
//! perf.data again opens no DWARF at all (a 48 k-sample file of the demo
//! workload: 0.15 s and 117 MB the first time, 0.07 s and 35 MB after). A
//! sampled recording meets new addresses in every run; answers kept over
//! whole functions ([`crate::dwarf::Segments`]) answer most of them, so a
//! first report opens the DWARF of a binary only for functions no earlier
//! report met. `record --symbolize now` does not use it.

use crate::dwarf::LineInfo;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Entries kept per file at most.
pub const MAX_ENTRIES: usize = 200_000;

/// Files kept in the cache directory at most.
pub const MAX_FILES: usize = 256;

/// Blocks a file holds before a save rewrites it as one.
pub const COMPACT_BLOCKS: usize = 16;

const SEP: char = '\u{1f}';

/// The cache directory commands use: `$VMSCOPE_LINE_CACHE` (`off` turns the
/// cache off), else `/var/cache/vmscope/lines` for root, else
/// `$XDG_CACHE_HOME/vmscope/lines` or `~/.cache/vmscope/lines`.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("VMSCOPE_LINE_CACHE") {
        Some(v) if v == "off" || v.is_empty() => return None,
        Some(v) => return Some(PathBuf::from(v)),
        None => {}
    }
    // SAFETY: geteuid has no memory effects and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/var/cache/vmscope/lines"));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("vmscope").join("lines"))
}

/// What is kept of one DWARF file: answers by address, and answers that
/// hold over a range (start → (end, answer); [`crate::dwarf::Segments`]).
#[derive(Default)]
struct Kept {
    addrs: HashMap<u64, LineInfo>,
    ranges: BTreeMap<u64, (u64, LineInfo)>,
}

impl Kept {
    fn len(&self) -> usize {
        self.addrs.len() + self.ranges.len()
    }

    fn get(&self, vaddr: u64) -> Option<&LineInfo> {
        self.addrs.get(&vaddr).or_else(|| {
            let (_, (end, info)) = self.ranges.range(..=vaddr).next_back()?;
            (vaddr < *end).then_some(info)
        })
    }

    /// Keep `[start, end)` → `info` unless it overlaps a range kept already.
    fn add_range(&mut self, start: u64, end: u64, info: &LineInfo) -> bool {
        if start >= end || self.len() >= MAX_ENTRIES {
            return false;
        }
        let before = self.ranges.range(..end).next_back();
        if before.is_some_and(|(_, (e, _))| *e > start) {
            return false;
        }
        self.ranges.insert(start, (end, info.clone()));
        true
    }
}

/// The kept answers of one DWARF file.
pub struct FileLines {
    path: PathBuf,
    known: Kept,
    added: Vec<u64>,
    added_ranges: Vec<u64>,
    /// Blocks the file held when loaded, and appended since
    /// ([`COMPACT_BLOCKS`] when it held anything else).
    blocks: usize,
}

impl FileLines {
    /// The answers kept under `dir` for the DWARF file `dwarf` of a binary
    /// with `build_id`; none yet if nothing was kept or the file is damaged
    /// (damaged lines are skipped).
    pub fn load(dir: &Path, build_id: &[u8], dwarf: &Path) -> FileLines {
        let id: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
        let path = dir.join(format!(
            "{id}-{:016x}",
            fnv1a(dwarf.as_os_str().as_encoded_bytes())
        ));
        let parsed = std::fs::read_to_string(&path)
            .map(|t| parse(&t))
            .unwrap_or_default();
        let known = parsed.kept;
        // A file with bytes outside sound blocks is rewritten at the next
        // save, as one past the block limit is.
        let blocks = if parsed.unsound > 0 {
            COMPACT_BLOCKS
        } else {
            parsed.blocks
        };
        if known.len() > 0 {
            // Used: the last to go when the directory is pruned.
            let _ = std::fs::File::options()
                .append(true)
                .open(&path)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        }
        FileLines {
            path,
            known,
            added: Vec::new(),
            added_ranges: Vec::new(),
            blocks,
        }
    }

    /// The kept answer for `vaddr`: its own, or that of a range holding it.
    pub fn get(&self, vaddr: u64) -> Option<&LineInfo> {
        self.known.get(vaddr)
    }

    /// Keep `info` for `vaddr` (in memory until [`FileLines::save`]).
    pub fn insert(&mut self, vaddr: u64, info: &LineInfo) {
        if self.known.len() >= MAX_ENTRIES || !storable(info) {
            return;
        }
        if self.known.addrs.insert(vaddr, info.clone()).is_none() {
            self.added.push(vaddr);
        }
    }

    /// Keep the answers of `segs`, each over its range (a piece whose
    /// answer cannot be stored is left out: its addresses are asked again).
    pub fn insert_segments(&mut self, segs: &crate::dwarf::Segments) {
        for (i, (start, info)) in segs.parts.iter().enumerate() {
            let end = segs.parts.get(i + 1).map_or(segs.end, |(s, _)| *s);
            if storable(info) && self.known.add_range(*start, end, info) {
                self.added_ranges.push(*start);
            }
        }
    }

    /// Number of answers held.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// True when no answer is held.
    pub fn is_empty(&self) -> bool {
        self.known.len() == 0
    }

    /// Append the answers added since loading to the file as one block
    /// (past [`COMPACT_BLOCKS`], rewrite it as one block, merged with its
    /// current contents); nothing when none were added.
    pub fn save(&mut self) -> std::io::Result<()> {
        if self.added.is_empty() && self.added_ranges.is_empty() {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or(Path::new(".")).to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let mut new = Kept::default();
        for a in &self.added {
            if let Some(i) = self.known.addrs.get(a) {
                new.addrs.insert(*a, i.clone());
            }
        }
        for s in &self.added_ranges {
            if let Some(r) = self.known.ranges.get(s) {
                new.ranges.insert(*s, r.clone());
            }
        }
        let r = if self.blocks + 1 > COMPACT_BLOCKS {
            self.rewrite(new)
        } else {
            let out = format_block(&new);
            std::fs::File::options()
                .append(true)
                .create(true)
                .open(&self.path)
                // One write: a concurrent append lands before or after it.
                .and_then(|mut f| f.write_all(out.as_bytes()))
                .map(|()| self.blocks += 1)
        };
        self.added.clear();
        self.added_ranges.clear();
        prune(&dir, MAX_FILES);
        r
    }

    /// Replace the file by one block: what it holds now, and `new`.
    fn rewrite(&mut self, new: Kept) -> std::io::Result<()> {
        let mut all = std::fs::read_to_string(&self.path)
            .map(|t| parse(&t).kept)
            .unwrap_or_default();
        for (a, i) in new.addrs {
            if all.len() >= MAX_ENTRIES {
                break;
            }
            all.addrs.entry(a).or_insert(i);
        }
        for (s, (e, i)) in new.ranges {
            all.add_range(s, e, &i);
        }
        let out = format_block(&all);
        let tmp = self.path.with_extension(format!(
            "tmp.{}.{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(out.as_bytes())?;
        drop(f);
        let r = std::fs::rename(&tmp, &self.path);
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        } else {
            self.blocks = 1;
        }
        r
    }
}

/// Remove the least recently used files of `dir` beyond `keep`, and
/// temporary files a crashed writer left over an hour ago.
fn prune(dir: &Path, keep: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if !m.is_file() {
            continue;
        }
        let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
        if e.file_name().to_string_lossy().contains(".tmp.") {
            if now.duration_since(t).is_ok_and(|d| d.as_secs() > 3600) {
                let _ = std::fs::remove_file(e.path());
            }
            continue;
        }
        files.push((t, e.path()));
    }
    if files.len() > keep {
        files.sort();
        for (_, p) in &files[..files.len() - keep] {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for FileLines {
    fn drop(&mut self) {
        let _ = self.save();
    }
}

fn storable(i: &LineInfo) -> bool {
    // A byte scan: `contains` with a set of chars decoded every char, and
    // this runs on every piece of every function segmented (2.4 % of a
    // demo first report).
    const _: () = assert!(SEP.is_ascii());
    let bad = |s: &str| {
        s.bytes()
            .any(|b| matches!(b, b'\t' | b'\n' | b'\r') || b == SEP as u8)
    };
    !i.srcline.as_deref().is_some_and(bad) && !i.inlined.iter().any(|n| bad(n))
}

/// The block of `kept`: a line `#b`, its strings once each (`s TAB text`,
/// numbered from 1 in order; 0 is none), then a line per answer: `vaddr`
/// or `start-end` (hex) TAB the source line's number TAB the inlined
/// names' numbers joined by commas, then `#e TAB` the FNV-1a hash (hex) of
/// the block's bytes between the `#b` line and that line (`#` begins no
/// address). A function's pieces repeat the same few
/// long names hundreds of times: written once each, the file of this
/// project's own binary is about a tenth of its size with the names in
/// every line.
fn format_block(kept: &Kept) -> String {
    struct Strings<'a> {
        ids: crate::symbolizer::FxMap<&'a str, usize>,
        text: String,
    }
    impl<'a> Strings<'a> {
        fn id(&mut self, t: &'a str) -> usize {
            let n = self.ids.len() + 1;
            let text = &mut self.text;
            *self.ids.entry(t).or_insert_with(|| {
                text.push_str("s\t");
                text.push_str(t);
                text.push('\n');
                n
            })
        }
    }
    let mut strings = Strings {
        ids: Default::default(),
        text: String::new(),
    };
    let mut lines = String::with_capacity(kept.len() * 24);
    let mut keys: Vec<&u64> = kept.addrs.keys().collect();
    keys.sort_unstable();
    let all = keys
        .into_iter()
        .map(|k| ((*k, None), &kept.addrs[k]))
        .chain(
            kept.ranges
                .iter()
                .map(|(start, (end, i))| ((*start, Some(*end)), i)),
        );
    use std::fmt::Write as _;
    for ((start, end), i) in all {
        let src = i.srcline.as_deref().map_or(0, |t| strings.id(t));
        // Writing into a String cannot fail.
        let _ = match end {
            None => write!(lines, "{start:x}\t{src}\t"),
            Some(end) => write!(lines, "{start:x}-{end:x}\t{src}\t"),
        };
        for (n, name) in i.inlined.iter().enumerate() {
            let id = strings.id(name);
            let _ = if n == 0 {
                write!(lines, "{id}")
            } else {
                write!(lines, ",{id}")
            };
        }
        lines.push('\n');
    }
    let mut body = strings.text;
    body.push_str(&lines);
    let sum = fnv1a(body.as_bytes());
    format!("#b\n{body}#e\t{sum:016x}\n")
}

/// What [`format_block`] wrote, block after block: a block whose checksum
/// does not hold (torn by a crash, two appends interleaved) is skipped
/// whole, as are lines outside blocks (an older format), and damaged lines
/// inside a sound block are skipped.
fn parse(text: &str) -> Parsed {
    let mut m = Kept::default();
    let mut blocks = 0;
    let mut sound_bytes = 0;
    let mut block_open = None;
    // Ranges are gathered, then put in order once: inserting each into the
    // tree with its overlap check was a third of loading this binary's
    // file.
    let mut ranges: Vec<(u64, u64, LineInfo)> = Vec::new();
    let mut strings: Vec<Arc<str>> = Vec::new();
    let mut pending: Vec<(u64, Option<u64>, LineInfo)> = Vec::new();
    let mut block_start = 0;
    let mut at = 0;
    for raw in text.split_inclusive('\n') {
        let line_start = at;
        at += raw.len();
        let Some(line) = raw.strip_suffix('\n') else {
            break; // torn: no newline yet
        };
        if line == "#b" {
            pending.clear();
            strings.clear();
            block_start = at;
            block_open = Some(line_start);
            continue;
        }
        if let Some(sum) = line.strip_prefix("#e\t") {
            let sound = block_open.is_some()
                && u64::from_str_radix(sum, 16)
                    .is_ok_and(|s| s == fnv1a(&text.as_bytes()[block_start..line_start]));
            if let (true, Some(open)) = (sound, block_open) {
                blocks += 1;
                sound_bytes += at - open;
                for (addr, end, info) in pending.drain(..) {
                    match end {
                        None => {
                            m.addrs.entry(addr).or_insert(info);
                        }
                        Some(end) if addr < end => ranges.push((addr, end, info)),
                        Some(_) => {}
                    }
                }
            }
            pending.clear();
            strings.clear();
            block_open = None;
            continue;
        }
        if let Some(t) = line.strip_prefix("s\t") {
            strings.push(Arc::from(t));
            continue;
        }
        let mut f = line.splitn(3, '\t');
        let (Some(a), Some(src), Some(inl)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        let key = match a.split_once('-') {
            None => hex(a).map(|a| (a, None)),
            Some((s, e)) => hex(s).zip(hex(e)).map(|(s, e)| (s, Some(e))),
        };
        let Some((addr, end)) = key else {
            continue;
        };
        let string = |n: &str| -> Option<Arc<str>> {
            let n: usize = n.parse().ok()?;
            strings.get(n.checked_sub(1)?).cloned()
        };
        let srcline = match src {
            "0" => None,
            n => match string(n) {
                Some(t) => Some(t),
                None => continue,
            },
        };
        let inlined: Option<Vec<Arc<str>>> = if inl.is_empty() {
            Some(Vec::new())
        } else {
            inl.split(',').map(string).collect()
        };
        let Some(inlined) = inlined else {
            continue;
        };
        pending.push((addr, end, LineInfo { inlined, srcline }));
    }
    // The first of overlapping ranges is kept (by start; a range from an
    // earlier block first among equal starts), as `add_range` keeps them.
    ranges.sort_by_key(|r| r.0);
    let room = MAX_ENTRIES.saturating_sub(m.addrs.len());
    let mut last_end = 0;
    m.ranges = ranges
        .into_iter()
        .filter(|(start, end, _)| {
            let keep = *start >= last_end;
            if keep {
                last_end = *end;
            }
            keep
        })
        .take(room)
        .map(|(start, end, info)| (start, (end, info)))
        .collect();
    if m.addrs.len() > MAX_ENTRIES {
        let mut keys: Vec<u64> = m.addrs.keys().copied().collect();
        keys.sort_unstable();
        for k in &keys[MAX_ENTRIES..] {
            m.addrs.remove(k);
        }
    }
    Parsed {
        kept: m,
        blocks,
        unsound: text.len() - sound_bytes,
    }
}

/// What [`parse`] read from a file.
#[derive(Default)]
struct Parsed {
    kept: Kept,
    /// Sound blocks.
    blocks: usize,
    /// Bytes outside them (torn, damaged or of an older format): a file
    /// with any is rewritten at its next save.
    unsound: usize,
}

/// FNV-1a: a stable hash of the DWARF file's path for the file name (the
/// standard library's hashers are not stable across releases).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(src: Option<&str>, inl: &[&str]) -> LineInfo {
        LineInfo {
            inlined: inl.iter().map(|s| Arc::from(*s)).collect(),
            srcline: src.map(Arc::from),
        }
    }

    #[test]
    fn answers_come_back_from_disk_and_merge_with_another_writer() {
        let dir = tempfile::tempdir().unwrap();
        let id = [0xab, 0x01];
        let dwarf = Path::new("/usr/lib/debug/x.debug");
        let mut a = FileLines::load(dir.path(), &id, dwarf);
        let mut b = FileLines::load(dir.path(), &id, dwarf);
        assert!(a.is_empty());
        a.insert(0x1000, &info(Some("a.c:3"), &["inner", "outer"]));
        a.insert(0x2000, &info(None, &[]));
        b.insert(0x3000, &info(Some("b.c:9"), &[]));
        a.save().unwrap();
        b.save().unwrap();
        let c = FileLines::load(dir.path(), &id, dwarf);
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.get(0x1000),
            Some(&info(Some("a.c:3"), &["inner", "outer"]))
        );
        assert_eq!(c.get(0x2000), Some(&info(None, &[])));
        assert_eq!(c.get(0x3000), Some(&info(Some("b.c:9"), &[])));
        // Another DWARF file of the same binary is another key.
        let other = FileLines::load(dir.path(), &id, Path::new("/elsewhere/x.debug"));
        assert!(other.is_empty());
        // Nothing temporary is left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn answers_over_ranges_come_back_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let id = [0xcd];
        let dwarf = Path::new("/d");
        let mut a = FileLines::load(dir.path(), &id, dwarf);
        a.insert(0x5000, &info(Some("own.c:1"), &[]));
        a.insert_segments(&crate::dwarf::Segments {
            end: 0x1100,
            parts: vec![
                (0x1000, info(Some("f.c:1"), &[])),
                (0x1040, info(Some("g.h:7"), &["g (inlined)"])),
                (0x1080, info(Some("bad\ttab"), &[])),
                (0x10c0, info(Some("f.c:9"), &[])),
            ],
        });
        // A range overlapping one kept is not kept.
        a.insert_segments(&crate::dwarf::Segments {
            end: 0x1050,
            parts: vec![(0x1030, info(Some("other.c:1"), &[]))],
        });
        a.save().unwrap();
        let b = FileLines::load(dir.path(), &id, dwarf);
        assert_eq!(b.get(0x1000), Some(&info(Some("f.c:1"), &[])));
        assert_eq!(b.get(0x103f), Some(&info(Some("f.c:1"), &[])));
        assert_eq!(b.get(0x1040), Some(&info(Some("g.h:7"), &["g (inlined)"])));
        // The piece that could not be stored is asked again.
        assert_eq!(b.get(0x1090), None);
        assert_eq!(b.get(0x10ff), Some(&info(Some("f.c:9"), &[])));
        assert_eq!(b.get(0x1100), None);
        assert_eq!(b.get(0xfff), None);
        assert_eq!(b.get(0x5000), Some(&info(Some("own.c:1"), &[])));
    }

    #[test]
    fn the_least_recently_used_files_go_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        for i in 0..5u8 {
            let mut f = FileLines::load(dir.path(), &[i], Path::new("/d"));
            f.insert(1, &info(Some("x.c:1"), &[]));
            f.save().unwrap();
        }
        let files = || {
            let mut v: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        // Age them all, then use the first again: it stays.
        for f in files() {
            std::fs::File::options()
                .append(true)
                .open(dir.path().join(&f))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        assert_eq!(FileLines::load(dir.path(), &[0], Path::new("/d")).len(), 1);
        std::fs::write(dir.path().join("x.tmp.1.2"), "left over").unwrap();
        std::fs::File::options()
            .append(true)
            .open(dir.path().join("x.tmp.1.2"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        prune(dir.path(), 2);
        let left = files();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.iter().any(|f| f.starts_with("00-")), "{left:?}");
        assert!(!left.iter().any(|f| f.contains(".tmp.")), "{left:?}");
    }

    #[test]
    fn unstorable_answers_and_damaged_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let id = [1u8];
        let dwarf = Path::new("/d");
        let mut a = FileLines::load(dir.path(), &id, dwarf);
        a.insert(1, &info(Some("tab\there"), &[]));
        a.insert(2, &info(None, &["new\nline"]));
        assert!(a.is_empty());
        a.insert(3, &info(Some("ok.c:1"), &[]));
        a.save().unwrap();
        let file = std::fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut text = std::fs::read_to_string(&file).unwrap();
        // A sound block with damaged lines in it: those lines are skipped.
        let block = "zz\tnot hex\t\nno tabs at all\ns\tgood.c:2\n4\t1\t\n5\t99\t\n6\t0\t1,x\n";
        // A block torn before its end does not spoil the next one.
        text.push_str("#b\ns\ttorn.c:1\n8\t1\t\n9\t1");
        text.push_str(&format!(
            "\n#b\n{block}#e\t{:016x}\n",
            fnv1a(block.as_bytes())
        ));
        // A block whose checksum does not hold is skipped whole, as are
        // lines outside blocks.
        text.push_str("#b\ns\tbad.c:1\n7\t1\t\n#e\t0123456789abcdef\n");
        text.push_str("s\told.c:1\n10\t1\t\n");
        std::fs::write(&file, text).unwrap();
        let b = FileLines::load(dir.path(), &id, dwarf);
        assert_eq!(b.len(), 2);
        assert_eq!(b.get(3), Some(&info(Some("ok.c:1"), &[])));
        assert_eq!(b.get(4), Some(&info(Some("good.c:2"), &[])));
        assert_eq!(b.get(7), None);
        assert_eq!(b.get(8), None);
        assert_eq!(b.get(10), None);
        // The next save rewrites such a file: sound blocks only.
        let mut c = FileLines::load(dir.path(), &id, dwarf);
        c.insert(11, &info(Some("new.c:1"), &[]));
        c.save().unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(parse(&text).unsound, 0, "{text}");
        assert_eq!(parse(&text).blocks, 1);
        let d = FileLines::load(dir.path(), &id, dwarf);
        assert_eq!((d.len(), d.get(11)), (3, Some(&info(Some("new.c:1"), &[]))));
    }

    #[test]
    fn writers_saving_at_once_lose_nothing_of_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let id = [9u8];
        let dwarf = Path::new("/d");
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (dir, barrier) = (dir.path(), &barrier);
                s.spawn(move || {
                    let mut f = FileLines::load(dir, &id, dwarf);
                    for a in 0..500 {
                        f.insert(t << 32 | a, &info(Some(&format!("t{t}.c:{a}")), &[]));
                    }
                    barrier.wait();
                    f.save().unwrap();
                });
            }
        });
        let all = FileLines::load(dir.path(), &id, dwarf);
        let f = std::fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let p = parse(&std::fs::read_to_string(&f).unwrap());
        assert_eq!((p.blocks, p.unsound), (8, 0));
        assert_eq!(all.len(), 8 * 500);
        assert_eq!(all.get(7 << 32 | 499), Some(&info(Some("t7.c:499"), &[])));
    }

    #[test]
    fn saves_append_a_block_each_and_rewrite_the_file_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let id = [7u8];
        let dwarf = Path::new("/d");
        let file = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path()
        };
        let blocks = || {
            std::fs::read_to_string(file())
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("#e\t"))
                .count()
        };
        for i in 0..COMPACT_BLOCKS as u64 + 3 {
            let mut a = FileLines::load(dir.path(), &id, dwarf);
            assert_eq!(a.len(), i as usize);
            a.insert(
                0x100 + i,
                &info(Some(&format!("f.c:{i}")), &["g (inlined)"]),
            );
            let before = std::fs::metadata(dir.path()).is_ok().then(|| {
                std::fs::read_dir(dir.path())
                    .unwrap()
                    .next()
                    .map(|_| std::fs::read_to_string(file()).unwrap())
            });
            a.save().unwrap();
            let n = blocks();
            if (i as usize) < COMPACT_BLOCKS {
                // Appended: what was there is there unchanged.
                assert_eq!(n, i as usize + 1);
                if let Some(Some(old)) = before {
                    assert!(std::fs::read_to_string(file()).unwrap().starts_with(&old));
                }
            } else {
                // Rewritten as one block at the limit, appended to after.
                assert_eq!(n, i as usize - COMPACT_BLOCKS + 1);
            }
        }
        let all = FileLines::load(dir.path(), &id, dwarf);
        for i in 0..COMPACT_BLOCKS as u64 + 3 {
            assert_eq!(
                all.get(0x100 + i),
                Some(&info(Some(&format!("f.c:{i}")), &["g (inlined)"]))
            );
        }
    }
}
