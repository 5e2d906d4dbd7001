//! The matcher's in-memory view of the fleet, rebuilt from the store: dense node ids for the
//! store's ids, the topology from the nodes' region / site / fabric / NVLink names, and the
//! live leases committed back in, so a restarted coordinator decides exactly as before.

use std::collections::{BTreeMap, HashMap};

use matcher::{Matcher, MatcherConfig, Placement};
use model::{
    GpuCatalog, JobId, Lease, LeaseId, LeaseState, Micros, Node, NodeId, ProviderId, RegionId, Tier, Topology,
};
use store::{LeaseRecord, NodeRecord};

use crate::books::reputation::Standings;

pub struct FleetView {
    pub matcher: Matcher,
    /// Store node id per dense matcher node.
    pub node_ids: Vec<i64>,
    pub dense: HashMap<i64, NodeId>,
    pub records: Vec<NodeRecord>,
    /// Matcher lease id ↔ store lease id.
    pub lease_of_store: HashMap<i64, LeaseId>,
    pub store_of_lease: HashMap<LeaseId, i64>,
    /// What the view was built from: `Store::nodes_version`.
    pub version: store::NodesVersion,
    /// Per dense node, the reliability (ppm) and gold eligibility it was built with
    /// (`reputation::Standings::for_matcher`): the leader builds again when they move.
    pub trust: Vec<(u32, bool)>,
    /// Stored live leases that did not fit their nodes when the view was built. Always a bug:
    /// their nodes are cordoned (no GPU is booked twice), and the view is built again once a
    /// lease ends.
    pub conflicts: Vec<Conflict>,
    /// Build the view again before the next decision: a write it mirrored did not happen.
    pub stale: bool,
    /// Preempted leases in their grace period, by store lease (`hold_victim`).
    pub victims: HashMap<i64, VictimHold>,
    /// Nodes whose owner reclaimed GPUs: the GPUs reclaimed, and the matcher lease that holds
    /// those of them that are free (`hold_reclaimed`).
    pub reclaims: HashMap<NodeId, (u16, Option<LeaseId>)>,
}

/// A stored live lease the rebuilt matcher could not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub job: i64,
    pub leases: Vec<i64>,
    pub node: i64,
    pub why: String,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            out,
            "job {}'s stored live leases {:?} do not fit node {}: {}",
            self.job, self.leases, self.node, self.why
        )
    }
}

/// The matcher job ids of victims' holds (`FleetView::hold_rest`): this bit and the victim's
/// store lease id, never a store job's id.
pub const HOLD_JOBS: u64 = 1 << 62;
/// The matcher job ids of owners' reclaims (`FleetView::hold_reclaimed`): this bit and the
/// store node id.
pub const RECLAIM_JOBS: u64 = 1 << 61;

/// A preempted lease in its grace period: its GPUs on its node, and the job that preempted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimHold {
    pub node: NodeId,
    pub gpu_mask: u16,
    pub gpu_milli: u16,
    pub by_job: i64,
}

/// A node's reliability moved this much (ppm) since the view was built: build it again.
pub const RELIABILITY_REBUILD_PPM: u32 = 1_000;

