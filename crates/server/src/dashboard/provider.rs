//! The provider page: the provider's nodes (simulated ones marked), their reliability, how much
//! of the GPU time they offered was sold, its standing under the trust policy (badge, bond,
//! reputation with its inputs, each node's trust and last canary, fraud decided), and earnings
//! over time.

use std::collections::BTreeMap;
use std::sync::Arc;

use api::{CanaryView, TrustView};
use axum::extract::{Query, State};
use axum::response::Response;
use ledger::Account;
use store::Role;
use trust::rules::{CANARY_SLOW_PERMILLE, Outcome};

use super::chart::{LineChart, Series, line_chart};
use super::html::{badge, dollars, duration, escape, gpu_time, percent, stat, table, utc};
use super::market::window_links;
use super::tenant::running_total;
use super::{PageError, PageQuery, Session, render};
use crate::extract::Auth;
use crate::state::AppState;

/// Ledger entries of the earnings account read for the chart, newest first, at most.
const EARNINGS_ENTRIES_MAX: i64 = 10_000;

pub async fn page(
    State(state): State<Arc<AppState>>,
    session: Session,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, PageError> {
    session.require(Role::Provider)?;
    let query = query.map(|Query(query)| query).unwrap_or_default();
    let caller = session.caller;
    let hours = query.window_hours();
    let now = state.now_us();
    let from = now - hours * 3_600_000_000;
    let nodes = crate::routes::list_nodes(State(state.clone()), Auth(caller)).await?.0;
    let earnings = crate::routes::earnings(State(state.clone()), Auth(caller)).await?.0;
    let standing = crate::routes::trust_view(&state, caller.account_id).await?;
    let per_node: BTreeMap<i64, &api::NodeEarnings> = earnings.nodes.iter().map(|node| (node.node_id, node)).collect();
    let mut entries = state
        .store
        .ledger_entries_of(
            &Account::ProviderEarnings(caller.account_id).key(),
            EARNINGS_ENTRIES_MAX,
        )
        .await?;
    let complete = (entries.len() as i64) < EARNINGS_ENTRIES_MAX;
    entries.retain(|entry| entry.kind == "usage" && entry.amount > 0 && entry.at >= from);
    entries.reverse();
    let earned_in_window: i64 = entries.iter().map(|entry| entry.amount).sum();

    let online = nodes.iter().filter(|node| node.online).count();
    let gpus: i64 = nodes.iter().map(|node| node.gpu_count).sum();
    let simulated = nodes.iter().filter(|node| node.simulated).count();
    let sold_hours: f64 = earnings.nodes.iter().map(|node| node.gpu_hours_sold).sum();
    let sold = (sold_hours * 3_600_000.0).round() as i64;

    let mut body = format!("<h1>Provider: {}</h1>", escape(&session.name));
    body.push_str(&window_links("/dashboard/provider", hours));
    body.push_str("<section class=\"stats\">");
    body.push_str(&stat("earnings balance", &dollars(earnings.earnings_micros)));
    body.push_str(&stat(
        &format!("earned in the last {hours} h"),
        &dollars(earned_in_window),
    ));
    let nodes_text = if simulated > 0 {
        format!("{online} of {} ({simulated} simulated)", nodes.len())
    } else {
        format!("{online} of {}", nodes.len())
    };
    body.push_str(&stat("nodes online", &nodes_text));
    body.push_str(&stat("GPUs", &gpus.to_string()));
    body.push_str(&stat("GPU time sold", &gpu_time(sold)));
    body.push_str("</section>");

    body.push_str("<h2>Nodes</h2>");
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|node| {
            let mut name = escape(&node.name);
            if node.simulated {
                name.push(' ');
                name.push_str(&badge("simulated", "simulated"));
            }
            if node.over_limit_since_us.is_some() {
                name.push(' ');
                name.push_str(&badge("warning", "over its limits"));
            }
            let status = if node.online {
                badge("state-running", "online")
            } else {
                badge("state-failed", "offline")
            };
            let heard = node
                .last_heartbeat_at_us
                .map_or_else(|| "never".to_string(), |at| format!("{} ago", duration(now - at)));
            let sold = per_node.get(&node.id);
            vec![
                node.id.to_string(),
                name,
                format!("{} × {}", node.gpu_count, escape(&node.gpu_model)),
                format!("{} / {}", escape(&node.region), escape(&node.site)),
                status,
                heard,
                percent(node.reliability),
                node.live_leases.to_string(),
                sold.map_or_else(
                    || "–".to_string(),
                    |sold| gpu_time((sold.gpu_hours_sold * 3_600_000.0).round() as i64),
                ),
                sold.map_or_else(|| "–".to_string(), |sold| percent(sold.fill_rate)),
                sold.map_or_else(|| "–".to_string(), |sold| dollars(sold.earned_micros)),
            ]
        })
        .collect();
    body.push_str(&table(
        "nodes",
        &[
            "id",
            "node",
            "GPUs",
            "region / site",
            "status",
            "last heartbeat",
            "reliability",
            "live leases",
            "GPU time sold",
            "fill rate",
            "charged for its work",
        ],
        &rows,
        "No nodes yet: start fallow agent with your provider key.",
    ));
    body.push_str(
        "<p class=\"note\">Fill rate: the share of the node's GPU time since it registered that was sold. \
         Charged for its work: what tenants were charged for the node's leases, before the platform's fee. \
         Simulated nodes offer no real GPUs: their work is not billed unless the coordinator bills it as \
         play money.</p>",
    );
    body.push_str(&trust_section(&standing));

    body.push_str("<h2>Earnings over time</h2>");
    let series = [Series {
        label: "earned (running total)".to_string(),
        points: running_total(entries.iter().map(|entry| (entry.at, entry.amount)), from, now),
    }];
    body.push_str(&line_chart(&LineChart {
        title: "earnings over time",
        from_us: from,
        to_us: now,
        series: if earned_in_window > 0 { &series } else { &[] },
        value_label: dollars,
        running_total: true,
    }));
    if !complete {
        body.push_str(&format!(
            "<p class=\"note\">From the newest {EARNINGS_ENTRIES_MAX} ledger entries only.</p>"
        ));
    }
    Ok(render("Provider", Some(&session), &body, query.refresh_s))
}

