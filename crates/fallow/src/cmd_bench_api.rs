//! `fallow bench api`: the coordinator's HTTP API under a fleet's load. A coordinator runs in
//! this process on 127.0.0.1:0; a load generator in the same process drives it over loopback
//! HTTP: signed heartbeats from every node at the rate a fleet of that size sends them, and job
//! submissions, both paced open-loop (latency counts from the scheduled send time, so a slow
//! server cannot hide its queue by slowing the generator down). One JSON object with `--json`.
//!
//! Setup (accounts, credit, registering every node, one heartbeat from each node so the fleet is
//! online and the matcher's view settled) is timed apart and reported as `setup_secs`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use api::{
    CreditRequest, GpuTelemetry, HeartbeatRequest, JobRequest, NewAccountRequest, NewAccountResponse,
    NodeBatchRegistration, NodeBatchView, NodeRegistration, PolicyDoc,
};
use clap::Args;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use trust::NodeKey;

/// GPUs per benchmark node (a fleet of `--nodes` has eight times as many GPUs).
const GPUS_PER_NODE: u8 = 8;
/// Nodes per fabric within a site: 1,024 GPUs behind one switch fabric.
const NODES_PER_FABRIC: usize = 128;
/// Sites per region (5 regions, 20 sites).
const SITES_PER_REGION: usize = 4;
/// Share of nodes, in thousandths, that also sell gold (all sell silver and bronze).
const GOLD_SELLERS_PERMILLE: u32 = 300;
/// Registration batches in flight at once during setup.
const REGISTER_BATCHES_IN_FLIGHT: usize = 4;
/// Warm-up heartbeats in flight (closed loop, as fast as the server answers).
const WARMUP_IN_FLIGHT_MAX: usize = 512;
/// The most requests of one kind the timed phase may keep in flight (`--in-flight`).
const IN_FLIGHT_MAX: usize = 65_536;
/// A generous guess of the time to sign one heartbeat on one core, to start the timed phase
/// after the signing is done.
const SIGN_AHEAD_COST: Duration = Duration::from_micros(80);
/// Attempts of one setup request refused with 429 or 503 before the bench gives up.
const SETUP_ATTEMPTS_MAX: u32 = 50;
/// A request that takes longer than this counts as a `timeout` error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// After the timed window, requests still scheduled but unsent are sent for at most this long;
/// the rest count as `unsent` errors (with their waiting time so far as their latency).
const BACKLOG_GRACE: Duration = Duration::from_secs(10);
/// The matcher's view counts as settled after its rebuild counter holds still this long.
const SETTLE_QUIET: Duration = Duration::from_secs(1);
const SETTLE_MAX: Duration = Duration::from_secs(60);
/// Dollars credited per deposit (the API's largest) and deposits made.
const CREDIT_DOLLARS: &str = "10000000.00";
const CREDIT_DEPOSITS: u32 = 10;
/// How long the bench waits for the coordinator to stop after the timed phase.
const STOP_WAIT_MAX: Duration = Duration::from_secs(30);

/// (catalog name, weight, silver ask, bronze ask, gold ask), asks in micro-dollars per GPU-hour.
const GPU_MODELS: [(&str, u32, i64, i64, i64); 4] = [
    ("H100-SXM5", 35, 2_400_000, 1_600_000, 3_200_000),
    ("A100-SXM4-80GB", 30, 1_400_000, 900_000, 1_900_000),
    ("L40", 20, 900_000, 550_000, 1_200_000),
    ("RTX-4090", 15, 450_000, 280_000, 600_000),
];

/// (region, latitude, longitude) of the five regions.
const REGIONS: [(&str, f64, f64); 5] = [
    ("us-east", 39.0, -77.5),
    ("us-west", 45.6, -121.2),
    ("eu-west", 53.3, -6.3),
    ("eu-central", 50.1, 8.7),
    ("ap-northeast", 35.7, 139.7),
];

#[derive(Args, Clone, Debug)]
pub struct ApiArgs {
    /// Nodes in the fleet (8 GPUs each).
    #[arg(long, default_value_t = 125_000)]
    nodes: usize,
    /// Length of the timed phase.
    #[arg(long, default_value_t = 20)]
    duration_secs: u64,
    /// sqlite://PATH (the file is deleted first) or postgres://… (must be an empty database).
    #[arg(long)]
    database: String,
    /// Heartbeats per second (default: one per node every 10 s, nodes / 10).
    #[arg(long)]
    heartbeat_rate: Option<f64>,
    /// Job submissions per second.
    #[arg(long, default_value_t = 1000.0)]
    submit_rate: f64,
    /// Requests of each kind in flight at once during the timed phase.
    #[arg(long, default_value_t = 512)]
    in_flight: usize,
    /// Seed of the fleet's spread and the job mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The coordinator's heartbeat timeout. Longer than the server's default (45 s) so that nodes
    /// warmed up early in a long setup are still online when the timed phase reaches them.
    #[arg(long, default_value_t = 600_000)]
    heartbeat_timeout_ms: u64,
    /// Where the coordinator writes admin.key (default: a fresh folder in the temp directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &ApiArgs) -> anyhow::Result<()> {
    ensure!(args.nodes > 0, "--nodes must be positive");
    ensure!(args.duration_secs > 0, "--duration-secs must be positive");
    ensure!(
        (1..=IN_FLIGHT_MAX).contains(&args.in_flight),
        "--in-flight must be 1–{IN_FLIGHT_MAX}"
    );
    let heartbeat_rate = args.heartbeat_rate.unwrap_or(args.nodes as f64 / 10.0);
    ensure!(
        heartbeat_rate > 0.0 && heartbeat_rate.is_finite(),
        "--heartbeat-rate must be positive"
    );
    ensure!(
        args.submit_rate > 0.0 && args.submit_rate.is_finite(),
        "--submit-rate must be positive"
    );
    init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(bench(args, heartbeat_rate));
    runtime.shutdown_timeout(Duration::from_secs(5));
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&report);
    }
    Ok(())
}

