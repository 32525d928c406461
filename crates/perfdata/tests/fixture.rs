//! Import of a real perf.data recorded elsewhere (perf 3.8, `-a -g`, plain
//! MMAP records), checked against the reference table of
//! testdata/perf/README.md and against `perf report` run now.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use vmscope_model::{CpuMode, ImageRef, ProcessTable, Record};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/perf/quipper.perf.data.callgraph-3.8")
}

/// (samples, period) per key.
#[derive(Default)]
struct Shares {
    by_comm: HashMap<String, (u64, u64)>,
    by_comm_dso: HashMap<(String, String), (u64, u64)>,
    total: (u64, u64),
}

impl Shares {
    fn pct(&self, v: (u64, u64), by_period: bool) -> f64 {
        if by_period {
            100.0 * v.1 as f64 / self.total.1 as f64
        } else {
            100.0 * v.0 as f64 / self.total.0 as f64
        }
    }
    fn comm(&self, c: &str, by_period: bool) -> f64 {
        self.pct(self.by_comm.get(c).copied().unwrap_or_default(), by_period)
    }
    fn comm_dso(&self, c: &str, d: &str, by_period: bool) -> f64 {
        let k = (c.to_string(), d.to_string());
        self.pct(
            self.by_comm_dso.get(&k).copied().unwrap_or_default(),
            by_period,
        )
    }
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// perf's short name of a kernel module map: `/lib/…/ath9k_hw.ko` → `[ath9k_hw]`.
fn module_name(path: &str) -> Option<String> {
    let base = basename(path);
    let stem = base
        .strip_suffix(".ko")
        .or_else(|| base.strip_suffix(".ko.xz"))?;
    Some(format!("[{}]", stem.replace('-', "_")))
}

/// Replay the import through a ProcessTable the way `perf report --sort
/// comm,dso` groups samples: by the thread's comm at sample time, and by the
/// DSO of the sample IP. Kernel-mode IPs go to `[kernel.kallsyms]` unless a
/// kernel module map (pid -1) covers them, as perf shows modules separately.
fn shares(path: &Path) -> (Shares, Vec<vmscope_model::SampleRecord>) {
    let mut table = ProcessTable::new();
    let mut modules: Vec<(u64, u64, String)> = Vec::new();
    let mut s = Shares::default();
    let mut samples = Vec::new();
    vmscope_perfdata::import(path, &mut |r| match r {
        Record::Sample(smp) => {
            let comm = table
                .thread_comm(smp.tid)
                .unwrap_or_else(|| table.comm(smp.pid, smp.tid));
            let dso = match table.normalize(smp.pid, smp.ip, smp.mode).image {
                ImageRef::Kernel => modules
                    .iter()
                    .find(|(start, end, _)| (*start..*end).contains(&smp.ip))
                    .map_or_else(|| "[kernel.kallsyms]".to_string(), |m| m.2.clone()),
                ImageRef::File { path, .. } => basename(&path).to_string(),
                other => other.display_name().to_string(),
            };
            let add = |e: &mut (u64, u64)| {
                e.0 += 1;
                e.1 += smp.period;
            };
            add(s.by_comm.entry(comm.to_string()).or_default());
            add(s.by_comm_dso.entry((comm.to_string(), dso)).or_default());
            add(&mut s.total);
            samples.push(smp);
        }
        other => {
            if let Record::Mmap {
                pid: u32::MAX,
                start,
                len,
                path,
                ..
            } = &other
            {
                if let Some(name) = module_name(path) {
                    modules.push((*start, start + len, name));
                }
            }
            table.apply(&other);
        }
    })
    .expect("fixture imports");
    (s, samples)
}

/// The README's `perf report --sort comm,dso` table.
const REFERENCE: &[(&str, &str, f64)] = &[
    ("chrome", "chrome", 49.06),
    ("swapper", "[kernel.kallsyms]", 18.80),
    ("Compositor", "chrome", 12.18),
    ("Compositor", "[kernel.kallsyms]", 5.56),
    ("chrome", "[kernel.kallsyms]", 3.95),
    ("shill", "libglib-2.0.so.0.3400.3", 1.21),
    ("kworker/0:1", "[kernel.kallsyms]", 0.97),
    ("chrome", "libpthread-2.15.so", 0.91),
    ("Compositor", "libstdc++.so.6.0.17", 0.63),
    ("Compositor", "libpthread-2.15.so", 0.50),
];

#[test]
fn header_and_counts() {
    let mut n = 0;
    let info = vmscope_perfdata::import(&fixture(), &mut |_| n += 1).unwrap();
    assert_eq!(info.samples, 1768);
    assert_eq!(info.lost, 0);
    assert_eq!(info.events.len(), 1);
    assert_eq!(info.events[0].name, "cycles");
    assert_eq!(info.events[0].frequency, Some(4000));
    assert_eq!(info.hostname.as_deref(), Some("localhost"));
    assert_eq!(info.os_release.as_deref(), Some("3.8.11"));
    assert_eq!(info.perf_version.as_deref(), Some("3.8.11.g047ea3"));
    assert_eq!(info.arch.as_deref(), Some("x86_64"));
    assert_eq!(info.nr_cpus, Some(4));
    let cmd = info.cmdline.unwrap();
    assert_eq!(&cmd[cmd.len() - 2..], ["sleep", "2"]);
    let kernel = info
        .build_ids
        .iter()
        .find(|(p, _)| p == "[kernel.kallsyms]")
        .expect("kernel build id");
    let hex: String = kernel.1.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "635d9e4f686bf3b5adf08d7a735a5260899b17a6");
    let (first, last) = (info.first_time.unwrap(), info.last_time.unwrap());
    assert!(
        last > first && last - first < 5_000_000_000,
        "{first}..{last}"
    );
}