impl FleetView {
    /// Builds the view. Nodes whose policy does not parse are kept but offline (and logged).
    pub fn build(
        records: Vec<NodeRecord>,
        leases: &[LeaseRecord],
        standings: &Standings,
        version: store::NodesVersion,
        config: MatcherConfig,
    ) -> FleetView {
        let catalog = GpuCatalog::embedded();
        let mut topology = Topology::default();
        let mut regions: BTreeMap<String, RegionId> = BTreeMap::new();
        let mut sites = BTreeMap::new();
        let mut fabrics = BTreeMap::new();
        let mut domains = BTreeMap::new();
        let mut nodes = Vec::with_capacity(records.len());
        let mut trust = Vec::with_capacity(records.len());
        let mut broken = Vec::new();
        // The matcher places by site: a site is where its first node with coordinates (declared,
        // or the sites table's) says it is; a node without any does not put it at (0, 0).
        let mut located: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for record in &records {
            let node = &record.node;
            if node.latitude != 0.0 || node.longitude != 0.0 {
                located
                    .entry(node.site.as_str())
                    .or_insert((node.latitude, node.longitude));
            }
        }
        for (position, record) in records.iter().enumerate() {
            let node = &record.node;
            let region = *regions
                .entry(node.region.clone())
                .or_insert_with(|| topology.add_region(node.region.clone()));
            let site = *sites.entry(node.site.clone()).or_insert_with(|| {
                let (latitude, longitude) = located.get(node.site.as_str()).copied().unwrap_or_default();
                topology.add_site(node.site.clone(), region, latitude, longitude)
            });
            let fabric_name = if node.fabric.is_empty() {
                format!("{}/node-{}", node.site, record.id)
            } else {
                format!("{}/{}", node.site, node.fabric)
            };
            let fabric = *fabrics
                .entry(fabric_name.clone())
                .or_insert_with(|| topology.add_fabric(fabric_name.clone(), site));
            let domain_name = if node.nvlink_domain.is_empty() {
                format!("{fabric_name}/node-{}", record.id)
            } else {
                format!("{fabric_name}/{}", node.nvlink_domain)
            };
            let gpu_count = node.gpu_count.clamp(0, 16) as u8;
            let nvlink = *domains
                .entry(domain_name)
                .or_insert_with(|| topology.add_nvlink_domain(fabric, 0));
            // A shared domain joins every GPU of its nodes: an NVL72 rack is 18 nodes of 4,
            // not the first node's 4.
            let joined = &mut topology.nvlink_domains[nvlink.index()].gpus;
            *joined = joined.saturating_add(u32::from(gpu_count));
            let policy = serde_json::from_str::<api::PolicyDoc>(&node.policy)
                .ok()
                .and_then(|doc| doc.to_model().ok());
            if policy.is_none() {
                broken.push(position);
            }
            let (reliability_ppm, gold_eligible) = standings.for_matcher(record.id);
            trust.push((reliability_ppm, gold_eligible));
            let mut policy = policy.unwrap_or_else(|| model::ProviderPolicy::flat(Micros(i64::MAX / 4)));
            if !gold_eligible {
                // docs/trust-policy.md § 2: gold work goes only to gold-badge providers' nodes.
                policy.allowed_tiers = model::TierSet(policy.allowed_tiers.0 & !(1 << Tier::Gold as u8));
            }
            let gpu_model = catalog.find(&node.gpu_model).unwrap_or(model::GpuModel(0));
            nodes.push(Node {
                id: NodeId(position as u32),
                name: node.name.clone(),
                provider: ProviderId(node.provider_id as u32),
                path: topology.path(nvlink),
                gpu_model,
                gpu_count,
                cpu_milli: node.cpu_milli.clamp(0, i64::from(u32::MAX)) as u32,
                memory_mib: node.memory_mib.max(0) as u64,
                network_mbit_s: node.network_mbit_s.clamp(0, i64::from(u32::MAX)) as u32,
                datasets: dataset_ids(&node.datasets),
                reliability_ppm,
                policy,
                simulated: node.simulated,
                runtimes: runtime_set(&node.runtimes),
            });
        }
        let node_ids: Vec<i64> = records.iter().map(|record| record.id).collect();
        let dense: HashMap<i64, NodeId> = node_ids
            .iter()
            .enumerate()
            .map(|(position, id)| (*id, NodeId(position as u32)))
            .collect();
        let mut view = FleetView {
            matcher: Matcher::new(topology, nodes, config),
            node_ids,
            dense,
            records,
            lease_of_store: HashMap::new(),
            store_of_lease: HashMap::new(),
            version,
            trust,
            conflicts: Vec::new(),
            stale: false,
            victims: HashMap::new(),
            reclaims: HashMap::new(),
        };
        // Leases first, then take the silent and broken nodes offline: a lease on a node that
        // went silent while the coordinator was down is found by the next liveness pass.
        // A preemption's victim in its grace period is not committed as it is: the matcher
        // released it when it decided, and the GPUs its preemptor took are the preemptor's
        // (the agent starts the preemptor once the victim has stopped). The rest of its GPUs
        // stay held until it ends (`hold_rest`).
        let mut by_job: BTreeMap<i64, Vec<&LeaseRecord>> = BTreeMap::new();
        let mut victims = Vec::new();
        for lease in leases {
            if lease.preempted_by.is_some() {
                victims.push(lease);
            } else {
                by_job.entry(lease.job_id).or_default().push(lease);
            }
        }
        for (job, job_leases) in by_job {
            let tier = Tier::parse(&job_leases[0].lease.tier).unwrap_or(Tier::Silver);
            let mut planned = Vec::new();
            let mut held = Vec::new();
            for record in &job_leases {
                let Some(node) = view.dense.get(&record.lease.node_id) else {
                    view.conflicts.push(Conflict {
                        job,
                        leases: vec![record.id],
                        node: record.lease.node_id,
                        why: "the node is not in the store".into(),
                    });
                    continue;
                };
                held.push(*record);
                planned.push(Lease {
                    id: LeaseId(0),
                    job: JobId(job as u64),
                    replica: record.lease.replica as u32,
                    node: *node,
                    gpu_mask: record.lease.gpu_mask as u16,
                    gpu_milli: record.lease.gpu_milli as u16,
                    cpu_milli: record.lease.cpu_milli as u32,
                    memory_mib: record.lease.memory_mib as u64,
                    epoch: 0,
                    start: record.created_at.div_euclid(1_000_000),
                    expected_end: record.lease.expected_end.div_euclid(1_000_000),
                    price: Micros(record.lease.price_micros),
                    state: LeaseState::Running,
                });
            }
            if planned.is_empty() {
                continue;
            }
            let placement = Placement {
                job: JobId(job as u64),
                tier,
                leases: planned,
                clearing_price_per_cu_hour: None,
                preempt_at: None,
                checkpoint_interval_s: 0,
            };
            match view.matcher.commit(&placement) {
                Ok(committed) => {
                    for (lease, record) in committed.iter().zip(&held) {
                        view.lease_of_store.insert(record.id, lease.id);
                        view.store_of_lease.insert(lease.id, record.id);
                    }
                }
                Err(error) => {
                    let mut nodes: Vec<i64> = held.iter().map(|record| record.lease.node_id).collect();
                    nodes.dedup();
                    for node in nodes {
                        view.conflicts.push(Conflict {
                            job,
                            leases: held
                                .iter()
                                .filter(|record| record.lease.node_id == node)
                                .map(|record| record.id)
                                .collect(),
                            node,
                            why: error.to_string(),
                        });
                    }
                }
            }
        }
        for victim in victims {
            let (Some(node), Some(by_job)) = (view.dense.get(&victim.lease.node_id).copied(), victim.preempted_by)
            else {
                continue;
            };
            let hold = VictimHold {
                node,
                gpu_mask: victim.lease.gpu_mask as u16,
                gpu_milli: victim.lease.gpu_milli as u16,
                by_job,
            };
            if let Err(why) = view.hold_victim(victim.id, hold) {
                view.conflicts.push(Conflict {
                    job: victim.job_id,
                    leases: vec![victim.id],
                    node: victim.lease.node_id,
                    why,
                });
            }
        }
        // A lease the matcher cannot hold would let it book those GPUs again: its node takes
        // no new work until the view is built without the conflict.
        for conflict in &view.conflicts {
            tracing::error!(%conflict, "the store and the matcher disagree; the node is cordoned");
            if let Some(node) = view.dense.get(&conflict.node) {
                view.matcher.set_node_cordoned(*node, true);
            }
        }
        for (position, record) in view.records.iter().enumerate() {
            if !record.online || broken.contains(&position) {
                view.matcher.set_node_offline(NodeId(position as u32), true);
            }
            if record.over_limit_since.is_some() || record.fraud_cordoned_at.is_some() {
                view.matcher.set_node_cordoned(NodeId(position as u32), true);
            }
        }
        // What owners reclaimed: held where free now, the rest as its work ends.
        for position in 0..view.records.len() {
            let mask = view.records[position].reclaim_gpu_mask;
            if mask != 0 && !broken.contains(&position) {
                let node = NodeId(position as u32);
                view.reclaims.insert(node, (mask as u16, None));
                view.hold_reclaimed(node);
            }
        }
        if !broken.is_empty() {
            tracing::error!(count = broken.len(), "nodes with unreadable policies are kept offline");
        }
        view
    }

