//! httperf as `bench web`'s load generator: its command line for one
//! open-loop run (one connection per request, `--hog`, a fixed rate), and
//! its text report parsed ([`parse`]): requests, replies and their rates,
//! errors by kind, connection and reply times, and the CPU httperf itself
//! used (so the host's cost of serving can leave the generator out).
//!
//! httperf has no machine-readable output; its report's lines have kept
//! their wording since 0.8 (Debian's 0.9.0), and a line that is missing is
//! an error naming it rather than a zero.

use serde::Serialize;

/// httperf's error counters (`Errors:` lines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Errors {
    pub total: u64,
    pub client_timo: u64,
    pub socket_timo: u64,
    pub connrefused: u64,
    pub connreset: u64,
    pub fd_unavail: u64,
    pub addrunavail: u64,
    pub ftab_full: u64,
    pub other: u64,
}

impl Errors {
    /// The kinds that occurred, `kind N` each.
    pub fn kinds(&self) -> Vec<String> {
        [
            ("client-timo", self.client_timo),
            ("socket-timo", self.socket_timo),
            ("connrefused", self.connrefused),
            ("connreset", self.connreset),
            ("fd-unavail", self.fd_unavail),
            ("addrunavail", self.addrunavail),
            ("ftab-full", self.ftab_full),
            ("other", self.other),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect()
    }
}

/// One httperf run's report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Run {
    pub connections: u64,
    pub requests: u64,
    pub replies: u64,
    /// Seconds from the first connection to the last reply or timeout.
    pub duration_s: f64,
    /// Requests sent per second, as httperf reports it.
    pub request_rate: f64,
    /// Connection times, milliseconds: average and median.
    pub conn_time_avg_ms: f64,
    pub conn_time_median_ms: f64,
    /// Time from sending a request to the first byte of its reply, ms.
    pub response_ms: f64,
    /// Replies with a 2xx status.
    pub status_2xx: u64,
    pub errors: Errors,
    /// CPU seconds httperf used (user + system).
    pub cpu_s: f64,
}

impl Run {
    /// 2xx replies per second of the run.
    pub fn reply_rate(&self) -> f64 {
        if self.duration_s > 0.0 {
            self.status_2xx as f64 / self.duration_s
        } else {
            0.0
        }
    }
}

/// The command line of one run: `conns` connections of one request each
/// for `uri` at `rate` per second, each given up after `timeout` s.
pub fn argv(
    exe: &str,
    server: &str,
    port: u16,
    uri: &str,
    rate: u32,
    conns: u64,
    timeout: f64,
) -> Vec<String> {
    vec![
        exe.to_string(),
        "--hog".into(),
        "--server".into(),
        server.to_string(),
        "--port".into(),
        port.to_string(),
        "--uri".into(),
        uri.to_string(),
        "--num-conns".into(),
        conns.to_string(),
        "--num-calls".into(),
        "1".into(),
        "--rate".into(),
        rate.to_string(),
        "--timeout".into(),
        timeout.to_string(),
    ]
}

/// The number after `key` in `line` (`key` followed by whitespace).
fn after(line: &str, key: &str) -> Option<f64> {
    let i = line.find(key)? + key.len();
    line[i..].split_whitespace().next()?.parse().ok()
}

