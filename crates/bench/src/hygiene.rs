//! Hygiene of a sample (docs/architecture.md §8, docs/experiments.md): dropping caches before it, and telling
//! whether the host was busy with other work while it ran.
//!
//! Busy detection: the host's busy CPU time over the sample, from
//! `/proc/stat`'s idle side (`vmscope_linux::procfs::ProcStat`, exact on
//! NO_HZ kernels and blind to no process, even one that started and exited
//! inside the sample), less the CPU of what the sample itself runs (this
//! process, its reaped children, the VM under test's QEMU) and of kernel
//! threads (page-cache flushers, loop workers, journal and softirq threads
//! doing this sample's I/O). What remains is other load: another build, a
//! busy VM. Per-process CPU comes from `/proc/PID/stat` (utime, stime,
//! cutime, cstime: dead threads and reaped children included), in ticks;
//! tick error is a few hundredths of a second per process, so the rule
//! also needs a minimum of other CPU seconds before it calls a host busy.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;
use vmscope_linux::procfs::{clk_tck, ProcRoot, ProcStat, ProcessCpu};

/// Drops the host's page cache (after `sync`); needs root.
pub fn drop_host_caches() -> std::io::Result<()> {
    vmscope_workload::io::drop_caches()
}

/// What this module takes from `/proc/PID/stat`, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProcCpu {
    /// A kernel thread.
    pub kernel_thread: bool,
    /// utime + stime, seconds.
    pub own_s: f64,
    /// cutime + cstime (reaped children), seconds.
    pub children_s: f64,
}

impl ProcCpu {
    fn from(c: &ProcessCpu, tck: f64) -> ProcCpu {
        ProcCpu {
            kernel_thread: c.is_kernel_thread(),
            own_s: (c.utime + c.stime) as f64 / tck,
            children_s: (c.cutime + c.cstime) as f64 / tck,
        }
    }
}

/// A reading taken before a sample.
#[derive(Debug, Clone)]
pub struct LoadMark {
    at: Instant,
    stat: Option<ProcStat>,
    own: HashMap<u32, f64>,
    kthreads: HashMap<u32, (f64, bool)>,
}

/// What the host did during a sample, seconds of CPU.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct LoadSample {
    pub wall_s: f64,
    /// Busy CPU of the whole host (`/proc/stat`, idle side).
    pub host_busy_s: f64,
    /// This process (with reaped children) and the other processes the
    /// sample runs (the VM under test).
    pub own_s: f64,
    /// Kernel threads, softirq threads included.
    pub kthreads_s: f64,
    /// The `ksoftirqd/N` part of `kthreads_s`.
    pub ksoftirqd_s: f64,
    /// The rest: load that is not the sample's.
    pub other_s: f64,
}

impl LoadSample {
    /// Other load in CPUs (seconds per second of the sample).
    pub fn other_cpus(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.other_s / self.wall_s
        } else {
            0.0
        }
    }

    /// Why the sample counts as taken on a busy host, or `None`.
    pub fn busy(&self, rule: &BusyRule) -> Option<String> {
        (self.other_cpus() > rule.max_other_cpus && self.other_s > rule.min_other_s).then(|| {
            format!(
                "busy host: {:.2} CPUs of other load ({:.2} s in {:.2} s; limit {:.2})",
                self.other_cpus(),
                self.other_s,
                self.wall_s,
                rule.max_other_cpus
            )
        })
    }
}

/// When a host counts as busy.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BusyRule {
    /// Other load above this many CPUs, on average over the sample...
    pub max_other_cpus: f64,
    /// ...and above this many CPU seconds (tick noise on short samples).
    pub min_other_s: f64,
}

impl Default for BusyRule {
    fn default() -> Self {
        BusyRule {
            max_other_cpus: 0.25,
            min_other_s: 0.05,
        }
    }
}

/// Takes [`LoadMark`]s and turns two of them into a [`LoadSample`].
#[derive(Debug, Clone)]
pub struct LoadProbe {
    proc: ProcRoot,
    tck: f64,
}

impl Default for LoadProbe {
    fn default() -> Self {
        LoadProbe::new(Path::new("/proc"))
    }
}

impl LoadProbe {
    pub fn new(proc_root: &Path) -> LoadProbe {
        LoadProbe {
            proc: ProcRoot::new(proc_root),
            tck: clk_tck(),
        }
    }

    fn cpu_of(&self, pid: u32) -> Option<(String, ProcCpu)> {
        let c = self.proc.process_cpu(pid).ok()?;
        Some((c.comm.clone(), ProcCpu::from(&c, self.tck)))
    }

