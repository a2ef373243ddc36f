//! Figures of benchmark results as SVG, PNG and PDF.
//!
//! A figure ([`Plot`]) is written as SVG by this module — a few hundred
//! lines that know exactly where every label goes, measured with the
//! font's own advance widths, so nothing is cut off — and turned into PNG by
//! `resvg` and into PDF by `svg2pdf` (a vector PDF with the font embedded and
//! subset). Both are well kept (linebender's and typst's), pure Rust, and
//! read the font shipped in `fonts/` (DejaVu Sans, Bitstream Vera licence,
//! `fonts/LICENSE-DejaVu.txt`), so figures look the same on a machine with
//! no fonts installed and draw lower case, Greek and symbols (θ, ×, µ, ±).
//! `plotters` was the first choice, but its released version (0.3.7) loads
//! TrueType fonts only through `font-kit`, which needs the system's
//! fontconfig and fonts, and without that draws no text into bitmaps.
//!
//! What a figure shows:
//! - one panel per unit (throughput beside bytes per operation, say);
//! - distinct colours and markers for up to 60 series (ten colours × six
//!   filled shapes, and dashes after the first ten);
//! - the paper's values as unconnected hollow markers in their series'
//!   colour, never as a line (the paper publishes points, not curves);
//! - a log x axis where a sweep is geometric (1, 2, 4, 8…), a log y axis
//!   where the values span more than two and a half decades;
//! - horizontal bars where each series has one point (a table of
//!   systems × workloads), and a reference line at 1 for speed-ups (unit
//!   "x"), as in a factor analysis.
//!
//! The SVG files keep their text as text (editable; viewers without DejaVu
//! Sans fall back to another sans-serif font); PNG and PDF carry the font.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use resvg::usvg;

use crate::ycsb_bench::YcsbResult;

/// The font every figure is drawn with (DejaVu Sans; see
/// `fonts/LICENSE-DejaVu.txt`).
pub static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
const FONT_FAMILY: &str = "DejaVu Sans";

/// Why a figure could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The output file's extension names no format this module writes.
    #[error("{0}: unknown figure format (use a .png, .svg or .pdf file name)")]
    Format(String),
    /// The SVG could not be turned into PNG or PDF (a bug here).
    #[error("rendering {0}")]
    Render(String),
    /// Writing the file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
}

/// A figure file's format, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Vector, text kept as text.
    Svg,
    /// Raster, twice the SVG's size in pixels.
    Png,
    /// Vector, the font embedded.
    Pdf,
}

impl Format {
    /// The format a file name asks for (its extension, any case); call it
    /// before a long run, so a wrong name fails at once.
    pub fn of_path(path: &Path) -> Result<Format, PlotError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            Some("pdf") => Ok(Format::Pdf),
            _ => Err(PlotError::Format(path.display().to_string())),
        }
    }
}

/// One measured point of a series.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The series (line) the point belongs to, e.g. "art c sim".
    pub series: String,
    /// Position on the x axis (threads, for YCSB results).
    pub x: f64,
    /// Position on the y axis (Mops, for YCSB results).
    pub y: f64,
}

impl Point {
    fn of(r: &YcsbResult) -> Point {
        Point {
            series: format!("{} {} {}", r.index, r.workload, r.backend),
            x: r.threads as f64,
            y: r.mops,
        }
    }
}

/// A simple line chart: one panel, series by name. Series named
/// "NAME (paper)" are drawn as the paper's values of series NAME.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Drawn above the plot area.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Series name → points sorted by x.
    pub series: BTreeMap<String, Vec<(f64, f64)>>,
}

/// Throughput vs threads of YCSB results.
pub fn throughput_vs_threads(rs: &[YcsbResult]) -> Chart {
    chart_of_points(&rs.iter().map(Point::of).collect::<Vec<_>>())
}

/// A throughput-vs-threads chart of points.
pub fn chart_of_points(ps: &[Point]) -> Chart {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in ps {
        series.entry(p.series.clone()).or_default().push((p.x, p.y));
    }
    for v in series.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Chart {
        title: "YCSB throughput".into(),
        x_label: "threads".into(),
        y_label: "Mops".into(),
        series,
    }
}

/// `points` sorted by x, the points that share an x (the runs of one
/// point under `--repeat`) replaced by their mean: a repeated sweep draws
/// one line through each point's mean, not a zigzag through its runs.
pub fn mean_by_x(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
    let mut i = 0;
    while i < sorted.len() {
        let x = sorted[i].0;
        let same: Vec<f64> = sorted[i..]
            .iter()
            .take_while(|p| p.0.total_cmp(&x).is_eq())
            .map(|p| p.1)
            .collect();
        i += same.len();
        out.push((x, same.iter().sum::<f64>() / same.len() as f64));
    }
    out
}

/// A series: measured points, and the paper's where it states them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Measured (or reproduced) points, joined by a line.
    pub points: Vec<(f64, f64)>,
    /// The paper's points: hollow markers, not joined.
    pub paper: Vec<(f64, f64)>,
}

/// An axis' scale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scale {
    /// Log where the data ask for it (see the module docs), else linear.
    #[default]
    Auto,
    /// Linear.
    Linear,
    /// Logarithmic.
    Log,
}

/// How a panel draws its series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kind {
    /// Bars when every series has at most one point, else lines.
    #[default]
    Auto,
    /// Lines with markers.
    Line,
    /// Horizontal bars, one per series (each series' first point).
    Bar,
}

/// One panel of a figure.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    /// Above the panel (may be empty).
    pub title: String,
    /// What the x values are.
    pub x_label: String,
    /// What the y values are (the value axis of bars).
    pub y_label: String,
    /// The series, in legend order.
    pub series: Vec<Series>,
    /// Lines or bars.
    pub kind: Kind,
    /// Scale of the x axis (lines only).
    pub x_scale: Scale,
    /// Scale of the y axis.
    pub y_scale: Scale,
    /// A reference value drawn as a dashed line (1 for speed-ups).
    pub reference: Option<f64>,
}

/// A figure: a title and its panels.
#[derive(Debug, Clone, Default)]
pub struct Plot {
    /// Above everything.
    pub title: String,
    /// The panels, laid out in rows.
    pub panels: Vec<Panel>,
}

impl From<&Chart> for Plot {
    fn from(c: &Chart) -> Plot {
        let mut series: Vec<Series> = Vec::new();
        for (name, pts) in &c.series {
            if name.ends_with(" (paper)") {
                continue;
            }
            series.push(Series {
                name: name.clone(),
                points: mean_by_x(pts),
                paper: Vec::new(),
            });
        }
        for (name, pts) in &c.series {
            if let Some(base) = name.strip_suffix(" (paper)") {
                match series.iter_mut().find(|s| s.name == base) {
                    Some(s) => s.paper = pts.clone(),
                    None => series.push(Series {
                        name: name.clone(),
                        points: Vec::new(),
                        paper: pts.clone(),
                    }),
                }
            }
        }
        Plot {
            title: c.title.clone(),
            panels: vec![Panel {
                x_label: c.x_label.clone(),
                y_label: c.y_label.clone(),
                series,
                kind: Kind::Line,
                ..Panel::default()
            }],
        }
    }
}

