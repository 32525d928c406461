//! Simulated VMs for the many-VMs benchmark (`bench/many-vms`) and its test
//! (`crates/cli/tests/many_vms.rs`): processes that look like QEMU to
//! vmscope's discovery and serve the real agent protocol over a real Unix
//! socket, streaming synthetic guest samples at the rate the host asks
//! (`profile_start`'s frequency, per vCPU).
//!
//! Each simulated VM is one process whose argv[0] is `qemu-system-x86_64`,
//! with `-name guest=NAME,debug-threads=on`, `-smp V`, threads named
//! `CPU n/KVM`, and the agent channel's QEMU arguments from
//! `vmscope_discover::agent_channel::qemu_args` (the lab's own): discovery
//! finds the `vmscope.agent` port and its socket path exactly as for a lab
//! VM. Like QEMU's socket chardev it takes one host connection at a time
//! (vmscope's broker holds it).
//!
//! The protocol side uses the protocol crate's own decoder, encoder, message
//! types and limits, so every frame is a real one. The session bookkeeping
//! (streams, `profile_start`/`poll`/`stop`, `seq`, `last`, `close_stream`,
//! `get_kallsyms` slices) is written again here, in a hundred lines: the
//! agent is a binary crate with no library target, and its profiling worker
//! is built around the perf_event `Recorder` and the engine's `Converter`
//! over real rings and ELF files; giving it a synthetic sample source would
//! mean restructuring the guest binary, which this benchmark is not about
//! (it measures the host side).
//!
//! Samples: the real agent reads its rings every 250 ms and aggregates rows
//! until the host polls; here each poll generates exactly the samples due
//! since the previous one (`frequency` × elapsed, per vCPU, cumulative so
//! nothing drifts), spread over a fixed guest profile of kernel, module and
//! user functions with skewed weights (idle, scheduler, network driver,
//! a database, a web server, libc), aggregated into rows by (context,
//! process, image, symbol, stack, vCPU) as the agent does. Rows carry call
//! stacks when the host asks for them.
//!
//! Usage:
//! `sim_vms --count N [--vcpus V] [--prefix many] --dir DIR`
//! starts N simulated VMs named PREFIX0..PREFIX{N-1} with sockets
//! `DIR/PREFIXi.sock`, prints `ready PID,PID,…` and runs until its standard
//! input closes (or says `stop`). Then it ends every VM and prints one JSON
//! line: `{"vms":N,"sent_samples":S,"sent_rows":R,"sessions":K,
//! "cpu_s":C,"per_vm":{"NAME":S,…},"by_hz":{"1000":S,…},
//! "per_vm_hz":{"NAME":{"1000":S,…},…}}`: guest samples
//! sent in `profile_data` answers fully written to the socket (in all, per
//! VM, and per session frequency: a second host tool profiling the same
//! VMs shows as more sessions), and the simulators' own CPU (user +
//! system, from wait4).

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmscope_protocol::{
    capability, encode_response_on, row_context, AgentHello, Decoder, DeltaCost, ErrorKind,
    ProfileRow, Request, Response, KALLSYMS_CHUNK, MAX_PROFILE_EVENTS, MAX_PROFILE_FREQUENCY,
    PROTOCOL_VERSION,
};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn die(msg: &str) -> ! {
    eprintln!("sim_vms: {msg}");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if std::env::var_os("SIM_VM_CHILD").is_some() {
        child(&args);
    } else {
        parent(&args);
    }
}

// ---------------------------------------------------------------- launcher

