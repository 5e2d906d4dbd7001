//! `fallow job`: a tenant submits, lists, shows, follows, cancels and quotes jobs.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use api::{DatasetRequest, JobList, JobLogs, JobView, QuoteView};
use clap::{ArgGroup, Args, Subcommand};
use reqwest::Method;
use serde_json::{Map, Value, json};

use super::job_file::{self, JobFile, Purpose};
use super::output::{self, Align, Spinner, Table, dollars, utc, utc_or_dash};
use super::{Client, Connection, parse};

/// How often `--wait` and `logs --follow` ask the coordinator again.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// How often the spinner moves between polls.
const SPINNER_EVERY: Duration = Duration::from_millis(100);
/// Log chunks asked for per request (the API's page size limit).
const LOG_PAGE: i64 = api::PAGE_SIZE_MAX;
/// The largest job file read.
const JOB_FILE_BYTES_MAX: u64 = api::REQUEST_BODY_BYTES_MAX as u64;
/// The longest lease end reason shown in the lease table; longer ones follow it in full.
const END_REASON_CELL_CHARS_MAX: usize = 50;

#[derive(Args)]
pub struct JobArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: JobCommand,
}

#[derive(Subcommand)]
enum JobCommand {
    /// Submit a job: a job file (YAML, docs/job-files.md), flags, or both (flags win). Put the
    /// command after `--`; with `--process` its first word is the program.
    Submit(SubmitArgs),
    /// Your jobs, newest first.
    List(ListArgs),
    /// One job: its state, why it waits, its leases, cost and progress.
    Show {
        /// The job's id.
        id: i64,
    },
    /// A job's output, oldest first; `--follow` keeps printing until the job ends.
    Logs(LogsArgs),
    /// A replica's output archive as the coordinator keeps it: the tar of what it left in
    /// $FALLOW_OUTPUT_DIR (a job without --output-url), to a file or a pipe.
    Output(OutputArgs),
    /// Cancel a job: its replicas are stopped and its escrow released.
    Cancel {
        /// The job's id.
        id: i64,
    },
    /// What a job would pay now, and how many nodes could take it (submits nothing).
    Quote(SpecArgs),
}

#[derive(Args)]
struct SubmitArgs {
    #[command(flatten)]
    spec: SpecArgs,
    /// Wait until the job ends, printing its output as it comes, and exit with the job's exit
    /// code: 0 when it finished; the code of the replica that failed first; 1 for a failure with
    /// no code of its own (a node lost); 69 when it was never placed; 75 when it was preempted
    /// and not resumed; 130 when it was cancelled.
    #[arg(long)]
    wait: bool,
    /// With --wait: show the job's state only, not its output.
    #[arg(long, short = 'q', requires = "wait")]
    quiet: bool,
    /// Print the request (the API's JobRequest as JSON) and submit nothing; needs no key.
    #[arg(long, conflicts_with = "wait")]
    dry_run: bool,
}

#[derive(Args)]
struct ListArgs {
    /// Jobs per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=api::PAGE_SIZE_MAX))]
    limit: i64,
    /// Only jobs older than this id (the next page).
    #[arg(long, value_name = "ID")]
    before: Option<i64>,
    /// Only jobs in this state.
    #[arg(long, value_parser = ["queued", "running", "finished", "failed", "cancelled"])]
    state: Option<String>,
    /// Only jobs submitted in this last stretch of time (e.g. 90m, 2h, 7d) or since this UTC time
    /// (e.g. 2026-12-08T09:00Z).
    #[arg(long, value_name = "AGO|TIME", value_parser = parse_since)]
    since: Option<i64>,
}

