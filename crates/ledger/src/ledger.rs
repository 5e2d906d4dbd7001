//! The in-memory ledger: balances per account and the set of applied idempotency keys. The
//! coordinator keeps the same facts in SQL; this one serves the simulator and the tests.

use std::collections::BTreeMap;

use model::Micros;

use crate::transaction::balances_after;
use crate::{Account, Entry, LedgerError, Transaction};

/// What [`Ledger::apply`] did with a transaction it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The transaction moved money.
    New,
    /// Its key was applied before with the same entries; nothing changed.
    Duplicate,
}

/// Balances and applied keys. Both maps are ordered, so listings and checks are deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    balances: BTreeMap<Account, Micros>,
    applied: BTreeMap<String, Vec<Entry>>,
}

impl Ledger {
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// The account's balance; zero for an account no transaction has touched.
    pub fn balance(&self, account: &Account) -> Micros {
        self.balances.get(account).copied().unwrap_or(Micros::ZERO)
    }

    /// Applies `tx` whole or not at all. A key seen before with the same entries is a no-op
    /// (`Duplicate`) even if the balances have moved since; with other entries it is refused
    /// (`KeyReused`). The time and memo of a replay are not compared: a retry may carry a later
    /// time.
    pub fn apply(&mut self, tx: &Transaction) -> Result<Applied, LedgerError> {
        if let Some(entries) = self.applied.get(&tx.key) {
            return if *entries == tx.entries {
                Ok(Applied::Duplicate)
            } else {
                Err(LedgerError::KeyReused { key: tx.key.clone() })
            };
        }
        // Every check happens before the first write, so a refusal leaves no trace.
        let after = balances_after(tx, |account| self.balance(account))?;
        self.balances.extend(after);
        self.applied.insert(tx.key.clone(), tx.entries.clone());
        Ok(Applied::New)
    }

    /// The sum of all balances: zero, because every applied transaction sums to zero.
    pub fn total(&self) -> Micros {
        let total: i128 = self.balances.values().map(|balance| i128::from(balance.0)).sum();
        Micros(i64::try_from(total).expect("balances sum to zero: every applied transaction is balanced"))
    }

    /// Every account a transaction has touched, in account order, with its balance.
    pub fn balances(&self) -> impl Iterator<Item = (&Account, Micros)> {
        self.balances.iter().map(|(account, balance)| (account, *balance))
    }

    /// The entries applied under `key`, if any: lets a caller find out whether a write landed.
    pub fn applied(&self, key: &str) -> Option<&[Entry]> {
        self.applied.get(key).map(Vec::as_slice)
    }

    /// How many distinct transactions have been applied.
    pub fn transaction_count(&self) -> usize {
        self.applied.len()
    }