fn parent(args: &[String]) {
    let count: usize = arg(args, "--count")
        .map(|v| v.parse().unwrap_or_else(|_| die("--count: not a number")))
        .unwrap_or(1);
    let vcpus: u32 = arg(args, "--vcpus")
        .map(|v| v.parse().unwrap_or_else(|_| die("--vcpus: not a number")))
        .unwrap_or(2);
    let prefix = arg(args, "--prefix").unwrap_or_else(|| "many".into());
    let dir = PathBuf::from(arg(args, "--dir").unwrap_or_else(|| die("--dir DIR is required")));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
    let mut kids = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}{i}");
        let sock = dir.join(format!("{name}.sock"));
        let mut qemu = vec![
            "-name".to_string(),
            format!("guest={name},debug-threads=on"),
            "-smp".into(),
            vcpus.to_string(),
            "-accel".into(),
            "kvm".into(),
        ];
        qemu.extend(vmscope_discover::agent_channel::qemu_args(&sock));
        let mut child = Command::new("/proc/self/exe");
        child
            .arg0("qemu-system-x86_64")
            .args(&qemu)
            .env("SIM_VM_CHILD", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // A simulator killed by a signal takes its VMs with it (they would
        // otherwise stay, found by the next run's discovery as VMs of the
        // same names).
        // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
        unsafe {
            child.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = child
            .spawn()
            .unwrap_or_else(|e| die(&format!("starting VM {name}: {e}")));
        let out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        kids.push((name, child, out));
    }
    let mut pids = Vec::new();
    for (name, child, out) in &mut kids {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap_or(0) == 0 || !line.starts_with("ready") {
            die(&format!("VM {name} did not start"));
        }
        pids.push(child.id().to_string());
    }
    println!("ready {}", pids.join(","));
    let _ = std::io::stdout().flush();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        if line.trim() == "stop" {
            break;
        }
    }
    // Each VM prints its totals and exits when its stdin closes.
    let mut per_vm = serde_json::Map::new();
    let mut by_hz = std::collections::BTreeMap::<String, u64>::new();
    let mut per_vm_hz = serde_json::Map::new();
    let (mut sent, mut rows, mut sessions, mut cpu_s) = (0u64, 0u64, 0u64, 0f64);
    for (name, mut child, mut out) in kids {
        drop(child.stdin.take());
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
        let s = v["sent_samples"].as_u64().unwrap_or(0);
        sent += s;
        rows += v["sent_rows"].as_u64().unwrap_or(0);
        sessions += v["sessions"].as_u64().unwrap_or(0);
        per_vm.insert(name.clone(), s.into());
        if let Some(m) = v["by_hz"].as_object() {
            for (hz, n) in m {
                *by_hz.entry(hz.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
            per_vm_hz.insert(name.clone(), serde_json::Value::Object(m.clone()));
        }
        cpu_s += wait_cpu(child.id());
    }
    // The reader may be gone (an interrupted benchmark): no panic then.
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        serde_json::json!({
            "vms": count, "vcpus": vcpus, "sent_samples": sent, "sent_rows": rows,
            "sessions": sessions, "cpu_s": cpu_s, "per_vm": per_vm, "by_hz": by_hz,
            "per_vm_hz": per_vm_hz,
        })
    );
}

/// Waits for child `pid`; its user + system CPU seconds (rusage from wait4).
fn wait_cpu(pid: u32) -> f64 {
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 writes it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own child; status and ru point to live locals.
    let r = unsafe { libc::wait4(pid as i32, &raw mut status, 0, &raw mut ru) };
    if r < 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

// ---------------------------------------------------------------- one VM

/// Totals of one simulated VM.
#[derive(Default)]
struct Totals {
    samples: AtomicU64,
    /// Samples sent by sessions of each frequency: another host tool
    /// profiling these VMs at the same time (its own stream, its own rate)
    /// shows up here.
    by_hz: std::sync::Mutex<std::collections::BTreeMap<u64, u64>>,
    rows: AtomicU64,
    sessions: AtomicU64,
}

fn child(args: &[String]) {
    let name = arg(args, "-name")
        .and_then(|v| {
            v.split(',')
                .find_map(|kv| kv.strip_prefix("guest=").map(str::to_string))
        })
        .unwrap_or_else(|| die("no -name guest=NAME"));
    let vcpus: u32 = arg(args, "-smp").and_then(|v| v.parse().ok()).unwrap_or(1);
    let sock = args
        .iter()
        .find_map(|a| {
            a.split(',')
                .find_map(|kv| kv.strip_prefix("path=").map(PathBuf::from))
        })
        .unwrap_or_else(|| die("no chardev path= on the command line"));
    // Idle vCPU threads, named as QEMU names them.
    for i in 0..vcpus {
        std::thread::Builder::new()
            .name(format!("CPU {i}/KVM"))
            .stack_size(64 * 1024)
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(3600));
            })
            .expect("spawn vCPU thread");
    }
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)
        .unwrap_or_else(|e| die(&format!("binding {}: {e}", sock.display())));
    let totals = Arc::new(Totals::default());
    {
        let totals = Arc::clone(&totals);
        let sock = sock.clone();
        std::thread::spawn(move || {
            // Ends the VM when the launcher closes our stdin.
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            let _ = std::fs::remove_file(&sock);
            println!(
                "{}",
                serde_json::json!({
                    "sent_samples": totals.samples.load(Ordering::SeqCst),
                    "sent_rows": totals.rows.load(Ordering::SeqCst),
                    "sessions": totals.sessions.load(Ordering::SeqCst),
                    "by_hz": *totals.by_hz.lock().unwrap(),
                })
            );
            let _ = std::io::stdout().flush();
            std::process::exit(0);
        });
    }
    println!("ready {}", std::process::id());
    let _ = std::io::stdout().flush();
    // One host connection at a time, as QEMU's socket chardev.
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        serve(conn, &name, vcpus, &totals);
    }
}

