//! Unit tests of the matcher's decisions, one feature each, written as small scenarios.

mod common;

use common::*;
use matcher::{Matcher, MatcherConfig, Reason, Unplaced};
use model::{
    AvailabilityWindow, ClassSet, GpuCatalog, GpuDemand, Micros, NodeId, PriceRule, Tier, TierSet, TopologyLevel,
    WorkloadClass,
};

#[test]
fn cheapest_effective_ask_wins_and_pays_the_next_price() {
    let mut m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "1.80", 0.70), // cheaper ask, but 1.80/0.49 = 3.67 per CU
        node("eu", "H100", 8, "2.20", 0.99),
    ]);
    let placement = m.place(&job(1, Tier::Silver, whole(8), "5"), NOW).unwrap();
    assert_eq!(placement.leases[0].node, NodeId(0));
    // The best loser is node 2 (2.20 / 0.9801); converted to node 0's terms that is 2.20 × (0.99²/0.99²).
    assert_eq!(placement.leases[0].price, Micros(2_200_000));
    m.consistency_check().unwrap();
}

#[test]
fn price_is_capped_by_max_price_and_never_below_the_ask() {
    // The loser's ask 1.50 at reliability 0.70 is 3.06 per delivered CU: 3.00 in the winner's terms.
    let m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "1.50", 0.70),
    ]);
    let placement = m.plan(&job(1, Tier::Silver, whole(1), "2.50"), NOW).unwrap();
    assert_eq!(placement.leases[0].node, NodeId(0));
    assert_eq!(placement.leases[0].price, Micros(2_500_000), "capped at the max price");
    let placement = m.plan(&job(1, Tier::Silver, whole(1), "9"), NOW).unwrap();
    assert_eq!(placement.leases[0].price, Micros(3_000_306)); // 1.50 × 0.99² / 0.70²
    let alone = matcher(vec![node("eu", "H100", 8, "2.00", 0.99)]);
    let placement = alone.plan(&job(1, Tier::Silver, whole(1), "9"), NOW).unwrap();
    assert_eq!(placement.leases[0].price, Micros(2_000_000), "no loser: pay as bid");
    assert_eq!(placement.clearing_price_per_cu_hour, None);
}

#[test]
fn compute_units_substitute_models() {
    // 2 H100-equivalents: one B200 (2.274 CU) or two H100s.
    let m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "B200", 8, "3.00", 0.99),
    ]);
    let mut spec = job(1, Tier::Silver, GpuDemand::ComputeUnits { cu_milli: 2000 }, "9");
    let placement = m.plan(&spec, NOW).unwrap();
    // B200: 3.00 / 2.274 CU is cheaper per CU than H100 at 2.00 / 1.0.
    assert_eq!(placement.leases[0].node, NodeId(1));
    assert_eq!(placement.leases[0].gpu_count(), 1);
    spec.resources.gpu_models = vec![GpuCatalog::embedded().find("H100").unwrap()];
    let placement = m.plan(&spec, NOW).unwrap();
    assert_eq!(
        (placement.leases[0].node, placement.leases[0].gpu_count()),
        (NodeId(0), 2)
    );
}

#[test]
fn gpu_shares_pack_onto_shared_gpus() {
    let mut m = matcher(vec![node("eu", "A10", 2, "0.50", 0.99)]);
    let first = m
        .place(&job(1, Tier::Silver, GpuDemand::Share { milli: 300 }, "5"), NOW)
        .unwrap();
    let second = m
        .place(&job(2, Tier::Silver, GpuDemand::Share { milli: 600 }, "5"), NOW)
        .unwrap();
    assert_eq!(
        first.leases[0].gpu_mask, second.leases[0].gpu_mask,
        "the second share joins the shared GPU"
    );
    let third = m
        .place(&job(3, Tier::Silver, GpuDemand::Share { milli: 200 }, "5"), NOW)
        .unwrap();
    assert_ne!(
        third.leases[0].gpu_mask, first.leases[0].gpu_mask,
        "only 100 milli left there"
    );
    // A whole GPU is still free? No: GPU 1 is now shared, GPU 0 holds 900.
    assert!(m.plan(&job(4, Tier::Silver, whole(1), "5"), NOW).is_err());
    m.consistency_check().unwrap();
}

