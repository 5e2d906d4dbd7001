//! Evidence against nodes and what proven fraud costs (docs/trust-policy.md §§ 4–6): violating
//! usage records, leases dropped from a node's signed heartbeats, absences in advertised
//! windows and their test, committed window hours for reputation, and `prove`, which slashes
//! the provider's bond by the rule's share, pays the harmed tenants back from it, keeps the
//! evidence with the decision and cordons the node, whose work moves elsewhere.

use api::RefundView;
use ledger::Account;
use model::Micros;
use serde_json::{Value, json};
use store::{EvidenceRow, FraudRow, LeaseState, NodeRecord};
use trust::rules::{self, Evidence, Fraud, Outcome};

use crate::books::fraud::Dropped;
use crate::error::ApiResult;
use crate::money;
use crate::state::AppState;

/// Evidence rows a proof reads back at most.
const EVIDENCE_READ_MAX: usize = 1000;
/// Slashes the bond of `node`'s provider for `fraud` (§ 6), refunds the tenants charged for
/// the node's work since `since_us` out of the slashed money, records the decision with its
/// evidence, and cordons the node; its live leases end and their jobs queue again. `proof_key`
/// names the evidence, so the same proof is decided once whichever replica sees it. Returns the
/// decision's id, `None` when it was decided before.
pub async fn prove(
    state: &AppState,
    node: &NodeRecord,
    fraud: Fraud,
    evidence: Value,
    since_us: i64,
    proof_key: String,
    now: i64,
) -> ApiResult<Option<i64>> {
    // A node cordoned already decides nothing more while it is: the evidence is kept, and counts
    // once a canary lifts the cordon (docs/trust-policy.md § 6).
    if let Some(current) = state.store.node(node.id).await?
        && current.fraud_cordoned_at.is_some()
    {
        tracing::info!(
            node = node.id,
            fraud = fraud.name(),
            "more evidence against a cordoned node; kept"
        );
        return Ok(None);
    }
    let provider = node.node.provider_id;
    let bond = money::balance(&state.store, Account::ProviderBond(provider)).await?;
    let owed: Vec<(i64, Micros)> = state
        .store
        .charges_on_node_since(node.id, since_us)
        .await?
        .into_iter()
        .filter(|charge| charge.charged_micros > 0)
        .map(|charge| (charge.tenant_id, Micros(charge.charged_micros)))
        .collect();
    let key = format!("slash:node-{}:{}:{proof_key}", node.id, fraud.name());
    let plan =
        ledger::slash(provider, bond, fraud.slash_permille(), &owed, key.clone(), now).map_err(money::ledger_error)?;
    let refunds: Vec<RefundView> = owed
        .iter()
        .zip(&plan.refunds_paid)
        .map(|((tenant, owed), (_, paid))| RefundView {
            tenant_id: *tenant,
            owed_micros: owed.0,
            paid_micros: paid.0,
        })
        .collect();
    let row = FraudRow {
        id: 0,
        node_id: node.id,
        provider_id: provider,
        kind: fraud.name().to_string(),
        section: fraud.section().to_string(),
        share_permille: i64::from(fraud.slash_permille()),
        bond_before: bond.0,
        slashed: plan.slashed.0,
        refunds: serde_json::to_string(&refunds).expect("refunds serialise"),
        to_platform: plan.to_platform.0,
        evidence: evidence.to_string(),
        decided_at: now,
        ledger_key: key,
    };
    let slash = plan.tx.as_ref().map(money::row);
    let Some(id) = state
        .store
        .record_fraud(
            &row,
            slash
                .as_ref()
                .map(|(transaction, floors)| (transaction, floors.as_slice())),
        )
        .await?
    else {
        return Ok(None);
    };
    tracing::warn!(
        node = node.id,
        provider,
        fraud = fraud.name(),
        slashed_micros = plan.slashed.0,
        refunded_micros = plan.slashed.0 - plan.to_platform.0,
        "fraud proven: bond slashed, tenants refunded, node cordoned"
    );
    let reason = "its node was cordoned for proven fraud";
    let jobs = crate::lifecycle::lose_leases_of_node(state, node.id, reason, now).await?;
    crate::lifecycle::restart_jobs(
        state,
        &jobs,
        "its node was cordoned for proven fraud; queued again",
        now,
    )
    .await?;
    state.wake.notify_one();
    Ok(Some(id))
}

