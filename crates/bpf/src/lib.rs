//! vmscope's eBPF programs and their loaders. The programs are C
//! (`src/bpf/sched.bpf.c`), built by this crate's build script with clang
//! and embedded in the binary ([`object`]); libbpf (through libbpf-rs)
//! loads them, relocating the kernel structure fields they read against
//! the running kernel's BTF, and attaches them to BTF raw tracepoints.
//!
//! - [`switch_times`]: each (CPU, tid)'s run time summed in the kernel,
//!   vm-stat's default source (docs/architecture.md §6).
//! - [`waits`]: who each followed thread waited behind, from the kernel's
//!   own runqueue clock and `sched_info`, summed in the kernel
//!   (docs/architecture.md §5.1).
//!
//! What the numbers mean for a VM is `vmscope_stat`'s business; this
//! crate only loads, feeds and drains the programs.

pub mod object;
pub mod switch_times;
pub mod waits;

/// What can go wrong loading or reading a program.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The kernel or libbpf refused: not root, no BPF, no BTF, or the
    /// verifier (its last line is in the message).
    #[error("{what}: {msg}")]
    Load { what: String, msg: String },
    /// A map operation failed while the programs ran.
    #[error("{what}: {source}")]
    Map {
        what: &'static str,
        source: libbpf_rs::Error,
    },
}
