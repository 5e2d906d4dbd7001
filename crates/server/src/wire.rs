//! Store records to wire views.

use api::{JobRequest, JobView, LeaseView, NodeView, PolicyDoc};
use store::{JobRecord, LeaseRecord, NodeRecord};

pub fn gpu_indices(mask: i64) -> Vec<u8> {
    (0..16u8).filter(|bit| mask & (1 << bit) != 0).collect()
}

pub fn lease_view(lease: &LeaseRecord) -> LeaseView {
    LeaseView {
        id: lease.id,
        job_id: lease.job_id,
        replica: lease.lease.replica,
        node_id: lease.lease.node_id,
        gpu_indices: gpu_indices(lease.lease.gpu_mask),
        gpu_milli: lease.lease.gpu_milli,
        cpu_milli: lease.lease.cpu_milli,
        memory_mib: lease.lease.memory_mib,
        epoch: lease.epoch,
        state: lease.state.as_str().to_string(),
        price_micros_per_gpu_hour: lease.lease.price_micros,
        gpu_model: lease.lease.gpu_model.clone(),
        region: lease.lease.region.clone(),
        created_at_us: lease.created_at,
        expected_end_us: lease.lease.expected_end,
        preempt_at_us: lease.lease.preempt_at,
        ended_at_us: lease.ended_at,
        end_reason: lease.end_reason.clone(),
        exit_code: exit_code_in(&lease.end_reason),
        output: None,
    }
}

/// How a replica's end reason records its exit code (an attestation's, or an agent's report).
pub fn exit_reason(code: i64) -> String {
    format!("exit code {code}")
}

/// The exit code an end reason records (`exit_reason`, maybe followed by "; detail").
pub fn exit_code_in(reason: &str) -> Option<i64> {
    let rest = reason.strip_prefix("exit code ")?;
    rest.split(';').next()?.trim().parse().ok()
}

/// A job's exit code (`JobView::exit_code`): 0 when it finished; when it failed, the code of
/// the replica that failed first, by end time then replica.
fn job_exit_code(job: &JobRecord, leases: &[LeaseRecord]) -> Option<i64> {
    match job.state {
        store::JobState::Finished => Some(0),
        store::JobState::Failed => leases
            .iter()
            .filter(|lease| lease.state == model::LeaseState::Failed)
            .filter_map(|lease| {
                Some((
                    lease.ended_at.unwrap_or(i64::MAX),
                    lease.lease.replica,
                    exit_code_in(&lease.end_reason)?,
                ))
            })
            .min()
            .map(|(_, _, code)| code),
        _ => None,
    }
}

pub fn job_request(job: &JobRecord) -> JobRequest {
    serde_json::from_str(&job.spec).unwrap_or_default()
}

/// A service's request as stored (`services.spec`, the API's own serialisation).
pub fn service_request(spec: &str) -> Result<api::ServiceRequest, crate::error::ApiError> {
    serde_json::from_str(spec)
        .map_err(|error| crate::error::ApiError::Internal(format!("a stored service spec: {error}")))
}

/// The service version a replica's job runs (its spec's `serve.version`; 0 for none).
pub fn replica_version(spec: &str) -> u32 {
    serde_json::from_str::<JobRequest>(spec)
        .ok()
        .and_then(|job| job.serve)
        .map_or(0, |serve| serve.version)
}

/// What a running job waits for in a preemption, in words, or None: a preemptor whose leases
/// have not started waits out its `victims`' grace (`waiting for GPUs (preempting job 4, grace
/// until …)`); a job whose lease is being preempted says when it stops (`preempting: stops at
/// …`). `grace_s` is the coordinator's preemption grace.
pub fn preemption_wait(
    job: &JobRecord,
    leases: &[LeaseRecord],
    victims: &[LeaseRecord],
    grace_s: u32,
    now: i64,
) -> Option<String> {
    if job.state != store::JobState::Running {
        return None;
    }
    let live: Vec<&LeaseRecord> = leases.iter().filter(|lease| lease.state.is_live()).collect();
    let stopping = live
        .iter()
        .filter(|lease| lease.preempted_by.is_some() || lease.in_preemption_grace(grace_s, now))
        .filter_map(|lease| Some((lease.lease.preempt_at?, lease.preempted_by)))
        .min();
    if let Some((at, by)) = stopping {
        let by = by.map(|job| format!(" (for job {job})")).unwrap_or_default();
        return Some(format!("preempting: stops at {}{by}", model::time::utc(at)));
    }
    let started = live.iter().any(|lease| lease.state != store::LeaseState::Pending);
    let mut preempting: Vec<i64> = victims.iter().map(|victim| victim.job_id).collect();
    preempting.sort_unstable();
    preempting.dedup();
    let grace_until = victims.iter().filter_map(|victim| victim.lease.preempt_at).max();
    match grace_until {
        Some(until) if !started && !live.is_empty() => {
            let jobs: Vec<String> = preempting.iter().map(i64::to_string).collect();
            let noun = if jobs.len() == 1 { "job" } else { "jobs" };
            Some(format!(
                "waiting for GPUs (preempting {noun} {}, grace until {})",
                jobs.join(", "),
                model::time::utc(until)
            ))
        }
        _ => None,
    }
}

