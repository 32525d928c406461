//! The `vmscope` binary. Thin: each subcommand module turns its clap
//! arguments into a library options struct and calls one library function.
//! Errors are printed as one line `vmscope: error: ...` and exit with code 2
//! (128 + the signal's number for a command a signal interrupted).

mod args;
mod cmd_account;
mod cmd_bench;
mod cmd_bench_io;
mod cmd_bench_net;
mod cmd_bench_overhead;
mod cmd_bench_scale;
mod cmd_bench_web;
mod cmd_compare;
mod cmd_demo;
mod cmd_generate;
mod cmd_import;
mod cmd_lab;
mod cmd_record;
mod cmd_report;
mod cmd_serve;
mod cmd_stat;
mod cmd_top;
mod cmd_topo;
mod cmd_vms;
mod cmd_vms_libvirt;
mod signals;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// What `vmscope --version` prints after the name, and what every session
/// stores as `vmscope_version`: the version, the git commit and whether the
/// tree was dirty (`build.rs`; "unknown commit" outside a git checkout).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("VMSCOPE_BUILD"), ")");

/// Session metadata key holding [`VERSION`].
pub const VERSION_META_KEY: &str = "vmscope_version";

/// Where the CPU goes on a virtualization host: host, KVM/QEMU and every VM.
#[derive(Parser)]
#[command(
    name = "vmscope",
    version = VERSION,
    propagate_version = true,
    after_help = "Every command has its --help (and a man page: vmscope-record(1), vmscope-lab-up(1), ...). \
The guides, one per task, are docs/README.md in the source tree.\n\n\
Examples:\n  \
vmscope record -a -g -d 10            every CPU and every VM, call stacks, 10 s into vmscope.db\n  \
vmscope report --by domain,context    where the CPU went, per VM and context\n  \
vmscope top                           the host and every VM, live"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sample the host and its VMs into a session file (default vmscope.db).
    Record(cmd_record::RecordArgs),
    /// Print where the CPU went, from a session file.
    Report(cmd_report::ReportArgs),
    /// Compare sessions of several configurations against a base (event ratios, deltas).
    Compare(cmd_compare::CompareArgs),
    /// Turn a perf.data file into a session.
    Import(cmd_import::ImportArgs),
    /// Run the built-in demo workload (three functions at 50/30/20 % of its CPU).
    Demo(cmd_demo::DemoArgs),
    /// Boot, use and tear down VM setups described by a spec file.
    Lab(cmd_lab::LabArgs),
    /// List every QEMU VM on this host: threads, disks, taps, QMP.
    Vms(cmd_vms::VmsArgs),
    /// vm-stat: each host CPU's busy % per interval, split by VM vCPU.
    Stat(cmd_stat::StatArgs),
    /// Per VM and interval: vCPU run/steal/halt, direct and shared I/O CPU.
    Account(cmd_account::AccountArgs),
    /// Serve Prometheus metrics (/metrics) of every VM on this host.
    Serve(cmd_serve::ServeArgs),
    /// The host and every VM live: CPU, vCPU states, I/O, top functions.
    Top(cmd_top::TopArgs),
    /// NUMA nodes, and the nodes of each VM's vCPUs and memory (flags remote memory).
    Topo(cmd_topo::TopoArgs),
    /// The papers' five experiments, with statistics: io, net, web, scale, overhead.
    Bench(cmd_bench::BenchArgs),
}

fn main() -> ExitCode {
    // Man pages and completions for the package build; not a clap subcommand.
    if std::env::args().nth(1).as_deref() == Some(cmd_generate::NAME) {
        return cmd_generate::main(std::env::args().skip(2), Cli::command());
    }
    // The agent broker host tools start on demand (crates/broker); not a
    // clap subcommand either: nobody types it.
    if std::env::args().nth(1).as_deref() == Some("__agent-broker") {
        return agent_broker(std::env::args_os().skip(2).collect());
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(a) => cmd_record::run(a),
        Command::Report(a) => cmd_report::run(a),
        Command::Compare(a) => cmd_compare::run(a),
        Command::Import(a) => cmd_import::run(a),
        Command::Demo(a) => cmd_demo::run(a),
        Command::Lab(a) => cmd_lab::run(a),
        Command::Vms(a) => cmd_vms::run(a),
        Command::Stat(a) => cmd_stat::run(a),
        Command::Account(a) => cmd_account::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Top(a) => cmd_top::run(a),
        Command::Topo(a) => cmd_topo::run(a),
        Command::Bench(a) => cmd_bench::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            // One line, whatever names (a VM's, a path's) the message holds.
            eprintln!(
                "vmscope: error: {}",
                vmscope_model::text::visible(&error_line(&e))
            );
            ExitCode::from(exit_code(&e))
        }
    }
}

