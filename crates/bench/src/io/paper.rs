//! giacobbi2011's findings, checked on this machine's numbers
//! (`bench io --check-paper`): each a yes/no verdict with the numbers it
//! rests on, or "n/a" with what was missing. Pure functions of the point
//! means, so they are tested on hand-built data.

use super::target::Backend;
use crate::units::{iec, mib_s};
use serde::Serialize;
use std::collections::BTreeMap;
use vmscope_workload::io::Mode;

/// One point's mean speed (at the sweep's largest data size).
#[derive(Debug, Clone, PartialEq)]
pub struct Obs {
    /// Target label (`host`, `io0 file-raw`).
    pub label: String,
    pub backend: Backend,
    /// The VM's name, for VM targets.
    pub vm: Option<String>,
    pub mode: Mode,
    pub bs: u64,
    /// bytes/s
    pub mean: f64,
    /// 95 % half-width, bytes/s.
    pub ci95: f64,
}

/// One finding's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub claim: &'static str,
    /// `None`: not checkable with these targets and modes.
    pub holds: Option<bool>,
    pub detail: String,
}

impl Finding {
    pub fn verdict(&self) -> &'static str {
        match self.holds {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        }
    }

    /// Its `type: check` record, as every experiment's checks.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "check",
            "claim": self.claim,
            "holds": self.holds,
            "verdict": self.verdict(),
            "detail": self.detail,
        })
    }
}

/// (block size, mean, 95 % half-width) of one point.
type Step = (u64, f64, f64);

/// Series of one (target, mode), sorted by block size.
fn series(obs: &[Obs]) -> BTreeMap<(String, Mode), Vec<Step>> {
    let mut m: BTreeMap<(String, Mode), Vec<Step>> = BTreeMap::new();
    for o in obs.iter().filter(|o| o.mean.is_finite() && o.mean > 0.0) {
        m.entry((o.label.clone(), o.mode)).or_default().push((
            o.bs,
            o.mean,
            if o.ci95.is_finite() { o.ci95 } else { 0.0 },
        ));
    }
    for v in m.values_mut() {
        v.sort_by_key(|x| x.0);
    }
    m
}

/// Growth per doubling of block size between two points.
fn per_doubling(a: Step, b: Step) -> f64 {
    let doublings = ((b.0 as f64) / (a.0 as f64)).log2().max(1e-9);
    (b.1 / a.1).powf(1.0 / doublings) - 1.0
}

/// Every finding, in the paper's order.
pub fn check(obs: &[Obs]) -> Vec<Finding> {
    vec![
        rises_and_flattens(obs),
        buffered_beats_direct_small(obs),
        file_no_faster_than_raw(obs),
        vm_adds_overhead(obs),
    ]
}

/// Direct I/O speed rises with block size and flattens (§3.2, Fig. 3).
pub fn rises_and_flattens(obs: &[Obs]) -> Finding {
    let claim = "direct I/O speed rises with block size and flattens";
    let s = series(obs);
    let mut checked = Vec::new();
    for ((label, mode), v) in &s {
        if !mode.direct() || v.len() < 3 {
            continue;
        }
        let rise = v[v.len() - 1].1 / v[0].1;
        let first = per_doubling(v[0], v[1]);
        let last = per_doubling(v[v.len() - 2], v[v.len() - 1]);
        let ok = rise >= 1.5 && last < first && last <= 0.25;
        checked.push((
            label.clone(),
            *mode,
            v[0],
            v[v.len() - 1],
            rise,
            first,
            last,
            ok,
        ));
    }
    if checked.is_empty() {
        return Finding {
            claim,
            holds: None,
            detail: "needs a direct mode at 3 or more block sizes".into(),
        };
    }
    let held = checked.iter().filter(|c| c.7).count();
    let fails: Vec<String> = checked
        .iter()
        .filter(|c| !c.7)
        .map(|c| format!("{} {}", c.0, c.1))
        .collect();
    let ex = checked
        .iter()
        .find(|c| c.0 == "host" && c.1 == Mode::DirectRead)
        .or_else(|| checked.iter().find(|c| c.0 == "host"))
        .unwrap_or(&checked[0]);
    let min_rise = checked.iter().map(|c| c.4).fold(f64::INFINITY, f64::min);
    let max_last = checked
        .iter()
        .map(|c| c.6)
        .fold(f64::NEG_INFINITY, f64::max);
    Finding {
        claim,
        holds: Some(held == checked.len()),
        detail: format!(
            "{held} of {} series; e.g. {} {}: {:.1} MiB/s at {} → {:.1} MiB/s at {} (×{:.1}), \
             per doubling {:+.0} % first, {:+.0} % last; all series: rise ≥ ×{:.1}, last \
             doubling ≤ {:+.0} %{}",
            checked.len(),
            ex.0,
            ex.1,
            mib_s(ex.2 .1),
            iec(ex.2 .0),
            mib_s(ex.3 .1),
            iec(ex.3 .0),
            ex.4,
            100.0 * ex.5,
            100.0 * ex.6,
            min_rise,
            100.0 * max_last,
            if fails.is_empty() {
                String::new()
            } else {
                format!("; not in {}", fails.join(", "))
            }
        ),
    }
}

