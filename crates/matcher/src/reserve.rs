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
}

impl Reservations {
    pub fn new(nodes: usize) -> Reservations {
        Reservations {
            list: Vec::new(),
            per_node: vec![Vec::new(); nodes],
            by_job: FixedMap::default(),
        }
    }

    pub fn remove_job(&mut self, job: JobId) {
        if self.by_job.is_empty() {
            return;
        }
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
        let end = context.now.saturating_add(i64::from(context.job.max_runtime_s));
        let mut reserved = 0u32;
        let mut earliest: Option<Timestamp> = None;
        for reservation in self.reservations.on_node(node) {
            if reservation.job == context.job.id || reservation.end <= context.now || reservation.start >= end {
                continue;
            }
            let held = reservation
                .nodes
                .iter()
                .find(|(entry, _)| *entry as usize == node)
                .map_or(0, |(_, gpus)| *gpus);
            reserved += u32::from(held);
            earliest = Some(earliest.map_or(reservation.start, |start: Timestamp| start.min(reservation.start)));
        }
        let whole_free = load.gpu_used_milli[..self.statics[node].gpu_count as usize]
            .iter()
            .filter(|milli| **milli == 0)
            .count() as u32;
        if reserved == 0 || whole_free.saturating_sub(u32::from(whole_taken)) >= reserved {
            return Ok(None);
        }
        if context.job.tier == Tier::Bronze {
            Ok(earliest)
        } else {
            Err(Reason::Reserved)
        }
    }

    /// Reserves whole GPUs for a job at the earliest time not before `not_before` when a
    /// topology domain can hold all its replicas, counting the expected ends of non-bronze
    /// leases (bronze gives way). A node holds one reservation at a time. Returns the
    /// reservation and its start.
    pub fn reserve(&mut self, job: &JobSpec, now: Timestamp, not_before: Timestamp) -> Result<Reservation, Unplaced> {
        self.validate(job)?;
        let context = JobContext::new(job, now);
        let mut slots: Vec<(u64, Timestamp, u64, u32)> = Vec::new(); // (domain, time, score, node)
        for (order, range) in self.ranges_for(&context) {
            for rank in range.ranks.clone() {
                let node = order.nodes[rank as usize] as usize;
                if !self.reservations.per_node[node].is_empty() {
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
                    slots.push((self.domain_of(node, job.topology), time, score, node as u32));
                }
            }
        }
        slots.sort_unstable();
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
        let wanted_of = |node: usize| context.whole_gpus(&self.statics[node]).unwrap_or(0);
        let mut nodes: Vec<(u32, u8)> = Vec::new();
        for slot in &slots[start..start + replicas] {
            match nodes.iter_mut().find(|(node, _)| *node == slot.3) {
                Some(entry) => entry.1 += wanted_of(slot.3 as usize),
                None => nodes.push((slot.3, wanted_of(slot.3 as usize))),
            }
        }
        self.reservations.remove_job(job.id);
        let slot = self.reservations.list.len() as u32;
        let reservation = Reservation {
            id: ReservationId(u64::from(slot) + 1),
            job: job.id,
            start: time,
            end: time.saturating_add(i64::from(job.max_runtime_s)),
            nodes,
        };
        for (node, _) in &reservation.nodes {
            self.reservations.per_node[*node as usize].push(slot);
        }
        self.reservations.by_job.insert(job.id, slot);
        self.reservations.list.push(Some(reservation.clone()));
        Ok(reservation)
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
