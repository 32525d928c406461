//! docs/architecture.md §4: which domain and context a sample belongs to, from its thread,
//! its CPU mode and the image its IP fell in.

use crate::process::ImageRef;
use crate::record::CpuMode;
use crate::{Context, HOST_DOMAIN};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// What a thread of a VM does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThreadRole {
    /// vCPU thread with its index.
    Vcpu(u32),
    /// I/O thread (`IO iothreadN`), worker, or QEMU main loop.
    Io,
    /// vhost worker (thread of QEMU or kernel thread `vhost-<pid>`).
    Vhost,
}

/// The VM a thread works for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadOwner {
    pub domain: Arc<str>,
    pub role: ThreadRole,
}

/// Threads and processes of every known VM. Built from VM discovery; empty on
/// a host without VMs (everything is then `host`).
#[derive(Debug, Clone, Default)]
pub struct ThreadMap {
    threads: HashMap<u32, ThreadOwner>,
    /// QEMU pid → VM name.
    processes: HashMap<u32, Arc<str>>,
    /// VM name → true when it runs under TCG (translated guest code in [anon]).
    tcg: HashMap<Arc<str>, bool>,
}

impl ThreadMap {
    pub fn new() -> ThreadMap {
        ThreadMap::default()
    }

    /// Register a VM's process.
    pub fn add_vm(&mut self, name: &str, pid: u32, tcg: bool) {
        let n: Arc<str> = name.into();
        self.processes.insert(pid, n.clone());
        self.tcg.insert(n, tcg);
    }

    /// Register a VM's process and the threads of it whose roles are known.
    pub fn add_vm_threads(
        &mut self,
        name: &str,
        pid: u32,
        tcg: bool,
        threads: impl IntoIterator<Item = (u32, ThreadRole)>,
    ) {
        self.add_vm(name, pid, tcg);
        for (tid, role) in threads {
            self.add_thread(name, tid, role);
        }
    }

    /// Register one thread of a VM (vCPU, I/O thread, vhost worker).
    pub fn add_thread(&mut self, vm: &str, tid: u32, role: ThreadRole) {
        self.threads.insert(
            tid,
            ThreadOwner {
                domain: vm.into(),
                role,
            },
        );
    }

    pub fn owner(&self, pid: u32, tid: u32) -> Option<(Arc<str>, Option<ThreadRole>)> {
        if let Some(o) = self.threads.get(&tid) {
            return Some((o.domain.clone(), Some(o.role)));
        }
        self.processes.get(&pid).map(|d| (d.clone(), None))
    }

    pub fn is_tcg(&self, vm: &str) -> bool {
        self.tcg.get(vm).copied().unwrap_or(false)
    }

    pub fn vm_names(&self) -> Vec<Arc<str>> {
        let mut v: Vec<_> = self.tcg.keys().cloned().collect();
        v.sort();
        v
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.threads.is_empty()
    }
}

/// Result of attributing one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub domain: Arc<str>,
    pub context: Context,
}

/// Attribute a sample (docs/architecture.md §4).
///
/// - guest cpumodes → guest-kernel / guest-user of the VM owning the thread
///   (a VM named `pid<PID>` when no map knows the thread);
/// - host kernel in a thread of a VM → vmm-kernel of that VM;
/// - user code in a VM's QEMU: anonymous executable memory under TCG is the
///   VM's translated guest code (context `guest`); anything else vmm-user;
/// - tid 0 → idle; everything else host-kernel / host-user.
pub fn attribute(
    map: &ThreadMap,
    pid: u32,
    tid: u32,
    mode: CpuMode,
    image: &ImageRef,
) -> Attribution {
    let host = |context| Attribution {
        domain: HOST_DOMAIN.into(),
        context,
    };
    let owner = map.owner(pid, tid);
    match mode {
        CpuMode::GuestKernel | CpuMode::GuestUser => {
            let domain = owner
                .map(|(d, _)| d)
                .unwrap_or_else(|| format!("pid{pid}").into());
            Attribution {
                domain,
                context: if mode == CpuMode::GuestKernel {
                    Context::GuestKernel
                } else {
                    Context::GuestUser
                },
            }
        }
        _ if tid == 0 && pid == 0 => host(Context::Idle),
        CpuMode::Kernel | CpuMode::Hypervisor => match owner {
            Some((d, _)) => Attribution {
                domain: d,
                context: Context::VmmKernel,
            },
            None => host(Context::HostKernel),
        },
        CpuMode::User | CpuMode::Unknown => {
            let kernel_image = matches!(image, ImageRef::Kernel);
            match owner {
                Some((d, _)) if kernel_image => Attribution {
                    domain: d,
                    context: Context::VmmKernel,
                },
                Some((d, _)) => {
                    let context = if matches!(image, ImageRef::Anon) && map.is_tcg(&d) {
                        Context::GuestTranslated
                    } else {
                        Context::VmmUser
                    };
                    Attribution { domain: d, context }
                }
                None if kernel_image => host(Context::HostKernel),
                None => host(Context::HostUser),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ThreadMap {
        let mut m = ThreadMap::new();
        m.add_vm("vm1", 100, true);
        m.add_thread("vm1", 101, ThreadRole::Vcpu(0));
        m.add_thread("vm1", 102, ThreadRole::Io);
        m.add_vm("vm2", 200, false);
        m.add_thread("vm2", 201, ThreadRole::Vcpu(0));
        m
    }

    #[test]
    fn guest_modes_go_to_the_owning_vm() {
        let m = map();
        let a = attribute(&m, 200, 201, CpuMode::GuestKernel, &ImageRef::GuestKernel);
        assert_eq!((&*a.domain, a.context), ("vm2", Context::GuestKernel));
        let a = attribute(&m, 200, 201, CpuMode::GuestUser, &ImageRef::GuestUser);
        assert_eq!(a.context, Context::GuestUser);
        let a = attribute(&m, 7, 7, CpuMode::GuestKernel, &ImageRef::GuestKernel);
        assert_eq!(&*a.domain, "pid7");
    }

    #[test]
    fn host_kernel_in_vm_threads_is_vmm_kernel() {
        let m = map();
        let a = attribute(&m, 100, 102, CpuMode::Kernel, &ImageRef::Kernel);
        assert_eq!((&*a.domain, a.context), ("vm1", Context::VmmKernel));
        let a = attribute(&m, 5, 5, CpuMode::Kernel, &ImageRef::Kernel);
        assert_eq!((&*a.domain, a.context), ("host", Context::HostKernel));
    }

    #[test]
    fn tcg_anon_is_translated_guest_code_else_vmm_user() {
        let m = map();
        let a = attribute(&m, 100, 101, CpuMode::User, &ImageRef::Anon);
        assert_eq!(a.context, Context::GuestTranslated);
        let file = ImageRef::File {
            path: "/usr/bin/qemu-system-x86_64".into(),
            build_id: None,
        };
        let a = attribute(&m, 100, 101, CpuMode::User, &file);
        assert_eq!(a.context, Context::VmmUser);
        // A KVM VM's anonymous memory is QEMU's own (not translated code).
        let a = attribute(&m, 200, 201, CpuMode::User, &ImageRef::Anon);
        assert_eq!(a.context, Context::VmmUser);
    }

    #[test]
    fn idle_and_host_user() {
        let m = map();
        assert_eq!(
            attribute(&m, 0, 0, CpuMode::Kernel, &ImageRef::Kernel).context,
            Context::Idle
        );
        assert_eq!(
            attribute(&m, 9, 9, CpuMode::User, &ImageRef::Unknown).context,
            Context::HostUser
        );
    }
}
