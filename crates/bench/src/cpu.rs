//! The host's CPU around a sample, for the network, web, scaling and
//! overhead benchmarks: busy time of the whole host and other load
//! ([`crate::hygiene::LoadProbe`], `/proc/stat`'s idle side), and per VM
//! the accountant's split (`vmscope account`, cherkasova2005): vCPU run
//! time, the VM's own I/O threads (QEMU's main loop runs virtio-net for a
//! tap NIC), and its charge for shared host I/O work (network softirqs,
//! ksoftirqd: cost = T / ΣN by packets).

use crate::hygiene::{LoadMark, LoadProbe, LoadSample};
use serde::Serialize;
use vmscope_stat::account::{AccountOptions, Accountant};

/// One VM's host CPU during a sample, seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VmCpu {
    pub name: String,
    pub pid: u32,
    pub vcpu_s: f64,
    /// QEMU's other threads (main loop, iothreads, workers).
    pub io_threads_s: f64,
    /// The VM's charge for shared I/O work (softirqs, ksoftirqd).
    pub shared_io_s: f64,
    /// Packets on its taps.
    pub net_packets: u64,
}

impl VmCpu {
    /// What `account` charges the VM for I/O: its own I/O threads and its
    /// share of the host's shared I/O work.
    pub fn io_charge_s(&self) -> f64 {
        self.io_threads_s + self.shared_io_s
    }

    pub fn total_s(&self) -> f64 {
        self.vcpu_s + self.io_charge_s()
    }
}

/// The host during one sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostCpu {
    pub load: LoadSample,
    pub vms: Vec<VmCpu>,
    /// Shared I/O time T of the whole host in the interval (what is split
    /// among the VMs by their I/O operations), seconds.
    pub shared_io_s: f64,
    /// Whether the accountant ran (else `vms` is empty).
    pub accounted: bool,
}

impl HostCpu {
    pub fn vm(&self, pid: Option<u32>) -> Option<&VmCpu> {
        pid.and_then(|p| self.vms.iter().find(|v| v.pid == p))
    }
}

/// Samples the host before and after a run.
pub struct CpuProbe {
    load: LoadProbe,
    acc: Option<Accountant>,
}

/// A reading taken before a run.
pub struct CpuMark(LoadMark);

impl CpuProbe {
    /// `account`: run the accountant (per-VM split; needs root for the
    /// softirq tracepoints, which it falls back from by itself).
    pub fn new(account: bool) -> CpuProbe {
        let acc = account.then(|| {
            let mut a = Accountant::new(AccountOptions::default());
            let _ = a.sample();
            a
        });
        CpuProbe {
            load: LoadProbe::default(),
            acc,
        }
    }

    /// Reads the host now; `own` are the processes the run uses besides
    /// this one and its children (the VMs' QEMUs).
    pub fn mark(&mut self, own: &[u32]) -> CpuMark {
        if let Some(a) = self.acc.as_mut() {
            // The interval up to here is not the run's.
            let _ = a.sample();
        }
        CpuMark(self.load.mark(own))
    }

    /// What the host did since `m`.
    pub fn since(&mut self, m: &CpuMark) -> HostCpu {
        let iv = self
            .acc
            .as_mut()
            .and_then(|a| a.sample().ok())
            .and_then(|(iv, _)| iv);
        let load = self.load.since(&m.0);
        let mut out = HostCpu {
            load,
            accounted: iv.is_some(),
            ..Default::default()
        };
        if let Some(iv) = iv {
            out.shared_io_s = iv.shared_io_s;
            out.vms = iv
                .vms
                .iter()
                .map(|a| VmCpu {
                    name: a.name.clone(),
                    pid: a.pid,
                    vcpu_s: a.vcpu_run_s,
                    io_threads_s: a.direct_io_s,
                    shared_io_s: a.shared_io_s,
                    net_packets: a.net_packets,
                })
                .collect();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_charge_adds_threads_and_share() {
        let v = VmCpu {
            vcpu_s: 1.0,
            io_threads_s: 0.25,
            shared_io_s: 0.125,
            ..Default::default()
        };
        assert_eq!(v.io_charge_s(), 0.375);
        assert_eq!(v.total_s(), 1.375);
        let h = HostCpu {
            vms: vec![VmCpu {
                pid: 7,
                ..v.clone()
            }],
            ..Default::default()
        };
        assert_eq!(h.vm(Some(7)).unwrap().vcpu_s, 1.0);
        assert!(h.vm(Some(8)).is_none() && h.vm(None).is_none());
        // Without the accountant: load only.
        let mut p = CpuProbe::new(false);
        let m = p.mark(&[]);
        let s = p.since(&m);
        assert!(!s.accounted && s.vms.is_empty() && s.load.wall_s >= 0.0);
    }
}
