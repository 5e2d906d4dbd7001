//! Builders: pure functions that turn a business event (a deposit, a job start, a usage record,
//! a slash) into a balanced transaction. Amounts that depend on balances take those balances as
//! arguments, so the caller decides what "current" means and the result is deterministic.

use model::Micros;

use crate::transaction::check_shape;
use crate::{Account, Entry, LedgerError, Transaction, TransactionKind};

/// Fees and slash shares are given in thousandths; this many is the whole.
pub const PERMILLE_WHOLE: u32 = 1000;

/// What the coordinator bills for one accepted, signed usage record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BillableUsage {
    pub tenant: i64,
    pub job: i64,
    pub provider: i64,
    /// Exactly what the record is worth; the ledger bills this and never more.
    pub amount: Micros,
    /// The platform's share of what is billed, in thousandths, rounded down.
    pub fee_permille: u32,
}

/// The outcome of [`usage`]: the transaction (`None` when nothing could be billed) and how the
/// charge split. `billed + unbilled` is the amount asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageCharge {
    pub tx: Option<Transaction>,
    /// Taken from the job's escrow and then the tenant's available balance.
    pub billed: Micros,
    /// What neither could cover; when positive the coordinator stops the job.
    pub unbilled: Micros,
    /// The platform's part of `billed`; the provider earns the rest.
    pub fee: Micros,
}

/// The outcome of [`refund`]: the transaction (`None` when the provider has no earnings) and how
/// much of the asked-for refund it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundPlan {
    pub tx: Option<Transaction>,
    pub refunded: Micros,
    /// What the provider's earnings could not cover.
    pub unrefunded: Micros,
}

/// The outcome of [`slash`]: the transaction (`None` when the bond is empty) and where the
/// slashed money went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlashPlan {
    pub tx: Option<Transaction>,
    /// Taken from the bond.
    pub slashed: Micros,
    /// What each listed tenant is paid, in the order given (zero once the slashed money ran out).
    pub refunds_paid: Vec<(i64, Micros)>,
    /// The rest of the slashed money, to the platform.
    pub to_platform: Micros,
}

/// External → the tenant's available balance: an admin credit, the stand-in for a payment.
pub fn deposit(tenant: i64, amount: Micros, key: impl Into<String>, at: i64) -> Result<Transaction, LedgerError> {
    let amount = positive("deposit", amount)?;
    let memo = format!("deposit of {amount} to tenant {tenant}");
    transfer(
        TransactionKind::Deposit,
        Account::External,
        Account::TenantAvailable(tenant),
        amount,
        key,
        at,
        memo,
    )
}

/// What a job may cost at most: `price_per_gpu_hour × gpu_milli / 1000 × seconds / 3600`,
/// rounded half up to the micro-dollar as `Micros::cost_for` rounds. Pass the job's max price,
/// its GPUs in thousandths (all replicas together) and its max runtime.
pub fn hold_amount(price_per_gpu_hour: Micros, gpu_milli: u64, seconds: u64) -> Result<Micros, LedgerError> {
    let price = positive("price per GPU-hour", price_per_gpu_hour)?;
    // The same sum as `Micros::cost_for`, but checked at every step: its unchecked i128
    // product of an i64 and two u64s can overflow on absurd inputs, and a hold must not panic.
    let micro_gpu_seconds_per_hour: i128 = 1000 * 3600;
    let rounded_micros = i128::from(price.0)
        .checked_mul(i128::from(gpu_milli))
        .and_then(|product| product.checked_mul(i128::from(seconds)))
        .and_then(|product| product.checked_add(micro_gpu_seconds_per_hour / 2))
        .ok_or(LedgerError::Overflow)?
        / micro_gpu_seconds_per_hour;
    i64::try_from(rounded_micros)
        .map(Micros)
        .map_err(|_| LedgerError::Overflow)
}