/// A row of a reproduced figure, as [`figure_plot`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureRow {
    /// The curve.
    pub series: String,
    /// x coordinate.
    pub x: f64,
    /// Reproduced value.
    pub value: f64,
    /// Unit of `value`: one panel per unit.
    pub unit: String,
    /// The paper's value, if stated.
    pub published: Option<f64>,
}

/// A reproduced figure's rows as a plot: one panel per unit, in the order
/// the units first appear; speed-ups (unit "x") get a reference line at 1.
pub fn figure_plot(title: &str, x_label: &str, rows: &[FigureRow]) -> Plot {
    let mut units: Vec<String> = Vec::new();
    for r in rows {
        if !units.contains(&r.unit) {
            units.push(r.unit.clone());
        }
    }
    let panels = units
        .iter()
        .map(|u| {
            let mut series: Vec<Series> = Vec::new();
            for r in rows.iter().filter(|r| &r.unit == u) {
                let i = match series.iter().position(|s| s.name == r.series) {
                    Some(i) => i,
                    None => {
                        series.push(Series {
                            name: r.series.clone(),
                            ..Series::default()
                        });
                        series.len() - 1
                    }
                };
                series[i].points.push((r.x, r.value));
                if let Some(p) = r.published {
                    series[i].paper.push((r.x, p));
                }
            }
            Panel {
                title: String::new(),
                x_label: x_label.into(),
                y_label: if u == "x" {
                    "speed-up (×)".into()
                } else {
                    u.clone()
                },
                series,
                reference: (u == "x").then_some(1.0),
                ..Panel::default()
            }
        })
        .collect();
    Plot {
        title: title.into(),
        panels,
    }
}

/// Writes a chart; the format follows the file's extension (.png, .svg,
/// .pdf).
pub fn write_png(c: &Chart, path: &Path) -> Result<(), PlotError> {
    write(&Plot::from(c), path)
}

/// Writes a plot; the format follows the file's extension (.png, .svg,
/// .pdf).
pub fn write(p: &Plot, path: &Path) -> Result<(), PlotError> {
    let bytes = match Format::of_path(path)? {
        Format::Svg => svg(p).into_bytes(),
        Format::Png => png(p)?,
        Format::Pdf => pdf(p)?,
    };
    std::fs::write(path, bytes).map_err(|source| PlotError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn fontdb() -> Arc<usvg::fontdb::Database> {
    static DB: OnceLock<Arc<usvg::fontdb::Database>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_font_data(FONT.to_vec());
        db.set_sans_serif_family(FONT_FAMILY);
        Arc::new(db)
    })
    .clone()
}

fn tree(p: &Plot) -> Result<usvg::Tree, PlotError> {
    let opt = usvg::Options {
        fontdb: fontdb(),
        font_family: FONT_FAMILY.into(),
        ..usvg::Options::default()
    };
    usvg::Tree::from_str(&svg(p), &opt).map_err(|e| PlotError::Render(format!("the SVG: {e}")))
}

/// The plot as a PNG (twice the SVG's pixels, for print).
pub fn png(p: &Plot) -> Result<Vec<u8>, PlotError> {
    let t = tree(p)?;
    let size = t
        .size()
        .to_int_size()
        .scale_by(2.0)
        .ok_or_else(|| PlotError::Render("the PNG: the figure has no area".into()))?;
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| PlotError::Render("the PNG: the figure has no area".into()))?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(
        &t,
        resvg::tiny_skia::Transform::from_scale(2.0, 2.0),
        &mut pixmap.as_mut(),
    );
    pixmap
        .encode_png()
        .map_err(|e| PlotError::Render(format!("the PNG: {e}")))
}

/// The plot as a PDF (vector, the font embedded).
pub fn pdf(p: &Plot) -> Result<Vec<u8>, PlotError> {
    let t = tree(p)?;
    svg2pdf::to_pdf(
        &t,
        svg2pdf::ConversionOptions::default(),
        svg2pdf::PageOptions::default(),
    )
    .map_err(|e| PlotError::Render(format!("the PDF: {e}")))
}

// ---- layout -------------------------------------------------------------

/// matplotlib's "tab10": ten colours that stay apart on white and in print.
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
const SHAPES: usize = 6;
const DASHES: [&str; 3] = ["", "7 3", "2 2"];

fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

fn shape(i: usize) -> usize {
    // Each pass through the colours shifts the shapes, so colour and shape
    // together stay distinct for 60 series.
    (i + i / PALETTE.len()) % SHAPES
}

fn dash(i: usize) -> &'static str {
    DASHES[(i / PALETTE.len()) % DASHES.len()]
}

const TITLE: f64 = 17.0;
const PANEL_TITLE: f64 = 14.0;
const LABEL: f64 = 13.0;
const TICK: f64 = 11.5;
const LEGEND: f64 = 12.0;
const LEGEND_ROW: f64 = 18.0;
const GAP: f64 = 24.0;
const MAX_WIDTH: f64 = 1400.0;

