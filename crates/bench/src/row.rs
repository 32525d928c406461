//! Result rows: one measured number with its base unit, the configuration
//! it belongs to (and that configuration's hash, stable across runs and
//! machines) and the manifest of where it was measured. Every writer
//! (table, JSON lines, CSV, session store) takes these.

use crate::manifest::Manifest;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Base units rows use (docs/architecture.md §8): never MiB/s or ms in a row.
pub mod unit {
    pub const BYTES: &str = "bytes";
    pub const BYTES_PER_S: &str = "bytes/s";
    pub const SECONDS: &str = "s";
    pub const NANOSECONDS: &str = "ns";
    pub const OPS_PER_S: &str = "ops/s";
    /// CPU seconds per GiB moved.
    pub const S_PER_GIB: &str = "s/GiB";
    /// CPU seconds per Gbit (10^9 bits) moved.
    pub const S_PER_GBIT: &str = "s/Gbit";
    /// CPU seconds per second (CPUs).
    pub const S_PER_S: &str = "s/s";
    pub const COUNT: &str = "count";
}

/// One configuration of an experiment: its parameters and environment.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub experiment: String,
    /// Readable name (`host:/x direct-read bs=4096 size=1073741824`).
    pub name: String,
    pub config: BTreeMap<String, String>,
    pub config_hash: String,
    pub manifest: Arc<Manifest>,
}

impl Point {
    /// A point; its hash covers the experiment, the configuration and the
    /// manifest keys listed in `hash_keys` (the environment that makes two
    /// configurations different: disk backing, cache mode, ...).
    pub fn new(
        experiment: &str,
        name: String,
        config: BTreeMap<String, String>,
        manifest: Arc<Manifest>,
        hash_keys: &[&str],
    ) -> Point {
        let mut h = vmscope_lab::util::Sha256::new();
        h.field(experiment.as_bytes());
        for (k, v) in &config {
            h.field(k.as_bytes());
            h.field(v.as_bytes());
        }
        for k in hash_keys {
            h.field(k.as_bytes());
            h.field(manifest.get(k).unwrap_or("").as_bytes());
        }
        let mut config_hash = h.hex();
        config_hash.truncate(16);
        Point {
            experiment: experiment.to_string(),
            name,
            config,
            config_hash,
            manifest,
        }
    }

    /// A row of sample `sample` of this point.
    pub fn row(&self, sample: u32, metric: &str, value: f64, unit: &str) -> Row {
        Row {
            kind: "sample",
            experiment: self.experiment.clone(),
            point: self.name.clone(),
            sample,
            metric: metric.to_string(),
            value,
            unit: unit.to_string(),
            config: self.config.clone(),
            config_hash: self.config_hash.clone(),
            flagged: None,
            manifest: self.manifest.clone(),
            raw_output: None,
        }
    }
}

/// One measured number.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `sample` (the JSON lines writer also emits `summary` and notes).
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub experiment: String,
    pub point: String,
    /// 1-based sample number within the point.
    pub sample: u32,
    pub metric: String,
    pub value: f64,
    pub unit: String,
    pub config: BTreeMap<String, String>,
    pub config_hash: String,
    /// Why this sample is suspect (busy host, caches not dropped), if it is.
    pub flagged: Option<String>,
    pub manifest: Arc<Manifest>,
    /// What the measuring tool printed, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<String>,
}

impl Row {
    pub fn flagged(mut self, why: Option<String>) -> Row {
        self.flagged = why;
        self
    }

    pub fn raw(mut self, raw: Option<String>) -> Row {
        self.raw_output = raw;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(bs: &str, cache: &str) -> Point {
        let mut m = Manifest::default();
        m.set("cache", cache);
        m.set("command_line", "anything");
        let config = [("bs".to_string(), bs.to_string())].into_iter().collect();
        Point::new("io", format!("bs={bs}"), config, Arc::new(m), &["cache"])
    }

    #[test]
    fn hashes_cover_config_and_chosen_environment_only() {
        let a = point("4096", "none");
        assert_eq!(a.config_hash.len(), 16);
        assert_eq!(a.config_hash, point("4096", "none").config_hash);
        assert_ne!(a.config_hash, point("8192", "none").config_hash);
        assert_ne!(a.config_hash, point("4096", "writeback").config_hash);
        // The command line is in the manifest, not in the hash.
        let mut m = (*a.manifest).clone();
        m.set("command_line", "other");
        let b = Point::new(
            "io",
            a.name.clone(),
            a.config.clone(),
            Arc::new(m),
            &["cache"],
        );
        assert_eq!(a.config_hash, b.config_hash);
    }

    #[test]
    fn rows_serialize_with_base_units() {
        let r = point("4096", "none")
            .row(3, "throughput", 1.5e8, unit::BYTES_PER_S)
            .flagged(Some("busy host".into()));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["type"], "sample");
        assert_eq!(v["unit"], "bytes/s");
        assert_eq!(v["sample"], 3);
        assert_eq!(v["config"]["bs"], "4096");
        assert_eq!(v["manifest"]["cache"], "none");
        assert_eq!(v["flagged"], "busy host");
        assert!(v.get("raw_output").is_none());
    }
}
