//! `fallow bench …`: benchmarks of the matching engine on a synthetic fleet (crate `synth`),
//! printing one JSON object with `--json`. Only the matcher calls are timed; building the fleet,
//! the harness's own bookkeeping and the checks of every result are not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::{Args, Subcommand};
use matcher::{Matcher, MatcherConfig, Placement};
use model::{FabricId, JobId, JobSpec, Micros, NodeId, Tier, Timestamp, TopologyLevel};
use serde_json::{Value, json};
use synth::{FleetSpec, IndexPicker, JobStream};

/// Virtual time of the benches: Saturday 2025-01-11 22:00 UTC, when every provider's window
/// (evenings, nights, weekends) is open, so "60 % full" means 60 % of the whole fleet. Closed
/// windows take their nodes out of the market (see the matcher's clock).
const BENCH_START: Timestamp = 1_736_632_800;
/// Virtual time of `--fleet market`: Wednesday 2025-01-08 02:00 UTC, a weekday night when the
/// labs' windows are open but close within half an hour (India), 5 hours (Europe) or 11 hours
/// (US East), and US West's labs and most hobbyists are closed: firm work longer than a lab's
/// night must pass over the open labs, which is what the index's window filter is for.
const MARKET_BENCH_START: Timestamp = 1_736_301_600;
/// The market workload's demand level when drawing jobs (it sets arrival times, which the bench
/// ignores: its own clock moves with decisions).
const MARKET_LOAD_PERMILLE: u32 = 800;
/// Virtual time advances one second per this many decisions (10,000 arrivals a second).
const DECISIONS_PER_VIRTUAL_SECOND: u64 = 10_000;
/// Warm-up gives up after this many refusals in a row: the fleet cannot reach the fill.
const WARMUP_REFUSALS_IN_A_ROW_MAX: u64 = 100_000;
/// Arrivals and departures between two gang or preemption trials, so trials see different states.
pub(crate) const CHURN_BETWEEN_TRIALS: u64 = 1_000;
/// Filling "until refusals dominate": attempts are counted in windows of this size …
const FULL_WINDOW_ATTEMPTS: u64 = 10_000;
/// … and filling stops after a window with at least this share refused.
const FULL_WINDOW_REFUSED_SHARE: f64 = 0.9;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Sustained single-job decisions on a synthetic fleet held near a fill level (B1, B2).
    Matcher(MatcherArgs),
    /// Topology-constrained gang placement in one fabric on a 60 %-full fleet (B4).
    Gang(GangArgs),
    /// Preemption victims for a gold gang on a nearly full fleet (B5).
    Preempt(PreemptArgs),
    /// Repair of a running gang that lost nodes at once, one lost replica at a time, on a
    /// 60 %-full fleet.
    Repair(crate::cmd_bench_repair::RepairArgs),
    /// The coordinator's HTTP API under a fleet's heartbeats and job submissions.
    Api(crate::cmd_bench_api::ApiArgs),
    /// The gateway's data plane: requests to serving replicas through their nodes' tunnels,
    /// against the same replicas called directly.
    Serve(crate::cmd_bench_serve::ServeArgs),
}

