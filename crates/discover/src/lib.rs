//! Finds every QEMU VM on a host, started by the lab or not, and the map
//! `record`, `stat` and `account` use to turn threads into VMs (docs/architecture.md §2,
//! §4).
//!
//! [`discover`] reads a `/proc` tree (any root, so tests run on fixture
//! trees) and, when asked, each VM's QMP monitor:
//! - [`cmdline`]: the QEMU command line, plain and libvirt style;
//! - [`agent_channel`]: the agent's virtio-serial port: the QEMU arguments
//!   and libvirt XML that create it, and finding it on any command line;
//! - [`threads`]: thread roles from thread names;
//! - [`qmp`]: a small QMP client, reusable elsewhere;
//! - [`libvirt`]: libvirt as an optional source (domain name, UUID, state,
//!   QEMU's counters when libvirtd holds the monitor);
//! - `enrich`: merging QMP's answers into the `/proc` view;
//! - `image`: backing files from qcow2 headers;
//! - `vm`: the result types ([`Vm`]) and [`thread_map`].

pub mod agent_channel;
pub mod cmdline;
mod enrich;
mod error;
mod fd_socket;
mod image;
pub mod libvirt;
pub mod qmp;
pub mod threads;
mod vm;

pub use error::DiscoverError;
pub use vm::{
    thread_map, Accel, AgentChannel, Disk, DiskSource, ThreadKind, VhostWorker, Vm, VmThread,
};

use cmdline::{QemuCmdline, SocketSpec};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use threads::NamedRole;
use vmscope_linux::procfs::ProcRoot;

/// Where and how to look for VMs.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// Root of the proc tree, normally `/proc`.
    pub proc_root: PathBuf,
    /// Ask each VM's QMP monitor (when one is known) for authoritative vCPU
    /// threads, I/O threads, accelerator and disks.
    pub query_qmp: bool,
    /// Bound on connecting to a monitor and on each QMP command.
    pub qmp_timeout: Duration,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            proc_root: PathBuf::from("/proc"),
            query_qmp: true,
            qmp_timeout: Duration::from_secs(1),
        }
    }
}

/// Warning left on a VM whose vCPU threads cannot be told apart; removed
/// when QMP names them.
pub(crate) const VCPUS_UNKNOWN: &str = "vCPU threads unknown:";

/// How many monitors are queried at once.
const QMP_PARALLEL: usize = 16;

/// Every QEMU process under `opts.proc_root`, by pid. A process that exits
/// during the scan is skipped; what cannot be read about a VM that remains
/// is listed in its `warnings`. Fails only when the proc root itself cannot
/// be listed.
pub fn discover(opts: &DiscoverOptions) -> Result<Vec<Vm>, DiscoverError> {
    let proc = ProcRoot::new(&opts.proc_root);
    let pids = proc.pids().map_err(DiscoverError::ProcRoot)?;
    // Old kernels (< 6.4): vhost workers are kernel threads, children of
    // kthreadd (pid 2), named `vhost-<pid of the QEMU that owns them>`.
    let mut kernel_vhost: HashMap<u32, Vec<(u32, String)>> = HashMap::new();
    let mut vms = Vec::new();
    for pid in pids {
        if let Ok(comm) = proc.comm(pid) {
            if let Some(owner) = threads::vhost_owner(&comm) {
                if proc.ppid(pid).ok() == Some(2) {
                    kernel_vhost.entry(owner).or_default().push((pid, comm));
                    continue;
                }
            }
        }
        if let Some(vm) = scan_process(&proc, pid) {
            vms.push(vm);
        }
    }
    for vm in &mut vms {
        for (tid, name) in kernel_vhost.remove(&vm.pid).unwrap_or_default() {
            vm.vhost.push(VhostWorker {
                tid,
                name,
                kernel_thread: true,
            });
        }
    }
    if opts.query_qmp {
        for chunk in vms.chunks_mut(QMP_PARALLEL) {
            std::thread::scope(|s| {
                for vm in chunk.iter_mut().filter(|vm| vm.qmp.is_some()) {
                    let proc = &proc;
                    s.spawn(move || enrich::with_qmp(vm, proc, opts.qmp_timeout));
                }
            });
        }
    }
    unique_names(&mut vms);
    Ok(vms)
}

/// The executable's name when this is a QEMU system emulator:
/// `qemu-system-*`, `qemu-kvm` or `kvm`, by `exe` or by `argv[0]`.
pub fn qemu_binary(exe: Option<&Path>, argv0: &str) -> Option<String> {
    let is_qemu = |n: &str| n.starts_with("qemu-system-") || n == "qemu-kvm" || n == "kvm";
    let base = |p: &Path| p.file_name().and_then(|f| f.to_str()).map(str::to_string);
    exe.and_then(base)
        .filter(|n| is_qemu(n))
        .or_else(|| base(Path::new(argv0)).filter(|n| is_qemu(n)))
}

