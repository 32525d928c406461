//! Labs whose VMs are transient libvirt domains (`manager = "libvirt"` in
//! the spec, or `vmscope lab up --libvirt`). This module owns:
//! - whether libvirt is usable here, and the one line that says how to fix
//!   it when it is not ([`check_available`]);
//! - the domain XML of a lab VM ([`domain_xml`]), built from the VM's
//!   state once the lab has made its disks, taps and boot files, with the
//!   agent channel exactly as docs/profile-vm.md's libvirt section shows a user;
//! - starting a VM as a transient domain (`virsh create`), finding its QEMU
//!   process and threads, and destroying it at teardown ([`destroy`]: a
//!   transient domain is undefined when destroyed);
//! - starting `virtlogd` and `libvirtd` where no service manager runs
//!   ([`Daemons`], used by the tests on a real libvirtd).
//!
//! Why `virsh` and not the libvirt C API: the lab drives every host tool
//! through its command line (ip, losetup, qemu-img), `virsh -c
//! qemu:///system create FILE.xml` is what a user types, and it keeps
//! libvirt an optional run-time dependency (no link against libvirt.so for
//! hosts that never use it).

use crate::error::{LabError, Result};
use crate::qemu::VmThreads;
use crate::qemu_args::Accelerator;
use crate::spec::VmSpec;
use crate::start::Starter;
use crate::state::{self, LabState, LibvirtDomainState, Removal, Resource, VmState};
use crate::util;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use vmscope_linux::ProcRoot;

/// The connection lab domains are made on.
pub const SYSTEM_URI: &str = "qemu:///system";

/// Where libvirt's QEMU driver writes each running domain's pid.
const PID_DIR: &str = "/run/libvirt/qemu";

/// Domain name of VM `vm` of lab `lab`: the lab's name first, so two labs
/// never collide.
pub fn domain_name(lab: &str, vm: &str) -> String {
    format!("{lab}-{vm}")
}

/// The agent socket libvirt binds for a domain: /run/vmscope/NAME.sock, the
/// path docs/profile-vm.md's libvirt section gives a user.
pub fn agent_socket(domain: &str) -> PathBuf {
    Path::new("/run/vmscope").join(format!("{domain}.sock"))
}

/// A string in the QEMU command line of domain `name` (libvirt starts QEMU
/// with `-name guest=NAME,debug-threads=on`).
pub fn marker(name: &str) -> String {
    format!("guest={name},")
}

/// `virsh -c URI -q ARGS`, stdin closed.
pub fn virsh(uri: &str, args: &[&str]) -> std::io::Result<Output> {
    let bin = util::which("virsh").unwrap_or_else(|| PathBuf::from("virsh"));
    Command::new(bin)
        .args(["-c", uri, "-q"])
        .args(args)
        .stdin(Stdio::null())
        .output()
}

/// Whether libvirtd answers on `uri`.
pub fn answers(uri: &str) -> bool {
    virsh(uri, &["version"]).is_ok_and(|o| o.status.success())
}

