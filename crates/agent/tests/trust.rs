//! The trust policy end to end (docs/trust-policy.md), with real agents against a real
//! coordinator (SQLite). An HTTP proxy between an agent and the coordinator can add a canary
//! order to heartbeat answers and keeps what the agent posts to `/v1/agent/canaries`, so the
//! first tests check the signed result an agent sends: its signature under the node's key, the
//! known answer, the rate of the simulated device, once per order, nothing for a canary a lease
//! interrupted. The proxy can also patch an agent into a liar: it inflates every usage record
//! and signs it again with the node's own key. The last tests let the coordinator order the
//! canaries: an agent that claims H100s on simulated A100s, and one that inflates its usage, are
//! caught, slashed and cordoned, their tenants paid back, while an honest agent beside them is
//! left alone.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent::exec::process::ProcessExecutor;
use agent::{Agent, AgentConfig};
use common::{DEADLINE, unique};
use serde_json::{Value, json};

struct World {
    base: String,
    http: reqwest::Client,
    admin_key: String,
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

async fn world() -> World {
    world_with(|_| {}).await
}

async fn world_with(configure: impl FnOnce(&mut server::Config)) -> World {
    let dir = unique("fallow-agent-canary");
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = server::Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.join("coordinator"),
        heartbeat_interval_ms: 300,
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
        admin_key: admin.clone(),
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
        Some(json!({"account_id": keys[0].0, "amount": "100.00", "key": "canary-credit"})),
    )
    .await;
    assert_eq!(status, 200);
    world.tenant_key = keys[0].1.clone();
    world.provider_key = keys[1].1.clone();
    world
}

/// One canary result the agent posted, with the coordinator's answer to it.
#[derive(Clone, Debug)]
struct Posted {
    result: api::SignedCanaryResult,
    coordinator_status: u16,
    coordinator_answer: String,
}

/// What the proxy shares with the test.
#[derive(Default)]
struct Seen {
    /// The order added to every heartbeat answer.
    order: Option<api::CanaryOrder>,
    posted: Vec<Posted>,
    /// The liar's patch: every usage record's GPU-seconds times this (per mille), signed again
    /// with the key of the node registered in this data directory.
    inflate: Option<(i64, PathBuf)>,
    /// Usage records passed on, and how the coordinator answered each.
    usage_answers: Vec<u16>,
}

