//! The one error type of the lab. Every message names the file, VM or host
//! resource it is about, so a user can act on it without a backtrace.

use std::path::PathBuf;

/// Everything that can go wrong in the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A spec file is malformed or asks for something impossible. `line` is
    /// 1-based; `field` is a dotted path such as `vm[1].vcpus`.
    #[error("{}:{line}: {field}: {message}", file.display())]
    Spec {
        file: PathBuf,
        line: usize,
        field: String,
        message: String,
    },
    /// `--lab` or `lab up` named neither a spec file nor a built-in lab.
    #[error("{arg}: no such spec file, and not a built-in lab ({builtin})")]
    NoSuchSpec { arg: String, builtin: String },
    /// A lab name (`--lab-name`) that names could not be made from.
    #[error("lab name {name}: lab names are letters, digits, '-' and '_', start with a letter or digit, at most 32 characters")]
    BadName { name: String },
    /// A spec file could not be read.
    #[error("cannot read spec {}: {source}", file.display())]
    SpecRead {
        file: PathBuf,
        source: std::io::Error,
    },
    /// A host tool is missing; names the Debian package that provides it.
    #[error(
        "'{tool}' not found: install the Debian package '{package}' (apt-get install {package})"
    )]
    MissingTool { tool: String, package: String },
    /// The lab needs root for what the spec asks (taps, loop devices, pinning, /run).
    #[error("lab {lab}: {what} needs root; run vmscope as root")]
    NotRoot { lab: String, what: String },
    /// An external command failed.
    #[error("{context}: '{command}' failed: {detail}")]
    Command {
        context: String,
        command: String,
        detail: String,
    },
    /// A file system operation failed on `path`.
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: String,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Building the guest image failed.
    #[error("guest image: {0}")]
    Image(String),
    /// The guest agent binary could not be found.
    #[error("guest agent binary not found (looked at: {looked}); build it with: {build}")]
    AgentBinary { looked: String, build: String },
    /// Another `lab up` or `lab down` of this lab is under way.
    #[error("lab {lab} is being brought up or torn down by {holder}; wait for it to end (or stop it), then try again")]
    Busy {
        lab: String,
        holder: vmscope_linux::files::LockHolder,
    },
    /// No lab state exists under this name.
    #[error("lab '{name}' is not up (no state at {})", path.display())]
    NoSuchLab { name: String, path: PathBuf },
    /// The lab is already up.
    #[error("lab '{name}' is already up (state at {}); run 'vmscope lab down {name}' first", path.display())]
    AlreadyUp { name: String, path: PathBuf },
    /// No VM of that name in the lab(s).
    #[error("no VM named '{vm}' in {where_}")]
    NoSuchVm { vm: String, where_: String },
    /// A host resource needed by the lab is taken or missing.
    #[error("{resource}: {message}")]
    Resource { resource: String, message: String },
    /// A VM failed to start or to become ready.
    #[error("VM {vm}: {message}")]
    Vm { vm: String, message: String },
    /// Talking to the guest agent failed.
    #[error("VM {vm}: agent: {message}")]
    Agent { vm: String, message: String },
    /// QMP talk with QEMU failed.
    #[error("VM {vm}: {source}")]
    Qmp {
        vm: String,
        #[source]
        source: vmscope_discover::DiscoverError,
    },
    /// The state file is unreadable.
    #[error("lab state {}: {message}", path.display())]
    State { path: PathBuf, message: String },
    /// `up` failed and tore down what it had made; the VMs' console and
    /// QEMU logs were kept (when there were any) for the post-mortem.
    #[error("lab {lab}: {cause}{}", logs.as_ref().map(|l| format!("; everything it made was removed, the VMs' console and QEMU logs are kept in {}", l.display())).unwrap_or_else(|| "; everything it made was removed".into()))]
    UpFailed {
        lab: String,
        cause: Box<LabError>,
        logs: Option<PathBuf>,
    },
    /// A cancel request (a signal) stopped the work; see [`crate::cancel`].
    #[error("interrupted by {} while {during}", crate::cancel::signal_name(*signal))]
    Interrupted { signal: i32, during: String },
}

impl LabError {
    /// Shorthand for [`LabError::Io`].
    pub fn io(
        context: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        LabError::Io {
            context: context.into(),
            path: path.into(),
            source,
        }
    }
}

/// Result alias of the lab crate.
pub type Result<T, E = LabError> = std::result::Result<T, E>;
