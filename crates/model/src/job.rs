//! What a tenant asks for: per-replica resources, gang size, topology, tier, price cap,
//! regions, datasets, reliability floor and runtime.

use std::fmt;

use crate::catalog::GpuModel;
use crate::ids::{JobId, NodeId, RegionId, TenantId};
use crate::money::Micros;
use crate::time::Timestamp;

/// Service tier. Gold is reserved and never preempted, silver on demand, bronze interruptible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Gold = 0,
    Silver = 1,
    Bronze = 2,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Gold, Tier::Silver, Tier::Bronze];
    pub fn name(self) -> &'static str {
        match self {
            Tier::Gold => "gold",
            Tier::Silver => "silver",
            Tier::Bronze => "bronze",
        }
    }
    pub fn parse(text: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|tier| tier.name() == text)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadClass {
    Training = 0,
    Inference = 1,
    Batch = 2,
    Eval = 3,
}

impl WorkloadClass {
    pub const ALL: [WorkloadClass; 4] = [
        WorkloadClass::Training,
        WorkloadClass::Inference,
        WorkloadClass::Batch,
        WorkloadClass::Eval,
    ];
    pub fn name(self) -> &'static str {
        match self {
            WorkloadClass::Training => "training",
            WorkloadClass::Inference => "inference",
            WorkloadClass::Batch => "batch",
            WorkloadClass::Eval => "eval",
        }
    }
}

/// The tightest topology level that must hold all of a job's replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TopologyLevel {
    Node,
    Nvlink,
    Fabric,
    Site,
    Region,
    Any,
}

impl TopologyLevel {
    /// Every level, tightest first.
    pub const ALL: [TopologyLevel; 6] = [
        TopologyLevel::Node,
        TopologyLevel::Nvlink,
        TopologyLevel::Fabric,
        TopologyLevel::Site,
        TopologyLevel::Region,
        TopologyLevel::Any,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TopologyLevel::Node => "node",
            TopologyLevel::Nvlink => "nvlink",
            TopologyLevel::Fabric => "fabric",
            TopologyLevel::Site => "site",
            TopologyLevel::Region => "region",
            TopologyLevel::Any => "any",
        }
    }
}

/// The GPUs one replica needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuDemand {
    /// No GPU (a CPU-only task).
    None,
    /// Whole GPUs on one node.
    Whole { count: u8 },
    /// A share of one GPU, in thousandths (1..1000).
    Share { milli: u16 },
    /// Enough whole GPUs of one model on one node to reach this many compute units
    /// (thousandths of an H100 SXM5): the matcher picks the count per model.
    ComputeUnits { cu_milli: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReplicaResources {
    pub gpu: GpuDemand,
    /// Minimum memory per GPU.
    pub gpu_memory_mib_min: u32,
    /// Acceptable models; empty = any.
    pub gpu_models: Vec<GpuModel>,
    pub cpu_milli: u32,
    pub memory_mib: u64,
}

/// A dataset the job reads, by content hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dataset {
    pub content_hash: u64,
    pub size_bytes: u64,
}

/// Where the job's clients are, and the round-trip latency it needs to them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClientLocation {
    pub latitude: f64,
    pub longitude: f64,
    pub latency_target_ms: u32,
}

/// How a replica runs on its node: in a container (an image), or as a process of the host
/// (bare metal: the image names the program).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Runtime {
    Container = 0,
    Process = 1,
}

impl Runtime {
    pub const ALL: [Runtime; 2] = [Runtime::Container, Runtime::Process];

    pub fn name(self) -> &'static str {
        match self {
            Runtime::Container => "container",
            Runtime::Process => "process",
        }
    }

    pub fn parse(text: &str) -> Option<Runtime> {
        Runtime::ALL.into_iter().find(|runtime| runtime.name() == text)
    }
}

/// The runtimes a node can run replicas in, as a bit mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuntimeSet(pub u8);

impl RuntimeSet {
    pub const ALL: RuntimeSet = RuntimeSet(0b11);

    pub fn contains(self, runtime: Runtime) -> bool {
        self.0 & (1 << runtime as u8) != 0
    }

    pub fn of(runtimes: &[Runtime]) -> RuntimeSet {
        RuntimeSet(runtimes.iter().fold(0, |mask, runtime| mask | (1 << *runtime as u8)))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    pub id: JobId,
    pub tenant: TenantId,
    pub tier: Tier,
    pub class: WorkloadClass,
    pub replicas: u32,
    pub resources: ReplicaResources,
    pub topology: TopologyLevel,
    /// Highest price per GPU-hour the tenant pays (before the platform fee).
    pub max_price: Micros,
    /// Tolerates interruption; bronze jobs always do. A job that does not must fit in the provider's window.
    pub preemptible: bool,
    /// Allowed regions; empty = any.
    pub regions: Vec<RegionId>,
    pub datasets: Vec<Dataset>,
    pub client: Option<ClientLocation>,
    /// Minimum node reliability in parts per million.
    pub reliability_min_ppm: u32,
    pub max_runtime_s: u32,
    pub checkpoint_interval_s: u32,
    pub submitted_at: Timestamp,
    /// The runtime the job needs; `None`: whatever the node runs (its image is then a container
    /// image on a container node and a program on a process node).
    pub runtime: Option<Runtime>,
    /// Nodes this job is not placed on (a gang whose replica could not start there), sorted.
    pub avoid_nodes: Vec<NodeId>,
    /// The booking ahead this job runs inside (the matcher's id of the reservation): placed only
    /// on that reservation's nodes and within the GPUs it holds there.
    pub reservation: Option<JobId>,
    /// The only nodes this job may be placed on, sorted (a tenant's own nodes, tried first);
    /// empty: any.
    pub only_nodes: Vec<NodeId>,
}

impl JobSpec {
    /// A one-replica job with default fields, for tests and generators to adjust.
    pub fn new(id: JobId, tier: Tier, gpu: GpuDemand, max_price: Micros) -> JobSpec {
        JobSpec {
            id,
            tenant: TenantId(0),
            tier,
            class: WorkloadClass::Batch,
            replicas: 1,
            resources: ReplicaResources {
                gpu,
                gpu_memory_mib_min: 0,
                gpu_models: Vec::new(),
                cpu_milli: 0,
                memory_mib: 0,
            },
            topology: TopologyLevel::Any,
            max_price,
            preemptible: tier == Tier::Bronze,
            regions: Vec::new(),
            datasets: Vec::new(),
            client: None,
            reliability_min_ppm: 0,
            max_runtime_s: 3600,
            checkpoint_interval_s: 0,
            submitted_at: 0,
            runtime: None,
            avoid_nodes: Vec::new(),
            reservation: None,
            only_nodes: Vec::new(),
        }
    }

    /// Whether it may be interrupted: bronze always, others when they say so.
    pub fn interruptible(&self) -> bool {
        self.tier == Tier::Bronze || self.preemptible
    }
}
