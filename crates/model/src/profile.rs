//! The aggregated profile: sample counts keyed by (event, domain, context,
//! process, image, symbol, stack), plus per-second bins. Collectors fill a
//! [`Profile`] as a delta; stores add deltas up; reports read rows back.

use crate::Context;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Aggregation key (docs/architecture.md §7).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AggKey {
    /// Index into the session's event list.
    pub event: u32,
    pub domain: Arc<str>,
    pub context: Context,
    /// Process name (comm of the thread-group leader).
    pub process: Arc<str>,
    /// Image path or bracketed name (`[kernel.kallsyms]`, `[anon]`, module).
    pub image: Arc<str>,
    pub symbol: Arc<str>,
    /// Call stack, root first, frames joined by `;` (collapsed format);
    /// empty without `-g`. Frames of functions inlined into their caller
    /// end in [`INLINED_SUFFIX`] (where the binary has DWARF).
    pub stack: Arc<str>,
    /// Source file and line of the sampled address (`/path/file.c:123`)
    /// where the image has DWARF line tables; empty otherwise.
    pub srcline: Arc<str>,
    /// Time slice: whole seconds since the session's start
    /// ([`UNKNOWN_SLICE`] in sessions older than schema 3).
    pub second: u32,
    /// CPU the samples ran on ([`UNKNOWN_SLICE`] when the source did not
    /// say). In an agent's rows: the guest CPU, which is the vCPU index.
    pub cpu: u32,
}

/// `second` or `cpu` of an [`AggKey`] that the source did not record.
pub const UNKNOWN_SLICE: u32 = u32::MAX;

/// Suffix of a stack frame that is a function inlined into the frame below
/// it (perf's notation).
pub const INLINED_SUFFIX: &str = " (inlined)";

/// Counts for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub samples: u64,
    /// Sum of sample periods (event counts; ns for clock events).
    pub period: u64,
}

/// One row, for stores and printers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileRow {
    pub key: AggKey,
    pub samples: u64,
    pub period: u64,
}

/// Per-second bin key: (second since session start, event, domain, context).
pub type BinKey = (u32, u32, Arc<str>, Context);

/// The hasher of [`Profile`]'s maps: foldhash, several times faster than
/// the default SipHash on the long stack texts of [`AggKey`], and still
/// seeded per process. Keys come from our own records and normalization,
/// not from an adversary choosing collisions.
pub type ProfileHasher = foldhash::fast::RandomState;

/// A hash map with [`ProfileHasher`]: a recorder hashes every sample's key
/// (its call stack text included), where SipHash cost several percent of
/// its CPU.
pub type FastMap<K, V> = HashMap<K, V, ProfileHasher>;

/// A hash set with the hasher of [`FastMap`].
pub type FastSet<K> = std::collections::HashSet<K, ProfileHasher>;

/// A profile or a delta of one.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub rows: FastMap<AggKey, Counts>,
    pub bins: FastMap<BinKey, u64>,
    /// Lost records per event index (`u32::MAX` = not tied to an event).
    pub lost: FastMap<u32, u64>,
    pub total_samples: u64,
}

impl Profile {
    pub fn new() -> Profile {
        Profile::default()
    }

    pub fn add(&mut self, key: AggKey, samples: u64, period: u64) {
        let c = self.rows.entry(key).or_default();
        c.samples += samples;
        c.period += period;
        self.total_samples += samples;
    }

    pub fn add_bin(&mut self, second: u32, event: u32, domain: Arc<str>, context: Context, n: u64) {
        *self
            .bins
            .entry((second, event, domain, context))
            .or_default() += n;
    }

    pub fn add_lost(&mut self, event: u32, n: u64) {
        *self.lost.entry(event).or_default() += n;
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.bins.is_empty() && self.lost.is_empty()
    }

    /// Move everything out, leaving an empty delta.
    pub fn take(&mut self) -> Profile {
        std::mem::take(self)
    }

    /// Add another profile into this one.
    pub fn merge(&mut self, other: Profile) {
        for (k, c) in other.rows {
            self.add(k, c.samples, c.period);
        }
        for (k, n) in other.bins {
            *self.bins.entry(k).or_default() += n;
        }
        for (k, n) in other.lost {
            *self.lost.entry(k).or_default() += n;
        }
    }

    /// A copy with every row's and bin's second mapped by `sec` (lost
    /// counts kept): a profile moved in time, as a history segment stores
    /// its rows from its own second 0.
    pub fn with_seconds(&self, sec: impl Fn(u32) -> u32) -> Profile {
        let mut out = Profile::new();
        for (k, c) in &self.rows {
            let mut k = k.clone();
            k.second = sec(k.second);
            out.add(k, c.samples, c.period);
        }
        for ((s, e, d, c), n) in &self.bins {
            out.add_bin(sec(*s), *e, d.clone(), *c, *n);
        }
        out.lost = self.lost.clone();
        out
    }

    pub fn into_rows(self) -> Vec<ProfileRow> {
        let mut v: Vec<ProfileRow> = self
            .rows
            .into_iter()
            .map(|(key, c)| ProfileRow {
                key,
                samples: c.samples,
                period: c.period,
            })
            .collect();
        v.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.key.cmp(&b.key)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sym: &str) -> AggKey {
        AggKey {
            event: 0,
            domain: "host".into(),
            context: Context::HostUser,
            process: "p".into(),
            image: "/bin/p".into(),
            symbol: sym.into(),
            stack: "".into(),
            srcline: "".into(),
            second: 0,
            cpu: 0,
        }
    }

    #[test]
    fn add_take_merge() {
        let mut p = Profile::new();
        p.add(key("a"), 1, 10);
        p.add(key("a"), 2, 20);
        p.add(key("b"), 1, 5);
        p.add_lost(0, 3);
        let d = p.take();
        assert!(p.is_empty());
        let mut total = Profile::new();
        total.merge(d.clone());
        total.merge(d);
        let rows = total.into_rows();
        assert_eq!(rows[0].key.symbol.as_ref(), "a");
        assert_eq!(rows[0].samples, 6);
        assert_eq!(rows[0].period, 60);
        assert_eq!(rows[1].samples, 2);
    }
}
