//! The services' controller: the leader keeps each deployed service at its replica count.
//!
//! Every second, for each service: replicas that never became healthy within the service's
//! health timeout are ended (and counted against their version: three in a row stop it); the
//! autoscaler moves the desired count between the service's bounds on requests in flight per
//! ready replica and p95 latency (up when a target is passed for `scale_up_after_s`, down one
//! when the load stayed under half of it, or no request came, for `scale_down_after_s`; the last
//! replica only when idle, to zero at `min_replicas` 0); missing replicas are submitted as jobs (base tier up to `min_replicas`,
//! the burst tier above), extra ones ended; a new version rolls out one replica at a time, an
//! old replica ending only once a new one is ready, and a version that fails stops its roll-out
//! with the old replicas serving on. Each replica's escrow is renewed while it runs: when less
//! than half of its period (`max_runtime_s`) is left, another period is held and its lease's
//! end moved on.
//!
//! What it remembers between passes (replicas seen, failures by version, the load's samples)
//! is rebuilt from scratch by a new leader: it may try a failing version three more times.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use api::ServiceRequest;
use ledger::Account;
use store::{JobState, LeaseState, NewJob, ServiceRecord, ServiceReplica};

use crate::error::ApiError;
use crate::lifecycle::end_job;
use crate::money;
use crate::state::AppState;
use crate::wire::{replica_version, service_request};

/// How often the controller looks at the services.
pub const TEND_EVERY_US: i64 = 1_000_000;
/// Replicas of one version in a row that end without ever becoming healthy before the version
/// is stopped (its roll-out halted, or no more started until the service is updated).
pub const FAILURES_MAX: u32 = 3;

/// A burst replica that waited this many scale-up windows for capacity on its tier goes on the
/// base tier.
pub const BURST_FALLBACK_WINDOWS: i64 = 3;

/// What the controller remembers of the services between passes.
#[derive(Default)]
pub struct Memory {
    checked_at: i64,
    by_service: HashMap<i64, ServiceMemory>,
}

#[derive(Default)]
struct ServiceMemory {
    /// Live replicas last seen: job id → (version, became ready).
    seen: HashMap<i64, (u32, bool)>,
    /// Replicas this controller ended on purpose (scaled down, retired by a roll-out).
    retired: HashSet<i64>,
    /// Replicas of a version in a row that ended without becoming ready, and the last reason.
    failures: HashMap<u32, (u32, String)>,
    /// Requests in flight per ready replica, sampled each pass.
    load: VecDeque<(i64, f64)>,
    scaled_at: i64,
}

/// A live replica as the controller sees it.
struct Replica {
    row: ServiceReplica,
    version: u32,
    ready: bool,
    in_flight: u32,
}

/// One pass over every service, at most once a `TEND_EVERY_US`.
pub async fn tend(state: &AppState, memory: &mut Memory, now: i64) -> Result<(), ApiError> {
    if now - memory.checked_at < TEND_EVERY_US {
        return Ok(());
    }
    memory.checked_at = now;
    state.gateway.prune();
    let services = state.store.all_services().await?;
    memory
        .by_service
        .retain(|id, _| services.iter().any(|service| service.id == *id));
    for service in &services {
        let remembered = memory.by_service.entry(service.id).or_default();
        if let Err(error) = tend_one(state, remembered, service, now).await {
            tracing::warn!(service = %service.name, %error, "could not tend a service");
        }
    }
    Ok(())
}

