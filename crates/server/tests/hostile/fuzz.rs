//! The seeded fuzz pass over every route, as every kind of caller, on an empty server and on a
//! populated market.

use crate::common::{self, Harness, now_ms};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{Value, json};

use super::market::{
    FuzzKeys, Market, Operation, fuzz_keys, holdings, job_with, open_market, operations, populate, settled_holdings,
};
use super::random_jobs::json_value;

// A populated market under a seeded fuzz pass: every route, as every kind of caller, with
// random ids, queries and bodies, first on a server with only accounts, then on one with nodes
// in several regions (online and offline) and jobs in every state. The other modules aim at one
// route each on a nearly empty server; this pass reaches the handlers that only run when there
// is something to find (a queued job's explanation, a lease's reports, a node's pages).

/// Random requests per backend on the populated server (a quarter of that on the empty one);
/// `FALLOW_FUZZ_CASES` asks for a longer run, `FALLOW_FUZZ_SEED` for another seed.
const FUZZ_CASES_DEFAULT: usize = 1200;
const FUZZ_SEED_DEFAULT: u64 = 17;
/// Requests between two readings of what the coordinator holds.
const FUZZ_BATCH: usize = 20;
/// Longer than an agent's long poll (30 s): a request still unanswered then hung.
const FUZZ_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(40);
/// Bodies larger than this go on a connection of their own (see [`Fuzzer::send`]).
const UNREAD_BODY_BYTES: usize = 16 * 1024;
/// Failures listed in full when the pass fails (all are counted).
const FUZZ_FAILURES_SHOWN: usize = 40;

/// Who sends a fuzzed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sender {
    Anonymous,
    Tenant,
    Provider,
    Admin,
    /// Signed by the node that holds the market's leases.
    Agent,
    /// Signed by a registered node that never heartbeats.
    OfflineAgent,
    /// A well-formed API key that does not exist, and agent headers signed by a stranger's key
    /// in the name of the market's busiest node.
    Forger,
}

const SENDERS: [Sender; 7] = [
    Sender::Anonymous,
    Sender::Tenant,
    Sender::Provider,
    Sender::Admin,
    Sender::Agent,
    Sender::OfflineAgent,
    Sender::Forger,
];

/// Unreserved characters stay, every other byte is percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The fuzzer's dice: proptest strategies drawn from one seeded generator, without shrinking
/// (the server's state moves on, so a smaller case would not mean the same).
struct Dice(TestRunner);

impl Dice {
    fn new(seed: u64) -> Dice {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let rng = proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &bytes);
        Dice(TestRunner::new_with_rng(ProptestConfig::default(), rng))
    }

    fn draw<S: Strategy>(&mut self, strategy: S) -> S::Value {
        use proptest::strategy::ValueTree;
        strategy
            .new_tree(&mut self.0)
            .expect("the fuzzer's strategies always generate")
            .current()
    }

    fn below(&mut self, bound: usize) -> usize {
        self.draw(0..bound.max(1))
    }

    fn percent(&mut self, chance: usize) -> bool {
        self.below(100) < chance
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// JSON values for the fuzzer: the limits' neighbours, unicode, huge and tiny numbers, small
/// nested values.
fn wild_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => json_value(),
        1 => any::<String>().prop_map(Value::from),
        1 => prop_oneof![
            Just(json!(u64::MAX)),
            Just(json!(i64::MIN)),
            Just(json!(1e308)),
            Just(json!(-1e-308)),
            Just(json!(4_294_967_296u64)),
            Just(json!(65_536)),
            Just(json!("\u{202e}\u{0}\u{fffd}☃💣")),
            Just(json!("x".repeat(5000))),
            Just(Value::from(vec!["eu-west"; 40])),
            Just(json!({"": ""})),
        ],
    ]
}

