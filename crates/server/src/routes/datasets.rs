//! `POST /v1/datasets/warm`: stage a dataset ahead on the nodes a job of a given shape would
//! most likely get (`crate::warm` delivers the orders).

use api::{WARM_FOR_S, WARM_NODES_MAX, WarmRequest, WarmView};
use axum::Json;
use axum::extract::State;
use store::Role;

use super::{AppStateRef, require};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody};

pub async fn warm_dataset(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<WarmRequest>,
) -> ApiResult<Json<WarmView>> {
    require(&caller, &[Role::Tenant])?;
    if !(1..=WARM_NODES_MAX).contains(&request.nodes) {
        return Err(ApiError::BadRequest(format!(
            "nodes: {} is not 1–{WARM_NODES_MAX}",
            request.nodes
        )));
    }
    // The job's shape as given is checked as any job's is; then, with the dataset as its only
    // one, ranked by the matcher (a node holding it already ranks higher).
    request.job.to_spec(0, caller.account_id, 0, |_| None)?;
    let mut job = request.job;
    job.datasets = vec![request.dataset.clone()];
    crate::reconcile::ensure_view(&state).await?;
    let guard = state.view.lock().await;
    let view = guard
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the fleet view is not built yet".into()))?;
    let now = state.now_us();
    let spec = job.to_spec(0, caller.account_id, now / 1_000_000, |name| view.region(name))?;
    let likely = view
        .matcher
        .likely_nodes(&spec, now / 1_000_000, request.nodes as usize);
    let explanation = if likely.len() < request.nodes as usize {
        let named = view.matcher.explain_naming(&spec, now / 1_000_000, &job.regions);
        format!("{} of {} nodes fit now: {}", likely.len(), request.nodes, named.message)
    } else {
        String::new()
    };
    let nodes: Vec<(i64, bool)> = likely
        .iter()
        .map(|(node, holds)| (view.node_ids[node.index()], *holds))
        .collect();
    // The view is not held while the store writes.
    drop(guard);
    let until_us = now + WARM_FOR_S * 1_000_000;
    let asked: Vec<store::WarmupRow> = nodes
        .iter()
        .filter(|(_, holds)| !holds)
        .map(|(node_id, _)| store::WarmupRow {
            node_id: *node_id,
            digest: request.dataset.digest.trim().to_ascii_lowercase(),
            url: request.dataset.url.clone(),
            size_bytes: i64::try_from(request.dataset.size_bytes).unwrap_or(i64::MAX),
            tenant_id: caller.account_id,
            requested_at: now,
            expires_at: until_us,
        })
        .collect();
    state.store.put_warmups(&asked).await?;
    for warmup in &asked {
        state.warm_hints.add(warmup.node_id);
    }
    Ok(Json(WarmView {
        digest: request.dataset.digest.trim().to_ascii_lowercase(),
        nodes: nodes.iter().map(|(node_id, _)| *node_id).collect(),
        holding: nodes.iter().filter(|(_, holds)| *holds).count() as u64,
        until_us,
        explanation,
    }))
}