/// Server warnings (a failed batch write, say) go to stderr; FALLOW_LOG overrides the level.
fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("FALLOW_LOG").unwrap_or_else(|_| "warn,sqlx::query=error".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn print_summary(report: &Value) {
    let field = |name: &str| report.get(name).cloned().unwrap_or(Value::Null);
    println!(
        "{} nodes on {}, {} s, {} cores (setup {} s)",
        field("nodes"),
        field("database"),
        field("duration_secs"),
        field("cores"),
        field("setup_secs")
    );
    println!(
        "heartbeats: {}/s (target {}), p50 {} ms, p99 {} ms",
        field("heartbeats_per_sec"),
        field("heartbeat_target_per_sec"),
        field("heartbeat_p50_ms"),
        field("heartbeat_p99_ms")
    );
    println!(
        "submits:    {}/s (target {}), p50 {} ms, p99 {} ms",
        field("submits_per_sec"),
        field("submit_target_per_sec"),
        field("submit_p50_ms"),
        field("submit_p99_ms")
    );
    println!(
        "grants:     {}/s, submit to grant p50 {} ms, p99 {} ms, not granted {}",
        field("grants_per_sec"),
        field("submit_to_grant_p50_ms"),
        field("submit_to_grant_p99_ms"),
        field("not_granted")
    );
    println!("registrations: {}/s", field("registrations_per_sec"));
    println!("errors: {}", field("errors"));
}

/// Which backend the URL names, after making sure the bench starts from an empty database.
async fn prepare_database(url: &str) -> anyhow::Result<&'static str> {
    if let Some(rest) = url.strip_prefix("sqlite:") {
        let path = rest.strip_prefix("//").unwrap_or(rest);
        let path = path.split('?').next().unwrap_or(path);
        ensure!(!path.is_empty(), "--database sqlite://PATH needs a path");
        for suffix in ["", "-wal", "-shm"] {
            let file = format!("{path}{suffix}");
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error).with_context(|| format!("removing the old database file {file}")),
            }
        }
        return Ok("sqlite");
    }
    ensure!(
        url.starts_with("postgres://") || url.starts_with("postgresql://"),
        "--database must be sqlite://PATH or postgres://…, got {url:?}"
    );
    // The bench registers nodes and reads the admin key that only a first start writes, so it
    // needs a database no coordinator has used: it never deletes anything itself.
    let store = store::Store::open(url)
        .await
        .with_context(|| format!("opening {url}"))?;
    let accounts = store.accounts().await.context("counting accounts")?;
    let nodes = store.nodes_version().await.context("counting nodes")?.highest_id;
    store.close().await;
    if !accounts.is_empty() || nodes > 0 {
        bail!(
            "the PostgreSQL database already holds {} accounts and {nodes} nodes; the API bench needs a fresh, \
             empty database (e.g. psql -c 'CREATE DATABASE bench_api_2') and never deletes data itself",
            accounts.len()
        );
    }
    Ok("postgres")
}

/// Process CPU time (user + system) in seconds, from /proc (Linux reports it in 1/100 s).
fn process_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    Some((user + system) / 100.0)
}

/// The whole machine's (busy, total) CPU time in 1/100 s, from /proc/stat: other processes'
/// load shows as machine use above this process's own.
fn machine_cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line.split_whitespace().filter_map(|field| field.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal …
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((total - idle, total))
}

fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

fn dollars(micros: i64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

async fn bench(args: &ApiArgs, heartbeat_rate: f64) -> anyhow::Result<Value> {
    let database = prepare_database(&args.database).await?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("fallow-bench-api-{}", std::process::id())));
    let key_file = data_dir.join(server::ADMIN_KEY_FILE);
    if key_file.exists() {
        std::fs::remove_file(&key_file).with_context(|| format!("removing the old {}", key_file.display()))?;
    }
    let config = server::Config {
        listen: "127.0.0.1:0".to_string(),
        data_dir: data_dir.clone(),
        heartbeat_timeout_ms: args.heartbeat_timeout_ms,
        // The fleet is new: no provider has the month of history the gold badge needs, so, as
        // `fallow server --gold-without-badge` does for trials, gold work may go to any node;
        // else the gold fifth of the job mix would only wait.
        gold_needs_badge: false,
        ..server::Config::default()
    };
    let setup_started = Instant::now();
    let running = server::start(&args.database, config)
        .await
        .map_err(|error| anyhow::anyhow!("{error}"))
        .with_context(|| format!("starting the coordinator on {}", args.database))?;
    let result = drive(args, heartbeat_rate, database, &running, &key_file, setup_started).await;
    // A reconcile pass in progress (taking thousands of silent nodes offline, say) finishes
    // before the loop sees the stop; the results do not wait for it.
    if tokio::time::timeout(STOP_WAIT_MAX, running.stop()).await.is_err() {
        eprintln!(
            "fallow bench api: the coordinator did not stop within {} s; leaving it",
            STOP_WAIT_MAX.as_secs()
        );
    }
    if args.data_dir.is_none() {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    result
}

