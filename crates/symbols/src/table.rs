//! The address-range table shared by kallsyms and ELF symbols, with perf's
//! rules: symbols sorted by start (stable, so file order breaks ties), a
//! zero-size symbol extends to the next symbol, the last one to the end of
//! the following page, and of several symbols at one address the best one
//! (`choose_best_symbol` in perf) is kept.

/// ELF-style symbol binding, used to pick among aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    Local = 0,
    Global = 1,
    Weak = 2,
}

impl Binding {
    pub fn from_u8(b: u8) -> Option<Binding> {
        match b {
            0 => Some(Binding::Local),
            1 => Some(Binding::Global),
            2 => Some(Binding::Weak),
            _ => None,
        }
    }
}

/// One symbol: `[start, end)` and an index into the owner's name table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RangeSym {
    pub start: u64,
    pub end: u64,
    pub binding: Binding,
    pub name: u32,
    /// Owner-defined group (kallsyms: module index, `NO_GROUP` for the
    /// kernel proper; ELF: unused).
    pub group: u32,
}

pub(crate) const NO_GROUP: u32 = u32::MAX;

const PAGE: u64 = 4096;

/// `roundup(x, 4096)` without overflow.
fn page_roundup(x: u64) -> u64 {
    x.checked_add(PAGE - 1)
        .map_or(!(PAGE - 1), |v| v & !(PAGE - 1))
}

/// perf's `symbols__fixup_end`. `kallsyms` turns on the rule that the last
/// symbol before a change of module ends at the next page rather than at the
/// next module's first symbol.
pub(crate) fn fixup_end(syms: &mut [RangeSym], kallsyms: bool) {
    for i in 1..syms.len() {
        let curr = syms[i];
        let prev = &mut syms[i - 1];
        if prev.end != prev.start {
            continue;
        }
        if kallsyms && prev.group != curr.group {
            prev.end = page_roundup(prev.start.saturating_add(PAGE));
        } else {
            prev.end = curr.start;
        }
    }
    if let Some(last) = syms.last_mut() {
        if last.end == last.start {
            last.end = page_roundup(last.start).saturating_add(PAGE);
        }
    }
}

fn leading_underscores(s: &str) -> usize {
    s.bytes().take_while(|&b| b == b'_').count()
}

/// perf's `choose_best_symbol`: true when `b` should replace `a`. The names
/// are asked for only when size and binding do not decide (ELF names are
/// demangled on demand, so this keeps the common case cheap).
fn b_is_better<N: AsRef<str>>(
    a: &RangeSym,
    b: &RangeSym,
    names: impl FnOnce() -> Option<(N, N)>,
) -> bool {
    let (la, lb) = (a.end - a.start, b.end - b.start);
    if lb == 0 && la > 0 {
        return false;
    }
    if la == 0 && lb > 0 {
        return true;
    }
    let (wa, wb) = (a.binding == Binding::Weak, b.binding == Binding::Weak);
    if wb != wa {
        return wa;
    }
    let (ga, gb) = (a.binding == Binding::Global, b.binding == Binding::Global);
    if ga != gb {
        return gb;
    }
    // Equal names: neither has fewer underscores nor is longer.
    let Some((a_name, b_name)) = names() else {
        return false;
    };
    let (a_name, b_name) = (a_name.as_ref(), b_name.as_ref());
    let (ua, ub) = (leading_underscores(a_name), leading_underscores(b_name));
    if ua != ub {
        return ua > ub;
    }
    b_name.len() > a_name.len()
}

/// Sort by start (stable), fix ends, drop aliases (perf's
/// `symbols__fixup_end` then `symbols__fixup_duplicate`).
pub(crate) fn finish<N: AsRef<str>>(
    syms: Vec<RangeSym>,
    kallsyms: bool,
    name: impl Fn(u32) -> N,
) -> Vec<RangeSym> {
    finish_by(syms, kallsyms, |a, b| Some((name(a), name(b))))
}

