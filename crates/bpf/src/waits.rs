//! Who each followed thread waited behind, summed in the kernel by the
//! `switch_waits` and `migrate_waits` programs (`src/bpf/sched.bpf.c`) with
//! the kernel's own clock: a wait is the task's `sched_info.last_queued` to
//! the runqueue clock of the switch that runs it (what the kernel adds to
//! `run_delay` there), split by what each CPU's log of switches says ran
//! meanwhile; a waiting task moved by the load balancer is charged the
//! growth of its `run_delay` up to the old runqueue's clock. So each
//! thread's split adds up to its `run_delay` (docs/architecture.md §5.1).
//!
//! [`BpfWaits::follow`] says which threads to follow (the map holds
//! [`FOLLOW_ENTRIES`]), [`BpfWaits::take`] drains what was charged since
//! the last call. Bounded: [`WAIT_ENTRIES`] (waiter, culprit) pairs between
//! two drains (beyond, the time is counted in [`WaitStats::full_ns`]), 64
//! distinct culprits per waiter between two drains and at most 8 switches
//! of one CPU looked at per wait (the rest goes to [`OTHER_TID`], the
//! second counted in [`WaitStats::cut_ns`]): what one switch costs stays
//! bounded however many threads wait on a CPU.
//!
//! Limits: the per-waiter culprit count is kept without a lock, so two
//! CPUs adding culprits of one waiter at once can let it pass 64 by one or
//! two; a charge made while the drain deletes its element can be lost
//! (the program holds a pointer to the element for a few instructions)
//! or, since the kernel reuses the elements, land on the pair that next
//! takes that element.

use crate::object::{self, Loaded};
use crate::BpfError;
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use std::collections::{HashMap, HashSet};

/// Threads followed at once.
pub const FOLLOW_ENTRIES: u32 = 16384;
/// (waiter, culprit) pairs held between two drains.
pub const WAIT_ENTRIES: u32 = 65536;

/// Entries a drain takes from a map per system call. The batch call's
/// buffers are allocated and zeroed for this many entries at every drain:
/// with the whole map's size (65 536 pairs, 2 MiB) that memset was the
/// largest part of a drain in `serve --history`'s profile (32 VMs), for a
/// few hundred entries a second.
const DRAIN_BATCH: u32 = 1024;
/// The culprit of time the programs could not place (`Culprit::UNKNOWN`
/// of the wait timeline).
pub const UNKNOWN_TID: u32 = 0xffff_fffe;
/// Culprits beyond a waiter's 64, and the older part of a wait beyond 8
/// switches (`Culprit::OTHER`).
pub const OTHER_TID: u32 = 0xffff_ffff;

/// One (waiter, culprit) sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub waiter: u32,
    /// A tid; 0 idle; [`UNKNOWN_TID`], [`OTHER_TID`].
    pub culprit: u32,
    /// The culprit's comm when it was last charged (NUL-padded).
    pub comm: [u8; 16],
    pub ns: u64,
}

/// The programs' own counters, since the previous drain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Charges lost because the (waiter, culprit) map was full, and their
    /// nanoseconds.
    pub full: u64,
    pub full_ns: u64,
    /// Waits whose older part was charged to [`OTHER_TID`] (more
    /// switches on its CPU than the programs look at), and that part.
    pub cut: u64,
    pub cut_ns: u64,
    /// Migrations of a followed thread not seen switching before (their
    /// wait so far is not split; it is not counted either).
    pub unseen: u64,
    /// Waits not counted: the count map was full.
    pub counts_full: u64,
    /// `run_delay` the kernel added where no program could split it (an
    /// event skipped, a move that was not a queued task's), charged to
    /// [`UNKNOWN_TID`].
    pub unplaced: u64,
    pub unplaced_ns: u64,
    /// Events the programs skipped: the task's runqueue was out of reach
    /// (a kernel without `CONFIG_FAIR_GROUP_SCHED`) or not its CPU's.
    pub no_rq: u64,
    /// Threads that could not be followed (the follow map was full).
    pub not_followed: u64,
}

/// What was charged since the previous drain.
#[derive(Debug, Clone, Default)]
pub struct Drained {
    pub charges: Vec<Charge>,
    /// Waits ended (switched in) or moved (migrated), per waiter.
    pub waits: HashMap<u32, u64>,
    pub stats: WaitStats,
}

/// The loaded programs and their maps.
pub struct BpfWaits {
    loaded: Loaded,
    follow: MapHandle,
    waits: MapHandle,
    counts: MapHandle,
    stats: MapHandle,
    followed: HashSet<u32>,
    last: [u64; STATS],
    not_followed: u64,
}

