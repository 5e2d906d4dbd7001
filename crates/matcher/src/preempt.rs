//! Preemption lanes and gang repair. Gold and silver work that does not fit may displace
//! bronze work, never each other: on each node the bronze leases that lose the least work
//! (GPU-seconds since their last checkpoint) go first, and a gang takes the domain whose
//! victims lose the least in total. Gang repair replaces only the lost replicas of a running
//! gang, as close to the survivors as the topology allows.

use model::{JobId, JobSpec, Lease, LeaseId, NodeId, Tier, Timestamp, TopologyLevel};

use crate::fit::{Fit, JobContext};
use crate::search::light_copy;
use crate::state::{LeaseWork, Matcher, NodeLoad, apply_usage, prefetch};
use crate::{Placement, Unplaced};

/// A lease to be preempted: SIGTERM now, kill after `grace_s`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    pub lease: LeaseId,
    pub job: JobId,
    pub tier: Tier,
    pub node: NodeId,
    pub gpus: u32,
    /// Work lost: GPU-seconds since the victim's last checkpoint (or its start).
    pub lost_gpu_seconds: u64,
    pub grace_s: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PreemptionPlan {
    pub placement: Placement,
    pub victims: Vec<Victim>,
}

/// Buffers a fabric-level preemption plan reuses from fabric to fabric and plan to plan: one
/// fabric's slots and their keys (lost work, score, node, position).
#[derive(Default)]
pub(crate) struct PreemptScratch {
    slots: Vec<Slot>,
    keys: Vec<(u64, u64, u32, u32)>,
}

/// How many nodes ahead a scan starts fetching a node's lease costs: far enough for a memory
/// access (~100 ns) to finish while the nodes between are costed, near enough to stay in cache.
const PREFETCH_AHEAD: usize = 8;

/// One replica's place on a node, with the victims it needs.
#[derive(Clone, Debug)]
struct Slot {
    domain: u64,
    /// Topology distance from where the lost replica ran (repair only; 0 otherwise).
    distance: u8,
    lost_gpu_seconds: u64,
    score: u64,
    node: u32,
    /// Position among the node's slots: slot i is valid only together with slots 0..i.
    sequence: u32,
    fit: Fit,
    victims: Vec<u32>,
    /// Every lease on the node is a victim (then `victims` is left empty, to save a copy).
    all_leases: bool,
}

/// How a repair slot ranks, least first: (distance from the lost replica, evicts anyone, work
/// lost, score, node).
type RepairRank = (u8, bool, u64, u64, u32);

/// The search for one lost replica's replacement: where it ran, and the best slot so far.
struct RepairSearch<'a> {
    context: &'a JobContext<'a>,
    /// The survivors' domain at the job's topology level, if any survive.
    anchor: Option<u64>,
    lost_fabric: u32,
    lost_nvlink: u32,
    /// The best slot so far, with its rank.
    best: Option<(RepairRank, Slot)>,
    /// The slots of the node being tried (one at most), in a buffer reused from node to node.
    found: Vec<Slot>,
}

impl Matcher {
    fn slot_victims<'a>(&'a self, slot: &'a Slot) -> &'a [u32] {
        if slot.all_leases {
            &self.loads[slot.node as usize].leases
        } else {
            &slot.victims
        }
    }

    /// Starts fetching what [`Matcher::node_slots`] reads of `node` beyond its load: the costs of
    /// its leases, in their own buffer. Called [`PREFETCH_AHEAD`] nodes before the node is costed.
    fn prefetch_costs(&self, node: usize) {
        prefetch(self.loads[node].lease_work.as_ptr());
    }

    /// [`Matcher::node_slots`] of each of `nodes` in turn, fetching ahead.
    fn nodes_slots(
        &self,
        nodes: impl Iterator<Item = usize> + Clone,
        context: &JobContext,
        limit: u32,
        now: Timestamp,
        out: &mut Vec<Slot>,
    ) {
        let mut ahead = nodes.clone().skip(PREFETCH_AHEAD);
        for node in nodes {
            if let Some(next) = ahead.next() {
                self.prefetch_costs(next);
            }
            self.node_slots(node, context, limit, now, out, 0);
        }
    }

    /// GPU-seconds a lease loses if stopped now.
    fn lost_work(&self, slot: u32, now: Timestamp) -> u64 {
        let entry = &self.leases[slot as usize];
        LeaseWork {
            start: entry.lease.start,
            checkpoint_interval_s: entry.checkpoint_interval_s,
            gpu_milli_total: entry.lease.gpu_milli_total(),
        }
        .lost_gpu_seconds(now)
    }

