//! `fallow sim market`: the market in virtual time with the production matcher. A seeded world
//! — a fleet of providers with their hours, asks and reliability, node failures and repairs,
//! demand from tenants in three tiers — is built once; then each policy (Fallow's matcher, a
//! FIFO cluster, a pay-as-bid market, the matcher without gang repair) runs on it alone, with
//! its own matcher, and the report compares them. The same seed gives the same event trace.

pub mod admission;
pub mod engine;
pub mod failures;
pub mod fleet;
pub mod fraud;
pub mod html;
pub mod policy;
pub mod report;
mod tally;
mod trace;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use model::{GpuDemand, JobId, JobSpec, Micros, Tier, Timestamp, TopologyLevel, WorkloadClass};

pub use fleet::{FleetError, FleetPlan, MarketFleet, ProviderKind};
pub use policy::{Bidding, PolicyName};
pub use report::{MarketReport, PolicyReport, TierFigures};
pub use tally::{Sample, Tally, WorkTally};
pub use workload::{Demand, JobKind, ReplayPod, SimJob};

use failures::NodeEvent;
use workload::{JobSource, Workload};

/// Monday 2025-01-06 00:00 UTC: the simulated week starts on a Monday.
pub const MARKET_START: Timestamp = 1_736_121_600;

/// Measures the matcher's time for the report, and nothing else: decisions never read it.
pub trait Stopwatch: Sync {
    /// Nanoseconds since some fixed origin.
    fn elapsed_ns(&self) -> u64;
}

/// For tests and callers that do not measure time: always zero.
pub struct NoStopwatch;

impl Stopwatch for NoStopwatch {
    fn elapsed_ns(&self) -> u64 {
        0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// The market alone.
    Default,
    /// One gold gang on a campus of GB200 NVL72 racks beside the market, for the whole run.
    BigTraining,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Default => "default",
            Scenario::BigTraining => "big-training",
        }
    }

    pub fn parse(text: &str) -> Option<Scenario> {
        [Scenario::Default, Scenario::BigTraining]
            .into_iter()
            .find(|scenario| scenario.name() == text)
    }
}

/// Where the fleet comes from.
#[derive(Clone, Debug)]
pub enum FleetSource {
    Synthetic,
    /// A node list (openb, Philly or PAI form).
    NodeList(PathBuf),
}

/// Where the demand comes from.
#[derive(Clone, Debug)]
pub enum DemandSource {
    Synthetic,
    /// An openb pod list with times, its arrivals compressed by `compress`.
    Replay {
        path: PathBuf,
        compress: f64,
    },
}

#[derive(Clone, Debug)]
pub struct MarketConfig {
    /// GPUs of the synthetic market (a node list brings its own).
    pub gpus: u64,
    pub days: u32,
    pub seed: u64,
    pub scenario: Scenario,
    pub fleet: FleetSource,
    pub demand: DemandSource,
    /// Market prices per GPU-hour by catalog name (`synth::market_prices`, or `synth::sample_prices` in tests).
    pub prices: BTreeMap<String, Micros>,
    pub policies: Vec<PolicyName>,
    /// How sellers bid in the pay-as-bid market.
    pub pay_as_bid_bidding: Bidding,
    /// Providers' gold asks over their silver asks (per mille; 0: the same, their cost).
    pub gold_ask_premium_permille: u32,
    /// The share of providers that lie (0: none, and no trust policy runs).
    pub fraud_rate: f64,
    /// Synthetic demand in GPU-seconds as a share (per mille) of what the market offers.
    pub load_permille: u32,
    /// The big-training gang: its GPUs and checkpoint interval.
    pub gang_gpus: u32,
    pub gang_checkpoint_interval_s: u32,
    /// The matcher's `consistency_check` and the ledger's balance run this often (virtual
    /// seconds; 0 = after every event), and at the end.
    pub check_every_s: Timestamp,
    /// The charts' resolution.
    pub sample_every_s: Timestamp,
    /// Policies run side by side on this many threads (each is deterministic alone).
    pub threads: usize,
}

