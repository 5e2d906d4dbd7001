//! An owner takes GPUs back (docs/trust-policy.md § 8): `POST /v1/nodes/{id}/reclaim` with the
//! provider's key, or `POST /v1/agent/reclaim` signed by the node's own key from its host.
//! The GPUs taken are held in the leader's matcher (`FleetView::hold_reclaimed`) so they sell
//! nothing; bronze work on them gets the grace period and stops, firm work runs on to its end
//! unless the reclaim is forced, which stops it too and pays its tenant from the provider's
//! earnings. A reclaim with an end is lifted by the reconcile loop (`end_expired`).

use api::{RECLAIM_FOR_S_MAX, ReclaimRequest, ReclaimView, ReclaimedLease};
use model::{Micros, Tier};
use store::LeaseRecord;

use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::gpu_indices;

/// How often the leader looks for reclaims whose time is up.
pub const EXPIRY_CHECK_EVERY_US: i64 = 1_000_000;

/// Takes GPUs of `node_id` back for its owner (`request`); a later reclaim replaces an earlier.
pub async fn reclaim(
    state: &AppState,
    node_id: i64,
    request: &ReclaimRequest,
    now: i64,
) -> Result<ReclaimView, ApiError> {
    let node = state
        .store
        .node(node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("node".into()))?;
    let gpu_count = node.node.gpu_count.clamp(0, 16) as u32;
    if gpu_count == 0 {
        return Err(ApiError::BadRequest("the node has no GPUs to reclaim".into()));
    }
    let wanted = request.gpus.unwrap_or(gpu_count);
    if wanted == 0 || wanted > gpu_count {
        return Err(ApiError::BadRequest(format!(
            "gpus: the node has {gpu_count} GPUs; reclaim 1 to {gpu_count} (none given: all)"
        )));
    }
    let until = match request.for_s {
        None => None,
        Some(0) => return Err(ApiError::BadRequest("for_s: give at least 1 second".into())),
        Some(seconds) if seconds > RECLAIM_FOR_S_MAX => {
            return Err(ApiError::BadRequest(format!(
                "for_s: at most {RECLAIM_FOR_S_MAX} seconds (a year); leave it out to reclaim until resumed"
            )));
        }
        Some(seconds) => Some(now + seconds as i64 * 1_000_000),
    };
    let leases = state.store.live_leases_of_node(node_id).await?;
    let mask = choose(gpu_count, wanted, node.reclaim_gpu_mask, &leases);
    let grace_us = i64::from(state.config.matcher.preemption_grace_s) * 1_000_000;
    let (mut stopping, mut running_on) = (Vec::new(), Vec::new());
    for lease in leases.iter().filter(|lease| lease.lease.gpu_mask & mask != 0) {
        let firm = lease.lease.tier != Tier::Bronze.name();
        let mut seen = ReclaimedLease {
            lease_id: lease.id,
            job_id: lease.job_id,
            tier: lease.lease.tier.clone(),
            gpus: gpu_indices(lease.lease.gpu_mask),
            stop_at_us: lease.lease.preempt_at,
            expected_end_us: lease.lease.expected_end,
            credit_micros: 0,
        };
        let stop_at = now + grace_us;
        if lease.lease.preempt_at.is_some_and(|at| at <= stop_at) {
            // Stopping already, as soon or sooner: nothing changes, nothing more is paid.
            stopping.push(seen);
            continue;
        }
        if firm && !request.force {
            running_on.push(seen);
            continue;
        }
        if !state.store.set_lease_preempt_at(lease.id, Some(stop_at)).await? {
            continue;
        }
        seen.stop_at_us = Some(stop_at);
        if firm {
            seen.credit_micros = credit_tenant(state, node.node.provider_id, lease, now).await?.0;
        }
        tracing::info!(
            node = node_id,
            lease = lease.id,
            tier = %lease.lease.tier,
            credit_micros = seen.credit_micros,
            "the owner reclaims the lease's GPUs; stopping it"
        );
        stopping.push(seen);
    }
    state.store.set_node_reclaim(node_id, mask, until, now).await?;
    // The leader's matcher holds them at once; every replica's view is built again with them.
    if let Some(view) = state.view.lock().await.as_mut() {
        view.set_reclaim(node_id, mask as u16);
    }
    state.wake.notify_one();
    tracing::info!(node = node_id, gpus = ?gpu_indices(mask), until_us = ?until, force = request.force, "GPUs reclaimed by their owner");
    Ok(ReclaimView {
        node_id,
        gpus: gpu_indices(mask),
        until_us: until,
        stopping,
        running_on,
    })
}

