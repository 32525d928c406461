//! Issue 32: the second round of bad inputs and faults
//! (its sweep of bad inputs) as rows of the fault table
//! (`faults`), plus the cases that need a mount, another user or a signal.
//! Row ids are the sweep's (`r2.` before them); rows of our own for the
//! outputs and limits added with the fixes end in `+`.

mod common;
mod faults;
use common::*;
use faults::*;
use std::path::Path;

/// Round 2's fixtures beside round 1's.
fn fixtures2(d: &Path) {
    let w = |name: &str, bytes: &[u8]| {
        if let Some(p) = d.join(name).parent() {
            std::fs::create_dir_all(p).unwrap();
        }
        std::fs::write(d.join(name), bytes).unwrap();
    };
    // Files of the user's that an -o must not replace (rf11).
    w("f.md", b"# My thesis notes\n");
    w("f.py", b"print('mine')\n");
    w("f.png", b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR my picture");
    w("f.zip", b"PK\x03\x04 my archive");
    w("f.csv", b"name,value\nmine,1\n");
    w("target.txt", b"target content\n");
    std::os::unix::fs::symlink("target.txt", d.join("link.txt")).unwrap();
    // Streams that can never be a perf.data (im12, im13).
    w("zeros", &vec![0u8; 1 << 20]);
    w("yes.txt", &b"y\n".repeat(100_000));
    // /sys trees whose CPU lists would expand to gigabytes (tps_big, tps_mid).
    for (tree, list) in [("sys_big", "0-4294967295\n"), ("sys_mid", "0-100000000\n")] {
        w(
            &format!("{tree}/devices/system/node/node0/cpulist"),
            list.as_bytes(),
        );
        w(
            &format!("{tree}/devices/system/node/node0/meminfo"),
            b"Node 0 MemTotal: 1000 kB\nNode 0 MemFree: 500 kB\n",
        );
    }
    std::fs::create_dir(d.join("cls")).unwrap();
    // A target file for a one-block-size I/O sweep (bn28).
    w("bio.img", &vec![0u8; 4 << 20]);
    // A spec of 2 MiB of comments (lbs_huge), and one whose VM has the
    // validator's old minimum of memory (lb7).
    let mut big = b"name = \"big\"\n[[vm]]\nname = \"a\"\n".to_vec();
    while big.len() < 2 << 20 {
        big.extend_from_slice(b"# a comment line of a spec that is far too long\n");
    }
    w("specs/big.toml", &big);
    w(
        "specs/one64.toml",
        b"name = \"one64\"\n[[vm]]\nname = \"a\"\nmemory_mib = 64\n",
    );
    // What a user keeps where a benchmark would write (bo10, bo11).
    w("ovh/overhead-host-only-1.db", b"my precious notes\n");
    w("wd/host-only-1.log", b"my log, not a profiler's\n");
}

fn table2() -> Vec<Row> {
    let mut rows = vec![
        // serve
        row(
            "r2.sv50",
            "serve --listen 127.0.0.1:0 --profile --profile-frequency 1000000",
            2,
            &["perf_event_max_sample_rate"],
        )
        .not_words(&["lower -F"])
        .root()
        .within(30),
        row(
            "r2.sv51",
            "serve --listen 127.0.0.1:0 --profile --profile-window 100000000",
            2,
            &["--profile-window 100000000: at most 3600 s"],
        )
        .within(5),
        // top
        row(
            "r2.t20",
            "top --format json -n 1",
            2,
            &["options of batch mode", "--batch"],
        )
        .within(5),
        row("r2.t23", "top -b -n 0", 2, &["-n 0 would print nothing"]).within(5),
        // compare
        row(
            "r2.c02",
            "compare good.db",
            2,
            &["a base session and at least one other"],
        )
        .not_words(&["<BASE OTHER> <BASE OTHER>"]),
        row(
            "r2.c19",
            "compare good.db good2.db --by class --classes /nonexistent.toml",
            2,
            &["/nonexistent.toml: cannot read the class rules"],
        )
        .not_words(&[":1:1"]),
        row(
            "r2.rf12",
            "compare good.db good2.db --svg notes2.txt",
            2,
            &["notes2.txt is a text file, not a file vmscope made", "--force"],
        )
        .unchanged(&["notes2.txt"]),
        // class rules
        row(
            "r2.cls_dir",
            "report good.db --by class --classes cls",
            2,
            &["cls: cannot read the class rules", "directory"],
        )
        .not_words(&[":1:1"]),
        row(
            "r2.cls_devzero",
            "report good.db --by class --classes /dev/zero",
            2,
            &["/dev/zero", "character device"],
        )
        .within(5),
        // report -o
        row("r2.rf06", "report good.db --format pprof -o -", 0, &[]).absent(&["-"]),
        row(
            "r2.rf14",
            "report good.db --format csv -o link.txt",
            2,
            &["link.txt is a text file", "--force"],
        )
        .unchanged(&["target.txt", "link.txt"]),
        row(
            "r2.cl9",
            "report good.db --callers main --format flamegraph -o cl9.svg",
            2,
            &["--callers main", "table, JSON or CSV"],
        )
        .absent(&["cl9.svg"])
        .within(5),
        row(
            "r2.side+",
            "report good.db --side-by-side host --format csv",
            2,
            &["--side-by-side prints a table or JSON"],
        ),
        // sessions
        row("r2.ss15", "report fifo", 2, &["fifo", "FIFO"]).within(5),
        // import
        row(
            "r2.im9",
            "import perf1.data -o /dev/stdout",
            2,
            &["/dev/stdout is a FIFO"],
        )
        .not_words(&["pipe:["]),
        row(
            "r2.im12",
            "import - -o im12.db",
            2,
            &["standard input: not a perf.data file (bad magic"],
        )
        .stdin("zeros")
        .absent(&[
            "im12.db",
            "im12.db.lock",
            "im12.db.partial",
            "im12.db.partial-reserve",
        ])
        .within(5),
        row(
            "r2.im13",
            "import - -o im13.db",
            2,
            &["standard input: not a perf.data file (bad magic", "\"y\\ny\\ny\\ny\\n\""],
        )
        .stdin("yes.txt")
        .absent(&["im13.db", "im13.db.lock", "im13.db.partial"])
        .within(5),
        // topo with hostile /sys trees
        row(
            "r2.tps_big",
            "topo --sys-root sys_big --no-qmp",
            2,
            &["4294967295", "65536"],
        )
        .within(5),
        row(
            "r2.tps_mid",
            "topo --sys-root sys_mid --no-qmp",
            2,
            &["100000000", "65536"],
        )
        .within(5),
        // lab specs
        row(
            "r2.lbs_devzero",
            "lab up /dev/zero",
            2,
            &["/dev/zero", "character device"],
        )
        .within(5),
        row(
            "r2.lbs_huge",
            "lab up specs/big.toml",
            2,
            &["specs/big.toml", "larger than 1 MiB"],
        )
        .within(5),
        row(
            "r2.lb7",
            "lab up specs/one64.toml",
            2,
            &["memory_mib", "64 MiB is less than 128 MiB"],
        )
        .within(5),
        // An agent given by hand is the one used, or refused: never
        // replaced by one found elsewhere.
        row(
            "r2.lb_agent_missing",
            "lab up --run-dir labrun --agent /nonexistent",
            2,
            &["--agent /nonexistent", "no such file"],
        )
        .root()
        .within(5),
        row(
            "r2.lb_agent_dynamic",
            "lab up --run-dir labrun --agent /bin/ls",
            2,
            &["--agent /bin/ls", "not a statically linked"],
        )
        .root()
        .within(5),
        // benchmarks
        row(
            "r2.bo11",
            "bench overhead --profilers none,host-only --seconds 1 --repeat 1 --max-repeat 1 --warmup 0 --record ovh --work-dir wd2",
            2,
            &["overhead-host-only-1.db is a text file", "--force"],
        )
        .unchanged(&["ovh/overhead-host-only-1.db"])
        .within(20),
        row(
            "r2.bo10",
            "bench overhead --profilers none,host-only --seconds 1 --repeat 1 --max-repeat 1 --warmup 0 --work-dir wd",
            2,
            &["host-only-1.log is a text file", "--force"],
        )
        .unchanged(&["wd/host-only-1.log"])
        .within(20),
        row(
            "r2.bo8",
            "bench overhead --profilers none,none,perf",
            2,
            &["`none` is given twice"],
        )
        .within(5),
        row(
            "r2.bn28",
            "bench io --target host:bio.img --bs 4k --size 1M --mode direct-read --repeat 1 --max-repeat 1 --warmup 0 --out-dir okcharts",
            0,
            &[],
        )
        .stdout(&["no chart written to okcharts"])
        .absent(&["okcharts"]),
    ];
    // rf08/rf11: no format replaces a file of the user's, whatever its
    // name; each format replaces its own earlier output (`again.*`, twice).
    for (fmt, own) in [
        ("html", "again.html"),
        ("flamegraph", "again.svg"),
        ("pprof", "again.pb.gz"),
        ("collapsed", "again.txt"),
        ("csv", "again.csv"),
        ("json", "again.json"),
        ("table", "again.table"),
    ] {
        for f in ["f.md", "f.py", "f.png", "f.zip", "f.csv"] {
            let args: &'static str =
                Box::leak(format!("report good.db --format {fmt} -o {f}").into_boxed_str());
            rows.push(
                row("r2.rf11", args, 2, &["not a file vmscope made", "--force"])
                    .unchanged(&[f])
                    .within(10),
            );
        }
        let again: &'static str =
            Box::leak(format!("report good.db --format {fmt} -o {own}").into_boxed_str());
        rows.push(row("r2.rf11+", again, 0, &[]));
        rows.push(row("r2.rf11+", again, 0, &[]).not_words(&["refusing"]));
    }
    rows
}

#[test]
fn fault_table_round_2() {
    run_rows_with(table2(), fixtures2);
}

/// ss1, ss3, ss5: a session recorded with symbols left for the first read
/// (the default) is read from a read-only mount and by another user, with
/// its symbols resolved in a copy and a word on how to keep them; a file
/// that user may not read says so, not "file too short".
#[test]
fn sessions_on_read_only_media_and_of_other_users() {
    if skip_unless(&["setpriv", "mount"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ro = d.join("ro");
    std::fs::create_dir(&ro).unwrap();
    let db = ro.join("unres.db");
    run_ok(vmscope().args(["record", "-a", "-d", "1", "-o"]).arg(&db));
    let nw = d.join("nw");
    std::fs::create_dir(&nw).unwrap();
    let other = nw.join("other.db");
    std::fs::copy(&db, &other).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for (p, mode) in [(d, 0o755), (&nw, 0o755), (&other, 0o644)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    // A read-only bind mount of the directory.
    let mounted = std::process::Command::new("mount")
        .args(["--bind"])
        .arg(&ro)
        .arg(&ro)
        .status()
        .unwrap()
        .success()
        && std::process::Command::new("mount")
            .args(["-o", "remount,ro,bind"])
            .arg(&ro)
            .status()
            .unwrap()
            .success();
    if !mounted {
        skip_platform("a read-only bind mount could not be made");
        return;
    }
    let out = vmscope()
        .arg("report")
        .arg(&db)
        .args(["-n", "3"])
        .output()
        .unwrap();
    let _ = std::process::Command::new("umount").arg(&ro).status();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "read-only: {err}");
    assert!(err.contains("in a temporary copy"), "{err}");
    assert!(err.contains("--symbolize now"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("# session"));
    // Another user, in a directory it may not write.
    let as_nobody = |p: &Path| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin())
            .arg("report")
            .arg(p)
            .args(["-n", "3"])
            .output()
            .unwrap()
    };
    let out = as_nobody(&other);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "another user: {err}");
    assert!(err.contains("in a temporary copy"), "{err}");
    // A file that user may not read at all.
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = as_nobody(&other);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!err.contains("too short"), "{err}");
}
