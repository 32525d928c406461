//! What a QEMU thread does, from its name: `CPU n/KVM` and `CPU n/TCG`
//! (vCPU n), `ALL CPUs/TCG` (single-threaded TCG), `IO <id>` (I/O thread),
//! `worker` (thread pool), `vhost-<pid>` (vhost worker on kernels ≥ 6.4),
//! and the main loop (tid = pid). QEMU names threads this way only with
//! `-name ...,debug-threads=on`; otherwise every thread carries the
//! process name (`qemu-system-x86`).

use crate::vm::{Accel, ThreadKind};

/// A thread's role as its name tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedRole {
    /// vCPU thread: index (`None` for `ALL CPUs/TCG`) and accelerator.
    Vcpu { index: Option<u32>, accel: Accel },
    /// `vhost-<pid>` naming this QEMU's pid.
    Vhost,
    /// Any other thread of the process.
    Other(ThreadKind),
}

/// Classify one thread of QEMU process `pid`.
pub fn classify(pid: u32, tid: u32, comm: &str) -> NamedRole {
    if let Some((idx, accel)) = parse_vcpu_name(comm) {
        return NamedRole::Vcpu { index: idx, accel };
    }
    if vhost_owner(comm) == Some(pid) {
        return NamedRole::Vhost;
    }
    let kind = if tid == pid {
        ThreadKind::MainLoop
    } else if comm.starts_with("IO ") {
        ThreadKind::IoThread
    } else if comm == "worker" {
        ThreadKind::Worker
    } else {
        // Could be RCU, SPICE, migration... or an unnamed vCPU; the caller
        // decides from whether vCPUs were identified at all.
        ThreadKind::Unknown
    };
    NamedRole::Other(kind)
}

/// `CPU 3/KVM` → (Some(3), Kvm); `ALL CPUs/TCG` → (None, Tcg). Other
/// accelerators (`CPU 0/HVF`, `CPU 0/WHPX`) are vCPUs with `Unknown`.
pub fn parse_vcpu_name(comm: &str) -> Option<(Option<u32>, Accel)> {
    let (cpu, acc) = comm.split_once('/')?;
    let index = if cpu == "ALL CPUs" {
        None
    } else {
        Some(cpu.strip_prefix("CPU ")?.parse().ok()?)
    };
    let accel = match acc {
        "KVM" => Accel::Kvm,
        "TCG" => Accel::Tcg,
        _ => Accel::Unknown,
    };
    Some((index, accel))
}

/// vCPU thread ids of a process from its (tid, name) list: threads named
/// `CPU n/ACCEL`, in vCPU index order. What QMP's `query-cpus-fast` says
/// when no monitor answers.
pub fn vcpu_tids_by_name(threads: &[(u32, String)]) -> Vec<u32> {
    let mut v: Vec<(u32, u32)> = threads
        .iter()
        .filter_map(|(tid, comm)| Some((parse_vcpu_name(comm)?.0?, *tid)))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|x| x.1).collect()
}

/// `vhost-1234` → 1234.
pub fn vhost_owner(comm: &str) -> Option<u32> {
    comm.strip_prefix("vhost-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpus_by_name_in_index_order() {
        let t: Vec<(u32, String)> = [
            (10, "qemu-system-x86"),
            (14, "CPU 1/TCG"),
            (12, "CPU 0/TCG"),
            (13, "IO iothread0"),
            (15, "ALL CPUs/TCG"),
        ]
        .iter()
        .map(|(t, n)| (*t, n.to_string()))
        .collect();
        assert_eq!(vcpu_tids_by_name(&t), vec![12, 14]);
        assert!(vcpu_tids_by_name(&[]).is_empty());
    }

    #[test]
    fn names() {
        assert_eq!(
            classify(10, 12, "CPU 3/KVM"),
            NamedRole::Vcpu {
                index: Some(3),
                accel: Accel::Kvm
            }
        );
        assert_eq!(
            classify(10, 12, "CPU 0/TCG"),
            NamedRole::Vcpu {
                index: Some(0),
                accel: Accel::Tcg
            }
        );
        assert_eq!(
            classify(10, 12, "ALL CPUs/TCG"),
            NamedRole::Vcpu {
                index: None,
                accel: Accel::Tcg
            }
        );
        assert_eq!(classify(10, 12, "vhost-10"), NamedRole::Vhost);
        assert_eq!(
            classify(10, 12, "vhost-11"),
            NamedRole::Other(ThreadKind::Unknown)
        );
        assert_eq!(
            classify(10, 10, "qemu-system-x86"),
            NamedRole::Other(ThreadKind::MainLoop)
        );
        assert_eq!(
            classify(10, 11, "IO iothread1"),
            NamedRole::Other(ThreadKind::IoThread)
        );
        assert_eq!(
            classify(10, 11, "worker"),
            NamedRole::Other(ThreadKind::Worker)
        );
        assert_eq!(
            classify(10, 11, "CPU x/KVM"),
            NamedRole::Other(ThreadKind::Unknown)
        );
        assert_eq!(
            classify(10, 11, "CPUs/KVM"),
            NamedRole::Other(ThreadKind::Unknown)
        );
    }
}
