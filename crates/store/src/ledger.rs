//! The ledger's durable form: transactions (unique by idempotency key), their entries, and a
//! balance per account kept in the same database transaction, with each account's floor
//! checked by the update itself so two writers cannot both spend the same money.

use sqlx::Row;

use crate::{AccountBalance, LedgerEntry, LedgerTotals, LedgerTransactionRow, Result, Store, StoreError};

/// What applying a ledger transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerOutcome {
    New,
    /// The key was applied before with the same entries: nothing changed.
    Duplicate,
}

fn encode_entries(entries: &[(String, i64)]) -> String {
    entries
        .iter()
        .map(|(account, amount)| format!("{account}={amount}"))
        .collect::<Vec<_>>()
        .join(";")
}

fn ledger_entry_from(row: &sqlx::any::AnyRow) -> Result<LedgerEntry> {
    Ok(LedgerEntry {
        tx_key: row.try_get("tx_key")?,
        kind: row.try_get("kind")?,
        account: row.try_get("account")?,
        amount: row.try_get("amount")?,
        at: row.try_get("at")?,
    })
}

impl Store {
    /// Applies a balanced transaction atomically. `floors[i]` is the lowest balance entry i's
    /// account may reach (`i64::MIN` for none). A key seen before with the same entries is a
    /// `Duplicate`; with other entries, a `Conflict`. A floor that would be broken is `Refused`
    /// and nothing is written.
    pub async fn apply_ledger(&self, transaction: &LedgerTransactionRow, floors: &[i64]) -> Result<LedgerOutcome> {
        let mut db = self.begin_write().await?;
        let outcome = apply_ledger_in(&mut db, transaction, floors).await;
        match outcome {
            Ok(LedgerOutcome::New) => {
                db.commit().await?;
                Ok(LedgerOutcome::New)
            }
            other => {
                db.rollback().await?;
                other
            }
        }
    }

    /// An account's balance; zero when it has none yet.
    pub async fn balance(&self, account: &str) -> Result<i64> {
        let row = sqlx::query("SELECT balance FROM ledger_balances WHERE account = $1")
            .bind(account)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(row) => row.try_get("balance")?,
            None => 0,
        })
    }

    /// Every balance whose account key starts with `prefix`, in key order.
    pub async fn balances(&self, prefix: &str) -> Result<Vec<AccountBalance>> {
        let rows = sqlx::query("SELECT account, balance FROM ledger_balances WHERE account LIKE $1 ORDER BY account")
            .bind(format!("{prefix}%"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(AccountBalance {
                    account: row.try_get("account")?,
                    balance: row.try_get("balance")?,
                })
            })
            .collect()
    }

    /// The sum of all balances and the sum of all entries: both zero in a sound ledger.
    pub async fn ledger_totals(&self) -> Result<LedgerTotals> {
        let balances = sqlx::query("SELECT CAST(COALESCE(SUM(balance), 0) AS BIGINT) AS total FROM ledger_balances")
            .fetch_one(&self.pool)
            .await?
            .try_get("total")?;
        let entries = sqlx::query("SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS total FROM ledger_entries")
            .fetch_one(&self.pool)
            .await?
            .try_get("total")?;
        Ok(LedgerTotals { balances, entries })
    }

    /// An account's entries, newest first.
    pub async fn ledger_entries_of(&self, account: &str, limit: i64) -> Result<Vec<LedgerEntry>> {
        let rows = sqlx::query(
            "SELECT e.tx_key, t.kind, e.account, e.amount, e.at FROM ledger_entries e JOIN ledger_transactions t ON t.key = e.tx_key \
             WHERE e.account = $1 ORDER BY e.id DESC LIMIT $2",
        )
        .bind(account)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ledger_entry_from).collect()
    }

    /// A tenant's entries at or after `from` and before `to`, oldest first: those on its
    /// `available` account and on the escrow accounts of its jobs (`escrow_prefix` and the job
    /// id).
    pub async fn tenant_entries_between(
        &self,
        tenant: i64,
        available: &str,
        escrow_prefix: &str,
        (from, to): (i64, i64),
    ) -> Result<Vec<LedgerEntry>> {
        let rows = sqlx::query(
            "SELECT e.tx_key, t.kind, e.account, e.amount, e.at FROM ledger_entries e \
             JOIN ledger_transactions t ON t.key = e.tx_key \
             WHERE e.at >= $1 AND e.at < $2 AND (e.account = $3 OR e.account IN \
             (SELECT $4 || CAST(id AS TEXT) FROM jobs WHERE tenant_id = $5)) ORDER BY e.id",
        )
        .bind(from)
        .bind(to)
        .bind(available)
        .bind(escrow_prefix)
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ledger_entry_from).collect()
    }

    /// Sum of an account's entries of one transaction kind since `since` (e.g. earnings per day).
    pub async fn ledger_sum(&self, account: &str, kind: &str, since: i64) -> Result<i64> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(e.amount), 0) AS BIGINT) AS total FROM ledger_entries e \
             JOIN ledger_transactions t ON t.key = e.tx_key WHERE e.account = $1 AND t.kind = $2 AND e.at >= $3",
        )
        .bind(account)
        .bind(kind)
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("total")?)
    }
}

