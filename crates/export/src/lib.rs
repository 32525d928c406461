//! vmscope's exporters (`vmscope serve --export KIND=URL`): the rolling
//! recording and the `/metrics` series pushed to the engines fleets already
//! run, in their own protocols, so a host nobody can scrape still reports.
//!
//! What each module owns:
//! - [`spec`]: parsing `--export KIND=URL` (kinds `otlp`, `pyroscope`,
//!   `remote-write`), the endpoint path each kind appends, and the options
//!   every exporter shares (`--export-ca`, credentials from files, tenant).
//! - [`window`]: what a profile exporter is given: one export interval of
//!   the rolling recording as a pprof in the merged view, with the host's
//!   and each VM's identity and what profiling cost in those seconds.
//! - [`otlp`]: a window as an OTLP `ExportProfilesServiceRequest`
//!   (`opentelemetry-proto`, profiles `v1development`): a resource per
//!   domain (`host.name`, `host.id`, `service.name`), per-sample
//!   attributes, the profiling cost as profile attributes.
//! - [`pyroscope`]: a window as Pyroscope `/ingest` requests, one gzipped
//!   pprof per domain (`service_name` `vm/NAME` or `host`).
//! - [`remote_write`]: the `/metrics` text as a Prometheus remote-write v1
//!   `WriteRequest` (prost, snappy block format).
//! - [`spool`]: the queue of one exporter's requests: in memory, or in a
//!   directory that outlives the process; bounded in bytes, oldest dropped.
//! - [`client`]: the HTTP(S) client (ureq on rustls): CA file, bearer token
//!   or basic auth read from files, bounded timeouts, and what an answer
//!   means (sent, retry, drop, stop).
//! - [`exporter`]: one thread per exporter that sends its queue in order,
//!   retrying with backoff, and counts what happened
//!   (`vmscope_export_{sent,failed,spooled,dropped}_total`, [`metrics`]).

pub mod client;
pub mod exporter;
pub mod metrics;
pub mod otlp;
pub mod pyroscope;
pub mod remote_write;
pub mod spec;
pub mod spool;
pub mod window;

pub use exporter::{Exporter, ExporterStats};
pub use spec::{ExportKind, ExportOptions, ExportSpec};
pub use window::{HostIdentity, ProfileWindow, VmIdentity, WindowCost};

/// What went wrong setting up or feeding an exporter. Each message is one
/// line that names the input and what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// `--export` was not `KIND=URL` with a known kind and a usable URL.
    #[error("--export {spec:?}: {why}")]
    Spec { spec: String, why: String },
    /// A file named by an option (CA, token, password) cannot be used.
    #[error("{option} {path}: {why}")]
    File {
        option: &'static str,
        path: String,
        why: String,
    },
    /// The spool directory cannot be used.
    #[error("--export-spool {path}: {why}")]
    Spool { path: String, why: String },
    /// A window or the metrics could not be encoded.
    #[error("encoding for {exporter}: {why}")]
    Encode { exporter: String, why: String },
}
