//! Demand: a seeded synthetic mix per tier — training gangs with checkpoints, single-node
//! training, inference services, batch and evaluation jobs — arriving on a diurnal and weekly
//! curve, sized against the fleet's offered capacity; or a replay of an openb pod list with its
//! arrivals compressed by a factor.
//!
//! Shapes follow the Helios and Acme summaries in ../shared/traces (a median job of one GPU, a
//! mean of about five, heavy tails of large gangs that hold most GPU-hours), with runtimes about
//! twenty times longer than those clusters' (whose median GPU job runs 2–4 minutes): at a million
//! GPUs, the traces' many sub-minute jobs would be tens of millions of events a week.

use std::path::Path;
use std::sync::Arc;

use model::{
    GpuCatalog, GpuDemand, GpuModel, JobId, JobSpec, Micros, RegionId, TenantId, Tier, Timestamp, TopologyLevel,
    WorkloadClass,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::fleet::MarketFleet;
use crate::packing::trace::{TraceError, read_text};

/// The max price of a job without a cap.
pub const UNCAPPED: Micros = synth::UNCAPPED_PRICE;

/// What a job is, which decides its shape, its tier mix and how it loses work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum JobKind {
    TrainingGang,
    Training,
    Inference,
    Batch,
    Eval,
    /// The big-training scenario's gang.
    BigGang,
    /// A pod of a replayed trace.
    Replay,
}

impl JobKind {
    pub fn name(self) -> &'static str {
        match self {
            JobKind::TrainingGang => "training_gang",
            JobKind::Training => "training",
            JobKind::Inference => "inference",
            JobKind::Batch => "batch",
            JobKind::Eval => "eval",
            JobKind::BigGang => "big_gang",
            JobKind::Replay => "replay",
        }
    }
}

/// The synthetic mix: per kind, its share of jobs (per mille) and its tier shares (gold, silver, bronze).
pub const KIND_MIX: [(JobKind, u32, [u32; 3]); 5] = [
    (JobKind::TrainingGang, 6, [400, 400, 200]),
    (JobKind::Training, 94, [200, 400, 400]),
    (JobKind::Inference, 250, [400, 500, 100]),
    (JobKind::Batch, 450, [0, 300, 700]),
    (JobKind::Eval, 200, [100, 500, 400]),
];
/// Tenants give up on a job that has not started after this long (gold, silver, bronze).
pub const PATIENCE_S: [u32; 3] = [4 * 3600, 12 * 3600, 24 * 3600];
/// Every checkpoint costs this long (the C = 10 s).
pub const CHECKPOINT_COST_S: u32 = 10;
/// Daily swing of arrivals (± this share around the mean, peaking at 15:00 UTC) and the weekend level.
pub const DIURNAL_SWING_PERMILLE: u32 = 300;
pub const WEEKEND_PERMILLE: u32 = 800;
/// Jobs drawn to estimate the mix's mean GPU-seconds (from a stream of their own).
const CALIBRATION_JOBS: usize = 50_000;

/// One job of the simulation: the spec the market sees, and what the job really needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimJob {
    pub spec: JobSpec,
    pub kind: JobKind,
    /// Seconds of useful work it needs on all its GPUs.
    pub work_s: u32,
    pub checkpoint_cost_s: u32,
    /// Serving work: what it did stays done when it stops; it loses only its restart.
    pub stateless: bool,
    /// It leaves the queue if it has not started after this long.
    pub patience_s: u32,
}

impl SimJob {
    /// Milli-GPU of one replica.
    pub fn replica_milli(&self) -> u64 {
        match self.spec.resources.gpu {
            GpuDemand::Whole { count } => u64::from(count) * 1000,
            GpuDemand::Share { milli } => u64::from(milli),
            GpuDemand::None => 0,
            GpuDemand::ComputeUnits { cu_milli } => u64::from(cu_milli),
        }
    }

