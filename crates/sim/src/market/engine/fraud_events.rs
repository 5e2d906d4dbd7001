//! Fraud's events in one policy's run (`--fraud-rate`): canaries falling due, proofs that slash
//! a provider's bond and cordon its nodes, leases a dishonest provider abandons, and what a lie
//! adds to a bill. Who lies, and the trust policy's state, are `market::fraud`'s.

use model::Micros;

use super::{Call, Cause, LeaseRun, PolicySim};
use crate::market::fraud::{FraudKind, INFLATION_PERMILLE};

impl PolicySim<'_> {
    /// Runs the canary that is due.
    pub(super) fn canary(&mut self) {
        let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) else {
            return;
        };
        let (online, open) = (&self.online, &self.open);
        let found = trust.run_canary(plan, self.now, &|node| online[node] && open[node]);
        self.proven(found);
    }

    /// Fraud proven against a provider: its bond is slashed, its tenants paid back, its nodes
    /// cordoned (their running leases end as planned; nothing new is placed there).
    pub(super) fn proven(&mut self, found: Option<(u32, trust::rules::Fraud)>) {
        let (Some((provider, fraud)), Some(trust), Some(plan)) = (found, &mut self.trust, &self.world.fraud) else {
            return;
        };
        trust.prove(plan, provider, fraud, self.now);
        let nodes = std::mem::take(&mut trust.cordoned_nodes);
        self.hash.add(&[self.now, 14, i64::from(provider), nodes.len() as i64]);
        for node in nodes {
            self.matcher.set_node_cordoned(model::NodeId(node), true);
        }
    }

    /// A dishonest provider abandons a lease while its node is up.
    pub(super) fn drop_event(&mut self, job: u64, lease: u64) {
        let Some(run) = self.jobs.get(&job) else { return };
        let Some(entry) = run.leases.iter().find(|entry| entry.lease.id.0 == lease) else {
            return;
        };
        let node = entry.lease.node.index();
        if !self.online[node] {
            return;
        }
        let id = entry.lease.id;
        let Some(released) = self.timed(Call::Release, |matcher| matcher.release_lease(id)) else {
            return;
        };
        if let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) {
            let found = trust.dropped(plan, node, self.now);
            self.proven(found);
        }
        self.hash.add(&[self.now, 15, job as i64]);
        self.queue_interrupts(vec![released], Cause::Dropped);
    }

    /// What a dishonest node's lie adds to a bill: compute not delivered on a false GPU model;
    /// a last usage record inflated past the lease's end (refused where the trust policy checks
    /// usage, paid where it does not).
    pub(super) fn bill_fraud(&mut self, node: usize, entry: &LeaseRun, cost: Micros, seconds: u64) {
        let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) else {
            return;
        };
        match plan.kind[node] {
            Some(FraudKind::FalseGpuModel) => {
                let undelivered = cost.0 * i64::from(1000 - plan.rate_permille[node].min(1000)) / 1000;
                trust.loss(plan, node, undelivered);
            }
            Some(FraudKind::InflatedUsage) => {
                let share = plan.unit(&[5, entry.lease.id.0]);
                let (low, high) = (*INFLATION_PERMILLE.start(), *INFLATION_PERMILLE.end());
                if trust.detect {
                    let found = trust.usage_violation(plan, node, self.now);
                    self.proven(found);
                } else {
                    let permille = low + (share * (high - low) as f64) as u64;
                    let extra_s = (seconds * permille / 1000).max(1);
                    let extra = entry.price.cost_for(entry.milli, extra_s).expect("costs fit in i64");
                    trust.usage_violation(plan, node, self.now);
                    trust.loss(plan, node, extra.0);
                }
            }
            _ => {}
        }
    }
}
