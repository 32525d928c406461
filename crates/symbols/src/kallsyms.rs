//! `/proc/kallsyms` text (the host's, or a guest's sent by its agent or named
//! by the user): parsing with line-numbered errors, and perf-compatible
//! nearest-symbol lookup over text symbols (`t T w W`) of the kernel and its
//! modules.
//!
//! perf's rules are kept: a symbol ends where the next one starts, except
//! that the last symbol of the kernel or of a module ends at the page after
//! its start; of several symbols at one address one is kept (the sized one,
//! else global over local, fewer leading underscores, longer name).

use crate::table::{self, Binding, RangeSym, NO_GROUP};
use crate::SymbolError;
use std::path::Path;
use std::sync::Arc;

/// A kernel symbol found by [`Kallsyms::lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSymbol<'a> {
    pub name: &'a str,
    /// Module name without brackets, `None` for the kernel proper.
    pub module: Option<&'a str>,
    pub start: u64,
}

/// The text symbols of one kernel. Cloning shares the table (a profiler
/// that keeps a kernel's symbols between sessions hands out clones; a
/// deep copy of a guest kernel's 100 000 names cost an emulated guest
/// 15 to 80 ms of CPU per session).
#[derive(Debug, Clone, Default)]
pub struct Kallsyms {
    syms: Arc<[RangeSym]>,
    names: Arc<NameBlob>,
    modules: Arc<[Box<str>]>,
    restricted: bool,
}

const ORIGIN: &str = "kallsyms";

fn line_error(line: usize, reason: String) -> SymbolError {
    SymbolError::Kallsyms {
        origin: ORIGIN.to_string(),
        line,
        reason,
    }
}

fn is_text(ty: char) -> bool {
    matches!(ty, 't' | 'T' | 'w' | 'W')
}

/// perf's `kallsyms2elf_binding`.
fn binding(ty: char) -> Binding {
    match ty {
        'W' => Binding::Weak,
        c if c.is_ascii_uppercase() => Binding::Global,
        _ => Binding::Local,
    }
}

impl Kallsyms {
    /// Parse kallsyms text: `ADDR TYPE NAME` lines, with an optional
    /// `[module]` after the name. Blank lines are ignored; anything else
    /// malformed is an error naming the line.
    pub fn parse(text: &str) -> Result<Kallsyms, SymbolError> {
        let mut names = NameBlob::default();
        let mut modules: Vec<Box<str>> = Vec::new();
        let mut syms: Vec<RangeSym> = Vec::new();
        let mut any = false;
        let mut all_zero = true;
        for (i, line) in text.lines().enumerate() {
            let lineno = i + 1;
            let mut fields = line.split_ascii_whitespace();
            let Some(addr_s) = fields.next() else {
                continue;
            };
            let addr = u64::from_str_radix(addr_s, 16).map_err(|_| {
                line_error(
                    lineno,
                    format!("bad address {:?} (want up to 16 hex digits)", clip(addr_s)),
                )
            })?;
            let ty_s = fields
                .next()
                .ok_or_else(|| line_error(lineno, "missing symbol type".into()))?;
            let mut ty_chars = ty_s.chars();
            let ty = match (ty_chars.next(), ty_chars.next()) {
                (Some(c), None) if c.is_ascii_graphic() => c,
                _ => {
                    return Err(line_error(
                        lineno,
                        format!("bad symbol type {:?} (want one letter)", clip(ty_s)),
                    ))
                }
            };
            let name = fields
                .next()
                .ok_or_else(|| line_error(lineno, "missing symbol name".into()))?;
            let module = match fields.next() {
                None => None,
                Some(m) => {
                    let inner = m
                        .strip_prefix('[')
                        .and_then(|m| m.strip_suffix(']'))
                        .filter(|m| !m.is_empty())
                        .ok_or_else(|| {
                            line_error(
                                lineno,
                                format!("expected [module] after the name, got {:?}", clip(m)),
                            )
                        })?;
                    Some(inner)
                }
            };
            if let Some(extra) = fields.next() {
                return Err(line_error(
                    lineno,
                    format!("unexpected text {:?} at end of line", clip(extra)),
                ));
            }
            any = true;
            all_zero &= addr == 0;
            // perf drops ARM local labels and mapping symbols.
            if !is_text(ty) || name.starts_with('.') || name.starts_with('$') {
                continue;
            }
            let group = match module {
                None => NO_GROUP,
                Some(m) => {
                    if let Some(g) = modules.iter().rposition(|x| &**x == m) {
                        g as u32
                    } else {
                        modules.push(m.into());
                        (modules.len() - 1) as u32
                    }
                }
            };
            names.push(name);
            syms.push(RangeSym {
                start: addr,
                end: addr,
                binding: binding(ty),
                name: (names.len() - 1) as u32,
                group,
            });
        }
        let restricted = any && all_zero;
        let syms = table::finish(syms, true, |i| names.get(i));
        Ok(Kallsyms {
            syms: syms.into(),
            names: names.into(),
            modules: modules.into(),
            restricted,
        })
    }

