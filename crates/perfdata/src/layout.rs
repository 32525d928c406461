//! Layout checks run before the perf.data parser sees a file.
//!
//! The parser (linux-perf-data) trusts sizes and counts it reads from the
//! file: it allocates what a header claims and divides by the attr size. This
//! module reads the file header, the attr, event-type and feature sections and
//! the framing of every record (headers only, bodies skipped: for a file as
//! the parser reads it, [`Framed`]), and turns
//! anything out of bounds into a [`PerfDataError`] naming the byte where the
//! file ends or the structure that contradicts itself. It also returns the raw
//! `type`/`config`/period of every attr, which the parser does not expose.

use crate::error::{Ctx, PerfDataError};
use std::cell::RefCell;
use std::io::{BufReader, ErrorKind, Read, Seek, SeekFrom};
use std::rc::Rc;

/// Size of `struct perf_file_header`.
pub(crate) const FILE_HEADER_SIZE: u64 = 104;
/// Size of `struct perf_pipe_file_header`.
pub(crate) const PIPE_HEADER_SIZE: u64 = 16;
/// `PERF_ATTR_SIZE_VER0`.
const ATTR_SIZE_MIN: u64 = 64;
/// Generous bound for one attr; current kernels use 136 bytes.
const ATTR_SIZE_MAX: u64 = 4096;

const MAGIC_LE: &[u8; 8] = b"PERFILE2";
const MAGIC_BE: &[u8; 8] = b"2ELIFREP";
const MAGIC_V1: &[u8; 8] = b"PERFFILE";

/// Whether `head` (the first 8 bytes of a stream, or fewer when it ended
/// sooner) can begin a perf.data file or pipe stream of any version: what
/// `import -` checks before it spools standard input.
pub fn could_be_perf_data(head: &[u8]) -> bool {
    let n = head.len().min(8);
    [MAGIC_LE, MAGIC_BE, MAGIC_V1]
        .iter()
        .any(|m| n > 0 && head[..n] == m[..n])
}

const FEATURE_EVENT_DESC: u32 = 12;

const RECORD_HEADER_ATTR: u32 = 64;
const RECORD_AUXTRACE: u32 = 71;
const RECORD_HEADER_FEATURE: u32 = 80;

/// Byte order of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endian {
    Little,
    Big,
}

impl Endian {
    #[inline]
    pub fn u16(self, b: &[u8], off: usize) -> Option<u16> {
        let a: [u8; 2] = b.get(off..off.checked_add(2)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u16::from_le_bytes(a),
            Endian::Big => u16::from_be_bytes(a),
        })
    }
    #[inline]
    pub fn u32(self, b: &[u8], off: usize) -> Option<u32> {
        let a: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u32::from_le_bytes(a),
            Endian::Big => u32::from_be_bytes(a),
        })
    }
    #[inline]
    pub fn u64(self, b: &[u8], off: usize) -> Option<u64> {
        let a: [u8; 8] = b.get(off..off.checked_add(8)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u64::from_le_bytes(a),
            Endian::Big => u64::from_be_bytes(a),
        })
    }
}

/// The fields of a `perf_event_attr` this crate needs beyond what the parser
/// exposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawAttr {
    pub type_: u32,
    pub config: u64,
    /// `sample_period` or `sample_freq` (see `freq`).
    pub period_or_freq: u64,
    pub freq: bool,
    pub sample_type: u64,
    pub read_format: u64,
}

/// `attr.flags` bit `freq`.
const ATTR_FLAG_FREQ: u64 = 1 << 10;

fn parse_raw_attr(b: &[u8], e: Endian) -> Option<RawAttr> {
    Some(RawAttr {
        type_: e.u32(b, 0)?,
        config: e.u64(b, 8)?,
        period_or_freq: e.u64(b, 16)?,
        sample_type: e.u64(b, 24)?,
        read_format: e.u64(b, 32)?,
        freq: e.u64(b, 40)? & ATTR_FLAG_FREQ != 0,
    })
}

