//! The harness of the process-level fault tests: scratch folders and fresh databases, `fallow
//! server` processes started and SIGKILLed, a market set up through the HTTP API (admin, tenant,
//! provider, nodes with signing keys), agents' signed heartbeats, storms of job submissions, and
//! the checks a crash must leave true: no acknowledged job lost, no lease granted twice, no GPU
//! in two leases, money held exactly for placed jobs, a balanced ledger.

// Each test binary uses part of the harness.
#![allow(dead_code)]

pub mod bucket;
pub mod dev;
pub mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api::{JobRequest, JobView, NewAccountResponse, NodeRegistration, NodeView, PolicyDoc};
use reqwest::StatusCode;
use sqlx::Connection;
use store::{JobState, Store};
use trust::NodeKey;

/// How long a started coordinator may take to answer `/v1/health`.
pub const READY_WITHIN: Duration = Duration::from_secs(60);
/// How often the test's agents heartbeat (each node, to one replica in turn).
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(300);
/// How often a condition is polled.
pub const POLL_EVERY: Duration = Duration::from_millis(25);
/// The longest one HTTP request of the test may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// How many times a coordinator start is retried when its random port was taken meanwhile.
pub const START_ATTEMPTS_MAX: u32 = 5;
/// GPU model and price of every test node and job.
pub const GPU_MODEL: &str = "H100-SXM5";
/// The token that reads `/metrics` of every coordinator these tests start (`FALLOW_METRICS_TOKEN`),
/// so a test scrapes a replica that did not write the admin's key as easily as one that did.
pub const METRICS_TOKEN: &str = "test-metrics-token-0123456789abcdef";
pub const ASK_DOLLARS: &str = "2.00";
pub const MAX_PRICE_DOLLARS: &str = "10.00";

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .subsec_nanos()
    )
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// A folder for one test's data directories and logs: removed when the test passes, kept (and
/// named on stderr) when it fails, for the logs.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let path = std::env::temp_dir().join(unique(name));
        std::fs::create_dir_all(&path).expect("create the scratch folder");
        Scratch { path }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for inspection: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The PostgreSQL server's URL from `FALLOW_TEST_POSTGRES_URL`. Without it the test is skipped
/// with a loud message, unless `FALLOW_CI_REQUIRE_SERVICES=1`, where it fails.
pub fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("FALLOW_TEST_POSTGRES_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("FALLOW_TEST_POSTGRES_URL is not set but FALLOW_CI_REQUIRE_SERVICES=1: {test} must run")
        }
        Err(_) => {
            eprintln!("SKIPPED: {test} (set FALLOW_TEST_POSTGRES_URL to run it)");
            None
        }
    }
}

/// A new, empty database on the server of `base_url`; its URL.
pub async fn fresh_postgres_database(base_url: &str) -> String {
    let name = unique("fallow_f");
    let mut connection = sqlx::PgConnection::connect(base_url)
        .await
        .expect("PostgreSQL at FALLOW_TEST_POSTGRES_URL answers");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut connection)
        .await
        .expect("create a test database");
    let _ = connection.close().await;
    let (base, _) = base_url.rsplit_once('/').expect("the URL names a database");
    format!("{base}/{name}")
}

/// Drops a database made by [`fresh_postgres_database`] (best effort: a leftover is harmless).
pub async fn drop_postgres_database(base_url: &str, url: &str) {
    let Some((_, name)) = url.rsplit_once('/') else {
        return;
    };
    if let Ok(mut connection) = sqlx::PgConnection::connect(base_url).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut connection)
        .await;
        let _ = connection.close().await;
    }
}

/// The last `bytes` of a file, as text.
pub fn tail(path: &Path, bytes: u64) -> String {
    let length = std::fs::metadata(path).map_or(0, |metadata| metadata.len());
    read_from(path, length.saturating_sub(bytes))
}

/// A local port free now (the kernel's choice), for a process the test starts on it.
/// Runs the `fallow` binary with only `env` (and a home without a config file).
pub fn cli(home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args(args)
        .env_clear()
        .env("HOME", home)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the fallow binary")
}