async fn tend_one(
    state: &AppState,
    memory: &mut ServiceMemory,
    service: &ServiceRecord,
    now: i64,
) -> Result<(), ApiError> {
    let current = service_request(&service.spec)?;
    let stable = service_request(&service.stable_spec)?;
    let (tenant, name) = (service.tenant_id, service.name.as_str());
    let mut live: Vec<Replica> = Vec::new();
    for row in state.store.service_replicas(tenant, name).await? {
        let ready = row.ready_at.is_some() && row.lease_state.as_deref() == Some("running") && row.preempt_at.is_none();
        let in_flight = row.lease_id.map_or(0, |lease| state.gateway.in_flight(lease));
        live.push(Replica {
            version: replica_version(&row.spec),
            ready,
            in_flight,
            row,
        });
    }
    let seen_jobs: HashSet<i64> = live.iter().map(|replica| replica.row.job_id).collect();
    // Replicas gone since the last pass without ever becoming ready count against their version.
    let vanished: Vec<(i64, u32, bool)> = memory
        .seen
        .iter()
        .filter(|(job, _)| !seen_jobs.contains(job))
        .map(|(job, (version, ready))| (*job, *version, *ready))
        .collect();
    for (job_id, version, was_ready) in vanished {
        memory.seen.remove(&job_id);
        if memory.retired.remove(&job_id) || was_ready {
            continue;
        }
        let reason = match state.store.job(job_id).await? {
            Some(job) if !job.state_reason.is_empty() => format!("job {job_id}: {}", job.state_reason),
            Some(job) => format!("job {job_id} {}", job.state),
            None => format!("job {job_id} ended"),
        };
        let failures = memory.failures.entry(version).or_default();
        failures.0 += 1;
        failures.1 = reason;
    }
    for replica in &live {
        let seen = memory
            .seen
            .entry(replica.row.job_id)
            .or_insert((replica.version, false));
        if replica.ready && !seen.1 {
            seen.1 = true;
            memory.failures.remove(&replica.version);
        }
    }
    // Replicas placed longer than the health timeout ago that never answered their check.
    let health_timeout = i64::from(current.health_timeout_s) * 1_000_000;
    let mut ended = HashSet::new();
    for replica in &live {
        let placed_at = replica.row.lease_created_at.unwrap_or(now);
        if replica.row.ready_at.is_none() && replica.row.lease_id.is_some() && now - placed_at > health_timeout {
            let reason = format!(
                "its health check did not answer within {} s of its placement",
                current.health_timeout_s
            );
            if end_replica(
                state,
                memory,
                replica.row.job_id,
                JobState::Failed,
                LeaseState::Failed,
                &reason,
            )
            .await?
            {
                let failures = memory.failures.entry(replica.version).or_default();
                failures.0 += 1;
                failures.1 = format!("job {}: {reason}", replica.row.job_id);
            }
            ended.insert(replica.row.job_id);
        }
    }
    live.retain(|replica| !ended.contains(&replica.row.job_id));

    let version = u32::try_from(service.version).unwrap_or(u32::MAX);
    let stable_version = u32::try_from(service.stable_version).unwrap_or(u32::MAX);
    let halted = version != stable_version && failing(&memory.failures, version).is_some();
    let (target_version, target) = if halted {
        (stable_version, &stable)
    } else {
        (version, &current)
    };
    let target_failing = failing(&memory.failures, target_version);
    let mut status = match (halted, &target_failing) {
        (true, _) => format!(
            "roll-out of version {version} stopped: {}; serving version {stable_version}",
            failing(&memory.failures, version).unwrap_or_default()
        ),
        (false, Some(why)) => format!("stopped starting replicas: {why}; update the service"),
        (false, None) => String::new(),
    };

    // The autoscaler.
    let desired = autoscale(state, memory, service, &current, &live, now);

    let (mut keep, mut others): (Vec<Replica>, Vec<Replica>) =
        live.into_iter().partition(|replica| replica.version == target_version);
    if halted {
        // The stopped version's replicas go; the stable ones serve on.
        for replica in others.iter().filter(|replica| replica.version == version) {
            let reason = format!("version {version} stopped: its roll-out failed");
            retire(state, memory, replica.row.job_id, &reason).await?;
        }
        others.retain(|replica| replica.version != version);
    }
    let rolling = !others.is_empty();
    let ready_keep = keep.iter().filter(|replica| replica.ready).count();
    let starting = keep.len() - ready_keep;
    let missing = usize::try_from(desired).unwrap_or(0).saturating_sub(keep.len());
    if missing > 0 && target_failing.is_none() {
        let count = if !rolling {
            missing
        } else if starting == 0 {
            1
        } else {
            0
        };
        let base = usize::try_from(current.min_replicas).unwrap_or(0);
        let mut on_base = keep
            .iter()
            .filter(|replica| replica.row.tier == target.replica.tier)
            .count();
        for _ in 0..count {
            let tier = match &current.burst_tier {
                Some(burst) if on_base >= base => burst.clone(),
                _ => target.replica.tier.clone(),
            };
            on_base += usize::from(tier == target.replica.tier);
            let job_id = submit_replica(state, service, target, target_version, &tier, now).await?;
            // Seen from its submission: one that fails before the next pass still counts.
            memory.seen.insert(job_id, (target_version, false));
        }
    }
    // A burst replica that found no capacity on its tier goes on the base tier, whose price the
    // service's cap allows (SkyServe's spot fallback to on-demand).
    let fallback_after = i64::from(current.scale_up_after_s) * 1_000_000 * BURST_FALLBACK_WINDOWS;
    if let Some(burst) = current
        .burst_tier
        .as_deref()
        .filter(|burst| *burst != target.replica.tier)
    {
        let stuck: Vec<i64> = keep
            .iter()
            .filter(|replica| {
                replica.row.lease_id.is_none()
                    && replica.row.tier == burst
                    && now - replica.row.submitted_at > fallback_after
            })
            .map(|replica| replica.row.job_id)
            .collect();
        for job_id in stuck {
            let reason = format!(
                "no {burst} capacity within {} s: replaced on {}",
                fallback_after / 1_000_000,
                target.replica.tier
            );
            if retire(state, memory, job_id, &reason).await? {
                keep.retain(|replica| replica.row.job_id != job_id);
                let tier = target.replica.tier.clone();
                let replacement = submit_replica(state, service, target, target_version, &tier, now).await?;
                memory.seen.insert(replacement, (target_version, false));
            }
        }
    }
    // A roll-out retires an old replica for each new one ready.
    others.sort_by_key(|replica| (replica.ready, replica.in_flight, std::cmp::Reverse(replica.row.job_id)));
    let desired_count = usize::try_from(desired).unwrap_or(0);
    while !others.is_empty() && ready_keep + others.len() > desired_count {
        let old = others.remove(0);
        let reason = format!("replaced by version {target_version}");
        retire(state, memory, old.row.job_id, &reason).await?;
    }
    // Scaling down: queued replicas first, then starting ones, then burst ones, the least busy.
    if others.is_empty() && keep.len() > desired_count {
        let base_tier = target.replica.tier.clone();
        keep.sort_by_key(|replica| {
            (
                replica.row.lease_id.is_some(),
                replica.ready,
                replica.row.tier == base_tier,
                replica.in_flight,
                std::cmp::Reverse(replica.row.job_id),
            )
        });
        let extra = keep.len() - desired_count;
        for replica in keep.drain(..extra) {
            retire(state, memory, replica.row.job_id, "scaled down").await?;
        }
    }
    if others.is_empty() && !halted && version != stable_version && keep.iter().all(|replica| replica.ready) {
        state.store.set_service_stable(service.id, service.version, now).await?;
    }
    // Escrow renewal.
    for replica in keep.iter().chain(&others) {
        if let Some(problem) = renew(state, tenant, &replica.row, now).await? {
            status = problem;
        }
    }
    if desired != service.desired || status != service.status {
        state
            .store
            .set_service_desired(service.id, desired, &status, now)
            .await?;
    }
    Ok(())
}

