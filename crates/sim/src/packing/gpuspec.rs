//! The FGD paper's "gpuspec" variants, derived in memory from a pod list: a seeded share of the GPU pods
//! is constrained to named GPU models (`gpu_spec`), drawn as the published `gpuspec` pod lists draw them.
//!
//! How a constrained pod's models are drawn (docs/simulator.md, "GPU-type constraints", says why):
//! - exactly `round(share × GPU pods)` pods are chosen, by a seeded shuffle of the GPU pods in list order;
//! - a GPU-share pod takes a spec from `SHARE_SPECS`, a whole-GPU pod from `WHOLE_SPECS`, with those weights,
//!   among the specs that name a model with a node big enough for the pod (an 8-GPU pod never gets `T4`);
//! - if none is left (another cluster), one model that can host the pod, drawn by its GPU count.
//!
//! The weights are the counts of each spec string in a 438-pod sample of the authors' published
//! `openb_pod_list_gpuspec33_cpu0.csv` (148 constrained pods); the spec strings are theirs.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cluster::MILLI_PER_GPU;
use super::trace::{NodeRecord, PodRecord};

/// Spec strings of constrained GPU-share pods, with their counts in the sample.
pub const SHARE_SPECS: [(&str, u32); 3] = [("T4", 34), ("P100", 17), ("G2|P100|T4|V100M16|V100M32", 2)];

/// Spec strings of constrained whole-GPU pods (one GPU or more), with their counts in the sample.
pub const WHOLE_SPECS: [(&str, u32); 9] = [
    ("T4", 38),
    ("V100M16|V100M32", 20),
    ("G2", 17),
    ("P100|V100M16|V100M32", 10),
    ("G3", 3),
    ("A10|G2|T4|V100M16|V100M32", 3),
    ("P100|T4|V100M16|V100M32", 2),
    ("G2|P100|T4|V100M16|V100M32", 1),
    ("V100M32", 1),
];

/// The shares the paper evaluates, in per cent of GPU pods.
pub const PAPER_SHARES_PCT: [u32; 4] = [10, 20, 25, 33];

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GpuSpecError {
    #[error("the GPU-spec share must be between 0 and 100 per cent, got {share_pct}")]
    ShareOutOfRange { share_pct: f64 },
    #[error(
        "{pods} pods of the pod list already name GPU models; derive the variant from a list without gpu_spec \
         (e.g. openb_pod_list_default.csv)"
    )]
    AlreadyConstrained { pods: usize },
}

/// What the derivation did, for reports and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSpecVariant {
    pub pods: Vec<PodRecord>,
    pub gpu_pods: usize,
    pub constrained_pods: usize,
}

