//! A tenant's services: deploy, list, show, update (a new version rolls out), scale, delete,
//! and their replicas' output. The leader's controller (`crate::services`) keeps each at its
//! replica count; the gateway (`routes::gateway`) serves it at `/s/{name}/…`.

use api::{
    NewKeyResponse, PAGE_SIZE_MAX, ServiceDeployment, ServiceList, ServiceLogs, ServiceReplicaView, ServiceRequest,
    ServiceScale, ServiceView,
};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ledger::Account;
use store::{Role, ServiceRecord};

use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody, Path, Query};
use crate::gateway::Endpoint;
use crate::lifecycle::end_job;
use crate::money;
use crate::state::{AppState, Caller};
use crate::wire::{replica_version, service_request};

use super::{AppStateRef, require};

fn input(error: api::InputError) -> ApiError {
    ApiError::BadRequest(error.0)
}

/// A service as `GET /v1/services/{name}` shows it: its deployment (when deployed), its
/// replicas, and what its callers got from this gateway.
async fn view(state: &AppState, tenant: i64, name: &str, record: Option<&ServiceRecord>) -> ApiResult<ServiceView> {
    let ready = state.store.serving_leases(tenant, name).await?;
    let endpoints: Vec<Endpoint> = ready.iter().map(Endpoint::of).collect();
    let stats = state.gateway.stats(tenant, name);
    let now = state.now_us();
    let requests_per_sec = state
        .gateway
        .window(tenant, name, now, 60_000_000)
        .map_or(0.0, |(seconds, window)| window.requests as f64 / seconds.max(1.0));
    let mut replica_states = Vec::new();
    for row in state.store.service_replicas(tenant, name).await? {
        let version = replica_version(&row.spec);
        let replica_state = match (&row.lease_state, row.ready_at, row.preempt_at) {
            (None, _, _) => "queued",
            (Some(_), _, Some(_)) => "draining",
            (Some(state), Some(_), None) if state == "running" => "ready",
            _ => "starting",
        };
        replica_states.push(ServiceReplicaView {
            job_id: row.job_id,
            lease_id: row.lease_id,
            node_id: row.node_id,
            version,
            tier: row.tier.clone(),
            state: replica_state.to_string(),
            in_flight: row.lease_id.map_or(0, |lease| state.gateway.in_flight(lease)),
        });
    }
    let deployed = match record {
        Some(record) => {
            let request = service_request(&record.spec)?;
            Some(ServiceDeployment {
                version: record.version,
                stable_version: record.stable_version,
                desired_replicas: record.desired,
                min_replicas: request.min_replicas,
                max_replicas: request.max(),
                status: record.status.clone(),
                request,
            })
        }
        None => None,
    };
    let tokens = stats.prompt_tokens + stats.completion_tokens;
    let cost_micros = state.store.service_cost(tenant, name).await?;
    Ok(ServiceView {
        replicas_ready: state.gateway.reachable(&endpoints) as u64,
        replicas: ready.iter().map(|replica| replica.lease_id).collect(),
        name: name.to_string(),
        requests: stats.requests,
        errors: stats.errors,
        p50_ms: stats.quantile_ms(0.50),
        p95_ms: stats.quantile_ms(0.95),
        p99_ms: stats.quantile_ms(0.99),
        prompt_tokens: stats.prompt_tokens,
        completion_tokens: stats.completion_tokens,
        tokens,
        requests_per_sec,
        deployed,
        replica_states,
        cost_micros,
        cost_per_million_tokens_micros: (tokens > 0)
            .then(|| i64::try_from(i128::from(cost_micros) * 1_000_000 / i128::from(tokens)).unwrap_or(i64::MAX)),
    })
}

