//! `vmscope bench net`: menon2005 §6.1-6.2's network experiment on lab VMs
//! with tap NICs on the lab's bridge. A path is a sender and a receiver:
//! the host and a VM (either way) or two VMs. Each point is one path, one
//! tool and one receive buffer:
//!
//! - `vmscope`: the engine of [`vmscope_workload::net`] on both sides (in
//!   this process on the host, `vmscope-agent net` in guests): the sender
//!   `sendfile()`s a cached 64 KiB file over `streams` TCP connections, the
//!   receiver `recv()`s into a user buffer of the point's size (the paper's
//!   Figs 1-2 sweep it);
//! - `iperf3`: `iperf3 -Z -l 64K -J` on the same path, side by side (the
//!   host's iperf3 is copied into guests with its libraries).
//!
//! Around every sample the host is read ([`crate::cpu::CpuProbe`]): its
//! busy CPU (so host CPU seconds per Gbit moved), other load (a busy
//! sample is redone, then kept flagged) and, with the accountant, each
//! VM's vCPU time and I/O charge (QEMU's I/O threads, which run virtio-net
//! for a tap, plus its share of the host's network softirqs). The sampling
//! loop, statistics, writers and charts are the shared ones
//! ([`crate::driver`]).

use crate::chart::{bytes_tick, LineChart, Series, SeriesPoint};
use crate::cpu::{CpuProbe, HostCpu};
use crate::driver::{self, mean_of, DriveOptions, Experiment, PointOutcome, Sink};
use crate::guest::{Guest, VmFailure, AGENT};
use crate::hygiene::LoadSample;
use crate::lab_session::LabSession;
use crate::manifest::Manifest;
pub use crate::netlab::Check;
use crate::netlab::{host_ip, no_tap, tap_ip};
use crate::options::{LabChoice, Output, Recording, Sampling};
use crate::output::table;
use crate::progress::Progress;
use crate::row::{unit, Point, Row};
use crate::schedule::Step;
use crate::stats::{finite, Summary};
use crate::units::short_iec;
use crate::BenchError;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use vmscope_lab::{LabState, VmState};
use vmscope_workload::net::{NetRun, RecvSpec, SendSpec, RECV_IDLE};

/// The receive buffers of menon2005 Figs 1-2.
pub const DEFAULT_RECV_BUF: &str = "1k..256k";
/// The buffer the agreement with iperf3 (`-l 64K`) is read at.
pub const PEER_BUF: u64 = 64 << 10;
/// How far the engine may be from iperf3 on the same path.
pub const AGREEMENT: f64 = 0.10;

/// Everything `bench net` is asked to do.
#[derive(Debug, Clone)]
pub struct NetOptions {
    /// `SENDER:RECEIVER`, each `host` or a VM name; empty: every tap VM
    /// both ways, and the first two tap VMs to each other.
    pub paths: Vec<String>,
    pub recv_bufs: Vec<u64>,
    pub streams: u32,
    pub seconds: f64,
    pub port: u16,
    /// Run iperf3 on every path too.
    pub peer: bool,
    /// Run the accountant around every sample.
    pub account: bool,
    pub sampling: Sampling,
    pub output: Output,
    pub lab: LabChoice,
    pub record: Recording,
}

/// `bench net`'s repeats when none are given (at least, at most).
pub const DEFAULT_REPEAT: (usize, usize) = (3, 10);

impl Default for NetOptions {
    fn default() -> Self {
        NetOptions {
            paths: Vec::new(),
            recv_bufs: crate::units::parse_size_list(DEFAULT_RECV_BUF, "--recv-buf")
                .unwrap_or_default(),
            streams: 1,
            seconds: 10.0,
            port: 5301,
            peer: true,
            account: true,
            sampling: Sampling::default(),
            output: Output::default(),
            lab: LabChoice::default(),
            record: Recording::default(),
        }
    }
}

/// One side of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Host,
    /// Index into the run's guests.
    Vm(usize),
}

/// Which tool moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NetTool {
    Vmscope,
    Iperf3,
}

impl NetTool {
    pub fn name(self) -> &'static str {
        match self {
            NetTool::Vmscope => "vmscope",
            NetTool::Iperf3 => "iperf3",
        }
    }
}

/// A path between two ends, with their addresses.
#[derive(Debug, Clone)]
pub struct NetPath {
    pub name: String,
    pub sender: End,
    pub receiver: End,
    /// The receiver's address on the bridge.
    pub to: IpAddr,
}

/// One point of the sweep.
#[derive(Debug, Clone)]
pub struct NetPoint {
    pub path: usize,
    pub tool: NetTool,
    pub buf: u64,
    pub point: Point,
}

