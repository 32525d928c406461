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
//! - [`StackKeys`]: the same key turned into a number on the thread that
//!   reads the records (import), where the call chain was just written and
//!   is still in that CPU's cache; the converter then finds the sample's
//!   leaf and stack by that number alone ([`KeyedStacks`]) without reading
//!   the chain again on its own CPU. A key's number changes with the pid's
//!   generation, so a number stands for one address space for good.
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
use std::hash::BuildHasher;
use std::sync::Arc;
use vmscope_model::{AggKey, CpuMode, Profile, Record};
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

/// Address-space generations by pid, moved by the records that change an
/// address space (see [`Generations::observe`]).
#[derive(Default)]
pub(crate) struct Generations {
    /// Generation by pid (absent: 0).
    by_pid: FastMap<u32, u64>,
    /// Last generation handed out.
    epoch: u64,
    /// Generation of the kernel's module maps (part of every pid's).
    kernel: u64,
}

impl Generations {
    /// `pid`'s mappings changed.
    pub fn bump_pid(&mut self, pid: u32) {
        self.epoch += 1;
        self.by_pid.insert(pid, self.epoch);
    }

    /// The kernel's module maps (or anything every process sees) changed.
    pub fn bump_all(&mut self) {
        self.epoch += 1;
        self.kernel = self.epoch;
    }

    /// Move generations for a non-sample record: what
    /// `ProcessTable::apply` acts on (exec mmaps, exec comms, forks into a
    /// new process) and kernel mmaps (module ranges). Returns true when it
    /// was a kernel mapping (every pid moved).
    pub fn observe(&mut self, rec: &Record) -> bool {
        match rec {
            Record::Mmap { pid: u32::MAX, .. } => {
                self.bump_all();
                true
            }
            Record::Mmap {
                pid,
                len,
                executable,
                ..
            } if *executable && *len > 0 => {
                self.bump_pid(*pid);
                false
            }
            Record::Comm {
                pid, exec: true, ..
            } => {
                self.bump_pid(*pid);
                false
            }
            Record::Fork { pid, ppid, tid, .. } if pid != ppid && pid == tid => {
                self.bump_pid(*pid);
                false
            }
            _ => false,
        }
    }

    pub fn of(&self, pid: u32) -> u64 {
        // Both parts only grow, so their sum identifies the pair's state.
        self.by_pid.get(&pid).copied().unwrap_or(0) + self.kernel
    }
}

/// The map of a cache of samples whose entries hold only for the address
/// spaces they were made in: callers put the pid's [`Generations`] in
/// their keys, so a record that changes an address space retires that
/// pid's entries, and kernel maps (every pid's) empty it. Emptied too at
/// [`STACK_CACHE_LIMIT`] entries (bounds memory). [`StackCache`],
/// [`StackKeys`] and `raw::SampleCache` keep their entries in one.
pub(crate) struct GenMap<K, V> {
    entries: FastMap<K, V>,
    generations: Generations,
}

impl<K, V> Default for GenMap<K, V> {
    fn default() -> Self {
        GenMap {
            entries: FastMap::default(),
            generations: Generations::default(),
        }
    }
}

impl<K: std::hash::Hash + Eq, V> GenMap<K, V> {
    /// Move generations for a non-sample record ([`Generations::observe`]).
    pub fn observe(&mut self, rec: &Record) {
        if self.generations.observe(rec) {
            self.entries.clear();
        }
    }

    /// Forget everything (the symbolizer may answer differently now).
    pub fn invalidate_all(&mut self) {
        self.generations.bump_all();
        self.entries.clear();
    }

    /// The generation of `pid`'s address space, for keys.
    pub fn generation(&self, pid: u32) -> u64 {
        self.generations.of(pid)
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key)
    }

    pub fn insert(&mut self, key: K, value: V) {
        if self.entries.len() >= STACK_CACHE_LIMIT {
            self.entries.clear();
        }
        self.entries.insert(key, value);
    }
}

/// The leaf and stack of recently seen samples; see the module docs.
#[derive(Default)]
pub(crate) struct StackCache {
    /// By the hash of the key; a different key under the same hash is a
    /// miss and is replaced.
    map: GenMap<u64, StackEntry>,
}

impl StackCache {
    /// Move generations for a non-sample record ([`Generations::observe`]).
    pub fn observe(&mut self, rec: &Record) {
        self.map.observe(rec);
    }

    /// Forget everything (the symbolizer may answer differently now).
    pub fn invalidate_all(&mut self) {
        self.map.invalidate_all();
    }

