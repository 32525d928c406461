//! What discovery reports about one VM ([`Vm`]) and how its threads map to
//! attribution roles ([`Vm::tids`], [`thread_map`]).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use vmscope_model::{ThreadMap, ThreadRole};

/// How a VM runs guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization through `/dev/kvm` (vCPU threads `CPU n/KVM`).
    Kvm,
    /// QEMU's translator (vCPU threads `CPU n/TCG`): guest code runs as
    /// translated code in QEMU's anonymous executable memory.
    Tcg,
    /// Neither the command line, the thread names nor QMP settled it.
    Unknown,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
            Accel::Unknown => "unknown",
        }
    }
}

/// What a thread of the QEMU process does, as far as it can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThreadKind {
    /// Runs one vCPU (`CPU n/KVM`, `CPU n/TCG`) or, for single-threaded TCG,
    /// all of them (`ALL CPUs/TCG`).
    Vcpu,
    /// The main loop: the thread whose id is the process id.
    MainLoop,
    /// An I/O thread (`IO iothread1`, `IO mon_iothread`).
    IoThread,
    /// A thread-pool worker (`worker`); they come and go with the load.
    Worker,
    /// Another QEMU thread (RCU, SPICE, migration, ...), known not to be a
    /// vCPU because vCPU threads were identified.
    Other,
    /// Not identifiable: thread names carry no role (no
    /// `-name ...,debug-threads=on`) and QMP did not say which are vCPUs.
    Unknown,
}

/// One thread of the QEMU process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmThread {
    pub tid: u32,
    /// vCPU index (`cpu-index` in QMP); `None` for non-vCPU threads and for
    /// the one thread of single-threaded TCG.
    pub index: Option<u32>,
    /// Thread name (`comm`), e.g. `CPU 1/KVM`, `IO iothread1`.
    pub name: String,
    pub kind: ThreadKind,
}

/// A vhost worker serving this VM's virtqueues in the host kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostWorker {
    pub tid: u32,
    /// `vhost-<qemu pid>`.
    pub name: String,
    /// True on kernels before 6.4, where vhost workers are kernel threads
    /// (children of kthreadd); false when they are threads of QEMU itself.
    pub kernel_thread: bool,
}

/// Where a disk's description came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskSource {
    /// `-drive`, `-blockdev`, `-hda`..., or a bare image argument.
    Cmdline,
    /// QMP `query-block` only (hot-plugged, or changed since start).
    Qmp,
    /// On the command line and confirmed by QMP.
    Both,
}

/// A disk of the VM and the file (or device, or network export) behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// Drive id, top block node name, or QMP device name.
    pub id: Option<String>,
    /// Host path of the image or device; `None` for network protocols.
    pub file: Option<PathBuf>,
    /// Backing chain of the image, nearest first.
    pub backing: Vec<PathBuf>,
    /// Image format (`qcow2`, `raw`, ...) when one is named.
    pub format: Option<String>,
    /// Protocol driver under the format (`file`, `host_device`, `nbd`, ...).
    pub protocol: Option<String>,
    /// Cache mode: `none`, `writeback`, `writethrough`, `directsync`, `unsafe`.
    pub cache: Option<String>,
    /// AIO engine: `threads`, `native`, `io_uring`.
    pub aio: Option<String>,
    pub readonly: bool,
    pub source: DiskSource,
}

/// A VM's agent channel ([`crate::agent_channel`]) as discovery found it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "detail", rename_all = "snake_case")]
pub enum AgentChannel {
    /// No `vmscope.agent` port on the VM's command line.
    #[default]
    None,
    /// The host end of the port: the Unix socket to connect to.
    Socket(PathBuf),
    /// The port exists but its host end cannot be used, and why.
    Unreachable(String),
}

impl AgentChannel {
    /// The socket, when there is one to connect to.
    pub fn socket(&self) -> Option<&Path> {
        match self {
            AgentChannel::Socket(p) => Some(p),
            _ => None,
        }
    }
}

/// One QEMU process and everything discovery learned about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vm {
    /// `-name` (libvirt: the domain name); `pid<PID>` when QEMU has none,
    /// the name attribution gives unknown VMs too. Made unique per host by
    /// appending `@<pid>` when two VMs share a name.
    pub name: String,
    pub pid: u32,
    pub uuid: Option<String>,
    pub exe: Option<PathBuf>,
    pub accel: Accel,
    /// vCPU threads, by index.
    pub vcpus: Vec<VmThread>,
    /// Every other thread of the QEMU process (main loop, I/O threads,
    /// workers, others), by tid.
    pub io_threads: Vec<VmThread>,
    /// vhost workers, threads of QEMU or kernel threads.
    pub vhost: Vec<VhostWorker>,
    pub disks: Vec<Disk>,
    /// Host tap interfaces of the VM's NICs.
    pub taps: Vec<String>,
    /// QMP socket, when the command line (or an inherited fd) names one.
    pub qmp: Option<PathBuf>,
    /// True when QMP answered and its view was merged in.
    pub qmp_used: bool,
    /// The guest agent's channel.
    #[serde(default)]
    pub agent: AgentChannel,
    /// The libvirt domain this VM is, when libvirt was asked
    /// ([`crate::libvirt::annotate`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<crate::libvirt::LibvirtDomain>,
    pub cmdline: Vec<String>,
    /// What could not be determined, and why.
    pub warnings: Vec<String>,
}

impl Vm {
    /// Every thread with a known role: vCPUs (`Vcpu(index)`), the other
    /// QEMU threads (`Io`), vhost workers (`Vhost`). Threads of
    /// [`ThreadKind::Unknown`] are left out: they belong to the VM's process
    /// (which [`thread_map`] registers) but may be vCPUs.
    pub fn tids(&self) -> impl Iterator<Item = (u32, ThreadRole)> + '_ {
        let vcpus = self
            .vcpus
            .iter()
            .map(|t| (t.tid, ThreadRole::Vcpu(t.index.unwrap_or(0))));
        let io = self
            .io_threads
            .iter()
            .filter(|t| t.kind != ThreadKind::Unknown)
            .map(|t| (t.tid, ThreadRole::Io));
        let vhost = self.vhost.iter().map(|w| (w.tid, ThreadRole::Vhost));
        vcpus.chain(io).chain(vhost)
    }

    /// True when the vCPU threads are known (by name or from QMP).
    pub fn vcpus_known(&self) -> bool {
        !self.vcpus.is_empty()
    }
}

/// The [`ThreadMap`] attribution uses: each VM's process, its vCPU threads
/// (`Vcpu(index)`), other QEMU threads (`Io`) and vhost workers (`Vhost`).
pub fn thread_map(vms: &[Vm]) -> ThreadMap {
    let mut map = ThreadMap::new();
    for vm in vms {
        map.add_vm_threads(&vm.name, vm.pid, vm.accel == Accel::Tcg, vm.tids());
    }
    map
}