/// One profiling session (one per stream).
struct Session {
    events: usize,
    frequency: u64,
    callchain: bool,
    start: Instant,
    /// Samples generated so far, per vCPU.
    generated: Vec<u64>,
    seq: u64,
    rng: u64,
    thread_cpu_ns: u64,
    last_cut: Instant,
}

/// The guest's profile: (context, process, image, symbol, stack, weight).
const PROFILE: &[(&str, &str, &str, &str, &str, u32)] = &[
    ("k", "swapper", "[kernel.kallsyms]", "native_safe_halt", "secondary_startup_64_no_verify;start_secondary;cpu_startup_entry;do_idle;default_idle_call;native_safe_halt", 300),
    ("k", "swapper", "[kernel.kallsyms]", "__do_softirq", "secondary_startup_64_no_verify;start_secondary;cpu_startup_entry;do_idle;irq_exit_rcu;__do_softirq", 20),
    ("k", "postgres", "[kernel.kallsyms]", "__schedule", "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_epoll_wait;do_epoll_wait;schedule_hrtimeout_range;schedule;__schedule", 40),
    ("k", "postgres", "[kernel.kallsyms]", "copy_user_enhanced_fast_string", "entry_SYSCALL_64_after_hwframe;do_syscall_64;ksys_read;vfs_read;ext4_file_read_iter;filemap_read;copy_page_to_iter;copy_user_enhanced_fast_string", 35),
    ("k", "postgres", "[kernel.kallsyms]", "filemap_get_read_batch", "entry_SYSCALL_64_after_hwframe;do_syscall_64;ksys_read;vfs_read;ext4_file_read_iter;filemap_read;filemap_get_pages;filemap_get_read_batch", 12),
    ("k", "nginx", "[kernel.kallsyms]", "tcp_sendmsg_locked", "entry_SYSCALL_64_after_hwframe;do_syscall_64;__sys_sendto;sock_sendmsg;tcp_sendmsg;tcp_sendmsg_locked", 18),
    ("k", "nginx", "[virtio_net]", "start_xmit", "entry_SYSCALL_64_after_hwframe;do_syscall_64;__sys_sendto;tcp_sendmsg;__tcp_push_pending_frames;tcp_write_xmit;ip_finish_output2;__dev_queue_xmit;dev_hard_start_xmit;start_xmit", 10),
    ("k", "ksoftirqd/0", "[virtio_net]", "virtnet_poll", "ret_from_fork;kthread;smpboot_thread_fn;run_ksoftirqd;__do_softirq;net_rx_action;virtnet_poll", 9),
    ("k", "kworker/0:1", "[virtio_blk]", "virtio_queue_rq", "ret_from_fork;kthread;worker_thread;process_one_work;blk_mq_run_work_fn;__blk_mq_sched_dispatch_requests;virtio_queue_rq", 5),
    ("k", "jbd2/vda1-8", "[jbd2]", "jbd2_journal_commit_transaction", "ret_from_fork;kthread;kjournald2;jbd2_journal_commit_transaction", 4),
    ("k", "postgres", "[kernel.kallsyms]", "clear_page_erms", "asm_exc_page_fault;exc_page_fault;do_user_addr_fault;handle_mm_fault;__handle_mm_fault;do_anonymous_page;clear_page_erms", 8),
    ("u", "postgres", "/usr/lib/postgresql/15/bin/postgres", "hash_search_with_hash_value", "_start;__libc_start_main;main;PostmasterMain;ServerLoop;BackendStartup;PostgresMain;exec_simple_query;PortalRun;ExecutorRun;ExecScan;hash_search_with_hash_value", 45),
    ("u", "postgres", "/usr/lib/postgresql/15/bin/postgres", "ExecInterpExpr", "_start;__libc_start_main;main;PostmasterMain;ServerLoop;BackendStartup;PostgresMain;exec_simple_query;PortalRun;ExecutorRun;ExecScan;ExecInterpExpr", 38),
    ("u", "postgres", "/usr/lib/postgresql/15/bin/postgres", "heap_getnextslot", "_start;__libc_start_main;main;PostmasterMain;ServerLoop;BackendStartup;PostgresMain;exec_simple_query;PortalRun;ExecutorRun;ExecSeqScan;heap_getnextslot", 30),
    ("u", "postgres", "/usr/lib/postgresql/15/bin/postgres", "LWLockAcquire", "_start;__libc_start_main;main;PostmasterMain;ServerLoop;BackendStartup;PostgresMain;exec_simple_query;PortalRun;ExecutorRun;ReadBuffer_common;LWLockAcquire", 14),
    ("u", "postgres", "/usr/lib/x86_64-linux-gnu/libc.so.6", "__memcmp_avx2_movbe", "_start;__libc_start_main;main;PostmasterMain;ServerLoop;BackendStartup;PostgresMain;exec_simple_query;PortalRun;ExecutorRun;ExecSort;tuplesort_performsort;__memcmp_avx2_movbe", 16),
    ("u", "nginx", "/usr/sbin/nginx", "ngx_http_parse_request_line", "_start;__libc_start_main;main;ngx_master_process_cycle;ngx_worker_process_cycle;ngx_process_events_and_timers;ngx_epoll_process_events;ngx_http_wait_request_handler;ngx_http_process_request_line;ngx_http_parse_request_line", 15),
    ("u", "nginx", "/usr/sbin/nginx", "ngx_http_write_filter", "_start;__libc_start_main;main;ngx_master_process_cycle;ngx_worker_process_cycle;ngx_process_events_and_timers;ngx_http_output_filter;ngx_http_write_filter", 7),
    ("u", "nginx", "/usr/lib/x86_64-linux-gnu/libcrypto.so.3", "aesni_gcm_encrypt", "_start;__libc_start_main;main;ngx_worker_process_cycle;ngx_ssl_write;SSL_write;ssl3_write_bytes;aesni_gcm_encrypt", 12),
    ("u", "python3", "/usr/bin/python3.11", "_PyEval_EvalFrameDefault", "_start;__libc_start_main;Py_BytesMain;Py_RunMain;_PyEval_EvalFrameDefault", 25),
    ("u", "python3", "/usr/bin/python3.11", "PyObject_GetAttr", "_start;__libc_start_main;Py_BytesMain;Py_RunMain;_PyEval_EvalFrameDefault;PyObject_GetAttr", 9),
    ("u", "python3", "/usr/lib/x86_64-linux-gnu/libc.so.6", "_int_malloc", "_start;__libc_start_main;Py_BytesMain;Py_RunMain;_PyEval_EvalFrameDefault;PyObject_Malloc;malloc;_int_malloc", 6),
    ("u", "systemd-journal", "/usr/lib/systemd/libsystemd-shared-252.so", "journal_file_append_entry", "_start;__libc_start_main;main;sd_event_run;server_process_datagram;journal_file_append_entry", 2),
    ("u", "sshd", "[anon]", "0x7f3a9c0021e0", "", 1),
];

