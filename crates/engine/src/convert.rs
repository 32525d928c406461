//! The converter: records in, aggregated profile deltas out.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use vmscope_model::{
    attribute, AggKey, Attribution, CpuMode, FastMap, ImageRef, NormalizedFrame, ProcessTable,
    Profile, RawDelta, RawRowKey, Record, SampleRecord, ThreadMap, NO_STACK,
};
use vmscope_symbols::{Resolved, Symbolizer};

use crate::raw::RawRows;
use crate::sample_cache::{KeyedStacks, RowAggregator, RowId, StackCache};

/// Counters of what the converter saw.
#[derive(Debug, Clone, Default)]
pub struct ConverterStats {
    pub samples: u64,
    pub lost: u64,
    pub guest_mode_samples: u64,
    pub first_time: Option<u64>,
    pub last_time: Option<u64>,
    /// Samples per (domain) for the session's domain list.
    pub domains: HashMap<Arc<str>, u64, vmscope_model::ProfileHasher>,
    /// Guest time the host measured per (VM, event): sum of periods of its
    /// guest, guest-user and guest-kernel samples.
    pub guest_period: HashMap<(Arc<str>, u32), u64>,
}

/// What makes two samples of one batch the same for conversion.
#[derive(Hash, PartialEq, Eq)]
struct BatchKey {
    event: u32,
    pid: u32,
    tid: u32,
    mode: CpuMode,
    ip: u64,
    second: u64,
    cpu: u32,
    chain: Vec<(CpuMode, u64)>,
}

/// Add `n` samples to a domain's count; the name is cloned (an atomic
/// operation, and one more to drop it) only the first time.
fn count_domain(
    counts: &mut HashMap<Arc<str>, u64, vmscope_model::ProfileHasher>,
    domain: &Arc<str>,
    n: u64,
) {
    match counts.get_mut(domain) {
        Some(c) => *c += n,
        None => {
            counts.insert(domain.clone(), n);
        }
    }
}

/// What [`attribute`] looks at in a leaf's image: kernel, anonymous, or
/// anything else (as `Unknown`); no `Arc` to clone.
fn image_class(image: &ImageRef) -> ImageRef {
    match image {
        ImageRef::Kernel => ImageRef::Kernel,
        ImageRef::Anon => ImageRef::Anon,
        _ => ImageRef::Unknown,
    }
}

fn class_index(class: &ImageRef) -> u8 {
    match class {
        ImageRef::Kernel => 0,
        ImageRef::Anon => 1,
        _ => 2,
    }
}

/// Rows of a delta not yet added to its [`Profile`] (import only: the
/// agent builds the converter without the `host` feature).
#[cfg(feature = "host")]
pub(crate) struct PendingRows(RowAggregator);

#[cfg(feature = "host")]
impl PendingRows {
    /// The rows; keys may repeat (see `SessionWriter::flush_with_rows`).
    pub fn into_rows(self) -> Vec<(AggKey, u64, u64)> {
        self.0.into_rows()
    }
}

