//! Profilers run around a benchmark sample, as child processes (the
//! recorder's internals change under it; its command line does not):
//!
//! - `vmscope record -a` with every VM passive (the host's rings only),
//! - `vmscope record -a` with every VM active (host rings plus each guest's
//!   agent sampling inside the guest; with `strict`, a VM that cannot take
//!   part fails the run instead of measuring something else),
//! - `perf record -a` at the same frequency.
//!
//! [`start`] returns once sampling runs: for vmscope, when the session
//! holds its first samples (active agents are armed before the rings
//! start, so that is after the barrier); for perf, when its control FIFO
//! acknowledges `enable` (started with `--delay=-1`). [`Running::stop`]
//! sends SIGINT, waits, and reads the child's CPU time (`wait4`), its
//! samples and what it lost.

use std::io::{BufRead, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which profiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Nothing profiles.
    None,
    /// `vmscope record -a`, every VM passive: the host's side alone.
    HostOnly,
    /// `vmscope record -a`, every VM active.
    Active,
    /// `perf record -a`.
    Perf,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::None, Kind::HostOnly, Kind::Active, Kind::Perf];

    pub fn name(self) -> &'static str {
        match self {
            Kind::None => "none",
            Kind::HostOnly => "host-only",
            Kind::Active => "active",
            Kind::Perf => "perf",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// What runs, in words.
    pub fn describe(self, freq: u64) -> String {
        match self {
            Kind::None => "no profiler".into(),
            Kind::HostOnly => format!("vmscope record -a -F {freq}, every VM passive (host rings)"),
            Kind::Active => format!("vmscope record -a -F {freq}, every VM active (host + agents)"),
            Kind::Perf => format!("perf record -a -F {freq}"),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Spec {
    pub kind: Kind,
    pub freq: u64,
    /// VMs to name with `--vm NAME=ROLE`.
    pub vms: Vec<String>,
    /// The session file (vmscope) or perf.data (perf).
    pub output: PathBuf,
    /// The `vmscope` binary.
    pub vmscope: PathBuf,
    /// How long the profiler may take to start sampling.
    pub ready_timeout: Duration,
    /// vmscope: fail when a VM cannot take the role asked for.
    pub strict: bool,
    /// Replace an output or log that vmscope did not write (the command's
    /// `--force`).
    pub force: bool,
}

/// Where a profiler's output and log may be written: a session replaces
/// only a session, a perf.data and a log only what vmscope marked as
/// written (store::output, docs/architecture.md §7.1), unless `force`.
fn check_output(path: &Path, force: bool) -> Result<(), String> {
    use vmscope_store::output::{check_output, OutputKind, OutputOptions};
    let kind = if path.extension().is_some_and(|e| e == "db") {
        OutputKind::Session
    } else {
        OutputKind::Artifact
    };
    check_output(path, kind, &OutputOptions::new(force, &[]))
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Before a run: every file in `dir` whose name a run may write (`ours`
/// says which) may be replaced; else the first that may not, in one line.
pub fn check_dir(dir: &Path, ours: impl Fn(&str) -> bool, force: bool) -> Result<(), String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| ours(n))
        .collect();
    names.sort();
    for n in names {
        check_output(&dir.join(&n), force)?;
    }
    Ok(())
}

/// Whether `name` is `PREFIX-N.EXT` for one of `exts` (N a number).
pub fn numbered(name: &str, prefix: &str, exts: &[&str]) -> bool {
    let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let Some((n, ext)) = rest.rsplit_once('.') else {
        return false;
    };
    exts.contains(&ext) && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
}

/// A running profiler.
pub struct Running {
    child: Child,
    kind: Kind,
    output: PathBuf,
    log: PathBuf,
    started: Instant,
    _fifos: Option<tempfile::TempDir>,
    /// perf's control FIFO, kept open while perf runs.
    _ctl: Option<std::fs::File>,
}

/// What a profiler did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stopped {
    /// CPU time of the profiler process and its children (user + system),
    /// seconds.
    pub cpu_s: f64,
    pub wall_s: f64,
    /// Samples it says it took.
    pub samples: u64,
    /// Samples (perf: events) it says it lost.
    pub lost: u64,
    /// vmscope, active VMs: samples the agents sent and lost.
    pub guest_samples: u64,
    pub guest_lost: u64,
    /// vmscope: what the profilers measured of their own cost (the
    /// session's `profiler` rows): the host recorder's CPU and sampling
    /// interrupts against the host CPU it observed, and the agents' (their
    /// CPU and their guests' sampling interrupts) against their guests' CPU,
    /// all VMs together; seconds.
    pub host_cost_s: f64,
    pub host_observed_s: f64,
    pub guest_cost_s: f64,
    pub guest_observed_s: f64,
    pub output: PathBuf,
}

impl Stopped {
    /// The host recorder's measured cost as a fraction of the host CPU it
    /// observed (`None`: not measured).
    pub fn host_cost(&self) -> Option<f64> {
        (self.host_observed_s > 0.0).then(|| self.host_cost_s / self.host_observed_s)
    }

    /// The agents' measured cost as a fraction of their guests' CPU.
    pub fn guest_cost(&self) -> Option<f64> {
        (self.guest_observed_s > 0.0).then(|| self.guest_cost_s / self.guest_observed_s)
    }
}

fn log_tail(p: &Path) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// Starts the profiler and waits until it samples. `Kind::None` is an
/// error (nothing to start).
pub fn start(spec: &Spec) -> Result<Running, String> {
    let log = spec.output.with_extension("log");
    check_output(&spec.output, spec.force)?;
    check_output(&log, spec.force)?;
    let logf = std::fs::File::create(&log)
        .map_err(|e| format!("creating the profiler log {}: {e}", log.display()))?;
    let _ = std::fs::remove_file(&spec.output);
    let mut fifos = None;
    let mut cmd;
    match spec.kind {
        Kind::None => return Err("no profiler to start".into()),
        Kind::HostOnly | Kind::Active => {
            cmd = Command::new(&spec.vmscope);
            cmd.args(["record", "-a", "-F", &spec.freq.to_string(), "-o"])
                .arg(&spec.output);
            let role = if spec.kind == Kind::Active {
                "active"
            } else {
                "passive"
            };
            // Every VM on the host takes the role, unless some are named:
            // left alone, the recorder makes active every VM whose agent
            // answers, and host-only would measure the active case.
            let vms = if spec.vms.is_empty() {
                every_vm()
            } else {
                spec.vms.clone()
            };
            for vm in &vms {
                cmd.arg("--vm").arg(format!("{vm}={role}"));
            }
            if spec.strict {
                cmd.arg("--strict");
            }
        }
        Kind::Perf => {
            let perf = which("perf").ok_or(
                "perf is not installed (Debian package linux-perf) and `perf` is a profiler asked for",
            )?;
            let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
            let (ctl, ack) = (dir.path().join("ctl"), dir.path().join("ack"));
            for f in [&ctl, &ack] {
                let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes())
                    .map_err(|e| e.to_string())?;
                // SAFETY: a valid C string; mkfifo has no other preconditions.
                if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
                    return Err(format!(
                        "mkfifo {}: {}",
                        f.display(),
                        std::io::Error::last_os_error()
                    ));
                }
            }
            cmd = Command::new(perf);
            cmd.args(["record", "-a", "-F", &spec.freq.to_string(), "-o"])
                .arg(&spec.output)
                .arg("--delay=-1")
                .arg(format!(
                    "--control=fifo:{},{}",
                    ctl.display(),
                    ack.display()
                ));
            fifos = Some(dir);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf)
        .process_group(0);
    let child = cmd
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", cmd.get_program()))?;
    let mut r = Running {
        child,
        kind: spec.kind,
        output: spec.output.clone(),
        log,
        started: Instant::now(),
        _fifos: None,
        _ctl: None,
    };
    let deadline = Instant::now() + spec.ready_timeout;
    wait_sampling(&mut r, spec, fifos, deadline)?;
    r.started = Instant::now();
    Ok(r)
}

/// Waits until the started profiler samples: perf acknowledges `enable`
/// on its control FIFO, or vmscope's session holds its first samples. A
/// profiler that exits or misses the deadline is killed and said.
fn wait_sampling(
    r: &mut Running,
    spec: &Spec,
    fifos: Option<tempfile::TempDir>,
    deadline: Instant,
) -> Result<(), String> {
    match (&fifos, spec.kind) {
        (Some(dir), Kind::Perf) => {
            let ctl = dir.path().join("ctl");
            let ack = dir.path().join("ack");
            // Opening the FIFOs blocks until perf opens its ends: do it on a
            // thread so a perf that dies early cannot hang us.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let r = (|| -> std::io::Result<(String, std::fs::File)> {
                    let mut c = std::fs::OpenOptions::new().write(true).open(&ctl)?;
                    let a = std::fs::File::open(&ack)?;
                    c.write_all(b"enable\n")?;
                    let mut line = String::new();
                    std::io::BufReader::new(a).read_line(&mut line)?;
                    Ok((line, c))
                })();
                let _ = tx.send(r);
            });
            loop {
                if let Ok(r0) = rx.recv_timeout(Duration::from_millis(100)) {
                    match r0 {
                        Ok((l, c)) if l.trim() == "ack" => {
                            r._ctl = Some(c);
                            break;
                        }
                        Ok((l, _)) => {
                            let _ = r.kill();
                            return Err(format!("perf answered `{}` to enable", l.trim()));
                        }
                        Err(e) => {
                            let _ = r.kill();
                            return Err(format!("perf's control FIFO: {e}"));
                        }
                    }
                }
                if let Some(err) = r.exited() {
                    return Err(err);
                }
                if Instant::now() >= deadline {
                    let _ = r.kill();
                    return Err(format!(
                        "perf did not start sampling within {} s",
                        spec.ready_timeout.as_secs()
                    ));
                }
            }
            r._fifos = fifos;
        }
        _ => loop {
            if let Some(err) = r.exited() {
                return Err(err);
            }
            if session_samples(&spec.output).is_some_and(|n| n > 0) {
                break;
            }
            if Instant::now() >= deadline {
                let _ = r.kill();
                return Err(format!(
                    "vmscope record did not store a sample within {} s ({})",
                    spec.ready_timeout.as_secs(),
                    log_tail(&r.log)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        },
    }
    Ok(())
}

/// The names of every QEMU VM on this host (discovery without QMP).
fn every_vm() -> Vec<String> {
    let opts = vmscope_discover::DiscoverOptions {
        query_qmp: false,
        ..Default::default()
    };
    vmscope_discover::discover(&opts)
        .map(|vms| vms.into_iter().map(|v| v.name).collect())
        .unwrap_or_default()
}

/// Host samples stored in a session being written, once it is readable:
/// the recorder writes `PATH.partial` and renames it when it finishes.
fn session_samples(path: &Path) -> Option<u64> {
    let partial = vmscope_store::output::partial_path(path);
    let path = if partial.exists() {
        partial.as_path()
    } else if path.exists() {
        path
    } else {
        return None;
    };
    let s = vmscope_store::Session::open(path).ok()?;
    // From the bins: a recording's rows wait for its first read.
    s.stored_samples().ok()
}

use vmscope_lab::util::which;

impl Running {
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// `Some(error)` when the child exited already.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(st)) => Some(format!(
                "the profiler exited ({st}) before sampling: {}",
                log_tail(&self.log)
            )),
            _ => None,
        }
    }

    fn kill(&mut self) -> std::io::Result<()> {
        // SAFETY: signals the process group this code created.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let r = self.child.wait().map(drop);
        self.mark_ours();
        r
    }

    /// Marks the log and a perf.data as vmscope's, so that the next run
    /// may replace them while they are unchanged: after every end of the
    /// profiler, a failed or killed one too (a sample redone after a
    /// failure writes the same names). A session is known by its content.
    fn mark_ours(&self) {
        vmscope_store::output::mark(&self.log);
        if self.kind == Kind::Perf && self.output.exists() {
            vmscope_store::output::mark(&self.output);
        }
    }

    /// Stops it (SIGINT, up to 60 s, then SIGKILL) and reads what it did.
    pub fn stop(self) -> Result<Stopped, String> {
        let pid = self.child.id() as i32;
        let wall_s = self.started.elapsed().as_secs_f64();
        // SAFETY: signals our own child.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut status = 0;
        // SAFETY: zeroed rusage we own.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: waits for our own child, writing into our rusage.
            let r = unsafe { libc::wait4(pid, &raw mut status, libc::WNOHANG, &raw mut ru) };
            if r == pid {
                break;
            }
            if r < 0 {
                return Err(format!(
                    "waiting for the profiler: {}",
                    std::io::Error::last_os_error()
                ));
            }
            if Instant::now() >= deadline {
                // SAFETY: as above.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        let cpu_s = tv(ru.ru_utime) + tv(ru.ru_stime);
        let mut text = String::new();
        let _ = std::fs::File::open(&self.log).and_then(|mut f| f.read_to_string(&mut text));
        self.mark_ours();
        // perf record finishes its file on SIGINT, then re-raises the
        // signal: dying of the SIGINT sent above is a clean stop.
        let ok = (libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0)
            || (libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGINT);
        if !ok {
            return Err(format!(
                "the profiler failed (status {status:#x}): {}",
                log_tail(&self.log)
            ));
        }
        let mut out = Stopped {
            cpu_s,
            wall_s,
            output: self.output.clone(),
            ..Default::default()
        };
        if self.kind == Kind::Perf {
            let (s, l) = parse_perf_log(&text);
            out.samples = s;
            out.lost = l;
        } else {
            let (s, l) = parse_record_log(&text);
            out.samples = s;
            out.lost = l;
            if let Ok(sess) = vmscope_store::Session::open(&self.output) {
                for sc in sess.scales().unwrap_or_default() {
                    out.guest_samples += sc.agent_samples;
                    out.guest_lost += sc.agent_lost;
                }
                for r in sess.intervals(Some("profiler")).unwrap_or_default() {
                    let host = r.domain.as_deref() == Some("host");
                    match (r.metric.as_str(), host) {
                        ("cost", true) => out.host_cost_s += r.value,
                        ("capacity", true) => out.host_observed_s += r.value,
                        ("cost", false) => out.guest_cost_s += r.value,
                        ("capacity", false) => out.guest_observed_s += r.value,
                        _ => {}
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.kill();
        }
    }
}

/// (samples, lost) from `[ vmscope record: N samples (L lost) ... ]`.
pub fn parse_record_log(text: &str) -> (u64, u64) {
    text.lines()
        .rev()
        .find_map(|l| {
            let rest = l.split("vmscope record: ").nth(1)?;
            let mut w = rest.split_whitespace();
            let n = w.next()?.parse().ok()?;
            let lost = rest
                .split_once('(')?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((n, lost))
        })
        .unwrap_or((0, 0))
}

/// (samples, lost events) from perf record's closing lines:
/// `[ perf record: Captured and wrote 1.2 MB F (N samples) ]` and
/// `Processed N events and lost M chunks!`.
pub fn parse_perf_log(text: &str) -> (u64, u64) {
    let samples = text
        .lines()
        .find_map(|l| {
            let i = l.find(" samples)")?;
            l[..i].rsplit('(').next()?.trim().parse().ok()
        })
        .unwrap_or(0);
    let lost = text
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once(" and lost ")?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    (samples, lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample whose profiler was killed (its workload failed, the run was
    /// redone) leaves its perf.data and log under the names the next runs
    /// reuse: they are vmscope's, and replaced without `--force`.
    #[test]
    fn files_of_a_killed_profiler_are_replaced_by_the_next_run() {
        if !vmscope_testkit::is_root() {
            vmscope_testkit::skip("perf record -a needs root");
            return;
        }
        if !vmscope_testkit::require_tools(&[("perf", "linux-perf")]) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec {
            kind: Kind::Perf,
            freq: 99,
            vms: Vec::new(),
            output: dir.path().join("perf-0.data"),
            vmscope: PathBuf::from("vmscope"),
            ready_timeout: Duration::from_secs(30),
            strict: false,
            force: false,
        };
        drop(start(&spec).unwrap());
        assert!(spec.output.with_extension("log").exists());
        let again = start(&spec).expect("the files of the killed run are replaced");
        again.stop().unwrap();
        // A file of the same name that vmscope did not write is not.
        std::fs::write(&spec.output, b"the user's").unwrap();
        let e = start(&spec)
            .err()
            .expect("a file vmscope did not write is kept");
        assert!(e.contains("perf-0.data"), "{e}");
        assert_eq!(std::fs::read(&spec.output).unwrap(), b"the user's");
    }

    #[test]
    fn closing_lines() {
        assert_eq!(
            parse_record_log(
                "vmscope: VM x: profiled as passive\n[ vmscope record: 12345 samples (7 lost) in 5.01 s written to /x.db ]\n"
            ),
            (12345, 7)
        );
        assert_eq!(parse_record_log("nothing"), (0, 0));
        assert_eq!(
            parse_perf_log(
                "[ perf record: Woken up 3 times to write data ]\nProcessed 100 events and lost 2 chunks!\n\
                 [ perf record: Captured and wrote 0.512 MB /tmp/p.data (10042 samples) ]\n"
            ),
            (10042, 2)
        );
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.name()), Some(k));
            assert!(!k.describe(1000).is_empty());
        }
    }
}
