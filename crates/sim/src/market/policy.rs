//! The policies compared in one run, on the same fleet, demand and failures. All four decide
//! with the production matcher; what differs is how they use it.
//!
//! - `fallow`: the matcher as the coordinator uses it — tiers (gold, silver, bronze) each at its
//!   own ask, the reliability-weighted (k+1)-price auction, gold and silver preempting bronze,
//!   bronze in windows of any length, backfill past jobs that do not fit, gang repair.
//! - `no-repair`: the same, except that a gang that loses a node is released whole and placed
//!   again (restart the whole gang).
//! - `pay-as-bid`: a market as Akash clears: every job a firm lease (no tiers, no preemption, so
//!   a provider's window must cover the whole runtime), the lowest bid per unit of compute wins
//!   without reliability weighting or fragmentation terms, and each winner is paid its own bid;
//!   a lost gang restarts whole. How sellers bid there is a [`Bidding`]: by default they shade
//!   their bids up to the best losing offer (the market's equilibrium), or they bid their true
//!   (silver) asks.
//! - `fifo`: a static cluster: the always-on nodes only (a static cluster cannot follow
//!   providers' windows, so windowed hours go unsold), one first-in-first-out queue with
//!   head-of-line blocking, no tiers, no preemption, first fit in node order (the matcher's
//!   index with every node's key set to its position), list prices (each provider's silver
//!   ask) and no price caps; a lost gang restarts whole.

use matcher::MatcherConfig;
use model::{Micros, Node, ProviderPolicy, TierSet};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum PolicyName {
    Fallow,
    NoRepair,
    PayAsBid,
    Fifo,
}

impl PolicyName {
    pub const ALL: [PolicyName; 4] = [
        PolicyName::Fallow,
        PolicyName::Fifo,
        PolicyName::PayAsBid,
        PolicyName::NoRepair,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyName::Fallow => "fallow",
            PolicyName::NoRepair => "no-repair",
            PolicyName::PayAsBid => "pay-as-bid",
            PolicyName::Fifo => "fifo",
        }
    }

    pub fn parse(text: &str) -> Option<PolicyName> {
        PolicyName::ALL.into_iter().find(|policy| policy.name() == text)
    }

    /// `all`, or a comma-separated list of names.
    pub fn parse_list(text: &str) -> Result<Vec<PolicyName>, String> {
        if text == "all" {
            return Ok(PolicyName::ALL.to_vec());
        }
        let mut policies = Vec::new();
        for part in text.split(',') {
            let policy = PolicyName::parse(part.trim())
                .ok_or_else(|| format!("`{part}` is not a policy: use fallow, fifo, pay-as-bid, no-repair or all"))?;
            if !policies.contains(&policy) {
                policies.push(policy);
            }
        }
        Ok(policies)
    }

    /// How this policy uses the matcher; `bidding` is how sellers bid in the pay-as-bid market.
    pub(crate) fn rules(self, bidding: Bidding) -> Rules {
        match self {
            PolicyName::Fallow | PolicyName::NoRepair => Rules {
                tiers: true,
                preemption: true,
                repair: self == PolicyName::Fallow,
                head_of_line: false,
                pricing: Pricing::Auction,
                capped: true,
            },
            PolicyName::PayAsBid => Rules {
                tiers: false,
                preemption: false,
                repair: false,
                head_of_line: false,
                pricing: match bidding {
                    Bidding::Shaded => Pricing::ShadedAsk,
                    Bidding::Truthful => Pricing::OwnAsk,
                },
                capped: true,
            },
            PolicyName::Fifo => Rules {
                tiers: false,
                preemption: false,
                repair: false,
                head_of_line: true,
                pricing: Pricing::OwnAsk,
                capped: false,
            },
        }
    }

    /// The matcher's tunables under this policy.
    pub(crate) fn matcher_config(self) -> MatcherConfig {
        match self {
            PolicyName::Fallow | PolicyName::NoRepair => MatcherConfig::default(),
            PolicyName::PayAsBid | PolicyName::Fifo => MatcherConfig {
                reliability_alpha: 0.0,
                whole_node_break_permille: 0,
                leftover_gpu_permille: 0,
                split_gpu_permille: 0,
                leftover_share_permille_per_100_milli: 0,
                tier_mix_permille: 0,
                data_penalty_max_permille: 0,
                latency_penalty_max_permille: 0,
                ..MatcherConfig::default()
            },
        }
    }

    /// The nodes as this policy's matcher sees them. Policies without tiers sell one kind of
    /// lease on every node; the FIFO cluster's "asks" are only its first-fit order, and its
    /// windowed nodes sell nothing (no tier allowed).
    pub(crate) fn matcher_nodes(self, nodes: &[Node]) -> Vec<Node> {
        let catalog = model::GpuCatalog::embedded();
        nodes
            .iter()
            .map(|node| match self {
                PolicyName::Fallow | PolicyName::NoRepair => node.clone(),
                // One kind of lease, firm: sold by every provider that sells firm work at all
                // (one that sells only interruptible work has nothing to offer here).
                PolicyName::PayAsBid => Node {
                    policy: ProviderPolicy {
                        allowed_tiers: if sells_firm(node) { TierSet::ALL } else { TierSet(0) },
                        ..node.policy.clone()
                    },
                    ..node.clone()
                },
                PolicyName::Fifo => {
                    // With α = 0 and no penalty terms, a node's effective ask is
                    // ask × 1000 / cu_milli: asks of cu_milli × (position + 1) order the index
                    // by position, so the cheapest feasible node is the first that fits.
                    let cu_milli = i64::from(catalog.spec(node.gpu_model).cu_milli.max(1));
                    let order_ask = Micros(cu_milli * (i64::from(node.id.0) + 1));
                    let static_node = node.policy.windows.is_empty() && sells_firm(node);
                    Node {
                        policy: ProviderPolicy {
                            asks: [Some(order_ask); 3],
                            price_rules: Vec::new(),
                            allowed_tiers: if static_node { TierSet::ALL } else { TierSet(0) },
                            ..node.policy.clone()
                        },
                        ..node.clone()
                    }
                }
            })
            .collect()
    }
}

