//! `vmscope-agent net` and `vmscope-agent scale`: the engines of `vmscope
//! bench net` and `vmscope bench scale` (`vmscope_workload::net`,
//! `vmscope_workload::scale`) as commands, each printing one JSON line.
//! The host runs the same code, in-process or as this command.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;
use vmscope_workload::io::parse_size;
use vmscope_workload::net::{self, RecvSpec, SendSpec};
use vmscope_workload::scale::{self, ScaleSpec, Workload};

/// What `vmscope-agent net` is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetCommand {
    Send(SendSpec),
    Recv(RecvSpec),
    /// Exit 0 when the address can be listened on, else say why.
    CheckPort(SocketAddr),
}

fn key_values(
    op: &str,
    args: impl Iterator<Item = String>,
    allowed: &[&str],
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut kv = std::collections::BTreeMap::new();
    for a in args {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| format!("{op} operands are KEY=VALUE, not `{a}`"))?;
        if !allowed.contains(&k) {
            return Err(format!(
                "{op} has no operand `{k}` (it takes {})",
                allowed.join(", ")
            ));
        }
        kv.insert(k.to_string(), v.to_string());
    }
    Ok(kv)
}

fn addr(kv: &std::collections::BTreeMap<String, String>, key: &str) -> Result<SocketAddr, String> {
    let v = kv.get(key).ok_or_else(|| format!("needs {key}=IP:PORT"))?;
    v.parse()
        .map_err(|_| format!("{key} wants IP:PORT (such as 10.0.0.2:5001), not `{v}`"))
}

fn number<T: std::str::FromStr>(
    kv: &std::collections::BTreeMap<String, String>,
    key: &str,
    default: T,
) -> Result<T, String> {
    match kv.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("{key} wants a number, not `{v}`")),
    }
}

