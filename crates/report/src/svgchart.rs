//! Small SVG charts (grouped bars, lines, a matrix) for `compare --svg`
//! and the HTML report.
//!
//! Hand-written rather than plotters: plotters lays text out with a font
//! it loads at run time (its `ttf`/`ab_glyph` features need a font file or
//! system fonts), which a report written on a headless host cannot count
//! on, and these charts are only bars, polylines, axes and labels; SVG
//! text needs no font metrics here because the viewer lays it out.

use std::fmt::Write;

/// Colours of series, in order (colour-blind-safe palette).
pub const COLOURS: [&str; 8] = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step for about `n` ticks up to `max`.
fn tick_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

const W: f64 = 820.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 80.0;

/// The opening of a chart `h` high: the element with vmscope's marker,
/// the white ground and the title.
fn head(svg: &mut String, h: f64, title: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12"><!-- {} -->"#,
        vmscope_store::output::MARKER
    );
    let _ = write!(
        svg,
        r#"<rect width="{W}" height="{h}" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        esc(title)
    );
}

fn frame(svg: &mut String, title: &str, y_label: &str, max: f64) -> (f64, f64) {
    head(svg, H, title);
    let step = tick_step(max, 5.0);
    let top = (max / step).ceil().max(1.0) * step;
    let plot_h = H - TOP - BOTTOM;
    let mut t = 0.0;
    while t <= top + step * 1e-9 {
        let y = TOP + plot_h * (1.0 - t / top);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            num(t)
        );
        t += step;
    }
    let _ = write!(
        svg,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        esc(y_label)
    );
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{:.1}" stroke="#333"/><line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#333"/>"##,
        TOP + plot_h,
        W - RIGHT,
        TOP + plot_h,
        TOP + plot_h
    );
    (top, plot_h)
}

fn legend(svg: &mut String, names: &[String]) {
    let mut x = LEFT;
    for (i, n) in names.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            H - 22.0,
            COLOURS[i % COLOURS.len()],
            x + 16.0,
            H - 12.0,
            esc(n)
        );
        x += 30.0 + 7.0 * n.chars().count() as f64;
    }
}

/// Grouped bars: one group per category, one bar per series. `values[s][c]`.
pub fn bars(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[String],
    values: &[Vec<f64>],
) -> String {
    let max = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let mut svg = String::new();
    let (top, plot_h) = frame(&mut svg, title, y_label, max);
    let n = categories.len().max(1) as f64;
    let group_w = (W - LEFT - RIGHT) / n;
    let bar_w = (group_w * 0.8) / series.len().max(1) as f64;
    for (c, cat) in categories.iter().enumerate() {
        let gx = LEFT + group_w * c as f64 + group_w * 0.1;
        for (s, row) in values.iter().enumerate() {
            let v = row.get(c).copied().unwrap_or(0.0);
            if !v.is_finite() {
                continue;
            }
            let h = plot_h * (v / top);
            let _ = write!(
                svg,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                gx + bar_w * s as f64,
                TOP + plot_h - h,
                bar_w.max(1.0) - 1.0,
                COLOURS[s % COLOURS.len()],
                esc(&format!(
                    "{} {cat}",
                    series.get(s).map_or("", String::as_str)
                )),
                num(v)
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + group_w * 0.4,
            TOP + plot_h + 16.0,
            esc(cat)
        );
    }
    legend(&mut svg, series);
    svg.push_str("</svg>");
    svg
}

/// Lines over x: `series[i] = (name, points (x, y))`.
pub fn lines(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let max_y = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let max_x = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1.0);
    let mut svg = String::new();
    let (top, plot_h) = frame(&mut svg, title, y_label, max_y);
    let plot_w = W - LEFT - RIGHT;
    let step = tick_step(max_x, 10.0);
    let mut t = 0.0;
    while t <= max_x + step * 1e-9 {
        let x = LEFT + plot_w * t / max_x;
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + plot_h + 16.0,
            num(t)
        );
        t += step;
    }
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        TOP + plot_h + 34.0,
        esc(x_label)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    LEFT + plot_w * x / max_x,
                    TOP + plot_h * (1.0 - y / top)
                )
            })
            .collect();
        // The values themselves ride along, so a reader (and the browser
        // test) can check each point's height against the axis.
        let values: Vec<String> = pts.iter().map(|p| format!("{:.6}", p.1)).collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}" data-values="{}"><title>{}</title></polyline>"#,
            COLOURS[i % COLOURS.len()],
            path.join(" "),
            values.join(" "),
            esc(name)
        );
    }
    let names: Vec<String> = series.iter().map(|s| s.0.clone()).collect();
    legend(&mut svg, &names);
    svg.push_str("</svg>");
    svg
}

