//! Line charts for benchmark results (plotters): one line per series with
//! markers and 95 % interval bars, optional log-2 axes, written as SVG and
//! PNG. PNG text is drawn from DejaVu Sans embedded in the binary
//! (plotters' `ab_glyph` route), so charts need no system font library.

use crate::error::BenchError;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;

static FONT: Once = Once::new();
const DEJAVU: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

fn register_font() {
    FONT.call_once(|| {
        // The bytes are a valid TrueType font (tested); nothing to do if not.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, DEJAVU);
    });
}

/// One measured value with its 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesPoint {
    pub x: f64,
    pub y: f64,
    pub lo: f64,
    pub hi: f64,
}

impl SeriesPoint {
    /// A summary's mean and 95 % interval at `x`, times `scale` (units).
    pub fn of(x: f64, s: &crate::stats::Summary, scale: f64) -> SeriesPoint {
        let ci = crate::stats::finite(s.ci95);
        SeriesPoint {
            x,
            y: s.mean * scale,
            lo: (s.mean - ci) * scale,
            hi: (s.mean + ci) * scale,
        }
    }
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<SeriesPoint>,
}

/// A chart of several series over a shared x axis.
#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log2_x: bool,
    pub log2_y: bool,
    /// Labels of x ticks (the value of a tick in, its label out).
    pub x_tick: fn(f64) -> String,
    pub series: Vec<Series>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Every chart's size in pixels.
const SIZE: (u32, u32) = (1000, 640);

fn write_chart(path: &Path, bytes: &[u8]) -> Result<(), BenchError> {
    vmscope_store::output::write_artifact(
        path,
        &vmscope_store::output::OutputOptions::default(),
        bytes,
    )
    .map(drop)
    .map_err(|e| chart_err(path, e))
}

