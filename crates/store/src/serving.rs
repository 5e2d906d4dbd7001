//! Serving replicas: the running leases of a tenant's jobs that serve a named service through
//! the gateway (their spec's `serve.name`).

use sqlx::Row;

use crate::{Result, Store};

impl Store {
    /// The running replicas (lease id, node id) of `tenant_id`'s running jobs that serve `name`,
    /// by lease id. `name` is letters, digits and `-` (the API checks it), and a job's spec is
    /// the API's own serialisation of its request, so the spec's text names it exactly so.
    pub async fn serving_leases(&self, tenant_id: i64, name: &str) -> Result<Vec<(i64, i64)>> {
        let pattern = format!("%\"serve\":{{\"name\":\"{name}\",%");
        let rows = sqlx::query(
            "SELECT l.id, l.node_id FROM leases l JOIN jobs j ON j.id = l.job_id \
             WHERE j.tenant_id = $1 AND j.state = 'running' AND l.state = 'running' AND j.spec LIKE $2 \
             ORDER BY l.id",
        )
        .bind(tenant_id)
        .bind(pattern)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("id")?, row.try_get("node_id")?)))
            .collect()
    }
}
