//! The signed agent protocol's lease half: heartbeats, lease polls, lease events, progress,
//! output, and node key rotation.

use std::time::Duration;

use api::*;
use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use store::{LeaseMove, LeaseState};

use crate::beats::{self, OverLimitChange};
use crate::config::LONG_POLL_MS_MAX;
use crate::error::{ApiError, ApiResult};
use crate::extract::{Path, PeerAddr, Query, Signed};
use crate::lease_hints::Hint;
use crate::lifecycle::replica_ended;
use crate::metrics::Metrics;
use crate::rendezvous::rendezvous;
use crate::state::AppState;
use crate::wire::{job_request, lease_view};

use super::{AppStateRef, check_name};

async fn agent_leases(state: &AppState, node_id: i64) -> ApiResult<Vec<AgentLease>> {
    let mut out = Vec::new();
    for lease in state.store.live_leases_of_node(node_id).await? {
        let job = state.store.job(lease.job_id).await?;
        let request = job.as_ref().map(job_request).unwrap_or_default();
        let gang = match &job {
            Some(job) if request.replicas > 1 => {
                let members = state.store.gang_members(job.id).await?;
                rendezvous(&members, request.replicas, job.gang_epoch)
                    .and_then(|views| views.into_iter().find(|(id, _)| *id == lease.id))
                    .map(|(_, view)| view)
            }
            _ => None,
        };
        out.push(AgentLease {
            lease: lease_view(&lease),
            job: request,
            gang,
        });
    }
    Ok(out)
}

/// `agent_leases`, without asking the store when the leader knows the node holds none.
async fn agent_leases_hinted(state: &AppState, node_id: i64) -> ApiResult<Vec<AgentLease>> {
    match state.lease_hints.of(node_id) {
        Hint::None => Ok(Vec::new()),
        Hint::Ask(mark) => {
            let leases = agent_leases(state, node_id).await?;
            if let Some(mark) = mark
                && leases.is_empty()
            {
                state.lease_hints.clear(node_id, mark);
            }
            Ok(leases)
        }
    }
}

/// The most leases a heartbeat may say its node holds.
pub const HELD_LEASES_MAX: usize = 4096;

