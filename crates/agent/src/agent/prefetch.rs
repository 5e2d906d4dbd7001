//! Datasets staged ahead at the coordinator's word (`fallow dataset warm`): fetched into the
//! node's dataset cache in the background, where a job's replica finds them, and named in the
//! next heartbeats so that data-aware placement sends such jobs here.

use std::sync::Arc;
use std::time::Duration;

use api::DatasetRequest;

use super::Agent;
use crate::exec::Executor;

/// A dataset that could not be staged is not tried again for this long (the coordinator asks
/// with every heartbeat until the warm-up lapses).
pub const PREFETCH_RETRY_AFTER: Duration = Duration::from_secs(600);

impl<E: Executor> Agent<E> {
    /// Starts fetching each dataset asked for that is neither in the cache, nor being fetched,
    /// nor failed lately.
    pub(super) fn prefetch(&mut self, datasets: Vec<DatasetRequest>) {
        self.prefetching.retain(|_, task| !task.is_finished());
        // Nearly every heartbeat asks nothing: no read of the cache's directory for those.
        if datasets.is_empty() {
            return;
        }
        let held = self.datasets.digests();
        for dataset in datasets {
            let digest = dataset.digest.clone();
            let failed_lately = self
                .prefetch_failed
                .lock()
                .expect("prefetch failures lock")
                .get(&digest)
                .is_some_and(|at| at.elapsed() < PREFETCH_RETRY_AFTER);
            if held.contains(&digest) || self.prefetching.contains_key(&digest) || failed_lately {
                continue;
            }
            let (cache, http, failures) = (
                self.datasets.clone(),
                self.http.clone(),
                Arc::clone(&self.prefetch_failed),
            );
            let task = tokio::spawn(async move {
                match cache.fetch(&http, &dataset).await {
                    Ok(_) => tracing::info!(url = %dataset.url, digest = %dataset.digest, "dataset staged ahead"),
                    Err(error) => {
                        tracing::warn!(%error, "a dataset asked to be staged ahead was not");
                        failures
                            .lock()
                            .expect("prefetch failures lock")
                            .insert(dataset.digest.clone(), tokio::time::Instant::now());
                    }
                }
            });
            self.prefetching.insert(digest, task);
        }
    }
}