/// One process: `None` when it is not QEMU or vanished while being read.
fn scan_process(proc: &ProcRoot, pid: u32) -> Option<Vm> {
    let argv = proc.cmdline(pid).ok()?;
    let argv0 = argv.first()?;
    let exe = proc.exe(pid).ok();
    let binary = qemu_binary(exe.as_deref(), argv0)?;
    let cmd = QemuCmdline::parse(&argv);
    let cwd = proc.cwd(pid).ok();
    let mut vm = Vm {
        name: cmd.name.clone().unwrap_or_else(|| format!("pid{pid}")),
        pid,
        uuid: cmd.uuid.clone(),
        exe,
        accel: Accel::Unknown,
        vcpus: Vec::new(),
        io_threads: Vec::new(),
        vhost: Vec::new(),
        disks: Vec::new(),
        taps: Vec::new(),
        qmp: None,
        qmp_used: false,
        agent: AgentChannel::None,
        libvirt: None,
        cmdline: argv.clone(),
        warnings: Vec::new(),
    };

    let thread_accel = match proc.tids(pid) {
        Ok(tids) => scan_threads(proc, &mut vm, &tids, cmd.debug_threads),
        Err(e) if e.is_vanished() => return None,
        Err(e) => {
            vm.warnings.push(e.to_string());
            None
        }
    };
    vm.accel = thread_accel.unwrap_or_else(|| cmd.accel(&binary));

    vm.disks = cmd.disks.clone();
    for d in &mut vm.disks {
        resolve_disk(proc, pid, cwd.as_deref(), d);
    }
    vm.taps = find_taps(proc, &mut vm.warnings, pid, &cmd);
    vm.qmp = match &cmd.monitor {
        Some(SocketSpec::Path(p)) => Some(absolute(cwd.as_deref(), p)),
        Some(SocketSpec::Fd(fd)) => match fd_socket::bound_path(proc, pid, *fd) {
            Ok(p) => Some(p),
            Err(why) => {
                vm.warnings.push(format!("QMP monitor on inherited {why}"));
                None
            }
        },
        None => None,
    };
    vm.agent = match &cmd.agent {
        None => AgentChannel::None,
        Some(Err(why)) => AgentChannel::Unreachable(format!(
            "the {} channel exists but cannot be reached: {why}",
            agent_channel::AGENT_PORT
        )),
        Some(Ok(SocketSpec::Path(p))) => AgentChannel::Socket(absolute(cwd.as_deref(), p)),
        Some(Ok(SocketSpec::Fd(fd))) => match fd_socket::bound_path(proc, pid, *fd) {
            Ok(p) => AgentChannel::Socket(p),
            Err(why) => AgentChannel::Unreachable(format!(
                "the {} channel exists but cannot be reached: its chardev is QEMU's inherited {why}",
                agent_channel::AGENT_PORT
            )),
        },
    };

    // Files read one by one: if the process is gone now, drop it whole.
    if !proc.exists(pid) {
        return None;
    }
    Some(vm)
}

/// Sort the threads of `vm` into vCPUs, vhost workers and the rest;
/// returns the accelerator the vCPU thread names show.
fn scan_threads(proc: &ProcRoot, vm: &mut Vm, tids: &[u32], debug_threads: bool) -> Option<Accel> {
    let pid = vm.pid;
    let mut accel = None;
    for &tid in tids {
        let comm = match proc.thread_comm(pid, tid) {
            Ok(c) => c,
            Err(e) if e.is_vanished() => continue,
            Err(e) => {
                vm.warnings.push(format!("thread {tid}: {e}"));
                continue;
            }
        };
        match threads::classify(pid, tid, &comm) {
            NamedRole::Vcpu { index, accel: a } => {
                if a != Accel::Unknown {
                    accel = Some(a);
                }
                vm.vcpus.push(VmThread {
                    tid,
                    index,
                    name: comm,
                    kind: ThreadKind::Vcpu,
                });
            }
            NamedRole::Vhost => vm.vhost.push(VhostWorker {
                tid,
                name: comm,
                kernel_thread: false,
            }),
            NamedRole::Other(kind) => vm.io_threads.push(VmThread {
                tid,
                index: None,
                name: comm,
                kind,
            }),
        }
    }
    vm.vcpus.sort_by_key(|t| (t.index, t.tid));
    if vm.vcpus.is_empty() {
        let why = if debug_threads {
            "no thread is named `CPU n/...` although debug-threads=on"
        } else {
            "QEMU names its threads only with `-name NAME,debug-threads=on`"
        };
        vm.warnings.push(format!(
            "{VCPUS_UNKNOWN} {why}; QMP query-cpus-fast can name them"
        ));
    } else {
        for t in &mut vm.io_threads {
            if t.kind == ThreadKind::Unknown {
                t.kind = ThreadKind::Other;
            }
        }
        if vm.vcpus.iter().any(|t| t.index.is_none()) {
            vm.warnings.push(
                "single-threaded TCG: one thread runs every vCPU (attributed as vCPU 0)".into(),
            );
        }
    }
    accel
}