    /// Holds a preempted lease's GPUs until the store ends it, but those its preemptor holds:
    /// the matcher released the victim whole when it decided, and the victim runs on in its
    /// grace period. Should the preemptor's lease end first, its GPUs go back to the victim.
    pub fn hold_victim(&mut self, store_lease: i64, victim: VictimHold) -> Result<(), String> {
        self.victims.insert(store_lease, victim);
        self.rehold(store_lease)
    }

    /// Holds what a victim's preemptor does not (see `hold_victim`), in place of what was held.
    /// The hold is a lease of its own job (never preempted; GPUs only: the victim's CPU and
    /// memory went to its preemptor).
    fn rehold(&mut self, store_lease: i64) -> Result<(), String> {
        let Some(victim) = self.victims.get(&store_lease).copied() else {
            return Ok(());
        };
        if let Some(id) = self.lease_of_store.remove(&store_lease) {
            self.store_of_lease.remove(&id);
            self.matcher.release_lease(id);
        }
        let taken = self
            .matcher
            .job_leases(JobId(victim.by_job as u64))
            .iter()
            .filter(|lease| lease.node == victim.node)
            .fold(0, |mask, lease| mask | lease.gpu_mask);
        let gpu_mask = victim.gpu_mask & !taken;
        if gpu_mask == 0 {
            return Ok(());
        }
        let placement = hold(
            JobId(HOLD_JOBS | store_lease as u64),
            victim.node,
            gpu_mask,
            victim.gpu_milli,
        );
        let committed = self.matcher.commit(&placement).map_err(|error| error.to_string())?;
        self.record_lease(store_lease, committed[0].id);
        Ok(())
    }