    /// Milli-GPU of the whole job.
    pub fn gpu_milli(&self) -> u64 {
        self.replica_milli() * u64::from(self.spec.replicas)
    }
}

/// A model the demand can name, with its weight (GPUs in the market) and reference price.
#[derive(Clone, Debug)]
struct ModelShare {
    model: GpuModel,
    gpus: u64,
    reference: Micros,
    memory_mib: u32,
    /// The most 8-GPU replicas a gang on this model may have: a quarter of a site's nodes of it.
    gang_replicas_max: u32,
    /// Sold only by hobbyists (evenings, reliability under 0.97): tenants name these models only
    /// for bronze work, as a quote would tell them nothing firm runs there for long.
    consumer: bool,
}

/// The synthetic demand's parameters, fixed for a run and shared by every policy's stream.
#[derive(Clone, Debug)]
pub struct Demand {
    pub seed: u64,
    pub start: Timestamp,
    pub end: Timestamp,
    /// Demand in GPU-seconds as a share (per mille) of the GPU-seconds the market offers.
    pub load_permille: u32,
    /// GPUs the market offers on average over a week (its windows counted).
    pub offered_gpus_mean: f64,
    models: Vec<ModelShare>,
    regions: u16,
    /// Mean GPU-seconds per job of the mix, and the arrival rate per second it gives.
    pub mean_gpu_s_per_job: f64,
    pub arrivals_per_s: f64,
}

impl Demand {
    pub fn new(fleet: &MarketFleet, seed: u64, start: Timestamp, end: Timestamp, load_permille: u32) -> Demand {
        let catalog = GpuCatalog::embedded();
        let mut per_model: std::collections::BTreeMap<GpuModel, (u64, Micros)> = std::collections::BTreeMap::new();
        // Few distinct window sets: looked up in a list.
        let mut windows_share: Vec<(Vec<model::AvailabilityWindow>, f64)> = Vec::new();
        let mut offered = 0.0;
        for (index, node) in fleet.nodes.iter().enumerate() {
            if !fleet.is_market(index) {
                continue;
            }
            let entry = per_model.entry(node.gpu_model).or_insert((0, fleet.on_demand[index]));
            entry.0 += u64::from(node.gpu_count);
            let share = match windows_share
                .iter()
                .find(|(windows, _)| *windows == node.policy.windows)
            {
                Some((_, share)) => *share,
                None => {
                    let share = super::fleet::open_share(&node.policy.windows, start);
                    windows_share.push((node.policy.windows.clone(), share));
                    share
                }
            };
            offered += share * f64::from(node.gpu_count);
        }
        let sites = fleet.topology.sites.len().max(1) as u64;
        let models = per_model
            .into_iter()
            .map(|(model, (gpus, reference))| ModelShare {
                model,
                gpus,
                reference,
                memory_mib: catalog.spec(model).memory_mib,
                gang_replicas_max: u32::try_from((gpus / 8 / sites / 4).clamp(2, 256)).expect("at most 256"),
                consumer: catalog.spec(model).name.starts_with("RTX"),
            })
            .collect();
        let mut demand = Demand {
            seed,
            start,
            end,
            load_permille,
            offered_gpus_mean: offered,
            models,
            regions: fleet.topology.regions.len() as u16,
            mean_gpu_s_per_job: 0.0,
            arrivals_per_s: 0.0,
        };
        let mut calibration = Workload::with_stream(Arc::new(demand.clone()), 21);
        let total: f64 = (0..CALIBRATION_JOBS)
            .map(|_| {
                let job = calibration.draw_job(start);
                job.gpu_milli() as f64 / 1000.0 * f64::from(job.work_s)
            })
            .sum();
        demand.mean_gpu_s_per_job = total / CALIBRATION_JOBS as f64;
        demand.arrivals_per_s = f64::from(load_permille) / 1000.0 * offered / demand.mean_gpu_s_per_job.max(1.0);
        demand
    }
}