/// What the checks found out about a file that passed them.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub endian: Endian,
    /// Piped format (`perf record -o -`): attrs and features travel as records.
    pub pipe: bool,
    /// Attrs in the order the parser numbers them.
    pub attrs: Vec<RawAttr>,
    /// The data section, whose record framing is checked as the parser
    /// reads it ([`Framed`]); `None` for a piped file, walked already.
    pub data: Option<(u64, u64)>,
    pub file_len: u64,
}

/// Read until `buf` is full or the input ends; returns the bytes read.
fn read_up_to<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A section (offset, size) of the file header.
#[derive(Debug, Clone, Copy)]
struct Section {
    offset: u64,
    size: u64,
}

impl Section {
    fn at(h: &[u8], off: usize, e: Endian) -> Option<Section> {
        Some(Section {
            offset: e.u64(h, off)?,
            size: e.u64(h, off + 8)?,
        })
    }
}

struct Checker<'a, R: Read + Seek> {
    r: &'a mut BufReader<R>,
    ctx: &'a Ctx,
    e: Endian,
    file_len: u64,
}

impl<R: Read + Seek> Checker<'_, R> {
    /// The end of `s`, which must lie inside the file.
    fn section_end(&self, s: Section, what: &str) -> Result<u64, PerfDataError> {
        let end = s.offset.checked_add(s.size).ok_or_else(|| {
            self.ctx.corrupt(format!(
                "{what} section (offset {}, size {}) overflows",
                s.offset, s.size
            ))
        })?;
        if end > self.file_len {
            return Err(self.ctx.truncated(
                self.file_len,
                format!("{what} section runs from byte {} to byte {end}", s.offset),
            ));
        }
        Ok(end)
    }

    /// Read a whole section that [`Checker::section_end`] accepted.
    fn read_section(&mut self, s: Section, what: &str) -> Result<Vec<u8>, PerfDataError> {
        self.section_end(s, what)?;
        let len = usize::try_from(s.size)
            .map_err(|_| self.ctx.corrupt(format!("{what} section too large")))?;
        let mut buf = vec![0; len];
        self.r
            .seek(SeekFrom::Start(s.offset))
            .map_err(|e| self.ctx.io(e))?;
        self.r.read_exact(&mut buf).map_err(|e| {
            if e.kind() == ErrorKind::UnexpectedEof {
                self.ctx
                    .truncated(self.file_len, format!("reading the {what} section"))
            } else {
                self.ctx.io(e)
            }
        })?;
        Ok(buf)
    }

    /// Walk the records from `start` to `end` through a [`Framing`]
    /// (piped files, whose attrs travel as records the parser needs first).
    fn walk_records(&mut self, start: u64, end: u64) -> Result<Framing, PerfDataError> {
        self.r
            .seek(SeekFrom::Start(start))
            .map_err(|e| self.ctx.io(e))?;
        let mut f = Framing::new(self.e, start, end, true, self.file_len);
        let mut buf = vec![0u8; 64 * 1024];
        while f.pos < end {
            let want = usize::try_from(end - f.pos).map_or(buf.len(), |w| w.min(buf.len()));
            let n = read_up_to(self.r, &mut buf[..want]).map_err(|e| self.ctx.io(e))?;
            if n == 0 {
                break;
            }
            f.feed(&buf[..n], self.ctx)?;
        }
        f.finish(self.ctx)?;
        Ok(f)
    }
}

/// The framing of the records from `start` to `end`, checked as their bytes
/// go by: every record header lies inside the range, no size is below its
/// 8-byte header or runs past the end, AUXTRACE payloads fit, HEADER_ATTR
/// and EVENT_DESC bodies parse. Bodies are skipped without being looked at.
///
/// For a perf.data file the parser's own reads of the data section pass
/// through it ([`Framed`]), so the file is read once: walking every record
/// first read the 171 MiB file of bench/vs-perf (b) twice, 334 MiB, and
/// made the import's reading thread 0.64 s against 0.20 s for the parser
/// alone.
pub(crate) struct Framing {
    e: Endian,
    end: u64,
    /// `end` is where the file stops (piped format), so a record crossing it
    /// is truncation rather than corruption.
    eof_ends: bool,
    file_len: u64,
    /// Absolute position of the next byte to feed.
    pos: u64,
    /// Start of the record being read.
    rec: u64,
    hdr: [u8; 8],
    hdr_len: usize,
    /// Bytes of the current record still to skip (body, AUXTRACE payload).
    skip: u64,
    /// The body being collected (AUXTRACE, HEADER_ATTR, HEADER_FEATURE).
    body: Vec<u8>,
    body_need: usize,
    rec_type: u32,
    rec_size: u64,
    /// HEADER_ATTR records met.
    pub attrs: Vec<RawAttr>,
    /// An error met: sticky.
    failed: bool,
}

