//! Agents and a coordinator as real processes on this host, for the end-to-end tests of gangs
//! and services: a coordinator with a 3 s heartbeat timeout that bills simulated nodes, a funded
//! tenant, `fallow agent` processes with one simulated GPU each (killed when dropped), and the
//! tenant's reads of jobs, leases and logs. Also what a test needs to skip loudly: Debian's
//! Python with torch.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use super::{Coordinator, Scratch, eventually, http, set_up_market, tail};

/// Debian's Python, which has torch (`python3` on PATH may be another).
pub const PYTHON: &str = "/usr/bin/python3";
pub const HEARTBEAT_TIMEOUT_MS: &str = "3000";
pub const HEARTBEAT_INTERVAL_MS: &str = "500";
/// The longest wait for a gang to run to its end (PyTorch takes seconds to import on 2 cores).
pub const WITHIN: Duration = Duration::from_secs(240);
pub const TORCH_IMAGE: &str = "fallow-torch:test";

/// Why a service the test needs is missing: SKIPPED, or a failure where CI requires services.
pub fn skip(test: &str, why: &str) {
    assert!(
        std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() != Ok("1"),
        "{test}: required here (FALLOW_CI_REQUIRE_SERVICES=1): {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
}

pub fn torch_missing() -> Option<String> {
    let ok = Command::new(PYTHON)
        .args(["-c", "import torch.distributed as d; assert d.is_gloo_available()"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    (!ok).then(|| format!("{PYTHON} with torch and gloo is missing (apt-get install python3-torch)"))
}

/// One `fallow agent` with one simulated GPU. Dropping it kills the process.
pub struct AgentProcess {
    pub name: String,
    pub log: PathBuf,
    pub child: Option<Child>,
}

impl AgentProcess {
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log_tail(&self) -> String {
        format!("{} log:\n{}", self.name, tail(&self.log, 4000))
    }

    /// SIGTERM, then how the process exited within `within` (see [`super::terminate`]).
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        super::terminate(self.child.take()?, within)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A coordinator with a 3 s heartbeat timeout that bills simulated nodes, and a funded tenant.
pub struct World {
    pub scratch: Scratch,
    pub server: Coordinator,
    pub http: reqwest::Client,
    pub tenant_key: String,
    pub provider_key: String,
    pub database: String,
}

impl World {
    pub async fn new(name: &str) -> World {
        let scratch = Scratch::new(name);
        let database = format!("sqlite://{}", scratch.path.join("fallow.db").display());
        let server = Coordinator::start_with(
            "coordinator",
            &database,
            &scratch.path.join("coordinator"),
            &scratch.path,
            &[
                "--heartbeat-timeout-ms",
                HEARTBEAT_TIMEOUT_MS,
                "--heartbeat-interval-ms",
                HEARTBEAT_INTERVAL_MS,
                "--bill-simulated",
                "--gang-start-timeout-ms",
                "120000",
            ],
        )
        .await;
        let http = http();
        let admin_key = server.admin_key().expect("the coordinator wrote its admin key");
        let market = set_up_market(&http, &server.url, &admin_key, 0, 1).await;
        World {
            scratch,
            server,
            http,
            tenant_key: market.tenant_key,
            provider_key: market.provider_key,
            database,
        }
    }

    /// Starts an agent: `executor` process or docker, `ask` its silver price, `path` the PATH
    /// its replicas' programs are looked up in.
    pub fn agent(&self, name: &str, executor: &str, ask: &str, path: Option<&str>) -> AgentProcess {
        let log = self.scratch.path.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("create the agent log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_fallow"));
        command
            .args([
                "agent",
                "--coordinator",
                &self.server.url,
                "--provider-key",
                &self.provider_key,
            ])
            .arg("--data-dir")
            .arg(self.scratch.path.join(name))
            .args(["--name", name, "--executor", executor, "--simulate-gpus", "H100-SXM5:1"])
            .args([
                "--site",
                "lab",
                "--usage-every-s",
                "1",
                "--grace-s",
                "1",
                "--shm-size",
                "1g",
            ])
            .args(["--asks", &format!("silver={ask}")])
            .env_remove("FALLOW_COORDINATOR")
            .env_remove("FALLOW_PROVIDER_KEY")
            .env_remove("FALLOW_AGENT_DATA_DIR")
            .env("FALLOW_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone the log handle"))
            .stderr(out);
        if let Some(path) = path {
            command.env("PATH", path);
        }
        AgentProcess {
            name: name.to_string(),
            log,
            child: Some(command.spawn().expect("spawn fallow agent")),
        }
    }

    pub async fn get(&self, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}{path}", self.server.url))
            .bearer_auth(&self.tenant_key)
            .send()
            .await
            .unwrap_or_else(|error| panic!("{path}: {error}"));
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.json().await.expect("a JSON answer")
    }

    pub async fn admin_get(&self, path: &str) -> Value {
        let admin_key = self.server.admin_key().expect("the admin key");
        let response = self
            .http
            .get(format!("{}{path}", self.server.url))
            .bearer_auth(admin_key)
            .send()
            .await
            .unwrap_or_else(|error| panic!("{path}: {error}"));
        response.json().await.expect("a JSON answer")
    }

    pub async fn nodes_online(&self, count: usize) {
        eventually(Duration::from_secs(60), &format!("{count} nodes online"), || async {
            let nodes = self.admin_get("/v1/nodes").await;
            let online = nodes.as_array()?.iter().filter(|node| node["online"] == true).count();
            (online >= count).then_some(())
        })
        .await;
    }

    pub async fn submit(&self, job: Value) -> i64 {
        let response = self
            .http
            .post(format!("{}/v1/jobs", self.server.url))
            .bearer_auth(&self.tenant_key)
            .json(&job)
            .send()
            .await
            .expect("submit the job");
        let status = response.status();
        let view: Value = response.json().await.expect("the job's view");
        assert_eq!(status, StatusCode::CREATED, "{view}");
        view["id"].as_i64().expect("a job id")
    }

    /// The job once it has ended (finished or failed), or a panic with the agents' logs.
    pub async fn ended(&self, job: i64, agents: &[&AgentProcess]) -> Value {
        let deadline = Instant::now() + WITHIN;
        loop {
            let view = self.get(&format!("/v1/jobs/{job}")).await;
            if view["state"] == "finished" || view["state"] == "failed" {
                return view;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = agents.iter().map(|agent| agent.log_tail()).collect();
                panic!(
                    "job {job} did not end within {WITHIN:?}: {view}\n{}\ncoordinator:\n{}",
                    logs.join("\n"),
                    self.server.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Each lease's whole output, by lease id.
    pub async fn outputs(&self, job: i64) -> std::collections::BTreeMap<i64, String> {
        let mut out = std::collections::BTreeMap::new();
        let mut after = 0;
        loop {
            let page = self.get(&format!("/v1/jobs/{job}/logs?after={after}")).await;
            let chunks = page["chunks"].as_array().cloned().unwrap_or_default();
            if chunks.is_empty() {
                return out;
            }
            for chunk in &chunks {
                out.entry(chunk["lease_id"].as_i64().unwrap())
                    .or_insert_with(String::new)
                    .push_str(chunk["text"].as_str().unwrap_or(""));
            }
            after = page["next_after"].as_i64().unwrap();
        }
    }

    pub async fn lease_events(&self, lease: i64) -> Vec<(String, i64)> {
        let store = store::Store::open(&self.database).await.expect("open the database");
        store
            .lease_events(lease)
            .await
            .expect("the lease's events")
            .into_iter()
            .map(|event| (event.kind, event.at))
            .collect()
    }
}
