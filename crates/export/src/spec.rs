//! `--export KIND=URL` and the options every exporter shares.
//!
//! A URL is `http://` or `https://` with a host; it carries no user or
//! password (credentials come from files only, never the command line,
//! which `ps` shows to every user). When its path is empty or `/`, the
//! kind's usual endpoint is appended: `/v1development/profiles` (OTLP/HTTP
//! profiles), `/ingest` (Pyroscope), `/api/v1/write` (Prometheus and
//! VictoriaMetrics remote write).

use crate::ExportError;
use std::path::{Path, PathBuf};

/// The protocol an exporter speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExportKind {
    /// OTLP profiles over HTTP/protobuf.
    Otlp,
    /// Pyroscope's `/ingest` with gzipped pprof.
    Pyroscope,
    /// Prometheus remote write, version 1.
    RemoteWrite,
}

impl ExportKind {
    /// The kind's name on the command line and in the `exporter` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportKind::Otlp => "otlp",
            ExportKind::Pyroscope => "pyroscope",
            ExportKind::RemoteWrite => "remote-write",
        }
    }

    /// Whether it sends profiles (needs the rolling recording) rather than
    /// metrics.
    pub fn sends_profiles(self) -> bool {
        !matches!(self, ExportKind::RemoteWrite)
    }

    fn default_path(self) -> &'static str {
        match self {
            ExportKind::Otlp => "/v1development/profiles",
            ExportKind::Pyroscope => "/ingest",
            ExportKind::RemoteWrite => "/api/v1/write",
        }
    }

    const ALL: [ExportKind; 3] = [
        ExportKind::Otlp,
        ExportKind::Pyroscope,
        ExportKind::RemoteWrite,
    ];
}

/// One `--export KIND=URL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    pub kind: ExportKind,
    /// The URL requests go to (the kind's path appended where none was
    /// given); Pyroscope's query string is added per request.
    pub url: String,
}

impl ExportSpec {
    /// Parse `KIND=URL`.
    pub fn parse(text: &str) -> Result<ExportSpec, ExportError> {
        let bad = |why: String| ExportError::Spec {
            spec: redacted(text),
            why,
        };
        let kinds = ExportKind::ALL
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let Some((kind, url)) = text.split_once('=') else {
            return Err(bad(format!("give KIND=URL, KIND one of {kinds}")));
        };
        let kind = ExportKind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind.trim())
            .ok_or_else(|| bad(format!("unknown exporter {kind:?}: one of {kinds}")))?;
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(bad(format!(
                "URL {url:?} has no scheme: write http://HOST:PORT or https://HOST:PORT"
            )));
        };
        if scheme != "http" && scheme != "https" {
            return Err(bad(format!(
                "URL scheme {scheme:?}: only http and https are spoken"
            )));
        }
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(bad(
                "the URL carries a user or password: give credentials in a file \
                 (--export-token-file, --export-basic-auth-file), never on the command line"
                    .into(),
            ));
        }
        if authority.is_empty() || authority.starts_with(':') {
            return Err(bad(format!("URL {url:?} has no host")));
        }
        if path.contains('#') {
            return Err(bad(format!("URL {url:?}: a fragment means nothing here")));
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(format!(
                "URL {url:?} contains spaces or control characters"
            )));
        }
        if kind == ExportKind::Pyroscope && path.contains('?') {
            return Err(bad(
                "a Pyroscope URL takes no query: vmscope adds name, from, until and format".into(),
            ));
        }
        let url = if path.is_empty() || path == "/" {
            format!("{scheme}://{authority}{}", kind.default_path())
        } else {
            url.to_string()
        };
        // What ureq will be given must parse as a URI.
        url.parse::<ureq::http::Uri>()
            .map_err(|e| bad(format!("URL {url:?}: {e}")))?;
        Ok(ExportSpec { kind, url })
    }
}

/// `text` with a URL's user and password, if any, left out: an error
/// line does not repeat a secret given on the command line.
fn redacted(text: &str) -> String {
    let Some((head, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{head}://…@{}", &rest[at + 1..]),
        None => text.to_string(),
    }
}

/// A credential sent with every request.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer TOKEN`.
    Bearer(String),
    /// `Authorization: Basic base64(USER:PASSWORD)`.
    Basic { user: String, password: String },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never printed, even in a debug line.
        match self {
            Credential::Bearer(_) => f.write_str("Bearer(…)"),
            Credential::Basic { user, .. } => write!(f, "Basic({user}, …)"),
        }
    }
}