    /// Applies an owner's reclaim of `store_node`'s GPUs (`gpu_mask`; 0: resumed) at once,
    /// before the view is built again from the store.
    pub fn set_reclaim(&mut self, store_node: i64, gpu_mask: u16) {
        let Some(node) = self.dense.get(&store_node).copied() else {
            return;
        };
        if let Some(record) = self.records.get_mut(node.index()) {
            record.reclaim_gpu_mask = i64::from(gpu_mask);
        }
        if gpu_mask == 0 {
            if let Some((_, Some(id))) = self.reclaims.remove(&node) {
                self.matcher.release_lease(id);
            }
            return;
        }
        let held = self.reclaims.get(&node).and_then(|(_, held)| *held);
        self.reclaims.insert(node, (gpu_mask, held));
        self.hold_reclaimed(node);
    }

    /// Whether the owner of `store_node` reclaimed any GPU of `gpu_mask`.
    pub fn reclaimed(&self, store_node: i64, gpu_mask: i64) -> bool {
        self.dense
            .get(&store_node)
            .and_then(|node| self.reclaims.get(node))
            .is_some_and(|(mask, _)| i64::from(*mask) & gpu_mask != 0)
    }

    /// Holds, in one matcher lease of its own job (gold: never preempted), the GPUs of `node`'s
    /// reclaim that are wholly free now, in place of what was held; GPUs still in use are held
    /// when their work ends (`release`). Nothing on a node that is off line (`set_online`).
    fn hold_reclaimed(&mut self, node: NodeId) {
        let Some((mask, held)) = self.reclaims.get(&node).copied() else {
            return;
        };
        if let Some(id) = held {
            self.matcher.release_lease(id);
            self.reclaims.insert(node, (mask, None));
        }
        if self.matcher.nodes().get(node.index()).is_none()
            || self.records.get(node.index()).is_none_or(|record| !record.online)
        {
            return;
        }
        let free = self
            .matcher
            .node_capacity(node)
            .gpu_milli_free
            .iter()
            .enumerate()
            .filter(|(_, free)| **free >= model::GPU_MILLI_WHOLE)
            .fold(0u16, |free, (gpu, _)| free | (1 << gpu));
        let gpu_mask = mask & free;
        if gpu_mask == 0 {
            return;
        }
        let job = JobId(RECLAIM_JOBS | self.node_ids[node.index()] as u64);
        let placement = hold(job, node, gpu_mask, model::GPU_MILLI_WHOLE);
        match self.matcher.commit(&placement) {
            Ok(committed) => {
                self.reclaims.insert(node, (mask, Some(committed[0].id)));
            }
            Err(error) => {
                // Free GPUs always fit; a failure is a bug, and the next view finds it.
                tracing::error!(node = self.node_ids[node.index()], %error, "reclaimed GPUs could not be held");
                self.stale = true;
            }
        }
    }

