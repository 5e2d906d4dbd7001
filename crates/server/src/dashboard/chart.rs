//! SVG charts drawn on the server: line charts over time with axes, ticks and a legend, and a
//! job's timeline as bars of lease states. Pure functions of their data; no script runs in the
//! browser.

use std::fmt::Write;

use super::html::{clock, escape};

/// The drawing's size in SVG units (it scales to the page's width) and its margins.
const WIDTH: i64 = 760;
const HEIGHT: i64 = 260;
const LEFT: i64 = 84;
const RIGHT: i64 = 16;
const TOP: i64 = 14;
const BOTTOM: i64 = 30;
/// Series past this many points are drawn as a line only, without a dot per point.
const DOTS_MAX: usize = 60;
/// Colours of the series, in turn.
const PALETTE: [&str; 8] = [
    "#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626",
];

/// One line: values at times (microseconds since 1970), in time order.
pub struct Series {
    pub label: String,
    pub points: Vec<(i64, i64)>,
}

/// A line chart of `series` between `from_us` and `to_us`; `value_label` writes a value on the
/// vertical axis (e.g. as dollars). A `running_total` is drawn in steps (it changes at its
/// points, not between them) with the space under it shaded.
pub struct LineChart<'a> {
    pub title: &'a str,
    pub from_us: i64,
    pub to_us: i64,
    pub series: &'a [Series],
    pub value_label: fn(i64) -> String,
    pub running_total: bool,
}

/// The smallest of 1, 2 or 5 × 10^k that is at least `raw` (at least 1).
fn nice_step(raw: i64) -> i64 {
    let mut magnitude = 1i64;
    loop {
        for factor in [1, 2, 5] {
            let step = magnitude.saturating_mul(factor);
            if step >= raw {
                return step;
            }
        }
        if magnitude > i64::MAX / 10 {
            return i64::MAX;
        }
        magnitude *= 10;
    }
}

/// `value / step` rounded up, for positive values and steps.
fn ceil_div(value: i64, step: i64) -> i64 {
    value / step + i64::from(value % step != 0)
}

/// Tick spacing on the time axis: the first of these that gives at most six ticks.
const TIME_STEPS_S: [i64; 14] = [
    10, 30, 60, 300, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400, 172_800, 604_800,
];

fn time_step_us(span_us: i64) -> i64 {
    TIME_STEPS_S
        .iter()
        .map(|seconds| seconds * 1_000_000)
        .find(|step| span_us / step <= 6)
        .unwrap_or(span_us.max(1))
}

