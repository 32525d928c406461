//! Issue 19: `vmscope --version` names the build (version, git commit,
//! clean/dirty), sessions written by `record` and `import` store the same
//! string, and `vmscope __generate` writes man pages and completions while
//! staying out of `--help`.

mod common;
use common::*;

/// What `vmscope --version` prints after "vmscope ".
fn version() -> String {
    let out = run_ok(vmscope().arg("--version"));
    let s = String::from_utf8(out.stdout).unwrap();
    s.trim()
        .strip_prefix("vmscope ")
        .unwrap_or_else(|| panic!("--version printed {s:?}"))
        .to_string()
}

fn stored_version(db: &std::path::Path) -> String {
    let v = report_json(db, &[]);
    v["meta"]["vmscope_version"]
        .as_str()
        .unwrap_or_else(|| panic!("no vmscope_version in {}", v["meta"]))
        .to_string()
}

#[test]
fn version_names_the_commit_of_this_checkout() {
    let v = version();
    let (number, build) = v.split_once(' ').unwrap();
    assert_eq!(number, env!("CARGO_PKG_VERSION"));
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(["-c", "safe.directory=*", "-C", env!("CARGO_MANIFEST_DIR")])
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(head) => {
            // Clean or dirty depends on the tree at build time; the commit does not.
            let prefix = format!("(commit {head}, ");
            assert!(build.starts_with(&prefix), "{v} does not name HEAD {head}");
            assert!(
                build == format!("{prefix}clean)") || build == format!("{prefix}dirty)"),
                "{v}"
            );
        }
        None => assert_eq!(build, "(unknown commit)"),
    }
    // Subcommands print the same build.
    let out = run_ok(vmscope().args(["report", "--version"]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("vmscope-report {v}")
    );
}

#[test]
fn imported_session_stores_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    run_ok(
        vmscope()
            .arg("import")
            .arg(fixture_dir().join("perf/quipper.perf.data.callgraph-3.8"))
            .arg("-o")
            .arg(&db)
            .arg("--symfs")
            .arg(dir.path()),
    );
    assert_eq!(stored_version(&db), version());
}

#[test]
fn recorded_session_stores_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let out = vmscope()
        .args(["record", "-F", "999", "-o"])
        .arg(&db)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
        ])
        .output()
        .unwrap();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("perf_event_paranoid") || err.contains("EACCES") {
            eprintln!("SKIP: perf_event_open refused here: {err}");
            return;
        }
        panic!("record failed: {err}");
    }
    assert_eq!(stored_version(&db), version());
}

#[test]
fn generate_is_hidden_and_writes_pages_and_completions() {
    let help = String::from_utf8(run_ok(vmscope().arg("--help")).stdout).unwrap();
    assert!(!help.contains("generate"), "{help}");
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man");
    run_ok(vmscope().args(["__generate", "man"]).arg(&man));
    // One page per subcommand listed in --help (plus vmscope.1 and lab's own).
    let subs: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|s| s != "help")
        .collect();
    assert!(subs.len() >= 9, "{subs:?}");
    for s in &subs {
        let page = man.join(format!("vmscope-{s}.1"));
        assert!(page.is_file(), "no {}", page.display());
    }
    for p in ["vmscope.1", "vmscope-lab-up.1", "vmscope-lab-image.1"] {
        assert!(man.join(p).is_file(), "no {p}");
    }
    assert!(!man.join("vmscope-__generate.1").exists());
    let record = std::fs::read_to_string(man.join("vmscope-record.1")).unwrap();
    assert!(record.contains("all\\-cpus"), "{record}");
    assert!(record.contains(&version().replace('-', "\\-")), "{record}");

    let comp = dir.path().join("comp");
    run_ok(vmscope().args(["__generate", "completions"]).arg(&comp));
    let bash = std::fs::read_to_string(comp.join("vmscope.bash")).unwrap();
    assert!(bash.contains("vmscope,record)"), "{bash}");
    assert!(!bash.contains("__generate"));
    assert!(comp.join("_vmscope").is_file() && comp.join("vmscope.fish").is_file());

    let out = vmscope()
        .args(["__generate", "pdf"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("'pdf'"), "{err}");
}
