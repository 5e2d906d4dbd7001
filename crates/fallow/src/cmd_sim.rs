//! `fallow sim …`: simulations.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use sim::market::{self, DemandSource, FleetSource, MarketConfig, MarketReport, Scenario};
use sim::packing::{self, PackingConfig, PolicyName, PolicyReport};

#[derive(Subcommand)]
pub enum SimCommand {
    /// Packing quality on a node list and a pod list, by the FGD paper's protocol.
    Packing(PackingArgs),
    /// The market in virtual time with the production matcher: Fallow's matcher beside a FIFO
    /// cluster, a pay-as-bid market and the matcher without gang repair, on one fleet, one
    /// demand and one set of failures.
    Market(MarketArgs),
}

#[derive(Args)]
pub struct MarketArgs {
    /// GPUs of the synthetic market (8-GPU nodes and GB200 NVL72 racks; 1 % hobbyists' consumer GPUs).
    #[arg(long, default_value_t = 100_000)]
    gpus: u64,
    /// Simulated days, from a Monday 00:00 UTC.
    #[arg(long, default_value_t = 7)]
    days: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `default`, or `big-training`: one gold gang of --gang-gpus on a campus of GB200 NVL72
    /// racks (added beside the market) for the whole run.
    #[arg(long, default_value = "default", value_parser = parse_scenario)]
    scenario: Scenario,
    /// fallow, fifo, pay-as-bid, no-repair (comma-separated), or all.
    #[arg(long, default_value = "all", value_parser = parse_market_policies)]
    policies: MarketPolicies,
    /// How sellers bid in the pay-as-bid market: `shaded` (up to the best losing offer, the
    /// equilibrium of a pay-as-bid auction) or `truthful` (their true asks, its most
    /// tenant-friendly case).
    #[arg(long, default_value = "shaded", value_parser = parse_bidding)]
    pay_as_bid_bids: market::Bidding,
    /// Providers ask this much more for gold than for silver, in per cent (default 0: a gold
    /// lease costs a provider what a silver one does, and under the (k+1)-price auction its
    /// best ask is its cost).
    #[arg(long, default_value_t = 0.0)]
    gold_ask_premium_pct: f64,
    /// The share of providers that lie (a false GPU model, inflated usage, dropped jobs or
    /// missed windows, a quarter each); Fallow's market runs the trust policy
    /// (docs/trust-policy.md) against them, the others only count what they cost.
    #[arg(long, default_value_t = 0.0)]
    fraud_rate: f64,
    /// A node list instead of the synthetic fleet (openb, Philly or PAI form), e.g.
    /// ../shared/traces/openb/openb_node_list_gpu_node.csv.
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// Replay an openb pod list with times (its 11-column form) instead of the synthetic demand.
    #[arg(long)]
    pods: Option<PathBuf>,
    /// A replayed pod list arrives this many times faster than recorded.
    #[arg(long, default_value_t = 1.0)]
    compress: f64,
    /// Synthetic demand as a share of the GPU-hours the market offers.
    #[arg(long, default_value_t = 0.9)]
    load: f64,
    /// GPUs of the big-training gang (a multiple of 8: 8-GPU replicas).
    #[arg(long, default_value_t = 100_000)]
    gang_gpus: u32,
    /// The big-training gang's checkpoint interval (each checkpoint costs 10 s).
    #[arg(long, default_value_t = 1800)]
    checkpoint_interval_s: u32,
    /// Run the matcher's consistency check and the ledger's balance every this many virtual
    /// seconds, and at the end (0: after every event; O(fleet) each, so keep it coarse at 1M GPUs).
    #[arg(long, default_value_t = 21_600)]
    check_every_s: i64,
    /// Resolution of the charts, in virtual seconds.
    #[arg(long, default_value_t = 600)]
    sample_every_s: i64,
    /// Threads the policies run on side by side (0: one per core); results do not depend on it.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The shared traces folder, for the market prices.
    #[arg(long, default_value = "../shared/traces")]
    traces: PathBuf,
    /// Write the HTML report (index.html) and its SVG charts into this directory.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Debug)]
struct MarketPolicies(Vec<market::PolicyName>);

fn parse_market_policies(text: &str) -> Result<MarketPolicies, String> {
    market::PolicyName::parse_list(text).map(MarketPolicies)
}

fn parse_bidding(text: &str) -> Result<market::Bidding, String> {
    market::Bidding::parse(text).ok_or_else(|| format!("`{text}` is not a way to bid: use shaded or truthful"))
}

fn parse_scenario(text: &str) -> Result<Scenario, String> {
    Scenario::parse(text).ok_or_else(|| format!("`{text}` is not a scenario: use default or big-training"))
}

/// The matcher's time, for the report; the simulation never reads it.
struct WallStopwatch(Instant);

impl market::Stopwatch for WallStopwatch {
    fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[derive(Args)]
pub struct PackingArgs {
    /// Node list CSV (sn,cpu_milli,memory_mib,gpu,model), e.g. ../shared/traces/openb/openb_node_list_gpu_node.csv.
    #[arg(long)]
    nodes: PathBuf,
    /// Pod list CSV, 11- or 5-column form, plain or `.csv.xz`.
    #[arg(long)]
    pods: PathBuf,
    /// Seeds: `42..=51`, `42..52` or `42,43,44`.
    #[arg(long, default_value = "42..=51", value_parser = parse_seeds)]
    seeds: Seeds,
    /// Total GPU request of the workload as a multiple of cluster GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    tune: f64,
    /// fallow, fgd, bestfit, dotprod, packing, clustering, random, or all.
    #[arg(long, default_value = "all", value_parser = parse_policies)]
    policy: Policies,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Derive the FGD paper's gpuspec variant in memory: this per cent of the GPU pods (the paper
    /// uses 10, 20, 25 and 33) name GPU models, drawn as docs/simulator.md says. The pod list
    /// must have no gpu_spec of its own (e.g. openb_pod_list_default.csv).
    #[arg(long)]
    gpu_spec_share: Option<f64>,
    /// Seed of the gpuspec variant (which pods, which models); the workload's seeds are --seeds.
    #[arg(long, default_value_t = 1, requires = "gpu_spec_share")]
    gpu_spec_seed: u64,
    /// Print a JSON array on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Debug)]
struct Seeds(Vec<u64>);

#[derive(Clone, Debug)]
struct Policies(Vec<PolicyName>);

fn parse_policies(text: &str) -> Result<Policies, String> {
    PolicyName::parse_list(text).map(Policies)
}

fn parse_seeds(text: &str) -> Result<Seeds, String> {
    let number = |part: &str| {
        part.trim()
            .parse::<u64>()
            .map_err(|_| format!("`{part}` is not a seed (a non-negative integer)"))
    };
    let seeds: Vec<u64> = if let Some((start, end)) = text.split_once("..=") {
        (number(start)?..=number(end)?).collect()
    } else if let Some((start, end)) = text.split_once("..") {
        (number(start)?..number(end)?).collect()
    } else {
        text.split(',').map(number).collect::<Result<_, _>>()?
    };
    if seeds.is_empty() {
        return Err(format!("`{text}` names no seed"));
    }
    Ok(Seeds(seeds))
}

pub fn run(command: SimCommand) -> anyhow::Result<()> {
    match command {
        SimCommand::Packing(args) => run_packing(args),
        SimCommand::Market(args) => run_market(args),
    }
}

fn run_market(args: MarketArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.load.is_finite() && args.load > 0.0 && args.load <= 10.0,
        "--load must be a share of the offered GPU-hours in (0, 10], got {}",
        args.load
    );
    if !args.traces.is_dir() {
        bail!(
            "the traces folder {} does not exist here (the working directory is {}): run from the repository \
             root with ../shared/traces beside it, or pass --traces DIR (a folder holding {})",
            args.traces.display(),
            std::env::current_dir().map_or_else(|_| "unknown".into(), |dir| dir.display().to_string()),
            synth::PRICE_STATS_FILE
        );
    }
    let prices = synth::market_prices(&args.traces).context("loading the market prices")?;
    let threads = if args.threads == 0 {
        std::thread::available_parallelism().map_or(1, |cores| cores.get())
    } else {
        args.threads
    };
    let mut config = MarketConfig::new(args.gpus, args.days, args.seed, prices);
    config.scenario = args.scenario;
    config.pay_as_bid_bidding = args.pay_as_bid_bids;
    if !(args.gold_ask_premium_pct.is_finite() && (0.0..=1000.0).contains(&args.gold_ask_premium_pct)) {
        bail!(
            "--gold-ask-premium-pct must be between 0 and 1000, not {}",
            args.gold_ask_premium_pct
        );
    }
    config.gold_ask_premium_permille = (args.gold_ask_premium_pct * 10.0).round() as u32;
    config.fraud_rate = args.fraud_rate;
    config.policies = args.policies.0;
    config.fleet = match args.nodes {
        Some(path) => FleetSource::NodeList(path),
        None => FleetSource::Synthetic,
    };
    config.demand = match args.pods {
        Some(path) => DemandSource::Replay {
            path,
            compress: args.compress,
        },
        None => DemandSource::Synthetic,
    };
    config.load_permille = (args.load * 1000.0).round() as u32;
    config.gang_gpus = args.gang_gpus;
    config.gang_checkpoint_interval_s = args.checkpoint_interval_s;
    config.check_every_s = args.check_every_s;
    config.sample_every_s = args.sample_every_s;
    config.threads = threads;
    let started = Instant::now();
    let report = market::run_market(&config, &WallStopwatch(Instant::now()))?;
    let wall_s = started.elapsed().as_secs_f64();
    if let Some(directory) = &args.report {
        write_report(directory, &report)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_market(&report, wall_s, threads);
    }
    Ok(())
}

fn write_report(directory: &Path, report: &MarketReport) -> anyhow::Result<()> {
    std::fs::create_dir_all(directory).with_context(|| format!("creating {}", directory.display()))?;
    let files = market::html::render(report, market::MARKET_START);
    for (name, contents) in &files {
        let path = directory.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!(
        "report: {} ({} charts)",
        directory.join("index.html").display(),
        files.len() - 1
    );
    Ok(())
}

fn print_market(report: &MarketReport, wall_s: f64, threads: usize) {
    println!(
        "{} scenario, seed {}, {} days, {} GPUs ({}); gold asks +{} %; pay-as-bid sellers bid {}; trace hash {}; {wall_s:.1} s on {threads} threads",
        report.scenario,
        report.seed,
        report.days,
        report.fleet.gpus,
        report.fleet.source,
        report.gold_ask_premium_pct,
        report.pay_as_bid_bids,
        report.trace_hash
    );
    let names: Vec<&str> = report.policies.keys().copied().collect();
    print!("{:<40}", "");
    for name in &names {
        print!("{name:>13}");
    }
    println!();
    let show = |value: Option<f64>| value.map_or("-".to_string(), |value| format!("{value:.2}"));
    type Figure = fn(&market::PolicyReport) -> Option<f64>;
    let rows: [(&str, Figure); 12] = [
        ("utilisation %", |policy| Some(policy.utilization_pct)),
        ("fill rate of offered windows %", |policy| Some(policy.fill_rate_pct)),
        ("wait p95 gold (s)", |policy| policy.wait_p95_s.gold),
        ("wait p95 silver (s)", |policy| policy.wait_p95_s.silver),
        ("wait p95 bronze (s)", |policy| policy.wait_p95_s.bronze),
        ("preemptions per bronze GPU-hour", |policy| {
            Some(policy.preemptions_per_bronze_gpu_hour)
        }),
        ("goodput of gangs %", |policy| policy.goodput_pct),
        ("tenants' $/GPU-hour", |policy| policy.tenant_usd_per_gpu_hour),
        ("tenants' $/useful H100-hour", |policy| {
            policy.tenant_usd_per_useful_h100_hour
        }),
        ("bronze discount vs on-demand %", |policy| {
            policy.bronze_discount_vs_on_demand_pct
        }),
        ("providers' $/offered GPU-hour", |policy| {
            Some(policy.provider_usd_per_offered_gpu_hour)
        }),
        ("matcher µs per event", |policy| policy.matcher_us_per_event),
    ];
    for (label, value) in rows {
        print!("{label:<40}");
        for name in &names {
            print!("{:>13}", show(value(&report.policies[name])));
        }
        println!();
    }
    for (name, policy) in &report.policies {
        if let Some(gang) = &policy.big_gang {
            println!(
                "{name}: big gang of {} GPUs: goodput {} %, {} node failures, {} repairs, {} restarts",
                gang.gpus,
                show(gang.goodput_pct),
                gang.node_failures,
                gang.repairs,
                gang.restarts
            );
        }
        if let Some(fraud) = &policy.fraud {
            println!(
                "{name}: fraud: {} dishonest providers, {} lied; {} proven ({} %), median {} days to proof; {} honest slashed; tenants lost {} % of what they paid ({} % before refunds)",
                fraud.dishonest_providers,
                fraud.acted,
                fraud.detected,
                show(fraud.fraud_detected_pct),
                show(fraud.median_days_to_detect),
                fraud.honest_slashed,
                show(fraud.tenant_loss_to_fraud_pct),
                show(fraud.tenant_loss_before_refunds_pct)
            );
        }
        let invariants = &policy.invariants;
        if !invariants.consistency_failures.is_empty() || !invariants.ledger_balanced || !invariants.work_accounted {
            println!("{name}: INVARIANTS BROKEN: {invariants:?}");
        }
    }
}

fn run_packing(args: PackingArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.tune.is_finite() && args.tune > 0.0,
        "--tune must be a positive number, got {}",
        args.tune
    );
    let nodes = packing::read_nodes(&args.nodes).context("reading the node list")?;
    let mut pods = packing::read_pods(&args.pods).context("reading the pod list")?;
    if let Some(share_pct) = args.gpu_spec_share {
        let variant = packing::gpuspec::derive(&pods, &nodes, share_pct, args.gpu_spec_seed)
            .context("deriving the gpuspec variant")?;
        eprintln!(
            "gpuspec variant: {} of {} GPU pods name GPU models (share {share_pct} %, seed {})",
            variant.constrained_pods, variant.gpu_pods, args.gpu_spec_seed
        );
        pods = variant.pods;
    }
    let mut policies = args.policy.0;
    policies.sort();
    policies.dedup();
    let config = PackingConfig {
        seeds: args.seeds.0,
        tune: args.tune,
        policies,
        threads: args.threads,
    };
    let reports = packing::run_packing(&nodes, &pods, &config);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        print_table(&reports);
    }
    Ok(())
}

fn print_table(reports: &[PolicyReport]) {
    println!(
        "{:<11} {:>16} {:>6} {:>16} {:>15} {:>9}",
        "policy", "unalloc@100 (%)", "std", "unalloc@130 (%)", "frag@100 (%)", "us/pod"
    );
    for report in reports {
        let at_130 = report
            .unallocated_gpu_pct_at_130
            .map_or("-".to_string(), |value| format!("{value:.2}"));
        println!(
            "{:<11} {:>16.2} {:>6.2} {:>16} {:>15.2} {:>9.1}",
            report.policy,
            report.unallocated_gpu_pct_at_100,
            report.std,
            at_130,
            report.fragmented_gpu_pct_at_100,
            report.us_per_pod
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_accept_ranges_and_lists() {
        assert_eq!(parse_seeds("42..=44").unwrap().0, vec![42, 43, 44]);
        assert_eq!(parse_seeds("42..44").unwrap().0, vec![42, 43]);
        assert_eq!(parse_seeds("7,9").unwrap().0, vec![7, 9]);
        assert!(parse_seeds("44..42").is_err());
        assert!(parse_seeds("x").is_err());
    }
}
