//! Bar charts as plain SVG: a few dozen lines instead of a plotting stack.
//! One figure, panels side by side, the same groups (variants) and series
//! (classes of tenants) in each.

use std::fmt::Write;

pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) y_label: String,
    /// The series stacked into one bar per group, instead of side by side.
    pub(crate) stacked: bool,
    /// Per group, one value per series; NaN for none (no bar).
    pub(crate) values: Vec<Vec<f64>>,
    /// The top of the scale, if not from the values.
    pub(crate) y_max: Option<f64>,
    /// A dashed line across the panel at this value, and its label.
    pub(crate) reference: Option<(f64, String)>,
    /// Decimals of the value written over each bar.
    pub(crate) decimals: usize,
}

pub(crate) struct Figure {
    pub(crate) title: String,
    pub(crate) groups: Vec<String>,
    pub(crate) series: Vec<String>,
    pub(crate) panels: Vec<Panel>,
    /// A line of text under the panels.
    pub(crate) note: String,
}

const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"];
const PANEL_W: f64 = 340.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 78.0;
const PLOT_H: f64 = 250.0;
const BOTTOM: f64 = 84.0;

impl Figure {
    pub(crate) fn render(&self) -> String {
        let width = PANEL_W * self.panels.len() as f64;
        let height = TOP + PLOT_H + BOTTOM;
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="20" font-size="15" text-anchor="middle">{}</text>"#,
            width / 2.0,
            escape(&self.title)
        );
        // The legend, once for all panels.
        let mut x = width / 2.0 - 60.0 * self.series.len() as f64;
        for (i, name) in self.series.iter().enumerate() {
            let _ = write!(
                svg,
                r#"<rect x="{x}" y="30" width="12" height="12" fill="{}"/><text x="{}" y="40">{}</text>"#,
                COLORS[i % COLORS.len()],
                x + 16.0,
                escape(name)
            );
            x += 120.0;
        }
        for (i, panel) in self.panels.iter().enumerate() {
            self.panel(&mut svg, panel, PANEL_W * i as f64);
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="11">{}</text>"#,
            width / 2.0,
            height - 8.0,
            escape(&self.note)
        );
        svg.push_str("</svg>\n");
        svg
    }

    fn panel(&self, svg: &mut String, panel: &Panel, x0: f64) {
        let plot_w = PANEL_W - LEFT - RIGHT;
        let left = x0 + LEFT;
        let top_of = |values: &Vec<f64>| -> f64 {
            let values = values.iter().copied().filter(|v| v.is_finite());
            if panel.stacked {
                values.sum()
            } else {
                values.fold(0.0, f64::max)
            }
        };
        let highest = panel
            .values
            .iter()
            .map(top_of)
            .chain(panel.reference.iter().map(|r| r.0))
            .fold(0.0, f64::max);
        let step = nice_step(panel.y_max.unwrap_or(highest * 1.15) / 5.0);
        let y_max = panel
            .y_max
            .unwrap_or_else(|| (highest * 1.15 / step).ceil().max(1.0) * step);
        let sy = |y: f64| TOP + PLOT_H - y / y_max * PLOT_H;
        let _ = write!(
            svg,
            r#"<text x="{}" y="66" font-size="13" text-anchor="middle">{}</text>"#,
            left + plot_w / 2.0,
            escape(&panel.title)
        );
        let mut tick = 0.0;
        while tick <= y_max + step / 2.0 {
            let _ = write!(
                svg,
                r##"<line x1="{left}" x2="{}" y1="{y}" y2="{y}" stroke="#e0e0e0"/><text x="{}" y="{}" text-anchor="end" font-size="11">{}</text>"##,
                left + plot_w,
                left - 5.0,
                sy(tick) + 4.0,
                trim(tick),
                y = sy(tick)
            );
            tick += step;
        }
        let _ = write!(
            svg,
            r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle" font-size="11">{}</text>"#,
            x0 + 14.0,
            TOP + PLOT_H / 2.0,
            escape(&panel.y_label)
        );
        let group_w = plot_w / self.groups.len().max(1) as f64;
        for (g, values) in panel.values.iter().enumerate() {
            let gx = left + group_w * g as f64;
            if panel.stacked {
                let (bar_w, mut base) = (group_w * 0.5, 0.0);
                for (s, &value) in values.iter().enumerate() {
                    if !value.is_finite() {
                        continue;
                    }
                    let _ = write!(
                        svg,
                        r#"<rect x="{:.1}" y="{:.1}" width="{bar_w:.1}" height="{:.1}" fill="{}"/>"#,
                        gx + group_w * 0.25,
                        sy(base + value),
                        sy(base) - sy(base + value),
                        COLORS[s % COLORS.len()]
                    );
                    base += value;
                }
                let _ = write!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.*}</text>"#,
                    gx + group_w / 2.0,
                    sy(base) - 3.0,
                    panel.decimals,
                    base
                );
            } else {
                let bar_w = group_w * 0.8 / values.len().max(1) as f64;
                for (s, &value) in values.iter().enumerate() {
                    if !value.is_finite() {
                        continue;
                    }
                    let bx = gx + group_w * 0.1 + bar_w * s as f64;
                    let _ = write!(
                        svg,
                        r#"<rect x="{bx:.1}" y="{:.1}" width="{bar_w:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.*}</text>"#,
                        sy(value),
                        sy(0.0) - sy(value),
                        COLORS[s % COLORS.len()],
                        bx + bar_w / 2.0,
                        sy(value) - 3.0,
                        panel.decimals,
                        value
                    );
                }
            }
            for (line, text) in wrap(&self.groups[g]).iter().enumerate() {
                let _ = write!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"#,
                    gx + group_w / 2.0,
                    TOP + PLOT_H + 16.0 + 13.0 * line as f64,
                    escape(text)
                );
            }
        }
        // The reference: a dashed line across, and what it is under the
        // group labels, clear of the bars and their values.
        if let Some((value, label)) = &panel.reference {
            let (y, caption_y) = (sy(*value), TOP + PLOT_H + 50.0);
            let _ = write!(
                svg,
                r#"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="black" stroke-dasharray="5,4"/><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black" stroke-dasharray="5,4"/><text x="{:.1}" y="{caption_y}" font-size="11">{}</text>"#,
                left + plot_w,
                left + plot_w / 2.0 - 80.0,
                left + plot_w / 2.0 - 56.0,
                caption_y - 4.0,
                caption_y - 4.0,
                left + plot_w / 2.0 - 50.0,
                escape(label),
            );
        }
        let _ = write!(
            svg,
            r#"<rect x="{left}" y="{TOP}" width="{plot_w}" height="{PLOT_H}" fill="none" stroke="black"/>"#
        );
    }
}

/// 1, 2 or 5 times a power of ten, at least `rough`.
fn nice_step(rough: f64) -> f64 {
    if rough <= 0.0 || !rough.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&step| step >= rough)
        .unwrap_or(10.0 * power)
}

fn trim(value: f64) -> String {
    let text = format!("{value:.2}");
    // "0.50" -> "0.5", "2.00" -> "2" (and "100.00" -> "100", not "1").
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A group's label on lines of about a dozen characters, split after `_`.
fn wrap(label: &str) -> Vec<String> {
    let mut lines = vec![String::new()];
    for (i, word) in label.split('_').enumerate() {
        let piece = if i == 0 {
            word.to_owned()
        } else {
            format!("_{word}")
        };
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.len() + piece.len() > 12 {
            lines.push(piece);
        } else {
            line.push_str(&piece);
        }
    }
    lines
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