fn seconds(
    kv: &std::collections::BTreeMap<String, String>,
    key: &str,
    default: f64,
) -> Result<Duration, String> {
    let s: f64 = number(kv, key, default)?;
    if !(s > 0.0 && s <= 86_400.0) {
        return Err(format!("{key} wants seconds in (0, 86400], not {s}"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Parses the arguments after `net`:
/// `send to=IP:PORT [streams=N] [seconds=S] [connect-timeout=S]`,
/// `recv listen=IP:PORT [streams=N] [buf=SIZE] [timeout=S]`,
/// `check-port listen=IP:PORT`.
pub fn parse_net<I: IntoIterator<Item = String>>(args: I) -> Result<NetCommand, String> {
    let mut it = args.into_iter();
    let op = it
        .next()
        .ok_or("net needs an operation: send, recv or check-port")?;
    match op.as_str() {
        "send" => {
            let kv = key_values(
                "net send",
                it,
                &["to", "streams", "seconds", "connect-timeout"],
            )?;
            Ok(NetCommand::Send(SendSpec {
                to: addr(&kv, "to").map_err(|e| format!("net send {e}"))?,
                streams: number(&kv, "streams", 1)?,
                duration: seconds(&kv, "seconds", 10.0)?,
                connect_timeout: seconds(&kv, "connect-timeout", 30.0)?,
            }))
        }
        "recv" => {
            let kv = key_values("net recv", it, &["listen", "streams", "buf", "timeout"])?;
            let buf = match kv.get("buf") {
                Some(b) => parse_size(b)?,
                None => 64 << 10,
            };
            Ok(NetCommand::Recv(RecvSpec {
                listen: addr(&kv, "listen").map_err(|e| format!("net recv {e}"))?,
                streams: number(&kv, "streams", 1)?,
                buf,
                accept_timeout: seconds(&kv, "timeout", 60.0)?,
                idle: net::RECV_IDLE,
            }))
        }
        "check-port" => {
            let kv = key_values("net check-port", it, &["listen"])?;
            Ok(NetCommand::CheckPort(
                addr(&kv, "listen").map_err(|e| format!("net check-port {e}"))?,
            ))
        }
        other => Err(format!(
            "unknown net operation `{other}` (send, recv, check-port)"
        )),
    }
}

/// Parses the arguments after `scale`:
/// `memwrite|cpu [threads=N] [seconds=S] [size=BYTES]`.
pub fn parse_scale<I: IntoIterator<Item = String>>(args: I) -> Result<ScaleSpec, String> {
    let mut it = args.into_iter();
    let w = it.next().ok_or("scale needs a workload: memwrite or cpu")?;
    let workload = Workload::parse(&w)
        .ok_or_else(|| format!("unknown scale workload `{w}` (memwrite, cpu)"))?;
    let kv = key_values("scale", it, &["threads", "seconds", "size"])?;
    Ok(ScaleSpec {
        workload,
        threads: number(&kv, "threads", 1)?,
        duration: seconds(&kv, "seconds", 5.0)?,
        buffer: match kv.get("size") {
            Some(s) => parse_size(s)?,
            None => scale::DEFAULT_BUFFER,
        },
    })
}

fn print_json<T: serde::Serialize>(what: &str, r: Result<T, String>) -> ExitCode {
    match r.and_then(|v| serde_json::to_string(&v).map_err(|e| e.to_string())) {
        Ok(l) => {
            println!("{l}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vmscope-agent {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `vmscope-agent net ...`.
pub fn net_main(args: impl Iterator<Item = String>) -> ExitCode {
    let cmd = match parse_net(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vmscope-agent net: {e}\n{}", crate::args::USAGE);
            return ExitCode::from(2);
        }
    };
    match cmd {
        NetCommand::Send(s) => print_json("net send", net::send(&s).map_err(|e| e.to_string())),
        NetCommand::Recv(s) => print_json("net recv", net::recv(&s).map_err(|e| e.to_string())),
        NetCommand::CheckPort(a) => print_json(
            "net check-port",
            net::check_port(a)
                .map(|()| serde_json::json!({"free": a.to_string()}))
                .map_err(|e| e.to_string()),
        ),
    }
}

/// `vmscope-agent scale ...`.
pub fn scale_main(args: impl Iterator<Item = String>) -> ExitCode {
    let spec = match parse_scale(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vmscope-agent scale: {e}\n{}", crate::args::USAGE);
            return ExitCode::from(2);
        }
    };
    print_json("scale", scale::run(&spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn net_operations() {
        match parse_net(v(&["send", "to=10.0.0.2:5001", "streams=4", "seconds=2.5"])).unwrap() {
            NetCommand::Send(s) => {
                assert_eq!(s.to, "10.0.0.2:5001".parse().unwrap());
                assert_eq!(s.streams, 4);
                assert_eq!(s.duration, Duration::from_millis(2500));
                assert_eq!(s.connect_timeout, Duration::from_secs(30));
            }
            other => panic!("{other:?}"),
        }
        match parse_net(v(&["recv", "listen=0.0.0.0:5001", "buf=4k"])).unwrap() {
            NetCommand::Recv(r) => {
                assert_eq!((r.buf, r.streams), (4096, 1));
                assert_eq!(r.accept_timeout, Duration::from_secs(60));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_net(v(&["check-port", "listen=127.0.0.1:80"])).unwrap(),
            NetCommand::CheckPort("127.0.0.1:80".parse().unwrap())
        );
        for (bad, why) in [
            (&[][..], "operation"),
            (&["zap"], "unknown net operation"),
            (&["send"], "to=IP:PORT"),
            (&["send", "to=host:1"], "IP:PORT"),
            (&["send", "to=1.2.3.4:1", "seconds=0"], "seconds"),
            (&["send", "to=1.2.3.4:1", "streams=x"], "number"),
            (&["recv", "listen=1.2.3.4:1", "buf=1Q"], "suffix"),
            (&["recv", "listen=1.2.3.4:1", "rate=3"], "no operand"),
            (&["recv", "listen"], "KEY=VALUE"),
        ] {
            let e = parse_net(v(bad)).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn scale_operations() {
        let s = parse_scale(v(&["memwrite", "threads=2", "seconds=1", "size=1M"])).unwrap();
        assert_eq!(
            (s.workload, s.threads, s.buffer),
            (Workload::MemWrite, 2, 1 << 20)
        );
        let s = parse_scale(v(&["cpu"])).unwrap();
        assert_eq!((s.threads, s.duration), (1, Duration::from_secs(5)));
        assert!(parse_scale(v(&[])).unwrap_err().contains("workload"));
        assert!(parse_scale(v(&["disk"])).unwrap_err().contains("memwrite"));
        assert!(parse_scale(v(&["cpu", "n=1"]))
            .unwrap_err()
            .contains("no operand"));
    }
}
