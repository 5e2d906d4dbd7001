//! Serving replicas: the running leases of a tenant's jobs that serve a named service through
//! the gateway (their spec's `serve.name`).

use sqlx::Row;

use crate::{Result, Store};

/// A running replica that serves, with what the gateway routes by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingLease {
    pub lease_id: i64,
    pub node_id: i64,
    /// Its node's region.
    pub region: String,
    /// Its job's tier (gold, silver, bronze).
    pub tier: String,
}

impl Store {
    /// The ready replicas of `tenant_id`'s running jobs that serve `name`, by lease id: running,
    /// their health check answered once (`ready_at`), and not draining before a preemption.
    pub async fn serving_leases(&self, tenant_id: i64, name: &str) -> Result<Vec<ServingLease>> {
        let pattern = crate::services::serving_pattern(name);
        let rows = sqlx::query(
            "SELECT l.id, l.node_id, n.region, j.tier FROM leases l JOIN jobs j ON j.id = l.job_id \
             JOIN nodes n ON n.id = l.node_id \
             WHERE j.tenant_id = $1 AND j.state = 'running' AND l.state = 'running' AND l.ready_at IS NOT NULL \
             AND l.preempt_at IS NULL AND j.spec LIKE $2 \
             ORDER BY l.id",
        )
        .bind(tenant_id)
        .bind(pattern)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ServingLease {
                    lease_id: row.try_get("id")?,
                    node_id: row.try_get("node_id")?,
                    region: row.try_get("region")?,
                    tier: row.try_get("tier")?,
                })
            })
            .collect()
    }
}