    /// Forgets a lease the store ended, freeing its capacity (a victim's hold with it). A
    /// preemptor's lease that ends before its victims' grace does gives its GPUs back to them.
    pub fn release(&mut self, store_lease: i64) -> bool {
        let was_victim = self.victims.remove(&store_lease).is_some();
        let Some(id) = self.lease_of_store.remove(&store_lease) else {
            return was_victim;
        };
        self.store_of_lease.remove(&id);
        let released = self.matcher.release_lease(id);
        if let Some(lease) = &released
            && !was_victim
        {
            let waiting: Vec<i64> = self
                .victims
                .iter()
                .filter(|(_, victim)| victim.by_job == lease.job.0 as i64 && victim.node == lease.node)
                .map(|(victim, _)| *victim)
                .collect();
            for victim in waiting {
                if let Err(error) = self.rehold(victim) {
                    // Freed GPUs always fit; a failure is a bug, and the next view finds it.
                    tracing::error!(lease = victim, %error, "a victim's GPUs could not be held again");
                    self.stale = true;
                }
            }
        }
        // GPUs an owner reclaimed are theirs once the work on them ends.
        if let Some(lease) = &released
            && self
                .reclaims
                .get(&lease.node)
                .is_some_and(|(mask, _)| mask & lease.gpu_mask != 0)
        {
            self.hold_reclaimed(lease.node);
        }
        released.is_some()
    }

    /// Applies a node going on or off line; off line frees (and forgets) its leases in the matcher.
    /// Returns the leases it freed, for gang repair.
    pub fn set_online(&mut self, store_node: i64, online: bool) -> Vec<Lease> {
        let Some(node) = self.dense.get(&store_node).copied() else {
            return Vec::new();
        };
        if let Some(record) = self.records.get_mut(node.index()) {
            record.online = online;
        }
        let lost = self.matcher.set_node_offline(node, !online);
        for lease in &lost {
            if let Some(store_lease) = self.store_of_lease.remove(&lease.id) {
                self.lease_of_store.remove(&store_lease);
            }
        }
        if online {
            self.hold_reclaimed(node);
        } else {
            // The victims there are lost with the node, and the reclaim's hold with its leases.
            self.victims.retain(|_, victim| victim.node != node);
            if let Some((mask, _)) = self.reclaims.get(&node).copied() {
                self.reclaims.insert(node, (mask, None));
            }
        }
        lost
    }

    /// Applies a node going over its owner's limits (it takes no new work) or back within them.
    pub fn set_over_limit(&mut self, store_node: i64, since: Option<i64>) {
        let Some(node) = self.dense.get(&store_node).copied() else {
            return;
        };
        let Some(record) = self.records.get_mut(node.index()) else {
            return;
        };
        record.over_limit_since = since;
        // A node cordoned for fraud, or for a conflict, stays cordoned, whatever its temperature.
        let conflicted = self.conflicts.iter().any(|conflict| conflict.node == store_node);
        self.matcher.set_node_cordoned(
            node,
            since.is_some() || record.fraud_cordoned_at.is_some() || conflicted,
        );
    }

    pub fn record_lease(&mut self, store_lease: i64, id: LeaseId) {
        self.lease_of_store.insert(store_lease, id);
        self.store_of_lease.insert(id, store_lease);
    }

    /// Whether the standings moved far enough from what the view was built with to build it
    /// again: a node's gold eligibility changed, or its reliability by `RELIABILITY_REBUILD_PPM`.
    pub fn trust_moved(&self, standings: &Standings) -> bool {
        self.node_ids.iter().zip(&self.trust).any(|(id, (ppm, gold))| {
            let (now_ppm, now_gold) = standings.for_matcher(*id);
            now_gold != *gold || now_ppm.abs_diff(*ppm) >= RELIABILITY_REBUILD_PPM
        })
    }

    pub fn region(&self, name: &str) -> Option<RegionId> {
        self.matcher.topology().find_region(name)
    }

    /// The dense ids of the nodes of these provider accounts, sorted (a job's `only_nodes`).
    pub fn nodes_of_providers(&self, providers: &[i64]) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = self
            .records
            .iter()
            .zip(&self.node_ids)
            .filter(|(record, _)| providers.contains(&record.node.provider_id))
            .filter_map(|(_, id)| self.dense.get(id).copied())
            .collect();
        nodes.sort_unstable();
        nodes
    }
}

