//! The vmscope lab: boots the VMs the experiments need from a spec file and
//! removes every trace of them afterwards.
//!
//! - [`spec`]: spec files (TOML), validated with file/line/field errors;
//!   [`builtin`]: the labs built into the binary, by name.
//! - [`image`]: the guest image (Debian cloud kernel + busybox initramfs +
//!   static guest agent), cached by content hash; [`cpio`] and [`modules`]
//!   build its initramfs.
//! - [`qemu`]: detached launch of QEMU, waiting for QMP, threads, pinning;
//!   [`qemu_args`]: the QEMU command line of lab VMs and of the KVM probe.
//! - [`lab`]: [`up`], [`down`], the bridge, waiting for agents; `start`: one
//!   VM in stages (NICs, disks, boot files, QEMU); `kvm_probe`: whether KVM
//!   really runs guests here.
//! - [`libvirt`]: labs whose VMs are transient libvirt domains
//!   (`manager = "libvirt"`): domain XML, `virsh`, libvirtd's availability.
//! - [`state`]: the state file and idempotent teardown.
//! - [`names`]: bridge, tap and volume names derived from the lab name.
//! - [`cancel`]: the cancel flag the long waits of `up` check (a signal
//!   during `up` tears down what it made).
//!
//! Other crates boot labs with [`up`], read running labs with
//! [`load_state`], talk to guests with [`connect_agent`] and clean up with
//! [`down`].

pub mod builtin;
pub mod cancel;
pub mod cpio;
pub mod error;
pub mod image;
mod kvm_probe;
pub mod lab;
pub mod libvirt;
pub mod modules;
pub mod names;
pub mod qemu;
pub mod qemu_args;
pub mod spec;
mod start;
pub mod state;
pub mod util;

pub use cancel::Cancel;
pub use error::LabError;
pub use lab::{
    connect_agent, down, find_vm, list_labs, load_state, load_state_in, state_path, up, vm_running,
    LabOptions,
};
pub use spec::{AccelChoice, LabSpec, Manager};
pub use state::{HelloInfo, LabState, Phase, TeardownReport, VmState};
