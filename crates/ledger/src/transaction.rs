//! Transactions: balanced sets of entries under an idempotency key, and the pure check that
//! decides whether one may be applied to given balances.

use std::collections::BTreeMap;
use std::fmt;

use model::Micros;

use crate::{Account, LedgerError};

/// Idempotency keys are stored and indexed in SQL; a bound keeps that index small.
pub const KEY_BYTES_MAX: usize = 200;
/// Memos are for people reading statements, not for data.
pub const MEMO_BYTES_MAX: usize = 500;
/// A slash that refunds many tenants is the widest transaction; past this, split it.
pub const ENTRIES_PER_TRANSACTION_MAX: usize = 1024;

/// One line of a transaction. A positive amount raises the account's balance (a credit to it),
/// a negative one lowers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub account: Account,
    pub amount: Micros,
}

/// What a transaction is for: a label for statements and reports. The ledger checks balance
/// and limits, not which accounts a kind may touch; the builders produce the right shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TransactionKind {
    Deposit,
    Hold,
    Usage,
    Release,
    SlaCredit,
    Refund,
    BondPost,
    Slash,
    Payout,
}

impl TransactionKind {
    pub const ALL: [TransactionKind; 9] = [
        TransactionKind::Deposit,
        TransactionKind::Hold,
        TransactionKind::Usage,
        TransactionKind::Release,
        TransactionKind::SlaCredit,
        TransactionKind::Refund,
        TransactionKind::BondPost,
        TransactionKind::Slash,
        TransactionKind::Payout,
    ];

    /// The stable text form stored beside entries, e.g. `sla_credit`.
    pub fn name(self) -> &'static str {
        match self {
            TransactionKind::Deposit => "deposit",
            TransactionKind::Hold => "hold",
            TransactionKind::Usage => "usage",
            TransactionKind::Release => "release",
            TransactionKind::SlaCredit => "sla_credit",
            TransactionKind::Refund => "refund",
            TransactionKind::BondPost => "bond_post",
            TransactionKind::Slash => "slash",
            TransactionKind::Payout => "payout",
        }
    }

    pub fn parse(text: &str) -> Result<TransactionKind, LedgerError> {
        TransactionKind::ALL
            .into_iter()
            .find(|kind| kind.name() == text)
            .ok_or_else(|| LedgerError::BadKind(text.to_string()))
    }
}

impl fmt::Display for TransactionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A balanced movement of money. Applying a key twice is a no-op, so a caller that is unsure
/// whether a write landed simply retries the same transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transaction {
    /// The idempotency key, e.g. `usage:lease-42:seq-7`.
    pub key: String,
    pub kind: TransactionKind,
    /// Microseconds since the Unix epoch; given by the caller, never read from a clock here.
    pub at: i64,
    pub entries: Vec<Entry>,
    pub memo: String,
}

/// Checks that `tx` is well formed and balanced and that, applied to the balances `balance_of`
/// reports, no account would break its limit or overflow. Idempotency is not checked here:
/// whether a key was already used is the store's knowledge (a unique index in SQL, or
/// [`crate::Ledger::apply`]).
pub fn check_transaction(tx: &Transaction, balance_of: impl Fn(&Account) -> Micros) -> Result<(), LedgerError> {
    balances_after(tx, balance_of).map(|_| ())
}

