//! Capacity booked ahead (docs/reservations.md). The leader books on its view: the matcher
//! holds whole GPUs on chosen nodes from the start, prices them by its auction, and the whole
//! price is held in the reservation's escrow in the same transaction as the booking. Bronze may
//! use booked GPUs until the start (it is told to leave a grace period before); other work only
//! when it ends first. Jobs submitted with `reservation` run inside it, paid for by the booking.
//! A node lost before the end is replaced at the booked price or its hours refunded; at the end
//! the providers are paid for the hours their nodes held and the rest goes back to the tenant.

use api::{CalendarEntry, ReservationNodeView, ReservationRequest, ReservationView};
use ledger::Account;
use model::{JobId, Micros};
use store::{JobState, LeaseState, LedgerWrite, NewReservation, ReservationNode, ReservationRecord};

use crate::error::{ApiError, ApiResult};
use crate::fleet::FleetView;
use crate::money;
use crate::state::AppState;

/// Reservations take matcher job ids from here up (`JobId(MATCHER_ID_BASE + id)`), far above
/// any stored job's.
pub const MATCHER_ID_BASE: u64 = 1 << 62;
/// The id a booking has in the matcher until the store gives it its own.
const PROVISIONAL: JobId = JobId(MATCHER_ID_BASE - 1);
/// A cancellation at least this long before the start gets the whole hold back.
pub const FULL_REFUND_BEFORE_US: i64 = 24 * 3600 * 1_000_000;
/// Of the hours not yet delivered, the share a later cancellation gets back, in thousandths; the
/// rest goes to the providers who held the capacity.
pub const LATE_REFUND_PERMILLE: i64 = 500;
/// How often the leader looks for bookings that start or end.
pub const CHECK_EVERY_US: i64 = 1_000_000;

pub fn matcher_id(reservation: i64) -> JobId {
    JobId(MATCHER_ID_BASE + reservation as u64)
}

fn not_leading() -> ApiError {
    ApiError::Unavailable(
        "bookings are made and cancelled by the replica that leads the reconcile loop, and this one does not \
         lead now: try again (another replica)"
            .into(),
    )
}

/// What `gpus` GPUs at `price_micros` per GPU-hour cost over [from, until) (µs), rounded as
/// holds are.
fn cost(node: &ReservationNode, from: i64, until: i64) -> i64 {
    if until <= from {
        return 0;
    }
    let seconds = u64::try_from((until - from) / 1_000_000).unwrap_or(0);
    let gpu_milli = u64::try_from(node.gpus).unwrap_or(0) * 1000;
    ledger::hold_amount(Micros(node.price_micros), gpu_milli, seconds).map_or(0, |amount| amount.0)
}

/// What the booking costs: each node row's GPU-hours over the time it holds them.
pub fn booked_cost(record: &ReservationRecord) -> i64 {
    record
        .nodes
        .iter()
        .map(|node| cost(node, node.held_from, node.held_until))
        .sum()
}

/// Who is paid what when a booking stops at `now`: each node row (by index) its hours delivered
/// and, for a cancellation from `FULL_REFUND_BEFORE_US` before the start on, its share of the
/// forfeit; the tenant gets the rest of the escrow.
pub fn payments_at(record: &ReservationRecord, now: i64, cancelling: bool) -> Vec<(usize, i64)> {
    let late = cancelling && now >= record.starts_at - FULL_REFUND_BEFORE_US;
    record
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let delivered = cost(node, node.held_from, now.min(node.held_until));
            let rest = cost(node, now.max(node.held_from), node.held_until);
            let forfeit = if late && node.lost_at.is_none() {
                rest - rest * LATE_REFUND_PERMILLE / 1000
            } else {
                0
            };
            (index, delivered + forfeit)
        })
        .filter(|(_, amount)| *amount > 0)
        .collect()
}

