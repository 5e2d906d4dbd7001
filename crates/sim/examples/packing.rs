//! Runs the packing benchmark without the `fallow` binary: `packing NODES PODS SEEDS POLICY [THREADS]`.

use std::path::Path;

use sim::packing::{self, PackingConfig, PolicyName};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        return Err("usage: packing NODES PODS FIRST_SEED..=LAST_SEED POLICY [THREADS]".into());
    }
    let nodes = packing::read_nodes(Path::new(&args[1]))?;
    let pods = packing::read_pods(Path::new(&args[2]))?;
    let (first, last) = args[3].split_once("..=").ok_or("seeds must be A..=B")?;
    let config = PackingConfig {
        seeds: (first.parse()?..=last.parse()?).collect(),
        tune: 1.3,
        policies: PolicyName::parse_list(&args[4])?,
        threads: args.get(5).map_or(Ok(0), |threads| threads.parse())?,
    };
    for report in packing::run_packing(&nodes, &pods, &config) {
        let per_seed: Vec<String> = report
            .per_seed
            .iter()
            .map(|seed| format!("{:.2}", seed.unallocated_gpu_pct_at_100))
            .collect();
        println!(
            "{:<11} {:>6.2} ±{:.2}  @130 {:>6.2}  frag {:>6.2}  {:>7.1} us/pod  [{}]",
            report.policy,
            report.unallocated_gpu_pct_at_100,
            report.std,
            report.unallocated_gpu_pct_at_130.unwrap_or(f64::NAN),
            report.fragmented_gpu_pct_at_100,
            report.us_per_pod,
            per_seed.join(" ")
        );
    }
    Ok(())
}
