//! Demangling of Rust (legacy `_ZN…17h<hash>E` and v0 `_R…`) and C++
//! (`_Z…`) symbol names into the form `perf report` prints: Rust paths
//! without the hash, C++ names without parameters or return type.

use std::borrow::Cow;

/// For a Rust legacy mangled name `_ZN…17h<16 hex digits>E[suffix]`, the
/// index just past the `E`. The path itself may contain dots (`core..hash`
/// encodes `core::hash`), so the end is found by the hash, not by a dot.
fn rust_legacy_end(name: &str) -> Option<usize> {
    if !name.starts_with("_ZN") {
        return None;
    }
    let b = name.as_bytes();
    let mut from = 0;
    while let Some(off) = name[from..].find("17h") {
        let i = from + off;
        let hex = i + 3..i + 19;
        if b.len() > i + 19
            && b[hex].iter().all(u8::is_ascii_hexdigit)
            && b[i + 19] == b'E'
            && (b.len() == i + 20 || b[i + 20] == b'.')
        {
            return Some(i + 20);
        }
        from = i + 1;
    }
    None
}

/// Demangle one symbol name; names that are not mangled (C) or fail to
/// demangle are returned unchanged.
pub fn demangle(name: &str) -> Cow<'_, str> {
    let rust_split = if name.starts_with("_R") {
        Some(name.find('.').unwrap_or(name.len()))
    } else {
        rust_legacy_end(name)
    };
    if let Some(end) = rust_split {
        // LLVM's `.llvm.<n>` suffix is dropped; others (`.cold`) are kept.
        let (core, suffix) = name.split_at(end);
        if let Ok(d) = rustc_demangle::try_demangle(core) {
            let suffix = if suffix.starts_with(".llvm.") {
                ""
            } else {
                suffix
            };
            return Cow::Owned(format!("{d:#}{suffix}"));
        }
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name.as_bytes()) {
            let opts = cpp_demangle::DemangleOptions::new()
                .no_params()
                .no_return_type();
            if let Ok(s) = sym.demangle(&opts) {
                return Cow::Owned(s);
            }
        }
    }
    Cow::Borrowed(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_legacy_drops_hash() {
        assert_eq!(
            demangle("_ZN4demo5alpha17h0123456789abcdefE"),
            "demo::alpha"
        );
        assert_eq!(
            demangle("_ZN4demo5alpha17h0123456789abcdefE.llvm.12345"),
            "demo::alpha"
        );
        assert_eq!(
            demangle("_ZN4demo5alpha17h0123456789abcdefE.cold"),
            "demo::alpha.cold"
        );
    }

    #[test]
    fn rust_legacy_with_dots_in_the_path() {
        assert_eq!(
            demangle("_ZN71_$LT$core..hash..sip..Hasher$LT$S$GT$$u20$as$u20$core..hash..Hasher$GT$5write17hecba8cf524c29b1dE"),
            "<core::hash::sip::Hasher<S> as core::hash::Hasher>::write"
        );
        assert_eq!(
            demangle("_ZN4core3ptr85drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT$17h0123456789abcdefE.llvm.42"),
            "core::ptr::drop_in_place<std::rt::lang_start<()>::{{closure}}>"
        );
    }

    #[test]
    fn rust_v0() {
        assert_eq!(demangle("_RNvCs1234_4demo5alpha"), "demo::alpha");
    }

    #[test]
    fn cpp_without_params() {
        assert_eq!(demangle("_ZN4demo5alphaEl"), "demo::alpha");
        assert_eq!(demangle("_ZN4demo4betaIlEET_S1_"), "demo::beta<long>");
    }

    #[test]
    fn c_and_garbage_unchanged() {
        assert_eq!(demangle("main"), "main");
        assert_eq!(
            demangle("finish_task_switch.isra.0"),
            "finish_task_switch.isra.0"
        );
        assert_eq!(demangle("_Z"), "_Z");
        assert_eq!(demangle("_ZN"), "_ZN");
        assert_eq!(demangle("_R"), "_R");
    }
}
