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
       vmscope-agent demo [-d SECONDS] [-t THREADS] [-u DUTY_PCT] [-p SECONDS]
       vmscope-agent dd if=FILE [bs=SIZE] [count=N] [skip=N] [iflag=direct]
       vmscope-agent dd of=FILE [bs=SIZE] count=N [seek=N] [oflag=direct] [conv=fdatasync]
       vmscope-agent io run PATH mode=MODE bs=SIZE count=N [offset=BYTES]
       vmscope-agent io inspect PATH | io fill PATH size=BYTES [offset=BYTES] | io drop-caches
       vmscope-agent net send to=IP:PORT [streams=N] [seconds=S] [connect-timeout=S]
       vmscope-agent net recv listen=IP:PORT [streams=N] [buf=SIZE] [timeout=S] | net check-port listen=IP:PORT
       vmscope-agent scale memwrite|cpu [threads=N] [seconds=S] [size=BYTES]

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
and prints the rounds done and the rounds per second. With -u, each thread
works DUTY_PCT % of every 100 ms and sleeps the rest (default 100). With -p,
it also prints `progress UNIX_SECONDS ROUNDS` every SECONDS (the guest's
clock, the rounds done so far by all threads).

`dd` reads FILE (a disk such as /dev/vdb) in blocks of SIZE bytes (default
512; suffixes k, M, G) and discards them: COUNT reads (default: to the end),
after skipping N blocks; or, with of=FILE, writes COUNT blocks of zeros
after seeking N blocks. `iflag=direct`/`oflag=direct` open with O_DIRECT and
use a 4 KiB-aligned buffer, so each block is one request on the virtual disk
(busybox dd falls back to cached reads there); `conv=fdatasync` syncs before
the clock stops. Prints records, bytes, seconds, MiB/s and blocks/s.

`io` is the engine of `vmscope bench io` (the same code the host runs):
`run` does one sequential pass (MODE: buffered-write = writes + fdatasync,
buffered-write-nosync, direct-write, direct-read, buffered-read) and prints
one JSON line: bytes, wall_s, sync_s, user_s, sys_s (its own CPU). `inspect`
prints what PATH is (size, logical block size, mounted, signatures) without
writing; `fill` writes zeros over a region so reads do not hit holes;
`drop-caches` syncs and drops the page cache.

`net` is the engine of `vmscope bench net` (menon2005's sender and
receiver): `send` opens N TCP streams to IP:PORT (retrying refused
connections for connect-timeout, default 30 s) and sendfile()s a cached
64 KiB file on each for S seconds (default 10); `recv` listens on IP:PORT,
accepts N streams (within timeout, default 60 s) and recv()s each into a
SIZE-byte buffer (default 64k) until its sender closes; `check-port` says
whether IP:PORT can be listened on. Each prints one JSON line: role, bytes,
wall_s (receiver: first to last byte), user_s, sys_s, streams, buf, calls.

`scale` is the workload of `vmscope bench scale` (theurer2006): memwrite
writes a value across a SIZE-byte buffer per thread (default 32M), pass
after pass; cpu runs a register-only integer chain; N threads (default 1)
for S seconds (default 5). One JSON line: work per thread and in all
(bytes or iterations), wall_s, user_s, sys_s.
";

/// Options of `vmscope-agent dd`: one engine run ([`vmscope_workload::io`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdOptions {
    pub spec: vmscope_workload::io::IoSpec,
}

