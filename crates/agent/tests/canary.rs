//! The agent's side of canaries against a real coordinator (SQLite): an HTTP proxy between the
//! agent and the coordinator adds a canary order to the coordinator's heartbeat answers and
//! keeps what the agent posts to `/v1/agent/canaries` (passing it on), so each test checks the
//! signed result the agent sends: its signature under the node's key, the known answer, the
//! rate of the simulated device, once per order, and nothing for a canary a lease interrupted.

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
    let dir = unique("fallow-agent-canary");
    std::fs::create_dir_all(&dir).unwrap();
    let config = server::Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.join("coordinator"),
        heartbeat_interval_ms: 300,
        ..server::Config::default()
    };
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
            let body = axum::body::to_bytes(body, 16 * 1024 * 1024).await.unwrap();
            let path = parts.uri.path_and_query().map_or("/", |path| path.as_str()).to_string();
            let mut forwarded = http
                .request(parts.method.clone(), format!("{target}{path}"))
                .timeout(Duration::from_secs(60))
                .body(body.clone());
            for (name, value) in &parts.headers {
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
    AgentConfig {
        coordinator: coordinator.to_string(),
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
        allow_file_datasets: false,
        guard_program: None,
        // In this process: the agent crate's tests have no `fallow` binary.
        canary_program: None,
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
    let seen = Arc::new(Mutex::new(Seen {
        order: Some(order),
        posted: Vec::new(),
    }));
    let url = proxy(world.base.clone(), seen.clone()).await;
    let mut inventory = agent::gpu::simulated(device, |_| true).unwrap();
    // An honest agent claims its device; a lying one another model.
    inventory.model = claimed.to_string();
    let config = agent_config(world, name, &url);
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
#[ignore = "needs the coordinator's canary route"]
async fn the_coordinator_takes_the_agents_signed_result() {
    let world = world().await;
    let ordered = order(44, 10, &[0]);
    let running = start_agent(&world, "route", "H100-SXM5:1", "H100-SXM5", ordered).await;
    let posted = running.wait_for_posts(1).await;
    assert_eq!(posted.len(), 1, "the agent posted its result");
    let answer = &posted[0];
    // The route exists and took the agent's signed request: an order the coordinator never made
    // may be refused, but not as an unknown route or a bad signature.
    assert!(
        ![401, 404, 405].contains(&answer.coordinator_status),
        "the coordinator answered {}: {}",
        answer.coordinator_status,
        answer.coordinator_answer
    );
    running.stop().await;
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}