/// The server's counters, to report what it did during the timed phase.
fn server_counters(running: &server::Running) -> BTreeMap<&'static str, u64> {
    let metrics = &running.state.metrics;
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    BTreeMap::from([
        ("jobs_submitted", load(&metrics.jobs_submitted)),
        ("heartbeats", load(&metrics.heartbeats)),
        ("placements", load(&metrics.placements)),
        ("leases_granted", load(&metrics.leases_granted)),
        ("leases_lost", load(&metrics.leases_lost)),
        ("reconcile_passes", load(&metrics.reconcile_passes)),
        ("view_rebuilds", load(&metrics.rebuilds)),
        ("signatures_refused", load(&metrics.signatures_refused)),
    ])
}

/// The accounts, keys and nodes that setup made.
struct Fleet {
    client: reqwest::Client,
    base: String,
    tenant_key: String,
    node_ids: Vec<i64>,
    node_keys: Vec<NodeKey>,
    /// Each submission's job and when its acknowledgement came (µs, the coordinator's clock).
    acks: Mutex<Vec<(i64, i64)>>,
}

async fn drive(
    args: &ApiArgs,
    heartbeat_rate: f64,
    database: &'static str,
    running: &server::Running,
    key_file: &Path,
    setup_started: Instant,
) -> anyhow::Result<Value> {
    let admin_key = std::fs::read_to_string(key_file)
        .with_context(|| {
            format!(
                "reading {}: the coordinator writes it only on a fresh database",
                key_file.display()
            )
        })?
        .trim()
        .to_string();
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")?;
    let base = format!("http://{}", running.addr);

    let provider = create_account(&client, &base, &admin_key, "provider", "bench-provider").await?;
    let tenant = create_account(&client, &base, &admin_key, "tenant", "bench-tenant").await?;
    for deposit in 0..CREDIT_DEPOSITS {
        let request = CreditRequest {
            account_id: tenant.account.id,
            amount: CREDIT_DOLLARS.to_string(),
            key: format!("bench-credit-{deposit}"),
        };
        let response = client
            .post(format!("{base}/v1/admin/credits"))
            .bearer_auth(&admin_key)
            .json(&request)
            .send()
            .await?;
        expect_success(response, "crediting the tenant").await?;
    }

    let keys_started = Instant::now();
    let node_count = args.nodes;
    let node_keys =
        tokio::task::spawn_blocking(move || (0..node_count).map(|_| NodeKey::generate()).collect::<Vec<_>>())
            .await
            .context("generating node keys")?;
    let key_generation_secs = keys_started.elapsed().as_secs_f64();
    let registrations = fleet_registrations(args.nodes, args.seed, &node_keys);
    let registration_started = Instant::now();
    let node_ids = register_nodes(&client, &base, &provider.api_key.api_key, registrations).await?;
    let registration_secs = registration_started.elapsed().as_secs_f64();
    let fleet = Arc::new(Fleet {
        client,
        base,
        tenant_key: tenant.api_key.api_key,
        node_ids,
        node_keys,
        acks: Mutex::new(Vec::new()),
    });

    eprintln!(
        "fallow bench api: registered {} nodes; one heartbeat from each",
        args.nodes
    );
    let warmup_started = Instant::now();
    let warmup_errors = warm_up(&fleet).await;
    let warmup_secs = warmup_started.elapsed().as_secs_f64();
    let settle_started = Instant::now();
    settle(running).await;
    let settle_secs = settle_started.elapsed().as_secs_f64();
    let setup_secs = setup_started.elapsed().as_secs_f64();

    let duration = Duration::from_secs(args.duration_secs);
    let jobs = Arc::new(job_bodies(
        (args.submit_rate * duration.as_secs_f64()).ceil() as usize,
        args.seed,
    )?);
    eprintln!(
        "fallow bench api: setup took {setup_secs:.1} s; timed phase of {} s starts",
        args.duration_secs
    );
    // 125,000 agents sign on their own machines: the heartbeats are signed before the timed
    // phase, each stamped with the time it is due, so that signing does not take the server's
    // CPU.
    let signing_started = Instant::now();
    let (beats, start) = {
        let fleet = fleet.clone();
        let count = scheduled_count(heartbeat_rate, duration);
        tokio::task::spawn_blocking(move || sign_ahead(&fleet, count, heartbeat_rate))
            .await
            .context("signing heartbeats")?
    };
    let beats = Arc::new(beats);
    let signing_secs = signing_started.elapsed().as_secs_f64();
    running.state.metrics.grants.start();
    tokio::time::sleep_until(start.into()).await;
    let start_us = server::now_us();
    let cpu_before = process_cpu_secs();
    let machine_before = machine_cpu_ticks();
    let counters_before = server_counters(running);
    let heartbeats = {
        let fleet = fleet.clone();
        tokio::spawn(open_loop(
            heartbeat_rate,
            start,
            duration,
            args.in_flight,
            move |sequence| send_signed(fleet.clone(), beats.clone(), sequence as usize),
        ))
    };
    let submits = {
        let fleet = fleet.clone();
        tokio::spawn(open_loop(
            args.submit_rate,
            start,
            duration,
            args.in_flight,
            move |sequence| send_submit(fleet.clone(), jobs.clone(), sequence),
        ))
    };
    let heartbeats = heartbeats.await.context("the heartbeat driver")?;
    let submits = submits.await.context("the submit driver")?;
    let counters_after = server_counters(running);
    let cpu_secs = match (cpu_before, process_cpu_secs()) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    let machine_after = machine_cpu_ticks();
    let wall_secs = start.elapsed().as_secs_f64();
    let grants = grant_times(&fleet, running, start_us, duration).await;
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());

    let mut report = json!({
        "bench": "api",
        "database": database,
        "nodes": args.nodes,
        "gpus": args.nodes as u64 * u64::from(GPUS_PER_NODE),
        "duration_secs": args.duration_secs,
        "cores": cores,
        "seed": args.seed,
        "in_flight_max": args.in_flight,
        "heartbeat_timeout_ms": args.heartbeat_timeout_ms,
        "setup_secs": round(setup_secs, 2),
        "setup": {
            "key_generation_secs": round(key_generation_secs, 2),
            "registration_secs": round(registration_secs, 2),
            "registrations_per_sec": round(args.nodes as f64 / registration_secs, 0),
            "warmup_heartbeat_secs": round(warmup_secs, 2),
            "warmup_heartbeats_per_sec": round(args.nodes as f64 / warmup_secs, 0),
            "warmup_errors": warmup_errors,
            "settle_secs": round(settle_secs, 2),
            "heartbeats_signed_ahead_secs": round(signing_secs, 2),
        },
        "heartbeat_target_per_sec": round(heartbeat_rate, 1),
        "submit_target_per_sec": round(args.submit_rate, 1),
    });
    let errors = json!({
        "heartbeat": heartbeats.errors,
        "submit": submits.errors,
    });
    heartbeats.report("heartbeat", "heartbeats", duration, &mut report);
    submits.report("submit", "submits", duration, &mut report);
    report["errors"] = errors;
    report["registrations_per_sec"] = json!(round(args.nodes as f64 / registration_secs, 0));
    grants.report(duration, &mut report);
    report["timed_wall_secs"] = json!(round(wall_secs, 2));
    let during: BTreeMap<&str, u64> = counters_after
        .iter()
        .map(|(name, after)| (*name, after - counters_before.get(name).copied().unwrap_or(0)))
        .collect();
    report["server_during_timed_phase"] = json!(during);
    if let Some(cpu_secs) = cpu_secs {
        report["process_cpu_secs"] = json!(round(cpu_secs, 2));
        report["cpu_utilisation"] = json!(round(cpu_secs / (wall_secs * cores as f64), 3));
    }
    if let (Some((busy_before, total_before)), Some((busy_after, total_after))) = (machine_before, machine_after) {
        let total = total_after.saturating_sub(total_before).max(1);
        report["machine_cpu_utilisation"] =
            json!(round(busy_after.saturating_sub(busy_before) as f64 / total as f64, 3));
    }
    Ok(report)
}

