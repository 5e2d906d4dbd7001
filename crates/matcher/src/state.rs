//! The matcher's in-memory state: node facts in a hot array, per-node load, the lease slab,
//! job records, and the commit / release paths that keep the indexes in step.

use model::{
    GPU_MILLI_WHOLE, GPUS_PER_NODE_MAX, GpuCatalog, JobId, Lease, LeaseId, LeaseState, Node, NodeId, Tier, Timestamp,
    Topology,
};

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::index::{Index, WINDOW_CLASSES, WINDOW_CLASSES_S, window_class};
use crate::reserve::Reservations;
use crate::{CommitError, MatcherConfig, Placement};

/// Facts about a node the hot path reads, packed together (the full [`Node`] stays cold).
#[derive(Clone, Debug)]
pub(crate) struct NodeStatic {
    pub region: u16,
    pub site: u16,
    pub fabric: u32,
    pub nvlink: u32,
    pub model: u16,
    pub gpu_count: u8,
    pub tiers: u8,
    pub classes: u8,
    pub runtimes: u8,
    pub always_available: bool,
    pub has_price_rules: bool,
    /// Windows that are all weekly: availability is constant within a minute.
    pub weekly_windows_only: bool,
    /// The lowest multiplier of the price schedule (≤ 1000): base asks × this bound every ask.
    pub ask_floor_permille: u32,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu_memory_mib: u32,
    pub cu_milli: u32,
    /// reliability^α in parts per million.
    pub reliability_weight_ppm: u32,
    pub reliability_ppm: u32,
    /// Base asks per tier in micro-dollars per GPU-hour; `i64::MAX` where the tier is not sold.
    pub asks: [i64; 3],
    /// The key the firm work's index orders by: the effective ask of the silver ask (or, where
    /// silver is not sold, the lowest ask sold). Tier bounds scale it by the keying's
    /// `tier_ratio_permille`.
    pub reference_key: u64,
    /// The ask behind `reference_key`.
    pub reference_ask: i64,
}

/// What is in use on a node now.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeLoad {
    pub gpu_used_milli: [u16; GPUS_PER_NODE_MAX],
    pub cpu_used: u32,
    pub memory_used: u64,
    /// Current capacity level: GPUs with nothing on them.
    pub whole_free: u8,
    /// Largest free share among partly used GPUs, as a bucket (0 = none, 1..=10 for 1..999 milli).
    pub share_bucket: u8,
    pub offline: bool,
    /// Over its owner's thermal or power limits: takes no new work; what runs stays.
    pub cordoned: bool,
    /// Outside its provider's availability windows at the matcher's clock: sells nothing now.
    pub closed: bool,
    /// At the matcher's clock minute: the end of the node's availability (weekly windows only)
    /// and the multiplier of its price rule in force (0 = none). Cached so the hot path does
    /// not read the cold policy.
    pub open_until: Option<Timestamp>,
    pub price_multiplier_permille: u32,
    /// Milli-GPU held by bronze leases and by all others: the ranking keeps the two apart, so
    /// that preemption can free whole nodes.
    pub bronze_milli: u32,
    pub other_milli: u32,
    /// The tier class the indexes hold the node under (see `index::TIER_CLASSES`).
    pub tier_class: u8,
    pub leases: Vec<u32>,
    /// Beside `leases`, in the same order: what preemption needs to cost each lease, so that
    /// costing a node reads one small array instead of the lease slab.
    pub lease_work: Vec<LeaseWork>,
}

/// A lease's start, checkpoint interval and size: enough to say what stopping it loses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseWork {
    pub start: Timestamp,
    pub checkpoint_interval_s: u32,
    pub gpu_milli_total: u32,
}

impl LeaseWork {
    /// GPU-seconds lost if the lease stops at `now`: the time since its last checkpoint (or its start).
    pub fn lost_gpu_seconds(&self, now: Timestamp) -> u64 {
        let ran = (now - self.start).max(0) as u64;
        let since_checkpoint = if self.checkpoint_interval_s > 0 {
            ran % u64::from(self.checkpoint_interval_s)
        } else {
            ran
        };
        since_checkpoint * u64::from(self.gpu_milli_total) / 1000
    }
}

