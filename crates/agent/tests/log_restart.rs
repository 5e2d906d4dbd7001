//! A job's output across an agent restart: an agent killed while its replica runs, and one
//! started on the same data directory that runs the lease again. Nothing the coordinator was
//! sent is sent again under another offset, nothing after it is lost, and the log says where
//! output may be missing.

mod common;

use std::time::{Duration, Instant};

use agent::exec::process::ProcessExecutor;
use agent::{Agent, AgentConfig};
use common::{DEADLINE, unique};
use serde_json::{Value, json};

async fn call(http: &reqwest::Client, url: String, key: &str, body: Option<Value>) -> Value {
    let request = match body {
        Some(body) => http.post(url).json(&body),
        None => http.get(url),
    };
    let response = request.bearer_auth(key).send().await.expect("the coordinator answers");
    assert!(response.status().is_success(), "{}", response.status());
    response.json().await.expect("a JSON answer")
}

fn start_agent(config: AgentConfig) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let inventory = agent::gpu::simulated("H100-SXM5:1", |name| name == "H100-SXM5").unwrap();
        let agent = Agent::start(config, inventory, ProcessExecutor)
            .await
            .expect("the agent registers");
        // Never told to stop: the test aborts it, as a crash would end it.
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        agent.run(stopped).await.expect("the agent runs");
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_across_an_agent_restart_is_all_there_with_a_marker() {
    let dir = unique("fallow-log-restart");
    std::fs::create_dir_all(&dir).unwrap();
    let config = server::Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.join("coordinator"),
        heartbeat_interval_ms: 500,
        ..server::Config::default()
    };
    let running = server::start(&format!("sqlite://{}", dir.join("fallow.db").display()), config)
        .await
        .expect("the coordinator starts");
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let admin = std::fs::read_to_string(dir.join("coordinator").join(server::ADMIN_KEY_FILE)).unwrap();
    let mut keys = Vec::new();
    for role in ["tenant", "provider"] {
        let body = json!({"role": role, "name": role});
        let created = call(&http, format!("{base}/v1/admin/accounts"), admin.trim(), Some(body)).await;
        keys.push((
            created["account"]["id"].clone(),
            created["api_key"]["api_key"].as_str().unwrap().to_string(),
        ));
    }
    let credit = json!({"account_id": keys[0].0, "amount": "100.00", "key": "credit"});
    call(&http, format!("{base}/v1/admin/credits"), admin.trim(), Some(credit)).await;
    let (tenant, provider) = (keys[0].1.clone(), keys[1].1.clone());
    let config = AgentConfig {
        coordinator: base.clone(),
        ca_certs: Vec::new(),
        policy_given: false,
        provider_key: Some(provider),
        data_dir: dir.join("agent"),
        name: "rig".into(),
        region: "eu-west".into(),
        site: "ams1".into(),
        fabric: "ams1-net".into(),
        cpu_milli: 16_000,
        memory_mib: 65_536,
        policy: api::PolicyDoc {
            asks: [("silver".to_string(), "2.00".to_string())].into_iter().collect(),
            ..api::PolicyDoc::default()
        },
        usage_every: Duration::from_millis(500),
        grace: Duration::from_secs(1),
        allow_file_datasets: false,
        dataset_cache_bytes: None,
        guard_program: None,
        canary_program: None,
        matmul_device: None,
        topology: agent::NodeTopology::default(),
        scratch_encryption: agent::ScratchEncryption::Auto,
    };

    // The first replica writes a line and waits; the second (the restarted agent's) another.
    let ran = dir.join("ran");
    let script = format!(
        "if [ -e {0} ]; then echo second run; exit 0; fi; touch {0}; echo first run; exec sleep 300",
        ran.display()
    );
    let job = json!({"name": "restarted", "image": "/bin/sh", "command": ["-c", script], "gpus": 1,
                     "tier": "silver", "max_price_per_gpu_hour": "5.00", "max_runtime_s": 600});
    let id = call(&http, format!("{base}/v1/jobs"), &tenant, Some(job)).await["id"].clone();
    let output = async || {
        let logs = call(&http, format!("{base}/v1/jobs/{id}/logs"), &tenant, None).await;
        let chunks = logs["chunks"].as_array().cloned().unwrap_or_default();
        chunks
            .iter()
            .map(|chunk| chunk["text"].as_str().unwrap_or("").to_string())
            .collect::<String>()
    };
    let first = start_agent(config.clone());
    let runs = dir.join("agent").join(agent::state::RUNS_FILE);
    let start = Instant::now();
    while output().await != "first run\n" || std::fs::read_to_string(&runs).unwrap_or_default().len() < 3 {
        assert!(start.elapsed() < DEADLINE, "the first run's output never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.abort();
    let _ = first.await;

    let second = start_agent(config);
    let start = Instant::now();
    loop {
        let job = call(&http, format!("{base}/v1/jobs/{id}"), &tenant, None).await;
        if job["state"] == "finished" {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the job never finished: {job}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = output().await;
    let (before, after) = text
        .split_once("--- agent restarted at ")
        .unwrap_or_else(|| panic!("no restart marker: {text:?}"));
    assert_eq!(before, "first run\n", "{text:?}");
    assert!(
        after.ends_with("Z; output between may be missing ---\nsecond run\n"),
        "the second run's output follows the marker: {text:?}"
    );
    second.abort();
    let _ = second.await;
    running.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
