//! A tenant's jobs: submit, quote, list, show (with why it waits), cancel, and their output.

use std::sync::Arc;

use api::*;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ledger::Account;
use serde::Deserialize;
use store::{JobRecord, JobState, LeaseState, NewJob, Role};

use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody, Path, Query};
use crate::lifecycle::end_job;
use crate::metrics::Metrics;
use crate::money;
use crate::state::{AppState, Caller};
use crate::wire::{job_request, job_view};

use super::{AppStateRef, own_job, require};

/// A running job's wait in a preemption (see `wire::preemption_wait`); reads the victims it
/// waits for only when none of its leases has started.
async fn running_reason(state: &AppState, job: &JobRecord, leases: &[store::LeaseRecord]) -> ApiResult<Option<String>> {
    if job.state != JobState::Running {
        return Ok(None);
    }
    let waiting = leases
        .iter()
        .any(|lease| lease.state == LeaseState::Pending && lease.lease.preempt_at.is_none());
    let victims = if waiting {
        state.store.live_victims_of(job.id).await?
    } else {
        Vec::new()
    };
    let grace_s = state.config.matcher.preemption_grace_s;
    Ok(crate::wire::preemption_wait(
        job,
        leases,
        &victims,
        grace_s,
        state.now_us(),
    ))
}

async fn full_job_view(state: &AppState, job: &JobRecord) -> ApiResult<JobView> {
    let leases = state.store.leases_of_job(job.id).await?;
    let escrow = state.store.balance(&Account::Escrow(job.id).key()).await?;
    let mut cost = 0;
    for lease in &leases {
        for usage in state.store.usage_of_lease(lease.id).await? {
            cost += usage.charged_micros;
        }
    }
    let mut view = job_view(job, &leases, cost, escrow);
    view.capacity = capacity(state, job, &view.spec, &leases).await?;
    for output in state.store.job_outputs(job.id).await? {
        if let Some(lease) = view.leases.iter_mut().find(|lease| lease.id == output.lease_id) {
            lease.output = Some(api::OutputView {
                digest: output.digest,
                size_bytes: output.size_bytes,
                kept: output.kept,
                expired_at_us: output.expired_at,
            });
        }
    }
    if let Some(reason) = running_reason(state, job, &leases).await? {
        view.state_reason = reason;
    }
    let ids: Vec<i64> = leases.iter().map(|lease| lease.id).collect();
    let progress = state.store.lease_progress(&ids).await?;
    if let Some(unit) = progress.first().map(|first| &first.unit) {
        let done: i64 = progress
            .iter()
            .filter(|other| &other.unit == unit)
            .map(|other| other.done)
            .sum();
        view.progress = Some(ProgressView {
            unit: unit.clone(),
            done,
            cost_micros_per_million_units: if done > 0 {
                i64::try_from(i128::from(cost) * 1_000_000 / i128::from(done)).unwrap_or(i64::MAX)
            } else {
                0
            },
        });
    }
    Ok(view)
}

/// Where a job was placed last: inside a booking, on its tenant's own nodes, or on the market.
async fn capacity(
    state: &AppState,
    job: &JobRecord,
    request: &JobRequest,
    leases: &[store::LeaseRecord],
) -> ApiResult<Option<String>> {
    let Some(last) = leases.iter().max_by_key(|lease| lease.id) else {
        return Ok(None);
    };
    if request.reservation.is_some() {
        return Ok(Some("reservation".into()));
    }
    let own: Vec<i64> = state
        .store
        .own_providers_of(job.tenant_id)
        .await?
        .into_iter()
        .map(|(provider, _)| provider)
        .collect();
    let provider = state
        .store
        .node(last.lease.node_id)
        .await?
        .map(|node| node.node.provider_id);
    let own_node = provider.is_some_and(|provider| own.contains(&provider));
    Ok(Some(
        if own_node && last.lease.price_micros == 0 {
            "own"
        } else {
            "market"
        }
        .into(),
    ))
}

pub async fn submit_job(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<JobRequest>,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    require(&caller, &[Role::Tenant])?;
    request.to_spec(0, caller.account_id, 0, |_| None)?;
    if let Some(id) = request.reservation {
        inside_reservation(&state, &caller, id, &request).await?;
    } else if !state.recently_funded(caller.account_id) {
        let available = money::balance(&state.store, Account::TenantAvailable(caller.account_id)).await?;
        // A tenant with nodes of its own runs there at no price, credit or not.
        let owns_nodes = available.0 <= 0 && !state.store.own_providers_of(caller.account_id).await?.is_empty();
        if available.0 <= 0 && !owns_nodes {
            return Err(ApiError::PaymentRequired(
                "your balance is $0: ask an admin to credit your account before submitting jobs".into(),
            ));
        }
        state.note_funded(caller.account_id);
    }
    let spec = serde_json::to_string(&request).map_err(|error| ApiError::Internal(error.to_string()))?;
    let record = state
        .submissions
        .submit(NewJob {
            tenant_id: caller.account_id,
            client_token: request.client_token.clone(),
            spec,
            tier: request.tier.clone(),
            submitted_at: state.now_us(),
            reservation_id: request.reservation,
        })
        .await?;
    Metrics::add(&state.metrics.jobs_submitted, 1);
    state.wake.notify_one();
    Ok((StatusCode::CREATED, Json(job_view(&record, &[], 0, 0))))
}

