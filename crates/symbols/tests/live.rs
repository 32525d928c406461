//! Tests against the live machine: `/proc/kallsyms`, a cross-check of every
//! sample `perf script` symbolizes (kernel, the fixture binary, libc, the
//! dynamic loader) and the symbolizer's caches against first answers. Each skips, saying why,
//! where the machine cannot run it (no root, no perf, no gcc).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use vmscope_model::{ImageRef, NormalizedFrame};
use vmscope_symbols::{Kallsyms, Symbolizer, SymbolizerOptions};

#[test]
fn live_kallsyms_finds_schedule() {
    let k = match Kallsyms::from_path(Path::new("/proc/kallsyms")) {
        Ok(k) => k,
        Err(e) => {
            vmscope_testkit::skip(&format!("/proc/kallsyms unreadable: {e}"));
            return;
        }
    };
    if k.is_restricted() {
        vmscope_testkit::skip("/proc/kallsyms is restricted (not root or kptr_restrict)");
        return;
    }
    assert!(k.len() > 1000, "only {} symbols", k.len());
    let sched = k
        .iter()
        .find(|s| s.name == "schedule" || s.name == "__schedule")
        .expect("schedule in kallsyms");
    let found = k.lookup(sched.start + 1).unwrap();
    assert_eq!(found.start, sched.start);
    assert!(found.name.contains("schedule"), "{found:?}");
    assert_eq!(found.module, None);

    let mut s = Symbolizer::new(SymbolizerOptions::default());
    let r = s.resolve(
        "host",
        &NormalizedFrame {
            image: ImageRef::Kernel,
            addr: sched.start,
        },
    );
    assert_eq!(&*r.image, "[kernel.kallsyms]");
    assert!(r.symbol.contains("schedule"));
    let first_module = k.iter().find(|s| s.module.is_some());
    if let Some(m) = first_module {
        let r = s.resolve(
            "host",
            &NormalizedFrame {
                image: ImageRef::Kernel,
                addr: m.start,
            },
        );
        assert_eq!(&*r.image, format!("[{}]", m.module.unwrap_or_default()));
    }
}

const PROGRAM: &str = r#"
#include <stdlib.h>
#include <string.h>
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
int __attribute__((noinline)) kernel_heavy(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += getppid();
    return s;
}
int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1;
    long t = 0;
    static char a[1 << 16], b[1 << 16];
    for (long r = 0; r < rounds; r++) {
        t += alpha(200000) + beta(400000) + kernel_heavy(2000);
        for (int k = 0; k < 50; k++) { memcpy(a, b, sizeof a); t += strlen(a); }
    }
    return (int)(t & 1);
}
"#;

