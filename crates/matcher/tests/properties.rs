//! Property tests of the matcher's invariants over random fleets and random streams of
//! arrivals, departures, preemptions and node failures.

mod common;

use common::*;
use matcher::Matcher;
use model::{GpuDemand, JobId, JobSpec, Tier, TopologyLevel};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Arrive {
        tier: u8,
        gpu: u8,
        replicas: u8,
        level: u8,
        price_cents: u16,
    },
    Depart {
        pick: u16,
    },
    Preempt {
        gpus: u8,
        replicas: u8,
        fabric: bool,
    },
    Fail {
        node: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0u8..12, 1u8..4, 0u8..4, 50u16..600).prop_map(|(tier, gpu, replicas, level, price_cents)| Op::Arrive { tier, gpu, replicas, level, price_cents }),
        3 => any::<u16>().prop_map(|pick| Op::Depart { pick }),
        1 => (1u8..9, 1u8..4, any::<bool>()).prop_map(|(gpus, replicas, fabric)| Op::Preempt { gpus, replicas, fabric }),
        1 => any::<u16>().prop_map(|node| Op::Fail { node }),
    ]
}

fn fleet_specs(seed: &[(u8, u8, u8)]) -> Vec<NodeSpec> {
    const MODELS: [&str; 4] = ["H100", "A100", "A10", "B200"];
    const ASKS: [&str; 6] = ["0.50", "1.00", "1.50", "2.00", "2.50", "3.00"];
    seed.iter()
        .enumerate()
        .map(|(index, (model, gpus, ask))| {
            let gpus = [1u8, 2, 4, 8][(*gpus % 4) as usize];
            node(
                if index % 3 == 0 { "us" } else { "eu" },
                MODELS[(*model % 4) as usize],
                gpus,
                ASKS[(*ask % 6) as usize],
                0.6 + 0.05 * f64::from(*ask % 8),
            )
            .fabric((index % 2) as u32)
        })
        .collect()
}

/// A fleet whose tier asks are not proportional: gold 1.0–1.45× the silver ask, bronze
/// 0.35–0.8×, varying by node, so the search's per-tier bounds are exercised.
fn market(seed: &[(u8, u8, u8)]) -> Matcher {
    let (topology, mut nodes) = fleet(fleet_specs(seed));
    for (index, node) in nodes.iter_mut().enumerate() {
        let silver = node.policy.asks[1].expect("flat policy");
        node.policy.asks[0] = silver.scale(1000 + 50 * (index as u64 % 10), 1000);
        node.policy.asks[2] = silver.scale(350 + 50 * (index as u64 * 7 % 10), 1000);
    }
    Matcher::new(topology, nodes, Default::default())
}

fn arrival(id: u64, tier: u8, gpu: u8, replicas: u8, level: u8, price_cents: u16) -> JobSpec {
    let tier = [Tier::Gold, Tier::Silver, Tier::Bronze][tier as usize];
    let demand = match gpu {
        0..=3 => GpuDemand::Share {
            milli: 150 + 200 * u16::from(gpu),
        },
        4..=9 => GpuDemand::Whole {
            count: [1u8, 1, 2, 4, 8, 1][(gpu - 4) as usize],
        },
        _ => GpuDemand::ComputeUnits { cu_milli: 1500 },
    };
    let mut spec = job(
        id,
        tier,
        demand,
        &format!("{}.{:02}", price_cents / 100, price_cents % 100),
    );
    spec.replicas = if matches!(demand, GpuDemand::Share { .. }) {
        1
    } else {
        u32::from(replicas)
    };
    spec.topology = [
        TopologyLevel::Any,
        TopologyLevel::Fabric,
        TopologyLevel::Node,
        TopologyLevel::Region,
    ][level as usize];
    spec.resources.cpu_milli = 8_000;
    spec.resources.memory_mib = 64 * 1024;
    spec.max_runtime_s = 3600;
    spec
}

