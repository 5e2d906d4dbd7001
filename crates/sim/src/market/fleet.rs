//! The market's fleet: synth's sites, fabrics and 8-GPU nodes with three kinds of provider —
//! datacentres (always on, reliable), labs (nights and weekends) and hobbyists (evenings, one or
//! two consumer GPUs) — priced around each model's market price; a campus of GB200 NVL72 racks
//! for the big-training scenario; or a node list read from a file (openb, Philly, PAI).

use std::collections::BTreeMap;
use std::path::Path;

use model::{
    AvailabilityWindow, GpuCatalog, GpuModel, Micros, Node, NodeId, PriceRule, ProviderId, ProviderPolicy, RegionId,
    Tier, TierSet, Timestamp, Topology,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::packing::trace::{TraceError, read_text};

/// Share of the fleet's GPUs (per mille) held by hobbyists.
pub const HOBBYIST_GPU_PERMILLE: u64 = 10;
/// Share of synth's providers (per mille) that are labs selling nights and weekends.
pub const LAB_PROVIDER_PERMILLE: u32 = 350;
/// Unexpected interruptions per GPU-day measured on Llama 3 405B's 16,384 H100s
/// (reference/anchors-schedulers.md, part d).
pub const LLAMA3_INTERRUPTIONS_PER_GPU_DAY: f64 = 4.7e-4;
/// The reliability at which a node fails at exactly the Llama 3 rate; a node's rate scales with
/// `(1 − reliability) / (1 − this)`, so 0.999 fails ten times less often and 0.9 ten times more.
pub const RELIABILITY_AT_LLAMA3_RATE: f64 = 0.99;
/// The campus of the big-training scenario: one site of GB200 NVL72 racks (9 nodes × 8 GPUs).
pub const CAMPUS_FABRICS: u32 = 4;
pub const CAMPUS_SPARE_PERMILLE: u32 = 30;
pub const NODES_PER_RACK: u32 = 9;
/// Consumer cards are not in the price trace: their reference is the A100-PCIe-80GB's market
/// price times this (community markets rent an RTX 4090 for about a quarter of an A100 80GB).
pub const CONSUMER_PRICE_PERMILLE: [(&str, u64); 2] = [("RTX-4090", 250), ("RTX-3090", 150)];
/// Models missing from the price trace are priced from this one by compute units (as synth prices the L40).
pub const PRICED_BY_COMPUTE_FROM: &str = "A100-PCIe-80GB";
/// Peak-priced providers ask this share of their base on weekdays 09:00–17:00 local (as synth's
/// fleets do).
pub const PEAK_MULTIPLIER_PERMILLE: u32 = 1200;
/// GB200 is priced from the B200 by compute units.
pub const GB200_PRICED_FROM: &str = "B200";

/// Who sells a node, which decides its hours, its reliability and how it prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ProviderKind {
    Datacentre = 0,
    Lab = 1,
    Hobbyist = 2,
    Campus = 3,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 4] = [
        ProviderKind::Datacentre,
        ProviderKind::Lab,
        ProviderKind::Hobbyist,
        ProviderKind::Campus,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Datacentre => "datacentre",
            ProviderKind::Lab => "lab",
            ProviderKind::Hobbyist => "hobbyist",
            ProviderKind::Campus => "campus",
        }
    }

    /// What a kind draws: reliability (ppm) and silver ask as a share of the market price; and
    /// what it keeps: its bronze ask as a share of its silver ask, the tiers it sells, the share
    /// of its providers with a weekday peak price, the mean repair time of a failed node.
    ///
    /// Labs ask for firm work what datacentres ask (it competes with them for it) and discount
    /// their interruptible work more. (Labs asking less for firm work too put every open lab
    /// ahead of every datacentre in the matcher's order, and work longer than a lab's night
    /// walked past all of them: the index does not know windows.)
    ///
    /// The bronze share is one per kind, not drawn per provider. (It was chosen when the
    /// matcher's index keyed every node on its silver ask and bounded bronze by the fleet's
    /// lowest bronze-to-silver ratio, so spread ratios made bronze searches slow; the index now
    /// keys bronze sellers by their bronze ask when shares differ, and the simulator's figures
    /// are kept comparable by leaving the shares as they were.)
    fn profile(self) -> KindProfile {
        match self {
            ProviderKind::Datacentre => KindProfile {
                reliability_ppm: 985_000..=998_000,
                silver_permille: 850..=1150,
                bronze_permille: 500,
                tiers: TierSet::ALL,
                peak_priced_permille: 400,
                repair_mean_s: 4 * 3600,
            },
            ProviderKind::Lab => KindProfile {
                reliability_ppm: 950_000..=985_000,
                silver_permille: 850..=1150,
                bronze_permille: 400,
                tiers: TierSet::ALL,
                peak_priced_permille: 0,
                repair_mean_s: 12 * 3600,
            },
            ProviderKind::Hobbyist => KindProfile {
                reliability_ppm: 850_000..=970_000,
                silver_permille: 700..=1100,
                bronze_permille: 400,
                tiers: TierSet(1 << Tier::Bronze as u8),
                peak_priced_permille: 0,
                repair_mean_s: 24 * 3600,
            },
            ProviderKind::Campus => KindProfile {
                reliability_ppm: 990_000..=990_000,
                silver_permille: 1000..=1000,
                bronze_permille: 500,
                tiers: TierSet::ALL,
                peak_priced_permille: 0,
                repair_mean_s: 2 * 3600,
            },
        }
    }
}