struct Map {
    start: u64,
    len: u64,
    pgoff: u64,
    path: String,
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

/// `PERF_RECORD_MMAP2 pid/tid: [0xSTART(0xLEN) @ PGOFF ...]: r-xp PATH`
fn parse_mmap(line: &str) -> Option<Map> {
    let open = line.find('[')?;
    let rest = &line[open + 1..];
    let paren = rest.find('(')?;
    let start = parse_hex(&rest[..paren])?;
    let close = rest.find(')')?;
    let len = parse_hex(&rest[paren + 1..close])?;
    let at = rest.find(" @ ")?;
    let pgoff = parse_hex(rest[at + 3..].split_whitespace().next()?)?;
    let path = line
        .rsplit_once(": ")?
        .1
        .split_whitespace()
        .nth(1)?
        .to_string();
    Some(Map {
        start,
        len,
        pgoff,
        path,
    })
}

#[test]
fn agrees_with_perf_script_on_every_sample() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog.c");
    let bin = dir.path().join("prog");
    let data = dir.path().join("perf.data");
    std::fs::write(&src, PROGRAM).unwrap();
    let gcc = Command::new("gcc")
        .args(["-g", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .output();
    if !gcc.as_ref().is_ok_and(|o| o.status.success()) {
        vmscope_testkit::skip("gcc failed or missing (scripts/setup.sh installs gcc)");
        return;
    }
    let record = |extra: &[&str]| {
        Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", "10000"])
            .args(extra)
            .arg("-o")
            .arg(&data)
            .arg("--")
            .arg(&bin)
            .arg("40")
            .output()
    };
    let mut rec = record(&[]);
    // perf 6.1 can abort while it collects build-ids at the end (an
    // assertion in util/build-id.c, seen while another session asked the
    // kernel for build-ids in MMAP2 records): record again without them,
    // as bench/vs-perf does. perf script then finds the binaries by path.
    if rec.as_ref().is_ok_and(|o| !o.status.success()) {
        rec = record(&["--no-buildid"]);
    }
    match &rec {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            vmscope_testkit::skip(&format!(
                "perf record failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
            return;
        }
        Err(e) => {
            vmscope_testkit::skip(&format!(
                "perf not runnable (scripts/setup.sh installs linux-perf): {e}"
            ));
            return;
        }
    }
    let out = Command::new("perf")
        .args(["script", "--show-mmap-events", "-F", "ip,sym,dso", "-i"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);

    let mut sym = Symbolizer::new(SymbolizerOptions::default());
    let kernel_ok = !sym.kernel().is_restricted() && !sym.kernel().is_empty();
    let mut maps: Vec<Map> = Vec::new();
    let mut per_image: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut mismatches = Vec::new();
    for line in text.lines() {
        if line.contains("PERF_RECORD_MMAP") {
            if let Some(m) = parse_mmap(line) {
                maps.push(m);
            }
            continue;
        }
        let Some((head, dso)) = line.trim().rsplit_once(" (") else {
            continue;
        };
        let dso = dso.trim_end_matches(')');
        let Some((ip, perf_sym)) = head.split_once(' ') else {
            continue;
        };
        let (Some(ip), perf_sym) = (parse_hex(ip), perf_sym.trim()) else {
            continue;
        };
        let frame = if dso.starts_with('/') {
            let Some(m) = maps
                .iter()
                .rev()
                .find(|m| m.path == dso && ip >= m.start && ip - m.start < m.len)
            else {
                continue;
            };
            NormalizedFrame {
                image: ImageRef::File {
                    path: Arc::from(dso),
                    build_id: None,
                },
                addr: ip - m.start + m.pgoff,
            }
        } else if dso == "[kernel.kallsyms]" || (dso.starts_with('[') && dso != "[vdso]") {
            if !kernel_ok {
                continue;
            }
            NormalizedFrame {
                image: ImageRef::Kernel,
                addr: ip,
            }
        } else {
            continue;
        };
        let r = sym.resolve("host", &frame);
        let ours: &str = if r.symbol.starts_with("0x") {
            "[unknown]"
        } else {
            &r.symbol
        };
        let e = per_image.entry(dso.to_string()).or_default();
        e.0 += 1;
        if ours == perf_sym && &*r.image == dso {
            e.1 += 1;
        } else {
            mismatches.push(format!(
                "{dso} {ip:#x}: perf {perf_sym:?}, ours {:?} in {:?}",
                r.symbol, r.image
            ));
        }
    }
    for (img, (n, ok)) in &per_image {
        eprintln!("{img}: {ok}/{n} samples agree with perf");
    }
    for w in sym.warnings() {
        eprintln!("warning: {w}");
    }
    let total: usize = per_image.values().map(|v| v.0).sum();
    assert!(total > 0, "no samples compared");
    assert!(
        per_image.contains_key(bin.to_str().unwrap()),
        "no samples in the fixture binary"
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// The frames of the resolve checks: 2 000 host kernel symbols (3 bytes
/// in) and 3 000 file offsets of this test's own executable, spread
/// around one of its functions (in its code, wherever the build put the
/// code in the file).
fn kernel_and_file_frames(sym: &Symbolizer) -> Vec<NormalizedFrame> {
    let exe = std::env::current_exe().unwrap();
    let path: Arc<str> = exe.to_str().unwrap().into();
    let kernel = sym.kernel().iter().map(|s| s.start).take(2000);
    let here =
        vmscope_testkit::own_file_offset(kernel_and_file_frames as *const () as usize as u64)
            .expect("this function is mapped");
    let first = here.saturating_sub(1500 * 97);
    let files = (0..3000u64).map(|i| NormalizedFrame {
        image: ImageRef::File {
            path: path.clone(),
            build_id: None,
        },
        addr: first + i * 97,
    });
    kernel
        .map(|a| NormalizedFrame {
            image: ImageRef::Kernel,
            addr: a + 3,
        })
        .chain(files)
        .collect()
}

/// The caches never change an answer: resolving every frame once (cold),
/// then 200,000 times in a scattered order (cached), then once more in
/// reverse order with a fresh symbolizer gives the same image and symbol
/// for each frame; every kernel frame is named, and so are some file
/// offsets. Speed is a benchmark (`bench/symbols-throughput`), not a test.
#[test]
fn cached_resolves_give_the_first_answer() {
    let mut sym = Symbolizer::new(SymbolizerOptions::default());
    let frames = kernel_and_file_frames(&sym);
    let cold: Vec<_> = frames.iter().map(|f| sym.resolve("host", f)).collect();
    assert!(sym.cached() > 0, "nothing was cached");
    for i in 0..200_000usize {
        let k = (i * 7919) % frames.len();
        assert_eq!(sym.resolve("host", &frames[k]), cold[k], "{:?}", frames[k]);
    }
    let mut fresh = Symbolizer::new(SymbolizerOptions::default());
    for (f, c) in frames.iter().zip(&cold).rev() {
        assert_eq!(&fresh.resolve("host", f), c, "{f:?}");
    }
    // Each kernel frame is 3 bytes into a symbol, so it has a name; some
    // of the file offsets fall in functions of this executable.
    let kernel = frames
        .iter()
        .filter(|f| matches!(f.image, ImageRef::Kernel))
        .count();
    let named = |file: bool| {
        cold.iter()
            .zip(&frames)
            .filter(|(_, f)| matches!(f.image, ImageRef::File { .. }) == file)
            .filter(|(r, _)| !r.symbol.starts_with("0x"))
            .count()
    };
    eprintln!(
        "named: {} of {kernel} kernel frames, {} of 3000 file offsets",
        named(false),
        named(true)
    );
    assert_eq!(named(false), kernel, "a kernel frame kept its address");
    assert!(named(true) > 0, "no file offset named");
}
