//! The record loop: opens a checked file with `linux-perf-data`, reads its
//! metadata into [`PerfDataInfo`] and maps each perf record onto a
//! [`vmscope_model::Record`] (samples, MMAP/MMAP2, COMM, FORK, EXIT, LOST,
//! LOST_SAMPLES); other record types are skipped.

use crate::error::{Ctx, PerfDataError};
use crate::layout::{Endian, FrameCheck, Layout};
use crate::{features, sample, PerfDataInfo, RawRecord};
use linux_perf_data::linux_perf_event_reader::{
    EventRecord, Mmap2FileId, RawEventRecord, RecordType, SamplingPolicy,
};
use linux_perf_data::{Feature, PerfFileReader, PerfFileRecord};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;
use vmscope_model::{CpuMode, EventKind, RawChain, Record, SampleRecord, SessionEvent};

/// `PERF_RECORD_MISC_MMAP_BUILD_ID`: an MMAP2 record carries a build id.
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
/// `perf_event_attr.build_id` (flag bit 34): MMAP2 records carry build ids.
const ATTR_BUILD_ID: u64 = 1 << 34;
/// `PROT_EXEC`.
const PROT_EXEC: u32 = 4;
/// `PERF_TYPE_RAW`.
const PERF_TYPE_RAW: u32 = 4;

/// How to decode the samples of one attr.
#[derive(Debug, Clone, Copy)]
struct AttrDecode {
    sample_type: u64,
    read_format: u64,
    /// Period of samples whose sample_type lacks PERIOD.
    fixed_period: u64,
    /// `attr.build_id`: the session asked for build ids in MMAP2 records.
    build_id: bool,
}

/// Build ids by path, with bracketed kernel names also found by prefix
/// (`[kernel.kallsyms]_text` → `[kernel.kallsyms]`).
struct BuildIds(HashMap<String, Arc<[u8]>>);

impl BuildIds {
    fn get(&self, path: &str) -> Option<Arc<[u8]>> {
        if let Some(b) = self.0.get(path) {
            return Some(b.clone());
        }
        if path.starts_with('[') {
            let end = path.find(']')?;
            return self.0.get(&path[..=end]).cloned();
        }
        None
    }
}

fn parse_error(ctx: &Ctx, e: linux_perf_data::Error) -> PerfDataError {
    match e {
        linux_perf_data::Error::IoError(io)
            if !matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::InvalidData
                    | std::io::ErrorKind::InvalidInput
                    | std::io::ErrorKind::Unsupported
            ) =>
        {
            ctx.io(io)
        }
        linux_perf_data::Error::IoError(io) => ctx.corrupt(format!("cannot parse: {io}")),
        e => ctx.corrupt(format!("cannot parse: {e}")),
    }
}

fn event_name(raw: Option<&crate::layout::RawAttr>, desc: Option<&str>) -> String {
    let kind = raw.and_then(|a| EventKind::from_perf_type_config(a.type_, a.config));
    match (kind, desc, raw) {
        // perf's name of a raw PMU event is more telling than rNNNN.
        (Some(k), _, Some(a)) if a.type_ != PERF_TYPE_RAW => k.name(),
        (_, Some(d), _) if !d.is_empty() => d.to_string(),
        (Some(k), _, _) => k.name(),
        (None, _, Some(a)) => format!("type:{} config:{:#x}", a.type_, a.config),
        (None, _, None) => "unknown".to_string(),
    }
}

