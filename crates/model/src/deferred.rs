//! What a recording stores when it leaves symbolization for the session's
//! first read (`record`'s default, as `perf record` leaves it to `perf
//! report`; docs/architecture.md §7.3).
//!
//! Such a recording names no function: every frame it meets gets a number
//! ([`DeferredFrame`]: a host kernel address or a file offset to resolve
//! later, or a frame named at once because naming it reads nothing), every
//! call chain becomes a list of frame numbers, and every domain and process
//! name a number too, so a sample adds to a row of integers
//! ([`RawRowKey`]). The converter hands these out as [`RawDelta`]s; the
//! store keeps them as they are; the first read resolves the frames and
//! writes the rows a recording that named functions as it went would have
//! written.

use crate::{Context, NormalizedFrame};
use std::sync::Arc;

/// What a frame number stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeferredFrame {
    /// Resolved at the first read: a host kernel address
    /// ([`crate::ImageRef::Kernel`]) or a file offset
    /// ([`crate::ImageRef::File`]).
    Later {
        frame: NormalizedFrame,
        /// Kernel frames: the module (`[name]`) the recording's kernel mmap
        /// records put at this address when the frame was seen; it names
        /// the image of an address the kernel's symbols do not cover (a
        /// file from another machine).
        module: Option<Arc<str>>,
    },
    /// Named while recording (anonymous code, guest frames, kernel code
    /// registered during the recording: naming them reads nothing).
    Named { image: Arc<str>, symbol: Arc<str> },
}

/// A [`DeferredFrame`] as a deferring recording stores it: its texts
/// (paths, hex build-ids, module and symbol names) as numbers of
/// [`RawDelta::strings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RawFrame {
    Kernel {
        addr: u64,
        module: Option<u32>,
    },
    File {
        path: u32,
        build_id: Option<u32>,
        offset: u64,
    },
    Named {
        image: u32,
        symbol: u32,
    },
}

/// The stack number of a sample without a call chain.
pub const NO_STACK: u32 = 0;

/// A row of a recording that defers symbolization: what a row of the
/// session's `samples` table becomes once its numbers are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawRowKey {
    pub second: u32,
    pub cpu: u32,
    pub event: u32,
    pub context: Context,
    /// Numbers of [`RawDelta::strings`].
    pub domain: u32,
    pub process: u32,
    /// The sampled address's frame.
    pub leaf: u32,
    /// [`RawDelta::stacks`] number, or [`NO_STACK`].
    pub stack: u32,
}

/// What a deferring converter added since the last take: the strings,
/// frames and stacks first numbered in it, and its rows with their counts
/// (samples, period sum).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawDelta {
    /// Domain and process names and the texts of frames.
    pub strings: Vec<(u32, Arc<str>)>,
    pub frames: Vec<(u32, RawFrame)>,
    /// New stacks as (number, length), numbered from 1; their frame
    /// numbers follow one another in `stack_frames`, each stack's the
    /// sampled end first (as the chain is recorded). Flat, so a delta
    /// handed to another thread is a few allocations, not one per stack.
    pub stacks: Vec<(u32, u32)>,
    pub stack_frames: Vec<u32>,
    pub rows: Vec<(RawRowKey, u64, u64)>,
}

impl RawDelta {
    /// Each new stack's number and frames.
    pub fn stacks(&self) -> impl Iterator<Item = (u32, &[u32])> {
        let mut at = 0usize;
        self.stacks.iter().map(move |&(id, len)| {
            let frames = &self.stack_frames[at..at + len as usize];
            at += len as usize;
            (id, frames)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
            && self.frames.is_empty()
            && self.stacks.is_empty()
            && self.rows.is_empty()
    }

    /// Samples in its rows.
    pub fn samples(&self) -> u64 {
        self.rows.iter().map(|r| r.1).sum()
    }
}
