//! Exporters against a loopback receiver that fails as real ones do:
//! answering 5xx, accepting and never answering, answering 200 with a body
//! that is no OTLP answer, refusing a schema revision; and a restart of the
//! exporter with requests still in its spool. Every request arrives once,
//! in order, and the counters say what happened.

use std::time::{Duration, Instant};
use vmscope_export::exporter::ExportConfig;
use vmscope_export::spool::Request;
use vmscope_export::{ExportOptions, ExportSpec, Exporter};
use vmscope_testkit::receiver::Receiver;

fn req(n: u32) -> Request {
    Request {
        query: format!("n={n}"),
        content_type: "application/x-protobuf".into(),
        content_encoding: None,
        headers: vec![("X-Test".into(), "yes".into())],
        body: format!("request {n}").into_bytes(),
        what: format!("request {n}"),
    }
}

fn exporter(kind: &str, addr: &str, spool: Option<&std::path::Path>, max: u64) -> Exporter {
    Exporter::start(ExportConfig {
        spec: ExportSpec::parse(&format!("{kind}=http://{addr}/in")).unwrap(),
        options: ExportOptions {
            timeout: Some(Duration::from_secs(2)),
            tenant: Some("team-a".into()),
            ..ExportOptions::default()
        },
        spool_dir: spool.map(std::path::Path::to_path_buf),
        spool_max: max,
        max_backoff: Duration::from_secs(1),
    })
    .unwrap()
}

/// Wait until `cond` holds, at most `limit`.
fn wait(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

fn bodies(r: &Receiver) -> Vec<String> {
    r.taken()
        .iter()
        .map(|x| String::from_utf8_lossy(&x.body).into_owned())
        .collect()
}

#[test]
fn outages_lose_nothing_and_send_nothing_twice() {
    let rx = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let e = exporter("remote-write", rx.addr(), Some(dir.path()), 1 << 20);
    e.send(vec![req(1), req(2)]);
    assert!(wait(Duration::from_secs(5), || rx.taken().len() == 2));
    // Down (503), then silent (accepts, never answers), then back.
    rx.answer(503, b"overloaded");
    e.send(vec![req(3)]);
    e.send(vec![req(4)]);
    assert!(wait(Duration::from_secs(5), || e.stats().failed >= 2));
    rx.silent();
    e.send(vec![req(5)]);
    std::thread::sleep(Duration::from_secs(3));
    // Waiting requests are in the spool directory.
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert!(files >= 3, "{files} spool files");
    rx.answer(200, b"");
    e.send(vec![req(6)]);
    assert!(
        wait(Duration::from_secs(15), || rx.taken().len() == 6),
        "{:?}",
        bodies(&rx)
    );
    let want: Vec<String> = (1..=6).map(|n| format!("request {n}")).collect();
    assert_eq!(bodies(&rx), want);
    // The receiver has the last request before the exporter has read its
    // answer and counted it (CI once saw sent 5, queued 1 here).
    wait(Duration::from_secs(5), || e.stats().queued == 0);
    let s = e.stats();
    assert_eq!((s.sent, s.dropped, s.queued), (6, 0, 0), "{s:?}");
    assert!(s.failed >= 3 && s.spooled >= 3, "{s:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Headers, query and tenant went with every request.
    for r in rx.taken() {
        assert_eq!(r.path(), "/in");
        assert_eq!(r.header("x-test"), Some("yes"));
        assert_eq!(r.header("x-scope-orgid"), Some("team-a"));
        assert!(r.query()[0].0 == "n");
    }
}

#[test]
fn a_restart_sends_what_the_spool_kept_first() {
    let rx = Receiver::start();
    rx.answer(500, b"");
    let dir = tempfile::tempdir().unwrap();
    let e = exporter("remote-write", rx.addr(), Some(dir.path()), 1 << 20);
    e.send(vec![req(1), req(2), req(3)]);
    assert!(wait(Duration::from_secs(5), || e.stats().spooled == 3));
    e.shutdown();
    drop(e);
    rx.answer(200, b"");
    let e = exporter("remote-write", rx.addr(), Some(dir.path()), 1 << 20);
    e.send(vec![req(4)]);
    assert!(wait(Duration::from_secs(10), || rx.taken().len() == 4));
    let want: Vec<String> = (1..=4).map(|n| format!("request {n}")).collect();
    assert_eq!(bodies(&rx), want);
}

#[test]
fn past_the_bound_the_oldest_are_dropped_and_counted() {
    let rx = Receiver::start();
    rx.answer(503, b"");
    let dir = tempfile::tempdir().unwrap();
    // Each body is 9 or 10 bytes: the bound keeps the newest three.
    let e = exporter("remote-write", rx.addr(), Some(dir.path()), 30);
    for n in 1..=6 {
        e.send(vec![req(n)]);
    }
    assert!(
        wait(Duration::from_secs(5), || e.stats().dropped == 3),
        "{:?}",
        e.stats()
    );
    rx.answer(200, b"");
    assert!(wait(Duration::from_secs(10), || rx.taken().len() == 3));
    assert_eq!(bodies(&rx), ["request 4", "request 5", "request 6"]);
}

#[test]
fn a_200_with_garbage_is_no_otlp_answer_and_is_kept() {
    let rx = Receiver::start();
    rx.answer(200, b"<html>please log in</html>");
    let e = exporter("otlp", rx.addr(), None, 1 << 20);
    e.send(vec![req(1)]);
    assert!(wait(Duration::from_secs(5), || e.stats().failed >= 1));
    let s = e.stats();
    assert_eq!((s.sent, s.queued), (0, 1), "{s:?}");
    // An empty 200 is an OTLP answer with nothing rejected.
    rx.answer(200, b"");
    assert!(wait(Duration::from_secs(5), || e.stats().sent == 1));
}

#[test]
fn an_unknown_schema_revision_stops_the_exporter() {
    let rx = Receiver::start();
    rx.answer(
        400,
        b"invalid or unsupported otlp-profiles-development-version: supported version is 2",
    );
    let e = exporter("otlp", rx.addr(), None, 1 << 20);
    e.send(vec![req(1)]);
    assert!(wait(Duration::from_secs(5), || e.stopped()));
    let s = e.stats();
    assert!(
        s.stopped
            .as_deref()
            .unwrap()
            .contains("supported version is 2"),
        "{s:?}"
    );
    // No retry loop: one try, and nothing queued after.
    std::thread::sleep(Duration::from_millis(1500));
    e.send(vec![req(2)]);
    assert_eq!(e.stats().failed, 1);
}

#[test]
fn a_receiver_that_never_answers_costs_a_bounded_wait() {
    let rx = Receiver::start();
    rx.silent();
    let e = exporter("remote-write", rx.addr(), None, 1 << 20);
    let t = Instant::now();
    e.send(vec![req(1)]);
    // The 2 s request timeout of this test, then a failure counted.
    assert!(wait(Duration::from_secs(6), || e.stats().failed >= 1));
    assert!(t.elapsed() < Duration::from_secs(6));
    // Shutting down waits for at most the request in hand.
    let t = Instant::now();
    e.shutdown();
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
}