/// Width of `s` at `size` px in the shipped font.
pub fn text_width(s: &str, size: f64) -> f64 {
    static FACE: OnceLock<Option<(Vec<u16>, f64)>> = OnceLock::new();
    let face = FACE.get_or_init(|| {
        let f = ttf_parser::Face::parse(FONT, 0).ok()?;
        // Advances of the Basic Multilingual Plane's first 0x2500 code
        // points; others (rare here) count as an average glyph.
        let adv = (0u32..0x2500)
            .map(|c| {
                char::from_u32(c)
                    .and_then(|ch| f.glyph_index(ch))
                    .and_then(|g| f.glyph_hor_advance(g))
                    .unwrap_or(0)
            })
            .collect();
        Some((adv, f.units_per_em() as f64))
    });
    match face {
        Some((adv, em)) => {
            s.chars()
                .map(|c| match adv.get(c as usize) {
                    Some(&a) if a > 0 => a as f64 / em,
                    _ => 0.62,
                })
                .sum::<f64>()
                * size
        }
        None => s.chars().count() as f64 * 0.62 * size,
    }
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

/// Text with its baseline placed so that `y` is its vertical middle.
fn text(o: &mut String, x: f64, y: f64, size: f64, anchor: &str, s: &str) {
    let _ = writeln!(
        o,
        r#"<text x="{x:.1}" y="{:.1}" font-size="{size}" text-anchor="{anchor}">{}</text>"#,
        y + 0.36 * size,
        esc(s)
    );
}

fn marker(o: &mut String, x: f64, y: f64, shape: usize, r: f64, fill: &str, stroke: &str) {
    let sw = if fill == "white" { 1.6 } else { 0.8 };
    let style = format!(r#"fill="{fill}" stroke="{stroke}" stroke-width="{sw}""#);
    let poly = |o: &mut String, pts: &[(f64, f64)]| {
        let p: Vec<String> = pts
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x + a * r, y + b * r))
            .collect();
        let _ = writeln!(o, r#"<polygon points="{}" {style}/>"#, p.join(" "));
    };
    match shape {
        0 => {
            let _ = writeln!(
                o,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="{:.1}" {style}/>"#,
                r * 0.95
            );
        }
        1 => poly(
            o,
            &[(-0.85, -0.85), (0.85, -0.85), (0.85, 0.85), (-0.85, 0.85)],
        ),
        2 => poly(o, &[(0.0, -1.15), (1.05, 0.75), (-1.05, 0.75)]),
        3 => poly(o, &[(0.0, -1.2), (1.1, 0.0), (0.0, 1.2), (-1.1, 0.0)]),
        4 => poly(o, &[(0.0, 1.15), (1.05, -0.75), (-1.05, -0.75)]),
        _ => poly(
            o,
            &[
                (1.0, 0.0),
                (0.5, 0.87),
                (-0.5, 0.87),
                (-1.0, 0.0),
                (-0.5, -0.87),
                (0.5, -0.87),
            ],
        ),
    }
}

/// A value axis: its range, scale and ticks.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<(f64, String)>,
}

