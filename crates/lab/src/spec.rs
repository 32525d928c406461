//! Lab spec files (TOML): parsing, structural validation and host checks.
//!
//! Parsing uses serde with `deny_unknown_fields` and `toml::Spanned`, so every
//! error names the file, the 1-based line and the field (`vm[1].vcpus`). Host
//! checks (CPUs that exist, files that exist, bridge names in use, root) run
//! before anything is started and report the same way.
//!
//! ```toml
//! name = "one-vm"            # lab name: bridge vmsbr-<short>, taps vmst-<short>-N
//! accel = "auto"             # "auto" | "kvm" | "tcg"
//! # manager = "libvirt"      # "qemu" (default: the lab runs QEMU itself) |
//! #                         # "libvirt" (transient domains on qemu:///system)
//! # kernel = "/boot/vmlinuz" # own kernel instead of the built guest image
//! # initrd = "/path/initrd"  # own initramfs (the agent must be in it)
//! # subnet = "10.77.5.0/24"  # bridge subnet for tap NICs (default from the name)
//!
//! [[vm]]
//! name = "vm0"
//! # count = 4               # this table makes vm00 .. vm03 (scale labs; pins
//! #                         # and files apply to every one of them)
//! vcpus = 2
//! memory_mib = 256
//! pin_vcpus = [0, 1]         # host CPU of vCPU i
//! pin_emulator = [0]         # QEMU main thread
//! pin_io = [1]               # every `IO iothreadN` thread
//! iothreads = 1
//! kernel_args = "quiet"
//! files = ["/host/path:/guest/path"]
//! [[vm.nic]]
//! kind = "user"              # "user" | "tap"
//! [[vm.disk]]
//! backend = "file"           # "file" | "block" | "lvm"
//! ```

use crate::error::{LabError, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Accelerator choice of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AccelChoice {
    /// Probe KVM once per host (cached), fall back to TCG.
    #[default]
    Auto,
    /// KVM only; fails if the probe fails.
    Kvm,
    /// TCG (`-accel tcg,thread=multi`).
    Tcg,
}

impl std::fmt::Display for AccelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AccelChoice::Auto => "auto",
            AccelChoice::Kvm => "kvm",
            AccelChoice::Tcg => "tcg",
        })
    }
}

/// Who runs a lab's VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Manager {
    /// The lab starts QEMU itself (detached, QMP on a socket of its own).
    #[default]
    Qemu,
    /// Each VM is a transient libvirt domain on qemu:///system, with the
    /// agent channel declared as a libvirt user would (see [`crate::libvirt`]).
    Libvirt,
}

impl std::fmt::Display for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Manager::Qemu => "qemu",
            Manager::Libvirt => "libvirt",
        })
    }
}

/// A whole lab, validated.
#[derive(Debug, Clone, Serialize)]
pub struct LabSpec {
    pub name: String,
    /// The file this spec came from, if any.
    pub file: Option<PathBuf>,
    pub accel: AccelChoice,
    /// Who runs the VMs (`manager = "qemu" | "libvirt"`).
    pub manager: Manager,
    /// Own kernel for every VM (else the built guest image).
    pub kernel: Option<PathBuf>,
    /// Own initramfs for every VM.
    pub initrd: Option<PathBuf>,
    /// Third octet of the bridge subnet 10.77.X.0/24 unless `subnet` is set.
    pub subnet: Subnet,
    pub vms: Vec<VmSpec>,
    /// Field path → 1-based line, for errors found after parsing.
    #[serde(skip)]
    pub lines: BTreeMap<String, usize>,
}

/// An IPv4 /prefix network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Subnet {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

impl Subnet {
    /// The `n`-th host address (1 = the bridge).
    pub fn host(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + n)
    }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// One VM of a lab.
#[derive(Debug, Clone, Serialize)]
pub struct VmSpec {
    pub name: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// Host CPU of each vCPU (empty: not pinned).
    pub pin_vcpus: Vec<usize>,
    /// Host CPUs of the emulator (main) thread.
    pub pin_emulator: Vec<usize>,
    /// Host CPUs of the I/O threads.
    pub pin_io: Vec<usize>,
    pub iothreads: u32,
    /// Whether the guest agent channel is attached (default true).
    pub agent: bool,
    pub kernel_args: String,
    pub files: Vec<FileSpec>,
    pub nics: Vec<NicSpec>,
    pub disks: Vec<DiskSpec>,
}

/// A host file copied into the guest's initramfs.
#[derive(Debug, Clone, Serialize)]
pub struct FileSpec {
    pub host: PathBuf,
    pub guest: String,
}

/// NIC kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NicKind {
    /// `-netdev user` (slirp): guest 10.0.2.15, host 10.0.2.2.
    User,
    /// A tap on the lab's bridge, with a static guest IP.
    Tap,
}

/// One NIC.
#[derive(Debug, Clone, Serialize)]
pub struct NicSpec {
    pub kind: NicKind,
    /// Guest address for tap NICs (default: next free host of the subnet).
    pub ip: Option<Ipv4Addr>,
    pub vhost: bool,
}

/// Disk backends (giacobbi2011's storage configurations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskBackend {
    /// An image file (raw or qcow2).
    File,
    /// A raw block device: `device`, or a loop device over a host file the lab makes.
    Block,
    /// An LVM logical volume the lab creates in volume group `vg`.
    Lvm,
}

/// Image formats of file disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    #[default]
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

/// One virtio-blk disk.
#[derive(Debug, Clone, Serialize)]
pub struct DiskSpec {
    pub backend: DiskBackend,
    pub format: DiskFormat,
    /// Existing image file or block device; `None` means the lab makes one.
    pub path: Option<PathBuf>,
    pub size_mib: u64,
    /// Volume group for `lvm`.
    pub vg: Option<String>,
    /// QEMU `cache=` (none, writeback, writethrough, directsync, unsafe).
    pub cache: String,
    /// QEMU `aio=` (threads, native, io_uring).
    pub aio: String,
    /// Index of the VM's I/O thread serving this disk.
    pub iothread: Option<u32>,
    /// Skip (and say so) instead of failing when the backend is unavailable.
    pub optional: bool,
    /// QEMU's throttle on the disk's reads and writes together, in bytes
    /// per second (`throttling.bps-total`): a disk that is bandwidth-bound
    /// like cherkasova2005's at 13 MB/s, whatever the host's storage.
    pub max_bytes_per_s: Option<u64>,
    /// This disk is the guest's root file system (`root=/dev/vdX`).
    pub root: bool,
}

