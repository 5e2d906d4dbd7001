//! Feasibility and scoring of one node for one replica: every hard constraint, cheapest first,
//! then the score the ranking sorts by. The same check feeds placement and explanations, so an
//! explanation always says why the placement path said no.

use model::{GPU_MILLI_WHOLE, GpuCatalog, GpuDemand, JobSpec, Micros, Tier, Timestamp};

use crate::state::{Matcher, NodeLoad, NodeStatic, effective_ask};

/// Why a node cannot take a replica, in the order the checks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    Offline,
    Region,
    GpuModel,
    GpuMemory,
    TierNotAllowed,
    ClassNotAllowed,
    Reliability,
    Price,
    Window,
    Cpu,
    Memory,
    GpuCapacity,
    Reserved,
    OverLimit,
    Runtime,
    Avoided,
    OutsideReservation,
    NotListed,
}

impl Reason {
    pub const ALL: [Reason; 18] = [
        Reason::Offline,
        Reason::Region,
        Reason::GpuModel,
        Reason::GpuMemory,
        Reason::TierNotAllowed,
        Reason::ClassNotAllowed,
        Reason::Reliability,
        Reason::Price,
        Reason::Window,
        Reason::Cpu,
        Reason::Memory,
        Reason::GpuCapacity,
        Reason::Reserved,
        Reason::OverLimit,
        Reason::Runtime,
        Reason::Avoided,
        Reason::OutsideReservation,
        Reason::NotListed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Offline => "offline",
            Reason::Region => "region",
            Reason::GpuModel => "gpu_model",
            Reason::GpuMemory => "gpu_memory",
            Reason::TierNotAllowed => "tier_not_allowed",
            Reason::ClassNotAllowed => "class_not_allowed",
            Reason::Reliability => "reliability",
            Reason::Price => "price",
            Reason::Window => "window",
            Reason::Cpu => "cpu",
            Reason::Memory => "memory",
            Reason::GpuCapacity => "gpu_capacity",
            Reason::Reserved => "reserved",
            Reason::OverLimit => "over_limit",
            Reason::Runtime => "runtime",
            Reason::Avoided => "avoided",
            Reason::OutsideReservation => "outside_reservation",
            Reason::NotListed => "not_listed",
        }
    }
}

/// A job's demands, resolved once per decision.
#[derive(Clone, Debug)]
pub(crate) struct JobContext<'a> {
    pub job: &'a JobSpec,
    pub tier: Tier,
    /// Bit per region id (ids ≥ 64 share bit 63 and are checked exactly); all ones = any.
    pub region_mask: u64,
    /// Bit per model index, for the allowed-model list; all ones = any.
    pub model_mask: u64,
    /// The time the node must stay available until, for jobs that cannot be interrupted.
    pub window_until: Option<Timestamp>,
    pub now: Timestamp,
    /// Datasets or a latency target make the score depend on more than the static order.
    pub rescored: bool,
}

fn bit(index: usize) -> u64 {
    1u64 << index.min(63)
}

impl<'a> JobContext<'a> {
    pub fn new(job: &'a JobSpec, now: Timestamp) -> JobContext<'a> {
        let region_mask = if job.regions.is_empty() {
            u64::MAX
        } else {
            job.regions.iter().fold(0, |mask, r| mask | bit(r.index()))
        };
        let model_mask = if job.resources.gpu_models.is_empty() {
            u64::MAX
        } else {
            job.resources.gpu_models.iter().fold(0, |mask, m| mask | bit(m.index()))
        };
        let window_until = (!job.interruptible()).then(|| now.saturating_add(i64::from(job.max_runtime_s)));
        let rescored = !job.datasets.is_empty() || job.client.is_some();
        JobContext {
            job,
            tier: job.tier,
            region_mask,
            model_mask,
            window_until,
            now,
            rescored,
        }
    }

    pub fn region_allowed(&self, region: u16) -> bool {
        self.region_mask & bit(region as usize) != 0
            && (self.job.regions.is_empty() || self.job.regions.iter().any(|r| r.0 == region))
    }

    pub fn model_allowed(&self, model: u16) -> bool {
        self.model_mask & bit(model as usize) != 0
            && (self.job.resources.gpu_models.is_empty() || self.job.resources.gpu_models.iter().any(|m| m.0 == model))
    }

    /// Whole GPUs a replica takes on a node of this model (0 for shares and CPU-only), or
    /// `None` if a compute-unit target cannot be met by this model on this node.
    pub fn whole_gpus(&self, statics: &NodeStatic) -> Option<u8> {
        match self.job.resources.gpu {
            GpuDemand::None | GpuDemand::Share { .. } => Some(0),
            GpuDemand::Whole { count } => Some(count),
            GpuDemand::ComputeUnits { cu_milli } => {
                let count = cu_milli.div_ceil(statics.cu_milli.max(1));
                u8::try_from(count).ok().filter(|count| *count <= statics.gpu_count)
            }
        }
    }

    pub fn share_milli(&self) -> u16 {
        match self.job.resources.gpu {
            GpuDemand::Share { milli } => milli,
            _ => 0,
        }
    }
}

/// A node that can take a replica, with the GPUs it would use and its score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fit {
    pub node: u32,
    pub gpu_mask: u16,
    pub gpu_milli: u16,
    pub ask: Micros,
    /// Effective ask per compute-unit-hour (the auction's bid).
    pub effective: u64,
    /// What the ranking minimises: the effective ask with the fragmentation, data and latency terms.
    pub score: u64,
    pub preempt_at: Option<Timestamp>,
}

