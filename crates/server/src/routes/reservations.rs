//! Booking capacity ahead (`crate::reservations`): a tenant's reservations, and the windows
//! booked on a provider's node.

use api::{CalendarView, ReservationList, ReservationRequest, ReservationView};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use store::{ReservationRecord, Role};

use super::{AppStateRef, own_node, require};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody, Path};
use crate::reservations;
use crate::state::{AppState, Caller};

/// A reservation its tenant (or an admin) may see; any other answers 404, as one that does not
/// exist.
pub(crate) async fn own_reservation(state: &AppState, caller: &Caller, id: i64) -> ApiResult<ReservationRecord> {
    match state.store.reservation(id).await? {
        Some(record) if caller.role == Role::Admin || record.tenant_id == caller.account_id => Ok(record),
        _ => Err(ApiError::NotFound(format!("reservation {id} not found"))),
    }
}

pub async fn create_reservation(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<ReservationRequest>,
) -> ApiResult<(StatusCode, Json<ReservationView>)> {
    require(&caller, &[Role::Tenant])?;
    crate::reconcile::ensure_view(&state).await?;
    let record = reservations::book(&state, caller.account_id, &request).await?;
    Ok((StatusCode::CREATED, Json(reservations::view(&state, &record).await?)))
}

pub async fn list_reservations(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<ReservationList>> {
    require(&caller, &[Role::Tenant])?;
    let mut out = Vec::new();
    for record in state.store.reservations_of_tenant(caller.account_id).await? {
        out.push(reservations::view(&state, &record).await?);
    }
    Ok(Json(ReservationList { reservations: out }))
}

pub async fn show_reservation(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<ReservationView>> {
    let record = own_reservation(&state, &caller, id).await?;
    Ok(Json(reservations::view(&state, &record).await?))
}

pub async fn cancel_reservation(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<ReservationView>> {
    let record = own_reservation(&state, &caller, id).await?;
    reservations::cancel(&state, &record).await?;
    let record = own_reservation(&state, &caller, id).await?;
    Ok(Json(reservations::view(&state, &record).await?))
}

pub async fn node_calendar(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<CalendarView>> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    own_node(&state, &caller, id).await?;
    let entries = state
        .store
        .node_calendar(id, state.now_us())
        .await?
        .iter()
        .map(|(record, node)| reservations::calendar_entry(record, node))
        .collect();
    Ok(Json(CalendarView { node_id: id, entries }))
}