// ---- raw serde structures (spans kept) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: Spanned<String>,
    #[serde(default)]
    accel: Option<Spanned<AccelChoice>>,
    #[serde(default)]
    manager: Option<Manager>,
    kernel: Option<Spanned<PathBuf>>,
    initrd: Option<Spanned<PathBuf>>,
    subnet: Option<Spanned<String>>,
    #[serde(default)]
    vm: Vec<Spanned<RawVm>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVm {
    name: Spanned<String>,
    /// This many VMs from one table, named NAME0, NAME1, … (scale labs).
    count: Option<Spanned<i64>>,
    vcpus: Option<Spanned<i64>>,
    memory_mib: Option<Spanned<i64>>,
    pin_vcpus: Option<Spanned<Vec<i64>>>,
    pin_emulator: Option<Spanned<Vec<i64>>>,
    pin_io: Option<Spanned<Vec<i64>>>,
    iothreads: Option<Spanned<i64>>,
    agent: Option<bool>,
    kernel_args: Option<String>,
    files: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    nic: Vec<Spanned<RawNic>>,
    #[serde(default)]
    disk: Vec<Spanned<RawDisk>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNic {
    kind: NicKind,
    ip: Option<Spanned<String>>,
    vhost: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDisk {
    backend: DiskBackend,
    format: Option<Spanned<DiskFormat>>,
    path: Option<Spanned<PathBuf>>,
    size_mib: Option<Spanned<i64>>,
    vg: Option<Spanned<String>>,
    cache: Option<Spanned<String>>,
    aio: Option<Spanned<String>>,
    iothread: Option<Spanned<i64>>,
    optional: Option<bool>,
    root: Option<bool>,
    max_bytes_per_s: Option<Spanned<i64>>,
}

/// 1-based line of byte offset `pos` in `text`.
fn line_of(text: &str, pos: usize) -> usize {
    let pos = pos.min(text.len());
    text.as_bytes()[..pos]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

struct Ctx<'a> {
    file: PathBuf,
    text: &'a str,
    lines: BTreeMap<String, usize>,
}

impl Ctx<'_> {
    fn err(
        &self,
        span: std::ops::Range<usize>,
        field: &str,
        message: impl Into<String>,
    ) -> LabError {
        LabError::Spec {
            file: self.file.clone(),
            line: line_of(self.text, span.start),
            field: field.to_string(),
            message: message.into(),
        }
    }

    fn note<T>(&mut self, field: &str, s: &Spanned<T>) {
        let line = line_of(self.text, s.span().start);
        self.lines.insert(field.to_string(), line);
    }

    fn count(
        &mut self,
        field: &str,
        v: &Option<Spanned<i64>>,
        default: i64,
        min: i64,
        max: i64,
    ) -> Result<i64> {
        match v {
            None => Ok(default),
            Some(s) => {
                self.note(field, s);
                let x = *s.get_ref();
                if (1..min).contains(&x) && field.ends_with(".memory_mib") {
                    Err(self.err(
                        s.span(),
                        field,
                        format!(
                            "{x} MiB is less than {min} MiB, the least a Debian cloud kernel \
                             boots in (at 80 and 96 MiB it panics: \"System is deadlocked on memory\")"
                        ),
                    ))
                } else if x < min || x > max {
                    Err(self.err(
                        s.span(),
                        field,
                        format!("{x} is out of range (must be {min}..={max})"),
                    ))
                } else {
                    Ok(x)
                }
            }
        }
    }

    fn cpus(&mut self, field: &str, v: &Option<Spanned<Vec<i64>>>) -> Result<Vec<usize>> {
        let Some(s) = v else { return Ok(Vec::new()) };
        self.note(field, s);
        s.get_ref()
            .iter()
            .map(|&c| {
                usize::try_from(c)
                    .map_err(|_| self.err(s.span(), field, format!("CPU {c} is not a CPU number")))
            })
            .collect()
    }
}

/// Guest addresses of tap NICs: given ones, and the next free host
/// number (from .2) for the others.
struct IpAlloc {
    used: HashSet<Ipv4Addr>,
    next_host: u32,
}

impl Default for IpAlloc {
    fn default() -> Self {
        IpAlloc {
            used: HashSet::new(),
            next_host: 2,
        }
    }
}

impl IpAlloc {
    fn next(&mut self, subnet: Subnet) -> Ipv4Addr {
        while self.used.contains(&subnet.host(self.next_host)) {
            self.next_host += 1;
        }
        let ip = subnet.host(self.next_host);
        self.next_host += 1;
        ip
    }
}

/// A TOML syntax or type error as a spec error naming the line and key.
fn toml_error(e: &toml::de::Error, text: &str, file: &Path) -> LabError {
    let span = e.span().unwrap_or(0..0);
    let line = line_of(text, span.start);
    // Name the key: the span's text for unknown keys, else the key on that line.
    let snippet = text.get(span.clone()).unwrap_or("").trim();
    let line_text = text.lines().nth(line.saturating_sub(1)).unwrap_or("");
    let field = if !snippet.is_empty()
        && !snippet.contains(['\n', '=', '['])
        && e.message().contains("unknown field")
    {
        snippet.trim_matches('"').to_string()
    } else if let Some((k, _)) = line_text.split_once('=') {
        k.trim().to_string()
    } else {
        line_text.trim().to_string()
    };
    LabError::Spec {
        file: file.to_path_buf(),
        line,
        field,
        message: e.message().trim().to_string(),
    }
}

/// The spec's tables, one helper each.
impl Ctx<'_> {
    fn lab_name(&mut self, raw: &RawSpec) -> Result<String> {
        self.note("name", &raw.name);
        let name = raw.name.get_ref().clone();
        if !crate::names::valid_name(&name) {
            return Err(self.err(
                raw.name.span(),
                "name",
                format!("'{name}' is not a valid lab name (1-32 of A-Z a-z 0-9 - _)"),
            ));
        }
        Ok(name)
    }

    fn boot_files(&mut self, raw: &RawSpec) -> Result<()> {
        if let Some(k) = &raw.kernel {
            self.note("kernel", k);
        }
        if let Some(k) = &raw.initrd {
            self.note("initrd", k);
        }
        if raw.initrd.is_some() && raw.kernel.is_none() {
            let s = raw.initrd.as_ref().map(toml::Spanned::span).unwrap_or(0..0);
            return Err(self.err(
                s,
                "initrd",
                "an own initrd needs an own kernel too (set kernel = ...)",
            ));
        }
        Ok(())
    }

    fn subnet(&mut self, raw: &RawSpec, name: &str) -> Result<Subnet> {
        Ok(match &raw.subnet {
            None => Subnet {
                network: Ipv4Addr::new(10, 77, crate::names::default_subnet_octet(name), 0),
                prefix: 24,
            },
            Some(s) => {
                self.note("subnet", s);
                parse_subnet(s.get_ref()).ok_or_else(|| {
                    self.err(
                        s.span(),
                        "subnet",
                        format!("'{}' is not an IPv4 network a.b.c.d/8..30", s.get_ref()),
                    )
                })?
            }
        })
    }

    /// One `[[vm]]` table: one VM, or `count` of them named NAME0, NAME1, …
    fn vm(
        &mut self,
        i: usize,
        rv: &Spanned<RawVm>,
        subnet: Subnet,
        alloc: &mut IpAlloc,
    ) -> Result<Vec<VmSpec>> {
        let vm = rv.get_ref();
        let p = format!("vm[{i}]");
        self.note(&p, rv);
        self.note(&format!("{p}.name"), &vm.name);
        let vname = vm.name.get_ref().clone();
        if !crate::names::valid_name(&vname) {
            return Err(self.err(
                vm.name.span(),
                &format!("{p}.name"),
                format!("'{vname}' is not a valid VM name (1-32 of A-Z a-z 0-9 - _)"),
            ));
        }
        let count = self.count(&format!("{p}.count"), &vm.count, 1, 1, 256)? as usize;
        let vcpus = self.count(&format!("{p}.vcpus"), &vm.vcpus, 1, 1, 64)? as u32;
        let memory_mib = self.count(
            &format!("{p}.memory_mib"),
            &vm.memory_mib,
            256,
            MIN_MEMORY_MIB,
            1 << 20,
        )? as u32;
        let iothreads = self.count(&format!("{p}.iothreads"), &vm.iothreads, 0, 0, 16)? as u32;
        let pin_vcpus = self.cpus(&format!("{p}.pin_vcpus"), &vm.pin_vcpus)?;
        if !pin_vcpus.is_empty() && pin_vcpus.len() != vcpus as usize {
            let s = vm
                .pin_vcpus
                .as_ref()
                .map(toml::Spanned::span)
                .unwrap_or(0..0);
            return Err(self.err(
                s,
                &format!("{p}.pin_vcpus"),
                format!(
                    "has {} entries but the VM has {vcpus} vCPUs (one host CPU per vCPU)",
                    pin_vcpus.len()
                ),
            ));
        }
        let pin_emulator = self.cpus(&format!("{p}.pin_emulator"), &vm.pin_emulator)?;
        let pin_io = self.cpus(&format!("{p}.pin_io"), &vm.pin_io)?;
        let files = self.files(&p, vm)?;
        let mut out = Vec::new();
        for k in 0..count {
            let mut nics = Vec::new();
            for (j, rn) in vm.nic.iter().enumerate() {
                nics.push(self.nic(&format!("{p}.nic[{j}]"), rn, subnet, alloc)?);
            }
            let mut disks = Vec::new();
            for (j, rd) in vm.disk.iter().enumerate() {
                disks.push(self.disk(&format!("{p}.disk[{j}]"), rd, iothreads)?);
            }
            if disks.iter().filter(|d| d.root).count() > 1 {
                return Err(self.err(
                    rv.span(),
                    &format!("{p}.disk"),
                    "more than one disk has root = true",
                ));
            }
            if nics.iter().filter(|n| n.kind == NicKind::User).count() > 1 {
                return Err(self.err(
                    rv.span(),
                    &format!("{p}.nic"),
                    "at most one user NIC per VM",
                ));
            }
            let name = if vm.count.is_some() {
                format!("{vname}{k}")
            } else {
                vname.clone()
            };
            if !crate::names::valid_name(&name) {
                return Err(self.err(
                    vm.name.span(),
                    &format!("{p}.name"),
                    format!(
                        "'{name}' (with count) is not a valid VM name (1-32 of A-Z a-z 0-9 - _)"
                    ),
                ));
            }
            out.push(VmSpec {
                name,
                vcpus,
                memory_mib,
                pin_vcpus: pin_vcpus.clone(),
                pin_emulator: pin_emulator.clone(),
                pin_io: pin_io.clone(),
                iothreads,
                agent: vm.agent.unwrap_or(true),
                kernel_args: vm.kernel_args.clone().unwrap_or_default(),
                files: files.clone(),
                nics,
                disks,
            });
        }
        Ok(out)
    }

    /// `files = ["HOST:GUEST", ...]`.
    fn files(&mut self, p: &str, vm: &RawVm) -> Result<Vec<FileSpec>> {
        let cx = self;
        let mut files = Vec::new();
        if let Some(fs) = &vm.files {
            cx.note(&format!("{p}.files"), fs);
            for (j, f) in fs.get_ref().iter().enumerate() {
                let field = format!("{p}.files[{j}]");
                cx.note(&field, f);
                let (h, g) = f.get_ref().rsplit_once(':').ok_or_else(|| {
                    cx.err(
                        f.span(),
                        &field,
                        format!("'{}' is not HOST_PATH:GUEST_PATH", f.get_ref()),
                    )
                })?;
                if h.is_empty() || !g.starts_with('/') || g.ends_with('/') || g.contains("/../") {
                    return Err(cx.err(
                        f.span(),
                        &field,
                        format!(
                            "'{}': need a host path and an absolute guest file path",
                            f.get_ref()
                        ),
                    ));
                }
                files.push(FileSpec {
                    host: PathBuf::from(h),
                    guest: g.to_string(),
                });
            }
        }
        Ok(files)
    }

    /// One `[[vm.nic]]` table.
    fn nic(
        &mut self,
        field: &str,
        rn: &Spanned<RawNic>,
        subnet: Subnet,
        alloc: &mut IpAlloc,
    ) -> Result<NicSpec> {
        let cx = self;
        let n = rn.get_ref();
        cx.note(field, rn);
        let vhost = n.vhost.as_ref().map(|v| *v.get_ref()).unwrap_or(false);
        if let Some(v) = &n.vhost {
            cx.note(&format!("{field}.vhost"), v);
        }
        let ip = match (&n.ip, n.kind) {
            (Some(s), NicKind::User) => {
                return Err(cx.err(
                    s.span(),
                    &format!("{field}.ip"),
                    "user NICs get 10.0.2.15 from QEMU; 'ip' is for tap NICs",
                ));
            }
            (Some(s), NicKind::Tap) => {
                cx.note(&format!("{field}.ip"), s);
                let ip: Ipv4Addr = s.get_ref().parse().map_err(|_| {
                    cx.err(
                        s.span(),
                        &format!("{field}.ip"),
                        format!("'{}' is not an IPv4 address", s.get_ref()),
                    )
                })?;
                let net = u32::from(ip) & (u32::MAX << (32 - subnet.prefix));
                if net != u32::from(subnet.network) || ip == subnet.host(1) {
                    return Err(cx.err(s.span(), &format!("{field}.ip"), format!("{ip} is not a guest address in the lab subnet {subnet} (.1 is the bridge)")));
                }
                Some(ip)
            }
            (None, NicKind::Tap) => Some(alloc.next(subnet)),
            (None, NicKind::User) => None,
        };
        if let Some(ip) = ip {
            if !alloc.used.insert(ip) {
                let s = n.ip.as_ref().map(toml::Spanned::span).unwrap_or(rn.span());
                return Err(cx.err(s, &format!("{field}.ip"), format!("{ip} is used twice")));
            }
        }
        Ok(NicSpec {
            kind: n.kind,
            ip,
            vhost,
        })
    }

    /// One `[[vm.disk]]` table.
    fn disk(&mut self, field: &str, rd: &Spanned<RawDisk>, iothreads: u32) -> Result<DiskSpec> {
        let cx = self;
        let d = rd.get_ref();
        cx.note(field, rd);
        let format = d.format.as_ref().map(|f| *f.get_ref()).unwrap_or_default();
        if let Some(f) = &d.format {
            if d.backend != DiskBackend::File && format != DiskFormat::Raw {
                return Err(cx.err(
                    f.span(),
                    &format!("{field}.format"),
                    "only file disks can be qcow2; block and lvm disks are raw",
                ));
            }
        }
        let size_mib = cx.count(&format!("{field}.size_mib"), &d.size_mib, 64, 1, 1 << 24)? as u64;
        let path = d.path.as_ref().map(|s| {
            cx.note(&format!("{field}.path"), s);
            s.get_ref().clone()
        });
        if d.backend == DiskBackend::Lvm && d.path.is_some() {
            let s = d.path.as_ref().map(toml::Spanned::span).unwrap_or(0..0);
            return Err(cx.err(
                s,
                &format!("{field}.path"),
                "lvm disks are created by the lab; set vg, not path",
            ));
        }
        let vg = match (&d.vg, d.backend) {
            (Some(v), DiskBackend::Lvm) => {
                cx.note(&format!("{field}.vg"), v);
                Some(v.get_ref().clone())
            }
            (Some(v), _) => {
                return Err(cx.err(
                    v.span(),
                    &format!("{field}.vg"),
                    "vg is only for backend = \"lvm\"",
                ))
            }
            (None, DiskBackend::Lvm) => {
                return Err(cx.err(
                    rd.span(),
                    &format!("{field}.vg"),
                    "backend = \"lvm\" needs vg = \"<volume group>\"",
                ))
            }
            (None, _) => None,
        };
        let cache = match &d.cache {
            Some(c) => {
                if !CACHE_MODES.contains(&c.get_ref().as_str()) {
                    return Err(cx.err(
                        c.span(),
                        &format!("{field}.cache"),
                        format!("'{}' is not one of {}", c.get_ref(), CACHE_MODES.join(", ")),
                    ));
                }
                c.get_ref().clone()
            }
            None => "none".to_string(),
        };
        let aio = match &d.aio {
            Some(a) => {
                if !AIO_MODES.contains(&a.get_ref().as_str()) {
                    return Err(cx.err(
                        a.span(),
                        &format!("{field}.aio"),
                        format!("'{}' is not one of {}", a.get_ref(), AIO_MODES.join(", ")),
                    ));
                }
                if a.get_ref() == "native" && !(cache == "none" || cache == "directsync") {
                    return Err(cx.err(
                        a.span(),
                        &format!("{field}.aio"),
                        "aio = \"native\" needs cache = \"none\" or \"directsync\" (O_DIRECT)",
                    ));
                }
                a.get_ref().clone()
            }
            None => "threads".to_string(),
        };
        let iothread = match &d.iothread {
            Some(t) => {
                cx.note(&format!("{field}.iothread"), t);
                let v = *t.get_ref();
                if v < 0 || v >= i64::from(iothreads) {
                    return Err(cx.err(
                        t.span(),
                        &format!("{field}.iothread"),
                        format!(
                            "I/O thread {v} does not exist (the VM has iothreads = {iothreads})"
                        ),
                    ));
                }
                Some(v as u32)
            }
            None => None,
        };
        let max_bytes_per_s = match &d.max_bytes_per_s {
            Some(b) => {
                let v = *b.get_ref();
                // QEMU's throttle refuses limits above 1e15 (throttle.c THROTTLE_VALUE_MAX).
                if !(512..=1_000_000_000_000_000).contains(&v) {
                    return Err(cx.err(
                        b.span(),
                        &format!("{field}.max_bytes_per_s"),
                        format!("{v} is not a limit QEMU takes: bytes per second from 512 to 1e15"),
                    ));
                }
                Some(v as u64)
            }
            None => None,
        };
        Ok(DiskSpec {
            backend: d.backend,
            format,
            path,
            size_mib,
            vg,
            cache,
            aio,
            iothread,
            optional: d.optional.unwrap_or(false),
            root: d.root.unwrap_or(false),
            max_bytes_per_s,
        })
    }
}

