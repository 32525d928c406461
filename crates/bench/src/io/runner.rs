//! Running the engine on a target: in this process for host targets, and
//! through the VM's agent (`vmscope-agent io ...`, one JSON line back) for
//! VM targets; dropping caches on both sides; and one sample end to end:
//! caches dropped, load and accountant read before and after, the run in
//! between.

use super::target::{Place, Target};
use crate::guest::{Guest, VmFailure};
use crate::hygiene::{self, LoadProbe, LoadSample};
use serde::de::DeserializeOwned;
use std::time::Duration;
use vmscope_lab::image::GUEST_AGENT_PATH;
use vmscope_stat::account::Accountant;
use vmscope_workload::io::{self, IoRun, IoSpec, Mode, TargetInfo};

/// Runs `vmscope-agent io ARGS...` in the guest and parses its JSON line;
/// returns the value and the line.
fn agent_io<T: DeserializeOwned>(
    g: &mut Guest,
    args: &[String],
    timeout: Duration,
) -> Result<(T, String), VmFailure> {
    let mut argv = vec![GUEST_AGENT_PATH.to_string(), "io".to_string()];
    argv.extend_from_slice(args);
    g.exec_json(&argv, timeout)
}

/// The runner of one sweep: agent connections, the accountant, the load
/// probe.
pub struct Runner {
    /// One agent connection per VM, shared by its targets.
    pub guests: Vec<Option<Guest>>,
    pub accountant: Option<Accountant>,
    pub probe: LoadProbe,
    pub drop_caches: bool,
    /// Per VM connection: the host CPU of a run that moves nothing (the
    /// agent starting `vmscope-agent io` in the guest and reporting back),
    /// measured by [`Runner::calibrate`] and taken off every sample, so
    /// the split is the I/O's and not the command's.
    pub overhead: Vec<Option<CpuSplit>>,
}

/// The host CPU one I/O sample cost, seconds, split by who spent it
/// (cherkasova2005's split).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuSplit {
    /// The VM's vCPU threads on host CPUs.
    pub vcpu_s: f64,
    /// The VM's own I/O threads (QEMU main loop, iothreads, workers).
    pub io_threads_s: f64,
    /// The VM's charge for shared host I/O work (softirqs, ksoftirqd); for
    /// host targets, all of it.
    pub shared_io_s: f64,
    /// Kernel threads other than ksoftirqd (flushers, loop workers,
    /// journal), measured host-wide during the sample.
    pub kernel_threads_s: f64,
    /// The engine's own thread, for host targets (in a VM the engine's CPU
    /// is guest time, inside `vcpu_s`).
    pub engine_s: f64,
    /// Disk requests the VM made (QMP blockstats), if known.
    pub disk_ops: Option<u64>,
}

impl CpuSplit {
    pub fn total_s(&self) -> f64 {
        self.vcpu_s + self.io_threads_s + self.shared_io_s + self.kernel_threads_s + self.engine_s
    }

    /// `self − other` per part, never below zero.
    pub fn minus(&self, o: &CpuSplit) -> CpuSplit {
        let d = |a: f64, b: f64| (a - b).max(0.0);
        CpuSplit {
            vcpu_s: d(self.vcpu_s, o.vcpu_s),
            io_threads_s: d(self.io_threads_s, o.io_threads_s),
            shared_io_s: d(self.shared_io_s, o.shared_io_s),
            kernel_threads_s: d(self.kernel_threads_s, o.kernel_threads_s),
            engine_s: d(self.engine_s, o.engine_s),
            disk_ops: match (self.disk_ops, o.disk_ops) {
                (Some(a), Some(b)) => Some(a.saturating_sub(b)),
                (a, _) => a,
            },
        }
    }

