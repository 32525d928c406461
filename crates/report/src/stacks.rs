//! Call stacks of a session as one machine-wide tree (docs/architecture.md
//! §3, joined stacks): every stack starts at its domain; a VM's stacks go
//! on through the vCPU they ran on, then the guest process and the guest's
//! own frames (from its agent), or the VMM thread and its host frames:
//!
//! ```text
//! host;make;_start;main                          host process
//! web;vCPU 0;httpd;main;serve;parse_request      guest process on vCPU 0 (agent)
//! web;vCPU 1;[guest];[translated guest code]     guest code the host saw (TCG / passive)
//! web;vCPU 0;[vmm] CPU 0/TCG;start_thread;cpu_exec   QEMU on the vCPU thread
//! web;[vmm] qemu-system-x86;main;main_loop_wait  QEMU's other threads
//! ```
//!
//! Counts are event counts (ns for clock events): an active VM's guest
//! rows are its agent's samples scaled to the guest time the host
//! measured, so they add up with the host's rows.
//!
//! Also: callers and callees of one function ([`callers`], [`callees`]).

use crate::ReportError;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use vmscope_model::{Context, ProfileRow, HOST_DOMAIN, INLINED_SUFFIX, UNKNOWN_SLICE};

/// The vCPU index of a QEMU vCPU thread name (`CPU 1/KVM`, `CPU 0/TCG`).
pub fn vcpu_of_thread(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("CPU ")?;
    let (n, accel) = rest.split_once('/')?;
    (!accel.is_empty()).then_some(())?;
    n.parse().ok()
}

/// Whether a row comes from an agent (guest process names) rather than
/// from the host's view of a vCPU thread.
fn is_agent_row(r: &ProfileRow) -> bool {
    matches!(r.key.context, Context::GuestUser | Context::GuestKernel)
        && vcpu_of_thread(&r.key.process).is_none()
}

/// Frames of a row, root first: domain, vCPU, process or thread, stack
/// (or the symbol without `-g`).
pub fn joined_frames(r: &ProfileRow) -> Vec<String> {
    let k = &r.key;
    let mut f: Vec<String> = vec![k.domain.to_string()];
    let own: Vec<String> = if k.stack.is_empty() {
        vec![k.symbol.to_string()]
    } else {
        k.stack.split(';').map(str::to_string).collect()
    };
    if &*k.domain == HOST_DOMAIN {
        f.push(k.process.to_string());
    } else if k.context.is_guest() {
        if is_agent_row(r) {
            f.push(if k.cpu == UNKNOWN_SLICE {
                "vCPU ?".into()
            } else {
                format!("vCPU {}", k.cpu)
            });
            f.push(k.process.to_string());
        } else {
            if let Some(v) = vcpu_of_thread(&k.process) {
                f.push(format!("vCPU {v}"));
            } else {
                f.push(format!("[vmm] {}", k.process));
            }
            f.push("[guest]".into());
        }
    } else if let Some(v) = vcpu_of_thread(&k.process) {
        f.push(format!("vCPU {v}"));
        f.push(format!("[vmm] {}", k.process));
    } else {
        f.push(format!("[vmm] {}", k.process));
    }
    f.extend(own);
    f
}

/// Collapsed stacks (`frame;frame;… count`) of rows, counts added up.
pub fn collapse(rows: &[ProfileRow]) -> Vec<StackLine> {
    let mut agg: BTreeMap<String, (u64, u64, bool)> = BTreeMap::new();
    for r in rows {
        let e = agg.entry(joined_frames(r).join(";")).or_default();
        e.0 += r.samples;
        e.1 += r.period;
        e.2 |= !r.key.stack.is_empty();
    }
    agg.into_iter()
        .map(|(frames, (samples, event_count, has_stack))| StackLine {
            frames,
            samples,
            event_count,
            has_stack,
        })
        .collect()
}

