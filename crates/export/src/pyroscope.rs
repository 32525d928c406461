//! A window as Pyroscope ingest requests: for each domain, `POST
//! /ingest?name=SERVICE{host=…,vm_uuid=…}&from=…&until=…&format=pprof…`
//! with the domain's samples as a gzipped pprof in a multipart form field
//! `profile`, as Pyroscope's own clients send it.
//!
//! The service name is `vm/NAME` for a VM and `host` for the host's own
//! work (characters Pyroscope does not take in an application name become
//! `_`; the pprof's `vm` label keeps the name as it is). The series labels
//! in the name are `host` (the host name) and, for a VM with a UUID,
//! `vm_uuid`; each sample keeps the labels `vm`, `context`, `process` and
//! `vcpu` (as text: Pyroscope drops numeric labels). `X-Scope-OrgID` is
//! sent by the client when a tenant is given.

use crate::spool::Request;
use crate::window::{service_name, ProfileWindow};
use flate2::write::GzEncoder;
use prost::Message;
use std::io::Write;
use vmscope_report::pprof::{Label, Profile};

/// The multipart boundary (never inside a gzip stream's first bytes of a
/// part header; the body is binary, so the boundary is long and fixed).
const BOUNDARY: &str = "vmscope-pyroscope-7f3a9c1e5b2d4608";

/// Characters Pyroscope takes in an application name.
fn app_name(domain: &str) -> String {
    service_name(domain)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A label value inside `name={…}`: no separators.
fn name_label(v: &str) -> String {
    v.chars()
        .map(|c| {
            if matches!(c, ',' | '{' | '}' | '=' | '"') || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// Percent-encode a query value.
fn q(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The domain's samples as a profile of their own, labels as Pyroscope
/// keeps them.
fn domain_profile(w: &ProfileWindow, domain: &str) -> Profile {
    let mut p = w.profile.clone();
    let mut strings = p.string_table.clone();
    let mut s = |t: &str| -> i64 {
        if let Some(i) = strings.iter().position(|x| x == t) {
            return i as i64;
        }
        strings.push(t.to_string());
        (strings.len() - 1) as i64
    };
    let vcpu_key = s("vcpu");
    p.sample
        .retain(|x| w.label(x, "vm").unwrap_or("host") == domain);
    for x in &mut p.sample {
        let mut labels: Vec<Label> = Vec::new();
        for l in &x.label {
            if l.str == 0 {
                // Numeric: vcpu as text, the host CPU dropped.
                if l.key == vcpu_key {
                    labels.push(Label {
                        key: vcpu_key,
                        str: s(&l.num.to_string()),
                        ..Label::default()
                    });
                }
            } else {
                labels.push(l.clone());
            }
        }
        x.label = labels;
    }
    p.string_table = strings;
    p
}

/// The window's requests, one per domain, paths relative to the
/// exporter's URL (its `/ingest`).
pub fn requests(w: &ProfileWindow) -> Result<Vec<Request>, std::io::Error> {
    let from = w.start_unix_nanos / 1_000_000_000;
    let until = w.end_unix_secs().max(from + 1);
    // The sampling rate the period stands for (cpu-clock periods are ns).
    let rate = match w.profile.period {
        p if p > 0 => (1_000_000_000 / p).max(1),
        _ => 100,
    };
    let mut out = Vec::new();
    for domain in w.domains() {
        let mut labels = vec![format!("host={}", name_label(&w.host.name))];
        if let Some(u) = w.uuid_of(&domain) {
            labels.push(format!("vm_uuid={}", name_label(u)));
        }
        let name = format!("{}{{{}}}", app_name(&domain), labels.join(","));
        let query = format!(
            "name={}&from={from}&until={until}&format=pprof&sampleRate={rate}&spyName=vmscope",
            q(&name)
        );
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&domain_profile(w, &domain).encode_to_vec())?;
        let pprof = gz.finish()?;
        let mut body = Vec::with_capacity(pprof.len() + 256);
        write!(
            body,
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pprof\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )?;
        body.extend_from_slice(&pprof);
        write!(body, "\r\n--{BOUNDARY}--\r\n")?;
        out.push(Request {
            query,
            content_type: format!("multipart/form-data; boundary={BOUNDARY}"),
            content_encoding: None,
            headers: Vec::new(),
            body,
            what: format!("window {} of {}", w.seq, service_name(&domain)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_request_per_domain_with_the_service_and_labels() {
        let w = crate::window::test_window();
        let reqs = requests(&w).unwrap();
        assert_eq!(reqs.len(), 2);
        let r = &reqs[0];
        assert!(
            r.query
                .starts_with("name=vm%2Fweb%7Bhost%3Dkvm-7%2Cvm_uuid%3D5a1d0c0e"),
            "{}",
            r.query
        );
        assert!(
            r.query
                .contains("&from=1700000000&until=1700000060&format=pprof&sampleRate=99"),
            "{}",
            r.query
        );
        assert!(r.content_type.starts_with("multipart/form-data; boundary="));
        assert!(
            reqs[1].query.starts_with("name=host%7Bhost%3Dkvm-7%7D"),
            "{}",
            reqs[1].query
        );
        assert_eq!(app_name("we b\"x"), "vm/we_b_x");
    }
}
