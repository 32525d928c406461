//! NUMA placement (theurer2006 §4.1): the host's nodes with their CPUs and
//! memory, where each VM's vCPU threads may run and last ran, where its
//! memory is, and the verdict whether vCPUs and memory sit on different
//! nodes. Pure types and arithmetic: `vmscope_linux::numa` reads the
//! inputs from `/sys` and `/proc`, `vmscope topo` prints the result.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One NUMA node of the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// `N` of `nodeN`.
    pub id: u32,
    /// Its CPUs (empty for a memory-only node).
    pub cpus: Vec<u32>,
    /// `MemTotal` and `MemFree` of the node, in bytes.
    pub mem_total_bytes: u64,
    pub mem_free_bytes: u64,
}

/// The host's nodes, by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub nodes: Vec<NumaNode>,
    /// Set when the kernel shows no nodes (no `/sys/devices/system/node`,
    /// a kernel without `CONFIG_NUMA`): why, and that one node was made
    /// of every CPU and the whole memory.
    pub synthesized: Option<String>,
}

impl Topology {
    /// The node a CPU belongs to.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    /// The nodes of some CPUs, sorted, each once (CPUs of no node left out).
    pub fn nodes_of(&self, cpus: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = cpus.iter().filter_map(|&c| self.node_of_cpu(c)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Resident memory of a process by node (`/proc/PID/numa_maps`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMemory {
    /// Bytes by node id.
    pub by_node: BTreeMap<u32, u64>,
    /// Lines of `numa_maps` that could not be parsed and were left out.
    pub skipped_lines: u32,
}

impl NodeMemory {
    pub fn total(&self) -> u64 {
        self.by_node.values().sum()
    }
}

/// Bytes on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBytes {
    pub node: u32,
    pub bytes: u64,
}

/// One vCPU thread: where it may run (affinity) and where it last ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuPlacement {
    pub tid: u32,
    /// vCPU index, when known.
    pub index: Option<u32>,
    /// `Cpus_allowed_list` of the thread.
    pub allowed_cpus: Vec<u32>,
    /// The nodes of those CPUs.
    pub allowed_nodes: Vec<u32>,
    /// Field 39 (`processor`) of the thread's `stat`.
    pub last_cpu: u32,
    /// The node of that CPU.
    pub last_node: Option<u32>,
}

impl VcpuPlacement {
    /// A vCPU thread's CPUs, mapped to the nodes of `topo`.
    pub fn new(
        topo: &Topology,
        tid: u32,
        index: Option<u32>,
        allowed_cpus: Vec<u32>,
        last_cpu: u32,
    ) -> VcpuPlacement {
        VcpuPlacement {
            tid,
            index,
            allowed_nodes: topo.nodes_of(&allowed_cpus),
            allowed_cpus,
            last_cpu,
            last_node: topo.node_of_cpu(last_cpu),
        }
    }
}

/// Whether a VM's vCPUs and memory share nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// At most the threshold's share of its memory is on nodes its vCPUs
    /// do not run on.
    Local,
    /// More than the threshold is remote to its vCPUs (theurer2006 §4.1's
    /// "Remote" case): flagged.
    Remote,
    /// Not decidable: no vCPU thread or no resident memory was found.
    Unknown,
}

/// One VM's placement and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmPlacement {
    pub name: String,
    pub pid: u32,
    pub vcpus: Vec<VcpuPlacement>,
    /// Nodes the vCPU threads last ran on: where the VM computes.
    pub vcpu_nodes: Vec<u32>,
    /// Nodes the vCPU threads may run on (union of their affinities).
    pub allowed_nodes: Vec<u32>,
    /// Resident memory by node, every node of the host listed.
    pub memory: Vec<NodeBytes>,
    pub memory_bytes: u64,
    /// Memory on nodes not in `vcpu_nodes`.
    pub remote_bytes: u64,
    /// `remote_bytes / memory_bytes` in percent (0 when nothing is resident).
    pub remote_percent: f64,
    pub verdict: Verdict,
    /// One sentence: the verdict and its numbers.
    pub summary: String,
    /// `numa_maps` lines left out as malformed.
    pub skipped_numa_maps_lines: u32,
    /// What could not be read, and why.
    pub warnings: Vec<String>,
}

