//! Reputation, badges and gold eligibility (docs/trust-policy.md §§ 1–3) as the coordinator
//! keeps them: every replica holds each node's decayed outcome weights in memory (`Book`), read
//! from the store's outcomes incrementally, and `Standings` joins them with the nodes' canaries,
//! the providers' bonds and the fraud decided, for the matcher's view and the trust pages.

use std::collections::{BTreeMap, HashMap, HashSet};

use ledger::Account;
use trust::rules::{self, Badge, CanaryFinding, History, NodeCanaries, Outcome, Reputation};

use crate::error::ApiError;
use crate::state::AppState;

/// Outcomes read per query when catching up.
const OUTCOMES_PER_READ_MAX: i64 = 50_000;
/// Outcomes stamped this long before the cursor are read again: a replica's write stamped just
/// before the cursor moved may commit just after. Each is applied once (by id).
const OVERLAP_US: i64 = 5_000_000;

/// The outcome a stored outcome name stands for. `ok` is how a lease that ended well has always
/// been stored; a tenant's job failing (`job_failed`) is no outcome of the node's.
pub fn outcome_of(name: &str) -> Option<Outcome> {
    match name {
        "ok" => Some(Outcome::LeaseFinished),
        other => Outcome::parse(other),
    }
}

/// Every node's outcomes, decayed. Weights are kept scaled to a fixed reference time,
/// `w × 2^((at − reference) / half-life)`, so a new outcome adds to a sum and the sums are
/// decayed to any `now` by one factor.
#[derive(Default)]
pub struct Book {
    reference_ms: i64,
    sums: HashMap<i64, [f64; 6]>,
    /// Outcomes at or after this (µs) are read next.
    cursor_us: i64,
    /// Ids of the outcomes applied that are still inside the overlap.
    recent: HashSet<i64>,
    recent_at: Vec<(i64, i64)>,
}

impl Book {
    fn scale(&self, at_ms: i64) -> f64 {
        2f64.powf((at_ms - self.reference_ms) as f64 / rules::HALF_LIFE_MS as f64)
    }

    /// Adds one stored outcome (its id, node, name, weight in thousandths and time in µs).
    pub fn apply(&mut self, id: i64, node: i64, name: &str, weight_milli: i64, at_us: i64) {
        if self.reference_ms == 0 {
            self.reference_ms = at_us / 1000;
        }
        if !self.recent.insert(id) {
            return;
        }
        self.recent_at.push((at_us, id));
        let Some(outcome) = outcome_of(name) else { return };
        let weight = outcome.weight().1 * weight_milli.max(0) as f64 / 1000.0 * self.scale(at_us / 1000);
        self.sums.entry(node).or_insert([0.0; 6])[outcome.slot()] += weight;
    }

    fn decayed(&self, node: i64, now_ms: i64) -> [f64; 6] {
        let mut inputs = self.sums.get(&node).copied().unwrap_or([0.0; 6]);
        let factor = 1.0 / self.scale(now_ms);
        for input in &mut inputs {
            *input *= factor;
        }
        inputs
    }

    /// A node's reputation seen at `now_ms`.
    pub fn node(&self, node: i64, now_ms: i64) -> Reputation {
        Reputation::from_inputs(self.decayed(node, now_ms))
    }

    /// A provider's reputation: the same posterior over all of its nodes' outcomes (§ 1).
    pub fn provider(&self, nodes: impl IntoIterator<Item = i64>, now_ms: i64) -> Reputation {
        let mut inputs = [0.0; 6];
        for node in nodes {
            for (sum, input) in inputs.iter_mut().zip(self.decayed(node, now_ms)) {
                *sum += input;
            }
        }
        Reputation::from_inputs(inputs)
    }

    fn forget_before(&mut self, before_us: i64) {
        let recent = &mut self.recent;
        self.recent_at.retain(|(at, id)| {
            let keep = *at >= before_us;
            if !keep {
                recent.remove(id);
            }
            keep
        });
    }
}

/// Reads the outcomes recorded since the book last looked (all of them the first time): an
/// indexed read of the few rows since, so every answer sees every outcome committed before it.
pub async fn catch_up(state: &AppState) -> Result<(), ApiError> {
    let mut book = state.reputations.lock().await;
    let mut since = book.cursor_us.saturating_sub(OVERLAP_US);
    loop {
        let rows = state.store.outcomes_since(since, OUTCOMES_PER_READ_MAX).await?;
        for (id, node, name, weight_milli, at) in &rows {
            book.apply(*id, *node, name, *weight_milli, *at);
            book.cursor_us = book.cursor_us.max(*at);
        }
        if (rows.len() as i64) < OUTCOMES_PER_READ_MAX {
            break;
        }
        // A full page: go on from its last microsecond (read again, applied once), or past it
        // when the whole page shares that microsecond.
        let (first, last) = (rows[0].4, rows[rows.len() - 1].4);
        since = if first == last { last + 1 } else { last };
    }
    let cursor = book.cursor_us;
    book.forget_before(cursor.saturating_sub(OVERLAP_US));
    Ok(())
}

/// Where one node stands.
#[derive(Clone, Debug)]
pub struct NodeStanding {
    pub provider_id: i64,
    pub reputation: Reputation,
    pub canaries: NodeCanaries,
    pub fraud_cordoned_at: Option<i64>,
    /// Gold work may go to it (§§ 2–3; always, when the coordinator does not ask for badges).
    pub gold_eligible: bool,
}