async fn expect_success(response: reqwest::Response, what: &str) -> anyhow::Result<Vec<u8>> {
    let status = response.status();
    let body = response
        .bytes()
        .await
        .with_context(|| format!("{what}: reading the answer"))?;
    if !status.is_success() {
        bail!("{what}: {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(body.to_vec())
}

async fn create_account(
    client: &reqwest::Client,
    base: &str,
    admin_key: &str,
    role: &str,
    name: &str,
) -> anyhow::Result<NewAccountResponse> {
    let response = client
        .post(format!("{base}/v1/admin/accounts"))
        .bearer_auth(admin_key)
        .json(&NewAccountRequest {
            role: role.to_string(),
            name: name.to_string(),
        })
        .send()
        .await?;
    let body = expect_success(response, &format!("creating the {role} account")).await?;
    serde_json::from_slice(&body).with_context(|| format!("reading the new {role} account"))
}

/// The fleet's spread, from the seed: GPU models by weight, 5 regions of 4 sites, fabrics of
/// 128 nodes per site, one 8-GPU NVLink domain per node, asks around each model's price.
fn fleet_registrations(nodes: usize, seed: u64, keys: &[NodeKey]) -> Vec<NodeRegistration> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let weight_total: u32 = GPU_MODELS.iter().map(|model| model.1).sum();
    let mut nodes_in_site = [0usize; REGIONS.len() * SITES_PER_REGION];
    let mut registrations = Vec::with_capacity(nodes);
    for (index, key) in keys.iter().enumerate().take(nodes) {
        let mut draw = rng.random_range(0..weight_total);
        let model = GPU_MODELS
            .iter()
            .find(|model| {
                if draw < model.1 {
                    true
                } else {
                    draw -= model.1;
                    false
                }
            })
            .expect("the draw is below the total weight");
        let site = rng.random_range(0..nodes_in_site.len());
        let (region, latitude, longitude) = REGIONS[site / SITES_PER_REGION];
        let site_number = site % SITES_PER_REGION;
        let fabric = nodes_in_site[site] / NODES_PER_FABRIC;
        nodes_in_site[site] += 1;
        let price_permille = i64::from(rng.random_range(800..=1200u32));
        let ask = |micros: i64| dollars(micros * price_permille / 1000);
        let mut asks = BTreeMap::from([
            ("silver".to_string(), ask(model.2)),
            ("bronze".to_string(), ask(model.3)),
        ]);
        if rng.random_range(0..1000u32) < GOLD_SELLERS_PERMILLE {
            asks.insert("gold".to_string(), ask(model.4));
        }
        registrations.push(NodeRegistration {
            name: format!("bench-node-{index}"),
            public_key: key.public_hex(),
            fingerprint: format!("bench-fingerprint-{index}"),
            gpu_model: model.0.to_string(),
            gpu_count: GPUS_PER_NODE,
            cpu_milli: u32::from(GPUS_PER_NODE) * 16_000,
            memory_mib: u64::from(GPUS_PER_NODE) * 128 * 1024,
            network_mbit_s: if model.0 == "RTX-4090" { 25_000 } else { 100_000 },
            region: region.to_string(),
            site: format!("{region}-{site_number}"),
            fabric: format!("fabric-{fabric}"),
            nvlink_domain: format!("nvlink-{index}"),
            latitude: latitude + site_number as f64 * 0.1,
            longitude: longitude + site_number as f64 * 0.1,
            simulated: true,
            policy: PolicyDoc {
                asks,
                thermal_limit_c: Some(87),
                ..PolicyDoc::default()
            },
            runtimes: Vec::new(),
            canary_kinds: Vec::new(),
            advertise_addr: String::new(),
            gang_ports: String::new(),
            nvlink_source: String::new(),
            nvlink_detected: String::new(),
        });
    }
    registrations
}

/// Registers every node in batches of `api::NODE_BATCH_MAX` (`POST /v1/nodes/batch`),
/// `REGISTER_BATCHES_IN_FLIGHT` at a time, as a fleet's operator would; returns the node ids in
/// order.
async fn register_nodes(
    client: &reqwest::Client,
    base: &str,
    provider_key: &str,
    registrations: Vec<NodeRegistration>,
) -> anyhow::Result<Vec<i64>> {
    let batches: Arc<Vec<Vec<NodeRegistration>>> = Arc::new(
        registrations
            .chunks(api::NODE_BATCH_MAX)
            .map(<[NodeRegistration]>::to_vec)
            .collect(),
    );
    let ids = Arc::new(Mutex::new(vec![0i64; registrations.len()]));
    let next = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..REGISTER_BATCHES_IN_FLIGHT {
        let (client, url, key) = (
            client.clone(),
            format!("{base}/v1/nodes/batch"),
            provider_key.to_string(),
        );
        let (batches, ids, next, progress) = (batches.clone(), ids.clone(), next.clone(), progress.clone());
        workers.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(nodes) = batches.get(index) else {
                    return anyhow::Ok(());
                };
                let body = serde_json::to_vec(&NodeBatchRegistration { nodes: nodes.clone() })?;
                let answer = with_retries(&format!("registering batch {index}"), || {
                    client
                        .post(&url)
                        .bearer_auth(&key)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                })
                .await?;
                let view: NodeBatchView = serde_json::from_slice(&answer).context("reading registered nodes")?;
                ensure!(
                    view.nodes.len() == nodes.len(),
                    "batch {index}: {} nodes registered of {}",
                    view.nodes.len(),
                    nodes.len()
                );
                let first = index * api::NODE_BATCH_MAX;
                ids.lock().expect("node id lock")[first..first + nodes.len()]
                    .iter_mut()
                    .zip(&view.nodes)
                    .for_each(|(id, node)| *id = node.id);
                let before = progress.fetch_add(nodes.len(), Ordering::Relaxed);
                if (before + nodes.len()) / 25_000 > before / 25_000 {
                    eprintln!(
                        "fallow bench api: registered {} nodes in {:.1} s",
                        before + nodes.len(),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.context("a registration worker")??;
    }
    let ids = std::mem::take(&mut *ids.lock().expect("node id lock"));
    ensure!(ids.iter().all(|id| *id > 0), "some nodes did not register");
    Ok(ids)
}

/// Sends a setup request until it succeeds, waiting and retrying on 429 and 503.
async fn with_retries<F, Fut>(what: &str, mut send: F) -> anyhow::Result<Vec<u8>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = reqwest::Result<reqwest::Response>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let response = send().await.with_context(|| what.to_string())?;
        let status = response.status();
        let body = response.bytes().await.with_context(|| what.to_string())?;
        if status.is_success() {
            return Ok(body.to_vec());
        }
        let retry = status.as_u16() == 429 || status.as_u16() == 503;
        if !retry || attempt >= SETUP_ATTEMPTS_MAX {
            bail!("{what}: {status}: {}", String::from_utf8_lossy(&body));
        }
        tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt.min(25)))).await;
    }
}

