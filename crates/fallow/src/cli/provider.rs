//! `fallow provider earnings`: what a provider's nodes earned, and how full they were.

use api::EarningsView;
use clap::{Args, Subcommand};

use super::output::{self, Align, Table, dollars};
use super::{Client, Connection, parse};

#[derive(Args)]
pub struct ProviderArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ProviderCommand,
}

#[derive(Subcommand)]
enum ProviderCommand {
    /// Earnings per node: money, GPU-hours sold, fill rate and reliability.
    Earnings,
}

pub fn run(args: ProviderArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        ProviderCommand::Earnings => earnings(&client),
    }
}

fn earnings(client: &Client) -> anyhow::Result<()> {
    let answer = client.get("/v1/earnings", &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let earnings: EarningsView = parse(&answer, "earnings")?;
    if earnings.nodes.is_empty() {
        println!("no nodes yet: start `fallow agent` on a GPU host with your provider key to register one");
    } else {
        let mut table = Table::new(&[
            ("NODE", Align::Right),
            ("NAME", Align::Left),
            ("EARNED", Align::Right),
            ("GPU-HOURS", Align::Right),
            ("FILL", Align::Right),
            ("RELIABILITY", Align::Right),
        ]);
        for node in &earnings.nodes {
            table.row(vec![
                node.node_id.to_string(),
                node.name.clone(),
                dollars(node.earned_micros),
                format!("{:.2}", node.gpu_hours_sold),
                format!("{:.1}%", node.fill_rate * 100.0),
                format!("{:.3}", node.reliability),
            ]);
        }
        table.print();
        println!();
    }
    output::print_fields(&[
        ("provider", earnings.provider_id.to_string()),
        ("earnings balance", dollars(earnings.earnings_micros)),
    ]);
    Ok(())
}
