//! Explanations and quotes. An unplaced job learns, per constraint, how many nodes it lost and
//! why, in words and numbers, the way Nomad's AllocMetric does; a quote says what a job would
//! clear at now and how many GPUs could take it.

use std::fmt::Write;

use model::{GpuCatalog, GpuDemand, GpuModel, JobId, JobSpec, Micros, NodeId, Timestamp, TopologyLevel};

use crate::fit::{JobContext, Reason, model_name};
use crate::state::Matcher;

/// How many of the fleet's region names an explanation lists when a job names a region no
/// node is in.
const REGIONS_LISTED_MAX: usize = 5;

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
    /// Of those, the nodes that already hold every dataset the job names (staged ahead, or
    /// left by an earlier job): where it starts without fetching. All of them for a job that
    /// names none.
    pub nodes_holding_data: u64,
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

/// What one domain of a topology level is called in a sentence: "no NVLink domain holds …",
/// "no set of nodes holds …". Takes the level's API name ([`model::TopologyLevel::name`]).
pub(crate) fn domain_words(level: &str) -> &'static str {
    match level {
        "node" => "node",
        "nvlink" => "NVLink domain",
        "fabric" => "fabric",
        "site" => "site",
        "region" => "region",
        "any" => "set of nodes",
        _ => "domain",
    }
}

/// `["a", "b", "c"]` → `a, b or c`.
fn either(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// `1, "region"` → `1 region`; `2, "region"` → `2 regions`.
fn count_of(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{} {noun}s", thousands(count as u64))
    }
}

/// A model's catalog name, or a placeholder for an index the catalog does not have (a job
/// built by hand, not through the API's conversion).
fn model_words(model: GpuModel) -> String {
    if model.index() < GpuCatalog::embedded().len() {
        model_name(model.0).to_string()
    } else {
        format!("model #{} (not in the catalog)", model.0)
    }
}

/// The regions a job asked for, as the explanation names them.
struct RegionWords<'a> {
    /// Every region with a name: the fleet's name, or the job's for a region no node is in.
    named: Vec<&'a str>,
    /// Of those, the ones no node is in.
    empty_named: Vec<&'a str>,
    /// Regions no node is in that nobody named (the caller gave no names).
    empty_unnamed: usize,
}

impl Matcher {
    /// Why a job can or cannot run now: every node checked, each counted once under the first
    /// constraint it fails. O(nodes): for people and tests, not the placement hot path.
    ///
    /// A region the job names that no node is in has no name in the fleet's topology (the
    /// job carries an id the topology never gave out); [`Matcher::explain_naming`] takes the
    /// job's own names for its regions.
    pub fn explain(&self, job: &JobSpec, now: Timestamp) -> Explanation {
        self.explain_naming(job, now, &[] as &[&str])
    }

