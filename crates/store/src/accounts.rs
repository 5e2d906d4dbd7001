//! Accounts (tenants, providers, admins) and their API keys, stored hashed.

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{AccountRecord, ApiKeyRecord, Result, Role, Store, StoreError};

fn account_from(row: &AnyRow) -> Result<AccountRecord> {
    Ok(AccountRecord {
        id: row.try_get("id")?,
        role: Role::decode(row.try_get::<&str, _>("kind")?)?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
    })
}

fn key_from(row: &AnyRow) -> Result<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        key_id: row.try_get("key_id")?,
        account_id: row.try_get("account_id")?,
        secret_hash: row.try_get("secret_hash")?,
        label: row.try_get("label")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

/// Whether an error is a unique-constraint violation (the same on both backends).
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(database) => {
            database.is_unique_violation() || database.message().contains("UNIQUE constraint failed")
        }
        _ => false,
    }
}

async fn insert_account<'e>(
    executor: impl sqlx::Executor<'e, Database = sqlx::Any>,
    role: Role,
    name: &str,
    now: i64,
) -> Result<AccountRecord> {
    let row = sqlx::query("INSERT INTO accounts (kind, name, created_at) VALUES ($1, $2, $3) RETURNING id")
        .bind(role.as_str())
        .bind(name)
        .bind(now)
        .fetch_one(executor)
        .await
        .map_err(|error| {
            if is_unique_violation(&error) {
                StoreError::Conflict(format!("account named {name:?}"))
            } else {
                error.into()
            }
        })?;
    Ok(AccountRecord {
        id: row.try_get("id")?,
        role,
        name: name.to_string(),
        created_at: now,
    })
}

impl Store {
    pub async fn create_account(&self, role: Role, name: &str, now: i64) -> Result<AccountRecord> {
        insert_account(&self.pool, role, name, now).await
    }

    pub async fn account(&self, id: i64) -> Result<Option<AccountRecord>> {
        let row = sqlx::query("SELECT id, kind, name, created_at FROM accounts WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(account_from).transpose()
    }

    pub async fn account_by_name(&self, name: &str) -> Result<Option<AccountRecord>> {
        let row = sqlx::query("SELECT id, kind, name, created_at FROM accounts WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(account_from).transpose()
    }

    pub async fn accounts(&self) -> Result<Vec<AccountRecord>> {
        let rows = sqlx::query("SELECT id, kind, name, created_at FROM accounts ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(account_from).collect()
    }

    pub async fn insert_api_key(&self, key: &ApiKeyRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (key_id, account_id, secret_hash, label, created_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&key.key_id)
        .bind(key.account_id)
        .bind(&key.secret_hash)
        .bind(&key.label)
        .bind(key.created_at)
        .bind(key.revoked_at)
        .execute(&self.pool)
        .await
        .map_err(|error| {
            if is_unique_violation(&error) {
                StoreError::Conflict(format!("API key {}", key.key_id))
            } else {
                error.into()
            }
        })?;
        Ok(())
    }

    pub async fn api_key(&self, key_id: &str) -> Result<Option<ApiKeyRecord>> {
        let row = sqlx::query(
            "SELECT key_id, account_id, secret_hash, label, created_at, revoked_at FROM api_keys WHERE key_id = $1",
        )
        .bind(key_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(key_from).transpose()
    }

    pub async fn api_keys_of(&self, account_id: i64) -> Result<Vec<ApiKeyRecord>> {
        let rows = sqlx::query(
            "SELECT key_id, account_id, secret_hash, label, created_at, revoked_at FROM api_keys \
             WHERE account_id = $1 ORDER BY created_at, key_id",
        )
        .bind(account_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(key_from).collect()
    }

    /// Revokes a key; false when it does not exist or was already revoked.
    pub async fn revoke_api_key(&self, key_id: &str, now: i64) -> Result<bool> {
        let done = sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE key_id = $2 AND revoked_at IS NULL")
            .bind(now)
            .bind(key_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Creates an account and its first key in one transaction (`key.account_id` is ignored).
    pub async fn create_account_with_key(
        &self,
        role: Role,
        name: &str,
        key: &ApiKeyRecord,
        now: i64,
    ) -> Result<AccountRecord> {
        let mut transaction = self.begin_write().await?;
        let account = insert_account(&mut *transaction, role, name, now).await?;
        let id = account.id;
        sqlx::query(
            "INSERT INTO api_keys (key_id, account_id, secret_hash, label, created_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, NULL)",
        )
        .bind(&key.key_id)
        .bind(id)
        .bind(&key.secret_hash)
        .bind(&key.label)
        .bind(now)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(account)
    }
}
