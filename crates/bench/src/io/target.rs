//! Targets of `bench io`: `host:PATH` (a file or block device on the host)
//! and `vm:NAME:DEVICE` (a disk inside a lab VM), what backs each (file
//! image raw or qcow2, raw block device, LVM volume; QEMU cache and aio
//! modes, from the lab's state), and the checks every target passes before
//! the first byte is written anywhere.

use crate::manifest::Manifest;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vmscope_lab::{LabState, VmState};
use vmscope_workload::io::{Mode, TargetInfo};

/// A target as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetArg {
    Host(PathBuf),
    Vm { vm: String, device: String },
}

impl TargetArg {
    /// `host:PATH` or `vm:NAME:DEVICE` (DEVICE an absolute guest path).
    pub fn parse(s: &str) -> Result<TargetArg, String> {
        if let Some(p) = s.strip_prefix("host:") {
            if p.is_empty() {
                return Err(format!("target `{s}` names no path (host:PATH)"));
            }
            return Ok(TargetArg::Host(PathBuf::from(p)));
        }
        if let Some(rest) = s.strip_prefix("vm:") {
            let (vm, dev) = rest
                .split_once(':')
                .ok_or_else(|| format!("target `{s}` is not vm:NAME:DEVICE"))?;
            if vm.is_empty() || !dev.starts_with('/') {
                return Err(format!(
                    "target `{s}` is not vm:NAME:DEVICE (DEVICE a guest path such as /dev/vdb)"
                ));
            }
            return Ok(TargetArg::Vm {
                vm: vm.to_string(),
                device: dev.to_string(),
            });
        }
        Err(format!(
            "target `{s}` is neither host:PATH nor vm:NAME:DEVICE"
        ))
    }

    pub fn id(&self) -> String {
        match self {
            TargetArg::Host(p) => format!("host:{}", p.display()),
            TargetArg::Vm { vm, device } => format!("vm:{vm}:{device}"),
        }
    }
}

/// giacobbi2011's four machines: what stores a target's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// Native, on the host.
    Host,
    /// A VM on a raw file image.
    FileRaw,
    /// A VM on a qcow2 file image.
    FileQcow2,
    /// A VM on a raw block device (a partition, or a loop device here).
    Block,
    /// A VM on an LVM logical volume.
    Lvm,
    /// A VM disk the lab did not make (unknown backing).
    Unknown,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Host => "host",
            Backend::FileRaw => "file-raw",
            Backend::FileQcow2 => "file-qcow2",
            Backend::Block => "block",
            Backend::Lvm => "lvm",
            Backend::Unknown => "unknown",
        }
    }

    /// From a lab disk's backend and format.
    pub fn of_disk(backend: &str, format: &str) -> Backend {
        match (backend, format) {
            ("file", "qcow2") => Backend::FileQcow2,
            ("file", _) => Backend::FileRaw,
            ("block", _) => Backend::Block,
            ("lvm", _) => Backend::Lvm,
            _ => Backend::Unknown,
        }
    }
}

/// Where a target's I/O runs.
#[derive(Debug, Clone)]
pub enum Place {
    Host,
    Vm {
        vm: Box<VmState>,
        lab: String,
        accel: String,
    },
}

/// A resolved, inspected target.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:PATH` or `vm:NAME:DEVICE`.
    pub id: String,
    /// Short name for tables and chart legends (`host`, `io0 file-raw`).
    pub label: String,
    pub backend: Backend,
    pub place: Place,
    /// Host path, or guest device.
    pub path: PathBuf,
    pub info: TargetInfo,
    /// Host and backing facts (disk backing, cache, aio, accelerator, ...).
    pub manifest: Arc<Manifest>,
    /// A host file this run created (and removes).
    pub created: bool,
}

impl Target {
    pub fn vm(&self) -> Option<&VmState> {
        match &self.place {
            Place::Vm { vm, .. } => Some(vm),
            Place::Host => None,
        }
    }
}

/// A target that cannot be measured here, and why (shown, never dropped).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Unavailable {
    pub id: String,
    pub label: String,
    pub reason: String,
}

/// The facts of a lab VM disk at `device`, if the lab made it.
pub fn lab_disk<'a>(vm: &'a VmState, device: &str) -> Option<&'a vmscope_lab::state::DiskState> {
    vm.disks
        .iter()
        .find(|d| d.guest_device.as_deref() == Some(device))
}

