//! Jobs losing leases to a failure, a preemption, a closing window or a lie: the lost leases are
//! grouped by job and handled once the event that took them is done. A gang is repaired where the
//! policy allows it and it lost few replicas; otherwise the job stops, keeps what it may, and is
//! queued again.

use matcher::PreemptionPlan;
use model::{Lease, LeaseId, Micros, Tier};

use super::{Call, Cause, Event, Keep, PolicySim, REPAIR_LOST_PERMILLE_MAX, RESTART_S};

impl PolicySim<'_> {
    pub(super) fn queue_interrupts(&mut self, lost: Vec<Lease>, cause: Cause) {
        // Grouped by job, in the order the leases came.
        let mut groups: Vec<(u64, Vec<Lease>)> = Vec::new();
        for lease in lost {
            match groups.iter_mut().find(|(job, _)| *job == lease.job.0) {
                Some((_, leases)) => leases.push(lease),
                None => groups.push((lease.job.0, vec![lease])),
            }
        }
        for (job, leases) in groups {
            self.interrupts.push((job, leases, cause));
        }
    }

    pub(super) fn victims(&mut self, plan: &PreemptionPlan) {
        if !plan.victims.is_empty() {
            let grace = i64::from(self.matcher.config().preemption_grace_s);
            self.push(
                self.now + grace,
                Event::GraceEnd {
                    job: plan.placement.job.0,
                    victims: plan.victims.len() as u32,
                },
            );
        }
        let mut lost = Vec::with_capacity(plan.victims.len());
        for victim in &plan.victims {
            if let Some(run) = self.jobs.get(&victim.job.0)
                && let Some(entry) = run.leases.iter().find(|entry| entry.lease.id == victim.lease)
            {
                lost.push(entry.lease.clone());
            }
        }
        self.hash.add(&[self.now, 11, lost.len() as i64]);
        self.queue_interrupts(lost, Cause::Preempted);
    }

    pub(super) fn drain_interrupts(&mut self) {
        while let Some((job, leases, cause)) = self.interrupts.pop() {
            if !cause.is_fraud() {
                self.interrupt(job, leases, cause);
                continue;
            }
            // The work a lie threw away, at the lost lease's price, is fraud's cost to the tenant.
            let lost_before: u64 = self.tally.work.iter().map(|work| work.lost).sum();
            let (node, price) = leases
                .first()
                .map_or((0, Micros::ZERO), |lease| (lease.node.index(), lease.price));
            self.interrupt(job, leases, cause);
            let lost: u64 = self.tally.work.iter().map(|work| work.lost).sum::<u64>() - lost_before;
            if let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) {
                let micros = price.cost_for(lost, 1).map_or(0, |cost| cost.0);
                trust.loss(plan, node, micros);
            }
        }
    }

    /// A job lost `lost` leases (already released in the matcher): repair the gang, or stop it
    /// and queue it again.
    fn interrupt(&mut self, id: u64, lost: Vec<Lease>, cause: Cause) {
        let Some(mut run) = self.jobs.remove(&id) else { return };
        let now = self.now;
        let grace = i64::from(self.matcher.config().preemption_grace_s);
        let lost_ids: Vec<LeaseId> = lost
            .iter()
            .map(|lease| lease.id)
            .filter(|lease| run.leases.iter().any(|entry| entry.lease.id == *lease))
            .collect();
        if lost_ids.is_empty() {
            self.jobs.insert(id, run);
            return;
        }
        self.hash.add(&[now, 7, id as i64, cause.code(), lost_ids.len() as i64]);
        let tier = run.tier as usize;
        if !cause.is_fault() {
            self.tally.preempted_leases[tier] += lost_ids.len() as u64;
            if cause == Cause::WindowClosed {
                self.tally.window_preempted_leases[tier] += lost_ids.len() as u64;
            }
        }
        if run.class == 2 && cause.is_fault() {
            self.tally.big_gang_failures += 1;
        }
        let lost_milli: u64 = run
            .leases
            .iter()
            .filter(|entry| lost_ids.contains(&entry.lease.id))
            .map(|entry| entry.milli)
            .sum();
        let survivors = run.leases.len() > lost_ids.len();
        let can_checkpoint = run.job.spec.checkpoint_interval_s > 0 && run.job.checkpoint_cost_s as i64 <= grace;
        // SIGTERM came a grace period before a window closed.
        let cut = match cause {
            Cause::WindowClosed => (now - grace).max(run.phase_from).min(now),
            _ => now,
        };
        let repairable =
            lost_ids.len() as u64 * 1000 <= (u64::from(run.job.spec.replicas) * REPAIR_LOST_PERMILLE_MAX).max(1000);
        let plan = if self.rules.repair && survivors && run.job.spec.replicas > 1 && repairable {
            run.job.spec.max_runtime_s = self.runtime_estimate(&run);
            let lost_leases: Vec<Lease> = lost
                .iter()
                .filter(|lease| lost_ids.contains(&lease.id))
                .cloned()
                .collect();
            let spec = &run.job.spec;
            match self.timed(Call::Repair, |matcher| matcher.plan_repair(spec, &lost_leases, now)) {
                Ok(plan) if run.tier != Tier::Bronze || plan.victims.is_empty() => Some(plan),
                _ => None,
            }
        } else {
            None
        };
        let keep = match (cause, &plan) {
            (cause, Some(_)) if cause.is_fault() => Keep::AllButLost(lost_milli),
            (cause, None) if cause.is_fault() => Keep::Checkpointed,
            (_, _) if can_checkpoint => Keep::All,
            _ => Keep::Checkpointed,
        };
        self.categorize(&mut run, cut, keep);
        // The lost leases: a preempted one runs through its grace, a closing window's stops at the close.
        let lost_until = if cause == Cause::Preempted { now + grace } else { now };
        for lease in &lost_ids {
            let billed_from = run
                .leases
                .iter()
                .find(|entry| entry.lease.id == *lease)
                .map_or(now, |entry| entry.billed_from);
            let grace_from = billed_from.max(cut);
            if lost_until > grace_from {
                let milli = run
                    .leases
                    .iter()
                    .find(|entry| entry.lease.id == *lease)
                    .map_or(0, |entry| entry.milli);
                self.tally.work[run.class].grace += (lost_until - grace_from) as u64 * milli;
            }
            self.drop_lease(&mut run, *lease, lost_until);
        }
        if let Some(plan) = plan
            && let Ok(leases) = self.timed(Call::Repair, |matcher| matcher.commit_repair(&plan))
        {
            self.tally.repairs += 1;
            if run.class == 2 {
                self.tally.big_gang_repairs += 1;
            }
            self.hash.add(&[now, 8, id as i64, leases.len() as i64]);
            let victim_grace = if plan.victims.is_empty() { 0 } else { grace };
            for lease in leases {
                self.add_lease(&mut run, lease, now + victim_grace);
            }
            // Survivors stall from the cut while the replacement comes up.
            run.phase_from = cut;
            run.run_from = now + victim_grace + RESTART_S;
            self.schedule_completion(&mut run);
            self.reserve_spares(&run);
            self.jobs.insert(id, run);
            self.victims(&plan);
            return;
        }
        if self.rules.repair && survivors && run.job.spec.replicas > 1 {
            self.tally.repairs_failed += 1;
        }
        // Stop whatever is left of the job and queue it again.
        let rest: Vec<LeaseId> = run.leases.iter().map(|entry| entry.lease.id).collect();
        for lease in rest {
            // Survivors' time since the cut is lost with the rest of the gang.
            if let Some(entry) = run.leases.iter().find(|entry| entry.lease.id == lease)
                && now > entry.billed_from.max(cut)
            {
                self.tally.work[run.class].lost += (now - entry.billed_from.max(cut)) as u64 * entry.milli;
            }
            self.timed(Call::Release, |matcher| matcher.release_lease(lease));
            self.drop_lease(&mut run, lease, now);
        }
        if run.job.spec.replicas > 1 {
            self.tally.gang_restarts += 1;
            if run.class == 2 {
                self.tally.big_gang_restarts += 1;
            }
        }
        self.hash.add(&[now, 9, id as i64]);
        run.generation += 1;
        run.freed_at_last_try = None;
        run.failed_tries = 0;
        run.retry_at = now;
        self.jobs.insert(id, run);
        self.enqueue(id);
        self.pass_wanted = true;
        // Placed again at once where it can be (a gang's nodes were just freed).
        let allow = self.rules.preemption;
        if allow {
            self.preempt_budget = self.preempt_budget.max(1);
        }
        self.try_start(id, allow);
    }
}
