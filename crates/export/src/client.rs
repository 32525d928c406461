//! The HTTP(S) client of one exporter (ureq on rustls) and what an answer
//! means for the request in hand.
//!
//! - HTTPS receivers are checked against `--export-ca` when given (only
//!   those CAs), else against the web's root CAs (webpki-roots).
//! - A bearer token or a user and password, read from a file at the start,
//!   goes with every request; so does `X-Scope-OrgID` with a tenant.
//! - Every request is bounded: 5 s to connect, [`REQUEST_TIMEOUT`] in all
//!   (a receiver that accepts and never answers costs one exporter thread
//!   that long, never `serve`).
//! - 2xx: sent (OTLP also reads its answer: a body that is no OTLP
//!   response is a failure, kept for a later try). 400, 413, 415 and 422:
//!   the receiver will never take this request, which is dropped and
//!   counted (except OTLP's 400 for an unknown schema revision, which stops
//!   the exporter). Any other answer (401, 403, 404, 429, 5xx, a redirect)
//!   and any failure to connect, talk TLS or read: kept and retried, since
//!   fixing the receiver or its credentials delivers what waited.

use crate::spec::{Credential, ExportKind, ExportOptions, ExportSpec};
use crate::spool::Request;
use crate::ExportError;
use base64::Engine;
use std::time::Duration;

/// Longest a request may take, connection to last byte of the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most of an answer's body read.
const MAX_ANSWER: u64 = 1 << 20;

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Delivered; with a note when the receiver said something about it
    /// (an OTLP partial success).
    Sent(Option<String>),
    /// Not delivered; try again later.
    Retry(String),
    /// The receiver will never take it: given up.
    Drop(String),
    /// The receiver will never take anything this exporter sends.
    Stop(String),
}

/// One exporter's client.
pub struct Client {
    agent: ureq::Agent,
    kind: ExportKind,
    url: String,
    timeout: Duration,
    authorization: Option<String>,
    tenant: Option<String>,
}

/// The CA certificates of a PEM file.
fn load_ca(path: &std::path::Path) -> Result<Vec<ureq::tls::Certificate<'static>>, ExportError> {
    let bad = |why: String| ExportError::File {
        option: "--export-ca",
        path: path.display().to_string(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.len() > 4 << 20 {
        return Err(bad("not a PEM file of CA certificates".into()));
    }
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(bad(format!("not PEM: {e}"))),
        }
    }
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE in it".into()));
    }
    Ok(certs)
}

impl Client {
    pub fn new(spec: &ExportSpec, opts: &ExportOptions) -> Result<Client, ExportError> {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(ca) = &opts.ca {
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&load_ca(ca)?));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(opts.timeout.unwrap_or(REQUEST_TIMEOUT)))
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(concat!("vmscope/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls.build())
            .build()
            .into();
        let authorization = opts.credential.as_ref().map(|c| match c {
            Credential::Bearer(t) => format!("Bearer {t}"),
            Credential::Basic { user, password } => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            ),
        });
        Ok(Client {
            agent,
            kind: spec.kind,
            url: spec.url.clone(),
            timeout: opts.timeout.unwrap_or(REQUEST_TIMEOUT),
            authorization,
            tenant: opts.tenant.clone(),
        })
    }

    /// Send one request and judge the answer.
    pub fn send(&self, req: &Request) -> Outcome {
        let url = if req.query.is_empty() {
            self.url.clone()
        } else {
            format!("{}?{}", self.url, req.query)
        };
        let mut r = self
            .agent
            .post(&url)
            .header("Content-Type", &req.content_type);
        if let Some(e) = &req.content_encoding {
            r = r.header("Content-Encoding", e);
        }
        for (k, v) in &req.headers {
            r = r.header(k, v);
        }
        if let Some(a) = &self.authorization {
            r = r.header("Authorization", a);
        }
        if let Some(t) = &self.tenant {
            r = r.header("X-Scope-OrgID", t);
        }
        let mut answer = match r.send(&req.body[..]) {
            Ok(a) => a,
            Err(e) => {
                return Outcome::Retry(describe(&e, self.url.starts_with("https:"), self.timeout))
            }
        };
        let status = answer.status().as_u16();
        let body = answer
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()
            .unwrap_or_default();
        self.judge(status, &body, answer.headers().get("location"))
    }

    fn judge(
        &self,
        status: u16,
        body: &[u8],
        location: Option<&ureq::http::HeaderValue>,
    ) -> Outcome {
        let said = || {
            let t = String::from_utf8_lossy(&body[..body.len().min(200)]);
            let t = vmscope_model::text::visible(t.trim()).into_owned();
            if t.is_empty() {
                String::new()
            } else {
                format!(": {t}")
            }
        };
        match status {
            200..=299 => {
                if self.kind == ExportKind::Otlp {
                    match crate::otlp::check_response(body) {
                        Ok(note) => Outcome::Sent(note),
                        Err(e) => Outcome::Retry(format!(
                            "answered {status} with a body that is not an OTLP ExportProfilesServiceResponse ({e}{}): is this an OTLP/HTTP receiver?",
                            said()
                        )),
                    }
                } else {
                    Outcome::Sent(None)
                }
            }
            400 if self.kind == ExportKind::Otlp && crate::otlp::is_version_rejection(body) => {
                Outcome::Stop(format!(
                    "the receiver does not take OTLP profiles schema revision {} ({}: {}){}; \
                     this exporter stops (upgrade the receiver or vmscope)",
                    crate::otlp::DEVELOPMENT_VERSION,
                    crate::otlp::VERSION_HEADER,
                    crate::otlp::DEVELOPMENT_VERSION,
                    said()
                ))
            }
            400 | 413 | 415 | 422 => Outcome::Drop(format!("refused with {status}{}", said())),
            401 | 403 => Outcome::Retry(format!(
                "answered {status}{}: the credentials (--export-token-file, --export-basic-auth-file) are missing or wrong",
                said()
            )),
            300..=399 => Outcome::Retry(format!(
                "answered {status}, a redirect to {}: give that URL",
                location
                    .and_then(|l| l.to_str().ok())
                    .unwrap_or("an address it did not name")
            )),
            _ => Outcome::Retry(format!("answered {status}{}", said())),
        }
    }
}

