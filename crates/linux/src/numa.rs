//! NUMA readers (theurer2006 §4.1), rooted like every reader of this crate:
//! the host's nodes from `<sys>/devices/system/node/nodeN/{cpulist,meminfo}`
//! (one node made of every CPU and `<proc>/meminfo` when the kernel shows
//! none), a thread's allowed CPUs (`Cpus_allowed_list` of its `status`) and
//! a process's resident memory by node (`numa_maps`). The types and the
//! verdict are `vmscope_model::numa`'s.
//!
//! Bad input: a node's `cpulist` or `meminfo` that cannot be parsed is an
//! error naming the file, since every CPU-to-node mapping and verdict rests
//! on it. A malformed `numa_maps` line is left out and counted
//! ([`NodeMemory::skipped_lines`]): the file belongs to a running process,
//! the rest of it still tells where the memory is, and the count is shown
//! beside the result.

use crate::procfs::ProcRoot;
use crate::sys::parse_cpu_list;
use crate::LinuxError;
use std::path::Path;
use vmscope_model::numa::{NodeMemory, NumaNode, Topology};

type Result<T> = std::result::Result<T, LinuxError>;

fn read(path: &Path) -> Result<String> {
    crate::files::read_bounded_string(path, crate::files::LARGE_FILE).map_err(|source| {
        LinuxError::Read {
            path: path.to_path_buf(),
            source,
        }
    })
}

fn parse_err(path: &Path, msg: impl Into<String>) -> LinuxError {
    LinuxError::Parse {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// The system's page size in bytes (the unit of `numa_maps` counts that
/// carry no `kernelpagesize_kB`).
pub fn page_size() -> u64 {
    crate::sys::page_size() as u64
}

/// The host's NUMA nodes under `sys_root` (normally `/sys`). Without
/// `<sys_root>/devices/system/node`, one node 0 of every online CPU and
/// `<proc>/meminfo`'s memory, with [`Topology::synthesized`] saying so.
/// Fails when `sys_root` itself is missing or a node's files are garbage.
pub fn topology(sys_root: &Path, proc: &ProcRoot) -> Result<Topology> {
    std::fs::metadata(sys_root).map_err(|source| LinuxError::Read {
        path: sys_root.to_path_buf(),
        source,
    })?;
    let dir = sys_root.join("devices/system/node");
    if !dir.is_dir() {
        return synthesized(sys_root, proc, &dir);
    }
    let mut ids: Vec<u32> = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|source| LinuxError::Read {
        path: dir.clone(),
        source,
    })? {
        let entry = entry.map_err(|source| LinuxError::Read {
            path: dir.clone(),
            source,
        })?;
        if let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse().ok())
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    if ids.is_empty() {
        return synthesized(sys_root, proc, &dir);
    }
    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        let node = dir.join(format!("node{id}"));
        let cpulist = node.join("cpulist");
        let text = read(&cpulist)?;
        // A memory-only node has an empty list.
        let cpus = if text.trim().is_empty() {
            Vec::new()
        } else {
            parse_cpu_list(&text).map_err(|msg| parse_err(&cpulist, msg))?
        };
        let meminfo = node.join("meminfo");
        let (total, free) = parse_meminfo(&read(&meminfo)?, &meminfo)?;
        nodes.push(NumaNode {
            id,
            cpus,
            mem_total_bytes: total,
            mem_free_bytes: free,
        });
    }
    Ok(Topology {
        nodes,
        synthesized: None,
    })
}

fn synthesized(sys_root: &Path, proc: &ProcRoot, dir: &Path) -> Result<Topology> {
    let cpus = match crate::sys::online_cpus(sys_root) {
        Ok(c) => c,
        Err(_) => proc.cpu_times()?.cpus.iter().map(|(c, _)| *c).collect(),
    };
    let meminfo = proc.root().join("meminfo");
    let (total, free) = parse_meminfo(&read(&meminfo)?, &meminfo)?;
    Ok(Topology {
        nodes: vec![NumaNode {
            id: 0,
            cpus,
            mem_total_bytes: total,
            mem_free_bytes: free,
        }],
        synthesized: Some(format!(
            "{} does not exist (a kernel without NUMA support): one node 0 made of every CPU and the memory of {}",
            dir.display(),
            meminfo.display()
        )),
    })
}