    /// The replica places a node offers to a job, evicting bronze leases (least lost work first)
    /// where free capacity is not enough, up to `limit` replicas.
    fn node_slots(
        &self,
        node: usize,
        context: &JobContext,
        limit: u32,
        now: Timestamp,
        out: &mut Vec<Slot>,
        distance: u8,
    ) {
        let load = &self.loads[node];
        let statics = &self.statics[node];
        // Non-bronze work holds at least this many GPUs: if the rest cannot make a replica, skip.
        let held_by_others = load.other_milli.div_ceil(1000);
        let wanted = context.whole_gpus(statics).unwrap_or(0);
        if wanted > 0 && u32::from(statics.gpu_count) < held_by_others + u32::from(wanted) {
            return;
        }
        // A replica that needs every GPU of a node holding only bronze: all of it goes, at once
        // (`fit_on` runs the static checks).
        if wanted == statics.gpu_count && limit >= 1 && load.other_milli == 0 && !load.leases.is_empty() {
            let empty = NodeLoad {
                offline: load.offline,
                cordoned: load.cordoned,
                closed: load.closed,
                ..NodeLoad::default()
            };
            if let Ok(fit) = self.fit_on(node, &empty, context) {
                let lost = load.lease_work.iter().map(|work| work.lost_gpu_seconds(now)).sum();
                out.push(Slot {
                    domain: self.domain_of(node, context.job.topology),
                    distance,
                    lost_gpu_seconds: lost,
                    score: fit.score,
                    node: node as u32,
                    sequence: 0,
                    fit,
                    victims: Vec::new(),
                    all_leases: true,
                });
            }
            return;
        }
        if self.static_check(node, context).is_err() {
            return;
        }
        let mut bronze: Vec<(u64, u32)> = load
            .leases
            .iter()
            .filter(|slot| self.leases[**slot as usize].tier == Tier::Bronze)
            .map(|slot| (self.lost_work(*slot, now), *slot))
            .collect();
        let mut scratch: NodeLoad = light_copy(load);
        if bronze.is_empty() && self.fit_on(node, &scratch, context).is_err() {
            return;
        }
        bronze.sort_unstable();
        let mut evicted: Vec<u32> = Vec::new();
        let mut next_victim = 0;
        let mut placed = 0;
        let mut lost_so_far = 0u64;
        let domain = self.domain_of(node, context.job.topology);
        while placed < limit {
            match self.fit_on(node, &scratch, context) {
                Ok(fit) => {
                    let lease = self.lease_for(context, &fit, 0, fit.ask);
                    apply_usage(&mut scratch, &self.statics[node], &lease, true);
                    lost_so_far += evicted.iter().map(|slot| self.lost_work(*slot, now)).sum::<u64>();
                    let lost = lost_so_far;
                    out.push(Slot {
                        domain,
                        distance,
                        lost_gpu_seconds: lost,
                        score: fit.score,
                        node: node as u32,
                        sequence: placed,
                        fit,
                        victims: std::mem::take(&mut evicted),
                        all_leases: false,
                    });
                    placed += 1;
                }
                Err(_) if next_victim < bronze.len() => {
                    let slot = bronze[next_victim].1;
                    next_victim += 1;
                    let released = apply_usage(
                        &mut scratch,
                        &self.statics[node],
                        &self.leases[slot as usize].lease,
                        false,
                    );
                    debug_assert!(released, "a node's leases are in its load");
                    evicted.push(slot);
                }
                Err(_) => break,
            }
        }
    }

    /// Plans a gold or silver job, preempting bronze work if it does not fit as things are.
    pub fn plan_preemption(&self, job: &JobSpec, now: Timestamp) -> Result<PreemptionPlan, Unplaced> {
        self.plan_preemption_with(job, now, true)
    }

    /// The plan [`Matcher::plan_preemption`] makes, found by gathering every node's slots and
    /// sorting them by domain whatever the level: the reference the fabric-by-fabric path is
    /// tested against.
    #[doc(hidden)]
    pub fn plan_preemption_by_scan(&self, job: &JobSpec, now: Timestamp) -> Result<PreemptionPlan, Unplaced> {
        self.plan_preemption_with(job, now, false)
    }

