//! Issue 11 item 4, on real lab VMs (QEMU under TCG here, the real agent
//! over virtio-serial): commands interrupted by a signal clean up.
//!
//! - `lab up` interrupted by SIGTERM, and by Ctrl-C (SIGINT to its whole
//!   process group, as a terminal sends it) while the guest boots: it exits
//!   with 128 + the signal, says it was interrupted, and leaves no QEMU, tap,
//!   bridge, loop device or run directory behind.
//! - With a lab VM running: `record` (the VM active), `stat`, `account` and
//!   `serve` stop cleanly on SIGTERM and on SIGHUP as on SIGINT: exit code 0,
//!   complete output (a session marked as stopped cleanly, holding the VM's
//!   agent rows; whole JSON lines naming the VM; a last scrape served).
//!
//! Lab names start with `safety`. Both tests boot VMs: run them under the
//! heavy-job lock (`flock /tmp/vmscope-heavy.lock cargo test ...`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const VMSCOPE: &str = env!("CARGO_BIN_EXE_vmscope");

/// One lab at a time on a 2-CPU machine.
static SERIAL: Mutex<()> = Mutex::new(());

use common::{leftovers, write_spec, LabEnv as Env};

/// `vmscope ARGS` with the test's lab directories (in the environment, so
/// `record` and `stat` find the lab's VMs too).
fn vmscope(env: &Env, args: &[&str]) -> Command {
    let mut c = Command::new(VMSCOPE);
    c.args(args)
        .env("VMSCOPE_CACHE", &env.cache)
        .env("VMSCOPE_RUN", &env.run)
        .env("VMSCOPE_AGENT", &env.agent)
        .stdin(Stdio::null());
    c
}

fn lab_cmd(env: &Env, args: &[&str]) -> Command {
    let mut all = vec!["lab"];
    all.extend_from_slice(args);
    vmscope(env, &all)
}

/// Tears the lab down when a test fails half-way.
struct DownOnDrop<'a>(&'a Env, &'a str);

impl Drop for DownOnDrop<'_> {
    fn drop(&mut self) {
        let _ = lab_cmd(self.0, &["down", self.1]).output();
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a child (or the process group) of this test.
    unsafe { libc::kill(pid, sig) };
}

/// Wait up to `secs` for a child; kill it if it does not end.
fn wait_output(child: Child, secs: u64, what: &str) -> Output {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    if let Ok(o) = rx.recv_timeout(Duration::from_secs(secs)) {
        o.unwrap()
    } else {
        signal(pid, libc::SIGKILL);
        panic!("{what} did not end within {secs} s of the signal");
    }
}

