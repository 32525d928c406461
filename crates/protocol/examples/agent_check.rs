//! Talks to a guest agent through QEMU's virtio-serial chardev socket:
//! `cargo run -p vmscope-protocol --example agent_check -- SOCKET [--pings N] [--put BYTES] [-- ARGV...]`
//! Prints the hello, ping round trips, the result of ARGV and of a file copy.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vmscope_protocol::AgentClient;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let socket = args
        .next()
        .ok_or("usage: agent_check SOCKET [--pings N] [--put BYTES] [-- ARGV...]")?;
    let mut pings = 5usize;
    let mut put = 0usize;
    let mut argv = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pings" => pings = args.next().ok_or("--pings N")?.parse()?,
            "--put" => put = args.next().ok_or("--put BYTES")?.parse()?,
            "--" => argv.extend(args.by_ref()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let t0 = Instant::now();
    let stream = UnixStream::connect(&socket)?;
    let (mut agent, hello) = AgentClient::connect(stream, Duration::from_secs(120))?;
    println!("hello after {:?}: {hello:?}", t0.elapsed());
    let mut rtts = Vec::new();
    for _ in 0..pings {
        rtts.push(agent.ping(Duration::from_secs(10))?);
    }
    rtts.sort();
    if !rtts.is_empty() {
        println!(
            "ping x{pings}: min {:?} median {:?} max {:?}",
            rtts[0],
            rtts[rtts.len() / 2],
            rtts[rtts.len() - 1]
        );
    }
    if put > 0 {
        let data: Vec<u8> = (0..put).map(|i| (i * 31 % 251) as u8).collect();
        let t = Instant::now();
        let n = agent.put_file(
            &data,
            "/tmp/agent_check.bin",
            0o640,
            Duration::from_secs(600),
        )?;
        let s = t.elapsed().as_secs_f64();
        println!(
            "put_file {n} bytes in {s:.2} s ({:.2} MiB/s)",
            n as f64 / s / f64::from(1 << 20)
        );
    }
    if !argv.is_empty() {
        match agent.exec(&argv, Duration::from_secs(60)) {
            Ok(out) => {
                println!(
                    "exit {} (truncated {}, timed out {})",
                    out.exit_code, out.truncated, out.timed_out
                );
                print!("{}", String::from_utf8_lossy(&out.stdout));
                eprint!("{}", String::from_utf8_lossy(&out.stderr));
            }
            Err(e) => println!("exec: {e}"),
        }
    }
    println!(
        "skipped {} garbage bytes, ignored {} frames",
        agent.skipped_bytes(),
        agent.ignored_frames()
    );
    Ok(())
}
