//! Bringing a lab up and down: host resources (bridge, taps, disk files,
//! loop devices, LVM volumes), the accelerator probe, QEMU processes,
//! pinning, and waiting for every guest agent's hello. Every resource goes
//! through the state file (see [`crate::state`]) before it is created.

use crate::cancel::Cancel;
use crate::error::{LabError, Result};
use crate::image::{self, GuestImage, ImageOptions};
use crate::kvm_probe;
use crate::names;
use crate::qemu::{self, MAX_SOCKET_PATH};
use crate::qemu_args::Accelerator;
use crate::spec::{self, AccelChoice, DiskBackend, HostFacts, LabSpec, Manager, VmSpec};
use crate::start::{ip, Starter};
use crate::state::{self, HelloInfo, LabState, Phase, Resource, TeardownReport, VmState};
use crate::util;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
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
    pub accel: Option<AccelChoice>,
    /// Overrides the spec's `manager` (`lab up --libvirt`).
    pub manager: Option<Manager>,
    /// How long each VM may take to answer the agent hello.
    pub hello_timeout: Duration,
    /// How long the KVM probe VM may take to answer (here KVM never does).
    pub kvm_probe_timeout: Duration,
    /// QEMU `-cpu` model under KVM (default `host`; `$VMSCOPE_KVM_CPU`).
    pub kvm_cpu: String,
    /// Print progress lines to stderr.
    pub verbose: bool,
    /// Set (by a signal handler) to stop `up` half-way: it returns
    /// [`LabError::Interrupted`] after tearing down what it made.
    pub cancel: Cancel,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            cache_dir: image::default_cache_dir(),
            run_root: state::default_run_root(),
            agent: None,
            kernel_package: None,
            accel: None,
            manager: None,
            hello_timeout: Duration::from_secs(90),
            kvm_probe_timeout: Duration::from_secs(12),
            kvm_cpu: std::env::var("VMSCOPE_KVM_CPU").unwrap_or_else(|_| "host".into()),
            verbose: false,
            cancel: Cancel::new(),
        }
    }
}

impl LabOptions {
    pub(crate) fn say(&self, lab: &str, msg: &str) {
        if self.verbose {
            eprintln!("lab {lab}: {msg}");
        }
    }

    /// Run directory of lab `name`.
    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.run_root.join(name)
    }
}

/// The lab's lock (`RUN_ROOT/NAME.lock`), held by `up` and `down` while
/// they work, so two of them on one lab never run at once: the second
/// fails at once, naming the first (two `lab up` of one spec once both
/// claimed the same VM, or tore each other's lab down).
fn lock(name: &str, opts: &LabOptions) -> Result<vmscope_linux::files::PidLock> {
    std::fs::create_dir_all(&opts.run_root)
        .map_err(|e| LabError::io("create run directory", &opts.run_root, e))?;
    let path = opts.run_root.join(format!("{name}.lock"));
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    // A holder that no process owns any more (a `lab up` just killed,
    // whose forked child had not reached exec yet: CI once ran `down`
    // right after and was refused) goes within moments: up to 2 s are
    // waited for it. A named holder is said at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match vmscope_linux::files::PidLock::acquire(&path, &command) {
            Ok(l) => return Ok(l),
            Err(Ok(holder)) if holder.pid.is_none() && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(Ok(holder)) => {
                return Err(LabError::Busy {
                    lab: name.to_string(),
                    holder,
                })
            }
            Err(Err(source)) => return Err(LabError::io("lock", &path, source)),
        }
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
    let m = match &vm.libvirt {
        Some(d) => crate::libvirt::marker(&d.name),
        None => marker(&vm.dir),
    };
    vm.pid.is_some_and(|p| state::process_matches(p, &m))
}

