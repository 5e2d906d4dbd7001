//! An owner takes GPUs back, against a real coordinator and a real agent with simulated GPUs:
//! `fallow node reclaim`/`resume` with the provider's key, `fallow agent reclaim`/`pause`/`resume`
//! from the node's host with the node's key, what each prints, and how bad input is refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Coordinator, Scratch, User};
use serde_json::{Value, json};

/// How long the agent may take to register its node and heartbeat, and a job to be placed.
const WITHIN: Duration = Duration::from_secs(30);
const HOUR_US: i64 = 3_600_000_000;

/// Kills the child process when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The node's host: `fallow agent …` with the agent's coordinator and data directory as flags.
struct Host<'a> {
    home: &'a Path,
    coordinator: String,
    data_dir: PathBuf,
}

impl Host<'_> {
    fn run(&self, line: &str) -> Output {
        let data_dir = self.data_dir.to_str().expect("a UTF-8 path");
        let mut args: Vec<&str> = line.split_whitespace().collect();
        args.extend(["--coordinator", &self.coordinator, "--data-dir", data_dir]);
        common::cli(self.home, &[], &args)
    }

    fn ok(&self, line: &str) -> String {
        common::succeeded(&self.run(line), line)
    }
}

fn now_us() -> i64 {
    common::now_ms() * 1000
}