/// Nodes as `0`, `0,1`, or `none`.
pub fn node_list(nodes: &[u32]) -> String {
    if nodes.is_empty() {
        return "none".into();
    }
    nodes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `node 1` or `nodes 0,1`.
pub fn nodes_phrase(nodes: &[u32]) -> String {
    if nodes.len() == 1 {
        format!("node {}", nodes[0])
    } else {
        format!("nodes {}", node_list(nodes))
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Judge one VM: its memory on nodes its vCPUs did not last run on is
/// remote; more than `threshold_percent` of it remote flags the VM.
pub fn assess(
    topo: &Topology,
    name: &str,
    pid: u32,
    vcpus: Vec<VcpuPlacement>,
    memory: &NodeMemory,
    threshold_percent: f64,
    warnings: Vec<String>,
) -> VmPlacement {
    let mut vcpu_nodes: Vec<u32> = vcpus.iter().filter_map(|v| v.last_node).collect();
    vcpu_nodes.sort_unstable();
    vcpu_nodes.dedup();
    let mut allowed_nodes: Vec<u32> = vcpus
        .iter()
        .flat_map(|v| v.allowed_nodes.iter().copied())
        .collect();
    allowed_nodes.sort_unstable();
    allowed_nodes.dedup();
    let mut by_node: BTreeMap<u32, u64> = topo.nodes.iter().map(|n| (n.id, 0)).collect();
    for (&n, &b) in &memory.by_node {
        *by_node.entry(n).or_default() += b;
    }
    let memory_bytes = memory.total();
    let remote_bytes: u64 = by_node
        .iter()
        .filter(|(n, _)| !vcpu_nodes.contains(n))
        .map(|(_, b)| *b)
        .sum();
    let remote_percent = if memory_bytes == 0 {
        0.0
    } else {
        100.0 * remote_bytes as f64 / memory_bytes as f64
    };
    let remote_nodes: Vec<u32> = by_node
        .iter()
        .filter(|(n, b)| **b > 0 && !vcpu_nodes.contains(n))
        .map(|(n, _)| *n)
        .collect();
    let (verdict, mut summary) = if vcpus.is_empty() || vcpu_nodes.is_empty() {
        (
            Verdict::Unknown,
            "unknown: no vCPU thread with a known node".to_string(),
        )
    } else if memory_bytes == 0 {
        (
            Verdict::Unknown,
            "unknown: no resident memory in numa_maps".to_string(),
        )
    } else if remote_percent > threshold_percent {
        (
            Verdict::Remote,
            format!(
                "REMOTE: vCPUs run on {}, {:.1} % of its memory ({}) is on {}",
                nodes_phrase(&vcpu_nodes),
                remote_percent,
                mib(remote_bytes),
                nodes_phrase(&remote_nodes)
            ),
        )
    } else {
        (
            Verdict::Local,
            format!(
                "local: vCPUs run on {}, {:.1} % of its memory ({}) is remote",
                nodes_phrase(&vcpu_nodes),
                remote_percent,
                mib(remote_bytes)
            ),
        )
    };
    if allowed_nodes.len() > vcpu_nodes.len() && verdict != Verdict::Unknown {
        summary.push_str(&format!(
            "; affinity allows {}, so the kernel may move vCPUs away from their memory",
            nodes_phrase(&allowed_nodes)
        ));
    }
    VmPlacement {
        name: name.to_string(),
        pid,
        vcpus,
        vcpu_nodes,
        allowed_nodes,
        memory: by_node
            .into_iter()
            .map(|(node, bytes)| NodeBytes { node, bytes })
            .collect(),
        memory_bytes,
        remote_bytes,
        remote_percent,
        verdict,
        summary,
        skipped_numa_maps_lines: memory.skipped_lines,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> Topology {
        Topology {
            nodes: vec![
                NumaNode {
                    id: 0,
                    cpus: vec![0, 1],
                    mem_total_bytes: 1 << 30,
                    mem_free_bytes: 1 << 29,
                },
                NumaNode {
                    id: 1,
                    cpus: vec![2, 3],
                    mem_total_bytes: 1 << 30,
                    mem_free_bytes: 1 << 29,
                },
            ],
            synthesized: None,
        }
    }

    fn mem(pairs: &[(u32, u64)]) -> NodeMemory {
        NodeMemory {
            by_node: pairs.iter().copied().collect(),
            skipped_lines: 0,
        }
    }

    #[test]
    fn nodes_of_cpus() {
        let t = two_nodes();
        assert_eq!(t.node_of_cpu(3), Some(1));
        assert_eq!(t.node_of_cpu(9), None);
        assert_eq!(t.nodes_of(&[3, 0, 1, 9]), vec![0, 1]);
    }

    #[test]
    fn remote_memory_is_flagged_local_is_not() {
        let t = two_nodes();
        let v = |tid, last| VcpuPlacement::new(&t, tid, Some(0), vec![2, 3], last);
        let split = assess(
            &t,
            "split",
            1,
            vec![v(10, 2), v(11, 3)],
            &mem(&[(0, 3 << 20), (1, 1 << 20)]),
            10.0,
            vec![],
        );
        assert_eq!(split.verdict, Verdict::Remote);
        assert_eq!(split.vcpu_nodes, vec![1]);
        assert_eq!(split.remote_bytes, 3 << 20);
        assert!((split.remote_percent - 75.0).abs() < 1e-9);
        assert!(split.summary.contains("75.0 %"), "{}", split.summary);
        assert!(split.summary.contains("on node 0"), "{}", split.summary);
        let local = assess(
            &t,
            "local",
            2,
            vec![v(20, 2)],
            &mem(&[(0, 1 << 20), (1, 99 << 20)]),
            10.0,
            vec![],
        );
        assert_eq!(local.verdict, Verdict::Local);
        assert!((local.remote_percent - 1.0).abs() < 1e-9);
        // Every node is listed, with zero where nothing is resident.
        let none = assess(&t, "x", 3, vec![v(30, 0)], &mem(&[]), 10.0, vec![]);
        assert_eq!(none.verdict, Verdict::Unknown);
        assert_eq!(none.memory.len(), 2);
        let novcpu = assess(&t, "y", 4, vec![], &mem(&[(0, 1)]), 10.0, vec![]);
        assert_eq!(novcpu.verdict, Verdict::Unknown);
    }

    #[test]
    fn affinity_wider_than_where_vcpus_run_is_said() {
        let t = two_nodes();
        let v = VcpuPlacement::new(&t, 1, Some(0), vec![0, 1, 2, 3], 0);
        assert_eq!(v.allowed_nodes, vec![0, 1]);
        let p = assess(&t, "u", 1, vec![v], &mem(&[(0, 10)]), 10.0, vec![]);
        assert_eq!(p.verdict, Verdict::Local);
        assert!(
            p.summary.contains("affinity allows nodes 0,1"),
            "{}",
            p.summary
        );
    }
}
