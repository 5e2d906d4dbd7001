//! Why the ledger refuses a transaction, in words a caller can act on.

use model::Micros;

use crate::Account;

/// Every way building, checking or applying a transaction can fail. A refused transaction
/// changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("transaction {key} is unbalanced: its entries sum to {sum_micros} micro-dollars, not zero")]
    Unbalanced { key: String, sum_micros: i128 },
    #[error(
        "idempotency key {key} was already used for a different transaction; \
         retry with the transaction first built for it, or use a new key"
    )]
    KeyReused { key: String },
    #[error("{account} would fall to {balance_after}; this account may not go below zero")]
    LimitBroken { account: Account, balance_after: Micros },
    #[error("{account} holds {balance}, nothing to take; add money before trying again")]
    InsufficientFunds { account: Account, balance: Micros },
    #[error("amount out of range: the sum overflows 64-bit micro-dollars")]
    Overflow,
    #[error("the {what} must be positive, got {amount}")]
    NonPositiveAmount { what: &'static str, amount: Micros },
    #[error("the {what} must be between {min} and 1000 permille, got {permille}")]
    PermilleOutOfRange {
        what: &'static str,
        permille: u32,
        min: u32,
    },
    #[error(
        "{0:?} is not an account key; expected tenant:ID:available, escrow:job:ID, \
         provider:ID:earnings, provider:ID:bond, platform:fees, platform:sla or external"
    )]
    BadAccount(String),
    #[error(
        "{0:?} is not a transaction kind; expected deposit, hold, usage, release, sla_credit, \
         refund, bond_post, slash or payout"
    )]
    BadKind(String),
    #[error("the idempotency key is empty; give every transaction a key such as usage:lease-42:seq-7")]
    EmptyKey,
    #[error("the idempotency key is {bytes} bytes long; at most {max} are allowed")]
    KeyTooLong { bytes: usize, max: usize },
    #[error("the memo of transaction {key} is {bytes} bytes long; at most {max} are allowed")]
    MemoTooLong { key: String, bytes: usize, max: usize },
    #[error("transaction {key} has no entries; there is nothing to record")]
    NoEntries { key: String },
    #[error("transaction {key} has {entries} entries; at most {max} are allowed, split it")]
    TooManyEntries { key: String, entries: usize, max: usize },
    #[error("transaction {key} has a zero entry for {account}; leave it out")]
    ZeroEntry { key: String, account: Account },
}