/// Derives the variant: the same pods in the same order, `share_pct` % of the GPU pods with a `gpu_spec`.
/// The same pod list, node list, share and seed give the same variant.
pub fn derive(
    pods: &[PodRecord],
    nodes: &[NodeRecord],
    share_pct: f64,
    seed: u64,
) -> Result<GpuSpecVariant, GpuSpecError> {
    if !(0.0..=100.0).contains(&share_pct) {
        return Err(GpuSpecError::ShareOutOfRange { share_pct });
    }
    let already = pods.iter().filter(|pod| !pod.gpu_spec.is_empty()).count();
    if already > 0 {
        return Err(GpuSpecError::AlreadyConstrained { pods: already });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut gpu_pods: Vec<usize> = (0..pods.len()).filter(|&index| pods[index].gpu_count > 0).collect();
    let constrained = (share_pct / 100.0 * gpu_pods.len() as f64).round() as usize;
    // Partial Fisher–Yates: the first `constrained` entries are a uniform sample without replacement.
    for position in 0..constrained {
        let other = rng.random_range(position..gpu_pods.len());
        gpu_pods.swap(position, other);
    }
    let mut variant = pods.to_vec();
    for &index in &gpu_pods[..constrained] {
        variant[index].gpu_spec = draw_spec(&pods[index], nodes, &mut rng);
    }
    Ok(GpuSpecVariant {
        gpu_pods: gpu_pods.len(),
        constrained_pods: constrained,
        pods: variant,
    })
}

/// Whether some node of the list has one of `models` and at least the pod's GPU count.
fn hostable(pod: &PodRecord, nodes: &[NodeRecord], models: &[&str]) -> bool {
    nodes
        .iter()
        .any(|node| node.gpu_count >= pod.gpu_count && models.contains(&node.model.as_str()))
}

fn draw_spec(pod: &PodRecord, nodes: &[NodeRecord], rng: &mut ChaCha8Rng) -> Vec<String> {
    let table: &[(&str, u32)] = if pod.gpu_count == 1 && u32::from(pod.gpu_milli) < MILLI_PER_GPU {
        &SHARE_SPECS
    } else {
        &WHOLE_SPECS
    };
    let eligible: Vec<(Vec<&str>, u32)> = table
        .iter()
        .map(|&(spec, weight)| (spec.split('|').collect::<Vec<_>>(), weight))
        .filter(|(models, _)| hostable(pod, nodes, models))
        .collect();
    if let Some(models) = weighted(&eligible, rng) {
        return models.iter().map(|model| model.to_string()).collect();
    }
    // No published spec fits this cluster: one model that can host the pod, by its GPU count.
    let mut by_model: Vec<(Vec<&str>, u32)> = Vec::new();
    for node in nodes
        .iter()
        .filter(|node| node.gpu_count >= pod.gpu_count && !node.model.is_empty())
    {
        match by_model.iter_mut().find(|(models, _)| models[0] == node.model) {
            Some((_, gpus)) => *gpus += u32::from(node.gpu_count),
            None => by_model.push((vec![node.model.as_str()], u32::from(node.gpu_count))),
        }
    }
    by_model.sort();
    weighted(&by_model, rng)
        .map(|models| models.iter().map(|model| model.to_string()).collect())
        .unwrap_or_default()
}

/// One entry drawn with probability proportional to its weight; `None` when the list is empty.
fn weighted<'a, T>(entries: &'a [(T, u32)], rng: &mut ChaCha8Rng) -> Option<&'a T> {
    let total: u32 = entries.iter().map(|(_, weight)| weight).sum();
    if total == 0 {
        return None;
    }
    let mut ticket = rng.random_range(0..total);
    for (entry, weight) in entries {
        if ticket < *weight {
            return Some(entry);
        }
        ticket -= weight;
    }
    unreachable!("the ticket is below the total weight")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(model: &str, gpu_count: u8) -> NodeRecord {
        NodeRecord {
            name: format!("{model}-{gpu_count}"),
            cpu_milli: 64_000,
            memory_mib: 262_144,
            gpu_count,
            model: model.to_string(),
        }
    }

    fn pod(gpu_count: u8, gpu_milli: u16) -> PodRecord {
        PodRecord {
            cpu_milli: 4000,
            memory_mib: 8192,
            gpu_count,
            gpu_milli,
            gpu_spec: vec![],
        }
    }

    #[test]
    fn an_eight_gpu_pod_only_gets_models_with_eight_gpu_nodes() {
        let nodes = [node("G2", 8), node("T4", 2), node("P100", 2)];
        let pods: Vec<PodRecord> = (0..200).map(|_| pod(8, 1000)).collect();
        let variant = derive(&pods, &nodes, 100.0, 3).expect("valid");
        assert_eq!(variant.constrained_pods, 200);
        for pod in &variant.pods {
            assert!(pod.gpu_spec.iter().any(|model| model == "G2"), "{:?}", pod.gpu_spec);
        }
    }

    #[test]
    fn a_cluster_without_the_published_models_falls_back_to_its_own() {
        let nodes = [node("H100", 8)];
        let variant = derive(&[pod(1, 500), pod(2, 1000)], &nodes, 100.0, 1).expect("valid");
        assert!(variant.pods.iter().all(|pod| pod.gpu_spec == vec!["H100".to_string()]));
    }

    #[test]
    fn bad_inputs_are_refused() {
        let nodes = [node("G2", 8)];
        assert_eq!(
            derive(&[pod(1, 1000)], &nodes, 120.0, 1),
            Err(GpuSpecError::ShareOutOfRange { share_pct: 120.0 })
        );
        let mut constrained = pod(1, 1000);
        constrained.gpu_spec = vec!["G2".to_string()];
        assert_eq!(
            derive(&[constrained], &nodes, 10.0, 1),
            Err(GpuSpecError::AlreadyConstrained { pods: 1 })
        );
    }
}