/// Turns a record stream into profile deltas.
pub struct Converter {
    procs: ProcessTable,
    threads: ThreadMap,
    symbolizer: Symbolizer,
    delta: Profile,
    stats: ConverterStats,
    /// Time origin for per-second bins (ns, the collector's clock).
    origin: Option<u64>,
    frame_text: Vec<Arc<str>>,
    stack_text: String,
    /// Guest kallsyms text for guest domains nobody registered symbols for.
    default_guest_kallsyms: Option<String>,
    guest_domains: std::collections::HashSet<Arc<str>>,
    unmonitored: std::collections::HashSet<Arc<str>>,
    /// Leaf and stack of recent samples (crate::sample_cache).
    stacks: StackCache,
    /// Rows of integers when the symbolizer defers (crate::raw): samples
    /// go there instead of `rows`.
    raw: Option<RawRows>,
    /// Call chain vectors of converted batch samples, kept for the
    /// decoder to reuse ([`Converter::take_spent_chains`]) when asked.
    spent: Option<Vec<Vec<(CpuMode, u64)>>>,
    /// Leaf and stack by the numbers import's reader gave samples.
    keyed: KeyedStacks,
    /// Rows of `delta` not yet added to it, by string identity.
    rows: RowAggregator,
    /// Interned domain names: attribution allocates one per sample, and
    /// `rows` aggregates by pointer.
    domain_names: Vec<Arc<str>>,
    /// Stack texts made so far (interned).
    stack_texts: std::collections::HashSet<Arc<str>, foldhash::fast::FixedState>,
    /// Attributions by (pid, tid, mode, leaf image class).
    attributions: HashMap<(u32, u32, CpuMode, u8), Attribution, foldhash::fast::FixedState>,
    /// Process names by (pid, tid), emptied by every COMM and FORK record:
    /// one lookup per sample, and the same `Arc` for a thread's samples
    /// (some names are made per call: `swapper`, `:PID`).
    process_names: HashMap<u64, Arc<str>, foldhash::fast::FixedState>,
    /// Shared texts of rows: the empty stack or srcline, `[unmonitored]`.
    empty: Arc<str>,
    unmonitored_label: Arc<str>,
}

/// The frame of a call chain's `i`-th address (the sampled end is 0):
/// return addresses point after the call, so for every user frame but the
/// first `ip - 1` is looked up and the caller's own function is found
/// (not the next one).
fn chain_frame(
    procs: &ProcessTable,
    pid: u32,
    i: usize,
    mode: CpuMode,
    ip: u64,
) -> NormalizedFrame {
    let addr = if i > 0 && !mode.is_kernel() {
        ip.saturating_sub(1)
    } else {
        ip
    };
    procs.normalize(pid, addr, mode)
}

/// `[name]` for a kernel module map path, as perf shows it
/// (`/lib/modules/…/ath9k.ko` → `[ath9k]`); `None` for the kernel itself.
fn module_image(path: &str) -> Option<Arc<str>> {
    if path.starts_with("[kernel.kallsyms]") || path.starts_with("[guest.kernel") {
        return None;
    }
    if path.starts_with('[') {
        return Some(path.into());
    }
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = base
        .strip_suffix(".ko")
        .or_else(|| base.strip_suffix(".ko.xz"))
        .or_else(|| base.strip_suffix(".ko.zst"))
        .or_else(|| base.strip_suffix(".ko.gz"))?;
    Some(format!("[{}]", stem.replace('-', "_")).into())
}

impl Converter {
    /// A converter; a deferring symbolizer ([`Symbolizer::deferred`])
    /// makes it keep rows of numbers ([`Converter::take_raw`]).
    pub fn new(symbolizer: Symbolizer, threads: ThreadMap) -> Converter {
        Converter {
            raw: symbolizer.is_deferred().then(RawRows::default),
            spent: None,
            procs: ProcessTable::new(),
            threads,
            symbolizer,
            delta: Profile::new(),
            stats: ConverterStats::default(),
            origin: None,
            frame_text: Vec::with_capacity(64),
            stack_text: String::with_capacity(1024),
            default_guest_kallsyms: None,
            guest_domains: Default::default(),
            unmonitored: Default::default(),
            stacks: StackCache::default(),
            keyed: KeyedStacks::default(),
            rows: RowAggregator::default(),
            domain_names: Vec::new(),
            attributions: Default::default(),
            stack_texts: Default::default(),
            process_names: Default::default(),
            empty: Arc::from(""),
            unmonitored_label: Arc::from("[unmonitored]"),
        }
    }

    /// The per-second bin a sample of this time falls in (`None` before
    /// the first sample sets the origin).
    #[cfg(feature = "host")]
    pub(crate) fn second_of(&self, time: u64) -> Option<u64> {
        self.origin.map(|o| time.saturating_sub(o) / 1_000_000_000)
    }

