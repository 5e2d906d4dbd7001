//! Admission: whether any node of the fleet could ever run a job, its load aside — the answer a
//! tenant's quote gives before submitting ("0 of 125,000 nodes …"), and what a cluster scheduler
//! checks when it refuses a job no partition can hold. A policy refuses such jobs at once
//! rather than queueing them (a FIFO queue would otherwise block behind them for good).
//!
//! Nodes are grouped by everything the check reads, so a check costs one look per group; a
//! group keeps its nodes' reliabilities sorted, so gangs count the nodes over a floor.

use std::collections::BTreeMap;

use model::{GpuCatalog, GpuDemand, JobSpec, ProviderPolicy, Timestamp, TopologyLevel};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey {
    fabric: u32,
    site: u16,
    region: u16,
    model: u16,
    gpu_count: u8,
    cpu_milli: u32,
    memory_mib: u64,
    tiers: u8,
    classes: u8,
    /// The longest stretch the node is open, in seconds (`i64::MAX` when always).
    window_max_s: i64,
}

#[derive(Clone, Debug)]
struct Group {
    key: GroupKey,
    gpu_memory_mib: u32,
    cu_milli: u32,
    /// Ascending.
    reliabilities: Vec<u32>,
}

/// The fleet's nodes, grouped for the static check.
#[derive(Clone, Debug)]
pub struct Admission {
    groups: Vec<Group>,
}

/// The longest open stretch of a set of windows, sampled minute by minute over two weeks (so
/// stretches that wrap the week count whole).
fn window_max_s(policy: &ProviderPolicy, start: Timestamp) -> i64 {
    if policy.windows.is_empty() {
        return i64::MAX;
    }
    let mut longest = 0;
    let mut minute = 0i64;
    while minute < 7 * 1440 {
        let at = start + minute * 60;
        match policy.available_until(at) {
            Some(end) => {
                longest = longest.max(end - at);
                minute += ((end - at) / 60).max(1);
            }
            None => minute += 1,
        }
    }
    longest
}

impl Admission {
    /// Groups `nodes` (a policy's view of the fleet).
    pub fn new(nodes: &[model::Node], start: Timestamp) -> Admission {
        let catalog = GpuCatalog::embedded();
        let mut windows: Vec<(Vec<model::AvailabilityWindow>, i64)> = Vec::new();
        let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
        for node in nodes {
            if node.policy.allowed_tiers.0 == 0 {
                continue;
            }
            let window = match windows.iter().find(|(set, _)| *set == node.policy.windows) {
                Some((_, longest)) => *longest,
                None => {
                    let longest = window_max_s(&node.policy, start);
                    windows.push((node.policy.windows.clone(), longest));
                    longest
                }
            };
            let key = GroupKey {
                fabric: node.path.fabric.0,
                site: node.path.site.0,
                region: node.path.region.0,
                model: node.gpu_model.0,
                gpu_count: node.gpu_count,
                cpu_milli: node.cpu_milli,
                memory_mib: node.memory_mib,
                tiers: node.policy.allowed_tiers.0,
                classes: node.policy.allowed_classes.0,
                window_max_s: window,
            };
            let spec = catalog.spec(node.gpu_model);
            groups
                .entry(key.clone())
                .or_insert_with(|| Group {
                    key,
                    gpu_memory_mib: spec.memory_mib,
                    cu_milli: spec.cu_milli,
                    reliabilities: Vec::new(),
                })
                .reliabilities
                .push(node.reliability_ppm);
        }
        let mut groups: Vec<Group> = groups.into_values().collect();
        for group in &mut groups {
            group.reliabilities.sort_unstable();
        }
        Admission { groups }
    }

    /// How many replicas one node of the group holds when empty (0 if it cannot run the job).
    fn replicas_per_node(group: &Group, job: &JobSpec) -> u32 {
        let key = &group.key;
        let resources = &job.resources;
        let tier_ok = key.tiers & (1 << job.tier as u8) != 0;
        let class_ok = key.classes & (1 << job.class as u8) != 0;
        let model_ok = resources.gpu_models.is_empty() || resources.gpu_models.iter().any(|model| model.0 == key.model);
        let region_ok = job.regions.is_empty() || job.regions.iter().any(|region| region.0 == key.region);
        let window_ok = job.interruptible() || key.window_max_s >= i64::from(job.max_runtime_s);
        if !(tier_ok && class_ok && model_ok && region_ok && window_ok)
            || group.gpu_memory_mib < resources.gpu_memory_mib_min
        {
            return 0;
        }
        let by_gpu = match resources.gpu {
            GpuDemand::None => u32::MAX,
            GpuDemand::Whole { count } => u32::from(key.gpu_count / count.max(1)),
            GpuDemand::Share { milli } => u32::from(key.gpu_count) * u32::from(1000 / milli.max(1)),
            GpuDemand::ComputeUnits { cu_milli } => {
                let count = cu_milli.div_ceil(group.cu_milli.max(1));
                if count <= u32::from(key.gpu_count) {
                    u32::from(key.gpu_count) / count.max(1)
                } else {
                    0
                }
            }
        };
        let by_cpu = key.cpu_milli.checked_div(resources.cpu_milli).unwrap_or(u32::MAX);
        let by_memory = key
            .memory_mib
            .checked_div(resources.memory_mib)
            .map_or(u32::MAX, |count| count.min(u64::from(u32::MAX)) as u32);
        by_gpu.min(by_cpu).min(by_memory)
    }

    /// Whether an empty fleet could hold the whole job.
    pub fn could_ever_run(&self, job: &JobSpec) -> bool {
        let mut per_domain: BTreeMap<u64, u64> = BTreeMap::new();
        for group in &self.groups {
            let per_node = Self::replicas_per_node(group, job);
            if per_node == 0 {
                continue;
            }
            let over_floor = group.reliabilities.len()
                - group
                    .reliabilities
                    .partition_point(|reliability| *reliability < job.reliability_min_ppm);
            if over_floor == 0 {
                continue;
            }
            let replicas = u64::from(job.replicas);
            if job.topology == TopologyLevel::Node || replicas == 1 {
                if u64::from(per_node) >= replicas {
                    return true;
                }
                continue;
            }
            let key = &group.key;
            let domain = match job.topology {
                // NVLink domains are not grouped: a fabric's count bounds them from above.
                TopologyLevel::Nvlink | TopologyLevel::Fabric => u64::from(key.fabric),
                TopologyLevel::Site => u64::from(key.site),
                TopologyLevel::Region => u64::from(key.region),
                _ => 0,
            };
            let held = per_domain.entry(domain).or_insert(0);
            *held += u64::from(per_node) * over_floor as u64;
            if *held >= replicas {
                return true;
            }
        }
        false
    }
}
