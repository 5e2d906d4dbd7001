//! A job's money from deposit to payout, through the builders and the ledger, with the
//! balances after each step written out as data.

use ledger::{
    Account, Applied, BillableUsage, Ledger, LedgerError, Micros, Transaction, bond_post_external, deposit, hold,
    payout, refund, release, sla_credit, slash, usage,
};

const TENANT: Account = Account::TenantAvailable(1);
const ESCROW: Account = Account::Escrow(9);
const EARNINGS: Account = Account::ProviderEarnings(3);
const BOND: Account = Account::ProviderBond(3);
const FEES: Account = Account::PlatformFees;
const SLA: Account = Account::PlatformSla;
const EXTERNAL: Account = Account::External;

/// Applies `tx` as new and checks every balance afterwards (accounts at zero may be omitted).
fn check(ledger: &mut Ledger, tx: &Transaction, expect: &[(Account, i64)]) {
    assert_eq!(ledger.apply(tx), Ok(Applied::New), "{}", tx.key);
    let balances: Vec<(Account, i64)> = ledger
        .balances()
        .filter(|(_, balance)| *balance != Micros::ZERO)
        .map(|(account, balance)| (*account, balance.0))
        .collect();
    let mut expect = expect.to_vec();
    expect.sort();
    assert_eq!(balances, expect, "after {}", tx.key);
    assert_eq!(ledger.total(), Micros::ZERO);
    assert_eq!(ledger.consistency_check(), Ok(()));
}

fn bill(amount: i64) -> BillableUsage {
    BillableUsage {
        tenant: 1,
        job: 9,
        provider: 3,
        amount: Micros(amount),
        fee_permille: 100,
    }
}

#[test]
fn a_job_from_deposit_to_payout() {
    let mut ledger = Ledger::new();
    let tx = deposit(1, Micros(1_000), "deposit:1", 0).unwrap();
    check(&mut ledger, &tx, &[(EXTERNAL, -1_000), (TENANT, 1_000)]);

    let tx = hold(1, 9, Micros(600), ledger.balance(&TENANT), "hold:job-9", 1).unwrap();
    check(&mut ledger, &tx, &[(EXTERNAL, -1_000), (TENANT, 400), (ESCROW, 600)]);

    let charge = usage(
        &bill(500),
        ledger.balance(&ESCROW),
        ledger.balance(&TENANT),
        "usage:job-9:seq-1",
        2,
    )
    .unwrap();
    let tx = charge.tx.unwrap();
    check(
        &mut ledger,
        &tx,
        &[
            (EXTERNAL, -1_000),
            (TENANT, 400),
            (ESCROW, 100),
            (EARNINGS, 450),
            (FEES, 50),
        ],
    );
    // The same usage record delivered again is billed once.
    assert_eq!(ledger.apply(&tx), Ok(Applied::Duplicate));

    // The escrow runs out mid-record: the rest comes from the available balance.
    let charge = usage(
        &bill(300),
        ledger.balance(&ESCROW),
        ledger.balance(&TENANT),
        "usage:job-9:seq-2",
        3,
    )
    .unwrap();
    assert_eq!((charge.billed, charge.unbilled), (Micros(300), Micros::ZERO));
    let tx = charge.tx.unwrap();
    check(
        &mut ledger,
        &tx,
        &[(EXTERNAL, -1_000), (TENANT, 200), (EARNINGS, 720), (FEES, 80)],
    );

    // Nothing is left in escrow, so the job end records nothing.
    assert_eq!(release(1, 9, ledger.balance(&ESCROW), "release:job-9", 4), Ok(None));

    // A gold SLA breach: the platform's pot pays, and may go negative.
    let tx = sla_credit(1, Micros(30), "sla:job-9", 5).unwrap();
    check(
        &mut ledger,
        &tx,
        &[
            (EXTERNAL, -1_000),
            (TENANT, 230),
            (EARNINGS, 720),
            (FEES, 80),
            (SLA, -30),
        ],
    );

    // 100 of the usage should not have been billed (the node was lost): clawed back.
    let plan = refund(1, 3, Micros(100), ledger.balance(&EARNINGS), "refund:job-9:seq-2", 6).unwrap();
    let tx = plan.tx.unwrap();
    check(
        &mut ledger,
        &tx,
        &[
            (EXTERNAL, -1_000),
            (TENANT, 330),
            (EARNINGS, 620),
            (FEES, 80),
            (SLA, -30),
        ],
    );

    let tx = payout(3, Micros(620), "payout:3:1", 7).unwrap();
    check(
        &mut ledger,
        &tx,
        &[(EXTERNAL, -380), (TENANT, 330), (FEES, 80), (SLA, -30)],
    );
    // Paying out again under a new key would overdraw the earnings.
    let again = payout(3, Micros(1), "payout:3:2", 8).unwrap();
    let overdrawn = LedgerError::LimitBroken {
        account: EARNINGS,
        balance_after: Micros(-1),
    };
    assert_eq!(ledger.apply(&again), Err(overdrawn));
}

#[test]
fn a_fraudulent_provider_is_slashed_and_the_tenant_repaid() {
    let mut ledger = Ledger::new();
    let tx = bond_post_external(3, Micros(10_000), "bond:3", 0).unwrap();
    check(&mut ledger, &tx, &[(EXTERNAL, -10_000), (BOND, 10_000)]);
    let plan = slash(
        3,
        ledger.balance(&BOND),
        250,
        &[(1, Micros(1_500))],
        "slash:3:canary-7",
        1,
    )
    .unwrap();
    assert_eq!(plan.slashed, Micros(2_500));
    assert_eq!(plan.to_platform, Micros(1_000));
    let tx = plan.tx.unwrap();
    check(
        &mut ledger,
        &tx,
        &[(EXTERNAL, -10_000), (BOND, 7_500), (TENANT, 1_500), (FEES, 1_000)],
    );
}
