//! `vmscope lab`: boot, use and tear down VM setups described by a spec file.
//! Turns arguments into `vmscope_lab` calls and prints their results.

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use vmscope_lab::{image, lab, AccelChoice, LabOptions, LabSpec, LabState};

/// The default lab, used when `lab up` gets no spec.
const DEFAULT_LAB: &str = "one-vm";

/// `lab up --help`'s closing text: the built-in labs and examples.
fn up_help() -> String {
    format!(
        "A SPEC is a spec file (TOML, see labs/ in the repository) or the name of a built-in lab:\n{}\n\n\
Examples:\n  vmscope lab up                       the built-in one-vm lab\n  vmscope lab up guest-same-cpu        a built-in lab by name\n  vmscope lab up my-lab.toml --accel tcg",
        vmscope_lab::builtin::list()
    )
}

#[derive(Args)]
#[command(
    after_help = "Built-in labs (vmscope lab up NAME) and the spec files of the paper experiments in labs/ are the same;\n\
one-vm is the default lab. Run directories live under $VMSCOPE_RUN (default /run/vmscope/labs), images and the KVM verdict under \
$VMSCOPE_CACHE (default /var/cache/vmscope).\n\n\
Examples:\n  \
vmscope lab up                     boot the default lab (one-vm: vm0, 2 vCPUs, agent inside)\n  \
vmscope lab exec vm0 -- uname -a   run a command in the guest\n  \
vmscope lab down one-vm            stop it and remove everything it made"
)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
    /// Image and KVM-probe cache directory [env: VMSCOPE_CACHE, default /var/cache/vmscope].
    #[arg(long, global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Root of lab run directories [env: VMSCOPE_RUN, default /run/vmscope/labs].
    #[arg(long, global = true, value_name = "DIR")]
    run_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum LabFormat {
    Table,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum AccelArg {
    Auto,
    Kvm,
    Tcg,
}

#[derive(Subcommand)]
enum LabCommand {
    /// Build (or show the cached) guest image: Debian cloud kernel, busybox
    /// initramfs and the static guest agent.
    #[command(after_help = "Examples:\n  \
vmscope lab image                  build it, or show the cached one\n  \
vmscope lab image --format json")]
    Image {
        /// Guest agent binary [default: $VMSCOPE_AGENT, next to vmscope, target/, /usr/lib/vmscope/vmscope-agent].
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
        /// Debian kernel package instead of the newest linux-image-*-cloud-amd64.
        #[arg(long, value_name = "PACKAGE")]
        kernel_package: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: LabFormat,
    },
    /// Start every VM of a spec, wait for each guest agent's hello and print
    /// the VMs. QEMU keeps running after this command exits. Interrupted
    /// (Ctrl-C, SIGTERM, SIGHUP), it removes what it had made and exits
    /// with 128 + the signal.
    #[command(after_help = up_help())]
    Up {
        /// Spec file (TOML) or a built-in lab's name (below) [default: one-vm].
        spec: Option<String>,
        /// Override the spec's accelerator.
        #[arg(long, value_enum)]
        accel: Option<AccelArg>,
        /// Run the VMs as transient libvirt domains on qemu:///system (the
        /// spec's `manager = "libvirt"`), agent channel at
        /// /run/vmscope/LAB-VM.sock; needs a running libvirtd.
        #[arg(long)]
        libvirt: bool,
        /// Guest agent binary [default: $VMSCOPE_AGENT, next to vmscope, target/, /usr/lib/vmscope/vmscope-agent].
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
        /// Seconds each VM may take to answer the agent hello.
        #[arg(long, default_value_t = 90, value_name = "SECS",
              value_parser = crate::args::whole_seconds, allow_negative_numbers = true)]
        hello_timeout: u64,
        /// Seconds the KVM probe VM may take to answer (accel = auto|kvm).
        #[arg(long, default_value_t = 12, value_name = "SECS",
              value_parser = crate::args::whole_seconds, allow_negative_numbers = true)]
        kvm_timeout: u64,
        /// Print nothing but the final table (or JSON).
        #[arg(long, short)]
        quiet: bool,
        #[arg(long, value_enum, default_value = "table")]
        format: LabFormat,
    },
    /// Show running labs: accelerator (and why), VMs, pids, vCPU threads,
    /// whether each QEMU still runs, and the libvirt domains of a libvirt lab.
    #[command(after_help = "Examples:\n  \
