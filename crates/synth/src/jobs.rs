//! Seeded streams of job specs for benchmarks: mostly single GPUs, some shares and small
//! multi-GPU jobs, with region, model and price constraints; and gang jobs on demand.

use model::{
    Dataset, GpuDemand, GpuModel, JobId, JobSpec, Micros, RegionId, TenantId, Tier, Timestamp, TopologyLevel,
    WorkloadClass,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::datasets::dataset_catalogue;
use crate::fleet::{Fleet, FleetModel};

/// The max price of a job without a cap: far above any ask, far from overflow.
pub const UNCAPPED_PRICE: Micros = Micros(i64::MAX / 4);

/// Shapes, in per mille of jobs: one whole GPU, a share of one GPU, 2–8 GPUs on one node.
pub const ONE_GPU_PERMILLE: u32 = 700;
pub const SHARE_PERMILLE: u32 = 200;
/// Share sizes in milli-GPU.
pub const SHARE_MILLI: std::ops::RangeInclusive<u16> = 100..=900;
/// Jobs limited to 1–2 regions, and to 1–2 GPU models.
pub const REGION_CONSTRAINED_PERMILLE: u32 = 300;
pub const MODEL_CONSTRAINED_PERMILLE: u32 = 200;
/// Jobs with a max price: 0.8–2.0 × the market price of a typical model (or of the job's model).
pub const PRICE_CAPPED_PERMILLE: u32 = 900;
pub const PRICE_CAP_FACTOR_PERMILLE: std::ops::RangeInclusive<u64> = 800..=2000;
/// Tier shares in per mille: gold, silver, bronze.
pub const TIER_PERMILLE: [(Tier, u32); 3] = [(Tier::Gold, 200), (Tier::Silver, 500), (Tier::Bronze, 300)];
/// Workload class shares in per mille.
pub const CLASS_PERMILLE: [(WorkloadClass, u32); 4] = [
    (WorkloadClass::Inference, 400),
    (WorkloadClass::Training, 250),
    (WorkloadClass::Batch, 250),
    (WorkloadClass::Eval, 100),
];
/// Maximum runtime, drawn log-uniformly: 10 minutes to 24 hours.
pub const MAX_RUNTIME_S: std::ops::RangeInclusive<u32> = 600..=86_400;
/// Per whole GPU; a share takes its fraction.
pub const CPU_CORES_PER_GPU: std::ops::RangeInclusive<u32> = 4..=16;
pub const MEMORY_GIB_PER_GPU: std::ops::RangeInclusive<u64> = 32..=128;
/// Jobs that read datasets, and jobs with a reliability floor of 0.9.
pub const WITH_DATASETS_PERMILLE: u32 = 50;
pub const RELIABILITY_FLOOR_PERMILLE: u32 = 50;
pub const RELIABILITY_FLOOR_PPM: u32 = 900_000;
pub const TENANTS: u32 = 1000;

/// An endless, seeded sequence of jobs for one fleet. Ids start at 1 and increase by one per
/// job, gangs included.
#[derive(Clone, Debug)]
pub struct JobStream {
    rng: ChaCha8Rng,
    next_id: u64,
    regions: Vec<RegionId>,
    models: Vec<FleetModel>,
    model_weight_total: u32,
    datasets: Vec<Dataset>,
}

impl JobStream {
    pub fn new(fleet: &Fleet, seed: u64) -> JobStream {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // A stream of its own, so that a fleet and a stream built from the same seed do not share draws.
        rng.set_stream(1);
        JobStream {
            rng,
            next_id: 1,
            regions: (0..fleet.topology.regions.len())
                .map(|index| RegionId(index as u16))
                .collect(),
            models: fleet.models.clone(),
            model_weight_total: fleet.models.iter().map(|fleet_model| fleet_model.weight).sum(),
            datasets: dataset_catalogue(),
        }
    }

    /// The id the next job will get.
    pub fn peek_id(&self) -> JobId {
        JobId(self.next_id)
    }

    fn take_id(&mut self) -> JobId {
        let id = JobId(self.next_id);
        self.next_id += 1;
        id
    }

    fn chance(&mut self, permille: u32) -> bool {
        self.rng.random_range(0..1000u32) < permille
    }

    fn pick_weighted<T: Copy>(&mut self, table: &[(T, u32)]) -> T {
        crate::picker::pick_weighted(&mut self.rng, table)
    }

    /// A model drawn by its share of the fleet.
    fn pick_model(&mut self) -> FleetModel {
        let mut draw = self.rng.random_range(0..self.model_weight_total);
        for fleet_model in &self.models {
            if draw < fleet_model.weight {
                return fleet_model.clone();
            }
            draw -= fleet_model.weight;
        }
        unreachable!("the draw is below the total weight")
    }

    /// The next job of the stream.
    pub fn next_job(&mut self, submitted_at: Timestamp) -> JobSpec {
        let id = self.take_id();
        let shape = self.rng.random_range(0..1000u32);
        let gpu = if shape < ONE_GPU_PERMILLE {
            GpuDemand::Whole { count: 1 }
        } else if shape < ONE_GPU_PERMILLE + SHARE_PERMILLE {
            GpuDemand::Share {
                milli: self.rng.random_range(SHARE_MILLI),
            }
        } else {
            GpuDemand::Whole {
                count: self.rng.random_range(2..=8u8),
            }
        };
        let tier = self.pick_weighted(&TIER_PERMILLE);

        let gpu_models: Vec<GpuModel> = if self.chance(MODEL_CONSTRAINED_PERMILLE) {
            let count = self.rng.random_range(1..=2usize);
            let mut chosen: Vec<GpuModel> = Vec::with_capacity(count);
            while chosen.len() < count {
                let model = self.pick_model().model;
                if !chosen.contains(&model) {
                    chosen.push(model);
                }
            }
            chosen
        } else {
            Vec::new()
        };
        let max_price = if self.chance(PRICE_CAPPED_PERMILLE) {
            // The cap follows the job's first model, or a typical model of the fleet.
            let reference = match gpu_models.first() {
                Some(&model) => {
                    self.models
                        .iter()
                        .find(|fleet_model| fleet_model.model == model)
                        .expect("job models come from the fleet")
                        .market_price
                }
                None => self.pick_model().market_price,
            };
            reference
                .scale(self.rng.random_range(PRICE_CAP_FACTOR_PERMILLE), 1000)
                .expect("market prices are far below overflow")
        } else {
            UNCAPPED_PRICE
        };

        let mut job = JobSpec::new(id, tier, gpu, max_price);
        job.submitted_at = submitted_at;
        job.tenant = TenantId(self.rng.random_range(0..TENANTS));
        job.class = self.pick_weighted(&CLASS_PERMILLE);
        job.resources.gpu_models = gpu_models;
        if self.chance(REGION_CONSTRAINED_PERMILLE) {
            let first = self.regions[self.rng.random_range(0..self.regions.len())];
            job.regions.push(first);
            if self.rng.random_bool(0.5) {
                let second = self.regions[self.rng.random_range(0..self.regions.len())];
                if second != first {
                    job.regions.push(second);
                }
            }
            job.regions.sort_unstable();
        }

        // CPU and memory scale with the GPUs held, a share taking its fraction.
        let gpu_milli: u64 = match gpu {
            GpuDemand::Whole { count } => u64::from(count) * 1000,
            GpuDemand::Share { milli } => u64::from(milli),
            GpuDemand::None | GpuDemand::ComputeUnits { .. } => 1000,
        };
        let cores_per_gpu = u64::from(self.rng.random_range(CPU_CORES_PER_GPU));
        let memory_gib_per_gpu = self.rng.random_range(MEMORY_GIB_PER_GPU);
        job.resources.cpu_milli = u32::try_from((cores_per_gpu * gpu_milli).max(1000)).expect("at most 128 cores");
        job.resources.memory_mib = (memory_gib_per_gpu * 1024 * gpu_milli / 1000).max(1024);

        job.max_runtime_s = self.log_uniform_runtime_s();
        job.checkpoint_interval_s = match job.class {
            WorkloadClass::Training | WorkloadClass::Batch => self.rng.random_range(300..=3600u32),
            WorkloadClass::Inference | WorkloadClass::Eval => 0,
        };
        if self.chance(WITH_DATASETS_PERMILLE) {
            let count = self.rng.random_range(1..=2usize);
            for _ in 0..count {
                let dataset = self.datasets[self.rng.random_range(0..self.datasets.len())];
                if !job.datasets.contains(&dataset) {
                    job.datasets.push(dataset);
                }
            }
        }
        if self.chance(RELIABILITY_FLOOR_PERMILLE) {
            job.reliability_min_ppm = RELIABILITY_FLOOR_PPM;
        }
        job
    }

    fn log_uniform_runtime_s(&mut self) -> u32 {
        let low = f64::from(*MAX_RUNTIME_S.start()).ln();
        let high = f64::from(*MAX_RUNTIME_S.end()).ln();
        let unit: f64 = self.rng.random();
        ((low + unit * (high - low)).exp().round() as u32).clamp(*MAX_RUNTIME_S.start(), *MAX_RUNTIME_S.end())
    }

    /// A training gang: `replicas` × `gpus_per_replica` whole GPUs inside one `topology` level,
    /// uncapped price, 4 hours, checkpoints every 30 minutes, 8 cores and 64 GiB per GPU. Its
    /// `submitted_at` is 0; set it if it matters.
    pub fn gang_job(&mut self, replicas: u32, gpus_per_replica: u8, topology: TopologyLevel, tier: Tier) -> JobSpec {
        let id = self.take_id();
        let mut job = JobSpec::new(
            id,
            tier,
            GpuDemand::Whole {
                count: gpus_per_replica,
            },
            UNCAPPED_PRICE,
        );
        job.class = WorkloadClass::Training;
        job.replicas = replicas;
        job.topology = topology;
        job.resources.cpu_milli = u32::from(gpus_per_replica) * 8_000;
        job.resources.memory_mib = u64::from(gpus_per_replica) * 64 * 1024;
        job.max_runtime_s = 4 * 3600;
        job.checkpoint_interval_s = 1800;
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{FleetSpec, fleet};

    fn small_fleet() -> Fleet {
        fleet(&FleetSpec {
            gpus: 1_600,
            seed: 1,
            prices: crate::sample_prices(),
        })
        .unwrap()
    }

    #[test]
    fn same_seed_same_stream() {
        let fleet = small_fleet();
        let mut a = JobStream::new(&fleet, 5);
        let mut b = JobStream::new(&fleet, 5);
        let mut c = JobStream::new(&fleet, 6);
        let first: Vec<JobSpec> = (0..500).map(|_| a.next_job(10)).collect();
        let second: Vec<JobSpec> = (0..500).map(|_| b.next_job(10)).collect();
        let third: Vec<JobSpec> = (0..500).map(|_| c.next_job(10)).collect();
        assert_eq!(first, second);
        assert_ne!(first, third);
        assert_eq!(
            a.gang_job(4, 8, TopologyLevel::Fabric, Tier::Gold),
            b.gang_job(4, 8, TopologyLevel::Fabric, Tier::Gold)
        );
    }

    #[test]
    fn mix_matches_the_bench_contract() {
        let fleet = small_fleet();
        let mut stream = JobStream::new(&fleet, 11);
        const JOBS: usize = 100_000;
        let (mut one, mut share, mut multi) = (0usize, 0usize, 0usize);
        let (mut regioned, mut modelled, mut capped, mut with_data) = (0usize, 0usize, 0usize, 0usize);
        let mut tiers = [0usize; 3];
        let mut previous_id = JobId(0);
        for _ in 0..JOBS {
            let job = stream.next_job(0);
            assert!(job.id > previous_id, "ids increase");
            previous_id = job.id;
            assert_eq!(job.replicas, 1);
            let gpu_milli = match job.resources.gpu {
                GpuDemand::Whole { count: 1 } => {
                    one += 1;
                    1000
                }
                GpuDemand::Share { milli } => {
                    assert!(SHARE_MILLI.contains(&milli));
                    share += 1;
                    u64::from(milli)
                }
                GpuDemand::Whole { count } => {
                    assert!((2..=8).contains(&count));
                    multi += 1;
                    u64::from(count) * 1000
                }
                other => panic!("unexpected demand {other:?}"),
            };
            let cores_milli = u64::from(job.resources.cpu_milli);
            assert!(
                cores_milli >= 1000 && cores_milli <= (16 * gpu_milli).max(1000),
                "{cores_milli}"
            );
            assert!(job.resources.memory_mib <= (128 * 1024 * gpu_milli / 1000).max(1024));
            assert!(MAX_RUNTIME_S.contains(&job.max_runtime_s));
            assert!(job.regions.len() <= 2 && job.resources.gpu_models.len() <= 2);
            regioned += usize::from(!job.regions.is_empty());
            modelled += usize::from(!job.resources.gpu_models.is_empty());
            with_data += usize::from(!job.datasets.is_empty());
            tiers[job.tier as usize] += 1;
            if job.max_price != UNCAPPED_PRICE {
                capped += 1;
                let reference = match job.resources.gpu_models.first() {
                    Some(&model) => fleet.market_price(model).unwrap(),
                    None => fleet.models.iter().map(|m| m.market_price).max().unwrap(),
                };
                assert!(job.max_price <= reference.scale(2, 1).unwrap());
            }
        }
        let share_of = |count: usize| count as f64 / JOBS as f64;
        let near = |count: usize, expected: f64| (share_of(count) - expected).abs() < 0.01;
        assert!(
            near(one, 0.70) && near(share, 0.20) && near(multi, 0.10),
            "{one} {share} {multi}"
        );
        assert!(
            near(regioned, 0.30) && near(modelled, 0.20) && near(capped, 0.90),
            "{regioned} {modelled} {capped}"
        );
        assert!(
            near(tiers[0], 0.20) && near(tiers[1], 0.50) && near(tiers[2], 0.30),
            "{tiers:?}"
        );
        assert!(near(with_data, 0.05), "{with_data}");
    }

    #[test]
    fn gangs_take_ids_from_the_stream() {
        let fleet = small_fleet();
        let mut stream = JobStream::new(&fleet, 1);
        let first = stream.next_job(0);
        let gang = stream.gang_job(2048, 8, TopologyLevel::Fabric, Tier::Silver);
        assert_eq!(gang.id, JobId(first.id.0 + 1));
        assert_eq!(gang.replicas, 2048);
        assert_eq!(gang.resources.gpu, GpuDemand::Whole { count: 8 });
        assert_eq!(gang.topology, TopologyLevel::Fabric);
        assert_eq!(gang.tier, Tier::Silver);
        assert!(!gang.interruptible());
        assert_eq!(stream.peek_id(), JobId(first.id.0 + 2));
    }
}