impl Matcher {
    /// The node's ask for a tier at `now`.
    pub(crate) fn ask_at(&self, node: usize, tier: Tier, now: Timestamp) -> Option<Micros> {
        let statics = &self.statics[node];
        if statics.tiers & (1 << tier as u8) == 0 || statics.asks[tier as usize] == i64::MAX {
            return None;
        }
        let base = Micros(statics.asks[tier as usize]);
        if !statics.has_price_rules {
            Some(base)
        } else if self.clock_minute == Some(now.div_euclid(60)) {
            match self.loads[node].price_multiplier_permille {
                0 => Some(base),
                multiplier => base.scale(u64::from(multiplier), 1000),
            }
        } else {
            self.nodes[node].policy.ask_at(tier, now)
        }
    }

    /// The constraints that do not depend on current load.
    pub(crate) fn static_check(&self, node: usize, context: &JobContext) -> Result<Micros, Reason> {
        let statics = &self.statics[node];
        let job = context.job;
        if self.loads[node].offline {
            return Err(Reason::Offline);
        }
        if !job.avoid_nodes.is_empty() && job.avoid_nodes.binary_search(&model::NodeId(node as u32)).is_ok() {
            return Err(Reason::Avoided);
        }
        if !job.only_nodes.is_empty() && job.only_nodes.binary_search(&model::NodeId(node as u32)).is_err() {
            return Err(Reason::NotListed);
        }
        if let Some(reservation) = job.reservation
            && self.reservations.held(reservation, node) == 0
        {
            return Err(Reason::OutsideReservation);
        }
        if self.loads[node].cordoned {
            return Err(Reason::OverLimit);
        }
        if !context.region_allowed(statics.region) {
            return Err(Reason::Region);
        }
        if !context.model_allowed(statics.model) || context.whole_gpus(statics).is_none() {
            return Err(Reason::GpuModel);
        }
        let needs_gpu = !matches!(job.resources.gpu, GpuDemand::None);
        if (needs_gpu && statics.gpu_count == 0) || statics.gpu_memory_mib < job.resources.gpu_memory_mib_min {
            return Err(if statics.gpu_count == 0 {
                Reason::GpuModel
            } else {
                Reason::GpuMemory
            });
        }
        if statics.tiers & (1 << context.tier as u8) == 0 || statics.asks[context.tier as usize] == i64::MAX {
            return Err(Reason::TierNotAllowed);
        }
        if statics.classes & (1 << job.class as u8) == 0 {
            return Err(Reason::ClassNotAllowed);
        }
        if let Some(runtime) = job.runtime
            && statics.runtimes & (1 << runtime as u8) == 0
        {
            return Err(Reason::Runtime);
        }
        if statics.reliability_ppm < job.reliability_min_ppm {
            return Err(Reason::Reliability);
        }
        let ask = self
            .ask_at(node, context.tier, context.now)
            .ok_or(Reason::TierNotAllowed)?;
        if ask > job.max_price {
            return Err(Reason::Price);
        }
        if !statics.always_available {
            // Every job needs the node open now; work that cannot be interrupted needs the
            // window to cover its whole runtime.
            let available = if statics.weekly_windows_only && self.clock_minute == Some(context.now.div_euclid(60)) {
                self.loads[node].open_until
            } else {
                self.nodes[node].policy.available_until(context.now)
            };
            match (available, context.window_until) {
                (None, _) => return Err(Reason::Window),
                (Some(end), Some(until)) if end < until => return Err(Reason::Window),
                _ => {}
            }
        }
        Ok(ask)
    }