/// A matrix: one row per `rows` entry, one column per `cols` entry, each
/// cell shaded by its value against the largest and labelled with it
/// (`values[r][c]`, in `unit`); a row's total at its end.
pub fn matrix(
    title: &str,
    unit: &str,
    rows: &[String],
    cols: &[String],
    values: &[Vec<f64>],
) -> String {
    const LABEL_W: f64 = 150.0;
    const HEAD_H: f64 = 120.0;
    const CELL_H: f64 = 28.0;
    let n = cols.len() + 1;
    let cell_w = ((W - LABEL_W - RIGHT) / n as f64).min(110.0);
    let h = TOP + HEAD_H + CELL_H * rows.len() as f64 + 40.0;
    let max = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let mut svg = String::new();
    head(&mut svg, h, title);
    let head_y = TOP + HEAD_H - 6.0;
    for (c, name) in cols
        .iter()
        .chain(std::iter::once(&"total".to_string()))
        .enumerate()
    {
        let x = LABEL_W + cell_w * (c as f64 + 0.5);
        let _ = write!(
            svg,
            r#"<text transform="translate({x:.1},{head_y:.1}) rotate(-40)" text-anchor="start">{}</text>"#,
            esc(name)
        );
    }
    for (r, name) in rows.iter().enumerate() {
        let y = TOP + HEAD_H + CELL_H * r as f64;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LABEL_W - 8.0,
            y + CELL_H / 2.0 + 4.0,
            esc(name)
        );
        let row = values.get(r).cloned().unwrap_or_default();
        let total: f64 = row.iter().filter(|v| v.is_finite()).sum();
        for (c, v) in row.iter().chain(std::iter::once(&total)).enumerate() {
            let x = LABEL_W + cell_w * c as f64;
            let shade = if c == cols.len() || max <= 0.0 {
                0.0
            } else {
                (v / max).clamp(0.0, 1.0)
            };
            // From white to the first series colour (0, 114, 178).
            let mix = |full: f64| (255.0 - (255.0 - full) * shade).round() as u8;
            let fill = format!("#{:02x}{:02x}{:02x}", mix(0.0), mix(114.0), mix(178.0));
            let ink = if shade > 0.55 { "white" } else { "black" };
            let _ = write!(
                svg,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="#ccc"><title>{}: {} {}</title></rect><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{ink}">{}</text>"##,
                cell_w - 1.0,
                CELL_H - 1.0,
                esc(&format!(
                    "{name} behind {}",
                    cols.get(c).map_or("all", String::as_str)
                )),
                num(*v),
                esc(unit),
                x + cell_w / 2.0,
                y + CELL_H / 2.0 + 4.0,
                num(*v)
            );
        }
    }
    let _ = write!(
        svg,
        r#"<text x="{LABEL_W}" y="{:.1}">{}</text>"#,
        h - 14.0,
        esc(&format!("values: {unit}"))
    );
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let b = bars(
            "t <1>",
            "x",
            &["instructions".into(), "dTLB".into()],
            &["base".into(), "other".into()],
            &[vec![1.0, 1.0], vec![0.69, 13.0]],
        );
        assert!(b.starts_with("<svg") && b.ends_with("</svg>"));
        assert!(b.contains("t &lt;1&gt;"));
        assert_eq!(b.matches("<rect").count(), 1 + 4 + 2);
        let l = lines("t", "s", "%", &[("a".into(), vec![(0.0, 1.0), (1.0, 2.0)])]);
        assert!(l.contains("<polyline"));
        assert_eq!(tick_step(13.0, 5.0), 5.0);
        assert_eq!(num(2.50), "2.5");
    }
}
