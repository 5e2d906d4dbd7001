//! What one policy's run counts: its work by what it bought, money by tier and provider kind,
//! jobs' fates, the matcher's calls and their time, the checks' findings and the charts' samples.

use model::{Micros, Timestamp};

use super::workload::{JobKind, SimJob};

/// Kinds of work, for the goodput figures: jobs of one replica, gangs of the demand, the big gang.
pub(super) const CLASSES: usize = 3;
pub(super) fn class_of(job: &SimJob) -> usize {
    if job.kind == JobKind::BigGang {
        2
    } else if job.spec.replicas > 1 {
        1
    } else {
        0
    }
}

/// Billed milli-GPU-seconds by what they bought.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkTally {
    pub allocated: u64,
    pub useful: u64,
    pub checkpoint: u64,
    pub lost: u64,
    pub restart: u64,
    pub grace: u64,
}

impl WorkTally {
    pub fn accounted(&self) -> u64 {
        self.useful + self.checkpoint + self.lost + self.restart + self.grace
    }
}

/// One sample of the fleet, for the charts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub at: Timestamp,
    pub used_gpus: f64,
    pub offered_gpus: f64,
    pub fragmentation_pct: f64,
    pub queued: [u32; 3],
}

/// Everything a policy's run counted.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub work: [WorkTally; CLASSES],
    /// Per tenant tier: milli-GPU-seconds billed, what tenants paid, what the same GPU-hours
    /// cost at the on-demand reference price, useful H100-equivalent milli-GPU-seconds.
    pub billed_milli_s: [u64; 3],
    pub paid: [Micros; 3],
    pub on_demand_cost: [Micros; 3],
    pub useful_h100_milli_s: [u64; 3],
    pub provider_earned: [Micros; 4],
    /// Milli-GPU-seconds sold, per provider kind.
    pub sold_milli_s: [u64; 4],
    pub platform_fees: Micros,
    pub transactions: u64,
    pub offered_gpu_s: [f64; 4],
    pub used_milli_s: f64,
    pub fleet_gpus: u64,
    /// Queue waits of jobs' first starts (seconds), per tier.
    pub waits: [Vec<u32>; 3],
    /// Seconds waited by jobs that never started (gave up, or still queued at the end).
    pub unserved_wait_s: [u64; 3],
    /// What the winners asked for the GPU-hours billed (their own ask in the lease's tier).
    pub asked: [Micros; 3],
    pub submitted: [u64; 3],
    pub started: [u64; 3],
    pub finished: [u64; 3],
    pub gave_up: [u64; 3],
    /// Refused at submission: no node of the fleet could ever run them under this policy.
    pub rejected: [u64; 3],
    pub unstarted_at_end: [u64; 3],
    /// Leases preempted (by gold or silver, or by a window closing), per tier.
    pub preempted_leases: [u64; 3],
    pub window_preempted_leases: [u64; 3],
    pub failed_leases: u64,
    pub node_failures: u64,
    pub repairs: u64,
    pub repairs_failed: u64,
    pub gang_restarts: u64,
    pub big_gang_failures: u64,
    pub big_gang_repairs: u64,
    pub big_gang_restarts: u64,
    pub big_gang_running_s: u64,
    /// Spare nodes the campus holds for the big gang (its last booking).
    pub spares_reserved: u64,
    pub events: u64,
    pub passes: u64,
    pub placements_tried: u64,
    pub preemptions_tried: u64,
    pub matcher_calls: u64,
    pub matcher_ns: u64,
    pub matcher_ns_by_call: [u64; 7],
    pub consistency_checks: u64,
    pub consistency_failures: Vec<String>,
    pub ledger_checks: u64,
    pub ledger_failures: Vec<String>,
    pub samples: Vec<Sample>,
    pub frag_sum: f64,
    pub frag_samples: u64,
    /// With `--fraud-rate`: what fraud cost, and what the trust policy caught.
    pub fraud: Option<super::fraud::FraudReport>,
}

/// Kinds of matcher call, for the time breakdown.
#[derive(Clone, Copy, Debug)]
pub(super) enum Call {
    Place = 0,
    PlaceGang = 1,
    Preempt = 2,
    Repair = 3,
    Release = 4,
    NodeState = 5,
    Clock = 6,
}

pub(super) const CALL_NAMES: [&str; 7] = [
    "place",
    "place_gang",
    "preempt",
    "repair",
    "release",
    "node_state",
    "clock",
];
