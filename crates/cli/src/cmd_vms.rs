//! `vmscope vms`: every QEMU VM on this host, started by the lab or not,
//! with the threads, disks, taps and monitor that `record`, `stat` and
//! `account` use to turn threads into VMs. This module only turns arguments
//! into [`DiscoverOptions`] and prints the result; discovery lives in
//! `vmscope-discover`.

use anyhow::Context;
use clap::{Args, ValueEnum};
use comfy_table::{presets, ContentArrangement, Table};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vmscope_discover::{discover, DiscoverOptions, Disk, ThreadKind, Vm};
use vmscope_model::text::{visible, visible_cut, NAME_WIDTH};

/// How to print the VMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VmsFormat {
    /// One row per VM, for people.
    Table,
    /// A JSON array of VMs with every field, for scripts.
    Json,
}

/// `vms --help`'s closing examples (also after `-h`).
const EXAMPLES: &str = "Examples:\n  \
vmscope vms                         every QEMU VM, lab or not\n  \
vmscope vms --format json --no-qmp  every field, without asking the QMP monitors";

/// `vms --help`: what it reads and shows, then the examples.
fn long_help() -> String {
    format!("{LONG_HELP}\n\n{EXAMPLES}")
}

const LONG_HELP: &str = "List every QEMU VM on this host, started by `vmscope lab`, libvirt \
or by hand: its name, pid, accelerator (KVM or TCG), vCPU threads (thread id → vCPU index), \
the other QEMU threads (main loop, I/O threads, workers), vhost workers (threads of QEMU, or \
kernel threads on kernels before 6.4), disks with their backing files, tap interfaces and QMP \
socket.\n\n\
Everything comes from /proc and the QEMU command line, and from each VM's QMP monitor when it \
answers (authoritative vCPU threads, accelerator and disks). vCPU threads are named only when \
QEMU runs with `-name NAME,debug-threads=on`; without that and without QMP they are reported as \
unknown. A monitor held by another client (libvirtd) does not answer; use `--no-qmp` to skip \
waiting for it. When libvirt is installed and answers (`virsh`, `$LIBVIRT_DEFAULT_URI` or \
qemu:///system), a LIBVIRT column shows each VM's domain name, UUID and state; when it does not, \
one line says why and the VMs are listed from /proc. Run as root to see every VM's descriptors.";

/// List every QEMU VM on this host: threads, disks, taps, QMP.
#[derive(Args, Debug)]
#[command(
    after_help = EXAMPLES,
    after_long_help = long_help()
)]
pub struct VmsArgs {
    /// Output format: `table` (one row per VM, warnings on stderr) or
    /// `json` (an array of VMs with every field, warnings included).
    #[arg(long, value_enum, default_value_t = VmsFormat::Table)]
    pub format: VmsFormat,

    /// Do not connect to QMP monitors: report what /proc and the command
    /// line show (vCPU threads from thread names only).
    #[arg(long)]
    pub no_qmp: bool,

    /// How long to wait for each QMP monitor to connect and for each of its
    /// answers, in seconds. Monitors are asked in parallel.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0,
          value_parser = crate::args::seconds, allow_negative_numbers = true)]
    pub qmp_timeout: f64,

    /// Do not ask libvirt (`virsh`, `$LIBVIRT_DEFAULT_URI` or
    /// qemu:///system) for each VM's domain name, UUID and state.
    #[arg(long)]
    pub no_libvirt: bool,

    /// Read this directory instead of /proc (fixture trees in tests).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

