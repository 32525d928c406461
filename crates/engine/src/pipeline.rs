//! The converter on its own thread, so reading the rings never waits on
//! conversion: the first sample of a newly seen binary loads that binary's
//! symbol table (ELF symbols, DWARF), which takes tens to hundreds of
//! milliseconds; on the ring-reading thread that stalled the reads and let
//! the rings fill on hosts that exec many short-lived programs.
//!
//! The ring reader hands each batch of records over a channel (records stay
//! in the order read, so mmaps, execs and exits keep their order relative
//! to samples), and asks for the profile accumulated so far without
//! waiting: the answer comes back on a second channel and is picked up on a
//! later turn of the loop.
//!
//! What waits in the channel is bounded ([`MAX_IN_FLIGHT`] records): a
//! converter that cannot keep up must not grow the recorder's memory
//! without end, and must not block the ring reader either (the kernel would
//! drop samples, uncounted by us, and the rings' other records with them).
//! A batch that finds the channel full keeps its other records, held in
//! order for the next batch, and drops its samples, which are counted as
//! lost (a `Lost` record sent ahead of the held records), as the kernel
//! counts the samples a full ring drops. [`ConvertThread::finish`] waits for
//! every batch to be converted and returns the converter (warnings,
//! build-ids, the last delta). The converter thread is a thread of the
//! recorder process, so its CPU time is in the recorder's own cost
//! (getrusage of the process counts every thread).
//!
//! Every symbol table is still loaded once per binary (path, build-id) and
//! cached by the [`vmscope_symbols::Symbolizer`] the converter owns.

