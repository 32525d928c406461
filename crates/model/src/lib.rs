//! vmscope's pure data model: no I/O lives here.
//!
//! This crate owns the vocabulary of docs/architecture.md §2 ([`Domain`], [`Role`],
//! [`Context`], [`EventSpec`]), the normalized record stream every collector
//! produces ([`Record`]), the per-process address-space state machine that turns
//! sample IPs into (image, file offset) pairs ([`ProcessTable`]), the attribution
//! rules of docs/architecture.md §4 ([`attribute`]) and the aggregated profile ([`Profile`]).
//! Collectors (live rings, perf.data import, guest agents) produce [`Record`]s;
//! symbolizers, stores and printers consume the types here and nothing else.

pub mod attribution;
pub mod budget;
pub mod deferred;
pub mod event;
pub mod numa;
pub mod process;
pub mod profile;
pub mod record;
pub mod text;

pub use attribution::{attribute, Attribution, ThreadMap, ThreadOwner, ThreadRole};
pub use deferred::{DeferredFrame, RawDelta, RawFrame, RawRowKey, NO_STACK};
pub use event::{EventError, EventKind, EventSpec, SampleRate, SessionEvent, DEFAULT_FREQUENCY};
pub use process::{ImageRef, Mapping, NormalizedFrame, ProcessTable};
pub use profile::{
    AggKey, BinKey, Counts, FastMap, FastSet, Profile, ProfileHasher, ProfileRow, INLINED_SUFFIX,
    UNKNOWN_SLICE,
};
pub use record::{split_callchain, split_callchain_into, CpuMode, RawChain, Record, SampleRecord};

use serde::{Deserialize, Serialize};

/// Name of the host domain (docs/architecture.md §2).
pub const HOST_DOMAIN: &str = "host";

/// The session meta keys of a profile's coverage (docs/architecture.md
/// §4), written by `record -a` and read by `report`.
pub mod coverage_meta {
    /// The prefix of a domain's run time over the sampled window, seconds.
    pub const RUN_S_PREFIX: &str = "run_s_";
    /// The prefix of a VM's run time per thread name: lines of
    /// `seconds name`.
    pub const RUN_THREADS_PREFIX: &str = "run_threads_";
    /// The host's own steal meanwhile, percent of its CPUs.
    pub const HOST_STEAL_PCT: &str = "host_steal_pct";
}

/// Image name used for host kernel samples, as perf names it.
pub const KERNEL_IMAGE: &str = "[kernel.kallsyms]";
/// Image name of a guest's kernel, as perf kvm names it, whoever resolved
/// it (the host for passive VMs, the agent for active ones): never the
/// host's `[kernel.kallsyms]`.
pub const GUEST_KERNEL_IMAGE: &str = "[guest.kernel.kallsyms]";
/// Image name of a guest's kernel in sessions of schema 2 and older
/// (passive VMs); migrated to [`GUEST_KERNEL_IMAGE`].
pub const OLD_GUEST_KERNEL_IMAGE: &str = "[guest.kernel]";

/// The image name a guest kernel row gets on the host: the agent's
/// `[kernel.kallsyms]` becomes [`GUEST_KERNEL_IMAGE`] and a guest module
/// `[virtio_net]` becomes `[guest.virtio_net]`, so no format can mix a
/// guest's kernel with the host's. Other images (files in the guest,
/// `[anon]`, `[unknown]`, `[vdso]`) are kept.
pub fn guest_image(image: &str, context: Context) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    if image == KERNEL_IMAGE || image == OLD_GUEST_KERNEL_IMAGE {
        return Cow::Borrowed(GUEST_KERNEL_IMAGE);
    }
    if context == Context::GuestKernel
        && image.starts_with('[')
        && image.ends_with(']')
        && !image.starts_with("[guest.")
        && ![ANON_IMAGE, UNKNOWN_IMAGE, "[vdso]", "[vsyscall]"].contains(&image)
    {
        return Cow::Owned(format!("[guest.{}", &image[1..]));
    }
    Cow::Borrowed(image)
}
/// Image name for anonymous executable memory (JIT, TCG translated code).
pub const ANON_IMAGE: &str = "[anon]";
/// Image name for addresses no mapping covers.
pub const UNKNOWN_IMAGE: &str = "[unknown]";

