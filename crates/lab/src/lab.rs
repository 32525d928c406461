//! Bringing a lab up and down: host resources (bridge, taps, disk files,
//! loop devices, LVM volumes), the accelerator probe, QEMU processes,
//! pinning, and waiting for every guest agent's hello. Every resource goes
//! through the state file (see [`crate::state`]) before it is created.

use crate::error::{LabError, Result};
use crate::image::{self, GuestImage, ImageOptions, AGENT_PORT_NAME};
use crate::names;
use crate::qemu::{self, Qmp, MAX_SOCKET_PATH};
use crate::spec::{self, Accel, DiskBackend, HostFacts, LabSpec, NicKind, VmSpec};
use crate::state::{
    self, DiskState, HelloInfo, LabState, NicState, Phase, Resource, TeardownReport, VmState,
};
use crate::util;
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vmscope_protocol::{AgentClient, AgentHello};

/// How a lab is run: where caches and run directories live, timeouts.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Image and probe cache (default `$VMSCOPE_CACHE` or /var/cache/vmscope).
    pub cache_dir: PathBuf,
    /// Root of lab run directories (default `$VMSCOPE_RUN` or /run/vmscope/labs).
    pub run_root: PathBuf,
    /// Guest agent binary (else `$VMSCOPE_AGENT`, next to the executable, target/,
    /// the package's /usr/lib/vmscope/vmscope-agent).
    pub agent: Option<PathBuf>,
    /// Kernel package to use instead of the newest cloud kernel.
    pub kernel_package: Option<String>,
    /// Overrides the spec's `accel`.
    pub accel: Option<Accel>,
    /// How long each VM may take to answer the agent hello.
    pub hello_timeout: Duration,
    /// How long the KVM probe VM may take to answer (here KVM never does).
    pub kvm_probe_timeout: Duration,
    /// QEMU `-cpu` model under KVM (default `host`; `$VMSCOPE_KVM_CPU`).
    pub kvm_cpu: String,
    /// Print progress lines to stderr.
    pub verbose: bool,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            cache_dir: image::default_cache_dir(),
            run_root: state::default_run_root(),
            agent: None,
            kernel_package: None,
            accel: None,
            hello_timeout: Duration::from_secs(90),
            kvm_probe_timeout: Duration::from_secs(12),
            kvm_cpu: std::env::var("VMSCOPE_KVM_CPU").unwrap_or_else(|_| "host".into()),
            verbose: false,
        }
    }
}

impl LabOptions {
    fn say(&self, lab: &str, msg: &str) {
        if self.verbose {
            eprintln!("lab {lab}: {msg}");
        }
    }

    /// Run directory of lab `name`.
    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.run_root.join(name)
    }
}

/// State file path of lab `name`.
pub fn state_path(opts: &LabOptions, name: &str) -> PathBuf {
    opts.run_dir(name).join("state.json")
}

/// Load the state of lab `name` under the default run root.
pub fn load_state(name: &str) -> Result<LabState> {
    load_state_in(&state::default_run_root(), name)
}

/// Load the state of lab `name` under `run_root`.
pub fn load_state_in(run_root: &Path, name: &str) -> Result<LabState> {
    let path = run_root.join(name).join("state.json");
    if !path.is_file() {
        return Err(LabError::NoSuchLab {
            name: name.to_string(),
            path,
        });
    }
    LabState::load(&path)
}

/// Names of every lab with a state file under `run_root`, sorted.
pub fn list_labs(run_root: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(run_root)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("state.json").is_file())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Whether the VM's QEMU process is running.
pub fn vm_running(vm: &VmState) -> bool {
    vm.pid
        .is_some_and(|p| state::process_matches(p, &marker(&vm.dir)))
}

/// The string in a VM's QEMU command line that identifies it.
fn marker(vm_dir: &Path) -> String {
    format!("{}/", vm_dir.display())
}

/// Connect to a VM's guest agent and say hello.
pub fn connect_agent(
    vm: &VmState,
    timeout: Duration,
) -> Result<(AgentClient<UnixStream>, AgentHello)> {
    let sock = vm.agent_socket.as_ref().ok_or_else(|| LabError::Agent {
        vm: vm.name.clone(),
        message: "the VM has no agent channel (agent = false in the spec)".into(),
    })?;
    let stream = UnixStream::connect(sock).map_err(|e| LabError::Agent {
        vm: vm.name.clone(),
        message: format!(
            "cannot connect to {}: {e} (is the VM running?)",
            sock.display()
        ),
    })?;
    AgentClient::connect(stream, timeout).map_err(|e| LabError::Agent {
        vm: vm.name.clone(),
        message: e.to_string(),
    })
}

