//! Serving through the gateway, with the real `fallow` binary: a coordinator and agents with
//! simulated GPUs on this host, each agent holding its tunnel to the gateway (no inbound port).
//! A service deployed with the CLI runs two replicas of a small model server (Python's standard
//! library, `tests/serve/completions.py`) answering OpenAI-style completions at `/s/llm/…` with
//! the tenant's key; requests spread over both; a stream passes through as it comes; a caller
//! without the key gets 401, a service that does not exist 404, a body too large 413. One agent
//! is SIGKILLed under 5,000 requests: none fails (the gateway sends what its tunnel lost to the
//! other replica), the service's counts match the callers', and the lost replica is placed again
//! on a spare node and serves. A second service scales up under load past its target and back
//! down after, to zero when idle, wakes on a request, and keeps serving from its old version
//! when a roll-out's new version cannot start. Without `/usr/bin/python3` the test prints SKIPPED; with
//! `FALLOW_CI_REQUIRE_SERVICES=1` it fails instead.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::world::{AgentProcess, PYTHON, World, skip};
use common::{eventually, free_port};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/serve/completions.py")
        .display()
        .to_string()
}

/// Runs the `fallow` CLI as the tenant; its stdout, failing the test when it fails.
fn fallow(world: &World, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args(args)
        .env("FALLOW_URL", &world.server.url)
        .env("FALLOW_API_KEY", &world.tenant_key)
        .output()
        .expect("run fallow");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "fallow {args:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Deploys the model server as service `name` with the CLI: one GPU per replica, silver, and
/// the service's own flags (`extra`).
fn deploy(world: &World, name: &str, extra: &[&str]) {
    let script = script();
    let mut args = vec![
        "service",
        "deploy",
        "--name",
        name,
        "--process",
        "--gpus",
        "1",
        "--tier",
        "silver",
        "--max-price",
        "5.00",
        "--health-path",
        "/health",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", PYTHON, &script]);
    fallow(world, &args);
}

/// One completion through the gateway: its status and answer.
async fn complete(world: &World, key: Option<&str>, service: &str, prompt: &str) -> (StatusCode, Value) {
    complete_after(world, key, service, prompt, 0).await
}

/// A completion the replica takes `delay_ms` to answer.
async fn complete_after(
    world: &World,
    key: Option<&str>,
    service: &str,
    prompt: &str,
    delay_ms: u64,
) -> (StatusCode, Value) {
    complete_at(world, &world.server.url, key, service, prompt, delay_ms).await
}

/// A completion through the gateway at `gateway`.
async fn complete_at(
    world: &World,
    gateway: &str,
    key: Option<&str>,
    service: &str,
    prompt: &str,
    delay_ms: u64,
) -> (StatusCode, Value) {
    let mut request = world
        .http
        .post(format!("{gateway}/s/{service}/v1/completions"))
        .header("x-fallow-retry", "1")
        .json(&json!({"prompt": prompt, "max_tokens": 4, "delay_ms": delay_ms}));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status();
            match response.json::<Value>().await {
                Ok(body) => (status, body),
                Err(error) => (
                    StatusCode::IM_A_TEAPOT,
                    json!({"status": status.as_u16(), "body_error": error.to_string()}),
                ),
            }
        }
        Err(error) => (StatusCode::IM_A_TEAPOT, json!({"client_error": error.to_string()})),
    }
}

/// The replicas (lease ids) that answered `tries` completions.
async fn answering(world: &World, service: &str, tries: usize) -> BTreeSet<String> {
    answering_at(world, &world.server.url, service, tries).await
}

/// The replicas that answered `tries` completions through the gateway at `gateway`.
async fn answering_at(world: &World, gateway: &str, service: &str, tries: usize) -> BTreeSet<String> {
    let mut replicas = BTreeSet::new();
    for index in 0..tries {
        let prompt = format!("hello {index}");
        let (status, body) = complete_at(world, gateway, Some(&world.tenant_key), service, &prompt, 0).await;
        if status == StatusCode::OK {
            replicas.insert(body["replica"].as_str().unwrap_or("?").to_string());
        }
    }
    replicas
}

