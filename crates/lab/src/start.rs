//! Starting one lab VM, in stages: its run directory and state, its NICs
//! (taps on the lab's bridge, or user networking), its disks (file images,
//! loop devices, LVM volumes), its boot files, then QEMU itself. Each stage
//! adds its host resources to the state file before creating them and its
//! part of the QEMU command line to a [`QemuArgs`].

use crate::error::{LabError, Result};
use crate::image;
use crate::lab::{marker, Boot, LabOptions};
use crate::names;
use crate::qemu;
use crate::qemu_args::{Accelerator, DriveArgs, QemuArgs};
use crate::spec::{DiskBackend, DiskSpec, HostFacts, LabSpec, Manager, NicKind, VmSpec};
use crate::state::{DiskState, LabState, NicState, Resource, VmState};
use crate::util;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vmscope_discover::qmp::Qmp;

/// What every VM of a lab starts with.
pub(crate) struct Starter<'a> {
    pub spec: &'a LabSpec,
    pub opts: &'a LabOptions,
    pub boot: &'a Boot,
    pub qemu_bin: &'a Path,
    pub facts: &'a HostFacts,
    pub accel: Accelerator<'a>,
    /// The lab's bridge (taps join it).
    pub bridge: &'a str,
    /// Taps made so far (their names are numbered across the lab).
    pub taps: usize,
}

/// The guest kernel's command line, as it is put together.
struct KernelCmdline(Vec<String>);

impl KernelCmdline {
    fn new(vm: &VmSpec) -> KernelCmdline {
        let mut c = vec![
            "console=ttyS0".to_string(),
            "panic=-1".to_string(),
            "quiet".to_string(),
            format!("vmscope_name={}", vm.name),
        ];
        if !vm.agent {
            c.push("vmscope_agent=0".into());
        }
        KernelCmdline(c)
    }

    fn push(&mut self, s: impl Into<String>) {
        self.0.push(s.into());
    }
}