fn hello_info(h: &AgentHello) -> HelloInfo {
    HelloInfo {
        protocol: h.protocol,
        agent_version: h.agent_version.clone(),
        kernel: h.kernel.clone(),
        hostname: h.hostname.clone(),
        cpus: h.cpus,
        mem_bytes: h.mem_bytes,
        capabilities: h.capabilities.clone(),
    }
}

/// Cached verdict of the KVM probe.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct KvmVerdict {
    usable: bool,
    reason: String,
    host_kernel: String,
    qemu_version: String,
    checked_unix: u64,
}

fn host_kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Boot files of a lab: the spec's own kernel/initrd or the built image.
struct Boot {
    kernel: PathBuf,
    initrd: Option<PathBuf>,
    image: Option<GuestImage>,
}

/// Bring a lab up: check the spec against the host, build or reuse the
/// guest image, choose the accelerator, create bridge, taps and disks, start
/// every VM, pin threads and wait for every agent's hello. On failure the
/// lab is torn down again and the error returned.
pub fn up(spec: &LabSpec, opts: &LabOptions) -> Result<LabState> {
    let run_dir = opts.run_dir(&spec.name);
    let state_file = run_dir.join("state.json");
    let mut stale_own = Vec::new();
    if state_file.is_file() {
        let old = LabState::load(&state_file)?;
        if old.vms.iter().any(vm_running)
            || old.resources.iter().any(|r| match &r.resource {
                Resource::Process { marker, .. } => !state::find_processes(marker).is_empty(),
                _ => false,
            })
        {
            return Err(LabError::AlreadyUp {
                name: spec.name.clone(),
                path: state_file,
            });
        }
        for r in &old.resources {
            if let Resource::Bridge { name } | Resource::Tap { name } = &r.resource {
                stale_own.push(name.clone());
            }
        }
    }
    let facts = HostFacts::probe();
    spec::check_host(spec, &facts, &stale_own)?;
    let qemu_bin = qemu::qemu_binary()?;
    for vm in &spec.vms {
        let sock = run_dir.join(&vm.name).join("console.sock");
        if sock.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(LabError::Resource {
                resource: format!("socket {}", sock.display()),
                message: format!("path longer than {MAX_SOCKET_PATH} bytes; use a shorter run directory (VMSCOPE_RUN)"),
            });
        }
    }
    if spec.vms.iter().any(|v| {
        v.disks
            .iter()
            .any(|d| d.backend == DiskBackend::File && d.path.is_none())
    }) {
        util::require_tool("qemu-img", "qemu-utils")?;
    }
    if spec.vms.iter().any(|v| {
        v.disks
            .iter()
            .any(|d| d.backend == DiskBackend::Block && d.path.is_none())
    }) {
        util::require_tool("losetup", "mount")?;
    }
    if spec.needs_bridge() {
        util::require_tool("ip", "iproute2")?;
    }

    // Leftovers of a crashed earlier run of this lab go first.
    if state_file.is_file() {
        opts.say(&spec.name, "removing leftovers of an earlier run");
        let mut old = LabState::load(&state_file)?;
        let rep = state::teardown(&mut old);
        if !rep.errors.is_empty() {
            return Err(LabError::Resource {
                resource: format!("lab {}", spec.name),
                message: format!(
                    "leftovers of an earlier run could not be removed: {}",
                    rep.errors.join("; ")
                ),
            });
        }
    }

    let boot = match (&spec.kernel, &spec.initrd) {
        (Some(k), Some(i)) => Boot {
            kernel: k.clone(),
            initrd: Some(i.clone()),
            image: None,
        },
        _ => {
            opts.say(&spec.name, "preparing the guest image");
            let t = Instant::now();
            let img = image::build_image(&ImageOptions {
                cache_dir: opts.cache_dir.clone(),
                agent: opts.agent.clone(),
                kernel_package: opts.kernel_package.clone(),
            })?;
            opts.say(
                &spec.name,
                &format!(
                    "guest image {} ({}) ready in {:.1} s",
                    &img.hash[..16],
                    img.kernel_release,
                    t.elapsed().as_secs_f64()
                ),
            );
            let root_disk = spec.vms.iter().any(|v| v.disks.iter().any(|d| d.root));
            Boot {
                kernel: spec.kernel.clone().unwrap_or_else(|| img.kernel.clone()),
                initrd: if spec.kernel.is_some() && root_disk {
                    None
                } else {
                    Some(img.initrd.clone())
                },
                image: Some(img),
            }
        }
    };

    std::fs::create_dir_all(&run_dir)
        .map_err(|e| LabError::io("create run directory", &run_dir, e))?;
    let mut st = LabState::new(&spec.name, &run_dir);
    st.spec_file = spec.file.clone();
    st.image_hash = boot.image.as_ref().map(|i| i.hash.clone());
    st.kernel_release = boot.image.as_ref().map(|i| i.kernel_release.clone());
    st.save()?;

    let result = bring_up(spec, opts, &mut st, &boot, &qemu_bin, &facts);
    match result {
        Ok(()) => {
            st.phase = Phase::Up;
            st.save()?;
            Ok(st)
        }
        Err(e) => {
            st.phase = Phase::Failed;
            let _ = st.save();
            opts.say(&spec.name, &format!("failed ({e}); tearing down"));
            let rep = state::teardown(&mut st);
            if !rep.errors.is_empty() {
                return Err(LabError::Resource {
                    resource: format!("lab {}", spec.name),
                    message: format!("{e}; and teardown left: {}", rep.errors.join("; ")),
                });
            }
            Err(e)
        }
    }
}