use crate::{Converter, ConverterStats, EngineError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use vmscope_model::{CpuMode, Profile, Record};

/// Records handed over and not yet converted, at most: about 16 s of
/// `-a -g -F 4000` samples on two CPUs, some tens of MiB.
pub const MAX_IN_FLIGHT: usize = 1 << 17;

/// Chain vectors on their way back at most; past it the converter frees
/// them itself.
const SPENT_MAX: usize = 1 << 16;

enum Msg {
    Batch(Vec<Record>),
    /// Send what accumulated since the previous take, with the counters.
    Take,
}

/// What the converter accumulated since the previous take.
pub struct Taken {
    pub delta: Profile,
    /// Rows of numbers since the previous take when symbolization is
    /// deferred ([`Converter::take_raw`]): stored with `delta`.
    pub raw: vmscope_model::RawDelta,
    /// Counters, cumulative, as of this delta.
    pub stats: ConverterStats,
}

/// A [`Converter`] running on a helper thread; see the module docs.
pub struct ConvertThread {
    tx: Option<Sender<Msg>>,
    done: Receiver<Taken>,
    /// Call chain vectors of converted samples, back for reuse.
    spent: Receiver<Vec<Vec<(CpuMode, u64)>>>,
    /// Chain vectors sent back and not yet taken (bounded by [`SPENT_MAX`]).
    spent_out: Arc<AtomicUsize>,
    /// Taken answers asked for and not yet received.
    outstanding: usize,
    /// Counters as of the last answer received.
    stats: ConverterStats,
    handle: Option<JoinHandle<Converter>>,
    /// Records sent and not yet converted (the converter decrements).
    in_flight: Arc<AtomicUsize>,
    /// Records of batches that found the channel full, other than samples,
    /// in order, waiting for room.
    held: Vec<Record>,
    /// Samples dropped since the last batch sent (channel full).
    unsent_lost: u64,
    /// Samples dropped in all.
    dropped: u64,
    limit: usize,
}

impl ConvertThread {
    /// Move `conv` to a new thread named `vmscope-convert`.
    pub fn spawn(conv: Converter) -> Result<ConvertThread, EngineError> {
        ConvertThread::spawn_bounded(conv, MAX_IN_FLIGHT)
    }

    /// [`ConvertThread::spawn`] with at most `limit` records in flight.
    pub fn spawn_bounded(conv: Converter, limit: usize) -> Result<ConvertThread, EngineError> {
        let (tx, rx) = channel::<Msg>();
        let (done_tx, done) = channel::<Taken>();
        let (spent_tx, spent) = channel::<Vec<Vec<(CpuMode, u64)>>>();
        let spent_out = Arc::new(AtomicUsize::new(0));
        let spent_count = spent_out.clone();
        let stats = conv.stats().clone();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let counter = in_flight.clone();
        let handle = std::thread::Builder::new()
            .name("vmscope-convert".into())
            .spawn(move || {
                let mut conv = conv;
                conv.keep_spent_chains();
                for msg in rx {
                    match msg {
                        Msg::Batch(b) => {
                            let n = b.len();
                            conv.push_batch(b);
                            counter.fetch_sub(n, Ordering::AcqRel);
                            // Back to the reader that allocated them (a
                            // free on this thread is a cross-thread free).
                            let chains = conv.take_spent_chains();
                            if !chains.is_empty() && spent_count.load(Ordering::Acquire) < SPENT_MAX
                            {
                                spent_count.fetch_add(chains.len(), Ordering::AcqRel);
                                let _ = spent_tx.send(chains);
                            }
                        }
                        Msg::Take => {
                            let t = Taken {
                                delta: conv.take_delta(),
                                raw: conv.take_raw(),
                                stats: conv.stats().clone(),
                            };
                            // The reader gone: nothing to answer.
                            let _ = done_tx.send(t);
                        }
                    }
                }
                conv
            })
            .map_err(|e| EngineError::Invalid(format!("cannot start the converter thread: {e}")))?;
        Ok(ConvertThread {
            tx: Some(tx),
            done,
            spent,
            spent_out,
            outstanding: 0,
            stats,
            handle: Some(handle),
            in_flight,
            held: Vec::new(),
            unsent_lost: 0,
            dropped: 0,
            limit,
        })
    }

    /// Hand over one ring read (never blocks). When the records in flight
    /// would pass the bound, the batch's samples are dropped and counted as
    /// lost, and its other records wait for the next batch (module docs).
    pub fn push_batch(&mut self, batch: Vec<Record>) {
        if batch.is_empty() && self.held.is_empty() && self.unsent_lost == 0 {
            return;
        }
        let waiting = self.held.len() + usize::from(self.unsent_lost > 0);
        let in_flight = self.in_flight.load(Ordering::Acquire);
        // A converter with nothing to do takes the batch whatever its size:
        // at the kernel's highest rates one read of the rings can hold more
        // than the bound, and such reads were all dropped, every time.
        if in_flight > 0 && in_flight + waiting + batch.len() > self.limit {
            self.hold(batch);
            return;
        }
        let batch = self.with_held(batch);
        self.send(batch);
    }

    /// Samples dropped because the converter was behind (also counted in
    /// its lost samples once it converted the `Lost` record).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn hold(&mut self, batch: Vec<Record>) {
        for r in batch {
            match r {
                Record::Sample(_) => {
                    self.unsent_lost += 1;
                    self.dropped += 1;
                }
                other => self.held.push(other),
            }
        }
    }

    /// The held records (after a `Lost` record for the dropped samples)
    /// followed by `batch`.
    fn with_held(&mut self, batch: Vec<Record>) -> Vec<Record> {
        if self.held.is_empty() && self.unsent_lost == 0 {
            return batch;
        }
        let mut all = Vec::with_capacity(self.held.len() + 1 + batch.len());
        if self.unsent_lost > 0 {
            all.push(Record::Lost {
                cpu: None,
                count: std::mem::take(&mut self.unsent_lost),
            });
        }
        all.append(&mut self.held);
        all.extend(batch);
        all
    }

    fn send(&mut self, batch: Vec<Record>) {
        if batch.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx {
            self.in_flight.fetch_add(batch.len(), Ordering::AcqRel);
            // A send fails only when the thread ended (it panicked);
            // `finish` reports that.
            let _ = tx.send(Msg::Batch(batch));
        }
    }

    /// Ask for the profile accumulated so far (never blocks); answers come
    /// from [`ConvertThread::try_taken`]. At most one question is
    /// outstanding: asking again before the answer came is a no-op.
    pub fn ask(&mut self) {
        if self.outstanding > 0 {
            return;
        }
        if let Some(tx) = &self.tx {
            if tx.send(Msg::Take).is_ok() {
                self.outstanding += 1;
            }
        }
    }

    /// The answers that have arrived (never blocks).
    pub fn try_taken(&mut self) -> Vec<Taken> {
        let v: Vec<Taken> = self.done.try_iter().collect();
        self.outstanding = self.outstanding.saturating_sub(v.len());
        if let Some(t) = v.last() {
            self.stats = t.stats.clone();
        }
        v
    }

    /// Call chain vectors of converted samples, for the ring reader to
    /// reuse (`Recorder::recycle_chains`); never blocks.
    pub fn spent_chains(&mut self) -> Vec<Vec<(CpuMode, u64)>> {
        let mut all = Vec::new();
        for mut v in self.spent.try_iter() {
            if all.is_empty() {
                all = v;
            } else {
                all.append(&mut v);
            }
        }
        self.spent_out.fetch_sub(all.len(), Ordering::AcqRel);
        all
    }

    /// Counters as of the last answer received.
    pub fn stats(&self) -> &ConverterStats {
        &self.stats
    }

    /// Wait until every batch handed over is converted; returns the answers
    /// not yet collected (in order) and the converter, whose remaining
    /// delta the caller takes.
    pub fn finish(mut self) -> Result<(Vec<Taken>, Converter), EngineError> {
        // What waited for room goes now (the reader is done: waiting is fine).
        let rest = self.with_held(Vec::new());
        self.send(rest);
        drop(self.tx.take());
        let conv = self
            .handle
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| EngineError::Invalid("the converter thread panicked".into()))?;
        let taken: Vec<Taken> = self.done.try_iter().collect();
        Ok((taken, conv))
    }
}