/// Bodies no parser should take kindly to.
fn garbage_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"{".to_vec()),
        Just(b"null".to_vec()),
        Just(b"[]".to_vec()),
        Just(b"\"\"".to_vec()),
        Just(b"{\"epoch\": 1e999}".to_vec()),
        Just(b"{\"amount\": 99999999999999999999999999999}".to_vec()),
        Just(b"{\"a\": 1, \"a\": 2}".to_vec()),
        Just(b"\xff\xfe\x00{}".to_vec()),
        Just(b"\xef\xbb\xbf{}".to_vec()),
        Just("[".repeat(512).into_bytes()),
        Just(format!("{{\"x\": \"{}\"}}", "\\u0000".repeat(2000)).into_bytes()),
        Just(vec![b' '; api::REQUEST_BODY_BYTES_MAX + 1]),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// Offer filters: ones the grammar takes, and ones it must refuse in words.
const FILTERS: &[&str] = &[
    "gpu_model=H100",
    "region in [eu-west,us-east] price<2.5",
    "reliability>0.95 tier=gold",
    "online=true gpus_free>=1",
    "region notin [us-west] gpu_memory_gb>=80",
    "site=\"nyc1\" compute_units>1.5",
    "node_id=1 provider_id!=2 simulated=false",
    "price<<2",
    "region in [",
    "region in []",
    "gpu_model=",
    "\"unterminated",
    "tier=platinum",
    "tier=gold tier=silver",
    "price<NaN",
    "price<1e999",
    "gpu_count>99999999999999999999",
    "online=maybe",
    "node_id=abc",
    "☃=1",
    "price<2.5 \u{0}",
    "=",
    "in [a,b]",
];

const QUERY_KEYS: &[&str] = &[
    "limit",
    "before",
    "after",
    "filter",
    "account_id",
    "provider_id",
    "period",
    "bucket_s",
    "since_s",
    "wait_ms",
    "known",
    "hours",
    "refresh_s",
    "sort",
    "",
];

const QUERY_VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "500",
    "501",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "1e3",
    "1.5",
    "abc",
    "",
    "true",
    "2026-01",
    "2026-13",
    "0000-00",
    "☃",
    "\u{0}",
    "x x",
];

const WILD_IDS: &[&str] = &[
    "0",
    "-1",
    "1",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "abc",
    "1.5",
    "1e3",
    "0x10",
    "+7",
    "007",
    "%00",
    "%20",
    "%FF",
    "%E2%98%83",
    "%F0%9F%92%A3",
    "1%2F2",
];

const CONTENT_TYPES: &[&[u8]] = &[
    b"text/plain",
    b"application/x-www-form-urlencoded",
    b"application/json; charset=utf-8",
    b"Application/JSON",
    b"application/jsonx",
    b"multipart/form-data; boundary=x",
    b"\xff\xfe",
];

const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"];

/// One request as sent, for the failure list.
struct Sent {
    sender: Sender,
    method: &'static str,
    path: String,
    content_type: Option<Vec<u8>>,
    body: Vec<u8>,
}

impl std::fmt::Display for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body);
        let shown: String = body.chars().take(300).collect();
        let more = if body.chars().count() > 300 { "…" } else { "" };
        write!(f, "{} {} as {:?}", self.method, self.path, self.sender)?;
        if let Some(content_type) = &self.content_type {
            write!(f, " ({})", String::from_utf8_lossy(content_type))?;
        }
        if !self.body.is_empty() {
            write!(f, " body {} bytes {shown:?}{more}", self.body.len())?;
        }
        Ok(())
    }
}

/// Why a refusal's body is not what a caller can act on, if it is not: the API's JSON error
/// with a message, or (on the dashboard) an HTML page that says what went wrong.
fn refusal_problem(path: &str, content_type: &str, text: &str) -> Option<String> {
    if path.starts_with("/dashboard") && content_type.starts_with("text/html") {
        let message = text
            .split("class=\"error\">")
            .nth(1)
            .and_then(|rest| rest.split('<').next())
            .unwrap_or_default();
        return message
            .trim()
            .is_empty()
            .then(|| "an HTML refusal without an error message".to_string());
    }
    let reply = common::Reply {
        status: 400,
        body: serde_json::from_str(text).unwrap_or(Value::Null),
        text: text.to_string(),
        retry_after: None,
    };
    match reply.error_shape() {
        Ok(message) if message.chars().filter(|c| c.is_alphabetic()).count() < 8 => {
            Some(format!("the message {message:?} says too little"))
        }
        Ok(_) => None,
        Err(problem) => Some(format!("{problem} (content-type {content_type:?})")),
    }
}

