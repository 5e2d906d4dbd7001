//! `fallow dataset warm`: a tenant stages a dataset ahead on the nodes a job of a given shape
//! would most likely get, so that the job starts there without fetching it.

use api::{DatasetRequest, WarmView};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::job::SpecArgs;
use super::{Client, Connection, output, parse};

#[derive(Args)]
pub struct DatasetArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: DatasetCommand,
}

#[derive(Subcommand)]
enum DatasetCommand {
    /// Stage a dataset ahead, for a day, on the nodes a job of this shape would most likely
    /// get: the dataset as URL,DIGEST,SIZE_BYTES, the job's shape with `job quote`'s flags (or a
    /// job file). The nodes fetch it in the background; `job quote` then counts those that hold
    /// it, and the matcher prefers them.
    Warm {
        /// The dataset: URL,DIGEST,SIZE_BYTES with DIGEST blake3:<hex> or sha256:<hex>.
        #[arg(value_name = "URL,DIGEST,SIZE", value_parser = super::job::parse_dataset)]
        dataset: DatasetRequest,
        /// How many of the likeliest nodes (1–64).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=i64::from(api::WARM_NODES_MAX)))]
        nodes: u32,
        #[command(flatten)]
        spec: Box<SpecArgs>,
    },
}

pub fn run(args: DatasetArgs) -> anyhow::Result<()> {
    match args.command {
        DatasetCommand::Warm { dataset, nodes, spec } => {
            // The shape is checked before a key is looked for or anything sent.
            let mut job = spec.request(true)?;
            job.remove("datasets");
            let client = Client::connect(&args.connection)?;
            let body = json!({"dataset": dataset, "job": Value::Object(job), "nodes": nodes});
            let answer = client.post("/v1/datasets/warm", &body)?;
            if client.json {
                output::print_json(&answer);
                return Ok(());
            }
            let warm: WarmView = parse(&answer, "warm-up")?;
            let ids: Vec<String> = warm.nodes.iter().map(i64::to_string).collect();
            if warm.nodes.is_empty() {
                println!("no node fits the job's shape now; nothing staged");
            } else {
                println!(
                    "{} on {} node(s) ({}): {} hold it already, the others fetch it now and hold it for a day",
                    warm.digest,
                    warm.nodes.len(),
                    ids.join(", "),
                    warm.holding
                );
            }
            if !warm.explanation.is_empty() {
                println!("{}", warm.explanation);
            }
            Ok(())
        }
    }
}
