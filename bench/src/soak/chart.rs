//! The soak's chart: three panels over the run's minutes — the broker's memory
//! (`VmRSS` and `RssAnon`, MiB), its open descriptors, and each door's p99 latency (ms)
//! — as a plain SVG written here (no plotting dependency).

use std::fmt::Write as _;
use std::path::Path;

use super::{DOORS, Row};

const W: f64 = 900.0;
const PANEL_H: f64 = 200.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 30.0;
const GAP: f64 = 60.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];

/// One panel: a title, a unit and named series of `(minute, value)`.
struct Panel<'a> {
    title: &'a str,
    series: Vec<(String, Vec<(f64, f64)>)>,
}

pub(crate) fn write(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    std::fs::write(path, svg(rows))?;
    Ok(())
}

pub(crate) fn svg(rows: &[Row]) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let panels = [
        Panel {
            title: "broker memory (MiB)",
            series: vec![
                (
                    "VmRSS".into(),
                    rows.iter().map(|r| (r.minute, mib(r.rss))).collect(),
                ),
                (
                    "RssAnon".into(),
                    rows.iter().map(|r| (r.minute, mib(r.rss_anon))).collect(),
                ),
            ],
        },
        Panel {
            title: "open descriptors",
            series: vec![(
                "fds".into(),
                rows.iter().map(|r| (r.minute, r.fds as f64)).collect(),
            )],
        },
        Panel {
            title: "p99 publish→delivery (ms)",
            series: DOORS
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    (
                        d.to_string(),
                        rows.iter().map(|r| (r.minute, r.doors[i].3)).collect(),
                    )
                })
                .collect(),
        },
    ];
    let height = TOP + panels.len() as f64 * (PANEL_H + GAP);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
"#
    );
    let x_max = rows.last().map_or(1.0, |r| r.minute).max(1e-9);
    for (k, p) in panels.iter().enumerate() {
        let top = TOP + k as f64 * (PANEL_H + GAP);
        let y_max = p
            .series
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|&(_, y)| y))
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.1;
        let plot_w = W - LEFT - RIGHT;
        let x = |m: f64| LEFT + m / x_max * plot_w;
        let y = |v: f64| top + PANEL_H - v / y_max * PANEL_H;
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="{}" font-weight="bold">{}</text>
<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#999"/>"##,
            top - 8.0,
            p.title
        );
        for t in 0..=4 {
            let v = y_max * f64::from(t) / 4.0;
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{yy}" y2="{yy}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{v:.1}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                y(v) + 4.0,
                yy = y(v),
            );
            let m = x_max * f64::from(t) / 4.0;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{m:.1} min</text>"#,
                x(m),
                top + PANEL_H + 16.0
            );
        }
        for (i, (name, pts)) in p.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<String> = pts
                .iter()
                .map(|&(m, v)| format!("{:.1},{:.1}", x(m), y(v)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>
<text x="{}" y="{}" fill="{color}">{name}</text>"#,
                points.join(" "),
                LEFT + plot_w + 10.0,
                top + 16.0 + 16.0 * i as f64
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_series_of_every_panel() {
        let rows: Vec<Row> = (0..3)
            .map(|m| Row {
                minute: m as f64,
                rss: 100 << 20,
                rss_anon: 50 << 20,
                fds: 40,
                doors: [(1.0, 1.0, 1.0, 2.0 + m as f64, 0); 4],
                slow_per_sec: 1.0,
            })
            .collect();
        let s = svg(&rows);
        assert!(s.starts_with("<svg"));
        assert_eq!(s.matches("<polyline").count(), 2 + 1 + DOORS.len());
        assert!(s.contains("RssAnon") && s.contains("native"));
    }
}
