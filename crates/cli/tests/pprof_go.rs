//! `report --format pprof` read by Go's own pprof: `go tool pprof -top`
//! lists the same functions with the same event counts as `vmscope report
//! --by symbol`, and `-tagfocus vm=NAME` keeps exactly that VM's functions.
//! (`-noinlines`: pprof otherwise charges a function's own time to the
//! innermost function inlined into it, where `--by symbol` names the
//! function itself; a session recorded here, where vmscope has DWARF,
//! checks that too.)
//!
//! Skips (printing why) without Go.

mod common;
mod sessions;

use common::vmscope;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn go() -> Option<PathBuf> {
    vmscope_testkit::which("go").or_else(|| {
        let p = PathBuf::from("/usr/local/go/bin/go");
        p.exists().then_some(p)
    })
}

/// `go tool pprof -top` rows: function → flat value in ns.
fn pprof_top(go: &Path, file: &Path, extra: &[&str]) -> BTreeMap<String, u64> {
    let out = Command::new(go)
        // Every node (no size cut-off), exact nanoseconds, functions with
        // their inlined callees folded in (as `--by symbol` counts them),
        // and no symbolization: the file carries the names.
        .args([
            "tool",
            "pprof",
            "-top",
            "-nodecount=100000",
            "-nodefraction=0",
            "-unit=ns",
            "-noinlines",
            "-symbolize=none",
            "-sample_index=cpu",
        ])
        .args(extra)
        .arg(file)
        .env("PPROF_TMPDIR", file.parent().unwrap())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "      flat  flat%   sum%        cum   cum%" then rows like
    // "     600ms 22.06% 22.06%      600ms 22.06%  parse_request"
    let mut rows = BTreeMap::new();
    let mut body = false;
    for l in text.lines() {
        if l.trim_start().starts_with("flat") {
            body = true;
            continue;
        }
        if !body || l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        let ns = duration_ns(f[0]).unwrap_or_else(|| panic!("flat value in {l:?}"));
        if ns > 0 {
            rows.insert(f[5..].join(" "), ns);
        }
    }
    rows
}

/// `600ms`, `1.20s`, `40us`, `0` → ns.
fn duration_ns(s: &str) -> Option<u64> {
    let (num, scale) = [
        ("ns", 1.0),
        ("us", 1e3),
        ("µs", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
    ]
    .iter()
    .find_map(|(u, k)| s.strip_suffix(u).map(|n| (n, *k)))
    .unwrap_or((s, 1.0));
    num.parse::<f64>().ok().map(|v| (v * scale).round() as u64)
}

/// `vmscope report --by symbol` event counts (ns) per function.
fn vmscope_symbols(db: &Path, extra: &[&str]) -> BTreeMap<String, u64> {
    let out = vmscope()
        .arg("report")
        .arg(db)
        .args(["--by", "symbol", "-e", "cpu-clock", "--format", "json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["values"][0].as_str().unwrap().to_string(),
                r["event_count"][0].as_u64().unwrap(),
            )
        })
        .filter(|r| r.1 > 0)
        .collect()
}

#[test]
fn go_tool_pprof_reads_the_same_profile() {
    let Some(go) = go() else {
        vmscope_testkit::skip("Go is not installed (scripts/setup.sh installs golang-go)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    sessions::coordinated_session(&db, 0);
    let pb = dir.path().join("s.pb.gz");
    let out = vmscope()
        .arg("report")
        .arg(&db)
        .args(["--format", "pprof", "-o"])
        .arg(&pb)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let theirs = pprof_top(&go, &pb, &[]);
    let ours = vmscope_symbols(&db, &[]);
    eprintln!("go tool pprof -top: {theirs:?}");
    assert_eq!(
        theirs, ours,
        "go tool pprof -top vs vmscope report --by symbol"
    );

    for vm in ["web", "db"] {
        let theirs = pprof_top(&go, &pb, &[&format!("-tagfocus=vm={vm}")]);
        let ours = vmscope_symbols(&db, &["--domain", vm]);
        assert!(!theirs.is_empty());
        assert_eq!(theirs, ours, "-tagfocus vm={vm}");
    }
}

/// A real recording (the demo, with call stacks, symbols and DWARF of this
/// very binary): the same functions and counts, inline frames as pprof
/// lines, and the binary's mapping with its build-id.
#[test]
fn a_recorded_session_reads_the_same_with_inline_frames() {
    let Some(go) = go() else {
        vmscope_testkit::skip("Go is not installed (scripts/setup.sh installs golang-go)");
        return;
    };
    if common::skip_unless(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    common::run_ok(
        vmscope()
            .args(["record", "-F", "999", "-g", "-o"])
            .arg(&db)
            .arg("--")
            .arg(common::bin())
            .args(["demo", "-d", "1"]),
    );
    let pb = dir.path().join("demo.pb.gz");
    common::run_ok(
        vmscope()
            .arg("report")
            .arg(&db)
            .args(["--format", "pprof", "-o"])
            .arg(&pb),
    );
    let theirs = pprof_top(&go, &pb, &[]);
    let ours = vmscope_symbols(&db, &[]);
    assert_eq!(theirs, ours);
    assert!(theirs.contains_key("vmscope_demo_alpha"), "{theirs:?}");
    // With inline frames as pprof lines, part of the demo function's time
    // belongs to a function inlined into it, and the stacks say so.
    let raw = Command::new(&go)
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(&pb)
        .output()
        .unwrap();
    let raw = String::from_utf8_lossy(&raw.stdout);
    // `-raw` prints a location's further lines (its callers inlined into
    // one frame) indented under its first.
    let locations: Vec<&str> = raw
        .lines()
        .skip_while(|l| !l.starts_with("Locations"))
        .take_while(|l| !l.starts_with("Mappings"))
        .collect();
    let inlined = locations
        .iter()
        .filter(|l| l.starts_with("             ") && !l.trim().is_empty())
        .count();
    assert!(
        inlined > 0 && locations.iter().any(|l| l.contains("lib.rs:")),
        "no inline lines or source lines in the profile:\n{}",
        locations.join("\n")
    );
    let build_id = raw
        .lines()
        .find(|l| l.contains(&common::bin().display().to_string()))
        .unwrap_or_else(|| panic!("no mapping of the vmscope binary:\n{raw}"));
    assert!(
        build_id
            .split_whitespace()
            .any(|w| w.len() >= 32 && w.chars().all(|c| c.is_ascii_hexdigit())),
        "no build-id in {build_id}"
    );
}
