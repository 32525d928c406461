//! ELF fixtures built at test time with gcc: every function `nm` lists must
//! be found by `ElfSymbols` at its address (and through its file offset),
//! for PIE, non-PIE and shared objects; stripped binaries must find their
//! separate debug file by build-id and by debuglink.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use vmscope_model::{ImageRef, NormalizedFrame};
use vmscope_symbols::{ElfSymbols, Symbolizer, SymbolizerOptions};

const SOURCE: &str = r#"
#include <stdlib.h>
#include <unistd.h>

static int __attribute__((noinline)) helper(int x) { return x * 3 + 1; }

int __attribute__((noinline)) alpha(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += helper(i) % 7;
    return s;
}

long __attribute__((noinline)) beta(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s ^= i * 2654435761u;
    return s;
}

void __attribute__((weak, noinline)) weak_fn(void) { __asm__ volatile("nop"); }

int __attribute__((noinline)) kernel_heavy(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += getppid();
    return s;
}

static void *resolve_ifn(void);
long ifn(long) __attribute__((ifunc("resolve_ifn")));
static long __attribute__((noinline)) ifn_impl(long x) { return x + 1; }
static void *resolve_ifn(void) { return (void *)ifn_impl; }

/* A function without a size: it extends to the next symbol. */
__asm__(".text\n.globl asm_nosize\n.type asm_nosize,@function\n"
        "asm_nosize:\n ret\n nop\n nop\n nop\n");
extern void asm_nosize(void);

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1;
    long t = 0;
    for (long r = 0; r < rounds; r++) {
        t += alpha(200000);
        t += beta(400000);
        t += kernel_heavy(2000);
        t += ifn(r);
        weak_fn();
        asm_nosize();
    }
    return (int)(t & 1);
}
"#;

use vmscope_testkit::have;

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Build the fixture with extra gcc flags; `None` (after saying why) when
/// the toolchain is missing.
fn build(dir: &Path, name: &str, flags: &[&str]) -> Option<PathBuf> {
    for t in ["gcc", "nm", "objcopy", "objdump", "readelf", "strip"] {
        if !have(t) {
            vmscope_testkit::skip(&format!(
                "ELF fixture tests: {t} not found (apt-get install gcc binutils)"
            ));
            return None;
        }
    }
    let src = dir.join("fixture.c");
    std::fs::write(&src, SOURCE).unwrap();
    let out = dir.join(name);
    let mut args = vec![
        "-g",
        "-O1",
        "-o",
        out.to_str().unwrap(),
        src.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    run("gcc", &args);
    Some(out)
}

/// (p_offset, p_vaddr, p_filesz, executable) of each PT_LOAD, from readelf.
fn load_segments(path: &Path) -> Vec<(u64, u64, u64, bool)> {
    let text = run("readelf", &["-lW", path.to_str().unwrap()]);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    text.lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (hex(f[1]), hex(f[2]), hex(f[4]), l.contains(" E "))
        })
        .collect()
}

/// Functions nm lists (address → (names, size)) inside executable segments.
fn nm_functions(path: &Path, segs: &[(u64, u64, u64, bool)]) -> BTreeMap<u64, (Vec<String>, u64)> {
    let text = run("nm", &["--defined-only", "-S", path.to_str().unwrap()]);
    let mut out: BTreeMap<u64, (Vec<String>, u64)> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (addr, size, ty, name) = match f.len() {
            4 => (f[0], u64::from_str_radix(f[1], 16).unwrap(), f[2], f[3]),
            3 => (f[0], 0, f[1], f[2]),
            _ => continue,
        };
        if !matches!(ty, "T" | "t" | "W" | "w" | "i") {
            continue;
        }
        let addr = u64::from_str_radix(addr, 16).unwrap();
        let in_text = segs
            .iter()
            .any(|&(_, va, sz, x)| x && addr >= va && addr < va + sz);
        if !in_text {
            continue;
        }
        let e = out.entry(addr).or_default();
        e.0.push(name.to_string());
        e.1 = e.1.max(size);
    }
    out
}

fn vaddr_to_offset(segs: &[(u64, u64, u64, bool)], vaddr: u64) -> u64 {
    let &(off, va, _, _) = segs
        .iter()
        .find(|&&(_, va, sz, _)| vaddr >= va && vaddr < va + sz)
        .expect("address in a segment");
    vaddr - va + off
}