/// Starts `fallow agent` with two simulated GPUs that runs jobs as processes, and waits until
/// its node is online; the agent and the node's id.
async fn start_agent(provider: &User<'_>, data_dir: &Path, log: &Path) -> (Killed, i64) {
    let log_file = std::fs::File::create(log).expect("create the agent log");
    let agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(["agent", "--coordinator", &provider.url, "--provider-key", &provider.key])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--simulate-gpus", "H100-SXM5:2", "--executor", "process"])
            .args(["--usage-every-s", "1", "--grace-s", "1"])
            .env_remove("FALLOW_COORDINATOR")
            .env_remove("FALLOW_PROVIDER_KEY")
            .env_remove("FALLOW_AGENT_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone the log handle"))
            .stderr(log_file)
            .spawn()
            .expect("start fallow agent"),
    );
    let deadline = Instant::now() + WITHIN;
    loop {
        let nodes = provider.json("node list --json");
        if let Some(node) = nodes.get(0).filter(|node| node["online"] == true) {
            return (agent, node["id"].as_i64().expect("a node id"));
        }
        assert!(
            Instant::now() < deadline,
            "the agent's node is not online: {nodes}\nagent log: {}",
            common::tail(log, 4000)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until job `id` holds its lease.
async fn wait_running(tenant: &User<'_>, id: i64) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let job = tenant.json(&format!("job show {id} --json"));
        if job["state"] == "running" {
            return;
        }
        assert!(
            Instant::now() < deadline && job["state"] == "queued",
            "job {id} was not placed: {job}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn owners_reclaim_and_resume_gpus_from_the_cli_and_from_the_nodes_host() {
    let scratch = Scratch::new("fallow_reclaim");
    let coordinator = Coordinator::in_scratch(&scratch).await;
    let admin = User {
        home: &scratch.path,
        url: coordinator.url.clone(),
        key: coordinator.admin_key().expect("the coordinator wrote the admin key"),
    };
    let account = |role: &str, name: &str| {
        let created = admin.json(&format!("admin account create {name} --role {role} --json"));
        let user = User {
            home: &scratch.path,
            url: coordinator.url.clone(),
            key: created["api_key"]["api_key"].as_str().expect("a key").to_string(),
        };
        (created["account"]["id"].as_i64().expect("an id"), user)
    };
    let (_, provider) = account("provider", "farm");
    let (tenant_id, tenant) = account("tenant", "acme");
    let agent_dir = scratch.path.join("agent");
    let (_agent, node) = start_agent(&provider, &agent_dir, &scratch.path.join("agent.log")).await;
    let host = Host {
        home: &scratch.path,
        coordinator: coordinator.url.clone(),
        data_dir: agent_dir.clone(),
    };

    // (a) One GPU for two hours with the provider's key: the idle node gives GPU 0.
    let reclaimed = provider.json(&format!("node reclaim {node} --gpus 1 --for 2h --json"));
    assert_eq!(reclaimed["node_id"], node);
    assert_eq!(reclaimed["gpus"], json!([0]), "{reclaimed}");
    assert_eq!(
        (&reclaimed["stopping"], &reclaimed["running_on"]),
        (&json!([]), &json!([]))
    );
    let shown = provider.json(&format!("node show {node} --json"));
    assert_eq!(shown["reclaimed_gpus"], json!([0]), "{shown}");
    let until = shown["reclaimed_until_us"].as_i64().expect("an end to the reclaim");
    let ahead = until - now_us();
    assert!(
        (2 * HOUR_US - 60_000_000..=2 * HOUR_US).contains(&ahead),
        "the reclaim ends {ahead} µs from now, not about two hours"
    );
    let text = provider.ok(&format!("node show {node}"));
    assert!(text.contains("reclaimed:") && text.contains("GPU 0 until "), "{text}");
    assert!(
        text.contains(&format!("`fallow node resume {node}` gives them back")),
        "{text}"
    );
    let resumed = provider.ok(&format!("node resume {node}"));
    assert_eq!(resumed, format!("node {node} resumed: every GPU is on sale again\n"));
    let shown = provider.json(&format!("node show {node} --json"));
    assert_eq!(
        (&shown["reclaimed_gpus"], &shown["reclaimed_until_us"]),
        (&json!([]), &Value::Null),
        "{shown}"
    );
    assert!(!provider.ok(&format!("node show {node}")).contains("reclaimed:"));

    // (b) From the node's host with the node's key: pause takes every GPU until resumed.
    let paused = host.ok("agent pause");
    assert_eq!(
        paused.lines().next(),
        Some(format!("node {node}: GPUs 0,1 reclaimed until `fallow agent resume`").as_str()),
        "{paused}"
    );
    assert!(paused.contains("no work was running on them"), "{paused}");
    let shown = provider.json(&format!("node show {node} --json"));
    assert_eq!(
        (&shown["reclaimed_gpus"], &shown["reclaimed_until_us"]),
        (&json!([0, 1]), &Value::Null),
        "{shown}"
    );
    // Resume, with the agent's settings from the environment as the agent itself takes them.
    let data_dir_text = agent_dir.to_str().expect("a UTF-8 path");
    let resumed = common::cli(
        &scratch.path,
        &[
            ("FALLOW_COORDINATOR", &coordinator.url),
            ("FALLOW_AGENT_DATA_DIR", data_dir_text),
        ],
        &["agent", "resume", "--json"],
    );
    let resumed: Value = serde_json::from_str(&common::succeeded(&resumed, "agent resume")).expect("JSON");
    assert_eq!((&resumed["node_id"], &resumed["gpus"]), (&json!(node), &json!([])));
    assert_eq!(
        provider.json(&format!("node show {node} --json"))["reclaimed_gpus"],
        json!([])
    );
    // A pause for a while, as JSON.
    let paused: Value = serde_json::from_str(&host.ok("agent pause --for 1h30m --json")).expect("JSON");
    assert_eq!(paused["gpus"], json!([0, 1]));
    let ahead = paused["until_us"].as_i64().expect("an end") - now_us();
    assert!(
        (HOUR_US + HOUR_US / 2 - 60_000_000..=HOUR_US + HOUR_US / 2).contains(&ahead),
        "{paused}"
    );
    assert!(host.ok("agent resume").contains("resumed"));

    // (c) Bad input is refused, naming the flag or the field.
    provider.fails(&format!("node reclaim {node} --gpus 0"), &["--gpus", "1 or more"]);
    provider.fails(
        &format!("node reclaim {node} --gpus 99"),
        &["gpus:", "the node has 2 GPUs"],
    );
    provider.fails(
        &format!("node reclaim {node} --for 5x"),
        &["--for", "'x', which is not a unit", "1h30m"],
    );
    common::failed_saying(
        &host.run("agent reclaim --gpus 99"),
        "agent reclaim --gpus 99",
        &["gpus:", "2 GPUs"],
    );
    common::failed_saying(
        &host.run("agent pause --for 5x"),
        "agent pause --for 5x",
        &["--for", "90s"],
    );
    common::failed_saying(
        &host.run("agent reclaim --gpus 0"),
        "agent reclaim --gpus 0",
        &["--gpus"],
    );
    let empty = scratch.path.join("no-agent");
    common::failed_saying(
        &Host {
            home: &scratch.path,
            coordinator: coordinator.url.clone(),
            data_dir: empty,
        }
        .run("agent resume"),
        "agent resume from an empty data directory",
        &["has no registered node", "--data-dir"],
    );
    let shown = provider.json(&format!("node show {node} --json"));
    assert_eq!(
        shown["reclaimed_gpus"],
        json!([]),
        "refused reclaims changed nothing: {shown}"
    );

    // Work on the GPUs: bronze stops after its grace, firm work runs on unless forced, and a
    // forced stop pays its tenant.
    admin.ok(&format!("admin credit {tenant_id} 50"));
    let submit = |tier: &str| {
        let job = tenant.json(&format!(
            "job submit --json --gpus 1 --tier {tier} --max-price 5 --process -- sleep 60"
        ));
        job["id"].as_i64().expect("the job's id")
    };
    let bronze = submit("bronze");
    wait_running(&tenant, bronze).await;
    let silver = submit("silver");
    wait_running(&tenant, silver).await;
    let text = provider.ok(&format!("node reclaim {node}"));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("node {node}: GPUs 0,1 reclaimed until `fallow node resume {node}`")
    );
    let stops = format!("stops:    bronze job {bronze} ");
    let stopping = lines
        .iter()
        .find(|line| line.starts_with(&stops))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        stopping.contains("; killed at ") && stopping.ends_with("; no credit (bronze work)"),
        "{text}"
    );
    let runs_on = format!("runs on:  silver job {silver} ");
    let running = lines
        .iter()
        .find(|line| line.starts_with(&runs_on))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(running.contains("expected to end at "), "{text}");
    assert!(
        text.contains(&format!("`fallow node reclaim {node} --force` stops it now")),
        "{text}"
    );
    let forced = provider.json(&format!("node reclaim {node} --force --json"));
    assert_eq!(forced["running_on"], json!([]), "{forced}");
    let stopped: Vec<&Value> = forced["stopping"].as_array().expect("stopping").iter().collect();
    let firm = stopped
        .iter()
        .find(|lease| lease["job_id"] == silver)
        .unwrap_or_else(|| panic!("the silver job is not stopping: {forced}"));
    assert!(firm["credit_micros"].as_i64().expect("a credit") > 0, "{forced}");
    assert!(
        firm["stop_at_us"].as_i64().expect("a stop time") > now_us() - 60_000_000,
        "{forced}"
    );
    assert!(stopped.iter().any(|lease| lease["job_id"] == bronze), "{forced}");
    // Asked again, the silver lease is stopping already: its tenant is not paid twice.
    let again = provider.ok(&format!("node reclaim {node} --force"));
    assert!(
        again.contains(&format!("silver job {silver} ")) && again.contains("stopping already: nothing more paid"),
        "{again}"
    );
    assert_eq!(
        provider.json(&format!("node show {node} --json"))["reclaimed_gpus"],
        json!([0, 1])
    );
    assert!(provider.ok(&format!("node resume {node}")).contains("resumed"));
}

#[test]
fn reclaim_flags_are_checked_before_anything_is_sent() {
    let scratch = Scratch::new("fallow_reclaim_flags");
    // Nothing listens here: a flag refused by the CLI never reaches a coordinator.
    let env = [
        ("FALLOW_URL", "http://127.0.0.1:9"),
        (
            "FALLOW_API_KEY",
            "fallow_000000000000_0000000000000000000000000000000000000000000000000000000000000000",
        ),
    ];
    for (args, says) in [
        (
            &["node", "reclaim", "1", "--gpus", "0"][..],
            &["--gpus", "1 or more"][..],
        ),
        (
            &["node", "reclaim", "1", "--gpus", "two"],
            &["--gpus", "not a whole number"],
        ),
        (
            &["node", "reclaim", "1", "--for", "5x"],
            &["--for", "90s, 30m, 2h, 1d or 1h30m"],
        ),
        (&["node", "reclaim", "1", "--for", "90"], &["--for", "without a unit"]),
        (&["node", "reclaim", "1", "--for", "0s"], &["--for", "at least 1s"]),
        (&["node", "reclaim", "1", "--for", "400d"], &["--for", "over a year"]),
        (&["agent", "pause", "--for", "5x"], &["--for", "1h30m"]),
        (&["agent", "reclaim", "--gpus", "0"], &["--gpus", "1 or more"]),
        (&["agent", "pause", "--force"], &["--force"]),
    ] {
        let output = common::cli(&scratch.path, &env, args);
        let stderr = common::failed_saying(&output, &args.join(" "), says);
        assert!(
            !stderr.contains("connect"),
            "{args:?} reached for the network: {stderr}"
        );
    }
}
