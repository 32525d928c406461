//! The converter's rows when symbolization is deferred (`record`'s default;
//! [`vmscope_model::deferred`], docs/architecture.md §7.3): a sample adds to
//! a row of integers (its domain's and process's string numbers, its leaf
//! frame's and its stack's numbers), so the per-sample work is a few hash
//! lookups of integers and no text is built; [`RawRows::take`] hands out
//! what was added since the last take with the strings and stacks first
//! numbered in it. Frames are numbered by the symbolizer
//! ([`vmscope_symbols::Symbolizer::defer_frame`]).

use crate::sample_cache::StackCache;
use foldhash::fast::FixedState;
use std::collections::HashMap;
use std::sync::Arc;
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
    stacks: FastMap<Box<[u32]>, u32>,
    new_stacks: Vec<(u32, Box<[u32]>)>,
    rows: FastMap<RawRowKey, (u64, u64)>,
    /// (leaf, stack) numbers of recently seen samples.
    pub cache: StackCache<(u32, u32)>,
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
        let n = match self.strings.get(s) {
            Some(n) => *n,
            None => {
                let n = self.strings.len() as u32;
                self.strings.insert(s.clone(), n);
                self.new_strings.push((n, s.clone()));
                n
            }
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
        if let Some(n) = self.stacks.get(self.chain.as_slice()) {
            return *n;
        }
        let n = self.stacks.len() as u32 + 1;
        let frames: Box<[u32]> = self.chain.as_slice().into();
        self.stacks.insert(frames.clone(), n);
        self.new_stacks.push((n, frames));
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
        let frames = frames
            .iter()
            .map(|(id, f)| (*id, self.frame(f)))
            .collect();
        RawDelta {
            strings: std::mem::take(&mut self.new_strings),
            frames,
            stacks: std::mem::take(&mut self.new_stacks),
            rows: self.rows.drain().map(|(k, (n, p))| (k, n, p)).collect(),
        }
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
}
