//! The leader's placement decision: pure and synchronous over the fleet view. `reconcile`
//! fetches what it needs first (the queued jobs, their tenants' balances) and writes what it
//! returns afterwards (placements with their escrow holds and leases in one group-committed
//! transaction, the reasons of jobs that wait). Nothing here reads the store or the clock:
//! `now` comes in, so a test decides on any time it likes.

use std::collections::HashMap;

use ledger::Account;
use matcher::Placement;
use model::{GpuCatalog, Micros, Tier};
use store::{JobRecord, NewLease, PlacementWrite};

use crate::fleet::FleetView;

/// What a decision needs besides the view, the jobs and the balances.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Gold work goes only to gold-badge providers (`Config::gold_needs_badge`): said in the
    /// reason of a gold job that waits.
    pub gold_needs_badge: bool,
}

/// A placement the matcher committed in the view, waiting for its store write.
#[derive(Debug)]
pub struct Pending {
    pub job_id: i64,
    pub submitted_at: i64,
    pub matcher_job: model::JobId,
    pub matcher_leases: Vec<model::LeaseId>,
    /// Whether the placement preempts: the matcher let its victims go.
    pub preempts: bool,
}

/// One pass's decisions: the placements to write (`writes[i]` goes with `pending[i]`), and why
/// each job left in the queue waits.
#[derive(Debug, Default)]
pub struct Decisions {
    pub writes: Vec<PlacementWrite>,
    pub pending: Vec<Pending>,
    pub waiting: Vec<(i64, String)>,
    /// Plans the matcher made (placed or refused by the escrow hold).
    pub plans: u64,
}

