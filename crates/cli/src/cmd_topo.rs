//! `vmscope topo`: the host's NUMA nodes and, for every QEMU VM, the nodes
//! of its vCPU threads (affinity and where each last ran) and of its
//! memory, flagging VMs whose vCPUs and memory sit on different nodes
//! (theurer2006 §4.1). This module turns arguments into reads through
//! `vmscope_linux::numa` (rooted `/sys` and `/proc`), VMs from
//! `vmscope-discover` (as `vms` finds them), verdicts from
//! `vmscope_model::numa`, and prints them.

use anyhow::Context;
use clap::{Args, ValueEnum};
use comfy_table::{presets, ContentArrangement, Table};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vmscope_discover::{discover, DiscoverOptions, Vm};
use vmscope_linux::numa;
use vmscope_linux::procfs::ProcRoot;
use vmscope_model::numa::{assess, node_list, Topology, VcpuPlacement, Verdict, VmPlacement};

/// How to print the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopoFormat {
    /// Tables of nodes and VMs and one verdict line per VM, for people.
    Table,
    /// One JSON object (topology, threshold, VMs) with every field, for scripts.
    Json,
}

/// `topo --help`'s closing examples (also after `-h`).
const EXAMPLES: &str = "Examples:\n  \
vmscope topo                                     nodes, and where each VM runs and lives\n  \
vmscope topo --remote-threshold 5 --format json  flag VMs with more than 5 % remote memory";

/// `topo --help`: what it reads and shows, then the examples.
fn long_help() -> String {
    format!("{LONG_HELP}\n\n{EXAMPLES}")
}

const LONG_HELP: &str = "Lists the host's NUMA nodes (CPUs, total and free memory from \
/sys/devices/system/node/nodeN/{cpulist,meminfo}) and, for every QEMU VM that `vmscope vms` \
finds, the nodes of its vCPU threads (their affinity, Cpus_allowed_list of \
/proc/PID/task/TID/status, and the CPU each last ran on, field 39 of its stat) and of its \
resident memory (/proc/PID/numa_maps: pages per node times the mapping's page size, file pages \
included).\n\n\
A VM whose memory lies on nodes its vCPUs do not run on pays remote memory latency and \
interconnect bandwidth on every access (theurer2006 §4.1). It is flagged REMOTE when more than \
--remote-threshold percent of its memory is on such nodes. A VM whose affinity allows more \
nodes than it runs on is told so: the kernel may move its vCPUs away from their memory.\n\n\
A kernel without NUMA support has no /sys/devices/system/node: one node is made of every \
CPU and /proc/meminfo, and the output says so. Run as root to read every VM's numa_maps.";

/// NUMA nodes, and where each VM's vCPUs and memory are.
#[derive(Args, Debug)]
#[command(
    after_help = EXAMPLES,
    after_long_help = long_help()
)]
pub struct TopoArgs {
    /// Output format: `table` (node and VM tables, a verdict line per VM,
    /// warnings on stderr) or `json` (one object, warnings included).
    #[arg(long, value_enum, default_value_t = TopoFormat::Table)]
    pub format: TopoFormat,

    /// Flag a VM when more than this percentage of its resident memory is
    /// on nodes its vCPUs did not last run on.
    #[arg(long, value_name = "PCT", default_value_t = 10.0,
          value_parser = percent, allow_negative_numbers = true)]
    pub remote_threshold: f64,

    /// Do not connect to QMP monitors: vCPU threads from thread names only
    /// (as `vms --no-qmp`).
    #[arg(long)]
    pub no_qmp: bool,

    /// Read this directory instead of /proc (a fixture tree, or a copy).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// Read this directory instead of /sys (a fixture tree, or a copy).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sys_root: PathBuf,
}

/// A percentage from 0 to 100.
fn percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..100.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "must be a percentage of at least 0 and below 100, not {s}"
        )),
    }
}

/// What `topo` found: printed as tables or as JSON.
#[derive(Debug, Serialize)]
pub struct TopoReport {
    pub topology: Topology,
    pub remote_threshold_percent: f64,
    pub vms: Vec<VmPlacement>,
}