/// The modules the profile names, as `/proc/modules` lists them.
const MODULES: &[&str] = &["virtio_net", "virtio_blk", "jbd2", "ext4", "net_failover"];

impl Session {
    /// The samples due since the last cut, aggregated into rows.
    fn cut(&mut self, last: bool) -> Response {
        let now = Instant::now();
        let due = (now - self.start).as_secs_f64() * self.frequency as f64;
        let weight: u64 = PROFILE.iter().map(|p| u64::from(p.5)).sum();
        let period_ns = 1_000_000_000 / self.frequency.max(1);
        let mut rows: HashMap<(u32, usize, usize), u64> = HashMap::new();
        let mut samples = 0;
        for (cpu, done) in self.generated.iter_mut().enumerate() {
            let n = (due as u64).saturating_sub(*done);
            *done += n;
            for _ in 0..n {
                // xorshift64: cheap and deterministic per VM.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let mut pick = self.rng % weight;
                let which = PROFILE
                    .iter()
                    .position(|p| {
                        let w = u64::from(p.5);
                        if pick < w {
                            true
                        } else {
                            pick -= w;
                            false
                        }
                    })
                    .unwrap_or(0);
                let event = (self.rng >> 40) as usize % self.events;
                *rows.entry((cpu as u32, which, event)).or_default() += 1;
            }
            samples += n;
        }
        let rows: Vec<ProfileRow> = rows
            .into_iter()
            .map(|((cpu, which, event), n)| {
                let (ctx, process, image, symbol, stack, _) = PROFILE[which];
                // Per-CPU kernel threads are named after their CPU, as in Linux
                // (the idle task is `swapper`, as the agent names it).
                let process = if process.ends_with("/0") {
                    format!("{}/{cpu}", process.trim_end_matches("/0"))
                } else {
                    process.to_string()
                };
                ProfileRow {
                    event: event as u32,
                    context: if ctx == "k" {
                        row_context::GUEST_KERNEL
                    } else {
                        row_context::GUEST_USER
                    }
                    .into(),
                    process,
                    image: image.into(),
                    symbol: symbol.into(),
                    stack: if self.callchain {
                        stack.into()
                    } else {
                        String::new()
                    },
                    cpu: Some(cpu),
                    samples: n,
                    period: n * period_ns,
                }
            })
            .collect();
        self.seq += 1;
        let cpu_now = thread_cpu_ns();
        let cost = DeltaCost {
            cost_ns: cpu_now.saturating_sub(self.thread_cpu_ns),
            capacity_ns: (now - self.last_cut).as_nanos() as u64 * self.generated.len() as u64,
            rate_hz: self.frequency,
        };
        self.thread_cpu_ns = cpu_now;
        self.last_cut = now;
        Response::ProfileData {
            seq: self.seq,
            rows,
            samples,
            lost: 0,
            t_ns: vmscope_linux::clock_monotonic_ns(),
            more: false,
            last,
            cost: Some(cost),
        }
    }
}

