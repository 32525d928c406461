//! Helpers shared by the CLI integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn vmscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vmscope"))
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vmscope"))
}

/// How long one command a test runs may take before it is killed and the
/// test fails: a command that never ends (a replay loop that did not
/// stop once hung a CI run to its limit) fails its test instead.
pub const COMMAND_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// `cmd.output()`, killed and failed after `limit`.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not end within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = output_within(cmd, COMMAND_LIMIT);
    assert!(
        out.status.success(),
        "{:?} failed: {}\n{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[allow(unused_imports)]
pub use vmscope_testkit::{have, is_root, skip, skip_platform};

/// Skip (return true) with a reason unless root and `tools` exist.
pub fn skip_unless(tools: &[&str]) -> bool {
    if !vmscope_testkit::require_root("perf_event_open system-wide") {
        return true;
    }
    for t in tools {
        if !have(t) {
            skip(&format!(
                "'{t}' is not installed (scripts/setup.sh installs it)"
            ));
            return true;
        }
    }
    false
}

pub fn report_json(db: &Path, args: &[&str]) -> serde_json::Value {
    let out = run_ok(
        vmscope()
            .arg("report")
            .arg(db)
            .args(args)
            .args(["--format", "json"]),
    );
    serde_json::from_slice(&out.stdout).expect("report json")
}

/// Rows of a JSON report as (values joined by '|', samples of event 0, percent of event 0).
pub fn rows(v: &serde_json::Value) -> Vec<(String, u64, f64)> {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let vals: Vec<String> = r["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect();
            (
                vals.join("|"),
                r["samples"][0].as_u64().unwrap(),
                r["percent"][0].as_f64().unwrap(),
            )
        })
        .collect()
}

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// Where a recorder writes `db` until it is complete (`DB.partial`,
/// renamed to `db` when the recording ends).
pub fn partial(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_os_string();
    s.push(".partial");
    PathBuf::from(s)
}

/// (samples of event 0, stored duration in s) of a session file, or None
/// while it is not yet readable. A recording under way is read through
/// [`partial`].
pub fn stored(db: &Path) -> Option<(u64, f64)> {
    let out = vmscope()
        .arg("report")
        .arg(db)
        .args(["--format", "json"])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let samples = v["events"][0]["samples"].as_u64()?;
    let d: f64 = v["meta"]["duration_s"]
        .as_str()
        .unwrap_or("0")
        .parse()
        .ok()?;
    Some((samples, d))
}