/// Its stdout, after checking that it succeeded.
pub fn succeeded(output: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed:\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Its stderr, after checking that it failed with every one of `says` in it.
pub fn failed_saying(output: &Output, what: &str, says: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "{what} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    for text in says {
        assert!(stderr.contains(text), "{what}: {text:?} not in: {stderr}");
    }
    stderr
}

/// One user of the CLI: a coordinator's URL and an API key (`FALLOW_URL`, `FALLOW_API_KEY`).
pub struct User<'a> {
    pub home: &'a Path,
    pub url: String,
    pub key: String,
}

impl User<'_> {
    /// `fallow LINE` (split on whitespace) as this user.
    pub fn run(&self, line: &str) -> Output {
        let args: Vec<&str> = line.split_whitespace().collect();
        cli(
            self.home,
            &[("FALLOW_URL", &self.url), ("FALLOW_API_KEY", &self.key)],
            &args,
        )
    }

    pub fn ok(&self, line: &str) -> String {
        succeeded(&self.run(line), line)
    }

    pub fn json(&self, line: &str) -> serde_json::Value {
        let stdout = self.ok(line);
        serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{line}: {error} in {stdout}"))
    }

    pub fn fails(&self, line: &str, says: &[&str]) -> String {
        failed_saying(&self.run(line), line, says)
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free local port")
        .port()
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("an HTTP client builds")
}