    /// Set the time origin of per-second bins (else the first sample's time).
    pub fn set_origin(&mut self, t: u64) {
        self.origin = Some(t);
    }

    /// A VM found after the converter started: its process and threads
    /// are the VM's from now on (samples already converted stay where
    /// they were attributed).
    pub fn add_vm(
        &mut self,
        name: &str,
        pid: u32,
        tcg: bool,
        threads: impl IntoIterator<Item = (u32, vmscope_model::ThreadRole)>,
    ) {
        self.threads.add_vm_threads(name, pid, tcg, threads);
        // Cached attributions were made with the old map.
        self.attributions.clear();
    }

    /// Count this VM's samples as one line, unresolved (role unmonitored).
    pub fn set_unmonitored(&mut self, domain: &str) {
        self.unmonitored.insert(domain.into());
    }

    /// Resolve guest-kernel samples of every VM without its own symbols
    /// with this kallsyms text (`import --guest-kallsyms`).
    pub fn set_default_guest_kallsyms(&mut self, text: String) {
        self.default_guest_kallsyms = Some(text);
    }

    /// The symbolizer, e.g. to add a VM's kallsyms: what it answers may
    /// change, so cached stacks are dropped.
    pub fn symbolizer_mut(&mut self) -> &mut Symbolizer {
        self.stacks.invalidate_all();
        if let Some(r) = &mut self.raw {
            r.cache.invalidate_all();
        }
        self.keyed.clear();
        &mut self.symbolizer
    }

    pub fn stats(&self) -> &ConverterStats {
        &self.stats
    }

    /// The name a thread has in the process table (tests of the records
    /// that reach the converter).
    #[cfg(test)]
    pub(crate) fn comm(&self, pid: u32, tid: u32) -> Arc<str> {
        self.procs.comm(pid, tid)
    }

    /// Take what accumulated since the last call.
    pub fn take_delta(&mut self) -> Profile {
        self.rows.drain_into(&mut self.delta);
        self.delta.take()
    }

    /// [`Converter::take_delta`] with the rows still apart, for
    /// `SessionWriter::flush_with_rows` (import).
    #[cfg(feature = "host")]
    pub(crate) fn take_delta_parts(&mut self) -> (Profile, PendingRows) {
        (self.delta.take(), PendingRows(self.rows.take()))
    }

    pub fn push(&mut self, rec: Record) {
        self.push_keyed(&rec, None);
    }

    /// A sample as import reads it: its call chain's raw words (markers
    /// included; the record's own `callchain` is not read) and the number
    /// `sample_cache::StackKeys` gave its key.
    #[cfg(feature = "host")]
    pub(crate) fn push_raw_sample(&mut self, s: &SampleRecord, key: u64, chain: &[u64]) {
        self.sample_weighted(s, 1, s.period.max(1), Some(key), Some(chain));
    }

    /// [`Converter::push`] of a borrowed record (the caller drops it, e.g.
    /// on the thread that allocated it), with the number
    /// `sample_cache::StackKeys` gave a sample (`None`: look its stack up by
    /// the chain itself).
    pub(crate) fn push_keyed(&mut self, rec: &Record, key: Option<u64>) {
        match rec {
            Record::Sample(s) => self.sample_weighted(s, 1, s.period.max(1), key, None),
            Record::Lost { count, .. } => {
                // Ring losses are shared by every event of that CPU's ring;
                // they are booked on the first event.
                self.stats.lost += count;
                self.delta.add_lost(0, *count);
            }
            Record::Mmap {
                pid: u32::MAX,
                start,
                len,
                path,
                ..
            } => {
                // The image of kernel IPs that kallsyms cannot name (files
                // from other machines).
                if let Some(name) = module_image(path) {
                    self.symbolizer
                        .add_kernel_module(*start, start.saturating_add(*len), name);
                }
                self.stacks.observe(rec);
                if let Some(r) = &mut self.raw {
                    r.cache.observe(rec);
                }
            }
            Record::Ksymbol {
                addr,
                len,
                name,
                bpf,
                unregister,
                ..
            } => {
                // Through symbolizer_mut: stacks cached with this range's
                // old name are dropped.
                self.symbolizer_mut()
                    .kernel_symbol(*addr, *len, name, *bpf, *unregister);
            }
            other => {
                // Records that change an address space (what
                // ProcessTable::apply acts on) retire its cached stacks.
                self.stacks.observe(other);
                if let Some(r) = &mut self.raw {
                    r.cache.observe(other);
                }
                if matches!(other, Record::Comm { .. } | Record::Fork { .. }) {
                    self.process_names.clear();
                }
                self.procs.apply(other);
            }
        }
    }

