//! The exporters' counters in `/metrics` (OpenMetrics text, inserted
//! before `# EOF`): `vmscope_export_{sent,failed,spooled,dropped}_total`,
//! `vmscope_export_queued_requests`, `vmscope_export_queued_bytes` and
//! `vmscope_export_up` (0 once an exporter stopped for good), each with
//! the labels `exporter` (the kind) and `url`.

use crate::exporter::ExporterStats;
use std::fmt::Write;
use vmscope_model::text::label_value;

/// The families, in the exposition format.
pub fn encode(stats: &[ExporterStats]) -> String {
    if stats.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let labels = |s: &ExporterStats| {
        format!(
            "exporter=\"{}\",url=\"{}\"",
            label_value(&s.kind),
            label_value(&s.url)
        )
    };
    type Pick = fn(&ExporterStats) -> u64;
    let counters: [(&str, &str, Pick); 4] = [
        ("sent", "Requests the receiver took", |s| s.sent),
        ("failed", "Tries that failed (each retry counts)", |s| s.failed),
        ("spooled", "Requests that had to wait in the spool", |s| s.spooled),
        (
            "dropped",
            "Requests given up: the oldest past --export-spool-max, refused for good, or unreadable",
            |s| s.dropped,
        ),
    ];
    for (name, help, pick) in counters {
        let _ = writeln!(out, "# HELP vmscope_export_{name} {help}.");
        let _ = writeln!(out, "# TYPE vmscope_export_{name} counter");
        for s in stats {
            let _ = writeln!(
                out,
                "vmscope_export_{name}_total{{{}}} {}",
                labels(s),
                pick(s)
            );
        }
    }
    let gauges: [(&str, &str, Pick); 3] = [
        ("queued_requests", "Requests waiting to be sent", |s| {
            s.queued
        }),
        (
            "queued_bytes",
            "Bytes of the requests waiting to be sent",
            |s| s.queued_bytes,
        ),
        (
            "up",
            "1 while the exporter sends, 0 once it stopped for good",
            |s| u64::from(s.stopped.is_none()),
        ),
    ];
    for (name, help, pick) in gauges {
        let _ = writeln!(out, "# HELP vmscope_export_{name} {help}.");
        let _ = writeln!(out, "# TYPE vmscope_export_{name} gauge");
        for s in stats {
            let _ = writeln!(out, "vmscope_export_{name}{{{}}} {}", labels(s), pick(s));
        }
    }
    out
}

/// `text` (ending in `# EOF`) with the exporters' families added.
pub fn insert(text: &str, stats: &[ExporterStats]) -> String {
    let extra = encode(stats);
    if extra.is_empty() {
        return text.to_string();
    }
    match text.rfind("# EOF") {
        Some(i) => format!("{}{extra}{}", &text[..i], &text[i..]),
        None => format!("{text}{extra}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_go_before_eof() {
        let s = ExporterStats {
            kind: "otlp".into(),
            url: "http://c:4318/v1development/profiles".into(),
            sent: 3,
            failed: 2,
            spooled: 1,
            ..ExporterStats::default()
        };
        let t = insert("a 1\n# EOF\n", &[s]);
        assert!(t.ends_with("# EOF\n"), "{t}");
        assert!(t.contains(
            "vmscope_export_sent_total{exporter=\"otlp\",url=\"http://c:4318/v1development/profiles\"} 3\n"
        ));
        assert!(t.contains("# TYPE vmscope_export_failed counter\n"));
        assert!(t.contains("vmscope_export_up{exporter=\"otlp\""));
        assert_eq!(insert("a 1\n# EOF\n", &[]), "a 1\n# EOF\n");
    }
}
