//! pprof export (`report --format pprof -o FILE.pb.gz`): the session as
//! Go's profile.proto, gzipped, which `go tool pprof`, Parca and Pyroscope
//! read.
//!
//! - Sample types: per event, `<event>_samples`/`count` (samples as taken)
//!   and the event count in its unit (`cpu`/`nanoseconds` for cpu-clock and
//!   task-clock, as Go's CPU profiles; `<event>`/`count` otherwise). The
//!   default is the first event's count, which adds up across samplers.
//! - Labels on every sample: `vm` (the domain: `host` or a VM's name),
//!   `context`, `process`, and numeric `vcpu` (the vCPU a VM's sample ran
//!   on) and `cpu` (the host CPU, for the host's own samples).
//! - Locations: one per distinct frame; a frame and the functions inlined
//!   into it are one location with several lines (innermost first). The
//!   leaf location carries the row's mapping (image with its build-id where
//!   the session has it) and source line.
//!
//! The message types below are profile.proto's (github.com/google/pprof,
//! proto/profile.proto) written with prost's derive instead of generated
//! by prost-build, so building vmscope needs no protoc; field numbers and
//! types are the proto's.

use crate::stacks::vcpu_of_thread;
use crate::{event_unit, is_clock, ReportError, ReportOptions};
use flate2::write::GzEncoder;
use prost::Message;
use std::collections::HashMap;
use std::io::Write;
use vmscope_model::{ProfileRow, INLINED_SUFFIX, UNKNOWN_SLICE};
use vmscope_store::Session;

/// profile.proto `Profile`.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// profile.proto `ValueType`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// profile.proto `Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// profile.proto `Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// profile.proto `Mapping`.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// profile.proto `Location`.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// profile.proto `Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// profile.proto `Function`.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Builds a profile: interned strings, functions, mappings, locations.
#[derive(Default)]
struct Builder {
    p: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    mappings: HashMap<String, u64>,
    /// (mapping, lines as (function, line)) → location id.
    locations: HashMap<(u64, Vec<(u64, i64)>), u64>,
}

impl Builder {
    fn new() -> Builder {
        let mut b = Builder::default();
        b.s("");
        b
    }

    fn s(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), i);
        i
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        if let Some(&id) = self.functions.get(&(name.to_string(), file.to_string())) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let (n, f) = (self.s(name), self.s(file));
        self.p.function.push(Function {
            id,
            name: n,
            system_name: n,
            filename: f,
            start_line: 0,
        });
        self.functions.insert((name.into(), file.into()), id);
        id
    }

    fn mapping(&mut self, image: &str, build_id: Option<&String>) -> u64 {
        if let Some(&id) = self.mappings.get(image) {
            return id;
        }
        let id = self.p.mapping.len() as u64 + 1;
        let filename = self.s(image);
        let build_id = build_id.map_or(0, |b| self.s(b));
        self.p.mapping.push(Mapping {
            id,
            filename,
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Mapping::default()
        });
        self.mappings.insert(image.into(), id);
        id
    }

    fn location(&mut self, mapping: u64, lines: Vec<(u64, i64)>) -> u64 {
        if let Some(&id) = self.locations.get(&(mapping, lines.clone())) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(Location {
            id,
            mapping_id: mapping,
            line: lines
                .iter()
                .map(|&(function_id, line)| Line {
                    function_id,
                    line,
                    column: 0,
                })
                .collect(),
            ..Location::default()
        });
        self.locations.insert((mapping, lines), id);
        id
    }

    fn label(&mut self, key: &str, value: &str) -> Label {
        Label {
            key: self.s(key),
            str: self.s(value),
            ..Label::default()
        }
    }

    fn num_label(&mut self, key: &str, num: u32) -> Label {
        Label {
            key: self.s(key),
            num: i64::from(num),
            ..Label::default()
        }
    }
}

/// Frames of a stack grouped into locations: each real frame with the
/// frames inlined into it, innermost first (pprof's line order), root first.
fn frame_groups(stack: &str) -> Vec<Vec<&str>> {
    let mut groups: Vec<Vec<&str>> = Vec::new();
    for f in stack.split(';') {
        match f.strip_suffix(INLINED_SUFFIX) {
            Some(name) if !groups.is_empty() => {
                if let Some(g) = groups.last_mut() {
                    g.insert(0, name);
                }
            }
            Some(name) => groups.push(vec![name]),
            None => groups.push(vec![f]),
        }
    }
    groups
}

/// `(file, line)` of a `path:line` source line.
fn split_srcline(s: &str) -> (&str, i64) {
    match s.rsplit_once(':') {
        Some((f, l)) => (f, l.parse().unwrap_or(0)),
        None => (s, 0),
    }
}

