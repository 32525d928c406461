//! The vmscope lab: boots the VMs the experiments need from a spec file and
//! removes every trace of them afterwards.
//!
//! - [`spec`]: spec files (TOML), validated with file/line/field errors.
//! - [`image`]: the guest image (Debian cloud kernel + busybox initramfs +
//!   static guest agent), cached by content hash; [`cpio`] and [`modules`]
//!   build its initramfs.
//! - [`qemu`]: QEMU command line, detached launch, QMP, threads, pinning.
//! - [`lab`]: [`up`], [`down`], the KVM probe, host resources.
//! - [`state`]: the state file and idempotent teardown.
//! - [`names`]: bridge, tap and volume names derived from the lab name.
//!
//! Other crates boot labs with [`up`], read running labs with
//! [`load_state`], talk to guests with [`connect_agent`] and clean up with
//! [`down`].

pub mod cpio;
pub mod error;
pub mod image;
pub mod lab;
pub mod modules;
pub mod names;
pub mod qemu;
pub mod spec;
pub mod state;
pub mod util;

pub use error::LabError;
pub use lab::{
    connect_agent, down, find_vm, list_labs, load_state, load_state_in, state_path, up, vm_running,
    LabOptions,
};
pub use spec::{Accel, LabSpec};
pub use state::{HelloInfo, LabState, Phase, TeardownReport, VmState};