fn bring_up(
    spec: &LabSpec,
    opts: &LabOptions,
    st: &mut LabState,
    boot: &Boot,
    qemu_bin: &Path,
    facts: &HostFacts,
) -> Result<()> {
    // Accelerator.
    let wanted = opts.accel.unwrap_or(spec.accel);
    let (accel, reason) = match wanted {
        Accel::Tcg => ("tcg".to_string(), "accel = \"tcg\" requested".to_string()),
        Accel::Kvm | Accel::Auto => {
            let (ok, why) = kvm_verdict(spec, opts, st, boot, qemu_bin)?;
            match (ok, wanted) {
                (true, _) => ("kvm".to_string(), why),
                (false, Accel::Kvm) => {
                    return Err(LabError::Resource {
                        resource: "accelerator".into(),
                        message: format!("accel = \"kvm\" requested but KVM is unusable: {why}"),
                    })
                }
                (false, _) => ("tcg".to_string(), format!("fell back to TCG: {why}")),
            }
        }
    };
    opts.say(&spec.name, &format!("accelerator {accel} ({reason})"));
    st.accel = accel.clone();
    st.accel_reason = reason;
    st.save()?;

    // Bridge.
    let bridge = names::bridge(&spec.name);
    if spec.needs_bridge() {
        let addr = format!("{}/{}", spec.subnet.host(1), spec.subnet.prefix);
        let i = st.intend(Resource::Bridge {
            name: bridge.clone(),
        })?;
        ip(
            &["link", "add", "name", &bridge, "type", "bridge"],
            &format!("creating bridge {bridge}"),
        )?;
        ip(
            &["addr", "add", &addr, "dev", &bridge],
            &format!("addressing bridge {bridge}"),
        )?;
        ip(
            &["link", "set", &bridge, "up"],
            &format!("bringing up bridge {bridge}"),
        )?;
        st.bridge = Some(bridge.clone());
        st.bridge_address = Some(addr);
        st.created(i, None)?;
    }

    // VMs.
    let mut tap_n = 0usize;
    let mut qmps = Vec::new();
    for (vi, vm) in spec.vms.iter().enumerate() {
        let (vs, q) = start_vm(
            spec, opts, st, boot, qemu_bin, facts, vi, vm, &accel, &bridge, &mut tap_n,
        )?;
        let _ = vs;
        qmps.push(q);
    }

    // Threads and pinning.
    for (vi, vm) in spec.vms.iter().enumerate() {
        let mut q = qmps.remove(0);
        let threads = qemu::query_threads(&mut q)?;
        let vs = &mut st.vms[vi];
        vs.vcpu_tids = if threads.vcpus.is_empty() {
            vs.pid.map(qemu::vcpu_tids_by_name).unwrap_or_default()
        } else {
            threads.vcpus
        };
        vs.iothread_tids = threads.iothreads;
        pin_vm(vm, vs)?;
    }
    st.save()?;

    // Hellos, all VMs in parallel.
    opts.say(&spec.name, "waiting for the guest agents");
    let timeout = opts.hello_timeout;
    let results: Vec<(usize, Result<(AgentHello, f64)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = st
            .vms
            .iter()
            .enumerate()
            .filter(|(_, v)| v.agent_socket.is_some())
            .map(|(i, v)| {
                let v = v.clone();
                s.spawn(move || (i, wait_hello(&v, timeout)))
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut failed = Vec::new();
    let mut errors = Vec::new();
    for (i, r) in results {
        let vs = &mut st.vms[i];
        match r {
            Ok((h, secs)) => {
                opts.say(
                    &spec.name,
                    &format!(
                        "VM {}: agent hello after {secs:.1} s ({})",
                        vs.name, h.kernel
                    ),
                );
                vs.hello = Some(hello_info(&h));
                vs.boot_seconds = Some(secs);
            }
            Err(e) => {
                vs.error = Some(e.to_string());
                failed.push(vs.name.clone());
                errors.push(format!(
                    "{e} [console: {}]",
                    qemu::log_tail(&vs.console_log, 3)
                ));
            }
        }
    }
    st.save()?;
    if !errors.is_empty() {
        return Err(LabError::Vm {
            vm: failed.join(", "),
            message: format!("not ready: {}", errors.join("; ")),
        });
    }
    Ok(())
}

/// Wait for a VM's agent hello; returns it with the seconds since QEMU started.
fn wait_hello(vm: &VmState, timeout: Duration) -> Result<(AgentHello, f64)> {
    let start = Instant::now();
    let started = std::fs::metadata(&vm.qmp).and_then(|m| m.modified()).ok();
    let mut last_err = None;
    while start.elapsed() < timeout {
        if !vm_running(vm) {
            return Err(LabError::Vm {
                vm: vm.name.clone(),
                message: format!(
                    "QEMU exited while booting (console: {})",
                    qemu::log_tail(&vm.console_log, 3)
                ),
            });
        }
        let left = timeout.saturating_sub(start.elapsed());
        match connect_agent(vm, left.min(Duration::from_secs(10))) {
            Ok((_, h)) => {
                let secs = started
                    .and_then(|t| t.elapsed().ok())
                    .unwrap_or_else(|| start.elapsed())
                    .as_secs_f64();
                return Ok((h, secs));
            }
            Err(e) => {
                last_err = Some(e);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Err(LabError::Agent {
        vm: vm.name.clone(),
        message: format!(
            "no hello within {timeout:?}{}",
            last_err
                .map(|e| format!(" (last: {e})"))
                .unwrap_or_default()
        ),
    })
}

fn pin_vm(vm: &VmSpec, vs: &mut VmState) -> Result<()> {
    let Some(pid) = vs.pid else { return Ok(()) };
    let mut any = false;
    let fail = |what: String, e: std::io::Error| LabError::Vm {
        vm: vm.name.clone(),
        message: format!("pinning {what}: {e}"),
    };
    if !vm.pin_vcpus.is_empty() {
        if vs.vcpu_tids.len() != vm.pin_vcpus.len() {
            return Err(LabError::Vm {
                vm: vm.name.clone(),
                message: format!(
                    "found {} vCPU threads, expected {}",
                    vs.vcpu_tids.len(),
                    vm.pin_vcpus.len()
                ),
            });
        }
        for (i, (&tid, &cpu)) in vs.vcpu_tids.iter().zip(&vm.pin_vcpus).enumerate() {
            qemu::pin(tid, &[cpu])
                .map_err(|e| fail(format!("vCPU {i} (tid {tid}) to CPU {cpu}"), e))?;
        }
        any = true;
    }
    if !vm.pin_emulator.is_empty() {
        qemu::pin(pid, &vm.pin_emulator).map_err(|e| fail(format!("emulator thread {pid}"), e))?;
        any = true;
    }
    if !vm.pin_io.is_empty() {
        for (id, tid) in &vs.iothread_tids {
            qemu::pin(*tid, &vm.pin_io)
                .map_err(|e| fail(format!("I/O thread {id} (tid {tid})"), e))?;
        }
        any = true;
    }
    vs.pinned = any;
    Ok(())
}

fn ip(args: &[&str], context: &str) -> Result<()> {
    let bin = util::require_tool("ip", "iproute2")?;
    util::run(context, Command::new(bin).args(args)).map(|_| ())
}

/// MAC address of NIC `n` of VM `vm` in lab `lab` (locally administered, QEMU OUI).
fn mac(lab: &str, vm: &str, n: usize) -> String {
    let h = util::sha256_hex(format!("{lab}/{vm}/{n}").as_bytes());
    format!("52:54:00:{}:{}:{}", &h[0..2], &h[2..4], &h[4..6])
}

#[allow(clippy::too_many_arguments)]
fn start_vm(
    spec: &LabSpec,
    opts: &LabOptions,
    st: &mut LabState,
    boot: &Boot,
    qemu_bin: &Path,
    facts: &HostFacts,
    vi: usize,
    vm: &VmSpec,
    accel: &str,
    bridge: &str,
    tap_n: &mut usize,
) -> Result<(usize, Qmp)> {
    let dir = st.run_dir.join(&vm.name);
    let i = st.intend(Resource::Dir { path: dir.clone() })?;
    std::fs::create_dir_all(&dir).map_err(|e| LabError::io("create", &dir, e))?;
    st.created(i, None)?;
    let mut vs = VmState {
        name: vm.name.clone(),
        dir: dir.clone(),
        qmp: dir.join("qmp.sock"),
        agent_socket: vm.agent.then(|| dir.join("agent.sock")),
        console_socket: dir.join("console.sock"),
        console_log: dir.join("console.log"),
        vcpus: vm.vcpus,
        memory_mib: vm.memory_mib,
        pin_vcpus: vm.pin_vcpus.clone(),
        pin_emulator: vm.pin_emulator.clone(),
        pin_io: vm.pin_io.clone(),
        kernel: boot.kernel.clone(),
        ..Default::default()
    };

    let mut argv: Vec<String> = vec![qemu_bin.display().to_string()];
    let mut a = |s: &[&str]| argv.extend(s.iter().map(|x| x.to_string()));
    a(&["-name", &format!("guest={},debug-threads=on", vm.name)]);
    if accel == "kvm" {
        a(&["-accel", "kvm", "-cpu", &opts.kvm_cpu]);
    } else {
        a(&["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    a(&[
        "-smp",
        &vm.vcpus.to_string(),
        "-m",
        &format!("{}M", vm.memory_mib),
    ]);
    a(&[
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    a(&["-pidfile", &dir.join("qemu.pid").display().to_string()]);
    a(&[
        "-qmp",
        &format!("unix:{},server=on,wait=off", vs.qmp.display()),
    ]);
    a(&[
        "-chardev",
        &format!(
            "socket,id=ser0,path={},server=on,wait=off,logfile={},logappend=on",
            vs.console_socket.display(),
            vs.console_log.display()
        ),
        "-serial",
        "chardev:ser0",
    ]);
    if let Some(sock) = &vs.agent_socket {
        a(&[
            "-device",
            "virtio-serial-pci,id=vser0",
            "-chardev",
            &format!(
                "socket,id=agent0,path={},server=on,wait=off",
                sock.display()
            ),
            "-device",
            &format!("virtserialport,bus=vser0.0,chardev=agent0,name={AGENT_PORT_NAME}"),
        ]);
    }
    for n in 0..vm.iothreads {
        a(&["-object", &format!("iothread,id=iothread{n}")]);
    }

    // Kernel command line.
    let mut cmdline = vec![
        "console=ttyS0".to_string(),
        "panic=-1".to_string(),
        "quiet".to_string(),
        format!("vmscope_name={}", vm.name),
    ];
    if !vm.agent {
        cmdline.push("vmscope_agent=0".into());
    }

    // NICs.
    let mut has_user = false;
    for (j, nic) in vm.nics.iter().enumerate() {
        let id = format!("net{j}");
        let guest_if = format!("eth{j}");
        match nic.kind {
            NicKind::User => {
                has_user = true;
                a(&["-netdev", &format!("user,id={id}")]);
                cmdline.push(format!("vmscope_net{j}=user"));
                vs.nics.push(NicState {
                    kind: "user".into(),
                    tap: None,
                    guest_ip: Some("10.0.2.15".into()),
                    guest_if,
                    vhost: false,
                });
            }
            NicKind::Tap => {
                let tap = names::tap(&spec.name, *tap_n);
                *tap_n += 1;
                let ti = st.intend(Resource::Tap { name: tap.clone() })?;
                ip(
                    &["tuntap", "add", "dev", &tap, "mode", "tap"],
                    &format!("VM {}: creating tap {tap}", vm.name),
                )?;
                ip(
                    &["link", "set", &tap, "master", bridge],
                    &format!("VM {}: adding tap {tap} to {bridge}", vm.name),
                )?;
                ip(
                    &["link", "set", &tap, "up"],
                    &format!("VM {}: bringing up tap {tap}", vm.name),
                )?;
                st.created(ti, None)?;
                let vhost = nic.vhost && facts.vhost_net;
                a(&[
                    "-netdev",
                    &format!(
                        "tap,id={id},ifname={tap},script=no,downscript=no{}",
                        if vhost { ",vhost=on" } else { "" }
                    ),
                ]);
                let ip_addr = nic.ip.map(|i| i.to_string()).unwrap_or_default();
                cmdline.push(format!("vmscope_net{j}={ip_addr}/{}", spec.subnet.prefix));
                vs.nics.push(NicState {
                    kind: "tap".into(),
                    tap: Some(tap),
                    guest_ip: Some(ip_addr),
                    guest_if,
                    vhost,
                });
            }
        }
        a(&[
            "-device",
            &format!(
                "virtio-net-pci,netdev={id},mac={}",
                mac(&spec.name, &vm.name, j)
            ),
        ]);
    }
    if !has_user && vm.nics.iter().any(|n| n.kind == NicKind::Tap) {
        cmdline.push(format!("vmscope_gw={}", spec.subnet.host(1)));
    }

    // Disks.
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
        let path: PathBuf = match d.backend {
            DiskBackend::File => match &d.path {
                Some(p) => p.clone(),
                None => {
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
                    p
                }
            },
            DiskBackend::Block => match &d.path {
                Some(p) => p.clone(),
                None => {
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
                    PathBuf::from(dev)
                }
            },
            DiskBackend::Lvm => {
                if !facts.device_mapper {
                    let why = "LVM needs device-mapper, which this kernel lacks".to_string();
                    st.notes
                        .push(format!("VM {}: disk {j} (lvm) skipped: {why}", vm.name));
                    opts.say(
                        &spec.name,
                        &format!("VM {}: disk {j} (lvm) skipped: {why}", vm.name),
                    );
                    ds.skipped = Some(why);
                    vs.disks.push(ds);
                    continue;
                }
                let vg = d.vg.clone().unwrap_or_default();
                let lv = names::lv(&spec.name, &vm.name, j);
                let li = st.intend(Resource::LogicalVolume {
                    vg: vg.clone(),
                    lv: lv.clone(),
                })?;
                let lvcreate = util::require_tool("lvcreate", "lvm2")?;
                let r = util::run(
                    &format!("VM {}: creating LV {vg}/{lv}", vm.name),
                    Command::new(lvcreate).args([
                        "-y",
                        "-L",
                        &format!("{}M", d.size_mib),
                        "-n",
                        &lv,
                        &vg,
                    ]),
                );
                if let Err(e) = r {
                    if d.optional {
                        st.notes
                            .push(format!("VM {}: disk {j} (lvm) skipped: {e}", vm.name));
                        ds.skipped = Some(e.to_string());
                        vs.disks.push(ds);
                        continue;
                    }
                    return Err(e);
                }
                st.created(li, None)?;
                Path::new("/dev").join(&vg).join(&lv)
            }
        };
        let fmt = if d.backend == DiskBackend::File {
            d.format.as_str()
        } else {
            "raw"
        };
        a(&[
            "-drive",
            &format!(
                "file={},if=none,id=disk{j},format={fmt},cache={},aio={}{}",
                path.display(),
                d.cache,
                d.aio,
                d.max_bytes_per_s
                    .map(|b| format!(",throttling.bps-total={b}"))
                    .unwrap_or_default()
            ),
        ]);
        let mut dev = format!("virtio-blk-pci,drive=disk{j}");
        if let Some(n) = d.iothread {
            dev.push_str(&format!(",iothread=iothread{n}"));
        }
        a(&["-device", &dev]);
        let gdev = format!("/dev/vd{}", letter as char);
        letter += 1;
        if d.root {
            cmdline.push(format!("vmscope_root={gdev}"));
            if boot.initrd.is_none() {
                cmdline.push(format!("root={gdev}"));
                cmdline.push("rw".into());
            }
        }
        ds.path = Some(path);
        ds.guest_device = Some(gdev);
        vs.disks.push(ds);
    }

    // Boot files, with the extra files appended as a second cpio archive.
    let initrd = match (&boot.initrd, vm.files.is_empty()) {
        (None, _) => None,
        (Some(i), true) => Some(i.clone()),
        (Some(i), false) => {
            let p = dir.join("initrd.cpio");
            let fi = st.intend(Resource::File { path: p.clone() })?;
            let mut data = std::fs::read(i).map_err(|e| LabError::io("read initrd", i, e))?;
            while data.len() % 4 != 0 {
                data.push(0);
            }
            data.extend(image::overlay(&vm.files)?);
            std::fs::write(&p, data).map_err(|e| LabError::io("write", &p, e))?;
            st.created(fi, None)?;
            Some(p)
        }
    };
    if !vm.kernel_args.is_empty() {
        cmdline.push(vm.kernel_args.clone());
    }
    let cmdline = cmdline.join(" ");
    a(&["-kernel", &boot.kernel.display().to_string()]);
    if let Some(i) = &initrd {
        a(&["-initrd", &i.display().to_string()]);
    }
    a(&["-append", &cmdline]);
    vs.initrd = initrd;
    vs.cmdline = cmdline;
    vs.qemu_argv = argv.clone();

    // Start QEMU.
    let pidfile = dir.join("qemu.pid");
    let pi = st.intend(Resource::Process {
        vm: vm.name.clone(),
        pid: None,
        pidfile: pidfile.clone(),
        marker: marker(&dir),
    })?;
    st.vms.push(vs);
    st.save()?;
    opts.say(
        &spec.name,
        &format!(
            "VM {}: starting QEMU ({accel}, {} vCPUs, {} MiB)",
            vm.name, vm.vcpus, vm.memory_mib
        ),
    );
    let log = dir.join("qemu.log");
    qemu::spawn_detached(&vm.name, &argv, &log)?;
    let (q, pid) = qemu::wait_qmp(
        &vm.name,
        &dir.join("qmp.sock"),
        &pidfile,
        &log,
        Duration::from_secs(15),
    )?;
    st.vms[vi].pid = Some(pid);
    st.created(
        pi,
        Some(Resource::Process {
            vm: vm.name.clone(),
            pid: Some(pid),
            pidfile,
            marker: marker(&dir),
        }),
    )?;
    Ok((vi, q))
}

/// KVM verdict for this host: cached by host kernel release and QEMU
/// version, else a probe boot with a short hello timeout.
fn kvm_verdict(
    spec: &LabSpec,
    opts: &LabOptions,
    st: &mut LabState,
    boot: &Boot,
    qemu_bin: &Path,
) -> Result<(bool, String)> {
    if !Path::new("/dev/kvm").exists() {
        return Ok((false, "no /dev/kvm on this host".into()));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return Ok((false, format!("cannot open /dev/kvm: {e}")));
    }
    let host_kernel = host_kernel_release();
    let qemu_version = qemu::qemu_version(qemu_bin);
    let key = format!(
        "kvm-{host_kernel}-qemu-{qemu_version}-cpu-{}.json",
        opts.kvm_cpu
    )
    .replace('/', "_");
    let cache = opts.cache_dir.join("accel").join(key);
    if let Ok(text) = std::fs::read_to_string(&cache) {
        if let Ok(v) = serde_json::from_str::<KvmVerdict>(&text) {
            return Ok((
                v.usable,
                format!("{} (KVM probe cached in {})", v.reason, cache.display()),
            ));
        }
    }
    let _lock = util::lock_file(&opts.cache_dir.join("accel").join(".lock"))?;
    if let Ok(text) = std::fs::read_to_string(&cache) {
        if let Ok(v) = serde_json::from_str::<KvmVerdict>(&text) {
            return Ok((
                v.usable,
                format!("{} (KVM probe cached in {})", v.reason, cache.display()),
            ));
        }
    }
    opts.say(
        &spec.name,
        &format!(
            "probing KVM (boot with a {:?} hello timeout)",
            opts.kvm_probe_timeout
        ),
    );
    let (usable, reason) = probe_kvm(spec, opts, st, boot, qemu_bin)?;
    let verdict = KvmVerdict {
        usable,
        reason: reason.clone(),
        host_kernel,
        qemu_version,
        checked_unix: st.created_unix,
    };
    if let Ok(json) = serde_json::to_vec_pretty(&verdict) {
        let _ = util::write_atomic(&cache, &json);
    }
    Ok((usable, reason))
}

fn probe_kvm(
    spec: &LabSpec,
    opts: &LabOptions,
    st: &mut LabState,
    boot: &Boot,
    qemu_bin: &Path,
) -> Result<(bool, String)> {
    let dir = st.run_dir.join("kvm-probe");
    let di = st.intend(Resource::Dir { path: dir.clone() })?;
    std::fs::create_dir_all(&dir).map_err(|e| LabError::io("create", &dir, e))?;
    st.created(di, None)?;
    let agent_sock = dir.join("agent.sock");
    let vs = VmState {
        name: "kvm-probe".into(),
        dir: dir.clone(),
        qmp: dir.join("qmp.sock"),
        agent_socket: Some(agent_sock.clone()),
        console_socket: dir.join("console.sock"),
        console_log: dir.join("console.log"),
        ..Default::default()
    };
    let mut argv: Vec<String> = vec![qemu_bin.display().to_string()];
    for s in [
        "-name",
        "guest=kvm-probe,debug-threads=on",
        "-accel",
        "kvm",
        "-cpu",
        &opts.kvm_cpu,
        "-smp",
        "1",
        "-m",
        "128M",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ] {
        argv.push(s.into());
    }
    argv.extend([
        "-pidfile".into(),
        dir.join("qemu.pid").display().to_string(),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", vs.qmp.display()),
        "-chardev".into(),
        format!("file,id=ser0,path={}", vs.console_log.display()),
        "-serial".into(),
        "chardev:ser0".into(),
        "-device".into(),
        "virtio-serial-pci,id=vser0".into(),
        "-chardev".into(),
        format!(
            "socket,id=agent0,path={},server=on,wait=off",
            agent_sock.display()
        ),
        "-device".into(),
        format!("virtserialport,bus=vser0.0,chardev=agent0,name={AGENT_PORT_NAME}"),
        "-kernel".into(),
        boot.kernel.display().to_string(),
    ]);
    if let Some(i) = &boot.initrd {
        argv.extend(["-initrd".into(), i.display().to_string()]);
    }
    argv.extend([
        "-append".into(),
        "console=ttyS0 panic=-1 vmscope_name=kvm-probe".into(),
    ]);
    let pidfile = dir.join("qemu.pid");
    let pi = st.intend(Resource::Process {
        vm: "kvm-probe".into(),
        pid: None,
        pidfile: pidfile.clone(),
        marker: marker(&dir),
    })?;
    let log = dir.join("qemu.log");
    let start = Instant::now();
    qemu::spawn_detached("kvm-probe", &argv, &log)?;
    let verdict = match qemu::wait_qmp(
        "kvm-probe",
        &vs.qmp,
        &pidfile,
        &log,
        Duration::from_secs(10),
    ) {
        Err(e) => (false, format!("KVM probe VM did not start: {e}")),
        Ok((_q, pid)) => {
            let mut vs = vs.clone();
            vs.pid = Some(pid);
            st.created(
                pi,
                Some(Resource::Process {
                    vm: "kvm-probe".into(),
                    pid: Some(pid),
                    pidfile: pidfile.clone(),
                    marker: marker(&dir),
                }),
            )?;
            let left = opts.kvm_probe_timeout.saturating_sub(start.elapsed());
            match wait_hello(&vs, left) {
                Ok((_, secs)) => (true, format!("KVM probe: agent hello after {secs:.1} s")),
                Err(_) => {
                    let qlog = qemu::log_tail(&log, 2);
                    let console = qemu::log_tail(&vs.console_log, 1);
                    let mut why = format!(
                        "KVM probe: no agent hello within {:.0} s under -accel kvm -cpu {}",
                        opts.kvm_probe_timeout.as_secs_f64(),
                        opts.kvm_cpu
                    );
                    if console.is_empty() {
                        why.push_str("; no console output (the guest crawls under this KVM, e.g. a nested PVM hypervisor)");
                    } else {
                        why.push_str(&format!("; last console line: {console}"));
                    }
                    if !qlog.is_empty() {
                        why.push_str(&format!("; qemu: {qlog}"));
                    }
                    (false, why)
                }
            }
        }
    };
    // Remove the probe VM now; its records stay harmless if this fails.
    let gone = state::remove(&st.resources[pi].resource.clone()).is_ok();
    if gone && std::fs::remove_dir_all(&dir).is_ok() {
        st.resources.truncate(di);
    }
    st.save()?;
    opts.say(
        &spec.name,
        &format!("{} ({:.1} s)", verdict.1, start.elapsed().as_secs_f64()),
    );
    Ok(verdict)
}

/// Tear lab `name` down: every recorded process, tap, bridge, loop device,
/// LV, file and the run directory. Missing resources are not errors.
pub fn down(name: &str, opts: &LabOptions) -> Result<TeardownReport> {
    let path = state_path(opts, name);
    if !path.is_file() {
        return Err(LabError::NoSuchLab {
            name: name.to_string(),
            path,
        });
    }
    let mut st = LabState::load(&path)?;
    // The processes of VMs whose pid was never recorded are still found by marker.
    let rep = state::teardown(&mut st);
    if !rep.errors.is_empty() {
        return Err(LabError::Resource {
            resource: format!("lab {name}"),
            message: format!(
                "teardown incomplete (state kept at {}): {}",
                path.display(),
                rep.errors.join("; ")
            ),
        });
    }
    Ok(rep)
}

/// A VM by name across every lab (or in `lab`), with its lab's state.
pub fn find_vm(opts: &LabOptions, lab: Option<&str>, vm: &str) -> Result<(LabState, VmState)> {
    let labs = match lab {
        Some(l) => vec![l.to_string()],
        None => list_labs(&opts.run_root),
    };
    let mut found = Vec::new();
    for l in &labs {
        let st = load_state_in(&opts.run_root, l)?;
        if let Some(v) = st.vms.iter().find(|v| v.name == vm).cloned() {
            found.push((st, v));
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(LabError::NoSuchVm {
            vm: vm.to_string(),
            where_: match lab {
                Some(l) => format!("lab {l}"),
                None if labs.is_empty() => {
                    format!("any lab (no lab is up under {})", opts.run_root.display())
                }
                None => format!("labs {}", labs.join(", ")),
            },
        }),
        _ => Err(LabError::NoSuchVm {
            vm: vm.to_string(),
            where_: format!(
                "one lab only: it is in {}; pick one with --lab",
                found
                    .iter()
                    .map(|f| f.0.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
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

    #[test]
    fn missing_lab_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let opts = LabOptions {
            run_root: dir.path().to_path_buf(),
            ..Default::default()
        };
        let e = down("nolab", &opts).unwrap_err().to_string();
        assert!(e.contains("nolab"), "{e}");
        assert!(list_labs(dir.path()).is_empty());
        let e = find_vm(&opts, None, "vm0").unwrap_err().to_string();
        assert!(e.contains("no lab is up"), "{e}");
    }
}
