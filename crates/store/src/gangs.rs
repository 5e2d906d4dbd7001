//! Gangs: the members of a gang with the addresses and ports its rendezvous needs, a replica's
//! port once it is staged (the start barrier counts them), survivors restarted for a new epoch
//! of the gang's rendezvous, the gangs whose barrier is overdue, and the nodes a job avoids.

use sqlx::Row;

use crate::{LeaseRecord, LeaseState, Result, Store};

/// A live replica of a gang, as its rendezvous needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangMember {
    pub lease_id: i64,
    pub replica: i64,
    pub node_id: i64,
    /// GPUs the replica holds on its node.
    pub gpus: u32,
    pub state: LeaseState,
    pub epoch: i64,
    /// The port its agent reserved, once the replica is staged.
    pub port: Option<i64>,
    /// Where the node's replicas are reached.
    pub advertise_addr: String,
}

/// Node ids from their stored form ("3,17"); anything unreadable is left out.
pub(crate) fn parse_avoid(text: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = text.split(',').filter_map(|id| id.trim().parse().ok()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl Store {
    /// The live replicas of `job_id`, in replica order, with their nodes' advertised addresses.
    pub async fn gang_members(&self, job_id: i64) -> Result<Vec<GangMember>> {
        let rows = sqlx::query(
            "SELECT l.id, l.replica, l.node_id, l.gpu_mask, l.state, l.epoch, l.gang_port, n.advertise_addr \
             FROM leases l JOIN nodes n ON n.id = l.node_id \
             WHERE l.job_id = $1 AND l.state IN ('pending', 'staging', 'running') ORDER BY l.replica, l.id",
        )
        .bind(job_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(GangMember {
                    lease_id: row.try_get("id")?,
                    replica: row.try_get("replica")?,
                    node_id: row.try_get("node_id")?,
                    gpus: row.try_get::<i64, _>("gpu_mask")?.count_ones(),
                    state: crate::rows::decode_lease_state(row.try_get::<&str, _>("state")?)?,
                    epoch: row.try_get("epoch")?,
                    port: row.try_get("gang_port")?,
                    advertise_addr: row.try_get("advertise_addr")?,
                })
            })
            .collect()
    }

    /// Records that a gang replica is staged at `epoch`, with the port its agent reserved.
    /// False when the lease is not live at that epoch.
    pub async fn stage_lease(&self, id: i64, epoch: i64, port: u16) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE leases SET gang_port = $1 WHERE id = $2 AND epoch = $3 AND state IN ('pending', 'staging', 'running')",
        )
        .bind(i64::from(port))
        .bind(id)
        .bind(epoch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records that `job_id`'s gang met its start barrier at `now` (every replica of the epoch
    /// staged); a barrier already met keeps its time.
    pub async fn mark_gang_assembled(&self, job_id: i64, now: i64) -> Result<()> {
        sqlx::query("UPDATE jobs SET gang_assembled_at = $1 WHERE id = $2 AND gang_assembled_at IS NULL")
            .bind(now)
            .bind(job_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Starts a live lease again at a new epoch (pending, not staged): its agent stops the
    /// replica it runs and starts it anew, for a new epoch of its gang's rendezvous. Returns the
    /// lease as it now is, or None when it was not live.
    pub async fn restart_lease(&self, id: i64) -> Result<Option<LeaseRecord>> {
        let done = sqlx::query(
            "UPDATE leases SET epoch = epoch + 1, state = 'pending', gang_port = NULL \
             WHERE id = $1 AND state IN ('pending', 'staging', 'running')",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        self.lease(id).await
    }

    /// A new epoch of `job_id`'s rendezvous and a new start barrier (from `now`); `restart`
    /// counts it as a restart after a failure.
    pub async fn next_gang_epoch(&self, job_id: i64, restart: bool, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE jobs SET gang_epoch = gang_epoch + 1, gang_since = $1, gang_assembled_at = NULL, gang_restarts = gang_restarts + $2 WHERE id = $3",
        )
        .bind(now)
        .bind(i64::from(restart))
        .bind(job_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Running gangs (more than one live replica) whose start barrier began at or before
    /// `before` and still waits for a replica that is not staged.
    pub async fn gangs_assembling_since(&self, before: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT j.id FROM jobs j WHERE j.state = 'running' AND j.gang_since IS NOT NULL AND j.gang_since <= $1 \
             AND (SELECT COUNT(*) FROM leases l WHERE l.job_id = j.id AND l.state IN ('pending', 'staging', 'running')) > 1 \
             AND EXISTS (SELECT 1 FROM leases l WHERE l.job_id = j.id \
                         AND l.state IN ('pending', 'staging') AND l.gang_port IS NULL) \
             ORDER BY j.id",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Adds `node_id` to the nodes `job_id` is not placed on again.
    pub async fn avoid_node(&self, job_id: i64, node_id: i64) -> Result<()> {
        let Some(job) = self.job(job_id).await? else {
            return Ok(());
        };
        let mut avoid = job.avoid_nodes;
        if avoid.contains(&node_id) {
            return Ok(());
        }
        avoid.push(node_id);
        avoid.sort_unstable();
        let text = avoid.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query("UPDATE jobs SET avoid_nodes = $1 WHERE id = $2")
            .bind(text)
            .bind(job_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
