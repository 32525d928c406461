//! The five experiments share their options: the same flags for the same
//! things (a lab, its name, repeats, the stop rule, output), each checked
//! before anything starts (no lab brought up, no file written), and every
//! built-in lab that `bench --lab` takes is one that `lab up` takes and
//! lists. No root, no lab: the checks come first.

use std::path::Path;
use std::process::Command;

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");
const EXPERIMENTS: [&str; 5] = ["io", "net", "web", "scale", "overhead"];
/// Flags every experiment takes, for the same thing.
const SHARED: [&str; 19] = [
    "--lab",
    "--lab-name",
    "--keep-lab",
    "--run-dir",
    "--cache-dir",
    "--hello-timeout",
    "--repeat",
    "--max-repeat",
    "--ci",
    "--warmup",
    "--busy-threshold",
    "--busy-retries",
    "--seed",
    "--format",
    "-o, --session",
    "--force",
    "-q, --quiet",
    "--record",
    "--record-freq",
];

fn run(args: &[&str], dir: &Path) -> (i32, String, String) {
    let out = Command::new(VMSCOPE)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The built-in labs a refusal of an unknown lab lists.
fn built_ins(stderr: &str) -> Vec<String> {
    stderr
        .split_once("not a built-in lab (")
        .and_then(|(_, r)| r.split_once(')'))
        .map(|(names, _)| names.split(", ").map(str::to_string).collect())
        .unwrap_or_else(|| panic!("no list of built-in labs: {stderr}"))
}

#[test]
fn every_experiment_takes_the_shared_flags() {
    let tmp = tempfile::tempdir().unwrap();
    for exp in EXPERIMENTS {
        let (code, help, _) = run(&["bench", exp, "--help"], tmp.path());
        assert_eq!(code, 0, "bench {exp} --help");
        // A flag as clap prints it: at the start of an option's line.
        let flags: Vec<&str> = help
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            .collect();
        for flag in SHARED {
            assert!(
                flags
                    .iter()
                    .any(|l| l.starts_with(&format!("{flag} ")) || *l == flag),
                "bench {exp} has no {flag}:\n{help}"
            );
        }
    }
}

#[test]
fn every_experiment_checks_its_options_before_it_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("labs");
    std::fs::create_dir(&run_dir).unwrap();
    let run_dir_s = run_dir.to_str().unwrap();
    let bad: [(&[&str], &str); 4] = [
        (&["--repeat", "0"], "--repeat"),
        (&["--ci", "2"], "--ci 2"),
        (&["--repeat", "5", "--max-repeat", "2"], "--max-repeat 2"),
        (&["--lab", "no-such-lab"], "not a built-in lab"),
    ];
    for exp in EXPERIMENTS {
        for (args, named) in bad {
            // A real lab with the bad option: had the run started, it would
            // have brought the lab up under --run-dir and written -o.
            let mut argv = vec![
                "bench",
                exp,
                "--run-dir",
                run_dir_s,
                "-o",
                "out.db",
                "--format",
                "json",
            ];
            if args[0] != "--lab" {
                argv.extend(["--lab", "one-vm"]);
            }
            argv.extend(args);
            let (code, stdout, stderr) = run(&argv, tmp.path());
            assert_eq!(code, 2, "{argv:?}: exit {code}\n{stderr}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{argv:?}: not one line:\n{stderr}");
            assert!(
                lines[0].contains(named),
                "{argv:?}: the line does not name {named}: {stderr}"
            );
            assert!(stdout.is_empty(), "{argv:?} printed {stdout}");
            assert!(
                std::fs::read_dir(&run_dir).unwrap().next().is_none(),
                "{argv:?} brought a lab up"
            );
            for f in ["out.db", "out.db.partial", "out.db.lock"] {
                assert!(!tmp.path().join(f).exists(), "{argv:?} wrote {f}");
            }
        }
    }
}

#[test]
fn lab_up_takes_and_lists_every_built_in_lab_of_bench() {
    let tmp = tempfile::tempdir().unwrap();
    // The names bench knows, from its own refusal of an unknown one.
    let (_, _, stderr) = run(&["bench", "net", "--lab", "no-such-lab"], tmp.path());
    let bench_names = built_ins(&stderr);
    assert!(bench_names.len() >= 5, "{bench_names:?}");
    let (code, help, _) = run(&["lab", "up", "--help"], tmp.path());
    assert_eq!(code, 0);
    let listed: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.contains("the name of a built-in lab:"))
        .skip(1)
        .take_while(|l| l.starts_with("  ") && !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        listed, bench_names,
        "lab up --help lists other labs than bench takes:\n{help}"
    );
    // lab up knows the same names: its own refusal of an unknown one lists
    // them (checked before anything is made: no lab brought up).
    let run_dir = tmp.path().join("labs");
    let (code, _, stderr) = run(
        &[
            "lab",
            "--run-dir",
            run_dir.to_str().unwrap(),
            "up",
            "no-such-lab",
        ],
        tmp.path(),
    );
    assert_eq!(code, 2, "lab up no-such-lab: {stderr}");
    let lab_names = built_ins(&stderr);
    assert_eq!(lab_names, bench_names);
    assert!(!run_dir.join("no-such-lab").exists());
}