/// Evidence of `kinds` against `node` inside a proof's window: since `window_us` ago, and after
/// the node's last fraud decision (a node starts over after one, § 6).
async fn evidence_in_window(
    state: &AppState,
    node: i64,
    kinds: &[&str],
    window_us: i64,
    now: i64,
) -> ApiResult<Vec<EvidenceRow>> {
    let after_fraud = state
        .store
        .last_fraud_of_node(node)
        .await?
        .map_or(i64::MIN, |at| at + 1);
    let since = (now - window_us).max(after_fraud);
    let mut rows = state.store.evidence_of_kinds_since(node, kinds, since).await?;
    if rows.len() > EVIDENCE_READ_MAX {
        rows.drain(..rows.len() - EVIDENCE_READ_MAX);
    }
    Ok(rows)
}

fn evidence_json(rows: &[EvidenceRow]) -> Vec<Value> {
    rows.iter()
        .map(|row| {
            json!({
                "evidence_id": row.id,
                "kind": row.kind,
                "at_us": row.at,
                "detail": serde_json::from_str::<Value>(&row.detail).unwrap_or_else(|_| Value::String(row.detail.clone())),
            })
        })
        .collect()
}

/// The earliest lease the evidence names (its `lease_id`), for the refunds' period.
async fn first_lease_start(state: &AppState, rows: &[EvidenceRow], fallback: i64) -> ApiResult<i64> {
    let mut since = fallback;
    for row in rows {
        let lease = serde_json::from_str::<Value>(&row.detail)
            .ok()
            .and_then(|detail| detail["lease_id"].as_i64());
        if let Some(lease) = lease
            && let Some(record) = state.store.lease(lease).await?
        {
            since = since.min(record.created_at);
        }
    }
    Ok(since)
}

/// Kinds of evidence that count as violating usage records (§ 4, and § 7: a node's own valid
/// signature on a record for a lease it does not hold).
pub const USAGE_EVIDENCE: [&str; 2] = ["usage_violation", "foreign_lease_record"];

/// A rule that proves fraud by counting evidence (§§ 4–5).
struct CountRule {
    /// The kinds of evidence it counts, and over how long.
    kinds: &'static [&'static str],
    window_us: i64,
    /// One of `Evidence`'s rules, fed each row's time in order.
    count: fn(&mut Evidence, i64) -> Option<Fraud>,
    /// The rule in words, for the decision.
    rule: String,
    /// Where the decision lists the rows, and the prefix of its key.
    listed: &'static str,
    key_prefix: &'static str,
}

/// Feeds `rule` the evidence against `node` inside its window; when it proves a fraud, decides
/// it with the rows as its evidence, named by the first of them.
async fn prove_by_count(state: &AppState, node: &NodeRecord, rule: CountRule, now: i64) -> ApiResult<Option<Fraud>> {
    let rows = evidence_in_window(state, node.id, rule.kinds, rule.window_us, now).await?;
    let mut evidence = Evidence::default();
    let proven = rows
        .iter()
        .map(|row| (rule.count)(&mut evidence, row.at / 1000))
        .last()
        .flatten();
    let Some(fraud) = proven else { return Ok(None) };
    let since = first_lease_start(state, &rows, rows[0].at).await?;
    let mut decided = json!({"rule": format!("{} of {}: {}", fraud.section(), rules::POLICY_DOCUMENT, rule.rule)});
    decided[rule.listed] = Value::Array(evidence_json(&rows));
    let key = format!("{}-{}", rule.key_prefix, rows[0].id);
    prove(state, node, fraud, decided, since, key, now).await?;
    Ok(Some(fraud))
}

/// § 4 and § 7: keeps a violating usage record (`usage_violation`), or a node's signed record
/// for a lease it does not hold (`foreign_lease_record`), as evidence against the node; three
/// within a day prove inflated usage.
pub async fn usage_evidence(state: &AppState, node_id: i64, kind: &str, detail: &str, now: i64) -> ApiResult<()> {
    state.store.record_evidence(Some(node_id), kind, detail, now).await?;
    let Some(node) = state.store.node(node_id).await? else {
        return Ok(());
    };
    let rule = CountRule {
        kinds: &USAGE_EVIDENCE,
        window_us: rules::USAGE_PROOF_WINDOW_MS * 1000,
        count: Evidence::usage_violation,
        rule: format!(
            "{} violating usage records within 24 hours",
            rules::USAGE_VIOLATIONS_TO_PROVE
        ),
        listed: "records",
        key_prefix: "usage",
    };
    prove_by_count(state, &node, rule, now).await?;
    Ok(())
}