pub async fn heartbeat(
    State(state): AppStateRef,
    signed: Signed<HeartbeatRequest, true>,
) -> ApiResult<Json<HeartbeatResponse>> {
    let now = state.now_us();
    let request = &signed.body;
    if request.gpus.len() > 16 {
        return Err(ApiError::BadRequest("gpus: at most 16".into()));
    }
    if let Some(datasets) = &request.datasets
        && datasets.len() > 10_000
    {
        return Err(ApiError::BadRequest("datasets: at most 10,000 digests".into()));
    }
    if let Some(fingerprint) = &request.fingerprint {
        check_name("fingerprint", fingerprint, false)?;
    }
    if request.leases.as_ref().is_some_and(|held| held.len() > HELD_LEASES_MAX) {
        return Err(ApiError::BadRequest(format!("leases: at most {HELD_LEASES_MAX}")));
    }
    let telemetry = serde_json::json!({"gpus": request.gpus, "over_limit": request.over_limit}).to_string();
    let datasets = request
        .datasets
        .as_ref()
        .map(|digests| serde_json::to_string(digests).unwrap_or_else(|_| "[]".into()));
    let noted = state.beats.note(
        signed.node_id,
        now,
        telemetry,
        request.fingerprint.as_deref(),
        datasets,
        beats::persist(&state.config, state.leads()),
    );
    if noted.fingerprint_to_check
        && let Some(fingerprint) = &request.fingerprint
        && state
            .store
            .set_node_fingerprint(signed.node_id, fingerprint, now)
            .await?
    {
        state
            .store
            .record_evidence(Some(signed.node_id), "fingerprint_changed", fingerprint, now)
            .await?;
    }
    match state.beats.over_limit_change(signed.node_id, request.over_limit) {
        OverLimitChange::Unchanged => {}
        OverLimitChange::Changed => {
            state
                .store
                .set_node_over_limit(signed.node_id, request.over_limit, now)
                .await?;
        }
    }
    state.beats.note_utilisation(signed.node_id, now, &request.gpus);
    Metrics::add(&state.metrics.heartbeats, 1);
    let mut leases = agent_leases_hinted(&state, signed.node_id).await?;
    if let Some(held) = &request.leases {
        let min_age_us = crate::books::fraud::DROP_MIN_AGE_HEARTBEATS * state.config.heartbeat_interval_us();
        let evidence = signed.evidence("POST", "/v1/agent/heartbeat");
        let dropped = state
            .drops
            .note(signed.node_id, held, &leases, evidence, min_age_us, now);
        if !dropped.is_empty() {
            let node = state
                .store
                .node(signed.node_id)
                .await?
                .ok_or_else(|| ApiError::NotFound("node".into()))?;
            for drop in dropped {
                crate::fraud::dropped(&state, &node, drop, now).await?;
            }
            leases = agent_leases(&state, signed.node_id).await?;
        }
    }
    Ok(Json(HeartbeatResponse {
        leases,
        heartbeat_interval_ms: state.config.heartbeat_interval_ms,
        heartbeat_timeout_ms: state.config.heartbeat_timeout_ms,
        canaries: crate::canaries::orders_for(&state, signed.node_id, now).await?,
        prefetch: crate::warm::orders_for(&state, signed.node_id, now, request.datasets.as_deref()).await?,
        gateways: state.gateway.others().into_iter().map(|(url, _, _)| url).collect(),
        limits: Some(state.node_identity(signed.node_id).await?.limits),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeasePoll {
    /// Wait up to this long for the lease set to differ from `known`.
    wait_ms: Option<u64>,
    /// The `version` of the lease set the agent already has.
    known: Option<String>,
}

fn lease_set_version(leases: &[AgentLease]) -> String {
    let mut text = String::new();
    for lease in leases {
        text.push_str(&format!(
            "{}:{}:{}:{:?}:{:?};",
            lease.lease.id,
            lease.lease.epoch,
            lease.lease.state,
            lease.lease.preempt_at_us,
            lease.gang.as_ref().map(|gang| (gang.epoch, &gang.peers))
        ));
    }
    trust::body_digest_hex(text.as_bytes())[..16].to_string()
}

/// The leases the node should run (long-poll): answers at once if they differ from `known`,
/// else when they change, or after `wait_ms`.
pub async fn poll_leases(
    State(state): AppStateRef,
    Query(poll): Query<LeasePoll>,
    signed: Signed<serde_json::Value, true>,
) -> ApiResult<Json<LeaseSet>> {
    let wait = Duration::from_millis(poll.wait_ms.unwrap_or(0).min(LONG_POLL_MS_MAX));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let leases = agent_leases_hinted(&state, signed.node_id).await?;
        let version = lease_set_version(&leases);
        if poll.known.as_deref() != Some(version.as_str()) || tokio::time::Instant::now() >= deadline {
            return Ok(Json(LeaseSet { version, leases }));
        }
        tokio::time::sleep(Duration::from_millis(250).min(deadline - tokio::time::Instant::now())).await;
    }
}

/// The lease `node_id` reports on, if it holds it. A report for one it does not hold is
/// refused and kept as evidence: `foreign_lease`, or `foreign_lease_record` for a signed usage
/// record or attestation, which counts with the usage checks (docs/trust-policy.md § 7).
pub(super) async fn node_lease(
    state: &AppState,
    node_id: i64,
    lease_id: i64,
    record: bool,
) -> ApiResult<store::LeaseRecord> {
    match state.store.lease(lease_id).await? {
        Some(lease) if lease.lease.node_id == node_id => Ok(lease),
        _ => {
            let now = state.now_us();
            let detail = format!("report for lease {lease_id}");
            if record {
                crate::fraud::usage_evidence(state, node_id, "foreign_lease_record", &detail, now).await?;
            } else {
                state
                    .store
                    .record_evidence(Some(node_id), "foreign_lease", &detail, now)
                    .await?;
            }
            Err(ApiError::Forbidden(format!(
                "lease {lease_id} is not held by node {node_id}; the attempt is recorded"
            )))
        }
    }
}

pub async fn lease_event(
    State(state): AppStateRef,
    Path(lease_id): Path<i64>,
    signed: Signed<LeaseEventRequest>,
) -> ApiResult<Json<LeaseView>> {
    let lease = node_lease(&state, signed.node_id, lease_id, false).await?;
    let event = &signed.body;
    if event.state == "staged" {
        return lease_staged(&state, &lease, event).await;
    }
    if event.state == "ready" {
        return lease_ready(&state, &lease, event).await;
    }
    let to = match event.state.as_str() {
        "staging" => LeaseState::Staging,
        "running" => LeaseState::Running,
        "finished" => LeaseState::Finished,
        "failed" => LeaseState::Failed,
        other => {
            return Err(ApiError::BadRequest(format!(
                "state: {other:?} is not staging, staged, running, ready, finished or failed"
            )));
        }
    };
    // A long detail is cut to 128 characters; what is stored is exactly what was checked.
    let reported: String = event.detail.chars().take(128).collect();
    check_name("detail", &reported, false)?;
    let now = state.now_us();
    let detail = match event.exit_code {
        Some(code) => format!("{}; {reported}", crate::wire::exit_reason(code)),
        None => reported.clone(),
    };
    let moved = if to.is_live() {
        match state
            .store
            .move_lease(lease_id, event.epoch, to, &reported, now)
            .await?
        {
            LeaseMove::Moved => {
                state
                    .store
                    .append_lease_event(lease_id, event.epoch, to.as_str(), &detail, now)
                    .await?;
                true
            }
            // Already there or past it: the timeline keeps each change once.
            LeaseMove::Already => true,
            LeaseMove::NotLive => false,
        }
    } else {
        replica_ended(&state, signed.node_id, &lease, event.epoch, to, &reported, &detail, now).await?
    };
    if !moved {
        return Err(ApiError::Conflict(format!(
            "lease {lease_id} is not live at epoch {} (now epoch {}, {}): stop it",
            event.epoch, lease.epoch, lease.state
        )));
    }
    if lease.state == LeaseState::Pending {
        state.metrics.lease_pickup.observe_us(now - lease.created_at);
    }
    let lease = state
        .store
        .lease(lease_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("lease".into()))?;
    Ok(Json(lease_view(&lease)))
}

/// A serving replica's health check answered: the gateway routes to it from now on, and its
/// service counts it healthy.
async fn lease_ready(
    state: &AppState,
    lease: &store::LeaseRecord,
    event: &LeaseEventRequest,
) -> ApiResult<Json<LeaseView>> {
    let now = state.now_us();
    if !state.store.set_lease_ready(lease.id, event.epoch, now).await? {
        return Err(ApiError::Conflict(format!(
            "lease {} is not live at epoch {} (now epoch {}, {}): stop it",
            lease.id, event.epoch, lease.epoch, lease.state
        )));
    }
    state
        .store
        .append_lease_event(lease.id, event.epoch, "ready", "its health check answered", now)
        .await?;
    Ok(Json(lease_view(lease)))
}

/// A gang replica staged (datasets there, image present) with the port its agent reserved: once
/// every replica of the gang is, the lease set hands them the rendezvous (the start barrier).
async fn lease_staged(
    state: &AppState,
    lease: &store::LeaseRecord,
    event: &LeaseEventRequest,
) -> ApiResult<Json<LeaseView>> {
    let port = event.port.filter(|port| *port > 0).ok_or_else(|| {
        ApiError::BadRequest("port: a staged replica names the port its agent reserved (1–65535)".into())
    })?;
    if !state.store.stage_lease(lease.id, event.epoch, port).await? {
        return Err(ApiError::Conflict(format!(
            "lease {} is not live at epoch {} (now epoch {}, {}): stop it",
            lease.id, event.epoch, lease.epoch, lease.state
        )));
    }
    state
        .store
        .append_lease_event(lease.id, event.epoch, "staged", &format!("port {port}"), state.now_us())
        .await?;
    // The last replica staged meets the barrier: a repair's pause in billing ends here.
    if let Some(job) = state.store.job(lease.job_id).await? {
        let members = state.store.gang_members(job.id).await?;
        if rendezvous(&members, job_request(&job).replicas, job.gang_epoch).is_some() {
            state.store.mark_gang_assembled(job.id, state.now_us()).await?;
        }
    }
    let lease = state
        .store
        .lease(lease.id)
        .await?
        .ok_or_else(|| ApiError::NotFound("lease".into()))?;
    Ok(Json(lease_view(&lease)))
}

/// Replaces the node's key with a new one, in a request signed by the current key: from then on
/// only the new key signs for the node (on other replicas within about a second).
pub async fn rotate_node_key(State(state): AppStateRef, signed: Signed<KeyRotation>) -> ApiResult<Json<NodeView>> {
    let new = signed.body.public_key.trim().to_lowercase();
    trust::parse_public_key(&new)?;
    // The key that signed this request: a key rotated away meanwhile changes nothing.
    let old_hex = trust::public_key_hex(&state.node_identity(signed.node_id).await?.key);
    if new == old_hex {
        return Err(ApiError::BadRequest(
            "public_key: that is the node's current key".into(),
        ));
    }
    let rotated = state
        .store
        .rotate_node_key(signed.node_id, &old_hex, &new, state.now_us())
        .await?;
    state.forget_node(signed.node_id);
    if !rotated {
        return Err(ApiError::Conflict(
            "the node's key changed meanwhile; sign with the current key".into(),
        ));
    }
    tracing::info!(node = signed.node_id, "node key rotated");
    let record = state
        .store
        .node(signed.node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("node".into()))?;
    Ok(Json(crate::wire::node_view(&record, 0.0, 0, 0)))
}

/// A registered node's agent restates what it says of the node on start (`NodeRestatement`):
/// checked as a registration is, with the setting's name in any refusal.
pub async fn restate_node(
    State(state): AppStateRef,
    PeerAddr(peer): PeerAddr,
    signed: Signed<NodeRestatement>,
) -> ApiResult<Json<NodeView>> {
    let record = state
        .store
        .node(signed.node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("node".into()))?;
    let mut registration = signed.body.registration.clone();
    // What the coordinator keeps: the key that signed this, the GPUs, the fingerprint.
    registration.public_key = record.node.public_key.clone();
    registration.fingerprint = record.node.fingerprint.clone();
    registration.gpu_model = record.node.gpu_model.clone();
    registration.gpu_count = record.node.gpu_count.clamp(1, 16) as u8;
    registration.simulated = record.node.simulated;
    let mut policy: PolicyDoc = serde_json::from_str(&record.node.policy).unwrap_or_default();
    if signed.body.policy_given {
        policy.asks = registration.policy.asks.clone();
        policy.thermal_limit_c = registration.policy.thermal_limit_c;
        policy.power_limit_w = registration.policy.power_limit_w;
    }
    registration.policy = policy;
    let node = super::nodes::new_node(
        &state,
        record.node.provider_id,
        peer,
        &registration,
        &[],
        Some(record.id),
    )
    .await?;
    let canary_kinds = super::nodes::canary_kinds_of(&registration)?;
    let now = state.now_us();
    if !state.store.restate_node(record.id, &node, now).await? {
        return Err(ApiError::NotFound("node".into()));
    }
    state.store.set_node_canary_kinds(record.id, &canary_kinds).await?;
    state.forget_node(record.id);
    state.wake.notify_one();
    let restated = store::NodeRecord {
        node,
        updated_at: now,
        ..record.clone()
    };
    if restated.node != record.node {
        tracing::info!(node = record.id, name = %restated.node.name, "the node's agent restated its facts");
    }
    Ok(Json(crate::wire::node_view(&restated, 0.0, 0, 0)))
}

/// The owner takes GPUs of this node back from its host (`fallow agent reclaim`, `pause`),
/// signed with the node's key: no provider key on the host.
pub async fn agent_reclaim(State(state): AppStateRef, signed: Signed<ReclaimRequest>) -> ApiResult<Json<ReclaimView>> {
    let now = state.now_us();
    Ok(Json(
        crate::reclaim::reclaim(&state, signed.node_id, &signed.body, now).await?,
    ))
}

/// The owner gives this node's GPUs back to the market from its host (`fallow agent resume`).
pub async fn agent_resume(
    State(state): AppStateRef,
    signed: Signed<serde_json::Value>,
) -> ApiResult<Json<ReclaimView>> {
    let now = state.now_us();
    Ok(Json(crate::reclaim::resume(&state, signed.node_id, now).await?))
}

/// A replica's progress from its agent, at the lease's current epoch.
pub async fn lease_progress(
    State(state): AppStateRef,
    Path(lease_id): Path<i64>,
    signed: Signed<ProgressRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let lease = node_lease(&state, signed.node_id, lease_id, false).await?;
    let progress = &signed.body;
    check_name("unit", &progress.unit, true)?;
    if progress.done < 0 {
        return Err(ApiError::BadRequest(format!("done: {} is negative", progress.done)));
    }
    if progress.epoch != lease.epoch {
        return Err(ApiError::Conflict(format!(
            "lease {lease_id} is at epoch {}, not {}: stop it",
            lease.epoch, progress.epoch
        )));
    }
    state
        .store
        .set_lease_progress(lease_id, &progress.unit, progress.done, state.now_us())
        .await?;
    Ok(Json(serde_json::json!({"recorded": true})))
}

/// The most a lease's stored output may hold (characters); later chunks are not stored.
pub const LEASE_LOG_CHARS_MAX: i64 = 8 << 20;

/// A chunk of a replica's output from its agent, at the lease's current epoch.
pub async fn lease_log(
    State(state): AppStateRef,
    Path(lease_id): Path<i64>,
    signed: Signed<LogChunkRequest>,
) -> ApiResult<Json<LogChunkAccepted>> {
    let lease = node_lease(&state, signed.node_id, lease_id, false).await?;
    let chunk = &signed.body;
    if chunk.byte_offset < 0 {
        return Err(ApiError::BadRequest(format!(
            "byte_offset: {} is negative",
            chunk.byte_offset
        )));
    }
    if chunk.text.chars().count() > LOG_CHUNK_CHARS_MAX {
        return Err(ApiError::BadRequest(format!(
            "text: at most {LOG_CHUNK_CHARS_MAX} characters a chunk"
        )));
    }
    if chunk.epoch != lease.epoch {
        return Err(ApiError::Conflict(format!(
            "lease {lease_id} is at epoch {}, not {}: stop it",
            lease.epoch, chunk.epoch
        )));
    }
    let stored = state
        .store
        .append_lease_log(
            &store::LogChunk {
                id: 0,
                lease_id,
                epoch: chunk.epoch,
                byte_offset: chunk.byte_offset,
                text: chunk.text.clone(),
                at: state.now_us(),
            },
            LEASE_LOG_CHARS_MAX,
        )
        .await?;
    Ok(Json(LogChunkAccepted { stored }))
}
