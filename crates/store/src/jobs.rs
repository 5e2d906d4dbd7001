//! Jobs and leases: submission (idempotent, batched), placement commits that move a job and
//! insert its leases in one transaction, lease state changes fenced by epoch, and the loss of a
//! silent node's leases (epoch bumped, job requeued).

use std::collections::HashMap;

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::accounts::is_unique_violation;
use crate::{
    JobCount, JobRecord, JobState, LeaseMove, LeaseRecord, LeaseState, LedgerTransactionRow, LiveLeaseTotals, NewJob,
    NewLease, Overbooking, Result, Store, StoreError, Victim,
};

const JOB_COLUMNS: &str = "id, tenant_id, client_token, spec, tier, state, state_reason, submitted_at, updated_at, gang_epoch, gang_since, avoid_nodes, gang_restarts, gang_assembled_at";
/// Which of a tenant's jobs a listing shows (`Store::jobs_of_tenant_where`).
#[derive(Clone, Copy, Debug, Default)]
pub struct JobsWhere {
    /// Only ids below this one (the next page).
    pub before: Option<i64>,
    pub limit: i64,
    pub state: Option<JobState>,
    /// Only jobs submitted at or after this time (µs).
    pub since_us: Option<i64>,
}

const LEASE_COLUMNS: &str = "id, job_id, replica, node_id, gpu_mask, gpu_milli, cpu_milli, memory_mib, epoch, \
    price_micros, state, tier, gpu_model, region, created_at, expected_end, preempt_at, ended_at, end_reason, preempted_by";

fn job_from(row: &AnyRow) -> Result<JobRecord> {
    Ok(JobRecord {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        client_token: row.try_get("client_token")?,
        spec: row.try_get("spec")?,
        tier: row.try_get("tier")?,
        state: JobState::decode(row.try_get::<&str, _>("state")?)?,
        state_reason: row.try_get("state_reason")?,
        submitted_at: row.try_get("submitted_at")?,
        updated_at: row.try_get("updated_at")?,
        gang_epoch: row.try_get("gang_epoch")?,
        gang_since: row.try_get("gang_since")?,
        avoid_nodes: crate::gangs::parse_avoid(row.try_get::<&str, _>("avoid_nodes")?),
        gang_restarts: row.try_get("gang_restarts")?,
        gang_assembled_at: row.try_get("gang_assembled_at")?,
    })
}

fn lease_from(row: &AnyRow) -> Result<LeaseRecord> {
    Ok(LeaseRecord {
        id: row.try_get("id")?,
        job_id: row.try_get("job_id")?,
        lease: NewLease {
            replica: row.try_get("replica")?,
            node_id: row.try_get("node_id")?,
            gpu_mask: row.try_get("gpu_mask")?,
            gpu_milli: row.try_get("gpu_milli")?,
            cpu_milli: row.try_get("cpu_milli")?,
            memory_mib: row.try_get("memory_mib")?,
            price_micros: row.try_get("price_micros")?,
            tier: row.try_get("tier")?,
            gpu_model: row.try_get("gpu_model")?,
            region: row.try_get("region")?,
            expected_end: row.try_get("expected_end")?,
            preempt_at: row.try_get("preempt_at")?,
        },
        epoch: row.try_get("epoch")?,
        state: crate::rows::decode_lease_state(row.try_get::<&str, _>("state")?)?,
        created_at: row.try_get("created_at")?,
        ended_at: row.try_get("ended_at")?,
        end_reason: row.try_get("end_reason")?,
        preempted_by: row.try_get("preempted_by")?,
    })
}