#[test]
fn whole_gpu_jobs_fill_partly_used_nodes_before_untouched_ones() {
    let mut m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
    ]);
    let first = m.place(&job(1, Tier::Silver, whole(1), "5"), NOW).unwrap();
    let second = m.place(&job(2, Tier::Silver, whole(1), "5"), NOW).unwrap();
    assert_eq!(
        first.leases[0].node, second.leases[0].node,
        "the second job keeps the other node whole"
    );
    let eight = m.place(&job(3, Tier::Silver, whole(8), "5"), NOW).unwrap();
    assert_ne!(eight.leases[0].node, first.leases[0].node);
}

#[test]
fn feasibility_respects_every_constraint() {
    let mut specs = vec![node("eu", "H100", 8, "2.00", 0.99), node("us", "H100", 8, "1.00", 0.99)];
    specs.push(node("eu", "A10", 1, "0.30", 0.60));
    let (topology, mut nodes) = fleet(specs);
    nodes[0].policy.allowed_tiers = TierSet::of(&[Tier::Gold, Tier::Silver]);
    nodes[0].policy.allowed_classes = ClassSet::of(&[WorkloadClass::Inference]);
    let m = matcher::Matcher::new(topology, nodes, Default::default());
    let eu = region(&m, "eu");
    let mut spec = job(1, Tier::Bronze, whole(1), "5");
    spec.regions = vec![eu];
    spec.resources.gpu_memory_mib_min = 40 * 1024;
    let unplaced = m.plan(&spec, NOW).unwrap_err();
    assert_eq!(unplaced, Unplaced::NoFeasibleNode(spec.id));
    let explanation = m.explain(&spec, NOW);
    assert_eq!(
        explanation.excluded,
        vec![(Reason::Region, 1), (Reason::GpuMemory, 1), (Reason::TierNotAllowed, 1)]
    );
    spec.tier = Tier::Silver;
    assert_eq!(m.explain(&spec, NOW).excluded[2], (Reason::ClassNotAllowed, 1));
    spec.class = WorkloadClass::Inference;
    assert!(m.plan(&spec, NOW).is_ok());
    spec.max_price = Micros(1_999_999);
    assert_eq!(m.explain(&spec, NOW).excluded[2], (Reason::Price, 1));
    spec.max_price = Micros::from_dollars(5);
    spec.reliability_min_ppm = 995_000;
    assert_eq!(m.explain(&spec, NOW).excluded[2], (Reason::Reliability, 1));
}

#[test]
fn windows_must_cover_the_runtime_of_work_that_cannot_be_interrupted() {
    let (topology, mut nodes) = fleet(vec![node("eu", "H100", 8, "2.00", 0.99)]);
    nodes[0].policy.windows = vec![AvailabilityWindow::Once {
        start: NOW - 10,
        end: NOW + 3600,
    }];
    let m = matcher::Matcher::new(topology, nodes, Default::default());
    let mut spec = job(1, Tier::Silver, whole(1), "5");
    spec.max_runtime_s = 7200;
    assert_eq!(m.explain(&spec, NOW).excluded, vec![(Reason::Window, 1)]);
    spec.max_runtime_s = 3000;
    assert!(m.plan(&spec, NOW).is_ok());
    let mut bronze = job(2, Tier::Bronze, whole(1), "5");
    bronze.max_runtime_s = 7200;
    assert!(m.plan(&bronze, NOW).is_ok(), "bronze may use any window");
    assert_eq!(
        m.explain(&bronze, NOW + 3600).excluded,
        vec![(Reason::Window, 1)],
        "but not a closed one"
    );
}

