//! Disk requests of libvirt's VMs for `account`: when libvirtd holds a
//! VM's QMP monitor, QEMU's own block counters (the ones `query-blockstats`
//! returns) are read through libvirt (`virsh domstats --raw --block`, see
//! `vmscope_discover::libvirt` for why virsh). Only VMs whose command line
//! shows libvirt started them are asked; when libvirt cannot be asked the
//! reason is kept, said once, and not asked again in the session.

use std::time::Duration;
use vmscope_discover::libvirt::{looks_libvirt_managed, Libvirt};
use vmscope_discover::Vm;

/// (disk, requests, bytes) per disk.
type BlockCounts = Vec<(String, u64, u64)>;

/// The libvirt connection of one accounting session.
pub(crate) struct LibvirtIo {
    lv: Libvirt,
    /// Why libvirt is not asked any more, once it failed.
    pub(crate) off: Option<String>,
}

impl LibvirtIo {
    pub(crate) fn new(timeout: Duration) -> LibvirtIo {
        LibvirtIo {
            lv: Libvirt::from_env(timeout),
            off: None,
        }
    }

    /// (disk, requests, bytes) of `vm` from QEMU's counters through
    /// libvirt, `Ok(None)` when `vm` is not libvirt's or libvirt was found
    /// unusable before, `Err(why)` the one time it is found unusable.
    pub(crate) fn blockstats(&mut self, vm: &Vm) -> Result<Option<BlockCounts>, String> {
        if self.off.is_some() || !looks_libvirt_managed(vm) {
            return Ok(None);
        }
        // libvirt's name for the domain is the `guest=` of `-name`.
        let name = vm.name.split('@').next().unwrap_or(&vm.name);
        match self.lv.stats(name) {
            Ok(s) => Ok(Some(s.block)),
            Err(e) => {
                let why = e.to_string();
                self.off = Some(why.clone());
                Err(why)
            }
        }
    }
}