struct KindProfile {
    reliability_ppm: std::ops::RangeInclusive<u32>,
    silver_permille: std::ops::RangeInclusive<u64>,
    bronze_permille: u64,
    /// Hobbyists sell interruptible work only: an evening PC can promise nothing firm.
    tiers: TierSet,
    peak_priced_permille: u32,
    repair_mean_s: u32,
}

/// The campus that holds the big-training gang.
#[derive(Clone, Debug, PartialEq)]
pub struct Campus {
    pub model: GpuModel,
    /// The campus's nodes are `first_node..first_node + nodes`; the gang's racks come first.
    pub first_node: u32,
    pub nodes: u32,
    /// Nodes in racks kept as spares (they sell only gold and bronze, so repair can take them back).
    pub spare_nodes: u32,
}

#[derive(Clone, Debug)]
pub struct MarketFleet {
    pub topology: Topology,
    /// `nodes[i].id == NodeId(i)`.
    pub nodes: Vec<Node>,
    /// Per node: who sells it.
    pub kinds: Vec<ProviderKind>,
    /// Per node: the on-demand reference price per GPU-hour of its model.
    pub on_demand: Vec<Micros>,
    pub campus: Option<Campus>,
    /// Where the fleet came from, for the report.
    pub source: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Synth(#[from] synth::FleetError),
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("{path}: {reason}")]
    NodeList { path: String, reason: String },
    #[error("no market price to derive {model}'s from: the prices lack {missing}")]
    MissingPrice { model: String, missing: String },
}

impl MarketFleet {
    pub fn gpu_count(&self) -> u64 {
        self.nodes.iter().map(|node| u64::from(node.gpu_count)).sum()
    }

    pub fn repair_mean_s(&self, node: usize) -> u32 {
        self.kinds[node].profile().repair_mean_s
    }

    /// Interruptions per second of a node: the Llama 3 rate per GPU, scaled by its reliability.
    pub fn failure_rate_per_s(&self, node: usize) -> f64 {
        let node = &self.nodes[node];
        let reliability = f64::from(node.reliability_ppm) / 1e6;
        let scale = (1.0 - reliability).max(0.0) / (1.0 - RELIABILITY_AT_LLAMA3_RATE);
        LLAMA3_INTERRUPTIONS_PER_GPU_DAY * scale * f64::from(node.gpu_count) / 86_400.0
    }

    /// Nodes that are not the campus: the market the synthetic demand is sized against.
    pub fn is_market(&self, node: usize) -> bool {
        self.kinds[node] != ProviderKind::Campus
    }
}