/// Why `version` is stopped, when `FAILURES_MAX` of its replicas in a row never became healthy.
fn failing(failures: &HashMap<u32, (u32, String)>, version: u32) -> Option<String> {
    failures
        .get(&version)
        .filter(|(count, _)| *count >= FAILURES_MAX)
        .map(|(count, reason)| format!("{count} replicas of version {version} never became healthy (last: {reason})"))
}

/// The replica count wanted now, between the service's bounds, from the load's samples.
fn autoscale(
    state: &AppState,
    memory: &mut ServiceMemory,
    service: &ServiceRecord,
    request: &ServiceRequest,
    live: &[Replica],
    now: i64,
) -> i64 {
    let (tenant, name) = (service.tenant_id, service.name.as_str());
    let (min, max) = (i64::from(request.min_replicas), i64::from(request.max()));
    let ready: Vec<&Replica> = live.iter().filter(|replica| replica.ready).collect();
    let in_flight: u32 = ready.iter().map(|replica| replica.in_flight).sum();
    let per_ready = f64::from(in_flight) / ready.len().max(1) as f64;
    let up_span = i64::from(request.scale_up_after_s) * 1_000_000;
    let down_span = i64::from(request.scale_down_after_s) * 1_000_000;
    memory.load.push_back((now, per_ready));
    while memory
        .load
        .front()
        .is_some_and(|(at, _)| *at < now - up_span.max(down_span) - 2 * TEND_EVERY_US)
    {
        memory.load.pop_front();
    }
    state.gateway.sample(tenant, name, now);
    let mut desired = service.desired.clamp(min, max);
    let covers = |span: i64| memory.load.front().is_some_and(|(at, _)| *at <= now - span);
    let loads = |span: i64| {
        memory
            .load
            .iter()
            .filter(move |(at, _)| *at >= now - span)
            .map(|(_, load)| *load)
    };
    let since_change = now - memory.scaled_at;
    let over_in_flight = request
        .target_in_flight
        .is_some_and(|target| covers(up_span) && loads(up_span).all(|load| load > f64::from(target)));
    let p95_of = |span: i64| {
        state
            .gateway
            .window(tenant, name, now, span)
            .and_then(|(_, window)| window.quantile_ms(0.95))
    };
    let over_p95 = request
        .target_p95_ms
        .is_some_and(|target| covers(up_span) && p95_of(up_span).is_some_and(|p95| p95 > f64::from(target)));
    if (over_in_flight || over_p95) && desired < max && since_change >= up_span {
        // Enough replicas for the load at the target, one more at least.
        let mean = loads(up_span).sum::<f64>() / loads(up_span).count().max(1) as f64;
        let by_load = request.target_in_flight.map_or(0, |target| {
            (mean * ready.len() as f64 / f64::from(target)).ceil() as i64
        });
        desired = by_load.max(desired + 1).min(max);
        memory.scaled_at = now;
        tracing::info!(service = name, desired, in_flight = per_ready, "scaled up");
    } else if desired > min && since_change >= down_span && covers(down_span) {
        let quiet_in_flight = request
            .target_in_flight
            .is_none_or(|target| loads(down_span).all(|load| load < f64::from(target) / 2.0));
        let quiet_p95 = request
            .target_p95_ms
            .is_none_or(|target| p95_of(down_span).is_none_or(|p95| p95 < f64::from(target) / 2.0));
        let autoscaled = request.target_in_flight.is_some() || request.target_p95_ms.is_some();
        let idle = in_flight == 0
            && state
                .gateway
                .window(tenant, name, now, down_span)
                .is_none_or(|(_, window)| window.requests == 0)
            && !state
                .gateway
                .woken_within(tenant, name, Duration::from_micros(down_span as u64));
        // The last replica goes only when idle; others when idle or under the targets.
        let step_down = idle || (desired > 1 && autoscaled && quiet_in_flight && quiet_p95);
        if step_down {
            desired -= 1;
            memory.scaled_at = now;
            tracing::info!(service = name, desired, "scaled down");
        }
    }
    if desired == 0
        && state
            .gateway
            .woken_within(tenant, name, Duration::from_micros(down_span as u64))
    {
        desired = 1;
        memory.scaled_at = now;
    }
    desired
}

