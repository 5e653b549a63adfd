//! Line charts as plain SVG: a few dozen lines instead of a plotting stack.

use std::fmt::Write;

pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) dashed: bool,
}

pub(crate) struct Chart<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_label: &'a str,
    pub(crate) y_label: &'a str,
    pub(crate) log_y: bool,
    pub(crate) series: Vec<Series>,
}

const COLORS: [&str; 8] = [
    "#444444", "#d62728", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c", "#8c564b", "#17becf",
];
const W: f64 = 820.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 290.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

impl Chart<'_> {
    pub(crate) fn render(&self) -> String {
        let points = self.series.iter().flat_map(|s| s.points.iter().copied());
        let (mut x_max, mut y_min, mut y_max) = (f64::MIN, f64::MAX, f64::MIN);
        for (x, y) in points {
            x_max = x_max.max(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
        let x_min = 0.0;
        let (y_lo, y_hi) = if self.log_y {
            (
                y_min.max(1e-3).log10().floor(),
                y_max
                    .max(1e-3)
                    .log10()
                    .ceil()
                    .max(y_min.max(1e-3).log10().floor() + 1.0),
            )
        } else {
            (0.0, if y_max > 0.0 { y_max * 1.05 } else { 1.0 })
        };
        let plot_w = W - LEFT - RIGHT;
        let plot_h = H - TOP - BOTTOM;
        let sx = |x: f64| LEFT + (x - x_min) / (x_max - x_min).max(1e-9) * plot_w;
        let sy = |y: f64| {
            let v = if self.log_y { y.max(1e-3).log10() } else { y };
            TOP + plot_h - (v - y_lo) / (y_hi - y_lo) * plot_h
        };

        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            self.title
        );
        // Axes and ticks.
        let _ = write!(
            svg,
            r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
        );
        for i in 0..=5 {
            let x = x_min + (x_max - x_min) * i as f64 / 5.0;
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                sx(x),
                TOP + plot_h + 16.0,
                tick(x)
            );
        }
        let y_ticks: Vec<f64> = if self.log_y {
            (y_lo as i32..=y_hi as i32).map(|p| 10f64.powi(p)).collect()
        } else {
            (0..=5).map(|i| y_hi * i as f64 / 5.0).collect()
        };
        for y in y_ticks {
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" x2="{}" y1="{y0}" y2="{y0}" stroke="#e0e0e0"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                sy(y) + 4.0,
                tick(y),
                y0 = sy(y)
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            H - 12.0,
            self.x_label
        );
        let _ = write!(
            svg,
            r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            TOP + plot_h / 2.0,
            self.y_label
        );
        // Lines and legend.
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let dash = if series.dashed {
                r#" stroke-dasharray="6,4""#
            } else {
                ""
            };
            let path: Vec<String> = series
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            let _ = write!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
            for &(x, y) in &series.points {
                let _ = write!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                    sx(x),
                    sy(y)
                );
            }
            let ly = TOP + 10.0 + i as f64 * 18.0;
            let lx = W - RIGHT + 12.0;
            let _ = write!(
                svg,
                r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
                lx + 22.0,
                lx + 28.0,
                ly + 4.0,
                series.label
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

fn tick(value: f64) -> String {
    let text = format!("{value:.2}");
    // "0.50" -> "0.5", "2.00" -> "2" (and "100.00" -> "100", not "1").
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}
