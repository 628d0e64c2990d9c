//! Line plots as SVG files, for the benchmarks' figures (`plotters`, SVG backend only: no
//! fonts are loaded, the viewer draws the text).

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use std::path::Path;

/// One line of a plot.
#[derive(Clone, Debug)]
pub struct Series {
    /// Its name in the legend; none: not in the legend.
    pub name: String,
    /// Its points, in x order; points with a NaN coordinate are left out.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (a p99 beside its p50, a floor).
    pub dashed: bool,
    /// Its colour's place in the palette: lines of one system share a colour.
    pub colour: usize,
}

impl Series {
    /// A solid line.
    pub fn solid(name: &str, colour: usize, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.to_owned(),
            points,
            dashed: false,
            colour,
        }
    }

    /// A dashed line.
    pub fn dashed(name: &str, colour: usize, points: Vec<(f64, f64)>) -> Series {
        Series {
            dashed: true,
            ..Series::solid(name, colour, points)
        }
    }
}

/// How the x axis is scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XAxis {
    /// Linear.
    Linear,
    /// Logarithmic, base 2 (value sizes): ticks at powers of two, named as sizes.
    Log2Bytes,
    /// Logarithmic, base 10: ticks at powers of ten.
    Log10,
}

/// A figure: a title, axis labels, lines.
#[derive(Clone, Debug)]
pub struct Figure {
    /// The title above the plot.
    pub title: String,
    /// The x axis' label.
    pub x_label: String,
    /// The y axis' label.
    pub y_label: String,
    /// How x is scaled.
    pub x_axis: XAxis,
    /// A logarithmic y axis (latencies whose p99 spans decades); else linear from 0.
    pub y_log: bool,
    /// The legend in the lower right corner (where a CDF leaves room), else the upper left.
    pub legend_lower_right: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// Colours that stay apart in print and for the common colour blindnesses (Okabe-Ito).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
    RGBColor(0, 0, 0),
    RGBColor(120, 120, 120),
];

fn x_of(axis: XAxis, x: f64) -> f64 {
    match axis {
        XAxis::Linear => x,
        XAxis::Log2Bytes => x.log2(),
        XAxis::Log10 => x.log10(),
    }
}

fn size_label(log2: f64) -> String {
    // Ticks fall on whole powers of two up to 2^40; anything else is named as a number.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bytes = 2f64.powf(log2.round()) as u64;
    if (log2 - log2.round()).abs() > 1e-6 {
        String::new()
    } else if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// A tick's number: whole numbers as such, others with at most two decimals.
fn number_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// The range `lo..hi` widened a little (and made non-empty), for an axis.
fn padded(lo: f64, hi: f64, from_zero: bool) -> (f64, f64) {
    let (lo, hi) = if from_zero {
        (lo.min(0.0), hi)
    } else {
        (lo, hi)
    };
    if hi - lo < 1e-9 {
        return (lo - 1.0, hi + 1.0);
    }
    let pad = (hi - lo) * 0.05;
    (if from_zero { lo } else { lo - pad }, hi + pad)
}

/// Write `fig` as an SVG file at `path` (800 x 500).
///
/// # Errors
/// What plotters or the file system said, as text.
pub fn write_svg(fig: &Figure, path: &Path) -> Result<(), String> {
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let points: Vec<(f64, f64)> = fig
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied().filter(finite))
        .map(|(x, y)| (x_of(fig.x_axis, x), y))
        .collect();
    if points.is_empty() {
        return Err(format!("{}: nothing to plot", fig.title));
    }
    let (x_lo, x_hi) = points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    let y_hi = points.iter().fold(f64::NEG_INFINITY, |a, p| a.max(p.1));
    let y_lo = points.iter().fold(f64::INFINITY, |a, p| a.min(p.1));
    let (x_lo, x_hi) = padded(x_lo, x_hi, false);
    if fig.y_log {
        let positive = points.iter().map(|p| p.1).filter(|&y| y > 0.0);
        let y_lo = positive.fold(f64::INFINITY, f64::min);
        if !y_lo.is_finite() {
            return Err(format!("{}: no positive value for a log axis", fig.title));
        }
        draw(fig, path, x_lo..x_hi, (y_lo / 1.3..y_hi * 1.3).log_scale())
    } else {
        let (y_lo, y_hi) = padded(y_lo, y_hi, true);
        draw(fig, path, x_lo..x_hi, y_lo..y_hi)
    }
}