impl Framing {
    pub fn new(e: Endian, start: u64, end: u64, eof_ends: bool, file_len: u64) -> Framing {
        Framing {
            e,
            end,
            eof_ends,
            file_len,
            pos: start,
            rec: start,
            hdr: [0; 8],
            hdr_len: 0,
            skip: 0,
            body: Vec::new(),
            body_need: 0,
            rec_type: 0,
            rec_size: 0,
            attrs: Vec::new(),
            failed: false,
        }
    }

    fn past_end(&self, ctx: &Ctx, what: String) -> PerfDataError {
        if self.eof_ends {
            ctx.truncated(self.file_len, what)
        } else {
            ctx.corrupt(format!(
                "{what}, past the data section's end at byte {}",
                self.end
            ))
        }
    }

    /// Check the bytes at [`Framing::pos`] onwards (those past the end are
    /// ignored).
    pub fn feed(&mut self, bytes: &[u8], ctx: &Ctx) -> Result<(), PerfDataError> {
        if self.failed {
            return Err(ctx.corrupt("record framing already failed"));
        }
        let r = self.feed_inner(bytes, ctx);
        self.failed = r.is_err();
        r
    }

    fn feed_inner(&mut self, bytes: &[u8], ctx: &Ctx) -> Result<(), PerfDataError> {
        let room = usize::try_from(self.end.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        let mut b = &bytes[..bytes.len().min(room)];
        while !b.is_empty() {
            if self.skip > 0 {
                let n = usize::try_from(self.skip).map_or(b.len(), |s| s.min(b.len()));
                self.skip -= n as u64;
                self.pos += n as u64;
                b = &b[n..];
                continue;
            }
            if self.body_need > 0 {
                let n = (self.body_need - self.body.len()).min(b.len());
                self.body.extend_from_slice(&b[..n]);
                self.pos += n as u64;
                b = &b[n..];
                if self.body.len() == self.body_need {
                    self.body_done(ctx)?;
                }
                continue;
            }
            if self.hdr_len == 0 {
                self.rec = self.pos;
                if self.end - self.pos < 8 {
                    return Err(self.past_end(
                        ctx,
                        format!("record header at byte {} is cut off", self.pos),
                    ));
                }
                // The common case: the whole header is here, and so is
                // often the whole record.
                if b.len() >= 8 {
                    let h: [u8; 8] = b[..8].try_into().unwrap_or([0; 8]);
                    self.pos += 8;
                    b = &b[8..];
                    self.header(h, ctx)?;
                    continue;
                }
            }
            let n = (8 - self.hdr_len).min(b.len());
            self.hdr[self.hdr_len..self.hdr_len + n].copy_from_slice(&b[..n]);
            self.hdr_len += n;
            self.pos += n as u64;
            b = &b[n..];
            if self.hdr_len == 8 {
                self.hdr_len = 0;
                self.header(self.hdr, ctx)?;
            }
        }
        Ok(())
    }

    /// A record's header has been read (`self.pos` is past it).
    fn header(&mut self, h: [u8; 8], ctx: &Ctx) -> Result<(), PerfDataError> {
        let pos = self.rec;
        let type_ = self.e.u32(&h, 0).unwrap_or(0);
        let size = u64::from(self.e.u16(&h, 6).unwrap_or(0));
        if size < 8 {
            return Err(ctx.corrupt(format!(
                "record at byte {pos} has size {size}, less than its 8-byte header"
            )));
        }
        if pos + size > self.end {
            return Err(self.past_end(ctx, format!("record at byte {pos} needs {size} bytes")));
        }
        self.rec_type = type_;
        self.rec_size = size;
        match type_ {
            RECORD_AUXTRACE | RECORD_HEADER_ATTR | RECORD_HEADER_FEATURE => {
                self.body.clear();
                self.body_need = (size - 8) as usize;
                if self.body_need == 0 {
                    self.body_done(ctx)?;
                }
            }
            _ => self.skip = size - 8,
        }
        Ok(())
    }

    /// The body of a record that is looked at has been read.
    fn body_done(&mut self, ctx: &Ctx) -> Result<(), PerfDataError> {
        let pos = self.rec;
        self.body_need = 0;
        match self.rec_type {
            RECORD_AUXTRACE => {
                let aux = self.e.u64(&self.body, 0).ok_or_else(|| {
                    ctx.corrupt(format!("AUXTRACE record at byte {pos} is too short"))
                })?;
                let rec_end = pos + self.rec_size;
                rec_end
                    .checked_add(aux)
                    .filter(|&x| x <= self.end)
                    .ok_or_else(|| {
                        self.past_end(
                            ctx,
                            format!("AUXTRACE record at byte {pos} carries {aux} bytes"),
                        )
                    })?;
                self.skip = aux;
            }
            RECORD_HEADER_ATTR => {
                let a = parse_raw_attr(&self.body, self.e).ok_or_else(|| {
                    ctx.corrupt(format!("HEADER_ATTR record at byte {pos} is too short"))
                })?;
                self.attrs.push(a);
            }
            _ => {
                if self.e.u64(&self.body, 0) == Some(u64::from(FEATURE_EVENT_DESC)) {
                    check_event_desc(&self.body[8..], self.e, ctx)?;
                }
            }
        }
        Ok(())
    }

    /// Every byte up to the end has been fed: the last record ends there.
    pub fn finish(&self, ctx: &Ctx) -> Result<(), PerfDataError> {
        if self.pos < self.end {
            // Only a file that ends early leaves bytes unfed.
            let what = if self.hdr_len > 0 || (self.skip == 0 && self.body_need == 0) {
                format!("record header at byte {} is cut off", self.rec)
            } else {
                format!("record at byte {} needs {} bytes", self.rec, self.rec_size)
            };
            return Err(ctx.truncated(self.file_len, what));
        }
        Ok(())
    }

    /// Whether every byte of the range went by.
    pub fn done(&self) -> bool {
        self.pos >= self.end
    }
}

/// A reader whose reads of the data section go through a [`Framing`] first
/// (set by [`FrameCheck::arm`]): the parser never sees the bytes of a record
/// whose framing is wrong; the read fails instead, and
/// [`FrameCheck::take_error`] says why. Reads elsewhere (headers, attrs,
/// feature sections) pass.
pub(crate) struct Framed<R> {
    inner: R,
    pos: u64,
    ctx: Ctx,
    check: Rc<RefCell<FrameCheck>>,
}

/// The state a [`Framed`] reader shares with whoever hands it to the parser
/// (which keeps the reader).
#[derive(Default)]
pub(crate) struct FrameCheck {
    framing: Option<Framing>,
    error: Option<PerfDataError>,
}

impl<R> Framed<R> {
    pub fn new(inner: R, ctx: &Ctx) -> (Framed<R>, Rc<RefCell<FrameCheck>>) {
        let check = Rc::new(RefCell::new(FrameCheck::default()));
        let r = Framed {
            inner,
            pos: 0,
            ctx: ctx.clone(),
            check: Rc::clone(&check),
        };
        (r, check)
    }
}

impl FrameCheck {
    /// Check the records of `[start, end)` as they are read.
    pub fn arm(&mut self, e: Endian, (start, end): (u64, u64), file_len: u64) {
        self.framing = Some(Framing::new(e, start, end, false, file_len));
    }

