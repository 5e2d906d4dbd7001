//! Services: a tenant's long-running replicas behind the gateway, as deployed (`spec`, its
//! `version`), the last version whose roll-out completed (`stable_spec`), and how many replicas
//! are wanted now (`desired`). Each replica is a job like any other whose spec serves the
//! service (`serve.name`); `service_replicas` finds them with their leases.

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{JobState, Result, Store};

/// A service as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRecord {
    pub id: i64,
    pub tenant_id: i64,
    pub name: String,
    /// The service's request as last deployed or updated (the API's JSON).
    pub spec: String,
    pub version: i64,
    /// The last version whose roll-out completed, and its request.
    pub stable_spec: String,
    pub stable_version: i64,
    /// Replicas wanted now.
    pub desired: i64,
    /// What the service's controller last had to say (a stopped roll-out, a failing version).
    pub status: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A live replica of a service: its job, and its lease once placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceReplica {
    pub job_id: i64,
    pub job_state: JobState,
    /// The job's spec (the replica's request, naming the service version it runs).
    pub spec: String,
    pub submitted_at: i64,
    pub lease_id: Option<i64>,
    pub lease_epoch: Option<i64>,
    pub lease_state: Option<String>,
    pub lease_created_at: Option<i64>,
    pub node_id: Option<i64>,
    pub tier: String,
    /// When its agent found its health check answering.
    pub ready_at: Option<i64>,
    pub expected_end: Option<i64>,
    /// Set while it is being preempted (it drains: the gateway sends it nothing new).
    pub preempt_at: Option<i64>,
}

/// A key that calls one service of its tenant through the gateway, and nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceKeyRecord {
    pub key_id: String,
    pub tenant_id: i64,
    pub service: String,
    pub secret_hash: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

const SERVICE_COLUMNS: &str =
    "id, tenant_id, name, spec, version, stable_spec, stable_version, desired, status, created_at, updated_at";