impl MarketConfig {
    /// The defaults of `fallow sim market`, for a fleet of `gpus` over `days`.
    pub fn new(gpus: u64, days: u32, seed: u64, prices: BTreeMap<String, Micros>) -> MarketConfig {
        MarketConfig {
            gpus,
            days,
            seed,
            scenario: Scenario::Default,
            fleet: FleetSource::Synthetic,
            demand: DemandSource::Synthetic,
            prices,
            policies: PolicyName::ALL.to_vec(),
            pay_as_bid_bidding: Bidding::Shaded,
            gold_ask_premium_permille: 0,
            fraud_rate: 0.0,
            load_permille: 900,
            gang_gpus: 100_000,
            gang_checkpoint_interval_s: 1800,
            check_every_s: 6 * 3600,
            sample_every_s: 600,
            threads: 1,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MarketError {
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Trace(#[from] crate::packing::TraceError),
    #[error("{0}")]
    Invalid(String),
}

/// The window and price boundaries: nodes whose windows close or open at `at`, and nodes
/// whose price multiplier changes there.
#[derive(Clone, Debug, Default)]
pub struct Tick {
    pub at: Timestamp,
    pub closed: Vec<u32>,
    pub opened: Vec<u32>,
    pub repriced: Vec<u32>,
}

/// What every policy's run shares: the fleet, its failures, its hours and the demand.
pub struct World {
    pub fleet: MarketFleet,
    pub start: Timestamp,
    pub end: Timestamp,
    pub node_events: Vec<NodeEvent>,
    pub ticks: Vec<Tick>,
    pub open_at_start: Vec<bool>,
    /// Every node's windows are weekly, so the ticks list every change of a node's
    /// availability and price: the matcher's clock moves node by node (else minute by minute).
    pub ticks_complete: bool,
    /// Per model index: whether the fleet has it and its GPU memory (jobs' memory floors are
    /// given to the matcher as the models that meet them).
    pub fleet_models: Vec<(model::GpuModel, u32)>,
    pub demand: Option<Arc<Demand>>,
    pub replay: Option<(Arc<Vec<ReplayPod>>, f64)>,
    pub big_gang: Option<SimJob>,
    pub check_every_s: Timestamp,
    pub sample_every_s: Timestamp,
    pub pay_as_bid_bidding: Bidding,
    /// Who lies and how (`--fraud-rate`); `None` without fraud.
    pub fraud: Option<fraud::FraudPlan>,
}

impl World {
    pub fn build(config: &MarketConfig) -> Result<World, MarketError> {
        if config.days == 0 {
            return Err(MarketError::Invalid("--days must be at least 1".into()));
        }
        let start = MARKET_START;
        let end = start + i64::from(config.days) * 86_400;
        let campus = (config.scenario == Scenario::BigTraining).then_some(config.gang_gpus);
        if let Some(gang_gpus) = campus
            && (gang_gpus == 0 || !gang_gpus.is_multiple_of(8))
        {
            return Err(MarketError::Invalid(format!(
                "the gang's GPUs must be a positive multiple of 8 (8-GPU replicas), not {gang_gpus}"
            )));
        }
        let mut fleet = match &config.fleet {
            FleetSource::Synthetic => fleet::synthetic(&FleetPlan {
                gpus: config.gpus,
                seed: config.seed,
                prices: config.prices.clone(),
                campus_gang_gpus: campus,
            })?,
            FleetSource::NodeList(path) => {
                if campus.is_some() {
                    return Err(MarketError::Invalid(
                        "the big-training scenario builds its own campus: use it with the synthetic fleet".into(),
                    ));
                }
                let listed = fleet::read_node_list(path)?;
                fleet::from_node_list(&listed, config.seed, &config.prices, &path.display().to_string())?
            }
        };
        if config.gold_ask_premium_permille > 0 {
            fleet::set_gold_ask_premium(&mut fleet, config.gold_ask_premium_permille);
        }
        let mut node_events = failures::node_events(&fleet, config.seed, start, end);
        if !(config.fraud_rate.is_finite() && (0.0..=1.0).contains(&config.fraud_rate)) {
            return Err(MarketError::Invalid(format!(
                "--fraud-rate must be between 0 and 1, not {}",
                config.fraud_rate
            )));
        }
        let fraud = (config.fraud_rate > 0.0).then(|| {
            let (plan, vanishes) =
                fraud::FraudPlan::draw(&fleet, config.fraud_rate, config.seed, start, end, &node_events);
            node_events.extend(vanishes);
            node_events.sort_unstable();
            plan
        });
        let (ticks, open_at_start) = ticks(&fleet, start, end);
        let ticks_complete = fleet.nodes.iter().all(|node| {
            node.policy
                .windows
                .iter()
                .all(|window| matches!(window, model::AvailabilityWindow::Weekly { .. }))
        });
        let fleet_models = {
            let catalog = model::GpuCatalog::embedded();
            let mut models: Vec<model::GpuModel> = fleet.nodes.iter().map(|node| node.gpu_model).collect();
            models.sort_unstable();
            models.dedup();
            models
                .into_iter()
                .map(|model| (model, catalog.spec(model).memory_mib))
                .collect()
        };
        let (demand, replay) = match &config.demand {
            DemandSource::Synthetic => (
                Some(Arc::new(Demand::new(
                    &fleet,
                    config.seed,
                    start,
                    end,
                    config.load_permille,
                ))),
                None,
            ),
            DemandSource::Replay { path, compress } => {
                if !(compress.is_finite() && *compress > 0.0) {
                    return Err(MarketError::Invalid(format!(
                        "--compress must be a positive number, not {compress}"
                    )));
                }
                (None, Some((Arc::new(workload::read_replay(path)?), *compress)))
            }
        };
        let big_gang =
            campus.map(|gang_gpus| big_gang(gang_gpus, config.gang_checkpoint_interval_s, start, end, &fleet));
        Ok(World {
            fleet,
            start,
            end,
            node_events,
            ticks,
            open_at_start,
            ticks_complete,
            fleet_models,
            demand,
            replay,
            big_gang,
            check_every_s: config.check_every_s,
            sample_every_s: config.sample_every_s.max(60),
            pay_as_bid_bidding: config.pay_as_bid_bidding,
            fraud,
        })
    }

    pub(crate) fn job_source(&self) -> JobSource {
        match (&self.demand, &self.replay) {
            (_, Some((pods, compress))) => JobSource::Replay {
                pods: pods.clone(),
                next: 0,
                start: self.start,
                end: self.end,
                compress: *compress,
            },
            (Some(demand), None) => JobSource::Synthetic(Box::new(Workload::new(demand.clone()))),
            (None, None) => unreachable!("a world has a demand or a replay"),
        }
    }
}

/// The big-training gang: gold, 8-GPU replicas of GB200 in one site (the campus), checkpoints
/// every `interval` seconds at 10 s each, work for longer than the run.
fn big_gang(gang_gpus: u32, interval: u32, start: Timestamp, end: Timestamp, fleet: &MarketFleet) -> SimJob {
    let campus = fleet.campus.as_ref().expect("the scenario built a campus");
    let mut spec = JobSpec::new(JobId(0), Tier::Gold, GpuDemand::Whole { count: 8 }, workload::UNCAPPED);
    spec.class = WorkloadClass::Training;
    spec.replicas = gang_gpus / 8;
    spec.topology = TopologyLevel::Site;
    spec.resources.gpu_models = vec![campus.model];
    spec.resources.cpu_milli = 64_000;
    spec.resources.memory_mib = 512 * 1024;
    spec.checkpoint_interval_s = interval;
    spec.submitted_at = start;
    let work_s = u32::try_from((end - start) * 2).unwrap_or(u32::MAX / 2);
    spec.max_runtime_s = work_s;
    SimJob {
        spec,
        kind: JobKind::BigGang,
        work_s,
        checkpoint_cost_s: workload::CHECKPOINT_COST_S,
        stateless: false,
        patience_s: u32::try_from(end - start).unwrap_or(u32::MAX),
    }
}

/// Every minute in `start..end` where some node's window or price rule changes, with the nodes
/// that close and open there; and which nodes are open at the start.
fn ticks(fleet: &MarketFleet, start: Timestamp, end: Timestamp) -> (Vec<Tick>, Vec<bool>) {
    use model::AvailabilityWindow;
    const WEEK_MIN: u32 = 7 * 1440;
    let mut boundaries = std::collections::BTreeSet::new();
    let mut add = |days: u8, start_minute: u32, end_minute: u32| {
        for day in 0..7u32 {
            if days & (1 << day) != 0 {
                boundaries.insert((day * 1440 + start_minute) % WEEK_MIN);
                boundaries.insert((day * 1440 + end_minute) % WEEK_MIN);
            }
        }
    };
    let mut windowed: Vec<u32> = Vec::new();
    let mut priced: Vec<u32> = Vec::new();
    for node in &fleet.nodes {
        for window in &node.policy.windows {
            if let AvailabilityWindow::Weekly {
                days,
                start_minute,
                end_minute,
            } = *window
            {
                add(days, start_minute, end_minute);
            }
        }
        for rule in &node.policy.price_rules {
            add(rule.days, rule.start_minute, rule.end_minute);
        }
        if !node.policy.windows.is_empty() {
            windowed.push(node.id.0);
        }
        if !node.policy.price_rules.is_empty() {
            priced.push(node.id.0);
        }
    }
    let open_at_start: Vec<bool> = fleet
        .nodes
        .iter()
        .map(|node| node.policy.available_until(start).is_some())
        .collect();
    let week_start = model::time::day_start(start) - i64::from(model::time::weekday(start)) * 86_400;
    let mut times = Vec::new();
    let mut week = week_start;
    while week < end {
        for minute in &boundaries {
            let at = week + i64::from(*minute) * 60;
            if at > start && at < end {
                times.push(at);
            }
        }
        week += 7 * 86_400;
    }
    times.sort_unstable();
    let mut open = open_at_start.clone();
    let ticks = times
        .into_iter()
        .map(|at| {
            let mut tick = Tick { at, ..Tick::default() };
            for &node in &windowed {
                let now_open = fleet.nodes[node as usize].policy.available_until(at).is_some();
                if now_open != open[node as usize] {
                    open[node as usize] = now_open;
                    if now_open {
                        tick.opened.push(node);
                    } else {
                        tick.closed.push(node);
                    }
                }
            }
            for &node in &priced {
                let policy = &fleet.nodes[node as usize].policy;
                if policy.multiplier_at(at) != policy.multiplier_at(at - 60) {
                    tick.repriced.push(node);
                }
            }
            tick
        })
        .collect();
    (ticks, open_at_start)
}

/// Runs every policy of the config on one world and reports them side by side.
pub fn run_market(config: &MarketConfig, stopwatch: &dyn Stopwatch) -> Result<MarketReport, MarketError> {
    if config.policies.is_empty() {
        return Err(MarketError::Invalid("no policy to run".into()));
    }
    let world = World::build(config)?;
    let threads = config.threads.max(1).min(config.policies.len());
    let mut outcomes: Vec<Option<(Tally, u64)>> = vec![None; config.policies.len()];
    if threads == 1 {
        for (slot, policy) in config.policies.iter().enumerate() {
            outcomes[slot] = Some(engine::PolicySim::new(&world, *policy, stopwatch).run());
        }
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = std::sync::Mutex::new(&mut outcomes);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    loop {
                        let slot = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(policy) = config.policies.get(slot) else { break };
                        let outcome = engine::PolicySim::new(&world, *policy, stopwatch).run();
                        results.lock().unwrap_or_else(|poisoned| poisoned.into_inner())[slot] = Some(outcome);
                    }
                });
            }
        });
    }
    let outcomes: Vec<(PolicyName, Tally, u64)> = config
        .policies
        .iter()
        .zip(outcomes)
        .map(|(policy, outcome)| {
            let (tally, hash) = outcome.expect("every policy ran");
            (*policy, tally, hash)
        })
        .collect();
    Ok(report::build(config, &world, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use matcher::{Matcher, MatcherConfig};
    use model::GpuDemand;

    /// Moving the matcher's clock node by node from the ticks places every probe job exactly
    /// where moving it over the whole fleet does.
    #[test]
    fn the_clock_moved_by_ticks_matches_the_clock_moved_over_every_node() {
        let config = MarketConfig::new(2_000, 7, 1, synth::sample_prices());
        let world = World::build(&config).expect("a world");
        assert!(world.ticks_complete);
        let fleet = &world.fleet;
        let build = || Matcher::new(fleet.topology.clone(), fleet.nodes.clone(), MatcherConfig::default());
        let (mut whole, mut by_ticks) = (build(), build());
        whole.advance_clock(world.start);
        by_ticks.advance_clock(world.start);
        let probes: Vec<JobSpec> = [
            (Tier::Silver, 1, 3600),
            (Tier::Bronze, 1, 3600),
            (Tier::Gold, 8, 20 * 3600),
            (Tier::Silver, 2, 9 * 3600),
        ]
        .into_iter()
        .enumerate()
        .map(|(index, (tier, gpus, runtime))| {
            let mut job = JobSpec::new(
                JobId(index as u64 + 1),
                tier,
                GpuDemand::Whole { count: gpus },
                workload::UNCAPPED,
            );
            job.max_runtime_s = runtime;
            job
        })
        .collect();
        let mut cursor = 0;
        let mut now = world.start + 17;
        let mut compared = 0;
        while now < world.end {
            whole.advance_clock(now);
            let mut changed = Vec::new();
            while let Some(tick) = world.ticks.get(cursor)
                && tick.at.div_euclid(60) <= now.div_euclid(60)
            {
                changed.extend_from_slice(&tick.closed);
                changed.extend_from_slice(&tick.opened);
                changed.extend_from_slice(&tick.repriced);
                cursor += 1;
            }
            by_ticks.advance_clock_for(now, &changed);
            for probe in &probes {
                assert_eq!(whole.plan(probe, now), by_ticks.plan(probe, now), "at {now}");
                compared += 1;
            }
            now += 7 * 60;
        }
        assert!(compared > 5_000);
    }
}
