//! Explanations and quotes. An unplaced job learns, per constraint, how many nodes it lost and
//! why, in words and numbers, the way Nomad's AllocMetric does; a quote says what a job would
//! clear at now and how many GPUs could take it.

use std::fmt::Write;

use model::{GpuDemand, JobId, JobSpec, Micros, Timestamp};

use crate::fit::{JobContext, Reason, model_name};
use crate::state::Matcher;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub job: JobId,
    pub nodes_total: u64,
    /// Nodes that could take one replica now.
    pub nodes_feasible: u64,
    /// Nodes excluded, by the first constraint each failed, in check order; zero counts omitted.
    pub excluded: Vec<(Reason, u64)>,
    /// For gangs: the most replicas one domain of the required level could hold.
    pub best_domain_replicas: Option<u32>,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quote {
    pub job: JobId,
    /// What each GPU-hour would clear at now, if the job can be placed now.
    pub price_per_gpu_hour: Option<Micros>,
    /// GPUs on nodes that could take a replica now.
    pub gpus_available: u64,
    pub nodes_feasible: u64,
    pub explanation: Option<Explanation>,
}

/// `125000` → `125,000`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

impl Matcher {
    /// Why a job can or cannot run now: every node checked, each counted once under the first
    /// constraint it fails. O(nodes): for people and tests, not the placement hot path.
    pub fn explain(&self, job: &JobSpec, now: Timestamp) -> Explanation {
        let context = JobContext::new(job, now);
        let mut counts = [0u64; Reason::ALL.len()];
        let mut feasible = 0u64;
        let mut per_domain: Vec<(u64, u32)> = Vec::new();
        for node in 0..self.nodes.len() {
            match self.fit_on(node, &self.loads[node], &context) {
                Ok(_) => {
                    feasible += 1;
                    if job.replicas > 1 {
                        let capacity = self.replica_capacity(node, &self.loads[node], &context, job.replicas);
                        per_domain.push((self.domain_of(node, job.topology), capacity));
                    }
                }
                Err(reason) => counts[reason as usize] += 1,
            }
        }
        let best_domain_replicas = (job.replicas > 1).then(|| {
            per_domain.sort_unstable();
            per_domain
                .chunk_by(|a, b| a.0 == b.0)
                .map(|group| group.iter().fold(0u32, |sum, (_, held)| sum.saturating_add(*held)))
                .max()
                .unwrap_or(0)
        });
        let excluded: Vec<(Reason, u64)> = Reason::ALL
            .iter()
            .map(|reason| (*reason, counts[*reason as usize]))
            .filter(|(_, count)| *count > 0)
            .collect();
        let mut message = format!(
            "{} of {} nodes",
            thousands(feasible),
            thousands(self.nodes.len() as u64)
        );
        if !excluded.is_empty() {
            message.push(':');
            for (position, (reason, count)) in excluded.iter().enumerate() {
                let separator = if position == 0 { " " } else { ", " };
                let _ = write!(
                    message,
                    "{separator}{} {}",
                    thousands(*count),
                    self.describe(*reason, job)
                );
            }
        }
        if let Some(best) = best_domain_replicas
            && best < job.replicas
        {
            let _ = write!(
                message,
                "; no {} holds all {} replicas (the best holds {})",
                job.topology.name(),
                thousands(u64::from(job.replicas)),
                thousands(u64::from(best))
            );
        }
        Explanation {
            job: job.id,
            nodes_total: self.nodes.len() as u64,
            nodes_feasible: feasible,
            excluded,
            best_domain_replicas,
            message,
        }
    }

    fn describe(&self, reason: Reason, job: &JobSpec) -> String {
        let resources = &job.resources;
        match reason {
            Reason::Offline => "offline".into(),
            Reason::Region => {
                let names: Vec<&str> = job
                    .regions
                    .iter()
                    .map(|region| self.topology.region_name(*region))
                    .collect();
                format!("outside region {}", names.join(" or "))
            }
            Reason::GpuModel => match resources.gpu {
                GpuDemand::ComputeUnits { cu_milli } => {
                    format!(
                        "unable to reach {}.{:03} H100-equivalents on one node",
                        cu_milli / 1000,
                        cu_milli % 1000
                    )
                }
                _ if !resources.gpu_models.is_empty() => {
                    let names: Vec<&str> = resources.gpu_models.iter().map(|model| model_name(model.0)).collect();
                    format!("not {}", names.join(" or "))
                }
                _ => "without GPUs".into(),
            },
            Reason::GpuMemory => format!("with less than {} GiB GPU memory", resources.gpu_memory_mib_min / 1024),
            Reason::TierNotAllowed => format!("not selling {}", job.tier),
            Reason::ClassNotAllowed => format!("not accepting {} work", job.class.name()),
            Reason::Reliability => {
                format!(
                    "below reliability {}.{:03}",
                    job.reliability_min_ppm / 1_000_000,
                    job.reliability_min_ppm % 1_000_000 / 1000
                )
            }
            Reason::Price => format!("ask above {}/h", job.max_price),
            Reason::Window => format!("closed now or not open for {} h", job.max_runtime_s.div_ceil(3600)),
            Reason::Cpu => "short of CPU".into(),
            Reason::Memory => "short of memory".into(),
            Reason::GpuCapacity => match resources.gpu {
                GpuDemand::Share { milli } => format!("without a {milli} milli-GPU share free"),
                GpuDemand::Whole { count } => format!("without {count} free GPUs"),
                _ => "without enough free GPUs".into(),
            },
            Reason::Reserved => "reserved for other jobs".into(),
            Reason::OverLimit => "over its owner's thermal or power limit".into(),
            Reason::Runtime => match job.runtime {
                Some(runtime) => format!("does not run {} jobs", runtime.name()),
                None => "runtime".into(),
            },
        }
    }

    /// What the job would pay per GPU-hour now and how many GPUs could take it.
    pub fn quote(&self, job: &JobSpec, now: Timestamp) -> Quote {
        let context = JobContext::new(job, now);
        let mut gpus_available = 0u64;
        let mut nodes_feasible = 0u64;
        for node in 0..self.nodes.len() {
            let load = &self.loads[node];
            if self.fit_on(node, load, &context).is_ok() {
                nodes_feasible += 1;
                let statics = &self.statics[node];
                gpus_available += match job.resources.gpu {
                    GpuDemand::Share { milli } => load.gpu_used_milli[..statics.gpu_count as usize]
                        .iter()
                        .filter(|used| 1000 - **used >= milli)
                        .count() as u64,
                    _ => {
                        let wanted = u64::from(context.whole_gpus(statics).unwrap_or(1).max(1));
                        u64::from(load.whole_free) / wanted * wanted
                    }
                };
            }
        }
        match self.plan(job, now) {
            Ok(placement) => Quote {
                job: job.id,
                price_per_gpu_hour: Some(placement.clearing_price()),
                gpus_available,
                nodes_feasible,
                explanation: None,
            },
            Err(_) => Quote {
                job: job.id,
                price_per_gpu_hour: None,
                gpus_available,
                nodes_feasible,
                explanation: Some(self.explain(job, now)),
            },
        }
    }
}
