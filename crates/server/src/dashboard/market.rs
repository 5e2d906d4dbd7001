//! The market page (public): GPUs online by model and region with their utilisation, how much
//! of the demand was placed, the clearing-price index per model and tier over time, and the
//! queue and its waits per tier.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Response;
use store::{NodeRecord, PricePoint, RunWait, TierCount};

use super::chart::{LineChart, Series, line_chart};
use super::html::{badge, dollars, duration, escape, median, per_gpu_hour, percent, quantile, stat, table};
use super::{MaybeSession, PageError, PageQuery, render};
use crate::state::AppState;

/// Leases read for the price index, at most (as many as `/v1/market` reads).
pub(super) const PRICE_POINTS_MAX: i64 = 200_000;
/// Jobs read for the queue's waits and fill rate, at most.
const JOBS_READ_MAX: i64 = 200_000;
/// The price chart's buckets: the first width that cuts the window into at most this many.
const BUCKETS_MAX: i64 = 48;
const BUCKET_WIDTHS_S: [i64; 10] = [60, 300, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400];

pub(super) fn bucket_us(window_us: i64) -> i64 {
    BUCKET_WIDTHS_S
        .iter()
        .map(|seconds| seconds * 1_000_000)
        .find(|width| window_us / width <= BUCKETS_MAX)
        .unwrap_or(86_400_000_000)
}

/// A tier as it sorts: gold, silver, bronze, then anything else by name.
type TierKey = (u8, String);

pub(super) fn tier_rank(tier: &str) -> TierKey {
    (
        model::Tier::parse(tier).map_or(u8::MAX, |tier| tier as u8),
        tier.to_string(),
    )
}

/// Each model's on-demand reference price: the median clearing price of its silver (on-demand)
/// leases among `points`. The coordinator has no outside price feed, so the market's own
/// on-demand price is the reference.
pub(super) fn silver_reference(points: &[PricePoint]) -> BTreeMap<String, i64> {
    let mut prices: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for point in points.iter().filter(|point| point.tier == "silver") {
        prices
            .entry(point.gpu_model.clone())
            .or_default()
            .push(point.price_micros);
    }
    prices
        .into_iter()
        .filter_map(|(model, mut prices)| {
            prices.sort_unstable();
            median(&prices).map(|price| (model, price))
        })
        .collect()
}

/// The price index: per (model, tier), the median clearing price of the leases granted in each
/// bucket, at the bucket's middle.
fn price_series(points: &[PricePoint], bucket_us: i64) -> Vec<Series> {
    let mut groups: BTreeMap<(String, TierKey), BTreeMap<i64, Vec<i64>>> = BTreeMap::new();
    for point in points {
        groups
            .entry((point.gpu_model.clone(), tier_rank(&point.tier)))
            .or_default()
            .entry(point.at.div_euclid(bucket_us) * bucket_us)
            .or_default()
            .push(point.price_micros);
    }
    groups
        .into_iter()
        .map(|((model, (_, tier)), buckets)| Series {
            label: format!("{model} {tier}"),
            points: buckets
                .into_iter()
                .filter_map(|(start, mut prices)| {
                    prices.sort_unstable();
                    median(&prices).map(|price| (start + bucket_us / 2, price))
                })
                .collect(),
        })
        .collect()
}

/// One tier's queue: jobs waiting now, and of those submitted in the window how many were
/// started and how long they waited for their first run (a lease that waits out a victim's
/// grace period is not yet a start).
struct TierQueue {
    tier: String,
    queued_now: i64,
    submitted: usize,
    waits_us: Vec<i64>,
}

fn queues(queued: &[TierCount], jobs: &[RunWait]) -> Vec<TierQueue> {
    fn entry<'a>(tiers: &'a mut BTreeMap<TierKey, TierQueue>, tier: &str) -> &'a mut TierQueue {
        tiers.entry(tier_rank(tier)).or_insert_with(|| TierQueue {
            tier: tier.to_string(),
            queued_now: 0,
            submitted: 0,
            waits_us: Vec::new(),
        })
    }
    let mut tiers: BTreeMap<TierKey, TierQueue> = BTreeMap::new();
    for count in queued {
        entry(&mut tiers, &count.tier).queued_now += count.jobs;
    }
    for job in jobs {
        let queue = entry(&mut tiers, &job.tier);
        queue.submitted += 1;
        if let Some(started_at) = job.first_run_at {
            queue.waits_us.push((started_at - job.submitted_at).max(0));
        }
    }
    let mut out: Vec<TierQueue> = tiers.into_values().collect();
    for queue in &mut out {
        queue.waits_us.sort_unstable();
    }
    out
}