/// Gives every reclaimed GPU of `node_id` back to the market.
pub async fn resume(state: &AppState, node_id: i64, now: i64) -> Result<ReclaimView, ApiError> {
    if !state.store.set_node_reclaim(node_id, 0, None, now).await? {
        return Err(ApiError::NotFound("node".into()));
    }
    if let Some(view) = state.view.lock().await.as_mut() {
        view.set_reclaim(node_id, 0);
    }
    state.wake.notify_one();
    tracing::info!(node = node_id, "the owner resumed the node");
    Ok(ReclaimView {
        node_id,
        ..ReclaimView::default()
    })
}

/// Lifts the reclaims whose time is up.
pub async fn end_expired(state: &AppState, now: i64) -> Result<(), ApiError> {
    let resumed = state.store.end_expired_reclaims(now).await?;
    if resumed.is_empty() {
        return Ok(());
    }
    if let Some(view) = state.view.lock().await.as_mut() {
        for &node in &resumed {
            view.set_reclaim(node, 0);
        }
    }
    tracing::info!(nodes = ?resumed, "reclaims over; the GPUs sell again");
    state.wake.notify_one();
    Ok(())
}

/// The `wanted` GPUs of a node with `gpu_count` to reclaim: those reclaimed already first (a
/// new reclaim does not move the owner's GPUs about), then idle ones, then those running bronze
/// work only, then those running firm work; lower indices first among equals.
fn choose(gpu_count: u32, wanted: u32, already: i64, leases: &[LeaseRecord]) -> i64 {
    let rank = |gpu: u32| -> u8 {
        let bit = 1i64 << gpu;
        if already & bit != 0 {
            return 0;
        }
        let on: Vec<&LeaseRecord> = leases.iter().filter(|lease| lease.lease.gpu_mask & bit != 0).collect();
        if on.is_empty() {
            1
        } else if on.iter().all(|lease| lease.lease.tier == Tier::Bronze.name()) {
            2
        } else {
            3
        }
    };
    let mut gpus: Vec<u32> = (0..gpu_count).collect();
    gpus.sort_by_key(|gpu| (rank(*gpu), *gpu));
    gpus.iter().take(wanted as usize).fold(0, |mask, gpu| mask | (1 << gpu))
}

/// Pays the tenant of firm `lease`, stopped by a forced reclaim, its credit (§ 8): from the
/// provider's earnings, and what those cannot cover from the platform's SLA pot.
async fn credit_tenant(state: &AppState, provider: i64, lease: &LeaseRecord, now: i64) -> Result<Micros, ApiError> {
    let Some(job) = state.store.job(lease.job_id).await? else {
        return Ok(Micros::ZERO);
    };
    let Some(amount) = crate::lifecycle::hours_of_lease(lease, trust::rules::RECLAIM_CREDIT_HOURS) else {
        return Ok(Micros::ZERO);
    };
    let earnings = Micros(
        state
            .store
            .balance(&ledger::Account::ProviderEarnings(provider).key())
            .await?,
    );
    let plan = ledger::refund(
        job.tenant_id,
        provider,
        amount,
        earnings,
        format!("reclaim:lease-{}", lease.id),
        now,
    )
    .map_err(crate::money::ledger_error)?;
    if let Some(tx) = &plan.tx {
        crate::money::apply(&state.store, tx).await?;
    }
    if plan.unrefunded > Micros::ZERO {
        let pot = ledger::sla_credit(
            job.tenant_id,
            plan.unrefunded,
            format!("reclaim-sla:lease-{}", lease.id),
            now,
        )
        .map_err(crate::money::ledger_error)?;
        crate::money::apply(&state.store, &pot).await?;
    }
    Ok(amount)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(gpu_mask: i64, tier: &str) -> LeaseRecord {
        let mut lease = crate::fleet::tests::lease(1, 1, 1, gpu_mask, None);
        lease.lease.tier = tier.into();
        lease
    }

    #[test]
    fn idle_gpus_go_first_then_bronze_then_firm() {
        let leases = [on(0b0001, "gold"), on(0b0010, "bronze"), on(0b0100, "silver")];
        assert_eq!(choose(4, 1, 0, &leases), 0b1000, "the idle one");
        assert_eq!(choose(4, 2, 0, &leases), 0b1010, "then the bronze one");
        assert_eq!(choose(4, 3, 0, &leases), 0b1011, "then firm, lower index first");
        assert_eq!(choose(4, 4, 0, &leases), 0b1111);
    }

    #[test]
    fn a_new_reclaim_keeps_the_gpus_taken_before() {
        assert_eq!(choose(4, 1, 0b0100, &[]), 0b0100);
        assert_eq!(choose(4, 2, 0b0100, &[]), 0b0101);
    }
}
