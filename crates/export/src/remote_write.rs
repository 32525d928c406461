//! The `/metrics` series as a Prometheus remote-write request (version 1:
//! a `prometheus.WriteRequest` in protobuf, snappy block-compressed), for
//! hosts that no Prometheus can scrape.
//!
//! The input is the OpenMetrics text `serve` answers at `/metrics` (one
//! encoder, so pushed and scraped series never differ); each sample line
//! becomes a series with the sample's name as `__name__`, its labels
//! (escapes undone), and the labels a scrape would have added: `job`
//! (`vmscope`) and `instance` (the host name). All samples of one request
//! carry the time the metrics were taken. The message types are
//! remote-write's (prometheus/prompb `types.proto`, `remote.proto`)
//! written with prost's derive.

use prost::Message;

/// prompb `WriteRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

/// prompb `TimeSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// Sorted by name.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// prompb `Label`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// prompb `Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// prompb `MetricMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricMetadata {
    /// prompb `MetricType`: 1 counter, 2 gauge, 0 unknown.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    #[prost(string, tag = "4")]
    pub help: String,
    #[prost(string, tag = "5")]
    pub unit: String,
}

/// Headers remote-write v1 requires besides the content type.
pub const HEADERS: [(&str, &str); 1] = [("X-Prometheus-Remote-Write-Version", "0.1.0")];
pub const CONTENT_TYPE: &str = "application/x-protobuf";
pub const CONTENT_ENCODING: &str = "snappy";

/// A sample line: name, labels (escapes undone), value.
type SampleLine = (String, Vec<(String, String)>, f64);

/// One sample line: name, labels as written (escapes undone), value.
fn parse_line(line: &str) -> Result<SampleLine, String> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return Err("no value".into()),
    };
    let mut labels = Vec::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let end = loop {
            // name
            let mut key = String::new();
            while let Some(&(_, c)) = chars.peek() {
                if c == '=' || c == '}' {
                    break;
                }
                key.push(c);
                chars.next();
            }
            match chars.next() {
                Some((i, '}')) if key.trim().is_empty() => break i,
                Some((_, '=')) => {}
                _ => return Err("a label without a value".into()),
            }
            if chars.next().map(|x| x.1) != Some('"') {
                return Err("a label value without quotes".into());
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next().map(|x| x.1) {
                        Some('n') => value.push('\n'),
                        Some(c) => value.push(c),
                        None => return Err("an escape at the end".into()),
                    },
                    Some((_, '"')) => break,
                    Some((_, c)) => value.push(c),
                    None => return Err("an unterminated label value".into()),
                }
            }
            labels.push((key.trim().trim_start_matches(',').trim().to_string(), value));
            match chars.next() {
                Some((_, ',')) => {
                    // `,}` ends the set too.
                    if let Some(&(i, '}')) = chars.peek() {
                        break i;
                    }
                }
                Some((i, '}')) => break i,
                _ => return Err("labels not closed".into()),
            }
        };
        &body[end + 1..]
    } else {
        rest
    };
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse::<f64>().map_err(|e| format!("value {v:?}: {e}"))?,
    };
    Ok((name.to_string(), labels, value))
}

/// The exposition text as a write request: every sample at `timestamp_ms`,
/// with `job` and `instance` added (a series that has either keeps its own).
pub fn request(text: &str, instance: &str, timestamp_ms: i64) -> Result<WriteRequest, String> {
    let mut req = WriteRequest::default();
    let mut meta: Vec<MetricMetadata> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix("# ") {
            let mut f = c.splitn(3, ' ');
            let (kind, family, rest) = (f.next(), f.next(), f.next().unwrap_or(""));
            let Some(family) = family else { continue };
            let i = meta
                .iter()
                .position(|m| m.metric_family_name == family)
                .unwrap_or_else(|| {
                    meta.push(MetricMetadata {
                        metric_family_name: family.to_string(),
                        ..MetricMetadata::default()
                    });
                    meta.len() - 1
                });
            let m = &mut meta[i];
            match kind {
                Some("TYPE") => {
                    m.r#type = match rest {
                        "counter" => 1,
                        "gauge" => 2,
                        _ => 0,
                    };
                }
                Some("HELP") => m.help = rest.to_string(),
                Some("UNIT") => m.unit = rest.to_string(),
                _ => {}
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name, labels, value) =
            parse_line(line).map_err(|e| format!("line {}: {e}: {line:?}", n + 1))?;
        let mut labels: Vec<Label> = labels
            .into_iter()
            .map(|(name, value)| Label { name, value })
            .collect();
        for (k, v) in [("job", "vmscope"), ("instance", instance)] {
            if !labels.iter().any(|l| l.name == k) {
                labels.push(Label {
                    name: k.into(),
                    value: v.into(),
                });
            }
        }
        labels.push(Label {
            name: "__name__".into(),
            value: name,
        });
        labels.sort();
        req.timeseries.push(TimeSeries {
            labels,
            samples: vec![Sample {
                value,
                timestamp: timestamp_ms,
            }],
        });
    }
    req.metadata = meta;
    Ok(req)
}

/// The request's body: protobuf, snappy block format.
pub fn encode(req: &WriteRequest) -> Result<Vec<u8>, String> {
    snap::raw::Encoder::new()
        .compress_vec(&req.encode_to_vec())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_text_becomes_sorted_series() {
        let text = "# HELP vmscope_vcpu_run_seconds Time vCPU threads ran\n\
                    # TYPE vmscope_vcpu_run_seconds counter\n\
                    # UNIT vmscope_vcpu_run_seconds seconds\n\
                    vmscope_vcpu_run_seconds_total{domain=\"a\\\"b\\\\c\\nd\",vcpu=\"0\"} 1.5\n\
                    vmscope_profiler_budget_ratio 0.01\n\
                    vmscope_x{a=\"1\",} NaN\n\
                    # EOF\n";
        let r = request(text, "kvm-7", 1234).unwrap();
        assert_eq!(r.timeseries.len(), 3);
        let names: Vec<(&str, &str)> = r.timeseries[0]
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("__name__", "vmscope_vcpu_run_seconds_total"),
                ("domain", "a\"b\\c\nd"),
                ("instance", "kvm-7"),
                ("job", "vmscope"),
                ("vcpu", "0"),
            ]
        );
        assert_eq!(r.timeseries[0].samples[0].value, 1.5);
        assert_eq!(r.timeseries[0].samples[0].timestamp, 1234);
        assert!(r.timeseries[2].samples[0].value.is_nan());
        assert_eq!(r.metadata[0].r#type, 1);
        assert_eq!(r.metadata[0].unit, "seconds");
        let body = encode(&r).unwrap();
        let back = WriteRequest::decode(
            snap::raw::Decoder::new()
                .decompress_vec(&body)
                .unwrap()
                .as_slice(),
        )
        .unwrap();
        // NaN is not equal to itself: compare the encodings.
        assert_eq!(back.encode_to_vec(), r.encode_to_vec());
        assert!(request("x{a=\"1\" 2\n", "h", 0)
            .unwrap_err()
            .contains("line 1"));
        assert!(request("x{a=1} 2\n", "h", 0).is_err());
        assert!(request("x zz\n", "h", 0).is_err());
    }
}
