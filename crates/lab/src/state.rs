//! The lab state file (`<run dir>/state.json`) and teardown.
//!
//! Every host resource the lab makes (QEMU processes, taps, the bridge, loop
//! devices, LVM volumes, files, directories) is recorded *before* it is
//! created and updated after, so `lab down` can remove everything even when a
//! VM crashed or the lab process was killed half-way. Teardown is idempotent:
//! a resource that is already gone counts as removed, not as an error.

use crate::error::{LabError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vmscope_linux::ProcRoot;

/// Default root of lab run directories: `$VMSCOPE_RUN` or /run/vmscope/labs.
pub fn default_run_root() -> PathBuf {
    std::env::var_os("VMSCOPE_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/vmscope/labs"))
}

/// Lifecycle of a lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// `lab up` is creating resources.
    Starting,
    /// Every VM answered (or was marked failed).
    Up,
    /// `lab up` failed; resources may remain until `lab down`.
    Failed,
    /// `lab down` is removing resources.
    Stopping,
}

/// One host resource made by the lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Resource {
    /// A QEMU process. `marker` is a string in its command line unique to
    /// this lab (the VM's run directory), used to find it when the pid was
    /// never recorded and to avoid killing a reused pid.
    Process {
        vm: String,
        pid: Option<u32>,
        pidfile: PathBuf,
        marker: String,
    },
    /// A transient libvirt domain (destroying it undefines it).
    LibvirtDomain { uri: String, name: String },
    /// A tap interface.
    Tap { name: String },
    /// A bridge.
    Bridge { name: String },
    /// A loop device over `backing`; `device` once known.
    LoopDevice {
        device: Option<String>,
        backing: PathBuf,
    },
    /// An LVM logical volume.
    LogicalVolume { vg: String, lv: String },
    /// A file (image, socket, log, initramfs overlay).
    File { path: PathBuf },
    /// A directory, removed recursively.
    Dir { path: PathBuf },
}

impl Resource {
    /// Short human description.
    pub fn describe(&self) -> String {
        match self {
            Resource::Process { vm, pid, .. } => match pid {
                Some(p) => format!("qemu process {p} (VM {vm})"),
                None => format!("qemu process of VM {vm}"),
            },
            Resource::LibvirtDomain { uri, name } => format!("libvirt domain {name} ({uri})"),
            Resource::Tap { name } => format!("tap {name}"),
            Resource::Bridge { name } => format!("bridge {name}"),
            Resource::LoopDevice { device, backing } => match device {
                Some(d) => format!("loop device {d} ({})", backing.display()),
                None => format!("loop device over {}", backing.display()),
            },
            Resource::LogicalVolume { vg, lv } => format!("logical volume {vg}/{lv}"),
            Resource::File { path } => format!("file {}", path.display()),
            Resource::Dir { path } => format!("directory {}", path.display()),
        }
    }
}

/// A recorded resource and whether its creation finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceEntry {
    #[serde(flatten)]
    pub resource: Resource,
    pub created: bool,
}

/// What the guest agent said in its hello.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HelloInfo {
    pub protocol: u32,
    pub agent_version: String,
    pub kernel: String,
    pub hostname: String,
    pub cpus: u32,
    pub mem_bytes: u64,
    pub capabilities: Vec<String>,
}

/// One disk as started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskState {
    pub backend: String,
    pub format: String,
    /// What QEMU opened (file, loop device, LV); `None` when skipped.
    pub path: Option<PathBuf>,
    pub cache: String,
    pub aio: String,
    pub iothread: Option<String>,
    pub guest_device: Option<String>,
    /// Why the disk was skipped, if it was.
    pub skipped: Option<String>,
    /// QEMU's throttle, bytes per second (reads and writes together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes_per_s: Option<u64>,
}

/// One NIC as started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicState {
    pub kind: String,
    pub tap: Option<String>,
    pub guest_ip: Option<String>,
    pub guest_if: String,
    pub vhost: bool,
}