#[derive(Args)]
struct OutputArgs {
    /// The job's id.
    id: i64,
    /// The replica whose archive (replicas count from 0).
    #[arg(long, default_value_t = 0)]
    replica: i64,
    /// Write it to this file (default: stdout, when that is not a terminal).
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct LogsArgs {
    /// The job's id.
    id: i64,
    /// Keep printing new output until the job ends; then exit as `job submit --wait` does (0
    /// when the job finished, else its code).
    #[arg(long, short = 'f')]
    follow: bool,
    /// Only this replica's output (replicas count from 0).
    #[arg(long)]
    replica: Option<i64>,
}

/// A job as flags describe it; everything the API's JobRequest holds.
#[derive(Args)]
#[command(group(ArgGroup::new("gpu_demand").args(["gpus", "gpu_share", "cu"])))]
pub(super) struct SpecArgs {
    /// A job file: YAML (docs/job-files.md), or the API's JobRequest as JSON (a `.json` name or a
    /// first `{`); `-` reads stdin. Flags override its fields.
    #[arg(value_name = "JOB_FILE")]
    job_file: Option<PathBuf>,
    /// The job file, given as an option.
    #[arg(long, short = 'f', value_name = "FILE", conflicts_with = "job_file")]
    file: Option<PathBuf>,
    /// Container image (needed unless --process or the job file names one).
    #[arg(long)]
    image: Option<String>,
    /// Run as a process on a bare-metal agent: the first word after `--` is the program, the
    /// rest its arguments.
    #[arg(long)]
    process: bool,
    /// A name for people.
    #[arg(long)]
    name: Option<String>,
    /// Whole GPUs per replica (1–16, of one node).
    #[arg(long, value_name = "N", value_parser = parse_gpus)]
    gpus: Option<u8>,
    /// A share of one GPU in thousandths (1–999; 250 = a quarter).
    #[arg(long, value_name = "MILLI", value_parser = clap::value_parser!(u16).range(1..=999))]
    gpu_share: Option<u16>,
    /// Compute units per replica (1.0 = one H100 SXM); the matcher picks GPU models to match.
    #[arg(long, value_name = "UNITS", value_parser = parse_compute_units)]
    cu: Option<String>,
    /// GPU models allowed (catalog names, e.g. H100-SXM5); repeat or separate by commas.
    #[arg(long = "gpu-model", value_name = "MODEL", value_delimiter = ',')]
    gpu_models: Vec<String>,
    /// Least GPU memory, MiB.
    #[arg(long, value_name = "MIB")]
    gpu_memory_mib_min: Option<u32>,
    /// CPU per replica, in thousandths of a core.
    #[arg(long, value_name = "MILLI")]
    cpu_milli: Option<u32>,
    /// Memory per replica, MiB.
    #[arg(long, value_name = "MIB")]
    memory_mib: Option<u64>,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(api::REPLICAS_MAX)))]
    replicas: Option<u32>,
    /// Where all replicas must be.
    #[arg(long, value_parser = ["node", "nvlink", "fabric", "site", "region", "any"])]
    topology: Option<String>,
    /// gold: reserved; silver: on demand; bronze: interruptible, the cheapest.
    #[arg(long, value_parser = ["gold", "silver", "bronze"])]
    tier: Option<String>,
    /// The workload's class (providers may refuse some).
    #[arg(long, value_parser = ["training", "inference", "batch", "eval"])]
    class: Option<String>,
    /// The most you pay per GPU-hour, in dollars (e.g. 2.50).
    #[arg(long, value_name = "DOLLARS", value_parser = parse_price)]
    max_price: Option<String>,
    /// May be preempted (bronze always may).
    #[arg(long)]
    preemptible: bool,
    /// Regions allowed; repeat or separate by commas (default: any).
    #[arg(long = "region", value_name = "REGION", value_delimiter = ',')]
    regions: Vec<String>,
    /// A dataset staged before the job starts: URL,DIGEST,SIZE_BYTES with DIGEST
    /// blake3:<hex> or sha256:<hex>; repeat for more.
    #[arg(long = "dataset", value_name = "URL,DIGEST,SIZE", value_parser = parse_dataset)]
    datasets: Vec<DatasetRequest>,
    /// Lowest node reliability accepted, 0–1.
    #[arg(long, value_name = "FRACTION", value_parser = parse_fraction)]
    min_reliability: Option<f64>,
    /// The longest the job may run, seconds (default 3600).
    #[arg(long, value_name = "SECONDS")]
    max_runtime_s: Option<u32>,
    /// A directory kept across preemptions and restarts (absolute, inside the job).
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<String>,
    /// How often the job checkpoints, seconds (helps the matcher pick what to preempt).
    #[arg(long, value_name = "SECONDS")]
    checkpoint_interval_s: Option<u32>,
    /// The job's network.
    #[arg(long, value_parser = ["none", "bridge"])]
    network: Option<String>,
    /// A gang's survivors when a lost replica is replaced: restart (default; they resume from the
    /// checkpoint with the new peers) or keep (left running; they re-rendezvous themselves).
    #[arg(long, value_parser = ["restart", "keep"])]
    gang_repair: Option<String>,
    /// How often a gang starts again in place after a replica fails (default 3).
    #[arg(long, value_name = "N")]
    max_restarts: Option<u32>,
    /// Whether a repair's idle seconds are billed to the survivors: bill (default) or pause.
    #[arg(long, value_parser = ["bill", "pause"])]
    repair_billing: Option<String>,
    /// An environment variable of the job; repeat for more.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// An idempotency token: submitting again with it returns the first job.
    #[arg(long, value_name = "TOKEN")]
    client_token: Option<String>,
    /// Where the agent PUTs each replica's $FALLOW_OUTPUT_DIR as a tar archive when it ends (an
    /// http(s) URL, e.g. presigned; `{replica}` in it becomes the replica's number). Without it
    /// the coordinator keeps the archive, up to 16 MiB: `fallow job output ID`.
    #[arg(long, value_name = "URL")]
    output_url: Option<String>,
    /// Run inside one of your reservations (`fallow reserve create`): on its nodes, within the
    /// GPUs it holds, once it starts, paid for by the booking. Whole GPUs only.
    #[arg(long, value_name = "ID")]
    reservation: Option<i64>,
    /// The command (after `--`); with --process, the program and its arguments.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

pub fn run(args: JobArgs) -> anyhow::Result<()> {
    // A job that flags cannot describe is refused before a key is looked for or anything sent.
    let connect = || Client::connect(&args.connection);
    match args.command {
        JobCommand::Submit(submit_args) => {
            let body = submit_args.spec.request(false)?;
            if submit_args.dry_run {
                output::print_json(&Value::Object(body));
                return Ok(());
            }
            let wait = submit_args.wait.then_some(submit_args.quiet);
            submit(&connect()?, body, wait)
        }
        JobCommand::Quote(spec) => {
            let body = spec.request(true)?;
            quote(&connect()?, body)
        }
        JobCommand::List(list_args) => list(&connect()?, &list_args),
        JobCommand::Show { id } => show(&connect()?, id),
        JobCommand::Logs(logs_args) => logs(&connect()?, &logs_args),
        JobCommand::Cancel { id } => cancel(&connect()?, id),
        JobCommand::Output(output_args) => job_output(&connect()?, &output_args),
    }
}