/// Parse a network `a.b.c.d/len`.
fn parse_subnet(s: &str) -> Option<Subnet> {
    let (addr, len) = s.split_once('/')?;
    let addr: Ipv4Addr = addr.parse().ok()?;
    let prefix: u8 = len.parse().ok()?;
    if !(8..=30).contains(&prefix) {
        return None;
    }
    let mask = u32::MAX << (32 - prefix);
    Some(Subnet {
        network: Ipv4Addr::from(u32::from(addr) & mask),
        prefix,
    })
}

/// The least memory a lab VM may have: the built-in guest image (a Debian
/// cloud kernel and a busybox initramfs) panics below it.
pub const MIN_MEMORY_MIB: i64 = 128;

const CACHE_MODES: [&str; 5] = ["none", "writeback", "writethrough", "directsync", "unsafe"];
const AIO_MODES: [&str; 3] = ["threads", "native", "io_uring"];

impl LabSpec {
    /// Read and parse a spec file.
    pub fn from_file(path: &Path) -> Result<LabSpec> {
        let text = vmscope_linux::files::read_input(path, vmscope_linux::files::INPUT_FILE)
            .map_err(|source| LabError::SpecRead {
                file: path.to_path_buf(),
                source,
            })?;
        let mut spec = Self::parse(&text, path)?;
        // Relative paths in a spec are relative to the spec's directory.
        let base = path.parent().unwrap_or(Path::new("."));
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(k) = spec.kernel.as_mut() {
            fix(k);
        }
        if let Some(k) = spec.initrd.as_mut() {
            fix(k);
        }
        for vm in &mut spec.vms {
            for f in &mut vm.files {
                fix(&mut f.host);
            }
            for d in &mut vm.disks {
                if let Some(p) = d.path.as_mut() {
                    fix(p);
                }
            }
        }
        Ok(spec)
    }