/// The arrival curve at `at`, with mean 1 over a week.
pub fn diurnal_shape(at: Timestamp) -> f64 {
    let hour = (at.rem_euclid(86_400)) as f64 / 3600.0;
    let swing = f64::from(DIURNAL_SWING_PERMILLE) / 1000.0;
    let weekend = f64::from(WEEKEND_PERMILLE) / 1000.0;
    let day = if model::time::weekday(at) >= 5 { weekend } else { 1.0 };
    let mean = (5.0 + 2.0 * weekend) / 7.0;
    (1.0 + swing * (std::f64::consts::TAU * (hour - 15.0) / 24.0).cos()) * day / mean
}

fn shape_max() -> f64 {
    let swing = f64::from(DIURNAL_SWING_PERMILLE) / 1000.0;
    let weekend = f64::from(WEEKEND_PERMILLE) / 1000.0;
    (1.0 + swing) / ((5.0 + 2.0 * weekend) / 7.0)
}

/// An endless seeded stream of jobs (ids from 1, arrivals in time order) until the demand's end.
#[derive(Clone, Debug)]
pub struct Workload {
    demand: Arc<Demand>,
    rng: ChaCha8Rng,
    next_id: u64,
    at: f64,
}

impl Workload {
    pub fn new(demand: Arc<Demand>) -> Workload {
        Workload::with_stream(demand, 20)
    }

    fn with_stream(demand: Arc<Demand>, stream: u64) -> Workload {
        let mut rng = ChaCha8Rng::seed_from_u64(demand.seed);
        rng.set_stream(stream);
        let at = demand.start as f64;
        Workload {
            demand,
            rng,
            next_id: 1,
            at,
        }
    }

    /// The next arrival, or `None` past the end.
    pub fn next_job(&mut self) -> Option<SimJob> {
        let rate_max = self.demand.arrivals_per_s * shape_max();
        if rate_max <= 0.0 {
            return None;
        }
        loop {
            let unit: f64 = self.rng.random();
            self.at += -(1.0 - unit).ln() / rate_max;
            if self.at >= self.demand.end as f64 {
                return None;
            }
            let at = self.at as Timestamp;
            let keep: f64 = self.rng.random();
            if keep * shape_max() < diurnal_shape(at) {
                return Some(self.draw_job(at));
            }
        }
    }

    fn chance(&mut self, permille: u32) -> bool {
        self.rng.random_range(0..1000u32) < permille
    }

    fn pick<T: Copy>(&mut self, table: &[(T, u32)]) -> T {
        synth::pick_weighted(&mut self.rng, table)
    }

    /// A model by its GPUs in the market, among those with at least `memory_mib` per GPU
    /// (consumer cards only for bronze work).
    fn pick_model(&mut self, memory_mib: u32, tier: Tier) -> Option<ModelShare> {
        let eligible: Vec<(usize, u32)> = self
            .demand
            .models
            .iter()
            .enumerate()
            .filter(|(_, share)| share.memory_mib >= memory_mib && (tier == Tier::Bronze || !share.consumer))
            .map(|(index, share)| {
                (
                    index,
                    u32::try_from(share.gpus.min(u64::from(u32::MAX / 64))).unwrap_or(1),
                )
            })
            .collect();
        if eligible.is_empty() {
            return None;
        }
        let index = self.pick(&eligible);
        Some(self.demand.models[index].clone())
    }

    fn log_uniform(&mut self, low: u32, high: u32) -> u32 {
        let unit: f64 = self.rng.random();
        let (low_ln, high_ln) = (f64::from(low).ln(), f64::from(high).ln());
        ((low_ln + unit * (high_ln - low_ln)).exp().round() as u32).clamp(low, high)
    }

