//! Selection: single-replica jobs run an exact best-first search over the capacity indexes;
//! gangs gather every candidate, group them by the required topology domain and take the
//! cheapest domain that holds all replicas. Both end in the uniform (k+1)-price auction.

use model::{
    GPU_MILLI_WHOLE, GpuCatalog, GpuDemand, GpuModel, JobSpec, Lease, LeaseId, LeaseState, Micros, NodeId, Tier,
    Timestamp, TopologyLevel,
};

use crate::fit::{Fit, JobContext};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::index::{Order, RangeInfo, SHARE_BUCKETS, TIER_CLASSES, WHOLE_LEVELS};
use crate::rankset::{RankSet, has_bit, set_bit};
use crate::state::{GangCandidate, GangScratch, Matcher, NodeLoad, apply_usage};
use crate::{Placement, Unplaced};

/// The most replicas one gang may have.
pub const GANG_REPLICAS_MAX: u32 = 1 << 20;

/// A copy of a node's usage without its lease list, for trying several replicas on it.
pub(crate) fn light_copy(load: &NodeLoad) -> NodeLoad {
    NodeLoad {
        gpu_used_milli: load.gpu_used_milli,
        cpu_used: load.cpu_used,
        memory_used: load.memory_used,
        whole_free: load.whole_free,
        share_bucket: load.share_bucket,
        offline: load.offline,
        cordoned: load.cordoned,
        closed: load.closed,
        open_until: load.open_until,
        price_multiplier_permille: load.price_multiplier_permille,
        tier_class: load.tier_class,
        bronze_milli: load.bronze_milli,
        other_milli: load.other_milli,
        leases: Vec::new(),
        lease_work: Vec::new(),
    }
}

impl Matcher {
    /// Checks a job spec for contradictions a placement cannot fix.
    pub(crate) fn validate(&self, job: &JobSpec) -> Result<(), Unplaced> {
        let invalid = |reason: &str| {
            Err(Unplaced::InvalidJob {
                job: job.id,
                reason: reason.to_string(),
            })
        };
        if job.replicas == 0 || job.replicas > GANG_REPLICAS_MAX {
            return invalid(&format!("replicas must be 1..={GANG_REPLICAS_MAX}"));
        }
        match job.resources.gpu {
            GpuDemand::Whole { count } if count == 0 || count as usize > model::GPUS_PER_NODE_MAX => {
                return invalid(&format!("a replica takes 1..={} whole GPUs", model::GPUS_PER_NODE_MAX));
            }
            GpuDemand::Share { milli } if milli == 0 || milli >= GPU_MILLI_WHOLE => {
                return invalid("a GPU share is 1..999 milli-GPU; ask for whole GPUs above that");
            }
            GpuDemand::ComputeUnits { cu_milli: 0 } => return invalid("a compute-unit target must be positive"),
            _ => {}
        }
        if job.max_price.0 <= 0 {
            return invalid("the max price per GPU-hour must be positive");
        }
        if job.max_runtime_s == 0 {
            return invalid("the max runtime must be positive");
        }
        Ok(())
    }

    /// Plans a job on the current state without changing it.
    pub fn plan(&self, job: &JobSpec, now: Timestamp) -> Result<Placement, Unplaced> {
        self.validate(job)?;
        let context = JobContext::new(job, now);
        if job.replicas == 1 {
            self.plan_single(&context)
        } else {
            self.plan_gang(&context)
        }
    }