/// Options every exporter shares.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// PEM file of the CA certificates that HTTPS receivers are checked
    /// against (instead of the built-in web roots).
    pub ca: Option<PathBuf>,
    pub credential: Option<Credential>,
    /// `X-Scope-OrgID`: the tenant of a multi-tenant Pyroscope, Mimir or
    /// Loki-style receiver.
    pub tenant: Option<String>,
    /// Longest a request may take; `None`: [`crate::client::REQUEST_TIMEOUT`].
    pub timeout: Option<std::time::Duration>,
}

/// The longest secret file read.
const MAX_SECRET: u64 = 64 * 1024;

/// Read a secret from a file: one line (a trailing newline is dropped),
/// not empty.
pub fn read_secret(option: &'static str, path: &Path) -> Result<String, ExportError> {
    let bad = |why: String| ExportError::File {
        option,
        path: path.display().to_string(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if meta.len() > MAX_SECRET {
        return Err(bad(format!("over {MAX_SECRET} bytes: not a secret")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(bad("empty".into()));
    }
    if text.contains('\n') {
        return Err(bad("more than one line".into()));
    }
    Ok(text.to_string())
}

/// A bearer token from `--export-token-file`.
pub fn bearer_from_file(path: &Path) -> Result<Credential, ExportError> {
    let token = read_secret("--export-token-file", path)?;
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ExportError::File {
            option: "--export-token-file",
            path: path.display().to_string(),
            why: "the token contains spaces or control characters".into(),
        });
    }
    Ok(Credential::Bearer(token))
}

/// `USER:PASSWORD` from `--export-basic-auth-file`.
pub fn basic_from_file(path: &Path) -> Result<Credential, ExportError> {
    let line = read_secret("--export-basic-auth-file", path)?;
    match line.split_once(':') {
        Some((user, password)) if !user.is_empty() => Ok(Credential::Basic {
            user: user.to_string(),
            password: password.to_string(),
        }),
        _ => Err(ExportError::File {
            option: "--export-basic-auth-file",
            path: path.display().to_string(),
            why: "give one line USER:PASSWORD".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_name_the_problem() {
        let s = ExportSpec::parse("otlp=http://127.0.0.1:4318").unwrap();
        assert_eq!(s.kind, ExportKind::Otlp);
        assert_eq!(s.url, "http://127.0.0.1:4318/v1development/profiles");
        let s = ExportSpec::parse("remote-write=https://vm:8428/").unwrap();
        assert_eq!(s.url, "https://vm:8428/api/v1/write");
        let s = ExportSpec::parse("remote-write=http://p:9090/custom/write").unwrap();
        assert_eq!(s.url, "http://p:9090/custom/write");
        let s = ExportSpec::parse("pyroscope=http://[::1]:4040").unwrap();
        assert_eq!(s.url, "http://[::1]:4040/ingest");
        for (spec, says) in [
            ("otlp", "KIND=URL"),
            ("jaeger=http://x", "unknown exporter \"jaeger\""),
            ("otlp=127.0.0.1:4318", "has no scheme"),
            ("otlp=ftp://x", "only http and https"),
            ("otlp=http://user:pw@x", "never on the command line"),
            ("otlp=http://user:pw@x/p", "\"otlp=http://…@x/p\""),
            ("otlp=http://", "no host"),
            ("otlp=http://:4318", "no host"),
            ("pyroscope=http://x/ingest?name=a", "takes no query"),
            ("otlp=http://x y", "spaces"),
        ] {
            let e = ExportSpec::parse(spec).unwrap_err().to_string();
            assert!(e.contains(says), "{spec}: {e}");
            assert!(!e.contains('\n') && !e.contains("pw@"), "{e}");
        }
    }

    #[test]
    fn secrets_come_from_files_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "s3cret\n").unwrap();
        assert_eq!(
            bearer_from_file(&f).unwrap(),
            Credential::Bearer("s3cret".into())
        );
        assert_eq!(format!("{:?}", bearer_from_file(&f).unwrap()), "Bearer(…)");
        std::fs::write(&f, "").unwrap();
        let e = bearer_from_file(&f).unwrap_err().to_string();
        assert!(
            e.contains("--export-token-file") && e.contains("empty"),
            "{e}"
        );
        let e = bearer_from_file(&dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope") && e.contains("No such file"), "{e}");
        std::fs::write(&f, "alice:pa:ss\n").unwrap();
        assert_eq!(
            basic_from_file(&f).unwrap(),
            Credential::Basic {
                user: "alice".into(),
                password: "pa:ss".into()
            }
        );
        std::fs::write(&f, "nocolon\n").unwrap();
        assert!(basic_from_file(&f)
            .unwrap_err()
            .to_string()
            .contains("USER:PASSWORD"));
    }
}
