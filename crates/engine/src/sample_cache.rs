//! Caches of the converter's per-sample path (`Converter::sample_weighted`).
//!
//! - [`StackCache`]: a sample's leaf symbol and collapsed stack text by
//!   (domain, pid, mode, IP, call chain). Symbolizing a call chain costs a
//!   normalization and a symbolizer lookup per frame plus building the text;
//!   a profile repeats the same few thousand chains a million times. An
//!   entry is only valid for the address space it was made in: every record
//!   that changes a process's mappings (mmap, exec, fork into a new
//!   process) moves that pid to a new generation, and kernel module maps move
//!   every pid (the `kernel` generation); entries of older generations are
//!   never answered.
//! - [`RowAggregator`]: aggregation of rows by the identity of their
//!   interned strings (pointers) instead of their text. `Profile::add`
//!   hashes the whole key, stack text included (about a kilobyte with deep
//!   stacks), with SipHash, per sample; here a sample costs a hash of a few
//!   words, and the text is hashed once per distinct row when the delta is
//!   taken. Equal strings behind different pointers only make two rows that
//!   `Profile::add` sums, so identity is safe; the key's `Arc`s are held by
//!   the entry, so no pointer is reused while it is in the map.
//!
//! Keys come from our own normalization of a recording, so a fast
//! non-cryptographic hasher (foldhash) is used.

use foldhash::fast::FixedState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use vmscope_model::{AggKey, CpuMode, Profile};
use vmscope_symbols::Resolved;

type FastMap<K, V> = HashMap<K, V, FixedState>;

/// Entries kept before the cache is emptied (bounds memory).
const STACK_CACHE_LIMIT: usize = 1 << 18;

struct StackEntry {
    domain: Arc<str>,
    pid: u32,
    generation: u64,
    mode: CpuMode,
    ip: u64,
    chain: Box<[(CpuMode, u64)]>,
    leaf: Resolved,
    stack: Arc<str>,
}

/// What a cached sample resolves to.
pub(crate) struct CachedStack {
    pub leaf: Resolved,
    pub stack: Arc<str>,
}

/// The leaf and stack of recently seen samples; see the module docs.
#[derive(Default)]
pub(crate) struct StackCache {
    /// By the hash of the key; a different key under the same hash is a
    /// miss and is replaced.
    entries: FastMap<u64, StackEntry>,
    /// Address-space generation by pid (absent: 0).
    generations: FastMap<u32, u64>,
    /// Last generation handed out.
    epoch: u64,
    /// Generation of the kernel's module maps (part of every key).
    kernel: u64,
}

impl StackCache {
    /// `pid`'s mappings changed: its older entries no longer answer.
    pub fn invalidate_pid(&mut self, pid: u32) {
        self.epoch += 1;
        self.generations.insert(pid, self.epoch);
    }

    /// The kernel's module maps (or anything every process sees) changed.
    pub fn invalidate_all(&mut self) {
        self.epoch += 1;
        self.kernel = self.epoch;
        self.entries.clear();
    }

    fn generation(&self, pid: u32) -> u64 {
        // Both parts only grow, so their sum identifies the pair's state.
        self.generations.get(&pid).copied().unwrap_or(0) + self.kernel
    }

    fn hash(
        domain: &str,
        pid: u32,
        generation: u64,
        mode: CpuMode,
        ip: u64,
        chain: &[(CpuMode, u64)],
    ) -> u64 {
        let mut h = FixedState::default().build_hasher();
        domain.hash(&mut h);
        pid.hash(&mut h);
        generation.hash(&mut h);
        mode.hash(&mut h);
        ip.hash(&mut h);
        chain.len().hash(&mut h);
        for (m, a) in chain {
            m.hash(&mut h);
            a.hash(&mut h);
        }
        h.finish()
    }

    /// The cached leaf and stack of this sample, if any. Returns the key's
    /// hash and generation for [`StackCache::insert`] on a miss.
    pub fn get(
        &self,
        domain: &str,
        pid: u32,
        mode: CpuMode,
        ip: u64,
        chain: &[(CpuMode, u64)],
    ) -> Result<CachedStack, (u64, u64)> {
        let generation = self.generation(pid);
        let h = Self::hash(domain, pid, generation, mode, ip, chain);
        match self.entries.get(&h) {
            Some(e)
                if e.pid == pid
                    && e.generation == generation
                    && e.mode == mode
                    && e.ip == ip
                    && *e.chain == *chain
                    && *e.domain == *domain =>
            {
                Ok(CachedStack {
                    leaf: e.leaf.clone(),
                    stack: e.stack.clone(),
                })
            }
            _ => Err((h, generation)),
        }
    }

