//! Fuzzing the explanation path (issue 17): random small fleets (several regions, sites,
//! fabrics and models, some load, some nodes offline) and random jobs, including what no node
//! has: region ids the topology never gave out, models no node has or the catalog lacks, gangs
//! larger than the fleet, every topology level, price caps, reliability floors, and fields the
//! API would refuse. `explain`, `quote`, `plan` and `plan_preemption` must answer without a
//! panic, and their answers must agree and add up.

mod common;

use std::collections::BTreeMap;

use common::NOW;
use matcher::{Matcher, MatcherConfig, Reason, Unplaced};
use model::{
    ClientLocation, GpuCatalog, GpuDemand, GpuModel, JobId, JobSpec, Micros, Node, NodeId, ProviderId, ProviderPolicy,
    RegionId, Runtime, RuntimeSet, Tier, Topology, TopologyLevel,
};
use proptest::prelude::*;

const MODELS: [&str; 5] = ["H100", "A100", "A10", "T4", "L40"];
const LEVELS: [TopologyLevel; 6] = TopologyLevel::ALL;

/// One node: where it is (region, site in the region, fabric in the site, board in the
/// fabric), what it has and what it asks.
#[derive(Clone, Debug)]
struct NodeSeed {
    region: u8,
    site: u8,
    fabric: u8,
    board: u8,
    model: u8,
    gpus: u8,
    ask_cents: u16,
    reliability_permille: u16,
    offline: bool,
    runtimes: u8,
}

fn node_seed() -> impl Strategy<Value = NodeSeed> {
    (
        (0u8..3, 0u8..2, 0u8..2, 0u8..3),
        (0u8..MODELS.len() as u8, 0u8..4, 10u16..600, 500u16..=1000),
        (prop::bool::weighted(0.15), 1u8..4),
    )
        .prop_map(
            |((region, site, fabric, board), (model, gpus, ask_cents, reliability_permille), (offline, runtimes))| {
                NodeSeed {
                    region,
                    site,
                    fabric,
                    board,
                    model,
                    gpus: [1, 2, 4, 8][gpus as usize],
                    ask_cents,
                    reliability_permille,
                    offline,
                    runtimes,
                }
            },
        )
}

/// Builds the fleet the seeds describe: levels are created as first named, so ids are dense.
fn build(seeds: &[NodeSeed]) -> Matcher {
    let catalog = GpuCatalog::embedded();
    let mut topology = Topology::default();
    let mut regions = BTreeMap::new();
    let mut sites = BTreeMap::new();
    let mut fabrics = BTreeMap::new();
    let mut boards = BTreeMap::new();
    let mut nodes = Vec::with_capacity(seeds.len());
    for (index, seed) in seeds.iter().enumerate() {
        let region = *regions
            .entry(seed.region)
            .or_insert_with(|| topology.add_region(format!("region{}", seed.region)));
        let site_key = (seed.region, seed.site);
        let site = *sites.entry(site_key).or_insert_with(|| {
            topology.add_site(
                format!("site{}-{}", seed.region, seed.site),
                region,
                40.0 + f64::from(seed.region) * 5.0,
                f64::from(seed.site) * 10.0 - 5.0,
            )
        });
        let fabric_key = (seed.region, seed.site, seed.fabric);
        let fabric = *fabrics.entry(fabric_key).or_insert_with(|| {
            topology.add_fabric(format!("fabric{}-{}-{}", seed.region, seed.site, seed.fabric), site)
        });
        // Boards of one fabric are shared by nodes of the same size only.
        let board_key = (seed.region, seed.site, seed.fabric, seed.board, seed.gpus);
        let board = *boards
            .entry(board_key)
            .or_insert_with(|| topology.add_nvlink_domain(fabric, u32::from(seed.gpus) * 2));
        let mut policy = ProviderPolicy::flat(Micros(i64::from(seed.ask_cents) * 10_000));
        // Some nodes do not sell gold.
        if seed.ask_cents % 7 == 0 {
            policy.asks[Tier::Gold as usize] = None;
        }
        nodes.push(Node {
            id: NodeId(index as u32),
            name: format!("node-{index}"),
            provider: ProviderId(index as u32 % 3),
            path: topology.path(board),
            gpu_model: catalog.find(MODELS[seed.model as usize]).expect("model in catalog"),
            gpu_count: seed.gpus,
            cpu_milli: 64_000,
            memory_mib: 512 * 1024,
            network_mbit_s: 10_000,
            datasets: Vec::new(),
            reliability_ppm: u32::from(seed.reliability_permille) * 1000,
            policy,
            simulated: false,
            runtimes: RuntimeSet(seed.runtimes),
        });
    }
    let mut matcher = Matcher::new(topology, nodes, MatcherConfig::default());
    for (index, seed) in seeds.iter().enumerate() {
        if seed.offline {
            matcher.set_node_offline(NodeId(index as u32), true);
        }
    }
    matcher
}