/// Every nm function resolves to itself (or an alias at its address) at its
/// first and last byte, by vaddr and by file offset.
fn check_against_nm(path: &Path) {
    let syms = ElfSymbols::open(path).unwrap();
    assert!(syms.has_symtab());
    let segs = load_segments(path);
    let funcs = nm_functions(path, &segs);
    for want in [
        "alpha",
        "beta",
        "helper",
        "main",
        "weak_fn",
        "asm_nosize",
        "ifn_impl",
    ] {
        assert!(
            funcs.values().any(|(n, _)| n.iter().any(|x| x == want)),
            "nm misses {want}"
        );
    }
    for (&addr, (names, size)) in &funcs {
        let mut probes = vec![addr];
        if *size > 1 {
            probes.push(addr + size - 1);
        }
        for p in probes {
            let got = syms.lookup_vaddr(p);
            assert!(
                got.is_some_and(|g| names.iter().any(|n| n == g)),
                "{}: vaddr {p:#x}: got {got:?}, nm says {names:?}",
                path.display()
            );
            let off = vaddr_to_offset(&segs, p);
            assert_eq!(syms.lookup_file_offset(off), got, "offset {off:#x}");
        }
    }
    // A zero-size function runs up to the next symbol.
    let nosize = funcs
        .iter()
        .find(|(_, (n, _))| n.iter().any(|x| x == "asm_nosize"))
        .map(|(&a, _)| a)
        .unwrap();
    assert_eq!(syms.lookup_vaddr(nosize + 3), Some("asm_nosize"));
    assert_eq!(syms.lookup_vaddr(0), None);
    // PLT entries get perf's synthesized `name@plt` symbols; objdump names
    // them the same way.
    let dis = run(
        "objdump",
        &["-d", "-j", ".plt", "-j", ".plt.sec", path.to_str().unwrap()],
    );
    let mut plt_checked = 0;
    for line in dis.lines() {
        let Some((addr, rest)) = line.split_once(" <") else {
            continue;
        };
        let Some(name) = rest.strip_suffix(">:") else {
            continue;
        };
        if !name.ends_with("@plt") || name.contains('+') || name.contains('-') {
            continue;
        }
        let addr = u64::from_str_radix(addr.trim(), 16).unwrap();
        assert_eq!(
            syms.lookup_vaddr(addr + 4),
            Some(name),
            "{}",
            path.display()
        );
        plt_checked += 1;
    }
    assert!(plt_checked > 0, "no PLT entries in {}", path.display());
}

#[test]
fn pie_non_pie_and_shared_agree_with_nm() {
    let dir = tempfile::tempdir().unwrap();
    let Some(pie) = build(dir.path(), "pie", &["-pie", "-fPIE"]) else {
        return;
    };
    check_against_nm(&pie);
    let exe = build(dir.path(), "exe", &["-no-pie", "-fno-pie"]).unwrap();
    let segs = load_segments(&exe);
    assert!(
        segs.iter().any(|&(off, va, _, x)| x && off != va),
        "non-PIE text should be linked away from its file offset"
    );
    check_against_nm(&exe);
    let so = build(dir.path(), "lib.so", &["-shared", "-fPIC"]).unwrap();
    check_against_nm(&so);
}

fn frame(path: &Path, build_id: Option<&[u8]>, offset: u64) -> NormalizedFrame {
    NormalizedFrame {
        image: ImageRef::File {
            path: path.to_str().unwrap().into(),
            build_id: build_id.map(Arc::from),
        },
        addr: offset,
    }
}

