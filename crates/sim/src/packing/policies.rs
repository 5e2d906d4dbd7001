//! The placement policies: FGD and the paper's baselines, scored as the FGD simulator scores them, and Fallow's.
//!
//! The baselines follow hkust-adsl/kubernetes-scheduler-simulator: each gives every feasible node an integer
//! score (0–100), the highest wins, and ties go to the smallest node name. The simulator prefixes node names
//! with a seeded random permutation (`%04d-`) and its vendored `selectHost` keeps the lexicographically smallest
//! name among equal scores, so ties follow a fixed random node order per seed: `node_rank` here. GPU choice inside the node follows the simulator's `gpuSelMethod`:
//! FGD picks the GPU its own score prefers, Random a random fitting GPU, the others the tightest fitting GPU;
//! whole-GPU pods take the first free GPUs by index.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use super::cluster::{Cluster, MILLI_PER_GPU, NodeState, Placement, PodDemand, affinity_tag};
use super::fallow_policy::{self, FallowModel, FallowScore};
use super::typical::TypicalPods;

/// The normalisers the simulator's BestFit and DotProd use (`MaxSpecCpu`, `MaxSpecGpu`).
const MAX_SPEC_CPU_MILLI: f64 = 128_000.0;
const MAX_SPEC_GPU_MILLI: f64 = 8_000.0;
const MAX_NODE_SCORE: i64 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyName {
    Fallow,
    Fgd,
    BestFit,
    DotProd,
    Packing,
    Clustering,
    Random,
}

impl PolicyName {
    pub const ALL: [PolicyName; 7] = [
        PolicyName::Fallow,
        PolicyName::Fgd,
        PolicyName::BestFit,
        PolicyName::DotProd,
        PolicyName::Packing,
        PolicyName::Clustering,
        PolicyName::Random,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Fallow => "fallow",
            PolicyName::Fgd => "fgd",
            PolicyName::BestFit => "bestfit",
            PolicyName::DotProd => "dotprod",
            PolicyName::Packing => "packing",
            PolicyName::Clustering => "clustering",
            PolicyName::Random => "random",
        }
    }

    /// Parses one name, or `all`.
    pub fn parse_list(text: &str) -> Result<Vec<PolicyName>, String> {
        if text == "all" {
            return Ok(PolicyName::ALL.to_vec());
        }
        PolicyName::ALL
            .iter()
            .copied()
            .find(|policy| policy.as_str() == text)
            .map(|policy| vec![policy])
            .ok_or_else(|| {
                let names: Vec<_> = PolicyName::ALL.iter().map(|policy| policy.as_str()).collect();
                format!("unknown policy `{text}`; expected one of {}, or all", names.join(", "))
            })
    }
}

/// Shared, read-only inputs of the policies, computed once from the pod list.
pub struct PolicyInputs {
    pub fgd_typical: TypicalPods,
    pub fallow_model: FallowModel,
}

/// A policy with its per-run caches.
pub struct Policy<'a> {
    name: PolicyName,
    inputs: &'a PolicyInputs,
    /// Fragment of each node as it is now (FGD's and Fallow's own measure), refreshed when a node changes.
    frag_now: Vec<f64>,
}

/// Keeps the highest integer score seen; among equal scores the node with the smallest rank.
struct RankTieBreak {
    best: Option<(i64, u32, Placement)>,
}