/// The provider's standing under the trust policy (docs/trust-policy.md), its nodes' and the
/// fraud decided against it; every string in it is escaped.
fn trust_section(view: &TrustView) -> String {
    let mut body = String::from("<h2>Trust</h2><section class=\"stats trust\">");
    body.push_str(&stat("badge", &view.badge));
    body.push_str(&stat("bond", &dollars(view.bond_micros)));
    body.push_str(&stat(
        &format!("gold bond needed ({} GPUs offered)", view.gpus_offered),
        &dollars(view.gold_bond_needed_micros),
    ));
    body.push_str(&stat("reputation", &format!("{:.3}", view.reputation.score)));
    body.push_str(&stat(
        "lower bound (badges use it)",
        &format!("{:.3}", view.reputation.lower_bound),
    ));
    body.push_str(&stat("outcomes (decayed)", &format!("{:.1}", view.reputation.evidence)));
    body.push_str("</section>");
    body.push_str(&format!(
        "<p class=\"note\">{} Badges: docs/trust-policy.md § 2.{}</p>",
        escape(&next_badge_text(view)),
        view.last_fraud_at_us
            .map_or_else(String::new, |at| format!(" Fraud last proven {}.", utc(at)))
    ));

    body.push_str("<h3>Reputation inputs</h3>");
    let inputs: Vec<Vec<String>> = view
        .reputation
        .inputs
        .iter()
        .map(|(name, weight)| {
            let counts_as = match Outcome::parse(name).map(|outcome| outcome.weight().0) {
                Some(true) => badge("state-finished", "success"),
                Some(false) => badge("state-failed", "failure"),
                None => "–".to_string(),
            };
            vec![escape(&name.replace('_', " ")), counts_as, format!("{weight:.1}")]
        })
        .collect();
    body.push_str(&table(
        "reputation-inputs",
        &["outcome", "counts as", "weight (decayed)"],
        &inputs,
        "No outcomes counted.",
    ));
    body.push_str(
        "<p class=\"note\">The score is (8 + successes) / (10 + all outcomes): the prior Beta(8, 2) and the weights \
         above, over all your nodes. A canary passed weighs 2, a canary failed 5, anything else 1, and every weight \
         halves every 30 days, so an old failure is forgiven (docs/trust-policy.md § 1).</p>",
    );

    body.push_str("<h3>Nodes</h3>");
    let nodes: Vec<Vec<String>> = view
        .nodes
        .iter()
        .map(|node| {
            let canary = node.last_canary.as_ref();
            vec![
                node.node_id.to_string(),
                escape(&node.name),
                format!("{:.3}", node.reputation.score),
                format!("{:.3}", node.reputation.lower_bound),
                format!("{:.1}", node.reputation.evidence),
                if node.gold_eligible {
                    badge("state-finished", "eligible")
                } else {
                    badge("state-queued", "not eligible")
                },
                node.fraud_cordoned_at_us.map_or_else(
                    || "no".to_string(),
                    |at| badge("state-failed", &format!("since {}", utc(at))),
                ),
                canary.map_or_else(
                    || "none yet".to_string(),
                    |canary| format!("{} {}", finding_badge(canary), utc(canary.created_at_us)),
                ),
                canary.map_or_else(|| "–".to_string(), rate_text),
            ]
        })
        .collect();
    body.push_str(&table(
        "trust-nodes",
        &[
            "id",
            "node",
            "score",
            "lower bound",
            "outcomes",
            "gold work",
            "cordoned for fraud",
            "last canary",
            "canary rate / claimed model's",
        ],
        &nodes,
        "No nodes yet.",
    ));
    body.push_str(&format!(
        "<p class=\"note\">Gold work goes to nodes of gold-badge providers whose last canary did not fail. A canary \
         under {} % of the claimed model's rate is slow (docs/trust-policy.md § 3); rates are work units per second \
         per GPU. A node cordoned for fraud leaves the cordon when a canary passes on its current hardware: \
         fallow node verify ID orders one.</p>",
        CANARY_SLOW_PERMILLE / 10
    ));

    body.push_str("<h3>Fraud decided</h3>");
    let frauds: Vec<Vec<String>> = view
        .frauds
        .iter()
        .map(|fraud| {
            let refunded: i64 = fraud.refunds.iter().map(|refund| refund.paid_micros).sum();
            vec![
                utc(fraud.decided_at_us),
                fraud.node_id.to_string(),
                escape(&fraud.kind.replace('_', " ")),
                format!("{} of docs/trust-policy.md", escape(&fraud.section)),
                format!("{:.1} %", fraud.share_permille as f64 / 10.0),
                format!(
                    "{} of {}",
                    dollars(fraud.slashed_micros),
                    dollars(fraud.bond_before_micros)
                ),
                format!("{} to {} tenant(s)", dollars(refunded), fraud.refunds.len()),
                dollars(fraud.to_platform_micros),
            ]
        })
        .collect();
    body.push_str(&table(
        "frauds",
        &[
            "decided",
            "node",
            "fraud",
            "rule",
            "share of the bond",
            "slashed",
            "refunded",
            "to the platform",
        ],
        &frauds,
        "No fraud decided against your nodes.",
    ));
    if !view.frauds.is_empty() {
        body.push_str(
            "<p class=\"note\">The slashed bond pays back the tenants whose leases ran on the node first \
             (docs/trust-policy.md § 6). The evidence, signed records and canary results anyone can re-check, is in \
             GET /v1/frauds (fallow provider frauds --json).</p>",
        );
    }
    body
}

