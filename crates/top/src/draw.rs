//! Drawing a frame with ratatui: a header line, the domain table with each
//! expanded domain's top functions under it, and a key help line. The table
//! uses the batch layout's columns ([`crate::domain_line`]), so what a
//! script reads and what a person sees agree. A terminal smaller than
//! [`MIN_WIDTH`] × [`MIN_HEIGHT`] gets a message saying so instead.

use crate::{domain_header, domain_line, function_line, wait_lines, Frame, View};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

/// Narrowest terminal the table fits in.
pub const MIN_WIDTH: u16 = 96;
/// Lowest terminal: title, table header, host, one VM, help.
pub const MIN_HEIGHT: u16 = 6;

/// Draw `frame` as `view` says.
pub fn draw(f: &mut ratatui::Frame<'_>, frame: &Frame, view: &View) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        f.render_widget(
            Paragraph::new(format!(
                "terminal too small: {}x{}; vmscope top needs at least {MIN_WIDTH}x{MIN_HEIGHT} (or use --batch)",
                area.width, area.height
            ))
            .wrap(Wrap { trim: true }),
            area,
        );
        return;
    }
    let [head, body, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    let when = match (&view.replay, &frame.at) {
        (Some(_), Some(at)) => format!("REPLAY {}", at.replacen('T', " ", 1)),
        _ => format!("{:.0} s", frame.time_s),
    };
    let mut title = format!(
        "vmscope top - {} - {} CPUs, busy {:.1} % - {when}, every {:.1} s - sort {}",
        frame.hostname,
        frame.cpus,
        frame.host_busy_pct,
        frame.interval_s,
        view.sort.label()
    );
    if let Some(pos) = &view.replay {
        title.push_str(&format!(" - {pos}"));
    }
    if let Some(o) = &view.only {
        title.push_str(&format!(" - VM {o}"));
    }
    if let Some(c) = &view.context {
        title.push_str(&format!(" - {c}"));
    }
    if view.paused && view.replay.is_none() {
        title.push_str(" - PAUSED");
    }
    f.render_widget(
        Paragraph::new(Line::from(title)).style(Style::new().add_modifier(Modifier::BOLD)),
        head,
    );

    let mut lines = vec![Line::from(Span::styled(
        format!("  {}", domain_header()),
        Style::new().add_modifier(Modifier::UNDERLINED),
    ))];
    let mut selected_line = 0;
    for (i, d) in view.order(frame).into_iter().enumerate() {
        let expanded = view.expanded.contains(&d.name);
        let mark = if expanded { "- " } else { "+ " };
        let mut style = Style::new();
        if i == view.selected {
            selected_line = lines.len();
            style = style.add_modifier(Modifier::REVERSED);
        }
        lines.push(Line::from(Span::styled(
            format!("{mark}{}", domain_line(d)),
            style,
        )));
        if !expanded {
            continue;
        }
        if let Some(r) = &d.reason {
            lines.push(Line::from(format!("      ({r})")));
        }
        for w in wait_lines(d) {
            lines.push(Line::from(format!("  {w}")));
        }
        for fun in view.functions_of(d) {
            lines.push(Line::from(format!("  {}", function_line(fun))));
        }
    }
    // Keep the selected domain on screen.
    let height = usize::from(body.height);
    let scroll = selected_line.saturating_sub(height.saturating_sub(1));
    f.render_widget(
        Paragraph::new(lines).scroll((u16::try_from(scroll).unwrap_or(u16::MAX), 0)),
        body,
    );
    f.render_widget(
        Paragraph::new(if view.replay.is_some() {
            "q quit  left/b back  right/n forward  [ ] 1 min  { } 10 min  g/G first/last  p play  s sort  f VM  c context  e expand"
        } else {
            "q quit  s sort  f VM filter  c context filter  e/Enter expand  a all  j/k move  p pause"
        }),
        help,
    );
}