/// Read the topology and every VM's placement.
pub fn collect(args: &TopoArgs) -> anyhow::Result<TopoReport> {
    let proc = ProcRoot::new(&args.proc_root);
    let topology = numa::topology(&args.sys_root, &proc).with_context(|| {
        format!(
            "reading NUMA nodes under --sys-root {}",
            args.sys_root.display()
        )
    })?;
    let vms = discover(&DiscoverOptions {
        proc_root: args.proc_root.clone(),
        query_qmp: !args.no_qmp,
        qmp_timeout: Duration::from_secs(1),
    })?;
    let page = numa::page_size();
    let vms = vms
        .iter()
        .filter_map(|vm| placement(&proc, &topology, vm, page, args.remote_threshold))
        .collect();
    Ok(TopoReport {
        topology,
        remote_threshold_percent: args.remote_threshold,
        vms,
    })
}

/// One VM's placement; `None` when its process is gone.
fn placement(
    proc: &ProcRoot,
    topo: &Topology,
    vm: &Vm,
    page: u64,
    threshold: f64,
) -> Option<VmPlacement> {
    let mut warnings = vm.warnings.clone();
    let mut vcpus = Vec::new();
    for t in &vm.vcpus {
        let allowed = numa::allowed_cpus(proc, vm.pid, t.tid);
        let stat = proc.task_stat(vm.pid, t.tid);
        match (allowed, stat) {
            (Ok(a), Ok(s)) => {
                vcpus.push(VcpuPlacement::new(topo, t.tid, t.index, a, s.processor));
            }
            (Err(e), _) | (_, Err(e)) if e.is_vanished() => {}
            (Err(e), _) | (_, Err(e)) => warnings.push(format!("vCPU thread {}: {e}", t.tid)),
        }
    }
    let memory = match numa::numa_maps(proc, vm.pid, page) {
        Ok(m) => m,
        Err(e) if e.is_vanished() => return None,
        Err(e) => {
            warnings.push(e.to_string());
            Default::default()
        }
    };
    Some(assess(
        topo, &vm.name, vm.pid, vcpus, &memory, threshold, warnings,
    ))
}

