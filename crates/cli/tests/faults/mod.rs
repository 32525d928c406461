//! The fault table's machinery (docs/architecture.md §10): a row is a
//! command run in a scratch directory holding the fixtures, with its exit
//! code, words that must (and must not) be on stderr and stdout, and files
//! that must be unchanged (type and bytes) or absent afterwards; every row
//! also checks for panics, a single error line and OS error text printed
//! once. `bad_input.rs` holds round 1's rows, `bad_input_2.rs` round 2's.
#![allow(dead_code)]

use super::common::*;
use std::path::Path;
use std::path::PathBuf;

/// One row of the fault table.
pub struct Row {
    id: &'static str,
    args: Vec<String>,
    /// File fed to standard input.
    stdin: Option<&'static str>,
    code: i32,
    words: Vec<&'static str>,
    not_words: Vec<&'static str>,
    stdout_words: Vec<&'static str>,
    unchanged: Vec<&'static str>,
    absent: Vec<&'static str>,
    root: bool,
    /// Refused before the work starts: done within this many seconds,
    /// where running the work first would take minutes.
    within_s: Option<u64>,
}

pub fn row(id: &'static str, args: &str, code: i32, words: &[&'static str]) -> Row {
    Row {
        id,
        args: shell_words(args),
        stdin: None,
        code,
        words: words.to_vec(),
        not_words: Vec::new(),
        stdout_words: Vec::new(),
        unchanged: Vec::new(),
        absent: Vec::new(),
        root: false,
        within_s: None,
    }
}

