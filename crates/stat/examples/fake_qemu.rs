//! A synthetic "QEMU" for tests and the overhead benchmark: a process whose
//! argv[0] is `qemu-system-x86_64` (so discovery takes it) with N threads
//! named `CPU n/KVM`. Each thread sleeps `--period-ms`, then spins for
//! `--spin-us`, and again (a cycle is the period plus the spin, not the
//! period), so its schedstat moves.
//!
//! `rename N NAME` on stdin renames vCPU N's thread.
//!
//! `fake_qemu --vcpus 500 [--name NAME | --name-hex HEX] [--tap IFNAME]
//! [--period-ms 100] [--spin-us 0]`: prints `ready PID` once every thread is
//! named, then runs until killed. `--name-hex` gives the name as bytes (any
//! bytes: QEMU takes them, and so must vmscope).

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    // A name given as bytes may not be UTF-8: the child reads its
    // arguments lossily.
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if std::env::var_os("FAKE_QEMU_CHILD").is_none() {
        use std::os::unix::ffi::OsStringExt;
        // Re-exec under QEMU's name, keeping the pid.
        let vcpus = arg(&args, "--vcpus").unwrap_or_else(|| "4".into());
        let name: Vec<u8> = match arg(&args, "--name-hex") {
            Some(hex) => (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("--name-hex"))
                .collect(),
            None => arg(&args, "--name")
                .unwrap_or_else(|| "fake".into())
                .into_bytes(),
        };
        let mut guest = b"guest=".to_vec();
        guest.extend_from_slice(&name);
        guest.extend_from_slice(b",debug-threads=on");
        let mut qemu_args: Vec<std::ffi::OsString> = vec![
            "-name".into(),
            std::ffi::OsString::from_vec(guest),
            "-smp".into(),
            vcpus.clone().into(),
            "-accel".into(),
            "kvm".into(),
        ];
        if let Some(tap) = arg(&args, "--tap") {
            qemu_args.push("-netdev".into());
            qemu_args.push(format!("tap,id=n0,ifname={tap},script=no,downscript=no").into());
        }
        for k in ["--period-ms", "--spin-us"] {
            if let Some(v) = arg(&args, k) {
                qemu_args.push(k.into());
                qemu_args.push(v.into());
            }
        }
        let err = std::process::Command::new("/proc/self/exe")
            .arg0("qemu-system-x86_64")
            .args(&qemu_args)
            .env("FAKE_QEMU_CHILD", "1")
            .exec();
        eprintln!("fake_qemu: exec: {err}");
        std::process::exit(1);
    }
    let vcpus: usize = arg(&args, "-smp").and_then(|v| v.parse().ok()).unwrap_or(4);
    let period = Duration::from_millis(
        arg(&args, "--period-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(100),
    );
    let spin = Duration::from_micros(
        arg(&args, "--spin-us")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..vcpus {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(format!("CPU {i}/KVM"))
            .stack_size(64 * 1024)
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let _ = tx.send(unsafe { libc::gettid() });
                loop {
                    std::thread::sleep(period);
                    let t = Instant::now();
                    while t.elapsed() < spin {
                        std::hint::spin_loop();
                    }
                }
            })
            .expect("spawn thread");
    }
    let tids: Vec<i32> = (0..vcpus).filter_map(|_| rx.recv().ok()).collect();
    println!("ready {}", std::process::id());
    let _ = std::io::stdout().flush();
    // `rename N NAME` on stdin renames the thread of vCPU N (only the
    // process itself may rename its threads).
    let stdin = std::io::stdin();
    for line in stdin.lock().lines().map_while(Result::ok) {
        let mut w = line.splitn(3, ' ');
        if let (Some("rename"), Some(n), Some(name)) = (w.next(), w.next(), w.next()) {
            let by_name = format!("CPU {n}/KVM");
            let tid = tids.iter().find(|t| {
                std::fs::read_to_string(format!("/proc/self/task/{t}/comm"))
                    .is_ok_and(|c| c.trim() == by_name)
            });
            if let Some(t) = tid {
                let _ = std::fs::write(format!("/proc/self/task/{t}/comm"), name);
            }
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
