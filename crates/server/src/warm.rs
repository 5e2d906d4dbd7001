//! Datasets staged ahead (`fallow dataset warm`): the nodes a job of a given shape would most
//! likely get are asked, with their heartbeats' answers, to fetch a dataset into their caches,
//! until they hold it or the warm-up lapses. Data-aware placement then finds it there.

use api::DatasetRequest;

use crate::error::ApiResult;
use crate::state::AppState;

/// The datasets `node` is asked to stage now, less those its heartbeat says it holds.
pub async fn orders_for(
    state: &AppState,
    node: i64,
    now: i64,
    held: Option<&[String]>,
) -> ApiResult<Vec<DatasetRequest>> {
    if !state.warm_hints.may_have(node, state.store.warm_nodes(now)).await? {
        return Ok(Vec::new());
    }
    let held = held.unwrap_or_default();
    Ok(state
        .store
        .warmups_of_node(node, now)
        .await?
        .into_iter()
        .filter(|warmup| !held.contains(&warmup.digest))
        .map(|warmup| DatasetRequest {
            url: warmup.url,
            digest: warmup.digest,
            size_bytes: u64::try_from(warmup.size_bytes).unwrap_or(0),
        })
        .collect())
}