/// Manifest facts of a VM target: accelerator, guest kernel, vCPUs,
/// memory, and the disk's backing, cache and aio modes.
pub fn vm_facts(lab: &LabState, vm: &VmState, device: &str) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("where", format!("vm {} (lab {})", vm.name, lab.name)),
        ("accel", lab.accel.clone()),
        ("vcpus", vm.vcpus.to_string()),
        (
            "vm_memory_bytes",
            (u64::from(vm.memory_mib) << 20).to_string(),
        ),
        ("device", device.to_string()),
    ];
    if let Some(h) = &vm.hello {
        f.push(("guest_kernel", h.kernel.clone()));
    }
    if let Some(d) = lab_disk(vm, device) {
        let backend = Backend::of_disk(&d.backend, &d.format);
        f.push(("backend", backend.name().to_string()));
        f.push((
            "backing",
            format!(
                "{} {} at {}",
                d.backend,
                d.format,
                d.path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "?".into())
            ),
        ));
        f.push(("cache", d.cache.clone()));
        f.push(("aio", d.aio.clone()));
        f.push((
            "iothread",
            d.iothread.clone().unwrap_or_else(|| "none".into()),
        ));
        if let Some(b) = d.max_bytes_per_s {
            f.push(("throttle_bytes_per_s", b.to_string()));
        }
    } else {
        f.push(("backend", "unknown".into()));
        f.push(("backing", "not a lab disk (unknown)".into()));
    }
    f
}

/// Manifest facts of a host target.
pub fn host_facts(info: &TargetInfo) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("where", "host".to_string()),
        ("backend", "host".to_string()),
        ("device", info.path.clone()),
    ];
    let backing = match info.kind.as_str() {
        "file" => format!(
            "file on {} ({})",
            info.fs_device.as_deref().unwrap_or("?"),
            info.fs_type.as_deref().unwrap_or("?")
        ),
        "block" => match &info.loop_backing {
            Some(b) => format!("block device (loop over {b})"),
            None => "block device".to_string(),
        },
        k => k.to_string(),
    };
    f.push(("backing", backing));
    f.push(("cache", "host page cache (buffered) / O_DIRECT".into()));
    f
}

/// What the sweep asks of a target, for [`check`].
#[derive(Debug, Clone)]
pub struct Demand<'a> {
    pub modes: &'a [Mode],
    pub block_sizes: &'a [u64],
    /// Bytes from offset 0 the sweep touches: offset + the largest size.
    pub end: u64,
    pub offset: u64,
    /// Whether the region is written (write modes, or filling it so
    /// reads do not hit holes).
    pub writes: bool,
    /// `--force-destroy-data` names this target.
    pub forced: bool,
}

