//! `vmscope-agent`: the guest side of vmscope. Finds its virtio-serial port,
//! then answers the host's requests (hello, ping, and, when allowed, exec
//! and file copies, profiling, kernel symbols) until stopped. See
//! docs/protocol.md. `vmscope-agent demo` runs the known-answer workload,
//! `vmscope-agent dd` the block reads of cherkasova2005's disk experiment,
//! `vmscope-agent io` the I/O engine of `vmscope bench io` (see
//! `vmscope_workload::io`), `vmscope-agent net` and `vmscope-agent scale`
//! the engines of `vmscope bench net` and `bench scale`.

mod args;
mod bench;
mod exec;
mod kallsyms;
mod log;
mod port;
mod profile;
mod putfile;
mod server;
mod sysinfo;

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::Duration;

use args::Channel;
use server::{ChannelFds, Policy};

fn open_channel(opts: &args::Options) -> io::Result<ChannelFds> {
    let path = match &opts.channel {
        Channel::Stdio => {
            port::set_nonblocking(0)?;
            port::set_nonblocking(1)?;
            return Ok(ChannelFds {
                read: 0,
                write: 1,
                ends_on_eof: true,
                _owner: None,
            });
        }
        Channel::Port(p) => p.clone(),
        Channel::Name(name) => {
            let mut logged = false;
            loop {
                if let Some(p) = port::find_port(&opts.sys_root, name) {
                    break p;
                }
                if !logged {
                    log!(
                        "no virtio-serial port named {name} under {}/class/virtio-ports yet; waiting",
                        opts.sys_root.display()
                    );
                    logged = true;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    };
    let fd = port::open_port(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))?;
    log!("serving {}", path.display());
    Ok(ChannelFds {
        read: fd.as_raw_fd(),
        write: fd.as_raw_fd(),
        ends_on_eof: false,
        _owner: Some(fd),
    })
}

/// `vmscope-agent demo`: the 50/30/20 workload, with its throughput.
fn demo(args: impl Iterator<Item = String>) -> ExitCode {
    let o = match args::parse_demo(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vmscope-agent demo: {e}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let t0 = std::time::Instant::now();
    let d = Duration::from_secs_f64(o.seconds);
    let rounds = match o.progress {
        None => vmscope_workload::run_duty(d, o.threads, o.duty),
        Some(every) => {
            vmscope_workload::run_duty_progress(
                d,
                o.threads,
                o.duty,
                Duration::from_secs_f64(every),
                |r| {
                    let t = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    // One line at a time, flushed: read while the run goes on.
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "progress {:.3} {r}", t.as_secs_f64());
                    let _ = out.flush();
                },
            )
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rounds {rounds} seconds {secs:.3} threads {} rounds_per_s {:.2}",
        o.threads,
        rounds as f64 / secs.max(1e-9)
    );
    ExitCode::SUCCESS
}

/// `vmscope-agent dd`: one run of the I/O engine, reported like dd.
fn dd(args: impl Iterator<Item = String>) -> ExitCode {
    let o = match args::parse_dd(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vmscope-agent dd: {e}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    match vmscope_workload::io::run(&o.spec) {
        Ok(s) => {
            let (dir, verb) = if o.spec.mode.writes() {
                ("out", "written")
            } else {
                ("in", "read")
            };
            println!("{}+{} records {dir}", s.blocks, s.partial);
            println!(
                "{} bytes {verb}, {:.3} s, {:.2} MiB/s, {:.1} {}/s, bs {} {}",
                s.bytes,
                s.wall_s,
                s.bytes_per_s() / f64::from(1 << 20),
                (s.blocks + s.partial) as f64 / s.wall_s.max(1e-9),
                if o.spec.mode.writes() {
                    "writes"
                } else {
                    "reads"
                },
                o.spec.block_size,
                o.spec.mode,
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vmscope-agent dd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `vmscope-agent io`: the engine of `vmscope bench io`, one JSON line out.
fn io(args: impl Iterator<Item = String>) -> ExitCode {
    use args::IoCommand;
    use vmscope_workload::io;
    let cmd = match args::parse_io(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vmscope-agent io: {e}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let line = match cmd {
        IoCommand::Run(spec) => io::run(&spec)
            .map_err(|e| e.to_string())
            .and_then(|r| serde_json::to_string(&r).map_err(|e| e.to_string())),
        IoCommand::Inspect(path) => {
            serde_json::to_string(&io::inspect(&path)).map_err(|e| e.to_string())
        }
        IoCommand::Fill { path, offset, size } => io::fill(&path, offset, size)
            .map_err(|e| e.to_string())
            .and_then(|r| serde_json::to_string(&r).map_err(|e| e.to_string())),
        IoCommand::DropCaches => io::drop_caches()
            .map(|()| "{\"dropped\":true}".to_string())
            .map_err(|e| e.to_string()),
    };
    match line {
        Ok(l) => {
            println!("{l}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vmscope-agent io: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", args::USAGE);
        return ExitCode::SUCCESS;
    }
    if argv.first().map(String::as_str) == Some("demo") {
        return demo(argv.into_iter().skip(1));
    }
    if argv.first().map(String::as_str) == Some("dd") {
        return dd(argv.into_iter().skip(1));
    }
    if argv.first().map(String::as_str) == Some("io") {
        return io(argv.into_iter().skip(1));
    }
    if argv.first().map(String::as_str) == Some("net") {
        return bench::net_main(argv.into_iter().skip(1));
    }
    if argv.first().map(String::as_str) == Some("scale") {
        return bench::scale_main(argv.into_iter().skip(1));
    }
    if argv.iter().any(|a| a == "--version") {
        println!("vmscope-agent {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let opts = match args::parse(argv) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vmscope-agent: {e}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &opts.log {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => log::set_file(f),
            Err(e) => {
                eprintln!("vmscope-agent: cannot open log {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    log!(
        "version {} protocol {}: exec {}, file writes {}",
        env!("CARGO_PKG_VERSION"),
        vmscope_protocol::PROTOCOL_VERSION,
        if opts.allow_exec {
            "allowed"
        } else {
            "disabled"
        },
        if opts.allow_exec || opts.allow_write {
            "allowed"
        } else {
            "disabled"
        },
    );
    let ch = match open_channel(&opts) {
        Ok(c) => c,
        Err(e) => {
            log!("{e}");
            return ExitCode::from(1);
        }
    };
    let policy = Policy {
        allow_exec: opts.allow_exec,
        allow_write: opts.allow_write,
        once: opts.once,
    };
    match server::serve(ch, policy) {
        Ok(()) => {
            log!("channel closed, exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            log!("event loop failed: {e}");
            ExitCode::from(1)
        }
    }
}