/// Decides where `queued` jobs go, in the order given (the caller sorts them), with the
/// tenants' available `balances` (a tenant missing from it has none). Each placement is
/// committed in the view's matcher at once, so the next job sees the capacity it took; the
/// caller writes them or releases them again (`Pending`). A job placed takes its escrow hold
/// from its tenant's balance before the tenant's next job is decided.
pub fn decide(
    view: &mut FleetView,
    queued: &[JobRecord],
    balances: &HashMap<i64, Micros>,
    owned: &Owned,
    rules: Rules,
    now: i64,
) -> Decisions {
    let now_s = now / 1_000_000;
    let catalog = GpuCatalog::embedded();
    let mut balances = balances.clone();
    let mut out = Decisions::default();
    view.matcher.advance_clock(now_s);
    // Each tenant's own nodes in the view, found once per decision.
    let mut own_nodes: HashMap<i64, Vec<model::NodeId>> = HashMap::new();
    for job in queued {
        let mut spec = match spec_of(view, job) {
            Ok(spec) => spec,
            Err(error) => {
                out.waiting.push((job.id, format!("invalid spec: {error}")));
                continue;
            }
        };
        // The end of the booking a job runs inside, in µs (paid for by the booking).
        let mut booked_until = None;
        if spec.reservation.is_some() {
            match inside_reservation(view, &mut spec, now_s) {
                Ok(end) => booked_until = Some(end),
                Err(reason) => {
                    out.waiting.push((job.id, reason));
                    continue;
                }
            }
        }
        // Hybrid: a tenant's own nodes first, at no market price; the market for what does not
        // fit there.
        let own = match owned.providers.get(&job.tenant_id) {
            Some(providers) if booked_until.is_none() => own_nodes
                .entry(job.tenant_id)
                .or_insert_with(|| view.nodes_of_providers(providers))
                .clone(),
            _ => Vec::new(),
        };
        let on_own = if own.is_empty() {
            None
        } else {
            let mut own_spec = spec.clone();
            own_spec.only_nodes = own;
            own_spec.max_price = Micros(i64::MAX / 4);
            plan(view, &own_spec, now_s).ok()
        };
        let available = balances.get(&job.tenant_id).copied().unwrap_or(Micros(0));
        if available.0 <= 0 && booked_until.is_none() && on_own.is_none() {
            out.waiting
                .push((job.id, "waiting: the tenant's balance is $0; add credit".to_string()));
            continue;
        }
        let unpriced = booked_until.is_some() || on_own.is_some();
        let planned = match on_own {
            Some(planned) => Ok(planned),
            None => plan(view, &spec, now_s),
        };
        let (placement, victims) = match planned {
            Ok(planned) => planned,
            Err(unplaced) => {
                out.waiting.push((job.id, waiting(rules, &spec, &unplaced)));
                continue;
            }
        };
        out.plans += 1;
        let gpu_milli_total: u64 = placement
            .leases
            .iter()
            .map(|lease| u64::from(lease.gpu_milli_total()))
            .sum();
        let wanted = ledger::hold_amount(spec.max_price, gpu_milli_total.max(1), u64::from(spec.max_runtime_s))
            .unwrap_or(available);
        let hold = if unpriced {
            None
        } else {
            match ledger::hold(
                job.tenant_id,
                job.id,
                wanted,
                available,
                format!("hold:job-{}", job.id),
                now,
            ) {
                Ok(hold) => Some(hold),
                Err(error) => {
                    out.waiting.push((job.id, format!("waiting: {error}")));
                    continue;
                }
            }
        };
        let victims = victim_leases(view, &victims);
        let committed = if victims.is_empty() {
            view.matcher.commit(&placement)
        } else {
            let plan = matcher::PreemptionPlan {
                placement: placement.clone(),
                victims: victims.iter().map(|(victim, _)| victim.clone()).collect(),
            };
            view.matcher.commit_preemption(&plan)
        };
        let committed = match committed {
            Ok(leases) => leases,
            Err(error) => {
                tracing::error!(job = job.id, %error, "a fresh plan did not commit");
                continue;
            }
        };
        let victims = take_victims(view, &victims, job.id, now);
        let held = hold
            .iter()
            .flat_map(|hold| hold.entries.iter())
            .find(|entry| matches!(entry.account, Account::Escrow(_)))
            .map_or(0, |entry| entry.amount.0);
        balances.insert(job.tenant_id, Micros(available.0 - held));
        let mut leases = new_leases(view, &placement, &committed, &spec, catalog, now);
        if unpriced {
            // The tenant's own nodes, or a booking it paid for: no market price.
            for lease in &mut leases {
                lease.price_micros = 0;
            }
        }
        if let Some(end) = booked_until {
            // Stopped at the booking's end.
            for lease in &mut leases {
                lease.preempt_at = Some(lease.preempt_at.map_or(end, |at| at.min(end)));
            }
        }
        out.pending.push(Pending {
            job_id: job.id,
            submitted_at: job.submitted_at,
            matcher_job: spec.id,
            matcher_leases: committed.iter().map(|lease| lease.id).collect(),
            preempts: !victims.is_empty(),
        });
        out.writes.push(PlacementWrite {
            job_id: job.id,
            leases,
            hold: hold.as_ref().map(crate::money::row),
            victims,
        });
    }
    out
}

/// The provider accounts each tenant linked as its own (hybrid): its jobs go to their nodes
/// first, at no market price.
#[derive(Clone, Debug, Default)]
pub struct Owned {
    pub providers: HashMap<i64, Vec<i64>>,
}

/// Where `spec` goes: a plain placement, or else (but for bronze) one that preempts bronze
/// work, with its victims; the matcher's account of why not when neither fits.
fn plan(
    view: &FleetView,
    spec: &model::JobSpec,
    now_s: i64,
) -> Result<(Placement, Vec<matcher::Victim>), matcher::Unplaced> {
    match view.matcher.plan(spec, now_s) {
        Ok(placement) => Ok((placement, Vec::new())),
        Err(unplaced) if spec.tier != Tier::Bronze => match view.matcher.plan_preemption(spec, now_s) {
            Ok(plan) => Ok((plan.placement, plan.victims)),
            Err(_) => Err(unplaced),
        },
        Err(unplaced) => Err(unplaced),
    }
}

