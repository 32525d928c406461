//! Prometheus counters for `serve` (docs/architecture.md §9): base units, `_total`
//! counters accumulated from [`crate::account`] intervals, encoded with
//! the `prometheus-client` crate. Per-host-CPU series only when asked.

use crate::account::AccountInterval;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, LabelValue)>;
type F64Counter = Counter<f64, AtomicU64>;

/// A label value, escaped as the exposition formats require when encoded
/// (`prometheus-client` writes values as they are, so one VM named with a
/// `"`, `\` or a newline made the whole scrape unparsable).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct LabelValue(String);

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        use std::fmt::Write;
        encoder.write_str(&vmscope_model::text::label_value(&self.0))
    }
}

/// Running totals since `serve` started, by label set.
#[derive(Debug, Default)]
pub struct Totals {
    vcpu_run: BTreeMap<Labels, f64>,
    vcpu_runnable: BTreeMap<Labels, f64>,
    vcpu_blocked: BTreeMap<Labels, f64>,
    io_seconds: BTreeMap<Labels, f64>,
    io_ops: BTreeMap<Labels, f64>,
    cpu_busy: BTreeMap<Labels, f64>,
    cpu_domain: BTreeMap<Labels, f64>,
    softirq: BTreeMap<Labels, f64>,
    /// Waited-behind seconds by (domain, vcpu, culprit_domain, culprit).
    vcpu_wait: BTreeMap<Labels, f64>,
    /// Per VM: the culprits with series of their own, at most `wait_top`
    /// (kept once given, so every series is a counter that only grows).
    wait_named: BTreeMap<String, std::collections::BTreeSet<(String, String)>>,
    /// Per VM: distinct culprits summed in `other` (counted up to
    /// [`MAX_FOLDED_COUNTED`]).
    wait_folded: BTreeMap<String, std::collections::HashSet<(String, String)>>,
    wait_top: usize,
    per_cpu: bool,
    /// `serve --profile`: each profiler's cost, what it observed, its rate.
    profiler_cost: BTreeMap<Labels, f64>,
    profiler_observed: BTreeMap<Labels, f64>,
    profiler_rate: BTreeMap<Labels, f64>,
    profiler_budget: Option<f64>,
    /// `serve --profile`: whether host kernel functions get names, and
    /// which VMs are profiled actively (what would otherwise fail silently:
    /// a unit without CAP_SYSLOG, a broker that cannot be started).
    profile_state: Option<ProfileState>,
}

/// What `serve --profile` can and cannot see, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileState {
    /// Host kernel functions are named (`/proc/kallsyms` shows addresses).
    pub kernel_symbols: bool,
    /// (VM, profiled actively by its agent).
    pub vms_active: Vec<(String, bool)>,
}

/// What one profiler of `serve --profile` cost since it started.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilerTotals {
    /// `host`, or the VM's name.
    pub domain: String,
    /// CPU the profiler used (in a guest: its agent and sampling interrupts), s.
    pub cost_s: f64,
    /// CPU time of what it profiled (the base of its budget), s.
    pub observed_s: f64,
    /// Its sampling rate now, Hz.
    pub rate_hz: u64,
}

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), LabelValue(v.to_string())))
        .collect()
}

/// Culprits a VM gets series for by default (`serve --wait-culprits`).
pub const DEFAULT_WAIT_TOP: usize = 5;
/// Distinct culprits counted per VM in `other` (the count stops there).
pub const MAX_FOLDED_COUNTED: usize = 100_000;

impl Totals {
    pub fn new(per_cpu: bool) -> Totals {
        Totals {
            per_cpu,
            wait_top: DEFAULT_WAIT_TOP,
            ..Totals::default()
        }
    }

    /// Give at most `n` culprits of each VM a series of their own in
    /// `vmscope_vcpu_wait_seconds_total`; the rest are summed as `other`.
    pub fn with_wait_top(mut self, n: usize) -> Totals {
        self.wait_top = n;
        self
    }