/// The on-demand reference price per GPU-hour of a model: the trace's market price, or one
/// derived from it (GB200 from B200 and other datacentre models from the A100-PCIe-80GB by
/// compute units, consumer cards by [`CONSUMER_PRICE_PERMILLE`]).
pub fn on_demand_reference(prices: &BTreeMap<String, Micros>, model: GpuModel) -> Result<Micros, FleetError> {
    let catalog = GpuCatalog::embedded();
    let spec = catalog.spec(model);
    if let Some(price) = prices.get(&spec.name) {
        return Ok(*price);
    }
    let from = |name: &str| {
        prices.get(name).copied().ok_or_else(|| FleetError::MissingPrice {
            model: spec.name.clone(),
            missing: name.to_string(),
        })
    };
    if let Some((_, permille)) = CONSUMER_PRICE_PERMILLE.iter().find(|(name, _)| *name == spec.name) {
        return Ok(from(PRICED_BY_COMPUTE_FROM)?
            .scale(*permille, 1000)
            .expect("no overflow"));
    }
    let reference = if spec.name == "GB200" {
        GB200_PRICED_FROM
    } else {
        PRICED_BY_COMPUTE_FROM
    };
    let reference_model = catalog
        .find(reference)
        .expect("the reference models are in the catalog");
    Ok(from(reference)?
        .scale(
            u64::from(spec.cu_milli),
            u64::from(catalog.spec(reference_model).cu_milli.max(1)),
        )
        .expect("no overflow"))
}

/// UTC offsets of synth's regions (`synth::REGIONS` order), in minutes: providers' hours are local.
const REGION_UTC_OFFSET_MIN: [i32; 5] = [-300, -480, 60, 60, 330];

fn utc_offset_min(region: RegionId) -> i32 {
    REGION_UTC_OFFSET_MIN.get(region.index()).copied().unwrap_or(0)
}

/// Local weekly hours `(days, start_minute, end_minute)` (bit 0 = Monday) shifted to UTC and cut
/// at UTC midnights, with pieces of the same hours on several days merged.
pub fn utc_weekly(local: &[(u8, u32, u32)], offset_min: i32) -> Vec<(u8, u32, u32)> {
    const WEEK_MIN: i64 = 7 * 1440;
    let mut pieces: Vec<(u32, u32, u8)> = Vec::new();
    for &(days, start, end) in local {
        for day in 0..7i64 {
            if days & (1 << day) == 0 {
                continue;
            }
            let mut from = (day * 1440 + i64::from(start) - i64::from(offset_min)).rem_euclid(WEEK_MIN);
            let mut length = i64::from(end) - i64::from(start);
            while length > 0 {
                let utc_day = from / 1440;
                let minute = from % 1440;
                let take = length.min(1440 - minute);
                pieces.push((minute as u32, (minute + take) as u32, 1 << utc_day));
                length -= take;
                from = (from + take) % WEEK_MIN;
            }
        }
    }
    pieces.sort_unstable();
    let mut merged: Vec<(u8, u32, u32)> = Vec::new();
    for (start, end, day) in pieces {
        match merged.iter_mut().find(|entry| entry.1 == start && entry.2 == end) {
            Some(entry) => entry.0 |= day,
            None => merged.push((day, start, end)),
        }
    }
    merged
}

fn windows_for(kind: ProviderKind, region: RegionId) -> Vec<AvailabilityWindow> {
    const WEEKDAYS: u8 = 0b001_1111;
    const WEEKEND: u8 = 0b110_0000;
    const EVERY_DAY: u8 = 0b111_1111;
    let local: &[(u8, u32, u32)] = match kind {
        ProviderKind::Datacentre | ProviderKind::Campus => return Vec::new(),
        // Weekday nights 20:00–08:00 and whole weekends.
        ProviderKind::Lab => &[(WEEKDAYS, 20 * 60, 1440), (WEEKDAYS, 0, 8 * 60), (WEEKEND, 0, 1440)],
        // Evenings, 18:00–01:00.
        ProviderKind::Hobbyist => &[(EVERY_DAY, 18 * 60, 1440), (EVERY_DAY, 0, 60)],
    };
    utc_weekly(local, utc_offset_min(region))
        .into_iter()
        .map(|(days, start_minute, end_minute)| AvailabilityWindow::Weekly {
            days,
            start_minute,
            end_minute,
        })
        .collect()
}

/// Weekday 09:00–17:00 local at 1.2× the base ask.
fn peak_rules(region: RegionId) -> Vec<PriceRule> {
    utc_weekly(&[(0b001_1111, 9 * 60, 17 * 60)], utc_offset_min(region))
        .into_iter()
        .map(|(days, start_minute, end_minute)| PriceRule {
            days,
            start_minute,
            end_minute,
            multiplier_permille: PEAK_MULTIPLIER_PERMILLE,
        })
        .collect()
}