/// Submits one replica of `request` at `version` on `tier`; its job's id.
async fn submit_replica(
    state: &AppState,
    service: &ServiceRecord,
    request: &ServiceRequest,
    version: u32,
    tier: &str,
    now: i64,
) -> Result<i64, ApiError> {
    let job = request.replica_job(version, Some(tier));
    let spec = serde_json::to_string(&job).map_err(|error| ApiError::Internal(error.to_string()))?;
    let record = state
        .submissions
        .submit(NewJob {
            tenant_id: service.tenant_id,
            client_token: None,
            spec,
            tier: tier.to_string(),
            submitted_at: now,
            reservation_id: None,
        })
        .await?;
    tracing::info!(service = %service.name, job = record.id, version, tier, "replica submitted");
    state.wake.notify_one();
    Ok(record.id)
}

/// Ends a replica that is no longer wanted (cancelled, not failed); true when it was live.
async fn retire(state: &AppState, memory: &mut ServiceMemory, job_id: i64, reason: &str) -> Result<bool, ApiError> {
    end_replica(
        state,
        memory,
        job_id,
        JobState::Cancelled,
        LeaseState::Cancelled,
        reason,
    )
    .await
}

/// Ends a replica's job on purpose; true when it was live.
async fn end_replica(
    state: &AppState,
    memory: &mut ServiceMemory,
    job_id: i64,
    to: JobState,
    leases_to: LeaseState,
    reason: &str,
) -> Result<bool, ApiError> {
    let Some(job) = state.store.job(job_id).await? else {
        return Ok(false);
    };
    memory.retired.insert(job_id);
    let ended = end_job(
        state,
        &job,
        &[JobState::Queued, JobState::Running],
        to,
        leases_to,
        reason,
    )
    .await?;
    // The leader's next pass frees the ended leases in its view, as for any ended job.
    if ended.is_some()
        && let Some(serve) = crate::wire::job_request(&job).serve
    {
        state.gateway.invalidate(job.tenant_id, &serve.name);
    }
    Ok(ended.is_some())
}