/// A canary's finding as a coloured label (`running` while it has none).
fn finding_badge(canary: &CanaryView) -> String {
    match canary.finding.as_deref() {
        None => badge("state-running", "running"),
        Some("passed") => badge("state-finished", "passed"),
        Some(finding @ ("unanswered" | "withdrawn")) => badge("warning", finding),
        Some(finding) => badge("state-failed", &finding.replace('_', " ")),
    }
}

/// `1.990 of 2.000 (99.5 %)`: the rate a canary ran at against the claimed model's.
fn rate_text(canary: &CanaryView) -> String {
    let rate = |milli: i64| format!("{:.3}", milli as f64 / 1000.0);
    let expected = rate(canary.expected_rate_milli);
    match canary.rate_milli {
        Some(measured) if canary.expected_rate_milli > 0 => format!(
            "{} of {expected} ({:.1} %)",
            rate(measured),
            measured as f64 * 100.0 / canary.expected_rate_milli as f64
        ),
        Some(measured) => format!("{} of {expected}", rate(measured)),
        None => format!("– of {expected}"),
    }
}

/// What the next badge up needs that the provider lacks (docs/trust-policy.md § 2), in words,
/// as the coordinator's rules say.
fn next_badge_text(view: &TrustView) -> String {
    match &view.next_badge {
        None => "Gold is the highest badge.".to_string(),
        Some(badge) if view.next_badge_needs.is_empty() => {
            format!("Every threshold of the {badge} badge is met; it shows within minutes.")
        }
        Some(badge) => format!("The {badge} badge needs {}.", view.next_badge_needs.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use api::{FraudView, NodeTrustView, RefundView, ReputationView};

    use super::*;

    const NOW: i64 = 1_764_424_987_000_000;

    fn reputation(score: f64, lower_bound: f64, evidence: f64) -> ReputationView {
        ReputationView {
            score,
            lower_bound,
            evidence,
            inputs: Outcome::ALL
                .iter()
                .map(|outcome| (outcome.name().to_string(), 0.0))
                .collect(),
        }
    }

    fn standing() -> TrustView {
        TrustView {
            provider_id: 7,
            bond_micros: 100_000_000,
            badge: "silver".into(),
            reputation: reputation(0.99, 0.975, 250.0),
            gpus_offered: 4,
            gold_bond_needed_micros: 200_000_000,
            first_registered_at_us: Some(NOW - 40 * 86_400_000_000),
            last_fraud_at_us: None,
            next_badge: Some("gold".into()),
            next_badge_needs: vec!["a bond of $200.00 (now $100.00)".into()],
            nodes: Vec::new(),
            frauds: Vec::new(),
        }
    }

    #[test]
    fn the_trust_section_says_why_and_escapes_what_providers_wrote() {
        let mut view = standing();
        view.reputation.inputs.insert("canary_failed".into(), 5.0);
        view.nodes.push(NodeTrustView {
            node_id: 9,
            name: "<script>alert(1)</script>".into(),
            reputation: reputation(0.75, 0.5, 5.0),
            fraud_cordoned_at_us: Some(NOW),
            gold_eligible: false,
            last_canary: Some(CanaryView {
                id: 3,
                node_id: 9,
                kind: "hash".into(),
                units: 20,
                gpus: vec![0],
                claimed_model: "<b>H100</b>".into(),
                created_at_us: NOW,
                delivered_at_us: None,
                finished_at_us: Some(NOW),
                finding: Some("wrong_answer".into()),
                reason: None,
                rate_milli: Some(640),
                expected_rate_milli: 2000,
                result: None,
                signature_hex: None,
            }),
        });
        view.frauds.push(FraudView {
            id: 1,
            node_id: 9,
            provider_id: 7,
            kind: "<i>wrong_answers</i>".into(),
            section: "§ 3".into(),
            share_permille: 1000,
            bond_before_micros: 100_000_000,
            slashed_micros: 100_000_000,
            refunds: vec![RefundView {
                tenant_id: 2,
                owed_micros: 30_000_000,
                paid_micros: 30_000_000,
            }],
            to_platform_micros: 70_000_000,
            evidence: serde_json::Value::Null,
            decided_at_us: NOW,
        });
        let html = trust_section(&view);
        for expected in [
            "<div class=\"value\">silver</div>",
            "<div class=\"value\">$100.00</div>",
            "The gold badge needs a bond of $200.00 (now $100.00).",
            "<td>canary failed</td><td><span class=\"badge state-failed\">failure</span></td><td class=\"nowrap\">5.0</td>",
            "&lt;script&gt;alert(1)&lt;/script&gt;",
            "<span class=\"badge state-failed\">wrong answer</span>",
            "0.640 of 2.000 (32.0 %)",
            "&lt;i&gt;wrong answers&lt;/i&gt;",
            "$100.00 of $100.00",
            "$30.00 to 1 tenant(s)",
        ] {
            assert!(html.contains(expected), "{expected:?} in {html}");
        }
        assert!(!html.contains("<script") && !html.contains("<i>"), "{html}");
    }

    #[test]
    fn an_empty_standing_says_so_and_the_next_badge_lists_every_gap() {
        let mut view = standing();
        view.badge = "none".into();
        view.next_badge = Some("bronze".into());
        view.next_badge_needs = vec![
            "a lower bound of 0.85 (now 0.560)".into(),
            "10 outcomes (now 0.0)".into(),
        ];
        let html = trust_section(&view);
        assert!(
            html.contains("No nodes yet.") && html.contains("No fraud decided"),
            "{html}"
        );
        assert!(
            html.contains("The bronze badge needs a lower bound of 0.85 (now 0.560), 10 outcomes (now 0.0)."),
            "{html}"
        );
        view.next_badge_needs.clear();
        assert_eq!(
            next_badge_text(&view),
            "Every threshold of the bronze badge is met; it shows within minutes."
        );
        view.next_badge = None;
        assert_eq!(next_badge_text(&view), "Gold is the highest badge.");
    }
}
