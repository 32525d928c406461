//! Codec tests: round trips of every message, incremental decoding, resync
//! after garbage, bounded lengths, forward compatibility.

use vmscope_protocol::*;

fn all_requests() -> Vec<Request> {
    vec![
        Request::Hello {
            nonce: u64::MAX,
            host_version: "0.1.0".into(),
        },
        Request::Ping { seq: 7 },
        Request::Exec {
            argv: vec!["/bin/echo".into(), "hé llo".into(), "".into()],
            stdin: None,
            timeout_ms: 1000,
            max_output: None,
        },
        Request::Exec {
            argv: vec!["cat".into()],
            stdin: Some((0..=255u8).collect()),
            timeout_ms: 1,
            max_output: None,
        },
        Request::PutFile {
            path: "/tmp/x".into(),
            mode: 0o755,
            offset: 0,
            data: vec![0, 1, 2, 0xff],
            last: true,
        },
        Request::PutFile {
            path: "/a b/ü".into(),
            mode: 0,
            offset: 1 << 40,
            data: vec![],
            last: false,
        },
        Request::Unknown {
            type_name: "stats".into(),
        },
        Request::ProfileStart {
            events: vec!["cpu-clock".into(), "cycles:100000".into()],
            frequency: 997,
            callchain: true,
            budget_ppm: None,
        },
        Request::ProfileStart {
            events: vec!["cpu-clock".into()],
            frequency: 99,
            callchain: false,
            budget_ppm: Some(10_000),
        },
        Request::ProfilePoll {},
        Request::ProfileStop {},
        Request::GetKallsyms { offset: 0 },
        Request::GetKallsyms { offset: 4 << 20 },
    ]
}

fn all_responses() -> Vec<Response> {
    vec![
        Response::Hello(AgentHello {
            protocol: PROTOCOL_VERSION,
            agent_version: "0.1.0".into(),
            kernel: "6.1.0-56-cloud-amd64".into(),
            hostname: "guest".into(),
            cpus: 2,
            mem_bytes: 1 << 30,
            capabilities: vec!["ping".into(), "exec".into()],
            nonce: 42,
        }),
        Response::Pong { seq: 0 },
        Response::ExecResult {
            exit_code: -1,
            stdout: b"out\n".to_vec(),
            stderr: vec![0xff; 5],
            truncated: true,
            timed_out: true,
        },
        Response::PutFileDone { bytes: 12345 },
        Response::Error {
            kind: ErrorKind::Unsupported,
            message: "no".into(),
        },
        Response::Error {
            kind: ErrorKind::Other,
            message: String::new(),
        },
        Response::Unknown {
            type_name: "histogram".into(),
        },
        Response::ProfileReady {
            cpus: 2,
            events: vec!["cpu-clock".into()],
            t_ns: 123_456_789,
        },
        Response::ProfileData {
            seq: 1,
            rows: vec![ProfileRow {
                event: 0,
                context: "guest-user".into(),
                process: "vmscope-agent".into(),
                image: "/usr/bin/vmscope-agent".into(),
                symbol: "vmscope_demo_alpha".into(),
                stack: "main;worker;vmscope_demo_alpha".into(),
                cpu: Some(1),
                samples: 10,
                period: 10_000_000,
            }],
            samples: 12,
            lost: 1,
            t_ns: 5,
            more: true,
            last: false,
            cost: None,
        },
        Response::ProfileData {
            seq: 2,
            rows: Vec::new(),
            samples: 0,
            lost: 0,
            t_ns: 5,
            more: false,
            last: false,
            cost: Some(vmscope_protocol::DeltaCost {
                cost_ns: 1_500_000,
                capacity_ns: 1_000_000_000,
                rate_hz: 42,
            }),
        },
        Response::Kallsyms {
            offset: 0,
            total: 40,
            text: "ffffffff81000000 T _stext\n".into(),
            modules: vec!["virtio_console".into()],
        },
    ]
}

#[test]
fn every_request_round_trips() {
    for (i, req) in all_requests().into_iter().enumerate() {
        let frame = encode_request(i as u64, &req).unwrap();
        let mut d = Decoder::new();
        d.push(&frame);
        let env = d.next_request().unwrap().unwrap();
        assert_eq!(env.id, i as u64);
        assert_eq!(env.v, PROTOCOL_VERSION);
        assert_eq!(env.msg, req);
        assert!(d.next_request().unwrap().is_none());
        assert_eq!(d.buffered(), 0);
    }
}

