//! Line charts of benchmark results as PNG, with no plotting or font
//! dependencies: a small raster, a 5×7 bitmap font and a PNG writer using
//! stored (uncompressed) deflate blocks. Enough for "throughput vs threads"
//! figures that a terminal-only machine can produce and a reader can open.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use crate::ycsb_bench::YcsbResult;

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
    /// From a `bench ycsb` JSON result: series "index workload \[backend\]",
    /// x = threads, y = Mops.
    pub fn from_json(v: &serde_json::Value) -> Result<Point, String> {
        let s = |k: &str| {
            v.get(k).and_then(|x| x.as_str()).ok_or_else(|| {
                format!("field {k:?} missing or not a string (not a bench ycsb result?)")
            })
        };
        let n = |k: &str| {
            v.get(k).and_then(|x| x.as_f64()).ok_or_else(|| {
                format!("field {k:?} missing or not a number (not a bench ycsb result?)")
            })
        };
        Ok(Point {
            series: format!("{} {} {}", s("index")?, s("workload")?, s("backend")?),
            x: n("threads")?,
            y: n("mops")?,
        })
    }

    fn of(r: &YcsbResult) -> Point {
        Point {
            series: format!("{} {} {}", r.index, r.workload, r.backend),
            x: r.threads as f64,
            y: r.mops,
        }
    }
}

/// A line chart.
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