    /// Full check of one node for one replica on top of `load` (the node's load, or a scratch
    /// copy with earlier replicas of the same plan applied).
    pub(crate) fn fit_on(&self, node: usize, load: &NodeLoad, context: &JobContext) -> Result<Fit, Reason> {
        let ask = self.static_check(node, context)?;
        let statics = &self.statics[node];
        let resources = &context.job.resources;
        if statics.cpu_milli - load.cpu_used < resources.cpu_milli {
            return Err(Reason::Cpu);
        }
        if statics.memory_mib - load.memory_used < resources.memory_mib {
            return Err(Reason::Memory);
        }
        let whole_wanted = context.whole_gpus(statics).ok_or(Reason::GpuModel)?;
        let share = context.share_milli();
        let gpus = statics.gpu_count as usize;
        let used = &load.gpu_used_milli[..gpus];
        let whole_free = used.iter().filter(|&&milli| milli == 0).count() as u8;
        let config = &self.config;
        let (gpu_mask, gpu_milli, fragmentation_permille) = if whole_wanted > 0 {
            if whole_free < whole_wanted {
                return Err(Reason::GpuCapacity);
            }
            let mut mask = 0u16;
            let mut taken = 0;
            for (gpu, &milli) in used.iter().enumerate() {
                if milli == 0 && taken < whole_wanted {
                    mask |= 1 << gpu;
                    taken += 1;
                }
            }
            let leftover = u64::from(whole_free - whole_wanted);
            let breaks_whole_node = whole_free == statics.gpu_count && leftover > 0;
            let penalty = leftover * config.leftover_gpu_permille
                + if breaks_whole_node {
                    config.whole_node_break_permille
                } else {
                    0
                };
            (mask, GPU_MILLI_WHOLE, penalty)
        } else if share > 0 {
            // Best fit among GPUs already shared; otherwise split a whole GPU.
            let best_shared = used
                .iter()
                .enumerate()
                .filter(|(_, milli)| **milli > 0 && GPU_MILLI_WHOLE - **milli >= share)
                .min_by_key(|(gpu, milli)| (GPU_MILLI_WHOLE - **milli, *gpu));
            if let Some((gpu, milli)) = best_shared {
                let leftover = u64::from(GPU_MILLI_WHOLE - milli - share);
                (
                    1 << gpu,
                    share,
                    leftover / 100 * config.leftover_share_permille_per_100_milli,
                )
            } else if let Some(gpu) = used.iter().position(|milli| *milli == 0) {
                let breaks_whole_node = whole_free == statics.gpu_count && gpus > 1;
                let penalty = config.split_gpu_permille
                    + u64::from(whole_free - 1) * config.leftover_gpu_permille
                    + if breaks_whole_node {
                        config.whole_node_break_permille
                    } else {
                        0
                    };
                (1 << gpu, share, penalty)
            } else {
                return Err(Reason::GpuCapacity);
            }
        } else {
            (0, 0, 0)
        };
        let taken = crate::reserve::whole_taken(load, gpu_mask, gpu_milli);
        let preempt_at = self.reservation_conflict(node, load, context, taken)?;
        let effective = effective_ask(ask.0, statics.cu_milli, statics.reliability_weight_ppm);
        let mut penalty_permille = fragmentation_permille;
        let mixes_tiers = if context.tier == Tier::Bronze {
            load.other_milli > 0
        } else {
            load.bronze_milli > 0
        };
        if mixes_tiers {
            penalty_permille += config.tier_mix_permille;
        }
        if context.rescored {
            penalty_permille += self.data_permille(node, context) + self.latency_permille(node, context);
        }
        let score = effective.saturating_add(effective.saturating_mul(penalty_permille) / 1000);
        Ok(Fit {
            node: node as u32,
            gpu_mask,
            gpu_milli,
            ask,
            effective,
            score,
            preempt_at,
        })
    }

    /// Staging the datasets the node lacks, priced at the job's own rate: staging seconds over
    /// the job's runtime, in thousandths.
    fn data_permille(&self, node: usize, context: &JobContext) -> u64 {
        let node = &self.nodes[node];
        let missing_bytes: u64 = context
            .job
            .datasets
            .iter()
            .filter(|dataset| !node.holds_dataset(dataset.content_hash))
            .map(|dataset| dataset.size_bytes)
            .sum();
        if missing_bytes == 0 {
            return 0;
        }
        let bytes_per_second = u64::from(node.network_mbit_s.max(1)) * 125_000;
        let staging_s = missing_bytes.div_ceil(bytes_per_second);
        (staging_s * 1000 / u64::from(context.job.max_runtime_s.max(1))).min(self.config.data_penalty_max_permille)
    }

    /// Round trip beyond the target, as a share of the target (100 % over doubles the score).
    fn latency_permille(&self, node: usize, context: &JobContext) -> u64 {
        let Some(client) = context.job.client else { return 0 };
        let site = self.nodes[node].path.site;
        let distance_km = self.topology.distance_km(site, client.latitude, client.longitude);
        let round_trip_ms = self.config.latency_base_ms + distance_km * self.config.latency_ms_per_km;
        let target = f64::from(client.latency_target_ms.max(1));
        if round_trip_ms <= target {
            0
        } else {
            (((round_trip_ms - target) / target) * 1000.0).min(10_000.0) as u64
        }
    }
}

/// The catalog name of a model index.
pub(crate) fn model_name(model: u16) -> &'static str {
    &GpuCatalog::embedded().spec(model::GpuModel(model)).name
}