/// The shape rules that hold whatever the balances: a usable key and memo, a bounded number of
/// non-zero entries, and a zero sum.
pub(crate) fn check_shape(tx: &Transaction) -> Result<(), LedgerError> {
    if tx.key.is_empty() {
        return Err(LedgerError::EmptyKey);
    }
    if tx.key.len() > KEY_BYTES_MAX {
        return Err(LedgerError::KeyTooLong {
            bytes: tx.key.len(),
            max: KEY_BYTES_MAX,
        });
    }
    if tx.memo.len() > MEMO_BYTES_MAX {
        return Err(LedgerError::MemoTooLong {
            key: tx.key.clone(),
            bytes: tx.memo.len(),
            max: MEMO_BYTES_MAX,
        });
    }
    if tx.entries.is_empty() {
        return Err(LedgerError::NoEntries { key: tx.key.clone() });
    }
    if tx.entries.len() > ENTRIES_PER_TRANSACTION_MAX {
        return Err(LedgerError::TooManyEntries {
            key: tx.key.clone(),
            entries: tx.entries.len(),
            max: ENTRIES_PER_TRANSACTION_MAX,
        });
    }
    if let Some(entry) = tx.entries.iter().find(|entry| entry.amount == Micros::ZERO) {
        return Err(LedgerError::ZeroEntry {
            key: tx.key.clone(),
            account: entry.account,
        });
    }
    // i128 cannot overflow here: at most ENTRIES_PER_TRANSACTION_MAX terms of at most 2^63 each.
    let sum_micros: i128 = tx.entries.iter().map(|entry| i128::from(entry.amount.0)).sum();
    if sum_micros != 0 {
        return Err(LedgerError::Unbalanced {
            key: tx.key.clone(),
            sum_micros,
        });
    }
    Ok(())
}

