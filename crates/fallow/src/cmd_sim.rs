//! `fallow sim …`: simulations.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum SimCommand {
    /// Packing quality on a node list and a pod list, by the FGD paper's protocol.
    Packing,
}

pub fn run(command: SimCommand) -> anyhow::Result<()> {
    match command {
        SimCommand::Packing => anyhow::bail!("not built yet"),
    }
}