/// A placement that holds `gpu_mask` of `node` for `job` alone: gold (never preempted), GPUs
/// only, with no end and no price (a victim's rest, an owner's reclaim).
fn hold(job: JobId, node: NodeId, gpu_mask: u16, gpu_milli: u16) -> Placement {
    Placement {
        job,
        tier: Tier::Gold,
        leases: vec![Lease {
            id: LeaseId(0),
            job,
            replica: 0,
            node,
            gpu_mask,
            gpu_milli,
            cpu_milli: 0,
            memory_mib: 0,
            epoch: 0,
            start: 0,
            expected_end: i64::MAX / 2,
            price: Micros(0),
            state: LeaseState::Running,
        }],
        clearing_price_per_cu_hour: None,
        preempt_at: None,
        checkpoint_interval_s: 0,
    }
}

/// The matcher's 64-bit content ids of a node's dataset digests (a JSON array of strings).
pub fn dataset_ids(json: &str) -> Vec<u64> {
    let digests: Vec<String> = serde_json::from_str(json).unwrap_or_default();
    let mut ids: Vec<u64> = digests
        .iter()
        .filter_map(|digest| api::dataset_content_id(digest))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The runtimes a node's row lists (comma-separated names); unknown names are skipped.
pub fn runtime_set(names: &str) -> model::RuntimeSet {
    let runtimes: Vec<model::Runtime> = names.split(',').filter_map(model::Runtime::parse).collect();
    model::RuntimeSet::of(&runtimes)
}

#[cfg(test)]
pub(crate) mod tests {
    use trust::rules::{NodeCanaries, Reputation};

    use super::*;
    use crate::books::reputation::{NodeStanding, Standings};

    pub(crate) fn record(id: i64, fraud_cordoned_at: Option<i64>) -> NodeRecord {
        NodeRecord {
            id,
            node: store::NewNode {
                provider_id: 1,
                name: format!("n{id}"),
                public_key: String::new(),
                fingerprint: "fp".into(),
                region: "eu-west".into(),
                site: "ams1".into(),
                fabric: "ib0".into(),
                nvlink_domain: format!("board-{id}"),
                latitude: 0.0,
                longitude: 0.0,
                gpu_model: "H100-SXM5".into(),
                gpu_count: 8,
                cpu_milli: 64_000,
                memory_mib: 512 * 1024,
                network_mbit_s: 10_000,
                simulated: false,
                policy: r#"{"asks": {"gold": "3.00", "silver": "2.00", "bronze": "1.00"}}"#.into(),
                datasets: "[]".into(),
                runtimes: "container,process".into(),
                advertise_addr: String::new(),
                gang_ports: String::new(),
                nvlink_source: String::new(),
                nvlink_detected: String::new(),
                location_source: String::new(),
            },
            fingerprint_changed_at: None,
            registered_at: 0,
            updated_at: 0,
            last_heartbeat_at: Some(0),
            online: true,
            telemetry: None,
            over_limit_since: None,
            fraud_cordoned_at,
            reclaim_gpu_mask: 0,
            reclaim_until: None,
        }
    }

    pub(crate) fn lease(id: i64, job_id: i64, node_id: i64, gpu_mask: i64, preempted_by: Option<i64>) -> LeaseRecord {
        LeaseRecord {
            id,
            job_id,
            lease: store::NewLease {
                replica: 0,
                node_id,
                gpu_mask,
                gpu_milli: 1000,
                cpu_milli: 1000,
                memory_mib: 1024,
                price_micros: 1_000_000,
                tier: if preempted_by.is_some() { "bronze" } else { "gold" }.into(),
                gpu_model: "H100-SXM5".into(),
                region: "eu-west".into(),
                expected_end: i64::MAX / 2,
                preempt_at: preempted_by.map(|_| 30_000_000),
            },
            epoch: 1,
            state: store::LeaseState::Running,
            created_at: 0,
            ended_at: None,
            end_reason: String::new(),
            preempted_by,
        }
    }

    /// Defect 1 of issue 17: a bronze victim (GPUs 0 and 1) in its grace period and the gold
    /// lease that preempted it (GPU 0). The rebuilt view holds the gold lease, not the victim
    /// (before, the victim went in first and the gold lease was left out), and keeps the
    /// victim's GPU 1 held until it ends, so no GPU is booked twice.
    #[test]
    fn a_rebuilt_view_holds_a_preemptor_and_only_the_rest_of_its_victim() {
        let victim = lease(1, 10, 1, 0b11, Some(11));
        let preemptor = lease(2, 11, 1, 0b1, None);
        let mut view = FleetView::build(
            vec![record(1, None)],
            &[victim, preemptor],
            &Standings::default(),
            store::NodesVersion::default(),
            MatcherConfig::default(),
        );
        assert_eq!(view.conflicts, Vec::new());
        assert!(view.lease_of_store.contains_key(&2), "the preemptor is held");
        assert_eq!(view.matcher.job_leases(JobId(11)).len(), 1);
        assert!(
            view.matcher.job_leases(JobId(10)).is_empty(),
            "the victim was released when preempted"
        );
        // Its GPU 1, which the preemptor did not take, stays held until the victim ends.
        let held = view.matcher.job_leases(JobId(HOLD_JOBS | 1));
        assert_eq!(held.iter().map(|lease| lease.gpu_mask).collect::<Vec<_>>(), vec![0b10]);
        assert!(view.release(1), "the hold goes with the victim's lease");
        assert!(view.matcher.job_leases(JobId(HOLD_JOBS | 1)).is_empty());
        assert!(!view.matcher.node_cordoned(NodeId(0)));
        assert_eq!(view.matcher.consistency_check(), Ok(()));
    }

    /// An owner's reclaim of GPUs 0 to 2 while a gold lease runs on GPU 1: the rebuilt view
    /// holds GPUs 0 and 2 at once and GPU 1 when the lease ends, so nothing is placed on any of
    /// them; resumed, all are free again; off line and back, the hold comes back with the node.
    #[test]
    fn a_rebuilt_view_holds_reclaimed_gpus_and_takes_each_as_its_work_ends() {
        let mut reclaimed = record(1, None);
        reclaimed.reclaim_gpu_mask = 0b111;
        let mut view = FleetView::build(
            vec![reclaimed],
            &[lease(1, 10, 1, 0b10, None)],
            &Standings::default(),
            store::NodesVersion::default(),
            MatcherConfig::default(),
        );
        assert_eq!(view.conflicts, Vec::new());
        let held = |view: &FleetView| -> Vec<u16> {
            view.matcher
                .job_leases(JobId(RECLAIM_JOBS | 1))
                .iter()
                .map(|lease| lease.gpu_mask)
                .collect()
        };
        let free =
            |view: &FleetView| -> Vec<u16> { view.matcher.node_capacity(NodeId(0)).gpu_milli_free[..4].to_vec() };
        assert_eq!(held(&view), vec![0b101]);
        assert_eq!(free(&view), vec![0, 0, 0, 1000]);
        assert!(view.reclaimed(1, 0b10) && !view.reclaimed(1, 0b1000));
        assert!(view.release(1));
        assert_eq!(held(&view), vec![0b111], "GPU 1 is the owner's once its lease ends");
        assert_eq!(free(&view), vec![0, 0, 0, 1000]);
        view.set_online(1, false);
        assert_eq!(held(&view), Vec::<u16>::new());
        view.set_online(1, true);
        assert_eq!(held(&view), vec![0b111], "back on line, still the owner's");
        view.set_reclaim(1, 0);
        assert_eq!(held(&view), Vec::<u16>::new());
        assert_eq!(free(&view), vec![1000, 1000, 1000, 1000]);
        assert_eq!(view.matcher.consistency_check(), Ok(()));
    }

    /// A stored live lease that does not fit is a bug: the view says so and cordons the node,
    /// so the matcher never books those GPUs again (before, the lease was left out and the
    /// GPUs went to the next job).
    #[test]
    fn a_stored_lease_that_does_not_fit_is_a_conflict_and_cordons_its_node() {
        let first = lease(1, 10, 1, 0b11, None);
        let second = lease(2, 11, 1, 0b1, None);
        let elsewhere = lease(3, 12, 9, 0b1, None);
        let view = FleetView::build(
            vec![record(1, None)],
            &[first, second, elsewhere],
            &Standings::default(),
            store::NodesVersion::default(),
            MatcherConfig::default(),
        );
        let found: Vec<(i64, Vec<i64>, i64)> = view
            .conflicts
            .iter()
            .map(|conflict| (conflict.job, conflict.leases.clone(), conflict.node))
            .collect();
        assert_eq!(found, vec![(11, vec![2], 1), (12, vec![3], 9)]);
        assert!(view.matcher.node_cordoned(NodeId(0)));
        assert!(view.lease_of_store.contains_key(&1));
    }

    /// An NVL72 rack registers as 18 nodes of 4 GPUs naming one domain: the view's domain
    /// joins all 72 GPUs (before, it took the first node's 4), and a domain of the same name
    /// in another fabric is another domain.
    #[test]
    fn a_shared_nvlink_domain_joins_the_gpus_of_all_its_nodes() {
        let mut records: Vec<NodeRecord> = (1..=21)
            .map(|id| {
                let mut record = record(id, None);
                record.node.gpu_model = "GB200".into();
                record.node.gpu_count = 4;
                record.node.nvlink_domain = if id <= 18 { "rack-1" } else { "rack-2" }.into();
                record
            })
            .collect();
        records[20].node.fabric = "ib1".into();
        records[20].node.nvlink_domain = "rack-1".into();
        let view = FleetView::build(
            records,
            &[],
            &Standings::default(),
            store::NodesVersion::default(),
            MatcherConfig::default(),
        );
        let topology = view.matcher.topology();
        let nodes = view.matcher.nodes();
        let domain_gpus = |node: usize| topology.nvlink_domains[nodes[node].path.nvlink.index()].gpus;
        assert_eq!(topology.nvlink_domains.len(), 3);
        assert!((0..18).all(|node| nodes[node].path.nvlink == nodes[0].path.nvlink));
        assert_eq!(domain_gpus(0), 72);
        assert_eq!(domain_gpus(18), 8, "rack-2");
        assert_eq!(domain_gpus(20), 4, "rack-1 of the other fabric");
        assert_ne!(nodes[20].path.nvlink, nodes[0].path.nvlink);
        assert!(nodes.iter().all(|node| node.gpu_count == 4));
    }

    fn standing(successes: usize, gold_eligible: bool) -> NodeStanding {
        let outcomes: Vec<(trust::rules::Outcome, i64)> = (0..successes)
            .map(|_| (trust::rules::Outcome::LeaseFinished, 0))
            .collect();
        NodeStanding {
            provider_id: 1,
            reputation: Reputation::from_outcomes(&outcomes, 0),
            canaries: NodeCanaries {
                last_answered: None,
                unanswered_since: 0,
                fingerprint_changed_ms: None,
            },
            fraud_cordoned_at: None,
            gold_eligible,
        }
    }

    #[test]
    fn the_view_takes_reliability_gold_and_the_fraud_cordon_from_the_standings() {
        let mut standings = Standings::default();
        standings.nodes.insert(1, standing(90, true));
        standings.nodes.insert(2, standing(0, false));
        let records = vec![record(1, None), record(2, None), record(3, Some(5))];
        let mut view = FleetView::build(
            records,
            &[],
            &standings,
            store::NodesVersion::default(),
            MatcherConfig::default(),
        );
        let nodes = view.matcher.nodes();
        assert_eq!(nodes[0].reliability_ppm, standings.nodes[&1].reputation.score_ppm());
        assert!(nodes[0].reliability_ppm >= 980_000, "{}", nodes[0].reliability_ppm);
        assert_eq!(nodes[1].reliability_ppm, 800_000, "the prior");
        assert_eq!(nodes[2].reliability_ppm, 800_000, "a node the standings do not know");
        assert!(nodes[0].policy.allowed_tiers.contains(Tier::Gold));
        assert!(
            !nodes[1].policy.allowed_tiers.contains(Tier::Gold),
            "no gold without eligibility"
        );
        assert!(nodes[1].policy.allowed_tiers.contains(Tier::Silver));
        assert!(!view.matcher.node_cordoned(NodeId(0)));
        assert!(view.matcher.node_cordoned(NodeId(2)), "cordoned for fraud");
        view.set_over_limit(3, None);
        assert!(
            view.matcher.node_cordoned(NodeId(2)),
            "cooling down lifts no fraud cordon"
        );
        assert!(!view.trust_moved(&standings));
        let mut moved = Standings::default();
        moved.nodes.insert(1, standing(90, false));
        moved.nodes.insert(2, standing(0, false));
        assert!(view.trust_moved(&moved), "gold eligibility changed");
        let mut slightly = Standings::default();
        slightly.nodes.insert(1, standing(91, true));
        slightly.nodes.insert(2, standing(0, false));
        assert!(!view.trust_moved(&slightly), "a small move waits for the next rebuild");
        slightly.nodes.insert(2, standing(20, false));
        assert!(view.trust_moved(&slightly), "a large one does not");
    }
}