/// Whether a successful request of this method and path may have written something.
fn writes(method: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    !matches!(method, "GET" | "HEAD" | "OPTIONS")
        && !matches!(path, "/v1/jobs/quote" | "/dashboard/login" | "/dashboard/logout")
}

struct Fuzzer<'a> {
    h: &'a Harness,
    market: &'a Market,
    keys: FuzzKeys,
    http: reqwest::Client,
    failures: Vec<String>,
    sent: usize,
    /// Accepted requests that may have written, since the last reading of the holdings.
    writes: Vec<String>,
    writes_total: usize,
    statuses: std::collections::BTreeMap<u16, usize>,
    /// The request before, and its status: a dropped connection may be its doing.
    previous: String,
}

impl<'a> Fuzzer<'a> {
    fn new(h: &'a Harness, market: &'a Market, keys: FuzzKeys) -> Fuzzer<'a> {
        Fuzzer {
            h,
            market,
            keys,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(FUZZ_REQUEST_TIMEOUT)
                .build()
                .expect("a client"),
            failures: Vec::new(),
            sent: 0,
            writes: Vec::new(),
            writes_total: 0,
            statuses: std::collections::BTreeMap::new(),
            previous: String::new(),
        }
    }

    fn api_key(&self, sender: Sender) -> Option<&str> {
        match sender {
            Sender::Tenant => Some(&self.keys.tenant),
            Sender::Provider => Some(&self.keys.provider),
            Sender::Admin => Some(&self.keys.admin),
            Sender::Forger => Some(&self.keys.forged),
            Sender::Anonymous | Sender::Agent | Sender::OfflineAgent => None,
        }
    }

    /// The four signing headers of an agent request, for the senders that sign.
    fn signature(&self, sent: &Sent) -> Vec<(&'static str, String)> {
        let agents = &self.market.agents;
        let (node_id, key) = match (sent.sender, agents.first(), agents.get(1)) {
            (Sender::Agent, Some(agent), _) => (agent.node_id, &agent.key),
            (Sender::OfflineAgent, _, Some(agent)) => (agent.node_id, &agent.key),
            (Sender::Agent | Sender::OfflineAgent, ..) => (1, &self.market.stranger),
            (Sender::Forger, first, _) => (first.map_or(1, |agent| agent.node_id), &self.market.stranger),
            _ => return Vec::new(),
        };
        key.sign_request_now(node_id, sent.method, &sent.path, &sent.body, now_ms())
            .header_pairs()
            .to_vec()
    }

    /// Sends one request and records what is wrong with its answer. Returns the status, or
    /// `None` when no answer came.
    async fn send(&mut self, sent: Sent) -> Option<(u16, Value)> {
        self.sent += 1;
        let mut request = self
            .http
            .request(
                reqwest::Method::from_bytes(sent.method.as_bytes()).expect("a method"),
                self.h.url(&sent.path),
            )
            .body(sent.body.clone());
        if let Some(key) = self.api_key(sent.sender) {
            request = request
                .header("authorization", format!("Bearer {key}"))
                .header("cookie", format!("fallow_key={key}"));
        }
        for (name, value) in self.signature(&sent) {
            request = request.header(name, value);
        }
        if let Some(content_type) = &sent.content_type {
            let value = reqwest::header::HeaderValue::from_bytes(content_type).expect("a header value");
            request = request.header("content-type", value);
        }
        if sent.body.len() > UNREAD_BODY_BYTES {
            // A request refused before its body is read leaves the rest of the body on the
            // connection, and the server closes it: the next request must not be sent there.
            request = request.header("connection", "close");
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                self.failures.push(format!(
                    "{sent}: NO ANSWER (dropped or hung): {error:?} (the request before: {})",
                    self.previous
                ));
                self.previous = format!("{sent} -> no answer");
                return None;
            }
        };
        let status = response.status().as_u16();
        self.previous = format!("{sent} -> {status}");
        *self.statuses.entry(status).or_default() += 1;
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let text = match response.bytes().await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(error) => {
                self.failures
                    .push(format!("{sent}: {status} with a body cut short: {error:?}"));
                return None;
            }
        };
        let shown: String = text.chars().take(400).collect();
        if status >= 500 {
            self.failures.push(format!("{sent}: SERVER ERROR {status}: {shown}"));
        } else if status >= 400
            && sent.method != "HEAD"
            && let Some(problem) = refusal_problem(&sent.path, &content_type, &text)
        {
            self.failures
                .push(format!("{sent}: {status} refusal: {problem}: {shown}"));
        }
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) && writes(sent.method, &sent.path) {
            self.writes.push(format!("{sent} -> {status}"));
            self.writes_total += 1;
            if sent.path.split('?').next() == Some("/v1/keys/rotate")
                && let Some(key) = body["api_key"].as_str()
            {
                match sent.sender {
                    Sender::Tenant => self.keys.tenant = key.to_string(),
                    Sender::Provider => self.keys.provider = key.to_string(),
                    Sender::Admin => self.keys.admin = key.to_string(),
                    _ => {}
                }
            }
        }
        Some((status, body))
    }

    /// Sends a request and also checks its status against what its sender must get.
    async fn expect_status(&mut self, sent: Sent, want: u16) {
        let label = sent.to_string();
        if let Some((status, body)) = self.send(sent).await
            && status != want
            && status < 500
        {
            self.failures
                .push(format!("{label}: got {status}, want {want}: {body}"));
        }
    }

    async fn health(&mut self) {
        let sent = Sent {
            sender: Sender::Anonymous,
            method: "GET",
            path: "/v1/health".into(),
            content_type: None,
            body: Vec::new(),
        };
        self.expect_status(sent, 200).await;
    }

    /// The ids a path's parameter may name: the market's ones of its kind, or none.
    fn known_ids(&self, path: &str) -> Vec<String> {
        let market = self.market;
        let ids: Vec<i64> = if path.contains("{key_id}") {
            return market.key_ids.clone();
        } else if path.starts_with("/v1/jobs/") || path.starts_with("/dashboard/jobs/") {
            market.jobs.clone()
        } else if path.starts_with("/v1/nodes/") {
            market.nodes.clone()
        } else if path.starts_with("/v1/accounts/") {
            [&market.tenant, &market.bystander, &market.provider, &market.north]
                .iter()
                .map(|account| account.id)
                .collect()
        } else if path.starts_with("/v1/agent/leases/") {
            market.leases.clone()
        } else {
            Vec::new()
        };
        ids.iter().map(i64::to_string).collect()
    }

    /// A valid body for a schema, when the fuzzer has one to spoil.
    fn template(&self, schema: &str) -> Option<Value> {
        let market = self.market;
        let epoch = market.lease.as_ref().map_or(json!(1), |lease| lease["epoch"].clone());
        Some(match schema {
            "JobRequest" => job_with("fuzzed", json!({})),
            "NodeRegistration" => common::node_registration(&trust::NodeKey::generate(), "fuzzed"),
            "PolicyDoc" => json!({"asks": {"gold": "3.00", "silver": "2.00"}}),
            "HeartbeatRequest" => json!({"gpus": [{"index": 0}], "over_limit": false}),
            "LeaseEventRequest" => json!({"epoch": epoch, "state": "running", "detail": "fuzz"}),
            "ProgressRequest" => json!({"epoch": epoch, "unit": "steps", "done": 10}),
            "LogChunkRequest" => json!({"epoch": epoch, "byte_offset": 0, "text": "hello"}),
            "KeyRotation" => json!({"public_key": trust::NodeKey::generate().public_hex()}),
            "NewAccountRequest" => json!({"role": "tenant", "name": "fuzzed"}),
            "NewKeyRequest" => json!({"label": "fuzzed"}),
            "CreditRequest" => json!({"account_id": market.bystander.id, "amount": "1.00", "key": "fuzz"}),
            "BondRequest" => json!({"amount": "1.00", "key": "fuzz-bond"}),
            "SignedUsage" | "SignedAttestation" => {
                let (agent, lease) = (market.agents.first()?, market.lease.as_ref()?);
                if schema == "SignedUsage" {
                    agent.usage(lease, 1, 1000)
                } else {
                    agent.attestation(lease, 0)
                }
            }
            _ => return None,
        })
    }

    /// A random request for `operation`.
    fn random_request(&self, dice: &mut Dice, operation: &Operation) -> Sent {
        // Mostly a sender the route is for, so that requests get past authentication.
        let sender = if dice.percent(30) {
            dice.pick(&SENDERS)
        } else if operation.path.starts_with("/v1/agent/") {
            dice.pick(&[Sender::Agent, Sender::Agent, Sender::OfflineAgent])
        } else {
            dice.pick(&[Sender::Tenant, Sender::Provider, Sender::Admin])
        };
        let method = if dice.percent(8) {
            dice.pick(METHODS)
        } else {
            operation.method
        };
        let mut path = operation.path.clone();
        for parameter in ["{id}", "{key_id}"] {
            if path.contains(parameter) {
                let known = self.known_ids(&operation.path);
                let value = if !known.is_empty() && dice.percent(60) {
                    dice.pick(&known)
                } else if parameter == "{key_id}" && dice.percent(50) {
                    dice.draw("[0-9a-f]{12}|[a-z]{1,300}")
                } else if dice.percent(20) {
                    dice.draw(any::<u32>()).to_string()
                } else {
                    dice.pick(WILD_IDS).to_string()
                };
                path = path.replace(parameter, &value);
            }
        }
        if dice.percent(45) {
            let pairs: Vec<String> = (0..1 + dice.below(3))
                .map(|_| {
                    let key = if operation.path == "/v1/offers" && dice.percent(50) {
                        "filter"
                    } else {
                        dice.pick(QUERY_KEYS)
                    };
                    let value = if key == "filter" {
                        match dice.below(20) {
                            0..=2 => "a=1 ".repeat(40),
                            3 => "x".repeat(3000),
                            _ => dice.pick(FILTERS).to_string(),
                        }
                    } else if !self.market.jobs.is_empty() && dice.percent(20) {
                        dice.pick(&self.market.jobs).to_string()
                    } else {
                        dice.pick(QUERY_VALUES).to_string()
                    };
                    format!("{}={}", percent_encode(key), percent_encode(&value))
                })
                .collect();
            path = format!("{path}?{}", pairs.join("&"));
        }
        let template = operation.body.as_deref().and_then(|schema| self.template(schema));
        let roll = dice.below(100);
        let body: Vec<u8> = if operation.path == "/dashboard/login" && method == "POST" {
            let key = if dice.percent(30) {
                self.keys.tenant.clone()
            } else {
                dice.draw(any::<String>())
            };
            format!("key={}", percent_encode(&key)).into_bytes()
        } else if method == "GET" && roll < 80 {
            Vec::new()
        } else if let Some(mut body) = template.filter(|_| roll < 55) {
            let mut fields: Vec<String> = body
                .as_object()
                .map(|object| object.keys().cloned().collect())
                .unwrap_or_default();
            fields.push("surprise".into());
            for _ in 0..1 + dice.below(3) {
                let field = dice.pick(&fields);
                if dice.percent(20) {
                    if let Some(object) = body.as_object_mut() {
                        object.remove(&field);
                    }
                } else {
                    body[field.as_str()] = dice.draw(wild_value());
                }
            }
            serde_json::to_vec(&body).expect("JSON serialises")
        } else if roll < 80 {
            serde_json::to_vec(&dice.draw(wild_value())).expect("JSON serialises")
        } else if roll < 95 {
            dice.draw(garbage_body())
        } else {
            Vec::new()
        };
        let content_type = if operation.path == "/dashboard/login" && dice.percent(70) {
            Some(b"application/x-www-form-urlencoded".to_vec())
        } else if body.is_empty() && dice.percent(70) {
            None
        } else if dice.percent(85) {
            Some(b"application/json".to_vec())
        } else if dice.percent(20) {
            None
        } else {
            Some(dice.pick(CONTENT_TYPES).to_vec())
        };
        Sent {
            sender,
            method,
            path,
            content_type,
            body,
        }
    }

    /// Every read (and the quote) as every sender, on every id of the market: the handlers that
    /// answer from what is stored. The owner and an admin must get each job; the quote of a job
    /// for a region no node is in is still a quote.
    async fn sweep(&mut self, operations: &[Operation]) {
        let market = self.market;
        let own: Vec<i64> = self
            .h
            .get(&market.tenant.key, "/v1/jobs?limit=500")
            .await
            .expect(200, "the tenant's jobs")["jobs"]
            .as_array()
            .expect("a job list")
            .iter()
            .filter_map(|job| job["id"].as_i64())
            .collect();
        for operation in operations {
            if operation.method != "GET" && operation.path != "/v1/jobs/quote" {
                continue;
            }
            let mut ids = self.known_ids(&operation.path);
            ids.extend(["abc".to_string(), "0".to_string()]);
            let paths: Vec<String> = if operation.path.contains('{') {
                ids.iter()
                    .map(|id| operation.path.replace("{id}", id).replace("{key_id}", id))
                    .collect()
            } else {
                vec![operation.path.clone()]
            };
            for path in paths {
                for sender in SENDERS {
                    let sent = Sent {
                        sender,
                        method: operation.method,
                        path: path.clone(),
                        content_type: None,
                        body: Vec::new(),
                    };
                    if operation.path == "/v1/jobs/quote" {
                        for regions in [json!([]), json!(["eu-west"]), json!(["eu-west", "us-east"])] {
                            let body = serde_json::to_vec(&job_with("quote", json!({"regions": regions})))
                                .expect("JSON serialises");
                            let sent = Sent {
                                content_type: Some(b"application/json".to_vec()),
                                body,
                                ..sent_clone(&sent)
                            };
                            if matches!(sender, Sender::Tenant | Sender::Admin) {
                                self.expect_status(sent, 200).await;
                            } else {
                                self.send(sent).await;
                            }
                        }
                        continue;
                    }
                    let job = operation
                        .path
                        .strip_prefix("/v1/jobs/{id}")
                        .filter(|rest| rest.is_empty() || *rest == "/logs")
                        .and_then(|_| path.split('/').nth(3)?.parse::<i64>().ok())
                        .filter(|id| market.jobs.contains(id));
                    match (job, sender) {
                        (Some(_), Sender::Admin) => self.expect_status(sent, 200).await,
                        (Some(id), Sender::Tenant) => {
                            let want = if own.contains(&id) { 200 } else { 404 };
                            self.expect_status(sent, want).await;
                        }
                        _ => {
                            self.send(sent).await;
                        }
                    }
                }
            }
        }
        // The job no node's region can take says why it waits.
        if let Some(nowhere) = market.nowhere {
            let sent = Sent {
                sender: Sender::Tenant,
                method: "GET",
                path: format!("/v1/jobs/{nowhere}"),
                content_type: None,
                body: Vec::new(),
            };
            let label = sent.to_string();
            if let Some((status, view)) = self.send(sent).await {
                let explained = view["explanation"]
                    .as_str()
                    .is_some_and(|explanation| !explanation.trim().is_empty());
                if status != 200 || !explained {
                    self.failures.push(format!(
                        "{label}: a job for a region no node is in, unexplained: {status} {view}"
                    ));
                }
            }
        }
    }

    /// `cases` random requests in batches; after each batch the server must be alive, and when
    /// none of the batch's requests was accepted and could write, what it holds must be
    /// exactly as before (a batch with an accepted write instead sets the next reference).
    /// Returns how many batches were checked that way.
    async fn random_pass(&mut self, operations: &[Operation], dice: &mut Dice, cases: usize) -> usize {
        let mut before = settled_holdings(self.h, self.market).await;
        let mut checked = 0;
        for batch in 0..cases.div_ceil(FUZZ_BATCH) {
            self.writes.clear();
            for _ in 0..FUZZ_BATCH.min(cases - batch * FUZZ_BATCH) {
                let operation = dice.pick(operations);
                let sent = self.random_request(dice, &operation);
                self.send(sent).await;
            }
            self.health().await;
            if !self.writes.is_empty() {
                before = settled_holdings(self.h, self.market).await;
                continue;
            }
            let after = holdings(self.h, self.market).await;
            checked += 1;
            if after != before {
                self.failures.push(format!(
                    "batch {batch}: requests all refused changed what the coordinator holds:\nbefore {before}\nafter  {after}"
                ));
            }
            before = after;
        }
        checked
    }
}