    /// Read and parse a kallsyms file; errors name the path.
    pub fn from_path(path: &Path) -> Result<Kallsyms, SymbolError> {
        let bytes = std::fs::read(path).map_err(|source| SymbolError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let text = String::from_utf8_lossy(&bytes);
        Kallsyms::parse(&text).map_err(|e| e.with_origin(path))
    }

    /// The text symbol covering `addr`, like perf: the nearest symbol at or
    /// below it, up to where the next symbol starts (or one page past the
    /// last symbol of the kernel or a module). `None` when restricted.
    pub fn lookup(&self, addr: u64) -> Option<KernelSymbol<'_>> {
        if self.restricted {
            return None;
        }
        let s = table::find(&self.syms, addr)?;
        Some(self.symbol(s))
    }

    fn symbol(&self, s: &RangeSym) -> KernelSymbol<'_> {
        KernelSymbol {
            name: self.names.get(s.name),
            module: self.modules.get(s.group as usize).map(|m| &**m),
            start: s.start,
        }
    }

    /// True when every address is zero (`kernel.kptr_restrict` hides them
    /// from this reader): nothing can be resolved.
    pub fn is_restricted(&self) -> bool {
        self.restricted
    }

    /// Number of text symbols kept (aliases at one address count once).
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    /// Module names seen, without brackets.
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.modules.iter().map(|m| &**m)
    }

    /// Every kept symbol in address order.
    pub fn iter(&self) -> impl Iterator<Item = KernelSymbol<'_>> {
        self.syms.iter().map(|s| self.symbol(s))
    }

    /// The table's parts, for [`crate::kernelcache`] to keep.
    pub(crate) fn raw_parts(&self) -> (&[RangeSym], &NameBlob, &[Box<str>]) {
        (&self.syms, &self.names, &self.modules)
    }

    /// A table from parts [`Kallsyms::raw_parts`] gave: symbols as (start,
    /// end, binding, module index, name index), in address order.
    /// `None` when they contradict themselves.
    pub(crate) fn from_raw_parts(
        syms: &[(u64, u64, u8, u32, u32)],
        names: NameBlob,
        modules: Vec<Box<str>>,
    ) -> Option<Kallsyms> {
        let mut out = Vec::with_capacity(syms.len());
        let mut last = 0u64;
        for &(start, end, binding, group, name) in syms {
            let ok = start >= last
                && end >= start
                && (name as usize) < names.len()
                && (group == NO_GROUP || (group as usize) < modules.len());
            if !ok {
                return None;
            }
            last = start;
            out.push(RangeSym {
                start,
                end,
                binding: Binding::from_u8(binding)?,
                name,
                group,
            });
        }
        if !names.is_sound() {
            return None;
        }
        Some(Kallsyms {
            syms: out.into(),
            names: names.into(),
            modules: modules.into(),
            restricted: false,
        })
    }

    /// The symbol covering `addr` with its position in this table and its
    /// module index, so that callers can share one name allocation among
    /// many addresses.
    pub(crate) fn lookup_indexed(
        &self,
        addr: u64,
    ) -> Option<(usize, Option<usize>, KernelSymbol<'_>)> {
        if self.restricted {
            return None;
        }
        let idx = table::find_index(&self.syms, addr)?;
        let s = self.syms.get(idx)?;
        let module = (s.group != NO_GROUP).then_some(s.group as usize);
        Some((idx, module, self.symbol(s)))
    }
}

/// Symbol names in one allocation: name `i` is `text[ends[i - 1]..ends[i]]`
/// (121 000 kernel names as separate strings cost as many allocations on
/// every parse and every load of a kept table).
#[derive(Debug, Clone, Default)]
pub(crate) struct NameBlob {
    pub text: String,
    pub ends: Vec<u32>,
}

