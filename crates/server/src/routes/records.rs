//! The agent's signed records: usage reports (billed against escrow) and attestations, each
//! checked against the node's key and the lease's epoch.

use api::*;
use axum::Json;
use axum::extract::State;
use ledger::Account;
use model::Micros;
use store::{JobState, LeaseState};

use crate::error::{ApiError, ApiResult};
use crate::extract::Signed;
use crate::lifecycle::{end_job, replica_ended};
use crate::metrics::Metrics;
use crate::money;
use crate::state::AppState;
use crate::usage;
use crate::wire::{job_request, lease_view};

use super::AppStateRef;
use super::agent::node_lease;

/// Checks a signed record against the node's key (a forgery is recorded as evidence of `kind`)
/// and the lease's current epoch (an old epoch is fenced off).
async fn check_record<T: trust::RecordBody>(
    state: &AppState,
    node_id: i64,
    record: &trust::SignedRecord<T>,
    lease: &store::LeaseRecord,
    epoch: i64,
    kind: &str,
    usage: bool,
) -> ApiResult<()> {
    let identity = state.node_identity(node_id).await?;
    if let Err(error) = trust::verify_record(&identity.key, node_id, record) {
        state
            .store
            .record_evidence(Some(node_id), kind, &format!("lease {}", lease.id), state.now_us())
            .await?;
        return Err(error.into());
    }
    // Usage a replica delivered before the coordinator ended its lease (which moved the epoch
    // on) is still owed: an agent cut off sends it when contact returns. Its period is checked
    // against the lease's end by the caller.
    let delivered_before_the_end = usage && !lease.state.is_live() && epoch == lease.epoch - 1;
    if epoch != lease.epoch && !delivered_before_the_end {
        return Err(ApiError::Conflict(format!(
            "lease {} is at epoch {}, not {}: reports for an old epoch are refused",
            lease.id, lease.epoch, epoch
        )));
    }
    Ok(())
}

/// A refused usage record's answer: 400, with the policy's section for a violation.
fn refused(refusal: usage::Refusal) -> ApiError {
    match refusal {
        usage::Refusal::Malformed(why) => ApiError::BadRequest(why),
        usage::Refusal::Violation(violation) => ApiError::BadRequest(format!(
            "usage record refused and kept as evidence (docs/trust-policy.md § 4): {violation}"
        )),
    }
}

/// A signed usage record: checked (`usage::assess`), billed against the job's escrow and then
/// the tenant's balance, and kept; a tenant whose money ran out has its job failed.
pub async fn report_usage(State(state): AppStateRef, signed: Signed<SignedUsage>) -> ApiResult<Json<UsageAccepted>> {
    let body = &signed.body.body;
    let lease = node_lease(&state, signed.node_id, body.lease_id, true).await?;
    let record = trust::SignedRecord {
        body: crate::usage::signed_record(body),
        signature_hex: signed.body.signature_hex.clone(),
    };
    check_record(
        &state,
        signed.node_id,
        &record,
        &lease,
        body.epoch,
        "bad_usage_signature",
        true,
    )
    .await?;
    let now = state.now_us();
    usage::well_formed(body).map_err(refused)?;
    // A record taken before (an answer lost on the way, so the agent sent it again) is
    // answered as taken, not checked again: its GPU-seconds are already in the lease's total.
    if let Some(stored) = state.store.usage_row(lease.id, body.sequence).await? {
        return taken_before(&stored, &signed.body.signature_hex);
    }
    // The record's period on the coordinator's clock: the node's clock offset, measured from
    // the time it signed this request, is taken out (docs/trust-policy.md § 4).
    let offset_ms = signed.clock_offset_ms(now);
    let facts = usage_facts(&state, signed.node_id, body, &lease, offset_ms, now).await?;
    let billable = match usage::assess(body, &lease, facts) {
        Ok(billable) => billable,
        Err(usage::Refusal::Violation(violation)) => {
            let detail = serde_json::json!({
                "lease_id": lease.id,
                "epoch": body.epoch,
                "violation": violation,
                "record": body,
                "signature_hex": signed.body.signature_hex,
                "clock_offset_ms": offset_ms,
            });
            crate::fraud::usage_evidence(&state, signed.node_id, "usage_violation", &detail.to_string(), now).await?;
            return Err(refused(usage::Refusal::Violation(violation)));
        }
        Err(refusal) => return Err(refused(refusal)),
    };
    let job = state
        .store
        .job(lease.job_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("job".into()))?;
    let billable = usage::without_pause(billable, usage::repair_pause(&job, &job_request(&job), now));
    let node = state
        .store
        .node(signed.node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("node".into()))?;
    let amount = usage::amount(
        &billable,
        lease.lease.price_micros,
        node.node.simulated,
        state.config.bill_simulated,
    )
    .ok_or_else(|| ApiError::BadRequest("usage charge overflows".into()))?;
    let key = format!("usage:lease-{}:seq-{}", lease.id, body.sequence);
    let (charged, unbilled) = charge(&state, &job, signed.provider_id, node.node.simulated, amount, key, now).await?;
    let fresh = state
        .store
        .insert_usage(&store::UsageRow {
            lease_id: lease.id,
            sequence: body.sequence,
            node_id: signed.node_id,
            gpu_seconds_milli: body.gpu_seconds_milli,
            charged_micros: charged,
            body: serde_json::to_string(body).unwrap_or_default(),
            signature: signed.body.signature_hex.clone(),
            received_at: now,
        })
        .await?;
    Metrics::add(&state.metrics.usage_records, 1);
    if unbilled.0 > 0 {
        end_job(
            &state,
            &job,
            &[JobState::Running],
            JobState::Failed,
            LeaseState::Cancelled,
            "the tenant's balance ran out",
        )
        .await?;
    }
    Ok(Json(UsageAccepted {
        new: fresh,
        charged_micros: if fresh { charged } else { 0 },
    }))
}