/// Renews a running replica's escrow when less than half its period is left: another period
/// (`max_runtime_s`) at its price cap is held and its lease's end moved on. Some(why) when the
/// tenant's balance cannot cover it (the replica then stops at its lease's end).
async fn renew(state: &AppState, tenant: i64, replica: &ServiceReplica, now: i64) -> Result<Option<String>, ApiError> {
    let (Some(lease_id), Some(expected_end)) = (replica.lease_id, replica.expected_end) else {
        return Ok(None);
    };
    let Ok(request) = serde_json::from_str::<api::JobRequest>(&replica.spec) else {
        return Ok(None);
    };
    let period_us = i64::from(request.max_runtime_s) * 1_000_000;
    if expected_end - now > period_us / 2 {
        return Ok(None);
    }
    let Some(lease) = state.store.lease(lease_id).await? else {
        return Ok(None);
    };
    let spec = request
        .to_spec(0, tenant, 0, |_| None)
        .map_err(|error| ApiError::Internal(error.0))?;
    let wanted = ledger::hold_amount(
        spec.max_price,
        (u64::from(lease.lease.gpu_mask.count_ones()) * u64::try_from(lease.lease.gpu_milli).unwrap_or(0)).max(1),
        u64::from(request.max_runtime_s),
    )
    .map_err(money::ledger_error)?;
    let new_end = expected_end + period_us;
    let available = money::balance(&state.store, Account::TenantAvailable(tenant)).await?;
    if available < wanted {
        return Ok(Some(format!(
            "escrow not renewed: the balance ({} µ$) does not cover the next {} s of job {} ({} µ$); it stops when its escrow ends",
            available.0, request.max_runtime_s, replica.job_id, wanted.0
        )));
    }
    let key = format!("hold:job-{}:to-{new_end}", replica.job_id);
    let hold = ledger::hold(tenant, replica.job_id, wanted, available, key, now).map_err(money::ledger_error)?;
    money::apply(&state.store, &hold).await?;
    state.store.extend_lease(lease_id, new_end).await?;
    tracing::info!(
        lease = lease_id,
        job = replica.job_id,
        new_end,
        "a service replica's escrow renewed"
    );
    Ok(None)
}