/// The new balance of every account `tx` touches, in account order, or why `tx` may not be
/// applied. An account named twice is judged on its net change, as it would be stored.
pub(crate) fn balances_after(
    tx: &Transaction,
    balance_of: impl Fn(&Account) -> Micros,
) -> Result<Vec<(Account, Micros)>, LedgerError> {
    check_shape(tx)?;
    let mut change_micros: BTreeMap<Account, i128> = BTreeMap::new();
    for entry in &tx.entries {
        *change_micros.entry(entry.account).or_default() += i128::from(entry.amount.0);
    }
    let mut after = Vec::with_capacity(change_micros.len());
    for (account, change) in change_micros {
        let balance_after = i128::from(balance_of(&account).0) + change;
        let balance_after = Micros(i64::try_from(balance_after).map_err(|_| LedgerError::Overflow)?);
        if balance_after < Micros::ZERO && !account.may_go_negative() {
            return Err(LedgerError::LimitBroken { account, balance_after });
        }
        after.push((account, balance_after));
    }
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TENANT: Account = Account::TenantAvailable(1);
    const ESCROW: Account = Account::Escrow(9);

    fn tx(key: &str, entries: &[(Account, i64)]) -> Transaction {
        Transaction {
            key: key.to_string(),
            kind: TransactionKind::Hold,
            at: 0,
            entries: entries
                .iter()
                .map(|&(account, amount)| Entry {
                    account,
                    amount: Micros(amount),
                })
                .collect(),
            memo: String::new(),
        }
    }

    /// Checks `tx` against balances given as data; `Ok` lists the balances after.
    fn check(tx: &Transaction, balances: &[(Account, i64)], expect: Result<Vec<(Account, i64)>, LedgerError>) {
        let balance_of = |account: &Account| {
            balances
                .iter()
                .find(|(known, _)| known == account)
                .map_or(Micros::ZERO, |&(_, balance)| Micros(balance))
        };
        let expect = expect.map(|after| after.into_iter().map(|(account, b)| (account, Micros(b))).collect());
        assert_eq!(balances_after(tx, balance_of), expect);
        assert_eq!(check_transaction(tx, balance_of), expect.map(|_| ()));
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in TransactionKind::ALL {
            assert_eq!(TransactionKind::parse(kind.name()), Ok(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!(
            TransactionKind::parse("Deposit"),
            Err(LedgerError::BadKind("Deposit".into()))
        );
        assert_eq!(TransactionKind::parse(""), Err(LedgerError::BadKind(String::new())));
    }

    #[test]
    fn a_balanced_transfer_within_limits_passes() {
        check(
            &tx("h", &[(TENANT, -30), (ESCROW, 30)]),
            &[(TENANT, 100)],
            Ok(vec![(TENANT, 70), (ESCROW, 30)]),
        );
    }

    #[test]
    fn unbalanced_is_refused_with_the_sum() {
        let expect = Err(LedgerError::Unbalanced {
            key: "h".into(),
            sum_micros: 1,
        });
        check(&tx("h", &[(TENANT, -30), (ESCROW, 31)]), &[(TENANT, 100)], expect);
        // The sum is exact even where i64 would overflow.
        let expect = Err(LedgerError::Unbalanced {
            key: "h".into(),
            sum_micros: 2 * i128::from(i64::MAX),
        });
        check(&tx("h", &[(TENANT, i64::MAX), (ESCROW, i64::MAX)]), &[], expect);
    }

    #[test]
    fn limits_are_judged_on_the_net_change() {
        check(
            &tx("h", &[(TENANT, -101), (ESCROW, 101)]),
            &[(TENANT, 100)],
            Err(LedgerError::LimitBroken {
                account: TENANT,
                balance_after: Micros(-1),
            }),
        );
        // Out and back in within one transaction: the net is what counts.
        check(
            &tx("h", &[(TENANT, -150), (ESCROW, 100), (TENANT, 50)]),
            &[(TENANT, 100)],
            Ok(vec![(TENANT, 0), (ESCROW, 100)]),
        );
        // The outside world and the SLA pot may go negative.
        check(
            &tx(
                "d",
                &[(Account::External, -5), (Account::PlatformSla, -5), (TENANT, 10)],
            ),
            &[],
            Ok(vec![(TENANT, 10), (Account::PlatformSla, -5), (Account::External, -5)]),
        );
    }

    #[test]
    fn overflowing_balances_are_refused() {
        check(
            &tx("d", &[(Account::External, -1), (TENANT, 1)]),
            &[(TENANT, i64::MAX)],
            Err(LedgerError::Overflow),
        );
        check(
            &tx("d", &[(Account::External, -1), (TENANT, 1)]),
            &[(Account::External, i64::MIN)],
            Err(LedgerError::Overflow),
        );
    }

    #[test]
    fn malformed_transactions_are_refused() {
        check(
            &tx("", &[(TENANT, -1), (ESCROW, 1)]),
            &[(TENANT, 1)],
            Err(LedgerError::EmptyKey),
        );
        let long_key = "k".repeat(KEY_BYTES_MAX + 1);
        let expect = Err(LedgerError::KeyTooLong {
            bytes: KEY_BYTES_MAX + 1,
            max: KEY_BYTES_MAX,
        });
        check(&tx(&long_key, &[(TENANT, -1), (ESCROW, 1)]), &[(TENANT, 1)], expect);
        let mut long_memo = tx("m", &[(TENANT, -1), (ESCROW, 1)]);
        long_memo.memo = "m".repeat(MEMO_BYTES_MAX + 1);
        let expect = Err(LedgerError::MemoTooLong {
            key: "m".into(),
            bytes: MEMO_BYTES_MAX + 1,
            max: MEMO_BYTES_MAX,
        });
        check(&long_memo, &[(TENANT, 1)], expect);
        check(&tx("e", &[]), &[], Err(LedgerError::NoEntries { key: "e".into() }));
        let wide: Vec<(Account, i64)> = (0..=ENTRIES_PER_TRANSACTION_MAX as i64)
            .map(|index| (Account::External, if index == 0 { -1 } else { 0 }))
            .collect();
        let expect = Err(LedgerError::TooManyEntries {
            key: "w".into(),
            entries: ENTRIES_PER_TRANSACTION_MAX + 1,
            max: ENTRIES_PER_TRANSACTION_MAX,
        });
        check(&tx("w", &wide), &[], expect);
        let expect = Err(LedgerError::ZeroEntry {
            key: "z".into(),
            account: ESCROW,
        });
        check(
            &tx("z", &[(TENANT, -1), (ESCROW, 0), (Account::External, 1)]),
            &[(TENANT, 1)],
            expect,
        );
    }
}