/// Wait (up to 60 s: start-up time varies with load) until a recorder
/// writing `db` has flushed samples (to its partial file); returns the
/// stored duration then.
pub fn wait_for_samples(db: &Path) -> f64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some((n, d)) = stored(&partial(db)) {
            if n > 0 {
                return d;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the recorder never flushed a sample to {}",
            db.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Where a lab test keeps its guest images and run state, and the agent it
/// puts in guests.
pub struct LabEnv {
    pub cache: PathBuf,
    pub run: PathBuf,
    pub agent: PathBuf,
}

/// What every lab test needs (root, QEMU, busybox, iproute2, losetup,
/// /dev/net/tun, a static agent) plus `tools` as (program, Debian package),
/// or why the test skips. `run_dir` names the test's run directory under
/// CARGO_TARGET_TMPDIR; keep it short, QEMU's Unix socket paths must stay
/// under 108 bytes. Guest images go to $VMSCOPE_CACHE, shared by the run.
pub fn lab_env(run_dir: &str, tools: &[(&str, &str)]) -> Result<LabEnv, String> {
    if !vmscope_testkit::is_root() {
        return Err(
            "lab tests need root (taps, loop devices, /dev/net/tun, perf_event_open)".into(),
        );
    }
    let base_tools = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("qemu-img", "qemu-utils"),
        ("busybox", "busybox-static"),
        ("ip", "iproute2"),
        ("losetup", "mount"),
    ];
    for (tool, pkg) in base_tools.iter().chain(tools) {
        if vmscope_lab::util::which(tool).is_none() {
            return Err(format!("{tool} not installed (apt-get install {pkg})"));
        }
    }
    if !Path::new("/dev/net/tun").exists() {
        return Err("/dev/net/tun missing (tap NICs)".into());
    }
    let agent = vmscope_lab::image::find_agent(None).map_err(|e| e.to_string())?;
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let cache = std::env::var_os("VMSCOPE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| base.join("lab-cache"));
    let run = base.join(run_dir);
    std::fs::create_dir_all(&run).map_err(|e| e.to_string())?;
    Ok(LabEnv { cache, run, agent })
}

/// `let env = need_lab!("dir");` (or `need_lab!("dir", &[("pidstat",
/// "sysstat")])`): the [`LabEnv`], or a logged skip and return.
#[macro_export]
macro_rules! need_lab {
    ($dir:expr) => {
        need_lab!($dir, &[])
    };
    ($dir:expr, $tools:expr) => {
        match common::lab_env($dir, $tools) {
            Ok(e) => e,
            Err(why) => {
                vmscope_testkit::skip(&why);
                return;
            }
        }
    };
}

/// Write lab spec `name`.toml in `dir`.
pub fn write_spec(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

/// Everything a lab might leave behind, for the given lab name.
pub fn leftovers(env: &LabEnv, lab: &str) -> Vec<String> {
    let mut left = Vec::new();
    let run_dir = env.run.join(lab);
    if run_dir.exists() {
        left.push(format!("run directory {}", run_dir.display()));
    }
    let marker = format!("{}/", run_dir.display());
    for pid in vmscope_lab::state::find_processes(&marker) {
        left.push(format!(
            "process {pid}: {}",
            vmscope_lab::state::cmdline(pid).unwrap_or_default()
        ));
    }
    let short = vmscope_lab::names::short(lab);
    if let Ok(rd) = std::fs::read_dir("/sys/class/net") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n == vmscope_lab::names::bridge(lab) || n.starts_with(&format!("vmst-{short}-")) {
                left.push(format!("interface {n}"));
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/sys/block") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(b) = vmscope_lab::state::loop_backing(&n) {
                if b.starts_with(&run_dir) {
                    left.push(format!("loop device /dev/{n} on {}", b.display()));
                }
            }
        }
    }
    left
}

/// Kills (by its own pid) and reaps a child when dropped.
pub struct Reap(pub std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Example `name` (unique in the workspace), built on demand in the profile of the
/// vmscope under test (next to which it is looked for). It is built with
/// the whole workspace's features, as `cargo test --workspace` built it:
/// `-p PACKAGE` alone unifies other features and rebuilt most of the
/// dependency graph (70 s of a CI run for one example).
pub fn example(name: &str) -> Result<PathBuf, String> {
    let dir = bin().parent().ok_or("no target dir")?.to_path_buf();
    let exe = dir.join("examples").join(name);
    let mut c = Command::new(env!("CARGO"));
    c.args(["build", "-q", "--workspace", "--example", name]);
    if dir.ends_with("release") {
        c.arg("--release");
    }
    let st = c.status().map_err(|e| format!("cargo build: {e}"))?;
    if !st.success() || !exe.exists() {
        return Err(format!("could not build the {name} example"));
    }
    Ok(exe)
}

/// The synthetic QEMU (`fake_qemu` of vmscope-stat).
pub fn fake_qemu() -> Result<PathBuf, String> {
    example("fake_qemu")
}

/// Starts a synthetic QEMU (`cmd`: the `fake_qemu` binary and its
/// arguments; stdin as the caller set it) and waits for its `ready PID`
/// line: its reaper, its pid, and its stdin when `cmd` piped it.
pub fn start_fake_qemu(cmd: &mut Command) -> (Reap, u32, Option<std::process::ChildStdin>) {
    use std::io::BufRead;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start fake_qemu");
    let stdin = child.stdin.take();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("fake_qemu ready line");
    let reap = Reap(child);
    let pid = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .expect("fake_qemu ready line");
    (reap, pid, stdin)
}

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(19464)
}

/// The body of `GET path` from `addr` (HTTP/1.0), or `None`.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// A lab of one test: `vmscope lab` commands with the test's run and cache
/// directories and its agent, any other `vmscope` command with the same
/// (in the environment, so `record`, `stat` and the benchmarks find the
/// lab's VMs), and the lab taken down when dropped, also when the test
/// fails half-way. The one lab runner of every lab test.
pub struct TestLab {
    pub env: LabEnv,
    pub name: String,
}

impl TestLab {
    /// The lab `name` in `env`; a leftover of an earlier run is taken down.
    pub fn new(env: LabEnv, name: &str) -> TestLab {
        let lab = TestLab {
            env,
            name: name.to_string(),
        };
        let _ = lab.cmd(&["down", name]).output();
        lab
    }

    /// `vmscope ARGS` with the lab's directories and agent.
    pub fn vmscope(&self, args: &[&str]) -> Command {
        let mut c = vmscope();
        c.args(args)
            .env("VMSCOPE_CACHE", &self.env.cache)
            .env("VMSCOPE_RUN", &self.env.run)
            .env("VMSCOPE_AGENT", &self.env.agent)
            .stdin(std::process::Stdio::null());
        c
    }

    /// `vmscope lab ARGS` with the lab's directories and agent.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = vmscope();
        c.arg("lab")
            .arg("--cache-dir")
            .arg(&self.env.cache)
            .arg("--run-dir")
            .arg(&self.env.run)
            .args(args)
            .env("VMSCOPE_AGENT", &self.env.agent)
            .stdin(std::process::Stdio::null());
        c
    }

    /// `vmscope lab ARGS`, which must succeed; its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args).output().expect("run vmscope lab");
        assert!(
            out.status.success(),
            "lab {args:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Bring `spec` up (its name must be this lab's) and return its state.
    pub fn up(&self, spec: &Path) -> vmscope_lab::LabState {
        self.ok(&["up", spec.to_str().unwrap(), "--hello-timeout", "120"]);
        vmscope_lab::load_state_in(&self.env.run, &self.name).expect("the lab's state")
    }

    /// Write the spec TEXT as NAME.toml in the run directory and bring it up.
    pub fn up_text(&self, text: &str) -> vmscope_lab::LabState {
        let spec = write_spec(&self.env.run, &self.name, text);
        self.up(&spec)
    }
}

impl Drop for TestLab {
    fn drop(&mut self) {
        let _ = self.cmd(&["down", &self.name]).output();
    }
}

/// A detached tmux session running one command (a real terminal for the
/// interactive views), killed when dropped however the test ends.
pub struct Tmux {
    pub session: String,
}

impl Tmux {
    /// Start `cmd` in a new session named `tag` and this process's id, of
    /// `cols` x `rows`.
    pub fn start(tag: &str, cols: u16, rows: u16, cmd: &str) -> Tmux {
        let t = Tmux {
            session: format!("{tag}-{}", std::process::id()),
        };
        let (x, y) = (cols.to_string(), rows.to_string());
        let st = tmux(&[
            "new-session",
            "-d",
            "-s",
            &t.session,
            "-x",
            &x,
            "-y",
            &y,
            cmd,
        ]);
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
        t
    }

    /// What the pane shows now.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &self.session]).stdout)
            .into_owned()
    }

    /// Type `keys` (tmux key names or text) into the pane.
    pub fn keys(&self, keys: &str) {
        tmux(&["send-keys", "-t", &self.session, keys]);
    }

    /// Whether the session still exists (its command has not ended).
    pub fn alive(&self) -> bool {
        tmux(&["has-session", "-t", &self.session]).status.success()
    }

    /// Close the terminal: the command's terminal hangs up.
    pub fn kill(&self) {
        tmux(&["kill-session", "-t", &self.session]);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.kill();
    }
}

fn tmux(args: &[&str]) -> Output {
    Command::new("tmux").args(args).output().expect("tmux runs")
}

/// The replay's place in its range from the title of a `top --replay`
/// screen ("... - 12/3601 paused - ..."): (interval, of intervals).
pub fn replay_position(screen: &str) -> Option<(usize, usize)> {
    screen.lines().next()?.split(" - ").find_map(|p| {
        let (a, b) = p.split_once('/')?;
        Some((
            a.trim().parse().ok()?,
            b.split_whitespace().next()?.parse().ok()?,
        ))
    })
}
