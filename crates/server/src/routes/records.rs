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
use crate::wire::lease_view;

use super::AppStateRef;
use super::agent::node_lease;

fn usage_record(body: &UsageBody) -> trust::UsageRecord {
    trust::UsageRecord {
        lease_id: body.lease_id,
        epoch: body.epoch,
        sequence: body.sequence,
        period_start_ms: body.period_start_ms,
        period_end_ms: body.period_end_ms,
        gpu_seconds_milli: body.gpu_seconds_milli,
        gpu_utilisation_permille: body.gpu_utilisation_permille,
        telemetry_digest: body.telemetry_digest.clone(),
    }
}

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

pub async fn report_usage(State(state): AppStateRef, signed: Signed<SignedUsage>) -> ApiResult<Json<UsageAccepted>> {
    let body = &signed.body.body;
    let lease = node_lease(&state, signed.node_id, body.lease_id, true).await?;
    let record = trust::SignedRecord {
        body: usage_record(body),
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
    if body.sequence < 0 || body.gpu_seconds_milli < 0 || body.period_end_ms <= body.period_start_ms {
        return Err(ApiError::BadRequest(format!(
            "usage record: sequence and gpu_seconds_milli must not be negative, and the period must end after it starts \
             (the period {}..{} ms is outside any lease)",
            body.period_start_ms, body.period_end_ms
        )));
    }
    // A record taken before (an answer lost on the way, so the agent sent it again) is
    // answered as taken, not checked again: its GPU-seconds are already in the lease's total.
    if let Some(stored) = state.store.usage_row(lease.id, body.sequence).await? {
        if stored.signature != signed.body.signature_hex {
            return Err(ApiError::Conflict(format!(
                "lease {} already has usage record {} with other contents",
                lease.id, body.sequence
            )));
        }
        return Ok(Json(UsageAccepted {
            new: false,
            charged_micros: 0,
        }));
    }
    let lease_gpu_milli = i64::from(lease.lease.gpu_mask.count_ones() as u16) * lease.lease.gpu_milli;
    // The record's period on the coordinator's clock: the node's clock offset, measured from
    // the time it signed this request, is taken out (docs/trust-policy.md § 4).
    let offset_ms = signed.clock_offset_ms(now);
    let (start_ms, end_ms) = (
        body.period_start_ms.saturating_sub(offset_ms),
        body.period_end_ms.saturating_sub(offset_ms),
    );
    let lease_end_ms = lease.ended_at.map(|end| end / 1000);
    let terms = trust::rules::LeaseTerms {
        gpu_milli: lease_gpu_milli,
        start_ms: lease.created_at / 1000,
        // An ended lease allows the time its agent may take to notice the end.
        end_ms: lease_end_ms.map_or(now / 1000, |end| end.saturating_add(trust::rules::USAGE_END_NOTICE_MS)),
        accepted_gpu_seconds_milli: state.store.usage_total(lease.id).await?,
    };
    let checked = trust::UsageRecord {
        period_start_ms: start_ms,
        period_end_ms: end_ms,
        ..usage_record(body)
    };
    let gpus = crate::wire::gpu_indices(lease.lease.gpu_mask);
    let telemetry = state.beats.utilisation_over(
        signed.node_id,
        &gpus,
        (start_ms.saturating_mul(1000), end_ms.saturating_mul(1000)),
        trust::rules::TELEMETRY_HEARTBEATS_MIN,
    );
    if let Err(violation) = trust::rules::check_usage(&checked, &terms, telemetry) {
        let detail = serde_json::json!({
            "lease_id": lease.id,
            "epoch": body.epoch,
            "violation": violation,
            "record": body,
            "signature_hex": signed.body.signature_hex,
            "clock_offset_ms": offset_ms,
        });
        crate::fraud::usage_evidence(&state, signed.node_id, "usage_violation", &detail.to_string(), now).await?;
        return Err(ApiError::BadRequest(format!(
            "usage record refused and kept as evidence (docs/trust-policy.md § 4): {violation}"
        )));
    }
    // What the lease can be billed for: a record running past an ended lease (its agent had not
    // noticed yet) is billed up to the end only.
    let billable_gpu_seconds_milli = match lease_end_ms {
        Some(end) if end_ms > end => {
            let inside = (end - start_ms).clamp(0, end_ms - start_ms);
            i64::try_from(i128::from(body.gpu_seconds_milli) * i128::from(inside) / i128::from(end_ms - start_ms))
                .unwrap_or(0)
        }
        _ => body.gpu_seconds_milli,
    };
    let job = state
        .store
        .job(lease.job_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("job".into()))?;
    let node = state
        .store
        .node(signed.node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("node".into()))?;
    // Simulated devices sell nothing real: their usage is recorded, never billed (unless the
    // coordinator bills play money for them, `Config::bill_simulated`).
    let amount = if node.node.simulated && !state.config.bill_simulated {
        Micros::ZERO
    } else {
        Micros(lease.lease.price_micros)
            .cost_for(billable_gpu_seconds_milli as u64, 1)
            .ok_or_else(|| ApiError::BadRequest("usage charge overflows".into()))?
    };
    let key = format!("usage:lease-{}:seq-{}", lease.id, body.sequence);
    let mut charged = 0;
    let mut unbilled = Micros::ZERO;
    if amount.0 > 0 {
        let escrow = money::balance(&state.store, Account::Escrow(job.id)).await?;
        let available = money::balance(&state.store, Account::TenantAvailable(job.tenant_id)).await?;
        let charge = ledger::usage(
            &ledger::BillableUsage {
                tenant: job.tenant_id,
                job: job.id,
                provider: signed.provider_id,
                amount,
                fee_permille: state.config.platform_fee_permille,
            },
            escrow,
            available,
            key.clone(),
            now,
        )
        .map_err(money::ledger_error)?;
        if let Some(transaction) = &charge.tx {
            let mut transaction = transaction.clone();
            if node.node.simulated {
                transaction.memo.push_str(" (simulated devices: play money)");
            }
            match money::apply(&state.store, &transaction).await {
                Ok(_) | Err(ApiError::Conflict(_)) => {}
                Err(error) => return Err(error),
            }
        }
        charged = charge.billed.0;
        unbilled = charge.unbilled;
    }
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
    let to = if body.exit_code == 0 {
        LeaseState::Finished
    } else {
        LeaseState::Failed
    };
    let reason = format!("exit code {}", body.exit_code);
    replica_ended(&state, signed.node_id, &lease, body.epoch, to, &reason, "attested", now).await?;
    let lease = state
        .store
        .lease(lease.id)
        .await?
        .ok_or_else(|| ApiError::NotFound("lease".into()))?;
    Ok(Json(lease_view(&lease)))
}