fn chart_err(path: &Path, e: impl std::fmt::Display) -> BenchError {
    BenchError::Output {
        what: "chart",
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Creates the chart directory `dir` (and its parents).
pub fn chart_dir(dir: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::Output {
        what: "chart directory",
        path: dir.to_path_buf(),
        message: e.to_string(),
    })
}

impl LineChart {
    /// Writes `DIR/NAME.svg` and `DIR/NAME.png`; returns both paths.
    pub fn write_in(&self, dir: &Path, name: &str) -> Result<Vec<PathBuf>, BenchError> {
        let (svg, png) = self.write(&dir.join(name))?;
        Ok(vec![svg, png])
    }

    /// Writes `STEM.svg` and `STEM.png` (1000 × 640).
    pub fn write(&self, stem: &Path) -> Result<(PathBuf, PathBuf), BenchError> {
        let svg = stem.with_extension("svg");
        let png = stem.with_extension("png");
        self.write_svg(&svg)?;
        self.write_png(&png)?;
        Ok((svg, png))
    }

    /// The chart as an SVG document carrying vmscope's marker.
    pub fn svg(&self) -> Result<String, String> {
        // Text is measured with the font even in SVG.
        register_font();
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
            self.draw(&root).map_err(|e| e.to_string())?;
            root.present().map_err(|e| e.to_string())?;
        }
        // The marker inside the root element (docs/architecture.md §7.1).
        let at = text
            .find("<svg")
            .and_then(|i| text[i..].find('>').map(|j| i + j + 1))
            .unwrap_or(0);
        text.insert_str(at, &format!("<!-- {} -->", vmscope_store::output::MARKER));
        Ok(text)
    }

    /// The chart as a PNG whose `Software` text chunk names vmscope.
    pub fn png(&self) -> Result<Vec<u8>, String> {
        register_font();
        let mut rgb = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
            self.draw(&root).map_err(|e| e.to_string())?;
            root.present().map_err(|e| e.to_string())?;
        }
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, SIZE.0, SIZE.1);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.add_text_chunk(
            "Software".into(),
            vmscope_store::output::PNG_SOFTWARE.into(),
        )
        .map_err(|e| e.to_string())?;
        let mut w = enc.write_header().map_err(|e| e.to_string())?;
        w.write_image_data(&rgb).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Drawn in memory, then written whole through the store's artifact
    /// writer: a full disk leaves the old file (or none), never half a chart,
    /// and a file vmscope did not write is not replaced.
    pub fn write_svg(&self, path: &Path) -> Result<(), BenchError> {
        let text = self.svg().map_err(|e| chart_err(path, e))?;
        write_chart(path, text.as_bytes())
    }

    pub fn write_png(&self, path: &Path) -> Result<(), BenchError> {
        let bytes = self.png().map_err(|e| chart_err(path, e))?;
        write_chart(path, &bytes)
    }

    /// On a linear x axis whose every value is a whole number: how many
    /// ticks to ask for so that all of them fall on whole numbers.
    fn integer_ticks(&self) -> Option<usize> {
        if self.log2_x {
            return None;
        }
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.x))
            .filter(|x| x.is_finite())
            .collect();
        if xs.is_empty() || xs.iter().any(|x| x.fract() != 0.0) {
            return None;
        }
        let (lo, hi) = xs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        Some(((hi - lo) as usize + 1).clamp(2, 10))
    }

    /// The axes' ranges: the data with some room, positive for log axes.
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let pts = || self.series.iter().flat_map(|s| s.points.iter());
        let fold = |f: &dyn Fn(&SeriesPoint) -> f64| {
            pts()
                .map(f)
                .filter(|v| v.is_finite())
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                    (a.min(v), b.max(v))
                })
        };
        let (mut x0, mut x1) = fold(&|p| p.x);
        let (mut y0, _) = fold(&|p| {
            if self.log2_y {
                p.lo.max(p.y * 0.5)
            } else {
                p.lo
            }
        });
        let (_, mut y1) = fold(&|p| p.hi);
        if !x0.is_finite() {
            (x0, x1) = (1.0, 2.0);
        }
        if !y0.is_finite() {
            (y0, y1) = (1.0, 2.0);
        }
        let x = if self.log2_x {
            (x0.max(f64::MIN_POSITIVE) / 1.3, x1 * 1.3)
        } else {
            let pad = ((x1 - x0) * 0.05).max(1e-9);
            (x0 - pad, x1 + pad)
        };
        let y = if self.log2_y {
            (y0.max(1e-9) / 1.5, y1.max(y0 * 2.0) * 1.5)
        } else {
            (0.0_f64.min(y0), y1.max(y0 + 1e-9) * 1.08)
        };
        (x, y)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let ((x0, x1), (y0, y1)) = self.ranges();
        let mut b = ChartBuilder::on(root);
        b.caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72);
        // Four axis combinations, one drawing routine.
        macro_rules! finish {
            ($x:expr, $y:expr) => {{
                let mut c = b.build_cartesian_2d($x, $y)?;
                let x_tick = self.x_tick;
                let x_fmt = |v: &f64| x_tick(*v);
                let y_fmt = |v: &f64| fmt_num(*v);
                let mut mesh = c.configure_mesh();
                mesh.x_desc(&self.x_label)
                    .y_desc(&self.y_label)
                    .x_label_formatter(&x_fmt)
                    .y_label_formatter(&y_fmt)
                    .label_style(("sans-serif", 15))
                    .axis_desc_style(("sans-serif", 17));
                // A count on a linear axis (processors, VMs) is ticked at
                // whole numbers only, not at 1.1, 1.2, ...
                if let Some(n) = self.integer_ticks() {
                    mesh.x_labels(n);
                }
                mesh.draw()?;
                for (i, s) in self.series.iter().enumerate() {
                    let color = COLORS[i % COLORS.len()];
                    let style = ShapeStyle::from(&color).stroke_width(2);
                    let pts: Vec<(f64, f64)> = s
                        .points
                        .iter()
                        .filter(|p| p.y.is_finite() && p.y > 0.0)
                        .map(|p| (p.x, p.y))
                        .collect();
                    c.draw_series(LineSeries::new(pts.clone(), style))?
                        .label(&s.name)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                        });
                    c.draw_series(
                        pts.iter()
                            .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
                    )?;
                    // 95 % intervals.
                    c.draw_series(
                        s.points
                            .iter()
                            .filter(|p| p.lo.is_finite() && p.hi.is_finite() && p.lo > 0.0)
                            .map(|p| {
                                PathElement::new(
                                    vec![(p.x, p.lo), (p.x, p.hi)],
                                    color.stroke_width(1),
                                )
                            }),
                    )?;
                }
                // Rising lines leave the lower right free, falling ones the upper.
                let rising = self.series.iter().all(|s| {
                    s.points
                        .first()
                        .zip(s.points.last())
                        .is_none_or(|(a, b)| b.y >= a.y)
                });
                c.configure_series_labels()
                    .position(if rising {
                        SeriesLabelPosition::LowerRight
                    } else {
                        SeriesLabelPosition::UpperRight
                    })
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .label_font(("sans-serif", 15))
                    .draw()?;
            }};
        }
        match (self.log2_x, self.log2_y) {
            (true, true) => finish!(
                (x0..x1).log_scale().base(2.0),
                (y0..y1).log_scale().base(2.0)
            ),
            (true, false) => finish!((x0..x1).log_scale().base(2.0), y0..y1),
            (false, true) => finish!(x0..x1, (y0..y1).log_scale().base(2.0)),
            (false, false) => finish!(x0..x1, y0..y1),
        }
        Ok(())
    }
}