/// A job's end as the process's exit status: `job submit --wait` and `job logs --follow` exit
/// with `code` after saying `message` on stderr (`main` does both).
#[derive(Debug)]
pub struct JobExit {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for JobExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for JobExit {}

/// The exit codes of an ended job that did not finish, where it gave no code of its own.
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_NEVER_PLACED: u8 = 69;
pub const EXIT_PREEMPTED: u8 = 75;
pub const EXIT_CANCELLED: u8 = 130;

/// How an ended job exits the CLI: `Ok` when it finished, else a `JobExit` (see `--wait`).
fn job_exit(job: &JobView) -> anyhow::Result<()> {
    let last = job
        .leases
        .iter()
        .max_by_key(|lease| (lease.ended_at_us.unwrap_or(i64::MAX), lease.id));
    let code = match job.state.as_str() {
        "finished" => return Ok(()),
        "cancelled" => EXIT_CANCELLED,
        _ => match job.exit_code {
            // A shell's status is a byte; a code whose low byte is 0 still says "failed".
            Some(code) => match (code & 0xff) as u8 {
                0 => EXIT_FAILED,
                byte => byte,
            },
            None if job.leases.is_empty() => EXIT_NEVER_PLACED,
            None if last.is_some_and(|lease| lease.state == "preempted") => EXIT_PREEMPTED,
            None => EXIT_FAILED,
        },
    };
    let why = if job.state_reason.is_empty() {
        String::new()
    } else {
        format!(": {}", job.state_reason)
    };
    Err(JobExit {
        code,
        message: format!(
            "job {0} {1}{why} (exit {code})\n  → its output: fallow job logs {0}",
            job.id, job.state
        ),
    }
    .into())
}

/// `--since`: a stretch of time back from now (`node reclaim --for`'s form) or an RFC 3339 time,
/// as microseconds since the Unix epoch.
fn parse_since(text: &str) -> Result<i64, String> {
    if text.trim().starts_with(|c: char| c.is_ascii_digit()) && text.len() < 17 {
        let ago_s = super::node::parse_duration_s(text)?;
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_micros() as i64);
        return Ok(now_us.saturating_sub((ago_s as i64).saturating_mul(1_000_000)));
    }
    super::node::parse_time_us(text)
}

/// `wait`: None to return once submitted; Some(quiet) to wait for the end, printing the job's
/// output as it comes unless quiet.
fn submit(client: &Client, body: Map<String, Value>, wait: Option<bool>) -> anyhow::Result<()> {
    let answer = client.post("/v1/jobs", &Value::Object(body))?;
    let job: JobView = parse(&answer, "job")?;
    let Some(quiet) = wait else {
        if client.json {
            output::print_json(&answer);
        } else {
            println!("submitted job {} ({})", job.id, job.state);
            println!(
                "  follow it: fallow job show {0}  ·  fallow job logs {0} --follow",
                job.id
            );
        }
        return Ok(());
    };
    if !client.json {
        println!("submitted job {}", job.id);
        if !quiet {
            // Its output as it comes, then its end: `job logs --follow`.
            let follow = LogsArgs {
                id: job.id,
                follow: true,
                replica: None,
            };
            return logs(client, &follow);
        }
    }
    let (answer, job) = wait_for_end(client, job.id)?;
    if client.json {
        output::print_json(&answer);
    } else {
        print_job(&answer, &job);
    }
    job_exit(&job)
}

/// Polls a job until it ends, with a spinner that says what it is doing.
fn wait_for_end(client: &Client, id: i64) -> anyhow::Result<(Value, JobView)> {
    let mut spinner = Spinner::new(client.json);
    loop {
        let answer = client.get(&format!("/v1/jobs/{id}"), &[])?;
        let job: JobView = parse(&answer, "job")?;
        if is_final(&job.state) {
            spinner.clear();
            return Ok((answer, job));
        }
        let activity = activity(&job);
        let until = Instant::now() + POLL_EVERY;
        while Instant::now() < until {
            spinner.tick(&format!("job {id}: {activity}"));
            client.sleep(SPINNER_EVERY);
        }
    }
}

fn is_final(state: &str) -> bool {
    matches!(state, "finished" | "failed" | "cancelled")
}

/// What a job is doing now, in a few words.
fn activity(job: &JobView) -> String {
    let live: Vec<&api::LeaseView> = job
        .leases
        .iter()
        .filter(|lease| matches!(lease.state.as_str(), "pending" | "staging" | "running"))
        .collect();
    if job.state == "queued" || live.is_empty() {
        let why = job
            .explanation
            .as_deref()
            .and_then(|text| text.lines().next())
            .unwrap_or(job.state_reason.as_str());
        // The explanation counts the nodes that could take the job: "0 of 12 nodes: …".
        return if why.starts_with("0 of") {
            format!("queued, no node can take it now: {why}")
        } else {
            "queued, waiting for the next placement".to_string()
        };
    }
    let count = |state: &str| live.iter().filter(|lease| lease.state == state).count();
    let (pending, staging, running) = (count("pending"), count("staging"), count("running"));
    let nodes: std::collections::BTreeSet<i64> = live.iter().map(|lease| lease.node_id).collect();
    let nodes: Vec<String> = nodes.iter().map(i64::to_string).collect();
    let mut parts = Vec::new();
    if running > 0 {
        parts.push(format!("{running} running"));
    }
    if staging > 0 {
        parts.push(format!("{staging} staging (image and datasets)"));
    }
    if pending > 0 {
        parts.push(format!("{pending} waiting for the agent"));
    }
    format!("{} on node {}", parts.join(", "), nodes.join(", "))
}