impl Drop for ConvertThread {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmscope_model::{CpuMode, SampleRecord};
    use vmscope_symbols::{Symbolizer, SymbolizerOptions};

    fn sample(time: u64) -> Record {
        Record::Sample(SampleRecord {
            time,
            pid: 0,
            tid: 0,
            cpu: 0,
            event: 0,
            period: 1,
            mode: CpuMode::Kernel,
            ip: 0xffff_ffff_8100_0000,
            callchain: Vec::new(),
        })
    }

    fn converter() -> Converter {
        let opts = SymbolizerOptions {
            kallsyms: Some("/nonexistent/kallsyms".into()),
            ..SymbolizerOptions::default()
        };
        Converter::new(Symbolizer::new(opts), Default::default())
    }

    /// The same records give the same profile and counters on the thread as
    /// on the caller's thread, whether taken in pieces or at the end.
    #[test]
    fn converts_like_the_inline_converter() {
        let batches: Vec<Vec<Record>> = (0..50u64)
            .map(|b| {
                (0..40u64)
                    .map(|i| sample(b * 100_000_000 + i * 1_000))
                    .collect()
            })
            .collect();
        let mut inline = converter();
        for b in &batches {
            inline.push_batch(b.clone());
        }
        let want = inline.take_delta();

        let mut t = ConvertThread::spawn(converter()).unwrap();
        let mut got = Profile::new();
        for (i, b) in batches.into_iter().enumerate() {
            t.push_batch(b);
            if i % 7 == 0 {
                t.ask();
            }
            for taken in t.try_taken() {
                got.merge(taken.delta);
            }
        }
        let (rest, mut conv) = t.finish().unwrap();
        for taken in rest {
            got.merge(taken.delta);
        }
        got.merge(conv.take_delta());
        assert_eq!(conv.stats().samples, 2000);
        assert_eq!(got.total_samples, 2000);
        assert_eq!(got.rows, want.rows);
        assert_eq!(got.bins, want.bins);
    }

    fn comm(pid: u32) -> Record {
        Record::Comm {
            pid,
            tid: pid,
            comm: "x".into(),
            exec: true,
            time: 0,
        }
    }

    /// Past the bound, samples are counted as lost instead of queued, the
    /// other records still reach the converter, and samples + lost add up
    /// to every sample handed over.
    #[test]
    fn a_full_channel_drops_samples_as_lost_and_keeps_other_records() {
        let mut t = ConvertThread::spawn_bounded(converter(), 100).unwrap();
        // Past the bound, but nothing in flight: taken whole.
        let first: Vec<Record> = (0..150u64).map(|i| sample(i * 1_000)).collect();
        t.push_batch(first);
        assert_eq!(t.dropped(), 0);
        // A long batch keeps the converter busy: the next one is past the
        // bound with records in flight, so its samples are dropped.
        let long: Vec<Record> = (0..200_000u64)
            .map(|i| match sample(1_000_000 + i) {
                // Distinct addresses: each one converted on its own.
                Record::Sample(mut s) => {
                    s.ip += i * 16;
                    Record::Sample(s)
                }
                other => other,
            })
            .collect();
        t.push_batch(long);
        let mut handed = 150 + 200_000u64;
        for b in 1..200u64 {
            let n = if b == 1 { 150 } else { 60 };
            let mut batch: Vec<Record> = (0..n)
                .map(|i| sample(b * 100_000_000 + i * 1_000))
                .collect();
            batch.insert(30, comm(1000 + b as u32));
            handed += n;
            t.push_batch(batch);
        }
        let dropped = t.dropped();
        let (_, mut conv) = t.finish().unwrap();
        let st = conv.stats().clone();
        assert!(dropped >= 150, "{dropped}");
        assert_eq!(st.lost, dropped);
        assert_eq!(st.samples + st.lost, handed, "{st:?}");
        let p = conv.take_delta();
        assert_eq!(p.lost.values().sum::<u64>(), dropped);
    }
}
