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

/// The varint blocks a session stores a deferring recording's rows,
/// stacks and frames in (one of each per flush): LEB128 numbers, no
/// framing beyond the block. Decoding returns `None` for any block that is
/// not exactly what encoding makes of some list (truncated, over-long,
/// out of range): a damaged session, said by its reader.
pub mod blocks {
    use super::{RawFrame, RawRowKey};
    use crate::Context;

    /// LEB128: 7 bits a byte, low first.
    pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// The next varint of `bytes` from `*at`, or `None` at a truncated or
    /// over-long one.
    pub fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(*at)?;
            *at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn context_index(c: Context) -> u64 {
        Context::ALL.iter().position(|x| *x == c).unwrap_or(0) as u64
    }

    /// A blob of rows as [`SessionWriter::add_raw`] writes it.
    pub fn encode_rows(rows: &[(RawRowKey, u64, u64)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(rows.len() * 16);
        for (k, n, p) in rows {
            for v in [
                u64::from(k.second),
                u64::from(k.cpu),
                u64::from(k.event),
                context_index(k.context),
                u64::from(k.domain),
                u64::from(k.process),
                u64::from(k.leaf),
                u64::from(k.stack),
                *n,
                *p,
            ] {
                put_varint(&mut out, v);
            }
        }
        out
    }

    /// The rows of a blob, or `None` if it is damaged.
    pub fn decode_rows(bytes: &[u8]) -> Option<Vec<(RawRowKey, u64, u64)>> {
        let mut at = 0;
        let mut out = Vec::new();
        let u32_at = |at: &mut usize| u32::try_from(get_varint(bytes, at)?).ok();
        while at < bytes.len() {
            let second = u32_at(&mut at)?;
            let cpu = u32_at(&mut at)?;
            let event = u32_at(&mut at)?;
            let context = *Context::ALL.get(usize::try_from(get_varint(bytes, &mut at)?).ok()?)?;
            let domain = u32_at(&mut at)?;
            let process = u32_at(&mut at)?;
            let leaf = u32_at(&mut at)?;
            let stack = u32_at(&mut at)?;
            let n = get_varint(bytes, &mut at)?;
            let p = get_varint(bytes, &mut at)?;
            out.push((
                RawRowKey {
                    second,
                    cpu,
                    event,
                    context,
                    domain,
                    process,
                    leaf,
                    stack,
                },
                n,
                p,
            ));
        }
        Some(out)
    }

    /// A block of stacks: per stack its number, its length and its frames.
    pub fn encode_stacks<'a>(stacks: impl Iterator<Item = (u32, &'a [u32])>) -> Vec<u8> {
        let mut out = Vec::with_capacity(4096);
        for (id, frames) in stacks {
            put_varint(&mut out, u64::from(id));
            put_varint(&mut out, frames.len() as u64);
            for &f in frames {
                put_varint(&mut out, u64::from(f));
            }
        }
        out
    }

    pub fn decode_stacks(bytes: &[u8]) -> Option<Vec<(u32, Vec<u32>)>> {
        let mut at = 0;
        let mut out = Vec::new();
        let u32_at = |at: &mut usize| u32::try_from(get_varint(bytes, at)?).ok();
        while at < bytes.len() {
            let id = u32_at(&mut at)?;
            let len = usize::try_from(get_varint(bytes, &mut at)?).ok()?;
            // Each frame takes a byte at least: a length past the end is damage.
            if len > bytes.len() - at {
                return None;
            }
            let mut frames = Vec::with_capacity(len);
            for _ in 0..len {
                frames.push(u32_at(&mut at)?);
            }
            out.push((id, frames));
        }
        Some(out)
    }

    /// A block of frames: per frame its number, its kind (0 kernel, 1 file,
    /// 2 named) and its fields; an optional string number is stored plus one
    /// (0: none).
    pub fn encode_frames(frames: &[(u32, RawFrame)]) -> Vec<u8> {
        let opt = |v: Option<u32>| v.map_or(0, |v| u64::from(v) + 1);
        let mut out = Vec::with_capacity(frames.len() * 12);
        for (id, f) in frames {
            put_varint(&mut out, u64::from(*id));
            match *f {
                RawFrame::Kernel { addr, module } => {
                    put_varint(&mut out, 0);
                    put_varint(&mut out, addr);
                    put_varint(&mut out, opt(module));
                }
                RawFrame::File {
                    path,
                    build_id,
                    offset,
                } => {
                    put_varint(&mut out, 1);
                    put_varint(&mut out, u64::from(path));
                    put_varint(&mut out, opt(build_id));
                    put_varint(&mut out, offset);
                }
                RawFrame::Named { image, symbol } => {
                    put_varint(&mut out, 2);
                    put_varint(&mut out, u64::from(image));
                    put_varint(&mut out, u64::from(symbol));
                }
            }
        }
        out
    }

    pub fn decode_frames(bytes: &[u8]) -> Option<Vec<(u32, RawFrame)>> {
        let mut at = 0;
        let mut out = Vec::new();
        let u32_at = |at: &mut usize| u32::try_from(get_varint(bytes, at)?).ok();
        let opt_at = |at: &mut usize| -> Option<Option<u32>> {
            match get_varint(bytes, at)? {
                0 => Some(None),
                v => Some(Some(u32::try_from(v - 1).ok()?)),
            }
        };
        while at < bytes.len() {
            let id = u32_at(&mut at)?;
            let f = match get_varint(bytes, &mut at)? {
                0 => RawFrame::Kernel {
                    addr: get_varint(bytes, &mut at)?,
                    module: opt_at(&mut at)?,
                },
                1 => RawFrame::File {
                    path: u32_at(&mut at)?,
                    build_id: opt_at(&mut at)?,
                    offset: get_varint(bytes, &mut at)?,
                },
                2 => RawFrame::Named {
                    image: u32_at(&mut at)?,
                    symbol: u32_at(&mut at)?,
                },
                _ => return None,
            };
            out.push((id, f));
        }
        Some(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::Context;

        #[test]
        fn rows_and_stacks_round_trip_and_damage_is_seen() {
            let rows = vec![
                (
                    RawRowKey {
                        second: 0,
                        cpu: u32::MAX,
                        event: 1,
                        context: Context::ALL[7],
                        domain: 0,
                        process: 300,
                        leaf: 70_000,
                        stack: 0,
                    },
                    1,
                    u64::MAX,
                ),
                (
                    RawRowKey {
                        second: 3600,
                        cpu: 1,
                        event: 0,
                        context: Context::ALL[0],
                        domain: 2,
                        process: 0,
                        leaf: 0,
                        stack: u32::MAX,
                    },
                    12345,
                    1_000_000,
                ),
            ];
            let blob = encode_rows(&rows);
            assert_eq!(decode_rows(&blob), Some(rows));
            assert_eq!(decode_rows(&blob[..blob.len() - 1]), None);
            assert_eq!(decode_rows(&[0xff; 11]), None);
            assert_eq!(decode_rows(&[]), Some(Vec::new()));
            // A context index past the known ones.
            let mut bad = Vec::new();
            for v in [0, 0, 0, 99, 0, 0, 0, 0, 1, 1] {
                put_varint(&mut bad, v);
            }
            assert_eq!(decode_rows(&bad), None);
            let stacks: Vec<(u32, Box<[u32]>)> = vec![
                (1, vec![0, 127, 128, 16_384, u32::MAX].into()),
                (u32::MAX, vec![7].into()),
            ];
            let blob = encode_stacks(stacks.iter().map(|(i, f)| (*i, &**f)));
            let back: Vec<(u32, Box<[u32]>)> = decode_stacks(&blob)
                .unwrap()
                .into_iter()
                .map(|(i, f)| (i, f.into()))
                .collect();
            assert_eq!(back, stacks);
            assert_eq!(decode_stacks(&blob[..blob.len() - 1]), None);
            // A stack id past u32, and a length past the end of the block.
            let mut big = Vec::new();
            put_varint(&mut big, u64::from(u32::MAX) + 1);
            assert_eq!(decode_stacks(&big), None);
            assert_eq!(decode_stacks(&[1, 0x80, 0x80, 0x80, 0x08]), None);
            let frames = vec![
                (
                    0,
                    RawFrame::Kernel {
                        addr: u64::MAX,
                        module: None,
                    },
                ),
                (
                    1,
                    RawFrame::Kernel {
                        addr: 0xffff_ffff_8100_0000,
                        module: Some(0),
                    },
                ),
                (
                    2,
                    RawFrame::File {
                        path: 3,
                        build_id: Some(u32::MAX - 1),
                        offset: 0x1234,
                    },
                ),
                (
                    u32::MAX,
                    RawFrame::Named {
                        image: 5,
                        symbol: 6,
                    },
                ),
            ];
            let blob = encode_frames(&frames);
            assert_eq!(decode_frames(&blob), Some(frames));
            assert_eq!(decode_frames(&blob[..blob.len() - 1]), None);
            assert_eq!(decode_frames(&[0, 9]), None);
        }
    }
}