/// Applies the ops; checks every invariant after each step; returns a trace of decisions.
fn run(m: &mut Matcher, ops: &[Op]) -> Result<Vec<String>, TestCaseError> {
    let mut trace = Vec::new();
    let mut running: Vec<(JobId, Tier)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let id = step as u64 + 1;
        match *op {
            Op::Arrive {
                tier,
                gpu,
                replicas,
                level,
                price_cents,
            } => {
                let spec = arrival(id, tier, gpu, replicas, level, price_cents);
                if spec.replicas == 1 {
                    prop_assert_eq!(
                        m.plan(&spec, NOW).ok(),
                        m.plan_by_scan(&spec, NOW),
                        "the indexed search is exact"
                    );
                }
                match m.place(&spec, NOW) {
                    Ok(placement) => {
                        prop_assert_eq!(placement.leases.len() as u32, spec.replicas, "gang all-or-nothing");
                        for lease in &placement.leases {
                            let node = &m.nodes()[lease.node.index()];
                            let ask = node.policy.ask_at(spec.tier, NOW).expect("a winner sells the tier");
                            prop_assert!(
                                lease.price >= ask && lease.price <= spec.max_price,
                                "price {} outside [{}, {}]",
                                lease.price,
                                ask,
                                spec.max_price
                            );
                        }
                        if spec.replicas > 1 && spec.topology == TopologyLevel::Fabric {
                            let fabrics: std::collections::BTreeSet<_> = placement
                                .leases
                                .iter()
                                .map(|lease| m.nodes()[lease.node.index()].path.fabric)
                                .collect();
                            prop_assert_eq!(fabrics.len(), 1);
                        }
                        trace.push(format!(
                            "{id}: {:?}",
                            placement
                                .leases
                                .iter()
                                .map(|lease| (lease.node, lease.gpu_mask, lease.price))
                                .collect::<Vec<_>>()
                        ));
                        running.push((spec.id, spec.tier));
                    }
                    Err(unplaced) => {
                        prop_assert!(m.job_leases(spec.id).is_empty(), "a refused job holds nothing");
                        trace.push(format!("{id}: {unplaced}"));
                    }
                }
            }
            Op::Depart { pick } => {
                if !running.is_empty() {
                    let (job, _) = running.remove(pick as usize % running.len());
                    m.release_job(job, NOW);
                }
            }
            Op::Preempt { gpus, replicas, fabric } => {
                let mut spec = job(id, Tier::Gold, GpuDemand::Whole { count: gpus }, "100");
                spec.replicas = u32::from(replicas);
                if fabric {
                    spec.topology = TopologyLevel::Fabric;
                }
                let planned = m.plan_preemption(&spec, NOW);
                prop_assert_eq!(
                    &planned,
                    &m.plan_preemption_by_scan(&spec, NOW),
                    "fabric by fabric = one scan"
                );
                if let Ok(plan) = planned {
                    let fabric_of = |node: model::NodeId| m.nodes()[node.index()].path.fabric;
                    for victim in &plan.victims {
                        prop_assert_eq!(victim.tier, Tier::Bronze, "gold and silver are never victims");
                        // Every victim is on a node a replica of the plan then takes.
                        prop_assert!(
                            plan.placement.leases.iter().any(|lease| lease.node == victim.node),
                            "victim {:?} is off the plan",
                            victim
                        );
                        if fabric {
                            prop_assert_eq!(fabric_of(victim.node), fabric_of(plan.placement.leases[0].node));
                        }
                        let recorded = running
                            .iter()
                            .find(|(job, _)| *job == victim.job)
                            .map(|(_, tier)| *tier);
                        prop_assert_eq!(recorded, Some(Tier::Bronze));
                    }
                    m.commit_preemption(&plan)
                        .map_err(|error| TestCaseError::fail(error.to_string()))?;
                    running.retain(|(job, _)| !m.job_leases(*job).is_empty());
                    running.push((spec.id, Tier::Gold));
                    trace.push(format!("{id}: preempted {}", plan.victims.len()));
                }
            }
            Op::Fail { node } => {
                let node = model::NodeId(u32::from(node) % m.nodes().len() as u32);
                let offline = !m.nodes().is_empty() && m.lease(model::LeaseId(0)).is_none() && step % 2 == 0;
                m.set_node_offline(node, offline);
                running.retain(|(job, _)| !m.job_leases(*job).is_empty());
            }
        }
        m.consistency_check().map_err(TestCaseError::fail)?;
        prop_assert!(m.gpu_milli_used() <= m.gpu_milli_total());
    }
    Ok(trace)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn invariants_hold_and_the_same_input_gives_the_same_plan(
        nodes in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..24),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut first = market(&nodes);
        let trace = run(&mut first, &ops)?;
        let mut second = market(&nodes);
        let again = run(&mut second, &ops)?;
        prop_assert_eq!(trace, again);
    }
}