/// The answer to a usage record sent again: taken, when it is the one stored under its sequence
/// number; a conflict when its contents differ.
fn taken_before(stored: &store::UsageRow, signature_hex: &str) -> ApiResult<Json<UsageAccepted>> {
    if stored.signature != signature_hex {
        return Err(ApiError::Conflict(format!(
            "lease {} already has usage record {} with other contents",
            stored.lease_id, stored.sequence
        )));
    }
    Ok(Json(UsageAccepted {
        new: false,
        charged_micros: 0,
    }))
}

/// What the usage decision needs from the store and the heartbeat book: the GPU-seconds the
/// lease has had accepted, and the node's own telemetry over the record's period.
async fn usage_facts(
    state: &AppState,
    node_id: i64,
    body: &UsageBody,
    lease: &store::LeaseRecord,
    offset_ms: i64,
    now: i64,
) -> ApiResult<usage::Facts> {
    let (start_ms, end_ms) = usage::period(body, offset_ms);
    let gpus = crate::wire::gpu_indices(lease.lease.gpu_mask);
    Ok(usage::Facts {
        offset_ms,
        accepted_gpu_seconds_milli: state.store.usage_total(lease.id).await?,
        telemetry_utilisation_permille: state.beats.utilisation_over(
            node_id,
            &gpus,
            (start_ms.saturating_mul(1000), end_ms.saturating_mul(1000)),
            trust::rules::TELEMETRY_HEARTBEATS_MIN,
        ),
        now,
    })
}

/// Bills `amount` for `job`'s usage from its escrow first, then from its tenant's balance, the
/// provider paid less the platform's fee (`ledger::usage`), once per `key`. Returns what was
/// billed and what could not be.
async fn charge(
    state: &AppState,
    job: &store::JobRecord,
    provider: i64,
    simulated: bool,
    amount: Micros,
    key: String,
    now: i64,
) -> ApiResult<(i64, Micros)> {
    if amount.0 <= 0 {
        return Ok((0, Micros::ZERO));
    }
    let escrow = money::balance(&state.store, Account::Escrow(job.id)).await?;
    let available = money::balance(&state.store, Account::TenantAvailable(job.tenant_id)).await?;
    let charge = ledger::usage(
        &ledger::BillableUsage {
            tenant: job.tenant_id,
            job: job.id,
            provider,
            amount,
            fee_permille: state.config.platform_fee_permille,
        },
        escrow,
        available,
        key,
        now,
    )
    .map_err(money::ledger_error)?;
    if let Some(transaction) = &charge.tx {
        let mut transaction = transaction.clone();
        if simulated {
            transaction.memo.push_str(" (simulated devices: play money)");
        }
        match money::apply(&state.store, &transaction).await {
            Ok(_) | Err(ApiError::Conflict(_)) => {}
            Err(error) => return Err(error),
        }
    }
    Ok((charge.billed.0, charge.unbilled))
}

pub async fn attest(State(state): AppStateRef, signed: Signed<SignedAttestation>) -> ApiResult<Json<LeaseView>> {
    let body = &signed.body.body;
    let lease = node_lease(&state, signed.node_id, body.lease_id, true).await?;
    let record = trust::SignedRecord {
        body: trust::Attestation {
            lease_id: body.lease_id,
            epoch: body.epoch,
            image_digest: body.image_digest.clone(),
            start_ms: body.start_ms,
            end_ms: body.end_ms,
            exit_code: body.exit_code,
            gpu_seconds_milli: body.gpu_seconds_milli,
            telemetry_digest: body.telemetry_digest.clone(),
            log_digest: body.log_digest.clone(),
            output_digest: body.output_digest.clone(),
            output_bytes: body.output_bytes,
        },
        signature_hex: signed.body.signature_hex.clone(),
    };
    check_record(
        &state,
        signed.node_id,
        &record,
        &lease,
        body.epoch,
        "bad_attestation_signature",
        false,
    )
    .await?;
    let now = state.now_us();
    let stored = state
        .store
        .insert_attestation(&store::AttestationRow {
            lease_id: lease.id,
            epoch: body.epoch,
            node_id: signed.node_id,
            body: serde_json::to_string(body).unwrap_or_default(),
            signature: signed.body.signature_hex.clone(),
            received_at: now,
        })
        .await?;
    if !stored {
        return Err(ApiError::Conflict(format!(
            "lease {} already has an attestation",
            lease.id
        )));
    }
    // An archive that went to the job's output_url: its attested digest and size (one the
    // coordinator keeps was recorded as it came, with the digest of its bytes).
    if !body.output_digest.is_empty() {
        state
            .store
            .put_job_output(&store::JobOutputRow {
                lease_id: lease.id,
                epoch: body.epoch,
                job_id: lease.job_id,
                replica: lease.lease.replica,
                digest: body.output_digest.clone(),
                size_bytes: body.output_bytes,
                archive: None,
                received_at: now,
            })
            .await?;
    }
    let to = if body.exit_code == 0 {
        LeaseState::Finished
    } else {
        LeaseState::Failed
    };
    let reason = crate::wire::exit_reason(body.exit_code);
    replica_ended(&state, signed.node_id, &lease, body.epoch, to, &reason, "attested", now).await?;
    let lease = state
        .store
        .lease(lease.id)
        .await?
        .ok_or_else(|| ApiError::NotFound("lease".into()))?;
    Ok(Json(lease_view(&lease)))
}
