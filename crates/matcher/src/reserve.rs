//! Backfill with reservations. A reservation holds whole GPUs on chosen nodes from a start
//! time (a gold booking, or the oldest starving gang's shadow time). Other work may use those
//! GPUs before the start only if its max runtime ends first; bronze may use them anyway and is
//! marked to be preempted when the reservation starts.

use model::{GPU_MILLI_WHOLE, JobId, JobSpec, Tier, Timestamp};

use crate::Unplaced;
use crate::fit::{JobContext, Reason};
use crate::state::{FixedMap, Matcher, NodeLoad};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReservationId(pub u64);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: ReservationId,
    pub job: JobId,
    pub start: Timestamp,
    pub end: Timestamp,
    /// (node, whole GPUs held there)
    pub nodes: Vec<(u32, u8)>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Reservations {
    list: Vec<Option<Reservation>>,
    per_node: Vec<Vec<u32>>,
    by_job: FixedMap<JobId, u32>,
    /// Jobs that run inside a reservation → the reservation's job id.
    members: FixedMap<JobId, JobId>,
}

/// A booking ahead the matcher made: the reservation and what each of its nodes' GPU-hours cost
/// (`prices[i]` goes with `reservation.nodes[i]`), set by the uniform (k+1)-price auction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Booking {
    pub reservation: Reservation,
    pub prices: Vec<model::Micros>,
}

/// One reservable replica slot: (domain, time it is free, score, node, ask at the start).
type Slot = (u64, Timestamp, u64, u32, model::Micros);

impl Reservations {
    pub fn new(nodes: usize) -> Reservations {
        Reservations {
            list: Vec::new(),
            per_node: vec![Vec::new(); nodes],
            by_job: FixedMap::default(),
            members: FixedMap::default(),
        }
    }

    /// Drops a job's reservation and forgets the jobs inside it.
    pub fn remove_job(&mut self, job: JobId) {
        if self.by_job.is_empty() || !self.by_job.contains_key(&job) {
            return;
        }
        self.members.retain(|_, reservation| *reservation != job);
        self.remove_slot(job);
    }

    /// Drops a job's reservation; the jobs inside it stay known (it is being replaced).
    fn remove_slot(&mut self, job: JobId) {
        let Some(slot) = self.by_job.remove(&job) else { return };
        if let Some(reservation) = self.list[slot as usize].take() {
            for (node, _) in reservation.nodes {
                self.per_node[node as usize].retain(|entry| *entry != slot);
            }
        }
    }

    pub fn on_node(&self, node: usize) -> impl Iterator<Item = &Reservation> {
        self.per_node[node]
            .iter()
            .filter_map(|slot| self.list[*slot as usize].as_ref())
    }

    pub fn all(&self) -> impl Iterator<Item = &Reservation> {
        self.list.iter().flatten()
    }

    pub fn get(&self, job: JobId) -> Option<&Reservation> {
        self.by_job
            .get(&job)
            .and_then(|slot| self.list[*slot as usize].as_ref())
    }

    /// Whole GPUs `reservation` holds on the node (0 when it holds none there).
    pub fn held(&self, reservation: JobId, node: usize) -> u8 {
        self.get(reservation).map_or(0, |reservation| {
            reservation
                .nodes
                .iter()
                .find(|(entry, _)| *entry as usize == node)
                .map_or(0, |(_, gpus)| *gpus)
        })
    }

    fn insert(&mut self, reservation: Reservation) {
        self.remove_slot(reservation.job);
        let slot = self.list.len() as u32;
        for (node, _) in &reservation.nodes {
            self.per_node[*node as usize].push(slot);
        }
        self.by_job.insert(reservation.job, slot);
        self.list.push(Some(reservation));
    }
}

