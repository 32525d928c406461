//! The converter's rows when symbolization is deferred (`record`'s default;
//! [`vmscope_model::deferred`], docs/architecture.md §7.3): a sample adds to
//! a row of integers (its domain's and process's string numbers, its leaf
//! frame's and its stack's numbers), so the per-sample work is a few hash
//! lookups of integers and no text is built; [`RawRows::take`] hands out
//! what was added since the last take with the strings and stacks first
//! numbered in it. Frames are numbered by the symbolizer
//! ([`vmscope_symbols::Symbolizer::defer_frame`]).

use crate::sample_cache::GenMap;
use foldhash::fast::FixedState;
use std::collections::HashMap;
use std::sync::Arc;
use vmscope_model::{CpuMode, Record};
use vmscope_model::{DeferredFrame, ImageRef, RawDelta, RawFrame, RawRowKey};

type FastMap<K, V> = HashMap<K, V, FixedState>;

/// Past this many entries the pointer map of strings is emptied (the text
/// map keeps every string's number).
const PTR_LIMIT: usize = 1 << 16;

/// See the module docs.
#[derive(Default)]
pub(crate) struct RawRows {
    /// String numbers by the pointer of an interned `Arc` (the value holds
    /// the `Arc`, so a pointer is not reused while it is here), then by text.
    strings_by_ptr: FastMap<usize, (u32, Arc<str>)>,
    strings: FastMap<Arc<str>, u32>,
    new_strings: Vec<(u32, Arc<str>)>,
    /// Stack numbers by a 128-bit hash of their frame numbers (as in
    /// [`SampleCache`]: no copy of the chain kept to compare; the copy per
    /// new stack and the compare per lookup were a tenth of the converter's
    /// time under exec churn).
    stacks: FastMap<u128, u32>,
    new_stacks: Vec<(u32, u32)>,
    new_stack_frames: Vec<u32>,
    rows: FastMap<RawRowKey, (u64, u64)>,
    /// (leaf, stack) numbers of recently seen samples.
    pub cache: SampleCache,
    /// The frame numbers of the chain being converted.
    pub chain: Vec<u32>,
}

impl RawRows {
    /// The number of a domain or process name.
    pub fn string(&mut self, s: &Arc<str>) -> u32 {
        let ptr = Arc::as_ptr(s).cast::<u8>() as usize;
        if let Some((n, _)) = self.strings_by_ptr.get(&ptr) {
            return *n;
        }
        let n = if let Some(n) = self.strings.get(s) {
            *n
        } else {
            let n = self.strings.len() as u32;
            self.strings.insert(s.clone(), n);
            self.new_strings.push((n, s.clone()));
            n
        };
        if self.strings_by_ptr.len() >= PTR_LIMIT {
            self.strings_by_ptr.clear();
        }
        self.strings_by_ptr.insert(ptr, (n, s.clone()));
        n
    }

    /// The number of the chain in [`RawRows::chain`] (from 1; the caller
    /// gives [`vmscope_model::NO_STACK`] to an empty chain).
    pub fn stack(&mut self) -> u32 {
        let key = chain_key(&self.chain);
        if let Some(n) = self.stacks.get(&key) {
            return *n;
        }
        let n = self.stacks.len() as u32 + 1;
        self.stacks.insert(key, n);
        self.new_stacks.push((n, self.chain.len() as u32));
        self.new_stack_frames.extend_from_slice(&self.chain);
        n
    }

    pub fn add(&mut self, key: RawRowKey, n: u64, period: u64) {
        let e = self.rows.entry(key).or_default();
        e.0 += n;
        e.1 += period;
    }

    /// A frame with its texts numbered.
    fn frame(&mut self, f: &DeferredFrame) -> RawFrame {
        match f {
            DeferredFrame::Named { image, symbol } => RawFrame::Named {
                image: self.string(image),
                symbol: self.string(symbol),
            },
            DeferredFrame::Later { frame, module } => match &frame.image {
                ImageRef::File { path, build_id } => RawFrame::File {
                    path: self.string(path),
                    build_id: build_id.as_ref().map(|b| {
                        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                        self.string(&Arc::from(hex))
                    }),
                    offset: frame.addr,
                },
                // The symbolizer defers kernel and file frames only.
                _ => RawFrame::Kernel {
                    addr: frame.addr,
                    module: module.as_ref().map(|m| self.string(m)),
                },
            },
        }
    }

    /// What was added since the last take, with `frames` (the symbolizer's
    /// frames numbered since then).
    pub fn take(&mut self, frames: Vec<(u32, DeferredFrame)>) -> RawDelta {
        let frames = frames.iter().map(|(id, f)| (*id, self.frame(f))).collect();
        RawDelta {
            strings: std::mem::take(&mut self.new_strings),
            frames,
            stacks: std::mem::take(&mut self.new_stacks),
            stack_frames: std::mem::take(&mut self.new_stack_frames),
            rows: self.rows.drain().map(|(k, (n, p))| (k, n, p)).collect(),
        }
    }
}