impl NameBlob {
    fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len() as u32);
    }

    /// Name `i`; empty for an index past the end.
    pub fn get(&self, i: u32) -> &str {
        let i = i as usize;
        let Some(&end) = self.ends.get(i) else {
            return "";
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start as usize..end as usize).unwrap_or("")
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// `ends` rise and stay within `text`, at character boundaries.
    pub fn is_sound(&self) -> bool {
        let mut last = 0u32;
        self.ends.iter().all(|&e| {
            let ok = e >= last && self.text.is_char_boundary(e as usize);
            last = e;
            ok
        })
    }
}

/// At most 40 characters of a field, for error messages.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "\
ffffffff81000000 T _text
ffffffff81000000 T _stext
ffffffff81000100 t helper
ffffffff81000200 T schedule
ffffffff81000200 t __schedule_alias
ffffffff81000300 D some_data
ffffffff81000400 W weak_fn
ffffffff81000500 T _etext
ffffffffc0000000 t kvm_fn\t[kvm]
ffffffffc0000100 T kvm_exit [kvm]
ffffffffc0001000 t e1000_xmit\t[e1000]
";

    #[test]
    fn kernel_and_modules() {
        let k = Kallsyms::parse(FIXTURE).unwrap();
        assert!(!k.is_restricted());
        assert_eq!(k.lookup(0xffffffff81000050).unwrap().name, "_stext");
        // Of aliases, perf keeps the last one listed: it alone gets a size.
        let s = k.lookup(0xffffffff81000250).unwrap();
        assert_eq!(
            (s.name, s.module, s.start),
            ("__schedule_alias", None, 0xffffffff81000200)
        );
        // Data symbols are not text: the alias runs up to weak_fn.
        assert_eq!(
            k.lookup(0xffffffff81000350).unwrap().name,
            "__schedule_alias"
        );
        assert_eq!(k.lookup(0xffffffff81000150).unwrap().name, "helper");
        assert_eq!(k.lookup(0xffffffff81000400).unwrap().name, "weak_fn");
        // The last kernel symbol ends one page on.
        assert_eq!(k.lookup(0xffffffff81001fff).unwrap().name, "_etext");
        assert!(k.lookup(0xffffffff81002000).is_none());
        let m = k.lookup(0xffffffffc0000180).unwrap();
        assert_eq!((m.name, m.module), ("kvm_exit", Some("kvm")));
        // A module's last symbol does not run into the next module.
        assert!(k.lookup(0xffffffffc0000fff).is_some());
        assert_eq!(k.lookup(0xffffffffc0000fff).unwrap().name, "kvm_exit");
        assert_eq!(k.lookup(0xffffffffc0001004).unwrap().module, Some("e1000"));
        assert!(k.lookup(0xffffffffc0003000).is_none());
        assert!(k.lookup(0x1000).is_none());
        assert_eq!(k.modules().collect::<Vec<_>>(), ["kvm", "e1000"]);
    }

    #[test]
    fn restricted_all_zero() {
        let k = Kallsyms::parse(
            "0000000000000000 T _text\n0000000000000000 t foo\n0000000000000000 t bar\t[kvm]\n",
        )
        .unwrap();
        assert!(k.is_restricted());
        assert!(k.lookup(0).is_none());
        assert!(k.lookup(0xffffffff81000000).is_none());
    }

    #[test]
    fn empty_is_not_restricted() {
        let k = Kallsyms::parse("\n\n").unwrap();
        assert!(k.is_empty() && !k.is_restricted());
    }

    #[test]
    fn malformed_lines_name_their_number() {
        for (text, line, what) in [
            ("ffffffff81000000 T a\nzzzz T b\n", 2, "bad address"),
            ("ffffffff81000000\n", 1, "missing symbol type"),
            ("ffffffff81000000 TT a\n", 1, "bad symbol type"),
            ("\nffffffff81000000 T\n", 2, "missing symbol name"),
            ("ffffffff81000000 T a kvm\n", 1, "[module]"),
            ("ffffffff81000000 T a [kvm] x\n", 1, "unexpected text"),
            ("1ffffffff81000000 T a\n", 1, "bad address"),
        ] {
            let e = Kallsyms::parse(text).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("line {line}")) && msg.contains(what),
                "{text:?}: {msg}"
            );
        }
    }

    #[test]
    fn from_path_names_the_path() {
        let e = Kallsyms::from_path(Path::new("/nonexistent/kallsyms")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kallsyms"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ks");
        std::fs::write(&p, "ffffffff81000000 T a\nnonsense\n").unwrap();
        let e = Kallsyms::from_path(&p).unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("line 2"),
            "{e}"
        );
    }
}