/// Readies the spec of a job that runs inside a booking: gold work on the booking's nodes, its
/// price paid by the booking, its runtime cut to the booking's end (returned, in µs). The reason
/// it waits when the booking has not started or is gone.
fn inside_reservation(view: &mut FleetView, spec: &mut model::JobSpec, now_s: i64) -> Result<i64, String> {
    let id = spec.reservation.expect("a job inside a reservation");
    let number = id.0 - crate::reservations::MATCHER_ID_BASE;
    let Some(reservation) = view.matcher.reservation(id) else {
        return Err(format!("waiting: reservation {number} has ended or was cancelled"));
    };
    if now_s < reservation.start {
        return Err(format!(
            "waiting: reservation {number} starts at {}",
            model::time::utc(reservation.start * 1_000_000)
        ));
    }
    let end = reservation.end;
    spec.tier = Tier::Gold;
    spec.preemptible = false;
    spec.max_price = Micros(i64::MAX / 4);
    spec.max_runtime_s = spec
        .max_runtime_s
        .min(u32::try_from((end - now_s).max(1)).unwrap_or(u32::MAX));
    view.matcher.join_reservation(spec.id, id);
    Ok(end * 1_000_000)
}

/// A running gang's replacements for its lost replicas, committed in the view: the leases to
/// write (each with its matcher lease) and the victims they preempt.
#[derive(Debug)]
pub struct Repair {
    pub leases: Vec<(NewLease, model::LeaseId)>,
    pub victims: Vec<store::Victim>,
}

/// The matcher's spec of a stored job, with the nodes it avoids in the view's dense ids.
fn spec_of(view: &FleetView, job: &JobRecord) -> Result<model::JobSpec, api::InputError> {
    let request = crate::wire::job_request(job);
    let mut spec = request.to_spec(job.id, job.tenant_id, job.submitted_at / 1_000_000, |name| {
        view.region(name)
    })?;
    spec.avoid_nodes = job
        .avoid_nodes
        .iter()
        .filter_map(|node| view.dense.get(node).copied())
        .collect();
    spec.avoid_nodes.sort_unstable();
    spec.reservation = request.reservation.map(crate::reservations::matcher_id);
    Ok(spec)
}

/// Replaces `job`'s `lost` replicas next to its survivors (same NVLink domain, then fabric,
/// preempting bronze if needed), or None when it is not a gang with survivors or nothing fits.
pub fn decide_repair(view: &mut FleetView, job: &JobRecord, lost: &[model::Lease], now: i64) -> Option<Repair> {
    let spec = spec_of(view, job).ok()?;
    if spec.replicas < 2 || view.matcher.job_leases(spec.id).is_empty() {
        return None;
    }
    let plan = view.matcher.plan_repair(&spec, lost, now / 1_000_000).ok()?;
    let victims = victim_leases(view, &plan.victims);
    let committed = view.matcher.commit_repair(&plan).ok()?;
    let victims = take_victims(view, &victims, job.id, now);
    let leases = new_leases(view, &plan.placement, &committed, &spec, GpuCatalog::embedded(), now);
    Some(Repair {
        leases: leases.into_iter().zip(committed.iter().map(|lease| lease.id)).collect(),
        victims,
    })
}

/// A plan's victims as the matcher held them, read before the plan commits (which releases
/// them).
fn victim_leases(view: &FleetView, victims: &[matcher::Victim]) -> Vec<(matcher::Victim, Option<model::Lease>)> {
    victims
        .iter()
        .map(|victim| (victim.clone(), view.matcher.lease(victim.lease).cloned()))
        .collect()
}

/// The store leases of a committed plan's victims, each with the end of its grace period. The
/// matcher released them whole; what their preemptor (`job`) does not hold stays held until they
/// end (`FleetView::hold_victim`).
fn take_victims(
    view: &mut FleetView,
    victims: &[(matcher::Victim, Option<model::Lease>)],
    job: i64,
    now: i64,
) -> Vec<store::Victim> {
    let mut out = Vec::with_capacity(victims.len());
    for (victim, lease) in victims {
        let Some(store_lease) = view.store_of_lease.remove(&victim.lease) else {
            continue;
        };
        view.lease_of_store.remove(&store_lease);
        if let Some(lease) = lease {
            let hold = crate::fleet::VictimHold {
                node: lease.node,
                gpu_mask: lease.gpu_mask,
                gpu_milli: lease.gpu_milli,
                by_job: job,
            };
            if let Err(error) = view.hold_victim(store_lease, hold) {
                // Released GPUs always fit; a failure is a bug, and the next view finds it.
                tracing::error!(lease = store_lease, %error, "a victim's other GPUs could not be held");
                view.stale = true;
            }
        }
        out.push(store::Victim {
            lease_id: store_lease,
            preempt_at: now + i64::from(victim.grace_s) * 1_000_000,
        });
    }
    out
}