    /// A VM's waits of one interval: each culprit in order of this
    /// interval's seconds joins the named ones while there is room.
    fn add_waits(&mut self, v: &crate::account::VmAccount) {
        let dom = v.name.as_str();
        let mut by_culprit: BTreeMap<(String, String), f64> = BTreeMap::new();
        let per_thread = v
            .vcpus
            .iter()
            .map(|c| (c.index.to_string(), &c.waited_behind))
            .chain(std::iter::once(("io".to_string(), &v.io_waited_behind)));
        let per_thread: Vec<_> = per_thread.collect();
        for (_, split) in &per_thread {
            for w in split.iter() {
                *by_culprit
                    .entry((w.culprit_vm.clone(), w.culprit.clone()))
                    .or_default() += w.seconds;
            }
        }
        let mut ranked: Vec<_> = by_culprit.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let named = self.wait_named.entry(dom.to_string()).or_default();
        for (k, _) in &ranked {
            if !named.contains(k) && named.len() < self.wait_top {
                named.insert(k.clone());
            }
        }
        let folded = self.wait_folded.entry(dom.to_string()).or_default();
        for (vcpu, split) in per_thread {
            for w in split.iter() {
                let k = (w.culprit_vm.clone(), w.culprit.clone());
                let (cd, c) = if named.contains(&k) {
                    (k.0.as_str(), k.1.as_str())
                } else {
                    if folded.len() < MAX_FOLDED_COUNTED {
                        folded.insert(k.clone());
                    }
                    ("", "other")
                };
                *self
                    .vcpu_wait
                    .entry(l(&[
                        ("domain", dom),
                        ("vcpu", &vcpu),
                        ("culprit_domain", cd),
                        ("culprit", c),
                    ]))
                    .or_default() += w.seconds;
            }
        }
    }

    /// Add one interval.
    pub fn add(&mut self, a: &AccountInterval) {
        for v in &a.vms {
            let dom = v.name.as_str();
            for c in &v.vcpus {
                let idx = c.index.to_string();
                let k = l(&[("domain", dom), ("vcpu", &idx)]);
                *self.vcpu_run.entry(k.clone()).or_default() += c.run_s;
                *self.vcpu_runnable.entry(k.clone()).or_default() += c.runnable_s;
                *self.vcpu_blocked.entry(k).or_default() += c.blocked_s;
            }
            *self
                .io_seconds
                .entry(l(&[("domain", dom), ("kind", "direct")]))
                .or_default() += v.direct_io_s;
            *self
                .io_seconds
                .entry(l(&[("domain", dom), ("kind", "shared")]))
                .or_default() += v.shared_io_s;
            for d in &v.devices {
                *self
                    .io_ops
                    .entry(l(&[("domain", dom), ("device", &d.device)]))
                    .or_default() += d.ops as f64;
            }
        }
        for v in &a.vms {
            self.add_waits(v);
        }
        for (vector, s) in &a.softirq_by_vector_s {
            *self.softirq.entry(l(&[("vector", vector)])).or_default() += s;
        }
        if self.per_cpu {
            for (cpu, busy) in &a.cpu_busy_s {
                *self
                    .cpu_busy
                    .entry(l(&[("cpu", &cpu.to_string())]))
                    .or_default() += busy;
            }
        }
    }

    /// Add one vm-stat interval: each host CPU's time per VM (its vCPUs and
    /// its I/O threads) and for the host itself; `names` maps the
    /// interval's domain numbers to VM names. Only with per-CPU series.
    pub fn add_vmstat(
        &mut self,
        iv: &crate::vmstat::StatInterval,
        names: &std::collections::HashMap<u32, String>,
    ) {
        use crate::vmstat::CellKind;
        if !self.per_cpu {
            return;
        }
        for row in &iv.rows {
            let cpu = row.cpu.to_string();
            for c in &row.cells {
                let (domain, kind) = match c.kind {
                    CellKind::Host => ("host", "host"),
                    CellKind::Vcpu(_) => (
                        names.get(&c.domain).map_or("unknown", String::as_str),
                        "vcpu",
                    ),
                    CellKind::Io => (names.get(&c.domain).map_or("unknown", String::as_str), "io"),
                };
                *self
                    .cpu_domain
                    .entry(l(&[("cpu", &cpu), ("domain", domain), ("kind", kind)]))
                    .or_default() += c.pct / 100.0 * iv.interval_s;
            }
        }
    }