#[test]
fn every_response_round_trips() {
    for (i, resp) in all_responses().into_iter().enumerate() {
        let frame = encode_response(1000 + i as u64, &resp).unwrap();
        let mut d = Decoder::new();
        d.push(&frame);
        let env = d.next_response().unwrap().unwrap();
        assert_eq!(env.id, 1000 + i as u64);
        assert_eq!(env.msg, resp);
    }
}

#[test]
fn byte_by_byte_feeding_yields_the_same_messages() {
    let mut stream = Vec::new();
    let reqs = all_requests();
    for (i, r) in reqs.iter().enumerate() {
        stream.extend(encode_request(i as u64, r).unwrap());
    }
    let mut d = Decoder::new();
    let mut got = Vec::new();
    for b in &stream {
        d.push(std::slice::from_ref(b));
        while let Some(env) = d.next_request().unwrap() {
            got.push(env.msg);
        }
    }
    assert_eq!(got, reqs);
    assert_eq!(d.skipped_bytes(), 0);
}

#[test]
fn garbage_before_a_frame_is_skipped() {
    let frame = encode_request(9, &Request::Ping { seq: 3 }).unwrap();
    // Garbage that includes a false magic and a torn copy of the frame.
    let mut data = b"\x00\xffVMS1\x05\x00\x00\x00junkVMSVMS".to_vec();
    data.extend_from_slice(&frame[..frame.len() - 3]);
    let garbage_len = data.len();
    data.extend_from_slice(&frame);
    let mut d = Decoder::new();
    d.push(&data);
    let env = d.next_request().unwrap().unwrap();
    assert_eq!(env.msg, Request::Ping { seq: 3 });
    assert_eq!(d.skipped_bytes(), garbage_len as u64);
}

#[test]
fn torn_frame_then_discard_partial_resyncs() {
    let big = Request::PutFile {
        path: "/x".into(),
        mode: 0o644,
        offset: 0,
        data: vec![7; 100_000],
        last: true,
    };
    let torn = encode_request(1, &big).unwrap();
    let ping = encode_request(2, &Request::Ping { seq: 1 }).unwrap();
    let mut d = Decoder::new();
    d.push(&torn[..500]);
    assert!(d.next_request().unwrap().is_none());
    d.push(&ping);
    assert!(
        d.next_request().unwrap().is_none(),
        "ping swallowed by the torn frame"
    );
    // A reconnect: the caller discards the partial frame.
    d.discard_partial();
    d.push(&ping);
    assert_eq!(d.next_request().unwrap().unwrap().id, 2);
}

#[test]
fn torn_frame_heals_once_enough_bytes_follow() {
    let torn = encode_request(
        1,
        &Request::Exec {
            argv: vec!["x".repeat(300)],
            stdin: None,
            timeout_ms: 5,
            max_output: None,
        },
    )
    .unwrap();
    let ping = encode_request(2, &Request::Ping { seq: 1 }).unwrap();
    let mut d = Decoder::new();
    d.push(&torn[..60]);
    let mut ids = Vec::new();
    for _ in 0..10 {
        d.push(&ping);
        while let Some(env) = d.next_request().unwrap() {
            ids.push(env.id);
        }
    }
    // Once the declared length is filled the body checksum fails and the
    // decoder rescans from just after the stale magic, finding the pings.
    assert!(!ids.is_empty());
    assert!(ids.iter().all(|&i| i == 2));
}