    /// Parse spec text; `file` is used in error messages only.
    pub fn parse(text: &str, file: &Path) -> Result<LabSpec> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| toml_error(&e, text, file))?;
        let mut cx = Ctx {
            file: file.to_path_buf(),
            text,
            lines: BTreeMap::new(),
        };
        let name = cx.lab_name(&raw)?;
        let accel = raw.accel.as_ref().map(|a| *a.get_ref()).unwrap_or_default();
        cx.boot_files(&raw)?;
        let subnet = cx.subnet(&raw, &name)?;
        if raw.vm.is_empty() {
            return Err(LabError::Spec {
                file: file.to_path_buf(),
                line: 1,
                field: "vm".into(),
                message: "the lab has no [[vm]] table".into(),
            });
        }
        let mut vms: Vec<VmSpec> = Vec::new();
        let mut alloc = IpAlloc::default();
        for (i, rv) in raw.vm.iter().enumerate() {
            for vm in cx.vm(i, rv, subnet, &mut alloc)? {
                if vms.iter().any(|v| v.name == vm.name) {
                    return Err(cx.err(
                        rv.get_ref().name.span(),
                        &format!("vm[{i}].name"),
                        format!("VM name '{}' is used twice", vm.name),
                    ));
                }
                vms.push(vm);
            }
        }
        Ok(LabSpec {
            name,
            file: Some(file.to_path_buf()),
            accel,
            manager: raw.manager.unwrap_or_default(),
            kernel: raw.kernel.map(toml::Spanned::into_inner),
            initrd: raw.initrd.map(toml::Spanned::into_inner),
            subnet,
            vms,
            lines: cx.lines,
        })
    }

    /// An error about `field`, with the line recorded while parsing (or 0).
    pub fn error(&self, field: &str, message: impl Into<String>) -> LabError {
        // Fall back to the nearest recorded parent field.
        let mut f = field;
        let line = loop {
            if let Some(l) = self.lines.get(f) {
                break *l;
            }
            match f.rfind('.') {
                Some(i) => f = &f[..i],
                None => break 0,
            }
        };
        LabError::Spec {
            file: self.file.clone().unwrap_or_else(|| PathBuf::from("<spec>")),
            line,
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// Whether any VM has a tap NIC (the lab then makes a bridge).
    pub fn needs_bridge(&self) -> bool {
        self.vms
            .iter()
            .any(|v| v.nics.iter().any(|n| n.kind == NicKind::Tap))
    }

    /// What in this spec needs root, if anything.
    pub fn root_reason(&self) -> Option<String> {
        if self.needs_bridge() {
            return Some("a tap NIC (bridge and taps)".into());
        }
        for vm in &self.vms {
            if vm
                .disks
                .iter()
                .any(|d| d.backend == DiskBackend::Block && d.path.is_none())
            {
                return Some(format!("VM {}: a block disk (loop device)", vm.name));
            }
            if vm.disks.iter().any(|d| d.backend == DiskBackend::Lvm) {
                return Some(format!("VM {}: an lvm disk", vm.name));
            }
        }
        None
    }
}

/// Facts about the host that spec checks need (injectable for tests).
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// CPUs this process may run on.
    pub cpus: Vec<usize>,
    pub root: bool,
    /// Existing network interface names.
    pub interfaces: Vec<String>,
    pub device_mapper: bool,
    pub vhost_net: bool,
    /// IPv4 networks on host interfaces: (interface, address, prefix).
    pub ipv4: Vec<(String, Ipv4Addr, u8)>,
}