/// Reliability floors the single-replica test draws from: under, on and between the steps of
/// the matcher's static filters.
const FLOORS_PPM: [u32; 6] = [0, 700_000, 800_000, 850_000, 900_000, 970_000];

/// A fleet of several bitmap words, with asks on a fine grid (so each range's ask steps split
/// it) and reliabilities across 0.6–1.0.
fn wide_market(seed: &[(u8, u8, u8, u8)]) -> Matcher {
    const MODELS: [&str; 3] = ["H100", "A100", "A10"];
    const ASKS: [&str; 16] = [
        "0.40", "0.55", "0.70", "0.85", "1.00", "1.10", "1.20", "1.35", "1.50", "1.70", "1.90", "2.10", "2.40", "2.70",
        "3.00", "3.50",
    ];
    let specs = seed
        .iter()
        .enumerate()
        .map(|(index, (model, gpus, ask, reliability))| {
            node(
                ["us", "eu", "ap"][index % 3],
                MODELS[(*model % 3) as usize],
                [1u8, 2, 4, 8][(*gpus % 4) as usize],
                ASKS[(*ask % 16) as usize],
                0.6 + 0.4 * f64::from(*reliability) / 256.0,
            )
            .fabric((index % 2) as u32)
        })
        .collect();
    let (topology, nodes) = fleet(specs);
    Matcher::new(topology, nodes, Default::default())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// One-replica jobs with price caps and reliability floors on fleets of 64–300 nodes, as
    /// the fleet fills and empties: the indexed search (with its static filters and key
    /// cut-offs) makes exactly the plan a scan of every node makes: winner, runner-up and price.
    #[test]
    fn single_replica_plans_match_a_full_scan(
        nodes in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()), 64..300),
        arrivals in prop::collection::vec((0u8..3, 0u8..10, 30u16..500, 0usize..FLOORS_PPM.len(), any::<bool>()), 1..150),
    ) {
        let mut m = wide_market(&nodes);
        let mut running: Vec<JobId> = Vec::new();
        for (step, (tier, gpu, price_cents, floor, depart)) in arrivals.into_iter().enumerate() {
            let mut spec = arrival(step as u64 + 1, tier, gpu, 1, 0, price_cents);
            spec.reliability_min_ppm = FLOORS_PPM[floor];
            let planned = m.plan(&spec, NOW).ok();
            prop_assert_eq!(&planned, &m.plan_by_scan(&spec, NOW), "the indexed search is exact");
            if planned.is_some() {
                m.place(&spec, NOW).map_err(|error| TestCaseError::fail(error.to_string()))?;
                running.push(spec.id);
            }
            if depart && running.len() > 1 {
                m.release_job(running.remove(0), NOW);
            }
        }
        m.consistency_check().map_err(TestCaseError::fail)?;
    }
}

/// Runtimes the window test draws from: under the shortest open-time class, on classes, between
/// them and over the longest.
const RUNTIMES_S: [u32; 11] = [
    600,
    1800,
    3600,
    5000,
    4 * 3600,
    7 * 3600,
    13 * 3600,
    20 * 3600,
    30 * 3600,
    50 * 3600,
    72 * 3600,
];