#[test]
fn the_clock_takes_closed_nodes_out_of_the_index() {
    let (topology, mut nodes) = fleet(vec![
        node("eu", "H100", 8, "1.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
    ]);
    nodes[0].policy.windows = vec![AvailabilityWindow::Once {
        start: NOW + 600,
        end: NOW + 7200,
    }];
    let mut m = matcher::Matcher::new(topology, nodes, Default::default());
    let first = m.place(&job(1, Tier::Bronze, whole(1), "5"), NOW).unwrap();
    assert_eq!(
        first.leases[0].node,
        NodeId(1),
        "node 0 is closed until its window opens"
    );
    m.consistency_check().unwrap();
    let later = m.place(&job(2, Tier::Bronze, whole(1), "5"), NOW + 600).unwrap();
    assert_eq!(later.leases[0].node, NodeId(0));
    m.advance_clock(NOW + 7200);
    m.consistency_check().unwrap();
    assert_eq!(
        m.plan(&job(3, Tier::Bronze, whole(7), "5"), NOW + 7200).unwrap().leases[0].node,
        NodeId(1)
    );
}

#[test]
fn peak_prices_apply_at_their_hours() {
    let (topology, mut nodes) = fleet(vec![node("eu", "H100", 8, "2.00", 0.99)]);
    nodes[0].policy.price_rules = vec![PriceRule {
        days: 0x7f,
        start_minute: 0,
        end_minute: 1440,
        multiplier_permille: 1500,
    }];
    let m = matcher::Matcher::new(topology, nodes, Default::default());
    assert!(m.plan(&job(1, Tier::Silver, whole(1), "2.50"), NOW).is_err());
    assert_eq!(
        m.plan(&job(1, Tier::Silver, whole(1), "3.00"), NOW).unwrap().leases[0].price,
        Micros(3_000_000)
    );
}

#[test]
fn gangs_are_all_or_nothing_inside_their_level() {
    let specs = (0..6)
        .map(|index| node("eu", "H100", 8, "2.00", 0.99).fabric(index / 3))
        .collect();
    let mut m = matcher(specs);
    // Four 8-GPU replicas in one fabric: each fabric has only three nodes.
    let spec = gang(1, Tier::Silver, 4, 8, TopologyLevel::Fabric);
    assert_eq!(
        m.plan(&spec, NOW).unwrap_err(),
        Unplaced::NoDomainFits {
            job: spec.id,
            level: "fabric",
            replicas: 4,
            best: 3
        }
    );
    let spec = gang(2, Tier::Silver, 3, 8, TopologyLevel::Fabric);
    let placement = m.place(&spec, NOW).unwrap();
    let fabrics: std::collections::BTreeSet<_> = placement
        .leases
        .iter()
        .map(|lease| m.nodes()[lease.node.index()].path.fabric)
        .collect();
    assert_eq!((placement.leases.len(), fabrics.len()), (3, 1));
    // Six 4-GPU replicas fit two per node in the other fabric.
    let placement = m
        .place(&gang(3, Tier::Silver, 6, 4, TopologyLevel::Fabric), NOW)
        .unwrap();
    let nodes: std::collections::BTreeSet<_> = placement.leases.iter().map(|lease| lease.node).collect();
    assert_eq!(nodes.len(), 3);
    m.consistency_check().unwrap();
}

#[test]
fn nvlink_gangs_stay_in_one_domain() {
    let specs = (0..4)
        .map(|index| node("eu", "GB200", 4, "3.00", 0.99).nvlink(index / 2))
        .collect();
    let m = matcher(specs);
    let placement = m.plan(&gang(1, Tier::Gold, 2, 4, TopologyLevel::Nvlink), NOW).unwrap();
    let domains: std::collections::BTreeSet<_> = placement
        .leases
        .iter()
        .map(|lease| m.nodes()[lease.node.index()].path.nvlink)
        .collect();
    assert_eq!(domains.len(), 1);
    assert!(m.plan(&gang(2, Tier::Gold, 3, 4, TopologyLevel::Nvlink), NOW).is_err());
}

#[test]
fn preemption_takes_bronze_that_loses_least_and_never_silver() {
    let mut m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
    ]);
    let mut old_bronze = job(1, Tier::Bronze, whole(8), "5");
    old_bronze.checkpoint_interval_s = 0;
    let old = m.place(&old_bronze, NOW - 3600).unwrap();
    let silver = m.place(&job(2, Tier::Silver, whole(4), "5"), NOW).unwrap();
    assert_ne!(silver.leases[0].node, old.leases[0].node);
    let young = m.place(&job(3, Tier::Bronze, whole(4), "5"), NOW - 60).unwrap();
    assert_eq!(young.leases[0].node, silver.leases[0].node);
    // A gold job of 4 GPUs: evicting the young bronze (4 GPUs × 60 s) loses less than the old one.
    let plan = m.plan_preemption(&job(4, Tier::Gold, whole(4), "5"), NOW).unwrap();
    assert_eq!(plan.victims.len(), 1);
    assert_eq!(plan.victims[0].job, model::JobId(3));
    assert_eq!(plan.victims[0].lost_gpu_seconds, 240);
    assert!(plan.victims.iter().all(|victim| victim.tier == Tier::Bronze));
    // 8 GPUs: only the node holding the old bronze can be emptied.
    let plan = m.plan_preemption(&job(5, Tier::Gold, whole(8), "5"), NOW).unwrap();
    assert_eq!(
        plan.victims.iter().map(|victim| victim.job).collect::<Vec<_>>(),
        vec![model::JobId(1)]
    );
    m.commit_preemption(&plan).unwrap();
    m.consistency_check().unwrap();
    // Nothing left to take without touching silver or gold.
    assert!(m.plan_preemption(&job(6, Tier::Gold, whole(8), "5"), NOW).is_err());
    assert!(m.plan_preemption(&job(7, Tier::Bronze, whole(1), "5"), NOW).is_err());
}