    /// Why a read failed, when the framing made it fail.
    pub fn take_error(&mut self) -> Option<PerfDataError> {
        self.error.take()
    }

    /// After the parser read every record: the framing saw them all.
    pub fn finish(&mut self, ctx: &Ctx) -> Result<(), PerfDataError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match &self.framing {
            Some(f) if !f.done() => Err(ctx.corrupt(format!(
                "the parser stopped at byte {} before the data section's end at byte {}",
                f.pos, f.end
            ))),
            _ => Ok(()),
        }
    }
}

fn framing_failed() -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, "record framing failed")
}

impl<R: Read> Read for Framed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut check = self.check.borrow_mut();
        if check.error.is_some() {
            return Err(framing_failed());
        }
        let n = self.inner.read(buf)?;
        let at = self.pos;
        self.pos += n as u64;
        if let Some(f) = check.framing.as_mut() {
            // Reads elsewhere (the header, attrs and features the parser
            // reads first, a data byte read again) pass unchecked; a read
            // past bytes never fed leaves the framing short, which
            // `finish` refuses.
            if f.pos < f.end && at <= f.pos && f.pos < self.pos {
                let from = (f.pos - at) as usize;
                if let Err(e) = f.feed(&buf[from..n], &self.ctx) {
                    check.error = Some(e);
                    return Err(framing_failed());
                }
            }
        }
        Ok(n)
    }
}

