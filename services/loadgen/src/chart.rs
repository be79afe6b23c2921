//! SVG charts of a scenario: latency over time (P50 and P99 per 1-second window) and the
//! service's shed level over time, one line per series.
//!
//! Drawn with plotters' SVG backend and no font backend: text is written as SVG `<text>`
//! elements for the viewer to render, so nothing here needs fontconfig or a font file.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

use crate::report::Series;

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
    /// Index into the palette: the P50 and P99 of one series share a colour.
    pub color: usize,
}

/// Lines for P50 (dashed) and P99 of each series.
pub fn latency_lines(series: &[&Series]) -> Vec<Line> {
    series
        .iter()
        .enumerate()
        .flat_map(|(index, series)| {
            let pick = |quantile: fn(&crate::report::WindowReport) -> Option<f64>| {
                series
                    .windows
                    .iter()
                    .filter_map(|window| quantile(window).map(|value| (window.t_s, value)))
                    .collect::<Vec<_>>()
            };
            [
                Line {
                    label: format!("{} P50", series.label),
                    points: pick(|window| window.p50_ms),
                    dashed: true,
                    color: index,
                },
                Line {
                    label: format!("{} P99", series.label),
                    points: pick(|window| window.p99_ms),
                    dashed: false,
                    color: index,
                },
            ]
        })
        .filter(|line| !line.points.is_empty())
        .collect()
}

/// The shed level of each series that has one.
pub fn shed_lines(series: &[&Series]) -> Vec<Line> {
    series
        .iter()
        .enumerate()
        .map(|(index, series)| Line {
            label: series.label.clone(),
            points: series
                .windows
                .iter()
                .filter_map(|window| {
                    window
                        .shed_level
                        .map(|level| (window.t_s, f64::from(level)))
                })
                .collect(),
            dashed: false,
            color: index,
        })
        .filter(|line| !line.points.is_empty())
        .collect()
}

/// Draws `lines` into an SVG file at `path`.
pub fn draw(
    path: &Path,
    title: &str,
    y_label: &str,
    lines: &[Line],
    y_min_top: f64,
) -> anyhow::Result<()> {
    let x_max = lines
        .iter()
        .flat_map(|line| line.points.iter().map(|point| point.0))
        .fold(1.0_f64, f64::max)
        + 1.0;
    let y_max = lines
        .iter()
        .flat_map(|line| line.points.iter().map(|point| point.1))
        .fold(y_min_top, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|error| anyhow!("{error}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|error| anyhow!("{error}"))?;
    chart
        .configure_mesh()
        .x_desc("seconds into the run (by scheduled time)")
        .y_desc(y_label)
        .draw()
        .map_err(|error| anyhow!("{error}"))?;
    for line in lines {
        let color = PALETTE[line.color % PALETTE.len()];
        let style = ShapeStyle::from(&color).stroke_width(if line.dashed { 1 } else { 2 });
        let points = line.points.clone();
        let drawn = if line.dashed {
            chart.draw_series(DashedLineSeries::new(points, 6, 4, style))
        } else {
            chart.draw_series(LineSeries::new(points, style))
        };
        drawn
            .map_err(|error| anyhow!("{error}"))?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    if !lines.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|error| anyhow!("{error}"))?;
    }
    root.present().map_err(|error| anyhow!("{error}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg_with_text_and_lines_without_fonts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        let lines = vec![
            Line {
                label: "service P50".into(),
                points: vec![(0.0, 1.0), (1.0, 2.0)],
                dashed: true,
                color: 0,
            },
            Line {
                label: "service P99".into(),
                points: vec![(0.0, 3.0), (1.0, 9.0)],
                dashed: false,
                color: 0,
            },
        ];
        draw(&path, "steady: latency", "ms", &lines, 1.0).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("steady: latency"));
        assert!(svg.contains("service P99"));
        assert!(svg.contains("<polyline") || svg.contains("<path"));
    }
}