pub fn run(args: TopoArgs) -> anyhow::Result<ExitCode> {
    let report = collect(&args)?;
    let mut out = std::io::stdout().lock();
    match args.format {
        TopoFormat::Json => {
            serde_json::to_writer_pretty(&mut out, &report)?;
            writeln!(out)?;
        }
        TopoFormat::Table => {
            write!(out, "{}", text(&report, &args.sys_root))?;
            out.flush()?;
            let mut err = std::io::stderr().lock();
            for vm in &report.vms {
                for w in &vm.warnings {
                    writeln!(
                        err,
                        "vmscope: warning: {}: {}",
                        vmscope_model::text::visible_cut(&vm.name, vmscope_model::text::NAME_WIDTH),
                        vmscope_model::text::visible(w)
                    )?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

const MIB: f64 = 1024.0 * 1024.0;

fn new_table() -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic);
    t
}

/// The whole text output: nodes, VMs, one verdict line per VM.
pub fn text(r: &TopoReport, sys_root: &std::path::Path) -> String {
    let mut s = String::new();
    match &r.topology.synthesized {
        Some(why) => s.push_str(&format!("NUMA nodes: one, synthesized: {why}\n")),
        None => s.push_str(&format!(
            "NUMA nodes ({}):\n",
            sys_root.join("devices/system/node").display()
        )),
    }
    let mut nodes = new_table();
    nodes.set_header(["NODE", "CPUS", "MEMORY (MiB)", "FREE (MiB)", "FREE (%)"]);
    for n in &r.topology.nodes {
        nodes.add_row([
            n.id.to_string(),
            if n.cpus.is_empty() {
                "none".into()
            } else {
                cpu_ranges(&n.cpus)
            },
            format!("{:.1}", n.mem_total_bytes as f64 / MIB),
            format!("{:.1}", n.mem_free_bytes as f64 / MIB),
            if n.mem_total_bytes == 0 {
                "-".into()
            } else {
                format!(
                    "{:.1}",
                    100.0 * n.mem_free_bytes as f64 / n.mem_total_bytes as f64
                )
            },
        ]);
    }
    s.push_str(&format!("{nodes}\n"));
    if r.vms.is_empty() {
        s.push_str("no QEMU VMs found on this host\n");
        return s;
    }
    s.push_str(&format!(
        "VMs (REMOTE: more than {} % of resident memory on nodes its vCPUs did not last run on):\n",
        r.remote_threshold_percent
    ));
    let mut vms = new_table();
    vms.set_header([
        "VM",
        "PID",
        "vCPU (tid): LAST CPU (NODE)",
        "ALLOWED CPUS (NODES)",
        "MEMORY BY NODE (MiB)",
        "REMOTE (% of memory)",
        "PLACEMENT",
    ]);
    for vm in &r.vms {
        let vcpu = |v: &VcpuPlacement| {
            let idx = v.index.map_or("all".to_string(), |i| i.to_string());
            let node = v.last_node.map_or("?".to_string(), |n| n.to_string());
            format!("{idx} ({}): {} ({node})", v.tid, v.last_cpu)
        };
        let allowed = |v: &VcpuPlacement| {
            format!(
                "{} ({})",
                cpu_ranges(&v.allowed_cpus),
                node_list(&v.allowed_nodes)
            )
        };
        vms.add_row([
            vmscope_model::text::visible_cut(&vm.name, vmscope_model::text::NAME_WIDTH)
                .into_owned(),
            vm.pid.to_string(),
            lines(vm.vcpus.iter().map(vcpu), "unknown"),
            lines(vm.vcpus.iter().map(allowed), "unknown"),
            lines(
                vm.memory
                    .iter()
                    .map(|m| format!("{}: {:.1}", m.node, m.bytes as f64 / MIB)),
                "none",
            ),
            format!("{:.1}", vm.remote_percent),
            match vm.verdict {
                Verdict::Local => "local",
                Verdict::Remote => "REMOTE",
                Verdict::Unknown => "unknown",
            }
            .to_string(),
        ]);
    }
    s.push_str(&format!("{vms}\n"));
    for vm in &r.vms {
        s.push_str(&format!(
            "{}: {}",
            vmscope_model::text::visible_cut(&vm.name, vmscope_model::text::NAME_WIDTH),
            vmscope_model::text::visible(&vm.summary)
        ));
        if vm.skipped_numa_maps_lines > 0 {
            s.push_str(&format!(
                " ({} malformed numa_maps line{} left out)",
                vm.skipped_numa_maps_lines,
                if vm.skipped_numa_maps_lines == 1 {
                    ""
                } else {
                    "s"
                }
            ));
        }
        s.push('\n');
    }
    s
}

fn lines(items: impl Iterator<Item = String>, empty: &str) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        empty.to_string()
    } else {
        v.join("\n")
    }
}

/// CPUs as the kernel writes them: `0-3,8,10-11`.
fn cpu_ranges(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            end += 1;
            i += 1;
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TopoArgs,
    }

    #[test]
    fn arguments() {
        let c = Cli::try_parse_from(["topo"]).expect("defaults");
        assert_eq!(c.args.format, TopoFormat::Table);
        assert_eq!(c.args.sys_root, PathBuf::from("/sys"));
        assert_eq!(c.args.proc_root, PathBuf::from("/proc"));
        assert!((c.args.remote_threshold - 10.0).abs() < 1e-12);
        let c = Cli::try_parse_from(["topo", "--format", "json", "--remote-threshold", "0"])
            .expect("flags");
        assert_eq!(c.args.format, TopoFormat::Json);
        assert!(Cli::try_parse_from(["topo", "--remote-threshold", "100"]).is_err());
        assert!(Cli::try_parse_from(["topo", "--remote-threshold", "-1"]).is_err());
        assert!(Cli::try_parse_from(["topo", "--format", "csv"]).is_err());
    }

    #[test]
    fn cpu_ranges_like_the_kernel() {
        assert_eq!(cpu_ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_ranges(&[5]), "5");
        assert_eq!(cpu_ranges(&[]), "");
    }
}
