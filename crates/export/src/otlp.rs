//! A window as an OTLP profiles request (`ExportProfilesServiceRequest`,
//! profiles `v1development`, the `opentelemetry-proto` crate's types),
//! sent as HTTP/protobuf to `/v1development/profiles`.
//!
//! Layout: one `ResourceProfiles` per domain (the host's own work, then
//! each VM), its resource attributes `host.name`, `host.id`, `service.name`
//! (`host` or `vm/NAME`) and, for a VM, `vmscope.vm.name` and
//! `vmscope.vm.uuid`; one profile per resource with sample type
//! `cpu`/`nanoseconds` (the event count of cpu-clock), the window's start
//! and duration, a profile id stable for (host, window, domain), and the
//! profiler's cost in the window as profile attributes
//! (`vmscope.profiler.cpu`, `vmscope.profiler.observed_cpu` in seconds,
//! `vmscope.profiler.sample_rate` in Hz). Every sample carries
//! `vmscope.vm.name`, `vmscope.vm.uuid` (when known), `vmscope.context`,
//! `process.executable.name`, `vmscope.vcpu` (a VM's samples),
//! `thread.name` (a vCPU thread, `CPU n/KVM`) and `cpu.logical_number`
//! (the host CPU of the host's own samples). One dictionary (strings,
//! functions, mappings, locations, stacks, attributes) is shared by the
//! whole request, each table with its zero element first as the proto
//! requires.
//!
//! Receivers check the `OTLP-Profiles-Development-Version` header before
//! decoding (a 400 when they do not know it): [`DEVELOPMENT_VERSION`] is
//! the schema these types were generated from.

use crate::window::{profile_id, service_name, ProfileWindow};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::profiles::v1development as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use std::collections::HashMap;

/// The `OTLP-Profiles-Development-Version` header.
pub const VERSION_HEADER: &str = "OTLP-Profiles-Development-Version";
/// The profiles schema revision of `opentelemetry-proto` 0.33 (proto
/// 1.10): the first numbered one, what receivers assume without the header.
pub const DEVELOPMENT_VERSION: &str = "1";
/// Content type of OTLP/HTTP protobuf.
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// Interns everything the dictionary holds.
#[derive(Default)]
struct Dict {
    d: pb::ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(i32, i32), i32>,
    mappings: HashMap<i32, i32>,
    locations: HashMap<(i32, Vec<(i32, i64)>), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, AttrValue, i32), i32>,
}

/// An attribute value as a map key.
#[derive(Clone, PartialEq, Eq, Hash)]
enum AttrValue {
    Str(String),
    Int(i64),
    /// f64 bits.
    Double(u64),
}

fn idx(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

impl Dict {
    fn new() -> Dict {
        let mut d = Dict::default();
        // Every table's zero element.
        d.d.string_table.push(String::new());
        d.strings.insert(String::new(), 0);
        d.d.mapping_table.push(pb::Mapping::default());
        d.d.location_table.push(pb::Location::default());
        d.d.function_table.push(pb::Function::default());
        d.d.link_table.push(pb::Link::default());
        d.d.attribute_table.push(pb::KeyValueAndUnit::default());
        d.d.stack_table.push(pb::Stack::default());
        d
    }

    fn s(&mut self, text: &str) -> i32 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = idx(self.d.string_table.len());
        self.d.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), i);
        i
    }

    fn function(&mut self, name: &str, file: &str) -> i32 {
        let key = (self.s(name), self.s(file));
        if let Some(&i) = self.functions.get(&key) {
            return i;
        }
        let i = idx(self.d.function_table.len());
        self.d.function_table.push(pb::Function {
            name_strindex: key.0,
            system_name_strindex: key.0,
            filename_strindex: key.1,
            start_line: 0,
        });
        self.functions.insert(key, i);
        i
    }

    fn mapping(&mut self, file: &str, build_id: &str) -> i32 {
        let f = self.s(file);
        if let Some(&i) = self.mappings.get(&f) {
            return i;
        }
        let mut attribute_indices = Vec::new();
        if !build_id.is_empty() {
            attribute_indices.push(self.attr(
                "process.executable.build_id.gnu",
                AttrValue::Str(build_id.into()),
                "",
            ));
        }
        let i = idx(self.d.mapping_table.len());
        self.d.mapping_table.push(pb::Mapping {
            filename_strindex: f,
            attribute_indices,
            ..pb::Mapping::default()
        });
        self.mappings.insert(f, i);
        i
    }

    fn location(&mut self, mapping: i32, lines: Vec<(i32, i64)>) -> i32 {
        if let Some(&i) = self.locations.get(&(mapping, lines.clone())) {
            return i;
        }
        let i = idx(self.d.location_table.len());
        self.d.location_table.push(pb::Location {
            mapping_index: mapping,
            address: 0,
            lines: lines
                .iter()
                .map(|&(function_index, line)| pb::Line {
                    function_index,
                    line,
                    column: 0,
                })
                .collect(),
            attribute_indices: Vec::new(),
        });
        self.locations.insert((mapping, lines), i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = idx(self.d.stack_table.len());
        self.d.stack_table.push(pb::Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }

    fn attr(&mut self, key: &str, value: AttrValue, unit: &str) -> i32 {
        let k = (self.s(key), value, self.s(unit));
        if let Some(&i) = self.attributes.get(&k) {
            return i;
        }
        let v = match &k.1 {
            AttrValue::Str(s) => Value::StringValue(s.clone()),
            AttrValue::Int(n) => Value::IntValue(*n),
            AttrValue::Double(b) => Value::DoubleValue(f64::from_bits(*b)),
        };
        let i = idx(self.d.attribute_table.len());
        self.d.attribute_table.push(pb::KeyValueAndUnit {
            key_strindex: k.0,
            value: Some(AnyValue { value: Some(v) }),
            unit_strindex: k.2,
        });
        self.attributes.insert(k, i);
        i
    }
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.to_string())),
        }),
        ..KeyValue::default()
    }
}

