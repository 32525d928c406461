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
//! One text file per key under the cache directory: its strings once each,
//! then a line per address or range (`vaddr` or `start-end` in hex, the
//! source line's and the inlined names' string numbers; [`format_kept`]).
//! Answers with a tab, newline or U+001F in them are not kept. Saving merges with
//! what is on disk (another recorder may have added entries) and replaces
//! the file by rename, so readers never see half a file; a lost race loses
//! only entries a later run computes again. A file stops growing at
//! [`MAX_ENTRIES`]; past [`MAX_FILES`] files (a binary rebuilt many times
//! leaves one per build) the least recently used go, loading a file marks
//! it used.
//!
//! What it saves depends on whether addresses recur, so only `import`
//! uses it. Importing the same perf.data again opens no DWARF at all (a
//! 48 k-sample file of the demo workload: 0.15 s and 117 MB the first
//! time, 0.07 s and 35 MB after). A sampled recording meets addresses it
//! has not seen in every run (the demo's cache grew from 1280 to 1454
//! entries in the second run), so each run still opened the DWARF of the
//! binaries it sampled and cost the same: `record` does not use it.

use crate::dwarf::LineInfo;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Entries kept per file at most.
pub const MAX_ENTRIES: usize = 200_000;

/// Files kept in the cache directory at most.
pub const MAX_FILES: usize = 256;

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
        let known = std::fs::read_to_string(&path)
            .map(|t| parse(&t))
            .unwrap_or_default();
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

    /// Write the answers added since loading, merged with the file's
    /// current contents; nothing when none were added.
    pub fn save(&mut self) -> std::io::Result<()> {
        if self.added.is_empty() && self.added_ranges.is_empty() {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut all = std::fs::read_to_string(&self.path)
            .map(|t| parse(&t))
            .unwrap_or_default();
        for a in &self.added {
            if all.len() >= MAX_ENTRIES {
                break;
            }
            if let Some(i) = self.known.addrs.get(a) {
                all.addrs.entry(*a).or_insert_with(|| i.clone());
            }
        }
        for s in &self.added_ranges {
            if let Some((e, i)) = self.known.ranges.get(s) {
                all.add_range(*s, *e, i);
            }
        }
        let out = format_kept(&all);
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
        }
        self.added.clear();
        self.added_ranges.clear();
        prune(dir, MAX_FILES);
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
    let bad = |s: &str| s.contains(['\t', '\n', '\r', SEP]);
    !i.srcline.as_deref().is_some_and(bad) && !i.inlined.iter().any(|n| bad(n))
}

/// The text of `kept`: its strings once each (`s TAB text`, numbered from
/// 1 in order; 0 is none), then a line per answer: `vaddr` or
/// `start-end` (hex) TAB the source line's number TAB the inlined names'
/// numbers joined by commas. A function's pieces repeat the same few long
/// names hundreds of times: written once each, the file of this project's
/// own binary is about a tenth of its size with the names in every line.
fn format_kept(kept: &Kept) -> String {
    struct Strings<'a> {
        ids: HashMap<&'a str, usize>,
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
        ids: HashMap::new(),
        text: String::new(),
    };
    let mut lines = String::with_capacity(kept.len() * 24);
    let mut keys: Vec<&u64> = kept.addrs.keys().collect();
    keys.sort_unstable();
    let all = keys
        .into_iter()
        .map(|k| (format!("{k:x}"), &kept.addrs[k]))
        .chain(
            kept.ranges
                .iter()
                .map(|(start, (end, i))| (format!("{start:x}-{end:x}"), i)),
        );
    for (key, i) in all {
        let src = i.srcline.as_deref().map_or(0, |t| strings.id(t));
        let inl: Vec<String> = i
            .inlined
            .iter()
            .map(|n| strings.id(n).to_string())
            .collect();
        lines.push_str(&format!("{key}\t{src}\t{}\n", inl.join(",")));
    }
    let mut out = strings.text;
    out.push_str(&lines);
    out
}

/// What [`format_kept`] wrote; damaged lines (and those of older formats)
/// are skipped.
fn parse(text: &str) -> Kept {
    let mut m = Kept::default();
    let mut strings: Vec<Arc<str>> = Vec::new();
    for line in text.lines() {
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
        let info = LineInfo { inlined, srcline };
        match end {
            None => {
                m.addrs.insert(addr, info);
            }
            Some(end) => {
                m.add_range(addr, end, &info);
            }
        }
        if m.len() >= MAX_ENTRIES {
            break;
        }
    }
    m
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
        text.push_str("zz\tnot hex\t\nno tabs at all\ns\tgood.c:2\n4\t2\t\n5\t99\t\n6\t0\t1,x\n");
        std::fs::write(&file, text).unwrap();
        let b = FileLines::load(dir.path(), &id, dwarf);
        assert_eq!(b.len(), 2);
        assert_eq!(b.get(4), Some(&info(Some("good.c:2"), &[])));
    }
}