/// A provider's draws for its kind, applied to each of its nodes.
struct Drawn {
    reliability_ppm: u32,
    silver_permille: u64,
    bronze_permille: u64,
    peak_priced: bool,
}

fn draw(kind: ProviderKind, rng: &mut ChaCha8Rng) -> Drawn {
    let profile = kind.profile();
    Drawn {
        reliability_ppm: rng.random_range(profile.reliability_ppm),
        silver_permille: rng.random_range(profile.silver_permille),
        bronze_permille: profile.bronze_permille,
        peak_priced: rng.random_range(0..1000u32) < profile.peak_priced_permille,
    }
}

/// A node's policy: asks from the on-demand reference, hours by kind, the tiers and classes
/// given. The gold ask is the silver ask: both are firm leases that cost the provider the same
/// (a gold SLA breach is credited from the platform's SLA pot, not by the provider), and under
/// the (k+1)-price auction a provider's best ask is its cost. A premium on gold asks is
/// [`set_gold_ask_premium`]'s.
fn policy(
    kind: ProviderKind,
    region: RegionId,
    reference: Micros,
    drawn: &Drawn,
    base: &ProviderPolicy,
) -> ProviderPolicy {
    let silver = reference.scale(drawn.silver_permille, 1000).expect("no overflow");
    ProviderPolicy {
        asks: [
            Some(silver),
            Some(silver),
            Some(silver.scale(drawn.bronze_permille, 1000).expect("no overflow")),
        ],
        price_rules: if drawn.peak_priced {
            peak_rules(region)
        } else {
            Vec::new()
        },
        windows: windows_for(kind, region),
        ..base.clone()
    }
}

/// Sets every gold ask to the node's silver ask plus `premium_permille` of it (providers who
/// charge more for the gold tier than it costs them); nodes that do not sell gold keep no ask.
pub fn set_gold_ask_premium(fleet: &mut MarketFleet, premium_permille: u32) {
    for node in &mut fleet.nodes {
        let [gold, silver, _] = &mut node.policy.asks;
        if let (Some(gold), Some(silver)) = (gold.as_mut(), silver.as_ref()) {
            *gold = silver
                .scale(1000 + u64::from(premium_permille), 1000)
                .expect("no overflow");
        }
    }
}

/// What to build.
#[derive(Clone, Debug)]
pub struct FleetPlan {
    /// GPUs of the market (datacentres, labs and hobbyists), before any campus.
    pub gpus: u64,
    pub seed: u64,
    /// Market price per GPU-hour by catalog name (as `synth::market_prices` reads them).
    pub prices: BTreeMap<String, Micros>,
    /// GPUs of the big-training gang, if the scenario has one: a campus is added to hold it.
    pub campus_gang_gpus: Option<u32>,
}