/// One line about a request that got no answer.
fn describe(e: &ureq::Error, https: bool, timeout: Duration) -> String {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if lower.contains("certificate")
        || lower.contains("unknownissuer")
        || lower.contains("invalid peer")
    {
        return format!(
            "the receiver's TLS certificate is not trusted ({text}): --export-ca names the CA that signed it"
        );
    }
    match e {
        ureq::Error::Timeout(_) => format!(
            "no answer within the time allowed ({} s to connect, {} s in all)",
            CONNECT_TIMEOUT.as_secs(),
            timeout.as_secs()
        ),
        ureq::Error::HostNotFound => "the host name does not resolve".into(),
        ureq::Error::ConnectionFailed => "cannot connect".into(),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused (is the receiver running?)".into()
        }
        _ if https && lower.contains("tls") => format!("TLS failed: {text}"),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(kind: ExportKind) -> Client {
        let spec = ExportSpec {
            kind,
            url: "http://127.0.0.1:1/x".into(),
        };
        Client::new(&spec, &ExportOptions::default()).unwrap()
    }

    #[test]
    fn answers_are_judged() {
        let o = client(ExportKind::Otlp);
        assert_eq!(o.judge(200, b"", None), Outcome::Sent(None));
        assert!(
            matches!(o.judge(200, b"<html>login</html>", None), Outcome::Retry(m) if m.contains("not an OTLP"))
        );
        assert!(matches!(
            o.judge(400, b"invalid or unsupported otlp-profiles-development-version: supported version is 2", None),
            Outcome::Stop(m) if m.contains("revision 1") && m.contains("supported version is 2")
        ));
        assert!(matches!(o.judge(400, b"bad", None), Outcome::Drop(_)));
        assert!(matches!(o.judge(503, b"", None), Outcome::Retry(m) if m == "answered 503"));
        let rw = client(ExportKind::RemoteWrite);
        assert_eq!(rw.judge(204, b"garbage", None), Outcome::Sent(None));
        assert!(matches!(rw.judge(401, b"", None), Outcome::Retry(m) if m.contains("credentials")));
        assert!(
            matches!(rw.judge(429, b"slow down", None), Outcome::Retry(m) if m.contains("slow down"))
        );
    }

    #[test]
    fn a_bad_ca_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ca.pem");
        std::fs::write(&f, "not a certificate\n").unwrap();
        let spec = ExportSpec::parse("otlp=https://127.0.0.1:1").unwrap();
        let opts = ExportOptions {
            ca: Some(f.clone()),
            ..ExportOptions::default()
        };
        let e = Client::new(&spec, &opts).err().unwrap().to_string();
        assert!(
            e.starts_with("--export-ca ") && e.contains("ca.pem") && e.contains("no CERTIFICATE"),
            "{e}"
        );
    }

    #[test]
    fn a_port_nobody_listens_on_is_retried_at_once() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        drop(held);
        let spec = ExportSpec::parse(&format!("remote-write=http://127.0.0.1:{port}")).unwrap();
        let c = Client::new(&spec, &ExportOptions::default()).unwrap();
        let t = std::time::Instant::now();
        let o = c.send(&Request::test(b"x"));
        assert!(
            matches!(&o, Outcome::Retry(m) if m.contains("refused") || m.contains("connect")),
            "{o:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
