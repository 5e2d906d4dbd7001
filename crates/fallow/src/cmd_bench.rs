//! `fallow bench …`: benchmarks of the matching engine, printing JSON.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Sustained single-job decisions on a synthetic fleet held near a fill level.
    Matcher,
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Matcher => anyhow::bail!("not built yet"),
    }
}