/// The SVG of a line chart, followed by its legend.
pub fn line_chart(chart: &LineChart) -> String {
    let to_us = chart.to_us.max(chart.from_us + 1);
    let span_us = to_us - chart.from_us;
    let (plot_width, plot_height) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x_of = |at: i64| {
        let share = (at.clamp(chart.from_us, to_us) - chart.from_us) as f64 / span_us as f64;
        LEFT as f64 + share * plot_width as f64
    };
    let value_max = chart
        .series
        .iter()
        .flat_map(|series| series.points.iter().map(|(_, value)| *value))
        .max()
        .unwrap_or(0)
        .max(1);
    let value_step = nice_step(ceil_div(value_max, 4));
    let value_top = ceil_div(value_max, value_step).saturating_mul(value_step);
    let y_of = |value: i64| {
        let share = value.clamp(0, value_top) as f64 / value_top as f64;
        (TOP + plot_height) as f64 - share * plot_height as f64
    };

    let mut svg = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{title}\">\
         <title>{title}</title>",
        title = escape(chart.title)
    );
    // The value axis: grid lines and labels from 0 to the top.
    let mut value = 0;
    while value <= value_top {
        let y = y_of(value);
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>\
             <text class=\"tick\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6,
            y + 4.0,
            escape(&(chart.value_label)(value))
        );
        match value.checked_add(value_step) {
            Some(next) => value = next,
            None => break,
        }
    }
    // The time axis: ticks on round times.
    let step_us = time_step_us(span_us);
    let with_date = span_us > 86_400_000_000;
    let mut at = chart.from_us.div_euclid(step_us) * step_us;
    if at < chart.from_us {
        at += step_us;
    }
    while at <= to_us {
        let x = x_of(at);
        let _ = write!(
            svg,
            "<line class=\"axis\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{}\" y2=\"{}\"/>\
             <text class=\"tick\" x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            TOP + plot_height,
            TOP + plot_height + 5,
            HEIGHT - 8,
            clock(at, with_date)
        );
        at += step_us;
    }
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{LEFT}\" x2=\"{}\" y1=\"{bottom}\" y2=\"{bottom}\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{bottom}\"/>",
        WIDTH - RIGHT,
        bottom = TOP + plot_height
    );

    let mut drawn = 0;
    for (index, series) in chart.series.iter().enumerate() {
        if series.points.is_empty() {
            continue;
        }
        drawn += 1;
        let colour = PALETTE[index % PALETTE.len()];
        let mut path = String::new();
        for (position, (at, value)) in series.points.iter().enumerate() {
            let (x, y) = (x_of(*at), y_of(*value));
            if position == 0 {
                let _ = write!(path, "M{x:.1} {y:.1} ");
            } else if chart.running_total {
                let _ = write!(path, "H{x:.1} V{y:.1} ");
            } else {
                let _ = write!(path, "L{x:.1} {y:.1} ");
            }
        }
        if chart.running_total {
            let first = x_of(series.points[0].0);
            let last = x_of(series.points[series.points.len() - 1].0);
            let bottom = TOP + plot_height;
            let _ = write!(
                svg,
                "<path class=\"area\" d=\"{path}L{last:.1} {bottom} L{first:.1} {bottom} Z\" fill=\"{colour}\"/>"
            );
        }
        let _ = write!(
            svg,
            "<path class=\"line\" d=\"{}\" stroke=\"{colour}\"><title>{}</title></path>",
            path.trim_end(),
            escape(&series.label)
        );
        if series.points.len() <= DOTS_MAX {
            for (at, value) in &series.points {
                let _ = write!(
                    svg,
                    "<circle class=\"dot\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\">\
                     <title>{}: {} at {}</title></circle>",
                    x_of(*at),
                    y_of(*value),
                    escape(&series.label),
                    escape(&(chart.value_label)(*value)),
                    clock(*at, true)
                );
            }
        }
    }
    if drawn == 0 {
        let _ = write!(
            svg,
            "<text class=\"nodata\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data in this window</text>",
            LEFT + plot_width / 2,
            TOP + plot_height / 2
        );
    }
    svg.push_str("</svg>");
    svg.push_str(&legend(
        chart
            .series
            .iter()
            .enumerate()
            .map(|(index, series)| (PALETTE[index % PALETTE.len()], series.label.as_str())),
    ));
    svg
}

fn legend<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::from("<ul class=\"legend\">");
    for (colour, label) in entries {
        let _ = write!(
            out,
            "<li><svg class=\"swatch\" viewBox=\"0 0 10 10\"><rect width=\"10\" height=\"10\" fill=\"{colour}\"/></svg>{}</li>",
            escape(label)
        );
    }
    out.push_str("</ul>");
    out
}

/// A stretch of time in one state (`state` picks the colour: queued, pending, staging, running,
/// finished, failed, preempted, lost, cancelled).
pub struct Span {
    pub state: String,
    pub from_us: i64,
    pub to_us: i64,
}

/// The colour of a job's or lease's state on the timeline.
fn state_colour(state: &str) -> &'static str {
    match state {
        "queued" => "#9ca3af",
        "pending" => "#fbbf24",
        "staging" => "#f59e0b",
        "running" => "#2563eb",
        "finished" => "#059669",
        "failed" | "lost" => "#dc2626",
        "preempted" => "#db2777",
        _ => "#6b7280",
    }
}

const ROW_HEIGHT: i64 = 26;