    /// What the rolling profiler of `serve --profile` cost (totals since it
    /// started: they replace the previous ones), and its budget.
    pub fn set_profilers(&mut self, profilers: &[ProfilerTotals], budget: Option<f64>) {
        self.profiler_cost.clear();
        self.profiler_observed.clear();
        self.profiler_rate.clear();
        for p in profilers {
            let k = l(&[("domain", &p.domain)]);
            self.profiler_cost.insert(k.clone(), p.cost_s);
            self.profiler_observed.insert(k.clone(), p.observed_s);
            self.profiler_rate.insert(k, p.rate_hz as f64);
        }
        self.profiler_budget = budget;
    }

    /// What the rolling profile can see now.
    pub fn set_profile_state(&mut self, state: ProfileState) {
        self.profile_state = Some(state);
    }

    /// The exposition text (OpenMetrics, which Prometheus scrapes).
    pub fn encode(&self) -> String {
        let mut reg = Registry::default();
        let fam = |m: &BTreeMap<Labels, f64>| {
            let f = Family::<Labels, F64Counter>::default();
            for (k, v) in m {
                f.get_or_create(k).inc_by(*v);
            }
            f
        };
        reg.register_with_unit(
            "vmscope_vcpu_run",
            "Time vCPU threads ran on a host CPU",
            Unit::Seconds,
            fam(&self.vcpu_run),
        );
        reg.register_with_unit(
            "vmscope_vcpu_runnable",
            "Time vCPU threads waited for a host CPU (the guest's steal time)",
            Unit::Seconds,
            fam(&self.vcpu_runnable),
        );
        reg.register_with_unit(
            "vmscope_vcpu_blocked",
            "Time vCPU threads were neither running nor runnable (halted)",
            Unit::Seconds,
            fam(&self.vcpu_blocked),
        );
        reg.register_with_unit(
            "vmscope_domain_io",
            "Host CPU for a VM's I/O: its own non-vCPU threads (direct) and its charge for shared work (shared)",
            Unit::Seconds,
            fam(&self.io_seconds),
        );
        reg.register(
            "vmscope_domain_io_operations",
            "I/O operations of a VM: packets on its taps, requests on its disks",
            fam(&self.io_ops),
        );
        if !self.vcpu_wait.is_empty() {
            reg.register_with_unit(
                "vmscope_vcpu_wait",
                "Time a VM's vCPU (vcpu=N) or other threads (vcpu=io) were runnable but waited, by what ran instead: culprit_domain is a VM, or host (culprit: a host task COMM (pid TID), or idle for wake-up latency); each VM's top culprits get series (serve --wait-culprits), the rest are culprit=other",
                Unit::Seconds,
                fam(&self.vcpu_wait),
            );
            let folded = Family::<Labels, Gauge<i64, std::sync::atomic::AtomicI64>>::default();
            for (dom, set) in &self.wait_folded {
                folded
                    .get_or_create(&l(&[("domain", dom)]))
                    .set(set.len() as i64);
            }
            reg.register(
                "vmscope_vcpu_wait_other_culprits",
                "Distinct culprits summed in a VM's culprit=other wait series",
                folded,
            );
        }
        if !self.softirq.is_empty() {
            reg.register_with_unit(
                "vmscope_host_softirq",
                "Host softirq time per vector, all CPUs (softirq tracepoints); NET_TX, NET_RX, BLOCK and IRQ_POLL are the shared I/O work charged to VMs",
                Unit::Seconds,
                fam(&self.softirq),
            );
        }
        if self.per_cpu {
            reg.register_with_unit(
                "vmscope_cpu_busy",
                "Busy time of a host CPU (/proc/stat)",
                Unit::Seconds,
                fam(&self.cpu_busy),
            );
            reg.register_with_unit(
                "vmscope_cpu_domain",
                "Time a host CPU spent for a VM, by kind (vcpu: its vCPU threads, io: its other threads) and for the host itself (vm-stat)",
                Unit::Seconds,
                fam(&self.cpu_domain),
            );
        }
        if !self.profiler_observed.is_empty() {
            reg.register_with_unit(
                "vmscope_profiler_cpu",
                "CPU the profiler of serve --profile used, by domain: host (the recorder's own CPU and sampling interrupts) or a VM (its agent and the guest's sampling interrupts)",
                Unit::Seconds,
                fam(&self.profiler_cost),
            );
            reg.register_with_unit(
                "vmscope_profiler_observed_cpu",
                "CPU time each profiler observed: its cost divided by this is the estimated slowdown it caused",
                Unit::Seconds,
                fam(&self.profiler_observed),
            );
            let rate = Family::<Labels, Gauge<f64, AtomicU64>>::default();
            for (k, v) in &self.profiler_rate {
                rate.get_or_create(k).set(*v);
            }
            reg.register_with_unit(
                "vmscope_profiler_sample_rate",
                "Sampling rate each profiler uses now (lowered or raised to stay within the overhead budget)",
                Unit::Other("hertz".into()),
                rate,
            );
            if let Some(b) = self.profiler_budget {
                let g = Gauge::<f64, AtomicU64>::default();
                g.set(b);
                reg.register(
                    "vmscope_profiler_budget_ratio",
                    "The overhead budget of serve --profile, as a fraction of the CPU each profiler observes",
                    g,
                );
            }
        }
        if let Some(ps) = &self.profile_state {
            let g = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
            g.set(i64::from(ps.kernel_symbols));
            reg.register(
                "vmscope_profile_kernel_symbols",
                "1 when serve --profile names host kernel functions; 0 when /proc/kallsyms hides their addresses from it (kernel.kptr_restrict without CAP_SYSLOG): kernel samples are raw addresses",
                g,
            );
            let active = Family::<Labels, Gauge<i64, std::sync::atomic::AtomicI64>>::default();
            for (vm, a) in &ps.vms_active {
                active
                    .get_or_create(&l(&[("domain", vm)]))
                    .set(i64::from(*a));
            }
            reg.register(
                "vmscope_profile_vm_active",
                "1 when serve --profile samples a VM from inside (its agent), 0 when only the host samples it (passive: no guest functions); stderr says why",
                active,
            );
        }
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut s, &reg);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{DeviceOps, VcpuAccount, VmAccount};
    use crate::vmstat::{Cell, CellKind, CpuRow, Source, StatInterval};

