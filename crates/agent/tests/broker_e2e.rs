//! Several host clients on one real agent through the broker: the built
//! `vmscope-agent` serves the connection a QEMU socket would carry (its
//! stdio is the accepted socket), the broker relays, and the clients are
//! the real host client. Checks what only the real agent can show: two
//! profiling sessions at once, each its own; a client killed mid-session
//! frees its session in the agent; two file transfers at once both land
//! whole; an exec runs while a session streams.

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmscope_broker::{serve, BrokerOptions};
use vmscope_protocol::*;

const T: Duration = Duration::from_secs(30);

fn agent_bin() -> PathBuf {
    std::env::var_os("VMSCOPE_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vmscope-agent")))
}

struct Rig {
    dir: tempfile::TempDir,
    listen: PathBuf,
    agent: std::sync::Arc<std::sync::Mutex<Option<Child>>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(mut c) = self.agent.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An agent behind a socket the way QEMU offers it (one connection), and a
/// broker in front of it.
fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let agent_sock = dir.path().join("agent.sock");
    let listen = dir.path().join("broker.sock");
    let listener = UnixListener::bind(&agent_sock).unwrap();
    let agent = std::sync::Arc::new(std::sync::Mutex::new(None));
    let slot = std::sync::Arc::clone(&agent);
    let log = dir.path().join("agent.log");
    std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        let out = conn.try_clone().unwrap();
        let child = Command::new(agent_bin())
            .args(["--stdio", "--allow-exec", "--log"])
            .arg(&log)
            .stdin(Stdio::from(OwnedFd::from(conn)))
            .stdout(Stdio::from(OwnedFd::from(out)))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        *slot.lock().unwrap() = Some(child);
    });
    let opts = BrokerOptions {
        agent_socket: agent_sock,
        listen: listen.clone(),
        idle_exit: Duration::from_secs(60),
        hello_timeout: T,
    };
    std::thread::spawn(move || serve(&opts));
    let deadline = Instant::now() + T;
    while !listen.exists() {
        assert!(Instant::now() < deadline, "the broker never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    Rig { dir, listen, agent }
}

/// A busy loop in the guest through `c`, the client handed back.
fn spin(mut c: AgentClient<UnixStream>) -> (vmscope_protocol::ExecOutput, AgentClient<UnixStream>) {
    let out = c
        .exec(
            &[
                "sh".into(),
                "-c".into(),
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo done".into(),
            ],
            T,
        )
        .unwrap();
    (out, c)
}

fn client(r: &Rig) -> AgentClient<UnixStream> {
    let (c, hello) = AgentClient::connect(UnixStream::connect(&r.listen).unwrap(), T).unwrap();
    assert!(hello.capabilities.iter().any(|c| c == capability::STREAMS));
    assert!(hello.capabilities.iter().any(|c| c == capability::BROKER));
    c
}

fn agent_log(r: &Rig) -> String {
    std::fs::read_to_string(r.dir.path().join("agent.log")).unwrap_or_default()
}

#[test]
fn two_sessions_at_once_and_a_killed_client_frees_its_own() {
    if !vmscope_testkit::require_root("sampling every CPU in the agent") {
        return;
    }
    let r = rig();
    let mut a = client(&r);
    let mut b = client(&r);
    let cfg = ProfileConfig::default();
    a.profile_start(&cfg, T).unwrap();
    // A second session on another stream is not "busy".
    b.profile_start(&cfg, T).unwrap();
    // A third client runs a command while both sessions sample, again
    // until both have samples (CI once ended one such command with 4
    // samples in one session and none yet in the other).
    let c = client(&r);
    let mut busy = std::thread::spawn(move || spin(c));
    let mut samples = (0u64, 0u64);
    let deadline = Instant::now() + T;
    loop {
        samples.0 += a.profile_poll(T).unwrap().samples;
        samples.1 += b.profile_poll(T).unwrap().samples;
        if busy.is_finished() {
            let (out, c) = busy.join().unwrap();
            assert_eq!(out.stdout, b"done\n");
            if samples.0 > 0 && samples.1 > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{samples:?}");
            busy = std::thread::spawn(move || spin(c));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(samples.0 > 0 && samples.1 > 0, "{samples:?}");
    // b dies without stopping: the agent drops its session, a goes on.
    drop(b);
    let deadline = Instant::now() + T;
    while !agent_log(&r).contains("dropping a profiling session") {
        assert!(
            Instant::now() < deadline,
            "the killed client's session was never dropped:\n{}",
            agent_log(&r)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.profile_poll(T).unwrap().samples > 0);
    let last = a.profile_stop(T).unwrap();
    assert!(last.last);
    // A new client can start a session in the freed place.
    let mut d = client(&r);
    d.profile_start(&cfg, T).unwrap();
    d.profile_stop(T).unwrap();
}

#[test]
fn two_file_transfers_at_once_both_land_whole() {
    let r = rig();
    let dest = r.dir.path().join("out");
    std::fs::create_dir(&dest).unwrap();
    let data: Vec<Vec<u8>> = (0..2u8)
        .map(|k| {
            (0..3 * PUT_CHUNK + 123)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(k))
                .collect()
        })
        .collect();
    let handles: Vec<_> = data
        .iter()
        .enumerate()
        .map(|(k, d)| {
            let mut c = client(&r);
            let d = d.clone();
            let path = dest.join(format!("f{k}"));
            std::thread::spawn(move || c.put_file(&d, path.to_str().unwrap(), 0o600, T).unwrap())
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for (k, d) in data.iter().enumerate() {
        assert_eq!(&std::fs::read(dest.join(format!("f{k}"))).unwrap(), d);
    }
    assert!(std::fs::read_dir(&dest).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains("vmscope-part")));
}
