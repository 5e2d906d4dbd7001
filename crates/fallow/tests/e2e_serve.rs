//! Serving through the gateway, with the real `fallow` binary: a coordinator and agents with
//! simulated GPUs on this host, each agent holding its tunnel to the gateway (no inbound port).
//! Two replicas of a small model server (Python's standard library, `tests/serve/completions.py`)
//! answer OpenAI-style completions at `/s/llm/…` with the tenant's key; requests spread over
//! both; a stream passes through as it comes; a caller without the key gets 401 and a service
//! that does not exist 404. One agent is SIGKILLed under load: no request fails (the gateway
//! sends what its tunnel lost to the other replica), and the lost replica is placed again on a
//! spare node and serves. Without `/usr/bin/python3` the test prints SKIPPED; with
//! `FALLOW_CI_REQUIRE_SERVICES=1` it fails instead.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::eventually;
use common::world::{AgentProcess, PYTHON, World, skip};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn serving_job() -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve/completions.py");
    json!({
        "name": "llm",
        "image": PYTHON,
        "command": [script.display().to_string()],
        "runtime": "process",
        "gpus": 1,
        "tier": "silver",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 3600,
        "serve": {"name": "llm", "health_path": "/health"},
    })
}

/// One completion through the gateway: its status and answer.
async fn complete(world: &World, key: Option<&str>, service: &str, prompt: &str) -> (StatusCode, Value) {
    let mut request = world
        .http
        .post(format!("{}/s/{service}/v1/completions", world.server.url))
        .header("x-fallow-retry", "1")
        .json(&json!({"prompt": prompt, "max_tokens": 4}));
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
async fn answering(world: &World, tries: usize) -> BTreeSet<String> {
    let mut replicas = BTreeSet::new();
    for index in 0..tries {
        let (status, body) = complete(world, Some(&world.tenant_key), "llm", &format!("hello {index}")).await;
        if status == StatusCode::OK {
            replicas.insert(body["replica"].as_str().unwrap_or("?").to_string());
        }
    }
    replicas
}

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
    let jobs = [world.submit(serving_job()).await, world.submit(serving_job()).await];
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
        both = answering(&world, 8).await;
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
    for caller in 0..8 {
        let (world, done, failures, tokens) = (world.clone(), done.clone(), failures.clone(), tokens.clone());
        callers.push(tokio::spawn(async move {
            for index in 0..100 {
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
    while done.load(Ordering::Relaxed) < 200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    for caller in callers {
        caller.await.expect("a caller ends");
    }
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} of 800 requests failed after a node was lost: {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        world.server.log_tail()
    );
    // Each prompt is 4 words and each completion 4 tokens.
    assert_eq!(tokens.load(Ordering::Relaxed), 800 * 8);
    // The gateway counted what the callers did.
    let after_load = world.get("/v1/services/llm").await;
    let delta = |field: &str| after_load[field].as_u64().unwrap_or(0) - before[field].as_u64().unwrap_or(0);
    assert_eq!(
        (delta("requests"), delta("errors"), delta("tokens")),
        (800, 0, tokens.load(Ordering::Relaxed) as u64),
        "{after_load}"
    );
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args(["service", "show", "llm"])
        .env("FALLOW_URL", &world.server.url)
        .env("FALLOW_API_KEY", &world.tenant_key)
        .output()
        .expect("run fallow service show");
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success() && text.contains("reachable") && text.contains("p95"),
        "{text}"
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
            let replicas = answering(&world, 8).await;
            (replicas.len() == 2 && replicas != both).then_some(replicas)
        },
    )
    .await;
    assert_eq!(after.len(), 2, "{}", logs(&[&second, &spare]));
    for job in jobs {
        let view = world.get(&format!("/v1/jobs/{job}")).await;
        assert_ne!(view["state"], "failed", "{view}");
    }
}
