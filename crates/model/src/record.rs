//! The normalized record stream: what every collector (live perf rings,
//! perf.data import, guest agents) produces, in the order it happened.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// CPU mode of a sample: the low 3 bits of perf's `misc` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CpuMode {
    Unknown,
    Kernel,
    User,
    Hypervisor,
    GuestKernel,
    GuestUser,
}

impl CpuMode {
    /// From `perf_event_header.misc` (PERF_RECORD_MISC_CPUMODE_MASK = 7).
    pub fn from_misc(misc: u16) -> CpuMode {
        match misc & 7 {
            1 => CpuMode::Kernel,
            2 => CpuMode::User,
            3 => CpuMode::Hypervisor,
            4 => CpuMode::GuestKernel,
            5 => CpuMode::GuestUser,
            _ => CpuMode::Unknown,
        }
    }

    pub fn to_misc(self) -> u16 {
        match self {
            CpuMode::Unknown => 0,
            CpuMode::Kernel => 1,
            CpuMode::User => 2,
            CpuMode::Hypervisor => 3,
            CpuMode::GuestKernel => 4,
            CpuMode::GuestUser => 5,
        }
    }

    pub fn is_kernel(self) -> bool {
        matches!(
            self,
            CpuMode::Kernel | CpuMode::GuestKernel | CpuMode::Hypervisor
        )
    }
}

// Callchain context markers (linux/perf_event.h, enum perf_callchain_context).
const PERF_CONTEXT_HV: u64 = (-32i64) as u64;
const PERF_CONTEXT_KERNEL: u64 = (-128i64) as u64;
const PERF_CONTEXT_USER: u64 = (-512i64) as u64;
const PERF_CONTEXT_GUEST: u64 = (-2048i64) as u64;
const PERF_CONTEXT_GUEST_KERNEL: u64 = (-2176i64) as u64;
const PERF_CONTEXT_GUEST_USER: u64 = (-2560i64) as u64;
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;

/// Turn a raw perf callchain (leaf first, with context markers) into frames
/// tagged with their mode. Markers are dropped; frames before any marker take
/// `sample_mode`.
pub fn split_callchain(raw: &[u64], sample_mode: CpuMode) -> Vec<(CpuMode, u64)> {
    let mut mode = sample_mode;
    let mut out = Vec::with_capacity(raw.len());
    for &ip in raw {
        if ip >= PERF_CONTEXT_MAX {
            mode = match ip {
                PERF_CONTEXT_HV => CpuMode::Hypervisor,
                PERF_CONTEXT_KERNEL => CpuMode::Kernel,
                PERF_CONTEXT_USER => CpuMode::User,
                PERF_CONTEXT_GUEST | PERF_CONTEXT_GUEST_KERNEL => CpuMode::GuestKernel,
                PERF_CONTEXT_GUEST_USER => CpuMode::GuestUser,
                _ => mode,
            };
            continue;
        }
        out.push((mode, ip));
    }
    out
}

/// One sample, before symbolization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// Index into the session's event list.
    pub event: u32,
    pub ip: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// Nanoseconds, perf clock (CLOCK_MONOTONIC by default).
    pub time: u64,
    pub mode: CpuMode,
    pub period: u64,
    /// Call chain leaf first, markers removed (see [`split_callchain`]).
    /// Empty without `-g`. When present, the first frame is normally `ip`.
    pub callchain: Vec<(CpuMode, u64)>,
}

/// A record of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    Sample(SampleRecord),
    /// A new mapping. `pid == u32::MAX` is the kernel (perf's pid -1).
    Mmap {
        pid: u32,
        tid: u32,
        start: u64,
        len: u64,
        pgoff: u64,
        path: Arc<str>,
        build_id: Option<Arc<[u8]>>,
        executable: bool,
        time: u64,
    },
    Comm {
        pid: u32,
        tid: u32,
        comm: Arc<str>,
        /// Set when the comm change comes from exec (address space replaced).
        exec: bool,
        time: u64,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    Exit {
        pid: u32,
        tid: u32,
        time: u64,
    },
    /// Records the kernel dropped (ring overflow) or a source lost.
    Lost {
        cpu: Option<u32>,
        count: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callchain_markers_switch_modes() {
        let raw = [
            PERF_CONTEXT_KERNEL,
            0xffff_ffff_8100_0000,
            PERF_CONTEXT_USER,
            0x401000,
            0x402000,
        ];
        let v = split_callchain(&raw, CpuMode::Kernel);
        assert_eq!(
            v,
            vec![
                (CpuMode::Kernel, 0xffff_ffff_8100_0000),
                (CpuMode::User, 0x401000),
                (CpuMode::User, 0x402000)
            ]
        );
        let g = split_callchain(&[PERF_CONTEXT_GUEST_USER, 0x1000], CpuMode::Unknown);
        assert_eq!(g, vec![(CpuMode::GuestUser, 0x1000)]);
    }

    #[test]
    fn misc_round_trips() {
        for m in 0..8u16 {
            let mode = CpuMode::from_misc(m);
            if mode != CpuMode::Unknown {
                assert_eq!(mode.to_misc(), m);
            }
        }
        assert_eq!(CpuMode::from_misc(0x4004), CpuMode::GuestKernel);
    }
}