impl<R: Seek> Seek for Framed<R> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.pos = self.inner.seek(to)?;
        Ok(self.pos)
    }
}

/// Whether a feature table of `n` entries at `at` lies in the file and
/// every section it names does too.
fn feature_table_fits<R: Read + Seek>(c: &mut Checker<'_, R>, at: u64, n: usize) -> bool {
    if n == 0 {
        return at == c.file_len;
    }
    let table = Section {
        offset: at,
        size: n as u64 * 16,
    };
    let Ok(bytes) = c.read_section(table, "feature table") else {
        return false;
    };
    (0..n).all(|i| {
        Section::at(&bytes, i * 16, c.e).is_some_and(|s| {
            s.offset
                .checked_add(s.size)
                .is_some_and(|end| s.offset >= at && end <= c.file_len)
        })
    })
}

/// Walk an `EVENT_DESC` feature section; returns its attrs.
fn check_event_desc(s: &[u8], e: Endian, ctx: &Ctx) -> Result<Vec<RawAttr>, PerfDataError> {
    let bad = |what: &str| ctx.corrupt(format!("EVENT_DESC feature section: {what}"));
    let nr = e.u32(s, 0).ok_or_else(|| bad("too short"))?;
    let attr_size = u64::from(e.u32(s, 4).ok_or_else(|| bad("too short"))?);
    if !(ATTR_SIZE_MIN..=ATTR_SIZE_MAX).contains(&attr_size) {
        return Err(bad(&format!("attr size {attr_size}")));
    }
    let attr_size = attr_size as usize;
    let mut pos = 8usize;
    let mut attrs = Vec::new();
    for i in 0..nr {
        let attr = s
            .get(pos..pos + attr_size)
            .and_then(|b| parse_raw_attr(b, e))
            .ok_or_else(|| bad(&format!("event {i} of {nr} cut off")))?;
        pos += attr_size;
        let nr_ids = e.u32(s, pos).ok_or_else(|| bad("cut off"))? as usize;
        let str_len = e.u32(s, pos + 4).ok_or_else(|| bad("cut off"))? as usize;
        pos = nr_ids
            .checked_mul(8)
            .and_then(|ids| (pos + 8).checked_add(str_len)?.checked_add(ids))
            .filter(|&p| p <= s.len())
            .ok_or_else(|| bad(&format!("event {i} of {nr} cut off")))?;
        attrs.push(attr);
    }
    Ok(attrs)
}

