//! Profiles a guest through its agent socket and prints what came back:
//! `cargo run -p vmscope-protocol --example profile_check -- SOCKET [SECONDS]`.
//! With `DEMO=SECONDS` (and an agent started with `--allow-exec`) it first
//! starts `/usr/bin/vmscope-agent demo -d SECONDS` in the guest in the
//! background, to show the demo's 50/30/20 split.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vmscope_protocol::{AgentClient, ProfileConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let sock = args.next().ok_or("usage: profile_check SOCKET [SECONDS]")?;
    let secs: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(4.0);
    let t = Duration::from_secs(30);
    let (mut agent, hello) = AgentClient::connect(UnixStream::connect(&sock)?, t)?;
    println!(
        "agent {} protocol {} kernel {} cpus {} capabilities {:?}",
        hello.agent_version, hello.protocol, hello.kernel, hello.cpus, hello.capabilities
    );
    let t0 = Instant::now();
    let (text, modules) = agent.kallsyms(t)?;
    println!(
        "kallsyms: {} bytes, {} lines, {} modules, in {:.2} s",
        text.len(),
        text.lines().count(),
        modules.len(),
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    let ready = agent.profile_start(&ProfileConfig::default(), t)?;
    println!(
        "ready in {:.2} s: cpus {} events {:?}",
        t0.elapsed().as_secs_f64(),
        ready.cpus,
        ready.events
    );
    if let Ok(d) = std::env::var("DEMO") {
        let cmd = format!("/usr/bin/vmscope-agent demo -d {d} > /tmp/demo.out 2>&1 &");
        let argv = ["sh".to_string(), "-c".to_string(), cmd];
        let out = agent.exec(&argv, t)?;
        println!("demo started (exit {})", out.exit_code);
    }
    let mut rows = Vec::new();
    let (mut samples, mut lost, mut polls) = (0, 0, 0);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_millis(500));
        let p0 = Instant::now();
        let d = agent.profile_poll(t)?;
        polls += 1;
        println!(
            "poll seq {} rows {} samples {} lost {} ({:.0} ms)",
            d.seq,
            d.rows.len(),
            d.samples,
            d.lost,
            p0.elapsed().as_secs_f64() * 1000.0
        );
        samples += d.samples;
        lost += d.lost;
        rows.extend(d.rows);
    }
    let end = agent.profile_stop(t)?;
    samples += end.samples;
    lost += end.lost;
    rows.extend(end.rows);
    println!(
        "{polls} polls, {samples} samples, {lost} lost, last {}",
        end.last
    );
    if std::env::var("DEMO").is_ok() {
        std::thread::sleep(Duration::from_secs(1));
        let argv = ["cat".to_string(), "/tmp/demo.out".to_string()];
        let out = agent.exec(&argv, t)?;
        println!("demo: {}", String::from_utf8_lossy(&out.stdout).trim());
    }
    let mut by: HashMap<(String, String, String), u64> = HashMap::new();
    for r in rows {
        *by.entry((r.context, r.image, r.symbol)).or_default() += r.samples;
    }
    let mut top: Vec<_> = by.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    let demo: u64 = top
        .iter()
        .filter(|e| e.0 .2.starts_with("vmscope_demo_"))
        .map(|e| e.1)
        .sum();
    for ((ctx, image, symbol), n) in top.iter().take(15) {
        let share = if symbol.starts_with("vmscope_demo_") && demo > 0 {
            format!(" ({:.1} % of the demo)", 100.0 * *n as f64 / demo as f64)
        } else {
            String::new()
        };
        println!("{n:>7} {ctx:<13} {image:<28} {symbol}{share}");
    }
    Ok(())
}
