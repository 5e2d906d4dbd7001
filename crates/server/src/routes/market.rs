//! Endpoints for everyone: the market index (clearing prices and utilisation) and health.

use std::collections::BTreeMap;
use std::sync::Arc;

use api::*;
use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use crate::error::ApiResult;
use crate::extract::Query;
use crate::state::AppState;

use super::AppStateRef;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketQuery {
    /// Bucket width in seconds (default an hour).
    bucket_s: Option<i64>,
    /// How far back, in seconds (default a day).
    since_s: Option<i64>,
}

/// The market index: clearing prices per model, region and tier over time, and utilisation now.
pub async fn market(State(state): AppStateRef, Query(query): Query<MarketQuery>) -> ApiResult<Json<MarketView>> {
    let bucket_us = query.bucket_s.unwrap_or(3600).clamp(60, 86_400 * 7) * 1_000_000;
    let since_us = state.now_us() - query.since_s.unwrap_or(86_400).clamp(60, 86_400 * 90) * 1_000_000;
    let points = state.store.price_points(since_us, 200_000).await?;
    let mut groups: BTreeMap<(i64, String, String, String), Vec<i64>> = BTreeMap::new();
    for point in points {
        groups
            .entry((
                point.at.div_euclid(bucket_us) * bucket_us,
                point.gpu_model,
                point.region,
                point.tier,
            ))
            .or_default()
            .push(point.price_micros);
    }
    let prices = groups
        .into_iter()
        .map(|((bucket_start_us, gpu_model, region, tier), mut prices)| {
            prices.sort_unstable();
            PriceBucket {
                bucket_start_us,
                gpu_model,
                region,
                tier,
                leases: prices.len() as u64,
                median_price_micros_per_gpu_hour: prices[prices.len() / 2],
                min_price_micros_per_gpu_hour: prices[0],
                max_price_micros_per_gpu_hour: prices[prices.len() - 1],
            }
        })
        .collect();
    let mut utilisation: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for node in state.store.nodes().await? {
        if node.online {
            let entry = utilisation
                .entry((node.node.gpu_model.clone(), node.node.region.clone()))
                .or_default();
            entry.0 += node.node.gpu_count.max(0) as u64;
        }
    }
    for lease in state.store.live_leases().await? {
        if let Some(entry) = utilisation.get_mut(&(lease.lease.gpu_model.clone(), lease.lease.region.clone())) {
            entry.1 += u64::from(lease.lease.gpu_mask.count_ones() as u16) * lease.lease.gpu_milli.max(0) as u64;
        }
    }
    Ok(Json(MarketView {
        prices,
        utilisation: utilisation
            .into_iter()
            .map(|((gpu_model, region), (gpus, used))| UtilisationRow {
                gpu_model,
                region,
                gpus_online: gpus,
                gpu_milli_used: used,
                utilisation: if gpus == 0 {
                    0.0
                } else {
                    used as f64 / (gpus * 1000) as f64
                },
            })
            .collect(),
    }))
}

pub async fn health(State(state): AppStateRef) -> ApiResult<Json<serde_json::Value>> {
    let nodes = state.store.nodes_version().await?.updated_at;
    Ok(Json(serde_json::json!({"status": "ok", "nodes_version": nodes})))
}

/// The market index over the last `since_s` seconds in buckets of `bucket_s`, as `GET /v1/market`.
pub(crate) async fn market_index(state: Arc<AppState>, bucket_s: i64, since_s: i64) -> ApiResult<MarketView> {
    let query = MarketQuery {
        bucket_s: Some(bucket_s),
        since_s: Some(since_s),
    };
    Ok(market(State(state), Query(query)).await?.0)
}
