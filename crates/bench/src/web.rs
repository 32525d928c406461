//! `vmscope bench web`: menon2005 §6.3's web server experiment (Fig 7) and
//! cherkasova2005's file sizes. A static-file server — busybox httpd,
//! serving one generated file of `--file-size` bytes — runs on the host
//! (`host`) or in a lab VM reached over its tap NIC (`guest-same-cpu`,
//! `guest-separate-cpu`, or any spec with a tap NIC); httperf on the host
//! offers an open-loop load, one connection per request, at each rate of
//! `--rate` in turn.
//!
//! Per configuration the rates are swept upward until the reply rate stops
//! following the offered rate ([`Follow`]): the first rate whose mean reply
//! rate is below `--follow` × offered is marked saturated and ends that
//! configuration's sweep. A rate httperf itself could not offer (fd-unavail
//! errors, or its request rate short of the offered rate while the server
//! was not queueing connections) is marked generator-limited and ends the
//! sweep too: higher rates would measure httperf, not the server.
//!
//! Each rate is one point of the shared sampling loop ([`crate::driver`]):
//! warm-up, repeats until the interval is within `--ci`, busy-host redo,
//! a VM that dies marking its point failed (the other configurations go
//! on). Around each sample the host is read as `bench net` reads it
//! ([`crate::cpu::CpuProbe`]); the host CPU per reply is what the run cost
//! the host (this process and its children, the VM's QEMU, kernel threads)
//! less the CPU httperf reports for itself, over the 2xx replies.

use crate::chart::{fmt_num, LineChart, Series, SeriesPoint};
use crate::cpu::{CpuProbe, HostCpu};
use crate::driver::{self, mean_of, DriveOptions, Experiment, PointOutcome, Sink};
use crate::guest::{Guest, VmFailure};
use crate::httperf;
use crate::hygiene::LoadSample;
use crate::lab_session::LabSession;
use crate::manifest::Manifest;
use crate::netlab::{no_tap, tap_ip, Check};
use crate::options::{LabChoice, Output, Recording, Sampling};
use crate::output::table;
use crate::progress::Progress;
use crate::row::{unit, Point, Row};
use crate::schedule::Step;
use crate::stats::finite;
use crate::units::short_iec;
use crate::BenchError;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmscope_lab::spec::NicKind;
use vmscope_lab::LabSpec;

/// The configurations of menon2005 Fig 7 this machine can run.
pub const DEFAULT_CONFIGS: &str = "host,guest-same-cpu,guest-separate-cpu";
/// Offered rates, requests/s.
pub const DEFAULT_RATES: &str = "100..1000:100";
/// The reply rate follows the offered rate while at least this share of it.
pub const DEFAULT_FOLLOW: f64 = 0.9;
/// Where the served file lives in a guest.
const GUEST_ROOT: &str = "/tmp/vmscope-web";

/// Everything `bench web` is asked to do.
#[derive(Debug, Clone)]
pub struct WebOptions {
    /// The configurations (`--lab`): `host`, or a lab spec (built-in name
    /// or file) with a tap NIC.
    pub configs: Vec<String>,
    /// Offered rates, requests/s, ascending.
    pub rates: Vec<u32>,
    pub file_size: u64,
    /// Seconds of offered load per run (connections = rate × seconds).
    pub seconds: f64,
    /// httperf's --timeout, seconds.
    pub timeout: f64,
    pub port: u16,
    pub follow: f64,
    /// The httperf program; `None`: found on PATH.
    pub httperf: Option<PathBuf>,
    /// Run the accountant around every sample.
    pub account: bool,
    pub sampling: Sampling,
    pub output: Output,
    /// Where labs live, whether to keep them; `lab.name` (`--lab-name`)
    /// prefixes every lab's name (`NAME-SPECNAME`), since a run has
    /// several; `lab.spec` is not used (the labs are `configs`).
    pub lab: LabChoice,
    /// `--record DIR`: after its samples, each point runs once more under
    /// `vmscope record -a` (VMs active), stored as DIR/web-CONFIG-RATE-1.db.
    pub record: Recording,
}

/// `bench web`'s repeats when none are given (at least, at most).
pub const DEFAULT_REPEAT: (usize, usize) = (3, 6);

impl Default for WebOptions {
    fn default() -> Self {
        WebOptions {
            configs: DEFAULT_CONFIGS.split(',').map(String::from).collect(),
            rates: parse_rates(DEFAULT_RATES).unwrap_or_default(),
            file_size: 1024,
            seconds: 5.0,
            timeout: 5.0,
            port: 8080,
            follow: DEFAULT_FOLLOW,
            httperf: None,
            account: true,
            sampling: Sampling::default(),
            output: Output::default(),
            lab: LabChoice::default(),
            record: Recording::default(),
        }
    }
}

/// `A..B:STEP` (A, A+STEP, ... up to B) and/or a comma list, requests/s;
/// sorted, without repeats.
pub fn parse_rates(text: &str) -> Result<Vec<u32>, String> {
    let bad = |why: &str| {
        format!("--rate {text}: {why} (want A..B:STEP and/or a list, such as 100..1000:100)")
    };
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        if let Some((a, rest)) = part.split_once("..") {
            let (b, step) = rest
                .split_once(':')
                .ok_or_else(|| bad("a range needs :STEP"))?;
            let n = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| bad(&format!("`{s}` is not a whole number")))
            };
            let (a, b, step) = (n(a)?, n(b)?, n(step)?);
            if step == 0 || a == 0 || b < a {
                return Err(bad("a range needs 0 < A <= B and STEP > 0"));
            }
            let mut r = a;
            while r <= b {
                out.push(r);
                r = match r.checked_add(step) {
                    Some(x) => x,
                    None => break,
                };
            }
        } else {
            let r: u32 = part
                .parse()
                .map_err(|_| bad(&format!("`{part}` is not a whole number")))?;
            if r == 0 {
                return Err(bad("a rate must be above 0"));
            }
            out.push(r);
        }
    }
    out.sort_unstable();
    out.dedup();
    if out.is_empty() {
        return Err(bad("no rates"));
    }
    Ok(out)
}

/// Whether a rate's replies followed its offered load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Follow {
    /// Reply rate ≥ `--follow` × offered.
    Follows,
    /// The server fell behind: the sweep of this configuration ends here.
    Saturated,
    /// httperf could not offer the rate: the sweep ends, the point says so.
    GeneratorLimited,
    /// The point failed (a VM died, a command failed).
    Failed,
}

impl Follow {
    pub fn name(self) -> &'static str {
        match self {
            Follow::Follows => "follows",
            Follow::Saturated => "saturated",
            Follow::GeneratorLimited => "generator-limited",
            Follow::Failed => "failed",
        }
    }
}

/// One configuration: the host, or a lab's VM.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// `host`, or the spec's name (before any --lab-prefix).
    pub label: String,
    pub spec: Option<LabSpec>,
}

/// One point: a configuration at one offered rate.
#[derive(Debug, Clone)]
pub struct WebPoint {
    pub config: usize,
    pub rate: u32,
    pub point: Point,
}