fn sells_firm(node: &Node) -> bool {
    let tiers = node.policy.allowed_tiers;
    tiers.contains(model::Tier::Gold) || tiers.contains(model::Tier::Silver)
}

/// How a policy uses the matcher.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// Jobs keep their tier (queues, asks, preemption lanes); otherwise every job is a firm
    /// silver lease.
    pub tiers: bool,
    /// Gold and silver may preempt bronze.
    pub preemption: bool,
    /// A gang that loses replicas is repaired in place rather than restarted whole.
    pub repair: bool,
    /// One queue, first in first out: a job that does not fit blocks those behind it.
    pub head_of_line: bool,
    pub pricing: Pricing,
    /// Jobs' price caps hold (a static cluster charges its list price whatever the job would pay).
    pub capped: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pricing {
    /// The matcher's uniform (k+1)-price.
    Auction,
    /// Each winner's own silver ask at the time of placement.
    OwnAsk,
    /// Each winner's bid shaded up to the best losing offer per unit of compute (converted to
    /// the winner's compute, capped by the job's price), never below its own ask.
    ShadedAsk,
}

/// How sellers bid in the pay-as-bid market.
///
/// In a uniform-price auction ((k+1)-th price, as Fallow clears) bidding one's true ask is a
/// dominant strategy. In a pay-as-bid auction it is not: a winner who bids its true ask leaves
/// the gap up to the best losing offer on the table, so sellers learn to bid the price they
/// expect to clear (the bid shading documented in pay-as-bid electricity and treasury auctions;
/// with full information the payments equal the uniform price's, the revenue-equivalence
/// result). `Shaded` models that equilibrium: every winner is paid the best losing offer per
/// unit of compute, as its matcher finds it without reliability weighting. `Truthful` is the
/// out-of-equilibrium case most favourable to tenants: every winner is paid its true ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Bidding {
    Shaded,
    Truthful,
}

impl Bidding {
    pub fn name(self) -> &'static str {
        match self {
            Bidding::Shaded => "shaded",
            Bidding::Truthful => "truthful",
        }
    }

    pub fn parse(text: &str) -> Option<Bidding> {
        [Bidding::Shaded, Bidding::Truthful]
            .into_iter()
            .find(|bidding| bidding.name() == text)
    }
}