    fn draw_job(&mut self, at: Timestamp) -> SimJob {
        let id = JobId(self.next_id);
        self.next_id += 1;
        let kind_table: Vec<(usize, u32)> = KIND_MIX
            .iter()
            .enumerate()
            .map(|(index, entry)| (index, entry.1))
            .collect();
        let (kind, _, tier_permille) = KIND_MIX[self.pick(&kind_table)];
        let tier = self.pick(&[
            (Tier::Gold, tier_permille[0]),
            (Tier::Silver, tier_permille[1]),
            (Tier::Bronze, tier_permille[2]),
        ]);
        const GIB: u32 = 1024;
        let (memory_floor_gib, cores_per_gpu, memory_gib_per_gpu): (u32, u64, u64) = match kind {
            JobKind::TrainingGang => (80, 8, 64),
            JobKind::Training => (40, 8, 64),
            JobKind::Inference | JobKind::Eval => (24, 4, 32),
            _ => (16, 4, 32),
        };
        let mut replicas = 1u32;
        let mut topology = TopologyLevel::Any;
        let mut models: Vec<GpuModel> = Vec::new();
        let gpu = match kind {
            JobKind::TrainingGang => {
                let model = self
                    .pick_model(memory_floor_gib * GIB, tier)
                    .or_else(|| self.pick_model(0, Tier::Bronze))
                    .expect("the fleet has GPUs");
                replicas = self.log_uniform(2, model.gang_replicas_max.max(2));
                topology = TopologyLevel::Fabric;
                models.push(model.model);
                GpuDemand::Whole { count: 8 }
            }
            JobKind::Training => GpuDemand::Whole {
                count: self.pick(&[(1u8, 30), (2, 25), (4, 25), (8, 20)]),
            },
            JobKind::Inference => GpuDemand::Whole {
                count: self.pick(&[(1u8, 60), (2, 25), (4, 10), (8, 5)]),
            },
            JobKind::Eval => GpuDemand::Whole {
                count: self.pick(&[(1u8, 50), (2, 20), (4, 15), (8, 15)]),
            },
            _ => match self.rng.random_range(0..10u32) {
                0..=2 => GpuDemand::Share {
                    milli: 250 + 50 * self.rng.random_range(0..=10u16),
                },
                3..=7 => GpuDemand::Whole { count: 1 },
                _ => GpuDemand::Whole {
                    count: self.rng.random_range(2..=4u8),
                },
            },
        };
        if kind != JobKind::TrainingGang && self.chance(200) {
            let count = self.rng.random_range(1..=2usize);
            for _ in 0..count {
                if let Some(share) = self.pick_model(memory_floor_gib * GIB, tier)
                    && !models.contains(&share.model)
                {
                    models.push(share.model);
                }
            }
            models.sort_unstable();
        }
        let reference = match models.first() {
            Some(model) => self
                .demand
                .models
                .iter()
                .find(|share| share.model == *model)
                .map_or(Micros(2_000_000), |share| share.reference),
            None => self
                .pick_model(memory_floor_gib * GIB, tier)
                .map_or(Micros(2_000_000), |share| share.reference),
        };
        let cap = |workload: &mut Workload, range: std::ops::RangeInclusive<u64>| {
            reference
                .scale(workload.rng.random_range(range), 1000)
                .expect("no overflow")
        };
        let max_price = match tier {
            Tier::Gold if self.chance(600) => UNCAPPED,
            Tier::Gold => cap(self, 1200..=2500),
            Tier::Silver if self.chance(300) => UNCAPPED,
            Tier::Silver => cap(self, 900..=2000),
            Tier::Bronze => cap(self, 400..=1000),
        };
        let mut spec = JobSpec::new(id, tier, gpu, max_price);
        spec.submitted_at = at;
        spec.tenant = TenantId(self.rng.random_range(0..1000u32));
        spec.class = match kind {
            JobKind::TrainingGang | JobKind::Training => WorkloadClass::Training,
            JobKind::Inference => WorkloadClass::Inference,
            JobKind::Eval => WorkloadClass::Eval,
            _ => WorkloadClass::Batch,
        };
        spec.replicas = replicas;
        spec.topology = topology;
        spec.resources.gpu_models = models;
        spec.resources.gpu_memory_mib_min = memory_floor_gib * GIB;
        let replica_milli = match gpu {
            GpuDemand::Whole { count } => u64::from(count) * 1000,
            GpuDemand::Share { milli } => u64::from(milli),
            _ => 1000,
        };
        spec.resources.cpu_milli = u32::try_from((cores_per_gpu * replica_milli).max(1000)).expect("small");
        spec.resources.memory_mib = (memory_gib_per_gpu * 1024 * replica_milli / 1000).max(1024);
        let region_permille = if kind == JobKind::Inference { 500 } else { 150 };
        if self.chance(region_permille) && self.demand.regions > 0 {
            let first = RegionId(self.rng.random_range(0..self.demand.regions));
            spec.regions.push(first);
            if kind != JobKind::Inference && self.chance(500) {
                let second = RegionId(self.rng.random_range(0..self.demand.regions));
                if second != first {
                    spec.regions.push(second);
                }
            }
            spec.regions.sort_unstable();
        }
        spec.reliability_min_ppm = if tier == Tier::Gold && self.chance(300) {
            980_000
        } else if self.chance(50) {
            950_000
        } else {
            0
        };
        let (work_s, checkpoint_interval_s, stateless) = match kind {
            JobKind::TrainingGang => (self.log_uniform(4 * 3600, 48 * 3600), 1800, false),
            JobKind::Training => (self.log_uniform(3600, 24 * 3600), 1800, false),
            JobKind::Inference => (self.log_uniform(2 * 3600, 48 * 3600), 0, true),
            JobKind::Batch => (self.log_uniform(600, 4 * 3600), 600, false),
            _ => (self.log_uniform(600, 2 * 3600), 0, false),
        };
        spec.checkpoint_interval_s = checkpoint_interval_s;
        spec.max_runtime_s = work_s;
        SimJob {
            spec,
            kind,
            work_s,
            checkpoint_cost_s: if checkpoint_interval_s > 0 {
                CHECKPOINT_COST_S
            } else {
                0
            },
            stateless,
            patience_s: PATIENCE_S[tier as usize],
        }
    }
}

