//! Capacity set aside: a tenant's bookings ahead (`crate::reservations`) and the windows booked
//! on a provider's node; and the provider accounts a tenant links as its own (hybrid: its jobs
//! go to their nodes first, at no market price).

use api::{
    CalendarView, OwnProviderList, OwnProviderRequest, OwnProviderView, ReservationList, ReservationRequest,
    ReservationView,
};
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

/// A tenant's own provider accounts (hybrid), as it sees them.
async fn own_providers(state: &AppState, tenant: i64) -> ApiResult<OwnProviderList> {
    let mut providers = Vec::new();
    for (provider, linked_at) in state.store.own_providers_of(tenant).await? {
        let name = state
            .store
            .account(provider)
            .await?
            .map(|account| account.name)
            .unwrap_or_default();
        let nodes = state.store.nodes_of_provider(provider).await?;
        providers.push(OwnProviderView {
            provider_id: provider,
            name,
            linked_at_us: linked_at,
            nodes: nodes.len() as i64,
            gpus: nodes.iter().map(|node| node.node.gpu_count).sum(),
        });
    }
    Ok(OwnProviderList { providers })
}

pub async fn link_own_provider(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<OwnProviderRequest>,
) -> ApiResult<(StatusCode, Json<OwnProviderList>)> {
    require(&caller, &[Role::Tenant])?;
    let not_a_provider = || ApiError::NotFound("provider_key: no provider account has this key".into());
    let provider = state
        .caller_of_key(request.provider_key.trim())
        .await
        .map_err(|_| not_a_provider())?;
    if provider.role != Role::Provider {
        return Err(not_a_provider());
    }
    state
        .store
        .link_own_provider(caller.account_id, provider.account_id, state.now_us())
        .await?;
    state.wake.notify_one();
    Ok((
        StatusCode::CREATED,
        Json(own_providers(&state, caller.account_id).await?),
    ))
}

pub async fn list_own_providers(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<OwnProviderList>> {
    require(&caller, &[Role::Tenant])?;
    Ok(Json(own_providers(&state, caller.account_id).await?))
}

pub async fn unlink_own_provider(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<OwnProviderList>> {
    require(&caller, &[Role::Tenant])?;
    if !state.store.unlink_own_provider(caller.account_id, id).await? {
        return Err(ApiError::NotFound(format!("provider {id} is not linked as yours")));
    }
    Ok(Json(own_providers(&state, caller.account_id).await?))
}
