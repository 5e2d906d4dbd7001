//! The life of a job and its leases, in one place: ending a job (its escrow released), settling
//! it when its replicas have ended, a replica's end as its agent reports it, preemption's end
//! (the job queued again, a gang restarted whole), losing a node's leases (gold credited for the
//! breach) and restarting jobs. Used by the routes, the reconcile loop and the fraud proofs.

use ledger::Account;
use model::{Micros, Tier};
use store::{JobEnd, JobRecord, JobState, LeaseMove, LeaseState};

use crate::books::reputation::{LEASE_JOB_FAILED, LEASE_OK};
use crate::error::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::money;
use crate::state::AppState;

/// Ends a job and releases its escrow; its live leases end with `leases_to` (agents stop them).
pub async fn end_job(
    state: &AppState,
    job: &JobRecord,
    from: &[JobState],
    to: JobState,
    leases_to: LeaseState,
    reason: &str,
) -> ApiResult<Option<Vec<store::LeaseRecord>>> {
    let now = state.now_us();
    let escrow = money::balance(&state.store, Account::Escrow(job.id)).await?;
    let release = ledger::release(job.tenant_id, job.id, escrow, format!("release:job-{}", job.id), now)
        .map_err(money::ledger_error)?
        .map(|transaction| money::row(&transaction));
    let end = JobEnd {
        job_id: job.id,
        from: from.to_vec(),
        to,
        reason: reason.to_string(),
        leases_to,
        release,
    };
    let ended = state.store.end_job(&end, now).await?;
    if ended.is_some() {
        state.wake.notify_one();
    }
    Ok(ended)
}

/// A replica's end as its agent reports it (an event or an attestation), at `epoch`: the lease
/// ends `to` (the node's outcome recorded, the job settled), or, in a preemption's grace
/// period, as preempted whatever the exit (its job queues again). False when the lease was not
/// live at that epoch.
#[allow(clippy::too_many_arguments)]
pub async fn replica_ended(
    state: &AppState,
    node_id: i64,
    lease: &store::LeaseRecord,
    epoch: i64,
    to: LeaseState,
    reason: &str,
    event_detail: &str,
    now: i64,
) -> ApiResult<bool> {
    if lease.epoch == epoch && lease.in_preemption_grace(state.config.matcher.preemption_grace_s, now) {
        let why = why_preempted(state, lease).await;
        let reason = format!("{why}; its replica stopped within the grace period ({reason})");
        if !end_preempted(state, lease.id, &reason, now).await? {
            return Ok(false);
        }
        state
            .store
            .append_lease_event(lease.id, epoch, LeaseState::Preempted.as_str(), event_detail, now)
            .await?;
        return Ok(true);
    }
    if to == LeaseState::Failed
        && lease.epoch == epoch
        && matches!(lease.state, LeaseState::Pending | LeaseState::Staging)
        && gang_replicas(state, lease.job_id).await? > 1
    {
        return gang_start_failed(state, node_id, lease, epoch, reason, event_detail, now).await;
    }
    if to == LeaseState::Failed
        && lease.epoch == epoch
        && lease.state == LeaseState::Running
        && let Some(job) = state.store.job(lease.job_id).await?
    {
        let request = crate::wire::job_request(&job);
        let allowed = i64::from(request.max_restarts.unwrap_or(api::GANG_RESTARTS_DEFAULT));
        if request.replicas > 1 && job.gang_restarts < allowed {
            state
                .store
                .append_lease_event(lease.id, epoch, LeaseState::Failed.as_str(), event_detail, now)
                .await?;
            let why = format!(
                "replica {} failed ({reason}): the gang starts again, restart {} of {allowed}",
                lease.lease.replica,
                job.gang_restarts + 1
            );
            restart_gang(state, lease.job_id, &why, now).await?;
            return Ok(true);
        }
    }
    if state.store.move_lease(lease.id, epoch, to, reason, now).await? != LeaseMove::Moved {
        return Ok(false);
    }
    state
        .store
        .append_lease_event(lease.id, epoch, to.as_str(), event_detail, now)
        .await?;
    state
        .store
        .record_outcome(
            node_id,
            if to == LeaseState::Finished {
                LEASE_OK
            } else {
                LEASE_JOB_FAILED
            },
            now,
        )
        .await?;
    settle_job(state, lease.job_id).await?;
    state.wake.notify_one();
    Ok(true)
}

/// Starts every live replica of a gang again, in place, at a new epoch of its rendezvous (a
/// replica failed after the start: its peers' collectives fail with it); counts a restart.
pub async fn restart_gang(state: &AppState, job_id: i64, why: &str, now: i64) -> ApiResult<()> {
    state.store.next_gang_epoch(job_id, true, now).await?;
    for lease in state.store.leases_of_job(job_id).await? {
        if lease.state.is_live()
            && let Some(restarted) = state.store.restart_lease(lease.id).await?
        {
            state
                .store
                .append_lease_event(lease.id, restarted.epoch, "restarted", why, now)
                .await?;
        }
    }
    tracing::warn!(job = job_id, %why, "restarting a gang");
    state.wake.notify_one();
    Ok(())
}