/// Draw `fig` on x range `x` and y axis `y` (linear or logarithmic).
fn draw<Y>(fig: &Figure, path: &Path, x: std::ops::Range<f64>, y: Y) -> Result<(), String>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!fig.y_log || y > 0.0);
    let e = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let (x_lo, x_hi) = (x.start, x.end);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x, y)
        .map_err(|x| e(&x))?;
    let axis = fig.x_axis;
    let x_fmt = move |v: &f64| match axis {
        XAxis::Linear => number_label(*v),
        XAxis::Log2Bytes => size_label(*v),
        XAxis::Log10 => number_label(10f64.powf(*v)),
    };
    let y_fmt = |v: &f64| number_label(*v);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(fig.x_label.as_str())
        .y_desc(fig.y_label.as_str())
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .light_line_style(WHITE.mix(0.0));
    if axis != XAxis::Linear {
        // One tick per power across the range.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ticks = (x_hi - x_lo).ceil().max(2.0) as usize + 1;
        mesh.x_labels(ticks);
    }
    mesh.draw().map_err(|x| e(&x))?;
    for s in &fig.series {
        let colour = PALETTE[s.colour % PALETTE.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, y)| (x_of(axis, x), y))
            .filter(finite)
            .collect();
        let style = colour.stroke_width(2);
        let anno = if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts, 6, 4, style))
                .map_err(|x| e(&x))?
        } else {
            // Marks on a few points; a dense line (a timeline) is clearer without.
            let marks = if pts.len() <= 40 { 3 } else { 0 };
            chart
                .draw_series(LineSeries::new(pts, style).point_size(marks))
                .map_err(|x| e(&x))?
        };
        // A line without a name (a p99 beside its named p50) stays out of the legend.
        if !s.name.is_empty() {
            anno.label(s.name.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(if fig.legend_lower_right {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperLeft
        })
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_written_as_one_svg_document_with_its_lines_and_names() {
        let dir = std::env::temp_dir().join(format!("redn-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.svg");
        let fig = Figure {
            title: "GET latency".into(),
            x_label: "value size".into(),
            y_label: "µs".into(),
            x_axis: XAxis::Log2Bytes,
            y_log: true,
            legend_lower_right: false,
            series: vec![
                Series::solid("offload p50", 0, vec![(64.0, 10.0), (4096.0, 20.0)]),
                Series::dashed("offload p99", 0, vec![(64.0, 30.0), (f64::NAN, 1.0)]),
            ],
        };
        write_svg(&fig, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in ["GET latency", "offload p50", "offload p99", "4 KiB", "64 B"] {
            assert!(svg.contains(text), "{text} missing");
        }
        let empty = Figure {
            series: vec![Series::solid("none", 1, vec![(f64::NAN, 1.0)])],
            ..fig
        };
        assert!(write_svg(&empty, &dir.join("g.svg")).is_err());
    }

    #[test]
    fn sizes_are_named_at_powers_of_two_only() {
        assert_eq!(size_label(6.0), "64 B");
        assert_eq!(size_label(16.0), "64 KiB");
        assert_eq!(size_label(20.0), "1 MiB");
        assert_eq!(size_label(6.5), "");
        assert_eq!(number_label(1.799_999_999_9), "1.8");
        assert_eq!(number_label(2.0), "2");
        assert_eq!(number_label(0.25), "0.25");
        assert_eq!(number_label(1234.5), "1234");
    }
}
