//! `stat -o FILE` and `account -o FILE`: the intervals a command prints,
//! kept in a session file too, so `report` (and its HTML) can show them
//! later. This module decides which values of an interval are stored and
//! under which metric names; the store keeps them as rows.
//!
//! Metrics, all in base units:
//! - `stat`: per CPU, `busy` (s) of the CPU, and `time` (s) per domain and
//!   vCPU (`vcpu` is the vCPU index, `io` for the VM's other threads, `host`
//!   for host work);
//! - `account`: per VM, `vcpu_run`, `vcpu_runnable`, `vcpu_blocked`,
//!   `direct_io`, `shared_io`, `total` (s), `io_ops`, `net_packets`,
//!   `disk_ops` (ops), `disk_bytes` (bytes); per vCPU the three vCPU
//!   states; host-wide `measured_host`, `unattributed`, `residual`,
//!   `shared_io_t`, `capacity` (s) and `cost_per_op` (s).

use crate::account::AccountInterval;
use crate::vmstat::{CellKind, StatInterval};
use std::collections::HashMap;
use std::path::Path;
use vmscope_store::output::{OutputOptions, SessionOutput};
use vmscope_store::{IntervalRow, SessionWriter, StoreError};

/// A session file that receives intervals as they are measured. It is
/// written the way every session is (vmscope_store::output): the target is
/// checked before anything starts, one writer holds its lock, the intervals
/// go to `FILE.partial`, and [`IntervalSession::finish`] renames it over
/// `FILE`. Dropped without `finish` (an error), the partial file stays
/// (it holds the intervals measured so far) and `FILE` is untouched.
pub struct IntervalSession {
    output: SessionOutput,
    writer: SessionWriter,
    kind: &'static str,
}

impl IntervalSession {
    /// Create the session `path` for intervals of `kind` (`stat` or
    /// `account`), noting `command` and `meta` in it.
    /// `force` lets it replace a regular file that is not a session.
    pub fn create(
        path: &Path,
        kind: &'static str,
        command: &str,
        meta: &[(String, String)],
        force: bool,
    ) -> Result<IntervalSession, StoreError> {
        let mut output = SessionOutput::prepare(path, &OutputOptions::new(force, &[]), command)?;
        let writer = output.create_writer()?;
        // From the first interval on, the partial file is worth keeping.
        output.keep_partial(true);
        writer.set_meta("source", kind)?;
        writer.set_meta("command", command)?;
        let proc = vmscope_linux::ProcRoot::system();
        for (k, key) in [
            ("hostname", "kernel.hostname"),
            ("kernel", "kernel.osrelease"),
        ] {
            if let Ok(v) = proc.sysctl(key) {
                writer.set_meta(k, &v)?;
            }
        }
        for (k, v) in meta {
            writer.set_meta(k, v)?;
        }
        Ok(IntervalSession {
            output,
            writer,
            kind,
        })
    }

    /// A row of interval `t` at `(cpu, domain, vcpu)`.
    fn row(
        &self,
        t: (f64, f64),
        (cpu, domain, vcpu): (Option<u32>, Option<&str>, Option<String>),
        metric: &str,
        value: f64,
        unit: &str,
    ) -> IntervalRow {
        IntervalRow {
            kind: self.kind.to_string(),
            t_start: t.0,
            t_end: t.1,
            cpu,
            domain: domain.map(str::to_string),
            vcpu,
            metric: metric.to_string(),
            value,
            unit: unit.to_string(),
        }
    }

    /// One vm-stat interval; `names` maps its domain numbers to VM names.
    pub fn add_stat(
        &mut self,
        iv: &StatInterval,
        names: &HashMap<u32, String>,
    ) -> Result<(), StoreError> {
        let t = (iv.time_s - iv.interval_s, iv.time_s);
        let secs = |pct: f64| pct / 100.0 * iv.interval_s;
        let mut rows = Vec::new();
        for r in &iv.rows {
            rows.push(self.row(t, (Some(r.cpu), None, None), "busy", secs(r.total_pct), "s"));
            for c in &r.cells {
                let (domain, vcpu) = match c.kind {
                    CellKind::Host => ("host", "host".to_string()),
                    CellKind::Vcpu(i) => (
                        names.get(&c.domain).map_or("unknown", String::as_str),
                        i.to_string(),
                    ),
                    CellKind::Io => (
                        names.get(&c.domain).map_or("unknown", String::as_str),
                        "io".to_string(),
                    ),
                };
                rows.push(self.row(
                    t,
                    (Some(r.cpu), Some(domain), Some(vcpu)),
                    "time",
                    secs(c.pct),
                    "s",
                ));
            }
        }
        self.writer
            .set_meta("duration_s", &format!("{:.3}", iv.time_s))?;
        self.writer.add_intervals(&rows)
    }