    /// The median of each part.
    pub fn median(xs: &[CpuSplit]) -> Option<CpuSplit> {
        if xs.is_empty() {
            return None;
        }
        let m =
            |f: fn(&CpuSplit) -> f64| crate::stats::median(&xs.iter().map(f).collect::<Vec<_>>());
        let mut ops: Vec<u64> = xs.iter().filter_map(|h| h.disk_ops).collect();
        ops.sort_unstable();
        Some(CpuSplit {
            vcpu_s: m(|h| h.vcpu_s),
            io_threads_s: m(|h| h.io_threads_s),
            shared_io_s: m(|h| h.shared_io_s),
            kernel_threads_s: m(|h| h.kernel_threads_s),
            engine_s: m(|h| h.engine_s),
            disk_ops: ops.get(ops.len() / 2).copied(),
        })
    }
}

/// One sample's results.
#[derive(Debug, Clone)]
pub struct SampleOut {
    pub run: IoRun,
    pub raw: String,
    pub load: LoadSample,
    pub host_cpu: Option<CpuSplit>,
}

impl Runner {
    /// What `path` is, on the host or in the VM.
    pub fn inspect(
        &mut self,
        t: &Target,
        vm_index: Option<usize>,
    ) -> Result<TargetInfo, VmFailure> {
        match vm_index {
            None => Ok(io::inspect(&t.path)),
            Some(i) => agent_io::<TargetInfo>(
                self.guest(i),
                &["inspect".into(), t.path.display().to_string()],
                Duration::from_secs(30),
            )
            .map(|(v, _)| v),
        }
    }

    fn guest(&mut self, i: usize) -> &mut Guest {
        self.guests[i]
            .as_mut()
            .expect("a VM target has a connection")
    }

    /// Writes zeros over the region (untimed).
    pub fn fill(
        &mut self,
        t: &Target,
        vm_index: Option<usize>,
        offset: u64,
        len: u64,
    ) -> Result<(), String> {
        match vm_index {
            None => io::fill(&t.path, offset, len)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Some(i) => agent_io::<IoRun>(
                self.guest(i),
                &[
                    "fill".into(),
                    t.path.display().to_string(),
                    format!("size={len}"),
                    format!("offset={offset}"),
                ],
                exec_timeout(len),
            )
            .map(|_| ())
            .map_err(|e| e.to_string()),
        }
    }

    /// Measures the host CPU of a VM run that moves nothing (`count=0`),
    /// `n` times, and keeps the median as that VM's per-sample overhead.
    pub fn calibrate(
        &mut self,
        t: &Target,
        vm_index: usize,
        n: usize,
    ) -> Result<CpuSplit, VmFailure> {
        let spec = spec_for(&t.path, Mode::DirectRead, 4096, 0, 0);
        let mut got = Vec::new();
        for _ in 0..n {
            if let Some(h) = self.sample(t, Some(vm_index), &spec)?.host_cpu {
                got.push(h);
            }
        }
        let m = CpuSplit::median(&got).unwrap_or_default();
        if self.overhead.len() <= vm_index {
            self.overhead.resize(vm_index + 1, None);
        }
        self.overhead[vm_index] = Some(m);
        Ok(m)
    }