    fn plan_preemption_with(&self, job: &JobSpec, now: Timestamp, by_fabric: bool) -> Result<PreemptionPlan, Unplaced> {
        self.validate(job)?;
        if job.tier == Tier::Bronze {
            return Err(Unplaced::InvalidJob {
                job: job.id,
                reason: "bronze work never preempts".into(),
            });
        }
        // A gang's scan below finds a placement without victims too when one exists (it loses
        // no work); a single replica first tries the cheap indexed path.
        if job.replicas == 1
            && let Ok(placement) = self.plan(job, now)
        {
            return Ok(PreemptionPlan {
                placement,
                victims: Vec::new(),
            });
        }
        let context = JobContext::new(job, now);
        if by_fabric && job.topology == TopologyLevel::Fabric {
            return self.plan_preemption_by_fabric(&context, now);
        }
        // Every node, in memory order (feasibility checks region, model and price).
        let mut slots = Vec::with_capacity(self.nodes.len() / 4);
        self.nodes_slots(0..self.nodes.len(), &context, job.replicas, now, &mut slots);
        let chosen = choose_domain(&slots, job.replicas).map_err(|best| Unplaced::NoDomainFits {
            job: job.id,
            level: job.topology.name(),
            replicas: job.replicas,
            best,
        })?;
        Ok(self.plan_from_slots(&context, &slots, &chosen, now))
    }

    /// A fabric-level plan, one fabric at a time: each fabric's slots are gathered into a
    /// reused buffer and the cheapest `replicas` of them selected, not sorted; only the winning
    /// fabric's slots are gathered again to build the plan. The same choice as [`choose_domain`]
    /// over every node (fabric ids are the domain ids, and each fabric lists its nodes in node
    /// order), without a fleet-sized buffer or sort.
    fn plan_preemption_by_fabric(&self, context: &JobContext, now: Timestamp) -> Result<PreemptionPlan, Unplaced> {
        let job = context.job;
        let replicas = job.replicas as usize;
        let mut scratch = self
            .preempt_scratch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let PreemptScratch { slots, keys } = &mut *scratch;
        let fabrics = self.fabric_starts.len().saturating_sub(1);
        let mut best: Option<((u128, u128, u64), u32)> = None;
        let mut most_held = 0usize;
        for fabric in 0..fabrics as u32 {
            slots.clear();
            let members = self.fabric_members(fabric).iter().map(|node| *node as usize);
            self.nodes_slots(members, context, job.replicas, now, slots);
            most_held = most_held.max(slots.len());
            if slots.len() < replicas {
                continue;
            }
            let (lost, score) = cheapest_slots(slots, replicas, keys);
            let key = (lost, score, u64::from(fabric));
            if best.is_none_or(|(best_key, _)| key < best_key) {
                best = Some((key, fabric));
            }
        }
        let Some((_, fabric)) = best else {
            return Err(Unplaced::NoDomainFits {
                job: job.id,
                level: job.topology.name(),
                replicas: job.replicas,
                best: u32::try_from(most_held).unwrap_or(u32::MAX),
            });
        };
        slots.clear();
        let members = self.fabric_members(fabric).iter().map(|node| *node as usize);
        self.nodes_slots(members, context, job.replicas, now, slots);
        cheapest_slots(slots, replicas, keys);
        let chosen: Vec<usize> = keys[..replicas].iter().map(|key| key.3 as usize).collect();
        Ok(self.plan_from_slots(context, slots, &chosen, now))
    }

    /// The plan of the chosen slots (positions in `slots`).
    fn plan_from_slots(
        &self,
        context: &JobContext,
        slots: &[Slot],
        chosen: &[usize],
        now: Timestamp,
    ) -> PreemptionPlan {
        // A node's later slots are valid only with its earlier ones: take each chosen node's first slots.
        let mut chosen_nodes: Vec<u32> = chosen.iter().map(|position| slots[*position].node).collect();
        chosen_nodes.sort_unstable();
        let mut per_node: Vec<(u32, u32)> = Vec::new();
        for node in chosen_nodes {
            match per_node.last_mut() {
                Some(entry) if entry.0 == node => entry.1 += 1,
                _ => per_node.push((node, 1)),
            }
        }
        let mut selected: Vec<Slot> = slots
            .iter()
            .filter(|slot| {
                per_node
                    .binary_search_by_key(&slot.node, |(node, _)| *node)
                    .is_ok_and(|position| slot.sequence < per_node[position].1)
            })
            .cloned()
            .collect();
        selected.sort_by_key(|slot| (slot.lost_gpu_seconds, slot.score, slot.node, slot.sequence));
        self.preemption_plan(context, &selected, now)
    }

