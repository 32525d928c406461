//! Import of `perf.data` files written by `perf record` (file and piped
//! format, either byte order) into vmscope's normalized record stream.
//!
//! [`import`] and [`import_reader`] hand every sample, mapping, comm, fork,
//! exit and lost record to a sink, in time order, and return what the file's
//! header says about the recording ([`PerfDataInfo`]). Decoding of the format
//! is done by the `linux-perf-data` crate; this crate checks a file's layout
//! before that parser allocates from it ([`layout`](crate::layout) module),
//! decodes sample bodies itself, and maps perf's records onto
//! [`vmscope_model::Record`].
//!
//! Modules:
//! - `layout`: bounds checks of header, sections and record framing;
//! - `sample`: sample body decoding;
//! - `features`: BUILD_ID and CMDLINE feature sections;
//! - `convert`: the record loop and the mapping onto the model;
//! - `error`: [`PerfDataError`];
//! - [`testutil`]: a writer of small perf.data files, for tests. Always
//!   compiled (the linker drops it from binaries that do not call it): a
//!   feature for it made `cargo test` rebuild this crate, and the engine,
//!   serve, top and both binaries above it, with another feature set than
//!   the release build's, on every CI run.

mod convert;
mod error;
mod features;
mod layout;
mod sample;
pub mod testutil;

pub use error::PerfDataError;
pub use layout::could_be_perf_data;

use std::io::{BufReader, Read, Seek};
use std::path::Path;
use vmscope_model::{split_callchain, RawChain, Record, SampleRecord, SessionEvent};

/// What a perf.data file says about its recording.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerfDataInfo {
    /// One per attr, in attr order (= `SampleRecord::event`).
    pub events: Vec<SessionEvent>,
    pub hostname: Option<String>,
    pub os_release: Option<String>,
    pub perf_version: Option<String>,
    pub arch: Option<String>,
    /// CPUs online when recording.
    pub nr_cpus: Option<u32>,
    /// `perf record`'s command line.
    pub cmdline: Option<Vec<String>>,
    /// Time of the first and last sample (ns, perf clock).
    pub first_time: Option<u64>,
    pub last_time: Option<u64>,
    /// Samples handed to the sink.
    pub samples: u64,
    /// Samples the kernel dropped: the sum of LOST_SAMPLES records where the
    /// file has them (perf's "Total Lost Samples"), else of LOST records.
    pub lost: u64,
    /// Build ids from the BUILD_ID feature section: (path, id), in file order.
    pub build_ids: Vec<(String, Vec<u8>)>,
}

/// One record of [`import_raw`]: a sample with its call chain borrowed from
/// the file (the record's `callchain` is left empty), or any other record.
#[derive(Debug)]
pub enum RawRecord<'a> {
    Sample(SampleRecord, RawChain<'a>),
    Other(Record),
}

/// Read buffer size: large enough that a record rarely straddles two reads.
const READ_BUFFER: usize = 256 * 1024;

/// Read a perf.data file and hand every record to `sink` in time order.
///
/// `SampleRecord::event` is the attr index; sample ids are mapped to attrs
/// through the file's id tables.
pub fn import(path: &Path, sink: &mut dyn FnMut(Record)) -> Result<PerfDataInfo, PerfDataError> {
    let mut chain = Vec::new();
    import_raw(path, &mut |r| sink(owned(r, &mut chain)))
}

/// [`import`] with samples' call chains as the file has them, borrowed:
/// no allocation per sample.
pub fn import_raw(
    path: &Path,
    sink: &mut dyn FnMut(RawRecord<'_>),
) -> Result<PerfDataInfo, PerfDataError> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| PerfDataError::Io {
        file: name.clone(),
        source,
    })?;
    import_reader_raw(file, &name, sink)
}

/// [`import`] from any seekable reader; `name` names it in errors.
pub fn import_reader<R: Read + Seek>(
    reader: R,
    name: &str,
    sink: &mut dyn FnMut(Record),
) -> Result<PerfDataInfo, PerfDataError> {
    let mut chain = Vec::new();
    import_reader_raw(reader, name, &mut |r| sink(owned(r, &mut chain)))
}

/// [`import_raw`] from any seekable reader; `name` names it in errors.
pub fn import_reader_raw<R: Read + Seek>(
    reader: R,
    name: &str,
    sink: &mut dyn FnMut(RawRecord<'_>),
) -> Result<PerfDataInfo, PerfDataError> {
    let ctx = error::Ctx {
        file: name.to_string(),
    };
    let (framed, check) = layout::Framed::new(reader, &ctx);
    let mut r = BufReader::with_capacity(READ_BUFFER, framed);
    let layout = layout::check(&mut r, &ctx)?;
    if let Some(data) = layout.data {
        check.borrow_mut().arm(layout.endian, data, layout.file_len);
    }
    convert::run(r, &layout, &check, &ctx, sink)
}

/// A record with its call chain split into frames (`buf`: reused words).
fn owned(r: RawRecord<'_>, buf: &mut Vec<u64>) -> Record {
    match r {
        RawRecord::Sample(mut s, chain) => {
            if !chain.is_empty() {
                buf.clear();
                buf.extend(chain.words());
                s.callchain = split_callchain(buf, s.mode);
            }
            Record::Sample(s)
        }
        RawRecord::Other(r) => r,
    }
}
