//! The simulated cluster: per-node free CPU, memory and milli-GPU per GPU, and the one way to place a pod.

use super::trace::{NodeRecord, PodRecord};

pub const GPUS_PER_NODE_MAX: usize = 8;
pub const MILLI_PER_GPU: u32 = 1000;

/// A pod's demand in the form the policies read: GPU models as a bit mask over the cluster's model table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PodDemand {
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu_count: u8,
    pub gpu_milli: u16,
    /// `None` = any model; `Some(mask)` = only nodes whose model bit is in `mask` (may be 0: fits nowhere).
    pub model_mask: Option<u64>,
}

impl PodDemand {
    pub fn gpu_milli_total(&self) -> u64 {
        u64::from(self.gpu_count) * u64::from(self.gpu_milli)
    }

    /// One GPU, part of it: the pod shares a GPU with others.
    pub fn is_gpu_share(&self) -> bool {
        self.gpu_count == 1 && u32::from(self.gpu_milli) < MILLI_PER_GPU
    }

    pub fn accepts_model(&self, model_bit: u64) -> bool {
        self.model_mask.is_none_or(|mask| mask & model_bit != 0)
    }
}

/// Node-side GPU-affinity tags, as the GPU-clustering baseline counts them.
pub const AFFINITY_TAGS: usize = 6;

/// The tag a GPU pod carries for GPU clustering: 0 share, 1/2/3/4 = 1/2/4/8 whole GPUs, 5 other counts.
pub fn affinity_tag(pod: &PodDemand) -> Option<usize> {
    if pod.gpu_count == 0 {
        None
    } else if pod.is_gpu_share() {
        Some(0)
    } else {
        Some(match pod.gpu_count {
            1 => 1,
            2 => 2,
            4 => 3,
            8 => 4,
            _ => 5,
        })
    }
}

/// What is left on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub cpu_milli_free: u32,
    pub memory_mib_free: u64,
    /// Free milli-GPU of each GPU; only the first `gpu_count` entries are real.
    pub gpu_milli_free: [u16; GPUS_PER_NODE_MAX],
    pub gpu_count: u8,
    /// This node's bit in the model table (0 for a CPU-only node).
    pub model_bit: u64,
    /// Number of GPU pods per affinity tag placed here (for the GPU-clustering baseline).
    pub affinity_pods: [u16; AFFINITY_TAGS],
}

impl NodeState {
    pub fn gpus(&self) -> &[u16] {
        &self.gpu_milli_free[..usize::from(self.gpu_count)]
    }

    pub fn gpu_milli_free_total(&self) -> u32 {
        self.gpus().iter().map(|&free| u32::from(free)).sum()
    }

    pub fn whole_gpus_free(&self) -> usize {
        self.gpus()
            .iter()
            .filter(|&&free| u32::from(free) == MILLI_PER_GPU)
            .count()
    }

    /// CPU, memory, model and GPU all fit (some GPU choice exists).
    pub fn fits(&self, pod: &PodDemand) -> bool {
        if self.cpu_milli_free < pod.cpu_milli || self.memory_mib_free < pod.memory_mib {
            return false;
        }
        if pod.gpu_count == 0 {
            return true;
        }
        if !pod.accepts_model(self.model_bit) {
            return false;
        }
        if pod.is_gpu_share() {
            self.gpus().iter().any(|&free| free >= pod.gpu_milli)
        } else {
            self.whole_gpus_free() >= usize::from(pod.gpu_count)
        }
    }

    /// The first `gpu_count` wholly free GPUs, by index (how every policy places a whole-GPU pod).
    pub fn first_whole_gpus(&self, gpu_count: u8) -> Option<u8> {
        let mut mask = 0u8;
        let mut needed = gpu_count;
        for (index, &free) in self.gpus().iter().enumerate() {
            if needed == 0 {
                break;
            }
            if u32::from(free) == MILLI_PER_GPU {
                mask |= 1 << index;
                needed -= 1;
            }
        }
        (needed == 0).then_some(mask)
    }
}

/// Where a pod goes: a node and the GPUs it takes there (bit i = GPU i).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub node: u32,
    pub gpu_mask: u8,
}

/// The whole cluster, nodes in the node list's order.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub nodes: Vec<NodeState>,
    pub capacity: Vec<NodeState>,
    pub gpu_milli_capacity: u64,
    pub gpu_milli_used: u64,
}

