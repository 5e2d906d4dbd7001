//! An agent killed (SIGKILL) or frozen (SIGSTOP) mid-job, with the real `fallow` binary: a
//! coordinator with a 3 s heartbeat timeout that bills simulated nodes, and two agents running
//! jobs as processes. The replica's guard stops it within the fence time (half the timeout), so
//! when the coordinator moves the lease to the second agent the job never runs twice at once; the
//! first agent, back with its stale lease, starts nothing of it again; and the tenant pays, and
//! the provider earns, exactly what the usage records of both leases metered.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Scratch, eventually, http, set_up_market, tail};
use reqwest::StatusCode;
use serde_json::{Value, json};

const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(3_000);
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// How long an agent, and each replica's guard, lets a replica run without word from the
/// coordinator: half the heartbeat timeout.
const FENCE: Duration = Duration::from_millis(1_500);
/// The agents' grace period (`--grace-s 1`); a guard uses at most a quarter of the timeout.
const GUARD_GRACE: Duration = Duration::from_millis(750);
/// The longest wait for anything that should happen.
const WITHIN: Duration = Duration::from_secs(20);
/// Every test node's GPUs, and the tenant's credit.
const GPUS: &str = "H100-SXM5:1";
const CREDIT_MICROS: i64 = 100_000_000_000;
/// The coordinator's platform fee (its default), in thousandths.
const FEE_PERMILLE: i64 = 100;

/// `fallow server` with a short heartbeat timeout, billing simulated nodes' usage. Dropping it
/// kills the process.
struct Server {
    url: String,
    database: String,
    admin_key: String,
    child: Child,
}

