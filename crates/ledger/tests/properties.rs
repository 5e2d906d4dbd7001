//! Property test of the ledger's invariants over random sequences of every kind of
//! transaction, with absurd amounts, made-up balances and idempotency keys used again and again.

use ledger::{
    Account, Applied, BillableUsage, Entry, Ledger, LedgerError, Micros, Transaction, bond_post, bond_post_external,
    check_transaction, deposit, hold, payout, refund, release, sla_credit, slash, usage,
};
use proptest::prelude::*;

/// A balance handed to a builder: the ledger's own, or a made-up one (a stale or buggy caller).
#[derive(Clone, Copy, Debug)]
enum Balance {
    Current,
    MadeUp(i64),
}

#[derive(Clone, Debug)]
enum Op {
    Deposit {
        tenant: i64,
        amount: i64,
        key: u8,
    },
    Hold {
        tenant: i64,
        job: i64,
        amount: i64,
        available: Balance,
        key: u8,
    },
    Usage {
        tenant: i64,
        job: i64,
        provider: i64,
        amount: i64,
        fee_permille: u32,
        escrow: Balance,
        available: Balance,
        key: u8,
    },
    Release {
        tenant: i64,
        job: i64,
        escrow: Balance,
        key: u8,
    },
    SlaCredit {
        tenant: i64,
        amount: i64,
        key: u8,
    },
    Refund {
        tenant: i64,
        provider: i64,
        amount: i64,
        earnings: Balance,
        key: u8,
    },
    BondPost {
        provider: i64,
        amount: i64,
        from_outside: bool,
        key: u8,
    },
    Slash {
        provider: i64,
        bond: Balance,
        share_permille: u32,
        refunds: Vec<(i64, i64)>,
        key: u8,
    },
    Payout {
        provider: i64,
        amount: i64,
        key: u8,
    },
    /// Applies again a transaction built earlier (applied, refused or a duplicate): a retry.
    Replay {
        pick: usize,
    },
}

/// Mostly ordinary amounts, with zero, negatives and values at the edge of i64 mixed in.
fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        12 => 1i64..5_000,
        1 => Just(0i64),
        1 => -5_000i64..0,
        1 => (i64::MAX - 5_000)..=i64::MAX,
        1 => Just(i64::MIN),
        1 => any::<i64>(),
    ]
}

fn balance() -> impl Strategy<Value = Balance> {
    prop_oneof![4 => Just(Balance::Current), 1 => amount().prop_map(Balance::MadeUp)]
}

fn permille() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..=1000, 1 => Just(1000u32), 1 => 1001u32..5000]
}

/// Few ids and few keys, so accounts are shared and keys collide across kinds.
fn op() -> impl Strategy<Value = Op> {
    let id = || 0i64..3;
    let key = || 0u8..40;
    prop_oneof![
        3 => (id(), amount(), key()).prop_map(|(tenant, amount, key)| Op::Deposit { tenant, amount, key }),
        3 => (id(), id(), amount(), balance(), key())
            .prop_map(|(tenant, job, amount, available, key)| Op::Hold { tenant, job, amount, available, key }),
        4 => (id(), id(), id(), amount(), permille(), balance(), balance(), key()).prop_map(
            |(tenant, job, provider, amount, fee_permille, escrow, available, key)| Op::Usage {
                tenant, job, provider, amount, fee_permille, escrow, available, key,
            }
        ),
        2 => (id(), id(), balance(), key()).prop_map(|(tenant, job, escrow, key)| Op::Release { tenant, job, escrow, key }),
        1 => (id(), amount(), key()).prop_map(|(tenant, amount, key)| Op::SlaCredit { tenant, amount, key }),
        1 => (id(), id(), amount(), balance(), key())
            .prop_map(|(tenant, provider, amount, earnings, key)| Op::Refund { tenant, provider, amount, earnings, key }),
        2 => (id(), amount(), any::<bool>(), key())
            .prop_map(|(provider, amount, from_outside, key)| Op::BondPost { provider, amount, from_outside, key }),
        1 => (id(), balance(), permille(), prop::collection::vec((id(), amount()), 0..4), key()).prop_map(
            |(provider, bond, share_permille, refunds, key)| Op::Slash { provider, bond, share_permille, refunds, key }
        ),
        2 => (id(), amount(), key()).prop_map(|(provider, amount, key)| Op::Payout { provider, amount, key }),
        4 => any::<usize>().prop_map(|pick| Op::Replay { pick }),
    ]
}

