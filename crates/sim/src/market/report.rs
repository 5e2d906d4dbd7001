//! The figures of a run, per policy, as `--json` prints them. Field names are a contract
//! (tests check them); units are in the names.
//!
//! Per-tier figures are objects `{"gold": …, "silver": …, "bronze": …}` keyed by the tier the
//! tenant asked for (policies without tiers serve every job as one kind of lease, but report by
//! the tenant's tier), `null` where a tier had nothing to measure.

use std::collections::BTreeMap;

use serde::Serialize;

use super::fleet::ProviderKind;
use super::policy::PolicyName;
use super::tally::{Sample, Tally, WorkTally};
use super::{DemandSource, MarketConfig, World};
use model::GpuCatalog;

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TierFigures {
    pub gold: Option<f64>,
    pub silver: Option<f64>,
    pub bronze: Option<f64>,
}

impl TierFigures {
    fn from(values: [Option<f64>; 3]) -> TierFigures {
        TierFigures {
            gold: values[0].map(round),
            silver: values[1].map(round),
            bronze: values[2].map(round),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TierCounts {
    pub gold: u64,
    pub silver: u64,
    pub bronze: u64,
}

impl TierCounts {
    fn from(values: [u64; 3]) -> TierCounts {
        TierCounts {
            gold: values[0],
            silver: values[1],
            bronze: values[2],
        }
    }
}

/// Billed GPU-hours of a kind of work, by what they bought.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct WorkHours {
    pub allocated_gpu_hours: f64,
    pub useful_gpu_hours: f64,
    pub checkpoint_gpu_hours: f64,
    pub lost_gpu_hours: f64,
    pub restart_gpu_hours: f64,
    pub grace_gpu_hours: f64,
    pub goodput_pct: Option<f64>,
}

impl WorkHours {
    fn from(work: &WorkTally) -> WorkHours {
        let hours = |milli_s: u64| round(milli_s as f64 / 3_600_000.0);
        WorkHours {
            allocated_gpu_hours: hours(work.allocated),
            useful_gpu_hours: hours(work.useful),
            checkpoint_gpu_hours: hours(work.checkpoint),
            lost_gpu_hours: hours(work.lost),
            restart_gpu_hours: hours(work.restart),
            grace_gpu_hours: hours(work.grace),
            goodput_pct: ratio_pct(work.useful as f64, work.allocated as f64),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct JobCounts {
    pub submitted: TierCounts,
    pub started: TierCounts,
    pub finished: TierCounts,
    /// Left the queue unstarted after their patience (gold 4 h, silver 12 h, bronze 24 h).
    pub gave_up: TierCounts,
    pub unstarted_at_end: TierCounts,
    /// Refused at submission: no node could ever run them under the policy (e.g. a firm lease
    /// longer than any window of the models it names).
    pub rejected: TierCounts,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct BigGangReport {
    pub gpus: u32,
    pub checkpoint_interval_s: u32,
    pub goodput_pct: Option<f64>,
    /// Share of the run the gang held its GPUs and computed.
    pub running_pct: f64,
    pub node_failures: u64,
    pub repairs: u64,
    pub restarts: u64,
    /// Spare nodes booked for the gang (policies with the matcher's reservations).
    pub spares_reserved: u64,
    pub work: WorkHours,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Money {
    pub tenants_paid_usd: f64,
    pub providers_earned_usd: f64,
    pub platform_fees_usd: f64,
    pub charges: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Invariants {
    pub consistency_checks: u64,
    pub consistency_failures: Vec<String>,
    pub ledger_checks: u64,
    /// Tenants paid exactly what providers earned plus the platform's fees, at every check.
    pub ledger_balanced: bool,
    /// Every billed GPU-second is accounted as useful, checkpoint, lost, restart or grace.
    pub work_accounted: bool,
    pub ledger_failures: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PolicyReport {
    /// Mean share of the fleet's GPUs leased.
    pub utilization_pct: f64,
    /// GPU-hours sold over GPU-hours offered (inside providers' windows, nodes up).
    pub fill_rate_pct: f64,
    /// Queue wait to a job's first start, over the jobs that started (see `unserved_pct`).
    pub wait_p50_s: TierFigures,
    pub wait_p95_s: TierFigures,
    pub wait_p99_s: TierFigures,
    /// Jobs that never started (refused, gave up after their patience, or still queued at the end) over those submitted.
    pub unserved_pct: TierFigures,
    /// Bronze leases preempted (by gold or silver, or by a provider's window closing) per bronze GPU-hour sold.
    pub preemptions_per_bronze_gpu_hour: f64,
    /// Gangs' useful GPU-seconds over their allocated GPU-seconds (work lost since the last
    /// checkpoint, restarts and repairs, checkpoints and grace periods are not useful).
    pub goodput_pct: Option<f64>,
    /// All work's useful over allocated.
    pub goodput_all_pct: Option<f64>,
    /// What tenants paid per GPU-hour billed.
    pub tenant_usd_per_gpu_hour: Option<f64>,
    /// What tenants paid per useful H100-equivalent hour: the price of equal work.
    pub tenant_usd_per_useful_h100_hour: Option<f64>,
    pub tenant_usd_per_gpu_hour_by_tier: TierFigures,
    /// 100 × (1 − paid / the same GPU-hours at the on-demand reference price of their models).
    pub bronze_discount_vs_on_demand_pct: Option<f64>,
    pub discount_vs_on_demand_pct: Option<f64>,
    pub discount_vs_on_demand_pct_by_tier: TierFigures,
    /// What tenants paid over what the winners asked: the auction's (k+1)-price premium.
    pub clearing_premium_pct: Option<f64>,
    /// Providers' earnings (after the platform's fee) per GPU-hour they offered.
    pub provider_usd_per_offered_gpu_hour: f64,
    pub provider_usd_per_offered_gpu_hour_by_kind: BTreeMap<&'static str, Option<f64>>,
    pub fill_rate_pct_by_kind: BTreeMap<&'static str, Option<f64>>,
    /// Mean share of free GPUs (on open nodes) that sit on nodes already partly used.
    pub fragmentation_pct: f64,
    /// Wall time in the matcher per simulated event (null when not measured).
    pub matcher_us_per_event: Option<f64>,
    /// The matcher's wall time by kind of call (null when not measured).
    pub matcher_s_by_call: Option<BTreeMap<&'static str, f64>>,
    pub jobs: JobCounts,
    pub preempted_leases: TierCounts,
    pub window_preempted_leases: TierCounts,
    pub node_failures: u64,
    pub failed_leases: u64,
    pub gang_repairs: u64,
    pub gang_repairs_failed: u64,
    pub gang_restarts: u64,
    /// Billed GPU-hours by kind of work: `single` (one replica), `gangs`, `big_gang`.
    pub work: BTreeMap<&'static str, WorkHours>,
    pub big_gang: Option<BigGangReport>,
    pub money: Money,
    pub invariants: Invariants,
    pub events: u64,
    pub passes: u64,
    pub placements_tried: u64,
    pub preemptions_tried: u64,
    pub matcher_calls: u64,
    pub trace_hash: String,
    /// With `--fraud-rate`: what fraud cost this market's tenants, and what its trust policy
    /// caught (only Fallow's market runs one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraud: Option<super::fraud::FraudReport>,
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

/// The trust policy's figures in Fallow's market, at the report's top level (`--fraud-rate`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FraudSummary {
    pub fraud_rate: f64,
    pub fraud_detected_pct: Option<f64>,
    pub median_days_to_detect: Option<f64>,
    pub honest_slashed: u64,
    pub tenant_loss_to_fraud_pct: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FleetSummary {
    pub source: String,
    pub gpus: u64,
    pub nodes: usize,
    pub gpus_by_kind: BTreeMap<&'static str, u64>,
    pub gpus_by_model: BTreeMap<String, u64>,
    /// Scheduled node interruptions over the run (the same for every policy).
    pub node_interruptions: usize,
    pub windowed_gpus: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DemandSummary {
    pub source: String,
    /// Demand as a share of the GPU-hours the market offers (synthetic demand).
    pub load_pct: Option<f64>,
    pub arrivals_per_hour: Option<f64>,
    pub mean_gpu_hours_per_job: Option<f64>,
    pub jobs: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct MarketReport {
    pub seed: u64,
    /// FNV-1a over every policy's event trace, in the order of `policies` below.
    pub trace_hash: String,
    pub scenario: &'static str,
    pub days: u32,
    /// How sellers bid in the pay-as-bid market: `shaded` (the equilibrium) or `truthful`.
    pub pay_as_bid_bids: &'static str,
    /// Providers' gold asks over their silver asks, in per cent.
    pub gold_ask_premium_pct: f64,
    pub fleet: FleetSummary,
    pub demand: DemandSummary,
    /// With `--fraud-rate`: Fallow's trust figures (also under `policies.fallow.fraud`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub fraud: Option<FraudSummary>,
    pub policies: BTreeMap<&'static str, PolicyReport>,
}

fn round(value: f64) -> f64 {
    (value * 10_000.0).round() / 10_000.0
}

fn ratio_pct(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator > 0.0).then(|| round(numerator * 100.0 / denominator))
}

/// The `quantile` (0..=1) of a list, nearest rank.
pub fn percentile(sorted: &[u32], quantile: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(f64::from(sorted[rank - 1]))
}

fn dollars(micros: i64) -> f64 {
    micros as f64 / 1e6
}

pub(crate) fn policy_report(tally: Tally, hash: u64, world: &World, big_gang_interval_s: u32) -> PolicyReport {
    let mut tally = tally;
    let waits: Vec<Vec<u32>> = tally
        .waits
        .iter_mut()
        .map(|waits| {
            let mut sorted = std::mem::take(waits);
            sorted.sort_unstable();
            sorted
        })
        .collect();
    let wait = |quantile: f64| TierFigures::from([0, 1, 2].map(|tier| percentile(&waits[tier], quantile)));
    let billed_hours = |tier: usize| tally.billed_milli_s[tier] as f64 / 3_600_000.0;
    let paid_total: i64 = tally.paid.iter().map(|micros| micros.0).sum();
    let billed_total: f64 = (0..3).map(billed_hours).sum();
    let on_demand_total: i64 = tally.on_demand_cost.iter().map(|micros| micros.0).sum();
    let useful_h100_hours: f64 = tally.useful_h100_milli_s.iter().sum::<u64>() as f64 / 3_600_000.0;
    let discount =
        |paid: i64, reference: i64| (reference > 0).then(|| round(100.0 * (1.0 - paid as f64 / reference as f64)));
    let offered_hours: f64 = tally.offered_gpu_s.iter().sum::<f64>() / 3600.0;
    let earned_total: i64 = tally.provider_earned.iter().map(|micros| micros.0).sum();
    let run_s = (world.end - world.start) as f64;
    let mut by_kind_fill = BTreeMap::new();
    let mut by_kind_revenue = BTreeMap::new();
    for kind in ProviderKind::ALL {
        let offered = tally.offered_gpu_s[kind as usize] / 3600.0;
        if offered <= 0.0 {
            continue;
        }
        let sold = tally.sold_milli_s[kind as usize] as f64 / 3_600_000.0;
        by_kind_fill.insert(kind.name(), Some(round(sold * 100.0 / offered)));
        by_kind_revenue.insert(
            kind.name(),
            Some(round(dollars(tally.provider_earned[kind as usize].0) / offered)),
        );
    }
    let sold_hours = tally.sold_milli_s.iter().sum::<u64>() as f64 / 3_600_000.0;
    let gangs = WorkTally {
        allocated: tally.work[1].allocated + tally.work[2].allocated,
        useful: tally.work[1].useful + tally.work[2].useful,
        ..WorkTally::default()
    };
    let all_useful: u64 = tally.work.iter().map(|work| work.useful).sum();
    let all_allocated: u64 = tally.work.iter().map(|work| work.allocated).sum();
    let bronze_hours = billed_hours(2);
    let work_accounted = tally.work.iter().all(|work| work.allocated == work.accounted());
    let ledger_balanced = tally.ledger_failures.is_empty() && paid_total == earned_total + tally.platform_fees.0;
    let big_gang = world.big_gang.as_ref().map(|gang| BigGangReport {
        gpus: gang.spec.replicas * 8,
        checkpoint_interval_s: big_gang_interval_s,
        goodput_pct: ratio_pct(tally.work[2].useful as f64, tally.work[2].allocated as f64),
        running_pct: round(tally.big_gang_running_s as f64 * 100.0 / run_s),
        node_failures: tally.big_gang_failures,
        repairs: tally.big_gang_repairs,
        restarts: tally.big_gang_restarts,
        spares_reserved: tally.spares_reserved,
        work: WorkHours::from(&tally.work[2]),
    });
    PolicyReport {
        utilization_pct: round(tally.used_milli_s / 1000.0 * 100.0 / (tally.fleet_gpus as f64 * run_s).max(1.0)),
        fill_rate_pct: ratio_pct(sold_hours, offered_hours).unwrap_or(0.0),
        wait_p50_s: wait(0.50),
        wait_p95_s: wait(0.95),
        wait_p99_s: wait(0.99),
        unserved_pct: TierFigures::from([0, 1, 2].map(|tier| {
            ratio_pct(
                (tally.gave_up[tier] + tally.unstarted_at_end[tier] + tally.rejected[tier]) as f64,
                tally.submitted[tier] as f64,
            )
        })),
        preemptions_per_bronze_gpu_hour: if bronze_hours > 0.0 {
            round(tally.preempted_leases[2] as f64 / bronze_hours)
        } else {
            0.0
        },
        goodput_pct: ratio_pct(gangs.useful as f64, gangs.allocated as f64),
        goodput_all_pct: ratio_pct(all_useful as f64, all_allocated as f64),
        tenant_usd_per_gpu_hour: (billed_total > 0.0).then(|| round(dollars(paid_total) / billed_total)),
        tenant_usd_per_useful_h100_hour: (useful_h100_hours > 0.0)
            .then(|| round(dollars(paid_total) / useful_h100_hours)),
        tenant_usd_per_gpu_hour_by_tier: TierFigures::from(
            [0, 1, 2].map(|tier| (billed_hours(tier) > 0.0).then(|| dollars(tally.paid[tier].0) / billed_hours(tier))),
        ),
        bronze_discount_vs_on_demand_pct: discount(tally.paid[2].0, tally.on_demand_cost[2].0),
        discount_vs_on_demand_pct: discount(paid_total, on_demand_total),
        discount_vs_on_demand_pct_by_tier: TierFigures::from(
            [0, 1, 2].map(|tier| discount(tally.paid[tier].0, tally.on_demand_cost[tier].0)),
        ),
        clearing_premium_pct: {
            let asked: i64 = tally.asked.iter().map(|micros| micros.0).sum();
            (asked > 0).then(|| round((paid_total as f64 / asked as f64 - 1.0) * 100.0))
        },
        provider_usd_per_offered_gpu_hour: if offered_hours > 0.0 {
            round(dollars(earned_total) / offered_hours)
        } else {
            0.0
        },
        provider_usd_per_offered_gpu_hour_by_kind: by_kind_revenue,
        fill_rate_pct_by_kind: by_kind_fill,
        fragmentation_pct: if tally.frag_samples > 0 {
            round(tally.frag_sum / tally.frag_samples as f64)
        } else {
            0.0
        },
        matcher_us_per_event: (tally.matcher_ns > 0 && tally.events > 0)
            .then(|| round(tally.matcher_ns as f64 / 1000.0 / tally.events as f64)),
        matcher_s_by_call: (tally.matcher_ns > 0).then(|| {
            super::tally::CALL_NAMES
                .iter()
                .zip(tally.matcher_ns_by_call)
                .map(|(name, ns)| (*name, round(ns as f64 / 1e9)))
                .collect()
        }),
        jobs: JobCounts {
            submitted: TierCounts::from(tally.submitted),
            started: TierCounts::from(tally.started),
            finished: TierCounts::from(tally.finished),
            gave_up: TierCounts::from(tally.gave_up),
            unstarted_at_end: TierCounts::from(tally.unstarted_at_end),
            rejected: TierCounts::from(tally.rejected),
        },
        preempted_leases: TierCounts::from(tally.preempted_leases),
        window_preempted_leases: TierCounts::from(tally.window_preempted_leases),
        node_failures: tally.node_failures,
        failed_leases: tally.failed_leases,
        gang_repairs: tally.repairs,
        gang_repairs_failed: tally.repairs_failed,
        gang_restarts: tally.gang_restarts,
        work: BTreeMap::from([
            ("single", WorkHours::from(&tally.work[0])),
            ("gangs", WorkHours::from(&tally.work[1])),
            ("big_gang", WorkHours::from(&tally.work[2])),
        ]),
        big_gang,
        money: Money {
            tenants_paid_usd: round(dollars(paid_total)),
            providers_earned_usd: round(dollars(earned_total)),
            platform_fees_usd: round(dollars(tally.platform_fees.0)),
            charges: tally.transactions,
        },
        invariants: Invariants {
            consistency_checks: tally.consistency_checks,
            consistency_failures: tally.consistency_failures.clone(),
            ledger_checks: tally.ledger_checks,
            ledger_balanced,
            work_accounted,
            ledger_failures: tally.ledger_failures.clone(),
        },
        events: tally.events,
        passes: tally.passes,
        placements_tried: tally.placements_tried,
        preemptions_tried: tally.preemptions_tried,
        matcher_calls: tally.matcher_calls,
        trace_hash: format!("{hash:016x}"),
        fraud: tally.fraud.clone(),
        samples: std::mem::take(&mut tally.samples),
    }
}

pub(crate) fn build(config: &MarketConfig, world: &World, outcomes: Vec<(PolicyName, Tally, u64)>) -> MarketReport {
    let catalog = GpuCatalog::embedded();
    let fleet = &world.fleet;
    let mut gpus_by_kind = BTreeMap::new();
    let mut gpus_by_model = BTreeMap::new();
    let mut windowed_gpus = 0;
    for (index, node) in fleet.nodes.iter().enumerate() {
        *gpus_by_kind.entry(fleet.kinds[index].name()).or_insert(0) += u64::from(node.gpu_count);
        *gpus_by_model
            .entry(catalog.spec(node.gpu_model).name.clone())
            .or_insert(0) += u64::from(node.gpu_count);
        if !node.policy.windows.is_empty() {
            windowed_gpus += u64::from(node.gpu_count);
        }
    }
    let mut trace = super::trace::TraceHash::new();
    let jobs = outcomes
        .first()
        .map_or(0, |(_, tally, _)| tally.submitted.iter().sum::<u64>());
    let mut policies = BTreeMap::new();
    for (policy, tally, hash) in outcomes {
        trace.add(&[policy as i64, hash as i64]);
        policies.insert(
            policy.name(),
            policy_report(tally, hash, world, config.gang_checkpoint_interval_s),
        );
    }
    let demand = match (&config.demand, &world.demand) {
        (DemandSource::Replay { path, compress }, _) => DemandSummary {
            source: format!("replay of {} compressed {compress}×", path.display()),
            jobs,
            ..DemandSummary::default()
        },
        (DemandSource::Synthetic, Some(demand)) => DemandSummary {
            source: "synthetic".into(),
            load_pct: Some(round(f64::from(demand.load_permille) / 10.0)),
            arrivals_per_hour: Some(round(demand.arrivals_per_s * 3600.0)),
            mean_gpu_hours_per_job: Some(round(demand.mean_gpu_s_per_job / 3600.0)),
            jobs,
        },
        (DemandSource::Synthetic, None) => DemandSummary::default(),
    };
    MarketReport {
        seed: config.seed,
        trace_hash: format!("{:016x}", trace.0),
        scenario: config.scenario.name(),
        days: config.days,
        pay_as_bid_bids: config.pay_as_bid_bidding.name(),
        gold_ask_premium_pct: f64::from(config.gold_ask_premium_permille) / 10.0,
        fleet: FleetSummary {
            source: fleet.source.clone(),
            gpus: fleet.gpu_count(),
            nodes: fleet.nodes.len(),
            gpus_by_kind,
            gpus_by_model,
            node_interruptions: world
                .node_events
                .iter()
                .filter(|event| !event.up && !event.vanish)
                .count(),
            windowed_gpus,
        },
        demand,
        fraud: policies.get("fallow").and_then(|fallow: &PolicyReport| {
            let report = fallow.fraud.as_ref()?;
            Some(FraudSummary {
                fraud_rate: config.fraud_rate,
                fraud_detected_pct: report.fraud_detected_pct,
                median_days_to_detect: report.median_days_to_detect,
                honest_slashed: report.honest_slashed,
                tenant_loss_to_fraud_pct: report.tenant_loss_to_fraud_pct,
            })
        }),
        policies,
    }
}
