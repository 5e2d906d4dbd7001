//! The agent's side of the coordinator's API: node registration with the provider's API key,
//! and every other request signed with the node's key. Also how every client of the coordinator
//! (agent, CLI, gateway) trusts a private CA's certificates beside the system's roots
//! (`--ca-cert`, `read_ca_certs`).

use api::{AgentLease, HeartbeatRequest, HeartbeatResponse, LeaseEventRequest, NodeRegistration, NodeView};
use serde::Serialize;
use serde::de::DeserializeOwned;
use trust::NodeKey;

/// How long one request may take, long polls aside.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the coordinator could not be reached: {0}")]
    Unreachable(String),
    /// The coordinator refused the request; `status`, its JSON error's message, and the wait it
    /// named (`Retry-After`, on 429 and 503).
    #[error("the coordinator answered {status}: {message}")]
    Refused {
        status: u16,
        message: String,
        retry_after: Option<std::time::Duration>,
    },
    #[error("the coordinator's answer could not be read: {0}")]
    BadAnswer(String),
}

impl ClientError {
    /// A 409: the lease is not live at this epoch any more (stop it).
    pub fn is_conflict(&self) -> bool {
        matches!(self, ClientError::Refused { status: 409, .. })
    }

    /// Worth asking again after a wait: the coordinator was not reached, was busy (429) or
    /// failed (5xx). Any other refusal would only be refused again.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable(_) => true,
            ClientError::Refused { status, .. } => *status == 429 || *status >= 500,
            ClientError::BadAnswer(_) => false,
        }
    }

    /// The wait the coordinator named, if it named one.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ClientError::Refused { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// The lease set the coordinator wants this node to run, with a version for long polls.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct LeaseSet {
    pub version: String,
    pub leases: Vec<AgentLease>,
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    /// See `request_timeout`.
    timeout_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

async fn answer<T: DeserializeOwned>(sent: reqwest::Result<reqwest::Response>) -> Result<T, ClientError> {
    let response = sent.map_err(|error| ClientError::Unreachable(with_causes(&error)))?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(api::backoff::parse_retry_after);
    let bytes = response
        .bytes()
        .await
        .map_err(|error| ClientError::Unreachable(with_causes(&error)))?;
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|body| body["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        return Err(ClientError::Refused {
            status: status.as_u16(),
            message,
            retry_after,
        });
    }
    serde_json::from_slice(&bytes).map_err(|error| ClientError::BadAnswer(error.to_string()))
}

/// The largest CA file read: a bundle of a few certificates is a few KiB.
const CA_BYTES_MAX: u64 = 1 << 20;

