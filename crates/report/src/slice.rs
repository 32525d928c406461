//! `--time` and `--cpu`: which seconds and CPUs of a session a report
//! covers. Sessions keep time per whole second and the CPU of every
//! sample (schema 3, docs/architecture.md §7); older sessions, and
//! perf.data files recorded without CPU numbers, say what they cannot be
//! sliced by.

use crate::ReportError;
use serde::Serialize;
use vmscope_store::{Session, Slice};

/// The slice as the report header shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SliceSummary {
    /// First and last whole second (inclusive).
    pub seconds: Option<(u32, u32)>,
    pub cpus: Option<Vec<u32>>,
}

pub(crate) fn summary(s: &Slice) -> Option<SliceSummary> {
    (!s.is_all()).then(|| SliceSummary {
        seconds: s.seconds,
        cpus: s.cpus.clone(),
    })
}

/// One bound of `--time`: `10`, `10s`, `2.5s`, `1m`, `500ms`.
fn seconds(text: &str, spec: &str) -> Result<f64, ReportError> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v * scale)
        .ok_or_else(|| {
            ReportError::Slice(format!(
                "--time {spec}: '{t}' is not a time; give START-END in seconds since the session's start, e.g. 10s-20s, 10-20, 30s- or -5s"
            ))
        })
}

/// Parse `START-END` (either side may be left out) into seconds.
pub fn parse_time(spec: &str) -> Result<(Option<f64>, Option<f64>), ReportError> {
    let Some((a, b)) = spec.split_once('-') else {
        return Err(ReportError::Slice(format!(
            "--time {spec}: give START-END in seconds since the session's start, e.g. 10s-20s, 10-20, 30s- or -5s"
        )));
    };
    let a = (!a.trim().is_empty())
        .then(|| seconds(a, spec))
        .transpose()?;
    let b = (!b.trim().is_empty())
        .then(|| seconds(b, spec))
        .transpose()?;
    if let (Some(x), Some(y)) = (a, b) {
        if y <= x {
            return Err(ReportError::Slice(format!(
                "--time {spec}: the end ({y} s) is not after the start ({x} s)"
            )));
        }
    }
    Ok((a, b))
}

/// A note when `--time SPEC` is not in whole seconds: sessions count
/// samples per second, so the slice is widened to the whole seconds that
/// hold it, and the user should hear of it (the `# slice` header line alone
/// was easy to miss).
pub fn time_note(spec: &str) -> Option<String> {
    let (a, b) = parse_time(spec).ok()?;
    let whole = |v: Option<f64>| v.is_none_or(|v| v.fract() == 0.0);
    if whole(a) && whole(b) {
        return None;
    }
    let start = a.unwrap_or(0.0).floor();
    let end = b.map_or_else(|| "the end".to_string(), |b| format!("{} s", b.ceil()));
    Some(format!(
        "--time {spec}: sessions count samples per whole second, so the slice is widened to {start} s - {end}"
    ))
}

/// Parse `0,1` or `0-3,6`.
pub fn parse_cpus(spec: &str) -> Result<Vec<u32>, ReportError> {
    let bad = |p: &str| {
        ReportError::Slice(format!(
            "--cpu {spec}: '{p}' is not a CPU number or range; give e.g. 0,1 or 0-3"
        ))
    };
    let mut out = Vec::new();
    for p in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.split_once('-') {
            Some((a, b)) => {
                let a: u32 = a.trim().parse().map_err(|_| bad(p))?;
                let b: u32 = b.trim().parse().map_err(|_| bad(p))?;
                if b < a || b - a > 4096 {
                    return Err(bad(p));
                }
                out.extend(a..=b);
            }
            None => out.push(p.parse().map_err(|_| bad(p))?),
        }
    }
    if out.is_empty() {
        return Err(bad(spec));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The slice `--time` and `--cpu` ask for, checked against the session.
pub fn resolve(
    session: &Session,
    time: Option<&str>,
    cpus: Option<&str>,
) -> Result<Slice, ReportError> {
    let mut slice = Slice::default();
    if time.is_none() && cpus.is_none() {
        return Ok(slice);
    }
    let what = session.slicing()?;
    let file = session.path().display().to_string();
    let old = |opt: &str| {
        ReportError::Slice(format!(
            "{file}: {opt} cannot slice this session: it was written by a vmscope older than session schema 3 (this one was created at schema {}), which kept no time or CPU per sample; record or import it again with this version",
            what.created_schema
        ))
    };
    if let Some(spec) = time {
        if what.created_schema < 3 {
            return Err(old("--time"));
        }
        if !what.time {
            return Err(ReportError::Slice(format!(
                "{file}: --time cannot slice this session: some of its samples have no time"
            )));
        }
        let (a, b) = parse_time(spec)?;
        let duration: f64 = session
            .meta()?
            .get("duration_s")
            .and_then(|d| d.parse().ok())
            .unwrap_or(0.0);
        let last = what.seconds.map_or(0, |s| s.1);
        let end = duration.max(f64::from(last) + 1.0);
        let start = a.unwrap_or(0.0);
        if start >= end {
            return Err(ReportError::Slice(format!(
                "--time {spec}: starts after the session ends: it holds samples from 0 s to {end:.1} s"
            )));
        }
        let first = start.floor() as u32;
        let last = b.map_or(u32::MAX, |b| (b.ceil() as u32).saturating_sub(1).max(first));
        if let Some((lo, _)) = what.seconds {
            if last < lo {
                return Err(ReportError::Slice(format!(
                    "--time {spec}: ends before the first sample at {lo} s"
                )));
            }
        }
        slice.seconds = Some((first, last));
    }
    if let Some(spec) = cpus {
        if what.created_schema < 3 {
            return Err(old("--cpu"));
        }
        if !what.cpu {
            return Err(ReportError::Slice(format!(
                "{file}: --cpu cannot slice this session: its samples carry no CPU number (a perf.data recorded without the sample's CPU; `perf record -a` records it)"
            )));
        }
        let want = parse_cpus(spec)?;
        let n: Option<u32> = session.meta()?.get("cpus").and_then(|c| c.parse().ok());
        let highest = n.map(|n| n.saturating_sub(1)).or(what.cpus.last().copied());
        if let Some(h) = highest {
            if let Some(bad) = want.iter().find(|c| **c > h) {
                return Err(ReportError::Slice(format!(
                    "--cpu {spec}: CPU {bad} is not in this session; it has CPUs 0-{h}"
                )));
            }
        }
        slice.cpus = Some(want);
    }
    Ok(slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_and_cpu_specs() {
        assert_eq!(parse_time("10s-20s").unwrap(), (Some(10.0), Some(20.0)));
        assert_eq!(parse_time("10-20").unwrap(), (Some(10.0), Some(20.0)));
        assert_eq!(parse_time("1.5s-").unwrap(), (Some(1.5), None));
        assert_eq!(parse_time("-500ms").unwrap(), (None, Some(0.5)));
        assert!(parse_time("20s-10s").is_err());
        assert!(parse_time("abc").is_err());
        assert!(parse_time("1x-2").is_err());
        assert_eq!(parse_cpus("0,1").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpus("2-4,0").unwrap(), vec![0, 2, 3, 4]);
        assert!(parse_cpus("a").is_err());
        assert!(parse_cpus("3-1").is_err());
    }
}