    fn preemption_plan(&self, context: &JobContext, slots: &[Slot], now: Timestamp) -> PreemptionPlan {
        let fits: Vec<(Fit, u32)> = slots
            .iter()
            .enumerate()
            .map(|(index, slot)| (slot.fit, index as u32))
            .collect();
        let placement = self.placement(context, &fits, None);
        let mut victims: Vec<Victim> = slots
            .iter()
            .flat_map(|slot| self.slot_victims(slot).iter())
            .map(|slot| {
                let entry = &self.leases[*slot as usize];
                Victim {
                    lease: entry.lease.id,
                    job: entry.lease.job,
                    tier: entry.tier,
                    node: entry.lease.node,
                    gpus: entry.lease.gpu_count(),
                    lost_gpu_seconds: self.lost_work(*slot, now),
                    grace_s: self.config.preemption_grace_s,
                }
            })
            .collect();
        victims.sort_by_key(|victim| victim.lease);
        victims.dedup_by_key(|victim| victim.lease);
        PreemptionPlan { placement, victims }
    }

    /// Applies a preemption plan: releases the victims, then commits the placement. (The
    /// coordinator gives victims their grace period before their capacity is reused.)
    pub fn commit_preemption(&mut self, plan: &PreemptionPlan) -> Result<Vec<Lease>, crate::CommitError> {
        for victim in &plan.victims {
            self.release_lease(victim.lease);
        }
        self.commit_inner(&plan.placement, false)
    }

    /// Replaces the lost replicas of a running gang (their leases already ended, e.g. by
    /// [`Matcher::set_node_offline`]): same NVLink domain as before if a spare exists, then
    /// the same fabric, then anywhere the job's topology level allows around the survivors;
    /// bronze is preempted when nothing is free.
    pub fn plan_repair(&self, job: &JobSpec, lost: &[Lease], now: Timestamp) -> Result<PreemptionPlan, Unplaced> {
        self.validate(job)?;
        let context = JobContext::new(job, now);
        // The survivors' domain: that of the first survivor in replica order.
        let anchor = self
            .jobs
            .get(&job.id)
            .and_then(|record| {
                record
                    .leases
                    .iter()
                    .filter_map(|id| self.lease(*id))
                    .min_by_key(|lease| (lease.replica, lease.id))
            })
            .map(|lease| self.domain_of(lease.node.index(), job.topology));
        let mut chosen: Vec<Slot> = Vec::new();
        let mut used: Vec<(usize, NodeLoad)> = Vec::new();
        for lost_lease in lost {
            let lost_node = &self.statics[lost_lease.node.index()];
            let mut search = RepairSearch {
                context: &context,
                anchor,
                lost_fabric: lost_node.fabric,
                lost_nvlink: lost_node.nvlink,
                best: None,
                found: Vec::new(),
            };
            // Nearest first: the lost node's fabric holds every candidate at distance 0 or 1,
            // and any of them ranks before every farther one. (Nodes of the fabric outside the
            // job's index ranges fail the static checks there: region, model, price.)
            for &node in self.fabric_members(lost_node.fabric) {
                self.try_repair_node(node as usize, &mut search, &used, &chosen);
            }
            if search.best.is_none() {
                for (order, range) in self.ranges_for(&context) {
                    for rank in range.ranks.clone() {
                        let node = order.nodes[rank as usize] as usize;
                        if self.statics[node].fabric != lost_node.fabric {
                            self.try_repair_node(node, &mut search, &used, &chosen);
                        }
                    }
                }
            }
            let (_, best) = search.best.ok_or(Unplaced::NoFeasibleNode(job.id))?;
            let node = best.node as usize;
            let position = match used.iter().position(|(index, _)| *index == node) {
                Some(position) => position,
                None => {
                    used.push((node, light_copy(&self.loads[node])));
                    used.len() - 1
                }
            };
            for victim in self.slot_victims(&best) {
                apply_usage(
                    &mut used[position].1,
                    &self.statics[node],
                    &self.leases[*victim as usize].lease,
                    false,
                );
            }
            let lease = self.lease_for(&context, &best.fit, lost_lease.replica, best.fit.ask);
            apply_usage(&mut used[position].1, &self.statics[node], &lease, true);
            chosen.push(best);
        }
        let mut plan = self.preemption_plan(&context, &chosen, now);
        for (lease, lost_lease) in plan.placement.leases.iter_mut().zip(lost) {
            lease.replica = lost_lease.replica;
        }
        Ok(plan)
    }