/// The programs' counters (the `stats` array, in the C enum's order).
const STATS: usize = 9;

fn map_err(what: &'static str) -> impl FnOnce(libbpf_rs::Error) -> BpfError {
    move |source| BpfError::Map { what, source }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    b.get(i..i + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    b.get(i..i + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

impl BpfWaits {
    /// Load and attach the programs. Fails with a one-line reason when
    /// BPF, BTF or the raw tracepoints are unavailable.
    pub fn open() -> Result<BpfWaits, BpfError> {
        let slots = object::cpu_slots();
        let loaded = object::load(
            "the scheduler wait programs",
            &["switch_waits", "migrate_waits"],
            &[
                ("logs", slots),
                ("follow", FOLLOW_ENTRIES),
                ("waits", WAIT_ENTRIES),
                ("counts", FOLLOW_ENTRIES),
            ],
        )?;
        let waits = loaded.map("waits")?;
        object::check_batch_reads(&waits, "the scheduler wait map")?;
        Ok(BpfWaits {
            follow: loaded.map("follow")?,
            waits,
            counts: loaded.map("counts")?,
            stats: loaded.map("stats")?,
            loaded,
            followed: HashSet::new(),
            last: [0; STATS],
            not_followed: 0,
        })
    }

    /// The programs' ids (`bpftool prog show id N`).
    pub fn program_ids(&self) -> Vec<u32> {
        self.loaded.program_ids()
    }

    /// Follow exactly `tids` from now on (threads no longer in it are let
    /// go; new ones are followed from their next switch).
    pub fn follow(&mut self, tids: impl IntoIterator<Item = u32>) {
        let want: HashSet<u32> = tids.into_iter().collect();
        for gone in self.followed.difference(&want).copied().collect::<Vec<_>>() {
            let _ = self.follow.delete(&gone.to_ne_bytes());
            self.followed.remove(&gone);
        }
        let zero = [0u8; 16];
        for &t in want.difference(&self.followed.clone()) {
            match self
                .follow
                .update(&t.to_ne_bytes(), &zero, MapFlags::NO_EXIST)
            {
                Ok(()) => {
                    self.followed.insert(t);
                }
                Err(_)
                    if self
                        .follow
                        .lookup(&t.to_ne_bytes(), MapFlags::ANY)
                        .is_ok_and(|v| v.is_some()) =>
                {
                    self.followed.insert(t);
                }
                Err(_) => self.not_followed += 1,
            }
        }
    }

    /// How many threads are followed.
    pub fn followed(&self) -> usize {
        self.followed.len()
    }

    /// Everything charged since the previous call.
    pub fn take(&mut self) -> Result<Drained, BpfError> {
        let mut out = Drained::default();
        for (k, v) in self
            .waits
            .lookup_and_delete_batch(DRAIN_BATCH, MapFlags::ANY, MapFlags::ANY)
            .map_err(map_err("draining the wait map"))?
        {
            let mut comm = [0u8; 16];
            if let Some(c) = v.get(8..24) {
                comm.copy_from_slice(c);
            }
            out.charges.push(Charge {
                waiter: u32_at(&k, 0),
                culprit: u32_at(&k, 4),
                comm,
                ns: u64_at(&v, 0),
            });
        }
        for (k, v) in self
            .counts
            .lookup_and_delete_batch(DRAIN_BATCH, MapFlags::ANY, MapFlags::ANY)
            .map_err(map_err("draining the wait count map"))?
        {
            *out.waits.entry(u32_at(&k, 0)).or_default() += u64_at(&v, 0);
        }
        let mut now = [0u64; STATS];
        for (i, n) in now.iter_mut().enumerate() {
            let key = (i as u32).to_ne_bytes();
            *n = self
                .stats
                .lookup(&key, MapFlags::ANY)
                .map_err(map_err("reading the wait programs' counters"))?
                .map_or(0, |v| u64_at(&v, 0));
        }
        let d = |i: usize| now[i].saturating_sub(self.last[i]);
        out.stats = WaitStats {
            full: d(0),
            full_ns: d(1),
            cut: d(2),
            cut_ns: d(3),
            unseen: d(4),
            counts_full: d(5),
            unplaced: d(6),
            unplaced_ns: d(7),
            no_rq: d(8),
            not_followed: std::mem::take(&mut self.not_followed),
        };
        self.last = now;
        Ok(out)
    }
}
