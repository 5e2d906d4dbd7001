//! The offer search: the market's public face, and why no offer matched.

use std::collections::BTreeMap;

use api::*;
use axum::Json;
use axum::extract::State;
use model::GpuCatalog;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, Query};

use super::AppStateRef;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferQuery {
    #[serde(default)]
    filter: String,
    limit: Option<i64>,
}

/// Offers are searchable by anyone with a key: they are the market's public face.
pub async fn search_offers(
    State(state): AppStateRef,
    Auth(_caller): Auth,
    Query(query): Query<OfferQuery>,
) -> ApiResult<Json<OfferList>> {
    let filter = OfferFilter::parse(&query.filter)?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=api::OFFERS_PAGE_MAX).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit: {limit} is not 1–{}",
            api::OFFERS_PAGE_MAX
        )));
    }
    let limit = limit as usize;
    crate::reconcile::ensure_view(&state).await?;
    let view = state.view.lock().await;
    let view = view
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the fleet view is not built yet".into()))?;
    let catalog = GpuCatalog::embedded();
    let now_s = state.now_us() / 1_000_000;
    let mut offers = Vec::new();
    let mut total = 0u64;
    let mut excluded: BTreeMap<String, u64> = BTreeMap::new();
    for (position, record) in view.records.iter().enumerate() {
        let node = &view.matcher.nodes()[position];
        let spec = catalog.spec(node.gpu_model);
        let capacity = view.matcher.node_capacity(node.id);
        let mut prices = BTreeMap::new();
        for tier in model::Tier::ALL {
            if node.policy.allowed_tiers.contains(tier)
                && let Some(ask) = node.policy.ask_at(tier, now_s)
            {
                prices.insert(tier.name().to_string(), ask.0);
            }
        }
        let offer = OfferView {
            node_id: record.id,
            provider_id: record.node.provider_id,
            gpu_model: record.node.gpu_model.clone(),
            gpu_count: node.gpu_count,
            gpus_free: capacity.whole_gpus_free() as u8,
            gpu_memory_mib: spec.memory_mib,
            compute_units: f64::from(spec.cu_milli) / 1000.0,
            region: record.node.region.clone(),
            site: record.node.site.clone(),
            reliability: f64::from(node.reliability_ppm) / 1e6,
            price_micros_per_gpu_hour: prices,
            online: record.online,
            simulated: record.node.simulated,
        };
        match filter.excluded_by(&offer) {
            None => {
                total += 1;
                offers.push(offer);
            }
            Some(clause) => *excluded.entry(clause.to_string()).or_default() += 1,
        }
    }
    let explanation = (total == 0).then(|| offers_excluded(&view.records, &excluded));
    let tier = filter.tier().map(str::to_string);
    let price_of = |offer: &OfferView| match &tier {
        Some(tier) => offer.price_micros_per_gpu_hour.get(tier).copied().unwrap_or(i64::MAX),
        None => offer
            .price_micros_per_gpu_hour
            .values()
            .copied()
            .min()
            .unwrap_or(i64::MAX),
    };
    offers.sort_by_key(|offer| (price_of(offer), offer.node_id));
    offers.truncate(limit);
    Ok(Json(OfferList {
        offers,
        total_matching: total,
        explanation,
    }))
}

/// Why no offer matched: how many nodes each clause excluded, and where the nodes are.
fn offers_excluded(records: &[store::NodeRecord], excluded: &BTreeMap<String, u64>) -> String {
    if records.is_empty() {
        return "no node is registered yet".into();
    }
    let mut parts: Vec<(u64, &String)> = excluded.iter().map(|(clause, count)| (*count, clause)).collect();
    parts.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let parts: Vec<String> = parts
        .iter()
        .map(|(count, clause)| format!("{count} excluded by `{clause}`"))
        .collect();
    let mut regions: Vec<&str> = records.iter().map(|record| record.node.region.as_str()).collect();
    regions.sort_unstable();
    regions.dedup();
    format!(
        "0 of {} nodes: {} (nodes are in {})",
        records.len(),
        parts.join(", "),
        regions.join(", ")
    )
}