    fn generation(&self, pid: u32) -> u64 {
        self.map.generation(pid)
    }

    /// A hash of the key for the map, folding the call chain one
    /// multiply per frame (the `Hash` impls of the tuples cost several
    /// hasher calls per frame, per sample); entries are compared in full, so
    /// a collision is only a miss.
    fn hash(
        domain: &str,
        pid: u32,
        generation: u64,
        mode: CpuMode,
        ip: u64,
        chain: &[(CpuMode, u64)],
    ) -> u64 {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let fold = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
        let mut h = FixedState::default().hash_one(domain);
        h = fold(h, u64::from(pid) | (mode as u64) << 32);
        h = fold(h, generation);
        h = fold(h, ip);
        for &(m, a) in chain {
            h = fold(h, a ^ (m as u64) << 59);
        }
        // The low bits pick the bucket: mix the high ones in.
        h ^ (h >> 29)
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
        match self.map.get(&h) {
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
        self.map.insert(
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

#[cfg(feature = "host")]
struct KeyEntry {
    pid: u32,
    generation: u64,
    mode: CpuMode,
    ip: u64,
    /// The chain's words as the file has them, markers included: half the
    /// memory of split frames, compared without splitting, and handed to
    /// the converter with every sample of this key (a reference count, no
    /// copy; it splits the words only to symbolize a new key).
    chain: Arc<[u64]>,
    number: u64,
}

/// Numbers for sample keys, made where records are read; see the module
/// docs. Fed every record in stream order.
#[derive(Default)]
#[cfg(feature = "host")]
pub(crate) struct StackKeys {
    map: GenMap<u64, KeyEntry>,
    next: u64,
}

#[cfg(feature = "host")]
impl StackKeys {
    /// A record other than a sample: moves generations.
    pub fn observe_other(&mut self, rec: &Record) {
        self.map.observe(rec);
    }

    /// The number of a sample's key (its call chain as the file has it) and
    /// the chain's words, shared.
    pub fn sample(
        &mut self,
        s: &vmscope_model::SampleRecord,
        chain: vmscope_model::RawChain<'_>,
    ) -> (u64, Arc<[u64]>) {
        let generation = self.map.generation(s.pid);
        let h = Self::hash(s.pid, generation, s.mode, s.ip, chain);
        if let Some(e) = self.map.get(&h) {
            if e.pid == s.pid
                && e.generation == generation
                && e.mode == s.mode
                && e.ip == s.ip
                && chain.eq_words(&e.chain)
            {
                return (e.number, e.chain.clone());
            }
        }
        self.next += 1;
        let words: Arc<[u64]> = chain.words().collect();
        self.map.insert(
            h,
            KeyEntry {
                pid: s.pid,
                generation,
                mode: s.mode,
                ip: s.ip,
                chain: words.clone(),
                number: self.next,
            },
        );
        (self.next, words)
    }

    /// [`StackCache::hash`] of raw words (markers folded in like frames:
    /// equal words give equal frames, and entries are compared in full).
    fn hash(
        pid: u32,
        generation: u64,
        mode: CpuMode,
        ip: u64,
        chain: vmscope_model::RawChain<'_>,
    ) -> u64 {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let fold = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
        let mut h = fold(u64::from(pid) | (mode as u64) << 32, generation);
        h = fold(h, ip);
        for w in chain.words() {
            h = fold(h, w);
        }
        h ^ (h >> 29)
    }
}

pub(crate) struct KeyedEntry {
    domain: Arc<str>,
    /// The leaf image's class for attribution (`Kernel`, `Anon` or
    /// `Unknown` for the rest).
    class: vmscope_model::ImageRef,
    pub leaf: Resolved,
    pub stack: Arc<str>,
}

/// Leaf and stack by key number ([`StackKeys`]) and domain. Numbers are
/// handed out in order and first seen here in that order, so entries sit in
/// a vector at `number - base`: one memory access per sample instead of a
/// hash table's probe.
#[derive(Default)]
pub(crate) struct KeyedStacks {
    entries: Vec<Option<KeyedEntry>>,
    /// Number of `entries[0]`.
    base: u64,
}

impl KeyedStacks {
    /// `domain` is interned: compared by pointer.
    pub fn get_ref(&self, number: u64, domain: &Arc<str>) -> Option<&KeyedEntry> {
        let i = usize::try_from(number.checked_sub(self.base)?).ok()?;
        let e = self.entries.get(i)?.as_ref()?;
        Arc::ptr_eq(&e.domain, domain).then_some(e)
    }

    /// The leaf image class of a number's entry, whatever its domain.
    pub fn leaf_class(&self, number: u64) -> Option<vmscope_model::ImageRef> {
        let i = usize::try_from(number.checked_sub(self.base)?).ok()?;
        Some(self.entries.get(i)?.as_ref()?.class.clone())
    }

    pub fn insert(
        &mut self,
        number: u64,
        domain: &Arc<str>,
        class: vmscope_model::ImageRef,
        leaf: &Resolved,
        stack: &Arc<str>,
    ) {
        let Some(i) = number
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
        else {
            // Older than the last reset: resolved again when it recurs.
            return;
        };
        if i >= STACK_CACHE_LIMIT {
            self.entries.clear();
            self.base = number;
            return self.insert(number, domain, class, leaf, stack);
        }
        if i >= self.entries.len() {
            self.entries.resize_with(i + 1, || None);
        }
        self.entries[i] = Some(KeyedEntry {
            domain: domain.clone(),
            class,
            leaf: leaf.clone(),
            stack: stack.clone(),
        });
    }

    pub fn clear(&mut self) {
        self.base += self.entries.len() as u64;
        self.entries.clear();
    }
}

/// A row's key by the identity of its strings.
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct RowId {
    event: u32,
    second: u32,
    cpu: u32,
    context: vmscope_model::Context,
    strings: [usize; 6],
}

impl RowId {
    /// From a key's parts; `strings` in [`AggKey`]'s order: domain,
    /// process, image, symbol, stack, srcline.
    pub fn new(
        event: u32,
        second: u32,
        cpu: u32,
        context: vmscope_model::Context,
        strings: [&Arc<str>; 6],
    ) -> RowId {
        RowId {
            event,
            second,
            cpu,
            context,
            strings: strings.map(|s| Arc::as_ptr(s).cast::<u8>() as usize),
        }
    }

    fn of(k: &AggKey) -> RowId {
        RowId::new(
            k.event,
            k.second,
            k.cpu,
            k.context,
            [
                &k.domain, &k.process, &k.image, &k.symbol, &k.stack, &k.srcline,
            ],
        )
    }
}

/// Rows aggregated by string identity; see the module docs.
#[derive(Default)]
pub(crate) struct RowAggregator {
    rows: FastMap<RowId, (AggKey, u64, u64)>,
}

impl RowAggregator {
    pub fn add(&mut self, key: AggKey, samples: u64, period: u64) {
        self.add_with(RowId::of(&key), samples, period, || key);
    }

    /// [`RowAggregator::add`] for a row known by its id; `key` makes its
    /// key when the row is new. The id must be that of the key.
    pub fn add_with(&mut self, id: RowId, samples: u64, period: u64, key: impl FnOnce() -> AggKey) {
        match self.rows.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let v = e.get_mut();
                v.1 += samples;
                v.2 += period;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert((key(), samples, period));
            }
        }
    }

    /// Everything, leaving this empty.
    #[cfg_attr(not(feature = "host"), allow(dead_code))]
    pub fn take(&mut self) -> RowAggregator {
        std::mem::take(self)
    }

    /// The rows, in no order; keys may repeat (equal texts behind other
    /// pointers).
    #[cfg_attr(not(feature = "host"), allow(dead_code))]
    pub fn into_rows(self) -> Vec<(AggKey, u64, u64)> {
        self.rows.into_values().collect()
    }

    /// Move every row into `delta`.
    pub fn drain_into(&mut self, delta: &mut Profile) {
        delta.rows.reserve(self.rows.len());
        for (_, (key, samples, period)) in self.rows.drain() {
            delta.add(key, samples, period);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_model::{Context, ImageRef};

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

    fn exec_mmap(pid: u32) -> Record {
        Record::Mmap {
            pid,
            tid: pid,
            start: 0x1000,
            len: 0x1000,
            pgoff: 0,
            path: "/bin/x".into(),
            build_id: None,
            executable: true,
            time: 0,
        }
    }

    fn sample(pid: u32, chain: &[(CpuMode, u64)]) -> Record {
        Record::Sample(vmscope_model::SampleRecord {
            event: 0,
            ip: chain[0].1,
            pid,
            tid: pid,
            cpu: 0,
            time: 0,
            mode: CpuMode::User,
            period: 1,
            callchain: chain.to_vec(),
        })
    }

    /// What import's reader hands `StackKeys`: the sample and its chain's
    /// words (no markers here: user frames).
    #[cfg(feature = "host")]
    struct Keys(StackKeys);

    #[cfg(feature = "host")]
    impl Keys {
        fn observe(&mut self, rec: &Record) -> Option<u64> {
            match rec {
                Record::Sample(s) => {
                    let bytes: Vec<u8> = s
                        .callchain
                        .iter()
                        .flat_map(|(_, a)| a.to_le_bytes())
                        .collect();
                    let (n, words) = self
                        .0
                        .sample(s, vmscope_model::RawChain::new(&bytes, false));
                    assert_eq!(words.len(), s.callchain.len());
                    Some(n)
                }
                other => {
                    self.0.observe_other(other);
                    None
                }
            }
        }
    }

    #[test]
    #[cfg(feature = "host")]
    fn key_numbers_change_with_the_address_space() {
        let mut k = Keys(StackKeys::default());
        let chain = [(CpuMode::User, 0x10), (CpuMode::User, 0x20)];
        let a = k.observe(&sample(1, &chain)).unwrap();
        assert_eq!(k.observe(&sample(1, &chain)), Some(a));
        let b = k.observe(&sample(1, &chain[..1])).unwrap();
        let c = k.observe(&sample(2, &chain)).unwrap();
        assert!(a != b && b != c && a != c);
        // Non-samples get no number; another pid's mmap keeps pid 1's.
        assert_eq!(k.observe(&exec_mmap(2)), None);
        assert_eq!(k.observe(&sample(1, &chain)), Some(a));
        assert_ne!(k.observe(&sample(2, &chain)), Some(c));
        // Its own mmap, exec or a kernel map renumbers it.
        k.observe(&exec_mmap(1));
        let a2 = k.observe(&sample(1, &chain)).unwrap();
        assert_ne!(a2, a);
        k.observe(&Record::Comm {
            pid: 1,
            tid: 1,
            comm: "x".into(),
            exec: true,
            time: 0,
        });
        let a3 = k.observe(&sample(1, &chain)).unwrap();
        assert_ne!(a3, a2);
        let Record::Mmap {
            tid,
            start,
            len,
            pgoff,
            path,
            build_id,
            executable,
            time,
            ..
        } = exec_mmap(0)
        else {
            unreachable!()
        };
        k.observe(&Record::Mmap {
            pid: u32::MAX,
            tid,
            start,
            len,
            pgoff,
            path,
            build_id,
            executable,
            time,
        });
        assert_ne!(k.observe(&sample(1, &chain)), Some(a3));
    }

    #[test]
    fn keyed_entries_by_number_and_domain() {
        let mut k = KeyedStacks::default();
        let host: Arc<str> = "host".into();
        let vm: Arc<str> = "vm1".into();
        let leaf = Resolved::named("/bin/p".into(), "f".into());
        let stack: Arc<str> = "g;f".into();
        k.insert(1, &host, ImageRef::Unknown, &leaf, &stack);
        k.insert(3, &host, ImageRef::Unknown, &leaf, &stack);
        assert!(k.get_ref(1, &host).is_some());
        assert!(k.get_ref(2, &host).is_none());
        assert!(k.get_ref(3, &host).is_some());
        assert!(k.get_ref(4, &host).is_none());
        // Another domain, or an equal text behind another pointer, misses.
        assert!(k.get_ref(1, &vm).is_none());
        assert!(k.get_ref(1, &Arc::from("host")).is_none());
        k.clear();
        assert!(k.get_ref(1, &host).is_none());
        k.insert(1, &host, ImageRef::Unknown, &leaf, &stack);
        assert!(k.get_ref(1, &host).is_none());
        k.insert(5, &host, ImageRef::Kernel, &leaf, &stack);
        assert!(k.get_ref(5, &host).is_some());
        assert_eq!(k.leaf_class(5), Some(ImageRef::Kernel));
        // Past the limit the window moves on.
        let far = 5 + STACK_CACHE_LIMIT as u64;
        k.insert(far, &host, ImageRef::Unknown, &leaf, &stack);
        assert!(k.get_ref(far, &host).is_some());
        assert!(k.get_ref(5, &host).is_none());
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
        c.observe(&exec_mmap(2));
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_ok());
        c.observe(&exec_mmap(1));
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_err());
        let miss = c.get(&d, 1, CpuMode::User, 0x10, &chain).err().unwrap();
        c.insert(miss, &d, 1, CpuMode::User, 0x10, &chain, &leaf, &stack);
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_ok());
        c.invalidate_all();
        assert!(c.get(&d, 1, CpuMode::User, 0x10, &chain).is_err());
    }
}
