//! The broker against a scripted agent over real Unix sockets: concurrent
//! clients each get their own answers and streams; garbage, silent, slow,
//! crashing and 100 simultaneous clients cost only themselves; the VM going
//! away ends every client's connection.

use super::*;
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use vmscope_protocol::{encode_request, AgentHello, Decoder, ProfileConfig, ProfileRow, Response};

/// What the scripted agent saw.
#[derive(Default)]
struct Seen {
    closed: Mutex<Vec<u32>>,
    streams: Mutex<HashSet<u32>>,
}

/// An agent speaking protocol 3 on the one connection a QEMU socket takes:
/// hello, ping, profiling per stream (each poll returns one row naming the
/// stream), `exec ["sleep", MS]` answered after MS on its own thread, and
/// close_stream. `die` closes the channel (the VM dies).
fn scripted_agent(path: &Path, seen: Arc<Seen>, die: Arc<AtomicBool>) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let Ok((sock, _)) = listener.accept() else {
            return;
        };
        let writer = Arc::new(Mutex::new(sock.try_clone().unwrap()));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let mut sock = sock;
        let mut dec = Decoder::new();
        let mut buf = vec![0u8; 65536];
        let mut profiling: HashSet<u32> = HashSet::new();
        loop {
            if die.load(Ordering::Relaxed) {
                let _ = sock.shutdown(std::net::Shutdown::Both);
                return;
            }
            match sock.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => dec.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
                Err(_) => return,
            }
            while let Ok(Some(env)) = dec.next_request() {
                let (stream, id) = (env.stream, env.id);
                if !matches!(env.msg, Request::Hello { .. }) {
                    seen.streams.lock().unwrap().insert(stream);
                }
                let resp = match env.msg {
                    Request::Hello { nonce, .. } => Response::Hello(AgentHello {
                        protocol: 3,
                        agent_version: "scripted".into(),
                        kernel: "6.1".into(),
                        hostname: "guest".into(),
                        cpus: 2,
                        mem_bytes: 1 << 28,
                        capabilities: vec![
                            "ping".into(),
                            "exec".into(),
                            "profile".into(),
                            "streams".into(),
                        ],
                        nonce,
                    }),
                    Request::Ping { seq } => Response::Pong { seq },
                    Request::Exec { argv, .. } => {
                        let ms: u64 = argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
                        let w = Arc::clone(&writer);
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_millis(ms));
                            let r = Response::ExecResult {
                                exit_code: 0,
                                stdout: format!("slept {ms}").into_bytes(),
                                stderr: vec![],
                                truncated: false,
                                timed_out: false,
                            };
                            let f = encode_response_on(stream, id, &r).unwrap();
                            let _ = w.lock().unwrap().write_all(&f);
                        });
                        continue;
                    }
                    Request::ProfileStart { events, .. } => {
                        if profiling.insert(stream) {
                            Response::ProfileReady {
                                cpus: 2,
                                events,
                                t_ns: 1,
                            }
                        } else {
                            Response::Error {
                                kind: ErrorKind::Busy,
                                message: "already".into(),
                            }
                        }
                    }
                    Request::ProfilePoll {} | Request::ProfileStop {} => {
                        let last = matches!(env.msg, Request::ProfileStop {});
                        if last {
                            profiling.remove(&stream);
                        }
                        Response::ProfileData {
                            seq: 1,
                            rows: vec![ProfileRow {
                                event: 0,
                                context: "guest-user".into(),
                                process: "app".into(),
                                image: "/bin/app".into(),
                                symbol: format!("s{stream}"),
                                stack: String::new(),
                                samples: 1,
                                period: 1000,
                                cpu: Some(0),
                            }],
                            samples: 1,
                            lost: 0,
                            t_ns: 2,
                            more: false,
                            last,
                            cost: None,
                        }
                    }
                    Request::CloseStream {} => {
                        profiling.remove(&stream);
                        seen.closed.lock().unwrap().push(stream);
                        Response::StreamClosed {}
                    }
                    _ => continue,
                };
                let f = encode_response_on(stream, id, &resp).unwrap();
                if writer.lock().unwrap().write_all(&f).is_err() {
                    return;
                }
            }
        }
    });
}

struct Setup {
    _dir: tempfile::TempDir,
    listen: PathBuf,
    seen: Arc<Seen>,
    die: Arc<AtomicBool>,
    broker: std::thread::JoinHandle<Result<(), BrokerError>>,
}