    /// Tries `node` as the replacement of one lost replica, on top of what the plan already
    /// `used`, and keeps its slot if it ranks first so far. A slot whose victims an earlier
    /// replacement of the plan already evicts is passed over.
    fn try_repair_node(&self, node: usize, search: &mut RepairSearch, used: &[(usize, NodeLoad)], chosen: &[Slot]) {
        let statics = &self.statics[node];
        let distance = if statics.nvlink == search.lost_nvlink {
            0
        } else if statics.fabric == search.lost_fabric {
            1
        } else {
            2
        };
        // Distance ranks first: a node farther than the best so far cannot win.
        if search.best.as_ref().is_some_and(|(key, _)| key.0 < distance) {
            return;
        }
        let topology = search.context.job.topology;
        if search
            .anchor
            .is_some_and(|domain| self.domain_of(node, topology) != domain)
        {
            return;
        }
        if let Some((_, scratch)) = used.iter().find(|(index, _)| *index == node) {
            if let Ok(fit) = self.fit_on(node, scratch, search.context) {
                search.found.push(Slot {
                    domain: self.domain_of(node, topology),
                    distance,
                    lost_gpu_seconds: 0,
                    score: fit.score,
                    node: node as u32,
                    sequence: 0,
                    fit,
                    victims: Vec::new(),
                    all_leases: false,
                });
            }
        } else {
            self.node_slots(node, search.context, 1, search.context.now, &mut search.found, distance);
        }
        for slot in search.found.drain(..) {
            let victims = self.slot_victims(&slot);
            if victims
                .iter()
                .any(|victim| chosen.iter().any(|other| self.slot_victims(other).contains(victim)))
            {
                continue;
            }
            let key: RepairRank = (
                slot.distance,
                !victims.is_empty(),
                slot.lost_gpu_seconds,
                slot.score,
                slot.node,
            );
            if search.best.as_ref().is_none_or(|(best, _)| key < *best) {
                search.best = Some((key, slot));
            }
        }
    }

    /// Applies a repair plan: releases the victims and adds the replacement leases to the job.
    pub fn commit_repair(&mut self, plan: &PreemptionPlan) -> Result<Vec<Lease>, crate::CommitError> {
        for victim in &plan.victims {
            self.release_lease(victim.lease);
        }
        self.commit_inner(&plan.placement, true)
    }
}

/// Puts the keys of `slots`' cheapest `replicas` slots (by lost work, score, node, position) in
/// `keys[..replicas]`, in no particular order, and returns their total lost work and score.
fn cheapest_slots(slots: &[Slot], replicas: usize, keys: &mut Vec<(u64, u64, u32, u32)>) -> (u128, u128) {
    keys.clear();
    keys.extend(
        slots
            .iter()
            .enumerate()
            .map(|(position, slot)| (slot.lost_gpu_seconds, slot.score, slot.node, position as u32)),
    );
    if keys.len() > replicas {
        keys.select_nth_unstable(replicas - 1);
    }
    let taken = &keys[..replicas];
    (
        taken.iter().map(|key| u128::from(key.0)).sum(),
        taken.iter().map(|key| u128::from(key.1)).sum(),
    )
}

/// Picks the domain whose cheapest `replicas` slots lose the least work (then cost less) and
/// returns those slots' positions; or, if no domain holds them all, the most one holds. Sorts
/// small keys, not the slots.
fn choose_domain(slots: &[Slot], replicas: u32) -> Result<Vec<usize>, u32> {
    let mut keys: Vec<(u64, u64, u64, u32, u32)> = slots
        .iter()
        .enumerate()
        .map(|(position, slot)| {
            (
                slot.domain,
                slot.lost_gpu_seconds,
                slot.score,
                slot.node,
                position as u32,
            )
        })
        .collect();
    keys.sort_unstable();
    let replicas = replicas as usize;
    let mut best: Option<((u128, u128, u64), usize)> = None;
    let mut most_held = 0usize;
    let mut start = 0;
    for group in keys.chunk_by(|a, b| a.0 == b.0) {
        let domain = group[0].0;
        most_held = most_held.max(group.len());
        if group.len() >= replicas {
            let taken = &group[..replicas];
            let lost: u128 = taken.iter().map(|key| u128::from(key.1)).sum();
            let score: u128 = taken.iter().map(|key| u128::from(key.2)).sum();
            if best.is_none_or(|(best_key, _)| (lost, score, domain) < best_key) {
                best = Some(((lost, score, domain), start));
            }
        }
        start += group.len();
    }
    match best {
        Some((_, start)) => Ok(keys[start..start + replicas].iter().map(|key| key.4 as usize).collect()),
        None => Err(u32::try_from(most_held).unwrap_or(u32::MAX)),
    }
}