#[test]
fn lab_up_interrupted_while_booting_removes_what_it_made() {
    let env = need_lab!("sr");
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tmp = tempfile::tempdir().unwrap();
    // SIGTERM to the process; SIGINT to the process group (Ctrl-C).
    for (lab, sig, group) in [
        ("safety-term", libc::SIGTERM, false),
        ("safety-ctrlc", libc::SIGINT, true),
    ] {
        let _ = lab_cmd(&env, &["down", lab]).output();
        let _guard = DownOnDrop(&env, lab);
        let spec = write_spec(
            tmp.path(),
            lab,
            &format!(
                "name = \"{lab}\"\naccel = \"tcg\"\n\n[[vm]]\nname = \"{lab}0\"\nvcpus = 1\n\
                 memory_mib = 128\n[[vm.nic]]\nkind = \"tap\"\n[[vm.disk]]\nbackend = \"block\"\n\
                 size_mib = 8\n"
            ),
        );
        let mut cmd = lab_cmd(&env, &["up", spec.to_str().unwrap()]);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Interrupt once QEMU runs (its pid is in the state file), mid-boot.
        let state_file = env.run.join(lab).join("state.json");
        let deadline = Instant::now() + Duration::from_secs(120);
        let qemu = loop {
            assert!(Instant::now() < deadline, "{lab}: QEMU never started");
            if let Ok(st) = vmscope_lab::state::LabState::load(&state_file) {
                if let Some(p) = st.vms.first().and_then(|v| v.pid) {
                    break p;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!leftovers(&env, lab).is_empty(), "{lab}: nothing made yet");
        signal(if group { -pid } else { pid }, sig);
        let out = wait_output(child, 60, "lab up");
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("{lab}: {err}");
        assert_eq!(out.status.code(), Some(128 + sig), "{lab}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("vmscope: error:"))
            .unwrap_or_default();
        assert!(
            line.contains("interrupted by SIG") && line.contains("removed everything"),
            "{lab}: {err}"
        );
        assert_eq!(leftovers(&env, lab), Vec::<String>::new(), "{lab}");
        // QEMU may linger as a zombie until init reaps it.
        let gone = Instant::now() + Duration::from_secs(10);
        while vmscope_lab::state::alive(qemu) && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            !vmscope_lab::state::alive(qemu),
            "{lab}: QEMU {qemu} survived"
        );
    }
}

/// Start `args`, wait until `ready(stdout lines so far)` holds, send `sig`,
/// and return (exit code, stdout, stderr).
fn stop_with(
    env: &Env,
    args: &[&str],
    sig: i32,
    ready: &dyn Fn(&[String]) -> bool,
) -> (Option<i32>, Vec<String>, String) {
    let mut child = vmscope(env, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !ready(&lines) {
        assert!(
            Instant::now() < deadline,
            "{args:?} never got ready: {:?}",
            &lines[..lines.len().min(5)]
        );
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            lines.push(l);
        }
        if let Ok(Some(st)) = child.try_wait() {
            let mut e = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut e);
            panic!("{args:?} ended before the signal ({st}): {e}");
        }
    }
    signal(pid, sig);
    let out = wait_output(child, 30, &format!("{args:?}"));
    lines.extend(rx.try_iter());
    // Lines still in the pipe when the reader thread saw EOF.
    std::thread::sleep(Duration::from_millis(100));
    lines.extend(rx.try_iter());
    (
        out.status.code(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn partial_of(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_os_string();
    s.push(".partial");
    PathBuf::from(s)
}

/// Host samples and `vm`'s agent samples stored so far in a session file,
/// if it is readable.
fn stored_samples(db: &Path, vm: &str) -> Option<(u64, u64)> {
    let out = Command::new(VMSCOPE)
        .arg("report")
        .arg(db)
        .args(["--format", "json"])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let agent = v["scales"].as_array().map_or(0, |a| {
        a.iter()
            .filter(|s| s["domain"] == vm)
            .filter_map(|s| s["agent_samples"].as_u64())
            .sum()
    });
    Some((v["events"][0]["samples"].as_u64()?, agent))
}

#[test]
fn record_stat_account_and_serve_stop_cleanly_on_sigterm_and_sighup() {
    let env = need_lab!("sr");
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lab = "safety-sig";
    let vm = "safety-s0";
    let _ = lab_cmd(&env, &["down", lab]).output();
    let _guard = DownOnDrop(&env, lab);
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        lab,
        &format!(
            "name = \"{lab}\"\naccel = \"tcg\"\n\n[[vm]]\nname = \"{vm}\"\nvcpus = 1\n\
             memory_mib = 128\n[[vm.nic]]\nkind = \"user\"\n"
        ),
    );
    let up = lab_cmd(&env, &["up", spec.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "lab up: {}",
        String::from_utf8_lossy(&up.stderr)
    );

    // record, with the VM active, stopped by SIGTERM and by SIGHUP.
    for (sig, name) in [(libc::SIGTERM, "term"), (libc::SIGHUP, "hup")] {
        let db = tmp.path().join(format!("{name}.db"));
        let role = format!("{vm}=active");
        let d = db.to_str().unwrap().to_string();
        let part = partial_of(&db);
        let (code, _, err) = stop_with(
            &env,
            &[
                "record", "-a", "-F", "499", "-d", "120", "--vm", &role, "-o", &d,
            ],
            sig,
            // Stopped once the partial file holds host samples and the
            // agent's rows: the stop must keep both, and an agent's first
            // rows can come a few seconds after the host's under TCG.
            &|_| stored_samples(&part, vm).is_some_and(|(h, a)| h > 0 && a > 0),
        );
        assert_eq!(code, Some(0), "record stopped by signal {sig}: {err}");
        assert!(err.contains("written to"), "{err}");
        assert!(!part.exists(), "the partial file stayed after a clean stop");
        let out = Command::new(VMSCOPE)
            .arg("report")
            .arg(&db)
            .args(["--format", "json", "--by", "domain"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["meta"]["clean_stop"], "1", "signal {sig}");
        let dom = v["domains"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == vm)
            .unwrap_or_else(|| panic!("no domain {vm}: {}", v["domains"]))
            .clone();
        assert_eq!(dom["role"], "active", "{dom}");
        assert!(
            v["scales"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["domain"] == vm && s["agent_samples"].as_u64().unwrap_or(0) > 0),
            "no agent rows for {vm}: {}",
            v["scales"]
        );
    }

    // stat and account: whole JSON lines naming the VM, then a clean stop.
    for (cmd, sig) in [
        ("stat", libc::SIGTERM),
        ("stat", libc::SIGHUP),
        ("account", libc::SIGTERM),
        ("account", libc::SIGHUP),
    ] {
        let (code, lines, err) = stop_with(
            &env,
            &[cmd, "-i", "200ms", "--format", "json"],
            sig,
            // The VM is named (stat's legend, account's rows) and a few
            // intervals have passed.
            &|l| l.iter().any(|x| x.contains(vm)) && l.len() >= 6,
        );
        assert_eq!(code, Some(0), "{cmd} stopped by signal {sig}: {err}");
        assert!(err.contains("stopped by SIG"), "{cmd}: {err}");
        assert!(!err.contains("error"), "{cmd}: {err}");
        for l in &lines {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| panic!("{cmd}: a cut line ({e}): {l}"));
        }
    }

    // serve: a scrape shows the VM, then SIGTERM ends it with code 0.
    let mut child = vmscope(&env, &["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    let addr = first
        .trim()
        .strip_prefix("vmscope serve: http://")
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("serve said: {first}"))
        .to_string();
    let mut body = String::new();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains(vm), "the scrape does not name {vm}");
    signal(child.id() as i32, libc::SIGTERM);
    let mut rest = String::new();
    let _ = stderr.read_to_string(&mut rest);
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "serve after SIGTERM: {rest}");
    assert!(rest.contains("stopped by SIGTERM"), "{rest}");

    let down = lab_cmd(&env, &["down", lab]).output().unwrap();
    assert!(down.status.success());
    assert_eq!(leftovers(&env, lab), Vec::<String>::new());
}

/// Issue 32 item 5 (sweep row t28): `top` in a real terminal (tmux) stopped
/// by SIGTERM gives the terminal back as `q` does: the shell after it finds
/// it in canonical mode with echo on, and top says why it stopped.
#[test]
fn top_stopped_by_sigterm_restores_the_terminal() {
    if !vmscope_testkit::require_root("perf_event_open system-wide")
        || !vmscope_testkit::require_tools(&[("tmux", "tmux")])
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stty = dir.path().join("stty.txt");
    let log = dir.path().join("top.err");
    let session = format!("vmscope-term-{}", std::process::id());
    let tmux = |args: &[&str]| Command::new("tmux").args(args).output().expect("tmux runs");
    let script = format!(
        "{VMSCOPE} top -i 500ms 2>{}; stty -a > {}; sleep 60",
        log.display(),
        stty.display()
    );
    let st = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "150",
        "-y",
        "40",
        &script,
    ]);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    struct Kill<'a>(&'a str);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["kill-session", "-t", self.0])
                .output();
        }
    }
    let _kill = Kill(&session);
    // Wait until the live view is drawn, then SIGTERM top itself.
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        let screen = String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout)
            .into_owned();
        let pid = Command::new("pgrep")
            .args(["-f", "-n", &format!("{VMSCOPE} top -i 500ms")])
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<i32>()
                    .ok()
            });
        if let (true, Some(p)) = (screen.contains("vmscope top"), pid) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "top never drew its view:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::fs::metadata(&stty).map_or(true, |m| m.len() == 0) {
        assert!(Instant::now() < deadline, "top did not end on SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(100));
    let modes = std::fs::read_to_string(&stty).unwrap();
    let words: Vec<&str> = modes.split_whitespace().collect();
    for mode in ["icanon", "echo"] {
        assert!(
            words.contains(&mode),
            "the terminal was left without {mode}: {modes}"
        );
    }
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("stopped by SIGTERM"), "{said}");
}