    /// As [`Matcher::explain`], with the names the job gave its regions: `region_names[i]`
    /// names `job.regions[i]` (the request's `regions`, in order).
    pub fn explain_naming(&self, job: &JobSpec, now: Timestamp, region_names: &[impl AsRef<str>]) -> Explanation {
        // What the placement refuses outright, the explanation says as such (and the node
        // checks below may assume a well-formed job: a share of 0 would divide by zero).
        if let Err(invalid) = self.validate(job) {
            return Explanation {
                job: job.id,
                nodes_total: self.nodes.len() as u64,
                nodes_feasible: 0,
                excluded: Vec::new(),
                best_domain_replicas: None,
                message: format!(
                    "none of {} nodes can take it: {invalid}",
                    thousands(self.nodes.len() as u64)
                ),
            };
        }
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
        let regions = self.region_words(job, region_names);
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
                    self.describe(*reason, job, &regions)
                );
            }
        }
        if let Some(best) = best_domain_replicas
            && best < job.replicas
        {
            let _ = write!(
                message,
                "; no {} holds all {} replicas (the best holds {})",
                domain_words(job.topology.name()),
                thousands(u64::from(job.replicas)),
                thousands(u64::from(best))
            );
            if job.topology == TopologyLevel::Nvlink {
                self.note_nvlink_too_small(&mut message, job);
            }
        }
        if counts[Reason::Region as usize] > 0 {
            self.note_empty_regions(&mut message, &regions);
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

    /// Says when no NVLink domain of the fleet could hold the gang even empty. A domain is a
    /// fixed piece of hardware (an NVL72 rack joins 72 GPUs), so such a job waits for a smaller
    /// gang, not for GPUs to free up. Counts every node of a domain, online or not.
    fn note_nvlink_too_small(&self, message: &mut String, job: &JobSpec) {
        let GpuDemand::Whole { count } = job.resources.gpu else {
            return;
        };
        let needed = u64::from(job.replicas) * u64::from(count);
        // (GPUs, nodes) per domain, by the domains' dense ids.
        let mut per_domain = vec![(0u64, 0usize); self.topology.nvlink_domains.len()];
        for statics in &self.statics {
            if let Some((gpus, nodes)) = per_domain.get_mut(statics.nvlink as usize) {
                *gpus += u64::from(statics.gpu_count);
                *nodes += 1;
            }
        }
        let Some(&(gpus, nodes)) = per_domain.iter().max() else {
            return;
        };
        if gpus >= needed {
            return;
        }
        let _ = write!(
            message,
            "; {} replicas of {} need {} GPUs in one NVLink domain, and the largest has {} (on {})",
            thousands(u64::from(job.replicas)),
            count_of(usize::from(count), "GPU"),
            thousands(needed),
            thousands(gpus),
            count_of(nodes, "node")
        );
    }

    /// Names the job's regions: the fleet's name for a region with nodes, the job's own for
    /// one without (if the caller gave it).
    fn region_words<'a>(&'a self, job: &JobSpec, region_names: &'a [impl AsRef<str>]) -> RegionWords<'a> {
        let mut words = RegionWords {
            named: Vec::with_capacity(job.regions.len()),
            empty_named: Vec::new(),
            empty_unnamed: 0,
        };
        for (position, region) in job.regions.iter().enumerate() {
            match self.topology.region(*region) {
                Some(known) => words.named.push(known.name.as_str()),
                None => match region_names.get(position) {
                    Some(name) => {
                        words.named.push(name.as_ref());
                        words.empty_named.push(name.as_ref());
                    }
                    None => words.empty_unnamed += 1,
                },
            }
        }
        words
    }

    /// Says which regions the job asked for have no node, and where the nodes are: most
    /// often a typo or the wrong fleet.
    fn note_empty_regions(&self, message: &mut String, regions: &RegionWords) {
        let unnamed = match (regions.empty_unnamed, regions.named.is_empty()) {
            (0, _) => None,
            (1, true) => Some("it".to_string()),
            (_, true) => Some("them".to_string()),
            (1, false) => Some("the other region asked for".to_string()),
            (count, false) => Some(format!("the {} asked for", count_of(count, "other region"))),
        };
        let mut empty: Vec<&str> = regions.empty_named.clone();
        empty.extend(unnamed.as_deref());
        if empty.is_empty() {
            return;
        }
        let _ = write!(message, "; no node is in {}", either(&empty));
        let listed: Vec<&str> = self
            .topology
            .regions
            .iter()
            .take(REGIONS_LISTED_MAX)
            .map(|region| region.name.as_str())
            .collect();
        if !listed.is_empty() {
            let _ = write!(message, " (nodes are in {}", listed.join(", "));
            let more = self.topology.regions.len() - listed.len();
            if more > 0 {
                let _ = write!(message, " and {} more", count_of(more, "region"));
            }
            message.push(')');
        }
    }

    fn describe(&self, reason: Reason, job: &JobSpec, regions: &RegionWords) -> String {
        let resources = &job.resources;
        match reason {
            Reason::Offline => "offline".into(),
            Reason::Region => match (regions.named.as_slice(), regions.empty_unnamed) {
                ([], 1) => "outside the region asked for".into(),
                ([], count) => format!("outside the {} asked for", count_of(count, "region")),
                (named, 0) => format!("outside region {}", either(named)),
                (named, count) => format!(
                    "outside region {} or {} no node is in",
                    either(named),
                    if count == 1 {
                        "a region".into()
                    } else {
                        count_of(count, "region")
                    }
                ),
            },
            Reason::GpuModel => match resources.gpu {
                GpuDemand::ComputeUnits { cu_milli } => {
                    format!(
                        "unable to reach {}.{:03} H100-equivalents on one node",
                        cu_milli / 1000,
                        cu_milli % 1000
                    )
                }
                _ if !resources.gpu_models.is_empty() => {
                    let names: Vec<String> = resources.gpu_models.iter().map(|model| model_words(*model)).collect();
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    format!("not {}", either(&names))
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
            Reason::Avoided => "where a replica of the gang could not start".into(),
            Reason::OutsideReservation => "outside the job's reservation".into(),
            Reason::NotListed => "outside the nodes the job is limited to".into(),
        }
    }

    /// What the job would pay per GPU-hour now and how many GPUs could take it.
    pub fn quote(&self, job: &JobSpec, now: Timestamp) -> Quote {
        self.quote_naming(job, now, &[] as &[&str])
    }

    /// The `count` nodes a job of this shape would most likely get, best first: those that can
    /// take a replica now, in the order the auction ranks them (its score, then the node), each
    /// with whether it already holds every dataset the job names. For staging data ahead of a
    /// job (`fallow dataset warm`).
    pub fn likely_nodes(&self, job: &JobSpec, now: Timestamp, count: usize) -> Vec<(NodeId, bool)> {
        let context = JobContext::new(job, now);
        let mut fits: Vec<(u64, usize)> = (0..self.nodes.len())
            .filter_map(|node| {
                let fit = self.fit_on(node, &self.loads[node], &context).ok()?;
                Some((fit.score, node))
            })
            .collect();
        fits.sort_unstable();
        fits.truncate(count);
        fits.into_iter()
            .map(|(_, node)| {
                let holds = job
                    .datasets
                    .iter()
                    .all(|dataset| self.nodes[node].holds_dataset(dataset.content_hash));
                (self.nodes[node].id, holds)
            })
            .collect()
    }

    /// As [`Matcher::quote`], with the names the job gave its regions for the explanation (see
    /// [`Matcher::explain_naming`]).
    pub fn quote_naming(&self, job: &JobSpec, now: Timestamp, region_names: &[impl AsRef<str>]) -> Quote {
        let context = JobContext::new(job, now);
        let mut gpus_available = 0u64;
        let mut nodes_feasible = 0u64;
        let mut nodes_holding_data = 0u64;
        for node in 0..self.nodes.len() {
            let load = &self.loads[node];
            if self.fit_on(node, load, &context).is_ok() {
                nodes_feasible += 1;
                if job
                    .datasets
                    .iter()
                    .all(|dataset| self.nodes[node].holds_dataset(dataset.content_hash))
                {
                    nodes_holding_data += 1;
                }
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
                nodes_holding_data,
                explanation: None,
            },
            Err(_) => Quote {
                job: job.id,
                price_per_gpu_hour: None,
                gpus_available,
                nodes_feasible,
                nodes_holding_data,
                explanation: Some(self.explain_naming(job, now, region_names)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use model::{
        GpuCatalog, GpuDemand, JobId, JobSpec, Micros, Node, NodeId, ProviderId, ProviderPolicy, Tier, Topology,
        TopologyLevel,
    };

    use crate::{Matcher, MatcherConfig};

    const NOW: i64 = 1_800_000_000;

    /// An NVL72 rack (18 GB200 nodes of 4 GPUs in one NVLink domain) and a rack of 2 such
    /// nodes beside it, in the same fabric.
    fn racks() -> Matcher {
        let mut topology = Topology::default();
        let region = topology.add_region("eu-west");
        let site = topology.add_site("ams1", region, 52.37, 4.9);
        let fabric = topology.add_fabric("ams1/ib0", site);
        let rack_1 = topology.add_nvlink_domain(fabric, 72);
        let rack_2 = topology.add_nvlink_domain(fabric, 8);
        let model = GpuCatalog::embedded().find("GB200").expect("GB200 is in the catalog");
        let nodes = (0..20)
            .map(|index| Node {
                id: NodeId(index),
                name: format!("gb200-{index}"),
                provider: ProviderId(1),
                path: topology.path(if index < 18 { rack_1 } else { rack_2 }),
                gpu_model: model,
                gpu_count: 4,
                cpu_milli: 128_000,
                memory_mib: 1 << 20,
                network_mbit_s: 10_000,
                datasets: Vec::new(),
                reliability_ppm: 990_000,
                policy: ProviderPolicy::flat(Micros::parse_dollars("4.00").expect("an ask")),
                simulated: false,
                runtimes: model::RuntimeSet::ALL,
            })
            .collect();
        Matcher::new(topology, nodes, MatcherConfig::default())
    }

    fn gang(replicas: u32, gpus: u8) -> JobSpec {
        let mut job = JobSpec::new(
            JobId(1),
            Tier::Silver,
            GpuDemand::Whole { count: gpus },
            Micros::parse_dollars("10.00").expect("a price"),
        );
        job.replicas = replicas;
        job.topology = TopologyLevel::Nvlink;
        job
    }

    #[test]
    fn a_gang_larger_than_every_nvlink_domain_is_told_the_largest() {
        let mut m = racks();
        assert!(m.plan(&gang(18, 4), NOW).is_ok(), "the rack takes 18 replicas of 4");
        assert_eq!(
            m.explain(&gang(19, 4), NOW).message,
            "20 of 20 nodes; no NVLink domain holds all 19 replicas (the best holds 18); 19 replicas of 4 GPUs \
             need 76 GPUs in one NVLink domain, and the largest has 72 (on 18 nodes)"
        );
        assert!(
            m.explain(&gang(10, 8), NOW).message.ends_with(
                "; 10 replicas of 8 GPUs need 80 GPUs in one NVLink domain, and the largest has 72 (on 18 nodes)"
            ),
            "no node holds a replica of 8, and no domain 80 GPUs"
        );
        // A domain large enough but short of nodes on line now: the words stop at what is free.
        m.set_node_offline(NodeId(0), true);
        assert_eq!(
            m.explain(&gang(18, 4), NOW).message,
            "19 of 20 nodes: 1 offline; no NVLink domain holds all 18 replicas (the best holds 17)"
        );
    }
}