/// A job, often one no node can take, sometimes one the API would refuse outright.
#[derive(Clone, Debug)]
struct JobSeed {
    tier: u8,
    demand: GpuDemand,
    replicas: u32,
    level: u8,
    price_micros: i64,
    reliability_ppm: u32,
    regions: Vec<u16>,
    models: Vec<u16>,
    gpu_memory_gib_min: u32,
    cpu_milli: u32,
    memory_mib: u64,
    max_runtime_s: u32,
    preemptible: bool,
    runtime: Option<u8>,
    client: Option<(i16, i16, u32)>,
}

fn demand() -> impl Strategy<Value = GpuDemand> {
    prop_oneof![
        1 => Just(GpuDemand::None),
        5 => (0u8..=20).prop_map(|count| GpuDemand::Whole { count }),
        2 => prop_oneof![Just(0u16), 1u16..1000, Just(1000u16), Just(u16::MAX)]
            .prop_map(|milli| GpuDemand::Share { milli }),
        2 => prop_oneof![Just(0u32), 1u32..20_000, Just(u32::MAX)]
            .prop_map(|cu_milli| GpuDemand::ComputeUnits { cu_milli }),
    ]
}

fn job_seed() -> impl Strategy<Value = JobSeed> {
    let catalog_models = GpuCatalog::embedded().len() as u16;
    (
        (
            0u8..3,
            demand(),
            prop_oneof![
                6 => 1u32..4,
                3 => 4u32..64,
                1 => prop_oneof![Just(0u32), Just(1 << 20), Just((1 << 20) + 1), Just(u32::MAX)],
            ],
            0u8..LEVELS.len() as u8,
            prop_oneof![Just(0i64), Just(-1i64), 1i64..10_000_000, Just(i64::MAX)],
            prop_oneof![Just(0u32), 0u32..=1_000_000, Just(u32::MAX)],
        ),
        (
            // Ids 0–2 may name a region of the fleet; the rest no region the topology gave out.
            prop::collection::vec(prop_oneof![0u16..6, Just(u16::MAX), any::<u16>()], 0..4),
            prop::collection::vec(
                prop_oneof![0u16..catalog_models, catalog_models..catalog_models + 3, Just(u16::MAX)],
                0..3,
            ),
            prop_oneof![Just(0u32), 0u32..200],
            prop_oneof![Just(0u32), 0u32..100_000, Just(u32::MAX)],
            prop_oneof![Just(0u64), 0u64..1_000_000, Just(u64::MAX)],
        ),
        (
            prop_oneof![Just(0u32), 1u32..200_000, Just(u32::MAX)],
            any::<bool>(),
            prop::option::of(0u8..2),
            prop::option::of((-90i16..=90, -180i16..=180, 0u32..500)),
        ),
    )
        .prop_map(
            |(
                (tier, demand, replicas, level, price_micros, reliability_ppm),
                (regions, models, gpu_memory_gib_min, cpu_milli, memory_mib),
                (max_runtime_s, preemptible, runtime, client),
            )| JobSeed {
                tier,
                demand,
                replicas,
                level,
                price_micros,
                reliability_ppm,
                regions,
                models,
                gpu_memory_gib_min,
                cpu_milli,
                memory_mib,
                max_runtime_s,
                preemptible,
                runtime,
                client,
            },
        )
}

fn spec(id: u64, seed: &JobSeed) -> JobSpec {
    let tier = [Tier::Gold, Tier::Silver, Tier::Bronze][seed.tier as usize];
    let mut job = JobSpec::new(JobId(id), tier, seed.demand, Micros(seed.price_micros));
    job.replicas = seed.replicas;
    job.topology = LEVELS[seed.level as usize];
    job.reliability_min_ppm = seed.reliability_ppm;
    job.regions = seed.regions.iter().map(|region| RegionId(*region)).collect();
    job.resources.gpu_models = seed.models.iter().map(|model| GpuModel(*model)).collect();
    job.resources.gpu_memory_mib_min = seed.gpu_memory_gib_min.saturating_mul(1024);
    job.resources.cpu_milli = seed.cpu_milli;
    job.resources.memory_mib = seed.memory_mib;
    job.max_runtime_s = seed.max_runtime_s;
    job.preemptible = seed.preemptible;
    job.runtime = seed
        .runtime
        .map(|runtime| [Runtime::Container, Runtime::Process][runtime as usize]);
    job.client = seed
        .client
        .map(|(latitude, longitude, latency_target_ms)| ClientLocation {
            latitude: f64::from(latitude),
            longitude: f64::from(longitude),
            latency_target_ms,
        });
    job
}