impl HostFacts {
    /// Probe the running host.
    pub fn probe() -> HostFacts {
        HostFacts {
            cpus: allowed_cpus(),
            root: crate::util::is_root(),
            interfaces: std::fs::read_dir("/sys/class/net")
                .map(|rd| {
                    rd.filter_map(std::result::Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default(),
            device_mapper: device_mapper_present(),
            vhost_net: Path::new("/dev/vhost-net").exists(),
            ipv4: host_ipv4(),
        }
    }
}

/// IPv4 addresses of host interfaces, from `ip -o -4 addr show`.
pub fn host_ipv4() -> Vec<(String, Ipv4Addr, u8)> {
    let Some(ip) = crate::util::which("ip") else {
        return Vec::new();
    };
    let Ok(out) = std::process::Command::new(ip)
        .args(["-o", "-4", "addr", "show"])
        .output()
    else {
        return Vec::new();
    };
    parse_ip_addr(&String::from_utf8_lossy(&out.stdout))
}

/// Parse `ip -o -4 addr show` lines: `2: eth0    inet 10.0.0.2/24 brd ...`.
pub fn parse_ip_addr(text: &str) -> Vec<(String, Ipv4Addr, u8)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let _idx = w.next()?;
            let ifname = w.next()?.to_string();
            if w.next()? != "inet" {
                return None;
            }
            let (a, p) = w.next()?.split_once('/')?;
            Some((ifname, a.parse().ok()?, p.parse().ok()?))
        })
        .collect()
}

