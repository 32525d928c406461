//! Demangling of Rust (legacy `_ZN…17h<hash>E` and v0 `_R…`) and C++
//! (`_Z…`) symbol names into the form `perf report` prints: Rust paths
//! without the hash, C++ names without parameters or return type.

use std::borrow::Cow;

/// True for a Rust legacy mangled name: `_ZN…17h<16 hex digits>E`, possibly
/// followed by a `.llvm.…` or similar suffix.
fn is_rust_legacy(name: &str) -> bool {
    if !name.starts_with("_ZN") {
        return false;
    }
    let core = match name.find('.') {
        Some(i) => &name[..i],
        None => name,
    };
    let Some(body) = core.strip_suffix('E') else {
        return false;
    };
    if body.len() < 19 {
        return false;
    }
    let tail = &body[body.len() - 19..];
    tail.starts_with("17h") && tail[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Demangle one symbol name; names that are not mangled (C) or fail to
/// demangle are returned unchanged.
pub fn demangle(name: &str) -> Cow<'_, str> {
    if name.starts_with("_R") || is_rust_legacy(name) {
        // LLVM's `.llvm.<n>` suffix is dropped; others (`.cold`) are kept.
        let (core, suffix) = match name.find('.') {
            Some(i) => name.split_at(i),
            None => (name, ""),
        };
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
