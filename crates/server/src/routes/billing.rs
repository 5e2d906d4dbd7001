//! A tenant's money: balance, statement and monthly invoices (admins name the account).

use std::sync::Arc;

use api::*;
use axum::Json;
use axum::extract::State;
use ledger::Account;
use serde::Deserialize;
use store::Role;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, Query};
use crate::state::{AppState, Caller};

use super::{AppStateRef, require};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountQuery {
    pub(super) account_id: Option<i64>,
}

fn account_in_view(caller: &Caller, query: &AccountQuery) -> ApiResult<i64> {
    match query.account_id {
        Some(id) if caller.role == Role::Admin => Ok(id),
        Some(id) if id != caller.account_id => Err(ApiError::NotFound(format!("account {id} not found"))),
        _ => Ok(caller.account_id),
    }
}

pub async fn balance(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(query): Query<AccountQuery>,
) -> ApiResult<Json<BalanceView>> {
    let id = account_in_view(&caller, &query)?;
    // Held for jobs and for bookings ahead alike.
    let mut escrow: i64 = 0;
    for prefix in ["escrow:job:", "escrow:reservation:"] {
        escrow += state
            .store
            .balances(prefix)
            .await?
            .into_iter()
            .map(|row| row.balance)
            .sum::<i64>();
    }
    let escrow = if caller.role == Role::Admin && query.account_id.is_none() {
        escrow
    } else {
        let mut own = 0;
        for job in state.store.jobs_of_tenant(id, None, PAGE_SIZE_MAX).await? {
            if !job.state.is_final() {
                own += state.store.balance(&Account::Escrow(job.id).key()).await?;
            }
        }
        for reservation in state.store.reservations_of_tenant(id).await? {
            if reservation.is_live() {
                own += state
                    .store
                    .balance(&Account::ReservationEscrow(reservation.id).key())
                    .await?;
            }
        }
        own
    };
    Ok(Json(BalanceView {
        account_id: id,
        available_micros: state.store.balance(&Account::TenantAvailable(id).key()).await?,
        escrow_micros: escrow,
        earnings_micros: state.store.balance(&Account::ProviderEarnings(id).key()).await?,
        bond_micros: state.store.balance(&Account::ProviderBond(id).key()).await?,
    }))
}

