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
    let mut out = Vec::with_capacity(raw.len());
    split_callchain_into(raw, sample_mode, &mut out);
    out
}

/// [`split_callchain`] appending to `out` (a reused vector: the recorder
/// recycles its samples' chains).
pub fn split_callchain_into(raw: &[u64], sample_mode: CpuMode, out: &mut Vec<(CpuMode, u64)>) {
    let mut mode = sample_mode;
    out.reserve(raw.len());
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
}

/// A call chain as perf writes it: 8-byte words in the file's byte order,
/// leaf first, context markers included (see [`split_callchain`]). Import
/// borrows it from the record it was read from, so a sample whose chain was
/// seen before costs no allocation (the chain is split only when a new one
/// is symbolized).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawChain<'a> {
    bytes: &'a [u8],
    big_endian: bool,
}

impl<'a> RawChain<'a> {
    /// `bytes` holds whole words (a trailing partial word is ignored).
    pub fn new(bytes: &'a [u8], big_endian: bool) -> RawChain<'a> {
        let whole = bytes.len() / 8 * 8;
        RawChain {
            bytes: &bytes[..whole],
            big_endian,
        }
    }

    /// Number of words, markers included.
    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The words in host order.
    #[inline]
    pub fn words(&self) -> impl Iterator<Item = u64> + 'a {
        let big = self.big_endian;
        self.bytes.chunks_exact(8).map(move |w| {
            let a: [u8; 8] = w.try_into().unwrap_or_default();
            if big {
                u64::from_be_bytes(a)
            } else {
                u64::from_le_bytes(a)
            }
        })
    }

    /// The same words as `other`.
    #[inline]
    pub fn eq_words(&self, other: &[u64]) -> bool {
        self.len() == other.len() && self.words().zip(other).all(|(a, &b)| a == b)
    }

    /// The words in host order, copied.
    pub fn to_words(&self) -> Vec<u64> {
        self.words().collect()
    }
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
    /// Kernel code that came or went at run time (a BPF program, a
    /// trampoline: `PERF_RECORD_KSYMBOL`), which the kallsyms read at the
    /// start does not have. `bpf` for BPF programs (kallsyms' `[bpf]`).
    Ksymbol {
        addr: u64,
        len: u64,
        name: Arc<str>,
        bpf: bool,
        /// The code was removed: the range is no longer this symbol.
        unregister: bool,
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
    fn raw_chains_read_either_byte_order() {
        let words = [PERF_CONTEXT_USER, 0x401000, 0x402000];
        let le: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut be: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(RawChain::new(&le, false).to_words(), words);
        assert!(RawChain::new(&le, false).eq_words(&words));
        assert!(!RawChain::new(&le, false).eq_words(&words[..2]));
        assert!(!RawChain::new(&le, true).eq_words(&words));
        be.push(0);
        let c = RawChain::new(&be, true);
        assert_eq!((c.len(), c.to_words()), (3, words.to_vec()));
        assert!(RawChain::new(&[], false).is_empty());
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