/// The checks before any I/O: the target exists, is a file or block
/// device, holds no mounted file system (ever), is large enough, takes
/// the block sizes with O_DIRECT, has room for its file to be filled, and
/// holds no partition table or file system signature unless forced. One
/// line naming the target on failure.
pub fn check(id: &str, info: &TargetInfo, d: &Demand) -> Result<(), String> {
    if !info.exists {
        return Err(if id.starts_with("host:") {
            format!(
                "target {id} does not exist (create a file first, e.g. `truncate -s 1G {}`, \
                 or name a block device)",
                info.path
            )
        } else {
            format!("target {id} does not exist in the guest")
        });
    }
    if let Some(why) = &info.in_use {
        return Err(format!(
            "target {id} is {why}: vmscope never writes to or benchmarks a device in use"
        ));
    }
    match info.kind.as_str() {
        "file" | "block" => {}
        "directory" => {
            return Err(format!(
                "target {id} is a directory: name a file or a block device"
            ))
        }
        k => return Err(format!("target {id} is a {k}, not a file or block device")),
    }
    if let Some(e) = &info.open_error {
        return Err(format!("target {id} cannot be opened: {e}"));
    }
    if info.size < d.end {
        return Err(format!(
            "target {id} holds {} bytes ({}), less than the {} bytes ({}) the sweep needs \
             (offset + largest --size)",
            info.size,
            crate::units::iec(info.size),
            d.end,
            crate::units::iec(d.end)
        ));
    }
    let lbs = info.logical_block.max(1);
    if d.modes.iter().any(|m| m.direct()) {
        if let Some(bs) = d.block_sizes.iter().find(|bs| !bs.is_multiple_of(lbs)) {
            return Err(format!(
                "block size {bs} is not a multiple of {id}'s logical sector size {lbs} \
                 (O_DIRECT needs whole sectors): drop it from --bs or leave out the direct modes"
            ));
        }
        if !d.offset.is_multiple_of(lbs) {
            return Err(format!(
                "offset {} is not a multiple of {id}'s logical sector size {lbs} (O_DIRECT)",
                d.offset
            ));
        }
    }
    if d.writes {
        if let Some(sig) = &info.signature {
            if !d.forced {
                return Err(format!(
                    "target {id} holds {sig}: vmscope writes to it only if \
                     --force-destroy-data {id} names it (its data will be lost)"
                ));
            }
        }
        if info.kind == "file" {
            let missing = d.end.saturating_sub(info.allocated);
            if let Some(free) = info.free {
                if missing > free {
                    return Err(format!(
                        "no space left for target {id}: filling it needs {missing} more bytes \
                         ({}), its file system has {free} free ({})",
                        crate::units::iec(missing),
                        crate::units::iec(free)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether `forced` (the `--force-destroy-data` values) names target `id`
/// (a host path may be named by any path that resolves to it).
pub fn is_forced(forced: &[String], id: &str, host_path: Option<&Path>) -> bool {
    forced.iter().any(|f| {
        f == id
            || host_path.is_some_and(|p| {
                let f = f.strip_prefix("host:").unwrap_or(f);
                Path::new(f) == p
                    || std::fs::canonicalize(f)
                        .ok()
                        .zip(std::fs::canonicalize(p).ok())
                        .is_some_and(|(a, b)| a == b)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_targets() {
        assert_eq!(
            TargetArg::parse("host:/tmp/x").unwrap(),
            TargetArg::Host("/tmp/x".into())
        );
        assert_eq!(
            TargetArg::parse("vm:io0:/dev/vdb").unwrap(),
            TargetArg::Vm {
                vm: "io0".into(),
                device: "/dev/vdb".into()
            }
        );
        assert_eq!(
            TargetArg::parse("vm:io0:/dev/vdb").unwrap().id(),
            "vm:io0:/dev/vdb"
        );
        for bad in [
            "host:",
            "vm:io0",
            "vm::/dev/x",
            "vm:io0:vdb",
            "/dev/sda",
            "disk:x",
        ] {
            assert!(TargetArg::parse(bad).is_err(), "{bad}");
        }
    }

    fn info() -> TargetInfo {
        TargetInfo {
            path: "/x".into(),
            exists: true,
            kind: "file".into(),
            size: 1 << 30,
            logical_block: 512,
            allocated: 0,
            free: Some(10 << 30),
            ..Default::default()
        }
    }

    fn demand(writes: bool) -> Demand<'static> {
        Demand {
            modes: &[Mode::DirectWrite, Mode::DirectRead],
            block_sizes: &[512, 4096, 1 << 20],
            end: 1 << 30,
            offset: 0,
            writes,
            forced: false,
        }
    }

    #[test]
    fn checks_name_the_target_and_the_problem() {
        assert!(check("host:/x", &info(), &demand(true)).is_ok());
        let e = |i: TargetInfo, d: Demand| check("host:/x", &i, &d).unwrap_err();
        let missing = TargetInfo {
            exists: false,
            ..info()
        };
        assert!(e(missing, demand(true)).contains("does not exist"));
        let mounted = TargetInfo {
            in_use: Some("a mounted file system (/dev/vda on /, ext4)".into()),
            kind: "block".into(),
            ..info()
        };
        let msg = e(mounted, demand(false));
        assert!(msg.contains("mounted") && msg.contains("host:/x"), "{msg}");
        let small = TargetInfo {
            size: 1 << 20,
            ..info()
        };
        assert!(e(small, demand(true)).contains("less than"));
        let sectors4k = TargetInfo {
            logical_block: 4096,
            ..info()
        };
        let msg = e(sectors4k, demand(true));
        assert!(
            msg.contains("block size 512") && msg.contains("4096"),
            "{msg}"
        );
        let full = TargetInfo {
            free: Some(1 << 20),
            ..info()
        };
        assert!(e(full.clone(), demand(true)).contains("no space left"));
        // Reads of allocated data need no room.
        let allocated = TargetInfo {
            allocated: 1 << 30,
            ..full
        };
        assert!(check("host:/x", &allocated, &demand(true)).is_ok());
        let gpt = TargetInfo {
            signature: Some("a GPT partition table".into()),
            ..info()
        };
        let msg = e(gpt.clone(), demand(true));
        assert!(msg.contains("--force-destroy-data host:/x"), "{msg}");
        assert!(check("host:/x", &gpt, &demand(false)).is_ok());
        let forced = Demand {
            forced: true,
            ..demand(true)
        };
        assert!(check("host:/x", &gpt, &forced).is_ok());
        let dir = TargetInfo {
            kind: "directory".into(),
            ..info()
        };
        assert!(e(dir, demand(true)).contains("directory"));
    }

    #[test]
    fn forced_names() {
        let f = vec!["/dev/loop7".to_string(), "vm:io0:/dev/vdb".to_string()];
        assert!(is_forced(
            &f,
            "host:/dev/loop7",
            Some(Path::new("/dev/loop7"))
        ));
        assert!(is_forced(&f, "vm:io0:/dev/vdb", None));
        assert!(!is_forced(&f, "vm:io0:/dev/vdc", None));
        assert!(!is_forced(
            &f,
            "host:/dev/loop8",
            Some(Path::new("/dev/loop8"))
        ));
    }

    #[test]
    fn backends() {
        assert_eq!(Backend::of_disk("file", "raw"), Backend::FileRaw);
        assert_eq!(Backend::of_disk("file", "qcow2"), Backend::FileQcow2);
        assert_eq!(Backend::of_disk("block", "raw"), Backend::Block);
        assert_eq!(Backend::of_disk("lvm", "raw"), Backend::Lvm);
        assert_eq!(Backend::FileQcow2.name(), "file-qcow2");
    }
}
