//! QEMU's command line for lab VMs, built in one place: every lab VM and
//! the KVM probe VM get their machine, control sockets, console, agent
//! channel, NICs, disks and boot files from [`QemuArgs`], so the two never
//! drift apart.

use std::path::Path;
use vmscope_discover::agent_channel;

/// The accelerator a VM runs under (after the KVM probe decided).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accelerator<'a> {
    /// `-accel kvm -cpu MODEL`.
    Kvm { cpu: &'a str },
    /// `-accel tcg,thread=multi -cpu max`: multi-threaded TCG.
    Tcg,
}

impl Accelerator<'_> {
    /// The name stored in the lab state (`kvm`, `tcg`).
    pub fn name(self) -> &'static str {
        match self {
            Accelerator::Kvm { .. } => "kvm",
            Accelerator::Tcg => "tcg",
        }
    }

    /// The most vCPUs the machine may have, for a VM with `vcpus`: under TCG
    /// at least 2. QEMU's TCG emits the guest's memory barriers (and real
    /// atomics) only on a machine that may have more than one vCPU
    /// (`CF_PARALLEL`, from `-smp maxcpus`). Without them a one-vCPU guest's
    /// "publish the avail index, barrier, read the event index" and QEMU's
    /// I/O thread's "publish the event index, barrier, read the avail index"
    /// can both read the old value: the guest skips the notification and
    /// QEMU waits for it. Its virtio-net transmit queue then stops for good
    /// (seen under load: QEMU's queue index frozen, the guest's running
    /// ahead, one notification written to the device by hand moved it on).
    /// The unfilled slot costs the guest one possible CPU, and TCG
    /// translates barriers it would otherwise drop. KVM runs guest barriers
    /// on the hardware: no change there.
    pub fn max_vcpus(self, vcpus: u32) -> u32 {
        match self {
            Accelerator::Kvm { .. } => vcpus,
            Accelerator::Tcg => vcpus.max(2),
        }
    }
}

/// A disk as QEMU's `-drive` and `-device virtio-blk-pci` see it.
#[derive(Debug, Clone)]
pub struct DriveArgs<'a> {
    /// Index of the disk in the VM (its drive id is `disk<index>`).
    pub index: usize,
    pub path: &'a Path,
    /// `raw` or `qcow2`.
    pub format: &'a str,
    pub cache: &'a str,
    pub aio: &'a str,
    /// QEMU's `throttling.bps-total`.
    pub max_bytes_per_s: Option<u64>,
    /// The I/O thread serving the disk (`iothread<n>`).
    pub iothread: Option<u32>,
}

/// A QEMU command line under construction.
#[derive(Debug, Clone)]
pub struct QemuArgs {
    argv: Vec<String>,
}

impl QemuArgs {
    /// Starts with the QEMU binary.
    pub fn new(qemu: &Path) -> QemuArgs {
        QemuArgs {
            argv: vec![qemu.display().to_string()],
        }
    }

    fn arg(&mut self, opt: &str, value: impl Into<String>) -> &mut Self {
        self.argv.push(opt.to_string());
        self.argv.push(value.into());
        self
    }

    fn flags(&mut self, flags: &[&str]) -> &mut Self {
        self.argv
            .extend(flags.iter().map(std::string::ToString::to_string));
        self
    }

    /// `-uuid`: the VM's SMBIOS UUID, what libvirt always gives and fleet
    /// tools tell VMs apart by.
    pub fn uuid(&mut self, uuid: &str) -> &mut Self {
        self.arg("-uuid", uuid)
    }

    /// Name (with named threads, `CPU n/TCG`), accelerator, vCPUs, memory,
    /// no default devices, no display, exit instead of rebooting.
    pub fn machine(
        &mut self,
        name: &str,
        accel: Accelerator<'_>,
        vcpus: u32,
        memory_mib: u64,
    ) -> &mut Self {
        self.arg("-name", format!("guest={name},debug-threads=on"));
        match accel {
            Accelerator::Kvm { cpu } => self.arg("-accel", "kvm").arg("-cpu", cpu),
            Accelerator::Tcg => self.arg("-accel", "tcg,thread=multi").arg("-cpu", "max"),
        };
        let max = accel.max_vcpus(vcpus);
        let smp = if max > vcpus {
            format!("{vcpus},maxcpus={max}")
        } else {
            vcpus.to_string()
        };
        self.arg("-smp", smp)
            .arg("-m", format!("{memory_mib}M"))
            .flags(&[
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-no-reboot",
            ])
    }

