//! Synthetic fleets: 8-GPU nodes over 5 regions and 20 sites, one fabric per site, HGX boards
//! and NVL72-like B200 racks, provider policies priced around the market.

use std::collections::BTreeMap;

use model::{
    AvailabilityWindow, ClassSet, Dataset, GpuCatalog, GpuModel, Micros, Node, NodeId, NvlinkDomainId, PriceRule,
    ProviderId, ProviderPolicy, RegionId, Tier, TierSet, Topology, WorkloadClass, daily_window,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::datasets::dataset_catalogue;

/// Every synthetic node has this many GPUs.
pub const GPUS_PER_NODE: u32 = 8;
/// B200 nodes are grouped into NVL72-like racks: 9 nodes × 8 GPUs in one NVLink domain.
pub const NODES_PER_NVL72_DOMAIN: usize = 9;
/// Consecutive nodes of a site that belong to one provider.
pub const NODES_PER_PROVIDER: usize = 8;

/// The fleet's GPU models and their weights (shares of the fleet's GPUs, in percent), heavy on
/// H100 and A100 as today's rental markets are.
pub const MODEL_MIX: [(&str, u32); 8] = [
    ("H100-SXM5", 30),
    ("A100-SXM4-80GB", 18),
    ("H100-PCIe", 12),
    ("A100-PCIe-80GB", 12),
    ("H200-SXM", 10),
    ("L40", 8),
    ("B200", 6),
    ("GH200", 4),
];

/// The price trace has no L40: it is priced like the A100-PCIe-80GB scaled by the ratio of
/// their compute units (0.183 / 0.315 CU, from 181 and 312 dense TFLOPS: about 0.58 of the price).
pub const L40_PRICED_FROM: &str = "A100-PCIe-80GB";

pub const REGIONS: [&str; 5] = ["us-east", "us-west", "eu-west", "eu-north", "ap-south"];

/// `(region index, name, latitude, longitude)`: four real data-centre towns per region.
pub const SITES: [(usize, &str, f64, f64); 20] = [
    (0, "iad1", 39.04, -77.49),
    (0, "nyc1", 40.71, -74.01),
    (0, "atl1", 33.75, -84.39),
    (0, "cmh1", 39.96, -83.00),
    (1, "hio1", 45.54, -122.94),
    (1, "sjc1", 37.34, -121.89),
    (1, "phx1", 33.45, -112.07),
    (1, "las1", 36.17, -115.14),
    (2, "par1", 48.86, 2.35),
    (2, "lhr1", 51.51, -0.13),
    (2, "ams1", 52.37, 4.90),
    (2, "fra1", 50.11, 8.68),
    (3, "arn1", 59.33, 18.07),
    (3, "hel1", 60.17, 24.94),
    (3, "osl1", 59.91, 10.75),
    (3, "kef1", 64.15, -21.94),
    (4, "bom1", 19.08, 72.88),
    (4, "maa1", 13.08, 80.27),
    (4, "sin1", 1.35, 103.82),
    (4, "hyd1", 17.39, 78.49),
];

/// Per mille of providers that sell only at certain hours (evenings and nights, or weekends).
pub const WINDOWED_PROVIDERS_PERMILLE: u32 = 300;
/// Per mille of providers that do not sell the bronze tier.
pub const NO_BRONZE_PROVIDERS_PERMILLE: u32 = 100;
/// Per mille of providers that do not accept training.
pub const NO_TRAINING_PROVIDERS_PERMILLE: u32 = 50;
/// Per mille of providers with a weekday 9–17 peak price.
pub const PEAK_PRICED_PROVIDERS_PERMILLE: u32 = 250;
/// Peak asks are the base ask × 1.2.
pub const PEAK_MULTIPLIER_PERMILLE: u32 = 1200;
/// Tier asks relative to the provider's base (silver) ask.
pub const GOLD_ASK_PERMILLE: u64 = 1200;
pub const BRONZE_ASK_PERMILLE: u64 = 600;
/// A provider's base ask is the market price × a factor drawn in this range (±25 %).
pub const ASK_FACTOR_PERMILLE: std::ops::RangeInclusive<u32> = 750..=1250;
/// Provider reliability lies in this range, skewed toward the top.
pub const RELIABILITY_PPM_MIN: u32 = 600_000;
pub const RELIABILITY_PPM_MAX: u32 = 999_000;

/// What to build.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// GPUs in the fleet; `gpus / 8` nodes are built.
    pub gpus: u64,
    pub seed: u64,
    /// Market price per GPU-hour by catalog model name, as [`crate::market_prices`] returns.
    pub prices: BTreeMap<String, Micros>,
}

