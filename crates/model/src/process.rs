//! Per-process address spaces rebuilt from the record stream (mmap, comm with
//! exec, fork, exit), so that an IP becomes (image, file offset) even for
//! processes that exited during the run. Normalization only: no file is read.

use crate::record::{CpuMode, Record};
use crate::{ANON_IMAGE, GUEST_KERNEL_IMAGE, KERNEL_IMAGE, UNKNOWN_IMAGE};
use std::collections::HashMap;
use std::sync::Arc;

/// A file or anonymous mapping in one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub pgoff: u64,
    pub path: Arc<str>,
    pub build_id: Option<Arc<[u8]>>,
}

/// What an address belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ImageRef {
    /// Host kernel or module; resolve by absolute address (kallsyms).
    Kernel,
    /// A VM's kernel seen from the host; resolve with that VM's kallsyms.
    GuestKernel,
    /// A file-backed mapping.
    File {
        path: Arc<str>,
        build_id: Option<Arc<[u8]>>,
    },
    /// Anonymous executable memory (JIT, TCG translated code).
    Anon,
    /// Guest user code seen from the host: no maps are known.
    GuestUser,
    Unknown,
}

impl ImageRef {
    /// The name printed in reports before symbolization refines it.
    pub fn display_name(&self) -> Arc<str> {
        match self {
            ImageRef::Kernel => KERNEL_IMAGE.into(),
            ImageRef::GuestKernel => GUEST_KERNEL_IMAGE.into(),
            ImageRef::File { path, .. } => path.clone(),
            ImageRef::Anon => ANON_IMAGE.into(),
            ImageRef::GuestUser => "[guest.user]".into(),
            ImageRef::Unknown => UNKNOWN_IMAGE.into(),
        }
    }
}

/// An address made relative to its image.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NormalizedFrame {
    pub image: ImageRef,
    /// File offset for [`ImageRef::File`]; the absolute address otherwise.
    pub addr: u64,
}

#[derive(Debug, Clone, Default)]
struct Proc {
    comm: Option<Arc<str>>,
    /// Sorted by start; later mmaps replace overlapped ranges.
    maps: Vec<Mapping>,
}

/// Address spaces and names of every process seen.
#[derive(Debug, Default, Clone)]
pub struct ProcessTable {
    procs: HashMap<u32, Proc>,
    thread_comm: HashMap<u32, Arc<str>>,
}

/// True for paths that name no file: `[heap]`, `//anon`, `[anon:...]`, memfd.
fn is_anonymous_path(path: &str) -> bool {
    path.is_empty()
        || path.starts_with("//anon")
        || path.starts_with("[anon")
        || path.starts_with("/memfd:")
        || path.starts_with("[heap")
        || path.starts_with("[stack")
        || path.starts_with("/dev/zero")
        || path.starts_with("anon_inode:")
}

impl ProcessTable {
    pub fn new() -> ProcessTable {
        ProcessTable::default()
    }

    /// Apply one non-sample record.
    pub fn apply(&mut self, rec: &Record) {
        match rec {
            Record::Mmap {
                pid,
                start,
                len,
                pgoff,
                path,
                build_id,
                executable,
                ..
            } => {
                if *pid == u32::MAX || !*executable || *len == 0 {
                    return;
                }
                let m = Mapping {
                    start: *start,
                    end: start.saturating_add(*len),
                    pgoff: *pgoff,
                    path: path.clone(),
                    build_id: build_id.clone(),
                };
                self.add_mapping(*pid, m);
            }
            Record::Comm {
                pid,
                tid,
                comm,
                exec,
                ..
            } => {
                let p = self.procs.entry(*pid).or_default();
                if *exec {
                    p.maps.clear();
                }
                if pid == tid {
                    p.comm = Some(comm.clone());
                }
                self.thread_comm.insert(*tid, comm.clone());
            }
            Record::Fork {
                pid,
                ppid,
                tid,
                ptid,
                ..
            } => {
                if pid != ppid && pid == tid {
                    // New process: copy the parent's address space and name.
                    let parent = self.procs.get(ppid).cloned().unwrap_or_default();
                    self.procs.insert(*pid, parent);
                }
                if let Some(c) = self.thread_comm.get(ptid).cloned() {
                    self.thread_comm.entry(*tid).or_insert(c);
                }
            }
            Record::Exit { .. }
            | Record::Sample(_)
            | Record::Lost { .. }
            | Record::Ksymbol { .. } => {}
        }
    }

    /// Insert a mapping, trimming or dropping the ones it overlaps.
    pub fn add_mapping(&mut self, pid: u32, m: Mapping) {
        let p = self.procs.entry(pid).or_default();
        let mut kept = Vec::with_capacity(p.maps.len() + 1);
        for old in p.maps.drain(..) {
            if old.end <= m.start || old.start >= m.end {
                kept.push(old);
                continue;
            }
            if old.start < m.start {
                kept.push(Mapping {
                    end: m.start,
                    ..old.clone()
                });
            }
            if old.end > m.end {
                kept.push(Mapping {
                    start: m.end,
                    pgoff: old.pgoff + (m.end - old.start),
                    ..old
                });
            }
        }
        kept.push(m);
        kept.sort_by_key(|m| m.start);
        p.maps = kept;
    }

    /// Set a process name seen outside the stream (e.g. /proc at start).
    pub fn set_comm(&mut self, pid: u32, tid: u32, comm: &str) {
        let c: Arc<str> = comm.into();
        if pid == tid {
            self.procs.entry(pid).or_default().comm = Some(c.clone());
        }
        self.thread_comm.insert(tid, c);
    }

