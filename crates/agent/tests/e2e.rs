//! End to end, without a VM: the built `vmscope-agent` binary served over a
//! Unix socket pair (`--stdio`) or a pseudo-terminal (`--port /dev/pts/N`,
//! the same open path as a virtio-serial port), driven by the real host
//! client from vmscope-protocol.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use vmscope_protocol::*;

const T: Duration = Duration::from_secs(20);

/// The agent under test: the test build, or another build of it (e.g. the
/// static release binary) named by `VMSCOPE_AGENT_BIN`.
fn agent_bin() -> PathBuf {
    std::env::var_os("VMSCOPE_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vmscope-agent")))
}

struct Agent {
    child: Child,
    client: AgentClient<UnixStream>,
    hello: AgentHello,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(flags: &[&str]) -> Agent {
    let (host, guest) = UnixStream::pair().unwrap();
    let out = guest.try_clone().unwrap();
    let child = Command::new(agent_bin())
        .arg("--stdio")
        .args(flags)
        .stdin(Stdio::from(OwnedFd::from(guest)))
        .stdout(Stdio::from(OwnedFd::from(out)))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (client, hello) = AgentClient::connect(host, T).unwrap();
    Agent {
        child,
        client,
        hello,
    }
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(std::string::ToString::to_string).collect()
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmscope-agent-e2e-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn hello_describes_this_machine() {
    let a = spawn(&[]);
    let h = &a.hello;
    assert_eq!(h.protocol, PROTOCOL_VERSION);
    assert_eq!(h.agent_version, env!("CARGO_PKG_VERSION"));
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(h.kernel, release.trim());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(h.hostname, host.trim());
    assert!(h.cpus >= 1);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(h.mem_bytes, kb * 1024);
    assert_eq!(
        h.capabilities,
        vec![
            "ping".to_string(),
            "profile".to_string(),
            "kallsyms".to_string(),
            "streams".to_string()
        ],
        "no exec, no file writes by default"
    );
}

#[test]
fn ping_and_unknown_requests_keep_the_connection() {
    let mut a = spawn(&[]);
    a.client.ping(T).unwrap();
    for name in ["stats", "histogram", "profile_config"] {
        match a.client.request(
            &Request::Unknown {
                type_name: name.into(),
            },
            T,
        ) {
            Err(ProtocolError::Remote { kind, message }) => {
                assert_eq!(kind, ErrorKind::Unsupported);
                assert!(message.contains(name), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    a.client.ping(T).unwrap();
}

#[test]
fn exec_and_put_file_are_denied_by_default() {
    let mut a = spawn(&[]);
    match a.client.exec(&argv(&["true"]), T) {
        Err(ProtocolError::Remote { kind, message }) => {
            assert_eq!(kind, ErrorKind::Denied);
            assert!(message.contains("--allow-exec"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let dir = tmpdir("denied");
    let dest = dir.join("f");
    match a.client.put_file(b"x", dest.to_str().unwrap(), 0o644, T) {
        Err(ProtocolError::Remote { kind, .. }) => assert_eq!(kind, ErrorKind::Denied),
        other => panic!("{other:?}"),
    }
    assert!(!dest.exists());
    a.client.ping(T).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn exec_runs_with_allow_exec() {
    let mut a = spawn(&["--allow-exec"]);
    assert!(a.client.has_capability("exec"));
    assert!(a.client.has_capability("put_file"));
    let out = a
        .client
        .exec(&argv(&["sh", "-c", "echo hi; echo oops >&2; exit 7"]), T)
        .unwrap();
    assert_eq!(out.exit_code, 7);
    assert_eq!(out.stdout, b"hi\n");
    assert_eq!(out.stderr, b"oops\n");
    assert!(!out.truncated && !out.timed_out);
    let out = a
        .client
        .exec_with_stdin(&argv(&["wc", "-c"]), Some(&[0u8; 1000]), T)
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1000");
    let out = a
        .client
        .exec(&argv(&["sleep", "30"]), Duration::from_millis(200))
        .unwrap();
    assert!(out.timed_out);
    // A missing program is an error response, not a broken connection.
    assert!(matches!(
        a.client.exec(&argv(&["/no/such/program"]), T),
        Err(ProtocolError::Remote {
            kind: ErrorKind::Io,
            ..
        })
    ));
    a.client.ping(T).unwrap();
}

/// A ping is answered while a command runs: the command waits for a gate
/// file the test creates only after the ping's answer came, so the answer
/// cannot have waited for it (if it did, the ping times out after `T`).
#[test]
fn pings_are_answered_while_a_command_runs() {
    let mut a = spawn(&["--allow-exec"]);
    let dir = tmpdir("gate");
    let gate = dir.join("gate");
    let script = format!(
        "while [ ! -e {g} ]; do sleep 0.05; done; echo done",
        g = gate.display()
    );
    // Send the exec without waiting for it, then ping.
    let frame = encode_request(
        7,
        &Request::Exec {
            argv: argv(&["sh", "-c", &script]),
            stdin: None,
            timeout_ms: 120_000,
            max_output: None,
        },
    )
    .unwrap();
    let mut raw = a.client.get_ref().try_clone().unwrap();
    raw.write_all(&frame).unwrap();
    a.client
        .ping(T)
        .expect("ping answered while the command waits");
    assert_eq!(
        a.client.ignored_frames(),
        0,
        "the command's answer came before the gate opened"
    );
    std::fs::write(&gate, b"").unwrap();
    // The command's answer (id 7) now comes and is skipped by the client;
    // the deadline only keeps a lost answer from hanging the test.
    let deadline = std::time::Instant::now() + T;
    while a.client.ignored_frames() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no answer to the command after its gate opened"
        );
        a.client.ping(T).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn put_file_writes_bytes_and_mode() {
    for flag in ["--allow-write", "--allow-exec"] {
        let mut a = spawn(&[flag]);
        let dir = tmpdir(flag.trim_start_matches('-'));
        let dest = dir.join("copied.bin");
        let data: Vec<u8> = (0..(PUT_CHUNK * 2 + 12345))
            .map(|i| (i * 7 % 256) as u8)
            .collect();
        let n = a
            .client
            .put_file(&data, dest.to_str().unwrap(), 0o751, T)
            .unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(std::fs::read(&dest).unwrap(), data);
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o751);
        // Empty file, overwriting.
        a.client
            .put_file(b"", dest.to_str().unwrap(), 0o600, T)
            .unwrap();
        assert_eq!(std::fs::read(&dest).unwrap().len(), 0);
        // A put_file without its fields is answered bad_request, not dropped.
        assert!(matches!(
            a.client.request(
                &Request::Unknown {
                    type_name: "put_file".into()
                },
                T
            ),
            Err(ProtocolError::Remote {
                kind: ErrorKind::BadRequest,
                ..
            })
        ));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn garbage_on_the_channel_is_skipped() {
    let (host, guest) = UnixStream::pair().unwrap();
    let out = guest.try_clone().unwrap();
    let mut child = Command::new(agent_bin())
        .arg("--stdio")
        .stdin(Stdio::from(OwnedFd::from(guest)))
        .stdout(Stdio::from(OwnedFd::from(out)))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut raw = host.try_clone().unwrap();
    raw.write_all(b"stale bytes VMS1\x00\x00\x10\x00 and a torn ")
        .unwrap();
    let ping = encode_request(1, &Request::Ping { seq: 1 }).unwrap();
    raw.write_all(&ping[..ping.len() / 2]).unwrap();
    raw.write_all(&encode_frame(1, b"{\"not\":\"a message\"}").unwrap())
        .unwrap();
    let (mut c, _) = AgentClient::connect(host, T).unwrap();
    c.ping(T).unwrap();
    drop(c);
    drop(raw);
    // End of input ends a --stdio agent cleanly.
    assert!(child.wait().unwrap().success());
}

/// A pty master as a client transport, read timeout by poll(2).
struct PtyMaster {
    file: File,
    timeout: std::cell::Cell<Option<Duration>>,
}

impl Read for PtyMaster {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let ms = self
            .timeout
            .get()
            .map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let mut p = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&raw mut p, 1, ms) };
        if r == 0 {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, "timeout"));
        }
        self.file.read(buf)
    }
}

impl Write for PtyMaster {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Transport for PtyMaster {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.timeout.set(t);
        Ok(())
    }
}

fn open_pty() -> (PtyMaster, PathBuf) {
    // SAFETY: plain libc calls on a fresh fd; ptsname's buffer is copied at once.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_string();
        (
            PtyMaster {
                file: File::from_raw_fd(fd),
                timeout: std::cell::Cell::new(None),
            },
            PathBuf::from(path),
        )
    }
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Voluntary context switches of every thread of `pid` (each time one
/// blocked or slept).
fn voluntary_switches(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok())
        .filter_map(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

#[test]
fn serves_a_port_path_binary_clean_and_idles_after_hangup() {
    let (master, slave) = open_pty();
    let mut child = Command::new(agent_bin())
        .arg("--port")
        .arg(&slave)
        .arg("--allow-write")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut c, hello) = AgentClient::connect(master, T).unwrap();
    assert!(hello.capabilities.contains(&"put_file".to_string()));
    c.ping(T).unwrap();
    // Every byte value passes the (raw) terminal unchanged.
    let dir = tmpdir("pty");
    let dest = dir.join("all-bytes");
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    c.put_file(&data, dest.to_str().unwrap(), 0o644, T).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    std::fs::remove_dir_all(dir).unwrap();
    // Host side goes away: the agent keeps running but does not spin. It
    // looks for a new host every 100 ms, sleeping in between: over its
    // next 20 sleeps (voluntary context switches) it uses next to no CPU,
    // where a loop that polls without sleeping never gets there. Counts,
    // not a timing: the deadline only keeps a spinner from hanging the test.
    drop(c);
    let before = (cpu_ticks(child.id()), voluntary_switches(child.id()));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while voluntary_switches(child.id()) < before.1 + 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not sleep 20 times in 60 s after the host left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let used = cpu_ticks(child.id()) - before.0;
    assert!(
        child.try_wait().unwrap().is_none(),
        "agent must wait for a new host"
    );
    assert!(
        used <= 10,
        "agent used {used} ticks over 20 sleeps while the host was away"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn once_exits_after_the_first_connection() {
    let (master, slave) = open_pty();
    let mut child = Command::new(agent_bin())
        .arg("--port")
        .arg(&slave)
        .arg("--once")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut c, _) = AgentClient::connect(master, T).unwrap();
    c.ping(T).unwrap();
    drop(c);
    let mut status = None;
    for _ in 0..200 {
        if let Some(s) = child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(s) = status {
        assert!(s.success());
    } else {
        child.kill().unwrap();
        panic!("--once agent did not exit after the host hung up");
    }
}