/// One sample.
#[derive(Debug, Clone)]
pub struct NetSample {
    /// Bytes the receiver took.
    pub bytes: u64,
    /// Seconds they took to arrive.
    pub wall_s: f64,
    /// The engine's own accounts (`vmscope` tool).
    pub send: Option<NetRun>,
    pub recv: Option<NetRun>,
    pub host: HostCpu,
    pub raw: String,
    /// The VMs' QEMU pids on this path (their accounts in `host`).
    pub vm_pids: Vec<u32>,
}

impl NetSample {
    pub fn bytes_per_s(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.bytes as f64 / self.wall_s
        } else {
            0.0
        }
    }

    /// Host CPU seconds the run cost: this process and its children (the
    /// host's end, iperf3), the VMs' QEMUs and kernel threads (softirqs).
    /// Other programs' load is left out (it is what flags a busy sample).
    pub fn host_cpu_s(&self) -> f64 {
        self.host.load.own_s + self.host.load.kthreads_s
    }

    /// [`NetSample::host_cpu_s`] per Gbit (10^9 bits) moved.
    pub fn host_cpu_per_gbit(&self) -> f64 {
        let gbit = self.bytes as f64 * 8.0 / 1e9;
        if gbit > 0.0 {
            self.host_cpu_s() / gbit
        } else {
            0.0
        }
    }

    /// The VMs' I/O charge (their I/O threads and shared network work).
    pub fn vm_io_charge_s(&self) -> f64 {
        self.vm_pids
            .iter()
            .filter_map(|p| self.host.vm(Some(*p)))
            .map(crate::cpu::VmCpu::io_charge_s)
            .sum()
    }

    pub fn vm_vcpu_s(&self) -> f64 {
        self.vm_pids
            .iter()
            .filter_map(|p| self.host.vm(Some(*p)))
            .map(|v| v.vcpu_s)
            .sum()
    }
}

struct NetExperiment {
    opts: NetOptions,
    guests: Vec<Guest>,
    paths: Vec<NetPath>,
    points: Vec<NetPoint>,
    probe: CpuProbe,
    iperf3: Option<PathBuf>,
}

fn failed(e: impl std::fmt::Display) -> VmFailure {
    VmFailure::Failed(e.to_string())
}

impl NetExperiment {
    fn pids(&self, p: &NetPath) -> Vec<u32> {
        [&p.sender, &p.receiver]
            .into_iter()
            .filter_map(|e| match e {
                End::Vm(i) => self.guests[*i].vm().pid,
                End::Host => None,
            })
            .collect()
    }

    fn check_alive(&self, p: &NetPath) -> Result<(), VmFailure> {
        for e in [&p.sender, &p.receiver] {
            if let End::Vm(i) = e {
                if let Some(d) = self.guests[*i].dead() {
                    return Err(VmFailure::Dead(d));
                }
            }
        }
        Ok(())
    }

    fn run_vmscope(&mut self, p: &NetPath, buf: u64) -> Result<NetSample, VmFailure> {
        let to = SocketAddr::new(p.to, self.opts.port);
        let secs = self.opts.seconds;
        let streams = self.opts.streams;
        let pids = self.pids(p);
        let mark = self.probe.mark(&pids);
        // The receiver first: in a thread of ours, or in its guest on a
        // connection of its own.
        let recv_spec = RecvSpec {
            listen: to,
            streams,
            buf,
            accept_timeout: Duration::from_secs(60),
            idle: RECV_IDLE,
        };
        let host_recv = match p.receiver {
            End::Host => {
                let l = vmscope_workload::net::bind(to).map_err(failed)?;
                let s = recv_spec.clone();
                Some(std::thread::spawn(move || {
                    vmscope_workload::net::recv_on(l, &s)
                }))
            }
            End::Vm(_) => None,
        };
        let guest_recv = match p.receiver {
            End::Vm(i) => {
                let argv = vec![
                    AGENT.to_string(),
                    "net".into(),
                    "recv".into(),
                    format!("listen={to}"),
                    format!("streams={streams}"),
                    format!("buf={buf}"),
                    "timeout=60".into(),
                ];
                // The receiver runs on a connection of its own (this one is
                // closed: a broker may serve one client at a time), and the
                // sender retries refused connections until it listens.
                self.guests[i].disconnect();
                let h = self.guests[i]
                    .spawn_json::<NetRun>(argv, Duration::from_secs_f64(secs + 120.0));
                Some(h)
            }
            End::Host => None,
        };
        let sent = match p.sender {
            End::Host => vmscope_workload::net::send(&SendSpec {
                to,
                streams,
                duration: Duration::from_secs_f64(secs),
                connect_timeout: Duration::from_secs(60),
            })
            .map(|r| (r, String::new()))
            .map_err(failed),
            End::Vm(i) => self.guests[i].exec_json::<NetRun>(
                &[
                    AGENT.to_string(),
                    "net".into(),
                    "send".into(),
                    format!("to={to}"),
                    format!("streams={streams}"),
                    format!("seconds={secs}"),
                    "connect-timeout=60".into(),
                ],
                Duration::from_secs_f64(secs + 120.0),
            ),
        };
        let received = match (host_recv, guest_recv) {
            (Some(h), _) => h
                .join()
                .map_err(|_| failed("the receiver thread panicked"))
                .and_then(|r| r.map(|r| (r, String::new())).map_err(failed)),
            (_, Some(h)) => h
                .join()
                .map_err(|_| failed("the receiver thread panicked"))?,
            _ => unreachable!("one receiver runs"),
        };
        let host = self.probe.since(&mark);
        let (send, sraw) = sent?;
        let (recv, rraw) = received?;
        if recv.bytes != send.bytes {
            return Err(failed(format!(
                "{}: the receiver took {} bytes of the {} sent",
                p.name, recv.bytes, send.bytes
            )));
        }
        Ok(NetSample {
            bytes: recv.bytes,
            wall_s: recv.wall_s,
            send: Some(send),
            recv: Some(recv),
            host,
            raw: format!("{sraw}\n{rraw}").trim().to_string(),
            vm_pids: pids,
        })
    }

