//! Fallow's vocabulary: ids, the GPU catalog, topology, resources, provider policies, jobs,
//! leases and money. Pure data and arithmetic: no IO, no clocks, no randomness.

pub mod catalog;
pub mod hash;
pub mod ids;
pub mod job;
pub mod lease;
pub mod money;
pub mod node;
pub mod policy;
pub mod time;
pub mod topology;

pub use catalog::{GpuCatalog, GpuModel, GpuSpec};
pub use ids::{FabricId, JobId, LeaseId, NodeId, NvlinkDomainId, ProviderId, RegionId, SiteId, TenantId};
pub use job::{
    ClientLocation, Dataset, GpuDemand, JobSpec, ReplicaResources, Runtime, RuntimeSet, Tier, TopologyLevel,
    WorkloadClass,
};
pub use lease::{Lease, LeaseState};
pub use money::Micros;
pub use node::{GPU_MILLI_WHOLE, GPUS_PER_NODE_MAX, Node, NodeCapacity};
pub use policy::{AvailabilityWindow, ClassSet, PriceRule, ProviderPolicy, TierSet, daily_window};
pub use time::Timestamp;
pub use topology::{Topology, TopologyPath};