/// A timeline: one labelled row of spans per lease (and one for the job's wait), between
/// `from_us` and `to_us`, with the states' legend.
pub fn timeline(rows: &[(String, Vec<Span>)], from_us: i64, to_us: i64) -> String {
    let to_us = to_us.max(from_us + 1);
    let span_us = to_us - from_us;
    let label_width = 150;
    let plot_width = WIDTH - label_width - RIGHT;
    let height = TOP + rows.len() as i64 * ROW_HEIGHT + BOTTOM;
    let x_of = |at: i64| {
        let share = (at.clamp(from_us, to_us) - from_us) as f64 / span_us as f64;
        label_width as f64 + share * plot_width as f64
    };
    let mut svg = format!(
        "<svg class=\"chart timeline\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"timeline\">\
         <title>timeline</title>"
    );
    let mut states: Vec<&str> = Vec::new();
    for (index, (label, spans)) in rows.iter().enumerate() {
        let y = TOP + index as i64 * ROW_HEIGHT;
        let _ = write!(
            svg,
            "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            label_width - 8,
            y + ROW_HEIGHT / 2 + 4,
            escape(label)
        );
        for span in spans {
            let (x1, x2) = (x_of(span.from_us), x_of(span.to_us));
            let _ = write!(
                svg,
                "<rect x=\"{x1:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"{}\">\
                 <title>{}: {}</title></rect>",
                y + 4,
                (x2 - x1).max(2.0),
                ROW_HEIGHT - 8,
                state_colour(&span.state),
                escape(&span.state),
                super::html::duration(span.to_us - span.from_us)
            );
            if !states.contains(&span.state.as_str()) {
                states.push(&span.state);
            }
        }
    }
    let bottom = TOP + rows.len() as i64 * ROW_HEIGHT;
    let step_us = time_step_us(span_us);
    let mut at = from_us.div_euclid(step_us) * step_us + step_us;
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{label_width}\" x2=\"{}\" y1=\"{bottom}\" y2=\"{bottom}\"/>",
        WIDTH - RIGHT
    );
    while at <= to_us {
        let x = x_of(at);
        let _ = write!(
            svg,
            "<text class=\"tick\" x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            bottom + 18,
            clock(at, span_us > 86_400_000_000)
        );
        at += step_us;
    }
    svg.push_str("</svg>");
    svg.push_str(&legend(states.into_iter().map(|state| (state_colour(state), state))));
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dollars(micros: i64) -> String {
        super::super::html::dollars(micros)
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0), 1);
        assert_eq!(nice_step(3), 5);
        assert_eq!(nice_step(277), 500);
        assert_eq!(nice_step(1_000_000), 1_000_000);
        assert_eq!(nice_step(1_000_001), 2_000_000);
        assert_eq!(time_step_us(3_600_000_000), 900_000_000);
    }

    #[test]
    fn a_line_chart_has_axes_labels_and_escaped_series() {
        let series = [Series {
            label: "H100 <silver>".into(),
            points: vec![(0, 1_500_000), (1_800_000_000, 2_100_000)],
        }];
        let svg = line_chart(&LineChart {
            title: "price",
            from_us: 0,
            to_us: 3_600_000_000,
            series: &series,
            value_label: dollars,
            running_total: false,
        });
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains(">$3.00<") && svg.contains(">$0.00<"), "value ticks: {svg}");
        assert!(svg.contains(">00:15<") && svg.contains(">01:00<"), "time ticks: {svg}");
        assert!(
            svg.contains("H100 &lt;silver&gt;") && !svg.contains("<silver>"),
            "{svg}"
        );
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(!svg.contains("no data"));
    }

    #[test]
    fn a_running_total_is_drawn_in_steps_over_a_shaded_area() {
        let series = [Series {
            label: "spent".into(),
            points: vec![(0, 0), (1_800_000_000, 1_000_000), (3_600_000_000, 1_000_000)],
        }];
        let svg = line_chart(&LineChart {
            title: "spend",
            from_us: 0,
            to_us: 3_600_000_000,
            series: &series,
            value_label: dollars,
            running_total: true,
        });
        assert!(svg.contains("d=\"M84.0 230.0 H414.0 V14.0 H744.0 V14.0\""), "{svg}");
        assert!(svg.contains("<path class=\"area\""), "{svg}");
    }

    #[test]
    fn an_empty_chart_says_so() {
        let svg = line_chart(&LineChart {
            title: "spend",
            from_us: 0,
            to_us: 60_000_000,
            series: &[],
            value_label: dollars,
            running_total: true,
        });
        assert!(svg.contains("no data in this window"), "{svg}");
    }

    #[test]
    fn a_timeline_draws_each_span_and_names_its_states() {
        let rows = vec![
            (
                "job".to_string(),
                vec![Span {
                    state: "queued".into(),
                    from_us: 0,
                    to_us: 1_000_000,
                }],
            ),
            (
                "replica 0".to_string(),
                vec![Span {
                    state: "running".into(),
                    from_us: 1_000_000,
                    to_us: 5_000_000,
                }],
            ),
        ];
        let svg = timeline(&rows, 0, 5_000_000);
        assert_eq!(svg.matches("<rect x=").count(), 2, "{svg}");
        assert!(svg.contains("running: 4.0 s") && svg.contains("</ul>"), "{svg}");
    }
}
