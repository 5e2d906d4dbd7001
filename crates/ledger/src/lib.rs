//! Fallow's ledger: double-entry accounting in integer micro-dollars, where every movement is a
//! balanced transaction under an idempotency key. Pure: no IO, no clocks, no floats.
//!
//! # Model
//!
//! Each [`Account`] has a balance in [`Micros`]. A [`Transaction`] is a list of [`Entry`]s whose
//! amounts sum to zero; a positive amount raises that account's balance. So the sum of all
//! balances is always zero, and money is only ever moved, never made: it enters from
//! [`Account::External`] (which goes negative) and leaves back to it. Every account but the SLA
//! pot and the outside world has a floor of zero, and a transaction that would push one below
//! it is refused whole.
//!
//! Applying a transaction whose key was applied before is a no-op ([`Applied::Duplicate`]) when
//! its entries are the same, and refused ([`LedgerError::KeyReused`]) when they differ. Builders
//! whose amounts depend on balances (`hold`, `usage`, `release`, `refund`, `slash`) give
//! different entries once the first attempt has landed, so a caller retrying a write retries the
//! transaction it first built (or looks the key up first), it does not rebuild it.
//!
//! # Rules the builders follow
//!
//! - **Usage bills exactly the amount passed.** The ledger cannot know which seconds a tenant
//!   got; the coordinator passes only usage it accepts (never time lost to a failed node or a
//!   preemption before the grace), and [`usage`] bills that amount, never more: first from the
//!   job's escrow, then from the tenant's available balance, and whatever both cannot cover is
//!   returned as `unbilled` so the coordinator can stop the job. The fee is
//!   `billed × fee_permille / 1000` rounded down; the provider earns the rest.
//! - **A hold is capped by the balance.** [`hold`] holds `min(wanted, available)` and refuses a
//!   tenant with nothing available; [`hold_amount`] computes `wanted` from the job's max price,
//!   GPUs and max runtime.
//! - **Nothing to move, nothing recorded.** [`release`] of an empty escrow, [`usage`] with nothing
//!   to bill, [`refund`] from empty earnings and [`slash`] of an empty bond return no transaction
//!   (`None`) rather than an empty one.
//! - **Caps are reported, not hidden.** [`refund`] is capped by the provider's earnings and says
//!   what it could not cover; [`slash`] pays listed tenants in order out of the slashed share and
//!   gives the rest to the platform.
//! - Amounts a caller chooses must be positive ([`LedgerError::NonPositiveAmount`]); all
//!   arithmetic is checked ([`LedgerError::Overflow`]), never a panic.

mod account;
mod build;
mod error;
mod ledger;
mod transaction;

pub use account::Account;
pub use build::{
    BillableUsage, PERMILLE_WHOLE, RefundPlan, SlashPlan, UsageCharge, bond_post, bond_post_external, book,
    capacity_payment, deposit, hold, hold_amount, payout, refund, release, reservation_release, sla_credit, slash,
    usage,
};
pub use error::LedgerError;
pub use ledger::{Applied, Ledger};
pub use model::Micros;
pub use transaction::{
    ENTRIES_PER_TRANSACTION_MAX, Entry, KEY_BYTES_MAX, MEMO_BYTES_MAX, Transaction, TransactionKind, check_transaction,
};
