//! Time to open a file's ELF symbols and its DWARF: `open_cost FILE...`
//! (a kallsyms file, such as /proc/kallsyms, is read and parsed instead).
fn main() {
    for p in std::env::args().skip(1) {
        let path = std::path::Path::new(&p);
        if p.ends_with("kallsyms") {
            let t = std::time::Instant::now();
            let bytes = std::fs::read(path).unwrap_or_default();
            let t1 = t.elapsed();
            let t = std::time::Instant::now();
            let k = vmscope_symbols::Kallsyms::parse(&String::from_utf8_lossy(&bytes));
            let t2 = t.elapsed();
            println!(
                "{p}: read {t1:?} ({} bytes), parse {t2:?} ({} symbols)",
                bytes.len(),
                k.map_or(0, |k| k.len())
            );
            continue;
        }
        let t = std::time::Instant::now();
        let e = vmscope_symbols::ElfSymbols::open(path);
        let t1 = t.elapsed();
        let t = std::time::Instant::now();
        let d = vmscope_symbols::dwarf::DwarfFile::open(path);
        let t2 = t.elapsed();
        println!(
            "{p}: ELF symbols {t1:?} ({} symbols), DWARF open {t2:?} ({})",
            e.map_or(0, |e| e.len()),
            if d.is_ok() { "ok" } else { "none" }
        );
    }
}
