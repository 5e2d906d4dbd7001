//! The HTML report: a page of the run's figures with SVG charts beside it, one file per chart,
//! so the charts can be looked at (or embedded) on their own. Plain SVG, no script.

use std::fmt::Write;

use super::report::{MarketReport, PolicyReport, TierFigures};

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 40.0;
const COLOURS: [&str; 6] = ["#1b7f5f", "#b5452c", "#3b5ba9", "#b08a1e", "#7a3f9d", "#4d4d4d"];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn header(svg: &mut String, title: &str, y_label: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(svg, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let _ = write!(
        svg,
        r#"<text transform="translate(14,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + (HEIGHT - TOP - BOTTOM) / 2.0,
        escape(y_label)
    );
}

fn axes(svg: &mut String, y_max: f64) {
    let plot_height = HEIGHT - TOP - BOTTOM;
    for step in 0..=4 {
        let value = y_max * f64::from(step) / 4.0;
        let y = TOP + plot_height * (1.0 - f64::from(step) / 4.0);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            short(value)
        );
    }
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##,
        HEIGHT - BOTTOM,
        HEIGHT - BOTTOM,
        WIDTH - RIGHT,
        HEIGHT - BOTTOM
    );
}

fn short(value: f64) -> String {
    if value.abs() >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else if value.abs() >= 100.0 || value == value.round() {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn nice_max(value: f64) -> f64 {
    if value <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    for step in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if value <= step * magnitude {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

fn legend(svg: &mut String, names: &[&str]) {
    for (index, name) in names.iter().enumerate() {
        let y = TOP + 14.0 + index as f64 * 18.0;
        let x = WIDTH - RIGHT + 12.0;
        let _ = write!(
            svg,
            r#"<rect x="{x}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            y - 10.0,
            COLOURS[index % COLOURS.len()],
            x + 18.0,
            y,
            escape(name)
        );
    }
}

/// Lines over the run: x in hours from the start.
pub fn line_chart(title: &str, y_label: &str, series: &[(&str, Vec<(f64, f64)>)]) -> String {
    let mut svg = String::new();
    header(&mut svg, title, y_label);
    let x_max = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|point| point.0))
        .fold(1.0f64, f64::max);
    let y_max = nice_max(
        series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|point| point.1))
            .fold(0.0f64, f64::max),
    );
    axes(&mut svg, y_max);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let day_step = if x_max > 24.0 * 10.0 { 48.0 } else { 24.0 };
    let mut tick = 0.0;
    while tick <= x_max {
        let x = LEFT + plot_width * tick / x_max;
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            HEIGHT - BOTTOM + 16.0,
            if tick == 0.0 {
                "0 h".to_string()
            } else {
                format!("{tick:.0} h")
            }
        );
        tick += if x_max <= 24.0 { 6.0 } else { day_step };
    }
    for (index, (_, points)) in series.iter().enumerate() {
        let mut path = String::new();
        for (position, (x, y)) in points.iter().enumerate() {
            let px = LEFT + plot_width * x / x_max;
            let py = TOP + plot_height * (1.0 - (y / y_max).clamp(0.0, 1.0));
            let _ = write!(path, "{}{px:.1},{py:.1}", if position == 0 { "M" } else { " L" });
        }
        let _ = write!(
            svg,
            r#"<path d="{path}" fill="none" stroke="{}" stroke-width="1.5"/>"#,
            COLOURS[index % COLOURS.len()]
        );
    }
    let names: Vec<&str> = series.iter().map(|(name, _)| *name).collect();
    legend(&mut svg, &names);
    svg.push_str("</svg>\n");
    svg
}

/// Grouped bars: one group per category, one bar per series; `None` bars are left out.
pub fn bar_chart(title: &str, y_label: &str, categories: &[&str], series: &[(&str, Vec<Option<f64>>)]) -> String {
    let mut svg = String::new();
    header(&mut svg, title, y_label);
    let y_max = nice_max(
        series
            .iter()
            .flat_map(|(_, values)| values.iter().flatten().copied())
            .fold(0.0f64, f64::max),
    );
    axes(&mut svg, y_max);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let group_width = plot_width / categories.len().max(1) as f64;
    let bar_width = (group_width * 0.8) / series.len().max(1) as f64;
    for (group, category) in categories.iter().enumerate() {
        let group_x = LEFT + group_width * group as f64;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            group_x + group_width / 2.0,
            HEIGHT - BOTTOM + 16.0,
            escape(category)
        );
        for (index, (_, values)) in series.iter().enumerate() {
            let Some(value) = values.get(group).copied().flatten() else {
                continue;
            };
            let height = plot_height * (value / y_max).clamp(0.0, 1.0);
            let x = group_x + group_width * 0.1 + bar_width * index as f64;
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{height:.1}" fill="{}"><title>{}</title></rect>"#,
                TOP + plot_height - height,
                (bar_width - 2.0).max(1.0),
                COLOURS[index % COLOURS.len()],
                short(value)
            );
        }
    }
    let names: Vec<&str> = series.iter().map(|(name, _)| *name).collect();
    legend(&mut svg, &names);
    svg.push_str("</svg>\n");
    svg
}

