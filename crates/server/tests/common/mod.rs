//! The harness of the coordinator's integration tests: a real server on a fresh SQLite file and
//! on a fresh PostgreSQL database (from `FALLOW_TEST_POSTGRES_URL`; without it the PostgreSQL
//! leg is skipped loudly, or fails when `FALLOW_CI_REQUIRE_SERVICES=1`), an HTTP client, and
//! helpers that make accounts, credit them, register nodes and sign agents' requests.

// Each test binary uses its own part of the harness.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use trust::NodeKey;

/// The longest any test waits for the coordinator to reach a state it polls for.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// How often polls ask again.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

static NEXT: AtomicU64 = AtomicU64::new(0);

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

/// The coordinator's clock in milliseconds (the system's, unless a test moves it forward with
/// `server::advance_clock_for_tests`): what agents sign their requests with.
pub fn now_ms() -> i64 {
    server::now_us() / 1000
}

/// A fresh database: its URL, and for PostgreSQL what to drop afterwards.
struct Database {
    backend: &'static str,
    url: String,
    postgres: Option<(String, String)>,
}

async fn databases() -> Vec<Database> {
    let path = std::env::temp_dir().join(format!("{}.db", unique("fallow_server")));
    let mut out = vec![Database {
        backend: "sqlite",
        url: format!("sqlite://{}", path.display()),
        postgres: None,
    }];
    match std::env::var("FALLOW_TEST_POSTGRES_URL") {
        Ok(url) => {
            let name = unique("fallow_s");
            postgres_admin(&url, &format!("CREATE DATABASE {name}")).await;
            let (base, _) = url.rsplit_once('/').expect("URL names a database");
            out.push(Database {
                backend: "postgres",
                url: format!("{base}/{name}"),
                postgres: Some((url.clone(), name)),
            });
        }
        Err(_) if std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("FALLOW_TEST_POSTGRES_URL is not set but FALLOW_CI_REQUIRE_SERVICES=1: the PostgreSQL leg must run")
        }
        Err(_) => {
            // Straight to stderr, once per test binary: the test harness swallows `eprintln!`
            // of passing tests, and a skip must be seen.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the PostgreSQL leg of every test in this file (set FALLOW_TEST_POSTGRES_URL to run it)"
                );
            });
        }
    }
    out
}

/// Runs one statement on the database at `url` through a plain connection: not through the
/// store, which would apply its migrations to a database the tests only borrow.
async fn postgres_admin(url: &str, statement: &str) {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(url)
        .await
        .expect("PostgreSQL at FALLOW_TEST_POSTGRES_URL answers");
    sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
        .execute(&mut connection)
        .await
        .unwrap_or_else(|error| panic!("{statement}: {error}"));
    let _ = connection.close().await;
}

/// Runs `test` against a fresh server on every backend, one after the other.
pub async fn on_every_backend(test: impl AsyncFn(&Harness)) {
    on_every_backend_with(|_| {}, test).await;
}

/// As [`on_every_backend`], with the server's configuration adjusted by `configure`.
pub async fn on_every_backend_with(configure: impl Fn(&mut server::Config), test: impl AsyncFn(&Harness)) {
    on_every_backend_on(false, configure, test).await;
}

/// As [`on_every_backend_with`], with the coordinator's time from a fresh `ManualClock` per
/// backend (set to the system's time when made) when `manual` is true: the leader decides on the
/// time the test sets through `Harness::clock`.
pub async fn on_every_backend_on(manual: bool, configure: impl Fn(&mut server::Config), test: impl AsyncFn(&Harness)) {
    for database in databases().await {
        let data_dir = std::env::temp_dir().join(unique("fallow_server_data"));
        let mut config = server::Config {
            listen: "127.0.0.1:0".into(),
            data_dir: data_dir.clone(),
            // Fresh providers have no badge (a month of history): gold work would never place.
            // The trust tests ask for badges (`tests/trust.rs`).
            gold_needs_badge: false,
            // A view that disagrees with the store fails the pass, loudly.
            strict_view: true,
            ..Default::default()
        };
        configure(&mut config);
        let manual_clock = manual.then(|| Arc::new(server::ManualClock::new(server::now_us())));
        let clock: Arc<dyn server::Clock> = match &manual_clock {
            Some(manual) => manual.clone(),
            None => Arc::new(server::SystemClock),
        };
        let running = server::start_with_clock(&database.url, config, clock)
            .await
            .unwrap_or_else(|error| panic!("{}: the server starts: {error}", database.backend));
        let admin = std::fs::read_to_string(data_dir.join(server::ADMIN_KEY_FILE))
            .expect("the server wrote the admin key")
            .trim()
            .to_string();
        let harness = Harness {
            backend: database.backend,
            base: format!("http://{}", running.addr),
            http: reqwest::Client::new(),
            admin,
            running,
            clock: manual_clock,
        };
        test(&harness).await;
        harness.check_bookings().await;
        harness.running.stop().await;
        let _ = std::fs::remove_dir_all(&data_dir);
        if let Some((url, name)) = &database.postgres {
            postgres_admin(url, &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
        } else if let Some(path) = database.url.strip_prefix("sqlite://") {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path}{suffix}"));
            }
        }
    }
}