fn no_kernel(debug_dirs: Vec<PathBuf>) -> SymbolizerOptions {
    SymbolizerOptions {
        kallsyms: Some("/dev/null".into()),
        symfs: None,
        debug_dirs,
        line_cache: None,
        kernel_cache: None,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// File offset of `name` in `path`, from the unstripped binary.
fn offset_of(unstripped: &Path, name: &str) -> u64 {
    let segs = load_segments(unstripped);
    let funcs = nm_functions(unstripped, &segs);
    let (&addr, _) = funcs
        .iter()
        .find(|(_, (n, _))| n.iter().any(|x| x == name))
        .unwrap();
    vaddr_to_offset(&segs, addr)
}

#[test]
fn stripped_binary_uses_build_id_debug_file() {
    let dir = tempfile::tempdir().unwrap();
    let Some(full) = build(dir.path(), "prog", &[]) else {
        return;
    };
    let id = ElfSymbols::open(&full)
        .unwrap()
        .build_id()
        .unwrap()
        .to_vec();
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let stripped = bin_dir.join("prog");
    run(
        "strip",
        &[
            "--strip-all",
            "-o",
            stripped.to_str().unwrap(),
            full.to_str().unwrap(),
        ],
    );
    let s = ElfSymbols::open(&stripped).unwrap();
    assert!(!s.has_symtab());
    assert_eq!(s.build_id(), Some(&id[..]));
    assert_eq!(s.lookup_file_offset(offset_of(&full, "alpha")), None);

    let debug = dir.path().join("debug");
    let id_dir = debug.join(".build-id").join(hex(&id[..1]));
    std::fs::create_dir_all(&id_dir).unwrap();
    let debug_file = id_dir.join(format!("{}.debug", hex(&id[1..])));
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            full.to_str().unwrap(),
            debug_file.to_str().unwrap(),
        ],
    );

    let alpha = offset_of(&full, "alpha");
    let beta = offset_of(&full, "beta");
    // Without the mapping's build-id (read from the file) and with it.
    for want in [None, Some(&id[..])] {
        let mut sym = Symbolizer::new(no_kernel(vec![debug.clone()]));
        let r = sym.resolve("host", &frame(&stripped, want, alpha + 2));
        assert_eq!(&*r.image, stripped.to_str().unwrap());
        assert_eq!(&*r.symbol, "alpha", "{:?}", sym.warnings());
        assert_eq!(
            &*sym.resolve("host", &frame(&stripped, want, beta)).symbol,
            "beta"
        );
    }

    // No debug dir: the stripped file has no function symbols → hex offset.
    let mut sym = Symbolizer::new(no_kernel(vec![]));
    let r = sym.resolve("host", &frame(&stripped, None, alpha));
    assert_eq!(&*r.symbol, format!("0x{alpha:x}"));
    assert!(
        sym.warnings().iter().any(|w| w.contains("no debug file")),
        "{:?}",
        sym.warnings()
    );

    // The recording saw another build: the file is not trusted.
    let other = [0xab_u8; 20];
    let mut sym = Symbolizer::new(no_kernel(vec![debug.clone()]));
    let r = sym.resolve("host", &frame(&stripped, Some(&other), alpha));
    assert_eq!(&*r.symbol, format!("0x{alpha:x}"));
    assert!(
        sym.warnings().iter().any(|w| w.contains("differs")),
        "{:?}",
        sym.warnings()
    );

    // The unstripped file with a mismatching build-id and no debug file.
    let mut sym = Symbolizer::new(no_kernel(vec![]));
    let r = sym.resolve("host", &frame(&full, Some(&other), alpha));
    assert_eq!(&*r.symbol, format!("0x{alpha:x}"));

    // symfs: an empty root resolves nothing; a root holding the tree does.
    let empty = tempfile::tempdir().unwrap();
    let mut sym = Symbolizer::new(SymbolizerOptions {
        symfs: Some(empty.path().to_path_buf()),
        ..no_kernel(vec![debug.clone()])
    });
    let r = sym.resolve("host", &frame(&full, None, alpha));
    assert_eq!(&*r.symbol, format!("0x{alpha:x}"));
    let root = tempfile::tempdir().unwrap();
    let inside = root.path().join("opt/app");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::copy(&full, inside.join("prog")).unwrap();
    let mut sym = Symbolizer::new(SymbolizerOptions {
        symfs: Some(root.path().to_path_buf()),
        ..no_kernel(vec![])
    });
    let r = sym.resolve("host", &frame(Path::new("/opt/app/prog"), None, alpha));
    assert_eq!((&*r.image, &*r.symbol), ("/opt/app/prog", "alpha"));
}

/// `full`'s debug sections alone, as `dir/prog.dbg`.
fn debug_only(full: &Path, dir: &Path) -> PathBuf {
    let dbg = dir.join("prog.dbg");
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            full.to_str().unwrap(),
            dbg.to_str().unwrap(),
        ],
    );
    dbg
}

/// `full` stripped into `app/prog`, with a debuglink to `dbg` (its name
/// only: where the debug file is found is the caller's choice).
fn stripped_with_debuglink(full: &Path, dbg: &Path, app: &Path) -> PathBuf {
    std::fs::create_dir_all(app).unwrap();
    let bin = app.join("prog");
    run(
        "strip",
        &[
            "--strip-all",
            "-o",
            bin.to_str().unwrap(),
            full.to_str().unwrap(),
        ],
    );
    run(
        "objcopy",
        &[
            &format!("--add-gnu-debuglink={}", dbg.display()),
            bin.to_str().unwrap(),
        ],
    );
    bin
}