/// A collapsed-stack line.
#[derive(Debug, Clone, Serialize)]
pub struct StackLine {
    /// Frames root first, joined by `;` (inlined ones end in ` (inlined)`).
    pub frames: String,
    pub samples: u64,
    /// Sum of periods (ns of CPU for clock events).
    pub event_count: u64,
    /// The rows had call stacks (recorded with `-g`).
    #[serde(skip)]
    pub has_stack: bool,
}

/// A frame as collapsed-stack tools want it: no spaces, inlined frames
/// annotated `_[i]` (flame graph colouring), control characters (a VM's or
/// a guest process's name may hold a newline) shown as escapes so that a
/// frame never ends its line.
pub fn collapsed_frame(f: &str) -> String {
    let f = vmscope_model::text::visible(f);
    match f.strip_suffix(INLINED_SUFFIX) {
        Some(name) => format!("{}_[i]", name.replace([' ', ';'], "_")),
        None => f.replace([' ', ';'], "_"),
    }
}

/// A call path with counts (callers or callees of one function).
#[derive(Debug, Clone, Serialize)]
pub struct PathRow {
    /// Functions along the path: for callers the nearest caller first, for
    /// callees the direct callee first; `[self]` where the function itself
    /// was the leaf.
    pub path: Vec<String>,
    pub samples: u64,
    pub event_count: u64,
    /// Share of the function's inclusive event count.
    pub percent: f64,
}

/// Callers or callees of a function.
#[derive(Debug, Clone, Serialize)]
pub struct CallGraph {
    pub symbol: String,
    pub direction: String,
    pub event: String,
    /// Inclusive: samples whose stack holds the function.
    pub samples: u64,
    pub event_count: u64,
    /// Share of all of the event's count.
    pub percent_of_total: f64,
    pub paths: Vec<PathRow>,
    /// Rows left out by `--limit`.
    pub omitted: usize,
}

fn frame_name(f: &str) -> &str {
    f.strip_suffix(INLINED_SUFFIX).unwrap_or(f)
}