/// Sends SIGTERM to `child` and waits up to `within` for it to exit: how it exited, or `None`
/// when it did not (it is killed then).
pub fn terminate(mut child: Child, within: Duration) -> Option<std::process::ExitStatus> {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill(1) runs");
    assert!(sent.success(), "kill -TERM {}", child.id());
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("poll the child process") {
            return Some(status);
        }
        std::thread::sleep(POLL_EVERY);
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// One `fallow server` process. Dropping it kills the process.
pub struct Coordinator {
    pub name: String,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Coordinator {
    /// Starts `fallow server` on `database` with its own data directory and a free port, and
    /// waits until it answers `/v1/health`. Its stderr (JSON logs) goes to `LOG_DIR/NAME.log`,
    /// appended across restarts.
    pub async fn start(name: &str, database: &str, data_dir: &Path, log_dir: &Path) -> Coordinator {
        Coordinator::start_with(name, database, data_dir, log_dir, &[]).await
    }

    /// `start` on a SQLite file in `scratch`'s `data` directory, logging into `scratch`.
    pub async fn in_scratch(scratch: &Scratch) -> Coordinator {
        let data_dir = scratch.path.join("data");
        std::fs::create_dir_all(&data_dir).expect("create the data directory");
        let database = format!("sqlite://{}", data_dir.join("fallow.db").display());
        Coordinator::start("coordinator", &database, &data_dir, &scratch.path).await
    }

    /// `start`, with more arguments for `fallow server` (`--heartbeat-timeout-ms 3000`, …).
    pub async fn start_with(name: &str, database: &str, data_dir: &Path, log_dir: &Path, args: &[&str]) -> Coordinator {
        let log = log_dir.join(format!("{name}.log"));
        for _ in 0..START_ATTEMPTS_MAX {
            // A free port now; another process may take it before the server binds, so retry.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free local port")
                .port();
            let log_file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("open the server log");
            let started_at = log_file.metadata().map_or(0, |metadata| metadata.len());
            let child = Command::new(env!("CARGO_BIN_EXE_fallow"))
                .args(["server", "--database", database, "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .arg("--data-dir")
                .arg(data_dir)
                .args(args)
                .env_remove("FALLOW_DATABASE")
                .env_remove("FALLOW_LISTEN")
                .env_remove("FALLOW_DATA_DIR")
                .env("FALLOW_LOG", "info")
                .env("FALLOW_METRICS_TOKEN", METRICS_TOKEN)
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("clone the log handle"))
                .stderr(log_file)
                .spawn()
                .expect("spawn fallow server");
            let mut coordinator = Coordinator {
                name: name.to_string(),
                url: format!("http://127.0.0.1:{port}"),
                data_dir: data_dir.to_path_buf(),
                log: log.clone(),
                child: Some(child),
            };
            match coordinator.wait_ready().await {
                Ok(()) => return coordinator,
                Err(()) => {
                    if read_from(&log, started_at).contains("in use") {
                        eprintln!("{name}: port {port} was taken; retrying on another");
                        continue;
                    }
                    panic!("{name} did not start; its log:\n{}", tail(&log, 8000));
                }
            }
        }
        panic!("{name}: no free port after {START_ATTEMPTS_MAX} attempts");
    }

    async fn wait_ready(&mut self) -> Result<(), ()> {
        let http = http();
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            let child = self.child.as_mut().expect("started");
            if child.try_wait().expect("poll the server process").is_some() {
                self.child = None;
                return Err(());
            }
            if let Ok(response) = http.get(format!("{}/v1/health", self.url)).send().await
                && response.status() == StatusCode::OK
            {
                return Ok(());
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
        self.kill();
        panic!(
            "{} did not answer /v1/health within {READY_WITHIN:?}; its log:\n{}",
            self.name,
            tail(&self.log, 8000)
        );
    }

    /// SIGTERM (what systemd and `docker stop` send), then how the process exited within
    /// `within` (see [`terminate`]).
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        terminate(self.child.take()?, within)
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log_tail(&self) -> String {
        tail(&self.log, 6000)
    }

    /// The admin key this coordinator wrote at first start, if it did.
    pub fn admin_key(&self) -> Option<String> {
        std::fs::read_to_string(self.data_dir.join(server::ADMIN_KEY_FILE))
            .ok()
            .map(|text| text.trim().to_string())
    }
}

/// A file's text from byte `offset` on.
fn read_from(path: &Path, offset: u64) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let _ = file.seek(SeekFrom::Start(offset));
    let mut text = Vec::new();
    let _ = file.read_to_end(&mut text);
    String::from_utf8_lossy(&text).into_owned()
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `/metrics` of one coordinator (read with `METRICS_TOKEN`); None when it does not answer.
pub async fn metrics(http: &reqwest::Client, base: &str) -> Option<String> {
    let response = http
        .get(format!("{base}/metrics"))
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .ok()?;
    if response.status() != StatusCode::OK {
        return None;
    }
    response.text().await.ok()
}

/// The value of one sample (`name` or `name{labels}`, exactly as printed) in a metrics text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (key, value) = line.rsplit_once(' ')?;
        (key == name).then(|| value.parse().ok())?
    })
}

pub async fn metric(http: &reqwest::Client, base: &str, name: &str) -> Option<f64> {
    sample(&metrics(http, base).await?, name)
}

/// Which of `bases` report `fallow_leader 1` now.
pub async fn leaders(http: &reqwest::Client, bases: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for base in bases {
        if metric(http, base, "fallow_leader").await == Some(1.0) {
            out.push(base.clone());
        }
    }
    out
}

/// Polls `condition` until it returns Some, or panics with `what` after `within`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

async fn send_json<B: serde::Serialize>(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    key: &str,
    body: Option<&B>,
) -> (StatusCode, String) {
    let mut request = http.request(method, url).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap_or_else(|error| panic!("{url}: {error}"));
    let status = response.status();
    (status, response.text().await.unwrap_or_default())
}

/// Sends a request that must succeed with `expect` and parses its answer.
async fn call<B: serde::Serialize, R: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    key: &str,
    body: Option<&B>,
    expect: StatusCode,
) -> R {
    let (status, text) = send_json(http, method, url, key, body).await;
    assert_eq!(status, expect, "{url}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{url}: {error} in {text}"))
}

/// A node's agent: its id and signing key.
pub struct Agent {
    pub id: i64,
    pub key: NodeKey,
}

/// The parties of a test market.
pub struct Market {
    pub admin_key: String,
    pub tenant_id: i64,
    pub tenant_key: String,
    pub provider_key: String,
    pub agents: Arc<Vec<Agent>>,
    pub gpus_per_node: u8,
}

