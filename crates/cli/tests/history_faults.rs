//! The flight recorder's faults, without a VM (`serve --history` records
//! the host all the same): a DIR that is a file or cannot be written, a
//! second serve on one DIR, another program's files beside the segments,
//! `kill -9` of serve mid-write, a full tmpfs (paused, `/metrics`
//! answering, resumed), `--at` and `--time` outside the history, and a
//! segment damaged by hand. Each bad input: exit 2, one line naming it,
//! nothing of the user's changed. The recorder's own retention, clock
//! step and damaged-segment tests are in crates/history/tests.

mod common;

use common::Reap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");

/// A serve recording into `dir`, killed however the test ends.
fn serve(dir: &Path, listen: &str, extra: &[&str], log: &Path) -> Reap {
    Reap(
        Command::new(VMSCOPE)
            .args(["serve", "--listen", listen, "--history"])
            .arg(dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// Wait until `f` holds (at most 20 s).
fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(mut c: Reap) {
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(c.0.id() as i32, libc::SIGTERM) };
    let _ = c.0.wait();
}

/// Exit 2 and exactly one line on stderr that holds every word.
fn refused(out: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for w in words {
        assert!(err.contains(w), "'{w}' not in: {err}");
    }
}

fn frames(dir: &Path) -> (Vec<serde_json::Value>, String) {
    let out = common::output_within(
        Command::new(VMSCOPE)
            .args(["top", "--replay"])
            .arg(dir)
            .args(["--batch", "--format", "json"]),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_directories_and_a_second_serve_are_refused() {
    if !vmscope_testkit::require_root("the host's /proc as serve samples it") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A file, not a directory: untouched.
    let file = tmp.path().join("afile");
    std::fs::write(&file, b"mine").unwrap();
    let out = Command::new(VMSCOPE)
        .args(["serve", "--listen", "127.0.0.1:0", "--history"])
        .arg(&file)
        .output()
        .unwrap();
    refused(&out, &["afile", "is a file, not a directory"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"mine");
    // A directory that cannot be written (a read-only tmpfs).
    let ro = tmp.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1M,ro", "tmpfs"])
        .arg(&ro)
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let out = Command::new(VMSCOPE)
            .args(["serve", "--listen", "127.0.0.1:0", "--history"])
            .arg(&ro)
            .output()
            .unwrap();
        let _ = Command::new("umount").arg(&ro).status();
        refused(&out, &["ro", "cannot write in it", "Read-only file system"]);
    }
    // Two serves on one DIR: the second names the first.
    let dir = tmp.path().join("h");
    let first = serve(&dir, "127.0.0.1:0", &[], &tmp.path().join("1.log"));
    wait("the first serve never recorded", || {
        vmscope_history::segments(&dir).is_ok_and(|s| !s.is_empty())
    });
    std::thread::sleep(Duration::from_millis(2200));
    let out = Command::new(VMSCOPE)
        .args(["serve", "--listen", "127.0.0.1:0", "--history"])
        .arg(&dir)
        .output()
        .unwrap();
    let pid = first.0.id().to_string();
    stop(first);
    refused(&out, &["already recorded by another vmscope serve", &pid]);
    // --at and --time outside the history name the range it holds.
    let out = Command::new(VMSCOPE)
        .args(["top", "--replay"])
        .arg(&dir)
        .args(["--batch", "--at", "2001-01-01T00:00:00Z"])
        .output()
        .unwrap();
    refused(
        &out,
        &[
            "--at 2001-01-01T00:00:00Z",
            "outside the history",
            "which holds",
        ],
    );
    let out = Command::new(VMSCOPE)
        .arg("report")
        .arg(&dir)
        .args(["--time", "2001-01-01T00:00:00Z-2001-01-01T00:10:00Z"])
        .output()
        .unwrap();
    refused(&out, &["--time", "outside the history", "which holds"]);
    let out = Command::new(VMSCOPE)
        .args(["top", "--replay"])
        .arg(&dir)
        .args(["--batch", "--at", "banana"])
        .output()
        .unwrap();
    refused(&out, &["--at banana", "not a time"]);
}

#[test]
fn kill_9_retention_and_a_damaged_segment() {
    if !vmscope_testkit::require_root("the host's /proc as serve samples it") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("h");
    std::fs::create_dir(&dir).unwrap();
    // Another program's files: never removed, whatever the retention.
    std::fs::write(dir.join("README"), b"the operator's notes").unwrap();
    let fake = dir.join("vmscope-history-00000000-20200101T000000Z.db");
    std::fs::write(&fake, b"looks like a segment, is not one").unwrap();
    let log = tmp.path().join("serve.log");
    let mut s = serve(
        &dir,
        "127.0.0.1:0",
        &["--history-segment", "1s", "--history-max-size", "500K"],
        &log,
    );
    // Until retention removed the first segment, with 3 of its own left.
    wait("retention never removed the first segment", || {
        vmscope_history::segments(&dir).is_ok_and(|s| {
            s.iter().filter(|(n, _)| *n > 1).count() >= 3 && !s.iter().any(|(n, _)| *n == 1)
        })
    });
    std::thread::sleep(Duration::from_millis(700));
    // kill -9 mid-write.
    s.0.kill().unwrap();
    let _ = s.0.wait();
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(
        err.contains("not removing") && err.contains("00000000"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.join("README")).unwrap(),
        b"the operator's notes"
    );
    assert_eq!(
        std::fs::read(&fake).unwrap(),
        b"looks like a segment, is not one"
    );
    // Retention removed the oldest of its own: the first is gone.
    let segs = vmscope_history::segments(&dir).unwrap();
    assert!(!segs.iter().any(|(n, _)| *n == 1), "{segs:?}");
    // Every segment reads (the fake one is skipped with one line), the
    // open one up to its last interval.
    let (fr, err) = frames(&dir);
    assert!(fr.len() >= 3, "{} intervals", fr.len());
    assert_eq!(
        err.lines().filter(|l| l.contains("skipped")).count(),
        1,
        "{err}"
    );
    let times: Vec<&str> = fr.iter().map(|f| f["at"].as_str().unwrap()).collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted);
    // A segment damaged by hand: skipped with one line, the rest replays.
    let segs = vmscope_history::segments(&dir).unwrap();
    let victim = &segs[segs.len() / 2].1;
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[..16].copy_from_slice(b"damaged by hand!");
    std::fs::write(victim, bytes).unwrap();
    let (fr2, err) = frames(&dir);
    assert_eq!(
        err.lines().filter(|l| l.contains("skipped")).count(),
        2,
        "{err}"
    );
    assert!(err.contains(&victim.display().to_string()), "{err}");
    assert!(
        !fr2.is_empty() && fr2.len() < fr.len(),
        "{} then {}",
        fr.len(),
        fr2.len()
    );
}

#[test]
fn a_full_file_system_pauses_and_resumes_the_history() {
    if !vmscope_testkit::require_root("a tmpfs mount") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3M", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        vmscope_testkit::skip("cannot mount a tmpfs");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Unmount(&mnt);
    let dir = mnt.join("h");
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let log = tmp.path().join("serve.log");
    // Ended before the tmpfs is unmounted, also when the test fails.
    struct Serve(Option<Reap>);
    impl Drop for Serve {
        fn drop(&mut self) {
            if let Some(c) = self.0.take() {
                stop(c);
            }
        }
    }
    let mut s = Serve(Some(serve(&dir, &addr, &["--history-segment", "2s"], &log)));
    let metric = |name: &str| -> Option<f64> {
        let m = common::http_get(&addr, "/metrics")?;
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    wait("no interval recorded", || {
        metric("vmscope_history_intervals_total").is_some_and(|v| v >= 2.0)
    });
    // Fill the file system.
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 64 << 10];
        while f.write_all(&chunk).and_then(|()| f.flush()).is_ok() {}
    }
    wait("the history never said it paused", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("history: paused"))
    });
    assert_eq!(
        metric("vmscope_history_paused"),
        Some(1.0),
        "/metrics while paused"
    );
    let dropped = metric("vmscope_history_dropped_total").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        metric("vmscope_history_dropped_total").unwrap() > dropped,
        "intervals not counted as dropped"
    );
    std::fs::remove_file(&filler).unwrap();
    wait("the history never resumed", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("history: resumed"))
    });
    assert_eq!(metric("vmscope_history_paused"), Some(0.0));
    let before = metric("vmscope_history_intervals_total").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(metric("vmscope_history_intervals_total").unwrap() > before);
    if let Some(c) = s.0.take() {
        stop(c);
    }
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(err.matches("history: paused").count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (fr, _) = frames(&dir);
    assert!(fr.len() >= 3);
}