/// The string in a VM's QEMU command line that identifies it.
pub(crate) fn marker(vm_dir: &Path) -> String {
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
    // Through the VM's broker, so a `lab exec` and a recording (and any
    // other host tool) use the agent at the same time.
    let launcher = vmscope_broker::launcher();
    let stream = vmscope_broker::connect(sock, launcher.as_deref(), timeout).map_err(|e| {
        LabError::Agent {
            vm: vm.name.clone(),
            message: format!("{e} (is the VM running?)"),
        }
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

/// Boot files of a lab: the spec's own kernel/initrd or the built image.
pub(crate) struct Boot {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub image: Option<GuestImage>,
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
    let manager = opts.manager.unwrap_or(spec.manager);
    if manager == Manager::Libvirt {
        crate::libvirt::check_available(crate::libvirt::SYSTEM_URI)?;
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

    // From here on this `up` owns the lab: a second one, or a `down`, fails
    // at once naming it (taken after the checks, which need no lock and
    // say first what is wrong, root missing among them).
    let _lock = lock(&spec.name, opts)?;
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

    let boot = if let (Some(k), Some(i)) = (&spec.kernel, &spec.initrd) {
        Boot {
            kernel: k.clone(),
            initrd: Some(i.clone()),
            image: None,
        }
    } else {
        opts.say(&spec.name, "preparing the guest image");
        let t = Instant::now();
        let img = image::build_image(&ImageOptions {
            cache_dir: opts.cache_dir.clone(),
            agent: opts.agent.clone(),
            kernel_package: opts.kernel_package.clone(),
            cancel: opts.cancel.clone(),
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
    };

    opts.cancel.check("preparing the guest image")?;
    std::fs::create_dir_all(&run_dir)
        .map_err(|e| LabError::io("create run directory", &run_dir, e))?;
    let mut st = LabState::new(&spec.name, &run_dir);
    st.manager = manager;
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
            // A signal also reaches the host commands under way (same
            // terminal); their failure is the interruption, not the cause.
            let e = match (&e, opts.cancel.requested()) {
                (LabError::Interrupted { .. }, _) | (_, None) => e,
                (_, Some(signal)) => LabError::Interrupted {
                    signal,
                    during: format!("bringing lab {} up ({e})", spec.name),
                },
            };
            opts.say(&spec.name, &format!("failed ({e}); tearing down"));
            let logs = (!matches!(e, LabError::Interrupted { .. }))
                .then(|| keep_logs(&st, &opts.run_root))
                .flatten();
            let rep = state::teardown(&mut st);
            if !rep.errors.is_empty() {
                return Err(LabError::Resource {
                    resource: format!("lab {}", spec.name),
                    message: format!("{e}; and teardown left: {}", rep.errors.join("; ")),
                });
            }
            match e {
                LabError::Interrupted { signal, during } => Err(LabError::Interrupted {
                    signal,
                    during: format!(
                        "{during}; removed everything this lab up had made ({} resources{})",
                        rep.removed.len(),
                        if rep.already_gone.is_empty() {
                            String::new()
                        } else {
                            format!(", {} already gone", rep.already_gone.len())
                        }
                    ),
                }),
                e => Err(LabError::UpFailed {
                    lab: spec.name.clone(),
                    cause: Box::new(e),
                    logs,
                }),
            }
        }
    }
}

/// Copy each VM's console and QEMU logs out of the run directory that the
/// teardown of a failed `up` removes, into `RUN_ROOT/LAB.failed/` (replaced
/// by the next failure of that lab); its path, or `None` when there was
/// nothing to keep.
fn keep_logs(st: &LabState, run_root: &Path) -> Option<PathBuf> {
    let dir = run_root.join(format!("{}.failed", st.name));
    let _ = std::fs::remove_dir_all(&dir);
    let mut kept = 0;
    for v in &st.vms {
        for (from, what) in [
            (v.console_log.clone(), "console"),
            (v.dir.join("qemu.log"), "qemu"),
        ] {
            if std::fs::metadata(&from).is_ok_and(|m| m.len() > 0)
                && std::fs::create_dir_all(&dir).is_ok()
                && std::fs::copy(&from, dir.join(format!("{}-{what}.log", v.name))).is_ok()
            {
                kept += 1;
            }
        }
    }
    (kept > 0).then_some(dir)
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
    let kvm = Accelerator::Kvm { cpu: &opts.kvm_cpu };
    let (accel, reason) = match wanted {
        AccelChoice::Tcg => (Accelerator::Tcg, "accel = \"tcg\" requested".to_string()),
        AccelChoice::Kvm | AccelChoice::Auto => {
            let (ok, why) = kvm_probe::kvm_verdict(spec, opts, st, boot, qemu_bin)?;
            match (ok, wanted) {
                (true, _) => (kvm, why),
                (false, AccelChoice::Kvm) => {
                    return Err(LabError::Resource {
                        resource: "accelerator".into(),
                        message: format!("accel = \"kvm\" requested but KVM is unusable: {why}"),
                    })
                }
                (false, _) => (Accelerator::Tcg, format!("fell back to TCG: {why}")),
            }
        }
    };
    opts.say(
        &spec.name,
        &format!("accelerator {} ({reason})", accel.name()),
    );
    st.accel = accel.name().to_string();
    st.accel_reason = reason;
    st.save()?;

    // Bridge.
    let bridge = names::bridge(&spec.name);
    if spec.needs_bridge() {
        let addr = format!("{}/{}", spec.subnet.host(1), spec.subnet.prefix);
        let (i, ()) = st.make(
            Resource::Bridge {
                name: bridge.clone(),
            },
            || {
                ip(
                    &["link", "add", "name", &bridge, "type", "bridge"],
                    &format!("creating bridge {bridge}"),
                )
            },
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
    let mut starter = Starter {
        spec,
        opts,
        boot,
        qemu_bin,
        facts,
        accel,
        bridge: &bridge,
        taps: 0,
    };
    let mut qmps = Vec::new();
    for (vi, vm) in spec.vms.iter().enumerate() {
        opts.cancel
            .check(&format!("starting VM {} of lab {}", vm.name, spec.name))?;
        qmps.push(starter.start_vm(st, vi, vm)?);
    }

    // Threads and pinning.
    for (vi, vm) in spec.vms.iter().enumerate() {
        let q: Option<_> = qmps.remove(0);
        let vs = &mut st.vms[vi];
        let threads = match q {
            Some(mut q) => qemu::query_threads(&vs.name, vs.pid.unwrap_or(0), &mut q)?,
            None => crate::libvirt::query_threads(vs)?,
        };
        vs.vcpu_tids = threads.vcpus;
        vs.iothread_tids = threads.iothreads;
        pin_vm(vm, vs)?;
    }
    st.save()?;

    // Hellos, all VMs in parallel.
    opts.say(&spec.name, "waiting for the guest agents");
    let timeout = opts.hello_timeout;
    let cancel = &opts.cancel;
    let results: Vec<(usize, Result<(AgentHello, f64)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = st
            .vms
            .iter()
            .enumerate()
            .filter(|(_, v)| v.agent_socket.is_some())
            .map(|(i, v)| {
                let v = v.clone();
                s.spawn(move || (i, wait_hello(&v, timeout, cancel)))
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    for (_, r) in &results {
        if let Err(LabError::Interrupted { signal, .. }) = r {
            return Err(LabError::Interrupted {
                signal: *signal,
                during: format!("waiting for the guest agents of lab {}", spec.name),
            });
        }
    }
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
                let tail = qemu::log_tail(&vs.console_log, 3);
                errors.push(if tail.is_empty() || e.to_string().contains("console") {
                    e.to_string()
                } else {
                    format!("{e} [console: {tail}]")
                });
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

/// Wait for a VM's agent hello; returns it with the seconds since QEMU
/// started. A cancel request ends the wait within 50 ms: each attempt runs
/// in a thread of its own, left to end by itself (QEMU's teardown closes
/// its socket).
pub(crate) fn wait_hello(
    vm: &VmState,
    timeout: Duration,
    cancel: &Cancel,
) -> Result<(AgentHello, f64)> {
    let start = Instant::now();
    let started = std::fs::metadata(&vm.qmp).and_then(|m| m.modified()).ok();
    let mut last_err = None;
    let during = format!("waiting for the agent of VM {}", vm.name);
    while start.elapsed() < timeout {
        cancel.check(&during)?;
        if !vm_running(vm) {
            return Err(LabError::Vm {
                vm: vm.name.clone(),
                message: match qemu::log_tail(&vm.console_log, 3) {
                    t if t.is_empty() => format!(
                        "QEMU exited while booting, before its console said anything ({})",
                        qemu::log_tail(&vm.dir.join("qemu.log"), 2)
                    ),
                    t => format!("QEMU exited while booting (console: {t})"),
                },
            });
        }
        let left = timeout.saturating_sub(start.elapsed());
        let (tx, rx) = std::sync::mpsc::channel();
        let v = vm.clone();
        std::thread::spawn(move || {
            let _ = tx.send(connect_agent(&v, left.min(Duration::from_secs(10))));
        });
        let attempt = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(r) => break r,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => cancel.check(&during)?,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(LabError::Agent {
                        vm: vm.name.clone(),
                        message: "the connection attempt ended without an answer".into(),
                    })
                }
            }
        };
        match attempt {
            Ok((_, h)) => {
                let secs = started
                    .and_then(|t| t.elapsed().ok())
                    .unwrap_or_else(|| start.elapsed())
                    .as_secs_f64();
                return Ok((h, secs));
            }
            Err(e) => {
                last_err = Some(e);
                cancel.sleep(Duration::from_millis(100), &during)?;
            }
        }
    }
    Err(LabError::Agent {
        vm: vm.name.clone(),
        message: format!(
            "no hello within {:.1} s although QEMU runs: the guest may still be booting \
             (raise --hello-timeout) or its agent did not start (console: {}){}",
            timeout.as_secs_f64(),
            match qemu::log_tail(&vm.console_log, 2) {
                t if t.is_empty() => "nothing yet".to_string(),
                t => t,
            },
            last_err
                .map(|e| format!("; last attempt: {e}"))
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

/// Tear lab `name` down: every recorded process, tap, bridge, loop device,
/// LV, file and the run directory. Missing resources are not errors.
pub fn down(name: &str, opts: &LabOptions) -> Result<TeardownReport> {
    let _lock = lock(name, opts)?;
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
