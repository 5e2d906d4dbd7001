//! Signed usage records and attestations (each accepted once), lease events (a job's timeline),
//! evidence of refused requests, reputation inputs, and the market index's price points.

use sqlx::Row;

use crate::accounts::is_unique_violation;
use crate::{
    AttestationRow, EndedLease, EvidenceRow, JobOutputInfo, JobOutputRow, JobUsage, LeaseEvent, LeaseProgress,
    LogChunk, NodeOutcome, PricePoint, Result, RunWait, Store, TierCount, UsageCharge, UsageRow, WarmupRow,
};

fn usage_from(row: &sqlx::any::AnyRow) -> Result<UsageRow> {
    Ok(UsageRow {
        lease_id: row.try_get("lease_id")?,
        sequence: row.try_get("sequence")?,
        node_id: row.try_get("node_id")?,
        gpu_seconds_milli: row.try_get("gpu_seconds_milli")?,
        charged_micros: row.try_get("charged_micros")?,
        body: row.try_get("body")?,
        signature: row.try_get("signature")?,
        received_at: row.try_get("received_at")?,
    })
}

impl Store {
    /// Stores a usage record; false when (lease, sequence) was already stored (a replay or a retry).
    pub async fn insert_usage(&self, usage: &UsageRow) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO usage_records (lease_id, sequence, node_id, gpu_seconds_milli, charged_micros, body, signature, \
             received_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (lease_id, sequence) DO NOTHING",
        )
        .bind(usage.lease_id)
        .bind(usage.sequence)
        .bind(usage.node_id)
        .bind(usage.gpu_seconds_milli)
        .bind(usage.charged_micros)
        .bind(&usage.body)
        .bind(&usage.signature)
        .bind(usage.received_at)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The usage records of a lease, in sequence order.
    pub async fn usage_of_lease(&self, lease_id: i64) -> Result<Vec<UsageRow>> {
        let rows = sqlx::query(
            "SELECT lease_id, sequence, node_id, gpu_seconds_milli, charged_micros, body, signature, received_at \
             FROM usage_records WHERE lease_id = $1 ORDER BY sequence",
        )
        .bind(lease_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(usage_from).collect()
    }

    /// A lease's usage record by its sequence number, if stored.
    pub async fn usage_row(&self, lease_id: i64, sequence: i64) -> Result<Option<UsageRow>> {
        let row = sqlx::query(
            "SELECT lease_id, sequence, node_id, gpu_seconds_milli, charged_micros, body, signature, received_at \
             FROM usage_records WHERE lease_id = $1 AND sequence = $2",
        )
        .bind(lease_id)
        .bind(sequence)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(usage_from).transpose()
    }

    /// GPU-milli-seconds already recorded for a lease.
    pub async fn usage_total(&self, lease_id: i64) -> Result<i64> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(gpu_seconds_milli), 0) AS BIGINT) AS total FROM usage_records WHERE lease_id = $1",
        )
        .bind(lease_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("total")?)
    }

    /// Stores a completion attestation; false when the lease already has one.
    pub async fn insert_attestation(&self, attestation: &AttestationRow) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO attestations (lease_id, epoch, node_id, body, signature, received_at) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (lease_id) DO UPDATE SET epoch = excluded.epoch, node_id = excluded.node_id, \
             body = excluded.body, signature = excluded.signature, received_at = excluded.received_at \
             WHERE attestations.epoch < excluded.epoch",
        )
        .bind(attestation.lease_id)
        .bind(attestation.epoch)
        .bind(attestation.node_id)
        .bind(&attestation.body)
        .bind(&attestation.signature)
        .bind(attestation.received_at)
        .execute(&self.pool)
        .await;
        // A lease started again at a newer epoch (its gang restarted) ends once more: its newest
        // attestation replaces the older one; another at the same epoch is refused.
        match done {
            Ok(done) if done.rows_affected() == 0 => Ok(false),
            Ok(_) => Ok(true),
            Err(error) if is_unique_violation(&error) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    pub async fn attestation(&self, lease_id: i64) -> Result<Option<AttestationRow>> {
        let row = sqlx::query(
            "SELECT lease_id, epoch, node_id, body, signature, received_at FROM attestations WHERE lease_id = $1",
        )
        .bind(lease_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(AttestationRow {
                lease_id: row.try_get("lease_id")?,
                epoch: row.try_get("epoch")?,
                node_id: row.try_get("node_id")?,
                body: row.try_get("body")?,
                signature: row.try_get("signature")?,
                received_at: row.try_get("received_at")?,
            })
        })
        .transpose()
    }

    /// Records a replica's output archive: its bytes when the coordinator keeps them, or only
    /// its attested digest and size. An archive of a newer epoch replaces an older one; one of
    /// the same epoch is kept as it is (true when this one was recorded).
    pub async fn put_job_output(&self, output: &JobOutputRow) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO job_outputs (lease_id, epoch, job_id, replica, digest, size_bytes, archive, received_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (lease_id) DO UPDATE SET epoch = excluded.epoch, digest = excluded.digest, \
             size_bytes = excluded.size_bytes, archive = excluded.archive, received_at = excluded.received_at, \
             expired_at = NULL WHERE job_outputs.epoch < excluded.epoch",
        )
        .bind(output.lease_id)
        .bind(output.epoch)
        .bind(output.job_id)
        .bind(output.replica)
        .bind(&output.digest)
        .bind(output.size_bytes)
        .bind(output.archive.clone())
        .bind(output.received_at)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Asks nodes to stage datasets ahead; asking again for the same dataset on a node renews it.
    pub async fn put_warmups(&self, warmups: &[WarmupRow]) -> Result<()> {
        let mut transaction = self.begin_write().await?;
        for warmup in warmups {
            sqlx::query(
                "INSERT INTO dataset_warmups (node_id, digest, url, size_bytes, tenant_id, requested_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (node_id, digest) DO UPDATE SET url = excluded.url, size_bytes = excluded.size_bytes, \
                 tenant_id = excluded.tenant_id, requested_at = excluded.requested_at, expires_at = excluded.expires_at",
            )
            .bind(warmup.node_id)
            .bind(&warmup.digest)
            .bind(&warmup.url)
            .bind(warmup.size_bytes)
            .bind(warmup.tenant_id)
            .bind(warmup.requested_at)
            .bind(warmup.expires_at)
            .execute(&mut *transaction)
            .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    /// The datasets a node is asked to stage, as of `now`.
    pub async fn warmups_of_node(&self, node_id: i64, now: i64) -> Result<Vec<WarmupRow>> {
        let rows = sqlx::query(
            "SELECT node_id, digest, url, size_bytes, tenant_id, requested_at, expires_at FROM dataset_warmups \
             WHERE node_id = $1 AND expires_at > $2 ORDER BY requested_at, digest",
        )
        .bind(node_id)
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(WarmupRow {
                    node_id: row.try_get("node_id")?,
                    digest: row.try_get("digest")?,
                    url: row.try_get("url")?,
                    size_bytes: row.try_get("size_bytes")?,
                    tenant_id: row.try_get("tenant_id")?,
                    requested_at: row.try_get("requested_at")?,
                    expires_at: row.try_get("expires_at")?,
                })
            })
            .collect()
    }

    /// The nodes asked to stage something, as of `now`.
    pub async fn warm_nodes(&self, now: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query("SELECT DISTINCT node_id FROM dataset_warmups WHERE expires_at > $1")
            .bind(now)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|row| Ok(row.try_get("node_id")?)).collect()
    }

    /// Removes the bytes of kept archives received before `cutoff` (their digest and size
    /// stay, marked expired at `now`); returns how many.
    pub async fn expire_output_archives(&self, cutoff: i64, now: i64) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE job_outputs SET archive = NULL, expired_at = $1 WHERE archive IS NOT NULL AND received_at < $2",
        )
        .bind(now)
        .bind(cutoff)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// A job's output archives without their bytes, by lease.
    pub async fn job_outputs(&self, job_id: i64) -> Result<Vec<JobOutputInfo>> {
        let rows = sqlx::query(
            "SELECT lease_id, replica, digest, size_bytes, expired_at, \
             CAST(CASE WHEN archive IS NULL THEN 0 ELSE 1 END AS BIGINT) AS kept \
             FROM job_outputs WHERE job_id = $1 ORDER BY lease_id",
        )
        .bind(job_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let kept: i64 = row.try_get("kept")?;
                Ok(JobOutputInfo {
                    lease_id: row.try_get("lease_id")?,
                    replica: row.try_get("replica")?,
                    digest: row.try_get("digest")?,
                    size_bytes: row.try_get("size_bytes")?,
                    kept: kept == 1,
                    expired_at: row.try_get("expired_at")?,
                })
            })
            .collect()
    }

    /// The newest archive the coordinator keeps of a job's replica: (digest, bytes).
    pub async fn job_output_archive(&self, job_id: i64, replica: i64) -> Result<Option<(String, Vec<u8>)>> {
        let row = sqlx::query(
            "SELECT digest, archive FROM job_outputs WHERE job_id = $1 AND replica = $2 AND archive IS NOT NULL \
             ORDER BY lease_id DESC LIMIT 1",
        )
        .bind(job_id)
        .bind(replica)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok((row.try_get("digest")?, row.try_get("archive")?)))
            .transpose()
    }

    pub async fn append_lease_event(&self, lease_id: i64, epoch: i64, kind: &str, detail: &str, at: i64) -> Result<()> {
        sqlx::query("INSERT INTO lease_events (lease_id, epoch, kind, detail, at) VALUES ($1, $2, $3, $4, $5)")
            .bind(lease_id)
            .bind(epoch)
            .bind(kind)
            .bind(detail)
            .bind(at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Stores a chunk of a replica's output at `byte_offset` of its log, unless the lease's log
    /// would pass `bytes_max`; false when the chunk was there already or would not fit.
    pub async fn append_lease_log(&self, chunk: &LogChunk, bytes_max: i64) -> Result<bool> {
        let stored = sqlx::query(
            "INSERT INTO lease_logs (lease_id, epoch, byte_offset, text, at) \
             SELECT $1, $2, $3, $4, $5 WHERE (SELECT COALESCE(SUM(LENGTH(text)), 0) FROM lease_logs WHERE lease_id = $1) + $6 <= $7 \
             ON CONFLICT (lease_id, epoch, byte_offset) DO NOTHING",
        )
        .bind(chunk.lease_id)
        .bind(chunk.epoch)
        .bind(chunk.byte_offset)
        .bind(&chunk.text)
        .bind(chunk.at)
        .bind(chunk.text.len() as i64)
        .bind(bytes_max)
        .execute(&self.pool)
        .await?;
        Ok(stored.rows_affected() == 1)
    }

    /// The output of `leases` after chunk `after` (an id), oldest first, at most `limit` chunks.
    pub async fn lease_logs(&self, leases: &[i64], after: i64, limit: i64) -> Result<Vec<LogChunk>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let query = format!(
            "SELECT id, lease_id, epoch, byte_offset, text, at FROM lease_logs WHERE id > $1 AND lease_id IN ({}) \
             ORDER BY id LIMIT $2",
            crate::jobs::placeholders(3, leases.len())
        );
        let mut select = sqlx::query(sqlx::AssertSqlSafe(query)).bind(after).bind(limit);
        for lease in leases {
            select = select.bind(*lease);
        }
        let rows = select.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok(LogChunk {
                    id: row.try_get("id")?,
                    lease_id: row.try_get("lease_id")?,
                    epoch: row.try_get("epoch")?,
                    byte_offset: row.try_get("byte_offset")?,
                    text: row.try_get("text")?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }

    /// Records how much a replica has done in `unit`; a count never goes back.
    pub async fn set_lease_progress(&self, lease_id: i64, unit: &str, done: i64, at: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO lease_progress (lease_id, unit, done, at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (lease_id) DO UPDATE SET unit = excluded.unit, at = excluded.at, \
             done = CASE WHEN lease_progress.unit = excluded.unit AND lease_progress.done > excluded.done \
             THEN lease_progress.done ELSE excluded.done END",
        )
        .bind(lease_id)
        .bind(unit)
        .bind(done)
        .bind(at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The progress of `leases`, by lease id.
    pub async fn lease_progress(&self, leases: &[i64]) -> Result<Vec<LeaseProgress>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let query = format!(
            "SELECT lease_id, unit, done FROM lease_progress WHERE lease_id IN ({}) ORDER BY lease_id",
            crate::jobs::placeholders(1, leases.len())
        );
        let mut select = sqlx::query(sqlx::AssertSqlSafe(query));
        for lease in leases {
            select = select.bind(*lease);
        }
        let rows = select.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok(LeaseProgress {
                    lease_id: row.try_get("lease_id")?,
                    unit: row.try_get("unit")?,
                    done: row.try_get("done")?,
                })
            })
            .collect()
    }

    pub async fn lease_events(&self, lease_id: i64) -> Result<Vec<LeaseEvent>> {
        let rows = sqlx::query(
            "SELECT id, lease_id, epoch, kind, detail, at FROM lease_events WHERE lease_id = $1 ORDER BY id",
        )
        .bind(lease_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(LeaseEvent {
                    id: row.try_get("id")?,
                    lease_id: row.try_get("lease_id")?,
                    epoch: row.try_get("epoch")?,
                    kind: row.try_get("kind")?,
                    detail: row.try_get("detail")?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }

    /// Records evidence (a forged signature, a replay, a report for a lease the node does not hold).
    /// Returns the evidence's id.
    pub async fn record_evidence(&self, node_id: Option<i64>, kind: &str, detail: &str, at: i64) -> Result<i64> {
        let row = sqlx::query("INSERT INTO evidence (node_id, kind, detail, at) VALUES ($1, $2, $3, $4) RETURNING id")
            .bind(node_id)
            .bind(kind)
            .bind(detail)
            .bind(at)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get("id")?)
    }

    pub async fn evidence(&self, node_id: Option<i64>, limit: i64) -> Result<Vec<EvidenceRow>> {
        let rows =
            match node_id {
                Some(node) => sqlx::query(
                    "SELECT id, node_id, kind, detail, at FROM evidence WHERE node_id = $1 ORDER BY id DESC LIMIT $2",
                )
                .bind(node)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?,
                None => {
                    sqlx::query("SELECT id, node_id, kind, detail, at FROM evidence ORDER BY id DESC LIMIT $1")
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?
                }
            };
        rows.iter()
            .map(|row| {
                Ok(EvidenceRow {
                    id: row.try_get("id")?,
                    node_id: row.try_get("node_id")?,
                    kind: row.try_get("kind")?,
                    detail: row.try_get("detail")?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }

    /// Records one reputation outcome for a node ("ok", "node_fault", "canary_passed"…), of
    /// weight one.
    pub async fn record_outcome(&self, node_id: i64, outcome: &str, at: i64) -> Result<()> {
        self.record_outcomes(&[(node_id, outcome.to_string(), 1000, at)]).await
    }

    /// Records reputation outcomes (node, outcome, weight in thousandths, at) in one transaction.
    pub async fn record_outcomes(&self, outcomes: &[(i64, String, i64, i64)]) -> Result<()> {
        if outcomes.is_empty() {
            return Ok(());
        }
        let mut db = self.begin_write().await?;
        for (node_id, outcome, weight_milli, at) in outcomes {
            sqlx::query("INSERT INTO reputation_events (node_id, outcome, weight_milli, at) VALUES ($1, $2, $3, $4)")
                .bind(node_id)
                .bind(outcome)
                .bind(weight_milli)
                .bind(at)
                .execute(&mut *db)
                .await?;
        }
        db.commit().await?;
        Ok(())
    }

    /// A node's outcomes since `since`, oldest first.
    pub async fn outcomes(&self, node_id: i64, since: i64) -> Result<Vec<NodeOutcome>> {
        let rows = sqlx::query(
            "SELECT outcome, weight_milli, at FROM reputation_events WHERE node_id = $1 AND at >= $2 ORDER BY id",
        )
        .bind(node_id)
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(NodeOutcome {
                    outcome: row.try_get("outcome")?,
                    weight_milli: row.try_get("weight_milli")?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }

    /// Clearing prices of the leases granted since `since`, oldest first: the market index.
    pub async fn price_points(&self, since: i64, limit: i64) -> Result<Vec<PricePoint>> {
        let rows = sqlx::query(
            "SELECT created_at, gpu_model, region, tier, price_micros, gpu_mask, gpu_milli FROM leases \
             WHERE created_at >= $1 ORDER BY created_at, id LIMIT $2",
        )
        .bind(since)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let mask: i64 = row.try_get("gpu_mask")?;
                let milli: i64 = row.try_get("gpu_milli")?;
                Ok(PricePoint {
                    at: row.try_get("created_at")?,
                    gpu_model: row.try_get("gpu_model")?,
                    region: row.try_get("region")?,
                    tier: row.try_get("tier")?,
                    price_micros: row.try_get("price_micros")?,
                    gpu_milli_total: i64::from(mask.count_ones() as u16) * milli,
                })
            })
            .collect()
    }
}

impl Store {
    /// Leases that ended at or after `since` (µs), oldest first: how the reconcile leader
    /// learns of ends reported to other replicas.
    pub async fn leases_ended_since(&self, since: i64) -> Result<Vec<EndedLease>> {
        let rows = sqlx::query("SELECT id, ended_at FROM leases WHERE ended_at >= $1 ORDER BY ended_at, id")
            .bind(since)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(EndedLease {
                    lease_id: row.try_get("id")?,
                    ended_at: row.try_get("ended_at")?,
                })
            })
            .collect()
    }
}

/// Reads for the coordinator's dashboard: usage summed per job and over time, the queue per
/// tier, and how long jobs waited for their first lease.
impl Store {
    /// What the usage records of each of `jobs` were charged, and the GPU time they metered, by
    /// job id; a job without usage is absent.
    pub async fn usage_totals_of_jobs(&self, jobs: &[i64]) -> Result<Vec<JobUsage>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let query = format!(
            "SELECT l.job_id, CAST(SUM(u.charged_micros) AS BIGINT) AS charged, \
             CAST(SUM(u.gpu_seconds_milli) AS BIGINT) AS metered \
             FROM usage_records u JOIN leases l ON l.id = u.lease_id \
             WHERE l.job_id IN ({}) GROUP BY l.job_id ORDER BY l.job_id",
            crate::jobs::placeholders(1, jobs.len())
        );
        let mut select = sqlx::query(sqlx::AssertSqlSafe(query));
        for job in jobs {
            select = select.bind(*job);
        }
        let rows = select.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok(JobUsage {
                    job_id: row.try_get("job_id")?,
                    charged_micros: row.try_get("charged")?,
                    gpu_seconds_milli: row.try_get("metered")?,
                })
            })
            .collect()
    }

    /// A tenant's usage records received at or after `since`, oldest first, at most `limit`.
    pub async fn usage_of_tenant_since(&self, tenant: i64, since: i64, limit: i64) -> Result<Vec<UsageCharge>> {
        let rows = sqlx::query(
            "SELECT u.received_at, l.job_id, u.charged_micros, u.gpu_seconds_milli FROM usage_records u \
             JOIN leases l ON l.id = u.lease_id JOIN jobs j ON j.id = l.job_id \
             WHERE j.tenant_id = $1 AND u.received_at >= $2 \
             ORDER BY u.received_at, u.lease_id, u.sequence LIMIT $3",
        )
        .bind(tenant)
        .bind(since)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(UsageCharge {
                    received_at: row.try_get("received_at")?,
                    job_id: row.try_get("job_id")?,
                    charged_micros: row.try_get("charged_micros")?,
                    gpu_seconds_milli: row.try_get("gpu_seconds_milli")?,
                })
            })
            .collect()
    }

    /// Jobs waiting for placement now, per tier, by tier.
    pub async fn queued_per_tier(&self) -> Result<Vec<TierCount>> {
        let rows =
            sqlx::query("SELECT tier, COUNT(*) AS count FROM jobs WHERE state = 'queued' GROUP BY tier ORDER BY tier")
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|row| {
                Ok(TierCount {
                    tier: row.try_get("tier")?,
                    jobs: row.try_get("count")?,
                })
            })
            .collect()
    }

    /// Jobs submitted at or after `since`, oldest first, at most `limit`, with when a replica of
    /// each first ran, if one did. A wait ends at the first run, not at the first lease: a lease
    /// granted by preemption waits out its victim's grace period.
    pub async fn run_waits_since(&self, since: i64, limit: i64) -> Result<Vec<RunWait>> {
        let rows = sqlx::query(
            "SELECT j.tier, j.submitted_at, MIN(e.at) AS placed_at FROM jobs j \
             LEFT JOIN leases l ON l.job_id = j.id \
             LEFT JOIN lease_events e ON e.lease_id = l.id AND e.kind = 'running' WHERE j.submitted_at >= $1 \
             GROUP BY j.id, j.tier, j.submitted_at ORDER BY j.id LIMIT $2",
        )
        .bind(since)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(RunWait {
                    tier: row.try_get("tier")?,
                    submitted_at: row.try_get("submitted_at")?,
                    first_run_at: row.try_get("placed_at")?,
                })
            })
            .collect()
    }
}
