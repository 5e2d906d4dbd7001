//! Fallow's matching engine: pure, synchronous and deterministic. Given the fleet, the running
//! leases and a job, it decides where the job runs and at what price, whom to preempt, what to
//! reserve, and why a job cannot run. No IO, no async, no clock, no randomness: `now` is a
//! parameter and every iteration follows dense indices or sorted orders.
//!
//! The shape follows Nomad's scheduler: feasibility (cheapest checks first) → ranking →
//! selection → a [`Placement`] that [`Matcher::commit`] verifies against the current state.

mod check;
mod clock;
mod explain;
mod fit;
mod index;
mod preempt;
mod rankset;
mod reserve;
mod search;
mod state;

pub use explain::{Explanation, Quote, thousands};
pub use fit::Reason;
pub use preempt::{PreemptionPlan, Victim};
pub use reserve::{Booking, Reservation, ReservationId};

use model::{JobId, Lease, Micros, Node, NodeId, Tier, Timestamp, Topology};

/// Tunables of the ranking and the market. Defaults are what the benchmarks and the simulator use.
#[derive(Clone, Debug, PartialEq)]
pub struct MatcherConfig {
    /// α in `ask / (cu × reliability^α)`: how much a less reliable node must discount to win.
    pub reliability_alpha: f64,
    /// Score penalty, in thousandths of the effective ask, for breaking into an untouched node
    /// with a job that leaves part of it free (keeps whole nodes for the jobs that need them).
    pub whole_node_break_permille: u64,
    /// Penalty per whole GPU left free on a node after the placement (best fit).
    pub leftover_gpu_permille: u64,
    /// Penalty for splitting a whole GPU for a GPU share instead of using a GPU already shared.
    pub split_gpu_permille: u64,
    /// Penalty per milli-GPU left over on a shared GPU (best fit among shared GPUs).
    pub leftover_share_permille_per_100_milli: u64,
    /// Penalty for putting bronze work beside gold or silver work on a node (or the reverse):
    /// kept apart, bronze frees whole nodes and domains when gold needs them.
    pub tier_mix_permille: u64,
    /// Caps of the data-staging and latency terms: a node that lacks the data or is far away
    /// still competes, at up to this much over its effective ask (and the search stays bounded).
    pub data_penalty_max_permille: u64,
    pub latency_penalty_max_permille: u64,
    /// Grace period given to a preempted lease (SIGTERM, then kill).
    pub preemption_grace_s: u32,
    /// Round-trip milliseconds per kilometre (light in fibre, there and back, ≈ 1 ms per 100 km) plus a base.
    pub latency_ms_per_km: f64,
    pub latency_base_ms: f64,
}

impl Default for MatcherConfig {
    fn default() -> MatcherConfig {
        MatcherConfig {
            reliability_alpha: 2.0,
            whole_node_break_permille: 250,
            leftover_gpu_permille: 15,
            split_gpu_permille: 60,
            leftover_share_permille_per_100_milli: 5,
            tier_mix_permille: 400,
            data_penalty_max_permille: 500,
            latency_penalty_max_permille: 1000,
            preemption_grace_s: 30,
            latency_ms_per_km: 0.01,
            latency_base_ms: 1.0,
        }
    }
}

/// Where a job's replicas go, at what price. Built by [`Matcher::plan`]; ids and epochs are
/// given by [`Matcher::commit`].
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub job: JobId,
    pub tier: Tier,
    /// One lease per replica, in replica order; `price` is the clearing price per GPU-hour paid to that node.
    pub leases: Vec<Lease>,
    /// The runner-up's (the best losing alternative's) effective ask per compute-unit-hour, if
    /// there was one: the (k+1)-th price. `None` means pay-as-bid.
    pub clearing_price_per_cu_hour: Option<Micros>,
    /// Bronze work placed in a gap before a reservation: preempted when the reservation starts.
    pub preempt_at: Option<Timestamp>,
    /// Carried to the job record: preemption counts lost work since the last checkpoint.
    pub checkpoint_interval_s: u32,
}

impl Placement {
    /// The price per GPU-hour of the first lease (all leases of a single-node job share it).
    pub fn clearing_price(&self) -> Micros {
        self.leases.first().map_or(Micros::ZERO, |lease| lease.price)
    }
}

/// Why a decision placed nothing. The detailed, per-constraint account is [`Matcher::explain`].
/// The words are the job's own status ("waiting: …"), so they do not repeat its id, except to
/// say how to ask for the account.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unplaced {
    #[error("no node can take it now; 'fallow job show {}' says why", .0.0)]
    NoFeasibleNode(JobId),
    #[error(
        "no {} can hold all {replicas} replicas now (the best holds {best})",
        explain::domain_words(level)
    )]
    NoDomainFits {
        job: JobId,
        /// The topology level's API name ([`model::TopologyLevel::name`]).
        level: &'static str,
        replicas: u32,
        best: u32,
    },
    #[error("{reason}")]
    InvalidJob { job: JobId, reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    #[error("the plan for job {0} conflicts with the current state (capacity taken since it was planned)")]
    Conflict(JobId),
    #[error("job {0} already holds leases")]
    AlreadyPlaced(JobId),
    #[error("node {0} does not exist")]
    UnknownNode(NodeId),
}

pub use state::Matcher;

impl Matcher {
    /// Builds the matcher over a fleet. `nodes[i].id` must be `NodeId(i)`.
    pub fn new(topology: Topology, nodes: Vec<Node>, config: MatcherConfig) -> Matcher {
        Matcher::build(topology, nodes, config)
    }
}