/// One VM of a lab.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmState {
    pub name: String,
    /// QEMU's pid (also the emulator / main-loop thread).
    pub pid: Option<u32>,
    pub dir: PathBuf,
    pub qmp: PathBuf,
    pub agent_socket: Option<PathBuf>,
    pub console_socket: PathBuf,
    pub console_log: PathBuf,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// Thread id of vCPU i.
    pub vcpu_tids: Vec<u32>,
    /// (`iothreadN`, tid).
    pub iothread_tids: Vec<(String, u32)>,
    pub pin_vcpus: Vec<usize>,
    pub pin_emulator: Vec<usize>,
    pub pin_io: Vec<usize>,
    /// Whether pinning was applied.
    pub pinned: bool,
    pub disks: Vec<DiskState>,
    pub nics: Vec<NicState>,
    pub hello: Option<HelloInfo>,
    /// Seconds from QEMU start to the agent's hello.
    pub boot_seconds: Option<f64>,
    /// Why the VM is not ready, if it is not.
    pub error: Option<String>,
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub qemu_argv: Vec<String>,
    /// The libvirt domain running this VM (`manager = "libvirt"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtDomainState>,
}

/// A lab VM that is a transient libvirt domain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibvirtDomainState {
    /// Connection URI (`qemu:///system`).
    pub uri: String,
    /// Domain name (the lab's name, `-`, the VM's name).
    pub name: String,
    pub uuid: String,
    /// The domain XML given to `virsh create`.
    pub xml: PathBuf,
}

/// The state of one lab.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabState {
    pub name: String,
    pub spec_file: Option<PathBuf>,
    pub run_dir: PathBuf,
    pub phase: Phase,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// Who runs the VMs: `qemu` (the lab itself) or `libvirt`.
    #[serde(default)]
    pub manager: crate::spec::Manager,
    /// Why this accelerator (probe verdict); copied into session metadata.
    pub accel_reason: String,
    pub lab_pid: u32,
    pub created_unix: u64,
    pub bridge: Option<String>,
    pub bridge_address: Option<String>,
    pub image_hash: Option<String>,
    pub kernel_release: Option<String>,
    pub vms: Vec<VmState>,
    /// Things the lab skipped or changed, said to the user.
    pub notes: Vec<String>,
    pub resources: Vec<ResourceEntry>,
}

impl LabState {
    /// A fresh state.
    pub fn new(name: &str, run_dir: &Path) -> LabState {
        LabState {
            name: name.to_string(),
            spec_file: None,
            run_dir: run_dir.to_path_buf(),
            phase: Phase::Starting,
            accel: String::new(),
            manager: crate::spec::Manager::Qemu,
            accel_reason: String::new(),
            lab_pid: std::process::id(),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            bridge: None,
            bridge_address: None,
            image_hash: None,
            kernel_release: None,
            vms: Vec::new(),
            notes: Vec::new(),
            resources: Vec::new(),
        }
    }

    /// Path of the state file.
    pub fn path(&self) -> PathBuf {
        self.run_dir.join("state.json")
    }

    /// Write the state file atomically.
    pub fn save(&self) -> Result<()> {
        let data = serde_json::to_vec_pretty(self).map_err(|e| LabError::State {
            path: self.path(),
            message: e.to_string(),
        })?;
        if !self.run_dir.is_dir() {
            return Err(LabError::State {
                path: self.path(),
                message: format!(
                    "the lab's run directory {} was removed while lab {} was in use \
                     (by hand, or by a lab down that did not hold the lab's lock)",
                    self.run_dir.display(),
                    self.name
                ),
            });
        }
        crate::util::write_atomic(&self.path(), &data)
    }