fn tiers(figures: &TierFigures) -> Vec<Option<f64>> {
    vec![figures.gold, figures.silver, figures.bronze]
}

/// The report's files: `index.html` and one SVG per chart, as (file name, contents).
pub fn render(report: &MarketReport, start: i64) -> Vec<(String, String)> {
    let policies: Vec<(&str, &PolicyReport)> = report.policies.iter().map(|(name, policy)| (*name, policy)).collect();
    let names: Vec<&str> = policies.iter().map(|(name, _)| *name).collect();
    let hours = |at: i64| (at - start) as f64 / 3600.0;
    let fleet_gpus = report.fleet.gpus.max(1) as f64;
    let mut charts: Vec<(String, String, String)> = Vec::new();
    let over_time = |value: &dyn Fn(&super::Sample) -> f64| -> Vec<(&str, Vec<(f64, f64)>)> {
        policies
            .iter()
            .map(|(name, policy)| {
                (
                    *name,
                    policy
                        .samples
                        .iter()
                        .map(|sample| (hours(sample.at), value(sample)))
                        .collect(),
                )
            })
            .collect()
    };
    charts.push((
        "utilization.svg".into(),
        "GPU utilisation over time".into(),
        line_chart(
            "GPU utilisation over time (leased GPUs / fleet GPUs)",
            "%",
            &over_time(&|sample| sample.used_gpus * 100.0 / fleet_gpus),
        ),
    ));
    charts.push((
        "fill.svg".into(),
        "Fill rate of offered windows over time".into(),
        line_chart(
            "Fill of providers' offered windows over time (leased / offered GPUs)",
            "%",
            &over_time(&|sample| {
                if sample.offered_gpus > 0.0 {
                    (sample.used_gpus * 100.0 / sample.offered_gpus).min(100.0)
                } else {
                    0.0
                }
            }),
        ),
    ));
    charts.push((
        "queued.svg".into(),
        "Jobs queued over time".into(),
        line_chart(
            "Jobs queued over time (all tiers)",
            "jobs",
            &over_time(&|sample| f64::from(sample.queued.iter().sum::<u32>())),
        ),
    ));
    charts.push((
        "fragmentation.svg".into(),
        "Fragmentation over time".into(),
        line_chart(
            "Fragmentation: free GPUs on partly used nodes / free GPUs",
            "%",
            &over_time(&|sample| sample.fragmentation_pct),
        ),
    ));
    let per_policy = |value: &dyn Fn(&PolicyReport) -> Option<f64>| -> Vec<(&str, Vec<Option<f64>>)> {
        policies
            .iter()
            .map(|(name, policy)| (*name, vec![value(policy)]))
            .collect()
    };
    charts.push((
        "fill_rate.svg".into(),
        "Fill rate by provider kind".into(),
        bar_chart(
            "Fill rate of offered GPU-hours by provider kind",
            "%",
            &["all", "datacentre", "lab", "hobbyist", "campus"],
            &policies
                .iter()
                .map(|(name, policy)| {
                    let kind = |kind: &str| policy.fill_rate_pct_by_kind.get(kind).copied().flatten();
                    (
                        *name,
                        vec![
                            Some(policy.fill_rate_pct),
                            kind("datacentre"),
                            kind("lab"),
                            kind("hobbyist"),
                            kind("campus"),
                        ],
                    )
                })
                .collect::<Vec<_>>(),
        ),
    ));
    for (quantile, pick) in [
        (
            "p50",
            (|policy: &PolicyReport| policy.wait_p50_s.clone()) as fn(&PolicyReport) -> TierFigures,
        ),
        ("p95", |policy: &PolicyReport| policy.wait_p95_s.clone()),
        ("p99", |policy: &PolicyReport| policy.wait_p99_s.clone()),
    ] {
        charts.push((
            format!("wait_{quantile}.svg"),
            format!("Queue wait {quantile} per tier"),
            bar_chart(
                &format!("Queue wait {quantile} per tier (jobs that started)"),
                "seconds",
                &["gold", "silver", "bronze"],
                &policies
                    .iter()
                    .map(|(name, policy)| (*name, tiers(&pick(policy))))
                    .collect::<Vec<_>>(),
            ),
        ));
    }
    charts.push((
        "unserved.svg".into(),
        "Unserved jobs per tier".into(),
        bar_chart(
            "Jobs never started (refused, gave up, or queued at the end) per tier",
            "% of submitted",
            &["gold", "silver", "bronze"],
            &policies
                .iter()
                .map(|(name, policy)| (*name, tiers(&policy.unserved_pct)))
                .collect::<Vec<_>>(),
        ),
    ));
    charts.push((
        "price.svg".into(),
        "Tenants' $/GPU-hour per tier".into(),
        bar_chart(
            "What tenants paid per GPU-hour, per tier, and per useful H100-hour",
            "$",
            &["gold", "silver", "bronze", "all", "useful H100-h"],
            &policies
                .iter()
                .map(|(name, policy)| {
                    let mut values = tiers(&policy.tenant_usd_per_gpu_hour_by_tier);
                    values.push(policy.tenant_usd_per_gpu_hour);
                    values.push(policy.tenant_usd_per_useful_h100_hour);
                    (*name, values)
                })
                .collect::<Vec<_>>(),
        ),
    ));
    charts.push((
        "discount.svg".into(),
        "Discount against the on-demand reference".into(),
        bar_chart(
            "Discount against the on-demand reference price, per tier (negative: dearer)",
            "%",
            &["gold", "silver", "bronze", "all"],
            &policies
                .iter()
                .map(|(name, policy)| {
                    let mut values: Vec<Option<f64>> = tiers(&policy.discount_vs_on_demand_pct_by_tier)
                        .into_iter()
                        .map(|value| value.map(|value| value.max(0.0)))
                        .collect();
                    values.push(policy.discount_vs_on_demand_pct.map(|value| value.max(0.0)));
                    (*name, values)
                })
                .collect::<Vec<_>>(),
        ),
    ));
    charts.push((
        "provider_revenue.svg".into(),
        "Providers' revenue per offered GPU-hour".into(),
        bar_chart(
            "Providers' earnings per offered GPU-hour, by kind",
            "$",
            &["all", "datacentre", "lab", "hobbyist", "campus"],
            &policies
                .iter()
                .map(|(name, policy)| {
                    let kind = |kind: &str| {
                        policy
                            .provider_usd_per_offered_gpu_hour_by_kind
                            .get(kind)
                            .copied()
                            .flatten()
                    };
                    (
                        *name,
                        vec![
                            Some(policy.provider_usd_per_offered_gpu_hour),
                            kind("datacentre"),
                            kind("lab"),
                            kind("hobbyist"),
                            kind("campus"),
                        ],
                    )
                })
                .collect::<Vec<_>>(),
        ),
    ));
    charts.push((
        "goodput.svg".into(),
        "Goodput".into(),
        bar_chart(
            "Goodput: useful over allocated GPU-hours",
            "%",
            &["gangs", "big gang", "all work"],
            &policies
                .iter()
                .map(|(name, policy)| {
                    (
                        *name,
                        vec![
                            policy.goodput_pct,
                            policy.big_gang.as_ref().and_then(|gang| gang.goodput_pct),
                            policy.goodput_all_pct,
                        ],
                    )
                })
                .collect::<Vec<_>>(),
        ),
    ));
    charts.push((
        "preemptions.svg".into(),
        "Preemptions per bronze GPU-hour".into(),
        bar_chart(
            "Bronze preemptions per bronze GPU-hour",
            "per GPU-hour",
            &["bronze"],
            &per_policy(&|policy| Some(policy.preemptions_per_bronze_gpu_hour)),
        ),
    ));
    charts.push((
        "matcher_time.svg".into(),
        "Matcher time per simulated event".into(),
        bar_chart(
            "Matcher wall time per simulated event",
            "µs",
            &["per event"],
            &per_policy(&|policy| policy.matcher_us_per_event),
        ),
    ));

    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>fallow sim market: seed {seed}</title>\
         <style>body{{font-family:sans-serif;margin:24px;max-width:1100px}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}th{{background:#f3f3f3}}\
         td:first-child,th:first-child{{text-align:left}}img{{display:block;margin:12px 0}}</style></head><body>\n\
         <h1>Market simulation</h1>\n<p>Scenario <b>{scenario}</b>, seed {seed}, {days} days, {gpus} GPUs on {nodes} \
         nodes ({source}); demand: {demand}; gold asks {gold} % over silver; pay-as-bid sellers bid {bids}. Trace hash <code>{hash}</code>.</p>\n",
        seed = report.seed,
        scenario = escape(report.scenario),
        days = report.days,
        gpus = report.fleet.gpus,
        nodes = report.fleet.nodes,
        source = escape(&report.fleet.source),
        demand = escape(&report.demand.source),
        bids = report.pay_as_bid_bids,
        gold = report.gold_ask_premium_pct,
        hash = report.trace_hash,
    );
    page.push_str("<table><tr><th>figure</th>");
    for name in &names {
        let _ = write!(page, "<th>{}</th>", escape(name));
    }
    page.push_str("</tr>\n");
    let format = |value: Option<f64>| value.map_or("–".to_string(), |value| format!("{value:.2}"));
    type Figure = Box<dyn Fn(&PolicyReport) -> Option<f64>>;
    let rows: Vec<(&str, Figure)> = vec![
        ("utilisation %", Box::new(|policy| Some(policy.utilization_pct))),
        ("fill rate %", Box::new(|policy| Some(policy.fill_rate_pct))),
        ("wait p50 gold / silver / bronze (s)", Box::new(|_| None)),
        ("goodput of gangs %", Box::new(|policy| policy.goodput_pct)),
        ("tenants' $/GPU-hour", Box::new(|policy| policy.tenant_usd_per_gpu_hour)),
        (
            "tenants' $/useful H100-hour",
            Box::new(|policy| policy.tenant_usd_per_useful_h100_hour),
        ),
        (
            "bronze discount vs on-demand %",
            Box::new(|policy| policy.bronze_discount_vs_on_demand_pct),
        ),
        (
            "providers' $/offered GPU-hour",
            Box::new(|policy| Some(policy.provider_usd_per_offered_gpu_hour)),
        ),
        (
            "preemptions / bronze GPU-hour",
            Box::new(|policy| Some(policy.preemptions_per_bronze_gpu_hour)),
        ),
        ("fragmentation %", Box::new(|policy| Some(policy.fragmentation_pct))),
        ("matcher µs / event", Box::new(|policy| policy.matcher_us_per_event)),
    ];
    let fraud_rows: Vec<(&str, Figure)> = vec![
        (
            "fraud: liars proven %",
            Box::new(|policy| policy.fraud.as_ref().and_then(|fraud| fraud.fraud_detected_pct)),
        ),
        (
            "fraud: median days to proof",
            Box::new(|policy| policy.fraud.as_ref().and_then(|fraud| fraud.median_days_to_detect)),
        ),
        (
            "fraud: honest providers slashed",
            Box::new(|policy| policy.fraud.as_ref().map(|fraud| fraud.honest_slashed as f64)),
        ),
        (
            "fraud: tenants' loss, % of what they paid",
            Box::new(|policy| policy.fraud.as_ref().and_then(|fraud| fraud.tenant_loss_to_fraud_pct)),
        ),
    ];
    let with_fraud = policies.iter().any(|(_, policy)| policy.fraud.is_some());
    let rows: Vec<(&str, Figure)> = if with_fraud {
        rows.into_iter().chain(fraud_rows).collect()
    } else {
        rows
    };
    for (label, value) in &rows {
        let _ = write!(page, "<tr><td>{}</td>", escape(label));
        for (_, policy) in &policies {
            if label.starts_with("wait p50") {
                let waits = &policy.wait_p50_s;
                let _ = write!(
                    page,
                    "<td>{} / {} / {}</td>",
                    format(waits.gold),
                    format(waits.silver),
                    format(waits.bronze)
                );
            } else {
                let _ = write!(page, "<td>{}</td>", format(value(policy)));
            }
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</table>\n");
    for (file, title, _) in &charts {
        let _ = write!(
            page,
            "<h2>{}</h2>\n<img src=\"{file}\" alt=\"{}\">\n",
            escape(title),
            escape(title)
        );
    }
    page.push_str("<p>Definitions are in the JSON report's field documentation (crates/sim/src/market/report.rs).</p>\n</body></html>\n");
    let mut files = vec![("index.html".to_string(), page)];
    files.extend(charts.into_iter().map(|(file, _, svg)| (file, svg)));
    files
}
