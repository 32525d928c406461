//! Command-line options of `vmscope-agent` (parsed by hand: no dependency).

use std::path::PathBuf;

/// Where the agent talks to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channel {
    /// A virtio-serial port found by its name under /sys/class/virtio-ports.
    Name(String),
    /// An explicit character device (or pty) path.
    Port(PathBuf),
    /// stdin/stdout (for tests and for running under a socket activator).
    Stdio,
}

/// Parsed options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The channel to serve.
    pub channel: Channel,
    /// Run commands the host sends (and accept files).
    pub allow_exec: bool,
    /// Accept files the host sends (PutFile), without exec.
    pub allow_write: bool,
    /// Exit when the first host connection ends.
    pub once: bool,
    /// Log file (appended); stderr when absent.
    pub log: Option<PathBuf>,
    /// Root of sysfs, for finding the port by name.
    pub sys_root: PathBuf,
}

/// Default virtio-serial port name.
pub const DEFAULT_NAME: &str = vmscope_protocol::AGENT_PORT;

/// Usage text.
pub const USAGE: &str = "\
usage: vmscope-agent [--name NAME | --port PATH | --stdio] [--allow-exec] [--allow-write] [--once] [--log FILE]
       vmscope-agent demo [-d SECONDS] [-t THREADS]
       vmscope-agent dd if=FILE [bs=SIZE] [count=N] [skip=N] [iflag=direct]

