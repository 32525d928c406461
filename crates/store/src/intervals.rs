//! Interval rows (`stat -o`, `account -o`): one value per (kind, interval,
//! CPU, domain, vCPU, metric), with its unit, in the `intervals` table. The
//! commands that measure decide the metrics; this module only stores and
//! reads them back.

use crate::{Result, Session, SessionWriter};
use rusqlite::params;

/// One stored value of one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalRow {
    /// What measured it: `stat` or `account`.
    pub kind: String,
    /// Seconds since the measurement started, interval start and end.
    pub t_start: f64,
    pub t_end: f64,
    /// Host CPU, for per-CPU values.
    pub cpu: Option<u32>,
    /// `host` or a VM's name; `None` for host-wide values.
    pub domain: Option<String>,
    /// A vCPU index, `io` or `host`; `None` when not per vCPU.
    pub vcpu: Option<String>,
    pub metric: String,
    pub value: f64,
    /// The value's unit in base units: `s`, `ops`, `bytes`.
    pub unit: String,
}

impl SessionWriter {
    /// Store one interval's rows, in one transaction.
    pub fn add_intervals(&mut self, rows: &[IntervalRow]) -> Result<()> {
        self.write_tx(|tx| {
            let mut st = tx.prepare_cached(
                "INSERT INTO intervals(kind, t_start, t_end, cpu, domain, vcpu, metric, value, unit)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            for r in rows {
                st.execute(params![
                    r.kind, r.t_start, r.t_end, r.cpu, r.domain, r.vcpu, r.metric, r.value, r.unit
                ])?;
            }
            Ok(())
        })
    }
}

impl Session {
    /// Interval rows of `kind` (every kind with `None`), in time order.
    pub fn intervals(&self, kind: Option<&str>) -> Result<Vec<IntervalRow>> {
        self.sql().rows(
            "SELECT kind, t_start, t_end, cpu, domain, vcpu, metric, value, unit FROM intervals
             WHERE ?1 IS NULL OR kind = ?1 ORDER BY t_start, kind, cpu, domain, vcpu, metric",
            params![kind],
            |r| {
                Ok(IntervalRow {
                    kind: r.get(0)?,
                    t_start: r.get(1)?,
                    t_end: r.get(2)?,
                    cpu: r.get(3)?,
                    domain: r.get(4)?,
                    vcpu: r.get(5)?,
                    metric: r.get(6)?,
                    value: r.get(7)?,
                    unit: r.get(8)?,
                })
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_back_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut w = SessionWriter::create(&path).unwrap();
        let row = |t: f64, metric: &str, value: f64| IntervalRow {
            kind: "account".into(),
            t_start: t,
            t_end: t + 1.0,
            cpu: None,
            domain: Some("web".into()),
            vcpu: Some("0".into()),
            metric: metric.into(),
            value,
            unit: "s".into(),
        };
        w.add_intervals(&[row(1.0, "vcpu_run", 0.5)]).unwrap();
        w.add_intervals(&[row(0.0, "vcpu_run", 0.25), row(0.0, "direct_io", 0.1)])
            .unwrap();
        w.finish(true).unwrap();
        let s = Session::open(&path).unwrap();
        let got = s.intervals(Some("account")).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].metric, "direct_io");
        assert_eq!(got[2].value, 0.5);
        assert!(s.intervals(Some("stat")).unwrap().is_empty());
        assert_eq!(s.intervals(None).unwrap().len(), 3);
    }
}