/// Creates a tenant (credited $100,000) and a provider through `base`, and registers `nodes`
/// nodes of `gpus_per_node` GPUs each, every one with its own key.
pub async fn set_up_market(
    http: &reqwest::Client,
    base: &str,
    admin_key: &str,
    nodes: usize,
    gpus_per_node: u8,
) -> Market {
    let account = |role: &str| serde_json::json!({"role": role, "name": unique(role)});
    let tenant: NewAccountResponse = call(
        http,
        reqwest::Method::POST,
        &format!("{base}/v1/admin/accounts"),
        admin_key,
        Some(&account("tenant")),
        StatusCode::CREATED,
    )
    .await;
    let provider: NewAccountResponse = call(
        http,
        reqwest::Method::POST,
        &format!("{base}/v1/admin/accounts"),
        admin_key,
        Some(&account("provider")),
        StatusCode::CREATED,
    )
    .await;
    let credit = api::CreditRequest {
        account_id: tenant.account.id,
        amount: "100000.00".to_string(),
        key: unique("credit"),
    };
    let _: api::BalanceView = call(
        http,
        reqwest::Method::POST,
        &format!("{base}/v1/admin/credits"),
        admin_key,
        Some(&credit),
        StatusCode::OK,
    )
    .await;
    let mut agents = Vec::with_capacity(nodes);
    for index in 0..nodes {
        let key = NodeKey::generate();
        let registration = NodeRegistration {
            name: format!("node-{index}"),
            public_key: key.public_hex(),
            fingerprint: format!("fp-{index}"),
            gpu_model: GPU_MODEL.to_string(),
            gpu_count: gpus_per_node,
            cpu_milli: 256_000,
            memory_mib: 2_097_152,
            network_mbit_s: 100_000,
            region: "eu-west".to_string(),
            site: "ams1".to_string(),
            fabric: "ams1-ib0".to_string(),
            nvlink_domain: format!("board-{index}"),
            latitude: 52.37,
            longitude: 4.9,
            simulated: true,
            policy: PolicyDoc {
                asks: BTreeMap::from([("silver".to_string(), ASK_DOLLARS.to_string())]),
                ..PolicyDoc::default()
            },
            runtimes: Vec::new(),
            canary_kinds: Vec::new(),
            advertise_addr: String::new(),
            gang_ports: String::new(),
            nvlink_source: String::new(),
            nvlink_detected: String::new(),
        };
        let node: NodeView = call(
            http,
            reqwest::Method::POST,
            &format!("{base}/v1/nodes"),
            &provider.api_key.api_key,
            Some(&registration),
            StatusCode::CREATED,
        )
        .await;
        agents.push(Agent { id: node.id, key });
    }
    Market {
        admin_key: admin_key.to_string(),
        tenant_id: tenant.account.id,
        tenant_key: tenant.api_key.api_key,
        provider_key: provider.api_key.api_key,
        agents: Arc::new(agents),
        gpus_per_node,
    }
}

/// One signed heartbeat; the status, or the transport error as text.
pub async fn heartbeat(http: &reqwest::Client, base: &str, agent: &Agent) -> Result<StatusCode, String> {
    let path = "/v1/agent/heartbeat";
    let body = b"{}";
    let headers = agent.key.sign_request_now(agent.id, "POST", path, body, now_ms());
    let mut request = http
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (name, value) in headers.header_pairs() {
        request = request.header(name, value);
    }
    request
        .send()
        .await
        .map(|response| response.status())
        .map_err(|error| error.to_string())
}

/// The replicas the test's clients talk to; replaced when one dies or restarts.
#[derive(Clone)]
pub struct Targets(Arc<Mutex<Vec<String>>>);

impl Targets {
    pub fn new(bases: Vec<String>) -> Targets {
        Targets(Arc::new(Mutex::new(bases)))
    }

    pub fn set(&self, bases: Vec<String>) {
        *self.0.lock().expect("targets lock") = bases;
    }