/// One pod of a replayed openb pod list.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayPod {
    pub created_s: u64,
    pub work_s: u32,
    pub tier: Tier,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    pub models: Vec<GpuModel>,
}

/// Reads an openb pod list with its times (the 11-column form): each GPU pod becomes a job
/// arriving at its `creation_time` and running until its `deletion_time`; its QoS gives the
/// tier (Guaranteed gold, LS and Burstable silver, BE bronze). CPU-only pods are left out.
pub fn read_replay(path: &Path) -> Result<Vec<ReplayPod>, TraceError> {
    let text = read_text(path)?;
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_slice());
    let header = reader
        .headers()
        .map_err(|error| TraceError::Csv {
            path: path.to_path_buf(),
            line: 1,
            reason: error.to_string(),
        })?
        .clone();
    let column = |name: &'static str| {
        header
            .iter()
            .position(|field| field == name)
            .ok_or_else(|| TraceError::MissingColumn {
                path: path.to_path_buf(),
                column: name,
                header: header.iter().collect::<Vec<_>>().join(","),
            })
    };
    let columns = [
        column("cpu_milli")?,
        column("memory_mib")?,
        column("num_gpu")?,
        column("gpu_milli")?,
        column("gpu_spec")?,
        column("qos")?,
        column("creation_time")?,
        column("deletion_time")?,
    ];
    let catalog = GpuCatalog::embedded();
    let mut pods = Vec::new();
    for (index, record) in reader.records().enumerate() {
        let line = index as u64 + 2;
        let record = record.map_err(|error| TraceError::Csv {
            path: path.to_path_buf(),
            line,
            reason: error.to_string(),
        })?;
        let field = |position: usize| record.get(columns[position]).unwrap_or("");
        let number = |position: usize, name: &'static str| -> Result<u64, TraceError> {
            let value = field(position);
            if value.is_empty() {
                return Ok(0);
            }
            value.parse::<u64>().map_err(|_| TraceError::BadValue {
                path: path.to_path_buf(),
                line,
                column: name,
                value: value.to_string(),
                reason: "not a non-negative integer".into(),
            })
        };
        let gpu_count = number(2, "num_gpu")?;
        if gpu_count == 0 {
            continue;
        }
        let gpu_milli = number(3, "gpu_milli")?;
        let created = number(6, "creation_time")?;
        let deleted = number(7, "deletion_time")?;
        let gpu = if gpu_milli > 0 && gpu_milli < 1000 {
            GpuDemand::Share {
                milli: gpu_milli as u16,
            }
        } else {
            GpuDemand::Whole {
                count: gpu_count.min(model::GPUS_PER_NODE_MAX as u64) as u8,
            }
        };
        let tier = match field(5) {
            "Guaranteed" => Tier::Gold,
            "BE" => Tier::Bronze,
            _ => Tier::Silver,
        };
        let models = field(4)
            .split('|')
            .filter(|name| !name.is_empty())
            .filter_map(|name| catalog.find(name))
            .collect();
        pods.push(ReplayPod {
            created_s: created,
            work_s: u32::try_from(deleted.saturating_sub(created).max(60)).unwrap_or(u32::MAX),
            tier,
            cpu_milli: number(0, "cpu_milli")? as u32,
            memory_mib: number(1, "memory_mib")?,
            gpu,
            models,
        });
    }
    if pods.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
        });
    }
    pods.sort_by_key(|pod| pod.created_s);
    Ok(pods)
}

