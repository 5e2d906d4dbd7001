//! The usage decision, pure: what a signed usage record may be billed for. `routes::records`
//! does the IO around it (the signature, the store's reads, the evidence, the ledger and the
//! usage row); here is what it decides on what it read: the record's period on the
//! coordinator's clock, the policy's checks (docs/trust-policy.md § 4), the part of the period
//! inside the lease, and the amount.

use api::UsageBody;
use model::Micros;
use store::LeaseRecord;
use trust::rules::{LeaseTerms, UsageViolation};

/// Why a usage record is refused before anything is billed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The record cannot describe usage at all (answered 400, kept nowhere).
    Malformed(String),
    /// The record breaks the policy's checks (answered 400 and kept as evidence).
    Violation(UsageViolation),
}

/// What a usage record's decision needs besides the record.
#[derive(Clone, Copy, Debug)]
pub struct Facts {
    /// The node's clock minus the coordinator's, measured from the signed request.
    pub offset_ms: i64,
    /// GPU-milli-seconds accepted for the lease from earlier records.
    pub accepted_gpu_seconds_milli: i64,
    /// The highest utilisation (per mille) the node's own heartbeats reported for the lease's
    /// GPUs over the record's period, when enough of them fall there.
    pub telemetry_utilisation_permille: Option<i64>,
    pub now: i64,
}

/// A record found fair: its period on the coordinator's clock and what of it may be billed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Billable {
    pub start_ms: i64,
    pub end_ms: i64,
    /// The record's GPU-milli-seconds inside the lease: a record running past an ended lease
    /// (its agent had not noticed yet) is billed up to the end only, in proportion.
    pub gpu_seconds_milli: i64,
}