/// Builds the transaction an op describes against the ledger as it is now (or picks one built
/// before from `history`). `Ok(None)`: the builder had nothing to move.
fn build(op: &Op, ledger: &Ledger, history: &[Transaction], at: i64) -> Result<Option<Transaction>, LedgerError> {
    let of = |balance: Balance, account: Account| match balance {
        Balance::Current => ledger.balance(&account),
        Balance::MadeUp(micros) => Micros(micros),
    };
    let key = |key: u8| format!("k{key}");
    match op.clone() {
        Op::Deposit { tenant, amount, key: k } => deposit(tenant, Micros(amount), key(k), at).map(Some),
        Op::Hold {
            tenant,
            job,
            amount,
            available,
            key: k,
        } => {
            let available = of(available, Account::TenantAvailable(tenant));
            hold(tenant, job, Micros(amount), available, key(k), at).map(Some)
        }
        Op::Usage {
            tenant,
            job,
            provider,
            amount,
            fee_permille,
            escrow,
            available,
            key: k,
        } => {
            let bill = BillableUsage {
                tenant,
                job,
                provider,
                amount: Micros(amount),
                fee_permille,
            };
            let escrow = of(escrow, Account::Escrow(job));
            let available = of(available, Account::TenantAvailable(tenant));
            let charge = usage(&bill, escrow, available, key(k), at)?;
            assert_eq!(charge.billed.checked_add(charge.unbilled), Some(Micros(amount)));
            let coverable = i128::from(escrow.max(Micros::ZERO).0) + i128::from(available.max(Micros::ZERO).0);
            assert!(
                i128::from(charge.billed.0) <= coverable,
                "never more than escrow and balance hold"
            );
            Ok(charge.tx)
        }
        Op::Release {
            tenant,
            job,
            escrow,
            key: k,
        } => release(tenant, job, of(escrow, Account::Escrow(job)), key(k), at),
        Op::SlaCredit { tenant, amount, key: k } => sla_credit(tenant, Micros(amount), key(k), at).map(Some),
        Op::Refund {
            tenant,
            provider,
            amount,
            earnings,
            key: k,
        } => {
            let earnings = of(earnings, Account::ProviderEarnings(provider));
            Ok(refund(tenant, provider, Micros(amount), earnings, key(k), at)?.tx)
        }
        Op::BondPost {
            provider,
            amount,
            from_outside: true,
            key: k,
        } => bond_post_external(provider, Micros(amount), key(k), at).map(Some),
        Op::BondPost {
            provider,
            amount,
            from_outside: false,
            key: k,
        } => bond_post(provider, Micros(amount), key(k), at).map(Some),
        Op::Slash {
            provider,
            bond,
            share_permille,
            refunds,
            key: k,
        } => {
            let bond = of(bond, Account::ProviderBond(provider));
            let refunds: Vec<(i64, Micros)> = refunds
                .into_iter()
                .map(|(tenant, amount)| (tenant, Micros(amount)))
                .collect();
            Ok(slash(provider, bond, share_permille, &refunds, key(k), at)?.tx)
        }
        Op::Payout {
            provider,
            amount,
            key: k,
        } => payout(provider, Micros(amount), key(k), at).map(Some),
        Op::Replay { pick } if history.is_empty() => {
            let _ = pick;
            Ok(None)
        }
        Op::Replay { pick } => Ok(Some(history[pick % history.len()].clone())),
    }
}

/// The net change `entries` make to `account`.
fn net(entries: &[Entry], account: &Account) -> i128 {
    entries
        .iter()
        .filter(|entry| entry.account == *account)
        .map(|entry| i128::from(entry.amount.0))
        .sum()
}

fn check_invariants(ledger: &Ledger) -> Result<(), TestCaseError> {
    let total: i128 = ledger.balances().map(|(_, balance)| i128::from(balance.0)).sum();
    prop_assert_eq!(total, 0);
    prop_assert_eq!(ledger.total(), Micros::ZERO);
    for (account, balance) in ledger.balances() {
        prop_assert!(
            account.may_go_negative() || balance >= Micros::ZERO,
            "{} is at {}",
            account,
            balance
        );
    }
    prop_assert_eq!(ledger.consistency_check(), Ok(()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_ledger_always_balances(ops in prop::collection::vec(op(), 1..200)) {
        let mut ledger = Ledger::new();
        let mut history: Vec<Transaction> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let before = ledger.clone();
            let Ok(Some(tx)) = build(op, &ledger, &history, step as i64) else {
                prop_assert_eq!(&ledger, &before);
                continue;
            };
            history.push(tx.clone());
            let earlier = ledger.applied(&tx.key).map(<[Entry]>::to_vec);
            let checked = check_transaction(&tx, |account| ledger.balance(account));
            let result = ledger.apply(&tx);
            match (earlier, result) {
                (Some(earlier), Ok(Applied::Duplicate)) => {
                    prop_assert_eq!(earlier, tx.entries.clone());
                    prop_assert_eq!(&ledger, &before, "a replayed key changes nothing");
                }
                (Some(earlier), Err(LedgerError::KeyReused { key })) => {
                    prop_assert_ne!(earlier, tx.entries.clone());
                    prop_assert_eq!(key, tx.key.clone());
                    prop_assert_eq!(&ledger, &before, "a reused key changes nothing");
                }
                (None, Ok(Applied::New)) => {
                    prop_assert_eq!(checked, Ok(()));
                    for entry in &tx.entries {
                        let moved = i128::from(ledger.balance(&entry.account).0) - i128::from(before.balance(&entry.account).0);
                        prop_assert_eq!(moved, net(&tx.entries, &entry.account));
                    }
                    let after = ledger.clone();
                    prop_assert_eq!(ledger.apply(&tx), Ok(Applied::Duplicate));
                    prop_assert_eq!(&ledger, &after, "a replay right away changes nothing");
                }
                (None, Err(error)) => {
                    prop_assert_eq!(checked, Err(error));
                    prop_assert_eq!(&ledger, &before, "a rejected transaction changes nothing");
                }
                (earlier, result) => prop_assert!(false, "key seen before: {:?}, apply gave {:?}", earlier.is_some(), result),
            }
            check_invariants(&ledger)?;
        }
    }

    #[test]
    fn account_keys_round_trip(id in any::<i64>()) {
        for account in [
            Account::TenantAvailable(id),
            Account::Escrow(id),
            Account::ProviderEarnings(id),
            Account::ProviderBond(id),
            Account::PlatformFees,
            Account::PlatformSla,
            Account::External,
        ] {
            prop_assert_eq!(Account::parse(&account.key()), Ok(account));
        }
    }
}