/// [`finish`] where `names(a, b)` gives the two names an alias tie-break
/// compares, or `None` when they are known to be equal (so an owner whose
/// names are costly to produce can skip them).
pub(crate) fn finish_by<N: AsRef<str>>(
    mut syms: Vec<RangeSym>,
    kallsyms: bool,
    names: impl Fn(u32, u32) -> Option<(N, N)>,
) -> Vec<RangeSym> {
    for s in &mut syms {
        if s.end < s.start {
            s.end = s.start;
        }
    }
    syms.sort_by_key(|s| s.start);
    fixup_end(&mut syms, kallsyms);
    let mut out: Vec<RangeSym> = Vec::with_capacity(syms.len());
    for s in syms {
        if let Some(last) = out.last_mut() {
            if last.start == s.start {
                if b_is_better(last, &s, || names(last.name, s.name)) {
                    *last = s;
                }
                continue;
            }
        }
        out.push(s);
    }
    out.shrink_to_fit();
    out
}

fn covers(s: &RangeSym, addr: u64) -> bool {
    s.start <= addr && (addr < s.end || addr == s.start)
}

/// How far back to look for an enclosing symbol when the nearest one ends
/// before `addr` (sized symbols may nest, e.g. a local label inside a
/// function).
const NEST_LOOKBACK: usize = 32;

/// The symbol covering `addr`: the nearest start at or below it, else an
/// enclosing earlier symbol.
pub(crate) fn find(syms: &[RangeSym], addr: u64) -> Option<&RangeSym> {
    find_index(syms, addr).and_then(|i| syms.get(i))
}

/// Like [`find`], returning the symbol's index.
pub(crate) fn find_index(syms: &[RangeSym], addr: u64) -> Option<usize> {
    let i = syms.partition_point(|s| s.start <= addr);
    let lo = i.saturating_sub(NEST_LOOKBACK);
    (lo..i).rev().find(|&j| covers(&syms[j], addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(start: u64, size: u64, binding: Binding, name: u32) -> RangeSym {
        RangeSym {
            start,
            end: start + size,
            binding,
            name,
            group: NO_GROUP,
        }
    }

    #[test]
    fn zero_size_extends_and_last_gets_a_page() {
        let names = ["a", "b", "c"];
        let t = finish(
            vec![
                sym(0x1000, 0, Binding::Global, 0),
                sym(0x1100, 0x10, Binding::Global, 1),
                sym(0x1200, 0, Binding::Global, 2),
            ],
            false,
            |i| names[i as usize],
        );
        assert_eq!(t[0].end, 0x1100);
        assert_eq!(t[1].end, 0x1110);
        assert_eq!(t[2].end, 0x3000);
        assert_eq!(find(&t, 0x10ff).map(|s| s.name), Some(0));
        assert!(find(&t, 0x1150).is_none());
        assert!(find(&t, 0x3000).is_none());
        assert!(find(&t, 0xfff).is_none());
    }

    #[test]
    fn aliases_prefer_global_then_fewer_underscores_then_longer() {
        let names = ["__x", "x_long", "x", "w"];
        let t = finish(
            vec![
                sym(0x10, 4, Binding::Weak, 3),
                sym(0x10, 4, Binding::Global, 0),
                sym(0x10, 4, Binding::Global, 2),
                sym(0x10, 4, Binding::Global, 1),
            ],
            false,
            |i| names[i as usize],
        );
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, 1);
    }

    #[test]
    fn nested_symbol_falls_back_to_enclosing() {
        let names = ["outer", "inner"];
        let t = finish(
            vec![
                sym(0x100, 0x100, Binding::Global, 0),
                sym(0x150, 0x10, Binding::Local, 1),
            ],
            false,
            |i| names[i as usize],
        );
        assert_eq!(find(&t, 0x155).map(|s| s.name), Some(1));
        assert_eq!(find(&t, 0x170).map(|s| s.name), Some(0));
    }

    #[test]
    fn no_overflow_at_top_of_address_space() {
        let names = ["top"];
        let t = finish(vec![sym(u64::MAX, 0, Binding::Global, 0)], true, |i| {
            names[i as usize]
        });
        assert_eq!(find(&t, u64::MAX).map(|s| s.name), Some(0));
    }
}