impl Row {
    pub fn unchanged(mut self, files: &[&'static str]) -> Row {
        self.unchanged.extend_from_slice(files);
        self
    }
    pub fn absent(mut self, files: &[&'static str]) -> Row {
        self.absent.extend_from_slice(files);
        self
    }
    pub fn not_words(mut self, w: &[&'static str]) -> Row {
        self.not_words.extend_from_slice(w);
        self
    }
    pub fn stdout(mut self, w: &[&'static str]) -> Row {
        self.stdout_words.extend_from_slice(w);
        self
    }
    pub fn stdin(mut self, f: &'static str) -> Row {
        self.stdin = Some(f);
        self
    }
    pub fn root(mut self) -> Row {
        self.root = true;
        self
    }
    pub fn within(mut self, secs: u64) -> Row {
        self.within_s = Some(secs);
        self
    }
}

/// Split on spaces; single quotes group (enough for the table).
pub fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// What a file is, for "unchanged": its type and, for a regular file, its bytes.
pub fn snapshot(p: &Path) -> String {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(p) {
        Err(_) => "absent".into(),
        Ok(m) => {
            let t = m.file_type();
            if t.is_symlink() {
                format!("link to {:?}", std::fs::read_link(p).ok())
            } else if t.is_char_device() || t.is_block_device() {
                use std::os::unix::fs::MetadataExt;
                format!("device {}", m.rdev())
            } else if t.is_fifo() {
                "fifo".into()
            } else if t.is_dir() {
                "dir".into()
            } else {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::fs::read(p).unwrap_or_default().hash(&mut h);
                format!("file {} bytes #{:x} mode {:o}", m.len(), h.finish(), {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode()
                })
            }
        }
    }
}

/// The scratch directory with every fixture the rows use.
pub fn fixtures(dir: &Path) {
    let fixture = fixture_dir().join("perf/quipper.perf.data.callgraph-3.8");
    std::fs::copy(&fixture, dir.join("perf1.data")).unwrap();
    run_ok(
        vmscope()
            .current_dir(dir)
            .args(["import", "perf1.data", "-o", "good.db"]),
    );
    let w = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    w("notes.txt", b"my notes, not a session\n");
    w(
        "user-nic.toml",
        b"name = \"webu\"\n[[vm]]\nname = \"webu0\"\n[[vm.nic]]\nkind = \"user\"\n",
    );
    w("notes2.txt", b"more notes\n");
    w("notes.bak", b"a backup of notes\n");
    w("force.txt", b"replace me\n");
    std::fs::copy("/bin/ls", dir.join("myls")).unwrap();
    let mut rnd = Vec::with_capacity(100_000);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        rnd.push(x as u8);
    }
    w("rand.data", &rnd);
    w("rand.db", &rnd[..65536]);
    w("zero.db", b"");
    let perf = std::fs::read(&fixture).unwrap();
    w("pt_0.data", b"");
    w("pt_100.data", &perf[..100]);
    w("pt_4096.data", &perf[..4096]);
    // What a SIGKILLed `perf record` leaves: data size 0 in the header.
    let mut killed = perf.clone();
    killed[48..56].copy_from_slice(&0u64.to_le_bytes());
    w("killed.data", &killed);
    let mut attr = perf.clone();
    attr[16..24].copy_from_slice(&(i64::MAX as u64).to_le_bytes());
    w("corrupt3.data", &attr);
    let good = std::fs::read(dir.join("good.db")).unwrap();
    w("trunc.db", &good[..20000]);
    std::fs::copy(bin(), dir.join("elf.db")).unwrap();
    std::fs::copy(dir.join("good.db"), dir.join("good2.db")).unwrap();
    std::fs::create_dir(dir.join("TMP")).unwrap();
    std::fs::create_dir(dir.join("specs")).unwrap();
    std::fs::hard_link(dir.join("perf1.data"), dir.join("perf1-link.data")).unwrap();
    std::os::unix::fs::symlink("notes.txt", dir.join("notes-link")).unwrap();
    w("not-exec.sh", b"#!/bin/sh\necho hi\n");
    // /sys trees with garbage in a NUMA node's files (topo rows).
    for (tree, cpulist, meminfo) in [
        (
            "numa-bad-cpus",
            "0-x\n",
            "Node 0 MemTotal: 1024 kB\nNode 0 MemFree: 512 kB\n",
        ),
        (
            "numa-bad-mem",
            "0-1\n",
            "Node 0 MemTotal: many kB\nNode 0 MemFree: 512 kB\n",
        ),
    ] {
        std::fs::create_dir_all(dir.join(tree).join("devices/system/node/node0")).unwrap();
        w(
            &format!("{tree}/devices/system/node/node0/cpulist"),
            cpulist.as_bytes(),
        );
        w(
            &format!("{tree}/devices/system/node/node0/meminfo"),
            meminfo.as_bytes(),
        );
    }
    let fifo = std::ffi::CString::new(dir.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a valid C string.
    assert_eq!(unsafe { libc_mkfifo(fifo.as_ptr(), 0o644) }, 0);
    // A text file where a session's partial file would go.
    w("blocked.db.partial", b"someone's file\n");
    // An SQLite database of another program.
    rusqlite::Connection::open(dir.join("empty.sqlite"))
        .unwrap()
        .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    // Sessions damaged after they were written.
    for (name, sql) in [
        ("h01.db", "DROP TABLE samples"),
        ("h02.db", "DELETE FROM meta"),
        ("h03.db", "DELETE FROM events"),
        ("h05.db", "UPDATE samples SET samples = 'abc'"),
        ("h06.db", "UPDATE samples SET period = 0, samples = 0"),
        (
            "h07.db",
            "INSERT OR REPLACE INTO meta VALUES ('cpus', 'banana'), ('duration_s', 'banana')",
        ),
        ("h08.db", "UPDATE samples SET event = 42"),
        ("h09.db", "DROP TABLE meta"),
        (
            "h10.db",
            "UPDATE samples SET samples = 9223372036854775807, period = 9223372036854775807",
        ),
        ("h11.db", "DELETE FROM domains"),
        ("h12.db", "UPDATE samples SET context = 'bogus-ctx'"),
    ] {
        let p = dir.join(name);
        std::fs::copy(dir.join("good.db"), &p).unwrap();
        let c = rusqlite::Connection::open(&p).unwrap();
        c.execute_batch(sql).unwrap();
        drop(c);
    }
    for (name, text) in [
        ("l01.toml", "name = \"x\"\n\n[[vm]\nname = \"a\"\n"),
        ("l02.toml", "name = \"x\"\n"),
        (
            "l04.toml",
            "name = \"x\"\n\n[[vm]]\nname = \"a\"\nvcpus = 1\nmemory_mib = -256\n",
        ),
        (
            "l09.toml",
            "name = \"probe;rm -rf TMP`id`$(id)\"\n\n[[vm]]\nname = \"a\"\n",
        ),
        (
            "l10.toml",
            "name = \"../../probeJ\"\n\n[[vm]]\nname = \"a\"\n",
        ),
        (
            "l13.toml",
            "name = \"x\"\n\n[[vm]]\nname = \"a\"\nbogus_key = 1\n",
        ),
        (
            "l14.toml",
            "name = \"x\"\nmanager = \"xen\"\n\n[[vm]]\nname = \"a\"\n",
        ),
    ] {
        w(&format!("specs/{name}"), text.as_bytes());
    }
}

extern "C" {
    #[link_name = "mkfifo"]
    pub fn libc_mkfifo(path: *const std::ffi::c_char, mode: u32) -> i32;
    #[link_name = "kill"]
    pub fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Run every row in a scratch directory holding the fixtures; fails
/// listing each row that did not hold.
pub fn run_rows(rows: Vec<Row>) {
    run_rows_with(rows, |_| {});
}

/// [`run_rows`] with more fixtures made by `more` in the scratch directory.
pub fn run_rows_with(rows: Vec<Row>, more: impl Fn(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fixtures(d);
    more(d);
    let run = d.join("run");
    std::fs::create_dir(&run).unwrap();
    let root = is_root();
    let mut skipped = Vec::new();
    let mut failures = Vec::new();
    for r in rows {
        if r.root && !root {
            skipped.push(r.id);
            continue;
        }
        let watch: Vec<PathBuf> = r.unchanged.iter().map(|f| d.join(f)).collect();
        let before: Vec<String> = watch.iter().map(|p| snapshot(p)).collect();
        let mut cmd = vmscope();
        cmd.current_dir(d)
            .args(&r.args)
            .env("VMSCOPE_RUN", &run)
            .env("VMSCOPE_CACHE", d.join("cache"));
        match r.stdin {
            Some(f) => cmd.stdin(std::fs::File::open(d.join(f)).unwrap()),
            None => cmd.stdin(std::process::Stdio::null()),
        };
        let t = std::time::Instant::now();
        let out = cmd.output().unwrap();
        let took = t.elapsed();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let mut bad = Vec::new();
        if let Some(s) = r.within_s {
            if took.as_secs() >= s {
                bad.push(format!(
                    "took {took:?}: not refused before the work (limit {s} s)"
                ));
            }
        }
        if out.status.code() != Some(r.code) {
            bad.push(format!("exit {:?}, want {}", out.status.code(), r.code));
        }
        for w in &r.words {
            if !err.contains(w) {
                bad.push(format!("stderr lacks {w:?}"));
            }
        }
        for w in &r.not_words {
            if err.contains(w) {
                bad.push(format!("stderr has {w:?}"));
            }
        }
        for w in &r.stdout_words {
            if !stdout.contains(w) {
                bad.push(format!("stdout lacks {w:?}"));
            }
        }
        if err.contains("panicked") {
            bad.push("panic".into());
        }
        if err.lines().filter(|l| l.contains("error:")).count() > 1 {
            bad.push("more than one error line".into());
        }
        for l in err.lines() {
            if l.matches("(os error").count() > 1 {
                bad.push(format!("OS error text twice: {l}"));
            }
        }
        for (p, b) in watch.iter().zip(&before) {
            let now = snapshot(p);
            if &now != b {
                bad.push(format!("{} changed: {b} -> {now}", p.display()));
            }
        }
        for f in &r.absent {
            if d.join(f).exists() {
                bad.push(format!("{f} was left behind"));
            }
        }
        if !bad.is_empty() {
            failures.push(format!(
                "{} (vmscope {}): {}\n    stderr: {}",
                r.id,
                r.args.join(" "),
                bad.join("; "),
                err.trim().replace('\n', "\n            ")
            ));
        }
    }
    if !skipped.is_empty() {
        skip(&format!(
            "fault table rows {} record and need root",
            skipped.join(", ")
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of the fault table's rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