/// CPUs the current process may run on (sched_getaffinity), else 0..available.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            return (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect();
        }
    }
    let n = std::thread::available_parallelism()
        .map(std::num::NonZero::get)
        .unwrap_or(1);
    (0..n).collect()
}

/// Whether the kernel has device-mapper (needed for LVM).
pub fn device_mapper_present() -> bool {
    Path::new("/dev/mapper/control").exists()
        || std::fs::read_to_string("/proc/misc")
            .map(|s| s.lines().any(|l| l.ends_with(" device-mapper")))
            .unwrap_or(false)
}

/// Host checks of a parsed spec, before anything is started. `own` lists
/// interfaces this lab already owns (from a stale state) that may exist.
pub fn check_host(spec: &LabSpec, host: &HostFacts, own: &[String]) -> Result<()> {
    if let Some(what) = spec.root_reason() {
        if !host.root {
            return Err(LabError::NotRoot {
                lab: spec.name.clone(),
                what: format!(
                    "{} ({})",
                    what,
                    spec.file
                        .as_deref()
                        .unwrap_or(Path::new("<spec>"))
                        .display()
                ),
            });
        }
    }
    for (key, p) in [("kernel", &spec.kernel), ("initrd", &spec.initrd)] {
        if let Some(p) = p {
            if !p.is_file() {
                return Err(spec.error(key, format!("{} does not exist", p.display())));
            }
        }
    }
    if spec.needs_bridge() {
        let br = crate::names::bridge(&spec.name);
        if host.interfaces.contains(&br) && !own.contains(&br) {
            return Err(spec.error("name", format!("bridge {br} (derived from the lab name) is already in use by something else; pick another lab name, or remove it if it is left over from a lab that was killed (`ip link del {br}`)")));
        }
    }
    if spec.needs_bridge() {
        let br = crate::names::bridge(&spec.name);
        for (ifname, addr, prefix) in &host.ipv4 {
            if *ifname == br || own.contains(ifname) {
                continue;
            }
            let p = (*prefix).min(spec.subnet.prefix).clamp(1, 32);
            let mask = u32::MAX << (32 - u32::from(p));
            if u32::from(*addr) & mask == u32::from(spec.subnet.network) & mask {
                return Err(spec.error(
                    "subnet",
                    format!(
                        "the lab subnet {} overlaps {addr}/{prefix} on {ifname}; set subnet = \"a.b.c.0/24\" to a free network",
                        spec.subnet
                    ),
                ));
            }
        }
    }
    let mut tap_n = 0;
    for (i, vm) in spec.vms.iter().enumerate() {
        let p = format!("vm[{i}]");
        for (key, list) in [
            ("pin_vcpus", &vm.pin_vcpus),
            ("pin_emulator", &vm.pin_emulator),
            ("pin_io", &vm.pin_io),
        ] {
            if let Some(c) = list.iter().find(|c| !host.cpus.contains(c)) {
                return Err(spec.error(
                    &format!("{p}.{key}"),
                    format!(
                        "host CPU {c} does not exist or is not allowed (this host has CPUs {:?})",
                        host.cpus
                    ),
                ));
            }
        }
        if !vm.pin_io.is_empty() && vm.iothreads == 0 {
            return Err(spec.error(
                &format!("{p}.pin_io"),
                "pin_io needs iothreads >= 1 (QEMU's main loop is pinned with pin_emulator)",
            ));
        }
        for (j, f) in vm.files.iter().enumerate() {
            if !f.host.is_file() {
                return Err(spec.error(
                    &format!("{p}.files[{j}]"),
                    format!("{} does not exist or is not a file", f.host.display()),
                ));
            }
        }
        for (j, n) in vm.nics.iter().enumerate() {
            if n.vhost && !host.vhost_net {
                return Err(spec.error(
                    &format!("{p}.nic[{j}].vhost"),
                    "vhost = true needs /dev/vhost-net, which this host lacks",
                ));
            }
            if n.kind == NicKind::Tap {
                let tap = crate::names::tap(&spec.name, tap_n);
                tap_n += 1;
                if host.interfaces.contains(&tap) && !own.contains(&tap) {
                    return Err(spec.error(
                        &format!("{p}.nic[{j}]"),
                        format!("tap {tap} is already in use by something else"),
                    ));
                }
            }
        }
        for (j, d) in vm.disks.iter().enumerate() {
            let field = format!("{p}.disk[{j}]");
            match d.backend {
                DiskBackend::File => {
                    if let Some(path) = &d.path {
                        if !path.is_file() {
                            return Err(spec.error(
                                &format!("{field}.path"),
                                format!("disk image {} does not exist", path.display()),
                            ));
                        }
                    }
                }
                DiskBackend::Block => {
                    if let Some(path) = &d.path {
                        use std::os::unix::fs::FileTypeExt;
                        let ok = std::fs::metadata(path)
                            .map(|m| m.file_type().is_block_device())
                            .unwrap_or(false);
                        if !ok {
                            return Err(spec.error(
                                &format!("{field}.path"),
                                format!("{} is not a block device", path.display()),
                            ));
                        }
                    }
                }
                DiskBackend::Lvm => {
                    if !host.device_mapper && !d.optional {
                        return Err(spec.error(&field, "LVM needs device-mapper, which this kernel lacks (mark the disk optional = true to skip it)"));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<LabSpec> {
        LabSpec::parse(s, Path::new("t.toml"))
    }

    fn spec_err(s: &str) -> (usize, String, String) {
        match parse(s) {
            Err(LabError::Spec {
                line,
                field,
                message,
                ..
            }) => (line, field, message),
            other => panic!("expected a spec error, got {other:?}"),
        }
    }

    const GOOD: &str = r#"
name = "t"
accel = "tcg"

[[vm]]
name = "a"
vcpus = 2
memory_mib = 128
pin_vcpus = [0, 1]
iothreads = 1
pin_io = [1]
files = ["/bin/true:/usr/bin/true"]
[[vm.nic]]
kind = "tap"
[[vm.disk]]
backend = "file"
format = "qcow2"
cache = "none"
aio = "native"
iothread = 0

[[vm]]
name = "b"
[[vm.nic]]
kind = "user"
[[vm.nic]]
kind = "tap"
ip = "10.9.9.9"
"#;

    #[test]
    fn manager_key() {
        let s = parse(&GOOD.replace(
            "accel = \"tcg\"",
            "manager = \"libvirt\"\nsubnet = \"10.9.9.0/24\"",
        ))
        .unwrap();
        assert_eq!(s.manager, Manager::Libvirt);
        let (line, _, msg) = spec_err(&GOOD.replace("accel = \"tcg\"", "manager = \"xen\""));
        assert_eq!(line, 3, "{msg}");
        assert!(msg.contains("xen") || msg.contains("variant"), "{msg}");
    }

    #[test]
    fn parses_a_good_spec() {
        let s = parse(&GOOD.replace(
            "accel = \"tcg\"",
            "accel = \"tcg\"\nsubnet = \"10.9.9.0/24\"",
        ))
        .unwrap();
        assert_eq!(s.name, "t");
        assert_eq!(s.accel, AccelChoice::Tcg);
        assert_eq!(s.manager, Manager::Qemu);
        assert_eq!(s.vms.len(), 2);
        assert_eq!(s.vms[0].vcpus, 2);
        assert_eq!(s.vms[0].pin_vcpus, vec![0, 1]);
        assert_eq!(s.vms[0].nics[0].ip, Some(Ipv4Addr::new(10, 9, 9, 2)));
        assert_eq!(s.vms[0].disks[0].format, DiskFormat::Qcow2);
        assert_eq!(s.vms[0].disks[0].iothread, Some(0));
        assert_eq!(s.vms[0].files[0].guest, "/usr/bin/true");
        assert_eq!(s.vms[1].vcpus, 1);
        assert_eq!(s.vms[1].memory_mib, 256);
        assert!(s.vms[1].agent);
        assert_eq!(s.vms[1].nics[1].ip, Some(Ipv4Addr::new(10, 9, 9, 9)));
        assert_eq!(s.lines.get("vm[0].vcpus"), Some(&8));
    }

    #[test]
    fn count_makes_numbered_vms_with_their_own_addresses() {
        let s = parse(
            "name = \"c\"\nsubnet = \"10.8.8.0/24\"\n[[vm]]\nname = \"s\"\ncount = 3\n[[vm.nic]]\nkind = \"tap\"\n[[vm]]\nname = \"t\"\n",
        )
        .unwrap();
        let names: Vec<&str> = s.vms.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, vec!["s0", "s1", "s2", "t"]);
        let ips: Vec<_> = s.vms[..3].iter().map(|v| v.nics[0].ip.unwrap()).collect();
        assert_eq!(
            ips,
            vec![
                Ipv4Addr::new(10, 8, 8, 2),
                Ipv4Addr::new(10, 8, 8, 3),
                Ipv4Addr::new(10, 8, 8, 4)
            ]
        );
        let e = parse("name = \"c\"\n[[vm]]\nname = \"s\"\ncount = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("vm[0].count") && e.contains("out of range"),
            "{e}"
        );
        let e = parse("name = \"c\"\n[[vm]]\nname = \"s\"\ncount = 2\n[[vm]]\nname = \"s1\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'s1' is used twice"), "{e}");
    }

    #[test]
    fn unknown_key_names_line_and_field() {
        let (line, field, msg) = spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\nvcpu = 2\n");
        assert_eq!(line, 4);
        assert_eq!(field, "vcpu");
        assert!(msg.contains("unknown field"), "{msg}");
        let e = parse("name = \"t\"\nbogus = 1\n[[vm]]\nname = \"a\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.toml:2: bogus: unknown field"), "{e}");
    }

    #[test]
    fn zero_vcpus_names_line_and_field() {
        let (line, field, msg) = spec_err("name = \"t\"\n\n[[vm]]\nname = \"a\"\nvcpus = 0\n");
        assert_eq!((line, field.as_str()), (5, "vm[0].vcpus"));
        assert!(msg.contains("out of range"), "{msg}");
        let e = parse("name = \"t\"\n\n[[vm]]\nname = \"a\"\nvcpus = 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.toml:5: vm[0].vcpus:"), "{e}");
    }

    #[test]
    fn wrong_type_names_line_and_key() {
        let (line, field, _) = spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\nvcpus = \"two\"\n");
        assert_eq!(line, 4);
        assert_eq!(field, "vcpus");
    }

    #[test]
    fn structural_errors() {
        let (l, f, _) =
            spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\nvcpus = 2\npin_vcpus = [0]\n");
        assert_eq!((l, f.as_str()), (5, "vm[0].pin_vcpus"));
        let (l, f, _) = spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm]]\nname = \"a\"\n");
        assert_eq!((l, f.as_str()), (5, "vm[1].name"));
        let (_, f, _) = spec_err(
            "name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"file\"\niothread = 0\n",
        );
        assert_eq!(f, "vm[0].disk[0].iothread");
        let (_, f, _) = spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"file\"\ncache = \"writeback\"\naio = \"native\"\n");
        assert_eq!(f, "vm[0].disk[0].aio");
        let (_, f, _) =
            spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"lvm\"\n");
        assert_eq!(f, "vm[0].disk[0].vg");
        let (_, f, _) = spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\nfiles = [\"nocolon\"]\n");
        assert_eq!(f, "vm[0].files[0]");
        let (l, f, _) = spec_err("name = \"t\"\n");
        assert_eq!((l, f.as_str()), (1, "vm"));
        let (_, f, _) = spec_err("name = \"bad name\"\n[[vm]]\nname = \"a\"\n");
        assert_eq!(f, "name");
        let (_, f, _) = spec_err("name = \"t\"\nsubnet = \"10.0.0.0/24\"\n[[vm]]\nname = \"a\"\n[[vm.nic]]\nkind = \"tap\"\nip = \"10.0.1.2\"\n");
        assert_eq!(f, "vm[0].nic[0].ip");
    }

    fn facts() -> HostFacts {
        HostFacts {
            cpus: vec![0, 1],
            root: true,
            interfaces: vec!["lo".into()],
            device_mapper: false,
            vhost_net: false,
            ipv4: vec![("eth0".into(), Ipv4Addr::new(172, 16, 0, 2), 24)],
        }
    }

    #[test]
    fn host_check_pin_to_missing_cpu() {
        let s = parse("name = \"t\"\n[[vm]]\nname = \"a\"\nvcpus = 1\npin_vcpus = [7]\n").unwrap();
        let e = check_host(&s, &facts(), &[]).unwrap_err();
        match &e {
            LabError::Spec {
                line,
                field,
                message,
                ..
            } => {
                assert_eq!(*line, 5);
                assert_eq!(field, "vm[0].pin_vcpus");
                assert!(message.contains("CPU 7"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn host_check_missing_kernel_and_disk() {
        let s = parse("name = \"t\"\nkernel = \"/nonexistent/vmlinuz\"\n[[vm]]\nname = \"a\"\n")
            .unwrap();
        let e = check_host(&s, &facts(), &[]).unwrap_err().to_string();
        assert!(e.starts_with("t.toml:2: kernel:"), "{e}");
        let s = parse("name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"file\"\npath = \"/nonexistent.img\"\n").unwrap();
        let e = check_host(&s, &facts(), &[]).unwrap_err().to_string();
        assert!(e.starts_with("t.toml:6: vm[0].disk[0].path:"), "{e}");
    }

    #[test]
    fn host_check_bridge_in_use_and_root() {
        let s = parse("name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.nic]]\nkind = \"tap\"\n").unwrap();
        let mut f = facts();
        f.interfaces.push(crate::names::bridge("t"));
        let e = check_host(&s, &f, &[]).unwrap_err().to_string();
        assert!(e.contains("already in use"), "{e}");
        assert!(check_host(&s, &f, &[crate::names::bridge("t")]).is_ok());
        let mut f = facts();
        f.root = false;
        let e = check_host(&s, &f, &[]).unwrap_err().to_string();
        assert!(e.contains("needs root") && e.contains("t.toml"), "{e}");
    }

    #[test]
    fn host_check_subnet_overlap() {
        let s = parse("name = \"t\"\nsubnet = \"172.16.0.0/24\"\n[[vm]]\nname = \"a\"\n[[vm.nic]]\nkind = \"tap\"\n").unwrap();
        let e = check_host(&s, &facts(), &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("t.toml:2: subnet:") && e.contains("eth0"),
            "{e}"
        );
        let parsed = parse_ip_addr("1: lo    inet 127.0.0.1/8 scope host lo\\\n2: eth0    inet 10.0.0.2/16 brd 10.0.255.255 scope global eth0\n");
        assert_eq!(parsed.len(), 2);
        assert_eq!(
            parsed[1],
            ("eth0".to_string(), Ipv4Addr::new(10, 0, 0, 2), 16)
        );
    }

    #[test]
    fn disk_throttle() {
        let text = "name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"file\"\nmax_bytes_per_s = 524288\n";
        let s = parse(text).unwrap();
        assert_eq!(s.vms[0].disks[0].max_bytes_per_s, Some(524_288));
        let (line, field, msg) = spec_err("name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"file\"\nmax_bytes_per_s = 0\n");
        assert_eq!(field, "vm[0].disk[0].max_bytes_per_s");
        assert_eq!(line, 6);
        assert!(msg.contains("from 512"), "{msg}");
    }

    #[test]
    fn host_check_lvm_without_device_mapper() {
        let text =
            "name = \"t\"\n[[vm]]\nname = \"a\"\n[[vm.disk]]\nbackend = \"lvm\"\nvg = \"vg0\"\n";
        let s = parse(text).unwrap();
        let e = check_host(&s, &facts(), &[]).unwrap_err().to_string();
        assert!(
            e.contains("LVM needs device-mapper, which this kernel lacks"),
            "{e}"
        );
        let s = parse(&format!("{text}optional = true\n")).unwrap();
        assert!(check_host(&s, &facts(), &[]).is_ok());
    }
}

#[cfg(test)]
mod shipped_specs {
    use super::*;

    /// Every spec in labs/ parses and passes host checks on a 2-CPU root host.
    #[test]
    fn labs_directory_specs_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../labs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let s = LabSpec::from_file(&p).unwrap_or_else(|e| panic!("{e}"));
                let text = std::fs::read_to_string(&p).unwrap();
                assert!(
                    text.starts_with('#'),
                    "{} must start with a comment naming its experiment",
                    p.display()
                );
                let facts = HostFacts {
                    cpus: vec![0, 1],
                    root: true,
                    interfaces: vec!["lo".into()],
                    device_mapper: false,
                    vhost_net: false,
                    ipv4: Vec::new(),
                };
                check_host(&s, &facts, &[]).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 6, "expected the six shipped specs, found {n}");
    }
}