/// The synthetic market fleet. The same plan always gives the same fleet.
pub fn synthetic(plan: &FleetPlan) -> Result<MarketFleet, FleetError> {
    let hobbyist_gpus = plan.gpus * HOBBYIST_GPU_PERMILLE / 1000;
    let minimum = synth::SITES.len() as u64 * u64::from(synth::GPUS_PER_NODE);
    let base_gpus = ((plan.gpus - hobbyist_gpus) / 8 * 8).max(minimum);
    let base = synth::fleet(&synth::FleetSpec {
        gpus: base_gpus,
        seed: plan.seed,
        prices: plan.prices.clone(),
    })?;
    let catalog = GpuCatalog::embedded();
    let gb200 = catalog.find("GB200").expect("GB200 is in the catalog");
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed);
    // Apart from synth's streams (fleet 0, jobs 1, picker 2).
    rng.set_stream(10);
    let mut topology = base.topology;
    let mut nodes = Vec::with_capacity(base.nodes.len() + (hobbyist_gpus as usize) + 16);
    let mut kinds = Vec::with_capacity(nodes.capacity());
    let mut on_demand = Vec::with_capacity(nodes.capacity());
    let mut provider: Option<(ProviderId, ProviderKind, Drawn)> = None;
    for mut node in base.nodes {
        // synth's Blackwell racks are NVL72 domains: GB200 NVL72 racks here.
        if topology.nvlink_domains[node.path.nvlink.index()].gpus == 72 {
            node.gpu_model = gb200;
        }
        if provider.as_ref().is_none_or(|(id, _, _)| *id != node.provider) {
            let kind = if rng.random_range(0..1000u32) < LAB_PROVIDER_PERMILLE {
                ProviderKind::Lab
            } else {
                ProviderKind::Datacentre
            };
            provider = Some((node.provider, kind, draw(kind, &mut rng)));
        }
        let (_, kind, drawn) = provider.as_ref().expect("drawn above");
        let reference = on_demand_reference(&plan.prices, node.gpu_model)?;
        node.policy = policy(*kind, node.path.region, reference, drawn, &node.policy);
        node.reliability_ppm = drawn.reliability_ppm;
        nodes.push(node);
        kinds.push(*kind);
        on_demand.push(reference);
    }
    let template = nodes[0].clone();
    let mut next_provider = nodes.iter().map(|node| node.provider.0).max().unwrap_or(0) + 1;
    add_hobbyists(
        &mut topology,
        &mut nodes,
        &mut kinds,
        &mut on_demand,
        &template,
        hobbyist_gpus,
        &plan.prices,
        &mut next_provider,
        &mut rng,
    )?;
    let campus = match plan.campus_gang_gpus {
        Some(gang_gpus) => Some(add_campus(
            &mut topology,
            &mut nodes,
            &mut kinds,
            &mut on_demand,
            &template,
            gang_gpus,
            &plan.prices,
            ProviderId(next_provider),
        )?),
        None => None,
    };
    Ok(MarketFleet {
        topology,
        nodes,
        kinds,
        on_demand,
        campus,
        source: format!("synthetic, seed {}", plan.seed),
    })
}