    pub fn get(&self) -> Vec<String> {
        self.0.lock().expect("targets lock").clone()
    }

    /// The `turn`-th target, round robin.
    pub fn pick(&self, turn: usize) -> String {
        let bases = self.0.lock().expect("targets lock");
        bases[turn % bases.len()].clone()
    }
}

/// Every node heartbeats every [`HEARTBEAT_EVERY`], to the targets in turn, until stopped.
/// Failures (a replica being killed) are ignored: the next beat goes elsewhere.
pub struct Heartbeats {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeats {
    pub fn start(http: &reqwest::Client, agents: Arc<Vec<Agent>>, targets: Targets) -> Heartbeats {
        let stop = Arc::new(AtomicBool::new(false));
        let http = http.clone();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut turn = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    for agent in agents.iter() {
                        let _ = heartbeat(&http, &targets.pick(turn), agent).await;
                        turn += 1;
                    }
                    tokio::time::sleep(HEARTBEAT_EVERY).await;
                }
            }
        });
        Heartbeats { stop, task }
    }

    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

/// Waits until every node of the market is online (through `base`, as the admin sees them).
pub async fn wait_online(http: &reqwest::Client, base: &str, market: &Market, within: Duration) {
    let url = format!("{base}/v1/nodes");
    eventually(within, "every node online", || async {
        let (status, text) = send_json::<()>(http, reqwest::Method::GET, &url, &market.admin_key, None).await;
        let nodes: Vec<NodeView> = (status == StatusCode::OK)
            .then(|| serde_json::from_str(&text).ok())
            .flatten()?;
        (nodes.iter().filter(|node| node.online).count() == market.agents.len()).then_some(())
    })
    .await;
}

/// A one-GPU silver job with an idempotency token.
pub fn job_request(token: &str) -> JobRequest {
    JobRequest {
        name: token.to_string(),
        image: "busybox:latest".to_string(),
        gpus: Some(1),
        replicas: 1,
        topology: "any".to_string(),
        tier: "silver".to_string(),
        class: "batch".to_string(),
        max_price_per_gpu_hour: MAX_PRICE_DOLLARS.to_string(),
        max_runtime_s: 3600,
        network: "none".to_string(),
        client_token: Some(token.to_string()),
        ..JobRequest::default()
    }
}

/// What became of one submission.
#[derive(Clone, Debug, PartialEq)]
pub enum Submitted {
    /// 201 with this job id: the coordinator promised the job exists.
    Acked(i64),
    /// An answer other than 201; nothing was promised.
    Refused(StatusCode, String),
    /// No answer (the coordinator died): the job may or may not exist.
    NoAnswer(String),
}

pub async fn submit(http: &reqwest::Client, base: &str, tenant_key: &str, token: &str) -> Submitted {
    let response = http
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(tenant_key)
        .json(&job_request(token))
        .send()
        .await;
    let response = match response {
        Ok(response) => response,
        Err(error) => return Submitted::NoAnswer(error.to_string()),
    };
    let status = response.status();
    let text = match response.text().await {
        Ok(text) => text,
        Err(error) => return Submitted::NoAnswer(error.to_string()),
    };
    if status != StatusCode::CREATED {
        return Submitted::Refused(status, text);
    }
    match serde_json::from_str::<JobView>(&text) {
        Ok(job) => Submitted::Acked(job.id),
        Err(error) => panic!("a 201 for job {token} did not parse: {error} in {text}"),
    }
}

/// What a storm of submissions left: tokens acknowledged with their job ids, and tokens whose
/// fate the client does not know (refused or unanswered).
#[derive(Debug, Default)]
pub struct Outcomes {
    pub acked: Vec<(String, i64)>,
    pub unknown: Vec<(String, String)>,
}

/// Concurrent submitters, each sending jobs with fresh tokens to the targets in turn, a pause
/// apart, until `budget` tokens are used or the storm is stopped.
pub struct Storm {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Outcomes>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    issued: Arc<AtomicU64>,
    pub budget: u64,
}