#[test]
fn oversize_length_is_rejected_without_allocating() {
    let mut header = Vec::new();
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&u32::MAX.to_le_bytes());
    header.extend_from_slice(&[1, 0, 0, 0]);
    header.extend_from_slice(&0u32.to_le_bytes());
    let c = crc32(&header);
    header.extend_from_slice(&c.to_le_bytes());
    let mut d = FrameDecoder::new();
    d.push(&header);
    match d.next_frame() {
        Err(ProtocolError::TooLarge { len, max }) => {
            assert_eq!(len, u64::from(u32::MAX));
            assert_eq!(max, MAX_FRAME as u64);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(d.buffered(), 0);
    // And the decoder keeps working.
    d.push(&encode_frame(1, b"{}").unwrap());
    assert_eq!(d.next_frame().unwrap().unwrap().body, b"{}");
}

#[test]
fn a_frame_at_the_limit_is_accepted_and_one_byte_more_is_not() {
    let body = vec![b' '; MAX_FRAME];
    assert!(encode_frame(1, &body).is_ok());
    let body = vec![b' '; MAX_FRAME + 1];
    assert!(matches!(
        encode_frame(1, &body),
        Err(ProtocolError::TooLarge { .. })
    ));
}

#[test]
fn truncated_frames_wait_for_more_bytes() {
    let frame = encode_response(5, &Response::Pong { seq: 5 }).unwrap();
    let mut d = Decoder::new();
    for cut in [1, 4, HEADER_LEN - 1, HEADER_LEN, frame.len() - 1] {
        let mut d2 = Decoder::new();
        d2.push(&frame[..cut]);
        assert!(d2.next_response().unwrap().is_none(), "cut at {cut}");
        assert_eq!(d2.buffered(), cut, "nothing dropped at cut {cut}");
    }
    d.push(&frame[..10]);
    assert!(d.next_response().unwrap().is_none());
    d.push(&frame[10..]);
    assert_eq!(
        d.next_response().unwrap().unwrap().msg,
        Response::Pong { seq: 5 }
    );
}

fn raw_json(body: &str) -> Vec<u8> {
    encode_frame(1, body.as_bytes()).unwrap()
}

#[test]
fn unknown_types_and_fields_are_tolerated() {
    let mut d = Decoder::new();
    d.push(&raw_json(
        r#"{"v":9,"id":3,"type":"stats","events":["cycles"],"nested":{"a":[1,2]}}"#,
    ));
    let env = d.next_request().unwrap().unwrap();
    assert_eq!(env.v, 9);
    assert_eq!(
        env.msg,
        Request::Unknown {
            type_name: "stats".into()
        }
    );
    d.push(&raw_json(
        r#"{"v":2,"id":4,"type":"ping","seq":8,"future":true}"#,
    ));
    assert_eq!(
        d.next_request().unwrap().unwrap().msg,
        Request::Ping { seq: 8 }
    );
    d.push(&raw_json(
        r#"{"v":2,"id":4,"type":"error","kind":"quota_exceeded","message":"m"}"#,
    ));
    assert_eq!(
        d.next_response().unwrap().unwrap().msg,
        Response::Error {
            kind: ErrorKind::Other,
            message: "m".into()
        }
    );
    // A long unknown type name is cut.
    d.push(&raw_json(&format!(
        r#"{{"v":1,"id":5,"type":"{}"}}"#,
        "é".repeat(100)
    )));
    match d.next_request().unwrap().unwrap().msg {
        Request::Unknown { type_name } => assert!(type_name.len() <= MAX_TYPE_NAME),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_messages_carry_their_id_and_do_not_stop_the_decoder() {
    let mut d = Decoder::new();
    d.push(&raw_json(
        r#"{"v":1,"id":11,"type":"exec","argv":[],"timeout_ms":5}"#,
    ));
    d.push(&raw_json(r#"{"v":1,"id":12,"type":"put_file","path":"rel","mode":0,"offset":0,"data":"","last":true}"#));
    d.push(&raw_json(r#"{"v":1,"id":13,"type":"put_file","path":"/x","mode":0,"offset":0,"data":"!!","last":true}"#));
    d.push(&raw_json(r#"{"v":1,"id":14,"type":"ping"}"#));
    d.push(&raw_json(r#"[1,2,3]"#));
    d.push(&raw_json(r#"{"v":1,"type":"ping","seq":1}"#));
    d.push(&raw_json("not json"));
    d.push(&encode_frame(2, b"{}").unwrap());
    d.push(&encode_request(15, &Request::Ping { seq: 1 }).unwrap());
    for want in [11, 12, 13, 14] {
        match d.next_request() {
            Err(ProtocolError::BadMessage { id, .. }) => assert_eq!(id, want),
            other => panic!("expected BadMessage {want}, got {other:?}"),
        }
    }
    for _ in 0..4 {
        assert!(matches!(
            d.next_request(),
            Err(ProtocolError::Malformed { .. })
        ));
    }
    assert_eq!(d.next_request().unwrap().unwrap().id, 15);
}

#[test]
fn limits_are_enforced_on_encode_and_decode() {
    let too_many = Request::Exec {
        argv: vec!["a".into(); MAX_ARGV + 1],
        stdin: None,
        timeout_ms: 1,
        max_output: None,
    };
    assert!(encode_request(1, &too_many).is_err());
    let big_chunk = Request::PutFile {
        path: "/x".into(),
        mode: 0o644,
        offset: 0,
        data: vec![0; MAX_PUT_CHUNK + 1],
        last: true,
    };
    assert!(encode_request(1, &big_chunk).is_err());
    let nul = Request::Exec {
        argv: vec!["a\0b".into()],
        stdin: None,
        timeout_ms: 1,
        max_output: None,
    };
    assert!(encode_request(1, &nul).is_err());
    // The decoder checks the same limits on what it receives.
    let mut d = Decoder::new();
    d.push(&raw_json(&format!(
        r#"{{"v":1,"id":1,"type":"hello","nonce":1,"host_version":"{}"}}"#,
        "x".repeat(MAX_STRING + 1)
    )));
    assert!(matches!(
        d.next_request(),
        Err(ProtocolError::BadMessage { id: 1, .. })
    ));
    d.push(&raw_json(r#"{"v":1,"id":2,"type":"put_file","path":"/x","mode":65535,"offset":0,"data":"","last":true}"#));
    assert!(matches!(
        d.next_request(),
        Err(ProtocolError::BadMessage { id: 2, .. })
    ));
}

#[test]
fn wire_format_is_stable() {
    let frame = encode_request(1, &Request::Ping { seq: 2 }).unwrap();
    let body = br#"{"id":1,"seq":2,"type":"ping","v":3}"#;
    assert_eq!(&frame[..4], b"VMS1");
    assert_eq!(&frame[4..8], &(body.len() as u32).to_le_bytes());
    assert_eq!(&frame[8..12], &[1, 0, 0, 0]);
    assert_eq!(&frame[12..16], &crc32(body).to_le_bytes());
    assert_eq!(&frame[16..20], &crc32(&frame[..16]).to_le_bytes());
    assert_eq!(&frame[HEADER_LEN..], body);
}

#[test]
fn streams_ride_in_the_envelope() {
    use vmscope_protocol::{encode_request_on, MAX_STREAMS};
    let frame = encode_request_on(7, 3, &Request::CloseStream {}).unwrap();
    let body = br#"{"id":3,"stream":7,"type":"close_stream","v":3}"#;
    assert_eq!(&frame[HEADER_LEN..], body);
    let mut d = Decoder::new();
    d.push(&frame);
    let env = d.next_request().unwrap().unwrap();
    assert_eq!((env.stream, env.id), (7, 3));
    assert_eq!(env.msg, Request::CloseStream {});
    // Stream 0 (a direct connection) is not written; out-of-range streams
    // are malformed.
    d.push(&encode_request(4, &Request::Ping { seq: 1 }).unwrap());
    assert_eq!(d.next_request().unwrap().unwrap().stream, 0);
    d.push(&raw_json(&format!(
        r#"{{"v":3,"id":5,"stream":{MAX_STREAMS},"type":"ping","seq":1}}"#
    )));
    assert!(d.next_request().is_err());
    // An old agent's answer without the field, and exec's max_output bounds.
    d.push(&raw_json(
        r#"{"v":3,"id":6,"type":"exec","argv":["x"],"timeout_ms":1,"max_output":0}"#,
    ));
    assert!(matches!(
        d.next_request(),
        Err(ProtocolError::BadMessage { id: 6, .. })
    ));
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn random_bytes_and_mutated_frames_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let valid: Vec<Vec<u8>> = all_requests()
        .iter()
        .enumerate()
        .map(|(i, r)| encode_request(i as u64, r).unwrap())
        .chain(
            all_responses()
                .iter()
                .map(|r| encode_response(1, r).unwrap()),
        )
        .collect();
    for round in 0..3000 {
        let mut data = Vec::new();
        for _ in 0..(rng.next() % 4) {
            let len = (rng.next() % 64) as usize;
            data.extend((0..len).map(|_| rng.next() as u8));
            let f = &valid[(rng.next() % valid.len() as u64) as usize];
            let mut f = f.clone();
            if round % 2 == 0 && !f.is_empty() {
                let at = (rng.next() % f.len() as u64) as usize;
                f[at] ^= (rng.next() as u8) | 1;
            }
            data.extend(f);
        }
        fuzz_decode(&data);
        let mut d = Decoder::new();
        let mut pos = 0;
        while pos < data.len() {
            let n = ((rng.next() % 40) as usize + 1).min(data.len() - pos);
            d.push(&data[pos..pos + n]);
            pos += n;
            while !matches!(d.next_response(), Ok(None)) {}
        }
        assert!(d.buffered() <= data.len());
    }
}