fn list(client: &Client, args: &ListArgs) -> anyhow::Result<()> {
    let mut query = vec![("limit", args.limit.to_string())];
    if let Some(before) = args.before {
        query.push(("before", before.to_string()));
    }
    if let Some(state) = &args.state {
        query.push(("state", state.clone()));
    }
    if let Some(since_us) = args.since {
        query.push(("since_us", since_us.to_string()));
    }
    let answer = client.get("/v1/jobs", &query)?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let page: JobList = parse(&answer, "job list")?;
    if page.jobs.is_empty() {
        if args.state.is_some() || args.since.is_some() {
            println!("no jobs match");
        } else {
            println!("no jobs yet: submit one with `fallow job submit`");
        }
        return Ok(());
    }
    let mut table = Table::new(&[
        ("ID", Align::Right),
        ("NAME", Align::Left),
        ("STATE", Align::Left),
        ("TIER", Align::Left),
        ("GPUS", Align::Right),
        ("REPLICAS", Align::Right),
        ("MAX PRICE", Align::Right),
        ("SUBMITTED", Align::Left),
        ("REASON", Align::Left),
    ]);
    for job in &page.jobs {
        table.row(vec![
            job.id.to_string(),
            job.spec.name.clone(),
            job.state.clone(),
            job.tier.clone(),
            gpu_demand(&job.spec),
            job.spec.replicas.to_string(),
            price_text(&job.spec.max_price_per_gpu_hour),
            utc(job.submitted_at_us),
            shorten(&job.state_reason, 60),
        ]);
    }
    table.print();
    if let Some(before) = page.next_before {
        eprintln!("more: fallow job list --before {before}");
    }
    Ok(())
}

fn show(client: &Client, id: i64) -> anyhow::Result<()> {
    let answer = client.get(&format!("/v1/jobs/{id}"), &[])?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let job: JobView = parse(&answer, "job")?;
    print_job(&answer, &job);
    Ok(())
}

fn print_job(answer: &Value, job: &JobView) {
    let spec = &job.spec;
    let runtime = answer["spec"]["runtime"].as_str().unwrap_or("container");
    let mut pairs = vec![
        ("id", job.id.to_string()),
        ("name", spec.name.clone()),
        ("state", job.state.clone()),
    ];
    if !job.state_reason.is_empty() {
        pairs.push(("reason", job.state_reason.clone()));
    }
    pairs.extend([
        ("tier", format!("{} ({})", job.tier, spec.class)),
        ("runtime", runtime.to_string()),
        (
            if runtime == "process" { "program" } else { "image" },
            spec.image.clone(),
        ),
        ("command", shell_words(&spec.command)),
        (
            "resources",
            format!(
                "{} GPU × {} replica(s), topology {}",
                gpu_demand(spec),
                spec.replicas,
                spec.topology
            ),
        ),
        (
            "max price",
            format!("{}/GPU-hour", price_text(&spec.max_price_per_gpu_hour)),
        ),
        (
            "regions",
            if spec.regions.is_empty() {
                "any".to_string()
            } else {
                spec.regions.join(", ")
            },
        ),
        ("submitted", utc(job.submitted_at_us)),
        ("updated", utc(job.updated_at_us)),
        ("cost", dollars(job.cost_micros)),
        ("escrow", dollars(job.escrow_micros)),
    ]);
    if let Some(capacity) = &job.capacity {
        let said = match capacity.as_str() {
            "own" => "your own nodes (no market price)".to_string(),
            "reservation" => format!("inside reservation {} (paid by it)", spec.reservation.unwrap_or(0)),
            "market" => "the market (other providers' nodes, the auction's price)".to_string(),
            other => other.to_string(),
        };
        pairs.push(("placed on", said));
    }
    if let Some(dir) = &spec.checkpoint_dir {
        pairs.push(("checkpoints", dir.clone()));
    }
    if let Some(progress) = &job.progress {
        pairs.push((
            "progress",
            format!(
                "{} {} ({} per million)",
                progress.done,
                progress.unit,
                dollars(progress.cost_micros_per_million_units)
            ),
        ));
    }
    if let Some(explanation) = job.explanation.as_deref().filter(|text| !text.is_empty()) {
        pairs.push(("why queued", explanation.replace('\n', "\n            ")));
    }
    output::print_fields(&pairs);
    if job.leases.is_empty() {
        return;
    }
    println!();
    let mut table = Table::new(&[
        ("LEASE", Align::Right),
        ("REPLICA", Align::Right),
        ("NODE", Align::Right),
        ("GPU", Align::Left),
        ("GPUS", Align::Left),
        ("STATE", Align::Left),
        ("PRICE", Align::Right),
        ("REGION", Align::Left),
        ("STARTED", Align::Left),
        ("ENDED", Align::Left),
        ("END REASON", Align::Left),
    ]);
    // Reasons too long for a cell, in full under the table: the cause of a failure is often
    // at the end (an image's pull, a program's path).
    let mut reasons = Vec::new();
    for lease in &job.leases {
        let reason = if fits_a_cell(&lease.end_reason, END_REASON_CELL_CHARS_MAX) {
            lease.end_reason.clone()
        } else {
            reasons.push(format!(
                "lease {}: {}",
                lease.id,
                lease.end_reason.replace('\n', "\n  ")
            ));
            "(below)".to_string()
        };
        let indices: Vec<String> = lease.gpu_indices.iter().map(u8::to_string).collect();
        let share = if lease.gpu_milli < 1000 {
            format!(" ×{}‰", lease.gpu_milli)
        } else {
            String::new()
        };
        table.row(vec![
            lease.id.to_string(),
            lease.replica.to_string(),
            lease.node_id.to_string(),
            lease.gpu_model.clone(),
            format!("{}{share}", indices.join(",")),
            lease.state.clone(),
            dollars(lease.price_micros_per_gpu_hour),
            lease.region.clone(),
            utc(lease.created_at_us),
            utc_or_dash(lease.ended_at_us),
            reason,
        ]);
    }
    table.print();
    if !reasons.is_empty() {
        println!();
        for reason in reasons {
            println!("{reason}");
        }
    }
    let outputs: Vec<String> = job
        .leases
        .iter()
        .filter_map(|lease| {
            let output = lease.output.as_ref()?;
            let place = if output.kept {
                format!("fallow job output {} --replica {} > out.tar", job.id, lease.replica)
            } else if let Some(at) = output.expired_at_us {
                format!("removed at {}, past the coordinator's retention", model::time::utc(at))
            } else {
                "sent to its output URL".to_string()
            };
            Some(format!(
                "replica {}: {} bytes, {} ({place})",
                lease.replica, output.size_bytes, output.digest
            ))
        })
        .collect();
    if !outputs.is_empty() {
        println!();
        println!("output archives ($FALLOW_OUTPUT_DIR):");
        for line in outputs {
            println!("  {line}");
        }
    }
}