/// This thread's CPU time, in ns.
fn thread_cpu_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A synthetic `/proc/kallsyms` of a guest kernel with the profile's
/// functions, filler symbols and the modules' symbols.
fn kallsyms_text() -> String {
    let mut out = String::new();
    let mut addr: u64 = 0xffff_ffff_8100_0000;
    let mut kernel: Vec<&str> = PROFILE
        .iter()
        .filter(|p| p.2 == "[kernel.kallsyms]")
        .flat_map(|p| p.4.split(';'))
        .collect();
    kernel.sort_unstable();
    kernel.dedup();
    for (i, f) in kernel.iter().enumerate() {
        out.push_str(&format!("{addr:016x} T {f}\n"));
        addr += 0x40 + (i as u64 % 7) * 0x30;
    }
    for i in 0..2000 {
        out.push_str(&format!("{addr:016x} t kernel_fn_{i}\n"));
        addr += 0x60;
    }
    let mut maddr: u64 = 0xffff_ffff_c000_0000;
    for p in PROFILE
        .iter()
        .filter(|p| p.2.starts_with("[virtio") || p.2 == "[jbd2]")
    {
        let module = p.2.trim_matches(|c| c == '[' || c == ']');
        out.push_str(&format!("{maddr:016x} t {}\t[{module}]\n", p.3));
        maddr += 0x1000;
    }
    out
}