pub fn job_view(job: &JobRecord, leases: &[LeaseRecord], cost_micros: i64, escrow_micros: i64) -> JobView {
    JobView {
        id: job.id,
        tenant_id: job.tenant_id,
        state: job.state.as_str().to_string(),
        state_reason: job.state_reason.clone(),
        tier: job.tier.clone(),
        submitted_at_us: job.submitted_at,
        updated_at_us: job.updated_at,
        spec: job_request(job),
        leases: leases.iter().map(lease_view).collect(),
        cost_micros,
        escrow_micros,
        explanation: None,
        progress: None,
        exit_code: job_exit_code(job, leases),
        capacity: None,
    }
}

pub fn node_view(record: &NodeRecord, reliability: f64, live_leases: i64, earnings_micros: i64) -> NodeView {
    let node = &record.node;
    NodeView {
        id: record.id,
        provider_id: node.provider_id,
        name: node.name.clone(),
        public_key: node.public_key.clone(),
        fingerprint: node.fingerprint.clone(),
        fingerprint_changed_at_us: record.fingerprint_changed_at,
        gpu_model: node.gpu_model.clone(),
        gpu_count: node.gpu_count,
        cpu_milli: node.cpu_milli,
        memory_mib: node.memory_mib,
        region: node.region.clone(),
        site: node.site.clone(),
        fabric: node.fabric.clone(),
        nvlink_domain: node.nvlink_domain.clone(),
        nvlink_source: node.nvlink_source.clone(),
        location_source: node.location_source.clone(),
        nvlink_detected: node.nvlink_detected.clone(),
        advertise_addr: node.advertise_addr.clone(),
        gang_ports: node.gang_ports.clone(),
        latitude: node.latitude,
        longitude: node.longitude,
        simulated: node.simulated,
        runtimes: node
            .runtimes
            .split(',')
            .filter(|name| !name.is_empty())
            .map(str::to_string)
            .collect(),
        online: record.online,
        last_heartbeat_at_us: record.last_heartbeat_at,
        reliability,
        policy: serde_json::from_str::<PolicyDoc>(&node.policy).unwrap_or_default(),
        telemetry: record
            .telemetry
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok()),
        over_limit_since_us: record.over_limit_since,
        reclaimed_gpus: gpu_indices(record.reclaim_gpu_mask),
        reclaimed_until_us: record.reclaim_until,
        live_leases,
        earnings_micros,
        reputation: None,
    }
}

/// A reputation as the API shows it: the score, its lower bound and the decayed inputs by kind
/// (docs/trust-policy.md § 1), so a provider can see why its score is what it is.
pub fn reputation_view(reputation: &trust::rules::Reputation) -> api::ReputationView {
    use trust::rules::Outcome;
    let round = |value: f64| (value * 10_000.0).round() / 10_000.0;
    api::ReputationView {
        score: round(reputation.score()),
        lower_bound: round(reputation.lower_bound()),
        evidence: round(reputation.evidence()),
        inputs: Outcome::ALL
            .iter()
            .zip(reputation.inputs)
            .map(|(outcome, weight)| (outcome.name().to_string(), round(weight)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::{exit_code_in, exit_reason};

    #[test]
    fn an_end_reason_gives_back_the_exit_code_it_records() {
        assert_eq!(exit_code_in(&exit_reason(3)), Some(3));
        assert_eq!(exit_code_in(&format!("{}; out of memory", exit_reason(-9))), Some(-9));
        assert_eq!(exit_code_in("preempted for job 7"), None);
        assert_eq!(exit_code_in("exit code x"), None);
    }
}