/// Buffered write (with its final sync) beats direct write at small block
/// sizes (§3.2: 98 vs 25 MiB/s at 4 KiB on the host).
pub fn buffered_beats_direct_small(obs: &[Obs]) -> Finding {
    let claim = "buffered write beats direct write at small block sizes";
    let s = series(obs);
    let mut parts = Vec::new();
    let mut all = true;
    let labels: Vec<&String> = s.keys().map(|(l, _)| l).collect();
    let mut seen = std::collections::BTreeSet::new();
    for l in labels {
        if !seen.insert(l.clone()) {
            continue;
        }
        let (Some(b), Some(d)) = (
            s.get(&(l.clone(), Mode::BufferedWrite)),
            s.get(&(l.clone(), Mode::DirectWrite)),
        ) else {
            continue;
        };
        // The smallest block size both modes have.
        let Some(&(bs, bm, _)) = b.iter().find(|x| d.iter().any(|y| y.0 == x.0)) else {
            continue;
        };
        let dm = d
            .iter()
            .find(|y| y.0 == bs)
            .map(|y| y.1)
            .unwrap_or(f64::NAN);
        let ratio = bm / dm;
        all &= ratio > 1.0;
        parts.push(format!(
            "{l} at {}: {:.1} vs {:.1} MiB/s (×{:.2})",
            iec(bs),
            mib_s(bm),
            mib_s(dm),
            ratio
        ));
    }
    if parts.is_empty() {
        return Finding {
            claim,
            holds: None,
            detail: "needs buffered-write and direct-write at a shared block size".into(),
        };
    }
    Finding {
        claim,
        holds: Some(all),
        detail: parts.join("; "),
    }
}

/// A VM on a file image is no faster than on a raw device for direct I/O
/// (§3.7, Figs. 8-9): file image ≤ raw device + the two intervals.
pub fn file_no_faster_than_raw(obs: &[Obs]) -> Finding {
    let claim = "a VM on a file image is no faster than on a raw device for direct I/O";
    let mut ratios = Vec::new();
    let mut faster = Vec::new();
    for f in obs
        .iter()
        .filter(|o| matches!(o.backend, Backend::FileRaw | Backend::FileQcow2) && o.mode.direct())
    {
        let Some(r) = obs.iter().find(|o| {
            o.backend == Backend::Block && o.vm == f.vm && o.mode == f.mode && o.bs == f.bs
        }) else {
            continue;
        };
        if !(f.mean > 0.0 && r.mean > 0.0) {
            continue;
        }
        let ratio = f.mean / r.mean;
        ratios.push(ratio);
        let margin = f.ci95.max(0.0) + r.ci95.max(0.0);
        if f.mean > r.mean + if margin.is_finite() { margin } else { 0.0 } {
            faster.push(format!(
                "{} {} {} ×{:.2}",
                f.label,
                f.mode,
                iec(f.bs),
                ratio
            ));
        }
    }
    if ratios.is_empty() {
        return Finding {
            claim,
            holds: None,
            detail: "needs a VM with a file-image and a raw-device target, direct modes".into(),
        };
    }
    ratios.sort_by(f64::total_cmp);
    Finding {
        claim,
        holds: Some(faster.is_empty()),
        detail: format!(
            "file image / raw device speed over {} points: median ×{:.2}, range ×{:.2}..×{:.2}{}",
            ratios.len(),
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            if faster.is_empty() {
                String::new()
            } else {
                format!(
                    "; faster beyond the intervals at {} of them (e.g. {})",
                    faster.len(),
                    faster[0]
                )
            }
        ),
    }
}

