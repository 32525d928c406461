//! `report --format html` in a real browser: Debian's headless Chromium
//! loads the page (from a fresh profile, with networking features off)
//! with no console message at all, its DOM holds the VM names and the top
//! functions, and it renders to a screenshot PNG.
//!
//! Skips (printing why) without chromium (scripts/setup.sh installs it).

mod common;
mod sessions;

use common::vmscope;
use std::path::Path;
use std::process::Command;

/// Chromium's flags for a page that must not reach the network.
fn chromium(profile: &Path) -> Command {
    let mut c = Command::new("chromium");
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // Console messages of the page (and its frames) on stderr.
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

#[test]
fn html_report_loads_cleanly_in_chromium() {
    if !vmscope_testkit::require_tools(&[("chromium", "chromium")]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    sessions::coordinated_session(&db, 0);
    let html = dir.path().join("report.html");
    let out = vmscope()
        .arg("report")
        .arg(&db)
        .args(["--format", "html", "-o"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    // Self-contained: nothing is fetched from elsewhere.
    for needle in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(
            !page.contains(needle),
            "the page refers outside itself: {needle}"
        );
    }
    let url = format!("file://{}", html.display());

    let dom = chromium(&dir.path().join("profile-dom"))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&dom.stderr);
    assert!(dom.status.success(), "chromium failed: {stderr}");
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    let dom = String::from_utf8_lossy(&dom.stdout);
    for vm in ["web", "db"] {
        assert!(
            dom.contains(&format!("<td>{vm}</td>")),
            "VM {vm} not in the DOM"
        );
    }
    for f in [
        "parse_request",
        "send_file",
        "[translated guest code]",
        "default_idle",
    ] {
        assert!(dom.contains(f), "top function {f} not in the DOM");
    }
    assert!(dom.contains("id=\"t-functions\"") && dom.contains("<iframe class=\"flame\""));

    let png = dir.path().join("report.png");
    let shot = chromium(&dir.path().join("profile-shot"))
        .arg("--window-size=1280,1600")
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&shot.stderr);
    assert!(shot.status.success(), "chromium failed: {stderr}");
    assert!(
        !stderr.contains(":CONSOLE"),
        "console messages while rendering: {stderr}"
    );
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 20_000,
        "{} bytes",
        bytes.len()
    );
    if let Some(keep) = std::env::var_os("VMSCOPE_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
}
