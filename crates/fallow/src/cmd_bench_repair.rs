//! `fallow bench repair`: a running gang loses several nodes at once, and the matcher plans the
//! repair of each lost replica on its own (`plan_repair`, then `commit_repair`), as the
//! coordinator does after a node loss and as Kueue's hot swap replaces one node at a time. Only
//! the matcher's repair calls are timed; the results are checked against the harness's record.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use clap::Args;
use matcher::PreemptionPlan;
use model::{JobId, JobSpec, Lease, NodeId, Tier, TopologyLevel};
use serde_json::json;

use crate::cmd_bench::{
    CHURN_BETWEEN_TRIALS, FleetArgs, Harness, consistency, cores, fill_target, millis, percentile, print,
};

/// Levels a gang is tried at, tightest first: it runs at the first whose domain can hold it.
const GANG_LEVELS: [TopologyLevel; 5] = [
    TopologyLevel::Nvlink,
    TopologyLevel::Fabric,
    TopologyLevel::Site,
    TopologyLevel::Region,
    TopologyLevel::Any,
];
/// Every replica of the gang takes a whole 8-GPU node.
const GPUS_PER_REPLICA: u32 = 8;
/// Refusals and defects quoted in the report (the counts are complete).
const QUOTED_MAX: usize = 5;

#[derive(Args, Clone, Debug)]
pub struct RepairArgs {
    #[command(flatten)]
    fleet: FleetArgs,
    /// GPUs of the gang: gang_gpus / 8 replicas of 8 GPUs.
    #[arg(long, default_value_t = 16_384)]
    gang_gpus: u32,
    /// Nodes of the gang lost at once in each trial; each lost replica is repaired on its own.
    #[arg(long, default_value_t = 8)]
    failures: u32,
    /// Rounds of failures. Between two, the lost nodes come back and the fleet churns.
    #[arg(long, default_value_t = 25)]
    trials: u32,
    /// Share of the fleet's GPU capacity that other work uses before the gang is placed.
    #[arg(long, default_value_t = 0.6)]
    fill: f64,
}

/// The running gang: its spec, the level it was placed at, and what placing it took.
struct Gang {
    job: JobSpec,
    level: TopologyLevel,
    /// Levels tighter than `level` that could not hold it, with the matcher's reason.
    refused: Vec<String>,
    plan_elapsed: Duration,
}

/// What the trials measured and found.
#[derive(Default)]
struct Tally {
    decide_times: Vec<Duration>,
    commit_times: Vec<Duration>,
    repaired_fewest: Option<u32>,
    repaired_total: u32,
    failures_total: u32,
    evicted: u32,
    commit_failures: u32,
    /// Where the replacements went, from the lost replica's node.
    same_nvlink: u32,
    same_fabric: u32,
    elsewhere: u32,
    victims: u64,
    non_bronze_victims: u64,
    /// Other jobs' leases on the lost nodes (their jobs are dropped, as the coordinator requeues them).
    bystander_leases: u64,
    refusals: Vec<String>,
    defects: Vec<String>,
    trials_run: u32,
}

