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
    /// The running replicas of `tenant_id`'s running jobs that serve `name`,
    /// by lease id. `name` is letters, digits and `-` (the API checks it), and a job's spec is
    /// the API's own serialisation of its request, so the spec's text names it exactly so.
    pub async fn serving_leases(&self, tenant_id: i64, name: &str) -> Result<Vec<ServingLease>> {
        let pattern = format!("%\"serve\":{{\"name\":\"{name}\",%");
        let rows = sqlx::query(
            "SELECT l.id, l.node_id, n.region, j.tier FROM leases l JOIN jobs j ON j.id = l.job_id \
             JOIN nodes n ON n.id = l.node_id \
             WHERE j.tenant_id = $1 AND j.state = 'running' AND l.state = 'running' AND j.spec LIKE $2 \
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