/// Refuses a ledger transaction whose entries do not sum to zero; one floor per entry.
fn check_balanced(transaction: &LedgerTransactionRow, floors: &[i64]) -> Result<()> {
    assert_eq!(floors.len(), transaction.entries.len(), "one floor per entry");
    let sum: i128 = transaction.entries.iter().map(|(_, amount)| i128::from(*amount)).sum();
    if sum != 0 {
        return Err(StoreError::Refused(format!(
            "ledger transaction {} does not balance (sum {sum})",
            transaction.key
        )));
    }
    Ok(())
}

/// Applies a ledger transaction inside a database transaction the caller commits: with a
/// placement, the escrow hold lands or fails together with the leases. On `Duplicate` or an
/// error the caller must roll back.
pub(crate) async fn apply_ledger_in(
    db: &mut sqlx::Transaction<'_, sqlx::Any>,
    transaction: &LedgerTransactionRow,
    floors: &[i64],
) -> Result<LedgerOutcome> {
    check_balanced(transaction, floors)?;
    let encoded = encode_entries(&transaction.entries);
    let inserted = sqlx::query(
        "INSERT INTO ledger_transactions (key, kind, memo, entries, at) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (key) DO NOTHING",
    )
    .bind(&transaction.key)
    .bind(&transaction.kind)
    .bind(&transaction.memo)
    .bind(&encoded)
    .bind(transaction.at)
    .execute(&mut **db)
    .await?;
    if inserted.rows_affected() == 0 {
        let row = sqlx::query("SELECT entries FROM ledger_transactions WHERE key = $1")
            .bind(&transaction.key)
            .fetch_one(&mut **db)
            .await?;
        let stored: String = row.try_get("entries")?;
        return if stored == encoded {
            Ok(LedgerOutcome::Duplicate)
        } else {
            Err(StoreError::Conflict(format!(
                "ledger key {} with different entries",
                transaction.key
            )))
        };
    }
    // One statement per balance (a new account starts at zero): a broken floor fails the
    // transaction, which every caller then rolls back.
    for ((account, amount), floor) in transaction.entries.iter().zip(floors) {
        let balance: i64 = sqlx::query(
            "INSERT INTO ledger_balances (account, balance) VALUES ($1, $2) \
             ON CONFLICT (account) DO UPDATE SET balance = ledger_balances.balance + excluded.balance \
             RETURNING balance",
        )
        .bind(account)
        .bind(*amount)
        .fetch_one(&mut **db)
        .await?
        .try_get("balance")?;
        if balance < *floor {
            return Err(StoreError::Refused(format!(
                "account {account} would go below its floor of {floor} micro-dollars"
            )));
        }
    }
    if transaction.entries.is_empty() {
        return Ok(LedgerOutcome::New);
    }
    let values = crate::values_rows(transaction.entries.len(), &["", "", "", ""]);
    let query = format!("INSERT INTO ledger_entries (tx_key, account, amount, at) VALUES {values}");
    let mut insert = sqlx::query(sqlx::AssertSqlSafe(query));
    for (account, amount) in &transaction.entries {
        insert = insert
            .bind(&transaction.key)
            .bind(account)
            .bind(*amount)
            .bind(transaction.at);
    }
    insert.execute(&mut **db).await?;
    Ok(LedgerOutcome::New)
}

/// Rows a multi-row statement of the batched writes carries at most: sqlx finds each `$N` of a
/// statement by name among all of them (quadratic), so statements stay a few hundred
/// parameters long.
pub(crate) const ROWS_PER_STATEMENT_MAX: usize = 64;