/// The VM adds overhead over the host: slower than native for direct I/O
/// (median ratio over block sizes below 1 for every VM target).
pub fn vm_adds_overhead(obs: &[Obs]) -> Finding {
    let claim = "the VM adds overhead over the host";
    let mut per_target: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for v in obs.iter().filter(|o| o.vm.is_some() && o.mode.direct()) {
        if let Some(h) = obs.iter().find(|o| {
            o.backend == Backend::Host && o.mode == v.mode && o.bs == v.bs && o.mean > 0.0
        }) {
            per_target
                .entry(v.label.clone())
                .or_default()
                .push(v.mean / h.mean);
        }
    }
    if per_target.is_empty() {
        return Finding {
            claim,
            holds: None,
            detail: "needs a host target and a VM target with the same direct modes".into(),
        };
    }
    let mut all = true;
    let parts: Vec<String> = per_target
        .iter_mut()
        .map(|(l, r)| {
            r.sort_by(f64::total_cmp);
            let med = r[r.len() / 2];
            all &= med < 1.0;
            format!("{l} ×{med:.2}")
        })
        .collect();
    Finding {
        claim,
        holds: Some(all),
        detail: format!(
            "VM / host direct I/O speed, median over block sizes: {}",
            parts.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(label: &str, backend: Backend, mode: Mode, bs: u64, mib: f64) -> Obs {
        Obs {
            label: label.into(),
            backend,
            vm: (backend != Backend::Host).then(|| "io0".to_string()),
            mode,
            bs,
            mean: mib * 1048576.0,
            ci95: mib * 1048576.0 * 0.02,
        }
    }

    /// giacobbi2011's Table 1 (host) and a VM shaped like Figs. 5-6.
    fn paper_like() -> Vec<Obs> {
        let host = [
            (4096u64, 98.4, 25.2, 25.3),
            (8192, 99.1, 46.3, 45.8),
            (16384, 97.6, 67.3, 72.1),
            (65536, 97.5, 101.7, 102.3),
            (1 << 20, 98.0, 101.7, 102.2),
        ];
        let mut v = Vec::new();
        for (bs, bw, dw, dr) in host {
            v.push(o("host", Backend::Host, Mode::BufferedWrite, bs, bw));
            v.push(o("host", Backend::Host, Mode::DirectWrite, bs, dw));
            v.push(o("host", Backend::Host, Mode::DirectRead, bs, dr));
            for (label, be, k) in [
                ("io0 file-raw", Backend::FileRaw, 0.5),
                ("io0 block", Backend::Block, 0.9),
            ] {
                v.push(o(label, be, Mode::BufferedWrite, bs, bw * 0.9));
                v.push(o(label, be, Mode::DirectWrite, bs, dw * k));
                v.push(o(label, be, Mode::DirectRead, bs, dr * k));
            }
        }
        v
    }

    #[test]
    fn the_papers_numbers_pass_every_check() {
        let f = check(&paper_like());
        assert_eq!(f.len(), 4);
        for x in &f {
            assert_eq!(x.holds, Some(true), "{}: {}", x.claim, x.detail);
        }
        assert!(f[0].detail.contains("host direct-read"), "{}", f[0].detail);
        assert!(
            f[1].detail.contains("host at 4 KiB: 98.4 vs 25.2 MiB/s"),
            "{}",
            f[1].detail
        );
        assert!(f[2].detail.contains("median ×0.56"), "{}", f[2].detail);
        assert!(
            f[3].detail.contains("io0 file-raw ×0.50"),
            "{}",
            f[3].detail
        );
    }

    #[test]
    fn contrary_numbers_fail_and_missing_ones_are_na() {
        let mut v = paper_like();
        // The file image beats the raw device (as under TCG here), and the
        // VM is as fast as the host.
        for x in v.iter_mut() {
            if x.backend == Backend::FileRaw && x.mode.direct() {
                x.mean *= 4.0;
            }
        }
        let f = check(&v);
        assert_eq!(f[2].holds, Some(false), "{}", f[2].detail);
        assert!(f[2].detail.contains("faster beyond the intervals"));
        assert_eq!(f[3].holds, Some(false), "{}", f[3].detail);
        // Still rising at the largest block size: no flattening.
        let rising: Vec<Obs> = [4096u64, 65536, 1 << 20]
            .iter()
            .enumerate()
            .map(|(i, &bs)| {
                o(
                    "host",
                    Backend::Host,
                    Mode::DirectRead,
                    bs,
                    10.0 * 4f64.powi(i as i32),
                )
            })
            .collect();
        assert_eq!(rises_and_flattens(&rising).holds, Some(false));
        let host_only: Vec<Obs> = v.iter().filter(|x| x.vm.is_none()).cloned().collect();
        let f = check(&host_only);
        assert_eq!(f[2].holds, None);
        assert_eq!(f[3].holds, None);
        assert_eq!(f[2].verdict(), "n/a");
        assert_eq!(check(&[])[0].holds, None);
    }
}