/// Parses the dd-style operands after `dd`: `if=FILE` reads (to /dev/null),
/// `of=FILE` writes zeros (from /dev/zero); `iflag=direct`/`oflag=direct`
/// for O_DIRECT, `conv=fdatasync` for a final sync inside the timing.
pub fn parse_dd<I: IntoIterator<Item = String>>(args: I) -> Result<DdOptions, String> {
    use vmscope_workload::io::{parse_size, IoSpec, Mode};
    let mut input = None;
    let mut output = None;
    let mut bs = 512u64;
    let mut count = None;
    let mut skip = 0u64;
    let mut seek = 0u64;
    let (mut idirect, mut odirect, mut fdatasync) = (false, false, false);
    let blocks = |key: &str, value: &str| -> Result<u64, String> {
        value
            .parse()
            .map_err(|_| format!("{key} wants a number of blocks, not `{value}`"))
    };
    for a in args {
        let (key, value) = a
            .split_once('=')
            .ok_or_else(|| format!("dd operands are KEY=VALUE, not `{a}`"))?;
        match key {
            "if" => input = Some(PathBuf::from(value)),
            "of" => output = Some(PathBuf::from(value)),
            "bs" | "ibs" | "obs" => {
                let n = parse_size(value)?;
                if n == 0 || n > vmscope_workload::io::MAX_BLOCK_SIZE {
                    return Err(format!("bs wants 1 byte to 64 MiB, not `{value}`"));
                }
                bs = n;
            }
            "count" => count = Some(blocks("count", value)?),
            "skip" => skip = blocks("skip", value)?,
            "seek" => seek = blocks("seek", value)?,
            "iflag" | "oflag" => {
                for flag in value.split(',') {
                    match flag {
                        "direct" if key == "iflag" => idirect = true,
                        "direct" => odirect = true,
                        "" => {}
                        other => {
                            return Err(format!("unsupported {key} `{other}` (only `direct`)"))
                        }
                    }
                }
            }
            "conv" => {
                for c in value.split(',') {
                    match c {
                        "fdatasync" => fdatasync = true,
                        "notrunc" | "" => {}
                        other => {
                            return Err(format!(
                                "unsupported conv `{other}` (only fdatasync, notrunc)"
                            ))
                        }
                    }
                }
            }
            other => return Err(format!("unknown dd operand `{other}`")),
        }
    }
    let is = |p: &Option<PathBuf>, dev: &str| p.as_deref() == Some(std::path::Path::new(dev));
    let reading = match (&input, &output) {
        (Some(_), None) => true,
        (Some(_), Some(_)) if is(&output, "/dev/null") => true,
        (None, Some(_)) => false,
        (Some(_), Some(_)) if is(&input, "/dev/zero") => false,
        (Some(_), Some(_)) => {
            return Err(
                "this dd reads a file (of=/dev/null) or writes zeros to one \
                        (if=/dev/zero), it does not copy"
                    .into(),
            )
        }
        (None, None) => return Err("dd needs if=FILE or of=FILE".into()),
    };
    let spec = if reading {
        IoSpec {
            path: input.unwrap_or_default(),
            mode: if idirect {
                Mode::DirectRead
            } else {
                Mode::BufferedRead
            },
            block_size: bs,
            count: count.unwrap_or(u64::MAX),
            offset: skip.saturating_mul(bs),
            create: false,
        }
    } else {
        IoSpec {
            path: output.unwrap_or_default(),
            mode: if odirect {
                Mode::DirectWrite
            } else if fdatasync {
                Mode::BufferedWrite
            } else {
                Mode::BufferedWriteNosync
            },
            block_size: bs,
            count: count.ok_or("writing zeros needs count=N (blocks)")?,
            offset: seek.saturating_mul(bs),
            create: true,
        }
    };
    Ok(DdOptions { spec })
}

/// What `vmscope-agent io` is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoCommand {
    /// One engine run; prints its [`vmscope_workload::io::IoRun`] as JSON.
    Run(vmscope_workload::io::IoSpec),
    /// Prints [`vmscope_workload::io::TargetInfo`] as JSON; touches nothing.
    Inspect(PathBuf),
    /// Writes zeros over `[offset, offset + size)` and syncs (untimed set-up).
    Fill {
        path: PathBuf,
        offset: u64,
        size: u64,
    },
    /// `sync` and drop the guest's page cache.
    DropCaches,
}