#[test]
fn samples_modes_callchains_and_order() {
    let mut samples = Vec::new();
    let mut kernel_maps = 0;
    let mut last_time = 0;
    let mut in_order = true;
    vmscope_perfdata::import(&fixture(), &mut |r| match &r {
        Record::Sample(s) => {
            in_order &= s.time >= last_time;
            last_time = s.time;
            samples.push(s.clone());
        }
        Record::Mmap { pid, path, .. } if *pid == u32::MAX => {
            assert!(path.starts_with('[') || path.starts_with('/'), "{path}");
            kernel_maps += 1;
        }
        _ => {}
    })
    .unwrap();
    assert!(in_order, "samples come in time order");
    assert!(kernel_maps > 0, "kernel maps (pid -1) become pid u32::MAX");
    let count = |m: CpuMode| samples.iter().filter(|s| s.mode == m).count();
    assert_eq!(count(CpuMode::Kernel), 658);
    assert_eq!(count(CpuMode::User), 1110);
    assert_eq!(count(CpuMode::GuestKernel) + count(CpuMode::GuestUser), 0);
    assert!(samples.iter().all(|s| !s.callchain.is_empty()));
    assert!(samples.iter().all(|s| s.cpu < 4 && s.period > 0));
    let max = samples.iter().map(|s| s.callchain.len()).max().unwrap();
    assert!(max >= 100, "longest chain {max}");
    let pids: std::collections::HashSet<u32> = samples.iter().map(|s| s.pid).collect();
    let tids: std::collections::HashSet<u32> = samples.iter().map(|s| s.tid).collect();
    assert_eq!((pids.len(), tids.len()), (16, 20));
}

#[test]
fn shares_match_the_readme_reference_by_period() {
    let (s, _) = shares(&fixture());
    for &(comm, dso, pct) in REFERENCE {
        let got = s.comm_dso(comm, dso, true);
        assert!(
            (got - pct).abs() <= 0.1,
            "{comm} {dso}: {got:.2}% vs perf's {pct:.2}%"
        );
    }
    for (comm, pct) in [
        ("chrome", 55.44),
        ("Compositor", 19.92),
        ("swapper", 19.25),
        ("shill", 1.33),
    ] {
        let got = s.comm(comm, true);
        assert!((got - pct).abs() <= 0.1, "{comm}: {got:.2}% vs {pct:.2}%");
    }
    // perf weighs by period ("Event count"); by sample count the split differs,
    // which is what makes this check meaningful.
    let by_count = s.comm_dso("swapper", "[kernel.kallsyms]", false);
    assert!(
        (by_count - 18.80).abs() > 0.1,
        "sample-count share {by_count:.2}% should differ from the period share"
    );
}

/// Parse `perf report --stdio` rows: `   49.06%  chrome   chrome`.
fn perf_rows(out: &str, keys: usize) -> Vec<(Vec<String>, f64)> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let pct = it.next()?.strip_suffix('%')?.parse::<f64>().ok()?;
            let rest: Vec<String> = it.map(str::to_string).collect();
            (rest.len() == keys).then_some((rest, pct))
        })
        .collect()
}

fn perf_report(file: &Path, sort: &str) -> Option<String> {
    let perf = Path::new("/usr/bin/perf");
    if !perf.exists() {
        eprintln!("skipping: /usr/bin/perf not installed");
        return None;
    }
    let symfs = tempfile::tempdir().unwrap();
    let out = Command::new(perf)
        .args([
            "report",
            "--stdio",
            "--no-children",
            "-g",
            "none",
            "--sort",
            sort,
        ])
        .arg("-i")
        .arg(file)
        .arg(format!("--symfs={}", symfs.path().display()))
        .output()
        .expect("run perf report");
    assert!(
        out.status.success(),
        "perf report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn shares_match_perf_report_run_now() {
    let Some(out) = perf_report(&fixture(), "comm,dso") else {
        return;
    };
    let (s, _) = shares(&fixture());
    let rows = perf_rows(&out, 2);
    assert!(rows.len() >= 10, "parsed {} rows from:\n{out}", rows.len());
    let mut checked = 0;
    for (k, pct) in rows.iter().filter(|(_, p)| *p >= 0.5) {
        let got = s.comm_dso(&k[0], &k[1], true);
        assert!(
            (got - pct).abs() <= 0.1,
            "{} {}: {got:.2}% vs perf report {pct:.2}%",
            k[0],
            k[1]
        );
        checked += 1;
    }
    assert!(checked >= 10);
    let out = perf_report(&fixture(), "comm").unwrap();
    for (k, pct) in perf_rows(&out, 1).iter().filter(|(_, p)| *p >= 0.5) {
        let got = s.comm(&k[0], true);
        assert!((got - pct).abs() <= 0.1, "{}: {got:.2}% vs {pct:.2}%", k[0]);
    }
}
