//! A hand-made SVG chart: one panel per metric, message size on a log2 x axis.

use std::fmt::Write;

/// One line of a panel.
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub dashed: bool,
    /// (message size in bytes, value)
    pub points: Vec<(u64, f64)>,
}

/// One chart panel.
pub struct Panel {
    pub title: String,
    pub y_label: String,
    /// A log10 y axis when the values span more than two decades.
    pub log_y_if_wide: bool,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 860.0;
const PANEL_H: f64 = 340.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn size_label(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// A round number at least `max` (1, 2, 2.5 or 5 times a power of ten).
fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= max {
            return m * mag;
        }
    }
    10.0 * mag
}

fn fmt_value(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() < 0.01 {
        format!("{v:.0e}")
    } else if v.abs() >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the panels (those without points are left out) as one SVG document.
pub fn svg(title: &str, panels: &[Panel]) -> String {
    let panels: Vec<&Panel> = panels
        .iter()
        .filter(|p| p.series.iter().any(|s| !s.points.is_empty()))
        .collect();
    let height = 40.0 + PANEL_H * panels.len().max(1) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="26" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, 40.0 + PANEL_H * i as f64);
    }
    out.push_str("</svg>\n");
    out
}

fn panel(out: &mut String, p: &Panel, y0: f64) {
    let (x_left, x_right) = (LEFT, WIDTH - RIGHT);
    let (y_top, y_bottom) = (y0 + TOP, y0 + PANEL_H - BOTTOM);
    let sizes: Vec<u64> = {
        let mut s: Vec<u64> = p
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|&(x, _)| x.max(1)))
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let lg = |x: u64| (x.max(1) as f64).log2();
    let (mut lo, mut hi) = (lg(sizes[0]), lg(*sizes.last().unwrap_or(&sizes[0])));
    if hi - lo < 1.0 {
        lo -= 1.0;
        hi += 1.0;
    }
    let x_of = |x: u64| x_left + (lg(x) - lo) / (hi - lo) * (x_right - x_left);
    let values: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|&(_, v)| v))
        .collect();
    let v_max = values.iter().copied().fold(0.0, f64::max);
    let v_min_pos = values
        .iter()
        .copied()
        .filter(|&v| v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log_y = p.log_y_if_wide && v_min_pos.is_finite() && v_max / v_min_pos > 100.0;
    // (tick values, value → y)
    let (ticks, y_of): (Vec<f64>, Box<dyn Fn(f64) -> f64>) = if log_y {
        let lo = v_min_pos.log10().floor();
        let hi = v_max.log10().ceil().max(lo + 1.0);
        let ticks = (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect();
        let f = move |v: f64| {
            let t = ((v.max(1e-300).log10() - lo) / (hi - lo)).clamp(0.0, 1.0);
            y_bottom - t * (y_bottom - y_top)
        };
        (ticks, Box::new(f))
    } else {
        let y_max = nice_ceiling(v_max * 1.05);
        let ticks = (0..=5).map(|k| y_max * k as f64 / 5.0).collect();
        let f = move |v: f64| y_bottom - (v / y_max).clamp(0.0, 1.0) * (y_bottom - y_top);
        (ticks, Box::new(f))
    };

    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="14">{}</text>"#,
        (x_left + x_right) / 2.0,
        y0 + 30.0,
        escape(&p.title)
    );
    // Grid and y ticks.
    for &v in &ticks {
        let y = y_of(v);
        let _ = writeln!(
            out,
            r##"<line x1="{x_left}" y1="{y:.1}" x2="{x_right}" y2="{y:.1}" stroke="#e0e0e0"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            x_left - 6.0,
            y + 4.0,
            fmt_value(v)
        );
    }
    // x ticks: every size present, thinned when crowded.
    let step = sizes.len().div_ceil(12).max(1);
    for (i, &s) in sizes.iter().enumerate() {
        let x = x_of(s);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{y_bottom}" x2="{x:.1}" y2="{}" stroke="#444"/>"##,
            y_bottom + 4.0
        );
        if i % step == 0 || i + 1 == sizes.len() {
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
                y_bottom + 18.0,
                size_label(s)
            );
        }
    }
    // Axes and labels.
    let _ = writeln!(
        out,
        r##"<path d="M{x_left} {y_top} V{y_bottom} H{x_right}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">message size [bytes] (log2 scale)</text>"#,
        (x_left + x_right) / 2.0,
        y_bottom + 38.0
    );
    let (lx, ly) = (22.0, (y_top + y_bottom) / 2.0);
    let _ = writeln!(
        out,
        r#"<text x="{lx}" y="{ly}" text-anchor="middle" transform="rotate(-90 {lx} {ly})">{}</text>"#,
        escape(&if log_y {
            format!("{} (log scale)", p.y_label)
        } else {
            p.y_label.clone()
        })
    );
    // Series and legend.
    for (i, s) in p.series.iter().enumerate() {
        if s.points.is_empty() {
            continue;
        }
        let mut pts = s.points.clone();
        pts.sort_by_key(|&(x, _)| x);
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, v)| format!("{:.1},{:.1}", x_of(x), y_of(v)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            path.join(" "),
            s.color
        );
        for &(x, v) in &pts {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"><title>{} bytes: {} {}</title></circle>"#,
                x_of(x),
                y_of(v),
                s.color,
                x,
                fmt_value(v),
                escape(&s.name)
            );
        }
        let ly = y_top + 10.0 + 20.0 * i as f64;
        let lx = x_right + 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/>"#,
            lx + 24.0,
            s.color
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 30.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_panels_with_points_only() {
        let bw = Panel {
            title: "bandwidth".into(),
            y_label: "MB/sec".into(),
            log_y_if_wide: false,
            series: vec![Series {
                name: "average".into(),
                color: "#1f77b4",
                dashed: false,
                points: vec![(2, 1.0), (4096, 900.0), (1 << 20, 2500.0)],
            }],
        };
        let empty = Panel {
            title: "latency".into(),
            y_label: "usec".into(),
            log_y_if_wide: true,
            series: vec![],
        };
        let s = svg("t <1>", &[bw, empty]);
        assert!(s.starts_with("<svg"));
        assert!(s.contains("t &lt;1&gt;"));
        assert!(s.contains(">1M<") && s.contains(">4K<"));
        assert!(!s.contains("latency"));
        assert_eq!(nice_ceiling(730.0), 1000.0);
        assert_eq!(nice_ceiling(0.23), 0.25);
    }
}