pub fn run(args: &RepairArgs) -> anyhow::Result<()> {
    ensure!(
        args.fill > 0.0 && args.fill < 1.0,
        "--fill must lie between 0 and 1, not {}",
        args.fill
    );
    ensure!(args.trials > 0, "--trials must be at least 1");
    let replicas = args.gang_gpus / GPUS_PER_REPLICA;
    ensure!(
        args.failures > 0 && args.failures < replicas,
        "--failures must lie between 1 and the gang's replicas less one ({}), not {}: a repair needs survivors",
        replicas.saturating_sub(1),
        args.failures
    );
    let mut harness = Harness::new(&args.fleet)?;
    let warmup_started = Instant::now();
    let (warmup_placed, warmup_refused) = harness.warm_up(args.fill)?;
    let warmup_s = warmup_started.elapsed().as_secs_f64();
    let target = fill_target(&harness.matcher, args.fill);
    let fill_before_gang = harness.fill();
    let mut gang = place_gang(&mut harness, args.gang_gpus, &GANG_LEVELS)?;
    let fill_with_gang = harness.matcher.gpu_milli_used() as f64 / harness.matcher.gpu_milli_total() as f64;

    let mut tally = Tally::default();
    for trial in 0..args.trials {
        if trial > 0 {
            harness.churn(CHURN_BETWEEN_TRIALS, target)?;
        }
        let repaired = fail_and_repair(&mut harness, &gang, args.failures, &mut tally)?;
        tally.trials_run += 1;
        tally.repaired_fewest = Some(tally.repaired_fewest.map_or(repaired, |fewest| fewest.min(repaired)));
        if repaired < args.failures {
            // The coordinator restarts an unrepairable gang whole: free it and place it again
            // (the report keeps the first placement's figures).
            harness.matcher.release_job(gang.job.id, harness.now);
            match place_gang(&mut harness, args.gang_gpus, &[gang.level]) {
                Ok(placed) => gang.job = placed.job,
                Err(error) => {
                    tally
                        .refusals
                        .push(format!("placing the gang again after an eviction: {error:#}"));
                    break;
                }
            }
        }
    }
    let gang_gpu_milli: u64 = harness
        .matcher
        .job_leases(gang.job.id)
        .iter()
        .map(|lease| u64::from(lease.gpu_milli_total()))
        .sum();
    let consistency_check_ms = consistency(&harness.matcher, harness.gpu_milli_used + gang_gpu_milli)?;
    report(
        args,
        &harness,
        &gang,
        tally,
        json!({
            "fill_before_gang": round4(fill_before_gang),
            "fill_with_gang": round4(fill_with_gang),
            "warmup_placed": warmup_placed,
            "warmup_refused": warmup_refused,
            "warmup_s": (warmup_s * 1e3).round() / 1e3,
            "consistency_check_ms": consistency_check_ms,
        }),
    );
    Ok(())
}

/// Places a gold gang of `gang_gpus` at the first of `levels` whose domain can hold it, with
/// free capacity only (plan, then commit).
fn place_gang(harness: &mut Harness, gang_gpus: u32, levels: &[TopologyLevel]) -> anyhow::Result<Gang> {
    let mut refused = Vec::new();
    for &level in levels {
        let job = harness.gang_at(gang_gpus, Tier::Gold, level)?;
        let started = Instant::now();
        let planned = harness.matcher.plan(&job, harness.now);
        let plan_elapsed = started.elapsed();
        match planned {
            Ok(placement) => {
                let leases = harness.matcher.commit(&placement)?;
                ensure!(
                    leases.len() == job.replicas as usize,
                    "the gang's commit made {} leases for {} replicas",
                    leases.len(),
                    job.replicas
                );
                return Ok(Gang {
                    job,
                    level,
                    refused,
                    plan_elapsed,
                });
            }
            Err(unplaced) => refused.push(format!("{}: {unplaced}", level.name())),
        }
    }
    bail!(
        "no topology level can hold a gang of {gang_gpus} GPUs on this fleet at {:.1} % fill ({})",
        harness.fill() * 100.0,
        refused.join("; ")
    )
}

