//! The KVM probe: whether KVM really runs a guest here, decided by booting
//! a one-vCPU VM under `-accel kvm` with a short hello timeout, and cached by
//! host kernel release, QEMU version and CPU model (a nested hypervisor can
//! offer `/dev/kvm` and still crawl or die on the first instructions).

use crate::error::{LabError, Result};
use crate::lab::{marker, wait_hello, Boot, LabOptions};
use crate::qemu;
use crate::qemu_args::{Accelerator, QemuArgs};
use crate::spec::LabSpec;
use crate::state::{self, LabState, Resource, VmState};
use crate::util;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{Duration, Instant};

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
    vmscope_linux::ProcRoot::system()
        .sysctl("kernel.osrelease")
        .unwrap_or_else(|_| "unknown".into())
}

/// KVM verdict for this host: cached by host kernel release and QEMU
/// version, else a probe boot with a short hello timeout.
pub(crate) fn kvm_verdict(
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
    let _lock = util::lock_file_cancellable(
        &opts.cache_dir.join("accel").join(".lock"),
        &opts.cancel,
        "waiting for another process probing KVM",
    )?;
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
    // An interrupted probe decides nothing: cache no verdict.
    opts.cancel.check("probing KVM")?;
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
    let mut q = QemuArgs::new(qemu_bin);
    q.machine("kvm-probe", Accelerator::Kvm { cpu: &opts.kvm_cpu }, 1, 128)
        .control(&dir.join("qemu.pid"), &vs.qmp)
        .console_file(&vs.console_log)
        .agent(&agent_sock)
        .boot(
            &boot.kernel,
            boot.initrd.as_deref(),
            "console=ttyS0 panic=-1 vmscope_name=kvm-probe",
        );
    let argv = q.argv();
    let pidfile = dir.join("qemu.pid");
    let pi = st.intend(Resource::Process {
        vm: "kvm-probe".into(),
        pid: None,
        pidfile: pidfile.clone(),
        marker: marker(&dir),
    })?;
    let log = dir.join("qemu.log");
    let start = Instant::now();
    qemu::spawn_detached("kvm-probe", &argv, &log, &[])?;
    let verdict = match qemu::wait_qmp(
        "kvm-probe",
        &vs.qmp,
        &pidfile,
        &log,
        Duration::from_secs(10),
        &opts.cancel,
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
            if let Ok((_, secs)) = wait_hello(&vs, left, &opts.cancel) {
                (true, format!("KVM probe: agent hello after {secs:.1} s"))
            } else {
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