#[test]
fn backfill_uses_gaps_before_a_reservation() {
    let mut m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
    ]);
    let mut running = job(1, Tier::Silver, whole(4), "5");
    running.max_runtime_s = 3600;
    m.place(&running, NOW).unwrap();
    // A gang that needs both nodes whole must wait for job 1: reserve at its expected end.
    let starving = gang(2, Tier::Silver, 2, 8, TopologyLevel::Any);
    assert!(m.plan(&starving, NOW).is_err());
    let reservation = m.reserve(&starving, NOW, NOW).unwrap();
    assert_eq!(reservation.start, NOW + 3600);
    // A short job fits in the gap; a long one would delay the gang; bronze may go, marked.
    let mut short = job(3, Tier::Silver, whole(2), "5");
    short.max_runtime_s = 1800;
    assert!(m.plan(&short, NOW).is_ok());
    let mut long = job(4, Tier::Silver, whole(2), "5");
    long.max_runtime_s = 7200;
    assert_eq!(m.plan(&long, NOW).unwrap_err(), Unplaced::NoFeasibleNode(long.id));
    assert!(m.explain(&long, NOW).excluded.contains(&(Reason::Reserved, 2)));
    let mut bronze = job(5, Tier::Bronze, whole(2), "5");
    bronze.max_runtime_s = 7200;
    let placed = m.place(&bronze, NOW).unwrap();
    assert_eq!(placed.preempt_at, Some(NOW + 3600));
    assert_eq!(m.leases_due_for_preemption(NOW + 3600), vec![placed.leases[0].id]);
}

