//! The VM map record and import use to attribute threads to VMs: every QEMU
//! VM on this host (lab or not), found by discovery.

use vmscope_discover::{discover, thread_map, DiscoverOptions};
use vmscope_model::{Domain, Role, ThreadMap};

/// Every VM on this host as record and import need it.
pub struct VmMap {
    /// Threads of each VM, for attribution.
    pub threads: ThreadMap,
    /// VM domains with a detail line for the session.
    pub domains: Vec<(Domain, String)>,
    /// Extra session metadata (VM count, accelerators, discovery problems).
    pub meta: Vec<(String, String)>,
    /// The discovered VMs themselves.
    pub vms: Vec<vmscope_discover::Vm>,
}

/// Discover the VMs. Problems never stop a recording: they become a note.
pub fn current() -> VmMap {
    let vms = match discover(&DiscoverOptions::default()) {
        Ok(v) => v,
        Err(e) => {
            return VmMap {
                threads: ThreadMap::new(),
                domains: Vec::new(),
                meta: vec![("vm_discovery".into(), format!("failed: {e}"))],
                vms: Vec::new(),
            }
        }
    };
    let map = thread_map(&vms);
    let mut accels: Vec<String> = Vec::new();
    let domains = vms
        .iter()
        .map(|vm| {
            let accel = vm.accel.as_str().to_string();
            if !accels.contains(&accel) {
                accels.push(accel.clone());
            }
            let detail = format!(
                "{} vCPU thread(s), {} I/O thread(s), accelerator {}{}",
                vm.vcpus.len(),
                vm.io_threads.len(),
                accel,
                if accel == "tcg" {
                    " (guest code is translated: samples in QEMU's [anon] code are the guest's)"
                } else {
                    ""
                }
            );
            (
                Domain {
                    name: vm.name.clone(),
                    role: Role::Passive,
                    pid: Some(vm.pid),
                },
                detail,
            )
        })
        .collect();
    let mut meta = vec![("vms".to_string(), vms.len().to_string())];
    if !accels.is_empty() {
        meta.push(("accel".into(), accels.join(",")));
    }
    VmMap {
        threads: map,
        domains,
        meta,
        vms,
    }
}