/// Loads the fleet with a few ordinary jobs, so capacity, tier mixing and sharing are in play.
fn load(m: &mut Matcher, fills: &[(u8, u8)]) {
    for (position, (gpus, tier)) in fills.iter().enumerate() {
        let demand = match gpus {
            0 => GpuDemand::Share { milli: 300 },
            count => GpuDemand::Whole { count: *count },
        };
        let tier = [Tier::Gold, Tier::Silver, Tier::Bronze][*tier as usize % 3];
        let job = JobSpec::new(JobId(1_000 + position as u64), tier, demand, Micros(100_000_000));
        let _ = m.place(&job, NOW);
    }
}

/// The names a tenant gave each of the job's regions: the fleet's own for a region it has,
/// a name of the tenant's for one it does not.
fn names(m: &Matcher, job: &JobSpec) -> Vec<String> {
    job.regions
        .iter()
        .map(|region| match m.topology().regions.get(region.index()) {
            Some(known) => known.name.clone(),
            None => format!("nowhere-{}", region.0),
        })
        .collect()
}

fn check(m: &Matcher, job: &JobSpec) -> Result<(), TestCaseError> {
    let nodes_total = m.nodes().len() as u64;
    let planned = m.plan(job, NOW);
    // The reconcile loop tries preemption for gold and silver work that does not place.
    if let Ok(preemption) = m.plan_preemption(job, NOW) {
        prop_assert_eq!(preemption.placement.leases.len() as u64, u64::from(job.replicas));
    }
    let region_names = names(m, job);
    let explanation = m.explain_naming(job, NOW, &region_names);
    let unnamed = m.explain(job, NOW);
    let quote = m.quote_naming(job, NOW, &region_names);
    prop_assert_eq!(explanation.job, job.id);
    prop_assert_eq!(explanation.nodes_total, nodes_total);
    prop_assert_eq!(
        unnamed.nodes_feasible,
        explanation.nodes_feasible,
        "names change words only"
    );
    prop_assert_eq!(&unnamed.excluded, &explanation.excluded, "names change words only");
    let message = &explanation.message;
    for words in ["region-", "no any", "any domain", "(a region no node is in)"] {
        prop_assert!(!message.contains(words), "{:?} in {:?}", words, message);
    }
    prop_assert!(!unnamed.message.contains("region-"), "{}", unnamed.message);
    if let Err(Unplaced::InvalidJob { reason, .. }) = &planned {
        prop_assert_eq!(explanation.nodes_feasible, 0);
        prop_assert!(message.contains(reason.as_str()), "{message:?} says {reason:?}");
        prop_assert!(quote.price_per_gpu_hour.is_none());
        return Ok(());
    }
    // Every node is counted once: as feasible or under the first constraint it fails.
    let excluded: u64 = explanation.excluded.iter().map(|(_, count)| count).sum();
    prop_assert_eq!(explanation.nodes_feasible + excluded, nodes_total, "{}", message);
    prop_assert!(explanation.excluded.iter().all(|(_, count)| *count > 0));
    prop_assert!(
        message.starts_with(&format!(
            "{} of {} nodes",
            matcher::thousands(explanation.nodes_feasible),
            matcher::thousands(nodes_total)
        )),
        "{}",
        message
    );
    // Regions: with only regions no node is in, every node that is up is outside them, and
    // the words name them as the job did.
    let known = |region: &RegionId| region.index() < m.topology().regions.len();
    if !job.regions.is_empty() && !job.regions.iter().any(known) {
        prop_assert_eq!(explanation.nodes_feasible, 0);
        let offline = explanation
            .excluded
            .iter()
            .filter(|(reason, _)| matches!(reason, Reason::Offline | Reason::OverLimit))
            .map(|(_, count)| count)
            .sum::<u64>();
        let outside = explanation
            .excluded
            .iter()
            .find(|(reason, _)| *reason == Reason::Region)
            .map_or(0, |(_, count)| *count);
        prop_assert_eq!(outside + offline, nodes_total, "{}", message);
        if outside > 0 {
            for name in &region_names {
                prop_assert!(message.contains(name.as_str()), "{message:?} names {name}");
            }
            prop_assert!(unnamed.message.contains("asked for"), "{}", unnamed.message);
        }
    }
    // The placement and the explanation agree.
    match &planned {
        Ok(placement) => {
            prop_assert_eq!(placement.leases.len() as u64, u64::from(job.replicas));
            prop_assert!(explanation.nodes_feasible >= 1, "placed, yet {}", message);
            prop_assert!(quote.price_per_gpu_hour.is_some() && quote.explanation.is_none());
            if job.replicas > 1 {
                prop_assert!(explanation.best_domain_replicas >= Some(job.replicas), "{}", message);
            }
        }
        Err(unplaced) => {
            prop_assert!(quote.price_per_gpu_hour.is_none());
            prop_assert_eq!(quote.explanation.as_ref(), Some(&explanation));
            let said = unplaced.to_string();
            prop_assert!(!said.contains("job-") && !said.contains("no any"), "{}", said);
            match unplaced {
                Unplaced::NoFeasibleNode(_) if job.replicas == 1 => {
                    prop_assert_eq!(explanation.nodes_feasible, 0, "unplaced, yet {}", message);
                }
                Unplaced::NoDomainFits { best, .. } => {
                    prop_assert!(*best < job.replicas);
                    prop_assert!(explanation.best_domain_replicas < Some(job.replicas), "{}", message);
                }
                _ => {}
            }
        }
    }
    prop_assert_eq!(quote.nodes_feasible, explanation.nodes_feasible);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn explaining_quoting_and_planning_never_panic(
        seeds in prop::collection::vec(node_seed(), 1..14),
        fills in prop::collection::vec((0u8..9, 0u8..3), 0..10),
        jobs in prop::collection::vec(job_seed(), 1..8),
    ) {
        let mut m = build(&seeds);
        load(&mut m, &fills);
        for (index, seed) in jobs.iter().enumerate() {
            check(&m, &spec(index as u64 + 1, seed))?;
        }
    }
}