/// An agent's usage request, its record inflated and signed again by the node's own key.
fn inflated(
    body: &[u8],
    permille: i64,
    data_dir: &std::path::Path,
    path: &str,
) -> (Vec<u8>, Vec<(&'static str, String)>) {
    let key = agent::state::load_key(data_dir).expect("the node's key");
    let node = agent::state::read_node(data_dir)
        .unwrap()
        .expect("a registered node")
        .node_id;
    let mut signed: trust::SignedRecord<trust::UsageRecord> =
        serde_json::from_slice(body).expect("the agent posts a signed usage record");
    signed.body.gpu_seconds_milli = signed.body.gpu_seconds_milli * permille / 1000;
    let body = serde_json::to_vec(&trust::sign_record(&key, node, &signed.body)).unwrap();
    let headers = key
        .sign_request_now(node, "POST", path, &body, now_ms())
        .header_pairs()
        .to_vec();
    (body, headers)
}

/// The proxy: forwards every request to the coordinator as it is (the agent's signatures cover
/// the method, path and body, which it keeps), adds `Seen::order` to heartbeat answers, and
/// keeps the canary results.
async fn proxy(target: String, seen: Arc<Mutex<Seen>>) -> String {
    let http = reqwest::Client::new();
    let forward = move |request: axum::extract::Request| {
        let (http, target, seen) = (http.clone(), target.clone(), seen.clone());
        async move {
            let (parts, body) = request.into_parts();
            let mut body = axum::body::to_bytes(body, 16 * 1024 * 1024).await.unwrap();
            let path = parts.uri.path_and_query().map_or("/", |path| path.as_str()).to_string();
            let mut headers = parts.headers.clone();
            let patch = seen.lock().unwrap().inflate.clone();
            if let Some((permille, data_dir)) = patch
                && parts.uri.path() == "/v1/agent/usage"
            {
                let (lie, signed) = inflated(&body, permille, &data_dir, &path);
                body = lie.into();
                for (name, value) in signed {
                    headers.insert(name, value.parse().unwrap());
                }
            }
            let mut forwarded = http
                .request(parts.method.clone(), format!("{target}{path}"))
                .timeout(Duration::from_secs(60))
                .body(body.clone());
            for (name, value) in &headers {
                if name != "host" && name != "content-length" {
                    forwarded = forwarded.header(name, value);
                }
            }
            let answer = forwarded.send().await.expect("the coordinator answers the proxy");
            let status = answer.status();
            let mut bytes = answer.bytes().await.unwrap().to_vec();
            if parts.uri.path() == "/v1/agent/heartbeat" && status.is_success() {
                let order = seen.lock().unwrap().order.clone();
                if let Some(order) = order {
                    let mut beat: Value = serde_json::from_slice(&bytes).unwrap();
                    beat["canaries"] = json!([order]);
                    bytes = serde_json::to_vec(&beat).unwrap();
                }
            }
            if parts.uri.path() == "/v1/agent/usage" {
                seen.lock().unwrap().usage_answers.push(status.as_u16());
            }
            if parts.uri.path() == "/v1/agent/canaries" {
                let result: api::SignedCanaryResult =
                    serde_json::from_slice(&body).expect("the agent posts a SignedCanaryResult");
                seen.lock().unwrap().posted.push(Posted {
                    result,
                    coordinator_status: status.as_u16(),
                    coordinator_answer: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            axum::response::Response::builder()
                .status(status.as_u16())
                .header("content-type", "application/json")
                .body(axum::body::Body::from(bytes))
                .unwrap()
        }
    };
    let app = axum::Router::new().fallback(forward);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn agent_config(world: &World, name: &str, coordinator: &str) -> AgentConfig {
    agent_config_for(world, &world.provider_key.clone(), name, coordinator, "2.00")
}

fn agent_config_for(world: &World, provider_key: &str, name: &str, coordinator: &str, silver: &str) -> AgentConfig {
    AgentConfig {
        coordinator: coordinator.to_string(),
        ca_certs: Vec::new(),
        policy_given: false,
        provider_key: Some(provider_key.to_string()),
        data_dir: world.dir.join(name),
        name: name.to_string(),
        region: "eu-west".into(),
        site: "ams1".into(),
        fabric: "ams1-net".into(),
        cpu_milli: 16_000,
        memory_mib: 65_536,
        policy: api::PolicyDoc {
            asks: [("gold", "3.00"), ("silver", silver), ("bronze", "1.00")]
                .into_iter()
                .map(|(tier, ask)| (tier.to_string(), ask.to_string()))
                .collect(),
            ..api::PolicyDoc::default()
        },
        usage_every: Duration::from_millis(500),
        grace: Duration::from_secs(2),
        allow_file_datasets: false,
        dataset_cache_bytes: None,
        guard_program: None,
        // In this process: the agent crate's tests have no `fallow` binary.
        canary_program: None,
        matmul_device: None,
        topology: agent::NodeTopology::default(),
        scratch_encryption: agent::ScratchEncryption::Auto,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn order(id: i64, units: u64, gpus: &[u8]) -> api::CanaryOrder {
    api::CanaryOrder {
        id,
        kind: api::CanaryKind::Hash,
        seed: format!("agent-test-seed-{id}"),
        units,
        gpus: gpus.to_vec(),
        memory_mib: 72 * 1024,
        deadline_ms: now_ms() + 600_000,
    }
}

/// A running agent behind the proxy, with what it offers; stopped by `stop`.
struct Running {
    node_id: i64,
    data_dir: PathBuf,
    seen: Arc<Mutex<Seen>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
    }

    /// The results posted once `count` are, or the deadline passes.
    async fn wait_for_posts(&self, count: usize) -> Vec<Posted> {
        let start = Instant::now();
        loop {
            let posted = self.seen.lock().unwrap().posted.clone();
            if posted.len() >= count || start.elapsed() > DEADLINE {
                return posted;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Starts an agent whose simulated device is `device` (`MODEL:COUNT`) and whose claim is
/// `claimed`, behind a proxy that orders `order` in every heartbeat answer.
async fn start_agent(world: &World, name: &str, device: &str, claimed: &str, order: api::CanaryOrder) -> Running {
    let seen = Seen {
        order: Some(order),
        ..Seen::default()
    };
    let config_of = |url: &str| agent_config(world, name, url);
    start_agent_with(world, device, claimed, seen, config_of).await
}

/// Starts an agent behind a proxy doing what `seen` says, configured by `config_of(proxy URL)`.
async fn start_agent_with(
    world: &World,
    device: &str,
    claimed: &str,
    seen: Seen,
    config_of: impl FnOnce(&str) -> AgentConfig,
) -> Running {
    let seen = Arc::new(Mutex::new(seen));
    let url = proxy(world.base.clone(), seen.clone()).await;
    let mut inventory = agent::gpu::simulated(device, |_| true).unwrap();
    // An honest agent claims its device; a lying one another model.
    inventory.model = claimed.to_string();
    spawn_agent(config_of(&url), inventory, seen).await
}

/// Starts the agent of `inventory` with `config` and runs it on a task of its own.
async fn spawn_agent(config: AgentConfig, inventory: agent::gpu::Inventory, seen: Arc<Mutex<Seen>>) -> Running {
    let data_dir = config.data_dir.clone();
    let agent = Agent::start(config, inventory, ProcessExecutor)
        .await
        .expect("the agent registers");
    let node_id = agent.node_id();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        agent.run(stopped).await.expect("the agent runs");
    });
    Running {
        node_id,
        data_dir,
        seen,
        stop,
        task,
    }
}

/// The result's signature verifies under the node's key, over the values sent.
fn check_signed(running: &Running, posted: &Posted) {
    let key = agent::state::load_key(&running.data_dir).unwrap();
    let body = posted.result.body.clone();
    let signed = trust::SignedRecord {
        body: trust::canary::CanaryResult {
            canary_id: body.canary_id,
            seed: body.seed,
            units: body.units,
            digest: body.digest,
            elapsed_ms: body.elapsed_ms,
            rate_milli: body.rate_milli,
            memory_allocated: body.memory_allocated,
            measured_on: body.measured_on,
        },
        signature_hex: posted.result.signature_hex.clone(),
    };
    trust::verify_record(&key.verifying_key(), running.node_id, &signed)
        .expect("the result is signed by the node's key over its body");
    let mut tampered = signed.clone();
    tampered.body.rate_milli += 1;
    assert!(
        trust::verify_record(&key.verifying_key(), running.node_id, &tampered).is_err(),
        "the signature covers the rate"
    );
}

/// An H100's reference rate (`trust::canary::expected_rate_milli(1000)`).
const H100_RATE_MILLI: i64 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_honest_agent_answers_a_canary_order_once_with_a_signed_result() {
    let world = world().await;
    // 0.3 s of an H100's work on each of its two GPUs.
    let ordered = order(41, 30, &[0, 1]);
    let running = start_agent(&world, "honest", "H100-SXM5:2", "H100-SXM5", ordered.clone()).await;
    let posted = running.wait_for_posts(1).await;
    assert_eq!(posted.len(), 1, "the agent posted its result");
    // The order stays in every heartbeat answer; it still runs only once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let posted = running.seen.lock().unwrap().posted.clone();
    assert_eq!(
        posted.len(),
        1,
        "an order runs once, however often it is seen: {posted:?}"
    );
    let body = &posted[0].result.body;
    assert_eq!(
        (body.canary_id, body.seed.as_str(), body.units),
        (41, ordered.seed.as_str(), 30)
    );
    assert_eq!(body.digest, trust::canary::answer(&ordered.seed, &[0, 1], 30));
    assert_eq!(body.measured_on, "simulated:H100-SXM5");
    assert!(body.rate_milli >= H100_RATE_MILLI * 90 / 100, "{body:?}");
    assert!(body.memory_allocated, "72 GiB fit in an H100's 80: {body:?}");
    check_signed(&running, &posted[0]);
    running.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_a100_claimed_as_an_h100_reports_the_a100s_rate() {
    let world = world().await;
    let ordered = order(42, 30, &[0]);
    let running = start_agent(&world, "liar", "A100-SXM4-80GB:1", "H100-SXM5", ordered.clone()).await;
    let posted = running.wait_for_posts(1).await;
    assert_eq!(posted.len(), 1, "the agent posted its result");
    let body = &posted[0].result.body;
    assert_eq!(
        body.digest,
        trust::canary::answer(&ordered.seed, &[0], 30),
        "right answer"
    );
    assert_eq!(body.measured_on, "simulated:A100-SXM4-80GB");
    assert!(
        body.rate_milli < H100_RATE_MILLI * 60 / 100,
        "far below an H100's rate: {body:?}"
    );
    check_signed(&running, &posted[0]);
    running.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_on_a_canarys_gpus_stops_it_unreported() {
    let world = world().await;
    // 100 s of an A100's work: still running when the lease arrives.
    let ordered = order(43, 3_150, &[0]);
    let running = start_agent(&world, "busy", "A100-SXM4-80GB:1", "A100-SXM4-80GB", ordered).await;
    // The canary is under way once the agent has had a heartbeat answer.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, job) = call(
        &world,
        &world.tenant_key,
        reqwest::Method::POST,
        "/v1/jobs",
        Some(json!({
            "name": "needs-the-gpu",
            "image": "/bin/sh",
            "command": ["-c", "sleep 0.5"],
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        })),
    )
    .await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_i64().unwrap();
    let start = Instant::now();
    loop {
        let (_, view) = call(
            &world,
            &world.tenant_key,
            reqwest::Method::GET,
            &format!("/v1/jobs/{id}"),
            None,
        )
        .await;
        if view["state"] == "finished" {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the job never finished: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A stopped canary is never reported (the coordinator orders another later).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let posted = running.seen.lock().unwrap().posted.clone();
    assert!(posted.is_empty(), "the interrupted canary was reported: {posted:?}");
    running.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_coordinator_takes_the_agents_signed_result() {
    let world = world().await;
    let ordered = order(44, 10, &[0]);
    let running = start_agent(&world, "route", "H100-SXM5:1", "H100-SXM5", ordered).await;
    let posted = running.wait_for_posts(1).await;
    assert_eq!(posted.len(), 1, "the agent posted its result");
    let answer = &posted[0];
    // The route took the agent's signed request (no unknown route, no bad signature), and
    // refused an order it never made, keeping the attempt as evidence.
    assert_eq!(
        answer.coordinator_status, 403,
        "the coordinator answered {}",
        answer.coordinator_answer
    );
    assert!(
        answer.coordinator_answer.contains("not ordered"),
        "{}",
        answer.coordinator_answer
    );
    running.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

/// The coordinator orders canaries itself here: at once after registration and after a failed
/// one, a second long on the claimed GPU; simulated devices are billed (play money) so that
/// there is something to pay back.
fn policing(config: &mut server::Config) {
    config.canary_within_ms = 0;
    config.canary_check_every_ms = 200;
    config.canary_seconds = 1;
    config.bill_simulated = true;
}

/// A provider of its own with a bond of `dollars`, posted by the admin; its id and key.
async fn bonded_provider(world: &World, name: &str, dollars: &str) -> (i64, String) {
    let (status, created) = call(
        world,
        &world.admin_key,
        reqwest::Method::POST,
        "/v1/admin/accounts",
        Some(json!({"role": "provider", "name": name})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["account"]["id"].as_i64().unwrap();
    let (status, bonded) = call(
        world,
        &world.admin_key,
        reqwest::Method::POST,
        "/v1/admin/bonds",
        Some(json!({"provider_id": id, "amount": dollars, "key": format!("bond-{name}")})),
    )
    .await;
    assert_eq!(status, 200, "{bonded}");
    (id, created["api_key"]["api_key"].as_str().unwrap().to_string())
}

async fn submit_job(world: &World, name: &str, seconds: u32) -> i64 {
    let (status, job) = call(
        world,
        &world.tenant_key,
        reqwest::Method::POST,
        "/v1/jobs",
        Some(json!({
            "name": name,
            "image": "/bin/sh",
            "command": ["-c", format!("sleep {seconds}")],
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        })),
    )
    .await;
    assert_eq!(status, 201, "{job}");
    job["id"].as_i64().unwrap()
}

/// Polls `probe` on the coordinator until it returns `Some`, for at most `DEADLINE` × 2.
async fn wait_until<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(start.elapsed() < DEADLINE * 2, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The job's lease on `node`, once the job runs there.
async fn running_on(world: &World, job: i64, node: i64) -> Value {
    wait_until(&format!("job {job} to run on node {node}"), async || {
        let (_, view) = call(
            world,
            &world.tenant_key,
            reqwest::Method::GET,
            &format!("/v1/jobs/{job}"),
            None,
        )
        .await;
        view["leases"]
            .as_array()?
            .iter()
            .find(|lease| lease["node_id"] == node && lease["state"] == "running")
            .cloned()
    })
    .await
}

async fn standing(world: &World, provider: i64) -> Value {
    let (status, view) = call(
        world,
        &world.admin_key,
        reqwest::Method::GET,
        &format!("/v1/trust?provider_id={provider}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    view
}

/// The fraud decision about `node`, once there is one.
async fn fraud_against(world: &World, node: i64) -> Value {
    wait_until(&format!("a fraud decision about node {node}"), async || {
        let (_, frauds) = call(world, &world.admin_key, reqwest::Method::GET, "/v1/frauds", None).await;
        frauds
            .as_array()?
            .iter()
            .find(|fraud| fraud["node_id"] == node)
            .cloned()
    })
    .await
}

/// What the tenant was paid back by slashes, from its statement.
async fn slash_refunds(world: &World) -> i64 {
    let (_, statement) = call(world, &world.tenant_key, reqwest::Method::GET, "/v1/statement", None).await;
    statement["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|line| line["kind"] == "slash")
        .map(|line| line["amount_micros"].as_i64().unwrap())
        .sum()
}

/// The honest provider's standing after it all: bond whole, no fraud, its node not cordoned and
/// its last canary passed.
async fn check_untouched(world: &World, provider: i64, bond_micros: i64) {
    let view = standing(world, provider).await;
    assert_eq!(view["bond_micros"], bond_micros, "{view}");
    assert_eq!(view["frauds"], json!([]), "{view}");
    let node = &view["nodes"][0];
    assert_eq!(node["fraud_cordoned_at_us"], Value::Null, "{view}");
    assert_eq!(node["last_canary"]["finding"], "passed", "{view}");
}

/// A market of two providers with $100 bonds: a liar (`liar_device` claimed as H100s, its
/// traffic patched as `patch` says, asking less) and an honest H100 node. The job is queued
/// first, so the liar takes it at once (canaries come after placements, on the GPU left idle);
/// the honest node starts once it runs there.
struct Market {
    job: i64,
    liar_provider: i64,
    liar: Running,
    honest_provider: i64,
    honest: Running,
}

async fn market(world: &World, liar_name: &str, liar_device: &str, patch: Seen, job_seconds: u32) -> Market {
    let (liar_provider, liar_key) = bonded_provider(world, &format!("{liar_name}-farm"), "100.00").await;
    let (honest_provider, honest_key) = bonded_provider(world, "honest-farm", "100.00").await;
    let job = submit_job(world, &format!("on-the-{liar_name}"), job_seconds).await;
    let liar = start_agent_with(world, liar_device, "H100-SXM5", patch, |url| {
        agent_config_for(world, &liar_key, liar_name, url, "1.50")
    })
    .await;
    running_on(world, job, liar.node_id).await;
    let honest = start_agent_with(world, "H100-SXM5:2", "H100-SXM5", Seen::default(), |url| {
        agent_config_for(world, &honest_key, "honest", url, "2.00")
    })
    .await;
    Market {
        job,
        liar_provider,
        liar,
        honest_provider,
        honest,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_claiming_h100s_on_a100s_is_caught_by_canaries_slashed_and_its_tenant_refunded() {
    let world = world_with(policing).await;
    let Market {
        job,
        liar_provider,
        liar,
        honest_provider,
        honest,
    } = market(&world, "liar", "A100-SXM4-80GB:2", Seen::default(), 20).await;

    // Two slow canaries in a row (a third of the claimed rate) prove false hardware.
    let fraud = fraud_against(&world, liar.node_id).await;
    assert_eq!(fraud["kind"], "false_hardware", "{fraud}");
    assert_eq!(fraud["slashed_micros"], 50_000_000, "half the bond: {fraud}");
    let canaries = fraud["evidence"]["canaries"].as_array().unwrap();
    assert_eq!(canaries.len(), 2, "{fraud}");
    let key = agent::state::load_key(&liar.data_dir).unwrap();
    for canary in canaries {
        assert_eq!(canary["finding"], "slow", "{canary}");
        assert!(
            canary["rate_milli"].as_i64().unwrap() < H100_RATE_MILLI * 60 / 100,
            "{canary}"
        );
        let signed = trust::SignedRecord {
            body: serde_json::from_value::<trust::canary::CanaryResult>(canary["result"].clone()).unwrap(),
            signature_hex: canary["signature_hex"].as_str().unwrap().to_string(),
        };
        trust::verify_record(&key.verifying_key(), liar.node_id, &signed)
            .expect("the evidence is the liar's own signed result");
        assert_eq!(signed.body.measured_on, "simulated:A100-SXM4-80GB");
    }
    // The tenant is paid back what it paid for the liar's work, out of the slashed bond.
    let refunds = fraud["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 1, "{fraud}");
    let paid = refunds[0]["paid_micros"].as_i64().unwrap();
    assert!(paid > 0, "the liar's work was billed and is refunded: {fraud}");
    assert_eq!(refunds[0]["owed_micros"], paid, "{fraud}");
    assert_eq!(slash_refunds(&world).await, paid);
    let view = standing(&world, liar_provider).await;
    assert_eq!(view["bond_micros"], 50_000_000, "{view}");
    assert!(view["nodes"][0]["fraud_cordoned_at_us"].is_i64(), "{view}");
    // The job leaves the liar and finishes on the honest node.
    running_on(&world, job, honest.node_id).await;
    let (_, lost) = call(
        &world,
        &world.tenant_key,
        reqwest::Method::GET,
        &format!("/v1/jobs/{job}"),
        None,
    )
    .await;
    assert!(
        lost["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|lease| lease["node_id"] == liar.node_id && lease["state"] == "lost"),
        "{lost}"
    );
    wait_until("the honest node's canary", async || {
        let view = standing(&world, honest_provider).await;
        (view["nodes"][0]["last_canary"]["finding"] == "passed").then_some(())
    })
    .await;
    check_untouched(&world, honest_provider, 100_000_000).await;
    liar.stop().await;
    honest.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_inflating_its_usage_is_caught_by_the_cross_checks_slashed_and_cordoned() {
    let world = world_with(policing).await;
    let patch = Seen {
        inflate: Some((1_500, world.dir.join("padder"))),
        ..Seen::default()
    };
    let Market {
        job,
        liar_provider,
        liar,
        honest_provider,
        honest,
    } = market(&world, "padder", "H100-SXM5:2", patch, 30).await;

    // Every record claims half as much again as its period allows: refused, kept, and the
    // third within a day proves inflated usage.
    let fraud = fraud_against(&world, liar.node_id).await;
    assert_eq!(fraud["kind"], "inflated_usage", "{fraud}");
    assert_eq!(fraud["section"], "§ 4", "{fraud}");
    assert_eq!(fraud["slashed_micros"], 25_000_000, "a quarter of the bond: {fraud}");
    let records = fraud["evidence"]["records"].as_array().unwrap();
    assert_eq!(records.len(), 3, "{fraud}");
    for record in records {
        assert_eq!(record["detail"]["violation"]["check"], "over_capacity", "{record}");
    }
    let answers = liar.seen.lock().unwrap().usage_answers.clone();
    assert!(
        answers
            .iter()
            .all(|status| *status == 400 || *status == 403 || *status == 409),
        "{answers:?}"
    );
    // Nothing the liar claimed was billed; the tenant paid nothing for it.
    assert_eq!(fraud["refunds"], json!([]), "{fraud}");
    let view = standing(&world, liar_provider).await;
    assert_eq!(view["bond_micros"], 75_000_000, "{view}");
    assert!(view["nodes"][0]["fraud_cordoned_at_us"].is_i64(), "{view}");
    running_on(&world, job, honest.node_id).await;
    wait_until("the honest node's canary", async || {
        let view = standing(&world, honest_provider).await;
        (view["nodes"][0]["last_canary"]["finding"] == "passed").then_some(())
    })
    .await;
    // The honest agent's records are taken and billed (the liar's never were).
    wait_until("the honest node's usage to be billed", async || {
        let (_, view) = call(
            &world,
            &world.tenant_key,
            reqwest::Method::GET,
            &format!("/v1/jobs/{job}"),
            None,
        )
        .await;
        (view["cost_micros"].as_i64()? > 0).then_some(())
    })
    .await;
    check_untouched(&world, honest_provider, 100_000_000).await;
    liar.stop().await;
    honest.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

/// The matmul canary end to end, with the agent's CPU reference standing in for the GPU (this
/// machine has none; `scripts/gpu-smoke.sh` runs the CUDA path): the agent registers that it runs
/// the matmul canary, the coordinator orders one, the agent commits to each GPU's product,
/// answers the challenge with the rows asked for, and the coordinator checks them. The CPU
/// reference measures no rate, so the product checks out and the canary is found slow, with the
/// reason the provider reads; the kept products are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_matmul_canary_round_trip_with_the_cpu_reference_standing_in_for_the_gpu() {
    let world = world_with(|config| {
        policing(config);
        config.canary_matmul_n = 64;
    })
    .await;
    let mut inventory = agent::gpu::simulated("H100-SXM5:2", |_| true).unwrap();
    // As real GPUs would be: not simulated, no device to pace like.
    inventory.simulated = false;
    inventory.simulated_device = None;
    let config = AgentConfig {
        matmul_device: Some(agent::matmul::MatmulDevice::CpuReference),
        ..agent_config(&world, "cuda-node", &world.base.clone())
    };
    let running = spawn_agent(config, inventory, Arc::default()).await;
    let node_id = running.node_id;

    let canary = wait_until("the node's first canary to be found", async || {
        let (status, canaries) = call(
            &world,
            &world.provider_key,
            reqwest::Method::GET,
            &format!("/v1/nodes/{node_id}/canaries"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{canaries}");
        canaries
            .as_array()?
            .iter()
            .rev()
            .find(|canary| !canary["finding"].is_null())
            .cloned()
    })
    .await;
    assert_eq!(canary["kind"], "matmul", "{canary}");
    assert_eq!(canary["units"], 64, "{canary}");
    assert_eq!(
        canary["finding"], "slow",
        "the proof checks out; the CPU reference measures no rate: {canary}"
    );
    let reason = canary["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("TFLOPS"), "{reason}");
    assert_eq!(canary["result"]["measured_on"], "cpu-reference", "{canary}");
    let roots = canary["result"]["digest"].as_str().unwrap_or_default();
    assert_eq!(roots.split(',').count(), 2, "one root per GPU: {roots}");
    let products = running.data_dir.join(agent::CANARY_PRODUCTS_DIR);
    wait_until("the products to be deleted", async || {
        let left = std::fs::read_dir(&products).map_or(0, |entries| entries.count());
        (left == 0).then_some(())
    })
    .await;

    running.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}