/// An HTTP answer: the status and the body, as JSON when it is JSON.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub text: String,
    /// The `Retry-After` header, when the answer has one.
    pub retry_after: Option<String>,
}

impl Reply {
    /// The body, after checking the status; the panic shows what came back instead.
    pub fn expect(self, status: u16, what: &str) -> Value {
        assert_eq!(self.status, status, "{what}: got {} {}", self.status, self.text);
        self.body
    }

    /// Checks that this is a refusal with status `status` and the API's error body: exactly
    /// `{"error": {"code", "message"}}`, both non-empty strings. Returns the message.
    pub fn refused(&self, status: u16, what: &str) -> String {
        assert_eq!(self.status, status, "{what}: got {} {}", self.status, self.text);
        self.error_message(what)
    }

    /// Checks the error body's shape (whatever the status) and returns its message.
    pub fn error_message(&self, what: &str) -> String {
        self.error_shape()
            .unwrap_or_else(|problem| panic!("{what}: {problem}: {} {:?}", self.status, self.text))
    }

    /// The message of an error body shaped `{"error": {"code", "message"}}` with both
    /// non-empty strings and nothing else, or what is wrong with the body.
    pub fn error_shape(&self) -> Result<String, String> {
        let error = self
            .body
            .as_object()
            .filter(|object| object.len() == 1)
            .and_then(|object| object.get("error"))
            .and_then(Value::as_object)
            .ok_or("not an error body")?;
        if error.len() != 2 {
            return Err("error has fields other than code and message".into());
        }
        let text = |field: &str| {
            error
                .get(field)
                .and_then(Value::as_str)
                .filter(|text| !text.trim().is_empty())
                .map(str::to_string)
                .ok_or(format!("error.{field} is missing or empty"))
        };
        text("code")?;
        text("message")
    }
}

/// One request of a table-driven test: who asks what, and the status that must come back.
#[derive(Clone, Debug)]
pub struct Case {
    pub label: String,
    pub key: Option<String>,
    pub method: &'static str,
    pub path: String,
    pub body: Option<Value>,
    pub status: u16,
}

pub fn case(label: &str, key: &str, method: &'static str, path: &str, body: Option<Value>, status: u16) -> Case {
    Case {
        label: label.to_string(),
        key: Some(key.to_string()),
        method,
        path: path.to_string(),
        body,
        status,
    }
}

/// A request as raw as a hostile client sends it: any method, path, headers and body bytes.
#[derive(Clone, Debug)]
pub struct Raw {
    pub label: String,
    pub method: &'static str,
    pub path: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn new(label: impl Into<String>, method: &'static str, path: impl Into<String>) -> Raw {
        Raw {
            label: label.into(),
            method,
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Sets a header, replacing any of that name.
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Raw {
        self.headers
            .retain(|(existing, _)| !existing.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.as_ref().to_vec()));
        self
    }

    /// A body with no content type of its own.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Raw {
        self.body = body.into();
        self
    }

    pub fn bearer(self, key: &str) -> Raw {
        self.header("authorization", format!("Bearer {key}"))
    }

    /// A body sent as `application/json`, whatever its bytes.
    pub fn json_bytes(self, body: impl Into<Vec<u8>>) -> Raw {
        self.header("content-type", "application/json").body(body)
    }

    pub fn json(self, body: &Value) -> Raw {
        self.json_bytes(serde_json::to_vec(body).expect("JSON serialises"))
    }
}

/// A tenant, provider or admin account and one of its keys.
#[derive(Clone, Debug)]
pub struct Account {
    pub id: i64,
    pub name: String,
    pub key: String,
    pub key_id: String,
}