/// `MemTotal` and `MemFree` in bytes from a `meminfo` text, either the
/// system's (`MemTotal:  123 kB`) or a node's (`Node 0 MemTotal:  123 kB`).
pub fn parse_meminfo(text: &str, path: &Path) -> Result<(u64, u64)> {
    let mut total = None;
    let mut free = None;
    for line in text.lines() {
        let line = match line.strip_prefix("Node ") {
            Some(rest) => rest
                .trim_start()
                .split_once(' ')
                .map_or(rest, |(_, r)| r.trim_start()),
            None => line,
        };
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match key.trim() {
            "MemTotal" => &mut total,
            "MemFree" => &mut free,
            _ => continue,
        };
        let mut it = value.split_ascii_whitespace();
        let n: u64 = it.next().and_then(|v| v.parse().ok()).ok_or_else(|| {
            parse_err(
                path,
                format!("{}: '{}' is not a number", key.trim(), value.trim()),
            )
        })?;
        let unit = match it.next() {
            None => 1,
            Some("kB") => 1024,
            Some(u) => {
                return Err(parse_err(
                    path,
                    format!("{}: unknown unit '{u}'", key.trim()),
                ))
            }
        };
        *slot = Some(n.saturating_mul(unit));
    }
    match (total, free) {
        (Some(t), Some(f)) => Ok((t, f)),
        _ => Err(parse_err(path, "no MemTotal and MemFree lines")),
    }
}

/// `Cpus_allowed_list` of `<proc>/PID/task/TID/status`.
pub fn allowed_cpus(proc: &ProcRoot, pid: u32, tid: u32) -> Result<Vec<u32>> {
    let path = proc.task_path(pid, tid, "status");
    let text = read(&path)?;
    let list = text
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| parse_err(&path, "no Cpus_allowed_list line"))?;
    parse_cpu_list(list).map_err(|msg| parse_err(&path, format!("Cpus_allowed_list: {msg}")))
}

/// Resident memory of a process by node from `<proc>/PID/numa_maps`.
pub fn numa_maps(proc: &ProcRoot, pid: u32, default_page_size: u64) -> Result<NodeMemory> {
    let path = proc.pid_path(pid, "numa_maps");
    Ok(parse_numa_maps(&read(&path)?, default_page_size))
}

/// Sum the `N<node>=<pages>` fields of every line, each times its
/// mapping's `kernelpagesize_kB` (else `default_page_size`). A line that is
/// not `ADDRESS POLICY [key=value|flag]...` with numbers where numbers
/// belong is left out and counted.
pub fn parse_numa_maps(text: &str, default_page_size: u64) -> NodeMemory {
    let mut out = NodeMemory::default();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_numa_maps_line(line, default_page_size) {
            Some(pairs) => {
                for (node, bytes) in pairs {
                    let e = out.by_node.entry(node).or_default();
                    *e = e.saturating_add(bytes);
                }
            }
            None => out.skipped_lines += 1,
        }
    }
    out
}

fn parse_numa_maps_line(line: &str, default_page_size: u64) -> Option<Vec<(u32, u64)>> {
    let mut tokens = line.split_ascii_whitespace();
    u64::from_str_radix(tokens.next()?, 16).ok()?;
    let _policy = tokens.next()?;
    let mut page = default_page_size;
    let mut pages: Vec<(u32, u64)> = Vec::new();
    for t in tokens {
        if let Some(kb) = t.strip_prefix("kernelpagesize_kB=") {
            page = kb.parse::<u64>().ok()?.checked_mul(1024)?;
        } else if let Some(rest) = t.strip_prefix('N') {
            if let Some((node, n)) = rest.split_once('=') {
                pages.push((node.parse().ok()?, n.parse().ok()?));
            }
        }
    }
    Some(
        pages
            .into_iter()
            .map(|(node, n)| (node, n.saturating_mul(page)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_maps_lines() {
        let text = "\
7f0000000000 default anon=256 dirty=256 N0=200 N1=56 kernelpagesize_kB=4
7f0000100000 bind:1 anon=2 dirty=2 N1=2 kernelpagesize_kB=2048
55d000000000 default file=/usr/bin/qemu-system-x86_64 mapped=10 N0=10
7ffd00000000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4
zzzz default N0=1
7f0000200000 default N0=many kernelpagesize_kB=4
7f0000300000
";
        let m = parse_numa_maps(text, 4096);
        assert_eq!(m.skipped_lines, 3);
        assert_eq!(m.by_node[&0], (200 + 10 + 3) * 4096);
        assert_eq!(m.by_node[&1], 56 * 4096 + 2 * 2048 * 1024);
        // A line with no pages resident is not malformed.
        let empty = parse_numa_maps("7f0000000000 default file=/x\n", 4096);
        assert_eq!((empty.skipped_lines, empty.total()), (0, 0));
    }

    #[test]
    fn meminfo_of_nodes_and_system() {
        let p = Path::new("x");
        let node = "Node 1 MemTotal:       1024 kB\nNode 1 MemFree:         512 kB\nNode 1 MemUsed: 512 kB\n";
        assert_eq!(parse_meminfo(node, p).unwrap(), (1024 * 1024, 512 * 1024));
        let sys = "MemTotal:  2048 kB\nMemFree:  1024 kB\nMemAvailable: 1 kB\n";
        assert_eq!(parse_meminfo(sys, p).unwrap(), (2 << 20, 1 << 20));
        let e = parse_meminfo("Node 0 MemTotal: lots kB\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot parse x") && e.contains("'lots kB'"),
            "{e}"
        );
        assert!(parse_meminfo("", p).is_err());
    }
}
