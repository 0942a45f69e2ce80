//! The growth plot: figures against cluster size, drawn into a PNG.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// One line of a panel: a figure at each cluster size.
pub struct Series {
    pub name: String,
    pub points: Vec<(u32, f64)>,
    /// The kernel's own cost (iproute2, the dumps): drawn dashed and grey,
    /// the floor vxmgr's lines sit on.
    pub floor: bool,
}

/// One chart of the grid.
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub series: Vec<Series>,
}

/// Where Debian's fonts-dejavu-core puts the face the labels are set in;
/// VXMGR_PLOT_FONT names another TrueType file.
const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

const VXMGR_COLOURS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
];
const FLOOR_COLOURS: [RGBColor; 2] = [RGBColor(0x55, 0x55, 0x55), RGBColor(0xa0, 0xa0, 0xa0)];

/// Draws `panels` in a grid of two columns under `caption`.
pub fn write(path: &Path, caption: &str, panels: &[Panel]) -> Result<()> {
    load_font()?;
    let rows = panels.len().div_ceil(2).max(1);
    let height = 80 + 560 * rows as u32;
    let root = BitMapBackend::new(path, (1600, height)).into_drawing_area();
    root.fill(&WHITE).map_err(drawing)?;
    let body = root.titled(caption, ("sans-serif", 30)).map_err(drawing)?;
    for (area, panel) in body.split_evenly((rows, 2)).iter().zip(panels) {
        draw(area, panel)?;
    }
    root.present()
        .map_err(drawing)
        .with_context(|| format!("writing {}", path.display()))
}

fn draw(area: &DrawingArea<BitMapBackend, plotters::coord::Shift>, panel: &Panel) -> Result<()> {
    let points = || panel.series.iter().flat_map(|s| s.points.iter());
    let max_x = points().map(|&(n, _)| n).max().unwrap_or(1).max(1);
    let max_y = points().map(|&(_, v)| v).fold(0.0, f64::max);
    let max_y = if max_y > 0.0 { max_y * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0u32..max_x + max_x / 40, 0.0..max_y)
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc(&panel.unit)
        .x_label_formatter(&|&n| thousands(n))
        .label_style(("sans-serif", 18))
        .axis_desc_style(("sans-serif", 20))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(drawing)?;
    let (mut ours, mut floors) = (VXMGR_COLOURS.iter().cycle(), FLOOR_COLOURS.iter().cycle());
    for series in panel.series.iter().filter(|s| !s.points.is_empty()) {
        let colour = *if series.floor {
            floors.next()
        } else {
            ours.next()
        }
        .expect("cycled colours never end");
        let line = colour.stroke_width(3);
        let points = series.points.iter().copied();
        let drawn = if series.floor {
            chart.draw_series(DashedLineSeries::new(points.clone(), 12, 8, line))
        } else {
            chart.draw_series(LineSeries::new(points.clone(), line))
        };
        drawn
            .map_err(drawing)?
            .label(&series.name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
            });
        chart
            .draw_series(points.map(|p| Circle::new(p, 5, colour.filled())))
            .map_err(drawing)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 18))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(drawing)?;
    Ok(())
}

/// Registers the labels' face once; plotters draws no text without one.
fn load_font() -> Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let path = std::env::var("VXMGR_PLOT_FONT").unwrap_or_else(|_| DEFAULT_FONT.into());
            let bytes = std::fs::read(&path).map_err(|e| {
                format!(
                    "reading the plot's font {path} (set VXMGR_PLOT_FONT to a TrueType file): {e}"
                )
            })?;
            register_font(
                "sans-serif",
                FontStyle::Normal,
                Box::leak(bytes.into_boxed_slice()),
            )
            .map_err(|_| format!("{path} is not a TrueType font"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// 20000 → "20k", 2500 → "2.5k".
fn thousands(n: u32) -> String {
    if n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        format!("{:.1}k", f64::from(n) / 1000.0)
    }
}

fn drawing(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}