fn sent_clone(sent: &Sent) -> Sent {
    Sent {
        sender: sent.sender,
        method: sent.method,
        path: sent.path.clone(),
        content_type: sent.content_type.clone(),
        body: sent.body.clone(),
    }
}

fn fuzz_cases() -> usize {
    std::env::var("FALLOW_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(FUZZ_CASES_DEFAULT)
}

fn fuzz_seed() -> u64 {
    std::env::var("FALLOW_FUZZ_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(FUZZ_SEED_DEFAULT)
}

/// Every route, as every kind of caller, with random ids (the market's own among them),
/// queries, offer filters, content types and bodies, on an empty server and then on a market
/// with nodes and jobs in every state. Never a dropped connection or a 5xx; every refusal is
/// the API's error (or the dashboard's error page) with a message; the owner and an admin can
/// read every job and quote one for a region no node is in; `/v1/health` answers after every
/// batch; a batch of refusals changes nothing stored; and nothing of the market is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_populated_market_survives_a_seeded_fuzz_of_every_route() {
    let (cases, seed) = (fuzz_cases(), fuzz_seed());
    common::on_every_backend_with(
        |config| {
            // Nodes stay online for the whole pass, and canaries (leases of their own on the
            // market's nodes) are rare.
            config.heartbeat_timeout_ms = 3_600_000;
            config.canary_within_ms = 30 * 86_400_000;
        },
        async |h: &Harness| {
            let started = std::time::Instant::now();
            let operations = operations(h).await;
            let mut market = open_market(h).await;
            let keys = fuzz_keys(h, &market).await;
            let mut dice = Dice::new(seed);
            let (keys, empty_checked, empty_failures) = {
                let mut fuzzer = Fuzzer::new(h, &market, keys);
                fuzzer.sweep(&operations).await;
                let checked = fuzzer.random_pass(&operations, &mut dice, cases / 4).await;
                (fuzzer.keys, checked, fuzzer.failures)
            };
            populate(h, &mut market).await;
            let mut fuzzer = Fuzzer::new(h, &market, keys);
            fuzzer.sweep(&operations).await;
            let checked = fuzzer.random_pass(&operations, &mut dice, cases).await;
            fuzzer.health().await;
            let after = settled_holdings(h, &market).await;
            let mut failures = empty_failures;
            failures.append(&mut fuzzer.failures);
            eprintln!(
                "{}: fuzz seed {seed}: {} requests in {:.1} s; {} accepted writes; {} batches of {FUZZ_BATCH} checked unchanged ({} on the empty server); statuses {:?}",
                h.backend,
                fuzzer.sent,
                started.elapsed().as_secs_f64(),
                fuzzer.writes_total,
                checked,
                empty_checked,
                fuzzer.statuses
            );
            assert!(
                failures.is_empty(),
                "{}: fuzz seed {seed}: {} wrong answers (first {FUZZ_FAILURES_SHOWN}):\n{}",
                h.backend,
                failures.len(),
                failures
                    .iter()
                    .take(FUZZ_FAILURES_SHOWN)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            // Nothing of the market is lost, whatever was accepted, and the ledger balances.
            let listed = after["jobs"].as_array().map_or(0, Vec::len);
            assert_eq!(listed, market.jobs.len(), "{}: every job is still there: {after}", h.backend);
            assert_eq!(after["nodes"].as_array().map(Vec::len), Some(market.nodes.len()), "{}", h.backend);
            assert_eq!(
                h.metric("fallow_ledger_sum_micros{of=\"balances\"}").await,
                0.0,
                "{}: the ledger balances",
                h.backend
            );
            assert!(
                checked * 4 >= cases.div_ceil(FUZZ_BATCH),
                "{}: only {checked} batches held no accepted write: the check of refusals means little",
                h.backend
            );
        },
    )
    .await;
}
