//! Framing: the byte layout of one frame, its checksums, and the incremental
//! frame decoder that resynchronises after garbage.
//!
//! ```text
//! offset size field
//!  0     4    magic "VMS1"
//!  4     4    body length, u32 little endian, <= MAX_FRAME
//!  8     1    body encoding: 1 = JSON (UTF-8); other values reserved
//!  9     3    reserved, zero when sent, ignored when received
//! 12     4    CRC-32 (IEEE) of the body, u32 LE
//! 16     4    CRC-32 (IEEE) of bytes 0..16, u32 LE
//! 20     len  body
//! ```
//!
//! The decoder never reserves memory from a declared length: it only holds the
//! bytes it was given, and rejects a header whose length exceeds [`MAX_FRAME`]
//! as soon as the header is complete. Garbage (stale bytes of an earlier
//! connection, a torn frame) is skipped by scanning for the next magic whose
//! header checksum is valid; a body whose checksum fails is treated as garbage
//! from its magic onwards, so a real frame hidden inside it is still found.

use crate::error::ProtocolError;

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"VMS1";
/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 20;
/// Largest body a frame may declare, in bytes (16 MiB).
pub const MAX_FRAME: usize = 16 << 20;
/// Body encoding byte: a UTF-8 JSON object.
pub const ENCODING_JSON: u8 = 1;

/// One frame as cut from the byte stream, checksums verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// The encoding byte of the header.
    pub encoding: u8,
    /// The body bytes.
    pub body: Vec<u8>,
}

/// CRC-32 (IEEE 802.3, as in zlib and gzip) of `data`. `crc32fast` (the
/// checksum flate2 uses) rather than a byte-at-a-time table: every frame's
/// body is summed by its sender, the broker (twice) and its receiver, and
/// the table loop was a tenth of a broker's CPU with many active VMs
/// (bench/many-vms).
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// Builds one frame around `body`.
pub fn encode_frame(encoding: u8, body: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    if body.len() > MAX_FRAME {
        return Err(ProtocolError::TooLarge {
            len: body.len() as u64,
            max: MAX_FRAME as u64,
        });
    }
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&[encoding, 0, 0, 0]);
    out.extend_from_slice(&crc32(body).to_le_bytes());
    let hcrc = crc32(&out[..16]);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Incremental frame cutter: push bytes as they arrive, take frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
    skipped: u64,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.compact();
        self.buf.extend_from_slice(data);
    }

    /// Bytes held that do not yet form a complete frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Bytes discarded so far as garbage (no magic, bad checksums, oversize headers).
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped
    }

    /// Drops everything buffered (a torn frame of a previous connection).
    pub fn discard_buffered(&mut self) {
        self.skipped += self.buffered() as u64;
        self.buf.clear();
        self.start = 0;
    }

    fn compact(&mut self) {
        if self.start > 0 && (self.start >= self.buf.len() / 2 || self.start > 1 << 20) {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.is_empty() && self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
    }

    fn skip(&mut self, n: usize) {
        self.start += n;
        self.skipped += n as u64;
    }

    /// Cuts the next complete frame. `Ok(None)`: more bytes are needed.
    /// After an `Err` the offending header has been dropped; calling again
    /// continues with the bytes after it.
    pub fn next_frame(&mut self) -> Result<Option<RawFrame>, ProtocolError> {
        loop {
            let avail = &self.buf[self.start..];
            if let Some(i) = avail.windows(4).position(|w| w == MAGIC) {
                self.skip(i);
            } else {
                // Keep a tail that could be the beginning of a magic.
                let keep = avail.len().min(3);
                let tail_is_prefix = (1..=keep)
                    .rev()
                    .find(|&k| avail[avail.len() - k..] == MAGIC[..k])
                    .unwrap_or(0);
                let drop = avail.len() - tail_is_prefix;
                self.skip(drop);
                self.compact();
                return Ok(None);
            }
            let avail = &self.buf[self.start..];
            if avail.len() < HEADER_LEN {
                return Ok(None);
            }
            if crc32(&avail[..16]) != le32(avail, 16) {
                self.skip(1);
                continue;
            }
            let len = le32(avail, 4) as usize;
            if len > MAX_FRAME {
                self.skip(HEADER_LEN);
                return Err(ProtocolError::TooLarge {
                    len: len as u64,
                    max: MAX_FRAME as u64,
                });
            }
            if avail.len() < HEADER_LEN + len {
                return Ok(None);
            }
            let body = &avail[HEADER_LEN..HEADER_LEN + len];
            if crc32(body) != le32(avail, 12) {
                self.skip(1);
                continue;
            }
            let frame = RawFrame {
                encoding: avail[8],
                body: body.to_vec(),
            };
            self.start += HEADER_LEN + len;
            self.compact();
            return Ok(Some(frame));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_known_vector() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn frame_round_trip_and_prefix_tail_kept() {
        let f = encode_frame(ENCODING_JSON, b"{}").unwrap();
        let mut d = FrameDecoder::new();
        d.push(b"xxVM");
        assert!(d.next_frame().unwrap().is_none());
        assert_eq!(d.buffered(), 2, "the 'VM' tail may start a magic");
        d.push(b"zz");
        assert!(d.next_frame().unwrap().is_none());
        d.push(&f);
        let got = d.next_frame().unwrap().unwrap();
        assert_eq!(got.body, b"{}");
        assert_eq!(d.buffered(), 0);
        assert_eq!(d.skipped_bytes(), 6);
    }

    #[test]
    fn corrupted_body_is_skipped_and_following_frame_found() {
        let mut bad = encode_frame(ENCODING_JSON, b"{\"a\":1}").unwrap();
        let n = bad.len();
        bad[n - 2] ^= 0x55;
        let good = encode_frame(ENCODING_JSON, b"{\"b\":2}").unwrap();
        let mut d = FrameDecoder::new();
        d.push(&bad);
        d.push(&good);
        assert_eq!(d.next_frame().unwrap().unwrap().body, b"{\"b\":2}");
    }
}