/// `CPU n/KVM`-style vCPU thread names (QEMU's, with `debug-threads=on`).
fn is_vcpu_thread(name: &str) -> bool {
    name.strip_prefix("CPU ")
        .and_then(|r| r.split_once('/'))
        .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The window as one request.
pub fn request(w: &ProfileWindow) -> ExportProfilesServiceRequest {
    let p = &w.profile;
    let vi = w.value_index();
    let mut dict = Dict::new();
    let cpu = dict.s("cpu");
    let ns = dict.s("nanoseconds");
    // pprof ids → dictionary indices, made on first use.
    let functions: HashMap<u64, &vmscope_report::pprof::Function> =
        p.function.iter().map(|f| (f.id, f)).collect();
    let mappings: HashMap<u64, &vmscope_report::pprof::Mapping> =
        p.mapping.iter().map(|m| (m.id, m)).collect();
    let locations: HashMap<u64, &vmscope_report::pprof::Location> =
        p.location.iter().map(|l| (l.id, l)).collect();
    let mut by_domain: Vec<(String, Vec<pb::Sample>)> =
        w.domains().into_iter().map(|d| (d, Vec::new())).collect();
    let mut same: HashMap<(usize, i32, Vec<i32>), usize> = HashMap::new();
    for s in &p.sample {
        let value = s.value.get(vi).copied().unwrap_or(0);
        if value == 0 {
            continue;
        }
        let domain = w.label(s, "vm").unwrap_or("host").to_string();
        let mut locs = Vec::with_capacity(s.location_id.len());
        for id in &s.location_id {
            let Some(l) = locations.get(id) else { continue };
            let mapping = match mappings.get(&l.mapping_id) {
                Some(m) => {
                    let (f, b) = (
                        w.string(m.filename).to_string(),
                        w.string(m.build_id).to_string(),
                    );
                    dict.mapping(&f, &b)
                }
                None => 0,
            };
            let lines = l
                .line
                .iter()
                .map(|ln| {
                    let (name, file) = functions
                        .get(&ln.function_id)
                        .map_or(("", ""), |f| (w.string(f.name), w.string(f.filename)));
                    (dict.function(name, file), ln.line)
                })
                .collect();
            locs.push(dict.location(mapping, lines));
        }
        let stack_index = dict.stack(locs);
        let mut attrs = vec![dict.attr("vmscope.vm.name", AttrValue::Str(domain.clone()), "")];
        if let Some(u) = w.uuid_of(&domain) {
            attrs.push(dict.attr("vmscope.vm.uuid", AttrValue::Str(u.into()), ""));
        }
        if let Some(c) = w.label(s, "context") {
            attrs.push(dict.attr("vmscope.context", AttrValue::Str(c.into()), ""));
        }
        if let Some(pr) = w.label(s, "process") {
            attrs.push(dict.attr("process.executable.name", AttrValue::Str(pr.into()), ""));
            if is_vcpu_thread(pr) {
                attrs.push(dict.attr("thread.name", AttrValue::Str(pr.into()), ""));
            }
        }
        if let Some(v) = w.num_label(s, "vcpu") {
            attrs.push(dict.attr("vmscope.vcpu", AttrValue::Int(v), ""));
        }
        if let Some(c) = w.num_label(s, "cpu") {
            attrs.push(dict.attr("cpu.logical_number", AttrValue::Int(c), ""));
        }
        let sample = pb::Sample {
            stack_index,
            attribute_indices: attrs,
            link_index: 0,
            values: vec![value],
            timestamps_unix_nano: Vec::new(),
        };
        // Rows of one stack and labels in different seconds are one sample
        // (the proto asks samples of one identity to be combined).
        let at = by_domain
            .iter()
            .position(|(d, _)| *d == domain)
            .unwrap_or_else(|| {
                by_domain.push((domain, Vec::new()));
                by_domain.len() - 1
            });
        let key = (at, sample.stack_index, sample.attribute_indices.clone());
        if let Some(&j) = same.get(&key) {
            by_domain[at].1[j].values[0] += value;
        } else {
            same.insert(key, by_domain[at].1.len());
            by_domain[at].1.push(sample);
        }
    }
    let period = if p.period > 0 { p.period } else { 1 };
    let mut resource_profiles = Vec::new();
    for (domain, samples) in by_domain {
        let mut attributes = vec![
            kv("host.name", &w.host.name),
            kv("service.name", &service_name(&domain)),
        ];
        if !w.host.id.is_empty() {
            attributes.insert(1, kv("host.id", &w.host.id));
        }
        if domain != vmscope_model::HOST_DOMAIN {
            attributes.push(kv("vmscope.vm.name", &domain));
            if let Some(u) = w.uuid_of(&domain) {
                attributes.push(kv("vmscope.vm.uuid", u));
            }
        }
        let mut profile_attrs = Vec::new();
        if let Some(c) = w.costs.iter().find(|c| c.domain == domain) {
            profile_attrs.push(dict.attr(
                "vmscope.profiler.cpu",
                AttrValue::Double(c.cost_s.to_bits()),
                "s",
            ));
            profile_attrs.push(dict.attr(
                "vmscope.profiler.observed_cpu",
                AttrValue::Double(c.observed_s.to_bits()),
                "s",
            ));
            profile_attrs.push(dict.attr(
                "vmscope.profiler.sample_rate",
                AttrValue::Int(i64::try_from(c.rate_hz).unwrap_or(i64::MAX)),
                "Hz",
            ));
        }
        let profile = pb::Profile {
            sample_type: Some(pb::ValueType {
                type_strindex: cpu,
                unit_strindex: ns,
            }),
            samples,
            time_unix_nano: w.start_unix_nanos,
            duration_nano: w.duration_nanos,
            period_type: Some(pb::ValueType {
                type_strindex: cpu,
                unit_strindex: ns,
            }),
            period,
            profile_id: profile_id(&w.host, w.start_unix_nanos, &domain),
            dropped_attributes_count: 0,
            original_payload_format: String::new(),
            original_payload: Vec::new(),
            attribute_indices: profile_attrs,
        };
        resource_profiles.push(pb::ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Resource::default()
            }),
            scope_profiles: vec![pb::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "vmscope".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                profiles: vec![profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dict.d),
    }
}

/// The request's body.
pub fn encode(w: &ProfileWindow) -> Vec<u8> {
    request(w).encode_to_vec()
}

/// What a 2xx answer's body says: `Ok(None)` all accepted, `Ok(Some(msg))`
/// some profiles rejected (a partial success, not retried), `Err` when the
/// body is not an `ExportProfilesServiceResponse` at all.
pub fn check_response(body: &[u8]) -> Result<Option<String>, String> {
    let r = ExportProfilesServiceResponse::decode(body).map_err(|e| e.to_string())?;
    Ok(r.partial_success.and_then(|p| {
        (p.rejected_profiles > 0 || !p.error_message.is_empty()).then(|| {
            format!(
                "the receiver rejected {} profiles: {}",
                p.rejected_profiles, p.error_message
            )
        })
    }))
}

/// Whether a 400 answer says the receiver does not know this schema
/// revision (the OTLP profiles development-version rule): the body, a
/// `google.rpc.Status` or text, names the header.
pub fn is_version_rejection(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains(&VERSION_HEADER.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(d: &pb::ProfilesDictionary, ix: &[i32]) -> Vec<(String, String)> {
        ix.iter()
            .map(|&i| {
                let a = &d.attribute_table[i as usize];
                let v = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => s.clone(),
                    Some(Value::IntValue(n)) => n.to_string(),
                    Some(Value::DoubleValue(f)) => f.to_string(),
                    _ => String::new(),
                };
                (d.string_table[a.key_strindex as usize].clone(), v)
            })
            .collect()
    }

    #[test]
    fn a_window_becomes_one_resource_per_domain_with_every_label() {
        let w = crate::window::test_window();
        let r = ExportProfilesServiceRequest::decode(encode(&w).as_slice()).unwrap();
        let d = r.dictionary.as_ref().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.attribute_table[0], pb::KeyValueAndUnit::default());
        assert_eq!(d.stack_table[0], pb::Stack::default());
        assert_eq!(r.resource_profiles.len(), 2);
        let res = |i: usize| -> Vec<(String, String)> {
            r.resource_profiles[i]
                .resource
                .as_ref()
                .unwrap()
                .attributes
                .iter()
                .map(|k| match k.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => (k.key.clone(), s.clone()),
                    _ => (k.key.clone(), String::new()),
                })
                .collect()
        };
        let web = res(0);
        assert!(
            web.contains(&("service.name".into(), "vm/web".into())),
            "{web:?}"
        );
        assert!(web.contains(&("host.name".into(), "kvm-7".into())));
        assert!(web.contains(&("host.id".into(), "abc123".into())));
        assert!(web.contains(&(
            "vmscope.vm.uuid".into(),
            "5a1d0c0e-0000-4000-8000-000000000001".into()
        )));
        assert!(res(1).contains(&("service.name".into(), "host".into())));
        let prof = &r.resource_profiles[0].scope_profiles[0].profiles[0];
        let total: i64 = prof.samples.iter().map(|s| s.values[0]).sum();
        assert_eq!(total, 420_000_000);
        // One stack and attribute set in two seconds: one sample.
        assert_eq!(prof.samples.len(), 2);
        assert_eq!(prof.samples[0].values, [320_000_000]);
        assert_eq!(prof.duration_nano, 60_000_000_000);
        let a = attrs(d, &prof.samples[0].attribute_indices);
        for want in [
            ("vmscope.vm.name", "web"),
            ("vmscope.vm.uuid", "5a1d0c0e-0000-4000-8000-000000000001"),
            ("vmscope.context", "guest-user"),
            ("process.executable.name", "nginx"),
            ("vmscope.vcpu", "1"),
        ] {
            assert!(
                a.contains(&(want.0.into(), want.1.into())),
                "{want:?} in {a:?}"
            );
        }
        let a = attrs(d, &prof.samples[1].attribute_indices);
        assert!(
            a.contains(&("thread.name".into(), "CPU 0/TCG".into())),
            "{a:?}"
        );
        let cost = attrs(d, &prof.attribute_indices);
        assert!(
            cost.contains(&("vmscope.profiler.cpu".into(), "0.25".into())),
            "{cost:?}"
        );
        assert!(cost.contains(&("vmscope.profiler.sample_rate".into(), "99".into())));
        // Leaf first: the stack of the first sample is work, then main.
        let st = &d.stack_table[prof.samples[0].stack_index as usize];
        let leaf = &d.location_table[st.location_indices[0] as usize];
        let f = &d.function_table[leaf.lines[0].function_index as usize];
        assert_eq!(d.string_table[f.name_strindex as usize], "work");
        assert_eq!(leaf.lines[0].line, 7);
        let host = &r.resource_profiles[1].scope_profiles[0].profiles[0];
        let a = attrs(d, &host.samples[0].attribute_indices);
        assert!(
            a.contains(&("cpu.logical_number".into(), "1".into())),
            "{a:?}"
        );
        assert_ne!(prof.profile_id, host.profile_id);
        assert_eq!(prof.profile_id.len(), 16);
    }

    #[test]
    fn answers_are_read() {
        assert_eq!(check_response(b""), Ok(None));
        let partial = ExportProfilesServiceResponse {
            partial_success: Some(
                opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesPartialSuccess {
                    rejected_profiles: 2,
                    error_message: "bad".into(),
                },
            ),
        };
        assert!(check_response(&partial.encode_to_vec())
            .unwrap()
            .unwrap()
            .contains("rejected 2"));
        assert!(check_response(b"<html>hello</html>").is_err());
        assert!(is_version_rejection(
            b"invalid or unsupported otlp-profiles-development-version: supported version is 1"
        ));
        assert!(!is_version_rejection(b"bad request"));
    }
}