/// How many replicas `job_id` asked for (0 when it is gone).
async fn gang_replicas(state: &AppState, job_id: i64) -> ApiResult<u32> {
    Ok(state
        .store
        .job(job_id)
        .await?
        .map_or(0, |job| crate::wire::job_request(&job).replicas))
}

/// A gang replica that failed before its gang started (its image missing, a dataset that would
/// not stage): the start barrier kept every replica from running its command, so the gang is
/// placed again whole, without that node; the reason is the job's.
#[allow(clippy::too_many_arguments)]
async fn gang_start_failed(
    state: &AppState,
    node_id: i64,
    lease: &store::LeaseRecord,
    epoch: i64,
    reason: &str,
    event_detail: &str,
    now: i64,
) -> ApiResult<bool> {
    let Some(ended) = state.store.end_lease(lease.id, LeaseState::Failed, reason, now).await? else {
        return Ok(false);
    };
    if let Some(view) = state.view.lock().await.as_mut() {
        view.release(ended.id);
    }
    state
        .store
        .append_lease_event(lease.id, epoch, LeaseState::Failed.as_str(), event_detail, now)
        .await?;
    state.store.record_outcome(node_id, LEASE_JOB_FAILED, now).await?;
    state.store.avoid_node(lease.job_id, node_id).await?;
    let node = state.store.node(node_id).await?.map_or_else(
        || format!("node {node_id}"),
        |node| format!("node {:?}", node.node.name),
    );
    let why = format!(
        "replica {} could not start on {node}: {reason}; placed again without that node",
        lease.lease.replica
    );
    restart_jobs(state, &[lease.job_id], &why, now).await?;
    state.wake.notify_one();
    Ok(true)
}

/// Gangs whose start barrier has waited past `timeout_us`: placed again whole, without the
/// nodes whose replicas were not staged in time.
pub async fn unassembled_gangs(state: &AppState, timeout_us: i64, now: i64) -> ApiResult<()> {
    for job_id in state.store.gangs_assembling_since(now - timeout_us).await? {
        let late: Vec<store::GangMember> = state
            .store
            .gang_members(job_id)
            .await?
            .into_iter()
            .filter(|member| member.port.is_none() && member.state != LeaseState::Running)
            .collect();
        let mut nodes = Vec::new();
        for member in &late {
            state.store.avoid_node(job_id, member.node_id).await?;
            nodes.push(member.node_id.to_string());
        }
        nodes.dedup();
        let why = format!(
            "its gang did not assemble within {} s (not staged on node {}); placed again without them",
            timeout_us / 1_000_000,
            nodes.join(", ")
        );
        tracing::warn!(job = job_id, %why, "a gang missed its start barrier");
        restart_jobs(state, &[job_id], &why, now).await?;
    }
    Ok(())
}

/// A job whose leases all ended: finished if every replica finished, else failed; its escrow is released.
pub async fn settle_job(state: &AppState, job_id: i64) -> ApiResult<()> {
    let Some(job) = state.store.job(job_id).await? else {
        return Ok(());
    };
    if job.state != JobState::Running {
        return Ok(());
    }
    let mut leases = state.store.leases_of_job(job_id).await?;
    // A replica that failed before an earlier placement of the job (a gang replica that could
    // not start, placed again without its node) does not fail this one.
    if let Some(since) = job.gang_since {
        leases.retain(|lease| lease.state != LeaseState::Failed || lease.ended_at.is_none_or(|at| at >= since));
    }
    if leases.iter().any(|lease| lease.state.is_live()) {
        if leases.iter().any(|lease| lease.state == LeaseState::Failed) {
            end_job(
                state,
                &job,
                &[JobState::Running],
                JobState::Failed,
                LeaseState::Cancelled,
                "a replica failed",
            )
            .await?;
        }
        return Ok(());
    }
    let failed = leases.iter().any(|lease| lease.state == LeaseState::Failed);
    let (to, reason) = if failed {
        (JobState::Failed, "a replica failed")
    } else {
        (JobState::Finished, "")
    };
    end_job(state, &job, &[JobState::Running], to, LeaseState::Cancelled, reason).await?;
    Ok(())
}

