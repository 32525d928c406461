//! Protocol 2 profiling and kallsyms messages: defaults, limits checked on
//! decode (a guest's answer is hostile input), and the host client's
//! profile and kallsyms calls against a scripted peer.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use vmscope_protocol::*;

const T: Duration = Duration::from_secs(10);

fn row(symbol: &str) -> ProfileRow {
    ProfileRow {
        event: 0,
        context: row_context::GUEST_USER.into(),
        process: "demo".into(),
        image: "/usr/bin/vmscope-agent".into(),
        symbol: symbol.into(),
        stack: String::new(),
        samples: 1,
        period: 1_000_000,
    }
}

fn data(rows: Vec<ProfileRow>) -> Response {
    Response::ProfileData {
        seq: 1,
        rows,
        samples: 1,
        lost: 0,
        t_ns: 1,
        more: false,
        last: false,
        cost: None,
    }
}

fn frame_json(body: &str) -> Vec<u8> {
    encode_frame(1, body.as_bytes()).unwrap()
}

/// Decodes one response frame.
fn decode(frame: &[u8]) -> Result<Response, ProtocolError> {
    let mut d = Decoder::new();
    d.push(frame);
    d.next_response().map(|e| e.expect("a complete frame").msg)
}

/// Serializes `resp` without the encoder's checks (what a hostile guest
/// could send) and decodes it.
fn decode_unchecked(resp: &Response) -> Result<Response, ProtocolError> {
    let mut v = serde_json::to_value(resp).unwrap();
    v["v"] = 2.into();
    v["id"] = 7.into();
    decode(&frame_json(&v.to_string()))
}

fn bad_message(r: Result<Response, ProtocolError>, needle: &str) {
    match r {
        Err(ProtocolError::BadMessage {
            id,
            type_name,
            reason,
        }) => {
            assert_eq!(id, 7);
            assert_eq!(type_name, "profile_data");
            assert!(reason.contains(needle), "{reason}");
        }
        other => panic!("expected BadMessage about {needle}, got {other:?}"),
    }
}