/// Import from a reader whose layout [`crate::layout::check`] accepted.
pub(crate) fn run<R: Read + Seek>(
    r: BufReader<R>,
    layout: &Layout,
    check: &Rc<RefCell<FrameCheck>>,
    ctx: &Ctx,
    sink: &mut dyn FnMut(RawRecord<'_>),
) -> Result<PerfDataInfo, PerfDataError> {
    // The parser is a dependency fed with hostile input; if it panics
    // despite the layout checks, report the file as corrupt. Panics raised
    // by the sink are the caller's and propagate unchanged.
    let in_sink = Cell::new(false);
    let mut guarded = |rec: RawRecord<'_>| {
        in_sink.set(true);
        sink(rec);
        in_sink.set(false);
    };
    // A read the record framing refused fails the parser: the framing's
    // error says why.
    let framing = |e: PerfDataError| check.borrow_mut().take_error().unwrap_or(e);
    match catch_unwind(AssertUnwindSafe(|| run_inner(r, layout, ctx, &mut guarded))) {
        Ok(Ok(info)) => {
            check.borrow_mut().finish(ctx)?;
            Ok(info)
        }
        Ok(Err(e)) => Err(framing(e)),
        Err(p) if in_sink.get() => resume_unwind(p),
        Err(_) => Err(framing(
            ctx.corrupt("the perf.data parser rejected malformed records"),
        )),
    }
}

fn run_inner<R: Read + Seek>(
    mut r: BufReader<R>,
    layout: &Layout,
    ctx: &Ctx,
    sink: &mut dyn FnMut(RawRecord<'_>),
) -> Result<PerfDataInfo, PerfDataError> {
    r.seek(SeekFrom::Start(0)).map_err(|e| ctx.io(e))?;
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = if layout.pipe {
        PerfFileReader::parse_pipe(r)
    } else {
        PerfFileReader::parse_file(r)
    }
    .map_err(|e| parse_error(ctx, e))?;
    let e = layout.endian;

    let attrs = perf_file.event_attributes();
    let raw_ok = layout.attrs.len() == attrs.len();
    let mut events = Vec::with_capacity(attrs.len());
    let mut decode = Vec::with_capacity(attrs.len());
    for (i, a) in attrs.iter().enumerate() {
        let raw = raw_ok.then(|| &layout.attrs[i]);
        let (period, frequency) = match a.attr.sampling_policy {
            SamplingPolicy::Period(p) => (Some(p.get()), None),
            SamplingPolicy::Frequency(f) => (None, Some(f)),
            SamplingPolicy::NoSampling => (None, None),
        };
        events.push(SessionEvent {
            name: event_name(raw, a.name()),
            period,
            frequency,
        });
        decode.push(AttrDecode {
            sample_type: raw.map_or(a.attr.sample_format.bits(), |r| r.sample_type),
            read_format: raw.map_or(a.attr.read_format.bits(), |r| r.read_format),
            fixed_period: period.unwrap_or(1),
            build_id: a.attr.flags.bits() & ATTR_BUILD_ID != 0,
        });
    }

    let text = |f: Feature| -> Option<String> {
        let s = perf_file.feature_section_data(f)?;
        let len = e.u32(s, 0)? as usize;
        let b = s.get(4..4usize.checked_add(len)?)?;
        let b = &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())];
        Some(String::from_utf8_lossy(b).into_owned())
    };
    let build_ids = perf_file
        .feature_section_data(Feature::BUILD_ID)
        .map(|s| features::build_ids(s, e))
        .unwrap_or_default();
    let mut info = PerfDataInfo {
        events,
        hostname: text(Feature::HOSTNAME),
        os_release: text(Feature::OSRELEASE),
        perf_version: text(Feature::VERSION),
        arch: text(Feature::ARCH),
        nr_cpus: perf_file
            .feature_section_data(Feature::NRCPUS)
            .and_then(|s| e.u32(s, 4)),
        cmdline: perf_file
            .feature_section_data(Feature::CMDLINE)
            .and_then(|s| features::string_list(s, e)),
        build_ids,
        ..PerfDataInfo::default()
    };
    let by_path = BuildIds(
        info.build_ids
            .iter()
            .map(|(p, b)| (p.clone(), Arc::from(b.as_slice())))
            .collect(),
    );

    let mut conv = Converter {
        ctx,
        e,
        held_lost: Vec::new(),
        lost_samples: false,
        decode,
        by_path,
    };
    while let Some(rec) = record_iter
        .next_record(&mut perf_file)
        .map_err(|err| parse_error(ctx, err))?
    {
        if let PerfFileRecord::EventRecord { attr_index, record } = rec {
            conv.event(attr_index, &record, &mut info, sink)?;
        }
    }
    if !conv.lost_samples {
        for (cpu, count) in conv.held_lost.drain(..) {
            info.lost = info.lost.saturating_add(count);
            sink(RawRecord::Other(Record::Lost { cpu, count }));
        }
    }
    Ok(info)
}