/// GPUs online per (model, region), and how many of them are simulated.
fn simulated_gpus(nodes: &[NodeRecord]) -> BTreeMap<(String, String), (u64, u64)> {
    let mut out: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for record in nodes.iter().filter(|record| record.online) {
        let gpus = record.node.gpu_count.max(0) as u64;
        let entry = out
            .entry((record.node.gpu_model.clone(), record.node.region.clone()))
            .or_default();
        entry.0 += gpus;
        if record.node.simulated {
            entry.1 += gpus;
        }
    }
    out
}

/// The links that change the window and turn on reloading.
pub(super) fn window_links(path: &str, hours: i64) -> String {
    let mut out = format!("<p class=\"controls\">Window: last {hours} h ·");
    for (label, choice) in [("1 h", 1), ("24 h", 24), ("7 d", 168), ("30 d", 720)] {
        out.push_str(&format!(" <a href=\"{path}?hours={choice}\">{label}</a>"));
    }
    out.push_str(&format!(
        " · <a href=\"{path}?hours={hours}&amp;refresh_s=15\">reload every 15 s</a></p>"
    ));
    out
}

pub async fn page(
    State(state): State<Arc<AppState>>,
    MaybeSession(session): MaybeSession,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, PageError> {
    let query = query.map(|Query(query)| query).unwrap_or_default();
    let hours = query.window_hours();
    let now = state.now_us();
    let window_us = hours * 3_600_000_000;
    let from = now - window_us;
    let bucket = bucket_us(window_us);
    let index = crate::routes::market_index(state.clone(), bucket / 1_000_000, hours * 3600).await?;
    let nodes = state.store.nodes().await?;
    let points = state.store.price_points(from, PRICE_POINTS_MAX).await?;
    let queued = state.store.queued_per_tier().await?;
    let jobs = state.store.run_waits_since(from, JOBS_READ_MAX).await?;

    let simulated = simulated_gpus(&nodes);
    let gpus_online: u64 = index.utilisation.iter().map(|row| row.gpus_online).sum();
    let gpus_simulated: u64 = simulated.values().map(|(_, simulated)| simulated).sum();
    let milli_used: u64 = index.utilisation.iter().map(|row| row.gpu_milli_used).sum();
    let submitted = jobs.len();
    let started = jobs.iter().filter(|job| job.first_run_at.is_some()).count();
    let queued_now: i64 = queued.iter().map(|count| count.jobs).sum();

    let mut body = String::from("<h1>Market</h1>");
    body.push_str(&window_links("/dashboard", hours));
    body.push_str("<section class=\"stats\">");
    let online_text = if gpus_simulated > 0 {
        format!("{gpus_online} ({gpus_simulated} simulated)")
    } else {
        gpus_online.to_string()
    };
    body.push_str(&stat("GPUs online", &online_text));
    body.push_str(&stat("GPUs in use", &format!("{:.1}", milli_used as f64 / 1000.0)));
    body.push_str(&stat(
        "utilisation",
        &percent(if gpus_online == 0 {
            0.0
        } else {
            milli_used as f64 / (gpus_online * 1000) as f64
        }),
    ));
    body.push_str(&stat(
        "fill rate (jobs started / submitted)",
        &if submitted == 0 {
            "–".to_string()
        } else {
            percent(started as f64 / submitted as f64)
        },
    ));
    body.push_str(&stat("jobs queued now", &queued_now.to_string()));
    body.push_str("</section>");

    body.push_str("<h2>GPUs online by model and region</h2>");
    let rows: Vec<Vec<String>> = index
        .utilisation
        .iter()
        .map(|row| {
            let simulated = simulated
                .get(&(row.gpu_model.clone(), row.region.clone()))
                .map_or(0, |(_, simulated)| *simulated);
            let online = if simulated > 0 {
                format!(
                    "{} {}",
                    row.gpus_online,
                    badge("simulated", &format!("{simulated} simulated"))
                )
            } else {
                row.gpus_online.to_string()
            };
            vec![
                escape(&row.gpu_model),
                escape(&row.region),
                online,
                format!("{:.1}", row.gpu_milli_used as f64 / 1000.0),
                percent(row.utilisation),
            ]
        })
        .collect();
    body.push_str(&table(
        "gpus",
        &["model", "region", "GPUs online", "GPUs in use", "utilisation"],
        &rows,
        "No GPUs are online.",
    ));

    body.push_str("<h2>Clearing-price index</h2>");
    let series = price_series(&points, bucket);
    body.push_str(&line_chart(&LineChart {
        title: "median clearing price per GPU-hour, per model and tier",
        from_us: from,
        to_us: now,
        series: &series,
        value_label: dollars,
        running_total: false,
    }));
    body.push_str(&format!(
        "<p class=\"note\">The median clearing price of the leases granted in each {}, per GPU model and tier.</p>",
        duration(bucket)
    ));
    let reference = silver_reference(&points);
    let mut groups: BTreeMap<(String, TierKey), Vec<i64>> = BTreeMap::new();
    for point in &points {
        groups
            .entry((point.gpu_model.clone(), tier_rank(&point.tier)))
            .or_default()
            .push(point.price_micros);
    }
    let rows: Vec<Vec<String>> = groups
        .into_iter()
        .map(|((model, (_, tier)), mut prices)| {
            prices.sort_unstable();
            let median_price = median(&prices).unwrap_or(0);
            vec![
                escape(&model),
                escape(&tier),
                prices.len().to_string(),
                per_gpu_hour(median_price),
                per_gpu_hour(prices[0]),
                per_gpu_hour(prices[prices.len() - 1]),
                reference
                    .get(&model)
                    .map_or_else(|| "–".to_string(), |price| per_gpu_hour(*price)),
            ]
        })
        .collect();
    body.push_str(&table(
        "prices",
        &["model", "tier", "leases", "median", "min", "max", "on-demand reference"],
        &rows,
        "No leases were granted in this window.",
    ));
    body.push_str(
        "<p class=\"note\">On-demand reference: the median silver (on-demand) clearing price of the same \
         model in this window. The coordinator reads no outside price feed, so the market's own on-demand \
         price is the reference.</p>",
    );

    body.push_str("<h2>Queue by tier</h2>");
    let rows: Vec<Vec<String>> = queues(&queued, &jobs)
        .into_iter()
        .map(|queue| {
            let wait = |q: f64| quantile(&queue.waits_us, q).map_or_else(|| "–".to_string(), duration);
            vec![
                escape(&queue.tier),
                queue.queued_now.to_string(),
                queue.submitted.to_string(),
                queue.waits_us.len().to_string(),
                if queue.submitted == 0 {
                    "–".to_string()
                } else {
                    percent(queue.waits_us.len() as f64 / queue.submitted as f64)
                },
                wait(0.5),
                wait(0.95),
            ]
        })
        .collect();
    body.push_str(&table(
        "queue",
        &[
            "tier",
            "queued now",
            "submitted",
            "started",
            "fill rate",
            "p50 wait",
            "p95 wait",
        ],
        &rows,
        "No jobs in this window.",
    ));
    body.push_str(
        "<p class=\"note\">Waits run from a job's submission to the first run of a replica, for jobs submitted in this window.</p>",
    );
    Ok(render("Market", session.as_ref(), &body, query.refresh_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at: i64, model: &str, tier: &str, price: i64) -> PricePoint {
        PricePoint {
            at,
            gpu_model: model.into(),
            region: "eu".into(),
            tier: tier.into(),
            price_micros: price,
            gpu_milli_total: 1000,
        }
    }

    #[test]
    fn the_index_takes_each_buckets_median_per_model_and_tier() {
        let hour = 3_600_000_000;
        let points = [
            point(10, "H100", "silver", 2_000_000),
            point(20, "H100", "silver", 3_000_000),
            point(30, "H100", "silver", 1_000_000),
            point(hour + 5, "H100", "silver", 4_000_000),
            point(40, "H100", "bronze", 900_000),
            point(50, "A100", "gold", 1_500_000),
        ];
        let series = price_series(&points, hour);
        let labels: Vec<&str> = series.iter().map(|series| series.label.as_str()).collect();
        assert_eq!(labels, ["A100 gold", "H100 silver", "H100 bronze"]);
        assert_eq!(series[1].points, [(hour / 2, 2_000_000), (hour + hour / 2, 4_000_000)]);
        assert_eq!(
            silver_reference(&points),
            BTreeMap::from([("H100".to_string(), 3_000_000)])
        );
    }

    #[test]
    fn queues_count_waits_of_placed_jobs_per_tier() {
        let queued = [TierCount {
            tier: "bronze".to_string(),
            jobs: 2,
        }];
        let wait = |tier: &str, submitted_at: i64, first_run_at: Option<i64>| RunWait {
            tier: tier.to_string(),
            submitted_at,
            first_run_at,
        };
        let jobs = [
            wait("silver", 0, Some(1_000)),
            wait("silver", 0, None),
            wait("gold", 10, Some(30)),
        ];
        let queues = queues(&queued, &jobs);
        let tiers: Vec<&str> = queues.iter().map(|queue| queue.tier.as_str()).collect();
        assert_eq!(tiers, ["gold", "silver", "bronze"]);
        assert_eq!((queues[1].submitted, queues[1].waits_us.clone()), (2, vec![1_000]));
        assert_eq!((queues[2].queued_now, queues[2].submitted), (2, 0));
        assert_eq!(queues[0].waits_us, [20]);
    }

    #[test]
    fn buckets_cut_the_window_into_at_most_48() {
        assert_eq!(bucket_us(3_600_000_000), 300_000_000);
        assert_eq!(bucket_us(86_400_000_000), 1_800_000_000);
        assert_eq!(bucket_us(90 * 86_400_000_000), 86_400_000_000);
    }
}