#[test]
fn stripped_binary_uses_debuglink() {
    let dir = tempfile::tempdir().unwrap();
    let Some(full) = build(dir.path(), "prog", &[]) else {
        return;
    };
    let alpha = offset_of(&full, "alpha");
    let dbg = debug_only(&full, dir.path());
    let debug_root = dir.path().join("usr-lib-debug");
    // Three places a debuglink is looked for, each tried alone.
    for place in ["same", ".debug", "debug-dir"] {
        let app = dir
            .path()
            .join(format!("app-{}", place.trim_start_matches('.')));
        let bin = stripped_with_debuglink(&full, &dbg, &app);
        assert_eq!(
            ElfSymbols::open(&bin).unwrap().debuglink(),
            Some("prog.dbg")
        );
        let target = match place {
            "same" => app.join("prog.dbg"),
            ".debug" => app.join(".debug/prog.dbg"),
            _ => debug_root
                .join(app.strip_prefix("/").unwrap())
                .join("prog.dbg"),
        };
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&dbg, &target).unwrap();
        // Build-id lookup finds nothing here: only the debuglink can work.
        let mut sym = Symbolizer::new(no_kernel(vec![debug_root.clone()]));
        let r = sym.resolve("host", &frame(&bin, None, alpha + 1));
        assert_eq!(&*r.symbol, "alpha", "{place}: {:?}", sym.warnings());
        std::fs::remove_file(&target).unwrap();
    }
}

#[test]
fn truncated_elf_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let Some(full) = build(dir.path(), "prog", &[]) else {
        return;
    };
    let data = std::fs::read(&full).unwrap();
    let mut errors = 0;
    for len in [
        0,
        4,
        16,
        52,
        63,
        64,
        100,
        1000,
        data.len() / 2,
        data.len() - 1,
    ] {
        // Every prefix either parses (section headers are at the end, so
        // most fail) or errors; none panics.
        match ElfSymbols::parse(&data[..len]) {
            Ok(_) => {}
            Err(e) => {
                errors += 1;
                assert!(e.to_string().contains("ELF"), "{e}");
            }
        }
    }
    assert!(errors > 0);
    let cut = dir.path().join("cut");
    std::fs::write(&cut, &data[..data.len() / 2]).unwrap();
    let e = ElfSymbols::open(&cut).unwrap_err().to_string();
    assert!(e.contains(cut.to_str().unwrap()), "{e}");
    // Symbolizer: a warning naming the file, hex offsets, no panic.
    let mut sym = Symbolizer::new(no_kernel(vec![]));
    let r = sym.resolve("host", &frame(&cut, None, 0x1130));
    assert_eq!(&*r.symbol, "0x1130");
    assert!(sym
        .warnings()
        .iter()
        .any(|w| w.contains(cut.to_str().unwrap())));
}

