//! The VM map record and import use to attribute threads to VMs: every QEMU
//! VM on this host (lab or not), found by discovery.

use vmscope_discover::{discover, thread_map, DiscoverOptions};
use vmscope_model::{Domain, Role, ThreadMap};

/// (thread map, VM domains with a detail line, extra session metadata).
/// Discovery problems never stop a recording: they become a note.
pub fn current() -> (ThreadMap, Vec<(Domain, String)>, Vec<(String, String)>) {
    let (map, domains, meta, _) = current_with_vms();
    (map, domains, meta)
}

/// As [`current`], plus the discovered VMs themselves.
pub fn current_with_vms() -> (
    ThreadMap,
    Vec<(Domain, String)>,
    Vec<(String, String)>,
    Vec<vmscope_discover::Vm>,
) {
    let vms = match discover(&DiscoverOptions::default()) {
        Ok(v) => v,
        Err(e) => {
            return (
                ThreadMap::new(),
                Vec::new(),
                vec![("vm_discovery".into(), format!("failed: {e}"))],
                Vec::new(),
            )
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
    (map, domains, meta, vms)
}