/// The ledger writes that pay `payments` from the reservation's escrow and give the tenant the
/// rest. Nodes on simulated devices are paid nothing unless the coordinator bills them.
async fn settle_money(
    state: &AppState,
    record: &ReservationRecord,
    payments: &[(usize, i64)],
    what: &str,
    now: i64,
) -> ApiResult<Vec<LedgerWrite>> {
    let mut escrow = money::balance(&state.store, Account::ReservationEscrow(record.id)).await?;
    let mut writes = Vec::new();
    for (index, amount) in payments {
        let node = &record.nodes[*index];
        let Some(node_record) = state.store.node(node.node_id).await? else {
            continue;
        };
        if node_record.node.simulated && !state.config.bill_simulated {
            continue;
        }
        let key = format!(
            "reservation-{}:{what}:node-{}-{}",
            record.id, node.node_id, node.held_from
        );
        let paid = ledger::capacity_payment(
            record.id,
            node_record.node.provider_id,
            Micros(*amount),
            state.config.platform_fee_permille,
            escrow,
            key,
            now,
        )
        .map_err(money::ledger_error)?;
        if let Some(transaction) = paid {
            let moved: i64 = transaction
                .entries
                .iter()
                .filter(|entry| entry.account == Account::ReservationEscrow(record.id))
                .map(|entry| -entry.amount.0)
                .sum();
            escrow = Micros(escrow.0 - moved);
            writes.push(money::row(&transaction));
        }
    }
    let key = format!("reservation-{}:{what}:refund", record.id);
    if let Some(transaction) = ledger::reservation_release(record.tenant_id, record.id, escrow, escrow, key, now)
        .map_err(money::ledger_error)?
    {
        writes.push(money::row(&transaction));
    }
    Ok(writes)
}

/// Books `request` for `tenant` on the leader's view (the caller makes sure it is built):
/// refused with the matcher's account when the capacity is not there, and with the amount when
/// the tenant cannot cover it.
pub async fn book(state: &AppState, tenant: i64, request: &ReservationRequest) -> ApiResult<ReservationRecord> {
    let now = state.now_us();
    let max_price = request.check(now)?;
    let job = request.as_job();
    job.to_spec(0, tenant, 0, |_| None)?;
    if !state.leads() {
        return Err(not_leading());
    }
    // Whole seconds, the matcher's unit; a start within the second is the next second.
    let start_s = (request.starts_at_us + 999_999).div_euclid(1_000_000);
    let starts_at = start_s * 1_000_000;
    let ends_at = starts_at + i64::from(request.hours) * 3_600_000_000;
    let available = money::balance(&state.store, Account::TenantAvailable(tenant)).await?;
    let mut guard = state.view.lock().await;
    let view = guard
        .as_mut()
        .ok_or_else(|| ApiError::Unavailable("the fleet view is not built yet".into()))?;
    let mut spec = job.to_spec(PROVISIONAL.0 as i64, tenant, now / 1_000_000, |name| view.region(name))?;
    spec.id = PROVISIONAL;
    let booking = match view.matcher.book(&spec, now / 1_000_000, start_s) {
        Ok(booking) => booking,
        Err(unplaced) => return Err(ApiError::Conflict(refusal(view, &spec, request, &unplaced, start_s))),
    };
    view.matcher.cancel_reservation(PROVISIONAL);
    let nodes: Vec<ReservationNode> = booking
        .reservation
        .nodes
        .iter()
        .zip(&booking.prices)
        .map(|((node, gpus), price)| ReservationNode {
            node_id: view.node_ids[*node as usize],
            gpus: i64::from(*gpus),
            price_micros: price.0,
            held_from: starts_at,
            held_until: ends_at,
            lost_at: None,
        })
        .collect();
    let hold: i64 = nodes.iter().map(|node| cost(node, starts_at, ends_at)).sum();
    if available.0 < hold {
        return Err(ApiError::PaymentRequired(format!(
            "the booking holds {} ahead (its price fixed now: {} GPU-hours at up to {}/GPU-hour) and your balance is {}",
            Micros(hold),
            i64::from(request.gpus) * i64::from(request.hours),
            max_price,
            available
        )));
    }
    let new = NewReservation {
        tenant_id: tenant,
        request: serde_json::to_string(request).map_err(|error| ApiError::Internal(error.to_string()))?,
        gpus: i64::from(request.gpus),
        gpu_model: model::GpuCatalog::embedded()
            .spec(spec.resources.gpu_models[0])
            .name
            .clone(),
        starts_at,
        ends_at,
        hold_micros: hold,
        nodes,
    };
    let fence = state.fence.load(std::sync::atomic::Ordering::SeqCst);
    let record = state
        .store
        .book_reservation(
            &new,
            |id| {
                ledger::book(
                    tenant,
                    id,
                    Micros(hold),
                    available,
                    format!("hold:reservation-{id}"),
                    now,
                )
                .map(|transaction| money::row(&transaction))
                .map_err(|error| error.to_string())
            },
            now,
            fence,
        )
        .await?;
    restore(view, &record);
    tracing::info!(
        reservation = record.id,
        gpus = record.gpus,
        hold = hold,
        "booked capacity ahead"
    );
    Ok(record)
}