/// Applies many balanced transactions in a few statements (one per `ROWS_PER_STATEMENT_MAX`
/// rows of each table, instead of three or more per transaction), inside `db`. For each, true
/// where its key was new and it was applied; false where the key was applied before, with the
/// same entries or others, and nothing changed for it. A floor that would be broken fails the
/// whole batch with `Refused`, which the caller then rolls back. Floors are checked on each
/// account's balance after the batch: the same as one transaction after another when the
/// batch moves each account one way only (a placement's hold takes from the tenant's available
/// money and adds to its escrow); a batch that moves an account both ways is applied one
/// transaction at a time, each checked as `apply_ledger_in` checks it.
pub(crate) async fn apply_ledger_many_in(
    db: &mut sqlx::Transaction<'_, sqlx::Any>,
    transactions: &[(&LedgerTransactionRow, &[i64])],
) -> Result<Vec<bool>> {
    let mut directions: std::collections::HashMap<&str, (bool, bool)> = std::collections::HashMap::new();
    for (transaction, floors) in transactions {
        check_balanced(transaction, floors)?;
        for (account, amount) in &transaction.entries {
            let direction = directions.entry(account.as_str()).or_default();
            direction.0 |= *amount < 0;
            direction.1 |= *amount > 0;
        }
    }
    if directions.values().any(|(down, up)| *down && *up) {
        let mut applied = Vec::with_capacity(transactions.len());
        for (transaction, floors) in transactions {
            applied.push(match apply_ledger_in(db, transaction, floors).await {
                Ok(LedgerOutcome::New) => true,
                Ok(LedgerOutcome::Duplicate) | Err(StoreError::Conflict(_)) => false,
                Err(error) => return Err(error),
            });
        }
        return Ok(applied);
    }
    let mut new_keys = std::collections::HashSet::new();
    for chunk in transactions.chunks(ROWS_PER_STATEMENT_MAX) {
        let query = format!(
            "INSERT INTO ledger_transactions (key, kind, memo, entries, at) VALUES {} \
             ON CONFLICT (key) DO NOTHING RETURNING key",
            crate::values_rows(chunk.len(), &["", "", "", "", ""])
        );
        let mut insert = sqlx::query(sqlx::AssertSqlSafe(query));
        for (transaction, _) in chunk {
            insert = insert
                .bind(&transaction.key)
                .bind(&transaction.kind)
                .bind(&transaction.memo)
                .bind(encode_entries(&transaction.entries))
                .bind(transaction.at);
        }
        for row in insert.fetch_all(&mut **db).await? {
            new_keys.insert(row.try_get::<String, _>("key")?);
        }
    }
    // A key twice in the batch is inserted once: the first is applied, the second is not.
    let applied: Vec<bool> = transactions
        .iter()
        .map(|(transaction, _)| new_keys.remove(&transaction.key))
        .collect();
    let mut changes: std::collections::BTreeMap<&str, (i64, i64)> = std::collections::BTreeMap::new();
    let mut entries = Vec::new();
    for ((transaction, floors), _) in transactions.iter().zip(&applied).filter(|(_, applied)| **applied) {
        for ((account, amount), floor) in transaction.entries.iter().zip(floors.iter()) {
            let change = changes.entry(account.as_str()).or_insert((0, i64::MIN));
            change.0 = change
                .0
                .checked_add(*amount)
                .ok_or_else(|| StoreError::Refused(format!("account {account}: the batch's change overflows")))?;
            change.1 = change.1.max(*floor);
            entries.push((&transaction.key, account, *amount, transaction.at));
        }
    }
    let changes: Vec<(&str, (i64, i64))> = changes.into_iter().collect();
    for chunk in changes.chunks(ROWS_PER_STATEMENT_MAX) {
        let query = format!(
            "INSERT INTO ledger_balances (account, balance) VALUES {} \
             ON CONFLICT (account) DO UPDATE SET balance = ledger_balances.balance + excluded.balance \
             RETURNING account, balance",
            crate::values_rows(chunk.len(), &["", ""])
        );
        let mut upsert = sqlx::query(sqlx::AssertSqlSafe(query));
        for (account, (amount, _)) in chunk {
            upsert = upsert.bind(*account).bind(*amount);
        }
        let floors: std::collections::HashMap<&str, i64> =
            chunk.iter().map(|(account, (_, floor))| (*account, *floor)).collect();
        for row in upsert.fetch_all(&mut **db).await? {
            let account: String = row.try_get("account")?;
            let balance: i64 = row.try_get("balance")?;
            let floor = floors.get(account.as_str()).copied().unwrap_or(i64::MIN);
            if balance < floor {
                return Err(StoreError::Refused(format!(
                    "account {account} would go below its floor of {floor} micro-dollars"
                )));
            }
        }
    }
    for chunk in entries.chunks(ROWS_PER_STATEMENT_MAX) {
        let values = crate::values_rows(chunk.len(), &["", "", "", ""]);
        let query = format!("INSERT INTO ledger_entries (tx_key, account, amount, at) VALUES {values}");
        let mut insert = sqlx::query(sqlx::AssertSqlSafe(query));
        for (key, account, amount, at) in chunk {
            insert = insert.bind(*key).bind(*account).bind(*amount).bind(*at);
        }
        insert.execute(&mut **db).await?;
    }
    Ok(applied)
}