pub(crate) fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store {
    /// Inserts jobs in one transaction (group commit) and returns them in order. A job whose
    /// tenant already used its client token comes back as the job first submitted with it.
    pub async fn insert_jobs(&self, jobs: &[NewJob]) -> Result<Vec<JobRecord>> {
        let mut out = Vec::with_capacity(jobs.len());
        if jobs.is_empty() {
            return Ok(out);
        }
        let mut transaction = self.begin_write().await?;
        for job in jobs {
            // The write comes first. On SQLite a transaction that reads before it writes fails
            // at once ("database is locked") when another connection committed in between; on
            // PostgreSQL, ON CONFLICT waits for a concurrent insert of the same token instead
            // of failing the whole batch.
            let inserted = sqlx::query(
                "INSERT INTO jobs (tenant_id, client_token, spec, tier, state, state_reason, submitted_at, updated_at, \
                 reservation_id) VALUES ($1, $2, $3, $4, 'queued', '', $5, $5, $6) \
                 ON CONFLICT (tenant_id, client_token) DO NOTHING RETURNING id",
            )
            .bind(job.tenant_id)
            .bind(job.client_token.as_deref())
            .bind(&job.spec)
            .bind(&job.tier)
            .bind(job.submitted_at)
            .bind(job.reservation_id)
            .fetch_optional(&mut *transaction)
            .await
            .map_err(|error| {
                if is_unique_violation(&error) {
                    StoreError::Conflict("a job with this client token".to_string())
                } else {
                    error.into()
                }
            })?;
            let Some(row) = inserted else {
                // The tenant used this token before: the job first submitted with it.
                let query = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE tenant_id = $1 AND client_token = $2");
                let existing = sqlx::query(sqlx::AssertSqlSafe(query))
                    .bind(job.tenant_id)
                    .bind(job.client_token.as_deref())
                    .fetch_optional(&mut *transaction)
                    .await?
                    .ok_or_else(|| StoreError::Conflict("a job with this client token".to_string()))?;
                out.push(job_from(&existing)?);
                continue;
            };
            out.push(JobRecord {
                id: row.try_get("id")?,
                tenant_id: job.tenant_id,
                client_token: job.client_token.clone(),
                spec: job.spec.clone(),
                tier: job.tier.clone(),
                state: JobState::Queued,
                state_reason: String::new(),
                submitted_at: job.submitted_at,
                updated_at: job.submitted_at,
                gang_epoch: 0,
                gang_since: None,
                avoid_nodes: Vec::new(),
                gang_restarts: 0,
                gang_assembled_at: None,
            });
        }
        transaction.commit().await?;
        Ok(out)
    }

    /// The jobs that run inside a reservation, in the given states, oldest first.
    pub async fn jobs_of_reservation(&self, reservation_id: i64, states: &[JobState]) -> Result<Vec<JobRecord>> {
        let query = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE reservation_id = $1 AND state IN ({}) ORDER BY id",
            placeholders(2, states.len())
        );
        let mut select = sqlx::query(sqlx::AssertSqlSafe(query)).bind(reservation_id);
        for state in states {
            select = select.bind(state.as_str());
        }
        let rows = select.fetch_all(&self.pool).await?;
        rows.iter().map(job_from).collect()
    }

    pub async fn job(&self, id: i64) -> Result<Option<JobRecord>> {
        let query = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_from).transpose()
    }

    /// A tenant's jobs, newest first, at most `limit`, with ids below `before` when given.
    pub async fn jobs_of_tenant(&self, tenant_id: i64, before: Option<i64>, limit: i64) -> Result<Vec<JobRecord>> {
        self.jobs_of_tenant_where(
            tenant_id,
            &JobsWhere {
                before,
                limit,
                ..JobsWhere::default()
            },
        )
        .await
    }

    /// A tenant's jobs, newest first, that `filter` admits.
    pub async fn jobs_of_tenant_where(&self, tenant_id: i64, filter: &JobsWhere) -> Result<Vec<JobRecord>> {
        // Placeholders numbered in the order they appear (SQLite numbers `$N` that way).
        let (state, limit) = if filter.state.is_some() {
            (" AND state = $4", "$5")
        } else {
            ("", "$4")
        };
        let query = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant_id = $1 AND id < $2 AND submitted_at >= $3{state} \
             ORDER BY id DESC LIMIT {limit}"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(tenant_id)
            .bind(filter.before.unwrap_or(i64::MAX))
            .bind(filter.since_us.unwrap_or(i64::MIN));
        if let Some(state) = filter.state {
            query = query.bind(state.as_str());
        }
        let rows = query.bind(filter.limit).fetch_all(&self.pool).await?;
        rows.iter().map(job_from).collect()
    }

    /// Jobs in the given states, oldest first.
    pub async fn jobs_in_states(&self, states: &[JobState]) -> Result<Vec<JobRecord>> {
        let query = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ({}) ORDER BY id",
            placeholders(1, states.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(query));
        for state in states {
            query = query.bind(state.as_str());
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(job_from).collect()
    }

    /// Counts jobs per state.
    pub async fn job_counts(&self) -> Result<Vec<JobCount>> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS count FROM jobs GROUP BY state ORDER BY state")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(JobCount {
                    state: JobState::decode(row.try_get::<&str, _>("state")?)?,
                    jobs: row.try_get("count")?,
                })
            })
            .collect()
    }

    /// Moves a job to `to` if it is in one of `from`; false when it was not (someone else moved it).
    pub async fn set_job_state(
        &self,
        id: i64,
        from: &[JobState],
        to: JobState,
        reason: &str,
        now: i64,
    ) -> Result<bool> {
        let query = format!(
            "UPDATE jobs SET state = $1, state_reason = $2, updated_at = $3 WHERE id = $4 AND state IN ({})",
            placeholders(5, from.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(to.as_str())
            .bind(reason)
            .bind(now)
            .bind(id);
        for state in from {
            query = query.bind(state.as_str());
        }
        Ok(query.execute(&self.pool).await?.rows_affected() == 1)
    }

    /// Sets why queued jobs still wait, in one transaction; a job no longer queued is left alone.
    pub async fn set_queued_reasons(&self, reasons: &[(i64, String)], now: i64) -> Result<()> {
        if reasons.is_empty() {
            return Ok(());
        }
        let mut transaction = self.begin_write().await?;
        for (id, reason) in reasons {
            sqlx::query("UPDATE jobs SET state_reason = $1, updated_at = $2 WHERE id = $3 AND state = 'queued'")
                .bind(reason)
                .bind(now)
                .bind(id)
                .execute(&mut *transaction)
                .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    /// Commits a placement: the job goes from queued to running and its leases are inserted
    /// with epoch 1, in one transaction. `Ok(None)` when the job was no longer queued (it was
    /// cancelled meanwhile): nothing is written.
    pub async fn commit_placement(
        &self,
        job_id: i64,
        leases: &[NewLease],
        now: i64,
    ) -> Result<Option<Vec<LeaseRecord>>> {
        let mut transaction = self.begin_write().await?;
        let moved = sqlx::query(
            "UPDATE jobs SET state = 'running', state_reason = '', updated_at = $1, gang_epoch = gang_epoch + 1, \
                 gang_since = $1, gang_assembled_at = NULL WHERE id = $2 AND state = 'queued'",
        )
        .bind(now)
        .bind(job_id)
        .execute(&mut *transaction)
        .await?;
        if moved.rows_affected() != 1 {
            transaction.rollback().await?;
            return Ok(None);
        }
        let out = insert_job_leases(&mut transaction, job_id, leases, now).await?;
        transaction.commit().await?;
        Ok(Some(out))
    }

    /// Adds leases to a running job (gang repair), in one transaction.
    pub async fn add_leases(
        &self,
        job_id: i64,
        leases: &[NewLease],
        victims: &[Victim],
        now: i64,
        fence: i64,
    ) -> Result<Vec<LeaseRecord>> {
        let mut transaction = self.begin_write().await?;
        check_fence(&mut transaction, fence).await?;
        mark_victims(&mut transaction, job_id, victims).await?;
        // A repaired gang meets again: a new epoch of its rendezvous, and a new start barrier.
        sqlx::query(
            "UPDATE jobs SET gang_epoch = gang_epoch + 1, gang_since = $1, gang_assembled_at = NULL WHERE id = $2",
        )
        .bind(now)
        .bind(job_id)
        .execute(&mut *transaction)
        .await?;
        let out = insert_job_leases(&mut transaction, job_id, leases, now).await?;
        transaction.commit().await?;
        Ok(out)
    }

    pub async fn lease(&self, id: i64) -> Result<Option<LeaseRecord>> {
        let query = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(lease_from).transpose()
    }

    /// Every live lease (pending, staging, running), in id order: with the nodes, what the
    /// matcher is rebuilt from.
    pub async fn live_leases(&self) -> Result<Vec<LeaseRecord>> {
        let query =
            format!("SELECT {LEASE_COLUMNS} FROM leases WHERE state IN ('pending', 'staging', 'running') ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query)).fetch_all(&self.pool).await?;
        rows.iter().map(lease_from).collect()
    }

    /// The live leases that job `job_id`'s placement preempted, still in their grace period.
    pub async fn live_victims_of(&self, job_id: i64) -> Result<Vec<LeaseRecord>> {
        let query = format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE preempted_by = $1 \
             AND state IN ('pending', 'staging', 'running') ORDER BY id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(job_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(lease_from).collect()
    }

    pub async fn leases_of_job(&self, job_id: i64) -> Result<Vec<LeaseRecord>> {
        let query = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE job_id = $1 ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(job_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(lease_from).collect()
    }

    /// A node's live leases, in id order: what its agent should be running.
    pub async fn live_leases_of_node(&self, node_id: i64) -> Result<Vec<LeaseRecord>> {
        let query = format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE node_id = $1 AND state IN ('pending', 'staging', 'running') ORDER BY id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(node_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(lease_from).collect()
    }

    /// Moves a live lease forward to `to`, only at its current `epoch` (fencing: a report for an
    /// older epoch changes nothing) and never back (pending → staging → running → an end): a
    /// report of a state the lease is already in or past changes nothing and says so. Ending a
    /// lease stamps `ended_at`.
    pub async fn move_lease(&self, id: i64, epoch: i64, to: LeaseState, reason: &str, now: i64) -> Result<LeaseMove> {
        let ended_at = if to.is_live() { None } else { Some(now) };
        let from: &[&str] = match to {
            LeaseState::Pending => &[],
            LeaseState::Staging => &["pending"],
            LeaseState::Running => &["pending", "staging"],
            _ => &["pending", "staging", "running"],
        };
        if !from.is_empty() {
            let query = format!(
                "UPDATE leases SET state = $1, end_reason = $2, ended_at = $3 \
                 WHERE id = $4 AND epoch = $5 AND state IN ({})",
                placeholders(6, from.len())
            );
            let mut update = sqlx::query(sqlx::AssertSqlSafe(query))
                .bind(to.as_str())
                .bind(reason)
                .bind(ended_at)
                .bind(id)
                .bind(epoch);
            for state in from {
                update = update.bind(*state);
            }
            if update.execute(&self.pool).await?.rows_affected() == 1 {
                return Ok(LeaseMove::Moved);
            }
        }
        let live = sqlx::query(
            "SELECT 1 AS live FROM leases WHERE id = $1 AND epoch = $2 AND state IN ('pending', 'staging', 'running')",
        )
        .bind(id)
        .bind(epoch)
        .fetch_optional(&self.pool)
        .await?;
        Ok(if live.is_some() && to.is_live() {
            LeaseMove::Already
        } else {
            LeaseMove::NotLive
        })
    }

    /// Ends a live lease whatever its epoch, bumping the epoch so that an agent still holding
    /// the old one is fenced off. Returns the lease as it now is, or None if it was not live.
    pub async fn end_lease(&self, id: i64, to: LeaseState, reason: &str, now: i64) -> Result<Option<LeaseRecord>> {
        let query = format!(
            "UPDATE leases SET state = $1, end_reason = $2, ended_at = $3, epoch = epoch + 1 \
             WHERE id = $4 AND state IN ('pending', 'staging', 'running') RETURNING {LEASE_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(to.as_str())
            .bind(reason)
            .bind(now)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(lease_from).transpose()
    }

    /// Sets (or clears) when a bronze lease is to be preempted.
    pub async fn set_lease_preempt_at(&self, id: i64, preempt_at: Option<i64>) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE leases SET preempt_at = $1 WHERE id = $2 AND state IN ('pending', 'staging', 'running')",
        )
        .bind(preempt_at)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Counts live leases and the GPUs (thousandths) they hold.
    pub async fn live_lease_totals(&self) -> Result<LiveLeaseTotals> {
        let rows =
            sqlx::query("SELECT gpu_mask, gpu_milli FROM leases WHERE state IN ('pending', 'staging', 'running')")
                .fetch_all(&self.pool)
                .await?;
        let mut milli = 0i64;
        for row in &rows {
            let mask: i64 = row.try_get("gpu_mask")?;
            let share: i64 = row.try_get("gpu_milli")?;
            milli += i64::from(mask.count_ones() as u16) * share;
        }
        Ok(LiveLeaseTotals {
            leases: rows.len() as i64,
            gpu_milli: milli,
        })
    }
}

/// Inserts `leases` of job `job_id`; their records in the order given.
async fn insert_job_leases(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    job_id: i64,
    leases: &[NewLease],
    now: i64,
) -> Result<Vec<LeaseRecord>> {
    let pairs: Vec<(i64, &NewLease)> = leases.iter().map(|lease| (job_id, lease)).collect();
    let mut ids = insert_leases(transaction, &pairs, now).await?;
    leases
        .iter()
        .map(|lease| take_lease_record(&mut ids, job_id, lease, now))
        .collect()
}

/// The record of `lease` of job `job_id` whose id `insert_leases` gave, taken from `ids`.
fn take_lease_record(
    ids: &mut HashMap<(i64, i64), i64>,
    job_id: i64,
    lease: &NewLease,
    now: i64,
) -> Result<LeaseRecord> {
    let id = ids
        .remove(&(job_id, lease.replica))
        .ok_or_else(|| StoreError::Refused(format!("job {job_id} has replica {} twice", lease.replica)))?;
    Ok(new_lease_record(id, job_id, lease, now))
}

/// Inserts `leases` (job, lease) pending at epoch 1, a multi-row statement per
/// `ROWS_PER_STATEMENT_MAX`; their ids by (job, replica).
async fn insert_leases(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    leases: &[(i64, &NewLease)],
    now: i64,
) -> Result<HashMap<(i64, i64), i64>> {
    let mut ids = HashMap::with_capacity(leases.len());
    for chunk in leases.chunks(crate::ledger::ROWS_PER_STATEMENT_MAX) {
        let values = crate::values_rows(chunk.len(), &[""; 17]);
        let query = format!(
            "INSERT INTO leases (job_id, replica, node_id, gpu_mask, gpu_milli, cpu_milli, memory_mib, epoch, \
             price_micros, state, tier, gpu_model, region, created_at, expected_end, preempt_at, end_reason) \
             VALUES {values} RETURNING id, job_id, replica"
        );
        let mut insert = sqlx::query(sqlx::AssertSqlSafe(query));
        for (job_id, lease) in chunk {
            insert = insert
                .bind(*job_id)
                .bind(lease.replica)
                .bind(lease.node_id)
                .bind(lease.gpu_mask)
                .bind(lease.gpu_milli)
                .bind(lease.cpu_milli)
                .bind(lease.memory_mib)
                .bind(1i64)
                .bind(lease.price_micros)
                .bind(LeaseState::Pending.as_str())
                .bind(&lease.tier)
                .bind(&lease.gpu_model)
                .bind(&lease.region)
                .bind(now)
                .bind(lease.expected_end)
                .bind(lease.preempt_at)
                .bind("");
        }
        for row in insert.fetch_all(&mut **transaction).await? {
            ids.insert((row.try_get("job_id")?, row.try_get("replica")?), row.try_get("id")?);
        }
    }
    Ok(ids)
}

fn new_lease_record(id: i64, job_id: i64, lease: &NewLease, now: i64) -> LeaseRecord {
    LeaseRecord {
        id,
        job_id,
        lease: lease.clone(),
        epoch: 1,
        state: LeaseState::Pending,
        created_at: now,
        ended_at: None,
        end_reason: String::new(),
        preempted_by: None,
    }
}

/// One placement to commit: the job's leases and, if money must be held, the escrow hold
/// (a ledger transaction with its floors), written together or not at all.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementWrite {
    pub job_id: i64,
    pub leases: Vec<NewLease>,
    pub hold: Option<(LedgerTransactionRow, Vec<i64>)>,
    /// Live leases of other jobs this placement preempts: marked in the same transaction, so
    /// a victim is marked exactly when its preemptor's leases exist.
    pub victims: Vec<Victim>,
}

/// Marks `victims` as preempted by `by` (their grace ends at their `preempt_at`); a victim that
/// ended meanwhile is left as it is.
async fn mark_victims(transaction: &mut sqlx::Transaction<'_, sqlx::Any>, by: i64, victims: &[Victim]) -> Result<()> {
    for victim in victims {
        sqlx::query(
            "UPDATE leases SET preempt_at = $1, preempted_by = $2 \
             WHERE id = $3 AND state IN ('pending', 'staging', 'running')",
        )
        .bind(victim.preempt_at)
        .bind(by)
        .bind(victim.lease_id)
        .execute(&mut **transaction)
        .await?;
    }
    Ok(())
}

/// How a job ends: its state, the state its live leases end in, and the release of its escrow.
#[derive(Clone, Debug, PartialEq)]
pub struct JobEnd {
    pub job_id: i64,
    pub from: Vec<JobState>,
    pub to: JobState,
    pub reason: String,
    pub leases_to: LeaseState,
    pub release: Option<(LedgerTransactionRow, Vec<i64>)>,
}

impl Store {
    /// Commits many placements in one transaction (group commit). For each, the leases, or
    /// None when the job was no longer queued. A hold the ledger refuses fails the whole batch
    /// (nothing is written), so the caller checks balances first.
    ///
    /// A few statements for the whole batch (the jobs moved, the holds, the victims, the leases),
    /// not several a placement: each statement is a round trip to SQLite's thread, and with both
    /// cores busy a round trip waited milliseconds for the CPU (12–15 ms a placement at 1,000
    /// submissions a second; docs/decisions.md, "Placements in a few statements").
    pub async fn commit_placements(
        &self,
        batch: &[PlacementWrite],
        now: i64,
        fence: i64,
    ) -> Result<Vec<Option<Vec<LeaseRecord>>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut transaction = self.begin_write().await?;
        check_fence(&mut transaction, fence).await?;
        let mut moved = std::collections::HashSet::new();
        for chunk in batch.chunks(crate::ledger::ROWS_PER_STATEMENT_MAX) {
            let query = format!(
                "UPDATE jobs SET state = 'running', state_reason = '', updated_at = $1, gang_epoch = gang_epoch + 1, \
                 gang_since = $1, gang_assembled_at = NULL WHERE id IN ({}) AND state = 'queued' RETURNING id",
                placeholders(2, chunk.len())
            );
            let mut update = sqlx::query(sqlx::AssertSqlSafe(query)).bind(now);
            for write in chunk {
                update = update.bind(write.job_id);
            }
            for row in update.fetch_all(&mut *transaction).await? {
                moved.insert(row.try_get::<i64, _>("id")?);
            }
        }
        // A job twice in a batch is placed once: its first placement.
        let mut seen = std::collections::HashSet::new();
        let placed: Vec<&PlacementWrite> = batch
            .iter()
            .filter(|write| moved.contains(&write.job_id) && seen.insert(write.job_id))
            .collect();
        // A requeued job's escrow is still held from its first placement: its key is not new,
        // and nothing more is held.
        let holds: Vec<(&LedgerTransactionRow, &[i64])> = placed
            .iter()
            .filter_map(|write| write.hold.as_ref().map(|(hold, floors)| (hold, floors.as_slice())))
            .collect();
        crate::ledger::apply_ledger_many_in(&mut transaction, &holds).await?;
        for write in &placed {
            mark_victims(&mut transaction, write.job_id, &write.victims).await?;
        }
        let leases: Vec<(i64, &NewLease)> = placed
            .iter()
            .flat_map(|write| write.leases.iter().map(|lease| (write.job_id, lease)))
            .collect();
        let mut ids = insert_leases(&mut transaction, &leases, now).await?;
        let mut records: HashMap<i64, Vec<LeaseRecord>> = HashMap::new();
        for (job_id, lease) in leases {
            let record = take_lease_record(&mut ids, job_id, lease, now)?;
            records.entry(job_id).or_default().push(record);
        }
        transaction.commit().await?;
        Ok(batch
            .iter()
            .map(|write| {
                moved
                    .remove(&write.job_id)
                    .then(|| records.remove(&write.job_id).unwrap_or_default())
            })
            .collect())
    }

    /// Ends a job: moves it from one of `end.from` to `end.to`, ends its live leases (epoch
    /// bumped, so agents stop them) and releases its escrow, in one transaction. Returns the
    /// leases it ended, or None when the job was not in one of `end.from`.
    pub async fn end_job(&self, end: &JobEnd, now: i64) -> Result<Option<Vec<LeaseRecord>>> {
        let mut transaction = self.begin_write().await?;
        let query = format!(
            "UPDATE jobs SET state = $1, state_reason = $2, updated_at = $3 WHERE id = $4 AND state IN ({})",
            placeholders(5, end.from.len())
        );
        let mut update = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(end.to.as_str())
            .bind(&end.reason)
            .bind(now)
            .bind(end.job_id);
        for state in &end.from {
            update = update.bind(state.as_str());
        }
        if update.execute(&mut *transaction).await?.rows_affected() != 1 {
            transaction.rollback().await?;
            return Ok(None);
        }
        let query = format!(
            "UPDATE leases SET state = $1, end_reason = $2, ended_at = $3, epoch = epoch + 1 \
             WHERE job_id = $4 AND state IN ('pending', 'staging', 'running') RETURNING {LEASE_COLUMNS}"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(end.leases_to.as_str())
            .bind(&end.reason)
            .bind(now)
            .bind(end.job_id)
            .fetch_all(&mut *transaction)
            .await?;
        let ended = rows.iter().map(lease_from).collect::<Result<Vec<_>>>()?;
        if let Some((release, floors)) = &end.release {
            match crate::ledger::apply_ledger_in(&mut transaction, release, floors).await {
                Ok(_) => {}
                Err(StoreError::Conflict(_)) => {}
                Err(error) => return Err(error),
            }
        }
        transaction.commit().await?;
        Ok(Some(ended))
    }

    /// Puts a running job whose leases all ended (lost or preempted) back in the queue.
    pub async fn requeue_job(&self, job_id: i64, reason: &str, now: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE jobs SET state = 'queued', state_reason = $1, updated_at = $2 WHERE id = $3 AND state = 'running' \
             AND NOT EXISTS (SELECT 1 FROM leases WHERE job_id = $3 AND state IN ('pending', 'staging', 'running'))",
        )
        .bind(reason)
        .bind(now)
        .bind(job_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Live leases due to end: those whose preemption time has come (`preempt_at <= now`), and
    /// those still live at `overdue_before` after their expected end (the job's maximum runtime).
    pub async fn leases_due(&self, now: i64, overdue_before: i64) -> Result<Vec<LeaseRecord>> {
        let query = format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE state IN ('pending', 'staging', 'running') \
             AND ((preempt_at IS NOT NULL AND preempt_at <= $1) OR expected_end <= $2) ORDER BY id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(now)
            .bind(overdue_before)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(lease_from).collect()
    }
}

impl Store {
    /// The GPUs that live leases book beyond their whole (a thousand thousandths each): empty
    /// unless a bug put one GPU in two leases. The one overlap allowed is a preemption's: a
    /// victim (`preempted_by` set) whose grace has not ended at `now` may share its GPUs with
    /// the leases of the job that preempted it, and with nothing else.
    pub async fn overbooked_gpus(&self, now: i64) -> Result<Vec<Overbooking>> {
        let rows = sqlx::query(
            "SELECT id, job_id, node_id, gpu_mask, gpu_milli, preempt_at, preempted_by FROM leases \
             WHERE state IN ('pending', 'staging', 'running') ORDER BY node_id, id",
        )
        .fetch_all(&self.pool)
        .await?;
        // Per (node, GPU): every live lease on it.
        let mut on_gpu: std::collections::BTreeMap<(i64, u8), Vec<OnGpu>> = std::collections::BTreeMap::new();
        for row in &rows {
            let mask: i64 = row.try_get("gpu_mask")?;
            let preempt_at: Option<i64> = row.try_get("preempt_at")?;
            let preempted_by: Option<i64> = row.try_get("preempted_by")?;
            let lease = OnGpu {
                id: row.try_get("id")?,
                job: row.try_get("job_id")?,
                milli: row.try_get("gpu_milli")?,
                in_grace_for: preempted_by.filter(|_| preempt_at.is_some_and(|at| at > now)),
            };
            for gpu in (0..16u8).filter(|gpu| mask & (1 << gpu) != 0) {
                on_gpu.entry((row.try_get("node_id")?, gpu)).or_default().push(lease);
            }
        }
        let mut out = Vec::new();
        for ((node_id, gpu), leases) in on_gpu {
            // The GPU without the victims in grace; then, per preemptor, its victims with every
            // lease but its own and other preemptions' victims.
            let mut preemptors: Vec<i64> = leases.iter().filter_map(|lease| lease.in_grace_for).collect();
            preemptors.sort_unstable();
            preemptors.dedup();
            let views = std::iter::once(None).chain(preemptors.into_iter().map(Some));
            for by in views {
                let sharing: Vec<&OnGpu> = leases
                    .iter()
                    .filter(|lease| match (by, lease.in_grace_for) {
                        (None, grace) => grace.is_none(),
                        (Some(by), Some(grace)) => grace == by,
                        (Some(by), None) => lease.job != by,
                    })
                    .collect();
                let milli: i64 = sharing.iter().map(|lease| lease.milli).sum();
                if milli > 1000 {
                    out.push(Overbooking {
                        node_id,
                        gpu,
                        leases: sharing.iter().map(|lease| lease.id).collect(),
                        milli,
                    });
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Every lease a node ever held, in id order.
    pub async fn leases_of_node(&self, node_id: i64) -> Result<Vec<LeaseRecord>> {
        let query = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE node_id = $1 ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(node_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(lease_from).collect()
    }
}

/// A live lease on one GPU, for `Store::overbooked_gpus`.
#[derive(Clone, Copy)]
struct OnGpu {
    id: i64,
    job: i64,
    milli: i64,
    /// The job that preempted it, while its grace runs.
    in_grace_for: Option<i64>,
}

/// Fails unless `fence` is the current leadership epoch; holds the row until the transaction
/// ends, so a new leader's `take_leadership` waits for this commit.
pub(crate) async fn check_fence(transaction: &mut sqlx::Transaction<'_, sqlx::Any>, fence: i64) -> Result<()> {
    let current = sqlx::query("UPDATE leadership SET epoch = epoch WHERE id = 1 AND epoch = $1")
        .bind(fence)
        .execute(&mut **transaction)
        .await?;
    if current.rows_affected() == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced(fence))
    }
}