#[allow(clippy::too_many_arguments)]
fn add_hobbyists(
    topology: &mut Topology,
    nodes: &mut Vec<Node>,
    kinds: &mut Vec<ProviderKind>,
    on_demand: &mut Vec<Micros>,
    template: &Node,
    gpus: u64,
    prices: &BTreeMap<String, Micros>,
    next_provider: &mut u32,
    rng: &mut ChaCha8Rng,
) -> Result<(), FleetError> {
    if gpus == 0 {
        return Ok(());
    }
    let catalog = GpuCatalog::embedded();
    let models = [
        catalog.find("RTX-4090").expect("in the catalog"),
        catalog.find("RTX-3090").expect("in the catalog"),
    ];
    // Home connections: one "fabric" per site that joins nothing.
    let sites = topology.sites.len();
    let homes: Vec<model::FabricId> = (0..sites)
        .map(|site| {
            let name = format!("{}-home", topology.sites[site].name);
            topology.add_fabric(name, model::SiteId(site as u16))
        })
        .collect();
    let mut placed = 0u64;
    let mut index = 0usize;
    while placed < gpus {
        let gpu_count: u8 = if rng.random_range(0..10u32) < 7 { 1 } else { 2 };
        let gpu_model = models[usize::from(rng.random_range(0..10u32) >= 6)];
        let site = index % sites;
        let domain = topology.add_nvlink_domain(homes[site], u32::from(gpu_count));
        let path = topology.path(domain);
        let drawn = draw(ProviderKind::Hobbyist, rng);
        let reference = on_demand_reference(prices, gpu_model)?;
        let base_policy = ProviderPolicy {
            allowed_tiers: ProviderKind::Hobbyist.profile().tiers,
            ..template.policy.clone()
        };
        let id = NodeId(u32::try_from(nodes.len()).expect("at most 2^32 nodes"));
        nodes.push(Node {
            id,
            name: format!("{}-home-{index:05}", topology.sites[site].name),
            provider: ProviderId(*next_provider),
            path,
            gpu_model,
            gpu_count,
            cpu_milli: 16_000 * u32::from(gpu_count),
            memory_mib: 64 * 1024 * u64::from(gpu_count),
            network_mbit_s: 1_000,
            datasets: Vec::new(),
            reliability_ppm: drawn.reliability_ppm,
            policy: policy(ProviderKind::Hobbyist, path.region, reference, &drawn, &base_policy),
            simulated: false,
            ..template.clone()
        });
        kinds.push(ProviderKind::Hobbyist);
        on_demand.push(reference);
        *next_provider += 1;
        placed += u64::from(gpu_count);
        index += 1;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn add_campus(
    topology: &mut Topology,
    nodes: &mut Vec<Node>,
    kinds: &mut Vec<ProviderKind>,
    on_demand: &mut Vec<Micros>,
    template: &Node,
    gang_gpus: u32,
    prices: &BTreeMap<String, Micros>,
    provider: ProviderId,
) -> Result<Campus, FleetError> {
    let catalog = GpuCatalog::embedded();
    let model = catalog.find("GB200").expect("GB200 is in the catalog");
    let gang_nodes = gang_gpus.div_ceil(synth::GPUS_PER_NODE);
    let gang_racks = gang_nodes.div_ceil(NODES_PER_RACK);
    let spare_racks = (gang_racks * CAMPUS_SPARE_PERMILLE).div_ceil(1000).max(CAMPUS_FABRICS);
    let racks = gang_racks + spare_racks;
    let region = RegionId(0);
    let site = topology.add_site("campus-mem1", region, 35.15, -90.05);
    let fabrics: Vec<model::FabricId> = (0..CAMPUS_FABRICS)
        .map(|fabric| topology.add_fabric(format!("campus-mem1-ib{fabric}"), site))
        .collect();
    let reference = on_demand_reference(prices, model)?;
    let drawn = Drawn {
        reliability_ppm: *ProviderKind::Campus.profile().reliability_ppm.start(),
        silver_permille: 1000,
        bronze_permille: 500,
        peak_priced: false,
    };
    let gang_policy = policy(
        ProviderKind::Campus,
        region,
        reference,
        &drawn,
        &ProviderPolicy {
            allowed_tiers: TierSet::ALL,
            allowed_classes: model::ClassSet::ALL,
            ..template.policy.clone()
        },
    );
    // Hot spares sell interruptible work to anyone, and firm work only to training (so that
    // a replacement for the gang, gold training, can take them back or find them free).
    let spare_policy = ProviderPolicy {
        allowed_tiers: TierSet::of(&[Tier::Gold, Tier::Bronze]),
        allowed_classes: model::ClassSet::of(&[model::WorkloadClass::Training]),
        ..gang_policy.clone()
    };
    let first_node = u32::try_from(nodes.len()).expect("at most 2^32 nodes");
    // Spare racks are spread over the fabrics, so a spare is near every rack; gang racks fill
    // the fabrics in order.
    let spare_every = racks / spare_racks;
    let mut gang_racks_left = gang_racks;
    for rack in 0..racks {
        let spare = (rack % spare_every == spare_every - 1 && rack / spare_every < spare_racks) || gang_racks_left == 0;
        if !spare {
            gang_racks_left -= 1;
        }
        let fabric = fabrics[(rack * CAMPUS_FABRICS / racks) as usize];
        let domain = topology.add_nvlink_domain(fabric, NODES_PER_RACK * synth::GPUS_PER_NODE);
        let path = topology.path(domain);
        for slot in 0..NODES_PER_RACK {
            let id = NodeId(u32::try_from(nodes.len()).expect("at most 2^32 nodes"));
            nodes.push(Node {
                id,
                name: format!("campus-r{rack:04}-n{slot}"),
                provider,
                path,
                gpu_model: model,
                gpu_count: synth::GPUS_PER_NODE as u8,
                cpu_milli: 144_000,
                memory_mib: 1_920 * 1024,
                network_mbit_s: 400_000,
                datasets: Vec::new(),
                reliability_ppm: drawn.reliability_ppm,
                policy: if spare {
                    spare_policy.clone()
                } else {
                    gang_policy.clone()
                },
                simulated: false,
                ..template.clone()
            });
            kinds.push(ProviderKind::Campus);
            on_demand.push(reference);
        }
    }
    Ok(Campus {
        model,
        first_node,
        nodes: racks * NODES_PER_RACK,
        spare_nodes: spare_racks * NODES_PER_RACK,
    })
}

/// One machine of a node list file.
#[derive(Clone, Debug, PartialEq)]
pub struct ListedNode {
    pub name: String,
    pub gpu_model: String,
    pub gpu_count: u8,
    pub cpu_milli: u32,
    pub memory_mib: u64,
}

/// Reads a node list in one of three forms, told apart by their header: openb
/// (`sn,cpu_milli,memory_mib,gpu,model`), Philly (`machineId, number of GPUs, single GPU mem`)
/// or PAI's machine spec (no header: `machine,gpu_type,cap_cpu,cap_mem,cap_gpu`). CPU-only
/// machines are left out: the market sells GPUs.
pub fn read_node_list(path: &Path) -> Result<Vec<ListedNode>, FleetError> {
    let bad = |reason: String| FleetError::NodeList {
        path: path.display().to_string(),
        reason,
    };
    let bytes = read_text(path)?;
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".into()))?;
    let first = text.lines().next().ok_or_else(|| bad("the file is empty".into()))?;
    let mut listed = Vec::new();
    if first.starts_with("sn,") {
        for record in crate::packing::trace::parse_nodes(path, text.as_bytes())? {
            listed.push(ListedNode {
                name: record.name,
                gpu_model: record.model,
                gpu_count: record.gpu_count,
                cpu_milli: record.cpu_milli,
                memory_mib: record.memory_mib,
            });
        }
    } else if first.starts_with("machineId") {
        for (index, line) in text.lines().enumerate().skip(1) {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if line.trim().is_empty() {
                continue;
            }
            let [name, gpus, memory] = fields[..] else {
                return Err(bad(format!(
                    "line {}: expected 3 fields, found {}",
                    index + 1,
                    fields.len()
                )));
            };
            let gpu_count: u8 = gpus
                .parse()
                .map_err(|_| bad(format!("line {}: {gpus:?} is not a GPU count", index + 1)))?;
            // Philly's 12 GB cards (K80/M40 class) are not in the catalog: the nearest is the P100 16 GB.
            let gpu_model = if memory.starts_with("24") {
                "P40"
            } else {
                "P100-PCIe-16GB"
            };
            listed.push(ListedNode {
                name: name.to_string(),
                gpu_model: gpu_model.to_string(),
                gpu_count,
                cpu_milli: 8_000 * u32::from(gpu_count).max(2),
                memory_mib: 64 * 1024 * u64::from(gpu_count).max(2),
            });
        }
    } else {
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [name, model, cpus, memory_gib, gpus] = fields[..] else {
                return Err(bad(format!(
                    "line {}: not an openb, Philly or PAI node list (expected 5 fields here, found {})",
                    index + 1,
                    fields.len()
                )));
            };
            let number = |value: &str, what: &str| {
                value
                    .parse::<f64>()
                    .map_err(|_| bad(format!("line {}: {what} {value:?} is not a number", index + 1)))
            };
            let gpu_count = number(gpus, "cap_gpu")? as u8;
            listed.push(ListedNode {
                name: name.to_string(),
                // PAI's MISC machines hold unnamed GPUs: taken as T4s.
                gpu_model: if model == "MISC" {
                    "T4".into()
                } else {
                    model.to_string()
                },
                gpu_count,
                cpu_milli: (number(cpus, "cap_cpu")? * 1000.0) as u32,
                memory_mib: (number(memory_gib, "cap_mem")? * 1024.0) as u64,
            });
        }
    }
    listed.retain(|node| node.gpu_count > 0);
    if listed.is_empty() {
        return Err(bad("no machine with GPUs".into()));
    }
    Ok(listed)
}

/// A fleet from a node list: the machines' hardware from the file; their places (synth's
/// regions and sites), providers' kinds and asks drawn as for the synthetic fleet.
pub fn from_node_list(
    listed: &[ListedNode],
    seed: u64,
    prices: &BTreeMap<String, Micros>,
    source: &str,
) -> Result<MarketFleet, FleetError> {
    let catalog = GpuCatalog::embedded();
    let minimum = synth::SITES.len() as u64;
    let base = synthetic(&FleetPlan {
        gpus: (listed.len() as u64).max(minimum) * 8 * 1000 / (1000 - HOBBYIST_GPU_PERMILLE) + 8,
        seed,
        prices: prices.clone(),
        campus_gang_gpus: None,
    })?;
    let mut topology = base.topology.clone();
    let mut nodes = Vec::with_capacity(listed.len());
    let mut kinds = Vec::with_capacity(listed.len());
    let mut on_demand = Vec::with_capacity(listed.len());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(11);
    let datacentre_or_lab: Vec<usize> = (0..base.nodes.len())
        .filter(|index| base.kinds[*index] != ProviderKind::Hobbyist)
        .collect();
    for (index, machine) in listed.iter().enumerate() {
        let gpu_model = catalog
            .find_or_explain(&machine.gpu_model)
            .map_err(|unknown| FleetError::NodeList {
                path: source.to_string(),
                reason: format!("{}: {unknown}", machine.name),
            })?;
        let template = &base.nodes[datacentre_or_lab[index % datacentre_or_lab.len()]];
        let kind = base.kinds[template.id.index()];
        let fabric = topology.nvlink_domains[template.path.nvlink.index()].fabric;
        let domain = topology.add_nvlink_domain(fabric, u32::from(machine.gpu_count));
        let reference = on_demand_reference(prices, gpu_model)?;
        let drawn = draw(kind, &mut rng);
        let path = topology.path(domain);
        nodes.push(Node {
            id: NodeId(index as u32),
            name: machine.name.clone(),
            path,
            gpu_model,
            gpu_count: machine.gpu_count,
            cpu_milli: machine.cpu_milli,
            memory_mib: machine.memory_mib,
            reliability_ppm: drawn.reliability_ppm,
            policy: policy(kind, path.region, reference, &drawn, &template.policy),
            ..template.clone()
        });
        kinds.push(kind);
        on_demand.push(reference);
    }
    Ok(MarketFleet {
        topology,
        nodes,
        kinds,
        on_demand,
        campus: None,
        source: source.to_string(),
    })
}

/// The share of a week a node's windows are open (1 when always available), sampled each minute
/// of a week from `start` — the same for every node with the same windows, so computed once per
/// window set.
pub fn open_share(windows: &[AvailabilityWindow], start: Timestamp) -> f64 {
    if windows.is_empty() {
        return 1.0;
    }
    let policy = ProviderPolicy {
        windows: windows.to_vec(),
        ..ProviderPolicy::flat(Micros(1))
    };
    let mut open = 0u32;
    let mut minute = 0i64;
    let week_minutes = 7 * 1440;
    while minute < week_minutes {
        let at = start + minute * 60;
        match policy.available_until(at) {
            Some(end) => {
                let minutes = ((end - at) / 60).clamp(1, week_minutes - minute);
                open += minutes as u32;
                minute += minutes;
            }
            None => minute += 1,
        }
    }
    f64::from(open) / week_minutes as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hours_shift_to_utc_and_wrap() {
        // 20:00–24:00 on Monday in UTC−5 is 01:00–05:00 on Tuesday UTC.
        assert_eq!(utc_weekly(&[(0b1, 20 * 60, 1440)], -300), vec![(0b10, 60, 300)]);
        // 22:00–24:00 every day in UTC+5:30 is 16:30–18:30 UTC every day.
        assert_eq!(utc_weekly(&[(0x7f, 22 * 60, 1440)], 330), vec![(0x7f, 990, 1110)]);
        // Sunday 18:00–24:00 in UTC−8 runs to Monday 08:00 UTC: it wraps the week.
        assert_eq!(utc_weekly(&[(0b100_0000, 18 * 60, 1440)], -480), vec![(0b1, 120, 480)]);
        // An evening in UTC+1 starting at 00:30 local crosses back into the previous UTC day.
        assert_eq!(
            utc_weekly(&[(0b10, 30, 180)], 60),
            vec![(0b10, 0, 120), (0b1, 1410, 1440)]
        );
    }

    #[test]
    fn open_shares_by_kind() {
        let monday = 1_736_121_600;
        assert_eq!(open_share(&[], monday), 1.0);
        let lab = windows_for(ProviderKind::Lab, RegionId(2));
        // 5 nights of 12 h and a 48 h weekend: 108 of 168 hours.
        assert!((open_share(&lab, monday) - 108.0 / 168.0).abs() < 1e-9);
        let hobbyist = windows_for(ProviderKind::Hobbyist, RegionId(0));
        assert!((open_share(&hobbyist, monday) - 7.0 / 24.0).abs() < 1e-9);
    }
}