/// Checks that a job may run inside the caller's reservation `id`: live, and big and long
/// enough for the job's whole GPUs and runtime.
async fn inside_reservation(state: &AppState, caller: &Caller, id: i64, request: &JobRequest) -> ApiResult<()> {
    let record = super::reservations::own_reservation(state, caller, id)
        .await
        .map_err(|_| ApiError::NotFound(format!("reservation: {id} is not one of your reservations")))?;
    if !record.is_live() {
        return Err(ApiError::Conflict(format!(
            "reservation: {id} has {} ({}); a job runs inside a booked or active reservation",
            record.state, record.state_reason
        )));
    }
    let gpus = match (request.gpus, request.gpu_share_milli, &request.compute_units) {
        (Some(gpus), None, None) if gpus > 0 => i64::from(gpus) * i64::from(request.replicas),
        _ => {
            return Err(ApiError::Conflict(
                "gpus: a job inside a reservation asks for whole GPUs per replica (the booking holds whole GPUs)"
                    .into(),
            ));
        }
    };
    if gpus > record.gpus {
        return Err(ApiError::Conflict(format!(
            "gpus: the job asks for {gpus} GPUs in all and reservation {id} holds {}",
            record.gpus
        )));
    }
    let length_s = (record.ends_at - record.starts_at) / 1_000_000;
    if i64::from(request.max_runtime_s) > length_s {
        return Err(ApiError::Conflict(format!(
            "max_runtime_s: {} is longer than reservation {id} ({length_s} s)",
            request.max_runtime_s
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    before: Option<i64>,
    limit: Option<i64>,
    /// Only jobs in this state.
    state: Option<String>,
    /// Only jobs submitted at or after this time, µs since the Unix epoch.
    since_us: Option<i64>,
}

pub async fn list_jobs(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(page): Query<Page>,
) -> ApiResult<Json<JobList>> {
    require(&caller, &[Role::Tenant])?;
    let limit = page.limit.unwrap_or(50);
    if !(1..=PAGE_SIZE_MAX).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit: {limit} is not 1–{PAGE_SIZE_MAX}")));
    }
    let job_state = match page.state.as_deref() {
        None => None,
        Some(text) => Some(store::JobState::parse(text).ok_or_else(|| {
            let states: Vec<&str> = store::JobState::ALL.iter().map(|state| state.as_str()).collect();
            ApiError::BadRequest(format!("state: {text:?} is not one of {}", states.join(", ")))
        })?),
    };
    let filter = store::JobsWhere {
        before: page.before,
        limit,
        state: job_state,
        since_us: page.since_us,
    };
    let jobs = state.store.jobs_of_tenant_where(caller.account_id, &filter).await?;
    let next_before = if jobs.len() as i64 == limit {
        jobs.last().map(|job| job.id)
    } else {
        None
    };
    let mut views = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let leases = state.store.leases_of_job(job.id).await?;
        let mut view = job_view(job, &leases, 0, 0);
        if let Some(reason) = running_reason(&state, job, &leases).await? {
            view.state_reason = reason;
        }
        views.push(view);
    }
    Ok(Json(JobList {
        jobs: views,
        next_before,
    }))
}

pub async fn show_job(State(state): AppStateRef, Auth(caller): Auth, Path(id): Path<i64>) -> ApiResult<Json<JobView>> {
    let job = own_job(&state, &caller, id).await?;
    let mut view = full_job_view(&state, &job).await?;
    if job.state == JobState::Queued {
        view.explanation = explain_queued(&state, &job).await?;
    }
    Ok(Json(view))
}

/// Why a queued job waits: the matcher's per-constraint account (O(nodes), on request only).
async fn explain_queued(state: &AppState, job: &JobRecord) -> ApiResult<Option<String>> {
    crate::reconcile::ensure_view(state).await?;
    let fleet = state.view.lock().await;
    let Some(fleet) = fleet.as_ref() else { return Ok(None) };
    let now_s = state.now_us() / 1_000_000;
    let request = job_request(job);
    let Ok(spec) = request.to_spec(job.id, job.tenant_id, now_s, |name| fleet.region(name)) else {
        return Ok(None);
    };
    // The regions by the names the job gave: one no node is in has no id to name it by.
    Ok(Some(
        fleet.matcher.explain_naming(&spec, now_s, &request.regions).message,
    ))
}

pub async fn cancel_job(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<JobView>> {
    let job = own_job(&state, &caller, id).await?;
    if job.state.is_final() {
        return Err(ApiError::Conflict(format!("job {id} already ended ({})", job.state)));
    }
    let ended = end_job(
        &state,
        &job,
        &[JobState::Queued, JobState::Running],
        JobState::Cancelled,
        LeaseState::Cancelled,
        "cancelled by its tenant",
    )
    .await?;
    if ended.is_none() {
        return Err(ApiError::Conflict(format!(
            "job {id} ended meanwhile; nothing to cancel"
        )));
    }
    let job = own_job(&state, &caller, id).await?;
    Ok(Json(full_job_view(&state, &job).await?))
}

pub async fn quote_job(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<JobRequest>,
) -> ApiResult<Json<QuoteView>> {
    require(&caller, &[Role::Tenant, Role::Admin])?;
    let own: Vec<i64> = match caller.role {
        Role::Tenant => state
            .store
            .own_providers_of(caller.account_id)
            .await?
            .into_iter()
            .map(|(provider, _)| provider)
            .collect(),
        _ => Vec::new(),
    };
    crate::reconcile::ensure_view(&state).await?;
    let view = state.view.lock().await;
    let view = view
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the fleet view is not built yet".into()))?;
    let now_s = state.now_us() / 1_000_000;
    let spec = request.to_spec(0, caller.account_id, now_s, |name| view.region(name))?;
    let quote = view.matcher.quote_naming(&spec, now_s, &request.regions);
    // On the tenant's own nodes, as the leader plans it: only those, whatever their asks.
    let own_nodes_feasible = (!own.is_empty()).then(|| {
        let nodes = view.nodes_of_providers(&own);
        if nodes.is_empty() {
            return 0;
        }
        let mut own_spec = spec.clone();
        own_spec.only_nodes = nodes;
        own_spec.max_price = model::Micros(i64::MAX / 4);
        view.matcher
            .quote_naming(&own_spec, now_s, &request.regions)
            .nodes_feasible
    });
    Ok(Json(QuoteView {
        price_micros_per_gpu_hour: quote.price_per_gpu_hour.map(|price| price.0),
        nodes_feasible: quote.nodes_feasible,
        nodes_with_data: (!spec.datasets.is_empty()).then_some(quote.nodes_holding_data),
        gpus_feasible: quote.gpus_available,
        nodes_total: view.node_ids.len() as u64,
        explanation: quote
            .explanation
            .map(|explanation| explanation.message)
            .unwrap_or_default(),
        own_nodes_feasible,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    after: Option<i64>,
    limit: Option<i64>,
}

/// The output of the leases in `replicas` (lease id → the replica each chunk is labelled with)
/// after chunk `after`, oldest first.
pub(super) async fn log_chunks(
    state: &AppState,
    replicas: &std::collections::HashMap<i64, i64>,
    after: i64,
    limit: i64,
) -> ApiResult<Vec<LogChunkView>> {
    let ids: Vec<i64> = replicas.keys().copied().collect();
    Ok(state
        .store
        .lease_logs(&ids, after, limit)
        .await?
        .into_iter()
        .map(|chunk| LogChunkView {
            id: chunk.id,
            lease_id: chunk.lease_id,
            replica: replicas.get(&chunk.lease_id).copied().unwrap_or(0),
            byte_offset: chunk.byte_offset,
            text: chunk.text,
            at_us: chunk.at,
        })
        .collect())
}

/// A job's output, from every replica, oldest first.
pub async fn job_logs(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
    Query(query): Query<LogQuery>,
) -> ApiResult<Json<JobLogs>> {
    let job = own_job(&state, &caller, id).await?;
    let limit = query.limit.unwrap_or(PAGE_SIZE_MAX);
    if !(1..=PAGE_SIZE_MAX).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit: {limit} is not 1–{PAGE_SIZE_MAX}")));
    }
    let after = query.after.unwrap_or(0);
    let leases = state.store.leases_of_job(job.id).await?;
    let replicas: std::collections::HashMap<i64, i64> =
        leases.iter().map(|lease| (lease.id, lease.lease.replica)).collect();
    let chunks = log_chunks(&state, &replicas, after, limit).await?;
    let next_after = chunks.last().map_or(after, |chunk| chunk.id);
    Ok(Json(JobLogs {
        job_id: job.id,
        chunks,
        next_after,
    }))
}

/// The caller's jobs, newest first, exactly as `GET /v1/jobs` answers them.
pub(crate) async fn jobs_page(
    state: Arc<AppState>,
    caller: Caller,
    before: Option<i64>,
    limit: i64,
) -> ApiResult<JobList> {
    let page = Page {
        before,
        limit: Some(limit),
        state: None,
        since_us: None,
    };
    Ok(list_jobs(State(state), Auth(caller), Query(page)).await?.0)
}

/// A page of a job's output after chunk `after`, exactly as `GET /v1/jobs/{id}/logs` answers.
pub(crate) async fn job_logs_page(state: Arc<AppState>, caller: Caller, id: i64, after: i64) -> ApiResult<JobLogs> {
    let query = LogQuery {
        after: Some(after),
        limit: None,
    };
    Ok(job_logs(State(state), Auth(caller), Path(id), Query(query)).await?.0)
}
