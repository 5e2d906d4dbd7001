//! `fallow sim …`: simulations.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use sim::packing::{self, PackingConfig, PolicyName, PolicyReport};

#[derive(Subcommand)]
pub enum SimCommand {
    /// Packing quality on a node list and a pod list, by the FGD paper's protocol.
    Packing(PackingArgs),
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
    }
}

fn run_packing(args: PackingArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.tune.is_finite() && args.tune > 0.0,
        "--tune must be a positive number, got {}",
        args.tune
    );
    let nodes = packing::read_nodes(&args.nodes).context("reading the node list")?;
    let pods = packing::read_pods(&args.pods).context("reading the pod list")?;
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