pub fn run(args: VmsArgs) -> anyhow::Result<ExitCode> {
    let qmp_timeout = Duration::try_from_secs_f64(args.qmp_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| {
            format!(
                "--qmp-timeout must be a positive number of seconds, not {}",
                args.qmp_timeout
            )
        })?;
    let opts = DiscoverOptions {
        proc_root: args.proc_root,
        query_qmp: !args.no_qmp,
        qmp_timeout,
    };
    let mut vms = discover(&opts)?;
    if !args.no_libvirt {
        if let Some(line) = vmscope_discover::libvirt::annotate_from_env(&mut vms, qmp_timeout * 5)
        {
            eprintln!("vmscope: {}", visible(&line));
        }
    }
    let mut out = std::io::stdout().lock();
    match args.format {
        VmsFormat::Json => {
            serde_json::to_writer_pretty(&mut out, &vms)?;
            writeln!(out)?;
        }
        VmsFormat::Table if vms.is_empty() => writeln!(out, "no QEMU VMs found on this host")?,
        VmsFormat::Table => {
            writeln!(out, "{}", table(&vms, opts.query_qmp))?;
            out.flush()?;
            let mut err = std::io::stderr().lock();
            for vm in &vms {
                for w in &vm.warnings {
                    writeln!(
                        err,
                        "vmscope: warning: {}: {}",
                        visible_cut(&vm.name, NAME_WIDTH),
                        visible(w)
                    )?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn table(vms: &[Vm], query_qmp: bool) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header([
            "NAME",
            "PID",
            "ACCEL",
            "VCPUS (tid:idx)",
            "IO-THREADS",
            "VHOST",
            "DISKS",
            "TAPS",
            "QMP",
        ]);
    let libvirt = vms.iter().any(|v| v.libvirt.is_some());
    if libvirt {
        crate::cmd_vms_libvirt::add_header(&mut t);
    }
    for vm in vms {
        let mut row = comfy_table::Row::from([
            visible_cut(&vm.name, NAME_WIDTH).into_owned(),
            vm.pid.to_string(),
            vm.accel.as_str().to_string(),
            vcpus_cell(vm),
            io_cell(vm),
            vhost_cell(vm),
            vm.disks
                .iter()
                .map(disk_cell)
                .collect::<Vec<_>>()
                .join("\n"),
            vm.taps
                .iter()
                .map(|t| visible(t).into_owned())
                .collect::<Vec<_>>()
                .join("\n"),
            qmp_cell(vm, query_qmp),
        ]);
        if libvirt {
            row.add_cell(crate::cmd_vms_libvirt::cell(vm).into());
        }
        t.add_row(row);
    }
    t
}

/// `tid:idx`, four to a line; `unknown` when no thread could be told a vCPU.
fn vcpus_cell(vm: &Vm) -> String {
    if vm.vcpus.is_empty() {
        return "unknown".into();
    }
    let items: Vec<String> = vm
        .vcpus
        .iter()
        .map(|v| match v.index {
            Some(i) => format!("{}:{i}", v.tid),
            None => format!("{}:all", v.tid),
        })
        .collect();
    items
        .chunks(4)
        .map(|c| c.join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One line per kind of thread: `tids name`.
fn io_cell(vm: &Vm) -> String {
    let mut groups: BTreeMap<(u8, String), Vec<u32>> = BTreeMap::new();
    for t in &vm.io_threads {
        let (order, label) = match t.kind {
            ThreadKind::MainLoop => (0, "main loop".to_string()),
            ThreadKind::IoThread => (1, visible(&t.name).into_owned()),
            ThreadKind::Worker => (2, "worker".to_string()),
            ThreadKind::Unknown => (4, format!("{} (role unknown)", visible(&t.name))),
            ThreadKind::Vcpu | ThreadKind::Other => (3, visible(&t.name).into_owned()),
        };
        groups.entry((order, label)).or_default().push(t.tid);
    }
    groups
        .into_iter()
        .map(|((_, label), tids)| {
            let tids: Vec<String> = tids.iter().map(u32::to_string).collect();
            format!("{} {label}", tids.join(","))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn vhost_cell(vm: &Vm) -> String {
    vm.vhost
        .iter()
        .map(|w| {
            if w.kernel_thread {
                format!("{} (kthread)", w.tid)
            } else {
                w.tid.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `path [format,cache,aio,ro]`, then `<- backing` lines.
fn disk_cell(d: &Disk) -> String {
    let what = match (&d.file, &d.protocol, &d.id) {
        (Some(f), _, _) => visible(&f.display().to_string()).into_owned(),
        (None, Some(p), Some(id)) => visible(&format!("{p}:{id}")).into_owned(),
        (None, Some(p), None) => visible(p).into_owned(),
        (None, None, Some(id)) => visible(id).into_owned(),
        (None, None, None) => "?".into(),
    };
    let mut attrs: Vec<&str> = Vec::new();
    attrs.extend(d.format.as_deref());
    attrs.extend(d.cache.as_deref().map(|c| match c {
        "none" => "cache=none",
        "writeback" => "cache=writeback",
        "writethrough" => "cache=writethrough",
        "directsync" => "cache=directsync",
        "unsafe" => "cache=unsafe",
        _ => "cache=?",
    }));
    attrs.extend(d.aio.as_deref());
    if d.readonly {
        attrs.push("ro");
    }
    let mut s = if attrs.is_empty() {
        what
    } else {
        format!("{what} [{}]", attrs.join(","))
    };
    for b in &d.backing {
        s.push_str(&format!("\n  <- {}", visible(&b.display().to_string())));
    }
    s
}

fn qmp_cell(vm: &Vm, query_qmp: bool) -> String {
    match &vm.qmp {
        None => "-".into(),
        Some(p) if vm.qmp_used || !query_qmp => visible(&p.display().to_string()).into_owned(),
        Some(p) if vm.libvirt.is_some() => {
            format!("{} (held by libvirtd)", visible(&p.display().to_string()))
        }
        Some(p) => format!("{} (no answer)", visible(&p.display().to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: VmsArgs,
    }

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../discover/tests/fixtures")
            .join(name)
    }

    #[test]
    fn arguments() {
        let c = Cli::try_parse_from(["vms"]).expect("defaults");
        assert_eq!(c.args.format, VmsFormat::Table);
        assert!(!c.args.no_qmp);
        assert_eq!(c.args.proc_root, PathBuf::from("/proc"));
        let c = Cli::try_parse_from(["vms", "--format", "json", "--no-qmp", "--proc-root", "/x"])
            .expect("all flags");
        assert_eq!(c.args.format, VmsFormat::Json);
        assert!(c.args.no_qmp);
        assert!(Cli::try_parse_from(["vms", "--format", "csv"]).is_err());
    }

    #[test]
    fn table_of_fixture_vms() {
        let opts = DiscoverOptions {
            proc_root: fixture("new-kernel"),
            query_qmp: false,
            qmp_timeout: Duration::from_millis(100),
        };
        let vms = discover(&opts).expect("discover");
        let s = table(&vms, false).to_string();
        for want in [
            "instance-0001",
            "5204:0 5205:1",
            "5202 IO iothread1",
            "5200 main loop",
            "5206",
            "/var/lib/libvirt/images/instance-0001.qcow2 [qcow2,cache=none,native]",
            "<- /var/lib/libvirt/images/base-debian12.qcow2",
            "vnet7",
            "monitor.sock",
            "unknown",
            "(role unknown)",
        ] {
            assert!(s.contains(want), "{want:?} not in\n{s}");
        }
        let mut old = discover(&DiscoverOptions {
            proc_root: fixture("old-kernel"),
            ..opts
        })
        .expect("discover");
        assert!(table(&old, false).to_string().contains("3105 (kthread)"));
        old[0].qmp = Some("/x/qmp.sock".into());
        assert!(qmp_cell(&old[0], true).ends_with("(no answer)"));
    }

    #[test]
    fn runs_on_an_empty_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = VmsArgs {
            format: VmsFormat::Table,
            no_qmp: true,
            qmp_timeout: 1.0,
            no_libvirt: true,
            proc_root: dir.path().to_path_buf(),
        };
        assert_eq!(run(args).expect("run"), ExitCode::SUCCESS);
        let bad = VmsArgs {
            format: VmsFormat::Json,
            no_qmp: true,
            qmp_timeout: -1.0,
            no_libvirt: true,
            proc_root: dir.path().to_path_buf(),
        };
        assert!(run(bad).is_err());
    }
}