/// A running coordinator and a client for it.
pub struct Harness {
    pub backend: &'static str,
    pub base: String,
    pub http: reqwest::Client,
    /// The bootstrap admin's API key, read from `DATA_DIR/admin.key`.
    pub admin: String,
    pub running: server::Running,
    /// The coordinator's clock, when the test drives it (`on_every_backend_on`).
    pub clock: Option<Arc<server::ManualClock>>,
}

async fn reply(response: reqwest::Response) -> Reply {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let bytes = response.bytes().await.expect("the body arrives");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        body,
        text,
        retry_after,
    }
}

fn method(name: &str) -> reqwest::Method {
    reqwest::Method::from_bytes(name.as_bytes()).expect("a valid method name")
}

/// A victim whose grace ended this recently may still be live: the leader ends it at its next
/// pass (every `reconcile_interval_ms`, slower on a busy machine).
pub const GRACE_ENDING_SLACK_US: i64 = 5_000_000;

impl Harness {
    /// Takes the leader lock and the lead, for a test that drives the reconcile passes itself
    /// (`Config::reconcile` off): the lock (held while it lives) and the leader's cursor.
    pub async fn take_lead(&self) -> (store::LeaderGuard, server::reconcile::Cursor) {
        let state = &self.running.state;
        let lock = state
            .store
            .try_lead()
            .await
            .expect("the store answers")
            .expect("no other replica leads");
        (lock, server::reconcile::lead(state).await.expect("takes the lead"))
    }

    /// Waits until the store has each agent's node on line (heartbeats are written behind the
    /// answer): a view built after this sees them all.
    pub async fn wait_online(&self, agents: &[&Agent]) {
        for agent in agents {
            let path = format!("/v1/nodes/{}", agent.node_id);
            self.wait_for("a node on line", async || {
                let node = self.get(&self.admin, &path).await.expect(200, "the node");
                (node["online"] == true).then_some(())
            })
            .await;
        }
    }

    /// Takes the lead (as `take_lead`) for a test that runs the passes itself with `Leader::pass`.
    pub async fn lead(&self) -> Leader {
        let (lock, cursor) = self.take_lead().await;
        Leader {
            _lock: lock,
            cursor,
            reasons: std::collections::HashMap::new(),
        }
    }