impl Axis {
    fn pos(&self, v: f64, from: f64, to: f64) -> f64 {
        let f = if self.log {
            (v.max(f64::MIN_POSITIVE).log10() - self.lo.log10())
                / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        from + f * (to - from)
    }
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:e}");
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

fn nice_step(span: f64, want: f64) -> f64 {
    let raw = span / want;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let n = if f < 1.5 {
        1.0
    } else if f < 3.0 {
        2.0
    } else if f < 7.0 {
        5.0
    } else {
        10.0
    };
    n * mag
}

/// Geometric sweeps (1, 2, 4, 8 or 8, 32, 96): positive, at least three
/// distinct values, each at least 1.5× the one before, spanning 8× or more.
fn geometric(xs: &[f64]) -> bool {
    let mut d: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    d.sort_by(f64::total_cmp);
    d.dedup();
    d.len() >= 3
        && d[0] > 0.0
        && d[d.len() - 1] / d[0] >= 8.0
        && d.windows(2).all(|w| w[1] / w[0] >= 1.5)
}

fn axis(values: &[f64], scale: Scale, from_zero: bool, data_ticks: bool) -> Axis {
    let vs: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let (mut lo, mut hi) = vs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    if vs.is_empty() {
        (lo, hi) = (0.0, 1.0);
    }
    let positive = !vs.is_empty() && lo > 0.0;
    let log = match scale {
        Scale::Log => positive,
        Scale::Linear => false,
        Scale::Auto => {
            if data_ticks {
                positive && geometric(&vs)
            } else {
                positive && hi / lo > 300.0
            }
        }
    };
    if log {
        let mut distinct = vs.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        let ticks: Vec<(f64, String)> = if data_ticks && distinct.len() <= 12 {
            distinct.iter().map(|&v| (v, fmt_num(v))).collect()
        } else {
            let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
            (a..=b)
                .map(|e| 10f64.powi(e))
                .map(|v| (v, fmt_num(v)))
                .collect()
        };
        let (tlo, thi) = (
            ticks.first().map_or(lo, |t| t.0).min(lo),
            ticks.last().map_or(hi, |t| t.0).max(hi),
        );
        // A little room around the ends, in log space.
        let pad = ((thi / tlo).log10() * 0.04).max(0.02);
        return Axis {
            lo: tlo / 10f64.powf(pad),
            hi: thi * 10f64.powf(pad),
            log: true,
            ticks,
        };
    }
    if from_zero {
        lo = lo.min(0.0);
        hi = hi.max(0.0);
    }
    if hi - lo < 1e-12 {
        let d = if lo.abs() > 0.0 { lo.abs() * 0.1 } else { 1.0 };
        lo -= d;
        hi += d;
    }
    let step = nice_step(hi - lo, 5.0);
    let (a, b) = ((lo / step).floor(), (hi / step).ceil());
    let ticks = (a as i64..=b as i64)
        .map(|k| k as f64 * step)
        .map(|v| (v, fmt_num((v / step).round() * step)))
        .collect();
    // An x axis (not from zero) leaves room so end markers clear the frame.
    let pad = if from_zero {
        0.0
    } else {
        0.03 * (b - a) * step
    };
    Axis {
        lo: a * step - pad,
        hi: b * step + pad,
        log: false,
        ticks,
    }
}

/// A panel drawn at the origin: its SVG and its size.
struct Drawn {
    svg: String,
    w: f64,
    h: f64,
}

fn is_bar(p: &Panel) -> bool {
    match p.kind {
        Kind::Bar => true,
        Kind::Line => false,
        Kind::Auto => {
            !p.series.is_empty()
                && p.series
                    .iter()
                    .all(|s| s.points.len() <= 1 && s.paper.len() <= 1)
        }
    }
}

fn finite(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = pts
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

fn draw_line_panel(p: &Panel) -> Drawn {
    let xs: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().chain(&s.paper).map(|q| q.0))
        .collect();
    let mut ys: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().chain(&s.paper).map(|q| q.1))
        .collect();
    ys.extend(p.reference);
    let xa = axis(&xs, p.x_scale, false, true);
    let ya = axis(&ys, p.y_scale, true, false);
    let any_paper = p.series.iter().any(|s| !s.paper.is_empty());
    // Legend rows: every series, then what hollow markers mean.
    let mut legend: Vec<(Option<usize>, String)> = p
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| (Some(i), s.name.clone()))
        .collect();
    if any_paper {
        legend.push((None, "hollow: the paper's value".into()));
    }
    let legend_w = 40.0
        + legend
            .iter()
            .map(|(_, t)| text_width(t, LEGEND))
            .fold(0.0, f64::max);
    let tick_w = ya
        .ticks
        .iter()
        .map(|t| text_width(&t.1, TICK))
        .fold(0.0, f64::max);
    let top = if p.title.is_empty() { 10.0 } else { 30.0 };
    let left = 10.0 + LABEL + 10.0 + tick_w + 8.0;
    let pw = 430.0f64.max(text_width(&p.x_label, LABEL) + 20.0);
    let ph = 270.0f64.max(legend.len() as f64 * LEGEND_ROW + 10.0);
    let bottom = TICK + 14.0 + LABEL + 14.0;
    let w = left + pw + 18.0 + legend_w;
    let h = top + ph + bottom;
    let (x0, x1, y0, y1) = (left, left + pw, top + ph, top);
    let mut o = String::new();
    if !p.title.is_empty() {
        text(&mut o, w / 2.0, 14.0, PANEL_TITLE, "middle", &p.title);
    }
    // Grid, ticks and frame.
    let _ = writeln!(o, r##"<g stroke="#e3e3e3" stroke-width="1">"##);
    for (v, _) in &ya.ticks {
        let y = ya.pos(*v, y0, y1);
        let _ = writeln!(
            o,
            r#"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}"/>"#
        );
    }
    for (v, _) in &xa.ticks {
        let x = xa.pos(*v, x0, x1);
        let _ = writeln!(
            o,
            r#"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}"/>"#
        );
    }
    let _ = writeln!(o, "</g>");
    let _ = writeln!(
        o,
        r##"<rect x="{x0:.1}" y="{y1:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333" stroke-width="1"/>"##
    );
    let mut last_x = f64::NEG_INFINITY;
    for (v, t) in &xa.ticks {
        let x = xa.pos(*v, x0, x1);
        let tw = text_width(t, TICK);
        // Skip labels that would overlap the previous one.
        if x - tw / 2.0 < last_x + 4.0 {
            continue;
        }
        last_x = x + tw / 2.0;
        text(&mut o, x, y0 + 5.0 + TICK / 2.0 + 2.0, TICK, "middle", t);
    }
    for (v, t) in &ya.ticks {
        let y = ya.pos(*v, y0, y1);
        text(&mut o, x0 - 6.0, y, TICK, "end", t);
    }
    text(
        &mut o,
        (x0 + x1) / 2.0,
        y0 + TICK + 14.0 + LABEL / 2.0 + 4.0,
        LABEL,
        "middle",
        &format!("{}{}", p.x_label, if xa.log { " (log scale)" } else { "" }),
    );
    let (lx, ly) = (10.0 + LABEL / 2.0, (y0 + y1) / 2.0);
    let _ = writeln!(o, r#"<g transform="rotate(-90 {lx:.1} {ly:.1})">"#);
    text(
        &mut o,
        lx,
        ly,
        LABEL,
        "middle",
        &format!("{}{}", p.y_label, if ya.log { " (log scale)" } else { "" }),
    );
    let _ = writeln!(o, "</g>");
    if let Some(r) = p.reference {
        let y = ya.pos(r, y0, y1);
        let _ = writeln!(
            o,
            r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#555" stroke-dasharray="5 4"/>"##
        );
    }
    // Series: lines, then filled markers, then the paper's hollow ones.
    let _ = writeln!(
        o,
        r#"<clipPath id="clip"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath>"#,
        x0 - 8.0,
        y1 - 8.0,
        pw + 16.0,
        ph + 16.0
    );
    let _ = writeln!(o, r#"<g clip-path="url(#clip)">"#);
    for (i, s) in p.series.iter().enumerate() {
        let pts = finite(&s.points);
        if pts.len() >= 2 {
            let d: Vec<String> = pts
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", xa.pos(x, x0, x1), ya.pos(y, y0, y1)))
                .collect();
            let da = match dash(i) {
                "" => String::new(),
                d => format!(r#" stroke-dasharray="{d}""#),
            };
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{da}/>"#,
                d.join(" "),
                colour(i)
            );
        }
        for (x, y) in pts {
            marker(
                &mut o,
                xa.pos(x, x0, x1),
                ya.pos(y, y0, y1),
                shape(i),
                4.2,
                colour(i),
                colour(i),
            );
        }
    }
    for (i, s) in p.series.iter().enumerate() {
        for (x, y) in finite(&s.paper) {
            marker(
                &mut o,
                xa.pos(x, x0, x1),
                ya.pos(y, y0, y1),
                shape(i),
                6.0,
                "white",
                colour(i),
            );
        }
    }
    let _ = writeln!(o, "</g>");
    // Legend, right of the plot area.
    let lx = x1 + 18.0;
    for (k, (i, t)) in legend.iter().enumerate() {
        let y = y1 + 8.0 + k as f64 * LEGEND_ROW;
        match i {
            Some(i) => {
                let da = match dash(*i) {
                    "" => String::new(),
                    d => format!(r#" stroke-dasharray="{d}""#),
                };
                let _ = writeln!(
                    o,
                    r#"<line x1="{lx:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{da}/>"#,
                    lx + 28.0,
                    colour(*i)
                );
                marker(&mut o, lx + 14.0, y, shape(*i), 4.2, colour(*i), colour(*i));
            }
            None => marker(&mut o, lx + 14.0, y, 0, 6.0, "white", "#555"),
        }
        text(&mut o, lx + 36.0, y, LEGEND, "start", t);
    }
    Drawn { svg: o, w, h }
}

fn draw_bar_panel(p: &Panel) -> Drawn {
    let bars: Vec<(usize, &Series, Option<f64>, Option<f64>)> = p
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let v = s.points.first().map(|q| q.1).filter(|v| v.is_finite());
            let pp = s.paper.first().map(|q| q.1).filter(|v| v.is_finite());
            (i, s, v, pp)
        })
        .collect();
    let mut vs: Vec<f64> = bars
        .iter()
        .flat_map(|b| b.2.into_iter().chain(b.3))
        .collect();
    vs.extend(p.reference);
    let va = axis(&vs, p.y_scale, true, false);
    let any_paper = bars.iter().any(|b| b.3.is_some());
    let label_w = bars
        .iter()
        .map(|b| text_width(&b.1.name, LEGEND))
        .fold(0.0, f64::max);
    let top = if p.title.is_empty() { 10.0 } else { 30.0 };
    let row = 22.0;
    let left = 10.0 + label_w + 10.0;
    let pw = 380.0f64.max(text_width(&p.y_label, LABEL) + 20.0);
    let ph = bars.len() as f64 * row + 8.0;
    let note = any_paper.then_some("hollow: the paper's value");
    let bottom = TICK
        + 14.0
        + LABEL
        + 14.0
        + if note.is_some() {
            LEGEND_ROW + 4.0
        } else {
            0.0
        };
    // The last tick label may stick out to the right.
    let w = left + pw + 30.0;
    let h = top + ph + bottom;
    let (x0, x1, y0, y1) = (left, left + pw, top + ph, top);
    let mut o = String::new();
    if !p.title.is_empty() {
        text(&mut o, w / 2.0, 14.0, PANEL_TITLE, "middle", &p.title);
    }
    let _ = writeln!(o, r##"<g stroke="#e3e3e3" stroke-width="1">"##);
    for (v, _) in &va.ticks {
        let x = va.pos(*v, x0, x1);
        let _ = writeln!(
            o,
            r#"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}"/>"#
        );
    }
    let _ = writeln!(o, "</g>");
    let _ = writeln!(
        o,
        r##"<rect x="{x0:.1}" y="{y1:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333" stroke-width="1"/>"##
    );
    let mut last_x = f64::NEG_INFINITY;
    for (v, t) in &va.ticks {
        let x = va.pos(*v, x0, x1);
        let tw = text_width(t, TICK);
        if x - tw / 2.0 < last_x + 4.0 {
            continue;
        }
        last_x = x + tw / 2.0;
        text(&mut o, x, y0 + 5.0 + TICK / 2.0 + 2.0, TICK, "middle", t);
    }
    text(
        &mut o,
        (x0 + x1) / 2.0,
        y0 + TICK + 14.0 + LABEL / 2.0 + 4.0,
        LABEL,
        "middle",
        &format!("{}{}", p.y_label, if va.log { " (log scale)" } else { "" }),
    );
    let base = if va.log { va.lo } else { 0.0 };
    for (k, (i, s, v, pp)) in bars.iter().enumerate() {
        let yc = y1 + 4.0 + row * (k as f64 + 0.5);
        text(&mut o, x0 - 6.0, yc, LEGEND, "end", &s.name);
        if let Some(v) = v {
            let (a, b) = (va.pos(base, x0, x1), va.pos(*v, x0, x1));
            let _ = writeln!(
                o,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{c}" fill-opacity="0.75" stroke="{c}"/>"#,
                a.min(b),
                yc - row * 0.35,
                (b - a).abs().max(0.5),
                row * 0.7,
                c = colour(*i)
            );
        }
        if let Some(pv) = pp {
            marker(&mut o, va.pos(*pv, x0, x1), yc, 3, 6.5, "white", colour(*i));
        }
    }
    if let Some(r) = p.reference {
        let x = va.pos(r, x0, x1);
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}" stroke="#333" stroke-dasharray="5 4"/>"##
        );
    }
    if let Some(n) = note {
        let y = h - LEGEND_ROW / 2.0 - 2.0;
        marker(&mut o, x0 + 8.0, y, 3, 6.0, "white", "#555");
        text(&mut o, x0 + 20.0, y, LEGEND, "start", n);
    }
    Drawn { svg: o, w, h }
}