impl Starter<'_> {
    /// Start VM number `vi` of the spec; returns its QMP session once QEMU
    /// answers (the agent's hello is waited for later, for all VMs at once),
    /// or `None` for a libvirt domain (libvirtd holds its monitor).
    pub fn start_vm(&mut self, st: &mut LabState, vi: usize, vm: &VmSpec) -> Result<Option<Qmp>> {
        let dir = st.run_dir.join(&vm.name);
        // Under libvirt the same stages run; libvirt binds the agent socket
        // where docs/profile-vm.md tells a user to put it, and starts QEMU.
        let domain = (st.manager == Manager::Libvirt)
            .then(|| crate::libvirt::domain_name(&self.spec.name, &vm.name));
        let i = st.intend(Resource::Dir { path: dir.clone() })?;
        std::fs::create_dir_all(&dir).map_err(|e| LabError::io("create", &dir, e))?;
        st.created(i, None)?;
        let mut vs = VmState {
            name: vm.name.clone(),
            dir: dir.clone(),
            qmp: dir.join("qmp.sock"),
            agent_socket: vm.agent.then(|| match &domain {
                Some(d) => crate::libvirt::agent_socket(d),
                None => dir.join("agent.sock"),
            }),
            console_socket: dir.join("console.sock"),
            console_log: dir.join("console.log"),
            vcpus: vm.vcpus,
            memory_mib: vm.memory_mib,
            pin_vcpus: vm.pin_vcpus.clone(),
            pin_emulator: vm.pin_emulator.clone(),
            pin_io: vm.pin_io.clone(),
            kernel: self.boot.kernel.clone(),
            ..Default::default()
        };
        let pidfile = dir.join("qemu.pid");
        let mut q = QemuArgs::new(self.qemu_bin);
        q.machine(&vm.name, self.accel, vm.vcpus, u64::from(vm.memory_mib))
            .control(&pidfile, &vs.qmp)
            .console_socket(&vs.console_socket, &vs.console_log);
        if let (Some(sock), None) = (&vs.agent_socket, &domain) {
            q.agent(sock);
        }
        if domain.is_none() {
            // libvirt gives its domains their own.
            q.uuid(&crate::qemu_args::lab_uuid(&st.name, &vm.name));
        }
        q.iothreads(vm.iothreads);
        let mut kcmd = KernelCmdline::new(vm);
        self.attach_nics(st, vm, &mut q, &mut kcmd, &mut vs)?;
        self.attach_disks(st, vm, &dir, &mut q, &mut kcmd, &mut vs)?;
        let initrd = self.initrd(st, vm, &dir)?;
        if !vm.kernel_args.is_empty() {
            kcmd.push(vm.kernel_args.clone());
        }
        let cmdline = kcmd.0.join(" ");
        q.boot(&self.boot.kernel, initrd.as_deref(), &cmdline);
        vs.initrd = initrd;
        vs.cmdline = cmdline;
        vs.qemu_argv = q.argv();
        if let Some(d) = domain {
            return crate::libvirt::launch(self, st, vm, vs, &d).map(|()| None);
        }
        self.launch(st, vi, vm, vs, &pidfile).map(Some)
    }

    /// Taps on the bridge (or user networking), one virtio-net NIC each,
    /// and the guest's address on the kernel command line.
    fn attach_nics(
        &mut self,
        st: &mut LabState,
        vm: &VmSpec,
        q: &mut QemuArgs,
        kcmd: &mut KernelCmdline,
        vs: &mut VmState,
    ) -> Result<()> {
        let spec = self.spec;
        let mut has_user = false;
        for (j, nic) in vm.nics.iter().enumerate() {
            let id = format!("net{j}");
            let guest_if = format!("eth{j}");
            match nic.kind {
                NicKind::User => {
                    has_user = true;
                    q.netdev_user(&id);
                    kcmd.push(format!("vmscope_net{j}=user"));
                    vs.nics.push(NicState {
                        kind: "user".into(),
                        tap: None,
                        guest_ip: Some("10.0.2.15".into()),
                        guest_if,
                        vhost: false,
                    });
                }
                NicKind::Tap => {
                    let tap = names::tap(&spec.name, self.taps);
                    self.taps += 1;
                    let (ti, ()) = st.make(Resource::Tap { name: tap.clone() }, || {
                        ip(
                            &["tuntap", "add", "dev", &tap, "mode", "tap"],
                            &format!("VM {}: creating tap {tap}", vm.name),
                        )
                    })?;
                    let bridge = self.bridge;
                    ip(
                        &["link", "set", &tap, "master", bridge],
                        &format!("VM {}: adding tap {tap} to {bridge}", vm.name),
                    )?;
                    ip(
                        &["link", "set", &tap, "up"],
                        &format!("VM {}: bringing up tap {tap}", vm.name),
                    )?;
                    st.created(ti, None)?;
                    let vhost = nic.vhost && self.facts.vhost_net;
                    q.netdev_tap(&id, &tap, vhost);
                    let ip_addr = nic.ip.map(|i| i.to_string()).unwrap_or_default();
                    kcmd.push(format!("vmscope_net{j}={ip_addr}/{}", spec.subnet.prefix));
                    vs.nics.push(NicState {
                        kind: "tap".into(),
                        tap: Some(tap),
                        guest_ip: Some(ip_addr),
                        guest_if,
                        vhost,
                    });
                }
            }
            q.nic(&id, &mac(&spec.name, &vm.name, j));
        }
        if !has_user && vm.nics.iter().any(|n| n.kind == NicKind::Tap) {
            kcmd.push(format!("vmscope_gw={}", spec.subnet.host(1)));
        }
        Ok(())
    }

    /// Every disk: its host backing (made here when the spec names none),
    /// its `-drive`, and the guest device it becomes (`/dev/vda`, ...).
    fn attach_disks(
        &self,
        st: &mut LabState,
        vm: &VmSpec,
        dir: &Path,
        q: &mut QemuArgs,
        kcmd: &mut KernelCmdline,
        vs: &mut VmState,
    ) -> Result<()> {
        let mut letter = b'a';
        for (j, d) in vm.disks.iter().enumerate() {
            let mut ds = DiskState {
                backend: format!("{:?}", d.backend).to_lowercase(),
                format: d.format.as_str().into(),
                path: None,
                cache: d.cache.clone(),
                aio: d.aio.clone(),
                iothread: d.iothread.map(|n| format!("iothread{n}")),
                guest_device: None,
                skipped: None,
                max_bytes_per_s: d.max_bytes_per_s,
            };
            let path = match self.disk_backing(st, vm, j, d, dir)? {
                Ok(p) => p,
                Err(why) => {
                    st.notes
                        .push(format!("VM {}: disk {j} (lvm) skipped: {why}", vm.name));
                    self.opts.say(
                        &self.spec.name,
                        &format!("VM {}: disk {j} (lvm) skipped: {why}", vm.name),
                    );
                    ds.skipped = Some(why);
                    vs.disks.push(ds);
                    continue;
                }
            };
            let format = if d.backend == DiskBackend::File {
                d.format.as_str()
            } else {
                "raw"
            };
            q.drive(&DriveArgs {
                index: j,
                path: &path,
                format,
                cache: &d.cache,
                aio: &d.aio,
                max_bytes_per_s: d.max_bytes_per_s,
                iothread: d.iothread,
            });
            let gdev = format!("/dev/vd{}", letter as char);
            letter += 1;
            if d.root {
                kcmd.push(format!("vmscope_root={gdev}"));
                if self.boot.initrd.is_none() {
                    kcmd.push(format!("root={gdev}"));
                    kcmd.push("rw");
                }
            }
            ds.path = Some(path);
            ds.guest_device = Some(gdev);
            vs.disks.push(ds);
        }
        Ok(())
    }

    /// The host path behind disk `j`, or why an optional disk is skipped.
    fn disk_backing(
        &self,
        st: &mut LabState,
        vm: &VmSpec,
        j: usize,
        d: &DiskSpec,
        dir: &Path,
    ) -> Result<std::result::Result<PathBuf, String>> {
        if let Some(p) = &d.path {
            if d.backend != DiskBackend::Lvm {
                return Ok(Ok(p.clone()));
            }
        }
        match d.backend {
            DiskBackend::File => {
                let p = dir.join(format!("disk{j}.{}", d.format.as_str()));
                let fi = st.intend(Resource::File { path: p.clone() })?;
                let qemu_img = util::require_tool("qemu-img", "qemu-utils")?;
                util::run(
                    &format!("VM {}: creating disk {j}", vm.name),
                    Command::new(qemu_img)
                        .args(["create", "-q", "-f", d.format.as_str()])
                        .arg(&p)
                        .arg(format!("{}M", d.size_mib)),
                )?;
                st.created(fi, None)?;
                Ok(Ok(p))
            }
            DiskBackend::Block => {
                let backing = dir.join(format!("disk{j}.blk"));
                let fi = st.intend(Resource::File {
                    path: backing.clone(),
                })?;
                let f = std::fs::File::create(&backing)
                    .map_err(|e| LabError::io("create", &backing, e))?;
                f.set_len(d.size_mib << 20)
                    .map_err(|e| LabError::io("size", &backing, e))?;
                drop(f);
                st.created(fi, None)?;
                let li = st.intend(Resource::LoopDevice {
                    device: None,
                    backing: backing.clone(),
                })?;
                let losetup = util::require_tool("losetup", "mount")?;
                let out = util::run(
                    &format!("VM {}: attaching a loop device for disk {j}", vm.name),
                    Command::new(losetup).args(["-f", "--show"]).arg(&backing),
                )?;
                let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
                st.created(
                    li,
                    Some(Resource::LoopDevice {
                        device: Some(dev.clone()),
                        backing,
                    }),
                )?;
                Ok(Ok(PathBuf::from(dev)))
            }
            DiskBackend::Lvm => {
                if !self.facts.device_mapper {
                    return Ok(Err(
                        "LVM needs device-mapper, which this kernel lacks".to_string()
                    ));
                }
                let vg = d.vg.clone().unwrap_or_default();
                let lv = names::lv(&self.spec.name, &vm.name, j);
                let lvcreate = util::require_tool("lvcreate", "lvm2")?;
                let r = st.make(
                    Resource::LogicalVolume {
                        vg: vg.clone(),
                        lv: lv.clone(),
                    },
                    || {
                        util::run(
                            &format!("VM {}: creating LV {vg}/{lv}", vm.name),
                            Command::new(lvcreate).args([
                                "-y",
                                "-L",
                                &format!("{}M", d.size_mib),
                                "-n",
                                &lv,
                                &vg,
                            ]),
                        )
                    },
                );
                match r {
                    Ok((li, _)) => {
                        st.created(li, None)?;
                        Ok(Ok(Path::new("/dev").join(&vg).join(&lv)))
                    }
                    Err(e) if d.optional => Ok(Err(e.to_string())),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// The VM's initrd: the lab's, with the VM's extra files appended as a
    /// second cpio archive when it has any.
    fn initrd(&self, st: &mut LabState, vm: &VmSpec, dir: &Path) -> Result<Option<PathBuf>> {
        let Some(base) = &self.boot.initrd else {
            return Ok(None);
        };
        if vm.files.is_empty() {
            return Ok(Some(base.clone()));
        }
        let p = dir.join("initrd.cpio");
        let fi = st.intend(Resource::File { path: p.clone() })?;
        let mut data = std::fs::read(base).map_err(|e| LabError::io("read initrd", base, e))?;
        while data.len() % 4 != 0 {
            data.push(0);
        }
        data.extend(image::overlay(&vm.files)?);
        std::fs::write(&p, data).map_err(|e| LabError::io("write", &p, e))?;
        st.created(fi, None)?;
        Ok(Some(p))
    }

    /// Record the QEMU process, start it detached and wait for its QMP
    /// socket.
    fn launch(
        &self,
        st: &mut LabState,
        vi: usize,
        vm: &VmSpec,
        vs: VmState,
        pidfile: &Path,
    ) -> Result<Qmp> {
        let dir = vs.dir.clone();
        let argv = vs.qemu_argv.clone();
        let pi = st.intend(Resource::Process {
            vm: vm.name.clone(),
            pid: None,
            pidfile: pidfile.to_path_buf(),
            marker: marker(&dir),
        })?;
        st.vms.push(vs);
        st.save()?;
        self.opts.say(
            &self.spec.name,
            &format!(
                "VM {}: starting QEMU ({}, {} vCPUs, {} MiB)",
                vm.name,
                self.accel.name(),
                vm.vcpus,
                vm.memory_mib
            ),
        );
        let log = dir.join("qemu.log");
        qemu::spawn_detached(&vm.name, &argv, &log, &vm.pin_emulator)?;
        let (q, pid) = qemu::wait_qmp(
            &vm.name,
            &dir.join("qmp.sock"),
            pidfile,
            &log,
            Duration::from_secs(15),
            &self.opts.cancel,
        )?;
        st.vms[vi].pid = Some(pid);
        st.created(
            pi,
            Some(Resource::Process {
                vm: vm.name.clone(),
                pid: Some(pid),
                pidfile: pidfile.to_path_buf(),
                marker: marker(&dir),
            }),
        )?;
        Ok(q)
    }
}

/// Run `ip ARGS`, failing with `context`.
pub(crate) fn ip(args: &[&str], context: &str) -> Result<()> {
    let bin = util::require_tool("ip", "iproute2")?;
    util::run(context, Command::new(bin).args(args)).map(|_| ())
}

/// MAC address of NIC `n` of VM `vm` in lab `lab` (locally administered, QEMU OUI).
pub(crate) fn mac(lab: &str, vm: &str, n: usize) -> String {
    let h = util::sha256_hex(format!("{lab}/{vm}/{n}").as_bytes());
    format!("52:54:00:{}:{}:{}", &h[0..2], &h[2..4], &h[4..6])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_stable_and_distinct() {
        assert_eq!(mac("a", "vm0", 0), mac("a", "vm0", 0));
        assert_ne!(mac("a", "vm0", 0), mac("a", "vm0", 1));
        assert_ne!(mac("a", "vm0", 0), mac("b", "vm0", 0));
        assert!(mac("a", "vm0", 0).starts_with("52:54:00:"));
        assert_eq!(mac("a", "vm0", 0).len(), 17);
    }
}