/// One sample: one httperf run.
#[derive(Debug, Clone)]
pub struct WebSample {
    pub offered: u32,
    pub run: httperf::Run,
    pub host: HostCpu,
    pub vm_pids: Vec<u32>,
    pub raw: String,
}

impl WebSample {
    pub fn reply_rate(&self) -> f64 {
        self.run.reply_rate()
    }

    /// What the run cost the host besides httperf, CPU seconds.
    pub fn server_cpu_s(&self) -> f64 {
        (self.host.load.own_s + self.host.load.kthreads_s - self.run.cpu_s).max(0.0)
    }

    /// [`WebSample::server_cpu_s`] per 2xx reply.
    pub fn cpu_per_reply_s(&self) -> f64 {
        if self.run.status_2xx > 0 {
            self.server_cpu_s() / self.run.status_2xx as f64
        } else {
            0.0
        }
    }

    pub fn vm_io_charge_s(&self) -> f64 {
        self.vm_pids
            .iter()
            .filter_map(|p| self.host.vm(Some(*p)))
            .map(crate::cpu::VmCpu::io_charge_s)
            .sum()
    }

    /// httperf could not offer the rate: it ran out of file descriptors,
    /// or it sent requests slower than asked while connections completed
    /// within the interval between two arrivals (the server was not
    /// queueing them, so the shortfall is httperf's own). A server that
    /// falls behind makes connections wait longer than that: saturation.
    pub fn generator_limited(&self, follow: f64) -> bool {
        let interval_ms = 1e3 / f64::from(self.offered);
        self.run.errors.fd_unavail > 0
            || (self.run.request_rate < follow * f64::from(self.offered)
                && self.run.conn_time_avg_ms < interval_ms)
    }
}

/// Where the server runs for one configuration.
enum Server {
    /// busybox httpd started per sample on 127.0.0.1, serving `dir`.
    Host {
        busybox: PathBuf,
        dir: tempfile::TempDir,
    },
    /// busybox httpd started once in the guest.
    Vm { guest: Box<Guest> },
}

/// Where httperf runs for one configuration. menon2005's client was a
/// machine of its own; here it shares the host with the VM, so it is
/// pinned to the host CPUs that none of the VM's pinned threads (vCPUs,
/// emulator, I/O threads) use. When no such CPU is left, `shares` says
/// what the client competes with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCpus {
    /// CPUs httperf is pinned to (empty: not pinned).
    pub cpus: Vec<usize>,
    /// What httperf shares its CPUs with, when it has none of its own.
    pub shares: Option<String>,
}

/// The CPUs of `host_cpus` left to the client by `vm`'s pinned threads.
pub fn client_cpus(vm: &vmscope_lab::spec::VmSpec, host_cpus: usize) -> ClientCpus {
    let floating: Vec<&str> = [
        ("vCPU threads", vm.pin_vcpus.is_empty()),
        ("emulator thread", vm.pin_emulator.is_empty()),
        ("I/O threads", vm.pin_io.is_empty() && vm.iothreads > 0),
    ]
    .into_iter()
    .filter_map(|(what, empty)| empty.then_some(what))
    .collect();
    if !floating.is_empty() {
        return ClientCpus {
            cpus: Vec::new(),
            shares: Some(format!(
                "httperf shares the host's CPUs with {}'s unpinned {}",
                vm.name,
                floating.join(" and ")
            )),
        };
    }
    let mut used: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (what, cpus) in [
        ("vCPU", &vm.pin_vcpus),
        ("emulator", &vm.pin_emulator),
        ("I/O", &vm.pin_io),
    ] {
        for &c in cpus {
            let e = used.entry(c).or_default();
            if !e.contains(&what) {
                e.push(what);
            }
        }
    }
    let free: Vec<usize> = (0..host_cpus).filter(|c| !used.contains_key(c)).collect();
    if free.is_empty() {
        let on: Vec<String> = used
            .iter()
            .map(|(c, w)| format!("CPU {c} runs its {}", w.join(" and ")))
            .collect();
        ClientCpus {
            cpus: Vec::new(),
            shares: Some(format!(
                "httperf has no host CPU of its own beside {} (on {} CPUs: {})",
                vm.name,
                host_cpus,
                on.join(", ")
            )),
        }
    } else {
        ClientCpus {
            cpus: free,
            shares: None,
        }
    }
}

/// `0,1,3` for a CPU list.
fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// One configuration's sweep state.
struct Runner<'a> {
    opts: &'a WebOptions,
    httperf: String,
    probe: &'a mut CpuProbe,
    server: Server,
    addr: IpAddr,
    uri: String,
    points: Vec<WebPoint>,
    /// CPUs httperf is pinned to (empty: not pinned).
    client_cpus: Vec<usize>,
}