/// Serves one host connection until it hangs up.
fn serve(mut conn: UnixStream, name: &str, vcpus: u32, totals: &Totals) {
    let mut dec = Decoder::new();
    let mut sessions: HashMap<u32, Session> = HashMap::new();
    let mut kallsyms: HashMap<u32, Arc<String>> = HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut seed = u64::from(std::process::id()) | 1;
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        dec.push(&buf[..n]);
        loop {
            let env = match dec.next_request() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(_) => continue, // a bad frame costs only itself
            };
            let stream = env.stream;
            let err = |kind, message: &str| Response::Error {
                kind,
                message: message.into(),
            };
            let mut sent_samples = (0, 0);
            let resp = match env.msg {
                Request::Hello { nonce, .. } => Response::Hello(AgentHello {
                    protocol: PROTOCOL_VERSION,
                    agent_version: format!("{}-sim", env!("CARGO_PKG_VERSION")),
                    kernel: "6.1.0-13-amd64".into(),
                    hostname: name.into(),
                    cpus: vcpus,
                    mem_bytes: 2 << 30,
                    capabilities: [
                        capability::PING,
                        capability::PROFILE,
                        capability::KALLSYMS,
                        capability::STREAMS,
                    ]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                    nonce,
                }),
                Request::Ping { seq } => Response::Pong { seq },
                Request::ProfileStart {
                    events,
                    frequency,
                    callchain,
                    ..
                } => {
                    use std::collections::hash_map::Entry;
                    if events.is_empty()
                        || events.len() > MAX_PROFILE_EVENTS
                        || !(1..=MAX_PROFILE_FREQUENCY).contains(&frequency)
                    {
                        err(ErrorKind::BadRequest, "bad events or frequency")
                    } else if let Entry::Vacant(slot) = sessions.entry(stream) {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let now = Instant::now();
                        slot.insert(Session {
                            events: events.len(),
                            frequency,
                            callchain,
                            start: now,
                            generated: vec![0; vcpus as usize],
                            seq: 0,
                            rng: seed | 1,
                            thread_cpu_ns: thread_cpu_ns(),
                            last_cut: now,
                        });
                        totals.sessions.fetch_add(1, Ordering::SeqCst);
                        Response::ProfileReady {
                            cpus: vcpus,
                            events,
                            t_ns: vmscope_linux::clock_monotonic_ns(),
                        }
                    } else {
                        err(ErrorKind::Busy, "a profiling session already runs")
                    }
                }
                Request::ProfilePoll {} | Request::ProfileStop {} => {
                    let stop = matches!(env.msg, Request::ProfileStop {});
                    match sessions.get_mut(&stream) {
                        None => err(ErrorKind::NotRunning, "no profiling session"),
                        Some(s) => {
                            let r = s.cut(stop);
                            if let Response::ProfileData { samples, rows, .. } = &r {
                                sent_samples = (*samples, s.frequency);
                                totals.rows.fetch_add(rows.len() as u64, Ordering::SeqCst);
                            }
                            if stop {
                                sessions.remove(&stream);
                            }
                            r
                        }
                    }
                }
                Request::GetKallsyms { offset } => {
                    let snap = if offset == 0 {
                        let s = Arc::new(kallsyms_text());
                        kallsyms.insert(stream, Arc::clone(&s));
                        Some(s)
                    } else {
                        kallsyms.get(&stream).cloned()
                    };
                    match snap {
                        Some(s) if (offset as usize) < s.len() || offset == 0 => {
                            let from = offset as usize;
                            let mut to = (from + KALLSYMS_CHUNK).min(s.len());
                            while to < s.len() && !s[..to].ends_with('\n') {
                                to -= 1;
                            }
                            Response::Kallsyms {
                                offset,
                                total: s.len() as u64,
                                text: s[from..to].to_string(),
                                modules: if offset == 0 {
                                    MODULES.iter().map(ToString::to_string).collect()
                                } else {
                                    Vec::new()
                                },
                            }
                        }
                        _ => err(ErrorKind::BadRequest, "no kallsyms snapshot at that offset"),
                    }
                }
                Request::CloseStream {} => {
                    sessions.remove(&stream);
                    kallsyms.remove(&stream);
                    Response::StreamClosed {}
                }
                Request::Exec { .. } | Request::PutFile { .. } => {
                    err(ErrorKind::Denied, "a simulated VM runs nothing")
                }
                Request::Unknown { type_name } => err(
                    ErrorKind::Unsupported,
                    &format!("unknown request type {type_name}"),
                ),
            };
            let Ok(frame) = encode_response_on(stream, env.id, &resp) else {
                continue;
            };
            if conn.write_all(&frame).is_err() {
                return;
            }
            // Counted once the whole answer is on the socket.
            totals.samples.fetch_add(sent_samples.0, Ordering::SeqCst);
            if sent_samples.0 > 0 {
                *totals
                    .by_hz
                    .lock()
                    .unwrap()
                    .entry(sent_samples.1)
                    .or_default() += sent_samples.0;
            }
        }
    }
}