/// Parses the arguments after `io`:
/// `run PATH mode=MODE bs=SIZE count=N [offset=BYTES]`, `inspect PATH`,
/// `fill PATH size=BYTES [offset=BYTES]`, `drop-caches`.
pub fn parse_io<I: IntoIterator<Item = String>>(args: I) -> Result<IoCommand, String> {
    use vmscope_workload::io::{parse_size, IoSpec, Mode, MAX_BLOCK_SIZE};
    let mut it = args.into_iter();
    let op = it
        .next()
        .ok_or("io needs an operation: run, inspect, fill or drop-caches")?;
    if op == "drop-caches" {
        if let Some(extra) = it.next() {
            return Err(format!("drop-caches takes no arguments, not `{extra}`"));
        }
        return Ok(IoCommand::DropCaches);
    }
    let path = PathBuf::from(it.next().ok_or_else(|| format!("io {op} needs a PATH"))?);
    let mut kv = std::collections::BTreeMap::new();
    for a in it {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| format!("io operands are KEY=VALUE, not `{a}`"))?;
        kv.insert(k.to_string(), v.to_string());
    }
    let allowed: &[&str] = match op.as_str() {
        "run" => &["mode", "bs", "count", "offset"],
        "fill" => &["size", "offset"],
        "inspect" => &[],
        other => {
            return Err(format!(
                "unknown io operation `{other}` (run, inspect, fill, drop-caches)"
            ))
        }
    };
    if let Some(k) = kv.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!("io {op} has no operand `{k}`"));
    }
    let size_of =
        |k: &str| -> Result<Option<u64>, String> { kv.get(k).map(|v| parse_size(v)).transpose() };
    let offset = size_of("offset")?.unwrap_or(0);
    match op.as_str() {
        "inspect" => Ok(IoCommand::Inspect(path)),
        "fill" => Ok(IoCommand::Fill {
            path,
            offset,
            size: size_of("size")?.ok_or("io fill needs size=BYTES")?,
        }),
        _ => {
            let mode = kv.get("mode").ok_or("io run needs mode=MODE")?;
            let mode = Mode::parse(mode).ok_or_else(|| {
                format!(
                    "unknown mode `{mode}` ({})",
                    Mode::ALL.map(Mode::name).join(", ")
                )
            })?;
            let bs = size_of("bs")?.ok_or("io run needs bs=SIZE")?;
            if bs == 0 || bs > MAX_BLOCK_SIZE {
                return Err(format!("bs wants 1 byte to 64 MiB, not {bs}"));
            }
            let count = kv.get("count").ok_or("io run needs count=N")?;
            let count = count
                .parse()
                .map_err(|_| format!("count wants a number of blocks, not `{count}`"))?;
            Ok(IoCommand::Run(IoSpec {
                path,
                mode,
                block_size: bs,
                count,
                offset,
                create: false,
            }))
        }
    }
}

/// Options of `vmscope-agent demo`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemoOptions {
    /// How long to run, in seconds.
    pub seconds: f64,
    /// Worker threads.
    pub threads: usize,
    /// Percent of every 100 ms each thread works (100: always).
    pub duty: f64,
    /// Print the rounds done so far every this many seconds.
    pub progress: Option<f64>,
}

