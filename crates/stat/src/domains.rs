//! Stable domain numbers (`d1`, `d2`, ...; `d0` is the host) for the VMs
//! discovery finds, re-discovered every interval: a new VM gets the next
//! number, an exited one leaves, a reused PID (a different process start
//! time) is a new VM. Also what each VM's threads are for `stat` and
//! `account`: vCPUs by index, the VM's own non-vCPU threads (main loop, I/O
//! threads, workers, vhost workers, threads or kernel threads), and which
//! threads were renamed since the last interval.

use crate::procfs;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use vmscope_discover::{DiscoverOptions, Vm};

/// A thread `stat`/`account` reads: its `/proc/PID/task/TID` location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    /// Process whose `task/` directory holds the thread (the tid itself for
    /// kernel vhost threads).
    pub pid: u32,
    pub tid: u32,
    pub name: String,
}

/// One VM under its domain number.
#[derive(Debug, Clone)]
pub struct Domain {
    pub id: u32,
    pub name: String,
    pub pid: u32,
    /// Start time of the process (ticks since boot).
    pub start: u64,
    /// vCPU threads with their index.
    pub vcpus: Vec<(u32, Thread)>,
    /// The VM's own non-vCPU threads (direct I/O).
    pub io: Vec<Thread>,
    pub taps: Vec<String>,
    pub qmp: Option<PathBuf>,
    pub vm: Vm,
}

/// What changed between two discoveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Started {
        id: u32,
        name: String,
        pid: u32,
    },
    Exited {
        id: u32,
        name: String,
        pid: u32,
    },
    /// The same PID now belongs to a different process.
    PidReused {
        old: u32,
        new: u32,
        pid: u32,
    },
    Renamed {
        id: u32,
        tid: u32,
        from: String,
        to: String,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Started { id, name, pid } => write!(f, "d{id} {name} (pid {pid}) started"),
            Change::Exited { id, name, pid } => write!(f, "d{id} {name} (pid {pid}) exited"),
            Change::PidReused { old, new, pid } => {
                write!(f, "pid {pid} reused: d{old} exited, d{new} is a new VM")
            }
            Change::Renamed { id, tid, from, to } => {
                write!(f, "d{id} thread {tid} renamed '{from}' -> '{to}'")
            }
        }
    }
}

/// The domain registry, updated once per interval.
#[derive(Debug)]
pub struct Domains {
    proc_root: PathBuf,
    next: u32,
    current: Vec<Domain>,
    names: HashMap<u32, String>,
}

impl Domains {
    pub fn new(proc_root: &Path) -> Domains {
        Domains {
            proc_root: proc_root.to_path_buf(),
            next: 1,
            current: Vec::new(),
            names: HashMap::new(),
        }
    }

    pub fn current(&self) -> &[Domain] {
        &self.current
    }

    /// Discover again (no QMP: cheap) and number the VMs.
    pub fn refresh(&mut self) -> Result<Vec<Change>, crate::StatError> {
        let vms = vmscope_discover::discover(&DiscoverOptions {
            proc_root: self.proc_root.clone(),
            query_qmp: false,
            ..DiscoverOptions::default()
        })?;
        Ok(self.update(vms))
    }

    /// Number `vms` against the previous set and report what changed.
    pub fn update(&mut self, vms: Vec<Vm>) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut old: HashMap<u32, Domain> = self.current.drain(..).map(|d| (d.pid, d)).collect();
        let mut next = Vec::new();
        for vm in vms {
            let start = procfs::task_stat(&self.proc_root, vm.pid, vm.pid)
                .map(|s| s.starttime)
                .unwrap_or(0);
            let id = match old.remove(&vm.pid) {
                Some(prev) if prev.start == start => {
                    for (tid, from, to) in renames(&prev, &vm) {
                        changes.push(Change::Renamed {
                            id: prev.id,
                            tid,
                            from,
                            to,
                        });
                    }
                    prev.id
                }
                Some(prev) => {
                    let id = self.alloc();
                    changes.push(Change::PidReused {
                        old: prev.id,
                        new: id,
                        pid: vm.pid,
                    });
                    id
                }
                None => {
                    let id = self.alloc();
                    changes.push(Change::Started {
                        id,
                        name: vm.name.clone(),
                        pid: vm.pid,
                    });
                    id
                }
            };
            next.push(domain_of(id, start, vm));
        }
        let mut gone: Vec<Domain> = old.into_values().collect();
        gone.sort_by_key(|d| d.id);
        for d in gone {
            self.names.remove(&d.id);
            changes.push(Change::Exited {
                id: d.id,
                name: d.name,
                pid: d.pid,
            });
        }
        next.sort_by_key(|d| d.id);
        for d in &next {
            self.names.insert(d.id, d.name.clone());
        }
        self.current = next;
        changes
    }

    fn alloc(&mut self) -> u32 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// `d1=name (pid P) ...`, the legend line.
    pub fn legend(&self) -> String {
        let mut s = String::from("d0=host");
        for d in &self.current {
            s.push_str(&format!(" d{}={} (pid {})", d.id, d.name, d.pid));
        }
        s
    }

    /// `tid -> (domain, Some(vcpu index) | None for the VM's other threads)`.
    pub fn tid_map(&self) -> HashMap<u32, (u32, Option<u32>)> {
        let mut m = HashMap::new();
        for d in &self.current {
            for t in &d.io {
                m.insert(t.tid, (d.id, None));
            }
            // Every thread of the QEMU process is the VM's, even unnamed ones.
            if let Ok(tids) = procfs::tids(&self.proc_root, d.pid) {
                for tid in tids {
                    m.entry(tid).or_insert((d.id, None));
                }
            }
            for (i, t) in &d.vcpus {
                m.insert(t.tid, (d.id, Some(*i)));
            }
        }
        m
    }
}

fn renames(prev: &Domain, vm: &Vm) -> Vec<(u32, String, String)> {
    let old: HashMap<u32, &str> = prev
        .vcpus
        .iter()
        .map(|(_, t)| t)
        .chain(prev.io.iter())
        .map(|t| (t.tid, t.name.as_str()))
        .collect();
    vm.vcpus
        .iter()
        .chain(vm.io_threads.iter())
        .filter_map(|t| {
            let was = old.get(&t.tid)?;
            (*was != t.name).then(|| (t.tid, was.to_string(), t.name.clone()))
        })
        .collect()
}

fn domain_of(id: u32, start: u64, vm: Vm) -> Domain {
    let vcpus = vm
        .vcpus
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                t.index.unwrap_or(i as u32),
                Thread {
                    pid: vm.pid,
                    tid: t.tid,
                    name: t.name.clone(),
                },
            )
        })
        .collect();
    let mut io: Vec<Thread> = vm
        .io_threads
        .iter()
        .map(|t| Thread {
            pid: vm.pid,
            tid: t.tid,
            name: t.name.clone(),
        })
        .collect();
    for w in &vm.vhost {
        // Kernel vhost threads are processes of their own; new-style vhost
        // workers are threads of QEMU and may already be listed.
        if io.iter().any(|t| t.tid == w.tid) {
            continue;
        }
        io.push(Thread {
            pid: if w.kernel_thread { w.tid } else { vm.pid },
            tid: w.tid,
            name: w.name.clone(),
        });
    }
    Domain {
        id,
        name: vm.name.clone(),
        pid: vm.pid,
        start,
        vcpus,
        io,
        taps: vm.taps.clone(),
        qmp: vm.qmp.clone(),
        vm,
    }
}