/// 5,000 requests from 10 callers.
const CALLERS: usize = 10;
const PER_CALLER: usize = 500;

#[tokio::test(flavor = "multi_thread")]
async fn a_service_answers_through_the_gateway_and_survives_a_lost_node() {
    if !Path::new(PYTHON).exists() {
        skip("a_service_answers_through_the_gateway", &format!("{PYTHON} is missing"));
        return;
    }
    let world = World::new("fallow_e2e_serve").await;
    let mut first = world.agent("serve-a", "process", "1.00", None);
    let second = world.agent("serve-b", "process", "1.00", None);
    world.nodes_online(2).await;
    deploy(&world, "llm", &["--min-replicas", "2"]);
    let agents: Vec<&AgentProcess> = vec![&first, &second];
    let logs = |agents: &[&AgentProcess]| {
        agents
            .iter()
            .map(|agent| agent.log_tail())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut both = BTreeSet::new();
    for _ in 0..180 {
        both = answering(&world, "llm", 8).await;
        if both.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        both.len(),
        2,
        "both replicas answer through the gateway\n{}\n{}",
        logs(&agents),
        world.server.log_tail()
    );

    // The key is the gateway's: none is 401, a service the tenant has not is 404.
    let (status, _) = complete(&world, None, "llm", "hi").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = complete(&world, Some(&world.tenant_key), "no-such-service", "hi").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = complete(&world, Some(&world.provider_key), "llm", "hi").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a provider's key: {body}");
    let too_large = world
        .http
        .post(format!("{}/s/llm/v1/completions", world.server.url))
        .bearer_auth(&world.tenant_key)
        .body(vec![b' '; (16 << 20) + 1])
        .send()
        .await
        .expect("an answer to a request too large");
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // A stream passes through event by event.
    let stream = world
        .http
        .get(format!("{}/s/llm/v1/stream", world.server.url))
        .bearer_auth(&world.tenant_key)
        .send()
        .await
        .expect("the stream answers");
    assert_eq!(stream.status(), StatusCode::OK);
    let text = stream.text().await.expect("the stream's text");
    assert_eq!(text.matches("data: ").count(), 5, "{text}");

    // Load from 8 callers; one node is lost a quarter of the way through.
    let before = world.get("/v1/services/llm").await;
    let spare = world.agent("serve-spare", "process", "1.00", None);
    world.nodes_online(3).await;
    let world = Arc::new(world);
    let done = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tokens = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let (world, done, failures, tokens) = (world.clone(), done.clone(), failures.clone(), tokens.clone());
        callers.push(tokio::spawn(async move {
            for index in 0..PER_CALLER {
                let (status, body) = complete(
                    &world,
                    Some(&world.tenant_key),
                    "llm",
                    &format!("caller {caller} asks {index}"),
                )
                .await;
                if status == StatusCode::OK {
                    tokens.fetch_add(
                        body["usage"]["total_tokens"].as_u64().unwrap_or(0) as usize,
                        Ordering::Relaxed,
                    );
                } else {
                    failures.lock().unwrap().push(format!("{status}: {body}"));
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    while done.load(Ordering::Relaxed) < CALLERS * PER_CALLER / 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    for caller in callers {
        caller.await.expect("a caller ends");
    }
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed after a node was lost: {:?}\n{}",
        failures.len(),
        CALLERS * PER_CALLER,
        &failures[..failures.len().min(5)],
        world.server.log_tail()
    );
    // Each prompt is 4 words and each completion 4 tokens.
    assert_eq!(tokens.load(Ordering::Relaxed), CALLERS * PER_CALLER * 8);
    // The gateway counted what the callers did.
    let after_load = world.get("/v1/services/llm").await;
    let delta = |field: &str| after_load[field].as_u64().unwrap_or(0) - before[field].as_u64().unwrap_or(0);
    assert_eq!(
        (delta("requests"), delta("errors"), delta("tokens")),
        ((CALLERS * PER_CALLER) as u64, 0, tokens.load(Ordering::Relaxed) as u64),
        "{after_load}"
    );
    let text = fallow(&world, &["service", "show", "llm"]);
    assert!(
        text.contains("reachable") && text.contains("p95") && text.contains("per 1M tokens"),
        "{text}"
    );
    // The tenant's dashboard shows the service, its cost per million tokens and its charts.
    let page = world
        .http
        .get(format!("{}/dashboard/tenant", world.server.url))
        .header("cookie", format!("fallow_key={}", world.tenant_key))
        .send()
        .await
        .expect("the dashboard answers")
        .text()
        .await
        .expect("the page");
    assert!(
        page.contains("<h2>Services</h2>") && page.contains("per 1M tokens") && page.contains("p95 latency"),
        "{page}"
    );
    let p95 = after_load["p95_ms"]
        .as_f64()
        .expect("a p95 once requests were answered");
    assert!(
        p95 > 0.0 && p95 <= after_load["p99_ms"].as_f64().unwrap_or(0.0),
        "{after_load}"
    );

    // The lost replica is placed again (on the spare) and serves beside the survivor.
    let after = eventually(
        Duration::from_secs(120),
        "two replicas serve again, one of them new",
        || async {
            let replicas = answering(&world, "llm", 8).await;
            (replicas.len() == 2 && replicas != both).then_some(replicas)
        },
    )
    .await;
    assert_eq!(after.len(), 2, "{}", logs(&[&second, &spare]));
    // Every replica the service ran was one of its jobs, none failed.
    let view = world.get("/v1/services/llm").await;
    assert_eq!(view["deployed"]["status"], "", "{view}");
    assert!(
        view["cost_micros"].as_i64().unwrap_or(0) > 0,
        "the replicas' GPU time is billed: {view}"
    );
}

/// The service's view, by the API.
async fn service(world: &World, name: &str) -> Value {
    world.get(&format!("/v1/services/{name}")).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_scales_with_its_load_to_zero_and_back_and_survives_a_bad_roll_out() {
    if !Path::new(PYTHON).exists() {
        skip("a_service_scales_with_its_load", &format!("{PYTHON} is missing"));
        return;
    }
    let world = World::new("fallow_e2e_autoscale").await;
    let agents = [
        world.agent("auto-a", "process", "1.00", None),
        world.agent("auto-b", "process", "1.00", None),
        world.agent("auto-c", "process", "1.00", None),
    ];
    world.nodes_online(3).await;
    let logs = || {
        let mut text: Vec<String> = agents.iter().map(AgentProcess::log_tail).collect();
        text.push(world.server.log_tail());
        text.join("\n")
    };
    deploy(
        &world,
        "auto",
        &[
            "--min-replicas",
            "0",
            "--max-replicas",
            "2",
            "--target-in-flight",
            "2",
            "--scale-up-after",
            "2",
            "--scale-down-after",
            "4",
            "--wake-timeout",
            "120",
        ],
    );
    // Idle from the start: to zero.
    eventually(
        Duration::from_secs(120),
        "the idle service at zero replicas",
        || async {
            let view = service(&world, "auto").await;
            (view["deployed"]["desired_replicas"] == 0 && view["replica_states"].as_array().is_some_and(Vec::is_empty))
                .then_some(())
        },
    )
    .await;
    // A request wakes it: it waits for a replica and is answered.
    let (status, body) = complete(&world, Some(&world.tenant_key), "auto", "wake up").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the first request waits for a replica: {body}\n{}",
        logs()
    );

    // Load past the target: 8 callers, each request 300 ms, on one replica (target 2 in flight).
    let world = Arc::new(world);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for caller in 0..8 {
        let (world, stop, failures) = (world.clone(), stop.clone(), failures.clone());
        callers.push(tokio::spawn(async move {
            let mut index = 0;
            while !stop.load(Ordering::Relaxed) {
                let prompt = format!("caller {caller} asks {index}");
                let (status, _) = complete_after(&world, Some(&world.tenant_key), "auto", &prompt, 300).await;
                if status != StatusCode::OK {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                index += 1;
            }
        }));
    }
    let scaled = eventually(Duration::from_secs(120), "two ready replicas under load", || async {
        let view = service(&world, "auto").await;
        (view["replicas"].as_array().map(Vec::len) == Some(2)).then_some(view)
    })
    .await;
    assert_eq!(scaled["deployed"]["desired_replicas"], 2, "{scaled}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let busy = service(&world, "auto").await;
    let serving: Vec<u64> = busy["replica_states"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|replica| replica["in_flight"].as_u64())
        .collect();
    assert!(
        serving.iter().filter(|count| **count > 0).count() == 2,
        "both replicas take the load: {busy}"
    );
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.expect("a caller ends");
    }
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "no request failed while scaling up"
    );
    // Back down after the load, to zero once idle.
    eventually(Duration::from_secs(120), "scaled back down to zero", || async {
        let view = service(&world, "auto").await;
        (view["deployed"]["desired_replicas"] == 0 && view["replica_states"].as_array().is_some_and(Vec::is_empty))
            .then_some(())
    })
    .await;

    // A roll-out whose new version cannot start stops; the old version serves throughout.
    fallow(
        &world,
        &["service", "scale", "auto", "--min-replicas", "1", "--max-replicas", "2"],
    );
    let first = eventually(Duration::from_secs(120), "one ready replica", || async {
        let view = service(&world, "auto").await;
        (view["replicas"].as_array().map(Vec::len) == Some(1)).then_some(view)
    })
    .await;
    let old_job = first["replica_states"][0]["job_id"].clone();
    fallow(
        &world,
        &[
            "service",
            "update",
            "--name",
            "auto",
            "--process",
            "--",
            PYTHON,
            "-c",
            "import sys; sys.exit(3)",
        ],
    );
    let halted = eventually(
        Duration::from_secs(180),
        "the roll-out of version 2 to stop",
        || async {
            let (status, body) = complete(&world, Some(&world.tenant_key), "auto", "still there").await;
            assert_eq!(
                status,
                StatusCode::OK,
                "the old version serves during the roll-out: {body}"
            );
            let view = service(&world, "auto").await;
            let status = view["deployed"]["status"].as_str().unwrap_or("").to_string();
            status.starts_with("roll-out of version 2 stopped").then_some(view)
        },
    )
    .await;
    assert_eq!(halted["deployed"]["stable_version"], 1, "{halted}");
    assert_eq!(halted["replica_states"][0]["job_id"], old_job, "{halted}");
    assert_eq!(halted["replica_states"].as_array().map(Vec::len), Some(1), "{halted}");
    let shown = fallow(&world, &["service", "show", "auto"]);
    assert!(shown.contains("roll-out of version 2 stopped"), "{shown}");
    fallow(&world, &["service", "delete", "auto"]);
    let (status, _) = complete(&world, Some(&world.tenant_key), "auto", "gone").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// `fallow gateway`, a gateway of its own, stopped when dropped.
struct GatewayProcess {
    url: String,
    child: std::process::Child,
}

impl GatewayProcess {
    fn start(world: &World, port: u16) -> GatewayProcess {
        let log = std::fs::File::create(world.scratch.path.join(format!("gateway-{port}.log"))).expect("a log file");
        let admin_key = world.server.admin_key().expect("the admin key");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(["gateway", "--coordinator", &world.server.url])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--region", "edge-1"])
            .env("FALLOW_API_KEY", admin_key)
            .env_remove("FALLOW_COORDINATOR")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn fallow gateway");
        GatewayProcess {
            url: format!("http://127.0.0.1:{port}"),
            child,
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_of_its_own_serves_beside_the_coordinator_and_is_rebuilt_from_it() {
    if !Path::new(PYTHON).exists() {
        skip("a_gateway_of_its_own_serves", &format!("{PYTHON} is missing"));
        return;
    }
    let world = World::new("fallow_e2e_edge").await;
    let agents = [
        world.agent("edge-a", "process", "1.00", None),
        world.agent("edge-b", "process", "1.00", None),
    ];
    world.nodes_online(2).await;
    let logs = || {
        let mut text: Vec<String> = agents.iter().map(AgentProcess::log_tail).collect();
        text.push(world.server.log_tail());
        text.join("\n")
    };
    let port = free_port();
    let gateway = GatewayProcess::start(&world, port);
    deploy(&world, "llm", &["--min-replicas", "2"]);
    // The coordinator lists the gateway; the agents learn of it from their heartbeats and
    // tunnel to it: both replicas answer through it.
    let listed = eventually(Duration::from_secs(60), "the gateway reported", || async {
        let list = world.admin_get("/v1/gateways").await;
        (list["gateways"][0]["url"] == gateway.url.as_str()).then_some(list)
    })
    .await;
    assert_eq!(listed["gateways"][0]["region"], "edge-1", "{listed}");
    let both = eventually(
        Duration::from_secs(120),
        "both replicas answer through the gateway",
        || async {
            let replicas = answering_at(&world, &gateway.url, "llm", 8).await;
            (replicas.len() == 2).then_some(replicas)
        },
    )
    .await;
    assert_eq!(both.len(), 2, "{}", logs());

    // The same refusals as the coordinator's gateway: checked by the coordinator.
    let (status, _) = complete_at(&world, &gateway.url, None, "llm", "hi", 0).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = complete_at(&world, &gateway.url, Some("fallow_bad_key"), "llm", "hi", 0).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = complete_at(&world, &gateway.url, Some(&world.tenant_key), "nothing-here", "hi", 0).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = complete_at(&world, &gateway.url, Some(&world.provider_key), "llm", "hi", 0).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let service_key = world
        .http
        .post(format!("{}/v1/services/llm/keys", world.server.url))
        .bearer_auth(&world.tenant_key)
        .json(&json!({}))
        .send()
        .await
        .expect("a key")
        .json::<Value>()
        .await
        .expect("the key's JSON");
    let service_key = service_key["api_key"].as_str().expect("the key").to_string();
    let (status, body) = complete_at(&world, &gateway.url, Some(&service_key), "llm", "by key", 0).await;
    assert_eq!(status, StatusCode::OK, "the service's own key: {body}");
    let unsigned = world
        .http
        .post(format!("{}/v1/agent/tunnel", gateway.url))
        .header("connection", "upgrade")
        .header("upgrade", "fallow-tunnel")
        .body("{}")
        .send()
        .await
        .expect("an answer to an unsigned tunnel");
    assert_eq!(
        unsigned.status(),
        StatusCode::UNAUTHORIZED,
        "a tunnel without a node's signature"
    );

    // Load through it; the coordinator counts it in the service's figures (the gateway
    // reports each second: what it served so far has reached the coordinator after two).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let before = world.get("/v1/services/llm").await;
    let world = Arc::new(world);
    let failures = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for caller in 0..4 {
        let (world, failures, url) = (world.clone(), failures.clone(), gateway.url.clone());
        callers.push(tokio::spawn(async move {
            for index in 0..100 {
                let prompt = format!("caller {caller} asks {index}");
                let (status, _) = complete_at(&world, &url, Some(&world.tenant_key), "llm", &prompt, 0).await;
                if status != StatusCode::OK {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for caller in callers {
        caller.await.expect("a caller ends");
    }
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "requests through the gateway failed"
    );
    let counted = eventually(
        Duration::from_secs(30),
        "the gateway's counts at the coordinator",
        || async {
            let view = world.get("/v1/services/llm").await;
            let delta = view["requests"].as_u64().unwrap_or(0) - before["requests"].as_u64().unwrap_or(0);
            (delta >= 400).then_some((delta, view))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let view = world.get("/v1/services/llm").await;
    let delta = |field: &str| view[field].as_u64().unwrap_or(0) - before[field].as_u64().unwrap_or(0);
    assert_eq!(
        (delta("requests"), delta("errors"), delta("tokens")),
        (400, 0, 400 * 8),
        "the coordinator counts what the gateway served, once: {} then {view}",
        counted.1
    );

    // Stopped, the coordinator's own gateway serves on; started again, it is rebuilt from the
    // coordinator (routes, node keys) and the agents' tunnels come back to it.
    drop(gateway);
    let (status, body) = complete(&world, Some(&world.tenant_key), "llm", "still here").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let gateway = GatewayProcess::start(&world, port);
    let again = eventually(
        Duration::from_secs(120),
        "both replicas answer through the new gateway",
        || async {
            let replicas = answering_at(&world, &gateway.url, "llm", 8).await;
            (replicas.len() == 2).then_some(replicas)
        },
    )
    .await;
    assert_eq!(again, both, "the same replicas, reached through new tunnels");
}