#[test]
fn profile_start_fields_have_defaults() {
    let mut d = Decoder::new();
    d.push(&frame_json(r#"{"v":2,"id":1,"type":"profile_start"}"#));
    assert_eq!(
        d.next_request().unwrap().unwrap().msg,
        Request::ProfileStart {
            events: vec!["cpu-clock".into()],
            frequency: DEFAULT_PROFILE_FREQUENCY,
            callchain: false,
            budget_ppm: None,
        }
    );
    d.push(&frame_json(r#"{"v":2,"id":2,"type":"profile_poll"}"#));
    assert_eq!(
        d.next_request().unwrap().unwrap().msg,
        Request::ProfilePoll {}
    );
    d.push(&frame_json(r#"{"v":2,"id":3,"type":"get_kallsyms"}"#));
    assert_eq!(
        d.next_request().unwrap().unwrap().msg,
        Request::GetKallsyms { offset: 0 }
    );
}

#[test]
fn profile_start_limits() {
    let bad = [
        (vec![], 1000),
        (vec!["cpu-clock".to_string(); MAX_PROFILE_EVENTS + 1], 1000),
        (vec!["x".repeat(MAX_EVENT_NAME + 1)], 1000),
        (vec![String::new()], 1000),
        (vec!["cpu-clock".into()], 0),
        (vec!["cpu-clock".into()], MAX_PROFILE_FREQUENCY + 1),
    ];
    for (events, frequency) in bad {
        let req = Request::ProfileStart {
            events: events.clone(),
            frequency,
            callchain: false,
            budget_ppm: None,
        };
        assert!(encode_request(1, &req).is_err(), "{events:?} {frequency}");
        let body = serde_json::json!({
            "v": 2, "id": 9, "type": "profile_start", "events": events, "frequency": frequency
        });
        let mut d = Decoder::new();
        d.push(&frame_json(&body.to_string()));
        assert!(
            matches!(
                d.next_request(),
                Err(ProtocolError::BadMessage { id: 9, .. })
            ),
            "{events:?} {frequency}"
        );
    }
}

#[test]
fn rows_at_the_limits_decode() {
    let mut r = row("f");
    r.process = "p".repeat(MAX_PROCESS_NAME);
    r.image = "i".repeat(MAX_IMAGE);
    r.symbol = "s".repeat(MAX_SYMBOL);
    r.stack = "a;".repeat(MAX_STACK / 2);
    r.context = row_context::GUEST_KERNEL.into();
    r.event = (MAX_PROFILE_EVENTS - 1) as u32;
    let resp = data(vec![r]);
    let frame = encode_response(7, &resp).unwrap();
    assert_eq!(decode(&frame).unwrap(), resp);

    let many = data(vec![row("f"); MAX_PROFILE_ROWS]);
    let frame = encode_response(7, &many).unwrap();
    assert!(frame.len() < MAX_FRAME);
    assert_eq!(decode(&frame).unwrap(), many);
}

type Spoil = Box<dyn Fn(&mut ProfileRow)>;

#[test]
fn one_bad_row_makes_the_whole_message_bad() {
    let cases: Vec<(Spoil, &str)> = vec![
        (Box::new(|r| r.context = "host-user".into()), "context"),
        (Box::new(|r| r.context = String::new()), "context"),
        (
            Box::new(|r| r.process = "p".repeat(MAX_PROCESS_NAME + 1)),
            "process",
        ),
        (Box::new(|r| r.image = "i".repeat(MAX_IMAGE + 1)), "image"),
        (
            Box::new(|r| r.symbol = "s".repeat(MAX_SYMBOL + 1)),
            "symbol",
        ),
        (Box::new(|r| r.stack = "s".repeat(MAX_STACK + 1)), "stack"),
        (Box::new(|r| r.event = MAX_PROFILE_EVENTS as u32), "event"),
    ];
    for (spoil, needle) in cases {
        let mut bad = row("bad");
        spoil(&mut bad);
        let resp = data(vec![row("good"), bad]);
        assert!(encode_response(7, &resp).is_err(), "{needle}");
        bad_message(decode_unchecked(&resp), needle);
    }
    let too_many = data(vec![row("f"); MAX_PROFILE_ROWS + 1]);
    assert!(encode_response(7, &too_many).is_err());
    bad_message(decode_unchecked(&too_many), "rows");
    // A row missing a field.
    let body = r#"{"v":2,"id":7,"type":"profile_data","seq":1,"samples":1,"lost":0,"t_ns":1,
        "rows":[{"event":0,"context":"guest-user","process":"p","image":"i","samples":1,"period":1}]}"#;
    bad_message(decode(&frame_json(body)), "symbol");
    // The decoder goes on with the next frame.
    let mut d = Decoder::new();
    let mut v = serde_json::to_value(&too_many).unwrap();
    v["v"] = 2.into();
    v["id"] = 7.into();
    d.push(&frame_json(&v.to_string()));
    d.push(&encode_response(8, &Response::Pong { seq: 1 }).unwrap());
    assert!(d.next_response().is_err());
    assert_eq!(d.next_response().unwrap().unwrap().id, 8);
}

#[test]
fn kallsyms_limits() {
    let ok = Response::Kallsyms {
        offset: 10,
        total: 20,
        text: "x".repeat(10),
        modules: vec!["m".into()],
    };
    assert_eq!(decode_unchecked(&ok).unwrap(), ok);
    let bad = [
        Response::Kallsyms {
            offset: 15,
            total: 20,
            text: "x".repeat(10),
            modules: vec![],
        },
        Response::Kallsyms {
            offset: u64::MAX,
            total: 20,
            text: "x".into(),
            modules: vec![],
        },
        Response::Kallsyms {
            offset: 0,
            total: MAX_KALLSYMS_TOTAL + 1,
            text: String::new(),
            modules: vec![],
        },
        Response::Kallsyms {
            offset: 0,
            total: 1,
            text: String::new(),
            modules: vec!["m".repeat(MAX_MODULE_NAME + 1)],
        },
        Response::Kallsyms {
            offset: 0,
            total: 1,
            text: String::new(),
            modules: vec!["m".into(); MAX_MODULES + 1],
        },
    ];
    for b in bad {
        assert!(encode_response(7, &b).is_err(), "{b:?}");
        assert!(
            matches!(
                decode_unchecked(&b),
                Err(ProtocolError::BadMessage { id: 7, .. })
            ),
            "{b:?}"
        );
    }
}

#[test]
fn new_error_kinds_round_trip() {
    for kind in [ErrorKind::UnsupportedEvent, ErrorKind::NotRunning] {
        let resp = Response::Error {
            kind,
            message: "m".into(),
        };
        assert_eq!(decode(&encode_response(1, &resp).unwrap()).unwrap(), resp);
    }
}

/// A scripted agent: answers hello, then each profile/kallsyms request from
/// `script` in order; returns the requests it saw.
fn scripted(mut s: UnixStream, mut script: Vec<Response>) -> Vec<Request> {
    script.reverse();
    let mut d = Decoder::new();
    let mut seen = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return seen,
            Ok(n) => n,
        };
        d.push(&buf[..n]);
        while let Ok(Some(env)) = d.next_request() {
            let resp = match &env.msg {
                Request::Hello { nonce, .. } => Response::Hello(AgentHello {
                    protocol: PROTOCOL_VERSION,
                    agent_version: "test".into(),
                    kernel: "k".into(),
                    hostname: "h".into(),
                    cpus: 1,
                    mem_bytes: 1,
                    capabilities: vec![capability::PROFILE.into(), capability::KALLSYMS.into()],
                    nonce: *nonce,
                }),
                _ => match script.pop() {
                    Some(r) => r,
                    None => return seen,
                },
            };
            seen.push(env.msg);
            if s.write_all(&encode_response(env.id, &resp).unwrap())
                .is_err()
            {
                return seen;
            }
        }
    }
}

#[test]
fn client_profile_session_collects_every_part() {
    let (host, guest) = UnixStream::pair().unwrap();
    let part = |rows: Vec<ProfileRow>, seq, more, last| Response::ProfileData {
        seq,
        rows,
        samples: 10,
        lost: 1,
        t_ns: seq * 100,
        more,
        last,
        cost: None,
    };
    let script = vec![
        Response::ProfileReady {
            cpus: 4,
            events: vec!["cpu-clock".into()],
            t_ns: 42,
        },
        part(vec![row("a")], 1, false, false),
        part(vec![row("b")], 2, true, false),
        part(vec![row("c")], 3, false, true),
    ];
    let peer = thread::spawn(move || scripted(guest, script));
    let (mut c, hello) = AgentClient::connect(host, T).unwrap();
    assert!(hello.capabilities.contains(&"profile".to_string()));
    let ready = c.profile_start(&ProfileConfig::default(), T).unwrap();
    assert_eq!(
        ready,
        ProfileReadyInfo {
            cpus: 4,
            events: vec!["cpu-clock".into()],
            t_ns: 42
        }
    );
    let d = c.profile_poll(T).unwrap();
    assert_eq!((d.seq, d.rows.len(), d.more, d.last), (1, 1, false, false));
    let end = c.profile_stop(T).unwrap();
    let names: Vec<&str> = end.rows.iter().map(|r| r.symbol.as_str()).collect();
    assert_eq!(names, ["b", "c"]);
    assert_eq!((end.seq, end.samples, end.lost, end.last), (3, 20, 2, true));
    drop(c);
    let seen = peer.join().unwrap();
    assert_eq!(
        seen[1..],
        [
            Request::ProfileStart {
                events: vec!["cpu-clock".into()],
                frequency: 1000,
                callchain: false,
                budget_ppm: None,
            },
            Request::ProfilePoll {},
            Request::ProfileStop {},
            Request::ProfilePoll {},
        ]
    );
}

#[test]
fn client_kallsyms_reassembles_slices_and_checks_offsets() {
    let (host, guest) = UnixStream::pair().unwrap();
    let script = vec![
        Response::Kallsyms {
            offset: 0,
            total: 12,
            text: "0 T a\n".into(),
            modules: vec!["m1".into()],
        },
        Response::Kallsyms {
            offset: 6,
            total: 12,
            text: "0 T b\n".into(),
            modules: vec![],
        },
        // A second transfer whose agent repeats an offset.
        Response::Kallsyms {
            offset: 0,
            total: 12,
            text: "0 T a\n".into(),
            modules: vec![],
        },
        Response::Kallsyms {
            offset: 0,
            total: 12,
            text: "0 T a\n".into(),
            modules: vec![],
        },
    ];
    let peer = thread::spawn(move || scripted(guest, script));
    let (mut c, _) = AgentClient::connect(host, T).unwrap();
    let (text, modules) = c.kallsyms(T).unwrap();
    assert_eq!(text, "0 T a\n0 T b\n");
    assert_eq!(modules, ["m1"]);
    assert!(matches!(
        c.kallsyms(T),
        Err(ProtocolError::Malformed { .. })
    ));
    drop(c);
    let seen = peer.join().unwrap();
    assert_eq!(
        seen[1..3],
        [
            Request::GetKallsyms { offset: 0 },
            Request::GetKallsyms { offset: 6 }
        ]
    );
}