/// The processes whose command line holds `marker` (a test's own
/// temporary path).
fn pids_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains(marker) && c.contains("top")
            })
        })
        .collect()
}

#[test]
fn a_closed_terminal_ends_the_replay_and_the_live_view() {
    if !vmscope_testkit::require_root("the host's /proc as serve samples it")
        || !vmscope_testkit::require_tools(&[("tmux", "tmux")])
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("h");
    let log = tmp.path().join("serve.log");
    let s = serve(&dir, "127.0.0.1:0", &[], &log);
    wait("serve never recorded", || {
        vmscope_history::segments(&dir).is_ok_and(|s| !s.is_empty())
    });
    std::thread::sleep(Duration::from_millis(5000));
    stop(s);
    // The replay, then the live view, each found by the test's directory
    // in its command line (the live view run through a link there).
    let marker = tmp.path().display().to_string();
    let live = tmp.path().join("vmscope");
    std::os::unix::fs::symlink(VMSCOPE, &live).unwrap();
    for (what, cmd) in [
        (
            "the replay",
            format!("{VMSCOPE} top --replay {}", dir.display()),
        ),
        ("the live view", format!("{} top", live.display())),
    ] {
        let term = common::Tmux::start("vmscope-hangup", 120, 30, &cmd);
        wait(&format!("{what} never drew its screen"), || {
            term.screen().contains("CPU")
        });
        if what == "the replay" {
            // Keys typed together (read by crossterm in one read) each
            // act at once: G to the last interval, then three steps back.
            let position = || common::replay_position(&term.screen());
            term.keys("G");
            wait("G never reached the last interval", || {
                position().is_some_and(|(n, m)| n == m && m > 3)
            });
            let (_, m) = position().unwrap();
            term.keys("bbb");
            wait(&format!("bbb never stepped from {m} to {}", m - 3), || {
                position().is_some_and(|(n, _)| n == m - 3)
            });
        }
        let pids = pids_with(&marker);
        assert!(!pids.is_empty(), "{what}: no process found");
        // The terminal goes away: the window closed.
        term.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !pids_with(&marker).is_empty() {
            if Instant::now() >= deadline {
                for p in pids_with(&marker) {
                    // SAFETY: a signal to a process this test started.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
                panic!("{what} did not end within 5 s of its terminal hanging up");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
