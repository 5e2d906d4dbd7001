//! `fallow offers search 'FILTER'`: the market's offers that match a filter, cheapest first.

use api::OfferList;
use clap::{Args, Subcommand};

use super::output::{self, Align, Table, dollars};
use super::{Client, Connection, parse};

#[derive(Args)]
pub struct OffersArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: OffersCommand,
}

#[derive(Subcommand)]
enum OffersCommand {
    /// Offers matching a filter, cheapest first, e.g.
    /// 'gpu_model=H100-SXM5 price<2.5 region in [eu-west,eu-north] tier=silver'.
    Search {
        /// The filter (empty: every offer).
        #[arg(default_value = "")]
        filter: String,
        /// The most offers shown.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=api::OFFERS_PAGE_MAX as u64))]
        limit: u64,
    },
}

pub fn run(args: OffersArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        OffersCommand::Search { filter, limit } => search(&client, &filter, limit),
    }
}

fn search(client: &Client, filter: &str, limit: u64) -> anyhow::Result<()> {
    let answer = client.get(
        "/v1/offers",
        &[("filter", filter.to_string()), ("limit", limit.to_string())],
    )?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let list: OfferList = parse(&answer, "offer list")?;
    if list.offers.is_empty() {
        println!("no offers match{}", if filter.is_empty() { "" } else { " the filter" });
        if let Some(explanation) = &list.explanation {
            println!("{explanation}");
        }
        return Ok(());
    }
    let mut table = Table::new(&[
        ("NODE", Align::Right),
        ("GPU", Align::Left),
        ("FREE", Align::Right),
        ("CU", Align::Right),
        ("MEMORY", Align::Right),
        ("REGION", Align::Left),
        ("SITE", Align::Left),
        ("RELIABILITY", Align::Right),
        ("GOLD", Align::Right),
        ("SILVER", Align::Right),
        ("BRONZE", Align::Right),
        ("ONLINE", Align::Left),
    ]);
    for offer in &list.offers {
        let price = |tier: &str| {
            offer
                .price_micros_per_gpu_hour
                .get(tier)
                .map_or_else(|| "-".to_string(), |micros| dollars(*micros))
        };
        table.row(vec![
            offer.node_id.to_string(),
            if offer.simulated {
                format!("{} (simulated)", offer.gpu_model)
            } else {
                offer.gpu_model.clone()
            },
            format!("{}/{}", offer.gpus_free, offer.gpu_count),
            format!("{:.2}", offer.compute_units),
            format!("{} GiB", offer.gpu_memory_mib / 1024),
            offer.region.clone(),
            offer.site.clone(),
            format!("{:.3}", offer.reliability),
            price("gold"),
            price("silver"),
            price("bronze"),
            if offer.online { "yes" } else { "no" }.to_string(),
        ]);
    }
    table.print();
    println!(
        "{} of {} matching offers; prices per GPU-hour now",
        list.offers.len(),
        list.total_matching
    );
    Ok(())
}