/// Why a job waits, in words: the matcher's account, and for gold work the rule that narrows
/// where it may go.
fn waiting(rules: Rules, spec: &model::JobSpec, unplaced: &impl std::fmt::Display) -> String {
    if spec.tier == Tier::Gold && rules.gold_needs_badge {
        format!(
            "waiting: {unplaced}; gold work goes only to nodes of gold-badge providers whose last canary passed \
             (docs/trust-policy.md § 2)"
        )
    } else {
        format!("waiting: {unplaced}")
    }
}

fn new_leases(
    view: &FleetView,
    placement: &Placement,
    committed: &[model::Lease],
    spec: &model::JobSpec,
    catalog: &GpuCatalog,
    now: i64,
) -> Vec<NewLease> {
    committed
        .iter()
        .map(|lease| {
            let node = &view.matcher.nodes()[lease.node.index()];
            NewLease {
                replica: i64::from(lease.replica),
                node_id: view.node_ids[lease.node.index()],
                gpu_mask: i64::from(lease.gpu_mask),
                gpu_milli: i64::from(lease.gpu_milli),
                cpu_milli: i64::from(lease.cpu_milli),
                memory_mib: lease.memory_mib as i64,
                price_micros: lease.price.0,
                tier: spec.tier.name().to_string(),
                gpu_model: catalog.spec(node.gpu_model).name.clone(),
                region: view.matcher.topology().region_name(node.path.region).to_string(),
                expected_end: now + i64::from(spec.max_runtime_s) * 1_000_000,
                preempt_at: preempt_at(node, placement, spec, now, view.matcher.config().preemption_grace_s),
            }
        })
        .collect()
}

