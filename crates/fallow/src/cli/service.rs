//! `fallow service show NAME`: a service served through the gateway (`/s/NAME/…`): its running
//! replicas, how many are reachable, and its callers' requests, errors, latency and tokens.

use api::ServiceView;
use clap::{Args, Subcommand};

use super::output;
use super::{Client, Connection, parse};

#[derive(Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ServiceCommand,
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// A service: replicas, requests, errors, p50/p95/p99 latency and tokens.
    Show {
        /// The service's name (the `serve.name` of its jobs).
        name: String,
    },
}

pub fn run(args: ServiceArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.connection)?;
    match args.command {
        ServiceCommand::Show { name } => show(&client, &name),
    }
}

fn show(client: &Client, name: &str) -> anyhow::Result<()> {
    let answer = client.get(&format!("/v1/services/{}", super::admin::path_segment(name)), &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let service: ServiceView = parse(&answer, "service")?;
    let ms = |value: Option<f64>| value.map_or_else(|| "-".to_string(), |ms| format!("{ms:.1} ms"));
    let replicas: Vec<String> = service.replicas.iter().map(i64::to_string).collect();
    output::print_fields(&[
        ("service", service.name.clone()),
        (
            "replicas",
            format!(
                "{} running ({}), {} reachable",
                service.replicas.len(),
                if replicas.is_empty() {
                    "-".to_string()
                } else {
                    replicas.join(", ")
                },
                service.replicas_ready
            ),
        ),
        ("requests", format!("{} ({} errors)", service.requests, service.errors)),
        (
            "latency",
            format!(
                "p50 {}, p95 {}, p99 {}",
                ms(service.p50_ms),
                ms(service.p95_ms),
                ms(service.p99_ms)
            ),
        ),
        (
            "tokens",
            format!(
                "{} ({} prompt, {} completion)",
                service.tokens, service.prompt_tokens, service.completion_tokens
            ),
        ),
    ]);
    Ok(())
}
