//! The host client against a peer thread that speaks the protocol through
//! the same codec, over a real Unix socket pair: hello retries, stale bytes,
//! id matching, error mapping and PutFile chunking.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use vmscope_protocol::*;

fn hello_for(nonce: u64) -> Response {
    Response::Hello(AgentHello {
        protocol: PROTOCOL_VERSION,
        agent_version: "test".into(),
        kernel: "k".into(),
        hostname: "h".into(),
        cpus: 1,
        mem_bytes: 1,
        capabilities: vec![capability::PING.into()],
        nonce,
    })
}

/// Serves requests until the socket closes; ignores the first `deaf` hellos
/// (a booting guest) and returns every request it saw.
fn serve(mut s: UnixStream, deaf: usize) -> Vec<Request> {
    let mut d = Decoder::new();
    let mut seen = Vec::new();
    let mut hellos = 0;
    let mut file = Vec::new();
    // Stale output of an earlier connection: a torn frame and a stray answer.
    let stale = encode_response(1, &Response::Pong { seq: 1 }).unwrap();
    s.write_all(&stale).unwrap();
    s.write_all(&stale[..stale.len() / 2]).unwrap();
    let mut buf = [0u8; 65536];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return seen,
            Ok(n) => n,
        };
        d.push(&buf[..n]);
        while let Ok(Some(env)) = d.next_request() {
            let resp = match &env.msg {
                Request::Hello { nonce, .. } => {
                    hellos += 1;
                    if hellos <= deaf {
                        None
                    } else {
                        Some(hello_for(*nonce))
                    }
                }
                Request::Ping { seq } => Some(Response::Pong { seq: *seq }),
                Request::Exec { .. } => Some(Response::Error {
                    kind: ErrorKind::Denied,
                    message: "exec is disabled".into(),
                }),
                Request::PutFile { offset, data, .. } => {
                    assert_eq!(*offset as usize, file.len());
                    file.extend_from_slice(data);
                    Some(Response::PutFileDone {
                        bytes: file.len() as u64,
                    })
                }
                _ => Some(Response::Error {
                    kind: ErrorKind::Unsupported,
                    message: "unknown".into(),
                }),
            };
            seen.push(env.msg);
            if let Some(r) = resp {
                // A duplicate answer with a foreign id must be ignored by the client.
                s.write_all(&encode_response(env.id ^ 0xFFFF, &r).unwrap())
                    .unwrap();
                s.write_all(&encode_response(env.id, &r).unwrap()).unwrap();
            }
        }
    }
}

#[test]
fn client_talks_to_a_peer() {
    let (host, guest) = UnixStream::pair().unwrap();
    let peer = thread::spawn(move || serve(guest, 2));
    let (mut c, hello) = AgentClient::connect(host, Duration::from_secs(10)).unwrap();
    assert_eq!(hello.agent_version, "test");
    assert!(c.has_capability("ping"));
    assert!(!c.has_capability("exec"));
    c.ping(Duration::from_secs(5)).unwrap();
    match c.exec(&["true".to_string()], Duration::from_secs(1)) {
        Err(ProtocolError::Remote { kind, message }) => {
            assert_eq!(kind, ErrorKind::Denied);
            assert!(message.contains("disabled"));
        }
        other => panic!("{other:?}"),
    }
    match c.request(
        &Request::Unknown {
            type_name: "stats".into(),
        },
        Duration::from_secs(5),
    ) {
        Err(ProtocolError::Remote { kind, .. }) => assert_eq!(kind, ErrorKind::Unsupported),
        other => panic!("{other:?}"),
    }
    let data: Vec<u8> = (0..PUT_CHUNK * 2 + 17).map(|i| (i % 251) as u8).collect();
    let n = c
        .put_file(&data, "/tmp/f", 0o600, Duration::from_secs(20))
        .unwrap();
    assert_eq!(n, data.len() as u64);
    assert!(c.ignored_frames() >= 4, "foreign-id answers were skipped");
    drop(c);
    let seen = peer.join().unwrap();
    // Two hellos went unanswered, so the client sent a third.
    let hellos = seen
        .iter()
        .filter(|r| matches!(r, Request::Hello { .. }))
        .count();
    assert_eq!(hellos, 3, "{seen:?}");
    let chunks: Vec<_> = seen
        .iter()
        .filter_map(|r| match r {
            Request::PutFile { data, last, .. } => Some((data.len(), *last)),
            _ => None,
        })
        .collect();
    assert_eq!(
        chunks,
        vec![(PUT_CHUNK, false), (PUT_CHUNK, false), (17, true)]
    );
}

#[test]
fn connect_times_out_when_nobody_answers() {
    let (host, _guest) = UnixStream::pair().unwrap();
    let t0 = Instant::now();
    match AgentClient::connect(host, Duration::from_millis(1200)) {
        Err(ProtocolError::Timeout { what }) => assert!(what.contains("hello")),
        other => panic!("{:?}", other.map(|(_, h)| h)),
    }
    // Never before the time given (the contract); the upper bound is only
    // there to catch a wait that ignores it.
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1200) && took < Duration::from_secs(60),
        "{took:?}"
    );
}

#[test]
fn old_agent_is_a_version_mismatch() {
    let (host, mut guest) = UnixStream::pair().unwrap();
    let peer = thread::spawn(move || {
        let mut d = Decoder::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = guest.read(&mut buf).unwrap();
            d.push(&buf[..n]);
            if let Ok(Some(env)) = d.next_request() {
                if let Request::Hello { nonce, .. } = env.msg {
                    let mut h = hello_for(nonce);
                    if let Response::Hello(ref mut inner) = h {
                        inner.protocol = 0;
                    }
                    guest
                        .write_all(&encode_response(env.id, &h).unwrap())
                        .unwrap();
                    return;
                }
            }
        }
    });
    match AgentClient::connect(host, Duration::from_secs(5)) {
        Err(ProtocolError::VersionMismatch { agent: 0, .. }) => {}
        other => panic!("{:?}", other.map(|(_, h)| h)),
    }
    peer.join().unwrap();
}