#[derive(Args, Clone, Debug)]
pub struct FleetArgs {
    /// GPUs in the synthetic fleet (8 per node).
    #[arg(long, default_value_t = 1_000_000)]
    gpus: u64,
    /// Seed of the fleet, the job stream and the departures.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The shared traces folder (for the market prices), relative to the working directory.
    #[arg(long, default_value = "../shared/traces")]
    traces: PathBuf,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Which fleet and job mix `bench matcher` runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FleetKind {
    /// synth's fleet and job stream.
    Synthetic,
    /// The market simulator's fleet of provider kinds (datacentres; labs open nights and
    /// weekends; hobbyists selling only bronze in the evening) with its workload's tier mix,
    /// shapes and runtimes (single-replica jobs: gangs are `bench gang`'s).
    Market,
}

impl FleetKind {
    fn name(self) -> &'static str {
        match self {
            FleetKind::Synthetic => "synthetic",
            FleetKind::Market => "market",
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct MatcherArgs {
    #[command(flatten)]
    fleet: FleetArgs,
    /// The fleet and job mix.
    #[arg(long = "fleet", value_enum, default_value_t = FleetKind::Synthetic)]
    fleet_kind: FleetKind,
    /// Share of the fleet's GPU capacity kept in use.
    #[arg(long, default_value_t = 0.6)]
    fill: f64,
    /// Timed decisions after the warm-up.
    #[arg(long, default_value_t = 200_000)]
    decisions: u64,
}

#[derive(Args, Clone, Debug)]
pub struct GangArgs {
    #[command(flatten)]
    fleet: FleetArgs,
    /// GPUs of the gang: gang_gpus / 8 replicas of 8 GPUs.
    #[arg(long, default_value_t = 16_384)]
    gang_gpus: u32,
    #[arg(long, default_value_t = 30)]
    trials: u32,
    #[arg(long, default_value_t = 0.6)]
    fill: f64,
}

#[derive(Args, Clone, Debug)]
pub struct PreemptArgs {
    #[command(flatten)]
    fleet: FleetArgs,
    /// GPUs of the gold gang: gang_gpus / 8 replicas of 8 GPUs.
    #[arg(long, default_value_t = 8_192)]
    gang_gpus: u32,
    #[arg(long, default_value_t = 30)]
    trials: u32,
    /// Fill to this share of the fleet instead of until refusals dominate (nearly full).
    #[arg(long)]
    fill: Option<f64>,
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Matcher(args) => bench_matcher(&args),
        BenchCommand::Gang(args) => bench_gang(&args),
        BenchCommand::Preempt(args) => bench_preempt(&args),
        BenchCommand::Repair(args) => crate::cmd_bench_repair::run(&args),
        BenchCommand::Api(args) => crate::cmd_bench_api::run(&args),
        BenchCommand::Serve(args) => crate::cmd_bench_serve::run(&args),
    }
}

/// A job the harness placed and has not released.
struct RunningJob {
    id: JobId,
    gpu_milli: u64,
    bronze: bool,
    /// The node of each lease.
    nodes: Vec<NodeId>,
}

/// Where the harness's jobs come from.
enum Jobs {
    Synthetic(Box<JobStream>),
    /// The market simulator's workload, with its multi-replica jobs left out.
    Market(Box<sim::market::workload::Workload>),
}

/// The matcher over a synthetic fleet, with the harness's own record of what runs where,
/// so that results are checked against it rather than trusted.
pub(crate) struct Harness {
    pub(crate) matcher: Matcher,
    jobs: Jobs,
    pub(crate) picker: IndexPicker,
    running: Vec<RunningJob>,
    /// Tier of each running job, by job id (ids are dense from 1).
    running_tier: Vec<Option<Tier>>,
    pub(crate) gpu_milli_used: u64,
    node_fabric: Vec<FabricId>,
    node_gpus: Vec<u8>,
    /// Leases on each node, all tiers and non-bronze only: the harness's own view of who is where.
    node_leases: Vec<u32>,
    node_non_bronze_leases: Vec<u32>,
    pub(crate) now: Timestamp,
    decisions: u64,
    pub(crate) fleet_build_s: f64,
    pub(crate) matcher_build_s: f64,
}

/// What one `place` did.
struct Decision {
    placed: bool,
    elapsed: Duration,
    /// Which of [`JOB_KINDS`] the job is.
    kinds: u16,
}

/// Kinds of job that decision latencies are broken down by (a job may be several).
const JOB_KINDS: [&str; 10] = [
    "one_gpu",
    "share",
    "multi_gpu",
    "region_constrained",
    "model_constrained",
    "uncapped",
    "with_datasets",
    "reliability_floor",
    "bronze",
    "refused",
];

fn job_kinds(job: &JobSpec, placed: bool) -> u16 {
    let flags = [
        job.resources.gpu == model::GpuDemand::Whole { count: 1 },
        matches!(job.resources.gpu, model::GpuDemand::Share { .. }),
        matches!(job.resources.gpu, model::GpuDemand::Whole { count } if count > 1),
        !job.regions.is_empty(),
        !job.resources.gpu_models.is_empty(),
        job.max_price == synth::UNCAPPED_PRICE,
        !job.datasets.is_empty(),
        job.reliability_min_ppm > 0,
        job.tier == Tier::Bronze,
        !placed,
    ];
    flags
        .iter()
        .enumerate()
        .fold(0, |kinds, (bit, &set)| kinds | (u16::from(set) << bit))
}

impl Harness {
    pub(crate) fn new(args: &FleetArgs) -> anyhow::Result<Harness> {
        Harness::with_prices(args.gpus, args.seed, load_prices(&args.traces)?)
    }

    pub(crate) fn with_prices(gpus: u64, seed: u64, prices: BTreeMap<String, Micros>) -> anyhow::Result<Harness> {
        let started = Instant::now();
        let fleet = synth::fleet(&FleetSpec { gpus, seed, prices })?;
        let fleet_build_s = started.elapsed().as_secs_f64();
        let jobs = Jobs::Synthetic(Box::new(JobStream::new(&fleet, seed)));
        Ok(Harness::assemble(
            fleet.topology,
            fleet.nodes,
            jobs,
            BENCH_START,
            seed,
            fleet_build_s,
        ))
    }

    /// The harness over `nodes`, its jobs submitted from `now` on.
    fn assemble(
        topology: model::Topology,
        nodes: Vec<model::Node>,
        jobs: Jobs,
        now: Timestamp,
        seed: u64,
        fleet_build_s: f64,
    ) -> Harness {
        let node_fabric = nodes.iter().map(|node| node.path.fabric).collect();
        let node_gpus: Vec<u8> = nodes.iter().map(|node| node.gpu_count).collect();
        let node_count = node_gpus.len();
        let started = Instant::now();
        let matcher = Matcher::new(topology, nodes, MatcherConfig::default());
        let matcher_build_s = started.elapsed().as_secs_f64();
        Harness {
            matcher,
            jobs,
            picker: IndexPicker::new(seed),
            running: Vec::new(),
            running_tier: vec![None],
            gpu_milli_used: 0,
            node_fabric,
            node_gpus,
            node_leases: vec![0; node_count],
            node_non_bronze_leases: vec![0; node_count],
            now,
            decisions: 0,
            fleet_build_s,
            matcher_build_s,
        }
    }

