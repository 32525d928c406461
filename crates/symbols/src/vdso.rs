//! The running kernel's vDSO image. Samples in a process's `[vdso]` mapping
//! resolve against it: every 64-bit process of this kernel maps the same
//! image, which this process finds through `AT_SYSINFO_EHDR` and reads from
//! its own memory (perf extracts it the same way).

/// A copy of this process's vDSO, if it has one.
pub fn own_vdso() -> Option<Vec<u8>> {
    // SAFETY: getauxval has no preconditions.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    if base == 0 {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines().filter(|l| l.ends_with("[vdso]")) {
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let (start, end) = (
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(end, 16).ok()?,
        );
        if start == base && end > start && end - start <= 1 << 20 {
            // SAFETY: the kernel maps [start, end) readable in every process
            // for its whole life; it is never unmapped or written.
            let image = unsafe { std::slice::from_raw_parts(start as *const u8, end - start) };
            return Some(image.to_vec());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_vdso_parses_and_names_clock_gettime() {
        let Some(image) = super::own_vdso() else {
            eprintln!("SKIP: this process has no vDSO (a kernel booted with vdso=0)");
            return;
        };
        let syms = crate::ElfSymbols::parse(&image).unwrap();
        let names: Vec<String> = syms.iter().map(|(_, _, n)| n.to_string()).collect();
        assert!(
            names.iter().any(|n| n.contains("clock_gettime")),
            "{names:?}"
        );
    }
}