/// A booking of GPUs ahead: the cheapest free GPUs at its start, priced by the first slot left
/// out; bronze may use them until the start, silver only when it ends first; a job inside the
/// booking runs on its nodes within what it holds; too many GPUs are refused with the count.
#[test]
fn a_booking_ahead_holds_the_cheapest_gpus_free_at_its_start() {
    let mut m = matcher(vec![
        node("eu", "H100", 4, "2.00", 0.99),
        node("eu", "H100", 4, "2.50", 0.99),
        node("eu", "H100", 4, "3.00", 0.99),
        node("eu", "A100", 8, "1.00", 0.99),
    ]);
    let start = NOW + 86_400;
    let mut shape = job(1 << 62, Tier::Gold, whole(1), "3.00");
    shape.replicas = 6;
    shape.max_runtime_s = 8 * 3600;
    shape.resources.gpu_models = vec![m.nodes()[0].gpu_model];
    let booking = m.book(&shape, NOW, start).expect("six H100s are free then");
    assert_eq!(booking.reservation.start, start);
    assert_eq!(booking.reservation.nodes, vec![(0, 4), (1, 2)]);
    // The first slot left out is the 2.50 node's third GPU: both winners pay its ask.
    assert_eq!(booking.prices, vec![Micros(2_500_000), Micros(2_500_000)]);

    // Bronze may use the booked GPUs, marked to leave at the start; silver only if it ends first.
    let mut bronze = job(2, Tier::Bronze, whole(4), "5");
    bronze.resources.gpu_models = shape.resources.gpu_models.clone();
    bronze.max_runtime_s = 2 * 86_400;
    let placed = m.place(&bronze, NOW).expect("bronze fits before the start");
    assert_eq!(placed.leases[0].node.0, 0, "the cheapest H100s");
    assert_eq!(placed.preempt_at, Some(start));
    let mut long = job(3, Tier::Silver, whole(4), "5");
    long.resources.gpu_models = shape.resources.gpu_models.clone();
    long.max_runtime_s = 2 * 86_400;
    let long_placed = m.place(&long, NOW).expect("a node no booking needs whole");
    assert_ne!(long_placed.leases[0].node.0, 0, "the booking holds node 0 whole");

    // Inside the booking: on its nodes only, within the GPUs it holds there.
    let mut inside = job(4, Tier::Gold, whole(2), "100");
    inside.reservation = Some(shape.id);
    inside.max_runtime_s = 3600;
    m.join_reservation(inside.id, shape.id);
    m.release_job(bronze.id, start);
    let within = m.place(&inside, start).expect("the booking's GPUs");
    assert!(within.leases.iter().all(|lease| lease.node.0 <= 1), "{within:?}");
    let mut too_big = job(5, Tier::Gold, whole(4), "100");
    too_big.reservation = Some(shape.id);
    m.join_reservation(too_big.id, shape.id);
    // Four GPUs left in the booking, but never four on one node of it.
    assert!(m.plan(&too_big, start).is_err());

    // Twelve H100s do not exist: refused, saying how many fit.
    let mut big = shape.clone();
    big.id = model::JobId((1 << 62) + 1);
    big.replicas = 12;
    match m.book(&big, NOW, start) {
        Err(Unplaced::NoDomainFits { best, .. }) => assert!(best < 12, "{best}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn gang_repair_replaces_lost_replicas_next_to_the_survivors() {
    let specs = (0..6)
        .map(|index| node("eu", "GB200", 4, "3.00", 0.99).nvlink(index / 3))
        .collect();
    let mut m = matcher(specs);
    let spec = gang(1, Tier::Gold, 2, 4, TopologyLevel::Fabric);
    let placement = m.place(&spec, NOW).unwrap();
    let dead = placement.leases[0].node;
    let lost = m.set_node_offline(dead, true);
    assert_eq!(lost.len(), 1);
    let plan = m.plan_repair(&spec, &lost, NOW).unwrap();
    let new_node = plan.placement.leases[0].node;
    assert_eq!(plan.placement.leases[0].replica, lost[0].replica);
    assert_eq!(
        m.nodes()[new_node.index()].path.nvlink,
        m.nodes()[dead.index()].path.nvlink,
        "a spare in the same domain"
    );
    m.commit_repair(&plan).unwrap();
    assert_eq!(m.job_leases(spec.id).len(), 2);
    m.consistency_check().unwrap();
}

#[test]
fn gang_repair_leaves_the_fabric_only_when_nothing_there_can_take_the_replica() {
    let mut m = matcher(vec![
        node("eu", "H100", 4, "2.00", 0.99),
        node("eu", "H100", 4, "2.00", 0.99),
        node("eu", "H100", 4, "3.00", 0.99).fabric(1),
    ]);
    let spec = gang(1, Tier::Gold, 2, 4, TopologyLevel::Any);
    m.place(&spec, NOW).unwrap();
    let lost = m.set_node_offline(NodeId(0), true);
    // The survivor fills the rest of fabric 0.
    let plan = m.plan_repair(&spec, &lost, NOW).unwrap();
    assert_eq!(plan.placement.leases[0].node, NodeId(2));
    assert!(plan.victims.is_empty());
    m.commit_repair(&plan).unwrap();
    m.consistency_check().unwrap();
}

#[test]
fn gang_repair_preempts_bronze_in_its_fabric_before_going_to_a_free_node_elsewhere() {
    let mut m = matcher(vec![
        node("eu", "H100", 4, "2.00", 0.99),
        node("eu", "H100", 4, "2.00", 0.99),
        node("eu", "H100", 4, "2.00", 0.99),
        node("eu", "H100", 4, "3.00", 0.99).fabric(1),
    ]);
    let spec = gang(1, Tier::Gold, 2, 4, TopologyLevel::Any);
    m.place(&spec, NOW).unwrap();
    let bronze = m.place(&job(2, Tier::Bronze, whole(4), "5"), NOW).unwrap();
    assert_eq!(bronze.leases[0].node, NodeId(2));
    let dead = m.job_leases(spec.id)[0].node;
    let lost = m.set_node_offline(dead, true);
    let plan = m.plan_repair(&spec, &lost, NOW).unwrap();
    assert_eq!(
        plan.placement.leases[0].node,
        NodeId(2),
        "same fabric, at the cost of bronze"
    );
    assert_eq!(plan.victims.len(), 1);
    assert_eq!(plan.victims[0].job, bronze.job);
    m.commit_repair(&plan).unwrap();
    m.consistency_check().unwrap();
}

#[test]
fn quote_reports_price_and_capacity() {
    let m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 4, "2.50", 0.99),
    ]);
    let quote = m.quote(&job(1, Tier::Silver, whole(2), "5"), NOW);
    assert_eq!(quote.price_per_gpu_hour, Some(Micros(2_500_000)));
    assert_eq!((quote.gpus_available, quote.nodes_feasible), (12, 2));
    assert_eq!(
        quote.nodes_holding_data, 2,
        "a job without datasets finds its data everywhere"
    );
    let quote = m.quote(&job(2, Tier::Silver, whole(2), "1"), NOW);
    assert_eq!(quote.price_per_gpu_hour, None);
    assert_eq!(quote.explanation.unwrap().message, "0 of 2 nodes: 2 ask above $1.00/h");
}