/// Where a policy's jobs come from: its own copy of the seeded stream, or the replay.
#[derive(Clone, Debug)]
pub enum JobSource {
    Synthetic(Box<Workload>),
    Replay {
        pods: Arc<Vec<ReplayPod>>,
        next: usize,
        start: Timestamp,
        end: Timestamp,
        /// Arrivals are `created_s / compress` after the start.
        compress: f64,
    },
}

impl JobSource {
    pub fn next_job(&mut self) -> Option<SimJob> {
        match self {
            JobSource::Synthetic(workload) => workload.next_job(),
            JobSource::Replay {
                pods,
                next,
                start,
                end,
                compress,
            } => {
                let pod = pods.get(*next)?;
                let at = *start + (pod.created_s as f64 / *compress) as Timestamp;
                if at >= *end {
                    return None;
                }
                *next += 1;
                let mut spec = JobSpec::new(JobId(*next as u64), pod.tier, pod.gpu, UNCAPPED);
                spec.submitted_at = at;
                spec.class = if pod.tier == Tier::Bronze {
                    WorkloadClass::Batch
                } else {
                    WorkloadClass::Inference
                };
                spec.resources.cpu_milli = pod.cpu_milli;
                spec.resources.memory_mib = pod.memory_mib;
                spec.resources.gpu_models = pod.models.clone();
                spec.max_runtime_s = pod.work_s;
                let checkpointed = pod.tier == Tier::Bronze;
                spec.checkpoint_interval_s = if checkpointed { 600 } else { 0 };
                Some(SimJob {
                    spec,
                    kind: JobKind::Replay,
                    work_s: pod.work_s,
                    checkpoint_cost_s: if checkpointed { CHECKPOINT_COST_S } else { 0 },
                    stateless: !checkpointed,
                    patience_s: PATIENCE_S[pod.tier as usize],
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diurnal_curve_has_mean_one_over_a_week() {
        let monday = 1_736_121_600;
        let samples = 7 * 24 * 60;
        let mean: f64 = (0..samples)
            .map(|minute| diurnal_shape(monday + minute * 60))
            .sum::<f64>()
            / samples as f64;
        assert!((mean - 1.0).abs() < 1e-6, "{mean}");
        assert!((0..samples).all(|minute| diurnal_shape(monday + minute * 60) <= shape_max() + 1e-9));
    }
}