fn service_from(row: &AnyRow) -> Result<ServiceRecord> {
    Ok(ServiceRecord {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        name: row.try_get("name")?,
        spec: row.try_get("spec")?,
        version: row.try_get("version")?,
        stable_spec: row.try_get("stable_spec")?,
        stable_version: row.try_get("stable_version")?,
        desired: row.try_get("desired")?,
        status: row.try_get("status")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// The `LIKE` pattern of the specs of jobs serving `name`: `name` is letters, digits and `-`
/// (the API checks it), and a job's spec is the API's own serialisation of its request, so the
/// spec's text names it exactly so.
pub(crate) fn serving_pattern(name: &str) -> String {
    format!("%\"serve\":{{\"name\":\"{name}\",%")
}

impl Store {
    /// Creates a service at version 1 (stable from the start); None when the tenant has one of
    /// that name.
    pub async fn create_service(
        &self,
        tenant_id: i64,
        name: &str,
        spec: &str,
        desired: i64,
        now: i64,
    ) -> Result<Option<ServiceRecord>> {
        let mut transaction = self.begin_write().await?;
        let inserted = sqlx::query(
            "INSERT INTO services (tenant_id, name, spec, version, stable_spec, stable_version, desired, status, \
             created_at, updated_at) VALUES ($1, $2, $3, 1, $3, 1, $4, '', $5, $5) \
             ON CONFLICT (tenant_id, name) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(name)
        .bind(spec)
        .bind(desired)
        .bind(now)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        if inserted.rows_affected() == 0 {
            return Ok(None);
        }
        self.service(tenant_id, name).await
    }

    pub async fn service(&self, tenant_id: i64, name: &str) -> Result<Option<ServiceRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SERVICE_COLUMNS} FROM services WHERE tenant_id = $1 AND name = $2"
        )))
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(service_from).transpose()
    }

    /// A tenant's services, by name.
    pub async fn services_of_tenant(&self, tenant_id: i64) -> Result<Vec<ServiceRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SERVICE_COLUMNS} FROM services WHERE tenant_id = $1 ORDER BY name"
        )))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(service_from).collect()
    }

    /// Every service, by id (the leader keeps them at their replica counts).
    pub async fn all_services(&self) -> Result<Vec<ServiceRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SERVICE_COLUMNS} FROM services ORDER BY id"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(service_from).collect()
    }

    /// A new version of a service's request, if it is still at `version`: the roll-out starts.
    /// False when another update came first.
    pub async fn update_service_spec(&self, id: i64, version: i64, spec: &str, now: i64) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let updated = sqlx::query(
            "UPDATE services SET spec = $1, version = version + 1, status = '', updated_at = $2 \
             WHERE id = $3 AND version = $4",
        )
        .bind(spec)
        .bind(now)
        .bind(id)
        .bind(version)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(updated.rows_affected() == 1)
    }

    /// New bounds, targets or windows for a service at `version` (no new version: nothing rolls
    /// out). False when another update came first.
    pub async fn rescale_service(&self, id: i64, version: i64, spec: &str, now: i64) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let updated = sqlx::query(
            "UPDATE services SET spec = $1, \
             stable_spec = CASE WHEN stable_version = version THEN $1 ELSE stable_spec END, updated_at = $2 \
             WHERE id = $3 AND version = $4",
        )
        .bind(spec)
        .bind(now)
        .bind(id)
        .bind(version)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(updated.rows_affected() == 1)
    }

    /// The roll-out of `version` completed: it is the stable version now.
    pub async fn set_service_stable(&self, id: i64, version: i64, now: i64) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let updated = sqlx::query(
            "UPDATE services SET stable_spec = spec, stable_version = version, updated_at = $1 \
             WHERE id = $2 AND version = $3 AND stable_version <> version",
        )
        .bind(now)
        .bind(id)
        .bind(version)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(updated.rows_affected() == 1)
    }

    /// Sets how many replicas a service wants, and what its controller says of it.
    pub async fn set_service_desired(&self, id: i64, desired: i64, status: &str, now: i64) -> Result<()> {
        let mut transaction = self.begin_write().await?;
        sqlx::query("UPDATE services SET desired = $1, status = $2, updated_at = $3 WHERE id = $4")
            .bind(desired)
            .bind(status)
            .bind(now)
            .bind(id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(())
    }

    /// Forgets a service (its replicas are ended by the caller).
    pub async fn delete_service(&self, id: i64) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let deleted = sqlx::query("DELETE FROM services WHERE id = $1")
            .bind(id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(deleted.rows_affected() == 1)
    }

    /// The live (queued or running) jobs of `tenant_id` that serve `name`, each once, with its
    /// live lease once placed, by job id.
    pub async fn service_replicas(&self, tenant_id: i64, name: &str) -> Result<Vec<ServiceReplica>> {
        let rows = sqlx::query(
            "SELECT j.id, j.state, j.spec, j.submitted_at, j.tier, l.id AS lease_id, l.epoch, l.state AS lease_state, \
             l.created_at AS lease_created_at, l.node_id, l.ready_at, l.expected_end, l.preempt_at \
             FROM jobs j LEFT JOIN leases l ON l.job_id = j.id AND l.state IN ('pending', 'staging', 'running') \
             WHERE j.tenant_id = $1 AND j.state IN ('queued', 'running') AND j.spec LIKE $2 ORDER BY j.id, l.id",
        )
        .bind(tenant_id)
        .bind(serving_pattern(name))
        .fetch_all(&self.pool)
        .await?;
        let mut replicas = rows
            .iter()
            .map(|row| {
                Ok(ServiceReplica {
                    job_id: row.try_get("id")?,
                    job_state: JobState::decode(row.try_get::<&str, _>("state")?)?,
                    spec: row.try_get("spec")?,
                    submitted_at: row.try_get("submitted_at")?,
                    tier: row.try_get("tier")?,
                    lease_id: row.try_get("lease_id")?,
                    lease_epoch: row.try_get("epoch")?,
                    lease_state: row.try_get("lease_state")?,
                    lease_created_at: row.try_get("lease_created_at")?,
                    node_id: row.try_get("node_id")?,
                    ready_at: row.try_get("ready_at")?,
                    expected_end: row.try_get("expected_end")?,
                    preempt_at: row.try_get("preempt_at")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // One row per job: its first live lease.
        replicas.dedup_by_key(|replica| replica.job_id);
        Ok(replicas)
    }

    /// A serving replica's health check answered: the gateway may route to it. False when the
    /// lease is not live at `epoch`.
    pub async fn set_lease_ready(&self, lease_id: i64, epoch: i64, now: i64) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let updated = sqlx::query(
            "UPDATE leases SET ready_at = COALESCE(ready_at, $1) \
             WHERE id = $2 AND epoch = $3 AND state IN ('pending', 'staging', 'running')",
        )
        .bind(now)
        .bind(lease_id)
        .bind(epoch)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(updated.rows_affected() == 1)
    }

    /// A service replica's escrow was renewed: its lease may run to `expected_end` now.
    pub async fn extend_lease(&self, lease_id: i64, expected_end: i64) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let updated = sqlx::query(
            "UPDATE leases SET expected_end = $1 WHERE id = $2 AND expected_end < $1 \
             AND state IN ('pending', 'staging', 'running')",
        )
        .bind(expected_end)
        .bind(lease_id)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(updated.rows_affected() == 1)
    }

    /// What usage of `tenant_id`'s jobs serving `name` (live or ended) has been billed from
    /// their escrow so far, micro-dollars: the replicas' GPU cost.
    pub async fn service_cost(&self, tenant_id: i64, name: &str) -> Result<i64> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(e.amount), 0) AS BIGINT) AS spent FROM ledger_entries e \
             JOIN ledger_transactions t ON t.key = e.tx_key \
             WHERE t.kind = 'usage' AND e.account IN \
             (SELECT 'escrow:job:' || j.id FROM jobs j WHERE j.tenant_id = $1 AND j.spec LIKE $2)",
        )
        .bind(tenant_id)
        .bind(serving_pattern(name))
        .fetch_one(&self.pool)
        .await?;
        let spent: i64 = row.try_get("spent")?;
        Ok(-spent)
    }

    /// Keeps a new per-service key (its secret hashed).
    pub async fn insert_service_key(&self, key: &ServiceKeyRecord) -> Result<()> {
        let mut transaction = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO service_keys (key_id, tenant_id, service, secret_hash, created_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, NULL)",
        )
        .bind(&key.key_id)
        .bind(key.tenant_id)
        .bind(&key.service)
        .bind(&key.secret_hash)
        .bind(key.created_at)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(())
    }

    pub async fn service_key(&self, key_id: &str) -> Result<Option<ServiceKeyRecord>> {
        let row = sqlx::query(
            "SELECT key_id, tenant_id, service, secret_hash, created_at, revoked_at FROM service_keys WHERE key_id = $1",
        )
        .bind(key_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(ServiceKeyRecord {
                key_id: row.try_get("key_id")?,
                tenant_id: row.try_get("tenant_id")?,
                service: row.try_get("service")?,
                secret_hash: row.try_get("secret_hash")?,
                created_at: row.try_get("created_at")?,
                revoked_at: row.try_get("revoked_at")?,
            })
        })
        .transpose()
    }

    /// Revokes a tenant's key of a service; false when there is no such live key.
    pub async fn revoke_service_key(&self, tenant_id: i64, service: &str, key_id: &str, now: i64) -> Result<bool> {
        let mut transaction = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE service_keys SET revoked_at = $1 \
             WHERE key_id = $2 AND tenant_id = $3 AND service = $4 AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(key_id)
        .bind(tenant_id)
        .bind(service)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(done.rows_affected() == 1)
    }
}