Answers the vmscope host over a virtio-serial port.
  --name NAME     serve the virtio-serial port named NAME (default vmscope.agent),
                  found via /sys/class/virtio-ports/*/name
  --port PATH     serve this character device (e.g. /dev/vport0p1)
  --stdio         serve stdin/stdout (testing, socket activation)
  --allow-exec    run commands the host sends, and accept files (lab images only)
  --allow-write   accept files the host sends (without --allow-exec)
  --once          exit when the first host connection ends
  --log FILE      append log lines to FILE instead of stderr
  --version       print the version

`demo` runs the known-answer workload (vmscope_demo_alpha/beta/gamma take
50/30/20 % of its CPU) for SECONDS (default 10) on THREADS threads (default 1)
and prints the rounds done and the rounds per second.

`dd` reads FILE (a disk such as /dev/vdb) in blocks of SIZE bytes (default
512; suffixes k, M, G) and discards them: COUNT reads (default: to the end),
after skipping N blocks. `iflag=direct` opens with O_DIRECT and reads into a
4 KiB-aligned buffer, so each block is one request on the virtual disk
(busybox dd falls back to cached reads there). Prints records, bytes,
seconds, MiB/s and reads/s.
";

/// Options of `vmscope-agent dd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdOptions {
    pub input: PathBuf,
    pub read: vmscope_workload::blockread::BlockRead,
}

/// Parses the dd-style operands after `dd`.
pub fn parse_dd<I: IntoIterator<Item = String>>(args: I) -> Result<DdOptions, String> {
    use vmscope_workload::blockread::{parse_size, BlockRead};
    let mut input = None;
    let mut read = BlockRead {
        block_size: 512,
        count: u64::MAX,
        skip: 0,
        direct: false,
    };
    for a in args {
        let (key, value) = a
            .split_once('=')
            .ok_or_else(|| format!("dd operands are KEY=VALUE, not `{a}`"))?;
        match key {
            "if" => input = Some(PathBuf::from(value)),
            "bs" | "ibs" => {
                let n = parse_size(value)?;
                if n == 0 || n > (64 << 20) {
                    return Err(format!("bs wants 1 byte to 64 MiB, not `{value}`"));
                }
                read.block_size = n as usize;
            }
            "count" => {
                read.count = value
                    .parse()
                    .map_err(|_| format!("count wants a number of blocks, not `{value}`"))?;
            }
            "skip" => {
                read.skip = value
                    .parse()
                    .map_err(|_| format!("skip wants a number of blocks, not `{value}`"))?;
            }
            "iflag" => {
                for flag in value.split(',') {
                    match flag {
                        "direct" => read.direct = true,
                        "" => {}
                        other => {
                            return Err(format!("unsupported iflag `{other}` (only `direct`)"))
                        }
                    }
                }
            }
            "of" => return Err("this dd only reads: leave out `of=`".into()),
            other => return Err(format!("unknown dd operand `{other}`")),
        }
    }
    let input = input.ok_or("dd needs if=FILE")?;
    Ok(DdOptions { input, read })
}

/// Options of `vmscope-agent demo`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemoOptions {
    /// How long to run, in seconds.
    pub seconds: f64,
    /// Worker threads.
    pub threads: usize,
}

/// Parses the arguments after `demo`.
pub fn parse_demo<I: IntoIterator<Item = String>>(args: I) -> Result<DemoOptions, String> {
    let mut o = DemoOptions {
        seconds: 10.0,
        threads: 1,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-d" | "--duration" => {
                let v = value("-d")?;
                o.seconds = match v.parse::<f64>() {
                    Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => s,
                    _ => return Err(format!("-d wants seconds in (0, 86400], not `{v}`")),
                };
            }
            "-t" | "--threads" => {
                let v = value("-t")?;
                o.threads = match v.parse::<usize>() {
                    Ok(n) if (1..=1024).contains(&n) => n,
                    _ => return Err(format!("-t wants 1..=1024 threads, not `{v}`")),
                };
            }
            other => return Err(format!("unknown demo argument `{other}`")),
        }
    }
    Ok(o)
}

/// Parses `args` (without the program name). `Err` carries the message to print.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Options, String> {
    let mut o = Options {
        channel: Channel::Name(DEFAULT_NAME.into()),
        allow_exec: false,
        allow_write: false,
        once: false,
        log: None,
        sys_root: PathBuf::from("/sys"),
    };
    let mut channels = 0;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "--name" => {
                o.channel = Channel::Name(value("--name")?);
                channels += 1;
            }
            "--port" => {
                o.channel = Channel::Port(value("--port")?.into());
                channels += 1;
            }
            "--stdio" => {
                o.channel = Channel::Stdio;
                channels += 1;
            }
            "--allow-exec" => o.allow_exec = true,
            "--allow-write" => o.allow_write = true,
            "--once" => o.once = true,
            "--log" => o.log = Some(value("--log")?.into()),
            "--sys-root" => o.sys_root = value("--sys-root")?.into(),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if channels > 1 {
        return Err("give at most one of --name, --port, --stdio".into());
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dd_operands() {
        let o = parse_dd(["if=/dev/vdb", "bs=4k", "count=8000", "iflag=direct"].map(String::from))
            .unwrap();
        assert_eq!(o.input, PathBuf::from("/dev/vdb"));
        assert_eq!(
            (o.read.block_size, o.read.count, o.read.skip, o.read.direct),
            (4096, 8000, 0, true)
        );
        let o = parse_dd(["if=/x", "skip=3"].map(String::from)).unwrap();
        assert_eq!(
            (o.read.block_size, o.read.count, o.read.skip, o.read.direct),
            (512, u64::MAX, 3, false)
        );
        assert!(parse_dd(["bs=512"].map(String::from))
            .unwrap_err()
            .contains("if=FILE"));
        assert!(parse_dd(["if=/x", "of=/y"].map(String::from))
            .unwrap_err()
            .contains("only reads"));
        assert!(parse_dd(["if=/x", "iflag=sync"].map(String::from))
            .unwrap_err()
            .contains("sync"));
        assert!(parse_dd(["if=/x", "bs=0"].map(String::from)).is_err());
        assert!(parse_dd(["if=/x", "count=many"].map(String::from)).is_err());
        assert!(parse_dd(["/dev/vdb"].map(String::from))
            .unwrap_err()
            .contains("KEY=VALUE"));
    }

    fn p(a: &[&str]) -> Result<Options, String> {
        parse(a.iter().map(std::string::ToString::to_string))
    }

    #[test]
    fn defaults_are_safe() {
        let o = p(&[]).unwrap();
        assert_eq!(o.channel, Channel::Name("vmscope.agent".into()));
        assert!(!o.allow_exec && !o.allow_write && !o.once);
    }

    #[test]
    fn flags() {
        let o = p(&[
            "--port",
            "/dev/vport0p1",
            "--allow-exec",
            "--once",
            "--log",
            "/l",
        ])
        .unwrap();
        assert_eq!(o.channel, Channel::Port("/dev/vport0p1".into()));
        assert!(o.allow_exec && o.once);
        assert_eq!(o.log, Some("/l".into()));
        assert!(p(&["--port"]).is_err());
        assert!(p(&["--bogus"]).is_err());
        assert!(p(&["--stdio", "--name", "x"]).is_err());
    }

    #[test]
    fn demo_flags() {
        let d = |a: &[&str]| parse_demo(a.iter().map(std::string::ToString::to_string));
        assert_eq!(
            d(&[]).unwrap(),
            DemoOptions {
                seconds: 10.0,
                threads: 1
            }
        );
        assert_eq!(
            d(&["-d", "2.5", "-t", "3"]).unwrap(),
            DemoOptions {
                seconds: 2.5,
                threads: 3
            }
        );
        for bad in [
            &["-d", "0"][..],
            &["-d", "x"],
            &["-t", "0"],
            &["-t"],
            &["-x"],
        ] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }
}