vmscope lab status                 every lab that is up\n  \
vmscope lab status one-vm --format json")]
    Status {
        /// Lab name [default: every lab].
        name: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: LabFormat,
    },
    /// Run a command in a VM through its agent; exits with the command's status.
    #[command(
        after_help = "The command runs without a shell; its exit status, stdout and stderr come \
back when it exits. A background job (sh -c 'JOB &') keeps running in the guest after that; \
redirect its output, since what it writes later is not returned.\n\n\
Examples:\n  \
vmscope lab exec vm0 -- uname -a\n  \
vmscope lab exec vm0 -- sh -c 'vmscope-agent demo -t 2 -d 60 </dev/null >/dev/null 2>&1 &'"
    )]
    Exec {
        /// VM name.
        vm: String,
        /// Lab of the VM, when several labs have a VM of that name.
        #[arg(long)]
        lab: Option<String>,
        /// Seconds before the agent kills the command.
        #[arg(long, default_value_t = 60, value_name = "SECS",
              value_parser = crate::args::whole_seconds, allow_negative_numbers = true)]
        timeout: u64,
        /// Most bytes kept of the command's stdout, and of its stderr
        /// (suffixes k, M; at most 6M: the agent sends both in one message).
        #[arg(long, default_value = "4M", value_name = "SIZE", value_parser = max_output)]
        max_output: u64,
        /// The command and its arguments (no shell; use `sh -c '...'`).
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Copy a host file into a VM through its agent.
    #[command(after_help = "Examples:\n  \
vmscope lab cp ./prog vm0:/root/prog\n  \
vmscope lab cp ./run.sh vm0:/root/run.sh --mode 755")]
    Cp {
        /// Host file.
        host_path: PathBuf,
        /// Destination `VM:GUEST_PATH`.
        dest: String,
        #[arg(long)]
        lab: Option<String>,
        /// Permission bits in the guest (octal) [default: the host file's].
        #[arg(long, value_name = "OCTAL")]
        mode: Option<String>,
        #[arg(long, default_value_t = 120, value_name = "SECS",
              value_parser = crate::args::whole_seconds, allow_negative_numbers = true)]
        timeout: u64,
    },
    /// Attach to a VM's serial console (Ctrl-D ends), or print its log with --dump.
    #[command(after_help = "Examples:\n  \
vmscope lab console vm0            the guest's shell on its serial console\n  \
vmscope lab console vm0 --dump     what the console printed so far (boot log)")]
    Console {
        vm: String,
        #[arg(long)]
        lab: Option<String>,
        /// Print the console output so far and exit (non-interactive).
        #[arg(long)]
        dump: bool,
    },
    /// Stop a lab and remove everything it made: QEMU processes (libvirt
    /// domains are destroyed, which undefines them), taps, bridge, loop
    /// devices, volumes, sockets, files.
    #[command(after_help = "Examples:\n  \
vmscope lab down one-vm\n  \
vmscope lab down --all")]
    Down {
        /// Spec file or lab name [default: the only lab that is up].
        target: Option<String>,
        /// Tear down every lab.
        #[arg(long, conflicts_with = "target")]
        all: bool,
    },
}

pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    let mut opts = LabOptions::default();
    if let Some(c) = args.cache_dir {
        opts.cache_dir = c;
    }
    if let Some(r) = args.run_dir {
        opts.run_root = r;
    }
    match args.command {
        LabCommand::Image {
            agent,
            kernel_package,
            format,
        } => {
            let img = image::build_image(&image::ImageOptions {
                cache_dir: opts.cache_dir.clone(),
                agent,
                kernel_package,
                cancel: vmscope_lab::Cancel::from_flag(crate::signals::install()),
            })?;
            if format == LabFormat::Json {
                println!("{}", serde_json::to_string_pretty(&img)?);
            } else {
                let mut t = table(&["field", "value"]);
                t.add_row(vec!["hash".to_string(), img.hash.clone()]);
                t.add_row(vec![
                    "kernel package".to_string(),
                    img.kernel_package.clone(),
                ]);
                t.add_row(vec!["kernel".to_string(), img.kernel.display().to_string()]);
                t.add_row(vec![
                    "initramfs".to_string(),
                    format!(
                        "{} ({:.1} MiB)",
                        img.initrd.display(),
                        img.initrd_bytes as f64 / 1048576.0
                    ),
                ]);
                t.add_row(vec!["modules".to_string(), img.modules.join(" ")]);
                t.add_row(vec!["agent".to_string(), img.agent.display().to_string()]);
                println!("{t}");
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Up {
            spec,
            accel,
            libvirt,
            agent,
            hello_timeout,
            kvm_timeout,
            quiet,
            format,
        } => {
            let spec = vmscope_lab::builtin::load(spec.as_deref().unwrap_or(DEFAULT_LAB), None)?;
            opts.agent = agent;
            opts.manager = libvirt.then_some(vmscope_lab::Manager::Libvirt);
            opts.accel = accel.map(|a| match a {
                AccelArg::Auto => AccelChoice::Auto,
                AccelArg::Kvm => AccelChoice::Kvm,
                AccelArg::Tcg => AccelChoice::Tcg,
            });
            opts.hello_timeout = Duration::from_secs(hello_timeout);
            opts.kvm_probe_timeout = Duration::from_secs(kvm_timeout);
            opts.verbose = !quiet;
            // Ctrl-C, SIGTERM or SIGHUP: `up` tears down what it made.
            opts.cancel = vmscope_lab::Cancel::from_flag(crate::signals::install());
            let st = lab::up(&spec, &opts)?;
            print_states(&[st], format)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Status { name, format } => {
            let names = match name {
                Some(n) => vec![n],
                None => lab::list_labs(&opts.run_root),
            };
            let mut states = Vec::new();
            for n in &names {
                states.push(lab::load_state_in(&opts.run_root, n)?);
            }
            if states.is_empty() && format == LabFormat::Table {
                println!("no lab is up (run directory {})", opts.run_root.display());
                return Ok(ExitCode::SUCCESS);
            }
            print_states(&states, format)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Exec {
            vm,
            lab,
            timeout,
            max_output,
            command,
        } => {
            let (_, v) = lab::find_vm(&opts, lab.as_deref(), &vm)?;
            let (mut client, _) = lab::connect_agent(&v, Duration::from_secs(10))?;
            let limit =
                (max_output != vmscope_protocol::MAX_EXEC_OUTPUT as u64).then_some(max_output);
            let out = client
                .exec_with_limit(&command, None, Duration::from_secs(timeout), limit)
                .with_context(|| format!("VM {vm}: exec {:?}", command.join(" ")))?;
            std::io::stdout().write_all(&out.stdout)?;
            std::io::stderr().write_all(&out.stderr)?;
            if out.truncated {
                let kept = out.stdout.len().max(out.stderr.len());
                eprintln!(
                    "vmscope: VM {vm}: output cut at {kept} bytes (--max-output {max_output}, at most {} with --max-output 6M; for more, write it to a file in the guest and read it in parts)",
                    vmscope_protocol::MAX_EXEC_OUTPUT_LIMIT
                );
            }
            if out.timed_out {
                eprintln!("vmscope: VM {vm}: command killed after {timeout} s");
            }
            Ok(ExitCode::from(out.exit_code.clamp(0, 255) as u8))
        }
        LabCommand::Cp {
            host_path,
            dest,
            lab,
            mode,
            timeout,
        } => {
            let Some((vm, guest_path)) = dest.split_once(':') else {
                bail!("destination '{dest}' is not VM:GUEST_PATH");
            };
            if !guest_path.starts_with('/') {
                bail!("guest path '{guest_path}' must be absolute");
            }
            let data = std::fs::read(&host_path)
                .with_context(|| format!("reading {}", host_path.display()))?;
            let mode = if let Some(m) = mode {
                u32::from_str_radix(&m, 8).with_context(|| format!("--mode {m} is not octal"))?
            } else {
                use std::os::unix::fs::PermissionsExt;
                std::fs::metadata(&host_path)?.permissions().mode() & 0o7777
            };
            let (_, v) = lab::find_vm(&opts, lab.as_deref(), vm)?;
            let (mut client, _) = lab::connect_agent(&v, Duration::from_secs(10))?;
            let n = client
                .put_file(&data, guest_path, mode, Duration::from_secs(timeout))
                .with_context(|| {
                    format!("VM {vm}: copying {} to {guest_path}", host_path.display())
                })?;
            eprintln!(
                "{} -> {vm}:{guest_path} ({n} bytes, mode {mode:o})",
                host_path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Console { vm, lab, dump } => {
            let (_, v) = lab::find_vm(&opts, lab.as_deref(), &vm)?;
            if dump {
                let log = std::fs::read(&v.console_log).with_context(|| {
                    format!("VM {vm}: reading console log {}", v.console_log.display())
                })?;
                std::io::stdout().write_all(&log)?;
                return Ok(ExitCode::SUCCESS);
            }
            console(&vm, &v.console_socket)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Down { target, all } => {
            let names: Vec<String> = if all {
                lab::list_labs(&opts.run_root)
            } else {
                match target {
                    Some(t) if t.ends_with(".toml") || Path::new(&t).is_file() => {
                        vec![LabSpec::from_file(Path::new(&t))?.name]
                    }
                    Some(t) => vec![t],
                    None => {
                        let labs = lab::list_labs(&opts.run_root);
                        match labs.len() {
                            0 => {
                                println!("no lab is up");
                                return Ok(ExitCode::SUCCESS);
                            }
                            1 => labs,
                            _ => bail!(
                                "several labs are up ({}); name one or use --all",
                                labs.join(", ")
                            ),
                        }
                    }
                }
            };
            for n in names {
                let rep = lab::down(&n, &opts)?;
                println!(
                    "lab {n}: removed {} resource(s){}",
                    rep.removed.len(),
                    if rep.already_gone.is_empty() {
                        String::new()
                    } else {
                        format!(", {} already gone", rep.already_gone.len())
                    }
                );
                for r in &rep.removed {
                    println!("  removed {r}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(header.to_vec());
    t
}

fn print_states(states: &[LabState], format: LabFormat) -> anyhow::Result<()> {
    if format == LabFormat::Json {
        // One object per lab, with a live `running` flag per VM.
        let mut out = Vec::new();
        for st in states {
            let mut v = serde_json::to_value(st)?;
            if let Some(vms) = v.get_mut("vms").and_then(|x| x.as_array_mut()) {
                for (j, vm) in vms.iter_mut().enumerate() {
                    if let (Some(obj), Some(s)) = (vm.as_object_mut(), st.vms.get(j)) {
                        obj.insert(
                            "running".into(),
                            serde_json::Value::Bool(lab::vm_running(s)),
                        );
                    }
                }
            }
            out.push(v);
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    for st in states {
        println!(
            "lab {} ({:?}): accel {} — {}",
            st.name, st.phase, st.accel, st.accel_reason
        );
        if st.manager == vmscope_lab::Manager::Libvirt {
            let domains: Vec<String> = st
                .vms
                .iter()
                .filter_map(|v| v.libvirt.as_ref())
                .map(|d| format!("{} ({})", d.name, d.uri))
                .collect();
            println!("VMs are libvirt domains: {}", domains.join(", "));
        }
        if let Some(b) = &st.bridge {
            println!("bridge {b} {}", st.bridge_address.as_deref().unwrap_or(""));
        }
        let mut t = table(&[
            "vm",
            "pid",
            "state",
            "accel",
            "vcpus",
            "vcpu tids",
            "addresses",
            "agent hello",
        ]);
        for v in &st.vms {
            let state = if lab::vm_running(v) {
                "running"
            } else {
                "dead"
            };
            let hello = match (&v.hello, &v.error) {
                (Some(h), _) => format!(
                    "{} {} ({} cpus, {} MiB){}",
                    h.hostname,
                    h.kernel,
                    h.cpus,
                    h.mem_bytes >> 20,
                    v.boot_seconds
                        .map(|s| format!(" after {s:.1} s"))
                        .unwrap_or_default()
                ),
                (None, Some(e)) => format!("error: {e}"),
                (None, None) => "-".into(),
            };
            t.add_row(vec![
                match &v.libvirt {
                    Some(d) => format!("{} (domain {})", v.name, d.name),
                    None => v.name.clone(),
                },
                v.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                state.to_string(),
                st.accel.clone(),
                v.vcpus.to_string(),
                v.vcpu_tids
                    .iter()
                    .map(std::string::ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                v.nics
                    .iter()
                    .map(|n| match (&n.tap, &n.guest_ip) {
                        (Some(tap), Some(ip)) => format!("{ip} ({tap})"),
                        (None, Some(ip)) => format!("{ip} ({})", n.kind),
                        _ => n.kind.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                hello,
            ]);
        }
        println!("{t}");
        for n in &st.notes {
            println!("note: {n}");
        }
    }
    Ok(())
}

/// Relay stdin to the serial console socket and the console to stdout.
fn console(vm: &str, socket: &Path) -> anyhow::Result<()> {
    let stream = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("VM {vm}: connecting to the console {}", socket.display()))?;
    let mut reader = stream.try_clone()?;
    eprintln!("connected to VM {vm}'s console; Ctrl-D ends");
    let out = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdout = std::io::stdout();
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || stdout.write_all(&buf[..n]).is_err() {
                break;
            }
            let _ = stdout.flush();
        }
    });
    let mut w = stream;
    let mut stdin = std::io::stdin();
    let mut buf = [0u8; 1024];
    loop {
        let n = stdin.read(&mut buf)?;
        if n == 0 {
            break;
        }
        w.write_all(&buf[..n])?;
    }
    // Input ended (Ctrl-D or end of a pipe): give the guest a moment to answer.
    std::thread::sleep(Duration::from_secs(1));
    let _ = w.shutdown(std::net::Shutdown::Both);
    let _ = out.join();
    Ok(())
}

/// `--max-output`: a size up to the protocol's limit.
fn max_output(s: &str) -> Result<u64, String> {
    let n = vmscope_workload::io::parse_size(s)?;
    let max = vmscope_protocol::MAX_EXEC_OUTPUT_LIMIT as u64;
    if n == 0 || n > max {
        return Err(format!("must be from 1 byte to {max} bytes (6M)"));
    }
    Ok(n)
}
