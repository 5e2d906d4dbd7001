//! The binding of one replica of a job to GPUs of one node, fenced by an epoch.

use crate::ids::{JobId, LeaseId, NodeId};
use crate::money::Micros;
use crate::time::Timestamp;

/// A lease's life. `Pending` until the agent picks it up; the last five are ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseState {
    Pending,
    Staging,
    Running,
    Finished,
    Failed,
    Preempted,
    Lost,
    Cancelled,
}

impl LeaseState {
    pub const ALL: &'static [LeaseState] = &[
        LeaseState::Pending,
        LeaseState::Staging,
        LeaseState::Running,
        LeaseState::Finished,
        LeaseState::Failed,
        LeaseState::Preempted,
        LeaseState::Lost,
        LeaseState::Cancelled,
    ];

    /// The states of a lease that still holds its GPUs.
    pub const LIVE: [LeaseState; 3] = [LeaseState::Pending, LeaseState::Staging, LeaseState::Running];

    pub fn is_live(self) -> bool {
        LeaseState::LIVE.contains(&self)
    }

    /// The state's name, as stored and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Pending => "pending",
            LeaseState::Staging => "staging",
            LeaseState::Running => "running",
            LeaseState::Finished => "finished",
            LeaseState::Failed => "failed",
            LeaseState::Preempted => "preempted",
            LeaseState::Lost => "lost",
            LeaseState::Cancelled => "cancelled",
        }
    }

    /// The state named `text` (see `as_str`), if any.
    pub fn parse(text: &str) -> Option<LeaseState> {
        Some(match text {
            "pending" => LeaseState::Pending,
            "staging" => LeaseState::Staging,
            "running" => LeaseState::Running,
            "finished" => LeaseState::Finished,
            "failed" => LeaseState::Failed,
            "preempted" => LeaseState::Preempted,
            "lost" => LeaseState::Lost,
            "cancelled" => LeaseState::Cancelled,
            _ => return None,
        })
    }
}

impl std::fmt::Display for LeaseState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub job: JobId,
    pub replica: u32,
    pub node: NodeId,
    /// Bit i set = GPU i of the node.
    pub gpu_mask: u16,
    /// Milli-GPU taken on each GPU in the mask (1000 for whole GPUs).
    pub gpu_milli: u16,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// Fencing token: an agent acts only on the newest epoch of a lease.
    pub epoch: u64,
    pub start: Timestamp,
    pub expected_end: Timestamp,
    /// Clearing price per GPU-hour paid to the provider.
    pub price: Micros,
    pub state: LeaseState,
}

impl Lease {
    pub fn gpu_count(&self) -> u32 {
        self.gpu_mask.count_ones()
    }
    /// Total milli-GPU held.
    pub fn gpu_milli_total(&self) -> u32 {
        self.gpu_count() * u32::from(self.gpu_milli)
    }
}

#[cfg(test)]
mod tests {
    use super::LeaseState;

    #[test]
    fn every_state_parses_back_from_its_name() {
        for state in LeaseState::ALL {
            assert_eq!(LeaseState::parse(state.as_str()), Some(*state));
            assert_eq!(state.to_string(), state.as_str());
        }
        assert_eq!(LeaseState::ALL.len(), 8);
        assert_eq!(LeaseState::parse("Running"), None);
    }
}