fn absolute(cwd: Option<&Path>, p: &Path) -> PathBuf {
    match cwd {
        Some(c) if p.is_relative() => c.join(p),
        _ => p.to_path_buf(),
    }
}

/// A path as QEMU sees it, reachable from here: through
/// `/proc/PID/root` when that works (other mount namespaces), else as is.
pub(crate) fn host_view(proc: &ProcRoot, pid: u32, p: &Path) -> PathBuf {
    if let Ok(rel) = p.strip_prefix("/") {
        let via_root = proc.pid_path(pid, "root").join(rel);
        if via_root.exists() {
            return via_root;
        }
    }
    p.to_path_buf()
}

fn resolve_disk(proc: &ProcRoot, pid: u32, cwd: Option<&Path>, d: &mut Disk) {
    let Some(f) = d.file.take() else { return };
    // Legacy protocol strings (`nbd:host:port`) are not paths.
    let looks_like_path = f.is_absolute() || !f.to_string_lossy().contains(':');
    let f = if looks_like_path {
        absolute(cwd, &f)
    } else {
        f
    };
    if looks_like_path
        && d.backing.is_empty()
        && matches!(d.format.as_deref(), None | Some("qcow2"))
    {
        d.backing = image::qcow2_chain(&f, |p| host_view(proc, pid, p));
    }
    d.file = Some(f);
}

/// Tap interfaces: `ifname=` from the command line, the `iff:` line of the
/// descriptors named by `fd=`/`fds=`, and of every other `/dev/net/tun`
/// descriptor (taps from a bridge helper or hot-plugged by libvirt).
fn find_taps(
    proc: &ProcRoot,
    warnings: &mut Vec<String>,
    pid: u32,
    cmd: &QemuCmdline,
) -> Vec<String> {
    let mut taps: Vec<String> = Vec::new();
    let add = |n: String, taps: &mut Vec<String>| {
        if !taps.contains(&n) {
            taps.push(n);
        }
    };
    for spec in &cmd.taps {
        if let Some(n) = spec.ifname.as_ref().filter(|n| !n.contains('%')) {
            add(n.clone(), &mut taps);
        }
        for &fd in &spec.fds {
            match proc.fd_iff(pid, fd) {
                Ok(Some(n)) => add(n, &mut taps),
                Ok(None) => warnings.push(format!(
                    "netdev {}: fd {fd} is not a tap (no iff: line in {})",
                    spec.id.as_deref().unwrap_or("?"),
                    proc.pid_path(pid, &format!("fdinfo/{fd}")).display()
                )),
                Err(e) => {
                    warnings.push(format!("netdev {}: {e}", spec.id.as_deref().unwrap_or("?"),));
                }
            }
        }
    }
    if let Ok(fds) = proc.fds(pid) {
        for (fd, target) in fds {
            if target == Path::new("/dev/net/tun") {
                if let Ok(Some(n)) = proc.fd_iff(pid, fd) {
                    add(n, &mut taps);
                }
            }
        }
    }
    taps
}

/// Attribution keys on names: VMs sharing a name become `NAME@PID`.
fn unique_names(vms: &mut [Vm]) {
    let mut count: HashMap<String, usize> = HashMap::new();
    for vm in vms.iter() {
        *count.entry(vm.name.clone()).or_default() += 1;
    }
    for vm in vms.iter_mut() {
        if count.get(&vm.name).copied().unwrap_or(0) > 1 {
            let old = std::mem::take(&mut vm.name);
            vm.name = format!("{old}@{}", vm.pid);
            vm.warnings.push(format!(
                "another VM is also named {old:?}: this one is {:?}",
                vm.name
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_binaries() {
        let q = |exe: Option<&str>, a0: &str| qemu_binary(exe.map(Path::new), a0);
        assert_eq!(
            q(Some("/usr/bin/qemu-system-x86_64"), "x").as_deref(),
            Some("qemu-system-x86_64")
        );
        assert_eq!(
            q(None, "/usr/libexec/qemu-kvm").as_deref(),
            Some("qemu-kvm")
        );
        assert_eq!(q(Some("/usr/bin/python3"), "kvm").as_deref(), Some("kvm"));
        assert_eq!(q(Some("/usr/bin/qemu-img"), "qemu-img"), None);
        assert_eq!(q(Some("/bin/bash"), "bash"), None);
        assert_eq!(
            q(None, "qemu-system-aarch64").as_deref(),
            Some("qemu-system-aarch64")
        );
    }
}