impl NodeLoad {
    pub fn current_tier_class(&self) -> u8 {
        u8::from(self.bronze_milli > 0) | (u8::from(self.other_milli > 0) << 1)
    }

    pub fn levels(&self, gpu_count: u8) -> (u8, u8) {
        let mut whole = 0u8;
        let mut best_partial = 0u16;
        for &used in &self.gpu_used_milli[..gpu_count as usize] {
            if used == 0 {
                whole += 1;
            } else if used < GPU_MILLI_WHOLE {
                best_partial = best_partial.max(GPU_MILLI_WHOLE - used);
            }
        }
        let bucket = if best_partial == 0 {
            0
        } else {
            (best_partial / 100) as u8 + 1
        };
        (whole, bucket)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct LeaseSlot {
    pub lease: Lease,
    pub tier: Tier,
    pub generation: u32,
    pub live: bool,
    pub preempt_at: Option<Timestamp>,
    /// The job's checkpoint interval, beside the lease so preemption costs it without a lookup.
    pub checkpoint_interval_s: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct JobRecord {
    pub tier: Tier,
    pub leases: Vec<LeaseId>,
}

pub(crate) use model::hash::FixedMap;

/// The matching engine and everything it knows. Build it with [`Matcher::new`].
pub struct Matcher {
    pub(crate) config: MatcherConfig,
    pub(crate) topology: Topology,
    pub(crate) nodes: Vec<Node>,
    pub(crate) statics: Vec<NodeStatic>,
    pub(crate) loads: Vec<NodeLoad>,
    /// The capacity index, ordered by each node's reference effective ask.
    pub(crate) index: Index,
    /// Scales a reference key into a lower bound of a tier's effective ask (thousandths).
    pub(crate) leases: Vec<LeaseSlot>,
    pub(crate) free_slots: Vec<u32>,
    pub(crate) jobs: FixedMap<JobId, JobRecord>,
    pub(crate) reservations: Reservations,
    pub(crate) next_epoch: u64,
    pub(crate) gpu_milli_total: u64,
    pub(crate) gpu_milli_used: u64,
    /// Nodes with availability windows, and the minute the matcher last opened or closed them.
    pub(crate) windowed: Vec<u32>,
    /// Nodes with time-of-day price rules.
    pub(crate) priced: Vec<u32>,
    pub(crate) clock_minute: Option<i64>,
    /// Per node: its open-time class in the index's window filters (see
    /// `index::WINDOW_CLASSES_S`), and the first minute start at which it drops a class
    /// (`Timestamp::MAX`: never, as things are).
    pub(crate) window_classes: Vec<u8>,
    pub(crate) window_drop_at: Vec<Timestamp>,
    /// (drop time, node), earliest first: the clock lowers the classes of nodes whose open time
    /// shrank past a class without visiting every windowed node. An entry whose time no longer
    /// matches `window_drop_at` is stale and skipped; each holds a time no later than its node's
    /// window end, so none outlives a week of clock.
    pub(crate) window_drops: BinaryHeap<Reverse<(Timestamp, u32)>>,
    /// Buffers gang plans reuse (see [`GangScratch`]).
    pub(crate) gang_scratch: std::sync::Mutex<GangScratch>,
    /// Buffers fabric-level preemption plans reuse.
    pub(crate) preempt_scratch: std::sync::Mutex<crate::preempt::PreemptScratch>,
    /// Every node grouped by fabric, in node order; fabric f's nodes are
    /// `fabric_nodes[fabric_starts[f]..fabric_starts[f + 1]]`. Gang repair looks there first.
    pub(crate) fabric_nodes: Vec<u32>,
    pub(crate) fabric_starts: Vec<u32>,
}

/// A gang candidate: (domain, score, node, replicas the node can hold).
pub(crate) type GangCandidate = (u64, u64, u32, u32);

/// The buffers of a gang plan, sized for the whole fleet and written once when the matcher is
/// built, then reused: a plan touches no fresh memory. Fresh pages cost a first plan
/// milliseconds when the kernel backs them with huge pages (a p99 of 16–22 ms against 5 ms
/// in `bench gang`).
pub(crate) struct GangScratch {
    /// One bit per node: the nodes a plan tries.
    pub marked: Vec<u64>,
    pub candidates: Vec<GangCandidate>,
    pub grouped: Vec<GangCandidate>,
    /// Per domain: where its candidates start in `grouped` (and one past the last), and how
    /// many replicas they hold together.
    pub offsets: Vec<usize>,
    pub held: Vec<u64>,
}

impl GangScratch {
    fn for_fleet(nodes: usize) -> GangScratch {
        // Written, not only reserved, so their pages are in place before the first plan.
        let written = |len| {
            let mut buffer = vec![(1, 1, 1, 1); len];
            buffer.clear();
            buffer
        };
        GangScratch {
            marked: vec![1; nodes.div_ceil(64)],
            candidates: written(nodes),
            grouped: written(nodes),
            offsets: vec![1; nodes + 1],
            held: vec![1; nodes],
        }
    }
}

/// Node indices grouped by fabric (a counting sort, so each fabric keeps node order), and where
/// each fabric's group starts, with one past the last.
fn group_by_fabric(statics: &[NodeStatic]) -> (Vec<u32>, Vec<u32>) {
    let fabrics = statics.iter().map(|node| node.fabric as usize + 1).max().unwrap_or(0);
    let mut starts = vec![0u32; fabrics + 1];
    for node in statics {
        starts[node.fabric as usize + 1] += 1;
    }
    for fabric in 0..fabrics {
        starts[fabric + 1] += starts[fabric];
    }
    let mut next = starts.clone();
    let mut members = vec![0u32; statics.len()];
    for (index, node) in statics.iter().enumerate() {
        let slot = &mut next[node.fabric as usize];
        members[*slot as usize] = index as u32;
        *slot += 1;
    }
    (members, starts)
}

/// reliability^α in parts per million, at least 1.
pub(crate) fn reliability_weight_ppm(reliability_ppm: u32, alpha: f64) -> u32 {
    let reliability = f64::from(reliability_ppm.clamp(1, 1_000_000)) / 1e6;
    ((reliability.powf(alpha) * 1e6).round() as u32).max(1)
}

/// `ask / (cu × reliability^α)` in micro-dollars per compute-unit-hour.
pub(crate) fn effective_ask(ask_micros: i64, cu_milli: u32, reliability_weight_ppm: u32) -> u64 {
    if ask_micros == i64::MAX {
        return u64::MAX;
    }
    let numerator = (ask_micros.max(0) as u128) * 1_000_000_000;
    let denominator = u128::from(cu_milli.max(1)) * u128::from(reliability_weight_ppm.max(1));
    u64::try_from(numerator / denominator).unwrap_or(u64::MAX)
}

impl Matcher {
    pub(crate) fn build(topology: Topology, nodes: Vec<Node>, config: MatcherConfig) -> Matcher {
        let catalog = GpuCatalog::embedded();
        let mut statics = Vec::with_capacity(nodes.len());
        let mut loads = Vec::with_capacity(nodes.len());
        let mut gpu_milli_total = 0u64;
        for (position, node) in nodes.iter().enumerate() {
            assert_eq!(node.id.index(), position, "nodes[i].id must be NodeId(i)");
            assert!(
                (1..=GPUS_PER_NODE_MAX).contains(&(node.gpu_count as usize)) || node.gpu_count == 0,
                "a node has at most {GPUS_PER_NODE_MAX} GPUs"
            );
            let spec = catalog.spec(node.gpu_model);
            let weight = reliability_weight_ppm(node.reliability_ppm, config.reliability_alpha);
            let sold =
                |tier: Tier| node.policy.allowed_tiers.contains(tier) && node.policy.asks[tier as usize].is_some();
            let reference_ask = if sold(Tier::Silver) {
                node.policy.asks[Tier::Silver as usize].map_or(i64::MAX, |ask| ask.0)
            } else {
                Tier::ALL
                    .iter()
                    .filter(|tier| sold(**tier))
                    .filter_map(|tier| node.policy.asks[*tier as usize])
                    .map(|ask| ask.0)
                    .min()
                    .unwrap_or(i64::MAX)
            };
            let asks = node.policy.asks.map(|ask| ask.map_or(i64::MAX, |micros| micros.0));
            statics.push(NodeStatic {
                region: node.path.region.0,
                site: node.path.site.0,
                fabric: node.path.fabric.0,
                nvlink: node.path.nvlink.0,
                model: node.gpu_model.0,
                gpu_count: node.gpu_count,
                tiers: node.policy.allowed_tiers.0,
                classes: node.policy.allowed_classes.0,
                runtimes: node.runtimes.0,
                always_available: node.policy.windows.is_empty(),
                has_price_rules: !node.policy.price_rules.is_empty(),
                weekly_windows_only: node
                    .policy
                    .windows
                    .iter()
                    .all(|window| matches!(window, model::AvailabilityWindow::Weekly { .. })),
                ask_floor_permille: node
                    .policy
                    .price_rules
                    .iter()
                    .map(|rule| rule.multiplier_permille)
                    .min()
                    .unwrap_or(1000)
                    .min(1000),
                cpu_milli: node.cpu_milli,
                memory_mib: node.memory_mib,
                gpu_memory_mib: spec.memory_mib,
                cu_milli: spec.cu_milli,
                reliability_weight_ppm: weight,
                reliability_ppm: node.reliability_ppm,
                asks,
                reference_key: effective_ask(reference_ask, spec.cu_milli, weight),
                reference_ask,
            });
            let mut load = NodeLoad::default();
            (load.whole_free, load.share_bucket) = load.levels(node.gpu_count);
            loads.push(load);
            gpu_milli_total += u64::from(node.gpu_count) * u64::from(GPU_MILLI_WHOLE);
        }
        let windowed: Vec<u32> = nodes
            .iter()
            .filter(|node| !node.policy.windows.is_empty())
            .map(|node| node.id.0)
            .collect();
        let priced: Vec<u32> = nodes
            .iter()
            .filter(|node| !node.policy.price_rules.is_empty())
            .map(|node| node.id.0)
            .collect();
        let regions = topology.regions.len().max(1);
        let index = Index::build(&statics, &loads, regions);
        let reservations = Reservations::new(nodes.len());
        let node_count = nodes.len();
        let (fabric_nodes, fabric_starts) = group_by_fabric(&statics);
        Matcher {
            config,
            topology,
            nodes,
            statics,
            loads,
            index,
            leases: Vec::new(),
            free_slots: Vec::new(),
            jobs: FixedMap::default(),
            reservations,
            next_epoch: 1,
            gpu_milli_total,
            gpu_milli_used: 0,
            windowed,
            priced,
            clock_minute: None,
            window_classes: vec![WINDOW_CLASSES; node_count],
            window_drop_at: vec![Timestamp::MAX; node_count],
            window_drops: BinaryHeap::new(),
            gang_scratch: std::sync::Mutex::new(GangScratch::for_fleet(node_count)),
            preempt_scratch: std::sync::Mutex::new(crate::preempt::PreemptScratch::default()),
            fabric_nodes,
            fabric_starts,
        }
    }

    /// The nodes of a fabric, in node order.
    pub(crate) fn fabric_members(&self, fabric: u32) -> &[u32] {
        let fabric = fabric as usize;
        match (self.fabric_starts.get(fabric), self.fabric_starts.get(fabric + 1)) {
            (Some(&start), Some(&end)) => &self.fabric_nodes[start as usize..end as usize],
            _ => &[],
        }
    }

    pub fn config(&self) -> &MatcherConfig {
        &self.config
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn gpu_milli_total(&self) -> u64 {
        self.gpu_milli_total
    }

    pub fn gpu_milli_used(&self) -> u64 {
        self.gpu_milli_used
    }

    pub fn running_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// What is free on a node now.
    pub fn node_capacity(&self, node: NodeId) -> model::NodeCapacity {
        let statics = &self.statics[node.index()];
        let load = &self.loads[node.index()];
        model::NodeCapacity {
            cpu_milli_free: statics.cpu_milli - load.cpu_used,
            memory_mib_free: statics.memory_mib - load.memory_used,
            gpu_milli_free: load.gpu_used_milli[..statics.gpu_count as usize]
                .iter()
                .map(|used| GPU_MILLI_WHOLE - used)
                .collect(),
        }
    }

    /// The live lease with this id.
    pub fn lease(&self, id: LeaseId) -> Option<&Lease> {
        self.slot_of(id).map(|slot| &self.leases[slot].lease)
    }

    /// The live leases of a job, in replica order.
    pub fn job_leases(&self, job: JobId) -> Vec<Lease> {
        let Some(record) = self.jobs.get(&job) else {
            return Vec::new();
        };
        let mut leases: Vec<Lease> = record.leases.iter().filter_map(|id| self.lease(*id).cloned()).collect();
        leases.sort_by_key(|lease| (lease.replica, lease.id));
        leases
    }

    /// When bronze work on this lease must give way to a reservation, if ever.
    pub fn lease_preempt_at(&self, id: LeaseId) -> Option<Timestamp> {
        self.slot_of(id).and_then(|slot| self.leases[slot].preempt_at)
    }

    pub(crate) fn slot_of(&self, id: LeaseId) -> Option<usize> {
        let slot = (id.0 & 0xffff_ffff) as usize;
        let generation = (id.0 >> 32) as u32;
        let entry = self.leases.get(slot)?;
        (entry.live && entry.generation == generation).then_some(slot)
    }

    /// Moves the matcher's clock: nodes whose availability windows opened or closed since the
    /// last minute seen enter or leave the indexes. [`Matcher::place`] does it; callers of
    /// [`Matcher::plan`] alone call it when time moves (a stale clock can only hide a node
    /// whose window just opened; feasibility always checks windows exactly).
    pub fn advance_clock(&mut self, now: Timestamp) {
        let minute = now.div_euclid(60);
        if self.clock_minute == Some(minute) {
            return;
        }
        self.clock_minute = Some(minute);
        let minute_start = minute * 60;
        for position in 0..self.priced.len() {
            let node = self.priced[position] as usize;
            self.loads[node].price_multiplier_permille =
                self.nodes[node].policy.multiplier_at(minute_start).unwrap_or(0);
        }
        for position in 0..self.windowed.len() {
            let node = self.windowed[position] as usize;
            self.reopen(node, minute_start, now);
        }
        self.lower_window_classes(minute_start);
    }

    /// Lowers the open-time classes of nodes whose remaining open time fell under their class
    /// by `minute_start`.
    pub(crate) fn lower_window_classes(&mut self, minute_start: Timestamp) {
        while let Some(&Reverse((at, node))) = self.window_drops.peek() {
            if at > minute_start {
                break;
            }
            self.window_drops.pop();
            let node = node as usize;
            if self.window_drop_at[node] == at {
                self.window_drop_at[node] = Timestamp::MAX;
                self.refresh_window_class(node, minute_start);
            }
        }
    }

    /// Puts a node in the open-time class of its cached window end, seen from `minute_start`,
    /// and schedules the minute it drops out of it.
    pub(crate) fn refresh_window_class(&mut self, node: usize, minute_start: Timestamp) {
        let statics = &self.statics[node];
        let load = &self.loads[node];
        let weekly = !statics.always_available && statics.weekly_windows_only;
        let (class, drop_at) = match load.open_until {
            _ if !weekly => (WINDOW_CLASSES, Timestamp::MAX),
            None => (0, Timestamp::MAX),
            Some(end) => {
                let class = window_class(end.saturating_sub(minute_start));
                let drop_at = match class {
                    0 => Timestamp::MAX,
                    class => end - WINDOW_CLASSES_S[class as usize - 1] + 1,
                };
                (class, drop_at)
            }
        };
        let old = self.window_classes[node];
        if old != class {
            self.index.set_window_class(node, old, class);
            self.window_classes[node] = class;
        }
        if drop_at != self.window_drop_at[node] {
            self.window_drop_at[node] = drop_at;
            if drop_at != Timestamp::MAX {
                self.window_drops.push(Reverse((drop_at, node as u32)));
            }
        }
    }

    /// Plans and commits: one decision.
    pub fn place(&mut self, job: &model::JobSpec, now: Timestamp) -> Result<Placement, crate::Unplaced> {
        self.advance_clock(now);
        let mut placement = self.plan(job, now)?;
        let leases = self
            .commit(&placement)
            .expect("a plan made on the current state commits");
        placement.leases = leases;
        Ok(placement)
    }

    /// Verifies a plan against the current state and applies it, all leases or none. Returns
    /// the leases with their ids and epochs.
    pub fn commit(&mut self, placement: &Placement) -> Result<Vec<Lease>, CommitError> {
        self.commit_inner(placement, false)
    }

    /// Commits a plan; `extend` adds the leases to a job that already runs (gang repair).
    pub(crate) fn commit_inner(&mut self, placement: &Placement, extend: bool) -> Result<Vec<Lease>, CommitError> {
        if !extend && self.jobs.contains_key(&placement.job) {
            return Err(CommitError::AlreadyPlaced(placement.job));
        }
        // Verify everything first, node by node, counting what earlier leases of the plan take
        // there. One lease (the common case) is checked in place, without a copy.
        if let [lease] = placement.leases.as_slice() {
            let node = lease.node.index();
            if node >= self.nodes.len() {
                return Err(CommitError::UnknownNode(lease.node));
            }
            if self.loads[node].offline || !usage_fits(&self.loads[node], &self.statics[node], lease) {
                return Err(CommitError::Conflict(placement.job));
            }
        }
        let mut by_node: Vec<usize> = if placement.leases.len() > 1 {
            (0..placement.leases.len()).collect()
        } else {
            Vec::new()
        };
        by_node.sort_unstable_by_key(|&position| (placement.leases[position].node, position));
        let mut scratch: Option<(usize, NodeLoad)> = None;
        for &position in &by_node {
            let lease = &placement.leases[position];
            let node = lease.node.index();
            if node >= self.nodes.len() {
                return Err(CommitError::UnknownNode(lease.node));
            }
            if scratch.as_ref().is_none_or(|(current, _)| *current != node) {
                scratch = Some((node, crate::search::light_copy(&self.loads[node])));
            }
            let load = &mut scratch.as_mut().expect("set above").1;
            if load.offline || !apply_usage(load, &self.statics[node], lease, true) {
                return Err(CommitError::Conflict(placement.job));
            }
        }
        let mut committed = Vec::with_capacity(placement.leases.len());
        let mut ids = Vec::with_capacity(placement.leases.len());
        for planned in &placement.leases {
            let mut lease = planned.clone();
            let slot = match self.free_slots.pop() {
                Some(slot) => slot as usize,
                None => {
                    self.leases.push(LeaseSlot {
                        lease: lease.clone(),
                        tier: placement.tier,
                        generation: 0,
                        live: false,
                        preempt_at: None,
                        checkpoint_interval_s: 0,
                    });
                    self.leases.len() - 1
                }
            };
            let generation = self.leases[slot].generation.wrapping_add(1);
            lease.id = LeaseId((u64::from(generation) << 32) | slot as u64);
            lease.epoch = self.next_epoch;
            self.next_epoch += 1;
            lease.state = LeaseState::Pending;
            self.leases[slot] = LeaseSlot {
                lease: lease.clone(),
                tier: placement.tier,
                generation,
                live: true,
                preempt_at: placement.preempt_at,
                checkpoint_interval_s: placement.checkpoint_interval_s,
            };
            let node = lease.node.index();
            let applied = apply_usage(&mut self.loads[node], &self.statics[node], &lease, true);
            assert!(applied, "verified above");
            if placement.tier == Tier::Bronze {
                self.loads[node].bronze_milli += lease.gpu_milli_total();
            } else {
                self.loads[node].other_milli += lease.gpu_milli_total();
            }
            self.loads[node].leases.push(slot as u32);
            self.loads[node].lease_work.push(LeaseWork {
                start: lease.start,
                checkpoint_interval_s: placement.checkpoint_interval_s,
                gpu_milli_total: lease.gpu_milli_total(),
            });
            self.gpu_milli_used += u64::from(lease.gpu_milli_total());
            self.refresh_levels(node);
            ids.push(lease.id);
            committed.push(lease);
        }
        self.reservations.remove_job(placement.job);
        match self.jobs.get_mut(&placement.job) {
            Some(record) if extend => record.leases.extend(ids),
            _ => {
                self.jobs.insert(
                    placement.job,
                    JobRecord {
                        tier: placement.tier,
                        leases: ids,
                    },
                );
            }
        }
        Ok(committed)
    }

    /// Ends one lease and frees what it held. The job record goes when its last lease does.
    pub fn release_lease(&mut self, id: LeaseId) -> Option<Lease> {
        let slot = self.slot_of(id)?;
        let lease = self.leases[slot].lease.clone();
        let node = lease.node.index();
        let released = apply_usage(&mut self.loads[node], &self.statics[node], &lease, false);
        assert!(released, "a live lease's usage is on its node");
        if self.leases[slot].tier == Tier::Bronze {
            self.loads[node].bronze_milli -= lease.gpu_milli_total();
        } else {
            self.loads[node].other_milli -= lease.gpu_milli_total();
        }
        let load = &mut self.loads[node];
        let position = load
            .leases
            .iter()
            .position(|&entry| entry as usize == slot)
            .expect("lease listed on its node");
        load.leases.swap_remove(position);
        load.lease_work.swap_remove(position);
        self.gpu_milli_used -= u64::from(lease.gpu_milli_total());
        self.refresh_levels(node);
        self.leases[slot].live = false;
        self.free_slots.push(slot as u32);
        if let Some(record) = self.jobs.get_mut(&lease.job) {
            record.leases.retain(|entry| *entry != id);
            if record.leases.is_empty() {
                self.jobs.remove(&lease.job);
            }
        }
        Some(lease)
    }

    /// Ends every lease of a job; returns how many were freed.
    pub fn release_job(&mut self, job: JobId, _now: Timestamp) -> usize {
        let Some(record) = self.jobs.get(&job) else { return 0 };
        let ids = record.leases.clone();
        ids.into_iter().filter(|id| self.release_lease(*id).is_some()).count()
    }

    /// Takes a node out of service (it died or went silent) or brings it back. Taking it out
    /// frees its leases and returns them, so their jobs can be requeued or their gangs repaired.
    pub fn set_node_offline(&mut self, node: NodeId, offline: bool) -> Vec<Lease> {
        let index = node.index();
        let mut lost = Vec::new();
        if offline {
            let slots: Vec<u32> = self.loads[index].leases.clone();
            for slot in slots {
                let id = self.leases[slot as usize].lease.id;
                if let Some(mut lease) = self.release_lease(id) {
                    lease.state = LeaseState::Lost;
                    lost.push(lease);
                }
            }
        }
        self.loads[index].offline = offline;
        self.refresh_levels(index);
        lost
    }

    /// Cordons a node (it is over its owner's limits: it takes no new work, and what runs on it
    /// stays) or lifts the cordon.
    pub fn set_node_cordoned(&mut self, node: NodeId, cordoned: bool) {
        let index = node.index();
        if self.loads[index].cordoned != cordoned {
            self.loads[index].cordoned = cordoned;
            self.refresh_levels(index);
        }
    }

    /// Whether a node is cordoned (see `set_node_cordoned`).
    pub fn node_cordoned(&self, node: NodeId) -> bool {
        self.loads[node.index()].cordoned
    }

    /// A windowed node's availability at the minute starting `minute_start` (and at `now`, when
    /// its windows are not all weekly): how long it stays open, and whether it is closed.
    pub(crate) fn reopen(&mut self, node: usize, minute_start: Timestamp, now: Timestamp) {
        let policy = &self.nodes[node].policy;
        let open_until = policy.available_until(minute_start);
        let closed = if self.statics[node].weekly_windows_only {
            open_until.is_none()
        } else {
            policy.available_until(now).is_none()
        };
        self.loads[node].open_until = open_until;
        if closed != self.loads[node].closed {
            self.loads[node].closed = closed;
            self.refresh_levels(node);
        }
        self.refresh_window_class(node, minute_start);
    }

    /// Recomputes a node's capacity levels and moves it between index sets if they changed.
    pub(crate) fn refresh_levels(&mut self, node: usize) {
        let load = &self.loads[node];
        let (whole, bucket) = if load.offline || load.closed || load.cordoned {
            (0, 0)
        } else {
            load.levels(self.statics[node].gpu_count)
        };
        let new = (whole, bucket, load.current_tier_class());
        let old = (load.whole_free, load.share_bucket, load.tier_class);
        if new != old {
            self.index.move_node(node, old, new);
            let load = &mut self.loads[node];
            (load.whole_free, load.share_bucket, load.tier_class) = new;
        }
    }
}

/// Whether a lease's usage fits on a node's load now.
pub(crate) fn usage_fits(load: &NodeLoad, statics: &NodeStatic, lease: &Lease) -> bool {
    let gpus = statics.gpu_count as usize;
    let cpu_ok = load
        .cpu_used
        .checked_add(lease.cpu_milli)
        .is_some_and(|used| used <= statics.cpu_milli);
    let memory_ok = load
        .memory_used
        .checked_add(lease.memory_mib)
        .is_some_and(|used| used <= statics.memory_mib);
    let gpus_ok = (0..GPUS_PER_NODE_MAX)
        .filter(|gpu| lease.gpu_mask & (1 << gpu) != 0)
        .all(|gpu| gpu < gpus && load.gpu_used_milli[gpu] + lease.gpu_milli <= GPU_MILLI_WHOLE);
    cpu_ok && memory_ok && gpus_ok
}

/// Adds (or with `add == false` removes) a lease's usage on a node. Returns false, changing
/// nothing, when adding would exceed a capacity.
pub(crate) fn apply_usage(load: &mut NodeLoad, statics: &NodeStatic, lease: &Lease, add: bool) -> bool {
    let gpus = statics.gpu_count as usize;
    if add {
        if !usage_fits(load, statics, lease) {
            return false;
        }
        load.cpu_used += lease.cpu_milli;
        load.memory_used += lease.memory_mib;
        for gpu in 0..gpus {
            if lease.gpu_mask & (1 << gpu) != 0 {
                load.gpu_used_milli[gpu] += lease.gpu_milli;
            }
        }
    } else {
        let gpus_ok = (0..gpus)
            .filter(|gpu| lease.gpu_mask & (1 << gpu) != 0)
            .all(|gpu| load.gpu_used_milli[gpu] >= lease.gpu_milli);
        if load.cpu_used < lease.cpu_milli || load.memory_used < lease.memory_mib || !gpus_ok {
            return false;
        }
        load.cpu_used -= lease.cpu_milli;
        load.memory_used -= lease.memory_mib;
        for gpu in 0..gpus {
            if lease.gpu_mask & (1 << gpu) != 0 {
                load.gpu_used_milli[gpu] -= lease.gpu_milli;
            }
        }
    }
    true
}

/// Asks the CPU to bring the cache line at `pointer` in without waiting for it. Scans that cost
/// node after node read each node's own heap buffers, at addresses the hardware cannot guess:
/// fetched a few nodes ahead, their misses overlap instead of coming one after the other.
/// Elsewhere than x86-64 it does nothing.
#[inline(always)]
pub(crate) fn prefetch<T>(pointer: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it reads nothing into the program and never faults,
    // whatever the address. SSE, which provides it, is part of x86-64's baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(pointer.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = pointer;
}