/// Takes `failures` distinct nodes of the gang offline at once, then repairs its lost replicas
/// one at a time, timing each plan and commit. Stops at the first replica that cannot be
/// repaired (the gang is evicted). The lost nodes come back at the end. Returns the repairs.
fn fail_and_repair(harness: &mut Harness, gang: &Gang, failures: u32, tally: &mut Tally) -> anyhow::Result<u32> {
    let mut leases = harness.matcher.job_leases(gang.job.id);
    ensure!(
        leases.len() == gang.job.replicas as usize,
        "the gang holds {} leases for {} replicas before the trial",
        leases.len(),
        gang.job.replicas
    );
    let mut failed_nodes: Vec<NodeId> = Vec::with_capacity(failures as usize);
    for _ in 0..failures {
        let index = harness.picker.pick(leases.len());
        failed_nodes.push(leases.swap_remove(index).node);
    }
    // All at once, before any repair: a replacement cannot land on a node about to fail.
    let mut lost: Vec<Lease> = Vec::new();
    let mut bystanders: Vec<JobId> = Vec::new();
    for node in &failed_nodes {
        for lease in harness.matcher.set_node_offline(*node, true) {
            if lease.job == gang.job.id {
                lost.push(lease);
            } else {
                bystanders.push(lease.job);
            }
        }
    }
    tally.bystander_leases += bystanders.len() as u64;
    bystanders.sort_unstable();
    bystanders.dedup();
    for job in bystanders {
        ensure!(
            harness.forget_job(job),
            "a lease of {job}, unknown to the harness, ran on a lost node"
        );
    }
    ensure!(
        lost.len() == failures as usize,
        "{} of the gang's leases were lost with {failures} nodes",
        lost.len()
    );
    tally.failures_total += failures;

    let mut repaired = 0;
    for lost_lease in &lost {
        let started = Instant::now();
        let planned = harness
            .matcher
            .plan_repair(&gang.job, std::slice::from_ref(lost_lease), harness.now);
        tally.decide_times.push(started.elapsed());
        let plan = match planned {
            Ok(plan) => plan,
            Err(unplaced) => {
                tally.evicted += 1;
                tally.refusals.push(unplaced.to_string());
                break;
            }
        };
        if let Some(defect) = repair_defect(harness, gang, lost_lease, &plan, &failed_nodes) {
            tally.defects.push(defect);
            tally.evicted += 1;
            break;
        }
        let victim_jobs: Vec<(JobId, Tier)> = plan.victims.iter().map(|victim| (victim.job, victim.tier)).collect();
        let started = Instant::now();
        let committed = harness.matcher.commit_repair(&plan);
        tally.commit_times.push(started.elapsed());
        if let Err(error) = committed {
            tally.commit_failures += 1;
            tally.defects.push(format!("commit: {error}"));
            tally.evicted += 1;
            break;
        }
        for (job, tier) in victim_jobs {
            tally.victims += 1;
            if harness.tier_of_running(job) != Some(Tier::Bronze) || tier != Tier::Bronze {
                tally.non_bronze_victims += 1;
            }
            // A victim's job goes back to the queue; the harness drops it (once per job).
            harness.forget_job(job);
        }
        let old = harness.matcher.nodes()[lost_lease.node.index()].path;
        let new = harness.matcher.nodes()[plan.placement.leases[0].node.index()].path;
        if new.nvlink == old.nvlink {
            tally.same_nvlink += 1;
        } else if new.fabric == old.fabric {
            tally.same_fabric += 1;
        } else {
            tally.elsewhere += 1;
        }
        repaired += 1;
    }
    tally.repaired_total += repaired;
    for node in failed_nodes {
        harness.matcher.set_node_offline(node, false);
    }
    Ok(repaired)
}

/// What is wrong with a repair plan, judged from its leases and the gang's survivors: `None` if
/// it replaces exactly the lost replica, with 8 whole GPUs of an online node that holds no other
/// replica, inside the survivors' domain.
fn repair_defect(
    harness: &Harness,
    gang: &Gang,
    lost: &Lease,
    plan: &PreemptionPlan,
    failed_nodes: &[NodeId],
) -> Option<String> {
    let placement = &plan.placement;
    if placement.job != gang.job.id {
        return Some(format!("repair is for {} not {}", placement.job, gang.job.id));
    }
    let [lease] = placement.leases.as_slice() else {
        return Some(format!("{} leases to repair one replica", placement.leases.len()));
    };
    if lease.replica != lost.replica {
        return Some(format!(
            "replica {} repaired as replica {}",
            lost.replica, lease.replica
        ));
    }
    if lease.gpu_count() != GPUS_PER_REPLICA || lease.gpu_milli != 1000 {
        return Some(format!(
            "the replacement holds {} GPUs at {} milli",
            lease.gpu_count(),
            lease.gpu_milli
        ));
    }
    if failed_nodes.contains(&lease.node) {
        return Some(format!("the replacement is on {}, which is offline", lease.node));
    }
    let survivors = harness.matcher.job_leases(gang.job.id);
    if survivors.iter().any(|survivor| survivor.node == lease.node) {
        return Some(format!("the replacement shares {} with another replica", lease.node));
    }
    let domain = |node: NodeId| domain_at(harness, node, gang.level);
    if let Some(survivor) = survivors.first()
        && domain(survivor.node) != domain(lease.node)
    {
        return Some(format!(
            "the replacement on {} is outside the gang's {} domain",
            lease.node,
            gang.level.name()
        ));
    }
    None
}

/// The id of the domain at `level` that holds a node, from its topology path.
fn domain_at(harness: &Harness, node: NodeId, level: TopologyLevel) -> u64 {
    let path = harness.matcher.nodes()[node.index()].path;
    match level {
        TopologyLevel::Node => u64::from(node.0),
        TopologyLevel::Nvlink => path.nvlink.index() as u64,
        TopologyLevel::Fabric => path.fabric.index() as u64,
        TopologyLevel::Site => path.site.index() as u64,
        TopologyLevel::Region => path.region.index() as u64,
        TopologyLevel::Any => 0,
    }
}

fn round4(share: f64) -> f64 {
    (share * 1e4).round() / 1e4
}