/// A wide market where nodes sell random tiers (some only bronze, as hobbyists do) and open in
/// random daily windows (some always, some over midnight in two pieces, some for hours).
fn windowed_market(seed: &[(u8, u8, u8, u8)], windows: &[(u8, u8, u8)]) -> Matcher {
    let base = wide_market(seed);
    let mut nodes = base.nodes().to_vec();
    for (node, &(tiers, start_hour, hours)) in nodes.iter_mut().zip(windows.iter().cycle()) {
        node.policy.allowed_tiers = model::TierSet(match tiers % 5 {
            0 => 0b100,
            1 => 0b110,
            _ => 0b111,
        });
        let start = u32::from(start_hour % 24);
        let end = start + 1 + u32::from(hours % 30);
        node.policy.windows = match hours % 4 {
            0 => Vec::new(),
            _ if end > 24 => vec![model::daily_window(start, 24), model::daily_window(0, end - 24)],
            _ => vec![model::daily_window(start, end)],
        };
    }
    Matcher::new(base.topology().clone(), nodes, Default::default())
}

/// Whether a node may take a job at `now` by its policy alone: it sells the tier, and its window
/// is open now and, for work that cannot be interrupted, for the whole runtime.
fn policy_allows(m: &Matcher, node: model::NodeId, spec: &JobSpec, now: i64) -> bool {
    let policy = &m.nodes()[node.index()].policy;
    let open = match policy.available_until(now) {
        None => false,
        Some(_) if spec.interruptible() => true,
        Some(end) => end >= now + i64::from(spec.max_runtime_s),
    };
    policy.allowed_tiers.contains(spec.tier) && policy.asks[spec.tier as usize].is_some() && open
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// The index's tier and open-time filters as the clock moves (by `advance_clock`, or by
    /// `advance_clock_for` told only the nodes whose window changed): the indexed search makes
    /// exactly the plan a scan of every node makes, never proposes a node that does not sell the
    /// job's tier or whose window does not cover firm work's runtime, and the consistency
    /// check (which recomputes every node's open-time class) holds.
    #[test]
    fn windowed_and_tiered_plans_match_a_full_scan(
        nodes in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()), 64..300),
        windows in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..40),
        arrivals in prop::collection::vec(
            (0u8..3, 0u8..10, 30u16..500, 0usize..RUNTIMES_S.len(), 0u16..900, any::<bool>(), any::<bool>()),
            1..120,
        ),
    ) {
        let mut m = windowed_market(&nodes, &windows);
        let mut now = NOW;
        m.advance_clock(now);
        let mut running: Vec<JobId> = Vec::new();
        for (step, (tier, gpu, price_cents, runtime, minutes, told, depart)) in arrivals.into_iter().enumerate() {
            if minutes > 0 {
                let later = now + 60 * i64::from(minutes);
                if told {
                    // Only the nodes whose window opened, closed or moved its end since.
                    let minute_start = |at: i64| at.div_euclid(60) * 60;
                    let changed: Vec<u32> = m
                        .nodes()
                        .iter()
                        .filter(|node| {
                            node.policy.available_until(minute_start(now)) != node.policy.available_until(minute_start(later))
                        })
                        .map(|node| node.id.0)
                        .collect();
                    m.advance_clock_for(later, &changed);
                } else {
                    m.advance_clock(later);
                }
                now = later;
                m.consistency_check().map_err(TestCaseError::fail)?;
            }
            let mut spec = arrival(step as u64 + 1, tier, gpu, 1, 0, price_cents);
            spec.max_runtime_s = RUNTIMES_S[runtime];
            let planned = m.plan(&spec, now).ok();
            prop_assert_eq!(&planned, &m.plan_by_scan(&spec, now), "the indexed search is exact");
            if let Some(placement) = &planned {
                for lease in &placement.leases {
                    prop_assert!(policy_allows(&m, lease.node, &spec, now), "{} cannot take {:?}", lease.node, spec);
                }
                m.place(&spec, now).map_err(|error| TestCaseError::fail(error.to_string()))?;
                running.push(spec.id);
            }
            if depart && running.len() > 1 {
                m.release_job(running.remove(0), now);
            }
        }
        m.consistency_check().map_err(TestCaseError::fail)?;
    }
}