/// Where one provider stands.
#[derive(Clone, Debug)]
pub struct ProviderStanding {
    pub reputation: Reputation,
    pub history: History,
    pub badge: Badge,
}

/// Every node's and provider's standing at one time.
#[derive(Default)]
pub struct Standings {
    pub nodes: BTreeMap<i64, NodeStanding>,
    pub providers: BTreeMap<i64, ProviderStanding>,
}

impl Standings {
    /// A node's reliability for the matcher (parts per million) and whether it takes gold
    /// work; a node it does not know has the prior and no gold.
    pub fn for_matcher(&self, node: i64) -> (u32, bool) {
        match self.nodes.get(&node) {
            Some(standing) => (standing.reputation.score_ppm(), standing.gold_eligible),
            None => (Reputation::default().score_ppm(), false),
        }
    }
}

/// What a stored canary finding is, for the rules.
pub fn finding_of(name: &str) -> Option<CanaryFinding> {
    match name {
        "passed" => Some(CanaryFinding::Passed),
        "wrong_answer" => Some(CanaryFinding::WrongAnswer),
        "slow" => Some(CanaryFinding::Slow),
        _ => None,
    }
}

/// What standings need of a node (a few numbers, cheap to copy out of a view of 125,000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub id: i64,
    pub provider_id: i64,
    pub online: bool,
    pub gpu_count: i64,
    pub registered_at: i64,
    pub fingerprint_changed_at: Option<i64>,
    pub fraud_cordoned_at: Option<i64>,
}

impl NodeFacts {
    pub fn of(record: &store::NodeRecord) -> NodeFacts {
        NodeFacts {
            id: record.id,
            provider_id: record.node.provider_id,
            online: record.online,
            gpu_count: record.node.gpu_count,
            registered_at: record.registered_at,
            fingerprint_changed_at: record.fingerprint_changed_at,
            fraud_cordoned_at: record.fraud_cordoned_at,
        }
    }

    pub fn all(records: &[store::NodeRecord]) -> Vec<NodeFacts> {
        records.iter().map(NodeFacts::of).collect()
    }
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
        .map(|(node, finding, finished_at, unanswered)| {
            let last_answered = finding
                .as_deref()
                .and_then(finding_of)
                .zip(finished_at.map(|at| at / 1000));
            (
                node,
                NodeCanaries {
                    last_answered,
                    unanswered_since: u32::try_from(unanswered).unwrap_or(u32::MAX),
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
        .filter_map(|(key, balance)| match Account::parse(&key) {
            Ok(Account::ProviderBond(provider)) => Some((provider, balance)),
            _ => None,
        })
        .collect();
    let frauds: HashMap<i64, i64> = state.store.last_frauds_of_providers().await?.into_iter().collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_US: i64 = 86_400_000_000;
    const NOW_US: i64 = 1_800_000_000_000_000;

    #[test]
    fn the_book_decays_like_the_rules() {
        let mut book = Book::default();
        let outcomes = [
            (1, 7, "ok", 1000, NOW_US - 40 * DAY_US),
            (2, 7, "node_fault", 1000, NOW_US - DAY_US),
            (3, 7, "window_hour_present", 500, NOW_US),
            (4, 7, "job_failed", 1000, NOW_US),
            (5, 8, "canary_failed", 1000, NOW_US - 30 * DAY_US),
        ];
        for (id, node, name, weight, at) in outcomes {
            book.apply(id, node, name, weight, at);
        }
        // The same outcome applied twice (read again in the overlap) counts once.
        book.apply(2, 7, "node_fault", 1000, NOW_US - DAY_US);
        let mut expected = Reputation::default();
        expected.add(Outcome::LeaseFinished, (NOW_US - 40 * DAY_US) / 1000, NOW_US / 1000);
        expected.add(Outcome::NodeFault, (NOW_US - DAY_US) / 1000, NOW_US / 1000);
        expected.add_many(Outcome::WindowHourPresent, 0.5, NOW_US / 1000, NOW_US / 1000);
        let node = book.node(7, NOW_US / 1000);
        assert!((node.alpha - expected.alpha).abs() < 1e-9, "{node:?} {expected:?}");
        assert!((node.beta - expected.beta).abs() < 1e-9, "{node:?} {expected:?}");
        let other = book.node(8, NOW_US / 1000);
        assert!(
            (other.inputs[Outcome::CanaryFailed.slot()] - 2.5).abs() < 1e-9,
            "5 halved: {other:?}"
        );
        let provider = book.provider([7, 8], NOW_US / 1000);
        assert!((provider.beta - (node.beta + other.beta - rules::PRIOR_FAILURES)).abs() < 1e-9);
        assert_eq!(
            book.node(9, NOW_US / 1000),
            Reputation::default(),
            "no outcomes: the prior"
        );
    }

    #[test]
    fn stored_names_map_to_outcomes() {
        assert_eq!(outcome_of("ok"), Some(Outcome::LeaseFinished));
        assert_eq!(outcome_of("node_fault"), Some(Outcome::NodeFault));
        assert_eq!(outcome_of("canary_passed"), Some(Outcome::CanaryPassed));
        assert_eq!(outcome_of("job_failed"), None, "a tenant's failure is not the node's");
        assert_eq!(finding_of("unanswered"), None);
        assert_eq!(finding_of("slow"), Some(CanaryFinding::Slow));
    }
}