#[test]
fn a_quote_counts_the_nodes_that_hold_the_jobs_data_and_they_rank_first() {
    let (topology, mut nodes) = fleet(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 1, "2.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
    ]);
    // None of the job's datasets; one of them; both, on a node too small for the job; both.
    for (node, held) in nodes.iter_mut().zip([vec![], vec![7], vec![7, 9], vec![7, 9]]) {
        node.datasets = held;
    }
    let m = Matcher::new(topology, nodes, MatcherConfig::default());
    let mut spec = job(1, Tier::Silver, whole(2), "5");
    spec.max_runtime_s = 3600;
    // A tebibyte each: staging one takes a sizeable share of the job's hour at 10 Gbit/s.
    spec.datasets = [7, 9]
        .map(|content_hash| model::Dataset {
            content_hash,
            size_bytes: 1 << 40,
        })
        .to_vec();
    let quote = m.quote(&spec, NOW);
    assert_eq!(quote.nodes_feasible, 3, "the one-GPU node cannot take two");
    assert_eq!(quote.nodes_holding_data, 1, "one node that fits holds both datasets");
    // The likeliest nodes, all asking the same: the one holding all its data, then the one
    // holding half, then the one holding none; never the one too small.
    assert_eq!(
        m.likely_nodes(&spec, NOW, 10),
        vec![(NodeId(3), true), (NodeId(1), false), (NodeId(0), false)]
    );
    assert_eq!(m.likely_nodes(&spec, NOW, 1), vec![(NodeId(3), true)]);
}