impl RankTieBreak {
    fn offer(&mut self, score: i64, rank: u32, placement: Placement) {
        let better = match self.best {
            None => true,
            Some((best_score, best_rank, _)) => score > best_score || (score == best_score && rank < best_rank),
        };
        if better {
            self.best = Some((score, rank, placement));
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The tightest GPU that fits a GPU-share pod (first index among equals).
fn tightest_gpu(node: &NodeState, pod: &PodDemand) -> Option<u8> {
    let mut best: Option<(u16, usize)> = None;
    for (index, &free) in node.gpus().iter().enumerate() {
        if free >= pod.gpu_milli && best.is_none_or(|(best_free, _)| free < best_free) {
            best = Some((free, index));
        }
    }
    best.map(|(_, index)| 1u8 << index)
}

/// GPU choice for policies that use the simulator's default "best" GPU selection.
fn best_fit_gpus(node: &NodeState, pod: &PodDemand) -> u8 {
    if pod.gpu_count == 0 {
        0
    } else if pod.is_gpu_share() {
        tightest_gpu(node, pod).expect("feasible node has a fitting GPU")
    } else {
        node.first_whole_gpus(pod.gpu_count)
            .expect("feasible node has enough whole GPUs")
    }
}

impl<'a> Policy<'a> {
    pub fn new(name: PolicyName, inputs: &'a PolicyInputs, cluster: &Cluster) -> Policy<'a> {
        let mut policy = Policy {
            name,
            inputs,
            frag_now: vec![0.0; cluster.nodes.len()],
        };
        for index in 0..cluster.nodes.len() {
            policy.node_changed(cluster, index);
        }
        policy
    }

    pub fn name(&self) -> PolicyName {
        self.name
    }

    /// Refreshes caches after a node's state changed.
    pub fn node_changed(&mut self, cluster: &Cluster, index: usize) {
        let node = &cluster.nodes[index];
        self.frag_now[index] = match self.name {
            PolicyName::Fgd => self.fgd_frag(node.cpu_milli_free, node.gpus(), node.model_bit),
            PolicyName::Fallow => self.inputs.fallow_model.node_frag(node),
            _ => 0.0,
        };
    }

    fn fgd_frag(&self, cpu_milli_free: u32, gpus: &[u16], model_bit: u64) -> f64 {
        self.inputs
            .fgd_typical
            .frag_milli(cpu_milli_free, u64::MAX, gpus, model_bit)
    }

    /// Chooses a node and GPUs for the pod, or `None` when it fits nowhere. `node_rank` orders nodes for the
    /// baselines' ties; `rng` drives the Random policy.
    pub fn choose(
        &self,
        cluster: &Cluster,
        pod: &PodDemand,
        node_rank: &[u32],
        rng: &mut ChaCha8Rng,
    ) -> Option<Placement> {
        match self.name {
            PolicyName::Fallow => return self.choose_fallow(cluster, pod),
            PolicyName::Random => return choose_random(cluster, pod, rng),
            _ => {}
        }
        let mut tie_break = RankTieBreak { best: None };
        for (index, node) in cluster.nodes.iter().enumerate() {
            if !node.fits(pod) {
                continue;
            }
            let node_index = index as u32;
            let (score, gpu_mask) = match self.name {
                PolicyName::Fgd => self.fgd_score(node, pod, self.frag_now[index]),
                PolicyName::BestFit => (best_fit_score(node, pod), best_fit_gpus(node, pod)),
                PolicyName::DotProd => (dot_product_score(node, pod), best_fit_gpus(node, pod)),
                PolicyName::Packing => (gpu_packing_score(node, pod), best_fit_gpus(node, pod)),
                PolicyName::Clustering => (gpu_clustering_score(node, pod), best_fit_gpus(node, pod)),
                PolicyName::Random | PolicyName::Fallow => unreachable!("handled above"),
            };
            tie_break.offer(
                score,
                node_rank[index],
                Placement {
                    node: node_index,
                    gpu_mask,
                },
            );
        }
        tie_break.best.map(|(_, _, placement)| placement)
    }

    /// FGD's score: `sigmoid(fragment decrease / 1000) × 100`, truncated to an integer as the simulator does.
    fn fgd_score(&self, node: &NodeState, pod: &PodDemand, frag_before: f64) -> (i64, u8) {
        let cpu_milli_free = node.cpu_milli_free - pod.cpu_milli;
        let to_score = |frag_after: f64| (sigmoid((frag_before - frag_after) / 1000.0) * MAX_NODE_SCORE as f64) as i64;
        if pod.is_gpu_share() {
            let mut best: Option<(i64, u8)> = None;
            let gpus = node.gpus();
            for (index, &free) in gpus.iter().enumerate() {
                if free < pod.gpu_milli || gpus[..index].contains(&free) {
                    continue;
                }
                let mut after = node.gpu_milli_free;
                after[index] -= pod.gpu_milli;
                let score = to_score(self.fgd_frag(cpu_milli_free, &after[..gpus.len()], node.model_bit));
                if best.is_none_or(|(best_score, _)| score > best_score) {
                    best = Some((score, 1 << index));
                }
            }
            best.expect("feasible node has a fitting GPU")
        } else {
            let gpu_mask = if pod.gpu_count == 0 {
                0
            } else {
                node.first_whole_gpus(pod.gpu_count)
                    .expect("feasible node has enough whole GPUs")
            };
            let mut after = node.gpu_milli_free;
            for (index, free) in after.iter_mut().enumerate() {
                if gpu_mask & (1 << index) != 0 {
                    *free -= pod.gpu_milli;
                }
            }
            let frag_after = self.fgd_frag(cpu_milli_free, &after[..node.gpus().len()], node.model_bit);
            (to_score(frag_after), gpu_mask)
        }
    }

    fn choose_fallow(&self, cluster: &Cluster, pod: &PodDemand) -> Option<Placement> {
        let model = &self.inputs.fallow_model;
        let mut best: Option<(FallowScore, Placement)> = None;
        for (index, node) in cluster.nodes.iter().enumerate() {
            let view = fallow_policy::NodeView {
                index: index as u32,
                state: node,
                frag_now: self.frag_now[index],
            };
            if let Some((score, gpu_mask)) = fallow_policy::score(&view, pod, model)
                && best.as_ref().is_none_or(|(best_score, _)| score < *best_score)
            {
                best = Some((
                    score,
                    Placement {
                        node: index as u32,
                        gpu_mask,
                    },
                ));
            }
        }
        best.map(|(_, placement)| placement)
    }
}

/// BestFit: `Σ weight × (free − request) / max_spec` over CPU and GPU, lower is better, turned into 0–100.
fn best_fit_score(node: &NodeState, pod: &PodDemand) -> i64 {
    let cpu_left = f64::from(node.cpu_milli_free - pod.cpu_milli) / MAX_SPEC_CPU_MILLI;
    let gpu_left = (f64::from(node.gpu_milli_free_total()) - pod.gpu_milli_total() as f64) / MAX_SPEC_GPU_MILLI;
    let score = 0.5 * cpu_left + 0.5 * gpu_left;
    ((1.0 - score) * MAX_NODE_SCORE as f64) as i64
}

/// DotProd (Tetris) with the simulator's "merge" GPU dimension and "max" normalisation: a smaller dot product of
/// free and requested resources scores higher.
fn dot_product_score(node: &NodeState, pod: &PodDemand) -> i64 {
    let node_vector = [
        f64::from(node.cpu_milli_free) / MAX_SPEC_CPU_MILLI,
        f64::from(node.gpu_milli_free_total()) / MAX_SPEC_GPU_MILLI,
    ];
    let pod_vector = [
        f64::from(pod.cpu_milli) / MAX_SPEC_CPU_MILLI,
        pod.gpu_milli_total() as f64 / MAX_SPEC_GPU_MILLI,
    ];
    let dot = (node_vector[0] * pod_vector[0] + node_vector[1] * pod_vector[1]) / 2.0;
    ((1.0 - dot) * MAX_NODE_SCORE as f64) as i64
}

/// GPU packing: shared GPUs first, then free GPUs on used nodes, then empty nodes.
fn gpu_packing_score(node: &NodeState, pod: &PodDemand) -> i64 {
    if pod.gpu_count == 0 {
        return 0;
    }
    let whole_free = node.whole_gpus_free();
    if whole_free == usize::from(node.gpu_count) {
        let score = MAX_NODE_SCORE / 3 - whole_free as i64;
        return score.max(whole_free as i64);
    }
    let mut order: Vec<usize> = (0..usize::from(node.gpu_count)).collect();
    order.sort_by_key(|&gpu| node.gpu_milli_free[gpu]);
    let mut needed = pod.gpu_count;
    let mut whole_used = 0i64;
    let mut free_ratio_on_used = 0i64;
    for gpu in order {
        if needed == 0 {
            break;
        }
        let free = node.gpu_milli_free[gpu];
        if pod.gpu_milli <= free {
            needed -= 1;
            if u32::from(free) == MILLI_PER_GPU {
                whole_used += 1;
            }
            free_ratio_on_used += i64::from(free) * 100 / i64::from(MILLI_PER_GPU);
        }
    }
    if whole_used > 0 {
        (MAX_NODE_SCORE / 2 - whole_used).max(MAX_NODE_SCORE / 3)
    } else {
        (MAX_NODE_SCORE - free_ratio_on_used / 10).max(MAX_NODE_SCORE / 2)
    }
}

/// GPU clustering: prefer nodes whose GPU pods all have this pod's GPU shape, then mixed ones that include it,
/// then idle nodes, then others; within a band, fuller nodes first.
fn gpu_clustering_score(node: &NodeState, pod: &PodDemand) -> i64 {
    let Some(tag) = affinity_tag(pod) else {
        return 0;
    };
    let fullness = MAX_NODE_SCORE / 4 * (MAX_SPEC_GPU_MILLI as i64 - i64::from(node.gpu_milli_free_total()))
        / MAX_SPEC_GPU_MILLI as i64;
    let tags_present = node.affinity_pods.iter().filter(|&&count| count > 0).count();
    let band = if node.affinity_pods[tag] > 0 {
        if tags_present == 1 { 3 } else { 2 }
    } else if tags_present == 0 {
        1
    } else {
        0
    };
    fullness + MAX_NODE_SCORE * band / 4
}

/// Random: a node drawn uniformly among the feasible ones (the simulator's RandomScore), then a random GPU.
fn choose_random(cluster: &Cluster, pod: &PodDemand, rng: &mut ChaCha8Rng) -> Option<Placement> {
    let mut chosen = None;
    let mut feasible = 0u32;
    for (index, node) in cluster.nodes.iter().enumerate() {
        if node.fits(pod) {
            feasible += 1;
            if rng.random_range(0..feasible) == 0 {
                chosen = Some(index);
            }
        }
    }
    let index = chosen?;
    Some(Placement {
        node: index as u32,
        gpu_mask: random_fit_gpus(&cluster.nodes[index], pod, rng),
    })
}

/// Random GPU choice among those that fit (the simulator's "random" GPU selection).
fn random_fit_gpus(node: &NodeState, pod: &PodDemand, rng: &mut ChaCha8Rng) -> u8 {
    if pod.gpu_count == 0 {
        return 0;
    }
    if !pod.is_gpu_share() {
        return node
            .first_whole_gpus(pod.gpu_count)
            .expect("feasible node has enough whole GPUs");
    }
    let mut chosen = 0u8;
    let mut fitting = 0u32;
    for (index, &free) in node.gpus().iter().enumerate() {
        if free >= pod.gpu_milli {
            fitting += 1;
            if rng.random_range(0..fitting) == 0 {
                chosen = 1 << index;
            }
        }
    }
    chosen
}