pub async fn statement(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(query): Query<AccountQuery>,
) -> ApiResult<Json<StatementView>> {
    let id = account_in_view(&caller, &query)?;
    let account = match state.store.account(id).await?.map(|account| account.role) {
        Some(Role::Provider) => Account::ProviderEarnings(id),
        _ => Account::TenantAvailable(id),
    };
    let lines = state
        .store
        .ledger_entries_of(&account.key(), 1000)
        .await?
        .into_iter()
        .map(|entry| LedgerLine {
            transaction: entry.tx_key,
            kind: entry.kind,
            amount_micros: entry.amount,
            at_us: entry.at,
        })
        .collect();
    Ok(Json(StatementView { account_id: id, lines }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvoiceQuery {
    /// The month, `YYYY-MM` (UTC).
    period: String,
    account_id: Option<i64>,
}

/// Days from 1970-01-01 to the first of `month` in `year` (proleptic Gregorian).
fn days_to_month(year: i64, month: i64) -> i64 {
    model::time::days_from_civil(year, month, 1)
}

/// The first microsecond of a `YYYY-MM` month and of the next one.
pub fn month_bounds(period: &str) -> ApiResult<(i64, i64)> {
    let bad = || {
        ApiError::BadRequest(format!(
            "period: {period:?} is not a month as YYYY-MM (1970-01 to 9999-12)"
        ))
    };
    let (year, month) = period.split_once('-').ok_or_else(bad)?;
    if year.len() != 4 || month.len() != 2 || !(year.bytes().chain(month.bytes())).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (year, month): (i64, i64) = (year.parse().map_err(|_| bad())?, month.parse().map_err(|_| bad())?);
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) {
        return Err(bad());
    }
    let (next_year, next_month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
    const DAY_US: i64 = 86_400_000_000;
    Ok((
        days_to_month(year, month) * DAY_US,
        days_to_month(next_year, next_month) * DAY_US,
    ))
}

/// A tenant's invoice for a month (admins name the tenant with `account_id`).
pub async fn invoice(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(query): Query<InvoiceQuery>,
) -> ApiResult<Json<InvoiceView>> {
    require(&caller, &[Role::Tenant, Role::Admin])?;
    if caller.role == Role::Admin && query.account_id.is_none() {
        // The caller's own invoice, and an admin's account has none.
        return Err(ApiError::NotFound(
            "an admin's account has no invoice; name the tenant with account_id".into(),
        ));
    }
    let id = account_in_view(
        &caller,
        &AccountQuery {
            account_id: query.account_id,
        },
    )?;
    let (from_us, to_us) = month_bounds(&query.period)?;
    let escrow_prefix = Account::Escrow(0).key().trim_end_matches('0').to_string();
    let entries = state
        .store
        .tenant_entries_between(
            id,
            &Account::TenantAvailable(id).key(),
            &escrow_prefix,
            (from_us, to_us),
        )
        .await?;
    // Entries of one transaction are consecutive (inserted together).
    let mut lines: std::collections::BTreeMap<i64, (i64, i64)> = std::collections::BTreeMap::new();
    let (mut usage, mut credits, mut refunds, mut payments) = (0i64, 0i64, 0i64, 0i64);
    let mut index = 0;
    while index < entries.len() {
        let key = &entries[index].tx_key;
        let end = entries[index..]
            .iter()
            .position(|entry| &entry.tx_key != key)
            .map_or(entries.len(), |offset| index + offset);
        let transaction = &entries[index..end];
        let sum: i64 = transaction.iter().map(|entry| entry.amount).sum();
        match transaction[0].kind.as_str() {
            "usage" => {
                let job = match transaction
                    .iter()
                    .find_map(|entry| match Account::parse(&entry.account) {
                        Ok(Account::Escrow(job)) => Some(job),
                        _ => None,
                    }) {
                    Some(job) => job,
                    None => usage_job(&state, key).await?,
                };
                let line = lines.entry(job).or_insert((0, 0));
                line.0 += 1;
                line.1 -= sum;
                usage -= sum;
            }
            "sla_credit" => credits += sum,
            // A slash's entries on the tenant's account are what it paid the tenant back.
            "refund" | "slash" => refunds += sum,
            "deposit" => payments += sum,
            _ => {}
        }
        index = end;
    }
    let mut invoice_lines = Vec::with_capacity(lines.len());
    for (job_id, (usage_records, charged_micros)) in lines {
        let job_name = match state.store.job(job_id).await? {
            Some(job) => crate::wire::job_request(&job).name,
            None => String::new(),
        };
        invoice_lines.push(InvoiceLine {
            job_id,
            job_name,
            usage_records,
            charged_micros,
        });
    }
    Ok(Json(InvoiceView {
        account_id: id,
        period: query.period,
        from_us,
        to_us,
        lines: invoice_lines,
        usage_micros: usage,
        sla_credits_micros: credits,
        refunds_micros: refunds,
        total_micros: usage - credits - refunds,
        payments_micros: payments,
    }))
}

/// The job a usage transaction (`usage:lease-N:seq-M`) billed, through its lease.
async fn usage_job(state: &AppState, key: &str) -> ApiResult<i64> {
    let lease = key
        .strip_prefix("usage:lease-")
        .and_then(|rest| rest.split(':').next())
        .and_then(|id| id.parse::<i64>().ok())
        .ok_or_else(|| ApiError::Internal(format!("usage transaction {key} names no lease")))?;
    let record = state
        .store
        .lease(lease)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("usage transaction {key}: lease {lease} is gone")))?;
    Ok(record.job_id)
}

/// The caller's own balance, exactly as `GET /v1/balance` answers it.
pub(crate) async fn own_balance(state: Arc<AppState>, caller: Caller) -> ApiResult<BalanceView> {
    let query = AccountQuery { account_id: None };
    Ok(balance(State(state), Auth(caller), Query(query)).await?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_US: i64 = 86_400_000_000;

    #[test]
    fn a_month_is_its_days_in_microseconds_from_1970() {
        assert_eq!(month_bounds("1970-01").unwrap(), (0, 31 * DAY_US));
        let (from, to) = month_bounds("2024-02").unwrap();
        assert_eq!((to - from) / DAY_US, 29, "a leap February");
        assert_eq!(from, 19_754 * DAY_US, "2024-02-01 is day 19,754");
        let (_, end) = month_bounds("2026-12").unwrap();
        assert_eq!(end, month_bounds("2027-01").unwrap().0, "December runs into January");
        assert_eq!(
            (month_bounds("2100-02").unwrap().1 - month_bounds("2100-02").unwrap().0) / DAY_US,
            28
        );
        for bad in [
            "2026-13",
            "2026-00",
            "1969-12",
            "26-01",
            "2026-1",
            "2026-01-01",
            "+026-01",
            "",
            "-",
        ] {
            assert!(month_bounds(bad).is_err(), "{bad:?}");
        }
    }
}