    /// The market simulator's fleet and workload (see [`FleetKind::Market`]).
    pub(crate) fn market(gpus: u64, seed: u64, prices: BTreeMap<String, Micros>) -> anyhow::Result<Harness> {
        let started = Instant::now();
        let fleet = sim::market::fleet::synthetic(&sim::market::FleetPlan {
            gpus,
            seed,
            prices,
            campus_gang_gpus: None,
        })?;
        let fleet_build_s = started.elapsed().as_secs_f64();
        let end = MARKET_BENCH_START + 365 * 86_400;
        let demand = sim::market::Demand::new(&fleet, seed, MARKET_BENCH_START, end, MARKET_LOAD_PERMILLE);
        let workload = sim::market::workload::Workload::new(std::sync::Arc::new(demand));
        let jobs = Jobs::Market(Box::new(workload));
        let mut harness = Harness::assemble(
            fleet.topology,
            fleet.nodes,
            jobs,
            MARKET_BENCH_START,
            seed,
            fleet_build_s,
        );
        // The windows' open-time classes are read at the clock's minute.
        harness.matcher.advance_clock(MARKET_BENCH_START);
        Ok(harness)
    }

    /// The next single-replica job, submitted now.
    fn next_job(&mut self) -> anyhow::Result<JobSpec> {
        match &mut self.jobs {
            Jobs::Synthetic(stream) => Ok(stream.next_job(self.now)),
            Jobs::Market(workload) => loop {
                let job = workload
                    .next_job()
                    .context("the market workload ended (it runs a year of arrivals)")?;
                if job.spec.replicas == 1 {
                    let mut spec = job.spec;
                    spec.submitted_at = self.now;
                    return Ok(spec);
                }
            },
        }
    }

    pub(crate) fn nodes(&self) -> usize {
        self.node_gpus.len()
    }

    pub(crate) fn gpus(&self) -> u64 {
        self.node_gpus.iter().map(|&count| u64::from(count)).sum()
    }

    pub(crate) fn fill(&self) -> f64 {
        self.gpu_milli_used as f64 / self.matcher.gpu_milli_total() as f64
    }

    fn record_tier(&mut self, job: JobId, tier: Option<Tier>) {
        let index = job.index();
        if self.running_tier.len() <= index {
            self.running_tier.resize(index + 1, None);
        }
        self.running_tier[index] = tier;
    }

    pub(crate) fn tier_of_running(&self, job: JobId) -> Option<Tier> {
        self.running_tier.get(job.index()).copied().flatten()
    }

    /// Places the stream's next job, timing only the `place` call, and records the result.
    fn place_next(&mut self) -> anyhow::Result<Decision> {
        let job = self.next_job()?;
        let started = Instant::now();
        let result = self.matcher.place(&job, self.now);
        let elapsed = started.elapsed();
        self.decisions += 1;
        if self.decisions.is_multiple_of(DECISIONS_PER_VIRTUAL_SECOND) {
            self.now += 1;
        }
        let placed = match result {
            Ok(placement) => {
                let gpu_milli = check_single_placement(&job, &placement)?;
                self.gpu_milli_used += gpu_milli;
                let bronze = job.tier == Tier::Bronze;
                let nodes: Vec<NodeId> = placement.leases.iter().map(|lease| lease.node).collect();
                for node in &nodes {
                    self.node_leases[node.index()] += 1;
                    self.node_non_bronze_leases[node.index()] += u32::from(!bronze);
                }
                self.running.push(RunningJob {
                    id: job.id,
                    gpu_milli,
                    bronze,
                    nodes,
                });
                self.record_tier(job.id, Some(job.tier));
                true
            }
            Err(_) => false,
        };
        Ok(Decision {
            placed,
            elapsed,
            kinds: job_kinds(&job, placed),
        })
    }

    /// Releases a random running job; returns the time `release_job` took.
    fn release_random(&mut self) -> anyhow::Result<Duration> {
        ensure!(!self.running.is_empty(), "no running job to release");
        let index = self.picker.pick(self.running.len());
        let job = self.running.swap_remove(index);
        let started = Instant::now();
        let released = self.matcher.release_job(job.id, self.now);
        let elapsed = started.elapsed();
        ensure!(
            released > 0,
            "release_job({}) freed no lease, but the job was placed",
            job.id
        );
        self.gpu_milli_used -= job.gpu_milli;
        for node in &job.nodes {
            self.node_leases[node.index()] -= 1;
            self.node_non_bronze_leases[node.index()] -= u32::from(!job.bronze);
        }
        self.record_tier(job.id, None);
        Ok(elapsed)
    }

    /// Places jobs until the used share reaches `fill`. Returns (placed, refused).
    pub(crate) fn warm_up(&mut self, fill: f64) -> anyhow::Result<(u64, u64)> {
        let target = fill_target(&self.matcher, fill);
        let (mut placed, mut refused, mut refused_in_a_row) = (0u64, 0u64, 0u64);
        while self.gpu_milli_used < target {
            if self.place_next()?.placed {
                placed += 1;
                refused_in_a_row = 0;
            } else {
                refused += 1;
                refused_in_a_row += 1;
                if refused_in_a_row >= WARMUP_REFUSALS_IN_A_ROW_MAX {
                    bail!(
                        "warm-up stalled at {:.1} % used after {refused_in_a_row} refusals in a row: \
                         the fleet cannot reach a fill of {:.1} % with this job stream",
                        self.fill() * 100.0,
                        fill * 100.0
                    );
                }
            }
        }
        Ok((placed, refused))
    }

