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
pub const DEFAULT_NAME: &str = "vmscope.agent";

/// Usage text.
pub const USAGE: &str = "\
usage: vmscope-agent [--name NAME | --port PATH | --stdio] [--allow-exec] [--allow-write] [--once] [--log FILE]
       vmscope-agent demo [-d SECONDS] [-t THREADS]

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
";

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

    fn p(a: &[&str]) -> Result<Options, String> {
        parse(a.iter().map(|s| s.to_string()))
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
        let d = |a: &[&str]| parse_demo(a.iter().map(|s| s.to_string()));
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