/// Why a booking cannot be met, in words: how many of the GPUs fit, and what rules out the rest.
fn refusal(
    view: &FleetView,
    spec: &model::JobSpec,
    request: &ReservationRequest,
    unplaced: &matcher::Unplaced,
    start_s: i64,
) -> String {
    let fit = match unplaced {
        matcher::Unplaced::NoDomainFits { best, .. } => format!("only {best} of the {} GPUs", request.gpus),
        other => other.to_string(),
    };
    let region = if request.regions.is_empty() {
        String::new()
    } else {
        format!(" in {}", request.regions.join(", "))
    };
    let within = if request.topology == "any" {
        String::new()
    } else {
        format!(", within one {}", request.topology)
    };
    let explained = view.matcher.explain_naming(spec, start_s, &request.regions);
    format!(
        "the booking cannot be met: {fit} ({}{region}{within}) are free from {} for {} h at or under ${}/GPU-hour; \
         the fleet then: {}",
        request.gpu_model,
        model::time::utc(start_s * 1_000_000),
        request.hours,
        request.max_price_per_gpu_hour,
        explained.message
    )
}

/// Puts a stored live reservation into the view's matcher (its held nodes, by dense id).
pub fn restore(view: &mut FleetView, record: &ReservationRecord) {
    let nodes: Vec<(u32, u8)> = record
        .held()
        .filter_map(|node| {
            let dense = view.dense.get(&node.node_id)?;
            Some((dense.0, u8::try_from(node.gpus).unwrap_or(u8::MAX)))
        })
        .collect();
    let id = matcher_id(record.id);
    view.matcher.restore_reservation(matcher::Reservation {
        id: matcher::ReservationId(id.0),
        job: id,
        start: record.starts_at / 1_000_000,
        end: record.ends_at / 1_000_000,
        nodes,
    });
}

/// What a rebuilt view needs of the store: the live reservations and the jobs inside them.
pub async fn restore_all(state: &AppState, view: &mut FleetView) -> ApiResult<()> {
    for record in state.store.live_reservations().await? {
        restore(view, &record);
    }
    for (job, reservation) in state.store.reservation_members().await? {
        view.matcher
            .join_reservation(JobId(job as u64), matcher_id(reservation));
    }
    Ok(())
}

/// Cancels a booking for its tenant (the refund rule in docs/reservations.md): the jobs inside
/// it end with it.
pub async fn cancel(state: &AppState, record: &ReservationRecord) -> ApiResult<()> {
    if !record.is_live() {
        return Err(ApiError::Conflict(format!(
            "reservation {} already {}; nothing to cancel",
            record.id, record.state
        )));
    }
    if !state.leads() {
        return Err(not_leading());
    }
    let now = state.now_us();
    let payments = payments_at(record, now, true);
    let money = settle_money(state, record, &payments, "cancel", now).await?;
    let live = ["booked", "active"];
    if !state
        .store
        .transition_reservation(record.id, &live, "cancelled", "cancelled by its tenant", &money, now)
        .await?
    {
        return Err(ApiError::Conflict(format!("reservation {} ended meanwhile", record.id)));
    }
    end_members(state, record.id, "its reservation was cancelled").await?;
    if let Some(view) = state.view.lock().await.as_mut() {
        view.matcher.cancel_reservation(matcher_id(record.id));
    }
    Ok(())
}

async fn end_members(state: &AppState, reservation: i64, reason: &str) -> ApiResult<()> {
    let live = [JobState::Queued, JobState::Running];
    for job in state.store.jobs_of_reservation(reservation, &live).await? {
        crate::lifecycle::end_job(state, &job, &live, JobState::Cancelled, LeaseState::Cancelled, reason).await?;
    }
    Ok(())
}