/// Check the layout of the file behind `r` (any position); leaves `r` at an
/// unspecified position.
pub(crate) fn check<R: Read + Seek>(
    r: &mut BufReader<R>,
    ctx: &Ctx,
) -> Result<Layout, PerfDataError> {
    let file_len = r.seek(SeekFrom::End(0)).map_err(|e| ctx.io(e))?;
    r.seek(SeekFrom::Start(0)).map_err(|e| ctx.io(e))?;
    if file_len == 0 {
        return Err(PerfDataError::Empty {
            file: ctx.file.clone(),
        });
    }
    let mut h = [0u8; FILE_HEADER_SIZE as usize];
    let got = read_up_to(r, &mut h).map_err(|e| ctx.io(e))?;
    let magic_len = got.min(8);
    let endian = if h[..magic_len] == MAGIC_LE[..magic_len] {
        Endian::Little
    } else if h[..magic_len] == MAGIC_BE[..magic_len] {
        Endian::Big
    } else if h[..magic_len] == MAGIC_V1[..magic_len] && magic_len == 8 {
        return Err(ctx.unsupported(
            "version 1 (magic PERFFILE, perf before Linux 2.6.37); only version 2 (PERFILE2) is read",
        ));
    } else {
        return Err(PerfDataError::BadMagic {
            file: ctx.file.clone(),
        });
    };
    if got < PIPE_HEADER_SIZE as usize {
        return Err(ctx.truncated(
            file_len,
            format!("the file header needs at least {PIPE_HEADER_SIZE} bytes"),
        ));
    }
    let header_size = endian.u64(&h, 8).unwrap_or(0);
    let mut c = Checker {
        r,
        ctx,
        e: endian,
        file_len,
    };
    if header_size == PIPE_HEADER_SIZE {
        let attrs = c.walk_records(PIPE_HEADER_SIZE, file_len)?.attrs;
        if attrs.is_empty() {
            return Err(ctx.corrupt("piped perf.data without any HEADER_ATTR record"));
        }
        return Ok(Layout {
            endian,
            pipe: true,
            attrs,
            data: None,
            file_len,
        });
    }
    if header_size < FILE_HEADER_SIZE {
        return Err(ctx.corrupt(format!(
            "file header size {header_size} is neither {PIPE_HEADER_SIZE} (piped) nor at least {FILE_HEADER_SIZE}"
        )));
    }
    if (got as u64) < FILE_HEADER_SIZE || header_size > file_len {
        return Err(ctx.truncated(
            file_len,
            format!(
                "the file header needs {} bytes",
                header_size.max(FILE_HEADER_SIZE)
            ),
        ));
    }
    let attr_size = endian.u64(&h, 16).unwrap_or(0);
    let sect = |off| Section::at(&h, off, endian).unwrap_or(Section { offset: 0, size: 0 });
    let attr_sect = sect(24);
    let data = sect(40);
    let event_types = sect(56);
    let features: Vec<u32> = (0..4usize)
        .flat_map(|w| {
            let bits = endian.u64(&h, 72 + 8 * w).unwrap_or(0);
            (0..64u32)
                .filter(move |b| bits & (1u64 << b) != 0)
                .map(move |b| w as u32 * 64 + b)
        })
        .collect();

    // perf writes the header's final sizes when it closes the file; a
    // killed `perf record` leaves the data size 0 with records after it,
    // where the feature table would be (perf refuses such files the same
    // way). A file whose data section is really empty has a sound feature
    // table there.
    if data.size == 0
        && file_len > data.offset
        && !feature_table_fits(&mut c, data.offset, features.len())
    {
        return Err(PerfDataError::Unfinished {
            file: ctx.file.clone(),
        });
    }
    if !(ATTR_SIZE_MIN..=ATTR_SIZE_MAX).contains(&attr_size) {
        return Err(ctx.corrupt(format!("attr size {attr_size} in the file header")));
    }
    let attr_bytes = c.read_section(attr_sect, "attr")?;
    let mut attrs = Vec::new();
    for (i, entry) in attr_bytes.chunks_exact(attr_size as usize).enumerate() {
        if let Some(a) = parse_raw_attr(entry, endian) {
            attrs.push(a);
        }
        // perf_file_attr: the attr, then the (offset, size) of its id list.
        if attr_size >= ATTR_SIZE_MIN + 16 {
            if let Some(ids) = Section::at(entry, attr_size as usize - 16, endian) {
                c.section_end(ids, &format!("id list of attr {i}"))?;
            }
        }
    }
    let mut old_attrs = Vec::new();
    if event_types.size != 0 {
        let bytes = c.read_section(event_types, "event types")?;
        for (i, entry) in bytes.chunks_exact(attr_size as usize + 16).enumerate() {
            if let Some(a) = parse_raw_attr(entry, endian) {
                old_attrs.push(a);
            }
            if let Some(ids) = Section::at(entry, attr_size as usize, endian) {
                c.section_end(ids, &format!("id list of event type {i}"))?;
            }
        }
    }
    let data_end = c.section_end(data, "data")?;
    let table = Section {
        offset: data_end,
        size: features.len() as u64 * 16,
    };
    let table_bytes = c.read_section(table, "feature table")?;
    let mut desc_attrs = None;
    for (i, &feature) in features.iter().enumerate() {
        let s = Section::at(&table_bytes, i * 16, endian).unwrap_or(Section { offset: 0, size: 0 });
        c.section_end(s, &format!("feature {feature}"))?;
        if feature == FEATURE_EVENT_DESC {
            let bytes = c.read_section(s, "EVENT_DESC feature")?;
            desc_attrs = Some(check_event_desc(&bytes, endian, ctx)?);
        }
    }
    // The parser takes attrs from EVENT_DESC, else event types, else the attr section.
    let attrs = match desc_attrs {
        Some(d) => d,
        None if event_types.size != 0 => old_attrs,
        None => attrs,
    };
    Ok(Layout {
        endian,
        pipe: false,
        attrs,
        data: Some((data.offset, data_end)),
        file_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(type_: u32, size: u16) -> Vec<u8> {
        let mut r = type_.to_le_bytes().to_vec();
        r.extend_from_slice(&0u16.to_le_bytes());
        r.extend_from_slice(&size.to_le_bytes());
        r.resize(usize::from(size).max(8), 0xab);
        r
    }

    /// What feeding `bytes` (the records from byte 0) in chunks of `chunk`
    /// bytes says.
    fn framing_of(bytes: &[u8], chunk: usize) -> Result<(), String> {
        let ctx = Ctx { file: "t".into() };
        let mut f = Framing::new(
            Endian::Little,
            0,
            bytes.len() as u64,
            false,
            bytes.len() as u64,
        );
        for c in bytes.chunks(chunk) {
            f.feed(c, &ctx).map_err(|e| e.to_string())?;
        }
        f.finish(&ctx).map_err(|e| e.to_string())
    }

    /// Record headers and bodies split across reads at every byte give the
    /// same verdict as one read of the whole, sound or damaged.
    #[test]
    fn the_framing_does_not_depend_on_how_the_bytes_arrive() {
        let mut good = Vec::new();
        for (t, s) in [(9, 40), (1, 8), (3, 1000), (10, 17), (9, 64)] {
            good.extend(record(t, s));
        }
        // An AUXTRACE record whose payload follows it.
        let mut aux = record(RECORD_AUXTRACE, 48);
        aux[8..16].copy_from_slice(&24u64.to_le_bytes());
        good.extend(&aux);
        good.extend([0x11; 24]);
        good.extend(record(9, 16));
        assert_eq!(framing_of(&good, good.len()), Ok(()));
        let mut cases = vec![good.clone()];
        for at in [0, 40, 48, 1048] {
            let mut b = good.clone();
            b[at + 6] = 3; // size 3
            b[at + 7] = 0;
            cases.push(b);
        }
        let mut short = good.clone();
        short.truncate(good.len() - 3);
        cases.push(short);
        let mut big_aux = good.clone();
        let aux_at = good.len() - 16 - 24 - 48;
        big_aux[aux_at + 8..aux_at + 16].copy_from_slice(&1_000_000u64.to_le_bytes());
        cases.push(big_aux);
        for bytes in &cases {
            let whole = framing_of(bytes, bytes.len());
            for chunk in [1, 3, 7, 8, 9, 64] {
                assert_eq!(framing_of(bytes, chunk), whole, "chunks of {chunk}");
            }
        }
        let verdicts: Vec<_> = cases.iter().map(|b| framing_of(b, 5)).collect();
        assert!(verdicts[1..].iter().all(Result::is_err), "{verdicts:?}");
        assert!(
            verdicts[1]
                .as_ref()
                .unwrap_err()
                .contains("record at byte 0 has size 3"),
            "{verdicts:?}"
        );
        assert!(
            verdicts[6]
                .as_ref()
                .unwrap_err()
                .contains("carries 1000000 bytes"),
            "{verdicts:?}"
        );
    }
}
