//! Reputation, badges and gold eligibility (docs/trust-policy.md §§ 1–3) as the coordinator
//! keeps them: every replica holds each node's decayed outcome weights in memory (`Book`), read
//! from the store's outcomes incrementally, and `Standings` joins them with the nodes' canaries,
//! the providers' bonds and the fraud decided, for the matcher's view and the trust pages.

use std::collections::{BTreeMap, HashMap};

use ledger::Account;
use trust::rules::{self, CanaryFinding, History, NodeCanaries};

use crate::books::reputation::{NodeFacts, NodeStanding, ProviderStanding, Standings};
use crate::error::ApiError;
use crate::state::AppState;

/// Outcomes read per query when catching up.
const OUTCOMES_PER_READ_MAX: i64 = 50_000;
/// Outcomes stamped this long before the cursor are read again: a replica's write stamped just
/// before the cursor moved may commit just after. Each is applied once (by id).
const OVERLAP_US: i64 = 5_000_000;

/// Reads the outcomes recorded since the book last looked (all of them the first time): an
/// indexed read of the few rows since, so every answer sees every outcome committed before it.
pub async fn catch_up(state: &AppState) -> Result<(), ApiError> {
    let mut book = state.reputations.lock().await;
    let mut since = book.cursor_us().saturating_sub(OVERLAP_US);
    loop {
        let rows = state.store.outcomes_since(since, OUTCOMES_PER_READ_MAX).await?;
        for row in &rows {
            book.apply(row.id, row.node_id, &row.outcome, row.weight_milli, row.at);
            book.read_until(row.at);
        }
        if (rows.len() as i64) < OUTCOMES_PER_READ_MAX {
            break;
        }
        // A full page: go on from its last microsecond (read again, applied once), or past it
        // when the whole page shares that microsecond.
        let (first, last) = (rows[0].at, rows[rows.len() - 1].at);
        since = if first == last { last + 1 } else { last };
    }
    let cursor = book.cursor_us();
    book.forget_before(cursor.saturating_sub(OVERLAP_US));
    Ok(())
}

/// Every standing now, from the book (caught up) and the store.
pub async fn standings(state: &AppState, nodes: &[NodeFacts], now_us: i64) -> Result<Standings, ApiError> {
    catch_up(state).await?;
    let now_ms = now_us / 1000;
    let canaries: HashMap<i64, NodeCanaries> = state
        .store
        .canary_standings()
        .await?
        .into_iter()
        .map(|standing| {
            let last_answered = standing
                .finding
                .as_deref()
                .and_then(CanaryFinding::parse)
                .zip(standing.finished_at.map(|at| at / 1000));
            (
                standing.node_id,
                NodeCanaries {
                    last_answered,
                    unanswered_since: u32::try_from(standing.unanswered).unwrap_or(u32::MAX),
                    fingerprint_changed_ms: None,
                },
            )
        })
        .collect();
    let bonds: HashMap<i64, i64> = state
        .store
        .balances("provider:")
        .await?
        .into_iter()
        .filter_map(|row| match Account::parse(&row.account) {
            Ok(Account::ProviderBond(provider)) => Some((provider, row.balance)),
            _ => None,
        })
        .collect();
    let frauds: HashMap<i64, i64> = state
        .store
        .last_frauds_of_providers()
        .await?
        .into_iter()
        .map(|fraud| (fraud.provider_id, fraud.decided_at))
        .collect();
    let mut by_provider: BTreeMap<i64, Vec<&NodeFacts>> = BTreeMap::new();
    for record in nodes {
        by_provider.entry(record.provider_id).or_default().push(record);
    }
    let book = state.reputations.lock().await;
    let mut out = Standings::default();
    for (provider, records) in by_provider {
        let reputation = book.provider(records.iter().map(|record| record.id), now_ms);
        let history = History {
            first_registered_ms: records
                .iter()
                .map(|record| record.registered_at / 1000)
                .min()
                .unwrap_or(now_ms),
            last_fraud_ms: frauds.get(&provider).map(|at| at / 1000),
            bond_micros: bonds.get(&provider).copied().unwrap_or(0),
            gpus_offered: records
                .iter()
                .map(|record| u32::try_from(record.gpu_count).unwrap_or(0))
                .sum(),
        };
        let badge = rules::badge(&reputation, &history, now_ms);
        for record in records {
            let mut node_canaries = canaries.get(&record.id).copied().unwrap_or(NodeCanaries {
                last_answered: None,
                unanswered_since: 0,
                fingerprint_changed_ms: None,
            });
            node_canaries.fingerprint_changed_ms = record.fingerprint_changed_at.map(|at| at / 1000);
            let cordoned = record.fraud_cordoned_at.is_some();
            let gold_eligible = if state.config.gold_needs_badge {
                rules::gold_eligible(badge, &node_canaries, cordoned)
            } else {
                !cordoned
            };
            out.nodes.insert(
                record.id,
                NodeStanding {
                    provider_id: provider,
                    reputation: book.node(record.id, now_ms),
                    canaries: node_canaries,
                    fraud_cordoned_at: record.fraud_cordoned_at,
                    gold_eligible,
                },
            );
        }
        out.providers.insert(
            provider,
            ProviderStanding {
                reputation,
                history,
                badge,
            },
        );
    }
    Ok(out)
}
