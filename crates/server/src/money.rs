//! Moving money: builds ledger transactions with the pure `ledger` crate and writes them with
//! each account's floor, so the database refuses anything that would break a limit.

use ledger::{Account, Transaction};
use model::Micros;
use store::{LedgerOutcome, LedgerTransactionRow, Store};

use crate::error::ApiError;

pub fn floor(account: &Account) -> i64 {
    if account.may_go_negative() { i64::MIN } else { 0 }
}

/// The store's form of a ledger transaction, with the floors of its accounts.
pub fn row(transaction: &Transaction) -> (LedgerTransactionRow, Vec<i64>) {
    let entries = transaction
        .entries
        .iter()
        .map(|entry| (entry.account.key(), entry.amount.0))
        .collect();
    let floors = transaction.entries.iter().map(|entry| floor(&entry.account)).collect();
    (
        LedgerTransactionRow {
            key: transaction.key.clone(),
            kind: transaction.kind.name().to_string(),
            memo: transaction.memo.clone(),
            at: transaction.at,
            entries,
        },
        floors,
    )
}

pub async fn apply(store: &Store, transaction: &Transaction) -> Result<LedgerOutcome, ApiError> {
    let (row, floors) = row(transaction);
    Ok(store.apply_ledger(&row, &floors).await?)
}

pub async fn balance(store: &Store, account: Account) -> Result<Micros, ApiError> {
    Ok(Micros(store.balance(&account.key()).await?))
}

pub fn ledger_error(error: ledger::LedgerError) -> ApiError {
    match error {
        ledger::LedgerError::InsufficientFunds { .. } => ApiError::PaymentRequired(error.to_string()),
        other => ApiError::BadRequest(other.to_string()),
    }
}