fn setup(idle_exit: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("agent.sock");
    let listen = dir.path().join("broker.sock");
    let seen = Arc::new(Seen::default());
    let die = Arc::new(AtomicBool::new(false));
    scripted_agent(&agent, Arc::clone(&seen), Arc::clone(&die));
    let opts = BrokerOptions {
        agent_socket: agent,
        listen: listen.clone(),
        idle_exit,
        hello_timeout: Duration::from_secs(10),
    };
    let broker = std::thread::spawn(move || serve(&opts));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listen.exists() {
        assert!(Instant::now() < deadline, "the broker never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    Setup {
        _dir: dir,
        listen,
        seen,
        die,
        broker,
    }
}

fn client(s: &Setup) -> AgentClient<UnixStream> {
    let sock = UnixStream::connect(&s.listen).unwrap();
    let (c, hello) = AgentClient::connect(sock, Duration::from_secs(10)).unwrap();
    assert!(hello.capabilities.iter().any(|c| c == capability::BROKER));
    assert_eq!(hello.agent_version, "scripted");
    c
}

const T: Duration = Duration::from_secs(10);

#[test]
fn two_clients_profile_at_once_each_on_its_own_stream() {
    let s = setup(Duration::from_secs(60));
    let mut a = client(&s);
    let mut b = client(&s);
    a.profile_start(&ProfileConfig::default(), T).unwrap();
    b.profile_start(&ProfileConfig::default(), T).unwrap();
    for _ in 0..20 {
        let da = a.profile_poll(T).unwrap();
        let db = b.profile_poll(T).unwrap();
        a.ping(T).unwrap();
        assert_ne!(da.rows[0].symbol, db.rows[0].symbol);
    }
    let sa = a.profile_stop(T).unwrap().rows[0].symbol.clone();
    let sb = b.profile_stop(T).unwrap().rows[0].symbol.clone();
    assert!(sa.starts_with('s') && sb.starts_with('s') && sa != sb);
    assert!(!s.seen.streams.lock().unwrap().contains(&0));
}

#[test]
fn a_slow_exec_of_one_client_does_not_hold_up_another() {
    let s = setup(Duration::from_secs(60));
    let mut a = client(&s);
    let mut b = client(&s);
    let slow =
        std::thread::spawn(move || a.exec(&["sleep".into(), "1500".into()], T).unwrap().stdout);
    // b's pings are answered while a's exec is still running.
    let mut answered = 0;
    while !slow.is_finished() && answered < 50 {
        b.ping(T).unwrap();
        answered += 1;
    }
    assert_eq!(slow.join().unwrap(), b"slept 1500");
    assert!(answered >= 10, "only {answered} pings while the exec ran");
}

#[test]
fn a_client_killed_mid_stream_has_its_stream_closed_and_others_go_on() {
    let s = setup(Duration::from_secs(60));
    let mut keep = client(&s);
    keep.profile_start(&ProfileConfig::default(), T).unwrap();
    {
        let mut dies = client(&s);
        dies.profile_start(&ProfileConfig::default(), T).unwrap();
        dies.profile_poll(T).unwrap();
        // Dropped without profile_stop: the connection just ends.
    }
    let deadline = Instant::now() + T;
    while s.seen.closed.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no close_stream reached the agent"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..5 {
        assert_eq!(keep.profile_poll(T).unwrap().rows.len(), 1);
    }
    keep.profile_stop(T).unwrap();
}

