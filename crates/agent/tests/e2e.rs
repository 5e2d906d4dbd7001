//! The agent end to end: a coordinator (SQLite), a tenant and a provider, and an agent offering
//! simulated GPUs that runs leased jobs as real processes, or as real Docker containers.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agent::exec::Executor;
use agent::exec::process::ProcessExecutor;
use agent::{Agent, AgentConfig};
use common::{DEADLINE, IMAGE, docker, unique};
use serde_json::{Value, json};

struct World {
    base: String,
    http: reqwest::Client,
    tenant_key: String,
    provider_key: String,
    running: server::Running,
    dir: PathBuf,
}

async fn call(world: &World, key: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = world
        .http
        .request(method, format!("{}{path}", world.base))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the coordinator answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

impl World {
    /// Stops the coordinator and removes the test's files.
    async fn end(self) {
        self.running.stop().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stops an agent started by `start_agent` and waits for it.
async fn stop_agent(stop: tokio::sync::watch::Sender<bool>, task: tokio::task::JoinHandle<()>) {
    let _ = stop.send(true);
    task.await.unwrap();
}

/// A GET with the tenant's key: the status and the JSON answer.
async fn tenant_get(world: &World, path: &str) -> (u16, Value) {
    call(world, &world.tenant_key, reqwest::Method::GET, path, None).await
}

async fn world() -> World {
    world_with(|_| {}).await
}

async fn world_with(configure: impl FnOnce(&mut server::Config)) -> World {
    let dir = unique("fallow-agent-e2e");
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = server::Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.join("coordinator"),
        heartbeat_interval_ms: 500,
        // New providers have no badge; these tests run gold work (the trust tests ask for one).
        gold_needs_badge: false,
        // A view that disagrees with the store fails the pass, loudly.
        strict_view: true,
        ..server::Config::default()
    };
    configure(&mut config);
    let database = format!("sqlite://{}", dir.join("fallow.db").display());
    let running = server::start(&database, config).await.expect("the coordinator starts");
    let admin = std::fs::read_to_string(dir.join("coordinator").join(server::ADMIN_KEY_FILE))
        .unwrap()
        .trim()
        .to_string();
    let mut world = World {
        base: format!("http://{}", running.addr),
        http: reqwest::Client::new(),
        tenant_key: String::new(),
        provider_key: String::new(),
        running,
        dir,
    };
    let mut keys = Vec::new();
    for (role, name) in [("tenant", "acme"), ("provider", "farm")] {
        let (status, created) = call(
            &world,
            &admin,
            reqwest::Method::POST,
            "/v1/admin/accounts",
            Some(json!({"role": role, "name": name})),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        keys.push((
            created["account"]["id"].as_i64().unwrap(),
            created["api_key"]["api_key"].as_str().unwrap().to_string(),
        ));
    }
    let (status, _) = call(
        &world,
        &admin,
        reqwest::Method::POST,
        "/v1/admin/credits",
        Some(json!({"account_id": keys[0].0, "amount": "100.00", "key": "e2e-credit"})),
    )
    .await;
    assert_eq!(status, 200);
    world.tenant_key = keys[0].1.clone();
    world.provider_key = keys[1].1.clone();
    world
}

fn agent_config(world: &World, name: &str) -> AgentConfig {
    agent_config_via(world, name, &world.base)
}

fn agent_config_via(world: &World, name: &str, coordinator: &str) -> AgentConfig {
    AgentConfig {
        coordinator: coordinator.to_string(),
        ca_certs: Vec::new(),
        policy_given: false,
        provider_key: Some(world.provider_key.clone()),
        data_dir: world.dir.join(name),
        name: name.to_string(),
        region: "eu-west".into(),
        site: "ams1".into(),
        fabric: "ams1-net".into(),
        cpu_milli: 16_000,
        memory_mib: 65_536,
        policy: api::PolicyDoc {
            asks: [("gold", "3.00"), ("silver", "2.00"), ("bronze", "1.00")]
                .into_iter()
                .map(|(tier, ask)| (tier.to_string(), ask.to_string()))
                .collect(),
            ..api::PolicyDoc::default()
        },
        usage_every: Duration::from_millis(500),
        grace: Duration::from_secs(2),
        allow_file_datasets: true,
        dataset_cache_bytes: None,
        guard_program: None,
        canary_program: None,
        matmul_device: None,
        topology: agent::NodeTopology::default(),
        scratch_encryption: agent::ScratchEncryption::Auto,
    }
}

/// Starts an agent with two simulated H100s; returns its node id and the handle to stop it.
async fn start_agent<E: Executor>(
    world: &World,
    name: &str,
    executor: E,
) -> (i64, tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    start_agent_with(agent_config(world, name), executor).await
}

async fn start_agent_with<E: Executor>(
    config: AgentConfig,
    executor: E,
) -> (i64, tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    start_agent_on(config, simulated_h100s(), executor).await
}

/// Two simulated H100s.
fn simulated_h100s() -> agent::gpu::Inventory {
    agent::gpu::simulated("H100-SXM5:2", |name| name == "H100-SXM5").unwrap()
}

async fn start_agent_on<E: Executor>(
    config: AgentConfig,
    inventory: agent::gpu::Inventory,
    executor: E,
) -> (i64, tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let agent = Agent::start(config, inventory, executor)
        .await
        .expect("the agent registers");
    let node_id = agent.node_id();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        agent.run(stopped).await.expect("the agent runs");
    });
    (node_id, stop, task)
}

fn job(name: &str, script: &str) -> Value {
    json!({
        "name": name,
        "image": "/bin/sh",
        "command": ["-c", script],
        "gpus": 1,
        "tier": "silver",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    })
}

async fn wait_for_job(world: &World, id: i64, state: &str) -> Value {
    let start = Instant::now();
    loop {
        let (_, view) = tenant_get(world, &format!("/v1/jobs/{id}")).await;
        if view["state"] == state {
            return view;
        }
        assert!(start.elapsed() < DEADLINE, "job {id} never reached {state}: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The tenant's credit in every world.
const CREDIT_MICROS: i64 = 100_000_000;

/// What one job was billed, each part checked to the micro-dollar by [`check_bill`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Bill {
    /// GPU-milli-seconds metered by the job's usage records.
    metered: i64,
    /// Charged to the tenant.
    charged: i64,
    /// Credited to the provider: the charges less the platform fee.
    earned: i64,
}

impl std::ops::Add for Bill {
    type Output = Bill;
    fn add(self, other: Bill) -> Bill {
        Bill {
            metered: self.metered + other.metered,
            charged: self.charged + other.charged,
            earned: self.earned + other.earned,
        }
    }
}

/// Checks the bill of an ended job against its usage records (read from the store): each record
/// metered its period on the lease's GPUs, and charged exactly that at the lease's price
/// (rounded to the nearest micro-dollar, as `Micros::cost_for` does); the job's cost is their
/// sum; the provider's statement credits each record's charge less the fee (`fee_permille`,
/// rounded down, as `ledger::usage` does); an attested lease attested what was metered; and
/// nothing is left in the job's escrow.
async fn check_bill(world: &World, job: i64) -> Bill {
    let fee_permille = i64::from(world.running.state.config.platform_fee_permille);
    let store = &world.running.state.store;
    let (_, view) = tenant_get(world, &format!("/v1/jobs/{job}")).await;
    let (_, statement) = call(world, &world.provider_key, reqwest::Method::GET, "/v1/statement", None).await;
    let mut bill = Bill::default();
    for lease in view["leases"].as_array().expect("the job's leases") {
        let id = lease["id"].as_i64().unwrap();
        let price = i128::from(lease["price_micros_per_gpu_hour"].as_i64().unwrap());
        let gpu_milli = lease["gpu_indices"].as_array().unwrap().len() as i64 * lease["gpu_milli"].as_i64().unwrap();
        let mut leased = Bill::default();
        for record in store.usage_of_lease(id).await.unwrap() {
            let body: Value = serde_json::from_str(&record.body).unwrap();
            let period_ms = body["period_end_ms"].as_i64().unwrap() - body["period_start_ms"].as_i64().unwrap();
            assert_eq!(
                record.gpu_seconds_milli,
                gpu_milli * period_ms / 1000,
                "lease {id}: the record metered its period: {body}"
            );
            let charge = (price * i128::from(record.gpu_seconds_milli) + 1_800_000) / 3_600_000;
            assert_eq!(
                i128::from(record.charged_micros),
                charge,
                "lease {id}: charged its metered GPU-seconds at the lease's price: {body}"
            );
            leased = leased
                + Bill {
                    metered: record.gpu_seconds_milli,
                    charged: record.charged_micros,
                    earned: record.charged_micros - record.charged_micros * fee_permille / 1000,
                };
        }
        let credited: i64 = statement["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|line| {
                line["transaction"]
                    .as_str()
                    .is_some_and(|key| key.starts_with(&format!("usage:lease-{id}:")))
            })
            .map(|line| line["amount_micros"].as_i64().unwrap())
            .sum();
        assert_eq!(
            credited, leased.earned,
            "lease {id}: the provider was credited its charges less the fee: {statement}"
        );
        if let Some(attestation) = store.attestation(id).await.unwrap() {
            let body: Value = serde_json::from_str(&attestation.body).unwrap();
            assert_eq!(
                body["gpu_seconds_milli"], leased.metered,
                "lease {id}: the attestation and the usage records agree"
            );
        }
        bill = bill + leased;
    }
    assert_eq!(view["cost_micros"], bill.charged, "the job's cost: {view}");
    assert_eq!(view["escrow_micros"], 0, "the job's escrow was released: {view}");
    bill
}

/// The tenant paid, and the provider earned, exactly `billed` in all (no job running).
async fn check_balances(world: &World, billed: Bill) {
    let (_, tenant) = tenant_get(world, "/v1/balance").await;
    assert_eq!(
        (tenant["available_micros"].as_i64(), tenant["escrow_micros"].as_i64()),
        (Some(CREDIT_MICROS - billed.charged), Some(0)),
        "the tenant paid exactly the metered usage ({billed:?}): {tenant}"
    );
    let (_, provider) = call(world, &world.provider_key, reqwest::Method::GET, "/v1/balance", None).await;
    assert_eq!(
        provider["earnings_micros"], billed.earned,
        "the provider earned the usage less the fee ({billed:?}): {provider}"
    );
}

async fn submit(world: &World, job: Value) -> i64 {
    let (status, view) = call(world, &world.tenant_key, reqwest::Method::POST, "/v1/jobs", Some(job)).await;
    assert_eq!(status, 201, "{view}");
    view["id"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_process_job_runs_on_the_agent_and_is_attested() {
    let world = world_with(|config| config.bill_simulated = true).await;
    let (node_id, stop, task) = start_agent(&world, "rig-1", ProcessExecutor).await;
    let key_mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(world.dir.join("rig-1").join(agent::state::KEY_FILE))
            .unwrap()
            .permissions()
            .mode()
    };
    assert_eq!(key_mode & 0o777, 0o600, "the node's key is the owner's alone");
    let (_, node) = call(
        &world,
        &world.provider_key,
        reqwest::Method::GET,
        &format!("/v1/nodes/{node_id}"),
        None,
    )
    .await;
    assert_eq!(node["simulated"], true, "a simulated node says so: {node}");

    let marker = world.dir.join("ran");
    let script = format!(
        "echo \"lease $FALLOW_LEASE_ID on GPU $CUDA_VISIBLE_DEVICES\" > {}; echo '500 tokens' >> \"$FALLOW_PROGRESS_FILE\"; sleep 0.8; echo '1000 tokens' >> \"$FALLOW_PROGRESS_FILE\"; sleep 0.7",
        marker.display()
    );
    let id = submit(&world, job("hello", &script)).await;
    let finished = wait_for_job(&world, id, "finished").await;
    let lease = &finished["leases"][0];
    assert_eq!(lease["state"], "finished", "{finished}");
    assert_eq!(lease["node_id"], node_id);
    let ran = std::fs::read_to_string(&marker).expect("the process ran");
    let gpu = lease["gpu_indices"][0].as_i64().unwrap();
    assert_eq!(
        ran.trim(),
        format!("lease {} on GPU {gpu}", lease["id"]),
        "its environment names its lease and GPU"
    );
    let hello = check_bill(&world, id).await;
    // It ran 1.5 s on one GPU, metered every 0.5 s.
    assert!(
        (1_400..3_000).contains(&hello.metered) && hello.charged > 0,
        "{hello:?}"
    );
    assert_eq!(
        finished["progress"],
        json!({"unit": "tokens", "done": 1000, "cost_micros_per_million_units": hello.charged * 1000}),
        "the job's reported progress: {finished}"
    );
    assert!(
        !world
            .dir
            .join("rig-1")
            .join("leases")
            .join(lease["id"].to_string())
            .join("scratch")
            .exists(),
        "the scratch directory is removed"
    );
    let lease_dir = world.dir.join("rig-1").join("leases").join(lease["id"].to_string());
    assert!(
        !agent::scratch::cipher_dir_of(&lease_dir.join("scratch")).exists(),
        "so is its encrypted volume's cipher directory, where there was one"
    );
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&lease_dir.to_string_lossy().into_owned()),
        "nothing of the lease stays mounted"
    );

    let failing = submit(&world, job("fails", "echo oops >&2; exit 3")).await;
    let failed = wait_for_job(&world, failing, "failed").await;
    assert_eq!(failed["leases"][0]["state"], "failed", "{failed}");
    assert!(
        failed["leases"][0]["end_reason"]
            .as_str()
            .unwrap_or("")
            .contains("exit code 3"),
        "the exit code is the reason: {failed}"
    );
    let (_, logs) = tenant_get(&world, &format!("/v1/jobs/{failing}/logs")).await;
    assert_eq!(logs["chunks"][0]["text"], "oops\n", "stderr reaches the tenant: {logs}");
    // Billed for the moment it ran, no more.
    let failed_bill = check_bill(&world, failing).await;
    assert!(failed_bill.metered < 1_000, "{failed_bill:?}");

    // A program that does not exist: the lease fails with the reason, and nothing is billed.
    let mut missing = job("no-program", "true");
    missing["image"] = json!("/no/such/program");
    let missing = submit(&world, missing).await;
    let failed = wait_for_job(&world, missing, "failed").await;
    let reason = failed["leases"][0]["end_reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("could not start the replica") && reason.contains("/no/such/program"),
        "the reason names the program: {failed}"
    );
    assert_eq!(check_bill(&world, missing).await, Bill::default());
    check_balances(&world, hello + failed_bill).await;

    stop_agent(stop, task).await;
    world.end().await;
}

/// The number a job wrote to `path` (a process id, a time), waiting for it; fails with `what`
/// after the deadline.
async fn read_number<T: std::str::FromStr>(path: &std::path::Path, what: &str) -> T {
    let start = Instant::now();
    loop {
        if let Some(number) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse::<T>().ok())
        {
            return number;
        }
        assert!(start.elapsed() < DEADLINE, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The process id a job wrote to `path`.
async fn read_pid(path: &std::path::Path, what: &str) -> i32 {
    read_number(path, what).await
}

/// Whether process `pid` runs: it exists and is not a zombie (a killed child of this test
/// process whose handle was dropped is reaped only when the runtime gets to it).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_cancelled_job_is_stopped_and_a_restarted_agent_stops_its_leftovers() {
    let world = world().await;
    let (_, stop, task) = start_agent(&world, "rig-2", ProcessExecutor).await;
    let pid_file = world.dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 300", pid_file.display());
    let id = submit(&world, job("long", &script)).await;
    wait_for_job(&world, id, "running").await;
    let pid = read_pid(&pid_file, "the job never started its process").await;
    assert!(alive(pid));
    let (status, cancelled) = call(
        &world,
        &world.tenant_key,
        reqwest::Method::POST,
        &format!("/v1/jobs/{id}/cancel"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{cancelled}");
    let start = Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < DEADLINE, "the cancelled job's process still runs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A second job; the agent stops without stopping it (as if killed), and a new agent on
    // the same data directory stops the leftover before running the lease again.
    let _ = std::fs::remove_file(&pid_file);
    let second = submit(&world, job("outlives", &script)).await;
    wait_for_job(&world, second, "running").await;
    let first_pid = read_pid(&pid_file, "the second job never started").await;
    // The agent writes the replica down just after it starts; it dies after that.
    let runs = world.dir.join("rig-2").join(agent::state::RUNS_FILE);
    let start = Instant::now();
    while !std::fs::read_to_string(&runs)
        .unwrap_or_default()
        .contains(&first_pid.to_string())
    {
        assert!(start.elapsed() < DEADLINE, "the replica was never written to runs.json");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    let _ = task.await;
    drop(stop);
    assert!(alive(first_pid), "an agent that dies leaves its process behind");
    let _ = std::fs::remove_file(&pid_file);
    let (_, stop, task) = start_agent(&world, "rig-2", ProcessExecutor).await;
    let start = Instant::now();
    while alive(first_pid) {
        assert!(
            start.elapsed() < DEADLINE,
            "the restarted agent did not stop the leftover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second_pid = read_pid(&pid_file, "the lease was not run again").await;
    assert_ne!(
        second_pid, first_pid,
        "a new process for the same lease, the old one gone"
    );
    let _ = stop.send(true);
    task.await.unwrap();
    assert!(!alive(second_pid), "a stopping agent stops its replicas");
    world.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_container_job_runs_on_the_agent_and_is_attested() {
    let Some(executor) = docker().await else { return };
    let world = world_with(|config| config.bill_simulated = true).await;
    let (node_id, stop, task) = start_agent(&world, "box-1", executor).await;
    let id = submit(
        &world,
        json!({
            "name": "in-a-box",
            "image": IMAGE,
            "command": ["/bin/sh", "-c", "echo \"hello from lease $FALLOW_LEASE_ID\"; sleep 1"],
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        }),
    )
    .await;
    let finished = wait_for_job(&world, id, "finished").await;
    let lease = &finished["leases"][0];
    assert_eq!(
        (lease["state"].as_str(), lease["node_id"].as_i64()),
        (Some("finished"), Some(node_id)),
        "{finished}"
    );
    let log = world
        .dir
        .join("box-1")
        .join("leases")
        .join(lease["id"].to_string())
        .join("output.log");
    let start = Instant::now();
    let wanted = format!("hello from lease {}", lease["id"]);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains(&wanted) {
        assert!(
            start.elapsed() < DEADLINE,
            "the container's output never reached {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, logs) = tenant_get(&world, &format!("/v1/jobs/{id}/logs")).await;
    assert_eq!(status, 200, "{logs}");
    let text: String = logs["chunks"]
        .as_array()
        .map(|chunks| chunks.iter().filter_map(|chunk| chunk["text"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        text.contains(&wanted),
        "the tenant reads the output through the API: {logs}"
    );
    assert_eq!(logs["chunks"][0]["lease_id"], lease["id"], "{logs}");
    let in_a_box = check_bill(&world, id).await;
    // It slept a second on one GPU, metered every 0.5 s.
    assert!(
        (900..5_000).contains(&in_a_box.metered) && in_a_box.charged > 0,
        "{in_a_box:?}"
    );
    let failing = submit(
        &world,
        json!({
            "name": "no-image",
            "image": "fallow-no-such-image:0",
            "command": ["true"],
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        }),
    )
    .await;
    let failed = wait_for_job(&world, failing, "failed").await;
    assert!(
        failed["leases"][0]["end_reason"]
            .as_str()
            .unwrap_or("")
            .contains("not on this node"),
        "a missing image fails the lease with the reason: {failed}"
    );
    assert_eq!(
        check_bill(&world, failing).await,
        Bill::default(),
        "nothing ran, nothing is billed"
    );
    check_balances(&world, in_a_box).await;
    stop_agent(stop, task).await;
    world.end().await;
}

/// A TCP proxy to the coordinator that can be cut (every connection dropped, new ones refused)
/// and restored: a network partition between one agent and the coordinator.
struct Proxy {
    url: String,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    links: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn to(target: &str) -> Proxy {
        let target = target.trim_start_matches("http://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let links = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (accept_open, accept_links) = (open.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accept_open.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let target = target.clone();
                let link = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                accept_links.lock().unwrap().push(link);
            }
        });
        Proxy { url, open, links }
    }

    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_cut_off_agent_stops_its_replica_before_the_lease_moves_so_the_job_never_runs_twice() {
    let world = world_with(|config| config.heartbeat_timeout_ms = 3_000).await;
    let proxy = Proxy::to(&world.base).await;
    let (cut_node, cut_stop, cut_task) =
        start_agent_with(agent_config_via(&world, "cut-off", &proxy.url), ProcessExecutor).await;
    let pids = world.dir.join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let script = format!("echo $$ > {}/$FALLOW_LEASE_ID; exec sleep 300", pids.display());
    let id = submit(&world, job("survives-a-partition", &script)).await;
    let running = wait_for_job(&world, id, "running").await;
    let first = running["leases"][0].clone();
    assert_eq!(first["node_id"], cut_node);
    let first_pid = read_pid(&pids.join(first["id"].to_string()), "the first replica never started").await;
    let (spare_node, spare_stop, spare_task) = start_agent(&world, "spare", ProcessExecutor).await;

    proxy.cut();
    let cut_at = Instant::now();
    let cut_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // The job moves to the spare node only after a whole timeout; the cut-off replica must be
    // gone before any replica starts there.
    let start = Instant::now();
    let second = loop {
        let (_, view) = tenant_get(&world, &format!("/v1/jobs/{id}")).await;
        if let Some(lease) = lease_on(&view, spare_node) {
            break lease;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the job never moved to the spare node: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!alive(first_pid), "the cut-off replica still ran when the lease moved");
    // A whole timeout after the last heartbeat the coordinator took, one interval (500 ms) or
    // less before the cut.
    assert!(
        cut_at.elapsed() >= Duration::from_millis(2_000),
        "the lease moved only after the timeout: {:?}",
        cut_at.elapsed()
    );
    let second_pid = read_pid(&pids.join(second["id"].to_string()), "the moved replica never started").await;
    assert!(alive(second_pid));

    // Contact returns: the cut-off agent learns its lease is gone and starts nothing again.
    proxy.restore();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let (_, view) = tenant_get(&world, &format!("/v1/jobs/{id}")).await;
    let lost = view["leases"]
        .as_array()
        .and_then(|leases| leases.iter().find(|lease| lease["id"] == first["id"]))
        .cloned()
        .expect("the first lease is listed");
    assert_eq!(lost["state"], "lost", "{view}");
    assert_eq!(view["state"], "running", "{view}");
    assert!(alive(second_pid), "the moved replica runs on");
    // What the replica delivered while cut off, up to the fence (half the 3 s timeout after the
    // last heartbeat, which came at most 500 ms before the cut), was metered then and is taken
    // once contact returns; nothing after the lease's end.
    let ended_ms = lost["ended_at_us"].as_i64().expect("ended_at_us") / 1000;
    let metered_to = world
        .running
        .state
        .store
        .usage_of_lease(first["id"].as_i64().unwrap())
        .await
        .unwrap()
        .iter()
        .map(|record| {
            serde_json::from_str::<Value>(&record.body).unwrap()["period_end_ms"]
                .as_i64()
                .unwrap()
        })
        .max()
        .expect("the lost lease was metered");
    assert!(
        metered_to >= cut_ms + 900 && metered_to <= ended_ms,
        "metered to {} ms after the cut; the lease ended {} ms after it",
        metered_to - cut_ms,
        ended_ms - cut_ms
    );
    assert!(!alive(first_pid));
    let _ = cut_stop.send(true);
    let _ = spare_stop.send(true);
    cut_task.await.unwrap();
    spare_task.await.unwrap();
    world.end().await;
}

/// The coordinator names the interval in its first answer, and the node keeps it from its
/// second beat on (the agent's own default is 10 s: a node that waited that long for its second
/// beat was declared silent under a shorter timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_node_beats_at_the_interval_the_coordinator_names_from_its_second_beat() {
    let world = world_with(|config| config.heartbeat_timeout_ms = 3_000).await;
    let beats = || {
        world
            .running
            .state
            .metrics
            .heartbeats
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = beats();
    let (_, stop, task) = start_agent(&world, "keeps-time", ProcessExecutor).await;
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    let taken = beats() - before;
    // A beat at once and one every 500 ms: five or six; three leaves room for a slow machine,
    // and one alone is the fault.
    assert!(taken >= 3, "{taken} heartbeats in 2.6 s at a 500 ms interval");
    stop_agent(stop, task).await;
    world.end().await;
}

/// Limits set at the coordinator (`fallow node policy set`) reach the running agent: its GPUs
/// run at 75 °C, under no limit; a 70 °C limit set by the owner makes the node say it is over
/// it within a few heartbeats, without a restart, and lifting the limit clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_limits_set_at_the_coordinator_reach_the_running_agent() {
    let world = world().await;
    let mut warm = simulated_h100s();
    for gpu in &mut warm.gpus {
        gpu.temperature_c = 75.0;
    }
    let (node, stop, task) = start_agent_on(agent_config(&world, "warm"), warm, ProcessExecutor).await;
    let path = format!("/v1/nodes/{node}");
    let over_limit = async |world: &World| -> Value {
        let (status, view) = call(world, &world.provider_key, reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 200, "{view}");
        view["over_limit_since_us"].clone()
    };
    let mut policy = call(&world, &world.provider_key, reqwest::Method::GET, &path, None)
        .await
        .1["policy"]
        .clone();
    assert_eq!(over_limit(&world).await, Value::Null, "no limit yet");
    for (limit, over) in [(json!(70), true), (Value::Null, false)] {
        policy["thermal_limit_c"] = limit.clone();
        let (status, answer) = call(
            &world,
            &world.provider_key,
            reqwest::Method::PUT,
            &format!("{path}/policy"),
            Some(policy.clone()),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let start = Instant::now();
        while over_limit(&world).await.is_null() == over {
            assert!(
                start.elapsed() < DEADLINE,
                "the node never said it is {}over a limit of {limit}",
                if over { "" } else { "no longer " }
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stop_agent(stop, task).await;
    world.end().await;
}

/// A registered node's agent restates what its configuration says on every start: a new name,
/// region and site reach the coordinator without registering again; asks set with `node policy
/// set` stand unless this start gives asks; a bad value stops the start with the setting's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_restarted_agent_restates_its_node_and_gives_asks_only_when_told() {
    let world = world().await;
    let (node, stop, task) = start_agent(&world, "host", ProcessExecutor).await;
    stop_agent(stop, task).await;
    let path = format!("/v1/nodes/{node}");
    let provider = async |method, path: &str, body| call(&world, &world.provider_key, method, path, body).await;
    let (_, view) = provider(reqwest::Method::GET, &path, None).await;
    let mut policy = view["policy"].clone();
    policy["asks"]["silver"] = json!("2.40");
    let (status, answer) = provider(reqwest::Method::PUT, &format!("{path}/policy"), Some(policy)).await;
    assert_eq!(status, 200, "{answer}");

    // Moved and renamed, its asks not given: the owner's $2.40 stands.
    let mut moved = agent_config(&world, "host");
    moved.name = "host-b".into();
    moved.region = "eu-north".into();
    moved.site = "arn1".into();
    moved.fabric = "arn1-net".into();
    let (again, stop, task) = start_agent_with(moved.clone(), ProcessExecutor).await;
    assert_eq!(again, node, "the same node, not a new one");
    stop_agent(stop, task).await;
    let (_, view) = provider(reqwest::Method::GET, &path, None).await;
    assert_eq!(
        (&view["name"], &view["region"], &view["site"], &view["fabric"]),
        (&json!("host-b"), &json!("eu-north"), &json!("arn1"), &json!("arn1-net")),
        "{view}"
    );
    assert_eq!(view["policy"]["asks"]["silver"], "2.40", "{view}");

    // Asks given for this start replace the owner's, limits with them.
    let mut told = moved.clone();
    told.policy.asks.insert("silver".into(), "1.80".into());
    told.policy.power_limit_w = Some(650);
    told.policy_given = true;
    let (_, stop, task) = start_agent_with(told, ProcessExecutor).await;
    stop_agent(stop, task).await;
    let (_, view) = provider(reqwest::Method::GET, &path, None).await;
    assert_eq!(view["policy"]["asks"]["silver"], "1.80", "{view}");
    assert_eq!(view["policy"]["power_limit_w"], 650, "{view}");

    // A bad value: the start fails, naming it, and the coordinator keeps what it had.
    let mut bad = moved;
    bad.region = "eu\nnorth".into();
    let inventory = simulated_h100s();
    let refused = match Agent::start(bad, inventory, ProcessExecutor).await {
        Ok(_) => panic!("a region with a newline in it was taken"),
        Err(error) => error.to_string(),
    };
    assert!(refused.contains("region"), "{refused}");
    let (_, view) = provider(reqwest::Method::GET, &path, None).await;
    assert_eq!(view["region"], "eu-north", "{view}");
    world.end().await;
}

/// The lease of a job's view on `node`, if it has one that is live.
fn lease_on(view: &Value, node: i64) -> Option<Value> {
    view["leases"]
        .as_array()?
        .iter()
        .find(|lease| {
            lease["node_id"] == node && matches!(lease["state"].as_str(), Some("pending" | "staging" | "running"))
        })
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_rotated_key_replaces_the_old_one() {
    let world = world().await;
    let (node_id, stop, task) = start_agent(&world, "rotor", ProcessExecutor).await;
    let _ = stop.send(true);
    task.await.unwrap();
    let dir = world.dir.join("rotor");
    let old = agent::state::load_key(&dir).unwrap();
    let new_public = agent::rotate_key(&dir, &world.base, &[])
        .await
        .expect("the rotation is accepted");
    let new = agent::state::load_key(&dir).unwrap();
    assert_eq!(new.public_hex(), new_public);
    assert_ne!(new.public_hex(), old.public_hex());
    assert!(!dir.join(agent::state::PENDING_KEY_FILE).exists());
    let client = agent::client::Client::new(&world.base).unwrap();
    let beat = api::HeartbeatRequest::default();
    match client.heartbeat(&old, node_id, &beat).await {
        Err(agent::client::ClientError::Refused { status: 401, .. }) => {}
        other => panic!("the old key still signs: {other:?}"),
    }
    client.heartbeat(&new, node_id, &beat).await.expect("the new key signs");
    let (_, node) = call(
        &world,
        &world.provider_key,
        reqwest::Method::GET,
        &format!("/v1/nodes/{node_id}"),
        None,
    )
    .await;
    assert_eq!(node["public_key"], new_public, "{node}");
    // The restarted agent signs with the new key and runs work.
    let (_, stop, task) = start_agent(&world, "rotor", ProcessExecutor).await;
    let id = submit(&world, job("after-rotation", "true")).await;
    let finished = wait_for_job(&world, id, "finished").await;
    assert_eq!(
        finished["cost_micros"], 0,
        "simulated GPUs are never billed unless the coordinator bills play money: {finished}"
    );
    stop_agent(stop, task).await;
    world.end().await;
}

/// A time in nanoseconds a job wrote to `path` (`date +%s%N`).
async fn read_nanos(path: &std::path::Path, what: &str) -> u128 {
    read_number(path, what).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_gold_starts_only_when_the_preempted_bronze_replica_has_left_its_gpus() {
    let world = world_with(|config| config.matcher.preemption_grace_s = 3).await;
    let (node_id, stop, task) = start_agent(&world, "shared", ProcessExecutor).await;
    let marks = world.dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let bronze = json!({
        "name": "bronze-sweep",
        "image": "/bin/sh",
        "command": ["-c", format!(
            "trap 'sleep 1; date +%s%N > {0}/bronze-end; exit 0' TERM; date +%s%N > {0}/bronze-start; while true; do sleep 0.1; done",
            marks.display()
        )],
        "gpus": 2,
        "tier": "bronze",
        "preemptible": true,
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    });
    let bronze_id = submit(&world, bronze).await;
    read_nanos(&marks.join("bronze-start"), "bronze never started").await;
    let gold = json!({
        "name": "gold-train",
        "image": "/bin/sh",
        "command": ["-c", format!("date +%s%N > {}/gold-start; sleep 1", marks.display())],
        "gpus": 2,
        "tier": "gold",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    });
    let gold_id = submit(&world, gold).await;
    let gold_start = read_nanos(&marks.join("gold-start"), "gold never started").await;
    let bronze_end = read_nanos(&marks.join("bronze-end"), "bronze never saw SIGTERM").await;
    assert!(
        gold_start >= bronze_end,
        "gold started {} ms before bronze left the GPUs",
        (bronze_end - gold_start) / 1_000_000
    );
    let finished = wait_for_job(&world, gold_id, "finished").await;
    assert_eq!(finished["leases"][0]["node_id"], node_id);
    let (_, bronze_view) = tenant_get(&world, &format!("/v1/jobs/{bronze_id}")).await;
    assert_ne!(bronze_view["leases"][0]["state"], "running", "{bronze_view}");
    stop_agent(stop, task).await;
    world.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_preempted_job_resumes_from_its_checkpoint() {
    let world = world_with(|config| config.matcher.preemption_grace_s = 2).await;
    let (_, stop, task) = start_agent(&world, "resumer", ProcessExecutor).await;
    let marks = world.dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    // Counts to 30 in steps of 0.1 s, saving its count on SIGTERM and starting from the saved
    // count when it runs again.
    let script = format!(
        "c=$(cat \"$FALLOW_CHECKPOINT_DIR/count\" 2>/dev/null || echo 0); echo \"start $c\" >> {0}/runs; \
         trap 'echo $c > \"$FALLOW_CHECKPOINT_DIR/count\"; exit 143' TERM; \
         while [ $c -lt 30 ]; do c=$((c + 1)); sleep 0.1; done; echo done > {0}/done",
        marks.display()
    );
    let bronze = json!({
        "name": "resumable",
        "image": "/bin/sh",
        "command": ["-c", script],
        "gpus": 2,
        "tier": "bronze",
        "preemptible": true,
        "checkpoint_dir": "/checkpoint",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    });
    let bronze_id = submit(&world, bronze).await;
    let start = Instant::now();
    while !std::fs::read_to_string(marks.join("runs"))
        .unwrap_or_default()
        .contains("start 0")
    {
        assert!(start.elapsed() < DEADLINE, "the bronze job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let gold = json!({
        "name": "urgent",
        "image": "/bin/sh",
        "command": ["-c", "sleep 0.5"],
        "gpus": 2,
        "tier": "gold",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    });
    let gold_id = submit(&world, gold).await;
    wait_for_job(&world, gold_id, "finished").await;
    let finished = wait_for_job(&world, bronze_id, "finished").await;
    let runs = std::fs::read_to_string(marks.join("runs")).unwrap();
    let starts: Vec<i64> = runs
        .lines()
        .filter_map(|line| line.strip_prefix("start ")?.parse().ok())
        .collect();
    assert_eq!(starts.len(), 2, "preempted once, run twice: {runs:?} {finished}");
    assert!(
        starts[1] > 0,
        "the second run resumed from the saved count, not from zero: {runs:?}"
    );
    let states: Vec<&str> = finished["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|lease| lease["state"].as_str())
        .collect();
    assert_eq!(states, vec!["preempted", "finished"], "{finished}");
    stop_agent(stop, task).await;
    world.end().await;
}

/// The preemption scenario with containers: a bronze container job runs; a gold job
/// needs its GPUs; the container gets SIGTERM, writes its checkpoint to `/checkpoint` within the
/// grace period and is stopped; the gold job runs; the bronze job queues again and resumes from
/// its checkpoint. Its output (read through the API) says where each run started.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_preempted_container_job_writes_its_checkpoint_and_resumes_from_it() {
    let Some(executor) = docker().await else { return };
    let world = world_with(|config| config.matcher.preemption_grace_s = 3).await;
    let (_, stop, task) = start_agent(&world, "container-resumer", executor).await;
    let script = "c=$(cat /checkpoint/count 2>/dev/null || echo 0); echo \"start $c\"; \
         trap 'echo $c > /checkpoint/count; echo \"saved $c\"; exit 143' TERM; \
         while [ $c -lt 40 ]; do c=$((c + 1)); sleep 0.1; done; echo done";
    let bronze = json!({
        "name": "resumable-container",
        "image": IMAGE,
        "command": ["/bin/sh", "-c", script],
        "gpus": 2,
        "tier": "bronze",
        "preemptible": true,
        "checkpoint_dir": "/checkpoint",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    });
    let bronze_id = submit(&world, bronze).await;
    wait_for_job(&world, bronze_id, "running").await;
    let output = async |job: i64| -> String {
        let (_, logs) = tenant_get(&world, &format!("/v1/jobs/{job}/logs")).await;
        logs["chunks"]
            .as_array()
            .map(|chunks| chunks.iter().filter_map(|chunk| chunk["text"].as_str()).collect())
            .unwrap_or_default()
    };
    let start = Instant::now();
    while !output(bronze_id).await.contains("start 0") {
        assert!(start.elapsed() < DEADLINE, "the bronze container never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let gold = json!({
        "name": "urgent-container",
        "image": IMAGE,
        "command": ["/bin/sh", "-c", "sleep 0.5"],
        "gpus": 2,
        "tier": "gold",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    });
    let gold_id = submit(&world, gold).await;
    let gold_view = wait_for_job(&world, gold_id, "finished").await;
    let finished = wait_for_job(&world, bronze_id, "finished").await;
    let text = output(bronze_id).await;
    let starts: Vec<i64> = text
        .lines()
        .filter_map(|line| line.strip_prefix("start ")?.parse().ok())
        .collect();
    let saved: Vec<i64> = text
        .lines()
        .filter_map(|line| line.strip_prefix("saved ")?.parse().ok())
        .collect();
    assert_eq!(starts.len(), 2, "preempted once, run twice: {text:?} {finished}");
    assert_eq!(saved.len(), 1, "the checkpoint was written on SIGTERM: {text:?}");
    assert!(saved[0] > 0, "{text:?}");
    assert_eq!(
        starts[1], saved[0],
        "the second run resumed from the checkpoint: {text:?}"
    );
    assert!(text.trim_end().ends_with("done"), "{text:?}");
    let states: Vec<&str> = finished["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|lease| lease["state"].as_str())
        .collect();
    assert_eq!(states, vec!["preempted", "finished"], "{finished}");
    // The gold job ran between the two: it started after the bronze lease ended.
    let preempted_end = finished["leases"][0]["ended_at_us"].as_i64().unwrap();
    let gold_start = gold_view["leases"][0]["created_at_us"].as_i64().unwrap();
    let resumed_start = finished["leases"][1]["created_at_us"].as_i64().unwrap();
    assert!(gold_start <= resumed_start, "gold first: {gold_view} {finished}");
    assert!(preempted_end <= resumed_start, "{finished}");
    stop_agent(stop, task).await;
    world.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_datasets_are_verified_before_the_job_starts() {
    let world = world_with(|config| config.bill_simulated = true).await;
    let (_, stop, task) = start_agent(&world, "library", ProcessExecutor).await;
    let source = world.dir.join("corpus.txt");
    std::fs::write(&source, "the quick brown fox\n").unwrap();
    let digest = format!("blake3:{}", blake3::hash(b"the quick brown fox\n").to_hex());
    let file = digest.replace(':', "-");
    // Another job's dataset, in the node's cache first: the next job must not see it.
    let other_source = world.dir.join("other.txt");
    std::fs::write(&other_source, "someone else's data\n").unwrap();
    let other_digest = format!("blake3:{}", blake3::hash(b"someone else's data\n").to_hex());
    let mut other = job("other-data", "true");
    other["datasets"] =
        json!([{"url": format!("file://{}", other_source.display()), "digest": other_digest, "size_bytes": 20}]);
    let other = submit(&world, other).await;
    wait_for_job(&world, other, "finished").await;
    let with_dataset = |digest: &str| {
        let mut request = job(
            "reads-data",
            &format!("ls \"$FALLOW_DATASETS_DIR\"; cat \"$FALLOW_DATASETS_DIR/{file}\""),
        );
        request["datasets"] =
            json!([{"url": format!("file://{}", source.display()), "digest": digest, "size_bytes": 20}]);
        request
    };
    let good = submit(&world, with_dataset(&digest)).await;
    wait_for_job(&world, good, "finished").await;
    let (_, logs) = tenant_get(&world, &format!("/v1/jobs/{good}/logs")).await;
    let text: String = logs["chunks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|chunk| chunk["text"].as_str())
        .collect();
    assert_eq!(
        text,
        format!("{file}\nthe quick brown fox\n"),
        "the job read its dataset and saw no other: {logs}"
    );
    let wrong = format!("blake3:{}", "0".repeat(64));
    let bad = submit(&world, with_dataset(&wrong)).await;
    let failed = wait_for_job(&world, bad, "failed").await;
    let reason = failed["leases"][0]["end_reason"].as_str().unwrap_or("");
    assert!(reason.contains("does not match"), "the reason says why: {failed}");
    let read = check_bill(&world, good).await + check_bill(&world, other).await;
    assert_eq!(
        check_bill(&world, bad).await,
        Bill::default(),
        "a job that never started is not billed"
    );
    check_balances(&world, read).await;
    stop_agent(stop, task).await;
    // A replica's view of its datasets went with it (once attested); the cache keeps them.
    let leases = world.dir.join("library").join("leases");
    for entry in std::fs::read_dir(&leases).unwrap() {
        let datasets = entry.unwrap().path().join("datasets");
        assert!(!datasets.exists(), "{} is left", datasets.display());
    }
    assert!(world.dir.join("library").join("datasets").join(&file).is_file());
    world.end().await;
}

/// A coordinator that restarts is not met by all its agents in the same second: agents that lost
/// it together (their heartbeats failing on the same beat) come back on backoff drawn with full
/// jitter, spread over the heartbeat interval, instead of on the beat they shared. The spread is
/// measured from the restarted coordinator's record of each node's first heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_restarted_coordinator_is_met_by_its_agents_spread_out() {
    const AGENTS: usize = 24;
    const INTERVAL_MS: u64 = 10_000;
    let world = world_with(|config| config.heartbeat_interval_ms = INTERVAL_MS).await;
    let mut agents = Vec::new();
    for index in 0..AGENTS {
        agents.push(start_agent(&world, &format!("crowd-{index}"), ProcessExecutor).await);
    }
    let listed = |world: &World| {
        let (http, base, key) = (world.http.clone(), world.base.clone(), world.provider_key.clone());
        async move {
            let answer = http.get(format!("{base}/v1/nodes")).bearer_auth(&key).send().await;
            let nodes: Vec<Value> = match answer {
                Ok(answer) if answer.status().is_success() => answer.json().await.unwrap_or_default(),
                _ => Vec::new(),
            };
            nodes
                .iter()
                .filter_map(|node| Some((node["id"].as_i64()?, node["last_heartbeat_at_us"].as_i64()?)))
                .collect::<std::collections::BTreeMap<i64, i64>>()
        }
    };
    let deadline = Instant::now() + DEADLINE;
    while listed(&world).await.len() < AGENTS {
        assert!(Instant::now() < deadline, "every agent heartbeats");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Down for longer than two beats: every agent's heartbeat fails while it is away.
    let mut world = world;
    let running = world.running;
    let addr = running.addr;
    running.stop().await;
    tokio::time::sleep(Duration::from_millis(2 * INTERVAL_MS + 5_000)).await;
    let config = server::Config {
        listen: addr.to_string(),
        data_dir: world.dir.join("coordinator"),
        heartbeat_interval_ms: INTERVAL_MS,
        gold_needs_badge: false,
        strict_view: true,
        ..server::Config::default()
    };
    let database = format!("sqlite://{}", world.dir.join("fallow.db").display());
    world.running = server::start(&database, config)
        .await
        .expect("the coordinator starts again");
    let restarted_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    // Each node's first heartbeat after the restart, seen before its second can replace it.
    let mut first = std::collections::BTreeMap::<i64, i64>::new();
    let deadline = Instant::now() + Duration::from_millis(INTERVAL_MS + 5_000);
    while first.len() < AGENTS && Instant::now() < deadline {
        for (node, at_us) in listed(&world).await {
            if at_us >= restarted_us {
                first.entry(node).or_insert(at_us);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(first.len(), AGENTS, "every agent came back within a heartbeat interval");
    let mut per_second = std::collections::BTreeMap::<i64, usize>::new();
    for at_us in first.values() {
        *per_second.entry((at_us - restarted_us) / 1_000_000).or_default() += 1;
    }
    let busiest = per_second.values().copied().max().unwrap_or(0);
    let span_ms = (first.values().max().unwrap() - first.values().min().unwrap()) / 1000;
    eprintln!("agents back per second after the restart: {per_second:?}; span {span_ms} ms");
    assert!(
        busiest * 2 <= AGENTS,
        "{busiest} of {AGENTS} agents came back in the same second: {per_second:?}"
    );
    assert!(
        span_ms >= 3_000,
        "the agents came back within {span_ms} ms: {per_second:?}"
    );
    for (_, stop, task) in agents {
        stop_agent(stop, task).await;
    }
    world.end().await;
}