/// The profile of a session in the options' view, slice and filters.
pub fn build(session: &Session, opts: &ReportOptions) -> Result<Profile, ReportError> {
    let events = session.events()?;
    let selected: Vec<u32> = match &opts.event {
        Some(name) => vec![crate::event_index(session, Some(name))?],
        None => (0..events.len() as u32).collect(),
    };
    let build_ids = session.build_ids()?;
    let meta = session.meta()?;
    let mut b = Builder::new();
    for &ev in &selected {
        let name = &events[ev as usize].name;
        let t = b.s(&format!("{name}_samples"));
        let u = b.s("count");
        b.p.sample_type.push(ValueType { r#type: t, unit: u });
        let (t, u) = if is_clock(name) {
            (b.s("cpu"), b.s("nanoseconds"))
        } else {
            (b.s(name), b.s("count"))
        };
        b.p.sample_type.push(ValueType { r#type: t, unit: u });
    }
    // The first event's count is what `go tool pprof` shows by default.
    b.p.default_sample_type = b.p.sample_type.get(1).map_or(0, |v| v.r#type);
    if let Some(&ev) = selected.first() {
        let e = &events[ev as usize];
        b.p.period_type = b.p.sample_type.get(1).cloned();
        b.p.period = match (e.period, e.frequency) {
            (Some(p), _) => p as i64,
            (_, Some(f)) if f > 0 && event_unit(&e.name) == "ns" => 1_000_000_000 / f as i64,
            _ => 1,
        };
    }
    b.p.time_nanos = meta
        .get("started_at")
        .and_then(|t| t.parse::<f64>().ok())
        .map_or(0, |t| (t * 1e9) as i64);
    b.p.duration_nanos = meta
        .get("duration_s")
        .and_then(|t| t.parse::<f64>().ok())
        .map_or(0, |t| (t * 1e9) as i64);
    // A profile `serve` answers is built from a temporary session: its
    // path means nothing to whoever reads the profile (and names a file
    // gone by then), so the comment says where the seconds come from.
    let what = match meta.get("source").map(String::as_str) {
        Some("serve --profile") => format!(
            "vmscope serve --profile{}: {} s of its rolling recording",
            meta.get("hostname")
                .map(|h| format!(" on {h}"))
                .unwrap_or_default(),
            meta.get("duration_s").map_or("?", String::as_str)
        ),
        _ => format!("vmscope session {}", session.path().display()),
    };
    let c = b.s(&what);
    b.p.comment.push(c);
    // What profiling cost, per domain (`go tool pprof -comments`).
    for (k, v) in meta.iter().filter(|(k, _)| k.starts_with("profiler_")) {
        let c = b.s(&format!(
            "profiling cost in {}: {v}",
            k.trim_start_matches("profiler_")
        ));
        b.p.comment.push(c);
    }

    let width = selected.len() * 2;
    for (i, &ev) in selected.iter().enumerate() {
        for r in crate::filtered_rows(session, opts, ev)? {
            let sample = sample_of(&mut b, &r, &build_ids, i, width);
            b.p.sample.push(sample);
        }
    }
    Ok(b.p)
}

fn sample_of(
    b: &mut Builder,
    r: &ProfileRow,
    build_ids: &HashMap<String, String>,
    column: usize,
    width: usize,
) -> Sample {
    let k = &r.key;
    let stack: &str = if k.stack.is_empty() {
        &k.symbol
    } else {
        &k.stack
    };
    let groups = frame_groups(stack);
    let mut location_id = Vec::with_capacity(groups.len());
    // Leaf first, as pprof wants.
    for (gi, g) in groups.iter().enumerate().rev() {
        let leaf = gi + 1 == groups.len();
        let (file, line) = if leaf {
            split_srcline(&k.srcline)
        } else {
            ("", 0)
        };
        let mut lines = Vec::with_capacity(g.len());
        for (li, name) in g.iter().enumerate() {
            // Only the innermost line of the leaf knows its source line.
            let (f, l) = if li == 0 { (file, line) } else { ("", 0) };
            let fid = b.function(name, f);
            lines.push((fid, l));
        }
        let mapping = if leaf {
            b.mapping(&k.image, build_ids.get(&*k.image))
        } else {
            0
        };
        location_id.push(b.location(mapping, lines));
    }
    let mut value = vec![0i64; width];
    value[column * 2] = r.samples as i64;
    value[column * 2 + 1] = r.period as i64;
    let mut label = vec![
        b.label("vm", &k.domain),
        b.label("context", k.context.as_str()),
        b.label("process", &k.process),
    ];
    let agent_row = k.context.is_guest() && vcpu_of_thread(&k.process).is_none();
    if let Some(v) = vcpu_of_thread(&k.process) {
        label.push(b.num_label("vcpu", v));
    } else if agent_row && k.cpu != UNKNOWN_SLICE {
        label.push(b.num_label("vcpu", k.cpu));
    }
    if !agent_row && k.cpu != UNKNOWN_SLICE {
        label.push(b.num_label("cpu", k.cpu));
    }
    Sample {
        location_id,
        value,
        label,
    }
}

/// Write the profile gzipped.
pub fn write(profile: &Profile, out: &mut dyn Write) -> Result<(), ReportError> {
    let mut gz = GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_frames_fold_into_their_callers_location() {
        assert_eq!(
            frame_groups("main;outer;inner (inlined);innermost (inlined);leaf"),
            vec![
                vec!["main"],
                vec!["innermost", "inner", "outer"],
                vec!["leaf"]
            ]
        );
        assert_eq!(split_srcline("/src/a.c:12"), ("/src/a.c", 12));
        let mut b = Builder::new();
        let f = b.function("f", "");
        assert_eq!(b.function("f", ""), f);
        let l = b.location(0, vec![(f, 0)]);
        assert_eq!(b.location(0, vec![(f, 0)]), l);
        assert_eq!(b.p.string_table[0], "");
    }
}