/// The leader's turn each pass: bookings whose start came are active; those whose end came are
/// settled (providers paid for the hours held, the rest back to the tenant) and their jobs ended.
pub async fn tend(state: &AppState, now: i64) -> ApiResult<()> {
    for record in state.store.reservations_due(now).await? {
        if record.state == "booked" {
            state
                .store
                .transition_reservation(record.id, &["booked"], "active", "started", &[], now)
                .await?;
            tracing::info!(reservation = record.id, "a booking started");
            continue;
        }
        let payments = payments_at(&record, record.ends_at, false);
        let money = settle_money(state, &record, &payments, "end", now).await?;
        if state
            .store
            .transition_reservation(record.id, &["active"], "ended", "its hours ran out", &money, now)
            .await?
        {
            end_members(state, record.id, "its reservation ended").await?;
            if let Some(view) = state.view.lock().await.as_mut() {
                view.matcher.cancel_reservation(matcher_id(record.id));
            }
            tracing::info!(reservation = record.id, "a booking ended and was settled");
        }
    }
    Ok(())
}

/// A node went silent: each live booking that holds it books the same GPUs elsewhere from now
/// (or its start) to its end at the booked price, or refunds the tenant those hours.
pub async fn node_lost(state: &AppState, node_id: i64, now: i64) -> ApiResult<()> {
    for record in state.store.reservations_holding(node_id).await? {
        let Some(lost) = record.held().find(|node| node.node_id == node_id).cloned() else {
            continue;
        };
        let from = now.max(record.starts_at);
        if from >= record.ends_at {
            continue;
        }
        let request: ReservationRequest =
            serde_json::from_str(&record.request).map_err(|error| ApiError::Internal(error.to_string()))?;
        let replacements = {
            let mut guard = state.view.lock().await;
            match guard.as_mut() {
                Some(view) => replace(view, &record, &request, &lost, from, now),
                None => Vec::new(),
            }
        };
        let refund = if replacements.is_empty() {
            let amount = cost(&lost, from, lost.held_until);
            let key = format!("reservation-{}:lost:node-{}-{}", record.id, node_id, lost.held_from);
            let escrow = money::balance(&state.store, Account::ReservationEscrow(record.id)).await?;
            ledger::reservation_release(record.tenant_id, record.id, Micros(amount), escrow, key, now)
                .map_err(money::ledger_error)?
                .map(|transaction| money::row(&transaction))
        } else {
            None
        };
        let fence = state.fence.load(std::sync::atomic::Ordering::SeqCst);
        state
            .store
            .lose_reservation_node(record.id, node_id, now, &replacements, refund.as_ref(), fence)
            .await?;
        if let Some(updated) = state.store.reservation(record.id).await?
            && let Some(view) = state.view.lock().await.as_mut()
        {
            restore(view, &updated);
        }
        tracing::warn!(
            reservation = record.id,
            node = node_id,
            replaced = !replacements.is_empty(),
            "a booked node was lost"
        );
    }
    Ok(())
}

/// Books `lost`'s GPUs from `from` to the booking's end on other nodes of the same model and
/// regions, at no more than the booked price (which the tenant keeps paying): the rows to add,
/// or none when they do not fit.
fn replace(
    view: &mut FleetView,
    record: &ReservationRecord,
    request: &ReservationRequest,
    lost: &ReservationNode,
    from: i64,
    now: i64,
) -> Vec<ReservationNode> {
    let mut shape = request.clone();
    shape.gpus = u32::try_from(lost.gpus).unwrap_or(0);
    shape.topology = "any".into();
    shape.max_price_per_gpu_hour = Micros(lost.price_micros)
        .to_string()
        .trim_start_matches('$')
        .to_string();
    let mut job = shape.as_job();
    job.max_runtime_s = u32::try_from((record.ends_at - from) / 1_000_000).unwrap_or(u32::MAX);
    let Ok(mut spec) = job.to_spec(PROVISIONAL.0 as i64, record.tenant_id, now / 1_000_000, |name| {
        view.region(name)
    }) else {
        return Vec::new();
    };
    spec.id = PROVISIONAL;
    let start_s = (from + 999_999).div_euclid(1_000_000);
    let Ok(booking) = view.matcher.book(&spec, now / 1_000_000, start_s) else {
        return Vec::new();
    };
    view.matcher.cancel_reservation(PROVISIONAL);
    booking
        .reservation
        .nodes
        .iter()
        .map(|(node, gpus)| ReservationNode {
            node_id: view.node_ids[*node as usize],
            gpus: i64::from(*gpus),
            price_micros: lost.price_micros,
            held_from: start_s * 1_000_000,
            held_until: record.ends_at,
            lost_at: None,
        })
        .collect()
}