#[test]
fn garbage_and_silent_clients_cost_only_themselves() {
    let s = setup(Duration::from_secs(60));
    let mut silent = UnixStream::connect(&s.listen).unwrap();
    let mut garbage = UnixStream::connect(&s.listen).unwrap();
    // Noise, a header declaring a body bigger than any frame, a valid frame
    // that is not JSON, and a frame whose JSON has no id.
    let mut junk = vec![0xffu8; 10_000];
    junk.extend_from_slice(b"VMS1\xff\xff\xff\x7f");
    junk.extend(encode_frame(ENCODING_JSON, b"not json").unwrap());
    junk.extend(encode_frame(ENCODING_JSON, br#"{"type":"ping"}"#).unwrap());
    // A close_stream aimed at somebody else's stream is answered here.
    junk.extend(vmscope_protocol::encode_request_on(1, 9, &Request::CloseStream {}).unwrap());
    garbage.write_all(&junk).unwrap();
    let mut good = client(&s);
    for _ in 0..20 {
        good.ping(T).unwrap();
    }
    assert!(s.seen.closed.lock().unwrap().is_empty());
    silent.write_all(&[]).unwrap();
    drop(garbage);
    good.ping(T).unwrap();
}

#[test]
fn a_hundred_clients_at_once() {
    let s = setup(Duration::from_secs(60));
    let listen = s.listen.clone();
    let handles: Vec<_> = (0..100)
        .map(|_| {
            let listen = listen.clone();
            std::thread::spawn(move || {
                let sock = UnixStream::connect(&listen).unwrap();
                let (mut c, _) = AgentClient::connect(sock, T).unwrap();
                for _ in 0..5 {
                    c.ping(T).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_client_that_never_reads_is_dropped_and_others_go_on() {
    let s = setup(Duration::from_secs(60));
    let mut flood = UnixStream::connect(&s.listen).unwrap();
    // Pings without reading a single answer.
    let ping: Vec<u8> = (0..2000u64)
        .flat_map(|i| encode_request(i + 1, &Request::Ping { seq: i }).unwrap())
        .collect();
    let flooder = std::thread::spawn(move || {
        for _ in 0..200 {
            if flood.write_all(&ping).is_err() {
                return true;
            }
        }
        false
    });
    let mut good = client(&s);
    for _ in 0..50 {
        good.ping(T).unwrap();
    }
    drop(good);
    assert!(
        flooder.join().unwrap(),
        "a client that never reads its answers was never dropped"
    );
}

#[test]
fn the_vm_dying_ends_every_client_and_the_broker() {
    let s = setup(Duration::from_secs(60));
    let mut a = client(&s);
    let mut b = client(&s);
    a.ping(T).unwrap();
    s.die.store(true, Ordering::Relaxed);
    let until_error = |c: &mut AgentClient<UnixStream>| {
        let deadline = Instant::now() + T;
        loop {
            match c.ping(T) {
                Err(e) => return e,
                Ok(_) => assert!(Instant::now() < deadline, "still answered"),
            }
        }
    };
    let ea = until_error(&mut a);
    let eb = until_error(&mut b);
    assert!(
        matches!(ea, ProtocolError::Io(_)) && matches!(eb, ProtocolError::Io(_)),
        "{ea} / {eb}"
    );
    let deadline = Instant::now() + T;
    while !s.broker.is_finished() {
        assert!(Instant::now() < deadline, "the broker outlived its VM");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.broker.join().unwrap().unwrap();
}

#[test]
fn an_idle_broker_exits_and_a_second_one_stands_down() {
    let s = setup(Duration::from_millis(300));
    // A second broker for the same socket finds the lock taken.
    let second = serve(&BrokerOptions {
        agent_socket: s._dir.path().join("agent.sock"),
        listen: s.listen.clone(),
        idle_exit: Duration::from_millis(300),
        hello_timeout: Duration::from_secs(1),
    });
    assert!(second.is_ok());
    let mut c = client(&s);
    c.ping(T).unwrap();
    drop(c);
    let deadline = Instant::now() + T;
    while !s.broker.is_finished() {
        assert!(Instant::now() < deadline, "an idle broker stayed");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.broker.join().unwrap().unwrap();
    assert!(!s.listen.exists());
    // Nothing of it stays (sweep row lk1): no lock, no log.
    let left: Vec<_> = std::fs::read_dir(s._dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("broker.sock"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_broker_whose_vm_is_gone_leaves_no_lock_or_log_either() {
    let s = setup(Duration::from_secs(60));
    std::fs::write(s._dir.path().join("broker.sock.log"), "started\n").unwrap();
    s.die.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + T;
    while !s.broker.is_finished() {
        assert!(Instant::now() < deadline, "the broker outlived its VM");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.broker.join().unwrap().unwrap();
    for f in ["broker.sock", "broker.sock.lock", "broker.sock.log"] {
        assert!(!s._dir.path().join(f).exists(), "{f} stayed");
    }
}

#[test]
fn broker_sockets_are_stable_per_agent_socket() {
    let a = broker_socket(Path::new("/run/vmscope/labs/x/vm0/agent.sock"));
    assert_eq!(
        a,
        broker_socket(Path::new("/run/vmscope/labs/x/vm0/agent.sock"))
    );
    assert_ne!(
        a,
        broker_socket(Path::new("/run/vmscope/labs/x/vm1/agent.sock"))
    );
    assert!(a.to_string_lossy().ends_with(".sock"));
}
