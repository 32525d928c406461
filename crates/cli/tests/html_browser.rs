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

/// The attribute `name` of the element starting at `tag` (`<x a="..."`).
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let head = &tag[..tag.find('>')?];
    let at = head.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&head[at..at + head[at..].find('"')?])
}

/// The text of the element starting at `tag`, up to the next `<`.
fn text(tag: &str) -> &str {
    let start = tag.find('>').map_or(0, |i| i + 1);
    let rest = &tag[start..];
    &rest[..rest.find('<').unwrap_or(rest.len())]
}

/// One line chart as the browser holds it.
#[derive(Debug)]
struct Chart {
    title: String,
    y_label: String,
    /// (pixel y, value) of each y-axis tick.
    ticks: Vec<(f64, f64)>,
    /// (name, pixel y of each point, value of each point).
    lines: Vec<(String, Vec<f64>, Vec<f64>)>,
}

impl Chart {
    /// The value at pixel height `y`, read off the axis ticks.
    fn value_at(&self, y: f64) -> f64 {
        let (a, b) = (self.ticks[0], self.ticks[self.ticks.len() - 1]);
        a.1 + (y - a.0) * (b.1 - a.1) / (b.0 - a.0)
    }
}

fn charts(dom: &str) -> Vec<Chart> {
    dom.split("<svg")
        .skip(1)
        .filter_map(|svg| {
            let svg = &svg[..svg.find("</svg>")?];
            let mut chart = Chart {
                title: String::new(),
                y_label: String::new(),
                ticks: Vec::new(),
                lines: Vec::new(),
            };
            for t in svg.split("<text").skip(1) {
                if attr(t, "font-size") == Some("15") {
                    chart.title = text(t).replace("&#39;", "'");
                } else if attr(t, "transform").is_some_and(|v| v.contains("rotate(-90)")) {
                    chart.y_label = text(t).to_string();
                } else if attr(t, "text-anchor") == Some("end") {
                    let y: f64 = attr(t, "y").unwrap().parse().unwrap();
                    // Tick labels sit 4 px below their grid line.
                    chart.ticks.push((y - 4.0, text(t).parse().unwrap()));
                }
            }
            for l in svg.split("<polyline").skip(1) {
                let ys = attr(l, "points")?
                    .split(' ')
                    .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
                    .collect();
                let values = attr(l, "data-values")?
                    .split(' ')
                    .map(|v| v.parse().unwrap())
                    .collect();
                let name = l[l.find("<title>")? + 7..l.find("</title>")?].to_string();
                chart.lines.push((name, ys, values));
            }
            (!chart.lines.is_empty()).then_some(chart)
        })
        .collect()
}

/// `report DB --format html` written in `dir`, as headless Chromium
/// builds its DOM.
fn html_dom(dir: &std::path::Path, db: &std::path::Path) -> String {
    let html = dir.join("report.html");
    let out = vmscope()
        .arg("report")
        .arg(db)
        .args(["--format", "html", "-o"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = chromium(&dir.join("profile"))
        .arg("--dump-dom")
        .arg(format!("file://{}", html.display()))
        .output()
        .unwrap();
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    String::from_utf8_lossy(&dom.stdout).into_owned()
}

/// Every chart of a session whose rates are known says its unit and draws
/// each known value at the height the axis gives it; a partial last
/// second or profiler step is neither a drop to zero nor a spike.
#[test]
fn html_report_charts_show_the_known_rates() {
    if !vmscope_testkit::require_tools(&[("chromium", "chromium")]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    sessions::known_rates_session(&db);
    let charts = charts(&html_dom(dir.path(), &db));
    let mut seen = Vec::new();
    for &(title, unit, line, want) in sessions::KNOWN_RATES {
        let chart = charts
            .iter()
            .find(|c| {
                c.title.starts_with(title)
                    && c.y_label == unit
                    && c.lines.iter().any(|l| l.0 == line)
            })
            .unwrap_or_else(|| {
                panic!("no chart '{title}…' in {unit} with a line '{line}': {charts:#?}")
            });
        let (_, ys, values) = chart.lines.iter().find(|l| l.0 == line).unwrap();
        assert!(values.len() >= 2, "{line}: {values:?}");
        for (y, v) in ys.iter().zip(values) {
            assert!(
                (v - want).abs() <= want * 1e-3,
                "{title} {line}: {v}, not {want}: {values:?}"
            );
            let drawn = chart.value_at(*y);
            assert!(
                (drawn - want).abs() <= chart.ticks.last().unwrap().1 * 0.01,
                "{title} {line}: drawn at {drawn}, not {want}"
            );
        }
        seen.push((chart.title.clone(), chart.y_label.clone(), line.to_string()));
    }
    // No chart or line the session does not explain.
    for c in &charts {
        for l in &c.lines {
            assert!(
                seen.contains(&(c.title.clone(), c.y_label.clone(), l.0.clone())),
                "an unexpected line '{}' in '{}' ({})",
                l.0,
                c.title,
                c.y_label
            );
        }
    }
}

/// An accounting session with the waited-behind split: the report prints
/// who waited behind whom, and the HTML report's matrix, as Chromium
/// builds it, has one row per VM and one cell per culprit with the known
/// seconds a second; PNG in `$VMSCOPE_KEEP/wait-matrix.png` when set.
#[test]
fn who_waited_behind_whom_as_a_table_and_a_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("acc.db");
    sessions::wait_session(&db);
    let text = vmscope().arg("report").arg(&db).output().unwrap();
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("web ")
            && l.contains("db vCPU 0")
            && l.contains("0.400000")
            && l.ends_with(" 80.0%")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("web ") && l.contains(" io ") && l.contains("idle")),
        "{text}"
    );
    let json = vmscope()
        .arg("report")
        .arg(&db)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let waits = v["intervals"][0]["waits"].as_array().unwrap();
    assert_eq!(waits.len(), 4, "{waits:?}");
    if !vmscope_testkit::require_tools(&[("chromium", "chromium")]) {
        return;
    }
    let dom = html_dom(dir.path(), &db);
    let at = dom
        .find("Who waited behind whom")
        .unwrap_or_else(|| panic!("no matrix in the page"));
    let svg = &dom[at..at + dom[at..].find("</svg>").unwrap()];
    // Each cell's tooltip: "WAITER behind CULPRIT: VALUE UNIT".
    for (cell, want) in [
        ("web behind db vCPU 0", "0.4"),
        ("web behind host backup (pid 812)", "0.1"),
        ("db behind web vCPU 0", "0.3"),
        ("web behind all", "0.5"),
    ] {
        assert!(
            svg.contains(&format!("<title>{cell}: {want} ")),
            "no cell '{cell}' of {want} in {svg}"
        );
    }
    assert!(
        !svg.contains("idle"),
        "an I/O thread's wait in the vCPU matrix"
    );
    if let Ok(keep) = std::env::var("VMSCOPE_KEEP") {
        let png = Path::new(&keep).join("wait-matrix.png");
        let _ = chromium(&dir.path().join("profile-shot"))
            .arg(format!("--screenshot={}", png.display()))
            .arg("--window-size=900,1400")
            .arg(format!(
                "file://{}",
                dir.path().join("report.html").display()
            ))
            .output();
    }
}