impl Server {
    async fn start(scratch: &Path) -> Server {
        let log = scratch.join("server.log");
        let data_dir = scratch.join("coordinator");
        let database = format!("sqlite://{}", scratch.join("fallow.db").display());
        for _ in 0..5 {
            // A free port now; another process may take it before the server binds, so retry.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free local port")
                .port();
            let out = std::fs::File::create(&log).expect("create the server log");
            let mut child = Command::new(env!("CARGO_BIN_EXE_fallow"))
                .args([
                    "server",
                    "--database",
                    &database,
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                ])
                .arg("--data-dir")
                .arg(&data_dir)
                .args(["--heartbeat-timeout-ms", &HEARTBEAT_TIMEOUT.as_millis().to_string()])
                .args(["--heartbeat-interval-ms", &HEARTBEAT_INTERVAL.as_millis().to_string()])
                .arg("--bill-simulated")
                .env_remove("FALLOW_DATABASE")
                .env_remove("FALLOW_LISTEN")
                .env_remove("FALLOW_DATA_DIR")
                .env("FALLOW_LOG", "info")
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("clone the log handle"))
                .stderr(out)
                .spawn()
                .expect("spawn fallow server");
            let url = format!("http://127.0.0.1:{port}");
            let started = Instant::now();
            let client = http();
            while started.elapsed() < Duration::from_secs(60) {
                if child.try_wait().expect("poll the server").is_some() {
                    break;
                }
                if let Ok(response) = client.get(format!("{url}/v1/health")).send().await
                    && response.status() == StatusCode::OK
                {
                    let admin_key = std::fs::read_to_string(data_dir.join(server::ADMIN_KEY_FILE))
                        .expect("the coordinator wrote its admin key")
                        .trim()
                        .to_string();
                    return Server {
                        url,
                        database,
                        admin_key,
                        child,
                    };
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
            if !std::fs::read_to_string(&log).unwrap_or_default().contains("in use") {
                panic!("the coordinator did not start; its log:\n{}", tail(&log, 8000));
            }
        }
        panic!("no free port for the coordinator");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `fallow agent --executor process` with a simulated GPU. Dropping it kills the process
/// (its guards then stop its replicas).
struct AgentProcess {
    name: String,
    log: PathBuf,
    child: Child,
}

impl AgentProcess {
    fn start(scratch: &Path, server: &Server, provider_key: &str, name: &str) -> AgentProcess {
        let log = scratch.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the agent log");
        let child = Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(["agent", "--coordinator", &server.url, "--provider-key", provider_key])
            .arg("--data-dir")
            .arg(scratch.join(name))
            .args(["--name", name, "--executor", "process", "--simulate-gpus", GPUS])
            .args(["--usage-every-s", "1", "--grace-s", "1"])
            .env_remove("FALLOW_COORDINATOR")
            .env_remove("FALLOW_PROVIDER_KEY")
            .env_remove("FALLOW_AGENT_DATA_DIR")
            .env("FALLOW_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone the log handle"))
            .stderr(out)
            .spawn()
            .expect("spawn fallow agent");
        AgentProcess {
            name: name.to_string(),
            log,
            child,
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the agent's process alone, not its group.
    fn signal(&self, signal: &str) {
        let status = Command::new("/bin/sh")
            .args(["-c", &format!("kill -{signal} {}", self.child.id())])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// SIGKILL, then reap: as abrupt as a crash.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        format!("{} log:\n{}", self.name, tail(&self.log, 6000))
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (an orphan waiting for a reaper).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

fn now_ms() -> i64 {
    common::now_ms()
}

/// The replica's script: its pid to `DIR/pid-LEASE`, then a numbered tick with the time in
/// nanoseconds to `DIR/ticks-LEASE` every 50 ms, until the test creates `DIR/finish`.
fn replica_script(dir: &Path) -> String {
    format!(
        "echo $$ > {0}/pid-$FALLOW_LEASE_ID; n=0; \
         while [ ! -e {0}/finish ]; do n=$((n + 1)); echo \"$n $(date +%s%N)\" >> {0}/ticks-$FALLOW_LEASE_ID; sleep 0.05; done",
        dir.display()
    )
}

/// The process id a replica of `lease` wrote, once it has.
fn replica_pid(dir: &Path, lease: i64) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("pid-{lease}")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The tick times (ns) a replica of `lease` wrote.
fn ticks(dir: &Path, lease: i64) -> Vec<u128> {
    std::fs::read_to_string(dir.join(format!("ticks-{lease}")))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

/// Polls every replica's process (every `pid-*` file of `dir`) each few milliseconds, and notes
/// each instant at which two of them were alive at once.
struct OverlapWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl OverlapWatch {
    fn start(dir: &Path) -> OverlapWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, watching) = (dir.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut overlaps = Vec::new();
            while !watching.load(Ordering::Relaxed) {
                let pids: Vec<(String, i32)> = std::fs::read_dir(&dir)
                    .map(|entries| {
                        entries
                            .filter_map(|entry| {
                                let entry = entry.ok()?;
                                let name = entry.file_name().to_string_lossy().into_owned();
                                let lease = name.strip_prefix("pid-")?.to_string();
                                let pid = std::fs::read_to_string(entry.path()).ok()?.trim().parse().ok()?;
                                Some((lease, pid))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let running: Vec<&(String, i32)> = pids.iter().filter(|(_, pid)| alive(*pid)).collect();
                if running.len() > 1 {
                    overlaps.push(format!("at {} ms: replicas (lease, pid) {running:?}", now_ms()));
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            overlaps
        });
        OverlapWatch { stop, thread }
    }

    fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the overlap watch")
    }
}

/// The world of one test: a coordinator, a funded tenant, a provider, and a folder the
/// replicas write to.
struct World {
    scratch: Scratch,
    server: Server,
    http: reqwest::Client,
    tenant_key: String,
    provider_key: String,
    marks: PathBuf,
}

impl World {
    async fn new(name: &str) -> World {
        let scratch = Scratch::new(name);
        let server = Server::start(&scratch.path).await;
        let http = http();
        let market = set_up_market(&http, &server.url, &server.admin_key, 0, 1).await;
        let marks = scratch.path.join("marks");
        std::fs::create_dir_all(&marks).expect("create the marks folder");
        World {
            scratch,
            server,
            http,
            tenant_key: market.tenant_key,
            provider_key: market.provider_key,
            marks,
        }
    }

    async fn get(&self, key: &str, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}{path}", self.server.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap_or_else(|error| panic!("{path}: {error}"));
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.json().await.expect("a JSON answer")
    }

    async fn job(&self, id: i64) -> Value {
        self.get(&self.tenant_key, &format!("/v1/jobs/{id}")).await
    }

    fn agent(&self, name: &str) -> AgentProcess {
        AgentProcess::start(&self.scratch.path, &self.server, &self.provider_key, name)
    }

    async fn submit(&self) -> i64 {
        let response = self
            .http
            .post(format!("{}/v1/jobs", self.server.url))
            .bearer_auth(&self.tenant_key)
            .json(&json!({
                "name": "counts-until-told",
                "image": "/bin/sh",
                "command": ["-c", replica_script(&self.marks)],
                "gpus": 1,
                "tier": "silver",
                "max_price_per_gpu_hour": "5.00",
                "max_runtime_s": 600,
            }))
            .send()
            .await
            .expect("submit the job");
        assert_eq!(response.status(), StatusCode::CREATED);
        let view: Value = response.json().await.expect("the job's view");
        view["id"].as_i64().expect("a job id")
    }

    /// The node named `name` once it is online.
    async fn online(&self, name: &str) -> i64 {
        eventually(WITHIN, &format!("node {name} online"), || async {
            let nodes = self.get(&self.server.admin_key, "/v1/nodes").await;
            nodes
                .as_array()?
                .iter()
                .find(|node| node["name"] == name && node["online"] == true)?["id"]
                .as_i64()
        })
        .await
    }

    /// The job's live lease on `node`, once it has one.
    async fn lease_on(&self, job: i64, node: i64) -> Value {
        eventually(WITHIN, &format!("job {job} running on node {node}"), || async {
            let view = self.job(job).await;
            view["leases"]
                .as_array()?
                .iter()
                .find(|lease| lease["node_id"] == node && lease["state"] == "running")
                .cloned()
        })
        .await
    }

    async fn usage_records(&self, lease: i64) -> Vec<store::UsageRow> {
        let store = store::Store::open(&self.server.database)
            .await
            .expect("the test opens the database");
        store.usage_of_lease(lease).await.expect("read the usage records")
    }

    /// Lets the job finish, and checks what both leases were billed: each usage record charged
    /// exactly its metered GPU-seconds at the lease's price; the tenant charged, and the provider
    /// paid less the fee, exactly their sum; nothing left in escrow; the lost lease billed only
    /// for what it metered up to when its replica died (`first_died_ms`).
    async fn finish_and_check_the_bill(&self, job: i64, first: &Value, second: &Value, first_died_ms: i64) {
        std::fs::write(self.marks.join("finish"), "").expect("tell the replica to finish");
        let view = eventually(WITHIN, "the job finished", || async {
            let view = self.job(job).await;
            (view["state"] == "finished").then_some(view)
        })
        .await;
        let (first_id, second_id) = (first["id"].as_i64().unwrap(), second["id"].as_i64().unwrap());
        let lost = self.usage_records(first_id).await;
        let delivered = self.usage_records(second_id).await;
        assert!(!lost.is_empty() && !delivered.is_empty(), "both leases metered usage");
        for (lease, records) in [(first, &lost), (second, &delivered)] {
            let price = lease["price_micros_per_gpu_hour"].as_i64().expect("the lease's price");
            assert!(price > 0, "{lease}");
            for record in records.iter() {
                // One GPU: GPU-milli-seconds × price per GPU-hour / (1000 × 3600), rounded.
                let expected = (i128::from(price) * i128::from(record.gpu_seconds_milli) + 1_800_000) / 3_600_000;
                assert_eq!(
                    i128::from(record.charged_micros),
                    expected,
                    "lease {} record {} charged exactly its metered seconds",
                    lease["id"],
                    record.sequence
                );
            }
        }
        // The lost lease: every record ends before its replica died, and they add up to no more
        // than the time it ran.
        let first_started_ms = first["created_at_us"].as_i64().unwrap() / 1000;
        for record in &lost {
            let body: Value = serde_json::from_str(&record.body).expect("the record's body");
            let end = body["period_end_ms"].as_i64().expect("a period end");
            assert!(
                end <= first_died_ms,
                "the lost lease was billed for {} ms after its replica died",
                end - first_died_ms
            );
        }
        let lost_milli: i64 = lost.iter().map(|record| record.gpu_seconds_milli).sum();
        assert!(
            lost_milli <= first_died_ms - first_started_ms,
            "the lost lease metered {lost_milli} GPU-ms in {} ms",
            first_died_ms - first_started_ms
        );

        let charged: i64 = lost.iter().chain(&delivered).map(|record| record.charged_micros).sum();
        let earned: i64 = lost
            .iter()
            .chain(&delivered)
            .map(|record| record.charged_micros - record.charged_micros * FEE_PERMILLE / 1000)
            .sum();
        assert!(charged > 0);
        assert_eq!(view["cost_micros"], charged, "the job's cost: {view}");
        assert_eq!(view["escrow_micros"], 0, "nothing left in escrow: {view}");
        let tenant = self.get(&self.tenant_key, "/v1/balance").await;
        assert_eq!(
            (tenant["available_micros"].as_i64(), tenant["escrow_micros"].as_i64()),
            (Some(CREDIT_MICROS - charged), Some(0)),
            "the tenant paid exactly the metered usage: {tenant}"
        );
        let provider = self.get(&self.provider_key, "/v1/balance").await;
        assert_eq!(
            provider["earnings_micros"], earned,
            "the provider earned the usage less the fee: {provider}"
        );
    }
}

impl Drop for World {
    /// Ends every replica that may still run (a failed test's, unguarded), before the folder goes.
    fn drop(&mut self) {
        let _ = std::fs::write(self.marks.join("finish"), "");
    }
}

/// Starts agent 1, runs the job on it until it has billed some usage, then starts agent 2 for
/// the job to move to. Returns the agents, their node ids, the job and its first lease.
async fn a_job_running_on_the_first_agent(world: &World) -> (AgentProcess, AgentProcess, i64, i64, i64, Value) {
    let first_agent = world.agent("rig-1");
    let first_node = world.online("rig-1").await;
    let job = world.submit().await;
    let first = world.lease_on(job, first_node).await;
    let first_id = first["id"].as_i64().unwrap();
    eventually(WITHIN, "the first replica started", || async {
        replica_pid(&world.marks, first_id).filter(|pid| alive(*pid))
    })
    .await;
    eventually(WITHIN, "the first lease billed usage", || async {
        (world.usage_records(first_id).await.len() >= 2).then_some(())
    })
    .await;
    // Started only now, so that the job went to the first.
    let second_agent = world.agent("rig-2");
    let second_node = world.online("rig-2").await;
    (first_agent, second_agent, first_node, second_node, job, first)
}

/// Waits until replica `pid` has died; returns when (wall clock, ms), failing after `within`.
async fn died_within(pid: i32, since: Instant, within: Duration, what: &str) -> i64 {
    loop {
        if !alive(pid) {
            return now_ms();
        }
        assert!(
            since.elapsed() < within,
            "{what}: still alive after {:?}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The ticks of the two replicas never interleave: the first's last before the second's first.
fn assert_one_after_the_other(marks: &Path, first: i64, second: i64) {
    let (before, after) = (ticks(marks, first), ticks(marks, second));
    let (Some(last), Some(next)) = (before.iter().max(), after.iter().min()) else {
        panic!("both replicas ticked: {} and {} ticks", before.len(), after.len());
    };
    assert!(
        last < next,
        "the first replica ticked {} ms after the second started",
        (last - next) / 1_000_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_killed_agents_replica_is_stopped_by_its_guard_and_the_job_moves_without_running_twice() {
    let world = World::new("agent-killed").await;
    let watch = OverlapWatch::start(&world.marks);
    let (first_agent, second_agent, first_node, second_node, job, first) =
        a_job_running_on_the_first_agent(&world).await;
    let first_id = first["id"].as_i64().unwrap();
    let first_pid = replica_pid(&world.marks, first_id).unwrap();

    let killed_at = Instant::now();
    first_agent.kill();
    // The guard sees its feed end and stops the replica at once, well within the fence time.
    let first_died_ms = died_within(first_pid, killed_at, FENCE, "the killed agent's replica").await;

    // The coordinator moves the lease a whole timeout after the last heartbeat it took.
    // (A heartbeat or two may have been lost to a busy machine before the kill.)
    let second = world.lease_on(job, second_node).await;
    assert!(
        killed_at.elapsed() >= HEARTBEAT_TIMEOUT - 2 * HEARTBEAT_INTERVAL,
        "the lease moved {:?} after the kill, before the heartbeat timeout",
        killed_at.elapsed()
    );
    assert!(
        first_died_ms < second["created_at_us"].as_i64().unwrap() / 1000,
        "the replica died before the lease moved: {second}"
    );
    let view = world.job(job).await;
    let lost = view["leases"]
        .as_array()
        .and_then(|leases| leases.iter().find(|lease| lease["id"] == first_id))
        .cloned()
        .expect("the first lease is listed");
    assert_eq!(lost["state"], "lost", "{view}");
    assert!(
        lost["epoch"].as_i64() > first["epoch"].as_i64(),
        "the lost lease's epoch moved on: {view}"
    );
    let second_id = second["id"].as_i64().unwrap();
    let second_pid = eventually(WITHIN, "the second replica started", || async {
        replica_pid(&world.marks, second_id).filter(|pid| alive(*pid))
    })
    .await;

    // The first agent comes back with the lease it had at the old epoch: it stops what runs.json
    // names and starts nothing of that lease again.
    let back = world.agent("rig-1");
    let back_node = world.online("rig-1").await;
    assert_eq!(back_node, first_node);
    eventually(
        WITHIN,
        "the restarted agent stopped what its runs.json named",
        || async {
            std::fs::read_to_string(&back.log)
                .unwrap_or_default()
                .contains("stopping a replica left by an earlier run of the agent")
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(HEARTBEAT_TIMEOUT).await;
    assert_eq!(
        replica_pid(&world.marks, first_id),
        Some(first_pid),
        "the stale lease's replica was started again"
    );
    assert!(!alive(first_pid));
    assert!(alive(second_pid), "the moved replica runs on");
    assert_eq!(world.job(job).await["state"], "running");

    world
        .finish_and_check_the_bill(job, &first, &second, first_died_ms)
        .await;
    let overlaps = watch.finish();
    assert!(overlaps.is_empty(), "the job ran twice at once: {overlaps:?}");
    assert_one_after_the_other(&world.marks, first_id, second_id);
    assert!(
        std::fs::read_to_string(&second_agent.log)
            .unwrap_or_default()
            .contains("replica ended; attested"),
        "{}",
        second_agent.log_tail()
    );
    drop((back, second_agent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_frozen_agents_replica_is_stopped_by_its_guard_before_the_lease_moves() {
    let world = World::new("agent-frozen").await;
    let watch = OverlapWatch::start(&world.marks);
    let (first_agent, second_agent, _, second_node, job, first) = a_job_running_on_the_first_agent(&world).await;
    let first_id = first["id"].as_i64().unwrap();
    let first_pid = replica_pid(&world.marks, first_id).unwrap();

    // Frozen, not dead: its guards' feeds stay open but go quiet.
    let frozen_at = Instant::now();
    first_agent.signal("STOP");
    let first_died_ms = died_within(first_pid, frozen_at, FENCE + GUARD_GRACE, "the frozen agent's replica").await;
    let second = world.lease_on(job, second_node).await;
    assert!(
        first_died_ms < second["created_at_us"].as_i64().unwrap() / 1000,
        "the replica died before the lease moved: {second}"
    );
    let second_id = second["id"].as_i64().unwrap();
    let second_pid = eventually(WITHIN, "the second replica started", || async {
        replica_pid(&world.marks, second_id).filter(|pid| alive(*pid))
    })
    .await;

    // Thawed: it hears its lease is gone (or that its epoch is old) and starts nothing of it.
    let ticks_before = ticks(&world.marks, first_id).len();
    first_agent.signal("CONT");
    world.online("rig-1").await;
    tokio::time::sleep(HEARTBEAT_TIMEOUT).await;
    let view = world.job(job).await;
    let lost = view["leases"]
        .as_array()
        .and_then(|leases| leases.iter().find(|lease| lease["id"] == first_id))
        .cloned()
        .expect("the first lease is listed");
    assert_eq!(lost["state"], "lost", "{view}");
    assert_eq!(
        (replica_pid(&world.marks, first_id), ticks(&world.marks, first_id).len()),
        (Some(first_pid), ticks_before),
        "the thawed agent ran the stale lease again; {}",
        first_agent.log_tail()
    );
    assert!(alive(second_pid), "the moved replica runs on");

    world
        .finish_and_check_the_bill(job, &first, &second, first_died_ms)
        .await;
    let overlaps = watch.finish();
    assert!(overlaps.is_empty(), "the job ran twice at once: {overlaps:?}");
    assert_one_after_the_other(&world.marks, first_id, second_id);
    drop((first_agent, second_agent));
}