    /// The node ranges a job may use, in its tier's keying: per (region, model) with a region
    /// list, else per model.
    pub(crate) fn ranges_for<'a>(
        &'a self,
        context: &'a JobContext,
    ) -> impl Iterator<Item = (&'a Order, &'a RangeInfo)> + 'a {
        let tier = context.tier as usize;
        let max_price = context.job.max_price.0;
        let keying = self.index.keying(context.tier);
        let by_region: Box<dyn Iterator<Item = (&Order, &RangeInfo)>> = if context.job.regions.is_empty() {
            Box::new(keying.model_ranges.iter().map(move |range| (&keying.by_model, range)))
        } else {
            Box::new(context.job.regions.iter().flat_map(move |region| {
                keying
                    .region_ranges
                    .get(region.index())
                    .into_iter()
                    .flatten()
                    .map(move |range| (&keying.by_region_model, range))
            }))
        };
        by_region.filter(move |(_, range)| context.model_allowed(range.model) && range.ask_min[tier] <= max_price)
    }

    /// Whole GPUs a replica takes on this range's model.
    fn whole_for_range(&self, context: &JobContext, range: &RangeInfo) -> Option<u8> {
        match context.job.resources.gpu {
            GpuDemand::None | GpuDemand::Share { .. } => Some(0),
            GpuDemand::Whole { count } => Some(count),
            GpuDemand::ComputeUnits { cu_milli } => {
                let model_cu = GpuCatalog::embedded().spec(GpuModel(range.model)).cu_milli;
                u8::try_from(cu_milli.div_ceil(model_cu.max(1)))
                    .ok()
                    .filter(|count| *count <= range.gpu_count_max)
            }
        }
    }

    /// Calls `visit` with each node of a range that may have capacity for one replica, level
    /// by level, cheapest first within a level. `visit` says whether the node was feasible; a
    /// level stops after `per_level` feasible nodes.
    pub(crate) fn walk_levels(
        &self,
        order: &Order,
        range: &RangeInfo,
        context: &JobContext,
        per_level: usize,
        mut visit: impl FnMut(usize) -> bool,
    ) {
        let start = range.ranks.start as usize;
        let end = range.ranks.end as usize;
        let top = (range.gpu_count_max as usize).min(WHOLE_LEVELS - 1);
        let mut walk = |members: &mut dyn Iterator<Item = usize>| {
            let mut feasible = 0;
            for rank in members {
                if visit(order.nodes[rank] as usize) {
                    feasible += 1;
                    if feasible >= per_level {
                        break;
                    }
                }
            }
        };
        match context.job.resources.gpu {
            GpuDemand::Share { milli } => {
                let first_bucket = (milli / 100) as usize + 1;
                for bucket in first_bucket..SHARE_BUCKETS {
                    for set in order.share_sets(bucket) {
                        walk(&mut set.iter_range(start, end));
                    }
                }
                for level in 1..=top {
                    for set in order.whole_sets(level) {
                        walk(&mut set.iter_range(start, end));
                    }
                }
            }
            // CPU-only work is rare and may use full nodes: scan the range.
            GpuDemand::None => walk(&mut (start..end)),
            _ => {
                let Some(wanted) = self.whole_for_range(context, range) else {
                    return;
                };
                for level in (wanted as usize).max(1)..=top {
                    for set in order.whole_sets(level) {
                        walk(&mut set.iter_range(start, end));
                    }
                }
            }
        }
    }

    /// The capacity-level sets of a range a replica can use, each with the least fragmentation
    /// penalty (thousandths) any node in it scores, so the search can bound it.
    fn lanes<'a>(
        &self,
        order: &'a Order,
        range: &RangeInfo,
        context: &JobContext,
        mut lane: impl FnMut(&'a RankSet, crate::index::First, u64),
    ) {
        let config = &self.config;
        let top = (range.gpu_count_max as usize).min(WHOLE_LEVELS - 1);
        // A level equal to the range's largest node size holds only untouched nodes.
        let breaks = |level: usize, wanted: usize| {
            if level == top && level > wanted {
                config.whole_node_break_permille
            } else {
                0
            }
        };
        // Bronze beside gold or silver (or the reverse) pays the tier-mixing penalty.
        let mix = |class: usize| {
            let mixes = if context.tier == Tier::Bronze {
                class & 2 != 0
            } else {
                class & 1 != 0
            };
            if mixes { config.tier_mix_permille } else { 0 }
        };
        let range_id = order.range_of(range.ranks.start);
        let mut add = |share: bool, level: usize, penalty: u64| {
            let sets = if share {
                order.share_sets(level)
            } else {
                order.whole_sets(level)
            };
            for (class, set) in sets.iter().enumerate() {
                if let Some(first) = order.first_in_range(share, level * TIER_CLASSES + class, range_id) {
                    lane(set, first, penalty + mix(class));
                }
            }
        };
        match context.job.resources.gpu {
            GpuDemand::Share { milli } => {
                for bucket in (milli / 100) as usize + 1..SHARE_BUCKETS {
                    add(true, bucket, 0);
                }
                for level in 1..=top {
                    let penalty = config.split_gpu_permille
                        + (level as u64 - 1) * config.leftover_gpu_permille
                        + if top > 1 { breaks(level, 0) } else { 0 };
                    add(false, level, penalty);
                }
            }
            GpuDemand::None => {}
            _ => {
                if let Some(wanted) = self
                    .whole_for_range(context, range)
                    .filter(|wanted| (*wanted as usize) <= top)
                {
                    let wanted = (wanted as usize).max(1);
                    for level in wanted..=top {
                        add(
                            false,
                            level,
                            (level - wanted) as u64 * config.leftover_gpu_permille + breaks(level, wanted),
                        );
                    }
                }
            }
        }
    }

    /// A lower bound on a node's score for a tier, at any time, with a lane's least penalty;
    /// monotone along the lane's order. `ratio_permille` is the keying's ratio bound for the tier.
    fn bound(key: u64, ratio_permille: u64, penalty_permille: u64) -> u64 {
        let effective = key / 1000 * ratio_permille;
        effective.saturating_add(effective.saturating_mul(penalty_permille) / 1000)
    }

    /// Best-first search over the capacity indexes: one cursor per (range, level), popped by the
    /// lower bound of its next node's score, until no cursor can beat the runner-up found. Exact,
    /// and it touches only the nodes that could place first or second.
    fn plan_single(&self, context: &JobContext) -> Result<Placement, Unplaced> {
        if matches!(context.job.resources.gpu, GpuDemand::None) {
            return self.plan_single_scan(context);
        }
        // What a range's lanes share, once the range is opened.
        struct Opened<'a> {
            order: &'a Order,
            end: usize,
            /// One past the range's last lane in `waiting`.
            waiting_end: u32,
            /// Keys above this are over the price cap.
            key_max: u64,
            /// Filters, supersets of the ranks under the price cap, of those selling the tier
            /// over the reliability floor, and of those open for the job's runtime.
            filters: (&'a [u64], &'a [u64], &'a [u64]),
        }
        // A lane: a capacity set within an opened range, from `rank` on.
        #[derive(Clone, Copy)]
        struct Lane<'a> {
            bound: u64,
            set: &'a RankSet,
            rank: u32,
            penalty: u32,
            opened: u32,
        }
        // Heap entries with this bit set stand for a whole range whose lanes are not opened yet:
        // its bound is the range's lowest key, so ranges that cannot win are never searched.
        const RANGE: u32 = 1 << 31;
        // Heap entries with this bit set stand for a lane not started yet (an index into
        // `waiting`). An opened range's lanes wait side by side, and only the cheapest of them
        // is in the heap: most lanes can never beat the runner-up, and they cost one look, not
        // a heap entry.
        const LANE: u32 = 1 << 30;
        let max_price = context.job.max_price.0;
        let reliability_min = context.job.reliability_min_ppm;
        let tier = context.tier as usize;
        // A node whose reference ask is above this cannot meet the price cap in this tier.
        let tier_ratio = self.index.keying(context.tier).tier_ratio_permille[tier];
        let ratio = tier_ratio.max(1);
        let reference_ask_max = i64::try_from(i128::from(max_price) * 1000 / i128::from(ratio)).unwrap_or(i64::MAX);
        // The window filter holds at the clock's minute; with a stale clock every node is tried
        // (feasibility checks windows exactly either way).
        let window_runtime_s = context
            .window_until
            .filter(|_| self.clock_minute == Some(context.now.div_euclid(60)))
            .map(|_| i64::from(context.job.max_runtime_s));
        let mut opened: Vec<Opened> = Vec::with_capacity(8);
        let mut waiting: Vec<Lane> = Vec::with_capacity(64);
        let mut cursors: Vec<Lane> = Vec::with_capacity(16);
        let mut heap: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::with_capacity(32);
        let ranges: Vec<(&Order, &RangeInfo)> = self.ranges_for(context).collect();
        for (position, (order, range)) in ranges.iter().enumerate() {
            let lowest = order.entries[range.ranks.start as usize].key;
            if lowest <= range.key_max(reference_ask_max) {
                heap.push(Reverse((Self::bound(lowest, tier_ratio, 0), RANGE | position as u32)));
            }
        }
        // Moves the cheapest of `lanes` to the front.
        let cheapest_first = |lanes: &mut [Lane]| {
            if let Some(cheapest) = (0..lanes.len()).min_by_key(|&position| lanes[position].bound) {
                lanes.swap(0, cheapest);
            }
        };
        let mut best: Option<Fit> = None;
        let mut runner_up: Option<Fit> = None;
        while let Some(Reverse((bound, mut index))) = heap.pop() {
            if runner_up.is_some_and(|runner_up| bound > runner_up.score) {
                break;
            }
            if index & RANGE != 0 {
                let (order, range) = ranges[(index & !RANGE) as usize];
                let group_start = waiting.len();
                let key_max = range.key_max(reference_ask_max);
                let opened_index = opened.len() as u32;
                opened.push(Opened {
                    order,
                    end: range.ranks.end as usize,
                    waiting_end: 0,
                    key_max,
                    filters: (
                        order.ask_filter(range, reference_ask_max),
                        order.selling_filter(tier, reliability_min),
                        order.window_filter(window_runtime_s),
                    ),
                });
                self.lanes(order, range, context, |set, first, penalty| {
                    if first.key > key_max {
                        return;
                    }
                    waiting.push(Lane {
                        bound: Self::bound(first.key, tier_ratio, penalty),
                        set,
                        rank: first.rank,
                        penalty: u32::try_from(penalty).unwrap_or(u32::MAX),
                        opened: opened_index,
                    });
                });
                opened[opened_index as usize].waiting_end = waiting.len() as u32;
                let group = &mut waiting[group_start..];
                cheapest_first(group);
                if let Some(lane) = group.first() {
                    heap.push(Reverse((lane.bound, LANE | group_start as u32)));
                }
                continue;
            }
            if index & LANE != 0 {
                // Start the lane: it becomes a cursor, searched now; the cheapest of its
                // range's waiting lanes takes its place in the heap.
                let position = (index & !LANE) as usize;
                let lane = waiting[position];
                let group_end = opened[lane.opened as usize].waiting_end as usize;
                if position + 1 < group_end {
                    cheapest_first(&mut waiting[position + 1..group_end]);
                    heap.push(Reverse((waiting[position + 1].bound, LANE | (position as u32 + 1))));
                }
                index = cursors.len() as u32;
                cursors.push(lane);
            }
            let cursor = &mut cursors[index as usize];
            let range = &opened[cursor.opened as usize];
            let order = range.order;
            // The next member of the lane that may pass the static filters and the price cap.
            let next_after = |rank: usize| {
                cursor
                    .set
                    .next_masked(rank + 1, range.end, [range.filters.0, range.filters.1, range.filters.2])
                    .filter(|next| order.entries[*next].key <= range.key_max)
            };
            // Nodes over the price cap or under the reliability floor are passed over here,
            // without a trip through the heap.
            let mut rank = cursor.rank as usize;
            let mut skipped = false;
            let passes = |rank: usize| {
                let entry = &order.entries[rank];
                entry.reference_ask <= reference_ask_max
                    && entry.reliability_ppm >= reliability_min
                    && has_bit(range.filters.1, rank)
                    && has_bit(range.filters.2, rank)
            };
            while !passes(rank) {
                skipped = true;
                match next_after(rank) {
                    Some(next) => rank = next,
                    None => {
                        rank = usize::MAX;
                        break;
                    }
                }
            }
            if rank == usize::MAX {
                continue;
            }
            let penalty = u64::from(cursor.penalty);
            if skipped {
                cursor.rank = rank as u32;
                heap.push(Reverse((
                    Self::bound(order.entries[rank].key, tier_ratio, penalty),
                    index,
                )));
                continue;
            }
            let node = order.entries[rank].node as usize;
            if let Some(next) = next_after(rank) {
                cursor.rank = next as u32;
                heap.push(Reverse((
                    Self::bound(order.entries[next].key, tier_ratio, penalty),
                    index,
                )));
            }
            let Ok(fit) = self.fit_on(node, &self.loads[node], context) else {
                continue;
            };
            // A node can sit in a share bucket and a whole level at once.
            if best.is_some_and(|best| best.node == fit.node) || runner_up.is_some_and(|other| other.node == fit.node) {
                continue;
            }
            let key = |fit: &Fit| (fit.score, fit.node);
            if best.is_none_or(|best| key(&fit) < key(&best)) {
                runner_up = best;
                best = Some(fit);
            } else if runner_up.is_none_or(|runner_up| key(&fit) < key(&runner_up)) {
                runner_up = Some(fit);
            }
        }
        let winner = best.ok_or(Unplaced::NoFeasibleNode(context.job.id))?;
        Ok(self.placement(context, &[(winner, 0)], runner_up.as_ref()))
    }

    /// The plan an exhaustive scan of every node makes for a one-replica job (winner,
    /// runner-up and price): the reference the indexed search is tested against.
    #[doc(hidden)]
    pub fn plan_by_scan(&self, job: &JobSpec, now: Timestamp) -> Option<Placement> {
        let context = JobContext::new(job, now);
        let mut fits: Vec<Fit> = (0..self.nodes.len())
            .filter_map(|node| self.fit_on(node, &self.loads[node], &context).ok())
            .collect();
        fits.sort_unstable_by_key(|fit| (fit.score, fit.node));
        let winner = *fits.first()?;
        Some(self.placement(&context, &[(winner, 0)], fits.get(1)))
    }

    /// CPU-only work: a scan of the allowed ranges (rare; it may use nodes with no GPU free).
    fn plan_single_scan(&self, context: &JobContext) -> Result<Placement, Unplaced> {
        let mut candidates: Vec<Fit> = Vec::new();
        for (order, range) in self.ranges_for(context) {
            self.walk_levels(order, range, context, usize::MAX, |node| {
                match self.fit_on(node, &self.loads[node], context) {
                    Ok(fit) => {
                        candidates.push(fit);
                        true
                    }
                    Err(_) => false,
                }
            });
        }
        let winner = candidates
            .iter()
            .min_by_key(|fit| (fit.score, fit.node))
            .copied()
            .ok_or(Unplaced::NoFeasibleNode(context.job.id))?;
        let loser = candidates
            .iter()
            .filter(|fit| fit.node != winner.node)
            .min_by_key(|fit| (fit.effective, fit.node));
        Ok(self.placement(context, &[(winner, 0)], loser))
    }

    /// Turns chosen fits (with their replica numbers) into a placement at the uniform price.
    pub(crate) fn placement(&self, context: &JobContext, chosen: &[(Fit, u32)], loser: Option<&Fit>) -> Placement {
        let job = context.job;
        let leases = chosen
            .iter()
            .map(|(fit, replica)| self.lease_for(context, fit, *replica, self.price_for(fit, loser, job.max_price)))
            .collect();
        Placement {
            job: job.id,
            tier: job.tier,
            leases,
            clearing_price_per_cu_hour: loser.map(|loser| Micros(loser.effective.min(i64::MAX as u64) as i64)),
            preempt_at: chosen.iter().filter_map(|(fit, _)| fit.preempt_at).min(),
            checkpoint_interval_s: job.checkpoint_interval_s,
        }
    }

    pub(crate) fn lease_for(&self, context: &JobContext, fit: &Fit, replica: u32, price: Micros) -> Lease {
        let job = context.job;
        Lease {
            id: LeaseId(0),
            job: job.id,
            replica,
            node: NodeId(fit.node),
            gpu_mask: fit.gpu_mask,
            gpu_milli: fit.gpu_milli,
            cpu_milli: job.resources.cpu_milli,
            memory_mib: job.resources.memory_mib,
            epoch: 0,
            start: context.now,
            expected_end: context.now.saturating_add(i64::from(job.max_runtime_s)),
            price,
            state: LeaseState::Pending,
        }
    }

    /// The (k+1)-price converted to this winner's terms — the loser's ask scaled by the ratio of
    /// delivered compute (cu × reliability^α) — never below the winner's ask nor above the cap.
    pub(crate) fn price_for(&self, fit: &Fit, loser: Option<&Fit>, max_price: Micros) -> Micros {
        self.price_between(
            (fit.node, fit.ask),
            loser.map(|loser| (loser.node, loser.ask)),
            max_price,
        )
    }

    /// [`Matcher::price_for`] over (node, ask) pairs.
    pub(crate) fn price_between(
        &self,
        winner: (u32, Micros),
        loser: Option<(u32, Micros)>,
        max_price: Micros,
    ) -> Micros {
        let (winner_node, winner_ask) = winner;
        let Some((loser_node, loser_ask)) = loser else {
            return winner_ask;
        };
        let winner_statics = &self.statics[winner_node as usize];
        let loser_statics = &self.statics[loser_node as usize];
        let numerator = i128::from(loser_ask.0)
            * i128::from(winner_statics.cu_milli)
            * i128::from(winner_statics.reliability_weight_ppm);
        let denominator =
            i128::from(loser_statics.cu_milli.max(1)) * i128::from(loser_statics.reliability_weight_ppm.max(1));
        let converted = Micros(i64::try_from((numerator + denominator / 2) / denominator).unwrap_or(i64::MAX));
        converted.max(winner_ask).min(max_price.max(winner_ask))
    }

    /// Gangs: every candidate, grouped by the required topology domain; the cheapest domain
    /// that holds all replicas wins.
    fn plan_gang(&self, context: &JobContext) -> Result<Placement, Unplaced> {
        let job = context.job;
        let replicas = job.replicas;
        let mut buffers = self
            .gang_scratch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let GangScratch {
            marked,
            candidates,
            grouped,
            offsets,
            held,
        } = &mut *buffers;
        // The nodes to try, marked first and then visited in node order: memory order for the
        // node tables (a walk in rank order jumps all over them, and a cold walk was most of a
        // first gang plan's time), and a node in a share bucket and a whole level is tried once.
        marked.clear();
        marked.resize(self.nodes.len().div_ceil(64), 0);
        for (order, range) in self.ranges_for(context) {
            self.walk_levels(order, range, context, usize::MAX, |node| {
                set_bit(marked, node);
                true
            });
        }
        candidates.clear();
        for (word_index, &word) in marked.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let node = word_index * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let load = &self.loads[node];
                if let Ok(fit) = self.fit_on(node, load, context) {
                    let capacity = self.replica_capacity(node, load, context, replicas);
                    candidates.push((self.domain_of(node, job.topology), fit.score, node as u32, capacity));
                }
            }
        }
        // Group by domain with a counting sort (domain ids are dense), then cost each domain
        // that can hold the gang by its cheapest replicas: O(candidates) for whole-node replicas.
        let domains = self.domain_count(job.topology);
        offsets.clear();
        offsets.resize(domains + 1, 0);
        held.clear();
        held.resize(domains, 0);
        for candidate in candidates.iter() {
            offsets[candidate.0 as usize + 1] += 1;
            held[candidate.0 as usize] += u64::from(candidate.3);
        }
        for domain in 0..domains {
            offsets[domain + 1] += offsets[domain];
        }
        // Each domain's candidates in order, `offsets[domain]` serving as its cursor (it ends at
        // the domain's end, the next one's start), then shifted back to the starts.
        grouped.clear();
        grouped.resize(candidates.len(), (0, 0, 0, 0));
        for candidate in candidates.iter() {
            let domain = candidate.0 as usize;
            grouped[offsets[domain]] = *candidate;
            offsets[domain] += 1;
        }
        offsets.copy_within(0..domains, 1);
        offsets[0] = 0;
        let order_key = |candidate: &GangCandidate| (candidate.1, candidate.2);
        let wanted = replicas as usize;
        let mut best: Option<(u128, u64)> = None; // (cost, domain)
        let mut best_held = 0u32;
        for domain in 0..domains {
            best_held = best_held.max(held[domain].min(u64::from(u32::MAX)) as u32);
            if held[domain] < u64::from(replicas) {
                continue;
            }
            let group = &mut grouped[offsets[domain]..offsets[domain + 1]];
            let cost: u128 = if group.iter().all(|candidate| candidate.3 == 1) {
                if group.len() > wanted {
                    group.select_nth_unstable_by_key(wanted - 1, order_key);
                }
                group[..wanted].iter().map(|candidate| u128::from(candidate.1)).sum()
            } else {
                group.sort_unstable_by_key(order_key);
                let mut remaining = replicas;
                let mut cost = 0u128;
                for candidate in group.iter() {
                    let take = candidate.3.min(remaining);
                    cost += u128::from(candidate.1) * u128::from(take);
                    remaining -= take;
                    if remaining == 0 {
                        break;
                    }
                }
                cost
            };
            if best.is_none_or(|best| (cost, domain as u64) < best) {
                best = Some((cost, domain as u64));
            }
        }
        let Some((_, domain)) = best else {
            return Err(Unplaced::NoDomainFits {
                job: job.id,
                level: job.topology.name(),
                replicas,
                best: best_held,
            });
        };
        let group = &mut grouped[offsets[domain as usize]..offsets[domain as usize + 1]];
        // The chosen replicas in score order; the runner-up is the best candidate left out.
        group.sort_unstable_by_key(order_key);
        let (start, end) = (0, group.len());
        let candidates = &*group;
        let mut chosen: Vec<(Fit, u32)> = Vec::with_capacity(replicas as usize);
        let mut loser = None;
        for candidate in &candidates[start..end] {
            if chosen.len() as u32 == replicas {
                let node = candidate.2 as usize;
                loser = self.fit_on(node, &self.loads[node], context).ok();
                break;
            }
            let node = candidate.2 as usize;
            let mut scratch = light_copy(&self.loads[node]);
            while (chosen.len() as u32) < replicas {
                let Ok(fit) = self.fit_on(node, &scratch, context) else {
                    break;
                };
                let replica = chosen.len() as u32;
                let lease = self.lease_for(context, &fit, replica, Micros::ZERO);
                let applied = apply_usage(&mut scratch, &self.statics[node], &lease, true);
                debug_assert!(applied, "fit_on checked the capacity");
                chosen.push((fit, replica));
            }
        }
        assert_eq!(
            chosen.len() as u32,
            replicas,
            "the domain was counted to hold every replica"
        );
        Ok(self.placement(context, &chosen, loser.as_ref()))
    }

    /// How many domains a topology level has (their ids are dense).
    pub(crate) fn domain_count(&self, level: TopologyLevel) -> usize {
        match level {
            TopologyLevel::Node => self.nodes.len(),
            TopologyLevel::Nvlink => self.topology.nvlink_domains.len(),
            TopologyLevel::Fabric => self.topology.fabrics.len(),
            TopologyLevel::Site => self.topology.sites.len(),
            TopologyLevel::Region => self.topology.regions.len(),
            TopologyLevel::Any => 1,
        }
    }

    /// How many replicas (up to `limit`) fit on a node now.
    pub(crate) fn replica_capacity(&self, node: usize, load: &NodeLoad, context: &JobContext, limit: u32) -> u32 {
        let statics = &self.statics[node];
        let resources = &context.job.resources;
        let by_cpu = (statics.cpu_milli - load.cpu_used)
            .checked_div(resources.cpu_milli)
            .unwrap_or(u32::MAX);
        let by_memory = (statics.memory_mib - load.memory_used)
            .checked_div(resources.memory_mib)
            .map_or(u32::MAX, |count| count.min(u64::from(u32::MAX)) as u32);
        let by_gpu = match context.job.resources.gpu {
            GpuDemand::None => u32::MAX,
            GpuDemand::Share { milli } => load.gpu_used_milli[..statics.gpu_count as usize]
                .iter()
                .map(|used| u32::from((GPU_MILLI_WHOLE - used) / milli))
                .sum(),
            _ => match context.whole_gpus(statics) {
                Some(wanted) if wanted > 0 => u32::from(load.whole_free) / u32::from(wanted),
                _ => 0,
            },
        };
        by_cpu.min(by_memory).min(by_gpu).min(limit)
    }

    /// The id of the topology domain at `level` that holds a node.
    pub(crate) fn domain_of(&self, node: usize, level: TopologyLevel) -> u64 {
        let statics = &self.statics[node];
        match level {
            TopologyLevel::Node => node as u64,
            TopologyLevel::Nvlink => u64::from(statics.nvlink),
            TopologyLevel::Fabric => u64::from(statics.fabric),
            TopologyLevel::Site => u64::from(statics.site),
            TopologyLevel::Region => u64::from(statics.region),
            TopologyLevel::Any => 0,
        }
    }
}