/// `vmscope __agent-broker LISTEN_SOCKET`, the agent socket in
/// `$VMSCOPE_BROKER_AGENT`.
fn agent_broker(args: Vec<std::ffi::OsString>) -> ExitCode {
    let ([listen], Some(agent)) = (args.as_slice(), std::env::var_os(vmscope_broker::AGENT_ENV))
    else {
        eprintln!(
            "vmscope: error: __agent-broker takes LISTEN_SOCKET, with the agent socket in ${}",
            vmscope_broker::AGENT_ENV
        );
        return ExitCode::from(2);
    };
    let opts = vmscope_broker::BrokerOptions {
        agent_socket: agent.into(),
        listen: listen.into(),
        idle_exit: std::time::Duration::from_secs(10),
        hello_timeout: std::time::Duration::from_secs(120),
    };
    match vmscope_broker::serve(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vmscope agent broker: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, each text once: errors that embed
/// their source in their own message (thiserror's `{source}`) would
/// otherwise print the OS error twice ("Read-only file system (os error 30):
/// Read-only file system (os error 30)").
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// 2 for every error, 128 + the signal for an interrupted command.
fn exit_code(e: &anyhow::Error) -> u8 {
    for c in e.chain() {
        let signal = match (c.downcast_ref(), c.downcast_ref::<signals::Interrupted>()) {
            (Some(vmscope_lab::LabError::Interrupted { signal, .. }), _) => *signal,
            (_, Some(i)) => i.signal,
            _ => continue,
        };
        return u8::try_from(128 + signal).unwrap_or(130);
    }
    2
}

/// `vmscope ... | head` must exit quietly: a broken pipe on standard output
/// ends a command as success. Only there: a VM's QMP socket or an agent
/// channel that breaks is a failure like any other (a `lab up` whose QEMU
/// died once exited 0 here, with no word).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    }) && stdout_closed()
}

/// Whether standard output is a pipe or socket nobody reads any more.
fn stdout_closed() -> bool {
    let mut p = libc::pollfd {
        fd: 1,
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd we own; a zero timeout never blocks.
    let n = unsafe { libc::poll(&raw mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every command, nested ones included, by its path ("lab up").
    fn every_command() -> Vec<(String, clap::Command)> {
        fn walk(path: &str, cmd: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
            out.push((path.to_string(), cmd.clone()));
            for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                let p = format!("{path} {}", sub.get_name()).trim().to_string();
                walk(&p, sub, out);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut out = Vec::new();
        walk("", &cmd, &mut out);
        out
    }

    /// The example lines that end a help text: after its last "Examples:"
    /// line, every line indented and none blank.
    fn closing_examples(help: &str) -> Result<Vec<String>, String> {
        let help = help.trim_end();
        let Some(start) = help.rfind("\nExamples:\n") else {
            return Err("no \"Examples:\" section".into());
        };
        let lines: Vec<String> = help[start + "\nExamples:\n".len()..]
            .lines()
            .map(str::to_string)
            .collect();
        if let Some(bad) = lines
            .iter()
            .find(|l| !l.starts_with("  ") || l.trim().is_empty())
        {
            return Err(format!(
                "the examples are not the end: {bad:?} follows them"
            ));
        }
        Ok(lines)
    }

    #[test]
    fn every_help_ends_with_two_or_three_examples() {
        let mut bad = Vec::new();
        for (path, mut cmd) in every_command() {
            for (form, help) in [
                ("--help", cmd.render_long_help().to_string()),
                ("-h", cmd.render_help().to_string()),
            ] {
                match closing_examples(&help) {
                    Ok(ex) if (2..=3).contains(&ex.len()) => {}
                    Ok(ex) => bad.push(format!("vmscope {path} {form}: {} examples", ex.len())),
                    Err(e) => bad.push(format!("vmscope {path} {form}: {e}")),
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn help_lists_every_command_and_experiment() {
        let mut cmd = Cli::command();
        let top = cmd.render_help().to_string();
        for name in [
            "record", "report", "compare", "import", "demo", "lab", "vms", "stat", "account",
            "serve", "top", "topo", "bench",
        ] {
            assert!(
                top.contains(&format!("\n  {name} ")),
                "{name} missing:\n{top}"
            );
        }
        let bench = cmd
            .find_subcommand_mut("bench")
            .unwrap()
            .render_help()
            .to_string();
        for name in ["io", "net", "web", "scale", "overhead"] {
            assert!(
                bench.contains(&format!("\n  {name} ")),
                "{name} missing:\n{bench}"
            );
        }
    }
}