    /// Read a state file.
    pub fn load(path: &Path) -> Result<LabState> {
        let text =
            std::fs::read_to_string(path).map_err(|e| LabError::io("read lab state", path, e))?;
        serde_json::from_str(&text).map_err(|e| LabError::State {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Record a resource about to be created and save; returns its index.
    pub fn intend(&mut self, r: Resource) -> Result<usize> {
        self.resources.push(ResourceEntry {
            resource: r,
            created: false,
        });
        self.save()?;
        Ok(self.resources.len() - 1)
    }

    /// Record resource `r`, then run `make`, the one step that makes it
    /// under a name others could hold too (a bridge, a tap, an LV): a call
    /// that either makes it or fails having made nothing. Recorded first,
    /// a lab killed right after `make` still leaves the resource to
    /// teardown; when `make` fails the record is dropped again, because
    /// the name may belong to someone else (another lab of the same name
    /// in another run directory that won a race, an LV the user made) and
    /// teardown must not remove what this lab did not make. Returns the
    /// index for [`LabState::created`] once any further set-up is done.
    pub fn make<T>(&mut self, r: Resource, make: impl FnOnce() -> Result<T>) -> Result<(usize, T)> {
        let i = self.intend(r)?;
        match make() {
            Ok(v) => Ok((i, v)),
            Err(e) => {
                self.resources.truncate(i);
                // The caller reports `e`; a failure to save the smaller
                // state only leaves the intent behind, as before.
                let _ = self.save();
                Err(e)
            }
        }
    }

    /// Mark resource `i` created (optionally replacing it with a more
    /// precise record, e.g. with a pid or device) and save.
    pub fn created(&mut self, i: usize, r: Option<Resource>) -> Result<()> {
        if let Some(e) = self.resources.get_mut(i) {
            if let Some(r) = r {
                e.resource = r;
            }
            e.created = true;
        }
        self.save()
    }

    /// A VM by name.
    pub fn vm(&self, name: &str) -> Result<&VmState> {
        self.vms
            .iter()
            .find(|v| v.name == name)
            .ok_or_else(|| LabError::NoSuchVm {
                vm: name.to_string(),
                where_: format!("lab {}", self.name),
            })
    }
}

/// What `lab down` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TeardownReport {
    pub lab: String,
    /// Resources removed by this teardown.
    pub removed: Vec<String>,
    /// Resources that were already gone.
    pub already_gone: Vec<String>,
    /// Resources that could not be removed (the state file is kept).
    pub errors: Vec<String>,
}

/// Outcome of removing one resource.
#[derive(Debug, PartialEq, Eq)]
pub enum Removal {
    Removed,
    AlreadyGone,
}

/// Remove every recorded resource, newest first, then the run directory.
/// The state file is kept (with the failures) if anything could not be removed.
pub fn teardown(state: &mut LabState) -> TeardownReport {
    let mut report = TeardownReport {
        lab: state.name.clone(),
        ..Default::default()
    };
    state.phase = Phase::Stopping;
    let _ = state.save();
    // Processes first (they hold taps, loop devices and files open), then the rest newest first.
    let mut order: Vec<usize> = (0..state.resources.len()).rev().collect();
    order.sort_by_key(|&i| {
        !matches!(
            state.resources[i].resource,
            Resource::Process { .. } | Resource::LibvirtDomain { .. }
        )
    });
    let mut failed = Vec::new();
    for i in order {
        let r = state.resources[i].resource.clone();
        let desc = r.describe();
        match remove(&r) {
            Ok(Removal::Removed) => report.removed.push(desc),
            Ok(Removal::AlreadyGone) => report.already_gone.push(desc),
            Err(e) => {
                report.errors.push(format!("{desc}: {e}"));
                failed.push(state.resources[i].clone());
            }
        }
    }
    if failed.is_empty() {
        match std::fs::remove_dir_all(&state.run_dir) {
            Ok(()) => report
                .removed
                .push(format!("run directory {}", state.run_dir.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => report
                .errors
                .push(format!("run directory {}: {e}", state.run_dir.display())),
        }
    } else {
        failed.reverse();
        state.resources = failed;
        let _ = state.save();
    }
    report
}

/// Remove one resource; a missing resource is [`Removal::AlreadyGone`].
pub fn remove(r: &Resource) -> std::result::Result<Removal, String> {
    match r {
        Resource::Process {
            pid,
            pidfile,
            marker,
            ..
        } => {
            let mut pids: Vec<u32> = Vec::new();
            if let Some(p) = pid {
                pids.push(*p);
            }
            if let Some(p) = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                pids.push(p);
            }
            pids.extend(find_processes(marker));
            pids.sort_unstable();
            pids.dedup();
            let live: Vec<u32> = pids
                .into_iter()
                .filter(|&p| process_matches(p, marker))
                .collect();
            if live.is_empty() {
                return Ok(Removal::AlreadyGone);
            }
            for &p in &live {
                kill_process(p)?;
            }
            Ok(Removal::Removed)
        }
        Resource::LibvirtDomain { uri, name } => crate::libvirt::destroy(uri, name),
        Resource::Tap { name } | Resource::Bridge { name } => {
            if !Path::new("/sys/class/net").join(name).exists() {
                return Ok(Removal::AlreadyGone);
            }
            let ip = crate::util::which("ip").ok_or("'ip' not found: install iproute2")?;
            let out = Command::new(ip)
                .args(["link", "del", "dev", name])
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() || !Path::new("/sys/class/net").join(name).exists() {
                Ok(Removal::Removed)
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        }
        Resource::LoopDevice { device, backing } => {
            let mut devices: Vec<String> = loop_devices_of(backing);
            if let Some(d) = device {
                if loop_backing(d).is_some_and(|b| same_file(&b, backing)) && !devices.contains(d) {
                    devices.push(d.clone());
                }
            }
            if devices.is_empty() {
                return Ok(Removal::AlreadyGone);
            }
            let losetup =
                crate::util::which("losetup").ok_or("'losetup' not found: install mount")?;
            for d in &devices {
                let out = Command::new(&losetup)
                    .args(["-d", d])
                    .output()
                    .map_err(|e| e.to_string())?;
                if !out.status.success() && loop_backing(d).is_some() {
                    return Err(format!(
                        "losetup -d {d}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
            }
            Ok(Removal::Removed)
        }
        Resource::LogicalVolume { vg, lv } => {
            let dev = Path::new("/dev").join(vg).join(lv);
            if !dev.exists() {
                return Ok(Removal::AlreadyGone);
            }
            let lvremove =
                crate::util::which("lvremove").ok_or("'lvremove' not found: install lvm2")?;
            let out = Command::new(lvremove)
                .args(["-f", &format!("{vg}/{lv}")])
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(Removal::Removed)
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        }
        Resource::File { path } => match std::fs::remove_file(path) {
            Ok(()) => Ok(Removal::Removed),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Removal::AlreadyGone),
            Err(e) => Err(e.to_string()),
        },
        Resource::Dir { path } => match std::fs::remove_dir_all(path) {
            Ok(()) => Ok(Removal::Removed),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Removal::AlreadyGone),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// Command line of a process, NUL-separated args joined by spaces.
pub fn cmdline(pid: u32) -> Option<String> {
    ProcRoot::system().cmdline(pid).ok().map(|a| a.join(" "))
}

/// Whether `pid` is alive (not a zombie).
pub fn alive(pid: u32) -> bool {
    ProcRoot::system().is_alive(pid)
}

/// Whether `pid` is alive and its command line contains `marker`.
pub fn process_matches(pid: u32, marker: &str) -> bool {
    alive(pid) && cmdline(pid).is_some_and(|c| c.contains(marker))
}

/// Every live process whose command line contains `marker`.
pub fn find_processes(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    ProcRoot::system()
        .pids()
        .unwrap_or_default()
        .into_iter()
        .filter(|&p| p != me && process_matches(p, marker))
        .collect()
}

/// SIGTERM, wait up to 3 s, then SIGKILL and wait up to 3 s more.
pub fn kill_process(pid: u32) -> std::result::Result<(), String> {
    let pid_t = pid as libc::pid_t;
    for (sig, wait) in [(libc::SIGTERM, 3), (libc::SIGKILL, 3)] {
        // SAFETY: sending a signal to a pid we verified by command line.
        unsafe {
            libc::kill(pid_t, sig);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(wait) {
            // Reap it if it happens to be our child.
            // SAFETY: non-blocking waitpid on a specific pid.
            unsafe {
                libc::waitpid(pid_t, std::ptr::null_mut(), libc::WNOHANG);
            }
            if !alive(pid) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Err(format!("process {pid} survived SIGKILL"))
}

/// Loop devices whose backing file is `backing`.
pub fn loop_devices_of(backing: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<String> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("loop"))
        .map(|n| format!("/dev/{n}"))
        .filter(|d| loop_backing(d).is_some_and(|b| same_file(&b, backing)))
        .collect();
    out.sort();
    out
}

/// Backing file of a loop device, if attached.
pub fn loop_backing(device: &str) -> Option<PathBuf> {
    let name = device.trim_start_matches("/dev/");
    let s = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let s = s.trim().trim_end_matches(" (deleted)");
    (!s.is_empty()).then(|| PathBuf::from(s))
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || match (a.canonicalize(), b.canonicalize()) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_in(dir: &Path) -> LabState {
        let run = dir.join("run");
        std::fs::create_dir_all(&run).unwrap();
        LabState::new("t", &run)
    }

    #[test]
    fn missing_resources_are_not_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state_in(dir.path());
        let gone = [
            Resource::Process {
                vm: "a".into(),
                pid: Some(u32::MAX - 7),
                pidfile: dir.path().join("none.pid"),
                marker: "/nonexistent/marker/".into(),
            },
            Resource::Tap {
                name: "vmst-nonex-0".into(),
            },
            Resource::Bridge {
                name: "vmsbr-nonex".into(),
            },
            Resource::LoopDevice {
                device: Some("/dev/loop250".into()),
                backing: dir.path().join("nope.img"),
            },
            Resource::LogicalVolume {
                vg: "novg".into(),
                lv: "nolv".into(),
            },
            Resource::File {
                path: dir.path().join("nofile"),
            },
            Resource::Dir {
                path: dir.path().join("nodir"),
            },
        ];
        for r in gone {
            st.intend(r).unwrap();
        }
        let rep = teardown(&mut st);
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        assert_eq!(rep.already_gone.len(), 7, "{rep:?}");
        assert!(!st.run_dir.exists());
    }

    #[test]
    fn state_round_trips_and_records_before_creation() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state_in(dir.path());
        let i = st
            .intend(Resource::File {
                path: dir.path().join("f"),
            })
            .unwrap();
        let on_disk = LabState::load(&st.path()).unwrap();
        assert_eq!(on_disk.resources.len(), 1);
        assert!(!on_disk.resources[0].created);
        st.created(i, None).unwrap();
        let on_disk = LabState::load(&st.path()).unwrap();
        assert!(on_disk.resources[0].created);
        assert_eq!(on_disk, st);
    }

    #[test]
    fn a_resource_whose_making_failed_is_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state_in(dir.path());
        let f = dir.path().join("f");
        let (i, ()) = st
            .make(Resource::File { path: f.clone() }, || Ok(()))
            .unwrap();
        let e = st
            .make(
                Resource::Tap {
                    name: "someone-elses".into(),
                },
                || -> Result<()> {
                    Err(LabError::Resource {
                        resource: "tap someone-elses".into(),
                        message: "File exists".into(),
                    })
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("File exists"), "{e}");
        st.created(i, None).unwrap();
        let on_disk = LabState::load(&st.path()).unwrap();
        assert_eq!(on_disk.resources.len(), 1, "{:?}", on_disk.resources);
        assert_eq!(on_disk.resources[0].resource, Resource::File { path: f });
        assert!(on_disk.resources[0].created);
    }

    #[test]
    fn removes_files_dirs_and_processes() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state_in(dir.path());
        let f = dir.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        let d = dir.path().join("d/e");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("x"), b"x").unwrap();
        // A process found only through its marker (pid never recorded).
        let marker = format!("{}/marker-vm/", dir.path().display());
        let mut child = Command::new("cat")
            .arg("-")
            .arg(&marker)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        st.intend(Resource::Process {
            vm: "a".into(),
            pid: None,
            pidfile: dir.path().join("none.pid"),
            marker: marker.clone(),
        })
        .unwrap();
        st.intend(Resource::File { path: f.clone() }).unwrap();
        st.intend(Resource::Dir {
            path: dir.path().join("d"),
        })
        .unwrap();
        let rep = teardown(&mut st);
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        assert_eq!(rep.removed.len(), 4, "{rep:?}");
        assert!(!f.exists());
        assert!(!dir.path().join("d").exists());
        // Reaped by the teardown (it is our child) or now.
        let _ = child.wait();
        assert!(find_processes(&marker).is_empty());
    }

    #[test]
    fn removes_network_and_loop_devices_as_root() {
        if !crate::util::is_root()
            || crate::util::which("ip").is_none()
            || crate::util::which("losetup").is_none()
        {
            vmscope_testkit::skip("needs root, ip (iproute2) and losetup (mount)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut st = state_in(dir.path());
        let br = "vmsbr-unitt";
        let tap = "vmst-unitt-0";
        let ip = crate::util::which("ip").unwrap();
        let i = st.intend(Resource::Bridge { name: br.into() }).unwrap();
        assert!(Command::new(&ip)
            .args(["link", "add", br, "type", "bridge"])
            .status()
            .unwrap()
            .success());
        st.created(i, None).unwrap();
        let i = st.intend(Resource::Tap { name: tap.into() }).unwrap();
        assert!(Command::new(&ip)
            .args(["tuntap", "add", "dev", tap, "mode", "tap"])
            .status()
            .unwrap()
            .success());
        st.created(i, None).unwrap();
        let img = dir.path().join("blk.img");
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        // Recorded without the device: the lab died between losetup and the update.
        st.intend(Resource::LoopDevice {
            device: None,
            backing: img.clone(),
        })
        .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&img)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(loop_devices_of(&img).len(), 1);
        let rep = teardown(&mut st);
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        assert!(!Path::new("/sys/class/net").join(br).exists());
        assert!(!Path::new("/sys/class/net").join(tap).exists());
        assert!(loop_devices_of(&img).is_empty());
    }

    #[test]
    fn a_bridge_of_the_same_name_made_by_another_is_left_alone_as_root() {
        if !crate::util::is_root() || crate::util::which("ip").is_none() {
            vmscope_testkit::skip("needs root and ip (iproute2)");
            return;
        }
        // Another lab of the same name (in another run directory) made the
        // bridge between this lab's check and its own `ip link add`.
        let br = "vmsbr-unito";
        let theirs = Command::new("ip")
            .args(["link", "add", br, "type", "bridge"])
            .status()
            .unwrap();
        assert!(theirs.success());
        let dir = tempfile::tempdir().unwrap();
        let mut st = state_in(dir.path());
        let e = st
            .make(Resource::Bridge { name: br.into() }, || {
                crate::start::ip(
                    &["link", "add", "name", br, "type", "bridge"],
                    "creating bridge",
                )
            })
            .unwrap_err();
        let rep = teardown(&mut st);
        let still_there = Path::new("/sys/class/net").join(br).exists();
        let _ = Command::new("ip").args(["link", "del", br]).status();
        assert!(e.to_string().contains("File exists"), "{e}");
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        assert!(
            still_there,
            "teardown removed a bridge it did not make: {rep:?}"
        );
    }
}