impl Matcher {
    /// Whether placing `whole_taken` GPUs of this job on the node breaks a reservation:
    /// `Ok(None)` if not, `Ok(Some(start))` for bronze that must leave at `start`, `Err` otherwise.
    pub(crate) fn reservation_conflict(
        &self,
        node: usize,
        load: &NodeLoad,
        context: &JobContext,
        whole_taken: u8,
    ) -> Result<Option<Timestamp>, Reason> {
        // Most of the time nothing is reserved anywhere: skip the per-node lists entirely.
        if self.reservations.by_job.is_empty() || self.reservations.per_node[node].is_empty() {
            return Ok(None);
        }
        let gpu_count = self.statics[node].gpu_count as usize;
        let whole_free_in = |load: &NodeLoad| {
            load.gpu_used_milli[..gpu_count]
                .iter()
                .filter(|milli| **milli == 0)
                .count() as u32
        };
        let whole_free = whole_free_in(load);
        let inside = context.job.reservation;
        // GPUs of its own booking a job inside one may still take here (none for other work).
        let mut own_left = 0u32;
        if let Some(own) = inside {
            // A job inside a booking takes no more GPUs here than the booking holds, less what
            // its other jobs (and this plan's earlier replicas) use.
            let held = u32::from(self.reservations.held(own, node));
            let used = self.reservation_use(own, node) + whole_free_in(&self.loads[node]).saturating_sub(whole_free);
            if used + u32::from(whole_taken) > held {
                return Err(Reason::Reserved);
            }
            own_left = held - used;
        }
        let end = context.now.saturating_add(i64::from(context.job.max_runtime_s));
        let mut reserved = 0u32;
        let mut earliest: Option<Timestamp> = None;
        for reservation in self.reservations.on_node(node) {
            if reservation.job == context.job.id
                || Some(reservation.job) == inside
                || reservation.end <= context.now
                || reservation.start >= end
            {
                continue;
            }
            let held = reservation
                .nodes
                .iter()
                .find(|(entry, _)| *entry as usize == node)
                .map_or(0, |(_, gpus)| u32::from(*gpus));
            // GPUs the booking's own jobs already run on are not free to count against it.
            reserved += held.saturating_sub(self.reservation_use(reservation.job, node));
            earliest = Some(earliest.map_or(reservation.start, |start: Timestamp| start.min(reservation.start)));
        }
        // A job inside a booking takes from its booking's share, so other bookings are weighed
        // against the free GPUs beside that share; other work takes from the free pool.
        let left = if inside.is_some() {
            whole_free.saturating_sub(own_left)
        } else {
            whole_free.saturating_sub(u32::from(whole_taken))
        };
        if reserved == 0 || left >= reserved {
            return Ok(None);
        }
        if context.job.tier == Tier::Bronze {
            Ok(earliest)
        } else {
            Err(Reason::Reserved)
        }
    }

    /// Whole GPUs the jobs running inside `reservation` use on the node.
    fn reservation_use(&self, reservation: JobId, node: usize) -> u32 {
        if self.reservations.members.is_empty() {
            return 0;
        }
        self.loads[node]
            .leases
            .iter()
            .map(|slot| &self.leases[*slot as usize])
            .filter(|entry| self.reservations.members.get(&entry.lease.job) == Some(&reservation))
            .map(|entry| entry.lease.gpu_mask.count_ones())
            .sum()
    }

    /// Reserves whole GPUs for a job at the earliest time not before `not_before` when a
    /// topology domain can hold all its replicas, counting the expected ends of non-bronze
    /// leases (bronze gives way). A node holds one reservation at a time. Returns the
    /// reservation and its start.
    pub fn reserve(&mut self, job: &JobSpec, now: Timestamp, not_before: Timestamp) -> Result<Reservation, Unplaced> {
        self.validate(job)?;
        let slots = self.reservable_slots(job, now, not_before);
        let (time, first) = self.choose_slots(job, &slots)?;
        let reservation = self.reservation_of(job, time, &slots[first..first + job.replicas as usize]);
        self.reservations.insert(reservation.clone());
        Ok(reservation)
    }

    /// Books a job's shape ahead (a booking's GPUs as one-GPU replicas, say): whole GPUs free
    /// from exactly `start` for the job's max runtime, on nodes whose owners sell the job's tier
    /// then and whose windows cover it, at or under its price cap. Non-bronze leases count until
    /// their expected ends; bronze gives way. The price is the auction's: each winner is paid the
    /// first losing slot's ask converted to its terms (never below its own ask, never above the
    /// cap). Refused with the matcher's account when too few GPUs fit.
    pub fn book(&mut self, job: &JobSpec, now: Timestamp, start: Timestamp) -> Result<Booking, Unplaced> {
        self.validate(job)?;
        let mut slots = self.reservable_slots(job, now, start);
        slots.retain(|slot| slot.1 <= start);
        let (_, first) = self.choose_slots(job, &slots)?;
        let taken = first..first + job.replicas as usize;
        let chosen = &slots[taken.clone()];
        let reservation = self.reservation_of(job, start, chosen);
        // The cheapest slot not taken (by the ranking's score) sets the price.
        let loser = slots
            .iter()
            .enumerate()
            .filter(|(index, _)| !taken.contains(index))
            .map(|(_, slot)| slot)
            .min_by_key(|slot| (slot.2, slot.3));
        let prices = reservation
            .nodes
            .iter()
            .map(|(node, _)| {
                let ask = chosen
                    .iter()
                    .find(|slot| slot.3 == *node)
                    .map_or(job.max_price, |slot| slot.4);
                self.price_between((*node, ask), loser.map(|slot| (slot.3, slot.4)), job.max_price)
            })
            .collect();
        self.reservations.insert(reservation.clone());
        Ok(Booking { reservation, prices })
    }

    /// Puts back a reservation the store kept (a view rebuilt): the same nodes and times.
    pub fn restore_reservation(&mut self, reservation: Reservation) {
        let nodes = self.nodes.len();
        if reservation.nodes.iter().all(|(node, _)| (*node as usize) < nodes) {
            self.reservations.insert(reservation);
        }
    }

    /// Says that `job` runs inside `reservation`: its leases use the booking's GPUs.
    pub fn join_reservation(&mut self, job: JobId, reservation: JobId) {
        self.reservations.members.insert(job, reservation);
    }

    /// The reservation held under this id, if any.
    pub fn reservation(&self, job: JobId) -> Option<&Reservation> {
        self.reservations.get(job)
    }