/// A deployed service of the caller's, or 404.
async fn own_service(state: &AppState, caller: &Caller, name: &str) -> ApiResult<ServiceRecord> {
    state
        .store
        .service(caller.account_id, name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no service {name:?}: `fallow service list` shows yours")))
}

/// Deploys a service: its replicas are submitted by the leader's controller, up to
/// `min_replicas` (at least one), and served at `/s/{name}/…` once healthy.
pub async fn deploy_service(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<ServiceRequest>,
) -> ApiResult<(StatusCode, Json<ServiceView>)> {
    require(&caller, &[Role::Tenant])?;
    request.check().map_err(input)?;
    let available = money::balance(&state.store, Account::TenantAvailable(caller.account_id)).await?;
    if available.0 <= 0 {
        return Err(ApiError::PaymentRequired(
            "your balance is $0: ask an admin to credit your account before deploying a service".into(),
        ));
    }
    let spec = serde_json::to_string(&request).map_err(|error| ApiError::Internal(error.to_string()))?;
    let desired = i64::from(request.min_replicas.max(1));
    let now = state.now_us();
    let Some(record) = state
        .store
        .create_service(caller.account_id, &request.name, &spec, desired, now)
        .await?
    else {
        return Err(ApiError::Conflict(format!(
            "service {:?} exists: `fallow service update` deploys a new version of it",
            request.name
        )));
    };
    state.wake.notify_one();
    let view = view(&state, caller.account_id, &record.name, Some(&record)).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// The caller's deployed services.
pub async fn list_services(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<ServiceList>> {
    require(&caller, &[Role::Tenant])?;
    Ok(Json(services_page(&state, &caller).await?))
}

/// The caller's deployed services, exactly as `GET /v1/services` answers them.
pub(crate) async fn services_page(state: &AppState, caller: &Caller) -> ApiResult<ServiceList> {
    let mut services = Vec::new();
    for record in state.store.services_of_tenant(caller.account_id).await? {
        services.push(view(state, caller.account_id, &record.name, Some(&record)).await?);
    }
    Ok(ServiceList { services })
}

/// A service: deployed, or served by jobs that name it (`serve.name`) alone.
pub async fn show_service(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
) -> ApiResult<Json<ServiceView>> {
    require(&caller, &[Role::Tenant])?;
    let record = state.store.service(caller.account_id, &name).await?;
    let shown = view(&state, caller.account_id, &name, record.as_ref()).await?;
    if record.is_none() && shown.replica_states.is_empty() && shown.requests == 0 {
        return Err(ApiError::NotFound(format!(
            "no service {name:?}: none is deployed by that name and none of your jobs serves it"
        )));
    }
    Ok(Json(shown))
}

/// A new spec for a service. A changed replica (image, command, resources…), port or health
/// check is a new version, rolled out one replica at a time; bounds, targets and windows apply
/// at once.
pub async fn update_service(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
    JsonBody(request): JsonBody<ServiceRequest>,
) -> ApiResult<Json<ServiceView>> {
    require(&caller, &[Role::Tenant])?;
    request.check().map_err(input)?;
    if request.name != name {
        return Err(ApiError::BadRequest(format!(
            "name: {:?} is not the service's name {name:?} (a service is not renamed)",
            request.name
        )));
    }
    let record = own_service(&state, &caller, &name).await?;
    let old = service_request(&record.spec)?;
    let spec = serde_json::to_string(&request).map_err(|error| ApiError::Internal(error.to_string()))?;
    let now = state.now_us();
    let new_version =
        old.replica != request.replica || old.port != request.port || old.health_path != request.health_path;
    let applied = if new_version {
        state
            .store
            .update_service_spec(record.id, record.version, &spec, now)
            .await?
    } else {
        state
            .store
            .rescale_service(record.id, record.version, &spec, now)
            .await?
    };
    if !applied {
        return Err(ApiError::Conflict(format!(
            "service {name:?} changed meanwhile (now version {}); read it and try again",
            record.version
        )));
    }
    state.wake.notify_one();
    let record = own_service(&state, &caller, &name).await?;
    Ok(Json(view(&state, caller.account_id, &name, Some(&record)).await?))
}

/// New bounds for a service's replicas; the controller moves to them at once.
pub async fn scale_service(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
    JsonBody(scale): JsonBody<ServiceScale>,
) -> ApiResult<Json<ServiceView>> {
    require(&caller, &[Role::Tenant])?;
    api::check_bounds(scale.min_replicas, scale.max_replicas).map_err(input)?;
    let record = own_service(&state, &caller, &name).await?;
    let mut request = service_request(&record.spec)?;
    request.min_replicas = scale.min_replicas;
    request.max_replicas = scale.max_replicas;
    let spec = serde_json::to_string(&request).map_err(|error| ApiError::Internal(error.to_string()))?;
    let now = state.now_us();
    if !state
        .store
        .rescale_service(record.id, record.version, &spec, now)
        .await?
    {
        return Err(ApiError::Conflict(format!(
            "service {name:?} changed meanwhile; try again"
        )));
    }
    let desired = record
        .desired
        .clamp(i64::from(request.min_replicas), i64::from(request.max()));
    state
        .store
        .set_service_desired(record.id, desired, &record.status, now)
        .await?;
    state.wake.notify_one();
    let record = own_service(&state, &caller, &name).await?;
    Ok(Json(view(&state, caller.account_id, &name, Some(&record)).await?))
}

/// Deletes a service: its replicas end (their escrow released) and its name is free again.
pub async fn delete_service(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
) -> ApiResult<Json<ServiceView>> {
    require(&caller, &[Role::Tenant])?;
    let record = own_service(&state, &caller, &name).await?;
    let shown = view(&state, caller.account_id, &name, Some(&record)).await?;
    state.store.delete_service(record.id).await?;
    for replica in &shown.replica_states {
        if let Some(job) = state.store.job(replica.job_id).await? {
            end_job(
                &state,
                &job,
                &[store::JobState::Queued, store::JobState::Running],
                store::JobState::Cancelled,
                store::LeaseState::Cancelled,
                "its service was deleted",
            )
            .await?;
        }
    }
    state.gateway.forget(caller.account_id, &name);
    Ok(Json(shown))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    after: Option<i64>,
    limit: Option<i64>,
}

/// The output of a service's live replicas after chunk `after`, oldest first.
pub async fn service_logs(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
    Query(query): Query<LogQuery>,
) -> ApiResult<Json<ServiceLogs>> {
    require(&caller, &[Role::Tenant])?;
    own_service(&state, &caller, &name).await?;
    let limit = query.limit.unwrap_or(PAGE_SIZE_MAX);
    if !(1..=PAGE_SIZE_MAX).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit: {limit} is not 1–{}",
            PAGE_SIZE_MAX
        )));
    }
    let after = query.after.unwrap_or(0);
    let replicas = state.store.service_replicas(caller.account_id, &name).await?;
    let jobs: std::collections::HashMap<i64, i64> = replicas
        .iter()
        .filter_map(|replica| Some((replica.lease_id?, replica.job_id)))
        .collect();
    let chunks = super::jobs::log_chunks(&state, &jobs, after, limit).await?;
    let next_after = chunks.last().map_or(after, |chunk| chunk.id);
    Ok(Json(ServiceLogs {
        name,
        chunks,
        next_after,
    }))
}

/// A new key that calls this service through the gateway and nothing else; shown once.
pub async fn create_service_key(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
) -> ApiResult<(StatusCode, Json<NewKeyResponse>)> {
    require(&caller, &[Role::Tenant])?;
    own_service(&state, &caller, &name).await?;
    let key = trust::generate_api_key();
    state
        .store
        .insert_service_key(&store::ServiceKeyRecord {
            key_id: key.key_id.clone(),
            tenant_id: caller.account_id,
            service: name,
            secret_hash: key.secret_hash,
            created_at: state.now_us(),
            revoked_at: None,
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(NewKeyResponse {
            key_id: key.key_id,
            api_key: key.display,
        }),
    ))
}

/// Revokes a key of this service: at once on this replica, within `API_KEY_CACHE_TTL` on the
/// others, as for API keys.
pub async fn revoke_service_key(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path((name, key_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    require(&caller, &[Role::Tenant])?;
    if !state
        .store
        .revoke_service_key(caller.account_id, &name, &key_id, state.now_us())
        .await?
    {
        return Err(ApiError::NotFound(format!(
            "no live key {key_id:?} of service {name:?}"
        )));
    }
    state.forget_key(&key_id);
    Ok(StatusCode::NO_CONTENT)
}