/// The tenant's view of a reservation.
pub async fn view(state: &AppState, record: &ReservationRecord) -> ApiResult<ReservationView> {
    let request: ReservationRequest =
        serde_json::from_str(&record.request).map_err(|error| ApiError::Internal(error.to_string()))?;
    let escrow = money::balance(&state.store, Account::ReservationEscrow(record.id)).await?;
    let refund = if record.is_live() {
        let paid: i64 = payments_at(record, state.now_us(), true)
            .iter()
            .map(|(_, amount)| amount)
            .sum();
        (escrow.0 - paid).max(0)
    } else {
        0
    };
    Ok(ReservationView {
        id: record.id,
        state: record.state.clone(),
        state_reason: record.state_reason.clone(),
        gpus: record.gpus,
        gpu_model: record.gpu_model.clone(),
        regions: request.regions,
        topology: request.topology,
        starts_at_us: record.starts_at,
        ends_at_us: record.ends_at,
        cost_micros: booked_cost(record),
        hold_micros: record.hold_micros,
        escrow_micros: escrow.0,
        refund_if_cancelled_micros: refund,
        nodes: record
            .nodes
            .iter()
            .map(|node| ReservationNodeView {
                node_id: node.node_id,
                gpus: node.gpus,
                price_micros_per_gpu_hour: node.price_micros,
                held_from_us: node.held_from,
                held_until_us: node.held_until,
                lost_at_us: node.lost_at,
            })
            .collect(),
        created_at_us: record.created_at,
    })
}

/// A node's booked windows, as its provider sees them.
pub fn calendar_entry(record: &ReservationRecord, node: &ReservationNode) -> CalendarEntry {
    CalendarEntry {
        reservation_id: record.id,
        state: record.state.clone(),
        gpus: node.gpus,
        price_micros_per_gpu_hour: node.price_micros,
        from_us: node.held_from,
        until_us: node.held_until,
        lost_at_us: node.lost_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600_000_000;

    fn record(starts_at: i64) -> ReservationRecord {
        let node = |node_id, gpus| ReservationNode {
            node_id,
            gpus,
            price_micros: 2_000_000,
            held_from: starts_at,
            held_until: starts_at + 8 * HOUR,
            lost_at: None,
        };
        ReservationRecord {
            id: 1,
            tenant_id: 2,
            state: "booked".into(),
            state_reason: String::new(),
            request: String::new(),
            gpus: 12,
            gpu_model: "H100-SXM5".into(),
            starts_at,
            ends_at: starts_at + 8 * HOUR,
            hold_micros: 0,
            created_at: 0,
            updated_at: 0,
            nodes: vec![node(10, 8), node(11, 4)],
        }
    }

    #[test]
    fn a_booking_costs_its_gpu_hours_at_their_prices() {
        assert_eq!(booked_cost(&record(100 * HOUR)), 12 * 8 * 2_000_000);
    }

    #[test]
    fn an_early_cancellation_pays_no_one_and_a_late_one_half_the_hours_not_delivered() {
        let starts_at = 100 * HOUR;
        let booking = record(starts_at);
        assert!(payments_at(&booking, starts_at - FULL_REFUND_BEFORE_US - 1, true).is_empty());
        let late = payments_at(&booking, starts_at - HOUR, true);
        assert_eq!(late, vec![(0, 8 * 8 * 1_000_000), (1, 4 * 8 * 1_000_000)]);
        // Two hours in: those two paid whole, half of the other six.
        let running = payments_at(&booking, starts_at + 2 * HOUR, true);
        assert_eq!(running[0], (0, 8 * 2 * 2_000_000 + 8 * 6 * 1_000_000));
        // At the end, the hours held and nothing more.
        let ended = payments_at(&booking, starts_at + 8 * HOUR, false);
        assert_eq!(ended, vec![(0, 8 * 8 * 2_000_000), (1, 4 * 8 * 2_000_000)]);
    }

    #[test]
    fn a_node_lost_is_paid_for_the_hours_it_held_and_no_forfeit() {
        let starts_at = 100 * HOUR;
        let mut booking = record(starts_at);
        booking.nodes[1].lost_at = Some(starts_at + 3 * HOUR);
        booking.nodes[1].held_until = starts_at + 3 * HOUR;
        let ended = payments_at(&booking, starts_at + 8 * HOUR, false);
        assert_eq!(ended[1], (1, 4 * 3 * 2_000_000));
        let cancelled = payments_at(&booking, starts_at + 4 * HOUR, true);
        assert_eq!(cancelled[1], (1, 4 * 3 * 2_000_000));
    }
}