    fn resolve(&mut self, domain: &str, frame: &NormalizedFrame) -> Resolved {
        self.symbolizer.resolve(domain, frame)
    }

    /// What accumulated since the last call when symbolization is deferred
    /// (empty otherwise): the rows of numbers, with the strings, frames and
    /// stacks first numbered since. The session must store it with the
    /// [`Converter::take_delta`] of the same moment.
    pub fn take_raw(&mut self) -> RawDelta {
        match &mut self.raw {
            Some(r) => r.take(self.symbolizer.take_new_deferred()),
            None => RawDelta::default(),
        }
    }

    /// A sample's row when symbolization is deferred (crate::raw): its
    /// leaf and call chain as frame numbers, cached like `stacks`.
    #[allow(clippy::too_many_arguments)]
    fn add_raw_row(
        &mut self,
        s: &SampleRecord,
        n: u64,
        period: u64,
        raw: Option<&[u64]>,
        attr: &Attribution,
        process: &Arc<str>,
        second: u32,
        leaf: Option<NormalizedFrame>,
    ) {
        let rr = self.raw.as_mut().expect("a deferring converter");
        let chain = &*sample_chain(s, raw);
        let cache_key = rr.cache.key(&attr.domain, s.pid, s.mode, s.ip, chain);
        let cached = rr.cache.get(cache_key);
        let (leaf_id, stack_id) = if let Some(v) = cached {
            v
        } else {
            let leaf = leaf.unwrap_or_else(|| self.procs.normalize(s.pid, s.ip, s.mode));
            let leaf_id = self.symbolizer.defer_frame(&attr.domain, &leaf);
            rr.chain.clear();
            for (i, &(mode, ip)) in chain.iter().enumerate() {
                let f = chain_frame(&self.procs, s.pid, i, mode, ip);
                rr.chain.push(self.symbolizer.defer_frame(&attr.domain, &f));
            }
            let stack_id = if chain.is_empty() {
                NO_STACK
            } else {
                rr.stack()
            };
            rr.cache.insert(cache_key, (leaf_id, stack_id));
            (leaf_id, stack_id)
        };
        let key = RawRowKey {
            second,
            cpu: s.cpu,
            event: s.event,
            context: attr.context,
            domain: rr.string(&attr.domain),
            process: rr.string(process),
            leaf: leaf_id,
            stack: stack_id,
        };
        rr.add(key, n, period);
    }