/// The tenant's available balance → the job's escrow, at job start.
///
/// Holds `min(wanted, tenant_available)`: a tenant who cannot cover the whole max runtime still
/// starts, and usage falls back on the available balance, then stops the job when both are
/// spent. A tenant with nothing available is refused (`InsufficientFunds`).
pub fn hold(
    tenant: i64,
    job: i64,
    wanted: Micros,
    tenant_available: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<Transaction, LedgerError> {
    let wanted = positive("hold", wanted)?;
    let from = Account::TenantAvailable(tenant);
    if tenant_available <= Micros::ZERO {
        return Err(LedgerError::InsufficientFunds {
            account: from,
            balance: tenant_available,
        });
    }
    let amount = wanted.min(tenant_available);
    let memo = format!("hold of {amount} for job {job}");
    transfer(TransactionKind::Hold, from, Account::Escrow(job), amount, key, at, memo)
}

/// The charge for one usage record: from the job's escrow first, then from the tenant's
/// available balance, never more than both hold together; the provider earns what was billed
/// less the platform fee (`billed × fee_permille / 1000`, rounded down, so rounding favours the
/// provider).
pub fn usage(
    bill: &BillableUsage,
    escrow_balance: Micros,
    tenant_available: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<UsageCharge, LedgerError> {
    let amount = positive("usage charge", bill.amount)?;
    let fee_permille = permille("platform fee", bill.fee_permille, 0)?;
    // A negative balance passed in (a caller's mistake) is treated as empty, never as credit.
    let from_escrow = amount.min(escrow_balance.max(Micros::ZERO));
    let from_available = sub(amount, from_escrow)?.min(tenant_available.max(Micros::ZERO));
    let billed = add(from_escrow, from_available)?;
    let unbilled = sub(amount, billed)?;
    let fee = billed
        .scale(u64::from(fee_permille), u64::from(PERMILLE_WHOLE))
        .ok_or(LedgerError::Overflow)?;
    let earned = sub(billed, fee)?;
    let tx = if billed > Micros::ZERO {
        let mut entries = Vec::with_capacity(4);
        push(&mut entries, Account::Escrow(bill.job), negate(from_escrow));
        push(
            &mut entries,
            Account::TenantAvailable(bill.tenant),
            negate(from_available),
        );
        push(&mut entries, Account::ProviderEarnings(bill.provider), earned);
        push(&mut entries, Account::PlatformFees, fee);
        let memo = format!(
            "usage of job {} on provider {}: {billed} billed, fee {fee}",
            bill.job, bill.provider
        );
        Some(transaction(TransactionKind::Usage, key, at, entries, memo)?)
    } else {
        None
    };
    Ok(UsageCharge {
        tx,
        billed,
        unbilled,
        fee,
    })
}

/// The job's escrow → the tenant's available balance, at job end. `None` when the escrow is
/// empty: there is nothing to move, so nothing is recorded (and a retry after a release that
/// landed is naturally a no-op).
pub fn release(
    tenant: i64,
    job: i64,
    escrow_balance: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<Option<Transaction>, LedgerError> {
    if escrow_balance <= Micros::ZERO {
        return Ok(None);
    }
    let memo = format!("release of {escrow_balance} held for job {job}");
    let to = Account::TenantAvailable(tenant);
    transfer(
        TransactionKind::Release,
        Account::Escrow(job),
        to,
        escrow_balance,
        key,
        at,
        memo,
    )
    .map(Some)
}

/// The tenant's available balance → a reservation's escrow, at booking: the whole price of the
/// booked GPU-hours, or nothing (`InsufficientFunds`). Capacity booked ahead is paid for ahead.
pub fn book(
    tenant: i64,
    reservation: i64,
    amount: Micros,
    tenant_available: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<Transaction, LedgerError> {
    let amount = positive("booking hold", amount)?;
    let from = Account::TenantAvailable(tenant);
    if tenant_available < amount {
        return Err(LedgerError::InsufficientFunds {
            account: from,
            balance: tenant_available,
        });
    }
    let memo = format!("hold of {amount} for reservation {reservation}");
    transfer(
        TransactionKind::Hold,
        from,
        Account::ReservationEscrow(reservation),
        amount,
        key,
        at,
        memo,
    )
}

/// A reservation's escrow → a provider, for the GPU-hours its nodes held for the booking (or a
/// share of a late cancellation's forfeit): the provider earns `amount` less the platform fee
/// (rounded down, as usage is). Never more than the escrow holds; `None` when that is nothing.
pub fn capacity_payment(
    reservation: i64,
    provider: i64,
    amount: Micros,
    fee_permille: u32,
    escrow_balance: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<Option<Transaction>, LedgerError> {
    let fee_permille = permille("platform fee", fee_permille, 0)?;
    let paid = amount.max(Micros::ZERO).min(escrow_balance.max(Micros::ZERO));
    if paid <= Micros::ZERO {
        return Ok(None);
    }
    let fee = paid
        .scale(u64::from(fee_permille), u64::from(PERMILLE_WHOLE))
        .ok_or(LedgerError::Overflow)?;
    let mut entries = Vec::with_capacity(3);
    push(&mut entries, Account::ReservationEscrow(reservation), negate(paid));
    push(&mut entries, Account::ProviderEarnings(provider), sub(paid, fee)?);
    push(&mut entries, Account::PlatformFees, fee);
    let memo = format!("capacity held for reservation {reservation} by provider {provider}: {paid}, fee {fee}");
    transaction(TransactionKind::Usage, key, at, entries, memo).map(Some)
}

/// A reservation's escrow → the tenant's available balance: a refund (a cancellation, a node
/// lost and not replaced, the rest at the end). Never more than the escrow holds; `None` when
/// that is nothing.
pub fn reservation_release(
    tenant: i64,
    reservation: i64,
    amount: Micros,
    escrow_balance: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<Option<Transaction>, LedgerError> {
    let released = amount.max(Micros::ZERO).min(escrow_balance.max(Micros::ZERO));
    if released <= Micros::ZERO {
        return Ok(None);
    }
    let memo = format!("release of {released} held for reservation {reservation}");
    transfer(
        TransactionKind::Release,
        Account::ReservationEscrow(reservation),
        Account::TenantAvailable(tenant),
        released,
        key,
        at,
        memo,
    )
    .map(Some)
}

/// The SLA pot → the tenant's available balance: a credit for a gold SLA breach. The pot may go
/// negative; the platform owes it.
pub fn sla_credit(tenant: i64, amount: Micros, key: impl Into<String>, at: i64) -> Result<Transaction, LedgerError> {
    let amount = positive("SLA credit", amount)?;
    let memo = format!("SLA credit of {amount} to tenant {tenant}");
    transfer(
        TransactionKind::SlaCredit,
        Account::PlatformSla,
        Account::TenantAvailable(tenant),
        amount,
        key,
        at,
        memo,
    )
}

/// The provider's earnings → the tenant's available balance: clawback of usage that should not
/// have been billed, capped by what the provider has earned and not yet been paid.
pub fn refund(
    tenant: i64,
    provider: i64,
    amount: Micros,
    provider_earnings: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<RefundPlan, LedgerError> {
    let amount = positive("refund", amount)?;
    let refunded = amount.min(provider_earnings.max(Micros::ZERO));
    let unrefunded = sub(amount, refunded)?;
    let tx = if refunded > Micros::ZERO {
        let memo = format!("refund of {refunded} from provider {provider} to tenant {tenant}");
        let (from, to) = (Account::ProviderEarnings(provider), Account::TenantAvailable(tenant));
        Some(transfer(TransactionKind::Refund, from, to, refunded, key, at, memo)?)
    } else {
        None
    };
    Ok(RefundPlan {
        tx,
        refunded,
        unrefunded,
    })
}

/// The provider's earnings → its bond.
pub fn bond_post(provider: i64, amount: Micros, key: impl Into<String>, at: i64) -> Result<Transaction, LedgerError> {
    let amount = positive("bond", amount)?;
    let memo = format!("bond of {amount} posted by provider {provider} from earnings");
    let (from, to) = (Account::ProviderEarnings(provider), Account::ProviderBond(provider));
    transfer(TransactionKind::BondPost, from, to, amount, key, at, memo)
}

/// External → the provider's bond: a bond paid in from outside.
pub fn bond_post_external(
    provider: i64,
    amount: Micros,
    key: impl Into<String>,
    at: i64,
) -> Result<Transaction, LedgerError> {
    let amount = positive("bond", amount)?;
    let memo = format!("bond of {amount} paid in by provider {provider}");
    transfer(
        TransactionKind::BondPost,
        Account::External,
        Account::ProviderBond(provider),
        amount,
        key,
        at,
        memo,
    )
}

/// Takes `share_permille` thousandths of the bond (rounded down) for proven fraud, pays the
/// listed tenants back out of it in the order given (each capped by what is left), and gives
/// the rest to the platform. `None` when that share of the bond is zero.
pub fn slash(
    provider: i64,
    bond_balance: Micros,
    share_permille: u32,
    refunds: &[(i64, Micros)],
    key: impl Into<String>,
    at: i64,
) -> Result<SlashPlan, LedgerError> {
    let share_permille = permille("slash share", share_permille, 1)?;
    for &(_, amount) in refunds {
        positive("refund to a harmed tenant", amount)?;
    }
    let slashed = bond_balance
        .max(Micros::ZERO)
        .scale(u64::from(share_permille), u64::from(PERMILLE_WHOLE))
        .ok_or(LedgerError::Overflow)?;
    let mut entries = Vec::new();
    push(&mut entries, Account::ProviderBond(provider), negate(slashed));
    let mut left = slashed;
    let mut refunds_paid = Vec::with_capacity(refunds.len());
    for &(tenant, wanted) in refunds {
        let paid = wanted.min(left);
        left = sub(left, paid)?;
        push(&mut entries, Account::TenantAvailable(tenant), paid);
        refunds_paid.push((tenant, paid));
    }
    push(&mut entries, Account::PlatformFees, left);
    let tx = if slashed > Micros::ZERO {
        let memo = format!("slash of {slashed} ({share_permille} permille) from the bond of provider {provider}");
        Some(transaction(TransactionKind::Slash, key, at, entries, memo)?)
    } else {
        None
    };
    Ok(SlashPlan {
        tx,
        slashed,
        refunds_paid,
        to_platform: left,
    })
}

/// The provider's earnings → External: paying a provider out.
pub fn payout(provider: i64, amount: Micros, key: impl Into<String>, at: i64) -> Result<Transaction, LedgerError> {
    let amount = positive("payout", amount)?;
    let memo = format!("payout of {amount} to provider {provider}");
    transfer(
        TransactionKind::Payout,
        Account::ProviderEarnings(provider),
        Account::External,
        amount,
        key,
        at,
        memo,
    )
}

/// A two-entry movement of a positive `amount` from one account to another.
fn transfer(
    kind: TransactionKind,
    from: Account,
    to: Account,
    amount: Micros,
    key: impl Into<String>,
    at: i64,
    memo: String,
) -> Result<Transaction, LedgerError> {
    let entries = vec![
        Entry {
            account: from,
            amount: negate(amount),
        },
        Entry { account: to, amount },
    ];
    transaction(kind, key, at, entries, memo)
}

/// Assembles a transaction and checks its shape, so no builder hands out one the ledger would
/// refuse whatever the balances (an empty key, too many entries).
fn transaction(
    kind: TransactionKind,
    key: impl Into<String>,
    at: i64,
    entries: Vec<Entry>,
    memo: String,
) -> Result<Transaction, LedgerError> {
    let tx = Transaction {
        key: key.into(),
        kind,
        at,
        entries,
        memo,
    };
    check_shape(&tx)?;
    Ok(tx)
}

fn positive(what: &'static str, amount: Micros) -> Result<Micros, LedgerError> {
    if amount > Micros::ZERO {
        Ok(amount)
    } else {
        Err(LedgerError::NonPositiveAmount { what, amount })
    }
}

fn permille(what: &'static str, permille: u32, min: u32) -> Result<u32, LedgerError> {
    if (min..=PERMILLE_WHOLE).contains(&permille) {
        Ok(permille)
    } else {
        Err(LedgerError::PermilleOutOfRange { what, permille, min })
    }
}

/// Adds an entry unless its amount is zero: zero entries say nothing and are refused.
fn push(entries: &mut Vec<Entry>, account: Account, amount: Micros) {
    if amount != Micros::ZERO {
        entries.push(Entry { account, amount });
    }
}

/// The debit side of a non-negative amount; cannot overflow (only `i64::MIN` has no negation).
fn negate(amount: Micros) -> Micros {
    debug_assert!(amount >= Micros::ZERO, "only non-negative amounts are debited");
    Micros(-amount.0)
}

fn add(a: Micros, b: Micros) -> Result<Micros, LedgerError> {
    a.checked_add(b).ok_or(LedgerError::Overflow)
}

fn sub(a: Micros, b: Micros) -> Result<Micros, LedgerError> {
    a.checked_sub(b).ok_or(LedgerError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ENTRIES_PER_TRANSACTION_MAX;

    const T1: Account = Account::TenantAvailable(1);
    const T2: Account = Account::TenantAvailable(2);
    const ESCROW: Account = Account::Escrow(9);

    #[test]
    fn a_booking_holds_its_whole_price_or_nothing() {
        let held = book(1, 3, Micros(5_000_000), Micros(5_000_000), "book", 0).expect("covered");
        assert_eq!(held.entries[1].account, Account::ReservationEscrow(3));
        assert_eq!(held.entries[1].amount, Micros(5_000_000));
        assert!(matches!(
            book(1, 3, Micros(5_000_001), Micros(5_000_000), "book", 0),
            Err(LedgerError::InsufficientFunds { .. })
        ));
    }

    #[test]
    fn capacity_is_paid_from_the_reservation_escrow_less_the_fee_and_never_beyond_it() {
        let paid = capacity_payment(3, 7, Micros(1_000_000), 100, Micros(600_000), "pay", 0)
            .expect("builds")
            .expect("something to pay");
        let amount_of = |account: Account| {
            paid.entries
                .iter()
                .find(|entry| entry.account == account)
                .map(|entry| entry.amount)
        };
        assert_eq!(amount_of(Account::ReservationEscrow(3)), Some(Micros(-600_000)));
        assert_eq!(amount_of(Account::ProviderEarnings(7)), Some(Micros(540_000)));
        assert_eq!(amount_of(Account::PlatformFees), Some(Micros(60_000)));
        assert_eq!(
            capacity_payment(3, 7, Micros(1), 100, Micros::ZERO, "pay", 0).expect("builds"),
            None
        );
        let back = reservation_release(1, 3, Micros(900), Micros(500), "back", 0)
            .expect("builds")
            .expect("something held");
        assert_eq!(
            back.entries[1],
            Entry {
                account: T1,
                amount: Micros(500)
            }
        );
    }
    const EARNINGS: Account = Account::ProviderEarnings(3);
    const BOND: Account = Account::ProviderBond(3);
    const FEES: Account = Account::PlatformFees;
    const SLA: Account = Account::PlatformSla;
    const EXTERNAL: Account = Account::External;

    /// Entries as data: each account with its signed amount in micros.
    type Entries<'a> = &'a [(Account, i64)];
    /// A builder's expected output: no transaction, or its kind and entries.
    type Expected<'a> = Option<(TransactionKind, Entries<'a>)>;

    /// Compares what a builder made with the expected kind and entries, given as data.
    fn check(built: Result<impl Into<Option<Transaction>>, LedgerError>, expect: Result<Expected, LedgerError>) {
        let built = built.map(|tx| {
            tx.into().map(|tx| {
                assert_eq!(tx.key, "key");
                assert_eq!(tx.at, 7);
                assert_eq!(check_shape(&tx), Ok(()));
                let entries: Vec<(Account, i64)> =
                    tx.entries.iter().map(|entry| (entry.account, entry.amount.0)).collect();
                (tx.kind, entries)
            })
        });
        let expect = expect.map(|tx| tx.map(|(kind, entries)| (kind, entries.to_vec())));
        assert_eq!(built, expect);
    }

    fn non_positive(what: &'static str, amount: i64) -> LedgerError {
        LedgerError::NonPositiveAmount {
            what,
            amount: Micros(amount),
        }
    }

    #[test]
    fn deposit_moves_money_in_from_outside() {
        use TransactionKind::Deposit;
        check(
            deposit(1, Micros(100), "key", 7),
            Ok(Some((Deposit, &[(EXTERNAL, -100), (T1, 100)]))),
        );
        check(deposit(1, Micros(0), "key", 7), Err(non_positive("deposit", 0)));
        check(deposit(1, Micros(-5), "key", 7), Err(non_positive("deposit", -5)));
        check(
            deposit(1, Micros(i64::MIN), "key", 7),
            Err(non_positive("deposit", i64::MIN)),
        );
        check(deposit(1, Micros(100), "", 7), Err(LedgerError::EmptyKey));
    }

    #[test]
    fn hold_amount_is_max_price_times_gpus_times_runtime() {
        // $2 per GPU-hour, 8 GPUs, one hour: $16.
        assert_eq!(hold_amount(Micros(2_000_000), 8000, 3600), Ok(Micros(16_000_000)));
        // A quarter GPU for 90 minutes at $3.60: $1.35.
        assert_eq!(hold_amount(Micros(3_600_000), 250, 5400), Ok(Micros(1_350_000)));
        // Agrees with `Micros::cost_for` wherever that does not overflow.
        for (price, gpu_milli, seconds) in [(1, 1, 1), (1, 1000, 1800), (2_100_000, 250, 7), (999_999, 3, 1_000_001)] {
            assert_eq!(
                hold_amount(Micros(price), gpu_milli, seconds).ok(),
                Micros(price).cost_for(gpu_milli, seconds)
            );
        }
        assert_eq!(
            hold_amount(Micros(0), 1000, 60),
            Err(non_positive("price per GPU-hour", 0))
        );
        assert_eq!(hold_amount(Micros(i64::MAX), 1000, 3601), Err(LedgerError::Overflow));
        assert_eq!(
            hold_amount(Micros(i64::MAX), u64::MAX, u64::MAX),
            Err(LedgerError::Overflow)
        );
    }

    #[test]
    fn hold_is_capped_by_the_available_balance() {
        use TransactionKind::Hold;
        check(
            hold(1, 9, Micros(100), Micros(500), "key", 7),
            Ok(Some((Hold, &[(T1, -100), (ESCROW, 100)]))),
        );
        check(
            hold(1, 9, Micros(500), Micros(100), "key", 7),
            Ok(Some((Hold, &[(T1, -100), (ESCROW, 100)]))),
        );
        let broke = LedgerError::InsufficientFunds {
            account: T1,
            balance: Micros(0),
        };
        check(hold(1, 9, Micros(500), Micros(0), "key", 7), Err(broke));
        check(
            hold(1, 9, Micros(0), Micros(100), "key", 7),
            Err(non_positive("hold", 0)),
        );
    }

    /// Bills `amount` with the given fee against the given escrow and available balance, and
    /// checks the split as well as the entries.
    fn check_usage(
        (amount, fee_permille): (i64, u32),
        (escrow, available): (i64, i64),
        expect: Result<(Entries, i64, i64, i64), LedgerError>,
    ) {
        let bill = BillableUsage {
            tenant: 1,
            job: 9,
            provider: 3,
            amount: Micros(amount),
            fee_permille,
        };
        let charge = usage(&bill, Micros(escrow), Micros(available), "key", 7);
        let split = charge
            .as_ref()
            .map(|charge| (charge.billed.0, charge.unbilled.0, charge.fee.0))
            .map_err(Clone::clone);
        assert_eq!(
            split,
            expect.clone().map(|(_, billed, unbilled, fee)| (billed, unbilled, fee))
        );
        let entries = expect.map(|(entries, ..)| (!entries.is_empty()).then_some((TransactionKind::Usage, entries)));
        check(charge.map(|charge| charge.tx), entries);
    }

    #[test]
    fn usage_takes_escrow_first_then_the_available_balance() {
        // Escrow covers it all: 10% fee.
        check_usage(
            (100, 100),
            (500, 0),
            Ok((&[(ESCROW, -100), (EARNINGS, 90), (FEES, 10)], 100, 0, 10)),
        );
        // Escrow runs out, the available balance covers the rest.
        check_usage(
            (100, 100),
            (30, 500),
            Ok((&[(ESCROW, -30), (T1, -70), (EARNINGS, 90), (FEES, 10)], 100, 0, 10)),
        );
        // Both run out: 80 billed, 20 unbilled, the fee on what was billed.
        check_usage(
            (100, 100),
            (30, 50),
            Ok((&[(ESCROW, -30), (T1, -50), (EARNINGS, 72), (FEES, 8)], 80, 20, 8)),
        );
        // Nothing to take from: no transaction, all unbilled.
        check_usage((100, 100), (0, 0), Ok((&[], 0, 100, 0)));
        // Negative balances passed in are treated as empty.
        check_usage((100, 100), (-50, -50), Ok((&[], 0, 100, 0)));
    }

    #[test]
    fn the_usage_fee_rounds_down() {
        check_usage(
            (19, 100),
            (100, 0),
            Ok((&[(ESCROW, -19), (EARNINGS, 18), (FEES, 1)], 19, 0, 1)),
        );
        check_usage((9, 100), (100, 0), Ok((&[(ESCROW, -9), (EARNINGS, 9)], 9, 0, 0)));
        // No fee, and the whole charge as fee: the zero side is left out.
        check_usage((50, 0), (100, 0), Ok((&[(ESCROW, -50), (EARNINGS, 50)], 50, 0, 0)));
        check_usage((50, 1000), (100, 0), Ok((&[(ESCROW, -50), (FEES, 50)], 50, 0, 50)));
        // Huge amounts do not overflow.
        let max = i64::MAX;
        let fee = (i128::from(max) * 999 / 1000) as i64;
        check_usage(
            (max, 999),
            (max, max),
            Ok((&[(ESCROW, -max), (EARNINGS, max - fee), (FEES, fee)], max, 0, fee)),
        );
    }

    #[test]
    fn usage_refuses_bad_amounts_and_fees() {
        check_usage((0, 100), (100, 0), Err(non_positive("usage charge", 0)));
        check_usage((-1, 100), (100, 0), Err(non_positive("usage charge", -1)));
        let bad_fee = LedgerError::PermilleOutOfRange {
            what: "platform fee",
            permille: 1001,
            min: 0,
        };
        check_usage((100, 1001), (100, 0), Err(bad_fee));
    }

    #[test]
    fn release_returns_the_rest_of_the_escrow() {
        use TransactionKind::Release;
        check(
            release(1, 9, Micros(70), "key", 7),
            Ok(Some((Release, &[(ESCROW, -70), (T1, 70)]))),
        );
        check(release(1, 9, Micros(0), "key", 7), Ok(None));
        check(release(1, 9, Micros(-5), "key", 7), Ok(None));
    }

    #[test]
    fn sla_credits_come_from_the_platform_pot() {
        use TransactionKind::SlaCredit;
        check(
            sla_credit(1, Micros(25), "key", 7),
            Ok(Some((SlaCredit, &[(SLA, -25), (T1, 25)]))),
        );
        check(sla_credit(1, Micros(0), "key", 7), Err(non_positive("SLA credit", 0)));
    }

    /// Refunds `amount` against the provider's `earnings`; `Ok` gives the refunded part.
    fn check_refund(amount: i64, earnings: i64, expect: Result<(Entries, i64, i64), LedgerError>) {
        let plan = refund(1, 3, Micros(amount), Micros(earnings), "key", 7);
        let split = plan
            .as_ref()
            .map(|plan| (plan.refunded.0, plan.unrefunded.0))
            .map_err(Clone::clone);
        assert_eq!(
            split,
            expect.clone().map(|(_, refunded, unrefunded)| (refunded, unrefunded))
        );
        let entries = expect.map(|(entries, ..)| (!entries.is_empty()).then_some((TransactionKind::Refund, entries)));
        check(plan.map(|plan| plan.tx), entries);
    }

    #[test]
    fn refunds_are_capped_by_the_providers_earnings() {
        check_refund(50, 80, Ok((&[(EARNINGS, -50), (T1, 50)], 50, 0)));
        check_refund(50, 30, Ok((&[(EARNINGS, -30), (T1, 30)], 30, 20)));
        check_refund(50, 0, Ok((&[], 0, 50)));
        check_refund(0, 80, Err(non_positive("refund", 0)));
    }

    #[test]
    fn bonds_and_payouts_move_provider_money() {
        use TransactionKind::{BondPost, Payout};
        check(
            bond_post(3, Micros(40), "key", 7),
            Ok(Some((BondPost, &[(EARNINGS, -40), (BOND, 40)]))),
        );
        check(
            bond_post_external(3, Micros(40), "key", 7),
            Ok(Some((BondPost, &[(EXTERNAL, -40), (BOND, 40)]))),
        );
        check(
            payout(3, Micros(40), "key", 7),
            Ok(Some((Payout, &[(EARNINGS, -40), (EXTERNAL, 40)]))),
        );
        check(bond_post(3, Micros(-1), "key", 7), Err(non_positive("bond", -1)));
        check(bond_post_external(3, Micros(0), "key", 7), Err(non_positive("bond", 0)));
        check(payout(3, Micros(0), "key", 7), Err(non_positive("payout", 0)));
    }

    /// Slashes `share_permille` of `bond` with the given refunds; `Ok` gives the entries and
    /// what each tenant was paid.
    fn check_slash(
        (bond, share_permille): (i64, u32),
        refunds: &[(i64, i64)],
        expect: Result<(Entries, &[i64]), LedgerError>,
    ) {
        let refunds: Vec<(i64, Micros)> = refunds
            .iter()
            .map(|&(tenant, amount)| (tenant, Micros(amount)))
            .collect();
        let plan = slash(3, Micros(bond), share_permille, &refunds, "key", 7);
        if let (Ok(plan), Ok((_, paid))) = (&plan, &expect) {
            let got: Vec<i64> = plan.refunds_paid.iter().map(|(_, paid)| paid.0).collect();
            assert_eq!(got, *paid);
            let paid_total: i64 = paid.iter().sum();
            assert_eq!(plan.to_platform.0 + paid_total, plan.slashed.0);
        }
        let entries = expect.map(|(entries, _)| (!entries.is_empty()).then_some((TransactionKind::Slash, entries)));
        check(plan.map(|plan| plan.tx), entries);
    }

    #[test]
    fn slashing_refunds_tenants_in_order_then_pays_the_platform() {
        check_slash(
            (1000, 500),
            &[(1, 200), (2, 400), (3, 100)],
            Ok((&[(BOND, -500), (T1, 200), (T2, 300)], &[200, 300, 0])),
        );
        check_slash(
            (1000, 100),
            &[(1, 30)],
            Ok((&[(BOND, -100), (T1, 30), (FEES, 70)], &[30])),
        );
        check_slash((1000, 1000), &[], Ok((&[(BOND, -1000), (FEES, 1000)], &[])));
        // The share rounds down; an empty bond gives nothing to move.
        check_slash((9, 100), &[(1, 5)], Ok((&[], &[0])));
        check_slash((0, 500), &[(1, 5)], Ok((&[], &[0])));
        check_slash(
            (i64::MAX, 1000),
            &[(1, i64::MAX)],
            Ok((&[(BOND, -i64::MAX), (T1, i64::MAX)], &[i64::MAX])),
        );
    }

    #[test]
    fn slashing_refuses_bad_shares_and_refunds() {
        for permille in [0, 1001] {
            let bad_share = LedgerError::PermilleOutOfRange {
                what: "slash share",
                permille,
                min: 1,
            };
            check_slash((1000, permille), &[], Err(bad_share));
        }
        check_slash(
            (1000, 500),
            &[(1, 10), (2, 0)],
            Err(non_positive("refund to a harmed tenant", 0)),
        );
        let many: Vec<(i64, i64)> = (0..ENTRIES_PER_TRANSACTION_MAX as i64)
            .map(|tenant| (tenant, 1))
            .collect();
        let too_many = LedgerError::TooManyEntries {
            key: "key".into(),
            entries: ENTRIES_PER_TRANSACTION_MAX + 2,
            max: ENTRIES_PER_TRANSACTION_MAX,
        };
        check_slash((i64::MAX, 1000), &many, Err(too_many));
    }
}