    /// One accounting interval.
    pub fn add_account(&mut self, iv: &AccountInterval) -> Result<(), StoreError> {
        let t = (iv.time_s - iv.interval_s, iv.time_s);
        let mut rows = Vec::new();
        for v in &iv.vms {
            let d = Some(v.name.as_str());
            for (metric, value, unit) in [
                ("vcpu_run", v.vcpu_run_s, "s"),
                ("vcpu_runnable", v.vcpu_runnable_s, "s"),
                ("vcpu_blocked", v.vcpu_blocked_s, "s"),
                ("direct_io", v.direct_io_s, "s"),
                ("shared_io", v.shared_io_s, "s"),
                ("total", v.total_s, "s"),
                ("io_ops", v.io_ops as f64, "ops"),
                ("net_packets", v.net_packets as f64, "ops"),
                ("disk_ops", v.disk_ops as f64, "ops"),
                ("disk_bytes", v.disk_bytes as f64, "bytes"),
            ] {
                rows.push(self.row(t, (None, d, None), metric, value, unit));
            }
            // What its threads waited behind: one row per culprit, named
            // without the run's domain numbers (report's who-waited-behind-
            // whom table and chart read them back).
            for (prefix, shares) in [
                ("waited_behind", &v.waited_behind),
                ("io_waited_behind", &v.io_waited_behind),
            ] {
                for w in shares {
                    rows.push(self.row(
                        t,
                        (None, d, None),
                        &format!("{prefix} {}", culprit_name(w)),
                        w.seconds,
                        "s",
                    ));
                }
            }
            for c in &v.vcpus {
                for (metric, value) in [
                    ("vcpu_run", c.run_s),
                    ("vcpu_runnable", c.runnable_s),
                    ("vcpu_blocked", c.blocked_s),
                ] {
                    rows.push(self.row(
                        t,
                        (None, d, Some(c.index.to_string())),
                        metric,
                        value,
                        "s",
                    ));
                }
            }
        }
        let r = iv.reconciliation();
        for (metric, value) in [
            ("measured_host", iv.measured_host_s),
            ("unattributed", iv.unattributed_s),
            ("residual", r.residual),
            ("shared_io_t", iv.shared_io_s),
            ("capacity", iv.capacity_s),
            ("cost_per_op", iv.cost_per_op_s),
        ] {
            rows.push(self.row(t, (None, None, None), metric, value, "s"));
        }
        self.writer
            .set_meta("duration_s", &format!("{:.3}", iv.time_s))?;
        self.writer.add_intervals(&rows)
    }

    /// Mark the session complete and put it in place of the target.
    pub fn finish(self) -> Result<std::path::PathBuf, StoreError> {
        self.output.commit(self.writer, true)
    }
}

/// A culprit as stored: `web vCPU 0`, `web I/O IO iothread0`, `host
/// backup (pid 812)`, `idle`, `other`, `unknown`.
fn culprit_name(w: &crate::wait::WaitShare) -> String {
    match w.kind {
        "vm" | "same-vm" => format!("{} {}", w.culprit_vm, w.culprit),
        "host" => format!("host {}", w.culprit),
        _ => w.culprit.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::VmAccount;
    use crate::vmstat::{Cell, CpuRow, Source};
    use vmscope_store::Session;

    #[test]
    fn stat_and_account_intervals_read_back_in_base_units() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.db");
        let mut s =
            IntervalSession::create(&path, "stat", "vmscope stat -o i.db", &[], false).unwrap();
        let iv = StatInterval {
            time_s: 3.0,
            interval_s: 2.0,
            source: Source::Schedstat,
            rows: vec![CpuRow {
                cpu: 1,
                total_pct: 75.0,
                cells: vec![
                    Cell {
                        domain: 2,
                        kind: CellKind::Vcpu(0),
                        pct: 50.0,
                    },
                    Cell {
                        domain: 0,
                        kind: CellKind::Host,
                        pct: 25.0,
                    },
                ],
            }],
            notes: vec![],
            legend: None,
            lost: 0,
            uncounted_slices: 0,
            unchained_switches: 0,
        };
        s.add_stat(&iv, &[(2, "web".to_string())].into_iter().collect())
            .unwrap();
        let mut vm = VmAccount::empty(2, "web".into(), 77);
        vm.vcpu_run_s = 0.5;
        vm.total_s = 0.5;
        vm.io_ops = 40;
        vm.disk_bytes = 4096;
        let acc = AccountInterval {
            time_s: 1.0,
            interval_s: 1.0,
            vms: vec![vm],
            shared_io_s: 0.01,
            softirq_io_s: 0.01,
            softirq_by_vector_s: Default::default(),
            shared_ops: 40,
            cost_per_op_s: 0.00025,
            measured_host_s: 0.7,
            other_tasks_s: 0.2,
            unattributed_s: 0.19,
            exited_tasks: 0,
            exited_tasks_s: 0.0,
            capacity_s: 2.0,
            cpu_busy_s: vec![],
            notes: vec![],
        };
        s.kind = "account";
        s.add_account(&acc).unwrap();
        s.finish().unwrap();
        let sess = Session::open(&path).unwrap();
        assert_eq!(sess.meta().unwrap()["source"], "stat");
        let st = sess.intervals(Some("stat")).unwrap();
        let web = st
            .iter()
            .find(|r| r.domain.as_deref() == Some("web"))
            .unwrap();
        assert_eq!((web.t_start, web.t_end, web.cpu), (1.0, 3.0, Some(1)));
        assert!((web.value - 1.0).abs() < 1e-9, "50 % of 2 s");
        assert_eq!(web.vcpu.as_deref(), Some("0"));
        let ac = sess.intervals(Some("account")).unwrap();
        let get = |m: &str| ac.iter().find(|r| r.metric == m).unwrap();
        assert_eq!(get("disk_bytes").unit, "bytes");
        assert_eq!(get("io_ops").value, 40.0);
        assert!((get("residual").value - (0.7 - 0.5 - 0.19)).abs() < 1e-9);
    }
}