/// Axis numbers: whole numbers as they are (`12`, `1024`), fractions with
/// two decimals (`2.50`), very large or small ones in exponent form (`2.5e5`).
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(0.01..100_000.0).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 10.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// x tick labels for byte sizes on a log-2 axis: `512`, `4ki`, `1Mi`
/// (giacobbi's labels) at powers of two, nothing between.
pub fn bytes_tick(v: f64) -> String {
    let r = v.round();
    if r >= 1.0 && (v - r).abs() < 1e-6 * r && (r as u64).is_power_of_two() {
        crate::units::short_iec(r as u64)
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> LineChart {
        let s = |name: &str, k: f64| Series {
            name: name.into(),
            points: (9..=20)
                .map(|e| {
                    let x = (1u64 << e) as f64;
                    let y = k * (x / 4096.0).min(16.0);
                    SeriesPoint {
                        x,
                        y,
                        lo: y * 0.95,
                        hi: y * 1.05,
                    }
                })
                .collect(),
        };
        LineChart {
            title: "direct-read: speed vs block size".into(),
            x_label: "block size (B)".into(),
            y_label: "speed (MiB/s)".into(),
            log2_x: true,
            log2_y: true,
            x_tick: bytes_tick,
            series: vec![s("host", 10.0), s("vm file raw", 4.0)],
        }
    }

    #[test]
    fn writes_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let (svg, png) = chart().write(&dir.path().join("io-direct-read")).unwrap();
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        assert!(svg_text.starts_with("<svg"), "{}", &svg_text[..40]);
        assert!(svg_text.contains("vm file raw") && svg_text.contains("4ki"));
        let png_bytes = std::fs::read(&png).unwrap();
        assert_eq!(&png_bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(png_bytes.len() > 10_000, "{} bytes", png_bytes.len());
        // Linear axes and an empty chart render too.
        let mut c = chart();
        c.log2_x = false;
        c.log2_y = false;
        c.write_png(&dir.path().join("lin.png")).unwrap();
        c.series.clear();
        c.write_svg(&dir.path().join("empty.svg")).unwrap();
        // Both carry vmscope's marker, so a rerun replaces them, and a file
        // vmscope did not write under a chart's name is left alone.
        assert!(svg_text.contains(vmscope_store::output::MARKER));
        assert!(png_bytes.windows(16).any(|w| w == b"Software\0vmscope"));
        chart().write(&dir.path().join("io-direct-read")).unwrap();
        let mine = dir.path().join("mine.png");
        std::fs::write(&mine, b"my own picture").unwrap();
        let e = chart().write_png(&mine).unwrap_err().to_string();
        assert!(e.contains("not a file vmscope made"), "{e}");
        assert_eq!(std::fs::read(&mine).unwrap(), b"my own picture");
    }

    /// A count on the x axis (bench scale's N = 1, 2) is ticked at whole
    /// numbers only.
    #[test]
    fn counts_are_ticked_at_whole_numbers() {
        let pt = |x: f64| SeriesPoint {
            x,
            y: 10.0 * x,
            lo: 9.0 * x,
            hi: 11.0 * x,
        };
        let c = LineChart {
            title: "scale".into(),
            x_label: "N".into(),
            y_label: "rate".into(),
            log2_x: false,
            log2_y: false,
            x_tick: fmt_num,
            series: vec![Series {
                name: "host".into(),
                points: vec![pt(1.0), pt(2.0)],
            }],
        };
        let svg = c.svg().unwrap();
        let labels: Vec<&str> = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .map(str::trim)
            .filter(|t| t.parse::<f64>().is_ok())
            .collect();
        for bad in ["1.10", "1.20", "1.50", "1.90"] {
            assert!(!labels.contains(&bad), "tick {bad} in {labels:?}");
        }
        assert!(labels.contains(&"1") && labels.contains(&"2"), "{labels:?}");
    }

    #[test]
    fn ticks_and_numbers() {
        assert_eq!(bytes_tick(4096.0), "4ki");
        assert_eq!(bytes_tick(1048576.0), "1Mi");
        assert_eq!(bytes_tick(3000.0), "");
        assert_eq!(fmt_num(1024.0), "1024");
        assert_eq!(fmt_num(2.5), "2.50");
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(250000.0), "2.5e5");
    }
}