/// Callers (`up`) or callees of `symbol` over stack rows. Each sample
/// counts once, at the function's outermost occurrence in its stack.
pub fn call_graph(
    rows: &[ProfileRow],
    symbol: &str,
    callers: bool,
    event: &str,
    total: u64,
    depth: usize,
) -> Result<CallGraph, ReportError> {
    let mut agg: HashMap<Vec<String>, (u64, u64)> = HashMap::new();
    let (mut samples, mut count) = (0u64, 0u64);
    let mut any_stack = false;
    for r in rows {
        if r.key.stack.is_empty() {
            continue;
        }
        any_stack = true;
        let frames: Vec<&str> = r.key.stack.split(';').collect();
        let Some(i) = frames.iter().position(|f| frame_name(f) == symbol) else {
            continue;
        };
        samples += r.samples;
        count += r.period;
        let mut path: Vec<String> = if callers {
            frames[..i]
                .iter()
                .rev()
                .take(depth)
                .map(|f| (*f).to_string())
                .collect()
        } else {
            frames[i + 1..]
                .iter()
                .take(depth)
                .map(|f| (*f).to_string())
                .collect()
        };
        if path.is_empty() {
            path.push(if callers { "[root]" } else { "[self]" }.to_string());
        }
        let e = agg.entry(path).or_default();
        e.0 += r.samples;
        e.1 += r.period;
    }
    if !any_stack {
        return Err(ReportError::NoStacks {
            what: if callers { "--callers" } else { "--callees" }.into(),
        });
    }
    if samples == 0 {
        return Err(ReportError::NoSuchSymbol(symbol.into()));
    }
    let mut paths: Vec<PathRow> = agg
        .into_iter()
        .map(|(path, (s, p))| PathRow {
            path,
            samples: s,
            event_count: p,
            percent: if count > 0 {
                100.0 * p as f64 / count as f64
            } else {
                0.0
            },
        })
        .collect();
    paths.sort_by(|a, b| {
        b.event_count
            .cmp(&a.event_count)
            .then_with(|| b.samples.cmp(&a.samples))
            .then_with(|| a.path.cmp(&b.path))
    });
    Ok(CallGraph {
        symbol: symbol.into(),
        direction: if callers { "callers" } else { "callees" }.into(),
        event: event.into(),
        samples,
        event_count: count,
        percent_of_total: if total > 0 {
            100.0 * count as f64 / total as f64
        } else {
            0.0
        },
        paths,
        omitted: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vmscope_model::AggKey;

    fn row(domain: &str, ctx: Context, process: &str, stack: &str, cpu: u32, n: u64) -> ProfileRow {
        ProfileRow {
            key: AggKey {
                event: 0,
                domain: Arc::from(domain),
                context: ctx,
                process: Arc::from(process),
                image: Arc::from("i"),
                symbol: Arc::from(stack.rsplit(';').next().unwrap()),
                stack: Arc::from(stack),
                srcline: Arc::from(""),
                second: 0,
                cpu,
            },
            samples: n,
            period: n * 10,
        }
    }

    #[test]
    fn joined_frames_put_guest_stacks_on_their_vcpu() {
        let g = row("web", Context::GuestUser, "httpd", "main;serve", 1, 3);
        assert_eq!(joined_frames(&g).join(";"), "web;vCPU 1;httpd;main;serve");
        let t = row(
            "web",
            Context::GuestTranslated,
            "CPU 0/TCG",
            "[translated guest code]",
            5,
            1,
        );
        assert_eq!(
            joined_frames(&t).join(";"),
            "web;vCPU 0;[guest];[translated guest code]"
        );
        let q = row(
            "web",
            Context::VmmUser,
            "CPU 0/TCG",
            "start_thread;cpu_exec",
            5,
            1,
        );
        assert_eq!(
            joined_frames(&q).join(";"),
            "web;vCPU 0;[vmm] CPU 0/TCG;start_thread;cpu_exec"
        );
        let m = row(
            "web",
            Context::VmmUser,
            "qemu-system-x86",
            "main;main_loop_wait",
            0,
            1,
        );
        assert_eq!(
            joined_frames(&m).join(";"),
            "web;[vmm] qemu-system-x86;main;main_loop_wait"
        );
        let h = row("host", Context::HostUser, "make", "_start;main", 0, 1);
        assert_eq!(joined_frames(&h).join(";"), "host;make;_start;main");
        let lines = collapse(&[g.clone(), g]);
        assert_eq!((lines[0].samples, lines[0].event_count), (6, 60));
        assert_eq!(collapsed_frame("inner (inlined)"), "inner_[i]");
        assert_eq!(collapsed_frame("CPU 0/TCG"), "CPU_0/TCG");
        assert_eq!(collapsed_frame("vm\nnext;x"), "vm\\nnext_x");
        assert_eq!(vcpu_of_thread("CPU 12/KVM"), Some(12));
        assert_eq!(vcpu_of_thread("CPU x"), None);
    }

    #[test]
    fn callers_and_callees() {
        let rows = vec![
            row("h", Context::HostUser, "p", "main;a;leaf", 0, 3),
            row("h", Context::HostUser, "p", "main;b;leaf", 0, 1),
            row("h", Context::HostUser, "p", "main;a", 0, 2),
        ];
        let c = call_graph(&rows, "leaf", true, "cpu-clock", 60, 8).unwrap();
        assert_eq!(c.samples, 4);
        assert_eq!(c.paths[0].path, vec!["a", "main"]);
        assert_eq!(c.paths[0].percent, 75.0);
        let d = call_graph(&rows, "a", false, "cpu-clock", 60, 8).unwrap();
        assert_eq!(d.samples, 5);
        assert_eq!(d.paths[0].path, vec!["leaf"]);
        assert_eq!(d.paths[1].path, vec!["[self]"]);
        assert!(matches!(
            call_graph(&rows, "nope", true, "cpu-clock", 60, 8),
            Err(ReportError::NoSuchSymbol(_))
        ));
        let flat = vec![row("h", Context::HostUser, "p", "", 0, 1)];
        assert!(matches!(
            call_graph(&flat, "x", true, "cpu-clock", 1, 8),
            Err(ReportError::NoStacks { .. })
        ));
    }
}