fn fits_a_cell(text: &str, chars_max: usize) -> bool {
    !text.contains('\n') && text.chars().count() <= chars_max
}

/// What `fallow job logs` says on stderr when a job has no output: why, from the job's state
/// and the states of its leases (of one replica when asked for one).
fn no_output_yet(job_state: &str, state_reason: &str, lease_states: &[&str]) -> String {
    let any = |state: &str| lease_states.contains(&state);
    match job_state {
        "finished" | "failed" | "cancelled" if state_reason.is_empty() => {
            format!("no output: the job {job_state} without writing any")
        }
        "finished" | "failed" | "cancelled" => {
            format!("no output: the job {job_state} without writing any ({state_reason})")
        }
        _ if any("running") => "no output yet: the job runs and has written nothing so far".to_string(),
        _ if any("staging") => "no output yet: staging (the image and datasets)".to_string(),
        _ if any("pending") => "no output yet: waiting for the node's agent to start it".to_string(),
        _ => "no output yet: the job is queued".to_string(),
    }
}

fn logs(client: &Client, args: &LogsArgs) -> anyhow::Result<()> {
    let path = format!("/v1/jobs/{}/logs", args.id);
    let mut after = 0i64;
    let mut collected = Vec::new();
    let mut ending = false;
    // Whether any output was printed, or why there is none was said.
    let mut said_something = false;
    let mut stdout = std::io::stdout();
    // The job as last read, when following: how it ended.
    let mut last_read: Option<JobView> = None;
    loop {
        let answer = client.get(&path, &[("after", after.to_string()), ("limit", LOG_PAGE.to_string())])?;
        let page: JobLogs = parse(&answer, "logs")?;
        let full = page.chunks.len() as i64 == LOG_PAGE;
        after = page.next_after;
        for (chunk, raw) in page
            .chunks
            .iter()
            .zip(answer["chunks"].as_array().into_iter().flatten())
        {
            if args.replica.is_some_and(|replica| replica != chunk.replica) {
                continue;
            }
            match (client.json, args.follow) {
                (true, true) => writeln!(stdout, "{raw}")?,
                (true, false) => collected.push(raw.clone()),
                (false, _) => {
                    write!(stdout, "{}", chunk.text)?;
                    said_something |= !chunk.text.is_empty();
                }
            }
        }
        stdout.flush()?;
        if full {
            continue;
        }
        if !args.follow || ending {
            break;
        }
        // A job's last output may land just before it ends: read once more after the end.
        let job: JobView = parse(&client.get(&format!("/v1/jobs/{}", args.id), &[])?, "job")?;
        if !said_something && !client.json {
            eprintln!("{}", no_output_of(&job, args.replica));
            said_something = true;
        }
        if is_final(&job.state) {
            ending = true;
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) && !client.json {
                eprintln!("\n(job {} {})", job.id, job.state);
            }
            last_read = Some(job);
            continue;
        }
        client.sleep(POLL_EVERY);
    }
    if client.json && !args.follow {
        output::print_json(&json!({"job_id": args.id, "chunks": collected, "next_after": after}));
    }
    if !said_something && !client.json && !args.follow {
        let job: JobView = parse(&client.get(&format!("/v1/jobs/{}", args.id), &[])?, "job")?;
        eprintln!("{}", no_output_of(&job, args.replica));
    }
    match last_read {
        Some(job) => job_exit(&job),
        None => Ok(()),
    }
}

/// `no_output_yet` for `job` (and only `replica`'s leases when one is asked for), with the
/// last lease's end reason when it gave one (it says more than the job's: why a replica failed).
fn no_output_of(job: &JobView, replica: Option<i64>) -> String {
    let leases: Vec<&api::LeaseView> = job
        .leases
        .iter()
        .filter(|lease| replica.is_none_or(|replica| lease.replica == replica))
        .collect();
    let lease_states: Vec<&str> = leases.iter().map(|lease| lease.state.as_str()).collect();
    let reason = leases
        .iter()
        .rev()
        .map(|lease| lease.end_reason.as_str())
        .find(|reason| !reason.is_empty())
        .unwrap_or(&job.state_reason);
    no_output_yet(&job.state, reason, &lease_states)
}

fn job_output(client: &Client, args: &OutputArgs) -> anyhow::Result<()> {
    if args.output.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        bail!(
            "an output archive is a tar file: give -o FILE, or pipe it (`fallow job output {} | tar -x`)",
            args.id
        );
    }
    let (headers, archive) = client.get_bytes(
        &format!("/v1/jobs/{}/output", args.id),
        &[("replica", args.replica.to_string())],
    )?;
    let digest = headers
        .get("x-fallow-output-digest")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_string();
    let read = format!("blake3:{}", blake3::hash(&archive).to_hex());
    if !digest.is_empty() && digest != read {
        bail!("the archive came damaged: its digest is {read}, the coordinator's {digest}");
    }
    match &args.output {
        Some(path) => {
            std::fs::write(path, &archive).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("{} bytes ({read}) to {}", archive.len(), path.display());
        }
        None => std::io::stdout().write_all(&archive)?,
    }
    Ok(())
}