/// C++ names come out as perf prints them: no parameters, no return type,
/// template arguments kept (`perf report` shows `demo::alpha` and
/// `demo::beta<long>` for this program).
#[test]
fn cpp_names_as_perf_shows_them() {
    if !vmscope_testkit::require_tools(&[("g++", "g++"), ("nm", "binutils")]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("a.cpp");
    let bin = dir.path().join("a");
    std::fs::write(
        &src,
        "namespace demo {\n\
         __attribute__((noinline)) long alpha(long n) { long s = 0; for (long i = 0; i < n; i++) s += i * i % 7; return s; }\n\
         template <typename T> __attribute__((noinline)) T beta(T n) { T s = 0; for (T i = 0; i < n; i++) s += i % 5; return s; }\n\
         }\n\
         int main(int argc, char **) { return (int)(demo::alpha(argc) + demo::beta<long>(argc)); }\n",
    )
    .unwrap();
    run(
        "g++",
        &[
            "-O1",
            "-g",
            "-o",
            bin.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
    );
    let syms = ElfSymbols::open(&bin).unwrap();
    let nm = run("nm", &["--defined-only", bin.to_str().unwrap()]);
    let addr_of = |mangled: &str| {
        nm.lines()
            .find(|l| l.ends_with(&format!(" {mangled}")))
            .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
            .unwrap_or_else(|| panic!("{mangled} not in nm output"))
    };
    assert_eq!(
        syms.lookup_vaddr(addr_of("_ZN4demo5alphaEl")),
        Some("demo::alpha")
    );
    assert_eq!(
        syms.lookup_vaddr(addr_of("_ZN4demo4betaIlEET_S1_")),
        Some("demo::beta<long>")
    );
}

/// Sets `path`'s modification time to `like`'s, so only the inode or the
/// change time tell them apart.
fn same_mtime(path: &Path, like: &Path) {
    let t = std::fs::metadata(like).unwrap().modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[test]
fn kept_files_serve_a_later_symbolizer_until_the_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(a) = build(dir.path(), "a", &[]) else {
        return;
    };
    let b = build(dir.path(), "b", &["-Dalpha=alpha_renamed"]).unwrap();
    let off = offset_of(&a, "alpha");
    assert_eq!(
        off,
        offset_of(&b, "alpha_renamed"),
        "the two builds differ in names only"
    );
    let path = dir.path().join("prog");
    std::fs::copy(&a, &path).unwrap();
    let f = frame(&path, None, off);
    let opts = || no_kernel(vec![]);

    let mut first = Symbolizer::new(opts()).keeping_files();
    assert_eq!(&*first.resolve("host", &f).symbol, "alpha");
    let kept = first.take_files();
    assert_eq!(kept.len(), 1);
    // A symbolizer not asked to keep its files stamps nothing and hands
    // nothing on.
    let mut plain = Symbolizer::new(opts());
    assert_eq!(&*plain.resolve("host", &f).symbol, "alpha");
    assert!(plain.take_files().is_empty());
    // Taking leaves the first symbolizer working: it reads the file again.
    assert_eq!(&*first.resolve("host", &f).symbol, "alpha");

    // An unchanged file is adopted, and answers without being read: with
    // the file gone, only the kept table can name the address.
    let mut second = Symbolizer::new(opts()).keeping_files();
    assert_eq!(second.reuse_files(kept.clone()), (1, 0));
    let moved = dir.path().join("prog.away");
    std::fs::rename(&path, &moved).unwrap();
    assert_eq!(&*second.resolve("host", &f).symbol, "alpha");
    std::fs::rename(&moved, &path).unwrap();
    // Other options (here a debug dir) adopt nothing.
    let mut other = Symbolizer::new(no_kernel(vec![dir.path().into()])).keeping_files();
    assert_eq!(other.reuse_files(kept), (0, 1));

    // The same bytes under a new inode at the path (as an upgrade leaves
    // it), with the old modification time: dropped, read again.
    let kept = second.take_files();
    let fresh = dir.path().join("prog.new");
    std::fs::copy(&a, &fresh).unwrap();
    same_mtime(&fresh, &path);
    std::fs::rename(&fresh, &path).unwrap();
    let mut third = Symbolizer::new(opts()).keeping_files();
    assert_eq!(third.reuse_files(kept), (0, 1));
    assert_eq!(&*third.resolve("host", &f).symbol, "alpha");

    // Rewritten in place with other names of the same length, size and
    // modification time restored: only the change time says so, and the
    // new names are read.
    let kept = third.take_files();
    let mut bytes = std::fs::read(&a).unwrap();
    let at: Vec<usize> = bytes
        .windows(7)
        .enumerate()
        .filter(|(_, w)| *w == b"\0alpha\0")
        .map(|(i, _)| i + 1)
        .collect();
    assert!(!at.is_empty(), "alpha in the string tables");
    for i in at {
        bytes[i..i + 5].copy_from_slice(b"omega");
    }
    let before = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&path, &bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(before)
        .unwrap();
    let mut fourth = Symbolizer::new(opts()).keeping_files();
    assert_eq!(fourth.reuse_files(kept), (0, 1));
    assert_eq!(&*fourth.resolve("host", &f).symbol, "omega");
}

#[test]
fn a_kept_stripped_file_is_dropped_when_its_debug_file_appears() {
    let dir = tempfile::tempdir().unwrap();
    let Some(full) = build(dir.path(), "prog", &[]) else {
        return;
    };
    let alpha = offset_of(&full, "alpha");
    let dbg = debug_only(&full, dir.path());
    let app = dir.path().join("app");
    let bin = stripped_with_debuglink(&full, &dbg, &app);
    let f = frame(&bin, None, alpha + 1);
    // No debug file yet: `alpha` is not among the dynamic symbols.
    let mut first = Symbolizer::new(no_kernel(vec![])).keeping_files();
    assert_ne!(&*first.resolve("host", &f).symbol, "alpha");
    let kept = first.take_files();
    assert_eq!(kept.len(), 1);
    let mut second = Symbolizer::new(no_kernel(vec![])).keeping_files();
    assert_eq!(
        second.reuse_files(kept.clone()),
        (1, 0),
        "nothing changed yet"
    );
    // The debug file is installed where the debuglink points.
    std::fs::copy(&dbg, app.join("prog.dbg")).unwrap();
    let mut third = Symbolizer::new(no_kernel(vec![])).keeping_files();
    assert_eq!(third.reuse_files(kept), (0, 1));
    assert_eq!(&*third.resolve("host", &f).symbol, "alpha");
}