    /// The pid file and the QMP socket (QEMU listens).
    pub fn control(&mut self, pidfile: &Path, qmp: &Path) -> &mut Self {
        self.arg("-pidfile", pidfile.display().to_string())
            .arg("-qmp", format!("unix:{},server=on,wait=off", qmp.display()))
    }

    /// The serial console on a socket (for `lab console`), logged to `log`.
    pub fn console_socket(&mut self, socket: &Path, log: &Path) -> &mut Self {
        self.arg(
            "-chardev",
            format!(
                "socket,id=ser0,path={},server=on,wait=off,logfile={},logappend=on",
                socket.display(),
                log.display()
            ),
        )
        .arg("-serial", "chardev:ser0")
    }

    /// The serial console into a file only.
    pub fn console_file(&mut self, log: &Path) -> &mut Self {
        self.arg("-chardev", format!("file,id=ser0,path={}", log.display()))
            .arg("-serial", "chardev:ser0")
    }

    /// The agent's virtio-serial channel on `socket`.
    pub fn agent(&mut self, socket: &Path) -> &mut Self {
        self.argv.extend(agent_channel::qemu_args(socket));
        self
    }

    /// `n` I/O threads, `iothread0` ...
    pub fn iothreads(&mut self, n: u32) -> &mut Self {
        for i in 0..n {
            self.arg("-object", format!("iothread,id=iothread{i}"));
        }
        self
    }

    /// A user-mode (slirp) network backend `id`.
    pub fn netdev_user(&mut self, id: &str) -> &mut Self {
        self.arg("-netdev", format!("user,id={id}"))
    }

    /// A tap backend `id` on host interface `tap`.
    pub fn netdev_tap(&mut self, id: &str, tap: &str, vhost: bool) -> &mut Self {
        self.arg(
            "-netdev",
            format!(
                "tap,id={id},ifname={tap},script=no,downscript=no{}",
                if vhost { ",vhost=on" } else { "" }
            ),
        )
    }

    /// A virtio-net NIC on backend `netdev`.
    pub fn nic(&mut self, netdev: &str, mac: &str) -> &mut Self {
        self.arg(
            "-device",
            format!("virtio-net-pci,netdev={netdev},mac={mac}"),
        )
    }

    /// A virtio-blk disk.
    pub fn drive(&mut self, d: &DriveArgs<'_>) -> &mut Self {
        let j = d.index;
        self.arg(
            "-drive",
            format!(
                "file={},if=none,id=disk{j},format={},cache={},aio={}{}",
                d.path.display(),
                d.format,
                d.cache,
                d.aio,
                d.max_bytes_per_s
                    .map(|b| format!(",throttling.bps-total={b}"))
                    .unwrap_or_default()
            ),
        );
        let mut dev = format!("virtio-blk-pci,drive=disk{j}");
        if let Some(n) = d.iothread {
            dev.push_str(&format!(",iothread=iothread{n}"));
        }
        self.arg("-device", dev)
    }

    /// Kernel, optional initrd and the kernel command line.
    pub fn boot(&mut self, kernel: &Path, initrd: Option<&Path>, append: &str) -> &mut Self {
        self.arg("-kernel", kernel.display().to_string());
        if let Some(i) = initrd {
            self.arg("-initrd", i.display().to_string());
        }
        self.arg("-append", append)
    }

