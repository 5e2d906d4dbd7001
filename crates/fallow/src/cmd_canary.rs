//! `fallow canary`: the known-answer benchmark the coordinator orders on nodes
//! (docs/trust-policy.md § 3). `run` computes one order's answer and prints what it measured as
//! one JSON line (the agent starts it as a child); `image` builds its container variant locally.
//! The work itself is `agent::canary`.

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum CanaryCommand {
    /// Runs one canary order and prints {"digest", "elapsed_ms", "rate_milli",
    /// "memory_allocated", "measured_on"} as one JSON line. FALLOW_SIMULATED_GPU=MODEL paces
    /// the run like that catalog model; without it the digest is computed on the CPU and no rate
    /// is measured.
    Run(RunArgs),
    /// Builds the container variant (this binary and its libraries) as a local Docker image and
    /// prints its tag.
    Image(ImageArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// The order's seed.
    #[arg(long)]
    seed: String,
    /// Work units per GPU (1 to 100000).
    #[arg(long)]
    units: u64,
    /// The GPU indexes, comma-separated, in the order's order (e.g. 0,1).
    #[arg(long, value_delimiter = ',', required = true)]
    gpus: Vec<u8>,
    /// Memory to allocate on each GPU, in MiB.
    #[arg(long)]
    memory_mib: u64,
}

#[derive(Args)]
pub struct ImageArgs {
    /// The image's tag (default fallow-canary:VERSION).
    #[arg(long)]
    tag: Option<String>,
}

pub fn run(command: CanaryCommand) -> anyhow::Result<()> {
    match command {
        CanaryCommand::Run(args) => {
            let work = agent::canary::CanaryWork {
                seed: args.seed,
                units: args.units,
                gpus: args.gpus,
                memory_mib: args.memory_mib,
            };
            let output = agent::canary::run_canary(&work, &agent::canary::CanaryDevice::from_env())?;
            println!(
                "{}",
                serde_json::to_string(&output).context("writing the canary's output")?
            );
            Ok(())
        }
        CanaryCommand::Image(args) => {
            let tag = args.tag.unwrap_or_else(agent::canary::default_image_tag);
            let executable = std::env::current_exe().context("finding the fallow binary")?;
            agent::canary::build_image(&executable, &tag)
                .map_err(anyhow::Error::msg)
                .context("building the canary image")?;
            println!("{tag}");
            Ok(())
        }
    }
}