const W: usize = 1000;
const H: usize = 560;
const LEFT: usize = 80;
const RIGHT: usize = 340;
const TOP: usize = 50;
const BOTTOM: usize = 60;
const PALETTE: [[u8; 3]; 8] = [
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [255, 127, 14],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [23, 190, 207],
];

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Self {
        Self {
            px: vec![255; W * H * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], thick: i64) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            for ox in 0..thick {
                for oy in 0..thick {
                    self.set(x + ox - thick / 2, y + oy - thick / 2, c);
                }
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    fn square(&mut self, cx: i64, cy: i64, r: i64, c: [u8; 3]) {
        for x in cx - r..=cx + r {
            for y in cy - r..=cy + r {
                self.set(x, y, c);
            }
        }
    }

    /// Text at (x, y) top-left, `scale`× the 5×7 font.
    fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        for a in 0..scale {
                            for b in 0..scale {
                                self.set(
                                    x + (i as i64 * 6 + col) * scale + a,
                                    y + row as i64 * scale + b,
                                    c,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn text_width(s: &str, scale: i64) -> i64 {
    s.chars().count() as i64 * 6 * scale
}

/// A "nice" axis step for a range.
fn nice_step(range: f64, ticks: f64) -> f64 {
    let raw = (range / ticks).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else {
        let d = (-step.log10()).ceil() as usize;
        format!("{v:.d$}")
    }
}

/// Renders the chart to RGB pixels (W×H).
fn render(c: &Chart) -> Canvas {
    let mut cv = Canvas::new();
    let black = [0, 0, 0];
    let grey = [220, 220, 220];
    let pts = c.series.values().flatten();
    let xmax = pts.clone().map(|p| p.0).fold(1.0f64, f64::max);
    let xmin = pts.clone().map(|p| p.0).fold(xmax, f64::min).min(0.0);
    let ymax = pts.map(|p| p.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let (pw, ph) = ((W - LEFT - RIGHT) as f64, (H - TOP - BOTTOM) as f64);
    let map = |x: f64, y: f64| -> (i64, i64) {
        let xr = if xmax > xmin {
            (x - xmin) / (xmax - xmin)
        } else {
            0.5
        };
        (
            LEFT as i64 + (xr * pw) as i64,
            (TOP as f64 + ph - y / ymax * ph) as i64,
        )
    };
    // Grid and ticks.
    let ystep = nice_step(ymax, 5.0);
    let mut y = 0.0;
    while y <= ymax + 1e-12 {
        let (_, py) = map(xmin, y);
        cv.line((LEFT as i64, py), ((W - RIGHT) as i64, py), grey, 1);
        let label = fmt_tick(y, ystep);
        cv.text(
            LEFT as i64 - 8 - text_width(&label, 2),
            py - 7,
            &label,
            2,
            black,
        );
        y += ystep;
    }
    let xstep = nice_step(xmax - xmin, 8.0).max(1.0);
    let mut x = (xmin / xstep).ceil() * xstep;
    while x <= xmax + 1e-12 {
        let (px, _) = map(x, 0.0);
        cv.line((px, TOP as i64), (px, (H - BOTTOM) as i64), grey, 1);
        let label = fmt_tick(x, xstep);
        cv.text(
            px - text_width(&label, 2) / 2,
            (H - BOTTOM) as i64 + 8,
            &label,
            2,
            black,
        );
        x += xstep;
    }
    // Axes and labels.
    let origin = (LEFT as i64, (H - BOTTOM) as i64);
    cv.line(origin, ((W - RIGHT) as i64, origin.1), black, 2);
    cv.line(origin, (LEFT as i64, TOP as i64), black, 2);
    cv.text(LEFT as i64, 15, &c.title, 2, black);
    let xl = &c.x_label;
    cv.text(
        LEFT as i64 + pw as i64 / 2 - text_width(xl, 2) / 2,
        (H - BOTTOM) as i64 + 32,
        xl,
        2,
        black,
    );
    cv.text(8, TOP as i64 - 22, &c.y_label, 2, black);
    // Series and legend.
    for (i, (name, pts)) in c.series.iter().enumerate() {
        let col = PALETTE[i % PALETTE.len()];
        for w in pts.windows(2) {
            cv.line(map(w[0].0, w[0].1), map(w[1].0, w[1].1), col, 3);
        }
        for &(x, y) in pts {
            let (px, py) = map(x, y);
            cv.square(px, py, 4, col);
        }
        let ly = TOP as i64 + 10 + i as i64 * 24;
        let lx = (W - RIGHT) as i64 + 20;
        cv.line((lx, ly + 6), (lx + 24, ly + 6), col, 3);
        cv.text(lx + 32, ly, name, 2, black);
    }
    cv
}

/// Writes the chart as a PNG file.
pub fn write_png(c: &Chart, path: &Path) -> io::Result<()> {
    let cv = render(c);
    std::fs::write(path, encode_png(W, H, &cv.px))
}

fn crc32(data: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (i, t) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *t = c;
    }
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c = table[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    c ^ 0xFFFF_FFFF
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += x as u32;
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    b << 16 | a
}

/// An RGB8 PNG with a zlib stream of stored blocks.
pub fn encode_png(w: usize, h: usize, rgb: &[u8]) -> Vec<u8> {
    assert_eq!(rgb.len(), w * h * 3, "pixel buffer matches the size");
    let mut raw = Vec::with_capacity(h * (1 + 3 * w));
    for row in rgb.chunks(3 * w) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push((i + 1 == blocks.len()) as u8);
        z.extend_from_slice(&(b.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(b.len() as u16)).to_le_bytes());
        z.extend_from_slice(b);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut out = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    let mut chunk = |kind: &[u8; 4], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut c = kind.to_vec();
        c.extend_from_slice(data);
        out.extend_from_slice(&c);
        out.extend_from_slice(&crc32(&c).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &z);
    chunk(b"IEND", &[]);
    out
}

/// The 5×7 glyph of `c` (rows top to bottom, bit 4 = leftmost column);
/// lower case is drawn as upper case, unknown characters as a box.
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        ' ' => [0; 7],
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        '.' => [0, 0, 0, 0, 0, 0x0C, 0x0C],
        ',' => [0, 0, 0, 0, 0x0C, 0x04, 0x08],
        '-' => [0, 0, 0, 0x1F, 0, 0, 0],
        '+' => [0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0],
        '=' => [0, 0, 0x1F, 0, 0x1F, 0, 0],
        ':' => [0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '_' => [0, 0, 0, 0, 0, 0, 0x1F],
        '×' | '*' => [0, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0],
        _ => [0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_has_valid_structure() {
        let png = encode_png(3, 2, &[0u8; 18]);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR length 13, then the type.
        assert_eq!(&png[8..16], b"\0\0\0\x0dIHDR");
        // Known vectors.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
        assert!(png.ends_with(&[0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xAE, 0x42, 0x60, 0x82]));
    }

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
        let cv = render(&c);
        // Something was drawn in the plot area in the first series' colour.
        assert!(cv.px.chunks(3).any(|p| p == PALETTE[0]));
        assert!(cv.px.chunks(3).any(|p| p == PALETTE[1]));
    }
}