    /// Reads the host now; `own` are the processes the sample runs besides
    /// this one (the VM's QEMU).
    pub fn mark(&self, own: &[u32]) -> LoadMark {
        let me = std::process::id();
        let mut own_map = HashMap::new();
        for &pid in own.iter().chain(std::iter::once(&me)) {
            if let Some((_, c)) = self.cpu_of(pid) {
                own_map.insert(pid, c.own_s + if pid == me { c.children_s } else { 0.0 });
            }
        }
        let mut kthreads = HashMap::new();
        for pid in self.proc.pids().unwrap_or_default() {
            if let Some((comm, c)) = self.cpu_of(pid) {
                if c.kernel_thread {
                    kthreads.insert(pid, (c.own_s, comm.starts_with("ksoftirqd")));
                }
            }
        }
        LoadMark {
            at: Instant::now(),
            stat: self.proc.cpu_times().ok(),
            own: own_map,
            kthreads,
        }
    }

    /// What happened since `m` (the same `own` processes as the mark).
    pub fn since(&self, m: &LoadMark) -> LoadSample {
        let now = self.mark(&m.own.keys().copied().collect::<Vec<_>>());
        let wall_s = now.at.duration_since(m.at).as_secs_f64();
        let host_busy_s = match (&m.stat, &now.stat) {
            (Some(a), Some(b)) => ProcStat::busy_from_idle(a, b, wall_s)
                .iter()
                .map(|(_, s)| s)
                .sum(),
            _ => 0.0,
        };
        let own_s: f64 = now
            .own
            .iter()
            .map(|(pid, v)| (v - m.own.get(pid).copied().unwrap_or(*v)).max(0.0))
            .sum();
        let (mut kthreads_s, mut ksoftirqd_s) = (0.0, 0.0);
        for (pid, (v, soft)) in &now.kthreads {
            // A kernel thread that appeared during the sample: all of it.
            let d = (v - m.kthreads.get(pid).map(|x| x.0).unwrap_or(0.0)).max(0.0);
            kthreads_s += d;
            if *soft {
                ksoftirqd_s += d;
            }
        }
        LoadSample {
            wall_s,
            host_busy_s,
            own_s,
            kthreads_s,
            ksoftirqd_s,
            other_s: (host_busy_s - own_s - kthreads_s).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_in_seconds() {
        let line = "42 (kworker/u4:2-loop0) I 2 0 0 0 -1 69238880 0 0 0 0 150 250 7 3 20 0 1 0 \
                    100 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 1 0 0 0 0 0";
        let c = vmscope_linux::procfs::parse_process_cpu(line, Path::new("stat")).unwrap();
        assert_eq!(c.comm, "kworker/u4:2-loop0");
        let p = ProcCpu::from(&c, 100.0);
        assert!(p.kernel_thread);
        assert!((p.own_s - 4.0).abs() < 1e-9);
        assert!((p.children_s - 0.1).abs() < 1e-9);
        let c = vmscope_linux::procfs::parse_process_cpu(
            "7 (a (b) c) S 1 7 7 0 -1 4194560 1 0 0 0 1 2 3 4",
            Path::new("stat"),
        )
        .unwrap();
        assert_eq!(c.comm, "a (b) c");
        assert!(!ProcCpu::from(&c, 100.0).kernel_thread);
        assert!(vmscope_linux::procfs::parse_process_cpu("garbage", Path::new("stat")).is_err());
    }

    #[test]
    fn busy_rule() {
        let s = LoadSample {
            wall_s: 2.0,
            host_busy_s: 2.0,
            own_s: 1.0,
            kthreads_s: 0.2,
            ksoftirqd_s: 0.1,
            other_s: 0.8,
        };
        assert!((s.other_cpus() - 0.4).abs() < 1e-12);
        let why = s.busy(&BusyRule::default()).unwrap();
        assert!(why.contains("0.40 CPUs"), "{why}");
        let quiet = LoadSample { other_s: 0.1, ..s };
        assert_eq!(quiet.busy(&BusyRule::default()), None);
        // A tiny sample: a few ticks of other work are noise.
        let tiny = LoadSample {
            wall_s: 0.02,
            other_s: 0.02,
            ..s
        };
        assert_eq!(tiny.busy(&BusyRule::default()), None);
    }

    #[test]
    fn own_cpu_is_counted() {
        let probe = LoadProbe::default();
        let m = probe.mark(&[]);
        // Spin until this thread has had 0.3 s of CPU (however busy the host).
        let cpu = || {
            let (u, s) = vmscope_workload::io::thread_cpu();
            u + s
        };
        let c0 = cpu();
        let mut x = 0u64;
        while cpu() - c0 < 0.3 {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(3).wrapping_add(1));
            }
        }
        let s = probe.since(&m);
        assert!(s.wall_s >= 0.3);
        assert!(s.own_s >= 0.2, "{s:?}");
        assert!(s.host_busy_s + 0.05 >= s.own_s, "{s:?}");
    }
}