impl Storm {
    pub fn start(
        http: &reqwest::Client,
        targets: Targets,
        tenant_key: &str,
        prefix: &str,
        workers: usize,
        budget: u64,
        pause: Duration,
    ) -> Storm {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Outcomes::default()));
        let issued = Arc::new(AtomicU64::new(0));
        let tasks = (0..workers)
            .map(|worker| {
                let (http, targets, stop, outcomes, issued) = (
                    http.clone(),
                    targets.clone(),
                    stop.clone(),
                    outcomes.clone(),
                    issued.clone(),
                );
                let (tenant_key, prefix) = (tenant_key.to_string(), prefix.to_string());
                tokio::spawn(async move {
                    let mut turn = worker;
                    while !stop.load(Ordering::Relaxed) {
                        let number = issued.fetch_add(1, Ordering::Relaxed);
                        if number >= budget {
                            break;
                        }
                        let token = format!("{prefix}-{number}");
                        let base = targets.pick(turn);
                        turn += 1;
                        let submitted = submit(&http, &base, &tenant_key, &token).await;
                        {
                            let mut outcomes = outcomes.lock().expect("outcomes lock");
                            match submitted {
                                Submitted::Acked(id) => outcomes.acked.push((token, id)),
                                Submitted::Refused(status, text) => {
                                    outcomes.unknown.push((token, format!("{status}: {text}")));
                                }
                                Submitted::NoAnswer(error) => outcomes.unknown.push((token, error)),
                            }
                        }
                        tokio::time::sleep(pause).await;
                    }
                })
            })
            .collect();
        Storm {
            stop,
            outcomes,
            tasks,
            issued,
            budget,
        }
    }

    pub fn acked(&self) -> usize {
        self.outcomes.lock().expect("outcomes lock").acked.len()
    }

    /// Whether every submitter has used up the budget and finished.
    pub fn finished(&self) -> bool {
        self.tasks.iter().all(|task| task.is_finished())
    }

    /// Stops the submitters (those in flight finish their request) and returns the outcomes.
    pub async fn stop(self) -> Outcomes {
        self.stop.store(true, Ordering::Relaxed);
        self.finish().await
    }

    /// Waits until the budget is used, and returns the outcomes.
    pub async fn finish(self) -> Outcomes {
        for task in self.tasks {
            task.await.expect("a submitter panicked");
        }
        std::mem::take(&mut *self.outcomes.lock().expect("outcomes lock"))
    }
}

/// Submits every token again (through the targets in turn) and checks that each acknowledged
/// one names the same job; returns every token's job id.
pub async fn resubmit(
    http: &reqwest::Client,
    targets: &Targets,
    tenant_key: &str,
    outcomes: &Outcomes,
) -> BTreeMap<String, i64> {
    let mut jobs = BTreeMap::new();
    let tokens = outcomes
        .acked
        .iter()
        .map(|(token, id)| (token, Some(*id)))
        .chain(outcomes.unknown.iter().map(|(token, _)| (token, None)));
    for (turn, (token, acked)) in tokens.enumerate() {
        let base = targets.pick(turn);
        let id = match submit(http, &base, tenant_key, token).await {
            Submitted::Acked(id) => id,
            other => panic!("resubmitting {token} to {base}: {other:?}"),
        };
        if let Some(acked) = acked {
            assert_eq!(
                id, acked,
                "token {token} was acknowledged as job {acked}; resubmitted, it made job {id}"
            );
        }
        jobs.insert(token.clone(), id);
    }
    jobs
}

/// Returns `Err(message)` from the enclosing function when `condition` is false.
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}

/// Job counts by state, as [`check_invariants`] found them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub queued: usize,
    pub running: usize,
    pub ended: usize,
}

