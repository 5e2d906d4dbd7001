//! `fallow reserve`: a tenant books whole GPUs ahead at a price fixed now (the whole of it held
//! then), lists and shows its bookings, and cancels one (docs/reservations.md says what a
//! cancellation gives back).

use api::{ReservationList, ReservationView};
use clap::{Args, Subcommand};
use serde_json::json;

use super::output::{self, Align, Table, dollars, utc};
use super::{Client, Connection, parse};

#[derive(Args)]
pub struct ReserveArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ReserveCommand,
}

#[derive(Subcommand)]
enum ReserveCommand {
    /// Book whole GPUs of one model from a start time for some hours, at or under a price per
    /// GPU-hour. The market's auction fixes the price now and the whole of it is held now;
    /// refused, with the reason, when the capacity is not there then. Jobs run inside the
    /// booking with `fallow job submit --reservation ID`.
    Create(CreateArgs),
    /// Your reservations, newest first.
    List,
    /// One reservation: its nodes, prices, escrow and what cancelling now gives back.
    Show {
        /// The reservation's id.
        id: i64,
    },
    /// Cancel a reservation: all back a day or more before its start, half of what is not yet
    /// delivered after that (docs/reservations.md); the jobs inside it end.
    Cancel {
        /// The reservation's id.
        id: i64,
    },
}

#[derive(Args)]
struct CreateArgs {
    /// How many GPUs (1–4096).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(api::RESERVATION_GPUS_MAX)))]
    gpus: u32,
    /// The GPU model: a catalog name or alias (`fallow catalog`), e.g. H100.
    #[arg(long, value_name = "MODEL")]
    gpu_model: String,
    /// When it starts: RFC 3339, e.g. 2026-12-08T09:00Z.
    #[arg(long, value_name = "TIME", value_parser = super::node::parse_time_us)]
    from: i64,
    /// How many hours (1–672).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(api::RESERVATION_HOURS_MAX)))]
    hours: u32,
    /// The most paid per GPU-hour, in dollars.
    #[arg(long, value_name = "DOLLARS")]
    max_price: String,
    /// Regions allowed (repeat, or comma-separated); none: any.
    #[arg(long = "region", value_name = "REGION", value_delimiter = ',')]
    regions: Vec<String>,
    /// Where all the GPUs must be: node, nvlink, fabric, site, region or any.
    #[arg(long, default_value = "any")]
    topology: String,
}

pub fn run(args: ReserveArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        ReserveCommand::Create(create) => {
            let body = json!({
                "gpus": create.gpus,
                "gpu_model": create.gpu_model,
                "starts_at_us": create.from,
                "hours": create.hours,
                "max_price_per_gpu_hour": create.max_price,
                "regions": create.regions,
                "topology": create.topology,
            });
            let answer = client.post("/v1/reservations", &body)?;
            show_answer(&client, &answer, "booked")
        }
        ReserveCommand::List => {
            let answer = client.get("/v1/reservations", &[])?;
            if client.json {
                output::print_json(&answer);
                return Ok(());
            }
            let list: ReservationList = parse(&answer, "reservation list")?;
            if list.reservations.is_empty() {
                println!(
                    "no reservations yet: `fallow reserve create --gpus N --gpu-model M --from TIME --hours H --max-price P`"
                );
                return Ok(());
            }
            let mut table = Table::new(&[
                ("ID", Align::Right),
                ("STATE", Align::Left),
                ("GPUS", Align::Right),
                ("MODEL", Align::Left),
                ("FROM", Align::Left),
                ("UNTIL", Align::Left),
                ("COST", Align::Right),
                ("NODES", Align::Right),
            ]);
            for reservation in &list.reservations {
                table.row(vec![
                    reservation.id.to_string(),
                    reservation.state.clone(),
                    reservation.gpus.to_string(),
                    reservation.gpu_model.clone(),
                    utc(reservation.starts_at_us),
                    utc(reservation.ends_at_us),
                    dollars(reservation.cost_micros),
                    reservation
                        .nodes
                        .iter()
                        .filter(|node| node.lost_at_us.is_none())
                        .count()
                        .to_string(),
                ]);
            }
            table.print();
            Ok(())
        }
        ReserveCommand::Show { id } => {
            let answer = client.get(&format!("/v1/reservations/{id}"), &[])?;
            show_answer(&client, &answer, "")
        }
        ReserveCommand::Cancel { id } => {
            let answer = client.post(&format!("/v1/reservations/{id}/cancel"), &json!({}))?;
            show_answer(&client, &answer, "cancelled")
        }
    }
}

fn show_answer(client: &Client, answer: &serde_json::Value, done: &str) -> anyhow::Result<()> {
    if client.json {
        output::print_json(answer);
        return Ok(());
    }
    let view: ReservationView = parse(answer, "reservation")?;
    if !done.is_empty() {
        println!("reservation {} {done}", view.id);
    }
    print_view(&view);
    Ok(())
}

fn print_view(view: &ReservationView) {
    match view.state_reason.as_str() {
        "" => println!("reservation {}: {}", view.id, view.state),
        reason => println!("reservation {}: {} ({reason})", view.id, view.state),
    }
    println!(
        "  {} × {}{} from {} until {}",
        view.gpus,
        view.gpu_model,
        if view.regions.is_empty() {
            String::new()
        } else {
            format!(" in {}", view.regions.join(", "))
        },
        utc(view.starts_at_us),
        utc(view.ends_at_us)
    );
    println!(
        "  cost {}, held at booking {}, held now {}, back if cancelled now {}",
        dollars(view.cost_micros),
        dollars(view.hold_micros),
        dollars(view.escrow_micros),
        dollars(view.refund_if_cancelled_micros)
    );
    let mut table = Table::new(&[
        ("NODE", Align::Right),
        ("GPUS", Align::Right),
        ("PRICE/GPU-H", Align::Right),
        ("FROM", Align::Left),
        ("UNTIL", Align::Left),
        ("LOST", Align::Left),
    ]);
    for node in &view.nodes {
        table.row(vec![
            node.node_id.to_string(),
            node.gpus.to_string(),
            dollars(node.price_micros_per_gpu_hour),
            utc(node.held_from_us),
            utc(node.held_until_us),
            node.lost_at_us.map_or_else(|| "-".into(), utc),
        ]);
    }
    table.print();
}