    /// Push a batch of records (one ring read). Samples that share event,
    /// thread, mode, call chain and second are converted once, with their
    /// count and period sum: the work per sample becomes one hash instead of
    /// normalization, attribution, symbolization and aggregation. Pending
    /// samples are converted before any other record is applied, so mmaps,
    /// execs and exits keep their order relative to samples.
    pub fn push_batch(&mut self, records: impl IntoIterator<Item = Record>) {
        if self.raw.is_some() {
            // Deferring, a sample seen before is a hash of its chain and a
            // few lookups (crate::raw): grouping the batch first hashes
            // each chain as often, and under exec churn groups nothing
            // (10 % more recorder CPU there, measured both ways).
            for r in records {
                match r {
                    Record::Sample(s) => {
                        self.sample_weighted(&s, 1, s.period.max(1), None, None);
                        if let Some(spent) = &mut self.spent {
                            if s.callchain.capacity() > 0 {
                                spent.push(s.callchain);
                            }
                        }
                    }
                    other => self.push(other),
                }
            }
            return;
        }
        let records = records.into_iter();
        let mut pending: FastMap<BatchKey, (SampleRecord, u64, u64)> =
            FastMap::with_capacity_and_hasher(records.size_hint().0, Default::default());
        for r in records {
            match r {
                Record::Sample(mut s) => {
                    let origin = *self.origin.get_or_insert(s.time);
                    // The chain moves into the key (and back into the
                    // record in `flush_batch`): no copy per sample.
                    let key = BatchKey {
                        event: s.event,
                        pid: s.pid,
                        tid: s.tid,
                        mode: s.mode,
                        ip: s.ip,
                        second: s.time.saturating_sub(origin) / 1_000_000_000,
                        cpu: s.cpu,
                        chain: std::mem::take(&mut s.callchain),
                    };
                    let period = s.period.max(1);
                    match pending.get_mut(&key) {
                        Some(e) => {
                            e.1 += 1;
                            e.2 += period;
                            e.0.time = e.0.time.min(s.time);
                        }
                        None => {
                            pending.insert(key, (s, 1, period));
                        }
                    }
                }
                other => {
                    self.flush_batch(&mut pending);
                    self.push(other);
                }
            }
        }
        self.flush_batch(&mut pending);
    }

    fn flush_batch(&mut self, pending: &mut FastMap<BatchKey, (SampleRecord, u64, u64)>) {
        for (key, (mut s, n, period)) in pending.drain() {
            s.callchain = key.chain;
            self.sample_weighted(&s, n, period, None, None);
            if let Some(spent) = &mut self.spent {
                if s.callchain.capacity() > 0 {
                    spent.push(s.callchain);
                }
            }
        }
    }

    /// Keep the call chain vectors of batch samples once converted, for
    /// [`Converter::take_spent_chains`] (the recorder's converter thread
    /// hands them back to its record decoder, `RecordStream::recycle`).
    pub fn keep_spent_chains(&mut self) {
        self.spent.get_or_insert_with(Vec::new);
    }

