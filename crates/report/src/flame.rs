//! Flame graphs (`report --format flamegraph -o FILE.svg`): the joined
//! stacks of [`crate::stacks`] drawn by inferno, with the domain as the
//! first frame above the root, so one graph shows the whole machine:
//! host processes beside each VM, and in a VM its vCPUs, the guest's
//! processes and functions.

use crate::stacks::StackLine;
use crate::{is_clock, Report, ReportError};
use std::io::Write;

/// True when any line has a call stack (more than domain, process and leaf).
pub fn has_stacks(report: &Report) -> bool {
    report.stacks.iter().any(|s| s.has_stack)
}

/// Draw `lines` (event counts) as an interactive SVG.
pub fn svg(
    lines: &[StackLine],
    event: &str,
    title: &str,
    subtitle: Option<String>,
    out: &mut dyn Write,
) -> Result<(), ReportError> {
    let folded: Vec<String> = lines
        .iter()
        .filter(|l| l.event_count > 0)
        .map(|l| {
            // Frame names keep their spaces (`vCPU 0`, `CPU 0/TCG`,
            // `f (inlined)`): inferno splits the count off at the last one.
            // Control characters (a VM's name may hold any) are shown as
            // escapes: XML may not hold them, nor a terminal see them.
            format!(
                "{} {}",
                vmscope_model::text::visible(&l.frames),
                l.event_count
            )
        })
        .collect();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.subtitle = subtitle;
    // Clock events count ns: shown as µs of CPU.
    if is_clock(event) {
        opts.factor = 0.001;
        opts.count_name = "µs of CPU".into();
    } else {
        opts.count_name = format!("{event} events");
    }
    opts.hash = true;
    opts.deterministic = true;
    if folded.is_empty() {
        return Err(ReportError::Flame(
            "no samples in the selection (check --domain, --context, --time and --cpu)".into(),
        ));
    }
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, folded.iter().map(String::as_str), &mut svg)
        .map_err(|e| ReportError::Flame(e.to_string()))?;
    // vmscope's marker after the XML declaration, so a later `-o` knows
    // the file as its own (docs/architecture.md §7.1).
    let at = svg.windows(2).position(|w| w == b"?>").map_or(0, |i| i + 2);
    out.write_all(&svg[..at])?;
    write!(out, "\n<!-- {} -->", vmscope_store::output::MARKER)?;
    out.write_all(&svg[at..])?;
    Ok(())
}

/// The flame graph of a built report (its stacks, first event).
pub fn write(report: &Report, out: &mut dyn Write) -> Result<(), ReportError> {
    if report.events.is_empty() {
        return Err(ReportError::NoSamples {
            what: "a flame graph".into(),
        });
    }
    if !has_stacks(report) {
        return Err(ReportError::NoStacks {
            what: "a flame graph".into(),
        });
    }
    let event = report.events.first().map_or("", |e| e.name.as_str());
    let title = format!("vmscope: {} ({event}, {} view)", report.file, report.view);
    svg(
        &report.stacks,
        event,
        &title,
        crate::render::slice_text(report),
        out,
    )
}