/// Checks what every crash must leave true, straight from the database:
/// - every acknowledged job exists, with its token, and each token names one job;
/// - no replica of a job has ever had two leases (nothing in these tests requeues a job), so
///   none has two live ones;
/// - no GPU of a node is in live leases adding up to more than the whole GPU, and no lease
///   holds a GPU the node lacks;
/// - a job is running exactly when it has a live lease, and money is held in escrow exactly
///   for running jobs;
/// - the ledger balances.
///
/// It reads with several queries, so it is meant for a database nobody is changing.
pub async fn check_invariants(store: &Store, tenant_id: i64, acked: &[(String, i64)]) -> Result<Counts, String> {
    let failed = |error: store::StoreError| format!("reading the store: {error}");
    let jobs = store
        .jobs_of_tenant(tenant_id, None, api::PAGE_SIZE_MAX)
        .await
        .map_err(failed)?;
    ensure!(
        (jobs.len() as i64) < api::PAGE_SIZE_MAX,
        "more jobs than one page: lower the load"
    );
    let by_id: BTreeMap<i64, &store::JobRecord> = jobs.iter().map(|job| (job.id, job)).collect();
    let mut tokens = BTreeSet::new();
    for job in &jobs {
        let token = job.client_token.clone().unwrap_or_default();
        ensure!(tokens.insert(token.clone()), "two jobs with token {token:?}");
    }
    for (token, id) in acked {
        let Some(job) = by_id.get(id) else {
            return Err(format!("job {id} (token {token}) was acknowledged and is lost"));
        };
        ensure!(
            job.client_token.as_deref() == Some(token.as_str()),
            "job {id} has token {:?}, not {token}",
            job.client_token
        );
    }
    let live = store.live_leases().await.map_err(failed)?;
    let nodes: BTreeMap<i64, i64> = store
        .nodes()
        .await
        .map_err(failed)?
        .into_iter()
        .map(|node| (node.id, node.node.gpu_count))
        .collect();
    let mut gpu_milli: BTreeMap<(i64, u32), i64> = BTreeMap::new();
    for lease in &live {
        let node = lease.lease.node_id;
        let gpu_count = nodes.get(&node).copied().unwrap_or(0);
        ensure!(
            lease.lease.gpu_mask >> gpu_count == 0 && lease.lease.gpu_mask != 0,
            "lease {} holds GPUs {:#b} of node {node}, which has {gpu_count}",
            lease.id,
            lease.lease.gpu_mask
        );
        for gpu in 0..gpu_count as u32 {
            if lease.lease.gpu_mask & (1 << gpu) == 0 {
                continue;
            }
            let used = gpu_milli.entry((node, gpu)).or_default();
            *used += lease.lease.gpu_milli;
            ensure!(
                *used <= 1000,
                "GPU {gpu} of node {node} is in live leases adding up to {used} thousandths \
                 (lease, job, thousandths): {:?}",
                live.iter()
                    .filter(|other| other.lease.node_id == node && other.lease.gpu_mask & (1 << gpu) != 0)
                    .map(|other| (other.id, other.job_id, other.lease.gpu_milli))
                    .collect::<Vec<_>>()
            );
        }
    }
    let mut counts = Counts::default();
    for job in &jobs {
        let leases = store.leases_of_job(job.id).await.map_err(failed)?;
        let mut replicas = BTreeSet::new();
        for lease in &leases {
            ensure!(
                replicas.insert(lease.lease.replica),
                "replica {} of job {} was leased twice (lease, state): {:?}",
                lease.lease.replica,
                job.id,
                leases.iter().map(|lease| (lease.id, lease.state)).collect::<Vec<_>>()
            );
        }
        let live = leases.iter().filter(|lease| lease.state.is_live()).count();
        let escrow = store.balance(&format!("escrow:job:{}", job.id)).await.map_err(failed)?;
        match job.state {
            JobState::Queued => {
                counts.queued += 1;
                ensure!(live == 0, "queued job {} has {live} live leases", job.id);
                ensure!(escrow == 0, "queued job {} has {escrow} µ$ held", job.id);
            }
            JobState::Running => {
                counts.running += 1;
                ensure!(live == 1, "running job {} has {live} live leases, not 1", job.id);
                ensure!(escrow > 0, "running job {} has no money held", job.id);
            }
            _ => {
                counts.ended += 1;
                ensure!(live == 0, "ended job {} has {live} live leases", job.id);
                ensure!(escrow == 0, "ended job {} still holds {escrow} µ$", job.id);
            }
        }
    }
    let totals = store.ledger_totals().await.map_err(failed)?;
    ensure!(
        totals.balances == 0 && totals.entries == 0,
        "the ledger does not balance: balances and entries sum to {totals:?}"
    );
    Ok(counts)
}