    /// Recomputes every balance from the applied entries and checks it against the kept one,
    /// the zero total and each account's limit. O(entries); for tests and the simulator.
    pub fn consistency_check(&self) -> Result<(), String> {
        let mut recomputed: BTreeMap<Account, i128> = BTreeMap::new();
        for entries in self.applied.values() {
            for entry in entries {
                *recomputed.entry(entry.account).or_default() += i128::from(entry.amount.0);
            }
        }
        let mut total: i128 = 0;
        for (account, balance) in &self.balances {
            let expected = recomputed.remove(account).unwrap_or(0);
            if i128::from(balance.0) != expected {
                return Err(format!(
                    "{account} holds {balance} but its entries sum to {expected} micros"
                ));
            }
            if *balance < Micros::ZERO && !account.may_go_negative() {
                return Err(format!("{account} is at {balance}, below its limit of zero"));
            }
            total += expected;
        }
        if let Some((account, _)) = recomputed.into_iter().next() {
            return Err(format!("{account} has entries but no balance"));
        }
        if total != 0 {
            return Err(format!("balances sum to {total} micros, not zero"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TransactionKind, deposit, hold};

    const TENANT: Account = Account::TenantAvailable(1);
    const ESCROW: Account = Account::Escrow(9);

    fn funded(amount: i64) -> Ledger {
        let mut ledger = Ledger::new();
        let tx = deposit(1, Micros(amount), "deposit:1", 0).expect("positive amount");
        assert_eq!(ledger.apply(&tx), Ok(Applied::New));
        ledger
    }

    #[test]
    fn a_new_ledger_is_empty_and_balanced() {
        let ledger = Ledger::new();
        assert_eq!(ledger.balance(&TENANT), Micros::ZERO);
        assert_eq!(ledger.total(), Micros::ZERO);
        assert_eq!(ledger.balances().count(), 0);
        assert_eq!(ledger.consistency_check(), Ok(()));
    }

    #[test]
    fn applying_moves_money_and_keeps_the_total_at_zero() {
        let mut ledger = funded(100);
        let tx = hold(1, 9, Micros(40), Micros(100), "hold:9", 1).expect("funds available");
        assert_eq!(ledger.apply(&tx), Ok(Applied::New));
        let balances: Vec<(Account, Micros)> = ledger.balances().map(|(account, b)| (*account, b)).collect();
        assert_eq!(
            balances,
            [
                (TENANT, Micros(60)),
                (ESCROW, Micros(40)),
                (Account::External, Micros(-100))
            ]
        );
        assert_eq!(ledger.total(), Micros::ZERO);
        assert_eq!(ledger.transaction_count(), 2);
        assert_eq!(ledger.applied("hold:9"), Some(tx.entries.as_slice()));
        assert_eq!(ledger.consistency_check(), Ok(()));
    }

    #[test]
    fn a_replayed_key_is_a_no_op_even_after_balances_moved() {
        let mut ledger = funded(100);
        let tx = hold(1, 9, Micros(100), Micros(100), "hold:9", 1).expect("funds available");
        assert_eq!(ledger.apply(&tx), Ok(Applied::New));
        let before = ledger.clone();
        // The tenant could not afford it again, yet a replay is accepted and changes nothing.
        let mut later = tx.clone();
        later.at = 99;
        later.memo = "retried".into();
        assert_eq!(ledger.apply(&later), Ok(Applied::Duplicate));
        assert_eq!(ledger, before);
    }

    #[test]
    fn a_reused_key_with_other_entries_is_refused() {
        let mut ledger = funded(100);
        let first = hold(1, 9, Micros(10), Micros(100), "hold:9", 1).expect("funds available");
        let second = hold(1, 9, Micros(20), Micros(90), "hold:9", 1).expect("funds available");
        assert_eq!(ledger.apply(&first), Ok(Applied::New));
        let before = ledger.clone();
        assert_eq!(
            ledger.apply(&second),
            Err(LedgerError::KeyReused { key: "hold:9".into() })
        );
        assert_eq!(ledger, before);
    }

    #[test]
    fn a_refused_transaction_changes_nothing() {
        let mut ledger = funded(100);
        let before = ledger.clone();
        let overdraw = Transaction {
            key: "hold:9".into(),
            kind: TransactionKind::Hold,
            at: 1,
            entries: vec![
                Entry {
                    account: ESCROW,
                    amount: Micros(101),
                },
                Entry {
                    account: TENANT,
                    amount: Micros(-101),
                },
            ],
            memo: String::new(),
        };
        let expect = Err(LedgerError::LimitBroken {
            account: TENANT,
            balance_after: Micros(-1),
        });
        assert_eq!(ledger.apply(&overdraw), expect);
        assert_eq!(ledger, before);
        // The refused key stays free: the same key with a valid transaction goes through.
        let fits = hold(1, 9, Micros(101), Micros(100), "hold:9", 1).expect("funds available");
        assert_eq!(ledger.apply(&fits), Ok(Applied::New));
        assert_eq!(ledger.balance(&ESCROW), Micros(100));
    }
}