    /// Every slot a job's replica could hold from `not_before` on, on nodes that pass its static
    /// checks at that time and hold no reservation that overlaps its runtime.
    fn reservable_slots(&self, job: &JobSpec, now: Timestamp, not_before: Timestamp) -> Vec<Slot> {
        let context = JobContext::new(job, not_before.max(now));
        let end = not_before.saturating_add(i64::from(job.max_runtime_s));
        let mut slots: Vec<Slot> = Vec::new();
        for (order, range) in self.ranges_for(&context) {
            for rank in range.ranks.clone() {
                let node = order.nodes[rank as usize] as usize;
                if self
                    .reservations
                    .on_node(node)
                    .any(|held| held.job != job.id && held.start < end && held.end > not_before)
                {
                    continue;
                }
                let Ok(ask) = self.static_check(node, &context) else {
                    continue;
                };
                let statics = &self.statics[node];
                let Some(wanted) = context.whole_gpus(statics).filter(|wanted| *wanted > 0) else {
                    continue;
                };
                let mut free_at: Vec<Timestamp> = vec![now; statics.gpu_count as usize];
                for &slot in &self.loads[node].leases {
                    let entry = &self.leases[slot as usize];
                    if entry.tier == Tier::Bronze {
                        continue;
                    }
                    for (gpu, at) in free_at.iter_mut().enumerate() {
                        if entry.lease.gpu_mask & (1 << gpu) != 0 {
                            *at = (*at).max(entry.lease.expected_end);
                        }
                    }
                }
                free_at.sort_unstable();
                let score = crate::state::effective_ask(ask.0, statics.cu_milli, statics.reliability_weight_ppm);
                for replica in 1..=(statics.gpu_count / wanted) {
                    let time = free_at[(replica * wanted - 1) as usize].max(not_before);
                    slots.push((self.domain_of(node, job.topology), time, score, node as u32, ask));
                }
            }
        }
        slots.sort_unstable();
        slots
    }

    /// The earliest domain that holds all the job's replicas: its time, and the index of the
    /// first of the `job.replicas` slots it takes there.
    fn choose_slots(&self, job: &JobSpec, slots: &[Slot]) -> Result<(Timestamp, usize), Unplaced> {
        let replicas = job.replicas as usize;
        let mut best: Option<(Timestamp, u64, usize)> = None;
        let mut most_held = 0usize;
        let mut start = 0;
        for group in slots.chunk_by(|a, b| a.0 == b.0) {
            let domain = group[0].0;
            most_held = most_held.max(group.len());
            if group.len() >= replicas {
                let time = group[replicas - 1].1;
                if best.is_none_or(|(best_time, best_domain, _)| (time, domain) < (best_time, best_domain)) {
                    best = Some((time, domain, start));
                }
            }
            start += group.len();
        }
        let Some((time, _, start)) = best else {
            return Err(Unplaced::NoDomainFits {
                job: job.id,
                level: job.topology.name(),
                replicas: job.replicas,
                best: u32::try_from(most_held).unwrap_or(u32::MAX),
            });
        };
        Ok((time, start))
    }

    fn reservation_of(&self, job: &JobSpec, time: Timestamp, chosen: &[Slot]) -> Reservation {
        let context = JobContext::new(job, time);
        let wanted_of = |node: usize| context.whole_gpus(&self.statics[node]).unwrap_or(0);
        let mut nodes: Vec<(u32, u8)> = Vec::new();
        for slot in chosen {
            match nodes.iter_mut().find(|(node, _)| *node == slot.3) {
                Some(entry) => entry.1 += wanted_of(slot.3 as usize),
                None => nodes.push((slot.3, wanted_of(slot.3 as usize))),
            }
        }
        Reservation {
            id: ReservationId(job.id.0),
            job: job.id,
            start: time,
            end: time.saturating_add(i64::from(job.max_runtime_s)),
            nodes,
        }
    }

    /// Every reservation held now, in the order they were made.
    pub fn reservations(&self) -> Vec<Reservation> {
        self.reservations.all().cloned().collect()
    }

    /// Drops a job's reservation (cancelled, or placed: a commit drops it too).
    pub fn cancel_reservation(&mut self, job: JobId) {
        self.reservations.remove_job(job);
    }

    /// Bronze leases that must give way at `now` to a reservation that starts.
    pub fn leases_due_for_preemption(&self, now: Timestamp) -> Vec<model::LeaseId> {
        let mut due: Vec<model::LeaseId> = self
            .leases
            .iter()
            .filter(|slot| slot.live && slot.preempt_at.is_some_and(|at| at <= now))
            .map(|slot| slot.lease.id)
            .collect();
        due.sort_unstable();
        due
    }
}

/// Whole GPUs a fit takes from the free pool (a share splitting a free GPU takes one).
pub(crate) fn whole_taken(load: &NodeLoad, gpu_mask: u16, gpu_milli: u16) -> u8 {
    if gpu_milli == GPU_MILLI_WHOLE {
        return gpu_mask.count_ones() as u8;
    }
    (0..16)
        .filter(|gpu| gpu_mask & (1 << gpu) != 0 && load.gpu_used_milli[*gpu] == 0)
        .count() as u8
}