fn cancel(client: &Client, id: i64) -> anyhow::Result<()> {
    let answer = client.send(Method::POST, &format!("/v1/jobs/{id}/cancel"), &[], None)?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let job: JobView = parse(&answer, "job")?;
    println!("job {} {}; escrow released", job.id, job.state);
    Ok(())
}

fn quote(client: &Client, body: Map<String, Value>) -> anyhow::Result<()> {
    let answer = client.post("/v1/jobs/quote", &Value::Object(body))?;
    if client.json {
        output::print_json(&answer);
        return Ok(());
    }
    let quote: QuoteView = parse(&answer, "quote")?;
    let price = match quote.price_micros_per_gpu_hour {
        Some(price) => format!("{}/GPU-hour", dollars(price)),
        None => "none: no node can take it now".to_string(),
    };
    let mut pairs = vec![
        ("price now", price),
        (
            "nodes that fit",
            format!("{} of {}", quote.nodes_feasible, quote.nodes_total),
        ),
        ("GPUs on them", quote.gpus_feasible.to_string()),
    ];
    if let Some(own) = quote.own_nodes_feasible {
        let said = match own {
            0 => "none can take it now: it goes to the market".to_string(),
            own => format!("{own} can take it now: it runs there at no price"),
        };
        pairs.push(("your own nodes", said));
    }
    if let Some(holding) = quote.nodes_with_data {
        pairs.push((
            "with its data",
            format!("{holding} of them hold every dataset (the rest fetch them first)"),
        ));
    }
    if !quote.explanation.is_empty() {
        pairs.push(("why not more", quote.explanation.replace('\n', "\n              ")));
    }
    output::print_fields(&pairs);
    Ok(())
}

impl SpecArgs {
    /// The JobRequest body: the job file's fields, then the flags over them. `for_quote` fills
    /// in an image when none is given, since a quote does not depend on it.
    pub(super) fn request(&self, for_quote: bool) -> anyhow::Result<Map<String, Value>> {
        let body = self.read_file(Purpose::Job)?.map(|file| file.job).unwrap_or_default();
        self.over(body, for_quote)
    }

    /// The job file, when one is given: its JobRequest fields and, read as a service's, the
    /// ServiceRequest's own.
    pub(super) fn read_file(&self, purpose: Purpose) -> anyhow::Result<Option<JobFile>> {
        match self.job_file.as_ref().or(self.file.as_ref()) {
            Some(path) => read_job_file(path, purpose).map(Some),
            None => Ok(None),
        }
    }

    /// The job's name as flags give it.
    pub(super) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `body` (a job file's fields, or a service's replica as it is) with the flags over it.
    pub(super) fn over(&self, mut body: Map<String, Value>, for_quote: bool) -> anyhow::Result<Map<String, Value>> {
        let mut set = |key: &str, value: Value| {
            body.insert(key.to_string(), value);
        };
        if let Some(name) = &self.name {
            set("name", json!(name));
        }
        if let Some(models) = non_empty(&self.gpu_models) {
            set("gpu_models", json!(models));
        }
        if let Some(mib) = self.gpu_memory_mib_min {
            set("gpu_memory_mib_min", json!(mib));
        }
        if let Some(milli) = self.cpu_milli {
            set("cpu_milli", json!(milli));
        }
        if let Some(mib) = self.memory_mib {
            set("memory_mib", json!(mib));
        }
        if let Some(replicas) = self.replicas {
            set("replicas", json!(replicas));
        }
        if let Some(topology) = &self.topology {
            set("topology", json!(topology));
        }
        if let Some(tier) = &self.tier {
            set("tier", json!(tier));
        }
        if let Some(class) = &self.class {
            set("class", json!(class));
        }
        if let Some(price) = &self.max_price {
            set("max_price_per_gpu_hour", json!(price));
        }
        if self.preemptible {
            set("preemptible", json!(true));
        }
        if let Some(regions) = non_empty(&self.regions) {
            set("regions", json!(regions));
        }
        if let Some(datasets) = non_empty(&self.datasets) {
            set("datasets", serde_json::to_value(datasets).expect("datasets serialise"));
        }
        if let Some(fraction) = self.min_reliability {
            set("min_reliability", json!(fraction));
        }
        if let Some(seconds) = self.max_runtime_s {
            set("max_runtime_s", json!(seconds));
        }
        if let Some(dir) = &self.checkpoint_dir {
            set("checkpoint_dir", json!(dir));
        }
        if let Some(seconds) = self.checkpoint_interval_s {
            set("checkpoint_interval_s", json!(seconds));
        }
        if let Some(network) = &self.network {
            set("network", json!(network));
        }
        if let Some(token) = &self.client_token {
            set("client_token", json!(token));
        }
        if let Some(url) = &self.output_url {
            set("output_url", json!(url));
        }
        if let Some(id) = self.reservation {
            set("reservation", json!(id));
        }
        if let Some(mode) = &self.gang_repair {
            set("gang_repair", json!(mode));
        }
        if let Some(restarts) = self.max_restarts {
            set("max_restarts", json!(restarts));
        }
        if let Some(mode) = &self.repair_billing {
            set("repair_billing", json!(mode));
        }
        if !self.env.is_empty() {
            let mut env = match body.remove("env") {
                Some(Value::Object(env)) => env,
                _ => Map::new(),
            };
            for (key, value) in &self.env {
                env.insert(key.clone(), json!(value));
            }
            body.insert("env".to_string(), Value::Object(env));
        }
        let demand = match (self.gpus, self.gpu_share, &self.cu) {
            (Some(count), _, _) => Some(("gpus", json!(count))),
            (_, Some(milli), _) => Some(("gpu_share_milli", json!(milli))),
            (_, _, Some(units)) => Some(("compute_units", json!(units))),
            _ => None,
        };
        if let Some((key, value)) = demand {
            // The flag replaces whatever GPU demand the file gave.
            for other in ["gpus", "gpu_share_milli", "compute_units"] {
                body.remove(other);
            }
            body.insert(key.to_string(), value);
        }
        if self.process {
            body.insert("runtime".to_string(), json!("process"));
            let (program, arguments) = match (&self.image, self.command.split_first()) {
                (Some(program), _) => (program.clone(), self.command.clone()),
                (None, Some((program, arguments))) => (program.clone(), arguments.to_vec()),
                (None, None) if body.contains_key("image") => {
                    (body["image"].as_str().unwrap_or_default().to_string(), Vec::new())
                }
                (None, None) => bail!(
                    "--process needs the program after `--`, e.g. `fallow job submit --process --gpus 1 --tier silver \
                     --max-price 5 -- sh -c 'echo hi'`"
                ),
            };
            body.insert("image".to_string(), json!(program));
            if !arguments.is_empty() || !body.contains_key("command") {
                body.insert("command".to_string(), json!(arguments));
            }
        } else {
            if let Some(image) = &self.image {
                body.insert("image".to_string(), json!(image));
            }
            if !self.command.is_empty() {
                body.insert("command".to_string(), json!(self.command));
            }
        }
        if !body.contains_key("image") {
            if for_quote {
                body.insert("image".to_string(), json!("quote"));
            } else {
                bail!(
                    "give --image IMAGE for a container job, or --process with the program after `--` \
                     (or `resources.image_id` or `runtime: process` in a job file)"
                );
            }
        }
        if !body.contains_key("tier") {
            bail!("give --tier gold, silver or bronze (or `tier` in the job file)");
        }
        if !body.contains_key("max_price_per_gpu_hour") {
            bail!(
                "give --max-price DOLLARS, the most you pay per GPU-hour, e.g. --max-price 2.50 \
                 (or `max_price` in a job file); `fallow job quote` says what a job would pay now"
            );
        }
        Ok(body)
    }
}