/// Ends a lease preempted for other work, its grace period over or its replica stopped within it
/// (whatever its exit code: its work was cut short), and queues its job again (a gang's other
/// replicas stop: it restarts whole). False when the lease had ended already.
pub async fn end_preempted(state: &AppState, lease_id: i64, reason: &str, now: i64) -> Result<bool, ApiError> {
    let Some(ended) = state
        .store
        .end_lease(lease_id, LeaseState::Preempted, reason, now)
        .await?
    else {
        return Ok(false);
    };
    if let Some(view) = state.view.lock().await.as_mut() {
        view.release(ended.id);
    }
    Metrics::add(&state.metrics.leases_preempted, 1);
    // A gang cannot go on without a replica: its others stop and it queues again whole.
    restart_jobs(state, &[ended.job_id], "preempted; queued again", now).await?;
    state.wake.notify_one();
    Ok(true)
}

/// Why a lease is preempted, in words: for another job, for its node's heat, or for the end of
/// its provider's window (or a reservation).
pub async fn why_preempted(state: &AppState, lease: &store::LeaseRecord) -> String {
    if let Some(by) = lease.preempted_by {
        return format!("preempted for job {by}");
    }
    let reclaimed = state
        .view
        .lock()
        .await
        .as_ref()
        .is_some_and(|view| view.reclaimed(lease.lease.node_id, lease.lease.gpu_mask));
    if reclaimed {
        return "preempted: its provider took the GPUs back (docs/trust-policy.md § 8)".into();
    }
    let hot = state.view.lock().await.as_ref().is_some_and(|view| {
        view.dense
            .get(&lease.lease.node_id)
            .is_some_and(|node| view.matcher.node_cordoned(*node))
    });
    if hot && lease.lease.tier == Tier::Bronze.name() {
        "preempted: its node stayed over its owner's thermal or power limit".into()
    } else {
        "preempted: its provider's window closes, or a reservation takes its GPUs".into()
    }
}

/// Ends every live lease of `node` as lost (`reason`), crediting gold tenants for the breach;
/// returns the jobs they belonged to, each once.
pub async fn lose_leases_of_node(state: &AppState, node: i64, reason: &str, now: i64) -> Result<Vec<i64>, ApiError> {
    let mut jobs = Vec::new();
    for lease in state.store.live_leases_of_node(node).await? {
        if state
            .store
            .end_lease(lease.id, LeaseState::Lost, reason, now)
            .await?
            .is_some()
        {
            Metrics::add(&state.metrics.leases_lost, 1);
            jobs.push(lease.job_id);
            if lease.lease.tier == Tier::Gold.name() {
                credit_sla_breach(state, &lease, now).await?;
            }
        }
    }
    jobs.sort_unstable();
    jobs.dedup();
    Ok(jobs)
}

/// Restarts jobs whole after a replica was lost: their surviving replicas stop and each job
/// queues again (`reason`).
pub async fn restart_jobs(state: &AppState, jobs: &[i64], reason: &str, now: i64) -> Result<(), ApiError> {
    for &job in jobs {
        for lease in state.store.leases_of_job(job).await? {
            if lease.state.is_live()
                && let Some(ended) = state
                    .store
                    .end_lease(
                        lease.id,
                        LeaseState::Cancelled,
                        &format!("a replica of the gang ended: {reason}"),
                        now,
                    )
                    .await?
                && let Some(view) = state.view.lock().await.as_mut()
            {
                view.release(ended.id);
            }
        }
        state.store.requeue_job(job, reason, now).await?;
    }
    Ok(())
}

/// Gold is reserved capacity: losing a gold lease to a node fault breaches the SLA, and the
/// tenant is credited an hour of the lost lease at its price (from the platform's SLA pot).
pub const SLA_CREDIT_HOURS: u64 = 1;

/// `hours` of `lease` at its price, all its GPUs: a credit's amount; `None` when that is nothing.
pub fn hours_of_lease(lease: &store::LeaseRecord, hours: u64) -> Option<Micros> {
    let gpu_milli = u64::from(lease.lease.gpu_mask.count_ones()) * lease.lease.gpu_milli.max(0) as u64;
    Micros(lease.lease.price_micros)
        .cost_for(gpu_milli, hours * 3600)
        .filter(|amount| *amount > Micros::ZERO)
}

async fn credit_sla_breach(state: &AppState, lease: &store::LeaseRecord, now: i64) -> Result<(), ApiError> {
    let Some(job) = state.store.job(lease.job_id).await? else {
        return Ok(());
    };
    let Some(amount) = hours_of_lease(lease, SLA_CREDIT_HOURS) else {
        return Ok(());
    };
    let credit = ledger::sla_credit(job.tenant_id, amount, format!("sla:lease-{}", lease.id), now)
        .map_err(crate::money::ledger_error)?;
    crate::money::apply(&state.store, &credit).await?;
    tracing::info!(
        lease = lease.id,
        tenant = job.tenant_id,
        micros = amount.0,
        "gold SLA breach credited"
    );
    Ok(())
}
