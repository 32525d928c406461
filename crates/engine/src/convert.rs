//! The converter: records in, aggregated profile deltas out.

use std::collections::HashMap;
use std::sync::Arc;
use vmscope_model::{
    attribute, AggKey, CpuMode, FastMap, ImageRef, NormalizedFrame, ProcessTable, Profile, Record,
    SampleRecord, ThreadMap,
};
use vmscope_symbols::{Resolved, Symbolizer};

/// Counters of what the converter saw.
#[derive(Debug, Clone, Default)]
pub struct ConverterStats {
    pub samples: u64,
    pub lost: u64,
    pub guest_mode_samples: u64,
    pub first_time: Option<u64>,
    pub last_time: Option<u64>,
    /// Samples per (domain) for the session's domain list.
    pub domains: HashMap<Arc<str>, u64>,
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
    /// Kernel module ranges from kernel mmap records (pid -1): the image of
    /// kernel IPs that kallsyms cannot name (files from other machines).
    modules: Vec<(u64, u64, Arc<str>)>,
    unmonitored: std::collections::HashSet<Arc<str>>,
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
    pub fn new(symbolizer: Symbolizer, threads: ThreadMap) -> Converter {
        Converter {
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
            modules: Vec::new(),
            unmonitored: Default::default(),
        }
    }

    /// Set the time origin of per-second bins (else the first sample's time).
    pub fn set_origin(&mut self, t: u64) {
        self.origin = Some(t);
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

    pub fn symbolizer_mut(&mut self) -> &mut Symbolizer {
        &mut self.symbolizer
    }

    pub fn stats(&self) -> &ConverterStats {
        &self.stats
    }

    /// Take what accumulated since the last call.
    pub fn take_delta(&mut self) -> Profile {
        self.delta.take()
    }

    pub fn push(&mut self, rec: Record) {
        match rec {
            Record::Sample(s) => self.sample(&s),
            Record::Lost { count, .. } => {
                // Ring losses are shared by every event of that CPU's ring;
                // they are booked on the first event.
                self.stats.lost += count;
                self.delta.add_lost(0, count);
            }
            Record::Mmap {
                pid: u32::MAX,
                start,
                len,
                ref path,
                ..
            } => {
                if let Some(name) = module_image(path) {
                    self.modules.push((start, start.saturating_add(len), name));
                    self.modules.sort_by_key(|m| m.0);
                }
            }
            other => self.procs.apply(&other),
        }
    }

    fn resolve(&mut self, domain: &str, frame: &NormalizedFrame) -> Resolved {
        let mut r = self.symbolizer.resolve(domain, frame);
        if matches!(frame.image, ImageRef::Kernel)
            && r.symbol.starts_with("0x")
            && !self.modules.is_empty()
        {
            let i = self.modules.partition_point(|m| m.0 <= frame.addr);
            if i > 0 && frame.addr < self.modules[i - 1].1 {
                r.image = self.modules[i - 1].2.clone();
            }
        }
        r
    }

    fn sample(&mut self, s: &SampleRecord) {
        self.sample_weighted(s, 1, s.period.max(1));
    }

    /// Push a batch of records (one ring read). Samples that share event,
    /// thread, mode, call chain and second are converted once, with their
    /// count and period sum: the work per sample becomes one hash instead of
    /// normalization, attribution, symbolization and aggregation. Pending
    /// samples are converted before any other record is applied, so mmaps,
    /// execs and exits keep their order relative to samples.
    pub fn push_batch(&mut self, records: impl IntoIterator<Item = Record>) {
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
            self.sample_weighted(&s, n, period);
        }
    }

    fn sample_weighted(&mut self, s: &SampleRecord, n: u64, period: u64) {
        let st = &mut self.stats;
        st.samples += n;
        st.first_time = Some(st.first_time.map_or(s.time, |t| t.min(s.time)));
        st.last_time = Some(st.last_time.map_or(s.time, |t| t.max(s.time)));
        if matches!(s.mode, CpuMode::GuestKernel | CpuMode::GuestUser) {
            st.guest_mode_samples += n;
        }
        let origin = *self.origin.get_or_insert(s.time);

        let leaf = self.procs.normalize(s.pid, s.ip, s.mode);
        let attr = attribute(&self.threads, s.pid, s.tid, s.mode, &leaf.image);
        if attr.context.is_guest() && !self.guest_domains.contains(&attr.domain) {
            self.guest_domains.insert(attr.domain.clone());
            if let Some(text) = &self.default_guest_kallsyms {
                if let Ok(k) = vmscope_symbols::Kallsyms::parse(text) {
                    self.symbolizer.add_guest_kallsyms(&attr.domain, k);
                }
            }
        }
        if self.unmonitored.contains(&attr.domain) {
            let label: Arc<str> = "[unmonitored]".into();
            *self.stats.domains.entry(attr.domain.clone()).or_default() += n;
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
                stack: "".into(),
                srcline: "".into(),
                second,
                cpu: s.cpu,
            };
            self.delta.add(key, n, period);
            return;
        }
        let resolved = self.resolve(&attr.domain, &leaf);
        let stack: Arc<str> = if s.callchain.is_empty() {
            Arc::from("")
        } else {
            self.frame_text.clear();
            for (i, &(mode, ip)) in s.callchain.iter().enumerate() {
                // Return addresses point after the call: look up ip-1 so the
                // caller's own function is found (not the next one).
                let addr = if i > 0 && !mode.is_kernel() {
                    ip.saturating_sub(1)
                } else {
                    ip
                };
                let f = self.procs.normalize(s.pid, addr, mode);
                let r = self.resolve(&attr.domain, &f);
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
            Arc::from(text.as_str())
        };
        *self.stats.domains.entry(attr.domain.clone()).or_default() += n;
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
        let key = AggKey {
            event: s.event,
            domain: attr.domain,
            context: attr.context,
            // The thread's name, as perf's `comm` (QEMU's `CPU 0/TCG`, a
            // browser's `Compositor`), else its process's.
            process: self
                .procs
                .thread_comm(s.tid)
                .unwrap_or_else(|| self.procs.comm(s.pid, s.tid)),
            image: resolved.image,
            symbol: resolved.symbol,
            stack,
            srcline: resolved.srcline,
            second,
            cpu: s.cpu,
        };
        self.delta.add(key, n, period);
    }
}