/// The case of issue 17 itself: a region no node is in, named as the job named it.
#[test]
fn a_region_no_node_is_in_is_explained_by_its_name() {
    let m = common::matcher(vec![
        common::node("us-east", "H100", 8, "2.00", 0.99),
        common::node("us-east", "H100", 8, "2.00", 0.99),
    ]);
    let mut job = common::job(5, Tier::Silver, common::whole(1), "5");
    job.regions = vec![RegionId(u16::MAX)];
    assert_eq!(
        m.explain_naming(&job, NOW, &["eu-west"]).message,
        "0 of 2 nodes: 2 outside region eu-west; no node is in eu-west (nodes are in us-east)"
    );
    assert_eq!(
        m.explain(&job, NOW).message,
        "0 of 2 nodes: 2 outside the region asked for; no node is in it (nodes are in us-east)"
    );
    job.regions = vec![common::region(&m, "us-east"), RegionId(u16::MAX)];
    job.resources.gpu_models = vec![GpuCatalog::embedded().find("B200").unwrap()];
    assert_eq!(
        m.explain_naming(&job, NOW, &["us-east", "eu-west"]).message,
        "0 of 2 nodes: 2 not B200"
    );
    assert_eq!(
        m.plan(&job, NOW).unwrap_err().to_string(),
        "no node can take it now; 'fallow job show 5' says why"
    );
    let quote = m.quote_naming(&job, NOW, &["us-east", "eu-west"]);
    assert_eq!(quote.price_per_gpu_hour, None);
    assert_eq!(quote.explanation.unwrap().message, "0 of 2 nodes: 2 not B200");
}

/// A gang under "any" is held by no domain in particular: the words say so.
#[test]
fn a_gang_anywhere_that_does_not_fit_reads_naturally() {
    let m = common::matcher(vec![
        common::node("eu", "H100", 8, "2.00", 0.99),
        common::node("eu", "H100", 8, "2.00", 0.99),
    ]);
    let job = common::gang(6, Tier::Silver, 8, 8, TopologyLevel::Any);
    assert_eq!(
        m.explain(&job, NOW).message,
        "2 of 2 nodes; no set of nodes holds all 8 replicas (the best holds 2)"
    );
    assert_eq!(
        m.plan(&job, NOW).unwrap_err().to_string(),
        "no set of nodes can hold all 8 replicas now (the best holds 2)"
    );
    let job = common::gang(7, Tier::Silver, 3, 8, TopologyLevel::Nvlink);
    assert_eq!(
        m.plan(&job, NOW).unwrap_err().to_string(),
        "no NVLink domain can hold all 3 replicas now (the best holds 1)"
    );
}
