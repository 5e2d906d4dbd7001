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

async fn world() -> World {
    let dir = unique("fallow-agent-e2e");
    std::fs::create_dir_all(&dir).unwrap();
    let config = server::Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.join("coordinator"),
        heartbeat_interval_ms: 500,
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
        Some(json!({"account_id": keys[0].0, "amount": "100.00", "key": "e2e-credit"})),
    )
    .await;
    assert_eq!(status, 200);
    world.tenant_key = keys[0].1.clone();
    world.provider_key = keys[1].1.clone();
    world
}

fn agent_config(world: &World, name: &str) -> AgentConfig {
    AgentConfig {
        coordinator: world.base.clone(),
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
    }
}

/// Starts an agent with two simulated H100s; returns its node id and the handle to stop it.
async fn start_agent<E: Executor>(
    world: &World,
    name: &str,
    executor: E,
) -> (i64, tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let inventory = agent::gpu::simulated("H100-SXM5:2", |name| name == "H100-SXM5").unwrap();
    let agent = Agent::start(agent_config(world, name), inventory, executor)
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
        let (_, view) = call(
            world,
            &world.tenant_key,
            reqwest::Method::GET,
            &format!("/v1/jobs/{id}"),
            None,
        )
        .await;
        if view["state"] == state {
            return view;
        }
        assert!(start.elapsed() < DEADLINE, "job {id} never reached {state}: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn submit(world: &World, job: Value) -> i64 {
    let (status, view) = call(world, &world.tenant_key, reqwest::Method::POST, "/v1/jobs", Some(job)).await;
    assert_eq!(status, 201, "{view}");
    view["id"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_process_job_runs_on_the_agent_and_is_attested() {
    let world = world().await;
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
        "echo \"lease $FALLOW_LEASE_ID on GPU $CUDA_VISIBLE_DEVICES\" > {}; sleep 1.5",
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
    assert_eq!(
        finished["cost_micros"], 0,
        "simulated GPUs are never billed: {finished}"
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
    let (_, logs) = call(
        &world,
        &world.tenant_key,
        reqwest::Method::GET,
        &format!("/v1/jobs/{failing}/logs"),
        None,
    )
    .await;
    assert_eq!(logs["chunks"][0]["text"], "oops\n", "stderr reaches the tenant: {logs}");

    let _ = stop.send(true);
    task.await.unwrap();
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

/// The process id a job wrote to `path`, waiting for it; fails with `what` after the deadline.
async fn read_pid(path: &std::path::Path, what: &str) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
        {
            return pid;
        }
        assert!(start.elapsed() < DEADLINE, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
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
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_a_container_job_runs_on_the_agent_and_is_attested() {
    let Some(executor) = docker().await else { return };
    let world = world().await;
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
    let (status, logs) = call(
        &world,
        &world.tenant_key,
        reqwest::Method::GET,
        &format!("/v1/jobs/{id}/logs"),
        None,
    )
    .await;
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
    let _ = stop.send(true);
    task.await.unwrap();
    world.running.stop().await;
    let _ = std::fs::remove_dir_all(&world.dir);
}