/// One lane of [`SampleCache::key`]: foldhash's folded multiply.
#[inline]
fn fold(h: u64, w: u64, k: u64) -> u64 {
    let p = u128::from(h ^ w) * u128::from(k);
    (p as u64) ^ ((p >> 64) as u64)
}

/// 128 bits of two folded-multiply lanes over `words`, after `head`.
fn fold128(head: impl IntoIterator<Item = u64>, words: impl Iterator<Item = u64>) -> u128 {
    const K1: u64 = 0x243f_6a88_85a3_08d3;
    const K2: u64 = 0x1319_8a2e_0370_7344;
    let (mut a, mut b) = (0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89);
    for w in head.into_iter().chain(words) {
        a = fold(a, w, K1);
        b = fold(b, w.rotate_left(32), K2);
    }
    u128::from(a) << 64 | u128::from(b)
}

/// The key of a chain of frame numbers in [`RawRows::stack`]; two frames
/// to a word.
fn chain_key(chain: &[u32]) -> u128 {
    fold128(
        [chain.len() as u64],
        chain
            .chunks(2)
            .map(|c| u64::from(c[0]) | c.get(1).map_or(0, |&x| u64::from(x) << 32)),
    )
}

/// A sample's (leaf, stack) numbers by a 128-bit hash of (domain, pid,
/// address-space generation, mode, IP, call chain). Unlike
/// `sample_cache::StackCache` it keeps no copy of the chain to compare:
/// under exec churn nearly every sample is new (a new process, new
/// addresses), and copying each chain to compare it later was an
/// allocation per sample that never paid back. Two keys that hash alike
/// would share an entry; at 2^18 entries (`STACK_CACHE_LIMIT`) the chance
/// of that is about 2^-93 per cache.
#[derive(Default)]
pub(crate) struct SampleCache {
    map: GenMap<u128, (u32, u32)>,
}

impl SampleCache {
    /// Move generations for a non-sample record (`Generations::observe`).
    pub fn observe(&mut self, rec: &Record) {
        self.map.observe(rec);
    }

    /// Forget everything.
    pub fn invalidate_all(&mut self) {
        self.map.invalidate_all();
    }

    pub fn key(
        &self,
        domain: &Arc<str>,
        pid: u32,
        mode: CpuMode,
        ip: u64,
        chain: &[(CpuMode, u64)],
    ) -> u128 {
        // The domain is interned: its pointer names it.
        let head = [
            Arc::as_ptr(domain).cast::<u8>() as u64,
            u64::from(pid) | (mode as u64) << 32,
            self.map.generation(pid),
            ip,
            chain.len() as u64,
        ];
        fold128(head, chain.iter().map(|&(m, x)| x ^ (m as u64) << 59))
    }

    pub fn get(&self, key: u128) -> Option<(u32, u32)> {
        self.map.get(&key).copied()
    }

    pub fn insert(&mut self, key: u128, value: (u32, u32)) {
        self.map.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_share_a_number_whatever_their_allocation() {
        let mut r = RawRows::default();
        let a: Arc<str> = "sh".into();
        let b: Arc<str> = "sh".into();
        let c: Arc<str> = "ls".into();
        assert_eq!(r.string(&a), 0);
        assert_eq!(r.string(&b), 0);
        assert_eq!(r.string(&c), 1);
        assert_eq!(r.string(&a), 0);
        r.chain = vec![3, 2, 1];
        assert_eq!(r.stack(), 1);
        r.chain = vec![3, 2];
        assert_eq!(r.stack(), 2);
        r.chain = vec![3, 2, 1];
        assert_eq!(r.stack(), 1);
        let d = r.take(Vec::new());
        assert_eq!(d.strings.len(), 2);
        assert_eq!(d.stacks.len(), 2);
        let d = r.take(Vec::new());
        assert!(d.is_empty());
    }

    #[test]
    fn sample_keys_differ_by_every_part_and_by_generation() {
        let mut c = SampleCache::default();
        let host: Arc<str> = "host".into();
        let vm: Arc<str> = "vm0".into();
        let chain = [
            (CpuMode::Kernel, 0xffff_ffff_8100_0010),
            (CpuMode::User, 0x401000),
        ];
        let k = c.key(&host, 7, CpuMode::Kernel, 0x10, &chain);
        let others = [
            c.key(&vm, 7, CpuMode::Kernel, 0x10, &chain),
            c.key(&host, 8, CpuMode::Kernel, 0x10, &chain),
            c.key(&host, 7, CpuMode::User, 0x10, &chain),
            c.key(&host, 7, CpuMode::Kernel, 0x11, &chain),
            c.key(&host, 7, CpuMode::Kernel, 0x10, &chain[..1]),
            c.key(&host, 7, CpuMode::Kernel, 0x10, &[chain[1], chain[0]]),
        ];
        assert!(others.iter().all(|o| *o != k));
        c.insert(k, (1, 2));
        assert_eq!(c.get(k), Some((1, 2)));
        // An exec in pid 7 moves its generation: the old key is not asked again.
        c.observe(&Record::Comm {
            pid: 7,
            tid: 7,
            comm: "x".into(),
            exec: true,
            time: 0,
        });
        assert_ne!(c.key(&host, 7, CpuMode::Kernel, 0x10, &chain), k);
    }
}