    /// One sample: caches dropped (host, and guest for VM targets), the
    /// load probe and accountant read, the engine run, both read again.
    pub fn sample(
        &mut self,
        t: &Target,
        vm_index: Option<usize>,
        spec: &IoSpec,
    ) -> Result<SampleOut, VmFailure> {
        if self.drop_caches {
            hygiene::drop_host_caches()
                .map_err(|e| VmFailure::Failed(format!("dropping the host's caches: {e}")))?;
            if let Some(i) = vm_index {
                agent_io::<serde_json::Value>(
                    self.guest(i),
                    &["drop-caches".into()],
                    Duration::from_secs(120),
                )?;
            }
        }
        let qemu: Vec<u32> = t.vm().and_then(|v| v.pid).into_iter().collect();
        let mark = self.probe.mark(&qemu);
        if let Some(acc) = self.accountant.as_mut() {
            // The baseline: the interval up to here is not this sample's.
            let _ = acc.sample();
        }
        let (run, raw) = match vm_index {
            None => {
                let r = io::run(spec).map_err(|e| VmFailure::Failed(e.to_string()))?;
                let raw = serde_json::to_string(&r).unwrap_or_default();
                (r, raw)
            }
            Some(i) => agent_io::<IoRun>(
                self.guest(i),
                &[
                    "run".into(),
                    spec.path.display().to_string(),
                    format!("mode={}", spec.mode.name()),
                    format!("bs={}", spec.block_size),
                    format!("count={}", spec.count),
                    format!("offset={}", spec.offset),
                ],
                exec_timeout(spec.block_size.saturating_mul(spec.count)),
            )?,
        };
        let interval = self
            .accountant
            .as_mut()
            .and_then(|acc| acc.sample().ok())
            .and_then(|(iv, _)| iv);
        let load = self.probe.since(&mark);
        let kernel_threads_s = (load.kthreads_s - load.ksoftirqd_s).max(0.0);
        let host_cpu = interval.map(|iv| match &t.place {
            Place::Host => CpuSplit {
                shared_io_s: iv.shared_io_s,
                kernel_threads_s,
                engine_s: run.cpu_s(),
                ..Default::default()
            },
            Place::Vm { vm, .. } => match iv.vms.iter().find(|a| Some(a.pid) == vm.pid) {
                Some(a) => CpuSplit {
                    vcpu_s: a.vcpu_run_s,
                    io_threads_s: a.direct_io_s,
                    shared_io_s: a.shared_io_s,
                    kernel_threads_s,
                    engine_s: 0.0,
                    disk_ops: (a.disk_source != "none").then_some(a.disk_ops),
                },
                None => CpuSplit {
                    kernel_threads_s,
                    ..Default::default()
                },
            },
        });
        let overhead = vm_index.and_then(|i| self.overhead.get(i).copied().flatten());
        let host_cpu = match (host_cpu, overhead) {
            (Some(h), Some(o)) => Some(h.minus(&o)),
            (h, _) => h,
        };
        Ok(SampleOut {
            run,
            raw,
            load,
            host_cpu,
        })
    }
}

/// Generous time for a guest command moving `bytes`: two minutes plus
/// 256 KiB/s (TCG guests do 512-byte O_DIRECT reads at about 2 MiB/s).
pub fn exec_timeout(bytes: u64) -> Duration {
    Duration::from_secs((120 + bytes / (256 << 10)).min(86_400))
}

/// The engine run a point asks for.
pub fn spec_for(path: &std::path::Path, mode: Mode, bs: u64, size: u64, offset: u64) -> IoSpec {
    IoSpec {
        path: path.to_path_buf(),
        mode,
        block_size: bs,
        count: size / bs,
        offset,
        create: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_specs() {
        assert_eq!(exec_timeout(0), Duration::from_secs(120));
        assert_eq!(exec_timeout(1 << 30), Duration::from_secs(120 + 4096));
        let s = spec_for(
            std::path::Path::new("/x"),
            Mode::DirectRead,
            4096,
            1 << 20,
            512,
        );
        assert_eq!((s.count, s.offset, s.create), (256, 512, false));
        let h = CpuSplit {
            vcpu_s: 1.0,
            io_threads_s: 0.5,
            shared_io_s: 0.25,
            kernel_threads_s: 0.125,
            engine_s: 0.0,
            disk_ops: None,
        };
        assert_eq!(h.total_s(), 1.875);
        let o = CpuSplit {
            vcpu_s: 0.25,
            io_threads_s: 1.0,
            disk_ops: Some(2),
            ..Default::default()
        };
        let d = CpuSplit {
            disk_ops: Some(10),
            ..h
        }
        .minus(&o);
        assert_eq!((d.vcpu_s, d.io_threads_s, d.disk_ops), (0.75, 0.0, Some(8)));
        let m = CpuSplit::median(&[h, o, h]).unwrap();
        assert_eq!((m.vcpu_s, m.io_threads_s), (1.0, 0.5));
        assert!(CpuSplit::median(&[]).is_none());
    }
}