/// Execution context of a sample (docs/architecture.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Context {
    /// User code inside a VM.
    GuestUser,
    /// Kernel code inside a VM.
    GuestKernel,
    /// Guest code whose mode the host cannot see: TCG translated code in
    /// QEMU's anonymous executable memory. An active agent splits it.
    GuestTranslated,
    /// Host kernel on behalf of a VM (KVM exits in vCPU threads, vhost workers).
    VmmKernel,
    /// VMM userspace (QEMU) on behalf of a VM.
    VmmUser,
    /// Host kernel, not on behalf of any VM.
    HostKernel,
    /// Host userspace, not on behalf of any VM.
    HostUser,
    /// The idle task.
    Idle,
}

impl Context {
    pub const ALL: [Context; 8] = [
        Context::GuestUser,
        Context::GuestKernel,
        Context::GuestTranslated,
        Context::VmmKernel,
        Context::VmmUser,
        Context::HostKernel,
        Context::HostUser,
        Context::Idle,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Context::GuestUser => "guest-user",
            Context::GuestKernel => "guest-kernel",
            Context::GuestTranslated => "guest",
            Context::VmmKernel => "vmm-kernel",
            Context::VmmUser => "vmm-user",
            Context::HostKernel => "host-kernel",
            Context::HostUser => "host-user",
            Context::Idle => "idle",
        }
    }

    pub fn parse(s: &str) -> Option<Context> {
        Context::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// True for code that ran inside a VM.
    pub fn is_guest(self) -> bool {
        matches!(
            self,
            Context::GuestUser | Context::GuestKernel | Context::GuestTranslated
        )
    }
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Role of a domain in a profiling session (docs/architecture.md §2, Xenoprof's roles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The host, which starts and stops every session.
    Initiator,
    /// An agent inside the VM samples and symbolizes its own code.
    Active,
    /// The host samples guest-mode code; guest kernel symbols from kallsyms.
    Passive,
    /// Counted as one line, not resolved.
    Unmonitored,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Initiator => "initiator",
            Role::Active => "active",
            Role::Passive => "passive",
            Role::Unmonitored => "unmonitored",
        }
    }
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "initiator" => Some(Role::Initiator),
            "active" => Some(Role::Active),
            "passive" => Some(Role::Passive),
            "unmonitored" => Some(Role::Unmonitored),
            _ => None,
        }
    }
}

/// A domain: the host or one VM (docs/architecture.md §2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Domain {
    /// `host` or the VM's name.
    pub name: String,
    pub role: Role,
    /// QEMU pid for a VM; `None` for the host.
    pub pid: Option<u32>,
}

impl Domain {
    pub fn host() -> Domain {
        Domain {
            name: HOST_DOMAIN.to_string(),
            role: Role::Initiator,
            pid: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_kernel_images_are_named_apart_from_the_hosts() {
        let g = |i: &str, c: Context| guest_image(i, c).into_owned();
        assert_eq!(
            g("[kernel.kallsyms]", Context::GuestKernel),
            "[guest.kernel.kallsyms]"
        );
        assert_eq!(
            g("[guest.kernel]", Context::GuestKernel),
            "[guest.kernel.kallsyms]"
        );
        assert_eq!(
            g("[virtio_net]", Context::GuestKernel),
            "[guest.virtio_net]"
        );
        assert_eq!(
            g("[guest.virtio_net]", Context::GuestKernel),
            "[guest.virtio_net]"
        );
        assert_eq!(g("[unknown]", Context::GuestKernel), "[unknown]");
        assert_eq!(g("/usr/sbin/httpd", Context::GuestUser), "/usr/sbin/httpd");
        assert_eq!(g("[vdso]", Context::GuestUser), "[vdso]");
    }
}