/// § 5: a lease `node` dropped ends as lost and its job queues again; the heartbeats are kept
/// as evidence, the node's reputation takes a fault, and two drops within a week prove dropped
/// jobs.
pub async fn dropped(state: &AppState, node: &NodeRecord, drop: Dropped, now: i64) -> ApiResult<()> {
    let Some(lease) = state.store.lease(drop.lease).await? else {
        return Ok(());
    };
    if lease.epoch != drop.epoch || !lease.state.is_live() {
        return Ok(());
    }
    let reason = "dropped by its node: missing from the node's signed heartbeats, with no attestation";
    if state
        .store
        .end_lease(lease.id, LeaseState::Lost, reason, now)
        .await?
        .is_none()
    {
        return Ok(());
    }
    tracing::warn!(node = node.id, lease = lease.id, "a lease was dropped by its node");
    let detail = json!({
        "lease_id": lease.id,
        "epoch": lease.epoch,
        "job_id": lease.job_id,
        "heartbeats": drop.heartbeats,
    });
    state
        .store
        .record_evidence(Some(node.id), "dropped_lease", &detail.to_string(), now)
        .await?;
    state
        .store
        .record_outcome(node.id, Outcome::NodeFault.name(), now)
        .await?;
    crate::lifecycle::restart_jobs(
        state,
        &[lease.job_id],
        "a replica was dropped by its node; queued again",
        now,
    )
    .await?;
    let rule = CountRule {
        kinds: &["dropped_lease"],
        window_us: rules::DROP_WINDOW_MS * 1000,
        count: Evidence::dropped_lease,
        rule: format!("{} dropped leases within 7 days", rules::DROPS_TO_PROVE),
        listed: "drops",
        key_prefix: "drop",
    };
    prove_by_count(state, node, rule, now).await?;
    state.wake.notify_one();
    Ok(())
}

/// § 5: `node` went silent inside an advertised window (its last heartbeat at `last_heard`):
/// the absence is kept, and absences beyond what an honest node shows prove missed windows.
pub async fn absence(state: &AppState, node: &NodeRecord, last_heard: i64, now: i64) -> ApiResult<()> {
    let detail = json!({"last_heartbeat_at_us": last_heard, "found_silent_at_us": now});
    state
        .store
        .record_evidence(Some(node.id), "window_absence", &detail.to_string(), now)
        .await?;
    let window_us = rules::ABSENCE_WINDOW_MS * 1000;
    let rows = evidence_in_window(state, node.id, &["window_absence"], window_us, now).await?;
    let since = (now - window_us).max(rows.first().map_or(now, |row| row.at) - window_us);
    let mut hours_milli = 0;
    for outcome in [Outcome::WindowHourPresent, Outcome::WindowHourMissed] {
        hours_milli += state.store.outcome_weight_since(node.id, outcome.name(), since).await?;
    }
    // With the hours the leader counted and has not written up yet.
    hours_milli += state
        .window_hours
        .lock()
        .expect("window hours lock")
        .pending_milli(node.id);
    let window_hours = u64::try_from(hours_milli / 1000).unwrap_or(0);
    let absences = rows.len() as u64;
    if !rules::absences_beyond_chance(absences, window_hours) {
        return Ok(());
    }
    let evidence = json!({
        "rule": format!(
            "{} of {}: {absences} absences in {window_hours} advertised window hours, a chance below {} at {} absences per hour",
            Fraud::MissedWindows.section(), rules::POLICY_DOCUMENT, rules::ABSENCE_TAIL_PROBABILITY, rules::HONEST_ABSENCES_PER_HOUR
        ),
        "absences": evidence_json(&rows),
        "window_hours": window_hours,
    });
    prove(
        state,
        node,
        Fraud::MissedWindows,
        evidence,
        rows[0].at,
        format!("absence-{}", rows[0].id),
        now,
    )
    .await?;
    Ok(())
}