/// [`check_invariants`] on a database that should be at rest. A commit that a killed process
/// sent just before it died may still land, so a failure is read again a few times before it
/// counts (a real violation stays: nothing in these tests repairs one).
pub async fn assert_invariants(store: &Store, tenant_id: i64, acked: &[(String, i64)]) -> Counts {
    let mut attempts = 0;
    loop {
        match check_invariants(store, tenant_id, acked).await {
            Ok(counts) => return counts,
            Err(message) if attempts < 4 => {
                eprintln!("invariants not met yet (read again): {message}");
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(message) => panic!("{message}"),
        }
    }
}

/// Waits until none of the tenant's jobs is queued: everything submitted was placed.
pub async fn wait_all_placed(store: &Store, within: Duration) {
    eventually(within, "every queued job placed", || async {
        let queued = store.jobs_in_states(&[JobState::Queued]).await.ok()?;
        queued.is_empty().then_some(())
    })
    .await;
}

/// Cancels every job of the tenant that has not ended, through `base`.
pub async fn cancel_all(http: &reqwest::Client, base: &str, store: &Store, market: &Market) {
    let open = store
        .jobs_in_states(&[JobState::Queued, JobState::Running])
        .await
        .expect("read open jobs");
    for job in open {
        let (status, text) = send_json::<()>(
            http,
            reqwest::Method::POST,
            &format!("{base}/v1/jobs/{}/cancel", job.id),
            &market.tenant_key,
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "cancel job {}: {text}", job.id);
    }
}

/// `/metrics` says the ledger balances.
pub async fn assert_metrics_balanced(http: &reqwest::Client, base: &str) {
    let text = metrics(http, base).await.expect("/metrics answers");
    assert_eq!(
        sample(&text, "fallow_ledger_sum_micros{of=\"balances\"}"),
        Some(0.0),
        "/metrics of {base}:\n{text}"
    );
    assert_eq!(sample(&text, "fallow_ledger_sum_micros{of=\"entries\"}"), Some(0.0));
}

/// A local image `tag` with busybox-static as /bin/sh (no registry is reachable: `docker
/// import` of a tarball), or why there is none.
pub fn busybox_image(tag: &str) -> Result<(), String> {
    let docker = std::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output();
    if !docker.is_ok_and(|output| output.status.success()) {
        return Err("no Docker Engine answers".into());
    }
    if std::process::Command::new("docker")
        .args(["image", "inspect", tag])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
    {
        return Ok(());
    }
    let busybox = std::path::Path::new("/bin/busybox");
    if !busybox.exists() {
        return Err("/bin/busybox is missing (apt-get install busybox-static)".into());
    }
    let root = Scratch::new("fallow-dev-image");
    std::fs::create_dir_all(root.path.join("bin")).unwrap();
    std::fs::copy(busybox, root.path.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.path.join("bin/sh")).unwrap();
    std::os::unix::fs::symlink("busybox", root.path.join("bin/echo")).unwrap();
    let tarball = root.path.with_extension("tar");
    let packed = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&root.path)
        .arg("bin")
        .status()
        .map_err(|error| error.to_string())?;
    if !packed.success() {
        return Err("tar failed".into());
    }
    let imported = std::process::Command::new("docker")
        .args(["import", &tarball.display().to_string(), tag])
        .output()
        .map_err(|error| error.to_string())?;
    let _ = std::fs::remove_file(&tarball);
    if !imported.status.success() {
        return Err(format!("docker import: {}", String::from_utf8_lossy(&imported.stderr)));
    }
    Ok(())
}
