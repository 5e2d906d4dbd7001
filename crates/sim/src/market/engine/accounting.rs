//! One policy's accounting: a lease's price and its billing (the ledger's split of every charge),
//! the sorting of billed GPU-time into work, the checks the run makes as it goes, and the bills
//! at its end.
//!
//! Work is accounted per job in milli-GPU-seconds: every second a lease is billed is exactly one
//! of useful (progress kept), checkpoint (writing checkpoints), lost (work since the last
//! checkpoint that a failure threw away), restart (starting again after a restart, or a gang
//! stalled while a replacement comes up) or grace (a preempted job checkpointing before it
//! stops). The run checks that identity, the ledger's balance and the matcher's
//! `consistency_check` as it goes.

use model::{Lease, LeaseId, Micros, Tier, Timestamp};

use super::{Event, FEE_PERMILLE, JobRun, Keep, LeaseRun, PolicySim};
use crate::market::fraud;
use crate::market::policy::Pricing;

impl PolicySim<'_> {
    pub(super) fn add_lease(&mut self, run: &mut JobRun, lease: Lease, billed_from: Timestamp) {
        let node = lease.node.index();
        let ask = self.world.fleet.nodes[node]
            .policy
            .ask_at(run.job.spec.tier, self.now)
            .unwrap_or(lease.price);
        let price = match self.rules.pricing {
            Pricing::Auction => lease.price,
            Pricing::OwnAsk => ask,
            Pricing::ShadedAsk => ask.max(lease.price),
        };
        let milli = u64::from(lease.gpu_milli_total());
        self.hash.add(&[i64::from(lease.node.0), price.0]);
        self.node_leases[node].push((lease.id, run.job.spec.id.0));
        self.node_used_milli[node] += milli as u32;
        if run.job.spec.tier == Tier::Bronze {
            self.bronze_milli_by_model[self.world.fleet.nodes[node].gpu_model.index()] += milli;
        }
        if let Some(plan) = &self.world.fraud
            && plan.kind[node] == Some(fraud::FraudKind::DroppedJobs)
            && plan.unit(&[3, run.job.spec.id.0, u64::from(run.generation), lease.id.0])
                < f64::from(fraud::DROP_PERMILLE) / 1000.0
        {
            let within = fraud::DROP_WITHIN_S.min(i64::from(run.job.spec.max_runtime_s.max(1)));
            let after = plan.unit(&[4, run.job.spec.id.0, u64::from(run.generation), lease.id.0]) * within as f64;
            let (job, id) = (run.job.spec.id.0, lease.id.0);
            self.push(self.now + (after as Timestamp).max(1), Event::Drop { job, lease: id });
        }
        run.leases.push(LeaseRun {
            lease,
            milli,
            price,
            ask,
            billed_from,
        });
    }

    /// Takes a lease out of the job and the node's view and bills it up to `until`.
    pub(super) fn drop_lease(&mut self, run: &mut JobRun, lease_id: LeaseId, until: Timestamp) -> Option<LeaseRun> {
        let position = run.leases.iter().position(|entry| entry.lease.id == lease_id)?;
        let entry = run.leases.swap_remove(position);
        let node = entry.lease.node.index();
        if let Some(slot) = self.node_leases[node].iter().position(|(id, _)| *id == lease_id) {
            self.node_leases[node].swap_remove(slot);
        }
        self.node_used_milli[node] -= entry.milli as u32;
        if run.job.spec.tier == Tier::Bronze {
            self.bronze_milli_by_model[self.world.fleet.nodes[node].gpu_model.index()] -= entry.milli;
        }
        self.freed_milli += entry.milli;
        self.bill(run, &entry, until);
        Some(entry)
    }

    fn bill(&mut self, run: &JobRun, entry: &LeaseRun, until: Timestamp) {
        let seconds = (until - entry.billed_from).max(0) as u64;
        if seconds == 0 {
            return;
        }
        let node = entry.lease.node.index();
        let milli_s = seconds * entry.milli;
        let tier = run.tier as usize;
        self.tally.work[run.class].allocated += milli_s;
        self.tally.billed_milli_s[tier] += milli_s;
        let cost = entry.price.cost_for(entry.milli, seconds).expect("costs fit in i64");
        let fee = Micros(cost.0 * FEE_PERMILLE / 1000);
        let earned = cost - fee;
        if earned + fee != cost {
            self.tally
                .ledger_failures
                .push(format!("a charge of {cost} split into {earned} + {fee}"));
        }
        self.tally.paid[tier] = self.tally.paid[tier] + cost;
        let kind = self.world.fleet.kinds[node] as usize;
        self.tally.provider_earned[kind] = self.tally.provider_earned[kind] + earned;
        self.tally.sold_milli_s[kind] += milli_s;
        self.tally.platform_fees = self.tally.platform_fees + fee;
        self.tally.transactions += 1;
        let reference = self.world.fleet.on_demand[node]
            .cost_for(entry.milli, seconds)
            .expect("costs fit in i64");
        self.tally.on_demand_cost[tier] = self.tally.on_demand_cost[tier] + reference;
        let asked = entry.ask.cost_for(entry.milli, seconds).expect("costs fit in i64");
        self.tally.asked[tier] = self.tally.asked[tier] + asked;
        self.bill_fraud(node, entry, cost, seconds);
    }

    /// Sorts the GPU-time of the job's current leases since its phase began into the work
    /// tally, up to `until`, keeping its progress as `keep` says.
    pub(super) fn categorize(&mut self, run: &mut JobRun, until: Timestamp, keep: Keep) {
        let class = run.class;
        let mut restart = 0u64;
        for entry in &run.leases {
            let from = entry.billed_from.max(run.phase_from);
            let to = until.min(run.run_from);
            if to > from {
                restart += (to - from) as u64 * entry.milli;
            }
        }
        self.tally.work[class].restart += restart;
        if until > run.run_from {
            let held: u64 = run.leases.iter().map(|entry| entry.milli).sum();
            let elapsed = (until - run.run_from) as u64;
            let interval = u64::from(run.job.spec.checkpoint_interval_s);
            let cost = u64::from(run.job.checkpoint_cost_s);
            let (cycles, computing, writing) = if interval > 0 {
                let cycle = interval + cost;
                let (full, rest) = (elapsed / cycle, elapsed % cycle);
                (full, rest.min(interval), rest.saturating_sub(interval))
            } else {
                (0, elapsed, 0)
            };
            let tally = &mut self.tally.work[class];
            tally.checkpoint += (cycles * cost + writing) * held;
            let kept = cycles * interval;
            let keep = if run.job.stateless { Keep::All } else { keep };
            let useful = match keep {
                Keep::All => {
                    run.saved_s += kept + computing;
                    (kept + computing) * held
                }
                Keep::Checkpointed => {
                    run.saved_s += kept;
                    tally.lost += computing * held;
                    kept * held
                }
                Keep::AllButLost(lost_milli) => {
                    run.saved_s += kept + computing;
                    tally.lost += computing * lost_milli;
                    (kept + computing) * held - computing * lost_milli
                }
            };
            tally.useful += useful;
            let h100_milli: u64 = run
                .leases
                .iter()
                .map(|entry| entry.milli * u64::from(self.cu_milli[entry.lease.node.index()]) / 1000)
                .sum();
            if held > 0 {
                self.tally.useful_h100_milli_s[run.tier as usize] +=
                    (u128::from(useful) * u128::from(h100_milli) / u128::from(held)) as u64;
            }
            if run.class == 2 {
                self.tally.big_gang_running_s += elapsed;
            }
        }
        run.phase_from = until.max(run.phase_from);
        run.run_from = run.run_from.max(run.phase_from);
    }

    pub(super) fn check(&mut self) {
        self.next_check = self.now + self.world.check_every_s.max(1);
        self.tally.consistency_checks += 1;
        if let Err(message) = self.matcher.consistency_check()
            && self.tally.consistency_failures.len() < 10
        {
            self.tally
                .consistency_failures
                .push(format!("at {}: {message}", self.now));
        }
        let used: u64 = self.node_used_milli.iter().map(|milli| u64::from(*milli)).sum();
        if used != self.matcher.gpu_milli_used() && self.tally.consistency_failures.len() < 10 {
            self.tally.consistency_failures.push(format!(
                "at {}: the simulation holds {used} milli-GPU in leases, the matcher {}",
                self.now,
                self.matcher.gpu_milli_used()
            ));
        }
        self.check_ledger();
    }

    fn check_ledger(&mut self) {
        self.tally.ledger_checks += 1;
        let paid: i64 = self.tally.paid.iter().map(|micros| micros.0).sum();
        let earned: i64 = self.tally.provider_earned.iter().map(|micros| micros.0).sum();
        if paid != earned + self.tally.platform_fees.0 && self.tally.ledger_failures.len() < 10 {
            self.tally.ledger_failures.push(format!(
                "at {}: tenants paid {} but providers earned {} and the platform {}",
                self.now,
                Micros(paid),
                Micros(earned),
                self.tally.platform_fees
            ));
        }
    }

    /// The end of the run: running jobs are billed and their work counted up to it; queued ones
    /// that never started count their wait so far.
    pub(super) fn finish(&mut self) {
        let end = self.world.end;
        let mut ids: Vec<u64> = self.jobs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let mut run = self.jobs.remove(&id).expect("listed above");
            if run.leases.is_empty() {
                if !run.started {
                    let tier = run.tier as usize;
                    self.tally.unstarted_at_end[tier] += 1;
                    self.tally.unserved_wait_s[tier] += (end - run.job.spec.submitted_at).max(0) as u64;
                }
                continue;
            }
            self.categorize(&mut run, end, Keep::All);
            for entry in std::mem::take(&mut run.leases) {
                self.bill(&run, &entry, end);
            }
        }
        if let (Some(trust), Some(plan)) = (&self.trust, &self.world.fraud) {
            let paid: i64 = self.tally.paid.iter().map(|paid| paid.0).sum();
            self.tally.fraud = Some(trust.report(plan, paid));
        }
        self.check();
        for (class, work) in self.tally.work.iter().enumerate() {
            if work.allocated != work.accounted() {
                self.tally.ledger_failures.push(format!(
                    "class {class}: {} milli-GPU-seconds billed but {} accounted for",
                    work.allocated,
                    work.accounted()
                ));
            }
        }
    }
}