/// The plot as an SVG document.
pub fn svg(p: &Plot) -> String {
    let drawn: Vec<Drawn> = if p.panels.is_empty() {
        vec![Drawn {
            svg: String::new(),
            w: 300.0,
            h: 40.0,
        }]
    } else {
        p.panels
            .iter()
            .map(|q| {
                if q.series
                    .iter()
                    .all(|s| s.points.is_empty() && s.paper.is_empty())
                {
                    let mut o = String::new();
                    text(&mut o, 150.0, 30.0, LABEL, "middle", "(no data)");
                    Drawn {
                        svg: o,
                        w: 300.0,
                        h: 60.0,
                    }
                } else if is_bar(q) {
                    draw_bar_panel(q)
                } else {
                    draw_line_panel(q)
                }
            })
            .collect()
    };
    // Rows of panels, each row as wide as fits MAX_WIDTH.
    let mut rows: Vec<Vec<usize>> = vec![Vec::new()];
    let mut row_w = 0.0;
    for (i, d) in drawn.iter().enumerate() {
        let last = rows.last_mut().expect("one row at least");
        if !last.is_empty() && row_w + GAP + d.w > MAX_WIDTH {
            rows.push(vec![i]);
            row_w = d.w;
        } else {
            row_w += if last.is_empty() { d.w } else { GAP + d.w };
            last.push(i);
        }
    }
    let title_h = if p.title.is_empty() {
        8.0
    } else {
        TITLE + 22.0
    };
    let width = rows
        .iter()
        .map(|r| r.iter().map(|&i| drawn[i].w).sum::<f64>() + GAP * (r.len() as f64 - 1.0))
        .fold(text_width(&p.title, TITLE) + 24.0, f64::max)
        + 16.0;
    let mut body = String::new();
    let mut y = title_h;
    for (k, r) in rows.iter().enumerate() {
        let mut x = 8.0;
        let rh = r.iter().map(|&i| drawn[i].h).fold(0.0, f64::max);
        for &i in r {
            // Each panel's clip path gets an id of its own.
            let s = drawn[i]
                .svg
                .replace("id=\"clip\"", &format!("id=\"clip{k}_{i}\""))
                .replace("url(#clip)", &format!("url(#clip{k}_{i})"));
            let _ = writeln!(body, r#"<g transform="translate({x:.1} {y:.1})">"#);
            body.push_str(&s);
            body.push_str("</g>\n");
            x += drawn[i].w + GAP;
        }
        y += rh + GAP;
    }
    let height = y - GAP + 10.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="{FONT_FAMILY}, Verdana, sans-serif">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    if !p.title.is_empty() {
        text(&mut o, width / 2.0, 18.0, TITLE, "middle", &p.title);
    }
    o.push_str(&body);
    o.push_str("</svg>\n");
    o
}

// ---- any JSON dmkit writes ----------------------------------------------

/// Fields a sweep varies, in the order `--x` picks its default from, and
/// that split records into series when they vary but are not on the x axis.
const SWEPT: [&str; 26] = [
    "threads",
    "coros",
    "tasks",
    "size",
    "message_size",
    "msg_size",
    "value_size",
    "batch",
    "depth",
    "theta",
    "zipf",
    "machines",
    "memory_nodes",
    "front_ends",
    "executors",
    "servers",
    "clients",
    "keys",
    "region_size",
    "key_size",
    "cache",
    "c_max",
    "hot_keys",
    "read_ratio",
    "outstanding",
    "qps",
];

/// Appended to the title of a quick run's figure (`sim reproduce
/// --quick`, and `dmkit plot` of its JSON, whose provenance says `quick`).
pub const QUICK_MARK: &str = " — quick run, not a reproduction";

/// Text fields of results that are messages, not settings: never a
/// series.
const FREE_TEXT: [&str; 5] = [
    "oversubscribed",
    "invariants_error",
    "error",
    "command",
    "note",
];

/// Text fields that name what a record measured (its legend text).
const NAMES: [&str; 10] = [
    "index", "workload", "system", "method", "op", "kind", "app", "name", "backend", "mode",
];

/// Which fields [`of_json`] plots.
#[derive(Debug, Clone, Default)]
pub struct Select {
    /// The x axis: any numeric field (a dotted path reaches nested ones),
    /// default: the first of the usual swept fields that varies.
    pub x: Option<String>,
    /// The y axis: any numeric field, default `mops`.
    pub y: Option<String>,
    /// Fields whose values name the series, default: the naming text fields
    /// present and the swept fields that vary (other than x).
    pub series: Option<Vec<String>>,
}

fn field<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn shown(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.as_f64().map_or(n.to_string(), fmt_num),
        other => other.to_string(),
    }
}