    /// Places jobs until a window of attempts is mostly refused. Returns (placed, refused).
    fn fill_until_refusals_dominate(&mut self) -> anyhow::Result<(u64, u64)> {
        let (mut placed, mut refused) = (0u64, 0u64);
        loop {
            let mut refused_in_window = 0u64;
            for _ in 0..FULL_WINDOW_ATTEMPTS {
                if self.place_next()?.placed {
                    placed += 1;
                } else {
                    refused += 1;
                    refused_in_window += 1;
                }
            }
            if refused_in_window as f64 >= FULL_WINDOW_REFUSED_SHARE * FULL_WINDOW_ATTEMPTS as f64 {
                return Ok((placed, refused));
            }
        }
    }

    /// Arrivals and departures that hold the used share near `target_milli`, untimed.
    pub(crate) fn churn(&mut self, steps: u64, target_milli: u64) -> anyhow::Result<()> {
        for _ in 0..steps {
            while self.gpu_milli_used > target_milli && !self.running.is_empty() {
                self.release_random()?;
            }
            self.place_next()?;
        }
        Ok(())
    }

    /// A fabric-level gang from the stream, submitted now.
    fn gang(&mut self, gang_gpus: u32, tier: Tier) -> anyhow::Result<JobSpec> {
        self.gang_at(gang_gpus, tier, TopologyLevel::Fabric)
    }

    /// A gang of 8-GPU replicas from the stream, held within one domain at `level`, submitted now.
    pub(crate) fn gang_at(&mut self, gang_gpus: u32, tier: Tier, level: TopologyLevel) -> anyhow::Result<JobSpec> {
        ensure!(
            gang_gpus >= 8 && gang_gpus.is_multiple_of(8),
            "--gang-gpus must be a positive multiple of 8, not {gang_gpus}"
        );
        let Jobs::Synthetic(stream) = &mut self.jobs else {
            bail!("gangs are drawn from synth's job stream: use the synthetic fleet");
        };
        let mut job = stream.gang_job(gang_gpus / 8, 8, level, tier);
        job.submitted_at = self.now;
        Ok(job)
    }

    /// Drops from the harness's record a running job that lost leases outside it (to a node
    /// loss or a preemption) and releases what it still holds, as the coordinator would before
    /// queueing it again. Returns false if the harness did not know the job.
    pub(crate) fn forget_job(&mut self, job: JobId) -> bool {
        let Some(index) = self.running.iter().position(|running| running.id == job) else {
            return false;
        };
        let job = self.running.swap_remove(index);
        self.matcher.release_job(job.id, self.now);
        self.gpu_milli_used -= job.gpu_milli;
        for node in &job.nodes {
            self.node_leases[node.index()] -= 1;
            self.node_non_bronze_leases[node.index()] -= u32::from(!job.bronze);
        }
        self.record_tier(job.id, None);
        true
    }

    /// The most nodes one fabric offers a whole-node replica of `job`, by the harness's own
    /// record: nodes whose policy takes the job now, and that are free (`bronze_too` false) or
    /// hold only bronze leases (`bronze_too` true). An upper bound that the matcher's answers
    /// are judged against, since it ignores CPU and memory.
    fn best_fabric_nodes(&self, job: &JobSpec, bronze_too: bool) -> u64 {
        let mut per_fabric: Vec<u64> = Vec::new();
        for (index, node) in self.matcher.nodes().iter().enumerate() {
            let usable = if bronze_too {
                self.node_non_bronze_leases[index] == 0
            } else {
                self.node_leases[index] == 0
            };
            let policy = &node.policy;
            if !usable
                || !policy.allowed_tiers.contains(job.tier)
                || !policy.allowed_classes.contains(job.class)
                || policy.available_seconds(self.now) < i64::from(job.max_runtime_s)
            {
                continue;
            }
            let fabric = self.node_fabric[index].index();
            if per_fabric.len() <= fabric {
                per_fabric.resize(fabric + 1, 0);
            }
            per_fabric[fabric] += 1;
        }
        per_fabric.into_iter().max().unwrap_or(0)
    }

