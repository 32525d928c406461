//! The frame's rendering against golden files (batch text, JSON, and the
//! terminal view drawn on ratatui's test backend), and what the keys do.
//! `VMSCOPE_BLESS=1` rewrites the golden files after an intended change.

use super::*;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

fn fun(context: &str, process: &str, symbol: &str, samples: u64, pct: f64) -> FunctionView {
    FunctionView {
        context: context.into(),
        process: process.into(),
        symbol: symbol.into(),
        samples,
        pct,
    }
}

fn frame() -> Frame {
    Frame {
        time_s: 12.0,
        at: None,
        interval_s: 1.0,
        hostname: "golden-host".into(),
        cpus: 2,
        host_busy_pct: 74.5,
        domains: vec![
            DomainView {
                name: "host".into(),
                role: "host".into(),
                cpu_pct: 21.0,
                vcpus: 0,
                run_pct: 0.0,
                steal_pct: 0.0,
                halted_pct: 0.0,
                io_cpu_pct: 0.0,
                io_ops_per_s: 0.0,
                lost: 0,
                reason: None,
                waited_behind: vec![],
                functions: vec![
                    fun("host-kernel", "kworker/0:1", "process_one_work", 40, 38.1),
                    fun("host-user", "make", "main", 30, 28.6),
                ],
            },
            DomainView {
                name: "db".into(),
                role: "passive".into(),
                cpu_pct: 30.5,
                vcpus: 1,
                run_pct: 29.0,
                steal_pct: 6.0,
                halted_pct: 65.0,
                io_cpu_pct: 1.5,
                io_ops_per_s: 120.0,
                lost: 0,
                reason: Some("passive: its agent did not answer within 3 s".into()),
                waited_behind: vec![
                    WaitView {
                        culprit: "d2 web vCPU 1".into(),
                        steal_pct: 4.5,
                    },
                    WaitView {
                        culprit: "host make (pid 4242)".into(),
                        steal_pct: 1.2,
                    },
                    WaitView {
                        culprit: "idle".into(),
                        steal_pct: 0.3,
                    },
                    WaitView {
                        culprit: "host cc1 (pid 5000)".into(),
                        steal_pct: 0.2,
                    },
                    WaitView {
                        culprit: "host cc1 (pid 5001)".into(),
                        steal_pct: 0.1,
                    },
                    WaitView {
                        culprit: "host cc1 (pid 5002)".into(),
                        steal_pct: 0.05,
                    },
                ],
                functions: vec![fun(
                    "guest",
                    "CPU 0/TCG",
                    "[translated guest code]",
                    290,
                    95.0,
                )],
            },
            DomainView {
                name: "web".into(),
                role: "active".into(),
                cpu_pct: 97.5,
                vcpus: 2,
                run_pct: 48.0,
                steal_pct: 1.0,
                halted_pct: 51.0,
                io_cpu_pct: 1.5,
                io_ops_per_s: 474.0,
                lost: 3,
                reason: None,
                waited_behind: vec![WaitView {
                    culprit: "idle".into(),
                    steal_pct: 0.2,
                }],
                functions: vec![
                    fun(
                        "guest-user",
                        "vmscope-agent",
                        "vmscope_demo_alpha",
                        480,
                        49.2,
                    ),
                    fun(
                        "guest-user",
                        "vmscope-agent",
                        "vmscope_demo_beta",
                        290,
                        29.7,
                    ),
                    fun(
                        "guest-user",
                        "vmscope-agent",
                        "vmscope_demo_gamma",
                        195,
                        20.0,
                    ),
                    fun("guest-kernel", "swapper/0", "native_safe_halt", 10, 1.0),
                ],
            },
        ],
        notes: vec!["d3 new (pid 990) started".into()],
    }
}

fn check(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("VMSCOPE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with VMSCOPE_BLESS=1)", path.display()));
    assert_eq!(actual, expected, "{name} differs from {}", path.display());
}

fn screen(frame: &Frame, view: &View, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| draw(f, frame, view)).unwrap();
    let buf = t.backend().buffer();
    let mut s = String::new();
    for y in 0..h {
        let line: String = (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect();
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s
}

#[test]
fn batch_text_and_json() {
    let f = frame();
    let mut text = Vec::new();
    write_text(&f, &View::default(), &mut text).unwrap();
    check("batch.txt", &String::from_utf8(text).unwrap());
    let mut json = Vec::new();
    write_json(&f, &mut json).unwrap();
    let json = String::from_utf8(json).unwrap();
    assert_eq!(json.lines().count(), 1);
    let back: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        back["domains"][2]["functions"][0]["symbol"],
        "vmscope_demo_alpha"
    );
    check("batch.json", &json);
}

#[test]
fn terminal_view_and_keys() {
    let f = frame();
    let mut v = View::default();
    v.expanded.insert("web".into());
    check("screen-default.txt", &screen(&f, &v, 130, 16));
    // s: sort by steal (db first), e on the selected host expands it.
    assert_eq!(v.key('s', &f), Action::Continue);
    assert_eq!(v.sort, SortKey::Steal);
    assert_eq!(v.order(&f)[1].name, "db");
    v.key('e', &f);
    assert!(v.expanded.contains("host"));
    // c: only guest-user functions; f: only the first VM; p: pause.
    v.key('c', &f);
    assert_eq!(v.context.as_deref(), Some("guest-user"));
    v.key('j', &f);
    v.key('j', &f);
    assert_eq!(v.selected, 2);
    v.key('j', &f);
    assert_eq!(v.selected, 2, "the selection stays on the last domain");
    v.key('p', &f);
    check("screen-filtered.txt", &screen(&f, &v, 130, 16));
    v.key('f', &f);
    assert_eq!(v.only.as_deref(), Some("db"));
    assert_eq!(v.order(&f).len(), 2);
    v.key('f', &f);
    v.key('f', &f);
    assert_eq!(v.only, None, "the filter cycles back to every VM");
    assert_eq!(v.key('q', &f), Action::Quit);
}

#[test]
fn a_small_terminal_says_so() {
    let s = screen(&frame(), &View::default(), 50, 5);
    assert!(s.contains("terminal too small: 50x5"), "{s}");
    assert!(s.contains("--batch"), "{s}");
}