/// When an interruptible lease must stop: before a reservation takes its GPUs, or when the
/// provider's availability window closes (SIGTERM a grace period before the end, so the node is
/// free when the window ends). Gold and silver only go where the window covers their runtime.
fn preempt_at(node: &model::Node, placement: &Placement, spec: &model::JobSpec, now: i64, grace_s: u32) -> Option<i64> {
    let reservation = placement.preempt_at.map(|at| at * 1_000_000);
    if !spec.interruptible() {
        return reservation;
    }
    let grace_us = i64::from(grace_s) * 1_000_000;
    let expected_end = now + i64::from(spec.max_runtime_s) * 1_000_000;
    let window_end = node
        .policy
        .available_until(now / 1_000_000)
        .filter(|end| *end != i64::MAX)
        .map(|end| (end * 1_000_000 - grace_us).max(now))
        .filter(|at| *at < expected_end);
    match (reservation, window_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use matcher::MatcherConfig;
    use store::{JobState, LeaseRecord};

    use super::*;
    use crate::books::reputation::Standings;
    use crate::fleet::tests::{lease, record};

    const NOW: i64 = 1_800_000_000_000_000;
    const RULES: Rules = Rules {
        gold_needs_badge: false,
    };

    fn view(leases: &[LeaseRecord]) -> FleetView {
        let view = FleetView::build(
            vec![record(1, None)],
            leases,
            &Standings::default(),
            store::NodesVersion::default(),
            MatcherConfig::default(),
        );
        assert_eq!(view.conflicts, Vec::new());
        view
    }

    fn job(id: i64, tenant_id: i64, tier: &str, gpus: u8) -> JobRecord {
        let spec = serde_json::json!({
            "image": "trainer",
            "gpus": gpus,
            "tier": tier,
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 3600,
        });
        JobRecord {
            id,
            tenant_id,
            client_token: None,
            spec: spec.to_string(),
            tier: tier.to_string(),
            state: JobState::Queued,
            state_reason: String::new(),
            submitted_at: NOW - 1_000_000,
            updated_at: NOW - 1_000_000,
            gang_epoch: 0,
            gang_since: None,
            avoid_nodes: Vec::new(),
            gang_restarts: 0,
            gang_assembled_at: None,
        }
    }

    fn escrow(write: &PlacementWrite) -> i64 {
        let (hold, _) = write.hold.as_ref().expect("a placement holds escrow");
        hold.entries
            .iter()
            .find(|(account, _)| account.starts_with("escrow:"))
            .map(|(_, amount)| *amount)
            .expect("an escrow entry")
    }

    #[test]
    fn a_placed_job_takes_its_hold_from_its_tenants_balance_before_the_next_job() {
        let mut view = view(&[]);
        // Enough for about one job: the first one's hold takes it all, the second finds $0,
        // and the other tenant's job is placed on its own money.
        let balances = HashMap::from([(7, Micros(1_000_000)), (8, Micros(50_000_000))]);
        let queued = [job(1, 7, "silver", 1), job(2, 7, "silver", 1), job(3, 8, "silver", 1)];
        let decided = decide(&mut view, &queued, &balances, &Owned::default(), RULES, NOW);
        let placed: Vec<i64> = decided.writes.iter().map(|write| write.job_id).collect();
        assert_eq!(placed, vec![1, 3]);
        assert_eq!(escrow(&decided.writes[0]), 1_000_000, "held what the tenant had");
        assert_eq!(
            decided.waiting,
            vec![(2, "waiting: the tenant's balance is $0; add credit".to_string())]
        );
        assert_eq!(decided.plans, 2, "the second job never reached the matcher");
        let lease = &decided.writes[1].leases[0];
        assert_eq!(lease.node_id, 1);
        assert_eq!(
            lease.expected_end,
            NOW + 3_600_000_000,
            "its end comes from the time given"
        );
        assert_eq!(decided.pending.len(), 2);
        assert_eq!(view.matcher.consistency_check(), Ok(()));
    }

    #[test]
    fn a_job_without_money_or_with_a_bad_spec_waits_and_says_why() {
        let mut view = view(&[]);
        let mut broken = job(2, 7, "silver", 1);
        broken.spec = r#"{"image": "x", "tier": "platinum", "max_price_per_gpu_hour": "1"}"#.into();
        let decided = decide(
            &mut view,
            &[job(1, 9, "silver", 1), broken],
            &HashMap::new(),
            &Owned::default(),
            RULES,
            NOW,
        );
        assert!(decided.writes.is_empty());
        assert_eq!(
            decided.waiting[0],
            (1, "waiting: the tenant's balance is $0; add credit".into())
        );
        assert_eq!(decided.waiting[1].0, 2);
        assert!(
            decided.waiting[1].1.starts_with("invalid spec: "),
            "{:?}",
            decided.waiting[1]
        );
    }

    #[test]
    fn gold_work_that_finds_no_badge_says_where_gold_may_go() {
        let mut view = view(&[]);
        let balances = HashMap::from([(7, Micros(50_000_000))]);
        let rules = Rules { gold_needs_badge: true };
        let decided = decide(
            &mut view,
            &[job(1, 7, "gold", 1)],
            &balances,
            &Owned::default(),
            rules,
            NOW,
        );
        assert!(decided.writes.is_empty(), "no node here is gold-eligible");
        assert!(
            decided.waiting[0].1.contains("gold-badge providers"),
            "{:?}",
            decided.waiting
        );
    }

    #[test]
    fn a_preemption_marks_its_victim_with_the_end_of_its_grace() {
        let mut bronze = lease(1, 10, 1, 0xff, None);
        bronze.lease.tier = "bronze".into();
        let mut view = view(&[bronze]);
        let balances = HashMap::from([(7, Micros(500_000_000))]);
        let decided = decide(
            &mut view,
            &[job(1, 7, "silver", 8)],
            &balances,
            &Owned::default(),
            RULES,
            NOW,
        );
        assert_eq!(decided.writes.len(), 1, "{:?}", decided.waiting);
        let grace_us = i64::from(MatcherConfig::default().preemption_grace_s) * 1_000_000;
        assert_eq!(
            decided.writes[0].victims,
            vec![store::Victim {
                lease_id: 1,
                preempt_at: NOW + grace_us
            }]
        );
        assert!(decided.pending[0].preempts);
        assert_eq!(view.matcher.consistency_check(), Ok(()));
    }
}