/// The certificates of a PEM file (`--ca-cert`, `FALLOW_CA_CERT`): a private CA that signed the
/// coordinator's or a gateway's certificate, trusted besides the system's roots. The error
/// starts with the path and says what is wrong with the file; the caller names its flag.
pub fn read_ca_certs(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let shown = path.display();
    let metadata = std::fs::metadata(path).map_err(|error| format!("{shown}: cannot be read: {error}"))?;
    if metadata.len() > CA_BYTES_MAX {
        return Err(format!("{shown}: is over {CA_BYTES_MAX} bytes; is it a PEM file?"));
    }
    let pem = std::fs::read(path).map_err(|error| format!("{shown}: cannot be read: {error}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|error| format!("{shown}: is not a PEM certificate bundle: {error}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{shown}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certs)
}

/// An error with its causes, `: `-separated: reqwest's own text leaves out why a request
/// failed (a refused connection, a certificate not trusted).
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

impl Client {
    pub fn new(coordinator: &str) -> Result<Client, ClientError> {
        Client::trusting(coordinator, &[])
    }

    /// A client that trusts `ca_certs` besides the system's roots (see `read_ca_certs`).
    pub fn trusting(coordinator: &str, ca_certs: &[reqwest::Certificate]) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .tls_certs_merge(ca_certs.iter().cloned())
            .build()
            .map_err(|error| ClientError::Unreachable(with_causes(&error)))?;
        Ok(Client {
            http,
            base: coordinator.trim_end_matches('/').to_string(),
            timeout_ms: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(REQUEST_TIMEOUT.as_millis() as u64)),
        })
    }

    /// How long a request may take before it counts as unreachable: at most `REQUEST_TIMEOUT`,
    /// less once the agent knows the heartbeat timeout (see `set_request_timeout`).
    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Requests give up after `timeout` (capped at `REQUEST_TIMEOUT`): an agent cut off from the
    /// coordinator must not sit in one request past the time it should fence itself.
    pub fn set_request_timeout(&self, timeout: std::time::Duration) {
        let timeout = timeout.min(REQUEST_TIMEOUT).as_millis() as u64;
        self.timeout_ms.store(timeout, std::sync::atomic::Ordering::Relaxed);
    }

    /// Registers the node with the provider's API key.
    pub async fn register(&self, provider_key: &str, registration: &NodeRegistration) -> Result<NodeView, ClientError> {
        answer(
            self.http
                .post(format!("{}/v1/nodes", self.base))
                .bearer_auth(provider_key)
                .timeout(REQUEST_TIMEOUT)
                .json(registration)
                .send()
                .await,
        )
        .await
    }

    /// Sends a request signed by the node's key; `path` includes any query.
    async fn signed<T: DeserializeOwned>(
        &self,
        key: &NodeKey,
        node_id: i64,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
        timeout: std::time::Duration,
    ) -> Result<T, ClientError> {
        let bytes = match body {
            Some(body) => serde_json::to_vec(body).map_err(|error| ClientError::BadAnswer(error.to_string()))?,
            None => Vec::new(),
        };
        let headers = key.sign_request_now(node_id, method.as_str(), path, &bytes, now_ms());
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(timeout);
        for (name, value) in headers.header_pairs() {
            request = request.header(name, value);
        }
        if body.is_some() {
            request = request.header("content-type", "application/json").body(bytes);
        }
        answer(request.send().await).await
    }

    pub async fn heartbeat(
        &self,
        key: &NodeKey,
        node_id: i64,
        beat: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, ClientError> {
        self.signed(
            key,
            node_id,
            reqwest::Method::POST,
            "/v1/agent/heartbeat",
            Some(beat),
            self.request_timeout(),
        )
        .await
    }

    /// The lease set, waiting up to `wait_ms` for it to differ from `known`.
    pub async fn leases(
        &self,
        key: &NodeKey,
        node_id: i64,
        wait_ms: u64,
        known: Option<&str>,
    ) -> Result<LeaseSet, ClientError> {
        let path = match known {
            Some(version) => format!("/v1/agent/leases?wait_ms={wait_ms}&known={version}"),
            None => "/v1/agent/leases".to_string(),
        };
        let timeout = self.request_timeout() + std::time::Duration::from_millis(wait_ms);
        self.signed(key, node_id, reqwest::Method::GET, &path, None::<&()>, timeout)
            .await
    }

    pub async fn event(
        &self,
        key: &NodeKey,
        node_id: i64,
        lease_id: i64,
        event: &LeaseEventRequest,
    ) -> Result<(), ClientError> {
        let path = format!("/v1/agent/leases/{lease_id}/events");
        self.signed::<serde_json::Value>(
            key,
            node_id,
            reqwest::Method::POST,
            &path,
            Some(event),
            self.request_timeout(),
        )
        .await
        .map(|_| ())
    }

    /// Asks the coordinator to replace the node's key (`key`) with `new`.
    pub async fn rotate_key(&self, key: &NodeKey, node_id: i64, new: &NodeKey) -> Result<(), ClientError> {
        let body = api::KeyRotation {
            public_key: new.public_hex(),
        };
        self.signed::<serde_json::Value>(
            key,
            node_id,
            reqwest::Method::POST,
            "/v1/agent/key",
            Some(&body),
            self.request_timeout(),
        )
        .await
        .map(|_| ())
    }

    /// Restates what the agent says of its registered node on start (`api::NodeRestatement`).
    pub async fn restate(
        &self,
        key: &NodeKey,
        node_id: i64,
        restatement: &api::NodeRestatement,
    ) -> Result<NodeView, ClientError> {
        self.signed(
            key,
            node_id,
            reqwest::Method::PUT,
            "/v1/agent/node",
            Some(restatement),
            self.request_timeout(),
        )
        .await
    }

    /// Takes GPUs of the node back for its owner (`POST /v1/agent/reclaim`): from the node's
    /// host, signed with its key, so no provider key is needed there.
    pub async fn reclaim(
        &self,
        key: &NodeKey,
        node_id: i64,
        request: &api::ReclaimRequest,
    ) -> Result<api::ReclaimView, ClientError> {
        self.signed(
            key,
            node_id,
            reqwest::Method::POST,
            "/v1/agent/reclaim",
            Some(request),
            self.request_timeout(),
        )
        .await
    }

    /// Gives every reclaimed GPU of the node back to the market (`POST /v1/agent/resume`).
    pub async fn resume(&self, key: &NodeKey, node_id: i64) -> Result<api::ReclaimView, ClientError> {
        self.signed(
            key,
            node_id,
            reqwest::Method::POST,
            "/v1/agent/resume",
            Some(&serde_json::json!({})),
            self.request_timeout(),
        )
        .await
    }

    /// Reports what a replica has done so far.
    pub async fn progress(
        &self,
        key: &NodeKey,
        node_id: i64,
        lease_id: i64,
        progress: &api::ProgressRequest,
    ) -> Result<(), ClientError> {
        let path = format!("/v1/agent/leases/{lease_id}/progress");
        self.signed::<serde_json::Value>(
            key,
            node_id,
            reqwest::Method::POST,
            &path,
            Some(progress),
            self.request_timeout(),
        )
        .await
        .map(|_| ())
    }

    /// Sends a chunk of a replica's output; false when the coordinator had it or keeps no more.
    pub async fn log(
        &self,
        key: &NodeKey,
        node_id: i64,
        lease_id: i64,
        chunk: &api::LogChunkRequest,
    ) -> Result<bool, ClientError> {
        let path = format!("/v1/agent/leases/{lease_id}/logs");
        let accepted: api::LogChunkAccepted = self
            .signed(
                key,
                node_id,
                reqwest::Method::POST,
                &path,
                Some(chunk),
                self.request_timeout(),
            )
            .await?;
        Ok(accepted.stored)
    }

    /// Reports a usage record; returns what it was charged (micro-dollars).
    pub async fn usage(&self, key: &NodeKey, node_id: i64, record: &trust::UsageRecord) -> Result<i64, ClientError> {
        let signed = trust::sign_record(key, node_id, record);
        let accepted: api::UsageAccepted = self
            .signed(
                key,
                node_id,
                reqwest::Method::POST,
                "/v1/agent/usage",
                Some(&signed),
                self.request_timeout(),
            )
            .await?;
        Ok(accepted.charged_micros)
    }

    /// Reports a canary's result, signed by the node's key over its body; returns what the
    /// coordinator found (passed, wrong_answer or slow), or a matmul canary's challenge.
    pub async fn canary_result(
        &self,
        key: &NodeKey,
        node_id: i64,
        result: &trust::canary::CanaryResult,
    ) -> Result<api::CanaryAccepted, ClientError> {
        let signed = crate::canary::signed_wire(trust::sign_record(key, node_id, result));
        self.signed(
            key,
            node_id,
            reqwest::Method::POST,
            "/v1/agent/canaries",
            Some(&signed),
            self.request_timeout(),
        )
        .await
    }

    /// Sends a matmul canary's proof (the rows its challenge asked for); returns the finding.
    pub async fn canary_proof(
        &self,
        key: &NodeKey,
        node_id: i64,
        canary_id: i64,
        proof: &api::CanaryProof,
    ) -> Result<api::CanaryAccepted, ClientError> {
        self.signed(
            key,
            node_id,
            reqwest::Method::POST,
            &format!("/v1/agent/canaries/{canary_id}/proof"),
            Some(proof),
            self.request_timeout(),
        )
        .await
    }

    /// Hands a replica's output archive to the coordinator to keep.
    pub async fn output(
        &self,
        key: &NodeKey,
        node_id: i64,
        lease_id: i64,
        upload: &api::OutputUpload,
        timeout: std::time::Duration,
    ) -> Result<api::OutputView, ClientError> {
        self.signed(
            key,
            node_id,
            reqwest::Method::POST,
            &format!("/v1/agent/leases/{lease_id}/output"),
            Some(upload),
            timeout,
        )
        .await
    }

    pub async fn attest(
        &self,
        key: &NodeKey,
        node_id: i64,
        attestation: &trust::Attestation,
    ) -> Result<(), ClientError> {
        let signed = trust::sign_record(key, node_id, attestation);
        self.signed::<serde_json::Value>(
            key,
            node_id,
            reqwest::Method::POST,
            "/v1/agent/attestations",
            Some(&signed),
            self.request_timeout(),
        )
        .await
        .map(|_| ())
    }
}
