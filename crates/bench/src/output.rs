//! Writers every benchmark shares: tables (comfy-table, units in every
//! header), JSON lines (one object per line, any serializable record) and
//! CSV of result rows (one line per sample and metric, configuration keys
//! as columns, the manifest as one JSON column).

use crate::row::Row;
use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};
use serde::Serialize;
use std::io::Write;

/// Output formats of benchmark commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// A table with these headers (each naming its unit), laid out for the
/// terminal's width.
pub fn table(headers: &[String]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(headers.to_vec());
    t
}

/// JSON lines: one record per line, flushed as written so a reader (or a
/// test) sees samples while the run goes on.
pub struct JsonLines<W: Write> {
    out: W,
}

impl<W: Write> JsonLines<W> {
    pub fn new(out: W) -> Self {
        JsonLines { out }
    }

    pub fn write<T: Serialize>(&mut self, record: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }

    /// The writer back.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// CSV of result rows. Columns: `experiment, point, sample, metric, value,
/// unit, config_hash, flagged`, then one column per configuration key
/// given at creation, then `manifest` (JSON).
pub struct CsvRows<W: Write> {
    out: csv::Writer<W>,
    config_keys: Vec<String>,
}

impl<W: Write> CsvRows<W> {
    pub fn new(out: W, config_keys: &[&str]) -> std::io::Result<Self> {
        let mut w = csv::Writer::from_writer(out);
        let mut header: Vec<String> = [
            "experiment",
            "point",
            "sample",
            "metric",
            "value",
            "unit",
            "config_hash",
            "flagged",
        ]
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
        header.extend(config_keys.iter().map(std::string::ToString::to_string));
        header.push("manifest".into());
        w.write_record(&header).map_err(csv_io)?;
        w.flush()?;
        Ok(CsvRows {
            out: w,
            config_keys: config_keys
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
        })
    }

    pub fn write(&mut self, r: &Row) -> std::io::Result<()> {
        let mut rec = vec![
            r.experiment.clone(),
            r.point.clone(),
            r.sample.to_string(),
            r.metric.clone(),
            format!("{}", r.value),
            r.unit.clone(),
            r.config_hash.clone(),
            r.flagged.clone().unwrap_or_default(),
        ];
        for k in &self.config_keys {
            rec.push(r.config.get(k).cloned().unwrap_or_default());
        }
        rec.push(serde_json::to_string(&*r.manifest).unwrap_or_default());
        self.out.write_record(&rec).map_err(csv_io)?;
        self.out.flush()
    }

    /// The writer back, flushed.
    pub fn into_inner(self) -> std::io::Result<W> {
        self.out
            .into_inner()
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

fn csv_io(e: csv::Error) -> std::io::Error {
    match e.into_kind() {
        csv::ErrorKind::Io(e) => e,
        other => std::io::Error::other(format!("{other:?}")),
    }
}

/// `v` with `d` decimals, or `-` when there is none (table cells).
pub fn fixed(v: Option<f64>, d: usize) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.d$}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;
    use crate::row::{unit, Point};
    use std::sync::Arc;

    fn row() -> Row {
        let mut m = Manifest::default();
        m.set("kernel", "6.1, \"quoted\"");
        let config = [
            ("bs".to_string(), "4096".to_string()),
            ("target".to_string(), "host:/x".to_string()),
        ]
        .into_iter()
        .collect();
        Point::new("io", "p".into(), config, Arc::new(m), &[]).row(
            1,
            "throughput",
            1234.5,
            unit::BYTES_PER_S,
        )
    }

    #[test]
    fn csv_has_units_config_columns_and_quotes() {
        let mut buf = Vec::new();
        {
            let mut w = CsvRows::new(&mut buf, &["target", "bs"]).unwrap();
            w.write(&row()).unwrap();
        }
        let text = String::from_utf8(buf).unwrap();
        let mut rd = csv::Reader::from_reader(text.as_bytes());
        let h = rd.headers().unwrap().clone();
        assert_eq!(&h[5], "unit");
        assert_eq!(&h[8], "target");
        let rec = rd.records().next().unwrap().unwrap();
        assert_eq!(&rec[4], "1234.5");
        assert_eq!(&rec[5], "bytes/s");
        assert_eq!(&rec[8], "host:/x");
        assert_eq!(&rec[9], "4096");
        let m: serde_json::Value = serde_json::from_str(&rec[10]).unwrap();
        assert_eq!(m["kernel"], "6.1, \"quoted\"");
    }

    #[test]
    fn json_lines_one_object_per_line() {
        let mut buf = Vec::new();
        let mut w = JsonLines::new(&mut buf);
        w.write(&row()).unwrap();
        w.write(&serde_json::json!({"type": "note"})).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["metric"], "throughput");
    }

    #[test]
    fn tables_carry_headers() {
        let t = table(&["BS (B)".into(), "Speed (MiB/s)".into()]);
        assert!(t.to_string().contains("Speed (MiB/s)"));
    }
}
