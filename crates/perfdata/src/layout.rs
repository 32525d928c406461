//! Layout checks run before the perf.data parser sees a file.
//!
//! The parser (linux-perf-data) trusts sizes and counts it reads from the
//! file: it allocates what a header claims and divides by the attr size. This
//! module reads the file header, the attr, event-type and feature sections and
//! the framing of every record (headers only, bodies skipped), and turns
//! anything out of bounds into a [`PerfDataError`] naming the byte where the
//! file ends or the structure that contradicts itself. It also returns the raw
//! `type`/`config`/period of every attr, which the parser does not expose.

use crate::error::{Ctx, PerfDataError};
use std::io::{BufReader, ErrorKind, Read, Seek, SeekFrom};

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

const RECORD_LOST_SAMPLES: u32 = 13;
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
    /// The data holds LOST_SAMPLES records (perf ≥ 6.0 writes them at the end
    /// of a recording, counting again what LOST records counted).
    pub has_lost_samples: bool,
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
    lost_samples: bool,
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

    /// Walk the records from `start` to `end`. `eof_ends` says that `end` is
    /// where the file stops (piped format), so a record crossing it is
    /// truncation rather than corruption.
    fn walk_records(
        &mut self,
        start: u64,
        end: u64,
        eof_ends: bool,
        attrs: &mut Vec<RawAttr>,
    ) -> Result<(), PerfDataError> {
        self.r
            .seek(SeekFrom::Start(start))
            .map_err(|e| self.ctx.io(e))?;
        let mut pos = start;
        let mut body = Vec::new();
        while pos < end {
            let past_end = |this: &Self, what: String| {
                if eof_ends {
                    this.ctx.truncated(this.file_len, what)
                } else {
                    this.ctx
                        .corrupt(format!("{what}, past the data section's end at byte {end}"))
                }
            };
            if end - pos < 8 {
                return Err(past_end(
                    self,
                    format!("record header at byte {pos} is cut off"),
                ));
            }
            let mut h = [0u8; 8];
            self.r.read_exact(&mut h).map_err(|e| self.ctx.io(e))?;
            let type_ = self.e.u32(&h, 0).unwrap_or(0);
            let size = u64::from(self.e.u16(&h, 6).unwrap_or(0));
            if size < 8 {
                return Err(self.ctx.corrupt(format!(
                    "record at byte {pos} has size {size}, less than its 8-byte header"
                )));
            }
            let mut rec_end = pos + size;
            if rec_end > end {
                return Err(past_end(
                    self,
                    format!("record at byte {pos} needs {size} bytes"),
                ));
            }
            self.lost_samples |= type_ == RECORD_LOST_SAMPLES;
            let mut consumed = 8u64;
            let body_len = (size - 8) as usize;
            match type_ {
                RECORD_AUXTRACE | RECORD_HEADER_ATTR | RECORD_HEADER_FEATURE => {
                    body.resize(body_len, 0);
                    self.r.read_exact(&mut body).map_err(|e| self.ctx.io(e))?;
                    consumed = size;
                    if type_ == RECORD_AUXTRACE {
                        let aux = self.e.u64(&body, 0).ok_or_else(|| {
                            self.ctx
                                .corrupt(format!("AUXTRACE record at byte {pos} is too short"))
                        })?;
                        rec_end =
                            rec_end
                                .checked_add(aux)
                                .filter(|&x| x <= end)
                                .ok_or_else(|| {
                                    past_end(
                                        self,
                                        format!(
                                            "AUXTRACE record at byte {pos} carries {aux} bytes"
                                        ),
                                    )
                                })?;
                    } else if type_ == RECORD_HEADER_ATTR {
                        let a = parse_raw_attr(&body, self.e).ok_or_else(|| {
                            self.ctx
                                .corrupt(format!("HEADER_ATTR record at byte {pos} is too short"))
                        })?;
                        attrs.push(a);
                    } else if self.e.u64(&body, 0) == Some(u64::from(FEATURE_EVENT_DESC)) {
                        check_event_desc(&body[8..], self.e, self.ctx)?;
                    }
                }
                _ => {}
            }
            let skip = rec_end - pos - consumed;
            if skip > 0 {
                let skip = i64::try_from(skip)
                    .map_err(|_| self.ctx.corrupt(format!("record at byte {pos} too large")))?;
                self.r.seek_relative(skip).map_err(|e| self.ctx.io(e))?;
            }
            pos = rec_end;
        }
        Ok(())
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
        lost_samples: false,
    };
    if header_size == PIPE_HEADER_SIZE {
        let mut attrs = Vec::new();
        c.walk_records(PIPE_HEADER_SIZE, file_len, true, &mut attrs)?;
        if attrs.is_empty() {
            return Err(ctx.corrupt("piped perf.data without any HEADER_ATTR record"));
        }
        return Ok(Layout {
            endian,
            pipe: true,
            attrs,
            has_lost_samples: c.lost_samples,
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
    c.walk_records(data.offset, data_end, false, &mut Vec::new())?;
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
        has_lost_samples: c.lost_samples,
    })
}