    /// What is wrong with a gang placement, judged from its leases alone: `None` if it holds
    /// every replica with 8 whole GPUs of distinct nodes inside one fabric.
    fn gang_defect(&self, job: &JobSpec, placement: &Placement) -> Option<String> {
        let replicas = job.replicas as usize;
        if placement.job != job.id {
            return Some(format!("placement is for {} not {}", placement.job, job.id));
        }
        if placement.leases.len() != replicas {
            return Some(format!("{} leases for {replicas} replicas", placement.leases.len()));
        }
        let mut replica_seen = vec![false; replicas];
        let mut nodes: Vec<NodeId> = Vec::with_capacity(replicas);
        let fabric = self.node_fabric.get(placement.leases[0].node.index()).copied();
        for lease in &placement.leases {
            let Some(&node_fabric) = self.node_fabric.get(lease.node.index()) else {
                return Some(format!("lease on unknown {}", lease.node));
            };
            if Some(node_fabric) != fabric {
                return Some(format!("replicas span {} and {node_fabric}", fabric.expect("checked")));
            }
            if lease.gpu_count() != 8 || lease.gpu_milli != 1000 {
                return Some(format!(
                    "replica {} holds {} GPUs at {} milli",
                    lease.replica,
                    lease.gpu_count(),
                    lease.gpu_milli
                ));
            }
            if u32::from(self.node_gpus[lease.node.index()]) < 16
                && lease.gpu_mask >> self.node_gpus[lease.node.index()] != 0
            {
                return Some(format!("replica {} uses GPUs beyond {}", lease.replica, lease.node));
            }
            match replica_seen.get_mut(lease.replica as usize) {
                Some(seen) if !*seen => *seen = true,
                _ => {
                    return Some(format!(
                        "replica {} is missing, repeated or out of range",
                        lease.replica
                    ));
                }
            }
            nodes.push(lease.node);
        }
        nodes.sort_unstable();
        if nodes.windows(2).any(|pair| pair[0] == pair[1]) {
            return Some("two replicas of 8 GPUs on one 8-GPU node".into());
        }
        None
    }
}

fn load_prices(traces: &Path) -> anyhow::Result<BTreeMap<String, Micros>> {
    if !traces.is_dir() {
        bail!(
            "the traces folder {} does not exist here (the working directory is {}): run from the repository \
             root with ../shared/traces beside it, or pass --traces DIR (a folder holding {})",
            traces.display(),
            std::env::current_dir().map_or_else(|_| "unknown".into(), |dir| dir.display().to_string()),
            synth::PRICE_STATS_FILE
        );
    }
    synth::market_prices(traces).context("loading the market prices")
}

pub(crate) fn fill_target(matcher: &Matcher, fill: f64) -> u64 {
    (matcher.gpu_milli_total() as f64 * fill.clamp(0.0, 1.0)).round() as u64
}

/// Checks a single-replica placement against its job; returns the milli-GPU it holds.
fn check_single_placement(job: &JobSpec, placement: &Placement) -> anyhow::Result<u64> {
    ensure!(
        placement.job == job.id && placement.leases.len() == job.replicas as usize,
        "job {}: placement for {} with {} leases for {} replicas",
        job.id,
        placement.job,
        placement.leases.len(),
        job.replicas
    );
    let gpu_milli: u64 = placement
        .leases
        .iter()
        .map(|lease| u64::from(lease.gpu_milli_total()))
        .sum();
    let expected = match job.resources.gpu {
        model::GpuDemand::Whole { count } => Some(u64::from(count) * 1000 * u64::from(job.replicas)),
        model::GpuDemand::Share { milli } => Some(u64::from(milli) * u64::from(job.replicas)),
        model::GpuDemand::None => Some(0),
        model::GpuDemand::ComputeUnits { .. } => None,
    };
    if let Some(expected) = expected {
        ensure!(
            gpu_milli == expected,
            "job {}: leases hold {gpu_milli} milli-GPU, the job asked for {expected}",
            job.id
        );
    }
    Ok(gpu_milli)
}

/// Latency percentiles over sorted samples (nearest rank).
pub(crate) fn percentile(sorted: &[Duration], quantile: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn micros(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6 * 1000.0).round() / 1000.0
}

pub(crate) fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e3 * 1000.0).round() / 1000.0
}

pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |count| count.get())
}

pub(crate) fn consistency(matcher: &Matcher, gpu_milli_used: u64) -> anyhow::Result<f64> {
    let started = Instant::now();
    if let Err(problem) = matcher.consistency_check() {
        bail!("the matcher's consistency check failed: {problem}");
    }
    let elapsed = started.elapsed();
    ensure!(
        matcher.gpu_milli_used() == gpu_milli_used,
        "the matcher counts {} milli-GPU used, the harness's record says {gpu_milli_used}",
        matcher.gpu_milli_used()
    );
    Ok(millis(elapsed))
}

pub(crate) fn print(json_wanted: bool, report: &Value, summary: String) {
    if json_wanted {
        println!("{report}");
    } else {
        println!("{summary}");
    }
}