/// One GPU model of a fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetModel {
    pub model: GpuModel,
    /// Weight in [`MODEL_MIX`].
    pub weight: u32,
    pub market_price: Micros,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Fleet {
    pub topology: Topology,
    /// `nodes[i].id == NodeId(i)`; a site's nodes are contiguous.
    pub nodes: Vec<Node>,
    /// The models in the fleet, in [`MODEL_MIX`] order.
    pub models: Vec<FleetModel>,
}

impl Fleet {
    pub fn gpu_count(&self) -> u64 {
        self.nodes.iter().map(|node| u64::from(node.gpu_count)).sum()
    }

    pub fn market_price(&self, model: GpuModel) -> Option<Micros> {
        self.models
            .iter()
            .find(|fleet_model| fleet_model.model == model)
            .map(|fleet_model| fleet_model.market_price)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FleetError {
    #[error("a fleet needs at least {minimum} GPUs (8 per node, one node per site), not {gpus}")]
    TooSmall { gpus: u64, minimum: u64 },
    #[error("no market price for {model}; the prices cover {known}")]
    MissingPrice { model: String, known: String },
}

/// Per-provider choices, drawn once for each run of [`NODES_PER_PROVIDER`] nodes.
struct ProviderProfile {
    id: ProviderId,
    ask_factor_permille: u32,
    peak_priced: bool,
    reliability_ppm: u32,
    allowed_tiers: TierSet,
    allowed_classes: ClassSet,
    windows: Vec<AvailabilityWindow>,
}

/// Builds the fleet `spec` describes. The same spec always gives the same fleet.
pub fn fleet(spec: &FleetSpec) -> Result<Fleet, FleetError> {
    let minimum = (SITES.len() as u64) * u64::from(GPUS_PER_NODE);
    if spec.gpus < minimum {
        return Err(FleetError::TooSmall {
            gpus: spec.gpus,
            minimum,
        });
    }
    let models = fleet_models(&spec.prices)?;
    let catalog = GpuCatalog::embedded();
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let datasets = dataset_catalogue();

    let mut topology = Topology::default();
    let regions: Vec<RegionId> = REGIONS.iter().map(|name| topology.add_region(*name)).collect();

    let node_count = usize::try_from(spec.gpus / u64::from(GPUS_PER_NODE)).expect("node count fits in usize");
    let mut nodes = Vec::with_capacity(node_count);
    let mut next_provider = 0u32;
    for (site_index, &(region_index, site_name, latitude, longitude)) in SITES.iter().enumerate() {
        let site = topology.add_site(site_name, regions[region_index], latitude, longitude);
        let fabric = topology.add_fabric(format!("{site_name}-ib0"), site);
        let site_nodes = node_count / SITES.len() + usize::from(site_index < node_count % SITES.len());
        let counts = site_model_counts(site_nodes, &models, &mut rng);

        let mut provider: Option<ProviderProfile> = None;
        let mut index_in_site = 0usize;
        // Each model forms one cluster of the site, the way operators buy racks.
        for (fleet_model, &count) in models.iter().zip(&counts) {
            let nodes_per_domain = if is_nvl72_model(catalog, fleet_model.model) {
                NODES_PER_NVL72_DOMAIN
            } else {
                1
            };
            let mut domain = NvlinkDomainId(0);
            for index_in_model in 0..count {
                if index_in_model.is_multiple_of(nodes_per_domain) {
                    domain = topology.add_nvlink_domain(fabric, (nodes_per_domain as u32) * GPUS_PER_NODE);
                }
                if index_in_site.is_multiple_of(NODES_PER_PROVIDER) {
                    provider = Some(provider_profile(ProviderId(next_provider), &mut rng));
                    next_provider += 1;
                }
                let profile = provider
                    .as_ref()
                    .expect("a provider is drawn on each site's first node");
                let id = NodeId(u32::try_from(nodes.len()).expect("at most 2^32 nodes"));
                nodes.push(build_node(
                    id,
                    format!("{site_name}-{index_in_site:05}"),
                    topology.path(domain),
                    fleet_model,
                    profile,
                    &datasets,
                    &mut rng,
                ));
                index_in_site += 1;
            }
        }
        debug_assert_eq!(index_in_site, site_nodes);
    }
    Ok(Fleet {
        topology,
        nodes,
        models,
    })
}

/// Resolves [`MODEL_MIX`] against the catalog and the prices.
fn fleet_models(prices: &BTreeMap<String, Micros>) -> Result<Vec<FleetModel>, FleetError> {
    let catalog = GpuCatalog::embedded();
    let missing = |model: &str| FleetError::MissingPrice {
        model: model.to_string(),
        known: prices.keys().cloned().collect::<Vec<_>>().join(", "),
    };
    let price_of = |name: &str| -> Result<Micros, FleetError> {
        let model = catalog.find(name).expect("MODEL_MIX names are in the catalog");
        prices
            .get(&catalog.spec(model).name)
            .copied()
            .ok_or_else(|| missing(name))
    };
    MODEL_MIX
        .iter()
        .map(|&(name, weight)| {
            let model = catalog.find(name).expect("MODEL_MIX names are in the catalog");
            let market_price = match price_of(name) {
                Ok(price) => price,
                Err(_) if name == "L40" => {
                    let reference = catalog.find(L40_PRICED_FROM).expect("the reference is in the catalog");
                    price_of(L40_PRICED_FROM)?
                        .scale(
                            u64::from(catalog.spec(model).cu_milli),
                            u64::from(catalog.spec(reference).cu_milli),
                        )
                        .expect("a price scaled below 1 cannot overflow")
                }
                Err(error) => return Err(error),
            };
            Ok(FleetModel {
                model,
                weight,
                market_price,
            })
        })
        .collect()
}

fn is_nvl72_model(catalog: &GpuCatalog, model: GpuModel) -> bool {
    catalog.spec(model).architecture == "Blackwell"
}

/// Nodes per model on one site: the mix with each weight jittered ×0.5–1.5, apportioned by
/// largest remainder; NVL72 models rounded down to whole racks, the rest given to the first model.
fn site_model_counts(site_nodes: usize, models: &[FleetModel], rng: &mut ChaCha8Rng) -> Vec<usize> {
    let catalog = GpuCatalog::embedded();
    let weights: Vec<u64> = models
        .iter()
        .map(|fleet_model| u64::from(fleet_model.weight) * rng.random_range(50..=150u64))
        .collect();
    let mut counts = apportion(site_nodes, &weights);
    for (index, fleet_model) in models.iter().enumerate() {
        if is_nvl72_model(catalog, fleet_model.model) {
            let excess = counts[index] % NODES_PER_NVL72_DOMAIN;
            counts[index] -= excess;
            counts[0] += excess;
        }
    }
    counts
}

/// Splits `total` in proportion to `weights` (largest remainder, ties to the earlier entry).
fn apportion(total: usize, weights: &[u64]) -> Vec<usize> {
    let weight_sum: u64 = weights.iter().sum();
    assert!(weight_sum > 0, "weights must not all be zero");
    let total_u64 = total as u64;
    let mut counts: Vec<usize> = weights
        .iter()
        .map(|weight| (total_u64 * weight / weight_sum) as usize)
        .collect();
    let mut remainders: Vec<(u64, usize)> = weights
        .iter()
        .enumerate()
        .map(|(index, weight)| (total_u64 * weight % weight_sum, index))
        .collect();
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let short = total - counts.iter().sum::<usize>();
    for &(_, index) in remainders.iter().take(short) {
        counts[index] += 1;
    }
    counts
}

fn chance_permille(rng: &mut ChaCha8Rng, permille: u32) -> bool {
    rng.random_range(0..1000u32) < permille
}

fn provider_profile(id: ProviderId, rng: &mut ChaCha8Rng) -> ProviderProfile {
    let ask_factor_permille = rng.random_range(ASK_FACTOR_PERMILLE);
    let peak_priced = chance_permille(rng, PEAK_PRICED_PROVIDERS_PERMILLE);
    // u² skews toward reliable providers: the median is about 0.90.
    let unit: f64 = rng.random();
    let span = f64::from(RELIABILITY_PPM_MAX - RELIABILITY_PPM_MIN);
    let reliability_ppm = RELIABILITY_PPM_MAX - (span * unit * unit).round() as u32;
    let allowed_tiers = if chance_permille(rng, NO_BRONZE_PROVIDERS_PERMILLE) {
        TierSet::of(&[Tier::Gold, Tier::Silver])
    } else {
        TierSet::ALL
    };
    let allowed_classes = if chance_permille(rng, NO_TRAINING_PROVIDERS_PERMILLE) {
        ClassSet::of(&[WorkloadClass::Inference, WorkloadClass::Batch, WorkloadClass::Eval])
    } else {
        ClassSet::ALL
    };
    let windows = if chance_permille(rng, WINDOWED_PROVIDERS_PERMILLE) {
        match rng.random_range(0..10u32) {
            // Evenings and nights, 18:00–08:00 every day.
            0..=4 => vec![daily_window(18, 24), daily_window(0, 8)],
            // Nights only, 22:00–06:00.
            5..=6 => vec![daily_window(22, 24), daily_window(0, 6)],
            // Weekends, Saturday 00:00 to Monday 00:00.
            _ => vec![AvailabilityWindow::Weekly {
                days: 0b110_0000,
                start_minute: 0,
                end_minute: 24 * 60,
            }],
        }
    } else {
        Vec::new()
    };
    ProviderProfile {
        id,
        ask_factor_permille,
        peak_priced,
        reliability_ppm,
        allowed_tiers,
        allowed_classes,
        windows,
    }
}

fn build_node(
    id: NodeId,
    name: String,
    path: model::TopologyPath,
    fleet_model: &FleetModel,
    profile: &ProviderProfile,
    datasets: &[Dataset],
    rng: &mut ChaCha8Rng,
) -> Node {
    let silver = fleet_model
        .market_price
        .scale(u64::from(profile.ask_factor_permille), 1000)
        .expect("market prices are far below overflow");
    let gold = silver.scale(GOLD_ASK_PERMILLE, 1000).expect("no overflow");
    let bronze = silver.scale(BRONZE_ASK_PERMILLE, 1000).expect("no overflow");
    let price_rules = if profile.peak_priced {
        vec![PriceRule {
            days: 0b001_1111,
            start_minute: 9 * 60,
            end_minute: 17 * 60,
            multiplier_permille: PEAK_MULTIPLIER_PERMILLE,
        }]
    } else {
        Vec::new()
    };
    let policy = ProviderPolicy {
        asks: [Some(gold), Some(silver), Some(bronze)],
        price_rules,
        windows: profile.windows.clone(),
        allowed_tiers: profile.allowed_tiers,
        allowed_classes: profile.allowed_classes,
        thermal_limit_c: None,
        power_limit_w: None,
    };
    const CPU_MILLI: [u32; 3] = [128_000, 192_000, 256_000];
    const MEMORY_GIB: [u64; 3] = [1024, 1536, 2048];
    const NETWORK_MBIT_S: [u32; 4] = [10_000, 25_000, 50_000, 100_000];
    let cpu_milli = CPU_MILLI[rng.random_range(0..CPU_MILLI.len())];
    let memory_mib = MEMORY_GIB[rng.random_range(0..MEMORY_GIB.len())] * 1024;
    let network_mbit_s = NETWORK_MBIT_S[rng.random_range(0..NETWORK_MBIT_S.len())];
    let dataset_count = rng.random_range(0..=3usize);
    let mut held: Vec<u64> = (0..dataset_count)
        .map(|_| datasets[rng.random_range(0..datasets.len())].content_hash)
        .collect();
    held.sort_unstable();
    held.dedup();
    Node {
        id,
        name,
        provider: profile.id,
        path,
        gpu_model: fleet_model.model,
        gpu_count: GPUS_PER_NODE as u8,
        cpu_milli,
        memory_mib,
        network_mbit_s,
        datasets: held,
        reliability_ppm: profile.reliability_ppm,
        policy,
        simulated: false,
        runtimes: model::RuntimeSet::ALL,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn build(gpus: u64, seed: u64) -> Fleet {
        fleet(&FleetSpec {
            gpus,
            seed,
            prices: crate::sample_prices(),
        })
        .unwrap()
    }

    #[test]
    fn same_seed_same_fleet() {
        assert_eq!(build(8_000, 7), build(8_000, 7));
        assert_ne!(build(8_000, 7).nodes, build(8_000, 8).nodes);
    }

    #[test]
    fn refuses_tiny_fleets_and_missing_prices() {
        let error = fleet(&FleetSpec {
            gpus: 100,
            seed: 1,
            prices: crate::sample_prices(),
        })
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "a fleet needs at least 160 GPUs (8 per node, one node per site), not 100"
        );
        let mut prices = crate::sample_prices();
        prices.remove("H200-SXM");
        let error = fleet(&FleetSpec {
            gpus: 8_000,
            seed: 1,
            prices,
        })
        .unwrap_err();
        assert!(
            matches!(error, FleetError::MissingPrice { ref model, .. } if model == "H200-SXM"),
            "{error}"
        );
    }

    #[test]
    fn l40_is_priced_by_compute_units_from_the_a100_pcie() {
        let fleet = build(8_000, 1);
        let catalog = GpuCatalog::embedded();
        let l40 = fleet.market_price(catalog.find("L40").unwrap()).unwrap();
        // $1.64 × 183 / 315 CU-milli = $0.952761.
        assert_eq!(l40, Micros(952_761));
    }

    #[test]
    fn shape_of_a_large_fleet() {
        let fleet = build(400_000, 3);
        let catalog = GpuCatalog::embedded();
        assert_eq!(fleet.nodes.len(), 50_000);
        assert_eq!(fleet.gpu_count(), 400_000);
        assert_eq!(fleet.topology.regions.len(), 5);
        assert_eq!(fleet.topology.sites.len(), 20);
        assert_eq!(fleet.topology.fabrics.len(), 20, "one fabric per site");

        let mut sites_seen = BTreeSet::new();
        let mut previous_site = None;
        let mut gpus_per_model: BTreeMap<GpuModel, u64> = BTreeMap::new();
        let mut domain_nodes: BTreeMap<NvlinkDomainId, Vec<&Node>> = BTreeMap::new();
        let mut provider_nodes: BTreeMap<ProviderId, usize> = BTreeMap::new();
        let (mut windowed, mut no_bronze, mut no_training, mut peak) = (0usize, 0usize, 0usize, 0usize);
        for (index, node) in fleet.nodes.iter().enumerate() {
            assert_eq!(node.id, NodeId(index as u32));
            assert_eq!(
                fleet.topology.path(node.path.nvlink),
                node.path,
                "the path follows the parents"
            );
            if previous_site != Some(node.path.site) {
                assert!(sites_seen.insert(node.path.site), "a site's nodes are contiguous");
                previous_site = Some(node.path.site);
            }
            *gpus_per_model.entry(node.gpu_model).or_default() += u64::from(node.gpu_count);
            domain_nodes.entry(node.path.nvlink).or_default().push(node);
            *provider_nodes.entry(node.provider).or_default() += 1;

            let market = fleet.market_price(node.gpu_model).unwrap();
            let silver = node.policy.asks[Tier::Silver as usize].unwrap();
            assert!(silver >= market.scale(750, 1000).unwrap() && silver <= market.scale(1250, 1000).unwrap());
            assert_eq!(node.policy.asks[Tier::Gold as usize], silver.scale(1200, 1000));
            assert_eq!(node.policy.asks[Tier::Bronze as usize], silver.scale(600, 1000));
            assert!((600_000..=999_000).contains(&node.reliability_ppm));
            assert!(node.cpu_milli >= 128_000);
            assert!((1024 * 1024..=2048 * 1024).contains(&node.memory_mib));
            assert!((10_000..=100_000).contains(&node.network_mbit_s));
            assert!(node.datasets.len() <= 3 && node.datasets.is_sorted());
            windowed += usize::from(!node.policy.windows.is_empty());
            no_bronze += usize::from(!node.policy.allowed_tiers.contains(Tier::Bronze));
            no_training += usize::from(!node.policy.allowed_classes.contains(WorkloadClass::Training));
            peak += usize::from(!node.policy.price_rules.is_empty());
        }
        let share = |count: usize| count as f64 / fleet.nodes.len() as f64;
        assert!((share(windowed) - 0.30).abs() < 0.03, "windowed {}", share(windowed));
        assert!((share(no_bronze) - 0.10).abs() < 0.02, "no bronze {}", share(no_bronze));
        assert!(
            (share(no_training) - 0.05).abs() < 0.015,
            "no training {}",
            share(no_training)
        );
        assert!((share(peak) - 0.25).abs() < 0.03, "peak {}", share(peak));

        for (name, weight) in MODEL_MIX {
            let gpus = gpus_per_model[&catalog.find(name).unwrap()];
            let share = gpus as f64 / 400_000.0;
            assert!((share - f64::from(weight) / 100.0).abs() < 0.02, "{name}: {share}");
        }
        for (domain, members) in &domain_nodes {
            let blackwell = catalog.spec(members[0].gpu_model).architecture == "Blackwell";
            let expected = if blackwell { 9 } else { 1 };
            assert_eq!(members.len(), expected, "{domain}");
            assert_eq!(fleet.topology.nvlink_domains[domain.index()].gpus, 8 * expected as u32);
            assert!(members.iter().all(|node| node.gpu_model == members[0].gpu_model));
        }
        let average_per_provider = fleet.nodes.len() as f64 / provider_nodes.len() as f64;
        assert!((7.5..=8.0).contains(&average_per_provider), "{average_per_provider}");
        // A 16,384-GPU gang fits in every fabric.
        assert!(fleet.nodes.len() / 20 * 8 >= 16_384);
    }

    #[test]
    fn apportion_is_exact() {
        assert_eq!(apportion(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(apportion(7, &[0, 5, 2]), vec![0, 5, 2]);
        assert_eq!(apportion(0, &[3]), vec![0]);
    }
}