#[test]
fn bad_jobs_are_refused_with_a_reason() {
    let m = matcher(vec![node("eu", "H100", 8, "2.00", 0.99)]);
    let spec = job(1, Tier::Silver, GpuDemand::Share { milli: 1000 }, "5");
    assert!(matches!(m.plan(&spec, NOW), Err(Unplaced::InvalidJob { .. })));
    let mut spec = job(2, Tier::Silver, whole(1), "5");
    spec.replicas = 0;
    assert!(matches!(m.plan(&spec, NOW), Err(Unplaced::InvalidJob { .. })));
    let spec = job(3, Tier::Silver, whole(17), "5");
    assert!(matches!(m.plan(&spec, NOW), Err(Unplaced::InvalidJob { .. })));
}

#[test]
fn a_stale_plan_is_refused_at_commit() {
    let mut m = matcher(vec![node("eu", "H100", 1, "2.00", 0.99)]);
    let first = m.plan(&job(1, Tier::Silver, whole(1), "5"), NOW).unwrap();
    let second = m.plan(&job(2, Tier::Silver, whole(1), "5"), NOW).unwrap();
    m.commit(&first).unwrap();
    assert_eq!(m.commit(&second), Err(matcher::CommitError::Conflict(model::JobId(2))));
    assert_eq!(
        m.commit(&first),
        Err(matcher::CommitError::AlreadyPlaced(model::JobId(1)))
    );
    m.consistency_check().unwrap();
}

#[test]
fn a_gang_that_cannot_preempt_enough_says_how_close_it_came() {
    let specs = (0..4)
        .map(|index| node("eu", "H100", 8, "2.00", 0.99).fabric(index / 2))
        .collect();
    let mut m = matcher(specs);
    // Fill every node: silver on node 0, bronze elsewhere.
    m.place(&job(1, Tier::Silver, whole(8), "5"), NOW).unwrap();
    for id in 2..5 {
        m.place(&job(id, Tier::Bronze, whole(8), "5"), NOW).unwrap();
    }
    // Fabric 0 can free one node (node 1), fabric 1 two: a gang of three fits in neither.
    let spec = gang(9, Tier::Gold, 3, 8, TopologyLevel::Fabric);
    assert_eq!(
        m.plan_preemption(&spec, NOW).unwrap_err(),
        Unplaced::NoDomainFits {
            job: spec.id,
            level: "fabric",
            replicas: 3,
            best: 2
        }
    );
    let plan = m
        .plan_preemption(&gang(10, Tier::Gold, 2, 8, TopologyLevel::Fabric), NOW)
        .unwrap();
    assert_eq!(plan.victims.len(), 2);
    assert!(plan.victims.iter().all(|victim| victim.tier == Tier::Bronze));
}

#[test]
fn a_cordoned_node_takes_no_new_work_and_keeps_what_runs() {
    let mut m = matcher(vec![
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "3.00", 0.99),
    ]);
    let running = m.place(&job(1, Tier::Bronze, whole(4), "5"), NOW).unwrap();
    let hot = running.leases[0].node;
    assert_eq!(hot, model::NodeId(0), "the cheaper node first");
    m.set_node_cordoned(hot, true);
    assert!(m.node_cordoned(hot));
    m.consistency_check().unwrap();
    assert_eq!(m.job_leases(model::JobId(1)).len(), 1, "what runs stays");
    let next = m.place(&job(2, Tier::Silver, whole(4), "5"), NOW).unwrap();
    assert_ne!(next.leases[0].node, hot, "the cordoned node is skipped though cheaper");
    // Gold may not preempt its way onto it either, and the reason is named.
    let big = job(3, Tier::Gold, whole(8), "5");
    assert!(m.plan_preemption(&big, NOW).is_err());
    assert!(
        m.explain(&big, NOW)
            .excluded
            .iter()
            .any(|(reason, count)| *reason == Reason::OverLimit && *count == 1)
    );
    m.set_node_cordoned(hot, false);
    m.consistency_check().unwrap();
    assert_eq!(
        m.place(&job(4, Tier::Silver, whole(4), "5"), NOW).unwrap().leases[0].node,
        hot
    );
}