    /// Remember a sample's leaf and stack under the `(hash, generation)`
    /// that [`StackCache::get`] returned.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        (h, generation): (u64, u64),
        domain: &Arc<str>,
        pid: u32,
        mode: CpuMode,
        ip: u64,
        chain: &[(CpuMode, u64)],
        leaf: &Resolved,
        stack: &Arc<str>,
    ) {
        if self.entries.len() >= STACK_CACHE_LIMIT {
            self.entries.clear();
        }
        self.entries.insert(
            h,
            StackEntry {
                domain: domain.clone(),
                pid,
                generation,
                mode,
                ip,
                chain: chain.into(),
                leaf: leaf.clone(),
                stack: stack.clone(),
            },
        );
    }
}

/// A row's key by the identity of its strings.
#[derive(PartialEq, Eq, Hash)]
struct RowId {
    event: u32,
    second: u32,
    cpu: u32,
    context: vmscope_model::Context,
    strings: [usize; 6],
}

impl RowId {
    fn of(k: &AggKey) -> RowId {
        let p = |s: &Arc<str>| Arc::as_ptr(s).cast::<u8>() as usize;
        RowId {
            event: k.event,
            second: k.second,
            cpu: k.cpu,
            context: k.context,
            strings: [
                p(&k.domain),
                p(&k.process),
                p(&k.image),
                p(&k.symbol),
                p(&k.stack),
                p(&k.srcline),
            ],
        }
    }
}

/// Rows aggregated by string identity; see the module docs.
#[derive(Default)]
pub(crate) struct RowAggregator {
    rows: FastMap<RowId, (AggKey, u64, u64)>,
}

impl RowAggregator {
    pub fn add(&mut self, key: AggKey, samples: u64, period: u64) {
        match self.rows.entry(RowId::of(&key)) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let v = e.get_mut();
                v.1 += samples;
                v.2 += period;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert((key, samples, period));
            }
        }
    }

    /// Move every row into `delta`.
    pub fn drain_into(&mut self, delta: &mut Profile) {
        for (_, (key, samples, period)) in self.rows.drain() {
            delta.add(key, samples, period);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_model::Context;

    fn key(stack: &Arc<str>, process: &str) -> AggKey {
        AggKey {
            event: 0,
            domain: "host".into(),
            context: Context::HostUser,
            process: process.into(),
            image: "/bin/p".into(),
            symbol: "f".into(),
            stack: stack.clone(),
            srcline: "".into(),
            second: 0,
            cpu: 0,
        }
    }

    #[test]
    fn rows_with_equal_text_behind_other_pointers_sum_up() {
        let s: Arc<str> = "main;f".into();
        let k = key(&s, "p");
        let mut agg = RowAggregator::default();
        agg.add(k.clone(), 1, 10);
        agg.add(k.clone(), 2, 20);
        // Same text, new allocations.
        agg.add(key(&Arc::from("main;f"), "p"), 4, 40);
        agg.add(key(&s, "q"), 8, 80);
        let mut p = Profile::new();
        agg.drain_into(&mut p);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.rows[&k].samples, 7);
        assert_eq!(p.rows[&k].period, 70);
        assert_eq!(p.total_samples, 15);
    }

    #[test]
    fn stack_entries_follow_generations() {
        let mut c = StackCache::default();
        let d: Arc<str> = "host".into();
        let chain = [(CpuMode::User, 0x10), (CpuMode::User, 0x20)];
        let leaf = Resolved::named("/bin/p".into(), "f".into());
        let stack: Arc<str> = "g;f".into();
        let miss = c.get(&d, 1, CpuMode::User, 0x10, &chain).err().unwrap();
        c.insert(miss, &d, 1, CpuMode::User, 0x10, &chain, &leaf, &stack);
        let hit = c.get(&d, 1, CpuMode::User, 0x10, &chain).ok().unwrap();
        assert_eq!(&*hit.stack, "g;f");
        // Another chain, pid or domain misses.
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain[..1]).is_err());
        assert!(c.get(&d, 2, CpuMode::User, 0x10, &chain).is_err());
        assert!(c.get("vm1", 1, CpuMode::User, 0x10, &chain).is_err());
        // Another pid's new mapping keeps it; its own drops it.
        c.invalidate_pid(2);
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_ok());
        c.invalidate_pid(1);
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_err());
        let miss = c.get(&d, 1, CpuMode::User, 0x10, &chain).err().unwrap();
        c.insert(miss, &d, 1, CpuMode::User, 0x10, &chain, &leaf, &stack);
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_ok());
        c.invalidate_all();
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_err());
    }
}