fn bench_matcher(args: &MatcherArgs) -> anyhow::Result<()> {
    ensure!(
        args.fill > 0.0 && args.fill < 1.0,
        "--fill must lie between 0 and 1, not {}",
        args.fill
    );
    let mut harness = match args.fleet_kind {
        FleetKind::Synthetic => Harness::new(&args.fleet)?,
        FleetKind::Market => Harness::market(args.fleet.gpus, args.fleet.seed, load_prices(&args.fleet.traces)?)?,
    };
    let warmup_started = Instant::now();
    let (warmup_placed, warmup_refused) = harness.warm_up(args.fill)?;
    let warmup_s = warmup_started.elapsed().as_secs_f64();

    let target = fill_target(&harness.matcher, args.fill);
    let mut decision_times = Vec::with_capacity(args.decisions as usize);
    let mut times_by_kind: Vec<Vec<Duration>> = vec![Vec::new(); JOB_KINDS.len()];
    let mut release_times = Vec::new();
    let (mut placed, mut refused) = (0u64, 0u64);
    let wall_started = Instant::now();
    for _ in 0..args.decisions {
        while harness.gpu_milli_used > target {
            release_times.push(harness.release_random()?);
        }
        let decision = harness.place_next()?;
        decision_times.push(decision.elapsed);
        for (bit, times) in times_by_kind.iter_mut().enumerate() {
            if decision.kinds & (1 << bit) != 0 {
                times.push(decision.elapsed);
            }
        }
        if decision.placed {
            placed += 1;
        } else {
            refused += 1;
        }
    }
    let wall = wall_started.elapsed();
    let consistency_check_ms = consistency(&harness.matcher, harness.gpu_milli_used)?;

    let in_place: Duration = decision_times.iter().sum();
    decision_times.sort_unstable();
    release_times.sort_unstable();
    let decisions = args.decisions as f64;
    let by_kind: serde_json::Map<String, Value> = JOB_KINDS
        .iter()
        .zip(times_by_kind.iter_mut())
        .map(|(kind, times)| {
            times.sort_unstable();
            let summary = json!({
                "count": times.len(),
                "p50_us": micros(percentile(times, 0.50)),
                "p99_us": micros(percentile(times, 0.99)),
            });
            (kind.to_string(), summary)
        })
        .collect();
    let report = json!({
        "bench": "matcher",
        "fleet": args.fleet_kind.name(),
        "decisions_per_sec": (decisions / in_place.as_secs_f64()).round(),
        "wall_decisions_per_sec": (decisions / wall.as_secs_f64()).round(),
        "p50_us": micros(percentile(&decision_times, 0.50)),
        "p99_us": micros(percentile(&decision_times, 0.99)),
        "p999_us": micros(percentile(&decision_times, 0.999)),
        "max_us": micros(decision_times.last().copied().unwrap_or_default()),
        "release_p50_us": micros(percentile(&release_times, 0.50)),
        "release_p99_us": micros(percentile(&release_times, 0.99)),
        "by_kind": by_kind,
        "threads": 1,
        "decisions": args.decisions,
        "placed": placed,
        "refused": refused,
        "departures": release_times.len(),
        "fill": args.fill,
        "fill_at_end": (harness.fill() * 1e4).round() / 1e4,
        "warmup_placed": warmup_placed,
        "warmup_refused": warmup_refused,
        "warmup_s": (warmup_s * 1e3).round() / 1e3,
        "fleet_build_s": (harness.fleet_build_s * 1e3).round() / 1e3,
        "matcher_build_s": (harness.matcher_build_s * 1e3).round() / 1e3,
        "consistency_check_ms": consistency_check_ms,
        "nodes": harness.nodes(),
        "gpus": harness.gpus(),
        "seed": args.fleet.seed,
        "cores": cores(),
    });
    let summary = format!(
        "matcher: {} decisions on {} GPUs ({} fleet) at {:.0} % fill, 1 thread: {:.0} decisions/s (wall {:.0}/s), \
         p50 {} µs, p99 {} µs, p99.9 {} µs; {placed} placed, {refused} refused; consistency check passed",
        args.decisions,
        harness.gpus(),
        args.fleet_kind.name(),
        args.fill * 100.0,
        report["decisions_per_sec"].as_f64().unwrap_or_default(),
        report["wall_decisions_per_sec"].as_f64().unwrap_or_default(),
        report["p50_us"],
        report["p99_us"],
        report["p999_us"],
    );
    print(args.fleet.json, &report, summary);
    Ok(())
}

fn bench_gang(args: &GangArgs) -> anyhow::Result<()> {
    ensure!(args.trials > 0, "--trials must be at least 1");
    let mut harness = Harness::new(&args.fleet)?;
    harness.warm_up(args.fill)?;
    let target = fill_target(&harness.matcher, args.fill);
    let fill_at_start = harness.fill();

    let mut plan_times = Vec::new();
    let mut commit_times = Vec::new();
    let (mut placed, mut refused, mut partial, mut commit_failures) = (0u32, 0u32, 0u32, 0u32);
    let mut defects: Vec<String> = Vec::new();
    let mut refusals: Vec<String> = Vec::new();
    let replicas = args.gang_gpus / 8;
    let (mut free_nodes_best_fabric_min, mut refused_while_fitting) = (u64::MAX, 0u32);
    for trial in 0..args.trials {
        if trial > 0 {
            harness.churn(CHURN_BETWEEN_TRIALS, target)?;
        }
        let tier = if trial.is_multiple_of(2) {
            Tier::Gold
        } else {
            Tier::Silver
        };
        let job = harness.gang(args.gang_gpus, tier)?;
        let free_nodes = harness.best_fabric_nodes(&job, false);
        free_nodes_best_fabric_min = free_nodes_best_fabric_min.min(free_nodes);
        let started = Instant::now();
        let result = harness.matcher.plan(&job, harness.now);
        plan_times.push(started.elapsed());
        match result {
            Ok(placement) => {
                if placement.leases.is_empty() {
                    refused += 1;
                    refusals.push("an empty plan".into());
                    continue;
                }
                if let Some(defect) = harness.gang_defect(&job, &placement) {
                    partial += 1;
                    defects.push(defect);
                    continue;
                }
                // The plan must also commit on the state it was made on; then free it again.
                let started = Instant::now();
                let committed = harness.matcher.commit(&placement);
                commit_times.push(started.elapsed());
                match committed {
                    Ok(_) => {
                        placed += 1;
                        let released = harness.matcher.release_job(job.id, harness.now);
                        ensure!(
                            released == replicas as usize,
                            "release_job({}) freed {released} leases, the gang had {replicas}",
                            job.id
                        );
                    }
                    Err(error) => {
                        commit_failures += 1;
                        defects.push(format!("commit: {error}"));
                    }
                }
            }
            Err(unplaced) => {
                refused += 1;
                refusals.push(unplaced.to_string());
                if free_nodes >= u64::from(replicas) {
                    refused_while_fitting += 1;
                }
            }
        }
    }
    let consistency_check_ms = consistency(&harness.matcher, harness.gpu_milli_used)?;
    plan_times.sort_unstable();
    commit_times.sort_unstable();
    refusals.sort();
    refusals.dedup();
    defects.sort();
    defects.dedup();
    let report = json!({
        "bench": "gang",
        "p50_ms": millis(percentile(&plan_times, 0.50)),
        "p99_ms": millis(percentile(&plan_times, 0.99)),
        "max_ms": millis(plan_times.last().copied().unwrap_or_default()),
        "commit_p50_ms": millis(percentile(&commit_times, 0.50)),
        "partial_allocations": partial,
        "commit_failures": commit_failures,
        "trials": args.trials,
        "replicas": replicas,
        "gpus_per_replica": 8,
        "topology": "fabric",
        "placed": placed,
        "refused": refused,
        "refused_while_free_nodes_fit": refused_while_fitting,
        "free_nodes_best_fabric_min": free_nodes_best_fabric_min,
        "refusals": refusals.iter().take(5).collect::<Vec<_>>(),
        "defects": defects.iter().take(5).collect::<Vec<_>>(),
        "fill_at_start": (fill_at_start * 1e4).round() / 1e4,
        "consistency_check_ms": consistency_check_ms,
        "nodes": harness.nodes(),
        "gpus": harness.gpus(),
        "seed": args.fleet.seed,
        "cores": cores(),
    });
    let summary = format!(
        "gang: {} trials of {replicas} × 8 GPUs in one fabric on {} GPUs at {:.0} % fill: plan p50 {} ms, \
         p99 {} ms, max {} ms; {placed} placed, {refused} refused, {partial} partial, {commit_failures} commit failures",
        args.trials,
        harness.gpus(),
        fill_at_start * 100.0,
        report["p50_ms"],
        report["p99_ms"],
        report["max_ms"],
    );
    print(args.fleet.json, &report, summary);
    Ok(())
}