fn non_empty<T>(items: &[T]) -> Option<&[T]> {
    (!items.is_empty()).then_some(items)
}

fn read_job_file(path: &PathBuf, purpose: Purpose) -> anyhow::Result<JobFile> {
    let stdin = path.as_os_str() == "-";
    let shown = if stdin {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    };
    let mut text = String::new();
    if stdin {
        std::io::stdin()
            .take(JOB_FILE_BYTES_MAX + 1)
            .read_to_string(&mut text)
            .context("reading the job from stdin")?;
    } else {
        std::fs::File::open(path)
            .and_then(|file| file.take(JOB_FILE_BYTES_MAX + 1).read_to_string(&mut text))
            .with_context(|| format!("reading the job file {shown}"))?;
    }
    if text.len() as u64 > JOB_FILE_BYTES_MAX {
        bail!("the job file {shown} is over {JOB_FILE_BYTES_MAX} bytes, the API's limit");
    }
    if path.extension().is_some_and(|extension| extension == "json") || job_file::is_json(&text) {
        return match serde_json::from_str(&text) {
            Ok(Value::Object(job)) => Ok(JobFile { job, service: None }),
            Ok(_) => bail!("the job file {shown} must hold one JSON object (the API's JobRequest)"),
            Err(error) => bail!("{shown}:{}:{}: not JSON: {error}", error.line(), error.column()),
        };
    }
    job_file::parse(&text, purpose).map_err(|fault| anyhow::anyhow!("{shown}:{fault}"))
}

/// How much GPU a replica asks for, in words.
fn gpu_demand(spec: &api::JobRequest) -> String {
    match (spec.gpus, spec.gpu_share_milli, &spec.compute_units) {
        (Some(count), _, _) => count.to_string(),
        (_, Some(milli), _) => format!("{milli}‰"),
        (_, _, Some(units)) => format!("{units} CU"),
        _ => "0".to_string(),
    }
}

fn price_text(dollars_text: &str) -> String {
    model::Micros::parse_dollars(dollars_text).map_or_else(|| dollars_text.to_string(), |price| price.to_string())
}