/// GPU model names, each with one bit, so a pod's `gpu_spec` is a mask.
#[derive(Clone, Debug, Default)]
pub struct ModelTable {
    names: Vec<String>,
}

impl ModelTable {
    pub fn from_nodes(nodes: &[NodeRecord]) -> ModelTable {
        let mut names: Vec<String> = nodes
            .iter()
            .filter(|node| !node.model.is_empty())
            .map(|node| node.model.clone())
            .collect();
        names.sort();
        names.dedup();
        assert!(names.len() <= 64, "at most 64 GPU models are supported");
        ModelTable { names }
    }

    pub fn bit(&self, model: &str) -> u64 {
        self.names
            .iter()
            .position(|name| name == model)
            .map_or(0, |index| 1 << index)
    }

    pub fn demand(&self, pod: &PodRecord) -> PodDemand {
        let model_mask = if pod.gpu_spec.is_empty() {
            None
        } else {
            Some(pod.gpu_spec.iter().fold(0, |mask, model| mask | self.bit(model)))
        };
        PodDemand {
            cpu_milli: pod.cpu_milli,
            memory_mib: pod.memory_mib,
            gpu_count: pod.gpu_count,
            gpu_milli: pod.gpu_milli,
            model_mask,
        }
    }
}

impl Cluster {
    pub fn new(nodes: &[NodeRecord], models: &ModelTable) -> Cluster {
        let states: Vec<NodeState> = nodes
            .iter()
            .map(|node| {
                let mut gpu_milli_free = [0u16; GPUS_PER_NODE_MAX];
                for free in gpu_milli_free.iter_mut().take(usize::from(node.gpu_count)) {
                    *free = MILLI_PER_GPU as u16;
                }
                NodeState {
                    cpu_milli_free: node.cpu_milli,
                    memory_mib_free: node.memory_mib,
                    gpu_milli_free,
                    gpu_count: node.gpu_count,
                    model_bit: models.bit(&node.model),
                    affinity_pods: [0; AFFINITY_TAGS],
                }
            })
            .collect();
        let gpu_milli_capacity = states.iter().map(|node| u64::from(node.gpu_milli_free_total())).sum();
        Cluster {
            capacity: states.clone(),
            nodes: states,
            gpu_milli_capacity,
            gpu_milli_used: 0,
        }
    }

    /// Applies a placement; panics if it does not fit, since a policy must only return feasible placements.
    pub fn place(&mut self, pod: &PodDemand, placement: Placement) {
        let node = &mut self.nodes[placement.node as usize];
        assert!(node.fits(pod), "policy returned a node that does not fit");
        assert!(
            placement.gpu_mask.count_ones() == u32::from(pod.gpu_count),
            "placement takes {} GPUs, the pod asks for {}",
            placement.gpu_mask.count_ones(),
            pod.gpu_count
        );
        node.cpu_milli_free -= pod.cpu_milli;
        node.memory_mib_free -= pod.memory_mib;
        for gpu in 0..usize::from(node.gpu_count) {
            if placement.gpu_mask & (1 << gpu) != 0 {
                let free = &mut node.gpu_milli_free[gpu];
                assert!(*free >= pod.gpu_milli, "GPU {gpu} over-committed");
                *free -= pod.gpu_milli;
            }
        }
        assert!(
            u32::from(placement.gpu_mask) >> node.gpu_count == 0,
            "placement names a GPU the node does not have"
        );
        if let Some(tag) = affinity_tag(pod) {
            node.affinity_pods[tag] += 1;
        }
        self.gpu_milli_used += pod.gpu_milli_total();
    }

    /// Recomputes the used-GPU counter from scratch and checks every node against its capacity.
    pub fn consistency_check(&self) {
        let mut used = 0u64;
        for (node, capacity) in self.nodes.iter().zip(&self.capacity) {
            assert!(node.cpu_milli_free <= capacity.cpu_milli_free);
            assert!(node.memory_mib_free <= capacity.memory_mib_free);
            assert_eq!(node.gpu_count, capacity.gpu_count);
            for (free, total) in node.gpus().iter().zip(capacity.gpus()) {
                assert!(free <= total);
            }
            used += u64::from(capacity.gpu_milli_free_total() - node.gpu_milli_free_total());
        }
        assert_eq!(used, self.gpu_milli_used);
    }
}