    /// The chain vectors kept since the last call.
    pub fn take_spent_chains(&mut self) -> Vec<Vec<(CpuMode, u64)>> {
        self.spent.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// `raw`: the call chain as perf wrote it, instead of `s.callchain`.
    fn sample_weighted(
        &mut self,
        s: &SampleRecord,
        n: u64,
        period: u64,
        key: Option<u64>,
        raw: Option<&[u64]>,
    ) {
        let st = &mut self.stats;
        st.samples += n;
        st.first_time = Some(st.first_time.map_or(s.time, |t| t.min(s.time)));
        st.last_time = Some(st.last_time.map_or(s.time, |t| t.max(s.time)));
        if matches!(s.mode, CpuMode::GuestKernel | CpuMode::GuestUser) {
            st.guest_mode_samples += n;
        }
        let origin = *self.origin.get_or_insert(s.time);

        // A numbered sample seen before knows its leaf's image class, all
        // that attribution needs; the leaf itself is normalized only for
        // resolving (below).
        let known_class = key.and_then(|k| self.keyed.leaf_class(k));
        let leaf = match known_class {
            Some(_) => None,
            None => Some(self.procs.normalize(s.pid, s.ip, s.mode)),
        };
        let class = match (&known_class, &leaf) {
            (Some(c), _) => c.clone(),
            (None, Some(l)) => image_class(&l.image),
            (None, None) => ImageRef::Unknown,
        };
        let attr = self.attribution(s.pid, s.tid, s.mode, &class);
        if attr.context.is_guest() && !self.guest_domains.contains(&attr.domain) {
            self.guest_domains.insert(attr.domain.clone());
            if let Some(text) = &self.default_guest_kallsyms {
                if let Ok(k) = vmscope_symbols::Kallsyms::parse(text) {
                    self.symbolizer.add_guest_kallsyms(&attr.domain, k);
                }
            }
        }
        if !self.unmonitored.is_empty() && self.unmonitored.contains(&attr.domain) {
            let label = self.unmonitored_label.clone();
            count_domain(&mut self.stats.domains, &attr.domain, n);
            let second = (s.time.saturating_sub(origin) / 1_000_000_000) as u32;
            self.delta
                .add_bin(second, s.event, attr.domain.clone(), attr.context, n);
            let key = AggKey {
                event: s.event,
                domain: attr.domain,
                context: attr.context,
                process: label.clone(),
                image: label.clone(),
                symbol: label,
                stack: self.empty.clone(),
                srcline: self.empty.clone(),
                second,
                cpu: s.cpu,
            };
            self.rows.add(key, n, period);
            return;
        }
        count_domain(&mut self.stats.domains, &attr.domain, n);
        if attr.context.is_guest() {
            *self
                .stats
                .guest_period
                .entry((attr.domain.clone(), s.event))
                .or_default() += period;
        }
        let second = (s.time.saturating_sub(origin) / 1_000_000_000) as u32;
        self.delta
            .add_bin(second, s.event, attr.domain.clone(), attr.context, n);
        let process = self.process_name(s.pid, s.tid);
        if self.raw.is_some() {
            self.add_raw_row(s, n, period, raw, &attr, &process, second, leaf);
            return;
        }
        // A numbered sample seen before adds to its row without building a
        // key (each Arc clone is an atomic operation).
        if let Some(e) = key.and_then(|k| self.keyed.get_ref(k, &attr.domain)) {
            let id = RowId::new(
                s.event,
                second,
                s.cpu,
                attr.context,
                [
                    &attr.domain,
                    &process,
                    &e.leaf.image,
                    &e.leaf.symbol,
                    &e.stack,
                    &e.leaf.srcline,
                ],
            );
            self.rows.add_with(id, n, period, || AggKey {
                event: s.event,
                domain: attr.domain.clone(),
                context: attr.context,
                process: process.clone(),
                image: e.leaf.image.clone(),
                symbol: e.leaf.symbol.clone(),
                stack: e.stack.clone(),
                srcline: e.leaf.srcline.clone(),
                second,
                cpu: s.cpu,
            });
            return;
        }
        let cached = match key {
            Some(_) => Err(None),
            None => self
                .stacks
                .get(&attr.domain, s.pid, s.mode, s.ip, &s.callchain)
                .map_err(Some),
        };
        let (resolved, stack) = match cached {
            Ok(c) => (c.leaf, c.stack),
            Err(None) => {
                let leaf = leaf.unwrap_or_else(|| self.procs.normalize(s.pid, s.ip, s.mode));
                let (resolved, stack) = self.resolve_stack(&attr.domain, s, raw, &leaf);
                if let Some(k) = key {
                    self.keyed
                        .insert(k, &attr.domain, image_class(&leaf.image), &resolved, &stack);
                }
                (resolved, stack)
            }
            Err(Some(miss)) => {
                let leaf = leaf.unwrap_or_else(|| self.procs.normalize(s.pid, s.ip, s.mode));
                let (resolved, stack) = self.resolve_stack(&attr.domain, s, raw, &leaf);
                self.stacks.insert(
                    miss,
                    &attr.domain,
                    s.pid,
                    s.mode,
                    s.ip,
                    &s.callchain,
                    &resolved,
                    &stack,
                );
                (resolved, stack)
            }
        };
        let key = AggKey {
            event: s.event,
            domain: attr.domain,
            context: attr.context,
            process,
            image: resolved.image,
            symbol: resolved.symbol,
            stack,
            srcline: resolved.srcline,
            second,
            cpu: s.cpu,
        };
        self.rows.add(key, n, period);
    }

    /// Attribution of a sample (pure in its arguments: the thread map does
    /// not change), cached, with the domain interned.
    fn attribution(&mut self, pid: u32, tid: u32, mode: CpuMode, class: &ImageRef) -> Attribution {
        let key = (pid, tid, mode, class_index(class));
        if let Some(a) = self.attributions.get(&key) {
            return a.clone();
        }
        let mut attr = attribute(&self.threads, pid, tid, mode, class);
        match self
            .domain_names
            .iter()
            .find(|d| d.len() == attr.domain.len() && **d == attr.domain)
        {
            Some(d) => attr.domain = d.clone(),
            None => self.domain_names.push(attr.domain.clone()),
        }
        if self.attributions.len() >= 1 << 16 {
            self.attributions.clear();
        }
        self.attributions.insert(key, attr.clone());
        attr
    }

    /// The thread's name, as perf's `comm` (QEMU's `CPU 0/TCG`, a
    /// browser's `Compositor`), else its process's; interned.
    fn process_name(&mut self, pid: u32, tid: u32) -> Arc<str> {
        let id = u64::from(pid) << 32 | u64::from(tid);
        if let Some(n) = self.process_names.get(&id) {
            return n.clone();
        }
        let name = self
            .procs
            .thread_comm(tid)
            .unwrap_or_else(|| self.procs.comm(pid, tid));
        if self.process_names.len() >= 1 << 16 {
            self.process_names.clear();
        }
        self.process_names.insert(id, name.clone());
        name
    }

    /// The leaf's symbol and the collapsed stack (root first) of a sample.
    fn resolve_stack(
        &mut self,
        domain: &str,
        s: &SampleRecord,
        raw: Option<&[u64]>,
        leaf: &NormalizedFrame,
    ) -> (Resolved, Arc<str>) {
        let resolved = self.resolve(domain, leaf);
        let chain = &*sample_chain(s, raw);
        let stack: Arc<str> = if chain.is_empty() {
            self.empty.clone()
        } else {
            self.frame_text.clear();
            for (i, &(mode, ip)) in chain.iter().enumerate() {
                let f = chain_frame(&self.procs, s.pid, i, mode, ip);
                let r = self.resolve(domain, &f);
                // Functions inlined at this address go above it (leaf first
                // here, reversed below).
                if let Some(inl) = &r.inlined {
                    self.frame_text.extend(inl.iter().rev().cloned());
                }
                self.frame_text.push(r.symbol);
            }
            // One buffer for every sample's text: one allocation (the
            // Arc) per stack instead of two.
            let text = &mut self.stack_text;
            text.clear();
            for (i, f) in self.frame_text.iter().rev().enumerate() {
                if i > 0 {
                    text.push(';');
                }
                text.push_str(f);
            }
            // Interned: samples of many call chains (other IPs, pids) share
            // one stack text, and rows are aggregated by its pointer.
            if let Some(t) = self.stack_texts.get(self.stack_text.as_str()) {
                t.clone()
            } else {
                if self.stack_texts.len() >= 1 << 18 {
                    self.stack_texts.clear();
                }
                let t: Arc<str> = Arc::from(self.stack_text.as_str());
                self.stack_texts.insert(t.clone());
                t
            }
        };
        (resolved, stack)
    }
}

/// A sample's call chain: its raw words (`raw`, as an import lends them)
/// split into frames, or the chain it carries.
fn sample_chain<'a>(s: &'a SampleRecord, raw: Option<&[u64]>) -> Cow<'a, [(CpuMode, u64)]> {
    match raw {
        Some(words) => Cow::Owned(vmscope_model::split_callchain(words, s.mode)),
        None => Cow::Borrowed(&s.callchain),
    }
}