fn report(args: &RepairArgs, harness: &Harness, gang: &Gang, mut tally: Tally, setup: serde_json::Value) {
    tally.decide_times.sort_unstable();
    tally.commit_times.sort_unstable();
    tally.refusals.sort();
    tally.refusals.dedup();
    tally.defects.sort();
    tally.defects.dedup();
    let decide = &tally.decide_times;
    let commit = &tally.commit_times;
    let repaired = tally.repaired_fewest.unwrap_or(0);
    let mut report = json!({
        "bench": "repair",
        "decide_median_ms": millis(percentile(decide, 0.50)),
        "decide_p99_ms": millis(percentile(decide, 0.99)),
        "decide_max_ms": millis(decide.last().copied().unwrap_or_default()),
        "decide_samples": decide.len(),
        "commit_median_ms": millis(percentile(commit, 0.50)),
        "commit_p99_ms": millis(percentile(commit, 0.99)),
        "commit_max_ms": millis(commit.last().copied().unwrap_or_default()),
        "commit_samples": commit.len(),
        "repaired": repaired,
        "failures": args.failures,
        "repaired_total": tally.repaired_total,
        "failures_total": tally.failures_total,
        "evicted": tally.evicted,
        "commit_failures": tally.commit_failures,
        "repaired_same_nvlink": tally.same_nvlink,
        "repaired_same_fabric": tally.same_fabric,
        "repaired_elsewhere": tally.elsewhere,
        "victims": tally.victims,
        "non_bronze_victims": tally.non_bronze_victims,
        "bystander_leases_lost": tally.bystander_leases,
        "refusals": tally.refusals.iter().take(QUOTED_MAX).collect::<Vec<_>>(),
        "defects": tally.defects.iter().take(QUOTED_MAX).collect::<Vec<_>>(),
        "trials": args.trials,
        "trials_run": tally.trials_run,
        "churn_between_trials": CHURN_BETWEEN_TRIALS,
        "gang_gpus": args.gang_gpus,
        "gang_replicas": gang.job.replicas,
        "gpus_per_replica": GPUS_PER_REPLICA,
        "gang_tier": "gold",
        "topology": gang.level.name(),
        "topology_refused": gang.refused,
        "gang_plan_ms": millis(gang.plan_elapsed),
        "fill": args.fill,
        "threads": 1,
        "fleet_build_s": (harness.fleet_build_s * 1e3).round() / 1e3,
        "matcher_build_s": (harness.matcher_build_s * 1e3).round() / 1e3,
        "nodes": harness.nodes(),
        "gpus": harness.gpus(),
        "seed": args.fleet.seed,
        "cores": cores(),
    });
    if let (Some(object), serde_json::Value::Object(setup)) = (report.as_object_mut(), setup) {
        object.extend(setup);
    }
    let summary = format!(
        "repair: {} trials of {} nodes lost at once from a gold {} × 8-GPU gang ({} level) on {} GPUs at {:.0} % \
         fill: plan p50 {} ms, p99 {} ms, max {} ms over {} repairs; commit p50 {} ms; {repaired} of {} repaired \
         in the worst trial ({} of {} in all), {} evicted",
        tally.trials_run,
        args.failures,
        gang.job.replicas,
        gang.level.name(),
        harness.gpus(),
        args.fill * 100.0,
        report["decide_median_ms"],
        report["decide_p99_ms"],
        report["decide_max_ms"],
        decide.len(),
        report["commit_median_ms"],
        args.failures,
        tally.repaired_total,
        tally.failures_total,
        tally.evicted,
    );
    print(args.fleet.json, &report, summary);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_that_lost_nodes_is_repaired_one_replica_at_a_time_and_the_books_agree() {
        let mut harness = Harness::with_prices(16_000, 1, synth::sample_prices()).unwrap();
        harness.warm_up(0.6).unwrap();
        let gang = place_gang(&mut harness, 512, &GANG_LEVELS).unwrap();
        let mut tally = Tally::default();
        for _ in 0..3 {
            assert_eq!(fail_and_repair(&mut harness, &gang, 4, &mut tally).unwrap(), 4);
        }
        assert_eq!((tally.repaired_total, tally.failures_total, tally.evicted), (12, 12, 0));
        assert_eq!(tally.decide_times.len(), 12);
        assert!(tally.defects.is_empty(), "{:?}", tally.defects);
        assert_eq!(harness.matcher.job_leases(gang.job.id).len(), 64);
        consistency(&harness.matcher, harness.gpu_milli_used + 64 * 8_000).unwrap();
    }
}