    #[test]
    fn profiler_costs_are_exported_with_their_budget() {
        let mut t = Totals::new(false);
        assert!(
            !t.encode().contains("vmscope_profiler"),
            "none before --profile"
        );
        let p = |d: &str, c: f64, o: f64, r: u64| ProfilerTotals {
            domain: d.into(),
            cost_s: c,
            observed_s: o,
            rate_hz: r,
        };
        t.set_profilers(
            &[p("host", 0.5, 100.0, 99), p("web", 0.25, 50.0, 10)],
            Some(0.01),
        );
        // Totals since the start replace the previous ones.
        t.set_profilers(
            &[p("host", 0.75, 200.0, 49), p("web", 0.5, 100.0, 10)],
            Some(0.01),
        );
        let s = t.encode();
        for line in [
            "vmscope_profiler_cpu_seconds_total{domain=\"host\"} 0.75",
            "vmscope_profiler_observed_cpu_seconds_total{domain=\"web\"} 100.0",
            "vmscope_profiler_sample_rate_hertz{domain=\"host\"} 49.0",
            "vmscope_profiler_budget_ratio 0.01",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} missing:\n{s}");
        }
    }

    #[test]
    fn counters_accumulate_and_encode() {
        let vm = VmAccount {
            domain: 1,
            name: "t0".into(),
            pid: 10,
            vcpus: vec![VcpuAccount {
                index: 0,
                tid: 11,
                run_s: 0.25,
                runnable_s: 0.05,
                blocked_s: 0.7,
                waited_behind: vec![],
                waits: 0,
            }],
            vcpu_run_s: 0.25,
            vcpu_runnable_s: 0.05,
            vcpu_blocked_s: 0.7,
            waited_behind: vec![],
            wait_attributed_s: 0.0,
            vcpu_waits: 0,
            direct_io_s: 0.01,
            io_runnable_s: 0.0,
            io_waited_behind: vec![],
            io_wait_attributed_s: 0.0,
            devices: vec![DeviceOps {
                device: "tap:vmst0".into(),
                ops: 12,
                bytes: 1000,
            }],
            io_ops: 12,
            net_packets: 12,
            disk_ops: 0,
            disk_bytes: 0,
            disk_source: "none",
            shared_io_s: 0.002,
            total_s: 0.262,
            notes: vec![],
        };
        let a = AccountInterval {
            time_s: 1.0,
            interval_s: 1.0,
            vms: vec![vm],
            shared_io_s: 0.002,
            softirq_io_s: 0.002,
            softirq_by_vector_s: [
                ("NET_RX".to_string(), 0.0015),
                ("TIMER".to_string(), 0.0005),
            ]
            .into_iter()
            .collect(),
            shared_ops: 12,
            cost_per_op_s: 0.002 / 12.0,
            measured_host_s: 0.5,
            other_tasks_s: 0.238,
            unattributed_s: 0.238,
            exited_tasks: 0,
            exited_tasks_s: 0.0,
            capacity_s: 2.0,
            cpu_busy_s: vec![(0, 0.3), (1, 0.2)],
            notes: vec![],
        };
        // Waits: with room for two culprits, a third one and one that
        // comes later are summed as other.
        let share = |kind, vm: &str, culprit: &str, seconds| crate::wait::WaitShare {
            kind,
            culprit_domain: 0,
            culprit_vm: vm.into(),
            culprit: culprit.into(),
            seconds,
            culprits: None,
        };
        let mut waited = a.clone();
        waited.vms[0].vcpus[0].waited_behind = vec![
            share("vm", "db", "vCPU 0", 0.03),
            share("host", "host", "backup (pid 812)", 0.015),
            share("idle", "host", "idle", 0.005),
        ];
        waited.vms[0].io_waited_behind = vec![share("vm", "db", "vCPU 0", 0.001)];
        let mut later = waited.clone();
        later.vms[0].vcpus[0].waited_behind = vec![
            share("host", "host", "cron (pid 9)", 0.04),
            share("vm", "db", "vCPU 0", 0.01),
        ];
        later.vms[0].io_waited_behind = vec![];
        let mut t = Totals::new(false).with_wait_top(2);
        t.add(&waited);
        t.add(&later);
        let s = t.encode();
        for line in [
            "vmscope_vcpu_wait_seconds_total{domain=\"t0\",vcpu=\"0\",culprit_domain=\"db\",culprit=\"vCPU 0\"} 0.04",
            "vmscope_vcpu_wait_seconds_total{domain=\"t0\",vcpu=\"io\",culprit_domain=\"db\",culprit=\"vCPU 0\"} 0.001",
            "vmscope_vcpu_wait_seconds_total{domain=\"t0\",vcpu=\"0\",culprit_domain=\"host\",culprit=\"backup (pid 812)\"} 0.015",
            "vmscope_vcpu_wait_seconds_total{domain=\"t0\",vcpu=\"0\",culprit_domain=\"\",culprit=\"other\"} 0.045",
            "vmscope_vcpu_wait_other_culprits{domain=\"t0\"} 2",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} missing:\n{s}");
        }
        assert_eq!(
            s.matches("vmscope_vcpu_wait_seconds_total{").count(),
            4,
            "{s}"
        );

        let mut t = Totals::new(false);
        t.add(&a);
        t.add(&a);
        let s = t.encode();
        assert!(!s.contains("vmscope_vcpu_wait"), "no waits, no family: {s}");
        assert!(
            s.contains("vmscope_vcpu_run_seconds_total{domain=\"t0\",vcpu=\"0\"} 0.5"),
            "{s}"
        );
        assert!(s.contains("vmscope_domain_io_seconds_total{domain=\"t0\",kind=\"shared\"} 0.004"));
        assert!(
            s.contains("vmscope_domain_io_operations_total{domain=\"t0\",device=\"tap:vmst0\"} 24")
        );
        assert!(!s.contains("vmscope_cpu_busy"));
        assert!(
            s.contains("vmscope_host_softirq_seconds_total{vector=\"NET_RX\"} 0.003"),
            "{s}"
        );
        let mut t = Totals::new(true);
        t.add(&a);
        assert!(t
            .encode()
            .contains("vmscope_cpu_busy_seconds_total{cpu=\"1\"} 0.2"));
        // The per-CPU split by VM, from a vm-stat interval.
        let iv = StatInterval {
            time_s: 1.0,
            interval_s: 2.0,
            source: Source::Schedstat,
            rows: vec![CpuRow {
                cpu: 1,
                total_pct: 75.0,
                cells: vec![
                    Cell {
                        domain: 1,
                        kind: CellKind::Vcpu(0),
                        pct: 50.0,
                    },
                    Cell {
                        domain: 1,
                        kind: CellKind::Io,
                        pct: 5.0,
                    },
                    Cell {
                        domain: 0,
                        kind: CellKind::Host,
                        pct: 20.0,
                    },
                ],
            }],
            notes: vec![],
            legend: None,
            lost: 0,
            uncounted_slices: 0,
            unchained_switches: 0,
        };
        let names = [(1u32, "t0".to_string())].into_iter().collect();
        let mut p = Totals::new(true);
        p.add_vmstat(&iv, &names);
        p.add_vmstat(&iv, &names);
        let s = p.encode();
        assert!(
            s.contains(
                "vmscope_cpu_domain_seconds_total{cpu=\"1\",domain=\"t0\",kind=\"vcpu\"} 2.0"
            ),
            "{s}"
        );
        assert!(s.contains(
            "vmscope_cpu_domain_seconds_total{cpu=\"1\",domain=\"host\",kind=\"host\"} 0.8"
        ));
        let mut off = Totals::new(false);
        off.add_vmstat(&iv, &names);
        assert!(!off.encode().contains("vmscope_cpu_domain"));
    }

    /// Issue 32 item 1: a VM named with a quote, a backslash and a newline
    /// is one escaped label value, and every other series stays parsable.
    #[test]
    fn hostile_vm_names_are_escaped_label_values() {
        let mut t = Totals::new(false);
        t.set_profilers(
            &[
                ProfilerTotals {
                    domain: "a\"b\\c\nd\x1b[31m".into(),
                    cost_s: 0.5,
                    observed_s: 10.0,
                    rate_hz: 99,
                },
                ProfilerTotals {
                    domain: "host".into(),
                    cost_s: 0.25,
                    observed_s: 10.0,
                    rate_hz: 99,
                },
            ],
            Some(0.01),
        );
        let s = t.encode();
        assert!(
            s.contains(
                "vmscope_profiler_cpu_seconds_total{domain=\"a\\\"b\\\\c\\nd\x1b[31m\"} 0.5"
            ),
            "{s}"
        );
        // Every line is a comment or a sample whose label values are closed.
        for line in s.lines() {
            assert!(
                line.starts_with('#') || line.ends_with(|c: char| c.is_ascii_digit()),
                "broken line {line:?} in {s}"
            );
        }
    }
}