/// The records of one JSON document dmkit wrote: a list of results, a
/// sweep's or `--repeat`'s `runs`, or one result.
fn records(doc: &serde_json::Value) -> Vec<&serde_json::Value> {
    match doc {
        serde_json::Value::Array(a) => a.iter().filter(|v| v.is_object()).collect(),
        v => match v.get("runs").and_then(|r| r.as_array()) {
            Some(runs) => runs.iter().filter(|v| v.is_object()).collect(),
            None => vec![v],
        },
    }
}

fn numeric_fields(r: &serde_json::Value) -> Vec<String> {
    r.as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, v)| v.is_number())
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Plots JSON files dmkit wrote (`(file name, its JSON)`): figures of `sim
/// reproduce` as they are drawn by `--plot` (one panel per unit), any
/// benchmark's results (`bench ycsb`, `micro`, `txn`, `corm`, `vector-io`,
/// `app`, sweeps and `--repeat`) as `y` against `x`, one line per series,
/// several files together.
pub fn of_json(docs: &[(String, serde_json::Value)], sel: &Select) -> Result<Plot, String> {
    if docs.is_empty() {
        return Err("no files to plot".into());
    }
    // Reproduced figures: their rows, one plot per file (several figures
    // side by side when given several files).
    if docs
        .iter()
        .all(|(_, d)| d.get("rows").is_some() && d.get("figure").is_some())
    {
        let mut plot = Plot::default();
        for (file, d) in docs {
            let rows: Vec<FigureRow> =
                serde_json::from_value::<Vec<serde_json::Value>>(d["rows"].clone())
                    .map_err(|e| format!("{file}: rows: {e}"))?
                    .iter()
                    .map(|r| {
                        Ok(FigureRow {
                            series: r["series"].as_str().ok_or("a row without series")?.into(),
                            x: r["x"].as_f64().ok_or("a row without x")?,
                            value: r["value"].as_f64().ok_or("a row without value")?,
                            unit: r["unit"].as_str().unwrap_or("").into(),
                            published: r["published"].as_f64(),
                        })
                    })
                    .collect::<Result<_, &str>>()
                    .map_err(|e| format!("{file}: {e}"))?;
            let figure = d["figure"].as_str().unwrap_or(file);
            // Figures measured on a real backend name it (`corm-timeline`).
            let title = match d["backend"].as_str().filter(|b| *b != "sim") {
                Some(b) => format!("{figure} on {b}"),
                None => format!(
                    "{figure} on the simulator ({})",
                    d["profile"].as_str().unwrap_or("?")
                ),
            };
            let title = if d["provenance"]["quick"] == true {
                title + QUICK_MARK
            } else {
                title
            };
            let p = figure_plot(&title, d["x_label"].as_str().unwrap_or("x"), &rows);
            if docs.len() == 1 {
                return Ok(p);
            }
            plot.panels.extend(p.panels.into_iter().map(|mut q| {
                q.title = title.clone();
                q
            }));
        }
        plot.title = "reproduced figures".into();
        return Ok(plot);
    }
    let recs: Vec<(&str, &serde_json::Value)> = docs
        .iter()
        .flat_map(|(f, d)| records(d).into_iter().map(move |r| (f.as_str(), r)))
        .collect();
    let fields: Vec<String> = recs
        .first()
        .map(|r| numeric_fields(r.1))
        .unwrap_or_default();
    let y = sel.y.clone().unwrap_or_else(|| "mops".into());
    let num = |r: &serde_json::Value, k: &str| field(r, k).and_then(|v| v.as_f64());
    if let Some((f, _)) = recs.iter().find(|(_, r)| num(r, &y).is_none()) {
        return Err(format!(
            "{f}: no numeric field {y:?} (--y); numeric fields: {}",
            fields.join(", ")
        ));
    }
    let varies = |k: &str| {
        let mut vs: Vec<f64> = recs.iter().filter_map(|(_, r)| num(r, k)).collect();
        vs.sort_by(f64::total_cmp);
        vs.dedup();
        vs.len() > 1
    };
    let x = match &sel.x {
        Some(x) => {
            if let Some((f, _)) = recs.iter().find(|(_, r)| num(r, x).is_none()) {
                return Err(format!(
                    "{f}: no numeric field {x:?} (--x); numeric fields: {}",
                    fields.join(", ")
                ));
            }
            Some(x.clone())
        }
        None => SWEPT.iter().find(|k| varies(k)).map(|k| k.to_string()),
    };
    let series_fields: Vec<String> = match &sel.series {
        Some(s) => s.clone(),
        None => {
            let mut v: Vec<String> = NAMES
                .iter()
                .filter(|k| {
                    recs.iter()
                        .any(|(_, r)| field(r, k).is_some_and(|v| v.is_string()))
                })
                .map(|k| k.to_string())
                .collect();
            v.extend(
                SWEPT
                    .iter()
                    .filter(|k| Some(k.to_string()) != x && varies(k))
                    .map(|k| k.to_string()),
            );
            // Any other text field that takes several values (vector-io's
            // `pattern`, `direction`): runs that differ in it are different
            // lines, never one line through both.
            let mut texts: Vec<String> = recs
                .iter()
                .filter_map(|(_, r)| r.as_object())
                .flat_map(|o| {
                    o.iter()
                        .filter(|(_, v)| v.is_string())
                        .map(|(k, _)| k.clone())
                })
                .filter(|k| !v.contains(k))
                .collect();
            texts.sort();
            texts.dedup();
            v.extend(texts.into_iter().filter(|k| {
                // Not free text (a warning, an error) nor a field that is
                // sometimes null.
                if FREE_TEXT.contains(&k.as_str())
                    || recs
                        .iter()
                        .any(|(_, r)| field(r, k).is_some_and(|v| !v.is_string()))
                {
                    return false;
                }
                let mut vs: Vec<&serde_json::Value> =
                    recs.iter().filter_map(|(_, r)| field(r, k)).collect();
                vs.sort_by_key(|v| v.to_string());
                vs.dedup();
                vs.len() > 1
            }));
            v
        }
    };
    let label = |f: &str, r: &serde_json::Value| {
        let parts: Vec<String> = series_fields
            .iter()
            .filter_map(|k| {
                let v = field(r, k)?;
                Some(if v.is_string() {
                    shown(v)
                } else {
                    format!("{k}={}", shown(v))
                })
            })
            .collect();
        let mut l = parts.join(" ");
        if docs.len() > 1 && sel.series.is_none() {
            let stem = Path::new(f)
                .file_stem()
                .map_or(f.to_string(), |s| s.to_string_lossy().into_owned());
            l = if l.is_empty() {
                stem
            } else {
                format!("{l} ({stem})")
            };
        }
        l
    };
    let mut series: Vec<Series> = Vec::new();
    for (k, (f, r)) in recs.iter().enumerate() {
        let name = label(f, r);
        let name = if name.is_empty() && x.is_none() {
            format!("run {}", k + 1)
        } else {
            name
        };
        let px = x.as_deref().and_then(|x| num(r, x)).unwrap_or(0.0);
        let py = num(r, &y).expect("checked above");
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((px, py)),
            None => series.push(Series {
                name,
                points: vec![(px, py)],
                paper: Vec::new(),
            }),
        }
    }
    // Repeated runs of a point (`--repeat`): their mean.
    for s in &mut series {
        s.points = mean_by_x(&s.points);
    }
    let files: Vec<String> = docs.iter().map(|(f, _)| f.clone()).collect();
    Ok(Plot {
        title: format!(
            "{y}{} — {}",
            x.as_deref().map_or(String::new(), |x| format!(" vs {x}")),
            files.join(", ")
        ),
        panels: vec![Panel {
            x_label: x.unwrap_or_default(),
            y_label: y,
            series,
            kind: if sel.x.is_none() && recs.len() == 1 {
                Kind::Bar
            } else {
                Kind::Auto
            },
            ..Panel::default()
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_groups_series_and_sorts_points() {
        let ps = [
            Point {
                series: "race c shm".into(),
                x: 2.0,
                y: 3.0,
            },
            Point {
                series: "race c shm".into(),
                x: 1.0,
                y: 2.0,
            },
            Point {
                series: "local-hash c local".into(),
                x: 1.0,
                y: 9.0,
            },
        ];
        let c = chart_of_points(&ps);
        assert_eq!(c.series.len(), 2);
        assert_eq!(c.series["race c shm"], vec![(1.0, 2.0), (2.0, 3.0)]);
        let s = svg(&Plot::from(&c));
        // Both series drawn, in the first two colours, as lines.
        assert_eq!(
            s.matches("<polyline").count(),
            1,
            "one series has two points"
        );
        assert!(s.contains(PALETTE[0]) && s.contains(PALETTE[1]));
        assert!(s.contains(">race c shm</text>"));
    }

    #[test]
    fn paper_series_become_hollow_markers_of_their_series() {
        let mut series = BTreeMap::new();
        series.insert("a".to_string(), vec![(1.0, 1.0), (2.0, 2.0)]);
        series.insert("a (paper)".to_string(), vec![(2.0, 2.5)]);
        let c = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series,
        };
        let p = Plot::from(&c);
        assert_eq!(p.panels[0].series.len(), 1);
        assert_eq!(p.panels[0].series[0].paper, vec![(2.0, 2.5)]);
        let s = svg(&p);
        // The paper's point: white fill, the series' colour, no line.
        assert!(s.contains(&format!(r#"fill="white" stroke="{}""#, PALETTE[0])));
        assert_eq!(s.matches("<polyline").count(), 1);
        assert!(s.contains("hollow: the paper"));
    }

    #[test]
    fn markers_and_colours_stay_distinct_past_ten_series() {
        let pairs: std::collections::HashSet<(usize, usize, usize)> = (0..60)
            .map(|i| {
                (
                    i % PALETTE.len(),
                    shape(i),
                    i / PALETTE.len() % DASHES.len(),
                )
            })
            .collect();
        assert_eq!(pairs.len(), 60);
        let cs: std::collections::HashSet<(&str, usize)> =
            (0..60).map(|i| (colour(i), shape(i))).collect();
        assert_eq!(cs.len(), 60, "colour and shape alone tell 60 series apart");
    }

    #[test]
    fn geometric_sweeps_get_a_log_axis() {
        assert!(geometric(&[1.0, 2.0, 4.0, 8.0, 16.0]));
        assert!(geometric(&[8.0, 32.0, 96.0]));
        assert!(!geometric(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]));
        assert!(!geometric(&[0.0, 4.0, 16.0, 64.0]));
        let a = axis(&[1.0, 2.0, 4.0, 8.0, 16.0], Scale::Auto, false, true);
        assert!(a.log);
        assert_eq!(a.ticks.len(), 5);
        assert_eq!(a.ticks[4].1, "16");
        let l = axis(&[0.0, 3.3], Scale::Auto, true, false);
        assert!(!l.log && l.lo == 0.0 && l.hi >= 3.3);
    }

    #[test]
    fn single_points_become_bars_with_a_reference_for_speed_ups() {
        let rows = vec![
            FigureRow {
                series: "+rear lock (a) speed-up".into(),
                x: 1.0,
                value: 1.25,
                unit: "x".into(),
                published: Some(3.0),
            },
            FigureRow {
                series: "+write combining (a) speed-up".into(),
                x: 2.0,
                value: 3.05,
                unit: "x".into(),
                published: Some(1.1),
            },
            FigureRow {
                series: "art".into(),
                x: 1.0,
                value: 3.0,
                unit: "Mops".into(),
                published: None,
            },
            FigureRow {
                series: "art".into(),
                x: 2.0,
                value: 4.0,
                unit: "Mops".into(),
                published: None,
            },
        ];
        let p = figure_plot("fig θ; 200Gb", "technique", &rows);
        assert_eq!(p.panels.len(), 2);
        assert!(is_bar(&p.panels[0]) && !is_bar(&p.panels[1]));
        assert_eq!(p.panels[0].reference, Some(1.0));
        let s = svg(&p);
        assert!(s.contains("fig θ; 200Gb"), "text kept as written");
        assert!(s.contains("stroke-dasharray=\"5 4\""), "the 1× line");
    }

    #[test]
    fn writes_png_svg_and_pdf_with_the_shipped_font() {
        let mut series = BTreeMap::new();
        series.insert("θ = 0.99; 200Gb".to_string(), vec![(1.0, 1.0), (2.0, 2.0)]);
        let c = Chart {
            title: "lower case and Unicode: µs, ×, θ".into(),
            x_label: "threads".into(),
            y_label: "Mops".into(),
            series,
        };
        let dir = std::env::temp_dir().join(format!("dmkit-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (ext, magic) in [("png", &b"\x89PNG"[..]), ("svg", b"<svg"), ("pdf", b"%PDF")] {
            let f = dir.join(format!("c.{ext}"));
            write_png(&c, &f).unwrap();
            let b = std::fs::read(&f).unwrap();
            assert!(b.starts_with(magic), "{ext}");
        }
        // Every text found its glyphs in the shipped font (no system
        // fonts are loaded): its outlines are not empty.
        fn texts(g: &usvg::Group, n: &mut usize) {
            for c in g.children() {
                match c {
                    usvg::Node::Group(g) => texts(g, n),
                    usvg::Node::Text(t) => {
                        assert!(t.flattened().has_children(), "text drawn");
                        *n += 1;
                    }
                    _ => {}
                }
            }
        }
        let mut n = 0;
        texts(tree(&Plot::from(&c)).unwrap().root(), &mut n);
        assert!(n >= 5, "title, labels, ticks and legend: {n}");
        assert!(matches!(
            write_png(&c, &dir.join("c.gif")),
            Err(PlotError::Format(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn text_is_measured_with_the_font() {
        // Lower case is narrower than upper case in a proportional font.
        assert!(text_width("iiii", 12.0) < text_width("MMMM", 12.0));
        assert!(text_width("θ", 12.0) > 0.0);
    }

    #[test]
    fn any_result_json_plots_against_any_swept_field() {
        let sweep = serde_json::json!({
            "provenance": {"seed": 1},
            "runs": [
                {"index": "race", "workload": "c", "backend": "shm", "threads": 1, "coros": 1, "mops": 1.0, "lat": {"p99": 3.0}},
                {"index": "race", "workload": "c", "backend": "shm", "threads": 2, "coros": 1, "mops": 1.9, "lat": {"p99": 3.5}},
                {"index": "race", "workload": "c", "backend": "shm", "threads": 1, "coros": 4, "mops": 3.0, "lat": {"p99": 5.0}},
                {"index": "race", "workload": "c", "backend": "shm", "threads": 2, "coros": 4, "mops": 5.5, "lat": {"p99": 6.0}}
            ]
        });
        let docs = vec![("s.json".to_string(), sweep)];
        let p = of_json(&docs, &Select::default()).unwrap();
        let q = &p.panels[0];
        assert_eq!(q.x_label, "threads");
        // coros varies too: it names the series.
        let names: Vec<&str> = q.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["race c shm coros=1", "race c shm coros=4"]);
        assert_eq!(q.series[1].points, vec![(1.0, 3.0), (2.0, 5.5)]);
        let p = of_json(
            &docs,
            &Select {
                x: Some("coros".into()),
                y: Some("lat.p99".into()),
                series: None,
            },
        )
        .unwrap();
        assert_eq!(p.panels[0].series[0].name, "race c shm threads=1");
        assert_eq!(p.panels[0].series[0].points, vec![(1.0, 3.0), (4.0, 5.0)]);
        let e = of_json(
            &docs,
            &Select {
                y: Some("nope".into()),
                ..Select::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("\"nope\"") && e.contains("mops"), "{e}");
        // A list of results (vector-io, app) with another field swept.
        let list = serde_json::json!([
            {"method": "sgl", "batch": 1, "mops": 1.0},
            {"method": "sgl", "batch": 16, "mops": 4.0},
            {"method": "sp", "batch": 1, "mops": 0.5},
            {"method": "sp", "batch": 16, "mops": 0.6}
        ]);
        let p = of_json(&[("v.json".into(), list)], &Select::default()).unwrap();
        assert_eq!(p.panels[0].x_label, "batch");
        assert_eq!(p.panels[0].series.len(), 2);
    }

    #[test]
    fn figure_json_plots_one_panel_per_unit() {
        let fig = serde_json::json!({
            "figure": "smart-fig4a", "profile": "cx6", "x_label": "depth",
            "rows": [
                {"series": "a", "x": 1.0, "value": 1.0, "unit": "Mops", "published": 1.2},
                {"series": "a", "x": 8.0, "value": 2.0, "unit": "Mops", "published": null},
                {"series": "a pcie", "x": 1.0, "value": 96.0, "unit": "B/wr", "published": null}
            ]
        });
        let p = of_json(&[("f.json".into(), fig.clone())], &Select::default()).unwrap();
        assert_eq!(p.panels.len(), 2);
        assert_eq!(p.panels[0].series[0].paper, vec![(1.0, 1.2)]);
        assert!(!p.title.contains("quick"), "{}", p.title);
        // A quick run's figure says so in its title.
        let mut quick = fig;
        quick["provenance"] = serde_json::json!({"quick": true});
        let p = of_json(&[("f.json".into(), quick)], &Select::default()).unwrap();
        assert!(p.title.ends_with(QUICK_MARK), "{}", p.title);
    }

    /// A repeated sweep (`--repeat 3`: three runs per point, in `runs`)
    /// plots one point per x, the mean of its runs, not a zigzag.
    #[test]
    fn repeated_runs_plot_their_mean() {
        let doc = serde_json::json!({"runs": [
            {"method": "sgl", "batch": 1, "mops": 1.0},
            {"method": "sgl", "batch": 1, "mops": 3.0},
            {"method": "sgl", "batch": 4, "mops": 5.0},
            {"method": "sgl", "batch": 4, "mops": 7.0},
            {"method": "sgl", "batch": 4, "mops": 9.0}
        ]});
        let p = of_json(&[("r.json".into(), doc)], &Select::default()).unwrap();
        assert_eq!(p.panels[0].x_label, "batch");
        assert_eq!(p.panels[0].series.len(), 1);
        assert_eq!(p.panels[0].series[0].points, vec![(1.0, 2.0), (4.0, 7.0)]);
        // A text field that varies (vector-io's pattern) splits the lines.
        let doc = serde_json::json!({"runs": [
            {"method": "sgl", "pattern": "seq", "batch": 1, "mops": 1.0},
            {"method": "sgl", "pattern": "random", "batch": 1, "mops": 3.0},
            {"method": "sgl", "pattern": "seq", "batch": 4, "mops": 5.0},
            {"method": "sgl", "pattern": "random", "batch": 4, "mops": 7.0}
        ]});
        let p = of_json(&[("r.json".into(), doc)], &Select::default()).unwrap();
        let names: Vec<&str> = p.panels[0].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["sgl seq", "sgl random"]);
        assert_eq!(p.panels[0].series[1].points, vec![(1.0, 3.0), (4.0, 7.0)]);
        // A warning that differs per run (oversubscription) does not.
        let doc = serde_json::json!({"runs": [
            {"index": "race", "threads": 1, "mops": 1.0, "oversubscribed": null},
            {"index": "race", "threads": 4, "mops": 3.0, "oversubscribed": "4 polling threads"},
            {"index": "race", "threads": 8, "mops": 3.5, "oversubscribed": "8 polling threads"}
        ]});
        let p = of_json(&[("r.json".into(), doc)], &Select::default()).unwrap();
        assert_eq!(p.panels[0].series.len(), 1, "{:?}", p.panels[0].series);
        assert_eq!(
            mean_by_x(&[(2.0, 1.0), (1.0, 4.0), (2.0, 3.0)]),
            vec![(1.0, 4.0), (2.0, 2.0)]
        );
    }
}