#[test]
fn a_job_that_names_its_runtime_goes_only_where_that_runs() {
    let (topology, mut nodes) = fleet(vec![
        node("eu", "H100", 8, "1.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
    ]);
    nodes[0].runtimes = model::RuntimeSet::of(&[model::Runtime::Container]);
    nodes[1].runtimes = model::RuntimeSet::of(&[model::Runtime::Process]);
    let mut m = matcher::Matcher::new(topology, nodes, matcher::MatcherConfig::default());
    let mut process = job(1, Tier::Silver, whole(1), "5");
    process.runtime = Some(model::Runtime::Process);
    assert_eq!(
        m.place(&process, NOW).unwrap().leases[0].node,
        NodeId(1),
        "not the cheaper container node"
    );
    let mut container = job(2, Tier::Silver, whole(1), "5");
    container.runtime = Some(model::Runtime::Container);
    assert_eq!(m.place(&container, NOW).unwrap().leases[0].node, NodeId(0));
    let any = job(3, Tier::Silver, whole(1), "5");
    assert_eq!(
        m.place(&any, NOW).unwrap().leases[0].node,
        NodeId(0),
        "no runtime named: the cheapest"
    );
    let mut big = job(4, Tier::Silver, whole(8), "5");
    big.runtime = Some(model::Runtime::Process);
    let explained = m.explain(&big, NOW);
    assert!(explained.excluded.contains(&(Reason::Runtime, 1)), "{explained:?}");
    assert!(
        explained.message.contains("does not run process jobs"),
        "{}",
        explained.message
    );
}

#[test]
fn bronze_goes_to_the_lowest_bronze_ask_when_providers_discount_it_differently() {
    // Silver asks 1.00 / 2.00 / 3.00; bronze asks 0.90 / 0.40 / 0.60: the bronze order is not
    // the silver order, so bronze work is searched in nodes keyed by their bronze asks.
    let (topology, mut nodes) = fleet(vec![
        node("eu", "H100", 8, "1.00", 0.99),
        node("eu", "H100", 8, "2.00", 0.99),
        node("eu", "H100", 8, "3.00", 0.99),
    ]);
    for (node, bronze) in nodes.iter_mut().zip([900_000, 400_000, 600_000]) {
        node.policy.asks[Tier::Bronze as usize] = Some(Micros(bronze));
    }
    let mut m = matcher::Matcher::new(topology, nodes, Default::default());
    let silver = m.place(&job(1, Tier::Silver, whole(8), "5"), NOW).unwrap();
    assert_eq!(silver.leases[0].node, NodeId(0), "silver: the lowest silver ask");
    let bronze = m.place(&job(2, Tier::Bronze, whole(8), "5"), NOW).unwrap();
    assert_eq!(bronze.leases[0].node, NodeId(1), "bronze: the lowest bronze ask");
    // The only loser left is node 2's bronze ask.
    assert_eq!(bronze.leases[0].price, Micros(600_000));
    assert!(
        m.place(&job(3, Tier::Bronze, whole(8), "0.50"), NOW).is_err(),
        "node 2's bronze ask 0.60 is over the cap"
    );
    m.release_job(model::JobId(2), NOW);
    m.consistency_check().unwrap();
    let again = m.place(&job(4, Tier::Bronze, whole(8), "0.50"), NOW).unwrap();
    assert_eq!(again.leases[0].node, NodeId(1));
    m.consistency_check().unwrap();
}