/// The record as the node signed it.
pub fn signed_record(body: &UsageBody) -> trust::UsageRecord {
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

/// Refuses a record that cannot describe usage: negative counts, an empty or reversed period.
pub fn well_formed(body: &UsageBody) -> Result<(), Refusal> {
    if body.sequence < 0 || body.gpu_seconds_milli < 0 || body.period_end_ms <= body.period_start_ms {
        return Err(Refusal::Malformed(format!(
            "usage record: sequence and gpu_seconds_milli must not be negative, and the period must end after it starts \
             (the period {}..{} ms is outside any lease)",
            body.period_start_ms, body.period_end_ms
        )));
    }
    Ok(())
}

/// The record's period on the coordinator's clock: the node's clock offset taken out.
pub fn period(body: &UsageBody, offset_ms: i64) -> (i64, i64) {
    (
        body.period_start_ms.saturating_sub(offset_ms),
        body.period_end_ms.saturating_sub(offset_ms),
    )
}

/// Checks `body` against `lease` and the node's telemetry (docs/trust-policy.md § 4) and says
/// what of it may be billed.
pub fn assess(body: &UsageBody, lease: &LeaseRecord, facts: Facts) -> Result<Billable, Refusal> {
    well_formed(body)?;
    let (start_ms, end_ms) = period(body, facts.offset_ms);
    let lease_end_ms = lease.ended_at.map(|end| end / 1000);
    let terms = LeaseTerms {
        gpu_milli: i64::from(lease.lease.gpu_mask.count_ones() as u16) * lease.lease.gpu_milli,
        start_ms: lease.created_at / 1000,
        // An ended lease allows the time its agent may take to notice the end.
        end_ms: lease_end_ms.map_or(facts.now / 1000, |end| {
            end.saturating_add(trust::rules::USAGE_END_NOTICE_MS)
        }),
        accepted_gpu_seconds_milli: facts.accepted_gpu_seconds_milli,
    };
    let checked = trust::UsageRecord {
        period_start_ms: start_ms,
        period_end_ms: end_ms,
        ..signed_record(body)
    };
    trust::rules::check_usage(&checked, &terms, facts.telemetry_utilisation_permille).map_err(Refusal::Violation)?;
    let gpu_seconds_milli = match lease_end_ms {
        Some(end) if end_ms > end => {
            let inside = (end - start_ms).clamp(0, end_ms - start_ms);
            i64::try_from(i128::from(body.gpu_seconds_milli) * i128::from(inside) / i128::from(end_ms - start_ms))
                .unwrap_or(0)
        }
        _ => body.gpu_seconds_milli,
    };
    Ok(Billable {
        start_ms,
        end_ms,
        gpu_seconds_milli,
    })
}

/// The window of a gang's repair, in ms on the coordinator's clock, whose usage is not billed:
/// from the repair (the epoch's start) until every replica of the new epoch is staged (or `now`
/// while it assembles), for a job that asked (`repair_billing: pause`); None otherwise, and for
/// a gang's first placement (nothing runs before its barrier).
pub fn repair_pause(job: &store::JobRecord, request: &api::JobRequest, now: i64) -> Option<(i64, i64)> {
    if request.repair_billing.as_deref() != Some("pause") || job.gang_epoch < 2 {
        return None;
    }
    let since = job.gang_since?;
    Some((since / 1000, job.gang_assembled_at.unwrap_or(now) / 1000))
}

/// `billable` less its part inside `pause`, in proportion to the period's time there.
pub fn without_pause(billable: Billable, pause: Option<(i64, i64)>) -> Billable {
    let Some((from, until)) = pause else { return billable };
    let overlap = (billable.end_ms.min(until) - billable.start_ms.max(from)).max(0);
    let length = billable.end_ms - billable.start_ms;
    if overlap == 0 || length <= 0 {
        return billable;
    }
    let kept = i128::from(billable.gpu_seconds_milli) * i128::from(length - overlap) / i128::from(length);
    Billable {
        gpu_seconds_milli: i64::try_from(kept).unwrap_or(0),
        ..billable
    }
}

/// What the billable part costs at the lease's price: nothing on simulated devices, which sell
/// nothing real, unless the coordinator bills play money for them (`Config::bill_simulated`).
/// None when the charge overflows.
pub fn amount(billable: &Billable, price_micros: i64, simulated: bool, bill_simulated: bool) -> Option<Micros> {
    if simulated && !bill_simulated {
        return Some(Micros::ZERO);
    }
    Micros(price_micros).cost_for(billable.gpu_seconds_milli as u64, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::tests::lease;

    const SECOND_MS: i64 = 1000;

    /// A record of `seconds` on one whole GPU, from `start_ms`, by a node whose clock is right.
    fn record(start_ms: i64, seconds: i64, gpu_seconds: i64) -> UsageBody {
        UsageBody {
            lease_id: 1,
            epoch: 1,
            sequence: 0,
            period_start_ms: start_ms,
            period_end_ms: start_ms + seconds * SECOND_MS,
            gpu_seconds_milli: gpu_seconds * 1000,
            gpu_utilisation_permille: 900,
            telemetry_digest: String::new(),
        }
    }

    /// A lease of GPU 0 created at 1,000 s (on the coordinator's clock), running or ended.
    fn one_gpu_lease(ended_at_s: Option<i64>) -> LeaseRecord {
        let mut lease = lease(1, 10, 1, 0b1, None);
        lease.created_at = 1_000 * 1_000_000;
        lease.ended_at = ended_at_s.map(|at| at * 1_000_000);
        lease
    }

    fn facts(now_s: i64) -> Facts {
        Facts {
            offset_ms: 0,
            accepted_gpu_seconds_milli: 0,
            telemetry_utilisation_permille: None,
            now: now_s * 1_000_000,
        }
    }

    #[test]
    fn a_fair_record_is_billed_whole() {
        let billable = assess(&record(1_000_000, 60, 60), &one_gpu_lease(None), facts(1_100)).unwrap();
        assert_eq!(billable.gpu_seconds_milli, 60_000);
        assert_eq!(amount(&billable, 3_600_000, false, false), Some(Micros(60_000)));
    }

    #[test]
    fn a_record_running_past_its_leases_end_is_billed_to_the_end_only() {
        // 60 s from 1,000 s; the lease ended at 1,030 s: half of it is inside.
        let billable = assess(&record(1_000_000, 60, 60), &one_gpu_lease(Some(1_030)), facts(1_100)).unwrap();
        assert_eq!(billable.gpu_seconds_milli, 30_000);
    }

    #[test]
    fn the_nodes_clock_offset_is_taken_out_of_the_period() {
        let mut facts = facts(1_100);
        facts.offset_ms = 5_000;
        let billable = assess(&record(1_005_000, 60, 60), &one_gpu_lease(None), facts).unwrap();
        assert_eq!((billable.start_ms, billable.end_ms), (1_000_000, 1_060_000));
    }

    #[test]
    fn more_than_the_gpus_could_deliver_is_a_violation() {
        let refused = assess(&record(1_000_000, 60, 61), &one_gpu_lease(None), facts(1_100));
        assert!(
            matches!(refused, Err(Refusal::Violation(UsageViolation::OverCapacity { .. }))),
            "{refused:?}"
        );
    }

    #[test]
    fn a_malformed_record_is_refused_before_any_check() {
        let mut body = record(1_000_000, 60, 60);
        body.gpu_seconds_milli = -1;
        assert!(matches!(
            assess(&body, &one_gpu_lease(None), facts(1_100)),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn a_repair_pause_bills_only_the_time_outside_it() {
        let billable = assess(&record(1_000_000, 60, 60), &one_gpu_lease(None), facts(1_100)).unwrap();
        // Paused from 1,020 s to 1,050 s: 30 of the record's 60 s.
        let paused = without_pause(billable, Some((1_020_000, 1_050_000)));
        assert_eq!(paused.gpu_seconds_milli, 30_000);
        assert_eq!(without_pause(billable, Some((2_000_000, 2_050_000))), billable);
        assert_eq!(without_pause(billable, None), billable);
        assert_eq!(without_pause(billable, Some((900_000, 1_200_000))).gpu_seconds_milli, 0);
    }

    #[test]
    fn only_a_job_that_asked_pauses_and_only_after_a_repair() {
        let mut job = store::JobRecord {
            id: 1,
            tenant_id: 1,
            client_token: None,
            spec: String::new(),
            tier: "gold".into(),
            state: store::JobState::Running,
            state_reason: String::new(),
            submitted_at: 0,
            updated_at: 0,
            gang_epoch: 2,
            gang_since: Some(1_020 * 1_000_000),
            avoid_nodes: Vec::new(),
            gang_restarts: 0,
            gang_assembled_at: None,
        };
        let mut request = api::JobRequest::default();
        assert_eq!(
            repair_pause(&job, &request, 1_100 * 1_000_000),
            None,
            "bill is the default"
        );
        request.repair_billing = Some("pause".into());
        assert_eq!(
            repair_pause(&job, &request, 1_100 * 1_000_000),
            Some((1_020_000, 1_100_000)),
            "still assembling: paused until now"
        );
        job.gang_assembled_at = Some(1_050 * 1_000_000);
        assert_eq!(
            repair_pause(&job, &request, 1_100 * 1_000_000),
            Some((1_020_000, 1_050_000))
        );
        job.gang_epoch = 1;
        assert_eq!(
            repair_pause(&job, &request, 1_100 * 1_000_000),
            None,
            "a first placement"
        );
    }

    #[test]
    fn simulated_devices_bill_nothing_unless_play_money_is_on() {
        let billable = Billable {
            start_ms: 0,
            end_ms: 60_000,
            gpu_seconds_milli: 60_000,
        };
        assert_eq!(amount(&billable, 3_600_000, true, false), Some(Micros::ZERO));
        assert_eq!(amount(&billable, 3_600_000, true, true), Some(Micros(60_000)));
        let endless = Billable {
            gpu_seconds_milli: i64::MAX,
            ..billable
        };
        assert_eq!(
            amount(&endless, i64::MAX, false, false),
            None,
            "an overflow is no charge"
        );
    }
}