    /// What holds after every step: no GPU is in two live leases, but a preemption's victim
    /// beside its preemptor's leases in its grace period (the store's check), and the leader's
    /// view never failed to hold a stored live lease.
    pub async fn check_bookings(&self) {
        let now = server::now_us() - GRACE_ENDING_SLACK_US;
        let over = self
            .running
            .state
            .store
            .overbooked_gpus(now)
            .await
            .expect("the store answers");
        assert!(over.is_empty(), "{}: GPUs booked twice: {over:?}", self.backend);
        let conflicts = self.running.state.metrics.view_conflicts.load(Ordering::Relaxed);
        assert_eq!(
            conflicts, 0,
            "{}: a rebuilt view could not hold a stored live lease (see the log)",
            self.backend
        );
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with an API key (or none) and a JSON body (or none).
    pub async fn call(&self, verb: &str, path: &str, key: Option<&str>, body: Option<&Value>) -> Reply {
        let mut request = self.http.request(method(verb), self.url(path));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        reply(request.send().await.expect("the server answers")).await
    }

    pub async fn get(&self, key: &str, path: &str) -> Reply {
        self.call("GET", path, Some(key), None).await
    }

    pub async fn post(&self, key: &str, path: &str, body: Value) -> Reply {
        self.call("POST", path, Some(key), Some(&body)).await
    }

    pub async fn put(&self, key: &str, path: &str, body: Value) -> Reply {
        self.call("PUT", path, Some(key), Some(&body)).await
    }

    pub async fn send_raw(&self, raw: &Raw) -> Reply {
        let mut request = self.http.request(method(raw.method), self.url(&raw.path));
        for (name, value) in &raw.headers {
            let value = reqwest::header::HeaderValue::from_bytes(value).expect("a header value without CR or LF");
            request = request.header(name.as_str(), value);
        }
        let request = request.body(raw.body.clone());
        reply(request.send().await.expect("the server answers")).await
    }

    /// Runs every case and fails once, listing every case whose status was wrong or whose
    /// refusal had no proper error body.
    pub async fn check(&self, cases: &[Case]) {
        let mut wrong = Vec::new();
        for case in cases {
            let reply = self
                .call(case.method, &case.path, case.key.as_deref(), case.body.as_ref())
                .await;
            if reply.status != case.status {
                wrong.push(format!(
                    "{}: {} {} answered {} (want {}): {}",
                    case.label, case.method, case.path, reply.status, case.status, reply.text
                ));
            } else if reply.status >= 400
                && let Err(problem) = reply.error_shape()
            {
                wrong.push(format!(
                    "{}: {} {}: {problem}: {}",
                    case.label, case.method, case.path, reply.text
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "{}: {} of {} cases wrong:\n{}",
            self.backend,
            wrong.len(),
            cases.len(),
            wrong.join("\n")
        );
    }

    pub async fn account(&self, role: &str, name: &str) -> Account {
        let created = self
            .post(&self.admin, "/v1/admin/accounts", json!({"role": role, "name": name}))
            .await
            .expect(201, "admin creates an account");
        Account {
            id: created["account"]["id"].as_i64().expect("account id"),
            name: name.to_string(),
            key: created["api_key"]["api_key"].as_str().expect("api key").to_string(),
            key_id: created["api_key"]["key_id"].as_str().expect("key id").to_string(),
        }
    }

    pub async fn tenant(&self, name: &str) -> Account {
        self.account("tenant", name).await
    }

    pub async fn provider(&self, name: &str) -> Account {
        self.account("provider", name).await
    }

    /// Credits a tenant `dollars` and returns its balance view.
    pub async fn credit(&self, tenant: &Account, dollars: &str) -> Value {
        self.post(
            &self.admin,
            "/v1/admin/credits",
            json!({"account_id": tenant.id, "amount": dollars, "key": unique("credit")}),
        )
        .await
        .expect(200, "admin credits a tenant")
    }

    /// Registers a node for `provider` with a fresh key; `adjust` edits the registration first.
    pub async fn node(&self, provider: &Account, name: &str, adjust: impl FnOnce(&mut Value)) -> Agent {
        let key = NodeKey::generate();
        let mut registration = node_registration(&key, name);
        adjust(&mut registration);
        let view = self
            .post(&provider.key, "/v1/nodes", registration)
            .await
            .expect(201, "provider registers a node");
        Agent {
            node_id: view["id"].as_i64().expect("node id"),
            key,
            http: self.http.clone(),
            base: self.base.clone(),
        }
    }

    pub async fn submit(&self, tenant: &Account, job: Value) -> Value {
        self.post(&tenant.key, "/v1/jobs", job)
            .await
            .expect(201, "tenant submits a job")
    }

    /// Polls `probe` until it returns `Some`, failing after [`DEADLINE`] with `what`.
    pub async fn wait_for<T>(&self, what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            self.check_bookings().await;
            if let Some(found) = probe().await {
                return found;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{}: gave up after {DEADLINE:?} waiting for {what}",
                self.backend
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Polls a job until it is in `state`; returns its view.
    pub async fn wait_for_job(&self, key: &str, job_id: i64, state: &str) -> Value {
        let path = format!("/v1/jobs/{job_id}");
        let start = Instant::now();
        loop {
            self.check_bookings().await;
            let view = self.get(key, &path).await.expect(200, "tenant reads its job");
            if view["state"] == state {
                return view;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{}: job {job_id} not {state} after {DEADLINE:?}; last seen {view}",
                self.backend
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// The value of one `/metrics` line, given everything before the value.
    pub async fn metric(&self, series: &str) -> f64 {
        let reply = self.call("GET", "/metrics", Some(&self.admin), None).await;
        assert_eq!(reply.status, 200, "/metrics: {}", reply.text);
        reply
            .text
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("/metrics has no {series}:\n{}", reply.text))
            .trim()
            .parse()
            .expect("a metric value is a number")
    }

    /// Jobs in every state, from `/metrics`.
    pub async fn job_count(&self) -> f64 {
        let reply = self.call("GET", "/metrics", Some(&self.admin), None).await;
        reply
            .text
            .lines()
            .filter(|line| line.starts_with("fallow_jobs{"))
            .map(|line| {
                line.rsplit(' ')
                    .next()
                    .and_then(|value| value.parse::<f64>().ok())
                    .unwrap_or(0.0)
            })
            .sum()
    }

    /// What the coordinator holds that refused requests must leave alone: jobs, nodes,
    /// accounts, evidence rows are not in it (refusals may record evidence on purpose).
    pub async fn snapshot(&self) -> Snapshot {
        let nodes = self
            .get(&self.admin, "/v1/nodes")
            .await
            .expect(200, "admin lists nodes");
        let accounts = self
            .get(&self.admin, "/v1/admin/accounts")
            .await
            .expect(200, "admin lists accounts");
        Snapshot {
            jobs: self.job_count().await as i64,
            nodes: nodes.as_array().map_or(0, Vec::len),
            accounts: accounts.as_array().map_or(0, Vec::len),
            ledger_entries: self.metric("fallow_ledger_sum_micros{of=\"entries\"}").await as i64,
            external: self.metric("fallow_ledger_balance_micros{account=\"external\"}").await as i64,
        }
    }

    pub async fn evidence(&self) -> Vec<Value> {
        self.get(&self.admin, "/v1/admin/evidence")
            .await
            .expect(200, "admin reads evidence")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Whether evidence of `kind` about `node_id` is recorded.
    pub async fn has_evidence(&self, node_id: i64, kind: &str) -> bool {
        self.evidence()
            .await
            .iter()
            .any(|row| row["node_id"] == node_id && row["kind"] == kind)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub jobs: i64,
    pub nodes: usize,
    pub accounts: usize,
    pub ledger_entries: i64,
    pub external: i64,
}

/// The live leases (pending, staging or running) of a job's view.
pub fn live_leases(view: &Value) -> Vec<Value> {
    view["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|lease| ["pending", "staging", "running"].contains(&lease["state"].as_str().unwrap_or("")))
        .cloned()
        .collect()
}

/// An eight-GPU H100 node in eu-west selling every tier (gold $3, silver $2, bronze $1).
pub fn node_registration(key: &NodeKey, name: &str) -> Value {
    json!({
        "name": name,
        "public_key": key.public_hex(),
        "fingerprint": format!("fp-{name}"),
        "gpu_model": "H100-SXM5",
        "gpu_count": 8,
        "cpu_milli": 128_000,
        "memory_mib": 1_048_576,
        "region": "eu-west",
        "site": "ams1",
        "fabric": "ams1-ib0",
        "nvlink_domain": format!("{name}-board"),
        "latitude": 52.37,
        "longitude": 4.9,
        "policy": {"asks": {"gold": "3.00", "silver": "2.00", "bronze": "1.00"}},
    })
}

/// One H100 for ten minutes at up to $2.50 an hour, silver.
pub fn job_request(name: &str) -> Value {
    json!({
        "name": name,
        "image": "busybox:latest",
        "command": ["sleep", "1"],
        "gpus": 1,
        "gpu_models": ["H100-SXM5"],
        "tier": "silver",
        "max_price_per_gpu_hour": "2.50",
        "max_runtime_s": 600,
    })
}

/// A node's agent: its id and key, and a client that signs what it sends.
pub struct Agent {
    pub node_id: i64,
    pub key: NodeKey,
    http: reqwest::Client,
    base: String,
}

impl Agent {
    /// The four signing headers for a request sent now.
    pub fn headers(&self, verb: &str, path: &str, body: &[u8]) -> Vec<(String, Vec<u8>)> {
        self.key
            .sign_request_now(self.node_id, verb, path, body, now_ms())
            .header_pairs()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value.into_bytes()))
            .collect()
    }

    /// A signed request as a [`Raw`] to send (or to tamper with first).
    pub fn raw(&self, label: &str, verb: &'static str, path: &str, body: Option<&Value>) -> Raw {
        let bytes = body.map(|body| serde_json::to_vec(body).expect("JSON serialises"));
        let mut raw = Raw::new(label, verb, path);
        raw.headers = self.headers(verb, path, bytes.as_deref().unwrap_or_default());
        match bytes {
            Some(bytes) => raw.json_bytes(bytes),
            None => raw,
        }
    }

    /// Sends a signed request: `body` as JSON, or no body at all.
    pub async fn signed(&self, verb: &'static str, path: &str, body: Option<&Value>) -> Reply {
        let raw = self.raw(path, verb, path, body);
        let mut request = self.http.request(method(verb), format!("{}{path}", self.base));
        for (name, value) in &raw.headers {
            request = request.header(name.as_str(), value.as_slice());
        }
        let request = request.body(raw.body);
        reply(request.send().await.expect("the server answers")).await
    }

    /// A signed heartbeat; returns the leases the coordinator says this node should run.
    pub async fn heartbeat(&self) -> Vec<Value> {
        self.signed("POST", "/v1/agent/heartbeat", Some(&json!({})))
            .await
            .expect(200, "agent heartbeats")["leases"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Reports a lease event (staging, running, finished, failed) at the lease's epoch.
    pub async fn event(&self, lease: &Value, state: &str) -> Reply {
        let path = format!("/v1/agent/leases/{}/events", lease["id"]);
        self.signed(
            "POST",
            &path,
            Some(&json!({"epoch": lease["epoch"], "state": state, "detail": "from the test agent"})),
        )
        .await
    }

    /// A usage record for `lease`, signed by this node: `gpu_seconds_milli` in the lease's
    /// `sequence`th second (one whole GPU for that second is 1000).
    pub fn usage(&self, lease: &Value, sequence: i64, gpu_seconds_milli: i64) -> Value {
        let start_ms = lease["created_at_us"].as_i64().expect("lease created_at_us") / 1000 + (sequence - 1) * 1000;
        self.usage_at(lease, sequence, start_ms, gpu_seconds_milli)
    }

    /// A usage record for `lease`, signed by this node: `gpu_seconds_milli` in the second from
    /// `start_ms` (on this node's clock).
    pub fn usage_at(&self, lease: &Value, sequence: i64, start_ms: i64, gpu_seconds_milli: i64) -> Value {
        let record = trust::UsageRecord {
            lease_id: lease["id"].as_i64().expect("lease id"),
            epoch: lease["epoch"].as_i64().expect("lease epoch"),
            sequence,
            period_start_ms: start_ms,
            period_end_ms: start_ms + 1000,
            gpu_seconds_milli,
            gpu_utilisation_permille: 900,
            telemetry_digest: "blake3:test".to_string(),
        };
        serde_json::to_value(trust::sign_record(&self.key, self.node_id, &record)).expect("record serialises")
    }

    /// An attestation for `lease` with `exit_code`, signed by this node.
    pub fn attestation(&self, lease: &Value, exit_code: i64) -> Value {
        let created_ms = lease["created_at_us"].as_i64().expect("lease created_at_us") / 1000;
        let record = trust::Attestation {
            lease_id: lease["id"].as_i64().expect("lease id"),
            epoch: lease["epoch"].as_i64().expect("lease epoch"),
            image_digest: "sha256:busybox".to_string(),
            start_ms: created_ms,
            end_ms: now_ms(),
            exit_code,
            gpu_seconds_milli: 20_000,
            telemetry_digest: "blake3:telemetry".to_string(),
            log_digest: "blake3:log".to_string(),
            output_digest: String::new(),
            output_bytes: 0,
        };
        serde_json::to_value(trust::sign_record(&self.key, self.node_id, &record)).expect("record serialises")
    }
}

/// Heartbeats for `agent` until the job is running, and returns the job's view and its lease.
pub async fn run_until_placed(harness: &Harness, agent: &Agent, tenant: &Account, job_id: i64) -> (Value, Value) {
    let path = format!("/v1/jobs/{job_id}");
    let view = harness
        .wait_for(&format!("job {job_id} to run on node {}", agent.node_id), async || {
            agent.heartbeat().await;
            let view = harness
                .get(&tenant.key, &path)
                .await
                .expect(200, "tenant reads its job");
            (view["state"] == "running").then_some(view)
        })
        .await;
    let lease = view["leases"]
        .as_array()
        .and_then(|leases| leases.iter().find(|lease| lease["state"] == "pending"))
        .cloned()
        .unwrap_or_else(|| panic!("{}: running job {job_id} has no pending lease: {view}", harness.backend));
    assert_eq!(
        lease["node_id"], agent.node_id,
        "{}: placed on the node that heartbeats",
        harness.backend
    );
    (view, lease)
}

/// The leader lock and cursor of a test that drives the reconcile passes itself.
pub struct Leader {
    _lock: store::LeaderGuard,
    pub cursor: server::reconcile::Cursor,
    reasons: std::collections::HashMap<i64, String>,
}

impl Leader {
    /// One reconcile pass; fails the test, saying `what`, if the pass fails.
    pub async fn pass(&mut self, h: &Harness, what: &str) {
        server::reconcile::pass(&h.running.state, &mut self.cursor, &mut self.reasons)
            .await
            .unwrap_or_else(|error| panic!("{}: {what}: the pass fails: {error}", h.backend));
    }
}
