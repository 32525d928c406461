//! Decoding of PERF_RECORD_SAMPLE bodies: the fields vmscope keeps (ids, IP,
//! pid/tid, time, CPU, period, call chain), every read bounds-checked, the call
//! chain left in place as bytes so the caller can reuse one buffer.

use crate::layout::Endian;

// perf_event_attr.sample_type bits (linux/perf_event.h).
pub(crate) const SAMPLE_IP: u64 = 1 << 0;
pub(crate) const SAMPLE_TID: u64 = 1 << 1;
pub(crate) const SAMPLE_TIME: u64 = 1 << 2;
pub(crate) const SAMPLE_ADDR: u64 = 1 << 3;
pub(crate) const SAMPLE_READ: u64 = 1 << 4;
pub(crate) const SAMPLE_CALLCHAIN: u64 = 1 << 5;
pub(crate) const SAMPLE_ID: u64 = 1 << 6;
pub(crate) const SAMPLE_CPU: u64 = 1 << 7;
pub(crate) const SAMPLE_PERIOD: u64 = 1 << 8;
pub(crate) const SAMPLE_STREAM_ID: u64 = 1 << 9;
pub(crate) const SAMPLE_IDENTIFIER: u64 = 1 << 16;

// perf_event_attr.read_format bits.
const READ_TOTAL_TIME_ENABLED: u64 = 1 << 0;
const READ_TOTAL_TIME_RUNNING: u64 = 1 << 1;
const READ_ID: u64 = 1 << 2;
const READ_GROUP: u64 = 1 << 3;
const READ_LOST: u64 = 1 << 4;

/// The kept fields of one sample; absent fields are zero / `None`
/// (an absent CPU is [`vmscope_model::UNKNOWN_SLICE`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sample<'a> {
    pub ip: u64,
    pub pid: u32,
    pub tid: u32,
    pub time: Option<u64>,
    pub cpu: u32,
    pub period: Option<u64>,
    /// Raw call chain entries (8 bytes each, file byte order), leaf first.
    pub callchain: &'a [u8],
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    e: Endian,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn u64(&mut self) -> Option<u64> {
        let v = self.e.u64(self.b, self.pos)?;
        self.pos += 8;
        Some(v)
    }
    #[inline]
    fn u32(&mut self) -> Option<u32> {
        let v = self.e.u32(self.b, self.pos)?;
        self.pos += 4;
        Some(v)
    }
    #[inline]
    fn skip_u64s(&mut self, n: u64) -> Option<()> {
        let bytes = usize::try_from(n).ok()?.checked_mul(8)?;
        let end = self.pos.checked_add(bytes)?;
        (end <= self.b.len()).then(|| self.pos = end)
    }
    fn take_u64s(&mut self, n: u64) -> Option<&'a [u8]> {
        let start = self.pos;
        self.skip_u64s(n)?;
        self.b.get(start..self.pos)
    }
}

/// Decode a sample body laid out by `sample_type` / `read_format`. `None` when
/// the body is shorter than its layout says.
pub(crate) fn parse(b: &[u8], e: Endian, sample_type: u64, read_format: u64) -> Option<Sample<'_>> {
    let has = |bit| sample_type & bit != 0;
    let mut c = Cursor { b, pos: 0, e };
    let mut s = Sample::default();
    if has(SAMPLE_IDENTIFIER) {
        c.u64()?;
    }
    if has(SAMPLE_IP) {
        s.ip = c.u64()?;
    }
    if has(SAMPLE_TID) {
        s.pid = c.u32()?;
        s.tid = c.u32()?;
    }
    if has(SAMPLE_TIME) {
        s.time = Some(c.u64()?);
    }
    if has(SAMPLE_ADDR) {
        c.u64()?;
    }
    if has(SAMPLE_ID) {
        c.u64()?;
    }
    if has(SAMPLE_STREAM_ID) {
        c.u64()?;
    }
    if has(SAMPLE_CPU) {
        s.cpu = c.u32()?;
        c.u32()?;
    } else {
        s.cpu = vmscope_model::UNKNOWN_SLICE;
    }
    if has(SAMPLE_PERIOD) {
        s.period = Some(c.u64()?);
    }
    if has(SAMPLE_READ) {
        let rf = |bit| u64::from(read_format & bit != 0);
        let times = rf(READ_TOTAL_TIME_ENABLED) + rf(READ_TOTAL_TIME_RUNNING);
        if read_format & READ_GROUP != 0 {
            let nr = c.u64()?;
            c.skip_u64s(times)?;
            let per = 1 + rf(READ_ID) + rf(READ_LOST);
            c.skip_u64s(nr.checked_mul(per)?)?;
        } else {
            c.skip_u64s(1 + times + rf(READ_ID) + rf(READ_LOST))?;
        }
    }
    if has(SAMPLE_CALLCHAIN) {
        let nr = c.u64()?;
        s.callchain = c.take_u64s(nr)?;
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn decodes_fields_in_kernel_order() {
        let st =
            SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_PERIOD | SAMPLE_CALLCHAIN;
        let body = le(&[0x401000, 7 | (8 << 32), 99, 3, 1000, 2, 0x401000, 0x402000]);
        let s = parse(&body, Endian::Little, st, 0).unwrap();
        assert_eq!(
            (s.ip, s.pid, s.tid, s.time, s.cpu),
            (0x401000, 7, 8, Some(99), 3)
        );
        assert_eq!(s.period, Some(1000));
        assert_eq!(s.callchain.len(), 16);
    }

    #[test]
    fn read_format_group_and_single() {
        let st = SAMPLE_IP | SAMPLE_READ | SAMPLE_CALLCHAIN;
        // Single: value, time_enabled, time_running, id.
        let rf = READ_TOTAL_TIME_ENABLED | READ_TOTAL_TIME_RUNNING | READ_ID;
        let body = le(&[1, 10, 11, 12, 13, 1, 0x5000]);
        let s = parse(&body, Endian::Little, st, rf).unwrap();
        assert_eq!(s.callchain, &0x5000u64.to_le_bytes()[..]);
        // Group of two with ids: nr, enabled, (value, id) x2.
        let rf = READ_GROUP | READ_TOTAL_TIME_ENABLED | READ_ID;
        let body = le(&[1, 2, 10, 20, 21, 30, 31, 1, 0x6000]);
        let s = parse(&body, Endian::Little, st, rf).unwrap();
        assert_eq!(s.callchain, &0x6000u64.to_le_bytes()[..]);
    }

    #[test]
    fn short_or_huge_bodies_are_rejected() {
        let st = SAMPLE_IP | SAMPLE_CALLCHAIN;
        assert!(parse(&le(&[1]), Endian::Little, st, 0).is_none());
        assert!(parse(&le(&[1, u64::MAX]), Endian::Little, st, 0).is_none());
        assert!(parse(&le(&[1, 1 << 61]), Endian::Little, st, 0).is_none());
        let rf = READ_GROUP;
        assert!(parse(&le(&[1, u64::MAX]), Endian::Little, st | SAMPLE_READ, rf).is_none());
    }
}