/// Parses the arguments after `demo`.
pub fn parse_demo<I: IntoIterator<Item = String>>(args: I) -> Result<DemoOptions, String> {
    let mut o = DemoOptions {
        seconds: 10.0,
        threads: 1,
        duty: 100.0,
        progress: None,
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
            "-u" | "--duty" => {
                let v = value("-u")?;
                o.duty = match v.parse::<f64>() {
                    Ok(p) if p > 0.0 && p <= 100.0 => p,
                    _ => return Err(format!("-u wants a percentage in (0, 100], not `{v}`")),
                };
            }
            "-p" | "--progress" => {
                let v = value("-p")?;
                o.progress = match v.parse::<f64>() {
                    Ok(s) if s.is_finite() && (0.01..=3600.0).contains(&s) => Some(s),
                    _ => return Err(format!("-p wants seconds in [0.01, 3600], not `{v}`")),
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
        use vmscope_workload::io::Mode;
        let o = parse_dd(["if=/dev/vdb", "bs=4k", "count=8000", "iflag=direct"].map(String::from))
            .unwrap()
            .spec;
        assert_eq!(o.path, PathBuf::from("/dev/vdb"));
        assert_eq!(
            (o.block_size, o.count, o.offset, o.mode),
            (4096, 8000, 0, Mode::DirectRead)
        );
        let o = parse_dd(["if=/x", "skip=3"].map(String::from))
            .unwrap()
            .spec;
        assert_eq!(
            (o.block_size, o.count, o.offset, o.mode),
            (512, u64::MAX, 1536, Mode::BufferedRead)
        );
        let o = parse_dd(
            [
                "if=/dev/zero",
                "of=/y",
                "bs=1M",
                "count=4",
                "conv=fdatasync",
            ]
            .map(String::from),
        )
        .unwrap()
        .spec;
        assert_eq!((o.path.to_str(), o.mode), (Some("/y"), Mode::BufferedWrite));
        let o = parse_dd(["of=/y", "bs=1M", "count=4", "seek=2", "oflag=direct"].map(String::from))
            .unwrap()
            .spec;
        assert_eq!(
            (o.mode, o.offset, o.create),
            (Mode::DirectWrite, 2 << 20, true)
        );
        let o = parse_dd(["of=/y", "count=1"].map(String::from))
            .unwrap()
            .spec;
        assert_eq!(o.mode, Mode::BufferedWriteNosync);
        assert!(parse_dd(["of=/y"].map(String::from))
            .unwrap_err()
            .contains("count"));
        assert!(parse_dd(["bs=512"].map(String::from))
            .unwrap_err()
            .contains("if=FILE"));
        assert!(parse_dd(["if=/x", "of=/y"].map(String::from))
            .unwrap_err()
            .contains("does not copy"));
        assert!(parse_dd(["if=/x", "iflag=sync"].map(String::from))
            .unwrap_err()
            .contains("sync"));
        assert!(parse_dd(["if=/x", "bs=0"].map(String::from)).is_err());
        assert!(parse_dd(["if=/x", "count=many"].map(String::from)).is_err());
        assert!(parse_dd(["/dev/vdb"].map(String::from))
            .unwrap_err()
            .contains("KEY=VALUE"));
    }

    #[test]
    fn io_operations() {
        use vmscope_workload::io::Mode;
        let p = |a: &[&str]| parse_io(a.iter().map(std::string::ToString::to_string));
        match p(&[
            "run",
            "/dev/vdb",
            "mode=direct-read",
            "bs=64k",
            "count=16",
            "offset=1M",
        ])
        .unwrap()
        {
            IoCommand::Run(s) => {
                assert_eq!(s.path, PathBuf::from("/dev/vdb"));
                assert_eq!(
                    (s.mode, s.block_size, s.count, s.offset, s.create),
                    (Mode::DirectRead, 65536, 16, 1 << 20, false)
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            p(&["inspect", "/dev/vda"]).unwrap(),
            IoCommand::Inspect("/dev/vda".into())
        );
        assert_eq!(
            p(&["fill", "/dev/vda", "size=2M"]).unwrap(),
            IoCommand::Fill {
                path: "/dev/vda".into(),
                offset: 0,
                size: 2 << 20
            }
        );
        assert_eq!(p(&["drop-caches"]).unwrap(), IoCommand::DropCaches);
        for (bad, why) in [
            (&[][..], "operation"),
            (&["run"], "PATH"),
            (&["run", "/x", "bs=4k", "count=1"], "mode"),
            (
                &["run", "/x", "mode=fast", "bs=4k", "count=1"],
                "unknown mode",
            ),
            (&["run", "/x", "mode=direct-read", "count=1"], "bs"),
            (&["run", "/x", "mode=direct-read", "bs=0", "count=1"], "bs"),
            (&["run", "/x", "mode=direct-read", "bs=4k"], "count"),
            (
                &["run", "/x", "mode=direct-read", "bs=4k", "count=x"],
                "count",
            ),
            (&["inspect", "/x", "size=1"], "no operand"),
            (&["fill", "/x"], "size"),
            (&["drop-caches", "/x"], "no arguments"),
            (&["zap", "/x"], "unknown io operation"),
            (&["run", "/x", "mode"], "KEY=VALUE"),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
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
                threads: 1,
                duty: 100.0,
                progress: None
            }
        );
        assert_eq!(
            d(&["-d", "2.5", "-t", "3", "-u", "30", "-p", "0.5"]).unwrap(),
            DemoOptions {
                seconds: 2.5,
                threads: 3,
                duty: 30.0,
                progress: Some(0.5)
            }
        );
        for bad in [
            &["-p", "0"][..],
            &["-p", "x"],
            &["-d", "0"],
            &["-d", "x"],
            &["-t", "0"],
            &["-t"],
            &["-u", "0"],
            &["-u", "101"],
            &["-u", "x"],
            &["-x"],
        ] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }
}