    /// The process name (the thread-group leader's comm), else the thread's.
    pub fn comm(&self, pid: u32, tid: u32) -> Arc<str> {
        if pid == 0 && tid == 0 {
            return "swapper".into();
        }
        self.procs
            .get(&pid)
            .and_then(|p| p.comm.clone())
            .or_else(|| self.thread_comm.get(&tid).cloned())
            .or_else(|| self.thread_comm.get(&pid).cloned())
            .unwrap_or_else(|| format!(":{pid}").into())
    }

    /// The thread's own name (e.g. `CPU 0/TCG`).
    pub fn thread_comm(&self, tid: u32) -> Option<Arc<str>> {
        self.thread_comm.get(&tid).cloned()
    }

    /// The mapping covering `addr` in `pid`.
    pub fn find(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        let p = self.procs.get(&pid)?;
        let i = p.maps.partition_point(|m| m.start <= addr);
        if i == 0 {
            return None;
        }
        let m = &p.maps[i - 1];
        (addr < m.end).then_some(m)
    }

    /// Make `addr` relative to its image.
    pub fn normalize(&self, pid: u32, addr: u64, mode: CpuMode) -> NormalizedFrame {
        match mode {
            CpuMode::Kernel | CpuMode::Hypervisor => NormalizedFrame {
                image: ImageRef::Kernel,
                addr,
            },
            CpuMode::GuestKernel => NormalizedFrame {
                image: ImageRef::GuestKernel,
                addr,
            },
            CpuMode::GuestUser => NormalizedFrame {
                image: ImageRef::GuestUser,
                addr,
            },
            CpuMode::User | CpuMode::Unknown => {
                // Kernel addresses with an unknown mode still go to kallsyms.
                if mode == CpuMode::Unknown && addr >= 0xffff_8000_0000_0000 {
                    return NormalizedFrame {
                        image: ImageRef::Kernel,
                        addr,
                    };
                }
                match self.find(pid, addr) {
                    Some(m) if is_anonymous_path(&m.path) => NormalizedFrame {
                        image: ImageRef::Anon,
                        addr,
                    },
                    Some(m) => NormalizedFrame {
                        image: ImageRef::File {
                            path: m.path.clone(),
                            build_id: m.build_id.clone(),
                        },
                        addr: addr - m.start + m.pgoff,
                    },
                    None => NormalizedFrame {
                        image: ImageRef::Unknown,
                        addr,
                    },
                }
            }
        }
    }

    /// Number of processes known.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mmap(pid: u32, start: u64, len: u64, pgoff: u64, path: &str) -> Record {
        Record::Mmap {
            pid,
            tid: pid,
            start,
            len,
            pgoff,
            path: path.into(),
            build_id: None,
            executable: true,
            time: 0,
        }
    }

    #[test]
    fn normalizes_file_offsets_and_anon() {
        let mut t = ProcessTable::new();
        t.apply(&mmap(10, 0x40_0000, 0x1000, 0x2000, "/bin/x"));
        t.apply(&mmap(10, 0x7f00_0000, 0x1000, 0, "//anon"));
        let f = t.normalize(10, 0x40_0010, CpuMode::User);
        assert_eq!(f.addr, 0x2010);
        assert!(matches!(f.image, ImageRef::File { ref path, .. } if &**path == "/bin/x"));
        assert_eq!(
            t.normalize(10, 0x7f00_0001, CpuMode::User).image,
            ImageRef::Anon
        );
        assert_eq!(t.normalize(10, 0x1, CpuMode::User).image, ImageRef::Unknown);
        assert_eq!(
            t.normalize(10, 0xffff_ffff_8100_0000, CpuMode::Kernel)
                .image,
            ImageRef::Kernel
        );
    }

    #[test]
    fn fork_copies_and_exec_clears() {
        let mut t = ProcessTable::new();
        t.apply(&mmap(1, 0x1000, 0x1000, 0, "/bin/sh"));
        t.apply(&Record::Comm {
            pid: 1,
            tid: 1,
            comm: "sh".into(),
            exec: false,
            time: 0,
        });
        t.apply(&Record::Fork {
            pid: 2,
            ppid: 1,
            tid: 2,
            ptid: 1,
            time: 1,
        });
        assert!(t.find(2, 0x1800).is_some());
        assert_eq!(&*t.comm(2, 2), "sh");
        t.apply(&Record::Comm {
            pid: 2,
            tid: 2,
            comm: "ls".into(),
            exec: true,
            time: 2,
        });
        assert!(t.find(2, 0x1800).is_none());
        assert_eq!(&*t.comm(2, 2), "ls");
        // The parent keeps its maps.
        assert!(t.find(1, 0x1800).is_some());
    }

    #[test]
    fn overlapping_mmap_trims_old_ranges() {
        let mut t = ProcessTable::new();
        t.apply(&mmap(1, 0x1000, 0x3000, 0, "/a"));
        t.apply(&mmap(1, 0x2000, 0x1000, 0, "/b"));
        assert_eq!(&*t.find(1, 0x1800).unwrap().path, "/a");
        assert_eq!(&*t.find(1, 0x2800).unwrap().path, "/b");
        let tail = t.find(1, 0x3800).unwrap();
        assert_eq!(&*tail.path, "/a");
        assert_eq!(tail.pgoff, 0x2000);
        let f = t.normalize(1, 0x3800, CpuMode::User);
        assert_eq!(f.addr, 0x2800);
    }
}
