//! The "typical pods" distribution FGD measures fragmentation against, and the fragmentation of one node under it.
//!
//! As in the FGD simulator (`GetTypicalPods`, `NodeGpuShareFragAmount`): pod shapes are counted over the pod
//! list, the most popular ones are kept until they cover 95 % of the pods, and their shares are renormalised.
//! A node's fragmentation is the expected milli-GPU that a typical pod could not use: all the node's free GPU
//! when the pod does not fit at all (or needs no GPU), the GPUs too small for it when it does fit.

use std::collections::HashMap;

use super::cluster::PodDemand;

/// The shares of the popular pod shapes, grouped by GPU shape so that a node's GPUs are scanned once per group.
#[derive(Clone, Debug)]
pub struct TypicalPods {
    /// Total share of typical pods that need no GPU: for them every free GPU is fragment.
    cpu_only_share: f64,
    classes: Vec<GpuClass>,
}

#[derive(Clone, Debug)]
struct GpuClass {
    gpu_milli: u16,
    gpu_count: u8,
    model_mask: Option<u64>,
    share: f64,
    /// (cpu_milli, memory_mib, share) of each typical pod of this GPU shape.
    members: Vec<(u32, u64, f64)>,
}

/// The share of the pod list that the typical pods cover (the simulator's default popularity threshold).
pub const POPULARITY_THRESHOLD: f64 = 0.95;

impl TypicalPods {
    /// `with_memory`: whether memory is part of a pod's shape (FGD leaves it out; Fallow's policy keeps it).
    /// `gpu_weight`: a whole-GPU pod counts `1 + gpu_count × gpu_weight` times (the simulator's `gpuResWeight`;
    /// 0 for FGD), so that rare but large pods weigh by the GPUs they need.
    pub fn from_pods(pods: &[PodDemand], with_memory: bool, gpu_weight: f64, threshold: f64) -> TypicalPods {
        let mut counts: HashMap<(u32, u64, u16, u8, Option<u64>), f64> = HashMap::new();
        for pod in pods {
            let memory = if with_memory { pod.memory_mib } else { 0 };
            let weight = if pod.gpu_count > 0 && !pod.is_gpu_share() {
                1.0 + f64::from(pod.gpu_count) * gpu_weight
            } else {
                1.0
            };
            *counts
                .entry((pod.cpu_milli, memory, pod.gpu_milli, pod.gpu_count, pod.model_mask))
                .or_default() += weight;
        }
        let mut shapes: Vec<_> = counts.into_iter().collect();
        // Most popular first; among equals the "larger" shape first, as the simulator's reverse sort does.
        shapes.sort_by(|(a, count_a), (b, count_b)| {
            count_b
                .total_cmp(count_a)
                .then(b.0.cmp(&a.0))
                .then(b.2.cmp(&a.2))
                .then(b.3.cmp(&a.3))
                .then(b.4.cmp(&a.4))
                .then(b.1.cmp(&a.1))
        });
        let total: f64 = shapes.iter().map(|(_, count)| count).sum();
        let mut covered = 0.0;
        let mut kept = 0;
        while covered < threshold * total && kept < shapes.len() {
            covered += shapes[kept].1;
            kept += 1;
        }
        let mut typical = TypicalPods {
            cpu_only_share: 0.0,
            classes: Vec::new(),
        };
        for &((cpu_milli, memory_mib, gpu_milli, gpu_count, model_mask), count) in &shapes[..kept] {
            let share = count / covered;
            if gpu_count == 0 {
                typical.cpu_only_share += share;
                continue;
            }
            let class = match typical.classes.iter().position(|class| {
                (class.gpu_milli, class.gpu_count, class.model_mask) == (gpu_milli, gpu_count, model_mask)
            }) {
                Some(index) => &mut typical.classes[index],
                None => {
                    typical.classes.push(GpuClass {
                        gpu_milli,
                        gpu_count,
                        model_mask,
                        share: 0.0,
                        members: Vec::new(),
                    });
                    typical.classes.last_mut().expect("just pushed")
                }
            };
            class.share += share;
            class.members.push((cpu_milli, memory_mib, share));
        }
        typical
    }

    /// Number of GPU shapes (for tests and reports).
    pub fn gpu_shapes(&self) -> usize {
        self.classes.len()
    }

    /// Expected fragment (milli-GPU) of a node with these free resources. `memory_mib_free` = `u64::MAX`
    /// ignores memory, as FGD does.
    pub fn frag_milli(&self, cpu_milli_free: u32, memory_mib_free: u64, gpus: &[u16], model_bit: u64) -> f64 {
        let total: u32 = gpus.iter().map(|&free| u32::from(free)).sum();
        if total == 0 {
            return 0.0;
        }
        let total = f64::from(total);
        let mut frag = self.cpu_only_share * total;
        for class in &self.classes {
            if class.model_mask.is_some_and(|mask| mask & model_bit == 0) {
                frag += class.share * total;
                continue;
            }
            let mut fitting = 0u8;
            let mut small = 0u32;
            for &free in gpus {
                if free >= class.gpu_milli {
                    fitting += 1;
                } else {
                    small += u32::from(free);
                }
            }
            if fitting < class.gpu_count {
                frag += class.share * total;
                continue;
            }
            let small = f64::from(small);
            for &(cpu_milli, memory_mib, share) in &class.members {
                if cpu_milli_free >= cpu_milli && memory_mib_free >= memory_mib {
                    frag += share * small;
                } else {
                    frag += share * total;
                }
            }
        }
        frag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu_milli: u32, gpu_count: u8, gpu_milli: u16) -> PodDemand {
        PodDemand {
            cpu_milli,
            memory_mib: 0,
            gpu_count,
            gpu_milli,
            model_mask: None,
        }
    }

    #[test]
    fn fragment_follows_the_fgd_definition() {
        // Half the pods take 500 milli-GPU with 4 CPUs, half take a whole GPU with 4 CPUs.
        let pods = [pod(4000, 1, 500), pod(4000, 1, 1000)];
        let typical = TypicalPods::from_pods(&pods, false, 0.0, 1.0);
        // One free GPU and 300 left on another: the 300 is fragment for both shapes.
        assert_eq!(typical.frag_milli(8000, u64::MAX, &[1000, 300], 1), 300.0);
        // No CPU left: everything is fragment.
        assert_eq!(typical.frag_milli(0, u64::MAX, &[1000, 300], 1), 1300.0);
        // 600 and 300: the 500-pod fits (fragment 300), the whole-GPU pod does not (fragment 900).
        assert_eq!(
            typical.frag_milli(8000, u64::MAX, &[600, 300], 1),
            0.5 * 300.0 + 0.5 * 900.0
        );
    }
}
