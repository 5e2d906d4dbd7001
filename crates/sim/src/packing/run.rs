//! The FGD paper's packing protocol: inflate the pod list to `tune` × cluster GPU capacity, place pods one by one,
//! and read the unallocated GPU share when the arrived GPU requests reach 100 % (and 130 %) of capacity.
//!
//! Workload per seed, as the simulator's `Simulate` + `TunePodsByNodeTotalResource` build it: the pod list once,
//! shuffled, then pods drawn with replacement from the list and appended while the total GPU request stays within
//! `tune` × capacity (the simulator's stop test compares the per-GPU milli of the drawn pod, kept here); when the
//! list alone exceeds the target, random pods are removed instead. No pod departs; a pod that fits nowhere is
//! dropped. The figure at level L % is the mean, over the steps whose arrived share rounds to L, of
//! 100 − allocated %, as the authors' `merge_alloc_discrete` script reads it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::cluster::{Cluster, ModelTable, PodDemand};
use super::fallow_policy::FallowModel;
use super::policies::{Policy, PolicyInputs, PolicyName};
use super::trace::{NodeRecord, PodRecord};
use super::typical::{POPULARITY_THRESHOLD, TypicalPods};

#[derive(Clone, Debug)]
pub struct PackingConfig {
    pub seeds: Vec<u64>,
    /// Total GPU request of the workload, as a multiple of the cluster's GPU capacity (the paper uses 1.3).
    pub tune: f64,
    pub policies: Vec<PolicyName>,
    /// Worker threads; 0 = as many as the machine has.
    pub threads: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SeedReport {
    pub seed: u64,
    pub unallocated_gpu_pct_at_100: f64,
    pub unallocated_gpu_pct_at_130: Option<f64>,
    pub fragmented_gpu_pct_at_100: f64,
    pub pods_arrived: usize,
    pub pods_dropped: usize,
    #[serde(skip)]
    pub choose_seconds: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PolicyReport {
    pub policy: &'static str,
    pub unallocated_gpu_pct_at_100: f64,
    pub std: f64,
    pub unallocated_gpu_pct_at_130: Option<f64>,
    pub fragmented_gpu_pct_at_100: f64,
    pub us_per_pod: f64,
    pub per_seed: Vec<SeedReport>,
}

/// One seed's workload: the pod sequence (indices into the pod list) and the node order for ties.
pub struct Workload {
    pub sequence: Vec<usize>,
    /// `node_rank[i]`: position of node i in the seed's random node order (the simulator's name prefixes).
    pub node_rank: Vec<u32>,
}

/// The workload of one seed.
pub fn workload(pods: &[PodDemand], node_count: usize, gpu_milli_capacity: u64, tune: f64, seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut sequence: Vec<usize> = (0..pods.len()).collect();
    for index in (1..sequence.len()).rev() {
        let other = rng.random_range(0..=index);
        sequence.swap(index, other);
    }
    let target = tune * gpu_milli_capacity as f64;
    let mut total: u64 = pods.iter().map(PodDemand::gpu_milli_total).sum();
    if (total as f64) < target {
        loop {
            let drawn = rng.random_range(0..pods.len());
            if (total + u64::from(pods[drawn].gpu_milli)) as f64 > target {
                break;
            }
            total += pods[drawn].gpu_milli_total();
            sequence.push(drawn);
        }
    } else {
        while total as f64 > target && !sequence.is_empty() {
            let removed = sequence.remove(rng.random_range(0..sequence.len()));
            total -= pods[removed].gpu_milli_total();
        }
    }
    let mut node_rank: Vec<u32> = (0..node_count as u32).collect();
    for index in (1..node_rank.len()).rev() {
        let other = rng.random_range(0..=index);
        node_rank.swap(index, other);
    }
    Workload { sequence, node_rank }
}

/// Mean of the samples at `level`, or within ±1 of it when none is (the authors' fallback).
fn mean_at(samples: &[(i64, f64)], level: i64) -> Option<f64> {
    let exact: Vec<f64> = samples
        .iter()
        .filter(|(at, _)| *at == level)
        .map(|&(_, value)| value)
        .collect();
    let chosen = if exact.is_empty() {
        samples
            .iter()
            .filter(|(at, _)| (at - level).abs() <= 1)
            .map(|&(_, value)| value)
            .collect()
    } else {
        exact
    };
    (!chosen.is_empty()).then(|| chosen.iter().sum::<f64>() / chosen.len() as f64)
}

/// Runs one policy on one seed's sequence.
pub fn run_one(
    nodes: &[NodeRecord],
    models: &ModelTable,
    pods: &[PodDemand],
    workload: &Workload,
    policy_name: PolicyName,
    inputs: &PolicyInputs,
    seed: u64,
) -> SeedReport {
    let mut cluster = Cluster::new(nodes, models);
    let mut policy = Policy::new(policy_name, inputs, &cluster);
    // Tie-breaking randomness of this policy, independent of the workload's.
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (policy_name as u64 + 1));
    let capacity = cluster.gpu_milli_capacity as f64;
    let mut arrived_gpu_milli = 0u64;
    let mut unallocated_samples = Vec::new();
    let mut fragmented_samples = Vec::new();
    let mut dropped = 0;
    let mut choose_seconds = 0.0;
    for &pod_index in &workload.sequence {
        let pod = &pods[pod_index];
        let started = Instant::now();
        let placement = policy.choose(&cluster, pod, &workload.node_rank, &mut rng);
        choose_seconds += started.elapsed().as_secs_f64();
        match placement {
            Some(placement) => {
                cluster.place(pod, placement);
                policy.node_changed(&cluster, placement.node as usize);
            }
            None => dropped += 1,
        }
        if cfg!(debug_assertions) {
            cluster.consistency_check();
        }
        arrived_gpu_milli += pod.gpu_milli_total();
        let level = (arrived_gpu_milli as f64 * 100.0 / capacity).round_ties_even() as i64;
        let unallocated = 100.0 - cluster.gpu_milli_used as f64 * 100.0 / capacity;
        if (99..=101).contains(&level) || (129..=131).contains(&level) {
            unallocated_samples.push((level, unallocated));
        }
        if level == 100 {
            let fragmented: f64 = cluster
                .nodes
                .iter()
                .map(|node| {
                    inputs
                        .fgd_typical
                        .frag_milli(node.cpu_milli_free, u64::MAX, node.gpus(), node.model_bit)
                })
                .sum();
            fragmented_samples.push((level, fragmented * 100.0 / capacity));
        }
    }
    cluster.consistency_check();
    SeedReport {
        seed,
        unallocated_gpu_pct_at_100: mean_at(&unallocated_samples, 100).unwrap_or(f64::NAN),
        unallocated_gpu_pct_at_130: mean_at(&unallocated_samples, 130),
        fragmented_gpu_pct_at_100: mean_at(&fragmented_samples, 100).unwrap_or(f64::NAN),
        pods_arrived: workload.sequence.len(),
        pods_dropped: dropped,
        choose_seconds,
    }
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// Sample standard deviation (n − 1), 0 for a single value.
fn std_dev(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let average = mean(values);
    let squares: f64 = values.iter().map(|value| (value - average).powi(2)).sum();
    (squares / (values.len() - 1) as f64).sqrt()
}

/// Runs every (policy, seed) pair; all policies of a seed see the same sequence. Deterministic for any thread count.
pub fn run_packing(nodes: &[NodeRecord], pod_list: &[PodRecord], config: &PackingConfig) -> Vec<PolicyReport> {
    let models = ModelTable::from_nodes(nodes);
    let pods: Vec<PodDemand> = pod_list.iter().map(|pod| models.demand(pod)).collect();
    let empty = Cluster::new(nodes, &models);
    let inputs = PolicyInputs {
        fgd_typical: TypicalPods::from_pods(&pods, false, 0.0, POPULARITY_THRESHOLD),
        fallow_model: FallowModel::from_pods(&pods, &empty.capacity),
    };
    let capacity = empty.gpu_milli_capacity;
    let workloads: Vec<Workload> = config
        .seeds
        .iter()
        .map(|&seed| workload(&pods, nodes.len(), capacity, config.tune, seed))
        .collect();
    let jobs: Vec<(usize, usize)> = (0..config.policies.len())
        .flat_map(|policy| (0..config.seeds.len()).map(move |seed| (policy, seed)))
        .collect();
    let results: Mutex<Vec<Option<SeedReport>>> = Mutex::new(vec![None; jobs.len()]);
    let next_job = AtomicUsize::new(0);
    let threads = if config.threads == 0 {
        std::thread::available_parallelism().map_or(1, |count| count.get())
    } else {
        config.threads
    }
    .clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let job = next_job.fetch_add(1, Ordering::Relaxed);
                    let Some(&(policy, seed)) = jobs.get(job) else {
                        break;
                    };
                    let report = run_one(
                        nodes,
                        &models,
                        &pods,
                        &workloads[seed],
                        config.policies[policy],
                        &inputs,
                        config.seeds[seed],
                    );
                    results.lock().expect("no worker panicked")[job] = Some(report);
                }
            });
        }
    });
    let mut results = results.into_inner().expect("no worker panicked").into_iter();
    config
        .policies
        .iter()
        .map(|&policy| {
            let per_seed: Vec<SeedReport> = (0..config.seeds.len())
                .map(|_| results.next().flatten().expect("every job ran"))
                .collect();
            let at_100: Vec<f64> = per_seed.iter().map(|seed| seed.unallocated_gpu_pct_at_100).collect();
            let at_130: Option<Vec<f64>> = per_seed.iter().map(|seed| seed.unallocated_gpu_pct_at_130).collect();
            let fragmented: Vec<f64> = per_seed.iter().map(|seed| seed.fragmented_gpu_pct_at_100).collect();
            let seconds: f64 = per_seed.iter().map(|seed| seed.choose_seconds).sum();
            let pods: usize = per_seed.iter().map(|seed| seed.pods_arrived).sum();
            PolicyReport {
                policy: policy.as_str(),
                unallocated_gpu_pct_at_100: mean(&at_100),
                std: std_dev(&at_100),
                unallocated_gpu_pct_at_130: at_130.map(|values| mean(&values)),
                fragmented_gpu_pct_at_100: mean(&fragmented),
                us_per_pod: seconds * 1e6 / pods.max(1) as f64,
                per_seed,
            }
        })
        .collect()
}