/// One heartbeat from every node, closed loop: brings the fleet online before the timed phase,
/// as it is in steady state. Returns the errors by kind (the nodes that failed stay offline).
async fn warm_up(fleet: &Arc<Fleet>) -> BTreeMap<String, u64> {
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(BTreeMap::new()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..WARMUP_IN_FLIGHT_MAX {
        let (fleet, next, errors) = (fleet.clone(), next.clone(), errors.clone());
        workers.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= fleet.node_ids.len() {
                    return;
                }
                if let Err(kind) = send_heartbeat(fleet.clone(), index as u64).await {
                    *errors.lock().expect("error lock").entry(kind).or_insert(0) += 1;
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
    std::mem::take(&mut *errors.lock().expect("error lock"))
}

/// Waits until the reconcile loop has stopped rebuilding its view of the fleet (the warm-up
/// brought every node online, which changes the fleet's version): a pass has finished with no
/// rebuild for `SETTLE_QUIET`, or `SETTLE_MAX` has passed.
async fn settle(running: &server::Running) {
    let started = Instant::now();
    let metrics = &running.state.metrics;
    let mut rebuilds = metrics.rebuilds.load(Ordering::Relaxed);
    let mut passes = metrics.reconcile_passes.load(Ordering::Relaxed);
    let mut quiet_since = Instant::now();
    while started.elapsed() < SETTLE_MAX {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let rebuilds_now = metrics.rebuilds.load(Ordering::Relaxed);
        let passes_now = metrics.reconcile_passes.load(Ordering::Relaxed);
        if rebuilds_now != rebuilds {
            quiet_since = Instant::now();
        } else if passes_now != passes && quiet_since.elapsed() >= SETTLE_QUIET {
            return;
        }
        (rebuilds, passes) = (rebuilds_now, passes_now);
    }
}

/// The telemetry of one heartbeat: 8 GPUs' temperature, power and utilisation, varied by node
/// and time so bodies differ.
fn heartbeat_body(node: usize, sequence: u64) -> HeartbeatRequest {
    let gpus = (0..GPUS_PER_NODE)
        .map(|gpu| {
            let wobble = (node as u64 * 31 + sequence * 7 + u64::from(gpu) * 13) % 100;
            GpuTelemetry {
                index: gpu,
                temperature_c: 38.0 + wobble as f64 * 0.4,
                power_w: 90.0 + wobble as f64 * 5.5,
                utilisation_pct: wobble as f64,
                memory_used_mib: wobble * 800,
            }
        })
        .collect();
    HeartbeatRequest {
        gpus,
        ..HeartbeatRequest::default()
    }
}

const HEARTBEAT_PATH: &str = "/v1/agent/heartbeat";

/// A heartbeat signed ahead of time.
struct SignedBeat {
    body: Vec<u8>,
    headers: [(&'static str, String); 4],
}

/// Heartbeat number `sequence` (from node `sequence % nodes`) with a fresh nonce, signed at
/// `timestamp_ms`, as an agent sends it.
fn sign_heartbeat(fleet: &Fleet, sequence: u64, timestamp_ms: i64) -> SignedBeat {
    let node = (sequence % fleet.node_ids.len() as u64) as usize;
    let body = serde_json::to_vec(&heartbeat_body(node, sequence)).expect("a heartbeat encodes as JSON");
    let headers = fleet.node_keys[node]
        .sign_request_now(fleet.node_ids[node], "POST", HEARTBEAT_PATH, &body, timestamp_ms)
        .header_pairs();
    SignedBeat { body, headers }
}

/// Signs the timed phase's `count` heartbeats on every core, each stamped with the time it is
/// due at `rate` from the returned start (far enough ahead for the signing to finish).
fn sign_ahead(fleet: &Fleet, count: u64, rate: f64) -> (Vec<SignedBeat>, Instant) {
    let threads = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    let lead = Duration::from_secs(1) + SIGN_AHEAD_COST.mul_f64(count as f64 / threads as f64);
    let start = Instant::now() + lead;
    let start_ms = server::now_us() / 1000 + lead.as_millis() as i64;
    let chunk = (count as usize).div_ceil(threads).max(1);
    let mut beats = Vec::with_capacity(count as usize);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..count)
            .step_by(chunk)
            .map(|first| {
                scope.spawn(move || {
                    (first..(first + chunk as u64).min(count))
                        .map(|sequence| {
                            let due_ms = start_ms + (sequence as f64 * 1000.0 / rate) as i64;
                            sign_heartbeat(fleet, sequence, due_ms)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for worker in workers {
            beats.extend(worker.join().expect("a signing thread finishes"));
        }
    });
    (beats, start)
}

/// Sends a heartbeat signed now (the warm-up). `Err` is the error kind.
async fn send_heartbeat(fleet: Arc<Fleet>, sequence: u64) -> Result<(), String> {
    let beat = sign_heartbeat(&fleet, sequence, server::now_us() / 1000);
    post_heartbeat(&fleet, &beat).await
}

/// Sends heartbeat `index` of those signed ahead.
async fn send_signed(fleet: Arc<Fleet>, beats: Arc<Vec<SignedBeat>>, index: usize) -> Result<(), String> {
    post_heartbeat(&fleet, &beats[index]).await
}

async fn post_heartbeat(fleet: &Fleet, beat: &SignedBeat) -> Result<(), String> {
    let mut request = fleet
        .client
        .post(format!("{}{HEARTBEAT_PATH}", fleet.base))
        .header("content-type", "application/json");
    for (name, value) in &beat.headers {
        request = request.header(*name, value);
    }
    answer(request.body(beat.body.clone()).send().await).await
}

/// Submits a job; keeps its id and when it was acknowledged, to time it to its grant.
async fn send_submit(fleet: Arc<Fleet>, jobs: Arc<Vec<Vec<u8>>>, sequence: u64) -> Result<(), String> {
    let body = jobs[sequence as usize % jobs.len()].clone();
    let request = fleet
        .client
        .post(format!("{}/v1/jobs", fleet.base))
        .bearer_auth(&fleet.tenant_key)
        .header("content-type", "application/json")
        .body(body);
    let answered = answer_body(request.send().await).await?;
    let acked_at = server::now_us();
    let id = serde_json::from_slice::<Value>(&answered)
        .ok()
        .and_then(|job| job["id"].as_i64())
        .ok_or_else(|| "unreadable".to_string())?;
    fleet.acks.lock().expect("ack lock").push((id, acked_at));
    Ok(())
}

/// What the timed phase's submissions waited for their leases.
struct Grants {
    /// Placements committed in the timed phase.
    in_phase: u64,
    /// From each acknowledgement to its lease's commit, or to the horizon when not granted.
    waits: Vec<Duration>,
    not_granted: u64,
}

impl Grants {
    fn report(mut self, window: Duration, report: &mut Value) {
        self.waits.sort_unstable();
        let millis = |quantile: f64| round(percentile(&self.waits, quantile).as_secs_f64() * 1000.0, 2);
        report["grants_per_sec"] = json!(round(self.in_phase as f64 / window.as_secs_f64(), 1));
        report["submit_to_grant_p50_ms"] = json!(millis(0.50));
        report["submit_to_grant_p99_ms"] = json!(millis(0.99));
        report["submit_to_grant_max_ms"] = json!(millis(1.0));
        report["not_granted"] = json!(self.not_granted);
    }
}

/// How long after the phase (or its last acknowledgement, if later) a job may be granted and
/// count as granted.
const GRANT_HORIZON: Duration = Duration::from_secs(1);

/// Waits for the grant horizon, then times every acknowledged submission to its lease's commit
/// (the coordinator's grant log). A job not granted by then counts as the time from its
/// acknowledgement to the horizon.
async fn grant_times(fleet: &Fleet, running: &server::Running, start_us: i64, window: Duration) -> Grants {
    let window_end_us = start_us + window.as_micros() as i64;
    let acks = std::mem::take(&mut *fleet.acks.lock().expect("ack lock"));
    let last_ack = acks.iter().map(|(_, at)| *at).max().unwrap_or(window_end_us);
    let horizon_us = window_end_us.max(last_ack) + GRANT_HORIZON.as_micros() as i64;
    let wait_us = horizon_us - server::now_us();
    if wait_us > 0 {
        tokio::time::sleep(Duration::from_micros(wait_us as u64)).await;
    }
    let log = running.state.metrics.grants.taken();
    grant_waits(&acks, &log, (start_us, window_end_us), horizon_us)
}

/// Each acknowledged submission `(job, acked at)` timed to its grant in `log` `(job, committed
/// at)`, or to `horizon_us` when it had none by then; the grants committed in `phase`.
fn grant_waits(acks: &[(i64, i64)], log: &[(i64, i64)], phase: (i64, i64), horizon_us: i64) -> Grants {
    let in_phase = log.iter().filter(|(_, at)| (phase.0..=phase.1).contains(at)).count() as u64;
    let granted: std::collections::HashMap<i64, i64> = log.iter().copied().collect();
    let mut not_granted = 0;
    let waits = acks
        .iter()
        .map(|(job, acked)| {
            let until = match granted.get(job) {
                Some(at) if *at <= horizon_us => *at,
                _ => {
                    not_granted += 1;
                    horizon_us
                }
            };
            Duration::from_micros(until.saturating_sub(*acked).max(0) as u64)
        })
        .collect();
    Grants {
        in_phase,
        waits,
        not_granted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submission_waits_until_its_grant_or_the_horizon() {
        // Phase 0–10 s, horizon 11 s. Job 1 granted in the phase, job 2 after it but before
        // the horizon, job 3 after the horizon, job 4 never.
        let acks = [(1, 1_000_000), (2, 9_000_000), (3, 9_500_000), (4, 10_000_000)];
        let log = [(1, 1_250_000), (2, 10_500_000), (3, 12_000_000)];
        let grants = grant_waits(&acks, &log, (0, 10_000_000), 11_000_000);
        assert_eq!(grants.in_phase, 1, "only job 1's grant committed in the phase");
        assert_eq!(grants.not_granted, 2, "jobs 3 and 4");
        let millis: Vec<u128> = grants.waits.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, vec![250, 1_500, 1_500, 1_000]);
        let mut report = json!({});
        grants.report(Duration::from_secs(10), &mut report);
        assert_eq!(report["grants_per_sec"], 0.1);
        assert_eq!(report["submit_to_grant_p50_ms"], 1_000.0);
        assert_eq!(report["submit_to_grant_p99_ms"], 1_500.0);
        assert_eq!(report["not_granted"], 2);
    }
}

/// Reads the whole answer (so the connection is reused); `Err` names the failure: the status
/// code, `timeout` or `transport`.
async fn answer(sent: reqwest::Result<reqwest::Response>) -> Result<(), String> {
    answer_body(sent).await.map(drop)
}

/// As `answer`, with the body of a successful answer.
async fn answer_body(sent: reqwest::Result<reqwest::Response>) -> Result<bytes::Bytes, String> {
    let kind = |error: reqwest::Error| {
        if error.is_timeout() {
            "timeout".to_string()
        } else {
            "transport".to_string()
        }
    };
    let response = sent.map_err(kind)?;
    let status = response.status();
    let body = response.bytes().await.map_err(kind)?;
    if status.is_success() {
        Ok(body)
    } else {
        static SHOWN: AtomicUsize = AtomicUsize::new(0);
        if SHOWN.fetch_add(1, Ordering::Relaxed) < 5 {
            eprintln!(
                "fallow bench api: {status}: {}",
                String::from_utf8_lossy(&body).chars().take(300).collect::<String>()
            );
        }
        Err(status.as_u16().to_string())
    }
}

/// The job mix, as JSON bodies: 70 % one GPU, 20 % a share of one, 10 % 2–8 GPUs; tiers
/// 20/50/30 gold/silver/bronze; a price cap of $0.50–$4.00 per GPU-hour; a fifth pinned to a region.
fn job_bodies(count: usize, seed: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(2);
    let mut bodies = Vec::with_capacity(count.max(1));
    for index in 0..count.max(1) {
        let shape = rng.random_range(0..1000u32);
        let (gpus, gpu_share_milli) = match shape {
            0..700 => (Some(1), None),
            700..900 => (None, Some(rng.random_range(1..=9u16) * 100)),
            _ => (Some(rng.random_range(2..=8u8)), None),
        };
        let tier = match rng.random_range(0..1000u32) {
            0..200 => "gold",
            200..700 => "silver",
            _ => "bronze",
        };
        let class = ["batch", "training", "inference", "eval"][rng.random_range(0..4usize)];
        let regions = if rng.random_range(0..5u32) == 0 {
            vec![REGIONS[rng.random_range(0..REGIONS.len())].0.to_string()]
        } else {
            Vec::new()
        };
        let request = JobRequest {
            name: format!("bench-job-{index}"),
            image: "ghcr.io/fallow/bench-job:1".to_string(),
            command: vec!["sleep".to_string(), "600".to_string()],
            gpus,
            gpu_share_milli,
            cpu_milli: 4_000,
            memory_mib: 16 * 1024,
            replicas: 1,
            topology: "any".to_string(),
            tier: tier.to_string(),
            class: class.to_string(),
            max_price_per_gpu_hour: dollars(i64::from(rng.random_range(50..=400u32)) * 10_000),
            preemptible: tier == "bronze",
            regions,
            max_runtime_s: rng.random_range(600..=3600u32),
            network: "none".to_string(),
            ..JobRequest::default()
        };
        bodies.push(serde_json::to_vec(&request)?);
    }
    Ok(bodies)
}

/// What one open-loop stream did.
struct Outcome {
    /// Latency from the scheduled send time to the end of the answer, of every request
    /// scheduled in the window (errors included; unsent ones with their wait so far).
    latencies: Vec<Duration>,
    /// 2xx answers that completed inside the window.
    succeeded_in_window: u64,
    succeeded: u64,
    scheduled: u64,
    errors: BTreeMap<String, u64>,
}

impl Outcome {
    fn report(mut self, one: &str, many: &str, window: Duration, report: &mut Value) {
        self.latencies.sort_unstable();
        let millis = |quantile: f64| round(percentile(&self.latencies, quantile).as_secs_f64() * 1000.0, 2);
        report[many] = json!(self.succeeded_in_window);
        report[format!("{many}_per_sec")] = json!(round(self.succeeded_in_window as f64 / window.as_secs_f64(), 1));
        report[format!("{one}_p50_ms")] = json!(millis(0.50));
        report[format!("{one}_p90_ms")] = json!(millis(0.90));
        report[format!("{one}_p99_ms")] = json!(millis(0.99));
        report[format!("{one}_p999_ms")] = json!(millis(0.999));
        report[format!("{one}_max_ms")] = json!(millis(1.0));
        report[format!("{many}_scheduled")] = json!(self.scheduled);
        report[format!("{many}_succeeded_total")] = json!(self.succeeded);
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[Duration], quantile: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[derive(Default)]
struct Samples {
    latencies: Vec<Duration>,
    succeeded_in_window: u64,
    succeeded: u64,
    errors: BTreeMap<String, u64>,
}

/// How many requests `open_loop` sends.
fn scheduled_count(rate_per_s: f64, window: Duration) -> u64 {
    (rate_per_s * window.as_secs_f64()).floor() as u64
}

/// Sends `rate_per_s × window` requests at their scheduled times from `start`, at most
/// `in_flight_max` at once. A request waiting for a free slot keeps its scheduled time, so its
/// wait shows in its latency. Requests not sent by `BACKLOG_GRACE` after the window count as
/// `unsent`.
async fn open_loop<F, Fut>(rate_per_s: f64, start: Instant, window: Duration, in_flight_max: usize, send: F) -> Outcome
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let scheduled = scheduled_count(rate_per_s, window);
    let window_end = start + window;
    let give_up_at = window_end + BACKLOG_GRACE;
    let samples = Arc::new(Mutex::new(Samples {
        latencies: Vec::with_capacity(scheduled as usize),
        ..Samples::default()
    }));
    let slots = Arc::new(Semaphore::new(in_flight_max));
    let mut unsent = 0;
    for sequence in 0..scheduled {
        let due = start + Duration::from_secs_f64(sequence as f64 / rate_per_s);
        if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
        }
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = tokio::time::sleep_until(give_up_at.into()) => {
                unsent = scheduled - sequence;
                break;
            }
        };
        let request = send(sequence);
        let samples = samples.clone();
        tokio::spawn(async move {
            let result = request.await;
            let done = Instant::now();
            let mut samples = samples.lock().expect("samples lock");
            samples.latencies.push(done - due);
            match result {
                Ok(()) => {
                    samples.succeeded += 1;
                    if done <= window_end {
                        samples.succeeded_in_window += 1;
                    }
                }
                Err(kind) => *samples.errors.entry(kind).or_insert(0) += 1,
            }
            drop(slot);
        });
    }
    // Every slot free again: every request sent has been answered or timed out.
    let all = u32::try_from(in_flight_max).expect("--in-flight is checked against IN_FLIGHT_MAX");
    let _drained = slots.acquire_many(all).await.expect("the semaphore is never closed");
    let mut samples = std::mem::take(&mut *samples.lock().expect("samples lock"));
    if unsent > 0 {
        samples.errors.insert("unsent".to_string(), unsent);
        let stopped = Instant::now();
        for sequence in (scheduled - unsent)..scheduled {
            let due = start + Duration::from_secs_f64(sequence as f64 / rate_per_s);
            samples.latencies.push(stopped.saturating_duration_since(due));
        }
    }
    Outcome {
        latencies: samples.latencies,
        succeeded_in_window: samples.succeeded_in_window,
        succeeded: samples.succeeded,
        scheduled,
        errors: samples.errors,
    }
}
