//! The binding of one replica of a job to GPUs of one node, fenced by an epoch.

use crate::ids::{JobId, LeaseId, NodeId};
use crate::money::Micros;
use crate::time::Timestamp;

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