/// Parses httperf's report.
pub fn parse(text: &str) -> Result<Run, String> {
    let line = |prefix: &str| -> Result<&str, String> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .ok_or_else(|| format!("httperf's report has no `{prefix}` line: {text:.300}"))
    };
    let num = |l: &str, key: &str| -> Result<f64, String> {
        after(l, key).ok_or_else(|| format!("no `{key}` number in httperf's line `{l}`"))
    };
    let total = line("Total:")?;
    let conn = text
        .lines()
        .find(|l| l.starts_with("Connection time [ms]:") && l.contains(" avg "))
        .ok_or("httperf's report has no `Connection time [ms]: min .. avg ..` line")?;
    let req = line("Request rate:")?;
    let reply = line("Reply time [ms]:")?;
    let status = line("Reply status:")?;
    let cpu = line("CPU time [s]:")?;
    let errs: Vec<&str> = text.lines().filter(|l| l.starts_with("Errors:")).collect();
    if errs.is_empty() {
        return Err("httperf's report has no `Errors:` lines".into());
    }
    let e = |key: &str| -> Result<u64, String> {
        errs.iter()
            .find_map(|l| after(l, key))
            .map(|v| v as u64)
            .ok_or_else(|| format!("httperf's `Errors:` lines have no `{key}`"))
    };
    let status_2xx = status
        .split_whitespace()
        .find_map(|w| w.strip_prefix("2xx="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no 2xx count in httperf's line `{status}`"))?;
    Ok(Run {
        connections: num(total, "connections")? as u64,
        requests: num(total, "requests")? as u64,
        replies: num(total, "replies")? as u64,
        duration_s: num(total, "test-duration")?,
        request_rate: num(req, "Request rate:")?,
        conn_time_avg_ms: num(conn, " avg")?,
        conn_time_median_ms: num(conn, " median")?,
        response_ms: num(reply, "response")?,
        status_2xx,
        errors: Errors {
            total: e("total")?,
            client_timo: e("client-timo")?,
            socket_timo: e("socket-timo")?,
            connrefused: e("connrefused")?,
            connreset: e("connreset")?,
            fd_unavail: e("fd-unavail")?,
            addrunavail: e("addrunavail")?,
            ftab_full: e("ftab-full")?,
            other: e("other")?,
        },
        cpu_s: num(cpu, "user")? + num(cpu, "system")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of httperf 0.9.0 (Debian), from this machine.
    const REPORT: &str = "\
httperf --hog --timeout=5 --client=0/1 --server=127.0.0.1 --port=18080 --uri=/f --rate=100 --send-buffer=4096 --recv-buffer=16384 --num-conns=200 --num-calls=1
Maximum connect burst length: 4

Total: connections 200 requests 200 replies 200 test-duration 1.991 s

Connection rate: 100.5 conn/s (10.0 ms/conn, <=10 concurrent connections)
Connection time [ms]: min 0.3 avg 7.0 max 103.9 median 1.5 stddev 16.1
Connection time [ms]: connect 0.3
Connection length [replies/conn]: 1.000

Request rate: 100.5 req/s (10.0 ms/req)
Request size [B]: 63.0

Reply rate [replies/s]: min 0.0 avg 0.0 max 0.0 stddev 0.0 (0 samples)
Reply time [ms]: response 6.7 transfer 0.0
Reply size [B]: header 187.0 content 1024.0 footer 0.0 (total 1211.0)
Reply status: 1xx=0 2xx=198 3xx=0 4xx=2 5xx=0

CPU time [s]: user 0.17 system 0.98 (user 8.6% system 49.2% total 57.8%)
Net I/O: 125.0 KB/s (1.0*10^6 bps)

Errors: total 7 client-timo 3 socket-timo 0 connrefused 0 connreset 1
Errors: fd-unavail 2 addrunavail 0 ftab-full 0 other 1
";

    #[test]
    fn a_report_is_read_to_the_numbers() {
        let r = parse(REPORT).unwrap();
        assert_eq!((r.connections, r.requests, r.replies), (200, 200, 200));
        assert_eq!(r.duration_s, 1.991);
        assert_eq!(r.request_rate, 100.5);
        assert_eq!((r.conn_time_avg_ms, r.conn_time_median_ms), (7.0, 1.5));
        assert_eq!(r.response_ms, 6.7);
        assert_eq!(r.status_2xx, 198);
        assert!((r.cpu_s - 1.15).abs() < 1e-9);
        assert!((r.reply_rate() - 198.0 / 1.991).abs() < 1e-9);
        assert_eq!(r.errors.total, 7);
        assert_eq!(
            r.errors.kinds(),
            ["client-timo 3", "connreset 1", "fd-unavail 2", "other 1"]
        );
    }

    #[test]
    fn a_missing_line_is_named() {
        let cut: String = REPORT
            .lines()
            .filter(|l| !l.starts_with("Reply status"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(parse(&cut).unwrap_err().contains("Reply status"));
        assert!(parse("httperf: connection refused").is_err());
        let a = argv("httperf", "10.0.0.2", 80, "/x", 300, 900, 5.0);
        assert_eq!(a.join(" "), "httperf --hog --server 10.0.0.2 --port 80 --uri /x --num-conns 900 --num-calls 1 --rate 300 --timeout 5");
    }
}