/// Arguments as a shell would need them typed.
fn shell_words(words: &[String]) -> String {
    let quoted: Vec<String> = words
        .iter()
        .map(|word| {
            if !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect();
    quoted.join(" ")
}

fn shorten(text: &str, chars_max: usize) -> String {
    let first_line = text.lines().next().unwrap_or("");
    if first_line.chars().count() <= chars_max && !text.contains('\n') {
        return first_line.to_string();
    }
    let mut short: String = first_line.chars().take(chars_max - 1).collect();
    short.push('…');
    short
}

fn parse_price(text: &str) -> Result<String, String> {
    match model::Micros::parse_dollars(text) {
        Some(price) if price.0 > 0 && price.0 <= api::PRICE_MICROS_MAX => {
            Ok(text.trim().trim_start_matches('$').into())
        }
        _ => Err(format!(
            "{text:?} is not a price in dollars between 0.000001 and 1000 (e.g. 2.50)"
        )),
    }
}

fn parse_compute_units(text: &str) -> Result<String, String> {
    match model::Micros::parse_dollars(text) {
        Some(units) if units.0 > 0 && units.0 <= 64_000_000 => Ok(text.trim().to_string()),
        _ => Err(format!(
            "{text:?} is not a number of compute units between 0.001 and 64 (e.g. 2.5)"
        )),
    }
}

/// Whole GPUs per replica: one node holds at most 16, so a larger count points to replicas.
fn parse_gpus(text: &str) -> Result<u8, String> {
    match text.trim().parse::<u64>() {
        Ok(gpus @ 1..=16) => Ok(gpus as u8),
        Ok(0) => Err("0 is not in 1..=16 (leave --gpus out for a CPU-only job)".into()),
        Ok(gpus) => {
            let per = (1..=8u64).rev().find(|per| gpus % per == 0).unwrap_or(8);
            Err(format!(
                "{gpus} is more than one node holds (1..=16); ask for more replicas instead (--replicas {} --gpus {per})",
                gpus.div_ceil(per)
            ))
        }
        Err(_) => Err(format!("{text:?} is not a whole number of GPUs (1..=16)")),
    }
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
        _ => Err(format!("{text:?} is not a number between 0 and 1 (e.g. 0.95)")),
    }
}

fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

pub(super) fn parse_dataset(text: &str) -> Result<DatasetRequest, String> {
    let bad = || format!("{text:?} is not URL,DIGEST,SIZE_BYTES (e.g. https://host/data.tar,blake3:<64 hex>,1048576)");
    let mut parts = text.rsplitn(3, ',');
    let (Some(size), Some(digest), Some(url)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let size_bytes = size.trim().parse().map_err(|_| bad())?;
    if api::dataset_content_id(digest.trim()).is_none() {
        return Err(format!(
            "dataset digest {digest:?} is not blake3:<64 hex> or sha256:<64 hex>"
        ));
    }
    Ok(DatasetRequest {
        url: url.trim().to_string(),
        digest: digest.trim().to_string(),
        size_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Probe {
        #[command(flatten)]
        spec: SpecArgs,
    }

    /// The request body of a command line (split at spaces, then `extra`), or its error.
    fn body(line: &str, extra: &[&str]) -> Result<Value, String> {
        let args = std::iter::once("submit")
            .chain(line.split_whitespace())
            .chain(extra.iter().copied());
        let probe = Probe::try_parse_from(args).map_err(|error| error.to_string())?;
        probe
            .spec
            .request(false)
            .map(Value::Object)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn a_process_job_names_its_program_first() {
        let body = body("--gpus 1 --tier silver --max-price 5 --process -- sh -c", &["echo hi"]).unwrap();
        assert_eq!(
            body,
            json!({"gpus": 1, "tier": "silver", "max_price_per_gpu_hour": "5", "runtime": "process",
                   "image": "sh", "command": ["-c", "echo hi"]})
        );
    }

    #[test]
    fn a_container_job_sends_no_runtime() {
        let line = "--image busybox --gpu-share 250 --tier bronze --max-price $1.5 --region eu-west,eu-north \
                    --env A=b=c -- echo hi";
        assert_eq!(
            body(line, &[]).unwrap(),
            json!({"image": "busybox", "gpu_share_milli": 250, "tier": "bronze", "max_price_per_gpu_hour": "1.5",
                   "regions": ["eu-west", "eu-north"], "env": {"A": "b=c"}, "command": ["echo", "hi"]})
        );
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        for (line, says) in [
            ("--gpus 0", "0 is not in 1..=16"),
            ("--gpus 64", "ask for more replicas instead (--replicas 8 --gpus 8)"),
            ("--gpus 12x", "not a whole number of GPUs"),
            ("--gpus 1 --gpu-share 100", "cannot be used with"),
            ("--cu lots", "compute units"),
            ("--max-price cheap", "not a price"),
            ("--tier platinum", "possible values: gold, silver, bronze"),
            ("--dataset https://h/x,md5:00,1", "blake3"),
            ("--tier gold --max-price 1", "--image"),
            ("--image x --max-price 1", "--tier"),
            ("--image x --tier gold", "--max-price"),
            ("--process --tier gold --max-price 1", "program after `--`"),
        ] {
            let error = body(line, &[]).unwrap_err();
            assert!(error.contains(says), "{line}: {error}");
        }
    }

    #[test]
    fn no_output_says_why_from_the_job_and_its_leases() {
        for (job, reason, leases, says) in [
            ("queued", "", &[][..], "no output yet: the job is queued"),
            (
                "running",
                "",
                &["staging"][..],
                "no output yet: staging (the image and datasets)",
            ),
            (
                "running",
                "",
                &["preempted", "pending"][..],
                "no output yet: waiting for the node's agent to start it",
            ),
            (
                "running",
                "",
                &["staging", "running"][..],
                "no output yet: the job runs and has written nothing so far",
            ),
            // Between a preemption and its next placement.
            ("running", "", &["preempted"][..], "no output yet: the job is queued"),
            (
                "failed",
                "image 'x' could not be pulled",
                &["failed"][..],
                "no output: the job failed without writing any (image 'x' could not be pulled)",
            ),
            (
                "finished",
                "",
                &["finished"][..],
                "no output: the job finished without writing any",
            ),
        ] {
            assert_eq!(no_output_yet(job, reason, leases), says);
        }
    }

    #[test]
    fn words_are_quoted_for_a_shell() {
        let words = ["-c".to_string(), "echo hi".to_string(), "it's".to_string()];
        assert_eq!(shell_words(&words), r"-c 'echo hi' 'it'\''s'");
    }
}