/// Fails with one line naming the fix when libvirt cannot run lab VMs:
/// not installed (the Debian package `libvirt-daemon-system`), or libvirtd
/// not answering on `uri` (start it).
pub fn check_available(uri: &str) -> Result<()> {
    for tool in ["virsh", "libvirtd"] {
        if util::which(tool).is_none() {
            return Err(LabError::MissingTool {
                tool: tool.into(),
                package: "libvirt-daemon-system".into(),
            });
        }
    }
    let out = virsh(uri, &["version"]).map_err(|e| LabError::Command {
        context: "asking libvirt for its version".into(),
        command: format!("virsh -c {uri} version"),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    // virsh says "failed to connect to the hypervisor", then the cause.
    let why = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| l.trim().trim_start_matches("error: "))
        .rfind(|l| !l.is_empty())
        .unwrap_or("no answer")
        .to_string();
    Err(LabError::Resource {
        resource: format!("libvirt ({uri})"),
        message: format!(
            "libvirtd does not answer ({why}); start it (systemctl start libvirtd, or \
             'virtlogd -d && libvirtd -d' where no service manager runs) or use manager = \"qemu\""
        ),
    })
}

/// `virtlogd` and `libvirtd` started here (by the pid each wrote), stopped
/// when dropped. For tests and scripts on hosts without a service manager.
pub struct Daemons(Vec<(String, u32)>);

impl Daemons {
    /// Start `virtlogd` and `libvirtd` (each unless its pid file names a
    /// live process) when libvirt does not answer on `uri`, and wait until
    /// it does. Starts nothing when it already answers.
    ///
    /// libvirtd sees the host's `/dev/kvm` as it is. (Bind-mounting
    /// `/dev/null` over it for TCG-only domains, as this once did for a
    /// nested KVM that crawled at every probe, made libvirtd probe QEMU's
    /// capabilities again at every domain start: `virsh create` of one
    /// domain 22 s with it, 0.3 s without, measured on 2026-12-01.)
    pub fn ensure(uri: &str) -> std::result::Result<Daemons, String> {
        let mut started = Daemons(Vec::new());
        if answers(uri) {
            return Ok(started);
        }
        for (daemon, pidfile) in [
            ("virtlogd", "/run/virtlogd.pid"),
            ("libvirtd", "/run/libvirtd.pid"),
        ] {
            let live = read_pid(Path::new(pidfile)).is_some_and(state::alive);
            if live {
                continue;
            }
            let st = Command::new(daemon)
                .arg("-d")
                .status()
                .map_err(|e| format!("cannot start {daemon}: {e}"))?;
            if !st.success() {
                return Err(format!("{daemon} -d failed: {st}"));
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            let pid = loop {
                if let Some(p) = read_pid(Path::new(pidfile)) {
                    break p;
                }
                if Instant::now() > deadline {
                    return Err(format!("{daemon} wrote no {pidfile}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            started.0.push((daemon.to_string(), pid));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers(uri) {
            if Instant::now() > deadline {
                return Err(format!("libvirtd started but does not answer on {uri}"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(started)
    }

    /// The daemons started (name, pid).
    pub fn started(&self) -> &[(String, u32)] {
        &self.0
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for (name, pid) in self.0.iter().rev() {
            // SAFETY: kill(2) on a pid this process started; no memory involved.
            unsafe {
                libc::kill(*pid as i32, libc::SIGTERM);
            }
            eprintln!("stopped {name} (pid {pid}), which was started here");
        }
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
}

/// Everything [`domain_xml`] writes, apart from the VM's state.
pub struct DomainXml<'a> {
    pub name: &'a str,
    pub accel: Accelerator<'a>,
    /// The VM as the lab's stages made it: boot files, command line, vCPUs,
    /// memory, disks (with their host paths), NICs (with their taps).
    pub vm: &'a VmState,
    /// MAC address of NIC i.
    pub macs: &'a [String],
    /// I/O threads (`iothread0` .. in the spec; libvirt numbers from 1).
    pub iothreads: u32,
}

/// Escapes text for XML attribute values and element text. Hand-written:
/// five characters, and the lab has no other XML to write.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '\'' => o.push_str("&apos;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{l}\n")).collect()
}

/// The domain XML of a lab VM: `<domain type='kvm'>` under KVM (`-cpu`
/// host as host-passthrough), `<domain type='qemu'>` under TCG; the lab's
/// kernel, initrd and command line; serial console on the VM's console
/// socket, logged; disks and NICs from the VM's state; the agent channel as
/// [`vmscope_discover::agent_channel::libvirt_xml`] gives it.
pub fn domain_xml(d: &DomainXml) -> String {
    let vm = d.vm;
    let (dtype, cpu) = match d.accel {
        Accelerator::Kvm { cpu: "host" } => ("kvm", "<cpu mode='host-passthrough'/>".to_string()),
        Accelerator::Kvm { cpu } => (
            "kvm",
            format!(
                "<cpu mode='custom' match='exact'><model>{}</model></cpu>",
                esc(cpu)
            ),
        ),
        Accelerator::Tcg => ("qemu", "<cpu mode='maximum'/>".to_string()),
    };
    let mut x = String::new();
    x.push_str(&format!("<domain type='{dtype}'>\n"));
    x.push_str(&format!("  <name>{}</name>\n", esc(d.name)));
    x.push_str(&format!(
        "  <memory unit='MiB'>{}</memory>\n",
        vm.memory_mib
    ));
    // Under TCG one vCPU still gets a second, empty slot
    // ([`Accelerator::max_vcpus`] says why).
    let max = d.accel.max_vcpus(vm.vcpus);
    if max > vm.vcpus {
        x.push_str(&format!("  <vcpu current='{}'>{max}</vcpu>\n", vm.vcpus));
    } else {
        x.push_str(&format!("  <vcpu>{}</vcpu>\n", vm.vcpus));
    }
    if d.iothreads > 0 {
        x.push_str(&format!("  <iothreads>{}</iothreads>\n", d.iothreads));
    }
    x.push_str("  <os>\n    <type arch='x86_64' machine='pc'>hvm</type>\n");
    x.push_str(&format!(
        "    <kernel>{}</kernel>\n",
        esc(&vm.kernel.display().to_string())
    ));
    if let Some(i) = &vm.initrd {
        x.push_str(&format!(
            "    <initrd>{}</initrd>\n",
            esc(&i.display().to_string())
        ));
    }
    x.push_str(&format!(
        "    <cmdline>{}</cmdline>\n  </os>\n",
        esc(&vm.cmdline)
    ));
    x.push_str("  <features><acpi/><apic/></features>\n");
    x.push_str(&format!("  {cpu}\n"));
    x.push_str(
        "  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>destroy</on_reboot>\n  <on_crash>destroy</on_crash>\n",
    );
    x.push_str("  <devices>\n");
    for ds in &vm.disks {
        let (Some(path), Some(gdev)) = (&ds.path, &ds.guest_device) else {
            continue;
        };
        let file = ds.backend == "file";
        let format = if file { ds.format.as_str() } else { "raw" };
        let iothread = ds
            .iothread
            .as_deref()
            .and_then(|t| t.strip_prefix("iothread"))
            .and_then(|n| n.parse::<u32>().ok())
            .map(|n| format!(" iothread='{}'", n + 1))
            .unwrap_or_default();
        x.push_str(&format!(
            "    <disk type='{}' device='disk'>\n",
            if file { "file" } else { "block" }
        ));
        x.push_str(&format!(
            "      <driver name='qemu' type='{format}' cache='{}' io='{}'{iothread}/>\n",
            esc(&ds.cache),
            esc(&ds.aio)
        ));
        x.push_str(&format!(
            "      <source {}='{}'/>\n",
            if file { "file" } else { "dev" },
            esc(&path.display().to_string())
        ));
        x.push_str(&format!(
            "      <target dev='{}' bus='virtio'/>\n",
            esc(gdev.trim_start_matches("/dev/"))
        ));
        if let Some(b) = ds.max_bytes_per_s {
            x.push_str(&format!(
                "      <iotune><total_bytes_sec>{b}</total_bytes_sec></iotune>\n"
            ));
        }
        x.push_str("    </disk>\n");
    }
    for (j, nic) in vm.nics.iter().enumerate() {
        let mac = d.macs.get(j).map(String::as_str).unwrap_or_default();
        if let Some(tap) = &nic.tap {
            // The lab's own tap on its bridge, handed to libvirt unmanaged.
            x.push_str("    <interface type='ethernet'>\n");
            x.push_str(&format!("      <mac address='{}'/>\n", esc(mac)));
            x.push_str(&format!(
                "      <target dev='{}' managed='no'/>\n",
                esc(tap)
            ));
            x.push_str("      <model type='virtio'/>\n");
            x.push_str(&format!(
                "      <driver name='{}'/>\n",
                if nic.vhost { "vhost" } else { "qemu" }
            ));
        } else {
            x.push_str("    <interface type='user'>\n");
            x.push_str(&format!("      <mac address='{}'/>\n", esc(mac)));
            x.push_str("      <model type='virtio'/>\n");
        }
        x.push_str("    </interface>\n");
    }
    x.push_str(&format!(
        "    <serial type='unix'>\n      <source mode='bind' path='{}'/>\n      <log file='{}' append='off'/>\n      <target port='0'/>\n    </serial>\n",
        esc(&vm.console_socket.display().to_string()),
        esc(&vm.console_log.display().to_string())
    ));
    if let Some(sock) = &vm.agent_socket {
        x.push_str(&indent(
            &vmscope_discover::agent_channel::libvirt_xml(sock),
            "    ",
        ));
    }
    x.push_str("    <controller type='usb' model='none'/>\n");
    x.push_str("    <memballoon model='none'/>\n");
    x.push_str("  </devices>\n</domain>\n");
    x
}

/// Start VM `vs` (its disks, taps and boot files made) as the transient
/// domain `domain`: write its XML into the VM's run directory, record the
/// domain and its agent socket in the state, `virsh create`, then the
/// QEMU pid libvirt wrote, the domain's UUID and QEMU's command line.
pub(crate) fn launch(
    sx: &Starter,
    st: &mut LabState,
    vm: &VmSpec,
    mut vs: VmState,
    domain: &str,
) -> Result<()> {
    let uri = SYSTEM_URI;
    if let Some(sock) = &vs.agent_socket {
        if let Some(parent) = sock.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| LabError::io("create socket directory", parent, e))?;
        }
        if sock.exists() {
            return Err(LabError::Resource {
                resource: format!("socket {}", sock.display()),
                message: format!(
                    "already exists (a domain named {domain} outside this lab, or a leftover); \
                     remove it or rename the lab"
                ),
            });
        }
        st.intend(Resource::File { path: sock.clone() })?;
    }
    let macs: Vec<String> = (0..vm.nics.len())
        .map(|j| crate::start::mac(&sx.spec.name, &vm.name, j))
        .collect();
    let xml = domain_xml(&DomainXml {
        name: domain,
        accel: sx.accel,
        vm: &vs,
        macs: &macs,
        iothreads: vm.iothreads,
    });
    let xml_path = vs.dir.join("domain.xml");
    std::fs::write(&xml_path, &xml).map_err(|e| LabError::io("write", &xml_path, e))?;
    let di = st.intend(Resource::LibvirtDomain {
        uri: uri.into(),
        name: domain.into(),
    })?;
    vs.libvirt = Some(LibvirtDomainState {
        uri: uri.into(),
        name: domain.into(),
        uuid: String::new(),
        xml: xml_path.clone(),
    });
    st.vms.push(vs);
    let vi = st.vms.len() - 1;
    st.save()?;
    sx.opts.say(
        &sx.spec.name,
        &format!(
            "VM {}: creating libvirt domain {domain} on {uri} ({}, {} vCPUs, {} MiB); \
             libvirtd probes QEMU's capabilities the first time, which can take a minute",
            vm.name,
            sx.accel.name(),
            vm.vcpus,
            vm.memory_mib
        ),
    );
    let virsh_bin = util::require_tool("virsh", "libvirt-clients")?;
    util::run_cancellable(
        &format!("VM {}: creating libvirt domain {domain}", vm.name),
        Command::new(virsh_bin)
            .args(["-c", uri, "-q", "create"])
            .arg(&xml_path),
        &sx.opts.cancel,
    )?;
    st.created(di, None)?;
    let pidfile = Path::new(PID_DIR).join(format!("{domain}.pid"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Some(p) = read_pid(&pidfile).filter(|&p| state::process_matches(p, &marker(domain)))
        {
            break p;
        }
        if Instant::now() > deadline {
            return Err(LabError::Vm {
                vm: vm.name.clone(),
                message: format!(
                    "libvirt created domain {domain} but no QEMU process of it is found ({} names none)",
                    pidfile.display()
                ),
            });
        }
        sx.opts
            .cancel
            .sleep(Duration::from_millis(50), "waiting for the domain's QEMU")?;
    };
    let uuid = virsh(uri, &["domuuid", domain])
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let v = &mut st.vms[vi];
    v.pid = Some(pid);
    v.qemu_argv = ProcRoot::system().cmdline(pid).unwrap_or_default();
    if let Some(l) = v.libvirt.as_mut() {
        l.uuid = uuid;
    }
    if let Some(sock) = v.agent_socket.clone() {
        if let Some(i) = st
            .resources
            .iter()
            .position(|r| r.resource == Resource::File { path: sock.clone() })
        {
            st.created(i, None)?;
        }
    }
    st.save()
}

/// vCPU threads (by their `CPU N/KVM|TCG` names) and I/O threads (`IO
/// iothreadN`, libvirt's 1-based ids, reported as the spec's `iothreadN-1`)
/// of a domain's QEMU: libvirtd holds the QMP monitor.
pub(crate) fn query_threads(vs: &VmState) -> Result<VmThreads> {
    let pid = vs.pid.unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let threads = ProcRoot::system().threads(pid);
        let vcpus = vmscope_discover::threads::vcpu_tids_by_name(&threads);
        if vcpus.len() == vs.vcpus as usize || Instant::now() > deadline {
            let mut iothreads: Vec<(String, u32)> = threads
                .iter()
                .filter_map(|(tid, comm)| {
                    let n: u32 = comm.strip_prefix("IO iothread")?.parse().ok()?;
                    Some((format!("iothread{}", n.checked_sub(1)?), *tid))
                })
                .collect();
            iothreads.sort();
            return Ok(VmThreads { vcpus, iothreads });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Destroy (and so undefine) transient domain `name`; its QEMU killed
/// directly when libvirtd no longer answers. Gone already is not an error.
pub fn destroy(uri: &str, name: &str) -> std::result::Result<Removal, String> {
    let live = || state::find_processes(&marker(name));
    match virsh(uri, &["destroy", name]) {
        Ok(o) if o.status.success() => return Ok(Removal::Removed),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            if err.contains("failed to get domain") || err.contains("not found") {
                return Ok(Removal::AlreadyGone);
            }
        }
        Err(_) => {}
    }
    // libvirtd is gone or refuses: its QEMU, if any, goes by signal.
    let pids = live();
    if pids.is_empty() {
        return Ok(Removal::AlreadyGone);
    }
    for p in pids {
        state::kill_process(p)?;
    }
    Ok(Removal::Removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{DiskState, NicState};

    fn vm() -> VmState {
        VmState {
            name: "vm0".into(),
            dir: "/run/l/lab/vm0".into(),
            agent_socket: Some(agent_socket("lab-vm0")),
            console_socket: "/run/l/lab/vm0/console.sock".into(),
            console_log: "/run/l/lab/vm0/console.log".into(),
            vcpus: 2,
            memory_mib: 256,
            kernel: "/c/vmlinuz".into(),
            initrd: Some("/c/initrd.cpio".into()),
            cmdline: "console=ttyS0 vmscope_name=vm0 vmscope_net0=user".into(),
            disks: vec![
                DiskState {
                    backend: "file".into(),
                    format: "qcow2".into(),
                    path: Some("/run/l/lab/vm0/disk0.qcow2".into()),
                    cache: "none".into(),
                    aio: "native".into(),
                    iothread: Some("iothread0".into()),
                    guest_device: Some("/dev/vda".into()),
                    skipped: None,
                    max_bytes_per_s: Some(1 << 20),
                },
                DiskState {
                    backend: "block".into(),
                    format: "raw".into(),
                    path: Some("/dev/loop7".into()),
                    cache: "writeback".into(),
                    aio: "threads".into(),
                    iothread: None,
                    guest_device: Some("/dev/vdb".into()),
                    skipped: None,
                    max_bytes_per_s: None,
                },
                DiskState {
                    backend: "lvm".into(),
                    format: "raw".into(),
                    path: None,
                    cache: "none".into(),
                    aio: "native".into(),
                    iothread: None,
                    guest_device: None,
                    skipped: Some("no device-mapper".into()),
                    max_bytes_per_s: None,
                },
            ],
            nics: vec![
                NicState {
                    kind: "user".into(),
                    tap: None,
                    guest_ip: Some("10.0.2.15".into()),
                    guest_if: "eth0".into(),
                    vhost: false,
                },
                NicState {
                    kind: "tap".into(),
                    tap: Some("vmst-ab-0".into()),
                    guest_ip: Some("10.77.5.2".into()),
                    guest_if: "eth1".into(),
                    vhost: true,
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn domain_xml_is_the_golden_one() {
        let v = vm();
        let macs = vec!["52:54:00:00:00:01".to_string(), "52:54:00:00:00:02".into()];
        let xml = domain_xml(&DomainXml {
            name: "lab-vm0",
            accel: Accelerator::Tcg,
            vm: &v,
            macs: &macs,
            iothreads: 1,
        });
        let want = "<domain type='qemu'>
  <name>lab-vm0</name>
  <memory unit='MiB'>256</memory>
  <vcpu>2</vcpu>
  <iothreads>1</iothreads>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>/c/vmlinuz</kernel>
    <initrd>/c/initrd.cpio</initrd>
    <cmdline>console=ttyS0 vmscope_name=vm0 vmscope_net0=user</cmdline>
  </os>
  <features><acpi/><apic/></features>
  <cpu mode='maximum'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='none' io='native' iothread='1'/>
      <source file='/run/l/lab/vm0/disk0.qcow2'/>
      <target dev='vda' bus='virtio'/>
      <iotune><total_bytes_sec>1048576</total_bytes_sec></iotune>
    </disk>
    <disk type='block' device='disk'>
      <driver name='qemu' type='raw' cache='writeback' io='threads'/>
      <source dev='/dev/loop7'/>
      <target dev='vdb' bus='virtio'/>
    </disk>
    <interface type='user'>
      <mac address='52:54:00:00:00:01'/>
      <model type='virtio'/>
    </interface>
    <interface type='ethernet'>
      <mac address='52:54:00:00:00:02'/>
      <target dev='vmst-ab-0' managed='no'/>
      <model type='virtio'/>
      <driver name='vhost'/>
    </interface>
    <serial type='unix'>
      <source mode='bind' path='/run/l/lab/vm0/console.sock'/>
      <log file='/run/l/lab/vm0/console.log' append='off'/>
      <target port='0'/>
    </serial>
    <channel type='unix'>
      <source mode='bind' path='/run/vmscope/lab-vm0.sock'/>
      <target type='virtio' name='vmscope.agent'/>
    </channel>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
";
        assert_eq!(xml, want, "{xml}");
    }

    #[test]
    fn domain_xml_under_kvm_and_escaped() {
        let mut v = vm();
        v.cmdline = "a=<b> & 'c'".into();
        v.agent_socket = None;
        let xml = domain_xml(&DomainXml {
            name: "lab-vm0",
            accel: Accelerator::Kvm { cpu: "host" },
            vm: &v,
            macs: &[],
            iothreads: 0,
        });
        assert!(xml.starts_with("<domain type='kvm'>"), "{xml}");
        assert!(xml.contains("<cpu mode='host-passthrough'/>"), "{xml}");
        assert!(
            xml.contains("<cmdline>a=&lt;b&gt; &amp; &apos;c&apos;</cmdline>"),
            "{xml}"
        );
        assert!(!xml.contains("<channel"), "{xml}");
        assert!(!xml.contains("<iothreads>"), "{xml}");
        let xml = bare_xml(Accelerator::Kvm { cpu: "Skylake" }, &v);
        assert!(xml.contains("<model>Skylake</model>"), "{xml}");
        v.vcpus = 1;
        let xml = bare_xml(Accelerator::Kvm { cpu: "host" }, &v);
        assert!(xml.contains("  <vcpu>1</vcpu>\n"), "{xml}");
    }

    /// The domain XML of `v` named `x`, without NICs or I/O threads.
    fn bare_xml(accel: Accelerator<'_>, v: &VmState) -> String {
        domain_xml(&DomainXml {
            name: "x",
            accel,
            vm: v,
            macs: &[],
            iothreads: 0,
        })
    }

    #[test]
    fn a_one_vcpu_domain_under_tcg_has_a_second_empty_slot() {
        let mut v = vm();
        v.vcpus = 1;
        let xml = bare_xml(Accelerator::Tcg, &v);
        assert!(xml.contains("  <vcpu current='1'>2</vcpu>\n"), "{xml}");
    }

    #[test]
    fn names_start_with_the_lab() {
        assert_eq!(domain_name("libvirt-lab", "vm0"), "libvirt-lab-vm0");
        assert_eq!(
            agent_socket("libvirt-lab-vm0"),
            Path::new("/run/vmscope/libvirt-lab-vm0.sock")
        );
        assert_eq!(marker("a-vm0"), "guest=a-vm0,");
    }

    #[test]
    fn unreachable_libvirt_is_one_line_naming_the_fix() {
        if util::which("virsh").is_none() || util::which("libvirtd").is_none() {
            let e = check_available(SYSTEM_URI).unwrap_err().to_string();
            assert!(e.contains("libvirt-daemon-system"), "{e}");
            return;
        }
        let e = check_available("qemu:///system?socket=/nonexistent/libvirt-sock")
            .unwrap_err()
            .to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains("libvirtd does not answer"), "{e}");
        assert!(e.contains("start it"), "{e}");
    }

    #[test]
    fn destroying_a_missing_domain_is_already_gone() {
        if util::which("virsh").is_none() {
            return;
        }
        // No libvirtd on this socket and no such QEMU: nothing to remove.
        assert_eq!(
            destroy(
                "qemu:///system?socket=/nonexistent/libvirt-sock",
                "libvirt-lab-none"
            ),
            Ok(Removal::AlreadyGone)
        );
    }
}
