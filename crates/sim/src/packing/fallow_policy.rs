//! Fallow's packing term: a pure score of (node, pod) against the typical-pod distribution, lower is better.
//!
//! No IO, no randomness, no clock: the same inputs give the same key, and the key ends with the node index so
//! that ties are broken the same way every time. Meant to move into the matcher crate as its packing term.

use super::cluster::{NodeState, PodDemand};
use super::typical::{POPULARITY_THRESHOLD, TypicalPods};

/// What the policy knows about the workload: the popular pod shapes, memory included.
#[derive(Clone, Debug)]
pub struct FallowModel {
    typical: TypicalPods,
}

impl FallowModel {
    /// Built from the pod list's shape distribution only (never from the sampled sequence of a run).
    pub fn from_pods(pods: &[PodDemand]) -> FallowModel {
        FallowModel {
            typical: TypicalPods::from_pods(pods, true, POPULARITY_THRESHOLD),
        }
    }

    /// Expected stranded milli-GPU of the node as it is: the caller caches it per node.
    pub fn node_frag(&self, node: &NodeState) -> f64 {
        self.typical
            .frag_milli(node.cpu_milli_free, node.memory_mib_free, node.gpus(), node.model_bit)
    }
}

/// The node as the score sees it.
pub struct NodeView<'a> {
    pub index: u32,
    pub state: &'a NodeState,
    /// `FallowModel::node_frag(state)`, cached by the caller.
    pub frag_now: f64,
}

/// Lexicographic key, lower is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FallowScore {
    /// Growth of the node's expected stranded GPU, in hundredths of a milli-GPU.
    pub frag_growth: i64,
    /// Free milli-GPU left on the node after placing (best fit).
    pub gpu_milli_free_after: u32,
    pub node_index: u32,
}

/// Scores placing `pod` on `node`; `None` when it does not fit. Returns the key and the GPUs to take (bit mask).
pub fn score(node: &NodeView<'_>, pod: &PodDemand, model: &FallowModel) -> Option<(FallowScore, u8)> {
    let state = node.state;
    if !state.fits(pod) {
        return None;
    }
    let cpu_milli_free = state.cpu_milli_free - pod.cpu_milli;
    let memory_mib_free = state.memory_mib_free - pod.memory_mib;
    let gpus = state.gpus();
    let key = |after: &[u16], gpu_mask: u8| {
        let frag_after = model
            .typical
            .frag_milli(cpu_milli_free, memory_mib_free, after, state.model_bit);
        let free_after: u32 = after.iter().map(|&free| u32::from(free)).sum();
        (
            FallowScore {
                frag_growth: ((frag_after - node.frag_now) * 100.0).round() as i64,
                gpu_milli_free_after: free_after,
                node_index: node.index,
            },
            gpu_mask,
        )
    };
    if pod.is_gpu_share() {
        let mut best: Option<(FallowScore, u8)> = None;
        for (index, &free) in gpus.iter().enumerate() {
            if free < pod.gpu_milli || gpus[..index].contains(&free) {
                continue;
            }
            let mut after = state.gpu_milli_free;
            after[index] -= pod.gpu_milli;
            let candidate = key(&after[..gpus.len()], 1 << index);
            if best.is_none_or(|(best_score, _)| candidate.0 < best_score) {
                best = Some(candidate);
            }
        }
        best
    } else {
        let gpu_mask = if pod.gpu_count == 0 {
            0
        } else {
            state.first_whole_gpus(pod.gpu_count)?
        };
        let mut after = state.gpu_milli_free;
        for (index, free) in after.iter_mut().enumerate() {
            if gpu_mask & (1 << index) != 0 {
                *free -= pod.gpu_milli;
            }
        }
        Some(key(&after[..gpus.len()], gpu_mask))
    }
}