impl Runner<'_> {
    fn pids(&self) -> Vec<u32> {
        match &self.server {
            Server::Vm { guest } => guest.vm().pid.into_iter().collect(),
            Server::Host { .. } => Vec::new(),
        }
    }

    fn dead(&self) -> Option<String> {
        match &self.server {
            Server::Vm { guest } => guest.dead(),
            Server::Host { .. } => None,
        }
    }

    fn start_host_httpd(&self) -> Result<Option<Child>, VmFailure> {
        let Server::Host { busybox, dir } = &self.server else {
            return Ok(None);
        };
        let mut cmd = Command::new(busybox);
        // SAFETY: prctl(2) only, between fork and exec: the server dies
        // with this process, also when it is killed.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut c = cmd
            .args(["httpd", "-f", "-p"])
            .arg(format!("127.0.0.1:{}", self.opts.port))
            .arg("-h")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| VmFailure::Failed(format!("starting busybox httpd: {e}")))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !vmscope_workload::net::is_listening(self.opts.port) {
            if let Ok(Some(st)) = c.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = c.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(VmFailure::Failed(format!(
                    "busybox httpd on port {} exited ({st}): {}",
                    self.opts.port,
                    err.trim()
                )));
            }
            if Instant::now() > deadline {
                stop(&mut c);
                return Err(VmFailure::Failed(format!(
                    "busybox httpd does not listen on port {} after 10 s",
                    self.opts.port
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Some(c))
    }

    fn sample(&mut self, rate: u32) -> Result<WebSample, VmFailure> {
        if let Some(d) = self.dead() {
            return Err(VmFailure::Dead(d));
        }
        let conns = ((f64::from(rate) * self.opts.seconds).round() as u64).max(1);
        let argv = httperf::argv(
            &self.httperf,
            &self.addr.to_string(),
            self.opts.port,
            &self.uri,
            rate,
            conns,
            self.opts.timeout,
        );
        let pids = self.pids();
        let mut httpd = self.start_host_httpd()?;
        let group = httpd.as_ref().and_then(|c| CpuGroup::around(c.id()));
        let group_start = group.as_ref().and_then(CpuGroup::cpu_s);
        let mark = self.probe.mark(&pids);
        let mut cmd = Command::new(&argv[0]);
        // httperf dies with this process, even when it is killed with
        // SIGKILL (a load generator left running skews whatever runs next).
        // SAFETY: prctl(2) on the child itself, between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        if !self.client_cpus.is_empty() {
            let cpus = self.client_cpus.clone();
            // SAFETY: sched_setaffinity(2) on the child itself, between
            // fork and exec, with a set built before the fork.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    for &c in &cpus {
                        libc::CPU_SET(c, &mut set);
                    }
                    if libc::sched_setaffinity(
                        0,
                        std::mem::size_of::<libc::cpu_set_t>(),
                        &raw const set,
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let out = cmd.args(&argv[1..]).stdin(Stdio::null()).output();
        // The host's server is stopped and reaped before the reading, so
        // its own CPU counts as this run's (this process's children); its
        // connection processes, reaped by nobody, are the rest of its
        // group's usage.
        let mut extra = 0.0;
        if let Some(c) = httpd.as_mut() {
            let main = proc_cpu_s(c.id());
            let total = group.as_ref().and_then(CpuGroup::cpu_s);
            if let (Some(main), Some(t0), Some(t1)) = (main, group_start, total) {
                extra = (t1 - t0 - main).max(0.0);
            }
            stop(c);
        }
        drop(group);
        let mut host = self.probe.since(&mark);
        host.load.own_s += extra;
        host.load.other_s = (host.load.other_s - extra).max(0.0);
        let out = out.map_err(|e| VmFailure::Failed(format!("running {}: {e}", self.httperf)))?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(d) = self.dead() {
            return Err(VmFailure::Dead(d));
        }
        let run = httperf::parse(&text).map_err(|e| {
            VmFailure::Failed(format!(
                "{e}; httperf's stderr: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })?;
        Ok(WebSample {
            offered: rate,
            run,
            host,
            vm_pids: pids,
            raw: text,
        })
    }

    /// Stops the guest's server (the host's stops after every sample).
    fn close(&mut self) {
        if let Server::Vm { guest } = &mut self.server {
            if guest.dead().is_none() {
                // By its command line (busybox runs it as `busybox`, so
                // its name is not httpd), sparing this shell, whose own
                // command line holds the pattern.
                let _ = guest.sh(
                    &format!(
                        "for d in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $d/cmdline \
                         2>/dev/null)\" in *'httpd -p {} -h {GUEST_ROOT}'*) [ ${{d#/proc/}} = $$ ] || kill ${{d#/proc/}};; \
                         esac; done; true",
                        self.opts.port
                    ),
                    Duration::from_secs(30),
                );
            }
        }
    }
}

/// SIGTERM, then reap (SIGKILL after 5 s).
fn stop(c: &mut Child) {
    // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
    unsafe {
        libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while matches!(c.try_wait(), Ok(None)) {
        if Instant::now() > deadline {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.wait();
}

/// A CPU-accounting cgroup around the host's httpd. busybox httpd forks a
/// process per connection and lets the kernel reap it (SIGCHLD ignored),
/// so that work reaches no parent's `cutime` and would count as other
/// load; the group's usage counts it. cgroup v1 `cpuacct` where mounted,
/// else v2's `cpu.stat`; `None` where neither can be made.
struct CpuGroup {
    dir: PathBuf,
    v1: bool,
}

/// What a run names its web root (in the temporary directory) and its
/// cgroups: `vmscope-web-PID-...`, PID this process's.
const STALE_PREFIX: &str = "vmscope-web-";

/// Remove what runs that are gone left under `dir` (their process killed
/// with SIGKILL, which no handler sees): entries `vmscope-web-PID-*` whose
/// PID no longer runs. `tree`: whole directories (web roots); else empty
/// ones only (cgroups, which rmdir removes once their processes are gone).
fn sweep_stale(dir: &Path, tree: bool) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(STALE_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = if tree {
            std::fs::remove_dir_all(e.path())
        } else {
            std::fs::remove_dir(e.path())
        };
    }
}

impl CpuGroup {
    fn around(pid: u32) -> Option<CpuGroup> {
        let name = format!("{STALE_PREFIX}{}-{pid}", std::process::id());
        for (root, v1) in [
            ("/sys/fs/cgroup/cpuacct", true),
            ("/sys/fs/cgroup/unified", false),
            ("/sys/fs/cgroup", false),
        ] {
            let probe = if v1 {
                "cpuacct.usage"
            } else {
                "cgroup.controllers"
            };
            if !Path::new(root).join(probe).exists() {
                continue;
            }
            sweep_stale(Path::new(root), false);
            let dir = Path::new(root).join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            if std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok() {
                return Some(CpuGroup { dir, v1 });
            }
            let _ = std::fs::remove_dir(&dir);
        }
        None
    }

    /// CPU seconds of the group's processes, dead ones included.
    fn cpu_s(&self) -> Option<f64> {
        if self.v1 {
            let t = std::fs::read_to_string(self.dir.join("cpuacct.usage")).ok()?;
            t.trim().parse::<f64>().ok().map(|ns| ns / 1e9)
        } else {
            let t = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
            t.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map(|us| us / 1e6)
        }
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // Its processes are gone by now (the server is stopped first).
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A process's CPU seconds with its reaped children.
fn proc_cpu_s(pid: u32) -> Option<f64> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let t = std::fs::read_to_string(&path).ok()?;
    let c = vmscope_linux::procfs::parse_process_cpu(&t, &path).ok()?;
    Some((c.utime + c.stime + c.cutime + c.cstime) as f64 / vmscope_linux::procfs::clk_tck())
}

/// The shared loop sees one point at a time: a rate's result decides
/// whether the next rate runs.
struct OnePoint<'r, 'a> {
    runner: &'r mut Runner<'a>,
    index: usize,
}

impl Experiment for OnePoint<'_, '_> {
    type Sample = WebSample;

    fn points(&self) -> usize {
        1
    }

    fn name(&self, _i: usize) -> String {
        self.runner.points[self.index].point.name.clone()
    }

    fn hash(&self, _i: usize) -> String {
        self.runner.points[self.index].point.config_hash.clone()
    }

    fn vms(&self, _i: usize) -> Vec<String> {
        match &self.runner.server {
            Server::Vm { guest } => vec![guest.name().to_string()],
            Server::Host { .. } => Vec::new(),
        }
    }

    fn run(&mut self, _i: usize, _step: Step) -> Result<WebSample, VmFailure> {
        let rate = self.runner.points[self.index].rate;
        self.runner.sample(rate)
    }

    fn value(&self, s: &WebSample) -> f64 {
        s.reply_rate()
    }

    fn load(&self, s: &WebSample) -> LoadSample {
        s.host.load
    }

    fn rows(&self, _i: usize, n: u32, s: &WebSample, flag: Option<String>) -> Vec<Row> {
        let p = &self.runner.points[self.index].point;
        let r = &s.run;
        let mut rows = vec![
            p.row(n, "reply_rate", s.reply_rate(), unit::OPS_PER_S)
                .raw(Some(s.raw.clone())),
            p.row(n, "offered_rate", f64::from(s.offered), unit::OPS_PER_S),
            p.row(n, "request_rate", r.request_rate, unit::OPS_PER_S),
            p.row(n, "replies_2xx", r.status_2xx as f64, unit::COUNT),
            p.row(n, "requests", r.requests as f64, unit::COUNT),
            p.row(n, "errors", r.errors.total as f64, unit::COUNT),
            p.row(
                n,
                "errors_client_timo",
                r.errors.client_timo as f64,
                unit::COUNT,
            ),
            p.row(
                n,
                "errors_connrefused",
                r.errors.connrefused as f64,
                unit::COUNT,
            ),
            p.row(
                n,
                "errors_connreset",
                r.errors.connreset as f64,
                unit::COUNT,
            ),
            p.row(
                n,
                "errors_fd_unavail",
                r.errors.fd_unavail as f64,
                unit::COUNT,
            ),
            p.row(n, "duration", r.duration_s, unit::SECONDS),
            p.row(n, "conn_time_avg", r.conn_time_avg_ms / 1e3, unit::SECONDS),
            p.row(
                n,
                "conn_time_median",
                r.conn_time_median_ms / 1e3,
                unit::SECONDS,
            ),
            p.row(n, "response_time", r.response_ms / 1e3, unit::SECONDS),
            p.row(n, "httperf_cpu", r.cpu_s, unit::SECONDS),
            p.row(n, "host_busy", s.host.load.host_busy_s, unit::SECONDS),
            p.row(n, "server_host_cpu", s.server_cpu_s(), unit::SECONDS),
            p.row(n, "host_cpu_per_reply", s.cpu_per_reply_s(), unit::SECONDS),
            p.row(n, "other_load", s.host.load.other_cpus(), unit::S_PER_S),
        ];
        if s.host.accounted && !s.vm_pids.is_empty() {
            rows.push(p.row(n, "vm_io_charge", s.vm_io_charge_s(), unit::SECONDS));
        }
        rows.into_iter().map(|r| r.flagged(flag.clone())).collect()
    }
}

/// What a run produced.
pub struct WebOutcome {
    pub accel: Option<String>,
    pub configs: Vec<WebConfig>,
    pub points: Vec<WebPoint>,
    pub results: Vec<PointOutcome<WebSample>>,
    pub follow: Vec<Follow>,
    pub checks: Vec<Check>,
    pub charts: Vec<PathBuf>,
    pub notes: Vec<String>,
    /// Where httperf ran, per configuration (the host's: not pinned).
    pub client: Vec<ClientCpus>,
}

impl WebOutcome {
    pub fn failed_points(&self) -> usize {
        self.results.iter().filter(|r| r.failed.is_some()).count()
    }

    /// A configuration's highest mean reply rate, its interval, and
    /// whether the configuration saturated (else the peak is a lower bound).
    pub fn peak(&self, config: usize) -> Option<(f64, f64, bool)> {
        let mut best: Option<(f64, f64)> = None;
        for (pt, r) in self.points.iter().zip(&self.results) {
            if pt.config != config || r.failed.is_some() {
                continue;
            }
            if let Some(s) = r.summary() {
                if best.is_none_or(|(m, _)| s.mean > m) {
                    best = Some((s.mean, finite(s.ci95)));
                }
            }
        }
        let saturated = self
            .points
            .iter()
            .zip(&self.follow)
            .any(|(pt, f)| pt.config == config && *f == Follow::Saturated);
        best.map(|(m, ci)| (m, ci, saturated))
    }
}

fn check_bad(opts: &WebOptions) -> Result<(), BenchError> {
    if opts.configs.is_empty() {
        return Err(BenchError::bad(
            "--lab is empty: give host and/or lab specs",
        ));
    }
    if opts.rates.is_empty() {
        return Err(BenchError::bad("--rate is empty"));
    }
    if opts.file_size == 0 || opts.file_size > 1 << 30 {
        return Err(BenchError::bad(format!(
            "--file-size {} must be 1 byte to 1 GiB",
            opts.file_size
        )));
    }
    if !(opts.seconds >= 0.5 && opts.seconds <= 3600.0) {
        return Err(BenchError::bad(format!(
            "--seconds {} must be 0.5 to 3600",
            opts.seconds
        )));
    }
    if !(opts.timeout > 0.0 && opts.timeout <= 600.0) {
        return Err(BenchError::bad(format!(
            "--timeout {} must be above 0 and at most 600 seconds",
            opts.timeout
        )));
    }
    if !(opts.follow > 0.0 && opts.follow <= 1.0) {
        return Err(BenchError::bad(format!(
            "--follow {} must be a fraction above 0 and at most 1",
            opts.follow
        )));
    }
    if opts.port == 0 {
        return Err(BenchError::bad("--port 0: name a TCP port"));
    }
    opts.sampling.rule(DEFAULT_REPEAT.0, DEFAULT_REPEAT.1)?;
    opts.record.check()?;
    Ok(())
}

/// The configurations, their specs checked for a tap NIC before any lab
/// comes up.
fn configs(opts: &WebOptions) -> Result<Vec<WebConfig>, BenchError> {
    let mut out: Vec<WebConfig> = Vec::new();
    for c in &opts.configs {
        if out.iter().any(|x| &x.label == c) {
            return Err(BenchError::bad(format!("--lab {c} is given twice")));
        }
        if c == "host" {
            out.push(WebConfig {
                label: "host".into(),
                spec: None,
            });
            continue;
        }
        let mut spec = crate::options::load_lab(c, None)?;
        let label = spec.name.clone();
        let vm = spec
            .vms
            .first()
            .ok_or_else(|| BenchError::bad(format!("--lab {c}: lab {} has no VM", spec.name)))?;
        if !vm.nics.iter().any(|n| n.kind == NicKind::Tap) {
            return Err(BenchError::bad(format!(
                "--lab {c}: {}",
                no_tap(&vm.name, &spec.name)
            )));
        }
        if let Some(p) = &opts.lab.name {
            let name = format!("{p}-{}", spec.name);
            if !vmscope_lab::names::valid_name(&name) {
                return Err(BenchError::bad(format!(
                    "--lab-name {p}: lab name {name} is not valid (letters, digits, '-' and \
                     '_', at most 32 characters)"
                )));
            }
            spec.name = name;
        }
        out.push(WebConfig {
            label,
            spec: Some(spec),
        });
    }
    Ok(out)
}

/// Runs `bench web`; results go to `out` in `opts.output.format`.
pub fn run(opts: &WebOptions, out: &mut dyn Write) -> Result<WebOutcome, BenchError> {
    check_bad(opts)?;
    let configs = configs(opts)?;
    let httperf = match &opts.httperf {
        Some(p) if p.is_file() => p.clone(),
        Some(p) => {
            return Err(BenchError::bad(format!(
                "--httperf {}: no such program (Debian package httperf)",
                p.display()
            )))
        }
        None => vmscope_lab::util::which("httperf")
            .ok_or_else(|| BenchError::bad("httperf is not installed (Debian package httperf)"))?,
    };
    let has_host = configs.iter().any(|c| c.spec.is_none());
    let busybox = if has_host {
        Some(vmscope_lab::util::which("busybox").ok_or_else(|| {
            BenchError::bad(
                "busybox is not installed (Debian package busybox-static): the host's web \
                 server is its httpd",
            )
        })?)
    } else {
        None
    };
    if has_host {
        vmscope_workload::net::check_port(SocketAddr::from(([127, 0, 0, 1], opts.port)))
            .map_err(|e| BenchError::bad(format!("--port {}: {e}", opts.port)))?;
    }
    // -o is checked and locked before anything runs.
    let opened = opts.output.open()?;
    let r = run_configs(
        opts,
        &configs,
        &httperf,
        busybox,
        opened.session,
        &opened.progress,
        out,
    );
    opened.progress.finish();
    r
}

/// Where httperf runs for `cfg` (host CPUs none of the VM's pinned
/// threads use), said in a note.
fn placement_of(cfg: &WebConfig, host_cpus: usize, notes: &mut Vec<String>) -> ClientCpus {
    let placement = cfg
        .spec
        .as_ref()
        .and_then(|spec| {
            spec.vms
                .iter()
                .find(|v| v.nics.iter().any(|n| n.kind == NicKind::Tap))
        })
        .map(|vm| client_cpus(vm, host_cpus))
        .unwrap_or_default();
    if cfg.spec.is_some() {
        notes.push(match (&placement.shares, placement.cpus.as_slice()) {
            (Some(why), _) => format!("{}: {why}", cfg.label),
            (None, cpus) => format!(
                "{}: httperf pinned to CPU {}, which none of the VM's threads use",
                cfg.label,
                cpu_list(cpus)
            ),
        });
    }
    placement
}

/// A configuration's server, its address, and the facts of its manifest.
type Served = (Server, IpAddr, Vec<(&'static str, String)>);

/// The host's configuration: busybox httpd on 127.0.0.1, serving a file
/// in a web root named by this process (a run killed with SIGKILL leaves
/// one the next run recognizes and removes).
fn host_server(
    opts: &WebOptions,
    busybox: Option<PathBuf>,
    uri: &str,
    notes: &mut Vec<String>,
) -> Result<Served, BenchError> {
    // Named by this process, so a run killed with SIGKILL leaves
    // a directory the next run recognizes and removes.
    sweep_stale(&std::env::temp_dir(), true);
    let dir = tempfile::Builder::new()
        .prefix(&format!("{STALE_PREFIX}{}-", std::process::id()))
        .tempdir()
        .map_err(|e| BenchError::Output {
            what: "web root",
            path: std::env::temp_dir(),
            message: e.to_string(),
        })?;
    let f = dir.path().join(uri.trim_start_matches('/'));
    std::fs::write(&f, vec![b'x'; opts.file_size as usize]).map_err(|e| BenchError::Output {
        what: "served file",
        path: f.clone(),
        message: e.to_string(),
    })?;
    notes.push(
        "host: busybox httpd on 127.0.0.1 shares the host's CPUs with httperf (no \
         separate client machine here)"
            .into(),
    );
    Ok((
        Server::Host {
            busybox: busybox.expect("checked with the host config"),
            dir,
        },
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        vec![("server", "busybox httpd (host)".to_string())],
    ))
}

/// What TCG means for the numbers, when the labs ran under it.
fn tcg_note(accel: Option<&str>) -> Option<String> {
    accel.filter(|a| *a != "kvm").map(|a| {
        format!(
            "accel {a}: QEMU emulates every guest instruction (TCG), so a VM's web throughput \
             is far below what KVM reaches; compare configurations with each other, not with \
             published figures"
        )
    })
}

/// A note for every rate httperf itself could not offer.
fn generator_notes(outcome: &mut WebOutcome) {
    for (pt, (r, f)) in outcome
        .points
        .iter()
        .zip(outcome.results.iter().zip(&outcome.follow))
    {
        if *f == Follow::GeneratorLimited {
            outcome.notes.push(format!(
                "{}: httperf could not offer {} req/s (its request rate {:.1} req/s{}): the \
                 generator, not the server, is the limit at this rate",
                outcome.configs[pt.config].label,
                pt.rate,
                mean_of(r, |s| s.run.request_rate).unwrap_or(0.0),
                if r.samples.iter().any(|s| s.run.errors.fd_unavail > 0) {
                    ", fd-unavail errors"
                } else {
                    ""
                }
            ));
        }
    }
}

/// What the sweep collected so far, every configuration's points in order.
#[derive(Default)]
struct Collected {
    points: Vec<WebPoint>,
    results: Vec<PointOutcome<WebSample>>,
    follow: Vec<Follow>,
    rows: Vec<Row>,
}

impl Collected {
    /// A point that could not run, and why.
    fn fail(&mut self, pt: WebPoint, why: String) {
        self.points.push(pt);
        self.results.push(failed_outcome(why));
        self.follow.push(Follow::Failed);
    }
}

/// One configuration's rates in ascending order, each on the driver's
/// loop, until the reply rate stops following (or httperf cannot offer
/// the rate, or the VM died).
#[allow(clippy::too_many_arguments)]
fn sweep_rates(
    opts: &WebOptions,
    (ci, cfg): (usize, &WebConfig),
    host_manifest: &Manifest,
    facts: &[(&str, String)],
    runner: &mut Runner<'_>,
    drive_opts: &DriveOptions,
    sink: &mut Sink<'_, '_>,
    progress: &Progress,
    got: &mut Collected,
) -> Result<(), BenchError> {
    for &rate in &opts.rates {
        let pt = web_point(opts, cfg, ci, rate, host_manifest, facts);
        runner.points.push(pt.clone());
        let index = runner.points.len() - 1;
        let mut one = OnePoint {
            runner: &mut *runner,
            index,
        };
        let point_opts = DriveOptions {
            record: opts.record.points(
                "web",
                Some(record_stem(&cfg.label, rate)),
                opts.output.force,
            ),
            ..drive_opts.clone()
        };
        let (mut r, rows) = driver::drive(&mut one, &point_opts, &[], sink, progress)?;
        got.rows.extend(rows);
        let r = r.remove(0);
        let f = judge(&r, rate, opts.follow);
        got.points.push(pt);
        got.follow.push(f);
        let dead = matches!(&runner.server, Server::Vm { guest } if guest.dead().is_some());
        got.results.push(r);
        match f {
            Follows if !dead => continue,
            Follows | Failed => {}
            Saturated => progress.note(&format!(
                "{}: the reply rate stopped following at {rate} req/s",
                cfg.label
            )),
            GeneratorLimited => progress.note(&format!(
                "{}: httperf could not offer {rate} req/s; higher rates are not tried",
                cfg.label
            )),
        }
        break;
    }
    Ok(())
}

fn run_configs(
    opts: &WebOptions,
    configs: &[WebConfig],
    httperf: &Path,
    busybox: Option<PathBuf>,
    session_out: Option<vmscope_store::output::SessionOutput>,
    progress: &Progress,
    out: &mut dyn Write,
) -> Result<WebOutcome, BenchError> {
    let host_manifest = Manifest::host(&opts.output.command_line);
    let mut probe = CpuProbe::new(opts.account);
    let mut got = Collected::default();
    let mut notes: Vec<String> = Vec::new();
    let mut accel: Option<String> = None;
    let drive_opts = DriveOptions::sampling(
        opts.sampling.warmup,
        opts.sampling.rule(DEFAULT_REPEAT.0, DEFAULT_REPEAT.1)?,
        opts.sampling.seed,
        opts.sampling.busy,
        opts.sampling.busy_retries,
        opts.lab.options.cancel.clone(),
    );
    let mut sink = Sink::for_format(
        opts.output.format,
        &mut *out,
        &["config", "rate", "file_size", "seconds", "timeout"],
    )?;
    let uri = format!("/vmscope-{}.bin", opts.file_size);
    let host_cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut client: Vec<ClientCpus> = Vec::new();
    for (ci, cfg) in configs.iter().enumerate() {
        let placement = placement_of(cfg, host_cpus, &mut notes);
        client.push(placement.clone());
        // The configuration's server, and the lab it runs in.
        let mut session = None;
        let (server, addr, facts) = match &cfg.spec {
            None => host_server(opts, busybox.clone(), &uri, &mut notes)?,
            Some(spec) => {
                let s = LabSession::open_shown(spec, &opts.lab.options, opts.lab.keep, progress)?;
                let st = s.state.clone();
                session = Some(s);
                accel.get_or_insert(st.accel.clone());
                let vm = st
                    .vms
                    .iter()
                    .find(|v| tap_ip(v).is_some())
                    .ok_or_else(|| {
                        BenchError::bad(no_tap(
                            st.vms.first().map_or("?", |v| v.name.as_str()),
                            &st.name,
                        ))
                    })?
                    .clone();
                let addr = tap_ip(&vm).expect("found by its tap address");
                let mut guest = Guest::new(&vm);
                progress.set_message(format!("VM {}: starting busybox httpd", vm.name));
                match start_guest_httpd(&mut guest, opts.port, opts.file_size, &uri) {
                    Ok(()) => {}
                    Err(e) => {
                        // The configuration cannot run: its first point
                        // fails with the reason, the others go on.
                        let why = match e {
                            VmFailure::Dead(m) | VmFailure::Failed(m) => m,
                        };
                        progress.note(&format!("{}: {why}", cfg.label));
                        let pt = web_point(opts, cfg, ci, opts.rates[0], &host_manifest, &[]);
                        got.fail(pt, why);
                        if let Some(s) = session {
                            s.close()?;
                        }
                        continue;
                    }
                }
                (
                    Server::Vm {
                        guest: Box::new(guest),
                    },
                    addr,
                    vec![
                        ("accel", st.accel.clone()),
                        ("server", "busybox httpd (guest)".to_string()),
                        ("lab", st.name.clone()),
                        ("vm", vm.name.clone()),
                    ],
                )
            }
        };
        let mut runner = Runner {
            opts,
            httperf: httperf.display().to_string(),
            probe: &mut probe,
            server,
            addr,
            uri: uri.clone(),
            points: Vec::new(),
            client_cpus: placement.cpus.clone(),
        };
        sweep_rates(
            opts,
            (ci, cfg),
            &host_manifest,
            &facts,
            &mut runner,
            &drive_opts,
            &mut sink,
            progress,
            &mut got,
        )?;
        runner.close();
        if let Some(s) = session {
            s.close()?;
        }
    }
    drop(probe);
    notes.extend(tcg_note(accel.as_deref()));
    let mut outcome = WebOutcome {
        accel,
        configs: configs.to_vec(),
        points: got.points,
        results: got.results,
        follow: got.follow,
        checks: Vec::new(),
        charts: Vec::new(),
        notes,
        client,
    };
    outcome.checks = shape_checks(&outcome);
    generator_notes(&mut outcome);
    if let Some(dir) = &opts.output.charts {
        outcome.charts = charts(dir, &outcome)?;
    }
    let end = driver::Ending {
        summaries: (0..outcome.points.len())
            .map(|i| summary_json(&outcome, i))
            .collect(),
        records: outcome.checks.iter().map(Check::json).collect(),
        charts: outcome.charts.clone(),
        notes: outcome.notes.clone(),
    };
    driver::finish(
        sink,
        &opts.output,
        session_out,
        "bench web",
        &got.rows,
        &end,
        |w| print_text(w, &outcome),
    )?;
    Ok(outcome)
}

use Follow::{Failed, Follows, GeneratorLimited, Saturated};

fn failed_outcome(why: String) -> PointOutcome<WebSample> {
    PointOutcome {
        samples: Vec::new(),
        values: Vec::new(),
        flags: Vec::new(),
        failed: Some(why),
        verdict: crate::stats::Verdict::Capped,
        session: None,
        profiled: None,
        record_error: None,
    }
}

fn web_point(
    opts: &WebOptions,
    cfg: &WebConfig,
    ci: usize,
    rate: u32,
    host: &Manifest,
    facts: &[(&str, String)],
) -> WebPoint {
    let config: BTreeMap<String, String> = [
        ("config", cfg.label.clone()),
        ("rate", rate.to_string()),
        ("file_size", opts.file_size.to_string()),
        ("seconds", opts.seconds.to_string()),
        ("timeout", opts.timeout.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let name = format!(
        "{} {rate} req/s file={}",
        cfg.label,
        short_iec(opts.file_size)
    );
    WebPoint {
        config: ci,
        rate,
        point: Point::new(
            "web",
            name,
            config,
            Arc::new(host.with(facts)),
            &["accel", "server"],
        ),
    }
}

/// Writes the file and starts busybox httpd (daemonized) in the guest.
fn start_guest_httpd(g: &mut Guest, port: u16, size: u64, uri: &str) -> Result<(), VmFailure> {
    if g.listening()?.contains(&port) {
        return Err(VmFailure::Failed(format!(
            "VM {}: port {port} is in use in the guest (choose another --port)",
            g.name()
        )));
    }
    g.sh(
        &format!(
            "mkdir -p {GUEST_ROOT} && head -c {size} /dev/zero | tr '\\0' x > {GUEST_ROOT}{uri} \
             && busybox httpd -p {port} -h {GUEST_ROOT}"
        ),
        Duration::from_secs(120),
    )?;
    g.wait_listening(port, Duration::from_secs(60))
}

/// Whether a rate's replies followed its offered load.
fn judge(r: &PointOutcome<WebSample>, rate: u32, follow: f64) -> Follow {
    if r.failed.is_some() || r.samples.is_empty() {
        return Follow::Failed;
    }
    if r.samples.iter().any(|s| s.generator_limited(follow)) {
        return Follow::GeneratorLimited;
    }
    let reply = r.summary().map_or(0.0, |s| s.mean);
    if reply < follow * f64::from(rate) {
        Follow::Saturated
    } else {
        Follow::Follows
    }
}

/// menon2005 Fig 7's shapes: a VM's peak reply rate is at most the host's;
/// guest-same-cpu's at most guest-separate-cpu's.
fn shape_checks(o: &WebOutcome) -> Vec<Check> {
    let mut out = Vec::new();
    let find = |suffix: &str| {
        o.configs
            .iter()
            .position(|c| c.spec.is_some() && c.label.ends_with(suffix))
    };
    let describe = |i: usize, (m, ci, sat): (f64, f64, bool)| {
        format!(
            "{} {m:.1} ± {ci:.1} req/s{}",
            o.configs[i].label,
            if sat {
                ""
            } else {
                " (not saturated: a lower bound)"
            }
        )
    };
    let mut pair = |a: usize, b: usize, claim: String, caveat: Option<String>| {
        if let (Some(pa), Some(pb)) = (o.peak(a), o.peak(b)) {
            if pb.0 > 0.0 {
                out.push(Check {
                    claim,
                    caveat,
                    holds: pa.0 <= pb.0,
                    ratio: pa.0 / pb.0,
                    detail: format!(
                        "peak reply rates: {}, {}: ratio {:.3}",
                        describe(a, pa),
                        describe(b, pb),
                        pa.0 / pb.0
                    ),
                });
            }
        }
    };
    if let Some(h) = o.configs.iter().position(|c| c.spec.is_none()) {
        for (i, c) in o.configs.iter().enumerate() {
            if c.spec.is_some() {
                pair(
                    i,
                    h,
                    format!("a VM's web throughput ({}) is at most the host's", c.label),
                    None,
                );
            }
        }
    }
    if let (Some(s), Some(p)) = (find("same-cpu"), find("separate-cpu")) {
        // The claim is about where the server's driver side runs; a client
        // competing with either side for a CPU measures the client too.
        let shared: Vec<String> = [s, p]
            .iter()
            .filter_map(|&i| {
                o.client
                    .get(i)
                    .and_then(|c| c.shares.as_ref())
                    .map(|why| format!("{}: {why}", o.configs[i].label))
            })
            .collect();
        let caveat = (!shared.is_empty()).then(|| {
            format!(
                "not shown on this host: {}; menon2005's client ran on a machine of its own, \
                 which here needs a host CPU that neither configuration's VM uses",
                shared.join("; ")
            )
        });
        pair(
            s,
            p,
            format!(
                "{} serves at most {}'s peak reply rate",
                o.configs[s].label, o.configs[p].label
            ),
            caveat,
        );
    }
    out
}

/// The file name stem of a profiled point's session: `web-CONFIG-RATE`,
/// with anything but letters, digits, `-` and `_` in the label (a spec
/// given as a path) made `_`.
fn record_stem(label: &str, rate: u32) -> String {
    let label: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("web-{label}-{rate}")
}

fn summary_json(o: &WebOutcome, i: usize) -> serde_json::Value {
    let pt = &o.points[i];
    let r = &o.results[i];
    driver::summary(
        &pt.point,
        "reply_rate",
        "ops/s",
        r.summary(),
        r.state(),
        serde_json::json!({
            "offered_rate": pt.rate,
            "follow": o.follow[i],
            "request_rate": mean_of(r, |x| x.run.request_rate),
            "errors": mean_of(r, |x| x.run.errors.total as f64),
            "errors_by_kind": r.samples.iter().map(|x| x.run.errors).collect::<Vec<_>>(),
            "conn_time_avg_s": mean_of(r, |x| x.run.conn_time_avg_ms / 1e3),
            "response_time_s": mean_of(r, |x| x.run.response_ms / 1e3),
            "httperf_cpu_s": mean_of(r, |x| x.run.cpu_s),
            "server_host_cpu_s": mean_of(r, WebSample::server_cpu_s),
            "host_cpu_per_reply_s": mean_of(r, WebSample::cpu_per_reply_s),
            "vm_io_charge_s": mean_of(r, WebSample::vm_io_charge_s),
        }),
    )
}

fn charts(dir: &Path, o: &WebOutcome) -> Result<Vec<PathBuf>, BenchError> {
    crate::chart::chart_dir(dir)?;
    let mut series = Vec::new();
    let mut top: f64 = 0.0;
    for (ci, c) in o.configs.iter().enumerate() {
        let points: Vec<SeriesPoint> = o
            .points
            .iter()
            .zip(&o.results)
            .filter(|(pt, _)| pt.config == ci)
            .filter_map(|(pt, r)| {
                let s = r.summary()?;
                top = top.max(f64::from(pt.rate));
                let mut p = SeriesPoint::of(f64::from(pt.rate), &s, 1.0);
                // A rate is never below zero, whatever the interval.
                p.lo = p.lo.max(0.0);
                Some(p)
            })
            .collect();
        if !points.is_empty() {
            series.push(Series {
                name: c.label.clone(),
                points,
            });
        }
    }
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let lo = o
        .points
        .iter()
        .map(|p| f64::from(p.rate))
        .fold(top, f64::min);
    series.push(Series {
        name: "offered (reply = offered)".into(),
        points: [lo, top]
            .iter()
            .map(|&x| SeriesPoint {
                x,
                y: x,
                lo: x,
                hi: x,
            })
            .collect(),
    });
    let c = LineChart {
        title: format!(
            "Web server: reply rate vs offered rate ({})",
            o.accel.as_deref().unwrap_or("host")
        ),
        x_label: "offered rate (requests/s)".into(),
        y_label: "reply rate (replies/s)".into(),
        log2_x: false,
        log2_y: false,
        x_tick: fmt_num,
        series,
    };
    c.write_in(dir, "web-reply-rate")
}

fn print_text(out: &mut dyn Write, o: &WebOutcome) -> std::io::Result<()> {
    let mut t = table(
        &[
            "Config",
            "Offered (req/s)",
            "Request rate (req/s)",
            "Reply rate (replies/s)",
            "±95 % (replies/s)",
            "n",
            "Errors (per run)",
            "Conn time (ms)",
            "Response (ms)",
            "Host CPU per reply (ms)",
            "httperf CPU (s)",
            "State",
        ]
        .map(String::from),
    );
    for (i, (pt, r)) in o.points.iter().zip(&o.results).enumerate() {
        let s = r.summary();
        let f = crate::output::fixed;
        let mut state = o.follow[i].name().to_string();
        if let Some(why) = &r.failed {
            state = format!("failed: {why}");
        }
        if r.flagged() > 0 {
            state = format!("{state}, {} flagged", r.flagged());
        }
        let mut kinds: Vec<String> = Vec::new();
        for x in &r.samples {
            for k in x.run.errors.kinds() {
                let name = k.split(' ').next().unwrap_or("").to_string();
                if !kinds.contains(&name) {
                    kinds.push(name);
                }
            }
        }
        let errors = mean_of(r, |x| x.run.errors.total as f64).map(|e| {
            if kinds.is_empty() {
                format!("{e:.1}")
            } else {
                format!("{e:.1} ({})", kinds.join(", "))
            }
        });
        t.add_row(vec![
            o.configs[pt.config].label.clone(),
            pt.rate.to_string(),
            f(mean_of(r, |x| x.run.request_rate), 1),
            f(s.map(|s| s.mean), 1),
            f(s.map(|s| finite(s.ci95)), 1),
            s.map_or(0, |s| s.n).to_string(),
            errors.unwrap_or_else(|| "-".into()),
            f(mean_of(r, |x| x.run.conn_time_avg_ms), 2),
            f(mean_of(r, |x| x.run.response_ms), 2),
            f(mean_of(r, |x| x.cpu_per_reply_s() * 1e3), 3),
            f(mean_of(r, |x| x.run.cpu_s), 2),
            state,
        ]);
    }
    writeln!(out, "{t}")?;
    crate::netlab::print_tail(out, &o.checks, &o.charts, &o.notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_rates("100..500:100").unwrap(),
            [100, 200, 300, 400, 500]
        );
        assert_eq!(parse_rates("50,10..30:10,20").unwrap(), [10, 20, 30, 50]);
        for bad in ["", "100..50:10", "1..9", "x", "0", "10..20:0"] {
            let e = parse_rates(bad).unwrap_err();
            assert!(e.starts_with("--rate"), "{e}");
        }
    }

    #[test]
    fn httperf_gets_the_cpus_no_vm_thread_uses_or_says_what_it_shares() {
        let vm = |name: &str| {
            let spec = crate::options::load_lab(name, None).unwrap();
            spec.vms[0].clone()
        };
        // guest-same-cpu: everything of guest0 on CPU 0.
        let same = vm("guest-same-cpu");
        assert_eq!(
            client_cpus(&same, 2),
            ClientCpus {
                cpus: vec![1],
                shares: None
            }
        );
        assert_eq!(client_cpus(&same, 4).cpus, [1, 2, 3]);
        // guest-separate-cpu: vCPU on 0, emulator and I/O on 1.
        let sep = vm("guest-separate-cpu");
        let c = client_cpus(&sep, 2);
        assert!(c.cpus.is_empty());
        let why = c.shares.unwrap();
        assert!(
            why.contains("no host CPU of its own beside guest1"),
            "{why}"
        );
        assert!(why.contains("CPU 0 runs its vCPU"), "{why}");
        assert!(why.contains("CPU 1 runs its emulator and I/O"), "{why}");
        assert_eq!(
            client_cpus(&sep, 3),
            ClientCpus {
                cpus: vec![2],
                shares: None
            }
        );
        // A VM whose vCPUs float shares every CPU with it.
        let mut floating = sep.clone();
        floating.pin_vcpus.clear();
        let why = client_cpus(&floating, 8).shares.unwrap();
        assert!(why.contains("unpinned vCPU threads"), "{why}");
    }

    #[test]
    fn a_confounded_check_says_n_a_with_its_numbers() {
        let mut c = Check {
            claim: "a serves at most b's peak reply rate".into(),
            holds: false,
            detail: "peak reply rates: a 12.0, b 10.0: ratio 1.200".into(),
            ratio: 1.2,
            caveat: None,
        };
        assert!(c.line().starts_with("no: a serves"), "{}", c.line());
        assert_eq!(c.json()["verdict"], "no");
        c.caveat = Some("not shown on this host: b: httperf has no host CPU of its own".into());
        let line = c.line();
        assert!(line.starts_with("n/a: a serves"), "{line}");
        assert!(
            line.contains("ratio 1.200; not shown on this host"),
            "{line}"
        );
        assert_eq!(c.json()["verdict"], "n/a");
        assert_eq!(c.json()["holds"], false);
    }

    #[test]
    fn a_profiled_point_is_named_after_its_configuration_and_rate() {
        assert_eq!(record_stem("host", 100), "web-host-100");
        assert_eq!(record_stem("guest-same-cpu", 250), "web-guest-same-cpu-250");
        assert_eq!(record_stem("/tmp/my lab.toml", 5), "web-_tmp_my_lab_toml-5");
    }

    fn sample(
        offered: u32,
        request_rate: f64,
        replies: u64,
        errors: httperf::Errors,
        conn_ms: f64,
    ) -> WebSample {
        WebSample {
            offered,
            run: httperf::Run {
                request_rate,
                conn_time_avg_ms: conn_ms,
                status_2xx: replies,
                duration_s: 1.0,
                errors,
                ..Default::default()
            },
            host: HostCpu::default(),
            vm_pids: Vec::new(),
            raw: String::new(),
        }
    }

    fn outcome(samples: Vec<WebSample>) -> PointOutcome<WebSample> {
        PointOutcome {
            values: samples.iter().map(WebSample::reply_rate).collect(),
            flags: vec![None; samples.len()],
            samples,
            failed: None,
            verdict: crate::stats::Verdict::Converged,
            session: None,
            profiled: None,
            record_error: None,
        }
    }

    #[test]
    fn the_stop_rule_tells_saturation_from_the_generator() {
        let none = httperf::Errors::default();
        let follows = outcome(vec![sample(100, 100.2, 99, none, 1.0); 3]);
        assert_eq!(judge(&follows, 100, 0.9), Follow::Follows);
        let timo = httperf::Errors {
            total: 40,
            client_timo: 40,
            ..none
        };
        let sat = outcome(vec![sample(400, 380.0, 250, timo, 900.0); 3]);
        assert_eq!(judge(&sat, 400, 0.9), Follow::Saturated);
        // A slow server: requests and replies both lag, connections queue.
        let queued = outcome(vec![sample(100, 60.0, 60, none, 800.0); 3]);
        assert_eq!(judge(&queued, 100, 0.9), Follow::Saturated);
        // httperf sent slower than asked while connections took less than
        // the interval between arrivals (0.2 ms at 5000/s).
        let slow = outcome(vec![sample(5000, 3100.0, 3100, none, 0.1); 3]);
        assert_eq!(judge(&slow, 5000, 0.9), Follow::GeneratorLimited);
        let fd = httperf::Errors {
            total: 1,
            fd_unavail: 1,
            ..none
        };
        let fds = outcome(vec![sample(900, 900.0, 899, fd, 1.0); 3]);
        assert_eq!(judge(&fds, 900, 0.9), Follow::GeneratorLimited);
        assert_eq!(judge(&outcome(vec![]), 100, 0.9), Follow::Failed);
    }

    #[test]
    fn bad_options_and_a_user_nic_are_refused_before_anything_runs() {
        let bad = |o: WebOptions| match run(&o, &mut Vec::new()) {
            Err(BenchError::BadInput(m)) => m,
            Err(e) => panic!("not bad input: {e}"),
            Ok(_) => panic!("accepted"),
        };
        let base = WebOptions {
            output: crate::options::Output {
                quiet: true,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(bad(WebOptions {
            configs: vec![],
            ..base.clone()
        })
        .contains("--lab"));
        assert!(bad(WebOptions {
            file_size: 0,
            ..base.clone()
        })
        .contains("--file-size"));
        assert!(bad(WebOptions {
            httperf: Some("/nonexistent/httperf".into()),
            ..base.clone()
        })
        .contains("Debian package httperf"));
        assert!(bad(WebOptions {
            configs: vec!["no-such-lab".into()],
            ..base.clone()
        })
        .contains("no-such-lab"));
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("u.toml");
        std::fs::write(
            &spec,
            "name = \"webu\"\n[[vm]]\nname = \"webu0\"\n[[vm.nic]]\nkind = \"user\"\n",
        )
        .unwrap();
        if vmscope_lab::util::which("httperf").is_some() {
            let m = bad(WebOptions {
                configs: vec![spec.display().to_string()],
                ..base.clone()
            });
            assert!(
                m.contains("user networking") && m.contains("kind = \"tap\""),
                "{m}"
            );
            // A port in use on the host.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let m = bad(WebOptions {
                configs: vec!["host".into()],
                port,
                ..base.clone()
            });
            assert!(m.contains("in use") && m.contains(&port.to_string()), "{m}");
        }
    }
}
