//! A provider's host as the market sees it: where it is, what it has, what it asks.

use crate::catalog::GpuModel;
use crate::ids::{NodeId, ProviderId};
use crate::policy::ProviderPolicy;
use crate::topology::TopologyPath;

/// The most GPUs one node may hold (HGX-2 boards have 16).
pub const GPUS_PER_NODE_MAX: usize = 16;
/// A whole GPU in milli-GPU.
pub const GPU_MILLI_WHOLE: u16 = 1000;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub provider: ProviderId,
    pub path: TopologyPath,
    pub gpu_model: GpuModel,
    pub gpu_count: u8,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// Bandwidth for staging datasets the node does not hold.
    pub network_mbit_s: u32,
    /// Content hashes of the datasets in the node's cache, sorted.
    pub datasets: Vec<u64>,
    /// Reliability in parts per million (0.999 = 999,000).
    pub reliability_ppm: u32,
    pub policy: ProviderPolicy,
    /// Declared simulated devices: never sold as real capacity.
    pub simulated: bool,
    /// The runtimes its agent can run replicas in.
    pub runtimes: crate::RuntimeSet,
}

impl Node {
    pub fn holds_dataset(&self, content_hash: u64) -> bool {
        self.datasets.binary_search(&content_hash).is_ok()
    }
}

/// What is free on a node now: CPU, memory, and each GPU's free share in milli-GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCapacity {
    pub cpu_milli_free: u32,
    pub memory_mib_free: u64,
    /// One entry per GPU: 1000 = the whole GPU is free, 0 = fully used.
    pub gpu_milli_free: Vec<u16>,
}

impl NodeCapacity {
    /// GPUs with nothing on them.
    pub fn whole_gpus_free(&self) -> usize {
        self.gpu_milli_free
            .iter()
            .filter(|milli| **milli == GPU_MILLI_WHOLE)
            .count()
    }
}
