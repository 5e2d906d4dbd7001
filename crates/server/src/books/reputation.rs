//! The reputation service's book (docs/trust-policy.md §§ 1–3): every node's decayed outcome
//! weights in memory (`Book`), and `Standings`, every node's and provider's standing at one
//! time, which the matcher's view and the trust pages read. Plain data: `reputation` fills them.

use std::collections::{BTreeMap, HashMap, HashSet};

use trust::rules::{self, Badge, History, NodeCanaries, Outcome, Reputation};

/// How a lease that ended well has always been stored as an outcome (`Outcome::LeaseFinished`).
pub const LEASE_OK: &str = "ok";
/// How a replica whose tenant's job failed is stored: a record, no outcome of the node's.
pub const LEASE_JOB_FAILED: &str = "job_failed";

/// The outcome a stored outcome name stands for. `ok` is how a lease that ended well has always
/// been stored; a tenant's job failing (`job_failed`) is no outcome of the node's.
pub fn outcome_of(name: &str) -> Option<Outcome> {
    match name {
        LEASE_OK => Some(Outcome::LeaseFinished),
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

    /// Outcomes at or after this (µs) are read next.
    pub fn cursor_us(&self) -> i64 {
        self.cursor_us
    }

    /// Moves the cursor to `at_us` if that is later.
    pub fn read_until(&mut self, at_us: i64) {
        self.cursor_us = self.cursor_us.max(at_us);
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

    /// Forgets the ids of outcomes stamped before `before_us` (outside the overlap).
    pub fn forget_before(&mut self, before_us: i64) {
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

#[cfg(test)]
mod tests {
    use trust::rules::CanaryFinding;

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
        assert_eq!(CanaryFinding::parse("unanswered"), None);
        assert_eq!(CanaryFinding::parse("slow"), Some(CanaryFinding::Slow));
        for finding in CanaryFinding::ALL {
            assert_eq!(CanaryFinding::parse(finding.name()), Some(finding));
        }
    }
}