    fn run_iperf3(&mut self, p: &NetPath) -> Result<NetSample, VmFailure> {
        let exe = self
            .iperf3
            .clone()
            .ok_or_else(|| failed("iperf3 is not installed (Debian package iperf3)"))?;
        let port = self.opts.port.to_string();
        let secs = self.opts.seconds.ceil().max(1.0) as u64;
        let exe_s = exe.display().to_string();
        let server: Vec<String> = [&exe_s, "-s", "-1", "-p", &port]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
        let client: Vec<String> = [
            exe_s.clone(),
            "-c".into(),
            p.to.to_string(),
            "-p".into(),
            port.clone(),
            "-Z".into(),
            "-l".into(),
            "64K".into(),
            "-t".into(),
            secs.to_string(),
            "-P".into(),
            self.opts.streams.to_string(),
            "-J".into(),
        ]
        .to_vec();
        let pids = self.pids(p);
        let mark = self.probe.mark(&pids);
        let mut host_server = None;
        let mut guest_server = None;
        match p.receiver {
            End::Host => {
                let child = std::process::Command::new(&server[0])
                    .args(&server[1..])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| failed(format!("starting {exe_s}: {e}")))?;
                host_server = Some(child);
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while !vmscope_workload::net::is_listening(self.opts.port) {
                    if std::time::Instant::now() > deadline {
                        return Err(failed("the host's iperf3 server does not listen"));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            End::Vm(i) => {
                // As in run_vmscope: the server on its own connection, the
                // client retrying until it listens.
                self.guests[i].disconnect();
                let h = Some(self.guests[i].spawn(server.clone(), Duration::from_secs(secs + 120)));
                guest_server = h;
            }
        }
        // iperf3's client does not retry a refused connection: retry it
        // (for up to a minute) until the server listens.
        let out = match p.sender {
            End::Host => {
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                loop {
                    let o = std::process::Command::new(&client[0])
                        .args(&client[1..])
                        .output()
                        .map_err(|e| failed(format!("running {exe_s}: {e}")))?;
                    let text = String::from_utf8_lossy(&o.stdout).to_string();
                    if !refused(&text) || std::time::Instant::now() >= deadline {
                        break text;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
            End::Vm(i) => {
                let script = format!(
                    "i=0; while :; do out=$({}); case \"$out\" in *'unable to connect'*) \
                     [ $i -ge 200 ] && break; i=$((i+1)); sleep 0.3;; *) break;; esac; done; \
                     echo \"$out\"",
                    client.join(" ")
                );
                match self.guests[i].sh(&script, Duration::from_secs(secs + 180)) {
                    Ok(o) => o.stdout,
                    Err(VmFailure::Failed(m)) => m,
                    Err(e) => return Err(e),
                }
            }
        };
        if let Some(mut c) = host_server {
            // A server whose client never came is stopped after a grace.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while matches!(c.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(h) = guest_server {
            let _ = h.join();
        }
        let host = self.probe.since(&mark);
        let (bytes, wall_s) = parse_iperf3(&out).map_err(|e| failed(format!("{}: {e}", p.name)))?;
        Ok(NetSample {
            bytes,
            wall_s,
            send: None,
            recv: None,
            host,
            raw: out,
            vm_pids: pids,
        })
    }
}

/// Whether iperf3's output says the server was not listening yet.
fn refused(text: &str) -> bool {
    text.contains("unable to connect")
}

/// Bytes received and their seconds from `iperf3 -J` (the client's
/// report: `end.sum_received`), or iperf3's error.
pub fn parse_iperf3(text: &str) -> Result<(u64, f64), String> {
    let start = text.find('{').ok_or("iperf3 printed no JSON")?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).map_err(|e| format!("iperf3's JSON: {e}"))?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("iperf3: {e}"));
    }
    let s = &v["end"]["sum_received"];
    match (s["bytes"].as_u64(), s["seconds"].as_f64()) {
        (Some(b), Some(t)) if t > 0.0 => Ok((b, t)),
        _ => Err("iperf3's JSON has no end.sum_received".into()),
    }
}

impl Experiment for NetExperiment {
    type Sample = NetSample;

    fn points(&self) -> usize {
        self.points.len()
    }

    fn name(&self, i: usize) -> String {
        self.points[i].point.name.clone()
    }

    fn hash(&self, i: usize) -> String {
        self.points[i].point.config_hash.clone()
    }

    fn vms(&self, i: usize) -> Vec<String> {
        let p = &self.paths[self.points[i].path];
        [&p.sender, &p.receiver]
            .into_iter()
            .filter_map(|e| match e {
                End::Vm(j) => Some(self.guests[*j].name().to_string()),
                End::Host => None,
            })
            .collect()
    }

    fn run(&mut self, i: usize, _step: Step) -> Result<NetSample, VmFailure> {
        let pt = self.points[i].clone();
        let path = self.paths[pt.path].clone();
        self.check_alive(&path)?;
        let r = match pt.tool {
            NetTool::Vmscope => self.run_vmscope(&path, pt.buf),
            NetTool::Iperf3 => self.run_iperf3(&path),
        };
        match r {
            // A VM that died mid-sample is dead, not a failed command.
            Err(VmFailure::Failed(m)) => {
                self.check_alive(&path)?;
                Err(VmFailure::Failed(m))
            }
            other => other,
        }
    }

    fn value(&self, s: &NetSample) -> f64 {
        s.bytes_per_s()
    }

    fn load(&self, s: &NetSample) -> LoadSample {
        s.host.load
    }

    fn rows(&self, i: usize, n: u32, s: &NetSample, flag: Option<String>) -> Vec<Row> {
        let p = &self.points[i].point;
        let mut rows = vec![
            p.row(n, "throughput", s.bytes_per_s(), unit::BYTES_PER_S)
                .raw(Some(s.raw.clone())),
            p.row(n, "bytes", s.bytes as f64, unit::BYTES),
            p.row(n, "wall_time", s.wall_s, unit::SECONDS),
            p.row(n, "host_busy", s.host.load.host_busy_s, unit::SECONDS),
            p.row(n, "host_cpu", s.host_cpu_s(), unit::SECONDS),
            p.row(
                n,
                "host_cpu_per_gbit",
                s.host_cpu_per_gbit(),
                unit::S_PER_GBIT,
            ),
            p.row(n, "other_load", s.host.load.other_cpus(), unit::S_PER_S),
        ];
        if let Some(r) = &s.send {
            rows.push(p.row(n, "sender_cpu", r.cpu_s(), unit::SECONDS));
        }
        if let Some(r) = &s.recv {
            rows.push(p.row(n, "receiver_cpu", r.cpu_s(), unit::SECONDS));
            rows.push(p.row(n, "recv_calls", r.calls as f64, unit::COUNT));
        }
        if s.host.accounted && !s.vm_pids.is_empty() {
            rows.push(p.row(n, "vm_vcpu", s.vm_vcpu_s(), unit::SECONDS));
            rows.push(p.row(n, "vm_io_charge", s.vm_io_charge_s(), unit::SECONDS));
        }
        rows.into_iter().map(|r| r.flagged(flag.clone())).collect()
    }
}

/// What a run produced.
pub struct NetOutcome {
    pub accel: Option<String>,
    pub paths: Vec<NetPath>,
    pub points: Vec<NetPoint>,
    pub results: Vec<PointOutcome<NetSample>>,
    pub checks: Vec<Check>,
    pub charts: Vec<PathBuf>,
    pub notes: Vec<String>,
}

impl NetOutcome {
    pub fn failed_points(&self) -> usize {
        self.results.iter().filter(|r| r.failed.is_some()).count()
    }
}

use vmscope_lab::util::which;

/// Runs `bench net`; results go to `out` in `opts.output.format`.
pub fn run(opts: &NetOptions, out: &mut dyn Write) -> Result<NetOutcome, BenchError> {
    if opts.recv_bufs.is_empty() {
        return Err(BenchError::bad("--recv-buf is empty"));
    }
    if let Some(b) = opts
        .recv_bufs
        .iter()
        .find(|&&b| b > vmscope_workload::net::MAX_RECV_BUF)
    {
        return Err(BenchError::bad(format!(
            "--recv-buf {b} is above the engine's 64 MiB limit"
        )));
    }
    if opts.streams == 0 || opts.streams > vmscope_workload::net::MAX_STREAMS {
        return Err(BenchError::bad(format!(
            "--streams {} must be 1 to {}",
            opts.streams,
            vmscope_workload::net::MAX_STREAMS
        )));
    }
    if !(opts.seconds >= 0.5 && opts.seconds <= 3600.0) {
        return Err(BenchError::bad(format!(
            "--seconds {} must be 0.5 to 3600",
            opts.seconds
        )));
    }
    opts.sampling.rule(DEFAULT_REPEAT.0, DEFAULT_REPEAT.1)?;
    opts.record.check()?;
    if opts.lab.spec.is_none() && opts.paths.is_empty() {
        return Err(BenchError::bad(
            "name a --lab (such as guest-same-cpu) or a --path SENDER:RECEIVER of running lab VMs",
        ));
    }
    let spec = opts.lab.load()?;
    // The port must be free on the host before anything starts.
    vmscope_workload::net::check_port(SocketAddr::from(([0, 0, 0, 0], opts.port)))
        .map_err(|e| BenchError::bad(format!("--port {}: {e}", opts.port)))?;
    // -o is checked and locked before anything runs.
    let opened = opts.output.open()?;
    let progress = &opened.progress;
    let session = opened.session;
    LabSession::run_within(
        spec.as_ref(),
        &opts.lab.options,
        opts.lab.keep,
        progress,
        |lab| run_in(opts, lab, session, progress, out),
    )
}

/// The paths of a run, the guests they use and the labs those live in.
type Ends = (Vec<NetPath>, Vec<Guest>, Vec<LabState>);

/// The paths to measure (`--path`, or every tap VM of the lab to and from
/// the host and its first two tap VMs to each other), the guests they use
/// and the labs those live in.
fn resolve_paths(opts: &NetOptions, lab: Option<&LabState>) -> Result<Ends, BenchError> {
    // The ends: VMs by name (in the lab, else any running lab).
    let mut guests: Vec<Guest> = Vec::new();
    let mut labs: Vec<LabState> = lab.into_iter().cloned().collect();
    let mut path_args: Vec<(String, String)> = Vec::new();
    for p in &opts.paths {
        let (a, b) = p.split_once(':').ok_or_else(|| {
            BenchError::bad(format!(
                "--path {p}: want SENDER:RECEIVER, each `host` or a VM name (such as host:guest0)"
            ))
        })?;
        if a == b {
            return Err(BenchError::bad(format!(
                "--path {p}: the sender and the receiver are the same"
            )));
        }
        path_args.push((a.to_string(), b.to_string()));
    }
    if path_args.is_empty() {
        let l = lab.expect("a lab when no path is given");
        let taps: Vec<&VmState> = l.vms.iter().filter(|v| tap_ip(v).is_some()).collect();
        if taps.is_empty() {
            return Err(BenchError::bad(format!(
                "lab {}: no VM has a tap NIC (user networking cannot carry the test); give one \
                 `[[vm.nic]] kind = \"tap\"` in the spec",
                l.name
            )));
        }
        for v in &taps {
            path_args.push(("host".into(), v.name.clone()));
            path_args.push((v.name.clone(), "host".into()));
        }
        if taps.len() >= 2 {
            path_args.push((taps[0].name.clone(), taps[1].name.clone()));
        }
    }
    let mut paths = Vec::new();
    for (a, b) in &path_args {
        let sender = if a == "host" {
            End::Host
        } else {
            End::Vm(resolve_vm(opts, &mut labs, &mut guests, a)?)
        };
        let receiver = if b == "host" {
            End::Host
        } else {
            End::Vm(resolve_vm(opts, &mut labs, &mut guests, b)?)
        };
        let to = match &receiver {
            End::Vm(i) => tap_ip(guests[*i].vm()).expect("checked"),
            End::Host => {
                let End::Vm(i) = &sender else {
                    unreachable!("one end is a VM")
                };
                let vm = guests[*i].name().to_string();
                labs.iter()
                    .find(|l| l.vm(&vm).is_ok())
                    .and_then(host_ip)
                    .ok_or_else(|| {
                        BenchError::bad(format!(
                            "VM {vm}: its lab's bridge has no address for the host end"
                        ))
                    })?
            }
        };
        paths.push(NetPath {
            name: format!("{a}->{b}"),
            sender,
            receiver,
            to,
        });
    }
    Ok((paths, guests, labs))
}

/// Every (path, tool, receive buffer) point and its row identity.
fn make_points(
    opts: &NetOptions,
    paths: &[NetPath],
    accel: Option<&str>,
    peer: bool,
) -> Vec<NetPoint> {
    let host_manifest = Manifest::host(&opts.output.command_line);
    let mut points = Vec::new();
    for (pi, p) in paths.iter().enumerate() {
        let mut facts: Vec<(&str, String)> = Vec::new();
        if let Some(a) = accel {
            facts.push(("accel", a.to_string()));
        }
        let manifest = Arc::new(host_manifest.with(&facts));
        let mut tools = vec![NetTool::Vmscope];
        if peer {
            tools.push(NetTool::Iperf3);
        }
        for tool in tools {
            let bufs: Vec<u64> = match tool {
                NetTool::Vmscope => opts.recv_bufs.clone(),
                NetTool::Iperf3 => vec![PEER_BUF],
            };
            for buf in bufs {
                let config: BTreeMap<String, String> = [
                    ("path", p.name.clone()),
                    ("tool", tool.name().to_string()),
                    ("recv_buf", buf.to_string()),
                    ("streams", opts.streams.to_string()),
                    ("seconds", opts.seconds.to_string()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                let name = format!("{} {} buf={}", p.name, tool.name(), short_iec(buf));
                points.push(NetPoint {
                    path: pi,
                    tool,
                    buf,
                    point: Point::new("net", name, config, manifest.clone(), &["accel"]),
                });
            }
        }
    }

    points
}

/// The guest of VM `name`: from the labs known so far, else any running
/// lab; it must run and have a tap NIC.
fn resolve_vm(
    opts: &NetOptions,
    labs: &mut Vec<LabState>,
    guests: &mut Vec<Guest>,
    name: &str,
) -> Result<usize, BenchError> {
    if let Some(i) = guests.iter().position(|g| g.name() == name) {
        return Ok(i);
    }
    let (st, vm) = match labs
        .iter()
        .find_map(|l| l.vm(name).ok().map(|v| (l.clone(), v.clone())))
    {
        Some(x) => x,
        None => vmscope_lab::find_vm(&opts.lab.options, None, name)
            .map_err(|e| BenchError::bad(format!("--path: VM {name}: {e}")))?,
    };
    if !vmscope_lab::vm_running(&vm) {
        return Err(BenchError::bad(format!(
            "VM {name} of lab {} is not running",
            st.name
        )));
    }
    if tap_ip(&vm).is_none() {
        return Err(BenchError::bad(no_tap(name, &st.name)));
    }
    if !labs.iter().any(|l| l.name == st.name) {
        labs.push(st);
    }
    guests.push(Guest::new(&vm));
    Ok(guests.len() - 1)
}

fn run_in(
    opts: &NetOptions,
    lab: Option<&LabState>,
    session_out: Option<vmscope_store::output::SessionOutput>,
    progress: &Progress,
    out: &mut dyn Write,
) -> Result<NetOutcome, BenchError> {
    let (paths, mut guests, labs) = resolve_paths(opts, lab)?;
    let accel = labs.first().map(|l| l.accel.clone());

    let mut notes = Vec::new();
    if accel.as_deref().is_some_and(|a| a != "kvm") {
        notes.push(format!(
            "accel {}: QEMU emulates every guest instruction (TCG), so guest-side throughput is \
             far below what KVM reaches; compare paths and configurations with each other, not \
             with published figures",
            accel.clone().unwrap_or_default()
        ));
    }
    let iperf3 = which("iperf3");
    let peer = opts.peer && iperf3.is_some();
    if opts.peer && iperf3.is_none() {
        notes.push(
            "iperf3 is not installed (Debian package iperf3): no side-by-side comparison".into(),
        );
    }
    // The engine in every guest is the agent (lab images carry it); iperf3
    // is copied in with its libraries.
    if peer {
        let exe = iperf3.clone().expect("peer");
        for g in &mut guests {
            progress.set_message(format!("VM {}: copying iperf3 in", g.name()));
            g.install(&exe).map_err(|e| {
                BenchError::bad(format!("copying iperf3 into VM {}: {e}", g.name()))
            })?;
        }
    }

    let points = make_points(opts, &paths, accel.as_deref(), peer);
    let mut e = NetExperiment {
        opts: opts.clone(),
        guests,
        paths,
        points,
        probe: CpuProbe::new(opts.account),
        iperf3,
    };
    let drive_opts = DriveOptions {
        record: opts.record.points("net", None, opts.output.force),
        ..DriveOptions::sampling(
            opts.sampling.warmup,
            opts.sampling.rule(DEFAULT_REPEAT.0, DEFAULT_REPEAT.1)?,
            opts.sampling.seed,
            opts.sampling.busy,
            opts.sampling.busy_retries,
            opts.lab.options.cancel.clone(),
        )
    };
    let mut sink = Sink::for_format(
        opts.output.format,
        &mut *out,
        &["path", "tool", "recv_buf", "streams", "seconds"],
    )?;
    let (results, rows) = driver::drive(&mut e, &drive_opts, &[], &mut sink, progress)?;
    let mut outcome = NetOutcome {
        accel,
        paths: e.paths.clone(),
        points: e.points.clone(),
        results,
        checks: Vec::new(),
        charts: Vec::new(),
        notes,
    };
    outcome.checks = agreement(&outcome);
    if let Some(dir) = &opts.output.charts {
        outcome.charts = charts(dir, &outcome)?;
    }
    let end = driver::Ending {
        summaries: outcome
            .points
            .iter()
            .zip(&outcome.results)
            .map(|(pt, r)| summary_json(pt, r))
            .collect(),
        records: outcome.checks.iter().map(Check::json).collect(),
        charts: outcome.charts.clone(),
        notes: outcome.notes.clone(),
    };
    driver::finish(
        sink,
        &opts.output,
        session_out,
        "bench net",
        &rows,
        &end,
        |w| print_text(w, &outcome),
    )?;
    Ok(outcome)
}

fn summary_json(pt: &NetPoint, r: &PointOutcome<NetSample>) -> serde_json::Value {
    driver::summary(
        &pt.point,
        "throughput",
        "bytes/s",
        r.summary(),
        r.state(),
        serde_json::json!({
            "sender_cpu_s": mean_of(r, |x| x.send.as_ref().map_or(0.0, NetRun::cpu_s)),
            "receiver_cpu_s": mean_of(r, |x| x.recv.as_ref().map_or(0.0, NetRun::cpu_s)),
            "host_busy_s": mean_of(r, |x| x.host.load.host_busy_s),
            "host_cpu_s": mean_of(r, NetSample::host_cpu_s),
            "host_cpu_per_gbit": mean_of(r, NetSample::host_cpu_per_gbit),
            "vm_vcpu_s": mean_of(r, NetSample::vm_vcpu_s),
            "vm_io_charge_s": mean_of(r, NetSample::vm_io_charge_s),
        }),
    )
}

/// The engine at 64 KiB against iperf3 on each path.
fn agreement(o: &NetOutcome) -> Vec<Check> {
    let mut out = Vec::new();
    for (pi, p) in o.paths.iter().enumerate() {
        let find = |tool: NetTool| {
            o.points
                .iter()
                .zip(&o.results)
                .find(|(pt, r)| {
                    pt.path == pi && pt.tool == tool && pt.buf == PEER_BUF && r.failed.is_none()
                })
                .and_then(|(_, r)| r.summary())
        };
        let (Some(a), Some(b)) = (find(NetTool::Vmscope), find(NetTool::Iperf3)) else {
            continue;
        };
        if b.mean <= 0.0 {
            continue;
        }
        let ratio = a.mean / b.mean;
        out.push(Check {
            claim: format!(
                "{}: the engine (recv buffer 64 KiB) is within {:.0} % of iperf3 -Z -l 64K",
                p.name,
                AGREEMENT * 100.0
            ),
            holds: (ratio - 1.0).abs() <= AGREEMENT,
            caveat: None,
            ratio,
            detail: format!(
                "engine {:.1} Mbit/s ± {:.1}, iperf3 {:.1} Mbit/s ± {:.1}: ratio {ratio:.3}",
                a.mean * 8e-6,
                finite(a.ci95) * 8e-6,
                b.mean * 8e-6,
                finite(b.ci95) * 8e-6
            ),
        });
    }
    out
}

fn charts(dir: &Path, o: &NetOutcome) -> Result<Vec<PathBuf>, BenchError> {
    crate::chart::chart_dir(dir)?;
    let mut series = Vec::new();
    for (pi, p) in o.paths.iter().enumerate() {
        let points: Vec<SeriesPoint> = o
            .points
            .iter()
            .zip(&o.results)
            .filter(|(pt, _)| pt.path == pi && pt.tool == NetTool::Vmscope)
            .filter_map(|(pt, r)| {
                let s = r.summary()?;
                Some(SeriesPoint::of(pt.buf as f64, &s, 8e-6))
            })
            .collect();
        if !points.is_empty() {
            series.push(Series {
                name: p.name.clone(),
                points,
            });
        }
    }
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let c = LineChart {
        title: format!(
            "TCP throughput vs receive buffer ({})",
            o.accel.as_deref().unwrap_or("host")
        ),
        x_label: "receive buffer (bytes)".into(),
        y_label: "throughput (Mbit/s)".into(),
        log2_x: true,
        log2_y: false,
        x_tick: bytes_tick,
        series,
    };
    c.write_in(dir, "net-throughput")
}

fn print_text(out: &mut dyn Write, o: &NetOutcome) -> std::io::Result<()> {
    let mut t = table(
        &[
            "Path",
            "NetTool",
            "Recv buf (B)",
            "Throughput (Mbit/s)",
            "±95 % (Mbit/s)",
            "n",
            "Sender CPU (s)",
            "Receiver CPU (s)",
            "Host CPU of the run (s)",
            "Host CPU per Gbit (s/Gbit)",
            "VM vCPU (s)",
            "VM I/O charge (s)",
            "Note",
        ]
        .map(String::from),
    );
    for (pt, r) in o.points.iter().zip(&o.results) {
        let p = &o.paths[pt.path];
        let s: Option<Summary> = r.summary();
        let f = crate::output::fixed;
        let is_engine = pt.tool == NetTool::Vmscope;
        let has_vm = !matches!((&p.sender, &p.receiver), (End::Host, End::Host));
        let accounted = r.samples.iter().any(|x| x.host.accounted);
        let mut note = r.failed.clone().unwrap_or_default();
        if r.flagged() > 0 {
            note = format!("{note} {} flagged", r.flagged()).trim().to_string();
        }
        t.add_row(vec![
            p.name.clone(),
            pt.tool.name().to_string(),
            if is_engine {
                pt.buf.to_string()
            } else {
                "64K (-l)".into()
            },
            f(s.map(|s| s.mean * 8e-6), 1),
            f(s.map(|s| finite(s.ci95) * 8e-6), 1),
            s.map_or(0, |s| s.n).to_string(),
            f(
                is_engine
                    .then(|| mean_of(r, |x| x.send.as_ref().map_or(0.0, NetRun::cpu_s)))
                    .flatten(),
                3,
            ),
            f(
                is_engine
                    .then(|| mean_of(r, |x| x.recv.as_ref().map_or(0.0, NetRun::cpu_s)))
                    .flatten(),
                3,
            ),
            f(mean_of(r, NetSample::host_cpu_s), 3),
            f(mean_of(r, NetSample::host_cpu_per_gbit), 2),
            f(
                (has_vm && accounted)
                    .then(|| mean_of(r, NetSample::vm_vcpu_s))
                    .flatten(),
                3,
            ),
            f(
                (has_vm && accounted)
                    .then(|| mean_of(r, NetSample::vm_io_charge_s))
                    .flatten(),
                3,
            ),
            note,
        ]);
    }
    writeln!(out, "{t}")?;
    crate::netlab::print_tail(out, &o.checks, &o.charts, &o.notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json_and_its_errors() {
        let ok = r#"{"start":{},"end":{"sum_sent":{"bytes":10},"sum_received":{"bytes":125000000,"seconds":2.0}}}"#;
        assert_eq!(parse_iperf3(ok).unwrap(), (125_000_000, 2.0));
        let e = parse_iperf3(r#"{"start":{},"error":"unable to connect to server"}"#).unwrap_err();
        assert!(e.contains("unable to connect"), "{e}");
        assert!(parse_iperf3("garbage").is_err());
        assert!(parse_iperf3(r#"{"end":{}}"#).is_err());
    }

    #[test]
    fn bad_options_are_refused_before_anything_runs() {
        let bad = |o: NetOptions| {
            let mut out = Vec::new();
            match run(&o, &mut out) {
                Err(BenchError::BadInput(m)) => m,
                Err(e) => panic!("not bad input: {e}"),
                Ok(_) => panic!("accepted"),
            }
        };
        let base = NetOptions {
            output: crate::options::Output {
                quiet: true,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(bad(base.clone()).contains("--lab"));
        assert!(bad(NetOptions {
            streams: 0,
            ..base.clone()
        })
        .contains("--streams"));
        assert!(bad(NetOptions {
            seconds: 0.0,
            ..base.clone()
        })
        .contains("--seconds"));
        assert!(bad(NetOptions {
            recv_bufs: vec![],
            ..base.clone()
        })
        .contains("--recv-buf"));
        assert!(bad(NetOptions {
            lab: crate::options::LabChoice {
                spec: Some("no-such-lab".into()),
                ..Default::default()
            },
            ..base.clone()
        })
        .contains("no-such-lab"));
        // A port in use.
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let m = bad(NetOptions {
            port,
            lab: crate::options::LabChoice {
                spec: Some("guest-same-cpu".into()),
                ..Default::default()
            },
            ..base.clone()
        });
        assert!(m.contains("in use") && m.contains(&port.to_string()), "{m}");
    }
}