fn bench_preempt(args: &PreemptArgs) -> anyhow::Result<()> {
    ensure!(args.trials > 0, "--trials must be at least 1");
    let mut harness = Harness::new(&args.fleet)?;
    let fill_started = Instant::now();
    let (fill_placed, fill_refused) = match args.fill {
        Some(fill) => {
            ensure!(fill > 0.0 && fill < 1.0, "--fill must lie between 0 and 1, not {fill}");
            harness.warm_up(fill)?
        }
        None => harness.fill_until_refusals_dominate()?,
    };
    let fill_s = fill_started.elapsed().as_secs_f64();
    let target = harness.gpu_milli_used;
    let fill_at_start = harness.fill();
    let bronze_gpu_milli: u64 = harness
        .running
        .iter()
        .filter(|job| job.bronze)
        .map(|job| job.gpu_milli)
        .sum();

    let mut plan_times = Vec::new();
    let (mut planned, mut refused, mut partial) = (0u32, 0u32, 0u32);
    let (mut victims, mut non_bronze_victims, mut unknown_victims, mut tier_mismatches) = (0u64, 0u64, 0u64, 0u64);
    let (mut victims_off_plan, mut victims_without_grace, mut wasted_evictions) = (0u64, 0u64, 0u64);
    let (mut freed_gpus, mut lost_gpu_seconds) = (0u64, 0u64);
    let mut refusals: Vec<String> = Vec::new();
    let mut defects: Vec<String> = Vec::new();
    let replicas = args.gang_gpus / 8;
    let (mut bronze_nodes_best_fabric_min, mut refused_while_fitting) = (u64::MAX, 0u32);
    let mut free_nodes_best_fabric_min = u64::MAX;
    for trial in 0..args.trials {
        if trial > 0 {
            harness.churn(CHURN_BETWEEN_TRIALS, target)?;
        }
        let job = harness.gang(args.gang_gpus, Tier::Gold)?;
        let bronze_nodes = harness.best_fabric_nodes(&job, true);
        bronze_nodes_best_fabric_min = bronze_nodes_best_fabric_min.min(bronze_nodes);
        free_nodes_best_fabric_min = free_nodes_best_fabric_min.min(harness.best_fabric_nodes(&job, false));
        let started = Instant::now();
        let result = harness.matcher.plan_preemption(&job, harness.now);
        plan_times.push(started.elapsed());
        let plan = match result {
            Ok(plan) => plan,
            Err(unplaced) => {
                refused += 1;
                refusals.push(unplaced.to_string());
                if bronze_nodes >= u64::from(replicas) {
                    refused_while_fitting += 1;
                }
                continue;
            }
        };
        planned += 1;
        if let Some(defect) = harness.gang_defect(&job, &plan.placement) {
            partial += 1;
            defects.push(defect);
        }
        let mut plan_nodes: Vec<NodeId> = plan.placement.leases.iter().map(|lease| lease.node).collect();
        plan_nodes.sort_unstable();
        // The GPUs the gang takes on each node, and its fabric: a victim must free some of them.
        let mut taken: Vec<(NodeId, u16)> = plan
            .placement
            .leases
            .iter()
            .map(|lease| (lease.node, lease.gpu_mask))
            .collect();
        taken.sort_unstable();
        let gang_fabric = plan
            .placement
            .leases
            .first()
            .map(|lease| harness.node_fabric[lease.node.index()]);
        for victim in &plan.victims {
            victims += 1;
            freed_gpus += u64::from(victim.gpus);
            lost_gpu_seconds += victim.lost_gpu_seconds;
            match harness.tier_of_running(victim.job) {
                Some(Tier::Bronze) => {}
                Some(_) => non_bronze_victims += 1,
                None => {
                    unknown_victims += 1;
                    non_bronze_victims += 1;
                }
            }
            if harness
                .tier_of_running(victim.job)
                .is_some_and(|tier| tier != victim.tier)
            {
                tier_mismatches += 1;
            }
            if plan_nodes.binary_search(&victim.node).is_err() {
                victims_off_plan += 1;
            }
            if victim.grace_s == 0 {
                victims_without_grace += 1;
            }
            let gang_mask_on_node: u16 = taken
                .iter()
                .filter(|(node, _)| *node == victim.node)
                .fold(0, |mask, (_, gpus)| mask | gpus);
            let victim_mask = harness.matcher.lease(victim.lease).map_or(0, |lease| lease.gpu_mask);
            if Some(harness.node_fabric[victim.node.index()]) != gang_fabric || victim_mask & gang_mask_on_node == 0 {
                wasted_evictions += 1;
            }
        }
    }
    let consistency_check_ms = consistency(&harness.matcher, harness.gpu_milli_used)?;
    plan_times.sort_unstable();
    refusals.sort();
    refusals.dedup();
    defects.sort();
    defects.dedup();
    let per_plan = |total: u64| if planned == 0 { 0 } else { total / u64::from(planned) };
    let report = json!({
        "bench": "preempt",
        "p50_ms": millis(percentile(&plan_times, 0.50)),
        "p99_ms": millis(percentile(&plan_times, 0.99)),
        "max_ms": millis(plan_times.last().copied().unwrap_or_default()),
        "non_bronze_victims": non_bronze_victims,
        "unknown_victims": unknown_victims,
        "victim_tier_mismatches": tier_mismatches,
        "victims_off_plan": victims_off_plan,
        "wasted_evictions": wasted_evictions,
        "victims_without_grace": victims_without_grace,
        "victims": victims,
        "victims_per_plan": per_plan(victims),
        "freed_gpus": per_plan(freed_gpus),
        "lost_gpu_seconds_per_plan": per_plan(lost_gpu_seconds),
        "partial_allocations": partial,
        "trials": args.trials,
        "planned": planned,
        "refused": refused,
        "refused_while_bronze_nodes_fit": refused_while_fitting,
        "free_or_bronze_nodes_best_fabric_min": bronze_nodes_best_fabric_min,
        "free_nodes_best_fabric_min": free_nodes_best_fabric_min,
        "refusals": refusals.iter().take(5).collect::<Vec<_>>(),
        "defects": defects.iter().take(5).collect::<Vec<_>>(),
        "replicas": replicas,
        "gpus_per_replica": 8,
        "fill_at_start": (fill_at_start * 1e4).round() / 1e4,
        "bronze_share_of_used": (bronze_gpu_milli as f64 / harness.gpu_milli_used.max(1) as f64 * 1e4).round() / 1e4,
        "fill_placed": fill_placed,
        "fill_refused": fill_refused,
        "fill_s": (fill_s * 1e3).round() / 1e3,
        "consistency_check_ms": consistency_check_ms,
        "nodes": harness.nodes(),
        "gpus": harness.gpus(),
        "seed": args.fleet.seed,
        "cores": cores(),
    });
    let summary = format!(
        "preempt: {} trials of a gold {replicas} × 8-GPU gang on {} GPUs at {:.1} % fill: plan p50 {} ms, p99 {} ms; \
         {planned} planned, {refused} refused; {victims} victims, {non_bronze_victims} not bronze, \
         {wasted_evictions} outside the GPUs the gang takes; \
         {} GPUs freed per plan",
        args.trials,
        harness.gpus(),
        fill_at_start * 100.0,
        report["p50_ms"],
        report["p99_ms"],
        per_plan(freed_gpus),
    );
    print(args.fleet.json, &report, summary);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        assert_eq!(percentile(&samples, 0.5), Duration::from_micros(500));
        assert_eq!(percentile(&samples, 0.99), Duration::from_micros(990));
        assert_eq!(percentile(&samples, 0.999), Duration::from_micros(999));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn the_harness_holds_a_small_fleet_near_its_fill_and_agrees_with_the_matcher() {
        let mut harness = Harness::with_prices(16_000, 1, synth::sample_prices()).unwrap();
        harness.warm_up(0.6).unwrap();
        assert!(harness.fill() >= 0.6 && harness.fill() < 0.61, "{}", harness.fill());
        let target = fill_target(&harness.matcher, 0.6);
        harness.churn(2_000, target).unwrap();
        assert!((harness.fill() - 0.6).abs() < 0.01, "{}", harness.fill());
        consistency(&harness.matcher, harness.gpu_milli_used).unwrap();
    }

    #[test]
    fn gang_defects_are_found_from_the_leases() {
        let mut harness = Harness::with_prices(16_000, 1, synth::sample_prices()).unwrap();
        let job = harness.gang(64, Tier::Gold).unwrap();
        let mut placement = harness.matcher.plan(&job, harness.now).unwrap();
        assert_eq!(harness.gang_defect(&job, &placement), None);

        let mut fewer = placement.clone();
        fewer.leases.pop();
        assert_eq!(harness.gang_defect(&job, &fewer).unwrap(), "7 leases for 8 replicas");

        // Move one replica to a node of another fabric.
        let fabric = harness.node_fabric[placement.leases[0].node.index()];
        let elsewhere = harness.node_fabric.iter().position(|other| *other != fabric).unwrap();
        placement.leases[7].node = NodeId(elsewhere as u32);
        assert!(
            harness
                .gang_defect(&job, &placement)
                .unwrap()
                .starts_with("replicas span")
        );
    }
}