    /// The finished command line (argv\[0\] is QEMU).
    pub fn argv(&self) -> Vec<String> {
        self.argv.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_discover::cmdline::{QemuCmdline, SocketSpec};

    #[test]
    fn a_lab_vm_command_line_reads_back_through_discovery() {
        let mut q = QemuArgs::new(Path::new("/usr/bin/qemu-system-x86_64"));
        q.machine("web", Accelerator::Tcg, 2, 256)
            .control(Path::new("/r/web/qemu.pid"), Path::new("/r/web/qmp.sock"))
            .console_socket(Path::new("/r/web/console.sock"), Path::new("/r/web/c.log"))
            .agent(Path::new("/r/web/agent.sock"))
            .iothreads(1)
            .netdev_tap("net0", "vmst-x-0", false)
            .nic("net0", "52:54:00:01:02:03")
            .drive(&DriveArgs {
                index: 0,
                path: Path::new("/r/web/disk0.raw"),
                format: "raw",
                cache: "none",
                aio: "native",
                max_bytes_per_s: Some(524288),
                iothread: Some(0),
            })
            .boot(Path::new("/k"), Some(Path::new("/i")), "console=ttyS0");
        let argv = q.argv();
        let c = QemuCmdline::parse(&argv);
        assert_eq!(c.name.as_deref(), Some("web"));
        assert!(c.debug_threads);
        assert_eq!(c.accels, vec!["tcg"]);
        assert_eq!(c.monitor, Some(SocketSpec::Path("/r/web/qmp.sock".into())));
        assert_eq!(
            c.agent,
            Some(Ok(SocketSpec::Path("/r/web/agent.sock".into())))
        );
        assert_eq!(c.iothreads, vec!["iothread0"]);
        assert_eq!(c.taps[0].ifname.as_deref(), Some("vmst-x-0"));
        assert_eq!(c.disks.len(), 1);
        assert!(argv
            .iter()
            .any(|a| a.contains("throttling.bps-total=524288")));
        assert_eq!(argv.last().map(String::as_str), Some("console=ttyS0"));
    }

    #[test]
    fn a_one_vcpu_tcg_machine_may_have_two_so_tcg_keeps_its_barriers() {
        let smp = |accel, vcpus| {
            let mut q = QemuArgs::new(Path::new("qemu"));
            q.machine("p", accel, vcpus, 128);
            let argv = q.argv();
            let at = argv.iter().position(|a| a == "-smp").unwrap();
            argv[at + 1].clone()
        };
        assert_eq!(smp(Accelerator::Tcg, 1), "1,maxcpus=2");
        assert_eq!(smp(Accelerator::Tcg, 2), "2");
        assert_eq!(smp(Accelerator::Tcg, 4), "4");
        assert_eq!(smp(Accelerator::Kvm { cpu: "host" }, 1), "1");
    }

    #[test]
    fn kvm_machine_names_the_cpu_model() {
        let mut q = QemuArgs::new(Path::new("qemu"));
        q.machine("p", Accelerator::Kvm { cpu: "host" }, 1, 128);
        let argv = q.argv();
        let at = argv.iter().position(|a| a == "-cpu").unwrap();
        assert_eq!(argv[at + 1], "host");
        assert_eq!(Accelerator::Kvm { cpu: "host" }.name(), "kvm");
    }
}

/// The UUID of lab VM `vm` of lab `lab`: the same at every `lab up`,
/// different for every lab and VM name (an RFC 9562 version 8 UUID of two
/// FNV-1a hashes of the names).
pub fn lab_uuid(lab: &str, vm: &str) -> String {
    let fnv = |seed: u64| {
        let mut h = seed;
        for b in lab.bytes().chain([0]).chain(vm.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142));
    let a = (a & !0xf000) | 0x8000; // version 8
    let b = (b & !(0b11 << 62)) | (0b10 << 62); // variant 10
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod uuid_tests {
    #[test]
    fn lab_uuids_are_stable_and_apart() {
        let u = super::lab_uuid("lab", "web");
        assert_eq!(u, super::lab_uuid("lab", "web"));
        assert_ne!(u, super::lab_uuid("lab", "db"));
        assert_ne!(u, super::lab_uuid("lab2", "web"));
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "8");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
    }
}
