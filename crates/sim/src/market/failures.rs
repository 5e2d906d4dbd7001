//! Node interruptions and repairs, drawn once per run from the seed and shared by every policy:
//! the same node fails at the same moment whatever the policy did before.

use model::Timestamp;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::fleet::MarketFleet;

/// The shortest repair: a reboot and health checks.
pub const REPAIR_MIN_S: u32 = 600;

/// A node goes down (`up == false`) or comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeEvent {
    pub at: Timestamp,
    pub node: u32,
    pub up: bool,
    /// A dishonest node leaving inside its window (`--fraud-rate`), not a failure.
    pub vanish: bool,
}

/// Every interruption and repair in `start..end`, in time order. Each node draws from a stream
/// of its own: gaps between failures are exponential at the node's rate (the Llama 3 rate scaled
/// by its reliability), repairs exponential around its kind's mean (at least [`REPAIR_MIN_S`]).
pub fn node_events(fleet: &MarketFleet, seed: u64, start: Timestamp, end: Timestamp) -> Vec<NodeEvent> {
    let mut events = Vec::new();
    for node in 0..fleet.nodes.len() {
        let rate = fleet.failure_rate_per_s(node);
        if rate <= 0.0 {
            continue;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6661_696c_7572_6573);
        rng.set_stream(node as u64);
        let repair_mean = f64::from(fleet.repair_mean_s(node).saturating_sub(REPAIR_MIN_S).max(1));
        let mut at = start as f64;
        let mut last_up = start;
        loop {
            let unit: f64 = rng.random();
            at += -(1.0 - unit).ln() / rate;
            if at >= end as f64 {
                break;
            }
            let unit: f64 = rng.random();
            let down = f64::from(REPAIR_MIN_S) - (1.0 - unit).ln() * repair_mean;
            let fail_at = (at.ceil() as Timestamp).max(last_up + 1);
            let up_at = (at + down).ceil().max((fail_at + 1) as f64) as Timestamp;
            last_up = up_at;
            events.push(NodeEvent {
                at: fail_at,
                node: node as u32,
                up: false,
                vanish: false,
            });
            if up_at < end {
                events.push(NodeEvent {
                    at: up_at,
                    node: node as u32,
                    up: true,
                    vanish: false,
                });
            }
            at += down;
        }
    }
    events.sort_unstable();
    events
}