struct Converter<'a> {
    ctx: &'a Ctx,
    e: Endian,
    /// LOST records (CPU, count), held to the end: when the file also has
    /// LOST_SAMPLES records (perf ≥ 6.0 writes them at the end of a
    /// recording), those count the loss and these would count it twice
    /// (perf's "Total Lost Samples" sums LOST_SAMPLES). Losses are counted
    /// per event, so handing them on last changes nothing else.
    held_lost: Vec<(Option<u32>, u64)>,
    lost_samples: bool,
    decode: Vec<AttrDecode>,
    by_path: BuildIds,
}

/// `PERF_RECORD_KSYMBOL_TYPE_BPF` and `PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER`
/// (include/uapi/linux/perf_event.h).
const KSYMBOL_TYPE_BPF: u16 = 1;
const KSYMBOL_FLAGS_UNREGISTER: u16 = 1;

fn lossy(b: &[u8]) -> Arc<str> {
    match std::str::from_utf8(b) {
        Ok(s) => Arc::from(s),
        Err(_) => Arc::from(String::from_utf8_lossy(b).as_ref()),
    }
}

impl Converter<'_> {
    fn event(
        &mut self,
        attr: usize,
        rec: &RawEventRecord<'_>,
        info: &mut PerfDataInfo,
        sink: &mut dyn FnMut(RawRecord<'_>),
    ) -> Result<(), PerfDataError> {
        let mut other = |r: Record| sink(RawRecord::Other(r));
        let bad = |what: &str| {
            self.ctx
                .corrupt(format!("malformed {what} record (event {attr})"))
        };
        let time = || {
            rec.common_data()
                .ok()
                .and_then(|c| c.timestamp)
                .unwrap_or(0)
        };
        match rec.record_type {
            RecordType::SAMPLE => {
                let d = *self.decode.get(attr).ok_or_else(|| bad("SAMPLE"))?;
                let body = rec.data.as_slice();
                let s = sample::parse(&body, self.e, d.sample_type, d.read_format)
                    .ok_or_else(|| bad("SAMPLE"))?;
                let mode = CpuMode::from_misc(rec.misc);
                let chain = RawChain::new(s.callchain, matches!(self.e, Endian::Big));
                let time = s.time.unwrap_or(0);
                if s.time.is_some() {
                    info.first_time = Some(info.first_time.map_or(time, |t| t.min(time)));
                    info.last_time = Some(info.last_time.map_or(time, |t| t.max(time)));
                }
                info.samples += 1;
                let rec = SampleRecord {
                    event: attr as u32,
                    ip: s.ip,
                    pid: s.pid,
                    tid: s.tid,
                    cpu: s.cpu,
                    time,
                    mode,
                    period: s.period.unwrap_or(d.fixed_period),
                    callchain: Vec::new(),
                };
                sink(RawRecord::Sample(rec, chain));
            }
            RecordType::MMAP => {
                let Ok(EventRecord::Mmap(m)) = rec.parse() else {
                    return Err(bad("MMAP"));
                };
                let path = lossy(&m.path.as_slice());
                other(Record::Mmap {
                    pid: m.pid as u32,
                    tid: m.tid as u32,
                    start: m.address,
                    len: m.length,
                    pgoff: m.page_offset,
                    build_id: self.by_path.get(&path),
                    path,
                    executable: m.is_executable,
                    time: time(),
                });
            }
            RecordType::MMAP2 => {
                // The kernel (6.18 here) sets MISC_MMAP_BUILD_ID on the MMAP2
                // record it shares among every listener as soon as one that
                // asked for build ids (`perf record --buildid-mmap`, a
                // vmscope recording) gets it, and never clears it: a
                // session that did not ask then gets the bit over the
                // device/inode layout (maj, min, ino). perf's own tools
                // assert on such records (util/build-id.c). Without
                // attr.build_id on any event the bit can only be that leak:
                // read the record as what it is, with no build id.
                let leaked;
                let rec = if rec.misc & MISC_MMAP_BUILD_ID != 0
                    && !self.decode.iter().any(|d| d.build_id)
                {
                    let mut r = rec.clone();
                    r.misc &= !MISC_MMAP_BUILD_ID;
                    leaked = r;
                    &leaked
                } else {
                    rec
                };
                // The parser asserts on an out-of-range build-id length.
                if rec.misc & MISC_MMAP_BUILD_ID != 0
                    && rec.data.get(32..33).is_some_and(|b| b.as_slice()[0] > 20)
                {
                    return Err(bad("MMAP2"));
                }
                let Ok(EventRecord::Mmap2(m)) = rec.parse() else {
                    return Err(bad("MMAP2"));
                };
                let path = lossy(&m.path.as_slice());
                let build_id = match m.file_id {
                    Mmap2FileId::BuildId(b) if !b.is_empty() => Some(Arc::from(b.as_slice())),
                    _ => self.by_path.get(&path),
                };
                other(Record::Mmap {
                    pid: m.pid as u32,
                    tid: m.tid as u32,
                    start: m.address,
                    len: m.length,
                    pgoff: m.page_offset,
                    path,
                    build_id,
                    executable: m.protection & PROT_EXEC != 0,
                    time: time(),
                });
            }
            RecordType::COMM => {
                let Ok(EventRecord::Comm(c)) = rec.parse() else {
                    return Err(bad("COMM"));
                };
                other(Record::Comm {
                    pid: c.pid as u32,
                    tid: c.tid as u32,
                    comm: lossy(&c.name.as_slice()),
                    exec: c.is_execve,
                    time: time(),
                });
            }
            RecordType::FORK => {
                let Ok(EventRecord::Fork(f)) = rec.parse() else {
                    return Err(bad("FORK"));
                };
                other(Record::Fork {
                    pid: f.pid as u32,
                    ppid: f.ppid as u32,
                    tid: f.tid as u32,
                    ptid: f.ptid as u32,
                    time: f.timestamp,
                });
            }
            RecordType::EXIT => {
                let Ok(EventRecord::Exit(f)) = rec.parse() else {
                    return Err(bad("EXIT"));
                };
                other(Record::Exit {
                    pid: f.pid as u32,
                    tid: f.tid as u32,
                    time: f.timestamp,
                });
            }
            RecordType::KSYMBOL => {
                // { u64 addr; u32 len; u16 ksym_type; u16 flags; char
                // name[] (NUL-terminated, padded); sample_id }
                let body = rec.data.as_slice();
                let e = self.e;
                let parsed = (|| {
                    let name = body.get(16..)?;
                    let name = &name[..name.iter().position(|&b| b == 0)?];
                    Some(Record::Ksymbol {
                        addr: e.u64(&body, 0)?,
                        len: u64::from(e.u32(&body, 8)?),
                        bpf: e.u16(&body, 12)? == KSYMBOL_TYPE_BPF,
                        unregister: e.u16(&body, 14)? & KSYMBOL_FLAGS_UNREGISTER != 0,
                        name: lossy(name),
                        time: time(),
                    })
                })();
                other(parsed.ok_or_else(|| bad("KSYMBOL"))?);
            }
            RecordType::LOST | RecordType::LOST_SAMPLES => {
                // LOST: { u64 id; u64 lost; }  LOST_SAMPLES: { u64 lost; }
                let lost = rec.record_type == RecordType::LOST;
                let body = rec.data.as_slice();
                let count = self
                    .e
                    .u64(&body, if lost { 8 } else { 0 })
                    .ok_or_else(|| bad("LOST"))?;
                let cpu = rec.common_data().ok().and_then(|c| c.cpu);
                if lost {
                    self.held_lost.push((cpu, count));
                } else {
                    self.lost_samples = true;
                    info.lost = info.lost.saturating_add(count);
                    other(Record::Lost { cpu, count });
                }
            }
            _ => {}
        }
        Ok(())
    }
}
